"""Stores of packed codes and scale bytes (plain, transposed and swizzled scale layouts)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...layouts.aiter_shuffle import _offsets as _aiter_offsets
from ...layouts.nvidia_128x4 import _offsets as _nv128x4_offsets
from ...layouts.plain import _offsets as _plain_offsets
from ._common import LAYOUT_AITER, LAYOUT_NV128X4, LAYOUT_PLAIN, LAYOUT_PLAIN_T, _half_row


@triton.jit
def _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED: tl.constexpr):
    """Store FP6 column units: w4 [units, columns, 4] (words 0, 1, 2 and a copy of word 2, which is masked), unit
    the units' indices along R / 16, g the output rows (columns), cmask their mask; q_ptr: int32 words. The 4th
    word's mask is not constant along the 4, so the store's lanes run along (word, unit): a warp writes
    contiguous pieces of an output row (:func:`_cols_units`, :func:`_cols_fp6_pairs`)."""
    j = tl.arange(0, 4)[None, None, :]
    offs = g[None, :, None] * (R // 16 * 3) + (unit * 3)[:, None, None] + j
    wm = ((unit < R // 16) | (not MASKED))[:, None, None] & cmask[None, :, None] & (j < 3)
    tl.store(q_ptr + offs, w4, mask=wm)


@triton.jit
def _store_group_words(q_ptr, w0, w1, w2, wofs, gm, STORE4: tl.constexpr):
    """Store the three words of each 16-code FP6 group ([G, BLOCK_R] tiles; wofs: word offset of word 0, gm:
    the groups' mask). STORE4 (fp6_store4): one [G, BLOCK_R, 4] store of words 0, 1, 2 and a masked copy of
    word 2 (the mask is not constant along the 4, so the 4 go to 4 lanes, then the groups: a warp's store
    covers contiguous pieces of a row); else three stride-3 word stores."""
    if STORE4:
        w4 = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w2)), [w0.shape[0], w0.shape[1], 4])
        j4 = tl.arange(0, 4)[None, None, :]
        tl.store(q_ptr + wofs[:, :, None] + j4, w4, mask=gm[:, :, None] & (j4 < 3))
    else:
        tl.store(q_ptr + wofs, w0, mask=gm)
        tl.store(q_ptr + wofs + 1, w1, mask=gm)
        tl.store(q_ptr + wofs + 2, w2, mask=gm)


@triton.jit
def _scale_offsets(row, col, ncols, cols_p, LAYOUT: tl.constexpr):
    """Byte offsets of scale (row, col) in a plain (rows, ncols) scale or a swizzled one whose padded
    width is cols_p: each layout's ``offsets`` (:mod:`mxkit.layouts`), the formula the host swizzle uses too."""
    r = row[:, None]
    c = col[None, :]
    if LAYOUT == LAYOUT_PLAIN:
        return _plain_offsets(r, c, ncols)
    elif LAYOUT == LAYOUT_PLAIN_T:  # stored transposed, [ncols, rows] (cols_p: the number of rows)
        return _plain_offsets(c, r, cols_p)
    elif LAYOUT == LAYOUT_NV128X4:
        return _nv128x4_offsets(r, c, cols_p)
    else:
        tl.static_assert(LAYOUT == LAYOUT_AITER)
        return _aiter_offsets(r, c, cols_p)


@triton.jit
def _store_quantized(q_ptr, s_ptr, codes, sbyte, g, gmask, n0, Ltot, cols_p,
                     A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr,
                     MASKED: tl.constexpr):
    """Pack codes [A, N] (rows g, elements n0 .. n0+N of a quantized dim of length Ltot) and store them with
    their scale bytes [A, N // 32]. FP6 goes through an int32 view of qdata (q_ptr points to int32)."""
    cols = n0 + tl.arange(0, N)
    cmask = (cols < Ltot) | (not MASKED)
    if BITS == 8:
        offs = g[:, None] * Ltot + cols[None, :]
        tl.store(q_ptr + offs, codes.to(tl.uint8), mask=gmask[:, None] & cmask[None, :])
    elif BITS == 4:
        # element 2i in the low nibble: disjoint bit fields, so the sum over the pair is their OR
        sh = tl.arange(0, 2) * 4
        packed = tl.sum(tl.reshape(codes, [A, N // 2, 2]) << sh[None, None, :], axis=2)
        bcols = n0 // 2 + tl.arange(0, N // 2)
        offs = g[:, None] * _half_row(Ltot) + bcols[None, :]
        tl.store(q_ptr + offs, packed.to(tl.uint8), mask=gmask[:, None] & ((bcols < Ltot // 2) | (not MASKED))[None, :])
    else:
        tl.static_assert(BITS == 6)
        tl.static_assert(N % 16 == 0)
        # four 6-bit codes -> one 24-bit group a | b<<6 | c<<12 | d<<18 (sum of disjoint fields = OR)
        sh = tl.arange(0, 4) * 6
        grp = tl.sum(tl.reshape(codes, [A, N // 4, 4]) << sh[None, None, :], axis=2)
        # four groups (96 bits, little-endian) -> words j = 0, 1, 2 (j = 3 is not stored): group k sits at
        # bit 24k, so it lands in word j shifted by 24k - 32j (left if >= 0, right otherwise)
        g4 = tl.reshape(grp, [A, N // 16, 1, 4])
        kk = tl.arange(0, 4)[None, :]
        jj = tl.arange(0, 4)[:, None]
        shift = 24 * kk - 32 * jj  # [4 (j), 4 (k)]
        lsh = tl.where((shift >= 0) & (shift < 32), shift, 0)
        rsh = tl.where((shift < 0) & (shift > -24), -shift, 0)
        part = tl.where((shift >= 0) & (shift < 32), g4 << lsh[None, None, :, :],
                        tl.where((shift < 0) & (shift > -24), g4 >> rsh[None, None, :, :], 0))
        words = tl.sum(part, axis=3)  # [A, N // 16, 4]
        wcols = n0 // 16 + tl.arange(0, N // 16)
        offs = (g[:, None, None] * (Ltot // 16 * 3) + wcols[None, :, None] * 3
                + tl.arange(0, 4)[None, None, :])
        m = (gmask[:, None, None] & ((wcols < Ltot // 16) | (not MASKED))[None, :, None]
             & (tl.arange(0, 4) < 3)[None, None, :])
        tl.store(q_ptr + offs, words, mask=m)
    _store_scales(s_ptr, sbyte, g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)


@triton.jit
def _store_scales(s_ptr, sbyte, g, gmask, n0, Ltot, cols_p, N: tl.constexpr, LAYOUT: tl.constexpr,
                  MASKED: tl.constexpr):
    """Scale bytes [A, N // 32] of rows g, blocks n0 // 32 .. of a quantized dim of length Ltot."""
    scols = n0 // 32 + tl.arange(0, N // 32)
    soffs = _scale_offsets(g, scols, Ltot // 32, cols_p, LAYOUT)
    tl.store(s_ptr + soffs, sbyte.to(tl.uint8), mask=gmask[:, None] & ((scols < Ltot // 32) | (not MASKED))[None, :])


@triton.jit
def _store_cols_direct(q_ptr, s_ptr, codes, sbyte, g, gmask, n0, Ltot, cols_p,
                       A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr,
                       MASKED: tl.constexpr):
    """Store FP6 codes [N // 32, 32, A] / scale bytes [N // 32, A] quantized along dim 0 of the raw tile as the
    transposed rows g (A of them) x elements n0 .. n0 + N: only the 1-byte codes are transposed."""
    tl.static_assert(BITS == 6)
    ct = tl.trans(tl.reshape(codes.to(tl.uint8), [N, A]))
    ct = ct.to(tl.int32)
    _store_quantized(q_ptr, s_ptr, ct, tl.trans(sbyte.to(tl.uint8)), g, gmask, n0, Ltot, cols_p,
                     A, N, BITS, LAYOUT, MASKED)
