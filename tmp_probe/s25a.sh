#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_bound_launch.py tests/kernels/test_cast_transpose.py 2>&1 | tail -3
timeout 120 python3 tmp_probe/host_ct.py 2>&1 | tee $OUT/host_ct.txt
timeout 200 python3 tmp_probe/w4a8_prof.py gpt-oss-120b 4096,16384 2>&1 | tee $OUT/w4a8_prof.txt
