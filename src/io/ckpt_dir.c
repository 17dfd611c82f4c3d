/* The checkpoint directory of ckpt_dir.h: the latest pointer, listing and pruning step files, the
 * run's lock, stale temporaries, and the shared-storage check. */
#define _GNU_SOURCE
#include "ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../base/agree.h"
#include "../base/files.h"
#include "../base/watchdog.h"

static int join(char *out, size_t cap, const char *dir, const char *name) {
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap ? 0 : -1;
}

/* ---- the latest pointer -------------------------------------------------------------------------- */

/* A file name the latest pointer may hold: a plain name in the directory, printable. */
static int plain_name(const char *s) {
    if (!s[0] || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || (unsigned char)*p < 0x20) return 0;
    return 1;
}

int fsdp_ckpt_set_latest(const char *dir, const char *file_name, fsdp_err *err) {
    char path[4096], tmp[4200];
    if (!plain_name(file_name)) return fsdp_errf(err, "%s/latest: '%s' is not a file name", dir, file_name);
    if (join(path, sizeof path, dir, "latest") || join(tmp, sizeof tmp, dir, "latest.tmp"))
        return fsdp_errf(err, "%s: path too long", dir);
    FILE *f = fopen(tmp, "w");
    if (!f) return fsdp_errf(err, "%s: %s", tmp, strerror(errno));
    int ok = fprintf(f, "%s\n", file_name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) ok = 0, saved = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, saved = errno;
    if (!ok) {
        unlink(tmp);
        return fsdp_errf(err, "%s: cannot write: %s", path, strerror(saved));
    }
    int dfd = open(dir, O_RDONLY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* best effort: the rename is durable once the directory is */
        close(dfd);
    }
    return 0;
}

int fsdp_ckpt_find_latest(const char *dir, char *out, int cap, fsdp_err *err) {
    char path[4096], rbuf[1100];
    if (join(path, sizeof path, dir, "latest")) return fsdp_errf(err, "%s: path too long", dir);
    int exists = fsdp_regular_or_absent(path, NULL, err);
    if (exists <= 0) return exists;
    /* Opened as a regular file only: a FIFO put there since the look above must not hang the read. */
    FILE *f = fsdp_fopen_regular(path, NULL, err);
    if (!f) return -1;
    size_t n = fread(rbuf, 1, sizeof rbuf - 1, f);
    fclose(f);
    rbuf[n] = 0;
    while (n > 0 && (rbuf[n - 1] == '\n' || rbuf[n - 1] == '\r' || rbuf[n - 1] == ' ')) rbuf[--n] = 0;
    if (n == sizeof rbuf - 1 || strlen(rbuf) != n || !plain_name(rbuf))
        return fsdp_errf(err, "%s: malformed pointer (expected one file name, e.g. step-00000100.h5)", path);
    if (cap <= 0 || snprintf(out, (size_t)cap, "%s/%s", dir, rbuf) >= cap)
        return fsdp_errf(err, "%s: the path it names is too long", path);
    /* A dangling pointer must not silently restart training from scratch. */
    if (access(out, F_OK) != 0) return fsdp_errf(err, "%s names %s, which does not exist", path, rbuf);
    return 1;
}

/* ---- step files ------------------------------------------------------------------------------------ */

long long fsdp_ckpt_step_of(const char *name) {
    if (strncmp(name, "step-", 5)) return -1;
    const char *p = name + 5;
    long long step = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++) step = step * 10 + (*p - '0');
    return digits && !strcmp(p, ".h5") ? step : -1;
}

static int newest_first(const void *a, const void *b) {
    long long x = ((const fsdp_ckpt_file *)a)->step, y = ((const fsdp_ckpt_file *)b)->step;
    return (x < y) - (x > y);
}

int fsdp_ckpt_list(const char *dir, fsdp_ckpt_file **out, int *count, fsdp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return fsdp_errf(err, "%s: %s", dir, strerror(errno));
    int n = 0, cap = 16;
    fsdp_ckpt_file *files = fsdp_xmalloc((size_t)cap * sizeof *files, "the checkpoint list");
    for (struct dirent *e; (e = readdir(d));) {
        long long step = fsdp_ckpt_step_of(e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof files->name) continue;
        if (n == cap) {
            fsdp_ckpt_file *grown = realloc(files, (size_t)(cap *= 2) * sizeof *files);
            if (!grown) fsdp_fatal("out of host memory listing %s", dir);
            files = grown;
        }
        files[n].step = step;
        snprintf(files[n++].name, sizeof files->name, "%s", e->d_name);
    }
    closedir(d);
    qsort(files, (size_t)n, sizeof *files, newest_first);
    *out = files;
    *count = n;
    return 0;
}

int fsdp_ckpt_prune(const char *dir, int keep, fsdp_err *err) {
    if (keep <= 0) return 0;
    char latest[4096];
    fsdp_err ignore = {0};
    if (fsdp_ckpt_find_latest(dir, latest, sizeof latest, &ignore) != 1) return 0;
    long long newest = fsdp_ckpt_step_of(strrchr(latest, '/') + 1);
    if (newest < 0) return 0; /* 'latest' names a file of another pattern: leave everything alone */
    fsdp_ckpt_file *files = NULL;
    int n = 0;
    if (fsdp_ckpt_list(dir, &files, &n, err)) return -1;
    int kept = 0, rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (files[i].step > newest) continue; /* another timeline: not ours to judge */
        if (kept++ < keep) continue;           /* the file 'latest' names is the first of these */
        char path[4096];
        if (join(path, sizeof path, dir, files[i].name) || (unlink(path) != 0 && errno != ENOENT))
            rc = fsdp_errf(err, "%s: cannot delete: %s", path, strerror(errno));
    }
    free(files);
    return rc;
}

