#!/usr/bin/env python3
"""The memory plan against the GPU: for each model, GPU count and strategy, `fsdp plan --json`
predicts the peak fsdp.c reserves (max_reserved_gib) at three micro-batch sizes and the largest
micro-batch that fits in the GPU; each configuration then runs for one step as its own process and
the table compares the prediction with the measured max_reserved_gib, and checks that the predicted
largest micro-batch trains and the next one up runs out of memory (one line, no CUDA dump).

  . .gpu-host/env.sh                       # on a GPU host without Jansson installed
  python3 bench/plan_vs_measured.py --gpus 1                         # the one-GPU sweep, ~5 min on an H200
  python3 bench/plan_vs_measured.py --gpus 2 --models llama1b,opt13b # two-GPU rows (only when 2 GPUs are visible)
  python3 bench/plan_vs_measured.py --gpus 2 --models llama2_7b --append bench/results/...-plan-vs-measured.json

On one GPU every strategy is the same computation (shard and replica groups of 1), so one row per
micro-batch stands for all three. Each run also reports the GPU memory outside fsdp.c's
allocations (CUDA context, NCCL, cuBLAS: total used minus max reserved, at the end of the run),
against the plan's estimate of it. Results: bench/results/DATE-DEVICE-plan-vs-measured[-TAG].md
and .json (the table, every command, the raw records), rewritten after every run.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = float(1 << 30)

# name: (preset, label, sequence, precision flags). Llama-2-7B trains with a bf16 model (the course's
# last rung): with fp32 master weights its states alone take 121 GiB on one GPU.
MODELS = {
    "llama1b": ("llama-3.2-1b", "Llama-3.2-1B", 1024, ["--model-precision", "fp32", "--mixed-precision", "bf16"]),
    "opt13b": ("opt-1.3b", "OPT-1.3B", 1024, ["--model-precision", "fp32", "--mixed-precision", "bf16"]),
    "llama2_7b": ("llama-2-7b", "Llama-2-7B", 1024, ["--model-precision", "bf16", "--mixed-precision", "bf16"]),
    # For trying the script on the CPU backend (--device cpu --gpu-mem GiB): not part of the sweep.
    "tiny_llama": ("tiny-llama", "tiny-llama", 64, ["--model-precision", "fp32", "--mixed-precision", "bf16"]),
}
SWEEP = ("llama1b", "opt13b", "llama2_7b")
STRATEGIES = ("FULL", "SHARD_GRAD_OP", "NO_SHARD")


def run(cmd, env, timeout):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, str(e.stdout or ""), str(e.stderr or "")


def plan(args, env, model, gpus, strategy, mbs):
    preset, _, seq, flags = MODELS[model]
    cmd = [args.fsdp, "plan", "--model", preset, "--gpus", str(gpus), "--strategy", strategy, "--mbs", str(mbs),
           "--seq", str(seq), "--device", args.device, "--json"] + flags + shlex.split(args.extra)
    if args.gpu_mem:
        cmd += ["--gpu-mem", str(args.gpu_mem)]
    rc, out, err = run(cmd, env, 120)
    if rc != 0:
        raise SystemExit("plan_vs_measured.py: fsdp plan failed: %s" % err.strip())
    return json.loads(out), " ".join(shlex.quote(c) for c in cmd)


def train(args, env, model, gpus, strategy, mbs, workdir):
    preset, _, seq, flags = MODELS[model]
    metrics = os.path.join(workdir, "%s-%d-%s-%d.jsonl" % (model, gpus, strategy, mbs))
    if os.path.exists(metrics):
        os.remove(metrics)
    launch = ["mpirun", "-np", str(gpus), "--bind-to", "none"] if gpus > 1 else []
    cmd = launch + [args.fsdp, "train", "--model", preset, "--strategy", strategy, "--mbs", str(mbs), "--seq", str(seq),
                    "--steps", str(args.steps), "--device", args.device, "--lr", "1e-5", "--metrics", metrics] + flags + \
        shlex.split(args.extra)
    if args.gpu_mem:
        cmd += ["--memory-limit", str(args.gpu_mem)]
    rc, out, err = run(cmd, env, args.timeout)
    rec = dict(command=" ".join(shlex.quote(c) for c in cmd), rc=rc)
    summary = None
    if os.path.exists(metrics):
        for line in open(metrics):
            obj = json.loads(line)
            if obj.get("summary"):
                summary = obj
    if rc == 0 and summary:
        rec.update(max_reserved_bytes=summary["max_reserved_bytes"], plan_reserved_bytes=summary["plan_reserved_bytes"],
                   outside_gib=summary.get("outside_gib"), plan_outside_gib=summary.get("plan_outside_gib"),
                   outside_context_gib=summary.get("outside_context_gib"),
                   outside_comm_init_gib=summary.get("outside_comm_init_gib"))
    else:
        ours = [l for l in err.splitlines() if l.startswith("fsdp:")]
        rec["oom"] = any(re.search(r"out of (GPU|device) memory", l) for l in ours)
        rec["error"] = ours[0][:600] if ours else (err.strip().splitlines() or ["failed"])[-1][:300]
        # One line from fsdp.c, and nothing of CUDA's own: the out-of-memory must read as one line.
        rec["one_line"] = len(ours) == 1 and not re.search(r"cudaMalloc|CUDA error|cudaError|Traceback", err)
        rec["tail"] = err[-1500:]
    return rec


def pick_mbs(largest, count):
    """`count` micro-batch sizes up to the largest that fits, spread out, the largest included."""
    if largest <= count:
        return list(range(1, largest + 1))
    picks = sorted({max(1, round(largest * (k + 1) / count)) for k in range(count)})
    return picks


def fmt_row(r):
    if r["kind"] == "size":
        m = r["measured"]
        if "max_reserved_bytes" not in m:
            return "| %s | %d | %s | %d | %.2f | failed: %s | | | |" % (
                r["label"], r["gpus"], r["strategy"], r["mbs"], r["plan_gib"], m.get("error", "")[:120])
        meas = m["max_reserved_bytes"] / GIB
        err = 100.0 * (r["plan_gib"] - meas) / meas
        outside = ""
        if m.get("outside_gib") is not None:
            outside = "%.2f / %.2f (context %.2f, NCCL at creation %.2f)" % (
                m["outside_gib"], m["plan_outside_gib"], m.get("outside_context_gib") or 0.0,
                m.get("outside_comm_init_gib") or 0.0)
        ok = "yes" if abs(err) <= 5.0 else "NO"
        return "| %s | %d | %s | %d | %.2f | %.2f | %+.2f%% | %s | %s |" % (
            r["label"], r["gpus"], r["strategy"], r["mbs"], r["plan_gib"], meas, err, ok, outside)
    fit = r["largest"]
    up = r["next"]
    fits = "trains" if "max_reserved_bytes" in fit else "FAILED: %s" % fit.get("error", "")[:100]
    if "max_reserved_bytes" in up:
        nxt = "TRAINS (the plan said it does not fit)"
    elif up.get("oom"):
        nxt = "out of memory%s" % ("" if up.get("one_line") else " (NOT one line)")
    else:
        nxt = "failed otherwise: %s" % up.get("error", "")[:100]
    return "| %s | %d | %s | %d (%.2f GiB) | %s | %d: %s |" % (r["label"], r["gpus"], r["strategy"], r["mbs"],
                                                               r["plan_total_gib"], fits, r["mbs"] + 1, nxt)


def write(base, meta, rows):
    with open(base + ".json", "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    sizes = [r for r in rows if r["kind"] == "size"]
    fits = [r for r in rows if r["kind"] == "fit"]
    lines = ["# Memory plan against the GPU: %s, %s" % (meta["device"], meta["date"]), "",
             "Predicted (`fsdp plan --json`, bytes.reserved) against measured `max_reserved_gib` after one step "
             "(`fsdp train ... --metrics`, max_reserved_bytes). Outside: GPU memory in use besides fsdp.c's "
             "allocations at the end of the run (CUDA context, NCCL, cuBLAS), measured / the plan's estimate, and of "
             "the measured: in use once the backend was created, and added by creating the NCCL communicators. "
             "GPU memory: %.2f GiB per GPU%s." % (meta["gpu_mem_gib"], " (--memory-limit)" if meta["memory_limit"] else ""),
             "", "| model | GPUs | strategy | MBS | plan GiB | measured GiB | error | within 5% | outside GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [fmt_row(r) for r in sizes]
    lines += ["", "The largest micro-batch the plan fits (reserved + outside estimate <= GPU memory), run, and the next "
              "one up:", "", "| model | GPUs | strategy | predicted largest MBS | it | next one up |", "|---|---|---|---|---|---|"]
    lines += [fmt_row(r) for r in fits]
    lines += ["", "Commands:", ""]
    for r in rows:
        for key in ("plan_command",):
            if key in r:
                lines.append("    " + r[key])
        for m in ([r["measured"]] if r["kind"] == "size" else [r["largest"], r["next"]]):
            lines.append("    " + m["command"])
    text = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(text)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=1, help="GPUs per run (1 or 2)")
    p.add_argument("--models", default=",".join(SWEEP), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="with --gpus 2 (one GPU: FULL stands for all)")
    p.add_argument("--sizes", type=int, default=3, help="micro-batch sizes per configuration")
    p.add_argument("--steps", type=int, default=1, help="steps per run (every allocation is made before the first)")
    p.add_argument("--gpu-mem", type=float, default=0.0,
                   help="GiB per GPU to fit into (plan --gpu-mem, train --memory-limit); 0 = the GPU's memory")
    p.add_argument("--no-fit", action="store_true", help="skip the largest / next-one-up runs")
    p.add_argument("--extra", default="", help="flags added to every plan and train command (shell syntax)")
    p.add_argument("--append", default="", help="a result .json of an earlier call: its rows come first")
    p.add_argument("--tag", default="", help="added to the result file names")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: try the script on the CPU backend (needs --gpu-mem; tiny_llama)")
    p.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args()
    if not os.path.exists(args.fsdp):
        raise SystemExit("plan_vs_measured.py: %s not found (build first)" % args.fsdp)
    models = [m for m in args.models.split(",") if m]
    strategies = [s for s in args.strategies.split(",") if s] if args.gpus > 1 else ["FULL"]
    for m in models:
        if m not in MODELS:
            raise SystemExit("plan_vs_measured.py: unknown model %r (%s)" % (m, ", ".join(MODELS)))

    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    if args.device == "cuda":
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip().splitlines()
        except OSError:
            smi = []
        if len(smi) < args.gpus:
            raise SystemExit("plan_vs_measured.py: %d GPU(s) visible, --gpus %d needs more" % (len(smi), args.gpus))
        device = smi[0].strip()
    elif not args.gpu_mem:
        raise SystemExit("plan_vs_measured.py: --device cpu needs --gpu-mem GiB (the CPU backend's --memory-limit)")
    else:
        device = "cpu backend"

    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    name = "%s-%s-plan-vs-measured" % (stamp, re.sub(r"\W+", "-", device).strip("-").lower())
    base = os.path.join(args.out, name + ("-" + re.sub(r"\W+", "-", args.tag) if args.tag else ""))
    os.makedirs(args.out, exist_ok=True)
    rows = json.load(open(args.append))["rows"] if args.append else []
    workdir = tempfile.mkdtemp(prefix="plan-vs-measured-")
    meta = dict(device=device, date=stamp, gpu_mem_gib=0.0, memory_limit=bool(args.gpu_mem),
                command=" ".join(shlex.quote(a) for a in sys.argv), nccl_env={k: v for k, v in env.items()
                                                                               if k.startswith(("NCCL_", "FSDP_"))})
    text = ""
    for model in models:
        for strategy in strategies:
            auto, auto_cmd = plan(args, env, model, args.gpus, strategy, "auto")
            meta["gpu_mem_gib"] = auto["gpu_mem_gib"]
            largest = auto["mbs"]
            for mbs in pick_mbs(largest, args.sizes):
                pl, pcmd = plan(args, env, model, args.gpus, strategy, mbs)
                rows.append(dict(kind="size", model=model, label=MODELS[model][1], gpus=args.gpus, strategy=strategy,
                                 mbs=mbs, plan_gib=pl["bytes"]["reserved"] / GIB, plan_total_gib=pl["total_gib"],
                                 plan_command=pcmd, measured=train(args, env, model, args.gpus, strategy, mbs, workdir)))
                text = write(base, meta, rows)
            if args.no_fit:
                continue
            at_largest = next((r["measured"] for r in rows if r["kind"] == "size" and r["model"] == model
                               and r["gpus"] == args.gpus and r["strategy"] == strategy and r["mbs"] == largest), None)
            rows.append(dict(kind="fit", model=model, label=MODELS[model][1], gpus=args.gpus, strategy=strategy,
                             mbs=largest, plan_total_gib=auto["total_gib"], plan_command=auto_cmd,
                             largest=at_largest or train(args, env, model, args.gpus, strategy, largest, workdir),
                             next=train(args, env, model, args.gpus, strategy, largest + 1, workdir)))
            text = write(base, meta, rows)
    print("\n" + text)
    print("written: %s.md, %s.json" % (base, base))


if __name__ == "__main__":
    main()
