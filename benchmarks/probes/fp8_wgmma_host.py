"""Host µs a call of fp8-wgmma (``_fp8_wgmma.fp8_gemm``), the GPU kept busy ahead (``_probe.host_us``): through the
module's direct launch (``_Launcher``, since session 66) against Triton's own launcher on the same kernel, dense and
grouped, beside a plain torch op; the same bytes both ways.
PYTHONPATH=src python3 benchmarks/probes/fp8_wgmma_host.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import host_us  # noqa: E402

from mxkit.kernels.matmul_details import _fp8_wgmma as f8  # noqa: E402

print(torch.cuda.get_device_name(0), "| torch", torch.__version__)
g = torch.Generator().manual_seed(0)


def rows(R, K):
    x = torch.randn(R, K, generator=g)
    s = x.abs().amax(1).clamp(min=1e-30) / 448.0
    return (x / s[:, None]).to(torch.float8_e4m3fn).cuda(), s.float().cuda()


def triton_launch(a, b, sa, sb, y, table, M, N, K, grouped):
    """fp8_gemm's launch by Triton's own launcher (the path before session 66, without its layout constexprs)."""
    TensorDescriptor = f8._gluon()[6]
    a_l, b_l = f8._smem_layouts()
    tiles = (table.shape[0] if grouped else -(-M // f8.BM)) * -(-N // f8.BN)
    f8._kernel()[(min(tiles, 132),)](TensorDescriptor.from_tensor(a, [f8.BM, f8.BK], a_l),
                                     TensorDescriptor.from_tensor(b, [f8.BN, f8.BK], b_l), y, sa, sb,
                                     table if grouped else y, M, N, table.shape[0] if grouped else 0, -(-K // f8.BK),
                                     y.stride(0), STAGES=f8.STAGES, GROUPED=grouped, PRECISE=True, num_warps=4)


x2 = torch.randn(1024, device="cuda")
print(f"x * 2: {min(host_us(lambda: x2 * 2, 200) for _ in range(5)):.1f} µs")
for name, M, N, K, E in (("dense 256x512x1024", 256, 512, 1024, 0), ("grouped E=8 512 rows, N 512, K 1024", 512, 512,
                                                                      1024, 8)):
    a, sa = rows(M, K)
    b, sb = rows(N * max(E, 1), K)
    y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    kw = {}
    table = None
    if E:
        offs = torch.tensor([(i + 1) * M // E for i in range(E)], dtype=torch.int32, device="cuda")
        table = f8.tile_table(offs, M)
        kw = dict(n=N, offs=offs, table=table)
    ref = f8.fp8_gemm(a, b, sa, sb, y=y.clone(), **kw)
    y2 = y.clone()
    triton_launch(a, b, sa, sb, y2, table, M, N, K, bool(E))
    torch.cuda.synchronize()
    same = torch.equal(ref.view(torch.int16)[:M], y2.view(torch.int16)[:M])
    ours = min(host_us(lambda: f8.fp8_gemm(a, b, sa, sb, y=y, **kw), 200) for _ in range(5))
    theirs = min(host_us(lambda: triton_launch(a, b, sa, sb, y, table, M, N, K, bool(E)), 200) for _ in range(5))
    print(f"{name}: fp8_gemm {ours:.1f} µs, Triton's launcher {theirs:.1f} µs (same bytes: {same})")
