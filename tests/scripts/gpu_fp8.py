"""`--fp8` through `fsdp train` on GPUs (cuBLASLt's FP8 products):

- on a GPU with FP8 (compute capability 8.9+): a small Llama (dimensions multiples of 16) learns a
  token file with --fp8 tensorwise and rowwise as with bf16 products (bf16 mixed precision, 20 steps):
  every loss finite, the final loss within 1% of bf16's fall from its first, the first loss unlike bf16's (the FP8
  products ran) but within 1%; the CPU's emulation of the same first step within 2e-3 (the GPU and
  the CPU differ in the order of their sums and so in some bf16 roundings); each run
  reserves what its plan says (plan_reserved_bytes: the FP8 operands are counted in the op scratch);
- with two GPUs, FULL on 2 ranks takes the same first step as 1 rank with accumulation 2 (the same
  micro-batches, so the same FP8 scales): loss within 1e-5;
- with two GPUs, FP8 weights gathered as e4m3 codes (--gather-dtype fp8) on FULL, SHARD_GRAD_OP and FULL with
  hpZ learn as exact gathers do (final loss within 2% of the loss's fall) and reserve what their plans say;
- on a GPU without FP8 (an A100): --fp8 is refused in one line naming the GPU.
Skipped (exit 77) without a GPU and the CUDA backend."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import packing

gpus = t.has_cuda_backend()
if gpus < 1:
    print("gpu_fp8: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)
t.ENV["FSDP_GEMM_TUNE"] = "0"

D = t.tmpdir("gpu-fp8")
CONFIG = os.path.join(D, "config.json")
with open(CONFIG, "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
               "torch_dtype": "float32"}, f)
TOKENS = os.path.join(D, "tokens.bin")
rng = random.Random(5)
motif = [rng.randrange(1, 250) for _ in range(61)]
packing.write_v1(TOKENS, (motif * 2000)[:100000], 256)

STEPS = 20


def train(n, tag, extra, device="cuda", accum=2, check=True, steps=STEPS):
    d = t.tmpdir("gpu-fp8-" + tag)
    args = ["train", "--model", CONFIG, "--data", TOKENS, "--seq", "128", "--mbs", "8", "--grad-accum", str(accum),
            "--steps", str(steps), "--lr", "2e-3", "--warmup", "3", "--log-every", "100", "--model-precision", "fp32",
            "--mixed-precision", "bf16", "--metrics", os.path.join(d, "m.jsonl")] + list(extra)
    rc, out, err = t.run(n, args, device=device, check=check)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl")) if rc == 0 else ([], None)
    return rc, steps, summary, err


def rel(a, b):
    return abs(a - b) / abs(b)


def losses(steps):
    return [r["loss"] for r in steps]


rc, _, _, err = train(1, "probe", ["--fp8", "tensorwise"], check=False, steps=1)
if rc != 0 and "no FP8 tensor cores" in err:
    lines = [l for l in err.strip().splitlines() if l.strip()]
    t.check(len(lines) == 1 and "--fp8 tensorwise" in lines[0], "a GPU without FP8: --fp8 refused in one line (%s)" %
            lines[-1:])
    t.finish()
t.check(rc == 0, "a GPU with FP8 runs --fp8 tensorwise")

_, bf16, bf16_summary, _ = train(1, "bf16", ["--fp8", "none"])
for fp8 in ("tensorwise", "rowwise"):
    _, steps, summary, _ = train(1, fp8, ["--fp8", fp8])
    got = losses(steps)
    ok = len(got) == STEPS and len(bf16) == STEPS and all(x == x and abs(x) < 1e30 for x in got)
    # The run memorises its data (5.6 -> 0.3 nats), where a relative bound on the last loss amplifies
    # rounding: the last losses differ by under 1% of the loss's fall.
    fall = bf16[0]["loss"] - bf16[-1]["loss"]
    t.check(ok and abs(got[-1] - bf16[-1]["loss"]) < 0.01 * fall and got[-1] < 0.8 * got[0],
            "--fp8 %s learns as bf16 does: final loss %s vs %s" % (fp8, got[-1:], [r["loss"] for r in bf16[-1:]]))
    t.check(ok and got[0] != bf16[0]["loss"] and rel(got[0], bf16[0]["loss"]) < 0.01,
            "--fp8 %s: first loss %s, unlike bf16's %s but within 1%%" % (fp8, got[:1], [r["loss"] for r in bf16[:1]]))
    t.check(summary is not None and summary["max_reserved_bytes"] == summary["plan_reserved_bytes"] and
            summary["max_reserved_bytes"] > bf16_summary["max_reserved_bytes"],
            "--fp8 %s reserves what its plan says, more than bf16 (%s)" %
            (fp8, summary and (summary["max_reserved_bytes"], summary["plan_reserved_bytes"])))
    _, cpu, _, _ = train(1, fp8 + "-cpu", ["--fp8", fp8], device="cpu", steps=1)
    t.check(len(cpu) == 1 and got and rel(cpu[0]["loss"], got[0]) < 2e-3,
            "--fp8 %s: the CPU's emulation's first loss %s, the GPU's %s" % (fp8, losses(cpu), got[:1]))
    if gpus >= 2:
        _, two, _, _ = train(2, fp8 + "-2", ["--fp8", fp8, "--strategy", "FULL"], accum=1)
        t.check(two and rel(two[0]["loss"], got[0]) <= 1e-5,
                "--fp8 %s on 2 GPUs FULL: the first loss as on 1 (%s vs %s)" % (fp8, losses(two)[:1], got[:1]))

# FP8 weights gathered as e4m3 codes (--gather-dtype fp8 with tensorwise products; src/shard/fp8_weights.c):
# FULL, SHARD_GRAD_OP and FULL with hpZ (2 GPUs as 2 nodes; its backward gathers bf16 values inside the node and
# casts them) learn as the exact gathers do and reserve what their plans say (the codes beside each gathered
# slot and their scales).
if gpus >= 2:
    _, exact, _, _ = train(2, "tw-exact-2", ["--fp8", "tensorwise", "--strategy", "FULL"], accum=1)
    for strategy, extra in (("FULL", []), ("SHARD_GRAD_OP", []),
                            ("FULL", ["--ranks-per-node", "1", "--reshard-after-forward", "node"])):
        what = "--fp8 tensorwise --gather-dtype fp8 on 2 GPUs %s%s" % (strategy, " with hpZ" if extra else "")
        rc, steps, summary, err = train(2, "tw-fp8gather-%s%s" % (strategy, "-hpz" if extra else ""),
                                        ["--fp8", "tensorwise", "--gather-dtype", "fp8", "--strategy", strategy] + extra,
                                        accum=1, check=False)
        got, ref = losses(steps), losses(exact)
        fall = ref[0] - ref[-1] if len(ref) == STEPS else 0.0
        t.check(rc == 0 and len(got) == STEPS and all(x == x for x in got) and abs(got[-1] - ref[-1]) < 0.02 * fall,
                "%s learns as exact gathers do: final loss %s vs %s (2%% of the fall)" % (what, got[-1:], ref[-1:]))
        t.check(summary is not None and summary["max_reserved_bytes"] == summary["plan_reserved_bytes"],
                "%s reserves what its plan says (%s)" %
                (what, summary and (summary["max_reserved_bytes"], summary["plan_reserved_bytes"])))
t.finish()
