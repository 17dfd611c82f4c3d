/* `fsdp plan`: the memory a training configuration reserves per GPU, broken down as the course's
 * lecture on memory and batch size does, and with --mbs auto the largest micro-batch that fits.
 * No GPU and no MPI ranks needed: the arithmetic is src/train/memory_plan.c, the same functions
 * that size the trainer's allocations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../base/log.h"
#include "../io/jsonio.h"
#include "../train/memory_plan.h"
#include "../train/reshard.h"
#include "../train/trainer.h"
#include "commands.h"
#include "plan_links.h"

static const char *const ATTN[] = FSDP_ATTN_NAMES;
static const char *const EMBED_GRADS[] = {"auto", "dense", "rows", NULL};
static const char *const RECOMPUTE[] = {"none", "selective", "full", NULL};
static const char *const FP8[] = {"none", "tensorwise", "rowwise", NULL};
static const char *const DEVICES[] = {"cuda", "cpu", NULL};

static const char EPILOGUE[] =
    "Every figure is what fsdp.c allocates itself, per GPU (the same on every rank), as `fsdp train` prints it\n"
    "in 'Max reserved GPU memory' (max_reserved_gib in the metrics): the same functions size the trainer's\n"
    "allocations. The CUDA context, NCCL's and cuBLAS's own buffers are outside it; the plan adds an estimate of\n"
    "them when it decides what fits, and `fsdp train` prints the measured value at the end.\n"
    "  fsdp plan --model llama-3.2-1b --gpus 1 --mbs auto --gpu-mem 80\n"
    "  fsdp plan --model llama-2-7b --gpus 8 --nodes 2 --strategy HYBRID --mbs auto --gpu-mem 64 --json\n"
    "With --link-gbps (or --compute-from, --calibrate, --compute-tflops) it also predicts the step time and\n"
    "tokens/s of every strategy and wire option on that link, fastest first (README: \"Choosing a configuration\n"
    "for your link\"):\n"
    "  fsdp plan --model llama-3.2-1b --nodes 2 --gpus-per-node 4 --mbs auto --gpu-mem 64 --link-gbps 25 \\\n"
    "      --compute-from run.jsonl\n"
    "MareNostrum-5's accelerated nodes have H100s with 64 GB: --gpu-mem 64. --device cpu plans the CPU\n"
    "backend (bf16 stored as fp32), whose --memory-limit plays the part of --gpu-mem.\n";

typedef struct {
    const fsdp_model_config *cfg;
    const fsdp_train_options *o;
    fsdp_plan_place place;
    fsdp_memory_plan plan;
    size_t budget;         /* bytes per GPU, 0 = unknown */
    const char *gpu_name;
    int nodes;
    int next_mbs;          /* --mbs auto: the next one up, and its plan */
    fsdp_memory_plan next;
} plan_report;

/* 1235814400 -> "1,235,814,400" */
static const char *grouped(long long n, char buf[32]) {
    char digits[24];
    int len = snprintf(digits, sizeof digits, "%lld", n), out = 0;
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0) buf[out++] = ',';
        buf[out++] = digits[i];
    }
    buf[out] = 0;
    return buf;
}

static fsdp_size_unit g_unit; /* of the table: GiB for real models, MiB or KiB for tiny ones */

static void row(const char *what, size_t bytes, const char *note) {
    printf("  %-50s %8.2f%s%s\n", what, (double)bytes / g_unit.bytes, note ? "   " : "", note ? note : "");
}

/* The arena's parts under the recomputation mode: what every layer keeps, the one layer that
 * recomputation fills in the backward, and the rest. */
