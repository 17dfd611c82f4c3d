/* Reading the token files of tokens.h: header and document-table checks on open, positioned (pread)
 * reads of tokens (with id checks), document starts and mask bits. Multi-byte fields are decoded byte
 * by byte so the files are little-endian whatever the host. The writers are in tokens_write.c. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"

#define MAX_VOCAB 2147483647ULL /* ids are int32 once read */
/* Bytes moved per read/write system call; small enough to live on a worker thread's stack. */
#define IO_CHUNK 16384

static uint64_t get_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
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

static int overflow(fsdp_err *err, const char *path, uint64_t count, uint64_t width) {
    return fsdp_errf(err, "%s: header says %llu tokens of %llu bytes each: the file size this implies overflows a 64-bit "
                          "integer (a corrupt header)", path, (unsigned long long)count, (unsigned long long)width);
}

/* The version 2 fields and sizes; the document table itself is checked by check_documents. */
static int check_v2(const unsigned char *h, uint64_t file_size, uint64_t token_bytes, fsdp_token_file *f,
                    fsdp_err *err) {
    const char *path = f->path;
    uint64_t docs = get_le(h + 32, 8), flags = get_le(h + 48, 4);
    if (flags & ~(uint64_t)3)
        return fsdp_errf(err, "%s: header flags 0x%llx hold bits this build does not know (version 2 defines bits 0 "
                         "and 1)", path, (unsigned long long)flags);
    if (docs == 0 && f->count > 0) return fsdp_errf(err, "%s: header says %llu tokens in 0 documents", path,
                                                     (unsigned long long)f->count);
    if (docs > f->count) return fsdp_errf(err, "%s: header says %llu documents but only %llu tokens", path,
                                          (unsigned long long)docs, (unsigned long long)f->count);
    uint64_t table = (docs + 1) * 8, mask = (flags & 1) ? f->count / 8 + (f->count % 8 != 0) : 0;
    uint64_t total = FSDP_TOKENS_HEADER_BYTES + token_bytes;
    if (total > UINT64_MAX - table || total + table > UINT64_MAX - mask) return overflow(err, path, f->count, f->bytes_per_token);
    total += table + mask;
    if ((flags & 2) && file_size < total + 4)
        return fsdp_errf(err, "%s: header flags say a tokenizer record follows, but the file ends %s", path,
                         file_size < total ? "before the data it describes" : "with no room for it");
    if (flags & 2) {
        /* the tokenizer record: its length is the file's last 4 bytes, checked when the file is opened */
        f->tokenizer_offset = total;
        f->tokenizer_len = file_size - total - 4;
        total = file_size;
    }
    if (total != file_size)
        return fsdp_errf(err, "%s: header says %llu tokens and %llu documents%s (%llu bytes in all) but the file has %llu "
                              "bytes", path, (unsigned long long)f->count, (unsigned long long)docs,
                         (flags & 1) ? " with a loss mask" : "", (unsigned long long)total, (unsigned long long)file_size);
    f->num_documents = docs;
    f->tokenizer_hash = get_le(h + 40, 8);
    f->has_mask = (int)(flags & 1);
    f->documents_offset = FSDP_TOKENS_HEADER_BYTES + token_bytes;
    f->mask_offset = f->documents_offset + table;
    return 0;
}

