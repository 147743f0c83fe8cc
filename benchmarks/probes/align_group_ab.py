"""The MoE sort's programs (``_sort._align_experts``: one program per (expert, GROUP chunks of 1024 pairs)):
``ALIGN_GROUP`` variants on GPT-OSS's prefill sizes (uniform top-4 routing), µs after the read flush, every output
equal to the first variant's.
PYTHONPATH=src python3 benchmarks/probes/align_group_ab.py [E:tokens,...] [groups,...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import time_us  # noqa: E402

from mxkit.kernels.moe_details import _sort  # noqa: E402
from mxkit.kernels.moe import max_blocks  # noqa: E402

cases = (sys.argv[1] if len(sys.argv) > 1 else "128:16384,128:4096,32:16384,128:1024").split(",")
groups = [int(g) for g in (sys.argv[2] if len(sys.argv) > 2 else "8,4,2,1").split(",")]
print(torch.cuda.get_device_name(0))
for case in cases:
    E, T = (int(v) for v in case.split(":"))
    ids = torch.rand(T, E, device="cuda").topk(4, 1).indices.to(torch.int32)
    B = max_blocks(T * 4, E, 16)
    t, outs = {}, {}
    for _ in range(2):
        for g in groups:
            _sort.ALIGN_GROUP = g

            def call():
                return _sort._align_experts(ids, E, 16, 0, B, top_k=4, offs=True)
            outs[g] = call()
            t[g] = min(t.get(g, 1e9), time_us(call))
    same = all(all(torch.equal(a, b) for a, b in zip(outs[g], outs[groups[0]])) for g in groups)
    print(f"E={E} tokens={T}: " + ", ".join(f"group {g} {t[g]:.1f} us" for g in groups) + f"; same outputs {same}",
          flush=True)
