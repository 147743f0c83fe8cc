"""Where a GPT-OSS MoE prefill call goes on the H200 (the production path: experts in the decode-mma layout, the
grouped wgmma kernel, mixed block sizes): the call timed after the read flush, its kernels by torch profiler
(µs a call, each launch of the grouped GEMMs on its own line), and the same GEMMs' work run dense on the kernel
(M = the (token, slot) pairs against one expert's weight: no padding, one launch, the weight in L2) for the
grouped kernel's efficiency against the dense one; the two torch._grouped_mm GEMMs of `mxkit bench moe`.
PYTHONPATH=src python3 benchmarks/probes/moe_prefill_profile.py gpt-oss-120b 16384"""
import sys
from collections import defaultdict

import torch

from mxkit.bench import moe as bm
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul_details._mma_decode import pack_mma
from mxkit.kernels.matmul_details._w4a16_wgmma import w4a16_wgmma
from mxkit.kernels.moe import moe_triton, pack_experts_mma

model = sys.argv[1] if len(sys.argv) > 1 else "gpt-oss-120b"
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "16384").split(",")]
cfg = TimingConfig(warmup_ms=10, rep_ms=40)
w = bm.weights(model, "cuda")
E = bm.MODELS[model]
packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
print(torch.cuda.get_device_name(0), model, f"E={E}")


def tflops(flop: float, us: float) -> str:
    return f"{flop / us / 1e6:.0f} TFLOP/s"


for T in tokens:
    tw, ids = bm.routing(T, E, "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    n = T * bm.TOP_K
    flop = 2 * n * bm.HIDDEN * bm.INTER * 3  # gate_up (2I x H) and down (H x I)

    def call():
        return moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)

    t_call = time_us(call, cfg)
    case = bm.MoeCase(model=model, T=T, routing="uniform", mode="w4a16")
    peer = bm._grouped(case, bm.Inputs(x, tw, ids, w), None, gemms_only=True)
    t_peer = time_us(peer, cfg)
    print(f"\ntokens {T}: mxkit call {t_call[0]:.1f} µs (write flush {t_call[1]:.1f}), {tflops(flop, t_call[0])}; "
          f"_grouped_mm GEMMs {t_peer[0]:.1f} µs ({tflops(flop, t_peer[0])}); x {t_peer[0] / t_call[0]:.2f}")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    reps = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:70]][0] += ev.device_time / reps
            per[ev.name[:70]][1] += 1
    total = sum(v[0] for v in per.values())
    print(f"kernels a call (profiler): {total:.1f} µs")
    for name, (us, cnt) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us:9.1f} µs  x{cnt // reps}  {name}")
    # the same work dense: M = n rows against one expert's weight, in the decode-mma layout (x's K order as is:
    # the values do not matter for the time)
    for N, K, name in ((2 * bm.INTER, bm.HIDDEN, "gate_up"), (bm.HIDDEN, bm.INTER, "down")):
        q, s = pack_mma(w.w1.qdata[0].reshape(N, K // 2) if name == "gate_up" else w.w2.qdata[0].reshape(N, K // 2),
                        w.w1.plain_scale()[0].reshape(N, K // 32) if name == "gate_up"
                        else w.w2.plain_scale()[0].reshape(N, K // 32))
        xd = torch.randn(n, K, device="cuda", dtype=torch.bfloat16) * 0.1
        out = torch.float32 if name == "down" else torch.bfloat16
        for bmx in (128, 256):
            t = time_us(lambda: w4a16_wgmma(xd, q, s, N, True, out=out, bm=bmx, layout="mma"), cfg)
            print(f"dense {name} {n}x{N}x{K} bm {bmx} ({out}): {t[0]:.1f} µs, {tflops(2 * n * N * K, t[0])}")
        if name == "gate_up":
            t = time_us(lambda: w4a16_wgmma(xd, q, s, N, True, bm=256, layout="mma", activation="swiglu_gpt_oss"),
                        cfg)
            print(f"dense {name} {n}x{N}x{K} bm 256 + SwiGLU (bf16 [M, N / 2]): {t[0]:.1f} µs, "
                  f"{tflops(2 * n * N * K, t[0])}")
# the per-tile fixed cost: dense M x 5760 x K at K = 2880, 5760, 11520 (t = fixed + K-proportional)
M = 16384
for K in (2880, 5760, 11520):
    N = 5760
    wq = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8)
    ws = torch.randint(118, 124, (N, K // 32), device="cuda", dtype=torch.uint8)
    q, s = pack_mma(wq, ws)
    xd = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    t = time_us(lambda: w4a16_wgmma(xd, q, s, N, True, bm=256, layout="mma"), cfg)
    print(f"dense {M}x{N}x{K} bm 256: {t[0]:.1f} µs, {tflops(2 * M * N * K, t[0])}")
