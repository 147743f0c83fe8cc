import dataclasses, time, torch, mxkit
from triton.testing import do_bench
from mxkit.kernels.fold import quantize_fold_triton
from mxkit.kernels.matmul import _fixup
torch.manual_seed(0)
def wall(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6
print("M N K | new us/call | old (sync) us/call | fixup kernel alone us (no flags) | cuBLAS bf16 us")
for M, N, K in [(1, 2880, 4096), (256, 1024, 1024), (1024, 5120, 2880), (1024, 2880, 4096), (4096, 5120, 2880), (1024, 28672, 8192), (8192, 8192, 8192)]:
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    pw = mxkit.pack_weight(mxkit.quantize(w, "mxfp4"), act="mx")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    new = lambda: mxkit.matmul(quantize_fold_triton(x, "mxfp4", defer=True), pw)
    old = lambda: mxkit.matmul(dataclasses.replace(quantize_fold_triton(x, "mxfp4", defer=True), source=None), pw)
    assert torch.equal(new(), old())
    p = quantize_fold_triton(x, "mxfp4", defer=True)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    fk = do_bench(lambda: _fixup(y, p.source, pw.source, None, M, N, K, fold=(p.status, p.folded.scale), special=pw.special_rows), rep=50) * 1e3
    wd = mxkit.dequantize(pw.source, torch.bfloat16)
    cb = do_bench(lambda: x @ wd.T, rep=50) * 1e3
    print(f"{M}x{N}x{K} | {wall(new):.1f} | {wall(old):.1f} | {fk:.1f} | {cb:.1f}", flush=True)
print("FP8 GEMM (cuBLAS _scaled_mm, fp32 out) row error vs float64, relative to the row norm; mx-exact the same")
from mxkit.kernels.matmul import _fp8_gemm
for fmt in ("mxfp4_e2m1", "mxfp6_e2m3"):
    for K in (192, 2880, 8192):
        a = mxkit.quantize(torch.randn(512, K, device="cuda"), fmt)
        pw = mxkit.pack_weight(mxkit.quantize(torch.randn(256, K, device="cuda"), fmt))
        a64 = mxkit.dequantize(a, torch.float32).double(); w64 = mxkit.dequantize(pw.source, torch.float32).double()
        y64 = a64 @ w64.T
        from mxkit.kernels.matmul import _fold
        fa = _fold(a)
        yf = _fp8_gemm(fa.data, fa.scale.reshape(-1, 1), pw.folded, 256, torch.float32, None).double()
        ye = mxkit.matmul(a, pw, out_dtype=torch.float32).double()
        rel = lambda y: ((y - y64).norm(dim=1) / y64.norm(dim=1)).max().item()
        print(f"{fmt} K={K}: fp8 {rel(yf):.2e}  mx-exact {rel(ye):.2e}  (K*2^-24 = {K * 2**-24:.1e})", flush=True)
print("time of fp32 out (mx-exact) vs bf16 out (fold-fp8), us")
for M, N, K in [(1024, 5120, 2880), (8192, 8192, 8192)]:
    a = mxkit.quantize(torch.randn(M, K, device="cuda"), "mxfp4")
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda"), "mxfp4"), act="mx")
    t32 = do_bench(lambda: mxkit.matmul(a, pw, out_dtype=torch.float32), rep=100) * 1e3
    t16 = do_bench(lambda: mxkit.matmul(a, pw), rep=100) * 1e3
    print(f"{M}x{N}x{K}: mx-exact {t32:.1f}  fold-fp8 {t16:.1f}", flush=True)
