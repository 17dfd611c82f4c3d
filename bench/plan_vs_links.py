#!/usr/bin/env python3
"""`fsdp plan --link-gbps` against measured runs: for every fsdp.c run of the link harness
(bench/links.py: bench/results/*-links-*.json) and of the earlier two-GPU scaling runs
(bench/results/*-scaling-llama1b.json, -scaling-7b-2gpu.json), predict its tokens/s per GPU with
`fsdp plan` and print predicted against measured.

Nothing is fitted to a row. The plan takes, per row:
  - the link's bus bandwidth measured in the same call (nccl_bw.py in the harness file: the mean of
    all-gather and reduce-scatter at 64 MiB and 1 GiB) as --link-gbps (IB- and Ethernet-class: the two
    GPUs are planned as two nodes of one GPU) or --intra-gbps (NVLink: one node of two GPUs); a call on
    four GPUs (links.py --suite hpz --gpus 4: two emulated nodes of two) is planned as such, with the
    link's figure both between and inside the nodes, since on one host the link's variables slow every
    pair of GPUs alike;
  - the compute rate measured by an NVLink run of the same file: the run of the same configuration
    when there is one, else the file's first NVLink run of the same model and batch (an NVLink row is
    predicted from another NVLink row when the file has one, never from itself); a file without an NVLink
    run of the suite (a call that measured one link) takes the newest other file's NVLink run of the same
    suite, named in the "compute from" column with its file. The run's step times
    are written back as a --metrics file and given to `fsdp plan --compute-from` (the harness kept no
    metrics file of its own); a scaling row takes the one-GPU run of its file;
  - for IB- and Ethernet-class rows, how far a gather and a reduction at once keep their speed on that
    link (--link-concurrency): the 256 MiB figure of the newest bench/results/*-link-concurrency.json
    (bench/link_concurrency.py, measured on the same kind of host; the rows' own calls did not measure it);
  - the defaults of everything else (the update's 3200 GB/s, interference 1: README, "Choosing a
    configuration for your link").

  python3 bench/plan_vs_links.py --fsdp build/fsdp                 # the table, on any machine (no GPU)
  python3 bench/plan_vs_links.py --fsdp build/fsdp --out bench/results/2026-11-26-plan-vs-links.md

Exits 1 when a row is off by more than --bar percent (default 15, issue 22's bar).
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def flag(cmd, name, default=None):
    words = shlex.split(cmd)
    return words[words.index(name) + 1] if name in words else default


def config_of(cmd):
    """The training flags of a run's command line that the plan takes."""
    c = dict(model=flag(cmd, "--model"), mbs=int(flag(cmd, "--mbs")), seq=int(flag(cmd, "--seq")),
             accum=int(flag(cmd, "--grad-accum", "1")), strategy=flag(cmd, "--strategy", "FULL"),
             model_precision=flag(cmd, "--model-precision", "fp32"), mixed=flag(cmd, "--mixed-precision", "bf16"),
             attn=flag(cmd, "--attn", "flash"), reduce=flag(cmd, "--reduce-dtype"), gather=flag(cmd, "--gather-dtype"),
             accumulate=flag(cmd, "--accumulate"), ranks_per_node=flag(cmd, "--ranks-per-node"),
             reshard=flag(cmd, "--reshard-after-forward"))
    return c


def plan_flags(c):
    f = ["--model", c["model"], "--mbs", str(c["mbs"]), "--seq", str(c["seq"]), "--grad-accum", str(c["accum"]),
         "--strategy", c["strategy"], "--model-precision", c["model_precision"], "--mixed-precision", c["mixed"],
         "--attn", c["attn"]]
    for key, name in (("reduce", "--reduce-dtype"), ("gather", "--gather-dtype"), ("accumulate", "--accumulate"),
                      ("reshard", "--reshard-after-forward")):
        if c[key]:
            f += [name, c[key]]
    return f


