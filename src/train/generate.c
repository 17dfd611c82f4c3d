/* The generation loop (generate.h). */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/log.h"
#include "../model/kv_decode.h"

static int is_eos(const fsdp_generate_options *o, int32_t id) {
    for (int i = 0; i < o->num_eos; i++)
        if (o->eos[i] == id) return 1;
    return 0;
}

static int finite_logits(const float *logits, int V) {
    for (int i = 0; i < V; i++)
        if (!isfinite(logits[i])) return 0;
    return 1;
}

int fsdp_generate(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout, const void *const *units,
                  const int32_t *prompt, int prompt_len, const fsdp_generate_options *o, fsdp_generate_stats *st,
                  fsdp_err *err) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = prompt_len;
    st->min_margin = INFINITY;
    if (prompt_len <= 0) return fsdp_usagef(err, "the prompt is empty (no tokens to continue)");
    if (o->max_new_tokens <= 0) return 0;
    /* The last new token is never run, so the cache needs one position less than the total. */
    fsdp_kv_shape shape = {prompt_len + o->max_new_tokens - 1, prompt_len, 0};
    fsdp_kv_decoder *d = fsdp_kv_decoder_create(be, cfg, layout, &shape, err);
    if (!d) return -1;
    st->cache_bytes = fsdp_kv_decoder_bytes(cfg, &shape, be->runtime->dtype_size(be, be->act_dtype));
    const int V = cfg->vocab_size;
    float *logits = fsdp_xmalloc((size_t)V * sizeof(float), "the logits");
    fsdp_sampler *sampler = fsdp_sampler_create(&o->sampling, V);
    int rc = 0;
    double t0 = fsdp_now();
    const int32_t *run = prompt;
    int n = prompt_len;
    int32_t next = 0;
    for (int step = 0; step < o->max_new_tokens; step++) {
        rc = fsdp_kv_decoder_forward(d, units, run, n, 0, logits, err);
        if (rc) break;
        if (!finite_logits(logits, V)) {
            rc = fsdp_errf(err, "the model's logits are not finite at position %d (broken weights?)",
                           fsdp_kv_decoder_length(d) - 1);
            break;
        }
        double margin = fsdp_logit_margin(logits, V);
        if (margin < st->min_margin) st->min_margin = margin;
        next = fsdp_sampler_next(sampler, logits, (uint64_t)step);
        st->new_tokens++;
        if (step == 0) st->prefill_seconds = fsdp_now() - t0;
        if (o->on_token && (rc = o->on_token(o->arg, next, err)) != 0) break;
        if (is_eos(o, next)) {
            st->stopped_at_eos = 1;
            break;
        }
        run = &next;
        n = 1;
    }
    st->decode_seconds = fsdp_now() - t0 - st->prefill_seconds;
    fsdp_sampler_free(sampler);
    free(logits);
    fsdp_kv_decoder_destroy(d);
    return rc;
}
