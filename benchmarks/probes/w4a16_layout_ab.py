"""Dense W4A16 prefill on the wgmma kernel: its own weight layout (``pack_wgmma``, a third copy of the weight
beside the MX bytes and the decode layout) against the decode-mma layout that every packed W4A16 weight
already holds (``layout="mma"``, the MoE prefill's), which needs x's columns permuted within each 64
(``mma_k_order``): timed with x already permuted, and with the permutation (a strided PyTorch copy) included.
cuBLAS bf16 on the dequantized weight is the peer. µs after the clean-L2 read flush; error against float64.

    PYTHONPATH=src python3 benchmarks/probes/w4a16_layout_ab.py 1024x8192x8192,1024x28672x8192   # on the GPU
"""
import torch
from _probe import main_shapes

import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul_details import _w4a16_wgmma as W
from mxkit.kernels.matmul_details._layout_mma import mma_k_order
from mxkit.reference import dequantize_reference


def permute_x(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] with its columns in mma_k_order: in each 64, position (j, kh, t, e) takes column
    32 (j // 2) + 8 t + 4 (j % 2) + 2 kh + e."""
    M, K = x.shape
    return x.view(M, K // 64, 2, 4, 2, 2, 2).permute(0, 1, 2, 4, 5, 3, 6).reshape(M, K)


def row(M: int, N: int, K: int, cfg: TimingConfig) -> str:
    w = torch.randn(N, K, device="cuda") * 2.0 ** torch.randint(-7, 0, (N, 1), device="cuda")
    wq = mxkit.quantize(w.to(torch.bfloat16), "mxfp4_e2m1")
    pw = mxkit.pack_weight(wq, act="float")
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    perm = mma_k_order(K, x.device)
    assert torch.equal(permute_x(x), x[:, perm])
    wd = dequantize_reference(wq, torch.bfloat16)
    y64 = x.double() @ wd.double().T
    bound = 1.2 * ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    q, st, one_mul = W.packed_of(pw)
    one_mul_mma = pw.scale_max <= 128 and not pw.has_nan
    xp = permute_x(x)
    cells = [f"{M}x{N}x{K}: cuBLAS bf16 {t_cub:.1f}"]
    for name, fn in (("wgmma layout", lambda: W.w4a16_wgmma(x, q, st, N, one_mul)),
                     ("mma layout, x permuted", lambda: W.w4a16_wgmma(xp, pw.mma_q, pw.mma_s, N, one_mul_mma,
                                                                      layout="mma")),
                     ("mma layout + permute", lambda: W.w4a16_wgmma(permute_x(x), pw.mma_q, pw.mma_s, N,
                                                                    one_mul_mma, layout="mma"))):
        y = fn()
        err = ((y.double() - y64).norm() / y64.norm()).item()
        us = time_us(fn, cfg)[0]
        cells.append(f"{name} {us:.1f} ({t_cub / us:.2f}x) err {err:.2e}/{bound:.2e}")
    cells.append(f"permute alone {time_us(lambda: permute_x(x), cfg)[0]:.1f}")
    return " | ".join(cells)


if __name__ == "__main__":
    main_shapes(row, 10, 30)
