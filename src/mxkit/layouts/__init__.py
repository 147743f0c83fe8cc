"""Scale and element-data layouts used by MX GEMM libraries (the host side in PyTorch; each layout's offset
formula is also the quantize kernels' ``@triton.jit`` helper).

Every function here is a byte permutation (plus zero padding for the scale layouts): no arithmetic on
values, so every conversion is lossless and works on any device and any byte content (0xFF NaN scales
included). The host side imports only torch (Triton is optional); :mod:`mxkit.tensor` (MXTensor) builds on it.

Scale layouts (E8M0 bytes of a 2-D ``(rows, cols)`` plain scale, ``cols = K // block_size``; an ND scale
``(*lead, cols)`` is flattened to ``rows = prod(lead)`` first):

* ``"plain"`` — row-major ``(rows, cols)``, what :func:`mxkit.quantize` returns by default.
* ``"nvidia_128x4"`` — NVIDIA's blocked scale-factor layout (cuBLAS "1D block scaling factors layout",
  TransformerEngine, ``torch._scaled_mm`` MX on Blackwell): rows padded to 128, cols to 4.
* ``"aiter_shuffle"`` — aiter's padded (rows → 256, cols → 8) and shuffled E8M0 layout.

Padding bytes are 0. Converters: :func:`to_layout` / :func:`from_layout`.

Element-data layouts (packed FP4 ``qdata`` ``(..., N, K // 2)`` uint8, two E2M1 codes per byte):

* ``"plain"`` — row-major, what :func:`mxkit.quantize` returns.
* ``"aiter_shuffle"`` — aiter's 16×16 MFMA pre-shuffle of weights (``shuffle_weight(w, layout=(16, 16))``).

Converters: :func:`to_data_layout` / :func:`from_data_layout`. One module per layout (``plain``,
``nvidia_128x4``, ``aiter_shuffle``) holds its offset formula with its sources, the host swizzle and unswizzle,
and the formula's ``@triton.jit`` twin (defined only where Triton imports); the registry below derives every
list of layout names from those modules.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Mapping, Sequence

import torch

from ..formats import as_int
from . import aiter_shuffle, nvidia_128x4, plain

__all__ = [
    "SCALE_LAYOUTS",
    "KERNEL_LAYOUT_IDS",
    "DATA_LAYOUTS",
    "scale_layout_shape",
    "to_layout",
    "from_layout",
    "to_data_layout",
    "from_data_layout",
]

# The one registry of layout names: each layout is a module (host swizzle, unswizzle, the offset formula and its
# jit helper). SCALE_LAYOUTS / DATA_LAYOUTS and the kernels' layout ids are derived from it.
_SCALE_MODULES = MappingProxyType({m.NAME: m for m in (plain, nvidia_128x4, aiter_shuffle)})
_DATA_MODULES = MappingProxyType({m.NAME: m for m in (plain, aiter_shuffle)})

# layout name -> (row multiple, col multiple) the plain (rows, cols) scale is padded to
SCALE_LAYOUTS: Mapping[str, tuple[int, int]] = MappingProxyType({n: m.PAD for n, m in _SCALE_MODULES.items()})

# layout name -> (N multiple, K-bytes multiple) the packed data (..., N, K // 2) must have (no padding)
DATA_LAYOUTS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {n: getattr(m, "DATA_MULTIPLE", (1, 1)) for n, m in _DATA_MODULES.items()})

# layout name -> the scale-layout id the quantize kernels take (mxkit.kernels.quantize_details: LAYOUT_*)
KERNEL_LAYOUT_IDS: Mapping[str, int] = MappingProxyType({n: m.KERNEL_ID for n, m in _SCALE_MODULES.items()})


def _check_layout(layout: str) -> tuple[int, int]:
    if not isinstance(layout, str) or layout not in SCALE_LAYOUTS:
        raise ValueError(f"unknown scale layout {layout!r}; known: {', '.join(SCALE_LAYOUTS)}")
    return SCALE_LAYOUTS[layout]


def _check_data_layout(layout: str) -> tuple[int, int]:
    if not isinstance(layout, str) or layout not in DATA_LAYOUTS:
        raise ValueError(f"unknown data layout {layout!r}; known: {', '.join(DATA_LAYOUTS)}")
    return DATA_LAYOUTS[layout]


def _as_dim(v):
    """v as a Python int where it is a NumPy integer (:func:`mxkit.formats.as_int`); a SymInt as it is."""
    return v if isinstance(v, torch.SymInt) else as_int(v)


def _check_dims(rows, cols) -> tuple:
    """(rows, cols) as ints (NumPy integers taken) if both are non-negative ints; else ValueError."""
    rows, cols = _as_dim(rows), _as_dim(cols)
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, torch.SymInt):  # (torch.compile with a dynamic dim: checked where it is concrete)
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    return rows, cols


def _as_bytes(t: torch.Tensor, allowed: tuple, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in allowed:
        names = " or ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{what}.dtype={t.dtype} is not supported; expected {names}")
    return t.view(torch.uint8)


_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_DATA_DTYPES = (torch.uint8,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())


def scale_layout_shape(rows: int, cols: int, layout: str) -> tuple[int, int]:
    """Shape ``(rows_padded, cols_padded)`` of a ``(rows, cols)`` plain scale stored in ``layout``.

    ``rows_padded = ceil(rows / rm) * rm`` and ``cols_padded = ceil(cols / cm) * cm`` with
    ``(rm, cm) = SCALE_LAYOUTS[layout]``: (1, 1) plain, (128, 4) nvidia_128x4, (256, 8) aiter_shuffle.
    Raises ValueError for an unknown layout or negative / non-int sizes.
    """
    rm, cm = _check_layout(layout)
    rows, cols = _check_dims(rows, cols)
    return (-(-rows // rm) * rm, -(-cols // cm) * cm)


def to_layout(scale: torch.Tensor, layout: str) -> torch.Tensor:
    """Plain E8M0 scale → swizzled ``layout`` (a byte permutation of the zero-padded scale).

    scale: (rows, cols) uint8 | float8_e8m0fnu, any device, any strides (``cols = K // block_size`` for a scale of
      an (rows, K) operand quantized along K; flatten ND scales to ``rows = prod(lead)`` first).
    Returns (rows_p, cols_p) = :func:`scale_layout_shape` ``(rows, cols, layout)``, uint8, contiguous, on
      ``scale.device``. Its flat (row-major) byte order is the layout's byte order, so ``out.flatten()`` is
      what cuBLAS / torchao's ``to_blocked`` / aiter's ``e8m0_shuffle`` produce. Padding bytes are 0.
      ``"plain"`` returns the bytes as they are (no copy when ``scale`` is already contiguous uint8).

    Byte (r, c) of the padded (rows_p, cols_p) scale goes to flat offset ``offsets(r, c, cols_p)`` of the
    layout's module (:mod:`mxkit.layouts.nvidia_128x4`, :mod:`mxkit.layouts.aiter_shuffle`: the formulas and
    their sources); the quantize kernels write the same offsets through the same functions.

    Raises TypeError if ``scale`` is not a tensor; ValueError for an unknown layout, another dtype, or a
    tensor that is not 2-D.
    """
    rm, cm = _check_layout(layout)
    s = _as_bytes(scale, _SCALE_DTYPES, "scale")
    if s.dim() != 2:
        raise ValueError(
            f"scale must be 2-D (rows, cols), got shape {tuple(s.shape)}; flatten leading dims first"
        )
    if layout == "plain":
        return s.contiguous()
    rows, cols = s.shape
    R, C = scale_layout_shape(rows, cols, layout)
    padded = s.new_zeros((R, C))
    padded[:rows, :cols] = s
    return _SCALE_MODULES[layout].swizzle(padded)


def from_layout(swizzled: torch.Tensor, layout: str, shape: Sequence[int]) -> torch.Tensor:
    """Swizzled ``layout`` scale → plain (rows, cols) E8M0 scale; the inverse of :func:`to_layout`.

    swizzled: uint8 | float8_e8m0fnu holding the rows_p × cols_p bytes of the layout (see :func:`to_layout`
      for the offsets), either 2-D (rows_p, cols_p) or flat (rows_p * cols_p,) as torchao's ``to_blocked``
      returns; any device.
    shape: (rows, cols) of the plain scale (rows_p, cols_p = :func:`scale_layout_shape`).
    Returns (rows, cols) uint8, contiguous, on ``swizzled.device``. Padding bytes are dropped unread (aiter
      leaves them uninitialised), so any padding content is accepted. A swizzled buffer does not record its plain
      shape: a wrong ``shape`` of the same padded sizes (cols 4 for a scale of 3) is not detected, and its extra
      rows / columns are padding bytes (:class:`mxkit.MXTensor` keeps its shape, so its scales are unaffected).

    Raises TypeError if ``swizzled`` is not a tensor; ValueError for an unknown layout, another dtype, a
    ``shape`` that is not two non-negative ints, or a ``swizzled`` whose shape is neither (rows_p, cols_p) nor
    (rows_p * cols_p,).
    """
    _check_layout(layout)
    s = _as_bytes(swizzled, _SCALE_DTYPES, "swizzled")
    shape = tuple(shape) if isinstance(shape, (tuple, list, torch.Size)) else shape
    if not isinstance(shape, tuple) or len(shape) != 2:
        raise ValueError(f"shape must be (rows, cols), got {shape!r}")
    rows, cols = _check_dims(*shape)
    R, C = scale_layout_shape(rows, cols, layout)
    if tuple(s.shape) not in ((R, C), (R * C,)):
        raise ValueError(
            f"swizzled has shape {tuple(s.shape)}, but a {layout!r} scale of plain shape {(rows, cols)} "
            f"is stored as ({R}, {C}) or ({R * C},)"
        )
    if layout == "plain":
        return s.reshape(rows, cols).contiguous()
    return _SCALE_MODULES[layout].unswizzle(s, R, C)[:rows, :cols].contiguous()


def _check_data(qdata: torch.Tensor, layout: str, what: str) -> torch.Tensor:
    nm, km = _check_data_layout(layout)
    q = _as_bytes(qdata, _DATA_DTYPES, what)
    if q.dim() < 2:
        raise ValueError(f"{what} must be at least 2-D (..., N, K // 2), got shape {tuple(q.shape)}")
    N, KB = q.shape[-2:]
    if N % nm or KB % km:
        raise ValueError(
            f"layout {layout!r} needs N % {nm} == 0 and K-bytes % {km} == 0 (K % {2 * km} == 0 FP4 elements); "
            f"got {what} shape {tuple(q.shape)}: N={N}, K-bytes={KB}"
        )
    return q


def to_data_layout(qdata: torch.Tensor, layout: str) -> torch.Tensor:
    """Packed FP4 weight bytes → ``layout`` (a byte permutation, same shape, no padding).

    qdata: (..., N, K // 2) uint8 | float4_e2m1fn_x2 (two E2M1 codes per byte, element 2i in the low
      nibble; leading dims, e.g. experts, are shuffled independently), any device, any strides.
    Returns uint8 of the same shape, contiguous, on ``qdata.device``; ``"plain"`` returns the bytes as they
      are (no copy when already contiguous uint8). Nibbles are never split: the shuffle moves whole bytes.

    ``"aiter_shuffle"`` needs ``N % 16 == 0`` and ``K-bytes % 32 == 0`` (K % 64 == 0 elements). Per
    matrix, 16 rows × 32 bytes (64 FP4 values) form a 512-byte tile; tiles go row-major over
    (N / 16, KB / 32); inside a tile the two 16-byte K halves come one after the other, each as 16 rows of 16
    bytes (one MFMA lane's 32 FP4 values). Byte (n, kb) of an (N, KB) matrix goes to flat offset::

        (n // 16) * 16 * KB + (kb // 32) * 512 + (kb // 16 % 2) * 256 + (n % 16) * 16 + kb % 16

    Source: ROCm/aiter ``aiter/ops/shuffle.py::shuffle_weight(x, layout=(16, 16))`` for a 1-byte dtype
    (IN = 16, IK = 16, BK = 2 * IK = 32 bytes, K = 16 // element_size = 16 bytes): ``view(-1, N // 16, 16,
    KB // 32, 2, 16).permute(0, 1, 3, 4, 2, 5)`` — what aiter's ``gemm_a4w4`` takes as its pre-shuffled
    FP4 weight (op_tests/test_gemm_a4w4.py: ``shuffle_weight(w, layout=(16, 16))``) and what vLLM's Quark
    MXFP4 MoE path on ROCm applies to expert weights (vllm/model_executor/layers/quantization/quark/
    quark_moe.py, ``process_weights_after_loading``). The same byte permutation is aiter's (16, 16) shuffle of
    FP8 weights (element_size 1); it differs for 2-byte dtypes.

    Raises TypeError if ``qdata`` is not a tensor; ValueError for an unknown layout, another dtype, fewer than
    2 dims, or N / K-bytes that the layout cannot take.
    """
    q = _check_data(qdata, layout, "qdata")
    if layout == "plain":
        return q.contiguous()
    return _DATA_MODULES[layout].shuffle_data(q)


def from_data_layout(shuffled: torch.Tensor, layout: str, shape: Sequence[int]) -> torch.Tensor:
    """``layout`` FP4 weight bytes → plain (..., N, K // 2) uint8; the inverse of :func:`to_data_layout`.

    shuffled: uint8 | float4_e2m1fn_x2 of ``shape`` (or flat, ``prod(shape)`` bytes), any device.
    shape: (..., N, K // 2) of the plain packed data; same constraints as :func:`to_data_layout`.
    Returns uint8 of ``shape``, contiguous, on ``shuffled.device``.

    Raises TypeError if ``shuffled`` is not a tensor; ValueError for an unknown layout, another dtype, a
    ``shape`` the layout cannot take, or a ``shuffled`` whose shape is neither ``shape`` nor (prod(shape),).
    """
    _check_data_layout(layout)
    s = _as_bytes(shuffled, _DATA_DTYPES, "shuffled")
    if isinstance(shape, (tuple, list)):
        shape = tuple(_as_dim(d) for d in shape)
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"shape must be a sequence of non-negative ints (..., N, K // 2), got {shape!r}")
    shape = tuple(shape)
    numel = math.prod(shape)
    if tuple(s.shape) not in (shape, (numel,)):
        raise ValueError(f"shuffled has shape {tuple(s.shape)}, expected {shape} or ({numel},)")
    q = _check_data(s.reshape(shape) if len(shape) >= 2 else s, layout, "shuffled")
    if layout == "plain":
        return q.contiguous()
    return _DATA_MODULES[layout].unshuffle_data(q, shape)
