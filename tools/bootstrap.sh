#!/usr/bin/env bash
# Installs what fsdp.c needs from Debian's packages (only the ones missing) and builds it in build/.
#   tools/bootstrap.sh            # packages to build and run
#   tools/bootstrap.sh --tests    # also what the test suite needs: PyTorch and h5py for /usr/bin/python3, GNU time,
#                                 # zstd (Zstd pages of the Parquet test's files),
#                                 # strace (safe_outputs.py slows an export's renames with it), gnuplot for fsdp report, SLURM and munge for the one-node cluster of slurm_sweeps.py,
#                                 # and tools/fixtures.sh (Node.js, tokenizer files, text, Hugging Face tokenizers)
# The CUDA backend is built when nvcc (CUDA 12.8+ toolkit with NCCL) is found; pass FSDP_CMAKE_ARGS to override,
# e.g. FSDP_CMAKE_ARGS=-DFSDP_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libjansson-dev
          libpcre2-dev libsnappy-dev libzstd-dev zlib1g-dev libutf8proc-dev)
if [ "${1:-}" = "--tests" ]; then
  packages+=(python3-torch python3-h5py python3-numpy time strace zstd)
  packages+=(gnuplot-nox fonts-dejavu-core slurmctld slurmd slurm-client munge libpmix2)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nvcc lives outside PATH in a default CUDA install.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# The tokenizer tests' fixtures (real tokenizer.json files, English text, Hugging Face tokenizers as a
# Node module): fetched once into build/fixtures (or $FSDP_FIXTURES), kept across runs.
if [ "${1:-}" = "--tests" ]; then
  tools/fixtures.sh >/dev/null
fi
# shellcheck disable=SC2086
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${FSDP_CMAKE_ARGS:-} >/dev/null
cmake --build build
