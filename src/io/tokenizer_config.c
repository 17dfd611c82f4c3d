/* tokenizer_config.json of tokenizer_config.h, over Jansson (numbers read as reals: model_max_length
 * may be 1e30, beyond Jansson's integers). */
#include "tokenizer_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/files.h"
#include "jsonio.h"

int fsdp_tokenizer_files(const char *arg, char *json, size_t json_cap, char *config, size_t config_cap,
                         fsdp_err *err) {
    struct stat st;
    int is_dir = stat(arg, &st) == 0 && S_ISDIR(st.st_mode);
    char folder[4200];
    if (is_dir) {
        snprintf(folder, sizeof folder, "%s", arg);
        if ((size_t)snprintf(json, json_cap, "%s/tokenizer.json", arg) >= json_cap)
            return fsdp_errf(err, "--tokenizer %s: the path is too long", arg);
        if (stat(json, &st) != 0)
            return fsdp_errf(err, "--tokenizer %s is a directory without a tokenizer.json", arg);
    } else {
        if ((size_t)snprintf(json, json_cap, "%s", arg) >= json_cap)
            return fsdp_errf(err, "--tokenizer %s: the path is too long", arg);
        const char *slash = strrchr(arg, '/');
        if (slash) snprintf(folder, sizeof folder, "%.*s", (int)(slash - arg), arg);
        else snprintf(folder, sizeof folder, ".");
        if (slash == arg) snprintf(folder, sizeof folder, "/");
    }
    config[0] = 0;
    char candidate[4300];
    snprintf(candidate, sizeof candidate, "%s/tokenizer_config.json", folder);
    if (stat(candidate, &st) == 0 || errno != ENOENT) {
        if ((size_t)snprintf(config, config_cap, "%s", candidate) >= config_cap)
            return fsdp_errf(err, "%s: the path is too long", candidate);
    }
    return 0;
}

typedef struct {
    const char *file;
    fsdp_err *err;
} ctx;

static int flag(const ctx *c, const json_t *o, const char *key, const char *what, int dflt, int *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return *out = dflt, 0;
    if (!json_is_boolean(v)) return fsdp_errf(c->err, "%s: %s.%s must be true or false", c->file, what, key);
    *out = json_is_true(v);
    return 0;
}

static void set_str(fsdp_tj_str *s, const json_t *v) {
    s->n = json_string_length(v);
    s->s = fsdp_xmalloc(s->n + 1, "tokenizer_config string");
    memcpy(s->s, json_string_value(v), s->n);
    s->s[s->n] = 0;
}

/* A token: "text", {"content": "text", "lstrip": ..., ...} (AddedToken, "__type" or not) or null. */
static int token(const ctx *c, const json_t *v, const char *what, fsdp_tc_token *t) {
    memset(t, 0, sizeof *t);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        t->named = 1;
        set_str(&t->content, v);
        return 0;
    }
    const json_t *content = json_is_object(v) ? json_object_get(v, "content") : NULL;
    if (!json_is_string(content))
        return fsdp_errf(c->err, "%s: %s must be a string, an AddedToken object with a \"content\" string, or null",
                         c->file, what);
    t->named = t->has_flags = 1;
    set_str(&t->content, content);
    /* AddedToken's defaults: normalized is !special */
    if (flag(c, v, "single_word", what, 0, &t->single_word) || flag(c, v, "lstrip", what, 0, &t->lstrip) ||
        flag(c, v, "rstrip", what, 0, &t->rstrip) || flag(c, v, "special", what, 0, &t->special) ||
        flag(c, v, "normalized", what, !t->special, &t->normalized))
        return -1;
    return 0;
}

static void token_free(fsdp_tc_token *t) {
    free(t->content.s);
    memset(t, 0, sizeof *t);
}

