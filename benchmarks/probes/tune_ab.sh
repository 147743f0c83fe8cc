#!/usr/bin/env bash
# A GPU's dispatch table in one device call: `mxkit tune gemm` into $OUT/gemm_table.json, then the decode GEMMs and
# the MoE quick set timed under the packaged table and under it merged with the tuned file, alternating, so the
# tuned entry is judged against the one in force in the same process family and the same minutes.
#
#   OUT=results/tune bash benchmarks/probes/tune_ab.sh
#
#   TUNE_BUDGET   seconds for the tune (default 300; a tune cut short keeps the stages it finished)
#   TUNE_STAGES   its --stages (default every key but decode_w4a16)
#   AB_BUDGET     seconds for each timed run (default 70); ROUNDS  alternating rounds of the A/B (default 1)
# Files under $OUT: tune.log, gemm_table.json, and table_ab.sh's {base,table}{round}_{gemm,moe}.txt with their CSV /
# JSON folders; the last lines printed are a table of median µs per case, packaged -> table (< / > where they differ by
# more than 3%).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-results/tune}"
mkdir -p "$OUT" || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg TORCHINDUCTOR_COMPILE_THREADS=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
ST="${TUNE_STAGES:-decode_mma,a8w8_mma,w8a16_mma,w4a16_wgmma,w8a16_wgmma,moe}"
timeout -s INT -k 10 "${TUNE_BUDGET:-300}" python3 -m mxkit tune gemm --stages "$ST" --rep-ms 5 \
    --out "$OUT/gemm_table.json" >"$OUT/tune.log" 2>&1
echo "tune rc $? ($(grep -c '^\[' "$OUT/tune.log") stage lines)"
grep -iE '^\[|error' "$OUT/tune.log" | tail -n 12
[ -s "$OUT/gemm_table.json" ] || { echo "no gemm_table.json: nothing to compare"; exit 1; }
# the A/B: one round of each table (ROUNDS for more), table_ab.sh's timed runs and its table of µs
TABLE="$OUT/gemm_table.json" OUT="$OUT" ROUNDS="${ROUNDS:-1}" bash benchmarks/probes/table_ab.sh
