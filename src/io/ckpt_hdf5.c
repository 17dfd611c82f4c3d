/* The HDF5 side of checkpoints (ckpt_internal.h): checked calls that name the call, object, file
 * and rank; attributes; opening a file safely; reading and range-checking the root attributes;
 * describing a dataset's storage; and the bounded collectives every checkpoint module uses. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/agree.h"
#include "../base/files.h"
#include "../base/watchdog.h"
#include "ckpt_checksum.h"
#include "ckpt_internal.h"
#include "jsonio.h"

const char *const FSDP_CKPT_KIND_GROUP[NUM_KINDS] = {NULL, "exp_avg", "exp_avg_sq"};

/* ---- the ranks of one operation ---------------------------------------------------------------- */

void ckio_init(ckio *c, MPI_Comm comm, const char *file) {
    memset(c, 0, sizeof *c);
    c->comm = comm;
    c->file = file;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &c->rank));
    FSDP_CHECK_MPI(MPI_Comm_size(comm, &c->size));
    /* Failures are reported through fsdp_err with the call named; HDF5's own stack dumps would
     * interleave across ranks. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

int ckio_agree(ckio *c) { return fsdp_agree(c->comm, &c->err); }

int ckio_give_error(const ckio *c, fsdp_err *err) {
    if (err) *err = c->err;
    return -1;
}

void ckio_bcast(ckio *c, void *buf, int count, MPI_Datatype type, int root, const char *what) {
    MPI_Request req;
    FSDP_CHECK_MPI(MPI_Ibcast(buf, count, type, root, c->comm, &req));
    fsdp_mpi_wait(&req, what);
}

void ckio_allreduce(ckio *c, void *buf, int count, MPI_Datatype type, MPI_Op op, const char *what) {
    if (count > 0) fsdp_mpi_allreduce(buf, count, type, op, c->comm, what);
}

int ckpt_by_start(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* ---- checked HDF5 calls ---------------------------------------------------------------------------- */

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

int ckh_failed(ckio *c, const char *call, const char *what) {
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

int ckh_check(ckio *c, int64_t rc, const char *expr, const char *what) {
    char name[64];
    return rc < 0 ? ckh_failed(c, call_name(expr, name, sizeof name), what) : 0;
}

void ckh_close(ckio *c, hid_t *id, herr_t (*fn)(hid_t), const char *name, const char *what) {
    if (*id >= 0 && fn(*id) < 0) ckh_failed(c, name, what);
    *id = -1;
}

/* H5Pset_file_locking came with HDF5 1.10.7 and 1.12.1. */
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
#define NO_FILE_LOCKS(c, fapl) H5OK(c, H5Pset_file_locking(fapl, 0, 1), NULL)
#else
#define NO_FILE_LOCKS(c, fapl) 0 /* HDF5_USE_FILE_LOCKING=FALSE does the same */
#endif

hid_t ckh_fapl(ckio *c) {
    hid_t fapl = -1;
    /* Large datasets start on 4 KiB boundaries: whole pages for the kernel, and O_DIRECT-able. */
    if (H5OK(c, fapl = H5Pcreate(H5P_FILE_ACCESS), NULL) || H5OK(c, H5Pset_fapl_sec2(fapl), NULL) ||
        H5OK(c, H5Pset_alignment(fapl, 64 * 1024, 4096), NULL) || NO_FILE_LOCKS(c, fapl))
        CKH_CLOSE(c, fapl, H5Pclose, NULL);
    return fapl;
}

void ckh_label(char *buf, size_t cap, int kind, const char *name) {
    if (kind == KIND_PARAM)
        snprintf(buf, cap, "%s", name);
    else
        snprintf(buf, cap, "optimizer/%s/%s", FSDP_CKPT_KIND_GROUP[kind], name);
}

/* ---- attributes -------------------------------------------------------------------------------------- */

int ckh_write_int_attr(ckio *c, hid_t loc, const char *name, int64_t value, int is_unsigned) {
    hid_t space = -1, attr = -1;
    hid_t ftype = is_unsigned ? H5T_STD_U64LE : H5T_STD_I64LE, mtype = is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
    if (!H5OK(c, space = H5Screate(H5S_SCALAR), name) &&
        !H5OK(c, attr = H5Acreate2(loc, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT), name))
        H5OK(c, H5Awrite(attr, mtype, &value), name);
    CKH_CLOSE(c, attr, H5Aclose, name);
    CKH_CLOSE(c, space, H5Sclose, name);
    return c->err.failed ? -1 : 0;
}

/* Variable-length UTF-8 strings: what h5py reads back as str. */
int ckh_write_string_attr(ckio *c, hid_t loc, const char *name, const char *value) {
    hid_t space = -1, type = -1, attr = -1;
    const char *v = value ? value : "";
    if (!H5OK(c, space = H5Screate(H5S_SCALAR), name) && !H5OK(c, type = H5Tcopy(H5T_C_S1), name) &&
        !H5OK(c, H5Tset_size(type, H5T_VARIABLE), name) && !H5OK(c, H5Tset_cset(type, H5T_CSET_UTF8), name) &&
        !H5OK(c, attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), name))
        H5OK(c, H5Awrite(attr, type, &v), name);
    CKH_CLOSE(c, attr, H5Aclose, name);
    CKH_CLOSE(c, type, H5Tclose, name);
    CKH_CLOSE(c, space, H5Sclose, name);
    return c->err.failed ? -1 : 0;
}

