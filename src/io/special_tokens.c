/* tokenizer_config.json applied as special_tokens.h says. */
#include "special_tokens.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The changes' canonical text, grown as it is written. */
typedef struct {
    char *p;
    size_t n, cap;
} changes_buf;
static void buf_add(changes_buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n + 1) {
        b->cap = 2 * (b->n + n + 64);
        b->p = realloc(b->p, b->cap);
        if (!b->p) fsdp_fatal("out of host memory (tokenizer_config.json)");
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_addc(changes_buf *b, char c) { buf_add(b, &c, 1); }
static void buf_free(changes_buf *b) { free(b->p); }

static int find_added(const fsdp_tokenizer_spec *spec, const fsdp_tj_str *content) {
    for (int i = 0; i < spec->num_added; i++)
        if (spec->added[i].content.n == content->n && !memcmp(spec->added[i].content.s, content->s, content->n))
            return i;
    return -1;
}

static int find_vocab(const fsdp_tokenizer_spec *spec, const fsdp_tj_str *content, uint32_t *id) {
    for (uint32_t i = 0; i < spec->vocab_size; i++)
        if (spec->vocab[i].s && spec->vocab[i].n == content->n && !memcmp(spec->vocab[i].s, content->s, content->n))
            return *id = i, 1;
    return 0;
}

static void note_token(changes_buf *changes, const char *what, const fsdp_tj_added_token *a) {
    char line[128];
    snprintf(line, sizeof line, "%s %" PRIu32 " %d%d%d%d%d ", what, a->id, a->single_word, a->lstrip, a->rstrip,
             a->normalized, a->special);
    buf_add(changes, line, strlen(line));
    buf_add(changes, a->content.s, a->content.n);
    buf_addc(changes, '\n');
}

/* Gives the added token a's flags from t (a config token with flags, or a string: special, not
 * normalized, no stripping); notes a change. */
static void set_flags(fsdp_tj_added_token *a, const fsdp_tc_token *t, int force_special, changes_buf *changes) {
    fsdp_tj_added_token was = *a;
    if (t->has_flags) {
        a->single_word = t->single_word, a->lstrip = t->lstrip, a->rstrip = t->rstrip;
        a->normalized = t->normalized, a->special = t->special || force_special;
    } else {
        a->single_word = a->lstrip = a->rstrip = a->normalized = 0;
        a->special = 1;
    }
    if (was.single_word != a->single_word || was.lstrip != a->lstrip || was.rstrip != a->rstrip ||
        was.normalized != a->normalized || was.special != a->special)
        note_token(changes, "flags", a);
}

/* A named special token: re-flagged when it is an added token, added when it is in the vocabulary. */
static int add_special(fsdp_tokenizer_spec *spec, const fsdp_tc_token *t, const char *file, const char *what,
                       changes_buf *changes, fsdp_err *err) {
    if (!t->named || t->content.n == 0) return 0;
    int i = find_added(spec, &t->content);
    if (i >= 0) {
        set_flags(&spec->added[i], t, 1, changes);
        return 0;
    }
    uint32_t id;
    if (!find_vocab(spec, &t->content, &id))
        return fsdp_errf(err, "%s: %s \"%s\" is not a token of the tokenizer.json (transformers would add it with a new "
                         "id; fsdp.c does not grow vocabularies)", file, what, t->content.s);
    spec->added = realloc(spec->added, (size_t)(spec->num_added + 1) * sizeof *spec->added);
    if (!spec->added) fsdp_fatal("out of host memory reading %s", file);
    fsdp_tj_added_token *a = &spec->added[spec->num_added++];
    memset(a, 0, sizeof *a);
    a->id = id;
    a->content.n = t->content.n;
    a->content.s = fsdp_xmalloc(t->content.n + 1, "added token");
    memcpy(a->content.s, t->content.s, t->content.n + 1);
    set_flags(a, t, 1, changes);
    note_token(changes, "added", a);
    return 0;
}

static int token_id(const fsdp_tokenizer_spec *spec, const fsdp_tc_token *t, uint32_t *id) {
    int i = find_added(spec, &t->content);
    if (i >= 0) return *id = spec->added[i].id, 1;
    return find_vocab(spec, &t->content, id);
}

static int same_template(const fsdp_tokenizer_spec *spec, const fsdp_tj_template *t) {
    if (spec->num_templates == 0) return t->num_pieces == 1 && t->pieces[0].is_sequence;
    if (spec->num_templates != 1 || spec->templates[0].num_pieces != t->num_pieces) return 0;
    for (int i = 0; i < t->num_pieces; i++) {
        const fsdp_tj_template_piece *a = &spec->templates[0].pieces[i], *b = &t->pieces[i];
        if (a->is_sequence != b->is_sequence || a->num_ids != b->num_ids ||
            (a->num_ids && memcmp(a->ids, b->ids, (size_t)a->num_ids * sizeof *a->ids)))
            return 0;
    }
    return 1;
}

/* transformers' update_post_processor: single = "[bos:0 ]$A:0[ eos:0]". */
static void rebuild_template(fsdp_tokenizer_spec *spec, const fsdp_tokenizer_config *cfg, const fsdp_special_tokens *s,
                             changes_buf *changes) {
    fsdp_tj_template t = {fsdp_xcalloc(4, sizeof *t.pieces, "template"), 0};
    int bos = cfg->add_bos && s->has[FSDP_SPECIAL_BOS], eos = cfg->add_eos && s->has[FSDP_SPECIAL_EOS];
    if (bos) {
        t.pieces[t.num_pieces].ids = fsdp_xmalloc(sizeof(uint32_t), "template ids");
        t.pieces[t.num_pieces].ids[0] = s->id[FSDP_SPECIAL_BOS];
        t.pieces[t.num_pieces++].num_ids = 1;
    }
    t.pieces[t.num_pieces++].is_sequence = 1;
    if (eos) {
        t.pieces[t.num_pieces].ids = fsdp_xmalloc(sizeof(uint32_t), "template ids");
        t.pieces[t.num_pieces].ids[0] = s->id[FSDP_SPECIAL_EOS];
        t.pieces[t.num_pieces++].num_ids = 1;
    }
    if (!same_template(spec, &t)) {
        char line[96];
        snprintf(line, sizeof line, "template %" PRId64 " %" PRId64 "\n", bos ? (int64_t)s->id[FSDP_SPECIAL_BOS] : -1,
                 eos ? (int64_t)s->id[FSDP_SPECIAL_EOS] : -1);
        buf_add(changes, line, strlen(line));
    }
    for (int i = 0; i < spec->num_templates; i++) {
        for (int k = 0; k < spec->templates[i].num_pieces; k++) free(spec->templates[i].pieces[k].ids);
        free(spec->templates[i].pieces);
    }
    spec->templates = realloc(spec->templates, sizeof *spec->templates);
    if (!spec->templates) fsdp_fatal("out of host memory (template)");
    spec->templates[0] = t;
    spec->num_templates = 1;
}

int fsdp_special_tokens_apply(fsdp_tokenizer_spec *spec, const fsdp_tokenizer_config *cfg, fsdp_special_tokens *out,
                              fsdp_err *err) {
    memset(out, 0, sizeof *out);
    out->model_max_length = cfg->model_max_length;
    const char *file = cfg->path;
    changes_buf changes = {0};
    int rc = 0;
    for (int k = 0; k < cfg->num_decoder && rc == 0; k++) {
        const fsdp_tc_decoder_entry *e = &cfg->decoder[k];
        int i = find_added(spec, &e->token.content);
        if (i < 0 || spec->added[i].id != e->id)
            rc = fsdp_errf(err, "%s: added_tokens_decoder[\"%u\"] \"%s\" is not the tokenizer.json's added token %u "
                           "(transformers would add it anew)", file, e->id, e->token.content.s, e->id);
        else
            set_flags(&spec->added[i], &e->token, 0, &changes);
    }
    const fsdp_tc_token *named[] = {&cfg->bos, &cfg->eos, &cfg->pad, &cfg->unk};
    static const char *const names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int k = 0; k < FSDP_SPECIAL_COUNT && rc == 0; k++) rc = add_special(spec, named[k], file, names[k], &changes, err);
    for (int k = 0; k < cfg->num_extra && rc == 0; k++)
        rc = add_special(spec, &cfg->extra[k], file, "additional_special_tokens", &changes, err);
    for (int k = 0; k < FSDP_SPECIAL_COUNT && rc == 0; k++)
        if (named[k]->named) out->has[k] = token_id(spec, named[k], &out->id[k]);
    if (rc == 0 && (cfg->has_add_bos || cfg->has_add_eos)) rebuild_template(spec, cfg, out, &changes);
    if (rc == 0 && changes.n) {
        static const char TAG[] = "\ntokenizer_config.json\n";
        uint64_t h = spec->hash;
        for (size_t i = 0; i < sizeof TAG - 1; i++) h = (h ^ (unsigned char)TAG[i]) * 0x100000001b3ULL;
        for (size_t i = 0; i < changes.n; i++) h = (h ^ (unsigned char)changes.p[i]) * 0x100000001b3ULL;
        spec->hash = h;
    }
    buf_free(&changes);
    return rc;
}

