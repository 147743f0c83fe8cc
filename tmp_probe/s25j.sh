#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py -k "w4a8 or align" 2>&1 | tail -2 | tee $OUT/tests.txt
mkdir -p $OUT/moe
timeout 80 python3 -m mxkit bench moe --models gpt-oss-120b --tokens 1,64,16384 --routings uniform --modes w4a8 --peers grouped-mm-gemms --out $OUT/moe 2>&1 | grep "│" | cut -c1-150
