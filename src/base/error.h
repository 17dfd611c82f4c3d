/* Error reporting for every layer.
 *
 * Two kinds of failure, two paths:
 *  - A failed library call (CUDA, NCCL, MPI, HDF5, cuBLASLt) or a broken invariant is fatal: fsdp_fatal
 *    prints one line naming the rank, the call, the file and line, runs the registered clean-up hooks
 *    (temporary checkpoint files are removed) and aborts every rank so nothing hangs.
 *  - Bad input from the user (a flag, a file) is an fsdp_err returned up the stack. Callers that run
 *    on every rank agree on it collectively (fsdp_agree, agree.h), so that all ranks stop together
 *    with one line on rank 0 and exit status 1 (2 for bad command-line usage). */
#ifndef FSDP_BASE_ERROR_H
#define FSDP_BASE_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
#define FSDP_NORETURN [[noreturn]]
extern "C" {
#else
#define FSDP_NORETURN _Noreturn
#endif

typedef struct {
    int failed;      /* 0 = fine */
    int status;      /* exit status to use: 1 for errors, 2 for usage errors */
    char msg[1024];
} fsdp_err;

/* Records a message (printf-style) and returns -1, so `return fsdp_errf(err, ...)` reads well. */
int fsdp_errf(fsdp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, with exit status 2 (command-line usage). */
int fsdp_usagef(fsdp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The rank used in messages (set once MPI is up; -1 before). */
void fsdp_set_rank(int rank, int world);
int fsdp_rank(void);

/* Prints "fsdp: rank R: <message>" to stderr, runs clean-up hooks, aborts every rank. */
FSDP_NORETURN void fsdp_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Clean-up hooks run by fsdp_fatal and by fsdp_exit_error, newest first. */
typedef void (*fsdp_cleanup_fn)(void *arg);
int fsdp_cleanup_push(fsdp_cleanup_fn fn, void *arg); /* returns a handle */
void fsdp_cleanup_pop(int handle);                    /* removes without running */

/* 1 while MPI is initialised and not yet finalised. */
int fsdp_mpi_is_up(void);

/* Prints "fsdp: error: <msg>" on rank 0 (or on the caller when `every_rank`), runs clean-up hooks,
 * finalizes MPI if it is up and exits with err->status. Call it on every rank after fsdp_agree. */
FSDP_NORETURN void fsdp_exit_error(const fsdp_err *err, int every_rank);

#define FSDP_STR2(x) #x
#define FSDP_STR(x) FSDP_STR2(x)

/* Checks an MPI call; on failure names the call, file, line and rank and aborts. */
#define FSDP_CHECK_MPI(call)                                                                         \
    do {                                                                                             \
        int fsdp_mpi_rc_ = (call);                                                                   \
        if (fsdp_mpi_rc_ != 0) fsdp_mpi_failed(fsdp_mpi_rc_, #call, __FILE__, __LINE__);             \
    } while (0)
FSDP_NORETURN void fsdp_mpi_failed(int rc, const char *call, const char *file, int line);

/* Invariants that indicate a bug, not bad input. */
#define FSDP_ASSERT(cond)                                                                            \
    do {                                                                                             \
        if (!(cond)) fsdp_fatal("internal error: %s failed at %s:%d", #cond, __FILE__, __LINE__);   \
    } while (0)

/* malloc/calloc/realloc that abort with a message naming what was being allocated. */
void *fsdp_xmalloc(size_t bytes, const char *what);
void *fsdp_xcalloc(size_t count, size_t size, const char *what);
void *fsdp_xrealloc(void *p, size_t bytes, const char *what);

/* The one growth rule of the growable arrays: room for element n of items (capacity cap, of any
 * integer type), the capacity doubling from `first`; out of host memory is fatal, naming what. */
#define FSDP_GROW(items, n, cap, first, what)                                                        \
    do {                                                                                             \
        if ((size_t)(n) >= (size_t)(cap)) {                                                          \
            (cap) = (cap) ? 2 * (cap) : (first);                                                     \
            (items) = fsdp_xrealloc((items), (size_t)(cap) * sizeof *(items), (what));               \
        }                                                                                            \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
