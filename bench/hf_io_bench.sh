#!/usr/bin/env bash
# Hugging Face model I/O against the disk's own bandwidth, in one call (issue 9, item 6):
#   - dd: write (conv=fdatasync) and cold read of one file, the disk's bandwidth;
#   - for each model shape: a model directory of fsdp.c's random initial weights in bf16
#     (`fsdp export --model`), then for each rank count a cold `fsdp train --init-from DIR --steps 0`
#     (the load time and peak host memory per rank that fsdp.c reports) and a cold
#     `fsdp export --checkpoint DIR --out COPY` (read the directory, write it again);
#   - the same export with the source copied to /dev/shm (when it has room): only the write touches
#     the disk, so its rate compares with dd's write alone;
#   - with --from-checkpoint, also `fsdp export` of a real checkpoint of the first model.
# Caches are dropped before every timed step (/proc/sys/vm/drop_caches as root, else every file's
# pages with dd iflag=nocache). Writes bench/results/DATE-DEVICE-hf-io.{md,json}.
#
#   . .gpu-host/env.sh && bench/hf_io_bench.sh --dir /scratch/hfio --ranks 1,2
#
# Flags: --dir DIR (on the disk to measure; default ./hf-io-bench), --models a,b (presets; default
# llama-3.2-1b,llama-2-7b), --ranks 1,2, --dd-gib N (default 8), --device cuda|cpu,
# --from-checkpoint, --keep (leave the model directories), --results DIR (default bench/results).
# Needs about 3 x the largest model's bf16 size free (llama-2-7b: 13.5 GB each) plus the dd file.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FSDP=${FSDP_BIN:-$ROOT/build/fsdp}
MPIRUN=${MPIRUN:-mpirun}
DIR=$PWD/hf-io-bench MODELS=llama-3.2-1b,llama-2-7b RANKS=1,2 DD_GIB=8 DEVICE=cuda FROM_CKPT=0 KEEP=0
RESULTS=$ROOT/bench/results
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --dd-gib) DD_GIB=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --from-checkpoint) FROM_CKPT=1; shift ;;
    --keep) KEEP=1; shift ;;
    --results) RESULTS=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "hf_io_bench: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$FSDP" ] || { echo "hf_io_bench: $FSDP is not built" >&2; exit 1; }
mkdir -p "$DIR" "$RESULTS"
DIR=$(cd "$DIR" && pwd)
LOG=$DIR/bench.log
: > "$LOG"
CORES=$(nproc)

