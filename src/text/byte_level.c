/* The byte <-> character tables of byte_level.h, built once (thread-safe: pthread_once). */
#include "byte_level.h"

#include <pthread.h>

#include "../base/utf8.h"

static char enc[256][2];
static unsigned char enc_len[256];
static int16_t dec[324]; /* code point -> byte, -1 outside the alphabet */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
    for (int i = 0; i < 324; i++) dec[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = self ? (uint32_t)b : 256u + (uint32_t)n++;
        enc_len[b] = (unsigned char)fsdp_utf8_encode(cp, enc[b]);
        dec[cp] = (int16_t)b;
    }
}

void fsdp_byte_level_encode(const char *s, size_t n, char *out, size_t *out_len) {
    pthread_once(&once, build);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        out[o] = enc[b][0];
        if (enc_len[b] == 2) out[o + 1] = enc[b][1];
        o += enc_len[b];
    }
    *out_len = o;
}

int fsdp_byte_level_byte(uint32_t cp) {
    pthread_once(&once, build);
    return cp < 324 ? dec[cp] : -1;
}

void fsdp_byte_level_decode_token(const char *tok, size_t n, fsdp_buf *out) {
    pthread_once(&once, build);
    size_t start = out->n;
    fsdp_buf_reserve(out, n + 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)fsdp_utf8_decode(tok + i, &cp);
        int b = cp < 324 ? dec[cp] : -1;
        if (b < 0) { /* not all in the alphabet: the token's own bytes */
            out->n = start;
            fsdp_buf_add(out, tok, n);
            return;
        }
        out->p[out->n++] = (char)b;
    }
    out->p[out->n] = 0;
}
