/* The token-file format of tokens.h: header checks on open, positioned (pread) reads with id checks,
 * and the atomic writer. Multi-byte fields are encoded byte by byte so the files are little-endian
 * whatever the host. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOKENS_VERSION 1
#define MAX_VOCAB 2147483647ULL /* ids are int32 once read */
/* Bytes moved per read/write system call; small enough to live on a worker thread's stack. */
#define IO_CHUNK 16384

static uint64_t get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void put_le(unsigned char *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++, v >>= 8) p[i] = (unsigned char)(v & 0xFF);
}

/* pread that retries on EINTR and short reads; returns the bytes read (less only at end of file). */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
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

/* Checks a 64-byte header against the file's size; fills the format fields of f. */
static int check_header(const unsigned char *h, uint64_t file_size, fsdp_token_file *f, fsdp_err *err) {
    const char *path = f->path;
    if (memcmp(h, FSDP_TOKENS_MAGIC, 8))
        return fsdp_errf(err, "%s: not an fsdp.c token file (bad magic; expected \"%s\")", path, FSDP_TOKENS_MAGIC);
    uint64_t version = get_le(h + 8, 4), width = get_le(h + 12, 4);
    uint64_t count = get_le(h + 16, 8), vocab = get_le(h + 24, 8);
    if (version != TOKENS_VERSION)
        return fsdp_errf(err, "%s: token file version %llu is not supported (this build reads version %d)", path,
                         (unsigned long long)version, TOKENS_VERSION);
    if (width != 2 && width != 4)
        return fsdp_errf(err, "%s: header says %llu bytes per token (must be 2 or 4)", path,
                         (unsigned long long)width);
    if (vocab == 0 || vocab > MAX_VOCAB)
        return fsdp_errf(err, "%s: header says vocabulary size %llu (must be 1 to %llu)", path,
                         (unsigned long long)vocab, MAX_VOCAB);
    uint64_t data = file_size - FSDP_TOKENS_HEADER_BYTES;
    if (count > UINT64_MAX / width || count * width != data)
        return fsdp_errf(err, "%s: header says %llu tokens (%llu bytes of data) but the file holds %llu bytes of data",
                         path, (unsigned long long)count, (unsigned long long)(count * width),
                         (unsigned long long)data);
    f->bytes_per_token = (int)width;
    f->count = count;
    f->vocab_size = vocab;
    return 0;
}

int fsdp_tokens_open(const char *path, fsdp_token_file *f, fsdp_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fsdp_errf(err, "%s: %s", path, strerror(errno));
    struct stat st;
    unsigned char h[FSDP_TOKENS_HEADER_BYTES];
    int rc;
    if (fstat(fd, &st) != 0)
        rc = fsdp_errf(err, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = fsdp_errf(err, "%s: not a regular file", path);
    else if ((uint64_t)st.st_size < FSDP_TOKENS_HEADER_BYTES)
        rc = fsdp_errf(err, "%s: %lld bytes, shorter than the %d-byte token file header", path, (long long)st.st_size,
                       FSDP_TOKENS_HEADER_BYTES);
    else if (pread_full(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        rc = fsdp_errf(err, "%s: cannot read the header: %s", path, errno ? strerror(errno) : "short read");
    else
        rc = check_header(h, (uint64_t)st.st_size, f, err);
    if (rc) {
        close(fd);
        return -1;
    }
    f->fd = fd;
    return 0;
}

/* Decodes n tokens of `width` bytes, checking each against the vocabulary. */
static int decode(const fsdp_token_file *f, const unsigned char *buf, uint64_t first, int n, int32_t *out,
                  fsdp_err *err) {
    int w = f->bytes_per_token;
    for (int i = 0; i < n; i++) {
        uint64_t id = get_le(buf + (size_t)i * w, w);
        if (id >= f->vocab_size)
            return fsdp_errf(err, "%s: token %llu is %llu, not below the vocabulary size %llu", f->path,
                             (unsigned long long)(first + i), (unsigned long long)id,
                             (unsigned long long)f->vocab_size);
        out[i] = (int32_t)id;
    }
    return 0;
}

int fsdp_tokens_read(const fsdp_token_file *f, uint64_t start, int n, int32_t *out, fsdp_err *err) {
    if (n < 0 || start > f->count || (uint64_t)n > f->count - start)
        return fsdp_errf(err, "%s: tokens [%llu, %llu) are past the end (the file holds %llu)", f->path,
                         (unsigned long long)start, (unsigned long long)start + (unsigned long long)(n < 0 ? 0 : n),
                         (unsigned long long)f->count);
    unsigned char buf[IO_CHUNK];
    int w = f->bytes_per_token, per_chunk = IO_CHUNK / w;
    for (int done = 0; done < n;) {
        int m = n - done < per_chunk ? n - done : per_chunk;
        uint64_t pos = start + (uint64_t)done;
        size_t bytes = (size_t)m * (size_t)w;
        errno = 0;
        ssize_t got = pread_full(f->fd, buf, bytes, FSDP_TOKENS_HEADER_BYTES + pos * (uint64_t)w);
        if (got != (ssize_t)bytes)
            return fsdp_errf(err, "%s: cannot read tokens at %llu: %s", f->path, (unsigned long long)pos,
                             got < 0 ? strerror(errno) : "the file is shorter than when it was opened");
        if (decode(f, buf, pos, m, out + done, err)) return -1;
        done += m;
    }
    return 0;
}

void fsdp_tokens_close(fsdp_token_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static int write_tokens_fd(int fd, const uint32_t *tokens, uint64_t count, uint64_t vocab, int width) {
    unsigned char h[FSDP_TOKENS_HEADER_BYTES] = {0};
    memcpy(h, FSDP_TOKENS_MAGIC, 8); /* the 8th byte is the magic's NUL */
    put_le(h + 8, TOKENS_VERSION, 4);
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
