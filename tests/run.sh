#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages), builds, and runs the whole suite.
# Tests labelled "gpu" report SKIPPED on a machine without a GPU. Extra arguments go to ctest
# (e.g. tests/run.sh -L gpu, tests/run.sh -R strategies).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh --tests
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
