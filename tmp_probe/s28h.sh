pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=src
timeout 240 python3 -m pytest -q -m gpu tests/test_fused.py tests/test_nn.py -k "compile or fused" 2>&1 | tail -3
( time timeout 300 python3 -m mxkit bench decode --tokens 16 --repeats 2 --batches 1 --modes compiled --formats bf16,mxfp4+fused --plain --out $OUT/full ) 2>&1 | grep -v "it/s\|run/s\|s/run\|W1125\|warn" | tail -8
