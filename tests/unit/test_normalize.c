/* The Unicode operations of base/utf8.h and the normalizers of text/normalize.h on hand-written cases
 * whose answers come from the Unicode standard (and tokenizers' Lowercase, Rust's char::to_lowercase per
 * character): the four normalization forms (composition, canonical ordering of combining marks, Hangul,
 * compatibility characters, singletons), lowercase's special cases (dotted I; no final sigma, which
 * tokenizers does not apply), the lossy conversion,
 * and a normalizer Sequence (NFKC, Lowercase, Strip) as a tokenizer.json gives it. */
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "check.h"
#include "text/normalize.h"

static void form(fsdp_unicode_form f, const char *name, const char *in, const char *want) {
    char *out = NULL;
    size_t n = 0;
    fsdp_err err = {0};
    int rc = fsdp_utf8_normalize(f, in, strlen(in), &out, &n, &err);
    const char *got = rc == 1 ? out : in;
    size_t got_n = rc == 1 ? n : strlen(in);
    check_that(rc >= 0 && got_n == strlen(want) && !memcmp(got, want, got_n), "%s(%s) = %.*s", name, in, (int)got_n,
               got);
    free(out);
}

static void lower(const char *in, const char *want) {
    char out[256];
    size_t n = fsdp_utf8_lowercase(in, strlen(in), out);
    check_that(n == strlen(want) && !memcmp(out, want, n), "lowercase(%s) = %.*s (want %s)", in, (int)n, out, want);
}

int main(void) {
    /* composition and decomposition */
    form(FSDP_UNICODE_NFC, "NFC", "e\xCC\x81", "\xC3\xA9");                       /* e + U+0301 -> é */
    form(FSDP_UNICODE_NFD, "NFD", "\xC3\xA9", "e\xCC\x81");                       /* é -> e + U+0301 */
    form(FSDP_UNICODE_NFD, "NFD", "q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87");      /* marks in canonical order */
    form(FSDP_UNICODE_NFC, "NFC", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C"); /* jamo -> 한 */
    form(FSDP_UNICODE_NFD, "NFD", "\xED\x95\x9C", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");
    form(FSDP_UNICODE_NFC, "NFC", "\xE2\x84\xAB", "\xC3\x85");                    /* angstrom sign -> Å */
    form(FSDP_UNICODE_NFC, "NFC", "\xEF\xAC\x81", "\xEF\xAC\x81");                /* ﬁ is canonical */
    /* compatibility */
    form(FSDP_UNICODE_NFKC, "NFKC", "\xEF\xAC\x81ne", "fine");                    /* ﬁ ligature */
    form(FSDP_UNICODE_NFKC, "NFKC", "\xEF\xBC\xA1\xEF\xBC\x91", "A1");            /* full-width */
    form(FSDP_UNICODE_NFKC, "NFKC", "\xE2\x91\xA0 x\xC2\xB2", "1 x2");            /* circled one, superscript */
    form(FSDP_UNICODE_NFKC, "NFKC", "\xEF\xBE\x8A\xEF\xBE\x9F", "\xE3\x83\x91");  /* half-width ﾊﾟ -> パ */
    form(FSDP_UNICODE_NFKD, "NFKD", "\xE3\x83\x91", "\xE3\x83\x8F\xE3\x82\x9A");  /* パ -> ハ + U+309A */
    form(FSDP_UNICODE_NFKD, "NFKD", "\xC7\x85", "Dz\xCC\x8C");                  /* U+01C5 -> D z U+030C */
    form(FSDP_UNICODE_NFKC, "NFKC", "plain ASCII", "plain ASCII");
    /* ASCII is answered without utf8proc */
    char *out = NULL;
    size_t n;
    fsdp_err err = {0};
    CHECK(fsdp_utf8_normalize(FSDP_UNICODE_NFC, "abc", 3, &out, &n, &err) == 0 && out == NULL);

    /* tokenizers' Lowercase */
    lower("HeLLo", "hello");
    lower("\xC4\xB0stanbul", "i\xCC\x87stanbul");                                /* İ -> i + U+0307 */
    lower("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3", "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x83"); /* ΟΔΟΣ -> οδοσ (no final ς) */
    lower("\xCE\xA3", "\xCF\x83");                                               /* Σ alone -> σ */
    lower("\xCE\xA3.\xCE\xA3", "\xCF\x83.\xCF\x83");                             /* σ.σ */
    lower("\xCE\x91\xCE\xA3'\xCE\xA3", "\xCE\xB1\xCF\x83'\xCF\x83");             /* ΑΣ'Σ -> ασ'σ */
    lower("\xCE\xA3\xCE\x91 \xCE\xA3", "\xCF\x83\xCE\xB1 \xCF\x83");             /* ΣΑ Σ -> σα σ */
    lower("\xC8\xBA\xE2\x84\xAA", "\xE2\xB1\xA5k");                              /* Ⱥ grows, Kelvin sign -> k */

    /* lossy */
    char buf[64];
    n = fsdp_utf8_lossy("a\xFF" "b\xE2\x82", 5, buf);
    check_that(n == 8 && !memcmp(buf, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8), "lossy: one U+FFFD per maximal subpart");
    CHECK(fsdp_utf8_invalid("ok\xC3\xA9\xED\xA0\x80", 7) == 4); /* a surrogate is invalid */

    /* a normalizer Sequence: NFKC, Lowercase, Strip both ends */
    fsdp_tj_normalizer steps[3] = {{.kind = FSDP_TJ_NORM_NFKC}, {.kind = FSDP_TJ_NORM_LOWERCASE},
                                   {.kind = FSDP_TJ_NORM_STRIP, .strip_left = 1, .strip_right = 1}};
    fsdp_tokenizer_spec spec = {0};
    spec.normalizers = steps;
    spec.num_normalizers = 3;
    fsdp_normalizer z;
    fsdp_err e = {0};
    CHECK(fsdp_normalizer_init(&z, &spec, "test", &e) == 0);
    fsdp_regex_scratch x;
    fsdp_regex_scratch_init(&x);
    fsdp_spans spans = {0};
    fsdp_arena arena = {0};
    const char *in = "\xE3\x80\x80 \xEF\xAC\x81NE \xCE\x9F\xCE\xA3\t\n", *res;
    size_t len;
    CHECK(fsdp_normalize(&z, &x, &spans, &arena, in, strlen(in), &res, &len, &e) == 0);
    check_that(len == 9 && !memcmp(res, "fine \xCE\xBF\xCF\x83", 9), "NFKC, Lowercase, Strip: %.*s", (int)len, res);
    fsdp_normalizer_free(&z);
    fsdp_regex_scratch_free(&x);
    free(spans.p);
    fsdp_arena_free(&arena);
    return check_summary("test_normalize");
}
