#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_row_fixup.py 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -30 | tee $OUT/tests.txt
