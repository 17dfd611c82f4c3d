/* `fsdp prepare`: text, JSON Lines, Parquet or Alpaca records -> token files (version 2) for fsdp train. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../text/prepare.h"
#include "commands.h"

static const char *const FORMATS[] = {"text", "jsonl", "parquet", "alpaca", NULL};
static const char *const SPLITS[] = {"file", "blank-lines", NULL};

static const char EPILOGUE[] =
    "Formats: text = each file one document (--split-on file) or documents separated by blank lines\n"
    "(--split-on blank-lines, as WikiText); jsonl = one document per line, the string field --field;\n"
    "parquet = one document per row, the string column --field (nulls and empty texts skipped; Snappy, gzip,\n"
    "Zstd or no compression); alpaca = a JSON array, JSON Lines or a Parquet file of {instruction, input,\n"
    "output}: the Stanford Alpaca prompt (BOS per the tokenizer's post-processor), the response and EOS,\n"
    "with a loss mask over the response and EOS only.\n"
    "The validation file is OUT with .val before its extension (data.bin -> data.val.bin). Output: token\n"
    "file version 2 (docs/FORMATS.md), written under a temporary name and renamed when complete.\n"
    "  fsdp prepare --tokenizer tokenizer.json --input wiki.train.raw --format text --split-on blank-lines \\\n"
    "      --out wiki.bin --val-fraction 0.01\n"
    "  fsdp prepare --tokenizer tokenizer.json --input alpaca_data.json --format alpaca --out alpaca.bin\n"
    "  fsdp prepare --tokenizer tokenizer.json --input wikitext-103-raw-v1/train-*.parquet --format parquet \\\n"
    "      --field text --out wiki.bin\n";

/* Takes every path after --input (and of repeated --input flags) out of argv: returns the paths
 * (NULL-terminated, *num of them) and in *args a new argument vector with one "--input FIRST" left
 * for the flag table's help and checks. */
static const char **collect_inputs(int *argc, char **argv, char ***args, int *num) {
    const char **paths = fsdp_xcalloc((size_t)*argc + 1, sizeof *paths, "input paths");
    char **rest = fsdp_xcalloc((size_t)*argc + 3, sizeof *rest, "arguments");
    int n = 0, out = 0;
    for (int i = 0; i < *argc; i++) {
        if (!strncmp(argv[i], "--input=", 8)) {
            paths[n++] = argv[i] + 8;
        } else if (!strcmp(argv[i], "--input")) {
            while (i + 1 < *argc && strncmp(argv[i + 1], "--", 2)) paths[n++] = argv[++i];
        } else {
            rest[out++] = argv[i];
        }
    }
    if (n > 0) {
        rest[out++] = "--input";
        rest[out++] = (char *)paths[0];
    }
    *argc = out;
    *args = rest;
    *num = n;
    return paths;
}

