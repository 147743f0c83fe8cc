#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 60 python3 tmp_probe/s26_pack.py 2>&1 | tail -6 | tee $OUT/pack.txt
MXKIT_SKIP_BENCH=1 MXKIT_WALL_BUDGET=500 MXKIT_TESTS_BUDGET=470 bash scripts/gpu_check.sh 2>&1 | tail -8
grep -E "passed|failed" $OUT/gpu_check.log | tail -2 > $OUT/tests_summary.txt