int ckh_has_attr(ckio *c, hid_t loc, const char *name) {
    htri_t has = H5Aexists(loc, name);
    if (has < 0) return ckh_failed(c, "H5Aexists", name);
    return has > 0;
}

/* Opens an attribute, naming a missing one or one of the wrong kind in the message. */
static hid_t open_attr(ckio *c, hid_t loc, const char *name, H5T_class_t want) {
    int has = ckh_has_attr(c, loc, name);
    if (has <= 0) {
        if (has == 0) fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is missing", c->file, name);
        return -1;
    }
    hid_t attr = -1, type = -1, space = -1;
    int bad = H5OK(c, attr = H5Aopen(loc, name, H5P_DEFAULT), name) || H5OK(c, type = H5Aget_type(attr), name) ||
              H5OK(c, space = H5Aget_space(attr), name);
    if (!bad && (H5Tget_class(type) != want || H5Sget_simple_extent_npoints(space) != 1))
        fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is not a single %s", c->file, name,
                  want == H5T_STRING ? "string" : "integer");
    CKH_CLOSE(c, type, H5Tclose, name);
    CKH_CLOSE(c, space, H5Sclose, name);
    if (c->err.failed) CKH_CLOSE(c, attr, H5Aclose, name);
    return attr;
}

static char *read_vlen_string(ckio *c, hid_t attr, hid_t mtype, const char *name) {
    char *s = NULL, *out = NULL;
    if (H5OK(c, H5Tset_size(mtype, H5T_VARIABLE), name) || H5OK(c, H5Aread(attr, mtype, &s), name)) return NULL;
    out = strdup(s ? s : "");
    if (s) H5OK(c, H5free_memory(s), name);
    if (!out) fsdp_fatal("out of host memory reading attribute %s", name);
    return out;
}

static char *read_fixed_string(ckio *c, hid_t attr, hid_t mtype, size_t n, const char *name) {
    char *s = fsdp_xcalloc(n + 1, 1, "a checkpoint attribute");
    if (H5OK(c, H5Tset_size(mtype, n + 1), name) || H5OK(c, H5Tset_strpad(mtype, H5T_STR_NULLTERM), name) ||
        H5OK(c, H5Aread(attr, mtype, s), name)) {
        free(s);
        return NULL;
    }
    return s;
}

/* Variable- or fixed-length (h5py writes either), into a malloc'ed string. */
char *ckh_read_string_attr(ckio *c, hid_t loc, const char *name) {
    hid_t attr = open_attr(c, loc, name, H5T_STRING), ftype = -1, mtype = -1;
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
            ckh_failed(c, "H5Tget_size", name);
        else
            out = read_fixed_string(c, attr, mtype, n, name);
    }
    CKH_CLOSE(c, mtype, H5Tclose, name);
    CKH_CLOSE(c, ftype, H5Tclose, name);
    CKH_CLOSE(c, attr, H5Aclose, name);
    if (c->err.failed) {
        free(out);
        return NULL;
    }
    return out;
}

