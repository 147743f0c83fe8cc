"""The cast-transpose by one-direction programs over regions of the tensor, and the tiled byte transpose of the
scale_t scales."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import IN_BF16_BITS, _load_raw, _split_pid, _to_bits
from ._store import _store_cols_direct, _store_quantized
from ._rows import _quantize_rows, _rows_fp4_pairs, _rows_fp6_pairs, _rows_fp6_words
from ._cols import _cols_fp4_units, _cols_fp4_words, _cols_fp6_pairs, _cols_packed, _cols_units, _quantize_cols


@triton.jit(do_not_specialize=["regions_r", "regions_c", "colsp_r", "colsp_c", "scale_mode"])
def _cast_transpose_split_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
    R, C, regions_r, regions_c, colsp_r, colsp_c, scale_mode,
    IN_KIND: tl.constexpr, LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, AWAY: tl.constexpr,
    INT64: tl.constexpr, MASKED: tl.constexpr, SCALE_MODE: tl.constexpr,
    ROW_BR: tl.constexpr, ROW_BC: tl.constexpr, ROW_RB: tl.constexpr, ROW_HW: tl.constexpr,
    FP6_WORDS: tl.constexpr, FP4_PAIRS: tl.constexpr,
    COL_BR: tl.constexpr, COL_BC: tl.constexpr, COL_HW: tl.constexpr, COL_PACKED: tl.constexpr,
    COL_WIDE: tl.constexpr, COL_UNITS: tl.constexpr = 0, FP6_ASM: tl.constexpr = False,
    COL_FP4W: tl.constexpr = False, FP6_ST4: tl.constexpr = False, FP6P_R: tl.constexpr = False,
    FP6P_C: tl.constexpr = False,
):
    """Cast-transpose of x viewed [B, R, C] by programs that each do ONE direction: the tensor is cut into
    regions of COL_BR x ROW_BC elements, and each region gets NR row programs (ROW_RB tiles of ROW_BR x ROW_BC
    each, blocks along C: the rowwise paths) followed by NC column programs (COL_BR x COL_BC tiles, blocks
    along R: COL_PACKED / col_direct). The programs of a region run next to each other, so the second read
    of its 64-256 KB comes from L2: DRAM reads x about once (as the fused kernel, whose column half reloads
    its tile from L1 / L2 too), while each program runs one lean path on its own best tile (the fused tile
    had to serve both, with both paths' registers live in every program). Outputs as in _quantize_kernel
    with DO_ROW and DO_COL; same bytes."""
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
        RAW16: tl.constexpr = ROW_HW and BITS == 4 and IN_KIND == IN_BF16_BITS
        for i in tl.range(0, ROW_RB, num_stages=1):
            r = r0 + (k * ROW_RB + i) * ROW_BR + tl.arange(0, ROW_BR)
            rmask = (r < R) | (not MASKED)
            grow = b * R + r
            if FP6_WORDS and FP6P_R:
                _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r,
                                scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, ROW_BR, ROW_BC, MASKED, 0,
                                FP6_ST4)
            elif FP6_WORDS:
                _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r, scale_mode, IN_KIND, LAYOUT_R,
                                MBITS, EMIN, EMAX, MAX_NORMAL, MAX_FRAC, AWAY, SCALE_MODE, ROW_BR, ROW_BC,
                                MASKED, ROW_HW, FP6_ASM, 0, FP6_ST4)
            elif FP4_PAIRS:
                tl.static_assert(RAW16)
                _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r,
                                scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, ROW_BR, ROW_BC, MASKED)
            else:
                c = c0 + tl.arange(0, ROW_BC)
                raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :],
                                rmask[:, None] & ((c < C) | (not MASKED))[None, :], IN_KIND)
                codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), ROW_BR, ROW_BC, BITS, MBITS,
                                              EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY,
                                              ROW_HW, RAW16, SCALE_MODE)
                _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, c0, C, colsp_r, ROW_BR, ROW_BC, BITS,
                                 LAYOUT_R, MASKED)
    else:
        c = rc * ROW_BC + (k - NR) * COL_BC + tl.arange(0, COL_BC)
        cmask = (c < C) | (not MASKED)
        if COL_UNITS > 0 and COL_FP4W:
            _cols_fp4_units(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED, COL_WIDE)
        elif COL_UNITS > 0 and FP6P_C:
            _cols_fp6_pairs(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED)
        elif COL_UNITS > 0:
            _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                        IN_KIND, LAYOUT_C, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, COL_HW,
                        SCALE_MODE, COL_BR, COL_BC, MASKED, COL_UNITS, FP6_ASM)
        elif COL_FP4W:
            _cols_fp4_words(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED, COL_WIDE)
        elif COL_PACKED:
            _cols_packed(x_ptr, qc_ptr, sc_ptr, b, r0, c, cmask, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C, BITS,
                         MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, COL_HW, SCALE_MODE, COL_BR,
                         COL_BC, MASKED, COL_WIDE)
        else:  # col_direct
            r = r0 + tl.arange(0, COL_BR)
            raw = _load_raw(x_ptr + (b * R + r)[:, None] * C + c[None, :],
                            ((r < R) | (not MASKED))[:, None] & cmask[None, :], IN_KIND)
            codes, sbyte = _quantize_cols(_to_bits(raw, IN_KIND), COL_BR, COL_BC, BITS, MBITS, EMIN, EMAX, IS_INT,
                                          MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, COL_HW, SCALE_MODE)
            _store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c, COL_BC, COL_BR, BITS,
                               LAYOUT_C, MASKED)


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
