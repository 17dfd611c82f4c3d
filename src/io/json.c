/* The JSON reader (recursive descent into an fsdp_json tree), the string builder used to write JSON,
 * and fsdp_read_file. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

/* Deep enough for any real config, shallow enough that the recursion cannot exhaust the stack. */
#define JSON_MAX_DEPTH 256

typedef struct {
    const char *p, *end;
    const char *line_start;
    int line;
    char *errbuf;
    size_t errcap;
    int failed;
} parser;

static void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fsdp_fatal("out of host memory growing a JSON buffer to %zu bytes", bytes);
    return q;
}

/* Records the first error only: later ones are consequences of it. The column counts bytes. */
static void fail_at(parser *ps, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(parser *ps, const char *at, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    if (!ps->errbuf || !ps->errcap) return;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(ps->errbuf, ps->errcap, "line %d, column %d: %s", ps->line, (int)(at - ps->line_start) + 1, what);
}

/* Names the offending byte in messages: printable ASCII as itself, anything else as hex. */
static void describe_byte(char *out, size_t cap, const char *at, const char *end) {
    if (at >= end) {
        snprintf(out, cap, "end of input");
        return;
    }
    unsigned char c = (unsigned char)*at;
    if (c >= 0x20 && c < 0x7f)
        snprintf(out, cap, "'%c'", c);
    else
        snprintf(out, cap, "byte 0x%02x", c);
}

static void unexpected(parser *ps, const char *expected) {
    char got[32];
    describe_byte(got, sizeof got, ps->p, ps->end);
    if (ps->p >= ps->end)
        fail_at(ps, ps->p, "unexpected end of input, expected %s", expected);
    else
        fail_at(ps, ps->p, "expected %s, found %s", expected, got);
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->line_start = ps->p + 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            return;
        }
        ps->p++;
    }
}

static int parse_value(parser *ps, fsdp_json *out, int depth);

static int parse_literal(parser *ps, fsdp_json *out) {
    static const struct {
        const char *word;
        fsdp_json_type type;
        int boolean;
    } lits[] = {{"true", FSDP_JSON_BOOL, 1}, {"false", FSDP_JSON_BOOL, 0}, {"null", FSDP_JSON_NULL, 0}};
    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        size_t n = strlen(lits[i].word);
        if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, lits[i].word, n)) {
            out->type = lits[i].type;
            out->boolean = lits[i].boolean;
            ps->p += n;
            return 0;
        }
    }
    fail_at(ps, ps->p, "invalid literal (expected true, false or null)");
    return -1;
}

static int is_digit(const char *p, const char *end) { return p < end && *p >= '0' && *p <= '9'; }

/* Checks the RFC 8259 number grammar first: strtod alone would also accept "0x1p3", "inf", "+1". */
static int parse_number(parser *ps, fsdp_json *out) {
    const char *s = ps->p, *q = s, *end = ps->end;
    if (q < end && *q == '-') q++;
    if (!is_digit(q, end)) {
        fail_at(ps, q, "invalid number: expected a digit");
        return -1;
    }
    if (*q == '0') {
        q++;
        if (is_digit(q, end)) {
            fail_at(ps, q, "invalid number: leading zero");
            return -1;
        }
    } else {
        while (is_digit(q, end)) q++;
    }
    if (q < end && *q == '.') {
        q++;
        if (!is_digit(q, end)) {
            fail_at(ps, q, "invalid number: expected a digit after '.'");
            return -1;
        }
        while (is_digit(q, end)) q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (!is_digit(q, end)) {
            fail_at(ps, q, "invalid number: expected a digit in the exponent");
            return -1;
        }
        while (is_digit(q, end)) q++;
    }
    size_t n = (size_t)(q - s);
    char *text = fsdp_xmalloc(n + 1, "a JSON number");
    memcpy(text, s, n);
    text[n] = 0;
    double x = strtod(text, NULL);
    if (isinf(x)) {
        free(text);
        fail_at(ps, s, "number out of range");
        return -1;
    }
    out->type = FSDP_JSON_NUMBER;
    out->number = x;
    out->string = text; /* the original text, so callers can tell 8192 from 8192.5 or print it back */
    ps->p = q;
    return 0;
}

