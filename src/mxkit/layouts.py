"""Scale and element-data layouts used by MX GEMM libraries (pure PyTorch; no kernels here).

Scale layouts (E8M0 bytes of a 2-D ``(rows, cols)`` plain scale, ``cols = K // 32``):

* ``"plain"`` — row-major ``(rows, cols)``, what :func:`mxkit.quantize` returns by default.
* ``"nvidia_128x4"`` — NVIDIA's blocked scale-factor layout (cuBLAS "1D block scaling factors layout",
  TransformerEngine, ``torch._scaled_mm`` MX on Blackwell): rows padded to 128, cols to 4.
* ``"aiter_shuffle"`` — aiter's padded (rows → 256, cols → 8) and shuffled E8M0 layout.

Padding bytes are 0. Converters: :func:`to_layout` / :func:`from_layout`.
"""

from __future__ import annotations

__all__ = ["SCALE_LAYOUTS", "scale_layout_shape"]

# layout name -> (row multiple, col multiple) the plain (rows, cols) scale is padded to
SCALE_LAYOUTS: dict[str, tuple[int, int]] = {
    "plain": (1, 1),
    "nvidia_128x4": (128, 4),
    "aiter_shuffle": (256, 8),
}


def _check_layout(layout: str) -> tuple[int, int]:
    if layout not in SCALE_LAYOUTS:
        raise ValueError(f"unknown scale layout {layout!r}; known: {', '.join(SCALE_LAYOUTS)}")
    return SCALE_LAYOUTS[layout]


def scale_layout_shape(rows: int, cols: int, layout: str) -> tuple[int, int]:
    """Shape ``(rows_padded, cols_padded)`` of a ``(rows, cols)`` plain scale stored in ``layout``."""
    rm, cm = _check_layout(layout)
    return (-(-rows // rm) * rm, -(-cols // cm) * cm)
