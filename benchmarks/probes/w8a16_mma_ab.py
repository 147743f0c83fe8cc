"""bf16 x times a packed MXFP8 E4M3 weight at small M: the W8A16 mma kernel (``w8a16-mma``, mma_a8w8.cu) against
the Triton kernel it replaces (``decode-w16``) and cuBLAS bf16 on the bf16 weight, with the kernel's split of K
over thread blocks at the policy's choice and at 1 / 2 / 4, and with 1 or 2 strips a warp. µs after the clean-L2
read flush; every timed output checked against float64 within issue #22's bound.

    PYTHONPATH=src python3 benchmarks/probes/w8a16_mma_ab.py 1x8192x8192,...   # on the GPU

With a second argument, the PTX of ``benchmarks/probes/a8w8_variants.cu`` (``nvcc -ptx -arch=sm_89 -O3``), its
``w16_r<R>_nt<NT>`` kernels (NT token tiles of 8 a block: each weight tile decoded once for 8 NT tokens) are timed
too at splits 1 / 2 / 4, each output compared byte for byte with the shipped kernel's (NT = 1) at the same R and
split ("=" the same bytes, "DIFF" not).
"""
import ctypes
import re
import sys

import torch
from _probe import kernels, main_shapes, split_buffers, w16_case

import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul import gemm_table_override
from mxkit.kernels.matmul_details._mma_a8w8 import A8W8


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    x, _, pw, wd, y64, bound = w16_case(M, N, K, "mxfp8_e4m3")

    def timed(fn) -> str:
        err = ((fn().double() - y64).norm() / y64.norm()).item()
        return f"{time_us(fn, cfg)[0]:.1f}{'' if err <= bound else ' BOUND'}"

    cells = [f"{M}x{N}x{K}: cuBLAS bf16 {time_us(lambda: x @ wd.T, cfg)[0]:.1f}"]
    with gemm_table_override({"default": {"w8a16_mma": {"max_m": 0}}}):
        cells.append(f"{mxkit.gemm_plan(x, pw).path} {timed(lambda: mxkit.matmul(x, pw))}")
    cells.append(f"{mxkit.gemm_plan(x, pw).path} {timed(lambda: mxkit.matmul(x, pw))}")
    policy = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, shape=(N, K), w16="e4m3").split
    for split in (1, 2, 4):
        run = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, split=split, shape=(N, K), w16="e4m3")
        cells.append(f"split {split}{'*' if split == policy else ''} {timed(lambda: run(x, None, None))}")
    # strips a warp (r2: 96 registers, 5 blocks of 4 warps an SM; r1: 56, 9; ptxas for sm_90) and token tiles of 8
    # a block (nt2: r2 only, 121 registers), at the policy's split and 1 / 2 / 4
    for r, nt in ((1, 1), (2, 1), (2, 2)):
        if N % (16 * r) == 0:
            pol = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, shape=(N, K), w16="e4m3", r=r, nt=nt).split
            for split in sorted({pol, 1, 2, 4}):
                run = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, split=split, shape=(N, K), w16="e4m3", r=r,
                           nt=nt)
                cells.append(f"r{r} nt{nt} split {split}{'*' if split == pol else ''} "
                             f"{timed(lambda: run(x, None, None))}")
    for name, k in VARIANTS.items():
        R, NT = (int(v) for v in re.fullmatch(r"w16_r(\d+)_nt(\d+)(?:_g\d+)?", name).groups())  # _g: f308820
        if N % (16 * R):
            continue
        groups, strips = -(-M // (8 * NT)), N // (16 * R)
        for split in (1, 2, 4):
            ref = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, split=split, shape=(N, K), w16="e4m3", r=R,
                       nt=1)(
                x, None, None)
            ws, cnt = split_buffers(groups * strips, split, R * NT * 128)
            y = torch.full((M, N), float("nan"), device=x.device, dtype=torch.bfloat16)
            launch = k.bind((x, None, pw.mma_q, pw.mma_s, None, y, ws, cnt, ctypes.c_int(M), ctypes.c_int(N),
                             ctypes.c_int(K), ctypes.c_longlong(K), ctypes.c_longlong(0), ctypes.c_longlong(N),
                             ctypes.c_int(0)))

            def go(launch=launch, y=y, split=split):
                launch.launch(groups, strips, split, 128)
                return y
            go()
            torch.cuda.synchronize()
            same = "=" if torch.equal(y.view(torch.int16), ref.view(torch.int16)) else "DIFF"
            cells.append(f"{name} split {split} {timed(go)} {same}")
    return " | ".join(cells)


VARIANTS = {n: k for n, k in kernels(sys.argv[2]).items() if n.startswith("w16_")} if len(sys.argv) > 2 else {}


if __name__ == "__main__":
    main_shapes(row)
