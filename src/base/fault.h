/* Deliberate failure of one rank, to test that the others stop (tests/scripts/rank_failure.py).
 *
 * FSDP_TEST_FAIL="RANK:STEP:MODE" makes rank RANK fail in the middle of step STEP (after the first
 * micro-batch's forward pass, with collectives of the step already in flight):
 *   exit  a fatal error, as a failed CUDA/NCCL/MPI call would raise;
 *   kill  SIGKILL, as the kernel's out-of-memory killer would send;
 *   hang  stops making progress for good, as a stalled process or device would.
 * Unset (the normal case) it costs one branch per step. A malformed value is fatal. */
#ifndef FSDP_BASE_FAULT_H
#define FSDP_BASE_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

void fsdp_fault_point(int step);

#ifdef __cplusplus
}
#endif

#endif
