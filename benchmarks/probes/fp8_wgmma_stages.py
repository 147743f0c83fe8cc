"""fp8-wgmma's ring depth (``_fp8_wgmma.STAGES``, 32 KB a slot) on GPT-OSS-120B's grouped shapes at 16384 tokens
(uniform top-4, groups padded to 16 rows), µs after the read flush, alternating rounds.
PYTHONPATH=src python3 benchmarks/probes/fp8_wgmma_stages.py [stages,...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import fp8_moe_rows, time_us  # noqa: E402

from mxkit.kernels.matmul_details import _fp8_wgmma as f8  # noqa: E402

stages = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "5,6,4").split(",")]
dev = torch.device("cuda")
E, T, K = 128, 16384, 2880
a, sa, offs, table, R = fp8_moe_rows(E, T, K)
print(torch.cuda.get_device_name(0))
for N in (5760, 2880):
    b = torch.randn(E * N, K, device=dev).to(torch.float8_e4m3fn)
    sb = torch.rand(E * N, device=dev)
    t, ys = {}, {}
    for _ in range(2):
        for st in stages:
            f8.STAGES = st
            ys[st] = f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, table=table)
            t[st] = min(t.get(st, 1e9), time_us(lambda: f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, table=table)))
    same = all(torch.equal(v.view(torch.int16), ys[stages[0]].view(torch.int16)) for v in ys.values())
    print(f"N={N} K={K} R={R}: " + ", ".join(f"{s} stages {t[s]:.1f} us" for s in stages) + f"; same bytes {same}")
