/* The training loop. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/fault.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/checkpoint.h"
#include "../io/hf_config.h"
#include "../io/jsonio.h"
#include "eval.h"
#include "hf_import.h"
#include "optimizer.h"

/* Where a step's time goes, from events on the compute stream (waits for communication included):
 * the first micro-batch's forward through the blocks, LM head (loss and its backward), backward
 * through the blocks and embedding; the remaining micro-batches with the last reductions; the
 * optimizer. */
enum { PHASE_START, PHASE_FORWARD, PHASE_HEAD, PHASE_BACKWARD, PHASE_REDUCED, PHASE_OPTIMIZER, PHASES };

enum { SCALAR_LOSS = 0, SCALAR_SUMSQ = 1, SCALAR_CLIP = 2, NUM_SCALARS = FSDP_STEP_SCALARS };

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
    return fsdp_hf_config_load(spec, cfg, err);
}

static int create_engine(fsdp_trainer *t, fsdp_err *err) {
    fsdp_unit_spec *specs = fsdp_xmalloc((size_t)t->layout.num_units * sizeof *specs, "unit specs");
    for (int u = 0; u < t->layout.num_units; u++) {
        specs[u].numel = t->layout.units[u].numel;
        specs[u].decay_numel = t->layout.units[u].decay_numel;
    }
    fsdp_shard_options so;
    fsdp_plan_shard_options(&t->cfg, &t->opt, t->topo.world, t->order, t->order_len, t->pinned, &so);
    t->embed_rows = so.rows_capacity > 0;
    t->eng = fsdp_engine_create(t->be, t->world, &t->topo, specs, t->layout.num_units, &so, err);
    free(specs);
    return t->eng ? 0 : -1;
}

/* The op scratch of a step's largest request, now (fsdp_device_op_scratch). */
static void reserve_scratch(fsdp_trainer *t) {
    int64_t total_shard = 0;
    for (int u = 0; u < t->layout.num_units; u++) total_shard += fsdp_engine_view(t->eng, u).len;
    fsdp_op_extent x;
    fsdp_plan_op_extent(&t->cfg, &t->opt, total_shard, &x);
    t->be->reserve_scratch(t->be, fsdp_device_op_scratch(t->be->kind, &x));
}

static int setup(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (fsdp_topology_detect(t->world, o->ranks_per_node, &t->topo, err) == 0) {
        if (o->init_from)
            fsdp_init_from_config(t->world, o->init_from, o->model, &t->cfg, err);
        else
            fsdp_train_load_model(o->model, &t->cfg, err);
    }
    if (fsdp_agree(&t->world, err)) return -1;
    fsdp_layout_build(&t->cfg, &t->layout);
    fsdp_plan_unit_order(&t->cfg, &t->layout, &t->order, &t->order_len, &t->pinned);

    fsdp_backend_options bo;
    memset(&bo, 0, sizeof bo);
    bo.kind = o->device;
    bo.act_dtype = o->compute_dtype;
    bo.grad_dtype = o->reduce_dtype;
    bo.local_rank = t->topo.local_rank;
    bo.local_size = t->topo.local_size;
    bo.memory_limit = fsdp_fit_backend_limit(t);
    t->be = fsdp_backend_create(&bo, err);
    if (fsdp_agree(&t->world, err)) return -1;
    fsdp_fit_choose(t, err); /* the micro-batch of --mbs auto, the accumulation of --global-batch */
    if (fsdp_agree(&t->world, err)) return -1;

    /* From here to fsdp_fit_check_setup every rank runs to the end even when memory runs out. */
    t->be->oom.deferred = 1;
    /* The model checks the batch shape (an OPT sequence beyond its positions, say) before the
     * engine takes the memory of the shards. */
    fsdp_model_shape shape = fsdp_plan_model_shape(o);
    t->model = fsdp_model_create(t->be, &t->cfg, &t->layout, &shape, err);
    if (fsdp_agree(&t->world, err)) return -1;

    if (create_engine(t, err)) return -1;

    if (fsdp_trainer_open_data(t, err)) return -1;

    size_t tokens = (size_t)o->grad_accum * o->mbs * o->seq;
    t->host_inputs = t->be->alloc_host(t->be, tokens * sizeof(int32_t), "token staging");
    t->host_targets = t->be->alloc_host(t->be, tokens * sizeof(int32_t), "token staging");
    t->dev_scalars = t->be->alloc(t->be, NUM_SCALARS * sizeof(float), "step scalars");
    t->host_scalars = t->be->alloc_host(t->be, NUM_SCALARS * sizeof(float), "step scalars");
    for (int i = 0; i < PHASES; i++) t->phase[i] = t->be->event_create(t->be, 1);
    reserve_scratch(t);
    if (fsdp_fit_check_setup(t, err)) return -1;
    t->sched.lr = o->lr;
    t->sched.min_lr = o->min_lr;
    t->sched.warmup = o->warmup;
    t->sched.total = o->steps;
    return 0;
}

