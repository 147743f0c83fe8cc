#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 tmp_probe/s27_moe.py 2>&1 | grep -v Warn | head -50 | tee $OUT/moe_probe.txt
