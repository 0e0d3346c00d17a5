#!/usr/bin/env bash
# Build the pybind11 DLPack module paddle_fm3/kernels/_fm3_dlpack*.so against the running python3 (on
# the GPU machine: its Python 3.12) and place libfm3_cuda.so beside it (paddle_fm3_build/recipe.py).
# Needs pybind11 and a built libfm3_cuda.so (scripts/gpu_build.sh); no Paddle, no CUDA toolkit (the
# module only calls the C ABI). The CPU CP-planning kernel (ops/cpu/segment_workload.cc) is compiled in,
# so CP plans need no Paddle either.
#   scripts/build_dlpack_ext.sh [LIB_DIR=.devbuild]     (FM3_DLPACK_SRC overrides the source file,
#   FM3_DLPACK_DST the destination folder: default paddle_fm3/kernels of this checkout; CXX the compiler)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m paddle_fm3_build dlpack "${1:-$ROOT/.devbuild}"
