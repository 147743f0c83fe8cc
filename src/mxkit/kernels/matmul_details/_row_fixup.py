"""``@triton.jit`` body of the exact fix-up of the fold path (launcher: ``mxkit.kernels.matmul._fixup``;
reference twin: the float32 route of ``_fix_special``).

The fold path runs every row of ``a`` through cuBLAS' FP8 GEMM, including rows the fold cannot take: rows
whose block scales span more than the fold window (fold status 1: their E4M3 bytes are not their values) and
rows whose row scale lies outside the FP8 epilogue's envelope. This kernel then overwrites, without a host
sync, the output elements of those rows and of the weight's special rows (columns) with the exact product:
each program owns a BLOCK_M x BLOCK_N output tile, reads the status bytes and row scales of its rows and the
column flags of its columns, and exits unless one of them is flagged (the common case: one small load). A
flagged tile is recomputed from the MX source bytes of both operands (``a`` as packed FP4 / FP6 codes and
E8M0 scales, or as the bf16 / fp16 / fp32 rows it is quantized from, through the quantize kernels'
``_block_scale`` / ``_encode``: mxkit.quantize's codes) with float32 accumulation, plus the bias, rounded
once to the output dtype; only the flagged rows' and columns' elements are stored.

Every FP4 / FP6 element times its E8M0 scale is exact in bf16 whenever it is finite in float32 (at most 4
significant bits, and bf16 shares float32's exponent range: the smallest, E3M2's 2^-4 * 2^-127, is a bf16
subnormal), so on a GPU the tile products run on bf16 tensor cores (DOT_BF16); the CPU interpreter, whose bf16
``tl.dot`` is unfaithful, takes float32 ``ieee``. Row offsets are int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..fold_details._fold import _fold_read, _quantize_chunk


@triton.jit
def _values(codes, sbyte, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """float32 values [R, NB, 32] of FP4 / FP6 codes [R, NB, 32] (int32) with E8M0 scale bytes [R, NB]: exact
    (NaN for the byte 0xFF, overflow only where the value passes float32's range)."""
    # magnitude bits at fp32's exponent / mantissa fields: the element times 2^(bias - 127), bias = 1 - EMIN
    u = ((codes & ((1 << (BITS - 1)) - 1)) << (23 - MBITS)).to(tl.float32, bitcast=True)
    s = sbyte[:, :, None]
    u = u * ((s * 0 + (254 - (1 - EMIN))) << 23).to(tl.float32, bitcast=True)  # times 2^(127 - bias): the element
    f = tl.where(s == 255, 0x7FC00000, tl.where(s == 0, 0x00400000, s << 23)).to(tl.float32, bitcast=True)
    v = u * f
    return tl.where(((codes >> (BITS - 1)) & 1) != 0, -v, v)


@triton.jit
def _fixup_tile(y_ptr, aq_ptr, as_ptr, wq_ptr, ws_ptr, bias_ptr, rows, rmask, rflag, cols, cmask, cflag, K, ldy,
                A_X: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr, MODE: tl.constexpr,
                AWAY: tl.constexpr, W_FMT: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_BF16: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The exact tile y[rows, cols], stored where its row or column is flagged."""
    r64 = rows.to(tl.int64)
    c64 = cols.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if A_X:
            ac, asb, _ = _quantize_chunk(aq_ptr, r64 * K, k0, K, rmask, IN_KIND, A_FMT.bits, A_FMT.mbits,
                                         A_FMT.emin, A_FMT.emax, A_FMT.max_normal, A_FMT.max_frac, MODE, AWAY,
                                         False, BLOCK_M, BLOCK_K, True)
        else:
            ac, asb, _ = _fold_read(aq_ptr, as_ptr, r64 * (K // 32 * A_FMT.bits), r64 * (K // 32), k0, K, rmask,
                                    A_FMT.bits, BLOCK_M, BLOCK_K, True)
        wc, wsb, _ = _fold_read(wq_ptr, ws_ptr, c64 * (K // 32 * W_FMT.bits), c64 * (K // 32), k0, K, cmask,
                                W_FMT.bits, BLOCK_N, BLOCK_K, True)
        av = tl.reshape(_values(ac, asb, A_FMT.bits, A_FMT.mbits, A_FMT.emin), [BLOCK_M, BLOCK_K])
        wv = tl.reshape(_values(wc, wsb, W_FMT.bits, W_FMT.mbits, W_FMT.emin), [BLOCK_N, BLOCK_K])
        if DOT_BF16:
            acc = tl.dot(av.to(tl.bfloat16), tl.trans(wv.to(tl.bfloat16)), acc)
        else:
            acc = tl.dot(av, tl.trans(wv), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    keep = (rflag[:, None] | cflag[None, :]) & rmask[:, None] & cmask[None, :]
    tl.store(y_ptr + r64[:, None] * ldy + c64[None, :], acc.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _fixup_kernel(y_ptr, aq_ptr, as_ptr, st_ptr, rs_ptr, wq_ptr, ws_ptr, cf_ptr, bias_ptr, M, N, K, ldy,
                  A_X: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr, MODE: tl.constexpr,
                  AWAY: tl.constexpr, W_FMT: tl.constexpr, LIMIT_LO: tl.constexpr, LIMIT_HI: tl.constexpr,
                  HAS_COLS: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y [M, N] (row stride ldy) of the fold path: recompute the elements of flagged rows (st [M] uint8 == 1,
    or row scale rs [M] float32 outside [LIMIT_LO, LIMIT_HI], NaN not) and flagged columns (cf [N] uint8 != 0,
    HAS_COLS) exactly. a: A_X False, packed codes aq (int32 words [M, K * A_BITS / 32]) and scales as (uint8
    [M, K / 32]) of format A_FMT (``quantize_details._common.ElementSpec``); A_X True, the rows aq [M, K]
    (IN_KIND: fp32 bits / bf16 bits / fp16) quantized to A_FMT as the quantize kernels do (MODE, AWAY). w:
    packed codes wq (int32 words [N, K * W_FMT.bits / 32]), scales ws.
    Program (i, j) owns row tile i and column tiles j, j + G, ... (G = the grid's second extent, so the grid
    stays about two programs per SM whatever the shape: a program without a flagged row reads BLOCK_M flags
    and, without column flags, exits)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    st = tl.load(st_ptr + rows, mask=rmask, other=0)
    rs = tl.load(rs_ptr + rows, mask=rmask, other=1.0)
    rflag = rmask & ((st == 1) | (rs < LIMIT_LO) | (rs > LIMIT_HI))
    any_row = tl.max(rflag.to(tl.int32), axis=0) > 0
    if any_row or HAS_COLS:
        for n0 in range(tl.program_id(1) * BLOCK_N, N, tl.num_programs(1) * BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            if HAS_COLS:
                cflag = cmask & (tl.load(cf_ptr + cols, mask=cmask, other=0) != 0)
            else:
                cflag = cols < 0
            if any_row or (tl.max(cflag.to(tl.int32), axis=0) > 0):
                _fixup_tile(y_ptr, aq_ptr, as_ptr, wq_ptr, ws_ptr, bias_ptr, rows, rmask, rflag, cols, cmask, cflag,
                            K, ldy, A_X, IN_KIND, A_FMT, MODE, AWAY, W_FMT, HAS_BIAS, DOT_BF16, BLOCK_M, BLOCK_N,
                            BLOCK_K)
