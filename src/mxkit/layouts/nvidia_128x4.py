"""NVIDIA's blocked scale-factor layout (cuBLAS "1D block scaling factors layout", TransformerEngine,
``torch._scaled_mm`` MX on Blackwell): rows padded to 128, cols to 4, 128x4 tiles of 512 bytes.

Sources: cuBLAS docs, "1D Block Scaling Factors Layout" (docs.nvidia.com/cuda/cublas,
#d-block-scaling-factors-layout); TransformerEngine ``nvte_swizzle_scaling_factors``; torchao
``torchao/prototype/mx_formats/utils.py::to_blocked`` (checked against it in tests/layouts/).
"""

from __future__ import annotations

from ._tiles import swizzle as _swizzle
from ._tiles import unswizzle as _unswizzle

NAME = "nvidia_128x4"
KERNEL_ID = 1  # the scale-layout constexpr of the quantize kernels
PAD = (128, 4)  # rows, cols padded to multiples of these
TILE = (128, 4)  # rows, cols of one 512-byte tile (tiles in row-major order)


def offsets(r, c, cols_p):
    """Byte offset of scale (r, c) in the padded (rows_p, cols_p) scale: 512-byte tiles in row-major order over
    (rows_p / 128, cols_p / 4); inside a tile, row r % 32 of the 32x16 tile holds rows r % 32 + 32 k, k = 0..3,
    4 bytes each. The one statement of the formula: the host swizzle and the quantize kernels call it."""
    return ((r // 128) * (cols_p // 4) + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + (c % 4)


def swizzle(padded):
    """padded (rows_p, cols_p) uint8 -> the layout's bytes as a (rows_p, cols_p) tensor."""
    return _swizzle(padded, TILE, offsets)


def unswizzle(stored, rows_p: int, cols_p: int):
    """The layout's rows_p * cols_p bytes (any shape) -> the padded (rows_p, cols_p) plain scale."""
    return _unswizzle(stored, rows_p, cols_p, TILE, offsets)


try:
    import triton
    import triton.language as tl  # noqa: F401 (the CPU interpreter looks for it in the jit function's module)
except ImportError:  # the torch part works without Triton
    pass
else:
    _offsets = triton.jit(offsets)  # the same formula in the quantize kernels
