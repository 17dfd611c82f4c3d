/* Writing a checkpoint in stages (checkpoint.h): begin (collective; rank 0 makes the file and
 * reserves every dataset's storage), the background transfer of each rank's bytes (ckpt_pio.c),
 * commit (collective; the checksums are combined, stored, and the file renamed).
 *
 * Error discipline: every rank records its own failure and the ranks agree (fsdp_agree, bounded by
 * FSDP_SYNC_TIMEOUT) right after each stage; on an agreed failure every rank takes the same path
 * and the temporary file is removed. Nothing published before is touched. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../base/env.h"
#include "../base/fault.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "ckpt_checksum.h"
#include "ckpt_internal.h"

struct fsdp_ckpt_writer {
    ckio c;
    char path[4096], tmp[4096];
    char **names; /* the tensor names, owned */
    int num_tensors;
    ckpt_extent *extents;
    int num_extents;
    fsdp_dtype host_dtype;
    int fd, dfd, step, cleanup;
    double began;
    ckpt_pio *pio;
};

/* ---- inputs ------------------------------------------------------------------------------------------- */

static int64_t numel(const fsdp_ckpt_tensor *t) { return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }

/* The tensor table must be identical on all ranks, so these checks give the same answer on each. */
static int check_tensors(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors) {
    if (num_tensors < 0) return fsdp_errf(&c->err, "checkpoint %s: negative tensor count", c->file);
    for (int i = 0; i < num_tensors; i++) {
        const fsdp_ckpt_tensor *t = &tensors[i];
        const char *n = t->name;
        /* A slash would make a nested path and "optimizer" would collide with the optimizer group. */
        if (!n || !n[0] || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, "optimizer") || strlen(n) > 200)
            return fsdp_errf(&c->err, "checkpoint %s: tensor %d has an unusable name '%s'", c->file, i, n ? n : "");
        if ((t->ndim != 1 && t->ndim != 2) || t->shape[0] < 1 || (t->ndim == 2 && t->shape[1] < 1))
            return fsdp_errf(&c->err, "checkpoint %s: tensor %s has a bad shape (ndim %d)", c->file, n, t->ndim);
        for (int j = 0; j < i; j++)
            if (!strcmp(tensors[j].name, n))
                return fsdp_errf(&c->err, "checkpoint %s: tensor %s is listed twice", c->file, n);
    }
    return 0;
}

int ckpt_check_pieces(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors, const fsdp_ckpt_piece *pieces,
                            int num_pieces, int writing, const fsdp_ckpt_piece **by_tensor) {
    if (check_tensors(c, tensors, num_tensors)) return -1;
    for (int i = 0; i < num_tensors; i++) by_tensor[i] = NULL;
    for (int i = 0; i < num_pieces; i++) {
        const fsdp_ckpt_piece *p = &pieces[i];
        if (p->tensor < 0 || p->tensor >= num_tensors)
            return fsdp_errf(&c->err, "checkpoint %s: rank %d: piece %d names tensor %d of %d", c->file, c->rank, i,
                             p->tensor, num_tensors);
        const fsdp_ckpt_tensor *t = &tensors[p->tensor];
        if (p->start < 0 || p->count < 0 || p->start > numel(t) - p->count)
            return fsdp_errf(&c->err, "checkpoint %s: rank %d: piece [%lld, %lld) is outside %s (%lld elements)",
                             c->file, c->rank, (long long)p->start, (long long)(p->start + p->count), t->name,
                             (long long)numel(t));
        if (by_tensor[p->tensor])
            return fsdp_errf(&c->err, "checkpoint %s: rank %d has two pieces of %s", c->file, c->rank, t->name);
        if (p->count > 0 && (!p->param || (writing && (!p->exp_avg || !p->exp_avg_sq))))
            return fsdp_errf(&c->err, "checkpoint %s: rank %d: the piece of %s lacks a buffer", c->file, c->rank,
                             t->name);
        by_tensor[p->tensor] = p;
    }
    return 0;
}

