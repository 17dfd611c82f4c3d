/* Picks a backend by name and checks its tables; the out-of-memory path both backends share. */
#include <stdio.h>
#include <string.h>

#include "../base/log.h"
#include "backend.h"

#ifndef FSDP_HAVE_CUDA
int fsdp_backend_cuda_available(void) { return 0; }
#endif

size_t fsdp_backend_gpu_memory(char *name, size_t name_cap) {
#ifdef FSDP_HAVE_CUDA
    if (fsdp_backend_cuda_available()) return fsdp_backend_cuda_gpu_memory(name, name_cap);
#endif
    if (name_cap) name[0] = 0;
    return 0;
}

void *fsdp_backend_out_of_memory(fsdp_backend *be, size_t bytes, const char *what, const char *detail) {
    fsdp_oom *o = &be->oom;
    if (o->deferred) {
        if (o->failures++ == 0) {
            o->bytes = bytes;
            snprintf(o->what, sizeof o->what, "%s", what);
            snprintf(o->detail, sizeof o->detail, "%s", detail);
        }
        return NULL;
    }
    if (o->hook) o->hook(be, bytes, what, detail, o->hook_arg);
    char size[48];
    fsdp_fatal("out of %s memory%s for %s (%s)", be->kind == FSDP_DEVICE_CUDA ? "GPU" : "device",
               fsdp_oom_amount_text(bytes, size), what, detail);
}

const char *fsdp_oom_amount_text(size_t bytes, char buf[48]) {
    char b[32];
    buf[0] = 0;
    if (bytes) snprintf(buf, 48, " allocating %s", fsdp_bytes_text((double)bytes, b));
    return buf;
}

/* A table is a struct of function pointers only, read here entry by entry: an entry a backend left
 * out of its designated initializers is NULL, and calling it would crash far from the cause. */
typedef void (*table_entry)(void);

static void check_table(const fsdp_backend *be, const char *table, const void *entries, size_t bytes) {
    _Static_assert(sizeof(fsdp_backend_runtime) % sizeof(table_entry) == 0, "the runtime table holds only functions");
    _Static_assert(sizeof(fsdp_backend_collectives) % sizeof(table_entry) == 0, "the collectives hold only functions");
    _Static_assert(sizeof(fsdp_backend_ops) % sizeof(table_entry) == 0, "the ops table holds only functions");
    for (size_t i = 0; i < bytes / sizeof(table_entry); i++) {
        table_entry f;
        memcpy(&f, (const char *)entries + i * sizeof f, sizeof f);
        if (!f) fsdp_fatal("internal error: entry %zu of the %s backend's %s table is missing", i, be->name, table);
    }
}

static fsdp_backend *checked(fsdp_backend *be) {
    if (!be) return NULL;
    check_table(be, "runtime", be->runtime, sizeof *be->runtime);
    check_table(be, "collectives", be->coll, sizeof *be->coll);
    check_table(be, "ops", be->ops, sizeof *be->ops);
    return be;
}

static fsdp_backend *create(const fsdp_backend_options *opts, fsdp_err *err) {
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

fsdp_backend *fsdp_backend_create(const fsdp_backend_options *opts, fsdp_err *err) {
    return checked(create(opts, err));
}
