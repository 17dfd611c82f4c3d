/* Checkpoints in parallel HDF5 over MPI-IO (layout in checkpoint.h): the collective writer and
 * readers, and the checkpoint-directory helpers (latest pointer, pruning).
 *
 * Error discipline: HDF5 calls that touch the file collectively (create, open, close, dataset
 * creation, collective transfers) must be made by every rank in the same order, or some rank waits
 * forever. So each rank records its own failure in a private fsdp_err and the ranks agree
 * (fsdp_agree) right after every such call; once they agree on a failure, all of them take the same
 * clean-up path (close what is open, remove the temporary file) and return the lowest failing
 * rank's message. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KIND_PARAM, KIND_EXP_AVG, KIND_EXP_AVG_SQ, NUM_KINDS };
static const char *const KIND_GROUP[NUM_KINDS] = {NULL, "exp_avg", "exp_avg_sq"};

/* One collective operation on one file. */
typedef struct {
    MPI_Comm comm;
    int rank;
    const char *file; /* named in messages: the temporary file while writing */
    fsdp_err err;     /* this rank's failure, until agreed */
} ckio;

static void ckio_init(ckio *c, MPI_Comm comm, const char *file) {
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->file = file;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &c->rank));
    /* Failures are reported through fsdp_err with the call named; HDF5's own stack dumps would
     * interleave across ranks. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* All ranks learn whether any failed; 0 when none did. */
static int agree(ckio *c) { return fsdp_agree(&c->comm, &c->err); }

/* Copies the agreed message to the caller's err and returns -1. */
static int give_error(const ckio *c, fsdp_err *err) {
    if (err) *err = c->err;
    return -1;
}

typedef struct {
    char *buf;
    size_t cap;
} detail_buf;

static herr_t innermost_error(unsigned n, const H5E_error2_t *e, void *data) {
    detail_buf *d = data;
    if (n == 0 && e->desc) snprintf(d->buf, d->cap, "%s", e->desc);
    return 0;
}

/* The description HDF5 recorded where the failure started, e.g. "truncated file: eof = ...". */
static void hdf5_detail(char *buf, size_t cap) {
    detail_buf d = {buf, cap};
    buf[0] = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &d);
    H5Eclear2(H5E_DEFAULT);
}

/* Records a failed HDF5 call; `what` names the object it was about (may be NULL). */
static int h5_failed(ckio *c, const char *call, const char *what) {
    if (c->err.failed) return -1;
    char detail[400];
    hdf5_detail(detail, sizeof detail);
    return fsdp_errf(&c->err, "checkpoint %s: %s failed%s%s on rank %d%s%s", c->file, call, what ? " for " : "",
                     what ? what : "", c->rank, detail[0] ? ": " : "", detail);
}

/* The function named in a call's source text: "H5Dcreate2" from "dset = H5Dcreate2(loc, ...)". */
static const char *call_name(const char *expr, char *buf, size_t cap) {
    const char *paren = strchr(expr, '('), *start = paren;
    if (!paren) return expr;
    while (start > expr && (start[-1] == '_' || (start[-1] >= '0' && start[-1] <= '9') ||
                            ((start[-1] | 0x20) >= 'a' && (start[-1] | 0x20) <= 'z')))
        start--;
    snprintf(buf, cap, "%.*s", (int)(paren - start), start);
    return buf;
}

static int h5_check(ckio *c, int64_t rc, const char *expr, const char *what) {
    char name[64];
    return rc < 0 ? h5_failed(c, call_name(expr, name, sizeof name), what) : 0;
}

/* Checks an HDF5 call returning herr_t, htri_t or hid_t (negative is failure); 0 when it worked. */
#define H5OK(c, call, what) h5_check((c), (int64_t)(call), #call, (what))

/* Closes an id if it is open; a failed close is recorded like any other failed call. */
static void close_checked(ckio *c, hid_t *id, herr_t (*fn)(hid_t), const char *name, const char *what) {
    if (*id >= 0 && fn(*id) < 0) h5_failed(c, name, what);
    *id = -1;
}
#define CLOSE(c, id, fn, what) close_checked((c), &(id), fn, #fn, (what))

/* The MPI-IO file access list. Writing also lets rank 0 alone write the metadata, collectively
 * coordinated, instead of every rank racing to write the same blocks. */
static hid_t make_fapl(ckio *c, int writing) {
    hid_t fapl = -1;
    if (H5OK(c, fapl = H5Pcreate(H5P_FILE_ACCESS), NULL) ||
        H5OK(c, H5Pset_fapl_mpio(fapl, c->comm, MPI_INFO_NULL), NULL) ||
        (writing && H5OK(c, H5Pset_coll_metadata_write(fapl, 1), NULL)))
        CLOSE(c, fapl, H5Pclose, NULL);
    return fapl;
}

/* ---- inputs --------------------------------------------------------------------------------- */

