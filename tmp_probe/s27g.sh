#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 300 python3 tmp_probe/s27_prof_decode.py 2>&1 | grep -v Warning | tail -30 | tee $OUT/prof_decode.txt
