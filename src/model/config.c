/* Presets (gathered from the families), derivation, validation and the figures derived from a
 * config. */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "layout.h"

int fsdp_model_preset(const char *name, fsdp_model_config *out) {
    for (const fsdp_family *const *f = fsdp_families(); *f; f++)
        for (int i = 0; i < (*f)->num_presets; i++)
            if (!strcasecmp(name, (*f)->presets[i].name)) {
                *out = (*f)->presets[i];
                return 0;
            }
    return -1;
}

const char *const *fsdp_model_preset_names(void) {
    static const char *names[64];
    if (!names[0]) {
        int n = 0;
        for (const fsdp_family *const *f = fsdp_families(); *f; f++)
            for (int i = 0; i < (*f)->num_presets && n < 63; i++) names[n++] = (*f)->presets[i].name;
    }
    return names;
}

int fsdp_model_config_derive(fsdp_model_config *c, fsdp_err *err) {
    const char *n = c->name[0] ? c->name : "model";
    if (c->num_heads <= 0) return fsdp_errf(err, "%s: num_attention_heads must be positive", n);
    if (c->num_kv_heads == 0) c->num_kv_heads = c->num_heads;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_heads)
            return fsdp_errf(err, "%s: num_attention_heads %d does not divide hidden_size %d", n, c->num_heads,
                             c->hidden_size);
        c->head_dim = c->hidden_size / c->num_heads;
    }
    return 0;
}

/* The config.json key of an integer field of the config (num_hidden_layers for num_layers, OPT's
 * ffn_dim for intermediate_size), so that messages name what the user wrote. */
static const char *key_of(const fsdp_model_config *c, size_t offset, const char *fallback) {
    for (const fsdp_hf_field *x = c->family->fields; x && x->key; x++)
        if (x->kind == FSDP_HF_INT && x->offset == offset) return x->key;
    return fallback;
}

/* Sizes derived from a config must fit the types that hold them, and a config must be refused
 * before the layout is built: the layout and the engine keep a few KB per layer on every rank, so a
 * million layers of a tiny width would exhaust host memory before the memory plan could say no.
 * Checked in doubles, which hold every product here without overflow. */
static int check_sizes(const fsdp_model_config *c, const char *n, fsdp_err *err) {
    const char *layers = key_of(c, FSDP_HF_OFF(num_layers), "num_layers");
    const char *ffn = key_of(c, FSDP_HF_OFF(intermediate_size), "intermediate_size");
    if (c->num_layers > FSDP_MAX_LAYERS)
        return fsdp_errf(err, "%s: %s %d is more than the %d layers fsdp.c builds (every layer costs bookkeeping on "
                         "every rank before the memory check could refuse the model)",
                         n, layers, c->num_layers, FSDP_MAX_LAYERS);
    const double C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const double q = (double)c->num_heads * c->head_dim, kv = (double)c->num_kv_heads * c->head_dim;
    /* The fused q|k|v and gate|up products have int row counts. */
    if (q + 2.0 * kv > INT_MAX)
        return fsdp_errf(err, "%s: num_attention_heads %d and num_key_value_heads %d of head_dim %d give %.0f rows of the "
                         "fused q/k/v projection, more than %d", n, c->num_heads, c->num_kv_heads, c->head_dim,
                         q + 2.0 * kv, INT_MAX);
    if (2.0 * F > INT_MAX)
        return fsdp_errf(err, "%s: %s %d is too large (twice it must fit %d)", n, ffn, c->intermediate_size, INT_MAX);
    const double pos = c->family->pos == FSDP_POS_LEARNED ? (double)c->max_position_embeddings + c->family->pos_offset : 0;
    struct {
        const char *what;
        double rows;
    } matrices[] = {{"vocab_size", V}, {"num_attention_heads x head_dim", q}, {ffn, F}, {"max_position_embeddings", pos}};
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
        if (matrices[i].rows * C > (double)FSDP_MAX_TENSOR_NUMEL)
            return fsdp_errf(err, "%s: %s %.0f x hidden_size %d is a matrix of %.3g elements, more than the %.3g fsdp.c "
                             "indexes", n, matrices[i].what, matrices[i].rows, c->hidden_size, matrices[i].rows * C,
                             (double)FSDP_MAX_TENSOR_NUMEL);
    /* Every tensor a layer can have (biases and norms included): an upper bound of the count. */
    const double per_layer = (q + 2.0 * kv) * (C + 1) + q * C + C + 3.0 * F * (C + 1) + 5.0 * C + 2.0 * c->head_dim;
    const double total = c->num_layers * per_layer + 2.0 * V * C + pos * C + 2.0 * C;
    if (total > (double)FSDP_MAX_PARAMS)
        return fsdp_errf(err, "%s: %s %d, hidden_size %d and %s %d make about %.3g parameters, more than the %.3g "
                         "fsdp.c indexes", n, layers, c->num_layers, c->hidden_size, ffn, c->intermediate_size, total,
                         (double)FSDP_MAX_PARAMS);
    return 0;
}

