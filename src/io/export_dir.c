/* The export's output directory of export_dir.h: lock, staging directory, switch, stale leftovers. */
#define _GNU_SOURCE /* renameat2's flags, linkat, fstatat */
#include "export_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../base/log.h"
#include "ckpt_dir.h"
#include "hf_model_dir.h"
#include "tokenizer_export.h"

#define SIBLING_MARK ".fsdp-export-"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

struct fsdp_export_dir {
    char given[4096];   /* --out as the user wrote it, for messages */
    char out[4096];     /* its real path: the directory that is swapped (a link to it stays a link) */
    char parent[4096];  /* the directory holding it, where the staging directory goes */
    char base[256];
    char staging[4600]; /* parent/base.fsdp-export-PID.tmp */
    char aside[4600];   /* parent/base.fsdp-export-PID.old: the old model, when the switch needed two renames */
    int lock_fd;         /* OUT's lock */
    int staging_lock_fd; /* the staging directory's lock: a sign of life for other hosts' exports */
    int created;         /* OUT did not exist before this export */
    int switched, exchanged;
    int hook;
    int tokenizer; /* the export writes the tokenizer files: OUT's are replaced, not kept */
};

/* ---- names ------------------------------------------------------------------------------------------ */

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t m = strlen(suffix);
    return n >= m && !memcmp(s + n - m, suffix, m);
}