def bandwidth(nccl):
    bw = nccl["busbw"]
    vals = [bw[s][k] for s in ("64", "1024") for k in ("all_gather", "reduce_scatter")]
    return sum(vals) / len(vals)


def write_metrics(path, c, world, nodes, step_ms_list):
    """A --metrics file of a measured run: its step times and the summary fields `--compute-from` reads."""
    with open(path, "w") as f:
        for i, ms in enumerate(step_ms_list):
            f.write(json.dumps({"step": i + 1, "step_ms": ms}) + "\n")
        f.write(json.dumps({"summary": True, "model": c["model"], "strategy": c["strategy"], "mbs": c["mbs"],
                            "seq": c["seq"], "grad_accum": c["accum"], "world_size": world, "nodes": nodes,
                            "ranks_per_node": world // nodes, "model_precision": c["model_precision"],
                            "mixed_precision": c["mixed"], "attn": c["attn"], "reduce_dtype": c["reduce"] or
                            c["model_precision"], "gather_dtype": c["gather"] or c["mixed"],
                            "accumulate": c["accumulate"] or "auto"}) + "\n")


def predict(args, c, place, bw_flags, compute):
    """compute: a --metrics file to take the rate from (--compute-from), or the rate itself (--compute-tflops)."""
    rate = ["--compute-tflops", "%.3f" % compute] if isinstance(compute, float) else ["--compute-from", compute]
    cmd = [args.fsdp, "plan"] + plan_flags(c) + place + bw_flags + rate + ["--gpu-mem", "141", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("plan_vs_links.py: %s\n%s" % (" ".join(map(shlex.quote, cmd)), p.stderr.strip()))
    v = json.loads(p.stdout)
    row = [r for r in v["configurations"] if r["requested"]][0]
    return row, v["rates"], cmd


def link_concurrency():
    """{link: concurrency at 256 MiB} of the newest *-link-concurrency.json ({} when there is none)."""
    files = sorted(glob.glob(os.path.join(RESULTS, "*-link-concurrency.json")))
    if not files:
        return {}, None
    d = json.load(open(files[-1]))
    return {link: r["256"]["concurrency"] for link, r in d["results"].items() if "256" in r}, os.path.basename(files[-1])


def harness_files():
    """[(path, record)] of the harness's calls, oldest first (two GPUs, and links.py --suite hpz --gpus 4)."""
    out = []
    for p in sorted(glob.glob(os.path.join(RESULTS, "*-links-*.json"))):
        if "-trace." in p:  # the timelines the harness keeps beside its records
            continue
        d = json.load(open(p))
        out.append((p, d))
    return out


def nvlink_runs(d):
    return [r for r in d["runs"] if r["program"] == "fsdp" and r["status"] == "ok" and r["link"] == "nvlink"]


def elsewhere(files, path, r):
    """For a file without an NVLink run of r's suite: the newest other file's NVLink runs of it, that
    file's NVLink bandwidth and its name."""
    for other, d in reversed(files):
        if other == path:
            continue
        nv = [n for n in nvlink_runs(d) if n["suite"] == r["suite"]]
        if nv and "nvlink" in d["nccl_bw"]:
            return nv, bandwidth(d["nccl_bw"]["nvlink"]), os.path.basename(other).replace(".json", "")
    return [], None, None


def harness_rows(args, tmp):
    out = []
    conc = {} if args.without_concurrency else link_concurrency()[0]
    files = harness_files()
    for path, d in files:
        runs = [r for r in d["runs"] if r["program"] == "fsdp" and r["status"] == "ok"]
        nv = nvlink_runs(d)
        gpus = d.get("gpus", 2)
        for r in runs:
            if "--strategy auto" in r["command"]:  # a choice, checked against the fastest row, not a prediction
                continue
            nv_bw = bandwidth(d["nccl_bw"]["nvlink"]) if "nvlink" in d["nccl_bw"] else None
            from_file = ""
            pool = nv
            if gpus == 2 and r["link"] != "nvlink" and not [n for n in nv if n["suite"] == r["suite"]]:
                pool, nv_bw, name = elsewhere(files, path, r)
                from_file = " (%s)" % name if name else ""
            same = [n for n in pool if n["label"] == r["label"] and n["suite"] == r["suite"]]
            others = [n for n in pool if n["suite"] == r["suite"] and n is not r]
            if r["link"] == "nvlink":
                src = others[0] if others else None
            else:
                src = same[0] if same else (others[0] if others else None)
            if src is None or nv_bw is None:
                continue
            c, s = config_of(r["command"]), config_of(src["command"])
            metrics = os.path.join(tmp, "m%d.jsonl" % len(out))
            write_metrics(metrics, s, gpus, 1 if gpus == 2 else 2, src["step_ms"])
            compute = metrics
            if gpus == 4:
                # Two emulated nodes of two GPUs on one host: the link's variables slow the pairs inside a
                # "node" as much as those between, so both figures are the link's own bus bandwidth. The
                # compute rate comes from the NVLink source planned at NVLink's figure (one set of link
                # flags serves both the source and the row, so a slow-link row takes the rate itself).
                place = ["--nodes", "2", "--gpus-per-node", "2"]
                nv4 = "%.2f" % nv_bw
                _, src_rates, _ = predict(args, s, place, ["--link-gbps", nv4, "--intra-gbps", nv4], metrics)
                compute = src_rates["compute_tflops"]
                link_bw = "%.2f" % bandwidth(d["nccl_bw"][r["link"]])
                bw = ["--link-gbps", link_bw, "--intra-gbps", link_bw]
                if r["link"] in conc:
                    bw += ["--link-concurrency", "%.3f" % conc[r["link"]]]
            elif r["link"] == "nvlink":
                place, bw = ["--gpus", "2", "--nodes", "1"], ["--intra-gbps", "%.1f" % nv_bw]
            else:
                place = ["--nodes", "2", "--gpus-per-node", "1"]
                bw = ["--link-gbps", "%.2f" % bandwidth(d["nccl_bw"][r["link"]]), "--intra-gbps", "%.1f" % nv_bw]
                if r["link"] in conc:
                    bw += ["--link-concurrency", "%.3f" % conc[r["link"]]]
            row, rates, cmd = predict(args, c, place, bw, compute)
            out.append(dict(file=os.path.basename(path), link=r["link"], label=r["label"], accum=c["accum"],
                            model=c["model"], source=src["label"] + from_file, measured=r["tps"],
                            predicted=row["tokens_per_s_per_gpu"], step_ms=row["step_ms"],
                            measured_ms=r.get("step_ms_mean"), compute_ms=row["compute_ms"],
                            exposed_ms=row["exposed_ms"], gb=row["comm_bytes"]["total"] / 1e9,
                            measured_gb=r.get("comm_gb_per_step"), tflops=rates["compute_tflops"],
                            command=" ".join(map(shlex.quote, cmd))))
    return out


def scaling_rows(args, tmp):
    out = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "*-scaling-llama1b.json")) +
                       glob.glob(os.path.join(RESULTS, "*-scaling-7b-*.json"))):
        d = json.load(open(path))
        res = [r for r in d["results"] if r.get("fsdp", {}).get("rc") == 0]
        one = [r for r in res if r["gpus"] == 1]
        if not one:  # the 7B's two-GPU file: its one-GPU run is in the -1gpu file
            other = path.replace("-2gpu", "-1gpu")
            if other == path or not os.path.exists(other):
                continue
            one = [r for r in json.load(open(other))["results"] if r["gpus"] == 1 and r.get("fsdp", {}).get("rc") == 0]
        if not one:
            continue
        s = config_of(one[0]["fsdp"]["command"])
        ms = s["mbs"] * s["seq"] * s["accum"] / one[0]["fsdp"]["tps"] * 1e3
        metrics = os.path.join(tmp, "s%d.jsonl" % len(out))
        write_metrics(metrics, s, 1, 1, [ms * 5, ms, ms, ms])
        for r in res:
            if r["gpus"] != 2:
                continue
            c = config_of(r["fsdp"]["command"])
            place = ["--gpus", "2", "--nodes", "1"]
            if c["strategy"] == "HYBRID":  # --ranks-per-node 1: two emulated nodes over NVLink
                place = ["--nodes", "2", "--gpus-per-node", "1", "--link-gbps", "200"]
            row, rates, cmd = predict(args, c, place, [], metrics)
            out.append(dict(file=os.path.basename(path), link="nvlink", label=r["label"], accum=c["accum"],
                            model=c["model"], source="1 GPU", measured=r["fsdp"]["tps"],
                            predicted=row["tokens_per_s_per_gpu"], step_ms=row["step_ms"], measured_ms=None,
                            compute_ms=row["compute_ms"], exposed_ms=row["exposed_ms"],
                            gb=row["comm_bytes"]["total"] / 1e9, measured_gb=None, tflops=rates["compute_tflops"],
                            command=" ".join(map(shlex.quote, cmd))))
    return out


