"""--trace FILE (src/train/trace_run.h): a Chrome/Perfetto timeline per rank, parsed and checked.

1. A 2-rank FULL run with --trace-steps 2:4 writes trace.rank0.json and trace.rank1.json (and no
   temporary file): valid JSON in the Trace Event Format, metadata naming the process "rank R" and
   its five tracks, complete events ("X") with microsecond times on the compute, gather and reduce
   tracks, only of steps 2..4.
2. Bytes: per step, the spans' bytes add up to that step's comm_bytes in the metrics (all of them,
   and the gather track's to the all-gathers).
3. Order: each block's backward starts after its forward ended; a forward starts after the gather
   it waited for ended; the blocks' forwards run in order.
4. The summary: each file's busy times are the sums of its spans per step, its overlap is the union
   of communication intersected with the union of compute (recomputed here), its wait track sums to
   the metrics' measured comm_wait_ms of those steps, and the metrics' "trace" object is the mean
   of the two files'.
5. NO_SHARD (all-reduces, no gathers), compressed wires (int8 gathers, bf16 reductions) and hpZ on
   4 ranks as 2 nodes (the backward's gathers inside the node): the bytes still match comm_bytes;
   without --trace-steps the window is steps 3..5.
6. A bad --trace path, --trace-steps out of range or malformed, and --trace-steps without --trace
   are refused in one line (exit 2) with nothing written."""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

BASE = ["train", "--model", "tiny-llama", "--seq", "32", "--mbs", "2", "--lr", "1e-3"]
TRACKS = {0: "host", 1: "compute", 2: "gather", 3: "reduce", 4: "wait"}


def traced(tag, nprocs, extra):
    d = t.tmpdir("trace-" + tag)
    path = os.path.join(d, "trace.json")
    t.run(nprocs, BASE + ["--metrics", os.path.join(d, "m.jsonl"), "--trace", path] + extra)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl"))
    files = {}
    for r in range(nprocs):
        f = os.path.join(d, "trace.rank%d.json" % r)
        if not os.path.exists(f):
            t.fail("%s: %s was not written (found %s)" % (tag, f, sorted(os.listdir(d))))
            continue
        with open(f) as fp:
            files[r] = json.load(fp)
    t.check(not glob.glob(os.path.join(d, "*.tmp")), "%s: no temporary trace file left" % tag)
    return d, steps, summary, files


