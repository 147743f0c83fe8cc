"""A/B of the w4a16-wgmma kernel's persistent schedule (MXKIT_WGMMA_PERSIST=1) against one program a tile (=0),
in one process, clean-L2 read flush: dense W4A16 prefill through mxkit.matmul on a PackedWeight (the plan's
path) and the GPT-OSS MoE prefill call (moe_triton on experts in the decode-mma layout) with torch._grouped_mm.
PYTHONPATH=src python3 benchmarks/probes/wgmma_persist_ab.py [dense MxNxK,...] [gpt-oss-120b] [tokens,...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import launches, moe_prefill_case  # noqa: E402

import mxkit  # noqa: E402
from mxkit.bench import moe as bm  # noqa: E402
from mxkit.bench.timing import TimingConfig, time_us  # noqa: E402
from mxkit.kernels.moe import pack_experts_mma  # noqa: E402

dense = [tuple(int(v) for v in s.split("x")) for s in
         (sys.argv[1] if len(sys.argv) > 1 else "4096x8192x8192,16384x5760x2880,8192x28672x8192").split(",")]
model = sys.argv[2] if len(sys.argv) > 2 else "gpt-oss-120b"
tokens = [int(t) for t in (sys.argv[3] if len(sys.argv) > 3 else "1024,4096,16384").split(",")]
cfg = TimingConfig(warmup_ms=10, rep_ms=40)
print(torch.cuda.get_device_name(0), "| torch", torch.__version__)


def ab(fn):
    """µs {"1": persistent, "0": one program a tile, "default": the library's choice}, and whether the three
    outputs are the same bytes."""
    t, ys = {}, {}
    for p in ("1", "0", "default", "1", "0", "default"):
        if p == "default":
            os.environ.pop("MXKIT_WGMMA_PERSIST", None)
        else:
            os.environ["MXKIT_WGMMA_PERSIST"] = p
        ys[p] = fn().clone()
        t[p] = min(t.get(p, 1e9), time_us(fn, cfg)[0])
    os.environ.pop("MXKIT_WGMMA_PERSIST", None)
    same = all(torch.equal(ys["1"].view(torch.uint8), v.view(torch.uint8)) for v in ys.values())
    return t, same


print("dense W4A16 MxNxK | cuBLAS bf16 µs | persistent µs | per tile µs | x | default µs | same bytes | "
      "TFLOP/s default")
for M, N, K in dense:
    w = torch.randn(N, K, device="cuda") * 2.0 ** torch.randint(-7, 0, (N, 1), device="cuda")
    pw = mxkit.pack_weight(mxkit.quantize(w.to(torch.bfloat16), "mxfp4_e2m1"))
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    wd = mxkit.dequantize(mxkit.quantize(w.to(torch.bfloat16), "mxfp4_e2m1"), torch.bfloat16)
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    t, same = ab(lambda: mxkit.matmul(x, pw))
    p, n, d = t["1"], t["0"], t["default"]
    print(f"{M}x{N}x{K} [{mxkit.gemm_plan(x, pw).path}] | {t_cub:.1f} | {p:.1f} | {n:.1f} | {n / p:.3f} | {d:.1f} | "
          f"{same} | {2 * M * N * K / d / 1e6:.0f}", flush=True)

w = bm.weights(model, "cuda")
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
print(f"\nMoE {model} W4A16 prefill, tokens | _grouped_mm GEMMs µs | persistent µs | per tile µs | x | "
      "default µs | same bytes | x _grouped_mm (default) | wgmma launches µs (persistent / per tile)")
for T in tokens:
    call, t_peer = moe_prefill_case(model, w, packed, T, cfg)
    t, same = ab(call)
    p, n, d = t["1"], t["0"], t["default"]
    each = {}
    for f in ("1", "0"):
        os.environ["MXKIT_WGMMA_PERSIST"] = f
        each[f] = launches(call, "w4a16_wgmma", 10)
    os.environ.pop("MXKIT_WGMMA_PERSIST", None)
    ls = " ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(each["1"], each["0"]))
    print(f"{T} | {t_peer:.1f} | {p:.1f} | {n:.1f} | {n / p:.3f} | {d:.1f} | {same} | {t_peer / d:.2f} | {ls}",
          flush=True)
