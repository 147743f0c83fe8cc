"""The backward of :class:`mxkit.nn.MXMoE`'s experts: one expert at a time in float32 on its exact dequantized
weights (the layer's forward, without autograd, keeps its bits)."""

from __future__ import annotations

from typing import Optional

import torch

from .._autocast import autocast_off
from .._cache import tensor_version
from .._precision import exact_float32
from ..moe_reference import ACTIVATIONS, _bf16_values, _fp8_rowwise_values, _mxfp4_values
from .linear import FP8_ROWWISE

__all__ = ["ExpertsGrad", "experts_backward"]


class ExpertsGrad(torch.autograd.Function):
    """The experts' weighted sum y (..., H) of an :class:`MXMoE` where autograd needs a gradient of x, the routing
    weights (hence the router) or the expert biases.

    forward(x, weights (T, k), b_gate_up, b_down, ids (T, k), logits (detached), layer): the layer's path without
    autograd, routed by (weights, ids) (the routing of ``logits``), so y has the bits it has without gradients.
    backward: for each expert that received a pair, in float32: its gate_up and down weights dequantized (exact),
    h = x W1ᵀ + b1, a = act(h), y_e = a W2ᵀ + b2 differentiated by autograd (the activation's own derivative,
    clamps included), with y's gradient times each pair's routing weight; a pair's routing-weight gradient is
    <grad y, y_e>. Where the forward quantized activations (W4A8's FP8 tokens and intermediate, MXFP4 x MXFP4's
    MXFP4 ones), y_e is recomputed with the forward's rounding points (the tokens and the intermediate quantized,
    h and the down GEMM rounded to bf16: :func:`~mxkit.moe_reference.moe_w4a8_reference`'s steps, in float32), each
    rounding passed straight through: the routing weights get the gradient of the function the forward computed
    (as :func:`mxkit.moe.moe_w4a8` differentiating its reference does), x and the biases theirs at the forward's
    quantized values. Memory: one expert's dequantized weights and its pairs' activations at a time.
    """

    @staticmethod
    def forward(ctx, x, weights, b1, b2, ids, logits, layer):
        with torch.no_grad():
            y = layer._experts(x, logits, (weights.detach(), ids))
        # the experts this forward multiplied by (after it: a first forward may re-lay them) and their layout, kept
        # for the backward: buffers swapped in by torch.func.functional_call are differentiated, not the module's
        # own, and an in-place write between the two raises as it does for nn.Linear. On ctx with their versions,
        # not saved tensors: experts made under inference_mode cannot be saved, and saved-tensor hooks
        # (save_on_cpu) would copy every expert's bytes each forward
        ctx.save_for_backward(x, weights, ids, b1, b2)
        ctx.bufs, ctx.layout = layer._expert_buffers(), layer.expert_layout
        ctx.versions = _versions(ctx.bufs.values())
        ctx.layer = layer
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weights, ids, b1, b2 = ctx.saved_tensors
        if _versions(ctx.bufs.values()) != ctx.versions:
            raise RuntimeError("one of the variables needed for gradient computation has been modified by an inplace "
                               "operation: MXMoE's expert bytes were written between the forward and this backward "
                               "(as for nn.Linear's weight: backward before loading new experts)")
        grads = experts_backward(ctx.layer, gy, x, weights, ids, b1, b2, *ctx.needs_input_grad[:4],
                                 bufs=(ctx.bufs, ctx.layout))
        return (*grads, None, None, None)


def _versions(tensors) -> tuple:
    """Version counters (None for a tensor that keeps none: made under inference_mode)."""
    return tuple(tensor_version(t) for t in tensors)


def _bf16_through(v: torch.Tensor) -> torch.Tensor:
    """v rounded to bfloat16 (the forward's GEMM outputs) in value, the identity in gradient."""
    return _bf16_values(v).to(v.dtype)


def _straight_through(act_format: Optional[str]):
    """None for bf16 tokens; else ``q(v)``: v (R, C) float32 quantized rowwise as the forward quantizes the tokens
    and the intermediate (FP8 E4M3 rowwise, or MXFP4 along C), in value, the identity in gradient."""
    if act_format is None:
        return None
    values = _fp8_rowwise_values if act_format == FP8_ROWWISE else _mxfp4_values
    return lambda v: values(v).to(v.dtype)


