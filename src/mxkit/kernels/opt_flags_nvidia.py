"""The Hopper (sm_90) heuristics behind :func:`mxkit.kernels.opt_flags.quantize_config` and
:func:`~mxkit.kernels.opt_flags.dequantize_config`: pure functions of the problem, measured on the H200 and the H100
(same-process A/B runs; the numbers are in BENCHMARKS.md and the commit history), and the resolution of a
config for one problem (:func:`resolve_quantize`, :func:`resolve_dequantize`): the paths that run, which the
plans in :mod:`mxkit.kernels.quantize` read without deciding anything."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..formats import ElementFormat, Rounding
from ._env import interpreting
from .opt_flags import DequantizeConfig, QuantizeConfig, _tiles_need_int64

_IN_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the kernels' IN_KIND of an input dtype


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _row_width(L: int, widest: int = 1024, least: int = 256) -> int:
    """The widest power-of-two tile width from ``widest`` down to ``least`` whose last tile of a row of L
    elements pads the row by at most L / 8 (``least`` when none does): a row's last program mostly masked lanes
    lost to narrower tiles."""
    w = widest
    while w > least and (-L) % w > L // 8:
        w //= 2
    return w


def quantize_flags(B: int, R: int, C: int, do_row: bool, do_col: bool, f: ElementFormat,
                   in_bf16: bool) -> QuantizeConfig:
    """The tile and paths for x viewed [B, R, C]: blocks along C (do_row), along R (do_col), or both (the
    cast-transpose). Rowwise: the widest row tiles that do not pad the row by more than 1/8, FP4 / FP6 programs
    walking several tiles down R on large problems. Columnwise: packed units (FP4) or col_units (FP8 / FP6 /
    MXINT8) so only packed words are transposed. Cast-transpose: fused FP8 / FP4 / FP6-from-bf16, one-direction
    programs (split_rows) for FP6 from fp32 / fp16. FP8 / FP6 / FP4-from-bf16 round through the hardware cvt."""
    hw_cvt = f.is_float and f.bits in (4, 8)  # FP4: bf16 inputs only (hw_cvt_ok); FP6: with the unit asm (below)
    if do_col:
        fp8 = f.is_float and f.bits == 8
        r64 = 64 if R >= 64 else 32
        r128 = 128 if R >= 128 else r64
        split, units, fp6p = (), 0, False
        if do_row and f.is_float and f.bits == 6 and C >= 512 and in_bf16:
            # cast-transpose FP6 from bf16 fused: 128 x 128 tiles on 4 warps, rows and columns from bf16 pairs
            # (fp6_pairs), the rows' words stored as [groups, rows, 4] tiles (fp6_store4)
            block_r, c_max, units, fp6p = r128, 128, 2, True
            warps = max(1, block_r * max(32, min(c_max, _pow2(C))) // 4096)
        elif do_row and f.is_float and f.bits == 6 and C >= 512:
            # cast-transpose FP6 by one-direction programs (_cast_transpose_split_kernel): columns on 64 x 64
            # (col_units), rows on 2 x 512 (4 per program), a warp per 32 rows
            block_r, c_max, warps, split, units = r64, 64, r64 // 32, (2, max(32, min(512, _pow2(C))), 4), 2
        elif do_row and f.is_float and f.bits == 4:
            # cast-transpose FP4 fused: 64 x 256 tiles (C < 256: 64 x 128, a 256-wide tile would idle most of its
            # columns), rows and columns from bf16 pairs; a thread per (block, pair): warps = tile / 2048
            block_r, c_max, units = r64, 256 if C >= 256 else 128, 2
            warps = max(1, block_r // 32 * max(32, min(c_max, _pow2(C))) // 64)
        elif do_row and fp8:  # cast-transpose FP8: col_units columns on 32 x 256 (64 x 128 when C < 256), 4 warps
            block_r, c_max, warps, units = (32, 256, 4, 2) if C >= 256 else (r64, 128, 4, 2)
        elif do_row:  # cast-transpose FP6 (C < 512), MXINT8
            block_r, c_max, warps = 32, 64, 1
        elif f.is_float and f.bits == 4:  # 64-bit packed units (col_wide): 256 x 64, a warp per 64 rows
            block_r, c_max = (256 if R >= 256 else r128), 64
            warps = max(1, block_r // 64)
        elif fp8:  # col_units on 256 x 64, a warp per 32-row block
            block_r = 256 if R >= 256 else r128
            c_max, warps, units = 64, block_r // 32, 2
        else:  # FP6 / MXINT8: col_units, 128 x 64, a warp per 32-row block
            block_r, c_max, warps, units = r128, 64, r128 // 32, 2
        packed = f.is_float and f.bits in (4, 8) and not units  # FP4 columns packed into words before the transpose
        group_c = 16 if f.bits == 6 and not units else 0
        block_c = max(32 if do_row else 16, min(c_max, _pow2(C)))
        wide = False
        if packed and (split or not do_row):
            # the load layout gives one lane per (unit, 8 columns) of a 16-byte vector (bf16; fp32: 4
            # columns): the warps must not run out of units, or they would split a unit's codes
            lanes = block_r // (64 // f.bits) * (block_c // 8)
            wide = lanes >= 32
            warps = max(1, min(warps, lanes // 32))
        span_c = split[1] if split else block_c
        cfg = QuantizeConfig(block_r=block_r, block_c=block_c, num_warps=warps,
                             int64=_tiles_need_int64(B, R, C, block_r, span_c),
                             hw_cvt=hw_cvt or bool(split) or bool(units and f.bits == 6),
                             group_c=0 if split else group_c, fp6_asm=bool(units and f.bits == 6),
                             col_wide=wide, fp4_pairs=do_row and f.bits == 4,
                             split_rows=split, col_units=units, col_fp4_words=f.bits == 4 and (packed or do_row),
                             scale_t=(f.is_float and (f.bits != 4 or (do_row and not split))
                                      and not (units and not do_row) and B * R * C >= 1 << 26),
                             fp6_pairs=fp6p, fp6_store4=fp6p,
                             grid3=f.is_float and f.bits == 6 and not split and B * R * C >= 1 << 26)
        return cfg
    fp6p_rows = f.is_float and f.bits == 6 and C >= 1024 and in_bf16
    # rows whose 1024-wide tiles pad them by more than 1/8 (C = 1056, 1280, 1536, 2560, ...) take narrower tiles
    # (_row_width) of as many elements (FP8: half as many)
    wide = _row_width(C) if C >= 1024 else 0
    narrow = False  # (FP4 / FP6 on narrower tiles than their default: one tile per program, below)
    if f.is_float and f.bits == 8 and wide == 1024:  # 8 x 1024 on 8 warps
        block_c, block_r, warps = 1024, max(1, min(_pow2(R), 8)), 8
    elif f.is_float and f.bits == 8 and wide:  # 8 x 512 on 4 warps
        block_c, block_r, warps = 512, max(1, min(_pow2(R), 8)), 4
    elif f.is_float and f.bits in (4, 6):
        row_tiles = bool(wide) and (f.bits == 4 or fp6p_rows)
        if row_tiles:
            # FP4: one 1024-element row per warp; FP6 from bf16 pairs, 2 x 1024 on two warps; narrower when padded
            block_c, narrow = wide, wide < 1024
        else:  # 2048 elements, 1024 per warp, up to 1024 (FP4) / 512 (FP6) wide
            block_c = max(32, min(1024 if f.bits == 4 else 512, _pow2(C)))
            block_r = max(1, min(_pow2(R), 2048 // block_c))
            warps = max(1, min(2, block_r * block_c // 1024))
            # rows that tile pads by more than 1/8, when a 256-wide one pads them less (C = 544, 640, 768, ...; FP6
            # from fp32 / fp16 past 1024)
            w = _row_width(C, block_c)
            narrow = C >= 256 and (-C) % w < (-C) % block_c
            block_c = w if narrow else block_c
        if row_tiles or narrow:  # FP4 1024 elements on one warp, FP6 2048 on two
            block_r = max(1, min(_pow2(R), (1024 if f.bits == 4 else 2048) // block_c))
            warps = 1 if f.bits == 4 else 2
    else:
        block_c = max(32, min(256, _pow2(C)))
        block_r = max(1, min(_pow2(R), 4096 // block_c))
        warps = max(1, min(4, block_r * block_c // 1024))
    n_tiles = -(-R // block_r) * -(-C // block_c)
    # FP4 / FP6 programs walk 2 one-row / 4 other tiles down R from 2^14 tiles (the H100: one, GPU_TUNING), not
    # the narrower tiles of padded rows
    rblocks = (2 if block_r == 1 else 4) if (f.bits in (4, 6) and n_tiles >= 16384 and not narrow) else 1
    cfg = QuantizeConfig(block_r=block_r, block_c=block_c, num_warps=warps,
                         int64=_tiles_need_int64(B, R, C, block_r * rblocks, block_c), hw_cvt=f.is_float,
                         rblocks=rblocks, fp4_pairs=f.is_float and f.bits == 4,
                         fp6_asm=f.is_float and f.bits == 6, fp6_pairs=fp6p_rows, fp6_store4=fp6p_rows)
    return cfg


def dequantize_flags(B: int, N: int, L: int, trans: bool, f: ElementFormat,
                     out_dtype: torch.dtype) -> DequantizeConfig:
    """The tile and paths for qdata viewed [B, N, L] (trans: blocks along N's rows, the output transposed):
    FP8 / FP6 / FP4 decode through the hardware FP8 -> fp16 cvt; rowwise FP8 / FP4 to 16-bit outputs one
    1024-element row per program (unless that pads the row by more than 1/8); FP6 lane-pair swaps and one asm per
    group, FP4 whole 8-code words per asm."""
    hw_dec = f.is_float
    if trans:
        block_l = max(32, min(128, _pow2(L)))
        block_n = max(16, min(32, _pow2(N)))
        return DequantizeConfig(block_n=block_n, block_l=block_l, num_warps=4,
                                int64=_tiles_need_int64(B, N, L, block_n, block_l), hw_dec=hw_dec)
    load3d = f.is_float and f.bits in (4, 8)  # (the rows kernel's [n, l // 32, 32] tiles)
    fp4_asm = f.is_float and f.bits == 4
    # rows the 1024-wide tiles pad by more than 1/8 take the 2-D tiles below (FP8 only below 2048 elements)
    rows_1024 = L >= 1024 and (_row_width(L) == 1024 or (f.bits == 8 and L >= 2048))
    if load3d and out_dtype in (torch.bfloat16, torch.float16) and rows_1024:
        return DequantizeConfig(block_n=1, block_l=1024, num_warps=1, int64=_tiles_need_int64(B, N, L, 1, 1024),
                                hw_dec=True, fp4_asm=fp4_asm)
    block_l = max(32, min(512 if ((load3d and f.bits == 8) or f.bits == 6) else 256, _pow2(L)))
    block_n = max(1, min(_pow2(N), (2048 if f.bits == 6 else 4096) // block_l))
    warps = max(1, min(4, block_n * block_l // 1024))
    return DequantizeConfig(block_n=block_n, block_l=block_l, num_warps=warps,
                            int64=_tiles_need_int64(B, N, L, block_n, block_l), hw_dec=hw_dec,
                            pair_swap=f.bits == 6, fp6_asm=f.is_float and f.bits == 6, fp4_asm=fp4_asm)


# ---------------------------------------------------------------------------------------------------------
# resolution: the paths that run for one problem, written into the config's fields (the plans read fields only)


def _per_thread(cfg: QuantizeConfig, block_r: int = 0, block_c: int = 0) -> int:
    """Elements per thread of a block_r x block_c tile (default: the config's tile) on the config's warps."""
    return (block_r or cfg.block_r) * (block_c or cfg.block_c) // (32 * cfg.num_warps)


def hw_cvt_ok(cfg: QuantizeConfig, f: ElementFormat, rnd: Rounding, in_kind: int, per_thread: int = 0,
              asm: Optional[bool] = None) -> bool:
    """Whether a hardware-conversion path runs for this config / format / rounding / input: RNE on the GPU
    (asm; default: not under the CPU interpreter), FP8 or FP6 (through the FP8 ``cvt.rn.satfinite``) from any
    input, FP4 from bfloat16 inputs (bf16x2 arithmetic, ``_codecs._fp4_bf16x2``); at least 4 elements per thread
    (the asm takes 4 at a time) in the config's tile, or in a tile with ``per_thread`` elements per thread when
    given (the split rows)."""
    asm = not interpreting() if asm is None else asm
    per_thread = per_thread or _per_thread(cfg)
    fmt_ok = f.is_float and (f.bits in (6, 8) or (f.bits == 4 and in_kind == 1))
    return bool(cfg.hw_cvt and fmt_ok and rnd is Rounding.RNE and asm and per_thread >= 4)


def fp6_asm_ok(cfg: QuantizeConfig, f: ElementFormat, in_kind: int, C: int, do_row: bool, do_col: bool,
               row_per_thread: int = 0) -> bool:
    """Whether the FP6 unit asm (``_codecs._fp6_units_asm``) may run, given that the hardware path runs: the asm
    packs the 16 elements of a unit from consecutive registers of a thread, which holds only for the load
    layouts it was written for. Rows: 16-bit inputs and at least 16 elements per thread in the row tile
    (``row_per_thread`` when not the config's tile), so each thread loads whole 16-byte vectors = 8 elements per
    half group. Columns (whole units from 2-element loads): tiles of 32 x 2 columns per lane with a warp per
    32-row block (no register repetitions before the unit's elements) and C a multiple of 16 (so Triton
    vectorises the loads; the split cast-transpose's column programs run the config's tile too). The input
    address must also be a multiple of 16 bytes: checked per call (the plan's ``unaligned`` constexprs). A tile
    outside these rules gave wrong bytes (128 x 128 on four warps), hence the fallback to the per-element paths
    rather than trust in Triton's layout choices."""
    if not (cfg.fp6_asm and f.is_float and f.bits == 6):
        return False
    if do_row and not (in_kind in (1, 2) and (row_per_thread or _per_thread(cfg)) >= 16):
        return False
    return not do_col or bool(cfg.block_c == 64 and cfg.num_warps == cfg.block_r // 32 and C % 16 == 0)


def hw_dec_ok(cfg: DequantizeConfig, f: ElementFormat, asm: Optional[bool] = None) -> bool:
    """Whether the hardware FP8 -> fp16 decode runs: FP8 / FP6 / FP4 on the GPU (asm; default: not under the
    CPU interpreter), at least 4 elements per thread (the asm takes 4 at a time)."""
    asm = not interpreting() if asm is None else asm
    per_thread = cfg.block_n * cfg.block_l // (32 * cfg.num_warps)
    return bool(cfg.hw_dec and f.is_float and asm and per_thread >= 4)


def resolve_quantize(cfg: QuantizeConfig, B: int, R: int, C: int, do_row: bool, do_col: bool, f: ElementFormat,
                     dtype: torch.dtype, rounding, scale_layout: str = "plain", *, asm: bool = True) -> QuantizeConfig:
    """cfg (a schedule: the paths asked for) made the paths that run for x viewed [B, R, C] of ``dtype``, rounded
    with ``rounding``, its scales in ``scale_layout``: every flag whose format, input, rounding, direction, tile,
    C or kernel rules it out is cleared (the hardware convert also without asm: the CPU interpreter), the fields
    that the kernel's algorithm fixes are set (col_units of the columnwise and split paths, fp6_store4 of the
    fused cast-transpose with col_units), and the per-direction fields set (hw_cvt_rows / _cols, fp6_pairs_rows /
    _cols). Raises ValueError for col_units other than 0 and 2 (the column units load 2 elements). A resolved
    config is returned as it is."""
    if cfg.resolved:
        return cfg
    if cfg.col_units not in (0, 2):
        raise ValueError(f"col_units={cfg.col_units} must be 0 or 2 (the units load 2-element vectors)")
    rnd = Rounding.parse(rounding)
    in_kind = _IN_KIND[dtype]
    bf16 = in_kind == 1
    hw = hw_cvt_ok(cfg, f, rnd, in_kind, asm=asm)
    fp4, fp6 = f.is_float and f.bits == 4, f.is_float and f.bits == 6
    zero = dict(hw_cvt=hw, hw_cvt_rows=hw, hw_cvt_cols=hw, group_c=0, rblocks=1, scale_t=False, fp4_pairs=False,
                col_wide=False, col_fp4_words=False, col_units=0, fp6_asm=False, split_rows=(), fp6_store4=False,
                fp6_pairs=False, fp6_pairs_rows=False, fp6_pairs_cols=False, grid3=False)
    scale_t = bool(cfg.scale_t and scale_layout == "plain")
    if do_row and not do_col:  # _quantize_rows_kernel
        fp6p = bool(cfg.fp6_pairs and fp6 and bf16 and hw)
        fp6_asm = bool(hw and fp6_asm_ok(cfg, f, in_kind, C, True, False)) and not fp6p
        fp4p = bool(cfg.fp4_pairs and fp4 and bf16 and hw and _per_thread(cfg) >= 8)
        fields = dict(rblocks=cfg.rblocks, fp4_pairs=fp4p, fp6_asm=fp6_asm, fp6_store4=bool(cfg.fp6_store4 and fp6),
                      fp6_pairs=fp6p, fp6_pairs_rows=fp6p)
    elif do_col and not do_row:  # _quantize_cols_kernel
        fields = dict(scale_t=scale_t, grid3=cfg.grid3, col_units=0 if fp4 else 2, col_wide=bool(cfg.col_wide and fp4),
                      col_fp4_words=bool(cfg.col_fp4_words and fp4 and bf16 and C % 2 == 0 and hw),
                      fp6_asm=bool(hw and fp6_asm_ok(cfg, f, in_kind, C, False, True)))
    elif cfg.split_rows and fp6:  # _cast_transpose_split_kernel: the row programs on their own tile
        rbr, rbc, _ = cfg.split_rows
        per_thread_r = _per_thread(cfg, rbr, rbc)
        row_hw = hw_cvt_ok(cfg, f, rnd, in_kind, per_thread_r, asm=asm)
        asm_ok = fp6_asm_ok(cfg, f, in_kind, C, True, True, per_thread_r)
        fields = dict(split_rows=cfg.split_rows, scale_t=scale_t, col_units=2, hw_cvt_rows=row_hw,
                      hw_cvt_cols=bool(hw and asm_ok), fp6_asm=bool(row_hw and asm_ok))
    elif cfg.col_units:  # _cast_transpose_kernel
        pairs = bool(bf16 and hw and C % 2 == 0 and (
            (fp4 and cfg.fp4_pairs and cfg.col_fp4_words and _per_thread(cfg) >= 8) or (fp6 and cfg.fp6_pairs)))
        fields = dict(rblocks=cfg.rblocks, scale_t=scale_t, grid3=cfg.grid3, col_units=2, fp4_pairs=fp4 and pairs,
                      col_fp4_words=fp4 and pairs, fp6_store4=fp6, fp6_pairs=fp6 and pairs,
                      fp6_pairs_rows=fp6 and pairs, fp6_pairs_cols=fp6 and pairs)
    else:  # _cast_transpose_tile_kernel (integer encoder)
        fields = dict(hw_cvt=False, hw_cvt_rows=False, hw_cvt_cols=False, group_c=cfg.group_c, scale_t=scale_t)
    return dataclasses.replace(cfg, resolved=True, **dict(zero, **fields))


def resolve_dequantize(cfg: DequantizeConfig, trans: bool, f: ElementFormat, out_dtype: torch.dtype, *,
                       asm: bool = True) -> DequantizeConfig:
    """cfg made the paths that run for qdata of format f decoded to ``out_dtype`` (the kernel's output dtype;
    trans: blocks along N's rows): every flag the format, direction, tile, output or asm (False: the CPU
    interpreter) rules out is cleared. A resolved config is returned as it is."""
    if cfg.resolved:
        return cfg
    hw_dec = hw_dec_ok(cfg, f, asm=asm)
    fp6_rows = f.bits == 6 and not trans
    return dataclasses.replace(
        cfg, resolved=True, hw_dec=hw_dec,
        pair_swap=bool(fp6_rows and cfg.pair_swap and out_dtype != torch.float32 and asm),
        fp6_asm=bool(fp6_rows and cfg.fp6_asm and f.is_float and out_dtype == torch.bfloat16 and hw_dec),
        fp4_asm=bool(cfg.fp4_asm and f.is_float and f.bits == 4 and not trans
                     and out_dtype in (torch.bfloat16, torch.float16) and hw_dec))
