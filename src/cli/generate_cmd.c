/* `fsdp generate`: a prompt in, its continuation streamed to standard output, from a Hugging Face
 * model directory or an fsdp.c checkpoint, with a KV cache on the CPU or one GPU (src/train/generate.h).
 *
 * One process: under mpirun with more than one rank it refuses (every rank would load the whole
 * model to write the same text). Standard output carries only the text (or, with --print-ids, the
 * new ids); what was loaded and the speed go to standard error. */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../base/files.h"
#include "../base/output_paths.h"
#include "../io/export_dir.h"
#include "../io/generation_config.h"
#include "../text/stream.h"
#include "../io/tokenizer_config.h"
#include "../text/tokenizer.h"
#include "../train/generate.h"
#include "../train/resident.h"
#include "commands.h"

static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};
static const char *const DTYPES[] = {"auto", "fp32", "bf16", NULL};
static const char *const SAMPLE[] = {"auto", "yes", "no", NULL};

static const char EPILOGUE[] =
    "Runs the prompt once through the model (the prefill), then one token at a time over a KV cache, and\n"
    "writes the text to standard output as it comes, until the model's end-of-sequence token (the\n"
    "eos_token_id of generation_config.json, or config.json) or --max-new-tokens. Greedy with --temperature 0\n"
    "or --do-sample no; otherwise a draw after the warpers transformers applies, in its order: temperature,\n"
    "top-k, top-p. Draws are a function of --seed: the same command writes the same text. Defaults of\n"
    "--do-sample, --temperature, --top-k, --top-p and --max-new-tokens come from the model directory's\n"
    "generation_config.json when it sets them. One process (no mpirun); speeds on standard error.\n"
    "  fsdp generate --init-from ~/models/Llama-3.2-1B --prompt 'The capital of France is' --temperature 0\n"
    "  fsdp generate --checkpoint ckpt --tokenizer tokenizer.json --prompt-file story.txt --top-p 0.9 --seed 7\n";

typedef struct {
    const fsdp_tokenizer *tok;
    fsdp_text_stream stream;
    int streaming, print_ids, count;
    uint32_t tok_vocab;
    fsdp_buf text;
} sink;

static int on_token(void *arg, int32_t id, fsdp_err *err) {
    sink *k = arg;
    if (k->print_ids) {
        printf(k->count++ ? " %d" : "%d", (int)id);
        fflush(stdout);
        return 0;
    }
    /* An id the model has and the tokenizer does not (a padded vocabulary) has no text: dropped, as
     * tokenizers' decode drops it. */
    if (!k->streaming || (uint32_t)id >= k->tok_vocab) return 0;
    k->text.n = 0;
    if (fsdp_text_stream_push(&k->stream, (uint32_t)id, &k->text, err)) return -1;
    fwrite(k->text.p, 1, k->text.n, stdout);
    fflush(stdout);
    return 0;
}

