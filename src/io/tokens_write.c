/* Writing the token files of tokens.h: the version 1 writer of a whole array, and the streaming
 * version 2 writer that prepare uses. Both write under a temporary name and rename when complete;
 * multi-byte fields are encoded byte by byte so the files are little-endian whatever the host. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_VOCAB 2147483647ULL
#define IO_CHUNK 16384

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++, v >>= 8) p[i] = (unsigned char)(v & 0xFF);
}

static int write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static int write_tokens_fd(int fd, const uint32_t *tokens, uint64_t count, uint64_t vocab, int width) {
    unsigned char h[FSDP_TOKENS_HEADER_BYTES] = {0};
    memcpy(h, FSDP_TOKENS_MAGIC, 8); /* the 8th byte is the magic's NUL */
    put_le(h + 8, 1, 4);
    put_le(h + 12, (uint64_t)width, 4);
    put_le(h + 16, count, 8);
    put_le(h + 24, vocab, 8);
    if (write_full(fd, h, sizeof h)) return -1;
    unsigned char buf[IO_CHUNK];
    uint64_t per_chunk = IO_CHUNK / (uint64_t)width;
    for (uint64_t done = 0; done < count;) {
        uint64_t m = count - done < per_chunk ? count - done : per_chunk;
        for (uint64_t i = 0; i < m; i++) put_le(buf + i * (uint64_t)width, tokens[done + i], width);
        if (write_full(fd, buf, (size_t)(m * (uint64_t)width))) return -1;
        done += m;
    }
    return fsync(fd);
}

int fsdp_tokens_write(const char *path, const uint32_t *tokens, uint64_t count, uint64_t vocab_size,
                      int bytes_per_token, fsdp_err *err) {
    if (vocab_size == 0 || vocab_size > MAX_VOCAB)
        return fsdp_errf(err, "%s: vocabulary size %llu must be 1 to %llu", path, (unsigned long long)vocab_size,
                         MAX_VOCAB);
    if (bytes_per_token == 0) bytes_per_token = vocab_size <= 65536 ? 2 : 4;
    if (bytes_per_token != 2 && bytes_per_token != 4)
        return fsdp_errf(err, "%s: bytes per token must be 2 or 4, not %d", path, bytes_per_token);
    uint64_t max_id = bytes_per_token == 2 ? 65535 : UINT32_MAX;
    for (uint64_t i = 0; i < count; i++)
        if (tokens[i] >= vocab_size || tokens[i] > max_id)
            return fsdp_errf(err, "%s: token %llu is %u, which does not fit (vocabulary size %llu, %d bytes per token)",
                             path, (unsigned long long)i, tokens[i], (unsigned long long)vocab_size, bytes_per_token);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return fsdp_errf(err, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fsdp_errf(err, "%s: %s", tmp, strerror(errno));
    int rc = write_tokens_fd(fd, tokens, count, vocab_size, bytes_per_token);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) rc = -1, saved = errno;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1, saved = errno;
    if (rc) {
        unlink(tmp);
        return fsdp_errf(err, "%s: cannot write: %s", path, strerror(saved));
    }
    return 0;
}

/* ---- the streaming version 2 writer ------------------------------------------------------------- */

enum { BUF_BYTES = 1 << 16 };

/* A file written through a buffer. */
typedef struct {
    int fd;
    char path[4200];
    unsigned char buf[BUF_BYTES];
    size_t n;
} spool;

struct fsdp_tokens_writer {
    char path[4096];
    spool tokens, docs, mask;
    uint64_t vocab, hash, count, num_docs;
    int width, with_mask;
    unsigned char bits; /* mask bits of the byte being filled */
    int num_bits;
    int failed_errno;
    char tokenizer[4096]; /* the tokenizer record's path; "" = none */
};

static int spool_open(spool *s, const char *path, const char *suffix) {
    snprintf(s->path, sizeof s->path, "%s%s", path, suffix);
    s->n = 0;
    s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return s->fd < 0 ? -1 : 0;
}

static int spool_flush(spool *s) {
    if (s->n && write_full(s->fd, s->buf, s->n)) return -1;
    s->n = 0;
    return 0;
}

static int spool_put(spool *s, const unsigned char *p, size_t n) {
    while (n) {
        size_t m = BUF_BYTES - s->n < n ? BUF_BYTES - s->n : n;
        memcpy(s->buf + s->n, p, m);
        s->n += m, p += m, n -= m;
        if (s->n == BUF_BYTES && spool_flush(s)) return -1;
    }
    return 0;
}

/* Appends the whole of `from` (flushed) to `to`. */
static int spool_append(spool *to, spool *from) {
    if (spool_flush(from) || lseek(from->fd, 0, SEEK_SET) < 0) return -1;
    for (;;) {
        ssize_t r = read(from->fd, to->buf, BUF_BYTES);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        if (write_full(to->fd, to->buf, (size_t)r)) return -1;
    }
}

static void spool_remove(spool *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->path[0]) unlink(s->path);
}

static int put_u64(spool *s, uint64_t v) {
    unsigned char b[8];
    put_le(b, v, 8);
    return spool_put(s, b, 8);
}

