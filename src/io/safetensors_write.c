/* The safetensors writer of safetensors_write.h. */
#define _GNU_SOURCE /* fallocate, sync_file_range */
#include "safetensors_write.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/dtype.h"
#include "jsonio.h"

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = fsdp_xmalloc(n, "a tensor name");
    memcpy(p, s, n);
    return p;
}

static int64_t numel_of(const fsdp_st_spec *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* ---- the plan ---- */

static const fsdp_st_spec *g_sort_specs; /* qsort has no context argument in C11 */
static int by_spec_name(const void *a, const void *b) {
    return strcmp(g_sort_specs[*(const int *)a].name, g_sort_specs[*(const int *)b].name);
}

/* The header of file f: __metadata__, then its tensors in name order with their offsets. */
static void build_header(fsdp_st_plan *p, int f) {
    int *members = fsdp_xmalloc((size_t)(p->num_tensors + 1) * sizeof *members, "a header");
    int n = 0;
    for (int i = 0; i < p->num_tensors; i++)
        if (p->file_of[i] == f) members[n++] = i;
    g_sort_specs = p->tensors;
    qsort(members, (size_t)n, sizeof *members, by_spec_name);
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t at = 0;
    uint64_t *rel = fsdp_xmalloc((size_t)(n + 1) * sizeof *rel, "a header");
    for (int k = 0; k < n; k++) {
        const fsdp_st_spec *t = &p->tensors[members[k]];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t bytes = fsdp_st_plan_bytes(p, numel_of(t));
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", fsdp_st_dtype_name(p->dtype), "shape", shape,
                                  "data_offsets", (json_int_t)at, (json_int_t)(at + bytes));
        if (!entry || json_object_set_new(root, t->name, entry)) fsdp_fatal("out of host memory building a header");
        rel[k] = at;
        at += bytes;
    }
    char *text = fsdp_json_text(root, 0, 17);
    json_decref(root);
    if (!text) fsdp_fatal("out of host memory building a header");
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    char *h = fsdp_xmalloc(8 + padded, "a header");
    for (int i = 0; i < 8; i++) h[i] = (char)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, text, len);
    memset(h + 8 + len, ' ', padded - len);
    free(text);
    p->headers[f] = h;
    p->header_bytes[f] = 8 + padded;
    p->file_bytes[f] = 8 + padded + at;
    for (int k = 0; k < n; k++) p->offset[members[k]] = 8 + padded + rel[k];
    free(rel);
    free(members);
}

int fsdp_st_plan_build(const fsdp_st_spec *tensors, int num_tensors, fsdp_st_dtype dtype, uint64_t max_shard_bytes,
                       fsdp_st_plan *p, fsdp_err *err) {
    memset(p, 0, sizeof *p);
    if (dtype != FSDP_ST_F32 && dtype != FSDP_ST_BF16)
        return fsdp_errf(err, "safetensors: writing %s is not supported (F32, BF16)", fsdp_st_dtype_name(dtype));
    p->dtype = dtype;
    p->num_tensors = num_tensors;
    size_t n1 = (size_t)num_tensors + 1;
    p->tensors = fsdp_xcalloc(n1, sizeof *p->tensors, "the safetensors plan");
    p->file_of = fsdp_xcalloc(n1, sizeof *p->file_of, "the safetensors plan");
    p->offset = fsdp_xcalloc(n1, sizeof *p->offset, "the safetensors plan");
    /* save_pretrained's rule, in the caller's (state-dict) order. */
    int files = 0;
    uint64_t current = 0;
    int current_file = -1, current_used = 0;
    for (int i = 0; i < num_tensors; i++) {
        p->tensors[i] = tensors[i];
        p->tensors[i].name = dup_string(tensors[i].name);
        int64_t numel = numel_of(&tensors[i]);
        uint64_t bytes = fsdp_st_plan_bytes(p, numel);
        p->total_bytes += bytes;
        p->total_params += numel;
        if (max_shard_bytes && bytes > max_shard_bytes) {
            p->file_of[i] = files++; /* alone, before the file being filled */
            continue;
        }
        if (current_file < 0 || (max_shard_bytes && current + bytes > max_shard_bytes && current_used)) {
            current_file = files++;
            current = 0;
            current_used = 0;
        }
        p->file_of[i] = current_file;
        current += bytes;
        current_used = 1;
    }
    if (files == 0) files = 1;
    p->num_files = files;
    p->file_names = fsdp_xcalloc((size_t)files, sizeof *p->file_names, "the safetensors plan");
    p->headers = fsdp_xcalloc((size_t)files, sizeof *p->headers, "the safetensors plan");
    p->header_bytes = fsdp_xcalloc((size_t)files, sizeof *p->header_bytes, "the safetensors plan");
    p->file_bytes = fsdp_xcalloc((size_t)files, sizeof *p->file_bytes, "the safetensors plan");
    for (int f = 0; f < files; f++) {
        if (files == 1)
            snprintf(p->file_names[f], sizeof p->file_names[f], SINGLE_NAME);
        else
            snprintf(p->file_names[f], sizeof p->file_names[f], "model-%05d-of-%05d.safetensors", f + 1, files);
        build_header(p, f);
    }
    return 0;
}