def spans(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def merged(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def intersection(x, y):
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, b - a)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def close(a, b, rel=1e-6, abs_=1e-6):
    return abs(a - b) <= abs_ + rel * max(abs(a), abs(b))


def check_format(tag, rank, doc, want_steps):
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    names = {e["name"]: e for e in meta if "tid" not in e}
    t.check(names.get("process_name", {}).get("args", {}).get("name") == "rank %d" % rank,
            "%s rank %d: the process is named 'rank %d'" % (tag, rank, rank))
    threads = {e["tid"] for e in meta if e["name"] == "thread_name"}
    t.check(threads == set(TRACKS), "%s rank %d: five named tracks (%s)" % (tag, rank, sorted(threads)))
    xs = spans(doc)
    good = all(e["pid"] == rank and e["tid"] in TRACKS and e["dur"] >= 0 and e["ts"] >= 0 and e["cat"] == TRACKS[e["tid"]]
               and isinstance(e["name"], str) for e in xs)
    t.check(good, "%s rank %d: %d complete events with pid, tid, ts, dur, cat" % (tag, rank, len(xs)))
    steps = {e["args"]["step"] for e in xs}
    t.check(steps == set(want_steps), "%s rank %d: spans of steps %s (want %s)" % (tag, rank, sorted(steps),
                                                                                  sorted(want_steps)))
    return xs


def check_bytes(tag, xs, steps_by_number, gathers=True):
    for s in sorted({e["args"]["step"] for e in xs}):
        want = steps_by_number[s]["comm_bytes"]
        got = sum(e["args"].get("bytes", 0) for e in xs if e["args"]["step"] == s)
        got_gather = sum(e["args"].get("bytes", 0) for e in xs if e["args"]["step"] == s and e["tid"] == 2)
        t.check(got == want["total"], "%s step %d: spans' bytes %d = comm_bytes total %d" % (tag, s, got, want["total"]))
        want_gather = want["all_gather"] + want.get("all_gather_secondary", 0)
        t.check(got_gather == want_gather, "%s step %d: gather track's bytes %d = all-gathers %d" %
                (tag, s, got_gather, want_gather))
        if gathers:
            t.check(got_gather > 0, "%s step %d: gathers on the gather track" % (tag, s))


def check_summary(tag, rank, doc, xs):
    summ = doc["otherData"]["summary"]
    n = len({e["args"]["step"] for e in xs})
    t.check(summ["steps"] == n, "%s rank %d: summary over %d steps" % (tag, rank, n))
    for tid, name in TRACKS.items():
        total = sum(e["dur"] for e in xs if e["tid"] == tid) / n / 1e3
        t.check(close(summ["busy_ms"][name], total, 1e-6, 1e-6),
                "%s rank %d: busy %s %.6f ms = the sum of its spans per step %.6f" % (tag, rank, name,
                                                                                      summ["busy_ms"][name], total))
    comm = merged([[e["ts"], e["ts"] + e["dur"]] for e in xs if e["tid"] in (2, 3)])
    compute = merged([[e["ts"], e["ts"] + e["dur"]] for e in xs if e["tid"] == 1])
    comm_us = sum(b - a for a, b in comm)
    hidden = intersection(comm, compute)
    t.check(close(summ["comm_ms"], comm_us / n / 1e3, 1e-6, 1e-6) and close(summ["hidden_ms"], hidden / n / 1e3, 1e-6, 1e-6)
            and close(summ["overlap"], hidden / comm_us if comm_us else 0.0, 1e-6, 1e-6)
            and close(summ["exposed_ms"], (comm_us - hidden) / n / 1e3, 1e-6, 1e-6),
            "%s rank %d: communication %.3f ms, %.1f%% hidden under compute (recomputed from the spans)" %
            (tag, rank, summ["comm_ms"], 100 * summ["overlap"]))
    t.check(summ["comm_wait_ms"] == summ["busy_ms"]["wait"], "%s rank %d: comm_wait_ms is the wait track" % (tag, rank))
    return summ


# ---- 1-4: FULL on 2 ranks, steps 2..4 of 5 ----
d, steps, summary, files = traced("full", 2, ["--steps", "5", "--trace-steps", "2:4"])
by_step = {r["step"]: r for r in steps}
summaries = []
for rank, doc in sorted(files.items()):
    xs = check_format("FULL", rank, doc, [2, 3, 4])
    for tid in (1, 2, 3):
        t.check(any(e["tid"] == tid for e in xs), "FULL rank %d: spans on the %s track" % (rank, TRACKS[tid]))
    names = {e["name"] for e in xs}
    want = {"fwd embed", "fwd B0", "fwd B1", "head", "bwd B1", "bwd B0", "bwd embed", "gather B0", "gather B1",
            "reduce-scatter B0", "reduce-scatter B1", "optimizer step", "grad norm", "data", "wait for the loss"}
    t.check(want <= names, "FULL rank %d: named spans (missing %s)" % (rank, sorted(want - names)))
    gathers = [e for e in xs if e["tid"] == 2]
    t.check(all(e["args"].get("dtype") == "fp32" and e["args"]["bytes"] > 0 and "unit" in e["args"] for e in gathers),
            "FULL rank %d: every gather carries its unit, bytes and dtype" % rank)
    if rank == 0:
        check_bytes("FULL", xs, by_step)
    for s in (2, 3, 4):
        at = {e["name"]: e for e in xs if e["args"]["step"] == s and e["tid"] == 1}
        for b in ("B0", "B1", "embed"):
            f, g = at.get("fwd " + b), at.get("bwd " + b)
            t.check(f is not None and g is not None and g["ts"] >= f["ts"] + f["dur"],
                    "FULL rank %d step %d: bwd %s after fwd %s" % (rank, s, b, b))
        t.check(at["fwd embed"]["ts"] <= at["fwd B0"]["ts"] <= at["fwd B1"]["ts"] <= at["head"]["ts"] <=
                at["bwd B1"]["ts"] <= at["bwd B0"]["ts"], "FULL rank %d step %d: units in the visiting order" % (rank, s))
        # A forward waits for its gather: the gather that began last before it has ended.
        for b in ("B0", "B1"):
            f = at["fwd " + b]
            before = [e for e in xs if e["tid"] == 2 and e["name"] == "gather " + b and e["ts"] <= f["ts"]
                      and e["args"]["step"] == s]
            if before:
                last = max(before, key=lambda e: e["ts"])
                t.check(last["ts"] + last["dur"] <= f["ts"] + 1.0,
                        "FULL rank %d step %d: fwd %s starts after its gather ended" % (rank, s, b))
    summaries.append(check_summary("FULL", rank, doc, xs))
    if rank == 0:
        waited = sum(by_step[s]["comm_wait_ms"] for s in (2, 3, 4))
        traced_wait = sum(e["dur"] for e in xs if e["tid"] == 4) / 1e3
        t.check(close(waited, traced_wait, 1e-4, 2e-3),
                "FULL rank 0: the wait track %.4f ms = the metrics' comm_wait_ms of steps 2-4 %.4f ms" %
                (traced_wait, waited))
tr = (summary or {}).get("trace")
t.check(tr is not None and tr["first_step"] == 2 and tr["last_step"] == 4 and tr["steps"] == 3,
        "FULL: the metrics summary has the trace's window (%s)" % tr)
if tr and len(summaries) == 2:
    for name in TRACKS.values():
        mean = (summaries[0]["busy_ms"][name] + summaries[1]["busy_ms"][name]) / 2
        t.check(close(tr["busy_ms"][name], mean, 1e-6, 1e-6), "FULL: metrics busy %s = the ranks' mean" % name)
    mean = (summaries[0]["overlap"] + summaries[1]["overlap"]) / 2
    t.check(close(tr["overlap"], mean, 1e-6, 1e-6), "FULL: metrics overlap %.3f = the ranks' mean" % tr["overlap"])

# ---- 5. other strategies and wires; the default window ----
d, steps, summary, files = traced("noshard", 2, ["--steps", "5", "--strategy", "NO_SHARD", "--embedding-grads",
                                                 "dense"])
if 0 in files:
    xs = check_format("NO_SHARD", 0, files[0], [3, 4, 5])
    check_bytes("NO_SHARD", xs, {r["step"]: r for r in steps}, gathers=False)
    t.check(any(e["name"].startswith("all-reduce") for e in xs if e["tid"] == 3),
            "NO_SHARD: all-reduces on the reduce track")
    check_summary("NO_SHARD", 0, files[0], xs)
d, steps, summary, files = traced("wire", 2, ["--steps", "3", "--trace-steps", "2:3", "--mixed-precision", "bf16",
                                              "--gather-dtype", "int8", "--reduce-dtype", "bf16"])
if 0 in files:
    xs = check_format("int8 gathers", 0, files[0], [2, 3])
    check_bytes("int8 gathers, bf16 reductions", xs, {r["step"]: r for r in steps})
    t.check(all(e["args"].get("dtype") == "int8" for e in xs if e["tid"] == 2), "int8 gathers: dtype int8")
    t.check(all(e["args"].get("dtype") == "bf16" for e in xs if e["tid"] == 3 and e["name"].startswith("reduce")),
            "bf16 reductions: dtype bf16")

d, steps, summary, files = traced("hpz", 4, ["--steps", "3", "--trace-steps", "2:3", "--ranks-per-node", "2",
                                             "--reshard-after-forward", "node"])
if 0 in files:
    xs = check_format("hpZ", 0, files[0], [2, 3])
    check_bytes("hpZ (4 ranks as 2 nodes)", xs, {r["step"]: r for r in steps})
    t.check(any(e["name"].startswith("gather in node") for e in xs), "hpZ: the backward's gathers inside the node")

# ---- 6. refused ----
D = t.tmpdir("trace-bad")


def refused(what, args, needles):
    metrics = os.path.join(D, "m.jsonl")
    rc, out, err = t.run(2, BASE + ["--steps", "4", "--metrics", metrics] + args, check=False, timeout=120)
    ours = [l for l in err.splitlines() if l.startswith("fsdp:")]
    ok = rc == 2 and len(ours) == 1 and all(n in ours[0] for n in needles)
    t.check(ok, "%s -> exit %d, %r" % (what, rc, ours[0] if ours else err[-300:]))
    left = [f for f in os.listdir(D) if f != "a-file"]
    t.check(not left, "%s: nothing written (%s)" % (what, left))


open(os.path.join(D, "a-file"), "w").write("x")
refused("--trace in a missing folder", ["--trace", os.path.join(D, "no", "trace.json")], ["--trace", "no"])
refused("--trace under a file", ["--trace", os.path.join(D, "a-file", "trace.json")], ["--trace", "a-file"])
refused("--trace-steps past the run", ["--trace", os.path.join(D, "t.json"), "--trace-steps", "3:9"],
        ["--trace-steps", "3:9"])
refused("--trace-steps reversed", ["--trace", os.path.join(D, "t.json"), "--trace-steps", "3:2"], ["--trace-steps"])
refused("--trace-steps from 0", ["--trace", os.path.join(D, "t.json"), "--trace-steps", "0:2"], ["--trace-steps"])
refused("--trace-steps not A:B", ["--trace", os.path.join(D, "t.json"), "--trace-steps", "3"], ["--trace-steps"])
refused("--trace-steps without --trace", ["--trace-steps", "2:3"], ["--trace-steps", "--trace"])
t.finish()
