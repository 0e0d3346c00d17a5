#!/usr/bin/env bash
# Device side: ncu profiles of one warm call of ours and of FlashAttention-4 (its own call for the
# mask, `fa4`, or FLASH-through-Flex, `flex_flash`),
# side by side, into $OUT: per-kernel summaries (duration, tensor-pipe instructions, executed
# instructions, warps active, local-memory (spill) requests, registers), and each one's per-SASS-line
# source view (executed instructions and stall samples per line), summed per opcode side by side by
# tools/sass_mix.py into $OUT/sass_mix.md; then all of it in one archive, $OUT/${PROFILE_TAG:-profile}.tar (a
# device call brings back only a few files; `tar xf` it, the per-line files are *_sass.csv.gz).
#   PROFILE_ARGS="--bwd --family full --seqlen 8192" [PROFILE_IMPLS="fm3 fa4"] [PROFILE_TAG=name] tools/gpu_profile.sh
# Needs ncu; fa4 and flex_flash need FM3_EXTRA_SITE (../shared/tools/fa4_anchor.sh). LIB_DIR as gpu_run.sh.
# The peer's side matches FlashAttention-4's main kernels by name (FlashAttention{Backward,Forward}Sm90).
source "$(dirname "$0")/gpu_env.sh"
ARGS=${PROFILE_ARGS:---bwd --family full --seqlen 8192}
case "$ARGS" in *--bwd*) OURS="regex:flash_bwd_wgmma"; PEER="regex:BackwardSm90" ;;
                *) OURS="regex:flash_fwd_wgmma"; PEER="regex:ForwardSm90" ;; esac
METRICS=${METRICS:-gpu__time_duration.sum,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_local_op_st.sum,launch__registers_per_thread}
for impl in ${PROFILE_IMPLS:-fm3 fa4}; do
  name=$([ $impl = fm3 ] && echo "$OURS" || echo "$PEER")
  timeout 300 ncu --clock-control none --kernel-name "$name" --launch-skip 2 --launch-count 1 \
    --metrics "$METRICS" \
    ${NCU_EXTRA:-} python3 tools/profile_case.py --impl $impl $ARGS > "$OUT/ncu_$impl.txt" 2>&1
  echo "== $impl rc=$?"; grep -E "flash|Flash|kernel|duration|gmma|inst_executed|local_op|registers|warps_active" "$OUT/ncu_$impl.txt" | cut -c1-400 | head -20
done
# Per SASS line (executed instructions, stalls), each implementation; tools/sass_mix.py sums them
# per opcode side by side.
for impl in ${PROFILE_IMPLS:-fm3 fa4}; do
  name=$([ $impl = fm3 ] && echo "$OURS" || echo "$PEER")
  timeout 300 ncu --clock-control none --kernel-name "$name" --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source yes -o "$OUT/$impl" -f \
    python3 tools/profile_case.py --impl $impl $ARGS > "$OUT/ncu_src_$impl.log" 2>&1
  ncu --import "$OUT/$impl.ncu-rep" --page source --csv --print-source sass > "$OUT/${impl}_sass.csv" 2> "$OUT/${impl}_sass.err"
  echo "source view $impl rc=$? lines=$(wc -l < "$OUT/${impl}_sass.csv")"; head -c 600 "$OUT/${impl}_sass.err"
  gzip -f "$OUT/${impl}_sass.csv"; rm -f "$OUT/$impl.ncu-rep"
done
python3 tools/sass_mix.py $(for impl in ${PROFILE_IMPLS:-fm3 fa4}; do echo "$OUT/${impl}_sass.csv.gz"; done) | tee "$OUT/sass_mix.md"
(cd "$OUT" && tar cf "${PROFILE_TAG:-profile}.tar" ncu_*.txt ncu_src_*.log ./*_sass.csv.gz ./*_sass.err sass_mix.md 2>/dev/null &&
  rm -f ncu_*.txt ncu_src_*.log ./*_sass.csv.gz ./*_sass.err sass_mix.md)
