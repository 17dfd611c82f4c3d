/* The training loop. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "../base/fault.h"
#include "../base/files.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/hf_config.h"
#include "../io/jsonio.h"
#include "eval.h"
#include "hf_import.h"
#include "checkpointing.h"
#include "optimizer.h"
#include "preemption.h"
#include "reshard.h"
#include "run_outputs.h"
#include "trace_run.h"
#include "unigram.h"

/* Where a step's time goes, from events on the compute stream (waits for communication included):
 * the first micro-batch's forward through the blocks, LM head (loss and its backward), backward
 * through the blocks and embedding; the remaining micro-batches with the last reductions; the
 * optimizer. */
enum { PHASE_START, PHASE_FORWARD, PHASE_HEAD, PHASE_BACKWARD, PHASE_REDUCED, PHASE_OPTIMIZER, PHASES };

/* The device scalars (FSDP_STEP_SCALARS of them, as the memory plan counts): a training step's
 * three, then the evaluation loss sum of forward-only passes (FSDP_SCALAR_EVAL_LOSS, eval.c). A step
 * zeroes and reads back its own three only. */
enum { SCALAR_LOSS = 0, SCALAR_SUMSQ = 1, SCALAR_CLIP = 2, STEP_OWN_SCALARS = 3 };
_Static_assert(FSDP_SCALAR_EVAL_LOSS == STEP_OWN_SCALARS && FSDP_STEP_SCALARS == FSDP_SCALAR_EVAL_LOSS + 1,
               "the evaluation loss follows the step's scalars, and nothing else does");

/* ---- set-up ---- */

