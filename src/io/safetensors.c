/* The safetensors reader of safetensors.h: the framing and header checks of each file, the index of
 * a sharded model, and positioned reads with conversion to fp32. */
#define _GNU_SOURCE /* O_DIRECT */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"
#include "jsonio.h"
#include "safetensors_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian; this reader assumes a little-endian host"
#endif

static const struct {
    const char *name;
    int bits;
} DTYPES[FSDP_ST_NUM_DTYPES] = {
    [FSDP_ST_BOOL] = {"BOOL", 8},       [FSDP_ST_U8] = {"U8", 8},           [FSDP_ST_I8] = {"I8", 8},
    [FSDP_ST_I16] = {"I16", 16},        [FSDP_ST_U16] = {"U16", 16},        [FSDP_ST_I32] = {"I32", 32},
    [FSDP_ST_U32] = {"U32", 32},        [FSDP_ST_I64] = {"I64", 64},        [FSDP_ST_U64] = {"U64", 64},
    [FSDP_ST_F16] = {"F16", 16},        [FSDP_ST_BF16] = {"BF16", 16},      [FSDP_ST_F32] = {"F32", 32},
    [FSDP_ST_F64] = {"F64", 64},        [FSDP_ST_C64] = {"C64", 64},        [FSDP_ST_F8_E5M2] = {"F8_E5M2", 8},
    [FSDP_ST_F8_E4M3] = {"F8_E4M3", 8}, [FSDP_ST_F8_E8M0] = {"F8_E8M0", 8}, [FSDP_ST_F6_E2M3] = {"F6_E2M3", 6},
    [FSDP_ST_F6_E3M2] = {"F6_E3M2", 6}, [FSDP_ST_F4] = {"F4", 4},
};

const char *fsdp_st_dtype_name(fsdp_st_dtype t) { return DTYPES[t].name; }
int fsdp_st_dtype_bits(fsdp_st_dtype t) { return DTYPES[t].bits; }
int fsdp_st_dtype_readable(fsdp_st_dtype t) { return t == FSDP_ST_BF16 || t == FSDP_ST_F16 || t == FSDP_ST_F32; }

static int dtype_from_name(const char *s, fsdp_st_dtype *out) {
    for (int i = 0; i < FSDP_ST_NUM_DTYPES; i++)
        if (!strcmp(s, DTYPES[i].name)) return *out = (fsdp_st_dtype)i, 0;
    return -1;
}

char *fsdp_st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = fsdp_xmalloc(n, "a name");
    memcpy(p, s, n);
    return p;
}

int fsdp_st_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return errno = 0, -1; /* end of file: errno 0 says "short" */
        done += (size_t)r;
    }
    return 0;
}

int fsdp_st_open_regular(const char *path, int *fd_out, uint64_t *size_out, fsdp_err *err) {
    int fd = fsdp_open_regular(path, O_RDONLY, 0, NULL, err);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fsdp_errf(err, "%s: fstat: %s", path, strerror(e));
    }
    *fd_out = fd;
    *size_out = (uint64_t)st.st_size;
    return 0;
}

/* ---- one file's header ---- */

/* Tensors of one file while it is being checked. */
typedef struct {
    fsdp_st_tensor *items;
    int count, cap;
} tensor_list;

static void push(tensor_list *l, const fsdp_st_tensor *t) {
    FSDP_GROW(l->items, l->count, l->cap, 64, "the safetensors headers");
    l->items[l->count++] = *t;
}

/* A non-negative JSON integer. */
static int get_count(const json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int parse_metadata(const char *path, const json_t *meta, fsdp_err *err) {
    if (!json_is_object(meta)) return fsdp_errf(err, "%s: malformed header: __metadata__ is not an object", path);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)meta, key, v) {
        if (!json_is_string(v))
            return fsdp_errf(err, "%s: malformed header: __metadata__ value \"%s\" is not a string", path, key);
    }
    return 0;
}

