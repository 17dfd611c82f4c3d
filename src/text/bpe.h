/* The BPE model of tokenizers: a word (one pre-tokenized piece) becomes its characters' ids, then
 * the pair of neighbours with the lowest merge rank (the leftmost among equals) is merged until no
 * pair has a merge. Characters missing from the vocabulary become <0xNN> byte tokens when
 * byte_fallback is set, else the unk token (consecutive ones fused into one with fuse_unk), else
 * nothing. With ignore_merges, a word that is itself in the vocabulary is that one token.
 *
 * Written by hand (no library does BPE): a hash map for the vocabulary and the merges, a binary heap
 * over a linked list of symbols for the merges (O(n log n) per word, the order tokenizers' Word uses:
 * rank, then position, stale entries skipped), and a per-thread cache of words already seen. */
#ifndef FSDP_TEXT_BPE_H
#define FSDP_TEXT_BPE_H

#include <stdint.h>

#include "../io/tokenizer_json.h"
#include "hashmap.h"
#include "textbuf.h"

typedef struct {
    fsdp_strmap vocab;        /* token -> id (keys borrow the spec's strings) */
    fsdp_u64map merges;       /* (left << 32 | right) -> (rank << 32 | merged id) */
    const fsdp_tj_str *tokens; /* id -> token */
    uint32_t vocab_size;
    int has_unk, fuse_unk, byte_fallback, ignore_merges;
    uint32_t unk_id;
    int32_t byte_token[256];  /* id of <0xNN>, -1 when absent */
    int32_t small_char[0x800]; /* id of the one-character token of each code point below U+0800, -1 when absent */
} fsdp_bpe;

/* Per-thread scratch and cache. */
typedef struct {
    fsdp_strmap cache;        /* word -> index into entries */
    fsdp_arena cache_text;
    fsdp_ids cache_ids;
    uint64_t *entries;        /* offset << 16 | count into cache_ids */
    size_t num_entries, cap_entries;
    struct fsdp_bpe_symbol *symbols;
    struct fsdp_bpe_merge *heap;
    size_t cap;
} fsdp_bpe_state;

/* `file` names the tokenizer in messages. */
int fsdp_bpe_init(fsdp_bpe *b, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err);
void fsdp_bpe_free(fsdp_bpe *b);
void fsdp_bpe_state_free(fsdp_bpe_state *s);
/* Appends the ids of one word (valid UTF-8, n > 0) to out. */
void fsdp_bpe_word(const fsdp_bpe *b, fsdp_bpe_state *s, const char *word, size_t n, fsdp_ids *out);

#endif
