/* Runs one forward and backward of a model on the CPU backend in fp32 on one process and writes
 * everything an independent implementation needs to check it: the weights, the batch, the logits,
 * the loss and every parameter gradient, under Hugging Face names (tests/oracle/README.md).
 *
 *   oracle_dump MODEL SEED BATCH SEQ OUT.h5 [eager|flash] [DROPOUT ATTENTION_DROPOUT SAMPLE_BASE]
 *
 * With the dropout arguments the config's `dropout` and `attention_dropout` are set to them and the
 * pass is a training micro-batch: the model drops what fsdp_model_dropout_rates says the family
 * drops, with masks of seed SEED for the samples SAMPLE_BASE, SAMPLE_BASE + 1, ...
 */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "io/hf_config.h"
#include "model/model.h"

static void die(const char *what) {
    fprintf(stderr, "oracle_dump: %s\n", what);
    exit(1);
}

static void write_f32(hid_t file, const char *name, int rank, const hsize_t *dims, const float *data) {
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t set = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (set < 0 || H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) die(name);
    H5Dclose(set);
    H5Sclose(space);
}

static void write_i32(hid_t file, const char *name, int rank, const hsize_t *dims, const int32_t *data) {
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t set = H5Dcreate2(file, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (set < 0 || H5Dwrite(set, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) die(name);
    H5Dclose(set);
    H5Sclose(space);
}

int main(int argc, char **argv) {
    if (argc < 6 || (argc > 7 && argc != 10))
        die("usage: oracle_dump MODEL SEED BATCH SEQ OUT.h5 [eager|flash] [DROPOUT ATTENTION_DROPOUT SAMPLE_BASE]");
    MPI_Init(&argc, &argv);
    fsdp_err err = {0};
    fsdp_model_config cfg;
    if (fsdp_model_preset(argv[1], &cfg) && fsdp_hf_config_load(argv[1], &cfg, &err)) die(err.msg);
    uint64_t seed = strtoull(argv[2], NULL, 10);
    int B = atoi(argv[3]), T = atoi(argv[4]), N = B * T;
    fsdp_attn attn = argc > 6 && !strcmp(argv[6], "eager") ? FSDP_ATTN_EAGER : FSDP_ATTN_FLASH;

    fsdp_layout layout;
    fsdp_layout_build(&cfg, &layout);
    fsdp_backend_options bo = {.kind = "cpu", .act_dtype = FSDP_F32, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&bo, &err);
    if (!be) die(err.msg);
    fsdp_model_shape shape = {.batch = B, .seq = T, .attn = attn};
    int training = argc == 10;
    long long sample_base = training ? strtoll(argv[9], NULL, 10) : 0;
    if (training) {
        cfg.dropout = strtof(argv[7], NULL);
        cfg.attention_dropout = strtof(argv[8], NULL);
        if (fsdp_model_dropout_rates(&cfg, 0, 0.0, &shape.dropout, &err)) die(err.msg);
    }
    fsdp_model *m = fsdp_model_create(be, &cfg, &layout, &shape, &err);
    if (!m) die(err.msg);
    fsdp_model_set_dropout(m, training, seed, sample_base);

    /* One flat parameter and gradient buffer per unit, as the engine would hand them over. */
    int U = layout.num_units;
    float **params = calloc((size_t)U, sizeof *params), **grads = calloc((size_t)U, sizeof *grads);
    for (int u = 0; u < U; u++) {
        params[u] = be->runtime->alloc(be, (size_t)layout.units[u].numel * sizeof(float), "params");
        grads[u] = be->runtime->alloc(be, (size_t)layout.units[u].numel * sizeof(float), "grads");
    }
    for (int i = 0; i < layout.num_params; i++) {
        const fsdp_param_desc *p = &layout.params[i];
        /* Norm weights and biases start at exactly 1 and 0; jitter them so that a mistake that only
         * shows with non-trivial values cannot hide. */
        for (int64_t k = 0; k < p->numel; k++) {
            float v = fsdp_param_init_value(&cfg, p, seed, k);
            if (p->ndim == 1) v += 0.1f * (float)fsdp_rand_normal(seed, 3 + (uint64_t)i, (uint64_t)k);
            params[p->unit][p->offset + k] = v;
        }
    }

    int32_t *tokens = fsdp_model_tokens(m), *targets = fsdp_model_targets(m);
    int counted = 0, pad = fsdp_model_padding_idx(&cfg);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int32_t)fsdp_rand_below(seed, 1, (uint64_t)i, (uint32_t)cfg.vocab_size);
        /* Every fifth input is the padding token, when the model has one (its row must get no
         * gradient from these inputs). */
        if (pad >= 0 && i % 5 == 1) tokens[i] = pad;
        /* Every seventh target is ignored, as padding would be. */
        targets[i] = i % 7 == 3 ? -1 : (int32_t)fsdp_rand_below(seed, 2, (uint64_t)i, (uint32_t)cfg.vocab_size);
        counted += targets[i] >= 0;
    }

    int E = fsdp_unit_embed(&layout), H = fsdp_unit_head(&layout), L = cfg.num_layers;
    float *loss_sum = be->runtime->alloc(be, sizeof(float), "loss");
    fsdp_model_embed_forward(m, params[E]);
    for (int l = 0; l < L; l++) fsdp_model_block_forward(m, l, params[1 + l]);
    fsdp_model_head(m, params[H], grads[H], params[E], grads[E], 1.0f / (float)counted, loss_sum);
    for (int l = L - 1; l >= 0; l--) fsdp_model_block_backward(m, l, params[1 + l], grads[1 + l]);
    fsdp_model_embed_backward(m, params[E], grads[E]);

    /* Logits are never stored by the model (the head is fused): recompute them from the final hidden. */
    const float *head_w = cfg.tie_word_embeddings ? params[E] : params[H];
    float *logits = be->runtime->alloc(be, (size_t)N * cfg.vocab_size * sizeof(float), "logits");
    be->ops->matmul_forward(be, logits, fsdp_model_final_hidden(m), head_w, NULL, NULL, N, cfg.hidden_size,
                            cfg.vocab_size, 0);

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(argv[5], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) die("cannot create the output file");
    char config[8192];
    fsdp_hf_config_write(&cfg, config, sizeof config);
    hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, strlen(config) + 1);
    hid_t scalar = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(f, "config", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, str, config);
    H5Aclose(attr);
    H5Tclose(str);
    if (training) { /* what the masks are drawn from; the rates are the config's */
        const char *names[2] = {"dropout_seed", "sample_base"};
        const long long values[2] = {(long long)seed, sample_base};
        for (int i = 0; i < 2; i++) {
            hid_t a = H5Acreate2(f, names[i], H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
            if (a < 0 || H5Awrite(a, H5T_NATIVE_LLONG, &values[i]) < 0) die(names[i]);
            H5Aclose(a);
        }
    }
    H5Sclose(scalar);
    hsize_t bt[2] = {(hsize_t)B, (hsize_t)T}, btv[3] = {(hsize_t)B, (hsize_t)T, (hsize_t)cfg.vocab_size}, one = 1;
    write_i32(f, "input_ids", 2, bt, tokens);
    write_i32(f, "labels", 2, bt, targets);
    write_f32(f, "logits", 3, btv, logits);
    float loss = *loss_sum / (float)counted;
    write_f32(f, "loss", 1, &one, &loss);
    H5Gclose(H5Gcreate2(f, "param", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Gclose(H5Gcreate2(f, "grad", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    for (int i = 0; i < layout.num_params; i++) {
        const fsdp_param_desc *p = &layout.params[i];
        hsize_t dims[2] = {(hsize_t)p->shape[0], (hsize_t)p->shape[1]};
        char name[160];
        snprintf(name, sizeof name, "param/%s", p->name);
        write_f32(f, name, p->ndim, dims, params[p->unit] + p->offset);
        snprintf(name, sizeof name, "grad/%s", p->name);
        write_f32(f, name, p->ndim, dims, grads[p->unit] + p->offset);
    }
    H5Fclose(f);
    char dropout[160];
    fsdp_dropout_rates_describe(&shape.dropout, dropout, sizeof dropout);
    printf("oracle_dump: %s, %d x %d tokens, dropout %s, loss %.6f -> %s\n", argv[1], B, T, training ? dropout : "off",
           loss, argv[5]);
    be->runtime->free(be, logits);
    be->runtime->free(be, loss_sum);
    for (int u = 0; u < U; u++) be->runtime->free(be, params[u]), be->runtime->free(be, grads[u]);
    free(params), free(grads);
    fsdp_model_destroy(m);
    be->runtime->destroy(be);
    fsdp_layout_free(&layout);
    MPI_Finalize();
    return 0;
}
