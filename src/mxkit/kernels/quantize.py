"""MX quantize / dequantize on the GPU (Triton, Hopper sm_90 and later): launchers and torch custom ops.

Host side: validation, plan, launch, custom ops and the public entry. The jit bodies live in
:mod:`mxkit.kernels.quantize_details`, the configs and their heuristics in :mod:`mxkit.kernels.opt_flags`, the
direct launch in :mod:`mxkit.kernels.launch`. The specification they match byte for byte is
:mod:`mxkit.reference` (``quantize_reference`` / ``dequantize_reference``).

Every call views the input as ``[B, R, C]`` with C contiguous:

* ``axis`` = last dim: ``B = 1``, ``R = prod(other dims)``, ``C = shape[axis]``; blocks of 32 run along C.
* ``axis`` = any other dim: ``B = prod(dims before)``, ``R = shape[axis]``, ``C = prod(dims after)``; the
  kernel loads ``[BLOCK_R, BLOCK_C]`` tiles coalesced along C and packs the codes of each 32-row block before
  the transpose, so the output (MXTensor keeps the quantized axis last) is written contiguously.
* cast-transpose ``axis=(last, second-to-last)`` (either order): ``[B, M, K]``; both copies in one launch, x read
  from DRAM about once (fused per tile, or FP6 programs of one direction sharing regions through L2).

One kernel per algorithm (:mod:`mxkit.kernels.quantize_details`): rowwise ``_quantize_rows_kernel``, columnwise
``_quantize_cols_kernel``, cast-transpose ``_cast_transpose_kernel`` / ``_cast_transpose_tile_kernel`` /
``_cast_transpose_split_kernel``, dequantize ``_dequantize_rows_kernel`` / ``_dequantize_cols_kernel``; the
format is one constexpr (:class:`~mxkit.kernels.quantize_details._common.ElementSpec`).

Custom ops ``mxkit::quantize_mx``, ``mxkit::cast_transpose_mx``, ``mxkit::dequantize_mx`` return raw
tensors, so ``torch.compile(fullgraph=True)`` traces through them; MXTensor is built outside the ops.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Union

import torch

from ..formats import BLOCK_SIZE, ElementFormat, FormatLike, Rounding, ScaleMode, get_format
from .. import layouts
from ..layouts import KERNEL_LAYOUT_IDS, scale_layout_shape
from ..tensor import MXTensor, as_int, check_out_dtype, check_quantize_args
from . import opt_flags
from . import launch as _launch
from ._env import interpreting
from .cuda_driver import fast_call_loaded
from .launch import _Launcher
from .opt_flags import DequantizeConfig, QuantizeConfig, dequantize_config, needs_int64, quantize_config
from .opt_flags_nvidia import _pow2, resolve_dequantize, resolve_quantize
from .quantize_details import _cast_transpose, _cols, _dequantize, _fp8_rowwise, _rows
from .quantize_details._common import element_spec

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


KERNEL_SCALE_LAYOUTS = KERNEL_LAYOUT_IDS  # layouts the quantize kernel writes directly (mxkit.layouts' registry)
_LAYOUT_PLAIN_T = layouts.plain.KERNEL_ID_T  # a plain scale written transposed (the scale_t path)
_MODE = {ScaleMode.FLOOR: 0, ScaleMode.CEIL: 1, ScaleMode.RCEIL: 2, ScaleMode.EVEN: 3}
_INT32_LIMIT = 2**31 - 1
_GRID_YZ_LIMIT = 65535  # CUDA's limit of launch grid dims 1 and 2 (dim 0: 2^31 - 1)


def _grid(n_fast: int, n_mid: int, batch: int, grid3: bool) -> tuple:
    """(launch grid, GRID3) of batch x n_mid x n_fast tiles: (n_fast, n_mid, batch) when grid3 and the two slow
    dims fit CUDA's 65535 limit of grid dims 1 and 2, else the 1-D (batch * n_mid * n_fast,) that the kernel
    splits itself (:func:`mxkit.kernels.quantize_details._common._tile_ids`)."""
    if grid3 and n_fast <= _INT32_LIMIT and n_mid <= _GRID_YZ_LIMIT and batch <= _GRID_YZ_LIMIT:
        return (n_fast, n_mid, batch), True
    return (batch * n_mid * n_fast,), False


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


# ---------------------------------------------------------------------------------------------------------
# helpers


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not interpreting():
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


_ROWS = _Launcher(_rows, "_quantize_rows_kernel")
_COLS = _Launcher(_cols, "_quantize_cols_kernel")
_CT = _Launcher(_cast_transpose, "_cast_transpose_kernel")
_CT_TILE = _Launcher(_cast_transpose, "_cast_transpose_tile_kernel")
_CT_SPLIT = _Launcher(_cast_transpose, "_cast_transpose_split_kernel")
_DEQUANT_ROWS = _Launcher(_dequantize, "_dequantize_rows_kernel")
_DEQUANT_COLS = _Launcher(_dequantize, "_dequantize_cols_kernel")
_TRANSPOSE = _Launcher(_cast_transpose, "_transpose_bytes_kernel")


class _QuantizePlan:
    """Everything about one quantize call that depends only on the problem (shape, dtype, format, axis,
    modes, layout, config): computed once per problem (:func:`_quantize_plan`, cached), so a call only
    allocates and launches.

    outs: (shape, zero-filled) of each uint8 output, in return order; slots: for the kernel's output pointers
    (q, s, or qr, sr, qc, sc), (output index, int32 view); ints: the kernel's runtime ints; scale_t: None or
    (transposed scale shape, output index, rows, cols) of the column scale (the last slot) written transposed;
    unaligned: None or (alignment in bytes, the constexprs for an input whose address is not a multiple of it:
    PAIRS reads bf16 pairs as 32-bit words (4), FP6_ASM needs Triton's 16-byte vectors (16)); launcher: the
    kernel's _Launcher."""

    __slots__ = ("outs", "slots", "in_view", "grid", "ints", "consts", "num_warps", "scale_t", "unaligned",
                 "launcher", "bound", "fast")

    def __init__(self, outs, slots, in_view, grid, ints, consts, num_warps, scale_t, unaligned, launcher):
        self.outs, self.slots, self.in_view, self.grid = outs, slots, in_view, grid
        self.ints, self.consts, self.num_warps, self.scale_t = ints, consts, num_warps, scale_t
        self.unaligned, self.launcher = unaligned, launcher
        # (device index, x 16-byte aligned, x aligned for the plan's constexprs) -> the bound direct launch of
        # that specialisation (launch.py), or False where it cannot be made
        self.bound = {}
        # the same key -> the C++ fast call of that bound launch (outputs allocated and the kernel launched in one
        # call from Python: cuda_driver.BoundLaunch.with_outputs), where it is loaded
        self.fast = {}


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
        colsp_r, colsp_c = _cols_padded(Kd // BLOCK_SIZE, scale_layout), _cols_padded(M // BLOCK_SIZE, scale_layout)
    else:
        axis = axis % len(shape)
        L, Q = shape[axis], math.prod(shape[axis + 1 :])
        outs = _out_shapes(shape, axis, f, scale_layout)
        cols_p = _cols_padded(L // BLOCK_SIZE, scale_layout)
        if Q == 1:  # rowwise: [1, B, L]
            B, R, C, do_row, do_col = 1, math.prod(shape[:axis]), L, True, False
        else:  # columnwise: [B, L, Q], blocks along L
            B, R, C, do_row, do_col = math.prod(shape[:axis]), L, Q, False, True
    asm = not interpreting()
    if cfg is None:
        cfg = quantize_config(B, R, C, do_row, do_col, f, gpu=gpu, dtype=dtype, rounding=rnd,
                              scale_layout=scale_layout, asm=asm)
    else:  # a config given by the caller (tests, A/B variants): the paths it asks for that can run
        cfg = resolve_quantize(cfg, B, R, C, do_row, do_col, f, dtype, rnd, scale_layout, asm=asm)
    fmt_consts = (("IN_KIND", in_kind), ("FMT", element_spec(f)), ("MODE", _MODE[mode]),
                  ("AWAY", rnd is Rounding.AWAY))
    tiles_r, tiles_c = -(-R // (cfg.block_r * cfg.rblocks)), -(-C // cfg.block_c)
    masked = bool(R % (cfg.block_r * cfg.rblocks) or C % cfg.block_c)
    tile = (("BLOCK_R", cfg.block_r), ("BLOCK_C", cfg.block_c))
    scale_t = None
    lay_c = lay
    if cfg.scale_t:
        # columnwise scales written transposed ([R / 32, B * C]: each program's bytes for one block row are
        # contiguous), then transposed into place by a tiled byte transpose (1/32 of the data)
        scale_t = ((R // 32, B * C), len(outs) - 1, B * C, R // 32)
        lay_c, colsp_c = _LAYOUT_PLAIN_T, B * C  # (colsp_c: the transposed scale's row length)
        cols_p = colsp_c
    if do_row and not do_col:
        slots = ((0, f.bits == 6), (1, False))
        consts = (("LAYOUT", lay),) + fmt_consts + (
            ("HW_CVT", cfg.hw_cvt), ("PAIRS", cfg.fp4_pairs or cfg.fp6_pairs_rows), ("FP6_ASM", cfg.fp6_asm),
            ("FP6_ST4", cfg.fp6_store4)) + tile + (("RB", cfg.rblocks), ("INT64", cfg.int64), ("MASKED", masked))
        ints, grid, launcher = (R, C, tiles_r, tiles_c, cols_p), (tiles_r * tiles_c,), _ROWS
    elif do_col and not do_row:
        slots = ((0, True), (1, False))  # (the column data is written as int32 words)
        grid, grid3 = _grid(tiles_c, tiles_r, B, cfg.grid3)
        consts = (("LAYOUT", lay_c),) + fmt_consts + (
            ("HW_CVT", cfg.hw_cvt), ("PAIRS", cfg.col_fp4_words), ("FP6_ASM", cfg.fp6_asm), ("WIDE", cfg.col_wide)
        ) + tile + (("INT64", cfg.int64), ("MASKED", masked), ("GRID3", grid3))
        ints, launcher = (R, C, tiles_r, tiles_c, cols_p), _COLS
    else:
        slots = ((0, f.bits == 6), (1, False), (2, f.bits == 6 or bool(cfg.col_units)), (3, False))
        ints = (R, C, tiles_r, tiles_c, colsp_r, colsp_c)
        lays = (("LAYOUT_R", lay), ("LAYOUT_C", lay_c))
        if cfg.split_rows:
            # cast-transpose by one-direction programs over regions of block_r x row_block_c (see the kernel)
            rbr, rbc, rrb = cfg.split_rows
            regions_r, regions_c = -(-R // cfg.block_r), -(-C // rbc)
            consts = lays + fmt_consts + (
                ("ROW_BR", rbr), ("ROW_BC", rbc), ("ROW_RB", rrb), ("ROW_HW", cfg.hw_cvt_rows),
                ("COL_BR", cfg.block_r), ("COL_BC", cfg.block_c), ("COL_HW", cfg.hw_cvt_cols), ("FP6_ASM", cfg.fp6_asm),
                ("INT64", cfg.int64), ("MASKED", bool(R % cfg.block_r or C % rbc)))
            ints = (R, C, regions_r, regions_c, colsp_r, colsp_c)
            grid = (B * regions_r * regions_c * (cfg.block_r // (rbr * rrb) + rbc // cfg.block_c),)
            launcher = _CT_SPLIT
        elif cfg.col_units:
            grid, grid3 = _grid(tiles_c, tiles_r, B, cfg.grid3)
            consts = lays + fmt_consts + (
                ("HW_CVT", cfg.hw_cvt), ("PAIRS", cfg.fp4_pairs or cfg.fp6_pairs_rows)) + tile + (
                ("RB", cfg.rblocks), ("INT64", cfg.int64), ("MASKED", masked), ("GRID3", grid3))
            launcher = _CT
        else:
            consts = lays + fmt_consts + (("GROUP_C", cfg.group_c),) + tile + (
                ("INT64", cfg.int64), ("MASKED", masked))
            grid, launcher = (B * tiles_r * tiles_c,), _CT_TILE
    # inputs at an address that is not a multiple of 4 (PAIRS: bf16 pairs read as 32-bit words) / 16 bytes
    # (FP6_ASM: Triton vectorises the loads only from 16-byte-aligned pointers) take the paths without
    named = dict(consts)
    align = 16 if named.get("FP6_ASM") else (4 if named.get("PAIRS") else 0)
    unaligned = (align, tuple((k, False if k in ("PAIRS", "FP6_ASM") else v) for k, v in consts)) if align else None
    return _QuantizePlan(outs, slots, in_view, grid, ints, consts, cfg.num_warps, scale_t, unaligned, launcher)


def _run_quantize(plan: _QuantizePlan, x: torch.Tensor) -> tuple:
    """Allocate the plan's outputs and launch; returns the uint8 outputs in the plan's order. After the first
    launch of a specialisation (device, x's alignment) the later ones go through its bound direct launch
    (:meth:`mxkit.kernels.launch._Launcher.bind`): the same kernel, the same arguments."""
    x = x.contiguous().resolve_neg()  # (a negative-bit view: its memory holds -x, which the kernels read raw)
    p = x.data_ptr()
    aligned = plan.unaligned is None or p % plan.unaligned[0] == 0
    key = (x.get_device(), p % 16 == 0, aligned)
    fast = plan.fast.get(key)
    if fast is not None and _launch._enabled:
        return fast(x)
    dev = x.device
    outs = [(torch.zeros if zero else torch.empty)(shape, dtype=torch.uint8, device=dev) for shape, zero in plan.outs]
    bound = _launch.bound_launch(plan.bound, key)
    if bound:  # (outputs: fresh allocations, 16-byte aligned like the kernel's)
        if plan.scale_t is None:
            bound.run(x, *[outs[i] for i, _ in plan.slots])
            if fast_call_loaded():
                fast = bound.with_outputs((0, *[-1 - i for i, _ in plan.slots]),
                                          [(shape, torch.uint8, zero) for shape, zero in plan.outs], 1)
                if fast is not None:
                    plan.fast[key] = fast
        else:  # the kernel writes the column scale transposed into a scratch buffer, then the byte transpose
            main, transpose = bound
            tmp = torch.empty(plan.scale_t[0], dtype=torch.uint8, device=dev)
            main.run(x, *[outs[i] for i, _ in plan.slots[:-1]], tmp)
            transpose.run(tmp, outs[plan.scale_t[1]])
        return tuple(outs)
    ptrs = [outs[i].view(torch.int32) if word else outs[i] for i, word in plan.slots]
    if plan.scale_t is not None:
        tshape, si, rows, cols = plan.scale_t
        ptrs[-1] = torch.empty(tshape, dtype=torch.uint8, device=dev)
    xv = x.view(plan.in_view) if plan.in_view is not None else x
    consts = plan.consts if aligned else plan.unaligned[1]
    args = (xv, *ptrs, *plan.ints)
    plan.launcher(plan.grid, args, consts, plan.num_warps)
    if plan.scale_t is None:
        plan.launcher.bind_once(plan.bound, key, key[0], plan.grid, args, consts, plan.num_warps)
        return tuple(outs)
    t_launch = _transpose_bytes(ptrs[-1], outs[si].view(rows, cols))
    _launch.bind_once_all(plan.bound, key, key[0], ((plan.launcher, plan.grid, args, consts, plan.num_warps),
                                                   (_TRANSPOSE, *t_launch) if t_launch else None))
    return tuple(outs)


def _transpose_bytes(src: torch.Tensor, dst: torch.Tensor) -> Optional[tuple]:
    """dst = src.T for 2-D uint8 tensors on the GPU (a tiled Triton transpose: torch's strided copy of a
    transposed uint8 view took tens of microseconds for the 8 MB of scales of a 16384^2 problem). Returns the
    launch's (grid, args, consts, num_warps), None when there was nothing to move."""
    M, N = src.shape
    if src.numel() == 0:
        return None
    tiles_n = -(-N // 64)
    launch = ((-(-M // 64) * tiles_n,), (src, dst, M, N, tiles_n), (("BLOCK", 64),), 4)
    _TRANSPOSE(*launch)
    return launch


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


class _DequantizePlan(tuple):
    """(kernel output dtype, int16 view?, int32 qdata view?, grid, runtime ints, constexprs, num_warps, launcher)
    of one dequantize problem; ``bound``: (device index, qdata and scale 16-byte aligned) -> the bound direct
    launch of that specialisation, or False (as :class:`_QuantizePlan`'s)."""

    def __new__(cls, fields: tuple):
        plan = super().__new__(cls, fields)
        plan.bound, plan.fast = {}, {}  # (fast: the C++ fast calls of the bound launches, as _QuantizePlan's)
        return plan


@functools.lru_cache(maxsize=4096)
def _dequantize_plan(fmt, axis: int, shape: tuple, dtype: torch.dtype, cfg: Optional[DequantizeConfig]):
    """The :class:`_DequantizePlan` of one dequantize problem."""
    f = get_format(fmt)
    axis = axis % len(shape)
    L = shape[axis]
    B = math.prod(shape[:axis])
    Q = math.prod(shape[axis + 1 :])
    kdtype = dtype if dtype in _OUT_KIND else torch.float32
    trans = Q > 1
    Bk, N = (B, Q) if trans else (1, B)
    asm = not interpreting()
    if cfg is None:
        cfg = dequantize_config(Bk, N, L, trans, f, kdtype, resolve=True, asm=asm)
    else:  # a config given by the caller (tests): the paths it asks for that can run
        cfg = resolve_dequantize(cfg, trans, f, kdtype, asm=asm)
    tiles_n, tiles_l = -(-N // cfg.block_n), -(-L // cfg.block_l)
    consts = (("OUT_KIND", _OUT_KIND[kdtype]), ("FMT", element_spec(f)), ("HW_DEC", cfg.hw_dec))
    tile = (("BLOCK_N", cfg.block_n), ("BLOCK_L", cfg.block_l), ("INT64", cfg.int64),
            ("MASKED", bool(N % cfg.block_n or L % cfg.block_l)))
    if trans:
        ints, launcher = (N, L, tiles_n, tiles_l), _DEQUANT_COLS
        consts += tile
    else:
        ints, launcher = (N, L, tiles_n, tiles_l, L // 8), _DEQUANT_ROWS
        consts += (("SWAP", cfg.pair_swap), ("GROUP_ASM", cfg.fp6_asm), ("FP4_ASM", cfg.fp4_asm)) + tile
    return _DequantizePlan((kdtype, kdtype == torch.bfloat16, f.bits == 6 or cfg.fp4_asm, (Bk * tiles_n * tiles_l,),
                            ints, consts, cfg.num_warps, launcher))


# (quantize_triton's problem key, device index) -> (QuantizeArgs per axis, plan) of an eager call on CUDA (at
# most _HOT_MAX problems); emptied with the plans
_HOT: dict = {}
_HOT_MAX = 4096


def _dequantize_impl(qdata, scale, fmt, axis, shape, dtype, cfg=None):
    shape = tuple(shape)
    if not math.prod(shape):  # (no elements: no launch; a zero extent after the axis made a plan of 0-byte reads)
        return torch.empty(shape, dtype=dtype, device=qdata.device)
    plan = _dequantize_plan(fmt, axis, shape, dtype, cfg)
    kdtype, view16, words, grid, ints, consts, num_warps, launcher = plan
    qdata = qdata.contiguous()
    if words and qdata.data_ptr() % 4:
        qdata = qdata.clone()  # the kernel reads FP6 (and FP4 with fp4_asm) as aligned int32 words
    scale = scale.contiguous()
    key = (qdata.get_device(), qdata.data_ptr() % 16 == 0, scale.data_ptr() % 16 == 0)
    fast = plan.fast.get(key)
    if fast is not None and _launch._enabled:
        out = fast(qdata, scale)
        return out if kdtype == dtype else out.to(dtype)
    out = torch.empty(shape, dtype=kdtype, device=qdata.device)
    bound = _launch.bound_launch(plan.bound, key)
    if bound:  # (out: a fresh allocation, 16-byte aligned like the kernel's)
        bound.run(qdata, scale, out)
        if fast_call_loaded():
            fast = bound.with_outputs((0, 1, -1), [(shape, kdtype, False)], 2, single=True)
            if fast is not None:
                plan.fast[key] = fast
    else:
        qv = qdata.view(torch.int32) if words else qdata
        ov = out.view(torch.int16) if view16 else out
        args = (qv, scale, ov, *ints)
        launcher(grid, args, consts, num_warps)
        launcher.bind_once(plan.bound, key, key[0], grid, args, consts, num_warps)
    return out if kdtype == dtype else out.to(dtype)


opt_flags.register_cache(_quantize_plan.cache_clear)  # (plans hold the chosen configs)
opt_flags.register_cache(_dequantize_plan.cache_clear)
opt_flags.register_cache(_HOT.clear)


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
    axis = as_int(axis)  # (a NumPy integer, as mxkit.quantize takes it)
    if isinstance(axis, (tuple, list, torch.Size)):
        axis = tuple(as_int(a) for a in axis)
    elif isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"axis must be an int or a pair of ints, got {axis!r}")
    # the checks are cached per problem, except while Dynamo traces (it traces neither hash() nor the cache)
    # and for an unhashable argument; the MXTensors are then built with their own checks too
    # (and for a block_size that is not an int: 32.0 == 32 would find the cached checks of block_size=32)
    uncached = torch.compiler.is_compiling() or type(block_size) is not int
    key = (tuple(x.shape), x.dtype, fmt, axis, block_size, scale_mode, rounding, scale_layout)
    if not uncached:
        try:
            hot = _HOT.get((key, x.get_device()))
        except TypeError:
            uncached = True
        else:
            if hot is not None:  # an eager call of a problem seen before on this device: checks and plan known
                return hot.run(x)
    fused, margs = _check_args(x, *key[2:]) if uncached else _checked(*key)
    _check_device(x)
    mx = MXTensor if uncached else MXTensor._trusted
    if fused:  # the last two dims: one cast-transpose kernel
        a0 = margs[0]
        if uncached or not x.is_cuda:
            outs = _dispatch(
                torch.ops.mxkit.cast_transpose_mx, _cast_transpose_impl,
                x, a0.fmt.name, a0.scale_mode.value, a0.rounding.value, scale_layout,
            )
        else:
            outs = _run_eager(key, x, margs, None, scale_layout)
        return _wrap(mx, outs, margs, x, block_size, scale_layout)
    if len(margs) == 2:  # two other axes: two kernels
        return tuple(
            quantize_triton(x, fmt, axis=a.axis, block_size=block_size, scale_mode=scale_mode,
                            rounding=rounding, scale_layout=scale_layout)
            for a in margs
        )
    (a,) = margs
    if uncached or not x.is_cuda:
        q, s = _dispatch(
            torch.ops.mxkit.quantize_mx, _quantize_impl,
            x, a.fmt.name, a.axis, a.scale_mode.value, a.rounding.value, scale_layout,
        )
    else:
        q, s = _run_eager(key, x, margs, a.axis, scale_layout)
    return mx(q, s, a.fmt, a.axis, block_size, x.shape, a.scale_mode, a.rounding, scale_layout)


def _run_eager(key: tuple, x: torch.Tensor, margs: tuple, axis: Optional[int], scale_layout: str) -> tuple:
    """The eager launch of ``_quantize_impl`` (axis) / ``_cast_transpose_impl`` (axis None) on CUDA x, its plan
    kept in _HOT for the next call of the problem ``key``. Returns the kernel's outputs."""
    a = margs[0]
    plan = _quantize_plan(tuple(x.shape), x.dtype, a.fmt.name, axis, a.scale_mode.value, a.rounding.value,
                          scale_layout, None, _gpu_name(x))
    if len(_HOT) >= _HOT_MAX:
        _HOT.clear()
    dev = x.get_device()
    _HOT[(key, dev)] = _Hot(margs, plan, key[0], key[4], scale_layout, dev)
    return _run_quantize(plan, x)


class _Hot(tuple):
    """(QuantizeArgs per axis, plan) of one eager problem on one device, and ``run(x)``: its MXTensor(s) for a
    CUDA x of that problem (shape, dtype and arguments as keyed), through the plan's C++ fast call where it is
    made, else :func:`_run_quantize`."""

    def __new__(cls, margs: tuple, plan: _QuantizePlan, shape: tuple, block_size: int, scale_layout: str, device: int):
        hot = super().__new__(cls, (margs, plan))
        hot.run = _hot_runner(margs, plan, torch.Size(shape), block_size, scale_layout, device)
        return hot


def _hot_runner(margs: tuple, plan: _QuantizePlan, shape: torch.Size, block_size: int, scale_layout: str,
                device: int):
    align = plan.unaligned[0] if plan.unaligned is not None else 0
    fast_of = plan.fast.get
    makers = [MXTensor._trusted_maker(a.fmt, a.axis, block_size, shape, a.scale_mode, a.rounding, scale_layout)
              for a in margs]
    # (the whole eager call of a problem seen before: x has the keyed shape and is on the keyed device, so the
    # MXTensors' fields but the tensors are fixed; the two flag reads cost half the copy calls they skip. The fast
    # call makes the MXTensors too (Plan.wrapping: ~0.5 us of Python construction less a tensor), its wrapping Plan
    # kept per specialisation; a cast-transpose's copies each take one allocation, its elements then its scale (two
    # for four outputs: ~0.6 us less). The plan's own fast call, which the custom ops' bodies run, keeps four: an
    # op's outputs may not share a storage. A one-axis quantize keeps its two: its MXTensor is more often a
    # weight's, saved or sharded alone. A padded swizzled scale is zero-filled, made by at::zeros: not grouped.)
    group = len(margs) == 2 and not any(zero for _, zero in plan.outs)
    if len(margs) == 1:
        (make,) = makers
        wraps = (make.wrap(0, 1),)

        def slow(x):
            return make(*_run_quantize(plan, x))
    else:  # a cast-transpose: the outputs (qr, sr, qc, sc), returned in the order of the axes asked for
        make0, make1 = makers
        first = 0 if margs[0].axis == len(shape) - 1 else 2
        wraps = (make0.wrap(first, first + 1), make1.wrap(2 - first, 3 - first))

        def slow(x):
            outs = _run_quantize(plan, x)
            return make0(outs[first], outs[first + 1]), make1(outs[2 - first], outs[3 - first])
    wrapped = {}
    wrapped_of = wrapped.get

    def run(x):
        if not x.is_contiguous() or x.is_neg():
            x = x.contiguous().resolve_neg()
        p = x.data_ptr()
        key = (device, p % 16 == 0, not align or p % align == 0)
        call = wrapped_of(key)
        if call is not None and _launch._enabled:
            return call(x)
        fast = fast_of(key)
        if fast is not None and _launch._enabled:
            call = wrapped[key] = fast.wrapping(wraps, group)
            return call(x)
        return slow(x)

    return run


def quantize_hot(x: torch.Tensor, fmt, axis, block_size: int, scale_mode, rounding, scale_layout: str):
    """The MXTensor(s) of :func:`quantize_eager` where this problem (x's shape, dtype and device, the arguments as
    given) ran before, so its checks passed; else None (the caller checks and runs it)."""
    if type(x) is torch.Tensor and type(block_size) is int and not torch.compiler.is_compiling():
        try:
            hot = _HOT.get(((x.shape, x.dtype, fmt, axis, block_size, scale_mode, rounding, scale_layout),
                            x.get_device()))
        except TypeError:
            return None
        if hot is not None:
            return hot.run(x)
    return None


def quantize_eager(x: torch.Tensor, fmt, axis, block_size: int, scale_mode, rounding, scale_layout: str):
    """:func:`quantize_triton` with positional arguments, for :func:`mxkit.quantize`'s eager CUDA path: a problem
    seen before on x's device runs from its cached checks and plan."""
    if type(x) is torch.Tensor and type(block_size) is int and not torch.compiler.is_compiling():
        try:
            hot = _HOT.get(((x.shape, x.dtype, fmt, axis, block_size, scale_mode, rounding, scale_layout),
                            x.get_device()))
        except TypeError:
            hot = None
        if hot is not None:
            return hot.run(x)
    return quantize_triton(x, fmt, axis=axis, block_size=block_size, scale_mode=scale_mode, rounding=rounding,
                           scale_layout=scale_layout)


def _wrap(mx, outs: tuple, margs: tuple, x: torch.Tensor, block_size: int, scale_layout: str):
    """The MXTensor(s) of a launch's outputs: one axis (q, s), or a cast-transpose (qr, sr, qc, sc) returned in
    the order of the axes asked for."""
    if len(margs) == 1:
        (a,) = margs
        return mx(outs[0], outs[1], a.fmt, a.axis, block_size, x.shape, a.scale_mode, a.rounding, scale_layout)
    nd = x.dim()
    mk = {nd - 1: outs[:2], nd - 2: outs[2:]}
    return tuple(mx(*mk[a.axis], a.fmt, a.axis, block_size, x.shape, a.scale_mode, a.rounding, scale_layout)
                 for a in margs)


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


def dequantize_fast(q: MXTensor, dtype: torch.dtype):
    """The C++ fast call of ``dequantize_triton(q, dtype)`` for q's problem and storage as they are (plain scales,
    contiguous; a bf16 / fp16 / float32 dtype the kernel writes), made by an earlier eager call of it: ``call(q.qdata,
    q.scale)`` allocates the output and launches, the same bytes; None where there is none (yet)."""
    if q.scale_layout != "plain" or q.block_size != 32 or not (q.qdata.is_contiguous() and q.scale.is_contiguous()):
        return None
    plan = _dequantize_plan(q.fmt.name, q.axis, tuple(q.shape), dtype, None)
    if plan[0] != dtype:
        return None
    return plan.fast.get((q.qdata.get_device(), q.qdata.data_ptr() % 16 == 0, q.scale.data_ptr() % 16 == 0))


def dequantize_triton(q: MXTensor, dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """Decode an MXTensor on the GPU; byte-identical to :func:`mxkit.reference.dequantize_reference`
    (decode(element) * 2^(scale - 127) rounded once to fp32, then cast with round-to-nearest-even).

    q: MXTensor on CUDA, block_size 32, any axis, any scale layout (non-plain layouts are converted with
    :func:`mxkit.layouts.from_layout` first). dtype: float32 | bfloat16 | float16; float64 is delegated
    to the reference, which multiplies in float64 (an fp32 product would turn MX values above fp32 max
    into Inf). Returns a tensor of ``q.shape``. NaN outputs (scale 0xFF, element NaN codes) are the canonical NaN
    of ``dtype`` (:data:`mxkit.reference.CANONICAL_NAN_BITS`), the reference's bytes. Raises TypeError for a
    non-MXTensor / unsupported dtype, ValueError for a q not on CUDA, NotImplementedError for blocks other than 32
    elements (a float64 output excepted: the reference writes it).
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    dtype = check_out_dtype(dtype)
    _check_device(q.qdata)  # (before the float64 delegation: backend="triton" off CUDA is refused for every dtype)
    if dtype == torch.float64:
        from ..reference import dequantize_reference

        return dequantize_reference(q, dtype)
    _check_block_size(q.block_size)
    scale = q.plain_scale()
    return _dispatch(torch.ops.mxkit.dequantize_mx, _dequantize_impl,
                     q.qdata, scale, q.fmt.name, q.axis, list(q.shape), dtype)


_FP8_ROWWISE = _Launcher(_fp8_rowwise, "_fp8_rowwise_kernel")


def quantize_fp8_rowwise_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 rowwise quantization of a CUDA tensor in one launch; byte-identical to
    :func:`mxkit.reference.quantize_fp8_rowwise_reference` (its rule: scale = amax / 448 per row, IEEE division,
    at least 2^-149; RNE, canonical NaN).

    x: (..., K) float32 | bfloat16 | float16 (a non-contiguous x is copied first). Returns (data
    float8_e4m3fn (..., K), scale float32 (..., 1)). Raises TypeError on other dtypes, ValueError for a 0-dim or
    non-CUDA x."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _IN_VIEW:
        raise TypeError(f"x must be a float32 / bfloat16 / float16 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., K)")
    _check_device(x)
    x = x.contiguous().resolve_neg()
    K = x.shape[-1]
    R = x.numel() // K if K else math.prod(x.shape[:-1])
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(*x.shape[:-1], 1, dtype=torch.float32, device=x.device)
    if R and not K:
        scale.fill_(1.0)
    elif R:
        block_k = min(_pow2(K), 4096)
        rows = max(1, min(2048 // block_k, _pow2(R)))
        bf16 = x.dtype == torch.bfloat16
        _FP8_ROWWISE((-(-R // rows),), (x.view(torch.int16) if bf16 else x, data.view(torch.uint8), scale, R, K),
                     (("ROWS", rows), ("BLOCK_K", block_k), ("ONE_PASS", K <= block_k), ("BF16_BITS", bf16),
                      ("HW_CVT", not interpreting())), 4)
    return data, scale