/* One entry {"dtype", "shape", "data_offsets"}; offsets become absolute file offsets. */
static int parse_entry(const char *path, const char *name, const json_t *v, uint64_t data_start, fsdp_st_tensor *t,
                       fsdp_err *err) {
    memset(t, 0, sizeof *t);
    if (!json_is_object(v)) return fsdp_errf(err, "%s: malformed header: tensor %s is not an object", path, name);
    const json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    const json_t *offsets = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype))
        return fsdp_errf(err, "%s: malformed header: tensor %s: dtype is %s", path, name,
                         dtype ? "not a string" : "missing");
    if (dtype_from_name(json_string_value(dtype), &t->dtype))
        return fsdp_errf(err, "%s: malformed header: tensor %s: unknown dtype \"%s\"", path, name,
                         json_string_value(dtype));
    if (!json_is_array(shape))
        return fsdp_errf(err, "%s: malformed header: tensor %s: shape is %s", path, name,
                         shape ? "not an array" : "missing");
    if (json_array_size(shape) > FSDP_ST_MAX_DIMS)
        return fsdp_errf(err, "%s: tensor %s has %zu dimensions (fsdp.c reads at most %d)", path, name,
                         json_array_size(shape), FSDP_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (get_count(json_array_get(shape, (size_t)d), &t->shape[d]))
            return fsdp_errf(err, "%s: malformed header: tensor %s: shape entries must be non-negative integers",
                             path, name);
        if (__builtin_mul_overflow(numel, t->shape[d], &numel))
            return fsdp_errf(err, "%s: malformed header: tensor %s: the shape's size overflows", path, name);
    }
    int64_t begin, end;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || get_count(json_array_get(offsets, 0), &begin) ||
        get_count(json_array_get(offsets, 1), &end))
        return fsdp_errf(err, "%s: malformed header: tensor %s: data_offsets must be two non-negative integers", path,
                         name);
    if (begin > end)
        return fsdp_errf(err, "%s: malformed header: tensor %s: data_offsets [%lld, %lld] end before they begin",
                         path, name, (long long)begin, (long long)end);
    uint64_t bits;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)DTYPES[t->dtype].bits, &bits) || bits % 8)
        return fsdp_errf(err, "%s: malformed header: tensor %s: %lld elements of %s are not a whole number of bytes",
                         path, name, (long long)numel, DTYPES[t->dtype].name);
    if ((uint64_t)(end - begin) != bits / 8)
        return fsdp_errf(err,
                         "%s: tensor %s: data_offsets [%lld, %lld] hold %lld bytes but shape and dtype %s need %llu",
                         path, name, (long long)begin, (long long)end, (long long)(end - begin), DTYPES[t->dtype].name,
                         (unsigned long long)(bits / 8));
    t->numel = numel;
    t->nbytes = bits / 8;
    t->offset = data_start + (uint64_t)begin;
    t->name = fsdp_st_strdup(name);
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const fsdp_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The data of a file must be covered exactly: tensors back to back from the end of the header to
 * the end of the file, as the reference implementation requires. */
static int check_coverage(const char *path, tensor_list *l, uint64_t data_start, uint64_t file_size, fsdp_err *err) {
    uint64_t at = data_start, data_len = file_size - data_start;
    for (int i = 0; i < l->count; i++) {
        const fsdp_st_tensor *t = &l->items[i];
        unsigned long long b = t->offset - data_start, e = b + t->nbytes;
        if (t->offset + t->nbytes > file_size)
            return fsdp_errf(err,
                             "%s: tensor %s: data_offsets [%llu, %llu] reach past the end of the data (%llu bytes): "
                             "the file is truncated or the header is wrong",
                             path, t->name, b, e, (unsigned long long)data_len);
    }
    qsort(l->items, (size_t)l->count, sizeof *l->items, by_offset);
    for (int i = 0; i < l->count; i++) {
        const fsdp_st_tensor *t = &l->items[i];
        unsigned long long b = t->offset - data_start, e = b + t->nbytes;
        if (t->offset < at)
            return fsdp_errf(err, "%s: tensor %s: data_offsets [%llu, %llu] overlap the previous tensor's data", path,
                             t->name, b, e);
        if (t->offset > at)
            return fsdp_errf(err, "%s: tensor %s: data_offsets [%llu, %llu] leave a hole after byte %llu of the data",
                             path, t->name, b, e, (unsigned long long)(at - data_start));
        at = t->offset + t->nbytes;
    }
    if (at != file_size)
        return fsdp_errf(err, "%s: %llu bytes after the last tensor's data (the header describes %llu bytes of data)",
                         path, (unsigned long long)(file_size - at), (unsigned long long)(at - data_start));
    return 0;
}

