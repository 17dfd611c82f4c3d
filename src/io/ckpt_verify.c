/* Verifying a whole checkpoint (fsdp_ckpt_verify in checkpoint.h): rank 0 lists every dataset and
 * checks the attributes and the file's structure; the ranks then read every dataset in full, each
 * an equal share, hash it (ckpt_pio.c, nothing kept in memory), refuse values no checkpoint holds
 * (non-finite anywhere, negative second moments: a checksum recomputed after an edit hides
 * neither) and compare the sums with the stored checksums. Needs no model: the file says what it
 * holds. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/files.h"
#include "ckpt_checksum.h"
#include "ckpt_internal.h"

typedef struct {
    char name[256];
    int32_t kind;
    ckpt_dset d;
} entry;

typedef struct {
    ckio *c;
    hid_t group;
    int kind;
    entry *list;
    int count, cap;
} lister;

static herr_t visit(hid_t group, const char *name, const H5L_info_t *info, void *data) {
    lister *ls = data;
    (void)info;
    H5O_info_t oi;
    if (H5Oget_info_by_name2(group, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return ckh_failed(ls->c, "H5Oget_info_by_name", name);
    if (oi.type != H5O_TYPE_DATASET) return 0;
    if (strlen(name) >= sizeof ls->list->name) {
        fsdp_errf(&ls->c->err, "checkpoint %s: dataset name too long: %.60s...", ls->c->file, name);
        return -1;
    }
    FSDP_GROW(ls->list, ls->count, ls->cap, 256, "a checkpoint's list of datasets");
    entry *e = &ls->list[ls->count++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = ls->kind;
    char label[320];
    ckh_label(label, sizeof label, ls->kind, name);
    return ckh_describe(ls->c, group, label, name, &e->d);
}

static void list_group(lister *ls, hid_t file, const char *path, int kind) {
    htri_t has = kind == KIND_PARAM ? 1 : H5Lexists(file, "optimizer", H5P_DEFAULT);
    if (has > 0 && kind != KIND_PARAM) has = H5Lexists(file, path, H5P_DEFAULT);
    if (has <= 0) {
        if (has < 0) ckh_failed(ls->c, "H5Lexists", path);
        return;
    }
    hid_t g = -1;
    if (H5OK(ls->c, g = H5Gopen2(file, path, H5P_DEFAULT), path)) return;
    ls->kind = kind;
    hsize_t idx = 0;
    if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, visit, ls) < 0 && !ls->c->err.failed)
        ckh_failed(ls->c, "H5Literate", path);
    CKH_CLOSE(ls->c, g, H5Gclose, path);
}

static int64_t numel_of(const ckpt_dset *d) { return d->ndim == 1 ? d->dims[0] : d->ndim == 2 ? d->dims[0] * d->dims[1] : 0; }

static const entry *find(const lister *ls, int kind, const char *name) {
    for (int i = 0; i < ls->count; i++)
        if (ls->list[i].kind == kind && !strcmp(ls->list[i].name, name)) return &ls->list[i];
    return NULL;
}

/* Structure: float datasets of one or two dimensions, each checksummed (version 2), and the
 * optimizer's moments exactly for the weights, of the same shapes. */
static void check_structure(ckio *c, const lister *ls, int64_t version, fsdp_ckpt_info *info) {
    int moments = 0;
    for (int i = 0; i < ls->count && !c->err.failed; i++) {
        const entry *e = &ls->list[i];
        char label[320];
        ckh_label(label, sizeof label, e->kind, e->name);
        if (!e->d.is_float || (e->d.ndim != 1 && e->d.ndim != 2))
            fsdp_errf(&c->err, "checkpoint %s: tensor %s is not a floating-point vector or matrix", c->file, label);
        else if (version >= 2 && !e->d.has_checksum)
            fsdp_errf(&c->err, "checkpoint %s: tensor %s has no checksum (a format-%lld file must have one)", c->file,
                      label, (long long)version);
        if (e->kind != KIND_PARAM) {
            moments++;
            const entry *w = find(ls, KIND_PARAM, e->name);
            if (!c->err.failed && (!w || w->d.ndim != e->d.ndim || w->d.dims[0] != e->d.dims[0] || w->d.dims[1] != e->d.dims[1]))
                fsdp_errf(&c->err, "checkpoint %s: tensor %s has no weight of its shape", c->file, label);
            continue;
        }
        info->num_weights++;
        info->weight_elements += numel_of(&e->d);
    }
    info->has_optimizer = moments > 0;
    for (int i = 0; i < ls->count && !c->err.failed && moments; i++)
        for (int k = KIND_EXP_AVG; k < NUM_KINDS && ls->list[i].kind == KIND_PARAM; k++)
            if (!find(ls, k, ls->list[i].name))
                fsdp_errf(&c->err, "checkpoint %s: tensor %s has no optimizer/%s", c->file, ls->list[i].name,
                          FSDP_CKPT_KIND_GROUP[k]);
    if (!c->err.failed && info->num_weights == 0) fsdp_errf(&c->err, "checkpoint %s holds no tensors", c->file);
}

