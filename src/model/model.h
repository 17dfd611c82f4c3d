/* The transformer's computation, one FSDP unit at a time, through the backend's ops.
 *
 * The model owns the activations of one micro-batch (one arena sized at creation) and the rotary
 * table; it never owns parameters. The caller hands each unit's gathered working weights (and,
 * in backward, that unit's zeroed gradient buffer) in the flat layout of src/model/layout.h, and
 * calls the units in this order for every micro-batch:
 *
 *   embed_forward, block_forward(0 .. L-1), head (forward AND backward: the loss is fused with the
 *   LM head in chunks of tokens, so full logits never exist), block_backward(L-1 .. 0), embed_backward.
 *
 * or, forward only (evaluation): embed_forward, block_forward(0 .. L-1), head_loss.
 *
 * Dropout (training only): the shape's rates say what a training micro-batch drops, and
 * fsdp_model_set_dropout turns it on or off per micro-batch. With every rate 0 the model carves no
 * dropout buffers and runs exactly the dropout-free ops. With a residual rate (OPT's `dropout`) a
 * block's attention and MLP outputs are written to a branch buffer and added to the residual stream
 * by the norm that follows (the block's post-attention norm; the next block's input norm or the
 * final norm for the MLP), which drops them on the way (backend *norm_dropout_* ops): so a layer's
 * output is completed by the next unit's forward, and its backward reads the branch gradient the
 * next unit's backward wrote. The embedding output (layer 0's input) is never dropped.
 *
 * Activation recomputation (the shape's `recompute`): what a layer keeps from its forward for its
 * backward. NONE keeps every saved tensor of every layer. SELECTIVE keeps, per layer, the residual
 * stream entering it and the matrix products' outputs (q|k|v after rotary, the attention output,
 * the residual after o_proj, the MLP's first product: gate|up or relu(fc1)) and with flash the
 * softmax statistics (lse); block_backward recomputes the two norms, the SwiGLU output and, with
 * eager attention, the probabilities (a second run of the attention forward) into one shared
 * layer's worth of buffers. FULL keeps only the residual stream entering each layer and
 * block_backward re-runs the layer's forward (all but its last product, whose output the backward
 * does not need) into that shared layer. The recomputation runs the forward's own ops on the
 * forward's own inputs and draws the same dropout masks (from fsdp_model_set_dropout's state, which
 * stays valid from a micro-batch's forward to its backward), so the gradients are those of NONE bit
 * for bit wherever the backend's ops are deterministic (docs/DESIGN.md, "Activation
 * recomputation").
 *
 * Nothing here knows about sharding or communication. */
#ifndef FSDP_MODEL_MODEL_H
#define FSDP_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "config.h"
#include "layout.h"

typedef struct fsdp_model fsdp_model;

/* What a layer keeps for its backward (--recompute; see above). */
typedef enum { FSDP_RECOMPUTE_NONE = 0, FSDP_RECOMPUTE_SELECTIVE = 1, FSDP_RECOMPUTE_FULL = 2 } fsdp_recompute;

/* "none", "selective", "full". */
const char *fsdp_recompute_name(fsdp_recompute r);
/* The mode a name stands for; -1 when it is none of the three. */
int fsdp_recompute_parse(const char *name, fsdp_recompute *out);

typedef struct {
    int batch;           /* micro-batch size B */
    int seq;             /* sequence length T */
    fsdp_attn attn;
    int head_chunk_rows; /* tokens per LM-head chunk; 0 picks a chunk of about 512 MiB of logits */
    fsdp_dropout_rates dropout; /* what training micro-batches drop (fsdp_model_dropout_rates); 0: nothing */
    fsdp_recompute recompute;   /* what a layer keeps for its backward; 0 (NONE): everything */
    fsdp_fp8_granularity fp8;   /* the block projections' products: NONE (bf16) or an FP8 recipe's */
} fsdp_model_shape;

/* Bytes of activations and backward scratch one micro-batch needs (the arena: `total`), for memory
 * plans, in three parts that add up to it (each with the alignment padding it carves): what the
 * layers keep for their backward (all of them together), the one layer's worth of buffers that
 * recomputation and the forward share (0 with NONE), and the rest (token ids, rotary table, the
 * last layer's output and the final norm, the backward's scratch, the LM head's logits chunk,
 * dropout's branch buffers). */
typedef struct {
    size_t layers, recompute, other, total;
} fsdp_activation_parts;
void fsdp_model_activation_parts(const fsdp_model_config *cfg, const fsdp_model_shape *shape, size_t act_esize,
                                 fsdp_activation_parts *out);

