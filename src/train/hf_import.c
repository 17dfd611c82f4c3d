/* --init-from (hf_import.h): the model of a Hugging Face directory or a checkpoint, and its weights
 * read shard by shard. */
#include "hf_import.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "../base/log.h"
#include "../base/watchdog.h"
#include "../io/checkpoint.h"
#include "../io/hf_config.h"
#include "../io/safetensors.h"
#include "hf_weights.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int load_spec(const char *spec, fsdp_model_config *cfg, fsdp_err *err) {
    if (fsdp_model_preset(spec, cfg) == 0) return 0;
    struct stat st;
    if (stat(spec, &st) != 0) return fsdp_usagef(err, "--model '%s' is neither a preset nor a config.json", spec);
    return fsdp_hf_config_load(spec, cfg, err);
}

int fsdp_init_from_config(MPI_Comm comm, const char *path, const char *model_spec, fsdp_model_config *cfg,
                          fsdp_err *err) {
    struct stat st;
    char file[4200];
    int rc = 0;
    if (stat(path, &st) != 0) {
        rc = fsdp_errf(err, "--init-from %s: no such file or directory", path);
    } else if (S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/config.json", path);
        if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
            rc = fsdp_errf(err, "--init-from %s: %s (a Hugging Face model directory holds config.json and the "
                           "weights)", path, stat(file, &st) ? "no config.json" : "config.json is not a regular file");
        else if (!fsdp_st_find_weights(path, file, sizeof file))
            rc = fsdp_errf(err, "--init-from %s: no model.safetensors or model.safetensors.index.json", path);
        else
            rc = fsdp_hf_config_load(path, cfg, err);
    } else if (!S_ISREG(st.st_mode)) {
        rc = fsdp_errf(err, "--init-from %s: not a directory or a regular file", path);
    } else if (ends_with(path, ".safetensors") || ends_with(path, ".json")) {
        rc = fsdp_usagef(err, "--init-from %s: give the model's directory (config.json beside the weights)", path);
    } else {
        /* An fsdp.c checkpoint: collective, so every rank takes this branch (same file system). */
        fsdp_ckpt_meta meta;
        memset(&meta, 0, sizeof meta);
        rc = fsdp_ckpt_read_meta(comm, path, &meta, err);
        if (rc == 0 && (!meta.config_json ||
                        fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), path, cfg, err)))
            rc = -1;
        fsdp_ckpt_meta_free(&meta);
    }
    if (rc == 0 && model_spec) {
        fsdp_model_config other;
        if (load_spec(model_spec, &other, err)) return -1;
        if (!fsdp_model_config_same_shape(&other, cfg)) {
            char a[256], b[256];
            fsdp_model_config_describe(&other, a, sizeof a);
            fsdp_model_config_describe(cfg, b, sizeof b);
            return fsdp_usagef(err, "--model %s (%s) is not the model of --init-from %s (%s); --init-from alone names "
                               "the model", model_spec, a, path, b);
        }
    }
    return rc;
}

/* ---- reading ---- */

typedef struct {
    fsdp_trainer *t;
    const char *path;
    double start, last_report;
    int64_t bytes; /* read by this rank */
} progress;

static void report(progress *p, int units_done) {
    double now = fsdp_now();
    int units = p->t->layout.num_units;
    if (now - p->last_report < 2.0 || units_done == units) return;
    p->last_report = now;
    double rate = p->bytes * (double)p->t->topo.world / (now - p->start); /* this rank's share times the ranks */
    double eta = (now - p->start) * (units - units_done) / units_done;
    fsdp_log("init-from: %d/%d units, %.2f GB read, %.0f MB/s, ETA %.0f s\n", units_done, units,
             p->bytes * (double)p->t->topo.world / 1e9, rate / 1e6, eta);
}

static void summary(progress *p, const char *what) {
    long long bytes = p->bytes;
    fsdp_mpi_allreduce(&bytes, 1, MPI_LONG_LONG, MPI_SUM, p->t->world, "the bytes read by every rank");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long peak_kib = ru.ru_maxrss;
    fsdp_mpi_allreduce(&peak_kib, 1, MPI_LONG_LONG, MPI_MAX, p->t->world, "the peak host memory of every rank");
    double s = fsdp_now() - p->start;
    fsdp_log("init-from: %s (%s): %.2f GB read by %d ranks in %.2f s (%.0f MB/s); peak host memory per rank %.2f "
             "GiB\n",
             p->path, what, bytes / 1e9, p->t->topo.world, s, s > 0 ? bytes / s / 1e6 : 0.0,
             peak_kib / (1024.0 * 1024.0));
}

/* The largest shard length of any unit, for the one host staging buffer. */
static int64_t max_shard(const fsdp_trainer *t) {
    int64_t n = 1;
    for (int u = 0; u < t->layout.num_units; u++)
        if (fsdp_engine_view(t->eng, u).len > n) n = fsdp_engine_view(t->eng, u).len;
    return n;
}

