#!/usr/bin/env python3
"""Runs fsdp.c and the PyTorch reference (torch_bench.py) on the same GPU host in the same call and
prints one table: model, configuration, tokens/s/GPU, TFLOP/s, MFU (of 989 TFLOP/s), peak reserved
GiB, and the ratio of fsdp.c to the reference's same configuration. Results (the table, every exact
command, and the raw records) go to bench/results/DATE-DEVICE-SUITE.md and .json.

  python3 bench/compare.py --suite headline            # Llama-3.2-1B and OPT-1.3B, best recipe each
  python3 bench/compare.py --suite ladder              # the course's ladder, both models
  python3 bench/compare.py --suite fsdp2 --gpus 2      # 1 and 2 GPUs, FULL / SHARD_GRAD_OP / NO_SHARD
  python3 bench/compare.py --suite scaling --gpus 8    # Llama-3.2-1B and Llama-2-7B, every strategy, 1 and 8 GPUs
  python3 bench/compare.py --suite headline --only fsdp   # skip the reference (no ratios)
  python3 bench/compare.py --suite recompute --gpus 2 --only fsdp   # activation recomputation (fsdp.c only)

Each row is one run of each program; both report steady-state throughput (fsdp.c: every step but
the first; torch_bench.py: after its warm-up steps).

OPT trains with dropout on both sides: the reference's OPTConfig has transformers' defaults (dropout
0.1 on the attention and MLP outputs, attention_dropout 0.0) and the HF Trainer and the FSDP loop
train in training mode; fsdp.c's opt-1.3b preset has the same rates (facebook/opt-1.3b's
config.json), which `fsdp train` applies unless told otherwise, and its run line says "dropout 0.1 on
attention and MLP outputs". `--no-opt-dropout` adds `--dropout 0` to fsdp.c's OPT rows (the
reference keeps its 0.1: that ratio is not like for like, it shows what dropout costs fsdp.c).

Needs: build/fsdp (CUDA backend), mpirun,
python3 with PyTorch and transformers (the GPU hosts have them), torch_bench.py (--reference).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEAK = 989.0  # dense bf16 TFLOP/s of an H100/H200 SXM, the MFU denominator

MODELS = {"llama1b": ("llama-3.2-1b", "Llama-3.2-1B"), "opt13b": ("opt-1.3b", "OPT-1.3B"),
          "llama2_7b": ("llama-2-7b", "Llama-2-7B")}


def row(model, label, mbs, ours, ref, seq=1024, gpus=1, steps=None):
    return dict(model=model, label=label, mbs=mbs, ours=ours, ref=ref, seq=seq, gpus=gpus, steps=steps)


def suite(name, args):
    """(model, label, mbs, fsdp.c flags, torch_bench flags) for every row of a suite."""
    best = ["--model-precision", "fp32", "--mixed-precision", "bf16", "--attn", "flash"]
    if name == "headline":
        return [row("llama1b", "bf16 mixed, flash; reference torch.compile", 32, best,
                    ["hf", "--prec", "bf16", "--amp", "bf16", "--attn", "sdpa", "--compile"]),
                row("opt13b", "bf16 mixed, flash, dropout 0.1; reference torch.compile", 24, best,
                    ["hf", "--prec", "bf16", "--amp", "bf16", "--attn", "sdpa", "--compile"])]
    if name == "ladder":
        rows = []
        for model, base_mbs in (("llama1b", 6), ("opt13b", 4)):
            rungs = [("fp32, eager (course task 1)", base_mbs, ["--model-precision", "fp32", "--mixed-precision", "no",
                                                                 "--attn", "eager"], ["--prec", "fp32", "--amp", "no", "--attn", "eager"]),
                     ("fp32 + bf16 mixed precision, eager", base_mbs, ["--model-precision", "fp32", "--mixed-precision",
                                                                       "bf16", "--attn", "eager"], ["--prec", "fp32", "--amp", "bf16", "--attn", "eager"]),
                     ("bf16 model, eager", base_mbs, ["--model-precision", "bf16", "--mixed-precision", "bf16", "--attn",
                                                      "eager"], ["--prec", "bf16", "--amp", "bf16", "--attn", "eager"]),
                     ("bf16 model, flash / sdpa", base_mbs, ["--model-precision", "bf16", "--mixed-precision", "bf16",
                                                             "--attn", "flash"], ["--prec", "bf16", "--amp", "bf16", "--attn", "sdpa"]),
                     ("bf16 model, flash, fused kernels / torch.compile", base_mbs,
                      ["--model-precision", "bf16", "--mixed-precision", "bf16", "--attn", "flash"],
                      ["--prec", "bf16", "--amp", "bf16", "--attn", "sdpa", "--compile"]),
                     ("bf16 model, flash, largest micro-batch", 32 if model == "llama1b" else 24,
                      ["--model-precision", "bf16", "--mixed-precision", "bf16", "--attn", "flash"],
                      ["--prec", "bf16", "--amp", "bf16", "--attn", "sdpa", "--compile"])]
            for label, mbs, ours, ref in rungs:
                rows.append(row(model, label, mbs, ours, ["hf"] + ref))
        return rows
    if name == "scaling":
        # The issue-4 matrix: both models, every strategy, 1 GPU and --gpus GPUs (HYBRID emulates two
        # nodes with --ranks-per-node); Llama-2-7B at sequence 512 as in the course's report.
        rows = []
        for model, mbs, seq in (("llama1b", 16, 1024), ("llama2_7b", 8, 512)):
            for gpus in (1, args.gpus):
                for strategy in ("FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"):
                    if gpus == 1 and strategy != "FULL":
                        continue  # on one GPU every strategy is the same computation
                    ours = best + ["--strategy", strategy]
                    if strategy == "HYBRID":
                        ours += ["--ranks-per-node", str(max(1, gpus // 2))]
                    torch_strategy = {"FULL": "FULL_SHARD"}.get(strategy, strategy)
                    ref = None if strategy == "HYBRID" else ["fsdp", "--strategy", torch_strategy, "--attn", "sdpa"]
                    rows.append(row(model, "%s, %d GPU(s)" % (strategy, gpus), mbs, ours, ref, seq=seq, gpus=gpus))
        return rows
    if name == "recompute":
        # --recompute none / selective / full: at the same micro-batch (what recomputation costs in
        # throughput) and at the largest micro-batch each fits (--mbs auto: what it buys). Then the
        # issue's bar: Llama-2-7B at sequence 4096 on --gpus GPUs with --recompute full, against none
        # at the same micro-batch and at full's largest. fsdp.c only: the reference has no checkpointing.
        rows = []
        for mode in ("none", "selective", "full"):
            rows.append(row("llama1b", "--recompute %s, micro-batch 32" % mode, 32, best + ["--recompute", mode], None))
        for mode in ("none", "selective", "full"):
            rows.append(row("llama1b", "--recompute %s, largest micro-batch" % mode, "auto",
                            best + ["--recompute", mode], None))
        for mode in ("none", "selective", "full"):
            rows.append(row("llama2_7b", "--recompute %s, sequence 4096, FULL" % mode, 4,
                            best + ["--recompute", mode, "--strategy", "FULL"], None, seq=4096, gpus=args.gpus,
                            steps=8))
        rows.append(row("llama2_7b", "--recompute full, sequence 4096, FULL, largest micro-batch", "auto",
                        best + ["--recompute", "full", "--strategy", "FULL"], None, seq=4096, gpus=args.gpus, steps=5))
        # What recomputation costs where every mode fits: with a bf16 model (the course's last rung)
        # Llama-2-7B at sequence 4096 trains without it at micro-batch 2 on two 80 GB GPUs.
        bf16 = ["--model-precision", "bf16", "--mixed-precision", "bf16", "--attn", "flash"]
        for mode in ("none", "selective", "full"):
            rows.append(row("llama2_7b", "bf16 model, --recompute %s, sequence 4096, FULL" % mode, 2,
                            bf16 + ["--recompute", mode, "--strategy", "FULL"], None, seq=4096, gpus=args.gpus, steps=8))
        return rows
    if name == "fsdp2":
        rows = []
        for gpus in (1, args.gpus):
            for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
                rows.append(row("llama1b", "%s, %d GPU(s)" % (strategy, gpus), 16, best + ["--strategy", strategy],
                                ["fsdp", "--strategy", strategy, "--attn", "sdpa"], gpus=gpus))
        return rows
    raise SystemExit("unknown suite %r (headline, ladder, fsdp2, scaling, recompute)" % name)


def run(cmd, env, timeout):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else str(e.stdout or "")


def run_fsdp(r, args, env, workdir):
    metrics = os.path.join(workdir, "fsdp-%s-%s-%d-%s.jsonl" % (r["model"], r["mbs"], r["gpus"],
                                                               re.sub(r"\W+", "_", r["label"])[:40]))
    if os.path.exists(metrics):
        os.remove(metrics)
    # A row that sets its own micro-batch (--mbs auto) replaces the suite's.
    mbs = [] if "--mbs" in r["ours"] else ["--mbs", str(r["mbs"])]
    cmd = ["mpirun", "-np", str(r["gpus"]), "--bind-to", "none", args.fsdp, "train", "--model", MODELS[r["model"]][0],
           "--seq", str(r["seq"])] + mbs + ["--steps", str(r.get("steps") or args.steps), "--lr", "1e-5",
           "--device", "cuda", "--log-every", "5", "--metrics", metrics] + r["ours"] + shlex.split(args.extra)
    rc, out = run(cmd, env, args.timeout)
    rec = dict(command=" ".join(shlex.quote(c) for c in cmd), rc=rc)
    applied = re.search(r"\| dropout (.*)$", out, re.M)  # the run line: the rates in effect
    if applied:
        rec["dropout"] = applied.group(1).strip()
    summary, step_ms, wait_ms = None, [], []
    if os.path.exists(metrics):
        for line in open(metrics):
            obj = json.loads(line)
            if obj.get("summary"):
                summary = obj
            elif "step_ms" in obj:
                step_ms.append(obj["step_ms"])
                wait_ms.append(obj.get("comm_wait_ms", 0.0))
    if rc == 0 and summary:
        rec.update(tps=summary["tokens_per_s_per_gpu"], gib=summary["max_reserved_gib"], mbs=summary.get("mbs"),
                   plan_gib=summary.get("plan_reserved_bytes", 0) / float(1 << 30),
                   step_downs=summary.get("step_downs", 0))
        # Per-step times (the first, untimed step included) show how much a figure varies.
        rec.update(step_ms=step_ms, comm_wait_ms=wait_ms)
    else:
        # fsdp.c's own line says what failed; mpirun's notes that follow it do not.
        ours = [l for l in out.splitlines() if l.startswith("fsdp:")]
        rec["error"] = "OOM" if "out of GPU memory" in out else (ours or out.strip().splitlines() or ["failed"])[0][:300]
        rec["tail"] = out[-2000:]
    return rec


def run_ref(r, args, env):
    if r["gpus"] > 1 or r["ref"][0] == "fsdp":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(r["gpus"]), args.reference]
    else:
        cmd = [sys.executable, args.reference]
    cmd += r["ref"] + ["--model", r["model"], "--mbs", str(r["mbs"]), "--seq", str(r["seq"]), "--steps",
                       str(args.ref_steps), "--warm", str(args.ref_warm)]
    rc, out = run(cmd, env, args.timeout)
    rec = dict(command=" ".join(shlex.quote(c) for c in cmd), rc=rc)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            if "error" in res:
                rec["error"] = res["error"]
            else:
                rec.update(tps=res["tps_steady"], gib=res["max_reserved_gib"])
    if "tps" not in rec and "error" not in rec:
        rec["error"] = out.strip().splitlines()[-1][:300] if out.strip() else "failed"
        rec["tail"] = out[-2000:]
    return rec


def flops_per_token(model, seq):
    # The reference's formula: 6 x matrix-product parameters (LM head once) + 6 x layers x hidden x seq.
    if model == "llama1b":
        d, L, ff, v, kv = 2048, 16, 8192, 128256, 512
        n = L * (2 * d * d + 2 * d * kv + 3 * d * ff) + d * v
    elif model == "llama2_7b":
        d, L, ff, v = 4096, 32, 11008, 32000
        n = L * (4 * d * d + 3 * d * ff) + d * v
    else:
        d, L, ff, v = 2048, 24, 8192, 50272
        n = L * (4 * d * d + 2 * d * ff) + d * v
    return 6 * n + 6 * L * d * seq


def fmt(rec, model, seq):
    if "tps" not in rec:
        return [rec.get("error", "-")[:24], "-", "-", "-"]
    tflops = rec["tps"] * flops_per_token(model, seq) / 1e12
    return ["%.0f" % rec["tps"], "%.0f" % tflops, "%.1f%%" % (100 * tflops / PEAK), "%.1f" % rec["gib"]]


def write_results(base, args, device, stamp, env, results, done):
    head = ["model", "configuration", "GPUs", "MBS", "fsdp.c tok/s/GPU", "TFLOP/s", "MFU", "GiB",
            "reference tok/s/GPU", "TFLOP/s", "MFU", "GiB", "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        ours, ref = res["fsdp"], res["reference"]
        ratio = "%.2fx" % (ours["tps"] / ref["tps"]) if "tps" in ours and "tps" in ref else "-"
        mbs = str(ours.get("mbs") or res["mbs"])  # --mbs auto: the one chosen
        lines.append("| " + " | ".join([MODELS[res["model"]][1], res["label"], str(res["gpus"]), mbs] +
                                       fmt(ours, res["model"], res["seq"]) + fmt(ref, res["model"], res["seq"]) +
                                       [ratio]) + " |")
    table = "\n".join(lines)
    command = " ".join(shlex.quote(a) for a in sys.argv)
    nccl = {k: v for k, v in env.items() if k.startswith(("NCCL_", "FSDP_"))}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset: all)")
    with open(base + ".json", "w") as f:
        json.dump(dict(device=device, date=stamp, visible_gpus=visible, nccl_env=nccl, command=command,
                       complete=done, results=results), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write("# %s suite on %s, %s\n\n" % (args.suite, device, stamp))
        f.write("Command: `%s`\n\n" % command)
        extra = dict(nccl, CUDA_VISIBLE_DEVICES=visible)
        f.write("Environment: %s\n\n" % ", ".join("`%s=%s`" % kv for kv in sorted(extra.items())))
        if not done:
            f.write("**Incomplete: the run stopped before its last row.**\n\n")
        f.write("Both programs ran in this call on this device, one after the other. Throughput is steady state; "
                "TFLOP/s uses the reference's formula; MFU is against %.0f TFLOP/s.\n\n" % PEAK)
        f.write(table + "\n\n## Exact commands\n\n")
        for res in results:
            for side in ("fsdp", "reference"):
                if res[side].get("command"):
                    f.write("- `%s`\n" % res[side]["command"])
    return table


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="headline", help="headline, ladder or fsdp2")
    p.add_argument("--gpus", type=int, default=2, help="GPUs for the fsdp2 suite")
    p.add_argument("--only", choices=["both", "fsdp", "reference"], default="both")
    p.add_argument("--rows", default="", help="comma-separated row numbers to run (default all)")
    p.add_argument("--model", default="", help="run only this model's rows: " + ", ".join(MODELS))
    p.add_argument("--no-opt-dropout", action="store_true",
                   help="fsdp.c's OPT rows without dropout (--dropout 0); the reference keeps transformers' 0.1")
    p.add_argument("--extra", default="", help="flags added to every fsdp.c command (quoted, shell syntax)")
    p.add_argument("--tag", default="", help="added to the result file names (runs that share a date and suite)")
    p.add_argument("--steps", type=int, default=12, help="fsdp.c steps per run (the first is not timed)")
    p.add_argument("--ref-steps", type=int, default=20)
    p.add_argument("--ref-warm", type=int, default=5)
    p.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    p.add_argument("--reference", default=os.path.join(ROOT, "..", "shared", "reference", "torch_bench.py"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    if not os.path.exists(args.fsdp):
        raise SystemExit("compare.py: %s not found (build first)" % args.fsdp)
    if args.only != "fsdp" and not os.path.exists(args.reference):
        raise SystemExit("compare.py: reference %s not found (--reference)" % args.reference)

    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    try:
        device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                text=True).stdout.strip().splitlines()
    except OSError:
        device = []
    device = device[0] if device else "unknown GPU"
    os.makedirs(args.out, exist_ok=True)
    rows = suite(args.suite, args)
    if args.no_opt_dropout:
        for r in rows:
            if r["model"] == "opt13b":
                r["ours"] = r["ours"] + ["--dropout", "0"]
                r["label"] = r["label"].replace(", dropout 0.1", "") + " (fsdp.c without dropout; reference 0.1)"
    if args.model:
        if args.model not in MODELS:
            raise SystemExit("compare.py: unknown --model %r (%s)" % (args.model, ", ".join(MODELS)))
        rows = [r for r in rows if r["model"] == args.model]
    if args.rows:
        keep = {int(x) for x in args.rows.split(",")}
        rows = [r for i, r in enumerate(rows) if i in keep]
    if not rows:
        raise SystemExit("compare.py: no rows selected (--model / --rows)")

    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    name = "%s-%s-%s" % (stamp, re.sub(r"\W+", "-", device).strip("-").lower(), args.suite)
    base = os.path.join(args.out, name + ("-" + re.sub(r"\W+", "-", args.tag) if args.tag else ""))
    results = []
    for i, r in enumerate(rows):
        ours = run_fsdp(r, args, env, args.out) if args.only != "reference" else {}
        ref = run_ref(r, args, env) if args.only != "fsdp" and r["ref"] else {}
        results.append(dict(r, fsdp=ours, reference=ref))
        print(json.dumps(results[-1]["fsdp"]), json.dumps(results[-1]["reference"]), flush=True)
        # Rewritten after every row: a run cut short by a time limit keeps what it measured.
        table = write_results(base, args, device, stamp, env, results, done=(i + 1 == len(rows)))
    print("\n" + table)
    print("\nwritten: %s.md, %s.json" % (base, base))


if __name__ == "__main__":
    main()
