#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/kernels/test_matmul.py tests/kernels/test_launch.py tests/kernels/test_bound_launch.py -k "moe or wgmma or w4a8 or launch or MoE or align or gather" 2>&1 | tail -3
timeout 100 python3 tmp_probe/moe_host.py
timeout 60 python3 tmp_probe/moe_cprof.py 2>&1 | head -45