int64_t *ckpt_gather_ranges(ckio *c, int num_tensors, const fsdp_ckpt_piece **by_tensor) {
    int n = 2 * NUM_KINDS * num_tensors;
    int64_t *all = fsdp_xcalloc((size_t)c->size * (size_t)(n > 0 ? n : 1), sizeof *all, "checkpoint piece table");
    int64_t *mine = all + (size_t)c->rank * (size_t)n;
    for (int t = 0; t < num_tensors; t++)
        for (int k = 0; k < NUM_KINDS; k++) {
            const fsdp_ckpt_piece *p = by_tensor[t];
            void *buf = !p ? NULL : k == KIND_PARAM ? p->param : k == KIND_EXP_AVG ? p->exp_avg : p->exp_avg_sq;
            if (buf && p->count > 0) mine[2 * (t * NUM_KINDS + k)] = p->start, mine[2 * (t * NUM_KINDS + k) + 1] = p->count;
        }
    if (n > 0) {
        MPI_Request req;
        FSDP_CHECK_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, n, MPI_INT64_T, c->comm, &req));
        fsdp_mpi_wait(&req, "the other ranks' checkpoint pieces");
    }
    return all;
}


/* The writing ranks' pieces must tile every tensor: no gap (a hole of garbage in the file), no
 * overlap (two writers of one byte). The same answer on every rank. */
static void check_cover(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors, const int64_t *all) {
    int64_t *iv = fsdp_xmalloc((size_t)c->size * 2 * sizeof *iv, "checkpoint cover check");
    for (int t = 0; t < num_tensors && !c->err.failed; t++) {
        int n = 0;
        for (int r = 0; r < c->size; r++) {
            const int64_t *p = all + ((size_t)r * num_tensors * NUM_KINDS + (size_t)t * NUM_KINDS) * 2;
            if (p[1] > 0) iv[2 * n] = p[0], iv[2 * n + 1] = p[1], n++;
        }
        qsort(iv, (size_t)n, 2 * sizeof *iv, ckpt_by_start);
        int64_t at = 0;
        for (int i = 0; i < n && at >= 0; i++) at = iv[2 * i] == at ? at + iv[2 * i + 1] : -1;
        if (at != numel(&tensors[t]))
            fsdp_errf(&c->err, "checkpoint %s: the ranks' pieces of %s do not cover it exactly once", c->file,
                      tensors[t].name);
    }
    free(iv);
}

/* ---- begin: rank 0 makes the file ------------------------------------------------------------------ */

static int write_meta(ckio *c, hid_t file, const fsdp_ckpt_meta *meta) {
    const char *strategy = meta->strategy;
    uint64_t sum = ckh_meta_checksum(meta, FSDP_CKPT_FORMAT_VERSION);
    if (ckh_write_string_attr(c, file, "format", FSDP_CKPT_FORMAT) ||
        ckh_write_int_attr(c, file, "format_version", FSDP_CKPT_FORMAT_VERSION, 0) ||
        ckh_write_int_attr(c, file, "step", meta->step, 0) ||
        ckh_write_int_attr(c, file, "samples_seen", meta->samples_seen, 0) ||
        ckh_write_int_attr(c, file, "seed", (int64_t)meta->seed, 1) ||
        ckh_write_string_attr(c, file, "config", meta->config_json) ||
        ckh_write_string_attr(c, file, "schedule", meta->schedule_json) ||
        ckh_write_string_attr(c, file, "run", meta->run_json) ||
        ckh_write_int_attr(c, file, "world_size", meta->world_size, 0) ||
        ckh_write_string_attr(c, file, "strategy", strategy) ||
        ckh_write_string_attr(c, file, "checksum_algorithm", FSDP_CKSUM_ALGORITHM) ||
        ckh_write_int_attr(c, file, "attributes_checksum", (int64_t)sum, 1))
        return -1;
    if (meta->identity_json &&
        (ckh_write_string_attr(c, file, "identity", meta->identity_json) ||
         ckh_write_int_attr(c, file, "identity_checksum", (int64_t)ckh_identity_checksum(meta->identity_json, sum), 1)))
        return -1;
    return 0;
}

/* One contiguous float32 dataset of t's natural shape whose storage exists from now on (written
 * later, never filled); its byte offset in *offset. */
static void create_dataset(ckio *c, hid_t loc, const fsdp_ckpt_tensor *t, const char *label, int64_t *offset) {
    hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
    hid_t space = -1, dcpl = -1, dset = -1;
    if (!H5OK(c, space = H5Screate_simple(t->ndim, dims, NULL), label) &&
        !H5OK(c, dcpl = H5Pcreate(H5P_DATASET_CREATE), label) && !H5OK(c, H5Pset_layout(dcpl, H5D_CONTIGUOUS), label) &&
        !H5OK(c, H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), label) &&
        !H5OK(c, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), label) &&
        !H5OK(c, dset = H5Dcreate2(loc, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), label)) {
        haddr_t at = H5Dget_offset(dset);
        if (at == HADDR_UNDEF)
            ckh_failed(c, "H5Dget_offset", label);
        else
            *offset = (int64_t)at;
    }
    CKH_CLOSE(c, dset, H5Dclose, label);
    CKH_CLOSE(c, dcpl, H5Pclose, label);
    CKH_CLOSE(c, space, H5Sclose, label);
}

