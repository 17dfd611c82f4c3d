/* Model presets and shape validation. */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const PRESET_NAMES[] = {"llama-3.2-1b", "llama-2-7b", "opt-1.3b", "tiny-llama", "tiny-opt", NULL};

static fsdp_model_config llama_base(void) {
    fsdp_model_config c;
    memset(&c, 0, sizeof c);
    c.family = FSDP_FAMILY_LLAMA;
    c.norm_eps = 1e-5f;
    c.initializer_range = 0.02f;
    c.rope_theta = 10000.0f;
    c.rope_type = FSDP_ROPE_DEFAULT;
    c.bos_token_id = c.eos_token_id = c.pad_token_id = -1;
    return c;
}

static fsdp_model_config opt_base(void) {
    fsdp_model_config c;
    memset(&c, 0, sizeof c);
    c.family = FSDP_FAMILY_OPT;
    c.norm_eps = 1e-5f;
    c.initializer_range = 0.02f;
    c.enable_bias = 1;
    c.tie_word_embeddings = 1;
    /* OPTConfig's defaults, which the published OPT models keep. */
    c.pad_token_id = 1, c.bos_token_id = 2, c.eos_token_id = 2;
    return c;
}

int fsdp_model_preset(const char *name, fsdp_model_config *out) {
    fsdp_model_config c;
    if (!strcasecmp(name, "llama-3.2-1b")) {
        c = llama_base();
        c.vocab_size = 128256, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_layers = 16;
        c.num_heads = 32, c.num_kv_heads = 8, c.head_dim = 64, c.max_position_embeddings = 131072;
        c.rope_theta = 500000.0f, c.rope_type = FSDP_ROPE_LLAMA3, c.rope_factor = 32.0f;
        c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_original_max_position = 8192;
        c.tie_word_embeddings = 1;
        c.bos_token_id = 128000, c.eos_token_id = 128001;
    } else if (!strcasecmp(name, "llama-2-7b")) {
        c = llama_base();
        c.vocab_size = 32000, c.hidden_size = 4096, c.intermediate_size = 11008, c.num_layers = 32;
        c.num_heads = 32, c.num_kv_heads = 32, c.head_dim = 128, c.max_position_embeddings = 4096;
        c.tie_word_embeddings = 0;
        c.bos_token_id = 1, c.eos_token_id = 2;
    } else if (!strcasecmp(name, "opt-1.3b")) {
        c = opt_base();
        c.vocab_size = 50272, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_layers = 24;
        c.num_heads = 32, c.num_kv_heads = 32, c.head_dim = 64, c.max_position_embeddings = 2048;
    } else if (!strcasecmp(name, "tiny-llama")) {
        /* Small, not powers of two, grouped-query, tied, and with llama3 rope scaling whose
         * smooth band covers a frequency (theta 100, original context 32). */
        c = llama_base();
        c.vocab_size = 1031, c.hidden_size = 48, c.intermediate_size = 88, c.num_layers = 2;
        c.num_heads = 6, c.num_kv_heads = 2, c.head_dim = 8, c.max_position_embeddings = 256;
        c.rope_theta = 100.0f, c.rope_type = FSDP_ROPE_LLAMA3, c.rope_factor = 4.0f;
        c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_original_max_position = 32;
        c.tie_word_embeddings = 1;
    } else if (!strcasecmp(name, "tiny-opt")) {
        c = opt_base();
        c.vocab_size = 1031, c.hidden_size = 40, c.intermediate_size = 72, c.num_layers = 2;
        c.num_heads = 5, c.num_kv_heads = 5, c.head_dim = 8, c.max_position_embeddings = 128;
    } else {
        return -1;
    }
    for (int i = 0; PRESET_NAMES[i]; i++)
        if (!strcasecmp(name, PRESET_NAMES[i])) snprintf(c.name, sizeof c.name, "%s", PRESET_NAMES[i]);
    *out = c;
    return 0;
}

const char *const *fsdp_model_preset_names(void) { return PRESET_NAMES; }

