#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_nn.py -k "moe or MoE or w4a8 or align" 2>&1 | tail -2 | tee $OUT/tests.txt
mkdir -p $OUT/moe
timeout 150 python3 -m mxkit bench moe --models gpt-oss-120b --tokens 1,4,16,64,256 --routings uniform --peers grouped-mm-gemms --out $OUT/moe 2>&1 | grep "│" | cut -c1-170
