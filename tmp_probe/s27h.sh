#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 100 python3 tmp_probe/s27_prof2.py 2>&1 | head -60 > $OUT/prof2.txt
