/* Single-thread encode throughput of fsdp.c's tokenizer (src/text) on a text file, measured the way
 * tests/lib/tokenizers_oracle.js measures Hugging Face's tokenizers: the file cut into chunks of whole
 * lines of at least CHUNK_BYTES, each chunk encoded in one call (add_special_tokens off), the whole
 * file REPEATS times. Prints one JSON object: bytes, chunks, tokens, seconds per repeat.
 *   tokenizer_bench TOKENIZER_JSON TEXT_FILE CHUNK_BYTES REPEATS
 * bench/tokenizer_bench.sh runs it and the oracle interleaved and writes bench/results. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE CHUNK_BYTES REPEATS\n", argv[0]);
        return 2;
    }
    fsdp_err err = {0};
    fsdp_tokenizer *tok = fsdp_tokenizer_load(argv[1], &err);
    if (!tok) {
        fprintf(stderr, "fsdp: error: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fsdp_buf text = {0};
    char block[1 << 16];
    size_t got;
    while ((got = fread(block, 1, sizeof block, f)) > 0) fsdp_buf_add(&text, block, got);
    fclose(f);
    size_t chunk = (size_t)atol(argv[3]);
    int repeats = atoi(argv[4]);
    /* chunk boundaries: after the newline that brings a chunk to at least `chunk` bytes */
    size_t *ends = malloc((text.n / (chunk ? chunk : 1) + 2) * sizeof *ends), num = 0;
    for (size_t i = 0, start = 0; i < text.n; i++)
        if (text.p[i] == '\n' && i + 1 - start >= chunk) ends[num++] = i + 1, start = i + 1;
    if (!num || ends[num - 1] != text.n) ends[num++] = text.n;
    fsdp_tokenizer_state *s = fsdp_tokenizer_state_new(tok);
    fsdp_ids ids = {0};
    printf("{\"bytes\": %zu, \"chunks\": %zu, \"seconds\": [", text.n, num);
    size_t tokens = 0;
    for (int r = 0; r < repeats; r++) {
        tokens = 0;
        double t0 = now();
        for (size_t c = 0, start = 0; c < num; start = ends[c++]) {
            ids.n = 0;
            if (fsdp_tokenizer_encode(tok, s, text.p + start, ends[c] - start, 0, &ids, &err)) {
                fprintf(stderr, "fsdp: error: %s: %s\n", argv[2], err.msg);
                return 1;
            }
            tokens += ids.n;
        }
        printf(r ? ", %.4f" : "%.4f", now() - t0);
    }
    printf("], \"tokens\": %zu}\n", tokens);
    fsdp_ids_free(&ids);
    fsdp_tokenizer_state_free(s);
    fsdp_tokenizer_free(tok);
    free(ends);
    fsdp_buf_free(&text);
    return 0;
}
