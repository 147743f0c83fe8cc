import sys, time, statistics
sys.path.insert(0, "src")
import torch
from mxkit.bench import moe as bm
from mxkit.kernels import moe as km
from mxkit.kernels.matmul_details._w4a16_wgmma import w4a16_wgmma

def host(fn, n=200):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t0)
        if i % 8 == 7: torch.cuda.synchronize()
    return statistics.median(ts) / 1e3

def gpu(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000_000)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / n

for model, T in (("gpt-oss-20b", 256), ("gpt-oss-20b", 1024), ("gpt-oss-120b", 1024)):
    w = bm.weights(model, "cuda"); E = bm.MODELS[model]
    packed = (km.pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), km.pack_experts_wgmma(w.w2))
    tw, ids = bm.routing(T, E, "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    full = lambda: km.moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)
    n = T * 4
    b = km.wgmma_block_m(n / E)
    B = km.max_blocks(n, E, b)
    sid, eids, pos = km._align_rows(ids, E, b, 0, B)
    xs = km.gather_rows(x, sid, n, 4)
    p1, p2 = packed
    b1 = km._packed_bias(w.b1, p1.shape[1], "swiglu_gpt_oss")
    h = torch.empty(sid.numel(), p1.shape[1] // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(sid.numel(), p2.shape[1], dtype=torch.float32, device="cuda")
    parts = {"full moe_triton": full,
             "align": lambda: km._align_rows(ids, E, b, 0, B),
             "gather": lambda: km.gather_rows(x, sid, n, 4),
             "gemm1": lambda: w4a16_wgmma(xs, p1.q, p1.st, p1.shape[1], p1.one_mul, bias=b1, y=h, expert_ids=eids, bm=b, activation="swiglu_gpt_oss"),
             "gemm2": lambda: w4a16_wgmma(h, p2.q, p2.st, p2.shape[1], p2.one_mul, out=torch.float32, y=y, expert_ids=eids, bm=b),
             "combine": lambda: km._combine(y, w.b2, tw, pos, ids, torch.bfloat16)}
    for k_, f in parts.items():
        print(f"{model} T={T} bm={b} {k_:16s} host {host(f):7.1f} us   gpu {gpu(f):7.1f} us", flush=True)
