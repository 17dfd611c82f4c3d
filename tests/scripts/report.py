"""`fsdp report` on recorded metrics (tests/data/report, see its README): the course's tables and
plots from a CPU sweep recorded through SLURM, the course's own published figures (its 27.48x and
86% at 32 GPUs come out again), runs it must skip or list with a notice, and its errors."""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import report_check as rc

DATA = os.path.join(t.ROOT, "tests", "data", "report")


def report(args, env=None, cwd=None):
    p = subprocess.run([t.BIN, "report"] + args, env=env or t.ENV, capture_output=True, text=True, timeout=300,
                       cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def read(path):
    with open(path) as f:
        return f.read()


work = t.tmpdir("report")

# ---- a recorded CPU sweep: ladder, strategies, scaling ----
sweep = os.path.join(work, "cpu-sweep")
shutil.copytree(os.path.join(DATA, "cpu-sweep"), sweep)
out = os.path.join(work, "out-sweep")
code, stdout, stderr = report(["cpu-sweep", "--out", out, "--gpu-hour-price", "2.5"], cwd=work)
t.check(code == 0 and not stderr, "report over the recorded sweep succeeds without notices (%d) %s" % (code, stderr[-300:]))
md = read(os.path.join(out, "report.md"))
runs = rc.runs_under(sweep)
t.check(len(runs) == 12, "the fixture has 12 runs")
# Every run of the sweep ran on the CPU backend: its ranks are not GPUs, in headings and columns alike.
t.check(re.search(r"^## Ladder: \S+ on 1 CPU rank$", md, re.M) and re.search(r"^## Scaling: .* CPU ranks$", md, re.M)
        and "| tokens/s/rank |" in md and "rank-hours per 1e9 tokens" in md and "tokens/s/GPU" not in md and "GPU-hour" not in md,
        "a report of CPU runs speaks of CPU ranks, not GPUs")
scripts = [read(os.path.join(out, "gnuplot", f)) for f in os.listdir(os.path.join(out, "gnuplot")) if f.endswith(".gp")]
t.check(any("tokens/s per CPU rank" in s for s in scripts) and not any("GPU" in s for s in scripts),
        "and so do its plots (%d gnuplot scripts)" % len(scripts))
rc.check_ladder(md, runs, "cpu-sweep/ladder-tiny-llama-1gpu", "sweep")
rc.check_strategies(md, runs, "cpu-sweep/strategies-tiny-llama-2gpu", "sweep")
rc.check_scaling(md, runs, "cpu-sweep/scaling-tiny-llama-FULL-mbs2", "sweep", price=2.5)
cost = [r for table in rc.section(md, "## Cost per billion tokens") for r in table]
hours = [float(r["GPU-hours per 1e9 tokens"]) for r in cost]
t.check(len(cost) == 12 and hours == sorted(hours) and all(
    r["EUR per 1e9 tokens"] == "%.2f" % (rc.gpu_hours(runs[r["run"]]["tokens_per_s_per_gpu"]) * 2.5) for r in cost),
    "the cost table lists every run, cheapest first, at 2.5 EUR per GPU-hour")
all_runs = [r for table in rc.section(md, "## Runs") for r in table]
t.check(sorted(r["run"] for r in all_runs) == sorted(runs), "the runs table lists every run by its path")
named = rc.check_images(md, out, "sweep")
t.check(len(named) == 7, "7 plots: ladder, strategies, scaling and its cost, a loss plot per folder (%d)" % len(named))
t.check(all(os.path.exists(os.path.join(out, "gnuplot", n[:-4] + ".gp")) for n in named) and
        not [f for f in os.listdir(out) if f.startswith(".fsdp-report")],
        "each plot's gnuplot script is kept, and no staging folder is left")

# The numbers come from the files: doubling rung 1's throughput halves every speed-up of the ladder.
rung1 = os.path.join(sweep, "ladder-tiny-llama-1gpu", "rung1-fp32-no-eager-mbs2", "metrics.jsonl")
records = [json.loads(line) for line in read(rung1).splitlines()]
tps = records[-1]["tokens_per_s_per_gpu"]
records[-1]["tokens_per_s_per_gpu"] = 2 * tps
with open(rung1, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in records))
t.check(rc.summary_of(rung1)["tokens_per_s_per_gpu"] == 2 * tps, "the fixture copy's rung 1 now runs twice as fast")
code, _, _ = report(["cpu-sweep", "--out", out, "--plots=no"], cwd=work)
md2 = read(os.path.join(out, "report.md"))
rows = rc.check_ladder(md2, rc.runs_under(sweep), "cpu-sweep/ladder-tiny-llama-1gpu", "sweep, rung 1 doubled")
t.check(code == 0 and rows and rows[0]["speed-up"] == "1.00x" and rows[1]["speed-up"] != rc.section(md, "## Ladder")[0][1]["speed-up"],
        "the speed-ups follow the changed metrics")
t.check("![" not in md2, "--plots=no writes the tables without images")

# ---- the course's published figures (chapter 15): the report reproduces its arithmetic ----
out = os.path.join(work, "out-course")
code, _, stderr = report([os.path.join(DATA, "course-chapter15"), "--out", out, "--gpu-hour-price", "2.5"])
md = read(os.path.join(out, "report.md"))
course = rc.runs_under(os.path.join(DATA, "course-chapter15"))
t.check("| tokens/s/GPU |" in md and "rank" not in md.split("## Runs")[0].replace("nodes × ranks", ""),
        "a report of GPU runs speaks of GPUs")
