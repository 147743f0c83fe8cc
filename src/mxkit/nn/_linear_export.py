"""How an :class:`~mxkit.nn.MXLinear` that quantizes its input (``act_format``) goes through ``torch.export``: as
``mxkit::mx_linear_export`` on its weight buffers and a text of the layer's settings (:func:`export_spec`), so the
program holds the weight and runs in another process (an MXLinear without ``act_format`` exports as
``mxkit::mx_matmul``). The op rebuilds the layer around the weight it is given (:func:`_rebuilt`); x's gradient
is registered on it (``mxkit::mx_linear_export_dgrad``: :func:`mxkit.ops.linear_input_grad`'s straight-through
rule, as ``mxkit::mx_linear``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ..formats import Rounding, ScaleMode
from ..ops import linear_input_grad, refuse_forward_ad
from ._ops import rebuilt, spec_fields

if TYPE_CHECKING:
    from .linear import MXLinear


def export_spec(m: "MXLinear") -> str:
    """What rebuilds MXLinear ``m`` around its weight buffers (:func:`_rebuilt`): ``key=value`` fields joined by
    ``;``, built from constants only, so dynamo folds it into the graph."""
    act = getattr(m.act_format, "name", m.act_format)
    return (f"in_features={m.in_features};out_features={m.out_features};weight_format={m.weight_format.name};"
            f"act_format={act};scale_mode={ScaleMode.parse(m.scale_mode).value};"
            f"rounding={Rounding.parse(m.rounding).value};"
            f"block_size={m.block_size}")


_REBUILT: dict = {}  # id of weight_qdata -> (key, layer): :func:`mxkit.nn._ops.rebuilt`


def _rebuilt(spec: str, qdata: torch.Tensor, scale: torch.Tensor) -> "MXLinear":
    """An :class:`~mxkit.nn.MXLinear` of ``spec`` (:func:`export_spec`) on aliases of (qdata, scale), without a bias
    (the ops pass theirs to each call), packed for the CUDA paths as the module is, once
    (:func:`mxkit.nn._ops.rebuilt`)."""
    from .linear import MXLinear  # (linear imports this module: its forward calls the op)

    def build() -> "MXLinear":
        c = spec_fields(spec)
        m = MXLinear(int(c["in_features"]), int(c["out_features"]), c["weight_format"], bias=False,
                     act_format=c["act_format"], scale_mode=c["scale_mode"], rounding=c["rounding"],
                     block_size=int(c["block_size"]), device="meta")
        m.weight_qdata, m.weight_scale = qdata.detach(), scale.detach()  # (a view would hold its base alive)
        m.repack()
        return m

    return rebuilt(_REBUILT, (qdata, scale), spec, build)


@torch.library.custom_op("mxkit::mx_linear_export", mutates_args=())
def _mx_linear_export_op(x: torch.Tensor, weight_qdata: torch.Tensor, weight_scale: torch.Tensor,
                         bias: Optional[torch.Tensor], spec: str) -> torch.Tensor:
    """The MXLinear of ``spec`` (:func:`export_spec`) with weight (``weight_qdata``, ``weight_scale``) and ``bias``
    on x (..., in_features), eagerly (its kernels): torch.export's view of an MXLinear with ``act_format``. Returns
    (..., out_features) in x's dtype."""
    refuse_forward_ad("mxkit::mx_linear_export")
    with torch.no_grad():  # (autograd is the op's: the registered backward below)
        return _rebuilt(spec, weight_qdata, weight_scale)._eager(x, bias)


@_mx_linear_export_op.register_fake
def _mx_linear_export_fake(x, weight_qdata, weight_scale, bias, spec):
    return x.new_empty((*x.shape[:-1], weight_qdata.shape[0]))


@torch.library.custom_op("mxkit::mx_linear_export_dgrad", mutates_args=())
def _mx_linear_export_dgrad_op(grad: torch.Tensor, weight_qdata: torch.Tensor, weight_scale: torch.Tensor,
                               spec: str, dtype: torch.dtype) -> torch.Tensor:
    """x's gradient of ``mxkit::mx_linear_export``: ``grad (..., out_features) @ dequantize(weight)`` in float32,
    cast to ``dtype`` (the straight-through rule of :func:`mxkit.ops.with_input_grad`)."""
    return linear_input_grad(grad, _rebuilt(spec, weight_qdata, weight_scale).weight_mx, dtype)


@_mx_linear_export_dgrad_op.register_fake
def _mx_linear_export_dgrad_fake(grad, weight_qdata, weight_scale, spec, dtype):
    in_features = int(spec_fields(spec)["in_features"])
    return grad.new_empty((*grad.shape[:-1], in_features), dtype=dtype)


def _setup(ctx, inputs, output) -> None:
    x, q, s, bias, spec = inputs
    ctx.save_for_backward(q, s)
    ctx.spec, ctx.x_dtype = spec, x.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad):
    q, s = ctx.saved_tensors
    gx = gb = None
    if ctx.needs_input_grad[0]:
        gx = torch.ops.mxkit.mx_linear_export_dgrad(grad, q, s, ctx.spec, ctx.x_dtype)
    if ctx.needs_input_grad[3]:
        gb = grad.reshape(-1, grad.shape[-1]).to(torch.float32).sum(0).to(ctx.bias_dtype)
    return gx, None, None, gb, None


_mx_linear_export_op.register_autograd(_backward, setup_context=_setup)
