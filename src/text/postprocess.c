/* Template post-processing of postprocess.h. */
#include "postprocess.h"

void fsdp_postprocess(const fsdp_tokenizer_spec *spec, int add_special_tokens, fsdp_ids *ids, fsdp_ids *tmp) {
    for (int s = 0; s < spec->num_templates; s++) {
        const fsdp_tj_template *t = &spec->templates[s];
        tmp->n = 0;
        for (int i = 0; i < t->num_pieces; i++) {
            const fsdp_tj_template_piece *p = &t->pieces[i];
            const uint32_t *src = p->is_sequence ? ids->p : p->ids;
            size_t n = p->is_sequence ? ids->n : add_special_tokens ? (size_t)p->num_ids : 0;
            fsdp_ids_reserve(tmp, n);
            if (n) memcpy(tmp->p + tmp->n, src, n * sizeof *src);
            tmp->n += n;
        }
        fsdp_ids swap = *ids;
        *ids = *tmp;
        *tmp = swap;
    }
}

void fsdp_postprocess_counts(const fsdp_tokenizer_spec *spec, int add_special_tokens, size_t *before, size_t *after) {
    *before = *after = 0;
    for (int s = 0; s < spec->num_templates && add_special_tokens; s++) {
        const fsdp_tj_template *t = &spec->templates[s];
        int seen = 0;
        for (int i = 0; i < t->num_pieces; i++) {
            if (t->pieces[i].is_sequence) seen = 1;
            else if (seen) *after += (size_t)t->pieces[i].num_ids;
            else *before += (size_t)t->pieces[i].num_ids;
        }
    }
}
