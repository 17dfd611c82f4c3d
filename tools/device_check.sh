#!/usr/bin/env bash
# One check-and-measure pass on a GPU host: environment, GPU unit tests, the GPU script tests, the
# attention benchmark, a short training run. Each step's output goes to the console, the tests' full
# logs under OUT (default /tmp/fsdp-check).
#
#   BUILD=build-gpu [OUT=DIR] [SCRIPTS="gpu_a gpu_b"] tools/device_check.sh STEP...
#   STEP: env | tests | scripts | bench | train, any of them in order (name at least one)
#
# What it needs:
#  - to be run from the repository root, on a host with an NVIDIA GPU (nvidia-smi), its own CUDA,
#    NCCL and mpirun, and python3 with torch for the gpu_* scripts (transformers for gpu_hf_*);
#  - a CUDA build made beforehand on the Debian build machine and carried along with the tree, in the
#    folder BUILD names (default build-gpu):
#      cmake -S . -B build-gpu -G Ninja -DFSDP_CUDA=ON -DFSDP_SHARED=ON && cmake --build build-gpu
#  - the runtime pack .gpu-host/ carried along too (parallel HDF5 and Jansson, which such a host
#    lacks), made on the build machine by ../shared/gpu-host/pack.sh libjansson4 (README, "Building
#    by hand"); the script sources .gpu-host/env.sh.
# SCRIPTS picks the script tests of the scripts step (default every tests/scripts/gpu_*.py), UNIT_TESTS
# the unit tests of the tests step (default every test_gpu_* built).
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
