"""Training on documents: --packing stream and pad, --epochs, resuming inside an epoch, bad inputs.

- The same global batch of 12 trains the same on 1, 2, 3 and 4 ranks with any micro-batch and
  accumulation (losses within 1e-5), for stream and pad files.
- Masked and padded tokens never count: changing the ids of masked tokens at the end of every
  example, or adding tokens past the --seq + 1 an example is truncated to, leaves every loss
  bit-identical; changing one unmasked token does not.
- --epochs E trains ceil(E x samples / global batch) steps (the summary and the last samples_seen
  say so) and equals --steps of that number; a run checkpointed inside an epoch, with a step
  straddling the epoch boundary after it, resumes bit for bit.
- Bad inputs, each one line naming the flag or file: --epochs with --steps, --eval-every without
  --eval-data, --eval-data missing, not a token file, or synthetic, --packing pad on a version 1
  file, stream on a model without EOS, a token file made with another tokenizer than the one in the
  --init-from directory, --eval-data made with another tokenizer than --data (same vocabulary size).
- pad says how many examples it cuts at --seq + 1 and how many tokens it never trains on."""
import json
import os
import random
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import fsdptest as t  # noqa: E402
import packing  # noqa: E402

D = t.tmpdir("packing")
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]
VOCAB = 1000
rng = random.Random(11)


def path(name):
    return os.path.join(D, name)


def make_docs(n):
    """Examples: BOS (2, OPT's), a masked prompt, an unmasked response, a masked tail of 2 tokens."""
    docs, masks = [], []
    for _ in range(n):
        prompt, response = rng.randrange(2, 10), rng.randrange(2, 30)
        d = [2] + [rng.randrange(3, VOCAB) for _ in range(prompt + response + 2)]
        docs.append(d)
        masks.append([0] * (1 + prompt) + [1] * response + [0, 0])
    return docs, masks


def train(n, args, tag, mbs, metrics=True):
    d = path("run-" + tag)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    m = os.path.join(d, "m.jsonl")
    rc, out, err = t.run(n, ["train", "--model", "tiny-opt", "--seq", "24", "--mbs", str(mbs), "--lr", "3e-3",
                             "--global-batch", "12", "--metrics", m] + FP32 + list(args))
    steps, summary = t.metrics(m) if rc == 0 else ([], None)
    return [r for r in steps if "loss" in r], summary, out


docs, masks = make_docs(60)
SFT = path("sft.bin")
packing.write_v2(SFT, docs, VOCAB, masks)

