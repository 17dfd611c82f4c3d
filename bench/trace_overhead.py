#!/usr/bin/env python3
"""What `fsdp train --trace` costs a step (the bar: under 1%): the same run with and without --trace,
alternated --pairs times so that drift of the GPUs' clocks falls on both, every step of the window
traced (--trace-steps 3:STEPS). Reports the median step time of steps 3..STEPS of each run, the
medians over the pairs, the overhead, and the traced runs' timeline summary (busy time per stream,
communication hidden under compute, the measured comm wait beside it). Results go to
bench/results/DATE-DEVICE-trace-overhead[-TAG].md and .json (and $OUT when set).

  python3 bench/trace_overhead.py                                  # 2 GPUs, Llama-3.2-1B, MBS 16, seq 1024
  python3 bench/trace_overhead.py --gpus 2 --model llama-2-7b --mbs 8 --seq 512 --steps 8 --pairs 2

Needs build/fsdp with the CUDA backend and mpirun; the standard library only."""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
        return out[0] if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def one_run(args, workdir, traced, index):
    metrics = os.path.join(workdir, "m-%s-%d.jsonl" % ("on" if traced else "off", index))
    cmd = ["mpirun", "-np", str(args.gpus), "--bind-to", "none", args.fsdp, "train", "--model", args.model, "--seq",
           str(args.seq), "--mbs", str(args.mbs), "--steps", str(args.steps), "--lr", "1e-5", "--device", "cuda",
           "--log-every", str(args.steps), "--metrics", metrics] + args.extra.split()
    if traced:
        cmd += ["--trace", os.path.join(workdir, "trace-%d.json" % index), "--trace-steps", "3:%d" % args.steps]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", NCCL_NVLS_ENABLE="0")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit("trace_overhead.py: failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-2000:] +
                                                                     p.stderr[-2000:]))
    steps, summary = [], None
    for line in open(metrics):
        rec = json.loads(line)
        if rec.get("summary"):
            summary = rec
        else:
            steps.append(rec)
    window = [r["step_ms"] for r in steps if r["step"] >= 3]
    return dict(command=" ".join(cmd), median_step_ms=statistics.median(window), step_ms=[r["step_ms"] for r in steps],
                comm_wait_ms=[r.get("comm_wait_ms") for r in steps], trace=(summary or {}).get("trace"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--mbs", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--extra", default="", help="flags added to every run (e.g. '--strategy SHARD_GRAD_OP')")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--tag", default="")
    args = p.parse_args()
    if args.steps < 4:
        raise SystemExit("trace_overhead.py: --steps must be at least 4 (steps 3.. are compared)")
    workdir = tempfile.mkdtemp(prefix="trace-overhead-")
    runs = []
    try:
        for i in range(args.pairs):
            for traced in (False, True) if i % 2 == 0 else (True, False):
                r = one_run(args, workdir, traced, i)
                r.update(traced=traced, pair=i)
                runs.append(r)
                print("pair %d %-9s median step %.2f ms" % (i, "traced" if traced else "untraced", r["median_step_ms"]),
                      flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    on = statistics.median(r["median_step_ms"] for r in runs if r["traced"])
    off = statistics.median(r["median_step_ms"] for r in runs if not r["traced"])
    overhead = 100.0 * (on - off) / off
    device = device_name()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    name = "%s-%s-trace-overhead%s" % (stamp, "-".join(device.lower().split()),
                                        "-" + args.tag if args.tag else "")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, name)
    result = dict(device=device, date=stamp, args=vars(args), median_step_ms_traced=on, median_step_ms_untraced=off,
                  overhead_pct=overhead, runs=runs)
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    L = ["# --trace overhead: %s x %d, %s MBS %d seq %d %s" % (device, args.gpus, args.model, args.mbs, args.seq,
                                                             args.extra), "",
         "Median over %d pairs of each run's median step time (steps 3-%d, all traced in the traced runs): "
         "**%.2f ms traced, %.2f ms untraced: %+.2f%%** (the bar: under 1%%)." % (args.pairs, args.steps, on, off,
                                                                                 overhead), "",
         "| pair | traced | median step ms | compute | gather | reduce | communication | hidden | exposed | "
         "comm wait |", "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in runs:
        tr = r["trace"] or {}
        busy = tr.get("busy_ms", {})
        cells = ["%.2f" % busy[k] if k in busy else "-" for k in ("compute", "gather", "reduce")]
        cells += ["%.2f" % tr["comm_ms"] if "comm_ms" in tr else "-",
                  "%.0f%%" % (100 * tr["overlap"]) if tr.get("overlap") is not None else "-",
                  "%.2f" % tr["exposed_ms"] if "exposed_ms" in tr else "-",
                  "%.2f" % tr["comm_wait_ms"] if "comm_wait_ms" in tr else "-"]
        L.append("| %d | %s | %.2f | %s |" % (r["pair"], "yes" if r["traced"] else "no", r["median_step_ms"],
                                              " | ".join(cells)))
    L += ["", "Timeline figures are per step, the ranks' mean (docs/FORMATS.md, \"Trace files\").", ""]
    with open(base + ".md", "w") as f:
        f.write("\n".join(L))
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        for ext in (".md", ".json"):
            shutil.copyfile(base + ext, os.path.join(out, name + ext))
    print("\n".join(L))
    print("written: %s.md, .json" % base)


if __name__ == "__main__":
    sys.exit(main())
