"""Autocast off around mxkit's own arithmetic: its results are defined on the operands' dtypes (float32
accumulation, one output rounding), and an enclosing ``torch.autocast`` would run the GEMMs inside (the CPU
reference, cuBLAS through the dispatcher, the gradients) in bf16 / fp16 while the output keeps its dtype."""

from __future__ import annotations

import contextlib
import functools

import torch

_DEVICES = ("cuda", "cpu")


def autocast_off(fn):
    """Decorator: ``fn`` runs with autocast off on every device where it is on (one check a device when it is
    off, as it almost always is)."""

    enabled = torch.is_autocast_enabled

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not (enabled("cuda") or enabled("cpu")):
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for d in _DEVICES:
                if enabled(d):
                    stack.enter_context(torch.autocast(d, enabled=False))
            return fn(*args, **kwargs)

    return wrapper
