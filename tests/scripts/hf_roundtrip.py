"""Train -> export (fp32) -> --init-from: the imported run's first loss equals the loss of the run resumed
from the same checkpoint at the same data, and the imported weights are bit-identical to the
checkpoint's; for a tied Llama, an untied Llama, OPT, Qwen3 (its q_norm and k_norm tensors) and Mistral
(its sliding_window through config.json), exported as one file and sharded, exported and
imported on 1, 2 and 3 ranks (on 2 and 3 ranks with the load's staging windows shrunk to a few hundred
elements, FSDP_TEST_INIT_FROM_WINDOW, so that windows cut through tensors and gaps).

The data is a token file of exactly one window of seq+1 tokens, so every sample of every step is that
window: the imported run (which starts at sample 0) and the resumed run (which continues at the
checkpoint's data position) see the same batch without any control over the data position. The
weights are read from the checkpoint an imported run writes after one step at learning rate 0,
which leaves them unchanged."""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import safetensors_np as st

D = t.tmpdir("hf-roundtrip")
UNTIED = os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")
SEQ = 16
COMMON = ["--seq", str(SEQ), "--mbs", "2", "--model-precision", "fp32", "--mixed-precision", "no"]


def one_window(path, vocab, seed):
    ids = np.random.default_rng(seed).integers(3, 900, SEQ + 1).astype(np.uint16)
    with open(path, "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIQQ", 1, 2, ids.size, vocab) + bytes(32))
        f.write(ids.tobytes())


def weights(h5):
    return {k: v for k, v in t.checkpoint_arrays(h5).items() if not k.startswith("optimizer/")}


def first_loss(metrics_path):
    steps, _ = t.metrics(metrics_path)
    return steps[0]["loss"] if steps else None


for i, model in enumerate(("tiny-llama", UNTIED, "tiny-opt", "tiny-qwen3", "tiny-mistral")):
    label = os.path.basename(os.path.dirname(model)) if model.endswith(".json") else model
    d = os.path.join(D, label)
    os.makedirs(d)
    data = os.path.join(d, "tokens.bin")
    one_window(data, 990, i)
    base = COMMON + ["--data", data]
    ck = os.path.join(d, "ck")
    t.run(2, ["train", "--model", model, "--steps", "3", "--lr", "1e-2", "--ckpt-dir", ck] + base)
    ck3 = os.path.join(ck, "step-00000003.h5")
    ref = weights(ck3)

    single, sharded = os.path.join(d, "single"), os.path.join(d, "sharded")
    t.run(3, ["export", "--checkpoint", ck, "--out", single, "--dtype", "fp32"])
    t.run(1, ["export", "--checkpoint", ck3, "--out", sharded, "--dtype", "fp32", "--max-shard-size", "40KB"])
    files = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))
    headers = [st.header_of(os.path.join(sharded, f))[0] for f in files]
    data_bytes = [sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in h.items() if k != "__metadata__")
                  for h in headers]
    t.check(len(files) > 1 and os.path.exists(os.path.join(sharded, "model.safetensors.index.json")) and
            all(b <= 40000 or len(h) == 2 for b, h in zip(data_bytes, headers)),
            "%s: --max-shard-size 40KB gives %d files of at most 40000 bytes of data (or one larger tensor) and an "
            "index" % (label, len(files)))

    for n, export, what, window in ((1, single, "one file", None), (2, sharded, "sharded", "1000"),
                                    (3, single, "one file", "333")):
        tag = "%d-%s" % (n, os.path.basename(export))
        mi, mr = os.path.join(d, "import-%s.jsonl" % tag), os.path.join(d, "resume-%s.jsonl" % tag)
        ci = os.path.join(d, "ck-import-" + tag)
        if window:
            t.ENV["FSDP_TEST_INIT_FROM_WINDOW"] = window
        t.run(n, ["train", "--init-from", export, "--steps", "1", "--lr", "0", "--ckpt-dir", ci, "--metrics", mi] + base)
        t.ENV.pop("FSDP_TEST_INIT_FROM_WINDOW", None)
        t.run(n, ["train", "--model", model, "--resume", ck3, "--steps", "4", "--allow-schedule-change", "--metrics",
                  mr] + base)
        li, lr = first_loss(mi), first_loss(mr)
        t.check(li is not None and li == lr, "%s, %s export, %d rank(s): first loss after import %r == loss resumed "
                "from the checkpoint %r" % (label, what, n, li, lr))
        got = weights(os.path.join(ci, "step-00000001.h5"))
        same = set(got) == set(ref) and all(np.array_equal(got[k].view(np.uint32), ref[k].view(np.uint32)) for k in ref)
        t.check(same, "%s, %s export, %d rank(s): %d imported tensors bit-identical to the checkpoint" %
                (label, what, n, len(ref)))

