"""A checkpoint written on the GPU resumes on the CPU backend and the other way round: steps 6-10
after resuming match an uninterrupted run on the other backend (fp32, within 1e-4).
Skipped (exit 77) without a GPU and the CUDA backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

if t.has_cuda_backend() < 1:
    print("gpu_checkpoint: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)

COMMON = ["train", "--model", "tiny-opt", "--seq", "32", "--mbs", "4", "--steps", "10", "--lr", "2e-3",
          "--model-precision", "fp32", "--mixed-precision", "no", "--ckpt-every", "5"]


def train(device, tag, extra=()):
    d = t.tmpdir("gpu-ckpt-" + tag)
    t.run(1, COMMON + ["--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt")] + list(extra),
          device=device)
    return d, t.metrics(os.path.join(d, "m.jsonl"))[0]


gpu_dir, gpu_run = train("cuda", "gpu")
cpu_dir, cpu_run = train("cpu", "cpu")
_, cpu_from_gpu = train("cpu", "cpu-from-gpu", ["--resume", os.path.join(gpu_dir, "ckpt", "step-00000005.h5")])
_, gpu_from_cpu = train("cuda", "gpu-from-cpu", ["--resume", os.path.join(cpu_dir, "ckpt", "step-00000005.h5")])
t.compare_losses(cpu_from_gpu, gpu_run[5:], 1e-4, "GPU checkpoint resumed on the CPU vs the GPU run")
t.compare_losses(gpu_from_cpu, cpu_run[5:], 1e-4, "CPU checkpoint resumed on the GPU vs the CPU run")
t.finish()