int ckh_read_int_attr(ckio *c, hid_t loc, const char *name, int is_unsigned, void *out) {
    hid_t attr = open_attr(c, loc, name, H5T_INTEGER);
    if (attr < 0) return -1;
    int rc = H5OK(c, H5Aread(attr, is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, out), name);
    CKH_CLOSE(c, attr, H5Aclose, name);
    return rc ? -1 : 0;
}

/* ---- opening ------------------------------------------------------------------------------------------ */

/* HDF5's superblock signature, at offset 0 or 512, 1024, 2048, ... (the HDF5 file format). */
static int has_hdf5_signature(int fd, off_t size) {
    static const unsigned char SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (off_t at = 0; at + 8 <= size; at = at ? 2 * at : 512) {
        unsigned char got[8];
        if (pread(fd, got, 8, at) != 8) return 0;
        if (!memcmp(got, SIG, 8)) return 1;
    }
    return 0;
}

/* Looks at the path before HDF5 does, so that a missing, special or foreign file gets a plain
 * message, and a FIFO never blocks the open: the probe opens it through fsdp_open_regular (never
 * blocking, refusing anything but a regular file) and reads the signature itself, where
 * H5Fis_hdf5 would open whatever the path names. */
static void probe_file(ckio *c, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            fsdp_errf(&c->err, "checkpoint %s: no such file", path);
        else
            fsdp_errf(&c->err, "checkpoint %s: %s", path, strerror(errno));
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        fsdp_errf(&c->err, "checkpoint %s is a directory, not a file", path);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        fsdp_errf(&c->err, "checkpoint %s is %s, not a regular file", path, fsdp_file_type_name(st.st_mode));
        return;
    }
    int fd = fsdp_open_regular(path, O_RDONLY, 0, "checkpoint", &c->err);
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || !has_hdf5_signature(fd, st.st_size))
        fsdp_errf(&c->err, "checkpoint %s is truncated or not an HDF5 file", path);
    close(fd);
}

static void check_format(ckio *c, hid_t file, const char *path, int64_t *version) {
    int has = ckh_has_attr(c, file, "format");
    if (has < 0) return;
    char *format = has ? ckh_read_string_attr(c, file, "format") : NULL;
    if (!c->err.failed && (!format || strcmp(format, FSDP_CKPT_FORMAT)))
        fsdp_errf(&c->err, "%s is not an fsdp.c checkpoint", path);
    free(format);
    if (c->err.failed || ckh_read_int_attr(c, file, "format_version", 0, version)) return;
    if (*version > FSDP_CKPT_FORMAT_VERSION)
        fsdp_errf(&c->err, "checkpoint %s has format version %lld; this build of fsdp.c reads up to version %d",
                  path, (long long)*version, FSDP_CKPT_FORMAT_VERSION);
    else if (*version < 1)
        fsdp_errf(&c->err, "checkpoint %s has an invalid format version %lld", path, (long long)*version);
}

hid_t ckh_open(ckio *c, const char *path, int64_t *version) {
    probe_file(c, path);
    if (c->err.failed) return -1;
    hid_t fapl = ckh_fapl(c), file = -1;
    if (fapl < 0) return -1;
    file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (file < 0) {
        char detail[400];
        hdf5_detail(detail, sizeof detail);
        fsdp_errf(&c->err, "checkpoint %s is truncated or not an HDF5 file%s%s%s", path, detail[0] ? " (" : "", detail,
                  detail[0] ? ")" : "");
    }
    CKH_CLOSE(c, fapl, H5Pclose, NULL);
    if (file >= 0) check_format(c, file, path, version);
    if (c->err.failed) CKH_CLOSE(c, file, H5Fclose, NULL);
    return file;
}

/* ---- the root attributes --------------------------------------------------------------------------- */

static const char *const STRATEGIES[] = {"FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID", NULL};

/* A JSON object, or -1 with a message naming the attribute. */
static json_t *json_attr(ckio *c, const char *name, const char *text) {
    fsdp_err jerr = {0};
    if (!text) text = "";
    json_t *v = fsdp_json_load_text(text, strlen(text), name, &jerr);
    if (!v || !json_is_object(v)) {
        fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is not a JSON object%s%s", c->file, name, v ? "" : " (",
                  v ? "" : jerr.msg);
        if (!v) strncat(c->err.msg, ")", sizeof c->err.msg - strlen(c->err.msg) - 1);
        json_decref(v);
        return NULL;
    }
    return v;
}