fsdp_model *fsdp_model_create(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout,
                              const fsdp_model_shape *shape, fsdp_err *err);
void fsdp_model_destroy(fsdp_model *m);

/* Dropout for the micro-batches that follow, until the next call: training = 1 drops at the shape's
 * rates, with masks drawn from (seed, sample_base + b, layer, site, position) for batch row b
 * (src/kernels/dropout.h): sample_base is the global index of the micro-batch's first sample, so the
 * masks do not depend on the rank or on how a global batch is split. training = 0 (the state after
 * creation: evaluation, generation, tests) drops nothing. Call it between micro-batches, never
 * between a forward and its backward (whose recomputation, under --recompute, draws the forward's
 * masks from this state). */
void fsdp_model_set_dropout(fsdp_model *m, int training, uint64_t seed, int64_t sample_base);

/* Device buffers of B*T token ids: fill them (copy_h2d on the compute stream) before embed_forward.
 * targets[i] < 0 marks a position that does not count in the loss. */
int32_t *fsdp_model_tokens(fsdp_model *m);
int32_t *fsdp_model_targets(fsdp_model *m);

void fsdp_model_embed_forward(fsdp_model *m, const void *embed_params);
/* Tensorwise FP8 with weights cast once per gather (src/kernels/fp8.h): the next block_forward or
 * block_backward reads its product weights from weights8 (FSDP_FP8_MAX_MATRICES entries, in the
 * order fsdp_model_fp8_matrices gives) instead of casting them, and forgets them when it returns.
 * NULL, or never called: the products cast their weights. */
void fsdp_model_set_fp8_weights(fsdp_model *m, const fsdp_fp8_weight *weights8);
/* Where the weights of unit u's FP8 products lie in its flat buffer, in that order: the four of a
 * block (q|k|v, o, the MLP's two); returns how many (0: a unit with no FP8 product). */
int fsdp_model_fp8_matrices(const fsdp_model_config *cfg, const fsdp_layout *layout, int u,
                            fsdp_fp8_matrix out[FSDP_FP8_MAX_MATRICES]);
void fsdp_model_block_forward(fsdp_model *m, int layer, const void *block_params);
/* Final norm, LM head and cross-entropy, forward and backward. Adds the summed loss of this
 * micro-batch's counted tokens into *loss_sum (device fp32). The loss gradient is multiplied by
 * grad_scale (1 / tokens counted in the whole global batch). With tied embeddings the head matrix is
 * the EMBED unit's token embedding, read from embed_params and accumulated into embed_grads. */
void fsdp_model_head(fsdp_model *m, const void *head_params, void *head_grads, const void *embed_params,
                     void *embed_grads, float grad_scale, float *loss_sum);
/* The same head forward-only (evaluation): adds the summed loss of the counted tokens into
 * *loss_sum and computes no gradient; call it after block_forward(L-1) with no backward after it. */
void fsdp_model_head_loss(fsdp_model *m, const void *head_params, const void *embed_params, float *loss_sum);
void fsdp_model_block_backward(fsdp_model *m, int layer, const void *block_params, void *block_grads);
void fsdp_model_embed_backward(fsdp_model *m, const void *embed_params, void *embed_grads);
/* The same gradient as rows, for a caller that reduces it without a dense buffer: after
 * block_backward(0), entry n of the micro-batch adds *values row n (N x C, activation dtype) to the
 * EMBED unit's rows sets[k] (element offsets within the unit): sets[0] the token embedding at
 * tokens[n]; for OPT, sets[1] the learned position of n. Returns the number of sets; *count = N
 * (a multiple of the sequence length), *row_len = C. Valid until the next micro-batch's tokens. */
int fsdp_model_embed_grad_rows(fsdp_model *m, fsdp_row_set sets[FSDP_MAX_ROW_SETS], const void **values, int *count,
                               int *row_len);

/* The final-norm output [B*T, hidden] of the last forward, for tests and tools. */
const void *fsdp_model_final_hidden(const fsdp_model *m);
/* The residual stream [B*T, hidden] entering layer `layer` of the last forward (layer = L: the last
 * layer's output, complete once the head ran), for tests and tools. */
const void *fsdp_model_layer_input(const fsdp_model *m, int layer);
/* Rotary cos/sin table [T][head_dim/2][2] for positions 0..T-1 (host, fp32), as the model uses it. */
void fsdp_model_rope_table(const fsdp_model_config *cfg, int T, float *out);

#endif
