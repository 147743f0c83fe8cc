"""``@triton.jit`` bodies of the row-fold kernels (launchers: :mod:`mxkit.kernels.fold`; reference:
:mod:`mxkit.fold`).

One program folds BLOCK_R rows, walking K in chunks of BLOCK_K elements (BLOCK_K // 32 blocks):

1. pass 1 (the row statistics): per block its scale byte and whether any of its 32 elements is non-zero;
   per row the largest and smallest scale of its non-zero blocks and whether any scale byte is 0xFF.
2. pass 2 (the bytes): each element as E4M3 at d = s_b - max_s + D_HI (in [D_LO, D_HI] for the row's
   non-zero blocks when the span fits: exact), the row scale 2^(max_s - 127 - D_HI) as fp32 bits and a status
   byte per row: 0 folded, 1 span > D_HI - D_LO (the launcher re-does those rows with the reference split),
   2 NaN (scale NaN, bytes 0). A row without non-zero blocks gets scale 1.0.

With ONE_CHUNK (K <= BLOCK_K) the row tile is loaded once and its codes stay in registers between the passes;
otherwise pass 2 reloads each chunk (from L2 on a GPU). Packed FP4 / FP6 rows are read as int32 words (FP4:
8 codes per word; FP6: 16 codes per 3 words, unpacked in-thread by ``_fp6_codes16``); the quantize-fold
kernel quantizes each 32-block with the quantize kernels' ``_block_scale`` and ``_encode`` (HW_CVT: FP6 RNE
through the hardware FP8 cvt), so its codes are mxkit.quantize's.

The element -> E4M3 step is integer work plus one exact fp32 multiply (:func:`_codes_to_e4m3`); it relies
on fp32 multiplies that keep subnormal operands and results (PTX ``mul.f32`` without ``.ftz``, what Triton
emits for sm_90, and numpy in the interpreter), as the quantize kernels do.
Row offsets are int64 (rows * row stride), so R * K past 2^31 is safe; offsets within a row are int32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quantize_details._codecs import _encode, _fp6_codes16
from ..quantize_details._common import _load_raw, _to_bits
from ..quantize_details._scale import _block_scale


@triton.jit
def _codes_to_e4m3(codes, d, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """E4M3 bytes (int32) of element codes [..., NB, 32] (int32, FP4 / FP6, sign in bit BITS - 1) times 2^d,
    d [..., NB, 1] (int32) with every code's value times 2^d exact in E4M3 (the fold range)."""
    # the magnitude bits (exponent field, mantissa) placed at fp32's fields make the fp32 value
    # elem * 2^(bias - 127) (an fp32 subnormal for the element's subnormals, with the same mantissa bits)
    u = ((codes & ((1 << (BITS - 1)) - 1)) << (23 - MBITS)).to(tl.float32, bitcast=True)
    # times 2^(d + 7 - bias) (bias = 1 - EMIN; a normal factor for every d of the fold range): exact
    u = u * ((d + (7 - (1 - EMIN) + 127)) << 23).to(tl.float32, bitcast=True)
    # u = elem * 2^d * 2^-120: for E4M3 normals its exponent field is E4M3's (bias 7 = 127 - 120) and bits
    # 20-22 its mantissa; for E4M3 subnormals u is an fp32 subnormal with bits = k * 2^20 (value k * 2^-9)
    mag = u.to(tl.int32, bitcast=True) >> 20
    # the sign bit moves from bit BITS - 1 to bit 7
    return mag | ((codes >> (BITS - 1)) << 7)


def _int32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


