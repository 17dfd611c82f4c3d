"""Evaluation (fsdp eval, fsdp train --eval-data) against an independent computation.

- fsdp eval's eval_loss equals the float64 PyTorch oracle (tests/oracle/reference.py, forward only)
  over the windows and examples that tests/lib/packing.py builds from the same file, within 1e-5:
  a tiny Llama (untied, biases, pad_token_id 5) and tiny OPT (tied, EOS = BOS = 2), stream and pad
  files with masks, truncated and empty documents; and files that fsdp prepare made with the real
  Llama 2 tokenizer (Alpaca with masks, text), evaluated from a model directory that holds that
  tokenizer.json. Each deliberate packing mistake of packing.MISTAKES is caught by some case.
- The split does not matter: 1, 2 and 3 ranks (FULL, SHARD_GRAD_OP, HYBRID) give the same loss.
- fsdp train --eval-data writes {"step", "eval_loss", "eval_ppl", "eval_tokens"} at every
  --eval-every step and at the end, prints it in the progress line, and its value at the last step
  equals fsdp eval of the checkpoint written at that step and the oracle on that checkpoint's weights.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import fsdptest as t  # noqa: E402
import packing  # noqa: E402
import reference  # noqa: E402
import safetensors_np  # noqa: E402
from tokfixtures import fixtures, read_tokens  # noqa: E402

TOL = 1e-5
D = t.tmpdir("evaluation")
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]
LLAMA = os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied")  # eos 2 (LlamaConfig's default), pad 5


def path(name):
    return os.path.join(D, name)


def export(model, name, seed=3):
    """Initial weights of `model` as a Hugging Face directory (fp32): what the oracle reads."""
    out = path(name)
    shutil.rmtree(out, ignore_errors=True)
    t.run(1, ["export", "--model", model, "--seed", str(seed), "--dtype", "fp32", "--out", out])
    return out


def hf_params(model_dir):
    tensors = safetensors_np.read(os.path.join(model_dir, "model.safetensors"))[0]
    return {n: arr for n, (_, _, arr) in tensors.items()}


def fsdp_eval(n, init, data, seq, mbs, extra=()):
    m = path("eval.jsonl")
    if os.path.exists(m):
        os.remove(m)
    rc, out, err = t.run(n, ["eval", "--init-from", init, "--data", data, "--seq", str(seq), "--mbs", str(mbs),
                             "--device", "cpu", "--metrics", m] + FP32 + list(extra))
    if rc != 0:
        return None
    recs = [json.loads(l) for l in open(m)]
    return recs[-1] if len(recs) == 1 else None


def oracle(cfg, params, data, pack, seq, mistake=None):
    tok = read_tokens(data)
    eos = cfg.get("eos_token_id", 2)
    pad = cfg.get("pad_token_id")
    pad = pad if pad is not None else eos
    pk = pack if pack != "auto" else ("pad" if tok["mask"] else "stream")
    rows, labels = packing.eval_samples(tok, pk, seq, eos, pad, mistake)
    total, count = reference.eval_loss_sum(cfg, params, rows, labels)
    return total / count, count


def compare(what, rec, cfg, params, data, pack, seq):
    """fsdp's record against the oracle; returns the oracle's loss."""
    want, count = oracle(cfg, params, data, pack, seq)
    if rec is None:
        t.fail("%s: fsdp eval gave no record" % what)
        return want
    err = abs(rec["eval_loss"] - want) / want
    t.check(err <= TOL and rec["eval_tokens"] == count,
            "%s: eval_loss %.7f, oracle %.7f (rel err %.1e), %d tokens counted (oracle %d)"
            % (what, rec["eval_loss"], want, err, rec["eval_tokens"], count))
    t.check(abs(rec["eval_ppl"] - math.exp(rec["eval_loss"])) <= 1e-6 * rec["eval_ppl"],
            "%s: eval_ppl = exp(eval_loss)" % what)
    return want


# ---- synthetic files ----------------------------------------------------------------------------
rng = random.Random(5)
VOCAB = 990


def synthetic(name, bos, n_docs, with_mask):
    """Documents that open with `bos`, some end with EOS (2), some empty, some longer than a window."""
    docs, masks = [], []
    for k in range(n_docs):
        n = 0 if k == 7 else rng.choice([rng.randrange(3, 12), rng.randrange(12, 40)])
        d = ([bos] + [rng.randrange(3, VOCAB) for _ in range(n - 1)]) if n else []
        if n > 3 and rng.random() < 0.3:
            d[-1] = 2
        docs.append(d)
        cut = rng.randrange(1, n) if n > 1 else n
        masks.append([0] * cut + [1] * (n - cut))
    packing.write_v2(path(name), docs, VOCAB, masks if with_mask else None)
    return path(name)


cases = []  # (label, model dir, file, packing, seq)
llama_dir = export(LLAMA, "llama")
opt_dir = export("tiny-opt", "opt")
for model, mdir, bos in (("llama", llama_dir, 1), ("opt", opt_dir, 2)):
    cases.append(("%s stream" % model, mdir, synthetic(model + "-stream.bin", bos, 40, False), "auto", 16))
    cases.append(("%s stream, masked" % model, mdir, synthetic(model + "-smask.bin", bos, 30, True), "stream", 16))
    cases.append(("%s pad" % model, mdir, synthetic(model + "-pad.bin", bos, 30, True), "auto", 16))

# ---- files from fsdp prepare with the real Llama 2 tokenizer --------------------------------------
LLAMA2_TOK = os.path.join(fixtures(), "llama2", "tokenizer.json")
real_dir = path("llama-32k")
cfg32k = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
os.makedirs(path("cfg32k"), exist_ok=True)
json.dump(cfg32k, open(path("cfg32k/config.json"), "w"))
real_dir = export(path("cfg32k"), "llama-32k")
shutil.copy(LLAMA2_TOK, os.path.join(real_dir, "tokenizer.json"))
alpaca = path("alpaca.jsonl")
with open(alpaca, "w") as f:
    for k in range(12):
        f.write(json.dumps({"instruction": "Name a colour number %d." % k, "input": "" if k % 2 else "warm ones",
                            "output": "Colour %d is red, like a café awning." % k}) + "\n")
text = path("text.txt")
brown = open(os.path.join(fixtures(), "brown.txt"), encoding="utf-8").read()[:6000]
open(text, "w", encoding="utf-8").write("\n\n".join(p for p in brown.split("\n") if p.strip())[:6000])
for fmt, src, extra in (("alpaca", alpaca, []), ("text", text, ["--split-on", "blank-lines"])):
    out = path("real-%s.bin" % fmt)
    p = subprocess.run([t.BIN, "prepare", "--quiet", "--tokenizer", LLAMA2_TOK, "--input", src, "--format", fmt,
                        "--out", out] + extra, capture_output=True, text=True, env=t.ENV)
    t.check(p.returncode == 0, "prepare %s with the Llama 2 tokenizer %s" % (fmt, p.stderr[-300:]))
    cases.append(("llama-32k %s (prepare)" % fmt, real_dir, out, "auto", 48))

# ---- fsdp eval = oracle; any split ----------------------------------------------------------------
results = {}
for label, mdir, data, pack, seq in cases:
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    params = hf_params(mdir)
    rec = fsdp_eval(1, mdir, data, seq, 3, ["--packing", pack])
    results[label] = (compare(label + ", 1 rank", rec, cfg, params, data, pack, seq), cfg, params, data, pack, seq)
    if rec and "(prepare)" not in label:
        splits = ((2, "FULL"), (3, "SHARD_GRAD_OP"), (2, "HYBRID")) if label in ("llama pad", "opt stream") else \
            ((3, "FULL"),)
        for n, strategy in splits:
            extra = ["--packing", pack, "--strategy", strategy] + (["--ranks-per-node", "1"] if strategy == "HYBRID" else [])
            other = fsdp_eval(n, mdir, data, seq, 2, extra)
            ok = other is not None and abs(other["eval_loss"] - rec["eval_loss"]) <= 1e-6 * rec["eval_loss"] and \
                other["eval_tokens"] == rec["eval_tokens"]
            t.check(ok, "%s: %d ranks %s, micro-batch 2: eval_loss %s vs %.7f on 1 rank"
                    % (label, n, strategy, other and "%.7f" % other["eval_loss"], rec["eval_loss"]))

# Each packing mistake changes what the oracle computes on some case beyond the tolerance.
for mistake, what in sorted(packing.MISTAKES.items()):
    worst = 0.0
    for label, (want, cfg, params, data, pack, seq) in results.items():
        wrong, _ = oracle(cfg, params, data, pack, seq, mistake)
        worst = max(worst, abs(wrong - want) / want)
    t.check(worst > 10 * TOL, "the comparison notices the mistake '%s' (%s): largest change %.1e" % (mistake, what, worst))

# ---- fsdp train --eval-data ------------------------------------------------------------------------
train_file = synthetic("opt-train.bin", 2, 120, False)
val_file = cases[3][2]  # opt stream
run = path("train")
shutil.rmtree(run, ignore_errors=True)
os.makedirs(run)
m = os.path.join(run, "m.jsonl")
rc, out, err = t.run(2, ["train", "--model", "tiny-opt", "--data", train_file, "--eval-data", val_file,
                         "--eval-every", "3", "--steps", "4", "--seq", "16", "--mbs", "2", "--lr", "3e-3",
                         "--metrics", m, "--ckpt-dir", os.path.join(run, "ckpt"), "--ckpt-every", "3"] + FP32)
records = [json.loads(l) for l in open(m)] if rc == 0 else []
evals = [r for r in records if "eval_loss" in r]
t.check([r["step"] for r in evals] == [3, 4] and all(set(r) == {"step", "eval_loss", "eval_ppl", "eval_tokens"}
                                                    for r in evals),
        "--eval-every 3 --steps 4: evaluation records at steps 3 and 4 (the end), keys step, eval_loss, eval_ppl, "
        "eval_tokens: %s" % evals)
t.check(any(l.startswith("step 3/4") and "eval loss" in l for l in out.splitlines()) and "eval at the end" in out,
        "the progress line of step 3 shows the evaluation, and the end of the run prints its own")
t.check(len(evals) == 2 and evals[0]["eval_loss"] != evals[1]["eval_loss"], "the model changed between evaluations")
for rec in evals:
    step = rec["step"]
    ck = os.path.join(run, "ckpt", "step-%08d.h5" % step)
    arrays = t.checkpoint_arrays(ck)
    params = {k: v for k, v in arrays.items() if not k.startswith("optimizer/")}
    cfg = json.loads(__import__("h5py").File(ck, "r").attrs["config"])
    compare("train --eval-data at step %d vs the oracle on its checkpoint" % step, rec, cfg, params, val_file,
            "auto", 16)
    again = fsdp_eval(2, ck, val_file, 16, 2)
    t.check(again is not None and again["step"] == step and again["eval_loss"] == rec["eval_loss"] and
            again["eval_tokens"] == rec["eval_tokens"],
            "fsdp eval --init-from the step-%d checkpoint on the same layout equals the in-training evaluation: %s vs %s"
            % (step, again, rec))
# --checkpoint DIR evaluates the latest.
rc, out, err = t.run(1, ["eval", "--checkpoint", os.path.join(run, "ckpt"), "--data", val_file, "--seq", "16",
                         "--mbs", "4", "--device", "cpu"] + FP32)
t.check(rc == 0 and "eval: step 4 |" in out and "eval loss %.4f" % evals[-1]["eval_loss"] in out,
        "fsdp eval --checkpoint DIR takes the latest checkpoint (step 4) and prints its loss")
t.finish()
