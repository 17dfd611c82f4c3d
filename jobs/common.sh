# jobs/common.sh: sourced by the job scripts of fsdp.c (train.slurm, ladder.slurm, strategies.slurm,
# report.slurm, scaling.sh, finetune.slurm). It gives them the course's variables with their defaults, the
# environment of the ranks, the launch line (one MPI rank per GPU: `srun --mpi=pmix` inside a SLURM job, `mpirun`
# outside one), and fsdp_run, which runs one configuration into its own folder of the results.
#
# Variables (set them in the environment before sbatch, which passes it on, or with --export):
#   DEVICE            cuda (default) | cpu: the CPU backend with a tiny model at tiny sizes, for tests
#   MODEL             a preset or a config.json        cuda: llama-3.2-1b   cpu: tiny-llama
#   SEQUENCE_LEN      tokens per sample                cuda: 1024           cpu: 64
#   MAX_STEPS         optimizer steps per run          cuda: 450 (the course's)  cpu: 4
#   MICRO_BATCH_SIZE  samples per GPU per step         (each script has its own default)
#   MEMORY_LIMIT      GiB each rank may use (--memory-limit; what --mbs auto fits into)
#                                                      cuda: the GPU's (64 emulates MareNostrum-5's
#                                                      H100s on a larger GPU)   cpu: 0.03125 (32 MiB)
#   MODEL_PRECISION   fp32 | bf16                      (default fp32)
#   MIXED_PRECISION   no | bf16                        (default bf16)
#   ATTN              eager | flash                    (default flash; the course's sdpa)
#   STRATEGY          FULL | SHARD_GRAD_OP | NO_SHARD | HYBRID   (default FULL)
#   RESULTS_DIR       where the runs go                (default: results, under the submission folder)
#   EXTRA_ARGS        more `fsdp train` flags, e.g. "--grad-accum 4 --lr 1e-5"
#   CHECKPOINTS       yes | no: checkpoint into RUN/ckpt and continue with --resume auto when the job
#                     runs again (train.slurm: yes; the sweeps: no, and a run already finished is skipped)
#   CKPT_EVERY        with CHECKPOINTS=yes, also checkpoint every N steps (default 0: at the end only)
#   INIT_FROM         a pretrained Hugging Face model directory that a run starts from (--init-from); with
#                     CHECKPOINTS=yes, once the run has checkpoints of its own it goes on from them instead
#                     (--model INIT_FROM --resume auto) (finetune.slurm; unset: the model starts at random)
#   EPOCHS            passes over --data instead of MAX_STEPS steps (--epochs; unset: --steps MAX_STEPS)
#   FSDP_BIN          the program (default: build/fsdp of this repository)
#   FSDP_SETUP        a file sourced first, e.g. one with the `module load` lines of your cluster
#   RANKS             outside SLURM only: ranks for mpirun (default: the GPUs that CUDA_VISIBLE_DEVICES
#                     leaves visible; with DEVICE=cpu, 2)
#
# Each run's folder: metrics.jsonl (fsdp train --metrics), train.log (its output), done (written when
# it finished), ckpt/ (with CHECKPOINTS=yes). The layout of a results folder is in README.md
# ("Sweeps and reports").

FSDP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FAILED_RUNS=()
# Signals and requeueing (fsdp_forward_signals, fsdp_wait_step, fsdp_requeue_if_stopped).
# shellcheck source=jobs/preempt.sh
. "$FSDP_ROOT/jobs/preempt.sh" || exit 2
# The GPUs that CUDA_VISIBLE_DEVICES leaves (fsdp_visible_gpus).
# shellcheck source=jobs/gpus.sh
. "$FSDP_ROOT/jobs/gpus.sh" || exit 2

