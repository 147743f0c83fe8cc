"""mxkit: OCP Microscaling (MX) formats for PyTorch on NVIDIA Hopper.

Layers (each imports only the ones before it): ``formats`` → ``layouts`` → the containers (``tensor``:
MXTensor) → ``reference`` (and ``moe_reference``) → the containers built on the reference (``fold``: Folded,
``packed``: PackedWeight, Fp8Rowwise) → ``kernels`` → ``ops`` (and ``moe``) → ``nn`` → ``cli`` / ``bench``.
Kernels take and return the containers; they never import ops or nn.
"""

from .formats import (
    BLOCK_SIZE,
    FORMATS,
    MXFP4_E2M1,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    ElementFormat,
    Rounding,
    ScaleMode,
    get_format,
)
from .ops import (
    cast_transpose,
    dequantize,
    gemm_plan,
    matmul,
    pack_weight,
    quantize,
    quantize_fold,
    quantize_fp8_rowwise,
)
from .moe import moe  # the op; its module stays importable as ``from mxkit.moe import ...``
from .packed import Fp8Rowwise, PackedWeight
from .tensor import MXTensor

__version__ = "0.1.0"


def quantize_model(model, weight_format, *, act_format=None, scale_mode=ScaleMode.FLOOR, rounding=Rounding.RNE,
                   block_size=BLOCK_SIZE, skip=None, compute_qsnr=True, progress=True, return_report=False, fuse=False,
                   dense_cache=None):
    """Replace every ``nn.Linear`` of ``model`` by an MXLinear of ``weight_format`` weights, in place, and return
    ``model`` (or ``(model, report)`` with ``return_report=True``): :func:`mxkit.nn.quantize_model`, whose
    parameters (the same names and defaults), return value and errors (ValueError / TypeError for unknown names, a
    bad ``block_size`` or ``skip``, a bare ``nn.Linear``) these are (imported lazily: ``mxkit.nn`` is a higher
    layer)."""
    from .nn import quantize_model as impl

    return impl(model, weight_format, act_format=act_format, scale_mode=scale_mode, rounding=rounding,
                block_size=block_size, skip=skip, compute_qsnr=compute_qsnr, progress=progress,
                return_report=return_report, fuse=fuse, dense_cache=dense_cache)


__all__ = [
    "BLOCK_SIZE",
    "FORMATS",
    "MXFP4_E2M1",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXINT8",
    "ElementFormat",
    "MXTensor",
    "Fp8Rowwise",
    "PackedWeight",
    "gemm_plan",
    "pack_weight",
    "quantize_fold",
    "quantize_fp8_rowwise",
    "cast_transpose",
    "Rounding",
    "ScaleMode",
    "dequantize",
    "get_format",
    "matmul",
    "moe",
    "quantize",
    "quantize_model",
]
