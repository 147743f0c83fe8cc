"""Host µs a call (median, the GPU not waited on) of mxkit.matmul on the wgmma path with and without a bias
(float32, bf16), against ``x * 2`` and against the same calls through run_gemm (the path a biased call took before
session 62); the same bytes both ways.

    PYTHONPATH=src python3 benchmarks/probes/wgmma_bias_host.py [MxNxK]   # on the GPU
"""
import statistics
import sys

import torch

import mxkit
from mxkit.bench.overhead import host_times_ns
from mxkit.kernels import fast_call
from mxkit.kernels import matmul_calls as kc

M, N, K = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "2048x8192x8192").split("x"))
fast_call.module(wait=True)
pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda").to(torch.bfloat16) * 2.0**-4, "mxfp4_e2m1"))
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
x2 = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
b32 = torch.randn(N, device="cuda")
planned = kc.PlannedCall(pw, mxkit.gemm_plan(x, pw))


def med(fn):
    return min(statistics.median(host_times_ns(fn, 300)) for _ in range(3)) / 1e3


print(torch.cuda.get_device_name(0), f"| {M}x{N}x{K} | path {mxkit.gemm_plan(x, pw).path}")
t2 = med(lambda: x2 * 2)
print(f"x * 2: {t2:.1f} µs")
for name, b in (("no bias", None), ("float32 bias", b32), ("bf16 bias", b32.to(torch.bfloat16))):
    for _ in range(4):
        y = mxkit.matmul(x, pw, bias=b)
    same = torch.equal(y.view(torch.int16), planned(x, b).view(torch.int16))
    t, t_old = med(lambda: mxkit.matmul(x, pw, bias=b)), med(lambda: planned(x, b))
    print(f"{name}: {t:.1f} µs ({t / t2:.2f}x x * 2) | through run_gemm {t_old:.1f} | same bytes {same}")
