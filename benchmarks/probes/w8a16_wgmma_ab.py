"""MXFP8 weights on the Hopper wgmma kernel (``w8a16-wgmma``) against what ``mxkit.matmul`` took before it, per
M×N×K: bf16 x packed MXFP8 E4M3 (decode-w16 up to the decode envelope, dense-exact above: the weight dequantized
on every call, then cuBLAS) and MXFP8 x MXFP8 (a8w8-mma up to its envelope, bf16-exact above: both operands
dequantized, then cuBLAS). Peer: cuBLAS bf16 on the dequantized weight. µs after the clean-L2 read flush; every
timed output checked against float64 within issue #22's bound.

    PYTHONPATH=src python3 benchmarks/probes/w8a16_wgmma_ab.py 64x8192x8192,...   # on the GPU
"""
import torch
from _probe import main_shapes, w16_case

import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul import gemm_table_override
from mxkit.kernels.matmul_details import _w4a16_wgmma as W
from mxkit.reference import dequantize_reference

W8_OFF = {"max_m": 0, "min_nk": 0, "small_max_m": 0, "small_min_nk": 0}
A8_OFF = {"max_m": 0, "max_m_no_wgmma": 0}
A8_ON = {"max_m": 64, "max_m_no_wgmma": 64}
VARIANTS = {  # table overrides (the rest from the packaged default): what each row times
    "w16": {"before": {"w8a16_wgmma": W8_OFF}, "plan": {}},
    "mx": {"a8w8": {"a8w8_mma": A8_ON, "w8a16_wgmma": W8_OFF}, "bf16-exact": {"a8w8_mma": A8_OFF, "w8a16_wgmma": W8_OFF},
           "w8a16": {"a8w8_mma": A8_OFF}, "plan": {}},
}


def _err(y, y64) -> float:
    return ((y.double() - y64).norm() / y64.norm()).item()


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    x, _, pw, wd, _, _ = w16_case(M, N, K, "mxfp8_e4m3", act=None)  # every layout (a8w8 too)
    xq = mxkit.quantize(x, "mxfp8_e4m3")
    cells = [f"{M}x{N}x{K}: cuBLAS bf16 {time_us(lambda: x @ wd.T, cfg)[0]:.1f}"]
    for label, a in (("w16", x), ("mx", xq)):
        a64 = x.double() if label == "w16" else dequantize_reference(xq, torch.float64)
        y64 = a64 @ wd.double().T
        bound = 1.2 * ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
        got = []
        for name, table in VARIANTS[label].items():
            with gemm_table_override({"default": table}):
                path = mxkit.gemm_plan(a, pw).path
                t = time_us(lambda: mxkit.matmul(a, pw), cfg)[0]
                e = _err(mxkit.matmul(a, pw), y64)
            got.append(f"{name}: {path} {t:.1f}{'' if e <= bound else ' BOUND'}")
        cells.append(f"{label}: " + ", ".join(got))
    q, st, one_mul = W.packed_of(pw)
    best = None
    for bm in (64, 128) if M <= 64 else (128,) if M <= 256 else (128, 256):
        for split in (1, 2, 4) if M <= 256 else (1,):
            W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem="e4m3")  # (compile outside the timing)
            us = time_us(lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem="e4m3"), cfg)[0]
            best = min(best or (us, bm, split), (us, bm, split))
    cells.append(f"kernel best {best[0]:.1f} (bm{best[1]} s{best[2]}; schedule {W.dense_schedule(M, N, K, x.device)})")
    return " | ".join(cells)


if __name__ == "__main__":
    main_shapes(row)
