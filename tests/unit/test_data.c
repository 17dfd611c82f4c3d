/* Samples of token files (src/train/data.h): where EOS goes between documents (ends and starts with
 * EOS, empty documents, the last document), against a hand-written stream and against a plain
 * concatenation over ten thousand random documents and a few long ones; version 1 streams taken as
 * they are; loss masks; pad examples truncated and padded with the pad id (pad, else EOS, else 0);
 * evaluation windows covering every token once with a shorter last window; every epoch a permutation
 * of all windows or examples, different per epoch; --epochs' step count; the refusals (pad on a
 * version 1 file, stream without EOS, a vocabulary larger than the model's, a tokenizer mismatch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/tokenizer_json.h"
#include "io/tokens.h"
#include "train/data.h"
#include "check.h"

static char dir[1024];

enum { EOS = 2, VOCAB = 1000 };

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* Bytes past the eighth (the header's zero padding) are 0: shifting a uint64_t by 64 is undefined. */
static void put_le(FILE *f, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) fputc(i < 8 ? (int)((v >> (8 * i)) & 0xff) : 0, f);
}

/* A version 2 file written byte by byte as docs/FORMATS.md lays it out (fsdp prepare's writer
 * refuses empty documents, which the format allows): concatenated ids, lens[d] per document, mask
 * NULL or one byte per token. */
static void write_v2(const char *name, const uint32_t *ids, const int *lens, int ndocs, const uint8_t *mask,
                     uint64_t hash) {
    char path[1200];
    path_of(path, sizeof path, name);
    uint64_t n = 0;
    for (int d = 0; d < ndocs; d++) n += (uint64_t)lens[d];
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    fwrite("FSDPTOK", 1, 8, f);
    put_le(f, 2, 4), put_le(f, 2, 4), put_le(f, n, 8), put_le(f, VOCAB, 8);
    put_le(f, (uint64_t)ndocs, 8), put_le(f, hash, 8), put_le(f, mask ? 1 : 0, 4), put_le(f, 0, 12);
    for (uint64_t i = 0; i < n; i++) put_le(f, ids[i], 2);
    uint64_t start = 0;
    put_le(f, 0, 8);
    for (int d = 0; d < ndocs; d++) put_le(f, start += (uint64_t)lens[d], 8);
    for (uint64_t byte = 0; mask && byte < (n + 7) / 8; byte++) {
        int b = 0;
        for (uint64_t k = 0; k < 8 && byte * 8 + k < n; k++) b |= mask[byte * 8 + k] << k;
        fputc(b, f);
    }
    CHECK(fclose(f) == 0);
}

static fsdp_data_spec spec_of(const char *name, fsdp_packing packing, int seq, int eval, char *path, size_t cap) {
    path_of(path, cap, name);
    fsdp_data_spec s = {path, "--data", 1, packing, seq, 7, eval, VOCAB, EOS, -1};
    return s;
}

