"""Sibling :class:`~mxkit.nn.MXLinear` layers that read the same input, run as one GEMM.

A decoder layer projects the same hidden state several times: attention's q / k / v, a gated MLP's gate and
up. In decode each of these GEMMs is a small, latency-bound launch (a Llama-3-8B k_proj moves 2 MB of MXFP4
bytes), so one GEMM over the concatenated weight rows does the same work with one launch and one pass over
the input. :func:`fuse_siblings` replaces each group by a :class:`FusedMXLinear` (registered on the parent under
the joined name, e.g. ``q_proj_k_proj_v_proj``) and each member by a :class:`FusedPart` that returns its column
slice of the fused output: the model's own forward is unchanged.

The fused weight is the members' MX bytes stacked along N (each row keeps its own blocks and scales), so every
output element is the one the member computes, up to the GEMM's float32 summation order (the same issue #22 bound).
The first part called with an input runs the fused GEMM and keeps its output until every part of the group has read
it, for that very tensor object (or view of one base object, with the same data pointer, shape and strides) at that
version and in the same grad mode and ``x.requires_grad`` (``x._version``: an in-place change of x, or a
load_state_dict, between two parts' calls recomputes, as does a part called with gradients on after one called
under ``no_grad`` or before x required grad, or after the fused weight buffers were edited in place or swapped;
not seen: an in-place change of an inference-mode x between two parts' calls, since such a tensor keeps no version,
nor an edit through ``x.data`` or a buffer shared with numpy, which bypass the version counter): parts called with
different inputs each get a correct result. A part's output is a column slice of the fused output: not contiguous
(``view`` calls that merge its leading dimensions need ``reshape``).
An input without storage (a BatchedTensor inside ``torch.func.vmap``) has no data pointer to key the reuse by: each
part called with it runs the fused GEMM and takes its slice.
Under ``torch.compile`` the reuse is decided while Dynamo traces, not by the cache: the first part traced with an
input puts one fused GEMM in the graph and the group's other parts traced with that same input take their column
slices of its output, so the compiled graph runs one GEMM per group and input whatever buffers Inductor later hands
the op, and the fused output is an ordinary intermediate of the graph, freed with the parts' slices (nothing kept
between calls, nothing left in a CUDA graph's pool; a group whose parts are not all called in one compiled frame
keeps that frame's input and fused output until its next traced call). On CUDA (inference) the GEMM is one custom op,
``mxkit::mx_fused(x, weight_qdata)`` (:mod:`mxkit.nn._ops`: given the fused layer's weight codes, a graph input,
by which it finds the layer), whose kernel is the fused layer's eager forward;
``fullgraph=True`` and ``mode="reduce-overhead"`` work. With gradients, and on other devices, it is the fused
MXLinear's own op (``mxkit::mx_linear``, which carries x's and the bias' gradients). The traced reuse is keyed on
the input object alone: an in-place change of x between two parts' calls inside a compiled frame is not seen there
(eager calls see it), nor, where the parts run in separate compiled frames (each part compiled alone, or a graph
break between them), an in-place change of x or a ``load_state_dict`` between those frames' calls. Inside
``torch.utils.checkpoint`` under ``fullgraph=True`` Dynamo refuses the reuse's write ("HOP: Unsafe side effect"):
set ``torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True``, or leave such groups unfused.
The state_dict holds the fused layer (``...q_proj_k_proj_v_proj.fused.weight_qdata``), not the members: fuse after
loading. Its metadata records the parts' row counts (``mx_splits``; ``torch.save`` keeps it): loading rows of other
parts raises.
"""

from __future__ import annotations

import operator
import weakref
from collections import abc
from typing import Iterable, Sequence

import torch
from torch import nn
from torch.autograd import forward_ad as _fwad

from .._device import exporting
from ..formats import as_int
from ..ops import has_tangent, needs_grad, refuse_forward_ad
from . import _ops
from .linear import MXLinear, _hooked, _state_hooked, copied_dense_cache

__all__ = ["FusedMXLinear", "FusedPart", "fuse_siblings", "FUSE_GROUPS"]

