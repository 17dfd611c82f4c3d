/* The streamed text of an id sequence, piece by piece, as `fsdp generate` writes it
 * (src/text/stream.h), for tests/scripts/generate.py.
 *
 *   stream_check TOKENIZER CONTEXT < "ID ID ..."
 *
 * The first CONTEXT ids are the prompt; every later id is pushed in turn. Writes one JSON string per
 * push (the text that push made final, possibly "") and a last one for the end of the stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/jsonio.h"
#include "text/stream.h"

static void die(const char *what) {
    fprintf(stderr, "stream_check: %s\n", what);
    exit(1);
}

static void put(const fsdp_buf *b) {
    char *lit = fsdp_json_string_literal(b->p ? b->p : "", b->n);
    if (!lit) die("a piece is not UTF-8");
    puts(lit);
    free(lit);
}

int main(int argc, char **argv) {
    if (argc != 3) die("usage: stream_check TOKENIZER CONTEXT < ids");
    fsdp_err err = {0};
    fsdp_tokenizer *tok = fsdp_tokenizer_load(argv[1], &err);
    if (!tok) die(err.msg);
    size_t context = (size_t)atol(argv[2]), n = 0, cap = 1024;
    uint32_t *ids = malloc(cap * sizeof *ids);
    unsigned long v;
    while (scanf("%lu", &v) == 1) {
        if (n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[n++] = (uint32_t)v;
    }
    if (context > n) die("fewer ids than the context");
    fsdp_text_stream s;
    fsdp_text_stream_init(&s, tok, ids, context, 1);
    fsdp_buf piece = {0};
    for (size_t i = context; i < n; i++) {
        piece.n = 0;
        if (fsdp_text_stream_push(&s, ids[i], &piece, &err)) die(err.msg);
        put(&piece);
    }
    piece.n = 0;
    if (fsdp_text_stream_finish(&s, &piece, &err)) die(err.msg);
    put(&piece);
    fsdp_buf_free(&piece);
    fsdp_text_stream_free(&s);
    fsdp_tokenizer_free(tok);
    free(ids);
    return 0;
}
