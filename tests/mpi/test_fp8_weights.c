/* FP8 weights on the wire under mpirun -np 3 (the engine's fp8_weights, src/shard/fp8_weights.c), on
 * the CPU backend, FULL over three ranks with --gather-dtype fp8:
 *  - a unit with two product weights and a tail of norm-like values: every gather of it (the
 *    forward's, and the backward's gather again) gives each weight's codes bit for bit as a
 *    tensorwise cast of the whole fp32 master weight does (the amax of every rank's part, the scale,
 *    W's codes, and W^T's), and the weights' values in the gathered unit are those codes times the
 *    inverse scale, rounded to the compute dtype; the tail keeps its block scales (within e4m3's
 *    rounding of its values);
 *  - the weights' amax lies in a different rank's part for each weight, and a part may be empty (a
 *    rank whose shard holds only the tail);
 *  - after an update of the shards (fsdp_engine_update_shards: one amax exchange for every unit, the
 *    next step's first gather started during it), the next step's gathers bring the new weights' codes;
 *  - a product fed the gathered codes (matmul_forward_fp8 / _backward_fp8 with the weight) computes
 *    exactly what the product that casts the fp32 master weight itself computes;
 *  - a unit without FP8 weights reports none; the memory plan counts the codes and scales (the
 *    engine's creation checks that it allocated what the plan says). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "kernels/fp8.h"
#include "mpi_check.h"
#include "shard/engine.h"

enum { R0 = 48, C0 = 32, R1 = 32, C1 = 48, TAIL = 40, OTHER = 500 };
#define M0 ((int64_t)R0 * C0)
#define M1 ((int64_t)R1 * C1)
#define NUMEL0 (M0 + M1 + TAIL)

/* Element g of unit u after `update` updates of the shards: small pseudo-random weights whose largest
 * magnitude lies in the first third of weight 0 and the last third of weight 1 (different ranks' parts;
 * after the update, in the middle of weight 0 and its own scale), then values near 1. */
static int update;
static float value(int u, int64_t g) {
    float x = (float)((g * 2654435761u) % 2001) / 1000.0f - 1.0f; /* [-1, 1] */
    if (u == 1) return 0.5f * x;
    if (g < M0) return g == (update ? M0 / 2 : 17) ? 0.75f + update : 0.05f * x;
    if (g < M0 + M1) return g == M0 + M1 - 5 ? -1.5f : (0.02f + 0.01f * update) * x;
    return 1.0f + 0.01f * (float)(g - M0 - M1);
}

/* The update of the shards: the master weights become value() of the next update. */
static void write_shard(void *ctx, int u, const fsdp_shard_view *v) {
    (void)ctx;
    for (int64_t i = 0; i < v->len; i++) ((float *)v->master)[i] = i < v->valid ? value(u, v->start + i) : 0.0f;
}

/* The reference: a tensorwise cast of the whole fp32 weight (rows x cols from `offset`). */
typedef struct {
    uint8_t *codes, *codes_t;
    float scales[FSDP_FP8_SCALES];
    float *w;
} reference;

static reference cast_reference(int64_t offset, int rows, int cols) {
    reference r;
    size_t n = (size_t)rows * cols;
    r.w = malloc(n * sizeof(float));
    r.codes = malloc(n), r.codes_t = malloc(n);
    for (size_t i = 0; i < n; i++) r.w[i] = value(0, offset + (int64_t)i);
    float amax;
    cpu_fp8_amax(&amax, r.w, rows, cols, 0, 0);
    cpu_fp8_scales_of_parts(r.scales, &amax, 1, 1, FSDP_E4M3);
    float s, inv;
    cpu_fp8_cast(r.codes, &s, &inv, NULL, r.w, rows, cols, 0, 0, FSDP_E4M3, 0, &amax);
    CHECK(r.scales[2] == amax);
    CHECK(s == r.scales[1] && inv == r.scales[0]);
    cpu_fp8_cast(r.codes_t, &s, &inv, NULL, r.w, rows, cols, 1, 0, FSDP_E4M3, 0, &amax);
    return r;
}

