#!/usr/bin/env bash
# Device side: ncu profiles of one warm call of ours and of FlexAttention-FLASH (FlashAttention-4),
# side by side, into $OUT: per-kernel summaries (duration, tensor-pipe instructions, executed
# instructions, warps active, local-memory (spill) requests, registers), and ours' per-SASS-line
# source view (executed instructions and stall samples per line; opcode mixes are summed from it).
#   PROFILE_ARGS="--bwd --family full --seqlen 8192" [PROFILE_IMPLS="fm3 flex_flash"] scripts/gpu_profile.sh
# Needs ncu; Flex FLASH needs FM3_EXTRA_SITE (../shared/tools/fa4_anchor.sh). LIB_DIR as gpu_run.sh.
# The Flex FLASH side matches FlashAttention-4's main kernels by name (FlashAttention{Backward,Forward}Sm90);
# it has not yet run since bench_attention's mask_mods were fixed for the FLASH backend.
source "$(dirname "$0")/gpu_env.sh"
ARGS=${PROFILE_ARGS:---bwd --family full --seqlen 8192}
case "$ARGS" in *--bwd*) OURS="regex:flash_bwd_wgmma"; PEER="regex:BackwardSm90" ;;
                *) OURS="regex:flash_fwd_wgmma"; PEER="regex:ForwardSm90" ;; esac
METRICS=${METRICS:-gpu__time_duration.sum,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_local_op_st.sum,launch__registers_per_thread}
for impl in ${PROFILE_IMPLS:-fm3 flex_flash}; do
  name=$([ $impl = fm3 ] && echo "$OURS" || echo "$PEER")
  timeout 300 ncu --clock-control none --kernel-name "$name" --launch-skip 2 --launch-count 1 \
    --metrics "$METRICS" \
    ${NCU_EXTRA:-} python3 scripts/profile_case.py --impl $impl $ARGS > "$OUT/ncu_$impl.txt" 2>&1
  echo "== $impl rc=$?"; grep -E "flash|Flash|kernel|duration|gmma|inst_executed|local_op|registers|warps_active" "$OUT/ncu_$impl.txt" | cut -c1-400 | head -20
done
# Ours, per SASS line (executed instructions, stalls) for the hot loop.
timeout 300 ncu --clock-control none --kernel-name "$OURS" --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --import-source yes -o "$OUT/ours" -f \
  python3 scripts/profile_case.py --impl fm3 $ARGS > "$OUT/ncu_src.log" 2>&1
ncu --import "$OUT/ours.ncu-rep" --page source --csv --print-source sass > "$OUT/ours_sass.csv" 2> "$OUT/ours_sass.err"
echo "source view rc=$? lines=$(wc -l < "$OUT/ours_sass.csv")"; head -c 600 "$OUT/ours_sass.err"
gzip -f "$OUT/ours_sass.csv"; rm -f "$OUT/ours.ncu-rep"
