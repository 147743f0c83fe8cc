#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -n 16 tests/kernels/test_row_fixup.py tests/kernels/test_matmul.py tests/kernels/test_fold.py tests/test_nn.py tests/test_tensor_parallel.py tests/test_fused.py tests/kernels/test_bound_launch.py tests/kernels/test_launch.py 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -20 | tee $OUT/tests.txt
timeout 100 python3 tmp_probe/s27_prof2.py 2>&1 | head -3 | tee $OUT/wall.txt
timeout 200 python3 tmp_probe/s27_fix.py 2>&1 | head -9 | tee $OUT/fixup_ab.txt
timeout 90 python3 -m mxkit bench overhead --only "mxfp4 x mxfp4,quantize mxfp4" --calls 1000 --plain 2>&1 | tail -5 | tee $OUT/overhead.txt
