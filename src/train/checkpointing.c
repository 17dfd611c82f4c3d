/* Between the engine's shards and the checkpoint file: shards become per-tensor pieces by
 * intersecting each rank's flat range with the parameters' offsets, so that any layout writes and
 * reads the same file. Also the initial weights, computed for exactly the elements a rank owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"
#include "../io/checkpoint.h"
#include "../io/hf_config.h"
#include "../io/jsonio.h"
#include "trainer.h"

/* Host staging of one state array (master, m or v) across all units, as fp32. */
typedef struct {
    float *values; /* total shard elements */
} host_state;

static int64_t total_shard(const fsdp_trainer *t) {
    int64_t n = 0;
    for (int u = 0; u < t->layout.num_units; u++) n += fsdp_engine_view(t->eng, u).len;
    return n;
}

/* Device shard (master dtype) <-> host fp32. */
static void to_host(fsdp_trainer *t, float *dst, const void *src, int64_t n) {
    fsdp_backend *be = t->be;
    size_t es = be->dtype_size(be, t->opt.master_dtype);
    if (es == sizeof(float)) {
        be->copy_d2h(be, dst, src, (size_t)n * sizeof(float), be->compute);
        be->stream_synchronize(be, be->compute);
        return;
    }
    uint16_t *tmp = fsdp_xmalloc((size_t)n * sizeof(uint16_t), "checkpoint staging");
    be->copy_d2h(be, tmp, src, (size_t)n * sizeof(uint16_t), be->compute);
    be->stream_synchronize(be, be->compute);
    for (int64_t i = 0; i < n; i++) dst[i] = fsdp_bf16_to_f32(tmp[i]);
    free(tmp);
}

static void to_device(fsdp_trainer *t, void *dst, const float *src, int64_t n) {
    fsdp_backend *be = t->be;
    size_t es = be->dtype_size(be, t->opt.master_dtype);
    if (es == sizeof(float) && t->opt.master_dtype == FSDP_F32) { /* nothing to convert: no staging copy */
        be->copy_h2d(be, dst, src, (size_t)n * sizeof(float), be->compute);
        be->stream_synchronize(be, be->compute);
        return;
    }
    if (es == sizeof(float)) {
        float *tmp = fsdp_xmalloc((size_t)n * sizeof(float), "checkpoint staging");
        /* A bf16 master emulated in fp32 storage keeps bf16 values. */
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) tmp[i] = fsdp_round_bf16(src[i]);
        be->copy_h2d(be, dst, tmp, (size_t)n * sizeof(float), be->compute);
        be->stream_synchronize(be, be->compute);
        free(tmp);
        return;
    }
    uint16_t *tmp = fsdp_xmalloc((size_t)n * sizeof(uint16_t), "checkpoint staging");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) tmp[i] = fsdp_f32_to_bf16(src[i]);
    be->copy_h2d(be, dst, tmp, (size_t)n * sizeof(uint16_t), be->compute);
    be->stream_synchronize(be, be->compute);
    free(tmp);
}

/* The tensor table: every parameter by its Hugging Face name, in layout order. */
static fsdp_ckpt_tensor *tensor_table(const fsdp_trainer *t) {
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

int fsdp_trainer_unit_pieces(const fsdp_trainer *t, int u, float *master, float *m, float *v, fsdp_ckpt_piece *out) {
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
        int64_t at = a - view.start;
        out[n].tensor = pi;
        out[n].start = a - p->offset;
        out[n].count = b - a;
        out[n].param = master + at;
        out[n].exp_avg = m ? m + at : NULL;
        out[n].exp_avg_sq = v ? v + at : NULL;
        n++;
    }
    return n;
}

/* Pieces of this rank's shards; host arrays are laid out unit after unit like the device shards. */
static int build_pieces(const fsdp_trainer *t, float *master, float *m, float *v, fsdp_ckpt_piece *out) {
    int n = 0;
    int64_t base = 0;
    for (int u = 0; u < t->layout.num_units; u++) {
        n += fsdp_trainer_unit_pieces(t, u, master + base, m ? m + base : NULL, v ? v + base : NULL, out + n);
        base += fsdp_engine_view(t->eng, u).len;
    }
    return n;
}

void fsdp_trainer_unit_set_master(fsdp_trainer *t, int u, const float *master) {
    fsdp_shard_view view = fsdp_engine_view(t->eng, u);
    to_device(t, view.master, master, view.len);
}

