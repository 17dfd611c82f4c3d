/* config.json <-> fsdp_model_config for every family: the published Llama-3.2-1B, OPT-1.3b and
 * Qwen2.5-0.5B files (as transformers 4 wrote them) and transformers 5's spelling of the same
 * models; transformers' defaults; the biases each family's fields switch; token ids and the
 * padding_idx; RoPE (default, linear, llama3) from rope_scaling or rope_parameters; the write ->
 * parse round trip of every preset; the writer's JSON (valid, floats as their shortest decimal);
 * a one-line rejection naming the file and the field for every value fsdp.c cannot honour, for
 * every refused field of every family's table (generated from the tables), and ignored fields
 * ignored; Jansson's syntax errors with line and column, duplicate keys, strings and numbers (what
 * the old hand-written parser's test checked); loading from a file or a directory. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_config_samples.h"
#include "io/hf_config.h"
#include "model/layout.h"
#include "check.h"

static int parse(const char *text, const char *origin, fsdp_model_config *c, fsdp_err *err) {
    memset(err, 0, sizeof *err);
    return fsdp_hf_config_parse(text, strlen(text), origin, c, err);
}

/* The parse must fail with one line that starts with the origin and holds every given piece. */
static void expect_reject(const char *text, const char *origin, const char *piece1, const char *piece2) {
    fsdp_model_config c;
    fsdp_err err;
    int rc = parse(text, origin, &c, &err);
    int ok = rc == -1 && err.failed && strstr(err.msg, origin) == err.msg && strstr(err.msg, piece1) &&
             (!piece2 || strstr(err.msg, piece2)) && !strchr(err.msg, '\n');
    check_quiet(ok, "expected a rejection naming %s / %s / %s; got rc %d: %s", origin, piece1, piece2 ? piece2 : "", rc,
                err.msg);
}

static int same_config(const fsdp_model_config *a, const fsdp_model_config *b) {
    fsdp_model_config x = *a, y = *b;
    memset(x.name, 0, sizeof x.name);
    memset(y.name, 0, sizeof y.name);
    return !memcmp(&x, &y, sizeof x);
}

static int count_biases(const fsdp_model_config *c) {
    fsdp_layout l;
    fsdp_layout_build(c, &l);
    int n = 0;
    for (int i = 0; i < l.num_params; i++) n += l.params[i].is_bias && l.params[i].module != FSDP_MOD_NORM_ATTN &&
                                                 l.params[i].module != FSDP_MOD_NORM_MLP &&
                                                 l.params[i].module != FSDP_MOD_NORM_FINAL;
    fsdp_layout_free(&l);
    return n;
}

