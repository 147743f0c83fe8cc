#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_fp8_rowwise.py tests/kernels/test_moe_kernels.py tests/test_moe.py tests/kernels/test_bound_launch.py tests/kernels/test_matmul.py -k "fp8 or moe or w4a8 or bound or wgmma or cast_transpose or MoE" 2>&1 | tail -4
timeout 60 python3 tmp_probe/bias_act_ab.py
timeout 150 python3 tmp_probe/w4a8_prof.py gpt-oss-120b 16384 2>&1 | grep -A12 "=="
timeout 200 python3 -m mxkit bench moe --models gpt-oss-120b --tokens 1024,4096,16384 --routings uniform --peers grouped-mm-gemms --out $OUT/moe 2>&1 | tail -12