int fsdp_ckpt_remove_stale(const char *dir, void (*removed)(const char *path), fsdp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return fsdp_errf(err, "%s: %s", dir, strerror(errno));
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        char stem[256];
        if (len < 5 || len >= sizeof stem || strcmp(e->d_name + len - 4, ".tmp")) continue;
        snprintf(stem, sizeof stem, "%.*s", (int)(len - 4), e->d_name);
        if (fsdp_ckpt_step_of(stem) < 0 && strcmp(stem, "latest")) continue;
        char path[4096];
        if (join(path, sizeof path, dir, e->d_name) == 0 && unlink(path) == 0) {
            count++;
            if (removed) removed(path);
        }
    }
    closedir(d);
    return count;
}

/* ---- the lock --------------------------------------------------------------------------------------- */

struct fsdp_ckpt_lock {
    int fd;
    char path[4096];
};

static void holder_of(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    if (!buf[0]) snprintf(buf, cap, "host and pid unknown");
}

fsdp_ckpt_lock *fsdp_ckpt_lock_acquire(const char *dir, fsdp_err *err) {
    fsdp_ckpt_lock *l = fsdp_xcalloc(1, sizeof *l, "the checkpoint directory lock");
    if (join(l->path, sizeof l->path, dir, ".lock")) {
        fsdp_errf(err, "--ckpt-dir %s: path too long", dir);
        free(l);
        return NULL;
    }
    for (int attempt = 0; attempt < 10; attempt++) {
        l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        if (l->fd < 0) {
            fsdp_errf(err, "--ckpt-dir %s is not writable: cannot create %s: %s", dir, l->path, strerror(errno));
            break;
        }
        if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                char holder[256];
                holder_of(l->fd, holder, sizeof holder);
                fsdp_errf(err,
                          "--ckpt-dir %s is in use by another run (%s): two runs must not write into one checkpoint "
                          "directory; wait for it to end or pass another --ckpt-dir",
                          dir, holder);
                break;
            }
            fprintf(stderr, "fsdp: notice: cannot lock %s (%s): make sure no other run uses --ckpt-dir %s\n", l->path,
                    strerror(errno), dir);
        }
        /* The previous holder unlinks the file on its way out: a lock on an unlinked file protects
         * nothing, so make sure the path still names the file locked. */
        struct stat by_fd, by_path;
        if (fstat(l->fd, &by_fd) == 0 && stat(l->path, &by_path) == 0 && by_fd.st_ino == by_path.st_ino &&
            by_fd.st_dev == by_path.st_dev) {
            char host[128] = "?", text[256];
            gethostname(host, sizeof host - 1);
            int n = snprintf(text, sizeof text, "host %s, pid %d\n", host, (int)getpid());
            if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, text, (size_t)n, 0) != n) {
                fsdp_errf(err, "--ckpt-dir %s is not writable: %s: %s", dir, l->path, strerror(errno));
                break;
            }
            return l;
        }
        close(l->fd);
        l->fd = -1;
    }
    if (!err->failed) fsdp_errf(err, "--ckpt-dir %s: cannot take its lock %s", dir, l->path);
    if (l->fd >= 0) close(l->fd);
    free(l);
    return NULL;
}

void fsdp_ckpt_lock_release(fsdp_ckpt_lock *l) {
    if (!l) return;
    unlink(l->path); /* while still holding it: see fsdp_ckpt_lock_acquire */
    close(l->fd);
    free(l);
}

/* ---- shared storage --------------------------------------------------------------------------------- */

int fsdp_ckpt_dir_check(MPI_Comm comm, const char *dir, int64_t *free_bytes, fsdp_err *err) {
    int rank;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    char path[4096];
    int64_t head[2] = {0, 0}; /* nonce, free bytes */
    snprintf(path, sizeof path, "%s/.write-test.%d", dir, (int)getpid());
    if (rank == 0) {
        head[0] = (int64_t)time(NULL) ^ ((int64_t)getpid() << 20) ^ (int64_t)(intptr_t)&head;
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        struct statvfs vfs;
        if (fd < 0 || pwrite(fd, head, sizeof head[0], 0) != (ssize_t)sizeof head[0])
            fsdp_errf(err, "--ckpt-dir %s is not writable: %s", dir, strerror(errno));
        else if (fstatvfs(fd, &vfs) == 0)
            head[1] = (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
        if (fd >= 0) close(fd);
    }
    if (fsdp_agree(comm, err) == 0) {
        MPI_Request req;
        FSDP_CHECK_MPI(MPI_Ibcast(head, 2, MPI_INT64_T, 0, comm, &req));
        fsdp_mpi_wait(&req, "rank 0 to check --ckpt-dir");
        FSDP_CHECK_MPI(MPI_Ibcast(path, (int)sizeof path, MPI_CHAR, 0, comm, &req));
        fsdp_mpi_wait(&req, "rank 0 to check --ckpt-dir");
        if (rank != 0) {
            int64_t seen = 0;
            int fd = open(path, O_RDWR | O_CLOEXEC);
            if (fd < 0 || pread(fd, &seen, sizeof seen, 0) != (ssize_t)sizeof seen || seen != head[0])
                fsdp_errf(err,
                          "--ckpt-dir %s: rank %d cannot %s the files rank 0 writes there%s%s: every rank writes its "
                          "part of each checkpoint, so the directory must be on storage all nodes share",
                          dir, rank, fd < 0 ? "open" : "see", fd < 0 ? " " : "", fd < 0 ? strerror(errno) : "");
            if (fd >= 0) close(fd);
        }
        fsdp_agree(comm, err);
    }
    if (rank == 0) unlink(path);
    *free_bytes = head[1];
    return err->failed ? -1 : 0;
}
