"""The plain scale layout: row-major (rows, cols), what :func:`mxkit.quantize` returns by default."""

from __future__ import annotations

NAME = "plain"
KERNEL_ID = 0  # the scale-layout constexpr of the quantize kernels
KERNEL_ID_T = 3  # kernel-internal: a plain scale stored transposed, [cols, rows] (the launcher's scale_t)
PAD = (1, 1)


def offsets(r, c, cols):
    """Byte offset of scale (r, c) in a row-major (rows, cols) scale."""
    return r * cols + c


try:
    import triton
    import triton.language as tl  # noqa: F401 (the CPU interpreter looks for it in the jit function's module)
except ImportError:  # the torch part works without Triton
    pass
else:
    _offsets = triton.jit(offsets)  # the same formula in the quantize kernels
