/* The identity record of checkpoints (run_identity.h): building it from this run, comparing it on
 * --resume, checking it against the checkpoint's own config in fsdp verify. */
#include "run_identity.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"
#include "../io/hf_config.h"
#include "../io/jsonio.h"

/* Reals are float-valued fields written as their shortest decimal (fsdp_json_float): 9 digits give
 * that decimal back, so the record reads as config.json does and parses to the same values. */
#define PRECISION 9

/* Fields stored in fsdp_model_config that change what a step computes without changing a shape.
 * Not listed: initializer_range (initial weights only), bos_token_id (no training use),
 * activation_dropout (transformers' OPT never applies it), max_position_embeddings (a bound on
 * --seq, or for learned positions a shape). RoPE is its own kind of field (theta and scaling). */
static const size_t MATHS[] = {offsetof(fsdp_model_config, norm_eps), offsetof(fsdp_model_config, dropout),
                               offsetof(fsdp_model_config, attention_dropout),
                               offsetof(fsdp_model_config, eos_token_id), offsetof(fsdp_model_config, pad_token_id)};

static int changes_maths(const fsdp_hf_field *fd) {
    if (fd->flags & FSDP_HF_UNWRITTEN) return 0;
    /* Mistral's attention window: an integer that changes what attention sees, not a shape. */
    if (fd->kind == FSDP_HF_INT && fd->offset == offsetof(fsdp_model_config, sliding_window)) return 1;
    if (fd->kind != FSDP_HF_REAL && fd->kind != FSDP_HF_RATE && fd->kind != FSDP_HF_TOKEN_ID) return 0;
    for (size_t i = 0; i < sizeof MATHS / sizeof MATHS[0]; i++)
        if (fd->offset == MATHS[i]) return 1;
    return 0;
}

static void put(json_t *obj, const char *key, json_t *v) {
    if (!v || json_object_set(obj, key, v)) fsdp_fatal("out of host memory building the checkpoint's identity");
}

/* The config part: those fields as config.json writes them. */
static json_t *config_record(const fsdp_model_config *cfg) {
    json_t *full = fsdp_hf_config_json(cfg), *out = json_object();
    if (!out) fsdp_fatal("out of host memory building the checkpoint's identity");
    for (const fsdp_hf_field *fd = cfg->family->fields; fd->key; fd++) {
        if (fd->kind == FSDP_HF_ROPE) {
            put(out, "rope_theta", json_object_get(full, "rope_theta"));
            put(out, "rope_scaling", json_object_get(full, "rope_scaling"));
        } else if (changes_maths(fd)) {
            put(out, fd->key, json_object_get(full, fd->key));
        }
    }
    json_decref(full);
    return out;
}

static json_t *data_record(const fsdp_data_identity *id) {
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, id->tokenizer_hash);
    json_t *v = id->synthetic ? json_pack("{s:s, s:I}", "source", "synthetic", "vocab_size", (json_int_t)id->vocab_size)
                              : json_pack("{s:s, s:s, s:I}", "source", "token file", "tokenizer_hash", hash,
                                          "vocab_size", (json_int_t)id->vocab_size);
    if (!v) fsdp_fatal("out of host memory building the checkpoint's identity");
    return v;
}

char *fsdp_identity_text(const fsdp_model_config *cfg, const fsdp_data *data) {
    fsdp_data_identity id = fsdp_data_identity_of(data);
    json_t *r = json_object(), *d = data_record(&id);
    /* Where the token file's tokenizer was, for `fsdp export` to find it again (not compared on
     * resume: the hash is the identity; a path that is not UTF-8 is left out). */
    json_t *where = !data->synthetic && data->file.tokenizer_path[0] ? json_string(data->file.tokenizer_path) : NULL;
    if (where) json_object_set_new(d, "tokenizer", where);
    if (!r || json_object_set_new(r, "data", d) || json_object_set_new(r, "config", config_record(cfg)))
        fsdp_fatal("out of host memory building the checkpoint's identity");
    char *text = fsdp_json_text(r, 0, PRECISION);
    json_decref(r);
    if (!text) fsdp_fatal("out of host memory building the checkpoint's identity");
    return text;
}

/* ---- reading a record (its form was checked by the checkpoint reader) ------------------------------ */

static fsdp_data_identity data_of(const json_t *record) {
    const json_t *d = json_object_get(record, "data");
    const char *hash = json_string_value(json_object_get(d, "tokenizer_hash"));
    const char *source = json_string_value(json_object_get(d, "source"));
    fsdp_data_identity id = {source && !strcmp(source, "synthetic"), hash ? strtoull(hash, NULL, 16) : 0,
                             (uint64_t)json_integer_value(json_object_get(d, "vocab_size"))};
    return id;
}

static void describe_data(const fsdp_data_identity *id, char *buf, size_t cap) {
    if (id->synthetic)
        snprintf(buf, cap, "synthetic tokens (vocabulary %" PRIu64 ")", id->vocab_size);
    else if (id->tokenizer_hash)
        snprintf(buf, cap, "tokens of tokenizer %016" PRIx64 " (vocabulary %" PRIu64 ")", id->tokenizer_hash,
                 id->vocab_size);
    else
        snprintf(buf, cap, "tokens of an unrecorded tokenizer (vocabulary %" PRIu64 ")", id->vocab_size);
}

/* A value as config.json writes it (a bare number, null, or an object on one line); malloc'ed. */
static char *value_text(const json_t *v) {
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(PRECISION));
}

