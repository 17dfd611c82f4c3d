/* tokenizer.json reader of tokenizer_json.h, over Jansson. Every message names the file and the
 * JSON field path, so a user can find what fsdp.c refused. */
#include "tokenizer_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

typedef struct {
    const char *file;
    fsdp_err *err;
} ctx;

static int dup_str(const char *s, size_t n, fsdp_tj_str *out) {
    out->s = fsdp_xmalloc(n + 1, "tokenizer string");
    memcpy(out->s, s, n);
    out->s[n] = 0;
    out->n = n;
    return 0;
}

static void free_str(fsdp_tj_str *s) {
    free(s->s);
    s->s = NULL;
    s->n = 0;
}

/* A string member; `required` 0 lets it be absent or null (out->s stays NULL). */
static int get_string(const ctx *c, const json_t *obj, const char *key, const char *path, int required,
                      fsdp_tj_str *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (!required) return 0;
        return fsdp_errf(c->err, "%s: %s.%s is missing", c->file, path, key);
    }
    if (!json_is_string(v)) return fsdp_errf(c->err, "%s: %s.%s must be a string", c->file, path, key);
    return dup_str(json_string_value(v), json_string_length(v), out);
}

/* A boolean member with a default for absent or null. */
static int get_bool(const ctx *c, const json_t *obj, const char *key, const char *path, int dflt, int *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return fsdp_errf(c->err, "%s: %s.%s must be true or false", c->file, path, key);
    *out = json_is_true(v);
    return 0;
}

static int get_int(const ctx *c, const json_t *obj, const char *key, const char *path, long long lo, long long hi,
                   long long *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v || !json_is_integer(v)) return fsdp_errf(c->err, "%s: %s.%s must be an integer", c->file, path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return fsdp_errf(c->err, "%s: %s.%s %lld is out of range (%lld to %lld)", c->file, path, key, x, lo, hi);
    *out = x;
    return 0;
}

/* The "type" of a component, checked to be a string. */
static const char *type_of(const ctx *c, const json_t *obj, const char *path) {
    if (!json_is_object(obj)) {
        fsdp_errf(c->err, "%s: %s must be an object", c->file, path);
        return NULL;
    }
    const json_t *t = json_object_get(obj, "type");
    if (!json_is_string(t)) {
        fsdp_errf(c->err, "%s: %s.type is missing", c->file, path);
        return NULL;
    }
    return json_string_value(t);
}

static int unsupported(const ctx *c, const char *path, const char *type) {
    return fsdp_errf(c->err, "%s: %s.type '%s' is not supported", c->file, path, type);
}

/* {"String": s} or {"Regex": r}. */
static int get_pattern(const ctx *c, const json_t *obj, const char *path, fsdp_tj_str *out, int *regex) {
    const json_t *p = json_object_get(obj, "pattern");
    const json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
    const json_t *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
    if (!json_is_string(s) && !json_is_string(r))
        return fsdp_errf(c->err, "%s: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", c->file, path);
    const json_t *v = json_is_string(s) ? s : r;
    *regex = !json_is_string(s);
    if (json_string_length(v) == 0) return fsdp_errf(c->err, "%s: %s.pattern is empty", c->file, path);
    return dup_str(json_string_value(v), json_string_length(v), out);
}

/* ---- normalizer -------------------------------------------------------------------------------- */

