"""Nsight Compute look at the M = 1 decode-mma GEMM on Llama-3-8B's layers (the fused q/k/v 6144x4096, o 4096x4096,
fused gate/up 28672x4096, down 4096x14336) and 8192x8192: each `mxkit.matmul` launched once after a warm-up,
inside the profiler range. Where a small layer's ~10 µs go when its bytes take 2-3 µs: SM active cycles against
elapsed (ramp and tail), warps per scheduler, issue, stall reasons, the pipes.

    PYTHONPATH=src bash benchmarks/probes/ncu_decode_small.sh   # on the GPU; writes $OUT/ncu_decode_small.txt
"""
import sys

import torch

import mxkit

SHAPES = [(1, 4096, 4096), (1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096), (1, 8192, 8192)]
if len(sys.argv) > 1:
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
for M, N, K in SHAPES:
    w = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, "mxfp4"))
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        mxkit.matmul(x, w)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    flush.zero_()  # the weight out of L2, as after the benchmarks' read flush
    torch.cuda.synchronize()
    print(f"ncu case: {M}x{N}x{K} ({mxkit.gemm_plan(x, w).path})", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    mxkit.matmul(x, w)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