static void check_gathered(fsdp_engine *e, fsdp_backend *be, const float *unit, const reference *ref,
                           const fsdp_fp8_matrix *m, const char *when) {
    fsdp_fp8_weight w8[FSDP_FP8_MAX_MATRICES];
    int n = fsdp_engine_fp8_weights(e, 0, w8);
    check_quiet(n == 2, "%s: unit 0 reports %d FP8 weights, not 2", when, n);
    be->runtime->stream_synchronize(be, be->compute);
    for (int j = 0; j < n && j < 2; j++) {
        size_t count = (size_t)m[j].rows * m[j].cols;
        check_quiet(memcmp(w8[j].scales, ref[j].scales, sizeof ref[j].scales) == 0,
                    "%s: weight %d's inverse scale, scale, amax %g %g %g, a cast of the master weight %g %g %g", when,
                    j, w8[j].scales[0], w8[j].scales[1], w8[j].scales[2], ref[j].scales[0], ref[j].scales[1],
                    ref[j].scales[2]);
        check_quiet(memcmp(w8[j].codes, ref[j].codes, count) == 0, "%s: weight %d's codes as the cast's", when, j);
        check_quiet(memcmp(w8[j].codes_t, ref[j].codes_t, count) == 0, "%s: weight %d's W^T codes as the cast's", when,
                    j);
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
            float want = fsdp_round_bf16(fsdp_decode_code(FSDP_E4M3, ref[j].codes[i]) * ref[j].scales[0]);
            bad += unit[m[j].offset + (int64_t)i] != want;
        }
        check_quiet(bad == 0, "%s: %d of weight %d's values in the unit are not code x inverse scale", when, bad, j);
    }
    int bad = 0;
    for (int64_t g = M0 + M1; g < NUMEL0; g++) bad += fabsf(unit[g] - value(0, g)) > 0.07f * fabsf(value(0, g));
    check_quiet(bad == 0, "%s: %d tail values off by more than e4m3's rounding", when, bad);
}

