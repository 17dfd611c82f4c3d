#include "agree.h"

#include "watchdog.h"

int fsdp_agree(MPI_Comm comm, fsdp_err *err) {
    if (comm == MPI_COMM_NULL || !fsdp_mpi_is_up()) return err->failed ? -1 : 0;
    int rank, size;
    FSDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    FSDP_CHECK_MPI(MPI_Comm_size(comm, &size));
    /* The lowest failing rank speaks for everyone. */
    int first = err->failed ? rank : size;
    fsdp_mpi_allreduce(&first, 1, MPI_INT, MPI_MIN, comm, "the other ranks to agree on an error");
    if (first == size) return 0;
    int status = err->status;
    FSDP_CHECK_MPI(MPI_Bcast(&status, 1, MPI_INT, first, comm));
    FSDP_CHECK_MPI(MPI_Bcast(err->msg, (int)sizeof err->msg, MPI_CHAR, first, comm));
    err->failed = 1;
    err->status = status ? status : 1;
    return -1;
}
