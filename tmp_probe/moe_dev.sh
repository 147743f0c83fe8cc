#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/kernels/test_matmul.py -k "wgmma" 2>&1 | tail -3
timeout 60 python3 tmp_probe/w4a8_old.py 2391584726
echo "--- unrolled (working tree)"
timeout 100 python3 benchmarks/probes/w4a16_wgmma_bench.py 25 1024x8192x8192,1024x28672x8192,4096x5760x2880,8192x8192x8192 2>&1 | tail -4
BMS=256 timeout 100 python3 benchmarks/probes/moe_prefill_wgmma_ab.py gpt-oss-120b 16384 2>&1 | tail -1
echo "--- HEAD kernel"
cp tmp_probe/old/src/mxkit/kernels/matmul_details/_w4a16_wgmma.py /tmp/new_wg.py
cp tmp_probe/old/src/mxkit/kernels/matmul_details/_w4a16_wgmma.py src/mxkit/kernels/matmul_details/_w4a16_wgmma.py
timeout 100 python3 benchmarks/probes/w4a16_wgmma_bench.py 25 1024x8192x8192,1024x28672x8192,4096x5760x2880,8192x8192x8192 2>&1 | tail -4
