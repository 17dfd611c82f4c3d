/* The CUDA backend's runtime and collectives: device memory, streams and events, NCCL communicators
 * bootstrapped over MPI; its creation and its tables. The ops are in cuda_ops.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/env.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "cuda_internal.h"
#if FSDP_HAVE_CUDNN
#include "cuda_cudnn_attention.h"
#endif

int fsdp_backend_cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

size_t fsdp_backend_cuda_gpu_memory(char *name, size_t name_cap) {
    struct cudaDeviceProp prop;
    FSDP_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (name_cap) snprintf(name, name_cap, "%s", prop.name);
    return prop.totalGlobalMem;
}

/* ---- memory ---- */

static size_t cuda_dtype_size(fsdp_backend *be, fsdp_dtype t) {
    (void)be;
    return fsdp_device_dtype_size(FSDP_DEVICE_CUDA, t);
}

static double gib(size_t bytes) { return (double)bytes / (double)(1u << 30); }

static void cuda_memory_info(fsdp_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    FSDP_CHECK_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
}

/* A failed cudaMalloc leaves its error as the last error, which the next launch check would report
 * as its own: it is cleared here, and the failure goes through fsdp_backend_out_of_memory. */
static void *out_of_memory(fsdp_backend *be, size_t bytes, const char *what) {
    (void)cudaGetLastError();
    size_t free_b = 0, total = 0;
    cuda_memory_info(be, &free_b, &total);
    char detail[192];
    if (be->memory_limit)
        snprintf(detail, sizeof detail, "%.2f GiB held by fsdp.c, %.2f GiB of the GPU in use, --memory-limit %.2f GiB",
                 gib(be->reserved_bytes), gib(total - free_b), gib(be->memory_limit));
    else
        snprintf(detail, sizeof detail, "%.2f GiB held by fsdp.c, %.2f GiB free of %.2f", gib(be->reserved_bytes),
                 gib(free_b), gib(total));
    return fsdp_backend_out_of_memory(be, bytes, what, detail);
}

/* GPU memory in use that fsdp.c did not allocate. */
static size_t outside_now(fsdp_backend *be) {
    size_t free_b = 0, total = 0;
    cuda_memory_info(be, &free_b, &total);
    return total - free_b > be->reserved_bytes ? total - free_b - be->reserved_bytes : 0;
}

/* With a memory limit, an allocation may not take the GPU's used memory past it. */
static int over_limit(fsdp_backend *be, size_t bytes) {
    if (!be->memory_limit) return 0;
    size_t free_b = 0, total = 0;
    cuda_memory_info(be, &free_b, &total);
    return total - free_b + bytes > be->memory_limit;
}

static void track(fsdp_backend *be, void *p, size_t bytes, int nccl_memory, ncclComm_t window_comm,
                  ncclWindow_t window) {
    FSDP_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, compute_stream(be)));
    allocation *a = fsdp_xcalloc(1, sizeof *a, "allocation record");
    a->ptr = p, a->bytes = bytes, a->nccl_memory = nccl_memory, a->window_comm = window_comm, a->window = window;
    a->next = cuda_of(be)->allocations;
    cuda_of(be)->allocations = a;
    be->reserved_bytes += bytes;
    if (be->reserved_bytes > be->max_reserved_bytes) be->max_reserved_bytes = be->reserved_bytes;
}

static void *cuda_alloc(fsdp_backend *be, size_t bytes, const char *what) {
    void *p = NULL;
    size_t rounded = fsdp_device_alloc_size(FSDP_DEVICE_CUDA, bytes);
    if (over_limit(be, rounded) || cudaMalloc(&p, rounded) != cudaSuccess) return out_of_memory(be, bytes, what);
    track(be, p, rounded, 0, NULL, NULL);
    return p;
}

/* ncclMemAlloc gives memory peers can map (cuMem); registering it as a symmetric window is what
 * lets NCCL's copy-engine all-gather write straight into every peer's receive buffer. */
