"""decode-w16 on its new operands (MXFP6 weights, fp16 activations) against the path they took before
(dense-exact: dequantize, then cuBLAS) and cuBLAS on the dense weight, at M = 1 and 16; µs, do_bench median
after a clean-L2 read flush is not used here (do_bench's own flush).

    PYTHONPATH=src python3 benchmarks/probes/decode_w16_fp6_fp16.py
"""
import torch
from triton.testing import do_bench

import mxkit
from mxkit.kernels.matmul import gemm_table_override

print(torch.cuda.get_device_name(0))
print(f"{'weight':12s} {'x':9s} {'N x K':12s} {'M':>3s} {'decode-w16':>11s} {'dense-exact':>12s} {'cuBLAS':>8s}")
for fmt, dt in (("mxfp6_e2m3", torch.bfloat16), ("mxfp6_e3m2", torch.bfloat16), ("mxfp4_e2m1", torch.float16),
                ("mxfp8_e4m3", torch.float16)):
    for N, K in ((8192, 8192), (5120, 2880)):
        w = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda"), fmt))  # (no host read per call)
        wd = mxkit.dequantize(w.source, dt)
        for M in (1, 16):
            x = torch.randn(M, K, device="cuda").to(dt)
            path = mxkit.gemm_plan(x, w).path
            t_new = do_bench(lambda: mxkit.matmul(x, w), return_mode="median") * 1e3
            with gemm_table_override({"default": {"decode_w4a16": {"max_m": 0}}}):
                old = mxkit.gemm_plan(x, w).path
                t_old = do_bench(lambda: mxkit.matmul(x, w), return_mode="median") * 1e3
            t_ref = do_bench(lambda: x @ wd.T, return_mode="median") * 1e3
            print(f"{fmt:12s} {str(dt)[6:]:9s} {N}x{K:<7d} {M:3d} {t_new:8.1f} ({path[:6]}) {t_old:8.1f} ({old[:5]}) "
                  f"{t_ref:8.1f}")
