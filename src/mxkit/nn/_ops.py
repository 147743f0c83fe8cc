"""How ``torch.compile`` reaches mxkit's CUDA modules: each :class:`~mxkit.nn.MXLinear`,
:class:`~mxkit.nn.FusedMXLinear`, :class:`~mxkit.nn.MXGatedMLP` and :class:`~mxkit.nn.MXMoE` is one opaque custom op
(``mxkit::mx_linear``, ``mxkit::mx_fused``, ``mxkit::mx_gated_act``, ``mxkit::mx_moe``...) whose kernel runs the
module's eager forward (the kernels launch through the driver API, which dynamo does not trace). The op is given
one of the module's buffers, its key (:func:`own_key`: the weight codes), and finds the module by it
(:func:`module_of_key`). A buffer is a graph input, so repeated blocks compiled one by one share one compiled graph
and Inductor's on-disk caches hit across processes. A program holding these ops runs only in the process that
traced it, on the modules' own buffers: ``torch.export`` takes other ops, given the weights (an MXLinear without
activation quantization, a fused group and a gated MLP: ``mxkit::mx_matmul``; an MXLinear with it,
``mxkit::mx_linear_export``; an MXMoE, ``mxkit::mx_moe_export``; only an expert-parallel MXMoE exports these ops,
and runs only where it was exported).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence, TypeVar

import torch
from torch import nn

from .._cache import TensorsKey

class HoldsGroup:
    """Mixin of the modules that keep a ``torch.distributed`` process group in attribute ``group_attr`` (tensor-
    and expert-parallel layers): a deep copy shares the group (a ProcessGroup does not copy); pickling stores the
    world group as None (the default group where it is loaded) and raises TypeError for another group. Comes
    before :class:`torch.nn.Module` in the bases."""

    group_attr = "group"

    def _group_position_ok(self, rank: int, world: int) -> bool:
        """Whether this module's shard is the one of ``rank`` in a group of ``world`` (subclasses)."""
        raise NotImplementedError

    def check_group_position(self) -> None:
        """After unpickling (``torch.load`` of the module: the group is the default one of the loading process):
        ValueError, on the first forward, if this process's rank or world size in the group is not the one the
        shard was made for (another rank's file gave wrong values silently). A no-op otherwise."""
        if not self.__dict__.get("_check_position"):
            return
        import torch.distributed as dist

        group = self.__dict__.get(self.group_attr)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if not self._group_position_ok(rank, world):
            raise ValueError(f"this {type(self).__name__} was pickled by another rank or world size than this "
                             f"process's (rank {rank} of {world}): load each rank's own file, or its state_dict into a "
                             f"module built on this rank")
        self.__dict__["_check_position"] = False

    def __deepcopy__(self, memo: dict):
        """A deep copy (own buffers) sharing the process group."""
        import copy

        group = self.__dict__.get(self.group_attr)
        if group is not None:
            memo[id(group)] = group
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self._copy_state(), memo))
        return new

    def _copy_state(self) -> dict:
        """The state a deep copy or a pickle starts from: the module's, less what subclasses drop (caches)."""
        return super().__getstate__()

    def __getstate__(self) -> dict:
        state = self._copy_state()
        group = state.get(self.group_attr)
        if group is not None:
            import torch.distributed as dist

            if group is not dist.group.WORLD:
                raise TypeError(f"a {type(self).__name__} with a custom process group cannot be pickled (a "
                                f"ProcessGroup does not pickle): save its state_dict() instead and load it into a "
                                f"module built with that group")
            state = dict(state, **{self.group_attr: None})
        # (checked against the loading process on the first forward; a failed check of this process is not carried)
        return dict(state, _check_position=True, _position_error=None)


_T = TypeVar("_T")
_REBUILT_LOCK = threading.Lock()


def rebuilt(cache: dict, tensors: Sequence[torch.Tensor], spec: str, build: Callable[[], _T]) -> _T:
    """What an exported module's op rebuilds around the program's ``tensors`` (``build()``: a layer holding detached
    aliases of them, new tensor objects that keep the storage but not the tensors), kept in ``cache`` under
    ``id(tensors[0])`` while they are the same tensors with the same contents and ``spec``
    (:class:`~mxkit._cache.TensorsKey`), so its packed copies are made once; the entry goes when ``tensors[0]``
    does (a deleted program frees its weights)."""
    with _REBUILT_LOCK:
        kept = cache.get(id(tensors[0]))
        if kept is not None and kept[0].matches(tensors, spec):
            return kept[1]
        value = build()
        if kept is None:
            weakref.finalize(tensors[0], cache.pop, id(tensors[0]), None)
        cache[id(tensors[0])] = (TensorsKey(tensors, spec), value)
        return value


def spec_fields(spec: str) -> dict[str, str]:
    """The ``key=value`` fields, joined by ``;``, of the settings text an exported module's op carries
    (:func:`mxkit.nn._linear_export.export_spec`, :func:`mxkit.nn._moe_export.export_spec`)."""
    return dict(field.split("=", 1) for field in spec.split(";"))


_OWNERS: "dict[tuple[int, str], tuple[weakref.ref[torch.Tensor], weakref.ref[nn.Module]]]" = {}


def _drop_owner(key: tuple[int, str]) -> None:
    entry = _OWNERS.get(key)
    if entry is not None and entry[0]() is None:  # (not a later tensor that took the freed one's id)
        del _OWNERS[key]


def own_key(module: nn.Module, key: torch.Tensor, role: str) -> bool:
    """Record ``key``, a buffer of ``module`` (or of a layer it holds), as the tensor by which ``module``'s ops of
    ``role`` find it under torch.compile (:func:`module_of_key`). The buffer is a graph input, not a constant, so
    the blocks of a model compiled one by one share one compiled graph (a handle int was a constant of each
    graph: one compile per module, and past dynamo's recompile limit an error under ``fullgraph=True``). Returns
    False, recording nothing, where another live module that still holds ``key`` owns it (two modules sharing one
    tensor: ``load_state_dict(assign=True)`` of one state_dict, ``copy.copy``): the caller then takes the route
    whose op is given the weight's tensors."""
    k = (id(key), role)
    entry = _OWNERS.get(k)
    if entry is not None and entry[0]() is key:
        owner = entry[1]()
        if owner is not None and owner is not module and any(b is key for b in owner.buffers()):
            return False
    else:
        weakref.finalize(key, _drop_owner, k)
    _OWNERS[k] = (weakref.ref(key), weakref.ref(module))
    return True


def module_of_key(key: torch.Tensor, role: str, op: str) -> nn.Module:
    """The module that recorded ``key`` for ``role`` (:func:`own_key`); RuntimeError (naming the op) when none did
    or it no longer exists: a program holding the op run in another process (torch.export), or a buffer replaced
    after the graph was traced."""
    entry = _OWNERS.get((id(key), role))
    m = entry[1]() if entry is not None and entry[0]() is key else None
    if m is None:
        raise RuntimeError(f"mxkit::{op}: its weight tensor is not the buffer of a live mxkit module in this "
                           f"process (a program with this op runs only in the process that traced it, on the "
                           f"modules' own buffers)")
    return m
