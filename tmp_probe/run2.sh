#!/usr/bin/env bash
set -u
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=$PWD/src timeout 200 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/kernels/test_moe_kernels.py tests/kernels/test_mma_decode.py tests/test_moe.py tests/test_nn.py -k "decode or pairs or moe_layer or graph or mxmoe or grad" 2>&1 | grep -v Warn | tail -15 | tee $OUT/tests.txt
for tree in old new; do
  src=$PWD/src; [ $tree = old ] && src=$PWD/tmp_probe/old/src
  PYTHONPATH=$src timeout 120 python -m mxkit bench moe --models gpt-oss-120b --tokens 1,2,4,64 --routings uniform --modes w4a16 --peers grouped-mm-gemms --out $OUT/moe_$tree 2>&1 | grep -v Warn | tail -8
done
for tree in new old new; do
  src=$PWD/src; [ $tree = old ] && src=$PWD/tmp_probe/old/src
  PYTHONPATH=$src timeout 60 python -m mxkit bench moe --models gpt-oss-120b --tokens 1,2 --routings uniform --modes w4a16 --peers grouped-mm-gemms --out $OUT/moe_${tree}_r 2>&1 | grep -E "^\|" | tail -3
done