int fsdp_model_config_validate(const fsdp_model_config *c, fsdp_err *err) {
    const char *n = c->name[0] ? c->name : "model";
    const fsdp_family *f = c->family;
    if (!f) return fsdp_errf(err, "%s: no model family", n);
#define POSITIVE(field)                                                                              \
    if (c->field <= 0) return fsdp_errf(err, "%s: %s must be positive (got %d)", n, #field, c->field)
    POSITIVE(vocab_size);
    POSITIVE(hidden_size);
    POSITIVE(intermediate_size);
    POSITIVE(num_layers);
    POSITIVE(num_heads);
    POSITIVE(num_kv_heads);
    POSITIVE(head_dim);
    POSITIVE(max_position_embeddings);
#undef POSITIVE
    if (check_sizes(c, n, err)) return -1;
    if (c->num_heads % c->num_kv_heads)
        return fsdp_errf(err, "%s: num_key_value_heads %d does not divide num_attention_heads %d", n, c->num_kv_heads,
                         c->num_heads);
    if (!(c->norm_eps > 0.0f)) return fsdp_errf(err, "%s: the norm epsilon must be positive", n);
    if (c->sliding_window < 0) return fsdp_errf(err, "%s: sliding_window must be positive (got %d)", n, c->sliding_window);
    if (!(c->initializer_range > 0.0f)) return fsdp_errf(err, "%s: initializer_range must be positive", n);
    if ((c->biases & f->biases) != f->biases || (c->biases & ~(unsigned)(FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP)))
        return fsdp_errf(err, "%s: %s models have biases that this config lacks", n, f->model_type);
    const float rates[3] = {c->dropout, c->attention_dropout, c->activation_dropout};
    for (int i = 0; i < 3; i++)
        if (!(rates[i] >= 0.0f && rates[i] <= 1.0f))
            return fsdp_errf(err, "%s: dropout rates must lie in [0, 1]", n);
    if (f->pos == FSDP_POS_ROPE) {
        if (c->head_dim % 2) return fsdp_errf(err, "%s: head_dim %d must be even (rotary embedding)", n, c->head_dim);
        if (!(c->rope_theta > 0.0f)) return fsdp_errf(err, "%s: rope_theta must be positive", n);
        if (c->rope_type == FSDP_ROPE_LLAMA3 &&
            (!(c->rope_factor > 0.0f) || !(c->rope_low_freq_factor > 0.0f) ||
             !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_position <= 0))
            return fsdp_errf(err,
                             "%s: rope_scaling (llama3) needs factor > 0, 0 < low_freq_factor < "
                             "high_freq_factor and original_max_position_embeddings > 0",
                             n);
        if (c->rope_type == FSDP_ROPE_LINEAR && !(c->rope_factor > 0.0f))
            return fsdp_errf(err, "%s: rope_scaling (linear) needs factor > 0", n);
    } else if (c->head_dim * c->num_heads != c->hidden_size) {
        return fsdp_errf(err, "%s: num_attention_heads %d x head_dim %d must equal hidden_size %d", n, c->num_heads,
                         c->head_dim, c->hidden_size);
    }
    /* nn.Embedding refuses a padding_idx outside the table. */
    if (f->padding_idx && c->pad_token_id >= c->vocab_size)
        return fsdp_errf(err, "%s: pad_token_id %d is not a row of the embedding (vocab_size %d)", n, c->pad_token_id,
                         c->vocab_size);
    return 0;
}

int fsdp_model_config_same_shape(const fsdp_model_config *a, const fsdp_model_config *b) {
    int same = a->family == b->family && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
               a->intermediate_size == b->intermediate_size && a->num_layers == b->num_layers &&
               a->num_heads == b->num_heads && a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
               a->tie_word_embeddings == b->tie_word_embeddings && a->biases == b->biases;
    if (same && a->family->pos == FSDP_POS_LEARNED) same = a->max_position_embeddings == b->max_position_embeddings;
    return same;
}

static void describe_biases(unsigned biases, char *buf, size_t cap) {
    if (!biases) {
        snprintf(buf, cap, "no biases");
        return;
    }
    snprintf(buf, cap, "biases on%s%s%s", biases & FSDP_BIAS_QKV ? " q/k/v" : "", biases & FSDP_BIAS_O ? " o" : "",
             biases & FSDP_BIAS_MLP ? " mlp" : "");
}

void fsdp_model_config_describe(const fsdp_model_config *c, char *buf, int cap) {
    char biases[64], extra[64] = "";
    describe_biases(c->biases, biases, sizeof biases);
    if (c->family && c->family->qk_norm) snprintf(extra, sizeof extra, ", q/k norms");
    if (c->sliding_window > 0)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", sliding window %d", c->sliding_window);
    snprintf(buf, (size_t)cap, "%s, %d layers, hidden %d, %d/%d heads of %d, ffn %d, vocab %d, %s embeddings, %s%s",
             c->family ? c->family->model_type : "?", c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads,
             c->head_dim, c->intermediate_size, c->vocab_size, c->tie_word_embeddings ? "tied" : "untied", biases,
             extra);
}

