"""Grouped (MoE expert) GEMM ``y[i] = act(x[row(i)] @ W[e(i)].T + b[e(i)]) * r[i]`` from bf16 activations and MX
expert weights read as MX bytes (W4A16 / W8A16), over tokens sorted by expert.

The sorted order follows vLLM's ``moe_align_block_size``: ``ids`` lists the flat (token, slot) indices i =
t * top_k + j grouped by expert, each expert's group padded to a multiple of BLOCK_M with the sentinel
``n_valid`` (= T * top_k); block b of BLOCK_M ids belongs to expert ``eids[b]`` (-1: an unused block, which
returns at once). Each program computes BLOCK_M sorted rows by BLOCK_N weight rows of one expert:

* the activation rows are gathered in the loads (``GATHER``: row i // top_k of x, the token; else row i);
* the weight tile is decoded to bf16 in registers (:func:`._mx_weight._mx_weight_tile`, exact) into ``tl.dot``
  with float32 accumulation;
* the epilogue adds the expert's bias (float32), applies the activation to (gate, up) column pairs (``ACT`` 1:
  GPT-OSS's clamped SwiGLU on interleaved rows; 2: SiLU(gate) * up on ``[gate; up]`` halves, whose rows the
  loads interleave), multiplies by the routing weight of row i
  (``MUL_RW``), and stores row i of the output (flat (token, slot) order, not sorted order).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._mx_weight import _mx_weight_tile

ACTS = {None: 0, "none": 0, "swiglu_gpt_oss": 1, "swiglu": 2}


@triton.jit
def _act_pairs(acc, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # [BLOCK_M, BLOCK_N] of interleaved (gate, up) columns -> [BLOCK_M, BLOCK_N // 2]
    gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N // 2, 2]))
    if ACT == 1:  # transformers' GptOssExperts: alpha 1.702, limit 7.0
        gate = tl.minimum(gate, 7.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as torch's clamp
        up = tl.minimum(tl.maximum(up, -7.0, propagate_nan=tl.PropagateNan.ALL), 7.0,
                        propagate_nan=tl.PropagateNan.ALL)
        out = (up + 1.0) * (gate * tl.sigmoid(1.702 * gate))
    else:
        out = gate * tl.sigmoid(gate) * up
    return out


@triton.jit
def _grouped_w16_kernel(x_ptr, q_ptr, s_ptr, b_ptr, rw_ptr, out_ptr, ids_ptr, eids_ptr,
                        N, K, n_valid, stride_xm, stride_om,
                        TOP_K: tl.constexpr, GATHER: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_RW: tl.constexpr,
                        ACT: tl.constexpr, W_KIND: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [*, K] bf16 (row stride stride_xm); q [E, N, K / 2 or K] uint8, s [E, N, K / 32] uint8 (contiguous);
    b [E, N] float32 or None; rw [n_valid] float32 or None; ids int32 [num_blocks * BLOCK_M]; eids int32
    [num_blocks]; out [n_valid, N or N / 2] (row stride stride_om), bf16 or float32."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(eids_ptr + pid_m)
    if e < 0:
        return
    ids = tl.load(ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = ids < n_valid
    if GATHER:
        arow = ids // TOP_K
    else:
        arow = ids
    arow = tl.where(valid, arow, 0).to(tl.int64)
    j = tl.arange(0, BLOCK_N)
    if ACT == 2:  # [gate; up] halves: gather gate row c and up row N / 2 + c into columns 2c, 2c + 1
        c = pid_n * (BLOCK_N // 2) + j // 2
        n = c + (j % 2) * (N // 2)
        nmask = c < N // 2
    else:
        n = pid_n * BLOCK_N + j
        nmask = n < N
    rows = e.to(tl.int64) * N + n
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = _mx_weight_tile(q_ptr, s_ptr, rows, nmask, k0, K, K, BLOCK_N, BLOCK_K, W_KIND)
        kx = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + arow[:, None] * stride_xm + kx[None, :], mask=valid[:, None] & (kx < K)[None, :],
                     other=0.0)
        acc += tl.dot(xk, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=nmask, other=0.0)[None, :]
    if ACT != 0:
        y = _act_pairs(acc, ACT, BLOCK_M, BLOCK_N)
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)  # output column c of the pair (2c, 2c + 1)
        cmask = cols < N // 2
    else:
        y = acc
        cols = n
        cmask = nmask
    if MUL_RW:
        y = y * tl.load(rw_ptr + ids, mask=valid, other=0.0)[:, None]
    out = out_ptr + ids.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=valid[:, None] & cmask[None, :])
