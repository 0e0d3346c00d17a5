#!/usr/bin/env bash
# One device call comparing kernel builds side by side: builds the DLPack module once, then for each
# round and each build swaps its libfm3_cuda.so in (the C ABI is the same) and runs the same
# benchmark, so every build sees the same machine and the rounds show the run-to-run spread.
# Optionally runs the GPU tests and compute-sanitizer on some builds first (tools/gpu_run.sh; TESTS,
# SANITIZE and its timeouts as there).
#   BUILDS=".devbuild .vb1" [ROUNDS=2] [TEST_BUILDS=".vb1"] [TESTS="-q tests/gpu/test_flashmask_bwd_gpu.py"] \
#   BENCH_ARGS="--bwd --total-tokens 32768 --seqlens 8192 --head-dims 128 --families full,causal --flex-backends none" \
#   tools/gpu_ab.sh
# Each build folder holds a libfm3_cuda.so from scripts/gpu_build.sh (carry them, and
# paddle_fm3/_config.py; or carry .devcarry/NAME.so.xz, unpacked to .devbuild_NAME by
# tools/gpu_env.sh). An entry DIR@VAR=VALUE runs DIR's library with that environment variable set
# (e.g. ".vb1@FM3_BWD_GRID=items": one build, two launch modes). At the end every run's rows are in
# $OUT/ab_rows.json (each row with its "build" entry and "round") and the runs' logs in $OUT/ab_logs.tar.gz:
# two files, whatever the number of runs (a device call brings back only a few).
source "$(dirname "$0")/gpu_env.sh"
read -r -a builds <<< "${BUILDS:?BUILDS: the build folders to compare}"
mapfile -t bench_args < <(shell_words "${BENCH_ARGS:?BENCH_ARGS: bench_attention.py arguments}")
use() { cp "$1/libfm3_cuda.so" paddle_fm3/kernels/libfm3_cuda.so; }
for b in ${TEST_BUILDS:-}; do  # GPU tests and compute-sanitizer: tools/gpu_run.sh on that build
  echo "== tests $b"
  LIB_DIR="$b" OUT="$OUT/tests_$(basename "$b" | tr -d .)" BENCH= BENCH_BWD= tools/gpu_run.sh
done
scripts/build_dlpack_ext.sh "${builds[0]%%@*}" | tail -1
for r in $(seq 1 "${ROUNDS:-2}"); do
  for entry in "${builds[@]}"; do
    b="${entry%%@*}"
    env_set=()
    [ "$entry" != "$b" ] && env_set=("${entry#*@}")
    use "$b"
    echo "== $entry round $r"
    name="$(basename "$b" | tr -d .)${env_set:+_${entry##*=}}_r$r"
    env "${env_set[@]}" timeout "${BENCH_TIMEOUT:-200}" python3 tools/bench_attention.py \
      "${bench_args[@]}" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && echo "timed out after ${BENCH_TIMEOUT:-200} s" >> "$OUT/$name.log"  # a hang leaves no other trace
    grep "^| [0-9]" "$OUT/$name.log" || tail -5 "$OUT/$name.log"  # the rows, or why there are none
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
rows = []
for f in sorted(out.glob("*_r[0-9]*.json")):
    build, rnd = re.fullmatch(r"(.+)_r(\d+)", f.stem).groups()
    rows += [dict(r, build=build, round=int(rnd)) for r in json.loads(f.read_text())]
    f.unlink()
(out / "ab_rows.json").write_text(json.dumps(rows, indent=1))
print(f"{len(rows)} rows in {out / 'ab_rows.json'}")
PY
(cd "$OUT" && ls ./*_r[0-9]*.log >/dev/null 2>&1 && tar czf ab_logs.tar.gz ./*_r[0-9]*.log && rm -f ./*_r[0-9]*.log)
