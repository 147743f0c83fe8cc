"""How far the MoE decode path's one-block-a-pair kernels (no sort, the slots summed in the down GEMM) should go
(session 58): ``moe_packed`` on GPT-OSS-120B's experts (E = 128, H = I = 2880, top-4, uniform routing) at T tokens,
one CUDA graph replay a call, with ``_mma_decode.SMALL_PAIRS`` at 8 (production) and at LIMIT (the pairs kernels
past 8 pairs); µs after a clean-L2 read flush, alternated over ROUNDS rounds, and whether the outputs agree byte
for byte (the pairs path's contract: the bytes of the sorted path and its combine).

    PYTHONPATH=src python3 benchmarks/probes/pairs_limit_ab.py [T,...] [LIMIT]
"""
import sys

import torch
from _probe import DEV as dev, time_us as t

import mxkit
from mxkit.bench.moe import routing
from mxkit.kernels import moe as kmoe
from mxkit.kernels.matmul_details import _mma_decode as md

ROUNDS = 3
TS = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2, 3, 4, 6, 8, 16]
LIMIT = int(sys.argv[2]) if len(sys.argv) > 2 else 64
E, H, I = 128, 2880, 2880
g = torch.Generator(device=dev).manual_seed(1)
w1 = mxkit.quantize(torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")
w2 = mxkit.quantize(torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")
packed = (kmoe.pack_experts_mma(w1), kmoe.pack_experts_mma(w2))
b1 = torch.randn(E, 2 * I, device=dev) * 0.1
b2 = torch.randn(E, H, device=dev) * 0.1


def graph(x, tw, tid, limit):
    md.SMALL_PAIRS = limit
    try:
        for _ in range(2):
            kmoe.moe_packed(x, packed, b1, b2, tw, tid)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            y = kmoe.moe_packed(x, packed, b1, b2, tw, tid)
    finally:
        md.SMALL_PAIRS = 8
    return gr, y


print(torch.cuda.get_device_name(0), torch.__version__)
print(f"\n| T (pairs) | sorted + combine (SMALL_PAIRS 8) µs | pairs kernels (SMALL_PAIRS {LIMIT}) µs | ratio "
      "| same bytes |")
print("|---|---|---|---|---|")
for T in TS:
    tw, tid = routing(T, E, "uniform", dev)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    runs = {lim: graph(x, tw, tid, lim) for lim in (8, LIMIT)}
    for gr, _ in runs.values():
        gr.replay()
    torch.cuda.synchronize()
    same = torch.equal(runs[8][1].view(torch.int16), runs[LIMIT][1].view(torch.int16))
    us = {lim: [] for lim in runs}
    for _ in range(ROUNDS):
        for lim, (gr, _) in runs.items():
            us[lim].append(t(gr.replay))
    med = {lim: sorted(v)[len(v) // 2] for lim, v in us.items()}
    print(f"| {T} ({T * 4}) | {med[8]:.1f} | {med[LIMIT]:.1f} | {med[LIMIT] / med[8]:.3f} | {same} |")
