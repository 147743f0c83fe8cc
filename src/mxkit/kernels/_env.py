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
