"""GPU µs (clean-L2 read flush), eager host µs (median) and eager wall µs a call (back-to-back) of
``mxkit.matmul`` on the wgmma paths at the shapes given, with the path and split the table takes; run it once per
checkout to compare two (e.g. the split-K sum in its own kernel against the sum in the GEMM's launch):

    PYTHONPATH=src python3 benchmarks/probes/wgmma_split_times.py 64x8192x8192,64x28672x8192 [fmt]   # on the GPU
"""
import statistics
import sys

import torch
from _probe import w16_case
from prefill_route_ab import wall_us

import mxkit
from mxkit.bench.overhead import host_times_ns
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels import fast_call
from mxkit.kernels.matmul_details import _w4a16_wgmma as W


def main() -> None:
    fmt = sys.argv[2] if len(sys.argv) > 2 else "mxfp4_e2m1"
    fast_call.module(wait=True)
    cfg = TimingConfig(warmup_ms=5, rep_ms=20)
    print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "|", mxkit.__file__)
    print("MxNxK | path | schedule (bm, split) | GPU µs | host µs | wall µs | bound ok")
    for s in sys.argv[1].split(","):
        M, N, K = (int(v) for v in s.split("x"))
        x, _, pw, _, y64, bound = w16_case(M, N, K, fmt)
        fn = lambda: mxkit.matmul(x, pw)  # noqa: E731
        for _ in range(4):
            y = fn()
        ok = ((y.double() - y64).norm() / y64.norm()).item() <= bound
        host = statistics.median(host_times_ns(fn, 1000)) / 1e3
        print(f"{s} | {mxkit.gemm_plan(x, pw).path} | {W.dense_schedule(M, N, K, x.device)} | "
              f"{time_us(fn, cfg)[0]:.1f} | {host:.1f} | {wall_us(fn):.1f} | {ok}", flush=True)


if __name__ == "__main__":
    main()