static int64_t numel(const fsdp_ckpt_tensor *t) { return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *dims) {
    if (ndim == 1)
        snprintf(buf, cap, "[%lld]", (long long)dims[0]);
    else if (ndim == 2)
        snprintf(buf, cap, "[%lld, %lld]", (long long)dims[0], (long long)dims[1]);
    else
        snprintf(buf, cap, "(%d dimensions)", ndim);
}

/* The tensor table must be identical on all ranks, so these checks give the same answer on each. */
static int check_tensors(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors) {
    if (num_tensors < 0) return fsdp_errf(&c->err, "checkpoint %s: negative tensor count", c->file);
    for (int i = 0; i < num_tensors; i++) {
        const fsdp_ckpt_tensor *t = &tensors[i];
        const char *n = t->name;
        /* A slash would make a nested path and "optimizer" would collide with the optimizer group. */
        if (!n || !n[0] || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, "optimizer"))
            return fsdp_errf(&c->err, "checkpoint %s: tensor %d has an unusable name '%s'", c->file, i, n ? n : "");
        if ((t->ndim != 1 && t->ndim != 2) || t->shape[0] < 1 || (t->ndim == 2 && t->shape[1] < 1))
            return fsdp_errf(&c->err, "checkpoint %s: tensor %s has a bad shape (ndim %d)", c->file, n, t->ndim);
        for (int j = 0; j < i; j++)
            if (!strcmp(tensors[j].name, n))
                return fsdp_errf(&c->err, "checkpoint %s: tensor %s is listed twice", c->file, n);
    }
    return 0;
}

/* Checks this rank's pieces and indexes them by tensor (by_tensor[t] or NULL). */
static int check_pieces(ckio *c, const fsdp_ckpt_tensor *tensors, int num_tensors, const fsdp_ckpt_piece *pieces,
                        int num_pieces, int writing, const fsdp_ckpt_piece **by_tensor) {
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

/* ---- transfers --------------------------------------------------------------------------------- */

/* Elements per rank per H5Dwrite/H5Dread: MPI-IO counts in int, so stay at 1 GiB. Tests set
 * FSDP_CKPT_TRANSFER_ELEMS to exercise the multi-round path on small tensors. */
static int64_t max_transfer(void) {
    const char *s = getenv("FSDP_CKPT_TRANSFER_ELEMS");
    long long v = s ? atoll(s) : 0;
    return v > 0 ? (int64_t)v : (int64_t)1 << 28;
}

static float *kind_buffer(const fsdp_ckpt_piece *p, int kind) {
    return kind == KIND_PARAM ? p->param : kind == KIND_EXP_AVG ? p->exp_avg : p->exp_avg_sq;
}

/* Rounds of collective transfers per (tensor, kind): the most any rank needs; 0 where no rank has
 * a buffer for it. Every rank makes this many H5Dwrite/H5Dread calls on that dataset. */
static int *plan_rounds(ckio *c, int num_tensors, const fsdp_ckpt_piece **by_tensor) {
    int n = num_tensors * NUM_KINDS;
    int *mine = fsdp_xcalloc((size_t)n, sizeof *mine, "checkpoint transfer plan");
    int *all = fsdp_xcalloc((size_t)n, sizeof *all, "checkpoint transfer plan");
    int64_t m = max_transfer();
    for (int t = 0; t < num_tensors; t++)
        for (int k = 0; k < NUM_KINDS; k++) {
            const fsdp_ckpt_piece *p = by_tensor[t];
            if (p && p->count > 0 && kind_buffer(p, k)) mine[t * NUM_KINDS + k] = (int)((p->count + m - 1) / m);
        }
    if (n > 0) FSDP_CHECK_MPI(MPI_Allreduce(mine, all, n, MPI_INT, MPI_MAX, c->comm));
    free(mine);
    return all;
}

typedef struct {
    hsize_t start[2], count[2];
} block;

static block make_block(int64_t row, int64_t col, int64_t rows, int64_t cols) {
    block b = {{(hsize_t)row, (hsize_t)col}, {(hsize_t)rows, (hsize_t)cols}};
    return b;
}

/* Selects the flat row-major range [s, s+n) of t, n > 0: for a matrix the union of a partial first
 * row, the full rows between and a partial last row. HDF5 visits a union in dataspace order, so the
 * selection maps onto a contiguous buffer in flat order. */
static int select_range(ckio *c, hid_t space, const fsdp_ckpt_tensor *t, int64_t s, int64_t n) {
    if (t->ndim == 1) {
        hsize_t start = (hsize_t)s, count = (hsize_t)n;
        return H5OK(c, H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &count, NULL), t->name);
    }
    int64_t cols = t->shape[1], e = s + n;
    int64_t r0 = s / cols, c0 = s % cols, r1 = e / cols, c1 = e % cols;
    block b[3];
    int nb = 0;
    if (r0 == r1) {
        b[nb++] = make_block(r0, c0, 1, n);
    } else {
        if (c0) b[nb++] = make_block(r0++, c0, 1, cols - c0);
        if (r1 > r0) b[nb++] = make_block(r0, 0, r1 - r0, cols);
        if (c1) b[nb++] = make_block(r1, 0, 1, c1);
    }
    for (int i = 0; i < nb; i++) {
        H5S_seloper_t op = i ? H5S_SELECT_OR : H5S_SELECT_SET;
        if (H5OK(c, H5Sselect_hyperslab(space, op, b[i].start, NULL, b[i].count, NULL), t->name)) return -1;
    }
    return 0;
}

