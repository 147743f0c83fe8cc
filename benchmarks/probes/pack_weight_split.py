"""Where ``pack_weight(w, act="float")`` (the decode-mma layout of an MXFP4 weight) spends its time: the whole
call, the packing kernel alone with and without its scale statistics, and a copy of the same bytes, each after a
clean-L2 read flush with a GPU spin ahead (so the host's launch path is hidden, but not a host sync).

    PYTHONPATH=src python3 benchmarks/probes/pack_weight_split.py   # on the GPU
"""
import torch

import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.matmul_details._mma_pack import pack_mma_fused



def t(fn, spin=100.0):
    return cuda_event_bench(fn, 10, 60, spin, "read")


def row(N: int, K: int) -> str:
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    q, s = w.qdata.contiguous(), w.scale.contiguous()
    nb = 2 * (q.numel() + s.numel())
    buf, sbuf = torch.empty_like(q), torch.empty_like(s)
    copy = t(lambda: (buf.copy_(q), sbuf.copy_(s)))
    copy_q = t(lambda: buf.copy_(q))
    k_nostats = t(lambda: pack_mma_fused(q, s, False))
    k_stats = t(lambda: pack_mma_fused(q, s, True))
    whole = t(lambda: mxkit.pack_weight(w, act="float"))
    return (f"{N}x{K}: bytes {nb / 1e6:.1f} MB | copy q+s {copy:.1f} us ({nb / copy / 1e3:.0f} GB/s), copy q "
            f"{copy_q:.1f} | kernel {k_nostats:.1f} ({100 * copy / k_nostats:.0f}% of copy) | kernel+stats "
            f"{k_stats:.1f} ({100 * copy / k_stats:.0f}%) | pack_weight {whole:.1f} ({100 * copy / whole:.0f}%)")


print(torch.cuda.get_device_name(0))
for N, K in [(8192, 8192), (28672, 8192), (8192, 28672), (5760 * 32, 2880), (5760 * 128, 2880)]:
    print(row(N, K))
    torch.cuda.empty_cache()
