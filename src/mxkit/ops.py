"""Public MX operations with backend dispatch.

``backend="auto"`` runs the Triton kernels (:mod:`mxkit.kernels`) for CUDA tensors when Triton is present
and the reference (:mod:`mxkit.reference`) otherwise; ``"reference"`` and ``"triton"`` force one.
Every backend returns byte-identical results: the reference is the specification.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from . import reference
from .formats import BLOCK_SIZE, FormatLike, Rounding, ScaleMode
from .tensor import MXTensor

__all__ = ["quantize", "dequantize", "matmul", "BACKENDS"]

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
    axis: int = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    backend: str = "auto",
) -> MXTensor:
    """Quantize ``x`` to an MX format along ``axis``. See :func:`mxkit.reference.quantize_reference`.

    x: (..., L, ...) float32 | bfloat16 | float16, ``x.shape[axis] % block_size == 0``.
    Returns MXTensor: qdata uint8 (axis moved last, packed), scale uint8 E8M0 (…, L // block_size).
    Scale rule: ``ScaleMode.FLOOR`` = OCP MX v1.0 §6.3 (default); CEIL; RCEIL = NVIDIA cuBLAS / TE;
    EVEN = Triton / aiter. Rounding: ``"rne"`` (default) or ``"away"``.
    Raises TypeError / ValueError on bad input (dtype, empty, axis length, names).
    """
    if _resolve_backend(backend, x.device) == "triton":
        from .kernels import quantize_triton

        return quantize_triton(
            x, fmt, axis=axis, block_size=block_size, scale_mode=scale_mode, rounding=rounding
        )
    return reference.quantize_reference(
        x, fmt, axis=axis, block_size=block_size, scale_mode=scale_mode, rounding=rounding
    )


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
