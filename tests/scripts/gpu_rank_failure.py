"""When one of two GPU ranks fails (a fatal error, SIGKILL, or a stall with NCCL collectives in
flight), the other stops within seconds with a non-zero exit and a message.
Skipped (exit 77) without two GPUs and the CUDA backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import fsdptest as t
import rank_failure

if t.has_cuda_backend() < 2:
    print("gpu_rank_failure: SKIPPED (needs two GPUs and the CUDA backend)")
    sys.exit(77)

rank_failure.run_all(2, "cuda")
t.finish()
