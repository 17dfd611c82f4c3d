/* Jansson wrappers of jsonio.h. */
#include "jsonio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/files.h"

static json_t *loaded(json_t *v, const json_error_t *je, const char *origin, fsdp_err *err) {
    if (v) return v;
    if (je->line > 0)
        fsdp_errf(err, "%s: line %d, column %d: %s", origin, je->line, je->column, je->text);
    else
        fsdp_errf(err, "%s: %s", origin, je->text);
    return NULL;
}

/* The whole regular file at fd into a malloc'ed buffer (*len bytes), or NULL with err. */
static char *read_whole(int fd, const char *path, size_t *len, fsdp_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return fsdp_errf(err, "%s: fstat: %s", path, strerror(errno)), NULL;
    size_t cap = (size_t)st.st_size + 1, n = 0; /* + 1: a file that grew since is read to its end too */
    char *buf = malloc(cap);
    if (!buf) return fsdp_errf(err, "%s: out of host memory reading %zu bytes", path, cap), NULL;
    for (;;) {
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                return fsdp_errf(err, "%s: out of host memory reading %zu bytes", path, cap), NULL;
            }
            buf = bigger;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            free(buf);
            return fsdp_errf(err, "%s: read: %s", path, strerror(errno)), NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    *len = n;
    return buf;
}

static json_t *load_path(const char *path, size_t flags, fsdp_err *err);
json_t *fsdp_json_load_path(const char *path, fsdp_err *err) { return load_path(path, 0, err); }
json_t *fsdp_json_load_path_reals(const char *path, fsdp_err *err) {
    return load_path(path, JSON_DECODE_INT_AS_REAL, err);
}

static json_t *load_path(const char *path, size_t flags, fsdp_err *err) {
    /* Not json_load_file: its fopen would wait forever for the writer of a FIFO. Nor json_loadfd,
     * which reads one byte per system call (1.8 million for Llama 2's tokenizer.json). */
    int fd = fsdp_open_regular(path, O_RDONLY, 0, NULL, err);
    if (fd < 0) return NULL;
    size_t len = 0;
    char *text = read_whole(fd, path, &len, err);
    int close_errno = close(fd) != 0 ? errno : 0;
    if (!text) return NULL;
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &je);
    free(text);
    if (v && close_errno) {
        json_decref(v);
        return fsdp_errf(err, "%s: close: %s", path, strerror(close_errno)), NULL;
    }
    return loaded(v, &je, path, err);
}

json_t *fsdp_json_load_text(const char *text, size_t len, const char *origin, fsdp_err *err) {
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    return loaded(v, &je, origin, err);
}

json_t *fsdp_json_load_value(const char *text, size_t len, const char *origin, fsdp_err *err) {
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (v) return v;
    /* a value on one line (a JSON Lines record): the origin names the line, Jansson's column follows */
    if (je.line == 1) return fsdp_errf(err, "%s: column %d: %s", origin, je.column, je.text), NULL;
    return loaded(v, &je, origin, err);
}

char *fsdp_json_string_literal(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (!v) return NULL;
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(v);
    return text;
}

json_t *fsdp_json_number(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *fsdp_json_float(float x) {
    if (!isfinite(x)) return json_null();
    char tmp[48];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, (double)x);
        if ((float)strtod(tmp, NULL) == x) break;
    }
    return json_real(strtod(tmp, NULL));
}

char *fsdp_json_text(const json_t *v, int indent, int precision) {
    if (precision < 1) precision = 1;
    if (precision > 17) precision = 17;
    /* Jansson keeps objects in insertion order (2.8 and later). */
    size_t flags = JSON_REAL_PRECISION(precision);
    flags |= indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT;
    return json_dumps(v, flags);
}

json_t *fsdp_json_from_args(const fsdp_arg_spec *spec) {
    json_t *obj = json_object();
    if (!obj) fsdp_fatal("out of host memory building the run record");
    for (int i = 0; i < spec->num_args; i++) {
        const fsdp_arg *a = &spec->args[i];
        json_t *v;
        switch (a->type) {
        case FSDP_ARG_INT: v = json_integer(*(const int *)a->dest); break;
        case FSDP_ARG_INT64: v = json_integer((json_int_t) * (const int64_t *)a->dest); break;
        case FSDP_ARG_FLOAT: v = fsdp_json_number(*(const double *)a->dest); break;
        case FSDP_ARG_BOOL: v = json_boolean(*(const int *)a->dest); break;
        default: {
            const char *s = *(const char *const *)a->dest;
            /* A flag value that is not UTF-8 (a Latin-1 path, say) is kept as null rather than
             * making the whole record unwritable. */
            v = s ? json_string(s) : json_null();
            if (!v) v = json_null();
        }
        }
        if (json_object_set_new(obj, a->name, v)) fsdp_fatal("out of host memory building the run record");
    }
    return obj;
}
