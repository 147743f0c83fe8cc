"""The exact paths' GEMMs on cuBLAS (:mod:`mxkit.kernels.matmul`): :func:`dense_gemm` and :func:`fp32_gemm`, with
float32 accumulation and nothing less (:class:`mxkit._precision.exact_float32`: TF32 and reduced-precision
reductions off for the call)."""

from __future__ import annotations

import torch

from ..._precision import exact_float32


def fp32_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T for float32 x, w with TF32 off (the fp32-exact path and the float32 route of special rows); on the
    CPU x and w are made contiguous first (its BLAS picks a kernel by layout: strided operands get the contiguous
    copies' bits; cuBLAS reads a row-strided x as it is)."""
    if x.device.type == "cpu":
        x, w = x.contiguous(), w.contiguous()
    with exact_float32(x.device.type):
        return x @ w.t()


def dense_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """x @ w.T for 16-bit x, w with float32 accumulation; output in ``out`` with one rounding (x made contiguous
    first on the CPU, and w, as in :func:`fp32_gemm`)."""
    if x.device.type == "cpu":
        x, w = x.contiguous(), w.contiguous()
    with exact_float32(x.device.type):
        if out == x.dtype or x.device.type != "cuda":
            return (x @ w.t()) if x.device.type == "cuda" else (x.float() @ w.float().t()).to(out)
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            return x.float() @ w.float().t()
