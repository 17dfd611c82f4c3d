/* The KV decoder (src/model/kv_decode.c) against the training forward (src/model/model.c), a
 * teacher-forcing check on the CPU backend: for one random sequence, the logits of every position
 * decoded token by token, prefilled all at once, and prefilled in part then decoded, equal the
 * training forward's logits within 1e-5 relative (fp32; 1e-2 with bf16 emulated), for tiny Llama
 * (GQA, llama3 rope, tied), tiny OPT (learned positions at offset 2, LayerNorm, ReLU, biases),
 * tiny Qwen2 (q/k/v biases), tests/data/tiny-llama-untied (head_dim 10, every bias, untied), tiny
 * Qwen3 (per-head q/k norms, head_dim 12 of hidden 40) and tiny Mistral (a sliding window of 5 in a
 * sequence of 23: generation well past the window).
 *
 * The comparison is shown to be sensitive: a sequence that differs in its first token only must
 * change the last position's logits (the cache is read), and the same tokens decoded one position
 * later (a dummy token first) must change them too (positions are applied). Also the decoder's
 * refusals: past the capacity, an id outside the vocabulary, learned positions past
 * max_position_embeddings. */
#include <mpi.h>

#include "check.h"
#include "kv_rig.h"

static void run_model(const char *model, fsdp_dtype act, double tol) {
    kv_rig r;
    rig_setup(&r, "cpu", model, act, 11);
    const int T = 23, V = r.cfg.vocab_size;
    int32_t tokens[64];
    rig_tokens(&r, T, 3, tokens);
    size_t n = (size_t)T * V;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    char what[160];
    rig_training_logits(&r, tokens, T, ref);
    const int prefills[] = {1, T, 9};
    const char *names[] = {"token by token", "prefill of all", "prefill of 9, then token by token"};
    for (int i = 0; i < 3; i++) {
        rig_decoder_logits(&r, tokens, T, prefills[i], got);
        double e = rig_worst(got, ref, T, V);
        snprintf(what, sizeof what, "%s %s: %s equals the training forward", model, fsdp_dtype_name(act), names[i]);
        check_close(what, e, tol);
    }

    /* Sensitivity: the first token changed, and the whole sequence one position later. With a
     * sliding window (tiny-mistral: 5 keys, 2 layers) the last position sees back to position
     * T - 1 - layers * (window - 1) only: a first token before that must change nothing, to the
     * bit, and one inside it must change the logits (generation runs past the window, and the
     * decoder applies it). */
    int32_t other[64];
    memcpy(other, tokens, sizeof other);
    other[0] = (tokens[0] + 1) % V;
    const int W = r.cfg.sliding_window, reach = W ? T - 1 - r.cfg.num_layers * (W - 1) : 0;
    double e;
    if (reach > 0) {
        float *same = malloc(n * sizeof(float));
        rig_decoder_logits(&r, tokens, T, 1, same);
        rig_decoder_logits(&r, other, T, 1, got);
        e = rig_worst(got + (size_t)(T - 1) * V, same + (size_t)(T - 1) * V, 1, V);
        check_that(e == 0.0, "%s: a first token outside the last position's window (it sees back to %d) changes "
                   "nothing: %.3e", model, reach, e);
        memcpy(other, tokens, sizeof other);
        other[reach] = (tokens[reach] + 1) % V;
        rig_decoder_logits(&r, other, T, 1, got);
        e = rig_worst(got + (size_t)(T - 1) * V, same + (size_t)(T - 1) * V, 1, V);
        check_that(e > 0.05, "%s: a token at the window's reach (%d) changes the last logits: %.3e (bound %.0e)",
                   model, reach, e, 0.05);
        free(same);
    } else {
        rig_decoder_logits(&r, other, T, 1, got);
        e = rig_worst(got + (size_t)(T - 1) * V, ref + (size_t)(T - 1) * V, 1, V);
        check_that(e > 0.05, "%s: another first token changes the last logits (the cache is read): %.3e (bound %.0e)",
                   model, e, 0.05);
    }
    int32_t shifted[65];
    shifted[0] = tokens[5];
    memcpy(shifted + 1, tokens, (size_t)T * sizeof(int32_t));
    float *got2 = malloc((size_t)(T + 1) * V * sizeof(float));
    rig_decoder_logits(&r, shifted, T + 1, 1, got2);
    e = rig_worst(got2 + (size_t)T * V, ref + (size_t)(T - 1) * V, 1, V);
    if (reach > 0) /* rotary positions are relative, and the window hides the token put first */
        check_close("the same tokens one position later, a token outside the window first (sliding window)", e, tol);
    else
        check_that(e > 0.05, "%s: the same tokens one position later give other logits: %.3e (bound %.0e)", model, e,
                   0.05);
    free(got2);
    free(ref);
    free(got);
    rig_teardown(&r);
}

