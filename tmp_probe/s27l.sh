#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 12 tests/kernels/test_row_fixup.py tests/test_fused.py tests/kernels/test_moe_kernels.py -k "fixup or fused or mixed or prefill_wgmma or bf16_exact or empty" 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -6 | tee $OUT/tests.txt
for m in 0 1; do
MXKIT_MOE_MIXED=$m timeout 120 python3 -m mxkit bench moe --models gpt-oss-120b,gpt-oss-20b --tokens 4096,16384 --routings uniform --modes w4a16 --peers grouped-mm-gemms --no-check --plain --out $OUT/moe_mixed$m 2>&1 | grep -v Warn | tail -7 | tee $OUT/moe_mixed$m.txt
done
timeout 200 python3 -m mxkit bench decode --formats bf16,mxfp4,mxfp4+fused --batches 1,16 --modes graphs --tokens 16 --repeats 2 --plain --out $OUT/decode 2>&1 | tail -10 | tee $OUT/decode.txt