int fsdp_train_load_model(const char *spec, fsdp_model_config *cfg, fsdp_err *err) {
    if (fsdp_model_preset(spec, cfg) == 0) return 0;
    struct stat st;
    if (stat(spec, &st) != 0) {
        char names[256] = "";
        for (const char *const *p = fsdp_model_preset_names(); *p; p++) {
            strncat(names, *p, sizeof names - strlen(names) - 3);
            if (p[1]) strncat(names, ", ", sizeof names - strlen(names) - 1);
        }
        return fsdp_usagef(err, "--model '%s' is neither a preset (%s) nor a config.json file or directory", spec,
                           names);
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return fsdp_usagef(err, "--model %s is %s, not a config.json file or directory", spec, fsdp_file_type_name(st.st_mode));
    char inside[4200];
    snprintf(inside, sizeof inside, "%s/config.json", spec);
    if (S_ISDIR(st.st_mode) && fsdp_regular_or_absent(inside, "--model", err) < 0) return -1;
    return fsdp_hf_config_load(spec, cfg, err);
}

/* Positions beyond the model's max_position_embeddings were never trained: a longer --seq is a
 * mistake unless asked for (the default shrinks to the model's length). */
static int check_seq(fsdp_trainer *t, fsdp_err *err) {
    fsdp_train_options *o = &t->opt;
    int max = t->cfg.max_position_embeddings;
    if (o->seq <= max) return 0;
    if (!o->seq_given) {
        fsdp_log("--seq %d: the model's max_position_embeddings (the default %d is longer)\n", max, o->seq);
        o->seq = max;
        return 0;
    }
    if (o->allow_longer_seq && t->cfg.family->pos != FSDP_POS_LEARNED) return 0;
    return fsdp_usagef(err,
                       "--seq %d exceeds the model's max_position_embeddings %d%s", o->seq, max,
                       t->cfg.family->pos == FSDP_POS_LEARNED ? " (its positions are learned)"
                                                        : ": positions beyond it were never trained; pass "
                                                          "--allow-longer-seq to use longer sequences anyway");
}

static int create_engine_and_optimizer(fsdp_trainer *t, fsdp_err *err) {
    fsdp_unit_spec *specs = fsdp_plan_unit_specs(&t->cfg, &t->opt, &t->layout);
    fsdp_shard_options so;
    fsdp_plan_shard_options(&t->cfg, &t->opt, t->topo.world, t->order, t->order_len, t->pinned, &so);
    t->embed_rows = so.rows_capacity > 0;
    t->eng = fsdp_engine_create(t->be, t->world, &t->topo, specs, t->layout.num_units, &so, err);
    free(specs);
    if (!t->eng) return -1;
    /* The optimizer's state beside the engine's shards (a forward-only run has none). */
    if (!t->opt.forward_only) t->optim = fsdp_optimizer_create(t->be, t->eng);
    fsdp_engine_comm_minimum(t->eng, &t->comm_min);
    return 0;
}

/* The op scratch of a step's largest request, now (fsdp_device_op_scratch). */
static void reserve_scratch(fsdp_trainer *t) {
    int64_t total_shard = 0;
    for (int u = 0; u < t->layout.num_units; u++) total_shard += fsdp_engine_view(t->eng, u).len;
    fsdp_op_extent x;
    fsdp_plan_op_extent(&t->cfg, &t->opt, total_shard, &x);
    t->be->runtime->reserve_scratch(t->be, fsdp_device_op_scratch(t->be->kind, &x));
}

/* --fp8: the device must have FP8 products, and the tokens of a micro-batch and every projection's
 * sizes must be multiples of 16 (src/kernels/fp8.h). */
static void check_fp8(const fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (o->fp8 == FSDP_FP8_NONE || err->failed) return;
    if (!t->be->fp8_products) {
        fsdp_usagef(err, "--fp8 %s: %s", fsdp_fp8_name(o->fp8), t->be->fp8_unavailable);
        return;
    }
    const fsdp_model_config *c = &t->cfg;
    const long N = (long)o->mbs * o->seq, C = c->hidden_size, F = c->intermediate_size;
    const long q = (long)c->num_heads * c->head_dim, qkv = (long)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
    const long mlp_in = fsdp_block_kind_of(c).swiglu ? 2 * F : F;
    if (!fsdp_fp8_shape_ok(N, C, qkv) || !fsdp_fp8_shape_ok(N, q, C) || !fsdp_fp8_shape_ok(N, C, mlp_in) ||
        !fsdp_fp8_shape_ok(N, F, C))
        fsdp_usagef(err,
                    "--fp8 %s needs multiples of %d: tokens per micro-batch (--mbs %d x --seq %d = %ld), hidden size "
                    "%ld, q|k|v width %ld, attention output %ld and intermediate size %ld",
                    fsdp_fp8_name(o->fp8), FSDP_FP8_DIM_MULTIPLE, o->mbs, o->seq, N, C, qkv, q, F);
}

/* --attn: the backend runs the model's attention that way (cuDNN's graphs have no sliding window
 * or attention dropout, and need the library). */
static void check_attn(const fsdp_trainer *t, const fsdp_dropout_rates *rates, fsdp_err *err) {
    if (err->failed) return;
    const char *why = t->be->ops->attention_unsupported(t->be, t->opt.attn, t->opt.seq, t->cfg.head_dim,
                                                        t->cfg.sliding_window, rates->attention);
    if (why) fsdp_usagef(err, "--attn %s: %s; --attn flash runs it", fsdp_attn_name(t->opt.attn), why);
}

static int setup(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (fsdp_topology_detect(t->world, o->ranks_per_node, &t->topo, err) == 0 &&
        fsdp_reshard_resolve("train", &t->opt, t->topo.world, t->topo.node_size, t->topo.uniform_nodes, err) == 0) {
        int rc = o->init_from ? fsdp_init_from_config(t->world, o->init_from, o->model, &t->cfg, err)
                              : fsdp_train_load_model(o->model, &t->cfg, err);
        if (rc == 0) check_seq(t, err);
    }
    if (o->data && strcmp(o->data, "synthetic") && !err->failed) fsdp_require_regular(o->data, "--data", err);
    fsdp_dropout_rates rates;
    if (!err->failed) fsdp_model_dropout_rates(&t->cfg, o->dropout_set, o->dropout_rate, &rates, err);
    if (fsdp_agree(t->world, err)) return -1;
    fsdp_layout_build(&t->cfg, &t->layout);
    fsdp_plan_unit_order(&t->cfg, &t->layout, &t->order, &t->order_len, &t->pinned);

    fsdp_backend_options bo;
    memset(&bo, 0, sizeof bo);
    bo.kind = o->device;
    bo.act_dtype = o->compute_dtype;
    bo.grad_dtype = fsdp_plan_grad_dtype(o);
    bo.local_rank = t->topo.local_rank;
    bo.local_size = t->topo.local_size;
    bo.memory_limit = fsdp_fit_backend_limit(t);
    t->be = fsdp_backend_create(&bo, err);
    if (fsdp_agree(t->world, err)) return -1;
    fsdp_fit_choose(t, err); /* the micro-batch of --mbs auto, the accumulation of --global-batch */
    if (!err->failed) fsdp_plan_check_embed_rows("train", o, t->topo.world, err);
    check_fp8(t, err);
    check_attn(t, &rates, err);
    if (fsdp_agree(t->world, err)) return -1;
    if (fsdp_host_memory_check(t, err)) return -1;

    /* From here to fsdp_fit_check_setup every rank runs to the end even when memory runs out. */
    t->be->oom.deferred = 1;
    /* The model checks the batch shape (an OPT sequence beyond its positions, say) before the
     * engine takes the memory of the shards. */
    fsdp_model_shape shape = fsdp_plan_model_shape(&t->cfg, o);
    t->model = fsdp_model_create(t->be, &t->cfg, &t->layout, &shape, err);
    if (fsdp_agree(t->world, err)) return -1;

    if (create_engine_and_optimizer(t, err)) return -1;

    if (fsdp_trainer_open_data(t, err)) return -1;

    size_t tokens = (size_t)o->grad_accum * o->mbs * o->seq;
    t->host_inputs = t->be->runtime->alloc_host(t->be, tokens * sizeof(int32_t), "token staging");
    t->host_targets = t->be->runtime->alloc_host(t->be, tokens * sizeof(int32_t), "token staging");
    t->dev_scalars = t->be->runtime->alloc(t->be, FSDP_STEP_SCALARS * sizeof(float), "step scalars");
    t->host_scalars = t->be->runtime->alloc_host(t->be, FSDP_STEP_SCALARS * sizeof(float), "step scalars");
    for (int i = 0; i < PHASES; i++) t->phase[i] = t->be->runtime->event_create(t->be, 1);
    reserve_scratch(t);
    if (fsdp_fit_check_setup(t, err)) return -1;
    t->sched.lr = o->lr;
    t->sched.min_lr = o->min_lr;
    t->sched.warmup = o->warmup;
    t->sched.total = o->steps;
    return 0;
}

static void teardown(fsdp_trainer *t) {
    if (t->be) fsdp_ckpt_teardown(t);
    if (t->metrics) fsdp_metrics_close(t->metrics);
    fsdp_data_close(&t->data);
    fsdp_data_close(&t->eval_data);
    if (t->be) {
        t->be->runtime->stream_synchronize(t->be, t->be->compute);
        fsdp_model_destroy(t->model);
        fsdp_optimizer_destroy(t->optim);
        fsdp_trace_run_close(t); /* its events first, and the engine's hooks */
        fsdp_engine_destroy(t->eng);
        if (t->host_inputs) t->be->runtime->free_host(t->be, t->host_inputs);
        if (t->host_targets) t->be->runtime->free_host(t->be, t->host_targets);
        if (t->host_scalars) t->be->runtime->free_host(t->be, t->host_scalars);
        if (t->dev_scalars) t->be->runtime->free(t->be, t->dev_scalars);
        for (int i = 0; i < PHASES; i++)
            if (t->phase[i]) t->be->runtime->event_destroy(t->be, t->phase[i]);
        t->be->runtime->destroy(t->be);
    }
    fsdp_layout_free(&t->layout);
    free(t->order);
    free(t->pinned);
}

/* ---- one step ---- */

/* Reads this rank's samples for every micro-batch of the step; returns the tokens counted in the
 * whole global batch (agreed over the world), or -1 on a data error (agreed). */
static int64_t load_step_data(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    int64_t counted = 0;
    for (int a = 0; a < o->grad_accum && !err->failed; a++) {
        for (int b = 0; b < o->mbs && !err->failed; b++) {
            uint64_t index = fsdp_data_index(t->samples_seen, t->topo.world, o->mbs, t->topo.rank, a, b);
            size_t at = ((size_t)a * o->mbs + b) * (size_t)o->seq;
            if (fsdp_data_sample(&t->data, index, t->host_inputs + at, t->host_targets + at, err)) break;
            for (int i = 0; i < o->seq; i++) counted += t->host_targets[at + (size_t)i] >= 0;
        }
    }
    if (fsdp_agree(t->world, err)) return -1;
    fsdp_mpi_allreduce(&counted, 1, MPI_INT64_T, MPI_SUM, t->world, "the global token count of the step");
    return counted;
}

static void mark(fsdp_trainer *t, int a, int phase) {
    if (a == 0) t->be->runtime->event_record(t->be, t->phase[phase], t->be->compute);
}

static void microbatch(fsdp_trainer *t, int a, float grad_scale) {
    fsdp_backend *be = t->be;
    fsdp_engine *e = t->eng;
    fsdp_model *m = t->model;
    const fsdp_layout *l = &t->layout;
    int L = t->cfg.num_layers, E = fsdp_unit_embed(l), H = fsdp_unit_head(l);
    size_t n = (size_t)t->opt.mbs * t->opt.seq, at = (size_t)a * n;
    /* First: it holds the copies back until the last micro-batch's gradient rows were read. */
    fsdp_engine_begin_microbatch(e);
    be->runtime->copy_h2d(be, fsdp_model_tokens(m), t->host_inputs + at, n * sizeof(int32_t), be->compute);
    be->runtime->copy_h2d(be, fsdp_model_targets(m), t->host_targets + at, n * sizeof(int32_t), be->compute);
    /* Masks follow the samples' global index (never the rank) and the run's seed (kept in checkpoints). */
    fsdp_model_set_dropout(m, 1, t->opt.seed,
                           (int64_t)fsdp_data_index(t->samples_seen, t->topo.world, t->opt.mbs, t->topo.rank, a, 0));

    if (a == 0 && (fsdp_fault_nonfinite(t->step + 1) & 1)) grad_scale = NAN; /* FSDP_TEST_FAIL=...:nan */
    const void *embed = fsdp_engine_params(e, E);
    int mark_at = fsdp_trace_mark(t); /* --trace: each unit's compute is a span from here */
    fsdp_model_embed_forward(m, embed);
    fsdp_trace_compute(t, mark_at, "fwd", E);
    fsdp_engine_done_forward(e, E);
    for (int i = 0; i < L; i++) {
        int u = fsdp_unit_block(l, i);
        const void *p = fsdp_engine_params(e, u);
        fsdp_fp8_weight w8[FSDP_FP8_MAX_MATRICES]; /* the products' weights, if the gather brought them in FP8 */
        fsdp_model_set_fp8_weights(m, fsdp_engine_fp8_weights(e, u, w8) ? w8 : NULL);
        mark_at = fsdp_trace_mark(t);
        fsdp_model_block_forward(m, i, p);
        fsdp_trace_compute(t, mark_at, "fwd", u);
        fsdp_engine_done_forward(e, u);
    }
    if (a == 0) fsdp_fault_point(t->step + 1);
    mark(t, a, PHASE_FORWARD);
    const void *head = fsdp_engine_params(e, H);
    void *head_grads = fsdp_engine_grads(e, H);
    int tied = t->cfg.tie_word_embeddings;
    void *tied_grads = tied ? fsdp_engine_grads(e, E) : NULL;
    mark_at = fsdp_trace_mark(t);
    fsdp_model_head(m, head, head_grads, tied ? embed : NULL, tied_grads, grad_scale, t->dev_scalars + SCALAR_LOSS);
    fsdp_trace_compute(t, mark_at, NULL, H);
    fsdp_engine_done_backward(e, H);
    /* With rows, the dense part of a tied matrix is only the head's share: reduce it now, behind the
     * blocks' backward, instead of at the end of the micro-batch. */
    if (t->embed_rows && tied) fsdp_engine_done_backward(e, E);
    mark(t, a, PHASE_HEAD);
    for (int i = L - 1; i >= 0; i--) {
        int u = fsdp_unit_block(l, i);
        const void *p = fsdp_engine_params(e, u);
        void *g = fsdp_engine_grads(e, u);
        fsdp_fp8_weight w8[FSDP_FP8_MAX_MATRICES];
        fsdp_model_set_fp8_weights(m, fsdp_engine_fp8_weights(e, u, w8) ? w8 : NULL);
        mark_at = fsdp_trace_mark(t);
        fsdp_model_block_backward(m, i, p, g);
        fsdp_trace_compute(t, mark_at, "bwd", u);
        fsdp_engine_done_backward(e, u);
    }
    if (t->embed_rows) {
        fsdp_row_set sets[FSDP_MAX_ROW_SETS];
        const void *values;
        int count, row_len;
        mark_at = fsdp_trace_mark(t);
        int nsets = fsdp_model_embed_grad_rows(m, sets, &values, &count, &row_len);
        fsdp_trace_compute(t, mark_at, "bwd", E);
        fsdp_engine_add_rows(e, E, sets, nsets, values, count, row_len);
    } else {
        void *g = fsdp_engine_grads(e, E);
        mark_at = fsdp_trace_mark(t);
        fsdp_model_embed_backward(m, NULL, g);
        fsdp_trace_compute(t, mark_at, "bwd", E);
    }
    fsdp_engine_done_backward(e, E);
    mark(t, a, PHASE_BACKWARD);
}

typedef struct {
    double loss, grad_norm, lr, step_ms, comm_wait_ms, time_s;
    int skipped;
    double phase_ms[PHASES - 1]; /* between consecutive PHASE_* events */
    fsdp_comm_bytes sent;        /* what this rank sent during the step */
} step_result;

/* A step whose loss or gradient norm is not finite changed nothing but the data position; too many
 * in a row stop the run with what probably caused them. */
static int skip_step(fsdp_trainer *t, const step_result *r, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    t->skipped_steps++;
    t->consecutive_skips++;
    fsdp_log("step %d skipped: the %s is not finite (loss %g, gradient norm %g); weights and optimizer state are "
             "unchanged (%d in a row, --max-skipped %d)\n",
             t->step, isfinite(r->loss) ? "gradient norm" : "loss", r->loss, r->grad_norm, t->consecutive_skips,
             o->max_skipped);
    if (t->consecutive_skips <= o->max_skipped) return 0;
    int first = t->step - t->consecutive_skips + 1;
    if (t->skipped_steps == t->step - t->first_step)
        return fsdp_errf(err,
                         "every step of this run had a non-finite loss or gradient norm (steps %d-%d): the starting "
                         "weights or the data are broken, or the model overflows in %s (try --mixed-precision no)",
                         first, t->step, fsdp_dtype_name(o->compute_dtype));
    return fsdp_errf(err,
                     "%d consecutive steps (%d-%d) had a non-finite loss or gradient norm: the training has diverged; "
                     "lower --lr (now %g), raise --warmup (now %d) or clip harder with --clip (now %g), and resume "
                     "from the last checkpoint",
                     t->consecutive_skips, first, t->step, o->lr, o->warmup, o->clip);
}

static int train_step(fsdp_trainer *t, step_result *r, fsdp_err *err) {
    fsdp_backend *be = t->be;
    const fsdp_train_options *o = &t->opt;
    double t0 = fsdp_now();
    fsdp_trace *rec = fsdp_trace_run_recorder(t); /* --trace's host phases; NULL without */
    double phase_at = fsdp_trace_host_begin(rec);
    int64_t counted = load_step_data(t, err);
    if (counted < 0) return -1;
    fsdp_trace_host_end(rec, phase_at, "data");
    float grad_scale = counted > 0 ? 1.0f / (float)counted : 0.0f;

    be->runtime->zero(be, t->dev_scalars, STEP_OWN_SCALARS * sizeof(float), be->compute);
    fsdp_engine_begin_step(t->eng, o->grad_accum);
    mark(t, 0, PHASE_START);
    for (int a = 0; a < o->grad_accum; a++) microbatch(t, a, grad_scale);
    fsdp_engine_wait_reductions(t->eng);
    mark(t, 0, PHASE_REDUCED);
    r->comm_wait_ms = fsdp_engine_take_comm_wait_ms(t->eng);

    int step = t->step + 1;
    fsdp_adamw_args args = {(float)fsdp_schedule_lr(&t->sched, step), (float)o->beta1, (float)o->beta2,
                            (float)o->adam_eps, (float)o->weight_decay, step};
    fsdp_optimizer_scalars sc = {t->dev_scalars + SCALAR_SUMSQ, t->dev_scalars + SCALAR_CLIP};
    /* The loss and the gradient norm are looked at before the update: a step that is not finite
     * is not applied (src/train/checkpointing.h: a poisoned model is never saved). */
    fsdp_optimizer_grad_sumsq(t->eng, &sc);
    phase_at = fsdp_trace_host_begin(rec);
    be->runtime->copy_d2h(be, t->host_scalars, t->dev_scalars, STEP_OWN_SCALARS * sizeof(float), be->compute);
    be->runtime->stream_synchronize(be, be->compute);
    double sums[2] = {t->host_scalars[SCALAR_LOSS], isfinite(t->host_scalars[SCALAR_SUMSQ]) ? 0.0 : 1.0};
    if (fsdp_fault_nonfinite(step) & 2) sums[0] = NAN; /* FSDP_TEST_FAIL=...:nanloss */
    fsdp_mpi_allreduce(sums, 2, MPI_DOUBLE, MPI_SUM, t->world, "the loss of the step");
    r->loss = counted > 0 ? sums[0] / (double)counted : 0.0;
    r->grad_norm = sqrt((double)t->host_scalars[SCALAR_SUMSQ]);
    r->skipped = !isfinite(r->loss) || sums[1] != 0.0;
    fsdp_trace_host_end(rec, phase_at, "wait for the loss");
    if (!r->skipped) {
        int mark_at = fsdp_trace_mark(t);
        fsdp_optimizer_update(t->optim, t->eng, &args, (float)o->clip, &sc);
        fsdp_trace_compute(t, mark_at, "optimizer step", -1);
        if (fsdp_fault_poison(step)) fsdp_trainer_poison(t); /* FSDP_TEST_FAIL=...:poison */
    }
    mark(t, 0, PHASE_OPTIMIZER);
    phase_at = fsdp_trace_host_begin(rec);
    be->runtime->stream_synchronize(be, be->compute);
    fsdp_trace_host_end(rec, phase_at, "wait for the update");
    fsdp_trace_step_end(t); /* the compute stream is idle: the trace's anchor */
    for (int i = 0; i + 1 < PHASES; i++)
        r->phase_ms[i] = be->runtime->event_elapsed_ms(be, t->phase[i], t->phase[i + 1]);
    r->lr = args.lr;
    r->step_ms = (fsdp_now() - t0) * 1e3;
    /* The update just started the next step's first gathers: steady state counts one of each. */
    fsdp_engine_take_comm_bytes(t->eng, &r->sent);
    t->step = step;
    t->samples_seen += (uint64_t)o->grad_accum * (uint64_t)o->mbs * (uint64_t)t->topo.world;
    return r->skipped ? skip_step(t, r, err) : (t->consecutive_skips = 0);
}

/* ---- reporting ---- */

static void format_eta(double seconds, char *buf, size_t cap) {
    long s = (long)(seconds + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
}

/* {"all_gather": bytes, "reduce": ..., "all_reduce": ..., "rows": ..., "total": ...} */
static json_t *comm_bytes_json(const fsdp_comm_bytes *c) {
    json_t *v = json_object();
    if (!v) return NULL;
    for (int k = 0; k < FSDP_COMM_KINDS; k++)
        json_object_set_new(v, fsdp_comm_kind_name((fsdp_comm_kind)k), json_integer((json_int_t)c->bytes[k]));
    json_object_set_new(v, "total", json_integer((json_int_t)c->total));
    return v;
}

static void report_step(fsdp_trainer *t, const step_result *r, double tps, double eta_s, const fsdp_eval_result *ev,
                        fsdp_err *err) {
    if (fsdp_rank() != 0) return;
    const fsdp_train_options *o = &t->opt;
    if (t->step % o->log_every == 0 || t->step == o->steps || ev) {
        char eta[32], eval[96] = "";
        format_eta(eta_s, eta, sizeof eta);
        if (ev) snprintf(eval, sizeof eval, " | eval loss %.4f | eval ppl %.2f", ev->loss, ev->ppl);
        int width = 1;
        for (int n = o->steps; n >= 10; n /= 10) width++;
        char sent[64] = ""; /* the step's bytes beside the least its strategy needs */
        if (t->topo.world > 1) {
            double unit = t->comm_min.total >= 1e8 ? 1e9 : t->comm_min.total >= 1e5 ? 1e6 : 1e3;
            snprintf(sent, sizeof sent, " | sent %.2f %s (min %.2f)", r->sent.total / unit,
                     unit == 1e9 ? "GB" : unit == 1e6 ? "MB" : "kB", t->comm_min.total / unit);
        }
        fsdp_log("step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s/%s | %.1f ms | comm wait %.1f%%%s%s | "
                 "ETA %s\n",
                 width, t->step, o->steps, r->loss, r->lr, r->grad_norm, tps, fsdp_trainer_per_what(t), r->step_ms,
                 r->step_ms > 0 ? 100.0 * r->comm_wait_ms / r->step_ms : 0.0, sent, eval, eta);
    }
    if (t->metrics) {
        const double *p = r->phase_ms;
        json_t *rec = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:i, s:o}", "step", t->step,
                                "loss", fsdp_json_number(r->loss), "lr", fsdp_json_number(r->lr), "grad_norm",
                                fsdp_json_number(r->grad_norm), "tokens_per_s_per_gpu", fsdp_json_number(tps),
                                "step_ms", fsdp_json_number(r->step_ms), "comm_wait_ms",
                                fsdp_json_number(r->comm_wait_ms), "forward_ms", fsdp_json_number(p[0]), "head_ms",
                                fsdp_json_number(p[1]), "backward_ms", fsdp_json_number(p[2]), "rest_ms",
                                fsdp_json_number(p[3]), "optimizer_ms", fsdp_json_number(p[4]), "samples_seen",
                                (json_int_t)t->samples_seen, "skipped_steps", t->skipped_steps, "time_s",
                                fsdp_json_number(r->time_s));
        /* MFU and memory per step too (the summary's are over the run and the ranks): rank 0's
         * reservation so far, the model FLOPs of this step's throughput where the peak is known */
        double peak = t->be->peak_tflops, tflops = tps * fsdp_model_flops_per_token(&t->cfg, o->seq) / 1e12;
        if (!rec || json_object_set_new(rec, "comm_bytes", comm_bytes_json(&r->sent)) ||
            json_object_set_new(rec, "reserved_gib",
                                fsdp_json_number((double)t->be->max_reserved_bytes / (double)(1ull << 30))) ||
            (peak > 0 && json_object_set_new(rec, "mfu", fsdp_json_number(tflops / peak))))
            fsdp_fatal("out of host memory building a metrics record");
        fsdp_metrics_write(t->metrics, rec, err);
        json_decref(rec);
        if (ev) fsdp_eval_record(t, ev, err);
    }
}

