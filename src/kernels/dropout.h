/* Dropout masks: which elements a dropout site keeps, as a pure function of where the element is.
 *
 * A mask element is keep = (draw >= threshold), where draw is one 32-bit word of Philox-4x32-10
 * (src/base/philox.h) and threshold = round(p * 2^32) is computed once on the host, so the CPU
 * reference and every CUDA kernel make the same decision bit for bit (integer arithmetic only).
 * Kept values are scaled by 1 / (1 - p) (inverted dropout, as torch.nn.functional.dropout); p = 0
 * keeps everything and the ops then take their dropout-free code paths.
 *
 * The draw of an element depends only on
 *   (seed, global sample index, layer, site, the element's position inside that sample's tensor)
 * never on the rank, on how a global batch is split into micro-batches, or on the step layout:
 * row b of a micro-batch is sample `sample_base + b`, where sample_base is the global index of the
 * micro-batch's first sample (src/train/data.h numbers every sample of the run). So the same global
 * batch trains the same on any number of ranks, a resumed run draws the same masks, and a backward
 * (or a recomputed forward) regenerates exactly the forward's mask.
 *
 * Counter layout of one Philox evaluation (key = seed):
 *   c0 = group bits 0..31, c1 = group bits 32..47 | site << 16,
 *   c2 = sample bits 0..31, c3 = sample bits 32..47 | layer << 16,
 * and the four output words serve four elements of the group. Groups:
 *  - residual sites (an [N, C] tensor whose row n is position n % T of sample sample_base + n / T):
 *    element e = (n % T) * C + c of the sample is word e % 4 of group e / 4;
 *  - attention probabilities P[b, h, i, j] (query i, key j; T x T per head): with TB = ceil(T / 16),
 *    group = ((h * TB + i / 16) * TB + j / 16) * 64 + (i % 8) * 8 + j % 8 and word
 *    2 * ((i / 8) % 2) + (j / 8) % 2. A group is the four elements (i, j), (i, j + 8), (i + 8, j),
 *    (i + 8, j + 8) of a 16 x 16 tile, exactly the four that one thread of an mma.m16n8k16
 *    accumulator holds whether the tile is laid out queries x keys (flash forward, dQ) or
 *    keys x queries (dK/dV), so the tensor-core kernels use every word they draw.
 *
 * Limits (checked on the host by fsdp_dropout_make and fsdp_dropout_check_*): sample indices and
 * groups below 2^48, layers below 2^16, sites below 2^8. */
#ifndef FSDP_KERNELS_DROPOUT_H
#define FSDP_KERNELS_DROPOUT_H

#include <stdint.h>

#include "../base/error.h"
#include "../base/philox.h"

/* Where a dropout acts (part of the counter: room for up to 256 sites). */
typedef enum {
    FSDP_DROPOUT_ATTN_PROBS = 0, /* attention probabilities before P V (attention_dropout) */
    FSDP_DROPOUT_ATTN_OUT = 1,   /* attention block output after o_proj, before the residual add */
    FSDP_DROPOUT_MLP_OUT = 2     /* MLP output after down_proj / fc2, before the residual add */
} fsdp_dropout_site;

#define FSDP_DROPOUT_MAX_SITES 256
#define FSDP_DROPOUT_MAX_LAYERS 65536
#define FSDP_DROPOUT_LIMIT48 ((uint64_t)1 << 48)

/* One site's dropout for one micro-batch; passed by pointer to the ops (NULL = no dropout) and by
 * value into kernels. Make it with fsdp_dropout_make. */
typedef struct {
    uint64_t seed;        /* Philox key: the run's dropout seed */
    int64_t sample_base;  /* global index of the micro-batch's row 0 */
    uint32_t threshold;   /* keep when draw >= threshold; 0 keeps everything */
    float scale;          /* 1 / (1 - p), applied to kept values */
    float p;              /* the rate, for messages */
    int layer, site;
} fsdp_dropout;

/* Valid rates are 0 <= p < 1 (p = 1 would scale by infinity; callers refuse it with a message). */
static inline int fsdp_dropout_rate_ok(double p) { return p >= 0.0 && p < 1.0; }

