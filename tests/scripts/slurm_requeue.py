"""jobs/train.slurm preempted and requeued on a real SLURM: a one-node cluster from Debian's packages
(tests/lib/slurm_cluster.py) runs the job script in CPU mode (2 ranks, fp32) three times at once:

  - an uninterrupted job, the reference;
  - a job signalled mid-run as SLURM signals it before a preemption (scancel --signal=USR1 --batch);
  - a job with a one-minute time limit and --signal=B:USR1@50, so that SLURM itself sends SIGUSR1
    to the batch script before the limit (slurmctld looks at time limits every 30 s from its start,
    and the job is submitted 20 s after it started: the signal comes some 10 s into the job); once
    it is requeued, its limit is raised to 30 minutes, as a user would resubmit a job that needs
    more time (on a slow machine every one-minute run would otherwise be signalled again);
and a shorter fourth job signalled before its run starts (while its FSDP_SETUP file, a stand-in for
`module load` lines, sleeps), which must not start the run but requeue itself, and then, in its
requeued run, sent SIGTERM (what a user's or a site's `scancel --signal=TERM --batch` sends), which
the script must pass on to srun as SIGUSR1 (srun cancels its step on SIGTERM).

The signalled jobs must forward the signal to the ranks, which stop at the end of a step with a
checkpoint, one line, and exit 75; the script then requeues the job (scontrol requeue, same job id,
same run folder, output appended), and the requeued job continues with --resume auto from that
checkpoint to the last step. Then: the run folder's metrics hold every step once, with losses and
gradient norms identical to the reference's, the final checkpoints are bitwise identical, and
`fsdp verify` passes the checkpoint directory. Skips (77) only where SLURM cannot run: not root."""
import glob
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ckpttest as c
import fsdptest as t
import slurm_test
from slurm_cluster import SlurmError

# Long enough that the time-limit job is still running when SLURM signals it some 10 s into the job
# on a fast machine (120 steps took 4 s on CI's, and its job ended unsignalled).
STEPS = 500
JOB = os.path.join(t.ROOT, "jobs", "train.slurm")
start = time.time()
work = t.tmpdir("slurm_requeue")
results = os.path.join(work, "results")
# fp32 on the CPU: a resumed run is bit for bit the uninterrupted one. A step takes 0.025-0.1 s alone,
# up to three times that with the three jobs sharing two cores: the signals land mid-run.
env = slurm_test.cpu_job_env(results, MODEL_PRECISION="fp32", MIXED_PRECISION="no", MICRO_BATCH_SIZE="8",
                              SEQUENCE_LEN="64", MAX_STEPS=str(STEPS))
# Two ranks on one node; the script asks for 4 GPUs, 20 CPUs per task (MareNostrum 5) and the node
# to itself: here the three jobs share the node's two CPUs.
shape = ["--ntasks-per-node", "2", "--gres", "gpu:2", "--cpus-per-task", "1", "--oversubscribe"]


def run_dir(job):
    return os.path.join(results, "NODES-1-CPUS-2-tiny-llama-fp32-no-flash-FULL-MBS-8-%s" % job)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# SLURM waits 120 s before it starts a requeued job again; 5 s here.
cluster = slurm_test.start_cluster(start, gpus=8, requeue_delay=5)

def at_step(job, step):
    return re.search(r"^step +%d/" % step, read(os.path.join(run_dir(job), "train.log")), re.M)


jobs, sent = {}, set()
setup = os.path.join(work, "setup.sh")
with open(setup, "w") as f:
    f.write('echo "${SLURM_RESTART_COUNT:-0}" >>"%s/setup-ran"; sleep 3\n' % work)
