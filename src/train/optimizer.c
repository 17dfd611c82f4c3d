#include "optimizer.h"

void fsdp_optimizer_step(fsdp_backend *be, fsdp_engine *eng, int num_units, fsdp_dtype master_dtype,
                         fsdp_dtype compute_dtype, const fsdp_adamw_args *args, float max_grad_norm,
                         const fsdp_optimizer_scalars *sc) {
    fsdp_optimizer_grad_sumsq(eng, sc);
    fsdp_optimizer_update(be, eng, num_units, master_dtype, compute_dtype, args, max_grad_norm, sc);
}

void fsdp_optimizer_grad_sumsq(fsdp_engine *eng, const fsdp_optimizer_scalars *sc) { fsdp_engine_grad_sumsq(eng, sc->sumsq); }

void fsdp_optimizer_update(fsdp_backend *be, fsdp_engine *eng, int num_units, fsdp_dtype master_dtype,
                           fsdp_dtype compute_dtype, const fsdp_adamw_args *args, float max_grad_norm,
                           const fsdp_optimizer_scalars *sc) {
    be->ops->clip_scale(be, sc->scale, sc->sumsq, max_grad_norm, be->compute);
    fsdp_adamw_args no_decay = *args;
    no_decay.weight_decay = 0.0f;
    size_t me = be->runtime->dtype_size(be, master_dtype), ce = be->runtime->dtype_size(be, compute_dtype);
    for (int u = 0; u < num_units; u++) {
        fsdp_shard_view v = fsdp_engine_view(eng, u);
        /* The update writes the compute-dtype copy that gathers send, unless it is the master itself. */
        char *working = v.working == v.master ? NULL : v.working;
        if (v.decay_len > 0)
            be->ops->adamw(be, v.master, v.grad, v.m, v.v, master_dtype, (size_t)v.decay_len, args, sc->scale, working,
                           compute_dtype, be->compute);
        if (v.len > v.decay_len) {
            size_t off = (size_t)v.decay_len;
            be->ops->adamw(be, (char *)v.master + off * me, (char *)v.grad + off * me, (char *)v.m + off * me,
                           (char *)v.v + off * me, master_dtype, (size_t)(v.len - v.decay_len), &no_decay, sc->scale,
                           working ? working + off * ce : NULL, compute_dtype, be->compute);
        }
        fsdp_engine_unit_updated(eng, u);
    }
    fsdp_engine_params_updated(eng);
}
