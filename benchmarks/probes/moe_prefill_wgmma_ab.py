"""MoE prefill A/B on a GPU (GPT-OSS experts, uniform routing, clean-L2 read flush): the two torch._grouped_mm bf16
GEMMs (the issue's peer), mxkit's Triton grouped path (no packed experts), and the grouped wgmma path at sorted
block sizes 64 / 128 / 256 (MXKIT_MOE_WGMMA_BM), with each path's relative error against the Triton path.
Run from the repo root: PYTHONPATH=src python3 benchmarks/probes/moe_prefill_wgmma_ab.py gpt-oss-120b 256,1024,4096,16384"""
import os
import sys

import torch

from mxkit.bench import moe as bm
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.moe import moe_triton, pack_experts_wgmma, wgmma_block_m

BMS = [int(b) for b in os.environ.get("BMS", "64,128,256").split(",")]
model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "256,1024,4096,16384").split(",")]
cfg = TimingConfig(warmup_ms=10, rep_ms=float(os.environ.get("REP_MS", 20)))
w = bm.weights(model, "cuda")
E = bm.MODELS[model]
packed = (pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(w.w2))
print(f"{model} E={E}: tokens | grouped_mm GEMMs us | triton us (x) | wgmma bm={' / '.join(map(str, BMS))} us (x) | default bm | "
      "rel err wgmma vs triton")
for T in tokens:
    case = bm.MoeCase(model=model, T=T, routing="uniform", mode="w4a16")
    tw, ids = bm.routing(T, E, "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    inp = bm.Inputs(x, tw, ids, w)
    peer = bm._grouped(case, inp, None, gemms_only=True)
    t_peer = time_us(peer, cfg)[0]
    ref = moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids)
    t_tri = time_us(lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids), cfg)[0]
    cells = []
    for b in BMS:
        os.environ["MXKIT_MOE_WGMMA_BM"] = str(b)
        y = moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)
        err = ((y.double() - ref.double()).norm() / ref.double().norm()).item()
        t = time_us(lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed), cfg)
        cells.append(f"{t[0]:.1f} ({t_peer / t[0]:.2f}x, w {t[1]:.1f}, err {err:.1e})")
    del os.environ["MXKIT_MOE_WGMMA_BM"]
    print(f"{T} | {t_peer:.1f} | {t_tri:.1f} ({t_peer / t_tri:.2f}x) | {' / '.join(cells)} | "
          f"{wgmma_block_m(T * 4 / E)}", flush=True)

if os.environ.get("SPLIT"):  # the default block size's steps alone, at the last token count
    from mxkit.kernels.matmul_details._layout_wgmma import expert_row_order
    from mxkit.kernels.matmul_details._w4a16_wgmma import w4a16_wgmma
    from mxkit.kernels.moe import align_device
    from mxkit.kernels.moe_details._rows import _combine
    from mxkit.kernels.moe_details._sort import _sorted_rows

    p1, p2 = packed
    n, b = T * 4, wgmma_block_m(T * 4 / E)
    ids_s, eids = align_device(ids, E, b)
    xs = x[torch.where(ids_s < n, ids_s // 4, 0)]
    b1 = w.b1.float()[:, expert_row_order(p1.shape[1], "swiglu_gpt_oss", "cuda")].reshape(-1).contiguous()
    h = torch.empty(ids_s.numel(), p1.shape[1] // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(ids_s.numel(), p2.shape[1], dtype=torch.float32, device="cuda")
    pos = _sorted_rows(ids_s, n)
    steps = {
        "align": lambda: align_device(ids, E, b),
        "gather": lambda: x[torch.where(ids_s < n, ids_s // 4, 0)],
        "gemm1": lambda: w4a16_wgmma(xs, p1.q, p1.st, p1.shape[1], p1.one_mul, bias=b1, y=h, expert_ids=eids, bm=b,
                                     activation="swiglu_gpt_oss"),
        "gemm2": lambda: w4a16_wgmma(h, p2.q, p2.st, p2.shape[1], p2.one_mul, out=torch.float32, y=y,
                                     expert_ids=eids, bm=b),
        "sorted_rows": lambda: _sorted_rows(ids_s, n),
        "combine": lambda: _combine(y, w.b2, tw, pos, ids, torch.bfloat16),
    }
    rows = ids_s.numel()
    for name, fn in steps.items():
        t = time_us(fn, cfg)[0]
        extra = ""
        if name.startswith("gemm"):
            N, K = (p1.shape[1], p1.shape[2]) if name == "gemm1" else (p2.shape[1], p2.shape[2])
            extra = f" {2 * rows * N * K / t / 1e6:.0f} TFLOP/s on {rows} sorted rows ({rows / n:.2f}x the pairs)"
        print(f"  T={T} bm={b} {name}: {t:.1f} us{extra}", flush=True)
