/* Parameter names, shapes and unit layout, from the family descriptor. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/host_threads.h"
#include "../base/rng.h"

typedef struct {
    fsdp_layout *l;
    const fsdp_family *f;
    int layer;
    int cap;
    int64_t unit_offset; /* running offset inside the current unit */
} builder;

/* Adds module `mod`'s weight or bias: [rows, cols] (cols 0: a vector). Matrices and embeddings take
 * weight decay; biases and norm weights do not (AdamW as the reference trains). */
static void add_param(builder *b, fsdp_module mod, int is_bias, int64_t rows, int64_t cols) {
    fsdp_layout *l = b->l;
    const char *path = b->f->modules[mod];
    FSDP_ASSERT(path != NULL);
    FSDP_GROW(l->params, l->num_params, b->cap, 64, "the parameter layout");
    fsdp_param_desc *p = &l->params[l->num_params];
    memset(p, 0, sizeof *p);
    char module_name[80];
    snprintf(module_name, sizeof module_name, path, b->layer);
    snprintf(p->name, sizeof p->name, "%s.%s", module_name, is_bias ? "bias" : "weight");
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 1;
    p->numel = rows * p->shape[1];
    p->unit = l->num_units - 1;
    p->offset = b->unit_offset;
    p->decay = cols > 0;
    p->module = mod;
    p->is_bias = is_bias;
    fsdp_unit_desc *u = &l->units[p->unit];
    (is_bias ? u->bias : u->weight)[mod] = l->num_params;
    l->num_params++;
    b->unit_offset += p->numel;
}

static void begin_unit(builder *b, fsdp_unit_kind kind, int layer) {
    fsdp_layout *l = b->l;
    fsdp_unit_desc *u = &l->units[l->num_units++];
    u->kind = kind;
    u->layer = layer;
    u->first_param = l->num_params;
    for (int m = 0; m < FSDP_MOD_COUNT; m++) u->weight[m] = u->bias[m] = -1;
    b->layer = layer;
    b->unit_offset = 0;
}

/* Tensors the model runs as one product must follow each other in the flat buffer. */
static void assert_adjacent(const fsdp_layout *l, const int *idx, fsdp_module a, fsdp_module next) {
    if (idx[a] < 0 || idx[next] < 0) return;
    const fsdp_param_desc *p = &l->params[idx[a]], *q = &l->params[idx[next]];
    FSDP_ASSERT(q->offset == p->offset + p->numel);
}

static void end_unit(builder *b) {
    fsdp_layout *l = b->l;
    fsdp_unit_desc *u = &l->units[l->num_units - 1];
    u->num_params = l->num_params - u->first_param;
    u->numel = b->unit_offset;
    u->decay_numel = 0;
    for (int i = u->first_param; i < l->num_params; i++) {
        const fsdp_param_desc *p = &l->params[i];
        if (p->decay) {
            FSDP_ASSERT(p->offset == u->decay_numel); /* decayed parameters come first */
            u->decay_numel += p->numel;
        }
    }
    for (int bias = 0; bias < 2; bias++) {
        const int *idx = bias ? u->bias : u->weight;
        assert_adjacent(l, idx, FSDP_MOD_Q, FSDP_MOD_K);
        assert_adjacent(l, idx, FSDP_MOD_K, FSDP_MOD_V);
        assert_adjacent(l, idx, FSDP_MOD_GATE, FSDP_MOD_UP);
    }
    l->total_numel += u->numel;
}

static void block(builder *b, const fsdp_model_config *c) {
    int64_t C = c->hidden_size, F = c->intermediate_size;
    int64_t q = (int64_t)c->num_heads * c->head_dim, kv = (int64_t)c->num_kv_heads * c->head_dim;
    int swiglu = fsdp_block_kind_of(c).swiglu;
    add_param(b, FSDP_MOD_Q, 0, q, C);
    add_param(b, FSDP_MOD_K, 0, kv, C);
    add_param(b, FSDP_MOD_V, 0, kv, C);
    add_param(b, FSDP_MOD_O, 0, C, q);
    if (swiglu) add_param(b, FSDP_MOD_GATE, 0, F, C);
    add_param(b, FSDP_MOD_UP, 0, F, C);
    add_param(b, FSDP_MOD_DOWN, 0, C, F);
    if (c->biases & FSDP_BIAS_QKV) {
        add_param(b, FSDP_MOD_Q, 1, q, 0);
        add_param(b, FSDP_MOD_K, 1, kv, 0);
        add_param(b, FSDP_MOD_V, 1, kv, 0);
    }
    if (c->biases & FSDP_BIAS_O) add_param(b, FSDP_MOD_O, 1, C, 0);
    if (c->biases & FSDP_BIAS_MLP) {
        if (swiglu) add_param(b, FSDP_MOD_GATE, 1, F, 0);
        add_param(b, FSDP_MOD_UP, 1, F, 0);
        add_param(b, FSDP_MOD_DOWN, 1, C, 0);
    }
    fsdp_block_kind k = fsdp_block_kind_of(c);
    if (k.qk_norm) { /* one weight per element of a head, shared by the heads */
        add_param(b, FSDP_MOD_Q_NORM, 0, c->head_dim, 0);
        add_param(b, FSDP_MOD_K_NORM, 0, c->head_dim, 0);
    }
    int layer_norm = !k.rms;
    add_param(b, FSDP_MOD_NORM_ATTN, 0, C, 0);
    if (layer_norm) add_param(b, FSDP_MOD_NORM_ATTN, 1, C, 0);
    add_param(b, FSDP_MOD_NORM_MLP, 0, C, 0);
    if (layer_norm) add_param(b, FSDP_MOD_NORM_MLP, 1, C, 0);
}

