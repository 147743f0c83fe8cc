#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu -n 16 tests/kernels/test_row_fixup.py tests/kernels/test_matmul.py tests/kernels/test_fold.py tests/test_fused.py tests/test_nn.py tests/kernels/test_moe_kernels.py -k "not decode_mma_expert" 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -12 | tee $OUT/tests.txt
