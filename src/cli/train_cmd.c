/* `fsdp train`: flags -> fsdp_train_options -> the training loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/args.h"
#include "../base/error.h"
#include "../io/jsonio.h"
#include "../train/reshard.h"
#include "../train/trace_run.h"
#include "../train/trainer.h"
#include "commands.h"
#include "plan_links.h"

static const char *const ATTN[] = FSDP_ATTN_NAMES;
static const char *const EMBED_GRADS[] = {"auto", "dense", "rows", NULL};
static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL};
static const char *const GATHER_ENGINES[] = {"sm", "copy", NULL};
static const char *const PACKINGS[] = {"auto", "stream", "pad", NULL};
static const char *const RECOMPUTE[] = {"none", "selective", "full", NULL};
static const char *const FP8[] = {"none", "tensorwise", "rowwise", NULL};

int fsdp_cli_parse_mbs(const char *command, const char *text, int *mbs, int *is_auto, fsdp_err *err) {
    *is_auto = !strcmp(text, "auto");
    if (*is_auto) return 0;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < 1 || v > (1 << 20))
        return fsdp_usagef(err, "%s: --mbs expects a micro-batch size in [1, %d] or auto, got '%s'", command, 1 << 20,
                           text);
    *mbs = (int)v;
    return 0;
}

int fsdp_cli_parse_dropout(const char *command, const char *text, int *set, double *rate, fsdp_err *err) {
    *set = text != NULL;
    if (!text) return 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (!*text || *end || !(v >= 0.0 && v < 1.0))
        return fsdp_usagef(err, "%s: --dropout expects a rate in [0, 1), got '%s'", command, text);
    *rate = v;
    return 0;
}

static const char EPILOGUE[] =
    "Launch with mpirun or srun: every rank is one data-parallel worker (one GPU on a GPU host).\n"
    "  mpirun -np 2 fsdp train --model tiny-llama --steps 20 --ckpt-dir ckpt\n"
    "  srun fsdp train --model llama-3.2-1b --mbs 16 --strategy FULL --metrics run.jsonl\n"
    "  mpirun -np 4 fsdp train --init-from path/to/hf-model --data tokens.bin --ckpt-dir ckpt\n"
    "SIGTERM, SIGINT or SIGUSR1 (on any rank, or forwarded by mpirun/srun) stops the run at the next step with\n"
    "a checkpoint and exit status 75; a second signal stops it at once. Continue with --resume auto.\n"
    "On the CPU backend bf16 is emulated (values rounded to bf16, stored in fp32) and --attn flash is the\n"
    "same exact attention as eager without keeping the seq x seq probabilities. Formats of token files,\n"
    "checkpoints and metrics: docs/FORMATS.md.\n";

int fsdp_cmd_train(int argc, char **argv) {
    fsdp_err err = {0};
    const char *model = "tiny-llama", *strategy = "FULL", *device = "auto";
    fsdp_cli_precision_flags prec = FSDP_CLI_PRECISION_DEFAULTS;
    const char *attn = "flash", *embed_grads = "auto";
    const char *gather_engine = "sm", *reduce_engine = "sm", *packing = "auto", *eval_data = NULL, *recompute = "none";
    int eval_every = 0, unigram_baseline = 0;
    double epochs = 0.0;
    const char *data = "synthetic", *ckpt_dir = NULL, *resume = NULL, *metrics = NULL, *mbs_text = "4", *init_from = NULL;
    const char *tensorboard = NULL;
    const char *trace = NULL, *trace_steps = NULL;
    const char *dropout = NULL, *reshard = NULL, *fp8 = "none";
    fsdp_cli_link_flags link_flags = FSDP_CLI_LINK_DEFAULTS;
    int ranks_per_node = 0, prefetch = 1, max_live = 2, mbs = 4, seq = 1024, grad_accum = 1, steps = 20;
    int global_batch = 0;
    double memory_limit_gib = 0.0;
    int warmup = 0, synthetic_vocab = 1000, ckpt_every = 0, keep = 0, log_every = 1, head_chunk = 0;
    int overwrite = 0, max_skipped = 5, allow_longer_seq = 0;
    int rollback = 0, allow_data_change = 0, allow_config_change = 0, allow_schedule_change = 0;
    int64_t seed = 42;
    double lr = 5e-5, min_lr = 0.0, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8, clip = 1.0;

    fsdp_arg args[] = {
        {"model", FSDP_ARG_STRING, &model, "NAME|PATH",
         "A preset (llama-3.2-1b, llama-2-7b, opt-1.3b, qwen2.5-0.5b, qwen3-0.6b, mistral-7b, tiny-llama, tiny-opt, "
         "tiny-qwen2, tiny-qwen3, tiny-mistral) or a Hugging Face config.json (or its directory) of a llama, opt, "
         "qwen2, qwen3 or mistral model.", 1, 0, NULL, 0},
        {"init-from", FSDP_ARG_STRING, &init_from, "DIR|FILE",
         "Start from pretrained weights: a Hugging Face model directory (config.json and model.safetensors, or "
         "model.safetensors.index.json and its files) or an fsdp.c checkpoint (its weights; the optimizer starts "
         "fresh at step 0). The model is the one it holds, so --model is not needed (given, it must be the same "
         "model). Every rank reads only its own shard.", 1, 0, NULL, 0},
        {"strategy", FSDP_ARG_STRING, &strategy, "S",
         "Sharding: FULL (ZeRO-3; alias FULL_SHARD), SHARD_GRAD_OP (ZeRO-2), NO_SHARD (DDP) or HYBRID (FULL inside a "
         "node, replicated across nodes; alias HYBRID_SHARD). Case-insensitive. auto: the fastest that fits by fsdp "
         "plan's prediction for the link (--link-gbps between nodes; one node: NVLink, --intra-gbps), with the "
         "--reduce-dtype, --gather-dtype and --accumulate not given chosen by the same table.", 1, 0, NULL, 0},
        {"link-gbps", FSDP_ARG_FLOAT, &link_flags.link_gbps, "GB/s",
         "With --strategy auto across nodes: the bus bandwidth per GPU between them (as fsdp plan).", 0, 1e6, NULL, 0},
        {"intra-gbps", FSDP_ARG_FLOAT, &link_flags.intra_gbps, "GB/s",
         "With --strategy auto: the bus bandwidth per GPU inside a node (NVLink).", 0, 1e6, NULL, 0},
        {"compute-from", FSDP_ARG_STRING, &link_flags.compute_from, "METRICS",
         "With --strategy auto: the compute rate from a run's --metrics file (as fsdp plan).", 1, 0, NULL, 0},
        {"compute-tflops", FSDP_ARG_FLOAT, &link_flags.compute_tflops, "T",
         "With --strategy auto: the compute rate itself (model TFLOP/s per GPU).", 0, 1e6, NULL, 0},
        {"ranks-per-node", FSDP_ARG_INT, &ranks_per_node, "N",
         "Treat every N consecutive ranks as one node for HYBRID and --reshard-after-forward node (emulates several "
         "nodes on one machine); 0 = the real nodes.", 0, 1 << 20, NULL, 0},
        {"reshard-after-forward", FSDP_ARG_STRING, &reshard, "node|N",
         "With --strategy FULL (ZeRO++'s hpZ; FSDP2's reshard_after_forward=N): after a unit's forward keep a "
         "secondary copy of its weights sharded over the node (or N ranks), so that the backward's all-gathers "
         "stay inside the node; weights, gradients and optimizer states stay sharded over all ranks. Costs 1/N of "
         "the blocks' weights in the compute precision per GPU.", 1, 0, NULL, 0},
        {"mbs", FSDP_ARG_STRING, &mbs_text, "N|auto",
         "Micro-batch size: samples per rank in each forward/backward. auto: the largest the memory plan (fsdp plan) "
         "fits in the GPU's memory or --memory-limit; a set-up that still runs out of memory is built again with the "
         "next smaller one.", 1, 0, NULL, 0},
        {"seq", FSDP_ARG_INT, &seq, "N",
         "Sequence length in tokens; at most the model's max_position_embeddings (the default shrinks to it).", 1,
         1 << 20, NULL, 0},
        {"allow-longer-seq", FSDP_ARG_BOOL, &allow_longer_seq, NULL,
         "Accept a --seq beyond the model's max_position_embeddings (positions it was never trained on; not for "
         "OPT, whose positions are learned).", 0, 0, NULL, 0},
        {"grad-accum", FSDP_ARG_INT, &grad_accum, "N", "Micro-batches accumulated per optimizer step.", 1, 1 << 20,
         NULL, 0},
        {"global-batch", FSDP_ARG_INT, &global_batch, "G",
         "Samples per optimizer step over all ranks: the accumulation steps become G / (micro-batch x ranks), which "
         "must be a whole number (instead of --grad-accum; 0 = use --grad-accum).", 0, 1 << 30, NULL, 0},
        {"memory-limit", FSDP_ARG_FLOAT, &memory_limit_gib, "GiB",
         "Memory each rank may use, 0 = the device's: what --mbs auto fits into; the allocator refuses to go past it "
         "(on a GPU counting everything in use on it, emulating a smaller GPU).", 0, 1e6, NULL, 0},
        {"steps", FSDP_ARG_INT, &steps, "N", "Optimizer steps to train to (a resumed run continues to this step).", 0,
         1 << 30, NULL, 0},
        {"epochs", FSDP_ARG_FLOAT, &epochs, "E",
         "Instead of --steps: passes over the token file; the steps are ceil(E x samples of an epoch / global batch) "
         "(the last step may take the next epoch's first samples).", 0, 1e9, NULL, 0},
        {"lr", FSDP_ARG_FLOAT, &lr, "X", "Peak learning rate.", 0, 10, NULL, 0},
        {"min-lr", FSDP_ARG_FLOAT, &min_lr, "X", "Learning rate at the end of the cosine decay.", 0, 10, NULL, 0},
        {"warmup", FSDP_ARG_INT, &warmup, "N", "Steps of linear warm-up from 0 before the cosine decay.", 0, 1 << 30,
         NULL, 0},
        {"weight-decay", FSDP_ARG_FLOAT, &weight_decay, "X",
         "AdamW decoupled weight decay (never applied to norms and biases).", 0, 10, NULL, 0},
        {"beta1", FSDP_ARG_FLOAT, &beta1, "X", "AdamW beta1.", 0, 1, NULL, 0},
        {"beta2", FSDP_ARG_FLOAT, &beta2, "X", "AdamW beta2.", 0, 1, NULL, 0},
        {"adam-eps", FSDP_ARG_FLOAT, &adam_eps, "X", "AdamW epsilon.", 0, 1, NULL, 0},
        {"clip", FSDP_ARG_FLOAT, &clip, "X", "Clip the global gradient norm to X (0 = no clipping).", 0, 1e9, NULL,
         0},
        {"model-precision", FSDP_ARG_CHOICE, &prec.model_precision, "P",
         "Precision of the stored model: master weights, gradients and Adam states.", 1, 0, FSDP_CLI_PRECISIONS, 0},
        {"mixed-precision", FSDP_ARG_CHOICE, &prec.mixed_precision, "P",
         "Compute precision of activations and gathered weights (bf16 = mixed precision; auto = bf16 on GPUs, no on "
         "the CPU backend, where bf16 is emulated and slower).", 1, 0, FSDP_CLI_MIXED, 0},
        {"reduce-dtype", FSDP_ARG_CHOICE, &prec.reduce_dtype, "P",
         "What gradient reductions send: fp32 (summed by NCCL), bf16 (2x fewer bytes) or int8 (blockwise scales, about "
         "4x fewer); bf16 and int8 are summed in fp32 by the rank that keeps the shard. The backward accumulates in "
         "fp32 for fp32, bf16 for bf16, the compute precision for int8. auto = the model precision.", 1, 0,
         FSDP_CLI_REDUCE, 0},
        {"gather-dtype", FSDP_ARG_CHOICE, &prec.gather_dtype, "P",
         "What parameter all-gathers send: the compute precision (auto), or int8 or fp8 (e4m3), each with a scale per "
         "256 weights, quantized once per step from the exact master weights and dequantized into the compute "
         "precision on arrival (2x fewer bytes than bf16). Master weights and optimizer states stay exact.", 1, 0,
         FSDP_CLI_GATHER, 0},
        {"accumulate", FSDP_ARG_CHOICE, &prec.accumulate, "A",
         "With several micro-batches per step: local sums every micro-batch's gradients on the rank and reduces them "
         "once per step (SHARD_GRAD_OP also gathers once per step; FULL keeps a full gradient buffer per unit); "
         "sharded reduces after every micro-batch into the shards; auto = local except with FULL.", 1, 0,
         FSDP_CLI_ACCUMULATE, 0},
        {"attn", FSDP_ARG_CHOICE, &attn, "A",
         "Attention: eager materialises the seq x seq probabilities (the course's baseline); flash does not; "
         "flash-atomic is flash with the query gradient summed by atomics in the backward's key pass (5 matrix "
         "products per tile instead of 7, as FlashAttention-2; gradients not bitwise reproducible from run to run); "
         "cudnn is cuDNN's fused attention (Hopper-native kernels; libcudnn.so.9 loaded at run time, "
         "FSDP_CUDNN_LIBRARY names another; bf16, no attention dropout or sliding window shorter than --seq). "
         "flash-atomic and cudnn "
         "are GPU paths: the CPU's attention is exact either way.", 1, 0, ATTN, 0},
        {"recompute", FSDP_ARG_CHOICE, &recompute, "R",
         "Activation recomputation (gradient checkpointing): none keeps every activation of a micro-batch for the "
         "backward; selective keeps the matrix products' outputs and recomputes the norms, the SwiGLU activation "
         "and eager attention's probabilities; full keeps only each layer's input and recomputes the layer's "
         "forward in the backward (least memory, about one more forward of compute). The gradients are the same.",
         1, 0, RECOMPUTE, 0},
        {"fp8", FSDP_ARG_CHOICE, &fp8, "S",
         "The blocks' projections (q/k/v, o, gate/up, down; not the LM head) as FP8 products, torchao's dynamic "
         "recipes: tensorwise scales each operand by its current amax (e4m3 everywhere), rowwise each row along the "
         "product's reduction (e4m3, power-of-two scales); outputs bf16, master weights unchanged. GPUs of compute "
         "capability 8.9+ (H100, H200); the CPU emulates it. Tokens per micro-batch and the projections' sizes must "
         "be multiples of 16.",
         1, 0, FP8, 0},
        {"embedding-grads", FSDP_ARG_CHOICE, &embed_grads, "M",
         "Token-embedding gradient: dense reduce-scatters the whole matrix; rows gathers only the rows the batch "
         "touched (fp32 master weights); auto picks rows when that moves fewer bytes.", 1, 0, EMBED_GRADS, 0},
        {"dropout", FSDP_ARG_STRING, &dropout, "P",
         "Dropout rate in [0, 1) for every dropout the model's family has, replacing the config's (0 turns dropout "
         "off): OPT's dropout on the attention and MLP outputs and every family's attention_dropout on the attention "
         "probabilities, applied as transformers applies them in training. Default: the config's rates (opt-1.3b: "
         "0.1 on the outputs; the other presets: none).", 1, 0, NULL, 0},
        {"seed", FSDP_ARG_INT64, &seed, "N",
         "Seed of the initial weights, the data order and the dropout masks (kept in checkpoints).", 0, 9e18, NULL, 0},
        {"data", FSDP_ARG_STRING, &data, "synthetic|FILE",
         "Training data: synthetic tokens (the course's DummyDataset) or a token file (docs/FORMATS.md).", 1, 0, NULL,
         0},
        {"synthetic-vocab", FSDP_ARG_INT, &synthetic_vocab, "N", "Synthetic tokens are uniform in [0, N).", 1,
         1 << 30, NULL, 0},
        {"packing", FSDP_ARG_CHOICE, &packing, "P",
         "How a token file's documents become samples: stream joins them with EOS and cuts windows of --seq + 1 "
         "tokens (pre-training); pad gives each example its own sample, truncated and padded, the loss only on "
         "unmasked tokens (instruction tuning); auto = pad for a file with a loss mask (prepare --format alpaca), "
         "else stream.", 1, 0, PACKINGS, 0},
        {"eval-data", FSDP_ARG_STRING, &eval_data, "FILE",
         "Validation token file: loss and perplexity over all of it (forward only, split across ranks) every "
         "--eval-every steps and at the end of the run, in the progress line and the metrics.", 1, 0, NULL, 0},
        {"eval-every", FSDP_ARG_INT, &eval_every, "N", "Evaluate every N steps (0 = only at the end).", 0, 1 << 30,
         NULL, 0},
        {"unigram-baseline", FSDP_ARG_BOOL, &unigram_baseline, NULL,
         "At the start, print the loss on --eval-data of a model that knows only the token frequencies of --data "
         "(add-one smoothed): the bar eval_loss must clear to show more than unigram statistics were learned. "
         "Reads all of --data once.", 0, 0, NULL, 0},
        {"ckpt-dir", FSDP_ARG_STRING, &ckpt_dir, "DIR",
         "Write checkpoints (step-NNNNNNNN.h5 and a 'latest' pointer) here; the last step is always saved.", 1, 0,
         NULL, 0},
        {"ckpt-every", FSDP_ARG_INT, &ckpt_every, "N", "Also checkpoint every N steps (0 = only at the end).", 0,
         1 << 30, NULL, 0},
        {"keep", FSDP_ARG_INT, &keep, "N",
         "Keep only the newest N checkpoints (0 = all); the one 'latest' names is never deleted.", 0, 1 << 30, NULL,
         0},
        {"resume", FSDP_ARG_STRING, &resume, "FILE|auto",
         "Continue from a checkpoint (verified against its checksums); auto = the one 'latest' names in --ckpt-dir, "
         "else its newest step file that verifies, or a fresh start when it has none. Any number of ranks and any "
         "strategy can resume any checkpoint.", 1, 0, NULL, 0},
        {"rollback", FSDP_ARG_BOOL, &rollback, NULL,
         "With --resume FILE older than the newest checkpoint of --ckpt-dir: move the newer ones (and 'latest' when "
         "it names one) aside into --ckpt-dir/rolled-back-<time>/ and continue from FILE (without it such a resume "
         "is refused; nothing is deleted).", 0, 0, NULL, 0},
        {"allow-data-change", FSDP_ARG_BOOL, &allow_data_change, NULL,
         "Resume on data whose tokenizer, vocabulary or source (synthetic or a token file) differs from what the "
         "checkpoint was trained on (a fine-tune continuing on new data; without it such a resume is refused).", 0, 0,
         NULL, 0},
        {"allow-config-change", FSDP_ARG_BOOL, &allow_config_change, NULL,
         "Resume under config values that change the computation (rope_theta, rope_scaling, rms_norm_eps, dropout "
         "rates, eos/pad token ids) other than the checkpoint's (without it such a resume is refused).", 0, 0, NULL,
         0},
        {"allow-schedule-change", FSDP_ARG_BOOL, &allow_schedule_change, NULL,
         "Resume under another learning-rate schedule (--steps, --lr, --min-lr, --warmup) than the checkpoint's: the "
         "cosine is re-spanned from the resumed step and the rate jumps, as transformers and torchtitan do silently "
         "(without it a resume whose next rate differs from the checkpoint schedule's is refused).", 0, 0, NULL, 0},
        {"overwrite", FSDP_ARG_BOOL, &overwrite, NULL,
         "Start a new run in a --ckpt-dir that holds another run's checkpoints, deleting them (without it such a "
         "run is refused).", 0, 0, NULL, 0},
        {"max-skipped", FSDP_ARG_INT, &max_skipped, "N",
         "Steps in a row whose loss or gradient norm is not finite that are skipped (not applied) before the run "
         "stops.", 0, 1 << 20, NULL, 0},
        {"metrics", FSDP_ARG_STRING, &metrics, "FILE",
         "Write one JSON object per step and a final summary (JSON Lines).", 1, 0, NULL, 0},
        {"tensorboard", FSDP_ARG_STRING, &tensorboard, "DIR",
         "Write the metrics as TensorBoard event files into DIR (rank 0, flushed every step; one run per folder: "
         "`tensorboard --logdir` its parent). Hugging Face's --report_to tensorboard --logging_dir DIR.", 1, 0, NULL,
         0},
        {"trace", FSDP_ARG_STRING, &trace, "FILE",
         "Write a timeline of --trace-steps per rank, for Perfetto or chrome://tracing (trace.json -> "
         "trace.rank0.json, ...): each unit's forward and backward, every gather and reduction with its bytes, the "
         "host's phases; and the summary (busy time per stream, communication hidden under compute).", 1, 0, NULL,
         0},
        {"trace-steps", FSDP_ARG_STRING, &trace_steps, "A:B",
         "The steps --trace records (default: 3 to 5 of this run, or its last ones when shorter).", 1, 0, NULL, 0},
        {"log-every", FSDP_ARG_INT, &log_every, "N", "Print a progress line every N steps.", 1, 1 << 30, NULL, 0},
        {"device", FSDP_ARG_CHOICE, &device, "D", "Backend: auto uses the GPUs when there are any.", 1, 0, DEVICES,
         0},
        {"prefetch", FSDP_ARG_INT, &prefetch, "N", "Units whose all-gather starts ahead of their use.", 0, 64, NULL,
         0},
        {"gather-engine", FSDP_ARG_CHOICE, &gather_engine, "E",
         "What runs the parameter all-gathers: sm = NCCL kernels on the SMs; copy = the copy engines, leaving every SM "
         "to the compute they overlap (GPUs of one node over NVLink with NCCL 2.28 or newer; elsewhere NCCL falls "
         "back to its kernels).", 1, 0, GATHER_ENGINES, 0},
        {"reduce-engine", FSDP_ARG_CHOICE, &reduce_engine, "E",
         "What runs the gradient reduce-scatters: sm = NCCL kernels; copy = an all-to-all on the copy engines and a "
         "local sum (same GPUs and NCCL as --gather-engine copy).", 1, 0, GATHER_ENGINES, 0},
        {"max-live-units", FSDP_ARG_INT, &max_live, "N",
         "Most gathered units (and unit gradient buffers) alive at once.", 1, 1024, NULL, 0},
        {"head-chunk-tokens", FSDP_ARG_INT, &head_chunk, "N",
         "Tokens per chunk of the fused LM head + cross-entropy (0 = about 512 MiB of logits).", 0, 1 << 30, NULL,
         0},
    };
    char summary[640];
    snprintf(summary, sizeof summary,
             "Train a decoder-only LLM (%s) with fully sharded data parallelism over MPI ranks.",
             fsdp_cli_family_list());
    fsdp_arg_spec spec = {"train", summary,
                          "fsdp train [FLAGS]", EPILOGUE, args, (int)(sizeof args / sizeof args[0])};
    int rc = fsdp_args_parse(&spec, argc, argv, stdout, &err);
    if (rc == 1) return 0;
    if (rc < 0) fsdp_exit_error(&err, 0);

    fsdp_train_options o;
    memset(&o, 0, sizeof o);
    if (fsdp_cli_parse_mbs("train", mbs_text, &mbs, &o.mbs_auto, &err) ||
        fsdp_cli_parse_dropout("train", dropout, &o.dropout_set, &o.dropout_rate, &err))
        fsdp_exit_error(&err, 0);
    if (global_batch && fsdp_args_find(&spec, "grad-accum")->seen) {
        fsdp_usagef(&err, "train: give --global-batch or --grad-accum, not both");
        fsdp_exit_error(&err, 0);
    }
    o.strategy_auto = !strcasecmp(strategy, "auto");
    if (o.strategy_auto) {
        fsdp_link link = {1, link_flags.link_gbps, link_flags.intra_gbps, 0.0};
        fsdp_rates rates;
        if (fsdp_args_find(&spec, "link-gbps")->seen && link_flags.link_gbps <= 0.0)
            fsdp_usagef(&err, "train: --link-gbps %g is not a bandwidth (GB/s above 0)", link_flags.link_gbps);
        else if (reshard)
            fsdp_usagef(&err, "train: --reshard-after-forward goes with --strategy FULL, not auto");
        if (err.failed || fsdp_cli_link_check("train", &link_flags, &err) ||
            fsdp_cli_link_rates("train", &link_flags, NULL, &o, &link, &rates, o.auto_rate_source,
                                sizeof o.auto_rate_source, &err))
            fsdp_exit_error(&err, 0);
        o.link_gbps = link_flags.link_gbps, o.intra_gbps = link_flags.intra_gbps;
        o.auto_tflops = rates.tflops, o.auto_update_gbps = rates.update_gbps;
        o.auto_interference = rates.interference, o.auto_gather_interference = rates.gather_interference;
    } else if (link_flags.link_gbps > 0.0 || link_flags.compute_from || link_flags.compute_tflops > 0.0) {
        fsdp_usagef(&err, "train: --link-gbps, --compute-from and --compute-tflops go with --strategy auto");
        fsdp_exit_error(&err, 0);
    }
    if (!o.strategy_auto && fsdp_strategy_parse(strategy, &o.strategy)) {
        fsdp_usagef(&err, "train: --strategy '%s' is not one of: FULL, SHARD_GRAD_OP, NO_SHARD, HYBRID, auto", strategy);
        fsdp_exit_error(&err, 0);
    }
    if (init_from && resume) {
        fsdp_usagef(&err, "train: --init-from and --resume are exclusive (--init-from starts a new run from "
                          "pretrained weights; --resume continues a run)");
        fsdp_exit_error(&err, 0);
    }
    if (resume && !strcmp(resume, "auto") && !ckpt_dir) {
        fsdp_usagef(&err, "train: --resume auto needs --ckpt-dir");
        fsdp_exit_error(&err, 0);
    }
    if (epochs > 0 && fsdp_args_find(&spec, "steps")->seen) {
        fsdp_usagef(&err, "train: give --epochs or --steps, not both");
        fsdp_exit_error(&err, 0);
    }
    if ((eval_every || unigram_baseline) && !eval_data) {
        fsdp_usagef(&err, "train: %s needs --eval-data FILE", eval_every ? "--eval-every" : "--unigram-baseline");
        fsdp_exit_error(&err, 0);
    }
    if ((ckpt_every || keep || overwrite) && !ckpt_dir) {
        fsdp_usagef(&err, "train: --ckpt-every, --keep and --overwrite need --ckpt-dir");
        fsdp_exit_error(&err, 0);
    }
    if (overwrite && resume) {
        fsdp_usagef(&err, "train: --overwrite starts a new run and --resume continues one: pass one of them");
        fsdp_exit_error(&err, 0);
    }
    if (rollback && (!resume || !strcmp(resume, "auto") || !ckpt_dir)) {
        fsdp_usagef(&err, "train: --rollback moves aside the checkpoints of --ckpt-dir newer than --resume FILE: it "
                          "needs --resume FILE (not auto) and --ckpt-dir");
        fsdp_exit_error(&err, 0);
    }
    if ((allow_data_change || allow_config_change || allow_schedule_change) && !resume) {
        fsdp_usagef(&err, "train: --%s says what a resumed run may change: it needs --resume",
                    allow_data_change     ? "allow-data-change"
                    : allow_config_change ? "allow-config-change"
                                          : "allow-schedule-change");
        fsdp_exit_error(&err, 0);
    }
    /* The cosine decays from --lr to --min-lr: above --lr it would climb instead. */
    if (min_lr > lr) {
        fsdp_usagef(&err, "train: --min-lr %g is above --lr %g: the schedule decays from --lr to --min-lr, so the rate "
                          "would climb; pass a --min-lr of at most --lr (0 decays to zero)", min_lr, lr);
        fsdp_exit_error(&err, 0);
    }
    /* Settings that make every step non-finite: refused before anything runs. */
    if (beta1 >= 1.0 || beta2 >= 1.0) {
        fsdp_usagef(&err,
                    "train: --%s %g: AdamW's bias correction divides by 1 - %s^step, which is 0 at %s = 1, so every "
                    "update would be NaN; use a value below 1 (0.9 and 0.999 are the usual ones)",
                    beta1 >= 1.0 ? "beta1" : "beta2", beta1 >= 1.0 ? beta1 : beta2, beta1 >= 1.0 ? "beta1" : "beta2",
                    beta1 >= 1.0 ? "beta1" : "beta2");
        fsdp_exit_error(&err, 0);
    }
    if (!(adam_eps > 0.0)) {
        fsdp_usagef(&err,
                    "train: --adam-eps 0: AdamW divides by sqrt(v) + epsilon, and v is 0 for every weight whose "
                    "gradient has been 0 (embedding rows of tokens not yet seen), so 0/0 = NaN; use a small positive "
                    "value such as 1e-8");
        fsdp_exit_error(&err, 0);
    }
    /* With --init-from the model is the one it holds; --model then only has to agree with it. */
    o.model = init_from && !fsdp_args_find(&spec, "model")->seen ? NULL : model;
    o.init_from = init_from;
    o.ranks_per_node = ranks_per_node;
    if (reshard && fsdp_reshard_parse("train", reshard, &o.reshard_after_forward, &err)) fsdp_exit_error(&err, 0);
    o.prefetch = prefetch;
    o.max_live = max_live;
    o.copy_engine_gathers = !strcmp(gather_engine, "copy");
    o.copy_engine_reductions = !strcmp(reduce_engine, "copy");
    o.device = device;
    o.mbs = mbs, o.seq = seq, o.grad_accum = grad_accum, o.steps = steps;
    o.global_batch = global_batch;
    o.memory_limit = (size_t)(memory_limit_gib * (double)(1u << 30));
    o.seq_given = fsdp_args_find(&spec, "seq")->seen;
    o.allow_longer_seq = allow_longer_seq, o.max_skipped = max_skipped, o.overwrite = overwrite;
    o.lr = lr, o.min_lr = min_lr, o.weight_decay = weight_decay, o.beta1 = beta1, o.beta2 = beta2;
    o.adam_eps = adam_eps, o.clip = clip, o.warmup = warmup;
    o.seed = (uint64_t)seed;
    if (fsdp_cli_precision("train", &prec, &o, &err)) fsdp_exit_error(&err, 0);
    /* --strategy auto also picks the wire options left unsaid, as fsdp plan's table varies them. */
    o.auto_vary_reduce = o.strategy_auto && !fsdp_args_find(&spec, "reduce-dtype")->seen;
    o.auto_vary_gather = o.strategy_auto && !fsdp_args_find(&spec, "gather-dtype")->seen;
    o.auto_vary_accumulate = o.strategy_auto && !fsdp_args_find(&spec, "accumulate")->seen;
    o.attn = fsdp_attn_of(attn);
    o.head_chunk = head_chunk;
    fsdp_recompute_parse(recompute, &o.recompute); /* one of the choices: the parser checked */
    fsdp_fp8_parse(fp8, &o.fp8);                   /* likewise */
    o.embed_grads = !strcmp(embed_grads, "rows")    ? FSDP_EMBED_GRADS_ROWS
                    : !strcmp(embed_grads, "dense") ? FSDP_EMBED_GRADS_DENSE
                                                    : FSDP_EMBED_GRADS_AUTO;
    if (fsdp_plan_check_embed_rows("train", &o, 1, &err)) fsdp_exit_error(&err, 0); /* the ranks: when set up */
    o.data = data;
    o.synthetic_vocab = synthetic_vocab;
    o.packing = !strcmp(packing, "stream") ? FSDP_PACK_STREAM : !strcmp(packing, "pad") ? FSDP_PACK_PAD : FSDP_PACK_AUTO;
    o.epochs = epochs;
    o.eval_data = eval_data;
    o.eval_every = eval_every;
    o.unigram_baseline = unigram_baseline;
    o.ckpt_dir = ckpt_dir, o.ckpt_every = ckpt_every, o.keep = keep, o.resume = resume;
    o.rollback = rollback, o.allow_data_change = allow_data_change, o.allow_config_change = allow_config_change;
    o.allow_schedule_change = allow_schedule_change;
    o.metrics = metrics, o.log_every = log_every;
    o.tensorboard = tensorboard;
    o.trace = trace;
    if (trace_steps && !trace) {
        fsdp_usagef(&err, "train: --trace-steps says which steps --trace records: it needs --trace FILE");
        fsdp_exit_error(&err, 0);
    }
    if (trace_steps && fsdp_trace_parse_steps(trace_steps, &o.trace_first, &o.trace_last, &err)) fsdp_exit_error(&err, 0);
    json_t *run_record = fsdp_json_from_args(&spec);
    if (!o.mbs_auto) json_object_set_new(run_record, "mbs", json_integer(mbs)); /* a number, as it always was */
    char *run_json = fsdp_json_text(run_record, 0, 17);
    json_decref(run_record);
    o.run_json = run_json;

    int rc_train = fsdp_train(&o, &err);
    free(run_json);
    if (rc_train < 0) fsdp_exit_error(&err, 0);
    return rc_train; /* 0, or FSDP_EXIT_PREEMPTED */
}
