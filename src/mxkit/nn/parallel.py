"""Tensor-parallel :class:`~mxkit.nn.MXLinear` over ``torch.distributed`` (Megatron-LM's ColumnParallelLinear /
RowParallelLinear), the weight kept in its MX bytes on every rank.

The weight W (N, K) = (out_features, in_features) is quantized along K (``weight_qdata`` (N, K·pack_bytes/pack),
``weight_scale`` (N, K/block_size), :mod:`mxkit.nn.linear`). With W ranks in ``group`` and rank r:

* **Column-parallel** (:class:`ColumnParallelMXLinear`): rank r keeps output rows [r·N/W, (r+1)·N/W) — their
  element bytes, their scales and their bias entries — and computes ``y_r = x @ W_r.T + b_r`` (..., N/W) from the
  whole input. ``gather_output=True`` all-gathers the shards along the last dim (rank order) into (..., N) on
  every rank; ``False`` returns this rank's (..., N/W), the input a row-parallel layer expects with
  ``input_is_parallel=True`` (Megatron's MLP: column then row, one all-reduce).
  Every output element is computed by one rank from the same operands as in the unsharded layer, so the gathered
  output equals the shards computed one by one, byte for byte, and the unsharded layer within the GEMM bound
  (issue #22; bitwise where the GEMM computes an element the same way whatever N is, as CPU BLAS does in practice).
* **Row-parallel** (:class:`RowParallelMXLinear`): rank r keeps K columns [r·K/W, (r+1)·K/W) of every row. The
  split runs on ``block_size`` boundaries, so each rank holds whole MX blocks and exactly their scales, and whole
  bytes: a block of 32 elements is 16 bytes in FP4 (two codes per byte), 24 in FP6 (four codes per 3 bytes) and 32
  in FP8, so K/W = 32·b elements are 16·b, 24·b or 32·b bytes. The input is either split along K by the caller
  (``input_is_parallel=True``: x (..., K/W), Megatron's convention) or by the layer (x (..., K), this rank's
  slice taken). Each rank computes its partial product ``x_r @ W_r.T`` in float32 without bias, the partials are
  summed by one ``all_reduce`` (float32), the bias — replicated, the whole (N,) on every rank — is added once
  after the reduce, and the sum is rounded once to x's dtype. The result differs from the unsharded layer only
  by the order of the float32 additions, inside the same bound. Megatron reduces in the output dtype (half the
  traffic, W − 1 more roundings); float32 keeps the one output rounding of :func:`mxkit.matmul`.
  With ``act_format`` set the input slice is quantized on each rank: its blocks are the full input's blocks, so
  the operand bytes are those of the unsharded layer. ``act_format="fp8_e4m3_rowwise"`` is refused: its scale is
  the amax of the whole row, which no rank sees.

Every rank of the group calls forward with inputs of the same shape and dtype (the collectives' contract, as in
Megatron), and under autograd all or none of them need a gradient. That is not checked, since it would take one
more collective a call: a mismatch surfaces as the collective's own error, a wait until the group's timeout, or
(an all_gather of other row counts) wrong rows. ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` has torch check each collective's
shapes across ranks. A module unpickled by another rank than the one that saved it raises ValueError on its first
forward.

Sizes that do not split raise ValueError at construction, before any communication: N % W != 0 (column) and
K % (W·block_size) != 0 (row; uneven splits are not supported, as in Megatron — pad the layer instead).

Why plain collectives and not DTensor: an :class:`~mxkit.MXTensor` is a frozen dataclass of two uint8 tensors, not a
``torch.Tensor`` subclass, so DTensor's placements cannot describe its packed bytes (a ``Shard(1)`` of
``weight_qdata`` counts bytes, not elements, and knows nothing of the scale beside it), and DTensor's matmul would
dequantize. The shards here are sliced on block boundaries by hand and the collectives move only float
activations: ``all_gather`` (column) and ``all_reduce`` (row) from ``torch.distributed``, which run on gloo (CPU,
the tests) and NCCL alike and leave the weight bytes exact.

Gradients follow Megatron's mappings (``copy_to`` / ``reduce_from`` / ``gather_from`` / ``scatter_to`` the
tensor-parallel region), so ``x.grad`` and the bias gradient equal the unsharded layer's within float32
reassociation; the weight stays frozen as in :class:`MXLinear`. Without autograd the collectives run in place,
with no autograd node. Forward mode and ``torch.func`` (``jvp``, ``grad``, ``vmap``) work as on :class:`MXLinear`:
each collective is linear, so a tangent takes the same collective, and under ``vmap`` the collective runs on the
whole batch (every rank must use the same transforms, as the collectives' contract asks of any call).

A shard is an :class:`MXLinear` of the local sizes (``in_features`` / ``out_features`` are this rank's; the full
layer's are ``global_in_features`` / ``global_out_features``): its ``state_dict`` holds ``weight_qdata`` /
``weight_scale`` of the shard alone (fresh tensors, not views of the full layer's storage) and the bias (the
shard's entries, column; the whole bias, row). Load it into a module built for the same rank and world size: a
state_dict that carries its metadata (``torch.save`` of it) from another rank, world size, style or full layer
raises ValueError.
``copy.deepcopy`` gives a shard of its own buffers (its compiled op's key) that shares the process group; a shard
pickles (``torch.save`` of the module) when its group is the default (None or the world group, stored as None: the
default group of the process that loads it); one with another group raises TypeError (a process group does not pickle):
save its ``state_dict`` instead.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from .._device import exporting
from ..distributed import _header_device, group_position
from ..formats import BLOCK_SIZE, FormatLike, Rounding, ScaleMode, check_bools, get_format
from ..fold import can_fold
from ..ops import _functorch_wrapped, matmul, needs_grad, quantize, quantize_fold, with_input_grad
from ..tensor import SUPPORTED_INPUT_DTYPES, as_int
from . import _ops
from .linear import FP8_ROWWISE, MXLinear, _check_block_size, copied_dense_cache

__all__ = ["ColumnParallelMXLinear", "RowParallelMXLinear", "shard_mxlinear", "STYLES"]

STYLES = ("column", "row")


# --------------------------------------------------------------------------------------------------------
# collectives along the last dim, with Megatron's backward (identity <-> all_reduce, gather <-> split)


def _all_gather_last(t: torch.Tensor, group, world: int) -> torch.Tensor:
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)
    return torch.cat(parts, dim=-1)


# Each backward is its dual Function (Megatron's pairing: copy <-> reduce, scatter <-> gather), so a second-order
# gradient (create_graph=True) crosses the collectives it must. Each is linear: its forward-mode tangent is the same
# collective applied to the tangent (jvp), and under vmap the
# collective runs on the whole batch, the batch dim moved off the last one where it narrows or gathers along it
# (torch.func: setup_context style). Those rules live in a subclass (``...Func``) that eager calls take: dynamo
# refuses a Function with a custom jvp ("Unsupported custom jvp"), so compiled calls take the base class.


def _tp(fn):
    """The Function ``fn`` or its torch.func subclass: the base one while dynamo traces (torch.compile, export)."""
    return fn if torch.compiler.is_compiling() else _FUNC[fn]


def _batch_first(x: torch.Tensor, bdim: Optional[int]) -> tuple[torch.Tensor, Optional[int]]:
    return (x, None) if bdim is None else (x.movedim(bdim, 0), 0)


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; the gradient is all-reduced (each rank saw a part of the output)."""

    @staticmethod
    def forward(x, group):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.group = inputs[1]

    @staticmethod
    def backward(ctx, g):
        # (its dual Function, Megatron's pairing: differentiable again under create_graph, where an all_reduce in
        # place was no autograd op)
        return _tp(_ReduceFromGroup).apply(g, ctx.group), None


