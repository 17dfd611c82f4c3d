"""SIGTERM, SIGINT or SIGUSR1 on any rank, or on mpirun, stop a run at the next step boundary with a
checkpoint, one line and exit status 75; --resume auto then continues bit for bit like a run that was
never stopped. A second signal stops at once. (SLURM's requeue of jobs/train.slurm rests on this.)"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t

STEPS = 600
ref = t.tmpdir("preempt-ref")
t.run(2, c.train(ref, STEPS))
ref_steps = t.metrics(os.path.join(ref, "m.jsonl"))[0]
ref_final = os.path.join(ref, "ck", "step-%08d.h5" % STEPS)


def stopped(tag, send, env=None, expect_rc=75, resume=True):
    d = t.tmpdir("preempt")
    ck = os.path.join(d, "ck")
    job = c.Job(2, c.train(d, STEPS), env)
    if not job.wait_for(r"step +20/"):
        t.fail("%s: the run did not reach step 20\n%s" % (tag, job.output()[-1500:]))
        job.kill()
        return
    send(job)
    rc = job.wait(timeout=120)
    out = job.output()
    m = re.search(r"stopped by (SIG\w+) at step (\d+): checkpoint (\S+) written; continue with --resume auto", out)
    step = int(m.group(2)) if m else -1
    t.check(rc == expect_rc and m and 20 <= step < STEPS and m.group(3) == os.path.join(ck, "step-%08d.h5" % step),
            "%s: exit %s, one line naming the signal, the step and the checkpoint (%s)" %
            (tag, rc, m.group(0) if m else out[-600:]))
    if not m:
        return
    t.check(c.latest(ck) == "step-%08d.h5" % step and not c.temporaries(ck), "%s: latest names it" % tag)
    if not resume:
        return
    rc, out, err = t.run(2, c.train(d, STEPS, ["--resume", "auto"]), check=False)
    steps = t.metrics(os.path.join(d, "m.jsonl"))[0]
    t.check(rc == 0 and [r["step"] for r in steps] == list(range(1, STEPS + 1)) and
            [r["loss"] for r in steps] == [r["loss"] for r in ref_steps] and
            [r["grad_norm"] for r in steps] == [r["grad_norm"] for r in ref_steps],
            "%s: --resume auto continues; all %d losses and gradient norms as in the uninterrupted run" % (tag, STEPS))
    t.compare_checkpoints(os.path.join(ck, "step-%08d.h5" % STEPS), ref_final, 0, tag + ": final checkpoint", exact=True)


def to_rank(index, sig):
    def send(job):
        os.kill(job.rank_pids()[index], sig)
    return send


def to_mpirun(sig):
    return lambda job: os.kill(job.p.pid, sig)


stopped("SIGTERM to rank 1", to_rank(1, signal.SIGTERM))
stopped("SIGUSR1 to mpirun (forwarded to the ranks)", to_mpirun(signal.SIGUSR1))
stopped("SIGINT to rank 0", to_rank(0, signal.SIGINT), resume=False)
# (mpirun answers SIGTERM and SIGINT itself by killing the job, and stops relaying the ranks' output:
# README.md says to send it SIGUSR1, or to signal the ranks; srun forwards SIGTERM to them.)

# A second signal stops at once, without waiting for the checkpoint (whose writes stall here).
d = t.tmpdir("preempt-twice")
job = c.Job(2, c.train(d, 100000), {"FSDP_TEST_FAIL": "1:1-100000:ckpt-hang"})
if job.wait_for(r"step +20/"):
    pid = job.rank_pids()[0]
    os.kill(pid, signal.SIGTERM)
    job.wait_for(r"injecting 'ckpt-hang@write'", 30)
    os.kill(pid, signal.SIGTERM)
rc = job.wait(timeout=60)
t.check(rc not in (0, 75, None) and "rank 0: second signal (SIGTERM): stopping at once" in job.output() and
        "stopped by" not in job.output(), "a second signal stops the rank at once (exit %s)" % rc)
t.check(not c.step_files(os.path.join(d, "ck")), "and writes no checkpoint")
t.finish()