static int add_normalizer(const ctx *c, const json_t *n, const char *path, fsdp_tokenizer_spec *spec) {
    const char *type = type_of(c, n, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return fsdp_errf(c->err, "%s: %s.normalizers must be an array", c->file, path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            if (add_normalizer(c, json_array_get(list, i), sub, spec)) return -1;
        }
        return 0;
    }
    fsdp_tj_normalizer x = {0};
    static const struct {
        const char *name;
        fsdp_tj_norm_kind kind;
    } forms[] = {{"NFC", FSDP_TJ_NORM_NFC},
                 {"NFD", FSDP_TJ_NORM_NFD},
                 {"NFKC", FSDP_TJ_NORM_NFKC},
                 {"NFKD", FSDP_TJ_NORM_NFKD},
                 {"Lowercase", FSDP_TJ_NORM_LOWERCASE}};
    int form = -1;
    for (int i = 0; i < (int)(sizeof forms / sizeof forms[0]); i++)
        if (!strcmp(type, forms[i].name)) form = i;
    if (form >= 0) {
        x.kind = forms[form].kind;
    } else if (!strcmp(type, "Strip")) {
        x.kind = FSDP_TJ_NORM_STRIP;
        if (get_bool(c, n, "strip_left", path, 0, &x.strip_left) ||
            get_bool(c, n, "strip_right", path, 0, &x.strip_right))
            return -1;
    } else if (!strcmp(type, "Prepend")) {
        x.kind = FSDP_TJ_NORM_PREPEND;
        if (get_string(c, n, "prepend", path, 1, &x.text)) return -1;
    } else if (!strcmp(type, "Replace")) {
        x.kind = FSDP_TJ_NORM_REPLACE;
        if (get_pattern(c, n, path, &x.text, &x.regex) || get_string(c, n, "content", path, 1, &x.content)) {
            free_str(&x.text);
            return -1;
        }
    } else {
        return unsupported(c, path, type);
    }
    snprintf(x.field, sizeof x.field, "%s", path);
    spec->normalizers = realloc(spec->normalizers, (size_t)(spec->num_normalizers + 1) * sizeof x);
    if (!spec->normalizers) fsdp_fatal("out of host memory reading %s", c->file);
    spec->normalizers[spec->num_normalizers++] = x;
    return 0;
}

/* ---- pre-tokenizer ----------------------------------------------------------------------------- */

static int add_pretokenizer(const ctx *c, const json_t *p, const char *path, fsdp_tokenizer_spec *spec) {
    const char *type = type_of(c, p, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return fsdp_errf(c->err, "%s: %s.pretokenizers must be an array", c->file, path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            if (add_pretokenizer(c, json_array_get(list, i), sub, spec)) return -1;
        }
        return 0;
    }
    fsdp_tj_pretokenizer x = {0};
    if (!strcmp(type, "Digits")) {
        /* tokenizers splits at char::is_numeric (\p{N}), each digit Isolated or runs Contiguous: the Split
         * of one digit, or of a run of them, kept as pieces */
        int individual;
        if (get_bool(c, p, "individual_digits", path, 0, &individual)) return -1;
        x.kind = FSDP_TJ_PRE_SPLIT;
        x.behavior = FSDP_SPLIT_ISOLATED;
        x.regex = 1;
        const char *re = individual ? "\\p{N}" : "\\p{N}+";
        dup_str(re, strlen(re), &x.pattern);
    } else if (!strcmp(type, "Split")) {
        static const char *const behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                                "Contiguous"};
        x.kind = FSDP_TJ_PRE_SPLIT;
        const json_t *b = json_object_get(p, "behavior");
        int found = -1;
        for (int i = 0; i < 5 && json_is_string(b); i++)
            if (!strcmp(json_string_value(b), behaviors[i])) found = i;
        if (found < 0)
            return fsdp_errf(c->err, "%s: %s.behavior %s", c->file, path,
                             json_is_string(b) ? "is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                                                 "Contiguous"
                                               : "is missing");
        x.behavior = (fsdp_split_behavior)found;
        if (get_bool(c, p, "invert", path, 0, &x.invert) || get_pattern(c, p, path, &x.pattern, &x.regex)) return -1;
    } else if (!strcmp(type, "ByteLevel")) {
        x.kind = FSDP_TJ_PRE_BYTE_LEVEL;
        int trim;
        if (get_bool(c, p, "add_prefix_space", path, 1, &x.add_prefix_space) ||
            get_bool(c, p, "use_regex", path, 1, &x.use_regex) || get_bool(c, p, "trim_offsets", path, 1, &trim))
            return -1;
    } else {
        return unsupported(c, path, type);
    }
    snprintf(x.field, sizeof x.field, "%s", path);
    spec->pretokenizers = realloc(spec->pretokenizers, (size_t)(spec->num_pretokenizers + 1) * sizeof x);
    if (!spec->pretokenizers) fsdp_fatal("out of host memory reading %s", c->file);
    spec->pretokenizers[spec->num_pretokenizers++] = x;
    return 0;
}

