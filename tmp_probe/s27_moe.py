import os, time, cProfile, pstats, torch
from triton.testing import do_bench
from mxkit.bench import moe as bm
from mxkit.kernels.moe import moe_triton, pack_experts_mma
for model, T in (("gpt-oss-20b", 1024), ("gpt-oss-120b", 4096)):
    E = 32 if model.endswith("20b") else 128
    w = bm.weights(model, "cuda")
    tw, ids = bm.routing(T, E, "uniform", "cuda")
    x = torch.randn(T, 2880, device="cuda", dtype=torch.bfloat16)
    packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
    for m in ("0", "1"):
        os.environ["MXKIT_MOE_MIXED"] = m
        f = lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)
        for _ in range(3): f()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20): f()
        torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 20 * 1e6
        gpu = do_bench(f, rep=200) * 1e3
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20): f()
        host = (time.perf_counter() - t) / 20 * 1e6
        torch.cuda.synchronize()
        print(f"{model} T={T} mixed={m}: wall {wall:.0f} us, do_bench {gpu:.0f} us, host enqueue {host:.0f} us", flush=True)
        if m == "1" and model.endswith("20b"):
            pr = cProfile.Profile(); pr.enable()
            for _ in range(10): f()
            pr.disable(); torch.cuda.synchronize()
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)
