"""A gated MLP whose gate and up projections and SiLU-gated product run as one MX GEMM with its epilogue.

HF transformers' Llama, Mistral, Qwen2 / 3 (and most decoder MLPs since) compute
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with ``act_fn`` SiLU: in decode, two GEMM launches (or one for
:func:`~mxkit.nn.fuse_siblings`' stacked rows), then an elementwise kernel that reads both outputs back.
:func:`fuse_gated_mlp` replaces each such module, once its three projections are :class:`~mxkit.nn.MXLinear`,
by an :class:`MXGatedMLP`, which holds the gate and up rows interleaved in one MXLinear (gate row 0, up row 0,
gate row 1, ...: each output element the one its member computes) and, at one row of bf16 activations (one token
of batch-1 decode) with MXFP4 weights on CUDA, runs them on the MoE decode path's pairs kernel over one expert
(:func:`mxkit.kernels.matmul_details._mma_decode.swiglu_mma`): the GEMM and ``silu(gate) * up`` in one launch,
in float32 from the float32 sums, rounded to bf16 once (HF rounds gate and up to bf16 first, then the SiLU and the
product each once more). The pairs kernel decodes each weight tile once per row, where the dense decode kernel
decodes it once for up to 8 rows, and both are bound by that decode: past one row the GEMM path is the faster.
Elsewhere (more rows, other formats or dtypes, gradients, the CPU) it is the interleaved
GEMM, then ``silu(gate) * up`` in x's dtype, HF's order. Under ``torch.compile`` the one-launch path (one bf16 row,
CUDA, inference) is the custom op ``mxkit::mx_gated_act``; other inputs trace the GEMM (``mxkit::mx_linear``) and
leave the SiLU product to Inductor. The state_dict holds ``gate_up`` (the interleaved weight) and
``down_proj``: fuse after loading.
"""

from __future__ import annotations

import inspect

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .._device import elsewhere, exporting
from ..kernels.matmul_details import _mma_decode
from ..kernels.moe_details._envelope import _envelope_ok
from ..ops import needs_grad, refuse_forward_ad
from ..packed import note_planned
from . import _ops
from .linear import MXLinear, _hooked, _state_hooked, copied_dense_cache

__all__ = ["MXGatedMLP", "fuse_gated_mlp", "GATED_MLP_NAMES"]

# the member names of HF transformers' gated MLPs (LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP, ...)
GATED_MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


class MXGatedMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` over MXLinear layers, gate and up as one GEMM (module
    docstring). ``gate`` / ``up``: MXLinear (I, H) without bias and with the same formats, scale rule, rounding,
    block size and device; ``down``: any module (kept as it is, normally the MLP's MXLinear (H, I)).

    ``forward(x)``: x (..., H) -> (..., H) (``down``'s output). ``act(x)``: the gated product (..., I) in x's
    dtype. The computation is HF transformers' ``LlamaMLP`` with SiLU (``down_proj(act_fn(gate_proj(x)) *
    up_proj(x))``, as MistralMLP, Qwen2MLP, Qwen3MLP); the interleaved ``gate_up`` rows are mxkit's own layout.
    Raises ValueError when ``gate`` or ``up`` is not an MXLinear (exactly: a subclass is refused too), when either
    has a bias, or when they do not match; TypeError when ``down`` is not an nn.Module."""

    def __init__(self, gate: MXLinear, up: MXLinear, down: nn.Module):
        super().__init__()
        if type(gate) is not MXLinear or type(up) is not MXLinear:
            raise ValueError("MXGatedMLP takes MXLinear gate and up projections")
        if not isinstance(down, nn.Module):  # (None failed at the first forward: "'NoneType' is not callable")
            raise TypeError(f"MXGatedMLP's down projection must be an nn.Module, got {type(down).__name__}")
        keys = [(m.in_features, m.out_features, m.weight_format, m.act_format, m.scale_mode, m.rounding, m.block_size,
                 m.weight_qdata.device, m.bias is None) for m in (gate, up)]
        if keys[0] != keys[1] or not keys[0][-1]:
            raise ValueError(f"gate and up must share their shape, formats, scale rule, rounding, block size and "
                             f"device, without bias; got {keys}")
        H, I = gate.in_features, gate.out_features
        self.intermediate_size = I
        self.gate_up = MXLinear(H, 2 * I, gate.weight_format, bias=False, act_format=gate.act_format,
                                scale_mode=gate.scale_mode, rounding=gate.rounding, block_size=gate.block_size,
                                device=gate.weight_qdata.device, dense_cache=copied_dense_cache(gate))
        with torch.no_grad():
            for name in ("weight_qdata", "weight_scale"):
                g, u = getattr(gate, name), getattr(up, name)
                getattr(self.gate_up, name).copy_(torch.stack([g, u], dim=1).flatten(0, 1))
        self.gate_up.repack()
        self.down_proj = down
        # (the PackedWeight it was made for, (q, s, special, ids) or None): made again for another packed weight
        # (a repack, a load, a move), read at construction so that a capture finds it made
        self._one_launch = (None, None)
        self._own_key()
        self._launch()

    def __getstate__(self) -> dict:
        state = super().__getstate__()  # (nn.Module's copy: a compiled forward is not pickled)
        state["_one_launch"] = (None, None)
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._own_key()

    def _own_key(self) -> None:
        """Record gate_up's weight codes as the key by which ``mxkit::mx_gated_act`` finds this module
        (:func:`mxkit.nn._ops.own_key`): at construction, unpickling and each new one-launch plan (new buffers)."""
        _ops.own_key(self, self.gate_up.weight_qdata, "gated")

    def _launch(self) -> Optional[tuple]:
        """(q, s, special, ids) of :func:`~mxkit.kernels.matmul_details._mma_decode.swiglu_mma` for the weight
        ``gate_up`` holds now: MXFP4, blocks of 32, bf16 activations, the decode-mma layout packed, every scale byte
        in the bf16-exact envelope, the kernel loadable; None otherwise. The scale statistics' first read is a host
        sync: inside a CUDA graph capture, with them not yet read, None (the GEMM path) and nothing kept."""
        lin, got = self.gate_up, None
        p = lin._live_packed()  # (None for replaced buffers; act_format replaced: packed again)
        if lin.act_format is not None:  # (set after fusing: quantized activations, the GEMM path; nothing kept)
            return None
        kept = self._one_launch
        if kept[0] is p and p is not None:
            return kept[1]
        if (p is not None and lin.block_size == 32 and lin.weight_format.name == "mxfp4_e2m1"
                and p.mma_q is not None and p.device.type == "cuda" and _mma_decode.available(p.device) is None):
            if isinstance(p.stats, torch.Tensor) and torch.cuda.is_current_stream_capturing():
                return None
            lo, hi, nan = p.scale_min, p.scale_max, p.has_nan
            note_planned(p, torch.bfloat16)  # (a CUDA forward's: MXLinear.repack's warning)
            if _envelope_ok(lin.weight_format, lo, hi):
                ids = _mma_decode.zero_ids(p.device)
                if ids is None:  # (inside a capture, none made yet: the GEMM path, nothing kept)
                    return None
                got = (p.mma_q, p.mma_s, lo == 0 or nan, ids)
        self._one_launch = (p, got)
        if p is not None:
            self._own_key()  # (p packs gate_up's buffers: the key of the op a compiled forward takes with got)
        return got

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate(x)) * up(x)``: x (..., H) → (..., I) in x's dtype. One bf16 row on CUDA with MXFP4 weights
        (the one-launch path) computes the product in float32 from the float32 sums and rounds once to bf16;
        elsewhere it follows transformers' ``LlamaMLP`` (gate and up rounded to x's dtype, then SiLU and the
        product), so the two can differ in the last bits."""
        if torch.compiler.is_compiling():  # (one row: the op; more rows: the GEMM op, SiLU x up left to Inductor)
            kept = self._one_launch  # (as _launch() made it for the weight held now; a stale one: the GEMM path)
            # (torch.export, or weights swapped in: the GEMM, whose program holds the weights)
            if (self._one_row(x) and kept[0] is self.gate_up._packed and kept[1] is not None
                    and self.gate_up.act_format is None and not exporting() and self.gate_up._owns_weight()):
                refuse_forward_ad("MXGatedMLP")
                return torch.ops.mxkit.mx_gated_act(x, self.gate_up.weight_qdata)
            return self._act_gemm(x)
        return self._act_eager(x)

    def _act_eager(self, x: torch.Tensor) -> torch.Tensor:
        if self._one_row(x):
            launch = self._launch()
            x2 = x.reshape(1, x.shape[-1]).resolve_neg()  # (a negative-bit view's memory holds -x: read raw)
            if launch is not None and _mma_decode.rows_ok(x2) and x.device == launch[0].device:
                if elsewhere(x):  # (the kernels launch on the current device)
                    with torch.cuda.device(x.device):
                        return self._act_eager(x)
                q, s, special, ids = launch
                I = self.intermediate_size
                out = torch.empty(1, I, device=x.device, dtype=torch.bfloat16)
                _mma_decode.swiglu_mma(x2, q, s, special, 2 * I, x2.shape[1], ids, out)
                return out.view(*x.shape[:-1], I)
        return self._act_gemm(x)

    def _one_row(self, x) -> bool:
        """Whether ``x`` is one bf16 row of ``in_features`` on CUDA without gradients: the one-launch path's input."""
        return (type(x) is torch.Tensor and x.is_cuda and x.dtype == torch.bfloat16 and not needs_grad(x)
                and x.dim() > 0 and x.numel() == x.shape[-1] == self.gate_up.in_features)

    def _act_gemm(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gate_up(x).unflatten(-1, (self.intermediate_size, 2))
        gate, up = y[..., 0], y[..., 1]
        if not y.is_cuda:  # (torch's CPU SiLU rounds a strided input otherwise than a contiguous one: HF's bytes)
            gate, up = gate.contiguous(), up.contiguous()
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(x))

    def extra_repr(self) -> str:
        return f"intermediate_size={self.intermediate_size}, act=silu"


@torch.library.custom_op("mxkit::mx_gated_act", mutates_args=())
def _gated_act_op(x: torch.Tensor, weight_qdata: torch.Tensor) -> torch.Tensor:
    """``act(x)`` of the MXGatedMLP whose ``gate_up`` layer's buffer ``weight_qdata`` is (recorded by its one-launch
    plan, :func:`mxkit.nn._ops.own_key`): torch.compile's view of it on CUDA, inference."""
    return _ops.module_of_key(weight_qdata, "gated", "mx_gated_act")._act_eager(x)


@_gated_act_op.register_fake
def _gated_act_fake(x: torch.Tensor, weight_qdata: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight_qdata.shape[0] // 2))  # (gate_up: 2 * intermediate_size rows)


def _holds_more(mod: nn.Module, children: tuple) -> bool:
    """Whether ``mod`` holds state its replacement would drop: a child other than ``children``, a parameter or
    buffer of its own (they vanished from the state_dict without a word)."""
    return (any(n not in children for n, _ in mod.named_children())
            or any(True for _ in mod.named_parameters(recurse=False))
            or any(True for _ in mod.named_buffers(recurse=False)))


def _is_silu(act) -> bool:
    """Whether ``act`` is torch's ``nn.SiLU`` or transformers' ``SiLUActivation`` (``ACT2FN["silu"]`` in
    transformers 5: ``F.silu``); an ``nn.SiLU`` subclass with a forward of its own is another activation."""
    return (isinstance(act, nn.SiLU) and type(act).forward is nn.SiLU.forward) or (
        isinstance(act, nn.Module) and type(act).__name__ == "SiLUActivation" and "forward" not in act.__dict__)


# bytecode that moves nothing (the evaluator below skips it), across Python 3.10-3.14
_NO_VALUE_OPS = {"RESUME", "NOP", "CACHE", "PRECALL", "PUSH_NULL", "COPY_FREE_VARS", "EXTENDED_ARG", "NOT_TAKEN"}


def _plain_gated_forward(code, gate_n: str, up_n: str, down_n: str) -> bool:
    """Whether a forward computes ``down(act_fn(gate(x)) * up(x))`` (the two factors in either order, through any
    local names: HF's gated MLPs), read from its bytecode by evaluating it on names: one argument besides self, the
    four attributes of self called with one argument each, one multiplication, nothing else (no constant, global,
    other operator or keyword; ``* 0.5``, ``act_fn(up(x)) * gate(x)`` or ``down(...) * up(x)`` are other
    computations)."""
    import dis

    if code.co_argcount != 2 or code.co_kwonlyargcount or code.co_flags & (inspect.CO_VARARGS
                                                                           | inspect.CO_VARKEYWORDS):
        return False
    me, x = code.co_varnames[:2]
    local, stack, result = {x: x}, [], None
    try:
        for ins in dis.get_instructions(code):
            op, arg = ins.opname, ins.argval
            if op in _NO_VALUE_OPS:
                continue
            if op.startswith("LOAD_FAST") and "STORE" not in op:  # (3.13+: two loads in one, a tuple of names)
                for name in (arg if isinstance(arg, tuple) else (arg,)):
                    stack.append(me if name == me else local[name])
            elif op == "STORE_FAST":
                local[arg] = stack.pop()
            elif op == "STORE_FAST_LOAD_FAST":
                local[arg[0]] = stack.pop()
                stack.append(local[arg[1]])
            elif op in ("LOAD_ATTR", "LOAD_METHOD"):
                if stack.pop() != me or arg not in (gate_n, up_n, down_n, "act_fn"):
                    return False
                stack.append(("attr", arg))
            elif op in ("CALL", "CALL_METHOD", "CALL_FUNCTION") and ins.arg == 1:
                a, f = stack.pop(), stack.pop()
                if not (isinstance(f, tuple) and isinstance(a, str)):
                    return False
                stack.append(f"{f[1]}({a})")
            elif op == "BINARY_MULTIPLY" or (op == "BINARY_OP" and ins.argrepr == "*"):
                b, a = stack.pop(), stack.pop()
                if not (isinstance(a, str) and isinstance(b, str)):
                    return False
                stack.append("(" + " * ".join(sorted((a, b))) + ")")
            elif op == "RETURN_VALUE" and result is None:
                result = stack.pop()
            else:
                return False
    except (IndexError, KeyError, TypeError):
        return False
    return result == f"{down_n}((" + " * ".join(sorted((f"act_fn({gate_n}({x}))", f"{up_n}({x})"))) + "))"


def fuse_gated_mlp(model: nn.Module, names: tuple = GATED_MLP_NAMES) -> list[str]:
    """Replace, in place, every gated MLP below ``model`` (its descendants: ``model`` itself has no parent to
    take the new module) by an :class:`MXGatedMLP`; returns the qualified names of the modules replaced (one name
    per module: a module registered at two paths becomes one MXGatedMLP at both). A gated MLP here is a module
    with the three children ``names`` (gate, up, down: HF's ``gate_proj`` / ``up_proj`` / ``down_proj``), gate
    and up MXLinear layers that match (MXGatedMLP's rule), an ``act_fn`` that is ``nn.SiLU`` or transformers'
    ``SiLUActivation``, and a forward of its class that reads no attribute but those four (HF's LlamaMLP,
    MistralMLP, Qwen2MLP, Qwen3MLP: ``down(act_fn(gate(x)) * up(x))``; MLPs with multipliers or clamps of their
    own are left alone, and so are a forward patched on the instance, modules or members with hooks, and modules
    holding other children, parameters or buffers, which the replacement would drop). The check evaluates the
    forward's bytecode on names (``* 0.5``, ``act_fn(up(x)) * gate(x)``, ``down(...) * up(x)`` or a second argument
    are left alone).
    Run it before :func:`~mxkit.nn.fuse_siblings` (which would take gate and up into a FusedMXLinear first) and
    after loading weights (the state_dict then holds ``gate_up``). Raises TypeError for a ``model`` that is not an
    nn.Module or ``names`` that are not three str."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fuse_gated_mlp takes an nn.Module, got {type(model).__name__}")
    if (isinstance(names, (str, bytes)) or not isinstance(names, (tuple, list))
            or len(names) != 3 or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"names must be the three child names (gate, up, down), e.g. {GATED_MLP_NAMES}; "
                        f"got {names!r}")
    gate_n, up_n, down_n = names
    done, made = [], {}  # made: id of a replaced module -> its MXGatedMLP (a module at two paths: one)
    for pname, parent in list(model.named_modules()):
        for cname, mod in list(parent.named_children()):
            new = made.get(id(mod))
            if new is None:
                members = [getattr(mod, n, None) for n in (gate_n, up_n, down_n)]
                code = getattr(type(mod).forward, "__code__", None)
                if (isinstance(mod, MXGatedMLP) or members[2] is None or "forward" in mod.__dict__
                        or code is None
                        or not _plain_gated_forward(code, gate_n, up_n, down_n)
                        or not _is_silu(getattr(mod, "act_fn", None))
                        or _holds_more(mod, (gate_n, up_n, down_n, "act_fn"))
                        or any(_hooked(m) for m in (mod, *members, getattr(mod, "act_fn", None)) if m is not None)
                        or any(_state_hooked(m) for m in members if type(m) is MXLinear)):
                    continue
                try:
                    new = MXGatedMLP(*members)
                except ValueError:
                    continue
                made[id(mod)] = new
                done.append(f"{pname}.{cname}" if pname else cname)
            setattr(parent, cname, new)
    return done
