import cProfile, pstats, torch, time
from mxkit.bench import moe as bm
from mxkit.kernels.moe import moe_triton, pack_experts_mma
dev = torch.device("cuda")
w = bm.weights("gpt-oss-20b", dev)
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
g = torch.Generator().manual_seed(0)
top, ids64 = torch.topk(torch.randn(1, 32, generator=g).to(dev), 4, dim=-1)
tw = torch.softmax(top, -1)
x = torch.randn(1, bm.HIDDEN, device=dev, dtype=torch.bfloat16)
f = lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids64, packed=packed)
for _ in range(50): f()
torch.cuda.synchronize()
for rep in range(3):
    t0 = time.perf_counter_ns()
    for _ in range(200): f()
    t1 = time.perf_counter_ns(); torch.cuda.synchronize()
    print("host us/call", (t1 - t0) / 200 / 1e3)
pr = cProfile.Profile(); pr.enable()
for _ in range(300): f()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
