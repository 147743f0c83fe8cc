"""How ``torch.compile`` reaches mxkit's CUDA modules: each :class:`~mxkit.nn.MXLinear`,
:class:`~mxkit.nn.FusedMXLinear` and :class:`~mxkit.nn.MXMoE` gets a process-local integer handle at construction
(and a new one when deep-copied or unpickled), and its custom op (``mxkit::mx_linear``, ``mxkit::mx_fused``,
``mxkit::mx_moe``) finds the module by that handle and runs its eager forward:
the kernels launch through the driver API, which dynamo does not trace, so to a compiled graph each module is
one opaque op whose weights are not graph inputs. The handle is a plain int attribute, a constant in the graph
(:func:`graph_handle`); under ``torch.export`` it is tagged with the process (:mod:`mxkit._handles`), so a program
of these ops saved and loaded in another process raises there (an MXLinear without activation quantization, a
fused group and a gated MLP export their weights instead: ``mxkit::mx_matmul``; an MXLinear with it,
``mxkit::mx_linear_export``; an MXMoE its expert buffers, ``mxkit::mx_moe_export``: only an expert-parallel MXMoE
exports its handle).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence, TypeVar

import torch
from torch import nn

from .._cache import TensorsKey
from .._device import exporting
from .._handles import for_export, new_handle, untag
from ..ops import refuse_forward_ad

_MODULES: "dict[int, weakref.ref[nn.Module]]" = {}  # weak: a module that is gone drops out


def register(module: nn.Module) -> None:
    """Give ``module`` a new handle (``module._op_handle``)."""
    h = new_handle()
    _MODULES[h] = weakref.ref(module)
    weakref.finalize(module, _MODULES.pop, h, None)
    module.__dict__["_op_handle"] = h


class Handled:
    """Mixin of the modules above: a deep copy or an unpickled module registers a handle of its own (their
    ``__init__`` calls :func:`register`)."""

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        register(self)


class HoldsGroup:
    """Mixin of the modules that keep a ``torch.distributed`` process group in attribute ``group_attr`` (tensor-
    and expert-parallel layers): a deep copy shares the group (a ProcessGroup does not copy); pickling stores the
    world group as None (the default group where it is loaded) and raises TypeError for another group. Comes
    before :class:`Handled` in the bases."""

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
        """A deep copy (own buffers, a new op handle: ``Handled.__setstate__``) sharing the process group."""
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
        return dict(state, _check_position=True)  # (checked against the loading process on the first forward)


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


def graph_handle(module: nn.Module) -> int:
    """``module``'s handle as a traced graph holds it: tagged with this process under ``torch.export``.
    NotImplementedError inside forward-mode AD (:func:`mxkit.ops.refuse_forward_ad`: the ops have no forward rule)."""
    refuse_forward_ad(type(module).__name__)
    h = module.__dict__["_op_handle"]
    return for_export(h) if exporting() else h


def module_of(handle: int, op: str) -> nn.Module:
    """The module of ``handle`` (plain or tagged: :func:`graph_handle`); RuntimeError (naming the op) when it no
    longer exists or the handle was tagged by another process."""
    plain = untag(handle)
    if plain is None:
        raise RuntimeError(f"mxkit::{op}: this op's module lives in the process that exported the program (a "
                           f"program exported with torch.export that holds this op runs only where it was exported)")
    m = _MODULES.get(plain)
    m = m() if m is not None else None
    if m is None:
        raise RuntimeError(f"mxkit::{op}: the module of handle {handle} no longer exists")
    return m

