/* The environment: every FSDP_* variable the program reads is read here and nowhere else, by one
 * rule, and listed in README ("Environment variables").
 *
 * The rule:
 *  - unset or empty: the default, as if the variable did not exist;
 *  - a switch: "0" off, "1" on;
 *  - a number: plain decimal (decimal.h: no blanks, no hex, no "inf"), within the variable's range;
 *  - a word: one of the variable's words;
 *  - anything else is fatal, with a message naming the variable, its value and what it expects,
 *    so that a typo never runs silently with the default.
 * Two values are small languages of their own (FSDP_NCCL_MAX_CTAS, FSDP_TEST_FAIL): they come back
 * as text, NULL when unset or empty, to the one module that parses them and names the variable in
 * its errors.
 *
 * Each accessor reads the variable when it is called, except FSDP_SYNC_TIMEOUT, which every wait
 * asks for and which is read once. */
#ifndef FSDP_BASE_ENV_H
#define FSDP_BASE_ENV_H

#ifdef __cplusplus
extern "C" {
#endif

/* OMP_NUM_THREADS (OpenMP's own, read by the OpenMP runtime): whether the user set it, in which case
 * fsdp.c leaves the threads per rank to it (host_threads.h). */
int fsdp_env_omp_threads_given(void);

/* FSDP_SYNC_TIMEOUT: seconds a wait may make no progress before it is fatal (watchdog.h), also the
 * bound of checkpoint I/O. A positive number; default 600. Thread-safe. */
double fsdp_env_sync_timeout_s(void);

/* FSDP_CKPT_IO: 1 for "direct" (checkpoint bytes, and the weights --init-from reads from a Hugging
 * Face directory, with O_DIRECT where the file system allows; the default), 0 for "buffered"
 * (through the page cache). */
int fsdp_env_ckpt_direct_io(void);
/* FSDP_CKPT_THREADS: I/O threads per rank for checkpoint bytes, 1..64; default 4. */
int fsdp_env_ckpt_threads(void);

/* FSDP_TF32 (switch, default 0): fp32 matrix products may use TF32 tensor cores. */
int fsdp_env_tf32(void);
/* FSDP_GEMM_TUNE (switch, default 1): time cuBLASLt's candidates per problem; 0 takes its first. */
int fsdp_env_gemm_tune(void);
/* FSDP_VERBOSE_GEMM (switch, default 0): print the algorithm chosen per matrix-product problem. */
int fsdp_env_verbose_gemm(void);
/* FSDP_VERBOSE_WAITS (switch, default 0): print, per step, every wait for communication. */
int fsdp_env_verbose_waits(void);
/* FSDP_VERBOSE_CKPT (switch, default 0): print, per rank and checkpoint transfer, where the I/O
 * threads' time went (system calls, conversion and hashing, the final fsync). */
int fsdp_env_verbose_ckpt(void);
/* FSDP_NCCL_MAX_CTAS: "NAME=N[,NAME=N...]", caps on the CTAs of each communicator's collectives
 * (parsed by the CUDA backend); NULL for NCCL's defaults. */
const char *fsdp_env_nccl_max_ctas(void);

/* FSDP_CUDNN_LIBRARY: the file --attn cudnn loads instead of libcudnn.so.9 (a path, or a name the
 * loader searches for); NULL when unset or empty. */
const char *fsdp_env_cudnn_library(void);

/* Test hooks. FSDP_TEST_FAIL: "RANK:STEP:MODE", deliberate failures (parsed by fault.c); NULL for none. */
const char *fsdp_env_test_fail(void);
/* FSDP_TEST_MEMORY_LIMIT: "RANK:GIB", a memory limit on one rank that the memory plan does not know
 * of. Returns 1 and sets *rank and *gib when set (RANK >= 0, GIB > 0), 0 when unset. */
int fsdp_env_test_memory_limit(int *rank, double *gib);
/* FSDP_TEST_INIT_FROM_WINDOW: elements per staging window of --init-from (src/train/hf_import.c),
 * 1..2^40, so that a tiny model's shards are cut into many windows; 0 when unset (the built-in). */
long long fsdp_env_test_init_from_window(void);

#ifdef __cplusplus
}
#endif

#endif
