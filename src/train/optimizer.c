/* AdamW and its state (optimizer.h). */
#include "optimizer.h"

#include <stdlib.h>

#include "../base/error.h"

struct fsdp_optimizer {
    fsdp_backend *be;
    fsdp_dtype master_dtype, compute_dtype;
    size_t me, ce;   /* bytes per master / compute element */
    int num_units;
    int64_t *offset; /* per unit: where its shard's state starts (fsdp_shard_view.offset) */
    void *m, *v;     /* first and second moments, one allocation each */
};

size_t fsdp_optimizer_memory_plan(int64_t total_shard, fsdp_dtype master_dtype, fsdp_device_kind kind) {
    size_t moment = (size_t)total_shard * fsdp_device_dtype_size(kind, master_dtype);
    return 2 * fsdp_device_alloc_size(kind, moment);
}

fsdp_optimizer *fsdp_optimizer_create(fsdp_backend *be, const fsdp_engine *eng) {
    fsdp_shard_extent x = fsdp_engine_extent(eng);
    fsdp_optimizer *opt = fsdp_xcalloc(1, sizeof *opt, "the optimizer");
    opt->be = be;
    opt->master_dtype = x.master_dtype;
    opt->compute_dtype = x.compute_dtype;
    opt->me = be->runtime->dtype_size(be, x.master_dtype);
    opt->ce = be->runtime->dtype_size(be, x.compute_dtype);
    opt->num_units = x.num_units;
    opt->offset = fsdp_xmalloc((size_t)x.num_units * sizeof(int64_t), "the optimizer's units");
    for (int u = 0; u < x.num_units; u++) opt->offset[u] = fsdp_engine_view(eng, u).offset;
    size_t reserved_before = be->reserved_bytes;
    size_t bytes = (size_t)x.total * opt->me;
    opt->m = be->runtime->alloc(be, bytes, "Adam first moments");
    opt->v = be->runtime->alloc(be, bytes, "Adam second moments");
    /* The memory plans count with the same function; this keeps them honest. */
    size_t plan = fsdp_optimizer_memory_plan(x.total, x.master_dtype, be->kind);
    if (!be->oom.failures && be->reserved_bytes - reserved_before != plan)
        fsdp_fatal("internal error: the optimizer allocated %zu bytes, its memory plan says %zu",
                   be->reserved_bytes - reserved_before, plan);
    return opt;
}

void fsdp_optimizer_destroy(fsdp_optimizer *opt) {
    if (!opt) return;
    opt->be->runtime->free(opt->be, opt->m);
    opt->be->runtime->free(opt->be, opt->v);
    free(opt->offset);
    free(opt);
}

fsdp_optimizer_state fsdp_optimizer_unit_state(const fsdp_optimizer *opt, int unit) {
    size_t at = (size_t)opt->offset[unit] * opt->me;
    fsdp_optimizer_state s = {(char *)opt->m + at, (char *)opt->v + at};
    return s;
}

void fsdp_optimizer_grad_sumsq(fsdp_engine *eng, const fsdp_optimizer_scalars *sc) {
    fsdp_engine_grad_sumsq(eng, sc->sumsq);
}

/* One step's arguments, for the update of each shard. */
typedef struct {
    fsdp_optimizer *opt;
    const fsdp_adamw_args *args;
    const float *scale;
} adamw_step;

static void adamw_unit(void *ctx, int u, const fsdp_shard_view *v) {
    const adamw_step *step = ctx;
    const fsdp_optimizer *opt = step->opt;
    fsdp_backend *be = opt->be;
    fsdp_dtype master_dtype = opt->master_dtype, compute_dtype = opt->compute_dtype;
    size_t me = opt->me, ce = opt->ce;
    fsdp_optimizer_state s = fsdp_optimizer_unit_state(opt, u);
    fsdp_adamw_args no_decay = *step->args;
    no_decay.weight_decay = 0.0f;
    /* The update writes the compute-dtype copy that gathers send, unless it is the master itself. */
    char *working = v->working == v->master ? NULL : v->working;
    if (v->decay_len > 0)
        be->ops->adamw(be, v->master, v->grad, s.m, s.v, master_dtype, (size_t)v->decay_len, step->args, step->scale,
                       working, compute_dtype, be->compute);
    if (v->len > v->decay_len) {
        size_t off = (size_t)v->decay_len;
        be->ops->adamw(be, (char *)v->master + off * me, (char *)v->grad + off * me, (char *)s.m + off * me,
                       (char *)s.v + off * me, master_dtype, (size_t)(v->len - v->decay_len), &no_decay, step->scale,
                       working ? working + off * ce : NULL, compute_dtype, be->compute);
    }
}

void fsdp_optimizer_update(fsdp_optimizer *opt, fsdp_engine *eng, const fsdp_adamw_args *args, float max_grad_norm,
                           const fsdp_optimizer_scalars *sc) {
    fsdp_backend *be = opt->be;
    be->ops->clip_scale(be, sc->scale, sc->sumsq, max_grad_norm, be->compute);
    adamw_step step = {opt, args, sc->scale};
    fsdp_engine_update_shards(eng, adamw_unit, &step);
}
