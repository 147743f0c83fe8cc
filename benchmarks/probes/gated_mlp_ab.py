"""A gated MLP at decode sizes, its gate / up GEMM and SiLU product in one launch (``mxkit.nn.MXGatedMLP``) against
``fuse_siblings``' stacked GEMM then HF's ``silu(gate) * up`` kernel: L layers of MXFP4 weights of the model's
shape (distinct weights: no layer reads another's bytes from L2) chained in one CUDA graph, µs a layer over the
replays (median of R rounds, the two variants alternating).

    PYTHONPATH=src python3 benchmarks/probes/gated_mlp_ab.py [H I [M [L [R]]]]   # default 4096 14336 1 8 5

(The one launch runs at M = 1 only; at other M both variants run the GEMM path.)
"""
import sys

import torch
from torch import nn

import mxkit
from mxkit.nn import MXGatedMLP, fuse_siblings

H, I, M, L, R = (list(map(int, sys.argv[1:])) + [4096, 14336, 1, 8, 5][len(sys.argv) - 1:])[:5]


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        kw = dict(bias=False, device="cuda", dtype=torch.bfloat16)
        self.gate_proj, self.up_proj = nn.Linear(H, I, **kw), nn.Linear(H, I, **kw)
        self.down_proj, self.act_fn = nn.Linear(I, H, **kw), nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def layers(kind: str) -> list:
    torch.manual_seed(0)
    out = []
    for _ in range(L):
        m = MLP()
        mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
        if kind == "gated":
            m = MXGatedMLP(m.gate_proj, m.up_proj, m.down_proj)
        else:
            fuse_siblings(m)
        out.append(m)
    return out


def graph(mods, x):
    def step(x):
        for m in mods:  # (residual, as in the decoder: x keeps its size over the layers)
            x = x + m(x)
        return x

    with torch.no_grad():
        for _ in range(2):
            step(x)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = step(x)
    return g, y


x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16) * 0.5
mods = {k: layers(k) for k in ("fused", "gated")}
variants = {k: graph(m, x) for k, m in mods.items()}
ys = {}
for k, (g, y) in variants.items():
    g.replay()
    ys[k] = y.float().clone()
diff = ((ys["gated"] - ys["fused"]).norm() / ys["fused"].norm()).item()
print(f"H={H} I={I} M={M} L={L}: outputs rel. diff {diff:.2e} (|y| {ys['fused'].norm():.3g}); gated one launch: "
      f"{all(m._launch() is not None for m in mods['gated'])}")
times = {k: [] for k in variants}
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for r in range(R):
    for k in (("fused", "gated") if r % 2 == 0 else ("gated", "fused")):
        g = variants[k][0]
        g.replay()
        torch.cuda.synchronize()
        e0.record()
        for _ in range(20):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        times[k].append(e0.elapsed_time(e1) * 1e3 / 20 / L)
for k, v in times.items():
    v.sort()
    print(f"{k:6s} µs a layer: median {v[len(v) // 2]:.2f}  (all {', '.join(f'{t:.2f}' for t in v)})")