/* What the run was, for `fsdp report` to classify it (docs/FORMATS.md): its flags as the course names
 * them, the effective precisions and the topology the strategy used. */
static json_t *summary_config(const fsdp_trainer *t) {
    const fsdp_train_options *o = &t->opt;
    long long global_batch = (long long)o->mbs * o->grad_accum * t->topo.world;
    /* A fine-tune started with --init-from alone is its directory's model (or the checkpoint's): the
     * report groups and names runs by it. A model path that is not UTF-8 cannot be a JSON string:
     * null keeps the other fields. */
    json_t *model = json_string(o->model ? o->model : o->init_from);
    json_t *cfg = json_pack("{s:o, s:I, s:i, s:i, s:i, s:I, s:I, s:s, s:s, s:s, s:i, s:i}", "model",
                            model ? model : json_null(), "params", (json_int_t)fsdp_model_num_params(&t->cfg),
                            "mbs", o->mbs, "seq", o->seq, "grad_accum", o->grad_accum, "global_batch",
                            (json_int_t)global_batch, "tokens_per_step", (json_int_t)(global_batch * o->seq),
                            "model_precision", fsdp_dtype_name(o->master_dtype), "mixed_precision",
                            o->compute_dtype == FSDP_BF16 ? "bf16" : "no", "attn",
                            fsdp_attn_name(o->attn), "nodes", t->topo.num_nodes,
                            "ranks_per_node", t->topo.node_size);
    if (!cfg || json_object_set_new(cfg, "recompute", json_string(fsdp_recompute_name(o->recompute))) ||
        json_object_set_new(cfg, "fp8", json_string(fsdp_fp8_name(o->fp8))) ||
        json_object_set_new(cfg, "reduce_dtype", json_string(fsdp_dtype_name(o->reduce_dtype))) ||
        json_object_set_new(cfg, "gather_dtype", json_string(fsdp_dtype_name(o->gather_dtype))) ||
        json_object_set_new(cfg, "accumulate",
                            json_string(fsdp_plan_accumulate_local(o, t->topo.world) ? "local" : "sharded")) ||
        json_object_set_new(cfg, "reshard_after_forward", fsdp_engine_secondary_size(t->eng)
                                                              ? json_integer(fsdp_engine_secondary_size(t->eng))
                                                              : json_null()))
        fsdp_fatal("out of host memory building the metrics summary");
    return cfg;
}

