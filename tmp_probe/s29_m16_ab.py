"""old (fc260a1: m16 = 8 warps x 1 tile, 4 cp.async stages) vs new (lean, 8 x 2) m16 decode kernel, M = 9..16"""
import sys
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks/probes")
from _probe import time_us
import mxkit
from mxkit.kernels.matmul_details import _mma_decode as md

NEW = md.PTX
LOOP = md.m16_loop
OLD = Path("tmp_probe/old_decode.ptx").resolve()
dev = torch.device("cuda")
print(torch.cuda.get_device_name(0))
print("| M×N×K | old µs | new µs | new / old | same bits |")
print("|---|---|---|---|---|")
for N, K in [(5120, 2880), (2880, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (8192, 8192),
             (28672, 4096), (28672, 8192)]:
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
    b = mxkit.pack_weight(w)
    for M in (16, 12):
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        res = {}
        for tag, ptx in (("old", OLD), ("new", NEW)):
            md.PTX = ptx
            md.m16_loop = (lambda N, K: "") if tag == "old" else LOOP
            k = md.MmaDecode(b.mma_q, b.mma_s, N, K, M, torch.bfloat16, special=False)
            y = k(x, None)
            res[tag] = (time_us(lambda: k(x, None)), y)
        md.PTX = NEW
        o, n = res["old"], res["new"]
        print(f"| {M}x{N}x{K} | {o[0]:.1f} | {n[0]:.1f} | {n[0] / o[0]:.2f} | {torch.equal(o[1], n[1])} |")
