"""The job scripts on a real SLURM: a one-node cluster from Debian's packages (tests/lib/slurm_cluster.py)
runs jobs/ladder.slurm and jobs/strategies.slurm through sbatch, as a user submits them, in CPU mode
at tiny sizes, and jobs/scaling.sh submits its points and its report job with a dependency. Then
`fsdp report` over the results gives the course's tables, whose numbers are checked against the runs'
metrics, and valid plots. A run whose ranks srun cannot launch (srun then exits 0) counts as failed.
Skips (77) only where SLURM cannot run: not root.

The ladder's last rung runs `--mbs auto`, as a user's does: in CPU mode jobs/common.sh caps each
rank's memory (MEMORY_LIMIT, 32 MiB), and the micro-batch it trains with (the metrics summary's, so
the report's) is the largest that `fsdp plan` fits there."""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import report_check as rc
import slurm_test
from slurm_cluster import SlurmError

JOBS = os.path.join(t.ROOT, "jobs")
start = time.time()
work = t.tmpdir("slurm_sweeps")
results = os.path.join(work, "results")
# What a user sets for a test on CPUs: the rest are the scripts' defaults.
env = slurm_test.cpu_job_env(results, MICRO_BATCH_SIZE="2", MAX_STEPS="3", SEQUENCE_LEN="32")
# The scripts ask for 20 CPUs per GPU (MareNostrum 5); this node has a few.
cpus = ["--cpus-per-task", "1"]

cluster = slurm_test.start_cluster(start, gpus=2)

try:
    ladder = cluster.sbatch(os.path.join(JOBS, "ladder.slurm"), cpus, env=env, cwd=work)
    strategies = cluster.sbatch(os.path.join(JOBS, "strategies.slurm"),
                                ["--nodes", "1", "--ntasks-per-node", "2", "--gres", "gpu:2"] + cpus, env=env, cwd=work)
    p = subprocess.run(["bash", os.path.join(JOBS, "scaling.sh")], cwd=work, capture_output=True, text=True,
                       timeout=120, env=dict(cluster.env, GPUS="1 2", GPUS_PER_NODE="2", SBATCH_ARGS=" ".join(cpus),
                                             **env))
    t.check(p.returncode == 0 and p.stdout.strip().splitlines()[-1].startswith("jobs: "),
            "scaling.sh submits its points (exit %d) %s" % (p.returncode, p.stderr[-500:]))
    scaling = p.stdout.strip().splitlines()[-1].split()[1:]
    t.check(len(scaling) == 3, "scaling.sh: a job for 1 GPU, one for 2, and the report job (%s)" % scaling)
    report_job = scaling[-1]
    dependency = cluster.job(report_job).get("Dependency", "")
    t.check(all("afterany:%s" % j in dependency or cluster.state(j) == "COMPLETED" for j in scaling[:-1]),
            "the report job depends on both points (%s)" % dependency)

    states = cluster.wait([ladder, strategies] + scaling, timeout=240)
    t.check(all(s == "COMPLETED" for s in states.values()), "every job completed %s (%.0f s)" %
            (states, time.time() - start))
    # SLURM's times have whole seconds, in ISO form: they compare as text.
    started = cluster.job(report_job).get("StartTime", "")
    ended = max(cluster.job(j).get("EndTime", "~") for j in scaling[:-1])
    t.check(started >= ended, "the report job started when both points had ended (%s >= %s)" % (started, ended))
    for job, name in ((ladder, "ladder"), (strategies, "strategies")):
        t.check(cluster.job(job).get("ExitCode") == "0:0", "%s.slurm exited 0" % name)

    # Submitted again, a sweep skips the runs it finished.
    metrics = os.path.join(results, "strategies-tiny-llama-2cpu", "FULL-fp32-bf16-flash-mbs2", "metrics.jsonl")
    before = os.stat(metrics).st_mtime_ns
    again = cluster.sbatch(os.path.join(JOBS, "strategies.slurm"),
                           ["--nodes", "1", "--ntasks-per-node", "2", "--gres", "gpu:2"] + cpus, env=env, cwd=work)
    t.check(cluster.wait(again, timeout=60) == "COMPLETED", "strategies.slurm submitted again completes")
    with open(os.path.join(work, "R-fsdp-strategies.%s.out" % again)) as f:
        log = f.read()
    t.check(log.count("finished by an earlier job, skipped") == 4 and os.stat(metrics).st_mtime_ns == before,
            "it skips the four finished strategies and leaves their metrics alone")

    # srun exits 0 when it cannot launch the ranks at all: such a run is a failure all the same. The
    # launch is made to fail by a file where the pmix plugin makes the step's directory (in TmpFS,
    # named spmix_appdir_UID_JOB.STEP).
    broken = cluster.sbatch(os.path.join(JOBS, "strategies.slurm"),
                            ["--nodes", "1", "--ntasks-per-node", "2", "--gres", "gpu:2", "--hold"] + cpus,
                            env=dict(env, STRATEGIES="FULL", RESULTS_DIR=os.path.join(work, "broken")), cwd=work)
    open(os.path.join(cluster.dir, "tmp", "spmix_appdir_%d_%s.0" % (os.getuid(), broken)), "w").close()
    subprocess.run(["scontrol", "release", broken], env=cluster.env, check=True, capture_output=True, timeout=30)
    state = cluster.wait(broken, timeout=60)
    with open(os.path.join(work, "R-fsdp-strategies.%s.out" % broken)) as f:
        log = f.read()
    run = os.path.join(work, "broken", "strategies-tiny-llama-2cpu", "FULL-fp32-bf16-flash-mbs2")
    t.check("launch failed" in log and state == "FAILED" and not os.path.exists(os.path.join(run, "done")) and
            "srun exited 0, but fsdp train did not finish" in log and "%s (exit 1)" % run in log,
            "a run whose ranks srun could not launch (srun exits 0) counts as failed (%s; %s)" %
            (state, [l for l in log.splitlines() if l.startswith("==")][-3:]))
