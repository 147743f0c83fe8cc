"""A/B of the a8w8-mma kernel's K loop on the packed weight (benchmarks/probes/a8w8_variants.cu): strips per
warp x tiles a batch x x-prefetch, from MXFP8 codes (c) and from bf16 (b, quantized in the kernel). Each
variant's output is checked byte for byte against the production kernel (the same split of K over warps and
blocks: the same bits); µs medians after a clean-L2 read flush.

    nvcc -ptx -arch=sm_89 -O3 -o /tmp/a8w8_variants.ptx benchmarks/probes/a8w8_variants.cu
    python3 benchmarks/probes/a8w8_ab.py /tmp/a8w8_variants.ptx                          # on the GPU
"""
import ctypes
import re
import sys

import torch
from _probe import DEV as dev, kernels as load_kernels, split_buffers, time_us as t

import mxkit
from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

kernels = load_kernels(sys.argv[1])


def case(M, N, K):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp8")
    b = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = mxkit.quantize(x, "mxfp8")
    xq, xs = a.qdata.reshape(M, K), a.plain_scale().reshape(M, K // 32).contiguous()
    row = {}
    for kind, quant in (("c", False), ("b", True)):
        if quant and M > 8:
            continue
        prod = A8W8(b.mma_q, b.mma_s, M, torch.bfloat16, quant, shape=(N, K))
        xin, sin = (x, None) if quant else (xq, xs)
        ref = prod(xin, sin, None)
        row[f"{kind}:prod r{prod.r}"] = t(lambda: prod(xin, sin, None))
        for n, k in kernels.items():
            if not n.startswith(f"a8w8_{kind}_"):
                continue
            R = int(re.search(r"_r(\d+)", n).group(1))
            if N % (16 * R):
                continue
            split = prod.split
            groups, strips = -(-M // 8), N // (16 * R)
            ws, cnt = split_buffers(groups * strips, split, R * 128)
            y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
            launch = k.bind((xin, sin, b.mma_q, b.mma_s, None, y, ws, cnt, ctypes.c_int(M), ctypes.c_int(N),
                             ctypes.c_int(K), ctypes.c_longlong(xin.stride(0)),
                             ctypes.c_longlong(0 if sin is None else sin.stride(0)), ctypes.c_longlong(N),
                             ctypes.c_int(0)))  # (no bias)
            go = lambda: launch.launch(groups, strips, split, 128)  # noqa: E731
            go()
            torch.cuda.synchronize()
            row[f"{kind}:{n[7:]}"] = (t(go), torch.equal(y, ref))
    return row


print(torch.cuda.get_device_name(0), torch.__version__)
for M, N, K in [(1, 8192, 8192), (1, 28672, 8192), (1, 8192, 28672), (1, 5120, 2880), (1, 2880, 4096),
                (16, 8192, 8192), (16, 28672, 8192), (64, 8192, 8192)]:
    r = case(M, N, K)
    print(f"{M}x{N}x{K}: " + "  ".join(f"{k} {v[0]:.1f}{'' if v[1] else ' WRONG'}" if isinstance(v, tuple)
                                      else f"{k} {v:.1f}" for k, v in r.items()))