# Sibling names of HF transformers' decoder layers (Llama, Mistral, Qwen2/3, Gemma, ...): attention and MLP
FUSE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# names of cross-attention modules (BART, Whisper, mBART, Marian: ``encoder_attn``; BERT-style decoders:
# ``crossattention``), whose q / k / v read different inputs: not fused; nor is a module whose name holds "cross"
# (Mllama's ``cross_attn``, SAM 3's ``vision_cross_attn``, T5Gemma's ``cross_attn``)
CROSS_ATTENTION = ("encoder_attn", "crossattention")


def _is_cross_attention(name: str) -> bool:
    return name in CROSS_ATTENTION or "cross" in name.lower()


class FusedMXLinear(nn.Module):
    """One MXLinear over the stacked weight rows of ``layers`` (MXLinear with equal in_features, weight and
    activation formats, scale rule, rounding, block size, device, and all or none with a bias, of one dtype and
    requires_grad).

    ``output(x, i)`` is ``layers[i](x)`` up to float32 summation order: the columns ``offsets[i] :
    offsets[i] + splits[i]`` of ``fused(x)`` (a view). The members' rows are stacked along N in the order given
    (q, k, v: ``[q | k | v]``), the layout of vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` on one
    rank; sharing one GEMM's output between the members' own modules (:class:`FusedPart`) is mxkit's own.
    Raises TypeError when ``layers`` is not a sequence (one module, a generator); ValueError for fewer than two
    layers, a member that is not a plain MXLinear (a subclass such as a tensor-parallel shard has a forward of its
    own, which the stacked rows would skip), or layers that do not match."""

    def __init__(self, layers: Sequence[MXLinear]):
        super().__init__()
        if isinstance(layers, nn.Module) and not isinstance(layers, nn.ModuleList) or not hasattr(layers, "__len__"):
            # (one layer or a generator: "object ... has no len()")
            raise TypeError(f"FusedMXLinear takes a sequence of MXLinear layers, got {type(layers).__name__}")
        layers = list(layers)
        if len(layers) < 2:
            raise ValueError("FusedMXLinear needs two or more MXLinear layers")
        other = [m for m in layers if type(m) is not MXLinear]  # (a list: a None member is one too)
        if other:  # (a tensor-parallel shard's stacked rows would skip its collectives: wrong outputs)
            other = other[0]
            raise ValueError(f"FusedMXLinear fuses plain MXLinear layers, as fuse_siblings and MXGatedMLP do; got a "
                             f"{type(other).__name__}")
        first = layers[0]
        keys = [(m.in_features, m.weight_format, m.act_format, m.scale_mode, m.rounding, m.block_size,
                 m.weight_qdata.device, m.bias is None,
                 None if m.bias is None else (m.bias.dtype, m.bias.requires_grad)) for m in layers]
        if any(k != keys[0] for k in keys[1:]):
            raise ValueError(f"layers to fuse must share in_features, formats, scale rule, rounding, block size, "
                             f"device and bias presence / dtype / requires_grad; got {keys}")
        self.splits = tuple(m.out_features for m in layers)
        self.offsets = tuple(sum(self.splits[:i]) for i in range(len(layers)))
        bias = first.bias
        self.fused = MXLinear(first.in_features, sum(self.splits), first.weight_format, bias=bias is not None,
                              act_format=first.act_format, scale_mode=first.scale_mode, rounding=first.rounding,
                              block_size=first.block_size, device=first.weight_qdata.device,
                              dtype=None if bias is None else bias.dtype,
                              dense_cache=copied_dense_cache(first))
        with torch.no_grad():
            self.fused.weight_qdata.copy_(torch.cat([m.weight_qdata for m in layers]))
            self.fused.weight_scale.copy_(torch.cat([m.weight_scale for m in layers]))
            if bias is not None:
                self.fused.bias.copy_(torch.cat([m.bias.detach() for m in layers]))
                self.fused.bias.requires_grad_(bias.requires_grad)
        self.fused.repack()
        # (shard_mxlinear reads it: a column shard of the stacked rows without the gather is no member's shard)
        self.fused._mx_stacked_splits = self.splits
        # [weakref to x (or x's base), x._version, fused(x), parts served, x's view, grad mode, the weights' key];
        # forgotten when a state_dict is loaded or the module moved (the output of the old weights)
        self._last = None
        # while Dynamo traces: (x, fused(x), parts served) of the last traced input, until every part has its slice
        self._traced = [None]
        self.register_load_state_dict_post_hook(_forget_output)
        self.register_state_dict_post_hook(_record_splits)
        self.register_load_state_dict_pre_hook(_check_splits)

    def _apply(self, fn, *args, **kwargs):
        self._last = None  # (.to() / .half(): an output kept of the weights before)
        return super()._apply(fn, *args, **kwargs)

    def _weights_key(self) -> tuple:
        """(packed copy, bias, the weight buffers, their and the bias' versions) of the fused layer: a kept output
        is of these (a bias edited in place between two parts' calls served the output of the old one; buffers
        swapped in with the same versions, by a load into ``fused`` itself with ``assign=True`` or by
        ``torch.func.functional_call``, served the old weights' output)."""
        f = self.fused
        b, bias = f._buffers, f._parameters["bias"]
        q, sc = b["weight_qdata"], b["weight_scale"]
        try:
            return (f.__dict__["_packed"], bias, q, sc, q._version, sc._version,
                    None if bias is None else bias._version)
        except RuntimeError:  # (inference tensors keep no version)
            return (f.__dict__["_packed"], bias, q, sc, None, None, None)

    def __getstate__(self) -> dict:
        state = super().__getstate__()  # (nn.Module's: without a compiled call, which a copy kept and pickle refused)
        state["_last"] = None  # (a weak reference: not picklable, and nothing to keep across a copy)
        state["_traced"] = [None]
        return state

    def output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Part i's output for input x (the module docstring's reuse rule): (..., splits[i]) in x's dtype, a view.
        Raises TypeError, as the member MXLinear does, for an x that is not a tensor; IndexError for an i not in
        [0, number of parts) (a negative one too: it would count as another part than its positive twin), before
        any GEMM."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MXLinear takes a float tensor (..., {self.fused.in_features}), got {type(x).__name__}")
        if type(i) is not int or not 0 <= i < len(self.splits):  # (a bad i was served after the GEMM, and kept)
            if isinstance(i, bool) or not hasattr(i, "__index__"):  # (NumPy integers are integers)
                raise TypeError("FusedMXLinear.output: the part index must be an int")
            i = operator.index(i)
            if not 0 <= i < len(self.splits):
                raise IndexError(f"FusedMXLinear.output: part {i} is not in [0, {len(self.splits)})")
        if torch.compiler.is_compiling():
            return self._traced_output(x, i)
        try:
            # a view is keyed by its base object, its geometry and its sign and conjugate bits (x and its neg view,
            # c.imag and c.conj().imag: one base, pointer, geometry and version)
            view = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.is_neg(), x.is_conj())
        except RuntimeError:
            # no storage (functorch's vmap wraps x in a BatchedTensor): no key to reuse the output by
            return self.fused(x).narrow(-1, self.offsets[i], self.splits[i])
        if _fwad._current_level >= 0 and has_tangent(x):
            # a dual tensor is a view of its primal with the same key: its tangent is not in the key (an output made
            # without one was reused), so no reuse
            return self.fused(x).narrow(-1, self.offsets[i], self.splits[i])
        ver = None if x.is_inference() else x._version  # (inference tensors keep no version counter)
        src = x if x._base is None else x._base
        # (an output made under no_grad, or of an x or a bias that did not require grad then, carries no graph for a
        # part that needs one)
        bias = self.fused._parameters["bias"]
        grad = (torch.is_grad_enabled(), x.requires_grad, bias is not None and bias.requires_grad)
        last = self._last
        wkey = self._weights_key()
        hit = (last is not None and last[0]() is src and last[4] == view and last[1] == ver and last[5] == grad
               and i not in last[3] and _same_key(last[6], wkey))
        if hit:
            y = last[2]
        else:
            y = self.fused(x)
            last = self._last = [weakref.ref(src), ver, y, set(), view, grad, wkey]
        last[3].add(i)
        if len(last[3]) == len(self.splits):
            self._last = None  # every part has its slice
        return y.narrow(-1, self.offsets[i], self.splits[i])

    def _traced_output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """``output`` while Dynamo traces: the fused GEMM of the last traced input when this part has not had its
        slice of it yet, else a new one."""
        traced = self._traced[0]
        if traced is not None and traced[0] is x and i not in traced[2]:
            y, served = traced[1], traced[2] | {i}
        else:
            # (mxkit::mx_fused where no gradient is needed on CUDA, else the fused MXLinear's op, which has them;
            # under torch.export the fused MXLinear, whose program holds the weights)
            key_op = (x.is_cuda and not needs_grad(x, self.fused.bias) and not exporting()
                         and self.fused._owns_weight())  # (buffers swapped in: the fused layer's own route)
            if key_op:
                refuse_forward_ad("FusedMXLinear")
                y = torch.ops.mxkit.mx_fused(x, self.fused.weight_qdata)
            else:
                y = self.fused(x)
            served = {i}
        self._traced[0] = None if len(served) == len(self.splits) else (x, y, served)
        return y.narrow(-1, self.offsets[i], self.splits[i])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """All parts' outputs for x (one GEMM): x (..., in_features) float32 | bfloat16 | float16 → a tuple of one
        view per part, (..., splits[i]) in x's dtype (columns offsets[i] : offsets[i] + splits[i] of the GEMM's
        output). Raises as :class:`MXLinear`'s forward."""
        y = self.fused(x)
        return tuple(y.narrow(-1, o, n) for o, n in zip(self.offsets, self.splits))

    def extra_repr(self) -> str:
        return f"splits={self.splits}"


