"""A/B of the weight streamed by bulk copies (benchmarks/probes/a8w8_bulk.cu) against the shipped one-strip kernels
of mma_a8w8.cu at M <= 8: MXFP8 x MXFP8 from codes (c) and W8A16 E4M3 (w). Each variant is timed at splits of K
1 / 2 / 4 (and the production policy's), its output compared byte for byte with the shipped kernel's at the same
split ("=" the same bytes, "DIFF" not); the persistent ones (_p: one block per strip group, looping) at 2 / 4 / 6
blocks per SM against split 1. µs after the clean-L2 read flush; "floor": weight + scale bytes at this run's copy
bandwidth.

    nvcc -ptx -arch=sm_90 -O3 -o /tmp/a8w8_bulk.ptx benchmarks/probes/a8w8_bulk.cu
    PYTHONPATH=src python3 benchmarks/probes/a8w8_bulk_ab.py /tmp/a8w8_bulk.ptx 1x28672x8192,...   # on the GPU
"""
import ctypes
import re
import sys

import torch
from _probe import DEV as dev, kernels as load_kernels, split_buffers, time_us as t

import mxkit
from mxkit.kernels.cuda_driver import _libcuda
from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

kernels = {n: k for n, k in load_kernels(sys.argv[1]).items() if n.startswith("bulk_")}
RUNS = 30  # launches of each variant compared with the shipped kernel's bytes (a race shows as DIFF n/RUNS)


def ring_bytes(name: str) -> int:
    """The dynamic shared memory of bulk_*_u<U>_s<S>: S chunks of 4 U tiles (1024 + 32 bytes) and 2 S mbarriers."""
    u, s = (int(v) for v in re.search(r"_u(\d+)_s(\d+)", name).groups())
    return s * 4 * u * 1056 + 16 * s


for _n, _k in kernels.items():  # (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8)
    assert _libcuda().cuFuncSetAttribute(_k.fn, 8, ring_bytes(_n)) == 0, _n
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def copy_gbps() -> float:
    buf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    out = torch.empty_like(buf)
    us = t(lambda: out.copy_(buf))
    return 2 * buf.numel() / us / 1e3


def case(M, N, K, bw):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp8")
    pw = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = mxkit.quantize(x, "mxfp8")
    xq, xs = a.qdata.reshape(M, K), a.plain_scale().reshape(M, K // 32).contiguous()
    floor = (N * K + N * K // 32) / bw / 1e3
    cells = [f"{M}x{N}x{K} floor {floor:.1f}"]
    groups, strips = -(-M // 8), N // 16
    for kind, xin, sin, w16 in (("c", xq, xs, None), ("w", x, None, "e4m3"), ("b", x, None, None)):
        quant = kind != "c"
        r = 2 if kind == "b" else 1  # (the shipped bf16-in kernel: two strips a warp; the bulk one takes one)
        pol = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, quant, shape=(N, K), w16=w16, r=r)
        refs = {}
        for split in sorted({pol.split, 1, 2, 4}):
            prod = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, quant, split=split, shape=(N, K), w16=w16, r=r)
            refs[split] = prod(xin, sin, None).clone()
            cells.append(f"{kind} prod s{split}{'*' if split == pol.split else ''} "
                         f"{t(lambda: prod(xin, sin, None)):.1f}")
        for name, k in kernels.items():
            if not name.startswith(f"bulk_{kind}_"):
                continue
            persist = "_p" in name
            runs = [(4 * SMS, 1), (2 * SMS, 1)] if persist else [(strips, s) for s in sorted({1, pol.split})]
            for gy, split in runs:
                gy = min(gy, strips)
                ws, cnt = split_buffers(groups * strips, split, 128)
                y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
                launch = k.bind((xin, sin, pw.mma_q, pw.mma_s, None, y, ws, cnt, ctypes.c_int(M), ctypes.c_int(N),
                                 ctypes.c_int(K), ctypes.c_longlong(xin.stride(0)),
                                 ctypes.c_longlong(0 if sin is None else sin.stride(0)), ctypes.c_longlong(N),
                                 ctypes.c_int(0)))
                launch.shared = ring_bytes(name)

                def go(launch=launch, gy=gy, split=split):
                    launch.launch(groups, gy, split, 160)
                bad = 0
                for _ in range(RUNS):
                    y.fill_(float("nan"))
                    go()
                    bad += not torch.equal(y.view(torch.int16), refs[split].view(torch.int16))
                same = "=" if not bad else f"DIFF {bad}/{RUNS}"
                tag = f"g{gy}" if persist else f"s{split}"
                cells.append(f"{name[5:]} {tag} {t(go):.1f} {same}")
    return " | ".join(cells)


print(torch.cuda.get_device_name(0), torch.__version__)
bw = copy_gbps()
print(f"copy {bw:.0f} GB/s", flush=True)
for s in sys.argv[2].split(","):
    print(case(*(int(v) for v in s.split("x")), bw), flush=True)
    torch.cuda.empty_cache()