/* One collective transfer: round r of this rank's piece (nothing selected when it has no part in
 * this round). A failure is recorded in c->err for the caller to agree on. */
static void transfer_round(ckio *c, hid_t dset, hid_t dxpl, const fsdp_ckpt_tensor *t, const fsdp_ckpt_piece *p,
                          int kind, int r, int writing) {
    int64_t m = max_transfer(), off = (int64_t)r * m;
    float *buf = p ? kind_buffer(p, kind) : NULL;
    int64_t n = (buf && p->count > off) ? (p->count - off < m ? p->count - off : m) : 0;
    float dummy = 0;
    hsize_t mdim = n > 0 ? (hsize_t)n : 1;
    hid_t fspace = -1, mspace = -1;
    int rc = H5OK(c, fspace = H5Dget_space(dset), t->name) ||
             H5OK(c, mspace = H5Screate_simple(1, &mdim, NULL), t->name);
    if (!rc && n > 0)
        rc = select_range(c, fspace, t, p->start + off, n);
    else if (!rc)
        rc = H5OK(c, H5Sselect_none(fspace), t->name) || H5OK(c, H5Sselect_none(mspace), t->name);
    void *data = n > 0 ? (void *)(buf + off) : (void *)&dummy;
    if (!rc && writing) rc = H5OK(c, H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data), t->name);
    if (!rc && !writing) rc = H5OK(c, H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data), t->name);
    CLOSE(c, fspace, H5Sclose, t->name);
    CLOSE(c, mspace, H5Sclose, t->name);
}

/* All rounds of one dataset, agreeing after each so that no rank is left inside a collective. */
static int transfer_all(ckio *c, hid_t dset, const fsdp_ckpt_tensor *t, const fsdp_ckpt_piece *p, int kind,
                        int rounds, int writing) {
    hid_t dxpl = -1;
    if (!H5OK(c, dxpl = H5Pcreate(H5P_DATASET_XFER), t->name))
        H5OK(c, H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE), t->name);
    if (agree(c)) {
        CLOSE(c, dxpl, H5Pclose, t->name);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; r++) {
        transfer_round(c, dset, dxpl, t, p, kind, r, writing);
        rc = agree(c);
    }
    CLOSE(c, dxpl, H5Pclose, t->name);
    return rc;
}

/* ---- attributes ----------------------------------------------------------------------------- */

static int write_string_attr(ckio *c, hid_t loc, const char *name, const char *value) {
    hid_t type = -1, space = -1, attr = -1;
    const char *v = value ? value : "";
    int rc = H5OK(c, type = H5Tcopy(H5T_C_S1), name) || H5OK(c, space = H5Screate(H5S_SCALAR), name) ||
             H5OK(c, H5Tset_size(type, H5T_VARIABLE), name) ||
             H5OK(c, H5Tset_cset(type, H5T_CSET_UTF8), name) ||
             H5OK(c, attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), name) ||
             H5OK(c, H5Awrite(attr, type, &v), name);
    CLOSE(c, attr, H5Aclose, name);
    CLOSE(c, space, H5Sclose, name);
    CLOSE(c, type, H5Tclose, name);
    return rc ? -1 : 0;
}

static int write_int_attr(ckio *c, hid_t loc, const char *name, int64_t value, int is_unsigned) {
    hid_t space = -1, attr = -1;
    uint64_t u = (uint64_t)value;
    hid_t ftype = is_unsigned ? H5T_STD_U64LE : H5T_STD_I64LE;
    hid_t mtype = is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
    const void *data = is_unsigned ? (const void *)&u : (const void *)&value;
    int rc = H5OK(c, space = H5Screate(H5S_SCALAR), name) ||
             H5OK(c, attr = H5Acreate2(loc, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT), name) ||
             H5OK(c, H5Awrite(attr, mtype, data), name);
    CLOSE(c, attr, H5Aclose, name);
    CLOSE(c, space, H5Sclose, name);
    return rc ? -1 : 0;
}

static int write_meta(ckio *c, hid_t file, const fsdp_ckpt_meta *meta) {
    char strategy[sizeof meta->strategy + 1];
    snprintf(strategy, sizeof strategy, "%.*s", (int)sizeof meta->strategy, meta->strategy);
    if (write_string_attr(c, file, "format", FSDP_CKPT_FORMAT) ||
        write_int_attr(c, file, "format_version", FSDP_CKPT_FORMAT_VERSION, 0) ||
        write_int_attr(c, file, "step", meta->step, 0) ||
        write_int_attr(c, file, "samples_seen", meta->samples_seen, 0) ||
        write_int_attr(c, file, "seed", (int64_t)meta->seed, 1) ||
        write_string_attr(c, file, "config", meta->config_json) ||
        write_string_attr(c, file, "schedule", meta->schedule_json) ||
        write_string_attr(c, file, "run", meta->run_json) ||
        write_int_attr(c, file, "world_size", meta->world_size, 0) ||
        write_string_attr(c, file, "strategy", strategy))
        return -1;
    return 0;
}

