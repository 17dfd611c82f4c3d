"""Activation recomputation end to end (CPU backend):

- `fsdp train --recompute selective` and `--recompute full` train exactly as `--recompute none`:
  the same losses and gradient norms at every step and the same final weights and Adam moments, bit
  for bit, on 1, 2 and 3 ranks with FULL and SHARD_GRAD_OP, accumulation 2, Llama with eager
  attention, OPT with its dropout on the attention and MLP outputs and the probabilities (bf16 mixed
  precision), Qwen2 with attention dropout; a run with another seed differs (the comparison can
  fail); the run line and the metrics summary say the mode;
- --mbs auto under the same --memory-limit picks a larger micro-batch with recomputation, and the
  run reserves what its plan says;
- a bad --recompute is one line and exit 2.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

STEPS = 3
COMMON = ["train", "--seq", "16", "--steps", str(STEPS), "--lr", "3e-3", "--log-every", "100", "--grad-accum", "2"]
MODES = ("none", "selective", "full")


def train(n, tag, extra):
    d = t.tmpdir("recompute-" + tag)
    args = COMMON + ["--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt")] + list(extra)
    rc, out, err = t.run(n, args)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl")) if rc == 0 else ([], None)
    return steps, summary, os.path.join(d, "ckpt", "step-%08d.h5" % STEPS), out


def history(steps):
    return [(r["loss"], r["grad_norm"]) for r in steps]


CASES = [
    (1, "FULL", ["--model", "tiny-llama", "--mbs", "3", "--attn", "eager", "--model-precision", "fp32",
                 "--mixed-precision", "no"]),
    (2, "SHARD_GRAD_OP", ["--model", "tiny-opt", "--mbs", "2", "--dropout", "0.1", "--mixed-precision", "bf16"]),
    (3, "FULL", ["--model", "tiny-qwen2", "--mbs", "2", "--dropout", "0.1", "--embedding-grads", "dense"]),
]
for n, strategy, extra in CASES:
    model = extra[1]
    runs = {}
    for mode in MODES:
        tag = "%s-%d-%s-%s" % (model, n, strategy, mode)
        runs[mode] = train(n, tag, extra + ["--strategy", strategy, "--recompute", mode])
    steps, summary, ckpt, out = runs["none"]
    for mode in ("selective", "full"):
        s, summ, c, o = runs[mode]
        what = "%s on %d rank(s) %s, --recompute %s vs none" % (model, n, strategy, mode)
        t.check(len(s) == STEPS and history(s) == history(steps),
                "%s: losses and gradient norms of %d steps identical (%s)" % (what, STEPS, history(s)[-1:] if s else None))
        t.compare_checkpoints(c, ckpt, 0, what + ": final weights", exact=True)
        t.check(summ is not None and summ.get("recompute") == mode and re.search(r"\| recompute %s \| dropout" % mode, o),
                "%s: the run line and the metrics summary say the mode" % what)
        t.check(summ is not None and summ["max_reserved_bytes"] < summary["max_reserved_bytes"]
                and summ["max_reserved_bytes"] == summ["plan_reserved_bytes"],
                "%s: reserves less (%s bytes, none %s), as its plan says" %
                (what, summ and summ["max_reserved_bytes"], summary and summary["max_reserved_bytes"]))
# The comparison sees a difference: another seed, other weights.
other, _, other_ckpt, _ = train(1, "other-seed", CASES[0][2] + ["--recompute", "full", "--seed", "43"])
none0, _, none0_ckpt, _ = train(1, "seed-42", CASES[0][2] + ["--recompute", "none"])
t.check(other and none0 and history(other) != history(none0), "another seed gives other losses")


# --mbs auto: a model whose activations dominate (8 layers, the LM head's logits in chunks of 16
# tokens) under a limit just above its plan of micro-batch 4 without recomputation.
with open(os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")) as f:
    deep = dict(json.load(f), num_hidden_layers=8)
DEEP = os.path.join(t.tmpdir("recompute-deep"), "config.json")
with open(DEEP, "w") as f:
    json.dump(deep, f)
AUTO = ["--model", DEEP, "--seq", "16", "--head-chunk-tokens", "16", "--mixed-precision", "bf16"]  # as planned
TRAIN_AUTO = ["train"] + AUTO + ["--synthetic-vocab", "997", "--steps", "1"]


def plan_reserved(mode, mbs):
    rc, out, err = t.run(1, ["plan"] + AUTO + ["--gpus", "2", "--mbs", str(mbs), "--recompute", mode, "--device", "cpu",
                                               "--json"], check=False)
    if rc:
        t.fail("plan: " + err[-300:])
        return 0
    return json.loads(out)["bytes"]["reserved"]


limit = "%.12f" % ((plan_reserved("none", 4) + 64) / 2 ** 30)
chosen = {}
for mode in MODES:
    d = t.tmpdir("recompute-auto-" + mode)
    path = os.path.join(d, "m.jsonl")
    rc, out, err = t.run(2, TRAIN_AUTO + ["--mbs", "auto", "--memory-limit", limit, "--recompute", mode, "--metrics", path])
    s = t.metrics(path)[1] if rc == 0 else None
    chosen[mode] = s and s["mbs"]
    if s:
        t.check(s["max_reserved_bytes"] == plan_reserved(mode, s["mbs"]) and s["step_downs"] == 0,
                "--mbs auto --recompute %s: chose %d and reserved its plan's %d bytes" % (mode, s["mbs"], s["max_reserved_bytes"]))
t.check(chosen["none"] == 4 and chosen["none"] < chosen["selective"] < chosen["full"],
        "--mbs auto under %s GiB per rank: none %s, selective %s, full %s" % (limit, chosen["none"], chosen["selective"],
                                                                             chosen["full"]))

# The out-of-memory line suggests recomputation when it makes the micro-batch fit.
rc, out, err = t.run(2, TRAIN_AUTO + ["--mbs", str(chosen["selective"]), "--memory-limit", limit], check=False)
lines = [l for l in err.splitlines() if l.startswith("fsdp:")]
t.check(rc == 1 and len(lines) == 1 and "out of device memory" in lines[0] and "--recompute selective" in lines[0],
        "--mbs %s without recomputation runs out of memory and suggests it: %r" %
        (chosen["selective"], lines[0][-160:] if lines else err[-300:]))

for bad in ("partial", "yes", ""):
    rc, out, err = t.run(1, ["train", "--model", "tiny-llama", "--steps", "1", "--recompute", bad], check=False)
    lines = [l for l in err.splitlines() if l.startswith("fsdp:")]
    t.check(rc == 2 and len(lines) == 1 and "--recompute" in lines[0],
            "train --recompute '%s' -> exit %d, %r" % (bad, rc, lines[0] if lines else err[-300:]))
t.finish()