void fsdp_st_plan_free(fsdp_st_plan *p) {
    for (int i = 0; i < p->num_tensors; i++) free((char *)p->tensors[i].name);
    for (int f = 0; f < p->num_files; f++) free(p->headers[f]);
    free(p->tensors);
    free(p->file_of);
    free(p->offset);
    free(p->file_names);
    free(p->headers);
    free(p->header_bytes);
    free(p->file_bytes);
    memset(p, 0, sizeof *p);
}

/* ---- files ---- */

static char *join(const char *dir, const char *name, const char *suffix) {
    size_t cap = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *s = fsdp_xmalloc(cap, "a path");
    snprintf(s, cap, "%s/%s%s", dir, name, suffix);
    return s;
}

static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, (const char *)buf + done, n - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

/* Reserves the blocks (so a full disk fails now, not halfway) and sets the exact size. */
static int preallocate(int fd, uint64_t bytes) {
    if (bytes > 0 && fallocate(fd, 0, 0, (off_t)bytes) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) return -1;
    return ftruncate(fd, (off_t)bytes);
}

int fsdp_st_create(const char *dir, const fsdp_st_plan *p, fsdp_err *err) {
    for (int f = 0; f < p->num_files; f++) {
        char *tmp = join(dir, p->file_names[f], ".tmp");
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int rc = fd < 0 ? fsdp_errf(err, "%s: cannot create: %s", tmp, strerror(errno)) : 0;
        if (rc == 0 && preallocate(fd, p->file_bytes[f]))
            rc = fsdp_errf(err, "%s: cannot reserve %llu bytes: %s", tmp, (unsigned long long)p->file_bytes[f],
                           strerror(errno));
        if (rc == 0 && pwrite_full(fd, p->headers[f], p->header_bytes[f], 0))
            rc = fsdp_errf(err, "%s: cannot write the header: %s", tmp, strerror(errno));
        if (fd >= 0 && close(fd) != 0 && rc == 0) rc = fsdp_errf(err, "%s: close failed: %s", tmp, strerror(errno));
        free(tmp);
        if (rc) return -1;
    }
    return 0;
}

int fsdp_st_writer_open(fsdp_st_writer *w, const char *dir, const fsdp_st_plan *p, fsdp_err *err) {
    w->plan = p;
    w->fds = fsdp_xmalloc((size_t)p->num_files * sizeof *w->fds, "the safetensors writer");
    w->paths = fsdp_xcalloc((size_t)p->num_files, sizeof *w->paths, "the safetensors writer");
    int rc = 0;
    for (int f = 0; f < p->num_files; f++) {
        w->paths[f] = join(dir, p->file_names[f], ".tmp");
        w->fds[f] = rc ? -1 : open(w->paths[f], O_WRONLY | O_CLOEXEC);
        if (!rc && w->fds[f] < 0) rc = fsdp_errf(err, "%s: cannot open for writing: %s", w->paths[f], strerror(errno));
    }
    return rc;
}

void fsdp_st_encode(const fsdp_st_plan *p, const float *in, int64_t count, void *out) {
    if (p->dtype == FSDP_ST_F32) {
        memcpy(out, in, (size_t)count * sizeof(float));
        return;
    }
    uint16_t *o = out;
#pragma omp parallel for schedule(static) if (count > (1 << 20))
    for (int64_t i = 0; i < count; i++) o[i] = fsdp_f32_to_bf16(in[i]);
}

