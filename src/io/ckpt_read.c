/* Reading checkpoints (checkpoint.h): rank 0 opens the file with HDF5, checks its attributes and
 * describes the datasets that will be read; every rank then preads its pieces at their offsets
 * (ckpt_pio.c, several threads: disk speed), hashing them. Where pieces of several ranks overlap
 * (replicas read the same shard), only the lowest rank counts an element, so the sums added over
 * the ranks are the tensors' checksums whenever the pieces cover a tensor.
 *
 * Datasets that another tool rewrote (chunked, compressed, float64) have no plain offset: every
 * rank then reads its ranges through HDF5 itself, serially, and hashes them the same way. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/files.h"
#include "ckpt_checksum.h"
#include "ckpt_internal.h"

static int64_t numel(const fsdp_ckpt_tensor *t) { return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }

/* ---- metadata --------------------------------------------------------------------------------------- */

/* Rank 0's string to every rank; NULL (an attribute the file does not have) stays NULL. */
static void bcast_string(ckio *c, char **s) {
    int64_t len = c->rank == 0 ? (*s ? (int64_t)strlen(*s) : -1) : 0;
    ckio_bcast(c, &len, 1, MPI_INT64_T, 0, "rank 0 to read the checkpoint's attributes");
    if (len < 0) return;
    if (c->rank != 0) *s = fsdp_xcalloc((size_t)len + 1, 1, "a checkpoint attribute");
    ckio_bcast(c, *s, (int)len + 1, MPI_CHAR, 0, "rank 0 to read the checkpoint's attributes");
}

static void bcast_meta(ckio *c, fsdp_ckpt_meta *m) {
    int64_t head[5] = {m->step, m->samples_seen, (int64_t)m->seed, m->world_size, m->format_version};
    ckio_bcast(c, head, 5, MPI_INT64_T, 0, "rank 0 to read the checkpoint's attributes");
    ckio_bcast(c, m->strategy, (int)sizeof m->strategy, MPI_CHAR, 0, "rank 0 to read the checkpoint's attributes");
    m->step = head[0], m->samples_seen = head[1], m->seed = (uint64_t)head[2];
    m->world_size = (int)head[3], m->format_version = (int)head[4];
    bcast_string(c, &m->config_json);
    bcast_string(c, &m->schedule_json);
    bcast_string(c, &m->run_json);
    bcast_string(c, &m->identity_json);
}

int fsdp_ckpt_read_meta(MPI_Comm comm, const char *path, fsdp_ckpt_meta *meta, fsdp_err *err) {
    ckio c;
    ckio_init(&c, comm, path);
    memset(meta, 0, sizeof *meta);
    if (c.rank == 0) {
        int64_t version = 0;
        hid_t file = ckh_open(&c, path, &version);
        if (file >= 0) {
            ckh_read_meta(&c, file, version, meta);
            meta->format_version = (int)version;
            CKH_CLOSE(&c, file, H5Fclose, NULL);
        }
    }
    if (ckio_agree(&c)) {
        fsdp_ckpt_meta_free(meta);
        return ckio_give_error(&c, err);
    }
    bcast_meta(&c, meta);
    return 0;
}

void fsdp_ckpt_meta_free(fsdp_ckpt_meta *meta) {
    free(meta->config_json);
    free(meta->schedule_json);
    free(meta->run_json);
    free(meta->identity_json);
    meta->config_json = meta->schedule_json = meta->run_json = meta->identity_json = NULL;
}

/* ---- describing what will be read (rank 0) --------------------------------------------------------------- */

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *dims) {
    if (ndim == 1)
        snprintf(buf, cap, "[%lld]", (long long)dims[0]);
    else if (ndim == 2)
        snprintf(buf, cap, "[%lld, %lld]", (long long)dims[0], (long long)dims[1]);
    else
        snprintf(buf, cap, "(%d dimensions)", ndim);
}

