"""The cast-transpose kernels (x quantized along both of its last two dims from one read of x), and the tiled byte
transpose of the transposed-scale buffer."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import EVICT_FIRST, EVICT_LAST, IN_BF16_BITS, _load_raw, _split_pid, _tile_ids, _to_bits
from ._store import _store_cols_direct, _store_quantized
from ._rows import _quantize_rows, _rows_fp4_pairs, _rows_fp6_pairs, _rows_fp6_words
from ._cols import _cols_fp4_units, _cols_fp6_pairs, _cols_units, _quantize_cols


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "colsp_r", "colsp_c"])
def _cast_transpose_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, R, C, tiles_r, tiles_c, colsp_r, colsp_c,
    IN_KIND: tl.constexpr, LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
    AWAY: tl.constexpr, HW_CVT: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, RB: tl.constexpr, INT64: tl.constexpr, MASKED: tl.constexpr,
    GRID3: tl.constexpr,
):
    """The fused cast-transpose of x viewed [B, R, C] (C contiguous): each program quantizes its [BLOCK_R,
    BLOCK_C] tile along C -> qr [B, R, C packed], sr (layout LAYOUT_R, padded width colsp_r) and along R -> qc
    [B, C, R packed], sc (LAYOUT_C, colsp_c), RB tiles down R per program (a real loop). The row half loads
    the tile with evict_last, the column half reloads it (from L1 / L2: DRAM reads x about once) in its own
    layout with evict_first: whole packed units per thread (:func:`~._cols._cols_units`).

    FMT, MODE, AWAY, HW_CVT as in :func:`~._rows._quantize_rows_kernel`; the rows as there (FP6: whole groups
    per thread with the [groups, rows, 4] word store). PAIRS (bf16 input, HW_CVT, the input address a
    multiple of 4): both halves read bf16 pairs as 32-bit words (FP4: rows by :func:`~._rows._rows_fp4_pairs`
    with the blocks as the tile's outer dim, columns by :func:`~._cols._cols_fp4_units`; FP6:
    :func:`~._rows._rows_fp6_pairs`, :func:`~._cols._cols_fp6_pairs`). GRID3: a (tiles_c, tiles_r, B) grid."""
    pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, GRID3)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    # FP4 through bf16x2 (HW_CVT, bf16 inputs only): the quantizer takes the bf16 bits as loaded
    RAW16: tl.constexpr = HW_CVT and FMT.bits == 4 and IN_KIND == IN_BF16_BITS
    for i in tl.range(0, RB, num_stages=1):  # a real loop (unrolled, it spilled registers)
        r0 = (pr * RB + i) * BLOCK_R
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = (r < R) | (not MASKED)
        grow = b * R + r
        if FMT.bits == 6 and PAIRS:
            _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                            colsp_r, LAYOUT_R, FMT, MODE, BLOCK_R, BLOCK_C, MASKED, EVICT_LAST, True)
        elif FMT.bits == 6:
            _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C, colsp_r, IN_KIND, LAYOUT_R, FMT, MODE,
                            AWAY, BLOCK_R, BLOCK_C, MASKED, HW_CVT, False, EVICT_LAST, True)
        elif FMT.bits == 4 and PAIRS:
            tl.static_assert(RAW16)
            _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                            colsp_r, LAYOUT_R, FMT, MODE, BLOCK_R, BLOCK_C, MASKED, EVICT_LAST, True)
        else:
            raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :], rmask[:, None] & cmask[None, :], IN_KIND,
                            EVICT_LAST)
            codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, FMT, MODE, AWAY,
                                          HW_CVT, RAW16, HW_CVT and FMT.bits == 8)
            _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, colsp_r,
                             BLOCK_R, BLOCK_C, FMT.bits, LAYOUT_R, MASKED)
        if FMT.bits == 4 and PAIRS:
            _cols_fp4_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, LAYOUT_C, FMT, MODE, BLOCK_R,
                            BLOCK_C, MASKED, EVICT_FIRST)
        elif FMT.bits == 6 and PAIRS:
            _cols_fp6_pairs(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, LAYOUT_C, FMT, MODE, BLOCK_R,
                            BLOCK_C, MASKED, EVICT_FIRST)
        else:
            _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, IN_KIND, LAYOUT_C, FMT, MODE, AWAY,
                        HW_CVT, BLOCK_R, BLOCK_C, MASKED, False, EVICT_FIRST)


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "colsp_r", "colsp_c"])
def _cast_transpose_tile_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, R, C, tiles_r, tiles_c, colsp_r, colsp_c,
    IN_KIND: tl.constexpr, LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
    AWAY: tl.constexpr, GROUP_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
    MASKED: tl.constexpr,
):
    """The fused cast-transpose of x viewed [B, R, C] from ONE load of each [BLOCK_R, BLOCK_C] tile, integer
    encoder: outputs as :func:`_cast_transpose_kernel`. FP6: the rows by whole groups per thread
    (:func:`~._rows._rows_fp6_words`, which loads the tile itself), the columns quantized along dim 0 of the
    raw tile with only the 1-byte codes transposed (:func:`~._cols._quantize_cols`); the other formats (MXINT8):
    the rows from the raw tile, the columns from its transpose (2-4 bytes per element through shared memory).
    GROUP_C > 0: programs ordered in strips of GROUP_C column tiles walked down R (else C fastest)."""
    if GROUP_C > 0:
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
        pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, False)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    r0 = pr * BLOCK_R
    r = r0 + tl.arange(0, BLOCK_R)
    rmask = (r < R) | (not MASKED)
    grow = b * R + r
    if FMT.bits == 6:
        _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C, colsp_r, IN_KIND, LAYOUT_R, FMT, MODE,
                        AWAY, BLOCK_R, BLOCK_C, MASKED)
    # (FP6: the columns load the tile again, in their own layout; the rows' first load just brought it into L1)
    raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :], rmask[:, None] & cmask[None, :], IN_KIND, 0)
    if FMT.bits == 6:
        codes, sbyte = _quantize_cols(_to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, FMT, MODE, AWAY)
        _store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c, BLOCK_C, BLOCK_R, FMT.bits,
                           LAYOUT_C, MASKED)
    else:
        codes, sbyte = _quantize_rows(_to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, FMT, MODE, AWAY)
        _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, colsp_r, BLOCK_R, BLOCK_C,
                         FMT.bits, LAYOUT_R, MASKED)
        # the transposed raw tile's rows: blocks of 32 along R become contiguous in each row, and the output rows
        # (one per column c) are contiguous
        rt = tl.trans(raw)
        codes, sbyte = _quantize_rows(_to_bits(rt, IN_KIND), BLOCK_C, BLOCK_R, FMT, MODE, AWAY)
        _store_quantized(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c, BLOCK_C, BLOCK_R, FMT.bits,
                         LAYOUT_C, MASKED)


@triton.jit(do_not_specialize=["regions_r", "regions_c", "colsp_r", "colsp_c"])
def _cast_transpose_split_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr, R, C, regions_r, regions_c, colsp_r, colsp_c,
    IN_KIND: tl.constexpr, LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr, FMT: tl.constexpr, MODE: tl.constexpr,
    AWAY: tl.constexpr, ROW_BR: tl.constexpr, ROW_BC: tl.constexpr, ROW_RB: tl.constexpr, ROW_HW: tl.constexpr,
    COL_BR: tl.constexpr, COL_BC: tl.constexpr, COL_HW: tl.constexpr, FP6_ASM: tl.constexpr,
    INT64: tl.constexpr, MASKED: tl.constexpr,
):
    """The FP6 cast-transpose of x viewed [B, R, C] by programs that each do ONE direction: the tensor is cut
    into regions of COL_BR x ROW_BC elements, and each region gets NR row programs (ROW_RB tiles of ROW_BR x
    ROW_BC each, whole 16-element groups per thread: :func:`~._rows._rows_fp6_words`) followed by NC column
    programs (COL_BR x COL_BC tiles, whole units per thread: :func:`~._cols._cols_units`). The programs of a
    region run next to each other, so the second read of its 64-256 KB comes from L2: DRAM reads x about once,
    while each program runs one lean path on its own tile. Outputs as :func:`_cast_transpose_kernel`.
    ROW_HW / COL_HW: the hardware convert of each direction (GPU only); FP6_ASM: the unit asm (both)."""
    tl.static_assert(FMT.bits == 6)
    NR: tl.constexpr = COL_BR // (ROW_BR * ROW_RB)
    NC: tl.constexpr = ROW_BC // COL_BC
    tl.static_assert(NR * ROW_BR * ROW_RB == COL_BR and NC * COL_BC == ROW_BC)
    pid = tl.program_id(0)
    if INT64:
        pid = pid.to(tl.int64)
    region = pid // (NR + NC)
    k = pid % (NR + NC)
    rc, rr, b = _split_pid(region, regions_c, regions_r)
    r0 = rr * COL_BR
    if k < NR:
        c0 = rc * ROW_BC
        for i in tl.range(0, ROW_RB, num_stages=1):
            r = r0 + (k * ROW_RB + i) * ROW_BR + tl.arange(0, ROW_BR)
            rmask = (r < R) | (not MASKED)
            grow = b * R + r
            _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r, IN_KIND, LAYOUT_R, FMT, MODE, AWAY,
                            ROW_BR, ROW_BC, MASKED, ROW_HW, FP6_ASM, 0, False)
    else:
        _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, IN_KIND, LAYOUT_C,
                    FMT, MODE, AWAY, COL_HW, COL_BR, COL_BC, MASKED, FP6_ASM)


@triton.jit
def _transpose_bytes_kernel(src_ptr, dst_ptr, M, N, tiles_n, BLOCK: tl.constexpr):
    """dst [N, M] = src [M, N]^T for bytes (the scale_t scales), one BLOCK x BLOCK tile per program (both sides
    read and written along rows; the transpose goes through shared memory)."""
    pid = tl.program_id(0)
    pm = pid // tiles_n
    pn = pid % tiles_n
    rm = pm * BLOCK + tl.arange(0, BLOCK)
    rn = pn * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(src_ptr + rm[:, None] * N + rn[None, :], mask=(rm < M)[:, None] & (rn < N)[None, :])
    tl.store(dst_ptr + rn[:, None] * M + rm[None, :], tl.trans(t), mask=(rn < N)[:, None] & (rm < M)[None, :])
