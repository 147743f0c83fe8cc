"""The shipped bulk-copy kernel (mma_a8w8_bulk.cu) against the register-load kernel of mma_a8w8.cu (at its
policy's split) on the decode shapes, at 2 / 3 / 4 persistent blocks per SM (``_mma_a8w8.BULK_BLOCKS_PER_SM``), from
MXFP8 codes ("c") and / or from bf16 x quantized in the launch ("b"; the bulk kernel only where x's codes fit
``BULK_X_SMEM``). (Session 44 ran it with W8A16 bulk kernels too, since dropped: benchmarks/a8w8_ab.md.) Each bulk
output compared byte for byte with the register kernel at one thread block along K ("=" / "DIFF"). µs after the
clean-L2 read flush.

    PYTHONPATH=src python3 benchmarks/probes/a8w8_bulk_prod.py 1x28672x8192,... [codes,bf16] [2,3,4]   # on the GPU
"""
import sys

import torch
from _probe import DEV as dev, time_us as t

import mxkit
from mxkit.kernels.matmul_details import _mma_a8w8
from mxkit.kernels.matmul_details._mma_a8w8 import A8W8


def row(M, N, K, kinds, blocks_per_sm):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp8")
    pw = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a = mxkit.quantize(x, "mxfp8")
    cells = [f"{M}x{N}x{K}"]
    inputs = {"codes": ("c", a.qdata.reshape(M, K), a.plain_scale().reshape(M, K // 32).contiguous(), False),
              "bf16": ("b", x, None, True)}
    for kind, xin, xs, quant in (inputs[k] for k in kinds):
        args = (pw.mma_q, pw.mma_s, M, torch.bfloat16, quant)
        reg = A8W8(*args, shape=(N, K), bulk=False)
        cells.append(f"{kind} reg s{reg.split} {t(lambda: reg(xin, xs, None)):.1f}")
        if quant and M * (K + K // 32) > _mma_a8w8.BULK_X_SMEM:
            cells.append("bulk: x past BULK_X_SMEM")
            continue
        # (the register kernel at split 1; from bf16 at its policy's strips a warp: the same sums)
        ref = A8W8(*args, shape=(N, K), split=1, r=None if quant else 1, bulk=False)(xin, xs, None)
        for bps in blocks_per_sm:
            _mma_a8w8.BULK_BLOCKS_PER_SM = bps
            run = A8W8(*args, shape=(N, K), bulk=True)
            same = "=" if torch.equal(run(xin, xs, None).view(torch.int16), ref.view(torch.int16)) else "DIFF"
            cells.append(f"bulk b{bps} {t(lambda: run(xin, xs, None)):.1f} {same}")
        _mma_a8w8.BULK_BLOCKS_PER_SM = 2
    return " | ".join(cells)


print(torch.cuda.get_device_name(0), torch.__version__)
kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ["codes"]
blocks_per_sm = [int(b) for b in sys.argv[3].split(",")] if len(sys.argv) > 3 else [2, 3, 4]
for s in sys.argv[1].split(","):
    print(row(*(int(v) for v in s.split("x")), kinds, blocks_per_sm), flush=True)
