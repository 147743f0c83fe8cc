"""Where a fold-path MoE call goes (W4A8 and MXFP4 x MXFP4, GPT-OSS experts folded to E4M3): each kernel's µs a
call by torch profiler (the mean of 5 calls, in launch order; the profiler inflates short kernels: compare within
a run), the call's time after the read flush beside it.
PYTHONPATH=src python3 benchmarks/probes/moe_fold_profile.py [gpt-oss-120b] [16384] [w4a8,mxfp4]"""
import sys

import torch

from mxkit.bench import moe as bm
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.moe import fold_experts, moe_mxfp4_triton, moe_w4a8_triton
from mxkit.ops import quantize_fp8_rowwise

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
modes = (sys.argv[3] if len(sys.argv) > 3 else "w4a8,mxfp4").split(",")
w = bm.weights(model, "cuda")
E = bm.MODELS[model]
tw, ids = bm.routing(T, E, "uniform", "cuda")
x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
f1, f2 = fold_experts(w.w1), fold_experts(w.w2)
print(torch.cuda.get_device_name(0), model, f"E={E}", f"T={T}")
calls = {"w4a8": lambda: moe_w4a8_triton(quantize_fp8_rowwise(x), f1, w.b1, f2, w.b2, tw, ids),
         "mxfp4": lambda: moe_mxfp4_triton(x, f1, w.b1, f2, w.b2, tw, ids)}
for mode in modes:
    fn = calls[mode]
    t = time_us(fn, TimingConfig(warmup_ms=10, rep_ms=40))[0]
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ev = [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = len(ev) // 5
    print(f"\n{mode}: {t:.1f} us a call (read flush); kernels, µs a call:")
    total = 0.0
    for i in range(per):
        us = sum(ev[i + j * per][1] for j in range(5)) / 5
        total += us
        print(f"  {us:9.1f}  {ev[i][0][:100]}")
    print(f"  {total:9.1f}  (sum)")
