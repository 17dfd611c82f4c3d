/* Forward-only evaluation over a whole token file (eval.h). */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "../base/files.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/checkpoint.h"
#include "../io/jsonio.h"
#include "hf_import.h"
#include "run_identity.h"
#include "run_outputs.h"

/* One micro-batch forward, its loss summed into `loss_sum` (device). The tied embedding is the
 * head's matrix: it stays gathered until the head has read it. */
static void forward(fsdp_trainer *t, float *loss_sum) {
    fsdp_backend *be = t->be;
    fsdp_engine *e = t->eng;
    fsdp_model *m = t->model;
    const fsdp_layout *l = &t->layout;
    int L = t->cfg.num_layers, E = fsdp_unit_embed(l), H = fsdp_unit_head(l), tied = t->cfg.tie_word_embeddings;
    size_t n = (size_t)t->opt.mbs * t->opt.seq;
    fsdp_engine_begin_forward(e);
    be->runtime->copy_h2d(be, fsdp_model_tokens(m), t->host_inputs, n * sizeof(int32_t), be->compute);
    be->runtime->copy_h2d(be, fsdp_model_targets(m), t->host_targets, n * sizeof(int32_t), be->compute);
    const void *embed = fsdp_engine_params(e, E);
    fsdp_model_embed_forward(m, embed);
    if (!tied) fsdp_engine_done_forward(e, E);
    for (int i = 0; i < L; i++) {
        int u = fsdp_unit_block(l, i);
        const void *p = fsdp_engine_params(e, u);
        fsdp_fp8_weight w8[FSDP_FP8_MAX_MATRICES]; /* the products' weights, if the gather brought them in FP8 */
        fsdp_model_set_fp8_weights(m, fsdp_engine_fp8_weights(e, u, w8) ? w8 : NULL);
        fsdp_model_block_forward(m, i, p);
        fsdp_engine_done_forward(e, u);
    }
    fsdp_model_head_loss(m, fsdp_engine_params(e, H), tied ? embed : NULL, loss_sum);
    fsdp_engine_done_forward(e, H);
    if (tied) fsdp_engine_done_forward(e, E);
}

/* This rank's rows of micro-batch a; returns the tokens they count (-1 on a data error). */
static int64_t load(fsdp_trainer *t, fsdp_data *data, uint64_t a, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    int64_t counted = 0;
    for (int b = 0; b < o->mbs; b++) {
        uint64_t index = (a * (uint64_t)t->topo.world + (uint64_t)t->topo.rank) * (uint64_t)o->mbs + (uint64_t)b;
        size_t at = (size_t)b * (size_t)o->seq;
        if (fsdp_data_sample(data, index, t->host_inputs + at, t->host_targets + at, err)) return -1;
        for (int i = 0; i < o->seq; i++) counted += t->host_targets[at + (size_t)i] >= 0;
    }
    return counted;
}

