/* Hugging Face config.json <-> fsdp_model_config: the Llama and OPT readers (with transformers'
 * defaults for absent fields), the writer, and fsdp_hf_config_load. */
#include "hf_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"

/* What every field reader needs: the object to look in and the names for messages. */
typedef struct {
    const fsdp_json *obj;
    const char *origin;
    const char *prefix; /* "" or "rope_scaling." for nested fields */
    fsdp_err *err;
} fields;

static const char *type_name(const fsdp_json *v) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[v->type];
}

static int wrong_type(const fields *f, const char *key, const char *want, const fsdp_json *v) {
    return fsdp_errf(f->err, "%s: %s%s must be %s, not %s", f->origin, f->prefix, key, want, type_name(v));
}

/* A member, treating null as absent: transformers falls back to its default for None too. */
static const fsdp_json *member(const fields *f, const char *key) {
    const fsdp_json *v = fsdp_json_get(f->obj, key);
    return v && v->type != FSDP_JSON_NULL ? v : NULL;
}

/* An integer field in [1, INT_MAX]; `dflt` < 0 means required. */
static int get_int(const fields *f, const char *key, long long dflt, int *out) {
    const fsdp_json *v = member(f, key);
    if (!v) {
        if (dflt < 0) return fsdp_errf(f->err, "%s: missing field %s%s", f->origin, f->prefix, key);
        *out = (int)dflt;
        return 0;
    }
    if (v->type != FSDP_JSON_NUMBER) return wrong_type(f, key, "an integer", v);
    if (v->number != floor(v->number))
        return fsdp_errf(f->err, "%s: %s%s %s is not an integer", f->origin, f->prefix, key, v->string);
    if (v->number < 1 || v->number > INT_MAX)
        return fsdp_errf(f->err, "%s: %s%s %s is out of range (1 to %d)", f->origin, f->prefix, key, v->string,
                         INT_MAX);
    *out = (int)v->number;
    return 0;
}

/* A positive finite number (zero too when `allow_zero`); `required` says whether dflt applies. */
static int get_float(const fields *f, const char *key, int required, double dflt, int allow_zero, float *out) {
    const fsdp_json *v = member(f, key);
    if (!v) {
        if (required) return fsdp_errf(f->err, "%s: missing field %s%s", f->origin, f->prefix, key);
        *out = (float)dflt;
        return 0;
    }
    if (v->type != FSDP_JSON_NUMBER) return wrong_type(f, key, "a number", v);
    float x = (float)v->number;
    if (!isfinite(x) || x < 0 || (x == 0 && !allow_zero))
        return fsdp_errf(f->err, "%s: %s%s %s must be %s", f->origin, f->prefix, key, v->string,
                         allow_zero ? "a finite number >= 0" : "positive (and fit a float)");
    *out = x;
    return 0;
}

static int get_bool(const fields *f, const char *key, int dflt, int *out) {
    const fsdp_json *v = member(f, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->type != FSDP_JSON_BOOL) return wrong_type(f, key, "true or false", v);
    *out = v->boolean;
    return 0;
}

/* A string field; NULL in *out when absent. */
static int get_string(const fields *f, const char *key, const char **out) {
    const fsdp_json *v = member(f, key);
    *out = NULL;
    if (!v) return 0;
    if (v->type != FSDP_JSON_STRING) return wrong_type(f, key, "a string", v);
    *out = v->string;
    return 0;
}

/* A boolean that fsdp.c supports only with one value. */
static int require_bool(const fields *f, const char *key, int dflt, int supported, const char *why) {
    int b;
    if (get_bool(f, key, dflt, &b)) return -1;
    if (b != supported)
        return fsdp_errf(f->err, "%s: %s %s is not supported (%s)", f->origin, key, b ? "true" : "false", why);
    return 0;
}

/* A string that fsdp.c supports only with one value (absent is fine: it is the default). */
static int require_string(const fields *f, const char *key, const char *supported) {
    const char *s;
    if (get_string(f, key, &s)) return -1;
    if (s && strcmp(s, supported))
        return fsdp_errf(f->err, "%s: %s '%s' is not supported (only '%s')", f->origin, key, s, supported);
    return 0;
}