try:
    jobs["reference"] = cluster.sbatch(JOB, shape, env=env, cwd=work)
    jobs["scancel"] = cluster.sbatch(JOB, shape, env=env, cwd=work)
    jobs["setup, then SIGTERM"] = cluster.sbatch(JOB, shape, env=dict(env, MAX_STEPS="40", FSDP_SETUP=setup), cwd=work)
    deadline, looked = time.time() + 900, 0.0
    while time.time() < deadline:
        if "setup" not in sent and os.path.exists(os.path.join(work, "setup-ran")):
            cluster.signal(jobs["setup, then SIGTERM"], "USR1", batch=True)  # while FSDP_SETUP sleeps
            sent.add("setup")
        if "scancel" not in sent and at_step(jobs["scancel"], 20):
            cluster.signal(jobs["scancel"], "USR1", batch=True)
            sent.add("scancel")
        if "TERM" not in sent and at_step(jobs["setup, then SIGTERM"], 5):  # its requeued run
            cluster.signal(jobs["setup, then SIGTERM"], "TERM", batch=True)
            sent.add("TERM")
        # slurmctld's second look at time limits comes 30 s after it started: 10 s into this job,
        # which asks for the signal 50 s before its one-minute limit (SLURM sends it at the first
        # look that finds the job within 50 + 30 s of its end).
        if "time limit" not in jobs and time.time() >= cluster.controller_started + 20:
            jobs["time limit"] = cluster.sbatch(JOB, shape + ["--time", "1", "--signal=B:USR1@50"], env=env, cwd=work)
        if "time limit" in jobs and "raised" not in sent and \
                "requeueing job %s" % jobs["time limit"] in read(os.path.join(work, "R-fsdp.%s.out" % jobs["time limit"])):
            cluster.update(jobs["time limit"], TimeLimit=30)
            sent.add("raised")
        if len(jobs) == 4 and time.time() > looked + 1:  # (scontrol costs CPU the jobs need)
            looked = time.time()
            if all(cluster.state(j) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for j in jobs.values()):
                break
        time.sleep(0.1)
    states = {k: cluster.state(j) for k, j in jobs.items()}
    t.check(sent == {"setup", "scancel", "TERM", "raised"} and all(s == "COMPLETED" for s in states.values()),
            "every job completed (%s; signals sent: %s) in %.0f s" % (states, sorted(sent), time.time() - start))
    fields = {k: cluster.job(j) for k, j in jobs.items()}
except SlurmError as e:
    t.fail(str(e))
    fields = {}
finally:
    cluster.stop()
t.check(not cluster.processes(), "the cluster's daemons and job processes are all gone")
if len(fields) < 4:
    for name in sorted(os.listdir(work)):
        if name.startswith("R-"):
            print("---- %s\n%s" % (name, read(os.path.join(work, name))[-3000:]))
    t.finish()

# ---- the uninterrupted job ----
ref = run_dir(jobs["reference"])
ref_steps = t.metrics(os.path.join(ref, "metrics.jsonl"))[0]
ref_final = os.path.join(ref, "ckpt", "step-%08d.h5" % STEPS)
t.check(fields["reference"].get("Restarts") == "0" and [r["step"] for r in ref_steps] == list(range(1, STEPS + 1)) and
        os.path.exists(ref_final), "the reference ran to step %d in one go, checkpointed at the end" % STEPS)

