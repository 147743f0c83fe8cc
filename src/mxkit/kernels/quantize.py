"""MX quantize / dequantize on the GPU (Triton, Hopper sm_90 and later): launchers and torch custom ops.

The jit bodies live in :mod:`mxkit.kernels._quantize`; the specification they match byte for byte is
:mod:`mxkit.reference` (``quantize_reference`` / ``dequantize_reference``).

Every call views the input as ``[B, R, C]`` with C contiguous:

* ``axis`` = last dim: ``B = 1``, ``R = prod(other dims)``, ``C = shape[axis]``; blocks of 32 run along C.
* ``axis`` = any other dim: ``B = prod(dims before)``, ``R = shape[axis]``, ``C = prod(dims after)``; the
  kernel loads ``[BLOCK_R, BLOCK_C]`` tiles coalesced along C, transposes the raw tile (shared memory) and
  quantizes its rows, so the output (MXTensor keeps the quantized axis last) is written contiguously.
* cast-transpose ``axis=(last, second-to-last)`` (either order): ``[B, M, K]``; both copies in one launch, x read
  from DRAM about once (fused per tile, or FP4 / FP6 programs of one direction sharing regions through L2).

Tile configs are a pure function of the problem (:func:`quantize_config`, :func:`dequantize_config`).
Custom ops ``mxkit::quantize_mx``, ``mxkit::cast_transpose_mx``, ``mxkit::dequantize_mx`` return raw
tensors, so ``torch.compile(fullgraph=True)`` traces through them; MXTensor is built outside the ops.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import struct
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import triton

from ..formats import BLOCK_SIZE, ElementFormat, FormatLike, Rounding, ScaleMode, get_format
from ..layouts import scale_layout_shape
from ..tensor import MXTensor, check_out_dtype, check_quantize_args
from . import _quantize as K

__all__ = [
    "quantize_triton",
    "dequantize_triton",
    "QuantizeConfig",
    "DequantizeConfig",
    "quantize_config",
    "dequantize_config",
    "needs_int64",
    "KERNEL_SCALE_LAYOUTS",
]

KERNEL_SCALE_LAYOUTS = {"plain": 0, "nvidia_128x4": 1, "aiter_shuffle": 2}  # layouts the quantize kernel writes directly
_LAYOUT_PLAIN_T = 3  # internal: a plain scale written transposed (scale_t; _quantize.LAYOUT_PLAIN_T)
_MODE = {ScaleMode.FLOOR: 0, ScaleMode.CEIL: 1, ScaleMode.RCEIL: 2, ScaleMode.EVEN: 3}
_INT32_LIMIT = 2**31 - 1
_GRID_YZ_LIMIT = 65535  # CUDA's limit of launch grid dims 1 and 2 (dim 0: 2^31 - 1)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _row_width(L: int, widest: int = 1024, least: int = 256) -> int:
    """The widest power-of-two tile width from ``widest`` down to ``least`` whose last tile of a row of L
    elements pads the row by at most L / 8 (``least`` when none does). Row tiles of 1024 elements on one or two
    warps won on rows of 2048 elements and more, and lost on rows just past a multiple of 1024, where each row's
    last program was mostly masked lanes (H200, session 16, bf16: rowwise FP4 at 32768 x 1088 36.2 us on 1 x 1024
    against 31.5 us on 4 x 256; dequantize FP4 at 16384 x 1280 24.2 against 17.6 us; 16384 x 2880, padded 6.7%,
    kept the 1024-wide tiles: 36.4 against 37.3 us)."""
    w = widest
    while w > least and (-L) % w > L // 8:
        w //= 2
    return w


def needs_int64(*extents: int) -> bool:
    """True when an element offset could pass 2^31 - 1: ``extents`` are the (tile-padded) element counts
    of every tensor a kernel addresses. Pure function of shapes (tested without allocating)."""
    return max(extents) > _INT32_LIMIT


def _tiles_need_int64(B: int, R: int, C: int, span_r: int, span_c: int) -> bool:
    """:func:`needs_int64` of x viewed [B, R, C] padded to whole spans of span_r x span_c (a program's rows and
    columns)."""
    return needs_int64(B * (-(-R // span_r) * span_r) * (-(-C // span_c) * span_c))


# ---------------------------------------------------------------------------------------------------------
# configs


@dataclass(frozen=True)
class QuantizeConfig:
    """Tile of one quantize program: ``[block_r, block_c]`` elements of the ``[B, R, C]`` view."""

    block_r: int
    block_c: int
    num_warps: int
    int64: bool
    # fp32-denormal inputs: 0 = multiply them as they are (exact: Triton's sm_90 fp32 multiply keeps
    # subnormals), 1 = rebuild them from the mantissa in tiles that need it (CTA-wide min), 2 = always
    denorm: int = 0
    # FP8 / FP6 elements (RNE only) through the hardware cvt.rn.satfinite.{e4m3,e5m2}x2 (inline asm; ignored
    # for other formats, for AWAY rounding and under the CPU interpreter, which cannot run inline asm)
    hw_cvt: bool = False
    row3d: bool = False  # rowwise only: load the tile as [block_r, block_c // 32, 32] (no reshapes)
    col_direct: bool = False  # blocks along R: quantize the untransposed tile, transpose only the codes
    group_c: int = 0  # > 0: program order in strips of group_c column tiles walked down R (0: C fastest)
    # each program walks rblocks tiles down R (not with row3d); blocks along R with 4 or 8 and a plain scale
    # layout whose rows divide evenly: each column's scale bytes go out as one 4- / 8-byte word (not
    # rblocks single bytes)
    rblocks: int = 1
    mode_const: bool = False  # the scale mode as a constexpr (one compile per mode, less per-block work)
    # rowwise FP6, block_c >= 32: each thread packs and stores whole 16-code groups (3 words) itself, no
    # shared-memory exchange (default for rowwise FP6; ignored elsewhere)
    fp6_words: bool = False
    # blocks along R, plain scale layout: the kernel writes the scales transposed ([R / 32, B * C], so a
    # program's bytes of one block row are contiguous) and a tiled byte transpose moves them into place
    scale_t: bool = False
    # blocks along R: load the tile as [block_r / J, J, block_c] so each thread packs whole 32-bit words of
    # codes (J = 4 FP8 / MXINT8, 8 FP4, 16 FP6 -> 3 words) and only the words are transposed (_cols_packed)
    col_packed: bool = False
    # rowwise FP4 from bf16 with hw_cvt (not row3d): the input read as bf16 pairs (32-bit words), each pair
    # rounded straight into its packed byte (_rows_fp4_pairs; in the fused cast-transpose with the blocks as the
    # tile's outer dim); skipped for an input address not a multiple of 4
    fp4_pairs: bool = False
    # with col_packed, 8- / 4-bit elements: 8 / 16 codes per packed unit, one 64-bit word (half the transposed
    # elements); FP4 with col_units and col_fp4_words: 16-row units, one 64-bit word each
    col_wide: bool = False
    # columnwise FP4 from bf16 with col_packed or col_units (C even): the tile read as bf16 pairs of adjacent
    # columns, one asm per pair rounding and packing both columns' units (_quantize._cols_fp4_words with
    # col_packed, _quantize._cols_fp4_units with col_units: a lane per 32-row block of a pair, one word per
    # load); skipped for an input address not a multiple of 4
    col_fp4_words: bool = False
    # blocks along R: 0 = off; 1 / 2 = the tile loaded with 1- / 2-element loads so lanes run along the columns
    # and warps along the 32-row blocks, each thread packing whole units (_cols_units; FP6: 16 codes = 3
    # words, a warp storing 96 contiguous bytes of an output row from 128-row tiles); col_direct, col_packed
    # ignored
    col_units: int = 0
    # FP6 with hw_cvt (rowwise fp6_words, col_units): one inline asm per 16-element unit rounds through the FP8
    # cvt, saturates, moves the signs and packs the three words on 4 codes at a time (_quantize._fp6_units_asm)
    fp6_asm: bool = False
    # cast-transpose only: (row_block_r, row_block_c, row_rblocks) = programs doing one direction each
    # (_cast_transpose_split_kernel): regions of block_r x row_block_c, each cut into row programs of
    # row_rblocks tiles of row_block_r x row_block_c and column programs of block_r x block_c tiles; () = the
    # fused kernel (both directions from each tile)
    split_rows: tuple = ()
    # FP8 with hw_cvt: the codes of 4 elements made and masked as one 32-bit word: rowwise tiles (not row3d)
    # with the bad-block mask inside the cvt asm (_quantize._cvt_fp8_rn_keep), col_units columns and col_packed
    # columns of 32-bit units (not col_wide) with each unit's word from one asm (_quantize._fp8_words)
    fp8_words: bool = False
    # fused cast-transpose with col_units: cache eviction hints, 1 = the rows' load of the tile evict_last and
    # the columns' reload evict_first, 2 = the rows' load evict_last only (0: none); the FP8 / FP4 default
    ct_evict: int = 0
    # rowwise FP6 with fp6_words: each row's group words stored as one [groups, rows, 4] tile (words 0, 1, 2
    # and a masked copy of word 2), so a warp's store runs along (word, group) of a row: contiguous row
    # pieces instead of three stride-3 word stores (_quantize._rows_fp6_words)
    fp6_store4: bool = False
    # FP6 from bf16 with hw_cvt: rowwise fp6_words tiles and col_units columns (C even) read as bf16 pairs
    # (32-bit words), the amax on the pairs, and one asm per unit that clamps in bf16x2, scales, rounds through
    # the FP8 cvt and packs (_quantize._fp6_pairs_asm); skipped for an input address not a multiple of 4
    fp6_pairs: bool = False
    # launch a (tiles_c, tiles_r, B) grid where tiles_r and B fit its 65535 limit (not with group_c or
    # split_rows): the program ids are the tile indices, no division of a 1-D id (_quantize._tile_ids)
    grid3: bool = False


@dataclass(frozen=True)
class DequantizeConfig:
    """Tile of one dequantize program: ``[block_n, block_l]`` elements (block_l along the quantized dim)."""

    block_n: int
    block_l: int
    num_warps: int
    int64: bool
    load3d: bool = False  # rowwise, not FP6: address codes and output as [n, l // 32, 32] tiles
    # FP8 / FP6 / FP4 through the hardware FP8 -> fp16 cvt (inline asm; ignored for MXINT8 and under the
    # CPU interpreter)
    hw_dec: bool = False
    # rowwise FP6, block_l >= 32: each thread unpacks and writes whole 16-code groups (3 words) itself, no
    # shared-memory exchange (default for rowwise FP6)
    fp6_words: bool = False
    # with fp6_words and a 16-bit output: lane pairs swap half groups so every store writes whole 32-byte
    # sectors (inline-asm shuffles; ignored for fp32 output, whose 8-element halves are whole sectors, and
    # under the CPU interpreter)
    pair_swap: bool = False
    # with fp6_words, hw_dec and bf16 output: each 16-code group decoded by one inline asm (bytes spread 4 at a
    # time, FP8 -> fp16 cvt, fp32 scale multiply, bf16x2 cvt; _quantize._fp6_group_decode_asm)
    fp6_asm: bool = False
    # rowwise FP4 to bf16 / fp16 with hw_dec: qdata read as int32 words, each word's 8 codes decoded straight to
    # bf16 / fp16 pairs by one inline asm (integer placement + two bf16x2 multiplies; _quantize._fp4_word_decode_asm)
    fp4_asm: bool = False


def _grid(n_fast: int, n_mid: int, batch: int, grid3: bool) -> tuple:
    """(launch grid, GRID3) of batch x n_mid x n_fast tiles: (n_fast, n_mid, batch) when grid3 and the two slow
    dims fit CUDA's 65535 limit of grid dims 1 and 2, else the 1-D (batch * n_mid * n_fast,) that the kernel
    splits itself (:func:`mxkit.kernels._quantize._tile_ids`)."""
    if grid3 and n_fast <= _INT32_LIMIT and n_mid <= _GRID_YZ_LIMIT and batch <= _GRID_YZ_LIMIT:
        return (n_fast, n_mid, batch), True
    return (batch * n_mid * n_fast,), False


# Per-GPU overrides of quantize_config's choice. Its defaults hold on both the H100 and the H200; an entry is a
# setting that one GPU measured faster while the other measured it slower. Key: a prefix of the CUDA device
# name (torch.cuda.get_device_name). Entries: (path "rows" / "cols" / "cast_transpose", format name, least
# elements B * R * C, the QuantizeConfig fields to replace).
GPU_TUNING: dict = {
    # the fused FP4 cast-transpose walking two 64 x 256 tiles per program (rblocks 2): H200 16384^2 258.6 ->
    # 252.9 us, 8192^2 73.6 -> 72.8 us; the H100 default, since there it was slower (302.8 -> 317.3 us, 84.9 ->
    # 89.3 us; sessions 13-14, benchmarks/h200-2026-11-22-s14/ab_grid3_fp4code.txt)
    "NVIDIA H200": (("cast_transpose", "mxfp4_e2m1", 1 << 26, {"rblocks": 2}),),
    # the fused FP8 cast-transpose on 64 x 256 tiles, eight warps: H100 8192^2 106.1 -> 104.8 us, 16384^2 401.7 ->
    # 393.6 us (session 15, four rounds; benchmarks/h200-2026-11-23-s15/ab_castT_fp8_h100_tiles.txt); on the
    # H200 that tile is slower (same file, run 6: 81.7 -> 85.6 us, 301.7 -> 316.4 us). Keyed by the SXM part's full
    # name: the PCIe / NVL parts (other memory, other clocks) were not measured
    # Rowwise FP4 / FP6 with one tile per program at every size: H100 FP6 16384^2 253.1 -> 248.0 us, 8192^2 70.0 ->
    # 68.3 us, 16384 x 2880 55.4 -> 51.3 us; FP4 8192^2 65.2 -> 63.7 us, 16384 x 2880 48.7 -> 48.1 us, 16384^2 equal
    # (session 16, four rounds; benchmarks/h200-2026-11-23-s16/ab_row_tiles.txt). The H200 walks 2 / 4 tiles per
    # program from 2^14 tiles (there one tile per program lost at 16384^2: FP6 179.7 -> 185.9 us, FP4 162.5 -> 167.3)
    "NVIDIA H100 80GB HBM3": tuple(("cast_transpose", name, 1 << 26, {"block_r": 64, "num_warps": 8})
                                   for name in ("mxfp8_e4m3", "mxfp8_e5m2"))
    + tuple(("rows", name, 0, {"rblocks": 1}) for name in ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2")),
}


def _gpu_tuned(cfg: QuantizeConfig, gpu: str, path: str, fmt_name: str, B: int, R: int, C: int) -> QuantizeConfig:
    """cfg with the GPU_TUNING entries that match (gpu, path, format, size) applied; int64 re-derived for the new
    tile span (a pure function, as quantize_config)."""
    for prefix, entries in GPU_TUNING.items():
        if not (gpu and gpu.startswith(prefix)):
            continue
        for p, name, min_elements, fields in entries:
            if p == path and name == fmt_name and B * R * C >= min_elements:
                cfg = dataclasses.replace(cfg, **fields)
                span_c = cfg.split_rows[1] if cfg.split_rows else cfg.block_c
                cfg = dataclasses.replace(cfg, int64=cfg.int64 or _tiles_need_int64(B, R, C, cfg.block_r * cfg.rblocks,
                                                                                    span_c))
    return cfg


_GPU_NAMES: dict = {}  # CUDA device index -> name (a cache of torch.cuda.get_device_name)


def _gpu_name(t: torch.Tensor) -> str:
    """The CUDA device name of t, '' for a tensor off CUDA (the key of GPU_TUNING)."""
    if t.device.type != "cuda":
        return ""
    i = t.device.index if t.device.index is not None else torch.cuda.current_device()
    name = _GPU_NAMES.get(i)
    if name is None:
        name = _GPU_NAMES[i] = torch.cuda.get_device_name(i)
    return name


@functools.lru_cache(maxsize=1024)  # pure function of the problem; saves launch overhead
def quantize_config(B: int, R: int, C: int, do_row: bool, do_col: bool, fmt: FormatLike, *,
                    in_bf16: bool = True, gpu: str = "") -> QuantizeConfig:
    """Pick the tile for x viewed [B, R, C] (pure function of the problem and ``gpu``, the CUDA device name:
    :data:`GPU_TUNING`'s entries for it replace fields of the choice below). Every choice comes from same-process
    A/B runs of scripts/ab_quantize.py on an H200, bf16 8192^2 / 16384^2 (benchmarks/h200-2026-11-22-s3/ to
    -s7/ab_variants.txt); times below are 16384^2.

    All: the scale rule as a constexpr (mode_const: one compile per mode; columnwise FP8 105 -> 64 registers).
    Element rounding (hw_cvt, RNE on a GPU only, :func:`hw_cvt_ok`): FP8 through the hardware
    ``cvt.rn.satfinite``, FP4 from bf16 through bf16x2 arithmetic, FP6 through the FP8 cvt in the unit asm
    (fp6_asm, :func:`fp6_asm_ok`: saturation, sign and packing 4 codes at a time; the FP6 kernels were
    ALU-pipe-bound) in rowwise tiles and col_units columns; the fused FP6 cast-transpose from bf16 (C >= 512)
    from bf16 pairs (fp6_pairs: the amax on pairs, the saturation as one bf16x2 clamp per pair, one asm per
    unit); the fused FP6 cast-transpose with C < 512 keeps the integer encoder.

    Rowwise (blocks along C): FP8 8 x 1024 on 8 warps when C >= 1024 (197 -> 192 us), FP4 1 x 1024 on one
    warp when C >= 1024 (session 8: 2 x 1024 on two, 49.8 -> 47.6 us at 8192^2), narrower FP4 up to 2048
    elements and FP6 4 x 512 on 2, others up to 16 x 256 on 4; rows that 1024-wide tiles would pad by more than
    1/8 (:func:`_row_width`; C = 1056, 1280, 1536, 2560, 3584, ...) on 512- or 256-wide tiles of as many
    elements (FP6: from bf16; FP8: 8 x 512 on 4 warps, half the elements; 16 x 256 within +-2%), and FP4 / FP6
    rows below 1024 that a 256-wide tile pads less than their tile (C = 544, 640, 768; FP6 from fp32 / fp16 also
    past 1024) on 4 x 256 (one warp) / 8 x 256 (two); on large problems (>= 16384 tiles) FP4 / FP6 programs
    walk 4 tiles down R (rblocks; 2 for the one-row FP4 tiles; not on those narrower tiles, nor on the H100:
    GPU_TUNING). FP6: each thread packs and stores whole 16-code groups (fp6_words; 264 -> 227 us), through the
    FP8 cvt (227 -> 222 us); from bf16 with C >= 1024 (session 12) from bf16 pairs (fp6_pairs) with
    each group's words stored as [groups, rows, 4] tiles (fp6_store4) on 2 x 1024 tiles, two warps (H200
    186.8 -> 179.6 us, 8192^2 55.2 -> 52.2 us; the pairs alone were slower, 190.2 us). FP4 from bf16: bf16
    pairs read as 32-bit words and rounded straight into packed bytes (fp4_pairs; 206 -> 179 us; session 8:
    the leaner bf16x2 encoder with the packed amax and the bad-block mask inside the asm, 179 -> 165 us).

    Columnwise (blocks along R): FP8 / FP6 / MXINT8 with col_units on 128 x 64 tiles, a warp per 32-row block
    (2-element loads put the lanes along the columns; each thread packs whole units along R, and a warp
    stores 96 contiguous bytes of an FP6 output row: FP6 366 -> 250 us, MXINT8 286 -> 245 us, FP8 216 -> 214
    us; 1-element loads, 64- or 256-row tiles, program strips: slower). FP8 since session 9 on 256 x 64 tiles
    (8 warps) with its scales written directly: each column's 8 scale bytes of a tile are one 8-byte piece of
    its scale row, so the transposed scale buffer and its second launch no longer pay (8192^2 60.0 -> 57.8
    us, 16384^2 214.1 -> 210.4 us; 256 rows with scale_t, or scale_t off on 128 rows, gained at one size
    only). FP4 packs codes along R into 64-bit
    units in-thread from 16-byte loads and transposes only those (col_packed + col_wide: 16 codes per unit,
    built from two 32-bit halves; 32-bit units in session 5 took FP4 295 -> 230 us; 64-bit: 220 -> 191 us;
    col_units: 197 us) on 256 x 64 tiles, a warp per 64 rows (fewer when the tile has fewer than 64 units x
    8-column vectors, so no warp splits a unit). From bf16 with C even, the tile is read as bf16 pairs of
    adjacent columns and one asm per pair rounds and packs both columns' units (col_fp4_words, session 8:
    190 -> 176 us with the leaner encoder, 128 x 64 -> 256 x 64 tiles 176 -> 173 us; 32-bit units, 64-row
    tiles or one warp per 128 rows: slower; 512 x 64 on 8 warps 171 us, not taken for the program count of
    smaller problems).

    FP8 everywhere (session 10): fp8_words, each four codes made and masked as one 32-bit word (the bad-block
    mask inside the cvt asm rowwise, unit words straight from the asm in col_units / col_packed columns; a
    tl.where on the uint8 codes had unpacked, selected and repacked every byte): rowwise 54.0 -> 53.2 us at
    8192^2, columnwise 57.9 -> 57.3 us, and the fused cast-transpose, whose ALU pipe had limited it (Nsight:
    71%), 1480 -> 1192 SASS instructions.

    Cast-transpose: FP8 fused (both directions from each tile; col_packed 32 x 128 on two warps: 403 -> 336
    us; session 10: col_units columns on 64 x 128 tiles, four warps, with fp8_words: 335 -> 314 us, 8192^2
    92.0 -> 84.5 us; other tiles and direct column scales slower; then the rows' load of the tile evict_last
    and the columns' reload evict_first (ct_evict), on 32 x 256: 314 -> 304 us, 84.0 -> 82.0 us). FP4 fused
    since session 11 on 64 x 128 tiles (four warps, ct_evict): the rows from bf16 pairs with the blocks as the
    outer dim (lanes along a row's blocks: on the tall tile the old order gave each lane its own row and every
    store a half sector), the columns from bf16 pairs in the col_units layout (_cols_fp4_units: a lane per
    32-row block of a column pair, a column's two 16-byte pieces on neighbouring lanes; 32-row tiles, whose
    16-byte pieces meet another program's in each sector, ran 2x slower): 301 -> 273 us, 8192^2 81.6 -> 75.4
    us, against the one-direction programs below, whose second read of x from L2 had L2 reads 1.6x the fused
    kernel's; since session 13 on 64 x 256 tiles (eight warps): H200 16384^2 266.4 -> 261.5 us, 8192^2 74.2 ->
    72.8 us; H100 311.0 -> 302.9 us, 86.2 -> 84.9 us. Programs walking two such tiles down R (rblocks) were
    faster still on the H200 (254.0 us) but slower on the H100 (315.2 us); 64 x 512, four tiles per program, or
    Triton's software pipelining of the tile loop (the next tile prefetched into shared memory: 2x slower)
    were slower. FP6 from bf16 fused since session 12 (C >= 512), on 128 x 128 tiles, four warps, ct_evict: rows
    and columns from bf16 pairs (fp6_pairs, _quantize._fp6_pairs_asm) and the rows' three words per group
    stored as one [groups, rows, 4] tile (fp6_store4: a warp's store runs along a row; Nsight had the
    earlier fused FP6 kernels' L2 write sectors at 2.3x the split kernel's): H200 16384^2 392 -> 334 us, H100
    444 -> 391 us (each change alone gained nothing on this tile). FP6 from fp32 / fp16 by one-direction
    programs over regions of the tensor (split_rows,
    :func:`_quantize._cast_transpose_split_kernel`: each program runs one lean path on its own tile, and a
    region's second read comes from L2; FP6 785 -> 618 us, FP4 403 -> 369 us until session 11; FP8 no gain,
    also with col_units): columns 64 x 64 (col_units; 617 -> 483 us) and rows 2 x 512 (fp6_words, FP8 cvt) on
    two warps; only when C fills a region row (C >= 512: at 32768 x 160 the masked region columns made it 40%
    slower), else fused (32 x 64 on one warp with col_direct, the untransposed tile quantized and only the
    1-byte codes transposed, in strips of 16 column tiles walked down R; fused FP6 tiles with col_units were
    15-90% slower in session 11, also on 128- / 256-column tiles whose rows' pieces are whole sectors: the
    cause was not found). MXINT8: the fused 32 x 64 tile.

    The 3-D launch grid (grid3: the program ids are the tile indices, where the 1-D id of every other path is
    split by two divisions by runtime ints, ~60 instructions before a program's first load) for FP6 columns
    and the fused FP6 cast-transpose from 2^26 elements (session 14, H200: columnwise 209.9 -> 200.4 us, 8192^2
    57.6 -> 55.8 us; cast-transpose 336.5 -> 331.6 us; H100 within 0.5%; at 32768 x 160 the H100's columnwise FP6
    was 12.0 -> 12.7 us slower on it). Elsewhere it gained nothing or lost: columnwise FP4 on
    both GPUs (8192^2 H200 49.9 -> 52.6 us, H100 67.1 -> 68.7) and the FP4 cast-transpose on the H100 (302.8 ->
    309.3 us), where ptxas also chose fewer registers (48, not 62; columnwise FP4 96, not 107): more resident
    CTAs, and more stalls on memory (Nsight, H200 8192^2, columnwise FP4: warps active 23 -> 29%, long-scoreboard
    stalls per issue 3.2 -> 5.4, DRAM throughput 79 -> 74% of peak; benchmarks/h200-2026-11-22-s14/).

    Plain column scales of the FP8 / FP6 cast-transposes (and of the fused FP4 one; not of columnwise FP6
    since col_units with the unit asm: 214 -> 209 us without, nor of columnwise FP8 since its 256-row tiles)
    are written transposed ([R / 32, B * C]) and a tiled byte transpose moves them into place (scale_t;
    session 4: columnwise FP6 485 -> 367 us,
    cast-transpose FP8 427 -> 401 us; session 5: columnwise FP8 243 -> 236 us; FP4 columns: no gain since
    col_packed, slower with the split), from 2^26 elements: at 4096^2 and 32768 x 160 the host time of the
    call with its second launch (80-160 us) outran the bench's 100 us GPU spin, while the device time barely
    moved (scripts/ab_scale_t.py, -s5/)."""
    f = get_format(fmt)
    hw_cvt = f.is_float and f.bits in (4, 8)  # FP4: bf16 inputs only (hw_cvt_ok); FP6: with the unit asm (below)
    if do_col:
        fp8 = f.is_float and f.bits == 8
        r64 = 64 if R >= 64 else 32
        r128 = 128 if R >= 128 else r64
        split, units, fp6p = (), 0, False
        if do_row and f.is_float and f.bits == 6 and C >= 512 and in_bf16:
            # cast-transpose FP6 from bf16 fused: 128 x 128 tiles on 4 warps, rows and columns from bf16 pairs
            # (fp6_pairs), the rows' words stored as [groups, rows, 4] tiles (fp6_store4), ct_evict
            block_r, c_max, units, fp6p = r128, 128, 2, True
            warps = max(1, block_r * max(32, min(c_max, _pow2(C))) // 4096)
        elif do_row and f.is_float and f.bits == 6 and C >= 512:
            # cast-transpose FP6 by one-direction programs (_cast_transpose_split_kernel): columns on 64 x 64
            # (col_units), rows on 2 x 512 (4 per program, fp6_words), a warp per 32 rows
            block_r, c_max, warps, split, units = r64, 64, r64 // 32, (2, max(32, min(512, _pow2(C))), 4), 2
        elif do_row and f.is_float and f.bits == 4:
            # cast-transpose FP4 fused: 64 x 256 tiles (C < 256: 64 x 128 as before session 13, where a 256-wide
            # tile would idle most of its columns), the rows from bf16 pairs (blocks outer), the columns from bf16
            # pairs in the col_units layout (a lane per 32-row block of a column pair, the two blocks of a column
            # on neighbouring lanes), ct_evict; a thread per (block, pair): warps = tile / 2048
            block_r, c_max, units = r64, 256 if C >= 256 else 128, 2
            warps = max(1, block_r // 32 * max(32, min(c_max, _pow2(C))) // 64)
        elif do_row and fp8:  # cast-transpose FP8: col_units columns on 32 x 256 (64 x 128 when C < 256), 4 warps
            block_r, c_max, warps, units = (32, 256, 4, 2) if C >= 256 else (r64, 128, 4, 2)
        elif do_row:  # cast-transpose FP6 (C < 512), MXINT8
            block_r, c_max, warps = 32, 64, 1
        elif f.is_float and f.bits == 4:  # 64-bit units (col_packed + col_wide): 256 x 64, a warp per 64 rows
            block_r, c_max = (256 if R >= 256 else r128), 64
            warps = max(1, block_r // 64)
        elif fp8:  # col_units on 256 x 64, a warp per 32-row block (session 9: 8192^2 60.0 -> 57.8 us)
            block_r = 256 if R >= 256 else r128
            c_max, warps, units = 64, block_r // 32, 2
        else:  # FP6 / MXINT8: col_units, 128 x 64, a warp per 32-row block
            block_r, c_max, warps, units = r128, 64, r128 // 32, 2
        packed = f.is_float and f.bits in (4, 8) and not units  # col_packed (FP6: 2x slower than col_direct)
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
        cfg = QuantizeConfig(block_r, block_c, warps, _tiles_need_int64(B, R, C, block_r, span_c),
                             col_direct=f.is_float and f.bits == 6 and not units, col_packed=packed,
                             hw_cvt=hw_cvt or bool(split) or bool(units and f.bits == 6),
                             group_c=0 if split else group_c, mode_const=True, fp6_asm=bool(units and f.bits == 6),
                             fp6_words=do_row and f.bits == 6, col_wide=wide, fp4_pairs=do_row and f.bits == 4,
                             split_rows=split, col_units=units, col_fp4_words=f.bits == 4 and (packed or do_row),
                             scale_t=(f.is_float and (f.bits != 4 or (do_row and not split))
                                      and not (units and not do_row) and B * R * C >= 1 << 26),
                             fp8_words=fp8, ct_evict=1 if (do_row and (fp8 or f.bits == 4 or fp6p)) else 0,
                             fp6_pairs=fp6p, fp6_store4=fp6p,
                             grid3=f.is_float and f.bits == 6 and not split and B * R * C >= 1 << 26)
        return _gpu_tuned(cfg, gpu, "cast_transpose" if do_row else "cols", f.name, B, R, C)
    fp6p_rows = f.is_float and f.bits == 6 and C >= 1024 and in_bf16
    # rows whose 1024-wide tiles pad them by more than 1/8 (C = 1056, 1280, 1536, 2560, ...) take narrower tiles
    # (_row_width) of as many elements (FP8: half as many)
    wide = _row_width(C) if C >= 1024 else 0
    narrow = False  # (FP4 / FP6 on narrower tiles than their default: one tile per program, below)
    if f.is_float and f.bits == 8 and wide == 1024:  # 8 x 1024 on 8 warps (session 5: 197 -> 192 us at 16384^2)
        block_c, block_r, warps = 1024, max(1, min(_pow2(R), 8)), 8
    elif f.is_float and f.bits == 8 and wide:  # 8 x 512 on 4 warps (session 16: C = 1088 38.6 -> 34.0 us)
        block_c, block_r, warps = 512, max(1, min(_pow2(R), 8)), 4
    elif f.is_float and f.bits in (4, 6):
        row_tiles = bool(wide) and (f.bits == 4 or fp6p_rows)
        if row_tiles:
            # FP4: one 1024-element row per warp (8192^2: 49.8 -> 47.6 us); FP6 from bf16 pairs, 2 x 1024 on two
            # warps (session 12, H200: 186.8 -> 179.6 us); narrower when padded (session 16: FP6 C = 1088 44.2 ->
            # 34.5 us, C = 2560 40.1 -> 35.3 us)
            block_c, narrow = wide, wide < 1024
        else:  # 2048 elements, 1024 per warp, up to 1024 (FP4) / 512 (FP6) wide
            block_c = max(32, min(1024 if f.bits == 4 else 512, _pow2(C)))
            block_r = max(1, min(_pow2(R), 2048 // block_c))
            warps = max(1, min(2, block_r * block_c // 1024))
            # rows that tile pads by more than 1/8, when a 256-wide one pads them less (C = 544, 640, 768, ...; FP6
            # from fp32 / fp16 past 1024; session 16, H200 32768 x 768: FP4 27.5 -> 22.9 us, FP6 31.0 -> 26.7 us)
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
    # the narrower tiles of padded rows (session 16, H200, 16384 x 1280: FP4 22.0 -> 20.0 us, FP6 22.2 -> 21.5 us
    # with one; with a clean L2 within 6.5% either way). On the 1024-wide tiles walking gained on the H200 with a
    # clean L2 (8192^2 FP4 44.4 -> 41.5 us, 16384 x 8192 FP6 92.3 -> 88.5 us; elsewhere equal) and was mixed after
    # do_bench's flush (FP6 8192^2 51.9 -> 52.4 us, 16384 x 8192 96.4 -> 94.8 us), so it stays
    # (benchmarks/h200-2026-11-23-s16/ab_row_tiles.txt)
    rblocks = (2 if block_r == 1 else 4) if (f.bits in (4, 6) and n_tiles >= 16384 and not narrow) else 1
    cfg = QuantizeConfig(block_r, block_c, warps, _tiles_need_int64(B, R, C, block_r * rblocks, block_c),
                         hw_cvt=f.is_float, rblocks=rblocks,
                         mode_const=True, fp6_words=f.bits == 6, fp4_pairs=f.is_float and f.bits == 4,
                         fp6_asm=f.is_float and f.bits == 6, fp8_words=f.is_float and f.bits == 8,
                         fp6_pairs=fp6p_rows, fp6_store4=fp6p_rows)
    return _gpu_tuned(cfg, gpu, "rows", f.name, B, R, C)


@functools.lru_cache(maxsize=1024)
def dequantize_config(B: int, N: int, L: int, trans: bool, fmt: FormatLike,
                      out_dtype: torch.dtype = torch.bfloat16) -> DequantizeConfig:
    """Pick the tile for qdata viewed [B, N, L] decoded to ``out_dtype`` (pure function of the problem).

    FP8 / FP6 / FP4 decode through the hardware FP8 -> fp16 cvt (hw_dec; GPU only): the integer decode made the
    kernel issue-bound (Nsight Compute on an H200, rowwise FP8 -> bf16 8192^2: SM throughput 90%, DRAM 44%).
    Rowwise FP8 / FP4 address codes and output as [n, l // 32, 32] tiles (load3d), FP8 with 8 x 512 tiles;
    rowwise FP6 unpacks whole 16-code groups per thread (fp6_words) on 4 x 512 tiles (session 5: 222 -> 212 us
    at 16384^2 against 8 x 256), and lane pairs swap half
    groups so 16-bit outputs are stored in whole 32-byte sectors (pair_swap: 285 -> 220 us at 16384^2; Nsight
    Compute had L2 at 89% of peak with 2x the write sectors of the output). To bf16, each group goes through
    one inline asm (fp6_asm, session 7: the kernel was ALU-pipe-bound at 85%; 211 -> 184 us). Rowwise FP4 to
    bf16 / fp16 (session 15) reads qdata as words of 8 codes, each decoded straight to four pairs by one inline asm
    (fp4_asm: integer placement of the code bits in a bf16 and two bf16x2 multiplies, 7 instructions per pair
    where the FP8-cvt decode took ~20): H200 185.6 -> 173.9 us at 16384^2, 49.4 -> 47.2 us at 8192^2 (A/B; the
    16 x 256 tile on 4 warps; 8 x 512, 4 x 1024, 2 x 1024 on 2 warps, 16 x 512 on 8 within 0.5%, 32 x 256 on 8
    slower); to fp16 184.6 -> 173.1 us; the H100 equal. With rows of 1024 and more, one 1024-element row per
    program on one warp (as rowwise FP4 quantize): the scale bytes then load in the words' layout (the 2-D
    tile's scale load took a shared-memory layout conversion and a barrier): 171.1 -> 169.5 us, 46.3 -> 46.0 us
    (six rounds). Rowwise FP8 to bf16 / fp16 likewise (its 8 x 512 tile took a 4 KB conversion): 201.5 -> 198.9
    us, 54.6 -> 53.4 us (fp32 outputs keep the 2-D tiles). Rows those tiles would pad by more than 1/8
    (:func:`_row_width`; for FP8 only below 2048 elements) keep the 2-D tiles: a row's last program was
    mostly masked lanes (session 16, H200 16384 x 1280: FP4 24.2 -> 18.0 us, FP8 24.4 -> 21.0 us)."""
    f = get_format(fmt)
    hw_dec = f.is_float
    if trans:
        block_l = max(32, min(128, _pow2(L)))
        block_n = max(16, min(32, _pow2(N)))
        return DequantizeConfig(block_n, block_l, 4, _tiles_need_int64(B, N, L, block_n, block_l), hw_dec=hw_dec)
    load3d = f.is_float and f.bits in (4, 8)
    fp4_asm = f.is_float and f.bits == 4
    # rows the 1024-wide tiles pad by more than 1/8 take the 2-D tiles below (FP8 only below 2048 elements:
    # session 16, H200, 16384 x L: FP4 at L = 2560 34.1 -> 30.8 us, FP8 at L = 1280 24.3 -> 20.6 us; FP8 at
    # L = 2560 / 3584 35.1 / 47.1 us on 1 x 1024 against 35.8 / 49.0 us on 8 x 512)
    rows_1024 = L >= 1024 and (_row_width(L) == 1024 or (f.bits == 8 and L >= 2048))
    if load3d and out_dtype in (torch.bfloat16, torch.float16) and rows_1024:
        return DequantizeConfig(1, 1024, 1, _tiles_need_int64(B, N, L, 1, 1024), load3d=True, hw_dec=True,
                                fp4_asm=fp4_asm)
    block_l = max(32, min(512 if ((load3d and f.bits == 8) or f.bits == 6) else 256, _pow2(L)))
    block_n = max(1, min(_pow2(N), (2048 if f.bits == 6 else 4096) // block_l))
    warps = max(1, min(4, block_n * block_l // 1024))
    return DequantizeConfig(block_n, block_l, warps, _tiles_need_int64(B, N, L, block_n, block_l), load3d=load3d,
                            hw_dec=hw_dec, fp6_words=f.bits == 6, pair_swap=f.bits == 6,
                            fp6_asm=f.is_float and f.bits == 6, fp4_asm=fp4_asm)


# ---------------------------------------------------------------------------------------------------------
# helpers


def _max_frac(f: ElementFormat) -> int:
    return struct.unpack("<I", struct.pack("<f", f.max_normal))[0] & 0x7FFFFF


@functools.lru_cache(maxsize=None)
def _format_constexprs(f: ElementFormat) -> dict:
    return dict(
        BITS=f.bits, MBITS=f.mbits, EMIN=(f.emin if f.is_float else -6), EMAX=f.emax,
        IS_INT=not f.is_float, MAX_NORMAL=float(f.max_normal), MAX_FRAC=_max_frac(f),
    )


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not _interpret():
        raise ValueError(
            f"the Triton MX kernels need a CUDA tensor, got device={t.device} "
            "(use mxkit.reference or backend='reference' on CPU)"
        )


def _check_layout(scale_layout: str) -> int:
    if scale_layout not in KERNEL_SCALE_LAYOUTS:
        raise ValueError(
            f"scale_layout={scale_layout!r} is not written by the quantize kernel; "
            f"supported: {', '.join(KERNEL_SCALE_LAYOUTS)} (use mxkit.layouts.to_layout for others)"
        )
    return KERNEL_SCALE_LAYOUTS[scale_layout]


def _check_block_size(block_size: int) -> None:
    if block_size != BLOCK_SIZE:
        raise NotImplementedError(
            f"the Triton MX kernels support block_size={BLOCK_SIZE} only, got {block_size=} "
            "(use mxkit.reference for other block sizes)"
        )


def _cols_padded(nblk: int, layout: str) -> int:
    """Padded scale columns of a swizzled layout (unused for plain)."""
    return scale_layout_shape(1, nblk, layout)[1]


def _per_thread(cfg: QuantizeConfig, block_r: int = 0, block_c: int = 0) -> int:
    """Elements per thread of a block_r x block_c tile (default: the config's tile) on the config's warps."""
    return (block_r or cfg.block_r) * (block_c or cfg.block_c) // (32 * cfg.num_warps)


def hw_cvt_ok(cfg: QuantizeConfig, f: ElementFormat, rnd: Rounding, in_kind: int, per_thread: int = 0) -> bool:
    """Whether a hardware-conversion path runs for this config / format / rounding / input: RNE on the GPU,
    FP8 or FP6 (through the FP8 ``cvt.rn.satfinite``) from any input, FP4 from bfloat16 inputs (bf16x2
    arithmetic, ``_quantize._fp4_bf16x2``); at least 4 elements per thread (the asm takes 4 at a time) in the
    config's tile, or in a tile with ``per_thread`` elements per thread when given (the split rows)."""
    per_thread = per_thread or _per_thread(cfg)
    fmt_ok = f.is_float and (f.bits in (6, 8) or (f.bits == 4 and in_kind == 1))
    return bool(cfg.hw_cvt and fmt_ok and rnd is Rounding.RNE and not _interpret() and per_thread >= 4)


def fp6_asm_ok(cfg: QuantizeConfig, f: ElementFormat, in_kind: int, C: int, do_row: bool, do_col: bool,
               row_per_thread: int = 0) -> bool:
    """Whether the FP6 unit asm (``_quantize._fp6_units_asm``) may run, given that the hardware path runs: the
    asm packs the 16 elements of a unit from consecutive registers of a thread, which holds only for the load
    layouts it was written for. Rows (fp6_words): 16-bit inputs and at least 16 elements per thread in the
    row tile (``row_per_thread`` when not the config's tile), so each thread loads whole 16-byte vectors = 8
    elements per half group. Columns (col_units): tiles of 32 x col_units columns with a warp per 32-row
    block (no register repetitions before the unit's elements) and C a multiple of 16 (so Triton vectorises
    the col_units-element loads; the split cast-transpose's column programs run the config's tile too). The
    input address must also be a multiple of 16 bytes: checked per call (the plan's ``unaligned``
    constexprs). A tile outside these rules gave wrong bytes in the A/B (128 x 128 on four warps), hence the
    fallback to the per-element paths rather than trust in Triton's layout choices."""
    if not (cfg.fp6_asm and f.is_float and f.bits == 6):
        return False
    if do_row and not (cfg.fp6_words and in_kind in (1, 2) and (row_per_thread or _per_thread(cfg)) >= 16):
        return False
    return not do_col or bool(cfg.col_units and cfg.block_c == 32 * cfg.col_units
                              and cfg.num_warps == cfg.block_r // 32 and C % 16 == 0)


def hw_dec_ok(cfg: DequantizeConfig, f: ElementFormat) -> bool:
    """Whether the hardware FP8 -> fp16 decode runs: FP8 / FP6 / FP4 on the GPU, at least 4 elements per
    thread (the asm takes 4 at a time)."""
    per_thread = cfg.block_n * cfg.block_l // (32 * cfg.num_warps)
    return bool(cfg.hw_dec and f.is_float and not _interpret() and per_thread >= 4)


class _Launcher:
    """Launches one ``@triton.jit`` kernel, through its compiled handle after the first launch of a
    specialisation.

    ``JITFunction.run`` binds and specialises every argument (~40 here) on each call; on the H200 host a
    launch took 27-44 us that way, more than the kernels themselves at activation sizes
    (scripts/host_overhead.py). The first launch of a key goes through Triton as usual (compiling if needed)
    and returns the ``CompiledKernel``; later launches with the same key call it directly with the arguments
    in signature order (constexprs included, which the launcher skips), as ``JITFunction.run`` does. The key
    holds every property Triton specialises on (tensor dtype and 16-byte alignment; int value == 1, % 16,
    32-bit range) plus the constexprs and options, so a hit has the same specialisation. Used only where
    that call convention was checked (triton 3.6; other versions and the CPU interpreter take Triton's
    path every time), and off with ``MXKIT_FAST_LAUNCH=0`` in the environment."""

    def __init__(self, name: str):
        self.name = name  # looked up at each call, so a kernel replaced on the module is the one launched
        self.cache: dict = {}
        self.meta = None  # (fn, runtime args come first?, constexpr names, their defaults)

    def _meta(self, fn):
        if self.meta is None or self.meta[0] is not fn:
            params = fn.params
            n_rt = sum(1 for p in params if not p.is_constexpr)
            # the direct call needs the runtime arguments first, then the constexprs (true for our kernels)
            ok = all(not p.is_constexpr for p in params[:n_rt])
            self.meta = (fn, ok, [p.name for p in params[n_rt:]], {p.name: p.default for p in params[n_rt:]})
            self.cache.clear()
        return self.meta

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.data_ptr() % 16 == 0)
        return (a == 1, a % 16 == 0, -(2**31) <= a <= _INT32_LIMIT)

    def __call__(self, grid: tuple, args: tuple, consts: tuple, num_warps: int) -> None:
        """consts: the constexprs as a tuple of (name, value) items (hashable: part of the key as they are)."""
        fn = getattr(K, self.name)
        if not _FAST_LAUNCH or not isinstance(fn, triton.runtime.JITFunction):  # (the interpreter: not a JITFunction)
            fn[grid](*args, **dict(consts), num_warps=num_warps)
            return
        _, ok, names, defaults = self._meta(fn)
        key = (tuple(map(self._spec, args)), consts, num_warps, torch.cuda.current_device())
        hit = self.cache.get(key) if ok else None
        if hit is None:
            given = dict(consts)
            k = fn[grid](*args, **given, num_warps=num_warps)
            if ok and hasattr(k, "function") and hasattr(k, "__getitem__"):
                self.cache[key] = (k, tuple(given.get(n, defaults[n]) for n in names))
            return
        k, full_consts = hit
        k[(grid + (1, 1))[:3]](*args, *full_consts)  # (the compiled kernel's runner reads all three grid dims)


# the direct launch (see _Launcher): on for the Triton versions whose call convention was checked
_FAST_LAUNCH = triton.__version__.startswith("3.6.") and os.environ.get("MXKIT_FAST_LAUNCH", "1") != "0"


_QUANTIZE = _Launcher("_quantize_kernel")
_CT_SPLIT = _Launcher("_cast_transpose_split_kernel")
_DEQUANTIZE = _Launcher("_dequantize_kernel")
_TRANSPOSE = _Launcher("_transpose_bytes_kernel")


class _QuantizePlan:
    """Everything about one quantize call that depends only on the problem (shape, dtype, format, axis,
    modes, layout, config): computed once per problem (:func:`_quantize_plan`, cached), so a call only
    allocates and launches.

    outs: (shape, zero-filled) of each uint8 output, in return order; slots: for the kernel's qr, sr, qc, sc
    pointers, (output index or -1 for a dummy, int32 view); ints: the kernel's runtime ints; scale_t: None or
    (transposed scale shape, output index, rows, cols) of the column scale written transposed; unaligned: None
    or (alignment in bytes, the constexprs for an input whose address is not a multiple of it: FP4_PAIRS reads
    bf16 pairs as 32-bit words (4), FP6_ASM needs Triton's 16-byte vectors (16)); launcher: the kernel's
    _Launcher."""

    __slots__ = ("outs", "slots", "in_view", "grid", "ints", "consts", "num_warps", "scale_t", "unaligned",
                 "launcher")

    def __init__(self, outs, slots, in_view, grid, ints, consts, num_warps, scale_t, unaligned, launcher):
        self.outs, self.slots, self.in_view, self.grid = outs, slots, in_view, grid
        self.ints, self.consts, self.num_warps, self.scale_t = ints, consts, num_warps, scale_t
        self.unaligned, self.launcher = unaligned, launcher


_IN_VIEW = {torch.float32: (torch.int32, 0), torch.bfloat16: (torch.int16, 1), torch.float16: (None, 2)}


def _out_shapes(shape: tuple, axis: int, f: ElementFormat, layout: str) -> tuple:
    """((qdata shape, False), (scale shape, zero-filled)) of x (shape) quantized along axis: the MXTensor shapes,
    the scale in the swizzled 2-D layout shape when not plain (pad bytes 0, hence zero-filled when padded)."""
    q, sc = MXTensor.expected_shapes(shape, axis, f, BLOCK_SIZE)
    if layout == "plain":
        return (q, False), (sc, False)
    rows = math.prod(sc[:-1])
    swz = scale_layout_shape(rows, sc[-1], layout)
    return (q, False), (swz, swz != (rows, sc[-1]))


@functools.lru_cache(maxsize=4096)
def _quantize_plan(shape: tuple, dtype: torch.dtype, fmt, axis, scale_mode, rounding, scale_layout: str,
                   cfg: Optional[QuantizeConfig], gpu: str = "") -> _QuantizePlan:
    """The plan of ``_quantize_impl`` (axis an int) or ``_cast_transpose_impl`` (axis None: the last two dims);
    gpu: the CUDA device name, for the default config (:func:`quantize_config`)."""
    f = get_format(fmt)
    mode, rnd = ScaleMode.parse(scale_mode), Rounding.parse(rounding)
    lay = _check_layout(scale_layout)
    in_view, in_kind = _IN_VIEW[dtype]
    if axis is None:  # cast-transpose: [B, M, K], both copies
        M, Kd = shape[-2], shape[-1]
        B, R, C, do_row, do_col = math.prod(shape[:-2]), M, Kd, True, True
        outs = _out_shapes(shape, len(shape) - 1, f, scale_layout) + _out_shapes(shape, len(shape) - 2, f,
                                                                                  scale_layout)
        slots = ((0, f.bits == 6), (1, False), (2, f.bits == 6), (3, False))
        lay_r, lay_c = lay, lay
        colsp_r, colsp_c = _cols_padded(Kd // BLOCK_SIZE, scale_layout), _cols_padded(M // BLOCK_SIZE, scale_layout)
    else:
        axis = axis % len(shape)
        L, Q = shape[axis], math.prod(shape[axis + 1 :])
        outs = _out_shapes(shape, axis, f, scale_layout)
        cols_p = _cols_padded(L // BLOCK_SIZE, scale_layout)
        if Q == 1:  # rowwise: [1, B, L]
            B, R, C, do_row, do_col = 1, math.prod(shape[:axis]), L, True, False
            slots = ((0, f.bits == 6), (1, False), (-1, False), (-1, False))
            lay_r, lay_c, colsp_r, colsp_c = lay, 0, cols_p, 0
        else:  # columnwise: [B, L, Q], blocks along L
            B, R, C, do_row, do_col = math.prod(shape[:axis]), L, Q, False, True
            slots = ((-1, False), (-1, False), (0, f.bits == 6), (1, False))
            lay_r, lay_c, colsp_r, colsp_c = 0, lay, 0, cols_p
    cfg = cfg or quantize_config(B, R, C, do_row, do_col, f, in_bf16=in_kind == 1, gpu=gpu)
    units = cfg.col_units if do_col else 0
    packed = bool(cfg.col_packed and do_col and not units)
    # FP4 columns from bf16 pairs of adjacent columns (the packed tile, or with col_units one word per load)
    fp4w = bool((packed or units) and cfg.col_fp4_words and f.is_float and f.bits == 4 and in_kind == 1
                and C % 2 == 0)
    wide = bool(cfg.col_wide and f.bits in (4, 8) and (packed or fp4w))
    if packed or units:  # the column data is written as int32 words
        slots = slots[:2] + ((slots[2][0], True),) + slots[3:]
    # FP6 from bf16 pairs (rows: with fp6_words; columns: col_units, C even)
    fp6p = bool(cfg.fp6_pairs and f.is_float and f.bits == 6 and in_kind == 1 and hw_cvt_ok(cfg, f, rnd, in_kind))
    fp6p_c = bool(fp6p and units and C % 2 == 0)
    rb = 1 if (cfg.row3d and not do_col) else cfg.rblocks
    span_r = cfg.block_r * rb
    tiles_r, tiles_c = -(-R // span_r), -(-C // cfg.block_c)
    scale_t = None
    if cfg.scale_t and do_col and lay_c == 0:
        # columnwise scales written transposed ([R / 32, B * C]: each program's bytes for one block row are
        # contiguous), then transposed into place by a tiled byte transpose (1/32 of the data)
        scale_t = ((R // 32, B * C), len(outs) - 1, B * C, R // 32)
        lay_c, colsp_c = _LAYOUT_PLAIN_T, B * C  # (colsp_c: the transposed scale's row length)
    consts = tuple(dict(
        IN_KIND=in_kind, DO_ROW=do_row, DO_COL=do_col, LAYOUT_R=lay_r, LAYOUT_C=lay_c,
        AWAY=rnd is Rounding.AWAY, **_format_constexprs(f),
        BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c, INT64=cfg.int64, DENORM=cfg.denorm,
        MASKED=bool(R % span_r or C % cfg.block_c),
        HW_CVT=hw_cvt_ok(cfg, f, rnd, in_kind), ROW3D=bool(cfg.row3d and do_row and not do_col),
        COL_DIRECT=bool(cfg.col_direct and do_col and not units), GROUP_C=cfg.group_c, RB=rb,
        SCALE_WORD=bool(do_col and rb in (4, 8) and lay_c == 0 and cfg.block_r == 32 and R % span_r == 0
                        and scale_t is None and not units and not packed),
        SCALE_MODE=_MODE[mode] if cfg.mode_const else -1,
        FP6_WORDS=bool(cfg.fp6_words and f.bits == 6 and do_row and not cfg.row3d and cfg.block_c >= 32),
        COL_PACKED=packed, COL_WIDE=wide, COL_UNITS=units, COL_FP4W=fp4w and hw_cvt_ok(cfg, f, rnd, in_kind),
        FP6_ASM=bool(hw_cvt_ok(cfg, f, rnd, in_kind) and fp6_asm_ok(cfg, f, in_kind, C, do_row, do_col)),
        FP4_PAIRS=bool(cfg.fp4_pairs and do_row and f.bits == 4 and in_kind == 1 and not (cfg.row3d and not do_col)
                       and hw_cvt_ok(cfg, f, rnd, in_kind) and _per_thread(cfg) >= 8),
        FP8_WORDS=bool(cfg.fp8_words and f.is_float and f.bits == 8 and not (cfg.row3d and not do_col)
                       and hw_cvt_ok(cfg, f, rnd, in_kind)),
        CT_EVICT=cfg.ct_evict if (do_row and do_col and units) else 0,
        FP6_ST4=bool(cfg.fp6_store4 and f.bits == 6 and do_row),
        FP6P_R=bool(fp6p and do_row and not cfg.row3d and cfg.fp6_words and cfg.block_c >= 32),
        FP6P_C=bool(fp6p_c and do_col),
    ).items())
    ints = (R, C, tiles_r, tiles_c, colsp_r, colsp_c, _MODE[mode])
    launcher = _QUANTIZE
    grid, grid3 = _grid(tiles_c, tiles_r, B, cfg.grid3 and not cfg.group_c)
    consts += (("GRID3", grid3),)
    if cfg.split_rows and do_row and do_col:
        # cast-transpose by one-direction programs over regions of block_r x row_block_c (see the kernel)
        rbr, rbc, rrb = cfg.split_rows
        regions_r, regions_c = -(-R // cfg.block_r), -(-C // rbc)
        per_thread_r = _per_thread(cfg, rbr, rbc)
        row_hw = hw_cvt_ok(cfg, f, rnd, in_kind, per_thread_r)
        col_hw = bool(hw_cvt_ok(cfg, f, rnd, in_kind)
                      and (f.bits != 6 or fp6_asm_ok(cfg, f, in_kind, C, True, True, per_thread_r)))
        consts = tuple(dict(
            IN_KIND=in_kind, LAYOUT_R=lay_r, LAYOUT_C=lay_c, **_format_constexprs(f), AWAY=rnd is Rounding.AWAY,
            INT64=cfg.int64, DENORM=cfg.denorm, MASKED=bool(R % cfg.block_r or C % rbc),
            SCALE_MODE=_MODE[mode] if cfg.mode_const else -1,
            ROW_BR=rbr, ROW_BC=rbc, ROW_RB=rrb, ROW_HW=row_hw, FP6_WORDS=bool(cfg.fp6_words and f.bits == 6),
            FP4_PAIRS=bool(cfg.fp4_pairs and f.bits == 4 and row_hw and per_thread_r >= 8),
            COL_BR=cfg.block_r, COL_BC=cfg.block_c, COL_HW=col_hw, COL_PACKED=packed,
            COL_WIDE=wide, COL_UNITS=units, COL_FP4W=fp4w and col_hw,
            FP6_ASM=bool(row_hw and fp6_asm_ok(cfg, f, in_kind, C, True, True, per_thread_r)),
            FP6_ST4=bool(cfg.fp6_store4 and f.bits == 6),
            FP6P_R=bool(fp6p and cfg.fp6_words and row_hw), FP6P_C=fp6p_c,
        ).items())
        ints = (R, C, regions_r, regions_c, colsp_r, colsp_c, _MODE[mode])
        n_r = cfg.block_r // (rbr * rrb)
        grid = (B * regions_r * regions_c * (n_r + rbc // cfg.block_c),)
        launcher = _CT_SPLIT
    # inputs at an address that is not a multiple of 4 (FP4_PAIRS, COL_FP4W, FP6P_R / _C: bf16 pairs read as
    # 32-bit words) /
    # 16 bytes (FP6_ASM: Triton vectorises the loads only from 16-byte-aligned pointers) take the paths without
    d = dict(consts)
    if d.get("FP6_ASM") and (d.get("FP6P_R") or not do_row) and (d.get("FP6P_C") or not do_col):
        d["FP6_ASM"] = False  # the FP6 pairs paths do all the work: no 16-byte alignment needed
        consts = tuple(d.items())
    align = 16 if d.get("FP6_ASM") else (4 if d.get("FP4_PAIRS") or d.get("COL_FP4W") or d.get("FP6P_R")
                                         or d.get("FP6P_C") else 0)
    off = ("FP4_PAIRS", "FP6_ASM", "COL_FP4W", "FP6P_R", "FP6P_C")
    unaligned = (align, tuple((k, False if k in off else v) for k, v in consts)) if align else None
    return _QuantizePlan(outs, slots, in_view, grid, ints, consts, cfg.num_warps, scale_t, unaligned, launcher)


def _run_quantize(plan: _QuantizePlan, x: torch.Tensor) -> tuple:
    """Allocate the plan's outputs and launch; returns the uint8 outputs in the plan's order."""
    x = x.contiguous()
    dev = x.device
    outs = [(torch.zeros if zero else torch.empty)(shape, dtype=torch.uint8, device=dev) for shape, zero in plan.outs]
    ptrs = [(outs[i].view(torch.int32) if word else outs[i]) if i >= 0 else None for i, word in plan.slots]
    dummy = ptrs[0] if ptrs[0] is not None else ptrs[2]
    if plan.scale_t is not None:
        tshape, si, rows, cols = plan.scale_t
        ptrs[3] = torch.empty(tshape, dtype=torch.uint8, device=dev)
    ptrs = [p if p is not None else dummy for p in ptrs]
    xv = x.view(plan.in_view) if plan.in_view is not None else x
    consts = plan.consts if plan.unaligned is None or x.data_ptr() % plan.unaligned[0] == 0 else plan.unaligned[1]
    plan.launcher(plan.grid, (xv, *ptrs, *plan.ints), consts, plan.num_warps)
    if plan.scale_t is not None:
        _transpose_bytes(ptrs[3], outs[si].view(rows, cols))
    return tuple(outs)


def _transpose_bytes(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src.T for 2-D uint8 tensors on the GPU (a tiled Triton transpose: torch's strided copy of a
    transposed uint8 view took tens of microseconds for the 8 MB of scales of a 16384^2 problem)."""
    M, N = src.shape
    if src.numel() == 0:
        return
    tiles_n = -(-N // 64)
    _TRANSPOSE((-(-M // 64) * tiles_n,), (src, dst, M, N, tiles_n), (("BLOCK", 64),), 4)


# ---------------------------------------------------------------------------------------------------------
# raw implementations (tensors in, tensors out), wrapped by the custom ops


def _quantize_impl(x, fmt, axis, scale_mode, rounding, scale_layout, cfg=None):
    """x (any rank, float32 / bfloat16 / float16) -> (qdata, scale) quantized along ``axis``."""
    return _run_quantize(_quantize_plan(tuple(x.shape), x.dtype, fmt, axis, scale_mode, rounding, scale_layout,
                                        cfg, _gpu_name(x)), x)


def _cast_transpose_impl(x, fmt, scale_mode, rounding, scale_layout, cfg=None):
    """x [..., M, K] -> (qr [..., M, K packed], sr, qc [..., K, M packed], sc)."""
    return _run_quantize(_quantize_plan(tuple(x.shape), x.dtype, fmt, None, scale_mode, rounding, scale_layout,
                                        cfg, _gpu_name(x)), x)


_OUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@functools.lru_cache(maxsize=4096)
def _dequantize_plan(fmt, axis: int, shape: tuple, dtype: torch.dtype, cfg: Optional[DequantizeConfig]):
    """(kernel output dtype, int16 view?, int32 qdata view?, grid, runtime ints, constexprs, num_warps) of one
    dequantize problem."""
    f = get_format(fmt)
    axis = axis % len(shape)
    L = shape[axis]
    B = math.prod(shape[:axis])
    Q = math.prod(shape[axis + 1 :])
    kdtype = dtype if dtype in _OUT_KIND else torch.float32
    trans = Q > 1
    Bk, N = (B, Q) if trans else (1, B)
    cfg = cfg or dequantize_config(Bk, N, L, trans, f, kdtype)
    tiles_n, tiles_l = -(-N // cfg.block_n), -(-L // cfg.block_l)
    fp4_asm = bool(cfg.fp4_asm and f.is_float and f.bits == 4 and not trans
                   and kdtype in (torch.bfloat16, torch.float16) and hw_dec_ok(cfg, f))
    consts = tuple(dict(
        TRANS=trans, OUT_KIND=_OUT_KIND[kdtype],
        BITS=f.bits, MBITS=f.mbits, EMIN=(f.emin if f.is_float else -6), BIAS=f.bias,
        IS_INT=not f.is_float, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
        BLOCK_N=cfg.block_n, BLOCK_L=cfg.block_l, INT64=cfg.int64,
        MASKED=bool(N % cfg.block_n or L % cfg.block_l),
        LOAD3D=bool(cfg.load3d and not trans and f.bits != 6),
        HW_DEC=hw_dec_ok(cfg, f),
        FP6_WORDS=bool(cfg.fp6_words and f.bits == 6 and not trans and cfg.block_l >= 32),
        SWAP=bool(cfg.fp6_words and cfg.pair_swap and f.bits == 6 and not trans and cfg.block_l >= 32
                  and kdtype != torch.float32 and not _interpret()),
        GROUP_ASM=bool(cfg.fp6_words and cfg.fp6_asm and f.bits == 6 and f.is_float and not trans
                       and cfg.block_l >= 32 and kdtype == torch.bfloat16 and hw_dec_ok(cfg, f)),
        FP4_ASM=fp4_asm,
    ).items())
    return (kdtype, kdtype == torch.bfloat16, f.bits == 6 or fp4_asm, (Bk * tiles_n * tiles_l,),
            (N, L, tiles_n, tiles_l, L // 8), consts, cfg.num_warps)


def _dequantize_impl(qdata, scale, fmt, axis, shape, dtype, cfg=None):
    shape = tuple(shape)
    kdtype, view16, words, grid, ints, consts, num_warps = _dequantize_plan(fmt, axis, shape, dtype, cfg)
    out = torch.empty(shape, dtype=kdtype, device=qdata.device)
    qdata = qdata.contiguous()
    if words and qdata.data_ptr() % 4:
        qdata = qdata.clone()  # the kernel reads FP6 (and FP4 with fp4_asm) as aligned int32 words
    qv = qdata.view(torch.int32) if words else qdata
    ov = out.view(torch.int16) if view16 else out
    _DEQUANTIZE(grid, (qv, scale.contiguous(), ov, *ints), consts, num_warps)
    return out if kdtype == dtype else out.to(dtype)


# ---------------------------------------------------------------------------------------------------------
# torch custom ops (torch.compile traces them as opaque nodes)


def _fake_lead(shape, axis):
    shape = tuple(shape)
    axis = axis % len(shape)
    return shape[:axis] + shape[axis + 1 :], shape[axis]


def _fake_scale(x, lead, nblk, layout):
    if layout == "plain":
        return x.new_empty((*lead, nblk), dtype=torch.uint8)
    rows = math.prod(lead)
    return x.new_empty(scale_layout_shape(rows, nblk, layout), dtype=torch.uint8)


@torch.library.custom_op("mxkit::quantize_mx", mutates_args=())
def _quantize_op(
    x: torch.Tensor, fmt: str, axis: int, scale_mode: str, rounding: str, scale_layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_impl(x, fmt, axis, scale_mode, rounding, scale_layout)


@_quantize_op.register_fake
def _(x, fmt, axis, scale_mode, rounding, scale_layout):
    f = get_format(fmt)
    lead, n = _fake_lead(x.shape, axis)
    q = x.new_empty((*lead, n * f.pack_bytes // f.pack), dtype=torch.uint8)
    return q, _fake_scale(x, lead, n // BLOCK_SIZE, scale_layout)


@torch.library.custom_op("mxkit::cast_transpose_mx", mutates_args=())
def _cast_transpose_op(
    x: torch.Tensor, fmt: str, scale_mode: str, rounding: str, scale_layout: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _cast_transpose_impl(x, fmt, scale_mode, rounding, scale_layout)


@_cast_transpose_op.register_fake
def _(x, fmt, scale_mode, rounding, scale_layout):
    f = get_format(fmt)
    shape = tuple(x.shape)
    M, Kd = shape[-2], shape[-1]
    lead_r, lead_c = shape[:-1], shape[:-2] + (Kd,)
    qr = x.new_empty((*lead_r, Kd * f.pack_bytes // f.pack), dtype=torch.uint8)
    qc = x.new_empty((*lead_c, M * f.pack_bytes // f.pack), dtype=torch.uint8)
    return (qr, _fake_scale(x, lead_r, Kd // BLOCK_SIZE, scale_layout),
            qc, _fake_scale(x, lead_c, M // BLOCK_SIZE, scale_layout))


@torch.library.custom_op("mxkit::dequantize_mx", mutates_args=())
def _dequantize_op(
    qdata: torch.Tensor, scale: torch.Tensor, fmt: str, axis: int, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _dequantize_impl(qdata, scale, fmt, axis, shape, dtype)


@_dequantize_op.register_fake
def _(qdata, scale, fmt, axis, shape, dtype):
    return qdata.new_empty(tuple(shape), dtype=dtype)


def _dispatch(op, impl, *args):
    """The custom op while ``torch.compile`` traces (so graphs see an opaque op with a fake), the plain
    implementation in eager mode: the op's Python dispatch costs ~60 µs per call on the host, more than the
    kernel at activation sizes. Same launcher, same bytes either way."""
    return op(*args) if torch.compiler.is_compiling() else impl(*args)


# ---------------------------------------------------------------------------------------------------------
# public API


def quantize_triton(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    axis: Union[int, Sequence[int]] = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    scale_layout: str = "plain",
) -> Union[MXTensor, tuple[MXTensor, MXTensor]]:
    """Quantize a CUDA tensor to an MX format with the Triton kernels; byte-identical to
    :func:`mxkit.reference.quantize_reference` (data and scales, special blocks included).

    x: CUDA float32 | bfloat16 | float16, any rank >= 1, ``x.shape[axis] % 32 == 0``; any axis.
    axis: an int, or a pair of two different axes for a cast-transpose: returns one MXTensor per axis.
      (last, second-to-last) in either order is one launch that reads x from DRAM about once (a fused kernel,
      or for FP6 from fp32 / fp16 with rows >= 512 one-direction programs whose second read of a region hits
      L2);
      other pairs run two kernels.
    scale_layout: ``"plain"`` -> scale (..., L // 32); ``"nvidia_128x4"`` (cuBLAS blocked layout) or
      ``"aiter_shuffle"`` -> scale 2-D ``scale_layout_shape(rows, L // 32, layout)``, rows = prod(scale's
      leading dims), written directly by the kernel, pad bytes 0 (same bytes as plain +
      :func:`mxkit.layouts.to_layout`).
    Returns MXTensor(s): qdata uint8 (axis moved last; FP4 element 2i in the low nibble, FP6 4 codes per
    3 little-endian bytes), scale uint8 E8M0 (0xFF = NaN block).
    Raises what :func:`mxkit.tensor.check_quantize_args` raises, NotImplementedError for block_size != 32,
    ValueError for a non-CUDA tensor or an unsupported scale_layout.
    """
    if not isinstance(x, torch.Tensor):
        check_quantize_args(x, fmt, -1, block_size, scale_mode, rounding)  # raises the TypeError
    if not isinstance(axis, int) or isinstance(axis, bool):
        axis = tuple(axis)
    # the checks are cached per problem, except while Dynamo traces (it traces neither hash() nor the cache)
    # and for an unhashable argument; the MXTensors are then built with their own checks too
    uncached = torch.compiler.is_compiling()
    key = (tuple(x.shape), x.dtype, fmt, axis, block_size, scale_mode, rounding, scale_layout)
    try:
        hash(key) if not uncached else None
    except TypeError:
        uncached = True
    fused, margs = _check_args(x, *key[2:]) if uncached else _checked(*key)
    _check_device(x)
    mx = MXTensor if uncached else MXTensor._trusted
    if fused:  # the last two dims: one cast-transpose kernel
        nd = x.dim()
        a0, a1 = margs
        qr, sr, qc, sc = _dispatch(
            torch.ops.mxkit.cast_transpose_mx, _cast_transpose_impl,
            x, a0.fmt.name, a0.scale_mode.value, a0.rounding.value, scale_layout,
        )
        mk = {nd - 1: (qr, sr), nd - 2: (qc, sc)}
        return tuple(mx(*mk[a.axis], a.fmt, a.axis, block_size, x.shape, a.scale_mode, a.rounding, scale_layout)
                     for a in margs)
    if len(margs) == 2:  # two other axes: two kernels
        return tuple(
            quantize_triton(x, fmt, axis=a.axis, block_size=block_size, scale_mode=scale_mode,
                            rounding=rounding, scale_layout=scale_layout)
            for a in margs
        )
    (a,) = margs
    q, s = _dispatch(
        torch.ops.mxkit.quantize_mx, _quantize_impl,
        x, a.fmt.name, a.axis, a.scale_mode.value, a.rounding.value, scale_layout,
    )
    return mx(q, s, a.fmt, a.axis, block_size, x.shape, a.scale_mode, a.rounding, scale_layout)


@functools.lru_cache(maxsize=4096)
def _checked(shape: tuple, dtype: torch.dtype, fmt, axis, block_size, scale_mode, rounding, scale_layout):
    """:func:`_check_args` for one problem, cached (the checks depend on nothing else: ~20 us of host time per
    call otherwise); exceptions are not cached."""
    return _check_args(torch.empty(shape, dtype=dtype, device="meta"), fmt, axis, block_size, scale_mode,
                       rounding, scale_layout)


def _check_args(x, fmt, axis, block_size, scale_mode, rounding, scale_layout):
    """The argument checks of :func:`quantize_triton` (x: only its shape and dtype are read). Returns (one fused
    cast-transpose?, QuantizeArgs per axis); raises TypeError / ValueError / NotImplementedError."""
    if isinstance(axis, (tuple, list)):
        if len(axis) != 2:
            raise ValueError(f"axis must be an int or a pair of ints, got {axis!r}")
        a0 = check_quantize_args(x, fmt, axis[0], block_size, scale_mode, rounding)
        a1 = check_quantize_args(x, fmt, axis[1], block_size, scale_mode, rounding)
        if a0.axis == a1.axis:
            raise ValueError(f"the two axes of a cast-transpose must differ, got {axis!r}")
        margs = (a0, a1)
    else:
        margs = (check_quantize_args(x, fmt, axis, block_size, scale_mode, rounding),)
    _check_block_size(block_size)
    _check_layout(scale_layout)
    nd = x.dim()
    return len(margs) == 2 and {a.axis for a in margs} == {nd - 1, nd - 2}, margs


def dequantize_triton(q: MXTensor, dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """Decode an MXTensor on the GPU; byte-identical to :func:`mxkit.reference.dequantize_reference`
    (decode(element) * 2^(scale - 127) rounded once to fp32, then cast with round-to-nearest-even).

    q: MXTensor on CUDA, block_size 32, any axis, any scale layout (non-plain layouts are converted with
    :func:`mxkit.layouts.from_layout` first). dtype: float32 | bfloat16 | float16; float64 is delegated
    to the reference, which multiplies in float64 (an fp32 product would turn MX values above fp32 max
    into Inf). Returns a tensor of ``q.shape``. NaN outputs (scale 0xFF, element NaN codes) are NaN; their
    payload bits are not specified. Raises TypeError for a non-MXTensor / unsupported dtype.
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    dtype = check_out_dtype(dtype)
    if dtype == torch.float64:
        from ..reference import dequantize_reference

        return dequantize_reference(q, dtype)
    _check_block_size(q.block_size)
    _check_device(q.qdata)
    scale = q.plain_scale()
    return _dispatch(torch.ops.mxkit.dequantize_mx, _dequantize_impl,
                     q.qdata, scale, q.fmt.name, q.axis, list(q.shape), dtype)