static void print_activation_parts(const plan_report *r) {
    const fsdp_activation_parts *a = &r->plan.activation_parts;
    int L = r->cfg->num_layers, swiglu = fsdp_block_kind_of(r->cfg).swiglu;
    int eager = r->o->attn == FSDP_ATTN_EAGER;
    char what[96], note[160];
    snprintf(what, sizeof what, "  kept by the %d layers for the backward", L);
    switch (r->o->recompute) {
    case FSDP_RECOMPUTE_FULL:
        snprintf(note, sizeof note, "--recompute full: each layer's input (the residual stream)");
        break;
    case FSDP_RECOMPUTE_SELECTIVE:
        snprintf(note, sizeof note, "--recompute selective: inputs, q|k|v, attention outputs, residuals, %s%s",
                 swiglu ? "gate|up" : "relu(fc1)", eager ? "" : ", lse");
        break;
    default:
        snprintf(note, sizeof note, "--recompute none: every tensor the backward reads%s",
                 eager ? " (seq x seq probabilities included)" : "");
    }
    row(what, a->layers, note);
    if (r->o->recompute == FSDP_RECOMPUTE_FULL)
        snprintf(note, sizeof note, "the layer whose forward the backward runs again");
    else
        snprintf(note, sizeof note, "the norms%s%s, recomputed in the backward", swiglu ? ", SwiGLU" : "",
                 eager ? ", probabilities and lse" : "");
    if (r->o->recompute != FSDP_RECOMPUTE_NONE) row("  one layer's recomputed tensors", a->recompute, note);
    row("  backward scratch, LM-head chunk, last output", a->other, NULL);
}

static void print_text(const plan_report *r) {
    const fsdp_train_options *o = r->o;
    const fsdp_memory_plan *p = &r->plan;
    const fsdp_engine_memory *e = &p->engine;
    const char *unit = r->place.device == FSDP_DEVICE_CUDA ? "GPU" : "rank";
    char model[256], what[96], note[160], dropout[160];
    fsdp_model_config_describe(r->cfg, model, sizeof model);
    fsdp_model_shape shape = fsdp_plan_model_shape(r->cfg, o);
    fsdp_dropout_rates_describe(&shape.dropout, dropout, sizeof dropout);
    double params = (double)fsdp_model_num_params(r->cfg);
    printf("fsdp plan: %s (%s), %.2f%s parameters\n", r->cfg->name, model, params >= 1e9 ? params / 1e9 : params / 1e6,
           params >= 1e9 ? "B" : "M");
    char hpz[64] = ""; /* --reshard-after-forward */
    if (e->secondary_size) snprintf(hpz, sizeof hpz, ", hpZ: resharded to %d after forward", e->secondary_size);
    printf("%d %s%s on %d node%s (%s) | %s: shard group %d, replica group %d%s | %s master, %s compute, %s reduce, %s gather, %s accumulation | "
           "%s attention | embedding gradient %s | recompute %s | dropout %s\n",
           r->place.world, unit, r->place.world > 1 ? "s" : "", r->nodes, r->nodes > 1 ? "s" : "",
           r->gpu_name && *r->gpu_name ? r->gpu_name : fsdp_device_kind_name(r->place.device),
           fsdp_strategy_name(o->strategy), e->shard_size, e->replica_size, hpz, fsdp_dtype_name(o->master_dtype),
           fsdp_dtype_name(o->compute_dtype), fsdp_dtype_name(o->reduce_dtype), fsdp_dtype_name(o->gather_dtype),
           fsdp_plan_accumulate_local(o, r->place.world) ? "local" : "sharded", fsdp_attn_name(o->attn), p->embed_rows ? "rows" : "dense",
           fsdp_recompute_name(o->recompute), dropout);
    printf("micro-batch %d x sequence %d", o->mbs, o->seq);
    if (o->global_batch) printf(" x %d accumulation = global batch %d", o->grad_accum, o->global_batch);
    else if (o->grad_accum > 1) printf(" x %d accumulation", o->grad_accum);
    char b[32], n[32];
    if (o->mbs_auto)
        printf(" (--mbs auto: the largest that fits in %s per %s; %d would need %s)", fsdp_bytes_text((double)r->budget, b),
               unit, r->next_mbs, fsdp_bytes_text((double)r->next.total, n));
    g_unit = fsdp_size_unit_for(p->total > r->budget ? p->total : r->budget);
    printf("\n\nper %s%*s %s\n", unit, (int)(53 - strlen(unit)), "", g_unit.name);
    snprintf(what, sizeof what, "master weights (%s)", fsdp_dtype_name(o->master_dtype));
    char count[32];
    snprintf(note, sizeof note, "%s parameters in shards of 1/%d", grouped(fsdp_model_num_params(r->cfg), count),
             e->shard_size);
    row(what, e->master, note);
    snprintf(what, sizeof what, "gradients (%s)", fsdp_dtype_name(o->master_dtype));
    row(what, e->grads, NULL);
    snprintf(what, sizeof what, "optimizer states: Adam m, v (%s)", fsdp_dtype_name(o->master_dtype));
    row(what, p->optimizer_states, NULL);
    snprintf(what, sizeof what, "working copy (%s)", fsdp_dtype_name(o->compute_dtype));
    row(what, e->working, e->working ? NULL : "the master weights themselves");
    snprintf(what, sizeof what, "gathered units (%d slots in %d rings)", e->gathered_slots, e->gathered_rings);
    row(what, e->gathered, e->shard_size == 1 ? "nothing to gather" : NULL);
    snprintf(what, sizeof what, "unit gradient buffers (%d slots in %d rings)", e->grad_slots, e->grad_rings);
    row(what, e->grad_buffers, e->grad_rings ? NULL : "the backward writes into the gradient shards");
    if (e->grad_rows) row("gradient rows of every rank (embedding)", e->grad_rows, NULL);
    if (e->staging) row("reduction pieces (all-to-all: sent, received, summed)", e->staging, NULL);
    if (e->quantized) {
        snprintf(what, sizeof what, "quantized shards and gathers (%s)", fsdp_dtype_name(o->gather_dtype));
        row(what, e->quantized, "instead of the working copy");
    }
    if (e->fp8_weights)
        row("FP8 weights of the gathered units (W, W^T)", e->fp8_weights,
            "and their scales: the products read these codes");
    if (e->secondary_size) {
        snprintf(what, sizeof what, "secondary copy, hpZ (%s)", fsdp_dtype_name(o->compute_dtype));
        snprintf(note, sizeof note, "the blocks in shards of 1/%d, kept from forward to backward",
                 e->secondary_size);
        row(what, e->secondary, note);
    }
    row("activations (one micro-batch, the model's arena)", p->activations, NULL);
    print_activation_parts(r);
    snprintf(note, sizeof note, "cuBLASLt %.2f, GEMM tuning %.2f, op scratch %.2f",
             (double)p->workspace.lt_workspace / g_unit.bytes, (double)p->workspace.tune_scratch / g_unit.bytes,
             (double)p->workspace.op_scratch / g_unit.bytes);
    row("workspace", p->workspace.total + p->step_scalars, r->place.device == FSDP_DEVICE_CUDA ? note : NULL);
    printf("  %s\n", "-------------------------------------------------------------");
    row("reserved by fsdp.c (max_reserved_gib)", p->reserved, NULL);
    if (r->place.device == FSDP_DEVICE_CUDA) {
        snprintf(note, sizeof note, "CUDA context and %d NCCL communicator%s", e->communicators,
                 e->communicators == 1 ? "" : "s");
        row("outside fsdp.c (estimate)", p->outside, note);
    }
    if (r->budget)
        snprintf(note, sizeof note, "of %s: %s", fsdp_bytes_text((double)r->budget, b),
                 p->total <= r->budget ? "fits" : "does not fit");
    row("total", p->total, r->budget ? note : NULL);
}

