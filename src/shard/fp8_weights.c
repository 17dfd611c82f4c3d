/* FP8 weights on the wire (engine.h, gather_dtype with fp8_weights): each unit's tensorwise FP8
 * weights encoded with one scale per weight after the update of the shards, and unpacked as the
 * products' operands (W and W^T) beside the slot that every gather of the unit lands in.
 *
 * Why the codes are re-encoded after the blockwise quantization of the shard instead of by a
 * quantization that knows the weights: the blockwise kernels stay one simple, fast pass over the
 * whole shard, and a block that straddles a weight's end (shards are cut every FSDP_SHARD_ALIGN
 * elements, not on the weights' bounds) keeps a scale that fits its other elements. The receiving
 * side likewise dequantizes the whole unit and then overwrites the weights' values with those of
 * their own scale, so that whatever else reads the unit in the compute dtype (hpZ's secondary copy,
 * a backward gathered inside the node) reads the same weights the products do. */
#include <stdlib.h>

#include "../base/error.h"
#include "engine_internal.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static size_t matrix_codes(const fsdp_fp8_matrix *m) { return align256((size_t)m->rows * (size_t)m->cols); }

/* W's and W^T's codes of n weights, each 256-byte aligned. */
static size_t weights_codes(const fsdp_fp8_matrix *m, int n) {
    size_t b = 0;
    for (int j = 0; j < n; j++) b += 2 * matrix_codes(&m[j]);
    return b;
}

size_t fsdp_plan_fp8_slot_bytes(const fsdp_unit_spec *units, int num_units, const int *which, int ring) {
    size_t most = 0;
    for (int u = 0; u < num_units; u++) {
        size_t b = weights_codes(units[u].fp8_matrices, units[u].num_fp8_matrices);
        if (which[u] == ring && b > most) most = b;
    }
    return most;
}

size_t fsdp_plan_fp8_scale_bytes(int num_units, int shard_size) {
    return (size_t)num_units * (FSDP_FP8_SCALES_STRIDE + (size_t)(1 + shard_size)) * FSDP_FP8_MAX_MATRICES *
           sizeof(float);
}

void engine_alloc_fp8_weights(fsdp_engine *e) {
    if (!e->mode.fp8_weights) return;
    fsdp_backend *be = e->be;
    e->fp8_codes = fsdp_xcalloc((size_t)e->num_param_rings, sizeof *e->fp8_codes, "FP8 weight codes");
    e->fp8_slot_bytes = fsdp_xcalloc((size_t)e->num_param_rings, sizeof *e->fp8_slot_bytes, "FP8 weight codes");
    /* A slot holds the most any unit of its ring needs, as fsdp_plan_fp8_slot_bytes counts it. */
    for (int u = 0; u < e->num_units; u++) {
        size_t *slot = &e->fp8_slot_bytes[e->units[u].param_ring], b = weights_codes(e->units[u].fp8, e->units[u].num_fp8);
        if (b > *slot) *slot = b;
    }
    for (int r = 0; r < e->num_param_rings; r++)
        if (e->fp8_slot_bytes[r])
            e->fp8_codes[r] = be->runtime->alloc(be, (size_t)e->param_rings[r].capacity * e->fp8_slot_bytes[r],
                                                 "FP8 weights of the gathered units");
    const size_t scales = fsdp_plan_fp8_scale_bytes(e->num_units, e->shard_size);
    e->fp8_scales = be->runtime->alloc(be, scales, "FP8 weight scales");
    be->runtime->zero(be, e->fp8_scales, scales, be->compute);
    e->fp8_amax = e->fp8_scales + (size_t)e->num_units * FSDP_FP8_MAX_MATRICES * FSDP_FP8_SCALES_STRIDE;
}

void engine_free_fp8_weights(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    for (int r = 0; r < e->num_param_rings && e->fp8_codes; r++)
        if (e->fp8_codes[r]) be->runtime->free(be, e->fp8_codes[r]);
    if (e->fp8_scales) be->runtime->free(be, e->fp8_scales);
    free(e->fp8_codes);
    free(e->fp8_slot_bytes);
}

static float *scales_of(const fsdp_engine *e, int u, int j) {
    return e->fp8_scales + ((size_t)u * FSDP_FP8_MAX_MATRICES + (size_t)j) * FSDP_FP8_SCALES_STRIDE;
}

