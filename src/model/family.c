/* The registry of model families (one line per family in src/model/families/). */
#include "family.h"

#include "config.h"

#include <stdio.h>
#include <string.h>

extern const fsdp_family fsdp_family_llama, fsdp_family_opt, fsdp_family_qwen2, fsdp_family_qwen3,
    fsdp_family_mistral;

static const fsdp_family *const FAMILIES[] = {&fsdp_family_llama, &fsdp_family_opt,     &fsdp_family_qwen2,
                                              &fsdp_family_qwen3, &fsdp_family_mistral, NULL};

const fsdp_family *const *fsdp_families(void) { return FAMILIES; }

const fsdp_family *fsdp_family_find(const char *model_type) {
    for (int i = 0; FAMILIES[i]; i++)
        if (!strcmp(FAMILIES[i]->model_type, model_type)) return FAMILIES[i];
    return NULL;
}

const char *fsdp_family_names(void) {
    static char names[256];
    if (!names[0])
        for (int i = 0; FAMILIES[i]; i++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", FAMILIES[i]->model_type);
        }
    return names;
}

fsdp_block_kind fsdp_block_kind_of(const fsdp_model_config *cfg) {
    const fsdp_family *f = cfg->family;
    fsdp_block_kind k;
    k.rms = f->norm == FSDP_NORM_RMS;
    k.swiglu = f->mlp == FSDP_MLP_SWIGLU;
    k.rope = f->pos == FSDP_POS_ROPE;
    k.qk_norm = f->qk_norm != 0;
    k.window = cfg->sliding_window > 0 ? cfg->sliding_window : 0;
    k.pos_offset = f->pos_offset;
    return k;
}
