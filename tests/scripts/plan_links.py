"""`fsdp plan --link-gbps` (the step-time plan, src/train/step_time.c) against what the engine does, on
CPU ranks:
  - the bytes the plan counts per step, by kind of collective, equal the comm_bytes the engine counted
    in a real run's steps (after the first), for every strategy, reduce and gather dtype and both
    accumulations, on 2 to 4 ranks (HYBRID and hpZ over emulated nodes, hpZ's backward gathers inside
    the node counted apart);
  - `fsdp train --strategy auto` picks the strategy the plan's table puts first, for two links and
    compute rates whose tables disagree (so the choice is not a constant), with --mbs auto (strategy and
    micro-batch), without dtype flags (the wire options too), and hpZ where memory leaves it the
    fastest row that fits;
  - bad values are refused in one line: --link-gbps 0, --nodes that do not divide the GPUs,
    --gpus-per-node against --gpus, a time plan over nodes without --link-gbps, --strategy auto over
    emulated nodes without --link-gbps, --calibrate onto an existing file.
The step-time arithmetic itself is test_step_time (hand-computed cases)."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

UNTIED = os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")
KINDS = ("all_gather", "reduce", "all_reduce", "other", "all_gather_secondary", "total")

# (ranks, strategy, ranks per node, model, flags shared by train and plan)
CASES = [
    (2, "FULL", 0, "tiny-llama", []),
    (2, "SHARD_GRAD_OP", 0, "tiny-llama", ["--reduce-dtype", "int8", "--gather-dtype", "int8", "--grad-accum", "2"]),
    (2, "FULL", 0, "tiny-opt", ["--reduce-dtype", "bf16", "--grad-accum", "2", "--accumulate", "local"]),
    (3, "NO_SHARD", 0, UNTIED, ["--reduce-dtype", "int8"]),
    (4, "HYBRID", 2, "tiny-opt", ["--grad-accum", "2"]),
    (4, "HYBRID", 2, UNTIED, ["--reduce-dtype", "bf16", "--accumulate", "sharded", "--grad-accum", "2"]),
    (2, "FULL", 0, UNTIED, ["--model-precision", "bf16", "--gather-dtype", "fp8"]),
    (4, "FULL", 2, "tiny-llama", ["--reshard-after-forward", "node", "--gather-dtype", "int8", "--grad-accum", "2"]),
]

if t.SANITIZED:  # quantized wire and local accumulation, HYBRID and hpZ over emulated nodes
    CASES = [CASES[1], CASES[4], CASES[7]]


def plan(args):
    rc, out, err = t.run(1, ["plan", "--device", "cpu", "--json"] + args, check=False)
    if rc != 0:
        t.fail("plan failed (%d): %s\n%s" % (rc, " ".join(args), err[-800:]))
        return None
    return json.loads(out)


for i, (n, strategy, rpn, model, extra) in enumerate(CASES):
    name = "%d ranks %s %s %s" % (n, strategy, os.path.basename(model), " ".join(extra))
    nodes = n // rpn if rpn else 1
    p = plan(["--model", model, "--gpus", str(n), "--nodes", str(nodes), "--strategy", strategy, "--mbs", "2",
              "--seq", "16", "--link-gbps", "1", "--compute-tflops", "0.01"] + extra)
    d = t.tmpdir("plan-links-%d" % i)
    path = os.path.join(d, "m.jsonl")
    args = ["train", "--model", model, "--strategy", strategy, "--mbs", "2", "--seq", "16", "--steps", "3",
            "--synthetic-vocab", "997", "--metrics", path] + extra
    if rpn:
        args += ["--ranks-per-node", str(rpn)]
    rc, _, _ = t.run(n, args, check=True)
    if not p or rc != 0:
        continue
    asked = [r for r in p["configurations"] if r["requested"]]
    t.check(len(asked) == 1 and asked[0]["strategy"] == strategy, "%s: the plan's table holds the asked row" % name)
    if len(asked) != 1:
        continue
    planned = asked[0]["comm_bytes"]
    steps, _ = t.metrics(path)
    steps = [s for s in steps if "comm_bytes" in s and s["step"] > 1]
    t.check(len(steps) == 2, "%s: two timed steps recorded" % name)
    for s in steps:
        sent = s["comm_bytes"]
        t.check(all(abs(sent[k] - planned[k]) <= 1 for k in KINDS),
                "%s, step %d: engine sent %s, the plan counts %s" % (
                    name, s["step"], {k: sent[k] for k in KINDS}, {k: planned[k] for k in KINDS}))
    t.check(planned["total"] > 0 and any(planned[k] > 0 for k in ("all_gather", "all_reduce")),
            "%s: the plan's bytes are not all zero" % name)
    t.check(("--reshard-after-forward" in extra) == (planned["all_gather_secondary"] > 0),
            "%s: secondary gathers planned exactly for hpZ (%d bytes)" % (name, planned["all_gather_secondary"]))

# --strategy auto chooses what the plan's table says, for two settings whose tables disagree.
BASE = ["--model", "tiny-llama", "--mbs", "2", "--seq", "16", "--grad-accum", "2"]
firsts = []
FIXED = ["--reduce-dtype", "fp32", "--gather-dtype", "fp32", "--accumulate", "auto"]  # only the strategy varies
for link, tflops in (("0.01", "1"), ("0.01", "0.001")):
    p = plan(BASE + FIXED + ["--gpus", "2", "--nodes", "2", "--link-gbps", link, "--compute-tflops", tflops])
    if not p:
        continue
    rows = p["configurations"]
    t.check({r["strategy"] for r in rows} == {"FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"} or
            {r["strategy"] for r in rows} == {"FULL", "SHARD_GRAD_OP", "NO_SHARD"},
            "link %s GB/s: one row per strategy (%s)" % (link, [r["name"] for r in rows]))
    speeds = [r["tokens_per_s_per_gpu"] for r in rows]
    t.check(speeds == sorted(speeds, reverse=True), "link %s GB/s: the table is sorted fastest first" % link)
    first = rows[0]["strategy"]
    firsts.append(first)
    d = t.tmpdir("plan-links-auto-%s" % tflops)
    rc, out, err = t.run(2, ["train", "--strategy", "auto", "--ranks-per-node", "1", "--link-gbps", link,
                             "--compute-tflops", tflops, "--steps", "1", "--synthetic-vocab", "997",
                             "--metrics", os.path.join(d, "m.jsonl")] + BASE + FIXED, check=True)
    m = re.search(r"--strategy auto chose (\w+)", out + err)
    t.check(m is not None and m.group(1) == first,
            "link %s GB/s, %s TFLOP/s: train chose %s, the plan's first row is %s" % (
                link, tflops, m.group(1) if m else None, first))
    _, summary = t.metrics(os.path.join(d, "m.jsonl"))
    t.check(summary is not None and summary["strategy"] == first, "  and trained with it")
t.check(len(set(firsts)) == 2, "the two settings' tables put different strategies first (%s)" % firsts)

# With --mbs auto each row takes the largest micro-batch it fits (the CPU backend's --memory-limit as
# the plan's --gpu-mem): train takes the first row's strategy and micro-batch.
MEM = ["--model", "tiny-llama", "--seq", "16", "--mbs", "auto", "--link-gbps", "0.01", "--compute-tflops", "1"] + FIXED
p = plan(MEM + ["--gpus", "2", "--nodes", "2", "--gpu-mem", "0.004"])
if p:
    first = p["configurations"][0]
    rc, out, err = t.run(2, ["train", "--strategy", "auto", "--ranks-per-node", "1", "--memory-limit", "0.004",
                             "--steps", "1", "--synthetic-vocab", "997"] + MEM, check=True)
    m = re.search(r"--strategy auto chose (\w+) at micro-batch (\d+)", out + err)
    t.check(first["fits"] and m is not None and (m.group(1), int(m.group(2))) == (first["strategy"], first["mbs"]),
            "--mbs auto: train chose %s, the plan's first row is %s at %d" % (
                m.groups() if m else None, first["strategy"], first["mbs"]))

# Without dtype flags --strategy auto also picks the wire options, as the plan's table varies them.
p = plan(BASE + ["--gpus", "2", "--nodes", "2", "--link-gbps", "0.01", "--compute-tflops", "1"])
if p:
    first = p["configurations"][0]
    d = t.tmpdir("plan-links-auto-wire")
    rc, out, err = t.run(2, ["train", "--strategy", "auto", "--ranks-per-node", "1", "--link-gbps", "0.01",
                             "--compute-tflops", "1", "--steps", "1", "--synthetic-vocab", "997",
                             "--metrics", os.path.join(d, "m.jsonl")] + BASE, check=True)
    m = re.search(r"--strategy auto chose (.+?) at micro-batch", out + err)
    t.check(m is not None and m.group(1) == first["name"] and first["reduce_dtype"] != "fp32",
            "no dtype flags: train chose '%s', the plan's first row is '%s'" % (m.group(1) if m else None,
                                                                               first["name"]))
    _, summary = t.metrics(os.path.join(d, "m.jsonl"))
    t.check(summary is not None and all(summary[k] == first[k] for k in ("strategy", "reduce_dtype", "gather_dtype",
                                                                         "accumulate")),
            "  and trained with it (%s)" % ({k: summary.get(k) for k in ("strategy", "reduce_dtype", "gather_dtype",
                                                                            "accumulate")} if summary else None))

# hpZ as a row: on 2 nodes of 2 ranks the table has FULL with and without it; with the memory of a
# 12-layer model that leaves out SHARD_GRAD_OP, HYBRID and NO_SHARD (each holds more than hpZ's slice
# of the blocks), hpZ is the fastest row that fits, and --strategy auto trains with it.
MID = os.path.join(t.tmpdir("plan-links-hpz"), "config.json")
json.dump({"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False}, open(MID, "w"))
HPZ = ["--model", MID, "--mbs", "2", "--seq", "16", "--link-gbps", "0.01", "--compute-tflops", "1",
       "--reduce-dtype", "fp32", "--gather-dtype", "fp32"]
p = plan(HPZ + ["--gpus", "4", "--nodes", "2"])
if p:
    rows = {r["name"]: r for r in p["configurations"]}
    t.check("FULL" in rows and "FULL, hpZ 2" in rows and rows["FULL, hpZ 2"]["reshard_after_forward"] == 2 and
            rows["FULL"]["reshard_after_forward"] is None,
            "2 nodes of 2: FULL with and without hpZ are rows (%s)" % sorted(rows))
    full, hpz, sgo = rows.get("FULL"), rows.get("FULL, hpZ 2"), rows.get("SHARD_GRAD_OP")
    if full and hpz and sgo:
        budget = (hpz["total_gib"] + min(sgo["total_gib"], rows["HYBRID"]["total_gib"])) / 2
        t.check(full["total_gib"] < hpz["total_gib"] < budget and hpz["tokens_per_s_per_gpu"] > full["tokens_per_s_per_gpu"],
                "hpZ holds more than FULL, less than the rest, and is faster than FULL")
        p = plan(HPZ + ["--gpus", "4", "--nodes", "2", "--gpu-mem", "%.6f" % budget])
        first = p["configurations"][0] if p else {}
        t.check(first.get("name") == "FULL, hpZ 2" and first.get("fits"),
                "in %.4f GiB hpZ is the first row: %s" % (budget, first.get("name")))
        d = t.tmpdir("plan-links-auto-hpz")
        rc, out, err = t.run(4, ["train", "--strategy", "auto", "--ranks-per-node", "2", "--memory-limit", "%.6f" % budget,
                                 "--steps", "1", "--synthetic-vocab", "997", "--metrics", os.path.join(d, "m.jsonl")]
                             + HPZ, check=True)
        m = re.search(r"--strategy auto chose (.+?) at micro-batch", out + err)
        _, summary = t.metrics(os.path.join(d, "m.jsonl"))
        t.check(m is not None and m.group(1) == "FULL, hpZ 2" and summary is not None and
                summary.get("reshard_after_forward") == 2,
                "train --strategy auto chose '%s' and trained with hpZ %s" % (
                    m.group(1) if m else None, summary.get("reshard_after_forward") if summary else None))


def refused(nprocs, args, pattern, what):
    rc, out, err = t.run(nprocs, args, check=False)
    lines = [l for l in err.splitlines() if l.strip()]
    if nprocs > 1:  # mpirun's own banner about the exit status follows; fsdp.c's lines are its own
        lines = [l for l in lines if l.startswith("fsdp")]
    t.check(rc != 0 and len(lines) == 1 and re.search(pattern, lines[0]) is not None,
            "%s: refused in one line (rc %d): %s" % (what, rc, lines[:3]))


refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--link-gbps", "0"], r"--link-gbps 0", "--link-gbps 0")
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "4", "--nodes", "3", "--link-gbps", "25"],
        r"--nodes 3 does not divide the 4 GPUs", "--nodes 3 of 4 GPUs")
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "4", "--nodes", "2", "--gpus-per-node", "4"],
        r"--gpus 4 is not --nodes 2 x --gpus-per-node 4", "--gpus-per-node against --gpus")
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "4", "--nodes", "2", "--compute-tflops", "1"],
        r"needs --link-gbps", "a time plan over nodes without --link-gbps")
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--intra-gbps", "-3"], r"--intra-gbps -3",
        "--intra-gbps -3")
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--link-concurrency", "1.5"], r"--link-concurrency",
        "--link-concurrency 1.5")
# --link-concurrency: FULL's gathers and reductions overlap between nodes; the more they keep their speed
# when they run at once, the faster the step, never faster than the busier stream alone and never slower
# than both taking turns (timeline.h); the link line of the JSON says the value.
OVER = ["--model", "tiny-llama", "--mbs", "2", "--seq", "16", "--gpus", "2", "--nodes", "2", "--link-gbps", "0.01",
        "--compute-tflops", "0.01", "--strategy", "FULL", "--grad-accum", "4"]
by_c = {c: plan(OVER + ["--link-concurrency", str(c)]) for c in (0, 0.5, 1)}
if all(by_c.values()):
    ms = {c: [r for r in v["configurations"] if r["requested"]][0]["step_ms"] for c, v in by_c.items()}
    t.check(ms[0] > ms[0.5] > ms[1], "FULL over a slow link: step %s ms at concurrency 0, 0.5, 1" % ms)
    t.check(by_c[0.5]["link"]["inter_concurrency"] == 0.5 and by_c[0]["link"]["inter_concurrency"] == 0,
            "the plan's JSON says the link's concurrency")
# The text's link line says --link-gbps is unused only where it is (one node).
for nodes, unused in (("1", True), ("2", False)):
    rc, out, _ = t.run(1, ["plan", "--device", "cpu", "--model", "tiny-llama", "--gpus", "2", "--nodes", nodes,
                           "--link-gbps", "5", "--compute-tflops", "0.01"], check=False)
    t.check(rc == 0 and ("--link-gbps unused" in out) == unused,
            "--nodes %s --link-gbps 5: the step-time line %s --link-gbps unused" % (nodes, "calls" if unused else "does not call"))
refused(2, ["train", "--model", "tiny-llama", "--strategy", "auto", "--ranks-per-node", "1", "--steps", "1"],
        r"--strategy auto on 2 nodes needs --link-gbps", "--strategy auto over nodes without --link-gbps")
# --calibrate trains on this rank, keeps the run's metrics and plans with the rate they give; --compute-from
# the same file gives the same rate.
cal = os.path.join(t.tmpdir("plan-links-calibrate"), "cal.jsonl")
LINK = ["--model", "tiny-llama", "--mbs", "2", "--seq", "16", "--gpus", "2", "--nodes", "2", "--link-gbps", "0.5"]
a = plan(LINK + ["--calibrate", cal])
b = plan(LINK + ["--compute-from", cal]) if os.path.exists(cal) else None
t.check(a is not None and b is not None and cal in a["rates"]["source"] and a["rates"]["compute_tflops"] > 0 and
        a["rates"]["compute_tflops"] == b["rates"]["compute_tflops"],
        "--calibrate measured %s TFLOP/s into its file; --compute-from reads %s" % (
            a and a["rates"]["compute_tflops"], b and b["rates"]["compute_tflops"]))
existing = os.path.join(t.tmpdir("plan-links-calibrate-exists"), "exists.jsonl")
open(existing, "w").close()
refused(1, ["plan", "--model", "tiny-llama", "--device", "cpu", "--calibrate", existing], r"--calibrate .* exists",
        "--calibrate onto an existing file")
t.finish()
