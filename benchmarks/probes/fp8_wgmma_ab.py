"""The fp8-wgmma Gluon kernel (``_fp8_wgmma.fp8_gemm``) against cuBLAS's FP8 rowwise GEMMs in one process, clean-L2
read flush: dense ``torch._scaled_mm`` and grouped ``torch._scaled_grouped_mm`` (GPT-OSS expert shapes, sorted rows
of uniform top-4 routing, groups padded to 16 rows as the W4A8 MoE path pads them), each with its error against the
float64 product (max |y - ref| over the row's max |ref|, worst row) and the bf16 bytes that differ from cuBLAS.
PYTHONPATH=src python3 benchmarks/probes/fp8_wgmma_ab.py [dense MxNxK,...] [grouped E:tokens:NxK,...] [configs]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _probe import time_us  # noqa: E402

from mxkit.kernels.matmul_details import _fp8_wgmma as f8  # noqa: E402

dense = [tuple(int(v) for v in s.split("x")) for s in
         (sys.argv[1] if len(sys.argv) > 1 else "8192x8192x8192,65536x5760x2880,65536x2880x2880").split(",") if s]
grouped = [s for s in (sys.argv[2] if len(sys.argv) > 2 else "128:16384:5760x2880,128:16384:2880x2880").split(",")
           if s]
# precise (promotion every 128 columns) and / or fast accumulation (A/B only)
cfgs = [int(c) for c in (sys.argv[3] if len(sys.argv) > 3 else "1,0").split(",")]
dev = torch.device("cuda")
print(torch.cuda.get_device_name(0), "| torch", torch.__version__, flush=True)


def fp8_rows(R, K):
    x = torch.randn(R, K, device=dev) * 2.0 ** torch.randint(-4, 4, (R, 1), device=dev)
    s = x.abs().amax(1).clamp(min=1e-12) / 448.0
    return (x / s[:, None]).to(torch.float8_e4m3fn), s.float().contiguous()


def err(y, ref, rows=None):
    y, ref = y.double(), ref.double()
    if rows is not None:
        y, ref = y[rows], ref[rows]
    scale = ref.abs().amax(1, keepdim=True).clamp(min=1e-300)
    return float(((y - ref).abs() / scale).amax())


def diff_bytes(y, z, rows=None):
    if rows is not None:
        y, z = y[rows], z[rows]
    return float((y.view(torch.int16) != z.view(torch.int16)).double().mean())


print("\ndense MxNxK | _scaled_mm µs (TFLOP/s) / err | fast-accum µs / err | " +
      " | ".join(f"fp8-wgmma {'precise' if c else 'fast'} µs (TFLOP/s) / err / bytes != cuBLAS"
                 for c in cfgs))
for M, N, K in dense:
    a, sa = fp8_rows(M, K)
    b, sb = fp8_rows(N, K)
    fl = 2 * M * N * K / 1e6
    rows = torch.randperm(M, device=dev)[:1024].sort().values
    ref = (a[rows].double() * sa[rows].double()[:, None]) @ (b.double() * sb.double()[:, None]).T
    cub = torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16)
    t_c = time_us(lambda: torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16))
    cubf = torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16, use_fast_accum=True)
    t_f = time_us(lambda: torch._scaled_mm(a, b.T, sa[:, None], sb[None, :], out_dtype=torch.bfloat16,
                                           use_fast_accum=True))
    cells = [f"{t_c:.1f} ({fl / t_c:.0f}) / {err(cub[rows], ref):.2e}", f"{t_f:.1f} / {err(cubf[rows], ref):.2e}"]
    for pr in cfgs:
        y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=dev)
        try:
            f8.fp8_gemm(a, b, sa, sb, y=y, precise=bool(pr))
            t = time_us(lambda: f8.fp8_gemm(a, b, sa, sb, y=y, precise=bool(pr)))
            cells.append(f"{t:.1f} ({fl / t:.0f}) / {err(y[rows], ref):.2e} / {diff_bytes(y, cub, rows):.4f}")
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            cells.append(f"failed: {type(e).__name__}: {str(e)[:300]}")
    print(f"{M}x{N}x{K} | " + " | ".join(cells), flush=True)
    del a, b, ref, cub, cubf

print("\ngrouped E:tokens:NxK | _scaled_grouped_mm µs (TFLOP/s on real rows) / err | " +
      " | ".join(f"fp8-wgmma {'precise' if c else 'fast'} µs (TFLOP/s) / err / bytes != cuBLAS"
                 for c in cfgs))
for g in grouped:
    E, T, shape = g.split(":")
    E, T = int(E), int(T)
    N, K = (int(v) for v in shape.split("x"))
    ids = torch.stack([torch.randperm(E, device=dev)[:4] for _ in range(T)]) if T <= 64 else \
        torch.rand(T, E, device=dev).topk(4, 1).indices
    cnt = torch.bincount(ids.flatten(), minlength=E)
    pad = (cnt + 15) // 16 * 16
    offs = pad.cumsum(0).to(torch.int32)
    R = int(offs[-1])
    a, sa = fp8_rows(R, K)
    # padding rows: scale 0 (as the MoE gather writes them)
    valid = torch.zeros(R, dtype=torch.bool, device=dev)
    starts = offs.long() - pad
    for e in range(E):
        valid[starts[e]:starts[e] + cnt[e]] = True
    sa = torch.where(valid, sa, torch.zeros_like(sa))
    b, sb = fp8_rows(E * N, K)
    b3, sb2 = b.view(E, N, K), sb.view(E, N)
    fl = 2 * int(cnt.sum()) * N * K / 1e6
    cub = torch._scaled_grouped_mm(a, b3.transpose(1, 2), sa, sb2, offs=offs, out_dtype=torch.bfloat16)
    t_c = time_us(lambda: torch._scaled_grouped_mm(a, b3.transpose(1, 2), sa, sb2, offs=offs,
                                                   out_dtype=torch.bfloat16))
    es = torch.randperm(E)[:4].tolist()
    rows = torch.cat([torch.arange(int(starts[e]), int(starts[e] + cnt[e]), device=dev) for e in es])
    ref = torch.cat([(a[starts[e]:starts[e] + cnt[e]].double() * sa[starts[e]:starts[e] + cnt[e]].double()[:, None])
                     @ (b3[e].double() * sb2[e].double()[:, None]).T for e in es])
    cells = [f"{t_c:.1f} ({fl / t_c:.0f}) / {err(cub[rows], ref):.2e}"]
    for pr in cfgs:
        y = torch.full((R, N), float("nan"), dtype=torch.bfloat16, device=dev)
        try:
            f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, y=y, precise=bool(pr))
            t = time_us(lambda: f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, y=y, precise=bool(pr)))
            nan = int(y[valid].isnan().sum())
            cells.append(f"{t:.1f} ({fl / t:.0f}) / {err(y[rows], ref):.2e} / {diff_bytes(y, cub, rows):.4f}"
                         + (f" / {nan} NaN left" if nan else ""))
        except Exception as e:  # noqa: BLE001
            cells.append(f"failed: {type(e).__name__}: {str(e)[:300]}")
    print(f"{g} ({R} rows) | " + " | ".join(cells), flush=True)
