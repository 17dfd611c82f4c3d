#!/usr/bin/env python3
"""fsdp.c and PyTorch FSDP2 on emulated inter-node links, in one call on one GPU host (2 GPUs).

A link between nodes is emulated on one host by forcing NCCL's transport; fsdp.c and PyTorch read
the same variables, so both programs run over the same link:

  nvlink  (nothing)                                  the host's own NVLink
  ib      NCCL_P2P_DISABLE=1                         through host shared memory: InfiniBand-class
  eth     NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1      through sockets: Ethernet-class

For each link in --links order: nccl_bw.py once (bus bandwidth through PyTorch), then every selected
row (ROWS below) of fsdp.c (bench/compare.py's run_fsdp) and of the reference torch_bench.py
(compare.py's run_ref). Results go to bench/results/DATE-DEVICE-links-SUITE[-TAG].md, .json and .log
(every run's output), rewritten after every run and copied to $OUT when that is set, so that a
command stopped by a time limit keeps what it measured. A failing or timed-out run is recorded and the
next one starts; --budget stops starting runs after that many seconds (the rest: "skipped (budget)").

  python3 bench/links.py --suite all --dry-run                 # every command, per link, nothing run
  python3 bench/links.py --suite 1b --links nvlink,ib --budget 300 --timeout 240
  python3 bench/links.py --suite 7b --links eth --rows 'int8|compile' --budget 300 --timeout 240
  python3 bench/links.py --suite eth-accum --links nvlink,eth --only fsdp --tag accum --budget 300
  python3 bench/links.py --suite hpz --gpus 4 --links nvlink,ib --budget 400   # a host of 4 GPUs
  python3 bench/links.py --suite 1b --only fsdp --rows 'FULL$' --trace --budget 300   # one timeline per link

A run already started goes on to its --timeout: under a limit on the whole command (10 minutes on the
GPU hosts), --budget plus --timeout inside it means no run is cut off.

Needs: build/fsdp (CUDA backend), mpirun (Open MPI), python3 with PyTorch and transformers for the
reference and nccl_bw.py (.ref/ in the repository on the GPU hosts, else ../shared/reference/).
This script itself uses the standard library only.
"""
import argparse
import ast
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import compare  # noqa: E402  (run_fsdp, run_ref, MODELS: the same runs and parsing as compare.py)

# ---- what is measured: edit here ----

# Each link: the environment that defines it (added to the common one below).
LINKS = {
    "nvlink": {},
    "ib": {"NCCL_P2P_DISABLE": "1"},
    "eth": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
}
LINK_NAMES = {"nvlink": "NVLink", "ib": "IB-class", "eth": "Ethernet-class"}
COMMON_ENV = {"NCCL_NVLS_ENABLE": "0", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "PYTHONUNBUFFERED": "1"}
MPI_EXPORT = ["NCCL_NVLS_ENABLE"]  # passed to the ranks with -x, beside the link's own variables

# Each suite: one model and batch (compare.MODELS key, micro-batch, sequence, micro-batches per step,
# fsdp.c's default --steps). Its rows share one table and one "% of NVLink best".
SUITES = {
    "1b": dict(model="llama1b", mbs=16, seq=1024, accum=1, steps=10),
    "7b": dict(model="llama2_7b", mbs=8, seq=512, accum=1, steps=6),
    "eth-accum": dict(model="llama1b", mbs=16, seq=1024, accum=4, steps=6),
    # issue 20's 7B row with accumulation (the option README gives for a slow link): local accumulation
    # communicates once per optimizer step.
    "7b-accum2": dict(model="llama2_7b", mbs=8, seq=512, accum=2, steps=6),
    "7b-accum4": dict(model="llama2_7b", mbs=8, seq=512, accum=4, steps=5),
    # hpZ (issue 22): run with --gpus 4 on a host of four GPUs, its ranks as 2 emulated nodes of 2. On one host
    # the link variables slow every pair of GPUs alike, so the rows compare bytes and overlap, not a fast link
    # inside a node beside a slow one between nodes.
    "hpz": dict(model="llama1b", mbs=16, seq=1024, accum=1, steps=10),
    # The same 2 nodes of 2 with the wire options README recommends for a slow link, each strategy.
    "hpz-wire": dict(model="llama1b", mbs=16, seq=1024, accum=1, steps=10),
}

# The reference: torch_bench.py's fsdp2 mode (fully_shard per decoder block and the root, bf16 params,
# fp32 reduce, --compile = per-block torch.compile, torchtitan's recipe); sdpa attention as compare.py's
# reference rows (torch_bench's own default is eager). It has no gradient accumulation.
FSDP2_COMPILE = "fsdp2 --strategy FULL_SHARD --attn sdpa --compile"
FSDP2_EAGER = "fsdp2 --strategy FULL_SHARD --attn sdpa"
BASELINE = "FSDP2 FULL_SHARD + compile"  # the label (prefix) of the "x FSDP2+compile" denominator

