#!/usr/bin/env bash
# Speed of `fsdp generate` (prefill and decode tokens/s, as its last line reports them) on models of
# real shapes with fsdp.c's random initial weights (`fsdp export --model PRESET`: no download; the
# tokens are meaningless, the work per token is the real model's), for each prompt length, dtype and
# device asked for. Greedy, so that nothing but the model runs. Writes
# bench/results/DATE-DEVICE-generate.md with the commands and their lines.
#
#   . .gpu-host/env.sh && bench/generate_bench.sh --models llama-3.2-1b,opt-1.3b --prompts 16,1024 --new 256
#
# Flags: --dir DIR (model directories; default ./generate-bench), --models a,b (presets; default
# llama-3.2-1b), --prompts 16,1024 (prompt lengths in tokens), --new N (new tokens, default 256),
# --dtypes bf16,fp32, --device cuda|cpu, --results DIR (default bench/results).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FSDP=${FSDP_BIN:-$ROOT/build/fsdp}
DIR=$PWD/generate-bench MODELS=llama-3.2-1b PROMPTS=16,1024 NEW=256 DTYPES=bf16,fp32 DEVICE=cuda
RESULTS=$ROOT/bench/results
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --new) NEW=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    *) echo "generate_bench: unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR" "$RESULTS"
name=$({ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true; } | head -1 | tr ' ' '-' | tr 'A-Z' 'a-z')
if [ "$DEVICE" = cpu ] || [ -z "$name" ]; then name=cpu; fi
out=$RESULTS/$(date +%F)-$name-generate.md
{
  echo "# fsdp generate: prefill and decode speed"
  echo
  echo "$(date -u +%FT%TZ), $("$FSDP" --version), device $DEVICE ($name), $NEW new tokens, greedy."
  echo
} > "$out"
for model in ${MODELS//,/ }; do
  dir=$DIR/$model
  [ -f "$dir/config.json" ] || "$FSDP" export --model "$model" --out "$dir" --force > /dev/null
  for prompt in ${PROMPTS//,/ }; do
    ids=$(seq 0 $((prompt - 1)) | awk '{printf "%d ", 3 + ($1 * 7919) % 1000}')
    for dtype in ${DTYPES//,/ }; do
      cmd=("$FSDP" generate --init-from "$dir" --prompt-ids "$ids" --max-new-tokens "$NEW" --temperature 0
           --print-ids --device "$DEVICE" --dtype "$dtype")
      line=$({ "${cmd[@]}" 2>&1 >/dev/null || true; } | tail -1)
      echo "$model, prompt $prompt, $dtype: $line" | tee -a "$out"
      echo >> "$out"
    done
  done
done
echo "generate_bench: $out"
