/* cuDNN's graph API loaded at run time, and a builder over it (cuda_cudnn_graph.h). */
#define _GNU_SOURCE /* dladdr: which file the loader chose */
#include "cuda_cudnn_graph.h"

#include "../base/env.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fsdp_cudnn_api loaded;
static const fsdp_cudnn_api *loaded_api;
static char load_failure[320];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load_library(void) {
    const char *path = fsdp_env_cudnn_library();
    const char *name = path ? path : "libcudnn.so.9";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_failure, sizeof load_failure,
                 "cannot load %s (%s): install cuDNN 9 or put its lib directory on LD_LIBRARY_PATH "
                 "(FSDP_CUDNN_LIBRARY names the file)",
                 name, dlerror());
        return;
    }
    struct {
        const char *symbol;
        void **slot;
    } entries[] = {
        {"cudnnGetVersion", (void **)&loaded.get_version},
        {"cudnnGetErrorString", (void **)&loaded.get_error_string},
        {"cudnnGetLastErrorString", (void **)&loaded.get_last_error_string},
        {"cudnnCreate", (void **)&loaded.create},
        {"cudnnDestroy", (void **)&loaded.destroy},
        {"cudnnSetStream", (void **)&loaded.set_stream},
        {"cudnnBackendCreateDescriptor", (void **)&loaded.create_descriptor},
        {"cudnnBackendDestroyDescriptor", (void **)&loaded.destroy_descriptor},
        {"cudnnBackendSetAttribute", (void **)&loaded.set_attribute},
        {"cudnnBackendGetAttribute", (void **)&loaded.get_attribute},
        {"cudnnBackendFinalize", (void **)&loaded.finalize},
        {"cudnnBackendExecute", (void **)&loaded.execute},
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        *entries[i].slot = dlsym(lib, entries[i].symbol);
        if (!*entries[i].slot) {
            snprintf(load_failure, sizeof load_failure, "%s has no %s (cuDNN 9 is needed)", name, entries[i].symbol);
            return;
        }
    }
    Dl_info where;
    snprintf(loaded.path, sizeof loaded.path, "%s",
             dladdr((void *)loaded.get_version, &where) && where.dli_fname ? where.dli_fname : name);
    const size_t version = loaded.get_version();
    if (version < 90000) {
        snprintf(load_failure, sizeof load_failure, "%s is cuDNN %zu; fsdp.c needs 9.0 or newer", name, version);
        return;
    }
    loaded_api = &loaded;
}

const fsdp_cudnn_api *fsdp_cudnn_load(char *why, size_t why_size) {
    pthread_once(&load_once, load_library);
    if (!loaded_api && why) snprintf(why, why_size, "%s", load_failure);
    return loaded_api;
}

/* ---- the builder ---- */

void fsdp_cudnn_build_init(fsdp_cudnn_build *g, const fsdp_cudnn_api *api) {
    memset(g, 0, sizeof *g);
    g->api = api;
    g->status = CUDNN_STATUS_SUCCESS;
    g->next_uid = FSDP_CUDNN_FIRST_VIRTUAL_UID;
    g->version = api->get_version();
}

void fsdp_cudnn_build_free(fsdp_cudnn_build *g) {
    for (int i = g->count - 1; i >= 0; i--)
        g->api->destroy_descriptor(g->made[i]);
    g->count = 0;
}

int fsdp_cudnn_ok(const fsdp_cudnn_build *g) { return g->status == CUDNN_STATUS_SUCCESS; }

/* Records the first failure: the step, cuDNN's status and its last error message. */
static void fail(fsdp_cudnn_build *g, cudnnStatus_t st, const char *step) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    g->status = st;
    char last[256] = "";
    g->api->get_last_error_string(last, sizeof last);
    for (char *p = last; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    snprintf(g->failure, sizeof g->failure, "%s: %s%s%s", step, g->api->get_error_string(st), last[0] ? ": " : "",
             last);
}

cudnnBackendDescriptor_t fsdp_cudnn_make(fsdp_cudnn_build *g, cudnnBackendDescriptorType_t type, const char *step) {
    if (!fsdp_cudnn_ok(g)) return NULL;
    if (g->count == FSDP_CUDNN_MAX_DESCRIPTORS) {
        fail(g, CUDNN_STATUS_INTERNAL_ERROR, "internal error: the graph needs more than FSDP_CUDNN_MAX_DESCRIPTORS");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g->api->create_descriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, step);
        return NULL;
    }
    g->made[g->count++] = d;
    return d;
}

