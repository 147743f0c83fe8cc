#!/usr/bin/env bash
# Nsight Compute counters for the production kernels (scripts/ncu_cases.py: quantize, dequantize and GEMM at
# 8192), one line per metric; output in ${OUT:-results/gpu}/ncu.txt.
#   scripts/gpu_ncu.sh [--set field=value,...] [case names, e.g. "rows fp4" "gemm fp4"]
set -u
cd "$(dirname "$0")/.." || exit 2
RESULTS="${OUT:-results/gpu}"
mkdir -p "$RESULTS"
M=dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,gpu__time_duration.sum
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
M=$M,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum,dram__bytes_write.sum,dram__bytes_read.sum
M=$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
M=$M,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
# pipe mix (which pipe bounds an ALU-heavy kernel)
M=$M,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_lsu.sum
M=$M,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active
M=$M,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum
# NCU_L2_BREAKDOWN=1: the sub-units of lts__throughput instead (e.g. lts__ltcfabric2ltc_cycles_active, the
# fabric between the H200's two L2 partitions)
if [ "${NCU_L2_BREAKDOWN:-0}" = 1 ]; then
    M=breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_requests.sum,lts__t_sectors.sum
fi
PYTHONPATH=src ncu --profile-from-start off --clock-control none --metrics "$M" \
    python3 scripts/ncu_cases.py "$@" >"$RESULTS/ncu_raw.txt" 2>&1
rc=$?
grep -E "ncu case|_kernel|__|ratio|lts" "$RESULTS/ncu_raw.txt" | sed -E 's/ +/ /g' >"$RESULTS/ncu.txt"
cat "$RESULTS/ncu.txt"
exit $rc
