"""Small-M GEMM ``y = x @ W.T`` from bf16 / fp16 activations and an MX weight read as MX bytes (decode).

Memory-bound: each program streams BLOCK_N weight rows over its K range once, decodes them to bf16 in
registers (:func:`._mx_weight._mx_weight_tile`, exact; fp16 for fp16 x) and feeds ``tl.dot`` with float32 accumulation.
Split-K programs write float32 partial sums, which :mod:`._split_sum`'s kernel adds in a fixed order
(deterministic) with the bias and the one output rounding.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._mx_weight import _mx_weight_tile


@triton.jit
def _w16_decode_kernel(x_ptr, q_ptr, s_ptr, out_ptr, M, N, K, stride_xm, k_split,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       W_KIND: tl.constexpr = 0):
    """x [M, K] bf16 or fp16 (row stride stride_xm), q [N, K / 2] (E2M1), [N, K * 3 / 4] (FP6) or [N, K] uint8,
    s [N, K / 32] uint8 -> out [SPLIT, M, N] float32 partial sums of the K range [pid_k * k_split, (pid_k + 1) *
    k_split). fp16 x: the weight tile is converted to fp16, exact inside the fp16-exact scale envelope the host
    checks."""
    tl.static_assert(BLOCK_K % 32 == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, BLOCK_M)
    mmask = m < M
    m64 = m.to(tl.int64)  # (row offsets of x and out in 64 bits: M * K or M * N may pass 2^31)
    rows = n.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        w = _mx_weight_tile(q_ptr, s_ptr, rows, nmask, k0, k_hi, K, BLOCK_N, BLOCK_K, W_KIND)
        kx = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + m64[:, None] * stride_xm + kx[None, :], mask=mmask[:, None] & (kx < k_hi)[None, :],
                     other=0.0)
        acc += tl.dot(xk, tl.trans(w.to(xk.dtype)))
    out = out_ptr + pid_k.to(tl.int64) * M * N + m64[:, None] * N + n[None, :]
    tl.store(out, acc, mask=mmask[:, None] & nmask[None, :])
