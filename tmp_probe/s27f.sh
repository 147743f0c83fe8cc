#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fused.py 2>&1 | grep -v "^    \|^$\|Warning\|warner" | tail -15 | tee $OUT/tests.txt
timeout 420 python3 -m mxkit bench decode --formats bf16,mxfp4,mxfp4+fused --batches 1,16 --modes graphs,eager --tokens 16 --repeats 2 --plain --out $OUT/decode 2>&1 | tail -16 | tee $OUT/decode.txt