static int parse_file(const char *path, int fd, uint64_t size, int file_index, fsdp_st_tensor **out, int *count,
                       fsdp_err *err) {
    unsigned char len8[8];
    *out = NULL;
    *count = 0;
    if (size < 8) return fsdp_errf(err, "%s: %llu bytes: too short for a safetensors file", path, (unsigned long long)size);
    if (fsdp_st_pread_full(fd, len8, 8, 0))
        return fsdp_errf(err, "%s: cannot read the header length: %s", path, errno ? strerror(errno) : "short read");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
    if (n > FSDP_ST_MAX_HEADER)
        return fsdp_errf(err, "%s: header length %llu exceeds the format's limit of %llu bytes", path,
                         (unsigned long long)n, FSDP_ST_MAX_HEADER);
    if (8 + n > size)
        return fsdp_errf(err, "%s: header length %llu reaches past the end of the file (%llu bytes)", path,
                         (unsigned long long)n, (unsigned long long)size);
    char *text = fsdp_xmalloc((size_t)n + 1, "a safetensors header");
    if (fsdp_st_pread_full(fd, text, (size_t)n, 8)) {
        free(text);
        return fsdp_errf(err, "%s: cannot read the header: %s", path, errno ? strerror(errno) : "short read");
    }
    text[n] = 0;
    if (n == 0 || text[0] != '{') {
        free(text);
        return fsdp_errf(err, "%s: malformed header: it does not begin with '{'", path);
    }
    char origin[4200];
    snprintf(origin, sizeof origin, "%s: header", path);
    json_t *root = fsdp_json_load_text(text, (size_t)n, origin, err);
    free(text);
    if (!root) return -1;
    tensor_list l = {0};
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        fsdp_st_tensor t;
        if (!strcmp(key, "__metadata__")) {
            rc = parse_metadata(path, v, err);
        } else {
            rc = parse_entry(path, key, v, 8 + n, &t, err);
            if (rc == 0) {
                t.file = file_index;
                push(&l, &t);
            }
        }
        if (rc) break;
    }
    json_decref(root);
    if (rc == 0) rc = check_coverage(path, &l, 8 + n, size, err);
    if (rc) {
        for (int i = 0; i < l.count; i++) free(l.items[i].name);
        free(l.items);
        return -1;
    }
    *out = l.items;
    *count = l.count;
    return 0;
}

/* ---- the set ---- */

static int by_name(const void *a, const void *b) {
    return strcmp(((const fsdp_st_tensor *)a)->name, ((const fsdp_st_tensor *)b)->name);
}

void fsdp_st_close(fsdp_st_set *s) {
    for (int i = 0; i < s->num_files; i++) {
        if (s->files[i].fd >= 0) close(s->files[i].fd);
        if (s->files[i].direct_fd >= 0) close(s->files[i].direct_fd);
        free(s->files[i].path);
    }
    for (int i = 0; i < s->num_tensors; i++) free(s->tensors[i].name);
    free(s->files);
    free(s->tensors);
    free(s->origin);
    memset(s, 0, sizeof *s);
}