static void check_dataset(ckio *c, const char *label, const fsdp_ckpt_tensor *t, const ckpt_dset *d, int64_t version) {
    if (!d->exists) {
        fsdp_errf(&c->err, "checkpoint %s: tensor %s is missing", c->file, label);
    } else if (d->ndim != t->ndim || d->dims[0] != t->shape[0] || (d->ndim == 2 && d->dims[1] != t->shape[1])) {
        char want[64], got[64];
        shape_str(want, sizeof want, t->ndim, t->shape);
        shape_str(got, sizeof got, d->ndim, d->dims);
        fsdp_errf(&c->err, "checkpoint %s: tensor %s has shape %s, expected %s", c->file, label, got, want);
    } else if (!d->is_float) {
        fsdp_errf(&c->err, "checkpoint %s: tensor %s is not floating-point", c->file, label);
    } else if (version >= 2 && !d->has_checksum) {
        fsdp_errf(&c->err, "checkpoint %s: tensor %s has no checksum (a format-%lld file must have one)", c->file,
                  label, (long long)version);
    }
}

/* Opens optimizer/<group> for the kinds some rank wants; groups[0] is the root. */
static void open_groups(ckio *c, hid_t file, const int *wanted, int num_tensors, hid_t groups[NUM_KINDS]) {
    groups[KIND_PARAM] = file;
    for (int k = KIND_EXP_AVG; k < NUM_KINDS && !c->err.failed; k++) {
        int any = 0;
        for (int t = 0; t < num_tensors; t++) any |= wanted[t * NUM_KINDS + k];
        if (!any) continue;
        char gpath[32];
        snprintf(gpath, sizeof gpath, "optimizer/%s", FSDP_CKPT_KIND_GROUP[k]);
        htri_t has = H5Lexists(file, "optimizer", H5P_DEFAULT);
        if (has > 0) has = H5Lexists(file, gpath, H5P_DEFAULT);
        if (has < 0)
            ckh_failed(c, "H5Lexists", gpath);
        else if (!has)
            fsdp_errf(&c->err, "checkpoint %s has no optimizer state (%s is missing)", c->file, gpath);
        else
            H5OK(c, groups[k] = H5Gopen2(file, gpath, H5P_DEFAULT), gpath);
    }
}

static void describe(ckio *c, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors, const int *wanted,
                     ckpt_dset *table, int64_t *version) {
    hid_t file = ckh_open(c, path, version), groups[NUM_KINDS] = {-1, -1, -1};
    if (file < 0) return;
    open_groups(c, file, wanted, num_tensors, groups);
    /* Every parameter is checked, read or not: a file of another model is refused as a whole. */
    for (int t = 0; t < num_tensors && !c->err.failed; t++)
        for (int k = 0; k < NUM_KINDS && !c->err.failed; k++) {
            if (k != KIND_PARAM && !wanted[t * NUM_KINDS + k]) continue;
            char label[320];
            ckh_label(label, sizeof label, k, tensors[t].name);
            if (ckh_describe(c, groups[k], label, tensors[t].name, &table[t * NUM_KINDS + k]) == 0)
                check_dataset(c, label, &tensors[t], &table[t * NUM_KINDS + k], *version);
        }
    for (int k = KIND_EXP_AVG; k < NUM_KINDS; k++) CKH_CLOSE(c, groups[k], H5Gclose, FSDP_CKPT_KIND_GROUP[k]);
    CKH_CLOSE(c, file, H5Fclose, NULL);
}

/* ---- the reading plan ------------------------------------------------------------------------------------- */

