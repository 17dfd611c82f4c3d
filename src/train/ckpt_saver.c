/* The checkpoints of a run (checkpointing.h): the directory before step 1, the background save at
 * step boundaries, the way out. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/agree.h"
#include "../base/env.h"
#include "../base/fault.h"
#include "../base/files.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/ckpt_dir.h"
#include "checkpointing.h"
#include "hf_import.h"
#include "preemption.h"

struct fsdp_saver {
    fsdp_ckpt_lock *lock; /* rank 0 */
    void *snapshot;       /* pinned host memory; NULL on ranks that write nothing */
    fsdp_ckpt_tensor *tensors;
    fsdp_ckpt_piece *pieces;
    int num_pieces;
    fsdp_ckpt_writer *writer; /* the save in flight */
    int writer_step, cleanup;
    int created_dir;      /* rank 0 made --ckpt-dir: a run that ends without a checkpoint removes it */
    char name[64], path[4200];
    double started, paused_s;
};

/* ---- before step 1 ---------------------------------------------------------------------------------- */

static void report_stale(const char *path) {
    fsdp_log("checkpoint: removed %s, left by a save that never finished\n", path);
}

static int open_dir(fsdp_trainer *t, fsdp_saver *s, fsdp_err *err) {
    const char *dir = t->opt.ckpt_dir;
    if (fsdp_rank() == 0) {
        struct stat st;
        if (stat(dir, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                fsdp_errf(err, "--ckpt-dir %s is %s, not a directory", dir, fsdp_file_type_name(st.st_mode));
        } else if (errno != ENOENT || mkdir(dir, 0777) != 0) {
            fsdp_errf(err, "--ckpt-dir %s cannot be created: %s", dir, strerror(errno));
        } else {
            s->created_dir = 1;
        }
        if (!err->failed && (s->lock = fsdp_ckpt_lock_acquire(dir, err)))
            fsdp_ckpt_remove_stale(dir, report_stale, err);
    }
    if (fsdp_agree(t->world, err)) return -1;
    int64_t free_bytes = 0;
    if (fsdp_ckpt_dir_check(t->world, dir, &free_bytes, err)) return -1;
    double need = (double)t->layout.total_numel * 12.0 + (1 << 20);
    if ((double)free_bytes < need)
        return fsdp_errf(err, "--ckpt-dir %s has %.2f GB free, and one checkpoint of this model needs %.2f GB", dir,
                         (double)free_bytes / 1e9, need / 1e9);
    return 0;
}

/* Rank 0 lists the directory; every rank gets the names. */
static int list_steps(fsdp_trainer *t, fsdp_ckpt_file **files, int *count, fsdp_err *err) {
    *files = NULL, *count = 0;
    if (fsdp_rank() == 0) fsdp_ckpt_list(t->opt.ckpt_dir, files, count, err);
    if (fsdp_agree(t->world, err)) return -1;
    FSDP_CHECK_MPI(MPI_Bcast(count, 1, MPI_INT, 0, t->world));
    if (fsdp_rank() != 0) *files = fsdp_xcalloc((size_t)*count + 1, sizeof **files, "the checkpoint list");
    if (*count > 0)
        FSDP_CHECK_MPI(MPI_Bcast(*files, (int)((size_t)*count * sizeof **files), MPI_BYTE, 0, t->world));
    return 0;
}

static int load(fsdp_trainer *t, fsdp_saver *s, const char *path, fsdp_err *err) {
    double t0 = fsdp_now();
    if (fsdp_trainer_load_into(t, path, s->snapshot, err)) return -1;
    double secs = fsdp_now() - t0, gb = (double)t->layout.total_numel * 12.0 / 1e9;
    fsdp_log("resumed from %s at step %d (%llu samples seen): %.*f %s read and verified in %.2f s (%.2f GB/s)\n", path,
             t->step, (unsigned long long)t->samples_seen, gb < 1 ? 1 : 2, gb < 1 ? gb * 1e3 : gb, gb < 1 ? "MB" : "GB",
             secs, secs > 0 ? gb / secs : 0.0);
    return 1;
}

/* --resume auto without 'latest' (a run killed between a rename and the pointer, or a pointer lost
 * with a copy): the newest step file that verifies, never a fresh start over existing ones. */
static int resume_newest(fsdp_trainer *t, fsdp_saver *s, fsdp_err *err) {
    fsdp_ckpt_file *files;
    int n;
    if (list_steps(t, &files, &n, err)) return -1;
    if (n == 0) {
        free(files);
        fsdp_log("resume: no checkpoint in %s yet, starting from step 0\n", t->opt.ckpt_dir);
        return 0;
    }
    char first_failure[1024] = "";
    int rc = -1;
    for (int i = 0; i < n && rc < 0; i++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", t->opt.ckpt_dir, files[i].name);
        fsdp_err tried = {0};
        if (load(t, s, path, &tried) > 0) {
            fsdp_warn("resume: %s has no 'latest': resumed from its newest step file that verifies, %s",
                      t->opt.ckpt_dir, files[i].name);
            rc = 1;
        } else {
            fsdp_warn("resume: skipping %s: %s", path, tried.msg);
            if (!first_failure[0]) snprintf(first_failure, sizeof first_failure, "%s", tried.msg);
        }
    }
    if (rc < 0)
        fsdp_errf(err,
                  "--resume auto: %s has no 'latest' and none of its %d step files verifies (the newest: %s); not "
                  "starting over on top of them: check them with fsdp verify %s, or pass --overwrite",
                  t->opt.ckpt_dir, n, first_failure, t->opt.ckpt_dir);
    free(files);
    return rc;
}

/* ---- --resume FILE older than the directory's newest ----------------------------------------------- */

/* "step-00000003.h5" or "step-00000003.h5 to step-00000006.h5" (the list is newest first). */
static void span_of(const fsdp_ckpt_file *newer, int count, char *buf, size_t cap) {
    if (count == 1)
        snprintf(buf, cap, "%s", newer[0].name);
    else
        snprintf(buf, cap, "%s to %s", newer[count - 1].name, newer[0].name);
}

/* The run would write its checkpoints over the directory's newer ones (the next save of their steps
 * replaces them, and pruning counts them): refused before anything is read, unless --rollback.
 * *newer: those files, newest first (malloc'ed, free() it), for roll_back. */
static int check_older(fsdp_trainer *t, const char *path, fsdp_ckpt_file **newer, int *count, fsdp_err *err) {
    *newer = NULL, *count = 0;
    if (!t->opt.ckpt_dir) return 0;
    fsdp_ckpt_meta meta;
    if (fsdp_ckpt_read_meta(t->world, path, &meta, err)) return -1;
    long long step = (long long)meta.step;
    fsdp_ckpt_meta_free(&meta);
    if (list_steps(t, newer, count, err)) return -1;
    int n = 0;
    while (n < *count && (*newer)[n].step > step) n++;
    *count = n;
    if (n == 0 || t->opt.rollback) return 0;
    char span[600];
    span_of(*newer, n, span, sizeof span);
    return fsdp_errf(err,
                     "--resume %s is step %lld, but --ckpt-dir %s holds %d newer checkpoint(s) (%s) that this run would "
                     "write over: pass --rollback to move them aside into %s/rolled-back-<time>/ and continue from "
                     "step %lld, or --resume auto to continue from the newest",
                     path, step, t->opt.ckpt_dir, n, span, t->opt.ckpt_dir, step);
}

/* 1 when `path` lies in directory `dir` (compared by inode: any spelling of either). */
static int in_dir(const char *path, const char *dir) {
    char parent[4400];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;
    else *slash = 0;
    struct stat a, b;
    return stat(parent, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Rank 0: renames one entry of dir into dest (same file system: nothing is copied or deleted). */
static int move_into(const char *dir, const char *name, const char *dest, fsdp_err *err) {
    char from[4400], to[4700];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/%s", dest, name);
    if (rename(from, to) != 0)
        return fsdp_errf(err, "--rollback: rename(%s, %s) failed on rank 0: %s", from, to, strerror(errno));
    return 0;
}

/* Rank 0: a new folder dir/rolled-back-<local time>[-N] in `dest`. */
static int make_rollback_dir(const char *dir, char *dest, size_t cap, fsdp_err *err) {
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32] = "unknown-time";
    if (localtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int i = 0; i < 100; i++) {
        if (i == 0)
            snprintf(dest, cap, "%s/rolled-back-%s", dir, stamp);
        else
            snprintf(dest, cap, "%s/rolled-back-%s-%d", dir, stamp, i);
        if (mkdir(dest, 0777) == 0) return 0;
        if (errno != EEXIST) break;
    }
    return fsdp_errf(err, "--rollback: mkdir(%s) failed on rank 0: %s", dest, strerror(errno));
}

/* --rollback, once the older checkpoint has loaded: its newer ones, and 'latest' when it named one of
 * them, move into a new folder of the directory; 'latest' then names the resumed file when it lies
 * in the directory. Collective. */
static int roll_back(fsdp_trainer *t, const char *path, const fsdp_ckpt_file *newer, int count, fsdp_err *err) {
    const char *dir = t->opt.ckpt_dir;
    char dest[4400] = "";
    int moved_latest = 0;
    if (count == 0) return 0;
    if (fsdp_rank() == 0 && make_rollback_dir(dir, dest, sizeof dest, err) == 0) {
        char latest[4400];
        fsdp_err ignore = {0};
        const char *latest_name =
            fsdp_ckpt_find_latest(dir, latest, sizeof latest, &ignore) == 1 ? strrchr(latest, '/') + 1 : NULL;
        for (int i = 0; i < count && !err->failed; i++)
            if (move_into(dir, newer[i].name, dest, err) == 0 && latest_name && !strcmp(latest_name, newer[i].name))
                moved_latest = 1;
        if (!err->failed && moved_latest && move_into(dir, "latest", dest, err) == 0 && in_dir(path, dir))
            fsdp_ckpt_set_latest(dir, strrchr(path, '/') ? strrchr(path, '/') + 1 : path, err);
        int dfd = open(dir, O_RDONLY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd); /* best effort, as for every rename in the directory */
            close(dfd);
        }
    }
    if (fsdp_agree(t->world, err)) return -1;
    char span[600];
    span_of(newer, count, span, sizeof span);
    fsdp_log("--rollback: moved the %d checkpoint(s) newer than step %d (%s)%s into %s/; nothing was deleted, and the "
             "run continues from step %d\n", count, t->step, span, moved_latest ? " and 'latest'" : "", dest, t->step);
    return 0;
}

static int resume(fsdp_trainer *t, fsdp_saver *s, fsdp_err *err) {
    const char *r = t->opt.resume;
    if (!r) return 0;
    if (strcmp(r, "auto")) {
        fsdp_ckpt_file *newer = NULL;
        int count = 0, rc = check_older(t, r, &newer, &count, err);
        if (rc == 0) rc = load(t, s, r, err);
        if (rc > 0 && roll_back(t, r, newer, count, err)) rc = -1;
        free(newer);
        return rc;
    }
    char path[4400] = "";
    int found = fsdp_rank() == 0 ? fsdp_ckpt_find_latest(t->opt.ckpt_dir, path, sizeof path, err) : 0;
    if (fsdp_agree(t->world, err)) return -1;
    FSDP_CHECK_MPI(MPI_Bcast(&found, 1, MPI_INT, 0, t->world));
    FSDP_CHECK_MPI(MPI_Bcast(path, (int)sizeof path, MPI_CHAR, 0, t->world));
    return found ? load(t, s, path, err) : resume_newest(t, s, err);
}

/* A fresh run must not overwrite another run's checkpoints or move its 'latest' back. */
static int claim_fresh(fsdp_trainer *t, fsdp_err *err) {
    const char *dir = t->opt.ckpt_dir;
    if (fsdp_rank() == 0) {
        fsdp_ckpt_file *files = NULL;
        int n = 0;
        char latest[4400];
        fsdp_err ignore = {0};
        int has_latest = fsdp_ckpt_find_latest(dir, latest, sizeof latest, &ignore) != 0;
        if (fsdp_ckpt_list(dir, &files, &n, err) == 0 && (n > 0 || has_latest)) {
            if (!t->opt.overwrite) {
                fsdp_errf(err,
                          "--ckpt-dir %s already holds checkpoints of a run (%d step file(s)%s%s): pass --resume auto "
                          "to continue it, --overwrite to replace it, or another --ckpt-dir",
                          dir, n, n ? ", the newest " : "", n ? files[0].name : "");
            } else {
                for (int i = 0; i < n; i++) {
                    char path[4400];
                    snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
                    if (unlink(path) != 0 && errno != ENOENT) fsdp_errf(err, "%s: cannot delete: %s", path, strerror(errno));
                }
                snprintf(latest, sizeof latest, "%s/latest", dir);
                unlink(latest);
                fsdp_log("checkpoint: --overwrite: removed %d checkpoint(s) of an earlier run from %s\n", n, dir);
            }
        }
        free(files);
    }
    return fsdp_agree(t->world, err);
}

int fsdp_ckpt_setup(fsdp_trainer *t, int *resumed, fsdp_err *err) {
    fsdp_saver *s = t->saver = fsdp_xcalloc(1, sizeof *t->saver, "the checkpoint saver");
    s->cleanup = -1;
    *resumed = 0;
    if (t->opt.ckpt_dir) {
        if (open_dir(t, s, err)) return -1;
        s->tensors = fsdp_trainer_tensor_table(t);
        if (fsdp_engine_replica_rank(t->eng) == 0) {
            size_t bytes = fsdp_trainer_snapshot_bytes(t);
            s->snapshot = t->be->runtime->alloc_host(t->be, bytes, "checkpoint snapshots");
            /* Pinned memory exists once allocated; plain memory only once touched: touch it now,
             * not during the first save's pause. */
            if (!strcmp(t->be->name, "cpu")) memset(s->snapshot, 0, bytes);
        }
        s->pieces = fsdp_trainer_pieces(t, s->snapshot, 1, &s->num_pieces);
    }
    int r = resume(t, s, err);
    if (r < 0 || fsdp_agree(t->world, err)) return -1;
    *resumed = r > 0;
    if (!*resumed && t->opt.ckpt_dir && claim_fresh(t, err)) return -1;
    if (*resumed) return 0;
    if (t->opt.init_from) return fsdp_trainer_init_from(t, err); /* pretrained weights (src/train/hf_import.c) */
    fsdp_trainer_init_weights(t);
    return 0;
}

/* ---- at step boundaries ----------------------------------------------------------------------------- */

static void cancel_on_exit(void *arg) {
    fsdp_saver *s = arg;
    fsdp_ckpt_abandon(s->writer);
    s->writer = NULL;
}

static void check_stall(const fsdp_saver *s) {
    double idle = fsdp_ckpt_idle_s(s->writer), limit = fsdp_env_sync_timeout_s();
    if (idle > limit)
        fsdp_fatal("checkpoint %s: no progress for %.0f s writing it (%.2f of %.2f GB of this rank written): the "
                   "storage has stalled; set FSDP_SYNC_TIMEOUT to wait longer",
                   s->path, idle, (double)fsdp_ckpt_bytes_done(s->writer) / 1e9,
                   (double)fsdp_ckpt_bytes_total(s->writer) / 1e9);
}

/* Collective: until every rank's writer is done. */
static void wait_writers(fsdp_saver *s, MPI_Comm world) {
    for (;;) {
        int all_done = fsdp_ckpt_done(s->writer);
        if (!all_done) check_stall(s);
        fsdp_mpi_allreduce(&all_done, 1, MPI_INT, MPI_MIN, world, "the other ranks to write the checkpoint");
        if (all_done) return;
        fsdp_sleep_us(2000);
    }
}

/* Collective, every writer done: checksums, rename, 'latest', pruning. */
static int finish_save(fsdp_trainer *t, fsdp_saver *s, fsdp_err *err) {
    double write_s = fsdp_ckpt_write_s(s->writer);
    fsdp_mpi_allreduce(&write_s, 1, MPI_DOUBLE, MPI_MAX, t->world, "the other ranks to write the checkpoint");
    int rc = fsdp_ckpt_commit(s->writer, err);
    s->writer = NULL;
    fsdp_cleanup_pop(s->cleanup);
    s->cleanup = -1;
    if (rc) return -1;
    if (fsdp_rank() == 0) {
        fsdp_fault_ckpt(s->writer_step, FSDP_CKPT_AT_LATEST);
        if (fsdp_ckpt_set_latest(t->opt.ckpt_dir, s->name, err) == 0) fsdp_ckpt_prune(t->opt.ckpt_dir, t->opt.keep, err);
    }
    if (fsdp_agree(t->world, err)) return -1;
    double gb = (double)t->layout.total_numel * 12.0 / 1e9;
    fsdp_log("checkpoint: step %d written to %s: %.*f %s in %.2f s (%.2f GB/s); training paused %.2f s for it\n",
             s->writer_step, s->path, gb < 1 ? 1 : 2, gb < 1 ? gb * 1e3 : gb, gb < 1 ? "MB" : "GB", write_s,
             write_s > 0 ? gb / write_s : 0.0, s->paused_s);
    return 0;
}

static int start_save(fsdp_trainer *t, fsdp_saver *s, fsdp_err *err) {
    double t0 = fsdp_now();
    snprintf(s->name, sizeof s->name, "step-%08d.h5", t->step);
    snprintf(s->path, sizeof s->path, "%s/%s", t->opt.ckpt_dir, s->name);
    if (s->snapshot) fsdp_trainer_snapshot(t, s->snapshot);
    fsdp_ckpt_meta meta;
    fsdp_trainer_meta(t, &meta);
    s->writer = fsdp_ckpt_begin(t->world, s->path, s->tensors, t->layout.num_params, s->pieces, s->num_pieces,
                                fsdp_trainer_snapshot_dtype(t), &meta, err);
    fsdp_trainer_meta_free(&meta);
    if (!s->writer) return -1;
    s->cleanup = fsdp_cleanup_push(cancel_on_exit, s);
    fsdp_ckpt_start(s->writer);
    s->writer_step = t->step;
    s->started = t0;
    s->paused_s = fsdp_now() - t0;
    return 0;
}

int fsdp_ckpt_boundary(fsdp_trainer *t, int *stop, fsdp_err *err) {
    fsdp_saver *s = t->saver;
    const fsdp_train_options *o = &t->opt;
    int last = t->step >= o->steps;
    /* One agreement per step: a signal on any rank, and whether a writer still runs anywhere. */
    int state[2] = {fsdp_preemption_signal(), s->writer && !fsdp_ckpt_done(s->writer)};
    if (state[1]) check_stall(s);
    fsdp_mpi_allreduce(state, 2, MPI_INT, MPI_MAX, t->world, "the other ranks at the end of the step");
    *stop = state[0];
    if (s->writer && !state[1] && finish_save(t, s, err)) return -1;
    int due = o->ckpt_dir && ((o->ckpt_every > 0 && t->step % o->ckpt_every == 0) || last || *stop);
    if (due) {
        double waited = 0;
        if (s->writer) {
            /* One snapshot buffer: a save waits for the one before it. Said every time, since it means
             * checkpoints are asked for faster than the storage writes them. */
            double t0 = fsdp_now();
            int before = s->writer_step;
            wait_writers(s, t->world);
            if (finish_save(t, s, err)) return -1;
            waited = fsdp_now() - t0;
            char why[96] = "";
            if (!last && !*stop)
                snprintf(why, sizeof why, " (--ckpt-every %d steps take less time than one save)", o->ckpt_every);
            fsdp_log("checkpoint: step %d waited %.2f s for the save of step %d to finish%s\n", t->step, waited, before,
                     why);
        }
        if (start_save(t, s, err)) return -1;
        s->paused_s += waited;
    }
    if ((last || *stop) && s->writer) {
        wait_writers(s, t->world);
        if (finish_save(t, s, err)) return -1;
    }
    return 0;
}

void fsdp_ckpt_settle(fsdp_trainer *t) {
    fsdp_saver *s = t->saver;
    if (!s || !s->writer) return;
    fsdp_err err = {0};
    wait_writers(s, t->world);
    if (finish_save(t, s, &err)) fsdp_warn("the checkpoint in flight was not written either: %s", err.msg);
}

void fsdp_ckpt_teardown(fsdp_trainer *t) {
    fsdp_saver *s = t->saver;
    if (!s) return;
    if (s->writer) {
        fsdp_cleanup_pop(s->cleanup);
        cancel_on_exit(s);
    }
    if (s->snapshot) t->be->runtime->free_host(t->be, s->snapshot);
    free(s->pieces);
    free(s->tensors);
    if (s->lock) fsdp_ckpt_lock_release(s->lock);
    /* A run that failed before its first checkpoint leaves nothing behind: the directory it made is
     * empty again once the lock is gone (rmdir refuses a directory that holds anything). */
    if (s->created_dir) rmdir(t->opt.ckpt_dir);
    free(s);
    t->saver = NULL;
}
