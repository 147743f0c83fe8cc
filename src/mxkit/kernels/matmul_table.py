"""The per-GPU dispatch table of :mod:`mxkit.kernels.matmul` and :mod:`mxkit.kernels.moe`: the envelopes and
schedules their plans read (data: ``matmul_tuning.json`` beside this file, one entry per GPU name plus
``"default"``), :func:`gemm_table_override` for A/B runs and tuning, and the lookups.

An entry's missing fields take the packaged default's (:func:`_envelope`), so a table ``mxkit tune gemm`` wrote
before a field existed keeps working. ``mxkit tune gemm`` (:mod:`mxkit.tune`) measures a table for the GPU at
hand.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional, Union

import torch

__all__ = ["DecodeConfig", "gemm_table", "gemm_table_override", "decode_config", "check_table", "load_table",
           "merge_tables"]


@dataclass(frozen=True)
class DecodeConfig:
    """Schedule of the small-M decode kernel: BLOCK_N weight rows x BLOCK_K elements per step, split_k
    programs along K, num_warps, num_stages."""

    block_n: int = 64
    block_k: int = 256
    split_k: int = 2
    num_warps: int = 4
    num_stages: int = 3


_TABLE_FILE = Path(__file__).with_name("matmul_tuning.json")
# the innermost override in force in this thread / task (contextvars: an override in one thread is not another's),
# and its serial number, one per override entered: the prepared calls' key of the table (0: the packaged one)
_TABLE: contextvars.ContextVar[Optional[Mapping]] = contextvars.ContextVar("mxkit_gemm_table", default=None)
_TOKEN: contextvars.ContextVar[int] = contextvars.ContextVar("mxkit_gemm_table_token", default=0)
_tokens = itertools.count(1)


def _freeze(obj):
    if isinstance(obj, dict):
        return MappingProxyType({k: _freeze(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return tuple(_freeze(v) for v in obj)
    return obj


@functools.lru_cache(maxsize=1)
def _packaged_table() -> Mapping:
    return _freeze(json.loads(_TABLE_FILE.read_text()))


def gemm_table() -> Mapping:
    """The dispatch table in force (read-only): the packaged one, or the innermost
    :func:`gemm_table_override` of this thread (or asyncio task)."""
    table = _TABLE.get()
    return table if table is not None else _packaged_table()


@contextlib.contextmanager
def gemm_table_override(table: Union[Mapping, str, Path]):
    """Use ``table`` (a mapping of the packaged JSON's shape, or a path to such a file, e.g. written by
    ``mxkit tune gemm``) for the calls made inside the ``with`` block (A/B runs, tuning), in this thread (or
    asyncio task) only."""
    if not isinstance(table, Mapping):
        table = load_table(table)
    held = _TABLE.set(_freeze(dict(table)))
    token = _TOKEN.set(next(_tokens))
    try:
        yield
    finally:
        _TOKEN.reset(token)
        _TABLE.reset(held)


def check_table(table, what: str = "table") -> dict:
    """``table`` if it is a dispatch table of the packaged JSON's shape: ``{GPU name: {key: {field: value}}}``, where
    names and keys starting with ``_`` (notes such as ``_doc`` / ``_measured``) may hold anything; else ValueError
    naming ``what`` and the first bad part."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{what} is not a dispatch table ({{GPU name: {{key: {{field: value}}}}}}, as `mxkit tune "
                         f"gemm` writes), got {type(table).__name__}")
    for name, entry in table.items():
        if str(name).startswith("_"):
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"{what}: the entry of {name!r} is not a mapping of keys (got {type(entry).__name__})")
        for key, fields in entry.items():
            if not str(key).startswith("_") and not isinstance(fields, Mapping):
                raise ValueError(f"{what}: {name!r} / {key!r} is not a mapping of fields (got {type(fields).__name__})")
    return dict(table)


def load_table(path: Union[str, Path], what: Optional[str] = None) -> dict:
    """The dispatch table in the JSON file ``path`` (:func:`check_table`); ValueError naming ``what`` (default the
    path) where it cannot be read or is not such a table."""
    what = what or repr(str(path))
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{what} cannot be read as a JSON dispatch table: {e}") from None
    return check_table(table, what)


