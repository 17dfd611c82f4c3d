/* JSON reader and builder: values and nesting, escapes and UTF-8, numbers, round trips through the
 * builder, the position and wording of every kind of syntax error, the nesting limit, and
 * fsdp_read_file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"

static int failures;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                          \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

static fsdp_json *parse(const char *text) {
    char err[256];
    fsdp_json *v = fsdp_json_parse(text, strlen(text), err, sizeof err);
    if (!v) fprintf(stderr, "unexpected parse error for %s: %s\n", text, err);
    return v;
}

/* Parsing must fail with exactly this message. */
static void expect_error(const char *text, size_t len, const char *want) {
    char err[256] = "";
    fsdp_json *v = fsdp_json_parse(text, len, err, sizeof err);
    if (v || strcmp(err, want)) {
        fprintf(stderr, "FAIL: parsing %.40s...\n  want error: %s\n  got:        %s\n", text, want,
                v ? "(parsed)" : err);
        failures++;
    }
    fsdp_json_free(v);
}

static void test_values(void) {
    fsdp_json *v = parse(" {\"a\": 1, \"b\": [true, false, null, -2.5e3, \"x\"], \"c\": {}, \"d\": [], \"a\": 7}\n");
    CHECK(v && v->type == FSDP_JSON_OBJECT && v->count == 5);
    if (!v) return;
    const fsdp_json *a = fsdp_json_get(v, "a"), *b = fsdp_json_get(v, "b");
    CHECK(a && a->type == FSDP_JSON_NUMBER && a->number == 7); /* last duplicate wins */
    CHECK(b && b->type == FSDP_JSON_ARRAY && b->count == 5);
    if (b && b->count == 5) {
        CHECK(b->items[0].type == FSDP_JSON_BOOL && b->items[0].boolean == 1);
        CHECK(b->items[1].type == FSDP_JSON_BOOL && b->items[1].boolean == 0);
        CHECK(b->items[2].type == FSDP_JSON_NULL);
        CHECK(b->items[3].type == FSDP_JSON_NUMBER && b->items[3].number == -2500.0);
        CHECK(!strcmp(b->items[3].string, "-2.5e3")); /* the original text is kept */
        CHECK(b->items[4].type == FSDP_JSON_STRING && !strcmp(b->items[4].string, "x"));
    }
    CHECK(fsdp_json_get(v, "c")->type == FSDP_JSON_OBJECT && fsdp_json_get(v, "c")->count == 0);
    CHECK(fsdp_json_get(v, "d")->type == FSDP_JSON_ARRAY && fsdp_json_get(v, "d")->count == 0);
    CHECK(fsdp_json_get(v, "missing") == NULL);
    CHECK(fsdp_json_get(b, "a") == NULL); /* not an object */
    fsdp_json_free(v);

    v = parse("9007199254740993");
    CHECK(v && v->type == FSDP_JSON_NUMBER && !strcmp(v->string, "9007199254740993"));
    fsdp_json_free(v);
    v = parse("9007199254740992");
    CHECK(v && v->number == 9007199254740992.0);
    fsdp_json_free(v);
    v = parse("\"top-level string\"");
    CHECK(v && v->type == FSDP_JSON_STRING && !strcmp(v->string, "top-level string"));
    fsdp_json_free(v);
    v = parse("\xEF\xBB\xBF[0, -0, 0.5, 1E+2, 1e-2]");
    CHECK(v && v->count == 5 && v->items[3].number == 100.0 && v->items[4].number == 0.01);
    fsdp_json_free(v);
}

