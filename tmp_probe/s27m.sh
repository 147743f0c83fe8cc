#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 12 tests/kernels/test_row_fixup.py tests/test_fused.py tests/kernels/test_matmul.py 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -25 | tee $OUT/tests.txt