class _CopyToGroupFunc(_CopyToGroup):
    """_CopyToGroup with its forward-mode tangent and vmap rule (torch.func; :func:`_tp`)."""

    @staticmethod
    def jvp(ctx, x_t, _):
        return x_t.view_as(x_t)

    @staticmethod
    def vmap(info, in_dims, x, group):
        return _CopyToGroupFunc.apply(x, group), in_dims[0]


class _ReduceFromGroup(torch.autograd.Function):
    """all_reduce (sum) forward; identity backward (the output is replicated)."""

    @staticmethod
    def forward(y, group):
        y = y.contiguous().clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.group = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return _tp(_CopyToGroup).apply(g, ctx.group), None  # (identity; its dual sums a second-order gradient)


class _ReduceFromGroupFunc(_ReduceFromGroup):
    """_ReduceFromGroup with its forward-mode tangent and vmap rule (torch.func; :func:`_tp`)."""

    @staticmethod
    def jvp(ctx, y_t, _):
        y_t = y_t.contiguous().clone()
        dist.all_reduce(y_t, group=ctx.group)
        return y_t

    @staticmethod
    def vmap(info, in_dims, y, group):
        return _ReduceFromGroupFunc.apply(y, group), in_dims[0]


class _GatherFromGroup(torch.autograd.Function):
    """all_gather along the last dim forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(y, group, rank, world):
        return _all_gather_last(y, group, world)

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, ctx.group, ctx.rank, ctx.world = inputs
        ctx.width = y.shape[-1]

    @staticmethod
    def backward(ctx, g):
        return _tp(_ScatterToGroup).apply(g, ctx.group, ctx.rank, ctx.world), None, None, None  # (its dual)


class _GatherFromGroupFunc(_GatherFromGroup):
    """_GatherFromGroup with its forward-mode tangent and vmap rule (torch.func; :func:`_tp`)."""

    @staticmethod
    def jvp(ctx, y_t, *_):
        return _all_gather_last(y_t, ctx.group, ctx.world)

    @staticmethod
    def vmap(info, in_dims, y, group, rank, world):
        y, bdim = _batch_first(y, in_dims[0])
        return _GatherFromGroupFunc.apply(y, group, rank, world), bdim


class _ScatterToGroup(torch.autograd.Function):
    """This rank's slice of the last dim forward; the gradient slices all-gathered backward."""

    @staticmethod
    def forward(x, group, rank, world):
        width = x.shape[-1] // world
        return x.narrow(-1, rank * width, width).contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ctx.group, ctx.rank, ctx.world = inputs
        ctx.width = x.shape[-1] // ctx.world

    @staticmethod
    def backward(ctx, g):
        # (its dual, as _CopyToGroup's: a second-order gradient through x's was cut by the plain all_gather)
        return _tp(_GatherFromGroup).apply(g, ctx.group, ctx.rank, ctx.world), None, None, None


