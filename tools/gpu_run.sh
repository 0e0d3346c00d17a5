#!/usr/bin/env bash
# One device call: build the DLPack module against the machine's python3 on LIB_DIR/libfm3_cuda.so
# (built elsewhere with scripts/gpu_build.sh, carried), run the GPU tests (forward and backward; every
# case's backward errors summarized), compute-sanitizer memcheck + racecheck on small forward and
# backward cases, and the benchmarks. Logs to ${OUT:-.devout}. Each stage has a timeout, so a hang
# shows as one and the later stages still run.
#   TESTS='-x -q tests/gpu -k "d80 or d96"' BENCH="--seqlens 32768 --head-dims 128" \
#   BENCH_BWD="--total-tokens 32768 --seqlens 32768 --head-dims 128 --rep 3" tools/gpu_run.sh
# TESTS=none / SANITIZE=0 skip a stage (SAN_CASES: which of tests/gpu/sanitize_*.py, default both); BENCH /
# BENCH_BWD unset skip the forward / backward benchmark.
source "$(dirname "$0")/gpu_env.sh"
LIB="${LIB_DIR:-$ROOT/.devbuild}"
[ -f "$LIB/libfm3_cuda.so" ] || scripts/gpu_build.sh "$LIB"
scripts/build_dlpack_ext.sh "$LIB" 2>&1 | tail -1
if [ "${TESTS:-}" != "none" ]; then
  rm -f "$OUT/bwd_errors.jsonl"
  mapfile -t test_args < <(shell_words "${TESTS:--q tests/gpu}")
  FM3_BWD_ERR_LOG="$OUT/bwd_errors.jsonl" timeout "${TEST_TIMEOUT:-300}" python3 -m pytest "${test_args[@]}" \
    -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -30
  python3 - "$OUT/bwd_errors.jsonl" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
for dt in ("fp16", "bf16"):
    r = [x for x in rows if x["dtype"] == dt]
    if r:
        print("bwd", dt, len(r), "cases; max rel (Frobenius):", {k: round(max(x["rel"][k] for x in r), 5) for k in ("dq", "dk", "dv")},
              "max element-wise:", {k: round(max(x["elem"][k] for x in r), 5) for k in ("dq", "dk", "dv")})
PY
fi
if [ "${SANITIZE:-1}" = "1" ]; then
  for case in ${SAN_CASES:-sanitize_case sanitize_bwd_case}; do
    for tool in memcheck racecheck; do
      timeout "${SAN_TIMEOUT:-90}" compute-sanitizer --tool $tool --error-exitcode 3 python3 tests/gpu/$case.py \
        > "$OUT/${case}_$tool.log" 2>&1
      echo "compute-sanitizer $tool $case rc=$? $(tail -2 "$OUT/${case}_$tool.log" | tr '\n' ' ')"
    done
  done
fi
if [ -n "${BENCH:-}" ]; then
  mapfile -t bench_args < <(shell_words "$BENCH")
  timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench_attention.py "${bench_args[@]}" --out "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" | tail -30
fi
if [ -n "${BENCH_BWD:-}" ]; then
  mapfile -t bench_args < <(shell_words "$BENCH_BWD")
  timeout "${BENCH_TIMEOUT:-300}" python3 tools/bench_attention.py --bwd "${bench_args[@]}" --out "$OUT/bwd_bench.json" 2>&1 \
    | tee "$OUT/bwd_bench.log" | tail -20
fi