# The loss comparison is sensitive: a model whose weights differ by one bf16 rounding gives another loss.
d = os.path.join(D, "tiny-llama")
bf16 = os.path.join(d, "bf16")
t.run(2, ["export", "--checkpoint", os.path.join(d, "ck"), "--out", bf16, "--dtype", "bf16"])
mb = os.path.join(d, "import-bf16.jsonl")
t.run(2, ["train", "--init-from", bf16, "--steps", "1", "--lr", "0", "--metrics", mb] + COMMON +
      ["--data", os.path.join(d, "tokens.bin")])
t.check(first_loss(mb) != first_loss(os.path.join(d, "resume-2-sharded.jsonl")),
        "a bf16-rounded import gives a different first loss (the loss check is sensitive)")

# A bf16 master holds the imported fp32 weights rounded to nearest even, on a layout with replicas.
cb = os.path.join(d, "ck-bf16-master")
t.ENV["FSDP_TEST_INIT_FROM_WINDOW"] = "777"
t.run(4, ["train", "--init-from", os.path.join(d, "single"), "--strategy", "HYBRID", "--ranks-per-node", "2",
          "--model-precision", "bf16", "--steps", "1", "--lr", "0", "--ckpt-dir", cb, "--seq", str(SEQ), "--mbs", "1",
          "--data", os.path.join(d, "tokens.bin")])
t.ENV.pop("FSDP_TEST_INIT_FROM_WINDOW")
ref = weights(os.path.join(d, "ck", "step-00000003.h5"))
got = weights(os.path.join(cb, "step-00000001.h5"))
t.check(set(got) == set(ref) and all(np.array_equal((got[k].view(np.uint32) >> 16).astype(np.uint16),
                                                    st.bf16_nearest_even(ref[k]).reshape(ref[k].shape)) and
                                     not (got[k].view(np.uint32) & 0xFFFF).any() for k in ref),
        "--model-precision bf16, HYBRID on 4 ranks, windows of 777 elements: the master is the import rounded to nearest even")

# --model agreeing with --init-from is accepted; the same model is trained.
m2 = os.path.join(d, "import-with-model.jsonl")
t.run(2, ["train", "--init-from", os.path.join(d, "single"), "--model", "tiny-llama", "--steps", "1", "--lr", "0",
          "--metrics", m2] + COMMON + ["--data", os.path.join(d, "tokens.bin")])
t.check(first_loss(m2) == first_loss(os.path.join(d, "import-2-sharded.jsonl")),
        "--init-from with a --model that names the same model trains the same")

# An fsdp.c checkpoint as --init-from: weights only, step 0.
mc = os.path.join(d, "import-ckpt.jsonl")
_, out, _ = t.run(2, ["train", "--init-from", os.path.join(d, "ck", "step-00000003.h5"), "--steps", "1", "--lr", "0",
                      "--metrics", mc] + COMMON + ["--data", os.path.join(d, "tokens.bin")])
steps, _ = t.metrics(mc)
t.check(steps and steps[0]["step"] == 1 and steps[0]["loss"] == first_loss(os.path.join(d, "resume-2-sharded.jsonl")),
        "--init-from an fsdp.c checkpoint: starts at step 1 with the checkpoint's weights")
t.finish()
