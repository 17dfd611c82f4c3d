/* Fitting a run into memory: the budget, --mbs auto, --global-batch, the agreed out-of-memory of a
 * set-up and its step down, and the one line an out-of-memory prints (trainer.h: fsdp_fit_*).
 *
 * Every buffer the trainer, the engine, the model and the backend need is allocated while the run
 * is set up (the op scratch and the gradient-row buffers included), so that a step allocates
 * nothing of fsdp.c's own. During the set-up the backend defers out-of-memory failures (fsdp_oom):
 * the set-up runs to its end on every rank, the ranks agree, and --mbs auto builds again with a
 * smaller micro-batch. After it, an allocation that fails (NCCL and cuBLAS allocate their own
 * buffers during the first steps, outside these) goes through the hook installed here: one line
 * with the plan and what would fit, then every rank stops. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "../base/agree.h"
#include "../base/env.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "link_plan.h"
#include "trainer.h"

size_t fsdp_fit_backend_limit(const fsdp_trainer *t) {
    int rank = -1;
    double gib = 0.0;
    if (!fsdp_env_test_memory_limit(&rank, &gib)) return t->opt.memory_limit;
    return rank == t->topo.rank ? (size_t)(gib * (double)(1u << 30)) : t->opt.memory_limit;
}

static fsdp_plan_place place_of(const fsdp_trainer *t) {
    fsdp_plan_place p = {t->be->kind, t->topo.world, t->topo.node_size};
    return p;
}

/* The memory each rank may use: --memory-limit, or the GPU's when smaller or not given; the smallest
 * over the ranks, 0 when some rank does not know it (the CPU backend without a limit). */
static size_t agreed_budget(fsdp_trainer *t) {
    unsigned long long mine = t->opt.memory_limit;
    if (t->be->kind == FSDP_DEVICE_CUDA) {
        size_t free_b = 0, total = 0;
        t->be->runtime->memory_info(t->be, &free_b, &total);
        if (!mine || total < mine) mine = total;
    }
    fsdp_mpi_allreduce(&mine, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, t->world, "the memory budget of every rank");
    return (size_t)mine;
}

static int largest_mbs(const fsdp_trainer *t, const fsdp_train_options *o, const fsdp_plan_place *place,
                       int max_mbs, fsdp_memory_plan *at) {
    int per_rank = o->global_batch > 0 ? o->global_batch / place->world : 0;
    return fsdp_memory_plan_largest_mbs(&t->cfg, o, place, t->fit_budget, max_mbs, per_rank, at);
}

/* "what fits in B GiB per GPU: --mbs 12; --strategy FULL with --mbs 14; --recompute selective; FULL on 4
 * GPUs with --mbs 16". */