static int digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* The first n bytes of name are a file an export writes. */
static int model_file(const char *name, size_t n) {
    static const char *const FIXED[] = {"config.json", "generation_config.json", "model.safetensors",
                                        "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof FIXED / sizeof FIXED[0]; i++)
        if (n == strlen(FIXED[i]) && !memcmp(name, FIXED[i], n)) return 1;
    /* model-00001-of-00003.safetensors */
    return n == 32 && !memcmp(name, "model-", 6) && digits(name + 6, 5) && !memcmp(name + 11, "-of-", 4) &&
           digits(name + 15, 5) && !memcmp(name + 20, ".safetensors", 12);
}

int fsdp_export_replaces(const char *name) {
    size_t n = strlen(name);
    return model_file(name, n) || (ends_with(name, n, ".tmp") && model_file(name, n - 4));
}

/* What the export replaces in OUT: the model's files, and the tokenizer's when it brings them. */
static int replaced(const fsdp_export_dir *d, const char *name) {
    if (fsdp_export_replaces(name)) return 1;
    for (int i = 0; d->tokenizer && FSDP_TOKENIZER_FILES[i]; i++) {
        size_t n = strlen(FSDP_TOKENIZER_FILES[i]);
        if (!strncmp(name, FSDP_TOKENIZER_FILES[i], n) && (!name[n] || !strcmp(name + n, ".tmp"))) return 1;
    }
    return 0;
}

void fsdp_export_dir_replace_tokenizer(fsdp_export_dir *d) { d->tokenizer = 1; }

int fsdp_model_dir_reads(const char *name) {
    size_t n = strlen(name);
    return !strcmp(name, "config.json") || !strcmp(name, "generation_config.json") || !strcmp(name, "tokenizer.json") ||
           !strcmp(name, "tokenizer_config.json") || ends_with(name, n, ".safetensors") ||
           ends_with(name, n, ".safetensors.index.json");
}

static int join(char *out, size_t cap, const char *dir, const char *name) {
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap ? 0 : -1;
}

/* parent and last component of a path (trailing slashes ignored); -1 for "/" or a name too long. */
static int split(const char *path, char *parent, size_t cap, char *base, size_t base_cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t slash = n;
    while (slash > 0 && path[slash - 1] != '/') slash--;
    size_t blen = n - slash;
    if (blen == 0 || blen >= base_cap) return -1;
    memcpy(base, path + slash, blen);
    base[blen] = 0;
    if (slash == 0)
        snprintf(parent, cap, ".");
    else if (slash == 1)
        snprintf(parent, cap, "/");
    else if (snprintf(parent, cap, "%.*s", (int)(slash - 1), path) >= (int)cap)
        return -1;
    return 0;
}

/* The pid in "BASE.fsdp-export-PID.tmp|.old", 0 when `name` is not such a sibling of OUT. */
static long sibling_pid(const char *name, const char *base, int *aside) {
    size_t b = strlen(base), m = strlen(SIBLING_MARK), n = strlen(name);
    if (n < b + m + 5 || memcmp(name, base, b) || memcmp(name + b, SIBLING_MARK, m)) return 0;
    const char *p = name + b + m;
    char *end;
    long pid = strtol(p, &end, 10);
    if (end == p || pid <= 0 || (strcmp(end, ".tmp") && strcmp(end, ".old"))) return 0;
    *aside = !strcmp(end, ".old");
    return pid;
}

/* ---- signals: the staging directory goes with the process ------------------------------------------ */

enum { PHASE_NONE, PHASE_WRITING, PHASE_SWITCHING };

static volatile sig_atomic_t g_phase, g_pending;
static char g_sig_staging[4600], g_sig_out[4096], g_sig_out_lock[4200];
static int g_sig_created;
static const int SIGNALS[] = {SIGTERM, SIGINT, SIGHUP};
static struct sigaction g_previous[3];
static int g_installed[3];

struct linux_dirent64_ {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Removes a directory of plain files with async-signal-safe calls only (no opendir: it allocates). */
static void remove_files_signal_safe(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    for (int pass = 0; pass < 8; pass++) {
        char buf[4096] __attribute__((aligned(8)));
        int removed = 0;
        if (lseek(fd, 0, SEEK_SET) < 0) break;
        for (;;) {
            long got = syscall(SYS_getdents64, fd, buf, sizeof buf);
            if (got <= 0) break;
            for (long at = 0; at < got;) {
                struct linux_dirent64_ *e = (struct linux_dirent64_ *)(buf + at);
                at += e->d_reclen;
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && unlinkat(fd, e->d_name, 0) == 0) removed++;
            }
        }
        if (!removed) break;
    }
    close(fd);
    rmdir(dir);
}

static void on_signal(int sig) {
    if (g_phase == PHASE_SWITCHING) { /* half a switch is what this module exists to prevent */
        g_pending = sig;
        return;
    }
    if (g_phase == PHASE_WRITING) {
        int saved = errno;
        remove_files_signal_safe(g_sig_staging);
        unlink(g_sig_out_lock); /* held by this process, which is about to die: see take_lock */
        if (g_sig_created) rmdir(g_sig_out);
        errno = saved;
    }
    /* Dies of the signal, as it would have without this handler (the signal is blocked until the
     * handler returns). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void install_handlers(const fsdp_export_dir *d) {
    snprintf(g_sig_staging, sizeof g_sig_staging, "%s", d->staging);
    snprintf(g_sig_out, sizeof g_sig_out, "%s", d->out);
    snprintf(g_sig_out_lock, sizeof g_sig_out_lock, "%s/%s", d->out, FSDP_EXPORT_LOCK_NAME);
    g_sig_created = d->created;
    g_pending = 0;
    g_phase = PHASE_WRITING;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, SIGNALS[i]); /* one handler at a time */
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < 3; i++) {
        if (sigaction(SIGNALS[i], NULL, &g_previous[i]) != 0) fsdp_fatal("sigaction failed for the export's clean-up");
        /* An ignored signal stays ignored (nohup's SIGHUP, SIGINT of a background job). */
        g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
        if (g_installed[i] && sigaction(SIGNALS[i], &sa, NULL) != 0)
            fsdp_fatal("sigaction failed for the export's clean-up");
    }
}

static int restore_handlers(void) {
    g_phase = PHASE_NONE;
    for (int i = 0; i < 3; i++)
        if (g_installed[i]) sigaction(SIGNALS[i], &g_previous[i], NULL);
    return g_pending;
}

