"""Dropout end to end (CPU backend, fp32): masks follow the global sample index, so that

- Llama, OPT and Qwen2 with --dropout 0.1 train the same on FULL, SHARD_GRAD_OP, NO_SHARD and HYBRID
  on 1 to 4 ranks (losses and final weights within 1e-5 of one rank), and differently from the same
  run without dropout;
- the same global batch trains the same split as ranks x accumulation 1x4, 2x2 and 4x1;
- a run resumed from a checkpoint continues bit for bit on the same layout (even when --seed says
  otherwise: the checkpoint's seed is the masks' seed) and within 1e-5 on another;
- --dropout 0 on a config whose rates are 0.1 trains bit for bit like a config whose rates are 0;
- the run description says the rates in effect; bad rates get one line and exit 2.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

STEPS = 8
GLOBAL = 12
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]
COMMON = ["train", "--seq", "16", "--steps", str(STEPS), "--lr", "3e-3", "--warmup", "2", "--log-every", "100"] + FP32
K_BIAS = "k_proj.bias"


def compare_weights(a, b, what, model):
    """Final weights and Adam moments within 1e-5; k_proj biases apart: OPT's gradient is exactly zero
    (a shift shared by all keys cancels in the softmax; see strategies.py) and is not compared, and
    Qwen2's rotated one is small enough that AdamW's normalisation lifts its rounding to ~1e-5, so it
    gets 1e-4."""
    t.compare_checkpoints(a, b, 1e-5, what, skip=K_BIAS)
    if model == "tiny-qwen2":
        x, y = t.checkpoint_arrays(a), t.checkpoint_arrays(b)
        worst = max(t.rel(x[k], y[k]) for k in x if K_BIAS in k)
        t.check(worst <= 1e-4, "%s: k_proj biases agree (worst relative difference %.2e <= 1e-4)" % (what, worst))


def train(n, tag, extra, mbs=None, accum=1):
    d = t.tmpdir("dropout-" + tag)
    mbs = mbs or GLOBAL // n // accum
    args = COMMON + ["--mbs", str(mbs), "--grad-accum", str(accum), "--metrics", os.path.join(d, "m.jsonl"),
                     "--ckpt-dir", os.path.join(d, "ckpt")] + list(extra)
    rc, out, err = t.run(n, args)
    steps = t.metrics(os.path.join(d, "m.jsonl"))[0] if rc == 0 else []
    return steps, os.path.join(d, "ckpt", "step-%08d.h5" % STEPS), out, d


def description(out):
    m = re.search(r"\| dropout (.*)$", out, re.M)
    return m.group(1) if m else None


# ---- every strategy on 1-4 ranks, three families ----
for model, expect in (("tiny-llama", "0.1 on attention probabilities"),
                      ("tiny-opt", "0.1 on attention and MLP outputs, 0.1 on attention probabilities"),
                      ("tiny-qwen2", "0.1 on attention probabilities")):
    drop = ["--model", model, "--dropout", "0.1", "--attn", "eager" if model == "tiny-opt" else "flash"]
    base, base_ckpt, out, _ = train(1, model + "-1", drop)
    t.check(description(out) == expect, "%s --dropout 0.1: the run says 'dropout %s'" % (model, description(out)))
    plain, _, out, _ = train(1, model + "-plain", drop[:2] + drop[4:] + ["--dropout", "0"])
    t.check(description(out) == "none", "%s --dropout 0: the run says 'dropout none'" % model)
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(base, plain)) if base and plain else 0.0
    t.check(worst > 1e-4, "%s: dropout changes the losses (largest relative change %.2e)" % (model, worst))
    for n, strategy, rpn in ((2, "FULL", 0), (3, "SHARD_GRAD_OP", 0), (4, "NO_SHARD", 0), (4, "HYBRID", 2)):
        extra = drop + ["--strategy", strategy] + (["--ranks-per-node", str(rpn)] if rpn else [])
        steps, ckpt, _, _ = train(n, "%s-%d-%s" % (model, n, strategy), extra)
        what = "%s with dropout on %d ranks %s" % (model, n, strategy)
        t.compare_losses(steps, base, 1e-5, what)
        compare_weights(ckpt, base_ckpt, what + " final weights", model)

# ---- the same global batch, split as ranks x accumulation ----
OPT = ["--model", "tiny-opt", "--dropout", "0.1"]
ref, ref_ckpt, _, _ = train(1, "batch-1x4", OPT, mbs=3, accum=4)
for n, accum in ((2, 2), (4, 1)):
    steps, ckpt, _, _ = train(n, "batch-%dx%d" % (n, accum), OPT, mbs=3, accum=accum)
    what = "tiny-opt with dropout, ranks x accumulation %dx%d vs 1x4" % (n, accum)
    t.compare_losses(steps, ref, 1e-5, what)
    t.compare_checkpoints(ckpt, ref_ckpt, 1e-5, what + " final weights", skip=K_BIAS)

# ---- resume ----
full, full_ckpt, _, full_dir = train(2, "resume-full", OPT + ["--ckpt-every", "4", "--seed", "42"])
ck4 = os.path.join(full_dir, "ckpt", "step-00000004.h5")
same, same_ckpt, out, _ = train(2, "resume-same", OPT + ["--resume", ck4, "--seed", "7"])
t.check([r["step"] for r in same] == list(range(5, STEPS + 1)), "resumed run covers steps 5-%d" % STEPS)
t.check([(r["loss"], r["grad_norm"]) for r in same] == [(r["loss"], r["grad_norm"]) for r in full[4:]],
        "dropout, resumed on the same layout with another --seed: losses and grad norms of steps 5-%d identical" % STEPS)
t.compare_checkpoints(same_ckpt, full_ckpt, 0, "dropout, resumed on the same layout: final weights", exact=True)
other, other_ckpt, _, _ = train(3, "resume-other", OPT + ["--resume", ck4, "--strategy", "SHARD_GRAD_OP"])
t.compare_losses(other, full[4:], 1e-5, "dropout, resumed on 3 ranks SHARD_GRAD_OP")
t.compare_checkpoints(other_ckpt, full_ckpt, 1e-5, "dropout, resumed on 3 ranks: final weights", skip=K_BIAS)

# ---- --dropout 0 is the config without rates ----
cfg_dir = t.tmpdir("dropout-configs")
base_cfg = {"model_type": "opt", "vocab_size": 1031, "hidden_size": 40, "ffn_dim": 72, "num_hidden_layers": 2,
            "num_attention_heads": 5, "max_position_embeddings": 128, "tie_word_embeddings": True,
            "do_layer_norm_before": True, "enable_bias": True, "pad_token_id": 1}


def config(name, **rates):
    path = os.path.join(cfg_dir, name + ".json")
    with open(path, "w") as f:
        json.dump(dict(base_cfg, **rates), f)
    return path


with_rates = config("rates", dropout=0.1, attention_dropout=0.1)
no_rates = config("none", dropout=0.0, attention_dropout=0.0)
off, off_ckpt, out_off, _ = train(2, "flag-zero", ["--model", with_rates, "--dropout", "0"])
zero, zero_ckpt, _, _ = train(2, "config-zero", ["--model", no_rates])
t.check(off and [(r["loss"], r["grad_norm"]) for r in off] == [(r["loss"], r["grad_norm"]) for r in zero],
        "--dropout 0 on a config with rates 0.1: losses and grad norms identical to a config with rates 0")
t.compare_checkpoints(off_ckpt, zero_ckpt, 0, "--dropout 0 vs rates 0: final weights", exact=True)
on, _, out_on, _ = train(2, "config-rates", ["--model", with_rates])
t.check(description(out_on) == "0.1 on attention and MLP outputs, 0.1 on attention probabilities" and
        description(out_off) == "none", "the config's rates apply unless --dropout says otherwise ('%s', '%s')"
        % (description(out_on), description(out_off)))
t.check(on and on[-1]["loss"] != zero[-1]["loss"], "the config's rates change the run")


# ---- bad rates: one line, exit 2 (flags) or 1 (a config) ----
def one_line(args, status, needles, what):
    rc, out, err = t.run(1, args, check=False)
    lines = [l for l in err.splitlines() if l.startswith("fsdp:")]
    t.check(rc == status and len(lines) == 1 and all(x in lines[0] for x in needles),
            "%s -> exit %d, %r" % (what, rc, lines[0] if lines else err[-300:]))


for bad in ("1", "-0.1", "1.5", "abc", "nan"):
    one_line(["train", "--model", "tiny-opt", "--steps", "1", "--dropout", bad], 2, ["--dropout", "[0, 1)"],
             "train --dropout '%s'" % bad)
one_line(["plan", "--model", "tiny-opt", "--dropout", "1", "--device", "cpu"], 2, ["--dropout", "[0, 1)"],
         "plan --dropout 1")
all_dropped = config("one", dropout=1.0)
one_line(["train", "--model", all_dropped, "--seq", "16", "--mbs", "2", "--steps", "1"], 1, ["dropout 1", "below 1"],
         "a config with dropout 1")
rc, _, _ = t.run(1, ["train", "--model", all_dropped, "--seq", "16", "--mbs", "2", "--steps", "1", "--dropout", "0.5"],
                 check=False)
t.check(rc == 0, "--dropout 0.5 overrides a config's dropout 1")
t.finish()
