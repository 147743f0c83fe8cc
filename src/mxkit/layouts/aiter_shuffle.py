"""aiter's layouts (ROCm/aiter): the padded, shuffled E8M0 scale layout and the 16x16 pre-shuffle of FP4 weights.

Scale: rows padded to 256, cols to 8; 32x8 blocks of 256 bytes, every 4-byte word holding rows (r, r + 16) x
cols (c, c + 4), so one lane reads the scales of two M/N sub-tiles and two K sub-steps. Source:
``aiter/ops/shuffle.py::shuffle_scale`` (non-guinterleave branch; what ``aiter/utility/fp4_utils.py::
e8m0_shuffle`` calls); the same offsets are written by the ``SHUFFLE`` branch of aiter's Triton
``_dynamic_mxfp4_quant_kernel_asm_layout``. aiter leaves padding uninitialised; mxkit writes 0.

Data: ``aiter/ops/shuffle.py::shuffle_weight(x, layout=(16, 16))`` for a 1-byte dtype (see
:func:`mxkit.layouts.to_data_layout`).
"""

from __future__ import annotations

import torch

from ._tiles import swizzle as _swizzle
from ._tiles import unswizzle as _unswizzle

NAME = "aiter_shuffle"
KERNEL_ID = 2  # the scale-layout constexpr of the quantize kernels
PAD = (256, 8)  # rows, cols padded to multiples of these
TILE = (32, 8)  # rows, cols of one 256-byte block (blocks in row-major order)
DATA_MULTIPLE = (16, 32)  # (N, K-bytes) multiples of the packed data (..., N, K // 2); no padding


def offsets(r, c, cols_p):
    """Byte offset of scale (r, c) in the padded (rows_p, cols_p) scale (the one statement of the formula: the
    host swizzle and the quantize kernels call it)."""
    return ((r // 32) * 32 * cols_p + (c // 8) * 256 + (c % 4) * 64 + (r % 16) * 4
            + ((c // 4) % 2) * 2 + ((r // 16) % 2))


def swizzle(padded: torch.Tensor) -> torch.Tensor:
    """padded (rows_p, cols_p) uint8 -> the layout's bytes as a (rows_p, cols_p) tensor."""
    return _swizzle(padded, TILE, offsets)


def unswizzle(stored: torch.Tensor, rows_p: int, cols_p: int) -> torch.Tensor:
    """The layout's rows_p * cols_p bytes (any shape) -> the padded (rows_p, cols_p) plain scale."""
    return _unswizzle(stored, rows_p, cols_p, TILE, offsets)


# the data shuffle: (b, n // 16, n % 16, kb // 32, kb // 16 % 2, kb % 16)
#   -> (b, n // 16, kb // 32, kb // 16 % 2, n % 16, kb % 16)
_DATA_PERM = (0, 1, 3, 4, 2, 5)
_DATA_INV = (0, 1, 4, 2, 3, 5)


def _data_split(B: int, N: int, KB: int) -> tuple:
    return (B, N // 16, 16, KB // 32, 2, 16)


def shuffle_data(q: torch.Tensor) -> torch.Tensor:
    """Plain packed bytes (..., N, KB) (checked by the caller) -> the shuffled bytes, same shape."""
    N, KB = q.shape[-2:]
    B = q.numel() // (N * KB) if q.numel() else 0
    return q.reshape(_data_split(B, N, KB)).permute(_DATA_PERM).reshape(q.shape)


def unshuffle_data(q: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Shuffled bytes of ``shape`` (..., N, KB) -> the plain packed bytes."""
    N, KB = shape[-2:]
    numel = q.numel()
    B = numel // (N * KB) if numel else 0
    dims = _data_split(B, N, KB)
    return q.reshape(tuple(dims[p] for p in _DATA_PERM)).permute(_DATA_INV).reshape(shape)


try:
    import triton
    import triton.language as tl  # noqa: F401 (the CPU interpreter looks for it in the jit function's module)
except ImportError:  # the torch part works without Triton
    pass
else:
    _offsets = triton.jit(offsets)  # the same formula in the quantize kernels
