/* config.json <-> fsdp_model_config: the interpreter of the families' field tables (reading and
 * writing), the RoPE fields of transformers 4 and 5, and fsdp_hf_config_load. */
#include "hf_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jsonio.h"

/* What every field reader needs: the object to look in and the names for messages. */
typedef struct {
    const json_t *obj;
    const char *origin;
    const char *prefix; /* "" or "rope_scaling." for nested fields */
    fsdp_err *err;
} fields;

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A number as the file wrote it, near enough for a message: 16.5, 1e+12, 2048 (the shortest
 * decimal that reads back to the same double). */
static const char *number_text(const json_t *v, char *buf, size_t cap) {
    if (json_is_integer(v)) {
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        return buf;
    }
    double x = json_real_value(v);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

static int wrong_type(const fields *f, const char *key, const char *want, const json_t *v) {
    return fsdp_errf(f->err, "%s: %s%s must be %s, not %s", f->origin, f->prefix, key, want, type_name(v));
}

/* A real where an integer belongs. 4.8e1 reads back as 48, so "48 is not an integer" would look
 * wrong: a whole number is shown as 48.0 with what to write instead. */
static int not_integer(const fields *f, const char *key, const json_t *v, const char *want) {
    char num[48];
    double x = json_real_value(v);
    if (x == floor(x) && fabs(x) < 1e15)
        return fsdp_errf(f->err, "%s: %s%s %.1f is a real number, not %s (write %.0f)", f->origin, f->prefix, key, x,
                         want, x);
    return fsdp_errf(f->err, "%s: %s%s %s is not %s", f->origin, f->prefix, key, number_text(v, num, sizeof num), want);
}

/* A member, treating null as absent: transformers falls back to its default for None too. */
static const json_t *member(const fields *f, const char *key) {
    const json_t *v = json_object_get(f->obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* An integer in [1, INT_MAX]. */
static int get_int(const fields *f, const char *key, const json_t *v, int *out) {
    if (json_is_real(v)) return not_integer(f, key, v, "an integer");
    if (!json_is_integer(v)) return wrong_type(f, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < 1 || x > INT_MAX)
        return fsdp_errf(f->err, "%s: %s%s %lld is out of range (1 to %d)", f->origin, f->prefix, key, (long long)x,
                         INT_MAX);
    *out = (int)x;
    return 0;
}

/* A positive number that fits a float. */
static int get_real(const fields *f, const char *key, const json_t *v, float *out) {
    char num[48];
    if (!json_is_number(v)) return wrong_type(f, key, "a number", v);
    double x = json_number_value(v);
    float y = (float)x;
    if (!(x > 0.0) || !isfinite(y) || y == 0.0f)
        return fsdp_errf(f->err, "%s: %s%s %s must be positive (and fit a float)", f->origin, f->prefix, key,
                         number_text(v, num, sizeof num));
    *out = y;
    return 0;
}

/* A probability. */
static int get_rate(const fields *f, const char *key, const json_t *v, float *out) {
    char num[48];
    if (!json_is_number(v)) return wrong_type(f, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= 0.0 && x <= 1.0))
        return fsdp_errf(f->err, "%s: %s%s %s must be a probability in [0, 1]", f->origin, f->prefix, key,
                         number_text(v, num, sizeof num));
    *out = (float)x;
    return 0;
}

/* A token id: a non-negative integer; a list (Llama 3.1's several end-of-sequence ids) gives its
 * first; null or an empty list, none (-1). */
static int get_token_id(const fields *f, const char *key, const json_t *v, int *out) {
    *out = -1;
    if (json_is_array(v)) {
        if (json_array_size(v) == 0) return 0;
        v = json_array_get(v, 0);
    }
    if (json_is_null(v)) return 0;
    if (json_is_real(v)) return not_integer(f, key, v, "an integer token id");
    if (!json_is_integer(v)) return wrong_type(f, key, "a non-negative integer token id", v);
    /* -1 is not "none" to transformers: nn.Embedding's padding_idx -1 is the last row. */
    if (json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return fsdp_errf(f->err, "%s: %s %lld is not a token id (ids are non-negative integers up to %d; null means "
                         "none)", f->origin, key, (long long)json_integer_value(v), INT_MAX);
    *out = (int)json_integer_value(v);
    return 0;
}

/* ---- RoPE: rope_theta and rope_scaling (transformers 4), rope_parameters (5) ---------------------- */

/* partial_rotary_factor (top level or inside the RoPE parameters) rotates part of each head. */
static int check_partial_rotary(const fields *f) {
    const json_t *v = member(f, "partial_rotary_factor");
    char num[48];
    if (!v) return 0;
    if (!json_is_number(v)) return wrong_type(f, "partial_rotary_factor", "a number", v);
    if (json_number_value(v) != 1.0)
        return fsdp_errf(f->err, "%s: %spartial_rotary_factor %s is not supported (fsdp.c rotates whole heads)",
                         f->origin, f->prefix, number_text(v, num, sizeof num));
    return 0;
}

static int required_real(const fields *f, const char *key, float *out) {
    const json_t *v = member(f, key);
    if (!v) return fsdp_errf(f->err, "%s: missing field %s%s", f->origin, f->prefix, key);
    return get_real(f, key, v, out);
}

/* transformers 5 reads rope_scaling first, then rope_parameters; theta inside them wins over the
 * top-level rope_theta; no type means "default"; llama3's original_max_position_embeddings
 * defaults to max_position_embeddings (read before, in every family's table order). */
static int read_rope(const fields *f, const fsdp_hf_field *fd, fsdp_model_config *c) {
    const json_t *scaling = member(f, "rope_scaling"), *params = member(f, "rope_parameters");
    const json_t *rp = scaling ? scaling : params;
    const char *rp_key = scaling ? "rope_scaling" : "rope_parameters";
    c->rope_theta = (float)fd->dflt;
    c->rope_type = FSDP_ROPE_DEFAULT;
    const json_t *theta = member(f, "rope_theta");
    if (theta && get_real(f, "rope_theta", theta, &c->rope_theta)) return -1;
    if (check_partial_rotary(f)) return -1;
    if (!rp) return 0;
    if (!json_is_object(rp)) return wrong_type(f, rp_key, "null or an object", rp);
    fields sub = {rp, f->origin, scaling ? "rope_scaling." : "rope_parameters.", f->err};
    const char *key;
    const json_t *value;
    int others = 0;
    json_object_foreach((json_t *)rp, key, value) {
        if (json_is_object(value))
            return fsdp_errf(f->err, "%s: %s.%s: RoPE parameters per layer type are not supported", f->origin,
                             rp_key, key);
        others += strcmp(key, "rope_theta") && strcmp(key, "partial_rotary_factor");
    }
    theta = member(&sub, "rope_theta");
    if (theta && get_real(&sub, "rope_theta", theta, &c->rope_theta)) return -1;
    if (check_partial_rotary(&sub)) return -1;
    const json_t *type = member(&sub, "rope_type");
    const char *type_key = "rope_type";
    if (!type) type = member(&sub, "type"), type_key = "type";
    if (!type) {
        if (others) return fsdp_errf(f->err, "%s: %s has no rope_type (its other fields would be ignored)", f->origin, rp_key);
        return 0;
    }
    if (!json_is_string(type)) return wrong_type(&sub, type_key, "a string", type);
    const char *name = json_string_value(type);
    if (!strcmp(name, "default")) return 0;
    if (!strcmp(name, "linear")) {
        c->rope_type = FSDP_ROPE_LINEAR;
        return required_real(&sub, "factor", &c->rope_factor);
    }
    if (strcmp(name, "llama3"))
        return fsdp_errf(f->err, "%s: %s%s '%s' is not supported (default, linear, llama3)", f->origin, sub.prefix,
                         type_key, name);
    c->rope_type = FSDP_ROPE_LLAMA3;
    if (required_real(&sub, "factor", &c->rope_factor) ||
        required_real(&sub, "low_freq_factor", &c->rope_low_freq_factor) ||
        required_real(&sub, "high_freq_factor", &c->rope_high_freq_factor))
        return -1;
    const json_t *orig = member(&sub, "original_max_position_embeddings");
    c->rope_original_max_position = c->max_position_embeddings;
    return orig ? get_int(&sub, "original_max_position_embeddings", orig, &c->rope_original_max_position) : 0;
}

/* ---- one table entry ------------------------------------------------------------------------------ */

static void *field_at(fsdp_model_config *c, const fsdp_hf_field *fd) { return (char *)c + fd->offset; }

static int refuse(const fields *f, const fsdp_hf_field *fd, const char *value) {
    return fsdp_errf(f->err, "%s: %s %s is not supported (%s)", f->origin, fd->key, value, fd->why);
}

static int read_field(const fields *f, const fsdp_hf_field *fd, fsdp_model_config *c) {
    const json_t *raw = json_object_get(f->obj, fd->key);
    const json_t *v = member(f, fd->key);
    char num[48];
    switch (fd->kind) {
    case FSDP_HF_INT:
        if (v) return get_int(f, fd->key, v, field_at(c, fd));
        if (raw && (fd->flags & FSDP_HF_NULL_DERIVES)) {
            *(int *)field_at(c, fd) = 0;
            return 0;
        }
        if (fd->flags & FSDP_HF_REQUIRED)
            return fsdp_errf(f->err, "%s: missing field %s (transformers would default it to %.0f)", f->origin,
                             fd->key, fd->dflt);
        *(int *)field_at(c, fd) = (int)fd->dflt;
        return 0;
    case FSDP_HF_REAL:
        if (v) return get_real(f, fd->key, v, field_at(c, fd));
        *(float *)field_at(c, fd) = (float)fd->dflt;
        return 0;
    case FSDP_HF_RATE:
        if (v) return get_rate(f, fd->key, v, field_at(c, fd));
        *(float *)field_at(c, fd) = (float)fd->dflt;
        return 0;
    case FSDP_HF_BOOL:
    case FSDP_HF_BIASES: {
        if (v && !json_is_boolean(v)) return wrong_type(f, fd->key, "true or false", v);
        int b = v ? json_is_true(v) : fd->dflt != 0;
        if (fd->kind == FSDP_HF_BOOL)
            *(int *)field_at(c, fd) = b;
        else
            c->biases = b ? c->biases | fd->bits : c->biases & ~fd->bits;
        return 0;
    }
    case FSDP_HF_TOKEN_ID:
        if (raw) return get_token_id(f, fd->key, raw, field_at(c, fd));
        *(int *)field_at(c, fd) = (int)fd->dflt;
        return 0;
    case FSDP_HF_ROPE: return read_rope(f, fd, c);
    case FSDP_HF_ONLY_BOOL:
        if (!v) return 0;
        if (!json_is_boolean(v)) return wrong_type(f, fd->key, "true or false", v);
        return json_is_true(v) == (fd->dflt != 0) ? 0 : refuse(f, fd, json_is_true(v) ? "true" : "false");
    case FSDP_HF_ONLY_NUMBER:
        if (!v) return 0;
        if (!json_is_number(v)) return wrong_type(f, fd->key, "a number", v);
        return json_number_value(v) == fd->dflt ? 0 : refuse(f, fd, number_text(v, num, sizeof num));
    case FSDP_HF_ONLY_STRING:
        if (!v) return 0;
        if (!json_is_string(v)) return wrong_type(f, fd->key, "a string", v);
        if (strcmp(json_string_value(v), fd->text))
            return fsdp_errf(f->err, "%s: %s '%s' is not supported (only '%s': %s)", f->origin, fd->key,
                             json_string_value(v), fd->text, fd->why);
        return 0;
    case FSDP_HF_ONLY_STRINGS: {
        if (!v) return 0;
        if (!json_is_array(v)) return wrong_type(f, fd->key, "a list", v);
        size_t i;
        const json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s)) return wrong_type(f, fd->key, "a list of strings", v);
            if (strcmp(json_string_value(s), fd->text))
                return fsdp_errf(f->err, "%s: %s[%zu] '%s' is not supported (%s)", f->origin, fd->key, i,
                                 json_string_value(s), fd->why);
        }
        return 0;
    }
    case FSDP_HF_SAME_AS: {
        if (!v) return 0;
        int x, want = *(int *)field_at(c, fd);
        if (get_int(f, fd->key, v, &x)) return -1;
        if (x != want)
            return fsdp_errf(f->err, "%s: %s %d is not supported (%s %d)", f->origin, fd->key, x, fd->why, want);
        return 0;
    }
    case FSDP_HF_IGNORED: return 0;
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------------ */

/* "llama models/x/config.json", keeping the end of a long path since that is the telling part. */
static void set_name(fsdp_model_config *c, const char *model_type, const char *origin) {
    size_t cap = sizeof c->name, used = (size_t)snprintf(c->name, cap, "%s ", model_type), n = strlen(origin);
    if (used + 4 >= cap) return; /* model_types are short */
    size_t room = cap - 1 - used;
    if (n > room) {
        memcpy(c->name + used, "...", 3);
        used += 3;
        origin += n - (room - 3);
    }
    snprintf(c->name + used, cap - used, "%s", origin);
}

/* The model's own checks prefix their messages with the config's name; ours name the file. */
static int derive_and_validate(fsdp_model_config *c, const char *origin, fsdp_err *err) {
    fsdp_err inner = {0};
    c->name[0] = 0;
    if (fsdp_model_config_derive(c, &inner) == 0 && fsdp_model_config_validate(c, &inner) == 0) return 0;
    const char *msg = inner.msg;
    if (!strncmp(msg, "model: ", 7)) msg += 7;
    return fsdp_errf(err, "%s: %s", origin, msg);
}

int fsdp_hf_config_from_json(const json_t *root, const char *origin, fsdp_model_config *out, fsdp_err *err) {
    if (!json_is_object(root)) return fsdp_errf(err, "%s: expected a JSON object, found %s", origin, type_name(root));
    fields f = {root, origin, "", err};
    const json_t *mt = member(&f, "model_type");
    if (!mt) return fsdp_errf(err, "%s: missing field model_type", origin);
    if (!json_is_string(mt)) return wrong_type(&f, "model_type", "a string", mt);
    const fsdp_family *fam = fsdp_family_find(json_string_value(mt));
    if (!fam)
        return fsdp_errf(err, "%s: model_type '%s' is not supported (%s)", origin, json_string_value(mt),
                         fsdp_family_names());
    fsdp_model_config c;
    memset(&c, 0, sizeof c);
    c.family = fam;
    c.biases = fam->biases;
    c.norm_eps = fam->norm_eps;
    for (const fsdp_hf_field *fd = fam->fields; fd->key; fd++)
        if (read_field(&f, fd, &c)) return -1;
    if (derive_and_validate(&c, origin, err)) return -1;
    set_name(&c, fam->model_type, origin);
    *out = c;
    return 0;
}

int fsdp_hf_config_parse(const char *text, size_t len, const char *origin, fsdp_model_config *out, fsdp_err *err) {
    json_t *root = fsdp_json_load_text(text, len, origin, err);
    if (!root) return -1;
    int rc = fsdp_hf_config_from_json(root, origin, out, err);
    json_decref(root);
    return rc;
}

int fsdp_hf_config_load(const char *path, fsdp_model_config *out, fsdp_err *err) {
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (snprintf(file, sizeof file, "%s/config.json", path) >= (int)sizeof file)
            return fsdp_errf(err, "%s: path too long", path);
    } else if (snprintf(file, sizeof file, "%s", path) >= (int)sizeof file) {
        return fsdp_errf(err, "%s: path too long", path);
    }
    json_t *root = fsdp_json_load_path(file, err);
    if (!root) return -1;
    int rc = fsdp_hf_config_from_json(root, file, out, err);
    json_decref(root);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static void put(json_t *obj, const char *key, json_t *v) {
    if (!v || json_object_set_new(obj, key, v)) fsdp_fatal("out of host memory writing config.json");
}

static json_t *rope_scaling(const fsdp_model_config *c) {
    json_t *o;
    switch (c->rope_type) {
    case FSDP_ROPE_LINEAR:
        o = json_object();
        put(o, "rope_type", json_string("linear"));
        put(o, "factor", fsdp_json_float(c->rope_factor));
        return o;
    case FSDP_ROPE_LLAMA3:
        o = json_object();
        put(o, "rope_type", json_string("llama3"));
        put(o, "factor", fsdp_json_float(c->rope_factor));
        put(o, "low_freq_factor", fsdp_json_float(c->rope_low_freq_factor));
        put(o, "high_freq_factor", fsdp_json_float(c->rope_high_freq_factor));
        put(o, "original_max_position_embeddings", json_integer(c->rope_original_max_position));
        return o;
    default: return json_null();
    }
}

json_t *fsdp_hf_config_json(const fsdp_model_config *c) {
    const fsdp_family *fam = c->family;
    json_t *o = json_object();
    if (!o) fsdp_fatal("out of host memory writing config.json");
    json_t *arch = json_array();
    if (!arch || json_array_append_new(arch, json_string(fam->architecture)))
        fsdp_fatal("out of host memory writing config.json");
    put(o, "architectures", arch);
    put(o, "model_type", json_string(fam->model_type));
    put(o, "torch_dtype", json_string("float32"));
    fsdp_model_config *cc = (fsdp_model_config *)c; /* field_at only reads here */
    for (const fsdp_hf_field *fd = fam->fields; fd->key; fd++) {
        if (fd->flags & FSDP_HF_UNWRITTEN) continue;
        switch (fd->kind) {
        case FSDP_HF_INT: {
            /* 0 is what a null read into a field that is not derived afterwards (sliding_window) */
            int v = *(int *)field_at(cc, fd);
            put(o, fd->key, v == 0 && (fd->flags & FSDP_HF_NULL_DERIVES) ? json_null() : json_integer(v));
            break;
        }
        case FSDP_HF_SAME_AS: put(o, fd->key, json_integer(*(int *)field_at(cc, fd))); break;
        case FSDP_HF_REAL:
        case FSDP_HF_RATE: put(o, fd->key, fsdp_json_float(*(float *)field_at(cc, fd))); break;
        case FSDP_HF_BOOL: put(o, fd->key, json_boolean(*(int *)field_at(cc, fd))); break;
        case FSDP_HF_BIASES: put(o, fd->key, json_boolean((c->biases & fd->bits) == fd->bits)); break;
        case FSDP_HF_TOKEN_ID: {
            int id = *(int *)field_at(cc, fd);
            put(o, fd->key, id >= 0 ? json_integer(id) : json_null());
            break;
        }
        case FSDP_HF_ROPE:
            put(o, "rope_theta", fsdp_json_float(c->rope_theta));
            put(o, "rope_scaling", rope_scaling(c));
            break;
        case FSDP_HF_ONLY_BOOL: put(o, fd->key, json_boolean(fd->dflt != 0)); break;
        case FSDP_HF_ONLY_NUMBER: put(o, fd->key, json_real(fd->dflt)); break;
        case FSDP_HF_ONLY_STRING: put(o, fd->key, json_string(fd->text)); break;
        case FSDP_HF_ONLY_STRINGS:
        case FSDP_HF_IGNORED: break;
        }
    }
    return o;
}

int fsdp_hf_config_write(const fsdp_model_config *cfg, char *buf, size_t cap) {
    json_t *o = fsdp_hf_config_json(cfg);
    /* 9 significant digits print every float-valued field as its shortest decimal (fsdp_json_float). */
    char *text = fsdp_json_text(o, 2, 9);
    json_decref(o);
    if (!text) fsdp_fatal("out of host memory writing config.json");
    size_t n = strlen(text);
    int rc = -1;
    if (n + 1 < cap && n + 1 <= INT_MAX) {
        memcpy(buf, text, n);
        buf[n] = '\n';
        buf[n + 1] = 0;
        rc = (int)(n + 1);
    }
    free(text);
    return rc;
}
