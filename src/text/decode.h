/* Decoding: ids -> token strings -> the decoder chain of tokenizer.json, as tokenizers'
 * Tokenizer::decode does it. Each step maps a list of strings to a list of strings:
 *  - ByteLevel: all tokens' byte-level characters back to bytes (a token with a character outside the
 *    alphabet gives its own bytes), then one string, invalid UTF-8 replaced (from_utf8_lossy);
 *  - Replace: every match of the pattern in each token becomes the content;
 *  - ByteFallback: runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
 *    U+FFFD per byte;
 *  - Fuse: one string; Strip: up to `start` leading and `stop` trailing copies of a character removed.
 * The strings are then concatenated; without a decoder they are joined by spaces. */
#ifndef FSDP_TEXT_DECODE_H
#define FSDP_TEXT_DECODE_H

#include "../io/tokenizer_json.h"
#include "regex.h"
#include "textbuf.h"

typedef struct {
    const fsdp_tokenizer_spec *spec;
    fsdp_regex *patterns; /* per decoder step: Replace's pattern */
} fsdp_decoder;

int fsdp_decoder_init(fsdp_decoder *d, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err);
void fsdp_decoder_free(fsdp_decoder *d);
/* Runs the chain over `tokens` (text pieces in `arena`) and appends the text to out. */
int fsdp_decoder_run(const fsdp_decoder *d, fsdp_regex_scratch *x, fsdp_arena *arena, fsdp_pieces *tokens,
                     fsdp_pieces *tmp, fsdp_buf *out, fsdp_err *err);

#endif