int fsdp_st_pwrite(fsdp_st_writer *w, int tensor, int64_t start, int64_t count, const void *bytes, fsdp_err *err) {
    const fsdp_st_plan *p = w->plan;
    int f = p->file_of[tensor];
    uint64_t off = p->offset[tensor] + fsdp_st_plan_bytes(p, start);
    size_t len = fsdp_st_plan_bytes(p, count);
    if (pwrite_full(w->fds[f], bytes, len, off))
        return fsdp_errf(err, "%s: writing tensor %s failed: %s", w->paths[f], p->tensors[tensor].name,
                         strerror(errno));
    /* Starts the disk on these bytes now. Left to the kernel, writeback of a large file begins only
     * when the dirty pages pass a fraction of the host's memory (tens of GB on a GPU node), so the
     * disk idled while the first bytes were written and the final fsync then waited for nearly all
     * of them: one rank exported Llama-2-7B at 75% of dd's write rate. Advice only: a file system
     * without it, or an error here, leaves the bytes to the fsync, which reports errors. */
    (void)sync_file_range(w->fds[f], (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
    return 0;
}

int fsdp_st_writer_close(fsdp_st_writer *w, int sync, fsdp_err *err) {
    int rc = 0;
    for (int f = 0; w->fds && f < w->plan->num_files; f++) {
        if (w->fds[f] < 0) continue;
        if (sync && fsync(w->fds[f]) != 0 && rc == 0)
            rc = fsdp_errf(err, "%s: fsync failed: %s", w->paths[f], strerror(errno));
        if (close(w->fds[f]) != 0 && rc == 0) rc = fsdp_errf(err, "%s: close failed: %s", w->paths[f], strerror(errno));
    }
    for (int f = 0; w->paths && f < w->plan->num_files; f++) free(w->paths[f]);
    free(w->fds);
    free(w->paths);
    w->fds = NULL;
    w->paths = NULL;
    return rc;
}

int fsdp_write_file_tmp(const char *dir, const char *name, const void *data, size_t len, fsdp_err *err) {
    char *tmp = join(dir, name, ".tmp");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
    if (fd < 0) rc = fsdp_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
    if (rc == 0 && (pwrite_full(fd, data, len, 0) || fsync(fd)))
        rc = fsdp_errf(err, "%s: cannot write: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && rc == 0) rc = fsdp_errf(err, "%s: close failed: %s", tmp, strerror(errno));
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}

int fsdp_rename_tmp(const char *dir, const char *name, fsdp_err *err) {
    char *tmp = join(dir, name, ".tmp"), *path = join(dir, name, "");
    int rc = rename(tmp, path) ? fsdp_errf(err, "%s: cannot rename to %s: %s", tmp, path, strerror(errno)) : 0;
    free(tmp);
    free(path);
    return rc;
}

int fsdp_write_file_atomic(const char *dir, const char *name, const void *data, size_t len, fsdp_err *err) {
    if (fsdp_write_file_tmp(dir, name, data, len, err)) return -1;
    if (fsdp_rename_tmp(dir, name, err) == 0) return 0;
    char *tmp = join(dir, name, ".tmp");
    unlink(tmp);
    free(tmp);
    return -1;
}

int fsdp_sync_dir(const char *dir, fsdp_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fsdp_errf(err, "%s: cannot open the directory: %s", dir, strerror(errno));
    /* Some file systems refuse fsync on directories (EINVAL); the renames are then as durable as
     * they can be made. */
    int rc = fsync(fd) != 0 && errno != EINVAL ? fsdp_errf(err, "%s: fsync failed: %s", dir, strerror(errno)) : 0;
    close(fd);
    return rc;
}

static int index_text(const fsdp_st_plan *p, char **out) {
    json_t *map = json_object();
    int *order = fsdp_xmalloc((size_t)(p->num_tensors + 1) * sizeof *order, "the index");
    for (int i = 0; i < p->num_tensors; i++) order[i] = i;
    g_sort_specs = p->tensors;
    qsort(order, (size_t)p->num_tensors, sizeof *order, by_spec_name);
    for (int k = 0; k < p->num_tensors; k++)
        json_object_set_new(map, p->tensors[order[k]].name, json_string(p->file_names[p->file_of[order[k]]]));
    free(order);
    /* Keys sorted, as transformers writes it. */
    json_t *root = json_pack("{s:{s:I, s:I}, s:o}", "metadata", "total_parameters", (json_int_t)p->total_params,
                             "total_size", (json_int_t)p->total_bytes, "weight_map", map);
    char *text = root ? fsdp_json_text(root, 2, 17) : NULL;
    json_decref(root);
    if (!text) fsdp_fatal("out of host memory writing the safetensors index");
    size_t n = strlen(text);
    *out = realloc(text, n + 2);
    if (!*out) fsdp_fatal("out of host memory writing the safetensors index");
    memcpy(*out + n, "\n", 2);
    return (int)(n + 1);
}

/* Weight files of an earlier export that the new one does not replace would confuse a loader. */
static int is_stale(const fsdp_st_plan *p, const char *name) {
    int a, b, used = 0;
    int ours = 0;
    for (int f = 0; f < p->num_files; f++) ours |= !strcmp(name, p->file_names[f]);
    if (ours) return 0;
    if (!strcmp(name, SINGLE_NAME) || !strcmp(name, INDEX_NAME)) return 1;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && name[used] == 0 &&
           strlen(name) == strlen("model-00001-of-00001.safetensors");
}

int fsdp_st_publish(const char *dir, const fsdp_st_plan *p, fsdp_err *err) {
    for (int f = 0; f < p->num_files; f++)
        if (fsdp_rename_tmp(dir, p->file_names[f], err)) return -1;
    if (p->num_files > 1) {
        char *text;
        int n = index_text(p, &text);
        int rc = fsdp_write_file_atomic(dir, INDEX_NAME, text, (size_t)n, err);
        free(text);
        if (rc) return -1;
    }
    DIR *d = opendir(dir);
    if (!d) return fsdp_errf(err, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL && rc == 0) {
        if (!is_stale(p, e->d_name) || (p->num_files > 1 && !strcmp(e->d_name, INDEX_NAME))) continue;
        char *path = join(dir, e->d_name, "");
        if (unlink(path) != 0) rc = fsdp_errf(err, "%s: cannot remove the earlier export's file: %s", path, strerror(errno));
        free(path);
    }
    closedir(d);
    return rc ? rc : fsdp_sync_dir(dir, err);
}
