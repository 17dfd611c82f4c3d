/* The model run for generation: a forward over new tokens that keeps every layer's keys and values
 * in a cache, so that each next token costs one row of work instead of the whole sequence again.
 *
 * The caller keeps the whole model resident in the backend's act dtype, one buffer per unit in the
 * flat layout of layout.h (the training units' layout, so the block views of unit_params.h apply),
 * and hands those buffers to every forward. The decoder owns the cache and the activations of at
 * most `max_tokens` tokens per call.
 *
 * KV cache: per layer two tensors [Hkv, capacity, D] (kv head, position, head dim) in the act
 * dtype: the keys of one head are one dense matrix that a query walks in order. Position t holds
 * the key after rotary at position t.
 *
 * A forward of n tokens at positions len .. len + n - 1 (len = the tokens already run): embedding
 * (learned positions at the family's offset + position), then per layer the training's block
 * (src/model/block.c, the same code): norm, q|k|v (+ biases), the family's per-head q/k norms,
 * rotary from row `len` of the table, append k and v to the cache, attention of the new queries over
 * the cache within the family's sliding window (the first call of a sequence with n > 1, the
 * prompt's prefill, takes the training's flash attention over its own tokens instead), o_proj +
 * residual, norm, MLP + residual; then the final norm and the LM head of the last token (or of every
 * token, for tests). No dropout. Logits come back to the host in fp32. The cache keeps every
 * position even with a window (the window masks; it does not shrink the cache). */
#ifndef FSDP_MODEL_KV_DECODE_H
#define FSDP_MODEL_KV_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "config.h"
#include "layout.h"

typedef struct fsdp_kv_decoder fsdp_kv_decoder;

typedef struct {
    int capacity;   /* positions the cache holds (prompt + new tokens) */
    int max_tokens; /* most tokens one forward takes (the prompt's prefill) */
    int all_logits; /* forwards may return the logits of every token they run, not only the last */
} fsdp_kv_shape;

/* Device bytes the decoder allocates (cache, activations, logits), for messages and plans. */
size_t fsdp_kv_decoder_bytes(const fsdp_model_config *cfg, const fsdp_kv_shape *shape, size_t act_esize);
/* Bytes of the KV cache alone. */
size_t fsdp_kv_cache_bytes(const fsdp_model_config *cfg, int capacity, size_t act_esize);

/* -1 with err set when the shape does not fit the model: a capacity beyond max_position_embeddings
 * with learned positions (OPT), non-positive sizes. */
fsdp_kv_decoder *fsdp_kv_decoder_create(fsdp_backend *be, const fsdp_model_config *cfg, const fsdp_layout *layout,
                                        const fsdp_kv_shape *shape, fsdp_err *err);
void fsdp_kv_decoder_destroy(fsdp_kv_decoder *d);

/* Runs tokens[0..n) (host ids) at the next n positions. units[u] is unit u's resident weights.
 * logits (host, fp32) receives [V] for the last token, or [n, V] when `all` (the shape must allow
 * it). Returns -1 with err set when the tokens do not fit (n > max_tokens, past the capacity, an
 * id outside the vocabulary); the cache is then unchanged. Synchronises with the device. */
int fsdp_kv_decoder_forward(fsdp_kv_decoder *d, const void *const *units, const int32_t *tokens, int n, int all,
                            float *logits, fsdp_err *err);
/* Tokens run so far (the next position). */
int fsdp_kv_decoder_length(const fsdp_kv_decoder *d);
/* Forgets the sequence: the next forward starts at position 0. */
void fsdp_kv_decoder_reset(fsdp_kv_decoder *d);

#endif