static void test_strings(void) {
    fsdp_json *v = parse("[\"q\\\"b\\\\s\\/n\\nt\\tr\\rb\\bf\\f\", \"\\u0041\\u00e9\\u20AC\", \"\\ud83d\\ude00\", "
                         "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"]");
    CHECK(v && v->count == 4);
    if (!v || v->count != 4) return;
    CHECK(!strcmp(v->items[0].string, "q\"b\\s/n\nt\tr\rb\bf\f"));
    CHECK(!strcmp(v->items[1].string, "A\xC3\xA9\xE2\x82\xAC"));
    CHECK(!strcmp(v->items[2].string, "\xF0\x9F\x98\x80")); /* U+1F600 from a surrogate pair */
    CHECK(!strcmp(v->items[3].string, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
    fsdp_json_free(v);
}

/* Builder output parses back to the same values. */
static void test_round_trip(void) {
    const char *strings[] = {"", "plain", "quote \" backslash \\ slash /", "ctl \x01\x1f\n\r\t\b\f end",
                             "utf8 caf\xC3\xA9 \xF0\x9F\x98\x80"};
    const double numbers[] = {0.0, -0.0, 1.0, -3.0, 0.1, 1e-5, 1e-6, 3.141592653589793, 1e300, -2.5e-300,
                              128256.0, 9007199254740992.0, 5e-324, 1.7976931348623157e308};
    fsdp_sb sb;
    fsdp_sb_init(&sb);
    fsdp_sb_printf(&sb, "{\"s\": [");
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++) {
        if (i) fsdp_sb_printf(&sb, ", ");
        fsdp_sb_json_string(&sb, strings[i]);
    }
    fsdp_sb_printf(&sb, "], \"n\": [");
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        if (i) fsdp_sb_printf(&sb, ", ");
        fsdp_sb_json_number(&sb, numbers[i]);
    }
    fsdp_sb_printf(&sb, "], \"bad\": [");
    fsdp_sb_json_number(&sb, NAN);
    fsdp_sb_printf(&sb, ", ");
    fsdp_sb_json_number(&sb, INFINITY);
    fsdp_sb_printf(&sb, "]}");
    CHECK(sb.len == strlen(sb.buf));
    fsdp_json *v = parse(sb.buf);
    CHECK(v != NULL);
    if (v) {
        const fsdp_json *s = fsdp_json_get(v, "s"), *n = fsdp_json_get(v, "n"), *bad = fsdp_json_get(v, "bad");
        for (int i = 0; s && i < s->count; i++) CHECK(!strcmp(s->items[i].string, strings[i]));
        for (int i = 0; n && i < n->count; i++) CHECK(n->items[i].number == numbers[i]);
        CHECK(s && s->count == (int)(sizeof strings / sizeof *strings));
        CHECK(n && n->count == (int)(sizeof numbers / sizeof *numbers));
        CHECK(bad && bad->count == 2 && bad->items[0].type == FSDP_JSON_NULL && bad->items[1].type == FSDP_JSON_NULL);
    }
    CHECK(strstr(sb.buf, "1e-05") != NULL); /* shortest form, not 1.0000000000000001e-05 */
    CHECK(strstr(sb.buf, "\\u0001") != NULL);
    fsdp_json_free(v);
    fsdp_sb_free(&sb);

    /* Growth well past the initial capacity. */
    fsdp_sb_init(&sb);
    for (int i = 0; i < 10000; i++) fsdp_sb_printf(&sb, "%d,", i);
    CHECK(sb.len == strlen(sb.buf) && !strncmp(sb.buf, "0,1,2,", 6) && strstr(sb.buf, "9999,") != NULL);
    fsdp_sb_free(&sb);
}

