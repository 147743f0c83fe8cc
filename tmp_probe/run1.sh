#!/usr/bin/env bash
set -u
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 250 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/kernels/test_mma_decode.py tests/kernels/test_moe_kernels.py tests/kernels/test_bound_launch.py -k "decode or pdl or moe_layer or graph or mxmoe or bound" 2>&1 | tail -15 | tee $OUT/tests.txt
timeout 300 python benchmarks/probes/pdl_ab.py --skip-model 2>&1 | tee $OUT/pdl_ab.txt | tail -40
