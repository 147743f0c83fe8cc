"""Kernels for an Nsight Compute look (one launch each, bf16 8192^2, after warm-up):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \\
        --section SchedulerStats --section WarpStateStats python3 scripts/ncu_quantize.py
"""

import torch

from mxkit.kernels import quantize as kq

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
q8 = kq._quantize_impl(x, "mxfp8_e4m3", -1, "floor", "rne", "plain")
cases = [
    ("rows fp8", lambda: kq._quantize_impl(x, "mxfp8_e4m3", -1, "floor", "rne", "plain")),
    ("rows fp4", lambda: kq._quantize_impl(x, "mxfp4_e2m1", -1, "floor", "rne", "plain")),
    ("cols fp8", lambda: kq._quantize_impl(x, "mxfp8_e4m3", 0, "floor", "rne", "plain")),
    ("cols fp4", lambda: kq._quantize_impl(x, "mxfp4_e2m1", 0, "floor", "rne", "plain")),
    ("castT fp8", lambda: kq._cast_transpose_impl(x, "mxfp8_e4m3", "floor", "rne", "plain")),
    ("dq fp8", lambda: kq._dequantize_impl(q8[0], q8[1], "mxfp8_e4m3", -1, (8192, 8192), torch.bfloat16)),
]
for _, fn in cases:
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, fn in cases:
    print("ncu case:", name, flush=True)
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