/* Rank 0: the attributes and the list of datasets. */
static entry *inspect(ckio *c, const char *path, fsdp_ckpt_info *info, int *count) {
    int64_t version = 0;
    lister ls = {c, -1, 0, NULL, 0, 0};
    hid_t file = ckh_open(c, path, &version);
    if (file >= 0 && ckh_read_meta(c, file, version, &info->meta) == 0) {
        info->format_version = (int)version;
        info->meta.format_version = (int)version;
        list_group(&ls, file, "/", KIND_PARAM);
        for (int k = KIND_EXP_AVG; k < NUM_KINDS && !c->err.failed; k++) {
            char gpath[32];
            snprintf(gpath, sizeof gpath, "optimizer/%s", FSDP_CKPT_KIND_GROUP[k]);
            list_group(&ls, file, gpath, k);
        }
        if (!c->err.failed) check_structure(c, &ls, version, info);
    }
    CKH_CLOSE(c, file, H5Fclose, NULL);
    *count = ls.count;
    return ls.list;
}

typedef struct {
    const entry *list;
} names;

static void label_of(void *ctx, int slot, char *buf, size_t cap) {
    const names *n = ctx;
    ckh_label(buf, cap, n->list[slot].kind, n->list[slot].name);
}

/* This rank's share of every dataset, hashed; datasets without a plain offset go through HDF5. */
static void hash_share(ckio *c, const char *path, const entry *list, int count, uint64_t *sums) {
    ckpt_extent *ext = fsdp_xcalloc((size_t)count + 1, sizeof *ext, "checkpoint verification");
    int n = 0, slow = 0;
    for (int i = 0; i < count; i++) {
        int64_t total = numel_of(&list[i].d), lo = total * c->rank / c->size, hi = total * (c->rank + 1) / c->size;
        if (hi <= lo) continue;
        if (list[i].d.offset < 0) {
            slow = 1;
            continue;
        }
        ckpt_extent *x = &ext[n++];
        x->file_offset = list[i].d.offset + lo * 4, x->count = hi - lo, x->host = NULL;
        x->first = (uint64_t)lo, x->slot = x->dataset = i;
        x->nonneg = list[i].kind == KIND_EXP_AVG_SQ;
    }
    names ctx = {list};
    if (n > 0) {
        int fd = fsdp_open_regular(path, O_RDONLY, 0, "checkpoint", &c->err);
        if (fd >= 0) {
            ckpt_pio *pio = ckpt_pio_start(fd, -1, path, 0, ext, n, FSDP_F32, count, label_of, &ctx, 0);
            if (ckpt_pio_wait(pio, &c->err) == 0)
                for (int i = 0; i < count; i++) sums[i] += ckpt_pio_sums(pio)[i];
            ckpt_pio_free(pio);
            close(fd);
        }
    }
    free(ext);
    if (!slow || c->err.failed) return;
    /* Rewritten by another tool: read the share through HDF5 in chunks. */
    int64_t version = 0;
    hid_t file = ckh_open(c, path, &version);
    float *buf = fsdp_xmalloc((size_t)(1 << 22) * sizeof(float), "checkpoint verification");
    for (int i = 0; i < count && file >= 0 && !c->err.failed; i++) {
        const entry *e = &list[i];
        int64_t total = numel_of(&e->d), lo = total * c->rank / c->size, hi = total * (c->rank + 1) / c->size;
        if (e->d.offset >= 0 || hi <= lo) continue;
        char label[320];
        ckh_label(label, sizeof label, e->kind, e->name);
        fsdp_ckpt_tensor t = {e->name, e->d.ndim, {e->d.dims[0], e->d.dims[1]}};
        hid_t dset = -1;
        H5OK(c, dset = H5Dopen2(file, label, H5P_DEFAULT), label);
        for (int64_t at = lo; at < hi && dset >= 0 && !c->err.failed; at += 1 << 22) {
            int64_t m = hi - at < (1 << 22) ? hi - at : (1 << 22);
            uint64_t bad = 0;
            const uint32_t *bits = (const uint32_t *)buf;
            if (ckh_read_range(c, dset, &t, at, m, buf)) break;
            sums[i] += fsdp_cksum_f32(bits, (uint64_t)at, (size_t)m, &bad);
            int64_t j = bad || e->kind == KIND_EXP_AVG_SQ ? ckpt_first_bad(bits, m, e->kind == KIND_EXP_AVG_SQ) : -1;
            if (j >= 0) {
                char msg[sizeof c->err.msg];
                ckpt_bad_value_text(msg, sizeof msg, c->file, label, bits[j], (uint64_t)(at + j), c->rank, 0);
                fsdp_errf(&c->err, "%s", msg);
            }
        }
        CKH_CLOSE(c, dset, H5Dclose, label);
    }
    free(buf);
    CKH_CLOSE(c, file, H5Fclose, NULL);
}

