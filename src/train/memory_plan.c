/* Memory plans: the per-rank sum of what the engine, the optimizer, the model and the backend
 * allocate. */
#include "memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "../base/env.h"

void fsdp_plan_unit_order(const fsdp_model_config *cfg, const fsdp_layout *layout, int **order, int *order_len,
                          int **pinned) {
    int L = cfg->num_layers, n = 0;
    int *o = fsdp_xmalloc((size_t)(2 * L + 2) * sizeof(int), "the unit order");
    o[n++] = fsdp_unit_embed(layout);
    for (int l = 0; l < L; l++) o[n++] = fsdp_unit_block(layout, l);
    o[n++] = fsdp_unit_head(layout);
    for (int l = L - 1; l >= 0; l--) o[n++] = fsdp_unit_block(layout, l);
    int *p = fsdp_xcalloc((size_t)layout->num_units, sizeof(int), "pinned units");
    if (cfg->tie_word_embeddings) p[fsdp_unit_embed(layout)] = 1;
    *order = o, *order_len = n, *pinned = p;
}

fsdp_dtype fsdp_plan_grad_dtype(const fsdp_train_options *o) {
    return fsdp_dtype_blockwise(o->reduce_dtype) ? o->compute_dtype : o->reduce_dtype;
}

int fsdp_plan_microbatches(const fsdp_train_options *o, int world) {
    if (o->global_batch > 0 && o->mbs > 0 && world > 0) {
        int k = o->global_batch / (o->mbs * world);
        return k > 0 ? k : 1;
    }
    return o->grad_accum > 0 ? o->grad_accum : 1;
}

int fsdp_plan_accumulate_local(const fsdp_train_options *o, int world) {
    if (o->forward_only || fsdp_plan_microbatches(o, world) < 2) return 0;
    if (o->accumulate == FSDP_ACCUMULATE_AUTO) return o->strategy != FSDP_FULL;
    return o->accumulate == FSDP_ACCUMULATE_LOCAL;
}

/* Rows move world x tokens x hidden activation-dtype values every micro-batch; dense reduces the whole
 * token-embedding matrix in the reduce dtype, once per step under local accumulation. Rows win when
 * the batch touches a small part of the vocabulary. */
int fsdp_plan_embed_rows(const fsdp_model_config *cfg, const fsdp_train_options *o, int world) {
    if (o->master_dtype != FSDP_F32 || o->embed_grads == FSDP_EMBED_GRADS_DENSE) return 0;
    int local = fsdp_plan_accumulate_local(o, world);
    if (local && (o->strategy == FSDP_NO_SHARD || o->strategy == FSDP_HYBRID)) return 0;
    if (o->embed_grads == FSDP_EMBED_GRADS_ROWS) return 1;
    double act = fsdp_dtype_info_of(o->compute_dtype)->bytes;
    double red = fsdp_dtype_blockwise(o->reduce_dtype) ? 1.0 : fsdp_dtype_info_of(o->reduce_dtype)->bytes;
    double rows_bytes = (double)world * o->mbs * o->seq * act * (local ? fsdp_plan_microbatches(o, world) : 1);
    double dense_bytes = (double)cfg->vocab_size * red;
    return rows_bytes <= dense_bytes / 2; /* margin for the scattered additions */
}

int fsdp_plan_check_embed_rows(const char *command, const fsdp_train_options *o, int world, fsdp_err *err) {
    if (o->embed_grads != FSDP_EMBED_GRADS_ROWS) return 0;
    if (o->master_dtype != FSDP_F32)
        return fsdp_usagef(err, "%s: --embedding-grads rows needs --model-precision fp32 (fp32 gradient shards)",
                           command);
    if ((o->strategy == FSDP_NO_SHARD || o->strategy == FSDP_HYBRID) && fsdp_plan_accumulate_local(o, world))
        return fsdp_usagef(err,
                           "%s: --embedding-grads rows cannot go with %s's local accumulation (its replicas are "
                           "all-reduced once per step, which would add every rank's rows again); use --accumulate "
                           "sharded or --embedding-grads dense",
                           command, fsdp_strategy_name(o->strategy));
    return 0;
}

