"""Compatibility re-export of the quantize / dequantize ``@triton.jit`` code, which lives in
:mod:`mxkit.kernels.quantize_details` (one module per concern). Kernels of other op families import the
shared helpers from here or from there (e.g. ``from mxkit.kernels._quantize import _block_scale, MODE_FLOOR``)."""

from __future__ import annotations

import triton
import triton.language as tl

from .quantize_details import _cast_transpose, _codecs, _common, _cols, _dequantize, _quantize, _rows, _scale, _store
from .quantize_details._codecs import _encode as _encode_elements

# every top-level name of the detail modules (constants, jit helpers, asm builders, kernels), by its old path
for _m in (_common, _codecs, _scale, _store, _rows, _cols, _quantize, _cast_transpose, _dequantize):
    globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__") and k not in ("annotations",)})
del _m

# The fp32-denormal policies other than "multiply as is" are gone (no config selected them); the old
# _encode signature, with its DENORM argument, stays for callers written against it.
DENORM_NONE = tl.constexpr(0)


@triton.jit
def _encode(xbits, X, bad, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
            IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, AWAY: tl.constexpr, DENORM: tl.constexpr,
            HW_CVT: tl.constexpr = False, KEEP_ASM: tl.constexpr = False):
    """:func:`mxkit.kernels.quantize_details._codecs._encode` with the old DENORM argument (DENORM_NONE only)."""
    tl.static_assert(DENORM == DENORM_NONE)
    return _encode_elements(xbits, X, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, HW_CVT, KEEP_ASM)