static inline fsdp_dropout fsdp_dropout_make(double p, uint64_t seed, int64_t sample_base, int layer, int site) {
    if (!fsdp_dropout_rate_ok(p)) fsdp_fatal("internal error: dropout rate %g outside [0, 1)", p);
    if (sample_base < 0 || (uint64_t)sample_base >= FSDP_DROPOUT_LIMIT48 || layer < 0 ||
        layer >= FSDP_DROPOUT_MAX_LAYERS || site < 0 || site >= FSDP_DROPOUT_MAX_SITES)
        fsdp_fatal("internal error: dropout coordinates out of range (sample %lld, layer %d, site %d)",
                   (long long)sample_base, layer, site);
    fsdp_dropout d;
    d.seed = seed;
    d.sample_base = sample_base;
    const double t = p * 4294967296.0 + 0.5; /* round(p * 2^32) */
    d.threshold = t >= 4294967295.0 ? 0xffffffffu : (uint32_t)t;
    d.scale = (float)(1.0 / (1.0 - p));
    d.p = (float)p;
    d.layer = layer;
    d.site = site;
    return d;
}

/* 1 when the ops must draw a mask: d is given and drops something. */
FSDP_HD_INLINE int fsdp_dropout_active(const fsdp_dropout *d) { return d && d->threshold != 0; }

/* Host checks that a micro-batch of B samples and its tensors stay inside the counter's fields. */
static inline void fsdp_dropout_check_rows(const fsdp_dropout *d, int B, int T, int C) {
    if ((uint64_t)d->sample_base + (uint64_t)B > FSDP_DROPOUT_LIMIT48 ||
        (uint64_t)T * (uint64_t)C / 4 >= FSDP_DROPOUT_LIMIT48)
        fsdp_fatal("internal error: dropout on %d samples of %d x %d from sample %lld exceeds the counter", B, T, C,
                   (long long)d->sample_base);
}
static inline void fsdp_dropout_check_probs(const fsdp_dropout *d, int B, int Hq, int T) {
    const uint64_t tb = ((uint64_t)T + 15) / 16;
    if ((uint64_t)d->sample_base + (uint64_t)B > FSDP_DROPOUT_LIMIT48 ||
        (uint64_t)Hq * tb * tb * 64 >= FSDP_DROPOUT_LIMIT48)
        fsdp_fatal("internal error: attention dropout on %d samples, %d heads, T = %d exceeds the counter", B, Hq,
                   T);
}

/* The four words of group `group` of sample `sample` at d's layer and site. */
FSDP_HD_INLINE fsdp_philox4 fsdp_dropout_draw(const fsdp_dropout *d, int64_t sample, uint64_t group) {
    return fsdp_philox4x32_10((uint32_t)group, (uint32_t)(group >> 32) | ((uint32_t)d->site << 16),
                              (uint32_t)(uint64_t)sample,
                              (uint32_t)((uint64_t)sample >> 32) | ((uint32_t)d->layer << 16), (uint32_t)d->seed,
                              (uint32_t)(d->seed >> 32));
}

/* Word i (0..3) of r by selects, not by indexing (a run-time index would put r in GPU local memory). */
FSDP_HD_INLINE uint32_t fsdp_philox_word(fsdp_philox4 r, int i) {
    return i & 2 ? (i & 1 ? r.w[3] : r.w[2]) : (i & 1 ? r.w[1] : r.w[0]);
}

/* Residual sites: element c of row n of an [N, C] tensor of rows of T positions. */
FSDP_HD_INLINE int fsdp_dropout_keep_row(const fsdp_dropout *d, int64_t n, int T, int C, int c) {
    const uint64_t e = (uint64_t)(n % T) * (uint64_t)C + (uint64_t)c;
    return fsdp_philox_word(fsdp_dropout_draw(d, d->sample_base + n / T, e >> 2), (int)(e & 3)) >= d->threshold;
}

/* Attention probabilities: group and word of P[h, i, j] inside its sample (see the header). */
FSDP_HD_INLINE uint64_t fsdp_dropout_probs_group(int h, int i, int j, int T) {
    const uint64_t tb = ((uint64_t)T + 15) >> 4;
    return ((((uint64_t)h * tb + (uint64_t)(i >> 4)) * tb + (uint64_t)(j >> 4)) << 6) |
           (uint64_t)(((i & 7) << 3) | (j & 7));
}
FSDP_HD_INLINE int fsdp_dropout_probs_word(int i, int j) { return (((i >> 3) & 1) << 1) | ((j >> 3) & 1); }

FSDP_HD_INLINE int fsdp_dropout_keep_probs(const fsdp_dropout *d, int b, int h, int i, int j, int T) {
    return fsdp_philox_word(fsdp_dropout_draw(d, d->sample_base + b, fsdp_dropout_probs_group(h, i, j, T)),
                            fsdp_dropout_probs_word(i, j)) >= d->threshold;
}

#endif
