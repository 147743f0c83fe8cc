"""A/B of the grouped W4A16 prefill's block plans on the GPT-OSS MoE call (moe_triton on experts in the
decode-mma layout), one process, clean-L2 read flush, interleaved rounds; plus each plan's wgmma launches
(torch profiler) and the block counts, for a per-tile cost model.
Plans are env settings read per call (mxkit.kernels.moe_details._prefill.block_plan, _w4a16_wgmma._persist).
PYTHONPATH=src python3 benchmarks/probes/moe_blocks_ab.py [gpt-oss-120b] [tokens,...] [plan,...]
plan: see setenv."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import host_us, launches, moe_prefill_case  # noqa: E402
from moe_blocks_ab_env import KEYS, setenv  # noqa: E402

from mxkit.bench import moe as bm  # noqa: E402
from mxkit.bench.timing import TimingConfig, time_us  # noqa: E402
from mxkit.kernels.moe import pack_experts_mma  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "2048,4096,8192,16384").split(",")]
plans = (sys.argv[3] if len(sys.argv) > 3 else "default,s128,s128p,m,mp,s256,s64").split(",")
rounds = int(os.environ.get("ROUNDS", "2"))
cfg = TimingConfig(warmup_ms=10, rep_ms=40)
cfg_spin = TimingConfig(warmup_ms=10, rep_ms=40, spin_us=1500.0)
print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "| rounds", rounds)


w = bm.weights(model, "cuda")
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
print(f"\nMoE {model} W4A16 prefill | plans {plans}")
print("tokens | _grouped_mm GEMMs µs | " + " | ".join(plans) + " | same bytes")
for T in tokens:
    call, t_peer = moe_prefill_case(model, w, packed, T, cfg)
    t, ys = {}, {}
    for _ in range(rounds):
        for p in plans:
            setenv(p)
            ys[p] = call().clone()
            t.setdefault(p, []).append(time_us(call, cfg)[0])
    ref = ys[plans[0]].view(torch.uint8)
    same = all(torch.equal(ref, v.view(torch.uint8)) for v in ys.values())
    cells = " | ".join(f"{min(v):.1f} ({max(v):.0f})" for v in t.values())
    print(f"{T} | {t_peer:.1f} | {cells} | {same}", flush=True)
    for p in plans:
        setenv(p)
        ls = launches(call, "w4a16_wgmma")
        slow = time_us(call, cfg_spin)[0]
        print(f"    {p}: wgmma launches µs " + " ".join(f"{v:.0f}" for v in ls) + f" | sum {sum(ls):.0f} | host µs a "
              f"call {host_us(call):.0f} | µs with a {cfg_spin.spin_us:.0f} µs spin {slow:.1f}", flush=True)
for k in KEYS:
    os.environ.pop(k, None)