class _ScatterToGroupFunc(_ScatterToGroup):
    """_ScatterToGroup with its forward-mode tangent and vmap rule (torch.func; :func:`_tp`)."""

    @staticmethod
    def jvp(ctx, x_t, *_):
        return x_t.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous()

    @staticmethod
    def vmap(info, in_dims, x, group, rank, world):
        x, bdim = _batch_first(x, in_dims[0])
        return _ScatterToGroupFunc.apply(x, group, rank, world), bdim


_FUNC = {_CopyToGroup: _CopyToGroupFunc, _ReduceFromGroup: _ReduceFromGroupFunc,
         _GatherFromGroup: _GatherFromGroupFunc, _ScatterToGroup: _ScatterToGroupFunc}


# --------------------------------------------------------------------------------------------------------
# the modules


class _TensorParallelMXLinear(_ops.HoldsGroup, MXLinear):
    """Shared construction of the two shard kinds; subclasses say which part of W (and b) a rank keeps."""

    style: str = ""
    group_attr = "tp_group"  # (HoldsGroup: copies share it, pickling stores the world group as None)

    def check_group_position(self) -> None:
        """HoldsGroup's check on the first forward after unpickling, with the group in step: a shard pickled by
        another rank or world size raises ValueError on its rank and, through one all_reduce of a flag, on every
        peer (they waited in the layer's collective until the group's timeout); later forwards raise again, without
        a collective. A no-op otherwise. Collective on that first forward: every rank's shard was unpickled."""
        d = self.__dict__
        if d.get("_position_error") is not None:
            raise ValueError(d["_position_error"])
        if not d.get("_check_position"):
            return
        try:
            super().check_group_position()
            mine = None
        except ValueError as e:
            mine = str(e)
        if self.tp_world_size > 1:
            flag = torch.tensor([0 if mine else 1], dtype=torch.int32, device=_header_device(self.tp_group))
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.tp_group)
            ok = bool(flag.item())
        else:
            ok = mine is None
        d["_check_position"] = False
        if not ok:
            d["_position_error"] = mine or (
                f"another rank of this {type(self).__name__}'s group holds a shard pickled by another rank or world "
                f"size: load each rank's own file, or its state_dict into a module built on that rank")
            raise ValueError(d["_position_error"])

    def __init__(self, in_features: int, out_features: int, weight_format: FormatLike, *, group=None,
                 bias: bool = True, act_format: Optional[FormatLike] = None, **kwargs) -> None:
        self._check_act(act_format)
        in_features, out_features = as_int(in_features), as_int(out_features)
        for name, v in (("in_features", in_features), ("out_features", out_features)):  # (the global sizes, before
            # any % or division: "64" failed in string formatting, a negative N that divides was named as N / W)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int for {type(self).__name__}, got {v!r}")
        world, rank = group_position(group, type(self).__name__)
        block_size, fmt = kwargs.get("block_size", BLOCK_SIZE), get_format(weight_format)
        _check_block_size(block_size, fmt, None)  # (before _local_sizes divides by it; MXLinear checks act_format's)
        k_local, n_local = self._local_sizes(in_features, out_features, world, block_size, fmt)
        super().__init__(k_local, n_local, weight_format, bias=bias, act_format=act_format, **kwargs)
        self.global_in_features, self.global_out_features = in_features, out_features
        self.tp_group, self.tp_rank, self.tp_world_size = group, rank, world
        self.register_state_dict_post_hook(_record_shard)
        self.register_load_state_dict_pre_hook(_check_shard)

    def _group_position_ok(self, rank: int, world: int) -> bool:
        return (rank, world) == (self.tp_rank, self.tp_world_size)

    # --- what a rank keeps (subclasses) ---
    @staticmethod
    def _check_act(act_format) -> None:
        pass

    def _local_sizes(self, K: int, N: int, world: int, block_size: int, fmt) -> tuple[int, int]:
        raise NotImplementedError

    def _local_weight(self, t: torch.Tensor, num: int, den: int) -> torch.Tensor:
        """This rank's part of a weight-shaped tensor (N, K·num/den): qdata (pack_bytes, pack), scale (1, block),
        dense (1, 1)."""
        raise NotImplementedError

    def _local_bias(self, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # --- constructors ---
    def _fill(self, qdata: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        self.weight_qdata.copy_(qdata)  # copies: the shard owns its bytes, not a view of the full layer's
        self.weight_scale.copy_(scale)
        if bias is not None:
            self.bias = nn.Parameter(self._local_bias(bias.detach()).clone(), requires_grad=bias.requires_grad)
        self.repack()

    @classmethod
    def from_mxlinear(cls, layer: MXLinear, *, group=None, **kwargs) -> "_TensorParallelMXLinear":
        """This rank's shard of an existing (unsharded) MXLinear: the same bytes, sliced (see the class).

        kwargs: ``gather_output`` (column) or ``input_is_parallel`` (row). Raises TypeError if ``layer`` is not an
        MXLinear or is a shard already or for another keyword, ValueError if its sizes do not split over ``group``,
        or for a column shard with ``gather_output=False`` of a :class:`~mxkit.nn.FusedMXLinear`'s stacked layer
        (its rows split as one block would give no member its own shard).
        """
        if not isinstance(layer, MXLinear) or isinstance(layer, _TensorParallelMXLinear):
            raise TypeError(f"expected an unsharded MXLinear, got {type(layer).__name__}")
        own = {"column": "gather_output", "row": "input_is_parallel"}[cls.style]
        if set(kwargs) - {own}:  # (the other style's flag: MXLinear's constructor named neither)
            raise TypeError(f"a {cls.style} shard takes {own}=, not {', '.join(sorted(set(kwargs) - {own}))}")
        splits = getattr(layer, "_mx_stacked_splits", None)
        if splits is not None and cls.style == "column" and kwargs.get("gather_output", True) is False:
            # (rank r would hold rows [r*N/w, (r+1)*N/w) of [q | k | v]: not q's, k's and v's r-th shards)
            raise ValueError(f"a column shard without gather_output of a FusedMXLinear's stacked layer (parts "
                             f"{splits}) would split the stacked rows, not each part; shard the member layers "
                             f"each, unfused, or keep gather_output=True")
        mod = cls(layer.in_features, layer.out_features, layer.weight_format, group=group,
                  bias=layer.bias is not None, act_format=layer.act_format, scale_mode=layer.scale_mode,
                  rounding=layer.rounding, block_size=layer.block_size, device=layer.weight_qdata.device,
                  dtype=None if layer.bias is None else layer.bias.dtype,
                  dense_cache=copied_dense_cache(layer), **kwargs)
        fmt = layer.weight_format
        mod._fill(mod._local_weight(layer.weight_qdata, fmt.pack_bytes, fmt.pack),
                  mod._local_weight(layer.weight_scale, 1, layer.block_size), layer.bias)
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear, weight_format: FormatLike, *, group=None,
                    act_format: Optional[FormatLike] = None, scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
                    rounding: Union[str, Rounding] = Rounding.RNE, block_size: int = BLOCK_SIZE,
                    **kwargs) -> "_TensorParallelMXLinear":
        """This rank's shard of ``MXLinear.from_linear(linear, ...)``, quantizing only this rank's part of the
        weight: MX blocks run along K and the split keeps whole blocks, so the bytes are those of the full
        quantization, sliced. Same errors as :meth:`from_mxlinear` and :meth:`MXLinear.from_linear`."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.dtype not in SUPPORTED_INPUT_DTYPES:  # (MXLinear.from_linear's check; quantize would name an "x")
            raise TypeError(f"from_linear quantizes float32 / bfloat16 / float16 weights; linear.weight is {w.dtype}")
        mod = cls(linear.in_features, linear.out_features, weight_format, group=group,
                  bias=linear.bias is not None, act_format=act_format, scale_mode=scale_mode, rounding=rounding,
                  block_size=block_size, device=w.device, dtype=w.dtype, **kwargs)
        q = quantize(mod._local_weight(w, 1, 1), mod.weight_format, axis=1, block_size=block_size,
                     scale_mode=mod.scale_mode, rounding=mod.rounding)
        mod._fill(q.qdata, q.scale, linear.bias)
        return mod

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, global_in_features={self.global_in_features}, "
                f"global_out_features={self.global_out_features}, tp_rank={self.tp_rank}, "
                f"tp_world_size={self.tp_world_size}")


class ColumnParallelMXLinear(_TensorParallelMXLinear):
    """Rank r of W holds output rows [r·N/W, (r+1)·N/W) of ``y = x @ dequant(W).T + b`` (Megatron-LM's
    ColumnParallelLinear; module docstring for the layout and numerics).

    Args: in_features K, out_features N of the full layer (N % world_size == 0); weight_format, bias, act_format,
      scale_mode, rounding, block_size, device, dtype, dense_cache as :class:`MXLinear`;
      group: the tensor-parallel process group (default: the world); the constructor reads its rank and size.
      gather_output: all-gather the shards into the full output (default), or return this rank's shard.
    Buffers: ``weight_qdata`` uint8 (N/W, K·pack_bytes/pack), ``weight_scale`` uint8 (N/W, K/block_size);
    ``bias`` (N/W,) of ``dtype``. ``out_features`` is N/W; ``global_out_features`` is N.

    forward: x (..., K) float32 | bfloat16 | float16, the same on every rank → (..., N) if ``gather_output``
    else (..., N/W), in x's dtype. Collective: every rank of the group calls it.
    Raises ValueError if N % world_size != 0 or K % block_size != 0, and in forward for an x whose last dim is
    not K; forward raises TypeError for an x that is not a float32 / bfloat16 / float16 tensor.
    """

    style = "column"

    def __init__(self, in_features: int, out_features: int, weight_format: FormatLike, *, group=None,
                 gather_output: bool = True, **kwargs) -> None:
        check_bools(dict(gather_output=gather_output))  # ("no" was taken as True: the opposite of what was asked)
        super().__init__(in_features, out_features, weight_format, group=group, **kwargs)
        self.gather_output = gather_output

    def _local_sizes(self, K, N, world, block_size, fmt):
        if N % world:
            raise ValueError(f"out_features N={N} does not split over world_size={world} ranks: a column-parallel "
                             f"MXLinear gives every rank N / world_size output rows (uneven splits are not supported)")
        return K, N // world

    def _local_weight(self, t, num, den):
        n = self.out_features
        return t[self.tp_rank * n : (self.tp_rank + 1) * n]

    def _local_bias(self, b):
        return self._local_weight(b, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_group_position()
        if needs_grad(x) and self.tp_world_size > 1:
            x = _tp(_CopyToGroup).apply(x, self.tp_group)
        y = super().forward(x)
        if not self.gather_output or self.tp_world_size == 1:
            return y
        # (vmap: the Function's batching rule; not asked while compiling, where Dynamo cannot trace the question)
        if needs_grad(y) or (not torch.compiler.is_compiling() and _functorch_wrapped(y)):
            return _tp(_GatherFromGroup).apply(y, self.tp_group, self.tp_rank, self.tp_world_size)
        return _all_gather_last(y, self.tp_group, self.tp_world_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gather_output={self.gather_output}"


class RowParallelMXLinear(_TensorParallelMXLinear):
    """Rank r of W holds K columns [r·K/W, (r+1)·K/W) — whole MX blocks with their scales — of
    ``y = x @ dequant(W).T + b``; the partial products are summed by an all_reduce (Megatron-LM's
    RowParallelLinear; module docstring for the layout and numerics).

    Args: in_features K, out_features N of the full layer (K % (world_size · block_size) == 0); weight_format,
      bias, act_format (not ``"fp8_e4m3_rowwise"``), scale_mode, rounding, block_size, device, dtype, dense_cache
      as :class:`MXLinear`; group: the tensor-parallel process group (default: the world).
      input_is_parallel: x is this rank's K slice (..., K/W), as a ColumnParallelMXLinear with
      ``gather_output=False`` returns it; else x is (..., K) and the layer takes the slice (default).
    Buffers: ``weight_qdata`` uint8 (N, K/W·pack_bytes/pack), ``weight_scale`` uint8 (N, K/W/block_size);
    ``bias`` (N,) of ``dtype``, the whole bias on every rank, added once after the reduce. ``in_features`` is K/W;
    ``global_in_features`` is K.

    forward: x (..., K) or (..., K/W) (``input_is_parallel``) float32 | bfloat16 | float16 → (..., N) in x's
    dtype, the same on every rank: float32 partials, all_reduce in float32, + bias in float32, one rounding.
    Collective: every rank of the group calls it.
    Raises ValueError if K does not split into whole blocks (K % (world_size · block_size) != 0), for
    ``act_format="fp8_e4m3_rowwise"``, and in forward for an x whose last dim is not the expected K or K/W or that
    is on another device than the weight; forward raises TypeError for an x that is not a float32 / bfloat16 /
    float16 tensor; NotImplementedError under ``torch.export`` with an act_format (weight-only shards export).
    """

    style = "row"

    def __init__(self, in_features: int, out_features: int, weight_format: FormatLike, *, group=None,
                 input_is_parallel: bool = False, **kwargs) -> None:
        check_bools(dict(input_is_parallel=input_is_parallel))  # ("no" was taken as True)
        super().__init__(in_features, out_features, weight_format, group=group, **kwargs)
        self.input_is_parallel = input_is_parallel

    @staticmethod
    def _check_act(act_format) -> None:
        if isinstance(act_format, str) and act_format.lower() == FP8_ROWWISE:
            raise ValueError(f"act_format={FP8_ROWWISE!r} scales each row by its amax over all of K, which no rank "
                             f"of a row-parallel layer sees; use an MX act_format (scales per block of K)")

    def _local_sizes(self, K, N, world, block_size, fmt):
        if block_size % fmt.pack:
            raise ValueError(f"{block_size=} must be a multiple of {fmt.pack} for {fmt.name} (packing)")
        if K % (world * block_size):
            raise ValueError(f"in_features K={K} does not split into whole MX blocks over world_size={world} ranks "
                             f"(block_size={block_size}): K must be a multiple of world_size * block_size = "
                             f"{world * block_size}")
        return K // world, N

    def _local_weight(self, t, num, den):
        k = self.in_features  # a multiple of block_size, itself a multiple of pack: lo and hi are whole bytes
        lo, hi = self.tp_rank * k * num, (self.tp_rank + 1) * k * num
        assert lo % den == 0 and hi % den == 0, (lo, hi, den)
        return t[:, lo // den : hi // den]

    def _local_bias(self, b):
        return b

    def _operand(self, x: torch.Tensor):
        """The ``a`` operand of this rank's GEMM: x, or x quantized along K (its blocks are the full input's); an
        empty batch as it is (nothing to quantize: the float GEMM of no rows)."""
        act = self.act_format
        if act is None or x.numel() == 0:
            return x
        kw = dict(block_size=self.block_size, scale_mode=self.scale_mode, rounding=self.rounding)
        if x.is_cuda and self.block_size == BLOCK_SIZE and can_fold(act) and can_fold(self.weight_format):
            return quantize_fold(x, act, defer=True, **kw)  # the fold-fp8 path, as MXLinear takes it
        return quantize(x, act, axis=-1, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_group_position()
        expect = self.in_features if self.input_is_parallel else self.global_in_features
        name = type(self).__name__  # (MXLinear's wording: its forward rewords matmul's errors about a and b)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} takes a float tensor (..., {expect}), got {type(x).__name__}")
        if x.dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(f"{name} takes float32 / bfloat16 / float16 x, got {x.dtype}")
        if x.device != self.weight_qdata.device:
            raise ValueError(f"{name}'s weight is on {self.weight_qdata.device} but x on {x.device}: move one to the "
                             f"other's device")
        if x.dim() == 0 or x.shape[-1] != expect:
            what = "this rank's K slice (input_is_parallel=True)" if self.input_is_parallel else "the full K"
            raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., {expect}), {what}")
        if self.act_format is not None and exporting():
            raise NotImplementedError(
                "torch.export of a RowParallelMXLinear with act_format is not supported (its quantized operand has "
                "no export op yet); export the unsharded MXLinear, or a layer without act_format")
        out_dtype = x.dtype
        if not self.input_is_parallel and self.tp_world_size > 1:
            if needs_grad(x):
                x = _tp(_ScatterToGroup).apply(x, self.tp_group, self.tp_rank, self.tp_world_size)
            else:
                x = x.narrow(-1, self.tp_rank * self.in_features, self.in_features).contiguous()
        packed = self._live_packed()
        w = packed if packed is not None else self.weight_mx
        if self.act_format is not None and x.numel() and needs_grad(x):
            # the quantized operand is not x: x's gradient by the dequantized weight, the quantization passed
            # straight through (MXLinear's rule), the forward's bits unchanged
            y = with_input_grad(x, None, w, lambda x_, _: matmul(self._operand(x_), w, out_dtype=torch.float32))
        else:
            y = matmul(self._operand(x), w, out_dtype=torch.float32)  # partial sum over this rank's K, no bias
        if self.tp_world_size > 1:
            # (vmap: the Function's batching rule; not asked while compiling, where Dynamo cannot trace it)
            if needs_grad(y) or (not torch.compiler.is_compiling() and _functorch_wrapped(y)):
                y = _tp(_ReduceFromGroup).apply(y, self.tp_group)
            else:
                dist.all_reduce(y, group=self.tp_group)
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(out_dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, input_is_parallel={self.input_is_parallel}"


_CLASSES = {"column": ColumnParallelMXLinear, "row": RowParallelMXLinear}


def _shard_position(module: _TensorParallelMXLinear) -> list:
    return [module.style, module.tp_rank, module.tp_world_size, module.global_out_features,
            module.global_in_features]


@torch.compiler.disable
def _record_shard(module: _TensorParallelMXLinear, state_dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: which shard the bytes are (style, rank, world size, the full layer's N x K), for
    :func:`_check_shard` (like :func:`~mxkit.nn.linear.record_format`'s element format)."""
    local_metadata["mx_shard"] = _shard_position(module)