static int read_config(const ctx *c, const json_t *root, fsdp_tokenizer_config *cfg) {
    if (!json_is_object(root)) return fsdp_errf(c->err, "%s: the top level is not an object", c->file);
    const json_t *v;
    /* a key given as null still counts as given (transformers tests `"add_bos_token" in kwargs`): false */
    if ((v = json_object_get(root, "add_bos_token"))) {
        if (!json_is_boolean(v) && !json_is_null(v))
            return fsdp_errf(c->err, "%s: add_bos_token must be true or false", c->file);
        cfg->has_add_bos = 1, cfg->add_bos = json_is_true(v);
    }
    if ((v = json_object_get(root, "add_eos_token"))) {
        if (!json_is_boolean(v) && !json_is_null(v))
            return fsdp_errf(c->err, "%s: add_eos_token must be true or false", c->file);
        cfg->has_add_eos = 1, cfg->add_eos = json_is_true(v);
    }
    static const char *const names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    fsdp_tc_token *slots[] = {&cfg->bos, &cfg->eos, &cfg->pad, &cfg->unk};
    for (int i = 0; i < 4; i++)
        if (token(c, json_object_get(root, names[i]), names[i], slots[i])) return -1;
    if ((v = json_object_get(root, "additional_special_tokens")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return fsdp_errf(c->err, "%s: additional_special_tokens must be an array", c->file);
        cfg->extra = fsdp_xcalloc(json_array_size(v) + 1, sizeof *cfg->extra, "additional_special_tokens");
        for (size_t i = 0; i < json_array_size(v); i++) {
            char what[64];
            snprintf(what, sizeof what, "additional_special_tokens[%zu]", i);
            if (token(c, json_array_get(v, i), what, &cfg->extra[cfg->num_extra])) return -1;
            if (!cfg->extra[cfg->num_extra].named)
                return fsdp_errf(c->err, "%s: %s must not be null", c->file, what);
            cfg->num_extra++;
        }
    }
    /* transformers 5's extra_special_tokens: a list, or names -> tokens (Gemma 3's boi_token, ...) */
    if ((v = json_object_get(root, "extra_special_tokens")) && !json_is_null(v)) {
        if (!json_is_array(v) && !json_is_object(v))
            return fsdp_errf(c->err, "%s: extra_special_tokens must be an array or an object", c->file);
        size_t n = json_is_array(v) ? json_array_size(v) : json_object_size(v);
        cfg->extra = realloc(cfg->extra, ((size_t)cfg->num_extra + n + 1) * sizeof *cfg->extra);
        if (!cfg->extra) fsdp_fatal("out of host memory reading %s", c->file);
        const char *key;
        const json_t *t;
        size_t i = 0;
        void *it = json_is_object(v) ? json_object_iter((json_t *)v) : NULL;
        for (; i < n; i++) {
            t = json_is_array(v) ? json_array_get(v, i) : json_object_iter_value(it);
            key = json_is_array(v) ? NULL : json_object_iter_key(it);
            if (it) it = json_object_iter_next((json_t *)v, it);
            char what[128];
            if (key) snprintf(what, sizeof what, "extra_special_tokens.%.60s", key);
            else snprintf(what, sizeof what, "extra_special_tokens[%zu]", i);
            if (token(c, t, what, &cfg->extra[cfg->num_extra])) return -1;
            if (cfg->extra[cfg->num_extra].named) cfg->num_extra++;
        }
    }
    if ((v = json_object_get(root, "added_tokens_decoder")) && !json_is_null(v)) {
        if (!json_is_object(v)) return fsdp_errf(c->err, "%s: added_tokens_decoder must be an object", c->file);
        cfg->decoder = fsdp_xcalloc(json_object_size(v) + 1, sizeof *cfg->decoder, "added_tokens_decoder");
        const char *key;
        const json_t *t;
        json_object_foreach((json_t *)v, key, t) {
            char what[128], *end;
            snprintf(what, sizeof what, "added_tokens_decoder[\"%.60s\"]", key);
            errno = 0;
            unsigned long id = strtoul(key, &end, 10);
            if (!*key || *end || errno || id > INT32_MAX)
                return fsdp_errf(c->err, "%s: %s: the key must be a token id", c->file, what);
            fsdp_tc_decoder_entry *e = &cfg->decoder[cfg->num_decoder];
            e->id = (uint32_t)id;
            if (token(c, t, what, &e->token)) return -1;
            if (!e->token.has_flags) return fsdp_errf(c->err, "%s: %s must be an AddedToken object", c->file, what);
            cfg->num_decoder++;
        }
    }
    if ((v = json_object_get(root, "model_max_length")) && !json_is_null(v)) {
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x >= 1) || x != floor(x))
            return fsdp_errf(c->err, "%s: model_max_length must be a positive integer", c->file);
        /* transformers writes "no limit" as int(1e30) */
        cfg->model_max_length = x >= 1e18 ? 0 : (uint64_t)x;
    }
    v = json_object_get(root, "chat_template");
    cfg->has_chat_template = v && !json_is_null(v);
    return 0;
}

int fsdp_tokenizer_config_load(const char *path, fsdp_tokenizer_config *cfg, fsdp_err *err) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
    json_t *root = fsdp_json_load_path_reals(path, err);
    if (!root) return -1;
    ctx c = {path, err};
    int rc = read_config(&c, root, cfg);
    json_decref(root);
    if (rc) fsdp_tokenizer_config_free(cfg);
    return rc;
}

void fsdp_tokenizer_config_free(fsdp_tokenizer_config *c) {
    token_free(&c->bos), token_free(&c->eos), token_free(&c->pad), token_free(&c->unk);
    for (int i = 0; i < c->num_extra; i++) token_free(&c->extra[i]);
    free(c->extra);
    for (int i = 0; i < c->num_decoder; i++) token_free(&c->decoder[i].token);
    free(c->decoder);
    memset(c, 0, sizeof *c);
}
