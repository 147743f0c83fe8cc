"""The shipped bulk-copy kernel (mma_a8w8_bulk.cu, MXFP8 codes in) against the register-load kernel of mma_a8w8.cu
(at its policy's split) on the decode shapes, at 2 / 3 / 4 persistent blocks per SM
(``_mma_a8w8.BULK_BLOCKS_PER_SM``). (Session 44 ran it with W8A16 bulk kernels too, since dropped:
benchmarks/a8w8_ab.md.) Each bulk output compared byte for byte with the register kernel at one
thread block along K ("=" / "DIFF"). µs after the clean-L2 read flush.

    PYTHONPATH=src python3 benchmarks/probes/a8w8_bulk_prod.py 1x28672x8192,...   # on the GPU
"""
import sys

import torch
from _probe import DEV as dev, time_us as t

import mxkit
from mxkit.kernels.matmul_details import _mma_a8w8
from mxkit.kernels.matmul_details._mma_a8w8 import A8W8


def row(M, N, K):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp8")
    pw = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = mxkit.quantize(x, "mxfp8")
    cells = [f"{M}x{N}x{K}"]
    for kind, xin, xs, w16 in (("c", a.qdata.reshape(M, K), a.plain_scale().reshape(M, K // 32).contiguous(), None),):
        args = (pw.mma_q, pw.mma_s, M, torch.bfloat16, w16 is not None)
        reg = A8W8(*args, shape=(N, K), w16=w16, bulk=False)
        cells.append(f"{kind} reg s{reg.split} {t(lambda: reg(xin, xs, None)):.1f}")
        ref = A8W8(*args, shape=(N, K), w16=w16, split=1, r=1, bulk=False)(xin, xs, None)
        for bps in (2, 3, 4):
            _mma_a8w8.BULK_BLOCKS_PER_SM = bps
            run = A8W8(*args, shape=(N, K), w16=w16, bulk=True)
            same = "=" if torch.equal(run(xin, xs, None).view(torch.int16), ref.view(torch.int16)) else "DIFF"
            cells.append(f"bulk b{bps} {t(lambda: run(xin, xs, None)):.1f} {same}")
        _mma_a8w8.BULK_BLOCKS_PER_SM = 2
    return " | ".join(cells)


print(torch.cuda.get_device_name(0), torch.__version__)
for s in sys.argv[1].split(","):
    print(row(*(int(v) for v in s.split("x"))), flush=True)