/* Appends to buf: sep, then `fmt` with the key and the values' texts. */
static void append_field(char *buf, size_t cap, const char *sep, const char *fmt, const char *key, const json_t *a,
                         const json_t *b) {
    char *ta = value_text(a), *tb = b ? value_text(b) : NULL;
    if (!ta || (b && !tb)) fsdp_fatal("out of host memory describing the checkpoint's identity");
    size_t used = strlen(buf);
    if (used < cap) snprintf(buf + used, cap - used, "%s", sep);
    used = strlen(buf);
    if (used < cap) snprintf(buf + used, cap - used, fmt, key, ta, tb ? tb : "");
    free(ta);
    free(tb);
}

static json_t *parse(const char *path, const char *saved, fsdp_err *err) {
    json_t *r = fsdp_json_load_text(saved, strlen(saved), path, err);
    if (r && !json_is_object(json_object_get(r, "config"))) {
        fsdp_errf(err, "checkpoint %s: attribute 'identity' has no \"config\" object", path);
        json_decref(r);
        return NULL;
    }
    return r;
}

/* ---- --resume ------------------------------------------------------------------------------------------- */

static int check_data(const fsdp_identity_resume *r, const json_t *record, fsdp_err *err) {
    fsdp_data_identity was = data_of(record), now = fsdp_data_identity_of(r->data);
    if (!fsdp_data_identity_differs(&was, &now)) return 0;
    char before[160], after[160];
    describe_data(&was, before, sizeof before);
    describe_data(&now, after, sizeof after);
    if (r->allow_data_change) {
        fsdp_warn("--allow-data-change: %s was trained on %s; the run continues on --data %s, %s, as a fine-tune on "
                  "new data", r->path, before, r->data_flag, after);
        return 0;
    }
    return fsdp_errf(err,
                     "--resume %s was trained on %s, but --data %s holds %s: the same ids would mean other words to "
                     "the trained model; pass --allow-data-change if continuing on this data is meant (a fine-tune "
                     "on new data)",
                     r->path, before, r->data_flag, after);
}

static int check_config(const fsdp_identity_resume *r, const json_t *record, fsdp_err *err) {
    const json_t *was = json_object_get(record, "config");
    json_t *now = config_record(r->cfg);
    char changes[700] = "";
    int n = 0;
    const char *key;
    const json_t *old;
    /* A field the record has and this build does not know cannot be compared (a newer writer). */
    json_object_foreach((json_t *)was, key, old) {
        const json_t *cur = json_object_get(now, key);
        if (!cur || json_equal((json_t *)old, (json_t *)cur)) continue;
        append_field(changes, sizeof changes, n++ ? "; " : "", "%s %s in the checkpoint, %s now", key, old, cur);
    }
    json_decref(now);
    if (n == 0) return 0;
    if (r->allow_config_change) {
        fsdp_warn("--allow-config-change: %s continues under other values of fields that change the computation: %s",
                  r->path, changes);
        return 0;
    }
    return fsdp_errf(err,
                     "--resume %s: --model %s changes %s that change%s the computation the weights were trained "
                     "under: %s; pass --allow-config-change if the change is meant",
                     r->path, r->model, n == 1 ? "a config field" : "config fields", n == 1 ? "s" : "", changes);
}

int fsdp_identity_check_resume(const fsdp_identity_resume *r, const char *saved, fsdp_err *err) {
    if (!saved) {
        fsdp_warn("--resume %s: the checkpoint records no identity of its data and config (written before checkpoints "
                  "carried one): neither could be checked against this run", r->path);
        return 0;
    }
    json_t *record = parse(r->path, saved, err);
    if (!record) return -1;
    int rc = check_data(r, record, err) || check_config(r, record, err) ? -1 : 0;
    json_decref(record);
    return rc;
}

void fsdp_identity_note_eval(const char *path, const char *saved, const fsdp_data *data, const char *data_flag) {
    if (!saved) return;
    fsdp_err ignored = {0};
    json_t *record = parse(path, saved, &ignored);
    if (!record) return;
    fsdp_data_identity was = data_of(record), now = fsdp_data_identity_of(data);
    json_decref(record);
    if (!fsdp_data_identity_differs(&was, &now)) return;
    char before[160], after[160];
    describe_data(&was, before, sizeof before);
    describe_data(&now, after, sizeof after);
    fsdp_warn("--checkpoint %s was trained on %s, but --data %s holds %s: the same ids mean other words to it, so "
              "this loss does not measure the model on this text",
              path, before, data_flag, after);
}

/* ---- fsdp verify ------------------------------------------------------------------------------------------ */

int fsdp_identity_verify(const char *path, const char *saved, const fsdp_model_config *cfg, char *desc, size_t cap,
                         fsdp_err *err) {
    if (!saved) {
        snprintf(desc, cap, "no record of what trained it (written before checkpoints carried one)");
        return 0;
    }
    json_t *record = parse(path, saved, err);
    if (!record) return -1;
    json_t *own = config_record(cfg);
    const json_t *was = json_object_get(record, "config");
    fsdp_data_identity id = data_of(record);
    char data[160], fields[600] = "";
    describe_data(&id, data, sizeof data);
    int rc = 0, n = 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)was, key, v) {
        const json_t *cur = json_object_get(own, key);
        if (cur && !json_equal((json_t *)v, (json_t *)cur)) {
            char both[400] = "";
            append_field(both, sizeof both, "", "%s %s, but its config says %s", key, v, cur);
            rc = fsdp_errf(err, "checkpoint %s: attribute 'identity' says %s: changed after the file was written", path,
                           both);
            break;
        }
        append_field(fields, sizeof fields, n++ ? ", " : "", "%s %s%s", key, v, NULL);
    }
    if (rc == 0) snprintf(desc, cap, "trained on %s under %s", data, n ? fields : "no recorded config field");
    json_decref(own);
    json_decref(record);
    return rc;
}