/* ---- post-processor ---------------------------------------------------------------------------- */

static int read_template(const ctx *c, const json_t *p, const char *path, fsdp_tj_template *t) {
    const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single)) return fsdp_errf(c->err, "%s: %s.single must be an array", c->file, path);
    if (!json_is_object(specials))
        return fsdp_errf(c->err, "%s: %s.special_tokens must be an object", c->file, path);
    t->num_pieces = (int)json_array_size(single);
    t->pieces = fsdp_xcalloc((size_t)t->num_pieces + 1, sizeof *t->pieces, "template");
    for (int i = 0; i < t->num_pieces; i++) {
        const json_t *piece = json_array_get(single, (size_t)i);
        const json_t *seq = json_object_get(piece, "Sequence"), *sp = json_object_get(piece, "SpecialToken");
        if (json_is_object(seq)) {
            const json_t *id = json_object_get(seq, "id");
            if (!json_is_string(id) || strcmp(json_string_value(id), "A"))
                return fsdp_errf(c->err, "%s: %s.single[%d].Sequence.id must be \"A\" in a single-sequence template",
                                 c->file, path, i);
            t->pieces[i].is_sequence = 1;
            continue;
        }
        const json_t *name = json_is_object(sp) ? json_object_get(sp, "id") : NULL;
        if (!json_is_string(name))
            return fsdp_errf(c->err, "%s: %s.single[%d] must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}",
                             c->file, path, i);
        const json_t *tok = json_object_get(specials, json_string_value(name));
        const json_t *ids = json_is_object(tok) ? json_object_get(tok, "ids") : NULL;
        if (!json_is_array(ids))
            return fsdp_errf(c->err, "%s: %s.special_tokens has no ids for '%s'", c->file, path, json_string_value(name));
        t->pieces[i].num_ids = (int)json_array_size(ids);
        t->pieces[i].ids = fsdp_xcalloc((size_t)t->pieces[i].num_ids + 1, sizeof(uint32_t), "template ids");
        for (int k = 0; k < t->pieces[i].num_ids; k++) {
            const json_t *id = json_array_get(ids, (size_t)k);
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX)
                return fsdp_errf(c->err, "%s: %s.special_tokens.%s.ids[%d] must be a token id", c->file, path,
                                 json_string_value(name), k);
            t->pieces[i].ids[k] = (uint32_t)json_integer_value(id);
        }
    }
    return 0;
}

