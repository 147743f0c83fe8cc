import sys
sys.path.insert(0, "src")
import torch
from mxkit.bench import moe as bm
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels import moe as km

for model in ("gpt-oss-120b", "gpt-oss-20b"):
    w = bm.weights(model, "cuda"); E = bm.MODELS[model]
    mma = (km.pack_experts_mma(w.w1), km.pack_experts_mma(w.w2))
    wg = (km.pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), km.pack_experts_wgmma(w.w2))
    for T in (1, 4, 16, 64, 128):
        tw, ids = bm.routing(T, E, "uniform", "cuda")
        x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
        res = {}
        for name, packed, lim in (("mma", mma, 256), ("wgmma", wg, 0)):
            if name == "mma" and T * 4 > 256:
                continue
            km.MMA_MAX_PAIRS = lim
            f = bm.graphed(lambda: km.moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed))
            y = f().float().clone()
            res[name] = (cuda_event_bench(f, rep_ms=60), y)
        km.MMA_MAX_PAIRS = 256
        s = " ".join(f"{k} {v[0]:8.1f} us" for k, v in res.items())
        d = ""
        if len(res) == 2:
            a, b = res["mma"][1], res["wgmma"][1]
            d = f" max|diff| {float((a - b).abs().max()):.3g} rel {float((a-b).norm()/a.norm()):.2e}"
        for bmv in (16, 32):
            pass
        print(f"{model} T={T:4d} {s}{d}", flush=True)
