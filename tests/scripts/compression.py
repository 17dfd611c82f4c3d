"""Bytes on the wire (src/shard/engine.h): compressed reductions and gathers, local accumulation, and
the bytes each step sends.

1. Local accumulation reduces once per step and computes what reducing every micro-batch computes:
   FULL, SHARD_GRAD_OP, NO_SHARD and HYBRID (4 ranks as 2 emulated nodes) with --accumulate local
   give the 1-rank, 4-micro-batch run's losses and weights up to reduction order.
2. comm_bytes: each step's bytes per kind of collective equal a count made here from the model's
   tensors, the strategy and the dtypes (not from the engine's formula), for fp32, bf16 and int8
   reductions, bf16 and int8 gathers and NO_SHARD's all-reduce; the summary's minimum is that of one
   micro-batch; accumulation multiplies what is reduced every micro-batch and nothing else.
3. Compressed reductions (bf16, int8) and quantized gathers (int8, fp8) on 2 and 4 ranks, with and
   without accumulation, over shard groups and replicas: losses and the first step's gradient norm
   within the bounds below of the exact path (fp32 reductions, bf16 gathers).
4. Flags: a --gather-dtype that is neither the compute dtype nor quantized, and --embedding-grads
   rows under NO_SHARD's local accumulation, are refused in one line; `fsdp plan` counts the
   quantized shards and the held gradient buffers (the engine checks at creation that it allocated
   exactly what the plan says, on every run above)."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from wirecount import shard_len, units, wire

STEPS = 6
BASE = ["--model", "tiny-llama", "--seq", "32", "--lr", "2e-3", "--model-precision", "fp32", "--steps", str(STEPS)]
MIXED = ["--mixed-precision", "bf16"]

# Relative bounds against the exact path, about 5x what these runs measured (2026-11-26): the loss of
# every step, and the first step's gradient norm (same weights, so only the compression differs).
BOUNDS = {  # option: (loss, first gradient norm)
    "bf16 reduce": (2e-4, 2e-4),
    "int8 reduce": (1e-3, 5e-4),
    "int8 gather": (1e-3, 3e-3),
    "fp8 gather": (2e-3, 3e-3),
    "int8 reduce and gather": (1e-3, 3e-3),
}


def train(n, tag, extra, ckpt=False):
    d = t.tmpdir("compression-" + tag)
    args = ["train"] + BASE + ["--metrics", os.path.join(d, "m.jsonl")] + extra
    if ckpt:
        args += ["--ckpt-dir", os.path.join(d, "ckpt")]
    t.run(n, args)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl"))
    return steps, summary, os.path.join(d, "ckpt", "step-%08d.h5" % STEPS)


# ---- 1. local accumulation is the same computation ----
exact = ["--mixed-precision", "no"]
ref_steps, _, ref_ckpt = train(1, "exact-1x4", exact + ["--mbs", "2", "--grad-accum", "4"], ckpt=True)
for n, accum, mbs, strategy, extra in ((2, 2, 2, "FULL", []), (2, 2, 2, "SHARD_GRAD_OP", []),
                                       (2, 2, 2, "NO_SHARD", []), (4, 2, 1, "HYBRID", ["--ranks-per-node", "2"])):
    tag = "local-%s-%dx%d" % (strategy, n, accum)
    steps, _, ckpt = train(n, tag, exact + ["--mbs", str(mbs), "--grad-accum", str(accum), "--strategy", strategy,
                                            "--accumulate", "local", "--embedding-grads", "dense"] + extra, ckpt=True)
    t.compare_losses(steps, ref_steps, 1e-5, "%s --accumulate local on %d ranks x %d vs 1 x 4" % (strategy, n, accum))
    t.compare_checkpoints(ckpt, ref_ckpt, 1e-5, "%s --accumulate local: final weights and moments" % strategy)


# ---- 2. comm_bytes against a count made here (tests/lib/wirecount.py) ----
def expected(strategy, ranks, reduce_dtype, gather_dtype, microbatches, local):
    embed, blocks, head = units(ref_ckpt)
    s = 1 if strategy == "NO_SHARD" else ranks
    r = ranks // s
    out = {"all_gather": 0, "reduce": 0, "all_reduce": 0}
    # (unit elements, gathers in one micro-batch): the tied embedding stays gathered from the forward
    # to the head (pinned); blocks are gathered for the forward and again for the backward under FULL.
    per_unit = [(embed, 1)] + [(b, 2 if strategy == "FULL" else 1) for b in blocks] + [(head, 1)]
    gathers_per_step = 1 if strategy == "SHARD_GRAD_OP" and local else microbatches
    reductions_per_step = 1 if local else microbatches
    for numel, gathers in per_unit:
        n = shard_len(numel, s)
        if s > 1:
            out["all_gather"] += gathers * gathers_per_step * (s - 1) * wire(gather_dtype, n)
            out["reduce"] += reductions_per_step * (s - 1) * wire(reduce_dtype, n)
        if r > 1:
            if reduce_dtype == "fp32":
                out["all_reduce"] += reductions_per_step * 2 * (r - 1) * n * 4 // r
            else:  # pieces of n / r (rounded up to 64) summed by their owner, sums gathered in bf16
                c = (math.ceil(n / r) + 63) // 64 * 64
                out["all_reduce"] += reductions_per_step * (r - 1) * (wire(reduce_dtype, c) + 2 * c)
    return out


for strategy, ranks, reduce_dtype, gather_dtype, accum, accumulate in (
        ("FULL", 2, "fp32", "bf16", 1, "auto"), ("FULL", 4, "int8", "int8", 1, "auto"),
        ("FULL", 2, "bf16", "bf16", 3, "sharded"), ("FULL", 2, "fp32", "bf16", 3, "local"),
        ("SHARD_GRAD_OP", 2, "int8", "bf16", 3, "local"), ("SHARD_GRAD_OP", 2, "fp32", "int8", 3, "sharded"),
        ("NO_SHARD", 2, "fp32", "bf16", 3, "local"), ("NO_SHARD", 4, "int8", "bf16", 2, "sharded")):
    tag = "bytes-%s-%d-%s-%s-%d-%s" % (strategy, ranks, reduce_dtype, gather_dtype, accum, accumulate)
    steps, summary, _ = train(ranks, tag, MIXED + ["--mbs", "1", "--grad-accum", str(accum), "--strategy", strategy,
                                           "--reduce-dtype", reduce_dtype, "--gather-dtype",
                                           "auto" if gather_dtype == "bf16" else gather_dtype,
                                           "--accumulate", accumulate, "--embedding-grads", "dense"])
    local = accum > 1 and (accumulate == "local" or (accumulate == "auto" and strategy != "FULL"))
    want = expected(strategy, ranks, reduce_dtype, gather_dtype, accum, local)
    what = "%s on %d ranks, %s reductions, %s gathers, %d micro-batch(es), %s accumulation" % (
        strategy, ranks, reduce_dtype, gather_dtype, accum, "local" if local else "sharded")
    got = [{k: rec["comm_bytes"][k] for k in want} for rec in steps[1:]]  # the first step's gathers start at set-up
    t.check(all(g == want for g in got), "%s: every step sends %s (got %s)" % (what, want, got[0] if got else None))
    minimum = expected(strategy, ranks, reduce_dtype, gather_dtype, 1, True)
    t.check({k: summary["comm_bytes_min"][k] for k in minimum} == minimum,
            "%s: the summary's minimum is one micro-batch's %s" % (what, minimum))
    other = [rec["comm_bytes"]["other"] for rec in steps[1:]]
    norm = 0 if strategy == "NO_SHARD" else 2 * (ranks - 1) * 4 // ranks  # the gradient norm's all-reduce
    t.check(all(o == norm for o in other), "%s: 'other' is the gradient norm's all-reduce (%d bytes)" % (what, norm))


# ---- 3. compressed reductions and gathers against the exact path ----
ref, _, _ = train(1, "ref-1x4", MIXED + ["--mbs", "2", "--grad-accum", "4"])
options = {"bf16 reduce": ["--reduce-dtype", "bf16"], "int8 reduce": ["--reduce-dtype", "int8"],
           "int8 gather": ["--gather-dtype", "int8"], "fp8 gather": ["--gather-dtype", "fp8"],
           "int8 reduce and gather": ["--reduce-dtype", "int8", "--gather-dtype", "int8"]}
layouts = (("FULL on 2 ranks x 2 micro-batches", 2, ["--mbs", "2", "--grad-accum", "2"]),
           ("FULL on 4 ranks", 4, ["--mbs", "2"]),
           ("SHARD_GRAD_OP on 2 ranks x 2, local", 2, ["--mbs", "2", "--grad-accum", "2", "--strategy", "SHARD_GRAD_OP"]),
           ("NO_SHARD on 2 ranks x 2, local", 2, ["--mbs", "2", "--grad-accum", "2", "--strategy", "NO_SHARD"]),
           ("NO_SHARD on 4 ranks, sharded", 4, ["--mbs", "2", "--strategy", "NO_SHARD"]),
           ("HYBRID on 2 x 2 ranks", 4, ["--mbs", "2", "--strategy", "HYBRID", "--ranks-per-node", "2"]))
for name, flags in options.items():
    loss_tol, norm_tol = BOUNDS[name]
    for label, n, layout in layouts:
        if "gather" in name and "NO_SHARD" in label:
            continue  # one rank per shard group: nothing is gathered
        steps, _, _ = train(n, ("%s-%s" % (name, label)).replace(" ", "_").replace(",", ""), MIXED + layout + flags)
        t.compare_losses(steps, ref, loss_tol, "%s, %s, vs exact on 1 rank x 4" % (name, label))
        g, g0 = steps[0]["grad_norm"], ref[0]["grad_norm"]
        t.check(abs(g - g0) <= norm_tol * g0,
                "%s, %s: first gradient norm %.6f vs exact %.6f (relative %.1e <= %.0e)" % (
                    name, label, g, g0, abs(g - g0) / g0, norm_tol))


# ---- 4. flags ----
rc, out, err = t.run(2, ["train"] + BASE + MIXED + ["--mbs", "1", "--gather-dtype", "fp32"], check=False)
lines = [l for l in (out + err).splitlines() if l.startswith("fsdp:")]
t.check(rc != 0 and len(lines) >= 1 and "--gather-dtype fp32" in lines[0],
        "--gather-dtype fp32 with bf16 compute is refused in one line: %s" % (lines[:1],))
rc, out, err = t.run(2, ["train"] + BASE + ["--mbs", "1", "--grad-accum", "2", "--strategy", "NO_SHARD",
                                            "--embedding-grads", "rows"], check=False)
lines = [l for l in (out + err).splitlines() if l.startswith("fsdp:")]
t.check(rc != 0 and lines and "--embedding-grads rows" in lines[0] and "--accumulate sharded" in lines[0],
        "--embedding-grads rows under NO_SHARD's local accumulation is refused, naming the way out: %s" % (lines[:1],))


def plan_json(extra):
    import json
    rc, out, _ = t.run(1, ["plan", "--model", "llama-3.2-1b", "--gpus", "8", "--device", "cuda", "--mbs", "4",
                           "--json"] + extra)
    return json.loads(out)


# Llama-3.2-1B's units (tied embedding; blocks of q, k, v, o, gate, up, down and two norms; the final
# norm), each padded to 8 x 64 elements, as a GPU counts allocations (multiples of 256 bytes).
def gpu_alloc(n):
    return (n + 255) // 256 * 256


d, kv, ff, vocab, layers, gpus = 2048, 512, 8192, 128256, 16, 8
llama_units = [vocab * d] + [d * (d + 2 * kv) + d * d + 3 * d * ff + 2 * d] * layers + [d]
shards = [shard_len(n, gpus) for n in llama_units]
base = plan_json([])
quant = plan_json(["--gather-dtype", "int8"])
want = gpu_alloc(sum(wire("int8", n) for n in shards)) + gpu_alloc(gpus * wire("int8", max(shards)))
t.check(quant["bytes"]["working_copy"] == 0 and base["bytes"]["working_copy"] > 0 and quant["quantized"] == want,
        "plan --gather-dtype int8: no bf16 working copy; quantized shards and one gather's pieces, %d bytes (plan: %d)"
        % (want, quant["quantized"]))
held = plan_json(["--strategy", "SHARD_GRAD_OP", "--grad-accum", "4"])
shared = plan_json(["--strategy", "SHARD_GRAD_OP", "--grad-accum", "4", "--accumulate", "sharded"])
want = sum(gpu_alloc(n * 4) for n in llama_units[:1] + llama_units[-1:]) + gpu_alloc(sum(llama_units[1:-1]) * 4)
t.check(held["accumulate"] == "local" and held["grad_slots"] == len(llama_units) and
        held["bytes"]["unit_gradient_buffers"] == want and shared["grad_slots"] < len(llama_units),
        "plan SHARD_GRAD_OP --grad-accum 4: local accumulation holds an fp32 gradient buffer per unit (%d slots, %d "
        "bytes; plan: %d slots, %d bytes; sharded: %d slots)" % (len(llama_units), want, held["grad_slots"],
                                                               held["bytes"]["unit_gradient_buffers"],
                                                               shared["grad_slots"]))
t.finish()
