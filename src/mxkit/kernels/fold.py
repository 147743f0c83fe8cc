"""Triton launchers of the row fold (MX FP4 / FP6 rows -> FP8 E4M3 rows with fp32 power-of-two row scales).

Reference twin: :mod:`mxkit.fold` (``fold_reference``, ``quantize_fold_reference``); the jit bodies live in
:mod:`mxkit.kernels.fold_details._fold`. Outputs are byte-identical to the reference: data bytes, scale bits
and ``owner``.

One kernel launch per call writes every row that folds (status 0) and every NaN row (status 2); rows whose
block scales span more than the format's window (status 1) are then re-done on the host by the reference on
those rows only (one ``status.eq(1).any()`` sync; the rest only when such rows exist), which appends their
extra slices.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from ..fold import Folded, _check_foldable, fold_range, fold_reference, quantize_fold_reference
from ..formats import ElementFormat, FormatLike, Rounding, ScaleMode
from ..tensor import SUPPORTED_INPUT_DTYPES, MXTensor
from ._env import interpreting
from .matmul_details._envelope import FOLD_EXP_LIMIT

__all__ = ["FoldConfig", "fold_config", "fold_triton", "quantize_fold_triton", "PendingFold", "QuantizedRows"]

_MODE = {ScaleMode.FLOOR: 0, ScaleMode.CEIL: 1, ScaleMode.RCEIL: 2, ScaleMode.EVEN: 3}
_IN_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # _quantize's IN_F32_BITS / BF16_BITS / F16
_IN_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.float16}


@dataclass(frozen=True)
class FoldConfig:
    """What one fold launch runs: block_r rows per program, K walked in chunks of block_k elements (a power of
    two, multiple of 32), num_warps; hw_cvt: FP6 RNE element rounding through the hardware FP8 cvt
    (``quantize_details._codecs._encode``'s HW_CVT; GPU only, quantize-fold only)."""

    block_r: int
    block_k: int
    num_warps: int
    hw_cvt: bool = False


def fold_config(R: int, K: int, fmt: ElementFormat, *, quantize: bool = False, rounding: Rounding = Rounding.RNE,
                on_gpu: bool = True) -> FoldConfig:
    """The launch config of a problem (a pure function of its arguments). Timed on an H200 for K of 2880 and
    more (BENCHMARKS.md); ``_run_fold(..., cfg=)`` takes another for A/B runs.

    GPU, about 16 elements per thread (the sm_90 compiles of the quantize-fold use 58-75 registers there, against
    89-150 at 32 per thread):
    * rows of 2048 < K <= 4096 (and K <= 8192 for the quantize-fold): one row per program in one power-of-two
      tile, read once, whatever it pads;
    * rows of K <= 2048 whose power-of-two tile pads them by at most 1/8: one chunk ([2, 2048], [4, 1024],
      ...), the codes held in registers between the statistics and the write, so the input is read once;
    * other rows: chunks of the widest of 2048 / 1024 / ... elements that pads K by at most 1/8, walked twice
      (statistics, then the write), the second pass an L2 hit: a program's rows hold at most 8192 elements
      (16 KB of bf16; with 8 programs per SM, ~17 MB of L2 on 132 SMs).
    Off the GPU (the CPU interpreter, whose cost is per program and per op rather than per element) 1024-wide
    chunks and up to 64 rows per program."""
    p2 = 1 << max(5, (K - 1).bit_length())
    rows_p2 = 1 << max(0, (max(R, 1) - 1).bit_length())
    rnd = Rounding.parse(rounding)
    hw_cvt = quantize and on_gpu and fmt.bits == 6 and rnd is Rounding.RNE
    if not on_gpu:
        return FoldConfig(min(64, rows_p2), min(1024, p2), 4, hw_cvt)
    if 2048 < K and (p2 <= 4096 or (quantize and p2 == 8192)):
        # one row per program in one tile, read once (H200: 727 x 2880 FP4 fold 11.3 -> 7.4 us, quantize-fold
        # E3M2 29.6 -> 9.8 us; 16384 x 8192 quantize-fold 210.7 -> 193.6 us)
        hw = hw_cvt and p2 >= 4 * 32 * min(16, max(4, p2 // 512))
        return FoldConfig(1, p2, min(16, max(4, p2 // 512)), hw)
    if p2 <= 2048 and 8 * K >= 7 * p2:
        block_k = p2
        block_r = max(1, min(4096 // block_k, rows_p2))
    else:
        block_k = next(c for c in (2048, 1024, 512, 256, 128, 64, 32) if c < p2 and 8 * K >= 7 * (-(-K // c) * c))
        block_r = 1 << (max(1, min(4096 // block_k, rows_p2, 8192 // K)).bit_length() - 1)  # a power of two
    num_warps = max(1, min(8, block_r * block_k // 512))
    # the cvt asm rounds 4 elements at a time: at least 4 per thread
    hw_cvt = hw_cvt and block_r * block_k >= 4 * 32 * num_warps
    return FoldConfig(block_r, block_k, num_warps, hw_cvt)


def _check_device(t: torch.Tensor, what: str) -> None:
    if not t.is_cuda and not interpreting():
        raise ValueError(f"the Triton fold kernels need CUDA tensors, got {what} on device={t.device} "
                         "(use mxkit.fold.fold_reference / quantize_fold_reference on CPU)")


def _empty(R: int, K: int, f: ElementFormat, lead: torch.Size, device) -> Folded:
    return Folded._trusted(torch.empty(R, K, dtype=torch.float8_e4m3fn, device=device),
                           torch.empty(R, dtype=torch.float32, device=device),
                           torch.empty(0, dtype=torch.int64, device=device), f, lead)


def _complete(data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor, f: ElementFormat, lead: torch.Size,
              redo) -> Folded:
    """The Folded of the kernel's outputs (data uint8 [R, K], scale float32 [R]), with the status-1 rows
    replaced by ``redo(rows)`` (a reference Folded of those rows only) and its extra slices appended."""
    owner = torch.empty(0, dtype=torch.int64, device=data.device)
    if bool(status.eq(1).any()):
        rows = status.eq(1).nonzero().flatten()
        sub = redo(rows)
        n = rows.numel()
        data[rows] = sub.data[:n].view(torch.uint8)
        scale[rows] = sub.scale[:n]
        data = torch.cat([data, sub.data[n:].view(torch.uint8)])
        scale = torch.cat([scale, sub.scale[n:]])
        owner = rows[sub.owner]
    return Folded._trusted(data.view(torch.float8_e4m3fn), scale, owner, f, lead)


@dataclass(frozen=True)
class QuantizedRows:
    """The rows a quantize-fold read, and how it quantized them: x [R, K] contiguous (float32 / bfloat16 /
    float16) to ``fmt`` with ``scale_mode`` and ``rounding`` (mxkit.quantize's codes)."""

    x: torch.Tensor
    fmt: ElementFormat
    scale_mode: ScaleMode
    rounding: Rounding


@dataclass(frozen=True)
class PendingFold:
    """A fold whose status-1 rows (block scales spanning more than the window) are not completed yet, so that a
    caller can enqueue more GPU work before the one host sync: ``folded`` holds every other row exactly (a
    status-1 row's data and scale are whatever the kernel left: the caller must not use them), ``status`` uint8
    [R] (0 folded, 1 pending, 2 NaN). :meth:`complete` (one host sync) returns the exact :class:`Folded`.
    ``source``: what the fold read (the MXTensor, or the :class:`QuantizedRows`), from which the GEMM's fix-up
    kernel recomputes the pending rows exactly without completing them (no host sync). ``stats``: with
    ``fold_triton(..., stats=True)``, the kernel's per-program statistics of a weight, int32 [P, 5], which
    :func:`weight_stats` reduces."""

    folded: Folded
    status: torch.Tensor
    redo: Callable[[torch.Tensor], Folded]
    source: Union[MXTensor, QuantizedRows, None] = None
    stats: Optional[torch.Tensor] = None

    def complete(self) -> Folded:
        f = self.folded
        return _complete(f.data.view(torch.uint8), f.scale, self.status, f.fmt, f.lead_shape, self.redo)


def _pending(data, scale, status, f, lead, redo, defer: bool, source=None, stats=None
             ) -> Union[Folded, PendingFold]:
    if defer:
        return PendingFold(Folded._trusted(data.view(torch.float8_e4m3fn), scale,
                                           data.new_zeros(0, dtype=torch.int64), f, lead), status, redo, source, stats)
    return _complete(data, scale, status, f, lead, redo)


def weight_stats(stats: torch.Tensor) -> tuple[int, int, bool, bool, bool]:
    """One host sync: (smallest and largest scale byte other than 0xFF (255 / -1 when none), whether a 0xFF
    occurs, whether a row scale lies outside the FP8 epilogue's envelope (``FOLD_EXP_LIMIT``), whether a row's
    block scales span more than the fold window) from the fold kernel's per-program rows int32 [P, 5]."""
    v = stats.amax(0).tolist()
    return 255 - v[0], v[1] - 1, bool(v[2]), bool(v[3]), bool(v[4])


_LAUNCHERS: dict = {}


def _launcher(name: str):
    launcher = _LAUNCHERS.get(name)
    if launcher is None:
        from . import launch
        from .fold_details import _fold

        launcher = _LAUNCHERS[name] = launch.BoundCache(launch._Launcher(_fold, name))
    return launcher


def _launch_shape(R: int, K: int, cfg: FoldConfig, consts: dict) -> tuple:
    """(grid, constexprs as (name, value) items, num_warps) of a launch over R rows of K elements."""
    masked = R % cfg.block_r != 0 or K % cfg.block_k != 0
    return ((-(-R // cfg.block_r),), tuple(consts.items()) + (
        ("BLOCK_R", cfg.block_r), ("BLOCK_K", cfg.block_k), ("ONE_CHUNK", K <= cfg.block_k), ("MASKED", masked)),
        cfg.num_warps)


def _launch(name: str, args: tuple, R: int, K: int, cfg: FoldConfig, consts: dict) -> None:
    """Launch kernel ``name`` of ``fold_details._fold`` (tensor arguments ``args``) through mxkit's direct launch
    (:class:`mxkit.kernels.launch.BoundCache`: Triton 3.6's own launcher spent ~50 us of host time a call)."""
    grid, items, nw = _launch_shape(R, K, cfg, consts)
    _launcher(name)(grid, args, (R, K), items, nw)


def _outputs(R: int, K: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' outputs: data uint8 [R, K], scale float32 [R], status uint8 [R]."""
    return (torch.empty(R, K, dtype=torch.uint8, device=device), torch.empty(R, dtype=torch.float32, device=device),
            torch.empty(R, dtype=torch.uint8, device=device))


def _fold_args(q: MXTensor, data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor,
               cfg: Optional[FoldConfig], part: Optional[torch.Tensor]) -> tuple:
    f, (R, K) = q.fmt, data.shape
    d_lo, d_hi = fold_range(f)
    cfg = cfg or fold_config(R, K, f, on_gpu=q.qdata.is_cuda and not interpreting())
    qd = q.qdata if q.qdata.data_ptr() % 16 == 0 else q.qdata.clone()  # read as int32 words
    return ((qd.view(torch.int32), q.scale, data, scale.view(torch.int32), status, status if part is None else part),
            R, K, cfg, dict(BITS=f.bits, MBITS=f.mbits, EMIN=f.emin, D_LO=d_lo, D_HI=d_hi, STATS=part is not None,
                            EXP_LIMIT=FOLD_EXP_LIMIT))


def _run_fold(q: MXTensor, data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor,
              cfg: Optional[FoldConfig] = None, stats: bool = False) -> Optional[torch.Tensor]:
    """Launch the fold kernel on a validated q (R >= 1 rows) into the given outputs (:func:`_outputs`); cfg:
    an explicit config for A/B runs (default :func:`fold_config`). ``stats``: returns the kernel's per-program
    weight statistics (int32 [P, 5], :func:`weight_stats`)."""
    R, K = data.shape
    cfg = cfg or fold_config(R, K, q.fmt, on_gpu=q.qdata.is_cuda and not interpreting())
    part = torch.empty(-(-R // cfg.block_r), 5, dtype=torch.int32, device=data.device) if stats else None
    _launch("_fold_kernel", *_fold_args(q, data, scale, status, cfg, part))
    return part


def bind_fold(q: MXTensor, data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor):
    """The :class:`~mxkit.kernels.cuda_driver.BoundLaunch` of the fold (no statistics) of q into these outputs,
    as :func:`fold_triton` launched it (call that once first for this problem), or None where it cannot be made.
    Its pointer parameters: q's codes (16-byte aligned), q's scale bytes, data, scale, status, status."""
    args, R, K, cfg, consts = _fold_args(q, data, scale, status, None, None)
    grid, items, nw = _launch_shape(R, K, cfg, consts)
    return _launcher("_fold_kernel").launcher.bind(grid, args + (R, K), items, nw)


def _quantize_fold_args(x2: torch.Tensor, f: ElementFormat, mode: ScaleMode, rnd: Rounding, data: torch.Tensor,
                        scale: torch.Tensor, status: torch.Tensor, cfg: Optional[FoldConfig]) -> tuple:
    R, K = x2.shape
    d_lo, d_hi = fold_range(f)
    cfg = cfg or fold_config(R, K, f, quantize=True, rounding=rnd, on_gpu=x2.is_cuda and not interpreting())
    return ((x2.view(_IN_VIEW[x2.dtype]), data, scale.view(torch.int32), status), R, K, cfg,
            dict(IN_KIND=_IN_KIND[x2.dtype], BITS=f.bits, MBITS=f.mbits, EMIN=f.emin, EMAX=f.emax,
                 MAX_NORMAL=float(f.max_normal), MAX_FRAC=_max_frac(f), MODE=_MODE[mode], AWAY=rnd is Rounding.AWAY,
                 D_HI=d_hi, W=d_hi - d_lo, HW_CVT=cfg.hw_cvt))


def _run_quantize_fold(x2: torch.Tensor, f: ElementFormat, mode: ScaleMode, rnd: Rounding, data: torch.Tensor,
                       scale: torch.Tensor, status: torch.Tensor, cfg: Optional[FoldConfig] = None) -> None:
    """Launch the quantize-fold kernel on a validated contiguous x2 [R >= 1, K] into the given outputs; cfg: an
    explicit config for A/B runs (default :func:`fold_config`)."""
    _launch("_quantize_fold_kernel", *_quantize_fold_args(x2, f, mode, rnd, data, scale, status, cfg))


def bind_quantize_fold(x2: torch.Tensor, fmt: FormatLike, scale_mode: ScaleMode, rounding: Rounding,
                       data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor):
    """The :class:`~mxkit.kernels.cuda_driver.BoundLaunch` of the quantize-fold of x2 [R, K] (contiguous) into
    these outputs (:func:`_outputs`), as :func:`quantize_fold_triton` launched it (call that once first for this
    problem), or None where it cannot be made. Its pointer parameters: x2, data, scale, status."""
    f = _check_foldable(fmt)[0]
    args, R, K, cfg, consts = _quantize_fold_args(x2, f, scale_mode, rounding, data, scale, status, None)
    grid, items, nw = _launch_shape(R, K, cfg, consts)
    return _launcher("_quantize_fold_kernel").launcher.bind(grid, args + (R, K), items, nw)


def fold_triton(q: MXTensor, *, defer: bool = False, stats: bool = False) -> Union[Folded, PendingFold]:
    """Fold an MX tensor to E4M3 rows with the Triton kernel; byte-identical to :func:`mxkit.fold.fold_reference`.

    q: MXTensor (..., K) of mxfp4_e2m1, mxfp6_e2m3 or mxfp6_e3m2 quantized along its last axis, block_size 32,
      plain scale layout, qdata and scale contiguous, on CUDA (or any device under TRITON_INTERPRET=1).
    Returns :class:`mxkit.fold.Folded`: data float8_e4m3fn [R + X, K], scale float32 [R + X], owner int64 [X]
    (R = prod of the leading dims; R = 0 gives empty tensors); with ``defer=True`` a :class:`PendingFold` (no host
    sync; R = 0 still returns a Folded), which with ``stats=True`` carries the weight statistics of
    :func:`weight_stats` made on the way. Raises TypeError for a non-MXTensor, ValueError
    for a format that does not fold, another axis, block size or scale layout, K = 0 (as the reference),
    non-contiguous storage or a CPU tensor outside the interpreter.
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"fold_triton expects an MXTensor, got {type(q).__name__}")
    f = _check_foldable(q.fmt)[0]
    if q.axis != q.ndim - 1:
        raise ValueError(f"fold_triton needs an MXTensor quantized along its last axis; got axis={q.axis} "
                         f"of shape {tuple(q.shape)}")
    if q.block_size != 32:
        raise ValueError(f"fold_triton supports block_size=32 only, got block_size={q.block_size}")
    if q.scale_layout != "plain":
        raise ValueError(f"fold_triton reads plain scales, got scale_layout={q.scale_layout!r} "
                         "(mxkit.layouts.from_layout undoes a swizzle)")
    if not (q.qdata.is_contiguous() and q.scale.is_contiguous()):
        raise ValueError(f"fold_triton needs contiguous qdata and scale; got strides {q.qdata.stride()} and "
                         f"{q.scale.stride()}")
    _check_device(q.qdata, "q")
    K = q.shape[-1]
    lead = torch.Size(q.shape[:-1])
    R = math.prod(lead)
    if K == 0:  # (as fold_reference: a scale of no blocks is undefined; its R floats were returned unwritten)
        raise ValueError(f"cannot fold an MXTensor with K=0 (shape {tuple(q.shape)})")
    if R == 0:
        return _empty(R, K, f, lead, q.device)
    data, scale, status = _outputs(R, K, q.device)
    part = _run_fold(q, data, scale, status, stats=stats)
    qd, sc = q.qdata.reshape(R, -1), q.scale.reshape(R, -1)

    def redo(rows):
        return fold_reference(MXTensor(qd[rows], sc[rows], f, 1, 32, (rows.numel(), K)))

    return _pending(data, scale, status, f, lead, redo, defer, q, part)


def _max_frac(f: ElementFormat) -> int:
    """The 23-bit fp32 mantissa of the format's max normal (the RCEIL comparison of _block_scale)."""
    return struct.unpack("<I", struct.pack("<f", f.max_normal))[0] & 0x7FFFFF


def quantize_fold_triton(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    block_size: int = 32,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    defer: bool = False,
) -> Union[Folded, PendingFold]:
    """Quantize x to MXFP4 / MXFP6 along its last axis and fold each row, in one fused pass; byte-identical to
    :func:`mxkit.fold.quantize_fold_reference` (``fold_reference(quantize_reference(x, ...))``).

    x: (..., K) float32 | bfloat16 | float16, contiguous, K % 32 == 0, on CUDA (or any device under
      TRITON_INTERPRET=1); R = prod of the leading dims may be 0 (empty result).
    fmt: mxfp4_e2m1 / mxfp6_e2m3 / mxfp6_e3m2. scale_mode: :class:`~mxkit.formats.ScaleMode` (block scales as
      mxkit.quantize); rounding: RNE or AWAY (ties away from zero), saturating.
    Returns :class:`mxkit.fold.Folded` (``defer=True``: a :class:`PendingFold`, no host sync). Raises TypeError
    for a wrong dtype, ValueError for a format that does
    not fold, K % 32 != 0, block_size != 32, a 0-dim, non-contiguous or (outside the interpreter) CPU tensor.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"x.dtype={x.dtype} is not supported; expected float32, bfloat16 or float16")
    f = _check_foldable(fmt)[0]
    if block_size != 32:
        raise ValueError(f"quantize_fold_triton supports block_size=32 only, got {block_size=}")
    if x.dim() == 0:
        raise ValueError("cannot fold a 0-dim tensor: rows run along the last axis")
    K = x.shape[-1]
    if K % 32 or K == 0:
        raise ValueError(f"x.shape[-1]={K} (shape {tuple(x.shape)}) must be a positive multiple of {block_size=}")
    if not x.is_contiguous():
        raise ValueError(f"quantize_fold_triton needs a contiguous x; got shape {tuple(x.shape)}, strides "
                         f"{x.stride()}")
    x = x.resolve_neg()  # (a negative-bit view: its memory holds -x, which the kernel reads raw)
    mode, rnd = ScaleMode.parse(scale_mode), Rounding.parse(rounding)
    _check_device(x, "x")
    lead = torch.Size(x.shape[:-1])
    R = math.prod(lead)
    if R == 0:
        return _empty(0, K, f, lead, x.device)
    x2 = x.reshape(R, K)
    data, scale, status = _outputs(R, K, x.device)
    _run_quantize_fold(x2, f, mode, rnd, data, scale, status)

    def redo(rows):
        return quantize_fold_reference(x2[rows], f, scale_mode=mode, rounding=rnd)

    return _pending(data, scale, status, f, lead, redo, defer, QuantizedRows(x2, f, mode, rnd))

