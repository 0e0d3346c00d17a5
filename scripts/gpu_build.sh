#!/usr/bin/env bash
# Build libfm3_cuda.so (the Hopper sm90a kernels behind the C ABI in ops/hopper/fm3_cuda.h) with the
# sources and nvcc flags of the Paddle op's CUDA build (paddle_fm3_build/recipe.py). Needs nvcc >= 12.3,
# PyYAML and the CUTLASS/CuTe headers of the PyPI package nvidia-cutlass (or CUTLASS_INC). No GPU needed.
#   scripts/gpu_build.sh [OUT_DIR=.devbuild]     -> OUT_DIR/libfm3_cuda.so, OUT_DIR/ptxas.log
# NVCC: the nvcc to run; FM3_NVCC_EXTRA, FM3_CU_SRCS: see recipe.py.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m paddle_fm3_build cuda-lib "${1:-$ROOT/.devbuild}"
