/* Between the engine's shards (and the optimizer's moments of them) and the checkpoint file: shards
 * become per-tensor pieces by intersecting each rank's flat range with the parameters' offsets, so
 * that any layout writes and reads the same file. A snapshot buffer holds master weights, first and
 * second moments of every unit one after the other, in the master dtype exactly as the device holds them (the checkpoint
 * writer widens bf16 to fp32 on its way to disk). Also the initial weights, computed for exactly
 * the elements a rank owns. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/host_threads.h"
#include "../base/log.h"
#include "../io/hf_config.h"
#include "../io/jsonio.h"
#include "checkpointing.h"
#include "run_identity.h"

static int64_t total_shard(const fsdp_trainer *t) {
    int64_t n = 0;
    for (int u = 0; u < t->layout.num_units; u++) n += fsdp_engine_view(t->eng, u).len;
    return n;
}

static size_t master_size(const fsdp_trainer *t) { return t->be->runtime->dtype_size(t->be, t->opt.master_dtype); }

/* Master weights, first and second moments. */
size_t fsdp_snapshot_bytes(int64_t shard_elems, size_t master_size) { return 3 * (size_t)shard_elems * master_size; }

size_t fsdp_trainer_snapshot_bytes(const fsdp_trainer *t) { return fsdp_snapshot_bytes(total_shard(t), master_size(t)); }

fsdp_dtype fsdp_trainer_snapshot_dtype(const fsdp_trainer *t) { return master_size(t) == 4 ? FSDP_F32 : FSDP_BF16; }

void fsdp_trainer_snapshot(fsdp_trainer *t, void *host) {
    fsdp_backend *be = t->be;
    size_t es = master_size(t), total = (size_t)total_shard(t), base = 0;
    char *out = host;
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        fsdp_optimizer_state state = fsdp_optimizer_unit_state(t->optim, u);
        size_t bytes = (size_t)view.len * es;
        be->runtime->copy_d2h(be, out + base * es, view.master, bytes, be->compute);
        be->runtime->copy_d2h(be, out + (total + base) * es, state.m, bytes, be->compute);
        be->runtime->copy_d2h(be, out + (2 * total + base) * es, state.v, bytes, be->compute);
        base += (size_t)view.len;
    }
    be->runtime->stream_synchronize(be, be->compute);
}

/* A snapshot-layout buffer back into the shards. */
static void restore(fsdp_trainer *t, void *host) {
    fsdp_backend *be = t->be;
    size_t es = master_size(t), total = (size_t)total_shard(t), base = 0;
    char *in = host;
    /* A bf16 master emulated in fp32 storage (the CPU backend) keeps bf16 values. */
    if (t->opt.master_dtype == FSDP_BF16 && es == 4) {
        float *f = host;
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < 3 * total; i++) f[i] = fsdp_round_bf16(f[i]);
    }
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        fsdp_optimizer_state state = fsdp_optimizer_unit_state(t->optim, u);
        size_t bytes = (size_t)view.len * es;
        be->runtime->copy_h2d(be, view.master, in + base * es, bytes, be->compute);
        be->runtime->copy_h2d(be, state.m, in + (total + base) * es, bytes, be->compute);
        be->runtime->copy_h2d(be, state.v, in + (2 * total + base) * es, bytes, be->compute);
        base += (size_t)view.len;
    }
    be->runtime->stream_synchronize(be, be->compute);
    fsdp_engine_refresh_working(t->eng);
}

fsdp_ckpt_tensor *fsdp_trainer_tensor_table(const fsdp_trainer *t) {
    fsdp_ckpt_tensor *tab = fsdp_xcalloc((size_t)t->layout.num_params, sizeof *tab, "the tensor table");
    for (int i = 0; i < t->layout.num_params; i++) {
        const fsdp_param_desc *p = &t->layout.params[i];
        tab[i].name = p->name;
        tab[i].ndim = p->ndim;
        tab[i].shape[0] = p->shape[0];
        tab[i].shape[1] = p->shape[1];
    }
    return tab;
}

int fsdp_trainer_unit_spans(const fsdp_trainer *t, int u, fsdp_shard_span *out) {
    int n = 0;
    fsdp_shard_view view = fsdp_engine_view(t->eng, u);
    const fsdp_unit_desc *ud = &t->layout.units[u];
    int64_t lo = view.start, hi = view.start + view.valid;
    for (int k = 0; k < ud->num_params; k++) {
        int pi = ud->first_param + k;
        const fsdp_param_desc *p = &t->layout.params[pi];
        int64_t a = p->offset > lo ? p->offset : lo;
        int64_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b) continue;
        out[n++] = (fsdp_shard_span){pi, a - p->offset, b - a, a - view.start};
    }
    return n;
}

