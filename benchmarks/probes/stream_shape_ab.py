"""Runs benchmarks/probes/stream_shape.cu's load structures over an MXFP4 weight's code bytes (N K / 2) after a
clean-L2 read flush: µs, GB/s, and a check that every byte was read (the xor of all words).

    nvcc -ptx -arch=sm_90a -O3 -o /tmp/ss.ptx benchmarks/probes/stream_shape.cu
    python3 benchmarks/probes/stream_shape_ab.py /tmp/ss.ptx 8192x8192,28672x8192 [REGEX]
"""
import ctypes
import re
import sys

import numpy as np
import torch
from _probe import DEV as dev, kernels, time_us

KS = kernels(sys.argv[1])
PICK = sys.argv[3] if len(sys.argv) > 3 else ""
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def shape(N: int, K: int) -> None:
    nbytes = N * K // 2
    q = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device=dev, dtype=torch.int32)

    want = int(np.bitwise_xor.reduce(q.cpu().numpy().view(np.uint32)))
    out = torch.zeros(1024, device=dev, dtype=torch.int32)
    tiles_k, strips = K // 64, N // 16
    print(f"{N}x{K}: {nbytes / 1e6:.1f} MB of codes", flush=True)
    rows = []
    for name, k in KS.items():
        if not re.search(PICK, name):
            continue
        m = re.match(r"(flat|strip|pers)_(?:t(\d+)_l(\d+)|w(\d+)(?:_r(\d+))?_d(\d+)_a(\d+))", name)
        kind = m.group(1)
        if kind == "flat":
            T, L = int(m.group(2)), int(m.group(3))
            grids, block = [nbytes // (T * L * 16)], T
        elif kind == "strip":
            W, R = int(m.group(4)), int(m.group(5))
            grids, block = [strips // R], W * 32
        else:
            W = int(m.group(4))
            grids, block = [c * SMS for c in (1, 2, 4, 8, 16) if c * SMS * 1 <= strips and c * W <= 64], W * 32
        for g in grids:
            launch = k.bind((q, ctypes.c_int(tiles_k), ctypes.c_int(strips), out))
            go = lambda: launch.launch(g, 1, 1, block)  # noqa: E731
            out.zero_()
            go()
            torch.cuda.synchronize()
            got = int(np.bitwise_xor.reduce(out.cpu().numpy().view(np.uint32)))
            us = time_us(go)
            rows.append((us, f"  {name:22s} grid {g:6d}: {us:7.1f} µs {nbytes / us / 1e3:7.0f} GB/s"
                         f"{'' if got == want else '  MISSED BYTES'}"))
    for _, r in sorted(rows):
        print(r, flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0), flush=True)
    for s in sys.argv[2].split(","):
        shape(*(int(v) for v in s.split("x")))
        torch.cuda.empty_cache()
