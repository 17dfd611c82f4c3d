"""hpZ (--reshard-after-forward, src/shard/secondary.c) on CPU ranks emulating 2 nodes (--ranks-per-node).

1. The same training: with FULL, keeping a secondary copy sharded over the node after each forward and
   gathering the backward from it gives FULL's run bit for bit (losses, gradient norms, final weights and
   Adam moments: the backward computes with the forward's very bits and the reductions are FULL's), on
   4 ranks as 2 x 2 and 8 ranks as 2 x 4, a tied (tiny-llama) and an untied (tiny-qwen2) model, fp32 and
   bf16 compute, with int8 quantized gathers, prefetch 2 and 2 micro-batches; and HYBRID's (2 nodes,
   the same maths but other sums: within 1e-5). One rank per node (2 x 1, the GPU test's layout) too.
2. Where the bytes go (comm_bytes per step, against a count made here from the checkpoint's tensors):
   the world's all-gathers are the forward's only, one per unit and micro-batch; the backward's
   gathers are all in `all_gather_secondary`, the (N - 1) slices of each block in the compute dtype;
   reductions are FULL's; the summary's minimum says the same.
3. Memory: the run reserves FULL's bytes plus the secondary copy (the blocks over N ranks), as its
   memory plan says; `fsdp plan --reshard-after-forward node` counts it (bytes.secondary_copy, one
   more communicator) and --mbs auto fits with it.
4. Resume: a checkpoint written with hpZ continues under FULL as FULL's own (the copy is derived).
5. Flags: other strategies, one node, a size that does not divide the ranks and a malformed value are
   each refused in one line."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
from wirecount import padded, units, wire

STEPS = 4
COMMON = ["train", "--seq", "16", "--steps", str(STEPS), "--lr", "2e-3", "--warmup", "2", "--weight-decay", "0.1",
          "--clip", "1.0", "--model-precision", "fp32", "--embedding-grads", "dense", "--log-every", "100"]
FP32 = ["--mixed-precision", "no"]
BF16 = ["--mixed-precision", "bf16"]
HPZ = ["--reshard-after-forward", "node"]


def train(n, tag, extra, ckpt_every=0):
    d = t.tmpdir("hpz-" + tag)
    args = COMMON + ["--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt")] + list(extra)
    if ckpt_every:
        args += ["--ckpt-every", str(ckpt_every)]
    _, out, _ = t.run(n, args)
    steps, summary = t.metrics(os.path.join(d, "m.jsonl"))
    return {"steps": steps, "summary": summary, "out": out, "dir": d,
            "ckpt": os.path.join(d, "ckpt", "step-%08d.h5" % STEPS)}


def expected_gathers(ckpt, world, node, gather_dtype, compute_dtype, microbatches):
    """(world all-gathers, secondary all-gathers, FULL's all-gathers) per step."""
    embed, blocks, head = units(ckpt)
    once = sum((world - 1) * wire(gather_dtype, padded(n, world) // world) for n in [embed] + blocks + [head])
    backward = sum((world - 1) * wire(gather_dtype, padded(n, world) // world) for n in blocks)
    secondary = sum((node - 1) * wire(compute_dtype, padded(n, world) // node) for n in blocks)
    return once * microbatches, secondary * microbatches, (once + backward) * microbatches


def grad_norms(run):
    return [r["grad_norm"] for r in run["steps"]]


# ---- 1. and 2.: the same training, and where the bytes go ----
CASES = [  # (ranks, ranks per node, model, flags, gather dtype, compute dtype, micro-batches, compare with HYBRID)
    (4, 2, "tiny-llama", FP32, "fp32", "fp32", 1, True),
    (8, 4, "tiny-llama", BF16 + ["--gather-dtype", "int8", "--prefetch", "2", "--grad-accum", "2"], "int8", "bf16", 2,
     False),
    (8, 4, "tiny-qwen2", FP32, "fp32", "fp32", 1, True),
    (2, 1, "tiny-llama", BF16, "bf16", "bf16", 1, False),
]
if t.SANITIZED:  # the first and last layouts: every code path of the others runs in them
    CASES = CASES[:1] + CASES[-1:]
runs = {}
for n, rpn, model, flags, gdt, cdt, accum, vs_hybrid in CASES:
    mbs = str(24 // (n * accum))
    base = ["--model", model, "--mbs", mbs, "--ranks-per-node", str(rpn)] + flags
    what = "%s on %d ranks as 2 nodes of %d (%s compute, %s gathers, %d micro-batch(es))" % (model, n, rpn, cdt, gdt,
                                                                                            accum)
    tag = "%s-%d-%d-%s-%s" % (model, n, rpn, gdt, cdt)
    full = train(n, tag + "-full", base + ["--strategy", "FULL"])
    hpz = train(n, tag + "-hpz", base + ["--strategy", "FULL"] + HPZ, ckpt_every=2)
    runs[(n, rpn, model, gdt)] = (full, hpz)
    t.check(re.search(r"shard group %d, replica group 1, hpZ: resharded to %d after forward\)" % (n, rpn), hpz["out"])
            is not None, "%s: the run says it reshards to the node's %d ranks" % (what, rpn))
    t.check(hpz["summary"]["reshard_after_forward"] == rpn and full["summary"]["reshard_after_forward"] is None,
            "%s: the summary records reshard_after_forward %d" % (what, rpn))
    t.check([r["loss"] for r in hpz["steps"]] == [r["loss"] for r in full["steps"]] and
            grad_norms(hpz) == grad_norms(full) and len(hpz["steps"]) == STEPS,
            "%s: hpZ's losses and gradient norms are FULL's bit for bit (%s)" % (
                what, ", ".join("%.6f" % r["loss"] for r in hpz["steps"])))
    t.compare_checkpoints(hpz["ckpt"], full["ckpt"], 0, what + ": hpZ's final weights and moments vs FULL's",
                          exact=True)
    if vs_hybrid:
        hybrid = train(n, tag + "-hybrid", base + ["--strategy", "HYBRID"])
        t.compare_losses(hpz["steps"], hybrid["steps"], 1e-5, what + ": hpZ vs HYBRID")
        worst = max(abs(a - b) / b for a, b in zip(grad_norms(hpz), grad_norms(hybrid)))
        t.check(worst <= 1e-5, "%s: gradient norms of hpZ and HYBRID agree (worst %.1e)" % (what, worst))
        t.compare_checkpoints(hpz["ckpt"], hybrid["ckpt"], 1e-5, what + ": hpZ's final weights vs HYBRID's")

    world_bytes, secondary_bytes, full_bytes = expected_gathers(full["ckpt"], n, rpn, gdt, cdt, accum)
    got = [(r["comm_bytes"]["all_gather"], r["comm_bytes"]["all_gather_secondary"]) for r in hpz["steps"][1:]]
    t.check(all(g == (world_bytes, secondary_bytes) for g in got),
            "%s: every step gathers %d bytes over the world (the forward's) and %d inside the node (the backward's) "
            "(got %s)" % (what, world_bytes, secondary_bytes, got[0] if got else None))
    got_full = [(r["comm_bytes"]["all_gather"], r["comm_bytes"]["all_gather_secondary"]) for r in full["steps"][1:]]
    t.check(all(g == (full_bytes, 0) for g in got_full),
            "%s: FULL gathers %d bytes over the world, forward and backward (got %s)" % (
                what, full_bytes, got_full[0] if got_full else None))
    t.check(all(a["comm_bytes"][k] == b["comm_bytes"][k] for a, b in zip(hpz["steps"], full["steps"])
                for k in ("reduce", "all_reduce", "other")),
            "%s: reductions and the gradient norm send FULL's bytes" % what)
    mins = hpz["summary"]["comm_bytes_min"]
    t.check((mins["all_gather"], mins["all_gather_secondary"]) == (world_bytes // accum, secondary_bytes // accum) and
            mins["reduce"] == full["summary"]["comm_bytes_min"]["reduce"],
            "%s: the summary's minimum is one micro-batch's, the backward's gathers inside the node (%s)" % (what, mins))

    # ---- 3. memory: FULL's plus the secondary copy (CPU: 4 bytes per element, no rounding) ----
    _, blocks, _ = units(full["ckpt"])
    copy = sum(padded(b, n) // rpn for b in blocks) * 4
    s, f = hpz["summary"], full["summary"]
    t.check(s["max_reserved_bytes"] == s["plan_reserved_bytes"] and
            s["max_reserved_bytes"] - f["max_reserved_bytes"] == copy,
            "%s: hpZ reserves FULL's bytes plus the secondary copy, %d bytes, as its plan says (%d - %d)" % (
                what, copy, s["max_reserved_bytes"], f["max_reserved_bytes"]))


# ---- 3. `fsdp plan` ----
def plan(extra, mbs="4"):
    _, out, _ = t.run(1, ["plan", "--model", "llama-3.2-1b", "--gpus", "16", "--nodes", "2", "--device", "cuda",
                          "--mbs", mbs] + extra)
    return out


def gpu_alloc(nbytes):
    return (nbytes + 255) // 256 * 256


d, kv, ff = 2048, 512, 8192
block = d * (d + 2 * kv) + d * d + 3 * d * ff + 2 * d  # Llama-3.2-1B: q, k, v, o, gate, up, down, two norms
want = gpu_alloc(16 * (padded(block, 16) // 8) * 2)   # 16 blocks, 1/8 of each in bf16
full_plan = json.loads(plan(["--json"]))
hpz_plan = json.loads(plan(["--json"] + HPZ))
t.check(hpz_plan["bytes"]["secondary_copy"] == want and full_plan["bytes"]["secondary_copy"] == 0 and
        hpz_plan["bytes"]["reserved"] - full_plan["bytes"]["reserved"] == want and
        hpz_plan["communicators"] == full_plan["communicators"] + 1 and hpz_plan["reshard_after_forward"] == 8,
        "plan llama-3.2-1b on 2 nodes of 8: the secondary copy is the 16 blocks in bf16 over 8 GPUs, %d bytes "
        "(plan: %d), reserved on top of FULL's, with one more communicator" % (want, hpz_plan["bytes"]["secondary_copy"]))
parts = sum(v for k, v in hpz_plan["bytes"].items() if k not in ("reserved", "outside", "total"))
t.check(parts == hpz_plan["bytes"]["reserved"], "plan with hpZ: its parts, the secondary copy included, add up to "
        "its reserved bytes (%d = %d)" % (parts, hpz_plan["bytes"]["reserved"]))
text = plan(HPZ)
t.check(re.search(r"secondary copy, hpZ \(bf16\)\s+\d+\.\d\d\s+the blocks in shards of 1/8", text) is not None and
        "shard group 16, replica group 1, hpZ: resharded to 8 after forward |" in text,
        "plan's text names hpZ and shows the secondary copy in its table")
auto_full = json.loads(plan(["--json", "--gpu-mem", "12"], mbs="auto"))
auto_hpz = json.loads(plan(["--json", "--gpu-mem", "12"] + HPZ, mbs="auto"))
t.check(auto_hpz["mbs"] <= auto_full["mbs"] and auto_hpz["fits"] and auto_hpz["next_mbs_total_gib"] > 12 and
        auto_hpz["bytes"]["secondary_copy"] == want,
        "plan --mbs auto counts the secondary copy: micro-batch %d with hpZ, %d without, in 12 GiB" % (
            auto_hpz["mbs"], auto_full["mbs"]))

# ---- 4. resume: hpZ's checkpoint continues under FULL as FULL's own run ----
full, first = runs[(4, 2, "tiny-llama", "fp32")]
base = ["--model", "tiny-llama", "--mbs", "6", "--ranks-per-node", "2", "--strategy", "FULL"] + FP32
d = t.tmpdir("hpz-resume-full")
t.run(4, COMMON + base + ["--metrics", os.path.join(d, "m.jsonl"), "--ckpt-dir", os.path.join(d, "ckpt"), "--resume",
                          os.path.join(first["dir"], "ckpt", "step-00000002.h5")])
resumed, _ = t.metrics(os.path.join(d, "m.jsonl"))
t.check([r["loss"] for r in resumed] == [r["loss"] for r in full["steps"][2:]] and len(resumed) == STEPS - 2,
        "a checkpoint of step 2 written with hpZ resumes under FULL to FULL's losses bit for bit")
t.compare_checkpoints(os.path.join(d, "ckpt", "step-%08d.h5" % STEPS), full["ckpt"], 0,
                      "hpZ step 2 resumed under FULL: final weights and moments vs FULL's", exact=True)

# ---- 5. flags ----
rc, out, err = t.run(4, COMMON + ["--model", "tiny-llama", "--mbs", "6", "--ranks-per-node", "2", "--strategy", "HYBRID"]
                     + HPZ, check=False)
lines = [l for l in (out + err).splitlines() if l.startswith("fsdp:")]
t.check(rc != 0 and len(lines) == 1 and "--reshard-after-forward" in lines[0] and "FULL" in lines[0],
        "train --strategy HYBRID --reshard-after-forward node is refused in one line: %s" % lines)
for extra, needle in ((["--nodes", "1"] + HPZ, "one node"), (["--nodes", "2", "--reshard-after-forward", "3"], "divide"),
                      (["--nodes", "2", "--reshard-after-forward", "nodes"], "'nodes'")):
    rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--gpus", "16"] + extra, check=False)
    lines = [l for l in (out + err).splitlines() if l.strip()]
    t.check(rc != 0 and len(lines) == 1 and needle in lines[0] and "--reshard-after-forward" in lines[0],
            "plan %s is refused in one line naming the flag: %s" % (" ".join(extra), lines))
t.finish()
