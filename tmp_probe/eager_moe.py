import time, statistics, torch, sys
from mxkit.bench import moe as bm
from mxkit.kernels.moe import moe_triton, pack_experts_mma
dev = torch.device("cuda")
for model in ("gpt-oss-20b",):
    w = bm.weights(model, dev)
    packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
    E = bm.MODELS[model]
    for T in (1, 2, 4):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(T, E, generator=g).to(dev)
        top, ids64 = torch.topk(logits, 4, dim=-1)   # int64, as a router gives them
        tw = torch.softmax(top, -1)
        x = torch.randn(T, bm.HIDDEN, device=dev, dtype=torch.bfloat16)
        f = lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids64, packed=packed)
        for _ in range(20): f()
        torch.cuda.synchronize()
        host = []
        for r in range(400):
            t0 = time.perf_counter_ns(); f(); host.append((time.perf_counter_ns() - t0) / 1e3)
            if r % 32 == 31: torch.cuda.synchronize()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200): f()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 200 * 1e6
        print(f"{sys.argv[1]} {model} T={T} int64 ids: host {statistics.median(host):.1f} us/call, eager wall {wall:.1f} us/call", flush=True)
