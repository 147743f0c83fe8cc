"""The dequantize kernels (rowwise and transposed) and their tile helpers."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import OUT_BF16, OUT_F16, OUT_F32, _half_row, _split_pid
from ._codecs import (
    FP4_DEC, FP4_DEC_F16, FP4_DEC_RW, FP6_DEC_E2M3, FP6_DEC_E3M2, FP6_DEC_RW, _decode, _decode_hw, _fp6_codes16,
)


@triton.jit
def _load_codes(q_ptr, g, gmask, n0, Ltot, A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr,
                MASKED: tl.constexpr):
    """Element codes [A, N] (int32) of rows g, elements n0 .. n0+N (inverse of the packing in
    _store_quantized). FP6: q_ptr points to int32 words."""
    if BITS == 8:
        cols = n0 + tl.arange(0, N)
        m = gmask[:, None] & ((cols < Ltot) | (not MASKED))[None, :]
        return tl.load(q_ptr + g[:, None] * Ltot + cols[None, :], mask=m, other=0).to(tl.int32)
    elif BITS == 4:
        bcols = n0 // 2 + tl.arange(0, N // 2)
        m = gmask[:, None] & ((bcols < Ltot // 2) | (not MASKED))[None, :]
        byte = tl.load(q_ptr + g[:, None] * _half_row(Ltot) + bcols[None, :], mask=m, other=0).to(tl.int32)
        sh = tl.arange(0, 2) * 4
        return tl.reshape((byte[:, :, None] >> sh[None, None, :]) & 0xF, [A, N])
    else:
        tl.static_assert(BITS == 6)
        wcols = n0 // 16 + tl.arange(0, N // 16)
        m = gmask[:, None, None] & ((wcols < Ltot // 16) | (not MASKED))[None, :, None] & (tl.arange(0, 4) < 3)[None, None, :]
        offs = (g[:, None, None] * (Ltot // 16 * 3) + wcols[None, :, None] * 3
                + tl.arange(0, 4)[None, None, :])
        w = tl.load(q_ptr + offs, mask=m, other=0).to(tl.uint32, bitcast=True)  # [A, N // 16, 4 (word j)]
        # group k (24 bits at bit 24k of the 96-bit little-endian word triple) = OR over words j of
        # word j shifted (logically) by 32j - 24k, masked to 24 bits
        w4 = tl.reshape(w, [A, N // 16, 1, 4])
        jj = tl.arange(0, 4)[None, :]
        kk = tl.arange(0, 4)[:, None]
        shift = 32 * jj - 24 * kk  # [4 (k), 4 (j)]
        lsh = tl.where((shift >= 0) & (shift < 24), shift, 0).to(tl.uint32)
        rsh = tl.where((shift < 0) & (shift > -32), -shift, 0).to(tl.uint32)
        part = tl.where((shift >= 0) & (shift < 24), w4 << lsh[None, None, :, :],
                        tl.where((shift < 0) & (shift > -32), w4 >> rsh[None, None, :, :], 0))
        grp = (tl.sum(part, axis=3) & 0xFFFFFF).to(tl.int32)  # [A, N // 16, 4 (k)]
        sh = tl.arange(0, 4) * 6
        codes = (grp[:, :, :, None] >> sh[None, None, None, :]) & 0x3F
        return tl.reshape(codes, [A, N])


# the canonical NaN the reference writes (mxkit.reference.CANONICAL_NAN_BITS): bf16 / fp16 bits, and a word of two
NAN_BF16 = tl.constexpr(0x7FC0)
NAN_F16 = tl.constexpr(0x7E00)
NAN_F32 = tl.constexpr(0x7FC00000)


@triton.jit
def _to_out(val, OUT_KIND: tl.constexpr, HW_DEC: tl.constexpr):
    """fp32 -> the stored output: fp32, bf16 bits (int16) or fp16, each with round-to-nearest-even; every NaN
    the canonical one of the output dtype (selected on the bits: the GPU's arithmetic writes its own NaN)."""
    if OUT_KIND == OUT_F32:
        return tl.where(val != val, NAN_F32, val.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    elif OUT_KIND == OUT_BF16:
        if HW_DEC:  # cvt.rn.bf16.f32 (RNE, subnormals kept)
            return tl.where(val != val, NAN_BF16, val.to(tl.bfloat16).to(tl.int16, bitcast=True)).to(tl.int16)
        # fp32 -> bf16 round to nearest even on the bits (exact for denormals too)
        u = val.to(tl.int32, bitcast=True)
        rb = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        return tl.where(val != val, NAN_BF16, rb).to(tl.int16)
    else:
        h = val.to(tl.float16).to(tl.int16, bitcast=True)
        return tl.where(val != val, NAN_F16, h).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _nan_words(o, sb, OUT_KIND: tl.constexpr):
    """A word of two 16-bit outputs from an asm decode, both set to the canonical NaN where the block's scale
    byte ``sb`` is 0xFF (FP4 and FP6 have no NaN codes: their only NaNs)."""
    nan: tl.constexpr = NAN_BF16 if OUT_KIND == OUT_BF16 else NAN_F16
    return tl.where(sb == 255, nan | (nan << 16), o)


@triton.jit
def _shfl_xor1(v):
    """Each lane gets the value of the same register in lane ^ 1 (``shfl.sync.bfly.b32``, all 32 lanes; GPU only:
    inline asm). 16-bit values travel two per 32-bit register."""
    if v.dtype.primitive_bitwidth == 16:
        return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r", [v], dtype=v.dtype,
                                         is_pure=False, pack=2)
    else:
        tl.static_assert(v.dtype.primitive_bitwidth == 32)
        return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r", [v], dtype=v.dtype,
                                         is_pure=False, pack=1)


