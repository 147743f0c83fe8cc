"""Two A/Bs of 2026-12-01 (µs, CUDA events after a clean-L2 read flush; every output checked against the float64
product of the dequantized operands with issue #22's bf16 bound):

1. bf16 x a packed MXFP6 weight: through its MXFP8 twin (pack_weight's ``wide``: w8a16-mma / decode-w16 /
   w8a16-wgmma) against the MXFP6 weight's own paths (the same PackedWeight without the twin: decode-w16's FP6
   tile, dense-exact) and cuBLAS bf16 on the dequantized weight.
2. ``a8w8_linear`` (bf16 x quantized to MXFP8 inside the a8w8-mma launch) at 9 .. 16 rows: the table's
   ``a8w8_mma.quant_max_m`` 16 (one launch) against 8 (a quantize call, then the GEMM).

    PYTHONPATH=src python3 benchmarks/probes/fp6_twin_a8w8_quant.py
"""
import contextlib
import dataclasses

import torch
from _probe import time_us

import mxkit
from mxkit.kernels.matmul import a8w8_linear, gemm_table_override
from mxkit.reference import dequantize_reference


def rel_ok(y, x, wd):
    y64 = x.double() @ wd.double().T
    bound = 1.2 * (y64.to(torch.bfloat16).double() - y64).norm() + 1e-30
    return "ok" if (y.double() - y64).norm() <= bound else "OVER"


print(torch.cuda.get_device_name(0), torch.__version__)
print("1. bf16 x packed MXFP6: twin (MXFP8 kernels) | own paths | cuBLAS bf16")
for fmt in ("mxfp6_e2m3", "mxfp6_e3m2"):
    for N, K in ((8192, 8192), (28672, 8192), (5120, 2880)):
        w = torch.randn(N, K, device="cuda") * 2.0 ** torch.randint(-7, 0, (N, 1), device="cuda")
        wq = mxkit.quantize(w, fmt)
        pw = mxkit.pack_weight(wq, act="float")
        own = dataclasses.replace(pw, wide=None)
        wd = dequantize_reference(wq, torch.bfloat16)
        for M in (1, 8, 16, 64, 1024):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            row = []
            for b in (pw, own):
                path = mxkit.gemm_plan(x, b).path
                t = time_us(lambda: mxkit.matmul(x, b))
                row.append(f"{t:8.1f} {path:12s} {rel_ok(mxkit.matmul(x, b), x, wd)}")
            t_ref = time_us(lambda: x @ wd.T)
            print(f"{fmt:11s} {M:5d}x{N}x{K:<6d} | {row[0]} | {row[1]} | {t_ref:8.1f}", flush=True)
        del w, wq, pw, own, wd
        torch.cuda.empty_cache()

print("2. a8w8_linear at 9 .. 16 rows: quant_max_m 16 (in the launch) | 8 (quantize first)")
for N, K in ((8192, 8192), (28672, 8192), (5120, 2880), (2880, 4096)):
    wq = mxkit.quantize(torch.randn(N, K, device="cuda") / 16, "mxfp8_e4m3")
    pw = mxkit.pack_weight(wq)
    wd = dequantize_reference(wq, torch.bfloat16)
    for M in (1, 9, 12, 16):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        xd = dequantize_reference(mxkit.quantize(x, "mxfp8_e4m3"), torch.bfloat16)
        row = []
        for qm in (16, 8):
            with gemm_table_override({"default": {"a8w8_mma": {"quant_max_m": qm}}}):
                t = time_us(lambda: a8w8_linear(x, pw))
                row.append(f"{t:8.1f} {rel_ok(a8w8_linear(x, pw), xd, wd)}")
        print(f"{M:3d}x{N}x{K:<6d} | {row[0]} | {row[1]}", flush=True)

print("3. bf16 x packed MXFP4 / MXFP8 at M = 17 .. 128 on layers under the wgmma small envelope (N*K < 2^24):")
print("   the plan | the wgmma kernel (small_min_nk 0) | cuBLAS bf16")
WG = {"default": {"w4a16_wgmma": {"small_min_nk": 0}, "w8a16_wgmma": {"small_min_nk": 0}, "decode_mma": {"max_m": 16},
                  "decode_w4a16": {"max_m": 16}}}
for fmt in ("mxfp4_e2m1", "mxfp8_e4m3"):
    for N, K in ((5120, 2880), (2880, 4096), (4096, 2880), (2880, 2880)):
        wq = mxkit.quantize(torch.randn(N, K, device="cuda") / 16, fmt)
        pw = mxkit.pack_weight(wq, act="float")
        wd = dequantize_reference(wq, torch.bfloat16)
        for M in (17, 32, 64, 128):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            row = []
            for table in (None, WG):
                with gemm_table_override(table) if table else contextlib.nullcontext():
                    path = mxkit.gemm_plan(x, pw).path
                    t = time_us(lambda: mxkit.matmul(x, pw))
                    row.append(f"{t:8.1f} {path:12s} {rel_ok(mxkit.matmul(x, pw), x, wd)}")
            print(f"{fmt:11s} {M:4d}x{N}x{K:<5d} | {row[0]} | {row[1]} | {time_us(lambda: x @ wd.T):8.1f}", flush=True)