/* The schedule record must hold every field a resumed run needs, each of the right kind. */
static void check_schedule(ckio *c, const fsdp_ckpt_meta *m) {
    json_t *s = json_attr(c, "schedule", m->schedule_json);
    if (!s) return;
    static const char *const reals[] = {"lr", "min_lr", "last_lr"}, *const ints[] = {"warmup", "total_steps"};
    json_t *type = json_object_get(s, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "warmup_cosine"))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'schedule' has no \"type\": \"warmup_cosine\"", c->file);
    for (int i = 0; i < 3 && !c->err.failed; i++) {
        json_t *v = json_object_get(s, reals[i]);
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
            fsdp_errf(&c->err, "checkpoint %s: attribute 'schedule' lacks a non-negative number \"%s\"", c->file,
                      reals[i]);
    }
    for (int i = 0; i < 2 && !c->err.failed; i++) {
        json_t *v = json_object_get(s, ints[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            fsdp_errf(&c->err, "checkpoint %s: attribute 'schedule' lacks a step count \"%s\"", c->file, ints[i]);
    }
    if (!c->err.failed && m->step > json_integer_value(json_object_get(s, "total_steps")))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'step' (%lld) is beyond the schedule's total_steps (%lld)",
                  c->file, (long long)m->step, (long long)json_integer_value(json_object_get(s, "total_steps")));
    json_decref(s);
}

/* The form of the identity record (docs/FORMATS.md); what its values mean is the trainer's. */
static void check_identity(ckio *c, const char *text) {
    json_t *v = json_attr(c, "identity", text);
    if (!v) return;
    json_t *data = json_object_get(v, "data"), *vocab = json_object_get(data, "vocab_size");
    const char *source = json_string_value(json_object_get(data, "source"));
    const char *hash = json_string_value(json_object_get(data, "tokenizer_hash"));
    size_t hex = hash ? strspn(hash, "0123456789abcdef") : 0;
    if (!json_is_object(data) || !json_is_object(json_object_get(v, "config")))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'identity' lacks the objects \"data\" and \"config\"", c->file);
    else if (!source || (strcmp(source, "synthetic") && strcmp(source, "token file")))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'identity': data.source must be \"synthetic\" or \"token file\"",
                  c->file);
    else if (!json_is_integer(vocab) || json_integer_value(vocab) < 1)
        fsdp_errf(&c->err, "checkpoint %s: attribute 'identity': data.vocab_size must be a positive integer", c->file);
    else if (!strcmp(source, "token file") && (hex != 16 || hash[hex]))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'identity': data.tokenizer_hash must be 16 hexadecimal digits",
                  c->file);
    json_decref(v);
}

static void check_meta(ckio *c, const fsdp_ckpt_meta *m, int64_t world) {
    if (m->step < 0 || m->step > INT32_MAX)
        fsdp_errf(&c->err, "checkpoint %s: attribute 'step' is %lld (must be 0 to %d)", c->file, (long long)m->step,
                  INT32_MAX);
    else if (m->samples_seen < 0)
        fsdp_errf(&c->err, "checkpoint %s: attribute 'samples_seen' is %lld (must not be negative)", c->file,
                  (long long)m->samples_seen);
    else if (m->samples_seen < m->step || (m->step == 0) != (m->samples_seen == 0))
        fsdp_errf(&c->err,
                  "checkpoint %s: attributes 'step' (%lld) and 'samples_seen' (%lld) disagree (every step consumes "
                  "at least one sample)",
                  c->file, (long long)m->step, (long long)m->samples_seen);
    else if (world < 1 || world > (1 << 24))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'world_size' is %lld", c->file, (long long)world);
    if (c->err.failed) return;
    int known = 0;
    for (int i = 0; STRATEGIES[i]; i++) known |= !strcmp(m->strategy, STRATEGIES[i]);
    if (!known) {
        fsdp_errf(&c->err, "checkpoint %s: attribute 'strategy' is '%s', not a sharding strategy", c->file,
                  m->strategy);
        return;
    }
    json_t *v = json_attr(c, "config", m->config_json);
    json_decref(v);
    if (v) v = json_attr(c, "run", m->run_json);
    json_decref(v);
    if (v) check_schedule(c, m);
    if (!c->err.failed && m->identity_json) check_identity(c, m->identity_json);
}

