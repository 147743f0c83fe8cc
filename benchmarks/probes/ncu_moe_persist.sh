#!/usr/bin/env bash
# Nsight Compute counters of ncu_moe_persist.py's wgmma launches; $OUT/ncu_moe_persist.txt
set -u
cd "$(dirname "$0")" || exit 2
M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread
M=$M,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.avg
M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,lts__t_sector_hit_rate.pct,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum
M=$M,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
for s in long_scoreboard wait math_pipe_throttle barrier membar drain no_instruction short_scoreboard lg_throttle \
         mio_throttle sleeping dispatch_stall not_selected selected; do
    M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
PYTHONPATH=../../src ncu --profile-from-start off --clock-control none -k regex:w4a16_wgmma --metrics "$M" \
    python3 ncu_moe_persist.py "$@" >"${OUT:-/tmp}/ncu_moe_persist_raw.txt" 2>&1
rc=$?
if grep -q "metric" "${OUT:-/tmp}/ncu_moe_persist_raw.txt" && [ $rc != 0 ]; then  # a metric this ncu lacks
    M=${M/,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active/}
    PYTHONPATH=../../src ncu --profile-from-start off --clock-control none -k regex:w4a16_wgmma --metrics "$M" \
        python3 ncu_moe_persist.py "$@" >"${OUT:-/tmp}/ncu_moe_persist_raw.txt" 2>&1
    rc=$?
fi
grep -E "ncu case|same bytes|w4a16_wgmma|__|ratio|rror" "${OUT:-/tmp}/ncu_moe_persist_raw.txt" | sed -E 's/ +/ /g' \
    | tee "${OUT:-/tmp}/ncu_moe_persist.txt"
exit $rc
