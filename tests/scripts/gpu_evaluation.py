"""Evaluation on the CUDA backend: fsdp train --eval-data on one GPU (stream and pad files) reports
what fsdp eval of its checkpoint reports on the CPU backend (fp32, within 1e-4); fsdp eval on one GPU
and, with two GPUs, on two (FULL) gives the CPU's value; bf16 mixed precision stays within 2e-2.
Skipped (exit 77) without a GPU and the CUDA backend."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t  # noqa: E402
import packing  # noqa: E402

gpus = t.has_cuda_backend()
if gpus < 1:
    print("gpu_evaluation: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)

D = t.tmpdir("gpu-evaluation")
FP32 = ["--model-precision", "fp32", "--mixed-precision", "no"]
rng = random.Random(3)
docs = [[2] + [rng.randrange(3, 1000) for _ in range(rng.randrange(4, 60))] for _ in range(80)]
masks = [[0] * (len(d) // 2) + [1] * (len(d) - len(d) // 2) for d in docs]
files = {"stream": os.path.join(D, "stream.bin"), "pad": os.path.join(D, "pad.bin")}
packing.write_v2(files["stream"], docs, 1000)
packing.write_v2(files["pad"], docs, 1000, masks)


def evaluate(n, device, ckpt, data, extra=()):
    m = os.path.join(D, "eval.jsonl")
    if os.path.exists(m):
        os.remove(m)
    rc, out, err = t.run(n, ["eval", "--checkpoint", ckpt, "--data", data, "--seq", "32", "--mbs", "4", "--device",
                             device, "--metrics", m] + list(extra))
    return json.loads(open(m).read().splitlines()[-1]) if rc == 0 else None


def close(a, b, tol, what):
    ok = a is not None and b is not None and abs(a - b) <= tol * abs(b)
    t.check(ok, "%s: %s vs %s (tolerance %.0e)" % (what, a, b, tol))


for pk, data in files.items():
    run = t.tmpdir("gpu-evaluation-" + pk)
    m = os.path.join(run, "m.jsonl")
    t.run(1, ["train", "--model", "tiny-opt", "--data", data, "--eval-data", data, "--eval-every", "2", "--steps",
              "4", "--seq", "32", "--mbs", "4", "--lr", "3e-3", "--metrics", m, "--ckpt-dir",
              os.path.join(run, "ckpt")] + FP32, device="cuda")
    evals = [r for r in t.metrics(m)[0] if "eval_loss" in r]
    t.check([r["step"] for r in evals] == [2, 4], "%s: evaluation records at steps 2 and 4 on the GPU" % pk)
    gpu_train = evals[-1]["eval_loss"] if evals else None
    ckpt = os.path.join(run, "ckpt")
    cpu = evaluate(1, "cpu", ckpt, data, FP32)
    gpu = evaluate(1, "cuda", ckpt, data, FP32)
    close(gpu_train, cpu and cpu["eval_loss"], 1e-4, "%s: --eval-data on the GPU vs fsdp eval on the CPU" % pk)
    close(gpu and gpu["eval_loss"], cpu and cpu["eval_loss"], 1e-4, "%s: fsdp eval on one GPU vs the CPU" % pk)
    if gpus >= 2:
        two = evaluate(2, "cuda", ckpt, data, FP32)
        close(two and two["eval_loss"], gpu and gpu["eval_loss"], 1e-5, "%s: fsdp eval on two GPUs vs one" % pk)
    mixed = evaluate(1, "cuda", ckpt, data, ["--mixed-precision", "bf16"])
    close(mixed and mixed["eval_loss"], cpu and cpu["eval_loss"], 2e-2, "%s: bf16 mixed precision on the GPU" % pk)
t.finish()
