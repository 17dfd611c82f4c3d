"""Activation recomputation through `fsdp train` on GPUs:

- --recompute selective and full train as --recompute none: on one GPU (and on two with FULL, when
  two are visible), bf16 mixed precision, tiny-llama with flash and tiny-opt with its dropout and eager
  attention, 6 steps: the first step's loss bit for bit (nothing differs before the first update)
  and every loss within 1e-5 (the embedding's backward adds with fp32 atomics, so the weights differ
  in the last bits after the first update), the final weights within 1e-4. FSDP_GEMM_TUNE=0 makes
  every process choose the same cuBLASLt algorithms;
- each run reserves exactly what its plan says (plan_reserved_bytes), and less than none;
- --mbs auto under the same --memory-limit takes a larger micro-batch with --recompute full.
Skipped (exit 77) without a GPU and the CUDA backend."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

gpus = t.has_cuda_backend()
if gpus < 1:
    print("gpu_recompute: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)
t.ENV["FSDP_GEMM_TUNE"] = "0"

STEPS = 6
COMMON = ["train", "--seq", "64", "--steps", str(STEPS), "--lr", "2e-3", "--warmup", "2", "--grad-accum", "2"]


def train(n, tag, extra):
    d = t.tmpdir("gpu-recompute-" + tag)
    args = COMMON + ["--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt")] + list(extra)
    rc, _, _ = t.run(n, args, device="cuda")
    steps, summary = t.metrics(os.path.join(d, "m.jsonl")) if rc == 0 else ([], None)
    return steps, summary, os.path.join(d, "ckpt", "step-%08d.h5" % STEPS)


cases = [(1, ["--model", "tiny-llama", "--mbs", "4", "--attn", "flash"]),
         (1, ["--model", "tiny-opt", "--mbs", "4", "--attn", "eager", "--dropout", "0.1"])]
if gpus >= 2:
    cases.append((2, ["--model", "tiny-llama", "--mbs", "2", "--attn", "eager", "--strategy", "FULL"]))
for n, extra in cases:
    name = "%s on %d GPU(s) %s" % (extra[1], n, " ".join(extra[4:]))
    base, base_summary, base_ckpt = train(n, "%s-%d-none" % (extra[1], n), extra + ["--recompute", "none"])
    for mode in ("selective", "full"):
        steps, summary, ckpt = train(n, "%s-%d-%s" % (extra[1], n, mode), extra + ["--recompute", mode])
        what = "%s, --recompute %s vs none" % (name, mode)
        t.check(steps and base and steps[0]["loss"] == base[0]["loss"],
                "%s: step 1 loss bit for bit (%s)" % (what, steps[0]["loss"] if steps else None))
        t.compare_losses(steps, base, 1e-5, what)
        t.compare_checkpoints(ckpt, base_ckpt, 1e-4, what + ": final weights", skip="k_proj.bias")
        if summary and base_summary:
            t.check(summary["max_reserved_bytes"] == summary["plan_reserved_bytes"]
                    and summary["max_reserved_bytes"] < base_summary["max_reserved_bytes"],
                    "%s: reserved %d bytes, its plan's, less than none's %d" %
                    (what, summary["max_reserved_bytes"], base_summary["max_reserved_bytes"]))

# --mbs auto: a small model whose activations dominate, under the limit that the CUDA plan says fits
# micro-batch 16 without recomputation, plus 0.25 GiB: the plan counts 0.5 GiB for the CUDA context,
# which took 0.58 GiB on an H100 with CUDA 13 (and the limit counts everything in use on the GPU).
import json
rc, out, err = t.run(1, ["plan", "--model", "tiny-llama", "--seq", "256", "--mbs", "16", "--device", "cuda", "--json"])
limit = "%.6f" % (json.loads(out)["total_gib"] + 0.25) if rc == 0 else "1.25"
chosen = {}
for mode in ("none", "full"):
    d = t.tmpdir("gpu-recompute-auto-" + mode)
    path = os.path.join(d, "m.jsonl")
    rc, _, _ = t.run(1, ["train", "--model", "tiny-llama", "--seq", "256", "--steps", "1", "--mbs", "auto",
                         "--memory-limit", limit, "--recompute", mode, "--metrics", path], device="cuda")
    chosen[mode] = t.metrics(path)[1]["mbs"] if rc == 0 else None
t.check(chosen["none"] and chosen["full"] and chosen["full"] > chosen["none"],
        "--mbs auto under --memory-limit %s GiB: none %s, full %s" % (limit, chosen["none"], chosen["full"]))
t.finish()
