"""Small-M GEMM ``y = x @ W.T`` from bf16 / fp16 activations and an MX weight read as MX bytes (decode).

Memory-bound: each program streams BLOCK_N weight rows over its K range once, decodes them to bf16 in
registers (:func:`._mx_weight._mx_weight_tile`, exact; fp16 for fp16 x) and feeds ``tl.dot`` with float32 accumulation.
Split-K programs write float32 partial sums that the host reduces in a fixed order (deterministic).
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


@triton.jit
def _splitk_reduce_kernel(part_ptr, bias_ptr, out_ptr, MN, N, NSPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr):
    """out [M, N] = part[0] + part[1] + ... + part[NSPLIT - 1] (float32, in that order) + bias [N], one rounding
    to out's dtype."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < MN
    acc = tl.load(part_ptr + i, mask=m, other=0.0)
    off = i
    for s in tl.static_range(1, NSPLIT):
        off += MN  # partial s at s * MN + i, in 64 bits (s * MN in int32 passes 2^31 for M * N > 2^30)
        acc += tl.load(part_ptr + off, mask=m, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + i % N, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=m)
