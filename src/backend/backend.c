/* Picks a backend by name. */
#include <string.h>

#include "backend.h"

#ifndef FSDP_HAVE_CUDA
int fsdp_backend_cuda_available(void) { return 0; }
#endif

fsdp_backend *fsdp_backend_create(const fsdp_backend_options *opts, fsdp_err *err) {
    const char *kind = opts->kind ? opts->kind : "auto";
    if (!strcmp(kind, "cpu")) return fsdp_backend_cpu_create(opts, err);
    if (!strcmp(kind, "cuda")) {
#ifdef FSDP_HAVE_CUDA
        if (!fsdp_backend_cuda_available()) {
            fsdp_errf(err, "--device cuda: no CUDA GPU is visible");
            return NULL;
        }
        return fsdp_backend_cuda_create(opts, err);
#else
        fsdp_errf(err, "--device cuda: this build has no CUDA backend (configure with -DFSDP_CUDA=ON)");
        return NULL;
#endif
    }
    if (!strcmp(kind, "auto")) {
#ifdef FSDP_HAVE_CUDA
        if (fsdp_backend_cuda_available()) return fsdp_backend_cuda_create(opts, err);
#endif
        return fsdp_backend_cpu_create(opts, err);
    }
    fsdp_errf(err, "unknown device '%s' (auto, cpu, cuda)", kind);
    return NULL;
}
