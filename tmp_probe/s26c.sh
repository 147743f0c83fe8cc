#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 300 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_gpt_oss.py tests/test_nn.py 2>&1 | tail -25 | tee $OUT/tests.txt
# decode unchanged? (graph replay, 120b) and memory of an MXMoE at GPT-OSS-20B size
timeout 150 python3 tmp_probe/s26_mem.py 2>&1 | tail -12 | tee $OUT/mem.txt