/* Checks a 64-byte header against the file's size; fills the format fields of f. */
static int check_header(const unsigned char *h, uint64_t file_size, fsdp_token_file *f, fsdp_err *err) {
    const char *path = f->path;
    if (memcmp(h, FSDP_TOKENS_MAGIC, 8))
        return fsdp_errf(err, "%s: not an fsdp.c token file (bad magic; expected \"%s\")", path, FSDP_TOKENS_MAGIC);
    uint64_t version = get_le(h + 8, 4), width = get_le(h + 12, 4);
    uint64_t count = get_le(h + 16, 8), vocab = get_le(h + 24, 8);
    if (version != 1 && version != 2)
        return fsdp_errf(err, "%s: token file version %llu is not supported (this build reads versions 1 and 2)", path,
                         (unsigned long long)version);
    if (width != 2 && width != 4)
        return fsdp_errf(err, "%s: header says %llu bytes per token (must be 2 or 4)", path,
                         (unsigned long long)width);
    if (vocab == 0 || vocab > MAX_VOCAB)
        return fsdp_errf(err, "%s: header says vocabulary size %llu (must be 1 to %llu)", path,
                         (unsigned long long)vocab, MAX_VOCAB);
    if (count > (UINT64_MAX - FSDP_TOKENS_HEADER_BYTES) / width) return overflow(err, path, count, width);
    f->version = (int)version;
    f->bytes_per_token = (int)width;
    f->count = count;
    f->vocab_size = vocab;
    f->num_documents = 1;
    uint64_t data = file_size - FSDP_TOKENS_HEADER_BYTES;
    if (version == 2) return check_v2(h, file_size, count * width, f, err);
    if (count * width != data)
        return fsdp_errf(err, "%s: header says %llu tokens (%llu bytes of data) but the file holds %llu bytes of data",
                         path, (unsigned long long)count, (unsigned long long)(count * width),
                         (unsigned long long)data);
    return 0;
}

/* The document table starts at 0, never decreases and ends at the token count. */
static int check_documents(const fsdp_token_file *f, fsdp_err *err) {
    uint64_t starts[IO_CHUNK / 8], prev = 0;
    for (uint64_t d = 0; d <= f->num_documents;) {
        uint64_t m = f->num_documents + 1 - d < IO_CHUNK / 8 - 1 ? f->num_documents + 1 - d : IO_CHUNK / 8 - 1;
        if (fsdp_tokens_documents(f, d, m - 1, starts, err)) return -1;
        for (uint64_t i = 0; i < m; i++) {
            uint64_t s = starts[i], doc = d + i;
            if ((doc == 0 && s != 0) || s < prev || (doc == f->num_documents && s != f->count) || s > f->count)
                return fsdp_errf(err, "%s: document %llu starts at token %llu (the table must run from 0 up to %llu)",
                                 f->path, (unsigned long long)doc, (unsigned long long)s, (unsigned long long)f->count);
            prev = s;
        }
        d += m;
    }
    return 0;
}

/* The path the tokenizer record holds, and its length in the last 4 bytes agreeing with the file. */
static int read_tokenizer_record(int fd, fsdp_token_file *f, fsdp_err *err) {
    unsigned char len[4];
    uint64_t n = f->tokenizer_len;
    if (pread_full(fd, len, 4, f->tokenizer_offset + n) != 4 || get_le(len, 4) != n || n == 0 ||
        n >= sizeof f->tokenizer_path)
        return fsdp_errf(err, "%s: the tokenizer record after the %s (%llu bytes) is malformed", f->path,
                         f->has_mask ? "loss mask" : "document table", (unsigned long long)n);
    if (pread_full(fd, f->tokenizer_path, (size_t)n, f->tokenizer_offset) != (ssize_t)n)
        return fsdp_errf(err, "%s: cannot read the tokenizer record: %s", f->path, errno ? strerror(errno) : "short read");
    f->tokenizer_path[n] = 0;
    if (memchr(f->tokenizer_path, 0, (size_t)n))
        return fsdp_errf(err, "%s: the tokenizer record holds a NUL byte", f->path);
    return 0;
}