rc.check_scaling(md, course, "course-chapter15/scaling-llama-3.2-1b-NO_SHARD-mbs37", "course", price=2.5)
rc.check_ladder(md, course, "course-chapter15/ladder-llama-3.2-1b-1gpu", "course")
t.check("**From 1 to 32 GPUs: 27.48x speed-up, 85.9% efficiency.**" in md,
        "course: 1 to 32 GPUs gives the chapter's 27.48x and 86% (Table 15.11)")
t.check("**Rung 1 → rung 6: 4.59x throughput, 61.89 → 62.33 GiB, micro-batch 6 → 37.**" in md,
        "course: the ladder's 4.59x from task 15.1 to 15.9 (the chapter's \"4.5x\")")
scaling_total = [r["total tokens/s"] for table in rc.section(md, "## Scaling") for r in table]
t.check(scaling_total == ["48,229", "92,376", "173,728", "338,376", "669,904", "1,325,568"],
        "course: total throughput as in Table 15.11")
rc.check_images(md, out, "course")

# ---- runs to skip, to list, and a torn, resumed run with validation loss ----
out = os.path.join(work, "out-edge")
code, _, stderr = report([os.path.join(DATA, "edge"), "--out", out])
md = read(os.path.join(out, "report.md"))
t.check(code == 0, "the edge cases do not stop the report")
t.check('old-summary/metrics.jsonl: the summary record has no "model"' in stderr and "(run skipped)" in stderr,
        "a summary without the configuration fields is skipped with a notice naming the file and field")
t.check('bad-type/metrics.jsonl: summary field "world_size" is not an integer' in stderr,
        "a summary field of the wrong type is skipped with a notice naming it")
t.check("not-metrics.jsonl: no fsdp.c metrics record" in stderr, "JSON Lines that are not metrics are skipped")
t.check("resumed-torn-eval/metrics.jsonl: line 4" in stderr and "(line skipped)" in stderr,
        "a torn line is skipped with a notice naming file and line")
unfinished = [r for table in rc.section(md, "### Runs without a summary") for r in table]
t.check([(r["run"], r["last step"]) for r in unfinished] == [("edge/failed", "2")],
        "a run without a summary is listed with its last step")
finished = [r for table in rc.section(md, "## Runs") for r in table]
t.check([(r["run"], r["last loss"], r["last validation loss"]) for r in finished] ==
        [("edge/resumed-torn-eval", "6.9352", "6.9433")], "the resumed run's last loss and validation loss")
blocks = read(os.path.join(out, "gnuplot", "loss-edge.dat")).split("\n\n\n")
points = [len([l for l in b.splitlines() if l and not l.startswith("#")]) for b in blocks]
t.check([n for n in points if n] == [2, 4, 2],
        "the failed run's 2 points, then one training point per step of the resumed run (4: its repeated step 3 counted once) and its two validation points %s" % points)
rc.check_images(md, out, "edge")

# ---- errors: one line, nothing written ----
code, _, stderr = report([os.path.join(work, "missing"), "--out", os.path.join(work, "o1")])
t.check(code == 2 and stderr.count("\n") == 1 and "missing: No such file or directory" in stderr,
        "a missing results folder: exit 2, one line naming it (%r)" % stderr)
os.makedirs(os.path.join(work, "empty"))
code, _, stderr = report([os.path.join(work, "empty"), "--out", os.path.join(work, "o2")])
t.check(code == 1 and stderr.count("\n") == 1 and "no run with metrics" in stderr and
        not os.path.exists(os.path.join(work, "o2", "report.md")), "no runs: exit 1, one line, no report")
code, _, stderr = report([os.path.join(DATA, "course-chapter15")])
t.check(code == 2 and "--out DIR is required" in stderr, "--out is required")
code, _, stderr = report([os.path.join(DATA, "course-chapter15"), "--out", os.path.join(work, "o3"),
                          "--gpu-hour-price", "-1"])
t.check(code == 2 and "--gpu-hour-price" in stderr, "a negative price is refused")
# No gnuplot on PATH (Open MPI's singleton start-up looks for ssh there too: it is told not to).
no_gnuplot = dict(t.ENV, PATH="/nonexistent", OMPI_MCA_plm_rsh_agent="/bin/false")
code, _, stderr = report([os.path.join(DATA, "course-chapter15"), "--out", os.path.join(work, "o4")], env=no_gnuplot)
t.check(code == 1 and stderr.count("\n") == 1 and "gnuplot not found" in stderr and
        not os.path.exists(os.path.join(work, "o4")), "without gnuplot: one line saying how to get it, nothing written")
code, _, stderr = report([os.path.join(DATA, "course-chapter15"), "--out", os.path.join(work, "o5"), "--plots=no"],
                         env=no_gnuplot)
t.check(code == 0 and os.path.exists(os.path.join(work, "o5", "report.md")) and
        not [f for f in os.listdir(os.path.join(work, "o5")) if f.endswith(".png")],
        "without gnuplot, --plots=no writes the tables alone")
t.finish()