/* The parts of [s, e) of `slot` that no lower rank covers, as (start, count) pairs in out. */
static int uncovered(const int64_t *all, int nslots, int rank, int slot, int64_t s, int64_t e, int64_t *lower,
                     int64_t *out) {
    int n = 0, m = 0;
    for (int r = 0; r < rank; r++) {
        const int64_t *p = all + ((size_t)r * nslots + slot) * 2;
        if (p[1] > 0) lower[2 * n] = p[0], lower[2 * n + 1] = p[1], n++;
    }
    qsort(lower, (size_t)n, 2 * sizeof *lower, ckpt_by_start);
    int64_t at = s;
    for (int i = 0; i < n && at < e; i++) {
        int64_t a = lower[2 * i], b = a + lower[2 * i + 1];
        if (b <= at) continue;
        if (a >= e) break;
        if (a > at) out[2 * m] = at, out[2 * m + 1] = a - at, m++;
        if (b > at) at = b;
    }
    if (at < e) out[2 * m] = at, out[2 * m + 1] = e - at, m++;
    return m;
}

/* Elements of `slot` covered by the union of all ranks' ranges. */
static int64_t union_size(const int64_t *all, int size, int nslots, int slot, int64_t *scratch) {
    int n = 0;
    for (int r = 0; r < size; r++) {
        const int64_t *p = all + ((size_t)r * nslots + slot) * 2;
        if (p[1] > 0) scratch[2 * n] = p[0], scratch[2 * n + 1] = p[1], n++;
    }
    qsort(scratch, (size_t)n, 2 * sizeof *scratch, ckpt_by_start);
    int64_t covered = 0, end = 0;
    for (int i = 0; i < n; i++) {
        int64_t a = scratch[2 * i], b = a + scratch[2 * i + 1];
        if (a > end) end = a;
        if (b > end) covered += b - end, end = b;
    }
    return covered;
}

typedef struct {
    ckio c;
    const fsdp_ckpt_tensor *tensors;
    int num_tensors;
    fsdp_dtype host_dtype;
    ckpt_dset *table;
    ckpt_extent *extents; /* preads at offsets */
    int num_extents;
    ckpt_extent *slow;    /* through HDF5: file_offset unused */
    int num_slow;
    uint64_t *sums;
} reader;

static void *kind_buffer(const fsdp_ckpt_piece *p, int kind) {
    return kind == KIND_PARAM ? p->param : kind == KIND_EXP_AVG ? p->exp_avg : p->exp_avg_sq;
}

/* Splits every wanted piece into hashed (uncovered by lower ranks) and unhashed extents. */
static void plan(reader *rd, const fsdp_ckpt_piece **by_tensor, const int64_t *all) {
    int nslots = rd->num_tensors * NUM_KINDS, size = rd->c.size;
    int64_t *lower = fsdp_xmalloc((size_t)(2 * size + 2) * sizeof *lower, "checkpoint read plan");
    int64_t *parts = fsdp_xmalloc((size_t)(2 * size + 2) * sizeof *parts, "checkpoint read plan");
    int cap = nslots * (2 * size + 2) + 1;
    rd->extents = fsdp_xcalloc((size_t)cap, sizeof *rd->extents, "checkpoint read plan");
    rd->slow = fsdp_xcalloc((size_t)cap, sizeof *rd->slow, "checkpoint read plan");
    size_t hsize = fsdp_dtype_info_of(rd->host_dtype)->bytes;
    for (int t = 0; t < rd->num_tensors; t++)
        for (int k = 0; k < NUM_KINDS; k++) {
            const fsdp_ckpt_piece *p = by_tensor[t];
            void *buf = p && p->count > 0 ? kind_buffer(p, k) : NULL;
            if (!buf) continue;
            int slot = t * NUM_KINDS + k;
            const ckpt_dset *d = &rd->table[slot];
            int64_t s = p->start, e = p->start + p->count, at = s;
            int m = uncovered(all, nslots, rd->c.rank, slot, s, e, lower, parts);
            for (int i = 0; i <= m; i++) {
                int64_t a = i < m ? parts[2 * i] : e, b = i < m ? a + parts[2 * i + 1] : e;
                for (int hashed = 0; hashed < 2; hashed++) {
                    int64_t lo = hashed ? a : at, hi = hashed ? b : a;
                    if (hi <= lo) continue;
                    ckpt_extent *x = d->offset >= 0 ? &rd->extents[rd->num_extents++] : &rd->slow[rd->num_slow++];
                    x->file_offset = d->offset + lo * 4;
                    x->count = hi - lo;
                    x->host = (char *)buf + (size_t)(lo - s) * hsize;
                    x->first = (uint64_t)lo;
                    x->slot = hashed ? slot : -1;
                    x->dataset = slot;
                    x->nonneg = k == KIND_EXP_AVG_SQ;
                }
                at = b;
            }
        }
    free(lower);
    free(parts);
}

