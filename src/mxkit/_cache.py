"""Keys of caches derived from tensors (packed or folded copies of weights, biases in another order, values read
once with a host sync): kept while the source tensors are the same live objects, in the same storage, at the same
version. And :func:`constant_cache` / :func:`traced_cache`, caches of host functions that torch.compile traces."""

from __future__ import annotations

import functools
import weakref
from typing import Callable, Optional, Sequence, TypeVar

import torch

from .formats import FORMATS, ElementFormat

F = TypeVar("F", bound=Callable)

_FORMAT = "mxkit-format"  # (a format's stand-in among constant_cache's traced arguments: (_FORMAT, its name))


def constant_cache(fn: F) -> F:
    """``fn`` under :func:`functools.lru_cache`, which torch.compile calls at trace time and keeps as a constant of
    the graph (:func:`torch.compiler.assume_constant_result`): for a pure function of hashable arguments that are
    constants when traced (:class:`~mxkit.formats.ElementFormat`, dtypes, ints, names) returning a Python constant
    (ints, bools, tuples, None). Otherwise dynamo traces through the cache (warning, once per call site, that it
    ignores it), and a function that reads a tensor's values on the host (``bool(t)``) breaks the graph there.
    A format goes to the traced call by its name: torch 2.11's dynamo passes such a function only what it can turn
    into a Python constant, which a frozen dataclass is not there (2.13 passes any object)."""
    cached = functools.lru_cache(maxsize=None)(fn)

    @torch.compiler.assume_constant_result
    def traced(*args):
        return cached(*(FORMATS[a[1]] if type(a) is tuple and a[:1] == (_FORMAT,) else a for a in args))

    @functools.wraps(fn)
    def call(*args):
        if torch.compiler.is_compiling():
            # (only the registered formats by name: another ElementFormat, even one of a registered name, goes as
            # itself, traced on torch 2.13 and refused by 2.11's dynamo rather than answered for the wrong format)
            return traced(*((_FORMAT, a.name) if isinstance(a, ElementFormat) and FORMATS.get(a.name) == a else a
                            for a in args))
        return cached(*args)

    call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    call.cache_info = cached.cache_info  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


def traced_cache(fn: F) -> F:
    """``fn`` under :func:`functools.lru_cache`, called uncached under torch.compile: for a function whose result is a
    tensor (not a constant: :func:`constant_cache` does not apply), which dynamo traces into the graph. Dynamo
    traces through the cache anyway, warning, once per call site, that it ignores it; this is the same graph
    without the warning."""
    cached = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def call(*args):
        return fn(*args) if torch.compiler.is_compiling() else cached(*args)

    call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


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
