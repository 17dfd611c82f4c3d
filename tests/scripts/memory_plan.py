"""`fsdp plan` against a direct count of what the CPU backend allocates: for every strategy on 1 to
4 ranks, both model families, tied and untied embeddings, each precision, eager and flash
attention, gradient rows and dense, the plan's reserved bytes (fsdp plan --device cpu --json) must
equal the backend's max_reserved_bytes after a step (the metrics summary), byte for byte. The
plan one micro-batch larger must not (the comparison can fail). Also: the plan's parts add up, a
strategy changes nothing on one rank, what each --recompute mode keeps (the arena's parts, counted
here from the model's shapes), a bad --recompute refused, --mbs auto without a GPU asks for
--gpu-mem, and --mbs auto picks the largest micro-batch whose plan fits."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t

UNTIED = os.path.join(t.ROOT, "tests", "data", "tiny-llama-untied", "config.json")
PARTS = ("master_weights", "gradients", "optimizer_states", "working_copy", "gathered_units", "unit_gradient_buffers",
         "gradient_rows", "staging", "activations", "step_scalars", "cublaslt_workspace", "gemm_tuning_scratch",
         "op_scratch")

# (ranks, strategy, ranks per node, model, mbs, extra flags shared by train and plan)
CASES = [
    (1, "FULL", 0, "tiny-llama", 3, []),
    (2, "FULL", 0, "tiny-llama", 3, []),
    (2, "SHARD_GRAD_OP", 0, UNTIED, 2, []),
    (2, "NO_SHARD", 0, "tiny-opt", 2, []),
    (3, "FULL", 0, UNTIED, 2, ["--attn", "eager", "--embedding-grads", "dense"]),
    (3, "SHARD_GRAD_OP", 0, "tiny-opt", 2, ["--model-precision", "bf16"]),
    (3, "NO_SHARD", 0, UNTIED, 1, ["--reduce-dtype", "bf16"]),
    (4, "FULL", 0, "tiny-opt", 2, ["--max-live-units", "1", "--mixed-precision", "no"]),
    (4, "SHARD_GRAD_OP", 0, "tiny-llama", 1, ["--embedding-grads", "rows", "--attn", "eager"]),
    (4, "NO_SHARD", 0, "tiny-llama", 2, ["--model-precision", "bf16", "--attn", "eager"]),
    (4, "HYBRID", 2, UNTIED, 2, ["--reduce-dtype", "bf16"]),
    (2, "HYBRID", 1, "tiny-opt", 3, ["--head-chunk-tokens", "7"]),
    (2, "FULL", 0, "tiny-opt", 2, ["--dropout", "0.1", "--attn", "eager"]),
    (2, "FULL", 0, "tiny-llama", 2, ["--attn", "flash-atomic"]),
    (2, "SHARD_GRAD_OP", 0, "tiny-llama", 2, ["--attn", "cudnn"]),  # on the CPU: its exact attention
    (3, "SHARD_GRAD_OP", 0, "tiny-llama", 2, ["--dropout", "0.1"]),
    # Activation recomputation: what the layers keep, with every attention and dropout path.
    (1, "FULL", 0, "tiny-llama", 3, ["--recompute", "full"]),
    (2, "FULL", 0, "tiny-opt", 2, ["--recompute", "selective", "--attn", "eager", "--dropout", "0.1"]),
    (2, "SHARD_GRAD_OP", 0, UNTIED, 3, ["--recompute", "full", "--attn", "eager"]),
    (3, "NO_SHARD", 0, "tiny-llama", 2, ["--recompute", "selective", "--model-precision", "bf16"]),
    (4, "HYBRID", 2, "tiny-opt", 2, ["--recompute", "full", "--dropout", "0.1"]),
]


def plan(n, strategy, rpn, model, mbs, extra, more=()):
    nodes = n // rpn if strategy == "HYBRID" else 1
    args = ["plan", "--model", model, "--gpus", str(n), "--nodes", str(nodes), "--strategy", strategy, "--mbs",
            str(mbs), "--seq", "16", "--device", "cpu", "--json"] + extra + list(more)
    rc, out, err = t.run(1, args, check=False)
    if rc != 0:
        t.fail("plan failed (%d): %s %s" % (rc, " ".join(args), err[-500:]))
        return None
    return json.loads(out)


def measured(n, strategy, rpn, model, mbs, extra, tag):
    d = t.tmpdir("memory-plan-%s" % tag)
    path = os.path.join(d, "m.jsonl")
    args = ["train", "--model", model, "--strategy", strategy, "--mbs", str(mbs), "--seq", "16", "--steps", "1",
            "--synthetic-vocab", "997", "--metrics", path] + extra
    if rpn:
        args += ["--ranks-per-node", str(rpn)]
    rc, _, _ = t.run(n, args, check=True)
    if rc != 0:
        return None
    _, summary = t.metrics(path)
    return summary


for i, (n, strategy, rpn, model, mbs, extra) in enumerate(CASES):
    name = "%d ranks %s %s mbs %d %s" % (n, strategy, os.path.basename(model), mbs, " ".join(extra))
    p = plan(n, strategy, rpn, model, mbs, extra)
    s = measured(n, strategy, rpn, model, mbs, extra, str(i))
    if not p or not s:
        continue
    b = p["bytes"]
    t.check(sum(b[k] for k in PARTS) == b["reserved"], "%s: the plan's parts add up to its %d bytes" % (name, b["reserved"]))
    t.check(s["max_reserved_bytes"] == b["reserved"],
            "%s: plan %d bytes == CPU backend's max_reserved_bytes %d" % (name, b["reserved"], s["max_reserved_bytes"]))
    t.check(s["plan_reserved_bytes"] == b["reserved"], "%s: the run's own plan says the same" % name)
    bigger = plan(n, strategy, rpn, model, mbs + 1, extra)
    if bigger:
        t.check(bigger["bytes"]["reserved"] != s["max_reserved_bytes"],
                "%s: the plan one micro-batch larger (%d bytes) differs from the measurement" % (name, bigger["bytes"]["reserved"]))

# Dropout after attention and the MLP keeps two more [tokens, hidden] buffers in the arena (tiny-opt,
# 2 x 16 tokens of 40 floats: 5120 bytes each); attention dropout alone (Llama) keeps none.
opt = [plan(2, "FULL", 0, "tiny-opt", 2, ["--dropout", p])["bytes"]["activations"] for p in ("0", "0.1")]
t.check(2 * 5120 <= opt[1] - opt[0] < 2 * (5120 + 256),
        "tiny-opt: --dropout 0.1 adds %d bytes of activations (2 x 5120, each 256-byte aligned)" % (opt[1] - opt[0]))
llama = [plan(2, "FULL", 0, "tiny-llama", 2, ["--dropout", p])["bytes"]["activations"] for p in ("0", "0.1")]
t.check(llama[0] == llama[1], "tiny-llama: attention dropout adds no activations (%d bytes both)" % llama[0])
# On a GPU, eager attention with dropped probabilities keeps them beside dP in the op scratch:
# 2 x batch x heads x seq x seq bf16 values (Llama-3.2-1B, 2 x 32 x 1024 x 1024).
gpu = []
for p in ("0", "0.1"):
    rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "2", "--seq", "1024", "--attn", "eager",
                             "--dropout", p, "--gpu-mem", "80", "--json"], check=True)
    gpu.append(json.loads(out)["bytes"]["op_scratch"] if rc == 0 else None)
t.check(gpu == [2 * 32 * 1024 * 1024 * 2, 2 * 2 * 32 * 1024 * 1024 * 2],
        "llama-3.2-1b eager on a GPU: op scratch %d without and %d with attention dropout" % tuple(gpu))
# --attn flash-atomic's backward keeps dQ's fp32 sums beside delta: Llama-2-7B at 5 x 4096 on a GPU,
# delta 5 x 32 x 4096 floats, then 5 x 4096 x 32 x 128 floats; flash's scratch is then the norms' (smaller).
scr = {}
for attn in ("flash", "flash-atomic"):
    rc, out, err = t.run(1, ["plan", "--model", "llama-2-7b", "--mbs", "5", "--seq", "4096", "--attn", attn,
                             "--gpu-mem", "141", "--json"], check=True)
    scr[attn] = json.loads(out)["bytes"]["op_scratch"] if rc == 0 else None
t.check(scr["flash-atomic"] == 5 * 32 * 4096 * 4 + 5 * 4096 * 32 * 128 * 4 and scr["flash"] < scr["flash-atomic"],
        "llama-2-7b at 5 x 4096 on a GPU: op scratch %s with --attn flash, %s with flash-atomic" % (scr["flash"],
                                                                                                  scr["flash-atomic"]))
# --attn cudnn: the same fp32 dQ sums and deltas, each 256-byte aligned, and cuDNN's engine workspace
# (256 bytes with as many kv heads as query heads; with grouped heads also the per-query-head dK and dV
# in bf16: Llama-3.2-1B at 32 x 1024, 32 query heads of 64 over 8 kv heads). test_gpu_backend holds
# these equal to what cuDNN asks for.
def scratch(model, mbs, seq, attn):
    rc, out, err = t.run(1, ["plan", "--model", model, "--mbs", str(mbs), "--seq", str(seq), "--attn", attn,
                             "--gpu-mem", "141", "--json"], check=True)
    return json.loads(out)["bytes"]["op_scratch"] if rc == 0 else None
cudnn_7b, cudnn_1b = scratch("llama-2-7b", 5, 4096, "cudnn"), scratch("llama-3.2-1b", 32, 1024, "cudnn")
t.check(cudnn_7b == 5 * 4096 * 32 * 128 * 4 + 5 * 32 * 4096 * 4 + 256,
        "llama-2-7b at 5 x 4096 on a GPU: op scratch %s with --attn cudnn" % cudnn_7b)
rows_1b = 32 * 32 * 1024
t.check(cudnn_1b == rows_1b * 64 * 4 + rows_1b * 4 + 2 * rows_1b * 64 * 2 + 256,
        "llama-3.2-1b at 32 x 1024 on a GPU: op scratch %s with --attn cudnn" % cudnn_1b)

# What each --recompute mode keeps, counted from tiny-llama's shapes (2 layers, hidden 48, ffn 88, 6/2
# heads of 8; micro-batch 2 x 16 tokens; 4-byte values on the CPU backend), within each tensor's
# 256-byte alignment: full keeps each layer's input and one layer of everything else; selective keeps
# the inputs and the products' outputs (q|k|v, attention output, residual, gate|up; lse with flash)
# and recomputes the norms, the SwiGLU output and (eager) the probabilities with lse into one layer.
N, C, F, QKV, L = 32, 48, 88, 80, 2
LSE, PROBS, STATS = 2 * 6 * 16 * 4, 2 * 6 * 16 * 16 * 4, N * 4
for attn in ("flash", "eager"):
    eager = PROBS if attn == "eager" else 0
    products = N * (QKV + C + C + 2 * F) * 4
    recomputed = N * (C + C + F) * 4 + 2 * STATS
    expect = {"none": (L * (N * C * 4 + products + recomputed + LSE + eager), 0),
              "selective": (L * (N * C * 4 + products + (LSE if not eager else 0)), recomputed + (LSE + eager if eager else 0)),
              "full": (L * N * C * 4, products + recomputed + LSE + eager)}
    other = set()
    for mode, (layers, slot) in expect.items():
        p = plan(1, "FULL", 0, "tiny-llama", 2, ["--recompute", mode, "--attn", attn])
        a = p["activation_parts"]
        other.add(a["other"])
        t.check(0 <= a["kept_by_layers"] - layers < 256 * 11 * L and 0 <= a["recomputed_layer"] - slot < 256 * 11
                and a["kept_by_layers"] + a["recomputed_layer"] + a["other"] == p["bytes"]["activations"],
                "tiny-llama %s, --recompute %s: the layers keep %d bytes (%d counted), one layer %d (%d), parts add up"
                % (attn, mode, a["kept_by_layers"], layers, a["recomputed_layer"], slot))
    t.check(len(other) == 1, "tiny-llama %s: the backward scratch is the same in every mode (%s)" % (attn, sorted(other)))
# Llama-3.2-1B on a GPU, micro-batch 32 x 1024 in bf16: full keeps 16 layer inputs of 32 x 1024 x 2048 x 2
# bytes, 2 GiB; the plan with it takes a larger micro-batch into the same 80 GiB.
big = {}
for mode in ("none", "selective", "full"):
    rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "32", "--recompute", mode, "--gpu-mem", "80",
                             "--json"], check=True)
    big[mode] = json.loads(out) if rc == 0 else None
if all(big.values()):
    t.check(big["full"]["activation_parts"]["kept_by_layers"] == 16 * 32 * 1024 * 2048 * 2 and big["full"]["recompute"] == "full",
            "llama-3.2-1b --recompute full keeps 16 x 32 x 1024 x 2048 bf16 values: %d bytes" %
            big["full"]["activation_parts"]["kept_by_layers"])
    acts = [big[m]["bytes"]["activations"] for m in ("none", "selective", "full")]
    t.check(acts[0] > acts[1] > acts[2], "llama-3.2-1b activations: none %d > selective %d > full %d bytes" % tuple(acts))
auto = {}
for mode in ("none", "full"):
    rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "auto", "--recompute", mode, "--gpu-mem", "40",
                             "--json"], check=True)
    auto[mode] = json.loads(out)["mbs"] if rc == 0 else None
t.check(auto["none"] and auto["full"] and auto["full"] > 2 * auto["none"],
        "llama-3.2-1b in 40 GiB: --mbs auto takes %s without recomputation, %s with --recompute full" % (auto["none"], auto["full"]))
rc, out, _ = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "8", "--recompute", "selective"], check=False)
t.check(rc == 0 and "recompute selective" in out and "kept by the 16 layers" in out and "one layer's recomputed" in out,
        "the table shows the mode and the arena's parts")

# On one rank every strategy is the same computation and the same memory.
one = [plan(1, s, 0, UNTIED, 2, [])["bytes"]["reserved"] for s in ("FULL", "SHARD_GRAD_OP", "NO_SHARD")]
t.check(len(set(one)) == 1, "one rank: FULL, SHARD_GRAD_OP and NO_SHARD plan the same %s bytes" % one)
# Sharding does save memory: FULL on 4 ranks plans less per rank than NO_SHARD (the comparison is not trivial).
full4 = plan(4, "FULL", 0, UNTIED, 2, [])["bytes"]["reserved"]
noshard4 = plan(4, "NO_SHARD", 0, UNTIED, 2, [])["bytes"]["reserved"]
t.check(full4 < noshard4, "4 ranks: FULL plans %d bytes per rank, NO_SHARD %d" % (full4, noshard4))

# A GPU plan of a real model: the course's breakdown in GiB, and the largest micro-batch.
rc, out, err = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "auto", "--gpu-mem", "80", "--json"], check=False)
if rc == 0:
    g = json.loads(out)
    t.check(g["mbs_auto"] and g["fits"] and g["next_mbs"] == g["mbs"] + 1 and g["next_mbs_total_gib"] > 80.0
            and g["total_gib"] <= 80.0,
            "llama-3.2-1b on an 80 GiB GPU: --mbs auto plans %d (%.2f GiB), %d would need %.2f" %
            (g["mbs"], g["total_gib"], g["next_mbs"], g["next_mbs_total_gib"]))
    pad = g["bytes"]["master_weights"] - 4 * g["parameters"]
    t.check(0 <= pad < 1 << 20 and g["bytes"]["optimizer_states"] == 2 * g["bytes"]["master_weights"]
            and g["bytes"]["working_copy"] == g["bytes"]["master_weights"] // 2,
            "one GPU, fp32 master: 4 bytes per parameter (+%d bytes of padding), Adam twice that, a bf16 working copy" % pad)
else:
    t.fail("plan of llama-3.2-1b failed: %s" % err[-300:])
rc, out, _ = t.run(1, ["plan", "--model", "llama-3.2-1b", "--mbs", "8"], check=False)
t.check(rc == 0 and "optimizer states: Adam m, v (fp32)" in out and "activations" in out and "workspace" in out,
        "the table names the lecture's parts")


def one_line_error(args, status, needles, what):
    rc, out, err = t.run(1, args, check=False)
    lines = [l for l in err.splitlines() if l.startswith("fsdp:")]
    t.check(rc == status and len(lines) == 1 and all(x in lines[0] for x in needles),
            "%s -> exit %d, %r" % (what, rc, lines[0] if lines else err[-200:]))


one_line_error(["plan", "--model", "tiny-llama", "--recompute", "partial"], 2, ["--recompute 'partial'", "selective"],
               "--recompute partial refused")
one_line_error(["plan", "--model", "tiny-llama", "--gpus", "4", "--nodes", "3"], 2, ["--nodes 3"], "nodes not dividing")
one_line_error(["plan", "--gpus", "2"], 2, ["--model"], "no --model")
one_line_error(["plan", "--model", "tiny-llama", "--gpus", "2", "--mbs", "3", "--global-batch", "8"], 2,
               ["--global-batch 8", "--mbs 3"], "--global-batch not a multiple")
if not t.has_cuda_backend():
    one_line_error(["plan", "--model", "tiny-llama", "--mbs", "auto"], 2, ["--gpu-mem", "64"],
                   "--mbs auto without a GPU asks for --gpu-mem")

# --mbs auto: the largest micro-batch whose plan fits; one more does not.
small = plan(2, "FULL", 0, UNTIED, 5, [])["bytes"]["reserved"]
larger = plan(2, "FULL", 0, UNTIED, 6, [])["bytes"]["reserved"]
limit = (small + larger) / 2 / 2 ** 30
auto = plan(2, "FULL", 0, UNTIED, "auto", [], ["--gpu-mem", "%.12f" % limit])
t.check(auto["mbs"] == 5 and auto["fits"] and auto["next_mbs"] == 6,
        "--mbs auto under %.6f GiB between the plans of 5 and 6 picks %s" % (limit, auto["mbs"]))
t.finish()