/* "1 2 3" -> ids. */
static int parse_ids(const char *text, int32_t **out, int *n, fsdp_err *err) {
    size_t cap = strlen(text) / 2 + 1;
    *out = fsdp_xmalloc(cap * sizeof(int32_t), "the prompt ids");
    *n = 0;
    for (const char *p = text; *p;) {
        if (*p == ' ' || *p == '\t' || *p == ',' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ' ' && *end != '\t' && *end != ',' && *end != '\n'))
            return fsdp_usagef(err, "--prompt-ids: '%.*s' is not a token id", (int)strcspn(p, " \t,\n"), p);
        (*out)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len, fsdp_err *err) {
    struct stat st;
    /* Opened without blocking: a FIFO named here must be refused, not waited on. */
    FILE *f = fsdp_fopen_regular(path, "--prompt-file", err);
    if (!f) return NULL;
    if (fstat(fileno(f), &st) != 0) {
        fsdp_errf(err, "--prompt-file %s: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    char *buf = fsdp_xmalloc((size_t)st.st_size + 1, "the prompt");
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        fsdp_errf(err, "--prompt-file %s: cannot be read", path);
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[st.st_size] = 0;
    *len = (size_t)st.st_size;
    return buf;
}

typedef struct {
    const char *init_from, *checkpoint, *tokenizer, *prompt, *prompt_file, *prompt_ids;
    const char *device, *dtype, *do_sample;
    int max_new_tokens, top_k, no_special, print_ids, skip_prompt, quiet;
    double temperature, top_p;
    int64_t seed;
} flags;

/* The eos ids and the sampling defaults of the model (generation_config.json, else config.json's
 * eos list, else the config's one id); flags given on the command line win. */
static int model_defaults(const fsdp_model_source *src, const fsdp_arg_spec *spec, flags *f, int32_t *eos,
                          int *num_eos, fsdp_err *err) {
    fsdp_generation_config g;
    memset(&g, 0, sizeof g);
    *num_eos = 0;
    if (!src->is_checkpoint) {
        char path[4300];
        snprintf(path, sizeof path, "%s/generation_config.json", src->path);
        if (fsdp_generation_config_load(path, 0, &g, err) < 0) return -1;
        if (g.num_eos == 0) {
            fsdp_generation_config c;
            snprintf(path, sizeof path, "%s/config.json", src->path);
            if (fsdp_generation_config_load(path, 1, &c, err) < 0) return -1;
            memcpy(g.eos, c.eos, sizeof c.eos);
            g.num_eos = c.num_eos;
        }
    }
    if (g.num_eos) {
        memcpy(eos, g.eos, (size_t)g.num_eos * sizeof(int32_t));
        *num_eos = g.num_eos;
    } else if (src->cfg.eos_token_id >= 0) {
        eos[(*num_eos)++] = src->cfg.eos_token_id;
    }
    if (!fsdp_args_find(spec, "temperature")->seen && g.has_temperature) f->temperature = g.temperature;
    if (!fsdp_args_find(spec, "top-k")->seen && g.has_top_k) f->top_k = g.top_k;
    if (!fsdp_args_find(spec, "top-p")->seen && g.has_top_p) f->top_p = g.top_p;
    if (!fsdp_args_find(spec, "max-new-tokens")->seen && g.has_max_new_tokens) f->max_new_tokens = g.max_new_tokens;
    if (!strcmp(f->do_sample, "auto")) f->do_sample = g.has_do_sample && !g.do_sample ? "no" : "yes";
    if (f->top_p <= 0.0) /* only generation_config.json can get here: the flag is checked when parsed */
        return fsdp_errf(err, "%s/generation_config.json: top_p 0 leaves no token to sample (give --top-p)", src->path);
    return 0;
}

/* The prompt's ids: encoded text (with the tokenizer's special tokens unless --no-special), or
 * --prompt-ids as given. */
static int prompt_ids(const flags *f, const fsdp_tokenizer *tok, int32_t **ids, int *n, fsdp_err *err) {
    if (f->prompt_ids) return parse_ids(f->prompt_ids, ids, n, err);
    size_t len = 0;
    char *owned = NULL;
    const char *text = f->prompt;
    if (f->prompt_file) {
        if (!(owned = read_file(f->prompt_file, &len, err))) return -1;
        text = owned;
    } else {
        len = strlen(text);
    }
    fsdp_ids v = {0};
    fsdp_tokenizer_state *st = fsdp_tokenizer_state_new(tok);
    fsdp_err e = {0};
    int rc = fsdp_tokenizer_encode(tok, st, text, len, !f->no_special, &v, &e);
    fsdp_tokenizer_state_free(st);
    free(owned);
    if (rc) {
        fsdp_ids_free(&v);
        return fsdp_errf(err, "%s: %s", f->prompt_file ? f->prompt_file : "--prompt", e.msg);
    }
    *ids = fsdp_xmalloc((v.n ? v.n : 1) * sizeof(int32_t), "the prompt ids");
    for (size_t i = 0; i < v.n; i++) (*ids)[i] = (int32_t)v.p[i];
    *n = (int)v.n;
    fsdp_ids_free(&v);
    return 0;
}

static void print_prompt(const flags *f, const fsdp_tokenizer *tok, const int32_t *ids, int n) {
    if (f->prompt) {
        fputs(f->prompt, stdout);
    } else if (f->prompt_file) {
        size_t len;
        fsdp_err e = {0};
        char *text = read_file(f->prompt_file, &len, &e);
        if (text) fwrite(text, 1, len, stdout);
        free(text);
    } else {
        fsdp_buf b = {0};
        fsdp_tokenizer_state *st = fsdp_tokenizer_state_new(tok);
        fsdp_err e = {0};
        if (fsdp_tokenizer_decode(tok, st, (const uint32_t *)ids, (size_t)n, 1, &b, &e) == 0) fwrite(b.p, 1, b.n, stdout);
        fsdp_tokenizer_state_free(st);
        fsdp_buf_free(&b);
    }
    fflush(stdout);
}

/* --tokenizer, or the model directory's tokenizer.json; NULL when there is none. */
static const char *find_tokenizer(const flags *f, const fsdp_model_source *src, char *buf, size_t cap) {
    if (f->tokenizer) return f->tokenizer;
    if (src->is_checkpoint) return NULL;
    struct stat st;
    snprintf(buf, cap, "%s/tokenizer.json", src->path);
    return stat(buf, &st) == 0 ? buf : NULL;
}

static void describe_decoding(const flags *f, char *buf, size_t cap) {
    if (!strcmp(f->do_sample, "no") || f->temperature == 0.0) {
        snprintf(buf, cap, "greedy");
        return;
    }
    char k[32] = "off", p[32] = "off";
    if (f->top_k > 0) snprintf(k, sizeof k, "%d", f->top_k);
    if (f->top_p < 1.0) snprintf(p, sizeof p, "%g", f->top_p);
    snprintf(buf, cap, "sampling (temperature %g, top-k %s, top-p %s, seed %lld)", f->temperature, k, p,
             (long long)f->seed);
}

int fsdp_cmd_generate(int argc, char **argv) {
    fsdp_err err = {0};
    flags f = {.device = "auto", .dtype = "auto", .do_sample = "auto", .max_new_tokens = 64, .top_k = 50,
               .temperature = 1.0, .top_p = 1.0, .seed = 42};
    fsdp_arg args[] = {
        {"init-from", FSDP_ARG_STRING, &f.init_from, "DIR|FILE",
         "The model: a Hugging Face model directory (config.json + safetensors) or an fsdp.c checkpoint file.", 1, 0,
         NULL, 0},
        {"checkpoint", FSDP_ARG_STRING, &f.checkpoint, "FILE|DIR",
         "Instead of --init-from: an fsdp.c checkpoint, or a --ckpt-dir (its latest checkpoint).", 1, 0, NULL, 0},
        {"tokenizer", FSDP_ARG_STRING, &f.tokenizer, "FILE|DIR",
         "The tokenizer.json or its directory, with the tokenizer_config.json beside it if any (default: the "
         "--init-from directory's).", 1, 0, NULL, 0},
        {"prompt", FSDP_ARG_STRING, &f.prompt, "TEXT", "The text to continue.", 1, 0, NULL, 0},
        {"prompt-file", FSDP_ARG_STRING, &f.prompt_file, "FILE", "The text to continue, from a file (UTF-8).", 1, 0,
         NULL, 0},
        {"prompt-ids", FSDP_ARG_STRING, &f.prompt_ids, "\"ID ...\"",
         "The prompt as token ids, used as they are (no special tokens added).", 1, 0, NULL, 0},
        {"no-special", FSDP_ARG_BOOL, &f.no_special, NULL,
         "Encode the prompt without the tokenizer's special tokens (add_special_tokens=False; by default Llama's and "
         "OPT's BOS is added, as transformers' tokenizer does).", 1, 0, NULL, 0},
        {"max-new-tokens", FSDP_ARG_INT, &f.max_new_tokens, "N", "Most tokens to generate.", 0, 1e9, NULL, 0},
        {"do-sample", FSDP_ARG_CHOICE, &f.do_sample, "auto|yes|no",
         "Sample (yes) or take the most likely token (no, greedy); auto: generation_config.json's do_sample, else "
         "yes.", 1, 0, SAMPLE, 0},
        {"temperature", FSDP_ARG_FLOAT, &f.temperature, "T", "Divides the logits before sampling; 0 means greedy.", 0,
         1e30, NULL, 0},
        {"top-k", FSDP_ARG_INT, &f.top_k, "K", "Sample among the K most likely tokens only (0: all).", 0, 2e9, NULL, 0},
        {"top-p", FSDP_ARG_FLOAT, &f.top_p, "P",
         "Sample among the most likely tokens whose probabilities sum to P (nucleus sampling; 1: all).", 0, 1, NULL, 0},
        {"seed", FSDP_ARG_INT64, &f.seed, "N", "Seed of the draws.", 0, 9e18, NULL, 0},
        {"device", FSDP_ARG_CHOICE, &f.device, "D", "auto (a GPU when there is one), cpu or cuda.", 1, 0, DEVICES, 0},
        {"dtype", FSDP_ARG_CHOICE, &f.dtype, "D",
         "Dtype of the weights, activations and KV cache: auto (bf16 on a GPU, fp32 on the CPU), fp32 or bf16.", 1, 0,
         DTYPES, 0},
        {"print-ids", FSDP_ARG_BOOL, &f.print_ids, NULL, "Write the new token ids (one line) instead of the text.", 1,
         0, NULL, 0},
        {"skip-prompt", FSDP_ARG_BOOL, &f.skip_prompt, NULL, "Write only the new text, not the prompt before it.", 1, 0,
         NULL, 0},
        {"quiet", FSDP_ARG_BOOL, &f.quiet, NULL, "Nothing on standard error but errors.", 1, 0, NULL, 0},
    };
    fsdp_arg_spec spec = {"generate", "Continue a prompt with a model, streaming the text (KV cache, CPU or one GPU).",
                          "fsdp generate (--init-from DIR|FILE | --checkpoint FILE|DIR) (--prompt TEXT | --prompt-file "
                          "FILE | --prompt-ids IDS) [FLAGS]",
                          EPILOGUE, args, (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);
    int world = 1;
    FSDP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
    if (world > 1)
        fsdp_usagef(&err, "generate runs as one process (it was started on %d ranks): run it without mpirun", world);
    else if (!f.init_from == !f.checkpoint)
        fsdp_usagef(&err, "generate: give exactly one of --init-from DIR|FILE and --checkpoint FILE|DIR");
    else if ((f.prompt != NULL) + (f.prompt_file != NULL) + (f.prompt_ids != NULL) != 1)
        fsdp_usagef(&err, "generate: give exactly one of --prompt TEXT, --prompt-file FILE and --prompt-ids IDS");
    else if (fsdp_args_find(&spec, "top-p")->seen && f.top_p <= 0.0)
        fsdp_usagef(&err, "--top-p must be in (0, 1]");
    if (err.failed) fsdp_exit_error(&err, 0);
    /* What generate writes, standard output, is none of what it reads (`>> config.json` would
     * append text to the model it loads): base/output_paths.h. */
    char tok_json[4300] = "", tok_config[4300] = "";
    if (f.tokenizer && fsdp_tokenizer_files(f.tokenizer, tok_json, sizeof tok_json, tok_config, sizeof tok_config, &err))
        fsdp_exit_error(&err, 0);
    fsdp_io_path writes[] = {FSDP_IO_STREAM("standard output", STDOUT_FILENO)};
    fsdp_io_path reads[] = {FSDP_IO_DIR("--init-from", f.init_from, fsdp_model_dir_reads),
                            FSDP_IO_DIR("--checkpoint", f.checkpoint, NULL), FSDP_IO_FILE("--tokenizer", f.tokenizer),
                            FSDP_IO_FILE("--prompt-file", f.prompt_file),
                            FSDP_IO_FILE("--tokenizer's tokenizer_config.json", tok_config[0] ? tok_config : NULL)};
    if (fsdp_outputs_apart(writes, 1, reads, (int)(sizeof reads / sizeof reads[0]), &err)) fsdp_exit_error(&err, 0);

    fsdp_model_source src;
    if (fsdp_model_source_resolve(f.init_from, f.checkpoint, &src, &err)) fsdp_exit_error(&err, 0);
    int32_t eos[FSDP_MAX_EOS];
    int num_eos = 0;
    if (model_defaults(&src, &spec, &f, eos, &num_eos, &err)) fsdp_exit_error(&err, 0);

    /* The tokenizer: needed for text in or out. */
    char tok_buf[4400];
    const char *tok_path = find_tokenizer(&f, &src, tok_buf, sizeof tok_buf);
    if ((!f.prompt_ids || !f.print_ids) && !tok_path) {
        fsdp_usagef(&err, "generate: %s needs a tokenizer: give --tokenizer FILE (the model has no tokenizer.json "
                    "beside it)", f.prompt_ids ? "writing text" : "a text prompt");
        fsdp_exit_error(&err, 0);
    }
    fsdp_tokenizer *tok = NULL;
    if (tok_path) {
        if (!(tok = fsdp_tokenizer_load(tok_path, &err))) fsdp_exit_error(&err, 0);
        if (fsdp_tokenizer_vocab_size(tok) > (uint32_t)src.cfg.vocab_size) {
            fsdp_errf(&err, "--tokenizer %s has ids up to %u, beyond the model's vocabulary of %d", tok_path,
                      fsdp_tokenizer_vocab_size(tok) - 1, src.cfg.vocab_size);
            fsdp_exit_error(&err, 0);
        }
    }
    int32_t *prompt = NULL;
    int prompt_len = 0;
    if (prompt_ids(&f, tok, &prompt, &prompt_len, &err)) fsdp_exit_error(&err, 0);
    for (int i = 0; i < prompt_len && !err.failed; i++)
        if (prompt[i] >= src.cfg.vocab_size)
            fsdp_usagef(&err, "--prompt-ids: %d is outside the model's vocabulary of %d", (int)prompt[i],
                        src.cfg.vocab_size);
    if (!err.failed && prompt_len == 0)
        fsdp_usagef(&err, "generate: the prompt has no tokens (give text, or keep the tokenizer's special tokens)");
    if (err.failed) fsdp_exit_error(&err, 0);
    /* Learned positions end at max_position_embeddings: refused before anything is loaded. */
    int positions = src.cfg.max_position_embeddings;
    if (src.cfg.family->pos == FSDP_POS_LEARNED && prompt_len > positions)
        fsdp_usagef(&err, "generate: the prompt has %d tokens, more than the %d positions of the model (%s has learned "
                    "positions)", prompt_len, positions, src.cfg.family->model_type);
    else if (src.cfg.family->pos == FSDP_POS_LEARNED && f.max_new_tokens > 0 && prompt_len + f.max_new_tokens - 1 > positions)
        fsdp_usagef(&err, "generate: the prompt's %d tokens and --max-new-tokens %d need %d positions, more than the "
                    "model's max_position_embeddings %d (%s has learned positions)", prompt_len, f.max_new_tokens,
                    prompt_len + f.max_new_tokens - 1, positions, src.cfg.family->model_type);
    if (err.failed) fsdp_exit_error(&err, 0);

    /* The device and the dtype. */
    const char *kind = f.device;
    if (!strcmp(kind, "auto")) kind = fsdp_backend_cuda_available() ? "cuda" : "cpu";
    fsdp_dtype act = !strcmp(f.dtype, "bf16") || (!strcmp(f.dtype, "auto") && !strcmp(kind, "cuda")) ? FSDP_BF16 : FSDP_F32;
    fsdp_backend_options bo = {.kind = kind, .act_dtype = act, .grad_dtype = act, .local_size = 1};
    fsdp_backend *be = fsdp_backend_create(&bo, &err);
    if (!be) fsdp_exit_error(&err, 0);
    fsdp_resident_model model;
    if (fsdp_resident_load(be, &src, &model, f.quiet ? NULL : stderr, &err)) fsdp_exit_error(&err, 0);

    fsdp_generate_options o;
    memset(&o, 0, sizeof o);
    o.max_new_tokens = f.max_new_tokens;
    o.eos = eos, o.num_eos = num_eos;
    o.sampling.do_sample = strcmp(f.do_sample, "no") && f.temperature > 0.0;
    o.sampling.temperature = f.temperature;
    o.sampling.top_k = f.top_k;
    o.sampling.top_p = f.top_p;
    o.sampling.seed = (uint64_t)f.seed;
    if (!f.quiet) {
        char what[256], dec[160];
        fsdp_model_config_describe(&src.cfg, what, sizeof what);
        describe_decoding(&f, dec, sizeof dec);
        fprintf(stderr, "fsdp generate: %s (%s) on %s in %s: %.2f GB of weights read in %.2f s; prompt %d tokens; %s\n",
                src.path, what, be->device_name, fsdp_dtype_name(act), model.bytes_read / 1e9, model.seconds,
                prompt_len, dec);
        fflush(stderr);
    }

    sink k;
    memset(&k, 0, sizeof k);
    k.print_ids = f.print_ids;
    k.streaming = !f.print_ids && tok;
    if (k.streaming) {
        k.tok_vocab = fsdp_tokenizer_vocab_size(tok);
        fsdp_text_stream_init(&k.stream, tok, (const uint32_t *)prompt, (size_t)prompt_len, 1);
        if (!f.skip_prompt) print_prompt(&f, tok, prompt, prompt_len);
    }
    o.on_token = on_token, o.arg = &k;
    fsdp_generate_stats st;
    rc = fsdp_generate(be, &src.cfg, &model.layout, (const void *const *)model.units, prompt, prompt_len, &o, &st, &err);
    if (rc == 0 && k.streaming) {
        k.text.n = 0;
        rc = fsdp_text_stream_finish(&k.stream, &k.text, &err);
        fwrite(k.text.p, 1, k.text.n, stdout);
    }
    putchar('\n');
    fflush(stdout);
    if (rc) fsdp_exit_error(&err, 0);
    if (!f.quiet) {
        int later = st.new_tokens - 1;
        fprintf(stderr, "fsdp generate: prompt %d tokens in %.3f s (%.1f tokens/s, with the first new token); %d new "
                        "tokens%s; decode %d tokens in %.3f s (%.1f tokens/s); KV cache and activations %.1f MiB; "
                        "smallest top-1/top-2 logit margin %.4g\n",
                st.prompt_tokens, st.prefill_seconds, st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0,
                st.new_tokens, st.stopped_at_eos ? " (stopped at end-of-sequence)" : "", later > 0 ? later : 0,
                st.decode_seconds, later > 0 && st.decode_seconds > 0 ? later / st.decode_seconds : 0.0,
                st.cache_bytes / 1048576.0, st.new_tokens ? st.min_margin : 0.0);
    }
    if (k.streaming) fsdp_text_stream_free(&k.stream);
    fsdp_buf_free(&k.text);
    free(prompt);
    fsdp_tokenizer_free(tok);
    fsdp_resident_free(be, &model);
    be->runtime->destroy(be);
    return 0;
}
