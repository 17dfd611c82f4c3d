"""hpZ (--reshard-after-forward node, src/shard/secondary.c) on two GPUs emulating two nodes of one GPU
(--ranks-per-node 1): the secondary group is one GPU, so each GPU keeps its whole copy of every block after
the forward and the backward "gathers" it through a one-rank NCCL communicator; the weights,
gradients and optimizer states stay sharded over both GPUs. Checks that the CUDA path (the secondary
communicator, the copy into the secondary buffer on the compute stream, the gather stream's wait for
it, with bf16 and int8 gathers, prefetch 2 and the gathers on copy engines) trains what FULL trains on
the same two GPUs (fp32 within 1e-5, bf16 within 1e-3: the GPU's embedding backward adds with atomics,
so runs agree within rounding, not bit for bit) and what one GPU trains (gpu_strategies.py's bounds);
that the backward's gathers left the world's all-gathers (comm_bytes: FULL's less the blocks', none
counted across the one-GPU groups); and that the run reserved what its memory plan said, the
secondary copy included. Its speed is not measured: that needs 4 or more GPUs per host.
Skipped (exit 77) without two GPUs and the CUDA backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

if t.has_cuda_backend() < 2:
    print("gpu_hpz: SKIPPED (needs 2 GPUs and the CUDA backend)")
    sys.exit(77)

COMMON = ["train", "--model", "tiny-llama", "--seq", "64", "--steps", "10", "--lr", "2e-3", "--warmup", "2",
          "--weight-decay", "0.1", "--embedding-grads", "dense"]
HPZ = ["--ranks-per-node", "1", "--reshard-after-forward", "node"]


def train(n, tag, extra):
    d = t.tmpdir("gpu-hpz-" + tag)
    t.run(n, COMMON + ["--mbs", str(8 // n), "--metrics", os.path.join(d, "m.jsonl")] + list(extra), device="cuda")
    return t.metrics(os.path.join(d, "m.jsonl"))


for label, flags, tol_same, tol_one in (
        ("fp32", ["--model-precision", "fp32", "--mixed-precision", "no"], 1e-5, 1e-4),
        ("bf16", ["--mixed-precision", "bf16"], 1e-3, 2e-3),
        ("bf16 int8 gathers prefetch 2", ["--mixed-precision", "bf16", "--gather-dtype", "int8", "--prefetch", "2"],
         1e-3, 5e-3),
        ("bf16 gathers on copy engines", ["--mixed-precision", "bf16", "--gather-engine", "copy"], 1e-3, 2e-3)):
    tag = label.replace(" ", "-")
    one, _ = train(1, tag + "-1", flags)
    full, full_sum = train(2, tag + "-full", flags + ["--ranks-per-node", "1"])
    hpz, hpz_sum = train(2, tag + "-hpz", flags + HPZ)
    t.compare_losses(hpz, full, tol_same, "%s: 2 GPUs FULL with hpZ vs without" % label)
    t.compare_losses(hpz, one, tol_one, "%s: 2 GPUs FULL with hpZ vs 1 GPU" % label)
    t.check(hpz_sum["reshard_after_forward"] == 1, "%s: the summary records reshard_after_forward 1" % label)
    # After the first step (whose first gathers start at set-up), every step's world gathers are the
    # forward's only: fewer than FULL's by the blocks' backward, and none inside the one-GPU groups.
    pairs = list(zip(hpz[1:], full[1:]))
    t.check(all(h["comm_bytes"]["all_gather"] < f["comm_bytes"]["all_gather"] and
                h["comm_bytes"]["all_gather_secondary"] == 0 and
                h["comm_bytes"]["reduce"] == f["comm_bytes"]["reduce"] for h, f in pairs) and pairs,
            "%s: hpZ's world all-gathers are the forward's (%d bytes a step against FULL's %d), its reductions FULL's"
            % (label, hpz[-1]["comm_bytes"]["all_gather"], full[-1]["comm_bytes"]["all_gather"]))
    if "copy engines" not in label:  # NCCL rounds copy-engine windows: the plan does not count them to the byte
        t.check(hpz_sum["max_reserved_bytes"] == hpz_sum["plan_reserved_bytes"] and
                hpz_sum["max_reserved_bytes"] > full_sum["max_reserved_bytes"],
                "%s: hpZ reserves what its plan says, %d bytes (FULL: %d)" % (
                    label, hpz_sum["max_reserved_bytes"], full_sum["max_reserved_bytes"]))
t.finish()