static void create_file(ckio *c, const char *tmp, const fsdp_ckpt_tensor *tensors, int num_tensors,
                        const fsdp_ckpt_meta *meta, int64_t *offsets) {
    hid_t fapl = ckh_fapl(c), file = -1, opt = -1, groups[NUM_KINDS] = {-1, -1, -1};
    if (fapl >= 0) H5OK(c, file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl), NULL);
    CKH_CLOSE(c, fapl, H5Pclose, NULL);
    if (file < 0) return;
    groups[KIND_PARAM] = file;
    if (!write_meta(c, file, meta) &&
        !H5OK(c, opt = H5Gcreate2(file, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "optimizer"))
        for (int k = KIND_EXP_AVG; k < NUM_KINDS && !c->err.failed; k++)
            H5OK(c, groups[k] = H5Gcreate2(opt, FSDP_CKPT_KIND_GROUP[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 FSDP_CKPT_KIND_GROUP[k]);
    for (int t = 0; t < num_tensors && !c->err.failed; t++)
        for (int k = 0; k < NUM_KINDS && !c->err.failed; k++) {
            char label[320];
            ckh_label(label, sizeof label, k, tensors[t].name);
            create_dataset(c, groups[k], &tensors[t], label, &offsets[t * NUM_KINDS + k]);
        }
    for (int k = KIND_EXP_AVG; k < NUM_KINDS; k++) CKH_CLOSE(c, groups[k], H5Gclose, FSDP_CKPT_KIND_GROUP[k]);
    CKH_CLOSE(c, opt, H5Gclose, "optimizer");
    CKH_CLOSE(c, file, H5Fclose, NULL);
}

/* Reserves the file's blocks now, so that a full disk is found before training goes on rather than
 * halfway through the background write. File systems without fallocate skip this. */
static void reserve_space(ckio *c, const char *tmp, int fault) {
    int fd = open(tmp, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fsdp_errf(&c->err, "checkpoint %s: %s", tmp, strerror(errno));
    } else {
        int code = fault ? fault : fallocate(fd, 0, 0, st.st_size) == 0 ? 0 : errno;
        if (code && code != EOPNOTSUPP && code != ENOSYS) {
            struct statvfs vfs;
            double free_gb = fstatvfs(fd, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize / 1e9 : -1;
            fsdp_errf(&c->err, "checkpoint %s: cannot reserve %.2f GB for it (%.2f GB free) on rank %d: %s", tmp,
                      (double)st.st_size / 1e9, free_gb, c->rank, strerror(code));
        }
    }
    if (fd >= 0) close(fd);
}

static void remove_file(void *path) { unlink((const char *)path); }

static void slot_label(void *ctx, int slot, char *buf, size_t cap) {
    fsdp_ckpt_writer *w = ctx;
    if (slot < 0 || slot >= w->num_tensors * NUM_KINDS)
        snprintf(buf, cap, "a tensor");
    else
        ckh_label(buf, cap, slot % NUM_KINDS, w->names[slot / NUM_KINDS]);
}

static void free_writer(fsdp_ckpt_writer *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->dfd >= 0) close(w->dfd);
    for (int i = 0; i < w->num_tensors; i++) free(w->names[i]);
    free(w->names);
    free(w->extents);
    free(w);
}

/* This rank's extents: every kind of every piece at its dataset's offset. */
static void build_extents(fsdp_ckpt_writer *w, const fsdp_ckpt_piece *pieces, int num_pieces, const int64_t *offsets) {
    w->extents = fsdp_xcalloc((size_t)(3 * num_pieces + 1), sizeof *w->extents, "checkpoint extents");
    for (int i = 0; i < num_pieces; i++) {
        const fsdp_ckpt_piece *p = &pieces[i];
        void *bufs[NUM_KINDS] = {p->param, p->exp_avg, p->exp_avg_sq};
        for (int k = 0; k < NUM_KINDS && p->count > 0; k++) {
            ckpt_extent *e = &w->extents[w->num_extents++];
            int slot = p->tensor * NUM_KINDS + k;
            e->file_offset = offsets[slot] + p->start * 4;
            e->count = p->count, e->host = bufs[k], e->first = (uint64_t)p->start, e->slot = e->dataset = slot;
            e->nonneg = k == KIND_EXP_AVG_SQ;
        }
    }
}

fsdp_ckpt_writer *fsdp_ckpt_begin(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors,
                                  int num_tensors, const fsdp_ckpt_piece *pieces, int num_pieces,
                                  fsdp_dtype host_dtype, const fsdp_ckpt_meta *meta, fsdp_err *err) {
    fsdp_ckpt_writer *w = fsdp_xcalloc(1, sizeof *w, "the checkpoint writer");
    w->fd = w->dfd = -1, w->cleanup = -1, w->host_dtype = host_dtype, w->step = (int)meta->step, w->began = fsdp_now();
    ckio *c = &w->c;
    ckio_init(c, comm, path);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    const fsdp_ckpt_piece **by_tensor =
        fsdp_xcalloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *by_tensor, "checkpoint pieces");
    if (strlen(path) + 5 > sizeof w->tmp)
        fsdp_errf(&c->err, "checkpoint %s: path too long", path);
    else if (ckpt_check_pieces(c, tensors, num_tensors, pieces, num_pieces, 1, by_tensor) == 0)
        ckh_check_meta(c, meta);
    int64_t *offsets = NULL;
    if (ckio_agree(c) == 0) {
        int64_t *ranges = ckpt_gather_ranges(c, num_tensors, by_tensor);
        check_cover(c, tensors, num_tensors, ranges);
        free(ranges);
    }
    if (!c->err.failed) {
        /* From here a failure or a fatal error anywhere removes the temporary file. */
        w->cleanup = fsdp_cleanup_push(remove_file, w->tmp);
        c->file = w->tmp;
        offsets = fsdp_xcalloc((size_t)(num_tensors * NUM_KINDS + 1), sizeof *offsets, "checkpoint offsets");
        if (c->rank == 0) {
            create_file(c, w->tmp, tensors, num_tensors, meta, offsets);
            if (!c->err.failed) reserve_space(c, w->tmp, fsdp_fault_ckpt(w->step, FSDP_CKPT_AT_CREATE));
        }
    }
    if (ckio_agree(c) == 0) {
        ckio_bcast(c, offsets, num_tensors * NUM_KINDS, MPI_INT64_T, 0, "rank 0 to create the checkpoint file");
        if (num_pieces > 0 && (w->fd = open(w->tmp, O_WRONLY | O_CLOEXEC)) < 0)
            fsdp_errf(&c->err,
                      "checkpoint %s: rank %d cannot open the file rank 0 created: %s (is --ckpt-dir on storage every "
                      "node shares?)",
                      w->tmp, c->rank, strerror(errno));
        else if (num_pieces > 0 && fsdp_env_ckpt_direct_io())
            w->dfd = open(w->tmp, O_WRONLY | O_CLOEXEC | O_DIRECT); /* -1 where unsupported (tmpfs) */
        ckio_agree(c);
    }
    free(by_tensor);
    if (c->err.failed) {
        if (c->rank == 0 && w->cleanup >= 0) unlink(w->tmp);
        fsdp_cleanup_pop(w->cleanup);
        free(offsets);
        ckio_give_error(c, err);
        free_writer(w);
        return NULL;
    }
    w->num_tensors = num_tensors;
    w->names = fsdp_xcalloc((size_t)(num_tensors + 1), sizeof *w->names, "checkpoint tensor names");
    for (int t = 0; t < num_tensors; t++)
        if (!(w->names[t] = strdup(tensors[t].name))) fsdp_fatal("out of host memory");
    build_extents(w, pieces, num_pieces, offsets);
    free(offsets);
    return w;
}

void fsdp_ckpt_start(fsdp_ckpt_writer *w) {
    if (!w->pio)
        w->pio = ckpt_pio_start(w->fd, w->dfd, w->tmp, 1, w->extents, w->num_extents, w->host_dtype,
                                w->num_tensors * NUM_KINDS, slot_label, w, w->step);
}

int fsdp_ckpt_done(fsdp_ckpt_writer *w) { return w->pio ? ckpt_pio_done(w->pio, NULL) : 0; }
double fsdp_ckpt_idle_s(const fsdp_ckpt_writer *w) { return w->pio ? ckpt_pio_idle_s(w->pio) : 0.0; }
int64_t fsdp_ckpt_bytes_done(const fsdp_ckpt_writer *w) { return w->pio ? ckpt_pio_bytes_done(w->pio) : 0; }
int64_t fsdp_ckpt_bytes_total(const fsdp_ckpt_writer *w) { return w->pio ? ckpt_pio_bytes_total(w->pio) : 0; }
double fsdp_ckpt_write_s(const fsdp_ckpt_writer *w) {
    double at = w->pio ? ckpt_pio_finished_at(w->pio) : 0.0;
    return at > 0 ? at - w->began : 0.0;
}

/* ---- commit: rank 0 stores the checksums and renames ----------------------------------------------- */

static void store_checksums(ckio *c, fsdp_ckpt_writer *w, const uint64_t *sums) {
    hid_t fapl = ckh_fapl(c), file = -1;
    if (fapl >= 0) H5OK(c, file = H5Fopen(w->tmp, H5F_ACC_RDWR, fapl), NULL);
    CKH_CLOSE(c, fapl, H5Pclose, NULL);
    for (int t = 0; t < w->num_tensors && !c->err.failed; t++)
        for (int k = 0; k < NUM_KINDS && !c->err.failed; k++) {
            char label[320];
            ckh_label(label, sizeof label, k, w->names[t]);
            hid_t dset = -1;
            if (!H5OK(c, dset = H5Dopen2(file, label, H5P_DEFAULT), label))
                ckh_write_int_attr(c, dset, "checksum", (int64_t)sums[t * NUM_KINDS + k], 1);
            CKH_CLOSE(c, dset, H5Dclose, label);
        }
    CKH_CLOSE(c, file, H5Fclose, NULL);
}

/* Makes the finished file durable and gives it its final name. */
static void publish(ckio *c, const char *tmp, const char *path) {
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        fsdp_errf(&c->err, "checkpoint %s: cannot sync on rank %d: %s", tmp, c->rank, strerror(errno));
    if (fd >= 0) close(fd);
    if (!c->err.failed && rename(tmp, path) != 0)
        fsdp_errf(&c->err, "checkpoint %s: cannot rename %s to it on rank %d: %s", path, tmp, c->rank, strerror(errno));
    if (c->err.failed) return;
    /* The rename itself is durable only once the directory is synced. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* best effort: some file systems refuse fsync on directories */
        close(dfd);
    }
}