/* Opens a root attribute, naming a missing one in the message. */
static hid_t open_attr(ckio *c, hid_t file, const char *name, H5T_class_t want) {
    htri_t exists = H5Aexists(file, name);
    if (exists < 0) {
        h5_failed(c, "H5Aexists", name);
        return -1;
    }
    if (!exists) {
        fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is missing", c->file, name);
        return -1;
    }
    hid_t attr = -1, type = -1, space = -1;
    int bad = H5OK(c, attr = H5Aopen(file, name, H5P_DEFAULT), name) || H5OK(c, type = H5Aget_type(attr), name) ||
              H5OK(c, space = H5Aget_space(attr), name);
    if (!bad && (H5Tget_class(type) != want || H5Sget_simple_extent_npoints(space) != 1))
        fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is not a single %s", c->file, name,
                  want == H5T_STRING ? "string" : "integer");
    CLOSE(c, type, H5Tclose, name);
    CLOSE(c, space, H5Sclose, name);
    if (c->err.failed) CLOSE(c, attr, H5Aclose, name);
    return attr;
}

/* Reads a variable-length string attribute; mtype is a C string type of the file's character set. */
static char *read_vlen_string(ckio *c, hid_t attr, hid_t mtype, const char *name) {
    char *s = NULL, *out = NULL;
    if (H5OK(c, H5Tset_size(mtype, H5T_VARIABLE), name) || H5OK(c, H5Aread(attr, mtype, &s), name)) return NULL;
    out = strdup(s ? s : "");
    if (s) H5OK(c, H5free_memory(s), name);
    if (!out) fsdp_fatal("out of host memory reading attribute %s", name);
    return out;
}

/* Reads a fixed-length string attribute of n bytes (padded any way) as a NUL-terminated string. */
static char *read_fixed_string(ckio *c, hid_t attr, hid_t mtype, size_t n, const char *name) {
    char *s = fsdp_xcalloc(n + 1, 1, "a checkpoint attribute");
    if (H5OK(c, H5Tset_size(mtype, n + 1), name) || H5OK(c, H5Tset_strpad(mtype, H5T_STR_NULLTERM), name) ||
        H5OK(c, H5Aread(attr, mtype, s), name)) {
        free(s);
        return NULL;
    }
    return s;
}

/* Reads a string attribute, variable- or fixed-length (h5py writes either), into a malloc'ed string. */
static char *read_string_attr(ckio *c, hid_t file, const char *name) {
    hid_t attr = open_attr(c, file, name, H5T_STRING), ftype = -1, mtype = -1;
    char *out = NULL;
    if (attr < 0) return NULL;
    htri_t is_vlen = -1;
    size_t n = 0;
    /* HDF5 converts between string types of the same character set only. */
    if (!H5OK(c, ftype = H5Aget_type(attr), name) && !H5OK(c, mtype = H5Tcopy(H5T_C_S1), name) &&
        !H5OK(c, H5Tset_cset(mtype, H5Tget_cset(ftype)), name) && !H5OK(c, is_vlen = H5Tis_variable_str(ftype), name)) {
        if (is_vlen)
            out = read_vlen_string(c, attr, mtype, name);
        else if ((n = H5Tget_size(ftype)) == 0)
            h5_failed(c, "H5Tget_size", name);
        else
            out = read_fixed_string(c, attr, mtype, n, name);
    }
    CLOSE(c, mtype, H5Tclose, name);
    CLOSE(c, ftype, H5Tclose, name);
    CLOSE(c, attr, H5Aclose, name);
    if (c->err.failed) {
        free(out);
        return NULL;
    }
    return out;
}

static int read_int_attr(ckio *c, hid_t file, const char *name, int is_unsigned, void *out) {
    hid_t attr = open_attr(c, file, name, H5T_INTEGER);
    if (attr < 0) return -1;
    int rc = H5OK(c, H5Aread(attr, is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, out), name);
    CLOSE(c, attr, H5Aclose, name);
    return rc ? -1 : 0;
}

/* ---- opening for reading --------------------------------------------------------------------- */

/* Rank 0 looks at the file first, so that a missing or foreign file gets a plain message rather
 * than an HDF5 failure. */
static void probe_file(ckio *c, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            fsdp_errf(&c->err, "checkpoint %s: no such file", path);
        else
            fsdp_errf(&c->err, "checkpoint %s: %s", path, strerror(errno));
        return;
    }
    struct stat st;
    int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    close(fd);
    if (is_dir) {
        fsdp_errf(&c->err, "checkpoint %s is a directory, not a file", path);
        return;
    }
    if (H5Fis_hdf5(path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        fsdp_errf(&c->err, "checkpoint %s is truncated or not an HDF5 file", path);
    }
}

