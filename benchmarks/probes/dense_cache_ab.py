"""Prefill on the dequantized-weight cache (``pack_weight(w, dense=torch.bfloat16)``, path ``dense-cached``) against
the path the same weight takes without it (``dense-exact`` for MXINT8, the wgmma kernel for MXFP4 / MXFP8 / the
MXFP6 twin in its envelope) and cuBLAS bf16 on the dequantized weight; µs after a clean-L2 read flush, each output
checked against the float64 product (issue #22's bf16 bound).

    PYTHONPATH=src python3 benchmarks/probes/dense_cache_ab.py
"""
import torch
from _probe import time_us

import mxkit
from mxkit.reference import dequantize_reference

print(torch.cuda.get_device_name(0), torch.__version__)
print(f"{'weight':11s} {'M x N x K':18s} | {'cache':>8s} | {'without':>8s} {'path':12s} | {'cuBLAS':>8s} | checks")
for fmt in ("mxint8", "mxfp4_e2m1", "mxfp8_e4m3", "mxfp6_e2m3"):
    for N, K in ((8192, 8192), (28672, 8192), (5120, 2880)):
        wq = mxkit.quantize(torch.randn(N, K, device="cuda") / 16, fmt)
        wd = dequantize_reference(wq, torch.bfloat16)
        cached = mxkit.pack_weight(wq, act="float", dense=torch.bfloat16)
        plain = mxkit.pack_weight(wq, act="float")
        for M in (256, 1024, 4096):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            y64 = x[:64].double() @ wd.double().T
            bound = 1.2 * (y64.to(torch.bfloat16).double() - y64).norm()
            ok = ["ok" if (mxkit.matmul(x, b)[:64].double() - y64).norm() <= bound else "OVER" for b in (cached, plain)]
            assert mxkit.gemm_plan(x, cached).path == "dense-cached"
            t_c = time_us(lambda: mxkit.matmul(x, cached))
            t_p = time_us(lambda: mxkit.matmul(x, plain))
            t_r = time_us(lambda: x @ wd.T)
            print(f"{fmt:11s} {M:5d}x{N}x{K:<6d} | {t_c:8.1f} | {t_p:8.1f} {mxkit.gemm_plan(x, plain).path:12s} | "
                  f"{t_r:8.1f} | {' '.join(ok)}", flush=True)