void fsdp_layout_build(const fsdp_model_config *c, fsdp_layout *out) {
    memset(out, 0, sizeof *out);
    out->units = fsdp_xcalloc((size_t)c->num_layers + 2, sizeof *out->units, "the unit layout");
    const fsdp_family *f = c->family;
    builder b = {out, f, -1, 0, 0};
    int64_t C = c->hidden_size, V = c->vocab_size;

    begin_unit(&b, FSDP_UNIT_EMBED, -1);
    add_param(&b, FSDP_MOD_EMBED_TOKENS, 0, V, C);
    if (f->pos == FSDP_POS_LEARNED)
        add_param(&b, FSDP_MOD_EMBED_POSITIONS, 0, (int64_t)c->max_position_embeddings + f->pos_offset, C);
    end_unit(&b);

    for (int i = 0; i < c->num_layers; i++) {
        begin_unit(&b, FSDP_UNIT_BLOCK, i);
        block(&b, c);
        end_unit(&b);
    }

    begin_unit(&b, FSDP_UNIT_HEAD, -1);
    if (!c->tie_word_embeddings) add_param(&b, FSDP_MOD_LM_HEAD, 0, V, C);
    add_param(&b, FSDP_MOD_NORM_FINAL, 0, C, 0);
    if (f->norm == FSDP_NORM_LAYER) add_param(&b, FSDP_MOD_NORM_FINAL, 1, C, 0);
    end_unit(&b);
}

void fsdp_layout_free(fsdp_layout *l) {
    free(l->params);
    free(l->units);
    memset(l, 0, sizeof *l);
}

int fsdp_layout_find(const fsdp_layout *l, const char *name) {
    for (int i = 0; i < l->num_params; i++)
        if (!strcmp(l->params[i].name, name)) return i;
    return -1;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* What one parameter's initial values depend on, computed once per parameter, not per element. */
typedef struct {
    enum { INIT_CONSTANT, INIT_NORMAL } kind;
    float constant;
    double std;
    uint64_t key;
    int64_t zero_first, zero_end; /* a zero row (the padding_idx row of the token embedding), else empty */
} init_rule;

static init_rule init_rule_of(const fsdp_model_config *c, const fsdp_param_desc *p, uint64_t seed) {
    init_rule r = {.kind = INIT_CONSTANT};
    if (p->is_bias) return r;
    if (p->module == FSDP_MOD_NORM_ATTN || p->module == FSDP_MOD_NORM_MLP || p->module == FSDP_MOD_NORM_FINAL ||
        p->module == FSDP_MOD_Q_NORM || p->module == FSDP_MOD_K_NORM) {
        r.constant = 1.0f;
        return r;
    }
    r.kind = INIT_NORMAL;
    r.std = c->initializer_range;
    r.key = fsdp_rand_key(seed, name_hash(p->name));
    /* nn.Embedding(padding_idx=...) is initialised with that row zero (transformers' _init_weights). */
    int pad = p->module == FSDP_MOD_EMBED_TOKENS ? fsdp_model_padding_idx(c) : -1;
    if (pad >= 0) {
        r.zero_first = (int64_t)pad * p->shape[1];
        r.zero_end = r.zero_first + p->shape[1];
    }
    return r;
}

static float init_value(const init_rule *r, int64_t index) {
    if (r->kind == INIT_CONSTANT || (index >= r->zero_first && index < r->zero_end)) return r->constant;
    return (float)(r->std * fsdp_rand_normal_keyed(r->key, (uint64_t)index));
}

float fsdp_param_init_value(const fsdp_model_config *c, const fsdp_param_desc *p, uint64_t seed, int64_t index) {
    init_rule r = init_rule_of(c, p, seed);
    return init_value(&r, index);
}

void fsdp_param_init_fill(const fsdp_model_config *c, const fsdp_param_desc *p, uint64_t seed, int64_t first,
                          int64_t count, float *out) {
    init_rule r = init_rule_of(c, p, seed);
    /* Each value depends on its index alone: any thread count gives the same weights. */
    #pragma omp parallel for schedule(static) num_threads(fsdp_start_up_threads())
    for (int64_t k = 0; k < count; k++) out[k] = init_value(&r, first + k);
}