/* ---- the lock ----------------------------------------------------------------------------------------- */

static void holder_of(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    if (!buf[0]) snprintf(buf, cap, "host and pid unknown");
}

/* An flock on DIR/.fsdp-export.lock without waiting: the descriptor, -1 with err. `what` names the
 * directory for messages. */
static int take_lock(const char *dir, const char *what, fsdp_err *err) {
    char path[4400];
    if (join(path, sizeof path, dir, FSDP_EXPORT_LOCK_NAME)) {
        fsdp_errf(err, "--out %s: path too long", what);
        return -1;
    }
    for (int attempt = 0; attempt < 10; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        if (fd < 0) {
            fsdp_errf(err, "--out %s: cannot create the export's lock %s: %s", what, path, strerror(errno));
            return -1;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                char holder[256];
                holder_of(fd, holder, sizeof holder);
                fsdp_errf(err, "--out %s is being written by another fsdp export (%s): two exports must not write "
                               "one directory; wait for it to end or give another --out", what, holder);
                close(fd);
                return -1;
            }
            fprintf(stderr, "fsdp: notice: cannot lock %s (%s): make sure no other export writes --out %s\n", path,
                    strerror(errno), what);
        }
        /* The previous holder unlinks the file on its way out, and a switch puts another file at
         * the name: a lock on a file the path no longer names protects nothing. */
        struct stat by_fd, by_path;
        if (fstat(fd, &by_fd) == 0 && stat(path, &by_path) == 0 && by_fd.st_ino == by_path.st_ino &&
            by_fd.st_dev == by_path.st_dev) {
            char host[128] = "?", text[256];
            gethostname(host, sizeof host - 1);
            int n = snprintf(text, sizeof text, "host %s, pid %d\n", host, (int)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
                fsdp_errf(err, "--out %s: cannot write the export's lock %s: %s", what, path, strerror(errno));
                close(fd);
                return -1;
            }
            return fd;
        }
        close(fd);
    }
    fsdp_errf(err, "--out %s: cannot take the export's lock %s (it keeps being replaced)", what, path);
    return -1;
}

/* Whether an export still works on a staging or aside directory: its pid is a process here, or its
 * lock is held (by a process on another host sharing the file system). */
static int still_alive(const char *dir, long pid) {
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) return 1;
    char path[4800];
    if (join(path, sizeof path, dir, FSDP_EXPORT_LOCK_NAME)) return 1;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

/* ---- emptying a staging or aside directory ------------------------------------------------------------ */

/* Empties `dir` toward OUT: the export's own files go (model files, their temporaries, a lock), so
 * do those OUT holds too (the hard links of the switch); anything else is not fsdp.c's to delete and
 * moves into OUT when OUT has no entry of that name. Returns 1 when `dir` is gone. */
static int drain(const fsdp_export_dir *d, const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return errno == ENOENT;
    int out_fd = open(d->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
        struct stat here, there;
        int known = fstatat(dirfd(dp), name, &here, AT_SYMLINK_NOFOLLOW) == 0;
        int is_dir = known && S_ISDIR(here.st_mode);
        int in_out = 0, free_in_out = 0;
        if (out_fd >= 0) {
            in_out = fstatat(out_fd, name, &there, AT_SYMLINK_NOFOLLOW) == 0;
            free_in_out = !in_out && errno == ENOENT;
        }
        int ours = !is_dir && (!strcmp(name, FSDP_EXPORT_LOCK_NAME) || replaced(d, name));
        int carried = known && !is_dir && in_out && here.st_dev == there.st_dev && here.st_ino == there.st_ino;
        if (ours || carried)
            unlinkat(dirfd(dp), name, 0);
        else if (free_in_out)
            renameat(dirfd(dp), name, out_fd, name);
    }
    closedir(dp);
    if (out_fd >= 0) close(out_fd);
    return rmdir(dir) == 0 || errno == ENOENT;
}

