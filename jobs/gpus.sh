# jobs/gpus.sh: sourced by jobs/common.sh and jobs/quickstart.sh. How many GPUs this process may use
# outside SLURM: the ones nvidia-smi lists, cut down to those CUDA_VISIBLE_DEVICES leaves visible (CUDA
# numbers only those, so a rank per listed GPU on a host shared by CUDA_VISIBLE_DEVICES=1 would find
# "2 ranks on this node but only 1 GPU(s)"). Set and empty (or -1) hides every GPU, as in CUDA.

# fsdp_visible_gpus: prints the number (0 without nvidia-smi or without a GPU).
fsdp_visible_gpus() {
    local listed=0 visible
    if command -v nvidia-smi >/dev/null 2>&1; then
        listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    fi
    listed=${listed:-0}
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        # CUDA stops at the first entry that names no GPU ("-1", or an empty list): count up to it.
        visible=0
        local entry entries
        IFS=, read -r -a entries <<<"$CUDA_VISIBLE_DEVICES"
        for entry in "${entries[@]}"; do
            entry=${entry// /}
            case $entry in ''|-*) break ;; esac
            visible=$((visible + 1))
        done
        [ "$visible" -lt "$listed" ] && listed=$visible
    fi
    echo "$listed"
}