/* Every sample of an evaluation equals the windows of `expect` (L tokens), the last one shorter. */
static int check_windows(fsdp_data *d, const int32_t *expect, const uint8_t *counts, uint64_t L, int32_t pad) {
    int T = d->seq, ok = 1;
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    fsdp_err err = {0};
    CHECK(d->samples == (L - 1 + (uint64_t)T - 1) / (uint64_t)T);
    for (uint64_t w = 0; w < d->samples && ok; w++) {
        if (fsdp_data_sample(d, w, in, tg, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            ok = 0;
        }
        for (int i = 0; i < T && ok; i++) {
            uint64_t p = w * (uint64_t)T + (uint64_t)i;
            int32_t want_in = p < L ? expect[p] : pad;
            int32_t want_tg = p + 1 < L && (!counts || counts[p + 1]) ? expect[p + 1] : -1;
            if (in[i] != want_in || tg[i] != want_tg) {
                fprintf(stderr, "window %llu position %d: input %d target %d, expected %d %d\n", (unsigned long long)w,
                        i, in[i], tg[i], want_in, want_tg);
                ok = 0;
            }
        }
    }
    free(in);
    free(tg);
    return ok;
}

static void test_eos_placement(void) {
    /* A B C(empty) D E F G: after A (ends 6, next starts 1) EOS; B ends with EOS; D starts with EOS
     * after B's (the file's own double); after D, E: EOS; F is followed by G which starts with EOS;
     * the last document G gets one. */
    uint32_t ids[] = {1, 5, 6, 1, 7, EOS, EOS, 8, 1, 9, 3, 4, EOS, 11};
    int lens[] = {3, 3, 0, 2, 2, 2, 2};
    int32_t stream[] = {1, 5, 6, EOS, 1, 7, EOS, EOS, 8, EOS, 1, 9, EOS, 3, 4, EOS, 11, EOS};
    write_v2("eos.bin", ids, lens, 7, NULL, 0);
    char path[1200];
    fsdp_err err = {0};
    for (int seq = 1; seq <= 8; seq++) {
        fsdp_data d;
        fsdp_data_spec s = spec_of("eos.bin", FSDP_PACK_AUTO, seq, 1, path, sizeof path);
        CHECK(fsdp_data_open(&d, &s, &err) == 0);
        CHECK(d.packing == FSDP_PACK_STREAM && d.stream_len == 18 && d.inserted == 4);
        CHECK(check_windows(&d, stream, NULL, 18, EOS));
        fsdp_data_close(&d);
        /* Training: whole windows only. */
        s.eval = 0;
        CHECK(fsdp_data_open(&d, &s, &err) == 0);
        CHECK(d.samples == 17 / (uint64_t)seq);
        fsdp_data_close(&d);
    }
    /* A version 1 file of the same tokens is a stream as it is: no EOS added. */
    path_of(path, sizeof path, "eos1.bin");
    CHECK(fsdp_tokens_write(path, ids, 14, VOCAB, 0, &err) == 0);
    fsdp_data d;
    fsdp_data_spec s = {path, "--data", 1, FSDP_PACK_AUTO, 3, 7, 1, VOCAB, EOS, -1};
    CHECK(fsdp_data_open(&d, &s, &err) == 0);
    int32_t raw[14];
    for (int i = 0; i < 14; i++) raw[i] = (int32_t)ids[i];
    CHECK(d.stream_len == 14 && check_windows(&d, raw, NULL, 14, EOS));
    fsdp_data_close(&d);
}

/* Ten thousand random documents (some empty, some starting or ending with EOS) and four long ones
 * (past the scan's one-read span): the stream equals a plain concatenation by the rule. */
static void test_eos_random(void) {
    enum { SHORT = 10000, LONG = 4, LONG_LEN = 300000 };
    int ndocs = SHORT + LONG;
    int *lens = malloc((size_t)ndocs * sizeof *lens);
    size_t total = 0;
    srand(12345);
    for (int d = 0; d < ndocs; d++) {
        lens[d] = d % 2500 == 1249 ? LONG_LEN : rand() % 12;
        total += (size_t)lens[d];
    }
    uint32_t *ids = malloc(total * sizeof *ids);
    int32_t *stream = malloc((total + (size_t)ndocs) * sizeof *stream);
    size_t at = 0, L = 0;
    for (int d = 0; d < ndocs; d++)
        for (int i = 0; i < lens[d]; i++) {
            int r = rand() % 8;
            ids[at++] = (i == 0 || i == lens[d] - 1) && r == 0 ? EOS : 3 + (uint32_t)(rand() % (VOCAB - 3));
        }
    at = 0;
    for (int d = 0; d < ndocs; d++) {
        for (int i = 0; i < lens[d]; i++) stream[L++] = (int32_t)ids[at + (size_t)i];
        at += (size_t)lens[d];
        if (!lens[d]) continue;
        int ends = ids[at - 1] == EOS, next_starts = at < total && ids[at] == EOS;
        if (!ends && !next_starts) stream[L++] = EOS;
    }
    write_v2("random.bin", ids, lens, ndocs, NULL, 0);
    char path[1200];
    fsdp_err err = {0};
    fsdp_data d;
    fsdp_data_spec s = spec_of("random.bin", FSDP_PACK_STREAM, 997, 1, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0);
    CHECK(d.stream_len == L);
    CHECK(check_windows(&d, stream, NULL, L, EOS));
    fsdp_data_close(&d);
    free(lens);
    free(ids);
    free(stream);
}

static void test_masks(void) {
    /* Stream: masked targets are -1; an inserted EOS counts. */
    uint32_t ids[] = {1, 10, 11, 12, 13, 1, 20, 21, 22};
    uint8_t mask[] = {0, 0, 1, 1, 0, 0, 0, 1, 1};
    int lens[] = {5, 4};
    write_v2("mask.bin", ids, lens, 2, mask, 0);
    int32_t stream[] = {1, 10, 11, 12, 13, EOS, 1, 20, 21, 22, EOS};
    uint8_t counts[] = {0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1};
    char path[1200];
    fsdp_err err = {0};
    fsdp_data d;
    fsdp_data_spec s = spec_of("mask.bin", FSDP_PACK_STREAM, 4, 1, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0);
    CHECK(check_windows(&d, stream, counts, 11, EOS));
    fsdp_data_close(&d);

    /* Pad (the default for a file with a mask): one example per sample, padded with EOS (no pad id);
     * a longer one truncated to seq + 1 tokens. */
    s = spec_of("mask.bin", FSDP_PACK_AUTO, 6, 1, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && d.packing == FSDP_PACK_PAD && d.samples == 2 && d.pad_id == EOS);
    int32_t in[6], tg[6];
    CHECK(fsdp_data_sample(&d, 0, in, tg, &err) == 0);
    int32_t in0[] = {1, 10, 11, 12, 13, EOS}, tg0[] = {-1, 11, 12, -1, -1, -1};
    CHECK(!memcmp(in, in0, sizeof in0) && !memcmp(tg, tg0, sizeof tg0));
    CHECK(fsdp_data_sample(&d, 1, in, tg, &err) == 0);
    int32_t in1[] = {1, 20, 21, 22, EOS, EOS}, tg1[] = {-1, 21, 22, -1, -1, -1};
    CHECK(!memcmp(in, in1, sizeof in1) && !memcmp(tg, tg1, sizeof tg1));
    /* Past the last example (the rows that fill an evaluation's last micro-batch): nothing counts. */
    CHECK(fsdp_data_sample(&d, 2, in, tg, &err) == 0 && in[0] == EOS && tg[0] == -1 && tg[5] == -1);
    fsdp_data_close(&d);

    s = spec_of("mask.bin", FSDP_PACK_PAD, 2, 1, path, sizeof path);
    s.pad_id = 7;
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && d.pad_id == 7);
    CHECK(fsdp_data_sample(&d, 0, in, tg, &err) == 0 && in[0] == 1 && in[1] == 10 && tg[0] == -1 && tg[1] == 11);
    fsdp_data_close(&d);
    s.pad_id = -1, s.eos_id = -1; /* neither: 0 */
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && d.pad_id == 0);
    fsdp_data_close(&d);
}

