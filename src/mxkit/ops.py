"""Public MX operations with backend dispatch.

``backend="auto"`` runs the Triton kernels (:mod:`mxkit.kernels`) for CUDA tensors when Triton is present
and the reference (:mod:`mxkit.reference`) otherwise; ``"reference"`` and ``"triton"`` force one.
Every backend returns byte-identical results: the reference is the specification.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import torch

from . import reference
from .formats import BLOCK_SIZE, FormatLike, Rounding, ScaleMode
from .tensor import MXTensor

__all__ = ["quantize", "cast_transpose", "dequantize", "matmul", "BACKENDS"]

BACKENDS = ("auto", "reference", "triton")


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "auto":
        from .kernels import triton_available

        return "triton" if device.type == "cuda" and triton_available() else "reference"
    return backend


def quantize(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    axis: Union[int, Sequence[int]] = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    scale_layout: str = "plain",
    backend: str = "auto",
) -> Union[MXTensor, tuple[MXTensor, ...]]:
    """Quantize ``x`` to an MX format along ``axis``. See :func:`mxkit.reference.quantize_reference`.

    x: (..., L, ...) float32 | bfloat16 | float16, ``x.shape[axis] % block_size == 0``.
    axis: an int, or a tuple of two ints for a cast-transpose: one MXTensor per axis, each byte-identical
      to quantizing along that axis alone (the Triton backend reads ``x`` once for both).
    Returns MXTensor: qdata uint8 (axis moved last, packed), scale uint8 E8M0 (…, L // block_size).
    Scale rule: ``ScaleMode.FLOOR`` = OCP MX v1.0 §6.3 (default); CEIL; RCEIL = NVIDIA cuBLAS / TE;
    EVEN = Triton / aiter. Rounding: ``"rne"`` (default) or ``"away"``.
    scale_layout: ``"plain"`` or a swizzled layout of :mod:`mxkit.layouts` (``"nvidia_128x4"``: the Triton
      backend writes it directly; byte-identical to quantize then :func:`mxkit.layouts.to_layout`).
    Raises TypeError / ValueError on bad input (dtype, empty, axis length, names).
    """
    kwargs = dict(block_size=block_size, scale_mode=scale_mode, rounding=rounding)
    if not isinstance(axis, int):
        axis = tuple(axis)
        if len(axis) != 2 or not all(isinstance(a, int) for a in axis):
            raise ValueError(f"axis must be an int or a pair of ints, got {axis!r}")
        if axis[0] % max(1, x.dim()) == axis[1] % max(1, x.dim()):
            raise ValueError(f"the two axes of a cast-transpose must differ, got {axis!r}")
    if _resolve_backend(backend, x.device) == "triton":
        from .kernels import quantize_triton

        return quantize_triton(x, fmt, axis=axis, scale_layout=scale_layout, **kwargs)
    if isinstance(axis, tuple):
        return tuple(_relayout(reference.quantize_reference(x, fmt, axis=a, **kwargs), scale_layout) for a in axis)
    return _relayout(reference.quantize_reference(x, fmt, axis=axis, **kwargs), scale_layout)


def cast_transpose(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    backend: str = "auto",
) -> tuple[MXTensor, MXTensor]:
    """Rowwise and columnwise MX copies of ``x`` in one launch that reads x from DRAM about once on CUDA
    (TransformerEngine's cast-transpose; :func:`mxkit.kernels.quantize.quantize_triton`).

    x: (..., K) is flattened to 2-D (M, K) with M = prod(leading dims); both M and K must be multiples of
    ``block_size``. Returns ``(rowwise, columnwise)``: rowwise is quantized along K (qdata (M, K/pack)),
    columnwise along M (qdata (K, M/pack): the transposed layout the backward / wgrad GEMM reads).
    """
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError("cast_transpose needs a tensor with at least one dimension")
    x2 = x.reshape(-1, x.shape[-1])
    return quantize(
        x2, fmt, axis=(1, 0), block_size=block_size, scale_mode=scale_mode, rounding=rounding, backend=backend
    )


def _relayout(q: MXTensor, scale_layout: str) -> MXTensor:
    if scale_layout == "plain":
        return q
    from .layouts import to_layout

    rows = q.scale.shape[:-1].numel()
    swizzled = to_layout(q.scale.reshape(rows, q.scale.shape[-1]), scale_layout)
    return dataclasses.replace(q, scale=swizzled, scale_layout=scale_layout)


def dequantize(q: MXTensor, dtype: Optional[torch.dtype] = torch.float32, *, backend: str = "auto") -> torch.Tensor:
    """MXTensor → dense tensor of ``q.shape`` in ``dtype`` (float32 | bfloat16 | float16 | float64).

    Value = decode(element) × 2^(scale − 127) in float32, then cast (round to nearest even).
    Scale 0xFF or an element NaN code gives NaN. See :func:`mxkit.reference.dequantize_reference`.
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    if _resolve_backend(backend, q.device) == "triton":
        from .kernels import dequantize_triton

        return dequantize_triton(q, dtype)
    return reference.dequantize_reference(q, dtype)


def matmul(
    a: Union[torch.Tensor, MXTensor],
    b: MXTensor,
    *,
    out_dtype: Optional[torch.dtype] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """``y = a @ b.T`` with ``b`` an MX weight (N, K) quantized along K (``nn.Linear`` layout).

    a: float (..., K) or an MXTensor quantized along its last axis. Returns (..., N) in ``out_dtype``
    (default: ``a.dtype``, or bfloat16 for an MXTensor ``a``). Today every backend computes on the
    dequantized operands in float32 (:func:`mxkit.reference.matmul_reference`); scaled-GEMM kernels will
    plug in here.
    """
    _resolve_backend(backend, b.device)
    return reference.matmul_reference(a, b, out_dtype=out_dtype)
