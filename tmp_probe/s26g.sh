#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 150 python3 tmp_probe/s26_pack.py 2>&1 | tail -14 | tee $OUT/pack.txt
OMP_NUM_THREADS=1 timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_mma_pack.py tests/kernels/test_mma_decode.py 2>&1 | tail -2 | tee $OUT/tests.txt
