"""`fsdp train --mbs auto`, `--global-batch` and running out of memory, on the CPU backend with a
--memory-limit (its allocator refuses to reserve past it):

- --mbs auto chooses the largest micro-batch whose plan fits the limit, and trains; that micro-batch
  given by hand trains, and the next one up runs out of memory: one line naming the plan and what
  fits, exit 1, on every rank;
- a rank whose allocator has less memory than the plan was told (FSDP_TEST_MEMORY_LIMIT, a test
  hook) runs out while the run is set up: every rank agrees, and the run is built again with the
  next smaller micro-batch, which trains;
- --global-batch that divides trains exactly as the same --grad-accum given by hand (same losses,
  same weights); one that does not divide is one line and exit 2.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

RANKS = 2
COMMON = ["train", "--model", "tiny-llama", "--seq", "16", "--log-every", "100"]


def plan_bytes(mbs):
    rc, out, err = t.run(1, ["plan", "--model", "tiny-llama", "--seq", "16", "--gpus", str(RANKS), "--mbs", str(mbs),
                             "--device", "cpu", "--json"], check=False)
    if rc:
        t.fail("plan: " + err[-300:])
        return 0
    return json.loads(out)["bytes"]["reserved"]


def gib(x):
    return "%.12f" % (x / 2 ** 30)


def train(args, tag, env=None, check=True):
    d = t.tmpdir("mbs-auto-%s" % tag)
    path = os.path.join(d, "m.jsonl")
    saved = dict(t.ENV)
    t.ENV.update(env or {})
    try:
        rc, out, err = t.run(RANKS, COMMON + args + ["--metrics", path], check=check)
    finally:
        t.ENV.clear()
        t.ENV.update(saved)
    steps, summary = t.metrics(path) if rc == 0 else ([], None)
    return rc, out, err, steps, summary


def ours(err):
    return [l for l in err.splitlines() if l.startswith("fsdp:")]


# The limit sits between the plans of micro-batches 5 and 6.
five, six = plan_bytes(5), plan_bytes(6)
limit = gib((five + six) / 2)
rc, out, err, steps, s = train(["--mbs", "auto", "--memory-limit", limit, "--steps", "2"], "auto")
t.check(rc == 0 and s and s["mbs"] == 5 and len(steps) == 2 and "--mbs auto chose 5" in out,
        "--mbs auto under the limit between the plans of 5 and 6 chose %s and trained" % (s["mbs"] if s else None))
t.check(s is not None and s["max_reserved_bytes"] == five and s["step_downs"] == 0,
        "... it reserved exactly the plan's %d bytes, without stepping down" % five)
rc, _, _, steps, _ = train(["--mbs", "5", "--memory-limit", limit, "--steps", "1"], "five")
t.check(rc == 0 and len(steps) == 1, "--mbs 5 under the same limit trains")
rc, out, err, _, _ = train(["--mbs", "6", "--memory-limit", limit, "--steps", "1"], "six", check=False)
lines = ours(err)
t.check(rc == 1 and len(lines) == 1 and "out of device memory" in lines[0] and "the plan for --mbs 6" in lines[0]
        and "--mbs 5" in lines[0] and "Segmentation" not in err,
        "--mbs 6 runs out of memory: one line with the plan and what fits, exit %d: %r" % (rc, lines[0] if lines else err[-300:]))

# Rank 1 has less memory than the plan was told: micro-batch 5 runs out there, every rank steps down to 4.
four = plan_bytes(4)
hook = {"FSDP_TEST_MEMORY_LIMIT": "1:" + gib((four + five) / 2)}
rc, out, err, steps, s = train(["--mbs", "auto", "--memory-limit", limit, "--steps", "2"], "step-down", env=hook)
t.check(rc == 0 and s and s["mbs"] == 4 and s["step_downs"] == 1 and len(steps) == 2,
        "an out-of-memory on rank 1 while the run is set up: every rank built it again with %s" % (s["mbs"] if s else None))
t.check("5 ran out of memory while the run was set up" in out and "on rank 1" in out and "building it again with 4" in out,
        "... and the progress output says why")
t.check(s is not None and s["max_reserved_bytes"] == four, "... reserving the plan of 4: %d bytes" % four)

# Without a limit the CPU backend has no memory size to fit into.
rc, _, err, _, _ = train(["--mbs", "auto", "--steps", "1"], "no-limit", check=False)
lines = ours(err)
t.check(rc == 2 and len(lines) == 1 and "--memory-limit" in lines[0], "--mbs auto without --memory-limit on the CPU: %r"
        % (lines[0] if lines else err[-200:]))

# --global-batch: 12 samples over 2 ranks at micro-batch 3 is 2 accumulation steps.
fixed = ["--steps", "3", "--lr", "2e-3", "--model-precision", "fp32", "--mixed-precision", "no"]
d1, d2 = t.tmpdir("mbs-auto-gb-ckpt"), t.tmpdir("mbs-auto-ga-ckpt")
rc, out, _, a, _ = train(["--mbs", "3", "--global-batch", "12", "--ckpt-dir", d1] + fixed, "global-batch")
t.check(rc == 0 and "3 per rank x 2 accumulation x 2 ranks = 12 samples" in out, "--global-batch 12 at --mbs 3 on 2 ranks: 2 accumulation steps")
rc, _, _, b, _ = train(["--mbs", "3", "--grad-accum", "2", "--ckpt-dir", d2] + fixed, "grad-accum")
t.check(rc == 0 and [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 3,
        "... the same losses as --grad-accum 2, bit for bit")
t.compare_checkpoints(os.path.join(d1, "step-00000003.h5"), os.path.join(d2, "step-00000003.h5"), 0, "... the same weights",
                      exact=True)
rc, _, _, c, _ = train(["--mbs", "2", "--global-batch", "12", "--steps", "3", "--lr", "2e-3", "--model-precision", "fp32",
                        "--mixed-precision", "no"], "global-batch-other-split")
t.compare_losses(c, a, 1e-5, "--global-batch 12 split as 2 x 3 accumulation")
rc, _, err, _, _ = train(["--mbs", "4", "--global-batch", "12", "--steps", "1"], "not-dividing", check=False)
lines = ours(err)
t.check(rc == 2 and len(lines) == 1 and "--global-batch 12 is not a multiple of --mbs 4 x 2 ranks = 8" in lines[0],
        "--global-batch that does not divide: %r" % (lines[0] if lines else err[-200:]))
rc, out, err, _, s = train(["--mbs", "auto", "--global-batch", "12", "--memory-limit", limit, "--steps", "1"], "auto-gb")
t.check(rc == 0 and s and s["mbs"] == 3 and s["grad_accum"] == 2,
        "--mbs auto with --global-batch 12 takes 3, the largest that fits and divides the 6 per rank")
t.finish()