/* rope_scaling: null, {"rope_type": "default"} or a llama3 scaling. Older files say "type". */
static int parse_rope_scaling(const fields *f, fsdp_model_config *c) {
    const fsdp_json *rs = member(f, "rope_scaling");
    c->rope_type = FSDP_ROPE_DEFAULT;
    if (!rs) return 0;
    if (rs->type != FSDP_JSON_OBJECT) return wrong_type(f, "rope_scaling", "null or an object", rs);
    fields sub = {rs, f->origin, "rope_scaling.", f->err};
    const char *type;
    if (get_string(&sub, "rope_type", &type)) return -1;
    if (!type && get_string(&sub, "type", &type)) return -1;
    if (!type) return fsdp_errf(f->err, "%s: rope_scaling has no rope_type", f->origin);
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return fsdp_errf(f->err, "%s: rope_scaling type '%s' is not supported (llama3, default)", f->origin, type);
    c->rope_type = FSDP_ROPE_LLAMA3;
    if (get_float(&sub, "factor", 1, 0, 0, &c->rope_factor) ||
        get_float(&sub, "low_freq_factor", 1, 0, 0, &c->rope_low_freq_factor) ||
        get_float(&sub, "high_freq_factor", 1, 0, 0, &c->rope_high_freq_factor) ||
        get_int(&sub, "original_max_position_embeddings", -1, &c->rope_original_max_position))
        return -1;
    return 0;
}

static int divides(const fields *f, const char *a_name, int a, const char *b_name, int b) {
    if (b % a) return fsdp_errf(f->err, "%s: %s %d does not divide %s %d", f->origin, a_name, a, b_name, b);
    return 0;
}