@triton.jit
def _dequant_fp6_words(q_ptr, s_ptr, out_ptr, g, nmask, pl, L, OUT_KIND: tl.constexpr, FMT: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, MASKED: tl.constexpr, HW_DEC: tl.constexpr,
                       SWAP: tl.constexpr = False, GROUP_ASM: tl.constexpr = False):
    """Rowwise FP6 dequantize: each thread loads the 3 words of one 16-code group (three strided
    word loads over a [groups, rows] tile: equal contiguity, so Triton's coalescing puts lanes along the groups,
    the lower dim) and unpacks, decodes and stores its 16 elements itself (two 8-element stores whose pointer
    tiles have the layout the values already have): no shared-memory exchange. q_ptr: int32 words.
    GROUP_ASM (bf16 output, HW_DEC): the whole group in one inline asm (_fp6_group_decode_asm), whose bf16
    pairs are stored as 32-bit words; the same bytes as the per-element path."""
    G: tl.constexpr = BLOCK_L // 16
    gi = pl * G + tl.arange(0, G)  # group index along L (16 elements each)
    m2 = ((gi < L // 16) | (not MASKED))[:, None] & nmask[None, :]  # [G, BLOCK_N]
    wofs = g[None, :] * (L // 16 * 3) + gi[:, None] * 3
    w0 = tl.load(q_ptr + wofs, mask=m2, other=0)
    w1 = tl.load(q_ptr + wofs + 1, mask=m2, other=0)
    w2 = tl.load(q_ptr + wofs + 2, mask=m2, other=0)
    sb = tl.load(s_ptr + g[None, :] * (L // 32) + (gi // 2)[:, None], mask=m2, other=0).to(tl.int32)
    if GROUP_ASM:
        tl.static_assert(HW_DEC and OUT_KIND == OUT_BF16)
        fac = tl.where(sb == 0, 0x00400000, tl.where(sb == 255, 0x7FC00000, sb << 23)).to(tl.float32, bitcast=True)
        o = tl.inline_asm_elementwise(FP6_DEC_E2M3 if FMT.mbits == 3 else FP6_DEC_E3M2, FP6_DEC_RW, [w0, w1, w2, fac],
                                      dtype=(tl.int32, ) * 8, is_pure=True, pack=1)
        # bf16 pairs as words: elements 0-7 = words 0-3, 8-15 = words 4-7 (the stores below count in words)
        o0, o1, o2, o3 = _nan_words(o[0], sb, OUT_KIND), _nan_words(o[1], sb, OUT_KIND), \
            _nan_words(o[2], sb, OUT_KIND), _nan_words(o[3], sb, OUT_KIND)
        o4, o5, o6, o7 = _nan_words(o[4], sb, OUT_KIND), _nan_words(o[5], sb, OUT_KIND), \
            _nan_words(o[6], sb, OUT_KIND), _nan_words(o[7], sb, OUT_KIND)
        lo = tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), [G, BLOCK_N, 4])
        hi = tl.reshape(tl.join(tl.join(o4, o6), tl.join(o5, o7)), [G, BLOCK_N, 4])
        out_ptr = out_ptr.to(tl.pointer_type(tl.int32))
        H: tl.constexpr = 4  # a half group in stored units
        offs = g[None, :, None] * (L // 2) + (gi * 8)[:, None, None] + tl.arange(0, 4)[None, None, :]
    else:
        codes = _fp6_codes16(w0, w1, w2)  # [G, BLOCK_N, 16]
        if HW_DEC:
            val = _decode_hw(codes, sb[:, :, None], 6, FMT.mbits)
        else:
            val = _decode(codes, sb[:, :, None], FMT)
        out = _to_out(val, OUT_KIND, HW_DEC)
        lo, hi = tl.split(tl.permute(tl.reshape(out, [G, BLOCK_N, 2, 8]), [0, 1, 3, 2]))  # elements 0-7, 8-15
        H: tl.constexpr = 8
        offs = g[None, :, None] * L + (gi * 16)[:, None, None] + tl.arange(0, 8)[None, None, :]
    mm = m2[:, :, None]
    if SWAP:
        # Stored as above, each instruction writes half of every 32-byte sector it touches (16 bytes per lane,
        # lanes 32 bytes apart). Lanes holding groups 2k and 2k + 1 of a row swap one half (shfl.bfly 1), so
        # each instruction writes whole sectors: lane 2k lo(2k) next to lane 2k + 1 hi(2k), then lo(2k + 1)
        # next to hi(2k + 1). The partner is checked with a key exchanged the same way (one flag per group and
        # row, so the 8-element stores stay vectorised; a lane holding part of a row's group also holds it in
        # this [G, BLOCK_N] key, so a split of the 8 elements over lanes fails the check too). Where the partner
        # is not group gi ^ 1 of the same row (small tiles: fewer (group, row) pairs than threads), the lane
        # stores its own halves as without SWAP. 16-bit outputs only (the launcher): an fp32 half is a whole
        # sector already.
        nn = tl.arange(0, BLOCK_N)[None, :]
        key = gi[:, None] * BLOCK_N + nn + w0 * 0  # w0's layout: the slice the 3-D tiles broadcast from
        ok = (_shfl_xor1(key) == (gi ^ 1)[:, None] * BLOCK_N + nn)[:, :, None]
        even = (gi % 2 == 0)[:, None, None]
        recv = _shfl_xor1(tl.where(even, hi, lo))
        pair = offs - (gi % 2)[:, None, None] * H  # lo(2k), hi(2k) | lo(2k + 1), hi(2k + 1) at + a group
        # where the check fails, the same two stores write the lane's own halves (selects, not more stores)
        tl.store(out_ptr + tl.where(ok, pair, offs), tl.where(ok, tl.where(even, lo, recv), lo), mask=mm)
        tl.store(out_ptr + tl.where(ok, pair + 2 * H, offs + H), tl.where(ok, tl.where(even, recv, hi), hi), mask=mm)
    else:
        tl.store(out_ptr + offs, lo, mask=mm)
        tl.store(out_ptr + offs + H, hi, mask=mm)


@triton.jit(do_not_specialize=["tiles_n", "tiles_l", "row_words"])
def _dequantize_rows_kernel(
    q_ptr, s_ptr, out_ptr, N, L, tiles_n, tiles_l, row_words,
    OUT_KIND: tl.constexpr, FMT: tl.constexpr, HW_DEC: tl.constexpr, SWAP: tl.constexpr, GROUP_ASM: tl.constexpr,
    FP4_ASM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, INT64: tl.constexpr, MASKED: tl.constexpr,
):
    """qdata [N, L packed] of format FMT (:class:`~._common.ElementSpec`), scale [N, L / 32] -> out [N, L] in
    OUT_KIND (fp32, bf16 bits or fp16, RNE), one [BLOCK_N, BLOCK_L] tile per program, L fastest.
    HW_DEC (floats, GPU only): decode through the hardware FP8 -> fp16 cvt and one scale multiply
    (:func:`~._codecs._decode_hw`). FP6: whole 16-code groups per thread (:func:`_dequant_fp6_words`; SWAP, GPU
    only: lane pairs exchange halves so stores write whole sectors; GROUP_ASM, bf16 with HW_DEC: one asm per
    group). FP8 / FP4: codes and output addressed directly as [BLOCK_N, BLOCK_L // 32, 32] tiles (the scale
    broadcasts along the fastest axis, no reshapes); FP4_ASM (FP4 to bf16 / fp16 with HW_DEC): q_ptr points to
    int32 words of 8 codes, each decoded straight to four bf16 / fp16 pairs by one inline asm
    (:func:`~._codecs._fp4_word_decode_asm`), stored as int32 words; row_words = L / 8 (passed for every
    format; only FP4_ASM reads it). MXINT8: 2-D tiles."""
    BITS: tl.constexpr = FMT.bits
    pid = tl.program_id(0)
    if INT64:  # every index derived from pid is then 64-bit
        pid = pid.to(tl.int64)
    pl, pn, b = _split_pid(pid, tiles_l, tiles_n)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = (n < N) | (not MASKED)
    g = b * N + n
    if BITS == 6:
        _dequant_fp6_words(q_ptr, s_ptr, out_ptr, g, nmask, pl, L, OUT_KIND, FMT, BLOCK_N, BLOCK_L, MASKED, HW_DEC,
                           SWAP, GROUP_ASM)
    elif FP4_ASM:
        # One word (8 codes) per lane and per load: row_words (L / 8, a runtime int Triton does not specialise)
        # hides the rows' 8- / 16-byte alignment, so Triton's coalescing keeps one word per thread, lanes along
        # the row, and each lane's 16 output bytes sit next to its neighbours' (a warp's store: 512 contiguous
        # bytes, whole sectors, no layout conversion; with 2- or 4-word loads the 32- / 64-byte outputs per
        # thread went through shared memory to be stored)
        tl.static_assert(BITS == 4 and (OUT_KIND == OUT_BF16 or OUT_KIND == OUT_F16))
        W: tl.constexpr = BLOCK_L // 8
        wi = pl * W + tl.arange(0, W)
        m2 = nmask[:, None] & ((wi < L // 8) | (not MASKED))[None, :]
        w = tl.load(q_ptr + g[:, None] * row_words + wi[None, :], mask=m2, other=0)
        sb = tl.load(s_ptr + g[:, None] * (L // 32) + (wi // 4)[None, :], mask=m2, other=0).to(tl.int32)
        fac = tl.where(sb == 0, 0x0040, tl.where(sb == 255, 0x7FC0, sb << 7))  # 2^(s - 127) as bf16 bits
        o = tl.inline_asm_elementwise(FP4_DEC if OUT_KIND == OUT_BF16 else FP4_DEC_F16, FP4_DEC_RW,
                                      [w, fac | (fac << 16)], dtype=(tl.int32, ) * 4, is_pure=True, pack=1)
        o0, o1, o2, o3 = _nan_words(o[0], sb, OUT_KIND), _nan_words(o[1], sb, OUT_KIND), \
            _nan_words(o[2], sb, OUT_KIND), _nan_words(o[3], sb, OUT_KIND)
        # word j of a row -> output words 4j .. 4j + 3 (bf16 / fp16 pairs)
        out = tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), [BLOCK_N, 4 * W])
        o4 = pl * (4 * W) + tl.arange(0, 4 * W)
        tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + g[:, None] * (row_words * 4) + o4[None, :], out,
                 mask=nmask[:, None] & ((o4 < L // 2) | (not MASKED))[None, :])
    elif not FMT.is_int:  # FP8 / FP4: [BLOCK_N, BLOCK_L // 32, 32] tiles
        scols = pl * (BLOCK_L // 32) + tl.arange(0, BLOCK_L // 32)
        smask = nmask[:, None] & ((scols < L // 32) | (not MASKED))[None, :]
        sbyte = tl.load(s_ptr + g[:, None] * (L // 32) + scols[None, :], mask=smask, other=0).to(tl.int32)
        l3 = pl * BLOCK_L + tl.arange(0, BLOCK_L // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        m3 = nmask[:, None, None] & ((l3 < L) | (not MASKED))
        if BITS == 8:
            c3 = tl.load(q_ptr + g[:, None, None] * L + l3, mask=m3, other=0).to(tl.int32)
        else:
            b3 = (pl * BLOCK_L // 2 + tl.arange(0, BLOCK_L // 32)[None, :, None] * 16
                  + tl.arange(0, 16)[None, None, :])
            byte = tl.load(q_ptr + g[:, None, None] * _half_row(L) + b3,
                           mask=nmask[:, None, None] & ((b3 < L // 2) | (not MASKED)), other=0).to(tl.int32)
            sh = tl.arange(0, 2) * 4
            c3 = tl.reshape((byte[:, :, :, None] >> sh[None, None, None, :]) & 0xF, [BLOCK_N, BLOCK_L // 32, 32])
        if HW_DEC:
            val = _decode_hw(c3, tl.expand_dims(sbyte, 2), BITS, FMT.mbits)
        else:
            val = _decode(c3, tl.expand_dims(sbyte, 2), FMT)
        tl.store(out_ptr + g[:, None, None] * L + l3, _to_out(val, OUT_KIND, HW_DEC), mask=m3)
    else:  # MXINT8: 2-D tiles
        codes = _load_codes(q_ptr, g, nmask, pl * BLOCK_L, L, BLOCK_N, BLOCK_L, BITS, MASKED)
        scols = pl * (BLOCK_L // 32) + tl.arange(0, BLOCK_L // 32)
        smask = nmask[:, None] & ((scols < L // 32) | (not MASKED))[None, :]
        sbyte = tl.load(s_ptr + g[:, None] * (L // 32) + scols[None, :], mask=smask, other=0).to(tl.int32)
        c3 = tl.reshape(codes, [BLOCK_N, BLOCK_L // 32, 32])
        val = _decode(c3, tl.expand_dims(sbyte, 2), FMT)
        out = _to_out(tl.reshape(val, [BLOCK_N, BLOCK_L]), OUT_KIND, HW_DEC)
        l = pl * BLOCK_L + tl.arange(0, BLOCK_L)
        lmask = (l < L) | (not MASKED)
        offs = g[:, None] * L + l[None, :]
        tl.store(out_ptr + offs, out, mask=nmask[:, None] & lmask[None, :])


@triton.jit(do_not_specialize=["tiles_n", "tiles_l"])
def _dequantize_cols_kernel(
    q_ptr, s_ptr, out_ptr, N, L, tiles_n, tiles_l,
    OUT_KIND: tl.constexpr, FMT: tl.constexpr, HW_DEC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    INT64: tl.constexpr, MASKED: tl.constexpr,
):
    """qdata viewed [B, N, L packed], scale [B, N, L / 32] -> out [B, L, N]: the quantized axis goes back in front
    of the N trailing elements. One [BLOCK_N, BLOCK_L] tile per program, neighbouring programs writing
    neighbouring output columns; the tile is decoded as loaded and stored transposed. FMT, OUT_KIND, HW_DEC as in
    :func:`_dequantize_rows_kernel`."""
    BITS: tl.constexpr = FMT.bits
    pid = tl.program_id(0)
    if INT64:  # every index derived from pid is then 64-bit
        pid = pid.to(tl.int64)
    pn, pl, b = _split_pid(pid, tiles_n, tiles_l)  # neighbouring programs write neighbouring output columns
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = (n < N) | (not MASKED)
    g = b * N + n
    codes = _load_codes(q_ptr, g, nmask, pl * BLOCK_L, L, BLOCK_N, BLOCK_L, BITS, MASKED)
    scols = pl * (BLOCK_L // 32) + tl.arange(0, BLOCK_L // 32)
    smask = nmask[:, None] & ((scols < L // 32) | (not MASKED))[None, :]
    sbyte = tl.load(s_ptr + g[:, None] * (L // 32) + scols[None, :], mask=smask, other=0).to(tl.int32)
    c3 = tl.reshape(codes, [BLOCK_N, BLOCK_L // 32, 32])
    if HW_DEC:
        val = _decode_hw(c3, tl.expand_dims(sbyte, 2), BITS, FMT.mbits)
    else:
        val = _decode(c3, tl.expand_dims(sbyte, 2), FMT)
    out = _to_out(tl.reshape(val, [BLOCK_N, BLOCK_L]), OUT_KIND, HW_DEC)
    l = pl * BLOCK_L + tl.arange(0, BLOCK_L)
    lmask = (l < L) | (not MASKED)
    offs = (b * L + l)[:, None] * N + n[None, :]
    tl.store(out_ptr + offs, tl.trans(out), mask=lmask[:, None] & nmask[None, :])
