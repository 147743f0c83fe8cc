#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/kernels/test_matmul.py tests/kernels/test_launch.py tests/kernels/test_bound_launch.py tests/kernels/test_fp8_rowwise.py -k "moe or wgmma or w4a8 or launch or MoE or align or gather or fp8 or bound or cast_transpose" 2>&1 | tail -2 | tee $OUT/tests.txt
mkdir -p $OUT/moe $OUT/overhead
timeout 240 python3 -m mxkit bench moe --models gpt-oss-120b,gpt-oss-20b --tokens 256,1024,4096,16384 --routings uniform --peers grouped-mm-gemms --out $OUT/moe 2>&1 | grep "│" | cut -c1-200
timeout 80 python3 -m mxkit bench overhead --out $OUT/overhead 2>&1 | grep "│" | cut -c1-120