fsdp_unit_spec *fsdp_plan_unit_specs(const fsdp_model_config *cfg, const fsdp_train_options *o,
                                     const fsdp_layout *layout) {
    fsdp_unit_spec *specs = fsdp_xcalloc((size_t)layout->num_units, sizeof *specs, "unit specs");
    for (int u = 0; u < layout->num_units; u++) {
        specs[u].numel = layout->units[u].numel;
        specs[u].decay_numel = layout->units[u].decay_numel;
        if (o->fp8 == FSDP_FP8_TENSORWISE)
            specs[u].num_fp8_matrices = fsdp_model_fp8_matrices(cfg, layout, u, specs[u].fp8_matrices);
    }
    return specs;
}

void fsdp_plan_shard_options(const fsdp_model_config *cfg, const fsdp_train_options *o, int world, const int *order,
                             int order_len, const int *pinned, fsdp_shard_options *so) {
    memset(so, 0, sizeof *so);
    so->strategy = o->strategy;
    so->prefetch = o->prefetch;
    so->max_live = o->max_live;
    so->copy_engine_gathers = o->copy_engine_gathers;
    so->copy_engine_reductions = o->copy_engine_reductions;
    so->master_dtype = o->master_dtype;
    so->compute_dtype = o->compute_dtype;
    so->grad_dtype = fsdp_plan_grad_dtype(o);
    so->reduce_dtype = o->reduce_dtype;
    so->gather_dtype = o->gather_dtype;
    /* Tensorwise products take their weights as gathered codes when gathers send fp8 (engine.h). */
    so->fp8_weights = o->fp8 == FSDP_FP8_TENSORWISE;
    so->accumulate_local = fsdp_plan_accumulate_local(o, world);
    so->order = order;
    so->order_len = order_len;
    so->pinned = pinned;
    /* A forward-only pass (evaluation) visits the training order's first part: EMBED, blocks, HEAD. */
    so->forward_order = order;
    so->forward_order_len = cfg->num_layers + 2;
    so->forward_only = o->forward_only;
    /* hpZ: resolved to the secondary group's size by fsdp_reshard_resolve (a size that does not fit a
     * planned place, as --mbs auto's advice tries other ones, plans none: fsdp_engine_mode_of). */
    so->reshard_size = o->reshard_after_forward > 0 ? o->reshard_after_forward : 0;
    if (fsdp_plan_embed_rows(cfg, o, world)) {
        /* fsdp_model_embed_grad_rows: one row of the hidden size per token of the micro-batch. */
        so->rows_capacity = o->mbs * o->seq;
        so->row_len = cfg->hidden_size;
    }
}

fsdp_model_shape fsdp_plan_model_shape(const fsdp_model_config *cfg, const fsdp_train_options *o) {
    /* Activation recomputation is part of the shape: the arena that fsdp_model_activation_parts
     * walks keeps less, and the plans (and --mbs auto) follow. */
    fsdp_model_shape shape = {o->mbs, o->seq, o->attn, o->head_chunk, {0.0f, 0.0f}, o->recompute, o->fp8};
    fsdp_err err = {0};
    /* Rates of 1 are refused before anything is planned or built (fsdp_model_dropout_rates). */
    fsdp_model_dropout_rates(cfg, o->dropout_set, o->dropout_rate, &shape.dropout, &err);
    return shape;
}