def merge_tables(base: Mapping, over: Mapping) -> dict:
    """``base`` with ``over``'s entries merged into it field by field (:func:`check_table` shapes): a GPU's key in
    ``over`` replaces the fields it names and keeps ``base``'s others, and ``over``'s other keys and GPUs are
    added. A tuned table of some keys, so merged into the packaged one, changes only what it measured (replacing
    the table instead, a GPU with a packaged entry, the H200's, would fall back to the packaged ``"default"``
    entry for every field the tuned one lacks)."""
    out = {name: (dict(entry) if isinstance(entry, Mapping) else entry) for name, entry in base.items()}
    for name, entry in over.items():
        if str(name).startswith("_") or not isinstance(out.get(name), dict):
            out[name] = entry
            continue
        merged = out[name]
        for key, fields in entry.items():
            old = merged.get(key)
            merged[key] = ({**old, **fields} if isinstance(old, Mapping) and isinstance(fields, Mapping)
                           and not str(key).startswith("_") else fields)
    return out


def _table_token() -> int:
    """Which table is in force, for the keys of the prepared calls: 0 for the packaged one, else a number no
    other override ever had (an ``id()`` of a table could be reused once the table is freed)."""
    return _TOKEN.get()


@functools.lru_cache(maxsize=None)
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _entry(device: torch.device, key: str) -> Optional[Mapping]:
    table = gemm_table()
    name = _gpu_name(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else ""
    for k in (name, "default"):
        if k in table and key in table[k]:
            return table[k][key]
    return None


def decode_config(device: torch.device, K: int) -> DecodeConfig:
    entry = _envelope(device, "decode_w4a16")
    for c in (entry or {}).get("configs", ()):
        if K <= c["k_max"]:
            return DecodeConfig(c["block_n"], c["block_k"], c["split_k"], c["num_warps"], c["num_stages"])
    return DecodeConfig()


def _envelope(device: torch.device, key: str) -> Optional[Mapping]:
    """The table's entry ``key`` for ``device``, its missing fields (a table `mxkit tune gemm` wrote before they
    existed, or one without the entry) taken from the packaged default's; None where neither has it."""
    entry, default = _entry(device, key), _packaged_table()["default"].get(key)
    if entry is None or default is None:
        return entry if entry is not None else default
    return {**default, **entry}


def _mma_max_m(device: torch.device, key: str = "decode_mma", field: str = "max_m") -> int:
    """The table's ``max_m`` (or ``field``, falling back to ``max_m``) of a CUDA C++ kernel's envelope
    (``decode_mma``, ``a8w8_mma`` or ``w8a16_mma``), at most the kernel module's MAX_M."""
    from .matmul_details import _mma_a8w8, _mma_decode

    entry = _envelope(device, key)
    cap = (_mma_decode if key == "decode_mma" else _mma_a8w8).MAX_M  # (a8w8_mma, w8a16_mma: the same file)
    return min(int(entry.get(field, entry["max_m"])), cap) if entry else 0


def mma_m8_loop(device: torch.device, K: int, N: int = 0, M: int = 1) -> str:
    """The decode-mma m8 kernel's loop on ``device`` for M rows of a weight of N x K: "g2" (the ring of 2 tiles a
    lane) up to 8 rows on weights of N >= ``decode_mma.ring2_min_n`` (optional; null or absent: never), else "g"
    (the ring of 4) where K is at least ``decode_mma.ring_min_k`` (optional; null or absent: never), else
    ``decode_mma.m8_loop`` ("" the register loop, "l" the lean loop, "g"; default ""). Every loop gives the same
    bits. Where the K rule gives "g" the m16 kernels take their ring loops too at 9-16 rows
    (:func:`.matmul_details._mma_decode.m16_loop`); "g2" never reaches them (M <= 8)."""
    entry = _envelope(device, "decode_mma") or {}
    ring2 = entry.get("ring2_min_n")
    if ring2 is not None and M <= 8 and N >= int(ring2):
        return "g2"
    ring = entry.get("ring_min_k")
    return "g" if ring is not None and K >= int(ring) else str(entry.get("m8_loop", ""))


def _decode_max_m(device: torch.device) -> int:
    """decode-w16's envelope (``decode_w4a16.max_m``; an override without the entry keeps the packaged one, as every
    envelope does: :func:`_envelope`)."""
    entry = _envelope(device, "decode_w4a16")
    return int(entry["max_m"]) if entry else 0
