/* The weights of a Hugging Face model directory, read by fsdp.c's parameter names: what
 * `train --init-from` and `export --checkpoint DIR` share.
 *
 * Opening validates the files (safetensors.h) and checks them against the model's parameters: each
 * present with its shape and a readable dtype, nothing else. Two conventions of transformers are
 * followed: files of the base model, whose names lack the "model." prefix (the published OPT
 * checkpoints), load as they do into the causal-LM model; and the rotary inv_freq buffers of older
 * Llama files are ignored. A tied model (tie_word_embeddings) accepts an absent lm_head.weight, or
 * one equal to the token embedding: reading the embedding also reads the same range of
 * lm_head.weight and fails, naming both, on the first element that differs. */
#ifndef FSDP_TRAIN_HF_WEIGHTS_H
#define FSDP_TRAIN_HF_WEIGHTS_H

#include <stdint.h>

#include "../io/safetensors.h"
#include "../model/layout.h"

typedef struct {
    fsdp_st_set set;
    const fsdp_layout *layout;
    int strip_prefix;                 /* the files' names lack "model." */
    int embed_param;                  /* the token embedding's layout index */
    const fsdp_st_tensor *tied_head;  /* lm_head.weight of a tied model's files, or NULL */
    const fsdp_st_tensor **by_param;  /* the file tensor of each layout parameter */
} fsdp_hf_weights;

/* `dir` holds model.safetensors or model.safetensors.index.json. Not collective. */
int fsdp_hf_weights_open(const char *dir, const fsdp_model_config *cfg, const fsdp_layout *layout, fsdp_hf_weights *w,
                         fsdp_err *err);
/* Elements [start, start + count) of layout parameter `param` as fp32; *bytes grows by what was read. */
int fsdp_hf_weights_read(fsdp_hf_weights *w, int param, int64_t start, int64_t count, float *out, int64_t *bytes,
                         fsdp_err *err);

/* For readers that pipeline raw reads (fsdp_st_read_raw) and conversions: the file tensors whose
 * elements [start, start + count) fsdp_hf_weights_read reads for layout parameter `param`, in that
 * order (returns 1, or 2 for a tied embedding whose files hold lm_head.weight as well). The first
 * converts to the parameter's values; the second is the copy to check with fsdp_hf_weights_check_tied. */
int fsdp_hf_weights_sources(const fsdp_hf_weights *w, int param, const fsdp_st_tensor *sources[2]);
/* Compares elements [start, start + count) of the tied lm_head.weight, given as the file's raw
 * bytes, with the embedding's values of those elements; the message names both tensors and the
 * first element that differs. */
int fsdp_hf_weights_check_tied(const fsdp_hf_weights *w, int64_t start, int64_t count, const void *head_raw,
                               const float *embed, fsdp_err *err);
/* Refuses a NaN or an infinity among `values`, elements [start, start + count) of file tensor t
 * converted to fp32: the message names the file, the tensor and the first such element. For
 * training and evaluation (--init-from), where every step from such weights would be skipped; an
 * export converts special values as they are (fsdp_hf_weights_read does not check). */
int fsdp_hf_weights_check_finite(const fsdp_hf_weights *w, const fsdp_st_tensor *t, int64_t start, int64_t count,
                                 const float *values, fsdp_err *err);
void fsdp_hf_weights_close(fsdp_hf_weights *w);
/* "2 files, bf16" for messages. */
void fsdp_hf_weights_describe(const fsdp_hf_weights *w, char *buf, int cap);

#endif