int fsdp_tokenizer_spec_load_with_config(const char *arg, fsdp_tokenizer_spec *spec, fsdp_special_tokens *special,
                                         fsdp_err *err) {
    char json[4300], config[4300];
    memset(special, 0, sizeof *special);
    if (fsdp_tokenizer_files(arg, json, sizeof json, config, sizeof config, err)) return -1;
    if (fsdp_tokenizer_spec_load(json, spec, err)) return -1;
    if (!config[0]) return 0;
    fsdp_tokenizer_config cfg;
    int rc = fsdp_tokenizer_config_load(config, &cfg, err);
    if (rc == 0) {
        rc = fsdp_special_tokens_apply(spec, &cfg, special, err);
        fsdp_tokenizer_config_free(&cfg);
    }
    if (rc) fsdp_tokenizer_spec_free(spec);
    return rc;
}

int fsdp_tokenizer_identity_hash(const char *arg, uint64_t *hash, fsdp_err *err) {
    char json[4300], config[4300];
    if (fsdp_tokenizer_files(arg, json, sizeof json, config, sizeof config, err)) return -1;
    if (fsdp_tokenizer_json_hash(json, hash, err)) return -1;
    if (!config[0]) return 0;
    fsdp_tokenizer_spec spec;
    fsdp_special_tokens special;
    fsdp_err ignored = {0};
    if (fsdp_tokenizer_spec_load(json, &spec, &ignored)) return 0; /* not a tokenizer fsdp.c reads */
    fsdp_tokenizer_config cfg;
    int rc = fsdp_tokenizer_config_load(config, &cfg, err);
    if (rc == 0) {
        rc = fsdp_special_tokens_apply(&spec, &cfg, &special, err);
        fsdp_tokenizer_config_free(&cfg);
    }
    if (rc == 0) *hash = spec.hash;
    fsdp_tokenizer_spec_free(&spec);
    return rc;
}
