#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py -k "w4a8" 2>&1 | tail -2
timeout 100 python3 tmp_probe/bias_act_ab.py
timeout 150 python3 tmp_probe/w4a8_prof.py gpt-oss-120b 16384 2>&1 | grep -A8 "w4a8"
