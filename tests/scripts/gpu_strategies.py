"""On two GPUs, FULL, SHARD_GRAD_OP, NO_SHARD and HYBRID (two emulated nodes of one GPU) train the same
model as one GPU: the same losses over 10 steps (fp32 within 1e-4, bf16 mixed precision within 2e-3),
FULL and SHARD_GRAD_OP also with their collectives on copy engines (--gather-engine copy
--reduce-engine copy); and a checkpoint written on the GPUs matches one written on the CPU backend
after the same steps. With dropout (tiny-opt, --dropout 0.1: the attention and MLP outputs and the
probabilities, eager and flash), two GPUs with FULL and NO_SHARD train as one GPU and as two CPU
ranks (fp32 within 1e-4): the masks follow the samples and the GPU draws the CPU's.
Skipped (exit 77) without two GPUs and the CUDA backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t


if t.has_cuda_backend() < 2:
    print("gpu_strategies: SKIPPED (needs 2 GPUs and the CUDA backend)")
    sys.exit(77)

COMMON = ["train", "--seq", "64", "--steps", "10", "--lr", "2e-3", "--warmup", "2",
          "--weight-decay", "0.1"]


def train(n, strategy, precision, tag, device="cuda", extra=(), model="tiny-llama"):
    d = t.tmpdir("gpu-strategies-" + tag)
    args = COMMON + ["--model", model, "--mbs", str(8 // n), "--strategy", strategy, "--metrics", os.path.join(d, "m.jsonl"),
                     "--ckpt-dir", os.path.join(d, "ckpt")] + precision + list(extra)
    t.run(n, args, device=device)
    return t.metrics(os.path.join(d, "m.jsonl"))[0], os.path.join(d, "ckpt", "step-00000010.h5")


for label, precision, tol in (("fp32", ["--model-precision", "fp32", "--mixed-precision", "no"], 1e-4),
                              ("bf16", [], 2e-3)):
    ref, ref_ckpt = train(1, "FULL", precision, label + "-1")
    copy = ("--gather-engine", "copy", "--reduce-engine", "copy")
    for strategy, extra in (("FULL", ()), ("SHARD_GRAD_OP", ()), ("NO_SHARD", ()), ("HYBRID", ("--ranks-per-node", "1")),
                            ("FULL", copy), ("SHARD_GRAD_OP", copy)):
        name = strategy + (" (copy engines)" if extra == copy else "")
        steps, _ = train(2, strategy, precision, "%s-2-%s-%d" % (label, strategy, len(extra)), extra=extra)
        t.compare_losses(steps, ref, tol, "%s 2 GPUs %s vs 1 GPU" % (label, name))
    if label == "fp32":
        cpu, cpu_ckpt = train(2, "FULL", precision, "fp32-cpu", device="cpu")
        t.compare_losses(ref, cpu, 1e-4, "fp32 1 GPU vs 2 CPU ranks")
        t.compare_checkpoints(ref_ckpt, cpu_ckpt, 1e-3, "fp32 GPU checkpoint vs CPU checkpoint after 10 steps")

FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]
for attn in ("eager", "flash"):
    drop = ("--dropout", "0.1", "--attn", attn)
    ref, _ = train(1, "FULL", FP32, "dropout-%s-1" % attn, extra=drop, model="tiny-opt")
    for strategy in ("FULL", "NO_SHARD"):
        steps, _ = train(2, strategy, FP32, "dropout-%s-2-%s" % (attn, strategy), extra=drop, model="tiny-opt")
        t.compare_losses(steps, ref, 1e-4, "tiny-opt dropout 0.1 %s: 2 GPUs %s vs 1 GPU" % (attn, strategy))
    cpu, _ = train(2, "FULL", FP32, "dropout-%s-cpu" % attn, device="cpu", extra=drop, model="tiny-opt")
    t.compare_losses(ref, cpu, 1e-4, "tiny-opt dropout 0.1 %s: 1 GPU vs 2 CPU ranks" % attn)
t.finish()