static void label_of(void *ctx, int slot, char *buf, size_t cap) {
    reader *rd = ctx;
    ckh_label(buf, cap, slot % NUM_KINDS, rd->tensors[slot / NUM_KINDS].name);
}

#define SLOW_CHUNK ((int64_t)1 << 22)

/* Reads the extents HDF5 must convert (in chunks, through an fp32 buffer), hashing the counted
 * ones and refusing the values the fast path refuses. */
static void read_slow(reader *rd, const char *path) {
    ckio *c = &rd->c;
    if (rd->num_slow == 0) return;
    int64_t version = 0;
    hid_t file = ckh_open(c, path, &version);
    float *tmp = fsdp_xmalloc((size_t)SLOW_CHUNK * sizeof(float), "checkpoint read buffer");
    for (int i = 0; i < rd->num_slow && file >= 0 && !c->err.failed; i++) {
        const ckpt_extent *x = &rd->slow[i];
        const fsdp_ckpt_tensor *t = &rd->tensors[x->dataset / NUM_KINDS];
        char label[320];
        label_of(rd, x->dataset, label, sizeof label);
        hid_t dset = -1;
        H5OK(c, dset = H5Dopen2(file, label, H5P_DEFAULT), label);
        for (int64_t at = 0; at < x->count && !c->err.failed; at += SLOW_CHUNK) {
            int64_t n = x->count - at < SLOW_CHUNK ? x->count - at : SLOW_CHUNK;
            float *dst = rd->host_dtype == FSDP_F32 ? (float *)x->host + at : tmp;
            if (ckh_read_range(c, dset, t, (int64_t)x->first + at, n, dst)) break;
            uint64_t bad = 0;
            const uint32_t *bits = (const uint32_t *)dst;
            int64_t bad_at = -1;
            if (x->slot >= 0) {
                rd->sums[x->slot] += fsdp_cksum_f32(bits, x->first + (uint64_t)at, (size_t)n, &bad);
                if (bad || x->nonneg) bad_at = ckpt_first_bad(bits, n, x->nonneg);
            }
            if (bad_at >= 0) {
                char msg[sizeof c->err.msg];
                ckpt_bad_value_text(msg, sizeof msg, c->file, label, bits[bad_at], x->first + (uint64_t)(at + bad_at),
                                    c->rank, 0);
                fsdp_errf(&c->err, "%s", msg);
            }
            if (rd->host_dtype == FSDP_BF16)
                for (int64_t j = 0; j < n; j++) ((uint16_t *)x->host)[at + j] = fsdp_f32_to_bf16(tmp[j]);
        }
        CKH_CLOSE(c, dset, H5Dclose, label);
    }
    free(tmp);
    CKH_CLOSE(c, file, H5Fclose, NULL);
}

static void read_fast(reader *rd, const char *path) {
    ckio *c = &rd->c;
    if (rd->num_extents == 0) return;
    int fd = fsdp_open_regular(path, O_RDONLY, 0, "checkpoint", &c->err);
    if (fd < 0) return;
    int nslots = rd->num_tensors * NUM_KINDS;
    ckpt_pio *pio = ckpt_pio_start(fd, -1, path, 0, rd->extents, rd->num_extents, rd->host_dtype, nslots, label_of, rd, 0);
    if (ckpt_pio_wait(pio, &c->err) == 0)
        for (int s = 0; s < nslots; s++) rd->sums[s] += ckpt_pio_sums(pio)[s];
    ckpt_pio_free(pio);
    close(fd);
}

