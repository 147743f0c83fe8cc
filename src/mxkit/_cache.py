"""Keys of caches derived from tensors (packed or folded copies of weights, biases in another order, values read
once with a host sync): kept while the source tensors are the same live objects, in the same storage, at the same
version."""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch


def tensor_version(t: torch.Tensor) -> Optional[int]:
    """``t._version`` (bumped by every in-place change), or None for an inference tensor, which keeps no version
    counter (``torch.inference_mode``; a cache keyed on one is not told of an in-place change made to it inside
    ``inference_mode``, where only inference tensors can change)."""
    return None if t.is_inference() else t._version


def same_objects(refs: Sequence[weakref.ref], tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` are, one for one, the live objects the weak references ``refs`` name (a tensor that took
    a freed one's address and ``id`` is not)."""
    return len(tensors) == len(refs) and all(r() is t for r, t in zip(refs, tensors))


class TensorsKey:
    """The identity, storage and version of some tensors: :meth:`matches` holds while each is the same live object
    (held by weak reference: a new tensor that took a freed one's address and ``id`` does not match) with the same
    ``data_ptr`` and :func:`tensor_version`."""

    __slots__ = ("refs", "state")

    def __init__(self, tensors: Sequence[torch.Tensor], *extra) -> None:
        self.refs = tuple(weakref.ref(t) for t in tensors)
        self.state = (tuple((t.data_ptr(), tensor_version(t)) for t in tensors), extra)

    def holds(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether ``tensors`` are the same live objects (whatever their versions: written in place since)."""
        return same_objects(self.refs, tensors)

    def matches(self, tensors: Sequence[torch.Tensor], *extra) -> bool:
        return self.holds(tensors) and self.state == (tuple((t.data_ptr(), tensor_version(t)) for t in tensors), extra)