static void teardown(fsdp_trainer *t) {
    if (t->metrics) fsdp_metrics_close(t->metrics);
    fsdp_data_close(&t->data);
    fsdp_data_close(&t->eval_data);
    if (t->be) {
        t->be->stream_synchronize(t->be, t->be->compute);
        fsdp_model_destroy(t->model);
        fsdp_engine_destroy(t->eng);
        if (t->host_inputs) t->be->free_host(t->be, t->host_inputs);
        if (t->host_targets) t->be->free_host(t->be, t->host_targets);
        if (t->host_scalars) t->be->free_host(t->be, t->host_scalars);
        if (t->dev_scalars) t->be->free(t->be, t->dev_scalars);
        for (int i = 0; i < PHASES; i++)
            if (t->phase[i]) t->be->event_destroy(t->be, t->phase[i]);
        t->be->destroy(t->be);
    }
    fsdp_layout_free(&t->layout);
    free(t->order);
    free(t->pinned);
}

/* ---- checkpoints ---- */

static int resolve_resume(fsdp_trainer *t, char *path, int cap, fsdp_err *err) {
    const char *r = t->opt.resume;
    if (!r) return 0;
    if (strcmp(r, "auto")) {
        snprintf(path, (size_t)cap, "%s", r);
        return 1;
    }
    int found = fsdp_ckpt_find_latest(t->opt.ckpt_dir, path, cap, err);
    if (found < 0) return -1;
    if (found == 0) fsdp_log("resume: no checkpoint in %s yet, starting from step 0\n", t->opt.ckpt_dir);
    return found;
}

static int save_checkpoint(fsdp_trainer *t, fsdp_err *err) {
    char name[64], path[4096];
    snprintf(name, sizeof name, "step-%08d.h5", t->step);
    snprintf(path, sizeof path, "%s/%s", t->opt.ckpt_dir, name);
    double t0 = fsdp_now();
    if (fsdp_trainer_save(t, path, err)) return -1;
    if (fsdp_rank() == 0) {
        if (fsdp_ckpt_set_latest(t->opt.ckpt_dir, name, err) == 0) fsdp_ckpt_prune(t->opt.ckpt_dir, t->opt.keep, err);
    }
    if (fsdp_agree(&t->world, err)) return -1;
    fsdp_log("checkpoint: step %d written to %s in %.1f s\n", t->step, path, fsdp_now() - t0);
    return 0;
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
    if (fsdp_agree(&t->world, err)) return -1;
    fsdp_mpi_allreduce(&counted, 1, MPI_INT64_T, MPI_SUM, t->world, "the global token count of the step");
    return counted;
}

