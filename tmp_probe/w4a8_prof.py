"""Kernel-level profile of the W4A8 MoE prefill path and the W4A16 wgmma path (GPT-OSS-120B, uniform)."""
import os, sys
sys.path.insert(0, "src")
import torch
from torch.profiler import profile, ProfilerActivity
from mxkit.bench import moe as bm
from mxkit.kernels.moe import fold_experts, moe_w4a8_triton, moe_triton, pack_experts_wgmma
from mxkit.ops import quantize_fp8_rowwise

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "4096,16384").split(",")]
w = bm.weights(model, "cuda")
E = bm.MODELS[model]
f1, f2 = fold_experts(w.w1), fold_experts(w.w2)
packed = (pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(w.w2))
for T in tokens:
    tw, ids = bm.routing(T, E, "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    fns = {"w4a8": lambda: moe_w4a8_triton(quantize_fp8_rowwise(x), f1, w.b1, f2, w.b2, tw, ids),
           "w4a16": lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        reps = 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        ev = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                ev.setdefault(e.name[:90], []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        tot = sum(sum(v) for v in ev.values()) / reps
        print(f"== {model} T={T} {name}: total kernel time {tot:.0f} us per call")
        for k_, v in sorted(ev.items(), key=lambda kv: -sum(kv[1])):
            print(f"   {sum(v) / reps:9.1f} us  x{len(v) // reps}  {k_}")
        print(flush=True)
