/* The tokenizer on small hand-made tokenizer.json files: BPE merge order (lowest rank first, the
 * leftmost of equal ranks, stale candidates skipped), byte fallback and fused unknowns, ignore_merges,
 * added tokens (lstrip/rstrip/single_word), the template post-processor with and without special
 * tokens, decoding; and one message naming the file and the JSON field for every refusal. (Parity with
 * Hugging Face tokenizers on real files is tests/scripts/tokenizer_parity.py.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/tokenizer.h"
#include "check.h"

static char path[1024];

static void write_file(const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* A SentencePiece-like model: characters, merges a b -> ab (rank 0), b c -> bc (rank 1),
 * ab c -> abc (rank 2), byte fallback for <0x..> tokens of 'é' (C3 A9), unk for the rest. */
static const char MODEL[] =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false},"
    "{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false},"
    "{\"id\": 12, \"content\": \"<L>\", \"special\": false, \"normalized\": false, \"lstrip\": true, \"rstrip\": false, \"single_word\": false},"
    "{\"id\": 13, \"content\": \"<R>\", \"special\": false, \"normalized\": false, \"lstrip\": false, \"rstrip\": true, \"single_word\": false},"
    "{\"id\": 14, \"content\": \"W\", \"special\": false, \"normalized\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": true}],"
    "\"normalizer\": %s, \"pre_tokenizer\": %s,"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    "\"decoder\": %s,"
    "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true, \"ignore_merges\": %s,"
    " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"a\": 2, \"b\": 3, \"c\": 4, \"ab\": 5, \"bc\": 6, \"abc\": 7, \"<0xC3>\": 8, \"<0xA9>\": 9,"
    " \" \": 10, \"abcabc\": 11},"
    " \"merges\": [\"a b\", \"b c\", \"ab c\"]}}";

static fsdp_tokenizer *load(const char *normalizer, const char *pre, const char *decoder, const char *ignore) {
    char text[8192];
    snprintf(text, sizeof text, MODEL, normalizer, pre, decoder, ignore);
    write_file(text);
    fsdp_err err = {0};
    fsdp_tokenizer *t = fsdp_tokenizer_load(path, &err);
    if (!t) fprintf(stderr, "load: %s\n", err.msg);
    return t;
}

/* Encodes and compares with the expected ids ("1 5 4"). */
static void expect(fsdp_tokenizer *t, const char *text, int special, const char *want) {
    fsdp_tokenizer_state *s = fsdp_tokenizer_state_new(t);
    fsdp_ids ids = {0};
    fsdp_err err = {0};
    char got[1200] = "";
    if (fsdp_tokenizer_encode(t, s, text, strlen(text), special, &ids, &err)) snprintf(got, sizeof got, "error %s", err.msg);
    for (size_t i = 0; i < ids.n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), i ? " %u" : "%u", ids.p[i]);
    check_quiet(!strcmp(got, want), "encode \"%s\": got [%s], want [%s]", text, got, want);
    fsdp_ids_free(&ids);
    fsdp_tokenizer_state_free(s);
}

static void expect_decode(fsdp_tokenizer *t, const uint32_t *ids, size_t n, int skip, const char *want) {
    fsdp_tokenizer_state *s = fsdp_tokenizer_state_new(t);
    fsdp_buf out = {0};
    fsdp_err err = {0};
    int rc = fsdp_tokenizer_decode(t, s, ids, n, skip, &out, &err);
    check_quiet(!rc && !strcmp(out.p ? out.p : "", want), "decode: got \"%s\" (%s), want \"%s\"", out.p ? out.p : "",
                err.msg, want);
    fsdp_buf_free(&out);
    fsdp_tokenizer_state_free(s);
}