/* Checks the format attributes; the same answer on every rank since all read the same file. */
static void check_format(ckio *c, hid_t file, const char *path) {
    htri_t has = H5Aexists(file, "format");
    if (has < 0) {
        h5_failed(c, "H5Aexists", "format");
        return;
    }
    char *format = has ? read_string_attr(c, file, "format") : NULL;
    if (!c->err.failed && (!format || strcmp(format, FSDP_CKPT_FORMAT)))
        fsdp_errf(&c->err, "%s is not an fsdp.c checkpoint", path);
    free(format);
    int64_t version = 0;
    if (c->err.failed || read_int_attr(c, file, "format_version", 0, &version)) return;
    if (version > FSDP_CKPT_FORMAT_VERSION)
        fsdp_errf(&c->err, "checkpoint %s has format version %lld; this build of fsdp.c reads up to version %d",
                  path, (long long)version, FSDP_CKPT_FORMAT_VERSION);
    else if (version < 1)
        fsdp_errf(&c->err, "checkpoint %s has an invalid format version %lld", path, (long long)version);
}

/* Opens an fsdp.c checkpoint collectively; on failure every rank returns -1 with the file closed. */
static hid_t open_checkpoint(ckio *c, const char *path) {
    if (c->rank == 0) probe_file(c, path);
    if (agree(c)) return -1;
    hid_t fapl = make_fapl(c, 0), file = -1;
    if (fapl >= 0) {
        file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        if (file < 0) {
            char detail[400];
            hdf5_detail(detail, sizeof detail);
            fsdp_errf(&c->err, "checkpoint %s is truncated or not an HDF5 file%s%s%s", path, detail[0] ? " (" : "",
                      detail, detail[0] ? ")" : "");
        }
        CLOSE(c, fapl, H5Pclose, NULL);
    }
    if (agree(c)) {
        CLOSE(c, file, H5Fclose, NULL);
        return -1;
    }
    check_format(c, file, path);
    if (agree(c)) {
        CLOSE(c, file, H5Fclose, NULL);
        return -1;
    }
    return file;
}

/* Closes a file every rank has open; the close is collective, so its failure is agreed on too. */
static int close_file(ckio *c, hid_t *file) {
    if (*file >= 0) H5OK(c, H5Fclose(*file), NULL);
    *file = -1;
    return agree(c);
}

/* ---- writing -------------------------------------------------------------------------------------- */

/* Creates one contiguous float32 dataset of t's natural shape and writes the pieces into it. */
static int write_dataset(ckio *c, hid_t loc, const fsdp_ckpt_tensor *t, const fsdp_ckpt_piece *p, int kind,
                         int rounds) {
    hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
    hid_t space = -1, dcpl = -1, dset = -1;
    /* Every element is written by some piece, so filling first would only double the I/O. */
    if (!H5OK(c, space = H5Screate_simple(t->ndim, dims, NULL), t->name) &&
        !H5OK(c, dcpl = H5Pcreate(H5P_DATASET_CREATE), t->name) &&
        !H5OK(c, H5Pset_layout(dcpl, H5D_CONTIGUOUS), t->name) &&
        !H5OK(c, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), t->name))
        H5OK(c, dset = H5Dcreate2(loc, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), t->name);
    CLOSE(c, space, H5Sclose, t->name);
    CLOSE(c, dcpl, H5Pclose, t->name);
    int rc = agree(c);
    if (rc == 0) rc = transfer_all(c, dset, t, p, kind, rounds, 1);
    if (dset >= 0 && H5Dclose(dset) < 0) h5_failed(c, "H5Dclose", t->name);
    return rc ? rc : agree(c);
}

