"""Shared by tests/scripts/rank_failure.py (CPU, 3 ranks) and gpu_rank_failure.py (2 GPUs): one rank
fails in the middle of a long run (FSDP_TEST_FAIL, see src/base/fault.h) and the others must stop
within seconds, with a non-zero exit and a message naming what happened, instead of hanging."""
import os
import re
import signal
import subprocess
import time

import fsdptest as t

SYNC_TIMEOUT = 3  # seconds a survivor waits without progress (FSDP_SYNC_TIMEOUT)
GRACE = 15        # seconds allowed beyond that for aborting every rank


def launch(nprocs, device, env_extra, limit=180):
    """Runs a long training job; returns (exit status, seconds from the injected failure to the exit, output)."""
    cmd = [t.MPIRUN, "-np", str(nprocs), t.BIN, "train", "--model", "tiny-llama", "--seq", "64", "--mbs", "2",
           "--steps", "1000000", "--log-every", "1", "--device", device]
    env = dict(t.ENV, **env_extra)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    lines, injected_at, start = [], None, time.time()
    try:
        for line in p.stdout:
            lines.append(line)
            if "FSDP_TEST_FAIL: injecting" in line and injected_at is None:
                injected_at = time.time()
            if time.time() - start > limit:
                break
        p.wait(timeout=max(1, limit - (time.time() - start)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if p.poll() is None:  # it hung: that is the failure under test; clean up the whole job
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None, None, "".join(lines)
    elapsed = time.time() - injected_at if injected_at else None
    return p.returncode, elapsed, "".join(lines)


def check_mode(nprocs, device, mode, failing_rank, expect):
    env = {"FSDP_TEST_FAIL": "%d:3:%s" % (failing_rank, mode), "FSDP_SYNC_TIMEOUT": str(SYNC_TIMEOUT)}
    rc, elapsed, out = launch(nprocs, device, env)
    what = "%s, %d ranks, rank %d fails with '%s' at step 3" % (device, nprocs, failing_rank, mode)
    if rc is None:
        t.fail("%s: the job did not stop (killed by the test)\n%s" % (what, out[-3000:]))
        return
    bound = GRACE + (SYNC_TIMEOUT if mode == "hang" else 0)
    t.check(rc != 0, "%s: non-zero exit (%d)" % (what, rc))
    t.check(elapsed is not None and elapsed <= bound,
            "%s: every rank stopped %s s after the failure (limit %d s)" %
            (what, "%.1f" % elapsed if elapsed is not None else "?", bound))
    t.check(re.search(r"step +2/", out) and not re.search(r"step +3/", out), "%s: steps 1-2 completed, step 3 did not" % what)
    for text in expect:
        t.check(text in out, "%s: the output says %r" % (what, text))
    if rc and (elapsed is None or elapsed > bound or any(text not in out for text in expect)):
        print(out[-3000:])


def run_all(nprocs, device):
    last = nprocs - 1
    # A fatal error on one rank (a failed library call) aborts every rank at once.
    check_mode(nprocs, device, "exit", 1, ["fsdp: rank 1: injected failure at step 3"])
    # A rank killed by a signal: the launcher stops the others and names the rank.
    check_mode(nprocs, device, "kill", last, ["rank %d" % last, "signal 9"])
    # A rank that stops making progress: a survivor's wait times out and names what it waited for.
    check_mode(nprocs, device, "hang", 1, ["no progress for", "FSDP_SYNC_TIMEOUT"])
    # Malformed settings are errors naming the variable, not silent defaults.
    rc, _, out = launch(nprocs, device, {"FSDP_TEST_FAIL": "1:three:exit"}, limit=120)
    t.check(rc not in (None, 0) and "FSDP_TEST_FAIL=1:three:exit" in out,
            "%s: a malformed FSDP_TEST_FAIL is an error naming it" % device)
    rc, _, out = launch(nprocs, device, {"FSDP_SYNC_TIMEOUT": "soon"}, limit=120)
    t.check(rc not in (None, 0) and "FSDP_SYNC_TIMEOUT=soon" in out,
            "%s: a malformed FSDP_SYNC_TIMEOUT is an error naming it" % device)
