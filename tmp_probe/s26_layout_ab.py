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
    for T in (128, 256, 1024, 4096, 16384):
        tw, ids = bm.routing(T, E, "uniform", "cuda")
        x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
        res = {}
        for name, packed in (("wgmma-layout", wg), ("mma-layout", mma)):
            f = lambda: km.moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)
            y = f().float()
            res[name] = (cuda_event_bench(f, rep_ms=80), y)
        a, b = res["wgmma-layout"][1], res["mma-layout"][1]
        print(f"{model} T={T:5d} " + " ".join(f"{k} {v[0]:8.1f} us" for k, v in res.items())
              + f"  ratio {res['wgmma-layout'][0] / res['mma-layout'][0]:.3f}  rel diff {float((a-b).norm()/a.norm()):.2e}", flush=True)
