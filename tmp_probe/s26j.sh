#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 60 python3 tmp_probe/s26_pack.py 2>&1 | tail -6 | tee $OUT/pack.txt
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_mma_pack.py tests/kernels/test_mma_decode.py tests/kernels/test_moe_kernels.py tests/test_moe.py tests/kernels/test_matmul.py -k "pack or mma or mxmoe or prefill or linear" 2>&1 | tail -2 | tee $OUT/tests.txt