int fsdp_ckpt_commit(fsdp_ckpt_writer *w, fsdp_err *err) {
    ckio *c = &w->c;
    fsdp_ckpt_start(w);
    ckpt_pio_wait(w->pio, &c->err);
    int n = w->num_tensors * NUM_KINDS;
    uint64_t *sums = fsdp_xcalloc((size_t)(n + 1), sizeof *sums, "checkpoint checksums");
    if (ckio_agree(c) == 0) {
        memcpy(sums, ckpt_pio_sums(w->pio), (size_t)n * sizeof *sums);
        ckio_allreduce(c, sums, n, MPI_UINT64_T, MPI_SUM, "the other ranks' checkpoint checksums");
        if (c->rank == 0) {
            int code = fsdp_fault_ckpt(w->step, FSDP_CKPT_AT_COMMIT);
            if (code)
                fsdp_errf(&c->err, "checkpoint %s: cannot finish it on rank %d: %s", w->tmp, c->rank, strerror(code));
            else
                store_checksums(c, w, sums);
            if (!c->err.failed) publish(c, w->tmp, w->path);
        }
        ckio_agree(c);
    }
    free(sums);
    int failed = c->err.failed;
    if (failed) ckio_give_error(c, err);
    ckpt_pio_free(w->pio);
    w->pio = NULL;
    if (failed) unlink(w->tmp);
    fsdp_cleanup_pop(w->cleanup);
    free_writer(w);
    return failed ? -1 : 0;
}

void fsdp_ckpt_abandon(fsdp_ckpt_writer *w) {
    if (!w) return;
    ckpt_pio_free(w->pio);
    unlink(w->tmp);
    fsdp_cleanup_pop(w->cleanup);
    free_writer(w);
}

int fsdp_ckpt_write(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                    const fsdp_ckpt_piece *pieces, int num_pieces, const fsdp_ckpt_meta *meta, fsdp_err *err) {
    fsdp_ckpt_writer *w = fsdp_ckpt_begin(comm, path, tensors, num_tensors, pieces, num_pieces, FSDP_F32, meta, err);
    return w ? fsdp_ckpt_commit(w, err) : -1;
}
