"""The MoE's row passes around its grouped GEMMs: the gather of token rows into sorted order, the middle of the
W4A8 MoE (FP8 rowwise activations x folded MXFP4 experts: one pass over each sorted row of the gate_up GEMM's
output — expert bias, activation, FP8 E4M3 rowwise quantization for the down GEMM) and of the MXFP4 x MXFP4 MoE
(expert bias and activation in float32, which the MXFP4 quantize-fold then reads), and the weighted combine
back to token order."""

from __future__ import annotations

import triton
import triton.language as tl

from ..quantize_details._fp8_rowwise import _fp8_codes
from ..matmul_details._grouped import _act_pairs


@triton.jit
def _gather_rows_kernel(src_ptr, ids_ptr, dst_ptr, ssrc_ptr, sdst_ptr, n_valid, R, W,
                        TOP_K: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr, HAS_SCALE: tl.constexpr,
                        PERM64: tl.constexpr):
    """Sorted rows [ROWS * pid, + ROWS) of R: dst[r] = src[ids[r] // TOP_K] (rows of W words) where ids[r] <
    n_valid; padding rows are not written (the grouped GEMMs compute them, nobody reads the results).
    HAS_SCALE: sdst[r] = ssrc[that token], 0 for padding rows. PERM64 (words of two bf16, W % 32 == 0): each 32
    words in the decode-mma layout's K order (``_layout_mma.mma_k_order``): word 16 b + 8 s + 4 kh + t takes
    word 16 b + 4 t + 2 s + kh."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = r < R
    i = tl.load(ids_ptr + r, mask=rm, other=n_valid)
    valid = rm & (i < n_valid)
    tok = tl.where(valid, i // TOP_K, 0).to(tl.int64)
    c = tl.arange(0, BLOCK_W)
    for w0 in range(0, W, BLOCK_W):
        m = valid[:, None] & (w0 + c < W)[None, :]
        col = w0 + c
        if PERM64:
            wl = col % 32
            col = col - wl + (wl & 16) + (wl & 3) * 4 + ((wl >> 3) & 1) * 2 + ((wl >> 2) & 1)
        v = tl.load(src_ptr + tok[:, None] * W + col[None, :], mask=m)
        tl.store(dst_ptr + r.to(tl.int64)[:, None] * W + w0 + c[None, :], v, mask=m)
    if HAS_SCALE:
        tl.store(sdst_ptr + r, tl.load(ssrc_ptr + tok, mask=valid, other=0.0), mask=rm)


@triton.jit
def _bias_act_row(h_ptr, b_ptr, ids_ptr, eids_ptr, r, n_valid, N, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C0: tl.constexpr = 0):
    """Columns [C0, C0 + BLOCK_N) of row r of h [R, N] bf16 (sorted order; expert eids[r // BLOCK_M]; a padding
    row when ids[r] >= n_valid): (v = act(h[r] + b[e]) in float32 [BLOCK_N / 2] (output columns C0 / 2 + ..), 0
    on a padding row and past N / 2; whether r is valid)."""
    valid = tl.load(ids_ptr + r) < n_valid
    j = C0 + tl.arange(0, BLOCK_N)
    hmask = j < N
    # (a padding row is read too, then zeroed: h has every sorted row; a scalar in a load mask is not
    # something Triton's CPU interpreter takes)
    h = tl.load(h_ptr + r.to(tl.int64) * N + j, mask=hmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        e = tl.maximum(tl.load(eids_ptr + r // BLOCK_M), 0)
        h += tl.load(b_ptr + e.to(tl.int64) * N + j, mask=hmask, other=0.0).to(tl.float32)
    v = tl.reshape(_act_pairs(tl.reshape(h, [1, BLOCK_N]), ACT, 1, BLOCK_N), [BLOCK_N // 2])
    return tl.where(valid & (C0 // 2 + tl.arange(0, BLOCK_N // 2) < N // 2), v, 0.0), valid


@triton.jit
def _abs_bits_max(v):
    # max of |v|'s bits as int32 (v is 0 past the row: _bias_act_row): they order as the values, and a NaN's lie
    # above +Inf's (0x7F800000)
    return tl.max(v.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0)


@triton.jit
def _store_fp8(q_ptr, v, rcp, valid, n, C0: tl.constexpr, BLOCK: tl.constexpr, HW_CVT: tl.constexpr):
    # E4M3 codes of v * rcp (RNE, saturated to +-448; 0 on a padding row) into q_ptr[C0 .. C0 + BLOCK) below n
    code = tl.where(valid, _fp8_codes(v * rcp, HW_CVT), 0)
    c = C0 + tl.arange(0, BLOCK)
    tl.store(q_ptr + c, code, mask=c < n)


@triton.jit
def _bias_act_fp8_kernel(h_ptr, b_ptr, ids_ptr, eids_ptr, q_ptr, s_ptr, n_valid, N,
                         ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_N2: tl.constexpr = 0, HW_CVT: tl.constexpr = True):
    """Row r of h [R, N] bf16 (sorted order; expert eids[r // BLOCK_M]; a padding row when ids[r] >= n_valid):
    v = act(h[r] + b[e]) in float32 ([N / 2]), then scale = max(amax|v| / 448, 2^-149) (IEEE division; 1 for an
    all-zero row, NaN for a NaN row), q[r] = E4M3(v * (1 / scale)) (uint8 codes: RNE, saturated to +-448; HW_CVT as
    :func:`~mxkit.kernels.quantize_details._fp8_rowwise._fp8_codes`) and s[r] = scale — the rule of
    :func:`mxkit.quantize_fp8_rowwise` but for the quotient, v times the row's reciprocal (within 1.5 ulp of
    v / scale), so the W4A8 tests bound this pass rather than match its bytes. Padding rows get q = 0 and s = 0.
    The row in two pieces of powers of two, columns [0, BLOCK_N) and [BLOCK_N, BLOCK_N + BLOCK_N2) (BLOCK_N2 0:
    none), so that little of the ALU work is padding (GPT-OSS: 5760 columns as 4096 + 2048 rather than 8192):
    this pass is ALU-bound (H200, ``benchmarks/probes/moe_middle_ab.py``: its per-element division, two row
    reductions and one block of 8192 took 453 us at 16384 tokens of GPT-OSS-120B)."""
    r = tl.program_id(0)
    n = N // 2
    v, valid = _bias_act_row(h_ptr, b_ptr, ids_ptr, eids_ptr, r, n_valid, N, ACT, HAS_BIAS, BLOCK_M, BLOCK_N)
    bits = _abs_bits_max(v)
    if BLOCK_N2 > 0:
        v2, _ = _bias_act_row(h_ptr, b_ptr, ids_ptr, eids_ptr, r, n_valid, N, ACT, HAS_BIAS, BLOCK_M, BLOCK_N2,
                              BLOCK_N)
        bits = tl.maximum(bits, _abs_bits_max(v2))
    amax = bits.to(tl.float32, bitcast=True)
    tiny = tl.full(amax.shape, 1, tl.int32).to(tl.float32, bitcast=True)  # 2^-149
    scale = tl.where(amax > 0, tl.maximum(tl.math.div_rn(amax, 448.0), tiny), 1.0)
    scale = tl.where(bits > 0x7F800000, float("nan"), scale)
    scale = tl.where(valid, scale, 0.0)
    rcp = tl.math.div_rn(1.0, tl.where(valid, scale, 1.0))
    q_row = q_ptr + r.to(tl.int64) * n
    _store_fp8(q_row, v, rcp, valid, n, 0, BLOCK_N // 2, HW_CVT)
    if BLOCK_N2 > 0:
        _store_fp8(q_row, v2, rcp, valid, n, BLOCK_N // 2, BLOCK_N2 // 2, HW_CVT)
    tl.store(s_ptr + r, scale)


@triton.jit
def _bias_act_kernel(h_ptr, b_ptr, ids_ptr, eids_ptr, v_ptr, n_valid, N,
                     ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The middle of the MXFP4 x MXFP4 MoE: v[r] = act(h[r] + b[e]) in float32 (v [R, N / 2] float32; 0 on a
    padding row), the rows its quantize-fold to MXFP4 reads. h, b, ids, eids as :func:`_bias_act_fp8_kernel`."""
    r = tl.program_id(0)
    v, _ = _bias_act_row(h_ptr, b_ptr, ids_ptr, eids_ptr, r, n_valid, N, ACT, HAS_BIAS, BLOCK_M, BLOCK_N)
    c = tl.arange(0, BLOCK_N // 2)
    tl.store(v_ptr + r.to(tl.int64) * (N // 2) + c, v, mask=c < N // 2)


@triton.jit
def _combine_kernel(y_ptr, b_ptr, w_ptr, pos_ptr, e_ptr, out_ptr, H, lo, n_exp,
                    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_H: tl.constexpr, DIRECT: tl.constexpr = False):
    """Token t: out[t] = sum_j w[t, j] * (y[pos[t, j]] + b[e[t, j]]), j = 0 .. TOP_K - 1 in order, in float32,
    one rounding to out's dtype. y [R, H] (sorted rows), pos int32 [T, TOP_K] (row of pair (t, j) in y; -1: an
    expert not held here, contributing 0), e int32 [T, TOP_K] (local expert), b [E, H]. DIRECT: y's rows are the
    pairs in token order, weighted and biased already (the decode path), pos the router's ids [T, TOP_K] (int32 or
    int64): out[t] = sum_j y[t * TOP_K + j] over the pairs whose id is in lo .. lo + n_exp - 1 (the others' rows
    are never written: they contribute 0)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        # (a pair's mask as h < H where it is held, h < 0 where not: one comparison of the block with a scalar,
        # which the CPU interpreter also runs; a block & a loaded scalar it cannot)
        if DIRECT:
            e = tl.load(pos_ptr + t * TOP_K + j)
            held = (e >= lo) & (e < lo + n_exp)
            m = h < tl.where(held, H, 0)
            acc += tl.load(y_ptr + (t * TOP_K + j) * H + h, mask=m, other=0.0).to(tl.float32)
        else:
            p = tl.load(pos_ptr + t * TOP_K + j)
            m = h < tl.where(p >= 0, H, 0)
            v = tl.load(y_ptr + tl.maximum(p, 0).to(tl.int64) * H + h, mask=m, other=0.0).to(tl.float32)
            if HAS_BIAS:
                e = tl.load(e_ptr + t * TOP_K + j)
                v += tl.load(b_ptr + tl.maximum(e, 0).to(tl.int64) * H + h, mask=m, other=0.0).to(tl.float32)
            acc += tl.load(w_ptr + t * TOP_K + j).to(tl.float32) * v
    tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=hmask)
