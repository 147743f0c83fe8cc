"""ncu look at the decode-mma kernels: dense M=1 8192^2, grouped GPT-OSS-120B T=1 and T=64."""
import sys, torch
sys.path.insert(0, "benchmarks/probes")
import mxkit
from mxkit.bench.moe import routing
from mxkit.kernels.matmul_details import _mma_decode as md
from mxkit.kernels.moe import align_device, pack_experts_mma
dev = torch.device("cuda")
todo = {}
w = mxkit.quantize(torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
b = mxkit.pack_weight(w)
x1 = torch.randn(1, 8192, device=dev, dtype=torch.bfloat16)
todo["dense 1x8192x8192"] = lambda: mxkit.matmul(x1, b)
E, H, I, TOPK = 128, 2880, 2880, 4
w1 = mxkit.quantize(torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
w2 = mxkit.quantize(torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
p1, p2 = pack_experts_mma(w1), pack_experts_mma(w2)
b1 = torch.randn(E, 2 * I, device=dev) * 0.1
b2 = torch.randn(E, H, device=dev) * 0.1
for T in (1, 64):
    tw, tid = routing(T, E, "uniform", dev)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    ids, eids = align_device(tid, E, 8)
    n = T * TOPK
    rw = tw.reshape(-1).contiguous()
    h = torch.empty(n, I, device=dev, dtype=torch.bfloat16)
    y = torch.empty(n, H, device=dev)
    todo[f"gu T={T}"] = (lambda x=x, ids=ids, eids=eids, n=n, h=h: md.grouped_mma(
        x, p1.q, p1.s, False, 2 * I, H, ids, eids, n, TOPK, gather=True, bias=b1, activation="swiglu_gpt_oss",
        rw=None, out=h))
    todo[f"dn T={T}"] = (lambda ids=ids, eids=eids, n=n, h=h, y=y, rw=rw: md.grouped_mma(
        h, p2.q, p2.s, False, H, I, ids, eids, n, TOPK, gather=False, bias=b2, activation=None, rw=rw, out=y))
for f in todo.values():
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, f in todo.items():
    print("ncu case:", name, flush=True)
    f()
    torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
