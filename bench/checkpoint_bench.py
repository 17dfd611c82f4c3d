#!/usr/bin/env python3
"""Checkpoint speed on a GPU host, against the disk's own speed measured with dd in the same call.

For each GPU count: dd writes and reads a file the size of Llama-3.2-1B's full training state
(weights and both Adam moments in fp32: 1.236e9 parameters x 12 bytes = 14.83 GB) in --dir, with the
page cache (conv=fsync, the file evicted before reading) and without it (oflag/iflag=direct). Then
fsdp.c trains Llama-3.2-1B with --ckpt-every and the script reads from its metrics (time_s of every
step) and log lines:

  - the pause: the wall time of the step during which each save starts, against the median of its
    neighbours (bar: at most 1 s longer). A save waits for the one before it (one snapshot buffer),
    so --every must give more time than one save's write (about 7.5 s at 2 GB/s; the default 50 steps
    of MBS 16 take about 12 s): a save that did wait is shown with its wait and left out of the bar;
  - the write: the save's own GB/s, from its start to its last byte on disk (bar: at least 80% of
    dd's write bandwidth, the better of the two dd variants);
  - the read: --resume of the last checkpoint, evicted from the page cache first, read and verified
    (bar: at least 80% of dd's read bandwidth, the better of the two).

Results: bench/results/DATE-DEVICE-checkpoint-NGPU.md (figures, bars, every exact command) and .json.

  . .gpu-host/env.sh                                      # on the GPU hosts (no package access)
  python3 bench/checkpoint_bench.py --gpus 1 --dir /path/on/the/disk/to/test
  python3 bench/checkpoint_bench.py --gpus 2 --dir ... --io direct,buffered   # both FSDP_CKPT_IO modes

Needs: the fsdp binary with the CUDA backend (--fsdp), mpirun, dd, python3 (standard library only),
about 3 x 15 GB free in --dir, and 2 x 15 GB of host memory per GPU for the pinned snapshots.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STATE_BYTES = 1235814400 * 12  # Llama-3.2-1B: parameters x (weight + 2 Adam moments) x 4 bytes


def sh(cmd, env=None, log=None):
    """Runs a command; returns (status, stdout + stderr), echoed as it comes so that a run stopped by a
    time limit still shows how far it got. Every command is recorded."""
    if log is not None:
        log.append(" ".join(shlex.quote(c) for c in cmd))
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        sys.stdout.write("  " + line)
        sys.stdout.flush()
    return p.wait(), "".join(lines)


def evict(path):
    """Drops a file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def dd_rate(output):
    m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", output)
    if not m:
        raise RuntimeError("dd printed no rate: " + output[-300:])
    return int(m.group(1)) / float(m.group(2)) / 1e9


def measure_dd(directory, size, log):
    path = os.path.join(directory, "dd-test.bin")
    bs = 16 << 20
    count = (size + bs - 1) // bs
    out = {}
    for name, flags in (("write_fsync", ["conv=fsync"]), ("write_direct", ["oflag=direct", "conv=fsync"])):
        rc, text = sh(["dd", "if=/dev/zero", "of=" + path, "bs=16M", "count=%d" % count] + flags, log=log)
        out[name] = dd_rate(text)
    evict(path)
    log.append("(the file evicted from the page cache with posix_fadvise DONTNEED)")
    rc, text = sh(["dd", "if=" + path, "of=/dev/null", "bs=16M"], log=log)
    out["read_cold"] = dd_rate(text)
    rc, text = sh(["dd", "if=" + path, "of=/dev/null", "bs=16M", "iflag=direct"], log=log)
    out["read_direct"] = dd_rate(text)
    os.unlink(path)
    return out


def train_cmd(args, gpus, extra):
    return ["mpirun", "-np", str(gpus), args.fsdp, "train", "--model", args.model, "--seq", str(args.seq), "--mbs",
            str(args.mbs), "--model-precision", "fp32", "--mixed-precision", "bf16", "--attn", "flash",
            "--strategy", "FULL", "--device", args.device, "--log-every", "1"] + extra


def pauses(steps, saves):
    """For each save started after step s: the wall time of step s+1 (it includes the pause) minus
    the median wall time of its neighbours s-1, s, s+2, s+3 (steps 1-2 and other save starts left out)."""
    times = {r["step"]: r["time_s"] for r in steps}
    wall = {s: times[s] - times[s - 1] for s in times if s - 1 in times}
    starts = {s + 1 for s in saves}
    rows = []
    for s in saves:
        if s + 1 not in wall:
            continue
        around = [wall[k] for k in (s - 1, s, s + 2, s + 3) if k in wall and k > 2 and k not in starts]
        if around:
            base = statistics.median(around)
            rows.append({"save_step": s, "step_s": wall[s + 1], "neighbours_s": base, "longer_s": wall[s + 1] - base})
    return rows


