"""Kernels for an Nsight Compute look (one launch each, bf16 8192^2, production configs, after warm-up):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --metrics <see scripts/gpu_ncu.sh> python3 scripts/ncu_quantize.py [case names...]
"""

import dataclasses
import sys

import torch

from mxkit.kernels import quantize as kq

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
q = {f: kq._quantize_impl(x, f, -1, "floor", "rne", "plain") for f in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3")}


def quant(fmt, axis):
    return lambda: kq._quantize_impl(x, fmt, axis, "floor", "rne", "plain")


def dequant(fmt):
    return lambda: kq._dequantize_impl(q[fmt][0], q[fmt][1], fmt, -1, (8192, 8192), torch.bfloat16)


def fused_fp4(block_r, block_c, warps):
    """The fused FP4 cast-transpose (col_units columns from bf16 pairs, ct_evict) on another tile."""
    cfg = dataclasses.replace(kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1"), split_rows=(), col_units=2,
                              col_packed=False, col_fp4_words=True, col_wide=False, fp4_pairs=True, scale_t=True,
                              block_r=block_r, block_c=block_c, num_warps=warps, ct_evict=1)
    return lambda: kq._cast_transpose_impl(x, "mxfp4_e2m1", "floor", "rne", "plain", cfg)


def fused_fp6(block_r, evict=1, store4=False):
    """The fused FP6 cast-transpose (col_units columns on block_r x 64, a warp per 32 rows; rows by fp6_words)
    that session 11 measured 15-90% slower than the default one-direction programs."""
    cfg = dataclasses.replace(kq.quantize_config(1, 8192, 8192, True, True, "mxfp6_e2m3"), split_rows=(), col_units=2,
                              col_direct=False, group_c=0, scale_t=True, block_r=block_r, block_c=64,
                              num_warps=block_r // 32, ct_evict=evict, fp6_store4=store4, fp6_pairs=False)
    return lambda: kq._cast_transpose_impl(x, "mxfp6_e2m3", "floor", "rne", "plain", cfg)


cases = {
    "rows fp8": quant("mxfp8_e4m3", -1), "rows fp4": quant("mxfp4_e2m1", -1), "rows fp6": quant("mxfp6_e2m3", -1),
    "cols fp8": quant("mxfp8_e4m3", 0), "cols fp4": quant("mxfp4_e2m1", 0), "cols fp6": quant("mxfp6_e2m3", 0),
    "castT fp8": lambda: kq._cast_transpose_impl(x, "mxfp8_e4m3", "floor", "rne", "plain"),
    "castT fp4": lambda: kq._cast_transpose_impl(x, "mxfp4_e2m1", "floor", "rne", "plain"),
    # the fused FP4 cast-transpose on 128 x 128 tiles (session 9 A/B: 347 us against the split kernel's 303)
    "castT fp4 fused": lambda: kq._cast_transpose_impl(x, "mxfp4_e2m1", "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1"), split_rows=(), fp4_pairs=True, col_wide=True,
        scale_t=True, block_r=128, block_c=128, num_warps=4, col_units=0, col_packed=True, ct_evict=0)),
    # session 11: fused FP4 cast-transposes on 64 x 256 (4 / 8 warps) / 32 x 256 tiles, other than the default
    # 64 x 128 (benchmarks/h200-2026-11-22-s11/ncu_fp4_fused.txt)
    "castT fp4 fu64": fused_fp4(64, 256, 4), "castT fp4 fu64w8": fused_fp4(64, 256, 8),
    "castT fp4 fu32": fused_fp4(32, 256, 4),
    "castT fp6": lambda: kq._cast_transpose_impl(x, "mxfp6_e2m3", "floor", "rne", "plain"),
    "castT fp6 fu64": fused_fp6(64), "castT fp6 fu128": fused_fp6(128),
    # session 12: the FP6 rows' words stored as [groups, rows, 4] tiles (fp6_store4)
    "castT fp6 fu64 st4": fused_fp6(64, store4=True), "castT fp6 fu128 st4": fused_fp6(128, store4=True),
    "castT fp6 st4": lambda: kq._cast_transpose_impl(x, "mxfp6_e2m3", "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, True, True, "mxfp6_e2m3", in_bf16=False), fp6_store4=True)),
    # the session 7-11 default: one-direction programs (for bf16 inputs the fused kernel since session 12)
    "castT fp6 split": lambda: kq._cast_transpose_impl(x, "mxfp6_e2m3", "floor", "rne", "plain",
                                                       kq.quantize_config(1, 8192, 8192, True, True, "mxfp6_e2m3",
                                                                          in_bf16=False)),
    "rows fp6 st4": lambda: kq._quantize_impl(x, "mxfp6_e2m3", -1, "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, True, False, "mxfp6_e2m3", in_bf16=False), fp6_store4=True)),
    "dq fp8": dequant("mxfp8_e4m3"), "dq fp4": dequant("mxfp4_e2m1"), "dq fp6": dequant("mxfp6_e2m3"),
    # session 15: rowwise FP4 -> bf16 without the word decode asm (the per-element FP8-cvt decode until then; the
    # kernel of session 14: 16 x 256 tiles on four warps)
    "dq fp4 noasm": lambda: kq._dequantize_impl(q["mxfp4_e2m1"][0], q["mxfp4_e2m1"][1], "mxfp4_e2m1", -1, (8192, 8192),
                                                torch.bfloat16, dataclasses.replace(
                                                    kq.dequantize_config(1, 8192, 8192, False, "mxfp4_e2m1"),
                                                    fp4_asm=False, block_n=16, block_l=256, num_warps=4)),
    # session 14: the FP4 cast-transpose on one tile per program (the H100's default; the H200 takes two) with
    # the 1-D and the 3-D launch grid (ptxas: 62 / 48 registers), columnwise FP4 on the 3-D grid (96 / 107)
    "castT fp4 rb1": lambda: kq._cast_transpose_impl(x, "mxfp4_e2m1", "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1"), rblocks=1)),
    "castT fp4 rb1 3d": lambda: kq._cast_transpose_impl(x, "mxfp4_e2m1", "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1"), rblocks=1, grid3=True)),
    "cols fp4 3d": lambda: kq._quantize_impl(x, "mxfp4_e2m1", 0, "floor", "rne", "plain", dataclasses.replace(
        kq.quantize_config(1, 8192, 8192, False, True, "mxfp4_e2m1"), grid3=True)),
}
names = sys.argv[1:] or list(cases)
for n in names:
    cases[n]()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for n in names:
    print("ncu case:", n, flush=True)
    cases[n]()
    torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