def _same_key(a: tuple, b: tuple) -> bool:
    """Two weights' keys (:meth:`FusedMXLinear._weights_key`) alike: the same objects, then the same versions."""
    return all(x is y for x, y in zip(a[:4], b[:4])) and a[4:] == b[4:]


def _forget_output(module: FusedMXLinear, incompatible_keys) -> None:
    module._last = None


def _record_splits(module: FusedMXLinear, state_dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: the parts' row counts, in the state_dict's metadata (``torch.save`` keeps it), for
    :func:`_check_splits`: the fused rows alone do not say where q ends and k begins."""
    local_metadata["mx_splits"] = list(module.splits)


def _check_splits(module: FusedMXLinear, state_dict, prefix: str, local_metadata: dict, strict, missing_keys,
                  unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: a fused state_dict saved from parts of other sizes (q / k / v of another head
    layout with the same total rows) raises ValueError before this group's bytes are copied (a parent's modules
    loaded before it are); one without the metadata (safetensors, a plain dict) is not checked."""
    got = local_metadata.get("mx_splits")
    if got is not None and tuple(got) != module.splits:
        raise ValueError(f"{prefix[:-1] or type(module).__name__}: the state_dict's fused rows are of parts "
                         f"{tuple(got)}; this FusedMXLinear's are {module.splits}")


@torch.library.custom_op("mxkit::mx_fused", mutates_args=())
def _fused_op(x: torch.Tensor, weight_qdata: torch.Tensor) -> torch.Tensor:
    """The fused output of a FusedMXLinear for x: the eager forward of its fused layer, the MXLinear whose
    ``weight_qdata`` buffer this is (:func:`mxkit.nn._ops.own_key`), (..., sum(splits)) contiguous in x's dtype
    (torch.compile's view of a CUDA group's GEMM)."""
    return _ops.module_of_key(weight_qdata, "linear", "mx_fused")(x)


@_fused_op.register_fake
def _fused_fake(x: torch.Tensor, weight_qdata: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight_qdata.shape[0]))