def _check_shard(module: _TensorParallelMXLinear, state_dict, prefix: str, local_metadata: dict, *args) -> None:
    """load_state_dict pre-hook: a shard saved by another rank, world size, style or full layer raises ValueError
    before anything is copied (every rank's shard has the same shapes, so another rank's bytes loaded silently and
    gave wrong values). A state_dict without the metadata (safetensors, a plain dict) is not checked."""
    saved, mine = local_metadata.get("mx_shard"), _shard_position(module)
    if saved is not None and list(saved) != mine:
        what = lambda p: f"the {p[0]} shard of rank {p[1]} of {p[2]} of a {p[3]} x {p[4]} layer"  # noqa: E731
        raise ValueError(f"{prefix[:-1] or type(module).__name__}: the state_dict holds {what(saved)}; this module is "
                         f"{what(mine)}: load each rank's own state_dict")


def shard_mxlinear(layer: MXLinear, style: str, group=None, **kwargs) -> _TensorParallelMXLinear:
    """This rank's shard of ``layer`` for tensor parallelism over ``group`` (default: the world).

    style: ``"column"`` (split N, :class:`ColumnParallelMXLinear`; kwargs ``gather_output=True``) or ``"row"``
      (split K on block boundaries, :class:`RowParallelMXLinear`; kwargs ``input_is_parallel=False``).
    The shard holds copies of this rank's bytes (``layer`` is left as it is) on ``layer``'s device.
    Raises ValueError for another style or sizes that do not split (module docstring), TypeError if ``layer`` is
    not an unsharded MXLinear or for the other style's keyword. To build a shard from an ``nn.Linear`` without
    quantizing the whole weight, use ``ColumnParallelMXLinear.from_linear`` / ``RowParallelMXLinear.from_linear``.
    """
    if not isinstance(style, str) or style not in _CLASSES:  # (a list: not "unhashable type")
        raise ValueError(f"unknown tensor-parallel style {style!r}; expected one of {', '.join(STYLES)}")
    return _CLASSES[style].from_mxlinear(layer, group=group, **kwargs)