int ckh_check_meta(ckio *c, const fsdp_ckpt_meta *m) {
    check_meta(c, m, m->world_size);
    return c->err.failed ? -1 : 0;
}

uint64_t ckh_meta_checksum(const fsdp_ckpt_meta *m, int64_t version) {
    char head[512];
    int n = snprintf(head, sizeof head, "format_version=%lld\nstep=%lld\nsamples_seen=%lld\nseed=%llu\nworld_size=%d\nstrategy=%s\n",
                     (long long)version, (long long)m->step, (long long)m->samples_seen, (unsigned long long)m->seed,
                     m->world_size, m->strategy);
    uint64_t h = fsdp_cksum_bytes(0, head, (size_t)n);
    const char *names[3] = {"config", "schedule", "run"}, *texts[3] = {m->config_json, m->schedule_json, m->run_json};
    for (int i = 0; i < 3; i++) {
        const char *t = texts[i] ? texts[i] : "";
        n = snprintf(head, sizeof head, "%s=%zu:", names[i], strlen(t));
        h = fsdp_cksum_bytes(h, head, (size_t)n);
        h = fsdp_cksum_bytes(h, t, strlen(t));
    }
    return h;
}

uint64_t ckh_identity_checksum(const char *identity, uint64_t attributes_checksum) {
    char head[64];
    size_t len = strlen(identity);
    int n = snprintf(head, sizeof head, "identity=%zu:", len);
    return fsdp_cksum_bytes(fsdp_cksum_bytes(attributes_checksum, head, (size_t)n), identity, len);
}

/* 'identity' and 'identity_checksum' come as a pair, or not at all (files written before them). */
static void read_identity(ckio *c, hid_t file, uint64_t attributes_checksum, fsdp_ckpt_meta *m) {
    int has = ckh_has_attr(c, file, "identity");
    int has_sum = has < 0 ? -1 : ckh_has_attr(c, file, "identity_checksum");
    uint64_t stored = 0;
    if (has < 0 || has_sum < 0 || (!has && !has_sum)) return;
    if (has != has_sum)
        fsdp_errf(&c->err, "checkpoint %s: attribute '%s' is missing while '%s' is present: changed after the file "
                  "was written", c->file, has ? "identity_checksum" : "identity", has ? "identity" : "identity_checksum");
    else if ((m->identity_json = ckh_read_string_attr(c, file, "identity")) &&
             ckh_read_int_attr(c, file, "identity_checksum", 1, &stored) == 0) {
        if (stored != ckh_identity_checksum(m->identity_json, attributes_checksum))
            fsdp_errf(&c->err, "checkpoint %s: attribute 'identity' does not match 'identity_checksum': changed after "
                      "the file was written", c->file);
        else
            check_identity(c, m->identity_json);
    }
}

int ckh_read_meta(ckio *c, hid_t file, int64_t version, fsdp_ckpt_meta *m) {
    int64_t world = 0;
    char *strategy = NULL;
    memset(m, 0, sizeof *m);
    if (ckh_read_int_attr(c, file, "step", 0, &m->step) || ckh_read_int_attr(c, file, "samples_seen", 0, &m->samples_seen) ||
        ckh_read_int_attr(c, file, "seed", 1, &m->seed) || ckh_read_int_attr(c, file, "world_size", 0, &world) ||
        !(strategy = ckh_read_string_attr(c, file, "strategy")) ||
        !(m->config_json = ckh_read_string_attr(c, file, "config")) ||
        !(m->schedule_json = ckh_read_string_attr(c, file, "schedule")) ||
        !(m->run_json = ckh_read_string_attr(c, file, "run"))) {
        free(strategy);
        return -1;
    }
    m->world_size = world > 0 && world <= (1 << 24) ? (int)world : 0;
    snprintf(m->strategy, sizeof m->strategy, "%s", strategy);
    if (strlen(strategy) >= sizeof m->strategy) m->strategy[0] = 0;
    free(strategy);
    check_meta(c, m, world);
    if (c->err.failed || version < 2) return c->err.failed ? -1 : 0;
    char *algorithm = ckh_read_string_attr(c, file, "checksum_algorithm");
    uint64_t stored = 0;
    if (algorithm && strcmp(algorithm, FSDP_CKSUM_ALGORITHM))
        fsdp_errf(&c->err, "checkpoint %s: attribute 'checksum_algorithm' is '%s'; this build knows '%s'", c->file,
                  algorithm, FSDP_CKSUM_ALGORITHM);
    free(algorithm);
    if (!c->err.failed && ckh_read_int_attr(c, file, "attributes_checksum", 1, &stored) == 0 &&
        stored != ckh_meta_checksum(m, version))
        fsdp_errf(&c->err,
                  "checkpoint %s: its root attributes (step, samples_seen, seed, config, schedule, run, world_size, "
                  "strategy) do not match 'attributes_checksum': changed after the file was written",
                  c->file);
    if (!c->err.failed) read_identity(c, file, stored, m);
    return c->err.failed ? -1 : 0;
}