int fsdp_cmd_prepare(int argc, char **argv) {
    fsdp_err err = {0};
    int num_inputs = 0;
    char **args_left;
    const char **inputs = collect_inputs(&argc, argv, &args_left, &num_inputs);
    argv = args_left;
    const char *tokenizer = NULL, *first_input = NULL, *format = "text", *out = NULL, *split = "file";
    const char *field = "text", *eos = NULL;
    double val_fraction = 0;
    int64_t seed = 42;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), max_memory = 1024, no_special = 0, quiet = 0;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    fsdp_arg args[] = {
        {"tokenizer", FSDP_ARG_STRING, &tokenizer, "FILE|DIR",
         "A Hugging Face tokenizer.json (model type BPE) or its directory; a tokenizer_config.json beside it is "
         "applied as transformers does. Required.",
         1, 0, NULL, 0},
        {"input", FSDP_ARG_STRING, &first_input, "PATH...", "Input files, read in order (one or more). Required.", 1, 0,
         NULL, 0},
        {"format", FSDP_ARG_CHOICE, &format, "F", "The input format (see below).", 1, 0, FORMATS, 0},
        {"out", FSDP_ARG_STRING, &out, "FILE", "The training token file. Required.", 1, 0, NULL, 0},
        {"split-on", FSDP_ARG_CHOICE, &split, "S",
         "text: a document per file, or per run of lines between blank lines.", 1, 0, SPLITS, 0},
        {"field", FSDP_ARG_STRING, &field, "NAME", "jsonl, parquet: the string field (column) holding each document.", 1, 0, NULL, 0},
        {"val-fraction", FSDP_ARG_FLOAT, &val_fraction, "X",
         "Share of documents (drawn from --seed per document) written to the validation file.", 0, 1, NULL, 0},
        {"seed", FSDP_ARG_INT64, &seed, "N", "Seed of the train/validation split.", 0, 9e18, NULL, 0},
        {"threads", FSDP_ARG_INT, &threads, "N", "Tokenizing threads (the output is the same for any number).", 1,
         1024, NULL, 0},
        {"max-memory", FSDP_ARG_INT, &max_memory, "MB",
         "Bound on the memory the documents in flight take, beyond the tokenizer itself; one document must fit "
         "in a 64th of it.", 12, 1 << 20, NULL, 0},
        {"no-special", FSDP_ARG_BOOL, &no_special, NULL,
         "Do not add the post-processor's special tokens (BOS) to documents and prompts.", 1, 0, NULL, 0},
        {"eos-token", FSDP_ARG_STRING, &eos, "TOKEN",
         "alpaca: the token ending each response (default: tokenizer_config.json's eos_token, else the first of "
         "</s>, <|end_of_text|>, <|endoftext|> the tokenizer has).", 1, 0, NULL, 0},
        {"quiet", FSDP_ARG_BOOL, &quiet, NULL, "No progress line on stderr.", 1, 0, NULL, 0},
    };
    fsdp_arg_spec spec = {"prepare", "Tokenize text, JSON Lines, Parquet or Alpaca data into token files for fsdp train.",
                          "fsdp prepare --tokenizer FILE --input PATH... --format text|jsonl|parquet|alpaca --out FILE",
                          EPILOGUE, args, (int)(sizeof args / sizeof args[0])};
    /* Chat data is rendered by the model's chat_template, a Jinja program fsdp.c does not run: said
     * so instead of "not one of the formats", and never approximated. */
    for (int i = 0; i < argc; i++)
        if ((!strcmp(argv[i], "--format") && i + 1 < argc && !strcmp(argv[i + 1], "chat")) ||
            !strcmp(argv[i], "--format=chat")) {
            fsdp_usagef(&err, "prepare: --format chat is not supported: chat templates (tokenizer_config.json's "
                        "chat_template) are Jinja programs fsdp.c does not run; render the conversations to text with "
                        "transformers' apply_chat_template and prepare them with --format jsonl");
            fsdp_exit_error(&err, 0);
        }
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);
    if (!tokenizer || !num_inputs || !out) {
        fsdp_usagef(&err, "prepare: --tokenizer, --input and --out are required (see fsdp prepare --help)");
        fsdp_exit_error(&err, 0);
    }
    if (val_fraction >= 1) {
        fsdp_usagef(&err, "prepare: --val-fraction %g leaves no training documents (give 0 <= X < 1)", val_fraction);
        fsdp_exit_error(&err, 0);
    }
    fsdp_prepare_options o = {0};
    o.tokenizer = tokenizer;
    o.inputs = inputs, o.num_inputs = num_inputs;
    o.format = !strcmp(format, "jsonl")    ? FSDP_DOCS_JSONL
               : !strcmp(format, "parquet") ? FSDP_DOCS_PARQUET
               : !strcmp(format, "alpaca") ? FSDP_DOCS_ALPACA
               : !strcmp(split, "file")    ? FSDP_DOCS_TEXT_FILE
                                           : FSDP_DOCS_TEXT_BLANK_LINES;
    o.field = field;
    o.out = out;
    o.val_fraction = val_fraction;
    o.seed = (uint64_t)seed;
    o.threads = threads;
    o.max_memory = (size_t)max_memory << 20;
    o.add_special_tokens = !no_special;
    o.eos_token = eos;
    o.progress = !quiet;
    fsdp_prepare_stats st;
    if (fsdp_prepare(&o, &st, &err)) fsdp_exit_error(&err, 0);
    char val_path[4200];
    fsdp_prepare_val_path(out, val_path, sizeof val_path);
    printf("prepared %.1f MB in %.1f s (%.2f MB/s, %d threads); vocabulary %u, tokenizer hash %016llx\n",
           (double)st.bytes / 1e6, st.seconds, (double)st.bytes / 1e6 / (st.seconds > 0 ? st.seconds : 1), threads,
           st.vocab_size, (unsigned long long)st.tokenizer_hash);
    for (int v = 0; v < (val_fraction > 0 ? 2 : 1); v++)
        printf("%s: %llu documents, %llu tokens (%llu counted in the loss)\n", v ? val_path : out,
               (unsigned long long)st.documents[v], (unsigned long long)st.tokens[v],
               (unsigned long long)st.counted[v]);
    if (st.nulls)
        printf("skipped %llu records whose text was null%s\n", (unsigned long long)st.nulls,
               o.format == FSDP_DOCS_ALPACA ? " (instruction or output)" : "");
    if (st.longer)
        printf("%llu documents are longer than the tokenizer's model_max_length of %llu tokens (kept whole, as "
               "transformers keeps them with a warning; --seq decides what a sample holds)\n",
               (unsigned long long)st.longer, (unsigned long long)st.model_max_length);
    free(inputs);
    free(args_left);
    return 0;
}
