set -x
nvidia-smi --query-gpu=name --format=csv,noheader
cd benchmarks/probes && PYTHONPATH=../../src timeout 500 python3 decode_ab.py ../../tmp_probe/pf_variants.ptx 2>&1 | tee $OUT/pf_ab.txt
