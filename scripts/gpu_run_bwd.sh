#!/usr/bin/env bash
# One device call for the backward: build the DLPack module against the machine's python3 on
# LIB_DIR/libfm3_cuda.so (built elsewhere with scripts/gpu_build.sh LIB_DIR), run the backward GPU
# tests, compute-sanitizer memcheck + racecheck on a small case, and the backward benchmark.
# Logs to ${OUT:-.devout}.
#   LIB_DIR=.devbuild BENCH="--seqlens 32768 --head-dims 128" scripts/gpu_run_bwd.sh
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.devout}"
LIB="${LIB_DIR:-$ROOT/.devbuild}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
scripts/build_dlpack_ext.sh "$LIB" 2>&1 | tail -1
if [ "${TESTS:-}" != "none" ]; then
  FM3_BWD_ERR_LOG="$OUT/bwd_errors.jsonl" timeout "${TEST_TIMEOUT:-200}" python3 -m pytest ${TESTS:--q tests/gpu/test_flashmask_bwd_gpu.py} \
    -p no:cacheprovider 2>&1 | tee "$OUT/bwd_tests.log" | tail -15
  python3 - "$OUT/bwd_errors.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
for dt in ("fp16", "bf16"):
    r = [x for x in rows if x["dtype"] == dt]
    if r:
        print(dt, len(r), "cases; max rel (Frobenius):", {k: round(max(x["rel"][k] for x in r), 5) for k in ("dq", "dk", "dv")},
              "max element-wise:", {k: round(max(x["elem"][k] for x in r), 5) for k in ("dq", "dk", "dv")})
PY
fi
if [ "${SANITIZE:-1}" = "1" ]; then
  for tool in memcheck racecheck; do
    timeout "${SAN_TIMEOUT:-90}" compute-sanitizer --tool $tool --error-exitcode 3 python3 tests/gpu/sanitize_bwd_case.py > "$OUT/bwd_sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$? $(tail -2 "$OUT/bwd_sanitizer_$tool.log" | tr '\n' ' ')"
  done
fi
if [ "${BENCH:-none}" != "none" ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 scripts/bench_attention.py --bwd $BENCH --out "$OUT/bwd_bench.json" 2>&1 | tee "$OUT/bwd_bench.log" | tail -16
fi
