#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
pip install --no-index --no-deps -q tmp_probe/wheels/*.whl 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cli.py -k "tune" 2>&1 | tail -2
timeout 300 python3 -m mxkit tune gemm --out $OUT/gemm_table.json 2>&1 | grep -v "^  skip" | tail -60
