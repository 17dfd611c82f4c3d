/* The normalizers fsdp.c honours, applied in order to each stretch of text between added tokens (as
 * tokenizers does): the Unicode normalization forms NFC, NFD, NFKC and NFKD and Lowercase (Rust's
 * char::to_lowercase per character), both through base/utf8.h; Strip (White_Space at either end); Prepend (the text is
 * prefixed when it is not empty) and Replace (every match of a literal or a regex, leftmost and
 * non-overlapping, becomes the content). Llama 2's SentencePiece-style tokenizer is Prepend("▁") then
 * Replace(" " -> "▁"); Qwen's is NFC. */
#ifndef FSDP_TEXT_NORMALIZE_H
#define FSDP_TEXT_NORMALIZE_H

#include "../io/tokenizer_json.h"
#include "regex.h"
#include "textbuf.h"

typedef struct {
    const fsdp_tj_normalizer *spec;
    fsdp_regex re; /* Replace */
} fsdp_norm_step;

typedef struct {
    fsdp_norm_step *steps;
    int num_steps;
} fsdp_normalizer;

int fsdp_normalizer_init(fsdp_normalizer *z, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err);
void fsdp_normalizer_free(fsdp_normalizer *z);
/* Normalizes s[0..n); the result lives in `arena` (or is s itself when no step changes it). */
int fsdp_normalize(const fsdp_normalizer *z, fsdp_regex_scratch *x, fsdp_spans *spans, fsdp_arena *arena,
                   const char *s, size_t n, const char **out, size_t *out_n, fsdp_err *err);

#endif