# ---- the same global batch on any layout ---------------------------------------------------------
for pk in ("stream", "pad"):
    ref, _, _ = train(1, ["--data", SFT, "--packing", pk, "--steps", "6"], pk + "-1", 4)
    t.check(len(ref) == 6, "%s: 6 steps on 1 rank (micro-batch 4, accumulation 3)" % pk)
    for n, mbs in ((2, 3), (3, 2), (4, 1)):
        other, _, _ = train(n, ["--data", SFT, "--packing", pk, "--steps", "6"], "%s-%d" % (pk, n), mbs)
        t.compare_losses(other, ref, 1e-5, "%s: %d ranks x micro-batch %d x accumulation %d vs 1 x 4 x 3"
                         % (pk, n, mbs, 12 // (n * mbs)))

# ---- masked and padded tokens never count --------------------------------------------------------
base, _, base_out = train(2, ["--data", SFT, "--packing", "pad", "--steps", "4"], "mask-base", 3)
# pad keeps an example's first --seq + 1 = 25 tokens: the run says how many examples it cuts, and how
# many tokens it never trains on (counted here from the documents).
cut = [d for d in docs if len(d) > 25]
said = "(%d cut, %d tokens past the cut not trained on)" % (len(cut), sum(len(d) - 25 for d in cut))
t.check(cut and said in base_out, "pad: the run counts the examples it cuts: %s" % said)
tails = [d[:-2] + [rng.randrange(3, VOCAB), rng.randrange(3, VOCAB)] for d in docs]
packing.write_v2(path("tails.bin"), tails, VOCAB, masks)
# Examples longer than --seq + 1 = 25 tokens are truncated: what lies past that never counts.
cut = [(d + [rng.randrange(3, VOCAB) for _ in range(9)], m + [1] * 9) if len(d) > 25 else (d, m)
       for d, m in zip(docs, masks)]
t.check(sum(len(d) > 25 for d in docs) >= 10, "%d of the examples are truncated" % sum(len(d) > 25 for d in docs))
packing.write_v2(path("longer.bin"), [c[0] for c in cut], VOCAB, [c[1] for c in cut])
for name, what in (("tails.bin", "the masked tail of every example changed"),
                   ("longer.bin", "9 counted tokens more past the truncation of every long example")):
    other, _, _ = train(2, ["--data", path(name), "--packing", "pad", "--steps", "4"], "mask-" + name, 3)
    t.check(len(base) == 4 and [r["loss"] for r in other] == [r["loss"] for r in base],
            "pad: %s: the same losses, bit for bit" % what)
# Padding never counts: the pad id (pad_token_id of an untied Llama, ids never in the data) changes
# only what follows each example; counting it would predict 5 in one run and 6 in the other.
llama = json.load(open(os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")))
high = [[1] + [10 + x % 900 for x in d[1:]] for d in docs]
packing.write_v2(path("high.bin"), high, 990, masks)
pad_losses = []
for pad in (5, 6):
    llama["pad_token_id"] = pad
    cfg = path("llama-pad%d.json" % pad)
    json.dump(llama, open(cfg, "w"))
    d = path("run-pad%d" % pad)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rc, out, err = t.run(2, ["train", "--model", cfg, "--data", path("high.bin"), "--seq", "24", "--mbs", "3",
                             "--global-batch", "12", "--steps", "4", "--lr", "3e-3", "--metrics",
                             os.path.join(d, "m.jsonl")] + FP32)
    pad_losses.append([r["loss"] for r in t.metrics(os.path.join(d, "m.jsonl"))[0]] if rc == 0 else None)
    t.check(rc == 0 and "padded with %d" % pad in out, "pad: examples padded with the model's pad_token_id %d" % pad)
t.check(pad_losses[0] is not None and len(pad_losses[0]) == 4 and pad_losses[0] == pad_losses[1],
        "pad: padding with 5 or with 6 gives the same losses, bit for bit")

changed = [list(d) for d in docs]
k = masks[0].index(1)  # the first counted token of the first example
changed[0][k] = 3 if changed[0][k] != 3 else 4
packing.write_v2(path("changed.bin"), changed, VOCAB, masks)
other, _, _ = train(2, ["--data", path("changed.bin"), "--packing", "pad", "--steps", "4"], "mask-changed", 3)
t.check(len(other) == 4 and [r["loss"] for r in other] != [r["loss"] for r in base],
        "pad: one unmasked token changed: the losses change (the comparison above is sensitive)")

# ---- --epochs, and resuming inside an epoch ------------------------------------------------------
# pad: 60 examples; 12 per step: an epoch is 5 steps; 1.5 epochs = ceil(90 / 12) = 8 steps.
steps, summary, out = train(2, ["--data", SFT, "--epochs", "1.5"], "epochs", 3)
t.check(summary and summary["final_step"] == 8 and len(steps) == 8 and steps[-1]["samples_seen"] == 96 and
        "epochs: 1.5 of 60 samples = 8 steps" in out,
        "--epochs 1.5 of 60 examples at 12 per step: 8 steps, 96 samples seen (the last step wraps into epoch 3)")
same, _, _ = train(2, ["--data", SFT, "--steps", "8"], "epochs-steps", 3)
t.check([r["loss"] for r in same] == [r["loss"] for r in steps], "--epochs 1.5 trains exactly as --steps 8")
# stream: 2 ranks, epochs of windows; checkpoint at step 2, inside the first epoch; steps 3.. cross it.
ck = path("run-resume-ckpt")
shutil.rmtree(ck, ignore_errors=True)
full, _, out = train(2, ["--data", SFT, "--packing", "stream", "--epochs", "2.5", "--ckpt-dir", ck, "--ckpt-every",
                         "2"], "resume-full", 3)
windows = int(out.split("stream: ")[1].split(" windows")[0])
t.check(len(full) > 4 and windows % 12 != 0 and 2 * 12 < windows,
        "stream --epochs 2.5: %d steps over %d windows (an epoch ends inside a step, after the checkpoint at 2)"
        % (len(full), windows))
# --rollback: the directory holds the full run's later checkpoints, which the resumed run's saves replace.
resumed, _, _ = train(2, ["--data", SFT, "--packing", "stream", "--epochs", "2.5", "--ckpt-dir", ck, "--resume",
                          os.path.join(ck, "step-00000002.h5"), "--rollback"], "resume-part", 3)
t.check([r["loss"] for r in resumed] == [r["loss"] for r in full[2:]] and
        [r["samples_seen"] for r in resumed] == [r["samples_seen"] for r in full[2:]],
        "resumed inside the first epoch: steps 3-%d bit-identical, through the epoch boundaries" % len(full))

# ---- bad inputs: one line each -------------------------------------------------------------------
V1 = path("v1.bin")
packing.write_v1(V1, [rng.randrange(3, VOCAB) for _ in range(400)], VOCAB)
notok = path("not-tokens.bin")
open(notok, "w").write("this is text, not a token file; " * 4)
tokdir = path("hfmodel")
shutil.rmtree(tokdir, ignore_errors=True)
t.run(1, ["export", "--model", "tiny-opt", "--dtype", "fp32", "--out", tokdir])
json.dump({"model": {"type": "BPE", "vocab": {}, "merges": []}, "note": "the model's tokenizer"},
          open(os.path.join(tokdir, "tokenizer.json"), "w"))
other_hash = path("other-tokenizer.bin")
packing.write_v2(other_hash, docs, VOCAB, masks, tok_hash=0x1234)
third_hash = path("third-tokenizer.bin")  # the same vocabulary size, yet another tokenizer
packing.write_v2(third_hash, docs, VOCAB, masks, tok_hash=0x5678)
BASE = ["train", "--seq", "24", "--mbs", "2"]
for what, n, args, words, status in (
        ("--epochs with --steps", 1, ["--model", "tiny-opt", "--data", SFT, "--epochs", "1", "--steps", "3"],
         ["--epochs", "--steps"], 2),
        ("--eval-every without --eval-data", 1, ["--model", "tiny-opt", "--eval-every", "2", "--steps", "1"],
         ["--eval-every"], 2),
        ("--eval-data missing", 2, ["--model", "tiny-opt", "--eval-data", path("nope.bin")],
         ["--eval-data", path("nope.bin"), "No such file"], 1),
        ("--eval-data not a token file", 2, ["--model", "tiny-opt", "--eval-data", notok],
         ["--eval-data", notok, "not an fsdp.c token file"], 1),
        ("--eval-data synthetic", 1, ["--model", "tiny-opt", "--eval-data", "synthetic"], ["--eval-data"], 2),
        ("--packing pad on a version 1 file", 2, ["--model", "tiny-opt", "--data", V1, "--packing", "pad"],
         ["--data", V1, "version 1"], 2),
        ("stream on a model without EOS", 1, ["--model", "tiny-llama", "--data", SFT, "--packing", "stream"],
         [SFT, "eos_token_id"], 2),
        ("a token file of another tokenizer than --init-from's", 2, ["--init-from", tokdir, "--data", other_hash],
         [other_hash, os.path.join(tokdir, "tokenizer.json"), "another tokenizer"], 1),
        ("--eval-data of another tokenizer than --data's, same vocabulary", 1,
         ["--model", "tiny-opt", "--data", other_hash, "--eval-data", third_hash],
         ["--eval-data", third_hash, other_hash, "0000000000005678", "another tokenizer"], 2),
        ("a vocabulary larger than the model's", 1, ["--model", "tiny-opt", "--eval-data", path("big.bin")],
         [path("big.bin"), "1031"], 1)):
    if what.startswith("a vocabulary"):
        packing.write_v2(path("big.bin"), docs, 50000, masks)
    rc, out, err = t.run(n, BASE + args + ["--device", "cpu"], check=False)
    lines = [l for l in err.splitlines() if l.startswith("fsdp: error:")]
    t.check(rc == status and len(lines) == 1 and all(w in lines[0] for w in words),
            "%s: exit %d, one line: %s" % (what, rc, lines[0] if lines else err.strip()[-300:]))
rc, out, err = t.run(1, ["eval", "--checkpoint", path("nowhere"), "--data", SFT], check=False)
t.check(rc == 2 and "--checkpoint" in err and len(err.strip().splitlines()) == 1,
        "fsdp eval --checkpoint missing: one line: %s" % err.strip())
t.finish()
