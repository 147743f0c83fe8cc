"""Where a prefill-size eager GEMM call's host time goes: host µs per call (the clock of ``mxkit bench overhead``)
of ``mxkit.matmul`` on paths past the decode envelopes, beside ``x * 2``, and a cProfile of each (top functions by
own time).

    PYTHONPATH=src python3 benchmarks/probes/prefill_host_profile.py [--calls 2000] [--top 22]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics

import torch

import mxkit
from mxkit.bench.overhead import host_times_ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=22)
    args = ap.parse_args()
    from mxkit.kernels import fast_call

    print("C++ fast call:", fast_call.module(wait=True))
    dev = "cuda"
    x = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)
    cases = [("x * 2", lambda: x * 2)]
    for M, N, K, afmt in [(256, 1024, 1024, None), (256, 4096, 4096, None), (1024, 4096, 4096, None),
                          (256, 1024, 1024, "mxfp4_e2m1"), (256, 4096, 4096, "mxfp4_e2m1"),
                          (256, 4096, 4096, "mxfp8_e4m3")]:
        b = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 2.0**-5,
                                             "mxfp4_e2m1"))
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        a = a if afmt is None else mxkit.quantize(a, afmt)
        name = f"{M}x{N}x{K} {afmt or 'bf16'} x mxfp4: {mxkit.gemm_plan(a, b).path}"
        cases.append((name, (lambda a=a, b=b: mxkit.matmul(a, b))))
    rows = {n: [] for n, _ in cases}
    for _ in range(5):
        for n, fn in cases:
            rows[n].append(statistics.median(host_times_ns(fn, args.calls // 5)) / 1e3)
    base = statistics.median(rows["x * 2"])
    for n, _ in cases:
        h = statistics.median(rows[n])
        print(f"{n:60s} host {h:7.1f} us  x{h / base:5.2f}")
    for n, fn in cases[1:]:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(args.calls):
            fn()
            if i % 64 == 63:
                torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(args.top)
        print(f"\n=== {n} (cProfile, {args.calls} calls)\n" + "\n".join(
            ln for ln in s.getvalue().splitlines() if ln.strip())[:6000])


if __name__ == "__main__":
    main()
