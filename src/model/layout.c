/* Parameter names, shapes and unit layout for the Llama and OPT families. */
#include "layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/rng.h"

typedef struct {
    fsdp_layout *l;
    int cap;
    int64_t unit_offset; /* running offset inside the current unit */
} builder;

static void add_param(builder *b, int decay, int64_t rows, int64_t cols, const char *fmt, ...) {
    fsdp_layout *l = b->l;
    if (l->num_params == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        l->params = realloc(l->params, (size_t)b->cap * sizeof *l->params);
        if (!l->params) fsdp_fatal("out of host memory building the parameter layout");
    }
    fsdp_param_desc *p = &l->params[l->num_params++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 1;
    p->numel = rows * p->shape[1];
    p->unit = l->num_units - 1;
    p->offset = b->unit_offset;
    p->decay = decay;
    b->unit_offset += p->numel;
}

static void begin_unit(builder *b, fsdp_unit_kind kind, int layer) {
    fsdp_layout *l = b->l;
    fsdp_unit_desc *u = &l->units[l->num_units++];
    u->kind = kind;
    u->layer = layer;
    u->first_param = l->num_params;
    b->unit_offset = 0;
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
    l->total_numel += u->numel;
}

static void llama_block(builder *b, const fsdp_model_config *c, int i) {
    int64_t C = c->hidden_size, F = c->intermediate_size;
    int64_t q = (int64_t)c->num_heads * c->head_dim, kv = (int64_t)c->num_kv_heads * c->head_dim;
    const char *pre = "model.layers";
    add_param(b, 1, q, C, "%s.%d.self_attn.q_proj.weight", pre, i);
    add_param(b, 1, kv, C, "%s.%d.self_attn.k_proj.weight", pre, i);
    add_param(b, 1, kv, C, "%s.%d.self_attn.v_proj.weight", pre, i);
    add_param(b, 1, C, q, "%s.%d.self_attn.o_proj.weight", pre, i);
    add_param(b, 1, F, C, "%s.%d.mlp.gate_proj.weight", pre, i);
    add_param(b, 1, F, C, "%s.%d.mlp.up_proj.weight", pre, i);
    add_param(b, 1, C, F, "%s.%d.mlp.down_proj.weight", pre, i);
    add_param(b, 0, C, 0, "%s.%d.input_layernorm.weight", pre, i);
    add_param(b, 0, C, 0, "%s.%d.post_attention_layernorm.weight", pre, i);
}

static void opt_block(builder *b, const fsdp_model_config *c, int i) {
    int64_t C = c->hidden_size, F = c->intermediate_size;
    const char *pre = "model.decoder.layers";
    add_param(b, 1, C, C, "%s.%d.self_attn.q_proj.weight", pre, i);
    add_param(b, 1, C, C, "%s.%d.self_attn.k_proj.weight", pre, i);
    add_param(b, 1, C, C, "%s.%d.self_attn.v_proj.weight", pre, i);
    add_param(b, 1, C, C, "%s.%d.self_attn.out_proj.weight", pre, i);
    add_param(b, 1, F, C, "%s.%d.fc1.weight", pre, i);
    add_param(b, 1, C, F, "%s.%d.fc2.weight", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn.q_proj.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn.k_proj.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn.v_proj.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn.out_proj.bias", pre, i);
    add_param(b, 0, F, 0, "%s.%d.fc1.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.fc2.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn_layer_norm.weight", pre, i);
    add_param(b, 0, C, 0, "%s.%d.self_attn_layer_norm.bias", pre, i);
    add_param(b, 0, C, 0, "%s.%d.final_layer_norm.weight", pre, i);
    add_param(b, 0, C, 0, "%s.%d.final_layer_norm.bias", pre, i);
}

void fsdp_layout_build(const fsdp_model_config *c, fsdp_layout *out) {
    memset(out, 0, sizeof *out);
    out->units = fsdp_xcalloc((size_t)c->num_layers + 2, sizeof *out->units, "the unit layout");
    builder b = {out, 0, 0};
    int64_t C = c->hidden_size, V = c->vocab_size;
    int llama = c->family == FSDP_FAMILY_LLAMA;

    begin_unit(&b, FSDP_UNIT_EMBED, -1);
    if (llama) {
        add_param(&b, 1, V, C, "model.embed_tokens.weight");
    } else {
        add_param(&b, 1, V, C, "model.decoder.embed_tokens.weight");
        /* OPT's learned positions are offset by 2 (a fairseq legacy), hence two extra rows. */
        add_param(&b, 1, (int64_t)c->max_position_embeddings + 2, C, "model.decoder.embed_positions.weight");
    }
    end_unit(&b);

    for (int i = 0; i < c->num_layers; i++) {
        begin_unit(&b, FSDP_UNIT_BLOCK, i);
        if (llama)
            llama_block(&b, c, i);
        else
            opt_block(&b, c, i);
        end_unit(&b);
    }

    begin_unit(&b, FSDP_UNIT_HEAD, -1);
    if (!c->tie_word_embeddings) add_param(&b, 1, V, C, "lm_head.weight");
    if (llama) {
        add_param(&b, 0, C, 0, "model.norm.weight");
    } else {
        add_param(&b, 0, C, 0, "model.decoder.final_layer_norm.weight");
        add_param(&b, 0, C, 0, "model.decoder.final_layer_norm.bias");
    }
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

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

float fsdp_param_init_value(const fsdp_model_config *c, const fsdp_param_desc *p, uint64_t seed, int64_t index) {
    if (p->ndim == 1) {
        /* Norm weights start at one; biases (and norm biases) at zero. */
        if (ends_with(p->name, ".bias")) return 0.0f;
        return 1.0f;
    }
    return (float)(c->initializer_range * fsdp_rand_normal(seed, name_hash(p->name), (uint64_t)index));
}
