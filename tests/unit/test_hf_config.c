/* config.json <-> fsdp_model_config: the real Llama-3.2-1B and OPT-1.3b files, defaults, the
 * write -> parse round trip, loading from a file or a directory, and a one-line rejection naming
 * the file and the field for everything fsdp.c cannot honour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/hf_config.h"

static int failures;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                          \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

static const char *LLAMA_3_2_1B =
    "{\n"
    "  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 128000,\n"
    "  \"eos_token_id\": 128001,\n"
    "  \"head_dim\": 64,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 8192,\n"
    "  \"max_position_embeddings\": 131072,\n"
    "  \"mlp_bias\": false,\n"
    "  \"model_type\": \"llama\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 16,\n"
    "  \"num_key_value_heads\": 8,\n"
    "  \"pretraining_tp\": 1,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_scaling\": {\n"
    "    \"factor\": 32.0,\n"
    "    \"high_freq_factor\": 4.0,\n"
    "    \"low_freq_factor\": 1.0,\n"
    "    \"original_max_position_embeddings\": 8192,\n"
    "    \"rope_type\": \"llama3\"\n"
    "  },\n"
    "  \"rope_theta\": 500000.0,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.45.0.dev0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 128256\n"
    "}\n";

static const char *OPT_1_3B =
    "{\n"
    "  \"_name_or_path\": \"facebook/opt-1.3b\",\n"
    "  \"activation_dropout\": 0.0,\n"
    "  \"activation_function\": \"relu\",\n"
    "  \"architectures\": [\n    \"OPTForCausalLM\"\n  ],\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 2,\n"
    "  \"do_layer_norm_before\": true,\n"
    "  \"dropout\": 0.1,\n"
    "  \"eos_token_id\": 2,\n"
    "  \"ffn_dim\": 8192,\n"
    "  \"hidden_size\": 2048,\n"
    "  \"init_std\": 0.02,\n"
    "  \"layerdrop\": 0.0,\n"
    "  \"max_position_embeddings\": 2048,\n"
    "  \"model_type\": \"opt\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 24,\n"
    "  \"pad_token_id\": 1,\n"
    "  \"prefix\": \"</s>\",\n"
    "  \"torch_dtype\": \"float16\",\n"
    "  \"transformers_version\": \"4.21.0.dev0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 50272,\n"
    "  \"word_embed_proj_dim\": 2048\n"
    "}\n";

/* `text` with the first occurrence of `from` replaced by `to` (in one of two static buffers, so
 * that edits can be nested once). */
static const char *edit(const char *text, const char *from, const char *to) {
    static char bufs[2][8192];
    static int next;
    char *buf = bufs[next ^= 1];
    const char *at = strstr(text, from);
    if (!at) {
        fprintf(stderr, "test bug: '%s' not found\n", from);
        exit(1);
    }
    snprintf(buf, sizeof bufs[0], "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return buf;
}

static int parse(const char *text, const char *origin, fsdp_model_config *c, fsdp_err *err) {
    memset(err, 0, sizeof *err);
    return fsdp_hf_config_parse(text, strlen(text), origin, c, err);
}

/* The parse must fail with a message holding every one of the given pieces. */
static void expect_reject(const char *text, const char *origin, const char *piece1, const char *piece2) {
    fsdp_model_config c;
    fsdp_err err;
    int rc = parse(text, origin, &c, &err);
    int ok = rc == -1 && err.failed && strstr(err.msg, origin) == err.msg && strstr(err.msg, piece1) &&
             (!piece2 || strstr(err.msg, piece2)) && !strchr(err.msg, '\n');
    if (!ok) {
        fprintf(stderr, "FAIL: expected a rejection naming %s / %s / %s; got rc %d: %s\n", origin, piece1,
                piece2 ? piece2 : "", rc, err.msg);
        failures++;
    }
}

static void test_llama(void) {
    fsdp_model_config c, preset;
    fsdp_err err;
    CHECK(parse(LLAMA_3_2_1B, "models/Llama-3.2-1B/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("llama-3.2-1b", &preset) == 0);
    CHECK(fsdp_model_config_same_shape(&c, &preset));
    CHECK(c.family == FSDP_FAMILY_LLAMA && c.vocab_size == 128256 && c.hidden_size == 2048);
    CHECK(c.intermediate_size == 8192 && c.num_layers == 16 && c.num_heads == 32 && c.num_kv_heads == 8);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 131072 && c.norm_eps == 1e-5f);
    CHECK(c.rope_theta == 500000.0f && c.rope_type == FSDP_ROPE_LLAMA3 && c.rope_factor == 32.0f);
    CHECK(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f && c.rope_original_max_position == 8192);
    CHECK(c.tie_word_embeddings == 1 && c.enable_bias == 0 && c.initializer_range == 0.02f);
    CHECK(strstr(c.name, "llama") == c.name && strstr(c.name, "config.json"));

    /* transformers' defaults for what the file leaves out. */
    const char *minimal = "{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 64, "
                          "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                          "\"max_position_embeddings\": 256, \"num_key_value_heads\": null, \"rope_scaling\": null}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.num_kv_heads == 4 && c.head_dim == 16 && c.norm_eps == 1e-6f && c.rope_theta == 10000.0f);
    CHECK(c.rope_type == FSDP_ROPE_DEFAULT && c.tie_word_embeddings == 0 && c.initializer_range == 0.02f);
    /* Old-style "type", "default" scaling, and an explicit head_dim that is not hidden/heads. */
    CHECK(parse(edit(LLAMA_3_2_1B, "\"rope_type\": \"llama3\"", "\"type\": \"llama3\""), "a.json", &c, &err) == 0 &&
          c.rope_type == FSDP_ROPE_LLAMA3);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"rope_type\": \"llama3\"", "\"rope_type\": \"default\""), "a.json", &c, &err) ==
              0 &&
          c.rope_type == FSDP_ROPE_DEFAULT);
    CHECK(parse(edit(LLAMA_3_2_1B, "\"head_dim\": 64", "\"head_dim\": 128"), "a.json", &c, &err) == 0 &&
          c.head_dim == 128);
}