int fsdp_st_add_file(fsdp_st_set *s, const char *path, fsdp_err *err) {
    int fd;
    uint64_t size;
    if (fsdp_st_open_regular(path, &fd, &size, err)) return -1;
    s->files = realloc(s->files, (size_t)(s->num_files + 1) * sizeof *s->files);
    if (!s->files) fsdp_fatal("out of host memory opening safetensors files");
    fsdp_st_file *f = &s->files[s->num_files++];
    f->path = fsdp_st_strdup(path);
    f->fd = fd;
    f->direct_fd = -1;
    f->size = size;
    fsdp_st_tensor *items;
    int count;
    if (parse_file(path, fd, size, s->num_files - 1, &items, &count, err)) return -1;
    s->tensors = realloc(s->tensors, (size_t)(s->num_tensors + count + 1) * sizeof *s->tensors);
    if (!s->tensors) fsdp_fatal("out of host memory opening safetensors files");
    memcpy(s->tensors + s->num_tensors, items, (size_t)count * sizeof *items);
    s->num_tensors += count;
    free(items);
    return 0;
}

void fsdp_st_sort(fsdp_st_set *s) { qsort(s->tensors, (size_t)s->num_tensors, sizeof *s->tensors, by_name); }

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

int fsdp_st_open(const char *path, fsdp_st_set *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    out->origin = fsdp_st_strdup(path);
    int rc = ends_with(path, ".json") ? fsdp_st_open_index(out, path, err) : fsdp_st_add_file(out, path, err);
    if (rc == 0) {
        fsdp_st_sort(out);
        for (int i = 0; i + 1 < out->num_tensors && rc == 0; i++)
            if (!strcmp(out->tensors[i].name, out->tensors[i + 1].name))
                rc = fsdp_errf(err, "%s: tensor %s is in two files: %s and %s", path, out->tensors[i].name,
                               fsdp_st_path(out, &out->tensors[i]), fsdp_st_path(out, &out->tensors[i + 1]));
    }
    if (rc) fsdp_st_close(out);
    return rc;
}

int fsdp_st_find_weights(const char *dir, char *out, int cap) {
    static const char *const NAMES[] = {"model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (snprintf(out, (size_t)cap, "%s/%s", dir, NAMES[i]) >= cap) return 0;
        if (lstat(out, &st) == 0) return 1; /* whatever it is: opening it says what is wrong */
    }
    return 0;
}

const fsdp_st_tensor *fsdp_st_find(const fsdp_st_set *s, const char *name) {
    fsdp_st_tensor key;
    key.name = (char *)name;
    return bsearch(&key, s->tensors, (size_t)s->num_tensors, sizeof key, by_name);
}

/* ---- expectations ---- */

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int by_expect_name(const void *a, const void *b) {
    return strcmp(((const fsdp_st_expect *)a)->file_name, ((const fsdp_st_expect *)b)->file_name);
}

