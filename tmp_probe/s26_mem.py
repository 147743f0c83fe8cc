import sys
sys.path.insert(0, "src")
import torch
from torch import nn
from mxkit.nn import MXMoE
E, H, I, k = 32, 2880, 2880, 4  # one GPT-OSS-20B MoE layer
g = torch.Generator(device="cuda").manual_seed(0)
router = nn.Linear(H, E, device="cuda", dtype=torch.bfloat16)
def dense():
    return (torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05, torch.randn(E, 2 * I, device="cuda", generator=g) * 0.1,
            torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05, torch.randn(E, H, device="cuda", generator=g) * 0.1)
for keep in (False, True):
    m = MXMoE.from_dense(router, *dense(), k, "mxfp4", keep_source=keep)
    torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        for T in (1, 64, 1024):
            m(torch.randn(T, H, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    print(f"keep_source={keep}: experts {m.expert_nbytes/1e6:.1f} MB; allocated after decode+prefill +{(torch.cuda.memory_allocated()-base)/1e6:.1f} MB, peak +{(torch.cuda.max_memory_allocated()-base)/1e6:.1f} MB, layout {m.expert_layout}", flush=True)
    del m
