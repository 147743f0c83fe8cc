"""`MXMoE`: a mixture-of-experts layer whose experts are stored in an MX format (GPT-OSS model conversion and
loading: :mod:`mxkit.nn.gpt_oss`; the experts' backward: :mod:`mxkit.nn._moe_grad`; the ops torch.compile and
torch.export see: :mod:`mxkit.nn._moe_ops`, :mod:`mxkit.nn._moe_export`; the state_dict hooks:
:mod:`mxkit.nn._moe_state`).

Layout (the checkpoint convention, ``nn.Linear``-style ``y = x @ W.T``): expert e's ``gate_up`` weight is
(2I, H) and its ``down`` weight (H, I), each quantized along its last axis (K). The experts are held as four
uint8 buffers — ``gate_up_qdata`` (E, 2I, H·pack_bytes/pack), ``gate_up_scale`` (E, 2I, H/32),
``down_qdata`` (E, H, I·pack_bytes/pack), ``down_scale`` (E, H, I/32) — so ``state_dict()``, ``.to()`` and
``load_state_dict()`` work as for any buffer (as :class:`mxkit.nn.MXLinear` holds its weight; as there, the
state_dict's metadata names the element format and block size, and bytes of another format are refused on load
with a ValueError: :func:`mxkit.nn.linear.check_format`). The router
(``nn.Linear(H, E)`` with a bias) and the expert biases ``gate_up_bias`` (E, 2I), ``down_bias`` (E, H) stay in
the float dtype. For GPT-OSS the ``gate_up`` rows interleave gate and up (row 2i gate, 2i+1 up).

transformers' ``GptOssExperts`` stores the transposes: ``gate_up_proj`` [E, H, 2I] and ``down_proj`` [E, I, H]
(``x @ gate_up_proj[e]``); :meth:`MXMoE.from_hf_gpt_oss` transposes them back to the checkpoint layout
(``gate_up_proj_blocks [E, 2I, H/32, 16]`` is exactly this module's ``gate_up_qdata`` viewed per block).

Storage on Hopper: on its first CUDA forward (W4A16, MXFP4 experts, K % 64 == 0, sm_90) the module re-lays the four
expert buffers in place in the tensor-core kernels' layout (:meth:`MXMoE.pack_`: int32 ``gate_up_qdata``
(E·2I/16, H/64, 32, 4) and ``gate_up_scale`` (E·2I/16, H/64, 8), the same for ``down``; the same bytes,
rearranged), which the decode and the prefill kernels both read. The experts then take their MXFP4 size once
(GPT-OSS-120B: 60.9 GB) instead of a source plus a packed copy. ``state_dict()`` still gives, and
``load_state_dict()`` still takes, the checkpoint layout (converted per tensor on the module's device);
``gate_up_mx`` / ``down_mx`` unpack on the fly (the reference path, CPU). ``keep_source=True`` keeps the
checkpoint-layout buffers and a packed copy beside them instead.

W4A8 (``act_format="fp8_e4m3_rowwise"``, FP4 / FP6 experts): the first CUDA forward folds the experts in place
instead (:meth:`MXMoE.pack_`, layout ``"fold"``): ``gate_up_qdata`` becomes the E4M3 bytes (E, 2I, H) that the
FP8 grouped GEMMs read, ``gate_up_row_scale`` (E, 2I) float32 their power-of-two row scales (a buffer outside
``state_dict``), and ``gate_up_scale`` keeps the E8M0 block scales, from which the fold is undone exactly for
``state_dict()``. The experts then take twice their MXFP4 size (the E4M3 bytes) instead of three times (the
MXFP4 bytes plus a folded copy): GPT-OSS-120B's 60.9 GB become 122 GB, not 183. MXFP4 x MXFP4
(``act_format="mxfp4"``: the tokens and the intermediate quantized to MXFP4, :func:`mxkit.moe.moe_mxfp4`) holds its
experts the same way (the same fold layout and kernels' operands).

Under ``torch.compile`` (inference: no gradient to x, the router or the expert biases) an MXMoE's experts (CUDA
or CPU) are one opaque custom op, ``mxkit::mx_moe(x, router_logits, key)`` (:mod:`mxkit.nn._moe_ops`; ``key`` the
module's ``gate_up_qdata`` buffer, a graph input, by which the op finds it: :mod:`mxkit.nn._ops`), whose kernel
is the module's eager expert computation; the router and the returned scores are traced. ``fullgraph=True`` and
``mode="reduce-overhead"`` work (transformers' GPT-OSS with its experts swapped included). Where a gradient is
needed the routing and the experts are two ops with their backwards registered (``mxkit::mx_moe_route``, the
reference routing, and ``mxkit::mx_moe_experts``, :class:`~mxkit.nn._moe_grad.ExpertsGrad`'s forward and backward):
``fullgraph=True`` works there too, with the eager output and gradients (with ``return_router_scores`` in the loss,
the logits' gradient within float32 rounding of eager's: eager routes twice, once for the experts and once for the
scores, and adds the two contributions in another order); under expert parallelism it is a graph break.

Under ``torch.export`` (strict or not) the router is traced and the experts are ``mxkit::mx_moe_export`` (with
``mxkit::mx_moe_route`` before it where a gradient is needed; its backward is registered), an op on the four expert
buffers in the layout the module holds (the fold layout's row scales too), the biases and a text naming the rest of
the layer's settings: the program holds the experts, and after ``torch.export.load`` in another process (which
must ``import mxkit.nn`` first: that registers the op) rebuilds the layer's expert computation around them on its
first call (again only when the expert buffers change). The program holds the layout the module held: export
after the first CUDA forward (or :meth:`MXMoE.pack_`), or a CUDA program keeps a packed copy beside the
checkpoint-layout experts. Its router is the traced ``nn.Linear`` (not the one-launch decode router, whose float64
sums differ in the last bit of ~0.1% of the logits). A program exported without gradients raises if run backward.
An expert-parallel module exports as its module's op (a program that runs in the exporting process only).

Expert parallelism: a module built with ``expert_range=(lo, hi)`` holds experts lo..hi-1 only. Alone, its
forward returns their contribution; after :meth:`MXMoE.shard_experts` (or with ``ep_ranges`` / ``ep_group``
set) its forward runs :func:`mxkit.distributed.ep_moe`, the all-to-all over the group.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .._cache import TensorsKey, same_objects
from .._device import elsewhere, exporting
from ..distributed import check_expert_ranges, ep_moe, expert_ranges, group_position, raise_collectively
from ..formats import BLOCK_SIZE, ElementFormat, FormatLike, Rounding, ScaleMode, check_bools, get_format
from ..kernels.moe_details._route import router_takes
from ..moe import MOE_BACKENDS, moe, moe_mxfp4, moe_w4a8, route, router_gpt_oss
from ..moe_reference import (_FLOATS, ACTIVATIONS, GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT, ROUTING_MODES,
                             _check_expert_range)
from ..ops import _functorch_wrapped, dequantize, needs_grad, quantize, refuse_forward_ad
from ..tensor import MXTensor, as_int, check_device_name
from . import _moe_export, _moe_ops, _ops  # noqa: F401 (_moe_ops registers the ops torch.compile calls)
from ._moe_grad import ExpertsGrad
from ._moe_state import (_EXPERTS, _check_experts, _checkpoint_layout_state, _forget_expert_copies, _mark_captured,
                         _pack_loaded_state, _record_experts, _warn_new_copies, _warn_recapture)
from .linear import FP8_ROWWISE, _check_block_size, _hooked, _parse_act, check_format, record_format

__all__ = ["MXMoE"]

_ACT_FORMATS = (FP8_ROWWISE, "mxfp4_e2m1")  # MXMoE's act_format, as held (None: bf16 tokens)


def _moe_act(act_format) -> Optional[str]:
    """An MXMoE ``act_format`` as held: None, ``"fp8_e4m3_rowwise"`` or ``"mxfp4_e2m1"`` (any spelling of MXFP4
    :func:`mxkit.get_format` takes, or its ElementFormat). Raises ValueError for anything else."""
    if act_format is None:
        return None
    try:
        act = _parse_act(act_format)
    except (TypeError, ValueError):
        act = None
    name = getattr(act, "name", act)
    if name not in _ACT_FORMATS:
        raise ValueError(f"act_format={act_format!r}: None, 'fp8_e4m3_rowwise' or 'mxfp4'")
    return name


# (ExpertsGrad keeps the experts its forward read, which torch.func's transforms do not let a Function save, and the
# kernels read storage a BatchedTensor has not: torch raised "must override the setup_context staticmethod" or
# "Cannot access data pointer of Tensor that doesn't have storage")
_NO_FUNC = ("MXMoE does not run under torch.func's transforms (grad, vjp, jvp, vmap): differentiate it with autograd "
            "(loss.backward(), torch.autograd.grad), and batch it by its leading dims (x (..., hidden_size)); "
            "torch.func.functional_call works")


class MXMoE(_ops.HoldsGroup, nn.Module):
    """A top-k MoE layer with MX experts (layout in the module docstring).

    Args (most users call :meth:`from_dense` or :meth:`from_hf_gpt_oss`):
      hidden_size H, intermediate_size I: both multiples of ``block_size``.
      num_experts E, top_k: 1 ≤ top_k ≤ E.
      weight_format: element format of the experts (``"mxfp4"``, ``"mxfp8_e4m3"``, …).
      bias: expert biases (``gate_up_bias`` (E_local, 2I), ``down_bias`` (E_local, H)); router_bias: the
        router's bias.
      routing: ``"gpt_oss"`` | ``"softmax_topk"``; activation: ``"swiglu_gpt_oss"`` | ``"swiglu"``
        (:mod:`mxkit.moe_reference`).
      expert_range: (lo, hi) — hold only experts lo..hi-1 (E_local = hi - lo); default all.
      return_router_scores: forward returns ``(y, scores)`` like transformers' ``GptOssMLP`` (scores = the
        (T, k) routing weights in x's dtype, that of the router's logits), for a drop-in swap.
      scale_mode / rounding / block_size: passed to :func:`mxkit.quantize` by the constructors.
      backend: of :func:`mxkit.moe` (``"auto"``: the GPU kernels on CUDA when present, else the reference).
      act_format: None (bf16 tokens: W4A16 / W8A16), ``"fp8_e4m3_rowwise"`` (W4A8, :func:`mxkit.moe.moe_w4a8`:
        FP8 tokens with a scale per token) or ``"mxfp4"`` / ``"mxfp4_e2m1"`` (MXFP4 x MXFP4,
        :func:`mxkit.moe.moe_mxfp4`: the tokens and the intermediate quantized to MXFP4 as ``mxkit.quantize``
        does, as ``MXLinear(act_format="mxfp4")`` quantizes its input); both with FP4 / FP6 experts, folded once
        to E4M3 on first use per device. Held as ``"fp8_e4m3_rowwise"`` or ``"mxfp4_e2m1"``.
      keep_source: False (default): the first forward on Hopper packs the experts in place, and the first CUDA
        forward of a W4A8 / MXFP4 x MXFP4 module folds them in place (module docstring); True: the buffers keep
        the checkpoint layout and the packed or folded copy is kept beside them.
      device / dtype: of the router and the biases (ValueError for a device string torch does not parse,
        TypeError for a dtype that is not floating).
    Buffers are zero-initialised (zero experts); :meth:`from_dense` fills them.

    forward: x (..., H) float32 | bfloat16 | float16 (float64 too, on :func:`mxkit.moe`'s reference path) → (..., H)
    in x's dtype (:func:`mxkit.moe`), or the pair above; TypeError for another dtype, ValueError for H, for an x on
    another device than the experts (or than a plain ``nn.Linear`` router's weight), and for a router that does not
    give E logits; NotImplementedError under ``torch.func``'s transforms (grad / vjp / jvp / vmap: use autograd;
    ``torch.func.functional_call`` works). A strided x gives its contiguous
    copy's bits. The router's logits are computed in x's dtype (a plain ``nn.Linear`` router's weight and bias cast to
    it where the module holds another dtype; any other router, or one with hooks, is called on x cast to its weight's
    dtype, so its forward and hooks run; an enclosing ``torch.autocast`` runs the router as it runs any ``nn.Linear``,
    so its logits and the scores are then in the autocast dtype, while the experts' arithmetic is left alone); on
    CUDA, for up to 32 tokens (E <= 32; 8 at E = 128: ``router_max_tokens``) of bfloat16 / float16 x with
    ``routing="gpt_oss"``, a plain ``nn.Linear`` router without hooks in x's dtype and no gradient to record (decode),
    the router, the top-k and the softmax run as one launch, :func:`mxkit.moe.router_gpt_oss` (the logits summed in
    float64: they differ from the ``nn.Linear``'s cuBLAS sums in the last bit of about 0.1% of them; the router module
    itself is then not called). The experts are frozen (MX bytes); gradients reach x, the router and the expert biases
    (:class:`~mxkit.nn._moe_grad.ExpertsGrad`): the forward is the path without autograd (the same bits), the backward
    runs one expert at a time in float32 on its exact dequantized weights (W4A8 / MXFP4 x MXFP4: each expert
    recomputed with the forward's rounding points, the quantized activations and bf16 roundings passed straight
    through, so the routing weights get the gradient of the quantized output the forward weighted, and x and the
    biases theirs at the quantized values), so memory stays at one expert's weights plus its tokens' activations.
    Expert parallelism (``ep_ranges``) differentiates through the reference backend (float64) instead, its
    exchanges autograd Functions (:func:`mxkit.distributed.ep_moe`): every rank of the group must need a gradient
    and run the backward, or none.
    Raises TypeError for a hidden_size / intermediate_size / num_experts that is not an int (ValueError for one
    that is not positive) or a ``dtype`` that is not a floating torch.dtype; ValueError for a ``block_size`` that
    is not a positive int (or not a multiple of the element packing of ``weight_format``), sizes that are not
    multiples of ``block_size``, a bad ``top_k``, unknown names (or names that are not str). forward
    raises TypeError for an x that is not a tensor, ValueError for a 0-d x or one whose last dim is not H.
    """

    group_attr = "ep_group"  # (HoldsGroup: copies share it, pickling stores the world group as None)

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        weight_format: FormatLike,
        *,
        bias: bool = True,
        router_bias: bool = True,
        routing: str = "gpt_oss",
        activation: str = "swiglu_gpt_oss",
        expert_range: Optional[tuple[int, int]] = None,
        return_router_scores: bool = False,
        scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
        rounding: Union[str, Rounding] = Rounding.RNE,
        block_size: int = BLOCK_SIZE,
        backend: str = "auto",
        act_format: Optional[str] = None,
        keep_source: bool = False,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        act = _moe_act(act_format)
        fmt = get_format(weight_format)
        # ("False" is truthy: biases made, a tuple returned, a copy kept)
        check_bools(dict(bias=bias, router_bias=router_bias, return_router_scores=return_router_scores,
                         keep_source=keep_source), "MXMoE: ")
        # (NumPy integers taken, as for axis: dims read back from a config or an array)
        H, I, E, top_k = (as_int(v) for v in (hidden_size, intermediate_size, num_experts, top_k))  # noqa: E741
        for name, v in (("hidden_size", H), ("intermediate_size", I), ("num_experts", E)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int for MXMoE, got {type(v).__name__} {v!r}")
            if v <= 0:
                raise ValueError(f"{name}={v} must be positive for MXMoE")
        block_size = as_int(block_size)  # (a NumPy integer, as the sizes above)
        _check_block_size(block_size, fmt, None)  # (act_format: FP8 rows, or MXFP4 in blocks of 32, checked below)
        for name, v in (("hidden_size", H), ("intermediate_size", I)):
            if v % block_size:
                raise ValueError(f"{name}={v} must be a multiple of {block_size=} for MXMoE")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
            raise ValueError(f"top_k={top_k!r} must be an int in [1, num_experts={E}]")
        if not isinstance(routing, str) or routing not in ROUTING_MODES:
            raise ValueError(f"unknown routing={routing!r}; known: {', '.join(ROUTING_MODES)}")
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation={activation!r}; known: {', '.join(ACTIVATIONS)}")
        if not isinstance(backend, str) or backend not in MOE_BACKENDS:
            raise ValueError(f"unknown backend={backend!r}; known: {', '.join(MOE_BACKENDS)}")
        lo, hi = _check_expert_range(expert_range, E)
        if act is not None and (lo, hi) != (0, E):
            raise ValueError(f"act_format={act_format!r} takes all the experts (no expert_range): the quantized-"
                             f"activation layers have no expert parallelism")
        if act == "mxfp4_e2m1" and block_size != BLOCK_SIZE:
            raise ValueError(f"act_format='mxfp4' quantizes the activations in blocks of {BLOCK_SIZE}; got "
                             f"{block_size=}")
        self.hidden_size, self.intermediate_size, self.num_experts, self.top_k = H, I, E, top_k
        self.weight_format: ElementFormat = fmt
        self.routing, self.activation, self.backend = routing, activation, backend
        self.act_format: Optional[str] = act
        self._folded: Optional[tuple] = None  # (key of the expert buffers it was made from, folded pair)
        self._packed: Optional[tuple] = None  # (key, decode-layout pair: decode and prefill), as _folded
        self._packed_wgmma: Optional[tuple] = None  # (key, prefill-layout pair, for K % 64 != 0), as _folded
        self.keep_source = keep_source
        # after pack_: MmaExperts' (special, one_mul, bf16_exact) per expert tensor, of the bytes the buffers hold
        self._mma_flags: Optional[tuple] = None
        self._fold_layout = False  # after pack_ of a W4A8 module: the buffers hold the experts folded to E4M3
        self.expert_range = (lo, hi)
        self.return_router_scores = return_router_scores
        # a module called with the (T, E) logits on each forward (swap_gpt_oss_moe / load_gpt_oss_model: one that
        # transformers' output recorder hooks, so output_router_logits works on a swapped model); None: none
        self.logits_recorder: Optional[nn.Module] = None
        self.scale_mode, self.rounding = ScaleMode.parse(scale_mode), Rounding.parse(rounding)
        self.block_size = block_size
        self.ep_ranges: Optional[list[tuple[int, int]]] = None  # set by shard_experts: every rank's range
        self.ep_group = None
        if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise TypeError(f"dtype={dtype!r} must be float32, bfloat16, float16 or float64 (the router and biases)")
        check_device_name(device, "MXMoE(device=...)")
        f = dict(device=device, dtype=dtype or torch.float32)
        self.router = nn.Linear(H, E, bias=router_bias, **f)
        for name, shape in zip(_EXPERTS, self._expert_shapes(hi - lo)):
            q_shape, s_shape = MXTensor.expected_shapes(shape, 2, fmt, block_size)
            self.register_buffer(f"{name}_qdata", torch.zeros(q_shape, dtype=torch.uint8, device=device))
            self.register_buffer(f"{name}_scale", torch.zeros(s_shape, dtype=torch.uint8, device=device))
        self.register_state_dict_post_hook(_checkpoint_layout_state)
        self.register_state_dict_post_hook(record_format)
        self.register_state_dict_post_hook(_record_experts)
        self.register_load_state_dict_pre_hook(check_format)
        self.register_load_state_dict_pre_hook(_check_experts)
        self.register_load_state_dict_pre_hook(_pack_loaded_state)
        self.register_load_state_dict_post_hook(_forget_expert_copies)
        self._record_own()
        if bias:
            self.gate_up_bias = nn.Parameter(torch.zeros(hi - lo, 2 * I, **f))
            self.down_bias = nn.Parameter(torch.zeros(hi - lo, H, **f))
        else:
            self.register_parameter("gate_up_bias", None)
            self.register_parameter("down_bias", None)

    def _expert_shapes(self, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (n, 2 * self.intermediate_size, self.hidden_size), (n, self.hidden_size, self.intermediate_size)

    @property
    def num_local_experts(self) -> int:
        """int: the number of experts this module holds, E_local = hi - lo of ``expert_range`` (E when it holds
        all)."""
        return self.expert_range[1] - self.expert_range[0]

    def _mx(self, name: str) -> MXTensor:
        shape = self._expert_shapes(self.num_local_experts)[_EXPERTS.index(name)]
        q, s = self._checkpoint_pair(name)
        return MXTensor(q, s, self.weight_format, 2, self.block_size, shape, self.scale_mode, self.rounding)

    @property
    def activation(self) -> str:
        """The experts' activation, ``"swiglu_gpt_oss"`` or ``"swiglu"``. Setting another one on a module whose
        experts are re-laid in place (:meth:`pack_`: their gate / up rows interleaved for the activation in force)
        first puts them back in the checkpoint layout (the next CUDA forward lays them out again for the new one);
        ValueError for an unknown name."""
        return self.__dict__["_activation"]

    @activation.setter
    def activation(self, value: str) -> None:
        if not isinstance(value, str) or value not in ACTIVATIONS:
            raise ValueError(f"unknown activation={value!r}; known: {', '.join(ACTIVATIONS)}")
        old = self.__dict__.get("_activation")
        if old is not None and value != old and self.expert_layout != "checkpoint":
            self._to_checkpoint_layout()  # (under the old activation, whose interleave the rows hold)
        self.__dict__["_activation"] = value

    @property
    def expert_layout(self) -> str:
        """The expert buffers' layout: ``"checkpoint"``; after :meth:`pack_`, ``"mma"`` (W4A16) or ``"fold"``
        (``act_format`` W4A8 or MXFP4 x MXFP4)."""
        if self._mma_flags is not None:
            return "mma"
        return "fold" if self._fold_layout else "checkpoint"

    def _checkpoint_pair(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The checkpoint-layout (qdata, scale) of expert tensor ``name`` (unpacked or unfolded when packed)."""
        layout = self.expert_layout
        if layout == "checkpoint":
            return getattr(self, f"{name}_qdata"), getattr(self, f"{name}_scale")
        qd, sc = self._unpacked(name) if layout == "mma" else self._unfolded(name)
        if self._interleaved(name):  # (gate 0, up 0, gate 1, ...) -> [gate; up]
            qd, sc = (torch.cat([t[:, 0::2], t[:, 1::2]], dim=1) for t in (qd, sc))
        return qd, sc

    def _checkpoint_buffers(self) -> dict[str, torch.Tensor]:
        """The four expert buffers in the checkpoint layout, by name (unpacked when packed in place)."""
        out = {}
        for name in _EXPERTS:
            out[f"{name}_qdata"], out[f"{name}_scale"] = self._checkpoint_pair(name)
        return out

    def _interleaved(self, name: str) -> bool:
        """Whether the packed rows of ``name`` are the [gate; up] halves interleaved (activation "swiglu")."""
        return name == "gate_up" and self.activation == "swiglu"

    def _record_own(self) -> None:
        """Record the expert buffers as the module's own (wherever it sets them): a compiled forward that finds
        others (swapped in by torch.func.functional_call) takes the export route, whose ops are given the experts'
        tensors, not the module's key (gate_up's codes, recorded here), whose ops read the module's own."""
        # (weak: an expert buffer replaced is freed)
        bufs = self._expert_buffers()
        # (the key its compiled ops find it by; buffers another live module owns, shared with it: not its own)
        mine = _ops.own_key(self, bufs["gate_up_qdata"], "moe")
        self.__dict__["_own"] = tuple(weakref.ref(t) for t in bufs.values()) if mine else None

    def _note_flags(self) -> None:
        """Record the packed buffers the kernel flags (``_mma_flags``) were read from: buffers written or replaced
        since have their flags read again on the next CUDA forward."""
        self.__dict__["_flags_key"] = None if self._mma_flags is None else TensorsKey(
            [getattr(self, f"{n}_{p}") for n in _EXPERTS for p in ("qdata", "scale")])

    def _op_key(self) -> torch.Tensor:
        """The tensor by which the compiled ops find this module (:meth:`_record_own`): its gate_up codes buffer.
        NotImplementedError inside forward-mode AD (the ops have no forward rule)."""
        refuse_forward_ad(type(self).__name__)
        return self._buffers["gate_up_qdata"]

    def _owns_experts(self) -> bool:
        own = self.__dict__.get("_own")
        return own is not None and same_objects(own, tuple(self._expert_buffers().values()))

    def _expert_buffers(self) -> dict:
        """The expert tensors :meth:`_expert_weight` reads, by buffer name (the row scales too in the fold layout):
        what a backward keeps of its forward's experts."""
        names = [f"{n}_{part}" for n in _EXPERTS for part in ("qdata", "scale")]
        if self.expert_layout == "fold":
            names += [f"{n}_row_scale" for n in _EXPERTS]
        return {n: getattr(self, n) for n in names}

    def _expert_weight(self, name: str, e: int, bufs: Optional[dict] = None,
                       layout: Optional[str] = None) -> torch.Tensor:
        """Local expert e of ``name`` dequantized to float32 (N, K) (exact), rows in the checkpoint order, from
        whichever layout the buffers hold (``bufs`` and ``layout``: those of :meth:`_expert_buffers` and
        ``expert_layout`` kept by a forward, else the module's now), touching that expert's bytes only."""
        E, N, K = self._expert_shapes(self.num_local_experts)[_EXPERTS.index(name)]
        get = bufs.__getitem__ if bufs is not None else lambda n: getattr(self, n)
        q, s = get(f"{name}_qdata"), get(f"{name}_scale")
        layout = self.expert_layout if layout is None else layout
        if layout == "fold":  # each E4M3 byte times its row scale is the MX value (the fold is exact)
            w = q[e].view(torch.float8_e4m3fn).to(torch.float32) * get(f"{name}_row_scale")[e][:, None]
        else:
            if layout == "mma":
                from ..kernels.matmul_details._mma_decode import unpack_mma

                q, s = unpack_mma(q[e * N // 16:(e + 1) * N // 16], s[e * N // 16:(e + 1) * N // 16])
            else:
                q, s = q[e], s[e]
            w = dequantize(MXTensor(q, s, self.weight_format, 1, self.block_size, (N, K), self.scale_mode,
                                    self.rounding), torch.float32)
        # (the packed layouts hold swiglu's [gate; up] halves interleaved)
        return torch.cat([w[0::2], w[1::2]]) if layout != "checkpoint" and self._interleaved(name) else w

    def _unpacked(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(qdata, scale) of expert tensor ``name`` from its decode-mma buffers, rows in the packed order."""
        from ..kernels.matmul_details._mma_decode import unpack_mma

        q, s = getattr(self, f"{name}_qdata"), getattr(self, f"{name}_scale")
        E, N, K = self._expert_shapes(self.num_local_experts)[_EXPERTS.index(name)]
        if q.is_cuda:  # one kernel (_mma_pack.unpack_mma_fused) writing the outputs
            qd, sc = unpack_mma(q, s)
            return qd.view(E, N, K // 2), sc.view(E, N, K // 32)
        qd = torch.empty(E * N, K // 2, dtype=torch.uint8, device=q.device)
        sc = torch.empty(E * N, K // 32, dtype=torch.uint8, device=q.device)
        step = max(1, (1 << 18) // K)  # groups of 16 rows per chunk: 4M codes (the PyTorch twin's int64 temporaries)
        for r0 in range(0, q.shape[0], step):
            qd[16 * r0:16 * (r0 + step)], sc[16 * r0:16 * (r0 + step)] = unpack_mma(q[r0:r0 + step], s[r0:r0 + step])
        return qd.view(E, N, K // 2), sc.view(E, N, K // 32)

    def _unfolded(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(qdata, scale) of expert tensor ``name`` from its fold-layout buffers, rows in the packed order: each
        element's E4M3 value times its row scale over its block scale is the FP4 / FP6 element exactly (the fold
        is exact), encoded again. One expert at a time (float32 temporaries of one expert)."""
        from ..formats import E8M0_BIAS, _exp2_f32, encode_elements
        from ..reference import _pack_codes

        data = getattr(self, f"{name}_qdata").view(torch.float8_e4m3fn)
        scale, row = getattr(self, f"{name}_scale"), getattr(self, f"{name}_row_scale")
        E, N, K = data.shape
        nb = K // self.block_size
        row_exp = torch.frexp(row)[1].to(torch.int32) - 1  # row scales are powers of two
        qd = torch.empty(MXTensor.expected_shapes((E, N, K), 2, self.weight_format, self.block_size)[0],
                         dtype=torch.uint8, device=data.device)
        for e in range(E):
            shift = row_exp[e][:, None] - (scale[e].to(torch.int32) - E8M0_BIAS)  # (N, nb)
            v = data[e].to(torch.float32).view(N, nb, self.block_size) * _exp2_f32(shift)[..., None]
            qd[e] = _pack_codes(encode_elements(v.view(N, K), self.weight_format), self.weight_format)
        return qd, scale.clone()

    def _fold_(self) -> bool:
        """pack_ of a W4A8 or MXFP4 x MXFP4 module (``act_format``): the experts folded in place (module
        docstring)."""
        from ..kernels.moe import fold_experts
        from ..kernels.moe_details._rows import _interleave_halves

        if self.weight_format.bits not in (4, 6) or self.block_size != 32:
            return False
        folded = [fold_experts(self._mx(name), interleave_halves=self._interleaved(name)) for name in _EXPERTS]
        if any(f is None for f in folded):
            return False
        for name, f in zip(_EXPERTS, folded):
            s = getattr(self, f"{name}_scale")
            setattr(self, f"{name}_scale", _interleave_halves(s, 1).contiguous() if f.interleaved else s)
            setattr(self, f"{name}_qdata", f.data.view(torch.uint8))
            self.register_buffer(f"{name}_row_scale", f.scale, persistent=False)
        self._fold_layout = True
        self._packed = self._folded = None
        self._record_own()
        return True

    def _apply(self, fn, recurse: bool = True):
        """nn.Module's, but the fold layout's row scales (``*_row_scale``) move with the module and stay float32:
        they are powers of two that float16 would flush under 2^-24 (``module.half()`` would otherwise change the
        experts' values and their checkpoint bytes)."""
        rows = {n: b for n, b in self._buffers.items() if n.endswith("_row_scale") and b is not None}
        for n in rows:
            self._buffers[n] = None  # (Module._apply skips None buffers; the dict keeps its order)
        before = {n: t for n, t in self._buffers.items() if t is not None}  # (the row scales set aside above)
        out = super()._apply(fn, recurse)
        for n, b in rows.items():
            moved = fn(b)
            self._buffers[n] = moved if moved.dtype == torch.float32 else b.to(device=moved.device)
        if any(self._buffers[n] is not t for n, t in before.items()):
            # (a copy on the old device would stay allocated until the next CUDA forward; a .to() that moves
            # nothing keeps the copies, and the addresses a CUDA graph captured)
            self._forget_expert_copies()
        return out

    def _forget_expert_copies(self) -> None:
        """Drop the expert copies made from the buffers (``_folded``, ``_packed``, ``_packed_wgmma``: made again on
        the next CUDA forward that needs them): after a move or cast, a state_dict load (inside
        ``torch.inference_mode`` the buffers keep no version counter to tell the copies they changed), and in a
        pickle or deep copy (their keys hold weak references, and a copy's would name the original's tensors)."""
        self._folded = self._packed = self._packed_wgmma = None
        self._record_own()
        self._note_flags()  # (a load's flags were read from its bytes; a move keeps the bytes)

    def _copy_state(self) -> dict:
        # (weak references do not pickle, and a copy's would name the original's tensors: both made again)
        return dict(super()._copy_state(), _folded=None, _packed=None, _packed_wgmma=None, _own=None, _flags_key=None,
                    _captured=None)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if "activation" in self.__dict__:  # (pickled before activation was a property)
            self.__dict__["_activation"] = self.__dict__.pop("activation")
        self._record_own()

    def _to_checkpoint_layout(self) -> None:
        """Undo :meth:`pack_`: the four expert buffers back in the checkpoint layout."""
        if self.expert_layout == "checkpoint":
            return
        for name, t in self._checkpoint_buffers().items():
            setattr(self, name, t)
        for name in _EXPERTS:
            self._buffers.pop(f"{name}_row_scale", None)
        self._mma_flags, self._fold_layout = None, False
        self._packed = self._folded = None
        self._record_own()

    def _packed_pair(self, name: str, q: torch.Tensor, s: torch.Tensor):
        """:func:`mxkit.kernels.moe.pack_experts_mma` of checkpoint-layout (qdata, scale) of ``name`` (None for
        shapes it does not take)."""
        from ..kernels.moe import pack_experts_mma

        shape = self._expert_shapes(q.shape[0])[_EXPERTS.index(name)]
        w = MXTensor(q, s, self.weight_format, 2, self.block_size, shape, self.scale_mode, self.rounding)
        return pack_experts_mma(w, interleave_halves=self._interleaved(name))

    def pack_(self) -> bool:
        """Re-lay the experts in place in the tensor-core kernels' layout (module docstring): one copy serving the
        decode and the prefill kernels, the checkpoint-layout buffers freed. The first CUDA forward of a W4A16
        MXFP4 module on Hopper calls it (unless ``keep_source``); it works on any device. Returns whether the
        buffers are now in that layout (False: another format, K % 64 != 0 or N % 16 != 0, or expert
        parallelism).

        W4A8 and MXFP4 x MXFP4 modules (``act_format``) are folded in place instead (layout ``"fold"``, on the
        first CUDA forward): False for other formats than FP4 / FP6, or experts that do not fold (a row whose
        block scales span more than the fold range, or outside the FP8 epilogue's envelope, or a NaN block:
        :func:`mxkit.kernels.moe.fold_experts`; they keep the checkpoint layout and take the reference)."""
        if self.expert_layout != "checkpoint":
            return True
        if self.ep_ranges is not None:
            return False
        if self.act_format is not None:
            return self._fold_()
        if self.weight_format.name != "mxfp4_e2m1":
            return False
        pairs, flags = [], []
        for name in _EXPERTS:
            p = self._packed_pair(name, getattr(self, f"{name}_qdata"), getattr(self, f"{name}_scale"))
            if p is None:
                return False
            pairs.append((p.q, p.s))
            flags.append((p.special, p.one_mul, p.bf16_exact))
        for name, (q, s) in zip(_EXPERTS, pairs):
            setattr(self, f"{name}_qdata", q)
            setattr(self, f"{name}_scale", s)
        self._mma_flags = tuple(flags)
        self._packed = self._folded = None
        self._record_own()
        self._note_flags()
        return True

    @property
    def gate_up_mx(self) -> MXTensor:
        """The gate_up experts as an MXTensor (E_local, 2I, H) along H: sharing the buffers in the ``"checkpoint"``
        layout; in the ``"mma"`` / ``"fold"`` layouts (:attr:`expert_layout`) a new checkpoint-layout copy (gate
        and up rows de-interleaved back for ``"swiglu"``), so writes to it do not reach the module."""
        return self._mx("gate_up")

    @property
    def down_mx(self) -> MXTensor:
        """The down experts as an MXTensor (E_local, H, I) along I: sharing the buffers in the ``"checkpoint"``
        layout, a new copy in the ``"mma"`` / ``"fold"`` layouts (as :attr:`gate_up_mx`)."""
        return self._mx("down")

    def dequantize_experts(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``(gate_up (E_local, 2I, H), down (E_local, H, I))`` in ``dtype``: float32 (None means float32),
        bfloat16, float16 or float64, as :func:`mxkit.dequantize`; exact in float64, and in float32 within its range
        (a value past it, from a scale byte near 254, is ±Inf there). Raises TypeError for another dtype."""
        return dequantize(self.gate_up_mx, dtype), dequantize(self.down_mx, dtype)

    @property
    def expert_nbytes(self) -> int:
        """Storage bytes of the experts: element codes plus E8M0 scales (the same bytes in the checkpoint and the
        mma layout); in the fold layout, the E4M3 bytes, the E8M0 scales and the float32 row scales."""
        parts = ("qdata", "scale", "row_scale") if self.expert_layout == "fold" else ("qdata", "scale")
        return sum(getattr(self, f"{n}_{p}").nbytes for n in _EXPERTS for p in parts)

    # --- constructors ----------------------------------------------------------------------------------------

    @classmethod
    def from_dense(
        cls,
        router: nn.Linear,
        w_gate_up: torch.Tensor,
        b_gate_up: Optional[torch.Tensor],
        w_down: torch.Tensor,
        b_down: Optional[torch.Tensor],
        top_k: int,
        weight_format: FormatLike,
        *,
        expert_range: Optional[tuple[int, int]] = None,
        **kwargs,
    ) -> "MXMoE":
        """Quantize dense experts given in the checkpoint convention and return an MXMoE on the router's device
        (the experts are quantized on their own device and copied there; move the router first to build it
        elsewhere).

        router: ``nn.Linear(H, E)`` (copied; its bias, if any, too).
        w_gate_up: (E, 2I, H), w_down: (E, H, I) float32 | bfloat16 | float16, each quantized along its last
          axis with :func:`mxkit.quantize`; b_gate_up (E, 2I), b_down (E, H) or both None.
        expert_range: keep experts lo..hi-1 only (the others are not quantized).
        kwargs: the constructor's (routing, activation, return_router_scores, scale_mode, rounding, block_size,
          backend, act_format, keep_source). Raises TypeError for experts that are not float32 / bfloat16 / float16
          tensors or biases that are not tensors (naming them), ValueError for shapes that do not agree or tensors
          on the meta device (naming them), and the constructor's errors.
        """
        for name, t in (("w_gate_up", w_gate_up), ("w_down", w_down)):
            if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise TypeError(f"{name} must be a float32 / bfloat16 / float16 tensor, got "
                                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        dims = _expert_dims(router, w_gate_up, b_gate_up, w_down, b_down, ("w_gate_up", "w_down"))

        def experts(mod: "MXMoE", dense: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
            q = quantize(dense.detach()[lo:hi], mod.weight_format, axis=-1, block_size=mod.block_size,
                         scale_mode=mod.scale_mode, rounding=mod.rounding)
            return q.qdata, q.scale

        return cls._filled(router, dims, top_k, weight_format, (w_gate_up, b_gate_up), (w_down, b_down), experts,
                           expert_range=expert_range, device=None, **kwargs)

    @classmethod
    def from_mx(
        cls,
        router: nn.Linear,
        gate_up: MXTensor,
        b_gate_up: Optional[torch.Tensor],
        down: MXTensor,
        b_down: Optional[torch.Tensor],
        top_k: int,
        *,
        expert_range: Optional[tuple[int, int]] = None,
        device: Optional[Union[str, torch.device]] = None,
        **kwargs,
    ) -> "MXMoE":
        """An MXMoE holding the given MX experts' bytes as they are (no dequantize, no re-quantize): a GPT-OSS
        checkpoint's MXFP4 experts (:func:`mxkit.gpt_oss.load_gpt_oss`) become the module's buffers byte for byte.

        router: ``nn.Linear(H, E)`` (copied, its bias too). gate_up: MXTensor (E, 2I, H), down: MXTensor (E, H, I),
          both of one format, quantized along their last axis, plain scales, block size 32; b_gate_up (E, 2I),
          b_down (E, H) or both None. Memory-mapped inputs are read once, only the experts of ``expert_range``.
        device: of the module (default: the router's); the router and the biases keep the router's dtype.
        kwargs: the constructor's (routing, activation, return_router_scores, backend, act_format, keep_source;
          scale_mode and rounding default to the experts' own, which must then agree; block_size, if given, 32).
        Raises TypeError / ValueError for operands that do not fit together or sit on the meta device (naming
        them), ValueError for a ``block_size`` other than 32.
        """
        for name, t in (("gate_up", gate_up), ("down", down)):
            if not isinstance(t, MXTensor):
                raise TypeError(f"{name} must be an MXTensor, got {type(t).__name__}")
            if t.ndim != 3 or t.axis != 2 or t.scale_layout != "plain" or t.block_size != BLOCK_SIZE:
                raise ValueError(f"{name} must be an MXTensor (E, N, K) along its last axis with plain scales and "
                                 f"blocks of {BLOCK_SIZE}, got shape {tuple(t.shape)}, axis {t.axis}, "
                                 f"{t.scale_layout} scales, blocks of {t.block_size}")
        if gate_up.fmt != down.fmt:
            raise ValueError(f"gate_up is {gate_up.fmt.name} but down {down.fmt.name}")
        dims = _expert_dims(router, gate_up, b_gate_up, down, b_down, ("gate_up", "down"))
        for key in ("scale_mode", "rounding"):  # (the experts' own metadata where the caller does not say)
            if key not in kwargs:
                if getattr(gate_up, key) != getattr(down, key):
                    raise ValueError(f"gate_up's {key} is {getattr(gate_up, key).value} but down's "
                                     f"{getattr(down, key).value}: pass {key}= for the module")
                kwargs[key] = getattr(gate_up, key)
        if as_int(kwargs.get("block_size", BLOCK_SIZE)) != BLOCK_SIZE:  # (the copy raised torch's shape mismatch)
            raise ValueError(f"block_size={kwargs['block_size']!r}: from_mx holds the experts' own blocks of "
                             f"{BLOCK_SIZE}")
        return cls._filled(router, dims, top_k, gate_up.fmt, (gate_up, b_gate_up), (down, b_down),
                           lambda mod, q, lo, hi: (q.qdata[lo:hi], q.scale[lo:hi]), expert_range=expert_range,
                           device=device, **kwargs)

    @classmethod
    def _filled(cls, router: nn.Linear, dims: tuple[int, int, int], top_k: int, fmt, gate_up: tuple, down: tuple,
                experts, *, expert_range, device, **kwargs) -> "MXMoE":
        """The module of :meth:`from_dense` / :meth:`from_mx`: built on ``device`` (default the router's) in the
        router's dtype, its router copied, each of ``gate_up`` / ``down`` ((weights, bias or None)) written as
        ``experts(module, weights, lo, hi) -> (qdata, scale)`` of the experts it holds and their biases."""
        E, H, I = dims  # noqa: E741
        w = router.weight.detach()
        given = {"router.weight": w, "router.bias": router.bias, "gate_up bias": gate_up[1], "down bias": down[1]}
        given.update({f"{part} experts": t for part, (t, _) in (("gate_up", gate_up), ("down", down))
                      if isinstance(t, torch.Tensor)})
        given.update({f"{part} experts' {f}": getattr(t, f) for part, (t, _) in (("gate_up", gate_up), ("down", down))
                      if isinstance(t, MXTensor) for f in ("qdata", "scale")})
        meta = [name for name, t in given.items() if isinstance(t, torch.Tensor) and t.device.type == "meta"]
        if meta:  # (the copies below raised torch's "Cannot copy out of meta tensor", naming none)
            raise ValueError(f"MXMoE: {', '.join(meta)} on the meta device hold no values to quantize or copy")
        mod = cls(H, I, E, top_k, fmt, bias=gate_up[1] is not None, router_bias=router.bias is not None,
                  expert_range=expert_range, device=device if device is not None else w.device, dtype=w.dtype,
                  **kwargs)
        lo, hi = mod.expert_range
        with torch.no_grad():
            mod.router.weight.copy_(w)
            if router.bias is not None:
                mod.router.bias.copy_(router.bias.detach())
            for name, (weights, b) in (("gate_up", gate_up), ("down", down)):
                q, sc = experts(mod, weights, lo, hi)
                getattr(mod, f"{name}_qdata").copy_(q)
                getattr(mod, f"{name}_scale").copy_(sc)
                if b is not None:
                    getattr(mod, f"{name}_bias").copy_(b.detach()[lo:hi])
        return mod

    @classmethod
    def from_hf_gpt_oss(
        cls,
        mlp: nn.Module,
        weight_format: FormatLike = "mxfp4",
        *,
        expert_range: Optional[tuple[int, int]] = None,
        return_router_scores: bool = False,
        **kwargs,
    ) -> "MXMoE":
        """Convert a transformers ``GptOssMLP`` (``models/gpt_oss/modeling_gpt_oss.py``: ``.router``, a
        ``GptOssTopKRouter`` with weight (E, H) and bias (E,); ``.experts``, a ``GptOssExperts`` with
        ``gate_up_proj`` [E, H, 2I], ``gate_up_proj_bias`` [E, 2I], ``down_proj`` [E, I, H], ``down_proj_bias``
        [E, H]) to an MXMoE with GPT-OSS routing and activation, the expert weights transposed to the checkpoint
        layout and quantized to ``weight_format``. ``expert_range``: keep experts lo..hi-1 only;
        ``return_router_scores``: forward returns (y, scores) as ``GptOssMLP`` does (the default False returns y);
        ``kwargs``: :meth:`from_dense`'s (the constructor's options).

        Raises TypeError for another module, ValueError for a ``swiglu_alpha`` / ``swiglu_limit`` other than
        1.702 / 7.0 (the activation mxkit implements).
        """
        router, experts = getattr(mlp, "router", None), getattr(mlp, "experts", None)
        if not all(hasattr(experts, a) for a in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")) \
                or not hasattr(router, "top_k"):
            raise TypeError(f"from_hf_gpt_oss expects a transformers GptOssMLP (router + experts), got "
                            f"{type(mlp).__name__}")
        alpha, limit = getattr(experts, "alpha", None), getattr(experts, "limit", None)
        if (alpha, limit) != (GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT):
            raise ValueError(f"GptOssExperts has swiglu alpha={alpha}, limit={limit}; MXMoE implements "
                             f"alpha={GPT_OSS_SWIGLU_ALPHA}, limit={GPT_OSS_SWIGLU_LIMIT}")
        w = router.weight.detach()
        lin = nn.Linear(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(router.bias.detach())
        return cls.from_dense(
            lin, experts.gate_up_proj.detach().transpose(1, 2), experts.gate_up_proj_bias.detach(),
            experts.down_proj.detach().transpose(1, 2), experts.down_proj_bias.detach(), router.top_k,
            weight_format, expert_range=expert_range, routing="gpt_oss", activation="swiglu_gpt_oss",
            return_router_scores=return_router_scores, **kwargs,
        )

    # --- expert parallelism --------------------------------------------------------------------------------

    def shard_experts(self, group=None, ranges: Optional[Sequence[tuple[int, int]]] = None) -> "MXMoE":
        """Keep only this rank's experts (in place) and run forward expert-parallel over ``group``.

        ranges: every rank's (lo, hi); default :func:`mxkit.distributed.expert_ranges` (E, world size).
        The module must hold every expert (a shard of a full module). Returns ``self``. Raises ValueError for a
        module of quantized activations (``act_format``), which has no expert-parallel path, a module that does not
        hold every expert, ``ranges`` that are not one contiguous non-empty (lo, hi) per rank covering [0, E), or
        a process outside ``group``; TypeError for ranges that are not pairs of ints.
        """
        if self.expert_range != (0, self.num_experts):
            raise ValueError(f"shard_experts needs a module holding every expert, this one holds {self.expert_range}")
        if self.act_format is not None:
            raise ValueError(f"act_format={self.act_format!r}: the quantized-activation layers have no expert "
                             f"parallelism (shard a module of bf16 activations)")
        world, rank = group_position(group, "shard_experts")
        # (an empty sequence is bad ranges, not the default split; an array of ranges is read pair by pair)
        ranges = list(check_expert_ranges(expert_ranges(self.num_experts, world) if ranges is None else ranges,
                                          self.num_experts, world))
        lo, hi = ranges[rank]
        # (in the checkpoint layout: the expert-parallel path reads it)
        self._to_checkpoint_layout()
        for name, t in self._checkpoint_buffers().items():
            setattr(self, name, t[lo:hi].clone())
        for name in ("gate_up_bias", "down_bias"):
            b = getattr(self, name)
            if b is not None:
                setattr(self, name, nn.Parameter(b.detach()[lo:hi].clone(), requires_grad=b.requires_grad))
        self.expert_range, self.ep_ranges, self.ep_group = (lo, hi), ranges, group
        self._forget_expert_copies()  # (the copies of every expert: not this rank's to keep)
        self.__dict__["_captured"] = None
        return self

    # --- forward ---------------------------------------------------------------------------------------------

    def _group_position_ok(self, rank: int, world: int) -> bool:
        return world == len(self.ep_ranges) and tuple(self.ep_ranges[rank]) == tuple(self.expert_range)

    def _check_ep_position(self) -> None:
        """ValueError where this rank's place in ``ep_ranges`` is not the experts the module holds (a module built
        with another rank's ``expert_range`` and given its state_dict: its experts ran as this rank's, silently
        wrong). Every forward of an expert-parallel module (a rank outside the group, or no group, is for what runs
        next to refuse)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return  # (no group: what runs next says so)
        rank, world = dist.get_rank(self.ep_group), dist.get_world_size(self.ep_group)
        if rank >= 0 and not self._group_position_ok(rank, world):
            mine = tuple(self.ep_ranges[rank]) if rank < len(self.ep_ranges) else None
            raise ValueError(f"this MXMoE holds experts {tuple(self.expert_range)} but ep_ranges gives rank {rank} "
                             f"of {world} the experts {mine} ({len(self.ep_ranges)} ranges): build it with this "
                             f"rank's range (mxkit.nn.shard_experts)")

    def forward(self, x: torch.Tensor):
        if self.ep_ranges is None:
            self._check_input(x)
        else:
            try:
                self.check_group_position()
                self._check_ep_position()
                self._check_input(x)
            except (TypeError, ValueError) as e:  # the peers are in ep_moe's header exchange: they raise too
                raise_collectively(e, self.ep_group)
        if x.is_cuda and elsewhere(x):  # (the kernels launch on the current device)
            with torch.cuda.device(x.device):
                return self.forward(x)
        if not torch.compiler.is_compiling() and _functorch_wrapped(x):
            raise NotImplementedError(_NO_FUNC)
        # (a strided x: the router's BLAS picks its kernel by layout, the contiguous copy's bits; a negative-bit view:
        # its memory holds -x, which the kernels read raw)
        x = x.contiguous().resolve_neg()
        routed = None
        if torch.compiler.is_compiling() and (exporting() or not self._owns_experts()) and self.ep_ranges is None:
            return self._exported(x)  # (torch.export, or experts swapped in: the ops given the experts' tensors)
        if self._routes_in_one_launch(x):
            if torch.compiler.is_compiling():
                y, logits, weights = torch.ops.mxkit.mx_moe_routed(x, self._op_key(), self.num_experts, self.top_k)
                routed = (weights, None)
            else:
                logits, *routed = router_gpt_oss(x.reshape(-1, x.shape[-1]), self.router.weight, self.router.bias,
                                                 self.top_k)
                logits = logits.view(*x.shape[:-1], self.num_experts)
                y = self._experts(x, logits, tuple(routed))
            recorder = self.logits_recorder
            if recorder is not None:
                recorder(logits.reshape(-1, self.num_experts))
            return self._result(y, logits, routed)
        if self.ep_ranges is None:
            logits = self._router_logits(x)
        else:
            try:  # (before ep_moe's header exchange: a bad router raises on every rank, not on its own; a
                # RuntimeError too: F.linear's on a router of the wrong input width)
                logits = self._router_logits(x)
            except Exception as e:
                raise_collectively(e, self.ep_group)
        recorder = self.logits_recorder
        if recorder is not None:
            recorder(logits.reshape(-1, self.num_experts))
        if torch.compiler.is_compiling():
            # the kernels launch through the driver API, which dynamo does not trace, and the CPU path reads
            # routing counts on the host: one opaque op for inference on every device, a graph break where
            # autograd needs a gradient (x, the router, the expert biases)
            if needs_grad(x, logits, self.gate_up_bias, self.down_bias):
                if self.ep_ranges is not None:  # (the all-to-all's reference path: a graph break)
                    return self._result(_eager_experts(self, x, logits), logits)
                # the routing and the experts, each one op with its backward registered (the eager ops' bits:
                # the routing's gradient reaches the router through the traced logits)
                weights, ids = torch.ops.mxkit.mx_moe_route(logits.reshape(-1, self.num_experts), self.top_k,
                                                            self.routing)
                y = torch.ops.mxkit.mx_moe_experts(x, weights, ids, logits.detach(), self.gate_up_bias,
                                                   self.down_bias, self._op_key())
                return self._result(y, logits, (weights, ids))
            return self._result(torch.ops.mxkit.mx_moe(x, logits, self._op_key()), logits)
        routed = None
        if self.return_router_scores:  # routed once for the experts and the scores, where the experts take it
            grad = needs_grad(x, logits, self.gate_up_bias, self.down_bias)
            if (x.is_cuda and not grad) or (grad and self.ep_ranges is None):
                routed = route(logits.reshape(-1, self.num_experts), self.top_k, mode=self.routing)
        return self._result(self._experts(x, logits, routed), logits, routed)

    def _exported(self, x: torch.Tensor):
        """forward under ``torch.export``: the router traced, then the experts as ops on the expert buffers
        (``mxkit::mx_moe_export``, with ``mxkit::mx_moe_route`` first where a gradient is needed), so the program
        holds the experts and runs in another process (the module docstring)."""
        logits = self._router_logits(x)
        recorder = self.logits_recorder
        if recorder is not None:
            recorder(logits.reshape(-1, self.num_experts))
        spec, bufs = _moe_export.export_spec(self), _moe_export.export_buffers(self)
        if not needs_grad(x, logits, self.gate_up_bias, self.down_bias):
            y = torch.ops.mxkit.mx_moe_export(x, logits, None, None, *bufs, self.gate_up_bias, self.down_bias, spec)
            return self._result(y, logits)
        weights, ids = torch.ops.mxkit.mx_moe_route(logits.reshape(-1, self.num_experts), self.top_k, self.routing)
        y = torch.ops.mxkit.mx_moe_export(x, logits.detach(), weights, ids, *bufs, self.gate_up_bias, self.down_bias,
                                          spec)
        return self._result(y, logits, (weights, ids))

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MXMoE takes a tensor x (..., hidden_size), got {type(x).__name__}")
        if x.dtype not in _FLOATS:  # (mxkit.moe's: float64 runs on its reference)
            raise TypeError(f"MXMoE takes x of float32 / bfloat16 / float16 (float64: the reference), got {x.dtype}")
        if self.act_format is not None and x.dtype == torch.float64:  # (quantized activations: no float64 path)
            raise TypeError(f"MXMoE with act_format={self.act_format!r} takes x of float32 / bfloat16 / float16, got "
                            f"{x.dtype}")
        if x.dim() == 0 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"MXMoE takes x (..., hidden_size={self.hidden_size}), got shape {tuple(x.shape)}")
        if x.device != self.gate_up_qdata.device:
            raise ValueError(f"MXMoE's experts are on {self.gate_up_qdata.device} but x on {x.device}")

    def _routes_in_one_launch(self, x: torch.Tensor) -> bool:
        """Whether forward routes x through :func:`mxkit.moe.router_gpt_oss`'s one kernel (the class docstring):
        GPT-OSS routing, a plain ``nn.Linear`` router, no gradient to record, and x's tokens, the router's weight and
        bias as the kernel takes them (``_route.router_takes``: CUDA, x's dtype bfloat16 / float16, up to
        ``router_max_tokens(E)`` tokens, E <= 1024, top_k <= 32)."""
        r = self.router
        return (self.routing == "gpt_oss" and type(r) is nn.Linear and not _hooked(r) and x.dim() >= 1
                and x.shape[-1] > 0
                and router_takes(x.reshape(-1, x.shape[-1]), r.weight, r.bias, self.top_k)
                and not needs_grad(x, r.weight, r.bias, self.gate_up_bias, self.down_bias))

    def _router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The router's logits (..., E) in x's dtype: ``self.router(x)``, or, for a plain ``nn.Linear`` router whose
        weight is in another dtype (a float32 module called on bfloat16 / float16 x), with its weight and bias cast
        to x's dtype (the cast is differentiable, so the gradients still reach the router's parameters in their
        dtype). Any other router with a weight of another dtype (a subclass, a wrapper, a module with hooks or a
        forward replaced on the instance) is called on x cast to that dtype, its logits cast back."""
        r = self.router
        w = getattr(r, "weight", None)  # (None: a router replaced by another module, e.g. an MXLinear)
        plain = type(r) is nn.Linear and not _hooked(r)
        if plain:  # (its weight read as it is: a CPU x times a meta weight is uninitialised memory in torch, no
            # error; a hooked router, e.g. accelerate's offload, puts its weight in place itself)
            for name, t in r._parameters.items():
                if t is not None and t.device != x.device:
                    raise ValueError(f"MXMoE's router {name} is on {t.device} but x on {x.device}")
        if not isinstance(w, torch.Tensor) or w.dtype == x.dtype:
            logits = r(x)
        elif plain:
            b = r.bias
            logits = F.linear(x, w.to(x.dtype), None if b is None else b.to(x.dtype))
        else:  # (its forward, hooks and adapters run: F.linear of its weight would skip them)
            logits = r(x.to(w.dtype)).to(x.dtype)
        if logits.shape[-1] != self.num_experts:
            raise ValueError(f"MXMoE's router gives {logits.shape[-1]} logits a token, expected num_experts="
                             f"{self.num_experts}")
        return logits

    def _experts(self, x: torch.Tensor, logits: torch.Tensor, routed: Optional[tuple] = None) -> torch.Tensor:
        """The routed experts' weighted sum (..., H) for x and the router's logits (the layer without the router).
        ``routed``: the (weights, ids) of :func:`mxkit.moe.route` on these logits when the caller has them (the
        packed decode / prefill path and the gradient path take them rather than routing again). Where autograd
        needs a gradient (x, the router or the expert biases) it goes through
        :class:`~mxkit.nn._moe_grad.ExpertsGrad` (the same forward, a per-expert float32 backward); under expert
        parallelism through the reference backend."""
        grad = needs_grad(x, logits, self.gate_up_bias, self.down_bias)
        if grad and self.ep_ranges is None:
            if not torch.compiler.is_compiling() and (_functorch_wrapped(x) or _functorch_wrapped(logits)):
                # (the router's parameters transformed)
                raise NotImplementedError(_NO_FUNC)
            weights, ids = routed or route(logits.reshape(-1, self.num_experts), self.top_k, mode=self.routing)
            return ExpertsGrad.apply(x, weights, self.gate_up_bias, self.down_bias, ids, logits.detach(), self)
        if not grad:
            y = self._forward_packed(x, logits, routed)
            if y is None:
                y = self._forward_folded(x, logits)
            if y is not None:
                return y
        args = (x, self.gate_up_mx, self.gate_up_bias, self.down_mx, self.down_bias, logits, self.top_k)
        kw = dict(routing=self.routing, activation=self.activation, backend="reference" if grad else self.backend)
        if self.act_format is not None:
            if self.ep_ranges is not None or self.expert_range != (0, self.num_experts):
                raise NotImplementedError(f"act_format={self.act_format!r} with expert parallelism")
            op = moe_w4a8 if self.act_format == FP8_ROWWISE else moe_mxfp4
            y = op(*args, folded=None if grad else self._folded_experts(x), **kw)
        elif self.ep_ranges is not None:
            y = ep_moe(*args, ranges=self.ep_ranges, group=self.ep_group, **kw)
        else:
            partial = self.expert_range != (0, self.num_experts)
            y = moe(*args, expert_range=self.expert_range if partial else None,
                    packed=None if grad else self._packed_experts(x), **kw)
        return y

    def _result(self, y: torch.Tensor, logits: torch.Tensor, routed: Optional[tuple] = None):
        if not self.return_router_scores:
            return y
        scores, _ = routed or route(logits.reshape(-1, self.num_experts), self.top_k, mode=self.routing)
        return y, scores.to(logits.dtype)

    def _forward_packed(self, x: torch.Tensor, logits: torch.Tensor,
                        routed: Optional[tuple] = None) -> Optional[torch.Tensor]:
        """The W4A16 forward on the experts packed in place (:func:`mxkit.kernels.moe.moe_packed`, no MXTensor
        unpacked; routed by ``routed`` where given), or None where it does not run (then forward reads
        ``gate_up_mx`` / ``down_mx``)."""
        if self.act_format is not None or self.ep_ranges is not None or self.weight_format.name != "mxfp4_e2m1":
            return None  # (the in-place "mma" layout is MXFP4's)
        packed = self._packed_experts(x)
        if self.expert_layout != "mma" or packed is None:
            return None
        from ..kernels.moe import moe_packed
        from ..moe import route_tokens

        if routed is None:
            x2, weights, ids = route_tokens(x, logits, self.top_k, self.routing)
        else:
            x2, (weights, ids) = x.reshape(-1, x.shape[-1]), routed
        partial = self.expert_range != (0, self.num_experts)
        y = moe_packed(x2, packed, self.gate_up_bias, self.down_bias, weights, ids, activation=self.activation,
                       expert_range=self.expert_range if partial else None, num_experts=self.num_experts)
        return None if y is None else y.reshape(x.shape)

    def _forward_folded(self, x: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """The W4A8 or MXFP4 x MXFP4 forward on the experts folded in place (:func:`mxkit.moe.moe_w4a8` /
        :func:`mxkit.moe.moe_mxfp4` without unfolding them to MXTensors), or None where it does not run."""
        if self.act_format is None or self.ep_ranges is not None or self.expert_range != (0, self.num_experts):
            return None
        folded = self._folded_experts(x)
        if self.expert_layout != "fold" or folded is None:
            return None
        from ..moe import moe_mxfp4_folded, moe_w4a8_folded

        op = moe_w4a8_folded if self.act_format == FP8_ROWWISE else moe_mxfp4_folded
        return op(x, folded, self.gate_up_bias, self.down_bias, logits, self.top_k, routing=self.routing,
                  activation=self.activation)

    def _per_buffers(self, slot: str, make, make_down=None) -> tuple:
        """``make(gate_up, interleave_halves=...)``, ``(make_down or make)(down)``: a pair kept in ``slot`` and
        made again only when an expert buffer is another tensor or its storage or version changed, or the
        activation (the layouts interleave gate / up for it) was set to another."""
        bufs = (self.gate_up_qdata, self.gate_up_scale, self.down_qdata, self.down_scale)
        kept = getattr(self, slot)
        _mark_captured(self)  # (a forward's: the copies' addresses go into a graph being captured)
        if kept is None or not kept[0].matches(bufs, self.activation):
            if kept is not None and kept[0].holds(bufs) and kept[0].state[1] == (self.activation,) \
                    and any(p is not None for p in kept[1]):  # (written in place since: new copies, new addresses)
                _warn_new_copies(self)
            gate_up = make(self.gate_up_mx, interleave_halves=self.activation == "swiglu")
            kept = (TensorsKey(bufs, self.activation), (gate_up, (make_down or make)(self.down_mx)))
            setattr(self, slot, kept)
        return kept[1]

    def _folded_experts(self, x: torch.Tensor) -> Optional[tuple]:
        """The experts folded for W4A8 / MXFP4 x MXFP4 on CUDA: the buffers themselves after :meth:`pack_` (done
        here on the first call unless ``keep_source``), else a copy made on the first call and made again when an
        expert buffer changes. None elsewhere (the reference runs)."""
        if not x.is_cuda or self.weight_format.bits not in (4, 6) or self.backend == "reference":
            return None
        from ..kernels.moe import FoldedExperts, fold_experts

        if not self.keep_source:
            self.pack_()
        if self.expert_layout == "fold":
            _mark_captured(self)
            # (.float(): a module.to(dtype) casts the row scales, powers of two exact in any float dtype)
            return tuple(FoldedExperts(getattr(self, f"{n}_qdata").view(torch.float8_e4m3fn),
                                       getattr(self, f"{n}_row_scale").float(), self._interleaved(n))
                         for n in _EXPERTS)
        return self._per_buffers("_folded", fold_experts)

    def _packed_experts(self, x: torch.Tensor) -> Optional[tuple]:
        """MXFP4 experts in the tensor-core decode kernel's layout (:func:`mxkit.kernels.moe.pack_experts_mma`),
        which both the decode path (up to ``mma_max_pairs`` (token, slot) pairs) and the grouped wgmma prefill path
        (above, Hopper) read: the buffers themselves after :meth:`pack_` (done here on the first call unless
        ``keep_source``), else a copy made on the first call and made again when an expert buffer changes.
        Shapes that layout does not take (K % 64) get the prefill kernel's own layout
        (:func:`mxkit.kernels.moe.pack_experts_wgmma`) above ``mma_max_pairs``
        (:func:`mxkit.kernels.moe.mma_max_pairs`: the dispatch table's, per GPU). MXFP8 experts: that layout above
        it on Hopper (a second copy of the experts, made on the first prefill call), None below (the buffers are read
        as they are: by the W8A16 tensor-core kernels up to :data:`mxkit.kernels.moe.W16_MMA_MAX_PER_EXPERT` pairs an
        expert, else the grouped Triton kernel). None off CUDA, for other formats or the reference backend."""
        fmt = self.weight_format.name
        if not x.is_cuda or fmt not in ("mxfp4_e2m1", "mxfp8_e4m3", "mxfp8_e5m2") or self.backend == "reference":
            return None
        from ..kernels.matmul_details._w4a16_wgmma import available
        from ..kernels.moe import MmaExperts, mma_max_pairs, pack_experts_mma, pack_experts_wgmma

        # (whether the prefill kernel's own layout is needed: the envelope without its per-expert part, which holds
        # only where the experts are in the decode kernel's layout, MmaExperts, returned whatever the count below)
        prefill = x.numel() // self.hidden_size * self.top_k > mma_max_pairs(x.device) and available(x.device) is None
        act = self.activation
        if fmt != "mxfp4_e2m1":
            if not prefill:
                return None
            packed = self._per_buffers("_packed_wgmma", lambda w, **_: pack_experts_wgmma(w, act_pairs=act),
                                       pack_experts_wgmma)
            return packed if all(p is not None for p in packed) else None

        if not self.keep_source and available(x.device) is None:  # (elsewhere the prefill reads the MXTensors)
            self.pack_()
        if self.expert_layout == "mma":
            bufs = (self.gate_up_qdata, self.gate_up_scale, self.down_qdata, self.down_scale)
            key = self.__dict__.get("_flags_key")
            if (key is None or not key.matches(bufs)) and not (
                    x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                # (packed buffers written or replaced since the flags were read: read again, one host sync)
                from ..kernels.moe_details._decode import packed_flags

                flags = tuple(packed_flags(s, self.weight_format) for s in bufs[1::2])
                _warn_recapture(self, flags)
                self._mma_flags = flags
                self.__dict__["_flags_key"] = TensorsKey(bufs)
            if self._packed is None or not self._packed[0].matches(bufs, self._mma_flags):
                shapes = self._expert_shapes(self.num_local_experts)
                self._packed = (TensorsKey(bufs, self._mma_flags), tuple(
                    MmaExperts(q, sc, shape, flags[0], self._interleaved(name), flags[1], flags[2])
                    for name, q, sc, shape, flags in zip(_EXPERTS, bufs[0::2], bufs[1::2], shapes, self._mma_flags)))
            _mark_captured(self)
            return self._packed[1]
        packed = self._per_buffers("_packed", pack_experts_mma)
        if all(p is not None for p in packed):
            return packed
        if not prefill:
            return None
        return self._per_buffers("_packed_wgmma", lambda w, **_: pack_experts_wgmma(w, act_pairs=act),
                                 pack_experts_wgmma)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, expert_range={self.expert_range}, "
                f"weight_format={self.weight_format.name}, routing={self.routing}, activation={self.activation}, "
                f"bias={self.gate_up_bias is not None}, expert_layout={self.expert_layout}"
                + (f", act_format={self.act_format}" if self.act_format else ""))


@torch.compiler.disable
def _eager_experts(module: MXMoE, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``module._experts(x, logits)`` outside torch.compile's graph (a graph break: expert parallelism under
    autograd, whose exchanges read the pair counts on the host)."""
    return module._experts(x, logits)


def _expert_dims(router, gate_up, b_gate_up, down, b_down, names: tuple[str, str]) -> tuple[int, int, int]:
    """(E, H, I) of experts gate_up (E, 2I, H) and down (E, H, I) (tensors or MXTensors, named ``names`` in the
    errors) behind ``router`` nn.Linear(H, E), with both biases (E, 2I) / (E, H) or neither; raises TypeError /
    ValueError naming what does not fit."""
    if not isinstance(router, nn.Linear):
        raise TypeError(f"router must be an nn.Linear(H, E), got {type(router).__name__}")
    E, H = router.out_features, router.in_features
    gs, ds = tuple(gate_up.shape), tuple(down.shape)
    if len(gs) != 3 or gs[0] != E or gs[2] != H or gs[1] % 2:
        raise ValueError(f"{names[0]} has shape {gs}, expected (E, 2I, H) with E={E}, H={H}")
    I = gs[1] // 2  # noqa: E741
    if ds != (E, H, I):
        raise ValueError(f"{names[1]} has shape {ds}, expected (E, H, I) = {(E, H, I)}")
    if (b_gate_up is None) != (b_down is None):
        raise ValueError("pass both expert biases (b_gate_up, b_down) or neither")
    for name, b in (("b_gate_up", b_gate_up), ("b_down", b_down)):
        if b is not None and not isinstance(b, torch.Tensor):
            raise TypeError(f"{name} must be a tensor or None, got {type(b).__name__}")
        if b is not None and not b.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {b.dtype}")
    for name, b, shape in (("b_gate_up", b_gate_up, (E, 2 * I)), ("b_down", b_down, (E, H))):
        if b is not None and tuple(b.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(b.shape)}, expected {shape}")
    return E, H, I


def __getattr__(name: str):
    """The GPT-OSS conversion's names, where they were before :mod:`mxkit.nn.gpt_oss` (a model pickled then names
    ``mxkit.nn.moe.GptOssRouterLogits``)."""
    if name in ("GptOssRouterLogits", "swap_gpt_oss_moe", "load_gpt_oss_model"):
        from . import gpt_oss

        return getattr(gpt_oss, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
