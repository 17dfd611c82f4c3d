/* Parallel positioned I/O of checkpoint bytes (ckpt_internal.h): worker threads move fixed-size
 * chunks of the extents with pread/pwrite, converting between the host dtype and the file's
 * float32 and hashing on the way.
 *
 * Writes go through the page cache, and each chunk's writeback is started at once
 * (sync_file_range), so the disk is busy from the first chunk and the final fsync finds little
 * left to do: the file goes to disk at the speed `dd conv=fsync` measures, while the writer's own
 * CPU work (a copy and a hash per byte) runs several times faster than any disk.
 *
 * No MPI and no HDF5 here: this code runs beside the training loop's MPI calls. Workers block
 * every signal, so a SIGTERM reaches the main thread (src/train/preemption.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/env.h"
#include "../base/files.h"
#include "../base/fault.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "ckpt_checksum.h"
#include "ckpt_internal.h"

#define CHUNK_ELEMS ((int64_t)4 << 20) /* 16 MiB of float32 per system call */

typedef struct {
    int extent;
    int64_t at, count; /* elements within the extent */
    int64_t before;    /* bytes of the chunks planned before this one */
} chunk;

struct ckpt_pio {
    int fd, dfd, writing, fault_step, num_slots; /* dfd: the file opened with O_DIRECT, or -1 */
    int direct;                                  /* readers: open with O_DIRECT where possible */
    char path[4096];
    const ckpt_extent *extents;
    fsdp_dtype host_dtype;
    void (*slot_label)(void *, int, char *, size_t);
    void *slot_ctx;

    chunk *chunks;
    int num_chunks;
    atomic_int next_chunk;
    _Atomic uint64_t *sums;
    atomic_llong bytes_done, last_progress_ns;
    /* Where the workers' time went, for FSDP_VERBOSE_CKPT: thread-nanoseconds in the system calls
     * that move bytes, in everything else of a chunk (copies, conversion, hashing), in the fsync. */
    atomic_llong io_ns, work_ns;
    long long sync_ns;    /* written by the last worker before `finished` */
    double started_at;    /* fsdp_now(), as finished_at */
    int num_threads_started; /* num_threads is cleared once they are joined */
    int64_t bytes_total;
    atomic_int cancelled;
    int bad_chunk; /* the chunk whose bad value err names, -1: err names none (under lock) */

    pthread_t *threads;
    int num_threads, running, finished;
    double finished_at;
    pthread_mutex_t lock;
    fsdp_err err; /* the first failure, under lock */
};

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void fail(ckpt_pio *p, const char *fmt, const char *a, const char *b) {
    pthread_mutex_lock(&p->lock);
    if (!p->err.failed) fsdp_errf(&p->err, fmt, p->path, a, fsdp_rank(), b);
    pthread_mutex_unlock(&p->lock);
    atomic_store(&p->cancelled, 1);
}

static void fail_io(ckpt_pio *p, int slot, const char *call, int code) {
    char label[320] = "the file";
    if (slot >= 0 && p->slot_label) p->slot_label(p->slot_ctx, slot, label, sizeof label);
    char what[400];
    snprintf(what, sizeof what, "%s of %s", call, label);
    fail(p, "checkpoint %s: %s failed on rank %d: %s", what, strerror(code));
}

int64_t ckpt_first_bad(const uint32_t *bits, int64_t n, int nonneg) {
    for (int64_t j = 0; j < n; j++)
        if ((bits[j] & 0x7f800000u) == 0x7f800000u || (nonneg && bits[j] > 0x80000000u)) return j;
    return -1;
}

void ckpt_bad_value_text(char *buf, size_t cap, const char *file, const char *label, uint32_t bits, uint64_t index,
                         int rank, int writing) {
    float x;
    memcpy(&x, &bits, 4);
    int finite = (bits & 0x7f800000u) != 0x7f800000u;
    const char *what = finite ? "negative values" : "non-finite values (NaN or infinity)";
    if (writing)
        snprintf(buf, cap, "checkpoint %s not written: %s holds %s, the first at element %llu (%g), on rank %d (%s; "
                 "checkpoints written before stay as they were)", file, label, what, (unsigned long long)index, (double)x, rank,
                 finite ? "a second moment is a mean of squares, never below 0: the optimizer state is corrupt"
                        : "the weights or optimizer state are poisoned");
    else
        snprintf(buf, cap, "checkpoint %s: %s holds %s, the first at element %llu (%g) (read on rank %d): %s", file, label,
                 what, (unsigned long long)index, (double)x, rank,
                 finite ? "a second moment is a mean of squares, never below 0, so the file was edited or written by a "
                          "faulty program"
                        : "it was written from a diverged run");
}

