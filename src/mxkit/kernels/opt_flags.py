"""The schedule of the quantize / dequantize kernels: frozen configs (tiles, warps and the few real algorithm
choices) chosen by pure functions of the problem (:mod:`mxkit.kernels.opt_flags_nvidia`), with a per-GPU
table of measured exceptions (:data:`GPU_TUNING`, immutable) and an explicit override for A/B runs
(:func:`override`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from ..formats import FormatLike, get_format

__all__ = ["QuantizeConfig", "DequantizeConfig", "TuningEntry", "GPU_TUNING", "quantize_config",
           "dequantize_config", "override", "needs_int64"]

_INT32_LIMIT = 2**31 - 1


def needs_int64(*extents: int) -> bool:
    """True when an element offset could pass 2^31 - 1: ``extents`` are the (tile-padded) element counts
    of every tensor a kernel addresses. Pure function of shapes (tested without allocating)."""
    return max(extents) > _INT32_LIMIT


def _tiles_need_int64(B: int, R: int, C: int, span_r: int, span_c: int) -> bool:
    """:func:`needs_int64` of x viewed [B, R, C] padded to whole spans of span_r x span_c (a program's rows and
    columns)."""
    return needs_int64(B * (-(-R // span_r) * span_r) * (-(-C // span_c) * span_c))


@dataclass(frozen=True)
class QuantizeConfig:
    """Tile of one quantize program: ``[block_r, block_c]`` elements of the ``[B, R, C]`` view, and its paths:
    those asked for, or once resolved for one problem (``resolved``), those that run.

    The kernel follows from the problem and the resolved fields (:mod:`mxkit.kernels.quantize_details`): rowwise
    ``_quantize_rows_kernel``; columnwise ``_quantize_cols_kernel`` (FP4: codes packed into words before the
    transpose; the other formats: whole packed units per thread); cast-transpose ``_cast_transpose_kernel``
    (col_units), ``_cast_transpose_tile_kernel`` (no col_units: one raw tile for both halves) or, for FP6,
    ``_cast_transpose_split_kernel`` (split_rows)."""

    block_r: int
    block_c: int
    num_warps: int
    int64: bool
    # FP8 / FP6 elements (RNE only) through the hardware cvt.rn.satfinite.{e4m3,e5m2}x2, FP4 from bf16 through
    # bf16x2 arithmetic (inline asm; ignored for MXINT8, for AWAY rounding, under the CPU interpreter, which cannot
    # run inline asm, and by the cast-transpose tile kernel); FP8 codes are then made and masked 4 to a word
    hw_cvt: bool = False
    # the cast-transpose tile kernel: > 0 = program order in strips of group_c column tiles walked down R (0: C
    # fastest)
    group_c: int = 0
    # rowwise and the cast-transpose with col_units: each program walks rblocks tiles down R
    rblocks: int = 1
    # blocks along R, plain scale layout: the kernel writes the scales transposed ([R / 32, B * C], so a
    # program's bytes of one block row are contiguous) and a tiled byte transpose moves them into place
    scale_t: bool = False
    # rowwise FP4 from bf16 with hw_cvt (the fused cast-transpose: with col_fp4_words): the input read as bf16
    # pairs (32-bit words), each pair rounded straight into its packed byte (_rows_fp4_pairs); skipped for an
    # input address not a multiple of 4
    fp4_pairs: bool = False
    # columnwise FP4: 64-bit packed units (16 codes), half the transposed elements
    col_wide: bool = False
    # FP4 columns from bf16 with hw_cvt (C even): the tile read as bf16 pairs of adjacent columns, one asm per pair
    # rounding and packing both columns' units (columnwise: _cols_fp4_words; the fused cast-transpose, with
    # fp4_pairs: _cols_fp4_units); skipped for an input address not a multiple of 4
    col_fp4_words: bool = False
    # the cast-transpose: 2 = the columns as whole packed units per thread from 2-element loads (_cols_units),
    # the rows' load of the tile evict_last and the columns' reload evict_first (_cast_transpose_kernel); 0 = one
    # raw tile for both halves (_cast_transpose_tile_kernel). Resolved for the columnwise and split paths too
    # (FP4 columns: 0, the other formats: 2), whose column path follows from the format
    col_units: int = 0
    # FP6 with hw_cvt (rowwise, columnwise, the split cast-transpose): one inline asm per 16-element unit rounds
    # through the FP8 cvt, saturates, moves the signs and packs the three words (_codecs._fp6_units_asm)
    fp6_asm: bool = False
    # FP6 cast-transpose only: (row_block_r, row_block_c, row_rblocks) = programs doing one direction each
    # (_cast_transpose_split_kernel): regions of block_r x row_block_c, each cut into row programs of
    # row_rblocks tiles of row_block_r x row_block_c and column programs of block_r x block_c tiles; () = a fused
    # kernel
    split_rows: tuple = ()
    # rowwise FP6: each row's group words stored as one [groups, rows, 4] tile (words 0, 1, 2 and a masked copy
    # of word 2), so a warp's store runs along (word, group) of a row (_store_group_words); always on in the
    # fused cast-transpose with col_units
    fp6_store4: bool = False
    # FP6 from bf16 with hw_cvt: rows (and in the fused cast-transpose the col_units columns, C even) read as
    # bf16 pairs (32-bit words), the amax on the pairs, and one asm per unit that clamps in bf16x2, scales, rounds
    # through the FP8 cvt and packs (_codecs._fp6_pairs_asm); skipped for an input address not a multiple of 4
    fp6_pairs: bool = False
    # columnwise and the cast-transpose with col_units: a (tiles_c, tiles_r, B) grid where tiles_r and B fit its
    # 65535 limit: the program ids are the tile indices, no division of a 1-D id (_common._tile_ids)
    grid3: bool = False
    # --- set by resolution (:func:`mxkit.kernels.opt_flags_nvidia.resolve_quantize`, which quantize_config runs
    # when given the input dtype and rounding): True = every field above is the path that runs for that one
    # problem (the flags that do not apply are False / 0; hw_cvt, fp6_asm, fp4_pairs, col_fp4_words only where
    # the hardware convert runs), and the fields below are set. The plan reads fields only.
    resolved: bool = False
    # the hardware convert of the row / column direction (the split cast-transpose's row programs check their
    # own tile; elsewhere both equal hw_cvt)
    hw_cvt_rows: bool = False
    hw_cvt_cols: bool = False
    # FP6 from bf16 pairs (fp6_pairs) in the rows and in the columns (the fused cast-transpose, C even)
    fp6_pairs_rows: bool = False
    fp6_pairs_cols: bool = False


@dataclass(frozen=True)
class DequantizeConfig:
    """Tile of one dequantize program: ``[block_n, block_l]`` elements (block_l along the quantized dim). The
    kernel: ``_dequantize_rows_kernel`` (blocks along the contiguous dim; FP6 whole 16-code groups per thread,
    FP8 / FP4 [n, l // 32, 32] tiles, MXINT8 2-D tiles) or ``_dequantize_cols_kernel`` (the output transposed)."""

    block_n: int
    block_l: int
    num_warps: int
    int64: bool
    # FP8 / FP6 / FP4 through the hardware FP8 -> fp16 cvt (inline asm; ignored for MXINT8 and under the
    # CPU interpreter)
    hw_dec: bool = False
    # rowwise FP6 to a 16-bit output: lane pairs swap half groups so every store writes whole 32-byte sectors
    # (inline-asm shuffles; ignored for fp32 output, whose 8-element halves are whole sectors, and under the CPU
    # interpreter)
    pair_swap: bool = False
    # rowwise FP6 to bf16 with hw_dec: each 16-code group decoded by one inline asm (bytes spread 4 at a time,
    # FP8 -> fp16 cvt, fp32 scale multiply, bf16x2 cvt; _codecs._fp6_group_decode_asm)
    fp6_asm: bool = False
    # rowwise FP4 to bf16 / fp16 with hw_dec: qdata read as int32 words, each word's 8 codes decoded straight to
    # bf16 / fp16 pairs by one inline asm (integer placement + two bf16x2 multiplies; _codecs._fp4_word_decode_asm)
    fp4_asm: bool = False
    # set by resolution (:func:`mxkit.kernels.opt_flags_nvidia.resolve_dequantize`, which dequantize_config runs
    # unless resolve=False): True = every field above is the path that runs for that one problem (the flags that
    # do not apply are False); the plan reads fields only
    resolved: bool = False


_PATHS = ("rows", "cols", "cast_transpose")  # TuningEntry.path: quantize_config's problem kinds


@dataclass(frozen=True)
class TuningEntry:
    """A setting one GPU measured faster where the other measured it slower: on GPUs whose CUDA device name
    (``torch.cuda.get_device_name``) is ``gpu`` (exactly: other parts of a family were not measured), problems of
    ``path`` ("rows" / "cols" /
    "cast_transpose") in format ``fmt`` with at least ``min_elements`` elements (B * R * C) take ``fields``
    ((QuantizeConfig field, value) pairs) in place of the heuristic's."""

    gpu: str
    path: str
    fmt: str
    min_elements: int
    fields: tuple


# Keyed by the SXM parts' full names, matched exactly (:func:`_gpu_tuned`): the PCIe / NVL parts (other memory,
# other clocks) were not measured and take the heuristics alone.
GPU_TUNING: tuple = (
    # the fused FP4 cast-transpose walking two 64 x 256 tiles per program: faster on the H200 only
    TuningEntry(gpu="NVIDIA H200", path="cast_transpose", fmt="mxfp4_e2m1", min_elements=1 << 26,
                fields=(("rblocks", 2),)),
    # the fused FP8 cast-transpose on 64 x 256 tiles, eight warps: faster on the H100 only
    *(TuningEntry(gpu="NVIDIA H100 80GB HBM3", path="cast_transpose", fmt=name, min_elements=1 << 26,
                  fields=(("block_r", 64), ("num_warps", 8)))
      for name in ("mxfp8_e4m3", "mxfp8_e5m2")),
    # rowwise FP4 / FP6 with one tile per program at every size: faster on the H100 only
    *(TuningEntry(gpu="NVIDIA H100 80GB HBM3", path="rows", fmt=name, min_elements=0, fields=(("rblocks", 1),))
      for name in ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2")),
)


@dataclass(frozen=True)
class _Override:
    table: tuple = GPU_TUNING
    quantize: tuple = ()  # (QuantizeConfig field, value) pairs forced on every chosen config
    dequantize: tuple = ()  # the same for DequantizeConfig


_active = _Override()  # replaced only by override(), which clears every cache that holds a config
_config_caches: list = []  # cache_clear functions of the caches built on these configs (the launchers' plans)


def register_cache(cache_clear) -> None:
    """Registers a cache of plans built on chosen configs, cleared when :func:`override` changes the choice."""
    _config_caches.append(cache_clear)


def _clear_caches() -> None:
    quantize_config.cache_clear()
    dequantize_config.cache_clear()
    for clear in _config_caches:
        clear()


@contextlib.contextmanager
def override(*, table: Optional[tuple] = None, quantize: Optional[dict] = None,
             dequantize: Optional[dict] = None) -> Iterator[None]:
    """For A/B runs: within the ``with`` block, ``table`` (a tuple of :class:`TuningEntry`) replaces
    :data:`GPU_TUNING`, and the ``quantize`` / ``dequantize`` field values replace those of every chosen config
    (``int64`` re-derived for the new tiles). The config and plan caches are cleared on entry and on exit, and
    the block takes a dispatch-table token of its own (the GEMMs' prepared calls, whose bound dequantize launches
    carry a config, are made again inside it and kept apart), so no call sees a stale config. Raises on entry:
    TypeError for an unknown field name, a field only resolution sets, or a table item that is not a
    TuningEntry; ValueError for a value the kernels cannot take (tiles and warps not powers of two, ``rblocks``
    < 1, a bool field given a non-bool, ...), for a TuningEntry path other than rows / cols / cast_transpose or an
    unknown format (an alias, e.g. ``"mxfp4"``, is taken as its format). Not thread-safe (one A/B run at a time).

        with opt_flags.override(quantize={"rblocks": 1}):
            y = quantize_triton(x, "mxfp4_e2m1")
    """
    global _active
    if quantize and isinstance(quantize.get("split_rows"), list):  # (as JSON gives it: scripts/ab.py)
        quantize = {**quantize, "split_rows": tuple(quantize["split_rows"])}
    for cls, given in ((QuantizeConfig, quantize), (DequantizeConfig, dequantize)):
        _check_fields(cls, dict(given or {}))
    table = GPU_TUNING if table is None else tuple(table)
    entries = []
    for e in table:
        if not isinstance(e, TuningEntry):
            raise TypeError(f"table must hold TuningEntry items, got {type(e).__name__}")
        _check_fields(QuantizeConfig, dict(e.fields))
        if e.path not in _PATHS:  # (a typo'd path or an alias of a format never matched: the entry did nothing)
            raise ValueError(f"TuningEntry.path must be one of {', '.join(_PATHS)}, got {e.path!r}")
        entries.append(dataclasses.replace(e, fmt=get_format(e.fmt).name))
    table = tuple(entries)
    new = _Override(table=table, quantize=tuple((quantize or {}).items()),
                    dequantize=tuple((dequantize or {}).items()))
    from .matmul_table import _TOKEN, _tokens

    prev = _active
    token = _TOKEN.set(next(_tokens))
    try:  # (state and caches change inside the try: an exception on the way in restores both too)
        _active = new
        _clear_caches()
        yield
    finally:
        _TOKEN.reset(token)
        _active = prev
        _clear_caches()


# the fields a forced value may take (field -> test, what it must be); the others are bools. ``resolved`` and the
# fields resolution sets are not forced: the plan would read paths that were never checked for the problem
_POW2 = (lambda v: v >= 1 and v & (v - 1) == 0, "a power of two")
_FIELD_VALUES = {
    "block_r": _POW2, "block_c": _POW2, "block_n": _POW2, "block_l": _POW2,
    "num_warps": (lambda v: v in (1, 2, 4, 8, 16, 32), "1, 2, 4, 8, 16 or 32"),
    "rblocks": (lambda v: v >= 1, ">= 1"),
    "group_c": (lambda v: v >= 0, ">= 0"),
    "col_units": (lambda v: v in (0, 2), "0 or 2"),
}
_RESOLVED_ONLY = {"resolved", "hw_cvt_rows", "hw_cvt_cols", "fp6_pairs_rows", "fp6_pairs_cols"}


def _check_fields(cls, given: dict) -> None:
    """Raises TypeError for a name that is not a field of cls (or one only resolution sets), ValueError for a value
    the kernels cannot take (a tile that is not a power of two, a bool where an int is due, ...)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(given) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    fixed = set(given) & _RESOLVED_ONLY
    if fixed:
        raise TypeError(f"{cls.__name__} fields {sorted(fixed)} are set by resolution, not forced")
    for name, v in given.items():
        if name == "split_rows":
            ok = v == () or (isinstance(v, tuple) and len(v) == 3 and all(type(n) is int and n >= 1 for n in v)
                             and all(n & (n - 1) == 0 for n in v[:2]))
            what = "() or a tuple (row_block_r, row_block_c: powers of two, row_rblocks >= 1)"
        elif name in _FIELD_VALUES:
            test, what = _FIELD_VALUES[name]
            ok = type(v) is int and test(v)
            what = f"an int, {what}"
        else:
            ok, what = type(v) is bool, "a bool"
        if not ok:
            raise ValueError(f"{cls.__name__}.{name} must be {what}, got {v!r}")


def _replace(cfg: QuantizeConfig, fields, B: int, R: int, C: int) -> QuantizeConfig:
    """cfg with fields replaced and int64 re-derived for the new tile span."""
    cfg = dataclasses.replace(cfg, **dict(fields))
    span_c = cfg.split_rows[1] if cfg.split_rows else cfg.block_c
    return dataclasses.replace(cfg, int64=cfg.int64 or _tiles_need_int64(B, R, C, cfg.block_r * cfg.rblocks, span_c))


def _gpu_tuned(cfg: QuantizeConfig, table: tuple, gpu: str, path: str, fmt_name: str, B: int, R: int,
               C: int) -> QuantizeConfig:
    """cfg with the entries of table that match (gpu, path, format, size) applied."""
    for e in table:
        if gpu == e.gpu and e.path == path and e.fmt == fmt_name and B * R * C >= e.min_elements:
            cfg = _replace(cfg, e.fields, B, R, C)
    return cfg


@functools.lru_cache(maxsize=1024)  # pure function of the problem (and of override()'s state, which clears it)
def quantize_config(B: int, R: int, C: int, do_row: bool, do_col: bool, fmt: FormatLike, *,
                    in_bf16: bool = True, gpu: str = "", dtype: Optional[torch.dtype] = None,
                    rounding=None, scale_layout: str = "plain", asm: bool = True) -> QuantizeConfig:
    """The config of x viewed [B, R, C], blocks along C (do_row) and / or along R (do_col); in_bf16: bfloat16
    input (dtype, when given, decides it); gpu: the CUDA device name (:data:`GPU_TUNING`'s key). Heuristics:
    :func:`mxkit.kernels.opt_flags_nvidia.quantize_flags`. Given the input ``dtype`` and the ``rounding``, the
    config is resolved (:func:`mxkit.kernels.opt_flags_nvidia.resolve_quantize`: its fields are the paths that
    run for that problem, written with ``scale_layout``; asm: False under the CPU interpreter, which cannot run
    inline asm)."""
    from .opt_flags_nvidia import quantize_flags, resolve_quantize  # (it imports the config classes from here)

    f = get_format(fmt)
    if dtype is not None:
        in_bf16 = dtype == torch.bfloat16
    cfg = quantize_flags(B, R, C, do_row, do_col, f, in_bf16)
    path = ("cast_transpose" if do_row else "cols") if do_col else "rows"
    cfg = _gpu_tuned(cfg, _active.table, gpu, path, f.name, B, R, C)
    cfg = _replace(cfg, _active.quantize, B, R, C) if _active.quantize else cfg
    if dtype is None or rounding is None:
        return cfg
    return resolve_quantize(cfg, B, R, C, do_row, do_col, f, dtype, rounding, scale_layout, asm=asm)


@functools.lru_cache(maxsize=1024)
def dequantize_config(B: int, N: int, L: int, trans: bool, fmt: FormatLike,
                      out_dtype: torch.dtype = torch.bfloat16, *, resolve: bool = False,
                      asm: bool = True) -> DequantizeConfig:
    """The config of qdata viewed [B, N, L] decoded to ``out_dtype`` (trans: blocks along N's rows, the output
    transposed). Heuristics: :func:`mxkit.kernels.opt_flags_nvidia.dequantize_flags`. resolve: the fields made
    the paths that run (:func:`mxkit.kernels.opt_flags_nvidia.resolve_dequantize`; asm: False under the CPU
    interpreter)."""
    from .opt_flags_nvidia import dequantize_flags, resolve_dequantize

    f = get_format(fmt)
    cfg = dequantize_flags(B, N, L, trans, f, out_dtype)
    if _active.dequantize:
        cfg = dataclasses.replace(cfg, **dict(_active.dequantize))
        cfg = dataclasses.replace(cfg, int64=cfg.int64 or _tiles_need_int64(B, N, L, cfg.block_n, cfg.block_l))
    return resolve_dequantize(cfg, trans, f, out_dtype, asm=asm) if resolve else cfg
