"""pack_weight(act="float") time split: whole call, the pack kernel alone (codes+scales, stats or not), copy."""
import sys, torch
sys.path.insert(0, "src")
import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.matmul_details._mma_pack import pack_mma_fused

def t(fn, spin=100.0):
    return cuda_event_bench(fn, 10, 60, spin, "read")

print(torch.cuda.get_device_name(0))
for N, K in [(8192, 8192), (28672, 8192), (8192, 28672), (5760 * 32, 2880), (5760 * 128, 2880)]:
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    q, s = w.qdata.contiguous(), w.scale.contiguous()
    nb = 2 * (q.numel() + s.numel())
    buf = torch.empty_like(q); sbuf = torch.empty_like(s)
    copy = t(lambda: (buf.copy_(q), sbuf.copy_(s)))
    copy_q = t(lambda: buf.copy_(q))
    k_nostats = t(lambda: pack_mma_fused(q, s, False))
    k_stats = t(lambda: pack_mma_fused(q, s, True))
    whole = t(lambda: mxkit.pack_weight(w, act="float"))
    gb = lambda us: nb / us / 1e3
    print(f"{N}x{K}: bytes {nb/1e6:.1f} MB | copy q+s {copy:.1f} us ({gb(copy):.0f} GB/s), copy q {copy_q:.1f} | "
          f"kernel {k_nostats:.1f} ({100*copy/k_nostats:.0f}% of copy) | kernel+stats {k_stats:.1f} ({100*copy/k_stats:.0f}%) | "
          f"pack_weight {whole:.1f} ({100*copy/whole:.0f}%)")
    del w, q, s, buf, sbuf
    torch.cuda.empty_cache()
