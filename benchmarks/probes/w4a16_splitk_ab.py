"""Split-K for the W4A16 wgmma kernel at small M (the decode envelope's edge to the first prefill sizes), where a
128 x BM tile grid is a few programs per SM: the kernel at split 1 / 2 / 4 / 8 and BM 64 / 128 against cuBLAS bf16
on the dequantized weight and what ``mxkit.matmul`` takes today (the plan's path). µs after the clean-L2 read
flush; every split checked against float64 within issue #22's bound.

    PYTHONPATH=src python3 benchmarks/probes/w4a16_splitk_ab.py 64x8192x8192,...   # on the GPU
"""
from _probe import main_shapes, w16_case

import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul_details import _w4a16_wgmma as W


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    x, _, pw, wd, y64, bound = w16_case(M, N, K, "mxfp4_e2m1")
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    plan = mxkit.gemm_plan(x, pw).path
    t_plan = time_us(lambda: mxkit.matmul(x, pw), cfg)[0]
    q, st, one_mul = W.packed_of(pw)
    cells = [f"{M}x{N}x{K}: cuBLAS {t_cub:.1f} | plan {plan} {t_plan:.1f}"]
    best = None
    for bm in (64, 128) if M <= 64 else (128,):
        for split in (1, 2, 4, 8):
            y = W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split)
            err = ((y.double() - y64).norm() / y64.norm()).item()
            us = time_us(lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split), cfg)[0]
            ok = err <= bound
            cells.append(f"bm{bm} s{split} {us:.1f}{'' if ok else ' BOUND'}")
            best = min(best or (us, bm, split), (us, bm, split))
    cells.append(f"best {best[0]:.1f} (bm{best[1]} s{best[2]}, {t_cub / best[0]:.2f}x cuBLAS)")
    return " | ".join(cells)


if __name__ == "__main__":
    main_shapes(row)