# The course's variables with their defaults, exported so that jobs submitted from here see them.
fsdp_setup() {
    if [ -n "${FSDP_SETUP:-}" ]; then
        # shellcheck disable=SC1090
        . "$FSDP_SETUP" || { echo "fsdp: error: FSDP_SETUP=$FSDP_SETUP failed" >&2; exit 2; }
    fi
    DEVICE=${DEVICE:-cuda}
    case $DEVICE in
        cuda) : "${MODEL:=llama-3.2-1b}" "${SEQUENCE_LEN:=1024}" "${MAX_STEPS:=450}" ;;
        cpu) : "${MODEL:=tiny-llama}" "${SEQUENCE_LEN:=64}" "${MAX_STEPS:=4}" "${MEMORY_LIMIT:=0.03125}" ;;
        *) echo "fsdp: error: DEVICE=$DEVICE is neither cuda nor cpu" >&2; exit 2 ;;
    esac
    : "${MODEL_PRECISION:=fp32}" "${MIXED_PRECISION:=bf16}" "${ATTN:=flash}" "${STRATEGY:=FULL}"
    : "${RESULTS_DIR:=${SLURM_SUBMIT_DIR:-$PWD}/results}" "${EXTRA_ARGS:=}" "${CHECKPOINTS:=no}" "${CKPT_EVERY:=0}"
    : "${FSDP_BIN:=$FSDP_ROOT/build/fsdp}"
    export DEVICE MODEL SEQUENCE_LEN MAX_STEPS MODEL_PRECISION MIXED_PRECISION ATTN STRATEGY RESULTS_DIR EXTRA_ARGS
    export CHECKPOINTS CKPT_EVERY FSDP_BIN
    [ -n "${MEMORY_LIMIT:-}" ] && export MEMORY_LIMIT
    [ -n "${MICRO_BATCH_SIZE:-}" ] && export MICRO_BATCH_SIZE
    if [ ! -x "$FSDP_BIN" ]; then
        echo "fsdp: error: FSDP_BIN=$FSDP_BIN is not a program (build fsdp.c first: tools/bootstrap.sh)" >&2
        exit 2
    fi

    # The ranks' environment: OpenMP threads for the CPU backend, parallel HDF5 on file systems without
    # POSIX locks (GPFS, Lustre), and srun's CPUs per task (srun no longer takes it from sbatch).
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
    [ -n "${SLURM_CPUS_PER_TASK:-}" ] && export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
    if [ -z "${SLURM_JOB_ID:-}" ] && [ -z "${RANKS:-}" ]; then
        RANKS=2
        if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
            RANKS=$(fsdp_visible_gpus)
            [ "${RANKS:-0}" -gt 0 ] || RANKS=1
        fi
    fi
    return 0
}

# The ranks and nodes of this job (or of mpirun outside SLURM).
fsdp_world() { echo "${SLURM_NTASKS:-${RANKS:-1}}"; }
fsdp_nodes() { echo "${SLURM_JOB_NUM_NODES:-1}"; }

# A short name of the model for folder names: the preset, or the folder of a config.json.
fsdp_model_tag() {
    local m=${MODEL%/}
    m=${m%/config.json}
    basename "$m"
}

# What a rank runs on, for folder names: gpu, or cpu with DEVICE=cpu (CPU ranks are not GPUs).
fsdp_unit() { if [ "${DEVICE:-cuda}" = cpu ]; then echo cpu; else echo gpu; fi; }

# RESULTS_DIR/KIND-<model>-<N>gpu[-<K>node] (<N>cpu on the CPU backend): the folder of one experiment.
fsdp_experiment_dir() {
    local dir
    dir="$RESULTS_DIR/$1-$(fsdp_model_tag)-$(fsdp_world)$(fsdp_unit)"
    [ "$(fsdp_nodes)" -gt 1 ] && dir="$dir-$(fsdp_nodes)node"
    echo "$dir"
}

# The launch line: one rank per GPU (the job's --ntasks-per-node), MPI starting NCCL, no torchrun.
fsdp_launcher() {
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        LAUNCHER=(srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1)
    else
        LAUNCHER=(mpirun -np "$RANKS" --bind-to none)
    fi
}

