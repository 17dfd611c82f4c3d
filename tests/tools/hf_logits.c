/* fsdp.c's logits for given tokens, from the weights of a Hugging Face model directory or of an fsdp.c
 * checkpoint: one fp32 forward on the CPU backend in one process (tests/scripts/gpu_hf_transformers.py
 * compares them with transformers' logits of the same weights).
 *
 *   hf_logits MODEL_DIR|CHECKPOINT.h5 TOKENS SEQ OUT
 *
 * TOKENS: int32 little-endian ids, a multiple of SEQ of them (batch = count / SEQ).
 * OUT: float32 little-endian logits [batch, SEQ, vocab]. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/model.h"
#include "train/hf_weights.h"

static void die(const char *what) {
    fprintf(stderr, "hf_logits: %s\n", what);
    exit(1);
}

static int32_t *read_tokens(const char *path, long *count) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the token file");
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t *ids = malloc((size_t)bytes + 4);
    if (!ids || fread(ids, 1, (size_t)bytes, f) != (size_t)bytes) die("cannot read the token file");
    fclose(f);
    *count = bytes / 4;
    return ids;
}

/* Every parameter, whole, into its unit's flat buffer. */
static void load(const char *path, int is_dir, const fsdp_model_config *cfg, const fsdp_layout *l, float **params) {
    fsdp_err err = {0};
    if (is_dir) {
        fsdp_hf_weights w;
        if (fsdp_hf_weights_open(path, cfg, l, &w, &err)) die(err.msg);
        int64_t bytes = 0;
        for (int i = 0; i < l->num_params; i++) {
            const fsdp_param_desc *p = &l->params[i];
            if (fsdp_hf_weights_read(&w, i, 0, p->numel, params[p->unit] + p->offset, &bytes, &err)) die(err.msg);
        }
        fsdp_hf_weights_close(&w);
        return;
    }
    fsdp_ckpt_tensor *table = calloc((size_t)l->num_params, sizeof *table);
    fsdp_ckpt_piece *pieces = calloc((size_t)l->num_params, sizeof *pieces);
    for (int i = 0; i < l->num_params; i++) {
        const fsdp_param_desc *p = &l->params[i];
        table[i] = (fsdp_ckpt_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}};
        pieces[i] = (fsdp_ckpt_piece){i, 0, p->numel, params[p->unit] + p->offset, NULL, NULL};
    }
    if (fsdp_ckpt_read(MPI_COMM_WORLD, path, table, l->num_params, pieces, l->num_params, &err)) die(err.msg);
    free(table);
    free(pieces);
}

int main(int argc, char **argv) {
    if (argc != 5) die("usage: hf_logits MODEL_DIR|CHECKPOINT.h5 TOKENS SEQ OUT");
    MPI_Init(&argc, &argv);
    fsdp_err err = {0};
    struct stat st;
    int is_dir = stat(argv[1], &st) == 0 && S_ISDIR(st.st_mode);
    fsdp_model_config cfg;
    if (is_dir) {
        if (fsdp_hf_config_load(argv[1], &cfg, &err)) die(err.msg);
    } else {
        fsdp_ckpt_meta meta;
        memset(&meta, 0, sizeof meta);
        if (fsdp_ckpt_read_meta(MPI_COMM_WORLD, argv[1], &meta, &err) ||
            fsdp_hf_config_parse(meta.config_json, strlen(meta.config_json), argv[1], &cfg, &err))
            die(err.msg);
        fsdp_ckpt_meta_free(&meta);
    }
    long count;
    int32_t *ids = read_tokens(argv[2], &count);
    int T = atoi(argv[3]);
    if (T <= 0 || count % T) die("the token count is not a multiple of SEQ");
    int B = (int)(count / T), N = B * T;

    fsdp_layout layout;
    fsdp_layout_build(&cfg, &layout);
    fsdp_backend_options bo = {.kind = "cpu", .act_dtype = FSDP_F32, .grad_dtype = FSDP_F32, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&bo, &err);
    if (!be) die(err.msg);
    fsdp_model_shape shape = {.batch = B, .seq = T, .attn = FSDP_ATTN_EAGER};
    fsdp_model *m = fsdp_model_create(be, &cfg, &layout, &shape, &err);
    if (!m) die(err.msg);
    int U = layout.num_units;
    float **params = calloc((size_t)U, sizeof *params), **grads = calloc((size_t)U, sizeof *grads);
    for (int u = 0; u < U; u++) {
        params[u] = be->runtime->alloc(be, (size_t)layout.units[u].numel * sizeof(float), "params");
        grads[u] = be->runtime->alloc(be, (size_t)layout.units[u].numel * sizeof(float), "grads");
    }
    load(argv[1], is_dir, &cfg, &layout, params);

    int32_t *tokens = fsdp_model_tokens(m), *targets = fsdp_model_targets(m);
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= cfg.vocab_size) die("a token id is outside the vocabulary");
        tokens[i] = ids[i];
        targets[i] = -1; /* only the logits are wanted */
    }
    int E = fsdp_unit_embed(&layout), H = fsdp_unit_head(&layout);
    float *loss_sum = be->runtime->alloc(be, sizeof(float), "loss");
    fsdp_model_embed_forward(m, params[E]);
    for (int l = 0; l < cfg.num_layers; l++) fsdp_model_block_forward(m, l, params[1 + l]);
    fsdp_model_head(m, params[H], grads[H], params[E], grads[E], 0.0f, loss_sum);
    /* The head is fused with the loss: recompute the logits from the final hidden state. */
    const float *head_w = cfg.tie_word_embeddings ? params[E] : params[H];
    float *logits = be->runtime->alloc(be, (size_t)N * cfg.vocab_size * sizeof(float), "logits");
    be->ops->matmul_forward(be, logits, fsdp_model_final_hidden(m), head_w, NULL, NULL, N, cfg.hidden_size,
                            cfg.vocab_size, 0);
    FILE *out = fopen(argv[4], "wb");
    if (!out || fwrite(logits, sizeof(float), (size_t)N * cfg.vocab_size, out) != (size_t)N * cfg.vocab_size ||
        fclose(out))
        die("cannot write the logits");
    printf("hf_logits: %s, %d x %d tokens, vocab %d -> %s\n", argv[1], B, T, cfg.vocab_size, argv[4]);
    MPI_Finalize();
    return 0;
}
