/* Incremental decoding (stream.h). */
#include "stream.h"

#include <string.h>

/* Tokens of the prompt kept as context of the first new token's decode. */
#define STREAM_CONTEXT 5

void fsdp_text_stream_init(fsdp_text_stream *s, const fsdp_tokenizer *tok, const uint32_t *context, size_t n,
                           int skip_special_tokens) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->state = fsdp_tokenizer_state_new(tok);
    s->skip_special = skip_special_tokens;
    for (size_t i = 0; i < n; i++) fsdp_ids_push(&s->ids, context[i]);
    s->read_offset = n;
    s->prefix_offset = n > STREAM_CONTEXT ? n - STREAM_CONTEXT : 0;
}

static int decode(fsdp_text_stream *s, size_t from, size_t to, fsdp_buf *out, fsdp_err *err) {
    out->n = 0;
    fsdp_buf_reserve(out, 1);
    out->p[0] = 0;
    return fsdp_tokenizer_decode(s->tok, s->state, s->ids.p + from, to - from, s->skip_special, out, err);
}

static int ends_with_replacement(const fsdp_buf *b) {
    return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3);
}

/* Emits full - prefix when it is final (or when `force`), and moves the window. */
static int emit(fsdp_text_stream *s, fsdp_buf *out, int force, fsdp_err *err) {
    if (decode(s, s->prefix_offset, s->read_offset, &s->prefix, err) ||
        decode(s, s->prefix_offset, s->ids.n, &s->full, err))
        return -1;
    if (!force && (s->full.n <= s->prefix.n || ends_with_replacement(&s->full))) return 0;
    if (s->full.n > s->prefix.n) fsdp_buf_add(out, s->full.p + s->prefix.n, s->full.n - s->prefix.n);
    s->prefix_offset = s->read_offset;
    s->read_offset = s->ids.n;
    return 0;
}

int fsdp_text_stream_push(fsdp_text_stream *s, uint32_t id, fsdp_buf *out, fsdp_err *err) {
    fsdp_ids_push(&s->ids, id);
    return emit(s, out, 0, err);
}

int fsdp_text_stream_finish(fsdp_text_stream *s, fsdp_buf *out, fsdp_err *err) {
    if (s->read_offset == s->ids.n) return 0;
    return emit(s, out, 1, err);
}

void fsdp_text_stream_free(fsdp_text_stream *s) {
    fsdp_tokenizer_state_free(s->state);
    fsdp_ids_free(&s->ids);
    fsdp_buf_free(&s->prefix);
    fsdp_buf_free(&s->full);
    memset(s, 0, sizeof *s);
}
