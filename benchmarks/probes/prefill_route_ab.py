"""Prefill-size calls on small layers (below the wgmma envelope's min_nk): the packaged route (dense-exact:
dequantize + cuBLAS, two launches and cuBLAS's host path) against the wgmma kernel forced by a table override (one
C++ fast call), by GPU µs (clean-L2 read flush), eager host µs a call (median, the GPU kept ahead) and eager wall
µs a call (back-to-back calls, no flush: what an eager loop sees); both checked against float64 within issue #22's
bound.

    PYTHONPATH=src python3 benchmarks/probes/prefill_route_ab.py [MxNxK,...] [fmt,...]   # on the GPU
"""
import statistics
import sys
import time

import torch
from _probe import w16_case

import mxkit
from mxkit.bench.overhead import host_times_ns
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels import fast_call
from mxkit.kernels.matmul import gemm_table
from mxkit.kernels.matmul_table import gemm_table_override

SHAPES = ",".join(f"{m}x{nk}" for m in (128, 256, 512, 1024)
                  for nk in ("1024x1024", "2048x2048", "5120x2880", "2880x4096", "2880x2880", "4096x4096"))


def wall_us(fn, calls: int = 200) -> float:
    """µs a call of ``calls`` back-to-back calls, then one sync (best of 3)."""
    best = 1e9
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def measure(x, pw, y64, bound, cfg) -> tuple:
    fn = lambda: mxkit.matmul(x, pw)  # noqa: E731
    for _ in range(4):
        y = fn()
    err = ((y.double() - y64).norm() / y64.norm()).item()
    host = statistics.median(host_times_ns(fn, 400)) / 1e3
    return mxkit.gemm_plan(x, pw).path, time_us(fn, cfg)[0], host, wall_us(fn), err <= bound


def main() -> None:
    arg = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else SHAPES
    shapes = [tuple(int(v) for v in s.split("x")) for s in arg.split(",")]
    fmts = (sys.argv[2] if len(sys.argv) > 2 else "mxfp4_e2m1,mxfp8_e4m3").split(",")
    fast_call.module(wait=True)
    cfg = TimingConfig(warmup_ms=5, rep_ms=15)
    gpu = torch.cuda.get_device_name(0)
    table = dict(gemm_table())
    entry = dict(table.get(gpu, table["default"]))
    forced = dict(entry)
    for name in ("w4a16_wgmma", "w8a16_wgmma"):
        forced[name] = {**dict(entry.get(name, table["default"].get(name, {}))), "max_m": 1 << 20, "min_nk": 0,
                        "small_min_nk": 0}
    print(gpu, "| torch", torch.__version__)
    print("fmt | MxNxK | packaged path | GPU µs | host µs | wall µs || wgmma GPU µs | host µs | wall µs | bound ok")
    for fmt in fmts:
        for M, N, K in shapes:
            x, _, pw, _, y64, bound = w16_case(M, N, K, fmt)
            a = measure(x, pw, y64, bound, cfg)
            with gemm_table_override({**table, gpu: forced}):
                b = measure(x, pw, y64, bound, cfg)
            print(f"{fmt[:10]} | {M}x{N}x{K} | {a[0]} | {a[1]:.1f} | {a[2]:.1f} | {a[3]:.1f} || {b[0]} {b[1]:.1f} | "
                  f"{b[2]:.1f} | {b[3]:.1f} | {a[4] and b[4]}", flush=True)
            del x, pw, y64
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
