/* OpenMP threads per rank when several ranks share a machine.
 *
 * OpenMP's default is one thread per CPU the process may run on. `mpirun --bind-to none` (and any
 * launcher that does not bind) gives every rank all of the machine's CPUs, so N ranks start N
 * threads per CPU; the CPU backend's kernels then run at half speed or worse (two ranks of the
 * tiny-llama preset on two cores: 4,834 tokens/s per rank with two threads each, 10,169 with one).
 * Unless the user chose (OMP_NUM_THREADS set), each rank whose CPU set is the whole machine takes
 * its share of the CPUs, at least one; a rank the launcher bound to fewer CPUs keeps OpenMP's
 * default of one thread per CPU of its set. */
#ifndef FSDP_BASE_HOST_THREADS_H
#define FSDP_BASE_HOST_THREADS_H

#include <mpi.h>

/* Collective over `world` (MPI_COMM_NULL: a process without MPI, alone on its host). Returns the
 * OpenMP threads this rank will use. */
int fsdp_share_host_threads(MPI_Comm world);

/* The threads of this rank's share of the machine by the rule below, whatever OMP_NUM_THREADS says:
 * for one-off start-up work that no other thread of the rank runs beside (the initial weights), where
 * OMP_NUM_THREADS=1 (torchrun's default, often copied into SLURM scripts) would make a 7B model's
 * 6.7 G normal draws take minutes instead of seconds. 1 before fsdp_share_host_threads. */
int fsdp_start_up_threads(void);

/* The rule itself, for the tests: the threads of a rank that may run on `allowed` of the machine's
 * `online` CPUs, with `ranks_here` ranks on the machine. */
int fsdp_host_threads_for(int allowed, int online, int ranks_here);

#endif
