"""Host µs a call of the wgmma prefill paths, prepared (WgmmaCall / w4a16_wgmma's prepared launch: a dense problem's
C++ fast call, the three TMA descriptors re-addressed to the call's tensors), with its ArgsLaunch only (one
cuLaunchKernel with x's TMA descriptor encoded from x alone), and the path before both (run_gemm each call through
its kept plan, Triton's TensorDescriptor and the launcher's key: the prepared launches switched off), the GPU kept
busy ahead (benchmarks/probes/_probe.host_us): dense mxkit.matmul on a PackedWeight and the GPT-OSS-20B MoE prefill
call; the same bytes both ways.
PYTHONPATH=src python3 benchmarks/probes/wgmma_host_ab.py [MxNxK,...] [moe tokens,...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import host_us  # noqa: E402

import mxkit  # noqa: E402
from mxkit.bench import moe as bm  # noqa: E402
from mxkit.kernels import matmul_calls as kc  # noqa: E402
from mxkit.kernels.matmul_details import _w4a16_wgmma as wg  # noqa: E402
from mxkit.kernels.moe import moe_triton, pack_experts_mma  # noqa: E402

shapes = [tuple(int(v) for v in s.split("x")) for s in
          (sys.argv[1] if len(sys.argv) > 1 else "256x4096x4096,512x4096x4096,64x8192x8192,1024x14336x4096").split(",")]
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "512,1536").split(",")]
CALLS, ROUNDS = 200, 5
print(torch.cuda.get_device_name(0), "| torch", torch.__version__)


class Off:
    """The prepared launches' C++ fast calls off while inside (``args``: the ArgsLaunch kept), or both off."""

    def __init__(self, args=False):
        self.args = args

    def __enter__(self):
        self.saved = {k: (p.fast, p.plan, p.sum_plan) for k, p in wg._PREPARED.items()}
        for p in wg._PREPARED.values():
            p.plan = p.sum_plan = False
            if not self.args:
                p.fast = False
        return self

    def __exit__(self, *exc):
        for k, (f, plan, sum_plan) in self.saved.items():
            if k in wg._PREPARED:
                wg._PREPARED[k].fast, wg._PREPARED[k].plan, wg._PREPARED[k].sum_plan = f, plan, sum_plan


def ab(new, old, calls=CALLS, gpu_ms=0.2):
    """(host µs new, host µs with the ArgsLaunch only, host µs old), min over interleaved rounds, and whether their
    outputs are the same bytes (``calls`` a round, ``gpu_ms`` of spin queued per call: no back-pressure from the
    launch queue)."""
    for _ in range(3):
        y_new = new()
    with Off(args=True):
        y_args = old()
    with Off():
        y_old = old()
    same = torch.equal(y_new.view(torch.uint8), y_old.view(torch.uint8)) and \
        torch.equal(y_args.view(torch.uint8), y_old.view(torch.uint8))
    t_new, t_args, t_old = 1e9, 1e9, 1e9
    for _ in range(ROUNDS):
        t_new = min(t_new, host_us(new, calls, gpu_ms))
        with Off(args=True):
            t_args = min(t_args, host_us(old, calls, gpu_ms))
        with Off():
            t_old = min(t_old, host_us(old, calls, gpu_ms))
    return t_new, t_args, t_old, same


x2 = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
t_torch = min(host_us(lambda: x2 * 2, CALLS, 0.05) for _ in range(ROUNDS))
print(f"torch x * 2: {t_torch:.1f} µs a call")
print("dense MxNxK | path | C++ fast call µs | ArgsLaunch µs | Triton launcher µs | x torch op (fast call) | "
      "same bytes")
for M, N, K in shapes:
    w = torch.randn(N, K, device="cuda") * 2.0 ** -4
    pw = mxkit.pack_weight(mxkit.quantize(w.to(torch.bfloat16), "mxfp4_e2m1"))
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    plan = mxkit.gemm_plan(x, pw)
    planned = kc.PlannedCall(pw, plan)
    t_new, t_args, t_old, same = ab(lambda: mxkit.matmul(x, pw), lambda: planned(x, None))
    print(f"{M}x{N}x{K} | {plan.path} | {t_new:.1f} | {t_args:.1f} | {t_old:.1f} | {t_new / t_torch:.2f} | {same}",
          flush=True)

model = "gpt-oss-20b"
wts = bm.weights(model, "cuda")
packed = (pack_experts_mma(wts.w1), pack_experts_mma(wts.w2))
print(f"\nMoE {model} prefill call (moe_triton, decode-mma layout) | prepared µs | ArgsLaunch µs | before µs | "
      "same bytes")
for T in tokens:
    tw, ids = bm.routing(T, bm.MODELS[model], "uniform", "cuda")
    x = torch.randn(T, bm.HIDDEN, device="cuda", dtype=torch.bfloat16)
    call = (lambda x=x, tw=tw, ids=ids: moe_triton(x, wts.w1, wts.b1, wts.w2, wts.b2, tw, ids, packed=packed))
    t_new, t_args, t_old, same = ab(call, call, 40, 2.0)
    print(f"{T} | {t_new:.1f} | {t_args:.1f} | {t_old:.1f} | {same}", flush=True)
