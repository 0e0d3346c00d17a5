#!/usr/bin/env bash
# Build the pybind11 DLPack module paddle_fm3/kernels/_fm3_dlpack*.so against
# the running python3 (on the GPU machine: its Python 3.12) and place
# libfm3_cuda.so beside it. Needs pybind11 and a built libfm3_cuda.so (scripts/gpu_build.sh);
# no Paddle, no CUDA toolkit (the module only calls the C ABI). The CPU CP-planning kernel
# (ops/cpu/segment_workload.cc) is compiled in, so CP plans need no Paddle either.
#   scripts/build_dlpack_ext.sh [LIB_DIR=.devbuild]     (FM3_DLPACK_SRC overrides the source file,
#   FM3_DLPACK_DST the destination folder: default paddle_fm3/kernels of this checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LIB="${1:-$ROOT/.devbuild}"
DST="${FM3_DLPACK_DST:-$ROOT/paddle_fm3/kernels}"
python3 -m pybind11 --includes >/dev/null 2>&1 || { echo "build_dlpack_ext: pybind11 is missing (pip install pybind11)" >&2; exit 1; }
SUFFIX="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
cp "$LIB/libfm3_cuda.so" "$DST/libfm3_cuda.so"
${CXX:-c++} -O2 -std=c++17 -shared -fPIC $(python3 -m pybind11 --includes) \
  -I"$ROOT/ops/include" -I"$ROOT/ops/hopper" "${FM3_DLPACK_SRC:-$ROOT/ops/dlpack/fm3_dlpack.cc}" \
  "$ROOT/ops/cpu/segment_workload.cc" \
  -L"$DST" -lfm3_cuda -Wl,-rpath,'$ORIGIN' -o "$DST/_fm3_dlpack$SUFFIX"
echo "built $DST/_fm3_dlpack$SUFFIX"