static int hex4(const char *p, const char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(unsigned cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the well-formed UTF-8 sequence at p (no overlongs, surrogates or code points past
 * U+10FFFF), or 0. */
static size_t utf8_valid(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n;
    unsigned cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* Decodes one \u escape (p points at the 'u'), joining a surrogate pair; advances *pp past it. */
static int parse_unicode_escape(parser *ps, const char **pp, unsigned *cp) {
    const char *p = *pp;
    unsigned hi, lo;
    if (hex4(p + 1, ps->end, &hi)) {
        fail_at(ps, p - 1, "invalid \\u escape: expected four hex digits");
        return -1;
    }
    p += 5;
    if (hi >= 0xDC00 && hi <= 0xDFFF) {
        fail_at(ps, *pp - 1, "invalid \\u escape: unpaired low surrogate \\u%04X", hi);
        return -1;
    }
    if (hi >= 0xD800 && hi <= 0xDBFF) {
        if (ps->end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, ps->end, &lo) || lo < 0xDC00 ||
            lo > 0xDFFF) {
            fail_at(ps, *pp - 1, "invalid \\u escape: high surrogate \\u%04X is not followed by a low surrogate", hi);
            return -1;
        }
        hi = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
    }
    if (hi == 0) {
        fail_at(ps, *pp - 1, "\\u0000 is not supported (strings are NUL-terminated)");
        return -1;
    }
    *cp = hi;
    *pp = p;
    return 0;
}

/* Parses a string at ps->p (the opening quote) into a malloc'ed NUL-terminated buffer. Decoded text
 * is never longer than its source, so one allocation of the source length suffices. */
static char *parse_string(parser *ps) {
    const char *p = ps->p + 1, *end = ps->end, *close = p;
    while (close < end && *close != '"') close += (*close == '\\' && close + 1 < end) ? 2 : 1;
    char *out = fsdp_xmalloc((size_t)(close - p) + 1, "a JSON string"), *o = out;
    for (;;) {
        if (p >= end) {
            fail_at(ps, p, "unterminated string");
            break;
        }
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            *o = 0;
            ps->p = p + 1;
            return out;
        }
        if (c < 0x20) {
            fail_at(ps, p, "control character (byte 0x%02x) in a string; escape it", c);
            break;
        }
        if (c == '\\') {
            if (p + 1 >= end) {
                fail_at(ps, p + 1, "unterminated string");
                break;
            }
            char e = p[1];
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) {
                static const char decoded[] = "\"\\/\b\f\n\r\t";
                *o++ = decoded[simple - "\"\\/bfnrt"];
                p += 2;
            } else if (e == 'u') {
                unsigned cp;
                p++;
                if (parse_unicode_escape(ps, &p, &cp)) break;
                o += utf8_encode(cp, o);
            } else {
                char got[32];
                describe_byte(got, sizeof got, p + 1, end);
                fail_at(ps, p, "invalid escape \\ followed by %s", got);
                break;
            }
            continue;
        }
        size_t n = utf8_valid((const unsigned char *)p, (const unsigned char *)end);
        if (!n) {
            fail_at(ps, p, "invalid UTF-8 (byte 0x%02x)", c);
            break;
        }
        memcpy(o, p, n);
        o += n;
        p += n;
    }
    free(out);
    return NULL;
}

static void free_contents(fsdp_json *v) {
    if (v->type == FSDP_JSON_ARRAY || v->type == FSDP_JSON_OBJECT) {
        for (int i = 0; i < v->count; i++) {
            free_contents(&v->items[i]);
            if (v->keys) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    free(v->string);
    memset(v, 0, sizeof *v);
}

/* Appends a slot to an array or object, growing geometrically. */
static fsdp_json *push_item(fsdp_json *v, int *cap, char *key) {
    if (v->count == *cap) {
        *cap = *cap ? 2 * *cap : 4;
        v->items = xrealloc(v->items, (size_t)*cap * sizeof *v->items);
        if (v->type == FSDP_JSON_OBJECT) v->keys = xrealloc(v->keys, (size_t)*cap * sizeof *v->keys);
    }
    if (v->type == FSDP_JSON_OBJECT) v->keys[v->count] = key;
    fsdp_json *slot = &v->items[v->count++];
    memset(slot, 0, sizeof *slot);
    return slot;
}

/* Arrays and objects share one loop: `open` has been consumed, items are separated by ',' and the
 * container ends with `close`. */
static int parse_container(parser *ps, fsdp_json *out, int depth, int is_object) {
    char close = is_object ? '}' : ']';
    int cap = 0;
    out->type = is_object ? FSDP_JSON_OBJECT : FSDP_JSON_ARRAY;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        if (is_object) {
            if (ps->p >= ps->end || *ps->p != '"') {
                unexpected(ps, out->count == 0 ? "a string key or '}'" : "a string key");
                return -1;
            }
            if (!(key = parse_string(ps))) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(key);
                unexpected(ps, "':'");
                return -1;
            }
            ps->p++;
            skip_ws(ps);
        }
        if (parse_value(ps, push_item(out, &cap, key), depth + 1)) return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_ws(ps);
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 0;
        }
        unexpected(ps, is_object ? "',' or '}'" : "',' or ']'");
        return -1;
    }
}

