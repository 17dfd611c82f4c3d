# Preemption and the time limit, for job scripts (source it): the ranks of fsdp train stop at the end
# of a step with a checkpoint on SIGUSR1 or SIGTERM and exit with status 75 (src/train/preemption.h);
# the job then puts itself back in the queue, and --resume auto continues where it stopped.
#
#   #SBATCH --signal=B:USR1@120   # SIGUSR1 to the batch script two minutes before the time limit
#   #SBATCH --requeue
#   #SBATCH --open-mode=append
#   . jobs/common.sh                           # sources this file; fsdp_run waits with fsdp_wait_step
#   fsdp_forward_signals                       # before the launch
#   fsdp_run DIR ...; status=$?                # FSDP_STEP_PID names the launcher while it runs
#   fsdp_requeue_if_stopped "$status" && exit "$status"

# Forwards SIGUSR1 and SIGTERM that reach this script to the launcher (srun passes them on to the
# ranks); FSDP_STEP_PID names it.
fsdp_forward_signals() {
    trap '_fsdp_forward USR1' USR1
    trap '_fsdp_forward TERM' TERM
}

_fsdp_forward() {
    echo "fsdp.c: SIG$1: asking the ranks to checkpoint and stop"
    [ -n "${FSDP_STEP_PID:-}" ] && kill -"$1" "$FSDP_STEP_PID" 2>/dev/null
}

# fsdp_wait_step PID: the launcher's exit status. A trapped signal interrupts `wait` (status above
# 128) while the launcher runs on: wait again; if the launcher ended just then, take its own status.
fsdp_wait_step() {
    local status second
    while :; do
        wait "$1"
        status=$?
        [ "$status" -le 128 ] && break
        kill -0 "$1" 2>/dev/null && continue
        wait "$1" 2>/dev/null
        second=$?
        [ "$second" -ne 127 ] && status=$second
        break
    done
    return "$status"
}

# fsdp_requeue_if_stopped STATUS: on 75 (stopped by a signal, checkpoint written) puts this SLURM
# job back in the queue. Returns 0 when it did.
fsdp_requeue_if_stopped() {
    [ "$1" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] || return 1
    echo "fsdp.c: checkpoint written; requeueing job $SLURM_JOB_ID to continue with --resume auto"
    scontrol requeue "$SLURM_JOB_ID"
}