/* Staging and aside directories of exports into OUT that died; a model left aside by a switch that
 * died between its two renames is put back first when OUT is missing. */
static void remove_stale_siblings(const fsdp_export_dir *d, int put_back_only) {
    DIR *dp = opendir(d->parent);
    if (!dp) return;
    struct dirent *e;
    char found[64][256];
    int n = 0;
    while ((e = readdir(dp)) != NULL && n < 64) {
        int aside = 0;
        long pid = sibling_pid(e->d_name, d->base, &aside);
        if (pid && (!put_back_only || aside)) snprintf(found[n++], sizeof found[0], "%s", e->d_name);
    }
    closedir(dp);
    for (int i = 0; i < n; i++) {
        char path[4600];
        int aside = 0;
        long pid = sibling_pid(found[i], d->base, &aside);
        if (join(path, sizeof path, d->parent, found[i])) continue;
        if (pid != (long)getpid() && still_alive(path, pid)) continue;
        if (put_back_only) {
            if (rename(path, d->given) != 0) continue;
            fsdp_warn("export: put the model left at %s back as %s (an export killed while switching, pid %ld)", path,
                      d->given, pid);
            return;
        }
        if (drain(d, path))
            fsdp_warn("export: removed %s, left by an export that did not finish (pid %ld)", path, pid);
        else
            fsdp_warn("export: kept %s, left by an export that did not finish (pid %ld): it holds files that are "
                      "not fsdp.c's and that %s has under the same names", path, pid, d->given);
    }
}

/* Model temporaries inside OUT, written there by fsdp.c versions before the staging directory. */
static void remove_stale_inside(const fsdp_export_dir *d) {
    DIR *dp = opendir(d->out);
    if (!dp) return;
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(dp)) != NULL) {
        size_t n = strlen(e->d_name);
        if (!ends_with(e->d_name, n, ".tmp") || !fsdp_export_replaces(e->d_name)) continue;
        if (unlinkat(dirfd(dp), e->d_name, 0) == 0) removed++;
    }
    closedir(dp);
    if (removed) fsdp_warn("export: removed %d temporary file(s) an unfinished export left in %s", removed, d->given);
}

/* An fsdp.c checkpoint directory, which a running training may be writing into: never swapped. */
static int holds_checkpoints(const char *dir, char *what, size_t cap) {
    DIR *dp = opendir(dir);
    if (!dp) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(dp)) != NULL) {
        found = !strcmp(e->d_name, "latest") || fsdp_ckpt_step_of(e->d_name) >= 0;
        if (found) snprintf(what, cap, "%s", e->d_name);
    }
    closedir(dp);
    return found;
}

/* ---- the directory's life ----------------------------------------------------------------------------- */

static int sync_dir(const char *dir, fsdp_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fsdp_errf(err, "%s: cannot open the directory: %s", dir, strerror(errno));
    /* Some file systems refuse fsync on directories (EINVAL); the renames are then as durable as
     * they can be made. */
    int rc = fsync(fd) != 0 && errno != EINVAL ? fsdp_errf(err, "%s: fsync failed: %s", dir, strerror(errno)) : 0;
    close(fd);
    return rc;
}

/* Everything but freeing and the signal handlers: what a fatal error's clean-up runs too. */
static void release(fsdp_export_dir *d) {
    char lock[4400];
    if (d->switched) {
        const char *old = d->exchanged ? d->staging : d->aside;
        if (!drain(d, old))
            fsdp_warn("export: kept %s (the directory %s was before this export): it holds files that are not "
                      "fsdp.c's and that %s has under the same names", old, d->given, d->given);
    } else if (d->staging[0]) {
        drain(d, d->staging);
    }
    d->staging[0] = 0;
    /* Unlinked while still held: see take_lock. After the switch the lock at OUT's name is the
     * staging directory's; the old one went with the old directory. */
    if (join(lock, sizeof lock, d->out, FSDP_EXPORT_LOCK_NAME) == 0 && (d->lock_fd >= 0 || d->staging_lock_fd >= 0))
        unlink(lock);
    if (d->lock_fd >= 0) close(d->lock_fd);
    if (d->staging_lock_fd >= 0) close(d->staging_lock_fd);
    d->lock_fd = d->staging_lock_fd = -1;
    if (d->created && !d->switched) rmdir(d->out);
    d->created = 0;
}

