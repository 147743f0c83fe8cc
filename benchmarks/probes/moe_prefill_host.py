"""Host time of one eager GPT-OSS MoE prefill call (moe_triton on experts in the decode-mma layout): µs a call
with the GPU kept busy ahead (the launch path alone), and a cProfile of the calls (top functions by own time and
by cumulative time). Plans as benchmarks/probes/moe_blocks_ab.py.
PYTHONPATH=src python3 benchmarks/probes/moe_prefill_host.py [gpt-oss-20b] [tokens] [plan,...]"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import host_us  # noqa: E402
from moe_blocks_ab_env import setenv  # noqa: E402

from mxkit.bench import moe as bm  # noqa: E402
from mxkit.kernels.moe import moe_triton, pack_experts_mma  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-20b"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1536
plans = (sys.argv[3] if len(sys.argv) > 3 else "default,f").split(",")
w = bm.weights(model, "cuda")
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
tw, ids = bm.routing(T, bm.MODELS[model], "uniform", "cuda")
x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)


def call():
    return moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)


for p in plans:
    setenv(p)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    calls = 30
    print(f"{model} {T} tokens, plan {p}: host µs a call {host_us(call, calls):.0f}")
    # host µs a call of each stage (wrapped with a perf_counter pair)
    from mxkit.kernels.matmul_details import _w4a16_wgmma
    from mxkit.kernels.moe_details import _prefill

    spent: dict = {}

    def timed(mod, name):
        f = getattr(mod, name)

        def g(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
            return r
        setattr(mod, name, g)
        return mod, name, f

    saved = [timed(_prefill, n) for n in ("block_plan", "_align_rows", "mixed_blocks_device", "gather_rows",
                                          "_packed_bias", "_combine")]
    saved.append(timed(_w4a16_wgmma, "w4a16_wgmma"))
    launcher_of = _w4a16_wgmma._launcher

    class Proxy:  # a kernel's launcher, its Triton launches timed (prepared launches made below hold it)
        def __init__(self, launcher):
            self.launcher = launcher

        def __call__(self, *a, **k):
            t = time.perf_counter()
            self.launcher(*a, **k)
            spent["launch"] = spent.get("launch", 0.0) + time.perf_counter() - t

        def __getattr__(self, name):
            return getattr(self.launcher, name)

    saved.append((_w4a16_wgmma, "_launcher", launcher_of))
    _w4a16_wgmma._launcher = lambda *kernel: Proxy(launcher_of(*kernel))
    _w4a16_wgmma._PREPARED.clear()
    whole = host_us(call, calls)
    for mod, name, f in saved:
        setattr(mod, name, f)
    _w4a16_wgmma._PREPARED.clear()
    print(f"  stages, µs a call (whole {whole:.0f}): "
          + ", ".join(f"{k} {v / calls * 1e6:.1f}" for k, v in spent.items()))
    torch.cuda._sleep(int(2e9 * calls * 2e-3))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(25)
        print("\n".join(s.getvalue().splitlines()[:45]))