static int add_post(const ctx *c, const json_t *p, const char *path, fsdp_tokenizer_spec *spec) {
    const char *type = type_of(c, p, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list)) return fsdp_errf(c->err, "%s: %s.processors must be an array", c->file, path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if (add_post(c, json_array_get(list, i), sub, spec)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* it only adjusts offsets, which fsdp.c does not keep */
    if (strcmp(type, "TemplateProcessing")) return unsupported(c, path, type);
    spec->templates = realloc(spec->templates, (size_t)(spec->num_templates + 1) * sizeof *spec->templates);
    if (!spec->templates) fsdp_fatal("out of host memory reading %s", c->file);
    fsdp_tj_template *t = &spec->templates[spec->num_templates++];
    memset(t, 0, sizeof *t);
    return read_template(c, p, path, t);
}

/* ---- decoder ----------------------------------------------------------------------------------- */

static int add_decoder(const ctx *c, const json_t *d, const char *path, fsdp_tokenizer_spec *spec) {
    const char *type = type_of(c, d, path);
    if (!type) return -1;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list)) return fsdp_errf(c->err, "%s: %s.decoders must be an array", c->file, path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            if (add_decoder(c, json_array_get(list, i), sub, spec)) return -1;
        }
        return 0;
    }
    fsdp_tj_decoder x = {0};
    if (!strcmp(type, "ByteLevel")) {
        x.kind = FSDP_TJ_DEC_BYTE_LEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        x.kind = FSDP_TJ_DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        x.kind = FSDP_TJ_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        x.kind = FSDP_TJ_DEC_REPLACE;
        if (get_pattern(c, d, path, &x.pattern, &x.regex) || get_string(c, d, "content", path, 1, &x.content))
            return -1;
    } else if (!strcmp(type, "Strip")) {
        x.kind = FSDP_TJ_DEC_STRIP;
        long long start = 0, stop = 0; /* set by get_int when it returns 0 */
        if (get_string(c, d, "content", path, 1, &x.content) ||
            get_int(c, d, "start", path, 0, 1 << 20, &start) || get_int(c, d, "stop", path, 0, 1 << 20, &stop))
            return -1;
        /* content is one char (a Rust char): decode its single code point */
        const unsigned char *s = (const unsigned char *)x.content.s;
        size_t n = x.content.n, len = n == 0 ? 0 : s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
        if (n == 0 || len != n) return fsdp_errf(c->err, "%s: %s.content must be one character", c->file, path);
        uint32_t cp = len == 1 ? s[0] : len == 2 ? (s[0] & 0x1Fu) : len == 3 ? (s[0] & 0x0Fu) : (s[0] & 0x07u);
        for (size_t i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3Fu);
        x.strip_char = cp;
        x.start = (int)start, x.stop = (int)stop;
    } else {
        return unsupported(c, path, type);
    }
    snprintf(x.field, sizeof x.field, "%s", path);
    spec->decoders = realloc(spec->decoders, (size_t)(spec->num_decoders + 1) * sizeof x);
    if (!spec->decoders) fsdp_fatal("out of host memory reading %s", c->file);
    spec->decoders[spec->num_decoders++] = x;
    return 0;
}

/* ---- model ------------------------------------------------------------------------------------- */

