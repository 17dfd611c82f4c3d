#!/usr/bin/env bash
# The main job on its embedded default: builds fsdp.c, trains tiny-llama on synthetic tokens for 20 steps
# with FULL sharding (checkpointing at step 10 and 20), then resumes from the latest checkpoint and trains
# to step 30. On a machine with GPUs it runs one rank per GPU on the CUDA backend (when built in); otherwise
# 2 MPI ranks on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
ranks=$(( gpus > 0 ? gpus : 2 ))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export HDF5_USE_FILE_LOCKING=FALSE
[ "$gpus" -eq 0 ] && export OMP_NUM_THREADS=1

out=runs/quickstart
rm -rf "$out"
mkdir -p "$out"
common=(--model tiny-llama --seq 128 --mbs 4 --lr 3e-3 --warmup 5 --weight-decay 0.1 --strategy FULL
        --ckpt-dir "$out/ckpt" --ckpt-every 10 --metrics "$out/metrics.jsonl" --log-every 5)

echo "== training 20 steps on $ranks rank(s)"
mpirun -np "$ranks" build/fsdp train "${common[@]}" --steps 20
echo "== resuming from the latest checkpoint to step 30"
mpirun -np "$ranks" build/fsdp train "${common[@]}" --steps 30 --resume auto
echo "== done: checkpoints in $out/ckpt, metrics in $out/metrics.jsonl"
