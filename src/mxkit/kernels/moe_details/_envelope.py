"""Which MX expert weights the MoE kernels (:mod:`mxkit.kernels.moe`) take: element kinds, the bf16-exact
scale envelope (:func:`mxkit.kernels.matmul_details._envelope.exact_scale_range`) and NaN / Inf codes, each
read once per tensor and version (one host sync, cached)."""

from __future__ import annotations

import torch

from ...tensor import MXTensor
from ..matmul import W_KINDS, _nonfinite_codes
from ..matmul_details import _mma_decode
from ..matmul_details._envelope import _per_version, exact_scale_range, scale_extrema


def _in_envelope(w: MXTensor) -> bool:
    """Whether every scale byte of ``w`` (other than 0xFF, which yields NaN as the reference does) lies in the
    bf16-exact range of its format. One host sync per scale tensor and version (cached)."""
    lo, hi, _ = _per_version("extrema", w.scale, lambda: scale_extrema(w.scale))
    return _envelope_ok(w.fmt, lo, hi)


def _envelope_ok(fmt, lo: int, hi: int) -> bool:
    """Whether scale bytes in [lo, hi] (0xFF aside; hi < lo: none) are all in fmt's bf16-exact range."""
    rng = exact_scale_range(fmt, torch.bfloat16)
    return hi < lo or (rng[0] <= lo and hi <= rng[1])


def supported(w: MXTensor) -> bool:
    """Whether the grouped kernel takes expert weights ``w`` (element kind, plain scales, envelope, and N rows an
    expert within its grid's y: N / 64 <= 65535, CUDA's limit)."""
    return (w.fmt.name in W_KINDS and w.fmt.bits != 6 and w.block_size == 32
            and w.shape[-2] <= 64 * _mma_decode.MAX_STRIPS and _in_envelope(w))


def _codes_finite(w: MXTensor) -> bool:
    """Whether no element code of the experts ``w`` is NaN or Inf (True for formats without such codes; MXFP8:
    the W8A16 tensor-core kernels decode them as finite values). One host sync per MXFP8 codes tensor and version
    (cached)."""
    def compute() -> bool:
        bad = _nonfinite_codes(w)
        return bad is None or not bool(bad)

    return _per_version("finite", w.qdata, compute)