static void mark(fsdp_trainer *t, int a, int phase) {
    if (a == 0) t->be->event_record(t->be, t->phase[phase], t->be->compute);
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
    be->copy_h2d(be, fsdp_model_tokens(m), t->host_inputs + at, n * sizeof(int32_t), be->compute);
    be->copy_h2d(be, fsdp_model_targets(m), t->host_targets + at, n * sizeof(int32_t), be->compute);

    const void *embed = fsdp_engine_params(e, E);
    fsdp_model_embed_forward(m, embed);
    fsdp_engine_done_forward(e, E);
    for (int i = 0; i < L; i++) {
        int u = fsdp_unit_block(l, i);
        fsdp_model_block_forward(m, i, fsdp_engine_params(e, u));
        fsdp_engine_done_forward(e, u);
    }
    if (a == 0) fsdp_fault_point(t->step + 1);
    mark(t, a, PHASE_FORWARD);
    const void *head = fsdp_engine_params(e, H);
    void *head_grads = fsdp_engine_grads(e, H);
    int tied = t->cfg.tie_word_embeddings;
    fsdp_model_head(m, head, head_grads, tied ? embed : NULL, tied ? fsdp_engine_grads(e, E) : NULL, grad_scale,
                    t->dev_scalars + SCALAR_LOSS);
    fsdp_engine_done_backward(e, H);
    /* With rows, the dense part of a tied matrix is only the head's share: reduce it now, behind the
     * blocks' backward, instead of at the end of the micro-batch. */
    if (t->embed_rows && tied) fsdp_engine_done_backward(e, E);
    mark(t, a, PHASE_HEAD);
    for (int i = L - 1; i >= 0; i--) {
        int u = fsdp_unit_block(l, i);
        const void *p = fsdp_engine_params(e, u);
        fsdp_model_block_backward(m, i, p, fsdp_engine_grads(e, u));
        fsdp_engine_done_backward(e, u);
    }
    if (t->embed_rows) {
        fsdp_row_set sets[FSDP_MAX_ROW_SETS];
        const void *values;
        int count, row_len;
        int nsets = fsdp_model_embed_grad_rows(m, sets, &values, &count, &row_len);
        fsdp_engine_add_rows(e, E, sets, nsets, values, count, row_len);
    } else {
        fsdp_model_embed_backward(m, NULL, fsdp_engine_grads(e, E));
    }
    fsdp_engine_done_backward(e, E);
    mark(t, a, PHASE_BACKWARD);
}

typedef struct {
    double loss, grad_norm, lr, step_ms, comm_wait_ms;
    double phase_ms[PHASES - 1]; /* between consecutive PHASE_* events */
} step_result;

static int train_step(fsdp_trainer *t, step_result *r, fsdp_err *err) {
    fsdp_backend *be = t->be;
    const fsdp_train_options *o = &t->opt;
    double t0 = fsdp_now();
    int64_t counted = load_step_data(t, err);
    if (counted < 0) return -1;
    float grad_scale = counted > 0 ? 1.0f / (float)counted : 0.0f;

    be->zero(be, t->dev_scalars, NUM_SCALARS * sizeof(float), be->compute);
    fsdp_engine_begin_step(t->eng);
    mark(t, 0, PHASE_START);
    for (int a = 0; a < o->grad_accum; a++) microbatch(t, a, grad_scale);
    fsdp_engine_wait_reductions(t->eng);
    mark(t, 0, PHASE_REDUCED);
    r->comm_wait_ms = fsdp_engine_take_comm_wait_ms(t->eng);

    int step = t->step + 1;
    fsdp_adamw_args args = {(float)fsdp_schedule_lr(&t->sched, step), (float)o->beta1, (float)o->beta2,
                            (float)o->adam_eps, (float)o->weight_decay, step};
    fsdp_optimizer_scalars sc = {t->dev_scalars + SCALAR_SUMSQ, t->dev_scalars + SCALAR_CLIP};
    fsdp_optimizer_step(be, t->eng, t->layout.num_units, o->master_dtype, o->compute_dtype, &args, (float)o->clip,
                        &sc);
    mark(t, 0, PHASE_OPTIMIZER);
    be->copy_d2h(be, t->host_scalars, t->dev_scalars, NUM_SCALARS * sizeof(float), be->compute);
    be->stream_synchronize(be, be->compute);
    for (int i = 0; i + 1 < PHASES; i++) r->phase_ms[i] = be->event_elapsed_ms(be, t->phase[i], t->phase[i + 1]);

    double loss_sum = t->host_scalars[SCALAR_LOSS];
    fsdp_mpi_allreduce(&loss_sum, 1, MPI_DOUBLE, MPI_SUM, t->world, "the loss of the step");
    r->loss = counted > 0 ? loss_sum / (double)counted : 0.0;
    r->grad_norm = sqrt((double)t->host_scalars[SCALAR_SUMSQ]);
    r->lr = args.lr;
    r->step_ms = (fsdp_now() - t0) * 1e3;
    t->step = step;
    t->samples_seen += (uint64_t)o->grad_accum * (uint64_t)o->mbs * (uint64_t)t->topo.world;
    if (!isfinite(r->loss)) return fsdp_errf(err, "the loss became %g at step %d", r->loss, step);
    return 0;
}