static void test_llama(void) {
    fsdp_model_config c, v5, preset;
    fsdp_err err;
    CHECK(parse(LLAMA_3_2_1B, "models/Llama-3.2-1B/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("llama-3.2-1b", &preset) == 0);
    CHECK(same_config(&c, &preset));
    CHECK(c.family == fsdp_family_find("llama") && c.vocab_size == 128256 && c.hidden_size == 2048);
    CHECK(c.intermediate_size == 8192 && c.num_layers == 16 && c.num_heads == 32 && c.num_kv_heads == 8);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 131072 && c.norm_eps == 1e-5f);
    CHECK(c.rope_theta == 500000.0f && c.rope_type == FSDP_ROPE_LLAMA3 && c.rope_factor == 32.0f);
    CHECK(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f && c.rope_original_max_position == 8192);
    CHECK(c.tie_word_embeddings == 1 && c.biases == 0 && c.initializer_range == 0.02f);
    CHECK(c.bos_token_id == 128000 && c.eos_token_id == 128001 && c.pad_token_id == -1);
    CHECK(strstr(c.name, "llama") == c.name && strstr(c.name, "config.json"));
    CHECK(fsdp_model_num_params(&c) == 1235814400LL); /* the published 1.24B */
    CHECK(parse(LLAMA_3_2_1B_V5, "v5.json", &v5, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(same_config(&c, &v5));

    /* transformers' defaults for what the file leaves out: LlamaConfig's bos 1, eos 2. */
    const char *minimal = "{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 64, "
                          "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                          "\"max_position_embeddings\": 256, \"num_key_value_heads\": null, \"rope_scaling\": null}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.num_kv_heads == 4 && c.head_dim == 16 && c.norm_eps == 1e-6f && c.rope_theta == 10000.0f);
    CHECK(c.rope_type == FSDP_ROPE_DEFAULT && c.tie_word_embeddings == 0 && c.initializer_range == 0.02f);
    CHECK(c.bos_token_id == 1 && c.eos_token_id == 2 && c.pad_token_id == -1 && c.attention_dropout == 0.0f);
    CHECK(c.biases == 0 && count_biases(&c) == 0);
    /* Old-style "type", "default" scaling, an explicit head_dim that is not hidden/heads. */
    CHECK(parse(edit(LLAMA_3_2_1B, "\"rope_type\": \"llama3\"", "\"type\": \"llama3\""), "a.json", &c, &err) == 0 &&
          c.rope_type == FSDP_ROPE_LLAMA3);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"rope_type\": \"llama3\"", "\"rope_type\": \"default\""), "a.json", &c, &err) ==
              0 &&
          c.rope_type == FSDP_ROPE_DEFAULT && c.rope_theta == 500000.0f);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"head_dim\": 64", "\"head_dim\": 128"), "a.json", &c, &err) == 0 &&
          c.head_dim == 128);
    /* Biases: attention_bias puts them on q, k, v and o; mlp_bias on gate, up and down. */
    CHECK(parse(edit(LLAMA_3_2_1B, "\"attention_bias\": false", "\"attention_bias\": true"), "a.json", &c, &err) ==
              0 &&
          c.biases == (FSDP_BIAS_QKV | FSDP_BIAS_O) && count_biases(&c) == 16 * 4);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"mlp_bias\": false", "\"mlp_bias\": true"), "a.json", &c, &err) == 0 &&
          c.biases == FSDP_BIAS_MLP && count_biases(&c) == 16 * 3);
    CHECK(fsdp_model_num_params(&c) == 1235814400LL + 16 * (2 * 8192 + 2048));
    /* A list of end-of-sequence ids (Llama 3.1) keeps the first; null is none. */
    CHECK(parse(edit(LLAMA_3_2_1B, "\"eos_token_id\": 128001", "\"eos_token_id\": [128001, 128008, 128009]"),
                "a.json", &c, &err) == 0 &&
          c.eos_token_id == 128001);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"bos_token_id\": 128000", "\"bos_token_id\": null"), "a.json", &c, &err) == 0 &&
          c.bos_token_id == -1);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"bos_token_id\": 128000", "\"pad_token_id\": 128004"), "a.json", &c, &err) ==
              0 &&
          c.pad_token_id == 128004 && c.bos_token_id == 1 && fsdp_model_padding_idx(&c) == 128004);
    /* Fields the family does not have are ignored, as transformers ignores them. */
    CHECK(parse(edit(LLAMA_3_2_1B, "\"use_cache\": true", "\"use_cache\": \"whatever\", \"some_future_field\": [1]"),
                "a.json", &c, &err) == 0);
}

