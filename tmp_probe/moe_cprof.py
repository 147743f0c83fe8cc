import sys, cProfile, pstats, io
sys.path.insert(0, "src")
import torch
from mxkit.bench import moe as bm
from mxkit.kernels import moe as km
model, T = "gpt-oss-20b", 1024
w = bm.weights(model, "cuda"); E = bm.MODELS[model]
packed = (km.pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), km.pack_experts_wgmma(w.w2))
tw, ids = bm.routing(T, E, "uniform", "cuda")
x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
f = lambda: km.moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)
for _ in range(20): f()
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for i in range(200):
    f()
    if i % 8 == 7: torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue()[:6000])
