#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 tmp_probe/s26_wg_decode.py 2>&1 | tail -20 | tee $OUT/wg_decode.txt
OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_nn.py tests/kernels/test_launch.py tests/kernels/test_bound_launch.py tests/kernels/test_fp8_rowwise.py tests/kernels/test_matmul.py -k "moe or w4a8 or align or gather or wgmma or launch or fp8 or bound" 2>&1 | tail -4 | tee $OUT/tests.txt
