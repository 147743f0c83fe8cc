"""Rowwise quantize (blocks of 32 along the contiguous dim): the row tiles and the rowwise kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (
    IN_BF16_BITS, IN_F32_BITS, _block_absmax, _half_row, _hmax_abs, _load_raw, _split4, _tile_ids, _to_bits,
)
from ._codecs import (
    FP6_HALVES_E2M3, FP6_HALVES_E3M2, FP6_HALVES_RW, FP6_PAIRS_ROWS_E2M3, FP6_PAIRS_ROWS_E3M2,
    FP6_PAIRS_ROWS_RW, _encode_as, _fp4_bf16x2_pairs, _fp6_asm_input, _fp6_asm_words, _fp6_unit_words,
)
from ._scale import _fp6_pairs_factor, _scale_of
from ._store import _store_group_words, _store_quantized, _store_scales


@triton.jit
def _rows_fp4_pairs(x_ptr, q_ptr, s_ptr, g, gmask, n0, Ltot, cols_p, LAYOUT: tl.constexpr, FMT: tl.constexpr,
                    MODE: tl.constexpr, A: tl.constexpr, N: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr = 0, BLOCKS_OUTER: tl.constexpr = False):
    """Rowwise FP4 from bf16 (PAIRS with the hardware convert; GPU only): rows g, elements n0 .. n0 + N, loaded as 32-bit words (bf16
    pairs: x_ptr is the int32 view of the input), rounded pair-wise straight into the packed bytes
    (:func:`_fp4_bf16x2_pairs`; the per-element path unpacked its codes to shift and OR them back together).
    Each thread holds the 16 words of a block. The tile is [A, N / 32, 16], or with BLOCKS_OUTER [N / 32, A,
    16]: Triton puts the lanes along the lowest dim first, so on tall tiles (the fused cast-transpose's) the
    first form gives every lane its own row and each store a half sector per lane, the second neighbouring
    blocks of a row to neighbouring lanes (fewer partial L2 store sectors on the fused cast-transpose's tall
    tiles). EVICT: the load's eviction policy (:func:`_load_raw`; the fused cast-transpose's evict_last)."""
    if BLOCKS_OUTER:
        wc = n0 // 2 + tl.arange(0, N // 32)[:, None, None] * 16 + tl.arange(0, 16)[None, None, :]  # [N / 32, 1, 16]
        m = gmask[None, :, None] & ((wc < Ltot // 2) | (not MASKED))
        offs = g[None, :, None] * _half_row(Ltot) + wc  # [N / 32, A, 16]
    else:
        wc = n0 // 2 + tl.arange(0, N // 32)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, N / 32, 16]
        m = gmask[:, None, None] & ((wc < Ltot // 2) | (not MASKED))
        offs = g[:, None, None] * _half_row(Ltot) + wc  # [A, N / 32, 16]
    xw = _load_raw(x_ptr + offs, m, IN_F32_BITS, EVICT)
    am = _block_absmax(xw, 2)  # |x| of both halves, the block's max in each half
    amax = tl.maximum(am & 0xFFFF, (am >> 16) & 0xFFFF) << 16  # the fp32 bits of the bf16 amax of each block
    sbyte, x = _scale_of(amax, FMT, MODE)
    f = (127 - x) << 7
    fw = tl.broadcast_to((f | (f << 16))[:, :, None], xw.shape)
    keep = tl.broadcast_to(tl.where(amax >= 0x7F800000, 0, -1)[:, :, None], xw.shape)
    packed = _fp4_bf16x2_pairs(xw, fw, keep)
    tl.store(q_ptr + offs, packed, mask=m)
    _store_scales(s_ptr, tl.trans(sbyte) if BLOCKS_OUTER else sbyte, g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)


@triton.jit
def _rows_fp6_pairs(x_ptr, q_ptr, s_ptr, grow, rmask, c0, C, cols_p, LAYOUT: tl.constexpr, FMT: tl.constexpr,
                    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr = 0, STORE4: tl.constexpr = False):
    """Rowwise FP6 from bf16 pairs (PAIRS; GPU only; the input address a multiple of 4): rows grow, elements
    c0 .. c0 + BLOCK_C read as 32-bit words (x_ptr: the input's int32 view), two [G, BLOCK_R, 4] word tiles
    per 16-element group (16-byte loads; lanes along the groups first as in :func:`_rows_fp6_words`). The
    block amax on the pairs (:func:`_hmax_abs`), then one asm per group (:func:`_fp6_pairs_asm`: clamp, scale,
    round, pack, mask), elementwise over eight [G, BLOCK_R] word tiles, so any layout gives the same bytes;
    the per-block operands reach the groups by a broadcast (a join / permute / reshape gave them a layout
    with two lanes per group, and Triton ran the asm in that layout: twice the work). Stores as
    :func:`_rows_fp6_words` (STORE4: one [G, BLOCK_R, 4] store). q_ptr: int32 words."""
    G: tl.constexpr = BLOCK_C // 16
    gi = c0 // 16 + tl.arange(0, G)
    gm = ((gi < C // 16) | (not MASKED))[:, None] & rmask[None, :]  # [G, BLOCK_R]
    e = tl.arange(0, 4)[None, None, :]
    wp = x_ptr + (grow[None, :] * (C // 2) + (gi * 8)[:, None])[:, :, None] + e
    xl = _load_raw(wp, gm[:, :, None], IN_F32_BITS, EVICT)  # [G, BLOCK_R, 4]: words 0-3 of each group (16 bytes)
    xh = _load_raw(wp + 4, gm[:, :, None], IN_F32_BITS, EVICT)  # words 4-7
    gmax = _block_absmax(_hmax_abs(xl, xh), 2)  # [G, BLOCK_R]: each group's max |x| in each half
    bm = tl.reduce(tl.reshape(gmax, [G // 2, 2, BLOCK_R]), 1, _hmax_abs)  # blocks: [G // 2, BLOCK_R]
    amax = tl.maximum(bm & 0xFFFF, bm >> 16) << 16  # fp32 bits of the bf16 amax
    sbyte, X = _scale_of(amax, FMT, MODE)
    fac, clamp = _fp6_pairs_factor(X, FMT.mbits, FMT.emax, FMT.max_frac)
    keep = tl.where(amax >= 0x7F800000, 0, -1)
    # back to groups (group gi takes block gi // 2) by a broadcast, which keeps the groups' layout (a join /
    # permute / reshape gave a layout with two lanes per group, and Triton ran the asm on that: 2x the work)
    facg = tl.reshape(tl.broadcast_to(fac[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    clampg = tl.reshape(tl.broadcast_to(clamp[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    keepg = tl.reshape(tl.broadcast_to(keep[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    x0, x1, x2, x3 = _split4(xl, G, BLOCK_R)
    x4, x5, x6, x7 = _split4(xh, G, BLOCK_R)
    w0, w1, w2 = tl.inline_asm_elementwise(
        FP6_PAIRS_ROWS_E2M3 if FMT.mbits == 3 else FP6_PAIRS_ROWS_E3M2, FP6_PAIRS_ROWS_RW,
        [x0, x1, x2, x3, x4, x5, x6, x7, facg, clampg | (clampg << 16), keepg], dtype=(tl.int32, tl.int32, tl.int32),
        is_pure=True, pack=1)
    _store_group_words(q_ptr, w0, w1, w2, grow[None, :] * (C // 16 * 3) + gi[:, None] * 3, gm, STORE4)
    _store_scales(s_ptr, tl.trans(sbyte), grow, rmask, c0, C, cols_p, BLOCK_C, LAYOUT, MASKED)


@triton.jit
def _quantize_rows(xbits, BR: tl.constexpr, BC: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
                   AWAY: tl.constexpr, HW_CVT: tl.constexpr = False, RAW16: tl.constexpr = False,
                   KEEP_ASM: tl.constexpr = False):
    """[BR, BC] fp32 bits, blocks of 32 along the last dim -> (codes [BR, BC], scale bytes [BR, BC // 32]).
    RAW16 (FP4 through bf16x2 only): xbits are the bf16 bits themselves (int16). KEEP_ASM: see
    :func:`~._codecs._encode`."""
    tl.static_assert(BC % 32 == 0)
    b3 = tl.reshape(xbits, [BR, BC // 32, 32])
    if RAW16:
        tl.static_assert(HW_CVT and FMT.bits == 4)
        amax = tl.max(b3 & 0x7FFF, axis=2).to(tl.int32) << 16  # the fp32 bits of the bf16 amax
    else:
        amax = tl.max(b3 & 0x7FFFFFFF, axis=2)
    sbyte, x = _scale_of(amax, FMT, MODE)
    bad = tl.expand_dims(amax >= 0x7F800000, 2)
    xb = tl.expand_dims(x, 2)
    codes = _encode_as(b3, xb, bad, FMT, AWAY, HW_CVT, KEEP_ASM)
    codes = tl.reshape(codes, [BR, BC])
    return codes, sbyte


@triton.jit
def _rows_fp6_words(x_ptr, q_ptr, s_ptr, grow, rmask, c0, C, cols_p, IN_KIND: tl.constexpr, LAYOUT: tl.constexpr,
                    FMT: tl.constexpr, MODE: tl.constexpr, AWAY: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr, MASKED: tl.constexpr, HW_CVT: tl.constexpr = False,
                    UNIT_ASM: tl.constexpr = False, EVICT: tl.constexpr = 0, STORE4: tl.constexpr = False):
    """Rowwise FP6 quantize: rows grow, elements c0 .. c0 + BLOCK_C, with each thread holding whole
    16-element groups (two 8-element loads over a [groups, rows, 8] tile: lanes go along the groups, the lower
    of the equally contiguous dims), so the 4-codes-in-3-bytes pack needs no exchange: the thread writes its
    group's 3 words itself (three strided word stores, or with STORE4 one [groups, rows, 4] store:
    :func:`~._store._store_group_words`). A 32-element block is two neighbouring lanes (one shuffle for the amax).
    UNIT_ASM (with HW_CVT): each half group through the unit asm (:func:`~._codecs._fp6_units_asm`). q_ptr: int32
    words. EVICT: the loads' eviction policy (the fused cast-transpose's evict_last)."""
    G: tl.constexpr = BLOCK_C // 16
    gi = c0 // 16 + tl.arange(0, G)
    gm = ((gi < C // 16) | (not MASKED))[:, None] & rmask[None, :]  # [G, BLOCK_R]
    base = grow[None, :] * C + (gi * 16)[:, None]
    e = tl.arange(0, 8)[None, None, :]
    lo = _to_bits(_load_raw(x_ptr + base[:, :, None] + e, gm[:, :, None], IN_KIND, EVICT), IN_KIND)
    hi = _to_bits(_load_raw(x_ptr + base[:, :, None] + 8 + e, gm[:, :, None], IN_KIND, EVICT), IN_KIND)
    gmax = tl.maximum(tl.max(lo & 0x7FFFFFFF, axis=2), tl.max(hi & 0x7FFFFFFF, axis=2))  # [G, BLOCK_R]
    amax = tl.max(tl.reshape(gmax, [G // 2, 2, BLOCK_R]), axis=1)  # blocks of 32: [G // 2, BLOCK_R]
    sbyte, x = _scale_of(amax, FMT, MODE)
    # back to groups: group gi takes block gi // 2
    xg = tl.reshape(tl.permute(tl.join(x, x), [0, 2, 1]), [G, BLOCK_R])
    badg = tl.reshape(tl.permute(tl.join(amax, amax), [0, 2, 1]), [G, BLOCK_R]) >= 0x7F800000
    if UNIT_ASM:
        # the unit asm on the two halves as loaded (8 consecutive registers each; no clamp, see _cols_units)
        tl.static_assert(HW_CVT and not AWAY)
        vlo = _fp6_asm_input(lo, xg[:, :, None], FMT.mbits)
        vhi = _fp6_asm_input(hi, xg[:, :, None], FMT.mbits)
        o = tl.inline_asm_elementwise(FP6_HALVES_E2M3 if FMT.mbits == 3 else FP6_HALVES_E3M2, FP6_HALVES_RW, [vlo, vhi],
                                      dtype=tl.int32, is_pure=True, pack=8)
        w0, w1, w2 = _fp6_asm_words(o, e, badg, 2)
    else:
        bits = tl.reshape(tl.permute(tl.join(lo, hi), [0, 1, 3, 2]), [G, BLOCK_R, 16])  # element h * 8 + e
        tl.static_assert(FMT.bits == 6)
        codes = _encode_as(bits, xg[:, :, None], badg[:, :, None], FMT, AWAY, HW_CVT).to(tl.int32)  # [G, BLOCK_R, 16]
        w0, w1, w2 = _fp6_unit_words(codes)
    _store_group_words(q_ptr, w0, w1, w2, grow[None, :] * (C // 16 * 3) + gi[:, None] * 3, gm, STORE4)
    _store_scales(s_ptr, tl.trans(sbyte), grow, rmask, c0, C, cols_p, BLOCK_C, LAYOUT, MASKED)


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "cols_p"])
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, R, C, tiles_r, tiles_c, cols_p,
    IN_KIND: tl.constexpr, LAYOUT: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr, AWAY: tl.constexpr,
    HW_CVT: tl.constexpr, PAIRS: tl.constexpr, FP6_ASM: tl.constexpr, FP6_ST4: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, RB: tl.constexpr, INT64: tl.constexpr, MASKED: tl.constexpr,
):
    """x viewed [R, C] (C contiguous) quantized along C -> q [R, C packed], s [R, C / 32] in scale layout LAYOUT
    (cols_p: the swizzled layouts' padded width). One [BLOCK_R, BLOCK_C] tile per step, RB steps down R per
    program (a real loop: unrolled, it spilled registers); programs ordered with C fastest.

    FMT: the element format (:class:`~._common.ElementSpec`); MODE: the scale rule; AWAY: ties away from zero
    (else RNE). HW_CVT: the hardware convert (GPU only; FP8: the bad-block mask inside the cvt asm,
    :func:`~._codecs._cvt_fp8_rn_keep`; FP4 from bf16: bf16x2 arithmetic). FP6 rows always hold whole 16-element
    groups per thread (:func:`_rows_fp6_words`; FP6_ASM: the unit asm, FP6_ST4: the [groups, rows, 4] word
    store). PAIRS (bf16 input, HW_CVT, the input address a multiple of 4): the row read as bf16 pairs (32-bit
    words), FP4 by :func:`_rows_fp4_pairs`, FP6 by :func:`_rows_fp6_pairs`."""
    pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, False)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    # FP4 through bf16x2 (HW_CVT, bf16 inputs only): the quantizer takes the bf16 bits as loaded
    RAW16: tl.constexpr = HW_CVT and FMT.bits == 4 and IN_KIND == IN_BF16_BITS
    for i in tl.range(0, RB, num_stages=1):
        r0 = (pr * RB + i) * BLOCK_R
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = (r < R) | (not MASKED)
        grow = b * R + r
        if FMT.bits == 6 and PAIRS:
            _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), q_ptr, s_ptr, grow, rmask, pc * BLOCK_C, C, cols_p,
                            LAYOUT, FMT, MODE, BLOCK_R, BLOCK_C, MASKED, 0, FP6_ST4)
        elif FMT.bits == 6:
            _rows_fp6_words(x_ptr, q_ptr, s_ptr, grow, rmask, pc * BLOCK_C, C, cols_p, IN_KIND, LAYOUT, FMT, MODE,
                            AWAY, BLOCK_R, BLOCK_C, MASKED, HW_CVT, FP6_ASM, 0, FP6_ST4)
        elif FMT.bits == 4 and PAIRS:
            tl.static_assert(RAW16)
            _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), q_ptr, s_ptr, grow, rmask, pc * BLOCK_C, C, cols_p,
                            LAYOUT, FMT, MODE, BLOCK_R, BLOCK_C, MASKED, 0, False)
        else:
            raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :], rmask[:, None] & cmask[None, :], IN_KIND, 0)
            codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, FMT, MODE, AWAY,
                                          HW_CVT, RAW16, HW_CVT and FMT.bits == 8)
            _store_quantized(q_ptr, s_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, cols_p, BLOCK_R, BLOCK_C,
                             FMT.bits, LAYOUT, MASKED)
