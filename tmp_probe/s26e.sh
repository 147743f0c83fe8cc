#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 200 python3 tmp_probe/s26_dense_ab.py 2>&1 | tail -8 | tee $OUT/dense_ab.txt
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py -k "mxmoe" 2>&1 | tail -3 | tee $OUT/tests.txt
