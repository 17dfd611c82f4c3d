/* generation_config.json (generation_config.h), through Jansson. */
#include "generation_config.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "jsonio.h"

static int read_eos(const char *path, const json_t *v, fsdp_generation_config *g, fsdp_err *err) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        json_int_t id = json_integer_value(v);
        if (id < 0 || id > INT32_MAX) return fsdp_errf(err, "%s: eos_token_id %lld is not a token id", path, (long long)id);
        g->eos[g->num_eos++] = (int32_t)id;
        return 0;
    }
    if (!json_is_array(v)) return fsdp_errf(err, "%s: eos_token_id must be a token id or a list of them", path);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return fsdp_errf(err, "%s: eos_token_id[%zu] is not a token id", path, i);
        if (g->num_eos == FSDP_MAX_EOS)
            return fsdp_errf(err, "%s: eos_token_id lists more than %d ids", path, FSDP_MAX_EOS);
        g->eos[g->num_eos++] = (int32_t)json_integer_value(e);
    }
    return 0;
}

/* A number field in [lo, hi] (null or absent: not set). */
static int read_number(const char *path, const json_t *obj, const char *key, double lo, double hi, int *has,
                       double *out, fsdp_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < lo || json_number_value(v) > hi)
        return fsdp_errf(err, "%s: %s must be a number in [%g, %g]", path, key, lo, hi);
    *has = 1;
    *out = json_number_value(v);
    return 0;
}

static int read_int(const char *path, const json_t *obj, const char *key, int *has, int *out, fsdp_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return fsdp_errf(err, "%s: %s must be a non-negative integer", path, key);
    *has = 1;
    *out = (int)json_integer_value(v);
    return 0;
}

int fsdp_generation_config_load(const char *path, int eos_only, fsdp_generation_config *g, fsdp_err *err) {
    memset(g, 0, sizeof *g);
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    json_t *root = fsdp_json_load_path(path, err);
    if (!root) return -1;
    int rc = -1;
    if (!json_is_object(root)) {
        fsdp_errf(err, "%s: not a JSON object", path);
        goto done;
    }
    if (read_eos(path, json_object_get(root, "eos_token_id"), g, err)) goto done;
    if (!eos_only) {
        const json_t *ds = json_object_get(root, "do_sample");
        if (ds && !json_is_null(ds)) {
            if (!json_is_boolean(ds)) {
                fsdp_errf(err, "%s: do_sample must be true or false", path);
                goto done;
            }
            g->has_do_sample = 1;
            g->do_sample = json_is_true(ds);
        }
        if (read_number(path, root, "temperature", 0.0, 1e30, &g->has_temperature, &g->temperature, err) ||
            read_int(path, root, "top_k", &g->has_top_k, &g->top_k, err) ||
            read_number(path, root, "top_p", 0.0, 1.0, &g->has_top_p, &g->top_p, err) ||
            read_int(path, root, "max_new_tokens", &g->has_max_new_tokens, &g->max_new_tokens, err))
            goto done;
    }
    rc = 1;
done:
    json_decref(root);
    return rc;
}