void fsdp_plan_op_extent(const fsdp_model_config *cfg, const fsdp_train_options *o, int64_t total_shard,
                         fsdp_op_extent *x) {
    memset(x, 0, sizeof *x);
    int qkv = (cfg->num_heads + 2 * cfg->num_kv_heads) * cfg->head_dim;
    x->tokens = o->mbs * o->seq;
    x->hidden = cfg->hidden_size;
    /* The widest bias whose gradient a product sums: qkv, the output projection, the MLP's first
     * product (gate|up for SwiGLU) and its second. */
    int mlp_in = fsdp_block_kind_of(cfg).swiglu ? 2 * cfg->intermediate_size : cfg->intermediate_size;
    if ((cfg->biases & FSDP_BIAS_QKV) && qkv > x->widest_bias) x->widest_bias = qkv;
    if ((cfg->biases & (FSDP_BIAS_O | FSDP_BIAS_MLP)) && cfg->hidden_size > x->widest_bias)
        x->widest_bias = cfg->hidden_size;
    if ((cfg->biases & FSDP_BIAS_MLP) && mlp_in > x->widest_bias) x->widest_bias = mlp_in;
    x->batch = o->mbs, x->seq = o->seq;
    x->q_heads = cfg->num_heads, x->kv_heads = cfg->num_kv_heads, x->head_dim = cfg->head_dim;
    x->attn = o->attn;
    /* Eager attention with dropped probabilities keeps them beside the undropped ones. */
    x->attn_dropout = fsdp_plan_model_shape(cfg, o).dropout.attention > 0.0f;
    x->act_dtype = o->compute_dtype;
    x->longest_sum = total_shard; /* the gradient norm's sum of squares over every shard */
    if (o->fp8 != FSDP_FP8_NONE) { /* the operands of the block's four projections, one at a time */
        const int q = cfg->num_heads * cfg->head_dim, C = cfg->hidden_size, F = cfg->intermediate_size;
        const int proj[4][2] = {{C, qkv}, {q, C}, {C, mlp_in}, {F, C}};
        /* Rowwise scales: CUDA 13's cuBLASLt found no algorithm for outer-vector scales on an H200
         * (bench/results/2026-11-27-nvidia-h200-fp8-bench.md), so the product goes through fp32 and an
         * epilogue applies the scales: its fp32 buffer is planned for. */
        const int epilogue = o->fp8 == FSDP_FP8_ROWWISE;
        for (int i = 0; i < 4; i++) {
            size_t b = fsdp_fp8_layer_scratch(x->tokens, proj[i][0], proj[i][1], epilogue);
            if (b > x->fp8_scratch) x->fp8_scratch = b;
        }
    }
}

void fsdp_memory_plan_compute(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                              fsdp_memory_plan *out) {
    memset(out, 0, sizeof *out);
    fsdp_device_kind k = place->device;
    fsdp_layout layout;
    fsdp_layout_build(cfg, &layout);
    int *order, order_len, *pinned;
    fsdp_plan_unit_order(cfg, &layout, &order, &order_len, &pinned);
    fsdp_unit_spec *specs = fsdp_plan_unit_specs(cfg, o, &layout);
    fsdp_shard_options so;
    fsdp_plan_shard_options(cfg, o, place->world, order, order_len, pinned, &so);
    out->embed_rows = so.rows_capacity > 0;
    fsdp_engine_memory_plan(specs, layout.num_units, &so, place->world, place->node_size, k, &out->engine);
    /* A forward-only run (fsdp eval) has no optimizer. */
    if (!o->forward_only)
        out->optimizer_states = fsdp_optimizer_memory_plan(out->engine.total_shard, o->master_dtype, k);

    fsdp_model_shape shape = fsdp_plan_model_shape(cfg, o);
    fsdp_activation_parts *ap = &out->activation_parts;
    fsdp_model_activation_parts(cfg, &shape, fsdp_device_dtype_size(k, o->compute_dtype), ap);
    out->activations = fsdp_device_alloc_size(k, ap->total);
    ap->total = out->activations;
    ap->other = ap->total - ap->layers - ap->recompute;
    out->step_scalars = fsdp_device_alloc_size(k, FSDP_STEP_SCALARS * sizeof(float));
    fsdp_op_extent x;
    fsdp_plan_op_extent(cfg, o, out->engine.total_shard, &x);
    fsdp_device_workspace_bytes(k, &x, fsdp_env_gemm_tune(), &out->workspace);

    out->reserved =
        out->engine.total + out->optimizer_states + out->activations + out->step_scalars + out->workspace.total;
    out->outside = fsdp_outside_estimate(k, out->engine.communicators, out->engine.all_reduce_communicators);
    out->total = out->reserved + out->outside;
    free(specs);
    free(order);
    free(pinned);
    fsdp_layout_free(&layout);
}

