import sys
sys.path.insert(0, "src")
import torch
import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.matmul_details import _w4a16_wgmma as wg
from mxkit.kernels.matmul_details._mma_decode import pack_mma
from mxkit.kernels.moe import gather_rows

for M, N, K in ((1024, 8192, 8192), (2048, 8192, 8192), (1024, 28672, 8192), (2048, 28672, 8192), (4096, 8192, 8192)):
    w = mxkit.quantize(torch.randn(N, K, device="cuda") / 8, "mxfp4")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    q, st, one = wg.pack_wgmma(w.qdata, w.scale)
    mq, ms = pack_mma(w.qdata.contiguous(), w.scale.contiguous())
    ids = torch.arange(M, device="cuda", dtype=torch.int32)
    xp = gather_rows(x, ids, M, 1, mma_k_order=True)
    wb = mxkit.dequantize(w, torch.bfloat16)
    t_cublas = cuda_event_bench(lambda: x @ wb.T, rep_ms=60)
    t_wg = cuda_event_bench(lambda: wg.w4a16_wgmma(x, q, st, N, one), rep_ms=60)
    t_mma = cuda_event_bench(lambda: wg.w4a16_wgmma(xp, mq, ms, N, one, layout="mma"), rep_ms=60)
    t_perm = cuda_event_bench(lambda: gather_rows(x, ids, M, 1, mma_k_order=True), rep_ms=40)
    a = wg.w4a16_wgmma(x, q, st, N, one).float(); b = wg.w4a16_wgmma(xp, mq, ms, N, one, layout="mma").float()
    print(f"{M}x{N}x{K}: cublas {t_cublas:7.1f}  wgmma-layout {t_wg:7.1f} ({t_cublas/t_wg:.3f}x)  mma-layout {t_mma:7.1f} "
          f"({t_cublas/t_mma:.3f}x) + perm {t_perm:5.1f} -> {t_cublas/(t_mma+t_perm):.3f}x  rel {float((a-b).norm()/a.norm()):.1e}", flush=True)
