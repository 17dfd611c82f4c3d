/* Deliberate failures, to test that the others ranks stop, that bad steps are skipped and that
 * checkpoint I/O failures are ordinary errors (tests/scripts/rank_failure.py, ckpt_*.py).
 *
 * FSDP_TEST_FAIL="RANK:STEP:MODE": RANK is a rank number or "all"; STEP a step N or a range N-M, or 0:
 *   start-up, before MPI_Init_thread (exit, kill and hang only; RANK as the launcher numbers it), so
 *   that a rank can stall while the others wait for it inside MPI's start-up.
 *   exit       a fatal error in the middle of the step (after the first micro-batch's forward
 *              pass, with collectives of the step in flight), as a failed CUDA/NCCL/MPI call;
 *   kill       SIGKILL there, as the kernel's out-of-memory killer would send;
 *   hang       stops making progress there for good, as a stalled process or device would;
 *   nan        the rank's gradients of the step become NaN (a diverged step);
 *   nanloss    the rank's loss of the step becomes NaN;
 *   poison     after the step's update one of the rank's master weights becomes NaN;
 *   ckpt-F@P   the checkpoint of step STEP fails on the rank at point P with fault F:
 *              F = enospc | eio (the I/O call fails with that error), hang (the I/O stalls for
 *              good), kill (SIGKILL); P = create (the file and its storage are made: rank 0),
 *              write (this rank's bytes, once half of them are written), commit (the file is
 *              finished and renamed: rank 0), latest (between the rename and the 'latest'
 *              pointer: rank 0). "ckpt-F" alone means ckpt-F@write.
 * Unset (the normal case) each check costs one branch. A malformed value is fatal. */
#ifndef FSDP_BASE_FAULT_H
#define FSDP_BASE_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FSDP_CKPT_AT_CREATE, FSDP_CKPT_AT_WRITE, FSDP_CKPT_AT_COMMIT, FSDP_CKPT_AT_LATEST } fsdp_ckpt_point;

/* Mid-step: exit, kill or hang. */
void fsdp_fault_point(int step);
/* Start-up (STEP 0), before MPI_Init_thread: exit, kill or hang. */
void fsdp_fault_startup(void);
/* Bits of what to make non-finite on this rank at `step`: 1 the gradients, 2 the loss. */
int fsdp_fault_nonfinite(int step);
/* 1 when a master weight of this rank should be poisoned after the update of `step`. */
int fsdp_fault_poison(int step);
/* At `point` of the save of the checkpoint of `step`: an errno value to fail the I/O call with
 * (ENOSPC, EIO) or 0; the hang and kill faults happen inside. Thread-safe. */
int fsdp_fault_ckpt(int step, fsdp_ckpt_point point);

#ifdef __cplusplus
}
#endif

#endif
