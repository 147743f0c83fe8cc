"""The exact fix-up of the fold and bf16-exact paths: its ``@triton.jit`` body and its launcher :func:`fixup`
(called by :func:`mxkit.kernels.matmul.run_gemm`; reference twin: the float32 route, ``reference_gemm``).

Both paths run every row of ``a`` through a fast GEMM that is exact for almost all of them, and this kernel
then overwrites, without a host sync, the output elements of the rows it was not exact for:

* FLAG 0, after the fold path's FP8 GEMM: rows whose block scales span more than the fold window (fold
  status 1: their E4M3 bytes are not their values) and rows whose row scale lies outside the FP8 epilogue's
  envelope [LO, HI]; plus the weight's special rows (columns, HAS_COLS);
* FLAG 1, after the bf16-exact path's bf16 GEMM: rows with a block scale byte outside [LO, HI], where a's
  element values times their scale are not exact in bf16 (0xFF, NaN, propagates as it should).

Each program owns a BLOCK_M-row tile and walks its column tiles (j, j + G, ...: the grid stays about two
programs per SM); without a flagged row or column it exits after reading its flags (the common case). A
flagged tile is recomputed from the MX bytes of both operands (``a`` as element codes and E8M0 scales, or as
the bf16 / fp16 / fp32 rows a deferred quantize-fold read, through the quantize kernels' ``_block_scale`` /
``_encode``: mxkit.quantize's codes), each value decoded to float32 with one rounding (``_codecs._decode``,
the dequantize kernels' decode: the float32 route's values), float32 accumulation, plus the bias, rounded
once to the output dtype; only the flagged rows' and columns' elements are stored.

DOT_BF16 (the launcher's choice: both formats' values exact in bf16 wherever they are finite in float32, as
FP4 / FP6 / INT8 are) multiplies on bf16 tensor cores; otherwise (FP8 elements, whose smallest subnormals
times 2^-127 fall below bf16's) float32 ``ieee`` dots. The CPU interpreter, whose bf16 ``tl.dot`` is
unfaithful, always takes the float32 dot. Row offsets are int64.

The grouped variant (:func:`grouped_fixup`, ``_grouped_fixup_kernel``), after the MXFP4 x MXFP4 MoE's grouped
FP8 GEMMs (``mxkit.kernels.moe.moe_mxfp4_triton``): the output rows are (token, slot) pairs sorted by expert,
one expert per block of rows (the sort's ``expert_ids``), so each program reads its block's expert from the
table (no host sync) and its rows' fold flags through the sort (the token's for the gathered first GEMM, the
row's own for the second); a flagged row is recomputed from the rows the quantize-fold read (re-quantized as
above) times the expert's folded rows (E4M3 bytes times their power-of-two row scale: exact values), with the
same float32 accumulation and one rounding.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import torch
import triton
import triton.language as tl

from ..._cache import constant_cache
from ...formats import ElementFormat, Rounding, get_format
from ...tensor import MXTensor
from .._env import interpreting
from ..fold_details._fold import _quantize_chunk
from ..quantize_details._common import element_spec
from ._envelope import FOLD_EXP_LIMIT, exact_scale_range
from ..quantize_details._codecs import _decode
from ..quantize_details._dequantize import _load_codes


@triton.jit
def _mx_values(q_ptr, s_ptr, r64, rmask, k0, K, FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 values [BLOCK_R, BLOCK_K] of columns k0 .. k0 + BLOCK_K of MX rows r64 (int64): codes at q_ptr
    (bytes; FP6: int32 words), scale bytes s_ptr [R, K / 32]. Masked elements are 0."""
    NB: tl.constexpr = BLOCK_K // 32
    codes = tl.reshape(_load_codes(q_ptr, r64, rmask, k0, K, BLOCK_R, BLOCK_K, FMT.bits, True), [BLOCK_R, NB, 32])
    b = k0 // 32 + tl.arange(0, NB)
    sm = rmask[:, None] & (b < K // 32)[None, :]
    sb = tl.load(s_ptr + r64[:, None] * (K // 32) + b[None, :], mask=sm, other=1).to(tl.int32)
    return tl.reshape(_decode(codes, sb[:, :, None], FMT), [BLOCK_R, BLOCK_K])


@triton.jit
def _a_values(aq_ptr, as_ptr, r64, rmask, k0, K, A_X: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr,
              MODE: tl.constexpr, AWAY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              A_ROW: tl.constexpr = False):
    """float32 values [BLOCK_M, BLOCK_K] of columns k0 .. k0 + BLOCK_K of a's rows r64 (int64; masked rows 0): A_X,
    the rows aq [*, K] (IN_KIND) quantized to A_FMT (MODE, AWAY) as the quantize kernels do, then decoded; A_ROW,
    the E4M3 bytes aq [*, K] of FP8 rowwise activations (their row scale not applied); else MX codes aq and scale
    bytes as (:func:`_mx_values`)."""
    if A_ROW:
        k = k0 + tl.arange(0, BLOCK_K)
        d = tl.load(aq_ptr + r64[:, None] * K + k[None, :], mask=rmask[:, None] & (k < K)[None, :], other=0)
        av = d.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif A_X:
        ac, asb, _ = _quantize_chunk(aq_ptr, r64 * K, k0, K, rmask, IN_KIND, A_FMT.bits, A_FMT.mbits,
                                     A_FMT.emin, A_FMT.emax, A_FMT.max_normal, A_FMT.max_frac, MODE, AWAY,
                                     False, BLOCK_M, BLOCK_K, True)
        av = tl.reshape(_decode(ac, asb[:, :, None], A_FMT), [BLOCK_M, BLOCK_K])
    else:
        av = _mx_values(aq_ptr, as_ptr, r64, rmask, k0, K, A_FMT, BLOCK_M, BLOCK_K)
    return av


@triton.jit
def _dot_exact(av, wv, acc, DOT_BF16: tl.constexpr):
    """acc + av @ wv.T in float32: on bf16 tensor cores where both operands' values are exact in bf16 (DOT_BF16),
    else float32 ``ieee`` dots."""
    if DOT_BF16:
        acc = tl.dot(av.to(tl.bfloat16), tl.trans(wv.to(tl.bfloat16)), acc)
    else:
        acc = tl.dot(av, tl.trans(wv), acc, input_precision="ieee")
    return acc


@triton.jit
def _fixup_tile(y_ptr, aq_ptr, as_ptr, wq_ptr, ws_ptr, bias_ptr, rows, rmask, rflag, rs, cols, cmask, cflag, K, ldy,
                A_X: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr, MODE: tl.constexpr,
                AWAY: tl.constexpr, A_ROW: tl.constexpr, W_FMT: tl.constexpr, HAS_BIAS: tl.constexpr,
                DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The exact tile y[rows, cols], stored where its row or column is flagged (A_ROW: the float32 sum times the
    rows' scales rs [BLOCK_M], then the bias)."""
    r64 = rows.to(tl.int64)
    c64 = cols.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        av = _a_values(aq_ptr, as_ptr, r64, rmask, k0, K, A_X, IN_KIND, A_FMT, MODE, AWAY, BLOCK_M, BLOCK_K, A_ROW)
        wv = _mx_values(wq_ptr, ws_ptr, c64, cmask, k0, K, W_FMT, BLOCK_N, BLOCK_K)
        acc = _dot_exact(av, wv, acc, DOT_BF16)
    if A_ROW:
        acc = acc * rs[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    keep = (rflag[:, None] | cflag[None, :]) & rmask[:, None] & cmask[None, :]
    tl.store(y_ptr + r64[:, None] * ldy + c64[None, :], acc.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _fixup_kernel(y_ptr, aq_ptr, as_ptr, st_ptr, rs_ptr, wq_ptr, ws_ptr, cf_ptr, bias_ptr, M, N, K, ldy,
                  A_X: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr, MODE: tl.constexpr,
                  AWAY: tl.constexpr, A_ROW: tl.constexpr, W_FMT: tl.constexpr, FLAG: tl.constexpr,
                  LO: tl.constexpr, HI: tl.constexpr,
                  HAS_COLS: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_BF16: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Recompute the flagged elements of y [M, N] (row stride ldy) exactly (module docstring): rows by FLAG 0
    (fold status st [M] uint8 == 1, or row scale rs [M] float32 outside [LO, HI], NaN not) or FLAG 1 (a scale
    byte of a outside [LO, HI], 0xFF not), columns by cf [N] uint8 != 0 (HAS_COLS). a: A_X False, MX codes aq
    (uint8 [M, K * bits / 8]; FP6 as int32 words) and scales as (uint8 [M, K / 32]) of format A_FMT (an
    ``ElementSpec``); A_X True, the rows aq [M, K] (IN_KIND: fp32 bits / bf16 bits / fp16) quantized to A_FMT
    (MODE, AWAY) as the quantize kernels do; A_ROW True (FLAG 0, no status read), FP8 rowwise activations: E4M3
    bytes aq [M, K] times their float32 row scale rs (the fast GEMM's epilogue is exact for rs in [LO, HI]).
    w: codes wq [N, ...] and scales ws [N, K / 32] of format W_FMT."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rs = tl.full([BLOCK_M], 1.0, tl.float32)
    if FLAG == 0:
        rs = tl.load(rs_ptr + rows, mask=rmask, other=1.0)
        if A_ROW:
            rflag = rmask & ((rs < LO) | (rs > HI))
        else:
            st = tl.load(st_ptr + rows, mask=rmask, other=0)
            rflag = rmask & ((st == 1) | (rs < LO) | (rs > HI))
    else:
        bad = tl.zeros([BLOCK_M], dtype=tl.int32)
        r64 = rows.to(tl.int64)
        for b0 in range(0, K // 32, 64):
            b = b0 + tl.arange(0, 64)
            sb = tl.load(as_ptr + r64[:, None] * (K // 32) + b[None, :], mask=rmask[:, None] & (b < K // 32)[None, :],
                         other=LO).to(tl.int32)
            bad = tl.maximum(bad, tl.max(((sb < LO) | ((sb > HI) & (sb != 255))).to(tl.int32), axis=1))
        rflag = rmask & (bad != 0)
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
                _fixup_tile(y_ptr, aq_ptr, as_ptr, wq_ptr, ws_ptr, bias_ptr, rows, rmask, rflag, rs, cols, cmask,
                            cflag, K, ldy, A_X, IN_KIND, A_FMT, MODE, AWAY, A_ROW, W_FMT, HAS_BIAS, DOT_BF16,
                            BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _folded_values(wd_ptr, ws_ptr, c64, cmask, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 values [BLOCK_N, BLOCK_K] of columns k0 .. k0 + BLOCK_K of folded weight rows c64 (int64): E4M3
    bytes wd [*, K] times the row's float32 power-of-two scale ws [*] (exact: the fold is, and its row scales lie
    in 2^+-FOLD_EXP_LIMIT). Masked elements are 0."""
    k = k0 + tl.arange(0, BLOCK_K)
    m = cmask[:, None] & (k < K)[None, :]
    d = tl.load(wd_ptr + c64[:, None] * K + k[None, :], mask=m, other=0)
    s = tl.load(ws_ptr + c64, mask=cmask, other=0.0)
    return d.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s[:, None]


@triton.jit
def _grouped_fixup_kernel(y_ptr, x_ptr, st_ptr, rs_ptr, ids_ptr, eids_ptr, wd_ptr, ws_ptr, n_valid, N, K, ldy,
                          TOP_K: tl.constexpr, GATHER: tl.constexpr, IN_KIND: tl.constexpr, A_FMT: tl.constexpr,
                          MODE: tl.constexpr, AWAY: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
                          DOT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """The grouped (MoE) fix-up after a grouped FP8 GEMM on folded rows: y [R, N] (row stride ldy) holds sorted
    rows r (``mxkit.kernels.moe.align_device``'s ids [R] int32, one expert eids [R / BLOCK_M] int32 per block of
    BLOCK_M rows, -1: an unused block; a padding row has ids[r] >= n_valid). Row r's operand is source row
    src = ids[r] // TOP_K (GATHER: the token) or r, the rows x [*, K] (IN_KIND) quantized to A_FMT (MODE, AWAY) as
    mxkit.quantize does; its weight, rows e * N .. e * N + N - 1 of the folded experts (E4M3 bytes wd [E * N, K],
    float32 row scales ws [E * N]). A valid row is recomputed exactly (module docstring: float32 values,
    float32 accumulation, one rounding to y's dtype) where its source's fold status st [*] uint8 is 1 or its
    row scale rs [*] float32 lies outside [LO, HI] (NaN not); nothing else is written."""
    tl.static_assert(BLOCK_M >= 16)
    e = tl.load(eids_ptr + tl.program_id(0))
    if e < 0:
        return
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(ids_ptr + rows)
    valid = ids < n_valid
    if GATHER:
        src = tl.where(valid, ids // TOP_K, 0)
    else:
        src = rows
    st = tl.load(st_ptr + src, mask=valid, other=0)
    rs = tl.load(rs_ptr + src, mask=valid, other=1.0)
    rflag = valid & ((st == 1) | (rs < LO) | (rs > HI))
    if tl.max(rflag.to(tl.int32), axis=0) > 0:  # (most blocks: no flagged row, exit after the flags)
        s64 = src.to(tl.int64)
        r64 = rows.to(tl.int64)
        for n0 in range(tl.program_id(1) * BLOCK_N, N, tl.num_programs(1) * BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            w64 = e.to(tl.int64) * N + cols
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                av = _a_values(x_ptr, x_ptr, s64, rflag, k0, K, True, IN_KIND, A_FMT, MODE, AWAY, BLOCK_M, BLOCK_K)
                wv = _folded_values(wd_ptr, ws_ptr, w64, cmask, k0, K, BLOCK_N, BLOCK_K)
                acc = _dot_exact(av, wv, acc, DOT_BF16)
            tl.store(y_ptr + r64[:, None] * ldy + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=rflag[:, None] & cmask[None, :])


# --------------------------------------------------------------------------------------------------------
# launchers


FIXUP_BLOCKS = (64, 64, 64)  # BLOCK_M, BLOCK_N, BLOCK_K of the fix-up kernel (4 warps)


def fixup(y: torch.Tensor, src, w: MXTensor, bias: Optional[torch.Tensor], M: int, N: int, K: int, *,
           fold: Optional[tuple] = None, special: Optional[torch.Tensor] = None) -> None:
    """Overwrite in y [M, N] (contiguous rows), with the exact float32 product (+ bias) read from the MX bytes,
    the elements a fast GEMM was not exact for (``matmul_details._row_fixup``; one launch, no host sync: tiles
    without a flagged row or column exit after reading their flags). ``src``: a's MXTensor (plain scales), the
    :class:`~mxkit.kernels.fold.QuantizedRows` a deferred quantize-fold read, or FP8 rowwise activations
    (:class:`mxkit.Fp8Rowwise`, data [M, K] contiguous, after the w4a8-fp8 path's FP8 GEMM); ``w``: the weight
    (plain).

    fold: (status uint8 [M], row scale float32 [M]) of a's fold, after the fold path's FP8 GEMM: rows of status 1
      or a row scale outside 2^+-FOLD_EXP_LIMIT, and the columns of ``special`` (the weight's special rows); for
      an Fp8Rowwise ``src``, (None, its row scales [M]): rows whose scale lies outside 2^+-FOLD_EXP_LIMIT (past
      the range the FP8 epilogue is shown exact for: a float32 epilogue that applied it before the weight's power
      of two could overflow or round twice there), and ``special``'s columns; None, after the bf16-exact path's bf16 GEMM: rows with a scale byte outside a's format's
      bf16-exact range.
    """
    if M and N:
        _launcher()(*fixup_launch(y, src, w, bias, M, N, K, fold=fold, special=special))


def fixup_launch(y: torch.Tensor, src, w: MXTensor, bias: Optional[torch.Tensor], M: int, N: int, K: int, *,
                 fold: Optional[tuple] = None, special: Optional[torch.Tensor] = None, cols=None) -> tuple:
    """The arguments of :func:`fixup`'s launch (M, N >= 1): (grid, tensors, ints, constexprs, num_warps), as
    ``_launcher()`` takes them. ``cols``: the column flags uint8 [N] of ``special`` made before (else made here
    where ``special`` has rows: one small allocation and scatter)."""
    from ...packed import Fp8Rowwise
    from ..fold import _IN_KIND, _IN_VIEW, _MODE, QuantizedRows

    a_row = isinstance(src, Fp8Rowwise)
    if a_row:
        aq, a_s, a_fmt = src.data.reshape(M, K).contiguous().view(torch.uint8), y, get_format("mxfp8_e4m3")
        if fold is None:
            raise ValueError("an Fp8Rowwise a is fixed up after an FP8 GEMM: pass fold=(None, row scales)")
        a_c = (("A_X", False), ("IN_KIND", 0), ("A_FMT", element_spec(a_fmt)), ("MODE", 0), ("AWAY", False))
    elif isinstance(src, QuantizedRows):
        aq, a_s, a_fmt = src.x.view(_IN_VIEW[src.x.dtype]), y, src.fmt
        a_c = (("A_X", True), ("IN_KIND", _IN_KIND[src.x.dtype]), ("A_FMT", element_spec(a_fmt)),
               ("MODE", _MODE[src.scale_mode]), ("AWAY", src.rounding is Rounding.AWAY))
    else:
        aq, a_s, a_fmt = _codes(src.qdata.reshape(M, -1), src.fmt), src.scale.reshape(M, -1), src.fmt
        if not a_s.is_contiguous():
            a_s = a_s.contiguous()
        a_c = (("A_X", False), ("IN_KIND", 0), ("A_FMT", element_spec(a_fmt)), ("MODE", 0), ("AWAY", False))
    if fold is not None:
        status, row_scale = fold
        status = y if status is None else status  # (unread with an Fp8Rowwise a)
        row_scale = row_scale.reshape(M).contiguous()
        flag = (("FLAG", 0), ("LO", 2.0 ** -FOLD_EXP_LIMIT), ("HI", 2.0 ** FOLD_EXP_LIMIT))
    else:
        status = row_scale = y  # (unread)
        flag = (("FLAG", 1),) + tuple(zip(("LO", "HI"), exact_scale_range(a_fmt, torch.bfloat16)))
    cf = cols if cols is not None else column_flags(special, N, y.device)
    cols = cf is not None
    bm, bn, bk = FIXUP_BLOCKS
    # (E4M3 codes without a block scale, an Fp8Rowwise a's, are bf16 values)
    bf16 = y.is_cuda and not interpreting() and (a_row or bf16_exact_values(a_fmt)) and bf16_exact_values(w.fmt)
    consts = a_c + (("A_ROW", a_row), ("W_FMT", element_spec(w.fmt))) + flag + (
        ("HAS_COLS", cols), ("HAS_BIAS", bias is not None), ("DOT_BF16", bf16), ("BLOCK_M", bm), ("BLOCK_N", bn),
        ("BLOCK_K", bk))
    bias_t = y if bias is None else (bias if bias.is_contiguous() else bias.contiguous())
    tiles_m, tiles_n = -(-M // bm), -(-N // bn)
    return ((tiles_m, max(1, min(tiles_n, _programs(y.device) // tiles_m))),
            (y, aq, a_s, status, row_scale, _codes(w.qdata.reshape(N, -1), w.fmt),
             w.scale.reshape(N, -1).contiguous(), cf if cols else y, bias_t), (M, N, K, y.stride(0)), consts, 4)


def column_flags(special: Optional[torch.Tensor], N: int, device: torch.device) -> Optional[torch.Tensor]:
    """uint8 [N]: 1 at the weight's special rows (the fix-up's HAS_COLS columns); None where there are none.
    CUDA-graph capturable where ``special`` is on ``device`` (index_fill_ with a scalar: ``cf[special] = 1`` copied
    the 1 from the host, which capture refuses)."""
    if special is None or not special.numel():
        return None
    return torch.zeros(N, dtype=torch.uint8, device=device).index_fill_(0, special.to(device), 1)


def grouped_fixup(y: torch.Tensor, src, status: torch.Tensor, row_scale: torch.Tensor, sorted_ids: torch.Tensor,
                  expert_ids: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, *, n_valid: int,
                  top_k: int, gather: bool) -> None:
    """The fix-up of a grouped (MoE) GEMM on folded rows (``_grouped_fixup_kernel``; one launch, no host sync):
    overwrite in y [R, N] (rows of contiguous elements, any row stride; sorted order) the rows whose folded
    operand was not exact, with the exact float32 product read from the operand's source rows and the folded
    experts.

    src: the :class:`~mxkit.kernels.fold.QuantizedRows` the operand's quantize-fold read (x [S, K], its format,
      scale mode and rounding); status uint8 [S] and row_scale float32 [S]: that fold's (a
      :class:`~mxkit.kernels.fold.PendingFold`'s ``status`` and ``folded.scale``); a row is redone where its
      status is 1 (block scales spanning more than the fold window) or its row scale lies outside
      2^+-FOLD_EXP_LIMIT.
    sorted_ids int32 [R], expert_ids int32 [R / block_m]: ``mxkit.kernels.moe.align_device``'s (block_m >= 16);
      n_valid = T * top_k; gather: row r reads source row sorted_ids[r] // top_k (the tokens) rather than r.
    w_data float8_e4m3fn [E, N, K] and w_scale float32 [E, N]: the experts folded (``mxkit.kernels.moe.FoldedExperts``,
      every row scale within 2^+-FOLD_EXP_LIMIT)."""
    from ..fold import _IN_KIND, _IN_VIEW, _MODE

    R, N = y.shape
    K = src.x.shape[1]
    B = expert_ids.numel()
    if not (R and N and B):
        return
    if y.stride(1) != 1:
        raise ValueError(f"grouped_fixup writes rows of contiguous elements, got y of strides {y.stride()}")
    bm = sorted_ids.numel() // B
    _, bn, bk = FIXUP_BLOCKS
    bf16 = y.is_cuda and not interpreting() and bf16_exact_values(src.fmt)  # (folded weights: E4M3 x 2^e, |e| <= 54)
    consts = (("TOP_K", top_k), ("GATHER", gather), ("IN_KIND", _IN_KIND[src.x.dtype]),
              ("A_FMT", element_spec(src.fmt)), ("MODE", _MODE[src.scale_mode]),
              ("AWAY", src.rounding is Rounding.AWAY), ("LO", 2.0 ** -FOLD_EXP_LIMIT), ("HI", 2.0 ** FOLD_EXP_LIMIT),
              ("DOT_BF16", bf16), ("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk))
    grid = (B, max(1, min(-(-N // bn), _programs(y.device) // B)))
    _launcher("_grouped_fixup_kernel")(grid, (y, src.x.view(_IN_VIEW[src.x.dtype]), status, row_scale, sorted_ids,
                                              expert_ids, w_data.view(torch.uint8), w_scale),
                                       (n_valid, N, K, y.stride(0)), consts, 4)


@constant_cache
def bf16_exact_values(f: ElementFormat) -> bool:
    """Every value of ``f`` times any E8M0 factor is exact in bf16 wherever it is in float32 (FP4, FP6, INT8;
    not FP8, whose smallest subnormals times 2^-127 fall below bf16's)."""
    return exact_scale_range(f, torch.bfloat16) == exact_scale_range(f, torch.float32)


def _codes(q: torch.Tensor, f: ElementFormat) -> torch.Tensor:
    """MX code rows (uint8 [R, bytes]) as the fix-up reads them: bytes, FP6 as int32 words (copied where
    unaligned or not contiguous)."""
    if not q.is_contiguous() or (f.bits == 6 and q.data_ptr() % 4):
        q = q.clone(memory_format=torch.contiguous_format)
    return q.view(torch.int32) if f.bits == 6 else q


@functools.lru_cache(maxsize=None)
def _launcher(name: str = "_fixup_kernel"):
    """Kernel ``name``'s bound direct launch, one per process."""
    from .. import launch

    return launch.BoundCache(launch._Launcher(sys.modules[__name__], name))


@functools.lru_cache(maxsize=None)
def _programs(device: torch.device) -> int:
    """About two programs per SM (the fix-up's grid; the CPU interpreter: 4)."""
    if device.type != "cuda":
        return 4
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count
