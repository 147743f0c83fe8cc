"""fp8-wgmma with two K steps a ring slot (``_fp8_wgmma.SUB = 2``, ``STAGES = 3``: the consumers' order and slot
release, each an mbarrier arrive behind a warpgroup-wide bar.sync, once every two steps) against one (``SUB = 1``,
``STAGES = 5``): µs after the read flush, alternating rounds, and whether the bytes are the same (they must be: the
promotion order is unchanged). Dense 8192^3 and GPT-OSS-120B's grouped gate_up / down at 16384 tokens (uniform top-4,
groups padded to 16 rows; K = 2880: 23 steps, an odd last round). cuBLAS's `_scaled_mm` beside the dense case.
Runs on the kernel with ``benchmarks/h200-2026-12-04j/fp8_sub2.patch`` applied (session 66; not kept: a tie, see
``benchmarks/fp8_wgmma_ab.md``).
PYTHONPATH=src python3 benchmarks/probes/fp8_wgmma_sub_ab.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import fp8_moe_rows, time_us  # noqa: E402

from mxkit.kernels.matmul_details import _fp8_wgmma as f8  # noqa: E402

dev = torch.device("cuda")
print(torch.cuda.get_device_name(0), "| torch", torch.__version__)
VARIANTS = {"sub1 (5 slots)": (1, 5), "sub2 (3 slots)": (2, 3)}


def run(name, call, peer=None, rounds=3):
    t, ys = {}, {}
    for _ in range(rounds):
        for v, (sub, st) in VARIANTS.items():
            f8.SUB, f8.STAGES = sub, st
            ys[v] = call().clone()
            t[v] = min(t.get(v, 1e9), time_us(call))
    f8.SUB, f8.STAGES = 1, 5
    same = all(torch.equal(y.view(torch.int16), ys["sub1 (5 slots)"].view(torch.int16)) for y in ys.values())
    extra = f", cuBLAS {time_us(peer):.1f}" if peer else ""
    print(f"{name}: " + ", ".join(f"{v} {us:.1f} us" for v, us in t.items()) + f"{extra}; same bytes {same}")


M = N = K = 8192
a = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
b = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
sa, sb = torch.rand(M, device=dev), torch.rand(N, device=dev)
run("dense 8192^3", lambda: f8.fp8_gemm(a, b, sa, sb),
    lambda: torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16))
del a, b
E, T, K = 128, 16384, 2880
a, sa, offs, table, R = fp8_moe_rows(E, T, K)
for N in (5760, 2880):
    b = torch.randn(E * N, K, device=dev).to(torch.float8_e4m3fn)
    sb = torch.rand(E * N, device=dev)
    run(f"grouped E={E} N={N} K={K} R={R}", lambda: f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, table=table))
