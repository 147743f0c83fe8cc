#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 120 python3 tmp_probe/s26_pack.py 2>&1 | tail -14 | tee $OUT/pack.txt
OMP_NUM_THREADS=1 timeout 330 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_mma_pack.py tests/kernels/test_mma_decode.py tests/kernels/test_matmul.py tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_nn.py tests/test_gpt_oss.py tests/kernels/test_mma_a8w8.py 2>&1 | tail -15 | tee $OUT/tests.txt