static void test_opt(void) {
    fsdp_model_config c, preset;
    fsdp_err err;
    CHECK(parse(OPT_1_3B, "facebook/opt-1.3b/config.json", &c, &err) == 0);
    if (err.failed) fprintf(stderr, "  %s\n", err.msg);
    CHECK(fsdp_model_preset("opt-1.3b", &preset) == 0);
    CHECK(fsdp_model_config_same_shape(&c, &preset));
    CHECK(c.family == FSDP_FAMILY_OPT && c.vocab_size == 50272 && c.hidden_size == 2048);
    CHECK(c.intermediate_size == 8192 && c.num_layers == 24 && c.num_heads == 32 && c.num_kv_heads == 32);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 2048 && c.norm_eps == 1e-5f);
    CHECK(c.tie_word_embeddings == 1 && c.enable_bias == 1 && c.initializer_range == 0.02f);
    CHECK(strstr(c.name, "opt") == c.name);
    const char *minimal = "{\"model_type\": \"opt\", \"vocab_size\": 1000, \"hidden_size\": 64, \"ffn_dim\": 128, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 256}";
    CHECK(parse(minimal, "min.json", &c, &err) == 0);
    CHECK(c.tie_word_embeddings == 1 && c.enable_bias == 1 && c.head_dim == 16 && c.initializer_range == 0.02f);
}

/* Everything the config struct holds survives writing and reading back. */
static void round_trip(const fsdp_model_config *c, const char *what) {
    char buf[4096];
    int n = fsdp_hf_config_write(c, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n == strlen(buf));
    CHECK(strstr(buf, "\"architectures\"") && strstr(buf, "\"model_type\"") &&
          strstr(buf, "\"torch_dtype\": \"float32\""));
    fsdp_model_config back;
    fsdp_err err;
    int rc = parse(buf, "written.json", &back, &err);
    if (rc) fprintf(stderr, "round trip of %s: %s\n%s", what, err.msg, buf);
    CHECK(rc == 0);
    fsdp_model_config a = *c;
    memset(a.name, 0, sizeof a.name);
    memset(back.name, 0, sizeof back.name);
    if (memcmp(&a, &back, sizeof a)) {
        fprintf(stderr, "FAIL: round trip of %s changed the config:\n%s", what, buf);
        failures++;
    }
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
    CHECK(parse(OPT_1_3B, "o.json", &c, &err) == 0);
    round_trip(&c, "OPT-1.3b config.json");
    c.tie_word_embeddings = 0, c.enable_bias = 0, c.initializer_range = 0.0123f;
    round_trip(&c, "OPT variant");
    CHECK(parse(LLAMA_3_2_1B, "l.json", &c, &err) == 0);
    c.norm_eps = 1.2345e-7f, c.rope_theta = 123456.7f, c.rope_factor = 8.5f, c.tie_word_embeddings = 0;
    round_trip(&c, "Llama variant");
}