static void report_summary(fsdp_trainer *t, int steps_run, double timed_s, int timed_steps, double total_s,
                           fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    double tokens_per_step_per_gpu = (double)o->grad_accum * o->mbs * o->seq;
    double tps = timed_steps > 0 && timed_s > 0 ? timed_steps * tokens_per_step_per_gpu / timed_s : 0.0;
    double course = steps_run > 0 && total_s > 0 ? steps_run * tokens_per_step_per_gpu / total_s : 0.0;
    double flops = fsdp_model_flops_per_token(&t->cfg, o->seq);
    double tflops = tps * flops / 1e12;
    /* The course reports the largest per-GPU reservation. */
    unsigned long long reserved = t->be->max_reserved_bytes, max_reserved = reserved;
    FSDP_CHECK_MPI(MPI_Allreduce(&reserved, &max_reserved, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, t->world));
    double gib = (double)max_reserved / (double)(1ull << 30);
    /* What the GPU holds besides: the CUDA context, NCCL's and cuBLAS's buffers (the plan estimates it). */
    unsigned long long outside[3] = {0, t->be->outside_at_create, t->be->outside_comm_init}, max_outside[3];
    if (t->be->kind == FSDP_DEVICE_CUDA) {
        size_t free_b = 0, total = 0;
        t->be->runtime->memory_info(t->be, &free_b, &total);
        size_t in_use = total - free_b;
        outside[0] = in_use > t->be->reserved_bytes ? in_use - t->be->reserved_bytes : 0;
    }
    FSDP_CHECK_MPI(MPI_Allreduce(outside, max_outside, 3, MPI_UNSIGNED_LONG_LONG, MPI_MAX, t->world));
    if (fsdp_rank() != 0) return;
    if (steps_run > 0) {
        fsdp_log("Training throughput: %.2f Tokens/s/GPU (steady state over %d steps; %.2f by the course's formula)\n",
                 tps, timed_steps, course);
        if (t->be->peak_tflops > 0)
            fsdp_log("Model FLOPs: %.1f TFLOP/s per GPU, MFU %.1f%% of %.0f TFLOP/s\n", tflops,
                     100.0 * tflops / t->be->peak_tflops, t->be->peak_tflops);
    }
    fsdp_log("Max reserved %s memory: %.2f GiB (memory plan: %.2f GiB)\n", strcmp(t->be->name, "cpu") ? "GPU" : "CPU backend",
             gib, fsdp_gib(t->plan.reserved));
    if (t->be->kind == FSDP_DEVICE_CUDA)
        fsdp_log("GPU memory outside fsdp.c's allocations: %.2f GiB (the plan's estimate: %.2f GiB; CUDA context and "
                 "cuBLAS %.2f, NCCL communicators %.2f when created, the rest since)\n",
                 fsdp_gib((size_t)max_outside[0]), fsdp_gib(t->plan.outside), fsdp_gib((size_t)max_outside[1]),
                 fsdp_gib((size_t)max_outside[2]));
    if (t->metrics) {
        json_t *rec = json_pack("{s:b, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:i, s:s, s:s}", "summary", 1, "steps",
                                steps_run, "final_step", t->step, "skipped_steps", t->skipped_steps, "tokens_per_s_per_gpu", fsdp_json_number(tps),
                                "tokens_per_s_per_gpu_course", fsdp_json_number(course), "tflops_per_gpu",
                                fsdp_json_number(tflops), "mfu",
                                fsdp_json_number(t->be->peak_tflops > 0 ? tflops / t->be->peak_tflops : 0.0),
                                "max_reserved_gib", fsdp_json_number(gib), "world_size", t->topo.world, "strategy",
                                fsdp_strategy_name(o->strategy), "device", t->be->device_name);
        fsdp_comm_bytes mean = t->comm_sum;
        for (int k = 0; k < FSDP_COMM_KINDS; k++) mean.bytes[k] /= t->comm_steps > 0 ? t->comm_steps : 1;
        mean.total /= t->comm_steps > 0 ? t->comm_steps : 1;
        if (json_object_set_new(rec, "comm_bytes_per_step", comm_bytes_json(&mean)) ||
            json_object_set_new(rec, "comm_bytes_min", comm_bytes_json(&t->comm_min)))
            fsdp_fatal("out of host memory building the metrics summary");
        json_t *trace = fsdp_trace_run_json(t); /* --trace's figures, the ranks' mean */
        if (trace && json_object_set_new(rec, "trace", trace)) fsdp_fatal("out of host memory building the metrics summary");
        json_t *cfg = summary_config(t);
        if (!rec || json_object_update(rec, cfg) != 0) fsdp_fatal("out of host memory building the metrics summary");
        json_decref(cfg);
        int gpu = t->be->kind == FSDP_DEVICE_CUDA;
        json_t *memory = json_pack(
            "{s:I, s:I, s:o, s:o, s:o, s:o, s:i}", "max_reserved_bytes", (json_int_t)max_reserved,
            "plan_reserved_bytes", (json_int_t)t->plan.reserved, "outside_gib",
            gpu ? fsdp_json_number(fsdp_gib((size_t)max_outside[0])) : json_null(), "outside_context_gib",
            gpu ? fsdp_json_number(fsdp_gib((size_t)max_outside[1])) : json_null(), "outside_comm_init_gib",
            gpu ? fsdp_json_number(fsdp_gib((size_t)max_outside[2])) : json_null(), "plan_outside_gib",
            fsdp_json_number(fsdp_gib(t->plan.outside)), "step_downs", t->step_downs);
        if (!memory || json_object_update(rec, memory)) fsdp_fatal("out of host memory building the metrics summary");
        json_decref(memory);
        fsdp_metrics_write(t->metrics, rec, err);
        json_decref(rec);
    }
}