def table(rows):
    lines = ["| file | link | model | configuration | accum | compute from | measured tok/s/GPU | predicted | error "
             "| step ms measured / predicted (compute + exposed) | GB/step measured / planned | TFLOP/s |",
             "|---|---|---|---|--:|---|--:|--:|--:|---|---|--:|"]
    for r in rows:
        err = 100.0 * (r["predicted"] - r["measured"]) / r["measured"]
        meas_ms = "%.1f" % r["measured_ms"] if r["measured_ms"] else "-"
        meas_gb = "%.2f" % r["measured_gb"] if r["measured_gb"] else "-"
        lines.append("| %s | %s | %s | %s | %d | %s | %.0f | %.0f | %+.1f%% | %s / %.1f (%.1f + %.1f) | %s / %.2f | %.0f |" % (
            r["file"].replace("2026-11-", "").replace(".json", ""), r["link"], r["model"], r["label"], r["accum"],
            r["source"], r["measured"], r["predicted"], err, meas_ms, r["step_ms"], r["compute_ms"], r["exposed_ms"],
            meas_gb, r["gb"], r["tflops"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    ap.add_argument("--out", help="also write the table and the commands to this markdown file")
    ap.add_argument("--bar", type=float, default=15.0, help="the largest error allowed, in percent")
    ap.add_argument("--without-concurrency", action="store_true",
                    help="plan every link as one NIC (--link-concurrency 0), as before the links' concurrency was measured")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = harness_rows(args, tmp) + scaling_rows(args, tmp)
    text = table(rows)
    worst = max(abs(r["predicted"] - r["measured"]) / r["measured"] * 100.0 for r in rows)
    print(text)
    print("\n%d rows; largest error %.1f%% (bar %.0f%%)" % (len(rows), worst, args.bar))
    if args.out:
        with open(args.out, "w") as f:
            f.write("# `fsdp plan --link-gbps` against measured runs\n\n")
            f.write("Command: `python3 bench/plan_vs_links.py --fsdp %s --out %s` (no GPU: the plan is arithmetic "
                    "over the recorded measurements; bench/plan_vs_links.py says what each input is).\n\n" %
                    (os.path.relpath(args.fsdp, ROOT), os.path.relpath(args.out, ROOT)))
            conc, conc_file = link_concurrency()
            if conc and not args.without_concurrency:
                f.write("Link concurrency (--link-concurrency of the IB- and Ethernet-class rows) from %s: %s.\n\n" %
                        (conc_file, ", ".join("%s %.2f" % (k, v) for k, v in sorted(conc.items()) if k != "nvlink")))
            f.write(text + "\n\n%d rows; largest error %.1f%% (bar %.0f%%).\n\n## Commands\n\n" % (len(rows), worst,
                                                                                              args.bar))
            for r in rows:
                f.write("- `%s`\n" % r["command"])
    return 0 if worst <= args.bar else 1


if __name__ == "__main__":
    sys.exit(main())