static json_t *plan_json(const plan_report *r) {
    const fsdp_train_options *o = r->o;
    const fsdp_memory_plan *p = &r->plan;
    const fsdp_engine_memory *e = &p->engine;
    json_t *bytes = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                              "master_weights", (json_int_t)e->master, "gradients", (json_int_t)e->grads,
                              "optimizer_states", (json_int_t)p->optimizer_states, "working_copy", (json_int_t)e->working,
                              "gathered_units", (json_int_t)e->gathered, "unit_gradient_buffers",
                              (json_int_t)e->grad_buffers, "gradient_rows", (json_int_t)e->grad_rows, "staging",
                              (json_int_t)e->staging, "activations", (json_int_t)p->activations, "step_scalars",
                              (json_int_t)p->step_scalars, "cublaslt_workspace", (json_int_t)p->workspace.lt_workspace,
                              "gemm_tuning_scratch", (json_int_t)p->workspace.tune_scratch, "op_scratch",
                              (json_int_t)p->workspace.op_scratch, "reserved", (json_int_t)p->reserved, "outside",
                              (json_int_t)p->outside, "total", (json_int_t)p->total);
    json_t *v = json_pack("{s:s, s:I, s:s, s:i, s:i, s:s, s:i, s:i, s:i, s:b, s:i, s:i, s:s, s:s, s:s, s:s, s:s, "
                          "s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:i, s:i}",
                          "model", r->cfg->name, "parameters", (json_int_t)fsdp_model_num_params(r->cfg), "device",
                          fsdp_device_kind_name(r->place.device), "gpus", r->place.world, "nodes", r->nodes,
                          "strategy", fsdp_strategy_name(o->strategy), "shard_group", e->shard_size, "replica_group",
                          e->replica_size, "mbs", o->mbs, "mbs_auto", o->mbs_auto, "seq", o->seq, "grad_accum",
                          o->grad_accum, "model_precision", fsdp_dtype_name(o->master_dtype), "compute_dtype",
                          fsdp_dtype_name(o->compute_dtype), "reduce_dtype", fsdp_dtype_name(o->reduce_dtype), "attn",
                          fsdp_attn_name(o->attn), "embedding_grads",
                          p->embed_rows ? "rows" : "dense", "bytes", bytes, "max_reserved_gib",
                          fsdp_json_number(fsdp_gib(p->reserved)), "total_gib", fsdp_json_number(fsdp_gib(p->total)),
                          "gpu_mem_gib", r->budget ? fsdp_json_number(fsdp_gib(r->budget)) : json_null(), "fits",
                          r->budget ? json_boolean(p->total <= r->budget) : json_null(), "gathered_rings",
                          e->gathered_rings, "gathered_slots", e->gathered_slots, "grad_rings", e->grad_rings,
                          "grad_slots", e->grad_slots, "communicators", e->communicators);
    if (!v) fsdp_fatal("out of host memory building the plan's JSON");
    /* hpZ (--reshard-after-forward): its secondary copy, and the group it is sharded over (null: none). */
    if (json_object_set_new(bytes, "secondary_copy", json_integer((json_int_t)e->secondary)) ||
        json_object_set_new(bytes, "fp8_weights", json_integer((json_int_t)e->fp8_weights)) ||
        json_object_set_new(v, "reshard_after_forward", e->secondary_size ? json_integer(e->secondary_size) : json_null()))
        fsdp_fatal("out of host memory building the plan's JSON");
    fsdp_model_shape shape = fsdp_plan_model_shape(r->cfg, o);
    json_object_set_new(v, "dropout", fsdp_json_number(shape.dropout.hidden));
    json_object_set_new(v, "attention_dropout", fsdp_json_number(shape.dropout.attention));
    json_object_set_new(v, "recompute", json_string(fsdp_recompute_name(o->recompute)));
    json_object_set_new(v, "gather_dtype", json_string(fsdp_dtype_name(o->gather_dtype)));
    json_object_set_new(v, "accumulate", json_string(fsdp_plan_accumulate_local(o, r->place.world) ? "local" : "sharded"));
    json_object_set_new(v, "quantized", json_integer((json_int_t)e->quantized));
    const fsdp_activation_parts *ap = &p->activation_parts;
    json_t *parts = json_pack("{s:I, s:I, s:I}", "kept_by_layers", (json_int_t)ap->layers, "recomputed_layer",
                              (json_int_t)ap->recompute, "other", (json_int_t)ap->other);
    if (!parts) fsdp_fatal("out of host memory building the plan's JSON");
    json_object_set_new(v, "activation_parts", parts);
    if (o->mbs_auto) {
        json_object_set_new(v, "next_mbs", json_integer(r->next_mbs));
        json_object_set_new(v, "next_mbs_total_gib", fsdp_json_number(fsdp_gib(r->next.total)));
    }
    return v;
}

