"""Triton kernels for Hopper (sm_90). Launchers validate, flatten, allocate and launch; the
``@triton.jit`` bodies live in ``_*.py`` files beside them. Imported lazily: the package works without
Triton (CPU-only installs use :mod:`mxkit.reference`)."""

from __future__ import annotations

import functools

__all__ = ["triton_available", "quantize_triton", "dequantize_triton"]


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def quantize_triton(*args, **kwargs):
    from .quantize import quantize_triton as impl

    return impl(*args, **kwargs)


def dequantize_triton(*args, **kwargs):
    from .quantize import dequantize_triton as impl

    return impl(*args, **kwargs)