static void test_encode(void) {
    fsdp_tokenizer *t = load("null", "null", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}",
                             "false");
    CHECK(t != NULL);
    if (!t) return;
    CHECK(fsdp_tokenizer_vocab_size(t) == 15);
    expect(t, "abc", 1, "1 7");     /* a b -> ab (rank 0), then ab c (rank 2) */
    expect(t, "bcab", 0, "6 5");    /* bc (rank 1) and ab (rank 0): both merge */
    expect(t, "abcabc", 0, "7 7");  /* not in vocab as a whole without ignore_merges */
    expect(t, "aab", 0, "2 5");     /* the pair a b, not a a */
    expect(t, "é", 0, "8 9");       /* byte fallback */
    expect(t, "xyz", 0, "0");       /* unknowns fused into one */
    expect(t, "axyb", 0, "2 0 3");
    expect(t, "", 1, "1");          /* the template alone */
    expect(t, "", 0, "");
    expect(t, "a <L>b", 0, "2 12 3"); /* lstrip takes the space before */
    expect(t, "a<R>  b", 0, "2 13 3"); /* rstrip the spaces after */
    expect(t, "aWb", 0, "2 0 3");    /* single_word: inside a word it is text (unknown W) */
    expect(t, "a W b", 0, "2 10 14 10 3");
    expect(t, "<s>abc<s>", 1, "1 1 7 1"); /* special tokens in the text stay tokens */
    expect(t, "bad \xff", 0, "error invalid UTF-8 at byte 5");
    uint32_t ids[] = {1, 7, 8, 9, 0, 8, 4};
    expect_decode(t, ids, 7, 0, "<s>abcé<unk>\xEF\xBF\xBD" "c"); /* a lone <0xC3> becomes U+FFFD */
    /* skipping <unk> joins C3 A9 C3 into one invalid run: one U+FFFD per byte, as tokenizers does */
    expect_decode(t, ids, 7, 1, "abc\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "c");
    uint32_t bad[] = {99};
    fsdp_tokenizer_state *s = fsdp_tokenizer_state_new(t);
    fsdp_buf out = {0};
    fsdp_err err = {0};
    CHECK(fsdp_tokenizer_decode(t, s, bad, 1, 0, &out, &err) == -1 && strstr(err.msg, "99"));
    fsdp_buf_free(&out);
    fsdp_tokenizer_state_free(s);
    fsdp_tokenizer_free(t);

    t = load("null", "null", "null", "true");
    expect(t, "abcabc", 0, "11"); /* ignore_merges: a word in the vocabulary is one token */
    uint32_t two[] = {2, 3};
    expect_decode(t, two, 2, 0, "a b"); /* no decoder: tokens joined by spaces */
    fsdp_tokenizer_free(t);

    t = load("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"a\"}, {\"type\": \"Replace\","
             " \"pattern\": {\"String\": \"x\"}, \"content\": \"c\"}]}",
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": \"Removed\", \"invert\": false}",
             "{\"type\": \"Strip\", \"content\": \"a\", \"start\": 1, \"stop\": 0}", "false");
    expect(t, "bx", 0, "7");     /* "abc" after Prepend and Replace */
    expect(t, "b b", 0, "5 3");  /* "ab b" split on the space, which is removed */
    uint32_t abc[] = {7};
    expect_decode(t, abc, 1, 0, "bc");
    fsdp_tokenizer_free(t);
}

/* Each bad file must give one message holding the file and the JSON field. */
static void refuse(const char *what, const char *json_text, const char *want) {
    write_file(json_text);
    fsdp_err err = {0};
    fsdp_tokenizer *t = fsdp_tokenizer_load(path, &err);
    check_quiet(!t && strstr(err.msg, path) == err.msg && strstr(err.msg, want), "%s: %s (want '%s')", what,
                t ? "loaded" : err.msg, want);
    fsdp_tokenizer_free(t);
}

static void test_refusals(void) {
    char text[8192];
    snprintf(text, sizeof text, MODEL,
             "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"_\"}, {\"type\": \"Precompiled\"}]}",
             "null", "null", "false");
    refuse("Precompiled", text, ": normalizer.normalizers[1].type 'Precompiled' is not supported");
    snprintf(text, sizeof text, MODEL, "null",
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\", \"replacement\": \"_\"}]}", "null", "false");
    refuse("Metaspace", text, ": pre_tokenizer.pretokenizers[0].type 'Metaspace' is not supported");
    snprintf(text, sizeof text, MODEL, "null", "null", "{\"type\": \"WordPiece\"}", "false");
    refuse("WordPiece decoder", text, ": decoder.type 'WordPiece' is not supported");
    snprintf(text, sizeof text, MODEL, "null",
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}", "null", "false");
    refuse("bad regex", text, ": pre_tokenizer.pattern: the regex does not compile (PCRE2 at offset 1");
    snprintf(text, sizeof text, MODEL, "null",
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}", "null", "false");
    refuse("bad behavior", text, "pre_tokenizer.behavior is not one of");
    refuse("WordPiece model", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", ": model.type 'WordPiece' is not supported");
    refuse("dropout", "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}",
           "model.dropout is not supported");
    refuse("prefix", "{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
           "model.continuing_subword_prefix ## is not supported (only null or \"\")");
    refuse("truncation", "{\"truncation\": {\"max_length\": 5}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
           "truncation is set");
    refuse("merge out of vocab", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
           "model.merges[0]: \"ab\" is not in model.vocab");
    refuse("bad merge", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}}",
           "model.merges[0] \"a b c\" is not two tokens");
    refuse("Roberta", "{\"post_processor\": {\"type\": \"RobertaProcessing\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
           "post_processor.type 'RobertaProcessing' is not supported");
    refuse("added id", "{\"added_tokens\": [{\"id\": 7, \"content\": \"<x>\", \"special\": true}], \"model\": {\"type\": \"BPE\", "
           "\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}", "added_tokens[0].id is 7 but tokenizers gives \"<x>\" the id 2");
    refuse("unk missing", "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
           "model.unk_token \"<unk>\" is not in model.vocab");
    refuse("malformed", "{\"model\": ", "line 1");
}

int main(void) {
    const char *tmp = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
    snprintf(path, sizeof path, "%s/test_tokenizer_%d.json", tmp, (int)getpid());
    test_encode();
    test_refusals();
    remove(path);
    return check_summary("test_tokenizer");
}
