"""Environment settings read on hot paths (the kernels' A/B switches, read per call so that a test or a probe may
flip them between calls): ``os.environ.get`` encodes its key and costs ~1.3-2.5 µs a read on the device hosts;
:func:`env` reads the same mapping's encoded store directly (POSIX: ``os.environ._data``, bytes keys, which
``os.environ[...] = ...`` and ``monkeypatch.setenv`` update), falling back to ``os.environ.get`` elsewhere."""

from __future__ import annotations

import os
from typing import Optional

_DATA = getattr(os.environ, "_data", None)
_BYTES = isinstance(_DATA, dict) and all(isinstance(k, bytes) for k in list(_DATA)[:8])


def env(name: str, default: Optional[str] = None) -> Optional[str]:
    """``os.environ.get(name, default)``, faster on POSIX."""
    if _BYTES:
        v = _DATA.get(name.encode())
        return default if v is None else os.fsdecode(v)
    return os.environ.get(name, default)


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (TRITON_INTERPRET set and not 0): kernels then take their
    interpreter-faithful paths (e.g. conversions by bit arithmetic rather than the hardware's)."""
    return env("TRITON_INTERPRET", "0") not in ("", "0")


def choice(name: str, choices: tuple, default: Optional[str] = None) -> Optional[str]:
    """The setting of environment variable ``name``: one of ``choices`` (exact strings, e.g. ``("0", "1")``), or
    ``default`` where it is unset or empty. Raises ValueError naming the variable and the values it takes for
    anything else (``true`` / ``off`` for a 0 / 1 switch: read as on, or as a list, they flipped paths silently)."""
    v = env(name)
    if v is None or v == "":
        return default
    if v in choices:
        return v
    raise ValueError(f"{name}={v!r}: expected {' or '.join(choices)} (or unset)")


def number(name: str, default: Optional[str], kind: type, allowed: Optional[tuple] = None):
    """Environment variable ``name`` (``default`` where unset or empty; None then where ``default`` is None) read
    as ``kind`` (int or float): a finite value >= 0, one of ``allowed`` where given. Raises ValueError naming the
    variable for anything else."""
    v = env(name) or default
    if v is None:
        return None
    try:
        x = kind(v)
    except ValueError:
        x = None
    if x is None or not x >= 0 or x == float("inf") or (allowed is not None and x not in allowed):
        want = f"one of {', '.join(map(str, allowed))}" if allowed is not None else f"a finite {kind.__name__} >= 0"
        raise ValueError(f"{name}={v!r}: expected {want} (or unset)")
    return x