static int read_model(const ctx *c, const json_t *m, fsdp_tokenizer_spec *spec) {
    if (!json_is_object(m)) return fsdp_errf(c->err, "%s: model must be an object", c->file);
    const json_t *type = json_object_get(m, "type");
    if (type && !json_is_string(type)) return fsdp_errf(c->err, "%s: model.type must be a string", c->file);
    if (type && strcmp(json_string_value(type), "BPE")) return unsupported(c, "model", json_string_value(type));
    const json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return fsdp_errf(c->err, "%s: model.dropout is not supported (BPE dropout samples merges at random)", c->file);
    /* An empty prefix or suffix changes nothing in tokenizers (Qwen's files have both); any other is
     * glued to words fsdp.c's BPE does not mark. */
    static const char *const unsupported_strings[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(m, unsupported_strings[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return fsdp_errf(c->err, "%s: model.%s %s is not supported (only null or \"\")", c->file,
                             unsupported_strings[i], json_is_string(v) ? json_string_value(v) : "(not a string)");
    }
    if (get_string(c, m, "unk_token", "model", 0, &spec->unk_token) ||
        get_bool(c, m, "fuse_unk", "model", 0, &spec->fuse_unk) ||
        get_bool(c, m, "byte_fallback", "model", 0, &spec->byte_fallback) ||
        get_bool(c, m, "ignore_merges", "model", 0, &spec->ignore_merges))
        return -1;

    const json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return fsdp_errf(c->err, "%s: model.vocab must be an object", c->file);
    const char *key;
    const json_t *v;
    uint32_t max_id = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return fsdp_errf(c->err, "%s: model.vocab[\"%s\"] must be a token id (0 to %d)", c->file, key, INT32_MAX - 1);
        if ((uint32_t)json_integer_value(v) > max_id) max_id = (uint32_t)json_integer_value(v);
    }
    if (json_object_size(vocab) == 0) return fsdp_errf(c->err, "%s: model.vocab is empty", c->file);
    spec->vocab_size = max_id + 1;
    spec->vocab = fsdp_xcalloc(spec->vocab_size, sizeof *spec->vocab, "tokenizer vocabulary");
    json_object_foreach((json_t *)vocab, key, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        if (spec->vocab[id].s)
            return fsdp_errf(c->err, "%s: model.vocab gives id %u to both \"%s\" and \"%s\"", c->file, id,
                             spec->vocab[id].s, key);
        /* Jansson keys are NUL-terminated: a key holding NUL cannot be told apart, so none is taken. */
        dup_str(key, strlen(key), &spec->vocab[id]);
    }

    const json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return fsdp_errf(c->err, "%s: model.merges must be an array", c->file);
    size_t n = json_array_size(merges);
    spec->merges = fsdp_xcalloc(n + 1, sizeof *spec->merges, "tokenizer merges");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(merges, i);
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            if (!strncmp(s, "#version", 8)) continue; /* tokenizers skips these lines of merges.txt */
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return fsdp_errf(c->err, "%s: model.merges[%zu] \"%s\" is not two tokens separated by one space",
                                 c->file, i, s);
            dup_str(s, (size_t)(sp - s), &spec->merges[spec->num_merges][0]);
            dup_str(sp + 1, strlen(sp + 1), &spec->merges[spec->num_merges][1]);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            for (int k = 0; k < 2; k++) {
                const json_t *t = json_array_get(e, (size_t)k);
                dup_str(json_string_value(t), json_string_length(t), &spec->merges[spec->num_merges][k]);
            }
        } else {
            return fsdp_errf(c->err, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", c->file, i);
        }
        spec->num_merges++;
    }
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------------------ */

static int read_added(const ctx *c, const json_t *list, fsdp_tokenizer_spec *spec) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return fsdp_errf(c->err, "%s: added_tokens must be an array", c->file);
    spec->num_added = (int)json_array_size(list);
    spec->added = fsdp_xcalloc((size_t)spec->num_added + 1, sizeof *spec->added, "added tokens");
    for (int i = 0; i < spec->num_added; i++) {
        const json_t *t = json_array_get(list, (size_t)i);
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        if (!json_is_object(t)) return fsdp_errf(c->err, "%s: %s must be an object", c->file, path);
        fsdp_tj_added_token *a = &spec->added[i];
        long long id = 0;
        if (get_int(c, t, "id", path, 0, INT32_MAX - 1, &id) || get_string(c, t, "content", path, 1, &a->content) ||
            get_bool(c, t, "single_word", path, 0, &a->single_word) || get_bool(c, t, "lstrip", path, 0, &a->lstrip) ||
            get_bool(c, t, "rstrip", path, 0, &a->rstrip) || get_bool(c, t, "special", path, 0, &a->special) ||
            get_bool(c, t, "normalized", path, 1, &a->normalized))
            return -1;
        a->id = (uint32_t)id;
    }
    return 0;
}

/* ---- the file ---------------------------------------------------------------------------------- */

static int hash_chunk(const char *buffer, size_t size, void *data) {
    uint64_t h = *(uint64_t *)data;
    for (size_t i = 0; i < size; i++) h = (h ^ (unsigned char)buffer[i]) * 0x100000001b3ULL;
    *(uint64_t *)data = h;
    return 0;
}

/* FNV-1a 64 of the canonical JSON (keys sorted, compact, reals with 17 digits). */
static int canonical_hash(const json_t *root, uint64_t *hash) {
    *hash = 0xcbf29ce484222325ULL;
    return json_dump_callback(root, hash_chunk, hash, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(17));
}

