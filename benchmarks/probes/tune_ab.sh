#!/usr/bin/env bash
# A GPU's dispatch table in one device call: `mxkit tune gemm` into $OUT/gemm_table.json, then the decode GEMMs and
# the MoE quick set timed under the packaged table and under it merged with the tuned file, alternating, so the
# tuned entry is judged against the one in force in the same process family and the same minutes.
#
#   OUT=results/tune bash benchmarks/probes/tune_ab.sh
#
#   TUNE_BUDGET   seconds for the tune (default 300; a tune cut short keeps the stages it finished)
#   TUNE_STAGES   its --stages (default every key but decode_w4a16)
#   AB_BUDGET     seconds for each timed run (default 70)
# Files under $OUT: tune.log, gemm_table.json, {base,tuned}_{gemm,moe}.txt and their CSV / JSON folders; the last
# lines printed are a table of µs per case, packaged -> tuned (< / > where they differ by more than 3%).
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
B="${AB_BUDGET:-70}"
for v in base tuned; do
    T=()
    [ "$v" = tuned ] && T=(--table "$OUT/gemm_table.json")
    timeout -s INT -k 10 "$B" python3 -m mxkit bench gemm --decode --pairs w4a16,w8a16,mxfp8 --modes ready \
        --peers none --rep-ms 20 --plain --out "$OUT/${v}_gemm" "${T[@]}" >"$OUT/${v}_gemm.txt" 2>&1
    echo "$v gemm rc $?"
    timeout -s INT -k 10 "$B" python3 -m mxkit bench moe --quick --modes w4a16 --peers none --rep-ms 20 --plain \
        --out "$OUT/${v}_moe" "${T[@]}" >"$OUT/${v}_moe.txt" 2>&1
    echo "$v moe rc $?"
done
python3 - "$OUT" <<'EOF2'
import csv, sys
from pathlib import Path

out = Path(sys.argv[1])


def rows(path):  # {(op, fmt, shape): (µs, path)} of the mxkit rows of a bench CSV
    if not path.exists():
        return {}
    with path.open() as f:
        return {(r["op"], r["fmt"], r["shape"]): (float(r["us"]), r["path"] or r["note"][:20])
                for r in csv.DictReader(f) if r["impl"] == "mxkit" and r["us"]}


for what in ("gemm", "moe"):
    base, tuned = rows(out / f"base_{what}" / f"bench_{what}.csv"), rows(out / f"tuned_{what}" / f"bench_{what}.csv")
    print(f"\n{what}: µs packaged -> tuned (path)")
    for case, (us, p) in base.items():
        if case in tuned:
            t, tp = tuned[case]
            flag = "  <" if t < 0.97 * us else ("  >" if t > 1.03 * us else "")
            print(f"  {' '.join(case):58s} {us:8.1f} -> {t:8.1f}  {p} -> {tp}{flag}")
EOF2