static void *cuda_alloc_shared(fsdp_backend *be, fsdp_comm *c, size_t bytes, const char *what) {
    if (!c || !c->copy_engines) return cuda_alloc(be, bytes, what);
    size_t align = NCCL_WIN_REQUIRED_ALIGNMENT;
    size_t rounded = (bytes + align - 1) / align * align;
    if (!rounded) rounded = align;
    void *p = NULL;
    if (over_limit(be, rounded) || ncclMemAlloc(&p, rounded) != ncclSuccess) {
        /* Never deferred: the other ranks would wait in the window registration below. */
        be->oom.deferred = 0;
        out_of_memory(be, bytes, what);
    }
    /* Stays NULL where NCCL has no symmetric memory (no NVLink between all ranks, several nodes). */
    ncclWindow_t window = NULL;
    FSDP_CHECK_NCCL(ncclCommWindowRegister(c->comm, p, rounded, &window, NCCL_WIN_COLL_SYMMETRIC));
    track(be, p, rounded, 1, c->comm, window);
    return p;
}

static void cuda_free(fsdp_backend *be, void *ptr) {
    if (!ptr) return;
    allocation *dead = NULL;
    for (allocation **a = &cuda_of(be)->allocations; *a; a = &(*a)->next) {
        if ((*a)->ptr == ptr) {
            dead = *a;
            *a = dead->next;
            be->reserved_bytes -= dead->bytes;
            break;
        }
    }
    /* Frees wait for the device anyway; make it explicit so no stream still reads the buffer. */
    FSDP_CHECK_CUDA(cudaDeviceSynchronize());
    if (dead && dead->nccl_memory) {
        if (dead->window) FSDP_CHECK_NCCL(ncclCommWindowDeregister(dead->window_comm, dead->window));
        FSDP_CHECK_NCCL(ncclMemFree(ptr));
    } else {
        FSDP_CHECK_CUDA(cudaFree(ptr));
    }
    free(dead);
}

static void *cuda_alloc_host(fsdp_backend *be, size_t bytes, const char *what) {
    (void)be;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess)
        fsdp_fatal("out of pinned host memory allocating %zu bytes for %s", bytes, what);
    return p;
}

static void cuda_free_host(fsdp_backend *be, void *ptr) {
    (void)be;
    if (ptr) FSDP_CHECK_CUDA(cudaFreeHost(ptr));
}

/* After a deferred out-of-memory (fsdp_oom) the buffer that was refused is NULL; the set-up that
 * copies into it only has to reach the point where the ranks agree. */
static int refused(fsdp_backend *be, int null_pointer) {
    if (!null_pointer) return 0;
    if (be->oom.failures) return 1;
    fsdp_fatal("internal error: a copy or zeroing of a NULL pointer");
}

static void cuda_copy_h2d(fsdp_backend *be, void *dst, const void *src, size_t bytes, fsdp_stream *s) {
    if (refused(be, !dst || !src)) return;
    FSDP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
}
static void cuda_copy_d2h(fsdp_backend *be, void *dst, const void *src, size_t bytes, fsdp_stream *s) {
    if (refused(be, !dst || !src)) return;
    FSDP_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream));
}
static void cuda_zero(fsdp_backend *be, void *dst, size_t bytes, fsdp_stream *s) {
    if (refused(be, !dst)) return;
    FSDP_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, s->stream));
}

void *fsdp_cuda_scratch(fsdp_backend *be, size_t bytes) {
    cuda_context *im = cuda_of(be);
    if (bytes > im->scratch_bytes) {
        if (im->scratch) cuda_free(be, im->scratch);
        /* A request reserve_scratch did not foresee: grow with headroom, so that a few sizes settle
         * in the first step and never move again. */
        im->scratch_bytes = bytes + bytes / 4;
        im->scratch = cuda_alloc(be, im->scratch_bytes, "op scratch");
    }
    return im->scratch;
}

