/* A Hugging Face model's weights by fsdp.c's parameter names (hf_weights.h). */
#include "hf_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Buffers transformers drops on loading because it recomputes them (older Llama checkpoints). */
static const char *const IGNORED_SUFFIXES[] = {".rotary_emb.inv_freq", NULL};

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static const char *file_name(const char *name, int strip) { return strip && !strncmp(name, "model.", 6) ? name + 6 : name; }

int fsdp_hf_weights_open(const char *dir, const fsdp_model_config *cfg, const fsdp_layout *l, fsdp_hf_weights *w,
                         fsdp_err *err) {
    memset(w, 0, sizeof *w);
    w->layout = l;
    w->embed_param = -1;
    char weights[4200];
    if (!fsdp_st_find_weights(dir, weights, sizeof weights))
        return fsdp_errf(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
    if (fsdp_st_open(weights, &w->set, err)) return -1;
    w->strip_prefix = 1;
    for (int i = 0; i < w->set.num_tensors; i++) w->strip_prefix &= strncmp(w->set.tensors[i].name, "model.", 6) != 0;
    fsdp_st_expect *want = fsdp_xcalloc((size_t)l->num_params + 1, sizeof *want, "expected tensors");
    for (int i = 0; i < l->num_params; i++) {
        const fsdp_param_desc *q = &l->params[i];
        want[i] = (fsdp_st_expect){file_name(q->name, w->strip_prefix), q->ndim, {q->shape[0], q->shape[1]}, 0};
        if (ends_with(q->name, "embed_tokens.weight")) w->embed_param = i;
    }
    int n = l->num_params;
    if (cfg->tie_word_embeddings && w->embed_param >= 0) {
        const fsdp_param_desc *e = &l->params[w->embed_param];
        want[n++] = (fsdp_st_expect){"lm_head.weight", 2, {e->shape[0], e->shape[1]}, 1};
    }
    int rc = fsdp_st_check(&w->set, want, n, IGNORED_SUFFIXES, err);
    free(want);
    if (rc) {
        fsdp_hf_weights_close(w);
        return -1;
    }
    w->by_param = fsdp_xcalloc((size_t)l->num_params + 1, sizeof *w->by_param, "the weights' tensors");
    for (int i = 0; i < l->num_params; i++) w->by_param[i] = fsdp_st_find(&w->set, file_name(l->params[i].name, w->strip_prefix));
    if (cfg->tie_word_embeddings) w->tied_head = fsdp_st_find(&w->set, "lm_head.weight");
    return 0;
}

int fsdp_hf_weights_check_tied(const fsdp_hf_weights *w, int64_t start, int64_t count, const void *head_raw,
                               const float *embed, fsdp_err *err) {
    enum { STEP = 4096 };
    const fsdp_st_tensor *head = w->tied_head, *e = w->by_param[w->embed_param];
    size_t es = (size_t)fsdp_st_dtype_bits(head->dtype) / 8;
    float values[STEP];
    for (int64_t at = 0; at < count; at += STEP) {
        int64_t n = count - at < STEP ? count - at : STEP;
        fsdp_st_convert_f32(head->dtype, (const char *)head_raw + (size_t)at * es, n, values);
        if (!memcmp(values, embed + at, (size_t)n * sizeof(float))) continue;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&values[i], &embed[at + i], sizeof(float)))
                return fsdp_errf(err, "%s: tensor %s differs from %s (element %lld) but config.json ties them "
                                 "(tie_word_embeddings)", fsdp_st_path(&w->set, head), head->name, e->name,
                                 (long long)(start + at + i));
    }
    return 0;
}

int fsdp_hf_weights_check_finite(const fsdp_hf_weights *w, const fsdp_st_tensor *t, int64_t start, int64_t count,
                                 const float *values, fsdp_err *err) {
    /* By the bits: an exponent of all ones is an infinity or a NaN, whatever -ffast-math assumes. */
    const uint32_t *bits = (const uint32_t *)(const void *)values;
    int64_t i = 0;
    while (i < count && (bits[i] & 0x7f800000u) != 0x7f800000u) i++;
    if (i == count) return 0;
    return fsdp_errf(err, "%s: tensor %s holds non-finite values (NaN or infinity), the first at element %lld (%g): "
                     "the model diverged or the file is damaged", fsdp_st_path(&w->set, t),
                     t->name, (long long)(start + i), (double)values[i]);
}

static int check_tied_copy(fsdp_hf_weights *w, int64_t start, int64_t count, const float *embed, int64_t *bytes,
                           fsdp_err *err) {
    enum { STEP = 1 << 22 };
    const fsdp_st_tensor *head = w->tied_head;
    size_t es = (size_t)fsdp_st_dtype_bits(head->dtype) / 8;
    void *buf = fsdp_xmalloc((size_t)(count < STEP ? count : STEP) * es, "the tied-head check");
    int rc = 0;
    for (int64_t at = 0; at < count && rc == 0; at += STEP) {
        int64_t n = count - at < STEP ? count - at : STEP;
        rc = fsdp_st_read_raw(&w->set, head, start + at, n, buf, err);
        *bytes += n * fsdp_st_dtype_bits(head->dtype) / 8;
        if (rc == 0) rc = fsdp_hf_weights_check_tied(w, start + at, n, buf, embed + at, err);
    }
    free(buf);
    return rc;
}

int fsdp_hf_weights_read(fsdp_hf_weights *w, int param, int64_t start, int64_t count, float *out, int64_t *bytes,
                         fsdp_err *err) {
    const fsdp_st_tensor *t = w->by_param[param];
    if (fsdp_st_read_f32(&w->set, t, start, count, out, err)) return -1;
    *bytes += count * fsdp_st_dtype_bits(t->dtype) / 8;
    if (w->tied_head && param == w->embed_param) return check_tied_copy(w, start, count, out, bytes, err);
    return 0;
}

int fsdp_hf_weights_sources(const fsdp_hf_weights *w, int param, const fsdp_st_tensor *sources[2]) {
    sources[0] = w->by_param[param];
    sources[1] = w->tied_head && param == w->embed_param ? w->tied_head : NULL;
    return sources[1] ? 2 : 1;
}

void fsdp_hf_weights_close(fsdp_hf_weights *w) {
    fsdp_st_close(&w->set);
    free(w->by_param);
    memset(w, 0, sizeof *w);
}

void fsdp_hf_weights_describe(const fsdp_hf_weights *w, char *buf, int cap) {
    /* The dtypes present, in the format's spelling. */
    int seen[FSDP_ST_NUM_DTYPES] = {0};
    for (int i = 0; i < w->set.num_tensors; i++) seen[w->set.tensors[i].dtype] = 1;
    int used = snprintf(buf, (size_t)cap, "%d tensors in %d file%s,", w->set.num_tensors, w->set.num_files,
                        w->set.num_files == 1 ? "" : "s");
    for (int d = 0; d < FSDP_ST_NUM_DTYPES && used < cap; d++)
        if (seen[d]) used += snprintf(buf + used, (size_t)(cap - used), " %s", fsdp_st_dtype_name((fsdp_st_dtype)d));
}
