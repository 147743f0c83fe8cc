#!/usr/bin/env bash
# A dispatch-table file against the packaged table, in one device call: `mxkit bench gemm` (and optionally
# `mxkit bench moe --quick`) run under the packaged table and under it merged with $TABLE, alternating for $ROUNDS
# rounds, so both are judged in the same minutes on the same GPU.
#
#   TABLE=benchmarks/h100-2026-12-05b/ring.json OUT=results/ab bash benchmarks/probes/table_ab.sh
#
#   TABLE      the table file to judge (required; the format of src/mxkit/kernels/matmul_tuning.json)
#   ROUNDS     alternating rounds (default 2)
#   GEMM_ARGS  the bench gemm selection (default: --decode --pairs w4a16,w8a16,mxfp8 --modes ready)
#   MOE        1 to time `bench moe --quick --modes w4a16` too (default 1)
#   AB_BUDGET  seconds for each timed run (default 70)
# Files under $OUT: {base,table}{round}_{gemm,moe}.txt and their CSV / JSON folders; the last lines printed are a
# table of median µs per case, packaged -> table (< / > where they differ by more than 3%).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-results/ab}"
: "${TABLE:?TABLE=path of the table file to judge}"
mkdir -p "$OUT" || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg TORCHINDUCTOR_COMPILE_THREADS=1
read -r -a GA <<<"${GEMM_ARGS:---decode --pairs w4a16,w8a16,mxfp8 --modes ready}"
B="${AB_BUDGET:-70}"
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in base table; do
        T=()
        [ "$v" = table ] && T=(--table "$TABLE")
        timeout -s INT -k 10 "$B" python3 -m mxkit bench gemm "${GA[@]}" --peers none --rep-ms 20 --plain \
            --out "$OUT/$v${r}_gemm" "${T[@]}" >"$OUT/$v${r}_gemm.txt" 2>&1
        echo "$v round $r gemm rc $?"
        [ "${MOE:-1}" = 1 ] || continue
        timeout -s INT -k 10 "$B" python3 -m mxkit bench moe --quick --modes w4a16 --peers none --rep-ms 20 --plain \
            --out "$OUT/$v${r}_moe" "${T[@]}" >"$OUT/$v${r}_moe.txt" 2>&1
        echo "$v round $r moe rc $?"
    done
done
python3 - "$OUT" <<'EOF2'
import csv, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])


def rows(v, what):  # {(op, fmt, shape): ([µs per round], path)} of the mxkit rows of the bench CSVs
    got = {}
    for path in sorted(out.glob(f"{v}*_{what}/bench_{what}.csv")):
        with path.open() as f:
            for r in csv.DictReader(f):
                if r["impl"] == "mxkit" and r["us"]:
                    got.setdefault((r["op"], r["fmt"], r["shape"]), ([], r["path"] or r["note"][:20]))[0].append(
                        float(r["us"]))
    return got


for what in ("gemm", "moe"):
    base, table = rows("base", what), rows("table", what)
    if not base:
        continue
    print(f"\n{what}: median µs packaged -> table (path)")
    for case, (us, p) in base.items():
        if case in table:
            b, t, tp = statistics.median(us), statistics.median(table[case][0]), table[case][1]
            flag = "  <" if t < 0.97 * b else ("  >" if t > 1.03 * b else "")
            print(f"  {' '.join(case):58s} {b:8.1f} -> {t:8.1f}  {p} -> {tp}{flag}")
EOF2