int fsdp_cmd_plan(int argc, char **argv) {
    fsdp_err err = {0};
    const char *model = NULL, *strategy = "FULL", *mbs_text = "4", *device = "cuda";
    fsdp_cli_precision_flags prec = FSDP_CLI_PRECISION_DEFAULTS;
    const char *attn = "flash";
    const char *embed_grads = "auto", *recompute = "none", *dropout = NULL, *reshard = NULL, *fp8 = "none";
    int gpus = 1, nodes = 1, seq = 1024, max_live = 2, head_chunk = 0, global_batch = 0, grad_accum = 1, json = 0;
    double gpu_mem = 0.0;
    int gpus_per_node = 0, prefetch = 1;
    fsdp_cli_link_flags lf = FSDP_CLI_LINK_DEFAULTS;
    fsdp_arg args[] = {
        {"model", FSDP_ARG_STRING, &model, "NAME|PATH",
         "A preset (llama-3.2-1b, llama-2-7b, opt-1.3b, tiny-llama, tiny-opt) or a Hugging Face config.json (or its "
         "directory). Required.", 1, 0, NULL, 0},
        {"gpus", FSDP_ARG_INT, &gpus, "N", "GPUs (ranks) in all.", 1, 1 << 20, NULL, 0},
        {"nodes", FSDP_ARG_INT, &nodes, "K", "Nodes the GPUs are spread over (HYBRID shards inside a node).", 1, 1 << 20,
         NULL, 0},
        {"strategy", FSDP_ARG_STRING, &strategy, "S", "FULL, SHARD_GRAD_OP, NO_SHARD or HYBRID (as fsdp train).", 1, 0,
         NULL, 0},
        {"reshard-after-forward", FSDP_ARG_STRING, &reshard, "node|N",
         "As fsdp train (FULL): the secondary copy of hpZ, sharded over a node of --gpus / --nodes GPUs (or N).", 1, 0,
         NULL, 0},
        {"mbs", FSDP_ARG_STRING, &mbs_text, "N|auto",
         "Micro-batch size per GPU; auto: the largest that fits in --gpu-mem.", 1, 0, NULL, 0},
        {"seq", FSDP_ARG_INT, &seq, "N", "Sequence length in tokens.", 1, 1 << 20, NULL, 0},
        {"global-batch", FSDP_ARG_INT, &global_batch, "G",
         "Samples per optimizer step over all GPUs (as fsdp train): the micro-batch must divide G / GPUs.", 0, 1 << 30,
         NULL, 0},
        {"grad-accum", FSDP_ARG_INT, &grad_accum, "N",
         "Micro-batches per optimizer step (as fsdp train; with --accumulate local they keep gradient buffers).", 1,
         1 << 20, NULL, 0},
        {"model-precision", FSDP_ARG_CHOICE, &prec.model_precision, "P",
         "Master weights, gradients and Adam states.", 1, 0, FSDP_CLI_PRECISIONS, 0},
        {"mixed-precision", FSDP_ARG_CHOICE, &prec.mixed_precision, "P", "Activations and gathered weights (auto: bf16 on GPUs, no "
         "with --device cpu).", 1, 0, FSDP_CLI_MIXED, 0},
        {"reduce-dtype", FSDP_ARG_CHOICE, &prec.reduce_dtype, "P",
         "As fsdp train: what gradient reductions send (and so the gradient buffers' precision).", 1, 0,
         FSDP_CLI_REDUCE, 0},
        {"gather-dtype", FSDP_ARG_CHOICE, &prec.gather_dtype, "P",
         "As fsdp train: what parameter gathers send (int8 and fp8 keep quantized shards).", 1, 0, FSDP_CLI_GATHER, 0},
        {"accumulate", FSDP_ARG_CHOICE, &prec.accumulate, "A", "As fsdp train.", 1, 0, FSDP_CLI_ACCUMULATE, 0},
        {"attn", FSDP_ARG_CHOICE, &attn, "A", "eager keeps the seq x seq probabilities; flash does not; flash-atomic also keeps the query "
         "gradient's fp32 sums in the backward, cudnn those and cuDNN's workspace (as fsdp train).", 1, 0, ATTN, 0},
        {"recompute", FSDP_ARG_CHOICE, &recompute, "R",
         "As fsdp train: what a layer keeps for its backward (none: everything; selective: the matrix products' "
         "outputs; full: only its input, the layer's forward is run again in the backward).", 1, 0, RECOMPUTE, 0},
        {"embedding-grads", FSDP_ARG_CHOICE, &embed_grads, "M", "As fsdp train.", 1, 0, EMBED_GRADS, 0},
        {"fp8", FSDP_ARG_CHOICE, &fp8, "S",
         "As fsdp train: FP8 block projections; a GPU plan counts their operands in the op scratch.", 1, 0, FP8, 0},
        {"dropout", FSDP_ARG_STRING, &dropout, "P",
         "As fsdp train: a rate for every dropout of the model (default: the config's). Dropout after attention and "
         "the MLP keeps two more [tokens, hidden] buffers; on eager attention's probabilities, a second "
         "[heads, seq, seq] buffer in the op scratch.", 1, 0, NULL, 0},
        {"max-live-units", FSDP_ARG_INT, &max_live, "N", "As fsdp train.", 1, 1024, NULL, 0},
        {"prefetch", FSDP_ARG_INT, &prefetch, "N", "As fsdp train (the time plan's gathers started ahead of use).", 0, 64,
         NULL, 0},
        {"head-chunk-tokens", FSDP_ARG_INT, &head_chunk, "N", "As fsdp train.", 0, 1 << 30, NULL, 0},
        {"gpu-mem", FSDP_ARG_FLOAT, &gpu_mem, "GiB",
         "Memory per GPU to fit into; 0 = the memory of this machine's GPU (64 on MareNostrum-5's H100s).", 0, 1e6,
         NULL, 0},
        {"device", FSDP_ARG_CHOICE, &device, "D", "The backend planned for.", 1, 0, DEVICES, 0},
        {"json", FSDP_ARG_BOOL, &json, NULL, "Print the plan as one JSON object.", 0, 0, NULL, 0},
        {"gpus-per-node", FSDP_ARG_INT, &gpus_per_node, "G", "GPUs of each node (instead of --gpus: --nodes x G).", 1,
         1 << 20, NULL, 0},
        {"link-gbps", FSDP_ARG_FLOAT, &lf.link_gbps, "GB/s",
         "Bus bandwidth per GPU between nodes (NCCL's busbw: NDR200 InfiniBand about 25): predicts the step time and "
         "tokens/s of each strategy and compression option on this link, fastest first.", 0, 1e6, NULL, 0},
        {"intra-gbps", FSDP_ARG_FLOAT, &lf.intra_gbps, "GB/s", "Bus bandwidth per GPU inside a node (NVLink).", 0, 1e6,
         NULL, 0},
        {"compute-from", FSDP_ARG_STRING, &lf.compute_from, "METRICS",
         "The compute rate of the time plan from a run's --metrics file (its measured step time).", 1, 0, NULL, 0},
        {"calibrate", FSDP_ARG_STRING, &lf.calibrate, "FILE",
         "Measure the compute rate now: train this model 4 steps on this rank, its metrics into FILE (for "
         "--compute-from later).", 1, 0, NULL, 0},
        {"compute-tflops", FSDP_ARG_FLOAT, &lf.compute_tflops, "T", "The compute rate itself (model TFLOP/s per GPU).", 0,
         1e6, NULL, 0},
        {"update-gbps", FSDP_ARG_FLOAT, &lf.update_gbps, "GB/s",
         "Memory traffic rate of the optimizer's update (measured 3200 on H200s; --compute-from reads it from a run's "
         "phases).", 0, 1e9, NULL, 0},
        {"interference", FSDP_ARG_FLOAT, &lf.interference, "X",
         "Overlapped compute and gradient reductions each run 1 / (1 + X) as fast (1: they take turns; 0: a perfect "
         "overlap).", 0, 100, NULL, 0},
        {"gather-interference", FSDP_ARG_FLOAT, &lf.gather_interference, "X", "The same for compute and gathers.", 0,
         100, NULL, 0},
        {"link-concurrency", FSDP_ARG_FLOAT, &lf.link_concurrency, "C",
         "A gather and a reduction at once between nodes each run 1 / (2 - C) as fast: 0 (one NIC carries both), up to "
         "1 (neither slows the other: NCCL's sockets between GPUs of one host; bench/link_concurrency.py measures C).",
         0, 1, NULL, 0},
    };
    fsdp_arg_spec spec = {"plan",
                          "Print the memory fsdp.c reserves per GPU for a training configuration, and with --mbs auto "
                          "the largest micro-batch that fits. Needs no GPU.",
                          "fsdp plan --model M [--gpus N] [--nodes K] [--strategy S] [--mbs N|auto] [--seq N] [FLAGS]",
                          EPILOGUE, args, (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);

    fsdp_train_options o;
    memset(&o, 0, sizeof o);
    int gpus_seen = fsdp_args_find(&spec, "gpus")->seen;
    if (gpus_per_node && gpus_seen && gpus != nodes * gpus_per_node)
        fsdp_usagef(&err, "plan: --gpus %d is not --nodes %d x --gpus-per-node %d", gpus, nodes, gpus_per_node);
    else if (gpus_per_node)
        gpus = nodes * gpus_per_node;
    if (fsdp_args_find(&spec, "link-gbps")->seen && lf.link_gbps <= 0.0)
        fsdp_usagef(&err, "plan: --link-gbps %g is not a bandwidth (GB/s above 0)", lf.link_gbps);
    if (err.failed || fsdp_cli_link_check("plan", &lf, &err)) fsdp_exit_error(&err, 0);
    int timed = lf.link_gbps > 0.0 || lf.compute_from || lf.calibrate || lf.compute_tflops > 0.0 ||
                fsdp_args_find(&spec, "intra-gbps")->seen;
    if (timed && nodes > 1 && lf.link_gbps <= 0.0)
        fsdp_usagef(&err, "plan: a time plan over %d nodes needs --link-gbps (the bus bandwidth per GPU between them)",
                    nodes);
    if (!model) fsdp_usagef(&err, "plan: --model is required (a preset or a config.json)");
    else if (fsdp_strategy_parse(strategy, &o.strategy))
        fsdp_usagef(&err, "plan: --strategy '%s' is not one of: FULL, SHARD_GRAD_OP, NO_SHARD, HYBRID", strategy);
    else if (gpus % nodes)
        fsdp_usagef(&err, "plan: --nodes %d does not divide the %d GPUs", nodes, gpus);
    else if (global_batch && global_batch % gpus)
        fsdp_usagef(&err, "plan: --global-batch %d is not a multiple of the %d GPUs", global_batch, gpus);
    else if (fsdp_cli_parse_mbs("plan", mbs_text, &o.mbs, &o.mbs_auto, &err) == 0)
        fsdp_cli_parse_dropout("plan", dropout, &o.dropout_set, &o.dropout_rate, &err);
    if (err.failed) fsdp_exit_error(&err, 0);
    if (global_batch && fsdp_args_find(&spec, "grad-accum")->seen)
        fsdp_usagef(&err, "plan: give --global-batch or --grad-accum, not both");
    o.device = device;
    if (err.failed || fsdp_cli_precision("plan", &prec, &o, &err)) fsdp_exit_error(&err, 0);
    o.seq = seq, o.grad_accum = grad_accum, o.global_batch = global_batch, o.max_live = max_live, o.head_chunk = head_chunk;
    o.prefetch = prefetch;
    o.attn = fsdp_attn_of(attn);
    fsdp_recompute_parse(recompute, &o.recompute); /* one of the choices: the parser checked */
    fsdp_fp8_parse(fp8, &o.fp8);                   /* likewise */
    o.embed_grads = !strcmp(embed_grads, "rows")    ? FSDP_EMBED_GRADS_ROWS
                    : !strcmp(embed_grads, "dense") ? FSDP_EMBED_GRADS_DENSE
                                                    : FSDP_EMBED_GRADS_AUTO;
    if (fsdp_plan_check_embed_rows("plan", &o, gpus, &err)) fsdp_exit_error(&err, 0);
    if (reshard && (fsdp_reshard_parse("plan", reshard, &o.reshard_after_forward, &err) ||
                    fsdp_reshard_resolve("plan", &o, gpus, gpus / nodes, 1, &err)))
        fsdp_exit_error(&err, 0);

    fsdp_model_config cfg;
    fsdp_dropout_rates rates;
    if (fsdp_train_load_model(model, &cfg, &err) ||
        fsdp_model_dropout_rates(&cfg, o.dropout_set, o.dropout_rate, &rates, &err))
        fsdp_exit_error(&err, 0);
    if (cfg.family->pos == FSDP_POS_LEARNED && seq > cfg.max_position_embeddings) {
        fsdp_usagef(&err, "plan: --seq %d exceeds the model's max_position_embeddings %d (%s has learned positions)",
                    seq, cfg.max_position_embeddings, cfg.family->model_type);
        fsdp_exit_error(&err, 0);
    }
    plan_report r;
    memset(&r, 0, sizeof r);
    r.cfg = &cfg, r.o = &o, r.nodes = nodes;
    fsdp_device_kind_parse(device, &r.place.device);
    r.place.world = gpus, r.place.node_size = gpus / nodes;
    char gpu_name[128] = "";
    r.budget = (size_t)(gpu_mem * (double)(1u << 30));
    if (!r.budget && r.place.device == FSDP_DEVICE_CUDA) r.budget = fsdp_backend_gpu_memory(gpu_name, sizeof gpu_name);
    r.gpu_name = gpu_name;

    if (o.mbs_auto) {
        if (!r.budget) {
            fsdp_usagef(&err, "plan: --mbs auto needs --gpu-mem GiB: no GPU is visible here (MareNostrum-5's H100 "
                              "nodes: --gpu-mem 64)");
            fsdp_exit_error(&err, 0);
        }
        int per_gpu = global_batch ? global_batch / gpus : 0;
        o.mbs = fsdp_memory_plan_largest_mbs(&cfg, &o, &r.place, r.budget, fsdp_memory_plan_max_mbs(seq), per_gpu,
                                             &r.plan);
        if (!o.mbs) {
            o.mbs = 1;
            fsdp_memory_plan_compute(&cfg, &o, &r.place, &r.plan);
            char b[32], t[32], res[32];
            fsdp_errf(&err, "plan: not even a micro-batch of 1%s fits in %s per GPU: it needs %s (%s reserved by "
                            "fsdp.c); use more GPUs, a sharding strategy%s or --model-precision bf16",
                      global_batch ? " dividing the --global-batch" : "", fsdp_bytes_text((double)r.budget, b),
                      fsdp_bytes_text((double)r.plan.total, t), fsdp_bytes_text((double)r.plan.reserved, res),
                      o.recompute == FSDP_RECOMPUTE_FULL ? "" : ", --recompute full");
            fsdp_exit_error(&err, 0);
        }
        fsdp_train_options up = o;
        up.mbs = o.mbs + 1;
        r.next_mbs = up.mbs;
        fsdp_memory_plan_compute(&cfg, &up, &r.place, &r.next);
    }
    if (global_batch) {
        if (global_batch % (o.mbs * gpus)) {
            fsdp_usagef(&err, "plan: --global-batch %d is not a multiple of --mbs %d x %d GPUs = %d (%d / %d = %.2f)",
                        global_batch, o.mbs, gpus, o.mbs * gpus, global_batch, o.mbs * gpus,
                        (double)global_batch / (o.mbs * gpus));
            fsdp_exit_error(&err, 0);
        }
        o.grad_accum = global_batch / (o.mbs * gpus);
    }
    fsdp_memory_plan_compute(&cfg, &o, &r.place, &r.plan);

    /* The time plan: every strategy (and compression option the flags left open) on this link. */
    fsdp_link link = {nodes, lf.link_gbps, lf.intra_gbps, lf.link_concurrency};
    fsdp_rates speed;
    fsdp_link_table table = {0};
    char source[512] = "";
    if (timed) {
        o.model = model;
        if (fsdp_cli_link_rates("plan", &lf, &cfg, &o, &link, &speed, source, sizeof source, &err))
            fsdp_exit_error(&err, 0);
        fsdp_link_choices ch = {.strategies = 1,
                                .reduce_dtypes = !fsdp_args_find(&spec, "reduce-dtype")->seen,
                                .gather_dtypes = !fsdp_args_find(&spec, "gather-dtype")->seen,
                                .accumulate = !fsdp_args_find(&spec, "accumulate")->seen,
                                .reshard = !reshard,
                                .budget = r.budget};
        fsdp_link_table_build(&cfg, &o, &r.place, &link, &speed, &ch, &table);
    }

    if (fsdp_rank() > 0) return 0; /* launched on several ranks: one answer */
    if (json) {
        json_t *v = plan_json(&r);
        if (timed) {
            json_t *t = fsdp_cli_link_json(&table, &link, &speed, source);
            json_object_update(v, t);
            json_decref(t);
        }
        char *text = fsdp_json_text(v, 2, 6);
        if (!text) fsdp_fatal("out of host memory writing the plan's JSON");
        printf("%s\n", text);
        free(text);
        json_decref(v);
    } else {
        print_text(&r);
        if (timed) fsdp_cli_link_print(&table, &r.place, &link, &speed, source, r.budget);
    }
    fsdp_link_table_free(&table);
    return 0;
}
