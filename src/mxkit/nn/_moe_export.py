"""How :class:`~mxkit.nn.MXMoE` goes through ``torch.export`` (the module docstring of :mod:`mxkit.nn.moe`): its
experts as ``mxkit::mx_moe_export`` on the expert buffers and a text of the layer's settings (:func:`export_spec`),
so the exported program holds the experts and runs in another process; the op rebuilds the layer around the
tensors it is given (:func:`_rebuilt`), and its backward is :class:`~mxkit.nn._moe_grad.ExpertsGrad`'s."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Optional

import torch

from .._device import elsewhere
from ..formats import Rounding, ScaleMode
from ..ops import refuse_forward_ad
from ._moe_grad import experts_backward
from ._ops import rebuilt, spec_fields

if TYPE_CHECKING:
    from .moe import MXMoE

_EXPERTS = ("gate_up", "down")


def export_buffers(m: "MXMoE") -> tuple:
    """The expert tensors ``mxkit::mx_moe_export`` takes from MXMoE ``m``: gate_up / down qdata and scale in the
    layout the module holds, and the fold layout's row scales (None in the other layouts)."""
    rows = [m._buffers.get(f"{n}_row_scale") if m._fold_layout else None for n in _EXPERTS]
    return (m.gate_up_qdata, m.gate_up_scale, m.down_qdata, m.down_scale, *rows)


def export_spec(m: "MXMoE") -> str:
    """What rebuilds MXMoE ``m``'s expert computation around its buffers (:func:`_rebuilt`): ``key=value``
    fields joined by ``;`` (read back by :func:`_parse_spec`), built from constants only, so dynamo folds it into
    the graph (it does not trace json)."""
    flags = m._mma_flags or ()
    flags = ",".join("".join("1" if f else "0" for f in t) for t in flags)
    lo, hi = m.expert_range
    return (f"hidden_size={m.hidden_size};intermediate_size={m.intermediate_size};"
            f"num_experts={m.num_experts};top_k={m.top_k};weight_format={m.weight_format.name};"
            f"routing={m.routing};activation={m.activation};expert_range={lo},{hi};"
            f"scale_mode={ScaleMode.parse(m.scale_mode).value};"
            f"rounding={Rounding.parse(m.rounding).value};block_size={m.block_size};"
            f"backend={m.backend};act_format={m.act_format or ''};mma_flags={flags};"
            f"fold={int(m._fold_layout)}")


_REBUILT: dict = {}  # id of gate_up_qdata -> (key, (layer, the lock of its calls)): :func:`mxkit.nn._ops.rebuilt`


@contextlib.contextmanager
def _rebuilt(spec: str, bufs: tuple, b1: Optional[torch.Tensor], b2: Optional[torch.Tensor]):
    """An :class:`MXMoE` computing the experts of ``spec`` (:func:`export_spec`) on aliases of the expert tensors
    given (a router on the meta device that is never called), made once (:func:`mxkit.nn._ops.rebuilt`: building a
    layer takes ~0.2 ms, and its packed or folded copies are kept), with the biases, which a training step changes,
    attached for the duration of the ``with`` block (one call at a time a layer)."""
    from .moe import MXMoE  # (moe imports this module: its forward calls the op)

    def build() -> tuple:
        c = _parse_spec(spec)
        m = MXMoE(c["hidden_size"], c["intermediate_size"], c["num_experts"], c["top_k"], c["weight_format"],
                  bias=False, routing=c["routing"], activation=c["activation"], expert_range=c["expert_range"],
                  scale_mode=c["scale_mode"], rounding=c["rounding"], block_size=c["block_size"],
                  backend=c["backend"], act_format=c["act_format"], keep_source=True, device="meta")
        del m.gate_up_bias, m.down_bias  # (plain attributes below: the program's tensors as they are)
        m._mma_flags, m._fold_layout = c["mma_flags"], bool(c["fold"])
        for name, t in zip(("gate_up_qdata", "gate_up_scale", "down_qdata", "down_scale"), bufs):
            setattr(m, name, t.detach())  # (a view would hold its base alive)
        if m._fold_layout:
            for name, t in zip(_EXPERTS, bufs[4:]):
                m._buffers[f"{name}_row_scale"] = t.detach()
        return m, threading.Lock()

    m, lock = rebuilt(_REBUILT, [t for t in bufs if t is not None], spec, build)
    with lock:
        m.gate_up_bias, m.down_bias = b1, b2
        try:
            if bufs[0].is_cuda and elsewhere(bufs[0]):  # (the kernels launch on the current device)
                with torch.cuda.device(bufs[0].device):
                    yield m
            else:
                yield m
        finally:
            m.gate_up_bias = m.down_bias = None


def _parse_spec(spec: str) -> dict:
    """The fields of :func:`export_spec`'s text, typed back."""
    c = spec_fields(spec)
    for key in ("hidden_size", "intermediate_size", "num_experts", "top_k", "block_size", "fold"):
        c[key] = int(c[key])
    c["expert_range"] = tuple(int(v) for v in c["expert_range"].split(","))
    c["act_format"] = c["act_format"] or None
    c["mma_flags"] = (tuple(tuple(ch == "1" for ch in t) for t in c["mma_flags"].split(","))
                      if c["mma_flags"] else None)
    return c


