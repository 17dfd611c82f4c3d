/* The sources and the loading of a resident model (resident.h). */
#include "resident.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/log.h"
#include "../io/checkpoint.h"
#include "../io/hf_config.h"
#include "hf_import.h"
#include "hf_weights.h"

/* Elements converted per step on the device (128 MiB of fp32). */
#define STAGE_ELEMENTS ((size_t)32 << 20)

static int checkpoint_source(const char *checkpoint, fsdp_model_source *src, fsdp_err *err) {
    struct stat st;
    if (stat(checkpoint, &st) != 0) return fsdp_errf(err, "--checkpoint %s: no such file or directory", checkpoint);
    snprintf(src->path, sizeof src->path, "%s", checkpoint);
    if (S_ISDIR(st.st_mode)) {
        char config[4300];
        snprintf(config, sizeof config, "%s/config.json", checkpoint);
        if (stat(config, &st) == 0)
            return fsdp_usagef(err, "--checkpoint %s is a Hugging Face model directory: give it as --init-from",
                               checkpoint);
        int found = fsdp_ckpt_find_latest(checkpoint, src->path, (int)sizeof src->path, err);
        if (found == 0)
            return fsdp_errf(err, "--checkpoint %s: a directory without a 'latest' checkpoint (not a --ckpt-dir)",
                             checkpoint);
        if (found < 0) return -1;
    } else if (!S_ISREG(st.st_mode)) {
        return fsdp_errf(err, "--checkpoint %s: not a regular file or a directory", checkpoint);
    }
    fsdp_ckpt_meta meta;
    memset(&meta, 0, sizeof meta);
    if (fsdp_ckpt_read_meta(MPI_COMM_SELF, src->path, &meta, err)) return -1;
    int rc = 0;
    if (!meta.config_json ||
        fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), src->path, &src->cfg, err))
        rc = fsdp_errf(err, "%s: the checkpoint's model config cannot be read (%s)", src->path,
                       meta.config_json ? err->msg : "no config attribute");
    fsdp_ckpt_meta_free(&meta);
    return rc;
}

int fsdp_model_source_resolve(const char *init_from, const char *checkpoint, fsdp_model_source *src, fsdp_err *err) {
    memset(src, 0, sizeof *src);
    if (checkpoint) {
        src->is_checkpoint = 1;
        return checkpoint_source(checkpoint, src, err);
    }
    struct stat st;
    snprintf(src->path, sizeof src->path, "%s", init_from);
    src->is_checkpoint = stat(init_from, &st) == 0 && !S_ISDIR(st.st_mode);
    return fsdp_init_from_config(MPI_COMM_SELF, init_from, NULL, &src->cfg, err);
}

/* ---- loading ---- */

typedef struct {
    FILE *out;
    double start, last;
    int64_t bytes;
} progress;

static void report(progress *p, int done, int units) {
    double now = fsdp_now();
    if (!p->out || now - p->last < 2.0 || done == units) return;
    p->last = now;
    fprintf(p->out, "loading weights: %d/%d units, %.2f GB read, %.0f MB/s, ETA %.0f s\n", done, units, p->bytes / 1e9,
            p->bytes / (now - p->start) / 1e6, (now - p->start) * (units - done) / done);
    fflush(p->out);
}

/* Unit u's parameters, whole, from the source into host[0 .. numel). */
static int read_unit(const fsdp_model_source *src, fsdp_hf_weights *w, const fsdp_layout *l, int u, float *host,
                     int64_t *bytes, fsdp_err *err) {
    const fsdp_unit_desc *ud = &l->units[u];
    if (!src->is_checkpoint) {
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *p = &l->params[ud->first_param + k];
            if (fsdp_hf_weights_read(w, ud->first_param + k, 0, p->numel, host + p->offset, bytes, err)) return -1;
        }
        return 0;
    }
    fsdp_ckpt_tensor *table = fsdp_xcalloc((size_t)ud->num_params, sizeof *table, "checkpoint tensors");
    fsdp_ckpt_piece *pieces = fsdp_xcalloc((size_t)ud->num_params, sizeof *pieces, "checkpoint pieces");
    for (int k = 0; k < ud->num_params; k++) {
        const fsdp_param_desc *p = &l->params[ud->first_param + k];
        table[k] = (fsdp_ckpt_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}};
        pieces[k] = (fsdp_ckpt_piece){k, 0, p->numel, host + p->offset, NULL, NULL};
        *bytes += p->numel * (int64_t)sizeof(float);
    }
    int rc = fsdp_ckpt_read(MPI_COMM_SELF, src->path, table, ud->num_params, pieces, ud->num_params, err);
    free(table);
    free(pieces);
    return rc;
}