/* The part of weight m in this rank's shard of the unit: elements [*lo, *lo + return) of the shard. */
static size_t part_in_shard(const fsdp_engine *e, const unit_state *s, const fsdp_fp8_matrix *m, int64_t *lo) {
    const int64_t start = (int64_t)e->shard_rank * s->shard_len, end = start + s->shard_len;
    const int64_t a = m->offset > start ? m->offset : start;
    const int64_t b0 = m->offset + (int64_t)m->rows * m->cols, b = b0 < end ? b0 : end;
    *lo = a - start;
    return b > a ? (size_t)(b - a) : 0;
}

void engine_measure_fp8_weights(fsdp_engine *e, int u) {
    const unit_state *s = &e->units[u];
    if (!e->mode.fp8_weights || s->num_fp8 == 0) return;
    fsdp_backend *be = e->be;
    const char *master = (const char *)e->master + (size_t)s->offset * e->me;
    float *own = e->fp8_amax + (size_t)u * FSDP_FP8_MAX_MATRICES;
    for (int j = 0; j < s->num_fp8; j++) {
        int64_t lo;
        const size_t n = part_in_shard(e, s, &s->fp8[j], &lo);
        be->ops->fp8_amax(be, own + j, master + (size_t)lo * e->me, e->opts.master_dtype, n, be->compute);
    }
}

void engine_encode_fp8_weights(fsdp_engine *e) {
    if (!e->mode.fp8_weights) return;
    fsdp_backend *be = e->be;
    /* One exchange for the whole update: each rank's amaxes of every unit, FSDP_FP8_MAX_MATRICES a unit. */
    const size_t per_rank = (size_t)e->num_units * FSDP_FP8_MAX_MATRICES;
    float *every = e->fp8_amax + per_rank;
    be->coll->all_gather(be, e->norm_comm, e->fp8_amax, every, per_rank, FSDP_F32, be->compute);
    engine_count_pieces(e, FSDP_COMM_OTHER, e->shard_size, per_rank * sizeof(float));
    for (int u = 0; u < e->num_units; u++) {
        const unit_state *s = &e->units[u];
        const char *master = (const char *)e->master + (size_t)s->offset * e->me;
        uint8_t *codes = (uint8_t *)e->qshards + e->qoffset[u]; /* a piece's codes come first */
        for (int j = 0; j < s->num_fp8; j++) {
            int64_t lo;
            const size_t n = part_in_shard(e, s, &s->fp8[j], &lo);
            be->ops->fp8_encode(be, codes + lo, scales_of(e, u, j), every + (size_t)u * FSDP_FP8_MAX_MATRICES + j,
                                e->shard_size, (int)per_rank, master + (size_t)lo * e->me, e->opts.master_dtype, n,
                                be->compute);
        }
    }
}

/* Where weight j's codes (and W^T's after them) lie beside slot `slot` of unit u's ring. */
static uint8_t *codes_of(const fsdp_engine *e, const unit_state *s, int slot, int j) {
    uint8_t *p = (uint8_t *)e->fp8_codes[s->param_ring] + (size_t)slot * e->fp8_slot_bytes[s->param_ring];
    for (int i = 0; i < j; i++) p += 2 * matrix_codes(&s->fp8[i]);
    return p;
}

void engine_unpack_fp8_weights(fsdp_engine *e, int u, int slot, void *dst) {
    unit_state *s = &e->units[u];
    if (!e->mode.fp8_weights || s->num_fp8 == 0) return;
    fsdp_backend *be = e->be;
    for (int j = 0; j < s->num_fp8; j++) {
        uint8_t *w = codes_of(e, s, slot, j);
        be->ops->fp8_unpack(be, w, w + matrix_codes(&s->fp8[j]), dst, e->opts.compute_dtype, e->gather_staging,
                            e->opts.gather_dtype, (size_t)s->shard_len, &s->fp8[j], scales_of(e, u, j),
                            e->gather_stream);
    }
}

int fsdp_engine_fp8_weights(const fsdp_engine *e, int u, fsdp_fp8_weight out[FSDP_FP8_MAX_MATRICES]) {
    const unit_state *s = &e->units[u];
    if (!e->mode.fp8_weights || s->num_fp8 == 0 || s->param_slot < 0 || !s->fp8_ready) return 0;
    for (int j = 0; j < s->num_fp8; j++) {
        const uint8_t *w = codes_of(e, s, s->param_slot, j);
        out[j] = (fsdp_fp8_weight){w, w + matrix_codes(&s->fp8[j]), scales_of(e, u, j)};
    }
    return s->num_fp8;
}

int fsdp_engine_gathers_fp8_weights(const fsdp_engine *e) { return e->mode.fp8_weights; }
