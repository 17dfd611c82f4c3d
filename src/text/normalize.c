/* Normalizers of normalize.h. */
#include "normalize.h"

#include <stdio.h>
#include <stdlib.h>

#include "../base/utf8.h"

int fsdp_normalizer_init(fsdp_normalizer *z, const fsdp_tokenizer_spec *spec, const char *file, fsdp_err *err) {
    z->num_steps = spec->num_normalizers;
    z->steps = fsdp_xcalloc((size_t)z->num_steps + 1, sizeof *z->steps, "normalizer");
    for (int i = 0; i < z->num_steps; i++) {
        const fsdp_tj_normalizer *n = &spec->normalizers[i];
        z->steps[i].spec = n;
        if (n->kind != FSDP_TJ_NORM_REPLACE) continue;
        char what[1200];
        snprintf(what, sizeof what, "%s: %s.pattern", file, n->field);
        if (fsdp_regex_compile(&z->steps[i].re, n->text.s, n->text.n, !n->regex, what, err)) return -1;
    }
    return 0;
}

void fsdp_normalizer_free(fsdp_normalizer *z) {
    for (int i = 0; i < z->num_steps; i++)
        if (z->steps[i].re.code) fsdp_regex_free(&z->steps[i].re);
    free(z->steps);
    z->steps = NULL, z->num_steps = 0;
}

int fsdp_normalize(const fsdp_normalizer *z, fsdp_regex_scratch *x, fsdp_spans *spans, fsdp_arena *arena,
                   const char *s, size_t n, const char **out, size_t *out_n, fsdp_err *err) {
    for (int i = 0; i < z->num_steps; i++) {
        const fsdp_tj_normalizer *spec = z->steps[i].spec;
        switch (spec->kind) {
        case FSDP_TJ_NORM_NFC:
        case FSDP_TJ_NORM_NFD:
        case FSDP_TJ_NORM_NFKC:
        case FSDP_TJ_NORM_NFKD: {
            fsdp_unicode_form form = spec->kind == FSDP_TJ_NORM_NFC   ? FSDP_UNICODE_NFC
                                     : spec->kind == FSDP_TJ_NORM_NFD ? FSDP_UNICODE_NFD
                                     : spec->kind == FSDP_TJ_NORM_NFKC ? FSDP_UNICODE_NFKC
                                                                       : FSDP_UNICODE_NFKD;
            char *norm;
            size_t len;
            int rc = fsdp_utf8_normalize(form, s, n, &norm, &len, err);
            if (rc < 0) return -1;
            if (rc == 0) continue;
            char *t = fsdp_arena_alloc(arena, len + 1);
            memcpy(t, norm, len);
            free(norm);
            s = t, n = len;
            continue;
        }
        case FSDP_TJ_NORM_LOWERCASE: {
            char *t = fsdp_arena_alloc(arena, 2 * n + 1);
            n = fsdp_utf8_lowercase(s, n, t);
            s = t;
            continue;
        }
        case FSDP_TJ_NORM_STRIP: {
            uint32_t cp;
            while (spec->strip_left && n > 0) {
                int len = fsdp_utf8_decode(s, &cp);
                if (!fsdp_is_white_space(cp)) break;
                s += len, n -= (size_t)len;
            }
            while (spec->strip_right && n > 0) {
                size_t last = fsdp_utf8_last_start(s, n);
                fsdp_utf8_decode(s + last, &cp);
                if (!fsdp_is_white_space(cp)) break;
                n = last;
            }
            continue;
        }
        default:
            break;
        }
        if (spec->kind == FSDP_TJ_NORM_PREPEND) {
            if (n == 0) continue;
            char *t = fsdp_arena_alloc(arena, spec->text.n + n);
            memcpy(t, spec->text.s, spec->text.n);
            memcpy(t + spec->text.n, s, n);
            s = t, n += spec->text.n;
            continue;
        }
        if (fsdp_regex_find_all(&z->steps[i].re, x, s, n, spans, err)) return -1;
        if (spans->n == 0) continue;
        size_t removed = 0;
        for (size_t k = 0; k < spans->n; k++) removed += spans->p[k].end - spans->p[k].start;
        size_t len = n - removed + spans->n * spec->content.n;
        char *t = fsdp_arena_alloc(arena, len + 1), *o = t;
        size_t prev = 0;
        for (size_t k = 0; k < spans->n; k++) {
            memcpy(o, s + prev, spans->p[k].start - prev);
            o += spans->p[k].start - prev;
            memcpy(o, spec->content.s, spec->content.n);
            o += spec->content.n;
            prev = spans->p[k].end;
        }
        memcpy(o, s + prev, n - prev);
        s = t, n = len;
    }
    *out = s, *out_n = n;
    return 0;
}
