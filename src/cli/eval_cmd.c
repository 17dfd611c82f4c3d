/* `fsdp eval`: flags -> a forward-only run over a token file (src/train/eval.h). */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../io/checkpoint.h"
#include "../train/eval.h"
#include "../train/run_outputs.h"
#include "commands.h"

static const char *const PRECISIONS[] = {"fp32", "bf16", NULL};
static const char *const MIXED[] = {"auto", "no", "bf16", NULL};
static const char *const ATTN[] = {"eager", "flash", NULL};
static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};
static const char *const PACKINGS[] = {"auto", "stream", "pad", NULL};

static const char EPILOGUE[] =
    "Prints the mean cross-entropy over every counted token of the file and its perplexity, exp(loss): every\n"
    "window (--packing stream) or example (pad) once, split across the ranks, forward only (no gradients, no\n"
    "optimizer states in memory). The same numbers as fsdp train --eval-data at the same weights.\n"
    "  fsdp eval --init-from ~/models/Llama-3.2-1B --data wiki.val.bin --seq 1024\n"
    "  mpirun -np 4 fsdp eval --checkpoint ckpt --data alpaca.val.bin --seq 512 --metrics run.jsonl\n"
    "Token files: fsdp prepare; how documents become samples: docs/DESIGN.md.\n";

/* --checkpoint FILE|DIR: a checkpoint file, or a --ckpt-dir's latest. */
static int resolve_checkpoint(const char *given, char *out, int cap, fsdp_err *err) {
    struct stat st;
    if (stat(given, &st) != 0) return fsdp_usagef(err, "eval: --checkpoint %s: no such file or directory", given);
    if (!S_ISDIR(st.st_mode)) {
        snprintf(out, (size_t)cap, "%s", given);
        return 0;
    }
    int found = fsdp_ckpt_find_latest(given, out, cap, err);
    if (found < 0) return -1;
    if (found == 0)
        return fsdp_usagef(err, "eval: --checkpoint %s: a directory without a 'latest' checkpoint (a Hugging Face model "
                           "directory goes with --init-from)", given);
    return 0;
}

