/* The tokenizer's regular expressions through PCRE2 (UTF and Unicode-property mode, JIT): the
 * Split pre-tokenizer's pattern, ByteLevel's GPT-2 pattern, Replace patterns. tokenizers runs them
 * with Oniguruma; both are backtracking engines with the same leftmost-first alternation and the
 * same Unicode classes for what tokenizer patterns use (\s, \p{L}, \p{N}, (?i:...), (?!\S)), which
 * the parity test checks line by line (tests/scripts/tokenizer_parity.py), U+0085 and U+2028 included.
 *
 * A compiled fsdp_regex is shared by every thread; each thread matches with its own scratch. */
#ifndef FSDP_TEXT_REGEX_H
#define FSDP_TEXT_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

typedef struct {
    void *code; /* pcre2_code_8 */
} fsdp_regex;

typedef struct {
    void *match_data, *context, *jit_stack;
} fsdp_regex_scratch;

/* A match [start, end) in bytes. */
typedef struct {
    uint32_t start, end;
} fsdp_span;

typedef struct {
    fsdp_span *p;
    size_t n, cap;
} fsdp_spans;

/* literal: the pattern is a string to find as it is ({"String": ...}). On failure err names `what`
 * (the file and field) and PCRE2's message and offset. */
int fsdp_regex_compile(fsdp_regex *r, const char *pattern, size_t n, int literal, const char *what, fsdp_err *err);
void fsdp_regex_free(fsdp_regex *r);
void fsdp_regex_scratch_init(fsdp_regex_scratch *x);
void fsdp_regex_scratch_free(fsdp_regex_scratch *x);

/* Every match in s[0..n) (valid UTF-8) the way tokenizers' find_iter walks them: leftmost,
 * non-overlapping, the search after an empty match starting one character later and an empty match
 * right where the previous match ended skipped. Replaces out's content. -1 with err when PCRE2 fails
 * (a resource limit). */
int fsdp_regex_find_all(const fsdp_regex *r, fsdp_regex_scratch *x, const char *s, size_t n, fsdp_spans *out,
                        fsdp_err *err);

#endif