void fsdp_cudnn_set(fsdp_cudnn_build *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                    cudnnBackendAttributeType_t type, int64_t count, const void *values, const char *step) {
    if (!fsdp_cudnn_ok(g)) return;
    cudnnStatus_t st = g->api->set_attribute(d, name, type, count, values);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, step);
}

void fsdp_cudnn_finalize(fsdp_cudnn_build *g, cudnnBackendDescriptor_t d, const char *step) {
    if (!fsdp_cudnn_ok(g)) return;
    cudnnStatus_t st = g->api->finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, step);
}

static void set_desc(fsdp_cudnn_build *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char *step) {
    fsdp_cudnn_set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, step);
}

cudnnBackendDescriptor_t fsdp_cudnn_tensor(fsdp_cudnn_build *g, int64_t uid, cudnnDataType_t type,
                                           const int64_t dims[4], const int64_t strides[4],
                                           fsdp_cudnn_binding binding) {
    cudnnBackendDescriptor_t t = fsdp_cudnn_make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    const int64_t alignment = 16;
    const bool yes = true;
    fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dimensions");
    fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    if (binding == FSDP_CUDNN_VIRTUAL)
        fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual flag");
    if (binding == FSDP_CUDNN_BY_VALUE)
        fsdp_cudnn_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by-value flag");
    fsdp_cudnn_finalize(g, t, "tensor");
    return t;
}

cudnnBackendDescriptor_t fsdp_cudnn_virtual_strided(fsdp_cudnn_build *g, cudnnDataType_t type, const int64_t dims[4],
                                                    const int64_t strides[4]) {
    return fsdp_cudnn_tensor(g, g->next_uid++, type, dims, strides, FSDP_CUDNN_VIRTUAL);
}

cudnnBackendDescriptor_t fsdp_cudnn_virtual(fsdp_cudnn_build *g, cudnnDataType_t type, const int64_t dims[4]) {
    const int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    return fsdp_cudnn_virtual_strided(g, type, dims, strides);
}

cudnnBackendDescriptor_t fsdp_cudnn_scalar(fsdp_cudnn_build *g, int64_t uid) {
    const int64_t one[4] = {1, 1, 1, 1};
    return fsdp_cudnn_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, FSDP_CUDNN_BY_VALUE);
}

cudnnBackendDescriptor_t fsdp_cudnn_pointwise(fsdp_cudnn_build *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                              cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                              cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
    cudnnBackendDescriptor_t pw = fsdp_cudnn_make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    fsdp_cudnn_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    fsdp_cudnn_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        fsdp_cudnn_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    fsdp_cudnn_finalize(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = fsdp_cudnn_make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    const float alpha = 1.0f;
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise op x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise op y");
    if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise op b");
    if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise op t");
    fsdp_cudnn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, "pointwise alpha1");
    fsdp_cudnn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, "pointwise alpha2");
    fsdp_cudnn_finalize(g, op, "pointwise op");
    return op;
}

cudnnBackendDescriptor_t fsdp_cudnn_reduction(fsdp_cudnn_build *g, cudnnReduceTensorOp_t mode,
                                              cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = fsdp_cudnn_make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    const bool deterministic = false;
    fsdp_cudnn_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction precision");
    fsdp_cudnn_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
                   "reduction operator");
    if (g->version >= 91100) /* the attribute is 9.11's */
        fsdp_cudnn_set(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic,
                       "reduction determinism");
    fsdp_cudnn_finalize(g, rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = fsdp_cudnn_make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction op descriptor");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction op x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction op y");
    fsdp_cudnn_finalize(g, op, "reduction op");
    return op;
}

cudnnBackendDescriptor_t fsdp_cudnn_matmul(fsdp_cudnn_build *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                           cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t md = fsdp_cudnn_make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    fsdp_cudnn_set(g, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul precision");
    fsdp_cudnn_finalize(g, md, "matmul descriptor");
    cudnnBackendDescriptor_t op = fsdp_cudnn_make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul op a");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul op b");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul op c");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md, "matmul op descriptor");
    fsdp_cudnn_finalize(g, op, "matmul op");
    return op;
}

