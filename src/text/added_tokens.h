/* Added tokens (tokenizer.json's added_tokens: the special tokens and any others), found in the text
 * before pre-tokenization exactly as tokenizers' AddedVocabulary does: tokens with normalized=false
 * are matched on the raw text, then each stretch between them is normalized and the tokens with
 * normalized=true are matched, by their normalized content, on it. Matching is leftmost-longest and
 * non-overlapping (Aho-Corasick's LeftmostLongest); a single_word token is skipped when a word
 * character (Rust's \w) touches it; lstrip/rstrip take the whitespace beside it into the token.
 *
 * Ids follow tokenizers' AddedVocabulary::add_tokens (a content already in the vocabulary keeps its
 * id, others count up from the model's vocabulary size); a file whose ids disagree is refused, since
 * tokenizers would quietly use other ids than the file says.
 *
 * The byte trie is written here (leftmost-longest over a few hundred literals; PCRE2's alternation is
 * leftmost-first, not longest). */
#ifndef FSDP_TEXT_ADDED_TOKENS_H
#define FSDP_TEXT_ADDED_TOKENS_H

#include "../io/tokenizer_json.h"
#include "bpe.h"
#include "hashmap.h"
#include "normalize.h"
#include "regex.h"
#include "textbuf.h"

typedef struct {
    fsdp_u64map edges;  /* node << 8 | byte -> child */
    int32_t *terminal;  /* node -> index into the tokens, -1 */
    size_t num_nodes, cap_nodes;
    uint8_t first[256]; /* bytes that start some pattern */
} fsdp_trie;

typedef struct {
    const fsdp_tj_added_token *spec;
    char *pattern; /* content, or its normalized form for normalized tokens */
    size_t n;
} fsdp_added_entry;

typedef struct {
    fsdp_added_entry *tokens;
    int num_tokens;
    fsdp_trie raw, normalized;
    int32_t *id_index;    /* id -> token index (-1), for ids below max_id + 1 */
    uint32_t max_id;
    fsdp_strmap special;  /* contents of special tokens (decoding skips tokens whose text is one) */
    fsdp_regex word_char; /* Rust's \w: [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}] */
} fsdp_added_tokens;

int fsdp_added_tokens_init(fsdp_added_tokens *a, const fsdp_tokenizer_spec *spec, const fsdp_bpe *bpe,
                           const fsdp_normalizer *norm, const char *file, fsdp_err *err);
void fsdp_added_tokens_free(fsdp_added_tokens *a);
/* Cuts s[0..n) at the tokens of one trie (normalized: 0 raw, 1 normalized); appends pieces to out
 * (text pieces may be empty; the caller drops them). */
void fsdp_added_tokens_split(const fsdp_added_tokens *a, int normalized, fsdp_regex_scratch *x, const char *s,
                             size_t n, fsdp_pieces *out);
/* The added token of an id, or NULL. */
static inline const fsdp_added_entry *fsdp_added_token_of(const fsdp_added_tokens *a, uint32_t id) {
    return a->id_index && id <= a->max_id && a->id_index[id] >= 0 ? &a->tokens[a->id_index[id]] : NULL;
}

#endif
