/* The TensorBoard event writer of tfevents.h. */
#include "tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../base/files.h"

struct fsdp_tfevents {
    int fd;
    char path[4400];
    uint8_t *buf; /* one record being assembled */
    size_t len, cap;
};

static const char PREFIX[] = "events.out.tfevents.";

uint32_t fsdp_crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* reflected Castagnoli polynomial; idempotent, so a race writes the same values */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void put(fsdp_tfevents *w, const void *p, size_t n) {
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) fsdp_fatal("out of host memory (a TensorBoard event)");
        w->buf = b, w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void varint(fsdp_tfevents *w, uint64_t v) {
    uint8_t b[10];
    int n = 0;
    do {
        b[n] = v & 0x7f;
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    put(w, b, (size_t)n);
}

static void le(fsdp_tfevents *w, uint64_t v, int bytes) {
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, (size_t)bytes);
}

/* A length-delimited field: key, length, bytes. */
static void bytes_field(fsdp_tfevents *w, int field, const void *p, size_t n) {
    varint(w, (uint64_t)field << 3 | 2);
    varint(w, n);
    put(w, p, n);
}

/* The Event's head: wall_time (1, fixed64 double) and step (2, varint). */
static void event_head(fsdp_tfevents *w, int64_t step) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double wall = (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
    uint64_t bits;
    memcpy(&bits, &wall, 8);
    varint(w, 1 << 3 | 1);
    le(w, bits, 8);
    varint(w, 2 << 3 | 0);
    varint(w, (uint64_t)step);
}

/* Frames the assembled Event (w->buf from byte 12 on) as one TFRecord and writes it. */
static int write_record(fsdp_tfevents *w, fsdp_err *err) {
    size_t n = w->len - 12;
    uint8_t head[12];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t c = masked(fsdp_crc32c(head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
    memcpy(w->buf, head, 12);
    le(w, masked(fsdp_crc32c(w->buf + 12, n)), 4);
    /* one write of the whole record: a reader never sees half of one unless the disk fills */
    size_t done = 0;
    while (done < w->len) {
        ssize_t k = write(w->fd, w->buf + done, w->len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return fsdp_errf(err, "%s: write: %s (rank 0)", w->path, strerror(errno));
        done += (size_t)k;
    }
    return 0;
}

static void begin(fsdp_tfevents *w) {
    w->len = 0;
    uint8_t room[12] = {0};
    put(w, room, 12); /* the record's length and its CRC, filled in by write_record */
}

int fsdp_tfevents_scalars(fsdp_tfevents *w, int64_t step, const char *const *tags, const double *values, int n,
                          fsdp_err *err) {
    begin(w);
    event_head(w, step);
    /* Summary (Event field 5) of Values (Summary field 1): tag (1), simple_value (2, fixed32 float) */
    fsdp_tfevents summary = {0}, value = {0};
    for (int i = 0; i < n; i++) {
        value.len = 0;
        bytes_field(&value, 1, tags[i], strlen(tags[i]));
        float f = (float)values[i];
        uint32_t bits;
        memcpy(&bits, &f, 4);
        varint(&value, 2 << 3 | 5);
        le(&value, bits, 4);
        bytes_field(&summary, 1, value.buf, value.len);
    }
    bytes_field(w, 5, summary.buf, summary.len);
    free(summary.buf);
    free(value.buf);
    return write_record(w, err);
}

/* mkdir -p: each prefix of dir made when missing; one that exists must be a directory. */
static int make_dirs(const char *dir, const char *flag, fsdp_err *err) {
    char d[4096];
    if (snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d) return fsdp_usagef(err, "%s %s: path too long", flag, dir);
    for (char *p = d + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0') continue;
        *p = '\0';
        struct stat st;
        if (stat(d, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return fsdp_usagef(err, "%s %s: %s is %s, not a directory", flag, dir, d,
                                   fsdp_file_type_name(st.st_mode));
        } else if (errno != ENOENT || (mkdir(d, 0777) != 0 && errno != EEXIST)) {
            return fsdp_errf(err, "%s %s: cannot create the folder %s: %s (rank 0)", flag, dir, d, strerror(errno));
        }
        *p = c;
        if (!c) return 0;
    }
}

int fsdp_tfevents_present(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)))
        found = !strncmp(e->d_name, PREFIX, sizeof PREFIX - 1);
    closedir(d);
    return found;
}

fsdp_tfevents *fsdp_tfevents_open(const char *dir, const char *flag, fsdp_err *err) {
    if (make_dirs(dir, flag, err)) return NULL;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    fsdp_tfevents *w = fsdp_xcalloc(1, sizeof *w, "a TensorBoard writer");
    long now = (long)time(NULL);
    /* TensorFlow's name; a second file of the same second and host (a quick resume) gets ".N" */
    for (int k = 0;; k++) {
        char suffix[16] = "";
        if (k) snprintf(suffix, sizeof suffix, ".%d", k);
        snprintf(w->path, sizeof w->path, "%s/%s%010ld.%s%s", dir, PREFIX, now, host, suffix);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0 || errno != EEXIST || k == 100) break;
    }
    if (w->fd < 0) {
        fsdp_errf(err, "%s %s: cannot create %s: %s (rank 0)", flag, dir, w->path, strerror(errno));
        free(w);
        return NULL;
    }
    begin(w);
    event_head(w, 0);
    static const char VERSION[] = "brain.Event:2";
    bytes_field(w, 3, VERSION, sizeof VERSION - 1);
    if (write_record(w, err)) {
        fsdp_tfevents_close(w);
        return NULL;
    }
    return w;
}

const char *fsdp_tfevents_path(const fsdp_tfevents *w) { return w->path; }

void fsdp_tfevents_close(fsdp_tfevents *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w->buf);
    free(w);
}