int fsdp_tokenizer_json_hash(const char *path, uint64_t *hash, fsdp_err *err) {
    json_t *root = fsdp_json_load_path(path, err);
    if (!root) return -1;
    int rc = canonical_hash(root, hash);
    json_decref(root);
    return rc ? fsdp_errf(err, "%s: cannot compute the tokenizer's hash", path) : 0;
}

static int read_spec(const ctx *c, const json_t *root, fsdp_tokenizer_spec *spec) {
    if (!json_is_object(root)) return fsdp_errf(c->err, "%s: not a tokenizer.json (the top level is not an object)", c->file);
    static const char *const refused_if_set[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, refused_if_set[i]);
        if (v && !json_is_null(v))
            return fsdp_errf(c->err, "%s: %s is set; fsdp.c does not truncate or pad (set it to null)", c->file,
                             refused_if_set[i]);
    }
    const json_t *model = json_object_get(root, "model");
    if (!model) return fsdp_errf(c->err, "%s: not a tokenizer.json (no model)", c->file);
    if (read_model(c, model, spec) || read_added(c, json_object_get(root, "added_tokens"), spec)) return -1;
    const json_t *n = json_object_get(root, "normalizer"), *p = json_object_get(root, "pre_tokenizer");
    const json_t *post = json_object_get(root, "post_processor"), *d = json_object_get(root, "decoder");
    if (n && !json_is_null(n) && add_normalizer(c, n, "normalizer", spec)) return -1;
    if (p && !json_is_null(p) && add_pretokenizer(c, p, "pre_tokenizer", spec)) return -1;
    if (post && !json_is_null(post) && add_post(c, post, "post_processor", spec)) return -1;
    spec->has_decoder = d && !json_is_null(d);
    if (spec->has_decoder && add_decoder(c, d, "decoder", spec)) return -1;
    if (canonical_hash(root, &spec->hash))
        return fsdp_errf(c->err, "%s: cannot compute the tokenizer's hash", c->file);
    return 0;
}

int fsdp_tokenizer_spec_load(const char *path, fsdp_tokenizer_spec *spec, fsdp_err *err) {
    memset(spec, 0, sizeof *spec);
    json_t *root = fsdp_json_load_path(path, err);
    if (!root) return -1;
    ctx c = {path, err};
    int rc = read_spec(&c, root, spec);
    json_decref(root);
    if (rc) fsdp_tokenizer_spec_free(spec);
    return rc;
}

void fsdp_tokenizer_spec_free(fsdp_tokenizer_spec *spec) {
    for (uint32_t i = 0; spec->vocab && i < spec->vocab_size; i++) free_str(&spec->vocab[i]);
    free(spec->vocab);
    for (size_t i = 0; i < spec->num_merges; i++) free_str(&spec->merges[i][0]), free_str(&spec->merges[i][1]);
    free(spec->merges);
    free_str(&spec->unk_token);
    for (int i = 0; i < spec->num_added; i++) free_str(&spec->added[i].content);
    free(spec->added);
    for (int i = 0; i < spec->num_normalizers; i++)
        free_str(&spec->normalizers[i].text), free_str(&spec->normalizers[i].content);
    free(spec->normalizers);
    for (int i = 0; i < spec->num_pretokenizers; i++) free_str(&spec->pretokenizers[i].pattern);
    free(spec->pretokenizers);
    for (int i = 0; i < spec->num_templates; i++) {
        for (int k = 0; k < spec->templates[i].num_pieces; k++) free(spec->templates[i].pieces[k].ids);
        free(spec->templates[i].pieces);
    }
    free(spec->templates);
    for (int i = 0; i < spec->num_decoders; i++)
        free_str(&spec->decoders[i].pattern), free_str(&spec->decoders[i].content);
    free(spec->decoders);
    memset(spec, 0, sizeof *spec);
}