int fsdp_trainer_save(fsdp_trainer *t, const char *path, fsdp_err *err) {
    int64_t total = total_shard(t);
    float *host = fsdp_xcalloc((size_t)(3 * total), sizeof(float), "checkpoint staging");
    float *master = host, *m = host + total, *v = host + 2 * total;
    int64_t base = 0;
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        to_host(t, master + base, view.master, view.len);
        to_host(t, m + base, view.m, view.len);
        to_host(t, v + base, view.v, view.len);
        base += view.len;
    }
    fsdp_ckpt_tensor *tensors = tensor_table(t);
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)t->layout.num_params, sizeof *pieces, "checkpoint pieces");
    /* Replicas hold identical shards: the first replica writes for all. */
    int num_pieces = fsdp_engine_replica_rank(t->eng) == 0 ? build_pieces(t, master, m, v, pieces) : 0;

    char config[8192];
    fsdp_hf_config_write(&t->cfg, config, sizeof config);
    json_t *schedule_record = fsdp_schedule_json(&t->sched, t->step);
    char *schedule = fsdp_json_text(schedule_record, 0, 17);
    json_decref(schedule_record);
    if (!schedule) fsdp_fatal("out of host memory writing the schedule record");
    fsdp_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.step = t->step;
    meta.samples_seen = (int64_t)t->samples_seen;
    meta.seed = t->opt.seed;
    meta.world_size = t->topo.world;
    snprintf(meta.strategy, sizeof meta.strategy, "%s", fsdp_strategy_name(t->opt.strategy));
    meta.config_json = config;
    meta.schedule_json = schedule;
    meta.run_json = (char *)(t->opt.run_json ? t->opt.run_json : "{}");
    int rc = fsdp_ckpt_write(t->world, path, tensors, t->layout.num_params, pieces, num_pieces, &meta, err);
    free(schedule);
    free(pieces);
    free(tensors);
    free(host);
    return rc;
}

int fsdp_trainer_load(fsdp_trainer *t, const char *path, fsdp_err *err) {
    fsdp_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    if (fsdp_ckpt_read_meta(t->world, path, &meta, err)) return -1;
    fsdp_model_config saved;
    fsdp_err cfg_err = {0};
    int rc = 0;
    if (!meta.config_json ||
        fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), path, &saved, &cfg_err)) {
        rc = fsdp_errf(err, "checkpoint %s: its model config cannot be read (%s)", path, cfg_err.msg);
    } else if (!fsdp_model_config_same_shape(&saved, &t->cfg)) {
        char have[256], want[256];
        fsdp_model_config_describe(&saved, have, sizeof have);
        fsdp_model_config_describe(&t->cfg, want, sizeof want);
        rc = fsdp_errf(err, "checkpoint %s holds a different model (%s) than --model %s (%s)", path, have,
                       t->opt.model, want);
    }
    if (rc) {
        fsdp_ckpt_meta_free(&meta);
        return -1;
    }

    int64_t total = total_shard(t);
    float *host = fsdp_xcalloc((size_t)(3 * total), sizeof(float), "checkpoint staging");
    float *master = host, *m = host + total, *v = host + 2 * total;
    fsdp_ckpt_tensor *tensors = tensor_table(t);
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)t->layout.num_params, sizeof *pieces, "checkpoint pieces");
    int num_pieces = build_pieces(t, master, m, v, pieces);
    rc = fsdp_ckpt_read(t->world, path, tensors, t->layout.num_params, pieces, num_pieces, err);
    if (rc == 0) {
        int64_t base = 0;
        for (int u = 0; u < t->layout.num_units; u++) {
            fsdp_shard_view view = fsdp_engine_view(t->eng, u);
            to_device(t, view.master, master + base, view.len);
            to_device(t, view.m, m + base, view.len);
            to_device(t, view.v, v + base, view.len);
            base += view.len;
        }
        fsdp_engine_refresh_working(t->eng);
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
    free(host);
    fsdp_ckpt_meta_free(&meta);
    return rc;
}

void fsdp_trainer_init_weights(fsdp_trainer *t) {
    int64_t total = total_shard(t);
    float *host = fsdp_xcalloc((size_t)total, sizeof(float), "initial weights");
    int64_t base = 0;
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        const fsdp_unit_desc *ud = &t->layout.units[u];
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *p = &t->layout.params[ud->first_param + k];
            int64_t a = p->offset > view.start ? p->offset : view.start;
            int64_t b = p->offset + p->numel < view.start + view.valid ? p->offset + p->numel : view.start + view.valid;
            #pragma omp parallel for schedule(static)
            for (int64_t i = a; i < b; i++)
                host[base + (i - view.start)] = fsdp_param_init_value(&t->cfg, p, t->opt.seed, i - p->offset);
        }
        base += view.len;
    }
    base = 0;
    for (int u = 0; u < t->layout.num_units; u++) {
        fsdp_shard_view view = fsdp_engine_view(t->eng, u);
        to_device(t, view.master, host + base, view.len);
        base += view.len;
    }
    fsdp_engine_refresh_working(t->eng);
    free(host);
}
