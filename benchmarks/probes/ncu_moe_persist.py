"""Nsight Compute counters of the grouped w4a16-wgmma launches of one GPT-OSS MoE prefill call, one program a tile
against the persistent schedule (MXKIT_WGMMA_PERSIST=0 / the sizes given): why the persistent schedule loses on
the 256-row launches of the mixed plan (session 59: 3242 -> 4181 µs at 16384 tokens). Run under
benchmarks/probes/ncu_moe_persist.sh.
PYTHONPATH=src python3 benchmarks/probes/ncu_moe_persist.py [gpt-oss-120b] [tokens] [persist sizes: 256]"""
import os
import sys

import torch

from mxkit.bench import moe as bm
from mxkit.kernels.moe import moe_triton, pack_experts_mma

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
sizes = sys.argv[3] if len(sys.argv) > 3 else "256"
w = bm.weights(model, "cuda")
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
tw, ids = bm.routing(T, bm.MODELS[model], "uniform", "cuda")
x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def call():
    return moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)


outs = {}
for p in ("0", sizes):
    os.environ["MXKIT_WGMMA_PERSIST"] = p
    outs[p] = call().clone()  # (compiles)
torch.cuda.synchronize()
print("same bytes:", torch.equal(outs["0"].view(torch.uint8), outs[sizes].view(torch.uint8)), flush=True)
for p in ("0", sizes):
    os.environ["MXKIT_WGMMA_PERSIST"] = p
    print(f"ncu case persist={p} (launch order: gate_up 256 / 128 / 64, then down 256 / 128 / 64)", flush=True)
    flush.fill_(1)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
