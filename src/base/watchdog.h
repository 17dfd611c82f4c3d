/* Bounded waiting: no rank waits forever for a peer that died or stopped.
 *
 * A rank that fails with a message aborts every rank at once (fsdp_fatal -> MPI_Abort), and a rank
 * killed by a signal makes the launcher (mpirun, srun) stop the others. What neither covers is a
 * peer that is alive but makes no progress (a stalled process, a hung device): the survivors would
 * block in a collective until the job's time limit. So every wait inside the training loop polls
 * instead of blocking, and gives up after FSDP_SYNC_TIMEOUT seconds (default 600; fsdp_env_sync_timeout_s
 * in env.h) with a fatal error that names what it was waiting for. */
#ifndef FSDP_BASE_WATCHDOG_H
#define FSDP_BASE_WATCHDOG_H

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Polling wait with the timeout. Spins briefly, then sleeps between polls so an oversubscribed
 * node still makes progress. `what` completes "waiting for ...". */
void fsdp_mpi_wait(MPI_Request *request, const char *what);

/* In-place MPI_Allreduce through a non-blocking request and fsdp_mpi_wait. */
void fsdp_mpi_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char *what);

/* Sleeps `us` microseconds (the polling back-off shared by the backends). */
void fsdp_sleep_us(long us);

/* Start-up. MPI_Init_thread returns only once every rank of the job has joined, so a rank that
 * stalls before joining would hold the others in it forever, before any wait above exists. Armed
 * before MPI_Init_thread, this watchdog ends the process after FSDP_SYNC_TIMEOUT seconds unless
 * disarmed first, with one line naming the rank (as the launcher numbered it: Open MPI, PMIx, PMI,
 * SLURM), the host and `what` it waited for, and exit status 1. While armed, a SIGTERM (the launcher
 * stopping the job after another rank ended) also ends it with one line, by that signal. Not
 * thread-safe: called by the main thread only, around MPI's start-up. */
void fsdp_startup_watchdog_arm(const char *what);
void fsdp_startup_watchdog_disarm(void);
/* This process's rank as the launcher's environment gives it, before MPI can say; -1 without one. */
int fsdp_startup_rank(void);
/* The number of ranks the launcher's environment announces before MPI is up; 1 without a launcher. */
int fsdp_startup_world(void);

#ifdef __cplusplus
}
#endif

#endif
