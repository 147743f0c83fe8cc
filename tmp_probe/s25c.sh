#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_fp8_rowwise.py tests/kernels/test_moe_kernels.py -k "fp8 or w4a8" 2>&1 | tail -2
timeout 200 python3 tmp_probe/rows_ab.py