def run_one(args, gpus, io, dd, log):
    d = os.path.join(args.dir, "ckpt-bench-%dgpu-%s" % (gpus, io))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # FSDP_VERBOSE_CKPT: every rank says where its I/O threads' time went (system calls, conversion and
    # hashing, fsync), so that a transfer slower than dd shows whether it waited on the disk or the CPU.
    env = dict(os.environ, FSDP_CKPT_IO=io, FSDP_VERBOSE_CKPT="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ck, metrics = os.path.join(d, "ck"), os.path.join(d, "metrics.jsonl")
    rc, out = sh(train_cmd(args, gpus, ["--steps", str(args.steps), "--ckpt-every", str(args.every), "--ckpt-dir", ck,
                                         "--metrics", metrics]), env=env, log=log)
    if rc != 0:
        raise RuntimeError("the training run failed:\n" + out[-3000:])
    steps = [json.loads(l) for l in open(metrics) if '"summary"' not in l]
    breakdown = re.findall(r"^checkpoint I/O on rank .*$", out, re.M)
    saves = []
    for m in re.finditer(r"checkpoint: step (\d+) written to \S+: ([0-9.]+) (GB|MB) in ([0-9.]+) s \(([0-9.]+) GB/s\); "
                         r"training paused ([0-9.]+) s", out):
        saves.append({"step": int(m.group(1)), "gb": float(m.group(2)) / (1 if m.group(3) == "GB" else 1e3),
                      "write_s": float(m.group(4)), "write_gbps": float(m.group(5)), "paused_s": float(m.group(6))})
    # fsdp.c says when a save had to wait for the one before it (checkpoints asked for faster than the
    # disk writes them): such a step measures the disk, not the snapshot, and is shown apart.
    waited = {int(m.group(1)): float(m.group(2))
              for m in re.finditer(r"checkpoint: step (\d+) waited ([0-9.]+) s for the save of step", out)}
    for s in saves:
        s["waited_s"] = waited.get(s["step"], 0.0)
    # The last save is waited for at the end of the run; the others overlap training.
    started = [s["step"] for s in saves if s["step"] < args.steps]
    rows = pauses(steps, started)
    for r in rows:
        r["waited_s"] = waited.get(r["save_step"], 0.0)
    clean = [r for r in rows if r["waited_s"] == 0.0]
    final = os.path.join(ck, "step-%08d.h5" % args.steps)
    evict(final)
    log.append("(%s evicted from the page cache with posix_fadvise DONTNEED)" % final)
    rc, out = sh(train_cmd(args, gpus, ["--steps", str(args.steps), "--ckpt-dir", ck, "--resume", final]), env=env, log=log)
    m = re.search(r"resumed from \S+ at step \d+ .*: ([0-9.]+) (GB|MB) read and verified in ([0-9.]+) s \(([0-9.]+) GB/s\)", out)
    if rc != 0 or not m:
        raise RuntimeError("the resume failed:\n" + out[-3000:])
    read = {"gb": float(m.group(1)) / (1 if m.group(2) == "GB" else 1e3), "read_s": float(m.group(3)),
            "read_gbps": float(m.group(4))}
    breakdown += re.findall(r"^checkpoint I/O on rank .* read .*$", out, re.M)
    best_write, best_read = max(dd["write_fsync"], dd["write_direct"]), max(dd["read_cold"], dd["read_direct"])
    overlapped = [s for s in saves if s["step"] < args.steps]
    result = {
        "gpus": gpus, "io": io, "saves": saves, "pauses": rows, "resume": read, "io_breakdown": breakdown,
        "bars": {
            "pause_at_most_1s_longer": all(r["longer_s"] <= 1.0 for r in clean) and bool(clean),
            "write_at_least_80pct_of_dd": bool(overlapped) and min(s["write_gbps"] for s in overlapped) >= 0.8 * best_write,
            "read_at_least_80pct_of_dd": read["read_gbps"] >= 0.8 * best_read,
        },
        "write_fraction_of_dd": min(s["write_gbps"] for s in overlapped) / best_write if overlapped else None,
        "read_fraction_of_dd": read["read_gbps"] / best_read,
    }
    shutil.rmtree(d, ignore_errors=True)
    return result


def markdown(args, device, dd, results, log):
    lines = ["# Checkpoint speed, %s, %s" % (device, datetime.date.today().isoformat()), "",
             "%s, sequence %d, MBS %d per GPU, fp32 master weights, bf16 compute, FULL, device %s; --ckpt-every %d over "
             "%d steps. Directory: `%s`." % (args.model, args.seq, args.mbs, args.device, args.every, args.steps, args.dir),
             "", "## The disk, with dd (16 MiB blocks, %.2f GB)" % args.size_gb, "",
             "| write, page cache + fsync | write, O_DIRECT | read, evicted from the cache | read, O_DIRECT |", "|---|---|---|---|",
             "| %.2f GB/s | %.2f GB/s | %.2f GB/s | %.2f GB/s |" % (dd["write_fsync"], dd["write_direct"], dd["read_cold"],
                                                                 dd["read_direct"]), ""]
    for r in results:
        lines += ["## %d GPU(s), FSDP_CKPT_IO=%s" % (r["gpus"], r["io"]), "",
                  "| save at step | written in | GB/s | waited for the save before | training paused (wait + snapshot) "
                  "| step with the pause | its neighbours (median) | longer by |",
                  "|---|---|---|---|---|---|---|---|"]
        by_step = {p["save_step"]: p for p in r["pauses"]}
        for s in r["saves"]:
            p = by_step.get(s["step"])
            lines.append("| %d | %.1f s | %.2f | %.2f s | %.2f s | %s | %s | %s |" % (
                s["step"], s["write_s"], s["write_gbps"], s.get("waited_s", 0.0), s["paused_s"],
                "%.3f s" % p["step_s"] if p else "(end of run)",
                "%.3f s" % p["neighbours_s"] if p else "", "%.3f s" % p["longer_s"] if p else ""))
        b = r["bars"]
        lines += ["", "Resume: %.2f GB read and verified in %.1f s, %.2f GB/s." % (r["resume"]["gb"], r["resume"]["read_s"],
                                                                                r["resume"]["read_gbps"]), "",
                  "| bar | result |", "|---|---|",
                  "| the step during which a save starts is at most 1 s longer than its neighbours (saves that did "
                  "not wait for the one before) | %s |" %
                  ("met" if b["pause_at_most_1s_longer"] else "NOT met" if any(not p["waited_s"] for p in r["pauses"])
                   else "not measured: every save waited for the one before (raise --every)"),
                  "| the file is written at >= 80%% of dd's write bandwidth (the better variant) | %s (%.0f%%) |" %
                  ("met" if b["write_at_least_80pct_of_dd"] else "NOT met", 100 * (r["write_fraction_of_dd"] or 0)),
                  "| --resume reads at >= 80%% of dd's read bandwidth (the better variant) | %s (%.0f%%) |" %
                  ("met" if b["read_at_least_80pct_of_dd"] else "NOT met", 100 * r["read_fraction_of_dd"]), "",
                  "Where each rank's I/O threads spent their time (FSDP_VERBOSE_CKPT=1; saves in order, then the resume):",
                  "", "```"] + r.get("io_breakdown", []) + ["```", ""]
    lines += ["## Commands, in order", "", "```"] + log + ["```", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--dir", default=os.path.join(ROOT, "ckpt-bench"), help="a directory on the disk to measure")
    ap.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    ap.add_argument("--mbs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--every", type=int, default=50,
                    help="steps between saves: their time must exceed one save's write, or a save waits for the last")
    ap.add_argument("--io", default="direct", help="FSDP_CKPT_IO modes to run, comma-separated (direct, buffered)")
    # For a smoke test of this script without a GPU (tiny-llama on the CPU backend).
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size-gb", type=float, default=STATE_BYTES / 1e9, help="the dd file (the checkpoint's size)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    try:
        rc, gpu = sh(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    except OSError:
        rc, gpu = 1, ""
    device = gpu.splitlines()[0].strip() if rc == 0 and gpu.strip() else "cpu" if args.device == "cpu" else "unknown"
    log = []
    dd = measure_dd(args.dir, int(args.size_gb * 1e9), log)
    results = [run_one(args, args.gpus, io, dd, log) for io in args.io.split(",")]
    name = "%s-%s-checkpoint-%dgpu" % (datetime.date.today().isoformat(), re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-"),
                                       args.gpus)
    out = os.path.join(args.results, name)
    with open(out + ".json", "w") as f:
        json.dump({"device": device, "dd": dd, "results": results, "commands": log, "args": vars(args)}, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(args, device, dd, results, log))
    print(open(out + ".md").read())
    print("written: %s.md and .json" % out)
    return 0 if all(all(r["bars"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