/* ---- reporting ---- */

static void format_eta(double seconds, char *buf, size_t cap) {
    long s = (long)(seconds + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
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
        fsdp_log("step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s/GPU | %.1f ms | comm wait %.1f%%%s | "
                 "ETA %s\n",
                 width, t->step, o->steps, r->loss, r->lr, r->grad_norm, tps, r->step_ms,
                 r->step_ms > 0 ? 100.0 * r->comm_wait_ms / r->step_ms : 0.0, eval, eta);
    }
    if (t->metrics) {
        const double *p = r->phase_ms;
        json_t *rec = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I}", "step", t->step,
                                "loss", fsdp_json_number(r->loss), "lr", fsdp_json_number(r->lr), "grad_norm",
                                fsdp_json_number(r->grad_norm), "tokens_per_s_per_gpu", fsdp_json_number(tps),
                                "step_ms", fsdp_json_number(r->step_ms), "comm_wait_ms",
                                fsdp_json_number(r->comm_wait_ms), "forward_ms", fsdp_json_number(p[0]), "head_ms",
                                fsdp_json_number(p[1]), "backward_ms", fsdp_json_number(p[2]), "rest_ms",
                                fsdp_json_number(p[3]), "optimizer_ms", fsdp_json_number(p[4]), "samples_seen",
                                (json_int_t)t->samples_seen);
        if (!rec) fsdp_fatal("out of host memory building a metrics record");
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
    /* A model path that is not UTF-8 cannot be a JSON string: null keeps the other fields. */
    json_t *model = json_string(o->model);
    json_t *cfg = json_pack("{s:o, s:I, s:i, s:i, s:i, s:I, s:I, s:s, s:s, s:s, s:i, s:i}", "model",
                            model ? model : json_null(), "params", (json_int_t)fsdp_model_num_params(&t->cfg),
                            "mbs", o->mbs, "seq", o->seq, "grad_accum", o->grad_accum, "global_batch",
                            (json_int_t)global_batch, "tokens_per_step", (json_int_t)(global_batch * o->seq),
                            "model_precision", fsdp_dtype_name(o->master_dtype), "mixed_precision",
                            o->compute_dtype == FSDP_BF16 ? "bf16" : "no", "attn",
                            o->attn == FSDP_ATTN_FLASH ? "flash" : "eager", "nodes", t->topo.num_nodes,
                            "ranks_per_node", t->topo.node_size);
    if (!cfg) fsdp_fatal("out of host memory building the metrics summary");
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
        t->be->memory_info(t->be, &free_b, &total);
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
        json_t *rec = json_pack("{s:b, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:i, s:s, s:s}", "summary", 1, "steps",
                                steps_run, "final_step", t->step, "tokens_per_s_per_gpu", fsdp_json_number(tps),
                                "tokens_per_s_per_gpu_course", fsdp_json_number(course), "tflops_per_gpu",
                                fsdp_json_number(tflops), "mfu",
                                fsdp_json_number(t->be->peak_tflops > 0 ? tflops / t->be->peak_tflops : 0.0),
                                "max_reserved_gib", fsdp_json_number(gib), "world_size", t->topo.world, "strategy",
                                fsdp_strategy_name(o->strategy), "device", t->be->device_name);
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
    fsdp_log("device %s x %d ranks | strategy %s (shard group %d, replica group %d) | %s master, %s compute, %s "
             "reduce | attention %s | embedding gradient %s\n",
             t->be->device_name, t->topo.world, fsdp_strategy_name(o->strategy), fsdp_engine_shard_size(t->eng),
             fsdp_engine_replica_size(t->eng), fsdp_dtype_name(o->master_dtype), fsdp_dtype_name(o->compute_dtype),
             fsdp_dtype_name(o->reduce_dtype), o->attn == FSDP_ATTN_FLASH ? "flash" : "eager",
             t->embed_rows ? "rows" : "dense");
    char data[1024];
    fsdp_data_describe(&t->data, data, sizeof data);
    fsdp_log("batch: %d per rank x %d accumulation x %d ranks = %d samples of %d tokens per step | data %s\n", o->mbs,
             o->grad_accum, t->topo.world, o->mbs * o->grad_accum * t->topo.world, o->seq, data);
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
    if (setup_fitting(t, err)) return -1;

    char resume_path[4096];
    int resume = resolve_resume(t, resume_path, sizeof resume_path, err);
    if (fsdp_agree(&t->world, err)) return -1;
    if (resume > 0) {
        if (fsdp_trainer_load(t, resume_path, err)) return -1;
        fsdp_log("resumed from %s at step %d (%llu samples seen)\n", resume_path, t->step,
                 (unsigned long long)t->samples_seen);
    } else if (o->init_from) {
        if (fsdp_trainer_init_from(t, err)) return -1;
    } else {
        fsdp_trainer_init_weights(t);
    }
    if (o->ckpt_dir && fsdp_rank() == 0 && mkdir(o->ckpt_dir, 0777) != 0) {
        struct stat st;
        if (stat(o->ckpt_dir, &st) != 0 || !S_ISDIR(st.st_mode))
            fsdp_errf(err, "--ckpt-dir %s cannot be created", o->ckpt_dir);
    }
    if (o->metrics && fsdp_rank() == 0) t->metrics = fsdp_metrics_open(o->metrics, resume > 0, err);
    if (fsdp_agree(&t->world, err)) return -1;

    describe_run(t);
    if (t->step >= o->steps) {
        fsdp_log("nothing to do: the run is at step %d and --steps is %d\n", t->step, o->steps);
        return 0;
    }
    double start = fsdp_now(), timed_s = 0.0;
    int first = t->step, timed_steps = 0;
    while (t->step < o->steps) {
        step_result r;
        if (train_step(t, &r, err)) break;
        /* The first step pays for allocation and kernel selection: throughput counts the rest. */
        if (t->step > first + 1 || o->steps - first == 1) {
            timed_s += r.step_ms / 1e3;
            timed_steps++;
        }
        fsdp_eval_result ev, *evaluated = NULL;
        if (o->eval_data && o->eval_every > 0 && t->step % o->eval_every == 0) {
            if (fsdp_evaluate(t, &t->eval_data, &ev, err)) break;
            evaluated = &ev;
        }
        double avg = (fsdp_now() - start) / (t->step - first);
        double tps = (double)o->grad_accum * o->mbs * o->seq / (r.step_ms / 1e3);
        report_step(t, &r, tps, avg * (o->steps - t->step), evaluated, err);
        if (o->ckpt_dir && ((o->ckpt_every > 0 && t->step % o->ckpt_every == 0) || t->step == o->steps))
            if (save_checkpoint(t, err)) break;
    }
    if (fsdp_agree(&t->world, err)) return -1;
    /* The end of a run is always evaluated, whatever --eval-every. */
    if (o->eval_data && (o->eval_every <= 0 || t->step % o->eval_every != 0)) {
        fsdp_eval_result ev;
        if (fsdp_evaluate(t, &t->eval_data, &ev, err)) return -1;
        fsdp_eval_log(t, "eval at the end", &ev);
        if (fsdp_rank() == 0 && t->metrics) fsdp_eval_record(t, &ev, err);
    }
    report_summary(t, t->step - first, timed_s, timed_steps, fsdp_now() - start, err);
    return fsdp_agree(&t->world, err);
}

int fsdp_trainer_setup(fsdp_trainer *t, fsdp_err *err) { return setup(t, err); }
void fsdp_trainer_teardown(fsdp_trainer *t) { teardown(t); }

int fsdp_train(const fsdp_train_options *opt, fsdp_err *err) {
    fsdp_trainer t;
    memset(&t, 0, sizeof t);
    t.opt = *opt;
    t.world = MPI_COMM_WORLD;
    int rc = run(&t, err);
    teardown(&t);
    return rc;
}
