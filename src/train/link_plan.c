/* Ranking configurations by their predicted speed (link_plan.h). */
#include "link_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

static int strategy_applies(fsdp_strategy s, const fsdp_plan_place *p, int nodes) {
    if (p->world == 1) return s == FSDP_FULL;          /* one rank: every strategy is the same step */
    if (s == FSDP_HYBRID) return nodes > 1 && p->node_size > 1; /* else FULL or NO_SHARD itself */
    return 1;
}

static void add_row(const fsdp_model_config *cfg, const fsdp_train_options *o, const fsdp_plan_place *place,
                    const fsdp_link *link, const fsdp_rates *rates, size_t budget, int requested, fsdp_link_table *t) {
    fsdp_err err = {0};
    if (fsdp_plan_check_embed_rows("plan", o, place->world, &err)) return; /* rows cannot go with it */
    fsdp_link_row r;
    memset(&r, 0, sizeof r);
    r.o = *o;
    r.requested = requested;
    if (o->mbs_auto) {
        int per_rank = o->global_batch > 0 ? o->global_batch / place->world : 0;
        r.o.mbs = fsdp_memory_plan_largest_mbs(cfg, o, place, budget, fsdp_memory_plan_max_mbs(o->seq), per_rank, &r.mem);
        if (!r.o.mbs) return;
    }
    if (r.o.global_batch > 0) {
        if (r.o.global_batch % (r.o.mbs * place->world)) return;
        r.o.grad_accum = r.o.global_batch / (r.o.mbs * place->world);
    }
    fsdp_memory_plan_compute(cfg, &r.o, place, &r.mem);
    r.fits = budget ? r.mem.total <= budget : -1;
    fsdp_step_time_predict(cfg, &r.o, place, link, rates, &r.time);
    t->rows = realloc(t->rows, (size_t)(t->n + 1) * sizeof *t->rows);
    if (!t->rows) fsdp_fatal("out of host memory for the plan's table");
    t->rows[t->n++] = r;
}

static int faster(const fsdp_link_row *a, const fsdp_link_row *b) {
    int fa = a->fits != 0, fb = b->fits != 0;
    if (fa != fb) return fa > fb;
    return a->time.tokens_per_s_per_gpu > b->time.tokens_per_s_per_gpu * (1.0 + 1e-9);
}

void fsdp_link_table_build(const fsdp_model_config *cfg, const fsdp_train_options *base, const fsdp_plan_place *place,
                           const fsdp_link *link, const fsdp_rates *rates, const fsdp_link_choices *ch,
                           fsdp_link_table *out) {
    memset(out, 0, sizeof *out);
    static const fsdp_strategy all[] = {FSDP_FULL, FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_HYBRID};
    fsdp_dtype reduces[3] = {base->master_dtype, FSDP_BF16, FSDP_I8};
    fsdp_dtype gathers[2] = {base->compute_dtype, FSDP_I8};
    fsdp_accumulate accums[2] = {FSDP_ACCUMULATE_AUTO, FSDP_ACCUMULATE_LOCAL};
    int nr = ch->reduce_dtypes ? (base->master_dtype == FSDP_BF16 ? 2 : 3) : 1;
    int ng = ch->gather_dtypes && base->compute_dtype == FSDP_BF16 ? 2 : 1;
    int na = ch->accumulate && fsdp_plan_microbatches(base, place->world) > 1 ? 2 : 1;
    /* hpZ needs nodes of more than one rank (its secondary group is the node) and more than one node. */
    int hpz = link->nodes > 1 && place->node_size > 1 && place->node_size < place->world &&
              place->world % place->node_size == 0;
    int reshards[2] = {0, place->node_size};
    int nh = ch->reshard && hpz ? 2 : 1;
    if (nh == 1) reshards[0] = base->reshard_after_forward;
    if (!ch->reduce_dtypes) reduces[0] = base->reduce_dtype;
    if (!ch->gather_dtypes || ng == 1) gathers[0] = base->gather_dtype;
    if (!ch->accumulate || na == 1) accums[0] = base->accumulate;
    if (ch->reduce_dtypes && base->master_dtype == FSDP_BF16) reduces[1] = FSDP_I8;
    int requested_seen = 0;
    /* hpZ's rows after all the others: at a predicted tie (its inner gathers hidden, it sends across
     * nodes what SHARD_GRAD_OP sends) the configuration without the secondary copy ranks first. */
    for (int hi = 0; hi < nh; hi++)
        for (int si = 0; si < 4; si++) {
            fsdp_strategy s = all[si];
            if (ch->strategies ? !strategy_applies(s, place, link->nodes) : s != base->strategy) continue;
            if (hi > 0 && s != FSDP_FULL) continue;
            for (int ri = 0; ri < nr; ri++)
                for (int gi = 0; gi < ng; gi++)
                    for (int ai = 0; ai < na; ai++) {
                        fsdp_train_options o = *base;
                        o.strategy = s, o.reduce_dtype = reduces[ri], o.gather_dtype = gathers[gi];
                        o.accumulate = accums[ai], o.reshard_after_forward = s == FSDP_FULL ? reshards[hi] : 0;
                        /* Gathers exist only with a shard group; accumulating locally is FULL's choice. */
                        if (s == FSDP_NO_SHARD && gi > 0) continue;
                        if (s != FSDP_FULL && ai > 0) continue;
                        int req = s == base->strategy && o.reduce_dtype == base->reduce_dtype &&
                                  o.gather_dtype == base->gather_dtype && o.accumulate == base->accumulate &&
                                  o.reshard_after_forward == base->reshard_after_forward;
                        requested_seen |= req;
                        add_row(cfg, &o, place, link, rates, ch->budget, req, out);
                    }
        }
    if (!requested_seen) add_row(cfg, base, place, link, rates, ch->budget, 1, out);
    /* A stable insertion sort: a few dozen rows. */
    for (int i = 1; i < out->n; i++) {
        fsdp_link_row x = out->rows[i];
        int j = i - 1;
        while (j >= 0 && faster(&x, &out->rows[j])) out->rows[j + 1] = out->rows[j], j--;
        out->rows[j + 1] = x;
    }
}

void fsdp_link_table_free(fsdp_link_table *t) {
    free(t->rows);
    memset(t, 0, sizeof *t);
}

const fsdp_link_row *fsdp_link_table_best(const fsdp_link_table *t) {
    return t->n > 0 && t->rows[0].fits != 0 ? &t->rows[0] : NULL;
}

void fsdp_link_row_name(const fsdp_link_row *r, char *buf, size_t cap) {
    const fsdp_train_options *o = &r->o;
    int n = snprintf(buf, cap, "%s", fsdp_strategy_name(o->strategy));
    size_t used = n > 0 ? (size_t)n : 0;
    if (o->reduce_dtype != o->master_dtype && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, ", reduce %s", fsdp_dtype_name(o->reduce_dtype));
    if (o->gather_dtype != o->compute_dtype && o->strategy != FSDP_NO_SHARD && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, ", gather %s", fsdp_dtype_name(o->gather_dtype));
    if (r->time.microbatches > 1 && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, ", accumulate %s",
                                 fsdp_plan_accumulate_local(o, 0) ? "local" : "sharded");
    if (o->reshard_after_forward > 0 && used < cap)
        snprintf(buf + used, cap - used, ", hpZ %d", o->reshard_after_forward);
}
