"""How much of a timed run is the L2 flush's dirty lines? (session 9, benchmarks/h200-2026-11-22-s9/flush_probe.txt)

Times copies and the production quantize kernels (bf16 8192^2 and 16384^2, the 1 GiB copy) after
(a) "dirty": a 256 MB zero-fill, the flush of triton's do_bench and of ``mxkit bench`` by default, which leaves
the L2 holding the buffer's dirty lines for the timed run to write back, and (b) "clean": the zero-fill
followed by a read of a second 256 MB buffer (a cold, clean L2; ``mxkit bench --flush read`` reads only).
CUDA events around each run, a GPU spin before it, median of 60 runs. GPU only:

    PYTHONPATH=src python3 scripts/ab_flush.py
"""

import statistics

import torch

from mxkit.kernels import quantize as kq


def bench(fn, mode, n=60):
    f1 = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    f2 = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    acc = torch.empty((), dtype=torch.int64, device="cuda")
    for _ in range(5):
        fn()
    ts = []
    for _ in range(n):
        f1.zero_()
        if mode == "clean":
            acc.copy_(f2.sum())
        torch.cuda._sleep(200000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in ts)


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
    print(f"{'case':18s} {'dirty us':>9s} {'GB/s':>6s} {'clean us':>9s} {'GB/s':>6s}")
    for k, (fn, nb) in cases.items():
        d, c = bench(fn, "dirty"), bench(fn, "clean")
        print(f"{k:18s} {d:9.1f} {nb / d / 1e3:6.0f} {c:9.1f} {nb / c / 1e3:6.0f}", flush=True)


if __name__ == "__main__":
    main()