/* host (fp32) into the unit's device buffer in the act dtype. */
static void upload(fsdp_backend *be, void *unit, const float *host, size_t n, float *stage) {
    fsdp_dtype act = be->act_dtype;
    if (be->runtime->dtype_size(be, act) == sizeof(float)) { /* fp32, or bf16 emulated in fp32 storage */
        be->runtime->copy_h2d(be, unit, host, n * sizeof(float), be->compute);
        if (act != FSDP_F32) be->ops->cast(be, unit, act, unit, FSDP_F32, n, be->compute);
        be->runtime->stream_synchronize(be, be->compute);
        return;
    }
    size_t es = be->runtime->dtype_size(be, act);
    for (size_t at = 0; at < n; at += STAGE_ELEMENTS) {
        size_t k = n - at < STAGE_ELEMENTS ? n - at : STAGE_ELEMENTS;
        be->runtime->copy_h2d(be, stage, host + at, k * sizeof(float), be->compute);
        be->ops->cast(be, (char *)unit + at * es, act, stage, FSDP_F32, k, be->compute);
        be->runtime->stream_synchronize(be, be->compute); /* the host buffer and the stage are reused */
    }
}

int fsdp_resident_load(fsdp_backend *be, const fsdp_model_source *src, fsdp_resident_model *m, FILE *out,
                       fsdp_err *err) {
    memset(m, 0, sizeof *m);
    fsdp_layout_build(&src->cfg, &m->layout);
    const fsdp_layout *l = &m->layout;
    fsdp_hf_weights w;
    if (!src->is_checkpoint && fsdp_hf_weights_open(src->path, &src->cfg, l, &w, err)) {
        fsdp_layout_free(&m->layout);
        return -1;
    }
    size_t largest = 1, es = be->runtime->dtype_size(be, be->act_dtype);
    for (int u = 0; u < l->num_units; u++)
        if ((size_t)l->units[u].numel > largest) largest = (size_t)l->units[u].numel;
    float *host = be->runtime->alloc_host(be, largest * sizeof(float), "weights staging (host)");
    size_t stage_elements = largest < STAGE_ELEMENTS ? largest : STAGE_ELEMENTS;
    float *stage = es == sizeof(float) ? NULL
                                       : be->runtime->alloc(be, stage_elements * sizeof(float), "weights staging");
    m->units = fsdp_xcalloc((size_t)l->num_units, sizeof *m->units, "the resident units");
    progress p = {out, fsdp_now(), fsdp_now(), 0};
    int rc = 0;
    for (int u = 0; u < l->num_units && rc == 0; u++) {
        size_t n = (size_t)l->units[u].numel;
        m->units[u] = be->runtime->alloc(be, n * es, "the model's weights");
        if (!m->units[u]) {
            rc = fsdp_errf(err, "out of device memory for the model's weights (%.2f GiB in %s)",
                           (double)l->total_numel * es / (1 << 30), fsdp_dtype_name(be->act_dtype));
            break;
        }
        m->bytes += n * es;
        memset(host, 0, n * sizeof(float));
        rc = read_unit(src, &w, l, u, host, &p.bytes, err);
        if (rc == 0) upload(be, m->units[u], host, n, stage);
        report(&p, u + 1, l->num_units);
    }
    if (stage) be->runtime->free(be, stage);
    be->runtime->free_host(be, host);
    if (!src->is_checkpoint) fsdp_hf_weights_close(&w);
    m->bytes_read = p.bytes;
    m->seconds = fsdp_now() - p.start;
    if (rc) fsdp_resident_free(be, m);
    return rc;
}

void fsdp_resident_free(fsdp_backend *be, fsdp_resident_model *m) {
    if (m->units)
        for (int u = 0; u < m->layout.num_units; u++)
            if (m->units[u]) be->runtime->free(be, m->units[u]);
    free(m->units);
    fsdp_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}
