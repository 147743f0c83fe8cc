#!/usr/bin/env bash
# The leaner hot runner (probes/hot_runner_flags.patch) against the working tree's, in one device call: the hot
# runner GPU tests under both sources, then `mxkit bench overhead` on quantize / cast_transpose in ABAB rounds
# (old first in odd rounds, new first in even ones), each a fresh process.
#
#   OUT=results/hot bash benchmarks/probes/hot_runner_ab.sh
#
#   ROUNDS  rounds (default 4)   CALLS  --calls of each overhead run (default 3000)
# Files under $OUT: tests_{old,new}.txt, {old,new}{round}.txt; the last lines printed are the × `x * 2` of each
# call and round, old | new.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-results/hot}"
ROUNDS="${ROUNDS:-4}"
mkdir -p "$OUT" || exit 2
NEW=$(mktemp -d)/src
cp -r src "$NEW" && (cd "$(dirname "$NEW")" && patch -s -p1 <"$OLDPWD/benchmarks/probes/hot_runner_flags.patch") \
    || { echo "the patch does not apply" >&2; exit 2; }
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
for v in old new; do
    S=$PWD/src; [ "$v" = new ] && S=$NEW
    PYTHONPATH=$S timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernel_tests/test_bound_launch.py \
        >"$OUT/tests_$v.txt" 2>&1
    echo "tests $v rc $? $(tail -1 "$OUT/tests_$v.txt")"
done
for r in $(seq 1 "$ROUNDS"); do
    order="old new"; [ $((r % 2)) = 0 ] && order="new old"
    for v in $order; do
        S=$PWD/src; [ "$v" = new ] && S=$NEW
        PYTHONPATH=$S timeout 60 python3 -m mxkit bench overhead --only 'quantize mxfp4,cast_transpose' --plain \
            --calls "${CALLS:-3000}" >"$OUT/$v$r.txt" 2>&1
        echo "$v round $r rc $?"
    done
done
echo "== host us median / x (x * 2) per call, old | new (rounds 1..$ROUNDS)"
for name in "torch x \* 2" "quantize mxfp4" "cast_transpose mxfp8"; do
    for v in old new; do
        printf '%-22s %s:' "$name" "$v"
        for r in $(seq 1 "$ROUNDS"); do
            printf ' %s' "$(grep -m1 "^$name" "$OUT/$v$r.txt" | sed "s/^$name//" | awk '{print $2 "us/" $5 "x"}')"
        done
        echo
    done
done
