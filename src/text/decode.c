/* The decoder chain of decode.h. */
#include "decode.h"

#include <stdio.h>
#include <stdlib.h>

#include "byte_level.h"
#include "../base/utf8.h"

int fsdp_decoder_init(fsdp_decoder *d, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err) {
    d->spec = spec;
    d->patterns = fsdp_xcalloc((size_t)spec->num_decoders + 1, sizeof *d->patterns, "decoder");
    for (int i = 0; i < spec->num_decoders; i++) {
        const fsdp_tj_decoder *s = &spec->decoders[i];
        if (s->kind != FSDP_TJ_DEC_REPLACE) continue;
        char what[1200];
        snprintf(what, sizeof what, "%s: %s.pattern", file, s->field);
        if (fsdp_regex_compile(&d->patterns[i], s->pattern.s, s->pattern.n, !s->regex, what, err)) return -1;
    }
    return 0;
}

void fsdp_decoder_free(fsdp_decoder *d) {
    for (int i = 0; d->patterns && i < d->spec->num_decoders; i++)
        if (d->patterns[i].code) fsdp_regex_free(&d->patterns[i]);
    free(d->patterns);
    d->patterns = NULL;
}

static void push_copy(fsdp_arena *arena, fsdp_pieces *out, const char *s, size_t n) {
    char *t = fsdp_arena_alloc(arena, n + 1);
    memcpy(t, s, n);
    fsdp_pieces_push(out, t, n, -1);
}

static int hex(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Rust's u8::from_str_radix(&token[3..5], 16) on "<0x??>": two hex digits, or '+' and one. */
static int fallback_byte(const fsdp_piece *p) {
    if (p->n != 6 || memcmp(p->s, "<0x", 3) || p->s[5] != '>') return -1;
    int a = hex(p->s[3]), b = hex(p->s[4]);
    if (p->s[3] == '+' && b >= 0) return b;
    return a >= 0 && b >= 0 ? a * 16 + b : -1;
}

static void flush_bytes(fsdp_arena *arena, fsdp_pieces *out, fsdp_buf *bytes) {
    if (!bytes->n) return;
    if (fsdp_utf8_invalid(bytes->p, bytes->n) == bytes->n) {
        push_copy(arena, out, bytes->p, bytes->n);
    } else {
        for (size_t i = 0; i < bytes->n; i++) push_copy(arena, out, "\xEF\xBF\xBD", 3);
    }
    bytes->n = 0;
}

static void strip(const fsdp_tj_decoder *s, fsdp_arena *arena, const fsdp_piece *p, fsdp_pieces *out) {
    size_t a = 0, b = p->n;
    for (int i = 0; i < s->start && a < b; i++) {
        uint32_t cp;
        int len = fsdp_utf8_decode(p->s + a, &cp);
        if (cp != s->strip_char) break;
        a += (size_t)len;
    }
    for (int i = 0; i < s->stop && b > a; i++) {
        size_t c = fsdp_utf8_last_start(p->s, b);
        uint32_t cp;
        fsdp_utf8_decode(p->s + c, &cp);
        if (cp != s->strip_char) break;
        b = c;
    }
    fsdp_pieces_push(out, p->s + a, b - a, -1);
}

static int step(const fsdp_decoder *d, int k, fsdp_regex_scratch *x, fsdp_arena *arena, const fsdp_pieces *in,
                fsdp_pieces *out, fsdp_err *err) {
    const fsdp_tj_decoder *s = &d->spec->decoders[k];
    fsdp_buf b = {0};
    int rc = 0;
    switch (s->kind) {
    case FSDP_TJ_DEC_BYTE_LEVEL: {
        fsdp_buf bytes = {0};
        for (size_t i = 0; i < in->n; i++) fsdp_byte_level_decode_token(in->p[i].s, in->p[i].n, &bytes);
        fsdp_buf_reserve(&b, 3 * bytes.n + 1);
        b.n = fsdp_utf8_lossy(bytes.p ? bytes.p : "", bytes.n, b.p);
        push_copy(arena, out, b.p, b.n);
        fsdp_buf_free(&bytes);
        break;
    }
    case FSDP_TJ_DEC_FUSE:
        for (size_t i = 0; i < in->n; i++) fsdp_buf_add(&b, in->p[i].s, in->p[i].n);
        push_copy(arena, out, b.p ? b.p : "", b.n);
        break;
    case FSDP_TJ_DEC_BYTE_FALLBACK:
        for (size_t i = 0; i < in->n; i++) {
            int byte = fallback_byte(&in->p[i]);
            if (byte >= 0) {
                fsdp_buf_addc(&b, (char)byte);
                continue;
            }
            flush_bytes(arena, out, &b);
            fsdp_pieces_push(out, in->p[i].s, in->p[i].n, -1);
        }
        flush_bytes(arena, out, &b);
        break;
    case FSDP_TJ_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) strip(s, arena, &in->p[i], out);
        break;
    case FSDP_TJ_DEC_REPLACE: {
        fsdp_spans spans = {0};
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            const fsdp_piece *p = &in->p[i];
            rc = fsdp_regex_find_all(&d->patterns[k], x, p->s, p->n, &spans, err);
            b.n = 0;
            size_t prev = 0;
            for (size_t m = 0; rc == 0 && m < spans.n; m++) {
                fsdp_buf_add(&b, p->s + prev, spans.p[m].start - prev);
                fsdp_buf_add(&b, s->content.s, s->content.n);
                prev = spans.p[m].end;
            }
            fsdp_buf_add(&b, p->s + prev, p->n - prev);
            push_copy(arena, out, b.p, b.n);
        }
        free(spans.p);
        break;
    }
    }
    fsdp_buf_free(&b);
    return rc;
}

int fsdp_decoder_run(const fsdp_decoder *d, fsdp_regex_scratch *x, fsdp_arena *arena, fsdp_pieces *tokens,
                     fsdp_pieces *tmp, fsdp_buf *out, fsdp_err *err) {
    const fsdp_tokenizer_spec *spec = d->spec;
    for (int k = 0; k < spec->num_decoders; k++) {
        tmp->n = 0;
        if (step(d, k, x, arena, tokens, tmp, err)) return -1;
        fsdp_pieces swap = *tokens;
        *tokens = *tmp;
        *tmp = swap;
    }
    for (size_t i = 0; i < tokens->n; i++) {
        if (!spec->has_decoder && i > 0) fsdp_buf_addc(out, ' ');
        fsdp_buf_add(out, tokens->p[i].s, tokens->p[i].n);
    }
    if (!out->p) fsdp_buf_reserve(out, 1), out->p[0] = 0;
    return 0;
}