int fsdp_cmd_eval(int argc, char **argv) {
    fsdp_err err = {0};
    const char *init_from = NULL, *checkpoint = NULL, *data = NULL, *metrics = NULL, *mbs_text = "4";
    const char *strategy = "FULL", *device = "auto", *model_precision = "fp32", *mixed_precision = "auto";
    const char *attn = "flash", *packing = "auto";
    int seq = 1024, ranks_per_node = 0, prefetch = 1, max_live = 2, head_chunk = 0, allow_longer_seq = 0;
    fsdp_arg args[] = {
        {"init-from", FSDP_ARG_STRING, &init_from, "DIR|FILE",
         "The model: a Hugging Face model directory (config.json and safetensors; its tokenizer.json, if any, must "
         "be the one the token file was made with) or an fsdp.c checkpoint file.", 1, 0, NULL, 0},
        {"checkpoint", FSDP_ARG_STRING, &checkpoint, "FILE|DIR",
         "Instead of --init-from: an fsdp.c checkpoint, or a --ckpt-dir (its latest checkpoint).", 1, 0, NULL, 0},
        {"data", FSDP_ARG_STRING, &data, "FILE", "The token file to evaluate (fsdp prepare's validation split).", 1, 0,
         NULL, 0},
        {"seq", FSDP_ARG_INT, &seq, "N", "Sequence length: windows of N + 1 tokens, or examples truncated to them.", 1,
         1 << 20, NULL, 0},
        {"allow-longer-seq", FSDP_ARG_BOOL, &allow_longer_seq, NULL,
         "Accept a --seq beyond the model's max_position_embeddings (rotary positions only), as fsdp train does.", 1,
         0, NULL, 0},
        {"mbs", FSDP_ARG_STRING, &mbs_text, "N", "Samples per rank in each forward pass.", 1, 0, NULL, 0},
        {"packing", FSDP_ARG_CHOICE, &packing, "P",
         "How documents become samples: stream (joined with EOS, cut into windows), pad (one example per sample, "
         "only unmasked tokens count), auto (pad for a file with a loss mask, else stream).", 1, 0, PACKINGS, 0},
        {"metrics", FSDP_ARG_STRING, &metrics, "FILE",
         "Append the result as {\"step\", \"eval_loss\", \"eval_ppl\", \"eval_tokens\"} (JSON Lines; step: the "
         "checkpoint's, 0 for a Hugging Face model).", 1, 0, NULL, 0},
        {"strategy", FSDP_ARG_STRING, &strategy, "S",
         "Sharding of the weights over the ranks: FULL, SHARD_GRAD_OP, NO_SHARD or HYBRID (as fsdp train).", 1, 0,
         NULL, 0},
        {"ranks-per-node", FSDP_ARG_INT, &ranks_per_node, "N", "Ranks per node for HYBRID (0 = the real nodes).", 0,
         1 << 20, NULL, 0},
        {"model-precision", FSDP_ARG_CHOICE, &model_precision, "P", "Precision the weights are held in.", 1, 0,
         PRECISIONS, 0},
        {"mixed-precision", FSDP_ARG_CHOICE, &mixed_precision, "P", "Compute precision (bf16 = mixed precision; auto = bf16 on GPUs, no on the CPU backend).",
         1, 0, MIXED, 0},
        {"attn", FSDP_ARG_CHOICE, &attn, "A", "Attention kernel: eager, flash, flash-atomic or cudnn (as fsdp train).", 1, 0, ATTN, 0},
        {"device", FSDP_ARG_CHOICE, &device, "D", "Backend: auto uses the GPUs when there are any.", 1, 0, DEVICES,
         0},
        {"prefetch", FSDP_ARG_INT, &prefetch, "N", "Units whose all-gather starts ahead of their use.", 0, 64, NULL,
         0},
        {"max-live-units", FSDP_ARG_INT, &max_live, "N", "Most gathered units alive at once.", 1, 1024, NULL, 0},
        {"head-chunk-tokens", FSDP_ARG_INT, &head_chunk, "N",
         "Tokens per chunk of the LM head + cross-entropy (0 = about 512 MiB of logits).", 0, 1 << 30, NULL, 0},
    };
    fsdp_arg_spec spec = {"eval", "Validation loss and perplexity of a model over a token file.",
                          "fsdp eval (--init-from DIR|FILE | --checkpoint FILE|DIR) --data FILE [FLAGS]", EPILOGUE, args,
                          (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);

    fsdp_train_options o;
    memset(&o, 0, sizeof o);
    char resolved[4096];
    int mbs_auto = 0;
    if (!init_from == !checkpoint)
        fsdp_usagef(&err, "eval: give exactly one of --init-from DIR|FILE and --checkpoint FILE|DIR");
    else if (!data)
        fsdp_usagef(&err, "eval: --data FILE is required (the token file to evaluate)");
    else if (fsdp_cli_parse_mbs("eval", mbs_text, &o.mbs, &mbs_auto, &err) == 0 && mbs_auto)
        fsdp_usagef(&err, "eval: --mbs expects a number (auto is for training)");
    else if (fsdp_strategy_parse(strategy, &o.strategy))
        fsdp_usagef(&err, "eval: --strategy '%s' is not one of: FULL, SHARD_GRAD_OP, NO_SHARD, HYBRID", strategy);
    else if (checkpoint)
        resolve_checkpoint(checkpoint, resolved, (int)sizeof resolved, &err);
    if (err.failed) fsdp_exit_error(&err, 0);
    o.init_from = checkpoint ? resolved : init_from;
    o.data = data;
    o.seq = seq;
    o.seq_given = fsdp_args_find(&spec, "seq")->seen; /* else --seq may shrink to the model's length */
    o.allow_longer_seq = allow_longer_seq;
    o.grad_accum = 1;
    o.steps = 0;
    o.packing = !strcmp(packing, "stream") ? FSDP_PACK_STREAM : !strcmp(packing, "pad") ? FSDP_PACK_PAD : FSDP_PACK_AUTO;
    o.metrics = metrics;
    o.ranks_per_node = ranks_per_node;
    o.prefetch = prefetch;
    o.max_live = max_live;
    o.head_chunk = head_chunk;
    o.device = device;
    o.master_dtype = strcmp(model_precision, "bf16") ? FSDP_F32 : FSDP_BF16;
    o.compute_dtype = (o.master_dtype == FSDP_BF16 || fsdp_cli_mixed_bf16(mixed_precision, device)) ? FSDP_BF16 : FSDP_F32;
    o.reduce_dtype = o.master_dtype;
    o.gather_dtype = o.compute_dtype; /* the exact weights: what a score means */
    o.attn = fsdp_attn_of(attn);
    o.embed_grads = FSDP_EMBED_GRADS_DENSE;
    o.synthetic_vocab = 1;
    o.log_every = 1;
    o.forward_only = 1;
    if (fsdp_run_outputs_apart(MPI_COMM_WORLD, &o, &err) || fsdp_eval_run(&o, &err)) fsdp_exit_error(&err, 0);
    return 0;
}