fsdp_tokens_writer *fsdp_tokens_writer_open(const char *path, uint64_t vocab_size, uint64_t tokenizer_hash,
                                            int with_mask, fsdp_err *err) {
    if (vocab_size == 0 || vocab_size > MAX_VOCAB) {
        fsdp_errf(err, "%s: vocabulary size %llu must be 1 to %llu", path, (unsigned long long)vocab_size, MAX_VOCAB);
        return NULL;
    }
    if (strlen(path) > 4000) {
        fsdp_errf(err, "%s: path too long", path);
        return NULL;
    }
    fsdp_tokens_writer *w = fsdp_xcalloc(1, sizeof *w, "token file writer");
    snprintf(w->path, sizeof w->path, "%s", path);
    w->tokens.fd = w->docs.fd = w->mask.fd = -1;
    w->vocab = vocab_size, w->hash = tokenizer_hash, w->with_mask = with_mask;
    w->width = vocab_size <= 65536 ? 2 : 4;
    unsigned char header[FSDP_TOKENS_HEADER_BYTES] = {0};
    if (spool_open(&w->tokens, path, ".tmp") || spool_open(&w->docs, path, ".tmp-documents") ||
        (with_mask && spool_open(&w->mask, path, ".tmp-mask")) || spool_put(&w->tokens, header, sizeof header) ||
        put_u64(&w->docs, 0)) {
        fsdp_errf(err, "%s: cannot write: %s", path, strerror(errno));
        fsdp_tokens_writer_abort(w);
        return NULL;
    }
    return w;
}

int fsdp_tokens_writer_add(fsdp_tokens_writer *w, const uint32_t *ids, const uint8_t *mask, uint64_t n, fsdp_err *err) {
    if (n == 0) return fsdp_errf(err, "%s: a document needs at least one token", w->path);
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] >= w->vocab)
            return fsdp_errf(err, "%s: token id %u is not below the vocabulary size %llu", w->path, ids[i],
                             (unsigned long long)w->vocab);
    unsigned char b[4 * 256];
    for (uint64_t i = 0; i < n;) {
        uint64_t m = n - i < 256 ? n - i : 256;
        for (uint64_t k = 0; k < m; k++) put_le(b + k * (uint64_t)w->width, ids[i + k], w->width);
        if (spool_put(&w->tokens, b, (size_t)(m * (uint64_t)w->width))) goto io;
        i += m;
    }
    for (uint64_t i = 0; w->with_mask && i < n; i++) {
        if (!mask || mask[i]) w->bits |= (unsigned char)(1u << w->num_bits);
        if (++w->num_bits == 8) {
            if (spool_put(&w->mask, &w->bits, 1)) goto io;
            w->bits = 0, w->num_bits = 0;
        }
    }
    w->count += n;
    w->num_docs++;
    if (put_u64(&w->docs, w->count)) goto io;
    return 0;
io:
    return fsdp_errf(err, "%s: cannot write: %s", w->path, strerror(errno));
}

uint64_t fsdp_tokens_writer_count(const fsdp_tokens_writer *w) { return w->count; }

int fsdp_tokens_writer_set_tokenizer(fsdp_tokens_writer *w, const char *tokenizer, fsdp_err *err) {
    if (strlen(tokenizer) >= sizeof w->tokenizer)
        return fsdp_errf(err, "%s: the tokenizer's path %s is too long to record", w->path, tokenizer);
    snprintf(w->tokenizer, sizeof w->tokenizer, "%s", tokenizer);
    return 0;
}

int fsdp_tokens_writer_finish(fsdp_tokens_writer *w, fsdp_err *err) {
    if (w->with_mask && w->num_bits && spool_put(&w->mask, &w->bits, 1)) goto io;
    if (spool_flush(&w->tokens) || spool_append(&w->tokens, &w->docs) ||
        (w->with_mask && spool_append(&w->tokens, &w->mask)))
        goto io;
    size_t tok_len = strlen(w->tokenizer);
    if (tok_len) { /* the tokenizer record: its path, then the path's length */
        unsigned char len[4];
        put_le(len, (uint64_t)tok_len, 4);
        if (write_full(w->tokens.fd, w->tokenizer, tok_len) || write_full(w->tokens.fd, len, 4)) goto io;
    }
    unsigned char h[FSDP_TOKENS_HEADER_BYTES] = {0};
    memcpy(h, FSDP_TOKENS_MAGIC, 8);
    put_le(h + 8, 2, 4);
    put_le(h + 12, (uint64_t)w->width, 4);
    put_le(h + 16, w->count, 8);
    put_le(h + 24, w->vocab, 8);
    put_le(h + 32, w->num_docs, 8);
    put_le(h + 40, w->hash, 8);
    put_le(h + 48, (uint64_t)w->with_mask | (tok_len ? 2u : 0u), 4);
    if (pwrite(w->tokens.fd, h, sizeof h, 0) != (ssize_t)sizeof h || fsync(w->tokens.fd) != 0) goto io;
    if (close(w->tokens.fd) != 0) {
        w->tokens.fd = -1;
        goto io;
    }
    w->tokens.fd = -1;
    if (rename(w->tokens.path, w->path) != 0) goto io;
    w->tokens.path[0] = 0; /* renamed: nothing to remove */
    fsdp_tokens_writer_abort(w);
    return 0;
io:;
    int saved = errno;
    fsdp_errf(err, "%s: cannot write: %s", w->path, strerror(saved));
    fsdp_tokens_writer_abort(w);
    return -1;
}

void fsdp_tokens_writer_abort(fsdp_tokens_writer *w) {
    if (!w) return;
    spool_remove(&w->tokens);
    spool_remove(&w->docs);
    spool_remove(&w->mask);
    free(w);
}
