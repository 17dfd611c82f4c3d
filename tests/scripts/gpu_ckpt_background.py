"""Background saves on GPUs: the shards are copied to pinned host memory (training pauses for that
only, at most 1 s) and written while the next steps run; files written from bf16 and fp32 GPU state
verify, resume on the GPU and on the CPU backend, and a SIGTERM on two GPUs stops with a checkpoint
that one GPU resumes. Skipped (exit 77) without a GPU and the CUDA backend."""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t

gpus = t.has_cuda_backend()
if gpus < 1:
    print("gpu_ckpt_background: SKIPPED (needs a GPU and the CUDA backend)")
    sys.exit(77)


def run_args(d, model, steps, precision, extra=()):
    return ["train", "--model", model, "--seq", "512", "--mbs", "4", "--lr", "1e-4", "--steps", str(steps),
            "--model-precision", precision, "--mixed-precision", "bf16", "--ckpt-dir", os.path.join(d, "ck"),
            "--metrics", os.path.join(d, "m.jsonl")] + list(extra)


# A model big enough that a save takes seconds (Qwen2.5-0.5B's full state: 5.9 GB): the write must
# overlap training, the pause must not. Ten steps take less than one write, so the saves at 20 and 30
# wait for the one before (one snapshot buffer); fsdp.c reports that wait and counts it in the pause,
# and the bar applies to the pause without it.
MODEL = "qwen2.5-0.5b"
for precision in ("fp32", "bf16"):
    d = t.tmpdir("gpu-ckpt-bg-" + precision)
    rc, out, err = t.run(1, run_args(d, MODEL, 30, precision, ["--ckpt-every", "10"]), device="cuda", timeout=900)
    waits = {int(m.group(1)): float(m.group(2)) for m in
             re.finditer(r"checkpoint: step (\d+) waited ([0-9.]+) s for the save of step", out)}
    saves = [(int(m.group(1)), float(m.group(2)) - waits.get(int(m.group(1)), 0.0)) for m in
             re.finditer(r"checkpoint: step (\d+) written to .*training paused ([0-9.]+) s", out)]
    t.check(rc == 0 and [s for s, _ in saves] == [10, 20, 30], "%s: saves at 10, 20, 30" % precision)
    t.check(10 not in waits and all(p <= 1.0 for _, p in saves),
            "%s: training paused at most 1 s per save, besides waiting for the save before (%s; waits %s)" %
            (precision, saves, waits))
    lines = out.splitlines()
    at = next((i for i, l in enumerate(lines) if l.startswith("checkpoint: step 10 ")), -1)
    ran = [int(m.group(1)) for l in lines[:max(at, 0)] for m in [re.match(r"step +(\d+)/", l)] if m]
    t.check(at > 0 and ran and max(ran) > 10,
            "%s: steps after 10 ran while the save of step 10 was written (up to step %s)" % (precision, max(ran or [0])))
    rc, vout, verr = t.run(1, ["verify", os.path.join(d, "ck")], check=False)
    t.check(rc == 0 and vout.count(": ok: ") == 3, "%s: every checkpoint verifies" % precision)
    ref = t.metrics(os.path.join(d, "m.jsonl"))[0]
    r = t.tmpdir("gpu-ckpt-bg-resume-" + precision)
    rc, out, err = t.run(1, run_args(r, MODEL, 30, precision, ["--resume", os.path.join(d, "ck", "step-00000020.h5")]),
                         device="cuda", timeout=900)
    t.compare_losses(t.metrics(os.path.join(r, "m.jsonl"))[0], ref[20:], 5e-3 if precision == "bf16" else 1e-3,
                     "%s: resumed on the GPU from step 20" % precision)

# The same file on the CPU backend (a small model: the CPU is slow).
d = t.tmpdir("gpu-ckpt-bg-tiny")
on_gpu = [a if a != "cpu" else "cuda" for a in c.train(d, 6, ["--ckpt-every", "3"])]  # c.TINY names --device cpu
t.run(1, on_gpu, device=None)
ref = t.metrics(os.path.join(d, "m.jsonl"))[0]
r = t.tmpdir("gpu-ckpt-bg-tiny-cpu")
# Two ranks of one sample each: the GPU run's global batch (one rank of --mbs 2), so the same samples train.
on_two = c.train(r, 6, ["--resume", os.path.join(d, "ck", "step-00000003.h5")])
on_two[on_two.index("--mbs") + 1] = "1"
rc, out, err = t.run(2, on_two, check=False)
t.compare_losses(t.metrics(os.path.join(r, "m.jsonl"))[0], ref[3:], 1e-4, "a GPU checkpoint resumed on 2 CPU ranks")

# Two GPUs: SIGTERM to a rank stops both with a checkpoint; one GPU resumes it.
if gpus >= 2:
    d = t.tmpdir("gpu-ckpt-bg-sigterm")
    job = c.Job(2, run_args(d, MODEL, 100000, "fp32", ["--device", "cuda"]))
    if job.wait_for(r"step +5/", timeout=600):
        os.kill(job.rank_pids()[1], signal.SIGTERM)
    rc = job.wait(timeout=600)
    m = re.search(r"stopped by SIGTERM at step (\d+)", job.output())
    t.check(rc == 75 and m, "2 GPUs: SIGTERM to rank 1 stops both with a checkpoint, exit 75")
    if m:
        rc, out, err = t.run(1, run_args(d, MODEL, int(m.group(1)) + 2, "fp32",
                                         ["--resume", "auto", "--allow-schedule-change"]),
                             device="cuda", timeout=900, check=False)
        t.check(rc == 0 and "resumed from" in out, "one GPU resumes the two-GPU checkpoint")
t.finish()