double fsdp_model_flops_per_token(const fsdp_model_config *c, int seq) {
    const fsdp_block_kind k = fsdp_block_kind_of(c);
    double C = c->hidden_size, F = c->intermediate_size;
    double q = (double)c->num_heads * c->head_dim, kv = (double)c->num_kv_heads * c->head_dim;
    double attn = C * q + 2.0 * C * kv + q * C;
    double mlp = (k.swiglu ? 3.0 : 2.0) * C * F;
    double n = c->num_layers * (attn + mlp) + C * c->vocab_size;
    /* The attention's products: q . k and p v over the keys a query sees, in the width of the
     * query heads (hidden for Llama, Qwen2, OPT; num_heads x head_dim where head_dim is its own, as
     * Qwen3's); a sliding window caps the keys. */
    double keys = k.window && k.window < seq ? k.window : seq;
    return 6.0 * n + 6.0 * c->num_layers * q * keys;
}

long long fsdp_model_num_params(const fsdp_model_config *c) {
    fsdp_layout l;
    fsdp_layout_build(c, &l);
    long long n = l.total_numel;
    fsdp_layout_free(&l);
    return n;
}

/* 1 when the family's config.json reads `key` as a dropout rate into the config: a family without
 * a `dropout` field (Llama, Qwen2) has no residual dropout in transformers. */
static int family_has_rate(const fsdp_family *f, size_t offset) {
    for (const fsdp_hf_field *x = f->fields; x && x->key; x++)
        if (x->kind == FSDP_HF_RATE && x->offset == offset) return 1;
    return 0;
}

int fsdp_model_dropout_rates(const fsdp_model_config *c, int override_set, double override, fsdp_dropout_rates *out,
                             fsdp_err *err) {
    const int hidden = family_has_rate(c->family, FSDP_HF_OFF(dropout));
    const int attention = family_has_rate(c->family, FSDP_HF_OFF(attention_dropout));
    out->hidden = !hidden ? 0.0f : override_set ? (float)override : c->dropout;
    out->attention = !attention ? 0.0f : override_set ? (float)override : c->attention_dropout;
    const char *n = c->name[0] ? c->name : "model";
    if (override_set && !(override >= 0.0 && override < 1.0))
        return fsdp_usagef(err, "--dropout %g is not a rate in [0, 1)", override);
    if (!(out->hidden < 1.0f))
        return fsdp_errf(err, "%s: dropout %g would drop every element (training needs a rate below 1; --dropout P "
                              "overrides it)", n, (double)out->hidden);
    if (!(out->attention < 1.0f))
        return fsdp_errf(err, "%s: attention_dropout %g would drop every probability (training needs a rate below 1; "
                              "--dropout P overrides it)", n, (double)out->attention);
    return 0;
}

void fsdp_dropout_rates_describe(const fsdp_dropout_rates *r, char *buf, int cap) {
    char hidden[64] = "", attention[64] = "";
    if (r->hidden > 0.0f) snprintf(hidden, sizeof hidden, "%g on attention and MLP outputs", (double)r->hidden);
    if (r->attention > 0.0f) snprintf(attention, sizeof attention, "%g on attention probabilities", (double)r->attention);
    snprintf(buf, (size_t)cap, "%s%s%s", hidden, *hidden && *attention ? ", " : "",
             *hidden || *attention ? attention : "none");
}

int fsdp_model_padding_idx(const fsdp_model_config *c) {
    return c->family->padding_idx && c->pad_token_id >= 0 ? c->pad_token_id : -1;
}
