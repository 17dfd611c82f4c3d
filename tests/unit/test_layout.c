/* The parameter layout and the initial values, from each family's descriptor: names unique and
 * Hugging Face's, every module's tensors found where the model looks for them, decayed tensors
 * first in each unit, fused tensors adjacent, biases exactly where the config puts them, and
 * transformers' initialisation (normal(0, initializer_range) matrices and embeddings with the
 * padding_idx row zero, zero biases, unit norm weights) as a pure function of (seed, name, index). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/layout.h"
#include "check.h"

static int is_norm(fsdp_module m) {
    return m == FSDP_MOD_NORM_ATTN || m == FSDP_MOD_NORM_MLP || m == FSDP_MOD_NORM_FINAL || m == FSDP_MOD_Q_NORM ||
           m == FSDP_MOD_K_NORM;
}

static void check_layout(const fsdp_model_config *c) {
    fsdp_layout l;
    fsdp_layout_build(c, &l);
    const fsdp_family *f = c->family;
    int64_t total = 0;
    for (int u = 0; u < l.num_units; u++) {
        const fsdp_unit_desc *ud = &l.units[u];
        int64_t off = 0;
        for (int k = 0; k < ud->num_params; k++) {
            const fsdp_param_desc *p = &l.params[ud->first_param + k];
            CHECK(p->unit == u && p->offset == off);
            CHECK((off < ud->decay_numel) == (p->decay != 0)); /* decayed tensors first */
            CHECK(p->decay == (p->ndim == 2));
            off += p->numel;
            /* Where the model looks for the module's tensor, it finds this one. */
            CHECK((p->is_bias ? ud->bias : ud->weight)[p->module] == ud->first_param + k);
            char want[128];
            snprintf(want, sizeof want, f->modules[p->module], ud->layer);
            strcat(want, p->is_bias ? ".bias" : ".weight");
            CHECK(!strcmp(p->name, want));
            CHECK(fsdp_layout_find(&l, p->name) == ud->first_param + k); /* unique */
        }
        CHECK(off == ud->numel);
        total += off;
    }
    CHECK(total == l.total_numel && total == fsdp_model_num_params(c));
    /* Biases: the projections the config names, and the LayerNorms. */
    const fsdp_unit_desc *b0 = &l.units[fsdp_unit_block(&l, 0)];
    int qkv = (c->biases & FSDP_BIAS_QKV) != 0, o = (c->biases & FSDP_BIAS_O) != 0, mlp = (c->biases & FSDP_BIAS_MLP) != 0;
    CHECK((b0->bias[FSDP_MOD_Q] >= 0) == qkv && (b0->bias[FSDP_MOD_K] >= 0) == qkv && (b0->bias[FSDP_MOD_V] >= 0) == qkv);
    CHECK((b0->bias[FSDP_MOD_O] >= 0) == o && (b0->bias[FSDP_MOD_UP] >= 0) == mlp && (b0->bias[FSDP_MOD_DOWN] >= 0) == mlp);
    CHECK((b0->bias[FSDP_MOD_NORM_ATTN] >= 0) == (f->norm == FSDP_NORM_LAYER));
    CHECK((b0->weight[FSDP_MOD_GATE] >= 0) == (f->mlp == FSDP_MLP_SWIGLU));
    CHECK((l.units[0].weight[FSDP_MOD_EMBED_POSITIONS] >= 0) == (f->pos == FSDP_POS_LEARNED));
    CHECK((l.units[fsdp_unit_head(&l)].weight[FSDP_MOD_LM_HEAD] >= 0) == !c->tie_word_embeddings);
    /* Qwen3's per-head norms: head_dim weights of q and of k, in every block, and nowhere else. */
    for (int m = FSDP_MOD_Q_NORM; m <= FSDP_MOD_K_NORM; m++) {
        CHECK((b0->weight[m] >= 0) == (f->qk_norm != 0));
        if (b0->weight[m] >= 0) CHECK(l.params[b0->weight[m]].numel == c->head_dim && l.params[b0->weight[m]].ndim == 1);
        CHECK(l.units[0].weight[m] < 0 && l.units[fsdp_unit_head(&l)].weight[m] < 0);
    }

    /* Initial values. */
    int pad = fsdp_model_padding_idx(c);
    for (int i = 0; i < l.num_params; i++) {
        const fsdp_param_desc *p = &l.params[i];
        double sum = 0, sumsq = 0;
        int64_t n = 0;
        int ok = 1;
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(c, p, 7, k);
            ok &= v == fsdp_param_init_value(c, p, 7, k);
            if (p->is_bias) {
                ok &= v == 0.0f;
            } else if (is_norm(p->module)) {
                ok &= v == 1.0f;
            } else if (p->module == FSDP_MOD_EMBED_TOKENS && k / p->shape[1] == pad) {
                ok &= v == 0.0f;
            } else {
                sum += v, sumsq += (double)v * v, n++;
            }
        }
        check_quiet(ok, "%s: %s does not start as transformers starts it", c->name, p->name);
        if (n >= 2000) {
            double mean = sum / n, sd = sqrt(sumsq / n - mean * mean);
            check_quiet(!(fabs(sd / c->initializer_range - 1) > 0.1 || fabs(mean) > 0.1 * c->initializer_range),
                        "%s: %s has mean %g, std %g; want 0, %g", c->name, p->name, mean, sd, c->initializer_range);
        }
    }
    /* Another seed, another model; the padding row stays zero. */
    const fsdp_param_desc *e = &l.params[l.units[0].weight[FSDP_MOD_EMBED_TOKENS]];
    CHECK(fsdp_param_init_value(c, e, 7, e->numel - 1) != fsdp_param_init_value(c, e, 8, e->numel - 1));
    if (pad >= 0) CHECK(fsdp_param_init_value(c, e, 8, (int64_t)pad * e->shape[1] + 3) == 0.0f);
    fsdp_layout_free(&l);
}

int main(void) {
    int n = 0;
    for (const char *const *name = fsdp_model_preset_names(); *name; name++) {
        fsdp_model_config c;
        CHECK(fsdp_model_preset(*name, &c) == 0);
        if (c.vocab_size > 2000) continue; /* the real sizes are checked by test_hf_config's counts */
        check_layout(&c);
        if (c.biases) { /* the same model without its optional biases */
            c.biases = c.family->biases;
            check_layout(&c);
        }
        c.tie_word_embeddings = !c.tie_word_embeddings;
        c.pad_token_id = 17;
        c.biases = FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP;
        check_layout(&c);
        n++;
    }
    CHECK(n == 5); /* tiny-llama, tiny-opt, tiny-qwen2, tiny-qwen3, tiny-mistral */
    printf("test_layout: %d tiny presets and variants\n", n);
    return check_summary("test_layout");
}
