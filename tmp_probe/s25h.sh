#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -x -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/kernels/test_matmul.py -k "wgmma or moe or MoE" 2>&1 | tail -4
mkdir -p $OUT/moe
timeout 200 python3 -m mxkit bench moe --models gpt-oss-120b,gpt-oss-20b --tokens 256,1024,4096,16384 --routings uniform --modes w4a16 --peers grouped-mm-gemms --out $OUT/moe 2>&1 | grep "│" | cut -c1-170