static void release_hook(void *arg) { release(arg); }

fsdp_export_dir *fsdp_export_dir_begin(const char *out, int force, fsdp_err *err) {
    fsdp_export_dir *d = fsdp_xcalloc(1, sizeof *d, "the export's directory");
    d->lock_fd = d->staging_lock_fd = d->hook = -1;
    snprintf(d->given, sizeof d->given, "%s", out);
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno != ENOENT) {
            fsdp_errf(err, "--out %s: %s", out, strerror(errno));
            goto fail;
        }
        if (split(out, d->parent, sizeof d->parent, d->base, sizeof d->base)) {
            fsdp_usagef(err, "--out %s: not a directory name export can create", out);
            goto fail;
        }
        remove_stale_siblings(d, 1);
        if (stat(out, &st) != 0) {
            if (mkdir(out, 0777) == 0) {
                d->created = 1;
                snprintf(d->out, sizeof d->out, "%s", out); /* what release removes, until realpath */
            } else if (errno != EEXIST) {
                fsdp_errf(err, "--out %s: cannot create the directory: %s", out, strerror(errno));
                goto fail;
            }
        }
        if (stat(out, &st) != 0) {
            fsdp_errf(err, "--out %s: %s", out, strerror(errno));
            goto fail;
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        fsdp_errf(err, "--out %s exists and is not a directory", out);
        goto fail;
    }
    if (!realpath(out, d->out)) {
        fsdp_errf(err, "--out %s: %s", out, strerror(errno));
        goto fail;
    }
    if (split(d->out, d->parent, sizeof d->parent, d->base, sizeof d->base) || !strcmp(d->out, "/")) {
        fsdp_usagef(err, "--out %s: export replaces the directory as a whole, and / cannot be replaced", out);
        goto fail;
    }
    struct stat here;
    if (stat(".", &here) == 0 && here.st_dev == st.st_dev && here.st_ino == st.st_ino) {
        fsdp_usagef(err, "--out %s is the current directory: an export replaces its directory as a whole, which would "
                         "leave the shell in a removed one; name it from the directory above", out);
        goto fail;
    }
    struct stat above;
    if (stat(d->parent, &above) == 0 && above.st_dev != st.st_dev) {
        fsdp_usagef(err, "--out %s is a mount point: an export replaces its directory as a whole, which a mount "
                         "point cannot be; give a directory inside it", out);
        goto fail;
    }
    if ((d->lock_fd = take_lock(d->out, out, err)) < 0) goto fail;
    remove_stale_siblings(d, 0);
    remove_stale_inside(d);
    char what[256];
    if (holds_checkpoints(d->out, what, sizeof what)) {
        fsdp_usagef(err, "--out %s holds fsdp.c checkpoints (%s): an export replaces its directory as a whole; give "
                         "another --out", out, what);
        goto fail;
    }
    if (!force && fsdp_hf_dir_has_model(d->out, what, sizeof what)) {
        fsdp_errf(err, "--out %s already holds a model (%s); pass --force to replace it", out, what);
        goto fail;
    }
    if (snprintf(d->staging, sizeof d->staging, "%s/%s%s%d.tmp", d->parent, d->base, SIBLING_MARK, (int)getpid()) >=
        (int)sizeof d->staging) {
        fsdp_errf(err, "--out %s: path too long", out);
        goto fail;
    }
    snprintf(d->aside, sizeof d->aside, "%s/%s%s%d.old", d->parent, d->base, SIBLING_MARK, (int)getpid());
    if (mkdir(d->staging, 0700) != 0) {
        fsdp_errf(err, "--out %s: cannot create %s beside it for the new files: %s (an export writes the new model "
                       "next to --out and switches to it in one rename: the directory holding --out must be writable)",
                  out, d->staging, strerror(errno));
        d->staging[0] = 0;
        goto fail;
    }
    /* The new OUT keeps the old one's permissions. */
    if (chmod(d->staging, st.st_mode & 07777) != 0) {
        fsdp_errf(err, "%s: chmod failed: %s", d->staging, strerror(errno));
        goto fail;
    }
    if ((d->staging_lock_fd = take_lock(d->staging, d->staging, err)) < 0) goto fail;
    d->hook = fsdp_cleanup_push(release_hook, d);
    install_handlers(d);
    return d;