static void describe_run(fsdp_trainer *t) {
    const fsdp_train_options *o = &t->opt;
    char model[256];
    fsdp_model_config_describe(&t->cfg, model, sizeof model);
    double params = (double)fsdp_model_num_params(&t->cfg);
    fsdp_log("fsdp.c %s | model %s: %s, %.2f%s parameters\n", FSDP_VERSION, o->init_from ? o->init_from : o->model, model,
             params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M");
    char hpz[80] = ""; /* --reshard-after-forward */
    if (fsdp_engine_secondary_size(t->eng))
        snprintf(hpz, sizeof hpz, ", hpZ: resharded to %d after forward", fsdp_engine_secondary_size(t->eng));
    fsdp_log("device %s x %d ranks | strategy %s (shard group %d, replica group %d%s) | %s master, %s compute, %s "
             "reduce, %s gather | attention %s | embedding gradient %s\n",
             t->be->device_name, t->topo.world, fsdp_strategy_name(o->strategy), fsdp_engine_shard_size(t->eng),
             fsdp_engine_replica_size(t->eng), hpz, fsdp_dtype_name(o->master_dtype), fsdp_dtype_name(o->compute_dtype),
             fsdp_dtype_name(o->reduce_dtype), fsdp_dtype_name(o->gather_dtype),
             fsdp_attn_name(o->attn), t->embed_rows ? "rows" : "dense");
    char dropout[160], data[1024];
    fsdp_model_shape shape = fsdp_plan_model_shape(&t->cfg, o);
    fsdp_dropout_rates_describe(&shape.dropout, dropout, sizeof dropout);
    fsdp_data_describe(&t->data, data, sizeof data);
    fsdp_log("batch: %d per rank x %d accumulation x %d ranks = %d samples of %d tokens per step%s | data %s | "
             "recompute %s | dropout %s%s%s%s\n", o->mbs, o->grad_accum, t->topo.world, o->mbs * o->grad_accum * t->topo.world,
             o->seq, o->grad_accum < 2 ? "" : fsdp_plan_accumulate_local(o, t->topo.world) ? " (accumulated locally, reduced once)"
                                                                                   : " (reduced every micro-batch)",
             data, fsdp_recompute_name(o->recompute), dropout, o->fp8 ? " | fp8 " : "", o->fp8 ? fsdp_fp8_name(o->fp8) : "",
             fsdp_engine_gathers_fp8_weights(t->eng) ? " (block weights gathered as e4m3 codes, one scale each)" : "");
    if (t->topo.world > 1) {
        fsdp_comm_bytes *m = &t->comm_min;
        double unit = m->total >= 1e8 ? 1e9 : m->total >= 1e5 ? 1e6 : 1e3;
        char inside[96] = ""; /* hpZ: the backward's gathers, inside the secondary group */
        if (fsdp_engine_secondary_size(t->eng))
            snprintf(inside, sizeof inside, ", backward all-gathers inside groups of %d %.3f",
                     fsdp_engine_secondary_size(t->eng), m->bytes[FSDP_COMM_GATHER_SECONDARY] / unit);
        fsdp_log("network: at least %.3f %s sent per rank and step (all-gathers %.3f%s, reductions %.3f, replica "
                 "all-reduces %.3f)\n", m->total / unit, unit == 1e9 ? "GB" : unit == 1e6 ? "MB" : "kB",
                 m->bytes[FSDP_COMM_GATHER] / unit, inside, m->bytes[FSDP_COMM_REDUCE] / unit,
                 m->bytes[FSDP_COMM_REPLICA] / unit);
    }
    if (o->epochs > 0)
        fsdp_log("epochs: %g of %llu samples = %d steps\n", o->epochs, (unsigned long long)t->data.samples, o->steps);
    if (o->eval_data) {
        fsdp_data_describe(&t->eval_data, data, sizeof data);
        char when[64] = "at the end of the run";
        if (o->eval_every > 0) snprintf(when, sizeof when, "every %d steps and at the end", o->eval_every);
        fsdp_log("evaluation: %s, %s\n", data, when);
    }
    char plan[512];
    fsdp_memory_plan_line(&t->plan, plan, sizeof plan);
    fsdp_log("memory per %s: %s | held now: %.2f GiB\n", t->be->kind == FSDP_DEVICE_CUDA ? "GPU" : "rank", plan,
             fsdp_gib(t->be->reserved_bytes));
}

/* --unigram-baseline: rank 0 counts, every rank learns whether it worked. */
static int describe_unigram_baseline(fsdp_trainer *t, fsdp_err *err) {
    if (t->data.synthetic)
        fsdp_usagef(err, "--unigram-baseline needs a token file as --data (its token frequencies), not synthetic data");
    else if (fsdp_rank() == 0) {
        fsdp_unigram_result u;
        if (fsdp_unigram_baseline(&t->data, &t->eval_data, t->cfg.vocab_size, &u, err) == 0)
            fsdp_log("unigram baseline: eval loss %.4f | eval ppl %.2f | over %lld eval tokens, from the token "
                     "frequencies of %lld training targets (add-one smoothed; %lld eval tokens unseen in training)\n",
                     u.loss, u.ppl, (long long)u.eval_tokens, (long long)u.train_tokens, (long long)u.unseen);
    }
    return fsdp_agree(t->world, err);
}

/* ---- the run ---- */

/* Sets the run up; under --mbs auto, a set-up that ran out of memory on some rank is torn down and
 * built again with the next smaller micro-batch. */
static int setup_fitting(fsdp_trainer *t, fsdp_err *err) {
    while (setup(t, err)) {
        int next = fsdp_fit_step_down(t, err->msg);
        if (!next) return -1;
        fsdp_train_options opt = t->opt;
        int step_downs = t->step_downs + 1;
        teardown(t);
        memset(t, 0, sizeof *t);
        memset(err, 0, sizeof *err);
        t->opt = opt;
        t->opt.mbs = next;
        t->world = MPI_COMM_WORLD;
        t->step_downs = step_downs;
    }
    return 0;
}

static int run(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (fsdp_run_outputs_apart(t->world, o, err) || fsdp_trace_check_paths(t, err) || setup_fitting(t, err)) return -1;
    int resumed = 0;
    if (fsdp_ckpt_setup(t, &resumed, err)) return -1;
    if (fsdp_trace_run_open(t, err)) return -1; /* --trace: refused before --metrics is truncated */
    if (o->metrics && fsdp_rank() == 0 && fsdp_run_outputs_metrics_dir(o->metrics, err) == 0 &&
        fsdp_regular_or_absent(o->metrics, "--metrics", err) >= 0)
        t->metrics = fsdp_metrics_open(o->metrics, resumed, err);
    if (o->tensorboard && fsdp_rank() == 0 && !err->failed)
        fsdp_metrics_tensorboard(&t->metrics, o->tensorboard, resumed, err);
    if (fsdp_agree(t->world, err)) return -1;

    describe_run(t);
    if (o->unigram_baseline && describe_unigram_baseline(t, err)) return -1;
    if (t->step >= o->steps && !resumed && o->ckpt_dir) {
        /* --steps 0 on a fresh run: the initial weights as a checkpoint of step 0 (what the model
         * writes or scores before any training; --resume auto trains on from it). */
        int stop = 0;
        if (fsdp_ckpt_boundary(t, &stop, err)) return -1;
        fsdp_log("no steps to train: the initial weights are checkpoint %s/step-%08d.h5\n", o->ckpt_dir, t->step);
        return 0;
    }
    if (t->step >= o->steps) {
        fsdp_log("nothing to do: the run is at step %d and --steps is %d\n", t->step, o->steps);
        return 0;
    }
    double start = fsdp_now(), timed_s = 0.0;
    int timed_steps = 0, stop = 0;
    t->first_step = t->step;
    while (t->step < o->steps && !stop) {
        step_result r;
        if (train_step(t, &r, err)) break;
        /* The first step pays for allocation and kernel selection: throughput counts the rest. */
        if (t->step > t->first_step + 1 || o->steps - t->first_step == 1) {
            timed_s += r.step_ms / 1e3;
            timed_steps++;
            for (int k = 0; k < FSDP_COMM_KINDS; k++) t->comm_sum.bytes[k] += r.sent.bytes[k];
            t->comm_sum.total += r.sent.total;
            t->comm_steps++;
        }
        fsdp_eval_result ev, *evaluated = NULL;
        double phase_at = fsdp_trace_host_begin(fsdp_trace_run_recorder(t));
        if (o->eval_data && o->eval_every > 0 && t->step % o->eval_every == 0) {
            if (fsdp_evaluate(t, &t->eval_data, &ev, err)) break;
            evaluated = &ev;
            fsdp_trace_host_end(fsdp_trace_run_recorder(t), phase_at, "eval");
        }
        double avg = (fsdp_now() - start) / (t->step - t->first_step);
        double tps = (double)o->grad_accum * o->mbs * o->seq / (r.step_ms / 1e3);
        r.time_s = fsdp_now() - start;
        report_step(t, &r, tps, avg * (o->steps - t->step), evaluated, err);
        int saves = o->ckpt_dir && ((o->ckpt_every > 0 && t->step % o->ckpt_every == 0) || t->step == o->steps);
        phase_at = fsdp_trace_host_begin(fsdp_trace_run_recorder(t));
        if (fsdp_ckpt_boundary(t, &stop, err)) break;
        fsdp_trace_host_end(fsdp_trace_run_recorder(t), phase_at, saves ? "checkpoint save" : "step boundary");
        if (fsdp_trace_after_step(t, err)) break;
    }
    if (fsdp_agree(t->world, err)) {
        fsdp_ckpt_settle(t);
        return -1;
    }
    /* The end of a run is always evaluated, whatever --eval-every (not a run stopped by a signal:
     * its time is running out). */
    if (!stop && o->eval_data && (o->eval_every <= 0 || t->step % o->eval_every != 0)) {
        fsdp_eval_result ev;
        if (fsdp_evaluate(t, &t->eval_data, &ev, err)) return -1;
        fsdp_eval_log(t, "eval at the end", &ev);
        if (fsdp_rank() == 0 && t->metrics) fsdp_eval_record(t, &ev, err);
    }
    if (fsdp_trace_run_finish(t, err)) return -1;
    report_summary(t, t->step - t->first_step, timed_s, timed_steps, fsdp_now() - start, err);
    if (fsdp_agree(t->world, err)) return -1;
    if (!stop) return 0;
    if (o->ckpt_dir)
        fsdp_log("stopped by %s at step %d: checkpoint %s/step-%08d.h5 written; continue with --resume auto\n",
                 fsdp_signal_name(stop), t->step, o->ckpt_dir, t->step);
    else
        fsdp_log("stopped by %s at step %d (no --ckpt-dir: nothing saved)\n", fsdp_signal_name(stop), t->step);
    return FSDP_EXIT_PREEMPTED;
}

int fsdp_trainer_setup(fsdp_trainer *t, fsdp_err *err) { return setup(t, err); }
void fsdp_trainer_teardown(fsdp_trainer *t) { teardown(t); }

const char *fsdp_trainer_per_what(const fsdp_trainer *t) { return t->be->kind == FSDP_DEVICE_CUDA ? "GPU" : "rank"; }

int fsdp_train(const fsdp_train_options *opt, fsdp_err *err) {
    fsdp_trainer t;
    memset(&t, 0, sizeof t);
    t.opt = *opt;
    t.world = MPI_COMM_WORLD;
    /* From the start: a signal while the run is set up or loads its checkpoint (a minute for 7B) is
     * kept and acted on at the first step boundary, instead of killing the rank. */
    fsdp_preemption_install();
    int rc = run(&t, err);
    teardown(&t);
    fsdp_preemption_uninstall();
    return rc;
}