/* Pieces of unit u's shard, pointing into host arrays of es-byte elements laid out like the device
 * shard (m, v may be NULL). */
static int unit_pieces(const fsdp_trainer *t, int u, char *master, char *m, char *v, size_t es, fsdp_ckpt_piece *out) {
    fsdp_shard_span *spans = fsdp_xcalloc((size_t)t->layout.units[u].num_params + 1, sizeof *spans, "shard spans");
    int n = fsdp_trainer_unit_spans(t, u, spans);
    for (int i = 0; i < n; i++) {
        size_t at = (size_t)spans[i].offset * es;
        out[i].tensor = spans[i].tensor;
        out[i].start = spans[i].start;
        out[i].count = spans[i].count;
        out[i].param = master + at;
        out[i].exp_avg = m ? m + at : NULL;
        out[i].exp_avg_sq = v ? v + at : NULL;
    }
    free(spans);
    return n;
}

int fsdp_trainer_unit_pieces(const fsdp_trainer *t, int u, float *master, float *m, float *v, fsdp_ckpt_piece *out) {
    return unit_pieces(t, u, (char *)master, (char *)m, (char *)v, sizeof(float), out);
}

size_t fsdp_trainer_master_staging_bytes(const fsdp_trainer *t, int64_t elems) {
    size_t es = master_size(t);
    return es == 4 && t->opt.master_dtype == FSDP_F32 ? 0 : (size_t)elems * es;
}

