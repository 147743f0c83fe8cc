"""The W4A16 / W8A16 wgmma kernel at M <= 64 (64-token tiles, no producer warp): the TMA ring's depth
(``STAGES_SMALL_M`` slots: 4 until session 39, 6 since) against the split of K, and what the split's float32
reduction costs alone (``y.sum(0).to(bf16)``, the PyTorch one until session 39, against ``split_sum``).
At M = 64 each step is short (64 tokens x 128 weight rows), so bytes in flight per SM may be what holds the
kernel near 30% of the weight-bytes floor. µs after the clean-L2 read flush; every output checked against
float64 within issue #22's bound.

    PYTHONPATH=src python3 benchmarks/probes/w4a16_stages_ab.py 64x8192x8192,... [mxfp8_e4m3]   # on the GPU
"""
import sys

import torch
from _probe import main_shapes, w16_case

from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul_details import _w4a16_wgmma as W
from mxkit.kernels.matmul_details._split_sum import split_sum

FMT = sys.argv[2] if len(sys.argv) > 2 else "mxfp4_e2m1"
ELEM = W.FP8_ELEMS.get(FMT, "e2m1")

STAGES = (4, 6, 8)
SHIPPED = W.STAGES_SMALL_M


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    x, _, pw, wd, y64, bound = w16_case(M, N, K, FMT)
    q, st, one_mul = W.packed_of(pw)
    bm, plan_split = W.dense_schedule(M, N, K, x.device)
    cells = [f"{M}x{N}x{K} {FMT} (plan bm{bm} s{plan_split}): cuBLAS {time_us(lambda: x @ wd.T, cfg)[0]:.1f}"]
    best = None
    for stages in STAGES:
        W.STAGES_SMALL_M = stages
        W._launcher.cache_clear()
        for split in (1, 2, 4, 8):
            if (K // 64) // split < 4:
                continue
            try:
                y = W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem=ELEM)
            except Exception as e:  # (shared memory over the limit)
                cells.append(f"st{stages} s{split} {type(e).__name__}")
                break
            err = ((y.double() - y64).norm() / y64.norm()).item()
            us = time_us(lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem=ELEM), cfg)[0]
            cells.append(f"st{stages} s{split} {us:.1f}{'' if err <= bound else ' BOUND'}")
            best = min(best or (us, stages, split), (us, stages, split))
    W.STAGES_SMALL_M = SHIPPED
    W._launcher.cache_clear()
    for split in (2, 4):
        part = torch.randn(split, M, N, device=x.device)
        cells.append(f"reduce s{split} torch {time_us(lambda: part.sum(0).to(torch.bfloat16), cfg)[0]:.1f} "
                     f"split_sum {time_us(lambda: split_sum(part), cfg)[0]:.1f}")
    if best is not None:
        cells.append(f"best {best[0]:.1f} (st{best[1]} s{best[2]})")
    return " | ".join(cells)


if __name__ == "__main__":
    main_shapes(row)
