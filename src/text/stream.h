/* Text of a growing id sequence, as it is generated: each new id gives the text that it completed,
 * and text is held back while it cannot be final yet — while the decoded tail ends in U+FFFD (a
 * multi-byte character whose remaining bytes are still to come, in byte-level or byte-fallback
 * tokens). What is emitted is the difference between the decodes of a short window of ids before
 * and after the new ones, the method of Hugging Face's text-generation-inference: decoders that
 * look at neighbouring tokens (SentencePiece's leading-space strip, byte fusion) see the same
 * context in both decodes, so the pieces concatenate to the decode of the whole continuation, and
 * each token costs a decode of a few ids rather than of everything so far. */
#ifndef FSDP_TEXT_STREAM_H
#define FSDP_TEXT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "textbuf.h"
#include "tokenizer.h"

typedef struct {
    const fsdp_tokenizer *tok;
    fsdp_tokenizer_state *state;
    fsdp_ids ids;                 /* the context (the prompt's) and every id pushed */
    size_t prefix_offset, read_offset;
    int skip_special;
    fsdp_buf prefix, full;
} fsdp_text_stream;

/* The stream starts after `context` (the prompt's ids), whose text is not emitted. */
void fsdp_text_stream_init(fsdp_text_stream *s, const fsdp_tokenizer *tok, const uint32_t *context, size_t n,
                           int skip_special_tokens);
/* Appends the text that `id` made final to out (possibly nothing). */
int fsdp_text_stream_push(fsdp_text_stream *s, uint32_t id, fsdp_buf *out, fsdp_err *err);
/* Appends what is still held back (at the end of generation). */
int fsdp_text_stream_finish(fsdp_text_stream *s, fsdp_buf *out, fsdp_err *err);
void fsdp_text_stream_free(fsdp_text_stream *s);

#endif