int fsdp_memory_plan_max_mbs(int seq) { return (int)((1LL << 30) / (seq > 0 ? seq : 1)); }

static int fits(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place, int mbs,
                size_t budget, fsdp_memory_plan *p) {
    fsdp_train_options t = *o;
    t.mbs = mbs;
    fsdp_memory_plan_compute(cfg, &t, place, p);
    return p->total <= budget;
}

int fsdp_memory_plan_largest_mbs(const fsdp_model_config *cfg, const fsdp_train_options *o,
                                 const fsdp_plan_place *place, size_t budget, int max_mbs, int per_rank_batch,
                                 fsdp_memory_plan *at) {
    fsdp_memory_plan p;
    if (per_rank_batch > 0) { /* the divisors of the per-rank batch, largest first */
        for (int mbs = per_rank_batch < max_mbs ? per_rank_batch : max_mbs; mbs >= 1; mbs--) {
            if (per_rank_batch % mbs || !fits(cfg, o, place, mbs, budget, &p)) continue;
            *at = p;
            return mbs;
        }
        return 0;
    }
    /* The total grows with the micro-batch: double to the first that does not fit, then bisect. */
    if (!fits(cfg, o, place, 1, budget, &p)) return 0;
    *at = p;
    int lo = 1, hi = 2;
    while (hi <= max_mbs && fits(cfg, o, place, hi, budget, &p)) {
        lo = hi, *at = p;
        hi = hi > max_mbs / 2 ? max_mbs + 1 : 2 * hi;
    }
    if (hi > max_mbs) hi = max_mbs + 1;
    while (hi - lo > 1) { /* lo fits, hi does not (or is past the end) */
        int mid = lo + (hi - lo) / 2;
        if (fits(cfg, o, place, mid, budget, &p))
            lo = mid, *at = p;
        else
            hi = mid;
    }
    return lo;
}

fsdp_size_unit fsdp_size_unit_for(size_t bytes) {
    fsdp_size_unit u = {"GiB", (double)(1u << 30)};
    if (bytes < ((size_t)1 << 30)) u.name = "MiB", u.bytes = (double)(1u << 20);
    if (bytes < ((size_t)1 << 20)) u.name = "KiB", u.bytes = 1024.0;
    return u;
}

void fsdp_memory_plan_line(const fsdp_memory_plan *p, char *buf, size_t cap) {
    const fsdp_engine_memory *e = &p->engine;
    fsdp_size_unit u = fsdp_size_unit_for(p->reserved);
#define IN(x) ((double)(x) / u.bytes)
    int n = snprintf(buf, cap,
                     "master weights %.2f + gradients %.2f + Adam m, v %.2f + working copy %.2f + gathered units %.2f + "
                     "unit gradient buffers %.2f",
                     IN(e->master), IN(e->grads), IN(p->optimizer_states), IN(e->working), IN(e->gathered),
                     IN(e->grad_buffers));
    size_t used = n > 0 ? (size_t)n : 0;
    if (e->grad_rows && used < cap) used += (size_t)snprintf(buf + used, cap - used, " + gradient rows %.2f", IN(e->grad_rows));
    if (e->staging && used < cap) used += (size_t)snprintf(buf + used, cap - used, " + staging %.2f", IN(e->staging));
    if (e->secondary && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, " + secondary copy (hpZ) %.2f", IN(e->secondary));
    if (e->quantized && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, " + quantized shards %.2f", IN(e->quantized));
    if (e->fp8_weights && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, " + FP8 weights %.2f", IN(e->fp8_weights));
    if (used < cap)
        used += (size_t)snprintf(buf + used, cap - used, " + activations %.2f + workspace %.2f = %.2f %s reserved",
                                 IN(p->activations), IN(p->workspace.total + p->step_scalars), IN(p->reserved), u.name);
    if (p->outside && used < cap)
        snprintf(buf + used, cap - used, " + %.2f outside fsdp.c (estimate)", IN(p->outside));
#undef IN
}