int fsdp_st_check(const fsdp_st_set *s, const fsdp_st_expect *want, int num_want, const char *const *ignored_suffixes,
                  fsdp_err *err) {
    fsdp_st_expect *sorted = fsdp_xmalloc((size_t)(num_want + 1) * sizeof *sorted, "expected tensors");
    memcpy(sorted, want, (size_t)num_want * sizeof *want);
    qsort(sorted, (size_t)num_want, sizeof *sorted, by_expect_name);
    int rc = 0;
    for (int i = 0; i < num_want && rc == 0; i++) {
        const fsdp_st_expect *w = &sorted[i];
        const fsdp_st_tensor *t = fsdp_st_find(s, w->file_name);
        char have[160], need[160];
        shape_text(need, sizeof need, w->ndim, w->shape);
        if (!t) {
            if (!w->optional) rc = fsdp_errf(err, "%s: tensor %s %s is missing", s->origin, w->file_name, need);
            continue;
        }
        shape_text(have, sizeof have, t->ndim, t->shape);
        if (t->ndim != w->ndim || memcmp(t->shape, w->shape, (size_t)w->ndim * sizeof *w->shape))
            rc = fsdp_errf(err, "%s: tensor %s has shape %s; the model in config.json needs %s", fsdp_st_path(s, t),
                           t->name, have, need);
        else if (!fsdp_st_dtype_readable(t->dtype))
            rc = fsdp_errf(err, "%s: tensor %s has dtype %s; fsdp.c reads BF16, F16 and F32", fsdp_st_path(s, t),
                           t->name, fsdp_st_dtype_name(t->dtype));
    }
    for (int i = 0; i < s->num_tensors && rc == 0; i++) {
        const fsdp_st_tensor *t = &s->tensors[i];
        fsdp_st_expect key;
        key.file_name = t->name;
        if (bsearch(&key, sorted, (size_t)num_want, sizeof key, by_expect_name)) continue;
        int ignored = 0;
        for (const char *const *suffix = ignored_suffixes; suffix && *suffix; suffix++) ignored |= ends_with(t->name, *suffix);
        if (!ignored)
            rc = fsdp_errf(err, "%s: unexpected tensor %s (the model in config.json has no such parameter)",
                           fsdp_st_path(s, t), t->name);
    }
    free(sorted);
    return rc;
}

/* ---- reading elements ---- */

float fsdp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13); /* infinity or NaN (payload kept) */
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Elements per positioned read of fsdp_st_read_f32: large enough for full disk bandwidth, small
 * enough to spread a tensor over threads. */
#define READ_CHUNK_ELEMS (4 << 20)

/* Elements are loaded with memcpy: a tensor's bytes need not be aligned in the file (nothing in the
 * format makes them so), and an O_DIRECT read hands them over at their offset inside whole blocks. */