static int parse_value(parser *ps, fsdp_json *out, int depth) {
    if (depth > JSON_MAX_DEPTH) {
        fail_at(ps, ps->p, "nesting deeper than %d levels", JSON_MAX_DEPTH);
        return -1;
    }
    if (ps->p >= ps->end) {
        unexpected(ps, "a value");
        return -1;
    }
    char c = *ps->p;
    if (c == '{' || c == '[') return parse_container(ps, out, depth, c == '{');
    if (c == '"') {
        out->type = FSDP_JSON_STRING;
        out->string = parse_string(ps);
        return out->string ? 0 : -1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, out);
    if (c == 't' || c == 'f' || c == 'n') return parse_literal(ps, out);
    unexpected(ps, "a value");
    return -1;
}

fsdp_json *fsdp_json_parse(const char *text, size_t len, char *errbuf, size_t errcap) {
    parser ps = {.p = text, .end = text + len, .line_start = text, .line = 1, .errbuf = errbuf, .errcap = errcap};
    if (errbuf && errcap) errbuf[0] = 0;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) ps.p += 3, ps.line_start = ps.p; /* editors' BOM */
    fsdp_json *root = fsdp_xcalloc(1, sizeof *root, "a JSON value");
    skip_ws(&ps);
    if (parse_value(&ps, root, 1) == 0) {
        skip_ws(&ps);
        if (ps.p == ps.end) return root;
        char got[32];
        describe_byte(got, sizeof got, ps.p, ps.end);
        fail_at(&ps, ps.p, "unexpected %s after the JSON value", got);
    }
    fsdp_json_free(root);
    return NULL;
}

void fsdp_json_free(fsdp_json *v) {
    if (!v) return;
    free_contents(v);
    free(v);
}

const fsdp_json *fsdp_json_get(const fsdp_json *obj, const char *key) {
    if (!obj || obj->type != FSDP_JSON_OBJECT) return NULL;
    for (int i = obj->count - 1; i >= 0; i--)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

/* ---- writing ------------------------------------------------------------------------------------ */

void fsdp_sb_init(fsdp_sb *sb) {
    sb->cap = 256;
    sb->len = 0;
    sb->buf = fsdp_xmalloc(sb->cap, "a JSON string builder");
    sb->buf[0] = 0;
}

void fsdp_sb_free(fsdp_sb *sb) {
    free(sb->buf);
    sb->buf = NULL;
    sb->len = sb->cap = 0;
}

static void sb_reserve(fsdp_sb *sb, size_t extra) {
    if (!sb->buf) fsdp_sb_init(sb);
    if (sb->len + extra + 1 <= sb->cap) return;
    while (sb->len + extra + 1 > sb->cap) sb->cap *= 2;
    sb->buf = xrealloc(sb->buf, sb->cap);
}

void fsdp_sb_printf(fsdp_sb *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) fsdp_fatal("fsdp_sb_printf: bad format \"%s\"", fmt);
    sb_reserve(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, sb->cap - sb->len, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

void fsdp_sb_json_string(fsdp_sb *sb, const char *s) {
    sb_reserve(sb, strlen(s) + 2);
    sb->buf[sb->len++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default: break;
        }
        if (esc)
            fsdp_sb_printf(sb, "%s", esc);
        else if (*p < 0x20)
            fsdp_sb_printf(sb, "\\u%04x", *p);
        else {
            sb_reserve(sb, 1);
            sb->buf[sb->len++] = (char)*p;
        }
    }
    sb_reserve(sb, 1);
    sb->buf[sb->len++] = '"';
    sb->buf[sb->len] = 0;
}

/* The shortest %.*g that reads back to the same double: 1e-05 rather than 1.0000000000000001e-05. */
void fsdp_sb_json_number(fsdp_sb *sb, double x) {
    if (!isfinite(x)) {
        fsdp_sb_printf(sb, "null");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    fsdp_sb_printf(sb, "%s", tmp);
}

/* ---- files -------------------------------------------------------------------------------------- */

char *fsdp_read_file(const char *path, size_t *len, char *errbuf, size_t errcap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = fsdp_xmalloc(cap, "a file's contents");
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int failed = ferror(f), saved = errno;
    fclose(f);
    if (failed) {
        if (errbuf && errcap) snprintf(errbuf, errcap, "%s: %s", path, strerror(saved ? saved : EIO));
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
