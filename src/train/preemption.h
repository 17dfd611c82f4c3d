/* Stopping a run on request: SIGTERM (what SLURM and mpirun send before they kill a job), SIGINT
 * (Ctrl-C) and SIGUSR1 (what `#SBATCH --signal=B:USR1@...` asks for before the time limit).
 *
 * The first signal on any rank only sets a flag; at the next step boundary the ranks agree on it
 * (src/train/ckpt_saver.c), write a checkpoint, print one line and exit with FSDP_EXIT_PREEMPTED,
 * so that a job script can requeue itself and continue with --resume auto. A second signal stops
 * the rank at once (exit status 128 + the signal), without a checkpoint. */
#ifndef FSDP_TRAIN_PREEMPTION_H
#define FSDP_TRAIN_PREEMPTION_H

/* Exit status of a run stopped by a signal after its checkpoint was written (EX_TEMPFAIL of
 * sysexits.h: "try again later"). */
#define FSDP_EXIT_PREEMPTED 75

/* Installs the handlers (SA_RESTART: system calls interrupted by the first signal resume). */
void fsdp_preemption_install(void);
/* Restores the previous handlers. */
void fsdp_preemption_uninstall(void);
/* The first signal this rank received (SIGTERM, SIGINT, SIGUSR1), 0 if none. */
int fsdp_preemption_signal(void);
/* "SIGTERM" etc. */
const char *fsdp_signal_name(int sig);

#endif
