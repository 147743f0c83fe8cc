pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=src
timeout 400 python3 -m pytest -q -m gpu tests/test_moe.py tests/test_fused.py tests/test_nn.py tests/kernels/test_moe_kernels.py -k "compile or mxmoe or gpt_oss or fused or nn" 2>&1 | tail -4