# fsdp_run RUN_DIR [fsdp train flags]: one configuration. Its output goes to RUN_DIR/train.log and to
# the job's log; a failure (out of memory, say) is recorded and the sweep goes on. With checkpoints
# a run continues where an earlier job (or this job before a requeue) stopped, and its train.log goes
# on too; without, it starts over. While it runs, FSDP_STEP_PID is the launcher's process (srun or
# mpirun), for a signal trap to forward signals to; a trapped signal does not end the wait for it.
fsdp_run() {
    local dir=$1 rc tail_pid log_from=1
    shift
    mkdir -p "$dir" || { FAILED_RUNS+=("$dir (cannot create it)"); return 1; }
    if [ -n "${FSDP_STOP_SIGNAL:-}" ]; then # (jobs/preempt.sh)
        echo "== $dir: not started: SIG$FSDP_STOP_SIGNAL came first"
        return 75
    fi
    local ckpt=() model=(--model "$MODEL") length=(--steps "$MAX_STEPS")
    [ -n "${EPOCHS:-}" ] && length=(--epochs "$EPOCHS")
    if [ "$CHECKPOINTS" = yes ]; then
        ckpt=(--ckpt-dir "$dir/ckpt" --resume auto)
        [ "$CKPT_EVERY" -gt 0 ] && ckpt+=(--ckpt-every "$CKPT_EVERY")
    elif [ -f "$dir/done" ]; then
        echo "== $dir: finished by an earlier job, skipped (remove the folder to run it again)"
        return 0
    fi
    # A pretrained start happens once: --init-from always starts over, so a run with checkpoints of
    # its own (a requeued job) goes on from them, with the model's shape from the same directory.
    if [ -n "${INIT_FROM:-}" ]; then
        if [ "$CHECKPOINTS" = yes ] && compgen -G "$dir/ckpt/step-*.h5" >/dev/null; then
            model=(--model "$INIT_FROM")
        else
            model=(--init-from "$INIT_FROM")
            [ "$CHECKPOINTS" = yes ] && ckpt=(--ckpt-dir "$dir/ckpt")
            [ "$CHECKPOINTS" = yes ] && [ "$CKPT_EVERY" -gt 0 ] && ckpt+=(--ckpt-every "$CKPT_EVERY")
        fi
    fi
    rm -f "$dir/done"
    local limit=()
    [ -n "${MEMORY_LIMIT:-}" ] && limit=(--memory-limit "$MEMORY_LIMIT")
    # shellcheck disable=SC2206
    local cmd=(train "${model[@]}" --seq "$SEQUENCE_LEN" "${length[@]}" --device "$DEVICE"
               --metrics "$dir/metrics.jsonl" "${limit[@]}" "${ckpt[@]}" "$@" $EXTRA_ARGS)
    fsdp_launcher
    echo "== $(date '+%F %T') $dir"
    echo "   ${LAUNCHER[*]} $FSDP_BIN ${cmd[*]}"
    if [ "$CHECKPOINTS" = yes ] && [ -s "$dir/train.log" ]; then
        log_from=$(($(wc -c <"$dir/train.log") + 1)) # the job's log shows this run's part only
    else
        : >"$dir/train.log"
    fi
    "${LAUNCHER[@]}" "$FSDP_BIN" "${cmd[@]}" >>"$dir/train.log" 2>&1 &
    FSDP_STEP_PID=$!
    # (a signal to every process of the job, scancel --full, must not end the copy to the job's log)
    (trap '' USR1 TERM; exec tail -c +"$log_from" -f --pid="$FSDP_STEP_PID" "$dir/train.log") &
    tail_pid=$!
    fsdp_wait_step "$FSDP_STEP_PID"
    rc=$?
    wait "$tail_pid" 2>/dev/null
    FSDP_STEP_PID=
    # srun exits 0 when it could not launch the ranks at all ("task 0 launch failed"): a run counts
    # as finished only with fsdp's last lines in this launch's part of the log.
    if [ "$rc" -eq 0 ] && ! tail -c +"$log_from" "$dir/train.log" |
            grep -q -e '^Training throughput: ' -e '^nothing to do: '; then
        echo "== $dir: ${LAUNCHER[0]} exited 0, but fsdp train did not finish (no 'Training throughput' line)"
        rc=1
    fi
    if [ "$rc" -eq 0 ]; then
        date '+finished %F %T' >"$dir/done"
    else
        FAILED_RUNS+=("$dir (exit $rc)")
    fi
    return "$rc"
}

# fsdp_report DIR: the course's tables and plots of DIR in DIR/report (tables only without gnuplot).
fsdp_report() {
    local plots=() price=()
    command -v gnuplot >/dev/null 2>&1 || { plots=(--plots=no); echo "== no gnuplot here: tables only"; }
    [ -n "${GPU_HOUR_PRICE:-}" ] && price=(--gpu-hour-price "$GPU_HOUR_PRICE")
    "$FSDP_BIN" report "$@" --out "${REPORT_DIR:-$1/report}" "${plots[@]}" "${price[@]}" ||
        FAILED_RUNS+=("fsdp report $*")
}

# The job's exit status: 0 when every run finished.
fsdp_finish() {
    if [ "${#FAILED_RUNS[@]}" -eq 0 ]; then
        echo "== all runs finished"
        exit 0
    fi
    echo "== failed:"
    printf '   %s\n' "${FAILED_RUNS[@]}"
    exit 1
}
