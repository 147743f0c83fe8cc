"""MXFP8 x MXFP8 from bf16 x (quantized in the launch) at M <= 8: the register-load kernel of mma_a8w8.cu (its
policy's split) against the bulk-copy kernel of mma_a8w8_bulk.cu, which quantizes the block's x rows once into
shared memory (``_mma_a8w8.BULK_QUANT_MAX_M`` decides where the policy takes it). Each bulk output compared byte
for byte with the register kernel at one thread block along K ("=" / "DIFF"). µs after the clean-L2 read flush.

    PYTHONPATH=src python3 benchmarks/probes/a8w8_bulk_quant.py 1x8192x8192,4x8192x8192,...   # on the GPU
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
    args = (pw.mma_q, pw.mma_s, M, torch.bfloat16, True)
    reg = A8W8(*args, shape=(N, K), bulk=False)
    cells = [f"{M}x{N}x{K}", f"reg s{reg.split} {t(lambda: reg(x, None, None)):.1f}"]
    if M * (K + K // 32) > _mma_a8w8.BULK_X_SMEM:
        return " | ".join(cells + ["bulk: x past BULK_X_SMEM"])
    ref = A8W8(*args, shape=(N, K), split=1, bulk=False)(x, None, None)
    run = A8W8(*args, shape=(N, K), bulk=True)
    same = "=" if torch.equal(run(x, None, None).view(torch.int16), ref.view(torch.int16)) else "DIFF"
    cells.append(f"bulk {t(lambda: run(x, None, None)):.1f} {same}")
    return " | ".join(cells)


print(torch.cuda.get_device_name(0), torch.__version__)
for s in sys.argv[1].split(","):
    print(row(*(int(v) for v in s.split("x"))), flush=True)