/* Weights of an fsdp.c checkpoint, one collective read per unit. */
static int from_checkpoint(fsdp_trainer *t, progress *p, fsdp_err *err) {
    const fsdp_layout *l = &t->layout;
    float *host = fsdp_xmalloc((size_t)max_shard(t) * sizeof(float), "init-from staging");
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)l->num_params, sizeof *pieces, "init-from pieces");
    fsdp_ckpt_tensor *table = fsdp_xcalloc((size_t)l->num_params, sizeof *table, "init-from tensors");
    int rc = 0;
    for (int u = 0; u < l->num_units && rc == 0; u++) {
        const fsdp_unit_desc *ud = &l->units[u];
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *q = &l->params[ud->first_param + k];
            table[k] = (fsdp_ckpt_tensor){q->name, q->ndim, {q->shape[0], q->shape[1]}};
        }
        memset(host, 0, (size_t)fsdp_engine_view(t->eng, u).len * sizeof(float));
        int n = fsdp_trainer_unit_pieces(t, u, host, NULL, NULL, pieces);
        for (int i = 0; i < n; i++) {
            pieces[i].tensor -= ud->first_param;
            p->bytes += pieces[i].count * (int64_t)sizeof(float);
        }
        rc = fsdp_ckpt_read(t->world, p->path, table, ud->num_params, pieces, n, err);
        if (rc == 0) fsdp_trainer_unit_set_master(t, u, host);
        report(p, u + 1);
    }
    free(table);
    free(pieces);
    free(host);
    if (rc == 0) summary(p, "fsdp.c checkpoint, weights only");
    return rc;
}

/* The next unit's bytes are read into the page cache on a helper thread while this unit is copied
 * to the device: the disk keeps reading instead of waiting for the copy. */
typedef struct {
    const fsdp_hf_weights *w;
    const fsdp_ckpt_piece *pieces;
    int n;
} prefetch_job;

static void *prefetch_main(void *arg) {
    const prefetch_job *job = arg;
    for (int i = 0; i < job->n; i++)
        fsdp_hf_weights_prefetch(job->w, job->pieces[i].tensor, job->pieces[i].start, job->pieces[i].count);
    return NULL;
}

static int from_safetensors(fsdp_trainer *t, progress *p, fsdp_err *err) {
    const fsdp_layout *l = &t->layout;
    fsdp_hf_weights w;
    int rc = fsdp_hf_weights_open(p->path, &t->cfg, l, &w, err);
    if (fsdp_agree(t->world, err)) {
        if (rc == 0) fsdp_hf_weights_close(&w);
        return -1;
    }
    /* Page-locked on a GPU host, so that the copy to the device runs at full speed. */
    float *host = t->be->runtime->alloc_host(t->be, (size_t)max_shard(t) * sizeof(float), "init-from staging");
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)l->num_params, sizeof *pieces, "init-from pieces");
    fsdp_ckpt_piece *next = fsdp_xcalloc((size_t)l->num_params, sizeof *next, "init-from pieces");
    for (int u = 0; u < l->num_units && rc == 0; u++) {
        prefetch_job job = {&w, next, u + 1 < l->num_units ? fsdp_trainer_unit_pieces(t, u + 1, host, NULL, NULL, next) : 0};
        pthread_t helper;
        int helping = job.n > 0 && pthread_create(&helper, NULL, prefetch_main, &job) == 0;
        memset(host, 0, (size_t)fsdp_engine_view(t->eng, u).len * sizeof(float));
        int n = fsdp_trainer_unit_pieces(t, u, host, NULL, NULL, pieces);
        for (int i = 0; i < n && rc == 0; i++)
            rc = fsdp_hf_weights_read(&w, pieces[i].tensor, pieces[i].start, pieces[i].count, pieces[i].param,
                                      &p->bytes, err);
        if (rc == 0) fsdp_trainer_unit_set_master(t, u, host);
        if (helping) pthread_join(helper, NULL);
        if (rc == 0) report(p, u + 1);
    }
    free(next);
    free(pieces);
    t->be->runtime->free_host(t->be, host);
    char what[160];
    fsdp_hf_weights_describe(&w, what, sizeof what);
    fsdp_hf_weights_close(&w);
    if (fsdp_agree(t->world, err)) return -1;
    summary(p, what);
    return 0;
}

int fsdp_trainer_init_from(fsdp_trainer *t, fsdp_err *err) {
    progress p = {t, t->opt.init_from, fsdp_now(), fsdp_now(), 0};
    struct stat st;
    int is_dir = stat(p.path, &st) == 0 && S_ISDIR(st.st_mode);
    int rc = is_dir ? from_safetensors(t, &p, err) : from_checkpoint(t, &p, err);
    if (rc == 0) fsdp_engine_refresh_working(t->eng);
    return rc;
}