/* Creates /optimizer/exp_avg and /optimizer/exp_avg_sq; groups[0] is the root. */
static int create_groups(ckio *c, hid_t file, hid_t groups[NUM_KINDS]) {
    hid_t opt = -1;
    groups[KIND_PARAM] = file;
    if (!H5OK(c, opt = H5Gcreate2(file, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "optimizer"))
        for (int k = KIND_EXP_AVG; k < NUM_KINDS; k++)
            if (H5OK(c, groups[k] = H5Gcreate2(opt, KIND_GROUP[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     KIND_GROUP[k]))
                break;
    CLOSE(c, opt, H5Gclose, "optimizer");
    return agree(c);
}

static int write_contents(ckio *c, hid_t file, const fsdp_ckpt_tensor *tensors, int num_tensors,
                          const fsdp_ckpt_piece **by_tensor, const int *rounds, const fsdp_ckpt_meta *meta) {
    hid_t groups[NUM_KINDS] = {-1, -1, -1};
    write_meta(c, file, meta);
    int rc = agree(c);
    if (rc == 0) rc = create_groups(c, file, groups);
    for (int t = 0; t < num_tensors && rc == 0; t++)
        for (int k = 0; k < NUM_KINDS && rc == 0; k++)
            rc = write_dataset(c, groups[k], &tensors[t], by_tensor[t], k, rounds[t * NUM_KINDS + k]);
    for (int k = KIND_EXP_AVG; k < NUM_KINDS; k++)
        if (groups[k] >= 0 && H5Gclose(groups[k]) < 0) h5_failed(c, "H5Gclose", KIND_GROUP[k]);
    return rc ? rc : agree(c);
}

/* Creates and fills the temporary file; it is closed on return either way. */
static int write_file(ckio *c, const char *tmp, const fsdp_ckpt_tensor *tensors, int num_tensors,
                      const fsdp_ckpt_piece **by_tensor, const int *rounds, const fsdp_ckpt_meta *meta) {
    hid_t fapl = make_fapl(c, 1), file = -1;
    if (fapl >= 0) {
        H5OK(c, file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl), NULL);
        CLOSE(c, fapl, H5Pclose, NULL);
    }
    if (agree(c)) {
        CLOSE(c, file, H5Fclose, NULL);
        return -1;
    }
    int rc = write_contents(c, file, tensors, num_tensors, by_tensor, rounds, meta);
    int closed = close_file(c, &file);
    return rc ? rc : closed;
}

/* Makes the finished file durable and gives it its final name (rank 0; the others wait). */
static void publish(ckio *c, const char *tmp, const char *path) {
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        fsdp_errf(&c->err, "checkpoint %s: cannot sync: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (!c->err.failed && rename(tmp, path) != 0)
        fsdp_errf(&c->err, "checkpoint %s: cannot rename %s to it: %s", path, tmp, strerror(errno));
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

static void remove_file(void *path) { unlink((const char *)path); }

int fsdp_ckpt_write(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                    const fsdp_ckpt_piece *pieces, int num_pieces, const fsdp_ckpt_meta *meta, fsdp_err *err) {
    char tmp[4096];
    ckio c;
    fsdp_ckpt_meta no_meta = {0};
    if (!meta) meta = &no_meta;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ckio_init(&c, comm, path);
    const fsdp_ckpt_piece **by_tensor =
        fsdp_xcalloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *by_tensor, "checkpoint pieces");
    if (strlen(path) + 5 > sizeof tmp)
        fsdp_errf(&c.err, "checkpoint %s: path too long", path);
    else if (check_tensors(&c, tensors, num_tensors) == 0)
        check_pieces(&c, tensors, num_tensors, pieces, num_pieces, 1, by_tensor);
    if (agree(&c)) {
        free(by_tensor);
        return give_error(&c, err);
    }
    int *rounds = plan_rounds(&c, num_tensors, by_tensor);
    int handle = fsdp_cleanup_push(remove_file, tmp);
    c.file = tmp;
    int rc = write_file(&c, tmp, tensors, num_tensors, by_tensor, rounds, meta);
    FSDP_CHECK_MPI(MPI_Barrier(comm));
    if (rc == 0) {
        if (c.rank == 0) publish(&c, tmp, path);
        rc = agree(&c);
    }
    if (rc != 0 && c.rank == 0) unlink(tmp);
    FSDP_CHECK_MPI(MPI_Barrier(comm)); /* nobody returns while the file is still being renamed or removed */
    fsdp_cleanup_pop(handle);
    free(rounds);
    free(by_tensor);
    return rc ? give_error(&c, err) : 0;
}

/* ---- reading ---------------------------------------------------------------------------------------- */

/* Opens optimizer/<group> where some rank wants that state; groups[0] is the root. */
static void open_groups(ckio *c, hid_t file, const int *rounds, int num_tensors, hid_t groups[NUM_KINDS]) {
    groups[KIND_PARAM] = file;
    for (int k = KIND_EXP_AVG; k < NUM_KINDS && !c->err.failed; k++) {
        int wanted = 0;
        for (int t = 0; t < num_tensors; t++) wanted |= rounds[t * NUM_KINDS + k] > 0;
        if (!wanted) continue;
        char gpath[32];
        snprintf(gpath, sizeof gpath, "optimizer/%s", KIND_GROUP[k]);
        htri_t has = H5Lexists(file, "optimizer", H5P_DEFAULT);
        if (has > 0) has = H5Lexists(file, gpath, H5P_DEFAULT);
        if (has < 0)
            h5_failed(c, "H5Lexists", gpath);
        else if (!has)
            fsdp_errf(&c->err, "checkpoint %s has no optimizer state (%s is missing)", c->file, gpath);
        else
            H5OK(c, groups[k] = H5Gopen2(file, gpath, H5P_DEFAULT), gpath);
    }
}

static void check_dataset_shape(ckio *c, const char *label, const fsdp_ckpt_tensor *t, int nd, const hsize_t *dims,
                                H5T_class_t cls) {
    int64_t found[2] = {nd > 0 ? (int64_t)dims[0] : 0, nd > 1 ? (int64_t)dims[1] : 0};
    if (nd != t->ndim || found[0] != t->shape[0] || (nd == 2 && found[1] != t->shape[1])) {
        char want[64], got[64];
        shape_str(want, sizeof want, t->ndim, t->shape);
        shape_str(got, sizeof got, nd, found);
        fsdp_errf(&c->err, "checkpoint %s: tensor %s has shape %s, expected %s", c->file, label, got, want);
    } else if (cls != H5T_FLOAT) {
        fsdp_errf(&c->err, "checkpoint %s: tensor %s is not floating-point", c->file, label);
    }
}

/* Opens the dataset of (t, kind) and checks its shape and type; -1 with c->err set otherwise. */
static hid_t open_dataset(ckio *c, hid_t loc, const fsdp_ckpt_tensor *t, int kind) {
    char label[300];
    snprintf(label, sizeof label, "%s%s%s%s", kind ? "optimizer/" : "", kind ? KIND_GROUP[kind] : "", kind ? "/" : "",
             t->name);
    htri_t has = H5Lexists(loc, t->name, H5P_DEFAULT);
    if (has <= 0) {
        if (has < 0) return h5_failed(c, "H5Lexists", label);
        fsdp_errf(&c->err, "checkpoint %s: tensor %s is missing", c->file, label);
        return -1;
    }
    hid_t dset = -1, space = -1, type = -1;
    hsize_t dims[H5S_MAX_RANK] = {0};
    int nd = -1;
    if (!H5OK(c, dset = H5Dopen2(loc, t->name, H5P_DEFAULT), label) &&
        !H5OK(c, space = H5Dget_space(dset), label) && !H5OK(c, type = H5Dget_type(dset), label) &&
        !H5OK(c, nd = H5Sget_simple_extent_dims(space, dims, NULL), label))
        check_dataset_shape(c, label, t, nd, dims, H5Tget_class(type));
    CLOSE(c, space, H5Sclose, label);
    CLOSE(c, type, H5Tclose, label);
    if (c->err.failed) CLOSE(c, dset, H5Dclose, label);
    return dset;
}

/* Checks every dataset that will be read (and every parameter) before any collective transfer. */
static void check_datasets(ckio *c, const hid_t groups[NUM_KINDS], const fsdp_ckpt_tensor *tensors, int num_tensors,
                           const int *rounds) {
    for (int t = 0; t < num_tensors && !c->err.failed; t++)
        for (int k = 0; k < NUM_KINDS && !c->err.failed; k++) {
            if (k != KIND_PARAM && rounds[t * NUM_KINDS + k] == 0) continue;
            hid_t dset = open_dataset(c, groups[k], &tensors[t], k);
            CLOSE(c, dset, H5Dclose, tensors[t].name);
        }
}

static int read_contents(ckio *c, hid_t file, const fsdp_ckpt_tensor *tensors, int num_tensors,
                         const fsdp_ckpt_piece **by_tensor, const int *rounds) {
    hid_t groups[NUM_KINDS] = {-1, -1, -1};
    open_groups(c, file, rounds, num_tensors, groups);
    if (!c->err.failed) check_datasets(c, groups, tensors, num_tensors, rounds);
    int rc = agree(c);
    for (int t = 0; t < num_tensors && rc == 0; t++)
        for (int k = 0; k < NUM_KINDS && rc == 0; k++) {
            int n = rounds[t * NUM_KINDS + k];
            if (n == 0) continue;
            hid_t dset = open_dataset(c, groups[k], &tensors[t], k);
            rc = agree(c);
            if (rc == 0) rc = transfer_all(c, dset, &tensors[t], by_tensor[t], k, n, 0);
            CLOSE(c, dset, H5Dclose, tensors[t].name);
        }
    for (int k = KIND_EXP_AVG; k < NUM_KINDS; k++) CLOSE(c, groups[k], H5Gclose, KIND_GROUP[k]);
    return rc;
}

int fsdp_ckpt_read(MPI_Comm comm, const char *path, const fsdp_ckpt_tensor *tensors, int num_tensors,
                   fsdp_ckpt_piece *pieces, int num_pieces, fsdp_err *err) {
    ckio c;
    ckio_init(&c, comm, path);
    const fsdp_ckpt_piece **by_tensor =
        fsdp_xcalloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *by_tensor, "checkpoint pieces");
    if (check_tensors(&c, tensors, num_tensors) == 0)
        check_pieces(&c, tensors, num_tensors, pieces, num_pieces, 0, by_tensor);
    hid_t file = -1;
    int rc = agree(&c);
    if (rc == 0) {
        file = open_checkpoint(&c, path);
        rc = file < 0 ? -1 : 0;
    }
    if (rc == 0) {
        int *rounds = plan_rounds(&c, num_tensors, by_tensor);
        rc = read_contents(&c, file, tensors, num_tensors, by_tensor, rounds);
        free(rounds);
        int closed = close_file(&c, &file);
        rc = rc ? rc : closed;
    }
    free(by_tensor);
    return rc ? give_error(&c, err) : 0;
}

static void read_meta_attrs(ckio *c, hid_t file, fsdp_ckpt_meta *meta) {
    int64_t world = 0;
    char *strategy = NULL;
    if (read_int_attr(c, file, "step", 0, &meta->step) ||
        read_int_attr(c, file, "samples_seen", 0, &meta->samples_seen) ||
        read_int_attr(c, file, "seed", 1, &meta->seed) || read_int_attr(c, file, "world_size", 0, &world) ||
        !(strategy = read_string_attr(c, file, "strategy")) ||
        !(meta->config_json = read_string_attr(c, file, "config")) ||
        !(meta->schedule_json = read_string_attr(c, file, "schedule")) ||
        !(meta->run_json = read_string_attr(c, file, "run"))) {
        free(strategy);
        return;
    }
    meta->world_size = (int)world;
    snprintf(meta->strategy, sizeof meta->strategy, "%s", strategy);
    free(strategy);
}

int fsdp_ckpt_read_meta(MPI_Comm comm, const char *path, fsdp_ckpt_meta *meta, fsdp_err *err) {
    ckio c;
    ckio_init(&c, comm, path);
    memset(meta, 0, sizeof *meta);
    hid_t file = open_checkpoint(&c, path);
    if (file < 0) return give_error(&c, err);
    read_meta_attrs(&c, file, meta);
    int rc = agree(&c);
    int closed = close_file(&c, &file);
    if (rc || closed) {
        fsdp_ckpt_meta_free(meta);
        return give_error(&c, err);
    }
    return 0;
}

void fsdp_ckpt_meta_free(fsdp_ckpt_meta *meta) {
    free(meta->config_json);
    free(meta->schedule_json);
    free(meta->run_json);
    meta->config_json = meta->schedule_json = meta->run_json = NULL;
}

/* ---- the checkpoint directory ------------------------------------------------------------------- */

static int join(char *out, size_t cap, const char *dir, const char *name) {
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap ? 0 : -1;
}

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
    return 0;
}

int fsdp_ckpt_find_latest(const char *dir, char *out, int cap, fsdp_err *err) {
    char path[4096], rbuf[1100];
    if (join(path, sizeof path, dir, "latest")) return fsdp_errf(err, "%s: path too long", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        return fsdp_errf(err, "%s: %s", path, strerror(errno));
    }
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

/* The step of a "step-<digits>.h5" name, or -1 for other names (temporary files included). */
static long long step_of(const char *name) {
    if (strncmp(name, "step-", 5)) return -1;
    const char *p = name + 5;
    long long step = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++) step = step * 10 + (*p - '0');
    return digits && !strcmp(p, ".h5") ? step : -1;
}

typedef struct {
    long long step;
    char name[256];
} step_file;

static int by_step(const void *a, const void *b) {
    long long x = ((const step_file *)a)->step, y = ((const step_file *)b)->step;
    return (x > y) - (x < y);
}

/* The step-*.h5 files of dir, oldest first, in a malloc'ed array. */
static int list_steps(const char *dir, step_file **out, int *count, fsdp_err *err) {
    DIR *d = opendir(dir);
    if (!d) return fsdp_errf(err, "%s: %s", dir, strerror(errno));
    int n = 0, cap = 16;
    step_file *files = fsdp_xmalloc((size_t)cap * sizeof *files, "the checkpoint list");
    for (struct dirent *e; (e = readdir(d));) {
        long long step = step_of(e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof files->name) continue;
        if (n == cap) {
            step_file *grown = realloc(files, (size_t)(cap *= 2) * sizeof *files);
            if (!grown) fsdp_fatal("out of host memory listing %s", dir);
            files = grown;
        }
        files[n].step = step;
        snprintf(files[n++].name, sizeof files->name, "%s", e->d_name);
    }
    closedir(d);
    qsort(files, (size_t)n, sizeof *files, by_step);
    *out = files;
    *count = n;
    return 0;
}

int fsdp_ckpt_prune(const char *dir, int keep, fsdp_err *err) {
    if (keep <= 0) return 0;
    step_file *files = NULL;
    int n = 0;
    if (list_steps(dir, &files, &n, err)) return -1;
    /* Never delete what `latest` points at, even if it is not the newest (a resumed older run). */
    char latest[4096] = "";
    fsdp_err ignore = {0};
    if (fsdp_ckpt_find_latest(dir, latest, sizeof latest, &ignore) != 1) latest[0] = 0;
    const char *latest_name = strrchr(latest, '/') ? strrchr(latest, '/') + 1 : "";
    int rc = 0;
    for (int i = 0; i < n - keep && rc == 0; i++) {
        char path[4096];
        if (!strcmp(files[i].name, latest_name)) continue;
        if (join(path, sizeof path, dir, files[i].name) || (unlink(path) != 0 && errno != ENOENT))
            rc = fsdp_errf(err, "%s: cannot delete: %s", path, strerror(errno));
    }
    free(files);
    return rc;
}
