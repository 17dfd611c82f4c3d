"""kill -9 of a rank at any moment of a save, including while the bytes are written in the
background beside training: 'latest' always names a complete checkpoint that verifies, and
--resume auto continues from it bit for bit like a run that was never interrupted. The moments are
injected with FSDP_TEST_FAIL (src/base/fault.h); one kill comes from outside while a write stalls."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t

STEPS = 8
ref = t.tmpdir("ckpt-kill-ref")
t.run(2, c.train(ref, STEPS, ["--ckpt-every", "2"]))
ref_steps = t.metrics(os.path.join(ref, "m.jsonl"))[0]
ref_final = os.path.join(ref, "ck", "step-%08d.h5" % STEPS)


def survives(tag, d, latest_step, extra_files=()):
    """After the kill: latest names step `latest_step`, every step file verifies, and resuming
    continues exactly like the reference run."""
    ck = os.path.join(d, "ck")
    t.check(c.latest(ck) == "step-%08d.h5" % latest_step, "%s: latest names step %d (%s)" % (tag, latest_step, os.listdir(ck)))
    rc, out, err = t.run(1, ["verify", ck], check=False)
    t.check(rc == 0 and out.count(": ok: ") == len(c.step_files(ck)), "%s: every step file and latest verify" % tag)
    for n in extra_files:
        t.check(n in c.step_files(ck), "%s: %s is there too" % (tag, n))
    rc, out, err = t.run(2, c.train(d, STEPS, ["--ckpt-every", "2", "--resume", "auto"], metrics="resumed.jsonl"),
                         check=False)
    steps = t.metrics(os.path.join(d, "resumed.jsonl"))[0] if rc == 0 else []
    t.check(rc == 0 and [r["step"] for r in steps] == list(range(latest_step + 1, STEPS + 1)) and
            [r["loss"] for r in steps] == [r["loss"] for r in ref_steps[latest_step:]],
            "%s: --resume auto continues from step %d with the reference's losses" % (tag, latest_step))
    if rc == 0:
        t.compare_checkpoints(os.path.join(ck, "step-%08d.h5" % STEPS), ref_final, 0, tag + ": final checkpoint",
                              exact=True)


for spec, tag, latest_step, extra in (("0:4:ckpt-kill@create", "rank 0 killed as it makes the file", 2, ()),
                                      ("1:4:ckpt-kill@write", "rank 1 killed halfway through its bytes", 2, ()),
                                      ("0:4:ckpt-kill@commit", "rank 0 killed before the rename", 2, ()),
                                      ("0:4:ckpt-kill@latest", "rank 0 killed between the rename and 'latest'", 2,
                                       ("step-00000004.h5",))):
    d = t.tmpdir("ckpt-kill")
    job = c.Job(2, c.train(d, STEPS, ["--ckpt-every", "2"]), {"FSDP_TEST_FAIL": spec})
    rc = job.wait()
    t.check(rc not in (0, None) and "injecting" in job.output(), "%s: the job died" % tag)
    survives(tag, d, latest_step, extra)

# From outside: rank 1's writes of step 4 stall (a slow disk), training goes on beside them, and
# rank 0 is killed while the write is still in flight.
d = t.tmpdir("ckpt-kill")
job = c.Job(2, c.train(d, 1000000, ["--ckpt-every", "2"]), {"FSDP_TEST_FAIL": "1:4:ckpt-hang", "FSDP_SYNC_TIMEOUT": "600"})
in_flight = job.wait_for(r"step +5/")  # step 6 waits for the write before it saves again
pids = job.rank_pids()
if pids:
    os.kill(pids[0], 9)
rc = job.wait(timeout=60)
t.check(in_flight and rc not in (0, None), "training went on beside the stalled write; killing a rank ended the job")
ck = os.path.join(d, "ck")
t.check(c.latest(ck) == "step-00000002.h5", "latest names step 2, the last complete save (%s)" % os.listdir(ck))
rc, out, err = t.run(1, ["verify", ck], check=False)
t.check(rc == 0 and "step-00000004.h5.tmp: the temporary file of a save that never finished" in out,
        "every step file verifies; fsdp verify lists the unfinished save")
t.finish()