# (suite, program, label, fsdp.c flags or torch_bench arguments, links: None = every selected link)
# fsdp.c defaults: --reduce-dtype auto (= the model precision, fp32), --gather-dtype auto (= the compute
# precision, bf16), --accumulate auto (sharded for FULL, local otherwise).
IB = ("ib",)
ROWS = [
    ("1b", "fsdp", "fsdp.c FULL", "--strategy FULL", None),
    ("1b", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8",
     "--strategy SHARD_GRAD_OP --reduce-dtype int8 --gather-dtype int8", None),
    ("1b", "ref", "FSDP2 FULL_SHARD + compile", FSDP2_COMPILE, ("ib", "eth")),
    ("1b", "fsdp", "fsdp.c FULL, reduce bf16", "--strategy FULL --reduce-dtype bf16", IB),
    ("1b", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce bf16", "--strategy SHARD_GRAD_OP --reduce-dtype bf16", IB),
    ("1b", "fsdp", "fsdp.c FULL, reduce int8, gather int8", "--strategy FULL --reduce-dtype int8 --gather-dtype int8",
     IB),
    ("1b", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8 (gather bf16)", "--strategy SHARD_GRAD_OP --reduce-dtype int8",
     IB),
    ("1b", "ref", "FSDP2 FULL_SHARD (no compile)", FSDP2_EAGER, IB),
    # issue 22: the strategy and wire options fsdp plan's table puts first for a 25 GB/s link between two
    # nodes of one GPU (--ranks-per-node 1), against the rows above measured in the same call.
    ("1b", "fsdp", "fsdp.c --strategy auto (told 25 GB/s)", "--strategy auto --ranks-per-node 1 --link-gbps 25", IB),
    # issue 22's bar: the strategy, wire options and micro-batch together (the suite's --mbs replaced).
    ("1b", "fsdp", "fsdp.c --strategy auto --mbs auto (told 25 GB/s)",
     "--strategy auto --mbs auto --ranks-per-node 1 --link-gbps 25", IB),

    ("7b", "fsdp", "fsdp.c FULL", "--strategy FULL", None),
    ("7b", "fsdp", "fsdp.c FULL, reduce int8, gather int8", "--strategy FULL --reduce-dtype int8 --gather-dtype int8",
     IB),
    ("7b", "ref", "FSDP2 FULL_SHARD + compile", FSDP2_COMPILE, IB),
    # On an 80 GB H100 the fp32 reduction of FULL does not fit at MBS 8 (fsdp plan: 79.8 GiB); bf16 does.
    ("7b", "fsdp", "fsdp.c FULL, reduce bf16", "--strategy FULL --reduce-dtype bf16", ("nvlink", "ib")),
    # Does not fit an 80 GB H100 (fsdp plan: 87.3 GiB): every unit stays gathered in bf16. An H200's 141 GB hold it.
    ("7b", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8",
     "--strategy SHARD_GRAD_OP --reduce-dtype int8 --gather-dtype int8", ("nvlink", "ib")),

    ("7b-accum2", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8",
     "--strategy SHARD_GRAD_OP --reduce-dtype int8 --gather-dtype int8", ("nvlink", "ib")),
    ("7b-accum2", "ref", "FSDP2 FULL_SHARD + compile (no accumulation: 1 micro-batch per step)", FSDP2_COMPILE, IB),
    ("7b-accum4", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8",
     "--strategy SHARD_GRAD_OP --reduce-dtype int8 --gather-dtype int8", ("nvlink", "ib")),
    ("7b-accum4", "ref", "FSDP2 FULL_SHARD + compile (no accumulation: 1 micro-batch per step)", FSDP2_COMPILE, IB),

    ("hpz", "fsdp", "fsdp.c FULL (2 nodes of 2)", "--strategy FULL --ranks-per-node 2", None),
    ("hpz", "fsdp", "fsdp.c FULL, hpZ 2 (2 nodes of 2)", "--strategy FULL --ranks-per-node 2 --reshard-after-forward 2",
     None),
    ("hpz", "fsdp", "fsdp.c HYBRID (2 nodes of 2)", "--strategy HYBRID --ranks-per-node 2", None),
    ("hpz", "ref", "FSDP2 FULL_SHARD + compile", FSDP2_COMPILE, IB),

    ("hpz-wire", "fsdp", "fsdp.c FULL (2 nodes of 2)", "--strategy FULL --ranks-per-node 2", ("nvlink",)),
    ("hpz-wire", "fsdp", "fsdp.c FULL, hpZ 2, reduce int8, gather int8 (2 nodes of 2)",
     "--strategy FULL --ranks-per-node 2 --reshard-after-forward 2 --reduce-dtype int8 --gather-dtype int8", IB),
    ("hpz-wire", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8 (2 nodes of 2)",
     "--strategy SHARD_GRAD_OP --ranks-per-node 2 --reduce-dtype int8 --gather-dtype int8", IB),
    ("hpz-wire", "fsdp", "fsdp.c HYBRID, reduce int8, gather int8 (2 nodes of 2)",
     "--strategy HYBRID --ranks-per-node 2 --reduce-dtype int8 --gather-dtype int8", IB),
    ("hpz-wire", "ref", "FSDP2 FULL_SHARD + compile", FSDP2_COMPILE, IB),

    ("eth-accum", "fsdp", "fsdp.c FULL (accumulate sharded: default)", "--strategy FULL", ("eth",)),
    ("eth-accum", "fsdp", "fsdp.c FULL, accumulate local", "--strategy FULL --accumulate local", ("eth",)),
    ("eth-accum", "fsdp", "fsdp.c SHARD_GRAD_OP (accumulate local: default)", "--strategy SHARD_GRAD_OP", None),
    ("eth-accum", "fsdp", "fsdp.c SHARD_GRAD_OP, accumulate sharded", "--strategy SHARD_GRAD_OP --accumulate sharded",
     ("eth",)),
    ("eth-accum", "fsdp", "fsdp.c SHARD_GRAD_OP, reduce int8, gather int8",
     "--strategy SHARD_GRAD_OP --reduce-dtype int8 --gather-dtype int8", ("eth",)),
    ("eth-accum", "fsdp", "fsdp.c NO_SHARD", "--strategy NO_SHARD", ("eth",)),
    ("eth-accum", "fsdp", "fsdp.c NO_SHARD, reduce int8", "--strategy NO_SHARD --reduce-dtype int8", ("eth",)),
    ("eth-accum", "ref", "FSDP2 FULL_SHARD + compile (no accumulation: 1 micro-batch per step)", FSDP2_COMPILE,
     ("eth",)),
]

FSDP_COMMON = ["--model-precision", "fp32", "--mixed-precision", "bf16", "--attn", "flash"]  # + compare.run_fsdp's
BW_SIZES = (64, 1024)  # MiB: the nccl_bw.py sizes shown in the markdown (all are kept in the JSON)


# ---- running ----

def descendants(pid):
    """Every process below pid (read from /proc), deepest last."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(p, grace=10.0):
    """Ends a launcher and everything it started (mpirun's ranks, torchrun's workers), so that no rank is left
    holding a GPU for the next run. The processes stay in this one's session and group (a limit that ends this
    command ends them too)."""
    pids = [p.pid] + descendants(p.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + grace
        while time.time() < deadline:
            if p.poll() is not None and not any(os.path.exists("/proc/%d" % q) and not zombie(q) for q in pids[1:]):
                return
            time.sleep(0.2)
    p.wait()


def zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Runner:
    """Replaces compare.run (compare.run_fsdp and compare.run_ref call it through the module) so that every
    command: gets the link's -x exports and --mpirun-args (mpirun) or the --torchrun launcher (the reference),
    is recorded with the link's environment in front, has its output streamed into the combined log as it comes,
    and is ended with all its processes at its timeout."""

    def __init__(self, args, log_paths):
        self.args, self.log_paths = args, log_paths
        self.link_env = {}
        self.command = self.output = self.metrics = None
        self.timed_out = False

    def rewrite(self, cmd):
        cmd = list(cmd)
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        if cmd[:3] == torchrun:
            cmd[:3] = shlex.split(self.args.torchrun)
        elif os.path.basename(cmd[0]) == "mpirun":
            exports = []
            for name in MPI_EXPORT + sorted(self.link_env):
                exports += ["-x", name]
            cmd[1:1] = exports + shlex.split(self.args.mpirun_args)
        return cmd

    def __call__(self, cmd, env, timeout):
        cmd = self.rewrite(cmd)
        prefix = " ".join("%s=%s" % kv for kv in sorted(self.link_env.items()))
        self.command = (prefix + " " if prefix else "") + " ".join(shlex.quote(c) for c in cmd)
        self.metrics = cmd[cmd.index("--metrics") + 1] if "--metrics" in cmd else None
        self.output, self.timed_out = "", False
        if self.args.dry_run:
            print("  " + self.command, flush=True)
            return 0, ""
        logs = [open(p, "a") for p in self.log_paths]
        for f in logs:
            f.write("\n===== %s | %s\n" % (datetime.datetime.now().strftime("%H:%M:%S"), self.command))
            f.flush()
        chunks = []
        try:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace", stdin=subprocess.DEVNULL)
        except OSError as e:
            for f in logs:
                f.write("cannot start: %s\n" % e)
                f.close()
            self.output = "cannot start %s: %s" % (cmd[0], e)
            return 127, self.output

        def pump():
            for line in p.stdout:
                chunks.append(line)
                for f in logs:
                    f.write(line)
                    f.flush()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            kill_tree(p)
            rc = 124
        except BaseException:  # Ctrl-C or SIGTERM: leave no rank behind
            kill_tree(p, grace=3.0)
            raise
        finally:
            t.join(timeout=10)
            for f in logs:
                f.write("===== rc %s%s\n" % (p.returncode if p.returncode is not None else "?",
                                            " (timed out after %d s)" % timeout if self.timed_out else ""))
                f.close()
        self.output = "".join(chunks)
        return rc, self.output


def parse_metrics(path):
    """Step time, comm-wait share and bytes sent from fsdp.c's metrics file (the first step is not timed)."""
    steps, summary = [], None
    try:
        with open(path) as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if obj.get("summary"):
                    summary = obj
                elif "step_ms" in obj:
                    steps.append(obj)
    except OSError:
        return {}
    out = {}
    timed = steps[1:] or steps
    if timed:
        ms = sum(s["step_ms"] for s in timed)
        out["step_ms_mean"] = ms / len(timed)
        out["comm_wait_pct"] = 100.0 * sum(s.get("comm_wait_ms", 0.0) for s in timed) / ms if ms > 0 else None
    if summary:
        for key in ("comm_bytes_per_step", "comm_bytes_min"):
            v = summary.get(key)
            if isinstance(v, dict):
                out[key] = v
                total = v.get("total", sum(x for x in v.values() if isinstance(x, (int, float))))
                out[key.replace("bytes", "gb")] = total / 1e9
        for key in ("world_size", "strategy", "mfu", "tflops_per_gpu", "trace"):
            if key in summary:
                out[key] = summary[key]
    return out