/* A bad value in chunk `chunk`. Workers take chunks in order and finish every chunk they take, so
 * keeping the lowest such chunk names the first bad element of what this rank moved. */
static void fail_value(ckpt_pio *p, int chunk, const ckpt_extent *e, uint32_t bits, uint64_t index) {
    char label[320] = "a tensor", msg[sizeof p->err.msg];
    if (p->slot_label) p->slot_label(p->slot_ctx, e->dataset, label, sizeof label);
    ckpt_bad_value_text(msg, sizeof msg, p->path, label, bits, index, fsdp_rank(), p->writing);
    pthread_mutex_lock(&p->lock);
    if (!p->err.failed || (p->bad_chunk >= 0 && chunk < p->bad_chunk)) {
        fsdp_errf(&p->err, "%s", msg);
        p->bad_chunk = chunk;
    }
    pthread_mutex_unlock(&p->lock);
    atomic_store(&p->cancelled, 1);
}

/* The values of a chunk about to be written, or just read: 0, or -1 after recording the first bad one. */
static int check_values(ckpt_pio *p, int chunk, const ckpt_extent *e, const uint32_t *bits, int64_t at, int64_t n,
                        uint64_t nonfinite) {
    if (!nonfinite && !e->nonneg) return 0;
    int64_t j = ckpt_first_bad(bits, n, e->nonneg);
    if (j < 0) return 0;
    fail_value(p, chunk, e, bits[j], e->first + (uint64_t)(at + j));
    return -1;
}

/* pread/pwrite that retry on EINTR and short transfers. Returns 0, or an errno value; a read past
 * the end of the file gives -1. */
static int transfer(ckpt_pio *p, int fd, void *buf, size_t n, int64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = p->writing ? pwrite(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done))
                               : pread(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) return p->writing ? EIO : -1;
        done += (size_t)r;
    }
    return 0;
}

#define BLOCK 4096

/* Writes `bytes` at `off`: the whole 4 KiB blocks through O_DIRECT (src is laid out so that they
 * start at aligned addresses), the partial blocks at either end through the page cache. Without
 * O_DIRECT everything goes through the page cache, its writeback started at once. */
static int write_bytes(ckpt_pio *p, char *src, size_t bytes, int64_t off) {
    int64_t end = off + (int64_t)bytes, a = (off + BLOCK - 1) / BLOCK * BLOCK, b = end / BLOCK * BLOCK;
    if (p->dfd < 0 || b - a < 16 * BLOCK) {
        int code = transfer(p, p->fd, src, bytes, off);
        /* Start writeback of what was just written; fsync at the end waits for it. */
        if (!code) sync_file_range(p->fd, off, (off_t)bytes, SYNC_FILE_RANGE_WRITE);
        return code;
    }
    int code = a > off ? transfer(p, p->fd, src, (size_t)(a - off), off) : 0;
    if (!code) code = transfer(p, p->dfd, src + (a - off), (size_t)(b - a), a);
    if (!code && end > b) code = transfer(p, p->fd, src + (b - off), (size_t)(end - b), b);
    return code;
}

/* O_DIRECT read of `want` bytes at the aligned offset `at`; succeeds once `need` of them are in
 * (the last block may run past the end of the file). 0, an errno value, or -1 at a premature end. */