static void test_errors(void) {
    const char *t;
    expect_error("", 0, "line 1, column 1: unexpected end of input, expected a value");
    expect_error("   \n  ", 6, "line 2, column 3: unexpected end of input, expected a value");
    t = "{\n  \"a\": 1,\n  \"b\" 2\n}";
    expect_error(t, strlen(t), "line 3, column 7: expected ':', found '2'");
    t = "{\"a\": 1 \"b\": 2}";
    expect_error(t, strlen(t), "line 1, column 9: expected ',' or '}', found '\"'");
    t = "[1, 2";
    expect_error(t, strlen(t), "line 1, column 6: unexpected end of input, expected ',' or ']'");
    t = "[1, 2,]";
    expect_error(t, strlen(t), "line 1, column 7: expected a value, found ']'");
    t = "{\"a\": 1,}";
    expect_error(t, strlen(t), "line 1, column 9: expected a string key, found '}'");
    t = "{a: 1}";
    expect_error(t, strlen(t), "line 1, column 2: expected a string key or '}', found 'a'");
    t = "{\"a\": 1} x";
    expect_error(t, strlen(t), "line 1, column 10: unexpected 'x' after the JSON value");
    t = "[1]\n\n  ]";
    expect_error(t, strlen(t), "line 3, column 3: unexpected ']' after the JSON value");
    t = "[tru]";
    expect_error(t, strlen(t), "line 1, column 2: invalid literal (expected true, false or null)");
    t = "[01]";
    expect_error(t, strlen(t), "line 1, column 3: invalid number: leading zero");
    t = "[1.]";
    expect_error(t, strlen(t), "line 1, column 4: invalid number: expected a digit after '.'");
    t = "[1e+]";
    expect_error(t, strlen(t), "line 1, column 5: invalid number: expected a digit in the exponent");
    t = "[-x]";
    expect_error(t, strlen(t), "line 1, column 3: invalid number: expected a digit");
    t = "[+1]";
    expect_error(t, strlen(t), "line 1, column 2: expected a value, found '+'");
    t = "[1e999]";
    expect_error(t, strlen(t), "line 1, column 2: number out of range");
    t = "\"abc";
    expect_error(t, strlen(t), "line 1, column 5: unterminated string");
    t = "[\"a\\qb\"]";
    expect_error(t, strlen(t), "line 1, column 4: invalid escape \\ followed by 'q'");
    t = "[\"a\\u12G4\"]";
    expect_error(t, strlen(t), "line 1, column 4: invalid \\u escape: expected four hex digits");
    t = "[\"\\ud83d\"]";
    expect_error(t, strlen(t),
                 "line 1, column 3: invalid \\u escape: high surrogate \\uD83D is not followed by a low surrogate");
    t = "[\"\\ude00\"]";
    expect_error(t, strlen(t), "line 1, column 3: invalid \\u escape: unpaired low surrogate \\uDE00");
    t = "[\"\\u0000\"]";
    expect_error(t, strlen(t), "line 1, column 3: \\u0000 is not supported (strings are NUL-terminated)");
    t = "[\"a\tb\"]";
    expect_error(t, strlen(t), "line 1, column 4: control character (byte 0x09) in a string; escape it");
    t = "[\"\xC3\x28\"]";
    expect_error(t, strlen(t), "line 1, column 3: invalid UTF-8 (byte 0xc3)");
    t = "[\"\xC0\xAF\"]"; /* overlong '/' */
    expect_error(t, strlen(t), "line 1, column 3: invalid UTF-8 (byte 0xc0)");
    t = "[\"\xED\xA0\x80\"]"; /* an encoded surrogate */
    expect_error(t, strlen(t), "line 1, column 3: invalid UTF-8 (byte 0xed)");
    expect_error("[1,\0 2]", 7, "line 1, column 4: expected a value, found byte 0x00");
    t = "{\"a\":\r\n\t@}";
    expect_error(t, strlen(t), "line 2, column 2: expected a value, found '@'");
    /* Only `len` bytes count: the closing bracket lies outside them. */
    expect_error("[1]", 2, "line 1, column 3: unexpected end of input, expected ',' or ']'");
    /* The error buffer may be small or absent. */
    char tiny[8];
    CHECK(fsdp_json_parse("[", 1, tiny, sizeof tiny) == NULL && strlen(tiny) == 7);
    CHECK(fsdp_json_parse("[", 1, NULL, 0) == NULL);
}

static void test_depth(void) {
    char buf[1200];
    /* 256 levels parse; 257 do not (and the parser must not recurse without bound). */
    memset(buf, '[', 256);
    memset(buf + 256, ']', 256);
    fsdp_json *v = fsdp_json_parse(buf, 512, NULL, 0);
    CHECK(v != NULL);
    fsdp_json_free(v);
    memset(buf, '[', 257);
    memset(buf + 257, ']', 257);
    expect_error(buf, 514, "line 1, column 257: nesting deeper than 256 levels");
    char *deep = malloc(1000000);
    memset(deep, '{', 1000000);
    char err[256];
    CHECK(fsdp_json_parse(deep, 1000000, err, sizeof err) == NULL && strstr(err, "nesting deeper") == NULL);
    memset(deep, '[', 1000000);
    CHECK(fsdp_json_parse(deep, 1000000, err, sizeof err) == NULL && strstr(err, "nesting deeper") != NULL);
    free(deep);
}

static void test_read_file(void) {
    const char *dir = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
    char path[1024], err[1200];
    snprintf(path, sizeof path, "%s/test_json_%d.json", dir, (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    for (int i = 0; i < 3000; i++) fprintf(f, "%d\n", i); /* larger than the first read buffer */
    fclose(f);
    size_t len = 0;
    char *text = fsdp_read_file(path, &len, err, sizeof err);
    CHECK(text && len == strlen(text) && !strncmp(text, "0\n1\n", 4) && strstr(text, "\n2999\n"));
    free(text);
    remove(path);
    CHECK(fsdp_read_file(path, &len, err, sizeof err) == NULL);
    CHECK(strstr(err, path) && strstr(err, "No such file"));
    CHECK(fsdp_read_file(dir, &len, err, sizeof err) == NULL && strstr(err, "directory"));
}

int main(void) {
    test_values();
    test_strings();
    test_round_trip();
    test_errors();
    test_depth();
    test_read_file();
    if (failures) {
        fprintf(stderr, "test_json: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_json: ok\n");
    return 0;
}
