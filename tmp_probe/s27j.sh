#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 12 tests/kernels/test_moe_kernels.py tests/test_moe.py tests/test_gpt_oss.py tests/test_nn.py 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -25 | tee $OUT/tests.txt
for m in 0 1; do
MXKIT_MOE_MIXED=$m timeout 150 python3 -m mxkit bench moe --models gpt-oss-120b,gpt-oss-20b --tokens 1024,4096,16384 --routings uniform --modes w4a16 --peers grouped-mm-gemms --no-check --plain --out $OUT/moe_mixed$m 2>&1 | grep -v Warn | tail -9 | tee $OUT/moe_mixed$m.txt
done
