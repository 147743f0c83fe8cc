"""The quantize kernel: rowwise, columnwise and the fused cast-transpose from one [BLOCK_R, BLOCK_C] tile per
program."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import EVICT_FIRST, EVICT_LAST, IN_BF16_BITS, _load_raw, _tile_ids, _to_bits
from ._store import _store_cols_direct, _store_quantized
from ._rows import _quantize_rows, _rows_fp4_pairs, _rows_fp6_pairs, _rows_fp6_words
from ._cols import _cols_fp4_units, _cols_fp4_words, _cols_fp6_pairs, _cols_packed, _cols_units, _quantize_cols


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "colsp_r", "colsp_c", "scale_mode"])
def _quantize_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
    R, C, tiles_r, tiles_c, colsp_r, colsp_c, scale_mode,
    IN_KIND: tl.constexpr, DO_ROW: tl.constexpr, DO_COL: tl.constexpr,
    LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
    AWAY: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
    MASKED: tl.constexpr, HW_CVT: tl.constexpr = False,
    COL_DIRECT: tl.constexpr = False, GROUP_C: tl.constexpr = 0, RB: tl.constexpr = 1,
    SCALE_MODE: tl.constexpr = -1, FP6_WORDS: tl.constexpr = False,
    COL_PACKED: tl.constexpr = False, FP4_PAIRS: tl.constexpr = False,
    COL_WIDE: tl.constexpr = False, COL_UNITS: tl.constexpr = 0, FP6_ASM: tl.constexpr = False,
    COL_FP4W: tl.constexpr = False, FP8_WORDS: tl.constexpr = False, CT_EVICT: tl.constexpr = 0,
    FP6_ST4: tl.constexpr = False, FP6P_R: tl.constexpr = False, FP6P_C: tl.constexpr = False,
    GRID3: tl.constexpr = False,
):
    """x viewed [B, R, C] (C contiguous), one [BLOCK_R, BLOCK_C] tile per program.

    DO_ROW: quantize along C -> qr [B, R, C packed], sr [B, R, C / 32] (or 128x4 over rows B*R).
    DO_COL: quantize along R -> qc [B, C, R packed], sc [B, C, R / 32] (the transposed copy).
    Both from the same load: that is the fused cast-transpose.
    HW_CVT: FP8 (RNE) elements through the hardware cvt (GPU only). COL_DIRECT:
    quantize along dim 0 of the raw tile and transpose only the 1-byte codes (not the raw input).
    GROUP_C > 0: programs ordered in strips of GROUP_C column tiles walked down R (else C fastest).
    RB: each program walks RB tiles down R (tiles_r counts groups of RB tiles).
    SCALE_MODE >= 0: the scale rule as a constexpr (the runtime scale_mode is then ignored).
    FP6_WORDS (FP6, DO_ROW): :func:`_rows_fp6_words`; with DO_COL (cast-transpose), the column half reloads the
    tile in its own layout (from L1 / L2: one DRAM read) instead of converting one layout to the other.
    COL_PACKED (DO_COL): :func:`_cols_packed`, which loads the tile in its own layout too (with DO_ROW, a reload).
    FP4_PAIRS (DO_ROW, FP4 from bf16 with HW_CVT): :func:`_rows_fp4_pairs`. COL_WIDE (with COL_PACKED, 8- or 4-bit
    elements): 64-bit packed units. COL_UNITS > 0 (DO_COL): :func:`_cols_units` with COL_UNITS-element
    loads. FP8_WORDS (FP8 with HW_CVT): the bad-block mask inside the cvt asm, rowwise
    (:func:`_cvt_fp8_rn_keep`), and each unit's word straight from :func:`_fp8_words` in COL_PACKED columns of
    32-bit units and in COL_UNITS columns. CT_EVICT (fused cast-transpose with COL_UNITS): 1 = the rows' load
    of the tile evict_last and the columns' reload evict_first, so the reload finds the tile in L1 more often;
    2 = the rows' hint only. GRID3 (GROUP_C 0): a (tiles_c, tiles_r,
    B) launch grid, :func:`_tile_ids`."""
    if GROUP_C > 0:
        tl.static_assert(not GRID3)
        pid = tl.program_id(0)
        if INT64:  # every index derived from pid is then 64-bit
            pid = pid.to(tl.int64)
        # strips of GROUP_C column tiles walked down R: neighbouring programs read neighbouring columns of
        # the same rows and extend the same transposed output rows
        per_b = tiles_r * tiles_c
        b = pid // per_b
        t = pid % per_b
        g = t // (GROUP_C * tiles_r)
        gw = tl.minimum(tiles_c - g * GROUP_C, GROUP_C)  # the last strip may be narrower
        t = t - g * (GROUP_C * tiles_r)
        pc = g * GROUP_C + t % gw
        pr = t // gw
    else:
        pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, GRID3)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    # FP4 through bf16x2 (HW_CVT, bf16 inputs only): the quantizer takes the bf16 bits as loaded
    RAW16: tl.constexpr = HW_CVT and BITS == 4 and IN_KIND == IN_BF16_BITS
    for i in tl.range(0, RB, num_stages=1):  # a real loop (unrolled, it spilled registers)
        r0 = (pr * RB + i) * BLOCK_R
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = (r < R) | (not MASKED)
        grow = b * R + r
        if FP6_WORDS and FP6P_R:
            _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                            colsp_r, scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C,
                            MASKED, EVICT_LAST if CT_EVICT > 0 else 0, FP6_ST4)
        elif FP6_WORDS:
            tl.static_assert(DO_ROW and BITS == 6)
            _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C, colsp_r, scale_mode, IN_KIND,
                            LAYOUT_R, MBITS, EMIN, EMAX, MAX_NORMAL, MAX_FRAC, AWAY, SCALE_MODE,
                            BLOCK_R, BLOCK_C, MASKED, HW_CVT, FP6_ASM, EVICT_LAST if CT_EVICT > 0 else 0, FP6_ST4)
        if (DO_COL and not (COL_PACKED or COL_UNITS > 0)) or (DO_ROW and not (FP6_WORDS or FP4_PAIRS)):
            # (cast-transpose with FP6_WORDS: the column half loads the tile again, in its own layout; the
            # program's first load just brought it into L1 / L2)
            raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :], rmask[:, None] & cmask[None, :], IN_KIND,
                            EVICT_LAST if CT_EVICT > 0 else 0)
        if DO_ROW and FP4_PAIRS:
            tl.static_assert(RAW16)
            _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                            colsp_r, scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C,
                            MASKED, EVICT_LAST if CT_EVICT > 0 else 0, DO_COL)
        elif DO_ROW and not FP6_WORDS:
            codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, BITS,
                                          MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY,
                                          HW_CVT, RAW16, SCALE_MODE, FP8_WORDS)
            _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, colsp_r,
                             BLOCK_R, BLOCK_C, BITS, LAYOUT_R, MASKED)
        if DO_COL and COL_UNITS > 0 and COL_FP4W:
            _cols_fp4_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                            EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, COL_WIDE,
                            EVICT_FIRST if CT_EVICT == 1 else 0)
        elif DO_COL and COL_UNITS > 0 and FP6P_C:
            _cols_fp6_pairs(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                            EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, EVICT_FIRST if CT_EVICT == 1 else 0)
        elif DO_COL and COL_UNITS > 0:
            _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C,
                        BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, HW_CVT, SCALE_MODE,
                        BLOCK_R, BLOCK_C, MASKED, COL_UNITS, FP6_ASM, FP8_WORDS,
                        EVICT_FIRST if CT_EVICT == 1 else 0)
        elif DO_COL and COL_FP4W:
            _cols_fp4_words(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                            EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, 8)
        elif DO_COL and COL_PACKED:
            _cols_packed(x_ptr, qc_ptr, sc_ptr, b, r0, c, cmask, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C,
                         BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, HW_CVT, SCALE_MODE,
                         BLOCK_R, BLOCK_C, MASKED, COL_WIDE, FP8_WORDS and not COL_WIDE)
        elif DO_COL and COL_DIRECT:
            codes, sbyte = _quantize_cols(_to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, BITS, MBITS, EMIN, EMAX,
                                          IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, HW_CVT,
                                          SCALE_MODE)
            _store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c,
                               BLOCK_C, BLOCK_R, BITS, LAYOUT_C, MASKED)
        elif DO_COL:
            # transpose the raw tile (2 bytes / element for 16-bit inputs) and quantize its rows: blocks of
            # 32 along R become contiguous in each row, and the output rows (one per column c) are contiguous
            rt = tl.trans(raw)
            codes, sbyte = _quantize_rows(rt if RAW16 else _to_bits(rt, IN_KIND), BLOCK_C, BLOCK_R, BITS, MBITS,
                                          EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY,
                                          HW_CVT, RAW16, SCALE_MODE)
            _store_quantized(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c,
                             BLOCK_C, BLOCK_R, BITS, LAYOUT_C, MASKED)