# ---- the preempted jobs ----
for kind in ("scancel", "time limit"):
    job = jobs[kind]
    d = run_dir(job)
    ck = os.path.join(d, "ckpt")
    out = read(os.path.join(work, "R-fsdp.%s.out" % job))
    f = fields[kind]
    restarts = int(f.get("Restarts", "0"))
    t.check(restarts == 1 and f.get("ExitCode") == "0:0",
            "%s: requeued %d time(s), then exited 0 (%s)" % (kind, restarts, f.get("ExitCode")))
    t.check(sorted(glob.glob(os.path.join(results, "*-%s" % job))) == [d] and os.path.exists(os.path.join(d, "done")),
            "%s: every run of job %s went to one folder, named from the job id (%s)" %
            (kind, job, os.path.basename(d)))
    stops = re.findall(r"stopped by SIGUSR1 at step (\d+): checkpoint (\S+) written; continue with --resume auto", out)
    requeues = re.findall(r"fsdp\.c: exit status 75 \(stopped by a signal\): requeueing job (\d+) to continue with "
                          r"--resume auto", out)
    resumes = re.findall(r"resumed from (\S+) at step (\d+)", out)
    t.check(len(stops) == restarts and len(requeues) == restarts and all(j == job for j in requeues) and
            out.count("fsdp.c: SIGUSR1: asking the ranks to checkpoint and stop") == restarts,
            "%s: the job's output (appended over its %d runs): the signal forwarded, the ranks' stop line, "
            "exit 75 and the requeue, each %d time(s)" % (kind, restarts + 1, restarts))
    if not stops:
        print(out[-3000:])
        continue
    step = int(stops[0][0])
    t.check(0 < step < STEPS and stops[0][1] == os.path.join(ck, "step-%08d.h5" % step),
            "%s: stopped mid-run at step %d with %s" % (kind, step, os.path.relpath(stops[0][1], work)))
    t.check([(p, int(s)) for p, s in resumes] == [(p, int(s)) for s, p in stops],
            "%s: each requeued run resumed from the checkpoint the previous one wrote (%s)" %
            (kind, ", ".join("step %s" % s for _, s in resumes)))
    log = read(os.path.join(d, "train.log"))
    t.check("resume: no checkpoint in %s yet, starting from step 0" % ck in log and
            log.count("stopped by SIGUSR1") == restarts and
            "resumed from %s" % stops[0][1] in log and "step %3d/%d" % (STEPS, STEPS) in log,
            "%s: the run folder's train.log holds every run, the first from its start" % kind)

    steps = t.metrics(os.path.join(d, "metrics.jsonl"))[0]
    t.check([r["step"] for r in steps] == list(range(1, STEPS + 1)), "%s: the metrics hold each of the %d steps once" %
            (kind, STEPS))
    t.check([(r["loss"], r["grad_norm"]) for r in steps] == [(r["loss"], r["grad_norm"]) for r in ref_steps],
            "%s: all %d losses and gradient norms identical to the uninterrupted run's" % (kind, STEPS))
    final = os.path.join(ck, "step-%08d.h5" % STEPS)
    t.compare_checkpoints(final, ref_final, 0, "%s: final checkpoint against the reference's" % kind, exact=True)
    # The comparison can fail: the checkpoint of the stop is another state.
    a, b = t.checkpoint_arrays(os.path.join(ck, "step-%08d.h5" % step)), t.checkpoint_arrays(ref_final)
    t.check(any((a[k] != b[k]).any() for k in a), "%s: (the step-%d checkpoint differs from it)" % (kind, step))
    p = subprocess.run([t.BIN, "verify", ck], env=t.ENV, capture_output=True, text=True, timeout=120)
    t.check(p.returncode == 0 and "ckpt/latest: step-%08d.h5" % STEPS in p.stdout,
            "%s: fsdp verify %s exits 0 (%s)" % (kind, os.path.relpath(ck, work), p.stdout.strip().splitlines()[-1:]))
    t.check(c.latest(ck) == "step-%08d.h5" % STEPS and not c.temporaries(ck), "%s: latest names step %d" % (kind, STEPS))

# ---- signalled before its run started, then SIGTERM mid-run ----
job = jobs["setup, then SIGTERM"]
d = run_dir(job)
ck = os.path.join(d, "ckpt")
out = read(os.path.join(work, "R-fsdp.%s.out" % job))
t.check(fields["setup, then SIGTERM"].get("Restarts") == "2" and read(os.path.join(work, "setup-ran")).split() == ["0", "1", "2"],
        "a job signalled during FSDP_SETUP, then with SIGTERM mid-run: requeued twice")
t.check("fsdp.c: SIGUSR1 before the run started: not starting it" in out and
        "%s: not started: SIGUSR1 came first" % d in out and
        out.count("resume: no checkpoint in %s yet, starting from step 0" % ck) == 1,
        "a signal during FSDP_SETUP: the run is not started (%s)" % [l for l in out.splitlines() if l.startswith("fsdp.c:")])
stops = re.findall(r"stopped by SIGUSR1 at step (\d+): checkpoint (\S+) written", out)
t.check("fsdp.c: SIGTERM: asking the ranks to checkpoint and stop (SIGUSR1 to the launcher)" in out and
        len(stops) == 1 and out.count("fsdp.c: exit status 75 (stopped by a signal): requeueing job %s" % job) == 2 and
        "resumed from %s at step %s" % (stops[0][1], stops[0][0]) in out,
        "SIGTERM to the job script: passed to srun as SIGUSR1 (srun cancels its step on SIGTERM), the ranks stop "
        "with a checkpoint, the job is requeued and resumes from it (%s)" % stops)
steps = t.metrics(os.path.join(d, "metrics.jsonl"))[0] if os.path.exists(os.path.join(d, "metrics.jsonl")) else []
p = subprocess.run([t.BIN, "verify", ck], env=t.ENV, capture_output=True, text=True, timeout=120)
t.check([r["step"] for r in steps] == list(range(1, 41)) and os.path.exists(os.path.join(d, "done")) and
        p.returncode == 0, "and its run ends at step 40, every step once, fsdp verify passing its checkpoints")

print("ran in %.0f s" % (time.time() - start))
t.finish()
