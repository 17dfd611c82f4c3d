/* cuDNN's backend graph API, loaded at run time (cuda_cudnn_graph.c): what `--attn cudnn` runs on.
 *
 * Why cuDNN and why loaded: on Hopper its fused attention kernels (wgmma, TMA) run the causal
 * forward and backward 2-2.6x faster than fsdp.c's mma.sync flash kernels (bench/results,
 * 2026-11-27 attention-s4096); nothing short of a Hopper-native kernel closes that, and cuDNN is
 * the library that has one. It is loaded with dlopen, so the binary starts and every other path
 * runs where libcudnn.so.9 is absent; only `--attn cudnn` needs it, and says so in one line.
 *
 * The graph API is plain C (cudnnBackend* calls on descriptors); this module wraps it in a builder
 * that records the first failing call (its step, cuDNN's status and last error text) so a graph is
 * written as straight-line code and checked once. Built only where cudnn_graph.h was found
 * (FSDP_HAVE_CUDNN). */
#ifndef FSDP_BACKEND_CUDA_CUDNN_GRAPH_H
#define FSDP_BACKEND_CUDA_CUDNN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <cudnn_graph.h>

/* The library's entry points fsdp.c uses. */
typedef struct {
    size_t (*get_version)(void);
    const char *(*get_error_string)(cudnnStatus_t);
    void (*get_last_error_string)(char *, size_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*create_descriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                   int64_t, const void *);
    cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                   int64_t, int64_t *, void *);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
    char path[256]; /* the file the loader found (several cuDNN 9 copies are common on one machine) */
} fsdp_cudnn_api;

/* The loaded library (once per process; FSDP_CUDNN_LIBRARY names another file than libcudnn.so.9),
 * or NULL with why (one line) when it cannot be loaded or is older than 9.0. */
const fsdp_cudnn_api *fsdp_cudnn_load(char *why, size_t why_size);

/* A graph under construction: every descriptor it creates (destroyed with it but the ones handed
 * out with fsdp_cudnn_keep) and the first failure. */
#define FSDP_CUDNN_MAX_DESCRIPTORS 192
typedef struct {
    const fsdp_cudnn_api *api;
    cudnnBackendDescriptor_t made[FSDP_CUDNN_MAX_DESCRIPTORS];
    int count;
    int64_t next_uid;     /* of the next virtual tensor */
    size_t version;       /* the library's, cudnnGetVersion */
    cudnnStatus_t status; /* CUDNN_STATUS_SUCCESS until a call fails; later calls do nothing */
    char failure[384];    /* the failing step and cuDNN's words */
} fsdp_cudnn_build;

void fsdp_cudnn_build_init(fsdp_cudnn_build *g, const fsdp_cudnn_api *api);
/* Destroys every descriptor the build made. */
void fsdp_cudnn_build_free(fsdp_cudnn_build *g);
int fsdp_cudnn_ok(const fsdp_cudnn_build *g);

cudnnBackendDescriptor_t fsdp_cudnn_make(fsdp_cudnn_build *g, cudnnBackendDescriptorType_t type, const char *step);
void fsdp_cudnn_set(fsdp_cudnn_build *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                    cudnnBackendAttributeType_t type, int64_t count, const void *values, const char *step);
void fsdp_cudnn_finalize(fsdp_cudnn_build *g, cudnnBackendDescriptor_t d, const char *step);

/* Tensors: 4-d, [batch, heads, rows, columns] as cuDNN's attention graphs name them. Uids below
 * FSDP_CUDNN_FIRST_VIRTUAL_UID are the caller's (its data pointers); fsdp_cudnn_uid hands out the
 * rest. Alignment 16 bytes: every pointer bound to a tensor must be. */
#define FSDP_CUDNN_FIRST_VIRTUAL_UID 1000
typedef enum { FSDP_CUDNN_IN_MEMORY = 0, FSDP_CUDNN_VIRTUAL = 1, FSDP_CUDNN_BY_VALUE = 2 } fsdp_cudnn_binding;
cudnnBackendDescriptor_t fsdp_cudnn_tensor(fsdp_cudnn_build *g, int64_t uid, cudnnDataType_t type,
                                           const int64_t dims[4], const int64_t strides[4], fsdp_cudnn_binding binding);
/* A virtual tensor of the given type and dims, packed row-major, with the next free uid. */
cudnnBackendDescriptor_t fsdp_cudnn_virtual(fsdp_cudnn_build *g, cudnnDataType_t type, const int64_t dims[4]);
/* A virtual tensor with explicit strides (a transposed view), the next free uid. */
cudnnBackendDescriptor_t fsdp_cudnn_virtual_strided(fsdp_cudnn_build *g, cudnnDataType_t type, const int64_t dims[4],
                                                    const int64_t strides[4]);
/* A by-value fp32 scalar: its variant-pack pointer is a host float read at each execution. */
cudnnBackendDescriptor_t fsdp_cudnn_scalar(fsdp_cudnn_build *g, int64_t uid);

/* Operations. Pointwise: y = mode(x[, b[, t]]) (BINARY_SELECT: y = t ? x : b) at math precision
 * prec; axis only for GEN_INDEX. */
cudnnBackendDescriptor_t fsdp_cudnn_pointwise(fsdp_cudnn_build *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                              cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                              cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis);
/* y = op over the dims where y has extent 1 and x does not (fp32). */
cudnnBackendDescriptor_t fsdp_cudnn_reduction(fsdp_cudnn_build *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x,
                                              cudnnBackendDescriptor_t y);
/* c = a b over the last two dims (fp32 accumulation), batched over the first two; a's heads may
 * be a multiple of b's (grouped-query heads). */
cudnnBackendDescriptor_t fsdp_cudnn_matmul(fsdp_cudnn_build *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                           cudnnBackendDescriptor_t c);
/* y = x seen through y's dims and strides (how the graphs transpose P and dS). */
cudnnBackendDescriptor_t fsdp_cudnn_reshape(fsdp_cudnn_build *g, cudnnBackendDescriptor_t x,
                                            cudnnBackendDescriptor_t y);

/* An execution plan for the operations: the operation graph, cuDNN's heuristics (mode A, then the
 * fallback list) and the first engine configuration that finalizes. NULL with the build's failure
 * set when none does. The plan and what it references stay alive until fsdp_cudnn_build_free. */
cudnnBackendDescriptor_t fsdp_cudnn_plan(fsdp_cudnn_build *g, cudnnHandle_t handle, cudnnBackendDescriptor_t *ops,
                                         int n_ops, int64_t *workspace_bytes);

/* Runs a plan: data pointers by tensor uid, and the workspace. Returns the status (one line in
 * why_size bytes of why when it fails). */
cudnnStatus_t fsdp_cudnn_execute(const fsdp_cudnn_api *api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan, int n,
                                 const int64_t *uids, void *const *pointers, void *workspace, char *why,
                                 size_t why_size);

#endif
