#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 16 tests/kernels/test_row_fixup.py tests/kernels/test_matmul.py tests/kernels/test_fold.py tests/test_nn.py tests/test_tensor_parallel.py 2>&1 | grep -v "^    \|^$" | tail -30 | tee $OUT/tests.txt
timeout 200 python3 tmp_probe/s27_fix.py 2>&1 | tail -25 | tee $OUT/fixup_ab.txt
timeout 100 python3 tmp_probe/s27_prof.py 2>&1 | head -60 > $OUT/prof.txt
