"""Compatibility re-export of the quantize / dequantize ``@triton.jit`` code, which lives in
:mod:`mxkit.kernels.quantize_details` (one module per concern). Kernels of other op families import the
shared helpers from here or from there (e.g. ``from mxkit.kernels._quantize import _block_scale, MODE_FLOOR``)."""

from __future__ import annotations

from .quantize_details import _cast_transpose, _codecs, _common, _cols, _dequantize, _quantize, _rows, _scale, _store

# every top-level name of the detail modules (constants, jit helpers, asm builders, kernels), by its old path
for _m in (_common, _codecs, _scale, _store, _rows, _cols, _quantize, _cast_transpose, _dequantize):
    globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__") and k not in ("annotations",)})
del _m
