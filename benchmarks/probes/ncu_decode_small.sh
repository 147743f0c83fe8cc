#!/usr/bin/env bash
# Nsight Compute counters of ncu_decode_small.py's launches; $OUT/ncu_decode_small.txt
set -u
cd "$(dirname "$0")" || exit 2
M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers
M=$M,sm__cycles_active.avg,sm__cycles_elapsed.avg,sm__cycles_active.max,smsp__warps_active.avg.per_cycle_active
M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
M=$M,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
for s in long_scoreboard wait math_pipe_throttle barrier membar drain no_instruction short_scoreboard lg_throttle \
         branch_resolving dispatch_stall not_selected selected; do
    M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
ncu --profile-from-start off --clock-control none --metrics "$M" python3 ncu_decode_small.py "$@" \
    >"${OUT:-/tmp}/ncu_decode_small_raw.txt" 2>&1
rc=$?
if grep -q "metric" "${OUT:-/tmp}/ncu_decode_small_raw.txt" && [ $rc != 0 ]; then  # a metric this ncu lacks
    M=${M/,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active/}
    ncu --profile-from-start off --clock-control none --metrics "$M" python3 ncu_decode_small.py "$@" \
        >"${OUT:-/tmp}/ncu_decode_small_raw.txt" 2>&1
    rc=$?
fi
grep -E "ncu case|mxfp4|__|ratio" "${OUT:-/tmp}/ncu_decode_small_raw.txt" | sed -E 's/ +/ /g' \
    | tee "${OUT:-/tmp}/ncu_decode_small.txt"
exit $rc
