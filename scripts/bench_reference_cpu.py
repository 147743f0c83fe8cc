"""Time the pure-PyTorch reference quantize/dequantize on the CPU (issue #2's benchmark).

Usage: python scripts/bench_reference_cpu.py [--threads 2] [--size 4096] [--repeats 5]
Prints the median wall time per format for quantize (fp32 input, along the last axis) and dequantize.
"""

import argparse
import platform
import statistics
import time

import torch

import mxkit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--formats", default="mxfp4,mxfp6_e2m3,mxfp8_e4m3,mxint8")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0))
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads={args.threads}, "
          f"x = {args.size}x{args.size} float32")
    print(f"{'format':<12} {'quantize s':>11} {'dequantize s':>13}")
    for fmt in args.formats.split(","):
        q = mxkit.quantize(x, fmt, backend="reference")  # warm-up
        tq, td = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            q = mxkit.quantize(x, fmt, backend="reference")
            t1 = time.perf_counter()
            mxkit.dequantize(q, backend="reference")
            t2 = time.perf_counter()
            tq.append(t1 - t0)
            td.append(t2 - t1)
        print(f"{fmt:<12} {statistics.median(tq):>11.3f} {statistics.median(td):>13.3f}")


if __name__ == "__main__":
    main()
