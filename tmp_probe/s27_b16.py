import time, torch, mxkit
from triton.testing import do_bench
from mxkit.kernels.matmul import _fixup
print("MXFP8 x MXFP8 bf16-exact (no sync): matmul us (do_bench), fix-up alone us, eager wall us/call, cuBLAS bf16 us")
for M, N, K in [(256, 8192, 8192), (1024, 8192, 8192), (8192, 8192, 8192), (1024, 2880, 4096)]:
    a = mxkit.quantize(torch.randn(M, K, device="cuda"), "mxfp8_e4m3")
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda"), "mxfp8_e4m3"))
    assert mxkit.gemm_plan(a, pw).path == "bf16-exact"
    t = do_bench(lambda: mxkit.matmul(a, pw), rep=100) * 1e3
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    tf = do_bench(lambda: _fixup(y, a, pw.source, None, M, N, K), rep=100) * 1e3
    for _ in range(5): mxkit.matmul(a, pw)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(50): mxkit.matmul(a, pw)
    torch.cuda.synchronize(); w = (time.perf_counter() - t0) / 50 * 1e6
    xb, wb = mxkit.dequantize(a, torch.bfloat16), mxkit.dequantize(pw.source, torch.bfloat16)
    cb = do_bench(lambda: xb @ wb.T, rep=100) * 1e3
    print(f"{M}x{N}x{K}: {t:.1f} | {tf:.1f} | {w:.1f} | {cb:.1f}", flush=True)