/* ---- datasets ---------------------------------------------------------------------------------------- */

int ckh_describe(ckio *c, hid_t loc, const char *label, const char *name, ckpt_dset *d) {
    memset(d, 0, sizeof *d);
    d->offset = -1;
    htri_t has = H5Lexists(loc, name, H5P_DEFAULT);
    if (has < 0) return ckh_failed(c, "H5Lexists", label);
    if (!has) return 0;
    hid_t dset = -1, space = -1, type = -1, dcpl = -1;
    hsize_t dims[H5S_MAX_RANK] = {0};
    int nd = -1;
    if (H5OK(c, dset = H5Dopen2(loc, name, H5P_DEFAULT), label) || H5OK(c, space = H5Dget_space(dset), label) ||
        H5OK(c, type = H5Dget_type(dset), label) || H5OK(c, dcpl = H5Dget_create_plist(dset), label) ||
        H5OK(c, nd = H5Sget_simple_extent_dims(space, dims, NULL), label))
        goto done;
    d->exists = 1;
    d->ndim = nd;
    d->dims[0] = nd > 0 ? (int64_t)dims[0] : 0;
    d->dims[1] = nd > 1 ? (int64_t)dims[1] : 0;
    d->is_float = H5Tget_class(type) == H5T_FLOAT;
    int64_t numel = nd == 1 ? d->dims[0] : nd == 2 ? d->dims[0] * d->dims[1] : -1;
    /* Direct reads need what fsdp.c writes: contiguous, allocated, little-endian float32. */
    if (d->is_float && H5Tget_size(type) == 4 && H5Tget_order(type) == H5T_ORDER_LE &&
        H5Pget_layout(dcpl) == H5D_CONTIGUOUS && numel >= 0 && H5Dget_storage_size(dset) == (hsize_t)numel * 4) {
        haddr_t at = H5Dget_offset(dset);
        if (at != HADDR_UNDEF) d->offset = (int64_t)at;
    }
    H5Eclear2(H5E_DEFAULT);
    int has_sum = ckh_has_attr(c, dset, "checksum");
    if (has_sum > 0 && ckh_read_int_attr(c, dset, "checksum", 1, &d->checksum) == 0) d->has_checksum = 1;
done:
    CKH_CLOSE(c, dcpl, H5Pclose, label);
    CKH_CLOSE(c, type, H5Tclose, label);
    CKH_CLOSE(c, space, H5Sclose, label);
    CKH_CLOSE(c, dset, H5Dclose, label);
    return c->err.failed ? -1 : 0;
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

int ckh_read_range(ckio *c, hid_t dset, const fsdp_ckpt_tensor *t, int64_t start, int64_t n, float *out) {
    if (n <= 0) return 0;
    hid_t fspace = -1, mspace = -1;
    hsize_t mdim = (hsize_t)n;
    if (!H5OK(c, fspace = H5Dget_space(dset), t->name) && !select_range(c, fspace, t, start, n) &&
        !H5OK(c, mspace = H5Screate_simple(1, &mdim, NULL), t->name))
        H5OK(c, H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out), t->name);
    CKH_CLOSE(c, mspace, H5Sclose, t->name);
    CKH_CLOSE(c, fspace, H5Sclose, t->name);
    return c->err.failed ? -1 : 0;
}
