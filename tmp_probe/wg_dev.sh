pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
export PYTHONPATH=src
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/kernels/test_matmul.py -k "wgmma or shapes_and_paths or every_format_pair" 2>&1 | tail -15
timeout 300 python3 tmp_probe/wg_bench.py 30 ${SHAPES:-128x8192x8192,256x8192x8192,512x8192x8192,1024x8192x8192,8192x8192x8192,1024x28672x8192,1024x8192x28672,4096x28672x8192,256x5120x2880,1024x5120x2880,1024x2880x4096,4096x5760x2880,1024x2880x2880} 2>&1 | grep -v Warn
