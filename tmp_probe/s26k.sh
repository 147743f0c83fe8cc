#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 150 python3 tmp_probe/s26_bias.py 2>&1 | tail -8 | tee $OUT/bias.txt
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py -k "mma or decode or mxmoe or gpt_oss or graph" 2>&1 | tail -2 | tee $OUT/tests.txt
