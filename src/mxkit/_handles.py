"""Process-local integer handles by which a traced graph names a live mxkit module: a constant in the graph,
looked up when the graph runs. ``torch.compile`` graphs hold the plain handle, counted from 1 in each process (the
same model built in the same order gets the same handles: Inductor's on-disk caches hit across restarts).
``torch.export`` programs hold it tagged with a random tag of the process (:func:`for_export`), so a program
carried to another process (``torch.export.save`` / ``load``) finds no module there (:func:`untag`: a clear
error) rather than another module that holds the same number."""

from __future__ import annotations

import itertools
import secrets
from typing import Optional

_NEXT = itertools.count(1)
_SPAN = 1 << 40  # plain handles lie below it
_TAG = secrets.randbits(22) + 1  # this process's tag (tagged handles < 2**63: an int64 graph constant)


def new_handle() -> int:
    """A handle not given before in this process."""
    return next(_NEXT)


def for_export(handle: int) -> int:
    """``handle`` as an exported program holds it: tagged with this process."""
    return _TAG * _SPAN + handle


def untag(handle: int) -> Optional[int]:
    """The plain handle of ``handle`` (plain or tagged by this process); None where another process tagged it."""
    if handle < _SPAN:
        return handle
    tag, plain = divmod(handle, _SPAN)
    return plain if tag == _TAG else None
