#!/usr/bin/env bash
# A host-time A/B of the working tree's src ("new") against it with a patch taken back ("old"), in one device call:
# the named GPU tests under the new source, `mxkit bench overhead` on the named calls in ABAB rounds (old first in
# odd rounds, new first in even ones), each a fresh process, then host_breakdown.py --small under both.
#
#   git diff HEAD~1 -- src >change.patch; PATCH=change.patch OUT=results/ab bash benchmarks/probes/src_ab.sh
#
#   ROUNDS  rounds (default 4)   CALLS  --calls of each overhead run (default 3000)
#   ONLY    bench overhead --only (default 'quantize mxfp4,cast_transpose'); LABELS: its rows' names, as printed
#   TESTS   GPU tests run under the new source (default tests/kernel_tests/test_fast_call.py)
# Files under $OUT: tests_new.txt, {old,new}{round}.txt, breakdown_{old,new}.txt; the last lines printed are the
# × `x * 2` of each call and round, old | new.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-results/ab}"
ROUNDS="${ROUNDS:-4}"
ONLY="${ONLY:-quantize mxfp4,cast_transpose}"
mkdir -p "$OUT" || exit 2
OLD=$(mktemp -d)/src
cp -r src "$OLD" && (cd "$(dirname "$OLD")" && patch -s -R -p1 <"$OLDPWD/$PATCH") \
    || { echo "the patch does not come off" >&2; exit 2; }
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PYTHONPATH=$PWD/src timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
    ${TESTS:-tests/kernel_tests/test_fast_call.py} >"$OUT/tests_new.txt" 2>&1
echo "tests new rc $? $(tail -1 "$OUT/tests_new.txt")"
for r in $(seq 1 "$ROUNDS"); do
    order="old new"; [ $((r % 2)) = 0 ] && order="new old"
    for v in $order; do
        S=$PWD/src; [ "$v" = old ] && S=$OLD
        PYTHONPATH=$S timeout 90 python3 -m mxkit bench overhead --only "$ONLY" --plain \
            --calls "${CALLS:-3000}" >"$OUT/$v$r.txt" 2>&1
        echo "$v round $r rc $?"
    done
done
for v in old new; do
    S=$PWD/src; [ "$v" = old ] && S=$OLD
    PYTHONPATH=$S timeout 90 python3 benchmarks/probes/host_breakdown.py --small >"$OUT/breakdown_$v.txt" 2>&1
    echo "breakdown $v rc $?"
done
echo "== host us median / x (x * 2) per call, old | new (rounds 1..$ROUNDS)"
IFS=, read -r -a names <<<"torch x \* 2,${LABELS:-quantize mxfp4,cast_transpose mxfp8}"
for name in "${names[@]}"; do
    for v in old new; do
        printf '%-22s %s:' "$name" "$v"
        for r in $(seq 1 "$ROUNDS"); do
            printf ' %s' "$(grep -m1 "^$name" "$OUT/$v$r.txt" | sed "s/^$name//" | awk '{print $2 "us/" $5 "x"}')"
        done
        echo
    done
done
echo "== host_breakdown --small, old | new"
paste -d'|' "$OUT/breakdown_old.txt" "$OUT/breakdown_new.txt" | grep -i "x \* 2\|cast\|ct \|maker\|quantize" | \
    awk -F'|' '{printf "%-28s %s | %s\n", substr($1, 1, 28), substr($1, 41), substr($2, 41)}' | head -30