drop_caches() {  # files or directories whose cached pages must go
  sync
  if [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then return; fi
  find "$@" -type f -print0 2>/dev/null | while IFS= read -r -d '' f; do
    dd if="$f" iflag=nocache count=0 status=none 2>/dev/null || true
  done
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
record() { echo "$*" | tee -a "$LOG"; }
export_s() { echo "$1" | sed -n 's/^export: wrote .* in \([0-9.]*\) s (.*/\1/p' | tail -1; }  # fsdp export's own time   # lines "key value ..." that the report below reads

run_fsdp() {  # ranks, then fsdp arguments; output goes to the log
  local n=$1; shift
  OMP_NUM_THREADS=$(( CORES / n > 0 ? CORES / n : 1 )) \
    "$MPIRUN" -np "$n" --bind-to none "$FSDP" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "hf_io_bench: failed (exit $rc): fsdp $* (output in $LOG)" >&2
  return "$rc"
}

# ---- the disk ----
DD_FILE=$DIR/dd.bin
t0=$(now); dd if=/dev/zero of="$DD_FILE" bs=64M count=$(( DD_GIB * 16 )) conv=fdatasync status=none; dt=$(since "$t0")
record "dd_write $(( DD_GIB * 1073741824 )) $dt"
drop_caches "$DD_FILE"
t0=$(now); dd if="$DD_FILE" of=/dev/null bs=64M status=none; dt=$(since "$t0")
record "dd_read $(( DD_GIB * 1073741824 )) $dt"
rm -f "$DD_FILE"
record "disk $(df -P "$DIR" | awk 'NR==2 {print $1}') $(df -P -BG "$DIR" | awk 'NR==2 {print $4}')"

# ---- the models ----
first=1
for model in ${MODELS//,/ }; do
  md=$DIR/$model
  rm -rf "$md" "$md-copy"
  t0=$(now); run_fsdp "${RANKS##*,}" export --model "$model" --out "$md" --dtype bf16 > /dev/null; dt=$(since "$t0")
  record "model $model $(du -sb "$md" | cut -f1) $dt"
  for n in ${RANKS//,/ }; do
    drop_caches "$md"
    t0=$(now)
    out=$(run_fsdp "$n" train --init-from "$md" --steps 0 --seq 128 --mbs 1 --model-precision bf16 --device "$DEVICE")
    dt=$(since "$t0")
    line=$(echo "$out" | grep '^init-from: .* read by' | tail -1)
    load_s=$(echo "$line" | sed -n 's/.* in \([0-9.]*\) s .*/\1/p')
    peak=$(echo "$line" | sed -n 's/.*peak host memory per rank \([0-9.]*\) GiB.*/\1/p')
    record "load $model $n ${load_s:-nan} ${peak:-nan} $dt"
    drop_caches "$md"
    rm -rf "$md-copy"
    t0=$(now); out=$(run_fsdp "$n" export --checkpoint "$md" --out "$md-copy" --dtype bf16); dt=$(since "$t0")
    record "reexport $model $n $(du -sb "$md-copy" | cut -f1) $dt $(export_s "$out")"
    rm -rf "$md-copy"
  done
  # The same export with its source in memory (/dev/shm): the disk only writes, so the export's rate
  # compares with dd's write alone.
  need=$(du -sb "$md" | cut -f1)
  if [ -d /dev/shm ] && [ "$(df -P -B1 /dev/shm | awk 'NR==2 {print $4}')" -gt $(( need * 2 )) ]; then
    shm=/dev/shm/hf-io-bench-$model
    rm -rf "$shm"; cp -r "$md" "$shm"
    for n in ${RANKS//,/ }; do
      rm -rf "$md-copy"; sync
      t0=$(now); out=$(run_fsdp "$n" export --checkpoint "$shm" --out "$md-copy" --dtype bf16); dt=$(since "$t0")
      record "shmexport $model $n $(du -sb "$md-copy" | cut -f1) $dt $(export_s "$out")"
      rm -rf "$md-copy"
    done
    rm -rf "$shm"
  fi
  if [ "$FROM_CKPT" = 1 ] && [ $first = 1 ]; then
    ck=$DIR/$model-ckpt
    rm -rf "$ck"
    run_fsdp "${RANKS##*,}" train --init-from "$md" --steps 1 --seq 128 --mbs 1 --device "$DEVICE" --ckpt-dir "$ck" > /dev/null
    for n in ${RANKS//,/ }; do
      drop_caches "$ck"
      rm -rf "$md-copy"
      t0=$(now); out=$(run_fsdp "$n" export --checkpoint "$ck" --out "$md-copy" --dtype bf16); dt=$(since "$t0")
      record "ckptexport $model $n $(du -sb "$md-copy" | cut -f1) $dt $(export_s "$out")"
      rm -rf "$md-copy"
    done
    rm -rf "$ck"
  fi
  first=0
  [ "$KEEP" = 1 ] || rm -rf "$md"
done

# ---- the report ----
DEVICE_NAME=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || true)
[ -n "$DEVICE_NAME" ] || DEVICE_NAME=cpu
COMMAND="bench/hf_io_bench.sh --dir $DIR --models $MODELS --ranks $RANKS --dd-gib $DD_GIB --device $DEVICE"
[ "$FROM_CKPT" = 1 ] && COMMAND="$COMMAND --from-checkpoint"
python3 - "$LOG" "$RESULTS" "$DEVICE_NAME" "$COMMAND" "$(hostname)" <<'EOF'
import datetime, json, re, shutil, sys
log, results, device, command, host = sys.argv[1:]
rec = {"device": device, "host": host, "command": command, "date": datetime.date.today().isoformat(),
       "models": {}, "loads": [], "exports": []}
for line in open(log):
    f = line.split()
    if not f:
        continue
    if f[0] in ("dd_write", "dd_read"):
        rec[f[0] + "_MBps"] = int(f[1]) / float(f[2]) / 1e6
    elif f[0] == "disk":
        rec["disk"], rec["disk_free"] = f[1], f[2]
    elif f[0] == "model":
        rec["models"][f[1]] = {"bytes": int(f[2]), "export_from_init_s": float(f[3])}
    elif f[0] == "load":
        b = rec["models"][f[1]]["bytes"]
        load = max(float(f[3]), 1e-3)  # printed with 2 decimals
        rec["loads"].append({"model": f[1], "ranks": int(f[2]), "load_s": load, "load_MBps": b / load / 1e6,
                             "of_dd_read": b / load / 1e6 / rec["dd_read_MBps"], "peak_host_gib_per_rank": float(f[4]),
                             "peak_of_model": float(f[4]) * 2 ** 30 / b, "wall_s": float(f[5])})
    elif f[0] in ("reexport", "ckptexport", "shmexport"):
        b = int(f[3])
        wall = float(f[4])
        s = max(float(f[5]) if len(f) > 5 else wall, 1e-3)  # the export's own time, mpirun's start-up left out
        source = {"reexport": "hf", "ckptexport": "checkpoint", "shmexport": "hf in /dev/shm"}[f[0]]
        # What the disk must do: read the source (none from /dev/shm; a checkpoint's fp32 master
        # weights are twice the bf16 output) and write the output, at dd's rates one after the other.
        read = {"hf": b, "checkpoint": 2 * b, "hf in /dev/shm": 0}[source]
        disk_s = read / 1e6 / rec["dd_read_MBps"] + b / 1e6 / rec["dd_write_MBps"]
        rec["exports"].append({"model": f[1], "ranks": int(f[2]), "source": source, "bytes": b, "bytes_read": read,
                               "export_s": s, "wall_s": wall, "MBps": b / s / 1e6,
                               "of_dd_write": b / s / 1e6 / rec["dd_write_MBps"], "dd_disk_s": disk_s,
                               "of_disk": disk_s / s})
stem = "%s/%s-%s-hf-io" % (results, rec["date"], re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-"))
json.dump(rec, open(stem + ".json", "w"), indent=2)
md = ["# Hugging Face model I/O: %s (%s), %s" % (device, host, rec["date"]), "", "Command: `%s`" % command, "",
      "Disk %s: dd write %.0f MB/s (conv=fdatasync), dd cold read %.0f MB/s." %
      (rec.get("disk", "?"), rec["dd_write_MBps"], rec["dd_read_MBps"]), "",
      "| model | bf16 size GB | `export --model` (random init) s |", "|---|---|---|"]
for m, v in rec["models"].items():
    md.append("| %s | %.2f | %.1f |" % (m, v["bytes"] / 1e9, v["export_from_init_s"]))
md += ["", "Load (`train --init-from DIR --steps 0`, cold cache; time and memory as fsdp.c reports them):", "",
       "| model | ranks | load s | MB/s | of dd read | peak host GiB per rank | of model size | wall s |",
       "|---|---|---|---|---|---|---|---|"]
for l in rec["loads"]:
    md.append("| %s | %d | %.2f | %.0f | %.0f%% | %.2f | %.0f%% | %.1f |" % (
        l["model"], l["ranks"], l["load_s"], l["load_MBps"], 100 * l["of_dd_read"], l["peak_host_gib_per_rank"],
        100 * l["peak_of_model"], l["wall_s"]))
md += ["", "Export (cold cache; the time fsdp export reports, reading the source included; wall: the whole command). "
       "'disk time at dd's rates': the source's bytes read at dd's read rate plus the output written at dd's "
       "write rate, one after the other; from /dev/shm the disk only writes, so that row compares with dd's write "
       "alone:", "",
       "| model | ranks | from | GB read from disk | GB written | s | MB/s written | of dd write | disk time at dd's "
       "rates s | of the disk's speed | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
for e in rec["exports"]:
    md.append("| %s | %d | %s | %.2f | %.2f | %.2f | %.0f | %.0f%% | %.2f | %.0f%% | %.1f |" % (
        e["model"], e["ranks"], e["source"], e["bytes_read"] / 1e9, e["bytes"] / 1e9, e["export_s"], e["MBps"],
        100 * e["of_dd_write"], e["dd_disk_s"], 100 * e["of_disk"], e["wall_s"]))
open(stem + ".md", "w").write("\n".join(md) + "\n")
shutil.copyfile(log, stem + ".log")  # every command's own output: fsdp.c's progress and timing lines
print("hf_io_bench: wrote %s.md, .json and .log" % stem)
EOF
