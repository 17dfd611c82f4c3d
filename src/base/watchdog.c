#include "watchdog.h"

#include <errno.h>
#include <time.h>

#include "env.h"
#include "error.h"
#include "log.h"

void fsdp_sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void fsdp_mpi_wait(MPI_Request *request, const char *what) {
    double limit = fsdp_env_sync_timeout_s(), start = fsdp_now();
    for (long spins = 0;; spins++) {
        int done = 0;
        FSDP_CHECK_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (spins < 1000) continue; /* most collectives here finish within microseconds */
        fsdp_sleep_us(50);
        if ((spins & 255) == 0 && fsdp_now() - start > limit)
            fsdp_fatal("no progress for %.0f s while waiting for %s: a peer rank has probably failed or stalled "
                       "(see its message, if any); set FSDP_SYNC_TIMEOUT to wait longer",
                       fsdp_now() - start, what);
    }
}

void fsdp_mpi_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char *what) {
    MPI_Request request;
    FSDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &request));
    fsdp_mpi_wait(&request, what);
}