class FusedPart(nn.Module):
    """Member ``index`` of a :class:`FusedMXLinear` in its original place: ``forward(x)`` is
    ``group.output(x, index)``. Holds no parameters (the group is registered on the parent). Raises TypeError if
    ``group`` is not a FusedMXLinear, ValueError if ``index`` is not an int in [0, len(group.splits))."""

    def __init__(self, group: FusedMXLinear, index: int):
        super().__init__()
        if not isinstance(group, FusedMXLinear):
            raise TypeError(f"FusedPart takes a FusedMXLinear, got {type(group).__name__}")
        index = as_int(index)  # (a NumPy integer, as FusedMXLinear.output takes)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(group.splits):
            raise ValueError(f"index={index!r} must be a part of the group: 0 .. {len(group.splits) - 1}")
        self.__dict__["group"] = group  # not a submodule: the weights live once, under the group's own name
        self.index = index
        self.in_features = group.fused.in_features
        self.out_features = group.splits[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x, self.index)

    def extra_repr(self) -> str:
        return f"index={self.index}, out_features={self.out_features}"


def fuse_siblings(model: nn.Module, groups: Iterable[Sequence[str]] = FUSE_GROUPS) -> list[str]:
    """Fuse, in place, every set of sibling MXLinear children named like one of ``groups`` (default
    :data:`FUSE_GROUPS`: q / k / v and gate / up projections) into a :class:`FusedMXLinear`; returns the qualified
    names of the fused groups. Groups with a missing member, a member that is not an MXLinear, or members that do
    not match (formats, in_features, bias presence / dtype / requires_grad) are left alone, and so are groups with a
    member that has forward / backward / state_dict hooks of its own or a ``forward`` replaced on the instance (the
    fused group would drop them) and cross-attention modules (:data:`CROSS_ATTENTION`, or a name holding "cross").
    The model's forward must call each member with the same input tensor for the GEMM to run once (HF's attention
    and gated MLPs do); otherwise each call still returns its correct output. A group whose joined name
    (``q_proj_k_proj_v_proj``) the parent already has is left alone too. Members shared by two parents (tied layers:
    the same MXLinear objects under both) get one group, registered on both, as the members were. Raises TypeError
    for a ``model`` that is not an nn.Module, or when ``groups`` is not iterable or a group is a str or holds
    anything but str names (``groups`` is a list of groups: ``[("q_proj", "k_proj", "v_proj")]``, not one flat
    tuple); ValueError for a group that names a layer twice or fewer than two layers. The default names are HF
    transformers' (Llama, Mistral, Qwen2 / 3, Gemma); the fused layout is :class:`FusedMXLinear`'s (vLLM's merged q
    / k / v and gate / up rows, on one rank); the in-place swap is mxkit's own."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fuse_siblings takes an nn.Module, got {type(model).__name__}")
    groups = _check_groups(groups)
    done = []
    made = {}  # (id of each member, ...) -> its FusedMXLinear: members shared by two parents fused once
    for pname, parent in list(model.named_modules()):
        if _is_cross_attention(pname.rsplit(".", 1)[-1]):
            continue  # q reads the decoder's states, k / v the encoder's: one GEMM would serve one part only
        for names in groups:
            mods = [getattr(parent, n, None) for n in names]
            if not all(type(m) is MXLinear for m in mods) or any(_hooked(m) or _state_hooked(m) for m in mods):
                continue  # (a hooked member's hooks, or its forward replaced on the instance, would be dropped)
            gname = "_".join(names)
            if hasattr(parent, gname):  # (a name taken, by the module or by another group: left alone)
                continue
            key = tuple(id(m) for m in mods)
            group = made.get(key)
            if group is None:
                try:
                    group = FusedMXLinear(mods)
                except ValueError:
                    continue
                made[key] = group
            parent.add_module(gname, group)
            for i, n in enumerate(names):
                setattr(parent, n, FusedPart(group, i))
            done.append(f"{pname}.{gname}" if pname else gname)
    return done


def _check_groups(groups) -> list[tuple[str, ...]]:
    """``groups`` as a list of tuples of names; TypeError for a group that is a str (a flat tuple of names, whose
    groups would be the names' characters) or is not a collection of str names."""
    example = "e.g. [('q_proj', 'k_proj', 'v_proj'), ('gate_proj', 'up_proj')]"
    if isinstance(groups, (str, bytes)):
        raise TypeError(f"fuse_siblings takes a list of groups of sibling names, {example}; got the str {groups!r}")
    if not isinstance(groups, abc.Iterable):
        raise TypeError(f"fuse_siblings takes a list of groups of sibling names, {example}; got {groups!r}")
    out = []
    for names in groups:
        ok = not isinstance(names, (str, bytes)) and isinstance(names, abc.Iterable)
        names = tuple(names) if ok else names
        if not ok or not all(isinstance(n, str) for n in names):
            flat = " (one flat tuple of names is one group: pass [names])" if isinstance(names, str) else ""
            raise TypeError(f"fuse_siblings takes a list of groups of sibling names, {example}; got the group "
                            f"{names!r}{flat}")
        if len(set(names)) != len(names):
            raise ValueError(f"fuse_siblings: the group {names!r} names a layer more than once")
        if len(names) < 2:  # (it was skipped without a word: a group of one fuses nothing)
            raise ValueError(f"fuse_siblings: the group {names!r} names fewer than two layers: nothing to fuse")
        out.append(names)
    return out