int fsdp_model_config_validate(const fsdp_model_config *c, fsdp_err *err) {
    const char *n = c->name[0] ? c->name : "model";
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
    if (c->num_heads % c->num_kv_heads)
        return fsdp_errf(err, "%s: num_key_value_heads %d does not divide num_attention_heads %d", n, c->num_kv_heads,
                         c->num_heads);
    if (c->head_dim % 2) return fsdp_errf(err, "%s: head_dim %d must be even (rotary embedding)", n, c->head_dim);
    if (c->family == FSDP_FAMILY_OPT && c->head_dim * c->num_heads != c->hidden_size)
        return fsdp_errf(err, "%s: num_attention_heads %d does not divide hidden_size %d", n, c->num_heads,
                         c->hidden_size);
    if (!(c->norm_eps > 0.0f)) return fsdp_errf(err, "%s: the norm epsilon must be positive", n);
    if (!(c->initializer_range > 0.0f)) return fsdp_errf(err, "%s: initializer_range must be positive", n);
    if (c->family == FSDP_FAMILY_LLAMA) {
        if (!(c->rope_theta > 0.0f)) return fsdp_errf(err, "%s: rope_theta must be positive", n);
        if (c->rope_type == FSDP_ROPE_LLAMA3) {
            if (!(c->rope_factor > 0.0f) || !(c->rope_low_freq_factor > 0.0f) ||
                !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_position <= 0)
                return fsdp_errf(err,
                                 "%s: rope_scaling (llama3) needs factor > 0, 0 < low_freq_factor < "
                                 "high_freq_factor and original_max_position_embeddings > 0",
                                 n);
        }
    }
    /* Flat unit buffers and token ids are indexed with 64-bit offsets, but per-tensor row counts with int. */
    if ((long long)c->vocab_size * c->hidden_size > (1LL << 40))
        return fsdp_errf(err, "%s: vocab_size x hidden_size is too large", n);
    return 0;
}

int fsdp_model_config_same_shape(const fsdp_model_config *a, const fsdp_model_config *b) {
    int same = a->family == b->family && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
               a->intermediate_size == b->intermediate_size && a->num_layers == b->num_layers &&
               a->num_heads == b->num_heads && a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
               a->tie_word_embeddings == b->tie_word_embeddings && a->enable_bias == b->enable_bias;
    if (same && a->family == FSDP_FAMILY_OPT) same = a->max_position_embeddings == b->max_position_embeddings;
    return same;
}

void fsdp_model_config_describe(const fsdp_model_config *c, char *buf, int cap) {
    snprintf(buf, (size_t)cap, "%s, %d layers, hidden %d, %d/%d heads of %d, ffn %d, vocab %d, %s embeddings",
             c->family == FSDP_FAMILY_LLAMA ? "llama" : "opt", c->num_layers, c->hidden_size, c->num_heads,
             c->num_kv_heads, c->head_dim, c->intermediate_size, c->vocab_size,
             c->tie_word_embeddings ? "tied" : "untied");
}

static double matmul_params_per_layer(const fsdp_model_config *c) {
    double C = c->hidden_size, F = c->intermediate_size;
    double q = (double)c->num_heads * c->head_dim, kv = (double)c->num_kv_heads * c->head_dim;
    double attn = C * q + 2.0 * C * kv + q * C;
    double mlp = (c->family == FSDP_FAMILY_LLAMA ? 3.0 : 2.0) * C * F;
    return attn + mlp;
}

double fsdp_model_flops_per_token(const fsdp_model_config *c, int seq) {
    double n = c->num_layers * matmul_params_per_layer(c) + (double)c->hidden_size * c->vocab_size;
    return 6.0 * n + 6.0 * c->num_layers * (double)c->hidden_size * seq;
}

long long fsdp_model_num_params(const fsdp_model_config *c) {
    long long C = c->hidden_size, V = c->vocab_size, L = c->num_layers;
    long long per_layer = (long long)matmul_params_per_layer(c);
    long long n = V * C;
    if (c->family == FSDP_FAMILY_LLAMA) {
        per_layer += 2 * C; /* two RMSNorm weights */
        n += L * per_layer + C;
    } else {
        long long q = (long long)c->num_heads * c->head_dim;
        per_layer += 3 * q + C + c->intermediate_size + C + 4 * C; /* biases and two LayerNorms */
        n += (long long)(c->max_position_embeddings + 2) * C + L * per_layer + 2 * C;
    }
    if (!c->tie_word_embeddings) n += V * C;
    return n;
}