int fsdp_tokens_open(const char *path, fsdp_token_file *f, fsdp_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = fsdp_open_regular(path, O_RDONLY, 0, NULL, err);
    if (fd < 0) return -1;
    struct stat st;
    unsigned char h[FSDP_TOKENS_HEADER_BYTES];
    int rc;
    if (fstat(fd, &st) != 0)
        rc = fsdp_errf(err, "%s: fstat: %s", path, strerror(errno));
    else if ((uint64_t)st.st_size < FSDP_TOKENS_HEADER_BYTES)
        rc = fsdp_errf(err, "%s: %lld bytes, shorter than the %d-byte token file header", path, (long long)st.st_size,
                       FSDP_TOKENS_HEADER_BYTES);
    else if (pread_full(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        rc = fsdp_errf(err, "%s: cannot read the header: %s", path, errno ? strerror(errno) : "short read");
    else
        rc = check_header(h, (uint64_t)st.st_size, f, err);
    f->fd = fd;
    if (rc == 0 && f->version == 2) rc = check_documents(f, err);
    if (rc == 0 && f->tokenizer_offset) rc = read_tokenizer_record(fd, f, err);
    if (rc) {
        close(fd);
        f->fd = -1;
        return -1;
    }
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

int fsdp_tokens_documents(const fsdp_token_file *f, uint64_t first, uint64_t n, uint64_t *starts, fsdp_err *err) {
    if (first > f->num_documents || n > f->num_documents - first)
        return fsdp_errf(err, "%s: documents [%llu, %llu] are past the end (the file holds %llu)", f->path,
                         (unsigned long long)first, (unsigned long long)(first + n), (unsigned long long)f->num_documents);
    if (f->version == 1) { /* one document: the whole file */
        for (uint64_t i = 0; i <= n; i++) starts[i] = first + i == 0 ? 0 : f->count;
        return 0;
    }
    unsigned char buf[IO_CHUNK];
    for (uint64_t done = 0; done <= n;) {
        uint64_t m = n + 1 - done < IO_CHUNK / 8 ? n + 1 - done : IO_CHUNK / 8;
        errno = 0;
        ssize_t got = pread_full(f->fd, buf, (size_t)(m * 8), f->documents_offset + (first + done) * 8);
        if (got != (ssize_t)(m * 8))
            return fsdp_errf(err, "%s: cannot read the document table: %s", f->path,
                             got < 0 ? strerror(errno) : "the file is shorter than when it was opened");
        for (uint64_t i = 0; i < m; i++) starts[done + i] = get_le(buf + i * 8, 8);
        done += m;
    }
    return 0;
}

int fsdp_tokens_read_mask(const fsdp_token_file *f, uint64_t start, int n, uint8_t *out, fsdp_err *err) {
    if (n < 0 || start > f->count || (uint64_t)n > f->count - start)
        return fsdp_errf(err, "%s: mask of tokens [%llu, %llu) is past the end (the file holds %llu)", f->path,
                         (unsigned long long)start, (unsigned long long)start + (unsigned long long)(n < 0 ? 0 : n),
                         (unsigned long long)f->count);
    if (!f->has_mask) {
        memset(out, 1, (size_t)n);
        return 0;
    }
    unsigned char buf[IO_CHUNK];
    for (int done = 0; done < n;) {
        uint64_t pos = start + (uint64_t)done, byte0 = pos / 8;
        int m = n - done < (IO_CHUNK - 1) * 8 ? n - done : (IO_CHUNK - 1) * 8;
        uint64_t bytes = (pos + (uint64_t)m + 7) / 8 - byte0;
        errno = 0;
        ssize_t got = pread_full(f->fd, buf, (size_t)bytes, f->mask_offset + byte0);
        if (got != (ssize_t)bytes)
            return fsdp_errf(err, "%s: cannot read the loss mask at token %llu: %s", f->path, (unsigned long long)pos,
                             got < 0 ? strerror(errno) : "the file is shorter than when it was opened");
        for (int i = 0; i < m; i++) {
            uint64_t bit = pos + (uint64_t)i - byte0 * 8;
            out[done + i] = (uint8_t)((buf[bit / 8] >> (bit % 8)) & 1);
        }
        done += m;
    }
    return 0;
}

void fsdp_tokens_close(fsdp_token_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