/* Every tensor the ranks read completely must match its checksum; the same verdict on every rank. */
static void compare(reader *rd, const int64_t *all) {
    ckio *c = &rd->c;
    int nslots = rd->num_tensors * NUM_KINDS;
    int64_t *scratch = fsdp_xmalloc((size_t)(2 * c->size + 2) * sizeof *scratch, "checkpoint checksums");
    for (int s = 0; s < nslots && !c->err.failed; s++) {
        const ckpt_dset *d = &rd->table[s];
        if (!d->has_checksum || union_size(all, c->size, nslots, s, scratch) != numel(&rd->tensors[s / NUM_KINDS]))
            continue;
        if (rd->sums[s] != d->checksum) {
            char label[320];
            label_of(rd, s, label, sizeof label);
            fsdp_errf(&c->err, "checkpoint %s: tensor %s does not match its checksum: the file was damaged or changed "
                      "after it was written", c->file, label);
        }
    }
    free(scratch);
}

int fsdp_ckpt_read_as(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                      fsdp_ckpt_piece *pieces, int num_pieces, fsdp_dtype host_dtype, fsdp_err *err) {
    reader rd;
    memset(&rd, 0, sizeof rd);
    ckio *c = &rd.c;
    ckio_init(c, comm, path);
    rd.tensors = tensors, rd.num_tensors = num_tensors, rd.host_dtype = host_dtype;
    int nslots = (num_tensors > 0 ? num_tensors : 0) * NUM_KINDS;
    const fsdp_ckpt_piece **by_tensor =
        fsdp_xcalloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *by_tensor, "checkpoint pieces");
    ckpt_check_pieces(c, tensors, num_tensors, pieces, num_pieces, 0, by_tensor);
    if (ckio_agree(c)) {
        free(by_tensor);
        return ckio_give_error(c, err);
    }
    int64_t *all = ckpt_gather_ranges(c, num_tensors, by_tensor);
    int *wanted = fsdp_xcalloc((size_t)nslots + 1, sizeof *wanted, "checkpoint read plan");
    for (int r = 0; r < c->size; r++)
        for (int s = 0; s < nslots; s++) wanted[s] |= all[((size_t)r * nslots + s) * 2 + 1] > 0;
    rd.table = fsdp_xcalloc((size_t)nslots + 1, sizeof *rd.table, "checkpoint dataset table");
    rd.sums = fsdp_xcalloc((size_t)nslots + 1, sizeof *rd.sums, "checkpoint checksums");
    int64_t version = 0;
    if (c->rank == 0) describe(c, path, tensors, num_tensors, wanted, rd.table, &version);
    if (ckio_agree(c) == 0) {
        ckio_bcast(c, rd.table, (int)((size_t)nslots * sizeof *rd.table), MPI_BYTE, 0,
                   "rank 0 to open the checkpoint");
        plan(&rd, by_tensor, all);
        read_fast(&rd, path);
        if (!c->err.failed) read_slow(&rd, path);
        if (ckio_agree(c) == 0) {
            ckio_allreduce(c, rd.sums, nslots, MPI_UINT64_T, MPI_SUM, "the other ranks' checkpoint checksums");
            compare(&rd, all);
        }
    }
    free(wanted);
    free(all);
    free(by_tensor);
    free(rd.table);
    free(rd.sums);
    free(rd.extents);
    free(rd.slow);
    return c->err.failed ? ckio_give_error(c, err) : 0;
}

int fsdp_ckpt_read(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                   fsdp_ckpt_piece *pieces, int num_pieces, fsdp_err *err) {
    return fsdp_ckpt_read_as(comm, path, tensors, num_tensors, pieces, num_pieces, FSDP_F32, err);
}
