"""Triton kernels for Hopper (sm_90), one op family per host module, laid out as OpenAI's triton_kernels:

* ``quantize.py`` (validation, plans, custom ops, the public entry) + ``quantize_details/`` (the ``@triton.jit``
  code by concern: ``_codecs``, ``_scale``, ``_store``, ``_rows``, ``_cols``, ``_cast_transpose``,
  ``_dequantize``, ``_fp8_rowwise``);
* ``matmul.py`` (the scaled GEMMs' dispatch and calls; ``matmul_calls`` / ``matmul_support`` / ``matmul_table``
  beside it) + ``matmul_details/`` (one file per kernel or layout: decode, wgmma, mma PTX, fixups);
* ``moe.py`` (the MoE layer's kernels) + ``moe_details/``; ``fold.py`` + ``fold_details/`` (the exact FP8 fold);
* ``opt_flags.py`` (frozen configs, the per-GPU table, ``override()`` for A/B runs) + ``opt_flags_nvidia.py``
  (the Hopper heuristics); ``launch.py``, ``fast_launch.py``, ``fast_call.py``, ``cuda_driver.py`` (the direct
  launch of compiled kernels).

Triton is a core dependency (Linux): the GEMM dispatch (``matmul.py``) and :mod:`mxkit.nn` import it on any device;
off CUDA they run the reference twins. :func:`mxkit.quantize` / :func:`mxkit.dequantize` import the kernels only
for CUDA tensors."""

from __future__ import annotations

import functools

__all__ = ["triton_available", "quantize_triton", "dequantize_triton"]


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``import triton`` succeeds here; the CUDA kernels (and ``backend="triton"``) need it."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def quantize_triton(*args, **kwargs):
    """:func:`mxkit.kernels.quantize.quantize_triton` (imported on the first call, so that ``import mxkit.kernels``
    needs no Triton): ``quantize_triton(x, fmt, *, axis=-1, block_size=32, scale_mode="floor", rounding="rne",
    scale_layout="plain")``, :func:`mxkit.quantize`'s CUDA kernels with its arguments, results and errors."""
    from .quantize import quantize_triton as impl

    return impl(*args, **kwargs)


def dequantize_triton(*args, **kwargs):
    """:func:`mxkit.kernels.quantize.dequantize_triton` (imported on the first call, so that ``import
    mxkit.kernels`` needs no Triton): ``dequantize_triton(q, dtype=torch.float32)``, :func:`mxkit.dequantize`'s
    CUDA kernel with its arguments, results and errors."""
    from .quantize import dequantize_triton as impl

    return impl(*args, **kwargs)
