"""--mbs auto on a GPU finds the true maximum: Llama-3.2-1B at sequence 1024 on one GPU (and FULL on
two when two are visible) trains with the micro-batch --mbs auto chooses, reserving what the plan
said (max_reserved_bytes equal to the plan's, and to `fsdp plan --mbs auto`'s choice), and the next
micro-batch up runs out of GPU memory with one line, no CUDA error dump. Then with a GPU made
smaller for the allocator only (FSDP_TEST_MEMORY_LIMIT, a test hook the plan does not know of) the
set-up runs out of memory and is built again one micro-batch smaller. Skipped without a GPU."""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

GPUS = t.has_cuda_backend()
if not GPUS:
    print("SKIPPED: no GPU, or the program has no CUDA backend")
    sys.exit(77)
t.ENV.setdefault("NCCL_NVLS_ENABLE", "0")
COMMON = ["train", "--model", "llama-3.2-1b", "--seq", "1024", "--log-every", "100"]


def train(n, args, tag, env=None):
    d = t.tmpdir("gpu-mbs-auto-%s" % tag)
    path = os.path.join(d, "m.jsonl")
    saved = dict(t.ENV)
    t.ENV.update(env or {})
    began = time.monotonic()
    try:
        rc, out, err = t.run(n, COMMON + args + ["--metrics", path], timeout=900, check=False, device="cuda")
        # Each run sets up most of a GPU; the times show where a slow pass spends them.
        print("(%s on %d GPU(s): exit %d in %.0f s)" % (tag, n, rc, time.monotonic() - began), flush=True)
    finally:
        t.ENV.clear()
        t.ENV.update(saved)
    _, summary = t.metrics(path) if rc == 0 and os.path.exists(path) else ([], None)
    return rc, out, err, summary


for n in (1, 2) if GPUS >= 2 else (1,):
    rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--seq", "1024", "--gpus", str(n), "--mbs", "auto",
                             "--json"], check=False)
    planned = json.loads(out)["mbs"] if rc == 0 else None
    rc, out, err, s = train(n, ["--mbs", "auto", "--steps", "2"], "auto-%d" % n)
    t.check(rc == 0 and s is not None, "%d GPU(s): --mbs auto trains (%s)" % (n, err.strip().splitlines()[-1:] if rc else "ok"))
    if not s:
        continue
    chosen = s["mbs"]
    t.check(chosen == planned and s["step_downs"] == 0, "%d GPU(s): it chose %d, as fsdp plan did (%s)" % (n, chosen, planned))
    t.check(s["max_reserved_bytes"] == s["plan_reserved_bytes"],
            "%d GPU(s): max_reserved %.3f GiB, the plan %.3f GiB" % (n, s["max_reserved_bytes"] / 2 ** 30,
                                                                     s["plan_reserved_bytes"] / 2 ** 30))
    print("%d GPU(s): GPU memory outside fsdp.c %.2f GiB, the plan's estimate %.2f GiB" % (n, s["outside_gib"],
                                                                                          s["plan_outside_gib"]))
    rc, out, err, s2 = train(n, ["--mbs", str(chosen + 1), "--steps", "1"], "next-%d" % n)
    ours = [l for l in err.splitlines() if l.startswith("fsdp:")]
    t.check(rc != 0 and len(ours) == 1 and "out of GPU memory" in ours[0]
            and not re.search(r"cudaMalloc|CUDA error|cudaError", err),
            "%d GPU(s): --mbs %d runs out of memory in one line: %r" % (n, chosen + 1, ours[0] if ours else err[-300:]))

# Step down: the allocator of rank 0 gets 2 GiB less than the 40 GiB the plan fits into.
rc, out, err, s = train(1, ["--mbs", "auto", "--memory-limit", "40", "--steps", "1"], "limit")
if s:
    rc, out, err, s2 = train(1, ["--mbs", "auto", "--memory-limit", "40", "--steps", "1"], "step-down",
                             env={"FSDP_TEST_MEMORY_LIMIT": "0:38"})
    t.check(rc == 0 and s2 and s2["step_downs"] >= 1 and s2["mbs"] < s["mbs"] and "building it again with" in out,
            "a GPU smaller than planned: the set-up ran out of memory and was built again with %s (from %d)" %
            (s2["mbs"] if s2 else None, s["mbs"]))
else:
    t.fail("--mbs auto --memory-limit 40 failed: %s" % err[-300:])
t.finish()
