/* The checks of the MPI tests (tests/mpi/test_*.c, each one program under mpirun): every rank counts
 * its own failures and goes on, so that one run shows every failing check.
 *  - rank and size are MPI_COMM_WORLD's, set by the test's main;
 *  - CHECK(cond) reports a false condition with the rank, file, line and text on stderr;
 *  - check_quiet(ok, fmt, ...) reports a false ok with the rank and a message on stderr;
 *  - mpi_check_summary(program), called by every rank before MPI_Finalize, sums the failures over
 *    the ranks; rank 0 prints "<program>: N failure(s) over R ranks"; every rank returns the exit
 *    status, 1 when any rank failed.
 * One copy per test program. */
#ifndef FSDP_TESTS_MPI_CHECK_H
#define FSDP_TESTS_MPI_CHECK_H

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>

static int rank, size, failures;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL rank %d %s:%d: %s\n", rank, __FILE__, __LINE__, #cond);                              \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

static inline int check_quiet(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int check_quiet(int ok, const char *fmt, ...) {
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "FAIL rank %d ", rank);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        failures++;
    }
    return ok;
}

static inline int mpi_check_summary(const char *program) {
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failure(s) over %d ranks\n", program, total, size);
    return total ? 1 : 0;
}

#endif