static void advice(const fsdp_trainer *t, char *buf, size_t cap) {
    const fsdp_train_options *o = &t->opt;
    fsdp_plan_place place = place_of(t);
    fsdp_memory_plan p;
    char b[32];
    buf[0] = 0;
    if (!t->fit_budget) return; /* no size to fit into */
    size_t used = (size_t)snprintf(buf, cap, "what fits in %s per %s:", fsdp_bytes_text((double)t->fit_budget, b),
                                   fsdp_trainer_per_what(t));
    int any = 0;
    int smaller = o->mbs > 1 ? largest_mbs(t, o, &place, o->mbs - 1, &p) : 0;
    if (smaller && used < cap) used += (size_t)snprintf(buf + used, cap - used, " --mbs %d", smaller), any = 1;
    if (o->strategy != FSDP_FULL && place.world > 1) {
        fsdp_train_options full = *o;
        full.strategy = FSDP_FULL;
        int m = largest_mbs(t, &full, &place, o->mbs, &p);
        if (m > smaller && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s --strategy FULL with --mbs %d", any ? ";" : "", m), any = 1;
    }
    /* Activation recomputation: the lightest mode beyond the run's that takes this micro-batch, or
     * else the larger micro-batch that full recomputation takes. */
    if (o->recompute != FSDP_RECOMPUTE_FULL) {
        static const fsdp_recompute modes[] = {FSDP_RECOMPUTE_SELECTIVE, FSDP_RECOMPUTE_FULL};
        int best = 0;
        fsdp_recompute mode = FSDP_RECOMPUTE_FULL;
        for (int i = 0; i < 2 && best < o->mbs; i++) {
            if (modes[i] <= o->recompute) continue;
            fsdp_train_options r = *o;
            r.recompute = modes[i];
            int m = largest_mbs(t, &r, &place, o->mbs, &p);
            if (m > best) best = m, mode = modes[i];
        }
        if (best == o->mbs && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s --recompute %s", any ? ";" : "",
                                     fsdp_recompute_name(mode)), any = 1;
        else if (best > smaller && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s --recompute %s with --mbs %d", any ? ";" : "",
                                     fsdp_recompute_name(mode), best), any = 1;
    }
    for (int gpus = place.world * 2; gpus <= 1024; gpus *= 2) {
        fsdp_train_options full = *o;
        full.strategy = FSDP_FULL;
        fsdp_plan_place more = {place.device, gpus, gpus};
        int m = largest_mbs(t, &full, &more, o->mbs, &p);
        if (m == o->mbs) { /* the fewest GPUs that take this micro-batch */
            if (used < cap)
                used += (size_t)snprintf(buf + used, cap - used, "%s FULL on %d %ss with --mbs %d", any ? ";" : "", gpus,
                                         fsdp_trainer_per_what(t), m);
            any = 1;
            break;
        }
    }
    if (!any && used < cap) snprintf(buf + used, cap - used, " nothing on up to 1024 %ss", fsdp_trainer_per_what(t));
}

/* The next micro-batch above mbs that --mbs auto could take (one dividing the --global-batch per
 * rank), or 0. */
static int next_candidate(const fsdp_train_options *o, int world, int mbs) {
    if (o->global_batch <= 0) return mbs + 1;
    int per_rank = o->global_batch / world;
    for (int m = mbs + 1; m <= per_rank; m++)
        if (per_rank % m == 0) return m;
    return 0;
}

/* --strategy auto: the fastest row of the plan's table (link_plan.h) that fits, varying the reduce and
 * gather dtypes and the accumulation where their flags were not given (as fsdp plan does); with --mbs
 * auto each row at the largest micro-batch it fits. One line says what it chose and why. Every rank
 * computes the same table from the same agreed inputs. The backend was made with the gradient dtype of
 * the options before the choice: it follows the chosen reduce dtype. */
static int choose_strategy(fsdp_trainer *t, const fsdp_plan_place *place, fsdp_err *err) {
    fsdp_train_options *o = &t->opt;
    int nodes = t->topo.num_nodes;
    if (nodes > 1 && o->link_gbps <= 0.0)
        return fsdp_usagef(err, "--strategy auto on %d nodes needs --link-gbps: the bus bandwidth per GPU between "
                                "them (NCCL's busbw; NDR200 InfiniBand about 25)", nodes);
    fsdp_link link = {nodes, o->link_gbps, o->intra_gbps, 0.0};
    fsdp_rates rates = {o->auto_tflops, o->auto_update_gbps, o->auto_interference, o->auto_gather_interference};
    /* hpZ's secondary group is the node: only where every node has the same ranks (reshard.c). */
    fsdp_link_choices ch = {.strategies = 1, .reduce_dtypes = o->auto_vary_reduce, .gather_dtypes = o->auto_vary_gather,
                            .accumulate = o->auto_vary_accumulate, .reshard = t->topo.uniform_nodes,
                            .budget = t->fit_budget};
    if (o->mbs_auto && !t->fit_budget)
        return fsdp_usagef(err, "--mbs auto on the CPU backend needs --memory-limit GiB (the memory each rank may use)");
    fsdp_link_table table;
    fsdp_link_table_build(&t->cfg, o, place, &link, &rates, &ch, &table);
    const fsdp_link_row *best = fsdp_link_table_best(&table);
    if (!best) {
        fsdp_link_table_free(&table);
        char b[32];
        return fsdp_errf(err, "--strategy auto: no strategy fits in %s per %s", fsdp_bytes_text((double)t->fit_budget, b),
                         fsdp_trainer_per_what(t));
    }
    char others[512] = "", on[96], name[160], other[160];
    size_t used = 0;
    for (int i = 1; i < table.n && used < sizeof others; i++) {
        const fsdp_link_row *r = &table.rows[i];
        if (i > 3) break; /* the next three say enough; fsdp plan prints them all */
        fsdp_link_row_name(r, other, sizeof other);
        int n = r->fits == 0 ? snprintf(others + used, sizeof others - used, "%s %s does not fit", i > 1 ? ";" : "", other)
                             : snprintf(others + used, sizeof others - used, "%s %s %.0f", i > 1 ? ";" : "", other,
                                        r->time.tokens_per_s_per_gpu);
        used += n > 0 ? (size_t)n : 0;
    }
    if (nodes > 1) snprintf(on, sizeof on, "%d nodes, %g GB/s per GPU between them", nodes, o->link_gbps);
    else snprintf(on, sizeof on, "one node, %g GB/s per GPU inside it (NVLink-class)", o->intra_gbps);
    fsdp_link_row_name(best, name, sizeof name);
    fsdp_log("strategy: --strategy auto chose %s at micro-batch %d: %.0f tokens/s/%s predicted on %s (%s; next:%s); "
             "compute %.4g TFLOP/s, %s\n",
             name, best->o.mbs, best->time.tokens_per_s_per_gpu, fsdp_trainer_per_what(t),
             on, best->time.exposed_ms > 0.05 * best->time.step_ms ? "communication partly exposed" : "communication hidden",
             table.n > 1 ? others : " none", rates.tflops, o->auto_rate_source);
    o->strategy = best->o.strategy;
    o->reduce_dtype = best->o.reduce_dtype, o->gather_dtype = best->o.gather_dtype, o->accumulate = best->o.accumulate;
    o->reshard_after_forward = best->o.reshard_after_forward; /* the node's ranks, or 0 */
    t->be->grad_dtype = fsdp_plan_grad_dtype(o);
    fsdp_link_table_free(&table);
    return 0;
}

int fsdp_fit_choose(fsdp_trainer *t, fsdp_err *err) {
    fsdp_train_options *o = &t->opt;
    fsdp_plan_place place = place_of(t);
    int world = place.world;
    t->fit_budget = agreed_budget(t);
    if (o->strategy_auto && t->step_downs == 0 && choose_strategy(t, &place, err)) return -1;
    if (o->global_batch > 0 && o->global_batch % world)
        return fsdp_usagef(err, "--global-batch %d is not a multiple of the %d ranks", o->global_batch, world);
    if (o->mbs_auto && t->step_downs == 0) {
        if (!t->fit_budget)
            return fsdp_usagef(err, "--mbs auto on the CPU backend needs --memory-limit GiB (the memory each rank "
                                    "may use)");
        fsdp_memory_plan best, next;
        int mbs = largest_mbs(t, o, &place, fsdp_memory_plan_max_mbs(o->seq), &best);
        if (!mbs) {
            char line[512], adv[320];
            fsdp_train_options one = *o;
            one.mbs = 1;
            fsdp_memory_plan_compute(&t->cfg, &one, &place, &best);
            fsdp_memory_plan_line(&best, line, sizeof line);
            o->mbs = 1;
            advice(t, adv, sizeof adv);
            char b[32];
            return fsdp_errf(err, "--mbs auto: not even a micro-batch of 1%s fits in %s per %s (%s); %s",
                             o->global_batch ? " dividing the --global-batch" : "",
                             fsdp_bytes_text((double)t->fit_budget, b), fsdp_trainer_per_what(t), line, adv);
        }
        o->mbs = mbs;
        fsdp_train_options up = *o;
        up.mbs = next_candidate(o, world, mbs);
        if (up.mbs) fsdp_memory_plan_compute(&t->cfg, &up, &place, &next);
        char b[32], r[32], out[48] = "", n[32];
        if (best.outside) {
            char x[32];
            snprintf(out, sizeof out, " + %s outside it", fsdp_bytes_text((double)best.outside, x));
        }
        char then[64] = "";
        if (up.mbs) snprintf(then, sizeof then, "; %d would need %s", up.mbs, fsdp_bytes_text((double)next.total, n));
        fsdp_log("micro-batch: --mbs auto chose %d, the largest %sthe memory plan fits in %s per %s (%s reserved by "
                 "fsdp.c%s)%s\n",
                 mbs, o->global_batch ? "dividing the --global-batch that " : "",
                 fsdp_bytes_text((double)t->fit_budget, b), fsdp_trainer_per_what(t), fsdp_bytes_text((double)best.reserved, r), out,
                 then);
    }
    if (o->global_batch > 0) {
        if (o->global_batch % (o->mbs * world))
            return fsdp_usagef(err, "--global-batch %d is not a multiple of --mbs %d x %d ranks = %d (%d / %d = %.2f)",
                               o->global_batch, o->mbs, world, o->mbs * world, o->global_batch, o->mbs * world,
                               (double)o->global_batch / (o->mbs * world));
        o->grad_accum = o->global_batch / (o->mbs * world);
    }
    fsdp_memory_plan_compute(&t->cfg, o, &place, &t->plan);
    return 0;
}

static void oom_hook(fsdp_backend *be, size_t bytes, const char *what, const char *detail, void *arg) {
    fsdp_trainer *t = arg;
    char line[512], adv[320];
    fsdp_memory_plan_line(&t->plan, line, sizeof line);
    advice(t, adv, sizeof adv);
    char size[48];
    fsdp_fatal("out of %s memory at step %d%s for %s (%s): the plan for --mbs %d: %s; %s",
               be->kind == FSDP_DEVICE_CUDA ? "GPU" : "device", t->step + 1, fsdp_oom_amount_text(bytes, size), what,
               detail, t->opt.mbs, line, adv);
}

/* On a GPU, what NCCL and cuBLAS still allocate in the first steps is held to the plan too: the
 * set-up counts as out of memory when less is left than the plan's estimate of the memory outside
 * fsdp.c still expects. --mbs auto then steps down here, and an explicit --mbs that does not fit
 * stops with the agreed one line, rather than NCCL failing inside a collective of the first step
 * on every rank at once (one message per rank, then MPI_Abort's banner). The estimate is the one
 * `fsdp plan` fits with: when the set-up reserved what the plan says, a run refused here is one the
 * plan says does not fit. */
static void hold_outside_to_plan(fsdp_trainer *t) {
    fsdp_backend *be = t->be;
    if (be->kind != FSDP_DEVICE_CUDA || be->oom.failures) return;
    size_t free_b = 0, total = 0;
    be->runtime->memory_info(be, &free_b, &total);
    size_t used = total - free_b, outside = used > be->reserved_bytes ? used - be->reserved_bytes : 0;
    size_t room = free_b;
    if (be->memory_limit) room = be->memory_limit > used ? be->memory_limit - used : 0;
    if (room > free_b) room = free_b;
    size_t still = t->plan.outside > outside ? t->plan.outside - outside : 0;
    if (room >= still) return;
    char detail[192], f[32], o[32];
    snprintf(detail, sizeof detail, "%s left on the GPU, %s already in use outside fsdp.c",
             fsdp_bytes_text((double)room, f), fsdp_bytes_text((double)outside, o));
    be->oom.deferred = 1;
    fsdp_backend_out_of_memory(be, still, "the rest of the plan's estimate for NCCL and cuBLAS", detail);
}

int fsdp_fit_check_setup(fsdp_trainer *t, fsdp_err *err) {
    fsdp_backend *be = t->be;
    hold_outside_to_plan(t);
    if (be->oom.failures) {
        char line[512], adv[320];
        fsdp_memory_plan_line(&t->plan, line, sizeof line);
        advice(t, adv, sizeof adv);
        char size[48];
        fsdp_errf(err, "out of %s memory on rank %d%s for %s (%s): the plan for --mbs %d: %s; %s",
                  be->kind == FSDP_DEVICE_CUDA ? "GPU" : "device", t->topo.rank,
                  fsdp_oom_amount_text(be->oom.bytes, size), be->oom.what, be->oom.detail, t->opt.mbs, line, adv);
    }
    if (fsdp_agree(t->world, err)) {
        t->oom_at_setup = 1;
        return -1;
    }
    be->oom.deferred = 0;
    be->oom.hook = oom_hook;
    be->oom.hook_arg = t;
    return 0;
}

int fsdp_fit_step_down(fsdp_trainer *t, const char *reason) {
    const fsdp_train_options *o = &t->opt;
    if (!o->mbs_auto || !t->oom_at_setup) return 0;
    int per_rank = o->global_batch > 0 ? o->global_batch / t->topo.world : 0;
    int next = o->mbs - 1;
    while (next >= 1 && per_rank && per_rank % next) next--;
    if (next < 1) return 0;
    fsdp_log("micro-batch: %d ran out of memory while the run was set up, although the plan said it fits (%s); "
             "building it again with %d\n", o->mbs, reason, next);
    return next;
}
