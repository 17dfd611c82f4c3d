/* The exported tokenizer files of tokenizer_export.h. */
#include "tokenizer_export.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"
#include "hf_model_dir.h"
#include "jsonio.h"
#include "safetensors_write.h"
#include "special_tokens.h"
#include "tokenizer_config.h"

const char *const FSDP_TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", NULL};

/* The bytes of a regular file (malloc'ed), or NULL with err. */
static char *read_file(const char *path, size_t *len, fsdp_err *err) {
    int fd = fsdp_open_regular(path, O_RDONLY, 0, "--tokenizer", err);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = fsdp_xmalloc(cap, "tokenizer file");
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *more = realloc(buf, cap);
            if (!more) fsdp_fatal("out of host memory reading %s", path);
            buf = more;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fsdp_errf(err, "%s: read: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    *len = n;
    return buf;
}

static int copy_in(const char *staging, const char *name, const char *from, fsdp_err *err) {
    size_t n;
    char *bytes = read_file(from, &n, err);
    if (!bytes) return -1;
    int rc = fsdp_write_file_tmp(staging, name, bytes, n, err);
    free(bytes);
    return rc;
}

static const fsdp_tj_added_token *added_of(const fsdp_tokenizer_spec *spec, uint32_t id) {
    for (int i = 0; i < spec->num_added; i++)
        if (spec->added[i].id == id) return &spec->added[i];
    return NULL;
}

/* An AddedToken object as transformers writes it; `typed` adds its "__type" (tokenizer_config.json). */
static json_t *added_token_json(const fsdp_tj_added_token *a, int typed) {
    json_t *o = json_object();
    if (typed) json_object_set_new(o, "__type", json_string("AddedToken"));
    json_object_set_new(o, "content", json_stringn(a->content.s, a->content.n));
    json_object_set_new(o, "lstrip", json_boolean(a->lstrip));
    json_object_set_new(o, "normalized", json_boolean(a->normalized));
    json_object_set_new(o, "rstrip", json_boolean(a->rstrip));
    json_object_set_new(o, "single_word", json_boolean(a->single_word));
    json_object_set_new(o, "special", json_true());
    return o;
}

int fsdp_tokenizer_stage(const char *staging, const char *arg, const fsdp_model_config *cfg, fsdp_err *err) {
    char json[4300], config[4300];
    if (fsdp_tokenizer_files(arg, json, sizeof json, config, sizeof config, err)) return -1;
    fsdp_tokenizer_spec spec;
    fsdp_special_tokens special;
    if (fsdp_tokenizer_spec_load_with_config(arg, &spec, &special, err)) return -1;
    uint32_t top = spec.vocab_size;
    for (int i = 0; i < spec.num_added; i++)
        if (spec.added[i].id + 1 > top) top = spec.added[i].id + 1;
    int rc = 0;
    if (top > (uint32_t)cfg->vocab_size)
        rc = fsdp_usagef(err, "--tokenizer %s has ids up to %u, beyond the model's vocabulary of %d", arg, top - 1,
                         cfg->vocab_size);
    if (rc == 0) rc = copy_in(staging, "tokenizer.json", json, err);

    /* the special tokens: those the config names, else the model's ids that are added tokens */
    const fsdp_tj_added_token *tokens[FSDP_SPECIAL_COUNT] = {0};
    static const char *const KEYS[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int model_ids[FSDP_SPECIAL_COUNT] = {cfg->bos_token_id, cfg->eos_token_id, cfg->pad_token_id, -1};
    uint32_t unk_id;
    for (int k = 0; k < FSDP_SPECIAL_COUNT; k++) {
        if (config[0]) {
            if (special.has[k]) tokens[k] = added_of(&spec, special.id[k]);
        } else if (model_ids[k] >= 0) {
            tokens[k] = added_of(&spec, (uint32_t)model_ids[k]);
        }
    }
    if (!config[0] && spec.unk_token.s) {
        for (uint32_t i = 0; i < spec.vocab_size && !tokens[FSDP_SPECIAL_UNK]; i++)
            if (spec.vocab[i].s && spec.vocab[i].n == spec.unk_token.n &&
                !memcmp(spec.vocab[i].s, spec.unk_token.s, spec.unk_token.n) && (unk_id = i, 1))
                tokens[FSDP_SPECIAL_UNK] = added_of(&spec, unk_id);
    }
    if (rc == 0 && config[0]) {
        rc = copy_in(staging, "tokenizer_config.json", config, err);
    } else if (rc == 0) {
        json_t *c = json_object();
        json_object_set_new(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
        json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
        if (cfg->max_position_embeddings > 0)
            json_object_set_new(c, "model_max_length", json_integer(cfg->max_position_embeddings));
        for (int k = 0; k < FSDP_SPECIAL_COUNT; k++)
            if (tokens[k]) json_object_set_new(c, KEYS[k], added_token_json(tokens[k], 1));
        rc = fsdp_hf_write_json_tmp(staging, "tokenizer_config.json", c, 17, err);
        json_decref(c);
    }
    char map[4400];
    snprintf(map, sizeof map, "%.*s/special_tokens_map.json", (int)(strrchr(json, '/') ? strrchr(json, '/') - json : 1),
             strrchr(json, '/') ? json : ".");
    struct stat st;
    if (rc == 0 && stat(map, &st) == 0) {
        rc = copy_in(staging, "special_tokens_map.json", map, err);
    } else if (rc == 0) {
        json_t *m = json_object();
        for (int k = 0; k < FSDP_SPECIAL_COUNT; k++)
            if (tokens[k]) json_object_set_new(m, KEYS[k], added_token_json(tokens[k], 0));
        rc = fsdp_hf_write_json_tmp(staging, "special_tokens_map.json", m, 17, err);
        json_decref(m);
    }
    fsdp_tokenizer_spec_free(&spec);
    return rc;
}

int fsdp_tokenizer_publish(const char *staging, fsdp_err *err) {
    for (int i = 0; FSDP_TOKENIZER_FILES[i]; i++)
        if (fsdp_rename_tmp(staging, FSDP_TOKENIZER_FILES[i], err)) return -1;
    return 0;
}