/* Every micro-batch of the file; *loss and *counted are this rank's sums. */
static int run_batches(fsdp_trainer *t, fsdp_data *data, double *loss, int64_t *counted, fsdp_err *err) {
    fsdp_backend *be = t->be;
    const fsdp_train_options *o = &t->opt;
    uint64_t per_batch = (uint64_t)t->topo.world * (uint64_t)o->mbs;
    uint64_t batches = (data->samples + per_batch - 1) / per_batch;
    float *loss_dev = t->dev_scalars + FSDP_SCALAR_EVAL_LOSS;
    double start = fsdp_now(), last = start;
    for (uint64_t a = 0; a < batches; a++) {
        int64_t c = load(t, data, a, err);
        if (fsdp_agree(t->world, err)) return -1;
        be->runtime->zero(be, loss_dev, sizeof(float), be->compute);
        forward(t, loss_dev);
        be->runtime->copy_d2h(be, t->host_scalars + FSDP_SCALAR_EVAL_LOSS, loss_dev, sizeof(float), be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        fsdp_engine_take_comm_wait_ms(t->eng); /* only to recycle the engine's timing events */
        /* Summed per micro-batch in double: a long file's loss does not drift with fp32 sums. */
        *loss += t->host_scalars[FSDP_SCALAR_EVAL_LOSS];
        *counted += c;
        double now = fsdp_now();
        if (now - last >= 10.0 && a + 1 < batches) {
            last = now;
            double rate = (double)(a + 1) / (now - start);
            fsdp_log("eval: %llu/%llu micro-batches | %.0f tok/s/%s | ETA %.0f s\n", (unsigned long long)(a + 1),
                     (unsigned long long)batches, rate * (double)o->mbs * o->seq,
                     fsdp_trainer_per_what(t), (double)(batches - a - 1) / rate);
        }
    }
    return 0;
}

int fsdp_evaluate(fsdp_trainer *t, fsdp_data *data, fsdp_eval_result *out, fsdp_err *err) {
    double start = fsdp_now(), loss = 0.0;
    int64_t counted = 0;
    /* Evaluation runs the model without dropout; every training micro-batch turns it on again with
     * its own samples' masks (trainer.c). */
    fsdp_model_set_dropout(t->model, 0, 0, 0);
    int rc = run_batches(t, data, &loss, &counted, err);
    if (rc) return -1;
    fsdp_mpi_allreduce(&loss, 1, MPI_DOUBLE, MPI_SUM, t->world, "the evaluation loss");
    fsdp_mpi_allreduce(&counted, 1, MPI_INT64_T, MPI_SUM, t->world, "the evaluation token count");
    if (counted == 0)
        return fsdp_errf(err, "%s %s: no token of it counts in the loss (every target is masked or padding)", data->flag,
                         data->file.path);
    out->loss = loss / (double)counted;
    out->ppl = exp(out->loss);
    out->tokens = counted;
    out->samples = data->samples;
    out->seconds = fsdp_now() - start;
    if (!isfinite(out->loss)) return fsdp_errf(err, "the evaluation loss became %g at step %d", out->loss, t->step);
    return 0;
}

void fsdp_eval_log(const fsdp_trainer *t, const char *what, const fsdp_eval_result *r) {
    fsdp_log("%s: step %d | eval loss %.4f | eval ppl %.2f | %lld tokens in %llu samples | %.1f s\n", what, t->step,
             r->loss, r->ppl, (long long)r->tokens, (unsigned long long)r->samples, r->seconds);
}

void fsdp_eval_record(fsdp_trainer *t, const fsdp_eval_result *r, fsdp_err *err) {
    if (fsdp_rank() != 0 || !t->metrics) return;
    json_t *rec = json_pack("{s:i, s:o, s:o, s:I}", "step", t->step, "eval_loss", fsdp_json_number(r->loss), "eval_ppl",
                            fsdp_json_number(r->ppl), "eval_tokens", (json_int_t)r->tokens);
    if (!rec) fsdp_fatal("out of host memory building an evaluation record");
    /* `fsdp eval`'s own record says so, and what it scored on which data: `fsdp report` lists it
     * as an evaluation, not as a training run that stopped (docs/FORMATS.md). Paths that are not
     * UTF-8 are left out. */
    if (t->opt.forward_only) {
        json_t *what = json_string(t->opt.init_from), *data = json_string(t->opt.data);
        if (json_object_set_new(rec, "record", json_string("evaluation")) ||
            (what && json_object_set_new(rec, "evaluated", what)) || (data && json_object_set_new(rec, "data", data)))
            fsdp_fatal("out of host memory building an evaluation record");
    }
    fsdp_metrics_write(t->metrics, rec, err);
    json_decref(rec);
}

/* The step of the checkpoint evaluated (0 for a Hugging Face model), and a note when the data's ids
 * are not those it was trained on (run_identity.h). */
static int checkpoint_step(fsdp_trainer *t, fsdp_err *err) {
    struct stat st;
    if (stat(t->opt.init_from, &st) != 0 || S_ISDIR(st.st_mode)) return 0;
    fsdp_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    if (fsdp_ckpt_read_meta(t->world, t->opt.init_from, &meta, err)) return -1;
    t->step = (int)meta.step;
    fsdp_identity_note_eval(t->opt.init_from, meta.identity_json, &t->data, t->opt.data);
    fsdp_ckpt_meta_free(&meta);
    return 0;
}

static int run(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (fsdp_trainer_setup(t, err) || checkpoint_step(t, err) || fsdp_trainer_init_from(t, err)) return -1;
    if (o->metrics && fsdp_rank() == 0 && fsdp_run_outputs_metrics_dir(o->metrics, err) == 0 &&
        fsdp_regular_or_absent(o->metrics, "--metrics", err) >= 0)
        t->metrics = fsdp_metrics_open(o->metrics, 1, err);
    if (fsdp_agree(t->world, err)) return -1;
    char model[256], data[1024];
    fsdp_model_config_describe(&t->cfg, model, sizeof model);
    fsdp_data_describe(&t->data, data, sizeof data);
    fsdp_log("fsdp.c %s | eval %s: %s\n", FSDP_VERSION, o->init_from, model);
    fsdp_log("device %s x %d ranks | strategy %s | %s weights, %s compute | %d samples of %d tokens per rank and "
             "micro-batch | data %s\n",
             t->be->device_name, t->topo.world, fsdp_strategy_name(o->strategy), fsdp_dtype_name(o->master_dtype),
             fsdp_dtype_name(o->compute_dtype), o->mbs, o->seq, data);
    fsdp_eval_result r;
    if (fsdp_evaluate(t, &t->data, &r, err)) return -1;
    fsdp_eval_log(t, "eval", &r);
    fsdp_eval_record(t, &r, err);
    return fsdp_agree(t->world, err);
}

int fsdp_eval_run(const fsdp_train_options *o, fsdp_err *err) {
    fsdp_trainer t;
    memset(&t, 0, sizeof t);
    t.opt = *o;
    t.opt.forward_only = 1;
    t.world = MPI_COMM_WORLD;
    int rc = run(&t, err);
    fsdp_trainer_teardown(&t);
    return rc;
}
