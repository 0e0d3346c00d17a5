#!/usr/bin/env bash
# Fresh machine -> test results: set up the env, build, check that the CUDA
# sources compile for sm90a and that setup.py's CUDA branch builds the Paddle op
# (both skipped without nvcc), build the DLPack module on the sm90a build, run the
# CPU test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/setup_env.sh
. "$ROOT/scripts/setup_env.sh"
BUILD="$ROOT/build/fm3_cuda"
rm -f "$BUILD/libfm3_cuda.so"
FM3_BUILD_DIR="$BUILD" bash "$ROOT/scripts/check_cuda_compile.sh"
# setup.py's CUDA branch (the Paddle op with the Hopper kernels) against this Paddle told it has CUDA.
bash "$ROOT/scripts/check_paddle_cuda_build.sh"
# With the CUDA library built (no GPU needed), also build the DLPack module into the installed
# package, so the tests of its host-side entry (CP planning without Paddle) run too.
if [ -f "$BUILD/libfm3_cuda.so" ]; then
  FM3_DLPACK_DST="$(cd / && python -c 'import os, paddle_fm3.kernels as k; print(os.path.dirname(k.__file__))')" \
    bash "$ROOT/scripts/build_dlpack_ext.sh" "$BUILD"
fi
cd "$ROOT"
# Plain `pytest` (not `python -m pytest`) so the installed package is tested, not the source tree.
pytest -q --timeout 900 "$@"
