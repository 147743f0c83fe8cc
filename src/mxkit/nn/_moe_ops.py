"""The custom ops through which ``torch.compile`` sees an :class:`mxkit.nn.MXMoE` (:mod:`mxkit.nn.moe`): each runs the
module whose gate_up codes buffer it is given (its key: :func:`mxkit.nn._ops.own_key`) eagerly, with its fake (shapes
only) and, where a gradient flows, its autograd registration. ``torch.export`` takes :mod:`mxkit.nn._moe_export`'s ops
instead, which are given the experts' tensors."""

from __future__ import annotations

from typing import Optional

import torch

from ..moe import router_gpt_oss
from ..moe_reference import route as reference_route
from . import _ops
from ._moe_grad import experts_backward

__all__: list[str] = []  # (registers mxkit::mx_moe, mx_moe_route(_backward), mx_moe_experts(_backward), mx_moe_routed)


@torch.library.custom_op("mxkit::mx_moe", mutates_args=())
def _mx_moe_op(x: torch.Tensor, router_logits: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The experts of the MXMoE whose ``gate_up_qdata`` buffer ``key`` is on x (..., H) routed by ``router_logits``
    (..., E), eagerly (its CUDA kernels): torch.compile's view of an MXMoE. Returns (..., H) in x's dtype."""
    return _ops.module_of_key(key, "moe", "mx_moe")._experts(x, router_logits)


@_mx_moe_op.register_fake
def _mx_moe_fake(x: torch.Tensor, router_logits: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("mxkit::mx_moe_route", mutates_args=())
def _mx_moe_route_op(router_logits: torch.Tensor, top_k: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mxkit.moe_reference.route` of ``router_logits`` (T, E), eagerly: (topk_weights (T, k) float32, topk_ids
    (T, k) int32). torch.compile's view of an MXMoE's routing where a gradient is needed (the eager ops' bits, which
    a compiled softmax need not give)."""
    return tuple(t.clone() for t in reference_route(router_logits, top_k, mode=mode))


@_mx_moe_route_op.register_fake
def _mx_moe_route_fake(router_logits, top_k, mode):
    T = router_logits.shape[0]
    return (router_logits.new_empty(T, top_k, dtype=torch.float32),
            router_logits.new_empty(T, top_k, dtype=torch.int32))


@torch.library.custom_op("mxkit::mx_moe_route_backward", mutates_args=())
def _mx_moe_route_backward_op(router_logits: torch.Tensor, grad: torch.Tensor, top_k: int, mode: str) -> torch.Tensor:
    """The logits' gradient of ``mxkit::mx_moe_route`` for the weights' gradient ``grad`` (T, k): the vjp of the
    reference routing (its softmax's backward, zero on the logits not selected), in the logits' dtype."""
    _, vjp = torch.func.vjp(lambda t: reference_route(t, top_k, mode=mode)[0], router_logits)
    return vjp(grad)[0]


@_mx_moe_route_backward_op.register_fake
def _mx_moe_route_backward_fake(router_logits, grad, top_k, mode):
    return torch.empty_like(router_logits)


def _mx_moe_route_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.top_k, ctx.mode = inputs[1], inputs[2]


def _mx_moe_route_backward(ctx, grad_weights, grad_ids):
    (logits,) = ctx.saved_tensors
    return torch.ops.mxkit.mx_moe_route_backward(logits, grad_weights, ctx.top_k, ctx.mode), None, None


_mx_moe_route_op.register_autograd(_mx_moe_route_backward, setup_context=_mx_moe_route_setup)


@torch.library.custom_op("mxkit::mx_moe_experts", mutates_args=())
def _mx_moe_experts_op(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, router_logits: torch.Tensor,
                       gate_up_bias: Optional[torch.Tensor], down_bias: Optional[torch.Tensor],
                       key: torch.Tensor) -> torch.Tensor:
    """The experts of the MXMoE of ``key`` (its gate_up codes buffer) on x (..., H) routed by (weights (T, k) float32,
    ids (T, k)), the routing of ``router_logits`` (..., E), eagerly (no autograd inside): torch.compile's view of an
    MXMoE whose x, router or expert biases need a gradient. Its backward is :class:`~mxkit.nn._moe_grad.ExpertsGrad`'s
    (``mxkit::mx_moe_experts_backward``); the biases are passed (the module's own) so autograd sees them. Returns (...,
    H) in x's dtype."""
    m = _ops.module_of_key(key, "moe", "mx_moe_experts")
    with torch.no_grad():
        return m._experts(x, router_logits, (weights, ids))


@_mx_moe_experts_op.register_fake
def _mx_moe_experts_fake(x, weights, ids, router_logits, gate_up_bias, down_bias, key):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("mxkit::mx_moe_experts_backward", mutates_args=())
def _mx_moe_experts_backward_op(grad: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                                gate_up_bias: Optional[torch.Tensor], down_bias: Optional[torch.Tensor],
                                key: torch.Tensor, need_x: bool, need_w: bool, need_b1: bool,
                                need_b2: bool) -> list[torch.Tensor]:
    """The gradients [x, weights, gate_up_bias, down_bias] of ``mxkit::mx_moe_experts`` (:func:`~mxkit.nn._moe_grad.
    experts_backward`); an empty tensor where one is not needed."""
    m = _ops.module_of_key(key, "moe", "mx_moe_experts_backward")
    grads = experts_backward(m, grad, x, weights, ids, gate_up_bias, down_bias, need_x, need_w, need_b1, need_b2)
    return [g if g is not None else x.new_empty(0) for g in grads]


@_mx_moe_experts_backward_op.register_fake
def _mx_moe_experts_backward_fake(grad, x, weights, ids, gate_up_bias, down_bias, key, need_x, need_w, need_b1,
                                  need_b2):
    like = (x, weights, gate_up_bias, down_bias)
    need = (need_x, need_w, need_b1 and gate_up_bias is not None, need_b2 and down_bias is not None)
    return [torch.empty_like(t, memory_format=torch.contiguous_format) if n else x.new_empty(0)
            for t, n in zip(like, need)]


def _mx_moe_experts_setup(ctx, inputs, output) -> None:
    x, weights, ids, _, b1, b2, key = inputs
    ctx.save_for_backward(x, weights, ids, b1, b2)
    ctx.key = key  # (the module's own buffer, kept alive by it: not saved, whose unpacking may be another object)


def _mx_moe_experts_backward(ctx, grad):
    x, weights, ids, b1, b2 = ctx.saved_tensors
    n = ctx.needs_input_grad
    need = (n[0], n[1], n[4] and b1 is not None, n[5] and b2 is not None)
    grads = torch.ops.mxkit.mx_moe_experts_backward(grad, x, weights, ids, b1, b2, ctx.key, *need)
    gx, gw, gb1, gb2 = (g if k else None for g, k in zip(grads, need))
    return gx, gw, None, None, gb1, gb2, None


_mx_moe_experts_op.register_autograd(_mx_moe_experts_backward, setup_context=_mx_moe_experts_setup)


@torch.library.custom_op("mxkit::mx_moe_routed", mutates_args=())
def _mx_moe_routed_op(x: torch.Tensor, key: torch.Tensor, num_experts: int,
                      top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MXMoE of ``key`` (its gate_up codes buffer; ``num_experts`` and ``top_k`` its own, for the fake) on x (...,
    H) with its router in one launch (:func:`mxkit.moe.router_gpt_oss`), eagerly: torch.compile's view of a CUDA MXMoE
    at decode sizes. Returns (y (..., H) in x's dtype, logits (..., E) in x's dtype, topk_weights (T, k) float32)."""
    m = _ops.module_of_key(key, "moe", "mx_moe_routed")
    logits, weights, ids = router_gpt_oss(x.reshape(-1, x.shape[-1]), m.router.weight, m.router.bias, m.top_k)
    logits = logits.view(*x.shape[:-1], m.num_experts)
    return m._experts(x, logits, (weights, ids)), logits, weights


@_mx_moe_routed_op.register_fake
def _mx_moe_routed_fake(x: torch.Tensor, key: torch.Tensor, num_experts: int,
                        top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T = x.numel() // x.shape[-1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(*x.shape[:-1], num_experts),
            x.new_empty(T, top_k, dtype=torch.float32))