static void expect_error(int rc, const fsdp_err *err, const char *want, const char *what) {
    int ok = rc != 0 && strstr(err->msg, want) != NULL;
    check_that(ok, "%s: %s", what, rc ? err->msg : "accepted");
}

static void refusals(void) {
    kv_rig r;
    rig_setup(&r, "cpu", "tiny-opt", FSDP_F32, 5);
    fsdp_err err = {0};
    fsdp_kv_shape too_long = {r.cfg.max_position_embeddings + 1, 4, 0};
    fsdp_kv_decoder *d = fsdp_kv_decoder_create(r.be, &r.cfg, &r.layout, &too_long, &err);
    expect_error(d != NULL ? 0 : -1, &err, "max_position_embeddings", "learned positions past the table");
    fsdp_kv_decoder_destroy(d);

    fsdp_kv_shape shape = {4, 2, 0};
    memset(&err, 0, sizeof err);
    d = fsdp_kv_decoder_create(r.be, &r.cfg, &r.layout, &shape, &err);
    if (!d) rig_die("decoder", err.msg);
    const void *const *units = (const void *const *)r.units;
    float *logits = malloc((size_t)r.cfg.vocab_size * sizeof(float));
    int32_t ids[3] = {1, 2, r.cfg.vocab_size};
    expect_error(fsdp_kv_decoder_forward(d, units, ids + 1, 2, 0, logits, &err), &err, "outside the model's vocabulary",
                 "an id outside the vocabulary");
    memset(&err, 0, sizeof err);
    expect_error(fsdp_kv_decoder_forward(d, units, ids, 3, 0, logits, &err), &err, "1 to 2", "more tokens than one forward takes");
    memset(&err, 0, sizeof err);
    int rc = 0;
    for (int i = 0; i < 5 && rc == 0; i++) rc = fsdp_kv_decoder_forward(d, units, ids, 1, 0, logits, &err);
    expect_error(rc, &err, "capacity of 4", "past the capacity");
    memset(&err, 0, sizeof err);
    expect_error(fsdp_kv_decoder_forward(d, units, ids, 1, 1, logits, &err), &err, "last token's logits only",
                 "all logits from a last-token decoder");
    free(logits);
    fsdp_kv_decoder_destroy(d);
    rig_teardown(&r);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *models[] = {"tiny-llama", "tiny-opt", "tiny-qwen2", "tiny-llama-untied", "tiny-qwen3", "tiny-mistral"};
    for (int i = 0; i < 6; i++) run_model(models[i], FSDP_F32, 1e-5);
    run_model("tiny-llama", FSDP_BF16, 1e-2);
    run_model("tiny-opt", FSDP_BF16, 1e-2);
    run_model("tiny-qwen3", FSDP_BF16, 1e-2);
    run_model("tiny-mistral", FSDP_BF16, 1e-2);
    refusals();
    int status = check_summary("test_kv_decode");
    MPI_Finalize();
    return status;
}