void fsdp_st_convert_f32(fsdp_st_dtype dtype, const void *raw, int64_t n, float *out) {
    const unsigned char *in = raw;
    if (dtype == FSDP_ST_F32) {
        memcpy(out, raw, (size_t)n * 4);
        return;
    }
    uint16_t h;
    if (dtype == FSDP_ST_BF16)
        for (int64_t i = 0; i < n; i++) {
            memcpy(&h, in + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(&out[i], &u, 4);
        }
    else
        for (int64_t i = 0; i < n; i++) {
            memcpy(&h, in + 2 * i, 2);
            out[i] = fsdp_f16_to_f32(h);
        }
}

int fsdp_st_read_raw(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, void *out,
                     fsdp_err *err) {
    const char *path = fsdp_st_path(s, t);
    if (start < 0 || count < 0 || start + count > t->numel)
        return fsdp_errf(err, "%s: tensor %s: elements [%lld, %lld) are outside its %lld", path, t->name,
                         (long long)start, (long long)(start + count), (long long)t->numel);
    size_t es = (size_t)fsdp_st_dtype_bits(t->dtype) / 8;
    if (fsdp_st_pread_full(s->files[t->file].fd, out, (size_t)count * es, t->offset + (uint64_t)start * es))
        return fsdp_errf(err, "%s: tensor %s: reading element %lld failed: %s", path, t->name, (long long)start,
                         errno ? strerror(errno) : "the file ended early");
    return 0;
}

void fsdp_st_open_direct(fsdp_st_set *s) {
    for (int i = 0; i < s->num_files; i++)
        if (s->files[i].direct_fd < 0) {
            /* -1 where O_DIRECT is unsupported (tmpfs): the buffered descriptor serves. Through
             * fsdp_open_regular, so a path replaced by a FIFO since the first open cannot block. */
            fsdp_err ignored = {0};
            s->files[i].direct_fd = fsdp_open_regular(s->files[i].path, O_RDONLY | O_DIRECT, 0, NULL, &ignored);
        }
}

size_t fsdp_st_aligned_cap(size_t bytes) { return bytes + 2 * FSDP_ST_DIRECT_ALIGN; }

/* The blocks [a0, a0 + len) through O_DIRECT, until `need` bytes are in (the last block may pass the
 * end of the file, where the kernel reads short). 0, or -1 with errno (EINVAL: the kernel refused
 * the alignment; 0: the file ended before `need`). */
static int pread_direct(int fd, char *buf, uint64_t a0, size_t len, size_t need) {
    size_t done = 0;
    while (done < need) {
        ssize_t r = pread(fd, buf + done, len - done, (off_t)(a0 + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return errno = 0, -1;
        done += (size_t)r;
        /* a short read that is not at a block boundary cannot be continued with O_DIRECT */
        if (done < need && done % FSDP_ST_DIRECT_ALIGN) return errno = EINVAL, -1;
    }
    return 0;
}

int fsdp_st_read_raw_aligned(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, void *buf,
                             const void **data, fsdp_err *err) {
    const fsdp_st_file *f = &s->files[t->file];
    size_t es = (size_t)fsdp_st_dtype_bits(t->dtype) / 8;
    if (f->direct_fd >= 0 && start >= 0 && count >= 0 && start + count <= t->numel) {
        uint64_t begin = t->offset + (uint64_t)start * es, end = begin + (uint64_t)count * es;
        uint64_t a0 = begin / FSDP_ST_DIRECT_ALIGN * FSDP_ST_DIRECT_ALIGN;
        uint64_t a1 = (end + FSDP_ST_DIRECT_ALIGN - 1) / FSDP_ST_DIRECT_ALIGN * FSDP_ST_DIRECT_ALIGN;
        if (pread_direct(f->direct_fd, buf, a0, (size_t)(a1 - a0), (size_t)(end - a0)) == 0) {
            *data = (const char *)buf + (begin - a0);
            return 0;
        }
        if (errno != EINVAL)
            return fsdp_errf(err, "%s: tensor %s: reading element %lld failed: %s", f->path, t->name, (long long)start,
                             errno ? strerror(errno) : "the file ended early");
    }
    *data = buf;
    return fsdp_st_read_raw(s, t, start, count, buf, err);
}

int fsdp_st_read_f32(const fsdp_st_set *s, const fsdp_st_tensor *t, int64_t start, int64_t count, float *out,
                     fsdp_err *err) {
    const char *path = fsdp_st_path(s, t);
    if (!fsdp_st_dtype_readable(t->dtype))
        return fsdp_errf(err, "%s: tensor %s has dtype %s; fsdp.c reads BF16, F16 and F32", path, t->name,
                         fsdp_st_dtype_name(t->dtype));
    if (start < 0 || count < 0 || start + count > t->numel)
        return fsdp_errf(err, "%s: tensor %s: elements [%lld, %lld) are outside its %lld", path, t->name,
                         (long long)start, (long long)(start + count), (long long)t->numel);
    size_t es = (size_t)fsdp_st_dtype_bits(t->dtype) / 8;
    int64_t chunks = (count + READ_CHUNK_ELEMS - 1) / READ_CHUNK_ELEMS;
    int failed = 0;
#pragma omp parallel if (chunks > 1)
    {
        uint16_t *buf = es == 2 ? fsdp_xmalloc((size_t)READ_CHUNK_ELEMS * 2, "a safetensors read") : NULL;
        fsdp_err mine;
#pragma omp for schedule(dynamic)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t at = c * READ_CHUNK_ELEMS, n = count - at < READ_CHUNK_ELEMS ? count - at : READ_CHUNK_ELEMS;
            void *dst = es == 2 ? (void *)buf : (void *)(out + at);
            memset(&mine, 0, sizeof mine);
            if (fsdp_st_read_raw(s, t, start + at, n, dst, &mine)) {
#pragma omp critical(fsdp_st_read_error)
                if (!failed) failed = 1, *err = mine;
                continue;
            }
            if (es == 2) fsdp_st_convert_f32(t->dtype, buf, n, out + at);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}