/* Field names and defaults follow transformers' LlamaConfig. */
static int parse_llama(const fields *f, fsdp_model_config *c) {
    c->family = FSDP_FAMILY_LLAMA;
    if (get_int(f, "vocab_size", -1, &c->vocab_size) || get_int(f, "hidden_size", -1, &c->hidden_size) ||
        get_int(f, "intermediate_size", -1, &c->intermediate_size) ||
        get_int(f, "num_hidden_layers", -1, &c->num_layers) || get_int(f, "num_attention_heads", -1, &c->num_heads) ||
        get_int(f, "num_key_value_heads", c->num_heads, &c->num_kv_heads) ||
        get_int(f, "max_position_embeddings", -1, &c->max_position_embeddings))
        return -1;
    if (!member(f, "head_dim") && divides(f, "num_attention_heads", c->num_heads, "hidden_size", c->hidden_size))
        return -1;
    if (get_int(f, "head_dim", c->hidden_size / c->num_heads, &c->head_dim) ||
        divides(f, "num_key_value_heads", c->num_kv_heads, "num_attention_heads", c->num_heads) ||
        get_float(f, "rms_norm_eps", 0, 1e-6, 0, &c->norm_eps) ||
        get_float(f, "rope_theta", 0, 10000.0, 0, &c->rope_theta) || parse_rope_scaling(f, c) ||
        get_bool(f, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
        get_float(f, "initializer_range", 0, 0.02, 1, &c->initializer_range) ||
        require_bool(f, "attention_bias", 0, 0, "fsdp.c's Llama has no attention biases") ||
        require_bool(f, "mlp_bias", 0, 0, "fsdp.c's Llama has no MLP biases") ||
        require_string(f, "hidden_act", "silu"))
        return -1;
    c->enable_bias = 0;
    return 0;
}

/* Field names and defaults follow transformers' OPTConfig; only the pre-LayerNorm variant with no
 * embedding projection is supported. */
static int parse_opt(const fields *f, fsdp_model_config *c) {
    c->family = FSDP_FAMILY_OPT;
    if (get_int(f, "vocab_size", -1, &c->vocab_size) || get_int(f, "hidden_size", -1, &c->hidden_size) ||
        get_int(f, "ffn_dim", -1, &c->intermediate_size) || get_int(f, "num_hidden_layers", -1, &c->num_layers) ||
        get_int(f, "num_attention_heads", -1, &c->num_heads) ||
        get_int(f, "max_position_embeddings", -1, &c->max_position_embeddings) ||
        divides(f, "num_attention_heads", c->num_heads, "hidden_size", c->hidden_size))
        return -1;
    c->num_kv_heads = c->num_heads;
    c->head_dim = c->hidden_size / c->num_heads;
    int proj_dim;
    if (get_int(f, "word_embed_proj_dim", c->hidden_size, &proj_dim)) return -1;
    if (proj_dim != c->hidden_size)
        return fsdp_errf(f->err, "%s: word_embed_proj_dim %d differs from hidden_size %d (not supported)", f->origin,
                         proj_dim, c->hidden_size);
    if (require_bool(f, "do_layer_norm_before", 1, 1, "fsdp.c's OPT is pre-LayerNorm") ||
        require_bool(f, "layer_norm_elementwise_affine", 1, 1, "fsdp.c's OPT LayerNorms have weights and biases") ||
        require_string(f, "activation_function", "relu") || get_bool(f, "enable_bias", 1, &c->enable_bias) ||
        get_bool(f, "tie_word_embeddings", 1, &c->tie_word_embeddings) ||
        get_float(f, "init_std", 0, 0.02, 1, &c->initializer_range))
        return -1;
    c->norm_eps = 1e-5f; /* OPT's LayerNorm epsilon is not configurable */
    c->rope_type = FSDP_ROPE_DEFAULT;
    return 0;
}

/* A token id: a non-negative integer, or -1 when absent or null. A list (Llama 3.1's several
 * end-of-sequence ids) gives its first id. */
static int get_token_id(const fields *f, const char *key, int *out) {
    const fsdp_json *v = member(f, key);
    *out = -1;
    if (!v) return 0;
    if (v->type == FSDP_JSON_ARRAY) {
        if (v->count == 0) return 0;
        v = &v->items[0];
    }
    if (v->type != FSDP_JSON_NUMBER || v->number != floor(v->number) || v->number < 0 || v->number > INT_MAX)
        return fsdp_errf(f->err, "%s: %s must be a non-negative integer token id", f->origin, key);
    *out = (int)v->number;
    return 0;
}

/* "llama models/x/config.json", keeping the end of a long path since that is the telling part. */
static void set_name(fsdp_model_config *c, const char *model_type, const char *origin) {
    size_t cap = sizeof c->name, used = (size_t)snprintf(c->name, cap, "%s ", model_type), n = strlen(origin);
    if (used + 4 >= cap) return; /* model_type is "llama" or "opt" here, so this does not happen */
    size_t room = cap - 1 - used;
    if (n > room) {
        memcpy(c->name + used, "...", 3);
        used += 3;
        origin += n - (room - 3);
    }
    snprintf(c->name + used, cap - used, "%s", origin);
}

/* fsdp_model_config_validate prefixes its messages with the config's name; ours name the file. */
static int validate(const fsdp_model_config *c, const char *origin, fsdp_err *err) {
    fsdp_model_config anon = *c;
    fsdp_err verr = {0};
    anon.name[0] = 0;
    if (fsdp_model_config_validate(&anon, &verr) == 0) return 0;
    const char *msg = verr.msg;
    if (!strncmp(msg, "model: ", 7)) msg += 7;
    return fsdp_errf(err, "%s: %s", origin, msg);
}

int fsdp_hf_config_parse(const char *text, size_t len, const char *origin, fsdp_model_config *out, fsdp_err *err) {
    char jerr[256];
    fsdp_json *root = fsdp_json_parse(text, len, jerr, sizeof jerr);
    if (!root) return fsdp_errf(err, "%s: %s", origin, jerr);
    fsdp_model_config c;
    memset(&c, 0, sizeof c);
    fields f = {root, origin, "", err};
    const char *model_type = NULL;
    int rc = -1;
    if (root->type != FSDP_JSON_OBJECT)
        fsdp_errf(err, "%s: expected a JSON object, found %s", origin, type_name(root));
    else if (get_string(&f, "model_type", &model_type) == 0 && !model_type)
        fsdp_errf(err, "%s: missing field model_type", origin);
    else if (model_type && !strcmp(model_type, "llama"))
        rc = parse_llama(&f, &c);
    else if (model_type && !strcmp(model_type, "opt"))
        rc = parse_opt(&f, &c);
    else if (model_type)
        fsdp_errf(err, "%s: model_type '%s' is not supported (llama, opt)", origin, model_type);
    if (rc == 0)
        rc = get_token_id(&f, "bos_token_id", &c.bos_token_id) || get_token_id(&f, "eos_token_id", &c.eos_token_id) ||
                     get_token_id(&f, "pad_token_id", &c.pad_token_id)
                 ? -1
                 : 0;
    if (rc == 0) {
        set_name(&c, model_type, origin);
        rc = validate(&c, origin, err);
    }
    fsdp_json_free(root);
    if (rc == 0) *out = c;
    return rc;
}

int fsdp_hf_config_load(const char *path, fsdp_model_config *out, fsdp_err *err) {
    char file[4096], rerr[1200];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (snprintf(file, sizeof file, "%s/config.json", path) >= (int)sizeof file)
            return fsdp_errf(err, "%s: path too long", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    size_t len;
    char *text = fsdp_read_file(file, &len, rerr, sizeof rerr);
    if (!text) return fsdp_errf(err, "%s", rerr);
    int rc = fsdp_hf_config_parse(text, len, file, out, err);
    free(text);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* The shortest decimal that reads back to the same float: 1e-05, not 9.9999997473787516e-06;
 * whole numbers as "500000.0" so Python readers see a float. */
static void put_float(fsdp_sb *sb, const char *ind, const char *key, float x) {
    char tmp[48];
    if (x == (float)(long long)x && fabsf(x) < 1e15f) {
        snprintf(tmp, sizeof tmp, "%.1f", (double)x);
    } else {
        for (int prec = 1; prec <= 9; prec++) {
            snprintf(tmp, sizeof tmp, "%.*g", prec, (double)x);
            if ((float)strtod(tmp, NULL) == x) break;
        }
    }
    fsdp_sb_printf(sb, ",\n%s\"%s\": %s", ind, key, tmp);
}

static void put_int(fsdp_sb *sb, const char *ind, const char *key, int x) {
    fsdp_sb_printf(sb, ",\n%s\"%s\": %d", ind, key, x);
}

static void put_bool(fsdp_sb *sb, const char *ind, const char *key, int b) {
    fsdp_sb_printf(sb, ",\n%s\"%s\": %s", ind, key, b ? "true" : "false");
}

static void put_string(fsdp_sb *sb, const char *ind, const char *key, const char *v) {
    fsdp_sb_printf(sb, ",\n%s\"%s\": \"%s\"", ind, key, v);
}

#define INDENT "  "
#define INDENT2 "    "

static void write_llama(const fsdp_model_config *c, fsdp_sb *sb) {
    fsdp_sb_printf(sb, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\"");
    put_string(sb, INDENT, "torch_dtype", "float32");
    put_int(sb, INDENT, "vocab_size", c->vocab_size);
    put_int(sb, INDENT, "hidden_size", c->hidden_size);
    put_int(sb, INDENT, "intermediate_size", c->intermediate_size);
    put_int(sb, INDENT, "num_hidden_layers", c->num_layers);
    put_int(sb, INDENT, "num_attention_heads", c->num_heads);
    put_int(sb, INDENT, "num_key_value_heads", c->num_kv_heads);
    put_int(sb, INDENT, "head_dim", c->head_dim);
    put_int(sb, INDENT, "max_position_embeddings", c->max_position_embeddings);
    put_float(sb, INDENT, "rms_norm_eps", c->norm_eps);
    put_float(sb, INDENT, "rope_theta", c->rope_theta);
    if (c->rope_type == FSDP_ROPE_LLAMA3) {
        fsdp_sb_printf(sb, ",\n  \"rope_scaling\": {\n    \"rope_type\": \"llama3\"");
        put_float(sb, INDENT2, "factor", c->rope_factor);
        put_float(sb, INDENT2, "low_freq_factor", c->rope_low_freq_factor);
        put_float(sb, INDENT2, "high_freq_factor", c->rope_high_freq_factor);
        put_int(sb, INDENT2, "original_max_position_embeddings", c->rope_original_max_position);
        fsdp_sb_printf(sb, "\n  }");
    } else {
        fsdp_sb_printf(sb, ",\n  \"rope_scaling\": null");
    }
    put_bool(sb, INDENT, "tie_word_embeddings", c->tie_word_embeddings);
    put_bool(sb, INDENT, "attention_bias", 0);
    put_bool(sb, INDENT, "mlp_bias", 0);
    put_string(sb, INDENT, "hidden_act", "silu");
    put_float(sb, INDENT, "initializer_range", c->initializer_range);
    /* fsdp.c trains without dropout; say so, since transformers would otherwise use its default. */
    put_float(sb, INDENT, "attention_dropout", 0.0f);
    fsdp_sb_printf(sb, "\n}\n");
}

static void write_opt(const fsdp_model_config *c, fsdp_sb *sb) {
    fsdp_sb_printf(sb, "{\n  \"architectures\": [\"OPTForCausalLM\"],\n  \"model_type\": \"opt\"");
    put_string(sb, INDENT, "torch_dtype", "float32");
    put_int(sb, INDENT, "vocab_size", c->vocab_size);
    put_int(sb, INDENT, "hidden_size", c->hidden_size);
    put_int(sb, INDENT, "ffn_dim", c->intermediate_size);
    put_int(sb, INDENT, "num_hidden_layers", c->num_layers);
    put_int(sb, INDENT, "num_attention_heads", c->num_heads);
    put_int(sb, INDENT, "max_position_embeddings", c->max_position_embeddings);
    put_bool(sb, INDENT, "do_layer_norm_before", 1);
    put_int(sb, INDENT, "word_embed_proj_dim", c->hidden_size);
    put_string(sb, INDENT, "activation_function", "relu");
    put_bool(sb, INDENT, "enable_bias", c->enable_bias);
    put_bool(sb, INDENT, "layer_norm_elementwise_affine", 1);
    put_bool(sb, INDENT, "tie_word_embeddings", c->tie_word_embeddings);
    put_float(sb, INDENT, "init_std", c->initializer_range);
    /* OPTConfig defaults to dropout 0.1; fsdp.c trains without dropout. */
    put_float(sb, INDENT, "dropout", 0.0f);
    put_float(sb, INDENT, "attention_dropout", 0.0f);
    put_float(sb, INDENT, "activation_dropout", 0.0f);
    put_float(sb, INDENT, "layerdrop", 0.0f);
    fsdp_sb_printf(sb, "\n}\n");
}

#undef INDENT
#undef INDENT2

/* The special token ids, when the config has them, before the closing brace. */
static void put_token_ids(const fsdp_model_config *c, fsdp_sb *sb) {
    sb->len -= 3; /* "\n}\n" */
    if (c->bos_token_id >= 0) put_int(sb, "  ", "bos_token_id", c->bos_token_id);
    if (c->eos_token_id >= 0) put_int(sb, "  ", "eos_token_id", c->eos_token_id);
    if (c->pad_token_id >= 0) put_int(sb, "  ", "pad_token_id", c->pad_token_id);
    fsdp_sb_printf(sb, "\n}\n");
}

int fsdp_hf_config_write(const fsdp_model_config *cfg, char *buf, size_t cap) {
    fsdp_sb sb;
    fsdp_sb_init(&sb);
    if (cfg->family == FSDP_FAMILY_OPT)
        write_opt(cfg, &sb);
    else
        write_llama(cfg, &sb);
    put_token_ids(cfg, &sb);
    int rc = -1;
    if (sb.len < cap && sb.len <= INT_MAX) {
        memcpy(buf, sb.buf, sb.len + 1);
        rc = (int)sb.len;
    }
    fsdp_sb_free(&sb);
    return rc;
}
