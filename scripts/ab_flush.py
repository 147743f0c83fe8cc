"""How much of a timed run is the L2 flush's dirty lines? (session 9, benchmarks/h200-2026-11-22-s9/flush_probe.txt)

Times copies and the production quantize kernels (bf16 8192^2 and 16384^2, the 1 GiB copy) with
:func:`mxkit.bench.timing.cuda_event_bench` under both flushes: "write" (a 256 MB zero-fill, the flush of triton's
do_bench and of ``mxkit bench`` by default, which leaves the L2 holding the buffer's dirty lines for the timed
run to write back) and "read" (a read of the buffer: a cold, clean L2; ``mxkit bench --flush read``). GPU only:

    PYTHONPATH=src python3 scripts/ab_flush.py
"""

import torch

from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels import quantize as kq


def main():
    w = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):  # clocks up
        w @ w
    torch.cuda.synchronize()
    cases = {}
    for n in (8192, 16384):
        x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        src = torch.randn(n * n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        cases[f"copy {n}"] = (lambda s=src, d=dst: d.copy_(s), 4 * n * n)
        for name, fmt, axis, nb in (("rows fp4", "mxfp4_e2m1", -1, 2.5 + 1 / 32),
                                    ("rows fp8", "mxfp8_e4m3", -1, 3 + 1 / 32),
                                    ("cols fp8", "mxfp8_e4m3", 0, 3 + 1 / 32),
                                    ("cols fp4", "mxfp4_e2m1", 0, 2.5 + 1 / 32)):
            cases[f"{name} {n}"] = (lambda x=x, f=fmt, a=axis: kq._quantize_impl(x, f, a, "floor", "rne", "plain"),
                                    nb * n * n)
        cases[f"castT fp8 {n}"] = (lambda x=x: kq._cast_transpose_impl(x, "mxfp8_e4m3", "floor", "rne", "plain"),
                                   (4 + 2 / 32) * n * n)
    big = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)
    bigd = torch.empty_like(big)
    cases["copy 1GiB"] = (lambda: bigd.copy_(big), 4 * (1 << 28))
    print(f"{'case':18s} {'write us':>9s} {'GB/s':>6s} {'read us':>9s} {'GB/s':>6s}")
    for k, (fn, nb) in cases.items():
        d, c = (cuda_event_bench(fn, 10.0, 50.0, spin_us=100.0, flush=m) for m in ("write", "read"))
        print(f"{k:18s} {d:9.1f} {nb / d / 1e3:6.0f} {c:9.1f} {nb / c / 1e3:6.0f}", flush=True)


if __name__ == "__main__":
    main()