except SlurmError as e:
    t.fail(str(e))
    for name in sorted(os.listdir(work)):
        if name.startswith("R-"):
            with open(os.path.join(work, name)) as f:
                print("---- %s\n%s" % (name, f.read()[-3000:]))
finally:
    cluster.stop()
t.check(not cluster.processes(), "the cluster's daemons and job processes are all gone")

# ---- what the jobs wrote ----
ladder_dir = os.path.join(results, "ladder-tiny-llama-1cpu")
strategies_dir = os.path.join(results, "strategies-tiny-llama-2cpu")
scaling_dir = os.path.join(results, "scaling-tiny-llama-FULL-mbs2")
runs = rc.runs_under(results)
rungs = sorted(os.path.basename(n) for n in runs if n.startswith("results/ladder-"))
t.check(rungs == ["rung1-fp32-no-eager-mbs2", "rung2-fp32-bf16-eager-mbs2", "rung3-bf16-bf16-eager-mbs2",
                  "rung4-bf16-bf16-flash-mbs2", "rung5-bf16-bf16-flash-mbs2", "rung6-bf16-bf16-flash-mbsauto"],
        "ladder.slurm ran the six rungs into folders named by their configuration")
# --mbs auto: the largest micro-batch the plan fits in CPU mode's 32 MiB per rank, in the summary.
rc6, plan_out, plan_err = t.run(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--seq", "32", "--mbs", "auto",
                                    "--gpu-mem", "0.03125", "--model-precision", "bf16", "--mixed-precision", "bf16",
                                    "--attn", "flash", "--json"], check=False)
auto = json.loads(plan_out)["mbs"] if rc6 == 0 else None
rung6 = runs.get("results/ladder-tiny-llama-1cpu/rung6-bf16-bf16-flash-mbsauto")
with open(os.path.join(ladder_dir, "rung6-bf16-bf16-flash-mbsauto", "train.log")) as f:
    chose = re.search(r"--mbs auto chose (\d+), the largest the memory plan fits in 32\.00 MiB per rank", f.read())
t.check(auto and auto > 2 and rung6 and rung6["mbs"] == auto and chose and int(chose.group(1)) == auto and
        rung6["global_batch"] == auto and rung6["max_reserved_bytes"] <= 32 << 20,
        "rung 6 trained with --mbs auto's choice, %s (fsdp plan: %s; its log: %s), under the 32 MiB cap" %
        (rung6 and rung6["mbs"], auto, chose and chose.group(0)))
t.check(sorted(os.path.basename(n).split("-")[0] for n in runs if n.startswith("results/strategies-")) ==
        ["FULL", "HYBRID", "NO_SHARD", "SHARD_GRAD_OP"], "strategies.slurm ran every strategy")
t.check(all(s and s["world_size"] == 2 and s["nodes"] == 1 for n, s in runs.items()
            if n.startswith("results/strategies-")), "each strategy ran on the job's two ranks (srun, one node)")
t.check(sorted((s["world_size"], s["final_step"]) for n, s in runs.items() if n.startswith("results/scaling-")) ==
        [(1, 3), (2, 3)], "scaling.sh ran 1 and 2 ranks to the last step")
t.check(all(s and s["final_step"] == 3 and s["device"].startswith("CPU") for s in runs.values()),
        "every run has its summary, on the CPU backend")
for d in (ladder_dir, strategies_dir, scaling_dir):
    t.check(os.path.exists(os.path.join(d, "report", "report.md")), "the job wrote its own report in %s/report" %
            os.path.relpath(d, work))
t.check(all(os.path.exists(os.path.join(results, n[len("results/"):], f)) for n in runs for f in ("done", "train.log")),
        "each run folder has its log and its done mark")

# ---- the report over everything ----
out = os.path.join(work, "report")
p = subprocess.run([t.BIN, "report", "results", "--out", out, "--gpu-hour-price", "3"], cwd=work, env=t.ENV,
                   capture_output=True, text=True, timeout=120)
t.check(p.returncode == 0, "fsdp report over the results (exit %d) %s" % (p.returncode, p.stderr[-500:]))
with open(os.path.join(out, "report.md")) as f:
    md = f.read()
rc.check_ladder(md, runs, "results/ladder-tiny-llama-1cpu", "slurm")
rc.check_strategies(md, runs, "results/strategies-tiny-llama-2cpu", "slurm")
rc.check_scaling(md, runs, "results/scaling-tiny-llama-FULL-mbs2", "slurm", price=3)
named = rc.check_images(md, out, "slurm")
t.check(len(named) == 7, "plots of the ladder, strategies, scaling and its cost, and three loss plots (%d)" % len(named))

print("ran in %.0f s" % (time.time() - start))
t.finish()
