import cProfile, pstats, torch, mxkit
from mxkit.kernels.fold import quantize_fold_triton
M, N, K = 256, 1024, 1024
pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device="cuda"), "mxfp4"), act="mx")
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
f = lambda: mxkit.matmul(quantize_fold_triton(x, "mxfp4", defer=True), pw)
for _ in range(20): f()
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for _ in range(200): f()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