static void test_opt(void) {
    fsdp_model_config c, preset;
    fsdp_err err;
    CHECK(parse(OPT_1_3B, "facebook/opt-1.3b/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("opt-1.3b", &preset) == 0);
    CHECK(same_config(&c, &preset));
    CHECK(c.family == fsdp_family_find("opt") && c.vocab_size == 50272 && c.hidden_size == 2048);
    CHECK(c.intermediate_size == 8192 && c.num_layers == 24 && c.num_heads == 32 && c.num_kv_heads == 32);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 2048 && c.norm_eps == 1e-5f);
    CHECK(c.tie_word_embeddings == 1 && c.biases == (FSDP_BIAS_QKV | FSDP_BIAS_O | FSDP_BIAS_MLP));
    CHECK(c.initializer_range == 0.02f && c.dropout == 0.1f && c.attention_dropout == 0.0f);
    CHECK(c.pad_token_id == 1 && fsdp_model_padding_idx(&c) == 1 && c.bos_token_id == 2 && c.eos_token_id == 2);
    CHECK(strstr(c.name, "opt") == c.name);
    CHECK(fsdp_model_num_params(&c) == 1315758080LL); /* the published 1.3B */
    /* transformers 5 writes dtype; the file is otherwise the same. */
    fsdp_model_config v5;
    CHECK(parse(edit(OPT_1_3B, "\"torch_dtype\"", "\"dtype\""), "v5.json", &v5, &err) == 0 && same_config(&c, &v5));
    const char *minimal = "{\"model_type\": \"opt\", \"vocab_size\": 1000, \"hidden_size\": 64, \"ffn_dim\": 128, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 256}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.tie_word_embeddings == 1 && c.biases == 7 && c.head_dim == 16 && c.initializer_range == 0.02f);
    CHECK(c.dropout == 0.1f && c.attention_dropout == 0.0f && c.activation_dropout == 0.0f); /* OPTConfig's */
    CHECK(c.pad_token_id == 1 && c.bos_token_id == 2 && c.eos_token_id == 2);
    /* enable_bias false: no bias parameters at all (the LayerNorms keep theirs). */
    CHECK(parse(edit(OPT_1_3B, "\"layerdrop\"", "\"enable_bias\": false, \"layerdrop\""), "a.json", &c, &err) == 0);
    CHECK(c.biases == 0 && count_biases(&c) == 0);
    CHECK(fsdp_model_num_params(&c) == 1315758080LL - 24 * (4 * 2048 + 8192 + 2048));
    /* Dropout rates are read as they are. */
    CHECK(parse(edit(OPT_1_3B, "\"activation_dropout\": 0.0", "\"activation_dropout\": 0.25"), "a.json", &c, &err) ==
              0 &&
          c.activation_dropout == 0.25f);
}

static void test_qwen2(void) {
    fsdp_model_config c, v5, preset;
    fsdp_err err;
    CHECK(parse(QWEN2_5_0_5B, "Qwen/Qwen2.5-0.5B/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("qwen2.5-0.5b", &preset) == 0);
    CHECK(same_config(&c, &preset));
    CHECK(c.family == fsdp_family_find("qwen2") && c.vocab_size == 151936 && c.hidden_size == 896);
    CHECK(c.intermediate_size == 4864 && c.num_layers == 24 && c.num_heads == 14 && c.num_kv_heads == 2);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 32768 && c.norm_eps == 1e-6f);
    CHECK(c.rope_theta == 1000000.0f && c.rope_type == FSDP_ROPE_DEFAULT && c.tie_word_embeddings == 1);
    CHECK(c.biases == FSDP_BIAS_QKV && count_biases(&c) == 24 * 3 && c.pad_token_id == -1);
    CHECK(fsdp_model_num_params(&c) == 494032768LL); /* the published 0.49B */
    CHECK(parse(QWEN2_5_0_5B_V5, "v5.json", &v5, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(same_config(&c, &v5));
    /* Qwen2Config's defaults: 32 kv heads when absent, num_attention_heads when null; theta 10000;
     * untied; no token ids. */
    const char *minimal = "{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 64, "
                          "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 32, "
                          "\"max_position_embeddings\": 256}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.num_kv_heads == 32 && c.head_dim == 2 && c.rope_theta == 10000.0f && c.tie_word_embeddings == 0);
    CHECK(c.bos_token_id == -1 && c.eos_token_id == -1 && c.pad_token_id == -1 && c.biases == FSDP_BIAS_QKV);
    CHECK(parse(edit(QWEN2_5_0_5B, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": null"), "a.json", &c,
                &err) == 0 &&
          c.num_kv_heads == 14);
    expect_reject(edit(QWEN2_5_0_5B, "  \"num_key_value_heads\": 2,\n", ""), "q.json",
                  "num_key_value_heads 32 does not divide num_attention_heads 14", NULL);
    /* Qwen2Attention hard-codes its biases: a stray attention_bias changes nothing. */
    CHECK(parse(edit(QWEN2_5_0_5B, "\"use_cache\"", "\"attention_bias\": false, \"use_cache\""), "a.json", &c, &err) ==
              0 &&
          c.biases == FSDP_BIAS_QKV);
    /* sliding_window and max_window_layers only matter with use_sliding_window. */
    CHECK(parse(edit(QWEN2_5_0_5B, "\"sliding_window\": 32768", "\"sliding_window\": 7"), "a.json", &c, &err) == 0);
}

static void round_trip(const fsdp_model_config *c, const char *what);

/* Qwen3: the per-head q/k norms and a head_dim of its own. */
static void test_qwen3(void) {
    fsdp_model_config c, preset;
    fsdp_err err;
    CHECK(parse(QWEN3_0_6B, "Qwen/Qwen3-0.6B/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("qwen3-0.6b", &preset) == 0);
    CHECK(same_config(&c, &preset));
    CHECK(c.family == fsdp_family_find("qwen3") && c.head_dim == 128 && c.hidden_size == 1024 && c.num_heads == 16);
    CHECK(c.biases == 0 && c.tie_word_embeddings == 1 && c.sliding_window == 0 && c.eos_token_id == 151645);
    /* 0.6B as published: 28 layers of q (1024 -> 2048), k, v (-> 1024), o, SwiGLU, two norms and
     * the q_norm and k_norm weights (128 each), the tied embedding and the final norm. */
    CHECK(fsdp_model_num_params(&c) == 596049920LL);
    fsdp_layout l;
    fsdp_layout_build(&c, &l);
    int qn = fsdp_layout_find(&l, "model.layers.27.self_attn.q_norm.weight");
    int kn = fsdp_layout_find(&l, "model.layers.0.self_attn.k_norm.weight");
    CHECK(qn >= 0 && kn >= 0 && l.params[qn].numel == 128 && l.params[kn].numel == 128 && !l.params[qn].decay);
    fsdp_layout_free(&l);
    /* Qwen3Config's defaults: head_dim 128 and 32 kv heads when absent; null derives them. */
    const char *minimal = "{\"model_type\": \"qwen3\", \"vocab_size\": 1000, \"hidden_size\": 64, "
                          "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 32, "
                          "\"max_position_embeddings\": 256}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.head_dim == 128 && c.num_kv_heads == 32 && c.biases == 0 && c.tie_word_embeddings == 0);
    CHECK(parse(edit(QWEN3_0_6B, "\"head_dim\": 128", "\"head_dim\": null"), "a.json", &c, &err) == 0 &&
          c.head_dim == 64);
    CHECK(parse(edit(QWEN3_0_6B, "\"attention_bias\": false", "\"attention_bias\": true"), "a.json", &c, &err) == 0 &&
          c.biases == (FSDP_BIAS_QKV | FSDP_BIAS_O));
    expect_reject(edit(QWEN3_0_6B, "\"use_sliding_window\": false", "\"use_sliding_window\": true"), "q.json",
                  "use_sliding_window true is not supported", NULL);
}

/* Mistral: sliding_window (4096 when absent, none when null) and its own head_dim. */
static void test_mistral(void) {
    fsdp_model_config c, preset;
    fsdp_err err;
    CHECK(parse(MISTRAL_7B, "mistralai/Mistral-7B-v0.1/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("mistral-7b", &preset) == 0);
    CHECK(same_config(&c, &preset));
    CHECK(c.family == fsdp_family_find("mistral") && c.sliding_window == 4096 && c.head_dim == 128);
    CHECK(c.num_kv_heads == 8 && c.norm_eps == 1e-5f && c.tie_word_embeddings == 0 && c.biases == 0);
    CHECK(fsdp_model_num_params(&c) == 7241732096LL); /* the published 7.24B */
    CHECK(parse(edit(MISTRAL_7B, "\"sliding_window\": 4096", "\"sliding_window\": null"), "a.json", &c, &err) == 0 &&
          c.sliding_window == 0);
    round_trip(&c, "Mistral without a window");
    CHECK(parse(edit(MISTRAL_7B, "  \"sliding_window\": 4096,\n", ""), "a.json", &c, &err) == 0 &&
          c.sliding_window == 4096);
    CHECK(parse(edit(MISTRAL_7B, "\"num_attention_heads\": 32", "\"num_attention_heads\": 32, \"head_dim\": 96"),
                "a.json", &c, &err) == 0 &&
          c.head_dim == 96);
    expect_reject(edit(MISTRAL_7B, "\"sliding_window\": 4096", "\"sliding_window\": 0"), "m.json",
                  "sliding_window 0 is out of range", NULL);
    /* MistralConfig's default kv heads are 8; an explicit null means num_attention_heads. */
    CHECK(parse(edit(MISTRAL_7B, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": null"), "a.json", &c,
                &err) == 0 &&
          c.num_kv_heads == 32);
}

static void test_rope(void) {
    fsdp_model_config c;
    fsdp_err err;
    const char *Q = QWEN2_5_0_5B_V5, *L = LLAMA_3_2_1B;
    /* rope_parameters' theta wins over a top-level rope_theta; rope_scaling over rope_parameters. */
    CHECK(parse(edit(Q, "\"rms_norm_eps\"", "\"rope_theta\": 77.0, \"rms_norm_eps\""), "a.json", &c, &err) == 0 &&
          c.rope_theta == 1000000.0f);
    CHECK(parse(edit(Q, "\"rms_norm_eps\"", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4.0}, "
                                            "\"rms_norm_eps\""),
                "a.json", &c, &err) == 0 &&
          c.rope_type == FSDP_ROPE_LINEAR && c.rope_factor == 4.0f && c.rope_theta == 10000.0f);
    CHECK(parse(edit(Q, "\"rope_type\": \"default\"", "\"rope_type\": \"linear\", \"factor\": 2.5"), "a.json", &c,
                &err) == 0 &&
          c.rope_type == FSDP_ROPE_LINEAR && c.rope_factor == 2.5f && c.rope_theta == 1000000.0f);
    /* transformers 5: llama3 without original_max_position_embeddings takes max_position_embeddings. */
    CHECK(parse(edit(L, "\"original_max_position_embeddings\": 8192,", ""), "a.json", &c, &err) == 0 &&
          c.rope_original_max_position == 131072);
    /* No type at all: "default" (5.x), when nothing else would be silently dropped. */
    CHECK(parse(edit(Q, ", \"rope_type\": \"default\"", ""), "a.json", &c, &err) == 0 &&
          c.rope_type == FSDP_ROPE_DEFAULT);
    expect_reject(edit(L, "\"rope_type\": \"llama3\"", "\"unrelated\": 1"), "r.json", "rope_scaling has no rope_type",
                  NULL);
    expect_reject(edit(L, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""), "r.json",
                  "rope_scaling.rope_type 'yarn' is not supported", "default, linear, llama3");
    expect_reject(edit(Q, "\"rope_type\": \"default\"", "\"rope_type\": \"dynamic\", \"factor\": 2.0"), "r.json",
                  "rope_parameters.rope_type 'dynamic' is not supported", NULL);
    expect_reject(edit(L, "\"factor\": 32.0,", ""), "r.json", "missing field rope_scaling.factor", NULL);
    expect_reject(edit(L, "\"factor\": 32.0", "\"factor\": \"32\""), "r.json", "rope_scaling.factor", "number");
    expect_reject(edit(L, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5"), "r.json", "rope_scaling",
                  "llama3");
    expect_reject(edit(L, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\""), "r.json", "rope_theta", "number");
    expect_reject(edit(L, "\"rope_scaling\": {", "\"rope_scaling\": [{"), "r.json", "line", "column");
    expect_reject(edit(Q, "\"rope_parameters\": {", "\"rope_parameters\": 3, \"x\": {"), "r.json", "rope_parameters",
                  "null or an object");
    expect_reject(edit(Q, "\"rope_type\": \"default\"", "\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5"),
                  "r.json", "rope_parameters.partial_rotary_factor 0.5 is not supported", NULL);
    expect_reject(edit(L, "\"use_cache\"", "\"partial_rotary_factor\": 0.25, \"use_cache\""), "r.json",
                  "partial_rotary_factor 0.25 is not supported", NULL);
    expect_reject(edit(Q, "\"rope_parameters\": {", "\"rope_parameters\": {\"full_attention\": {\"rope_theta\": 1.0}, "),
                  "r.json", "rope_parameters.full_attention", "per layer type");
}

/* Everything the config struct holds survives writing and reading back; the text is valid JSON
 * with the family's fields and floats as their shortest decimals. */
static void round_trip(const fsdp_model_config *c, const char *what) {
    char buf[4096];
    int n = fsdp_hf_config_write(c, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n == strlen(buf) && buf[n - 1] == '\n');
    json_error_t je;
    json_t *doc = json_loads(buf, JSON_REJECT_DUPLICATES, &je);
    CHECK(doc != NULL);
    if (doc) {
        CHECK(!strcmp(json_string_value(json_array_get(json_object_get(doc, "architectures"), 0)),
                      c->family->architecture));
        CHECK(!strcmp(json_string_value(json_object_get(doc, "model_type")), c->family->model_type));
        CHECK(!strcmp(json_string_value(json_object_get(doc, "torch_dtype")), "float32"));
        for (const fsdp_hf_field *fd = c->family->fields; fd->key; fd++) {
            int written = json_object_get(doc, fd->key) != NULL;
            int should = (fd->kind != FSDP_HF_IGNORED && !(fd->flags & FSDP_HF_UNWRITTEN)) ||
                         !strcmp(fd->key, "torch_dtype");
            check_quiet(written == should, "%s: field %s %s", what, fd->key, written ? "written" : "missing");
        }
        json_decref(doc);
    }
    fsdp_model_config back;
    fsdp_err err;
    int rc = parse(buf, "written.json", &back, &err);
    if (rc) fprintf(stderr, "round trip of %s: %s\n%s", what, err.msg, buf);
    CHECK(rc == 0);
    check_quiet(same_config(c, &back), "round trip of %s changed the config:\n%s", what, buf);
    CHECK(fsdp_hf_config_write(c, buf, (size_t)n) == -1); /* no room for the NUL */
    CHECK(fsdp_hf_config_write(c, buf, (size_t)n + 1) == n);
}

static void test_round_trips(void) {
    fsdp_model_config c;
    fsdp_err err;
    for (const char *const *name = fsdp_model_preset_names(); *name; name++) {
        CHECK(fsdp_model_preset(*name, &c) == 0);
        round_trip(&c, *name);
    }
    CHECK(parse(LLAMA_3_2_1B, "l.json", &c, &err) == 0);
    round_trip(&c, "Llama-3.2-1B config.json");
    c.norm_eps = 1.2345e-7f, c.rope_theta = 123456.7f, c.rope_factor = 8.5f, c.tie_word_embeddings = 0;
    c.biases = FSDP_BIAS_QKV | FSDP_BIAS_O, c.pad_token_id = 7, c.attention_dropout = 0.125f;
    round_trip(&c, "Llama variant");
    c.rope_type = FSDP_ROPE_LINEAR, c.biases = FSDP_BIAS_MLP;
    c.rope_low_freq_factor = c.rope_high_freq_factor = 0.0f, c.rope_original_max_position = 0;
    round_trip(&c, "Llama variant, linear rope");
    CHECK(parse(OPT_1_3B, "o.json", &c, &err) == 0);
    round_trip(&c, "OPT-1.3b config.json");
    c.tie_word_embeddings = 0, c.biases = 0, c.initializer_range = 0.0123f, c.pad_token_id = -1;
    c.dropout = 0.0f, c.attention_dropout = 0.3f, c.activation_dropout = 0.2f;
    round_trip(&c, "OPT variant");
    CHECK(parse(QWEN2_5_0_5B_V5, "q.json", &c, &err) == 0);
    round_trip(&c, "Qwen2.5-0.5B (transformers 5) config.json");

    /* Shortest decimals: 1e-5 (Jansson drops the exponent's leading zero), not 9.9999997473787516e-06
     * or 1.0000000000000001e-05. */
    char buf[4096];
    CHECK(parse(LLAMA_3_2_1B, "l.json", &c, &err) == 0);
    CHECK(fsdp_hf_config_write(&c, buf, sizeof buf) > 0);
    CHECK(strstr(buf, "\"rms_norm_eps\": 1e-5,") && strstr(buf, "\"rope_theta\": 500000.0,") &&
          strstr(buf, "\"initializer_range\": 0.02,") && strstr(buf, "\"factor\": 32.0,"));
    CHECK(fsdp_model_preset("opt-1.3b", &c) == 0 && fsdp_hf_config_write(&c, buf, sizeof buf) > 0);
    CHECK(strstr(buf, "\"dropout\": 0.1,") && strstr(buf, "\"enable_bias\": true,") && strstr(buf, "\"pad_token_id\": 1"));
}

/* A value of `fd` that fsdp.c refuses, as JSON. */
static json_t *refused_value(const fsdp_hf_field *fd, const json_t *doc) {
    switch (fd->kind) {
    case FSDP_HF_ONLY_BOOL: return json_boolean(fd->dflt == 0);
    case FSDP_HF_ONLY_NUMBER: return json_real(fd->dflt + 0.5);
    case FSDP_HF_ONLY_STRING: return json_string("bogus");
    case FSDP_HF_ONLY_STRINGS: return json_pack("[ss]", fd->text, "bogus");
    case FSDP_HF_SAME_AS: return json_integer(json_integer_value(json_object_get(doc, "hidden_size")) + 1);
    default: return NULL;
    }
}

/* From the tables themselves: every refused field of every family, at a refused value, gets one
 * line naming the file and the field; every ignored field takes any value. */
static void test_tables(void) {
    for (const fsdp_family *const *f = fsdp_families(); *f; f++) {
        const fsdp_model_config *base = &(*f)->presets[0];
        char buf[8192];
        CHECK(fsdp_hf_config_write(base, buf, sizeof buf) > 0);
        int refused = 0;
        for (const fsdp_hf_field *fd = (*f)->fields; fd->key; fd++) {
            json_t *doc = json_loads(buf, 0, NULL);
            json_t *bad = refused_value(fd, doc);
            int ignored = fd->kind == FSDP_HF_IGNORED;
            if (ignored) bad = json_pack("{s[i]}", "anything", 3);
            if (!bad) {
                json_decref(doc);
                continue;
            }
            json_object_set_new(doc, fd->key, bad);
            char *text = json_dumps(doc, 0);
            fsdp_model_config c;
            fsdp_err err;
            char origin[128];
            snprintf(origin, sizeof origin, "tables/%s/config.json", (*f)->model_type);
            int rc = parse(text, origin, &c, &err);
            if (ignored) {
                check_quiet(!rc && same_config(&c, base), "%s: ignored field %s changed the outcome: %s", origin,
                            fd->key, err.msg);
            } else {
                refused++;
                int ok = rc == -1 && strstr(err.msg, origin) == err.msg && strstr(err.msg, fd->key) &&
                         strstr(err.msg, "not supported") && !strchr(err.msg, '\n');
                check_quiet(ok, "%s: %s at a refused value: rc %d, %s", origin, fd->key, rc, err.msg);
            }
            free(text);
            json_decref(doc);
        }
        CHECK(refused >= 1); /* hidden_act or activation_function in every family */
    }
}

static void test_rejections(void) {
    const char *o = "models/x/config.json";
    const char *L = LLAMA_3_2_1B, *O = OPT_1_3B, *Q = QWEN2_5_0_5B, *Q5 = QWEN2_5_0_5B_V5;
    expect_reject(edit(L, "\"llama\"", "\"gpt2\""), o, "model_type 'gpt2' is not supported (llama, opt, qwen2, qwen3, mistral)", NULL);
    expect_reject(edit(L, "\"model_type\": \"llama\",", ""), o, "missing field model_type", NULL);
    expect_reject(edit(L, "\"model_type\": \"llama\"", "\"model_type\": 3"), o, "model_type", "string");
    expect_reject("[1, 2]", o, "expected a JSON object", NULL);
    expect_reject(edit(L, "  \"hidden_size\": 2048,\n", ""), o, "missing field hidden_size",
                  "transformers would default it to 4096");
    expect_reject(edit(L, "  \"num_hidden_layers\": 16,\n", ""), o, "missing field num_hidden_layers", NULL);
    expect_reject(edit(Q, "  \"intermediate_size\": 4864,\n", ""), o, "missing field intermediate_size", "22016");
    expect_reject(edit(L, "\"vocab_size\": 128256", "\"vocab_size\": \"128256\""), o, "vocab_size",
                  "must be an integer, not a string");
    expect_reject(edit(L, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 16.5"), o, "num_hidden_layers 16.5",
                  "not an integer");
    expect_reject(edit(L, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 16.0"), o, "num_hidden_layers 16",
                  "not an integer");
    expect_reject(edit(L, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": -2"), o, "num_hidden_layers -2",
                  "out of range");
    expect_reject(edit(L, "\"vocab_size\": 128256", "\"vocab_size\": 1000000000000"), o, "vocab_size 1000000000000",
                  "out of range");
    expect_reject(edit(L, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"), o, "tie_word_embeddings",
                  "true or false");
    expect_reject(edit(L, "\"mlp_bias\": false", "\"mlp_bias\": \"no\""), o, "mlp_bias", "true or false");
    expect_reject(edit(L, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0"), o, "rms_norm_eps 0", "positive");
    expect_reject(edit(L, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-300"), o, "rms_norm_eps 1e-300", "float");
    expect_reject(edit(L, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), o, "hidden_act 'gelu'",
                  "not supported");
    expect_reject(edit(L, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"), o,
                  "num_key_value_heads 5 does not divide num_attention_heads 32", NULL);
    expect_reject(edit(edit(L, "  \"head_dim\": 64,\n", ""), "\"hidden_size\": 2048", "\"hidden_size\": 100"), o,
                  "num_attention_heads 32 does not divide hidden_size 100", NULL);
    expect_reject(edit(L, "\"head_dim\": 64", "\"head_dim\": 63"), o, "head_dim 63", NULL);
    expect_reject(edit(L, "\"attention_dropout\": 0.0", "\"attention_dropout\": 1.5"), o, "attention_dropout 1.5",
                  "[0, 1]");
    expect_reject(edit(L, "\"bos_token_id\": 128000", "\"bos_token_id\": -1"), o, "bos_token_id", "non-negative");
    expect_reject(edit(L, "\"bos_token_id\": 128000", "\"pad_token_id\": 128256"), o,
                  "pad_token_id 128256 is not a row of the embedding (vocab_size 128256)", NULL);
    expect_reject(edit(O, "\"num_attention_heads\": 32", "\"num_attention_heads\": 7"), o,
                  "num_attention_heads 7 does not divide hidden_size 2048", NULL);
    expect_reject(edit(O, "\"ffn_dim\": 8192,", ""), o, "missing field ffn_dim", NULL);
    expect_reject(edit(O, "\"do_layer_norm_before\": true", "\"do_layer_norm_before\": false"), o,
                  "do_layer_norm_before false is not supported", "pre-LayerNorm");
    expect_reject(edit(O, "\"word_embed_proj_dim\": 2048", "\"word_embed_proj_dim\": 512"), o,
                  "word_embed_proj_dim 512 is not supported", "hidden_size 2048");
    expect_reject(edit(O, "\"activation_function\": \"relu\"", "\"activation_function\": \"gelu\""), o,
                  "activation_function 'gelu' is not supported", NULL);
    expect_reject(edit(O, "\"do_layer_norm_before\": true", "\"layer_norm_elementwise_affine\": false"), o,
                  "layer_norm_elementwise_affine false is not supported", NULL);
    expect_reject(edit(O, "\"layerdrop\": 0.0", "\"layerdrop\": 0.1"), o, "layerdrop 0.1 is not supported",
                  "LayerDrop");
    expect_reject(edit(O, "\"use_cache\"", "\"_remove_final_layer_norm\": true, \"use_cache\""), o,
                  "_remove_final_layer_norm true is not supported", NULL);
    expect_reject(edit(O, "\"init_std\": 0.02", "\"init_std\": -1"), o, "init_std -1", NULL);
    expect_reject(edit(O, "\"dropout\": 0.1", "\"dropout\": -0.1"), o, "dropout -0.1", "[0, 1]");
    expect_reject(edit(O, "\"layerdrop\"", "\"enable_bias\": 0, \"layerdrop\""), o, "enable_bias", "true or false");
    expect_reject(edit(Q, "\"use_sliding_window\": false", "\"use_sliding_window\": true"), o,
                  "use_sliding_window true is not supported", "sliding-window");
    expect_reject(edit(Q5, "\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\"",
                       "\"full_attention\", \"sliding_attention\""),
                  o, "layer_types[1] 'sliding_attention' is not supported", NULL);
    expect_reject(edit(Q, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu\""), o, "hidden_act 'relu'", NULL);
}

/* What the hand-written parser's test checked that still matters, now that Jansson parses: syntax
 * errors name the line and column, duplicate keys are refused, escapes and UTF-8 in strings, large
 * integers kept apart from reals. */
static void test_json(void) {
    const char *L = LLAMA_3_2_1B;
    fsdp_model_config c;
    fsdp_err err;
    /* The colon after "hidden_size" (line 11) goes missing. */
    expect_reject(edit(L, "\"hidden_size\":", "\"hidden_size\""), "config.json", "config.json: line 11, column", NULL);
    expect_reject(edit(L, "\"vocab_size\": 128256\n}", "\"vocab_size\": 128256,\n}"), "config.json", "line 35, column 1", NULL);
    expect_reject(edit(L, "\"use_cache\": true", "\"use_cache\": true, \"vocab_size\": 5"), "dup.json",
                  "duplicate object key", NULL);
    expect_reject("{\"model_type\": \"llama\"", "eof.json", "line 1", NULL);
    expect_reject("{\"model_type\": \"ll\xC3\x28\"}", "utf8.json", "utf8.json", NULL); /* invalid UTF-8 */
    /* Escapes and UTF-8 in strings we ignore, and in model_type itself. */
    CHECK(parse(edit(L, "\"use_cache\": true", "\"_name_or_path\": \"caf\\u00e9 \xF0\x9F\x98\x80 \\\"q\\\" \\n\""),
                "a.json", &c, &err) == 0);
    CHECK(parse(edit(L, "\"model_type\": \"llama\"", "\"model_type\": \"ll\\u0061ma\""), "a.json", &c, &err) == 0);
    /* An integer beyond 2^53 is an integer, not a rounded real. */
    expect_reject(edit(L, "\"vocab_size\": 128256", "\"vocab_size\": 9007199254740993"), "big.json",
                  "vocab_size 9007199254740993 is out of range", NULL);
}

static void test_load(void) {
    const char *tmp = getenv("FSDP_TEST_TMP") ? getenv("FSDP_TEST_TMP") : "/tmp";
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/test_hf_config_%d", tmp, (int)getpid());
    snprintf(file, sizeof file, "%s/config.json", dir);
    CHECK(mkdir(dir, 0755) == 0);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(LLAMA_3_2_1B, f);
    fclose(f);
    fsdp_model_config a, b;
    fsdp_err err = {0};
    CHECK(fsdp_hf_config_load(dir, &a, &err) == 0);
    CHECK(fsdp_hf_config_load(file, &b, &err) == 0);
    CHECK(a.vocab_size == 128256 && fsdp_model_config_same_shape(&a, &b));
    f = fopen(file, "w");
    fputs(edit(LLAMA_3_2_1B, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": \"x\""), f);
    fclose(f);
    memset(&err, 0, sizeof err);
    CHECK(fsdp_hf_config_load(dir, &a, &err) == -1 && strstr(err.msg, file) == err.msg &&
          strstr(err.msg, "num_hidden_layers"));
    remove(file);
    memset(&err, 0, sizeof err);
    CHECK(fsdp_hf_config_load(dir, &a, &err) == -1 && strstr(err.msg, file) == err.msg &&
          strstr(err.msg, "No such file"));
    rmdir(dir);
}

int main(void) {
    test_llama();
    test_opt();
    test_qwen2();
    test_qwen3();
    test_mistral();
    test_rope();
    test_round_trips();
    test_tables();
    test_rejections();
    test_json();
    test_load();
    return check_summary("test_hf_config");
}
