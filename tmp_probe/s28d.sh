export PYTHONPATH=src
timeout 120 python3 -m pytest -q -m gpu tests/test_fused.py -k torch_compile 2>&1 | tail -2
echo "=== full"
( time timeout 420 python3 -m mxkit bench decode --tokens 16 --repeats 2 --batches 1,16 --modes graphs,compiled --formats bf16,mxfp4+fused --plain --out $OUT/full ) 2>&1 | grep -v "it/s\|run/s\|s/run" | tail -16