def parse_bw(out):
    """nccl_bw.py's lines: RESULT <MiB> MiB bf16 busbw GB/s {'all_gather': x, ...} -> {MiB: {...}}."""
    res = {}
    for m in re.finditer(r"^RESULT (\d+) MiB bf16 busbw GB/s (\{.*\})\s*$", out, re.M):
        try:
            res[int(m.group(1))] = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            pass
    return res


def without_mpi_notes(out):
    """The output without Open MPI's notes (the blocks between lines of dashes): what the program said."""
    keep, inside = [], False
    for line in out.splitlines():
        if re.match(r"^-{20,}\s*$", line):
            inside = not inside
        elif not inside:
            keep.append(line)
    return "\n".join(keep)


def short_error(out):
    lines = [l for l in out.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else "failed"


# ---- the report ----

def num(x, f="%.0f"):
    return f % x if isinstance(x, (int, float)) else "-"


def thousands(x):
    return "{:,.0f}".format(x) if isinstance(x, (int, float)) else "-"


def cell(run):
    """The tokens/s cell: the figure, or why there is none."""
    if run is None:
        return "not run"
    if run["status"] == "ok":
        return thousands(run["tps"])
    if run["status"] == "failed":
        return "failed: " + run.get("error", "")[:40].replace("|", "/")
    return run["status"]


def group_title(s, gpus):
    m = SUITES[s]
    accum = ", %d micro-batches per step" % m["accum"] if m["accum"] > 1 else ""
    return "%s, micro-batch %d, sequence %d%s, %d GPUs (suite %s)" % (compare.MODELS[m["model"]][1], m["mbs"],
                                                                          m["seq"], accum, gpus, s)


def render(meta, rows, runs, bw, links, done):
    L = ["# fsdp.c and FSDP2 on emulated links: suite %s on %s, %s" % (meta["suite"], meta["device"], meta["date"]),
         "", "Command: `%s`" % meta["command"], ""]
    L.append("Common environment: %s. Links: %s." % (
        ", ".join("`%s=%s`" % kv for kv in sorted(meta["env"].items())),
        "; ".join("%s (%s) %s" % (l, LINK_NAMES[l], " ".join("`%s=%s`" % kv for kv in sorted(LINKS[l].items()))
                                  or "no extra variable") for l in links)))
    if meta.get("launch_env"):
        L[-1] += " From the launching environment: %s." % ", ".join("`%s=%s`" % kv for kv in sorted(
            meta["launch_env"].items()))
    L.append("")
    if not done:
        L += ["**Incomplete: the harness was still running (or was stopped) when this was written.**", ""]
    L += ["Every figure of this file was measured in this one call on this host, one run after the other. "
          "tokens/s/GPU: steady state (fsdp.c: every step but the first of %s; the reference: after its warm-up). "
          "\"%% NVLink\": of the best fsdp.c run of the same table on NVLink in this call. \"x FSDP2\": against "
          "the reference's `%s` row of the same table on the same link. \"GB/step\": what one rank sent per "
          "step (mean of the timed steps) / the least its strategy needs (fsdp.c's own count). Under \"Every run\", "
          "the reference's step ms is derived (micro-batch x sequence / its tokens/s) and comm wait is fsdp.c's "
          "time waiting on collectives as a share of its step time." % (meta["steps_note"], BASELINE), ""]
    by_key = {(r["row"], r["link"]): r for r in runs}
    for s in [s for s in SUITES if any(r["suite"] == s for r in rows)]:
        srows = [r for r in rows if r["suite"] == s]
        best = {}
        for r in srows:
            run = by_key.get((r["id"], "nvlink"))
            if r["program"] == "fsdp" and run and run["status"] == "ok":
                best["nvlink"] = max(best.get("nvlink", 0), run["tps"])
        L += ["## " + group_title(s, meta["gpus"]), ""]
        if SUITES[s]["accum"] > 1:
            L += ["The reference has no gradient accumulation: its row trains one micro-batch of %d per step, so its "
                  "ratio compares throughput at 1/%d of fsdp.c's samples per optimizer step."
                  % (SUITES[s]["mbs"], SUITES[s]["accum"]), ""]
        with_pct = "nvlink" in links
        head = ["configuration"]
        for l in links:
            head += ["%s tok/s/GPU" % LINK_NAMES[l]] + (["% NVLink"] if with_pct else []) + ["x FSDP2", "GB/step"]
        L += ["| " + " | ".join(head) + " |", "|---" + "|--:" * (len(head) - 1) + "|"]
        for r in srows:
            line = [r["label"]]
            for l in links:
                run = by_key.get((r["id"], l))
                base = next((by_key.get((b["id"], l)) for b in srows if b["program"] == "ref" and
                             b["label"].startswith(BASELINE)), None)
                ok = run is not None and run["status"] == "ok"
                pct = "%.0f%%" % (100 * run["tps"] / best["nvlink"]) if ok and best.get("nvlink") else "-"
                ratio = ("%.2fx" % (run["tps"] / base["tps"]) if ok and base and base["status"] == "ok" and base["tps"]
                         else "-")
                gb = ("%.2f / %.2f" % (run["comm_gb_per_step"], run["comm_gb_min"])
                      if ok and "comm_gb_per_step" in run and "comm_gb_min" in run else "-")
                line += [cell(run)] + ([pct] if with_pct else []) + [ratio, gb]
            L.append("| " + " | ".join(line) + " |")
        L.append("")
    if bw:
        L += ["## NCCL bus bandwidth (nccl_bw.py, bf16, GB/s)", ""]
        head = ["link"] + ["%s %s" % (op, "%d MiB" % mb if mb < 1024 else "%d GiB" % (mb // 1024))
                           for op in ("all-gather", "reduce-scatter") for mb in BW_SIZES]
        L += ["| " + " | ".join(head) + " |", "|---" + "|--:" * (len(head) - 1) + "|"]
        for l in links:
            b = bw.get(l)
            if b is None:
                continue
            if b["status"] != "ok":
                L.append("| %s | %s |" % (LINK_NAMES[l], b["status"] + (": " + b.get("error", "")[:60].replace("|", "/")
                                                                         if b["status"] == "failed" else "")))
                continue
            vals = [num(b["busbw"].get(mb, {}).get(op), "%.1f") for op in ("all_gather", "reduce_scatter")
                    for mb in BW_SIZES]
            L.append("| " + " | ".join([LINK_NAMES[l]] + vals) + " |")
        L.append("")
    traced = [r for r in runs if isinstance(r.get("trace"), dict)]
    if traced:
        # --trace: fsdp train's timeline summary (docs/FORMATS.md "Trace files"), per step, the ranks' mean.
        L += ["## Timelines (--trace: busy ms per step and stream, communication hidden under compute)", "",
              "| link | configuration | steps | compute | gather | reduce | communication | hidden | exposed | "
              "comm wait | trace files |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
        for run in traced:
            tr = run["trace"]
            busy = tr.get("busy_ms", {})
            L.append("| " + " | ".join([
                LINK_NAMES.get(run["link"], run["link"]), run["label"], "%s-%s" % (tr.get("first_step"), tr.get("last_step")),
                num(busy.get("compute"), "%.1f"), num(busy.get("gather"), "%.1f"), num(busy.get("reduce"), "%.1f"),
                num(tr.get("comm_ms"), "%.1f"), num(100 * tr["overlap"] if tr.get("overlap") is not None else None,
                                                    "%.0f%%"),
                num(tr.get("exposed_ms"), "%.1f"), num(tr.get("comm_wait_ms"), "%.1f"),
                os.path.basename(run.get("trace_files", ""))]) + " |")
        L.append("")
    L += ["## Every run", "",
          "| link | suite | configuration | status | tok/s/GPU | max reserved GiB | step ms | comm wait | "
          "GB sent/step | GB min | elapsed s |", "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for run in runs:
        L.append("| " + " | ".join([
            run["link"], run["suite"], run["label"],
            run["status"] + (": " + run.get("error", "")[:80].replace("|", "/") if run["status"] != "ok" and
                             run.get("error") else ""),
            thousands(run.get("tps")), num(run.get("gib"), "%.1f"), num(run.get("step_ms_mean"), "%.0f"),
            num(run.get("comm_wait_pct"), "%.1f%%"), num(run.get("comm_gb_per_step"), "%.2f"),
            num(run.get("comm_gb_min"), "%.2f"), num(run.get("elapsed_s"), "%.0f")]) + " |")
    L.append("")
    failed = [r for r in runs if r["status"] in ("failed", "timeout") and r.get("tail")]
    if failed:
        L += ["## Failures (the end of each output; the whole output is in the .log)", ""]
        for run in failed:
            tail = "\n".join(without_mpi_notes(run["tail"]).rstrip().splitlines()[-12:])
            L += ["%s, %s: %s: `%s`" % (run["link"], run["suite"], run["label"], run.get("error", "")), "", "```",
                  tail, "```", ""]
    L += ["## Exact commands", ""]
    for l in links:
        cmds = ([bw[l]["command"]] if l in bw and bw[l].get("command") else []) + \
               [r["command"] for r in runs if r["link"] == l and r.get("command")]
        if cmds:
            L += ["%s:" % LINK_NAMES[l], ""] + ["- `%s`" % c for c in cmds] + [""]
    return "\n".join(L)


# ---- main ----

def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0].strip() if out else "unknown GPU"


def default_ref(name):
    here = os.path.join(ROOT, ".ref", name)
    return here if os.path.exists(here) else os.path.normpath(os.path.join(ROOT, "..", "shared", "reference", name))


def select_rows(args):
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    rows = []
    for i, (s, program, label, flags, only_links) in enumerate(ROWS):
        if s not in suites:
            continue
        if args.only != "both" and program != {"fsdp": "fsdp", "reference": "ref"}[args.only]:
            continue
        if args.rows and not re.search(args.rows, "%s: %s" % (s, label)):
            continue
        rows.append(dict(id=i, suite=s, program=program, label=label, flags=flags, links=only_links))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--links", default="nvlink,ib,eth", help="comma-separated, in the order to run: nvlink, ib, eth")
    p.add_argument("--suite", default="1b", choices=list(SUITES) + ["all"])
    p.add_argument("--rows", default="", help="regular expression: only rows whose 'SUITE: LABEL' it matches "
                                              "(re.search; e.g. 'int8', '^7b:', 'FSDP2')")
    p.add_argument("--only", choices=["both", "fsdp", "reference"], default="both")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--steps", type=int, default=0,
                   help="fsdp.c steps per run, the first untimed (default: the suite's, 10 for 1B, 6 for 7B)")
    p.add_argument("--ref-steps", type=int, default=12)
    p.add_argument("--ref-warm", type=int, default=4)
    p.add_argument("--no-bw", action="store_true", help="skip nccl_bw.py")
    p.add_argument("--budget", type=float, default=0,
                   help="seconds: start no run after this much wall time (0 = no limit); the rest are recorded as "
                        "'skipped (budget)'. A run already started goes on to its --timeout")
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag", default="")
    p.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    p.add_argument("--reference", default=default_ref("torch_bench.py"))
    p.add_argument("--nccl-bw", default=default_ref("nccl_bw.py"))
    p.add_argument("--torchrun", default="%s -m torch.distributed.run" % sys.executable,
                   help="the launcher of the reference and nccl_bw.py (shell syntax)")
    p.add_argument("--mpirun-args", default="", help="added after mpirun (shell syntax, e.g. --oversubscribe)")
    p.add_argument("--extra", default="", help="flags added to every fsdp.c command (shell syntax)")
    p.add_argument("--trace", action="store_true",
                   help="keep one timeline per link: the link's first fsdp.c row runs with fsdp train --trace (its "
                        "default steps); the files go beside the results (and to $OUT), their summary into the "
                        ".json and a table of the .md")
    p.add_argument("--dry-run", action="store_true", help="print every command, per link, and run nothing")
    args = p.parse_args()

    links = [l.strip() for l in args.links.split(",") if l.strip()]
    bad = [l for l in links if l not in LINKS]
    if bad or not links:
        raise SystemExit("links.py: unknown link(s) %s (nvlink, ib, eth)" % ", ".join(bad))
    try:
        rows = select_rows(args)
    except re.error as e:
        raise SystemExit("links.py: --rows %r: %s" % (args.rows, e))
    if not rows:
        raise SystemExit("links.py: no rows selected (--suite / --rows / --only)")
    if args.gpus < 2:
        raise SystemExit("links.py: --gpus must be at least 2 (a link joins two GPUs)")
    need_fsdp = any(r["program"] == "fsdp" for r in rows)
    need_ref = any(r["program"] == "ref" for r in rows)
    if not args.dry_run:
        if need_fsdp and not os.path.exists(args.fsdp):
            raise SystemExit("links.py: %s not found (build first, or --fsdp)" % args.fsdp)
        if need_ref and not os.path.exists(args.reference):
            raise SystemExit("links.py: reference %s not found (--reference, or --only fsdp)" % args.reference)
        if not args.no_bw and not os.path.exists(args.nccl_bw):
            print("links.py: %s not found: no bus bandwidth (--nccl-bw, or --no-bw)" % args.nccl_bw, flush=True)
            args.no_bw = True

    base_env = dict(os.environ)
    inherited = {k: base_env.pop(k) for k in sorted({k for e in LINKS.values() for k in e}) if k in base_env}
    if inherited:
        print("links.py: ignoring the launching environment's %s (each link sets its own)" %
              " ".join("%s=%s" % kv for kv in inherited.items()), flush=True)
    base_env.update(COMMON_ENV)

    start = time.time()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    device = "dry run" if args.dry_run else device_name()
    name = "%s-%s-links-%s" % (stamp, re.sub(r"\W+", "-", device).strip("-").lower(), args.suite)
    name += "-" + re.sub(r"\W+", "-", args.tag).strip("-") if args.tag else ""
    base = os.path.join(args.out, name)
    outdir = os.environ.get("OUT", "")  # the GPU tool returns only the files under $OUT
    log_paths = []
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
        if outdir:
            os.makedirs(outdir, exist_ok=True)
        log_paths = [base + ".log"] + ([os.path.join(outdir, name + ".log")] if outdir else [])
        for path in log_paths:
            open(path, "w").close()
    runner = Runner(args, log_paths)
    compare.run = runner  # compare.run_fsdp / run_ref run their commands through it

    def steps_of(suite):
        return args.steps or SUITES[suite]["steps"]

    steps_note = ", ".join("%d steps (%s)" % (steps_of(s), s) for s in SUITES if any(r["suite"] == s for r in rows))
    meta = dict(suite=args.suite, device=device, date=stamp, gpus=args.gpus, links=links, env=COMMON_ENV,
                link_env={l: LINKS[l] for l in links}, command=" ".join(shlex.quote(a) for a in sys.argv),
                steps_note=steps_note, ref_steps=args.ref_steps, ref_warm=args.ref_warm,
                visible_gpus=os.environ.get("CUDA_VISIBLE_DEVICES", "(unset: all)"),
                launch_env={k: v for k, v in base_env.items()
                            if k.startswith(("NCCL_", "FSDP_")) and k not in COMMON_ENV})
    runs, bw = [], {}

    def save(done):
        if args.dry_run:
            return
        with open(base + ".json.tmp", "w") as f:
            json.dump(dict(meta, complete=done, elapsed_s=time.time() - start, nccl_bw=bw, runs=runs,
                           rows=rows), f, indent=1)
        os.replace(base + ".json.tmp", base + ".json")
        with open(base + ".md.tmp", "w") as f:
            f.write(render(meta, rows, runs, bw, links, done))
        os.replace(base + ".md.tmp", base + ".md")
        if outdir:
            for ext in (".md", ".json"):
                try:
                    shutil.copyfile(base + ext, os.path.join(outdir, name + ext))
                except OSError as e:
                    print("links.py: cannot copy to $OUT: %s" % e, flush=True)

    def over_budget():
        return args.budget > 0 and time.time() - start >= args.budget

    def progress(link, label, what, t0):
        print("[%5.0fs] %-6s | %-50s | %-40s | %5.1f s" % (time.time() - start, link, label[:50], what[:60],
                                                          time.time() - t0), flush=True)

    workdir = tempfile.mkdtemp(prefix="links-metrics-") if not args.dry_run else "/tmp/links-metrics-XXXX"
    if args.dry_run:
        print("# common environment: %s" % " ".join("%s=%s" % kv for kv in sorted(COMMON_ENV.items())), flush=True)
    done = False
    traced_links = set()  # --trace: the links whose timeline is kept
    try:
        for link in links:
            runner.link_env = dict(LINKS[link])
            env = dict(base_env, **LINKS[link])
            if args.dry_run:
                print("\n## link %s (%s): %s" % (link, LINK_NAMES[link], " ".join(
                    "%s=%s" % kv for kv in sorted(LINKS[link].items())) or "no extra variable"), flush=True)
            if not args.no_bw:
                if args.dry_run:
                    print("# nccl_bw", flush=True)
                t0 = time.time()
                cmd = shlex.split(args.torchrun) + ["--nproc_per_node", str(args.gpus), args.nccl_bw]
                if over_budget():
                    bw[link] = dict(status="skipped (budget)")
                else:
                    bw[link] = dict(status="running")
                    save(False)
                    rc, out = runner(cmd, env, args.timeout)
                    res = parse_bw(out)
                    bw[link] = dict(command=runner.command, rc=rc, busbw=res, elapsed_s=time.time() - t0,
                                    status="ok" if res and rc == 0 else "timeout" if runner.timed_out else "failed")
                    if bw[link]["status"] != "ok":
                        bw[link].update(error=short_error(out), tail=out[-2000:])
                if not args.dry_run:
                    b = bw[link].get("busbw", {}).get(1024, {})
                    progress(link, "nccl_bw", "AG %s / RS %s GB/s at 1 GiB" % (
                        num(b.get("all_gather"), "%.1f"), num(b.get("reduce_scatter"), "%.1f"))
                        if bw[link]["status"] == "ok" else bw[link]["status"], t0)
                    save(False)
            for r in rows:
                if r["links"] and link not in r["links"]:
                    continue
                s = SUITES[r["suite"]]
                rec = dict(row=r["id"], suite=r["suite"], label=r["label"], program=r["program"], link=link,
                           model=s["model"], mbs=s["mbs"], seq=s["seq"], accum=s["accum"], gpus=args.gpus)
                if over_budget():
                    rec["status"] = "skipped (budget)"
                    runs.append(rec)
                    progress(link, r["label"], rec["status"], time.time())
                    save(False)
                    continue
                if args.dry_run:
                    print("# %s: %s" % (r["suite"], r["label"]), flush=True)
                rec["status"] = "running"
                runs.append(rec)
                save(False)
                t0 = time.time()
                c = dict(model=s["model"], label="%s-%s" % (link, r["label"]), mbs=s["mbs"], seq=s["seq"],
                         gpus=args.gpus)
                try:
                    if r["program"] == "fsdp":
                        flags = FSDP_COMMON + shlex.split(r["flags"])
                        if s["accum"] > 1:
                            flags += ["--grad-accum", str(s["accum"])]
                        if args.trace and link not in traced_links:
                            traced_links.add(link)
                            rec["trace_files"] = "%s-%s-trace.rank*.json" % (base, link)
                            flags += ["--trace", "%s-%s-trace.json" % (base, link)]
                        c.update(ours=flags, ref=None, steps=steps_of(r["suite"]))
                        res = compare.run_fsdp(c, args, env, workdir)
                    else:
                        c.update(ours=None, ref=shlex.split(r["flags"]))
                        res = compare.run_ref(c, args, env)
                except Exception as e:  # unreadable output (a metrics file cut short, say): this row only
                    res = dict(rc=None, error="links.py could not read the run: %s: %s" % (type(e).__name__, e))
                if args.dry_run:
                    runs.pop()
                    continue
                rec["elapsed_s"] = time.time() - t0
                rec["command"] = runner.command  # the command as run: the link's variables, -x, the launcher
                rec["rc"] = res.get("rc")
                for k in ("tps", "gib", "error", "dropout", "step_ms", "comm_wait_ms", "step_downs", "plan_gib"):
                    if k in res:
                        rec[k] = res[k]
                if r["program"] == "fsdp" and runner.metrics:
                    rec.update(parse_metrics(runner.metrics))
                    if outdir and rec.get("trace_files"):  # the GPU tool returns only what is under $OUT
                        for f in glob.glob(rec["trace_files"]):
                            shutil.copyfile(f, os.path.join(outdir, os.path.basename(f)))
                    try:
                        os.remove(runner.metrics)
                    except OSError:
                        pass
                elif "tps" in rec and rec["tps"]:
                    rec["step_ms_mean"] = 1000.0 * s["mbs"] * s["seq"] / rec["tps"]  # from the steady rate
                if runner.timed_out:
                    rec.update(status="timeout", error="timed out after %d s" % args.timeout)
                elif "tps" in rec and "error" not in rec:
                    rec["status"] = "ok"
                else:
                    rec["status"] = "failed"
                    rec.setdefault("error", short_error(runner.output or ""))
                if rec["status"] != "ok":
                    rec.pop("tps", None)
                    rec["tail"] = (runner.output or "")[-2000:]
                progress(link, r["label"], "%s tok/s/GPU" % thousands(rec["tps"]) if rec["status"] == "ok" else
                         rec["status"] + (": " + rec.get("error", "") if rec["status"] == "failed" else ""), t0)
                save(False)
        done = True
    finally:
        for rec in runs:
            if rec["status"] == "running":
                rec["status"] = "stopped (interrupted)"
        for b in bw.values():
            if b.get("status") == "running":
                b["status"] = "stopped (interrupted)"
        save(done)
        if not args.dry_run:
            shutil.rmtree(workdir, ignore_errors=True)
    if not args.dry_run:
        print("\n" + render(meta, rows, runs, bw, links, done).split("\n## Every run")[0])
        print("written: %s.md, .json, .log%s" % (base, " (and copied to $OUT)" if outdir else ""))


def on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")  # through main's finally: the run's processes ended, the results written


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        main()
    except KeyboardInterrupt:
        print("links.py: interrupted; the results so far are written", file=sys.stderr, flush=True)
        sys.exit(130)
