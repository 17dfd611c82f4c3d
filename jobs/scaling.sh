#!/bin/bash
# Scaling as in the course (tasks 15.10-15.13): the same configuration on 1, 2, 4, ... GPUs, one job
# per point (jobs/train.slurm, without checkpoints), all writing into
#   RESULTS_DIR/scaling-<model>-<STRATEGY>-mbs<M>/<G>gpu-<K>node/
# and, once they have all ended, a small job (jobs/report.slurm, --dependency afterany) that writes
# the report: throughput per GPU and in total, speed-up and efficiency against GPUs, cost.
# Run it on a login node, from the repository:
#   SBATCH_ARGS="--account <account> --qos acc_debug" jobs/scaling.sh
#   GPUS="1 2 4 8 16 32" MICRO_BATCH_SIZE=32 MODEL_PRECISION=bf16 SBATCH_ARGS=... jobs/scaling.sh
# Variables: GPUS (default "1 2 4 8 16 32", the course's), GPUS_PER_NODE (4: a point of G GPUs takes
# min(G, 4) per node), SERIAL (no: the points queue together; yes: each waits for the one before, for
# queues that limit jobs per user), REPORT (yes | no), GPU_HOUR_PRICE, SBATCH_ARGS (added to every
# sbatch), plus those of jobs/common.sh (MODEL, MICRO_BATCH_SIZE, MODEL_PRECISION, MIXED_PRECISION,
# ATTN, STRATEGY, SEQUENCE_LEN, MAX_STEPS, RESULTS_DIR, EXTRA_ARGS, DEVICE=cpu, ...). A point already
# finished (its folder has `done`) is not submitted again. The last line printed lists the job ids.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=jobs/common.sh
. "$here/common.sh"

: "${MICRO_BATCH_SIZE:=16}" "${GPUS:=1 2 4 8 16 32}" "${GPUS_PER_NODE:=4}" "${SERIAL:=no}" "${REPORT:=yes}"
: "${SBATCH_ARGS:=}"
fsdp_setup
export CHECKPOINTS=no
exp="$RESULTS_DIR/scaling-$(fsdp_model_tag)-$STRATEGY-mbs$MICRO_BATCH_SIZE"
mkdir -p "$exp"

ids=()
previous=
for g in $GPUS; do
    if [ "$g" -le "$GPUS_PER_NODE" ]; then
        nodes=1 per_node=$g
    elif [ $((g % GPUS_PER_NODE)) -eq 0 ]; then
        nodes=$((g / GPUS_PER_NODE)) per_node=$GPUS_PER_NODE
    else
        echo "fsdp: error: $g GPUs is not a multiple of GPUS_PER_NODE=$GPUS_PER_NODE" >&2
        exit 2
    fi
    point="$exp/${g}$(fsdp_unit)-${nodes}node"
    if [ -f "$point/done" ]; then
        echo "== $point: finished by an earlier job, not submitted"
        continue
    fi
    mkdir -p "$point"
    dependency=()
    [ "$SERIAL" = yes ] && [ -n "$previous" ] && dependency=(--dependency "afterany:$previous")
    # shellcheck disable=SC2086
    id=$(RUN_DIR="$point" sbatch --parsable --job-name "fsdp-scaling-${g}gpu" --nodes "$nodes" \
        --ntasks-per-node "$per_node" --gres "gpu:$per_node" --output "$point/R-%x.%j.out" \
        --error "$point/R-%x.%j.err" "${dependency[@]}" $SBATCH_ARGS "$here/train.slurm")
    id=${id%%;*}
    echo "== $g GPU(s) on $nodes node(s): job $id -> $point"
    ids+=("$id")
    previous=$id
done

if [ "$REPORT" = yes ]; then
    dependency=()
    [ "${#ids[@]}" -gt 0 ] && dependency=(--dependency "afterany:$(IFS=:; echo "${ids[*]}")")
    # shellcheck disable=SC2086
    id=$(sbatch --parsable --output "$exp/R-%x.%j.out" --error "$exp/R-%x.%j.err" "${dependency[@]}" $SBATCH_ARGS \
        "$here/report.slurm" "$exp")
    id=${id%%;*}
    echo "== report when they have ended: job $id -> $exp/report/report.md"
    ids+=("$id")
fi
echo "jobs: ${ids[*]}"