# the magnitude bits of packed codes: FP4 words (8 codes, sign = bit 3 of each nibble); FP6 groups of three words
# (16 codes, code k at bits 6k .. 6k + 5 of the 96-bit little-endian group, sign = bit 6k + 5)
_FP4_MAG = tl.constexpr(0x77777777)
_FP6_MAG0, _FP6_MAG1, _FP6_MAG2 = (
    tl.constexpr(_int32(0xFFFFFFFF ^ sum(1 << (6 * k + 5 - 32 * w) for k in range(16) if (6 * k + 5) // 32 == w)))
    for w in range(3)
)


@triton.jit
def _fp_codes(q_ptr, qrow, k0, K, rmask, BITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
              MASKED: tl.constexpr):
    """Element codes (int32 [BLOCK_R, NB, 32]) of columns k0 .. k0 + BLOCK_K of packed FP4 / FP6 rows, and
    whether each block holds a non-zero code ([BLOCK_R, NB]); q_ptr: the packed rows as int32 words, qrow:
    int64 [BLOCK_R] word offsets of the rows. Masked columns / rows read code 0."""
    tl.static_assert(BITS == 4 or BITS == 6)
    NB: tl.constexpr = BLOCK_K // 32
    if BITS == 4:
        j = k0 // 8 + tl.arange(0, BLOCK_K // 8)  # 8 codes per word, code k in bits 4k .. 4k + 3
        m = (rmask[:, None] & (j < K // 8)[None, :]) | (not MASKED)
        w = tl.load(q_ptr + qrow[:, None] + j[None, :], mask=m, other=0)
        # all 8 codes of a word in the thread that holds it; & 15 drops the arithmetic shift's sign copies
        codes = (w[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 15
        nz = tl.reshape(((w & _FP4_MAG) != 0).to(tl.int32), [BLOCK_R, NB, 4])
    else:
        g = k0 // 16 + tl.arange(0, BLOCK_K // 16)  # 16 codes per 3 words
        m = (rmask[:, None] & (g < K // 16)[None, :]) | (not MASKED)
        p = q_ptr + qrow[:, None] + 3 * g[None, :]
        w0 = tl.load(p, mask=m, other=0)
        w1 = tl.load(p + 1, mask=m, other=0)
        w2 = tl.load(p + 2, mask=m, other=0)
        codes = _fp6_codes16(w0, w1, w2)
        nz = ((w0 & _FP6_MAG0) | (w1 & _FP6_MAG1) | (w2 & _FP6_MAG2)) != 0
        nz = tl.reshape(nz.to(tl.int32), [BLOCK_R, NB, 2])
    return tl.reshape(codes, [BLOCK_R, NB, 32]), tl.max(nz, axis=2) != 0


@triton.jit
def _row_stats(sbyte, nonzero, smax, smin, nan):
    """Running (max, min) scale byte of each row's non-zero blocks and its NaN flag, over a [BLOCK_R, NB] chunk."""
    live = nonzero & (sbyte != 255)
    smax = tl.maximum(smax, tl.max(tl.where(live, sbyte, -1), axis=1))
    smin = tl.minimum(smin, tl.min(tl.where(live, sbyte, 256), axis=1))
    nan = nan | (tl.max((sbyte == 255).to(tl.int32), axis=1) != 0)
    return smax, smin, nan


@triton.jit
def _fold_chunk(codes, sbyte, smax, nan, out_ptr, orow, k0, K, rmask, BITS: tl.constexpr, MBITS: tl.constexpr,
                EMIN: tl.constexpr, D_LO: tl.constexpr, D_HI: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """Store the E4M3 bytes of one chunk: codes int32 [BLOCK_R, NB, 32], sbyte int32 [BLOCK_R, NB]."""
    # clamped, so all-zero blocks (any scale) and rows sent to the host get a finite factor
    d = tl.minimum(tl.maximum(sbyte - smax[:, None] + D_HI, D_LO), D_HI)
    e4 = _codes_to_e4m3(codes, d[:, :, None], BITS, MBITS, EMIN)
    e4 = tl.where(nan[:, None, None], 0, e4)
    k = k0 + tl.arange(0, BLOCK_K)
    m = (rmask[:, None] & (k < K)[None, :]) | (not MASKED)
    tl.store(out_ptr + orow[:, None] + k[None, :], tl.reshape(e4, [BLOCK_R, BLOCK_K]).to(tl.uint8), mask=m)


@triton.jit
def _store_row(rs_ptr, st_ptr, rows, rmask, smax, smin, nan, D_LO: tl.constexpr, D_HI: tl.constexpr):
    """Row scale (fp32 bits: 2^(smax - 127 - D_HI), 1.0 without non-zero blocks, NaN) and status byte."""
    e = tl.where(smax >= 0, smax - 127 - D_HI, 0)
    # 2^e: exponent field for normals, a single mantissa bit for fp32 subnormals (e >= -149 here)
    bits = tl.where(e >= -126, (e + 127) << 23, 1 << (tl.minimum(tl.maximum(e, -149), -127) + 149))
    bits = tl.where(nan, 0x7FC00000, bits)
    status = tl.where(nan, 2, tl.where(smax - smin > D_HI - D_LO, 1, 0))
    tl.store(rs_ptr + rows, bits, mask=rmask)
    tl.store(st_ptr + rows, status.to(tl.uint8), mask=rmask)


@triton.jit
def _fold_read(q_ptr, s_ptr, qrow, srow, k0, K, rmask, BITS: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """Columns k0 .. k0 + BLOCK_K of BLOCK_R packed rows: (codes int32 [BLOCK_R, NB, 32], scale bytes int32
    [BLOCK_R, NB], block holds a non-zero code [BLOCK_R, NB]); masked blocks read as zero blocks of scale 0."""
    NB: tl.constexpr = BLOCK_K // 32
    b = k0 // 32 + tl.arange(0, NB)
    sm = (rmask[:, None] & (b < K // 32)[None, :]) | (not MASKED)
    sbyte = tl.load(s_ptr + srow[:, None] + b[None, :], mask=sm, other=0).to(tl.int32)
    codes, nonzero = _fp_codes(q_ptr, qrow, k0, K, rmask, BITS, BLOCK_R, BLOCK_K, MASKED)
    return codes, sbyte, nonzero


@triton.jit
def _byte_extrema(sbyte, k0, K, rmask, amin, amax, BLOCK_K: tl.constexpr):
    """Running smallest / largest scale byte other than 0xFF of each row, over every block (zero blocks too)
    of a [BLOCK_R, NB] chunk (masked blocks left out)."""
    b = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    keep = rmask[:, None] & (b < K // 32)[None, :] & (sbyte != 255)
    amin = tl.minimum(amin, tl.min(tl.where(keep, sbyte, 255), axis=1))
    amax = tl.maximum(amax, tl.max(tl.where(keep, sbyte, -1), axis=1))
    return amin, amax


@triton.jit
def _store_stats(stats_ptr, rmask, amin, amax, smax, smin, nan, D_LO: tl.constexpr, D_HI: tl.constexpr,
                 EXP_LIMIT: tl.constexpr):
    """This program's row of the weight statistics, every entry a maximum over its rows (0 when none, so the
    rows of all programs reduce by one amax): 255 - smallest byte, largest byte + 1, a 0xFF byte, a row scale
    2^e with |e| > EXP_LIMIT (NaN rows not), a row whose block scales span more than the fold window."""
    e = tl.where(smax >= 0, smax - 127 - D_HI, 0)
    out_env = ~nan & ((e > EXP_LIMIT) | (e < -EXP_LIMIT))
    wide = ~nan & (smax - smin > D_HI - D_LO)
    at = stats_ptr + 5 * tl.program_id(0).to(tl.int64)
    tl.store(at, tl.max(tl.where(rmask, 255 - amin, 0), axis=0))
    tl.store(at + 1, tl.max(tl.where(rmask, amax + 1, 0), axis=0))
    tl.store(at + 2, tl.max(tl.where(rmask & nan, 1, 0), axis=0))
    tl.store(at + 3, tl.max(tl.where(rmask & out_env, 1, 0), axis=0))
    tl.store(at + 4, tl.max(tl.where(rmask & wide, 1, 0), axis=0))


@triton.jit
def _fold_kernel(q_ptr, s_ptr, out_ptr, rs_ptr, st_ptr, stats_ptr, R, K,
                 BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, D_LO: tl.constexpr,
                 D_HI: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, ONE_CHUNK: tl.constexpr,
                 MASKED: tl.constexpr, STATS: tl.constexpr, EXP_LIMIT: tl.constexpr):
    """Fold packed FP4 / FP6 rows (qdata [R, K * BITS / 32] int32 words, scale [R, K / 32] uint8) to E4M3
    (out [R, K] uint8), row scales (rs [R] int32 = fp32 bits) and status bytes (st [R] uint8). STATS: also the
    statistics a packed weight needs, one row of 5 int32 per program (``_store_stats``)."""
    tl.static_assert(BLOCK_K % 32 == 0)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    qrow = r64 * (K // 32 * BITS)  # in words
    srow = r64 * (K // 32)
    orow = r64 * K
    smax = tl.full([BLOCK_R], -1, tl.int32)
    smin = tl.full([BLOCK_R], 256, tl.int32)
    nan = tl.full([BLOCK_R], 0, tl.int1)
    amax = tl.full([BLOCK_R], -1, tl.int32)
    amin = tl.full([BLOCK_R], 255, tl.int32)
    if ONE_CHUNK:  # K <= BLOCK_K: one load serves both passes
        codes, sbyte, nonzero = _fold_read(q_ptr, s_ptr, qrow, srow, 0, K, rmask, BITS, BLOCK_R, BLOCK_K, MASKED)
        smax, smin, nan = _row_stats(sbyte, nonzero, smax, smin, nan)
        if STATS:
            amin, amax = _byte_extrema(sbyte, 0, K, rmask, amin, amax, BLOCK_K)
        _fold_chunk(codes, sbyte, smax, nan, out_ptr, orow, 0, K, rmask, BITS, MBITS, EMIN, D_LO, D_HI,
                    BLOCK_R, BLOCK_K, MASKED)
    else:
        for k0 in range(0, K, BLOCK_K):
            codes, sbyte, nonzero = _fold_read(q_ptr, s_ptr, qrow, srow, k0, K, rmask, BITS, BLOCK_R, BLOCK_K,
                                               MASKED)
            smax, smin, nan = _row_stats(sbyte, nonzero, smax, smin, nan)
            if STATS:
                amin, amax = _byte_extrema(sbyte, k0, K, rmask, amin, amax, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            codes, sbyte, nonzero = _fold_read(q_ptr, s_ptr, qrow, srow, k0, K, rmask, BITS, BLOCK_R, BLOCK_K,
                                               MASKED)
            _fold_chunk(codes, sbyte, smax, nan, out_ptr, orow, k0, K, rmask, BITS, MBITS, EMIN, D_LO, D_HI,
                        BLOCK_R, BLOCK_K, MASKED)
    _store_row(rs_ptr, st_ptr, rows, rmask, smax, smin, nan, D_LO, D_HI)
    if STATS:
        _store_stats(stats_ptr, rmask, amin, amax, smax, smin, nan, D_LO, D_HI, EXP_LIMIT)


@triton.jit
def _quantize_chunk(x_ptr, xrow, k0, K, rmask, IN_KIND: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                    EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
                    MODE: tl.constexpr, AWAY: tl.constexpr, HW_CVT: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """Quantize columns k0 .. k0 + BLOCK_K of BLOCK_R rows as mxkit.quantize does: (element codes int32
    [BLOCK_R, NB, 32], scale bytes int32 [BLOCK_R, NB], block holds a non-zero code [BLOCK_R, NB])."""
    NB: tl.constexpr = BLOCK_K // 32
    k = k0 + tl.arange(0, BLOCK_K)
    m = (rmask[:, None] & (k < K)[None, :]) | (not MASKED)
    xbits = _to_bits(_load_raw(x_ptr + xrow[:, None] + k[None, :], m, IN_KIND), IN_KIND)
    xbits = tl.reshape(xbits, [BLOCK_R, NB, 32])
    # |x| bits order like |x| (NaN / Inf are the patterns >= 0x7F800000): the block amax is an integer max
    amax = tl.max(xbits & 0x7FFFFFFF, axis=2)
    sbyte, X = _block_scale(amax, 0, MBITS, EMAX, MAX_FRAC, MODE)
    bad = amax >= 0x7F800000
    codes = _encode(xbits, X[:, :, None], bad[:, :, None], BITS, MBITS, EMIN, EMAX, False, MAX_NORMAL, AWAY,
                    HW_CVT)
    # rounding is monotone: the block has a non-zero code iff its amax rounds to one (all-zero blocks and
    # blocks whose scale clamped at 2^-127 round to 0 entirely)
    nonzero = (_encode(amax, X, bad, BITS, MBITS, EMIN, EMAX, False, MAX_NORMAL, AWAY)
               & ((1 << (BITS - 1)) - 1)) != 0
    return codes, sbyte, nonzero


@triton.jit
def _quantize_fold_kernel(x_ptr, out_ptr, rs_ptr, st_ptr, R, K,
                          IN_KIND: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                          EMAX: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
                          MODE: tl.constexpr, AWAY: tl.constexpr, D_HI: tl.constexpr, W: tl.constexpr,
                          HW_CVT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                          ONE_CHUNK: tl.constexpr, MASKED: tl.constexpr):
    """Quantize x [R, K] (fp32 bits int32 / bf16 bits int16 / fp16) to FP4 / FP6 per 32-block and fold each row:
    out [R, K] E4M3 bytes, rs [R] fp32 bits, st [R] status, as :func:`_fold_kernel` (D_LO = D_HI - W)."""
    tl.static_assert(BLOCK_K % 32 == 0)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    xrow = rows.to(tl.int64) * K
    smax = tl.full([BLOCK_R], -1, tl.int32)
    smin = tl.full([BLOCK_R], 256, tl.int32)
    nan = tl.full([BLOCK_R], 0, tl.int1)
    if ONE_CHUNK:  # K <= BLOCK_K: one load serves both passes
        codes, sbyte, nonzero = _quantize_chunk(x_ptr, xrow, 0, K, rmask, IN_KIND, BITS, MBITS, EMIN, EMAX,
                                                MAX_NORMAL, MAX_FRAC, MODE, AWAY, HW_CVT, BLOCK_R, BLOCK_K,
                                                MASKED)
        smax, smin, nan = _row_stats(sbyte, nonzero, smax, smin, nan)
        _fold_chunk(codes, sbyte, smax, nan, out_ptr, xrow, 0, K, rmask, BITS, MBITS, EMIN, D_HI - W, D_HI,
                    BLOCK_R, BLOCK_K, MASKED)
    else:  # pass 2 re-reads the rows' chunks (L2 hits on a GPU) and quantizes them again
        for k0 in range(0, K, BLOCK_K):
            codes, sbyte, nonzero = _quantize_chunk(x_ptr, xrow, k0, K, rmask, IN_KIND, BITS, MBITS, EMIN, EMAX,
                                                    MAX_NORMAL, MAX_FRAC, MODE, AWAY, HW_CVT, BLOCK_R, BLOCK_K,
                                                    MASKED)
            smax, smin, nan = _row_stats(sbyte, nonzero, smax, smin, nan)
        for k0 in range(0, K, BLOCK_K):
            codes, sbyte, nonzero = _quantize_chunk(x_ptr, xrow, k0, K, rmask, IN_KIND, BITS, MBITS, EMIN, EMAX,
                                                    MAX_NORMAL, MAX_FRAC, MODE, AWAY, HW_CVT, BLOCK_R, BLOCK_K,
                                                    MASKED)
            _fold_chunk(codes, sbyte, smax, nan, out_ptr, xrow, k0, K, rmask, BITS, MBITS, EMIN, D_HI - W, D_HI,
                        BLOCK_R, BLOCK_K, MASKED)
    _store_row(rs_ptr, st_ptr, rows, rmask, smax, smin, nan, D_HI - W, D_HI)
