"""Process-local integer handles by which a compiled graph names a live mxkit object (a module, a PackedWeight):
a constant in the graph, looked up when the graph runs. Each process counts from its own random base, so a graph
carried to another process (``torch.export.save`` / ``load``) finds no object there (a clear error) rather than
another object that happens to hold the same number."""

from __future__ import annotations

import itertools
import secrets

_NEXT = itertools.count(secrets.randbits(40) << 20)  # (< 2**60: an int64 graph constant)


def new_handle() -> int:
    """A handle not given before in this process."""
    return next(_NEXT)
