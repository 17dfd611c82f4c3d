/* Token files: write/open/read round trips for both widths (and the automatic width), the exact
 * byte layout, and a rejection naming the file for every malformed header, a size mismatch, a
 * count whose size overflows, a read past the end and an out-of-range id; version 2 (documents,
 * loss mask, tokenizer identity) written by the streaming writer, read back field by field, its
 * exact layout, and its malformed variants. No temporary file may be left behind. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/tokens.h"
#include "check.h"

static char dir[1024];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void round_trip(int width, uint64_t vocab, int expect_width) {
    enum { N = 20000 }; /* more than one internal chunk */
    uint32_t *toks = malloc(N * sizeof *toks);
    int32_t *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) toks[i] = (uint32_t)(((uint64_t)i * 2654435761u) % vocab);
    toks[0] = (uint32_t)(vocab - 1);
    char path[1200];
    path_of(path, sizeof path, "rt.bin");
    fsdp_err err = {0};
    CHECK(fsdp_tokens_write(path, toks, N, vocab, width, &err) == 0);
    CHECK(file_size(path) == 64 + (long)N * expect_width);
    fsdp_token_file f;
    CHECK(fsdp_tokens_open(path, &f, &err) == 0);
    CHECK(f.bytes_per_token == expect_width && f.count == N && f.vocab_size == vocab);
    CHECK(fsdp_tokens_read(&f, 0, N, back, &err) == 0);
    int same = 1;
    for (int i = 0; i < N; i++) same &= back[i] == (int32_t)toks[i];
    CHECK(same);
    CHECK(fsdp_tokens_read(&f, 12345, 7, back, &err) == 0 && back[0] == (int32_t)toks[12345] &&
          back[6] == (int32_t)toks[12351]);
    CHECK(fsdp_tokens_read(&f, N, 0, back, &err) == 0);
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_read(&f, N - 3, 4, back, &err) == -1 && strstr(err.msg, path) && strstr(err.msg, "past the end"));
    fsdp_tokens_close(&f);
    CHECK(f.fd == -1);
    free(toks);
    free(back);
}

/* The documented layout, byte for byte. */
static void test_layout(void) {
    char path[1200];
    path_of(path, sizeof path, "layout.bin");
    uint32_t toks[3] = {1, 258, 65535};
    fsdp_err err = {0};
    CHECK(fsdp_tokens_write(path, toks, 3, 65536, 2, &err) == 0);
    unsigned char b[80] = {0};
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(b, 1, sizeof b, f) == 70);
    if (f) fclose(f);
    CHECK(!memcmp(b, "FSDPTOK\0", 8));
    CHECK(b[8] == 1 && b[9] == 0 && b[12] == 2 && b[16] == 3 && b[24] == 0 && b[25] == 0 && b[26] == 1);
    int zero = 1;
    for (int i = 32; i < 64; i++) zero &= b[i] == 0;
    CHECK(zero);
    CHECK(b[64] == 1 && b[65] == 0 && b[66] == 2 && b[67] == 1 && b[68] == 0xFF && b[69] == 0xFF);
    remove(path);
}

/* Opens a file made of a header and `data_bytes` bytes of zero tokens. */
static int open_raw(const unsigned char *header, size_t header_len, long data_bytes, char *path, size_t cap,
                    fsdp_err *err) {
    path_of(path, cap, "raw.bin");
    FILE *f = fopen(path, "wb");
    fwrite(header, 1, header_len, f);
    for (long i = 0; i < data_bytes; i++) fputc(0, f);
    fclose(f);
    fsdp_token_file tf;
    int rc = fsdp_tokens_open(path, &tf, err);
    if (rc == 0) fsdp_tokens_close(&tf);
    remove(path);
    return rc;
}

/* Opening must fail with a message that starts with the path and contains `want`. */
static void expect_open_error(const unsigned char *header, size_t header_len, long data_bytes, const char *want) {
    char path[1200];
    fsdp_err err = {0};
    int rc = open_raw(header, header_len, data_bytes, path, sizeof path, &err);
    check_quiet(rc == -1 && strstr(err.msg, path) == err.msg && strstr(err.msg, want),
                "opening a file that should give '%s': rc %d, %s", want, rc, err.msg);
}

