/* Added-token matching of added_tokens.h. */
#include "added_tokens.h"

#include <stdio.h>
#include <stdlib.h>

#include "../base/utf8.h"

/* ---- the trie ---------------------------------------------------------------------------------- */

static uint32_t trie_node(fsdp_trie *t) {
    if (t->num_nodes == t->cap_nodes) {
        t->cap_nodes = t->cap_nodes ? 2 * t->cap_nodes : 256;
        t->terminal = realloc(t->terminal, t->cap_nodes * sizeof *t->terminal);
        if (!t->terminal) fsdp_fatal("out of host memory (added tokens)");
    }
    t->terminal[t->num_nodes] = -1;
    return (uint32_t)t->num_nodes++;
}

static void trie_add(fsdp_trie *t, const char *s, size_t n, int32_t token) {
    if (!t->num_nodes) trie_node(t);
    uint64_t node = 0;
    t->first[(unsigned char)s[0]] = 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = node << 8 | (unsigned char)s[i], child;
        if (!fsdp_u64map_get(&t->edges, key, &child)) {
            child = trie_node(t);
            fsdp_u64map_put(&t->edges, key, child);
        }
        node = child;
    }
    /* the first of equal patterns wins, as in Aho-Corasick */
    if (t->terminal[node] < 0) t->terminal[node] = token;
}

/* The leftmost-longest match at or after pos: 1 with [*start, *end) and its token. */
static int trie_find(const fsdp_trie *t, const char *s, size_t n, size_t pos, size_t *start, size_t *end,
                     int32_t *token) {
    if (!t->num_nodes) return 0;
    for (size_t i = pos; i < n; i++) {
        if (!t->first[(unsigned char)s[i]]) continue;
        uint64_t node = 0, child;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n && fsdp_u64map_get(&t->edges, node << 8 | (unsigned char)s[j], &child); j++) {
            node = child;
            if (t->terminal[node] >= 0) best = t->terminal[node], best_end = j + 1;
        }
        if (best >= 0) {
            *start = i, *end = best_end, *token = best;
            return 1;
        }
    }
    return 0;
}

static void trie_free(fsdp_trie *t) {
    fsdp_u64map_free(&t->edges);
    free(t->terminal);
    memset(t, 0, sizeof *t);
}

/* ---- set-up ------------------------------------------------------------------------------------ */

int fsdp_added_tokens_init(fsdp_added_tokens *a, const fsdp_tokenizer_spec *spec, const fsdp_bpe *bpe,
                           const fsdp_normalizer *norm, const char *file, fsdp_err *err) {
    memset(a, 0, sizeof *a);
    static const char WORD[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
    if (fsdp_regex_compile(&a->word_char, WORD, sizeof WORD - 1, 0, "word characters", err)) return -1;
    a->tokens = fsdp_xcalloc((size_t)spec->num_added + 1, sizeof *a->tokens, "added tokens");
    fsdp_strmap contents = {0};
    fsdp_strmap_init(&contents, (size_t)spec->num_added);
    /* tokenizers' next id: the model's vocabulary size (its number of entries) */
    uint32_t next_id = (uint32_t)bpe->vocab.count;
    fsdp_regex_scratch x;
    fsdp_regex_scratch_init(&x);
    fsdp_spans spans = {0};
    fsdp_arena arena = {0};
    int rc = 0;
    for (int i = 0; i < spec->num_added && rc == 0; i++) {
        const fsdp_tj_added_token *t = &spec->added[i];
        if (t->content.n == 0) continue; /* tokenizers ignores empty contents */
        uint32_t id, prev;
        if (fsdp_strmap_get(&contents, t->content.s, t->content.n, &prev)) {
            rc = fsdp_errf(err, "%s: added_tokens[%d] repeats the content \"%s\" of added_tokens[%u]", file, i,
                           t->content.s, prev);
            break;
        }
        if (!fsdp_strmap_get(&bpe->vocab, t->content.s, t->content.n, &id)) id = next_id++;
        if (id != t->id) {
            rc = fsdp_errf(err, "%s: added_tokens[%d].id is %u but tokenizers gives \"%s\" the id %u", file, i, t->id,
                           t->content.s, id);
            break;
        }
        fsdp_strmap_put(&contents, t->content.s, t->content.n, (uint32_t)i);
        fsdp_added_entry *e = &a->tokens[a->num_tokens];
        e->spec = t;
        const char *pat = t->content.s;
        size_t pn = t->content.n;
        if (t->normalized) {
            fsdp_arena_reset(&arena);
            if (fsdp_normalize(norm, &x, &spans, &arena, t->content.s, t->content.n, &pat, &pn, err)) {
                rc = -1;
                break;
            }
        }
        e->pattern = fsdp_xmalloc(pn + 1, "added token");
        memcpy(e->pattern, pat, pn);
        e->pattern[pn] = 0;
        e->n = pn;
        if (id > a->max_id) a->max_id = id;
        a->num_tokens++;
    }
    fsdp_strmap_free(&contents);
    fsdp_regex_scratch_free(&x);
    free(spans.p);
    fsdp_arena_free(&arena);
    if (rc) return rc;
    a->id_index = fsdp_xmalloc(((size_t)a->max_id + 1) * sizeof *a->id_index, "added tokens");
    for (uint32_t i = 0; i <= a->max_id; i++) a->id_index[i] = -1;
    fsdp_strmap_init(&a->special, 16);
    /* special tokens first, then the others: the order of tokenizers' tries */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < a->num_tokens; i++) {
            const fsdp_added_entry *e = &a->tokens[i];
            if (e->spec->special != (pass == 0)) continue;
            a->id_index[e->spec->id] = i;
            if (e->spec->special) fsdp_strmap_put(&a->special, e->spec->content.s, e->spec->content.n, 1);
            if (e->n) trie_add(e->spec->normalized ? &a->normalized : &a->raw, e->pattern, e->n, i);
        }
    return 0;
}