fail:
    release(d);
    free(d);
    return NULL;
}

const char *fsdp_export_dir_staging(const fsdp_export_dir *d) { return d->staging; }

/* Hard links of OUT's files that are not the model into the staging directory, so that they are in
 * the new OUT from the moment it appears. What cannot be linked (a directory) moves after. */
static int carry_over(const fsdp_export_dir *d, fsdp_err *err) {
    DIR *dp = opendir(d->out);
    if (!dp) return fsdp_errf(err, "%s: cannot list: %s", d->given, strerror(errno));
    int to = open(d->staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (to < 0) {
        closedir(dp);
        return fsdp_errf(err, "%s: cannot open the directory: %s", d->staging, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        const char *name = e->d_name;
        struct stat st;
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, FSDP_EXPORT_LOCK_NAME) || replaced(d, name))
            continue;
        if (fstatat(dirfd(dp), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode)) continue;
        (void)linkat(dirfd(dp), name, to, name, 0); /* a failure leaves it to the move after the switch */
    }
    closedir(dp);
    close(to);
    return 0;
}

int fsdp_export_dir_switch(fsdp_export_dir *d, fsdp_err *err) {
    g_phase = PHASE_SWITCHING;
    if (carry_over(d, err) || sync_dir(d->staging, err)) return -1;
#ifdef SYS_renameat2
    if (syscall(SYS_renameat2, AT_FDCWD, d->staging, AT_FDCWD, d->out, RENAME_EXCHANGE) == 0)
        d->exchanged = 1;
    else if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP && errno != ENOTSUP)
        return fsdp_errf(err, "%s: cannot swap in %s: %s%s", d->given, d->staging, strerror(errno),
                         errno == EBUSY || errno == EXDEV ? " (a mount point? give a directory inside it as --out)"
                                                          : "");
#endif
    if (!d->exchanged) {
        /* No exchange on this file system: two renames, with no OUT between them (the next export
         * puts the old model back if this process dies there). */
        if (rename(d->out, d->aside) != 0)
            return fsdp_errf(err, "%s: cannot move it aside to %s: %s", d->given, d->aside, strerror(errno));
        if (rename(d->staging, d->out) != 0) {
            int saved = errno;
            if (rename(d->aside, d->out) != 0)
                return fsdp_errf(err, "%s: cannot rename %s to it (%s), nor put the old model back from %s: %s",
                                 d->given, d->staging, strerror(saved), d->aside, strerror(errno));
            return fsdp_errf(err, "%s: cannot rename %s to it: %s", d->given, d->staging, strerror(saved));
        }
    }
    d->switched = 1;
    return sync_dir(d->parent, err);
}

void fsdp_export_dir_end(fsdp_export_dir *d) {
    if (!d) return;
    g_phase = PHASE_SWITCHING; /* removing the old model is the switch's end: a signal waits for it */
    release(d);
    if (d->hook >= 0) fsdp_cleanup_pop(d->hook);
    free(d);
    int pending = restore_handlers();
    if (pending) raise(pending);
}
