pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | grep -v WARNING | tail -1
git log --oneline | head -1
MXKIT_SKIP_BENCH=1 MXKIT_WALL_BUDGET=560 MXKIT_TESTS_BUDGET=530 timeout 580 bash scripts/gpu_check.sh 2>&1 | tail -25