int fsdp_ckpt_verify(MPI_Comm comm, const char *path, fsdp_ckpt_info *info, fsdp_err *err) {
    ckio c;
    ckio_init(&c, comm, path);
    memset(info, 0, sizeof *info);
    int count = 0;
    entry *list = c.rank == 0 ? inspect(&c, path, info, &count) : NULL;
    if (ckio_agree(&c)) {
        free(list);
        fsdp_ckpt_meta_free(&info->meta);
        return ckio_give_error(&c, err);
    }
    ckio_bcast(&c, &count, 1, MPI_INT, 0, "rank 0 to list the checkpoint");
    if (c.rank != 0) list = fsdp_xcalloc((size_t)count + 1, sizeof *list, "checkpoint verification");
    ckio_bcast(&c, list, (int)((size_t)count * sizeof *list), MPI_BYTE, 0, "rank 0 to list the checkpoint");
    uint64_t *sums = fsdp_xcalloc((size_t)count + 1, sizeof *sums, "checkpoint checksums");
    hash_share(&c, path, list, count, sums);
    if (ckio_agree(&c) == 0) {
        ckio_allreduce(&c, sums, count, MPI_UINT64_T, MPI_SUM, "the other ranks' checkpoint checksums");
        for (int i = 0; i < count && !c.err.failed; i++) {
            const entry *e = &list[i];
            info->num_datasets++;
            info->bytes += numel_of(&e->d) * 4;
            if (e->d.has_checksum && sums[i] != e->d.checksum) {
                char label[320];
                ckh_label(label, sizeof label, e->kind, e->name);
                fsdp_errf(&c.err, "checkpoint %s: tensor %s does not match its checksum: the file was damaged or "
                          "changed after it was written", path, label);
            }
        }
        info->checksummed = info->format_version >= 2;
    }
    free(sums);
    free(list);
    if (c.err.failed) {
        fsdp_ckpt_meta_free(&info->meta);
        return ckio_give_error(&c, err);
    }
    /* Rank 0's description travels; the attributes are read again by fsdp_ckpt_read_meta, which
     * gives them to every rank. */
    fsdp_ckpt_meta_free(&info->meta);
    int head[4] = {info->format_version, info->num_weights, info->has_optimizer, info->checksummed};
    int64_t big = info->weight_elements;
    ckio_bcast(&c, head, 4, MPI_INT, 0, "rank 0 to describe the checkpoint");
    ckio_bcast(&c, &big, 1, MPI_INT64_T, 0, "rank 0 to describe the checkpoint");
    info->format_version = head[0], info->num_weights = head[1], info->has_optimizer = head[2];
    info->checksummed = head[3], info->weight_elements = big;
    return fsdp_ckpt_read_meta(comm, path, &info->meta, err);
}
