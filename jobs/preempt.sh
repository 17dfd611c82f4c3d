# Preemption and the time limit, for job scripts (source it): the ranks of fsdp train stop at the end
# of a step with a checkpoint on SIGUSR1 or SIGTERM and exit with status 75 (src/train/preemption.h);
# the job then puts itself back in the queue, and --resume auto continues where it stopped.
#
#   #SBATCH --signal=B:USR1@120   # SIGUSR1 to the batch script two minutes before the time limit
#   #SBATCH --requeue
#   #SBATCH --open-mode=append
#   . jobs/common.sh                           # sources this file; fsdp_run waits with fsdp_wait_step
#   fsdp_forward_signals                       # at once, before fsdp_setup
#   fsdp_run DIR ...; status=$?                # FSDP_STEP_PID names the launcher while it runs
#   fsdp_requeue_if_stopped "$status" DIR && exit "$status"

# Forwards SIGUSR1 and SIGTERM that reach this script to the launcher, FSDP_STEP_PID, as SIGUSR1:
# srun and mpirun pass SIGUSR1 on to the ranks, but answer SIGTERM by killing them (srun cancels
# its step). Call it first thing: a signal that comes before the launch (while
# FSDP_SETUP loads modules, say) is kept in FSDP_STOP_SIGNAL, and fsdp_run then starts nothing and
# returns 75, so that the job is requeued as after a checkpoint.
fsdp_forward_signals() {
    trap '_fsdp_forward USR1' USR1
    trap '_fsdp_forward TERM' TERM
}

_fsdp_forward() {
    if [ -n "${FSDP_STEP_PID:-}" ]; then
        local as=
        [ "$1" = USR1 ] || as=" (SIGUSR1 to the launcher)"
        echo "fsdp.c: SIG$1: asking the ranks to checkpoint and stop$as"
        kill -USR1 "$FSDP_STEP_PID" 2>/dev/null
    else
        echo "fsdp.c: SIG$1 before the run started: not starting it"
        # shellcheck disable=SC2034 # read by fsdp_run (jobs/common.sh)
        FSDP_STOP_SIGNAL=$1
    fi
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

# fsdp_requeue_if_stopped STATUS [RUN_DIR]: on 75 (stopped by a signal with its checkpoint written,
# or not started) puts this SLURM job back in the queue. Returns 0 when it did. The requeued job
# keeps its id (and so its run folders, named from it), appends to the same output files
# (--open-mode=append) and may start after SLURM's requeue delay (by default 120 s); SLURM ends this
# copy of the script at once.
fsdp_requeue_if_stopped() {
    [ "$1" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] || return 1
    echo "fsdp.c: exit status 75 (stopped by a signal): requeueing job $SLURM_JOB_ID to continue with" \
         "--resume auto"
    scontrol requeue "$SLURM_JOB_ID" && return 0
    echo "fsdp: error: scontrol requeue $SLURM_JOB_ID failed (a job submitted with --no-requeue, or" \
         "JobRequeue=0 without --requeue): to continue from its checkpoint, submit the job again${2:+ with" \
         "RUN_DIR=$2}" >&2
    return 1
}
