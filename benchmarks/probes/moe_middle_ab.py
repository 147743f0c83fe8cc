"""The W4A8 MoE's middle pass (``_moe_epilogue._bias_act_fp8_kernel``: bias + activation + FP8 rowwise
requantization of each sorted row of the gate_up GEMM's bf16 output) against the version before session 65 (copied
here: a per-element division, two row reductions, the row in one block of the next power of two), GPT-OSS's shape
(h [R, 5760] -> [R, 2880]), µs after the read flush, GB/s of its bytes (h read, q and s written), the share of FP8
codes that differ from the old kernel's.
PYTHONPATH=src python3 benchmarks/probes/moe_middle_ab.py [rows] [warps,...]"""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from _probe import time_us  # noqa: E402

from mxkit.kernels.launch import _Launcher  # noqa: E402
from mxkit.kernels.matmul_details import _moe_epilogue as me  # noqa: E402
from mxkit.kernels.matmul_details._moe_epilogue import _bias_act_row  # noqa: E402
from mxkit.kernels.moe_details._fold import _middle_blocks  # noqa: E402


@triton.jit
def _bias_act_fp8_old(h_ptr, b_ptr, ids_ptr, eids_ptr, q_ptr, s_ptr, n_valid, N,
                      ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.program_id(0)
    v, valid = _bias_act_row(h_ptr, b_ptr, ids_ptr, eids_ptr, r, n_valid, N, ACT, HAS_BIAS, BLOCK_M, BLOCK_N)
    c = tl.arange(0, BLOCK_N // 2)
    amax = tl.max(tl.where(c < N // 2, tl.abs(v), 0.0), axis=0)
    has_nan = tl.sum(tl.where((c < N // 2) & (v != v), 1, 0), axis=0) > 0
    tiny = tl.full(amax.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, tl.maximum(amax / 448.0, tiny), 1.0)
    scale = tl.where(has_nan, float("nan"), scale)
    scale = tl.where(valid, scale, 0.0)
    q = tl.clamp(v / tl.where(valid, scale, 1.0), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    q = tl.where(valid, q, 0.0)
    tl.store(q_ptr + r.to(tl.int64) * (N // 2) + c, q.to(tl.float8e4nv), mask=c < N // 2)
    tl.store(s_ptr + r, scale)


OLD = _Launcher(sys.modules[__name__], "_bias_act_fp8_old")
NEW = _Launcher(me, "_bias_act_fp8_kernel")
R = int(sys.argv[1]) if len(sys.argv) > 1 else 66560
warps = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "4,8,16").split(",")]
N, E, dev = 5760, 128, torch.device("cuda")
h = (torch.randn(R, N, device=dev) * 3).to(torch.bfloat16)
b = torch.randn(E, N, device=dev) * 0.1
ids = torch.arange(R, dtype=torch.int32, device=dev)
eids = torch.randint(0, E, (R // 16,), dtype=torch.int32, device=dev)
consts = (("ACT", 1), ("HAS_BIAS", True), ("BLOCK_M", 16), ("BLOCK_N", triton.next_power_of_2(N)))
b_n, b_n2 = _middle_blocks(N)
new_consts = (("ACT", 1), ("HAS_BIAS", True), ("BLOCK_M", 16), ("BLOCK_N", b_n), ("BLOCK_N2", b_n2))
nbytes = R * N * 2 + R * N // 2 + R * 4
print(torch.cuda.get_device_name(0), f"R={R} N={N}")
outs = {}
for rnd in range(2):
    for name, fn, w in [("old", OLD, 4)] + [("new", NEW, w) for w in warps]:
        q = torch.empty(R, N // 2, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.empty(R, device=dev)

        def call():
            if name == "old":
                fn((R,), (h, b, ids, eids, q, s, R, N), consts, w)
            else:
                fn((R,), (h, b, ids, eids, q.view(torch.uint8), s, R, N), new_consts, w)
        call()
        t = time_us(call)
        outs[(name, w)] = (q, s)
        if rnd:
            q0, s0 = outs[("old", 4)]
            diff = float((q.view(torch.uint8) != q0.view(torch.uint8)).double().mean())
            print(f"{name} {w} warps: {t:.1f} us, {nbytes / t / 1e3:.0f} GB/s, codes != old {diff:.2e}, "
                  f"scales equal {torch.equal(s, s0)}", flush=True)
