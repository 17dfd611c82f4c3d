/* The pre-tokenizers fsdp.c honours, applied in order to each piece of text that is not an added
 * token, as tokenizers' PreTokenizedString::split does (empty pieces are dropped):
 *  - Split: a literal or a regex (regex.h) cuts the piece; the matches are Removed, Isolated,
 *    MergedWithPrevious, MergedWithNext or Contiguous, optionally after inverting which parts count as
 *    matches;
 *  - ByteLevel: a space is prefixed when add_prefix_space is set and the piece does not start with
 *    one; with use_regex the piece is cut by GPT-2's regex (Isolated); every byte then becomes its
 *    byte-level character (byte_level.h). */
#ifndef FSDP_TEXT_PRETOKENIZE_H
#define FSDP_TEXT_PRETOKENIZE_H

#include "../io/tokenizer_json.h"
#include "regex.h"
#include "textbuf.h"

typedef struct {
    const fsdp_tj_pretokenizer *spec;
    fsdp_regex re; /* Split's pattern, or GPT-2's for a ByteLevel with use_regex */
} fsdp_pretok_step;

typedef struct {
    fsdp_pretok_step *steps;
    int num_steps;
} fsdp_pretokenizer;

/* Per-thread scratch. */
typedef struct {
    fsdp_spans matches;
    struct fsdp_pretok_segment *segs;
    size_t cap_segs;
    fsdp_pieces tmp;
} fsdp_pretok_scratch;

int fsdp_pretokenizer_init(fsdp_pretokenizer *p, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err);
void fsdp_pretokenizer_free(fsdp_pretokenizer *p);
void fsdp_pretok_scratch_free(fsdp_pretok_scratch *s);
/* Runs every step over `pieces` (added-token pieces pass unchanged); new text lives in `arena`. */
int fsdp_pretokenize(const fsdp_pretokenizer *p, fsdp_regex_scratch *x, fsdp_pretok_scratch *s, fsdp_arena *arena,
                     fsdp_pieces *pieces, fsdp_err *err);

#endif
