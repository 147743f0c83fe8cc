#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 90 python3 tmp_probe/s26_packprof.py 2>&1 | tail -32 | cut -c1-160 | tee $OUT/packprof.txt
