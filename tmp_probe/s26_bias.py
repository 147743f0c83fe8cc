import sys, importlib.util
sys.path.insert(0, "src")
import torch
from mxkit.bench import moe as bm
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels import moe as km
spec = importlib.util.spec_from_file_location("mxkit.kernels.moe_old", "tmp_probe/moe_old.py")
old = importlib.util.module_from_spec(spec); sys.modules["mxkit.kernels.moe_old"] = old; spec.loader.exec_module(old)
w = bm.weights("gpt-oss-120b", "cuda"); E = 128
mma = (km.pack_experts_mma(w.w1), km.pack_experts_mma(w.w2))
mma_old = tuple(old.MmaExperts(p.q, p.s, p.shape, p.special, p.interleaved, p.one_mul, p.bf16_exact) for p in mma)
for dt in (torch.float32, torch.bfloat16):
    b1, b2 = w.b1.to(dt), w.b2.to(dt)
    for T in (1, 4, 64):
        tw, ids = bm.routing(T, E, "uniform", "cuda")
        x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
        r = {}
        for name, mod, p in (("before", old, mma_old), ("after", km, mma)):
            f = bm.graphed(lambda: mod.moe_triton(x, w.w1, b1, w.w2, b2, tw, ids, packed=p))
            r[name] = (cuda_event_bench(f, rep_ms=60), f().float().clone())
        same = torch.equal(r["before"][1], r["after"][1])
        print(f"bias {dt} T={T}: before {r['before'][0]:7.1f} us  after {r['after'][0]:7.1f} us  bitwise equal {same}", flush=True)
