#!/usr/bin/env bash
# A dispatch-table file against the packaged table, in one device call: `mxkit bench gemm` (and optionally
# `mxkit bench moe --quick`) run under the packaged table and under it merged with $TABLE, for $ROUNDS rounds in
# ABBA order (base first in odd rounds, the table first in even ones), so both are judged in the same minutes on
# the same GPU.
#
#   TABLE=benchmarks/h100-2026-12-05b/ring.json OUT=results/ab bash benchmarks/probes/table_ab.sh
#
#   TABLE      the table file to judge (required; the format of src/mxkit/kernels/matmul_tuning.json)
#   ROUNDS     rounds (default 2)
#   GEMM_ARGS  the bench gemm selection (default: --decode --pairs w4a16,w8a16,mxfp8 --modes ready)
#   MOE        1 to time `bench moe --quick --modes w4a16` too (default 1)
#   AB_BUDGET  seconds for each timed run (default 70)
# Files under $OUT: {base,table}{round}_{gemm,moe}.txt and their CSV / JSON folders (this run's rounds replace
# those of an earlier run; only rounds 1..ROUNDS are read); the last lines printed are a table of median µs per
# case, packaged -> table, with the rounds each side measured (< / > where they differ by more than 3%).
set -u -o pipefail
: "${TABLE:?TABLE=path of the table file to judge}"
[ -r "$TABLE" ] || { echo "TABLE=$TABLE: no such file" >&2; exit 2; }
TABLE="$(cd "$(dirname "$TABLE")" && pwd)/$(basename "$TABLE")"
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-results/ab}"
ROUNDS="${ROUNDS:-2}"
mkdir -p "$OUT" || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg TORCHINDUCTOR_COMPILE_THREADS=1
read -r -a GA <<<"${GEMM_ARGS:---decode --pairs w4a16,w8a16,mxfp8 --modes ready}"
B="${AB_BUDGET:-70}"
run() {  # run VARIANT ROUND
    local v=$1 r=$2 T=()
    [ "$v" = table ] && T=(--table "$TABLE")
    rm -rf "$OUT/$v${r}_gemm" "$OUT/$v${r}_moe"
    timeout -s INT -k 10 "$B" python3 -m mxkit bench gemm "${GA[@]}" --peers none --rep-ms 20 --plain \
        --out "$OUT/$v${r}_gemm" ${T[@]+"${T[@]}"} >"$OUT/$v${r}_gemm.txt" 2>&1
    echo "$v round $r gemm rc $?"
    [ "${MOE:-1}" = 1 ] || return 0
    timeout -s INT -k 10 "$B" python3 -m mxkit bench moe --quick --modes w4a16 --peers none --rep-ms 20 --plain \
        --out "$OUT/$v${r}_moe" ${T[@]+"${T[@]}"} >"$OUT/$v${r}_moe.txt" 2>&1
    echo "$v round $r moe rc $?"
}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then run base "$r"; run table "$r"; else run table "$r"; run base "$r"; fi
done
WHATS=gemm
[ "${MOE:-1}" = 1 ] && WHATS=gemm,moe
python3 - "$OUT" "$ROUNDS" "$WHATS" <<'EOF2'
import csv, statistics, sys
from pathlib import Path

out, rounds, whats = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")


def rows(v, what):  # {(op, fmt, shape): ([µs per round], path)} of the mxkit rows of this run's bench CSVs
    got = {}
    for r in range(1, rounds + 1):
        path = out / f"{v}{r}_{what}" / f"bench_{what}.csv"
        if not path.exists():
            print(f"{v} round {r}: no {path.name} (the run failed or measured nothing)")
            continue
        with path.open() as f:
            for row in csv.DictReader(f):
                if row["impl"] == "mxkit" and row["us"]:
                    got.setdefault((row["op"], row["fmt"], row["shape"]), ([], row["path"] or row["note"][:20]))[
                        0].append(float(row["us"]))
    return got


for what in whats:
    base, table = rows("base", what), rows("table", what)
    if not base and not table:
        continue
    print(f"\n{what}: median µs packaged -> table (path) [rounds measured base/table]")
    for case in list(base) + [c for c in table if c not in base]:
        (b, p), (t, tp) = base.get(case, ([], "-")), table.get(case, ([], "-"))
        mb = statistics.median(b) if b else float("nan")
        mt = statistics.median(t) if t else float("nan")
        flag = "  <" if mt < 0.97 * mb else ("  >" if mt > 1.03 * mb else "")
        print(f"  {' '.join(case):58s} {mb:8.1f} -> {mt:8.1f}  {p} -> {tp}  [{len(b)}/{len(t)}]{flag}")
EOF2
