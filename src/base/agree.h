/* Agreeing on an error: the collective step that turns one rank's fsdp_err into every rank's.
 *
 * Bad input (a flag, a file) is found on one rank or some of them; the others would go on into the
 * next collective and wait there. Every rank calls fsdp_agree at the same point instead, and all
 * of them leave together with the same message (then fsdp_exit_error prints it once). The wait is
 * bounded like every wait of a run (watchdog.h). */
#ifndef FSDP_BASE_AGREE_H
#define FSDP_BASE_AGREE_H

#include <mpi.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over `comm`: if any rank's err->failed is set, every rank copies the message and exit
 * status of the lowest failing rank into its err and returns -1; otherwise returns 0. With
 * MPI_COMM_NULL, or before MPI is up, it is this process's own err alone. */
int fsdp_agree(MPI_Comm comm, fsdp_err *err);

#ifdef __cplusplus
}
#endif

#endif
