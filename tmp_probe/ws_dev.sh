#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
MXKIT_WGMMA_WS=1 timeout 150 python3 -m pytest -q -x -n 8 -p no:cacheprovider -m gpu tests/kernels/test_moe_kernels.py tests/kernels/test_matmul.py -k "wgmma" 2>&1 | tail -3
for ws in 0 1; do echo "--- WS=$ws"; MXKIT_WGMMA_WS=$ws timeout 100 python3 benchmarks/probes/w4a16_wgmma_bench.py 25 1024x8192x8192,1024x28672x8192,256x8192x8192 2>&1 | tail -3
MXKIT_WGMMA_WS=$ws BMS=256 timeout 100 python3 benchmarks/probes/moe_prefill_wgmma_ab.py gpt-oss-120b 16384 2>&1 | tail -1
MXKIT_WGMMA_WS=$ws BMS=128 timeout 100 python3 benchmarks/probes/moe_prefill_wgmma_ab.py gpt-oss-120b 4096 2>&1 | tail -1; done
