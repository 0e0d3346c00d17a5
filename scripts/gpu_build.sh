#!/usr/bin/env bash
# Build libfm3_cuda.so (the Hopper sm90a kernels behind the C ABI in
# ops/hopper/fm3_cuda.h). Needs nvcc >= 12.3 and, on the include path, the CUTLASS/CuTe
# headers of the PyPI package nvidia-cutlass (cutlass_library/source/include). No GPU needed.
#   scripts/gpu_build.sh [OUT_DIR=.devbuild]     -> OUT_DIR/libfm3_cuda.so, OUT_DIR/ptxas.log
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/.devbuild}"
NVCC="${NVCC:-nvcc}"
mkdir -p "$OUT/gen"
# paddle_fm3/_config.py too: the GPU tests take their head dims from it.
python3 "$ROOT/scripts/gen_ops.py" --out-dir "$OUT/gen" --py-config "$ROOT/paddle_fm3/_config.py"
CUTLASS_INC="${CUTLASS_INC:-$(python3 - <<'PY' 2>/dev/null || true
import os, cutlass_library
print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))
PY
)}"
INC=(-I"$ROOT/ops/include" -I"$ROOT/ops/hopper" -I"$OUT/gen")
[ -n "$CUTLASS_INC" ] && [ -d "$CUTLASS_INC" ] && INC+=(-I"$CUTLASS_INC")
FLAGS=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -lineinfo
       -Xptxas -v --expt-relaxed-constexpr ${FM3_NVCC_EXTRA:-})  # FM3_NVCC_EXTRA: extra nvcc flags (e.g. -DFM3_NO_WGMMA=1)
# FM3_CU_SRCS (space-separated) overrides the source list, e.g. to leave out a file being written.
read -r -a SRCS <<< "${FM3_CU_SRCS:-$(echo "$ROOT"/ops/hopper/*.cu)}"
"$NVCC" "${FLAGS[@]}" "${INC[@]}" -shared "${SRCS[@]}" -o "$OUT/libfm3_cuda.so" \
  2> >(tee "$OUT/ptxas.log" >&2)
echo "built $OUT/libfm3_cuda.so"
