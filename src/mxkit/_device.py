"""The CUDA device mxkit's kernels run on. Triton's launcher and mxkit's driver-API launches bind to the *current*
device, where torch's own ops follow their tensors: so a public op given CUDA operands of another device makes
that device current for the call (``torch.cuda.device``), as a model spread over GPUs needs (transformers'
``device_map`` moves each layer's input to its GPU without switching the current device). Outside
``torch.compile`` only: a compiled graph's ops (mxkit's custom ops) run their eager bodies, which check again."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import torch

_compiling = torch.compiler.is_compiling
try:
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except ImportError:  # pragma: no cover (a torch without it)
    _FakeTensor = torch.Tensor
_TRACED = (torch.Tensor, _FakeTensor)


def exporting() -> bool:
    """Whether ``torch.export`` is tracing (strict or not). Reads torch's flag itself: torch 2.11's dynamo answers
    ``torch.compiler.is_exporting()`` with True under ``torch.compile`` as well (fixed in later releases)."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def plain_traced(x: Any) -> bool:
    """Whether ``x``, met while compiling, is a plain tensor: a ``torch.Tensor`` (what dynamo traces) or a
    ``FakeTensor`` (what non-strict ``torch.export`` runs the module on), not another subclass."""
    return type(x) in _TRACED


# torch.cuda.current_device without its lazy-init check (~0.2 us): asked only about CUDA tensors, so CUDA is up
_current = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def elsewhere(t: torch.Tensor) -> bool:
    """Whether CUDA tensor ``t`` lives on a device other than the current one (False while compiling)."""
    return not _compiling() and t.get_device() != _current()


def other_device(obj: Any) -> Optional[torch.device]:
    """The device of ``obj`` (a tensor, an MXTensor, a PackedWeight: anything with a ``device``) where it is a CUDA
    device other than the current one; None otherwise and while compiling."""
    d = getattr(obj, "device", None)
    if not isinstance(d, torch.device) or d.type != "cuda" or _compiling():
        return None
    return d if (d.index or 0) != _current() else None


def on_operand_device(arg: int = 0):
    """Decorator: the function runs with the device of its argument ``arg`` (by position, or by its name when
    given as a keyword) current (:func:`other_device`; ``arg`` 1 for a method's first operand)."""

    def wrap(fn):
        name = list(inspect.signature(fn).parameters)[arg]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            d = other_device(args[arg] if len(args) > arg else kwargs.get(name))
            if d is None:
                return fn(*args, **kwargs)
            with torch.cuda.device(d):
                return fn(*args, **kwargs)

        return wrapper

    return wrap
