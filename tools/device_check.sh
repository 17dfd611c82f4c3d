#!/usr/bin/env bash
# One check-and-measure pass on a GPU host (run from the repository root, with build-gpu/ (cmake -DFSDP_CUDA=ON -DFSDP_SHARED=ON) and
# .gpu-host/ carried along): environment, GPU unit tests, the GPU script tests, kernel and attention
# benchmarks, and short training runs. Everything is logged under $OUT (or /tmp/fsdp-check).
# Needs: nvidia-smi, the host's mpirun, python3 with torch (and transformers for gpu_hf_*), the
# build in $BUILD (default build-gpu) made on the Debian machine, and .gpu-host (../shared/gpu-host).
#   tools/device_check.sh [env|tests|scripts|train|bench] ...   (SCRIPTS="gpu_a gpu_b" picks scripts,
#   UNIT_TESTS="test_gpu_a ..." the unit tests; default: every test_gpu_* built)
set -uo pipefail
OUT=${OUT:-/tmp/fsdp-check}
mkdir -p "$OUT"
. .gpu-host/env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
B=${BUILD:-build-gpu}
step() { echo; echo "=== $* ($(date +%T))"; }

for what in "${@:-quick}"; do
  case "$what" in
    env)
      step env
      nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
      ldd $B/fsdp | grep -E "not found|mpi|hdf5|nccl|cublas|cudart"
      $B/fsdp --version ;;
    tests)
      step unit tests
      for t in ${UNIT_TESTS:-$(cd $B/tests && ls test_gpu_* 2>/dev/null)}; do
        [ -x $B/tests/$t ] || { echo "$t: not built in $B"; continue; }
        timeout 300 $B/tests/$t > "$OUT/$t.log" 2>&1; echo "$t exit $?"
        grep -E "FAIL|failed|SKIPPED" "$OUT/$t.log" | head -20
      done ;;
    scripts)
      # The CTest files name this machine's paths: run the scripts directly, with CTest's environment.
      export FSDP_BIN=$PWD/$B/fsdp FSDP_SOURCE_DIR=$PWD FSDP_TOOLS_DIR=$PWD/$B/tests PYTHON=python3
      export FSDP_TEST_TMP=/tmp/fsdp-tests OMPI_MCA_rmaps_base_oversubscribe=1
      mkdir -p "$FSDP_TEST_TMP"
      for s in ${SCRIPTS:-$(cd tests/scripts && ls gpu_*.py | sed 's/\.py$//')}; do
        step "script $s"
        timeout 600 python3 tests/scripts/$s.py > "$OUT/$s.log" 2>&1; echo "$s exit $?"
        grep -E "FAIL|SKIPPED|passed|failed" "$OUT/$s.log" | tail -12
      done ;;
    bench)
      step attention bench
      timeout 120 $B/bench/attention_bench 2>&1 | tail -12 ;;
    train)
      step llama-3.2-1b mbs 32
      timeout 300 mpirun -np 1 --bind-to none $B/fsdp train --model llama-3.2-1b --mbs 32 --seq 1024 --steps 8 \
        --lr 1e-5 --device cuda --metrics "$OUT/llama1b.jsonl" 2>&1 | tail -14 ;;
    *) echo "unknown step $what" ;;
  esac
done
