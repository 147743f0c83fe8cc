"""A/B of the m16 kernels' ring loops (session 58): MmaDecode at 9-16 rows with m8_loop "l" (the lean loops m16l /
m16n, the cp.async m16) against "g" (m16g / m16ng where m16_loop takes them), the production launches, alternated
over ROUNDS rounds; medians after a clean-L2 read flush (µs), and whether the outputs are the same bytes.

    PYTHONPATH=src python3 benchmarks/probes/m16_ring_ab.py [MxNxK,...]
"""
import sys

import torch
from _probe import DEV as dev, time_us as t

import mxkit
from mxkit.kernels.matmul_details._mma_decode import MmaDecode

ROUNDS = 3
SHAPES = [(16, 8192, 8192), (12, 8192, 8192), (16, 28672, 8192), (16, 8192, 28672), (16, 4096, 14336),
          (9, 4096, 14336), (16, 1024, 8192), (16, 14336, 8192), (16, 2880, 8192)]
if len(sys.argv) > 1:
    SHAPES = [tuple(int(v) for v in c.split("x")) for c in sys.argv[1].split(",")]
print(torch.cuda.get_device_name(0), torch.__version__)
print("\n| M×N×K | lean: kernel | µs | ring: kernel | µs | ring / lean | same bytes |")
print("|---|---|---|---|---|---|---|")
for M, N, K in SHAPES:
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
    b = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    runs = {lp: MmaDecode.of(b, M, torch.bfloat16, lp) for lp in ("l", "g")}
    ys = {lp: r(x, None) for lp, r in runs.items()}
    us = {lp: [] for lp in runs}
    for _ in range(ROUNDS):
        for lp, r in runs.items():
            us[lp].append(t(lambda r=r: r(x, None)))
    med = {lp: sorted(v)[len(v) // 2] for lp, v in us.items()}
    name = {lp: r.kernel.name.split("_")[3] for lp, r in runs.items()}
    same = torch.equal(ys["l"].view(torch.uint8), ys["g"].view(torch.uint8))
    print(f"| {M}x{N}x{K} | {name['l']} | {med['l']:.1f} | {name['g']} | {med['g']:.1f} | "
          f"{med['g'] / med['l']:.3f} | {same} |")
