/* The tokenizer of tokenizer.h: loading glues the stages together; encode and decode run them. */
#include "tokenizer.h"

#include <stdlib.h>

#include "../io/special_tokens.h"
#include "../io/tokenizer_json.h"
#include "added_tokens.h"
#include "bpe.h"
#include "decode.h"
#include "normalize.h"
#include "postprocess.h"
#include "pretokenize.h"
#include "../base/utf8.h"

struct fsdp_tokenizer {
    fsdp_tokenizer_spec spec;
    fsdp_special_tokens special; /* what tokenizer_config.json names */
    fsdp_bpe bpe;
    fsdp_normalizer normalizer;
    fsdp_pretokenizer pretokenizer;
    fsdp_added_tokens added;
    fsdp_decoder decoder;
    uint32_t vocab_size;
};

struct fsdp_tokenizer_state {
    fsdp_regex_scratch regex;
    fsdp_spans spans;
    fsdp_pretok_scratch pretok;
    fsdp_bpe_state bpe;
    fsdp_arena arena;
    fsdp_pieces pieces, more;
    fsdp_ids tmp;
};

fsdp_tokenizer *fsdp_tokenizer_load(const char *path, fsdp_err *err) {
    fsdp_tokenizer *t = fsdp_xcalloc(1, sizeof *t, "tokenizer");
    if (fsdp_tokenizer_spec_load_with_config(path, &t->spec, &t->special, err)) {
        free(t);
        return NULL;
    }
    if (fsdp_bpe_init(&t->bpe, &t->spec, path, err) || fsdp_normalizer_init(&t->normalizer, &t->spec, path, err) ||
        fsdp_pretokenizer_init(&t->pretokenizer, &t->spec, path, err) ||
        fsdp_added_tokens_init(&t->added, &t->spec, &t->bpe, &t->normalizer, path, err) ||
        fsdp_decoder_init(&t->decoder, &t->spec, path, err)) {
        fsdp_tokenizer_free(t);
        return NULL;
    }
    t->vocab_size = t->spec.vocab_size;
    if (t->added.num_tokens && t->added.max_id + 1 > t->vocab_size) t->vocab_size = t->added.max_id + 1;
    for (int s = 0; s < t->spec.num_templates; s++)
        for (int i = 0; i < t->spec.templates[s].num_pieces; i++)
            for (int k = 0; k < t->spec.templates[s].pieces[i].num_ids; k++)
                if (t->spec.templates[s].pieces[i].ids[k] >= t->vocab_size) {
                    fsdp_errf(err, "%s: post_processor: special token id %u is not in the vocabulary", path,
                              t->spec.templates[s].pieces[i].ids[k]);
                    fsdp_tokenizer_free(t);
                    return NULL;
                }
    return t;
}

void fsdp_tokenizer_free(fsdp_tokenizer *t) {
    if (!t) return;
    fsdp_bpe_free(&t->bpe);
    fsdp_normalizer_free(&t->normalizer);
    fsdp_pretokenizer_free(&t->pretokenizer);
    fsdp_added_tokens_free(&t->added);
    fsdp_decoder_free(&t->decoder);
    fsdp_tokenizer_spec_free(&t->spec);
    free(t);
}

uint32_t fsdp_tokenizer_vocab_size(const fsdp_tokenizer *t) { return t->vocab_size; }
uint64_t fsdp_tokenizer_model_max_length(const fsdp_tokenizer *t) { return t->special.model_max_length; }

int fsdp_tokenizer_special_id(const fsdp_tokenizer *t, int which, uint32_t *id) {
    if (which < 0 || which >= FSDP_SPECIAL_COUNT || !t->special.has[which]) return 0;
    *id = t->special.id[which];
    return 1;
}
uint64_t fsdp_tokenizer_hash(const fsdp_tokenizer *t) { return t->spec.hash; }

int fsdp_tokenizer_token_id(const fsdp_tokenizer *t, const char *token, size_t n, uint32_t *id) {
    for (int i = 0; i < t->added.num_tokens; i++) {
        const fsdp_tj_added_token *a = t->added.tokens[i].spec;
        if (a->content.n == n && !memcmp(a->content.s, token, n)) return *id = a->id, 1;
    }
    return fsdp_strmap_get(&t->bpe.vocab, token, n, id);
}

int fsdp_tokenizer_is_special(const fsdp_tokenizer *t, uint32_t id) {
    const fsdp_added_entry *e = fsdp_added_token_of(&t->added, id);
    return e && e->spec->special;
}

void fsdp_tokenizer_special_counts(const fsdp_tokenizer *t, size_t *before, size_t *after) {
    fsdp_postprocess_counts(&t->spec, 1, before, after);
}

fsdp_tokenizer_state *fsdp_tokenizer_state_new(const fsdp_tokenizer *t) {
    (void)t;
    fsdp_tokenizer_state *s = fsdp_xcalloc(1, sizeof *s, "tokenizer state");
    fsdp_regex_scratch_init(&s->regex);
    return s;
}