static void make_header(unsigned char *h, uint32_t version, uint32_t width, uint64_t count, uint64_t vocab) {
    memset(h, 0, 64);
    memcpy(h, "FSDPTOK", 8);
    for (int i = 0; i < 4; i++) h[8 + i] = (unsigned char)(version >> (8 * i));
    for (int i = 0; i < 4; i++) h[12 + i] = (unsigned char)(width >> (8 * i));
    for (int i = 0; i < 8; i++) h[16 + i] = (unsigned char)(count >> (8 * i));
    for (int i = 0; i < 8; i++) h[24 + i] = (unsigned char)(vocab >> (8 * i));
}

static void test_bad_files(void) {
    unsigned char h[64];
    char path[1200];
    fsdp_err err = {0};
    make_header(h, 1, 2, 1000, 50000);
    CHECK(open_raw(h, 64, 2000, path, sizeof path, &err) == 0); /* the baseline the cases below break */
    h[0] = 'X';
    expect_open_error(h, 64, 2000, "bad magic");
    make_header(h, 3, 2, 1000, 50000);
    expect_open_error(h, 64, 2000, "version 3 is not supported");
    make_header(h, 1, 3, 1000, 50000);
    expect_open_error(h, 64, 3000, "3 bytes per token");
    make_header(h, 1, 2, 1000, 0);
    expect_open_error(h, 64, 2000, "vocabulary size 0");
    make_header(h, 1, 4, 1000, 1ULL << 31);
    expect_open_error(h, 64, 4000, "vocabulary size 2147483648");
    make_header(h, 1, 2, 1000, 50000);
    expect_open_error(h, 64, 1500, "header says 1000 tokens (2000 bytes of data) but the file holds 1500 bytes");
    expect_open_error(h, 64, 2002, "but the file holds 2002 bytes");
    make_header(h, 1, 4, 1ULL << 62, 50000);
    expect_open_error(h, 64, 16, "header says 4611686018427387904 tokens of 4 bytes each: the file size this implies "
                                 "overflows a 64-bit integer");
    make_header(h, 2, 2, (1ULL << 63) - 16, 50000);
    expect_open_error(h, 64, 16, "overflows a 64-bit integer");
    expect_open_error(h, 30, 0, "shorter than the 64-byte");
    char missing[1200];
    path_of(missing, sizeof missing, "missing.bin");
    fsdp_token_file tf;
    CHECK(fsdp_tokens_open(missing, &tf, &err) == -1 && strstr(err.msg, missing) && strstr(err.msg, "No such file"));
}

static void test_bad_ids(void) {
    /* A file whose header promises vocabulary 100 but holds id 100 at position 4321. */
    char path[1200];
    path_of(path, sizeof path, "ids.bin");
    uint32_t *toks = calloc(5000, sizeof *toks);
    fsdp_err err = {0};
    CHECK(fsdp_tokens_write(path, toks, 5000, 65536, 2, &err) == 0);
    FILE *f = fopen(path, "r+b");
    unsigned char h[64];
    make_header(h, 1, 2, 5000, 100);
    fwrite(h, 1, 64, f);
    fseek(f, 64 + 4321 * 2, SEEK_SET);
    fputc(100, f);
    fclose(f);
    fsdp_token_file tf;
    int32_t out[5000];
    CHECK(fsdp_tokens_open(path, &tf, &err) == 0);
    CHECK(fsdp_tokens_read(&tf, 0, 4321, out, &err) == 0);
    CHECK(fsdp_tokens_read(&tf, 4000, 1000, out, &err) == -1);
    CHECK(strstr(err.msg, path) == err.msg && strstr(err.msg, "token 4321 is 100") &&
          strstr(err.msg, "vocabulary size 100"));
    fsdp_tokens_close(&tf);
    remove(path);

    /* The writer refuses ids that do not fit, and writes nothing. */
    toks[7] = 70000;
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_write(path, toks, 5000, 65536, 0, &err) == -1 && strstr(err.msg, path) &&
          strstr(err.msg, "token 7 is 70000"));
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_write(path, toks, 5000, 100000, 2, &err) == -1 && strstr(err.msg, "token 7 is 70000"));
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_write(path, toks, 5000, 100000, 3, &err) == -1 && strstr(err.msg, "2 or 4"));
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_write(path, toks, 5000, 0, 0, &err) == -1 && strstr(err.msg, "vocabulary size 0"));
    CHECK(file_size(path) == -1);
    free(toks);

    /* A write into a missing directory fails cleanly. */
    char nodir[1200];
    path_of(nodir, sizeof nodir, "no/such/dir.bin");
    uint32_t one = 0;
    memset(&err, 0, sizeof err);
    CHECK(fsdp_tokens_write(nodir, &one, 1, 10, 0, &err) == -1 && strstr(err.msg, "no/such/dir.bin"));
}