/* Training: indices [e * W, (e + 1) * W) visit every sample once, in another order each epoch. */
static void check_epochs(fsdp_data *d, int by_document) {
    uint64_t W = d->samples;
    int32_t *in = malloc((size_t)d->seq * sizeof *in), *tg = malloc((size_t)d->seq * sizeof *tg);
    int *seen = calloc(W, sizeof *seen);
    uint64_t *order = calloc(3 * W, sizeof *order);
    fsdp_err err = {0};
    for (uint64_t i = 0; i < 3 * W; i++) {
        CHECK(fsdp_data_sample(d, i, in, tg, &err) == 0);
        /* v1 tokens are their positions; pad examples start with 100 + their document. */
        uint64_t unit = by_document ? (uint64_t)(in[0] - 100) : (uint64_t)in[0] / (uint64_t)d->seq;
        order[i] = unit;
        if (unit < W) seen[unit]++;
        if (i % W == W - 1) {
            int once = 1;
            for (uint64_t u = 0; u < W; u++) once &= seen[u] == 1, seen[u] = 0;
            CHECK(once);
        }
    }
    CHECK(memcmp(order, order + W, W * sizeof *order) != 0 && memcmp(order + W, order + 2 * W, W * sizeof *order) != 0);
    free(in);
    free(tg);
    free(seen);
    free(order);
}

