"""Where the W4A16 wgmma kernel's time goes at M = 17-64 on small layers (GPT-OSS 5120 x 2880, 2880 x 4096,
2880 x 2880), where it takes ~20 µs whatever the shape against cuBLAS bf16's ~13: the whole call at every
split of K, the kernel and the split-sum from the profiler, the ring depth and the warp-specialized schedule.
µs after the clean-L2 read flush; every variant checked against float64 within issue #22's bound.

    PYTHONPATH=src python3 benchmarks/probes/wgmma_small_ab.py 64x5120x2880,...   # on the GPU
"""
import os

import torch
from _probe import main_shapes, w16_case

import mxkit
from mxkit.bench.timing import time_us
from mxkit.kernels.matmul_details import _w4a16_wgmma as W


def kernel_us(fn, reps: int = 20) -> dict:
    """{kernel name (first 40 characters): mean device µs per call} over ``reps`` calls (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            out[e.key[:40]] = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / reps
    return out


def row(M: int, N: int, K: int, cfg) -> str:
    x, _, pw, wd, y64, bound = w16_case(M, N, K, "mxfp4_e2m1")
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    plan = mxkit.gemm_plan(x, pw).path
    t_plan = time_us(lambda: mxkit.matmul(x, pw), cfg)[0]
    q, st, one_mul = W.packed_of(pw)
    sched = W.dense_schedule(M, N, K, x.device)
    lines = [f"{M}x{N}x{K}: cuBLAS {t_cub:.1f} | plan {plan} {t_plan:.1f} | schedule {sched}"]
    for stages in (6, 3, 8):
        W.STAGES_SMALL_M = stages
        for ws in ("0", "1"):
            os.environ["MXKIT_WGMMA_WS"] = ws
            cells = []
            for split in (1, 2, 3, 4, 6, 8, 12):
                fn = lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=64, split=split)  # noqa: E731
                try:
                    y = fn()
                except Exception as e:  # noqa: BLE001
                    cells.append(f"s{split} ERR {type(e).__name__}")
                    continue
                err = ((y.double() - y64).norm() / y64.norm()).item()
                us = time_us(fn, cfg)[0]
                cells.append(f"s{split} {us:.1f}{'' if err <= bound else ' BOUND'}")
            lines.append(f"  stages {stages} ws {ws}: " + " | ".join(cells))
    os.environ.pop("MXKIT_WGMMA_WS")
    W.STAGES_SMALL_M = 6
    for split in (1, 4, 8):
        ks = kernel_us(lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=64, split=split))
        lines.append(f"  profiler s{split}: " + ", ".join(f"{k} {v:.1f}" for k, v in ks.items()))
    ks = kernel_us(lambda: x @ wd.T)
    lines.append("  profiler cuBLAS: " + ", ".join(f"{k} {v:.1f}" for k, v in ks.items()))
    return "\n".join(lines)


def ws_row(M: int, N: int, K: int, cfg, fmt: str = "mxfp4_e2m1") -> str:
    """cuBLAS, the plan, then the kernel at bm 64 (128 past M = 64) at each split, single-partition (ws0) and
    warp-specialized (ws1); ``fmt`` mxfp8_e4m3: the W8A16 kernel."""
    from mxkit.kernels.matmul import _dequantize
    from mxkit.kernels.matmul_details._cublas import dense_gemm

    x, wq, pw, wd, y64, bound = w16_case(M, N, K, fmt)
    elem = W.FP8_ELEMS.get(fmt, "e2m1")
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    t_dense = time_us(lambda: dense_gemm(x, _dequantize(wq, torch.bfloat16), torch.bfloat16), cfg)[0]
    plan = mxkit.gemm_plan(x, pw).path
    t_plan = time_us(lambda: mxkit.matmul(x, pw), cfg)[0]
    q, st, one_mul = W.packed_of(pw)
    bm = 64 if M <= 64 else 128
    tiles = -(-M // bm) * -(-N // W.BN)
    out = [f"{fmt[:5]} {M}x{N}x{K} (tiles {tiles}): cuBLAS {t_cub:.1f} | dense-exact {t_dense:.1f} | "
           f"plan {plan} {t_plan:.1f} | schedule {W.dense_schedule(M, N, K, x.device)}"]
    for ws in ("0", "1"):
        os.environ["MXKIT_WGMMA_WS"] = ws
        cells = []
        for split in (1, 2, 3, 4, 5, 6, 8):
            fn = lambda: W.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem=elem)  # noqa: E731
            y = fn()
            err = ((y.double() - y64).norm() / y64.norm()).item()
            us = time_us(fn, cfg)[0]
            cells.append(f"s{split} {us:.1f}{'' if err <= bound else ' BOUND'}")
        out.append(f"  ws{ws}: " + " | ".join(cells))
    os.environ.pop("MXKIT_WGMMA_WS")
    return "\n".join(out)


def a8w8_row(M: int, N: int, K: int, cfg) -> str:
    """MXFP8 x MXFP8 (ready activations) through ``mxkit.matmul``: the plan under the packaged table, and under
    it without the H200's ``w8a16_wgmma`` entry (the default's envelope)."""
    from mxkit.kernels.matmul import gemm_table
    from mxkit.kernels.matmul_table import gemm_table_override

    x, _, pw, _, _, _ = w16_case(M, N, K, "mxfp8_e4m3", act="mx")
    xq = mxkit.quantize(x, "mxfp8_e4m3")
    cells = [f"a8w8 {M}x{N}x{K}: {mxkit.gemm_plan(xq, pw).path} {time_us(lambda: mxkit.matmul(xq, pw), cfg)[0]:.1f}"]
    table, gpu = dict(gemm_table()), torch.cuda.get_device_name(0)
    entry = {k: v for k, v in table.get(gpu, {}).items() if k != "w8a16_wgmma"}
    with gemm_table_override({**table, gpu: entry}):
        cells.append(f"without: {mxkit.gemm_plan(xq, pw).path} {time_us(lambda: mxkit.matmul(xq, pw), cfg)[0]:.1f}")
    return " | ".join(cells)


def once(shape: str, split: int) -> None:
    """One call of ``shape`` at ``split`` after a warm-up (for ``ncu --launch-skip``)."""
    M, N, K = (int(v) for v in shape.split("x"))
    x, _, pw, _, _, _ = w16_case(M, N, K, "mxfp4_e2m1")
    q, st, one_mul = W.packed_of(pw)
    for _ in range(3):
        W.w4a16_wgmma(x, q, st, N, one_mul, bm=64, split=split)
    torch.cuda.synchronize()


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "once":
        once(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "a8w8":
        sys.argv = sys.argv[1:]
        main_shapes(a8w8_row)
    elif sys.argv[1] in ("ws", "ws8"):
        fmt = "mxfp4_e2m1" if sys.argv[1] == "ws" else "mxfp8_e4m3"
        sys.argv = sys.argv[1:]
        main_shapes(lambda M, N, K, cfg: ws_row(M, N, K, cfg, fmt))
    else:
        main_shapes(row)