void fsdp_added_tokens_free(fsdp_added_tokens *a) {
    for (int i = 0; i < a->num_tokens; i++) free(a->tokens[i].pattern);
    free(a->tokens);
    trie_free(&a->raw);
    trie_free(&a->normalized);
    free(a->id_index);
    fsdp_strmap_free(&a->special);
    if (a->word_char.code) fsdp_regex_free(&a->word_char);
    memset(a, 0, sizeof *a);
}

/* ---- matching ---------------------------------------------------------------------------------- */

static int is_word_char(const fsdp_added_tokens *a, fsdp_regex_scratch *x, const char *ch, size_t n) {
    fsdp_spans one = {0};
    fsdp_err ignored = {0};
    int word = fsdp_regex_find_all(&a->word_char, x, ch, n, &one, &ignored) == 0 && one.n > 0;
    free(one.p);
    return word;
}

/* Rust's \w$ on s[0..n) and ^\w on s[0..n). */
static int ends_with_word(const fsdp_added_tokens *a, fsdp_regex_scratch *x, const char *s, size_t n) {
    if (n == 0) return 0;
    size_t k = fsdp_utf8_last_start(s, n);
    return is_word_char(a, x, s + k, n - k);
}

static int starts_with_word(const fsdp_added_tokens *a, fsdp_regex_scratch *x, const char *s, size_t n) {
    return n > 0 && is_word_char(a, x, s, (size_t)fsdp_utf8_len((unsigned char)s[0]));
}

void fsdp_added_tokens_split(const fsdp_added_tokens *a, int normalized, fsdp_regex_scratch *x, const char *s,
                             size_t n, fsdp_pieces *out) {
    const fsdp_trie *t = normalized ? &a->normalized : &a->raw;
    size_t pos = 0, start_offset = 0, start, stop;
    int32_t token;
    while (pos < n && trie_find(t, s, n, pos, &start, &stop, &token)) {
        pos = stop;
        const fsdp_tj_added_token *spec = a->tokens[token].spec;
        if (spec->single_word) {
            int start_space = start == 0 || !ends_with_word(a, x, s, start);
            int stop_space = stop == n || !starts_with_word(a, x, s + stop, n - stop);
            if (!start_space || !stop_space) continue;
        }
        if (spec->lstrip) {
            size_t k = start;
            while (k > 0) {
                size_t c = fsdp_utf8_last_start(s, k);
                uint32_t cp;
                fsdp_utf8_decode(s + c, &cp);
                if (!fsdp_is_white_space(cp)) break;
                k = c;
            }
            start = k > start_offset ? k : start_offset;
        }
        if (spec->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int len = fsdp_utf8_decode(s + stop, &cp);
                if (!fsdp_is_white_space(cp)) break;
                stop += (size_t)len;
            }
        }
        if (start_offset < start) fsdp_pieces_push(out, s + start_offset, start - start_offset, -1);
        fsdp_pieces_push(out, s + start, stop > start ? stop - start : 0, (int32_t)spec->id);
        start_offset = stop;
    }
    if (start_offset < n) fsdp_pieces_push(out, s + start_offset, n - start_offset, -1);
}
