"""Columnwise quantize (blocks of 32 along R, the output transposed so the quantized axis is last): the column
tiles and the columnwise kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (
    IN_BF16_BITS, _absmax8, _block_absmax, _hmax_abs, _load_raw, _load_rows8, _tile_ids, _to_bits,
)
from ._codecs import (
    FP6_PAIRS_COLS_E2M3, FP6_PAIRS_COLS_E3M2, FP6_PAIRS_COLS_RW, _encode_as, _fp4_cols_pack, _fp6_asm_input,
    _fp6_asm_words, _fp6_unit_words, _fp6_units_hw, _fp8_words, _scaled,
)
from ._scale import _fp6_pairs_factor, _scale_of
from ._store import _store_fp6_units, _store_scales


@triton.jit
def _cols_fp4_words(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, LAYOUT: tl.constexpr, FMT: tl.constexpr,
                    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr,
                    WIDE: tl.constexpr):
    """Columnwise FP4 from bf16 (PAIRS; GPU only; C even, the input address a multiple of 4): rows r0 ..
    r0 + BLOCK_R, columns c0 .. c0 + BLOCK_C read as 32-bit words (bf16 pairs of adjacent columns: x_ptr is
    the input's int32 view), one [W, BLOCK_C / 2] tile per row j of the J-row units (J = 16 with WIDE, else
    8). One asm per word rounds the J pairs and packs each column's unit (:func:`_fp4_cols_asm`): the asm is
    elementwise over the J row tiles, so any layout gives the same bytes. The amax runs on both halves of the
    words at once (:func:`_hmax_abs`). The packed units are transposed and stored as in :func:`_cols_packed`."""
    J: tl.constexpr = 16 if WIDE else 8
    W: tl.constexpr = BLOCK_R // J
    NB: tl.constexpr = BLOCK_R // 32
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    cw = c0 // 2 + tl.arange(0, H)
    urow = r0 + tl.arange(0, W) * J  # first row of each unit (R is a multiple of 32: whole units in or out)
    m = ((urow < R) | (not MASKED))[:, None] & ((cw < C // 2) | (not MASKED))[None, :]
    p = x32 + (b * R + urow)[:, None] * (C // 2) + cw[None, :]
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m)
    am = _absmax8(x0, x1, x2, x3, x4, x5, x6, x7)
    if WIDE:
        x8, x9, x10, x11, x12, x13, x14, x15 = _load_rows8(p + 8 * rs, rs, m)
        am = _hmax_abs(am, _absmax8(x8, x9, x10, x11, x12, x13, x14, x15))
    else:  # (unused by the 8-row asm)
        x8, x9, x10, x11, x12, x13, x14, x15 = x0, x1, x2, x3, x4, x5, x6, x7
    am = _block_absmax(tl.reshape(am, [NB, W // NB, H]), 1)  # [NB, H]: both columns' block amax
    amax = tl.reshape(tl.join((am & 0xFFFF) << 16, (am >> 16) << 16), [NB, BLOCK_C])  # fp32 bits, per column
    sbyte, x = _scale_of(amax, FMT, MODE)
    fe, fo = tl.split(tl.reshape((127 - x) << 7, [NB, H, 2]))
    fw = tl.reshape(tl.broadcast_to((fe | (fo << 16))[:, None, :], [NB, W // NB, H]), [W, H])
    we, wo = _fp4_cols_pack(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, fw, WIDE)
    words = tl.reshape(tl.join(we, wo), [W, BLOCK_C])  # the unit of (w, column c)
    bad = tl.reshape(tl.broadcast_to((amax >= 0x7F800000)[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    words = tl.where(bad, 0, words)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    wcol = r0 // J + tl.arange(0, W)
    wm = cmask[:, None] & ((wcol < R // J) | (not MASKED))[None, :]
    if WIDE:
        q64 = q_ptr.to(tl.pointer_type(tl.int64))  # (rows of R / 2 bytes, a multiple of 16)
        tl.store(q64 + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    else:
        tl.store(q_ptr + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    _store_scales(s_ptr, tl.trans(sbyte.to(tl.uint8)), g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _cols_fp4_units(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, LAYOUT: tl.constexpr, FMT: tl.constexpr,
                    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr = 0):
    """Columnwise FP4 from bf16 pairs in the units layout (the fused cast-transpose with PAIRS; GPU only; C even,
    the input address a multiple of 4): the 32-bit words of :func:`_cols_fp4_words` (bf16 pairs of adjacent
    columns, one asm per 8 rows packing both columns' units) in the thread layout of :func:`_cols_units`. The J row tiles are [NB, H, UB] (32-row
    block n, column pair h, unit u of the block), one word per load (``tl.max_contiguous`` 1), so the lanes
    run along the blocks first and then along the pairs: each thread holds every unit of one block of its
    pair (the block amax in-thread, no exchange), and the NB lanes of a pair store its columns' NB pieces of
    16 bytes next to each other, one contiguous 16 * NB-byte piece of each output row per store instruction.
    EVICT: the loads' eviction policy (the fused cast-transpose's evict_first)."""
    J: tl.constexpr = 8
    NB: tl.constexpr = BLOCK_R // 32
    UB: tl.constexpr = 32 // J  # units per block
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, NB)[:, None, None]
    h = tl.arange(0, H)[None, :, None]
    u = tl.arange(0, UB)[None, None, :]
    urow = r0 + n * 32 + u * J  # [NB, 1, UB]: first row of each unit (R is a multiple of 32)
    m = ((urow < R) | (not MASKED)) & ((c0 // 2 + h < C // 2) | (not MASKED))  # [NB, H, UB]
    p = x32 + tl.max_contiguous((b * R + urow) * (C // 2) + c0 // 2 + h, [1, 1, 1])
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m, EVICT)
    am = _absmax8(x0, x1, x2, x3, x4, x5, x6, x7)
    am = _block_absmax(am, 2)  # [NB, H]: both columns' block amax
    amax = tl.join((am & 0xFFFF) << 16, (am >> 16) << 16)  # [NB, H, 2]: fp32 bits, column 2h + k
    sbyte, x = _scale_of(amax, FMT, MODE)
    fe, fo = tl.split((127 - x) << 7)  # [NB, H]
    fw = tl.broadcast_to((fe | (fo << 16))[:, :, None], [NB, H, UB])
    # (the 8-row asm reads x0 .. x7 only)
    we, wo = _fp4_cols_pack(x0, x1, x2, x3, x4, x5, x6, x7, x0, x1, x2, x3, x4, x5, x6, x7, fw, False)
    be, bo = tl.split(amax >= 0x7F800000)  # [NB, H]
    we = tl.where(tl.broadcast_to(be[:, :, None], [NB, H, UB]), 0, we)
    wo = tl.where(tl.broadcast_to(bo[:, :, None], [NB, H, UB]), 0, wo)
    # output row of the even column of pair h, unit (r0 / J + UB n + u): the UB units of a block start at a
    # multiple of UB (R and r0 are multiples of 32)
    offs = (b * C + c0 + 2 * h) * (R // J) + r0 // J + n * UB + u
    wm = ((c0 // 2 + h < C // 2) | (not MASKED)) & ((r0 + n * 32 < R) | (not MASKED))
    tl.store(q_ptr + tl.multiple_of(tl.max_contiguous(offs, [1, 1, UB]), [1, 1, UB]), we, mask=wm)
    tl.store(q_ptr + tl.multiple_of(tl.max_contiguous(offs + R // J, [1, 1, UB]), [1, 1, UB]), wo, mask=wm)
    c = c0 + tl.arange(0, BLOCK_C)
    sb = tl.reshape(tl.permute(sbyte, [1, 2, 0]), [BLOCK_C, NB])  # [H, 2, NB] -> column 2h + k
    _store_scales(s_ptr, sb, b * C + c, (c < C) | (not MASKED), r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _cols_fp6_pairs(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, LAYOUT: tl.constexpr, FMT: tl.constexpr,
                    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr = 0):
    """Columnwise FP6 from bf16 pairs of adjacent columns (the fused cast-transpose with PAIRS; GPU only; C even, the input address a
    multiple of 4), in the thread layout of :func:`_cols_fp4_units`: 16 row tiles [NB, H, 2] of words (32-row
    block n, column pair h, 16-row unit u), one word per load, so each thread holds both units of one block
    of its pair and the amax is in-thread (:func:`_hmax_abs`, both columns at once). One asm per unit pair
    (:func:`_fp6_pairs_asm`, elementwise over the 16 tiles) makes both columns' three words; the words are
    stored as :func:`_cols_units` stores its FP6 units (one [units, columns, 4] store). q_ptr: int32 words."""
    NB: tl.constexpr = BLOCK_R // 32
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, NB)[:, None, None]
    h = tl.arange(0, H)[None, :, None]
    u = tl.arange(0, 2)[None, None, :]
    urow = r0 + n * 32 + u * 16  # [NB, 1, 2]: first row of each unit (R is a multiple of 32)
    m = ((urow < R) | (not MASKED)) & ((c0 // 2 + h < C // 2) | (not MASKED))  # [NB, H, 2]
    p = x32 + tl.max_contiguous((b * R + urow) * (C // 2) + c0 // 2 + h, [1, 1, 1])
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m, EVICT)
    x8, x9, x10, x11, x12, x13, x14, x15 = _load_rows8(p + 8 * rs, rs, m, EVICT)
    am = _hmax_abs(_absmax8(x0, x1, x2, x3, x4, x5, x6, x7), _absmax8(x8, x9, x10, x11, x12, x13, x14, x15))
    am = _block_absmax(am, 2)  # [NB, H]: both columns' block amax
    amax = tl.join((am & 0xFFFF) << 16, (am >> 16) << 16)  # [NB, H, 2]: fp32 bits, column 2h + k
    sbyte, X = _scale_of(amax, FMT, MODE)
    fac, clamp = _fp6_pairs_factor(X, FMT.mbits, FMT.emax, FMT.max_frac)
    fe, fo = tl.split(fac)
    ce, co = tl.split(clamp)
    ke, ko = tl.split(tl.where(amax >= 0x7F800000, 0, -1))
    w0e, w1e, w2e, w0o, w1o, w2o = tl.inline_asm_elementwise(
        FP6_PAIRS_COLS_E2M3 if FMT.mbits == 3 else FP6_PAIRS_COLS_E3M2, FP6_PAIRS_COLS_RW,
        [x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
         tl.broadcast_to(fe[:, :, None], [NB, H, 2]), tl.broadcast_to(fo[:, :, None], [NB, H, 2]),
         tl.broadcast_to((ce | (co << 16))[:, :, None], [NB, H, 2]), tl.broadcast_to(ke[:, :, None], [NB, H, 2]),
         tl.broadcast_to(ko[:, :, None], [NB, H, 2])],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    # per column: [NB, H, 2 (u), 2 (parity)] -> [units (n, u), columns (h, parity)]
    W0 = tl.reshape(tl.permute(tl.join(w0e, w0o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    W1 = tl.reshape(tl.permute(tl.join(w1e, w1o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    W2 = tl.reshape(tl.permute(tl.join(w2e, w2o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    w4 = tl.reshape(tl.join(tl.join(W0, W2), tl.join(W1, W2)), [NB * 2, BLOCK_C, 4])
    unit = r0 // 16 + tl.arange(0, NB * 2)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED)
    sb = tl.reshape(tl.permute(sbyte, [1, 2, 0]), [BLOCK_C, NB])  # [H, 2, NB] -> column 2h + k
    _store_scales(s_ptr, sb, g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _quantize_cols(xbits, BR: tl.constexpr, BC: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
                   AWAY: tl.constexpr):
    """[BR, BC] fp32 bits, blocks of 32 along dim 0 (no transpose) -> (codes [BR // 32, 32, BC],
    scale bytes [BR // 32, BC]); the integer encoder."""
    tl.static_assert(BR % 32 == 0)
    b3 = tl.reshape(xbits, [BR // 32, 32, BC])
    amax = tl.max(b3 & 0x7FFFFFFF, axis=1)
    sbyte, x = _scale_of(amax, FMT, MODE)
    bad = tl.expand_dims(amax >= 0x7F800000, 1)
    xb = tl.expand_dims(x, 1)
    codes = _encode_as(b3, xb, bad, FMT, AWAY)
    return codes, sbyte


@triton.jit
def _cols_packed(x_ptr, q_ptr, s_ptr, b, r0, c, cmask, R, C, cols_p, IN_KIND: tl.constexpr, LAYOUT: tl.constexpr,
                 FMT: tl.constexpr, MODE: tl.constexpr, AWAY: tl.constexpr, HW_CVT: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, WIDE: tl.constexpr = False):
    """Columnwise FP4 (blocks along R) with the codes packed into words before the transpose: rows r0 .. r0 +
    BLOCK_R, columns c; J = 8 codes per 32-bit word, or with WIDE 16 per 64-bit word (half the transposed
    elements). The tile is loaded as [W, J, BLOCK_C], element (w, j, c) at row r0 + J * w + j. Triton's load
    layout gives threads to the contiguous dim (c), then to the lower of the equally contiguous dims (w), so a
    tile wide enough to use up the warp's lanes on (c, w) leaves the J codes of a unit in one thread's
    registers: packing needs no exchange, and only the packed words are transposed. Any layout gives the same
    bytes; only the speed depends on it. HW_CVT (bf16 input): the bf16x2 encoder on the bits as loaded. q_ptr:
    int32 words."""
    tl.static_assert(FMT.bits == 4)
    J: tl.constexpr = (64 if WIDE else 32) // 4
    W: tl.constexpr = BLOCK_R // J
    NB: tl.constexpr = BLOCK_R // 32
    rows = r0 + tl.arange(0, W)[:, None, None] * J + tl.arange(0, J)[None, :, None]  # [W, J, 1]
    m = ((rows < R) | (not MASKED)) & cmask[None, None, :]
    raw = _load_raw(x_ptr + (b * R + rows) * C + c[None, None, :], m, IN_KIND)
    if HW_CVT and IN_KIND == IN_BF16_BITS:
        # FP4 through bf16x2 (RAW16): the bf16 bits go to the rounding as loaded; the amax on 16 bits
        bits = raw
        amax = tl.max(tl.reshape(tl.max(raw & 0x7FFF, axis=1), [NB, W // NB, BLOCK_C]), axis=1).to(tl.int32) << 16
    else:
        bits = _to_bits(raw, IN_KIND)
        amax = tl.max(tl.reshape(tl.max(bits & 0x7FFFFFFF, axis=1), [NB, W // NB, BLOCK_C]), axis=1)  # [NB, BC]
    sbyte, x = _scale_of(amax, FMT, MODE)
    xw = tl.reshape(tl.broadcast_to(x[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    badw = tl.reshape(tl.broadcast_to((amax >= 0x7F800000)[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    g = b * C + c  # output rows
    codes = _encode_as(bits, xw[:, None, :], badw[:, None, :], FMT, AWAY, HW_CVT).to(tl.int32)  # [W, J, BC]
    if not HW_CVT:  # (the bf16x2 codes are 4 bits: finite inputs give 0..15, bad blocks 0)
        codes = codes & 0xF
    # disjoint bit fields: the sum over the unit is their OR (the top field may set the sign bit)
    wcol = r0 // J + tl.arange(0, W)
    wm = cmask[:, None] & ((wcol < R // J) | (not MASKED))[None, :]
    if WIDE:
        # two 32-bit halves packed as usual, then joined (64-bit shifts per code cost twice the 32-bit ones)
        kh = tl.arange(0, J // 2)[None, None, :, None]
        halves = tl.sum(tl.reshape(codes, [W, 2, J // 2, BLOCK_C]) << (kh * 4), axis=2)  # [W, 2, BC]
        lo, hi = tl.split(tl.permute(halves, [0, 2, 1]))
        words = (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)  # [W, BC]
        q64 = q_ptr.to(tl.pointer_type(tl.int64))  # (rows of R / 2 bytes, a multiple of 16)
        tl.store(q64 + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    else:
        words = tl.sum(codes << (tl.arange(0, J)[None, :, None] * 4), axis=1)  # [W, BC]
        tl.store(q_ptr + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    _store_scales(s_ptr, tl.trans(sbyte.to(tl.uint8)), g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _cols_units(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, IN_KIND: tl.constexpr, LAYOUT: tl.constexpr,
                FMT: tl.constexpr, MODE: tl.constexpr, AWAY: tl.constexpr, HW_CVT: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_C: tl.constexpr, MASKED: tl.constexpr, UNIT_ASM: tl.constexpr = False, EVICT: tl.constexpr = 0):
    """Columns as packed units (blocks along R): rows r0 .. r0 + BLOCK_R, columns c0 .. c0 + BLOCK_C, loaded as
    [BLOCK_C / VEC, NB, U, VEC, J] with element (l, n, u, v, j) at row r0 + 32n + Ju + j, column
    c0 + VEC * l + v, where J codes make one packed unit (FP6: 16 codes = 3 words; FP8 / MXINT8: 4 = 1 word;
    FP4: 8 = 1 word) and U = 32 / J units make a block; with the FP6 unit asm (UNIT_ASM) as [L, NB, J, U, VEC]
    instead, so the thread's registers run over (v, j, u) as the asm expects. The loads are held to VEC = 2
    elements (4 or 8 bytes; ``tl.max_contiguous``), so the lanes go along the columns and the warps along the
    blocks n: each block, and so each unit, is in one thread, with 32 * VEC elements per thread (COL_PACKED's
    16-byte loads put 8 columns x J rows in a thread for the same). The units' words reach the store through
    one layout conversion of [units, columns(, 4)]: a warp's store runs along the units of one output row
    (FP6: 32 lanes along (word, unit), word 3 repeating word 2 and masked; with BLOCK_R = 128, 96 contiguous
    bytes = 3 whole 32-byte sectors). FP8 with HW_CVT: each unit's word from :func:`~._codecs._fp8_words`.
    EVICT: the tile load's eviction policy (the fused cast-transpose's reload: evict_first). q_ptr: int32 words."""
    BITS: tl.constexpr = FMT.bits
    MBITS: tl.constexpr = FMT.mbits
    VEC: tl.constexpr = 2
    J: tl.constexpr = 16 if BITS == 6 else 32 // BITS
    U: tl.constexpr = 32 // J
    NB: tl.constexpr = BLOCK_R // 32
    L: tl.constexpr = BLOCK_C // VEC
    ASM: tl.constexpr = BITS == 6 and HW_CVT and UNIT_ASM
    jj = tl.arange(0, J)[None, None, :, None, None]
    rows = r0 + tl.arange(0, NB)[None, :, None, None, None] * 32 + jj + tl.arange(0, U)[None, None, None, :, None] * J
    cols = c0 + tl.arange(0, L)[:, None, None, None, None] * VEC + tl.arange(0, VEC)[None, None, None, None, :]
    offs = (b * R + rows) * C + cols  # [L, NB, J, U, VEC]
    m = ((rows < R) | (not MASKED)) & ((cols < C) | (not MASKED))
    if ASM:
        # loaded as [L, NB, J, U, VEC]: the thread's registers run over (v, j, u), v fastest, which the unit asm
        # relies on
        bits = _to_bits(_load_raw(x_ptr + tl.max_contiguous(offs, [1, 1, 1, 1, VEC]), m, IN_KIND, EVICT), IN_KIND)
        amax = tl.max(tl.max(bits & 0x7FFFFFFF, axis=3), axis=2)  # [L, NB, VEC]
    else:
        # loaded as [L, NB, U, VEC, J], the unit's codes last (the per-element encoder then needs 96 registers,
        # not 128)
        offs = tl.max_contiguous(tl.permute(offs, [0, 1, 3, 4, 2]), [1, 1, 1, VEC, 1])
        bits = _to_bits(_load_raw(x_ptr + offs, tl.permute(m, [0, 1, 3, 4, 2]), IN_KIND, EVICT), IN_KIND)
        amax = tl.max(tl.max(bits & 0x7FFFFFFF, axis=4), axis=2)  # [L, NB, VEC]
    sbyte, x = _scale_of(amax, FMT, MODE)
    bad = (amax >= 0x7F800000)[:, :, None, :]  # [L, NB, 1, VEC]
    if ASM:
        tl.static_assert(not AWAY)
        o = _fp6_units_hw(_fp6_asm_input(bits, x[:, :, None, None, :], MBITS), MBITS)
        w0, w1, w2 = _fp6_asm_words(o, jj, bad, 2)  # [L, NB, U, VEC]
    elif BITS == 8 and HW_CVT:
        v = _scaled(bits, x[:, :, None, :, None])  # [L, NB, U, VEC, J]
        badu = tl.broadcast_to(bad.to(tl.int32)[:, :, :, :, None], [L, NB, U, VEC, J])
        words = _fp8_words(tl.reshape(v, [L * NB * U, VEC, J]), tl.reshape(badu, [L * NB * U, VEC, J]),
                           L * NB * U, VEC, MBITS)
        words = tl.reshape(tl.permute(tl.reshape(words, [L, NB, U, VEC]), [1, 2, 0, 3]), [NB * U, BLOCK_C])
    else:
        codes = _encode_as(bits, x[:, :, None, :, None], bad[:, :, :, :, None], FMT, AWAY, HW_CVT).to(tl.int32)
        if BITS == 6:
            w0, w1, w2 = _fp6_unit_words(codes)  # [L, NB, U, VEC]
        else:
            if not (HW_CVT and BITS == 4):  # (the bf16x2 codes are 4 bits: finite inputs give 0..15, bad blocks 0)
                codes = codes & ((1 << BITS) - 1)
            # disjoint bit fields: the sum over the unit is their OR (the top field may set the sign bit)
            words = tl.sum(codes << (tl.arange(0, J) * BITS), axis=4)  # [L, NB, U, VEC]
            words = tl.reshape(tl.permute(words, [1, 2, 0, 3]), [NB * U, BLOCK_C])
    if BITS == 6:
        # [L, NB, U, VEC, 4] (words 0, 1, 2, 2) -> [units, columns, 4]
        w4 = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w2)), [L, NB, U, VEC, 4])
        w4 = tl.reshape(tl.permute(w4, [1, 2, 0, 3, 4]), [NB * U, BLOCK_C, 4])
    unit = r0 // J + tl.arange(0, NB * U)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    if BITS == 6:
        _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED)
    else:
        wm = ((unit < R // J) | (not MASKED))[:, None] & cmask[None, :]
        tl.store(q_ptr + g[None, :] * (R // J) + unit[:, None], words, mask=wm)
    sb = tl.reshape(tl.permute(sbyte, [0, 2, 1]), [BLOCK_C, NB])
    _store_scales(s_ptr, sb, g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "cols_p"])
def _quantize_cols_kernel(
    x_ptr, q_ptr, s_ptr, R, C, tiles_r, tiles_c, cols_p,
    IN_KIND: tl.constexpr, LAYOUT: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr, AWAY: tl.constexpr,
    HW_CVT: tl.constexpr, PAIRS: tl.constexpr, FP6_ASM: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr, MASKED: tl.constexpr, GRID3: tl.constexpr,
):
    """x viewed [B, R, C] (C contiguous) quantized along R -> q [B, C, R packed], s [B, C, R / 32] (the
    transposed copy; scale layout LAYOUT, cols_p its padded width, or for the transposed plain scale its row
    length). One [BLOCK_R, BLOCK_C] tile per program, programs ordered with C fastest; GRID3: a (tiles_c,
    tiles_r, B) launch grid (:func:`~._common._tile_ids`).

    FMT, MODE, AWAY, HW_CVT as in :func:`~._rows._quantize_rows_kernel`. FP4 columns are packed into words
    before the transpose (:func:`_cols_packed`; WIDE: 64-bit words), or with PAIRS (bf16 input, HW_CVT, C even,
    the input address a multiple of 4) read as bf16 pairs of adjacent columns (:func:`_cols_fp4_words`). The
    other formats load 2-element vectors with a warp per 32-row block and pack whole units in-thread
    (:func:`_cols_units`; FP6_ASM, FP6 with HW_CVT: the unit asm)."""
    pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, GRID3)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    r0 = pr * BLOCK_R
    if FMT.bits == 4 and PAIRS:
        _cols_fp4_words(x_ptr, q_ptr, s_ptr, b, r0, pc * BLOCK_C, R, C, cols_p, LAYOUT, FMT, MODE, BLOCK_R, BLOCK_C,
                        MASKED, WIDE)
    elif FMT.bits == 4:
        _cols_packed(x_ptr, q_ptr, s_ptr, b, r0, c, cmask, R, C, cols_p, IN_KIND, LAYOUT, FMT, MODE, AWAY, HW_CVT,
                     BLOCK_R, BLOCK_C, MASKED, WIDE)
    else:
        _cols_units(x_ptr, q_ptr, s_ptr, b, r0, pc * BLOCK_C, R, C, cols_p, IN_KIND, LAYOUT, FMT, MODE, AWAY, HW_CVT,
                    BLOCK_R, BLOCK_C, MASKED, FP6_ASM, 0)