static void test_rejections(void) {
    const char *o = "models/x/config.json";
    const char *L = LLAMA_3_2_1B, *O = OPT_1_3B;
    expect_reject(edit(L, "\"llama\"", "\"gpt2\""), o, "model_type 'gpt2' is not supported (llama, opt)", NULL);
    expect_reject(edit(L, "\"model_type\": \"llama\",", ""), o, "missing field model_type", NULL);
    expect_reject(edit(L, "\"model_type\": \"llama\"", "\"model_type\": 3"), o, "model_type", "string");
    /* The colon after "hidden_size" (line 11) goes missing. */
    expect_reject(edit(L, "\"hidden_size\":", "\"hidden_size\""), "config.json",
                  "config.json: line 11, column 17: expected ':'", NULL);
    expect_reject("[1, 2]", o, "expected a JSON object", NULL);
    expect_reject(edit(L, "  \"hidden_size\": 2048,\n", ""), o, "missing field hidden_size", NULL);
    expect_reject(edit(L, "  \"num_hidden_layers\": 16,\n", ""), o, "missing field num_hidden_layers", NULL);
    expect_reject(edit(L, "\"vocab_size\": 128256", "\"vocab_size\": \"128256\""), o, "vocab_size",
                  "must be an integer, not a string");
    expect_reject(edit(L, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 16.5"), o, "num_hidden_layers 16.5",
                  "not an integer");
    expect_reject(edit(L, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": -2"), o, "num_hidden_layers -2",
                  "out of range");
    expect_reject(edit(L, "\"vocab_size\": 128256", "\"vocab_size\": 1e12"), o, "vocab_size 1e12", "out of range");
    expect_reject(edit(L, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"), o, "tie_word_embeddings",
                  "true or false");
    expect_reject(edit(L, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0"), o, "rms_norm_eps 0", "positive");
    expect_reject(edit(L, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\""), o, "rope_theta", "number");
    expect_reject(edit(L, "\"attention_bias\": false", "\"attention_bias\": true"), o, "attention_bias true",
                  "not supported");
    expect_reject(edit(L, "\"mlp_bias\": false", "\"mlp_bias\": true"), o, "mlp_bias true", "not supported");
    expect_reject(edit(L, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), o, "hidden_act 'gelu'",
                  "not supported");
    expect_reject(edit(L, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""), o, "rope_scaling type 'yarn'",
                  "not supported");
    expect_reject(edit(L, "\"rope_type\": \"llama3\"", "\"unrelated\": 1"), o, "rope_scaling", "rope_type");
    expect_reject(edit(L, "\"factor\": 32.0,", ""), o, "missing field rope_scaling.factor", NULL);
    expect_reject(edit(L, "\"factor\": 32.0", "\"factor\": \"32\""), o, "rope_scaling.factor", "number");
    expect_reject(edit(L, "\"rope_scaling\": {", "\"rope_scaling\": [{"), o, "line", "column");
    expect_reject(edit(L, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5"), o, "rope_scaling", "llama3");
    expect_reject(edit(L, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"), o,
                  "num_key_value_heads 5 does not divide num_attention_heads 32", NULL);
    expect_reject(edit(edit(L, "  \"head_dim\": 64,\n", ""), "\"hidden_size\": 2048", "\"hidden_size\": 100"), o,
                  "num_attention_heads 32 does not divide hidden_size 100", NULL);
    expect_reject(edit(L, "\"head_dim\": 64", "\"head_dim\": 63"), o, "head_dim 63", NULL);
    expect_reject(edit(O, "\"num_attention_heads\": 32", "\"num_attention_heads\": 7"), o,
                  "num_attention_heads 7 does not divide hidden_size 2048", NULL);
    expect_reject(edit(O, "\"ffn_dim\": 8192,", ""), o, "missing field ffn_dim", NULL);
    expect_reject(edit(O, "\"do_layer_norm_before\": true", "\"do_layer_norm_before\": false"), o,
                  "do_layer_norm_before false", "not supported");
    expect_reject(edit(O, "\"word_embed_proj_dim\": 2048", "\"word_embed_proj_dim\": 512"), o,
                  "word_embed_proj_dim 512", NULL);
    expect_reject(edit(O, "\"activation_function\": \"relu\"", "\"activation_function\": \"gelu\""), o,
                  "activation_function 'gelu'", "not supported");
    expect_reject(edit(O, "\"do_layer_norm_before\": true", "\"layer_norm_elementwise_affine\": false"), o,
                  "layer_norm_elementwise_affine false", "not supported");
    expect_reject(edit(O, "\"init_std\": 0.02", "\"init_std\": -1"), o, "init_std -1", NULL);
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
    CHECK(fsdp_hf_config_load(dir, &a, &err) == -1 && strstr(err.msg, file) && strstr(err.msg, "No such file"));
    rmdir(dir);
}

int main(void) {
    test_llama();
    test_opt();
    test_round_trips();
    test_rejections();
    test_load();
    if (failures) {
        fprintf(stderr, "test_hf_config: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_hf_config: ok\n");
    return 0;
}
