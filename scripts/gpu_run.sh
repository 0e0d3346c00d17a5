#!/usr/bin/env bash
# One device call: build the DLPack module against the machine's python3, run the GPU tests,
# compute-sanitizer on a small case, and the benchmark. Expects .devbuild/libfm3_cuda.so
# (built elsewhere with scripts/gpu_build.sh, or here if nvcc is present). Logs to ${OUT:-.devout}.
#   TESTS="-x -q tests/gpu" BENCH="--seqlens 32768 --head-dims 128" scripts/gpu_run.sh
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.devout}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -f .devbuild/libfm3_cuda.so ] || scripts/gpu_build.sh
scripts/build_dlpack_ext.sh 2>&1 | tail -3
if [ "${TESTS:-}" != "none" ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest ${TESTS:--q -x tests/gpu} -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -40
fi
if [ "${SANITIZE:-1}" = "1" ]; then
  for tool in memcheck racecheck; do
    timeout "${SAN_TIMEOUT:-90}" compute-sanitizer --tool $tool --error-exitcode 3 python3 tests/gpu/sanitize_case.py > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$? $(tail -2 "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
  done
fi
if [ "${BENCH:-none}" != "none" ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 scripts/bench_attention.py $BENCH --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
