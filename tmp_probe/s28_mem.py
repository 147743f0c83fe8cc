"""W4A8 MXMoE memory at GPT-OSS-120B layer dims: MX bytes, keep_source (MX + fold copy), fold in place."""
import torch, mxkit
from torch import nn
from mxkit.nn import MXMoE
dev = "cuda"
E, H, I, k = 128, 2880, 2880, 4
router = nn.Linear(H, E).to(torch.bfloat16).to(dev)
def build(keep):
    g = torch.Generator(device=dev).manual_seed(0)
    m = MXMoE(H, I, E, k, "mxfp4", act_format="fp8_e4m3_rowwise", keep_source=keep, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, shape in (("gate_up", (E, 2 * I, H)), ("down", (E, H, I))):
            for e0 in range(0, E, 16):
                q = mxkit.quantize(torch.randn((16,) + shape[1:], device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")
                getattr(m, f"{name}_qdata")[e0:e0 + 16].copy_(q.qdata)
                getattr(m, f"{name}_scale")[e0:e0 + 16].copy_(q.scale)
    return m
x = torch.randn(64, H, device=dev, dtype=torch.bfloat16)
ys = {}
for keep in (True, False):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = build(keep)
    mx = torch.cuda.memory_allocated() - base
    with torch.no_grad():
        ys[keep] = m(x)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() - base
    print(f"keep_source={keep}: layout {m.expert_layout}, MX experts {mx/1e9:.3f} GB, after the first forward "
          f"{after/1e9:.3f} GB ({after/mx:.2f}x), peak {(torch.cuda.max_memory_allocated()-base)/1e9:.3f} GB, "
          f"expert_nbytes {m.expert_nbytes/1e9:.3f} GB")
    sd = m.state_dict()
    del m, sd
print("outputs equal:", torch.equal(ys[True].view(torch.int16), ys[False].view(torch.int16)))