@autocast_off
def experts_backward(layer, gy: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     b1, b2, need_x: bool, need_w: bool, need_b1: bool, need_b2: bool,
                     bufs: Optional[dict] = None) -> tuple:
    """:class:`ExpertsGrad`'s backward (and ``mxkit::mx_moe_experts``'): the gradients (x, weights, b1, b2) of the
    experts' weighted sum, each None where not needed (or its tensor None), in its input's dtype and shape. Its
    float32 products at full precision whatever ``torch.set_float32_matmul_precision`` says (it followed it:
    oneDNN's bf16 on a CPU, TF32 on a GPU). Differentiable again (``create_graph=True``): x, the routing weights and
    the biases enter it as they are, so a second-order gradient reaches each of them. ``bufs``: (the expert tensors
    the forward read, ``layer._expert_buffers()`` then, and ``layer.expert_layout`` then), else the layer's now."""
    if torch.compiler.is_compiling():  # (the context switches process-wide settings, which dynamo does not trace)
        return _experts_backward(layer, gy, x, weights, ids, b1, b2, need_x, need_w, need_b1, need_b2, bufs)
    with exact_float32(x.device.type):
        return _experts_backward(layer, gy, x, weights, ids, b1, b2, need_x, need_w, need_b1, need_b2, bufs)


def _experts_backward(layer, gy, x, weights, ids, b1, b2, need_x, need_w, need_b1, need_b2, bufs=None) -> tuple:
    H, k = x.shape[-1], ids.shape[-1]
    x2, g2 = x.reshape(-1, H), gy.reshape(-1, H).to(torch.float32)
    f32 = dict(dtype=torch.float32, device=x.device)
    gx = torch.zeros(x2.shape, **f32) if need_x else None
    gw = torch.zeros(weights.shape, **f32) if need_w else None
    gb1 = torch.zeros(b1.shape, **f32) if need_b1 and b1 is not None else None
    gb2 = torch.zeros(b2.shape, **f32) if need_b2 and b2 is not None else None
    lo, hi = layer.expert_range
    act = ACTIVATIONS[layer.activation]
    quant = _straight_through(layer.act_format)
    xq2 = quant(x2.to(torch.float32)) if quant is not None else None  # (each token's quantization: all of H)
    flat = ids.reshape(-1)
    for e in torch.unique(flat).tolist():
        if not lo <= e < hi:  # another rank's expert (or an id outside the layer): contributes 0
            continue
        pair = (flat == e).nonzero().squeeze(1)
        t, slot = pair // k, pair % k
        w1, w2 = (layer._expert_weight(name, e - lo, *(bufs or ())) for name in ("gate_up", "down"))
        xe = x2[t].to(torch.float32) if quant is None else xq2[t]
        # (not detached: under create_graph the second-order gradients reach the biases through them)
        b1e = None if b1 is None else b1[e - lo].to(torch.float32)
        b2e = None if b2 is None else b2[e - lo].to(torch.float32)

        def expert(xe, *biases, w1=w1, w2=w2, b1e=b1e, b2e=b2e):
            it = iter(biases)
            b1e, b2e = (None if b is None else next(it) for b in (b1e, b2e))
            h = xe @ w1.t()
            if quant is None:
                ye = act(h if b1e is None else h + b1e) @ w2.t()
                return ye if b2e is None else ye + b2e
            h = _bf16_through(h)  # (the quantized paths' rounding points, each passed straight through)
            ye = _bf16_through(quant(act(h if b1e is None else h + b1e)) @ w2.t())
            return ye if b2e is None else ye + b2e

        # torch.func.vjp rather than torch.autograd.grad: it also differentiates inside a custom op's kernel
        # (mxkit::mx_moe_experts_backward), where the autograd dispatch keys are excluded
        prims = (xe, *(b for b in (b1e, b2e) if b is not None))
        if need_x or gb1 is not None or gb2 is not None:
            ye, vjp = torch.func.vjp(expert, *prims)
            grads = vjp(g2[t] * weights[t, slot, None].to(torch.float32))
        else:  # the routing weights' gradient alone: the expert's output, no backward
            ye, grads = expert(*prims), (None, None, None)
        got = iter(grads[1:])
        gb1e = None if b1e is None else next(got)
        gb2e = None if b2e is None else next(got)
        if need_x:
            gx.index_add_(0, t, grads[0])
        if gb1 is not None:
            gb1[e - lo] = gb1e
        if gb2 is not None:
            gb2[e - lo] = gb2e
        if need_w:
            gw[t, slot] = (g2[t] * ye).sum(-1)
    cast = (lambda g, like: None if g is None else g.to(like.dtype).view(like.shape))
    return cast(gx, x), cast(gw, weights), cast(gb1, b1), cast(gb2, b2)
