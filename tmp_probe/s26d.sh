#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 240 python3 -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_gpt_oss.py tests/test_nn.py 2>&1 | tail -25 | tee $OUT/tests.txt
timeout 100 python3 tmp_probe/s26_mem.py 2>&1 | tail -12 | tee $OUT/mem.txt
mkdir -p $OUT/moe
timeout 200 python3 -m mxkit bench moe --models gpt-oss-120b,gpt-oss-20b --tokens 1,64,256,1024,4096,16384 --routings uniform --modes w4a16 --peers grouped-mm-gemms --out $OUT/moe 2>&1 | grep "│" | cut -c1-170
