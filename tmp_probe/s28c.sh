pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=src
timeout 240 python3 -m pytest -q -x -m gpu tests/test_fused.py tests/bench/test_bench_decode.py 2>&1 | tail -4
echo "=== quick"
( time timeout 200 python3 -m mxkit bench decode --layers 4 --tokens 16 --repeats 1 --batches 1 --modes graphs,compiled --formats bf16,mxfp4+fused --plain --out $OUT/quick ) 2>&1 | grep -v "it/s\|run/s\|s/run" | tail -14