static int read_direct(int fd, void *buf, size_t want, int64_t at, size_t need) {
    size_t done = 0;
    while (done < need) {
        ssize_t r = pread(fd, (char *)buf + done, want - done, (off_t)(at + (int64_t)done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static void bf16_to_f32(uint32_t *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
}

static void f32_to_bf16(uint16_t *dst, const uint32_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, &src[i], 4);
        dst[i] = fsdp_f32_to_bf16(f);
    }
}

/* One chunk: 0, or -1 after recording the failure. */
static int move_chunk(ckpt_pio *p, int index, uint32_t *staging, uint64_t *local_sums, int rfd, int rdfd,
                      long long *io_ns) {
    const chunk *ch = &p->chunks[index];
    const ckpt_extent *e = &p->extents[ch->extent];
    int bf16 = p->host_dtype == FSDP_BF16;
    size_t hsize = fsdp_dtype_info_of(p->host_dtype)->bytes;
    char *host = e->host ? (char *)e->host + (size_t)ch->at * hsize : NULL;
    uint32_t *bits = bf16 || !host ? staging : (uint32_t *)host;
    /* For O_DIRECT the bytes are staged at the same offset within a block as in the file. */
    if (p->writing && p->dfd >= 0) bits = (uint32_t *)((char *)staging + (e->file_offset + ch->at * 4) % BLOCK);
    int64_t off = e->file_offset + ch->at * 4;
    size_t bytes = (size_t)ch->count * 4;
    uint64_t nonfinite = 0;
    if (p->writing) {
        /* The test hook strikes the chunks of the second half, whatever order the workers take them in. */
        int injected = ch->before * 2 >= p->bytes_total ? fsdp_fault_ckpt(p->fault_step, FSDP_CKPT_AT_WRITE) : 0;
        if (bf16)
            bf16_to_f32(bits, (const uint16_t *)host, ch->count);
        else if (bits != (uint32_t *)host)
            memcpy(bits, host, (size_t)ch->count * 4);
        if (e->slot >= 0) local_sums[e->slot] += fsdp_cksum_f32(bits, e->first + (uint64_t)ch->at, (size_t)ch->count, &nonfinite);
        if (check_values(p, index, e, bits, ch->at, ch->count, nonfinite)) return -1;
        long long t0 = now_ns();
        int code = injected ? injected : write_bytes(p, (char *)bits, bytes, off);
        *io_ns += now_ns() - t0;
        if (code) {
            fail_io(p, e->dataset, "pwrite", code);
            return -1;
        }
    } else {
        char *data;
        int code;
        long long t0 = now_ns();
        if (rdfd >= 0) {
            /* O_DIRECT: the whole blocks around the range, into the aligned staging buffer. */
            int64_t a = off / BLOCK * BLOCK, end = off + (int64_t)bytes, b = (end + BLOCK - 1) / BLOCK * BLOCK;
            code = read_direct(rdfd, staging, (size_t)(b - a), a, (size_t)(end - a));
            data = (char *)staging + (off - a);
        } else {
            data = bf16 || !host ? (char *)staging : host;
            code = transfer(p, rfd, data, bytes, off);
        }
        *io_ns += now_ns() - t0;
        if (code) {
            if (code < 0) {
                char label[320] = "a tensor";
                if (p->slot_label) p->slot_label(p->slot_ctx, e->dataset, label, sizeof label);
                fail(p, "checkpoint %s is truncated: %s ends beyond the end of the file (read on rank %d)%s", label, "");
            } else {
                fail_io(p, e->dataset, "pread", code);
            }
            return -1;
        }
        bits = (uint32_t *)data;
        /* Only the rank that hashes an element judges it: a replica reads the same bytes. */
        if (e->slot >= 0) {
            local_sums[e->slot] += fsdp_cksum_f32(bits, e->first + (uint64_t)ch->at, (size_t)ch->count, &nonfinite);
            if (check_values(p, index, e, bits, ch->at, ch->count, nonfinite)) return -1;
        }
        if (host && bf16)
            f32_to_bf16((uint16_t *)host, bits, ch->count);
        else if (host && data != host)
            memcpy(host, data, bytes);
    }
    atomic_fetch_add(&p->bytes_done, (long long)bytes);
    atomic_store(&p->last_progress_ns, now_ns());
    return 0;
}

static void *worker(void *arg) {
    ckpt_pio *p = arg;
    void *staging = NULL;
    if (posix_memalign(&staging, BLOCK, (size_t)CHUNK_ELEMS * 4 + 2 * BLOCK)) staging = NULL;
    uint64_t *sums = calloc((size_t)(p->num_slots > 0 ? p->num_slots : 1), sizeof *sums);
    /* Readers open the file each: one readahead state per sequential stream. */
    int rfd = p->fd, rdfd = p->dfd;
    fsdp_err open_err = {0}, direct_err = {0};
    if (!p->writing) {
        /* As regular files only (base/files.h): a FIFO swapped in for the checkpoint must not hang a
         * reader. The O_DIRECT one may fail where unsupported: -1, and the buffered one reads. */
        rfd = fsdp_open_regular(p->path, O_RDONLY, 0, "checkpoint", &open_err);
        rdfd = p->direct ? fsdp_open_regular(p->path, O_RDONLY | O_DIRECT, 0, "checkpoint", &direct_err) : -1;
    }
    if (!staging || !sums) {
        fail(p, "checkpoint %s: %s on rank %d%s", "out of host memory for the transfer buffers", "");
    } else if (rfd < 0) {
        /* open_err names the file already: "%.0s" skips the path fail() passes first. */
        fail(p, "%.0s%s on rank %d%s", open_err.msg, "");
    } else {
        long long io = 0, began = now_ns();
        for (;;) {
            if (atomic_load(&p->cancelled)) break;
            int i = atomic_fetch_add(&p->next_chunk, 1);
            if (i >= p->num_chunks || move_chunk(p, i, staging, sums, rfd, rdfd, &io)) break;
        }
        atomic_fetch_add(&p->io_ns, io);
        atomic_fetch_add(&p->work_ns, now_ns() - began - io);
        for (int s = 0; s < p->num_slots; s++)
            if (sums[s]) atomic_fetch_add(&p->sums[s], sums[s]);
    }
    if (!p->writing) {
        if (rfd >= 0) close(rfd);
        if (rdfd >= 0) close(rdfd);
    }
    free(staging);
    free(sums);
    pthread_mutex_lock(&p->lock);
    int last = --p->running == 0, ok = !p->err.failed && !atomic_load(&p->cancelled);
    pthread_mutex_unlock(&p->lock);
    if (last) {
        long long sync_began = now_ns();
        if (ok && p->writing && fsync(p->fd) != 0) fail_io(p, -1, "fsync", errno);
        pthread_mutex_lock(&p->lock);
        p->sync_ns = now_ns() - sync_began;
        p->finished = 1;
        p->finished_at = fsdp_now();
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* FSDP_VERBOSE_CKPT: one line per rank and transfer. The thread-seconds say whether a slow transfer
 * waited on the storage (system calls), on the CPU (conversion, hashing, copies) or on the fsync. */
static void report(ckpt_pio *p) {
    double wall = p->finished_at - p->started_at, gb = (double)p->bytes_total / 1e9;
    double io = (double)atomic_load(&p->io_ns) * 1e-9, work = (double)atomic_load(&p->work_ns) * 1e-9;
    char tail[48] = "";
    if (p->writing) snprintf(tail, sizeof tail, "; the final fsync %.3f s", (double)p->sync_ns * 1e-9);
    printf("checkpoint I/O on rank %d: %s %.2f %s in %.3f s (%.2f GB/s) on %d threads (%s); thread-seconds: %.3f in %s, "
           "%.3f converting, hashing and copying%s\n",
           fsdp_rank(), p->writing ? "wrote" : "read", gb < 1 ? gb * 1e3 : gb, gb < 1 ? "MB" : "GB", wall,
           wall > 0 ? gb / wall : 0.0, p->num_threads_started,
           (p->writing ? p->dfd >= 0 : p->direct) ? "O_DIRECT" : "page cache", io, p->writing ? "pwrite" : "pread", work,
           tail);
    fflush(stdout);
}

ckpt_pio *ckpt_pio_start(int fd, int direct_fd, const char *path, int writing, const ckpt_extent *extents, int num_extents,
                         fsdp_dtype host_dtype, int num_slots, void (*slot_label)(void *, int, char *, size_t),
                         void *slot_ctx, int fault_step) {
    ckpt_pio *p = fsdp_xcalloc(1, sizeof *p, "the checkpoint transfer");
    p->fd = fd, p->dfd = writing ? direct_fd : -1, p->direct = !writing && fsdp_env_ckpt_direct_io(), p->writing = writing, p->extents = extents, p->host_dtype = host_dtype;
    p->num_slots = num_slots, p->slot_label = slot_label, p->slot_ctx = slot_ctx, p->fault_step = fault_step;
    snprintf(p->path, sizeof p->path, "%s", path);
    p->bad_chunk = -1;
    pthread_mutex_init(&p->lock, NULL);
    p->sums = fsdp_xcalloc((size_t)(num_slots > 0 ? num_slots : 1), sizeof *p->sums, "checkpoint checksums");
    int cap = 0;
    for (int i = 0; i < num_extents; i++) cap += (int)((extents[i].count + CHUNK_ELEMS - 1) / CHUNK_ELEMS);
    p->chunks = fsdp_xcalloc((size_t)(cap > 0 ? cap : 1), sizeof *p->chunks, "checkpoint chunks");
    for (int i = 0; i < num_extents; i++)
        for (int64_t at = 0; at < extents[i].count; at += CHUNK_ELEMS) {
            chunk *c = &p->chunks[p->num_chunks++];
            c->extent = i, c->at = at;
            c->count = extents[i].count - at < CHUNK_ELEMS ? extents[i].count - at : CHUNK_ELEMS;
            c->before = p->bytes_total;
            p->bytes_total += c->count * 4;
        }
    p->started_at = fsdp_now();
    atomic_store(&p->last_progress_ns, now_ns());
    p->num_threads = fsdp_env_ckpt_threads();
    if (p->num_threads > p->num_chunks) p->num_threads = p->num_chunks;
    if (p->num_threads == 0) {
        p->finished = 1;
        p->finished_at = fsdp_now();
        return p;
    }
    p->num_threads_started = p->num_threads;
    p->threads = fsdp_xcalloc((size_t)p->num_threads, sizeof *p->threads, "checkpoint threads");
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    p->running = p->num_threads;
    for (int t = 0; t < p->num_threads; t++) {
        int rc = pthread_create(&p->threads[t], NULL, worker, p);
        if (rc) fsdp_fatal("pthread_create failed for a checkpoint transfer thread: %s", strerror(rc));
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

int ckpt_pio_done(ckpt_pio *p, fsdp_err *err) {
    pthread_mutex_lock(&p->lock);
    int done = p->finished;
    if (done && err && p->err.failed) *err = p->err;
    pthread_mutex_unlock(&p->lock);
    return done;
}

int ckpt_pio_wait(ckpt_pio *p, fsdp_err *err) {
    double limit = fsdp_env_sync_timeout_s();
    while (!ckpt_pio_done(p, NULL)) {
        if (ckpt_pio_idle_s(p) > limit)
            fsdp_fatal("checkpoint %s: no progress for %.0f s %s it (%.2f of %.2f GB done): the storage has stalled; "
                       "set FSDP_SYNC_TIMEOUT to wait longer",
                       p->path, ckpt_pio_idle_s(p), p->writing ? "writing" : "reading",
                       (double)ckpt_pio_bytes_done(p) / 1e9, (double)p->bytes_total / 1e9);
        fsdp_sleep_us(2000);
    }
    for (int t = 0; t < p->num_threads; t++) pthread_join(p->threads[t], NULL);
    p->num_threads = 0;
    if (p->err.failed) {
        if (err) *err = p->err;
        return -1;
    }
    return 0;
}

double ckpt_pio_idle_s(const ckpt_pio *p) {
    return (double)(now_ns() - atomic_load(&((ckpt_pio *)p)->last_progress_ns)) * 1e-9;
}
int64_t ckpt_pio_bytes_done(const ckpt_pio *p) { return atomic_load(&((ckpt_pio *)p)->bytes_done); }
int64_t ckpt_pio_bytes_total(const ckpt_pio *p) { return p->bytes_total; }
double ckpt_pio_finished_at(const ckpt_pio *p) {
    pthread_mutex_lock(&((ckpt_pio *)p)->lock);
    double at = p->finished ? p->finished_at : 0.0;
    pthread_mutex_unlock(&((ckpt_pio *)p)->lock);
    return at;
}
const uint64_t *ckpt_pio_sums(const ckpt_pio *p) { return (const uint64_t *)p->sums; }
void ckpt_pio_cancel(ckpt_pio *p) { atomic_store(&p->cancelled, 1); }

void ckpt_pio_free(ckpt_pio *p) {
    if (!p) return;
    static int verbose = -1;
    if (verbose < 0) verbose = fsdp_env_verbose_ckpt();
    if (verbose && p->num_threads_started && ckpt_pio_done(p, NULL) && !p->err.failed && !atomic_load(&p->cancelled))
        report(p);
    atomic_store(&p->cancelled, 1);
    /* A worker stuck in the kernel (a stalled disk) cannot be waited for on the way out: after a
     * few seconds it is left behind, with what it uses, for the process exit to end. */
    for (int i = 0; i < 500 && !ckpt_pio_done(p, NULL); i++) usleep(10000);
    if (!ckpt_pio_done(p, NULL)) {
        for (int t = 0; t < p->num_threads; t++) pthread_detach(p->threads[t]);
        return;
    }
    for (int t = 0; t < p->num_threads; t++) pthread_join(p->threads[t], NULL);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p->chunks);
    free((void *)p->sums);
    free(p);
}