@torch.library.custom_op("mxkit::mx_moe_export", mutates_args=())
def _mx_moe_export_op(x: torch.Tensor, router_logits: torch.Tensor, weights: Optional[torch.Tensor],
                      ids: Optional[torch.Tensor], gate_up_qdata: torch.Tensor, gate_up_scale: torch.Tensor,
                      down_qdata: torch.Tensor, down_scale: torch.Tensor, gate_up_row_scale: Optional[torch.Tensor],
                      down_row_scale: Optional[torch.Tensor], gate_up_bias: Optional[torch.Tensor],
                      down_bias: Optional[torch.Tensor], spec: str) -> torch.Tensor:
    """The experts of an :class:`MXMoE` given as tensors (its four expert buffers in the layout it held, the fold
    layout's row scales or None, its biases) and ``spec`` (:func:`export_spec`) on x (..., H), routed by
    ``router_logits`` (..., E), or by (weights (T, k) float32, ids (T, k)) where given (the gradient case, after
    ``mxkit::mx_moe_route``), eagerly: torch.export's view of an MXMoE, whose program then holds the experts and runs
    in any process. Its backward is :class:`~mxkit.nn._moe_grad.ExpertsGrad`'s. Returns (..., H) in x's dtype."""
    refuse_forward_ad("mxkit::mx_moe_export")
    bufs = (gate_up_qdata, gate_up_scale, down_qdata, down_scale, gate_up_row_scale, down_row_scale)
    with _rebuilt(spec, bufs, gate_up_bias, down_bias) as m, torch.no_grad():
        return m._experts(x, router_logits, None if weights is None else (weights, ids))


@_mx_moe_export_op.register_fake
def _mx_moe_export_fake(x, router_logits, weights, ids, *tensors_and_spec):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("mxkit::mx_moe_export_backward", mutates_args=())
def _mx_moe_export_backward_op(grad: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                               gate_up_qdata: torch.Tensor, gate_up_scale: torch.Tensor, down_qdata: torch.Tensor,
                               down_scale: torch.Tensor, gate_up_row_scale: Optional[torch.Tensor],
                               down_row_scale: Optional[torch.Tensor], gate_up_bias: Optional[torch.Tensor],
                               down_bias: Optional[torch.Tensor], spec: str, need_x: bool, need_w: bool,
                               need_b1: bool, need_b2: bool) -> list[torch.Tensor]:
    """The gradients [x, weights, gate_up_bias, down_bias] of ``mxkit::mx_moe_export`` (:func:`~mxkit.nn._moe_grad.
    experts_backward` on the rebuilt layer); an empty tensor where one is not needed."""
    bufs = (gate_up_qdata, gate_up_scale, down_qdata, down_scale, gate_up_row_scale, down_row_scale)
    with _rebuilt(spec, bufs, gate_up_bias, down_bias) as m:
        grads = experts_backward(m, grad, x, weights, ids, gate_up_bias, down_bias, need_x, need_w, need_b1, need_b2)
    return [g if g is not None else x.new_empty(0) for g in grads]


@_mx_moe_export_backward_op.register_fake
def _mx_moe_export_backward_fake(grad, x, weights, ids, q1, s1, q2, s2, r1, r2, gate_up_bias, down_bias, spec,
                                 need_x, need_w, need_b1, need_b2):
    like = (x, weights, gate_up_bias, down_bias)
    need = (need_x, need_w, need_b1 and gate_up_bias is not None, need_b2 and down_bias is not None)
    return [torch.empty_like(t, memory_format=torch.contiguous_format) if n else x.new_empty(0)
            for t, n in zip(like, need)]


def _mx_moe_export_setup(ctx, inputs, output) -> None:
    x, _, weights, ids, *bufs, b1, b2, spec = inputs
    ctx.save_for_backward(x, weights, ids, *bufs, b1, b2)
    ctx.spec = spec


def _mx_moe_export_backward(ctx, grad):
    x, weights, ids, *bufs, b1, b2 = ctx.saved_tensors
    if weights is None:  # (the op without its routing: a program exported without gradients)
        raise RuntimeError("mxkit::mx_moe_export: this MXMoE was exported without gradients (under torch.no_grad(), "
                           "or with nothing needing one), so its program has no backward through the experts; export "
                           "it with gradients enabled to train through the program")
    n = ctx.needs_input_grad
    need = (n[0], n[2], n[10] and b1 is not None, n[11] and b2 is not None)
    grads = torch.ops.mxkit.mx_moe_export_backward(grad, x, weights, ids, *bufs, b1, b2, ctx.spec, *need)
    gx, gw, gb1, gb2 = (g if k else None for g, k in zip(grads, need))
    return gx, None, gw, None, None, None, None, None, None, None, gb1, gb2, None


_mx_moe_export_op.register_autograd(_mx_moe_export_backward, setup_context=_mx_moe_export_setup)