void fsdp_trainer_unit_set_master_range(fsdp_trainer *t, int u, int64_t start, int64_t count, const float *master,
                                        void *staged) {
    fsdp_backend *be = t->be;
    fsdp_shard_view view = fsdp_engine_view(t->eng, u);
    size_t es = master_size(t), n = (size_t)count;
    if (start < 0 || count < 0 || start + count > view.len)
        fsdp_fatal("fsdp_trainer_unit_set_master_range: elements [%lld, %lld) outside unit %d's shard of %lld",
                   (long long)start, (long long)(start + count), u, (long long)view.len);
    void *dest = (char *)view.master + (size_t)start * es;
    if (es == 4 && t->opt.master_dtype == FSDP_F32) { /* nothing to convert */
        be->runtime->copy_h2d(be, dest, master, n * 4, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        if (es == 2)
            ((uint16_t *)staged)[i] = fsdp_f32_to_bf16(master[i]);
        else
            ((float *)staged)[i] = fsdp_round_bf16(master[i]); /* a bf16 master emulated in fp32 storage */
    }
    be->runtime->copy_h2d(be, dest, staged, n * es, be->compute);
    be->runtime->stream_synchronize(be, be->compute);
}

void fsdp_trainer_unit_set_master(fsdp_trainer *t, int u, const float *master) {
    int64_t len = fsdp_engine_view(t->eng, u).len;
    size_t bytes = fsdp_trainer_master_staging_bytes(t, len);
    void *staged = bytes ? fsdp_xmalloc(bytes, "weights staging") : NULL;
    fsdp_trainer_unit_set_master_range(t, u, 0, len, master, staged);
    free(staged);
}

fsdp_ckpt_piece *fsdp_trainer_pieces(const fsdp_trainer *t, void *host, int writers_only, int *count) {
    fsdp_ckpt_piece *out = fsdp_xcalloc((size_t)t->layout.num_params + 1, sizeof *out, "checkpoint pieces");
    *count = 0;
    /* Replicas hold identical shards: the first replica writes for all. */
    if (writers_only && fsdp_engine_replica_rank(t->eng) != 0) return out;
    size_t es = master_size(t), total = (size_t)total_shard(t);
    char *m = (char *)host + total * es, *v = (char *)host + 2 * total * es;
    int n = 0;
    size_t base = 0;
    for (int u = 0; u < t->layout.num_units; u++) {
        n += unit_pieces(t, u, (char *)host + base, m + base, v + base, es, out + n);
        base += (size_t)fsdp_engine_view(t->eng, u).len * es;
    }
    *count = n;
    return out;
}

void fsdp_trainer_meta(const fsdp_trainer *t, fsdp_ckpt_meta *meta) {
    memset(meta, 0, sizeof *meta);
    meta->config_json = fsdp_xcalloc(8192, 1, "the config record");
    if (fsdp_hf_config_write(&t->cfg, meta->config_json, 8192) < 0) fsdp_fatal("the model config does not fit 8 KiB");
    json_t *schedule_record = fsdp_schedule_json(&t->sched, t->step);
    meta->schedule_json = fsdp_json_text(schedule_record, 0, 17);
    json_decref(schedule_record);
    meta->run_json = strdup(t->opt.run_json ? t->opt.run_json : "{}");
    meta->identity_json = fsdp_identity_text(&t->cfg, &t->data);
    if (!meta->schedule_json || !meta->run_json) fsdp_fatal("out of host memory writing the checkpoint's records");
    meta->step = t->step;
    meta->samples_seen = (int64_t)t->samples_seen;
    meta->seed = t->opt.seed;
    meta->world_size = t->topo.world;
    snprintf(meta->strategy, sizeof meta->strategy, "%s", fsdp_strategy_name(t->opt.strategy));
}

void fsdp_trainer_meta_free(fsdp_ckpt_meta *meta) { fsdp_ckpt_meta_free(meta); }

int fsdp_trainer_save(fsdp_trainer *t, const char *path, fsdp_err *err) {
    void *host = t->be->runtime->alloc_host(t->be, fsdp_trainer_snapshot_bytes(t), "checkpoint snapshot");
    fsdp_trainer_snapshot(t, host);
    fsdp_ckpt_tensor *tensors = fsdp_trainer_tensor_table(t);
    int num_pieces = 0;
    fsdp_ckpt_piece *pieces = fsdp_trainer_pieces(t, host, 1, &num_pieces);
    fsdp_ckpt_meta meta;
    fsdp_trainer_meta(t, &meta);
    fsdp_ckpt_writer *w = fsdp_ckpt_begin(t->world, path, tensors, t->layout.num_params, pieces, num_pieces,
                                          fsdp_trainer_snapshot_dtype(t), &meta, err);
    int rc = w ? fsdp_ckpt_commit(w, err) : -1;
    fsdp_trainer_meta_free(&meta);
    free(pieces);
    free(tensors);
    t->be->runtime->free_host(t->be, host);
    return rc;
}

/* The attributes a resumed run takes over must fit this run's model and schedule, and what trained
 * the checkpoint must be what this run trains on (run_identity.h), unless a flag says otherwise. */
static int check_saved(fsdp_trainer *t, const char *path, const fsdp_ckpt_meta *meta, fsdp_err *err) {
    fsdp_model_config saved;
    fsdp_err cfg_err = {0};
    if (!meta->config_json || fsdp_hf_config_parse(meta->config_json, strlen(meta->config_json), path, &saved, &cfg_err))
        return fsdp_errf(err, "checkpoint %s: its model config cannot be read (%s)", path, cfg_err.msg);
    if (!fsdp_model_config_same_shape(&saved, &t->cfg)) {
        char have[256], want[256];
        fsdp_model_config_describe(&saved, have, sizeof have);
        fsdp_model_config_describe(&t->cfg, want, sizeof want);
        return fsdp_errf(err, "checkpoint %s holds a different model (%s) than --model %s (%s)", path, have,
                         t->opt.model, want);
    }
    if (fsdp_schedule_check_record(meta->schedule_json, meta->step, path, err) ||
        fsdp_schedule_check_resume(meta->schedule_json, &t->sched, meta->step, t->opt.allow_schedule_change, path,
                                   err))
        return -1;
    fsdp_identity_resume r = {path, t->opt.model ? t->opt.model : "(the checkpoint's)", &t->cfg, &t->data,
                              t->opt.data ? t->opt.data : "synthetic", t->opt.allow_data_change,
                              t->opt.allow_config_change};
    return fsdp_identity_check_resume(&r, meta->identity_json, err);
}

int fsdp_trainer_load_into(fsdp_trainer *t, const char *path, void *host, fsdp_err *err) {
    fsdp_ckpt_meta meta;
    if (fsdp_ckpt_read_meta(t->world, path, &meta, err)) return -1;
    if (check_saved(t, path, &meta, err)) {
        fsdp_ckpt_meta_free(&meta);
        return -1;
    }
    if (meta.format_version < 2)
        fsdp_warn("checkpoint %s has format version %d, written before checksums: its contents cannot be verified",
                  path, meta.format_version);
    void *own = host ? NULL : t->be->runtime->alloc_host(t->be, fsdp_trainer_snapshot_bytes(t), "checkpoint staging");
    fsdp_ckpt_tensor *tensors = fsdp_trainer_tensor_table(t);
    int num_pieces = 0;
    fsdp_ckpt_piece *pieces = fsdp_trainer_pieces(t, host ? host : own, 0, &num_pieces);
    int rc = fsdp_ckpt_read_as(t->world, path, tensors, t->layout.num_params, pieces, num_pieces,
                               fsdp_trainer_snapshot_dtype(t), err);
    if (rc == 0) {
        restore(t, host ? host : own);
        t->step = (int)meta.step;
        t->samples_seen = (uint64_t)meta.samples_seen;
        if (meta.seed != t->opt.seed)
            fsdp_warn("the checkpoint's seed %llu replaces --seed %llu so that the data continues where it was",
                      (unsigned long long)meta.seed, (unsigned long long)t->opt.seed);
        t->opt.seed = meta.seed;
        t->data.seed = meta.seed;
    }
    free(pieces);
    free(tensors);
    if (own) t->be->runtime->free_host(t->be, own);
    fsdp_ckpt_meta_free(&meta);
    return rc;
}

int fsdp_trainer_load(fsdp_trainer *t, const char *path, fsdp_err *err) { return fsdp_trainer_load_into(t, path, NULL, err); }

/* The initial weights, one unit at a time: the host holds one unit's shard (fp32, and its master-dtype
 * copy) at once, not the model's (two whole copies of the weights, 9.2 GiB for Llama-3.2-1B, were
 * more than the plan left free on a 24 GB host). */
size_t fsdp_trainer_init_staging_bytes(int64_t largest_shard, size_t master_size) {
    return (size_t)largest_shard * (4 + (master_size != 4 ? master_size : 0));
}

void fsdp_trainer_init_weights(fsdp_trainer *t) {
    const int64_t largest = t->plan.engine.largest_shard; /* the engine was built from this plan */
    /* A minute or more of set-up for a 7B model on few cores: say what the wait is. */
    if (t->layout.total_numel >= 100000000)
        fsdp_log("initial weights: drawing %.2fB parameters (seed %llu) on %d threads\n", t->layout.total_numel / 1e9,
                 (unsigned long long)t->opt.seed, fsdp_start_up_threads());
    fsdp_backend *be = t->be;
    const size_t es = master_size(t);
    float *host = fsdp_xmalloc((size_t)largest * sizeof(float), "initial weights");
    void *staged = es == 4 ? (void *)host : fsdp_xmalloc((size_t)largest * es, "initial weights");
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        const fsdp_unit_desc *ud = &t->layout.units[u];
        FSDP_ASSERT(view.len <= largest);
        /* Padding past the last parameter stays zero. */
        memset(host, 0, (size_t)view.len * sizeof(float));
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *p = &t->layout.params[ud->first_param + k];
            int64_t a = p->offset > view.start ? p->offset : view.start;
            int64_t b = p->offset + p->numel < view.start + view.valid ? p->offset + p->numel : view.start + view.valid;
            if (b > a) fsdp_param_init_fill(&t->cfg, p, t->opt.seed, a - p->offset, b - a, host + (a - view.start));
        }
        /* To the master dtype: rounded to bf16 for a bf16 master, on either backend. */
        const int64_t n = view.len;
        #pragma omp parallel for schedule(static) num_threads(fsdp_start_up_threads())
        for (int64_t i = 0; i < n; i++) {
            if (es == 2)
                ((uint16_t *)staged)[i] = fsdp_f32_to_bf16(host[i]);
            else if (t->opt.master_dtype == FSDP_BF16)
                host[i] = fsdp_round_bf16(host[i]);
        }
        be->runtime->copy_h2d(be, view.master, staged, (size_t)n * es, be->compute);
        /* the buffers are refilled for the next unit */
        be->runtime->stream_synchronize(be, be->compute);
    }
    fsdp_engine_refresh_working(t->eng);
    if (staged != host) free(staged);
    free(host);
}

void fsdp_trainer_poison(fsdp_trainer *t) {
    fsdp_backend *be = t->be;
    fsdp_shard_view view = fsdp_engine_view(t->eng, 0);
    float nan_f32 = NAN;
    uint16_t nan_bf16 = fsdp_f32_to_bf16(NAN);
    be->runtime->copy_h2d(be, view.master, master_size(t) == 2 ? (const void *)&nan_bf16 : (const void *)&nan_f32, master_size(t),
                          be->compute);
    be->runtime->stream_synchronize(be, be->compute);
}