static void cuda_reserve_scratch(fsdp_backend *be, size_t bytes) {
    cuda_context *im = cuda_of(be);
    if (bytes <= im->scratch_bytes) return;
    if (im->scratch) cuda_free(be, im->scratch);
    im->scratch = cuda_alloc(be, bytes, "op scratch");
    im->scratch_bytes = im->scratch ? bytes : 0;
}

/* ---- streams and events ---- */

static fsdp_stream *cuda_stream_create(fsdp_backend *be, const char *name) {
    (void)be;
    fsdp_stream *s = fsdp_xcalloc(1, sizeof *s, "a stream");
    /* Higher priority for communication: a collective that starts late delays every rank. */
    int lo = 0, hi = 0;
    FSDP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    int comm = strcmp(name, "compute") != 0;
    FSDP_CHECK_CUDA(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, comm ? hi : lo));
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static void cuda_stream_destroy(fsdp_backend *be, fsdp_stream *s) {
    (void)be;
    if (!s) return;
    FSDP_CHECK_CUDA(cudaStreamSynchronize(s->stream));
    FSDP_CHECK_CUDA(cudaStreamDestroy(s->stream));
    free(s);
}

static fsdp_event *cuda_event_create(fsdp_backend *be, int timing) {
    (void)be;
    fsdp_event *e = fsdp_xcalloc(1, sizeof *e, "an event");
    FSDP_CHECK_CUDA(cudaEventCreateWithFlags(&e->event, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
}

static void cuda_event_destroy(fsdp_backend *be, fsdp_event *e) {
    (void)be;
    if (!e) return;
    FSDP_CHECK_CUDA(cudaEventDestroy(e->event));
    free(e);
}

static void cuda_event_record(fsdp_backend *be, fsdp_event *e, fsdp_stream *s) {
    (void)be;
    FSDP_CHECK_CUDA(cudaEventRecord(e->event, s->stream));
}

static void cuda_stream_wait_event(fsdp_backend *be, fsdp_stream *s, fsdp_event *e) {
    (void)be;
    FSDP_CHECK_CUDA(cudaStreamWaitEvent(s->stream, e->event, 0));
}

void fsdp_cuda_wait_event(fsdp_backend *be, cudaEvent_t e, const char *what) {
    cuda_context *im = cuda_of(be);
    double start = fsdp_now(), next_poll = start + 1.0;
    for (long spins = 0;; spins++) {
        cudaError_t rc = cudaEventQuery(e);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) fsdp_fatal("waiting for %s: %s", what, cudaGetErrorString(rc));
        if (spins > 1000) fsdp_sleep_us(50); /* spin briefly, then stop burning a core */
        double now = fsdp_now();
        if (now < next_poll) continue;
        next_poll = now + 1.0;
        for (fsdp_comm *c = im->comms; c; c = c->next) {
            ncclResult_t async = ncclSuccess;
            FSDP_CHECK_NCCL(ncclCommGetAsyncError(c->comm, &async));
            if (async != ncclSuccess)
                fsdp_fatal("NCCL communicator '%s' (rank %d of %d) failed while waiting for %s: %s", c->name, c->rank,
                           c->size, what, ncclGetErrorString(async));
        }
        if (now - start > fsdp_env_sync_timeout_s())
            fsdp_fatal("no progress for %.0f s while waiting for %s: a peer rank has probably failed or stalled "
                       "(see its message, if any); set FSDP_SYNC_TIMEOUT to wait longer",
                       now - start, what);
    }
}

static void cuda_event_synchronize(fsdp_backend *be, fsdp_event *e) { fsdp_cuda_wait_event(be, e->event, "an event"); }

static void cuda_stream_synchronize(fsdp_backend *be, fsdp_stream *s) {
    cudaEvent_t e;
    FSDP_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    FSDP_CHECK_CUDA(cudaEventRecord(e, s->stream));
    fsdp_cuda_wait_event(be, e, s->name);
    FSDP_CHECK_CUDA(cudaEventDestroy(e));
}

static float cuda_event_elapsed_ms(fsdp_backend *be, fsdp_event *a, fsdp_event *b) {
    (void)be;
    float ms = 0.0f;
    FSDP_CHECK_CUDA(cudaEventElapsedTime(&ms, a->event, b->event));
    return ms;
}

/* ---- NCCL, bootstrapped over MPI ---- */

/* FSDP_NCCL_MAX_CTAS="gather=8,reduce-scatter=16" caps the CTAs (SMs) NCCL may use for the named
 * communicator's collectives, a per-stream NCCL_MAX_CTAS: it trades communication speed for SMs left
 * to the overlapped compute. Returns the cap for `name`, or 0 for NCCL's default. */
static int max_ctas_for(const char *name) {
    const char *spec = fsdp_env_nccl_max_ctas();
    if (!spec || !*spec) return 0;
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        char *stop = NULL;
        long n = eq && eq < end ? strtol(eq + 1, &stop, 10) : -1;
        if (!eq || eq > end || stop != end || n < 1 || n > 64)
            fsdp_fatal("FSDP_NCCL_MAX_CTAS=%s: expected NAME=N[,NAME=N...] with N in 1..64 (names: gather, "
                       "reduce-scatter, gradient rows, replica all-reduce, gradient norm)", spec);
        if ((size_t)(eq - p) == strlen(name) && !strncmp(p, name, (size_t)(eq - p))) return (int)n;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static fsdp_comm *cuda_comm_create(fsdp_backend *be, MPI_Comm mpi, const char *name, int flags) {
    cuda_context *im = cuda_of(be);
    fsdp_comm *c = fsdp_xcalloc(1, sizeof *c, "a communicator");
    FSDP_CHECK_MPI(MPI_Comm_rank(mpi, &c->rank));
    FSDP_CHECK_MPI(MPI_Comm_size(mpi, &c->size));
    snprintf(c->name, sizeof c->name, "%s", name);
    ncclUniqueId id;
    if (c->rank == 0) FSDP_CHECK_NCCL(ncclGetUniqueId(&id));
    FSDP_CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    int max_ctas = max_ctas_for(name);
    if (max_ctas > 0) config.maxCTAs = max_ctas;
    c->copy_engines = (flags & FSDP_COMM_COPY_ENGINES) != 0;
    /* Only collectives between symmetric windows change: NCCL falls back to its kernels elsewhere
     * (another node, no NVLink) whatever the policy. */
    if (c->copy_engines) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    size_t before = outside_now(be);
    FSDP_CHECK_NCCL(ncclCommInitRankConfig(&c->comm, c->size, id, c->rank, &config));
    size_t after = outside_now(be);
    if (after > before) be->outside_comm_init += after - before;
    c->next = im->comms;
    im->comms = c;
    return c;
}

static void cuda_comm_destroy(fsdp_backend *be, fsdp_comm *c) {
    if (!c) return;
    cuda_context *im = cuda_of(be);
    for (fsdp_comm **p = &im->comms; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    FSDP_CHECK_NCCL(ncclCommDestroy(c->comm));
    free(c);
}

/* What `count` elements of t are on the wire: plain values as NCCL's type of the same name, a piece
 * of a blockwise dtype (codes and scales) as its bytes, which NCCL moves but never adds. */
static const ncclDataType_t NCCL_PLAIN_TYPES[FSDP_DTYPE_COUNT] = {[FSDP_F32] = ncclFloat32, [FSDP_BF16] = ncclBfloat16};

typedef struct {
    ncclDataType_t type;
    size_t count;
} nccl_wire;

static nccl_wire wire_of(fsdp_dtype t, size_t count) {
    if (fsdp_dtype_blockwise(t)) return (nccl_wire){ncclUint8, fsdp_device_piece_bytes(FSDP_DEVICE_CUDA, t, count)};
    return (nccl_wire){NCCL_PLAIN_TYPES[t], count};
}

static void require_summable(fsdp_dtype t, const char *call) {
    if (fsdp_dtype_blockwise(t))
        fsdp_fatal("internal error: %s of %s, a blockwise dtype (only all_gather and all_to_all move those)", call,
                   fsdp_dtype_name(t));
}

/* NCCL allocates most of a communicator's buffers at its first collectives, and a cudaMalloc it
 * cannot make comes back as ncclUnhandledCudaError. With under NCCL_OOM_FREE_BYTES free on the
 * device that is an out-of-memory like any other (one line with the plan, from the trainer's hook),
 * not an NCCL error. */
#define NCCL_OOM_FREE_BYTES ((size_t)1 << 30)
static void check_collective(fsdp_backend *be, ncclResult_t rc, const char *call, const fsdp_comm *c, int line) {
    if (rc == ncclSuccess) return;
    if (rc == ncclUnhandledCudaError) {
        size_t free_b = 0, total = 0;
        if (cudaMemGetInfo(&free_b, &total) == cudaSuccess && free_b < NCCL_OOM_FREE_BYTES) {
            char what[96];
            snprintf(what, sizeof what, "NCCL's buffers of the %s communicator (%s)", c->name, call);
            out_of_memory(be, 0, what);
        }
    }
    fsdp_fatal("%s on the %s communicator failed at %s:%d: %s", call, c->name, __FILE__, line, ncclGetErrorString(rc));
}

/* NCCL takes an all-gather as in place when send == recv + rank * (its count in its type), which the
 * wire's count makes the piece offset the interface promises. */
static void cuda_all_gather(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count, fsdp_dtype t,
                            fsdp_stream *s) {
    const nccl_wire w = wire_of(t, count);
    check_collective(be, ncclAllGather(send, recv, w.count, w.type, c->comm, s->stream), "ncclAllGather", c, __LINE__);
}

static void cuda_reduce_scatter(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                                fsdp_dtype t, fsdp_stream *s) {
    require_summable(t, "reduce_scatter");
    const nccl_wire w = wire_of(t, count);
    check_collective(be, ncclReduceScatter(send, recv, w.count, w.type, ncclSum, c->comm, s->stream),
                     "ncclReduceScatter", c, __LINE__);
}

static void cuda_all_reduce(fsdp_backend *be, fsdp_comm *c, void *buf, size_t count, fsdp_dtype t, fsdp_stream *s) {
    require_summable(t, "all_reduce");
    const nccl_wire w = wire_of(t, count);
    check_collective(be, ncclAllReduce(buf, buf, w.count, w.type, ncclSum, c->comm, s->stream), "ncclAllReduce", c,
                     __LINE__);
}

static void cuda_all_to_all(fsdp_backend *be, fsdp_comm *c, const void *send, void *recv, size_t count,
                            fsdp_dtype t, fsdp_stream *s) {
    const nccl_wire w = wire_of(t, count);
    check_collective(be, ncclAlltoAll(send, recv, w.count, w.type, c->comm, s->stream), "ncclAlltoAll", c, __LINE__);
}

/* ---- lifetime ---- */

static void cuda_destroy(fsdp_backend *be) {
    cuda_context *im = cuda_of(be);
    FSDP_CHECK_CUDA(cudaDeviceSynchronize());
#if FSDP_HAVE_CUDNN
    fsdp_cuda_cudnn_destroy(be);
#endif
    fsdp_cuda_matmul_destroy(be);
    if (im->scratch) cuda_free(be, im->scratch);
    if (im->lt_workspace) cuda_free(be, im->lt_workspace);
    FSDP_CHECK_CUBLAS(cublasLtDestroy(im->lt));
    FSDP_CHECK_CUBLAS(cublasDestroy(im->blas));
    cuda_stream_destroy(be, be->compute);
    free(im);
    free(be);
}

/* Dense bf16 tensor-core peak of the parts MFU is quoted against. */
static double peak_tflops(const struct cudaDeviceProp *p) {
    if (p->major == 9 && p->minor == 0 && (strstr(p->name, "H100") || strstr(p->name, "H200"))) {
        /* SXM parts (132 SMs) are 989; the PCIe H100 (114 SMs) 756. */
        return p->multiProcessorCount >= 132 ? 989.0 : 756.0;
    }
    return 0.0;
}

/* ---- the interface tables (the ops table is in cuda_ops.c) ---- */

static const fsdp_backend_runtime cuda_runtime = {
    .dtype_size = cuda_dtype_size,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memory_info = cuda_memory_info,
    .reserve_scratch = cuda_reserve_scratch,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .zero = cuda_zero,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .stream_synchronize = cuda_stream_synchronize,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .destroy = cuda_destroy,
};

static const fsdp_backend_collectives cuda_collectives = {
    .comm_create = cuda_comm_create,
    .comm_destroy = cuda_comm_destroy,
    .alloc_shared = cuda_alloc_shared,
    .all_gather = cuda_all_gather,
    .reduce_scatter = cuda_reduce_scatter,
    .all_reduce = cuda_all_reduce,
    .all_to_all = cuda_all_to_all,
};

fsdp_backend *fsdp_backend_cuda_create(const fsdp_backend_options *opts, fsdp_err *err) {
    int count = 0;
    FSDP_CHECK_CUDA(cudaGetDeviceCount(&count));
    if (opts->local_size > count) {
        fsdp_errf(err, "%d ranks on this node but only %d GPU(s): run one rank per GPU", opts->local_size, count);
        return NULL;
    }
    /* The kernels need sm_80 (bf16 tensor cores, cp.async); the binary carries sm_80 and sm_90a code
     * and the driver loads the one that fits this GPU, so Hopper-only code runs only on Hopper. */
    int major = 0, minor = 0, device = opts->local_rank % count;
    FSDP_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FSDP_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major < 8) {
        fsdp_errf(err, "GPU %d has compute capability %d.%d; the CUDA backend needs 8.0 or newer (A100, H100)",
                  device, major, minor);
        return NULL;
    }
    fsdp_backend *be = fsdp_xcalloc(1, sizeof *be, "the CUDA backend");
    cuda_context *im = fsdp_xcalloc(1, sizeof *im, "the CUDA backend");
    be->context = im;
    im->device = opts->local_rank % count;
    FSDP_CHECK_CUDA(cudaSetDevice(im->device));
    FSDP_CHECK_CUDA(cudaGetDeviceProperties(&im->prop, im->device));
    (void)fsdp_env_sync_timeout_s(); /* a malformed FSDP_SYNC_TIMEOUT fails here, not at the first wait */
    im->tf32 = fsdp_env_tf32();

    be->name = "cuda";
    snprintf(be->device_name, sizeof be->device_name, "%s", im->prop.name);
    be->peak_tflops = peak_tflops(&im->prop);
    be->act_dtype = opts->act_dtype;
    be->grad_dtype = opts->grad_dtype;
    be->emulated_bf16 = 0;
    /* cuBLASLt's FP8 kernels need FP8 tensor cores: compute capability 8.9 (Ada) or 9.0 (Hopper) on. */
    be->fp8_products = im->prop.major * 10 + im->prop.minor >= 89;
    if (!be->fp8_products)
        snprintf(be->fp8_unavailable, sizeof be->fp8_unavailable,
                 "%.48s (sm_%d%d) has no FP8 tensor cores (FP8 needs sm_89 or newer)",
                 im->prop.name, im->prop.major, im->prop.minor);
    be->kind = FSDP_DEVICE_CUDA;
    be->memory_limit = opts->memory_limit;

    be->runtime = &cuda_runtime;
    be->coll = &cuda_collectives;
    be->ops = &fsdp_cuda_ops;

    be->compute = cuda_stream_create(be, "compute");
    FSDP_CHECK_CUBLAS(cublasLtCreate(&im->lt));
    FSDP_CHECK_CUBLAS(cublasCreate(&im->blas));
    im->lt_workspace_bytes = FSDP_CUDA_LT_WORKSPACE_BYTES;
    im->lt_workspace = cuda_alloc(be, im->lt_workspace_bytes, "the cuBLASLt workspace");
    fsdp_cuda_matmul_init(be);
    be->outside_at_create = outside_now(be);
    return be;
}
