"""One fp8-wgmma GEMM and one cuBLAS ``torch._scaled_mm`` (FP8 rowwise, M = N = K = 8192 by default) between
cudaProfilerStart / Stop, for Nsight Compute:
ncu --profile-from-start off --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats python3 benchmarks/probes/ncu_fp8_wgmma.py [MxNxK]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from mxkit.kernels.matmul_details import _fp8_wgmma as f8  # noqa: E402

M, N, K = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "8192x8192x8192").split("x"))
dev = torch.device("cuda")
a = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
b = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
sa, sb = torch.rand(M, device=dev), torch.rand(N, device=dev)
y = torch.empty(M, N, dtype=torch.bfloat16, device=dev)


def run():
    f8.fp8_gemm(a, b, sa, sb, y=y)
    torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16)


run()  # (compiles outside the profiled range)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
run()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
