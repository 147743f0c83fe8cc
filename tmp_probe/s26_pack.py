import sys
sys.path.insert(0, "src")
import torch
import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.matmul_details._mma_decode import pack_mma, pack_mma_codes_reference
from mxkit.kernels.matmul_details._mma_pack import pack_mma_codes
src = torch.empty(2**28, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(src)
copy_us = cuda_event_bench(lambda: dst.copy_(src), rep_ms=60)
copy_bw = 2 * src.numel() * 2 / copy_us / 1e3
print(f"copy {copy_bw:.0f} GB/s")
from mxkit.kernels.matmul_details import _mma_pack
for N, K in ((8192, 8192), (28672, 8192), (8192, 28672), (128 * 5760, 2880)):
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    nb = 2 * (w.qdata.numel() + w.scale.numel())  # read + written
    t_k = cuda_event_bench(lambda: pack_mma_codes(w.qdata), rep_ms=60)
    t_all = cuda_event_bench(lambda: pack_mma(w.qdata, w.scale), rep_ms=60)
    t_pw = cuda_event_bench(lambda: mxkit.pack_weight(w, act="float"), rep_ms=60)
    t_ref = cuda_event_bench(lambda: pack_mma_codes_reference(w.qdata), rep_ms=100) if N * K <= 2**28 else float("nan")
    print(f"{N}x{K}: codes kernel {t_k:8.1f} us ({2*w.qdata.numel()/t_k/1e3:.0f} GB/s, {2*w.qdata.numel()/t_k/1e3/copy_bw*100:.0f}% of copy); "
          f"pack_mma {t_all:8.1f} us ({nb/t_all/1e3:.0f} GB/s); pack_weight(act=float) {t_pw:8.1f} us ({nb/t_pw/1e3:.0f} GB/s, {nb/t_pw/1e3/copy_bw*100:.0f}%); torch twin {t_ref:9.1f} us", flush=True)
