"""An I/O failure during a save is an ordinary error: out of space on one rank or on all of them, an
I/O error while the file is finished, a rank whose writes stall, a rank stalled while the file is
made: every rank stops within seconds (FSDP_SYNC_TIMEOUT bounds every wait) with one line naming the
rank, the file and the cause, no crash, the previous checkpoint and 'latest' intact and verified, no
temporary file left. Failures are injected with FSDP_TEST_FAIL (src/base/fault.h)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t

SYNC_TIMEOUT = 3
GRACE = 20  # seconds allowed beyond the timeout for every rank to stop


def failing_save(tag, spec, needles, stall=False, nprocs=3):
    d = t.tmpdir("ckpt-io-" + tag)
    ck = os.path.join(d, "ck")
    job = c.Job(nprocs, c.train(d, 1000000, ["--ckpt-every", "2"]),
                {"FSDP_TEST_FAIL": spec, "FSDP_SYNC_TIMEOUT": str(SYNC_TIMEOUT)})
    rc = job.wait(timeout=150)
    out = job.output()
    what = "%s (%s)" % (tag, spec)
    if rc is None:
        t.fail("%s: the job did not stop (killed by the test)\n%s" % (what, out[-2000:]))
        return
    import time
    elapsed = time.time() - job.marks.get("injected", time.time())
    bound = GRACE + (SYNC_TIMEOUT if stall else 0)
    t.check(rc != 0 and elapsed <= bound, "%s: every rank stopped %.1f s after the failure, exit %d (limit %d s)" %
            (what, elapsed, rc, bound))
    t.check(not any(w in out for w in ("Segmentation", "core dumped", "double free", "signal 11")),
            "%s: no crash" % what)
    if stall:
        t.check(all(n in out for n in needles), "%s: the output says %s" % (what, needles))
    else:
        c.one_error(out, needles, what)
        t.check(not c.temporaries(ck), "%s: no temporary file left (%s)" % (what, os.listdir(ck)))
    t.check(c.latest(ck) == "step-00000002.h5" and "step-00000004.h5" not in c.step_files(ck),
            "%s: 'latest' still names step 2, the failed save left no step file (%s)" % (what, os.listdir(ck)))
    rc, vout, verr = t.run(1, ["verify", os.path.join(ck, "step-00000002.h5")], check=False)
    t.check(rc == 0, "%s: the previous checkpoint verifies" % what)


# Out of space on one rank, then on every rank, halfway through writing the bytes.
failing_save("enospc-one", "1:4:ckpt-enospc", ["rank 1", "step-00000004.h5.tmp", "No space left on device"])
failing_save("enospc-all", "all:4:ckpt-enospc", ["step-00000004.h5.tmp", "No space left on device"])
# Out of space when the file's storage is reserved (before training goes on).
failing_save("enospc-create", "0:4:ckpt-enospc@create", ["cannot reserve", "step-00000004.h5.tmp", "rank 0",
                                                           "No space left on device"])
# An I/O error while the finished file is given its checksums and name.
failing_save("eio-commit", "0:4:ckpt-eio@commit", ["step-00000004.h5.tmp", "rank 0", "Input/output error"])
# A rank whose writes stall: its own watchdog stops the job.
failing_save("stalled-writes", "2:4:ckpt-hang", ["no progress for", "step-00000004.h5", "FSDP_SYNC_TIMEOUT"],
             stall=True)
# Rank 0 stalled while it makes the file: the others' waits give up.
failing_save("stalled-rank", "0:4:ckpt-hang@create", ["no progress for", "a peer rank has probably failed or stalled"],
             stall=True)
t.finish()
