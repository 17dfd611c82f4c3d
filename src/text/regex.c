/* PCRE2 wrapper of regex.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"

int fsdp_regex_compile(fsdp_regex *r, const char *pattern, size_t n, int literal, const char *what, fsdp_err *err) {
    r->code = NULL;
    int code;
    PCRE2_SIZE offset;
    uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, n, options, &code, &offset, NULL);
    if (!c) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return fsdp_errf(err, "%s: the regex does not compile (PCRE2 at offset %zu: %s)", what, (size_t)offset,
                         (const char *)msg);
    }
    /* Without JIT (a platform PCRE2 lacks it for) matching falls back to the interpreter: same results. */
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    r->code = c;
    return 0;
}

void fsdp_regex_free(fsdp_regex *r) {
    pcre2_code_free((pcre2_code *)r->code);
    r->code = NULL;
}

void fsdp_regex_scratch_init(fsdp_regex_scratch *x) {
    x->match_data = pcre2_match_data_create(1, NULL);
    x->context = pcre2_match_context_create(NULL);
    /* long runs of spaces backtrack deeply in \s+(?!\S): a stack up to 64 MiB, grown on demand */
    x->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
    if (!x->match_data || !x->context || !x->jit_stack) fsdp_fatal("out of host memory (PCRE2 match data)");
    pcre2_jit_stack_assign((pcre2_match_context *)x->context, NULL, x->jit_stack);
}

void fsdp_regex_scratch_free(fsdp_regex_scratch *x) {
    pcre2_match_data_free((pcre2_match_data *)x->match_data);
    pcre2_match_context_free((pcre2_match_context *)x->context);
    pcre2_jit_stack_free((pcre2_jit_stack *)x->jit_stack);
    memset(x, 0, sizeof *x);
}

static void push(fsdp_spans *o, size_t s, size_t e) {
    FSDP_GROW(o->p, o->n, o->cap, 64, "the regex matches");
    o->p[o->n].start = (uint32_t)s, o->p[o->n].end = (uint32_t)e;
    o->n++;
}

int fsdp_regex_find_all(const fsdp_regex *r, fsdp_regex_scratch *x, const char *s, size_t n, fsdp_spans *out,
                        fsdp_err *err) {
    out->n = 0;
    pcre2_match_data *md = (pcre2_match_data *)x->match_data;
    const pcre2_code *code = (const pcre2_code *)r->code;
    size_t pos = 0, last_match = (size_t)-1;
    while (pos <= n) {
        int rc = pcre2_match(code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, (pcre2_match_context *)x->context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fsdp_errf(err, "regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a == b) {
            pos = b < n ? b + (size_t)fsdp_utf8_len((unsigned char)s[b]) : b + 1;
            if (b == last_match) continue;
        } else {
            pos = b;
        }
        last_match = b;
        push(out, a, b);
    }
    return 0;
}
