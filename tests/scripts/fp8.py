"""`--fp8` end to end on the CPU backend, which emulates the FP8 products (src/kernels/cpu/fp8.c):

- tensorwise and rowwise train a small Llama (dimensions multiples of 16) on a learnable token file:
  the loss falls as with fp32 products, ends within 1% of theirs, and differs from them from the
  first step (the FP8 products did run), fp32 and bf16 mixed precision;
- the same micro-batches on 2, 3 and 4 ranks (FULL, SHARD_GRAD_OP, NO_SHARD, HYBRID as 2 emulated
  nodes) as on 1 rank with accumulation: the first step's loss and gradient norm agree to 1e-6 and
  1e-5 (the FP8 maths of each micro-batch is the same; only the order of gradient sums differs),
  where fp32 products differ from FP8 ones by far more; later steps within 2e-3 (a weight that moved
  by a rounding can round to another FP8 code);
- the metrics summary and the run line say the recipe;
- FP8 weights gathered as codes (--gather-dtype fp8 with tensorwise products) on FULL, SHARD_GRAD_OP and FULL
  with hpZ train within 3e-3 of exact gathers (fp8 gathers' own noise here), and the run line says so;
  `fsdp plan` counts their codes and scales to the byte, and none for rowwise products or int8 gathers;
- refused in one line: a model whose intermediate size is not a multiple of 16, a micro-batch of 12
  tokens, and a value that is not a recipe.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing

D = t.tmpdir("fp8")
CONFIG = os.path.join(D, "config.json")
with open(CONFIG, "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
               "torch_dtype": "float32"}, f)
TOKENS = os.path.join(D, "tokens.bin")
rng = random.Random(3)
motif = [rng.randrange(1, 250) for _ in range(37)]
packing.write_v1(TOKENS, (motif * 400)[:12000], 256)

STEPS = 8
MBS, GLOBAL = 4, 48  # 64 tokens per micro-batch; 12 micro-batches a step on every layout
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]


def train(n, tag, extra, precision=FP32):
    d = t.tmpdir("fp8-" + tag)
    args = ["train", "--model", CONFIG, "--data", TOKENS, "--seq", "16", "--steps", str(STEPS), "--lr", "3e-3",
            "--warmup", "2", "--log-every", "100", "--mbs", str(MBS), "--grad-accum", str(GLOBAL // (MBS * n)),
            "--metrics", os.path.join(d, "m.jsonl")] + precision + list(extra)
    rc, out, err = t.run(n, args)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl")) if rc == 0 else ([], None)
    return steps, summary, out


def losses(steps):
    return [r["loss"] for r in steps]


def rel(a, b):
    return abs(a - b) / abs(b)


base = {}
for fp8 in ("none", "tensorwise", "rowwise"):
    base[fp8] = train(1, "1-" + fp8, ["--fp8", fp8])
none = losses(base["none"][0])
t.check(len(none) == STEPS and none[-1] < 0.8 * none[0], "fp32 products learn the token file (%s)" % none[-1:])
for fp8 in ("tensorwise", "rowwise"):
    steps, summary, out = base[fp8]
    got = losses(steps)
    t.check(len(got) == STEPS and got[-1] < 0.8 * got[0] and rel(got[-1], none[-1]) < 0.01,
            "--fp8 %s learns as fp32 products do: final loss %s vs %s" % (fp8, got[-1:], none[-1:]))
    t.check(len(got) == STEPS and rel(got[0], none[0]) > 1e-6 and
            rel(steps[0]["grad_norm"], base["none"][0][0]["grad_norm"]) > 1e-5,
            "--fp8 %s: the first loss and gradient norm differ from fp32 products' (the FP8 products ran)" % fp8)
    t.check(summary is not None and summary.get("fp8") == fp8 and ("| fp8 %s" % fp8) in out,
            "--fp8 %s: the metrics summary and the run line say it" % fp8)
t.check(base["none"][1] is not None and base["none"][1].get("fp8") == "none", "the summary says fp8 none by default")

# bf16 mixed precision (the CPU's emulated bf16 activations)
BF16 = ["--model-precision", "fp32", "--mixed-precision", "bf16"]
bf16 = {fp8: losses(train(1, "bf16-" + fp8, ["--fp8", fp8], precision=BF16)[0]) for fp8 in ("none", "rowwise")}
t.check(len(bf16["rowwise"]) == STEPS and rel(bf16["rowwise"][-1], bf16["none"][-1]) < 0.01 and
        bf16["none"] != none and bf16["rowwise"] != losses(base["rowwise"][0]),
        "bf16 mixed precision: --fp8 rowwise ends within 1%% of bf16 products (%s vs %s), both unlike fp32's" %
        (bf16["rowwise"][-1:], bf16["none"][-1:]))

LAYOUTS = [(2, "FULL", [], "tensorwise"), (4, "HYBRID", ["--ranks-per-node", "2"], "tensorwise"),
           (3, "SHARD_GRAD_OP", [], "rowwise"), (4, "NO_SHARD", [], "rowwise")]
if t.SANITIZED:  # one sharded and one hybrid layout: the same products run in the others
    LAYOUTS = LAYOUTS[:2]
for n, strategy, extra, fp8 in LAYOUTS:
    what = "--fp8 %s on %d ranks %s" % (fp8, n, strategy)
    steps = train(n, "%d-%s-%s" % (n, strategy, fp8), ["--fp8", fp8, "--strategy", strategy] + extra)[0]
    ref = base[fp8][0]
    if len(steps) != STEPS:
        t.fail("%s: %d steps" % (what, len(steps)))
        continue
    t.check(rel(steps[0]["loss"], ref[0]["loss"]) <= 1e-6 and rel(steps[0]["grad_norm"], ref[0]["grad_norm"]) <= 1e-5,
            "%s: first loss and gradient norm as on 1 rank (%.8g, %.8g vs %.8g, %.8g)" %
            (what, steps[0]["loss"], steps[0]["grad_norm"], ref[0]["loss"], ref[0]["grad_norm"]))
    worst = max(rel(a, b) for a, b in zip(losses(steps), losses(ref)))
    t.check(worst <= 2e-3, "%s: every loss within 2e-3 of 1 rank's (worst %.1e)" % (what, worst))

# FP8 weights gathered as codes (--gather-dtype fp8 with tensorwise products; src/shard/fp8_weights.c, whose
# codes tests/mpi/test_fp8_weights.c holds bit for bit to a cast of the master weights): FULL on 2 ranks,
# SHARD_GRAD_OP on 3 (the codes kept from forward to backward) and FULL with hpZ on 4 as 2 nodes (the backward's
# gather inside the node moves bf16 values, whose products cast them) train as the exact gathers do, every loss
# within 3e-3 (the embeddings and norms still travel in blockwise e4m3, which alone moves this model's losses by
# 1-2e-3); the run line says it, and neither rowwise products nor int8 gathers take this path.
ref = train(2, "2-FULL-tensorwise-bf16gather", ["--fp8", "tensorwise", "--strategy", "FULL"])[0]
for n, strategy, extra in ((2, "FULL", []), (3, "SHARD_GRAD_OP", []),
                           (4, "FULL", ["--ranks-per-node", "2", "--reshard-after-forward", "node"])):
    what = "--fp8 tensorwise --gather-dtype fp8 on %d ranks %s%s" % (n, strategy, " with hpZ" if extra else "")
    steps, _, out = train(n, "%d-%s-fp8gather%s" % (n, strategy, "-hpz" if extra else ""),
                          ["--fp8", "tensorwise", "--gather-dtype", "fp8", "--strategy", strategy] + extra)
    t.check("block weights gathered as e4m3 codes" in out, "%s: the run line says the weights come as codes" % what)
    if len(steps) != STEPS or len(ref) != STEPS:
        t.fail("%s: %d steps" % (what, len(steps)))
        continue
    worst = max(rel(a, b) for a, b in zip(losses(steps), losses(ref)))
    t.check(worst <= 3e-3 and 0 < rel(steps[0]["loss"], ref[0]["loss"]),
            "%s: every loss within 3e-3 of exact gathers' (worst %.1e), the first one not equal" % (what, worst))
for extra in (["--fp8", "rowwise", "--gather-dtype", "fp8"], ["--fp8", "tensorwise", "--gather-dtype", "int8"]):
    out = train(2, "2-FULL-" + "-".join(extra[1::2]), extra + ["--strategy", "FULL"])[2]
    t.check("| fp8 " in out and "gathered as e4m3 codes" not in out,
            "%s: the products cast their weights from the gathered units" % " ".join(extra))

# fsdp plan counts the codes beside each gathered slot and the scales to the byte: Llama-3.2-1B on 8 GPUs, whose
# blocks' four weights (q|k|v [3072, 2048], o [2048, 2048], gate|up [16384, 2048], down [2048, 8192]) take W and
# W^T a slot, in the ring of the blocks (the EMBED and HEAD rings hold one slot each), and every unit's scales
# (64 floats a weight) with the amaxes exchanged (4 floats a unit, for this rank and the 8).
def plan(extra):
    rc, out, _ = t.run(1, ["plan", "--model", "llama-3.2-1b", "--gpus", "8", "--device", "cuda", "--mbs", "4",
                           "--json"] + extra)
    return json.loads(out)


weights = 3072 * 2048 + 2048 * 2048 + 16384 * 2048 + 2048 * 8192
p = plan(["--fp8", "tensorwise", "--gather-dtype", "fp8"])
units = 16 + 2
scales = units * (64 + 1 + 8) * 4 * 4
want = 2 * weights * (p["gathered_slots"] - 2) + (scales + 255) // 256 * 256
t.check(p["bytes"]["fp8_weights"] == want, "plan --fp8 tensorwise --gather-dtype fp8: FP8 weights %d bytes (plan: %d)"
        % (want, p["bytes"]["fp8_weights"]))
for extra in (["--fp8", "rowwise", "--gather-dtype", "fp8"], ["--fp8", "tensorwise", "--gather-dtype", "int8"],
              ["--fp8", "tensorwise"]):
    t.check(plan(extra)["bytes"]["fp8_weights"] == 0, "plan %s: no FP8 weights beside the slots" % " ".join(extra))

# refusals: one line, non-zero exit
for args, expect, what in (
        (["--model", "tiny-llama", "--fp8", "tensorwise"], "--fp8 tensorwise needs multiples of 16",
         "an intermediate size of 88"),
        (["--model", CONFIG, "--fp8", "rowwise", "--mbs", "1", "--seq", "12"], "--mbs 1 x --seq 12 = 12",
         "12 tokens per micro-batch"),
        (["--model", CONFIG, "--fp8", "blockwise"], "--fp8", "an unknown recipe")):
    rc, out, err = t.run(1, ["train", "--steps", "1"] + args, check=False)
    lines = [l for l in err.strip().splitlines() if l.strip()]
    t.check(rc != 0 and len(lines) == 1 and expect in lines[0], "refused in one line: %s (%s)" % (what, lines[-1:]))

t.finish()