/* The product fed the gathered codes equals the one that casts the fp32 master weight. */
static void check_products(fsdp_engine *e, fsdp_backend *be, const reference *ref, const fsdp_fp8_matrix *m) {
    fsdp_fp8_weight w8[FSDP_FP8_MAX_MATRICES];
    if (fsdp_engine_fp8_weights(e, 0, w8) != 2) return;
    const int N = 32, OC = m[0].rows, C = m[0].cols;
    float *x = malloc((size_t)N * C * 4), *dy = malloc((size_t)N * OC * 4);
    float *y[2], *dx[2], *dw[2];
    for (int i = 0; i < N * C; i++) x[i] = fsdp_round_bf16(0.3f * sinf(0.37f * (float)i));
    for (int i = 0; i < N * OC; i++) dy[i] = fsdp_round_bf16(0.01f * cosf(0.11f * (float)i));
    fsdp_fp8_recipe r = fsdp_fp8_recipe_of(FSDP_FP8_TENSORWISE);
    for (int k = 0; k < 2; k++) {
        y[k] = calloc((size_t)N * OC, 4), dx[k] = calloc((size_t)N * C, 4), dw[k] = calloc((size_t)OC * C, 4);
        float saved[FSDP_FP8_SAVED_AMAX];
        be->ops->matmul_forward_fp8(be, y[k], x, ref[0].w, NULL, NULL, N, C, OC, 0, &r,
                                    (fsdp_fp8_amax){NULL, NULL, saved}, k ? &w8[0] : NULL);
        be->ops->matmul_backward_fp8(be, dx[k], dw[k], NULL, dy, x, ref[0].w, N, C, OC, &r,
                                     (fsdp_fp8_amax){NULL, NULL, saved}, k ? &w8[0] : NULL);
    }
    be->runtime->stream_synchronize(be, be->compute);
    CHECK(memcmp(y[0], y[1], (size_t)N * OC * 4) == 0);
    CHECK(memcmp(dx[0], dx[1], (size_t)N * C * 4) == 0);
    CHECK(memcmp(dw[0], dw[1], (size_t)OC * C * 4) == 0);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]);
    free(x);
    free(dy);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fsdp_err err = {0};
    fsdp_backend_options bo = {"cpu", FSDP_BF16, FSDP_F32, 0, 1, 0};
    fsdp_backend *be = fsdp_backend_create(&bo, &err);
    fsdp_topology topo;
    if (!be || fsdp_topology_detect(MPI_COMM_WORLD, 0, &topo, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fsdp_unit_spec specs[2];
    memset(specs, 0, sizeof specs);
    specs[0].numel = NUMEL0, specs[0].decay_numel = M0 + M1, specs[0].num_fp8_matrices = 2;
    specs[0].fp8_matrices[0] = (fsdp_fp8_matrix){0, R0, C0};
    specs[0].fp8_matrices[1] = (fsdp_fp8_matrix){M0, R1, C1};
    specs[1].numel = OTHER;
    const int order[] = {0, 1, 1, 0}, forward[] = {0, 1};
    fsdp_shard_options so;
    memset(&so, 0, sizeof so);
    so.strategy = FSDP_FULL, so.prefetch = 1, so.max_live = 2;
    so.master_dtype = FSDP_F32, so.compute_dtype = FSDP_BF16, so.grad_dtype = FSDP_F32;
    so.reduce_dtype = FSDP_F32, so.gather_dtype = FSDP_E4M3, so.fp8_weights = 1;
    so.order = order, so.order_len = 4, so.forward_order = forward, so.forward_order_len = 2;
    fsdp_engine_memory plan;
    fsdp_engine_memory_plan(specs, 2, &so, size, topo.node_size, be->kind, &plan);
    CHECK(plan.fp8_weights > 0);
    fsdp_engine *e = fsdp_engine_create(be, MPI_COMM_WORLD, &topo, specs, 2, &so, &err);
    if (!e) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int u = 0; u < 2; u++) {
        fsdp_shard_view v = fsdp_engine_view(e, u);
        write_shard(NULL, u, &v);
    }
    fsdp_engine_refresh_working(e);

    const fsdp_fp8_matrix *m = specs[0].fp8_matrices;
    reference ref[2] = {cast_reference(m[0].offset, m[0].rows, m[0].cols),
                        cast_reference(m[1].offset, m[1].rows, m[1].cols)};
    fsdp_engine_begin_step(e, 1);
    fsdp_engine_begin_microbatch(e);
    const float *unit = fsdp_engine_params(e, 0);
    check_gathered(e, be, unit, ref, m, "the forward's gather");
    check_products(e, be, ref, m);
    fsdp_engine_done_forward(e, 0);
    fsdp_engine_params(e, 1);
    fsdp_fp8_weight none[FSDP_FP8_MAX_MATRICES];
    CHECK(fsdp_engine_fp8_weights(e, 1, none) == 0);
    fsdp_engine_done_forward(e, 1);
    fsdp_engine_params(e, 1);
    fsdp_engine_grads(e, 1);
    fsdp_engine_done_backward(e, 1);
    unit = fsdp_engine_params(e, 0);
    check_gathered(e, be, unit, ref, m, "the backward's gather");
    fsdp_engine_grads(e, 0);
    fsdp_engine_done_backward(e, 0);
    fsdp_engine_wait_reductions(e);
    for (int j = 0; j < 2; j++) free(ref[j].w), free(ref[j].codes), free(ref[j].codes_t);

    /* An update of the shards (new amaxes, on other ranks than before), and the next step's gathers: the
     * first started during the update (prefetch), the backward's later. */
    update = 1;
    fsdp_engine_update_shards(e, write_shard, NULL);
    for (int j = 0; j < 2; j++) ref[j] = cast_reference(m[j].offset, m[j].rows, m[j].cols);
    fsdp_engine_begin_step(e, 1);
    fsdp_engine_begin_microbatch(e);
    check_gathered(e, be, fsdp_engine_params(e, 0), ref, m, "the next step's forward gather");
    fsdp_engine_done_forward(e, 0);
    fsdp_engine_params(e, 1);
    fsdp_engine_done_forward(e, 1);
    fsdp_engine_params(e, 1);
    fsdp_engine_grads(e, 1);
    fsdp_engine_done_backward(e, 1);
    check_gathered(e, be, fsdp_engine_params(e, 0), ref, m, "the next step's backward gather");
    fsdp_engine_grads(e, 0);
    fsdp_engine_done_backward(e, 0);
    fsdp_engine_wait_reductions(e);
    be->runtime->stream_synchronize(be, be->compute);
    for (int j = 0; j < 2; j++) free(ref[j].w), free(ref[j].codes), free(ref[j].codes_t);
    fsdp_engine_destroy(e);
    be->runtime->destroy(be);
    int status = mpi_check_summary("test_fp8_weights");
    MPI_Finalize();
    return status;
}