cudnnBackendDescriptor_t fsdp_cudnn_reshape(fsdp_cudnn_build *g, cudnnBackendDescriptor_t x,
                                            cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = fsdp_cudnn_make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape op x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape op y");
    fsdp_cudnn_finalize(g, op, "reshape op");
    return op;
}

/* The engine configurations a heuristics mode offers, in its order of preference (at most cap). */
static int engine_configs(fsdp_cudnn_build *g, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                          cudnnBackendDescriptor_t *cfgs, int cap) {
    cudnnBackendDescriptor_t heur = fsdp_cudnn_make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    fsdp_cudnn_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
                   "heuristics graph");
    fsdp_cudnn_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    fsdp_cudnn_finalize(g, heur, "engine heuristics");
    if (!fsdp_cudnn_ok(g)) return 0;
    int64_t n = 0;
    cudnnStatus_t st =
        g->api->get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, "heuristics results count");
        return 0;
    }
    if (n > cap) n = cap;
    for (int64_t i = 0; i < n; i++)
        cfgs[i] = fsdp_cudnn_make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    if (!fsdp_cudnn_ok(g) || n == 0) return 0;
    int64_t got = 0;
    st = g->api->get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, "heuristics results");
        return 0;
    }
    return (int)got;
}

cudnnBackendDescriptor_t fsdp_cudnn_plan(fsdp_cudnn_build *g, cudnnHandle_t handle, cudnnBackendDescriptor_t *ops,
                                         int n_ops, int64_t *workspace_bytes) {
    cudnnBackendDescriptor_t graph = fsdp_cudnn_make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    fsdp_cudnn_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    fsdp_cudnn_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, ops, "graph ops");
    fsdp_cudnn_finalize(g, graph, "operation graph");
    if (!fsdp_cudnn_ok(g)) return NULL;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char refusals[256] = "";
    for (int m = 0; m < 2; m++) {
        cudnnBackendDescriptor_t cfgs[16];
        const int n = engine_configs(g, graph, modes[m], cfgs, 16);
        if (!fsdp_cudnn_ok(g)) return NULL;
        for (int i = 0; i < n; i++) {
            cudnnBackendDescriptor_t plan =
                fsdp_cudnn_make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
            fsdp_cudnn_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i],
                           "plan engine config");
            if (!fsdp_cudnn_ok(g)) return NULL;
            const cudnnStatus_t st = g->api->finalize(plan); /* an engine may refuse: try the next */
            if (st != CUDNN_STATUS_SUCCESS) {
                if (!refusals[0]) {
                    char last[200] = "";
                    g->api->get_last_error_string(last, sizeof last);
                    snprintf(refusals, sizeof refusals, "%s %s", g->api->get_error_string(st), last);
                }
                continue;
            }
            int64_t ws = 0, got = 0;
            const cudnnStatus_t wst =
                g->api->get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
            if (wst != CUDNN_STATUS_SUCCESS) {
                fail(g, wst, "plan workspace size");
                return NULL;
            }
            *workspace_bytes = ws;
            return plan;
        }
    }
    fail(g, CUDNN_STATUS_NOT_SUPPORTED,
         refusals[0] ? "no engine finalizes the graph (first refusal below)"
                     : "cuDNN's heuristics offer no engine for the graph");
    if (refusals[0]) {
        const size_t used = strlen(g->failure);
        snprintf(g->failure + used, sizeof g->failure - used, "; %s", refusals);
    }
    return NULL;
}

cudnnStatus_t fsdp_cudnn_execute(const fsdp_cudnn_api *api, cudnnHandle_t handle, cudnnBackendDescriptor_t plan, int n,
                                 const int64_t *uids, void *const *pointers, void *workspace, char *why,
                                 size_t why_size) {
    cudnnBackendDescriptor_t pack = NULL;
    const char *step = "variant pack";
    cudnnStatus_t st = api->create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers);
    if (st == CUDNN_STATUS_SUCCESS)
        st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = api->finalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "cudnnBackendExecute";
        st = api->execute(handle, plan, pack);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[200] = "";
        api->get_last_error_string(last, sizeof last);
        snprintf(why, why_size, "%s: %s %s", step, api->get_error_string(st), last);
    }
    if (pack) api->destroy_descriptor(pack);
    return st;
}
