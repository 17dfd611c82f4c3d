#include "error.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1, g_world = 1;

#define MAX_CLEANUPS 16
static struct {
    fsdp_cleanup_fn fn;
    void *arg;
} g_cleanups[MAX_CLEANUPS];
static int g_num_cleanups;

void fsdp_set_rank(int rank, int world) {
    g_rank = rank;
    g_world = world;
}
int fsdp_rank(void) { return g_rank; }

static int vset(fsdp_err *err, int status, const char *fmt, va_list ap) {
    if (!err) return -1;
    err->failed = 1;
    err->status = status;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return -1;
}

int fsdp_errf(fsdp_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(err, 1, fmt, ap);
    va_end(ap);
    return -1;
}

int fsdp_usagef(fsdp_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(err, 2, fmt, ap);
    va_end(ap);
    return -1;
}

int fsdp_cleanup_push(fsdp_cleanup_fn fn, void *arg) {
    for (int i = 0; i < MAX_CLEANUPS; i++) {
        if (!g_cleanups[i].fn) {
            g_cleanups[i].fn = fn;
            g_cleanups[i].arg = arg;
            if (i >= g_num_cleanups) g_num_cleanups = i + 1;
            return i;
        }
    }
    return -1; /* no room: the clean-up simply won't run on a fatal error */
}

void fsdp_cleanup_pop(int handle) {
    if (handle >= 0 && handle < MAX_CLEANUPS) g_cleanups[handle].fn = NULL;
}

static void run_cleanups(void) {
    for (int i = g_num_cleanups - 1; i >= 0; i--) {
        fsdp_cleanup_fn fn = g_cleanups[i].fn;
        g_cleanups[i].fn = NULL; /* never twice, even if a clean-up fails fatally */
        if (fn) fn(g_cleanups[i].arg);
    }
}

int fsdp_mpi_is_up(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

void fsdp_fatal(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_rank >= 0)
        fprintf(stderr, "fsdp: rank %d: %s\n", g_rank, msg);
    else
        fprintf(stderr, "fsdp: %s\n", msg);
    fflush(stderr);
    run_cleanups();
    if (fsdp_mpi_is_up() && g_world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

void fsdp_mpi_failed(int rc, const char *call, const char *file, int line) {
    char text[MPI_MAX_ERROR_STRING] = "unknown MPI error";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fsdp_fatal("%s failed at %s:%d: %s", call, file, line, text);
}

void fsdp_exit_error(const fsdp_err *err, int every_rank) {
    if (every_rank || g_rank <= 0) {
        fprintf(stderr, "fsdp: error: %s\n", err->msg);
        fflush(stderr);
    }
    run_cleanups();
    if (fsdp_mpi_is_up()) MPI_Finalize();
    exit(err->status ? err->status : 1);
}

void *fsdp_xmalloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fsdp_fatal("out of host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *fsdp_xrealloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fsdp_fatal("out of host memory growing %s to %zu bytes", what, bytes);
    return q;
}

void *fsdp_xcalloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fsdp_fatal("out of host memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}