void fsdp_tokenizer_state_free(fsdp_tokenizer_state *s) {
    if (!s) return;
    fsdp_regex_scratch_free(&s->regex);
    free(s->spans.p);
    fsdp_pretok_scratch_free(&s->pretok);
    fsdp_bpe_state_free(&s->bpe);
    fsdp_arena_free(&s->arena);
    fsdp_pieces_free(&s->pieces);
    fsdp_pieces_free(&s->more);
    fsdp_ids_free(&s->tmp);
    free(s);
}

/* tokenizers' AddedVocabulary::extract_and_normalize: raw-text tokens, then each stretch between
 * them normalized and searched for the normalized tokens. Leaves the pieces in s->pieces. */
static int extract_and_normalize(const fsdp_tokenizer *t, fsdp_tokenizer_state *s, const char *text, size_t n,
                                 fsdp_err *err) {
    s->more.n = 0;
    fsdp_added_tokens_split(&t->added, 0, &s->regex, text, n, &s->more);
    s->pieces.n = 0;
    for (size_t i = 0; i < s->more.n; i++) {
        fsdp_piece p = s->more.p[i];
        if (p.id >= 0) {
            fsdp_pieces_push(&s->pieces, p.s, p.n, p.id);
            continue;
        }
        if (p.n == 0) continue;
        const char *norm;
        size_t len;
        if (fsdp_normalize(&t->normalizer, &s->regex, &s->spans, &s->arena, p.s, p.n, &norm, &len, err)) return -1;
        size_t first = s->pieces.n;
        fsdp_added_tokens_split(&t->added, 1, &s->regex, norm, len, &s->pieces);
        /* drop empty stretches */
        size_t k = first;
        for (size_t j = first; j < s->pieces.n; j++)
            if (s->pieces.p[j].id >= 0 || s->pieces.p[j].n > 0) s->pieces.p[k++] = s->pieces.p[j];
        s->pieces.n = k;
    }
    return 0;
}

int fsdp_tokenizer_encode(const fsdp_tokenizer *t, fsdp_tokenizer_state *s, const char *text, size_t n,
                          int add_special_tokens, fsdp_ids *out, fsdp_err *err) {
    size_t bad = fsdp_utf8_invalid(text, n);
    if (bad != n) return fsdp_errf(err, "invalid UTF-8 at byte %zu", bad + 1);
    fsdp_arena_reset(&s->arena);
    if (extract_and_normalize(t, s, text, n, err)) return -1;
    if (fsdp_pretokenize(&t->pretokenizer, &s->regex, &s->pretok, &s->arena, &s->pieces, err)) return -1;
    int post = t->spec.num_templates > 0;
    fsdp_ids *ids = out, local = {0};
    if (post) ids = &local; /* the template wraps this text's ids only */
    for (size_t i = 0; i < s->pieces.n; i++) {
        const fsdp_piece *p = &s->pieces.p[i];
        if (p->id >= 0) fsdp_ids_push(ids, (uint32_t)p->id);
        else if (p->n) fsdp_bpe_word(&t->bpe, &s->bpe, p->s, p->n, ids);
    }
    if (post) {
        fsdp_postprocess(&t->spec, add_special_tokens, &local, &s->tmp);
        fsdp_ids_reserve(out, local.n);
        memcpy(out->p + out->n, local.p, local.n * sizeof *local.p);
        out->n += local.n;
        fsdp_ids_free(&local);
    }
    return 0;
}

int fsdp_tokenizer_decode(const fsdp_tokenizer *t, fsdp_tokenizer_state *s, const uint32_t *ids, size_t n,
                          int skip_special_tokens, fsdp_buf *out, fsdp_err *err) {
    fsdp_arena_reset(&s->arena);
    s->pieces.n = 0;
    for (size_t i = 0; i < n; i++) {
        const fsdp_added_entry *e = fsdp_added_token_of(&t->added, ids[i]);
        const char *tok;
        size_t len;
        if (e) {
            tok = e->spec->content.s, len = e->spec->content.n;
        } else if (ids[i] < t->bpe.vocab_size && t->bpe.tokens[ids[i]].s) {
            tok = t->bpe.tokens[ids[i]].s, len = t->bpe.tokens[ids[i]].n;
        } else {
            return fsdp_errf(err, "token id %u is not in the tokenizer's vocabulary (%u ids)", ids[i], t->vocab_size);
        }
        uint32_t unused;
        if (skip_special_tokens && fsdp_strmap_get(&t->added.special, tok, len, &unused)) continue;
        fsdp_pieces_push(&s->pieces, tok, len, -1);
    }
    return fsdp_decoder_run(&t->decoder, &s->regex, &s->arena, &s->pieces, &s->more, out, err);
}