static void test_epochs(void) {
    enum { N = 500 };
    uint32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (uint32_t)i;
    char path[1200];
    path_of(path, sizeof path, "positions.bin");
    fsdp_err err = {0};
    CHECK(fsdp_tokens_write(path, ids, N, VOCAB, 0, &err) == 0);
    fsdp_data d;
    fsdp_data_spec s = {path, "--data", 1, FSDP_PACK_AUTO, 7, 7, 0, VOCAB, EOS, -1};
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && d.samples == (N - 1) / 7);
    check_epochs(&d, 0);
    int steps = 0;
    CHECK(fsdp_data_epoch_steps(&d, 2.0, 5, &steps, &err) == 0 && steps == (2 * 71 + 4) / 5);
    CHECK(fsdp_data_epoch_steps(&d, 0.5, 8, &steps, &err) == 0 && steps == 5);
    fsdp_data_close(&d);

    enum { DOCS = 37 };
    uint32_t docs[DOCS * 3];
    int lens[DOCS];
    for (int k = 0; k < DOCS; k++) lens[k] = 3, docs[3 * k] = 100 + (uint32_t)k, docs[3 * k + 1] = 5, docs[3 * k + 2] = 6;
    uint8_t mask[DOCS * 3];
    memset(mask, 1, sizeof mask);
    write_v2("examples.bin", docs, lens, DOCS, mask, 0);
    s = spec_of("examples.bin", FSDP_PACK_AUTO, 4, 0, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && d.packing == FSDP_PACK_PAD && d.samples == DOCS);
    check_epochs(&d, 1);
    fsdp_data_close(&d);
}

static void test_refusals(void) {
    char path[1200], json[1200];
    fsdp_err err = {0};
    fsdp_data d;
    /* pad needs documents */
    fsdp_data_spec s = spec_of("positions.bin", FSDP_PACK_PAD, 4, 0, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == -1 && err.status == 2 && strstr(err.msg, path) &&
          strstr(err.msg, "version 1"));
    /* stream joins with EOS: a model without one cannot */
    memset(&err, 0, sizeof err);
    s = spec_of("eos.bin", FSDP_PACK_STREAM, 4, 0, path, sizeof path);
    s.eos_id = -1;
    CHECK(fsdp_data_open(&d, &s, &err) == -1 && strstr(err.msg, "eos_token_id") && strstr(err.msg, path));
    /* the file's vocabulary must fit the model's */
    memset(&err, 0, sizeof err);
    s = spec_of("eos.bin", FSDP_PACK_STREAM, 4, 0, path, sizeof path);
    s.vocab_size = 999;
    s.flag = "--eval-data";
    CHECK(fsdp_data_open(&d, &s, &err) == -1 && strstr(err.msg, "--eval-data") && strstr(err.msg, "1000"));
    /* not a token file */
    memset(&err, 0, sizeof err);
    path_of(json, sizeof json, "tokenizer.json");
    FILE *f = fopen(json, "w");
    fputs("{\"model\": {\"type\": \"BPE\"}, \"b\": [1, 2.5], \"note\": \"longer than a token file header\"}", f);
    fclose(f);
    s.path = json;
    s.vocab_size = VOCAB;
    CHECK(fsdp_data_open(&d, &s, &err) == -1 && strstr(err.msg, "--eval-data") && strstr(err.msg, "not an fsdp.c token file"));
    /* the tokenizer: the same hash passes, another is refused naming both files */
    uint64_t hash = 0;
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokenizer_json_hash(json, &hash, &err) == 0 && hash != 0);
    uint32_t ids[] = {1, 5, 6};
    int lens[] = {3};
    write_v2("hashed.bin", ids, lens, 1, NULL, hash);
    write_v2("other.bin", ids, lens, 1, NULL, hash ^ 1);
    s = spec_of("hashed.bin", FSDP_PACK_STREAM, 2, 0, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && fsdp_data_check_tokenizer(&d, json, &err) == 0);
    fsdp_data_close(&d);
    s = spec_of("other.bin", FSDP_PACK_STREAM, 2, 0, path, sizeof path);
    CHECK(fsdp_data_open(&d, &s, &err) == 0 && fsdp_data_check_tokenizer(&d, json, &err) == -1 &&
          strstr(err.msg, path) && strstr(err.msg, json));
    fsdp_data_close(&d);
    remove(json);
}

int main(void) {
    const char *tmp = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/test_data_%d", tmp, (int)getpid());
    if (mkdir(dir, 0755)) {
        perror(dir);
        return 1;
    }
    test_eos_placement();
    test_eos_random();
    test_masks();
    test_epochs();
    test_refusals();
    const char *names[] = {"eos.bin", "eos1.bin", "random.bin", "mask.bin", "positions.bin", "examples.bin",
                           "hashed.bin", "other.bin"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1200];
        path_of(path, sizeof path, names[i]);
        remove(path);
    }
    rmdir(dir);
    return check_summary("test_data");
}
