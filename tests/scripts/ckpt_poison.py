"""A run never saves poison: flags that make every step non-finite are refused up front; a step whose
gradients or loss are not finite is skipped (weights and Adam state untouched, counted in the
metrics as skipped_steps); too many in a row stop the run naming the likely cause, after the save in
flight completes; a checkpoint is never written from non-finite weights, and --keep never deletes
the last good one. Failures are injected with FSDP_TEST_FAIL (src/base/fault.h)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t
import h5py
import numpy as np

# Refused before anything runs.
for flags, needle in ((["--beta1", "1"], "--beta1 1"), (["--beta2", "1"], "--beta2 1"),
                      (["--adam-eps", "0"], "--adam-eps 0")):
    d = t.tmpdir("ckpt-poison-flags")
    rc, out, err = t.run(2, c.train(d, 3, flags), check=False)
    t.check(rc == 2 and "step 1/" not in out, "%s refused with exit 2" % needle)
    c.one_error(err, [needle, "NaN"], needle)


def all_finite(path):
    with h5py.File(path, "r") as f:
        bad = []
        f.visititems(lambda n, o: bad.append(n) if isinstance(o, h5py.Dataset) and not np.isfinite(o[()]).all() else None)
    return not bad


# Non-finite gradients on one rank at step 3: skipped on every rank, nothing changed, run goes on.
d = t.tmpdir("ckpt-poison-nan")
rc, out, err = t.run(2, c.train(d, 5, ["--ckpt-every", "1"]), check=False)
ref = t.metrics(os.path.join(d, "m.jsonl"))[0]
d = t.tmpdir("ckpt-poison-nan")
job = c.Job(2, c.train(d, 5, ["--ckpt-every", "1"]), {"FSDP_TEST_FAIL": "1:3:nan"})
rc = job.wait()
steps, summary = t.metrics(os.path.join(d, "m.jsonl"))
ck = os.path.join(d, "ck")
t.check(rc == 0 and "step 3 skipped: the gradient norm is not finite" in job.output(),
        "a NaN gradient at step 3: the step is skipped, the run goes on (%s)" % job.output()[-300:])
t.check([r["skipped_steps"] for r in steps] == [0, 0, 1, 1, 1] and steps[2]["grad_norm"] is None and
        summary["skipped_steps"] == 1, "metrics: skipped_steps counts it, its grad_norm is null")
t.compare_checkpoints(os.path.join(ck, "step-00000003.h5"), os.path.join(ck, "step-00000002.h5"), 0,
                      "the skipped step changed no weight and no Adam moment", exact=True)
t.check([r["loss"] for r in steps[:2]] == [r["loss"] for r in ref[:2]] and steps[3]["loss"] != ref[3]["loss"],
        "steps before it as in a clean run; after it the run continues from the unchanged state")
t.check(all(all_finite(os.path.join(ck, n)) for n in c.step_files(ck)), "every checkpoint written is finite")

# A non-finite loss from step 3 on: 3 skipped in a row stop the run (--max-skipped 2) with the
# likely causes; the save in flight completes; --keep 1 keeps the newest good checkpoint.
d = t.tmpdir("ckpt-poison-diverged")
job = c.Job(2, c.train(d, 20, ["--ckpt-every", "1", "--keep", "1", "--max-skipped", "2"]),
            {"FSDP_TEST_FAIL": "0:3-100:nanloss"})
rc = job.wait()
ck = os.path.join(d, "ck")
t.check(rc == 1, "3 non-finite steps in a row: exit 1")
c.one_error(job.output(), ["3 consecutive steps (3-5) had a non-finite loss", "--lr", "--warmup"],
            "the stop names the steps and the likely causes")
t.check(c.step_files(ck) == ["step-00000004.h5"] and c.latest(ck) == "step-00000004.h5" and not c.temporaries(ck),
        "latest names step 4, saved in flight when the run stopped; nothing else left (%s)" % os.listdir(ck))
rc, out, err = t.run(1, ["verify", ck], check=False)
t.check(rc == 0 and all_finite(os.path.join(ck, "step-00000004.h5")), "it verifies and is finite")

# A weight becomes NaN after step 3 (a poisoned state): its checkpoint is refused, the run stops,
# the previous checkpoint stays the latest and --keep 1 does not delete it.
d = t.tmpdir("ckpt-poison-weights")
job = c.Job(2, c.train(d, 20, ["--ckpt-every", "1", "--keep", "1"]), {"FSDP_TEST_FAIL": "1:3:poison"})
rc = job.wait()
ck = os.path.join(d, "ck")
t.check(rc == 1, "a poisoned weight: exit 1")
c.one_error(job.output(), ["step-00000003.h5", "holds non-finite values", "rank 1"], "the refused checkpoint")
t.check(c.step_files(ck) == ["step-00000002.h5"] and c.latest(ck) == "step-00000002.h5" and not c.temporaries(ck),
        "latest still names step 2, which --keep 1 kept (%s)" % os.listdir(ck))
t.check(all_finite(os.path.join(ck, "step-00000002.h5")), "step 2 is finite")
t.finish()
