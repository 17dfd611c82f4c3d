/* `fsdp export`: flags -> fsdp_export_options -> a Hugging Face model directory. */
#include <ctype.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../train/hf_export.h"
#include "commands.h"

static const char *const DTYPES[] = {"bf16", "fp32", NULL};

static const char EPILOGUE[] =
    "Writes what transformers' AutoModelForCausalLM.from_pretrained(DIR) loads: config.json, generation_config.json\n"
    "and the weights under Hugging Face names, as model.safetensors or, beyond --max-shard-size, as\n"
    "model-00001-of-0000N.safetensors files with model.safetensors.index.json; and what AutoTokenizer loads:\n"
    "tokenizer.json, tokenizer_config.json, special_tokens_map.json (see --tokenizer). Launched with mpirun, every rank\n"
    "reads and writes its own part of every tensor, into a directory beside DIR that replaces DIR in one rename\n"
    "once complete (a reader sees the old model or the new one); one export at a time holds DIR's lock.\n"
    "  mpirun -np 4 fsdp export --checkpoint ckpt --out llama-finetuned\n"
    "  fsdp export --checkpoint ckpt/step-00000450.h5 --out opt-fp32 --dtype fp32\n"
    "  fsdp export --model llama-2-7b --out random-7b        # fsdp.c's initial weights for --seed\n"
    "The safetensors rules fsdp.c follows: docs/FORMATS.md.\n";

/* "5GB" = 5e9 bytes, "500MB", "2GiB" = 2 * 2^30, "1000" bytes: transformers' max_shard_size spelling
 * (units case-insensitive). */
static int parse_size(const char *text, uint64_t *out) {
    static const struct {
        const char *unit;
        uint64_t scale;
    } UNITS[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1000ull},
                 {"MB", 1000000ull},
                 {"GB", 1000000000ull},
                 {"TB", 1000000000000ull},
                 {"KIB", 1ull << 10},
                 {"MIB", 1ull << 20},
                 {"GIB", 1ull << 30},
                 {"TIB", 1ull << 40}};
    const char *p = text;
    uint64_t n = 0;
    if (!isdigit((unsigned char)*p)) return -1;
    for (; isdigit((unsigned char)*p); p++) {
        if (n > (UINT64_MAX - 9) / 10) return -1;
        n = n * 10 + (uint64_t)(*p - '0');
    }
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcasecmp(p, UNITS[i].unit)) continue;
        if (n > UINT64_MAX / UNITS[i].scale) return -1;
        *out = n * UNITS[i].scale;
        return 0;
    }
    return -1;
}

int fsdp_cmd_export(int argc, char **argv) {
    fsdp_err err = {0};
    const char *checkpoint = NULL, *model = NULL, *out = NULL, *dtype = "bf16", *max_shard = "5GB", *tokenizer = NULL;
    int64_t seed = 42;
    int force = 0;
    fsdp_arg args[] = {
        {"checkpoint", FSDP_ARG_STRING, &checkpoint, "FILE|DIR",
         "What to export: an fsdp.c checkpoint, a --ckpt-dir (its latest checkpoint), or a Hugging Face model "
         "directory (re-exported in another dtype or shard size).", 1, 0, NULL, 0},
        {"model", FSDP_ARG_STRING, &model, "NAME|PATH",
         "Instead of --checkpoint: the initial weights fsdp.c gives this preset or config.json for --seed (the model "
         "`fsdp train --model` starts from).", 1, 0, NULL, 0},
        {"seed", FSDP_ARG_INT64, &seed, "N", "Seed of the initial weights (with --model).", 0, 9e18, NULL, 0},
        {"out", FSDP_ARG_STRING, &out, "DIR", "The model directory to write (created if missing).", 1, 0, NULL, 0},
        {"dtype", FSDP_ARG_CHOICE, &dtype, "D", "Dtype of the weights: bf16 (rounded to nearest even) or fp32.", 1, 0,
         DTYPES, 0},
        {"max-shard-size", FSDP_ARG_STRING, &max_shard, "SIZE",
         "Largest weight file before the weights are split into several, as save_pretrained's max_shard_size: 5GB = "
         "5e9 bytes, 500MB, 2GiB, or bytes; 0 = always one file.", 1, 0, NULL, 0},
        {"tokenizer", FSDP_ARG_STRING, &tokenizer, "FILE|DIR",
         "The tokenizer.json (or its directory) to export with the model, with the tokenizer_config.json and "
         "special_tokens_map.json beside it (written when missing). Default: a Hugging Face source's own, or the "
         "one the checkpoint's data was prepared with while it is unchanged.", 1, 0, NULL, 0},
        {"force", FSDP_ARG_BOOL, &force, NULL,
         "Replace a model already in --out (all of it, in one switch; files that are not the model are kept).", 1, 0,
         NULL, 0},
    };
    fsdp_arg_spec spec = {"export", "Export a model as a Hugging Face model directory (safetensors) for transformers.",
                          "fsdp export (--checkpoint FILE|DIR | --model NAME|PATH) --out DIR [FLAGS]", EPILOGUE, args,
                          (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);
    fsdp_export_options o;
    memset(&o, 0, sizeof o);
    if (!out)
        fsdp_usagef(&err, "export: --out DIR is required");
    else if (!checkpoint == !model)
        fsdp_usagef(&err, "export: give exactly one of --checkpoint FILE|DIR and --model NAME|PATH");
    else if (parse_size(max_shard, &o.max_shard_bytes))
        fsdp_usagef(&err, "export: --max-shard-size '%s' is not a size (5GB, 500MB, 2GiB, bytes)", max_shard);
    else if (fsdp_args_find(&spec, "seed")->seen && !model)
        fsdp_usagef(&err, "export: --seed goes with --model (a checkpoint's weights have no seed to choose)");
    if (err.failed) fsdp_exit_error(&err, 0);
    o.checkpoint = checkpoint;
    o.model = model;
    o.seed = (uint64_t)seed;
    o.out = out;
    o.bf16 = !strcmp(dtype, "bf16");
    o.force = force;
    o.tokenizer = tokenizer;
    if (fsdp_export(MPI_COMM_WORLD, &o, &err)) fsdp_exit_error(&err, 0);
    return 0;
}
