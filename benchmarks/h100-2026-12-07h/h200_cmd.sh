G=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$G"
case "$G" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0;; esac
OUT=$OUT TABLE=benchmarks/h100-2026-12-07g/reverse_and_h200.json MOE=0 AB_BUDGET=60 GEMM_ARGS="--pairs w4a16 --modes ready --peers none --no-check --shapes 1x1024x4096,1x2880x4096,1x4096x4096,1x6144x4096,1x5120x2880,1x8192x8192,1x14336x4096,1x4096x14336,8x4096x4096,8x2880x4096,16x4096x4096,16x2880x4096,16x1024x4096,16x8192x4096,16x6144x4096,16x5120x2880" bash benchmarks/probes/table_ab.sh > $OUT/ab.log 2>&1
tail -20 $OUT/ab.log
rm -rf $OUT/base*_gemm $OUT/table*_gemm
[ "${SKIP_DECODE:-0}" = 1 ] && exit 0
export PYTHONPATH=src TORCHINDUCTOR_COMPILE_THREADS=1 MPLBACKEND=Agg
timeout -s INT 200 python3 -m mxkit bench decode --formats bf16,mxfp4+fusedmlp --quantize-head --batches 1 --modes compiled --tokens 32 --repeats 3 --plain --table benchmarks/h100-2026-12-07g/reverse_and_h200.json --out $OUT/decode_retune > $OUT/decode_retune.txt 2>&1; echo rc $?; grep -A4 "^format" $OUT/decode_retune.txt