static int count_tmp_files(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Version 2: three documents with a mask, written by the streaming writer and read back. */
static void test_v2(void) {
    char path[1200];
    path_of(path, sizeof path, "v2.bin");
    fsdp_err err = {0};
    uint32_t a[5] = {1, 2, 3, 4, 5}, b[3] = {70000, 6, 7}, c[11];
    uint8_t ma[5] = {0, 0, 1, 1, 1}, mc[11];
    for (int i = 0; i < 11; i++) c[i] = (uint32_t)(100 + i), mc[i] = (uint8_t)(i % 3 == 0);
    fsdp_tokens_writer *w = fsdp_tokens_writer_open(path, 128256, 0x1122334455667788ULL, 1, &err);
    CHECK(w != NULL);
    if (!w) return;
    CHECK(fsdp_tokens_writer_add(w, a, ma, 5, &err) == 0);
    CHECK(fsdp_tokens_writer_add(w, b, NULL, 3, &err) == 0);
    CHECK(fsdp_tokens_writer_add(w, c, mc, 11, &err) == 0);
    CHECK(file_size(path) == -1); /* nothing under the final name before finish */
    CHECK(fsdp_tokens_writer_finish(w, &err) == 0);
    /* 64 + 19 tokens x 4 bytes + 4 starts x 8 + ceil(19/8) mask bytes */
    CHECK(file_size(path) == 64 + 76 + 32 + 3);
    fsdp_token_file f;
    CHECK(fsdp_tokens_open(path, &f, &err) == 0);
    CHECK(f.version == 2 && f.count == 19 && f.num_documents == 3 && f.has_mask && f.bytes_per_token == 4 &&
          f.tokenizer_hash == 0x1122334455667788ULL && f.vocab_size == 128256);
    uint64_t starts[4];
    CHECK(fsdp_tokens_documents(&f, 0, 3, starts, &err) == 0 && starts[0] == 0 && starts[1] == 5 && starts[2] == 8 &&
          starts[3] == 19);
    CHECK(fsdp_tokens_documents(&f, 2, 1, starts, &err) == 0 && starts[0] == 8 && starts[1] == 19);
    CHECK(fsdp_tokens_documents(&f, 3, 1, starts, &err) == -1 && strstr(err.msg, "past the end"));
    int32_t ids[19];
    uint8_t mask[19];
    CHECK(fsdp_tokens_read(&f, 0, 19, ids, &err) == 0 && ids[0] == 1 && ids[5] == 70000 && ids[18] == 110);
    CHECK(fsdp_tokens_read_mask(&f, 0, 19, mask, &err) == 0);
    int same = 1;
    for (int i = 0; i < 5; i++) same &= mask[i] == ma[i];
    for (int i = 0; i < 3; i++) same &= mask[5 + i] == 1;
    for (int i = 0; i < 11; i++) same &= mask[8 + i] == mc[i];
    CHECK(same);
    CHECK(fsdp_tokens_read_mask(&f, 7, 3, mask, &err) == 0 && mask[0] == 1 && mask[1] == 1 && mask[2] == 0);
    fsdp_tokens_close(&f);

    /* the exact layout */
    unsigned char raw[64 + 76 + 32 + 3];
    FILE *fp = fopen(path, "rb");
    CHECK(fp && fread(raw, 1, sizeof raw, fp) == sizeof raw);
    if (fp) fclose(fp);
    CHECK(raw[8] == 2 && raw[12] == 4 && raw[16] == 19 && raw[32] == 3 && raw[40] == 0x88 && raw[47] == 0x11 &&
          raw[48] == 1);
    CHECK(raw[64 + 5 * 4] == 0x70 && raw[64 + 5 * 4 + 1] == 0x11 && raw[64 + 5 * 4 + 2] == 0x01); /* 70000 */
    CHECK(raw[140] == 0 && raw[148] == 5 && raw[156] == 8 && raw[164] == 19);
    /* mask bits LSB first: tokens 0..7 = 0,0,1,1,1,1,1,1; 8..15 = 1,0,0,1,0,0,1,0; 16..18 = 0,1,0 */
    CHECK(raw[172] == 0xFC && raw[173] == 0x49 && raw[174] == 0x02);

    /* malformed variants of this file */
    fsdp_token_file g;
    raw[156] = 20; /* a start past the end */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "document 2 starts at token 20"));
    raw[156] = 8;
    raw[48] = 5; /* unknown flag */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "flags 0x5"));
    raw[48] = 3; /* a tokenizer record the file has no room for */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "tokenizer record follows"));
    /* a record whose length (the last 4 bytes) disagrees with the file */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fwrite("/tok\x09\0\0\0", 1, 8, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "tokenizer record") && strstr(err.msg, "malformed"));
    /* and one that agrees */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fwrite("/tok\x04\0\0\0", 1, 8, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == 0 && !strcmp(g.tokenizer_path, "/tok"));
    if (g.fd >= 0) fsdp_tokens_close(&g);
    raw[48] = 0; /* no mask flag: 3 bytes too many */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "3 documents (172 bytes in all) but the file has 175"));
    raw[48] = 1;
    put64(raw + 32, 1ULL << 62); /* a document count whose table overflows */
    fp = fopen(path, "wb");
    fwrite(raw, 1, sizeof raw, fp);
    fclose(fp);
    CHECK(fsdp_tokens_open(path, &g, &err) == -1 && strstr(err.msg, "documents but only 19 tokens"));
    remove(path);

    /* the writer refuses ids outside the vocabulary and an empty document; abort leaves nothing */
    w = fsdp_tokens_writer_open(path, 100, 0, 0, &err);
    CHECK(w && fsdp_tokens_writer_add(w, a, NULL, 5, &err) == 0);
    CHECK(w && fsdp_tokens_writer_add(w, b, NULL, 3, &err) == -1 && strstr(err.msg, "70000"));
    CHECK(w && fsdp_tokens_writer_add(w, a, NULL, 0, &err) == -1 && strstr(err.msg, "at least one token"));
    fsdp_tokens_writer_abort(w);
    CHECK(file_size(path) == -1);
}

int main(void) {
    const char *tmp = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
    snprintf(dir, sizeof dir, "%s/test_tokens_%d", tmp, (int)getpid());
    if (mkdir(dir, 0755)) {
        perror(dir);
        return 1;
    }
    round_trip(2, 50272, 2);
    round_trip(4, 50272, 4);
    round_trip(4, 128256, 4);
    round_trip(0, 65536, 2);
    round_trip(0, 65537, 4);
    round_trip(2, 7, 2);
    test_layout();
    test_bad_files();
    test_bad_ids();
    test_v2();
    CHECK(count_tmp_files() == 0);
    char path[1200];
    path_of(path, sizeof path, "rt.bin");
    remove(path);
    rmdir(dir);
    return check_summary("test_tokens");
}
