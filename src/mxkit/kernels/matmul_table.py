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

from .._files import check_nonempty

__all__ = ["DecodeConfig", "gemm_table", "gemm_table_override", "decode_config", "check_table", "load_table",
           "merge_tables"]


@dataclass(frozen=True)
class DecodeConfig:
    """Schedule of the small-M decode kernel: BLOCK_N weight rows x BLOCK_K elements per step, split_k
    programs along K, num_warps, num_stages. Raises ValueError outside block_n in [16, 1024], block_k in [32, 4096],
    num_warps in [1, 32] (powers of 2), split_k in [1, 64], num_stages in [1, 8]."""

    block_n: int = 64
    block_k: int = 256
    split_k: int = 2
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):  # (a bad schedule: a grid of no programs, a division by zero, a kernel build error)
        for f in ("block_n", "block_k", "split_k", "num_warps", "num_stages"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"DecodeConfig.{f} must be an int, got {v!r}")
        pow2 = lambda v, lo, hi: lo <= v <= hi and v & (v - 1) == 0  # noqa: E731
        if not pow2(self.block_n, 16, 1024):
            raise ValueError(f"DecodeConfig.block_n must be a power of 2 in [16, 1024], got {self.block_n}")
        if not pow2(self.block_k, 32, 4096):
            raise ValueError(f"DecodeConfig.block_k must be a power of 2 in [32, 4096], got {self.block_k}")
        if not pow2(self.num_warps, 1, 32):
            raise ValueError(f"DecodeConfig.num_warps must be a power of 2 in [1, 32], got {self.num_warps}")
        # (no upper bound built a kernel Triton refused for its shared memory, or a grid of idle split programs)
        if not 1 <= self.split_k <= 64 or not 1 <= self.num_stages <= 8:
            raise ValueError(f"DecodeConfig.split_k must be in [1, 64] and num_stages in [1, 8], got "
                             f"{self.split_k} and {self.num_stages}")


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
    asyncio task) only. ``table`` replaces the current table whole: a GPU whose entry it lacks, or a key missing
    from that entry, takes the table's ``"default"`` entry, not the packaged one (a file of one `mxkit tune gemm
    --stages` stage holds that stage's key alone); to change some keys, pass ``merge_tables(gemm_table(),
    table)``, as ``mxkit bench --table`` does. Raises ValueError for a table :func:`check_table` refuses."""
    table = check_table(table) if isinstance(table, Mapping) else load_table(table)
    held = _TABLE.set(_freeze(dict(table)))
    token = _TOKEN.set(next(_tokens))
    try:
        yield
    finally:
        _TOKEN.reset(token)
        _TABLE.reset(held)


# The fields each key's code reads (matmul.py, matmul_table.py, moe_details/_decode.py); every one a count >= 0,
# but decode_mma.m8_loop (a loop's name), the optional ones that may be null (off), and decode_w4a16.configs.
_FIELDS = {
    "decode_mma": ("max_m", "m8_loop", "ring_min_k", "ring2_min_n"),
    "a8w8_mma": ("max_m", "max_m_no_wgmma", "quant_max_m", "wgmma_min_nk"),
    "w8a16_mma": ("max_m", "large_max_m", "large_min_nk"),
    "decode_w4a16": ("max_m", "fp6_max_nk", "configs"),
    "w4a16_wgmma": ("max_m", "min_nk", "small_max_m", "small_min_nk", "mid_max_m", "mid_min_nk"),
    "w8a16_wgmma": ("max_m", "min_nk", "small_max_m", "small_min_nk", "mid_max_m", "mid_min_nk"),
    "moe": ("mma_max_pairs", "mma_max_pairs_per_expert", "mma_strips"),
}
_NULLABLE = ("ring_min_k", "ring2_min_n")
M8_LOOPS = ("", "l", "g", "g2")  # decode_mma.m8_loop (:data:`.matmul_details._mma_decode.M8_LOOPS`)
_CONFIG_FIELDS = ("k_max", "block_n", "block_k", "split_k", "num_warps", "num_stages")


def _check_fields(key: str, fields: Mapping, where: str) -> None:
    """ValueError naming ``where`` / the field for a field ``key``'s code does not read or a value it cannot use."""
    known = _FIELDS[key]
    for f, v in fields.items():
        at = f"{where} / {f!r}"
        if str(f).startswith("_"):
            continue
        if f not in known:
            raise ValueError(f"{at}: not a field of {key!r} (its fields: {', '.join(known)})")
        if f == "m8_loop":
            if v not in M8_LOOPS:
                raise ValueError(f"{at}: {v!r} is not a loop of the m8 kernel (one of {M8_LOOPS})")
        elif f == "configs":
            _check_configs(v, at)
        elif v is None and f in _NULLABLE:
            continue
        elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{at}: expected an int >= 0{' or null' if f in _NULLABLE else ''}, got {v!r}")
        elif key == "moe" and f == "mma_strips":  # (another count ran as 1, silently)
            from .matmul_details._mma_decode import GROUPED_STRIPS

            if v not in GROUPED_STRIPS:
                raise ValueError(f"{at}: {v!r} is not a strip count of the grouped decode kernels (one of "
                                 f"{GROUPED_STRIPS})")


def _check_configs(configs, at: str) -> None:
    if not isinstance(configs, (list, tuple)):  # ([]: DecodeConfig's defaults at every K)
        raise ValueError(f"{at}: expected a list of schedules, got {configs!r}")
    last = 0
    for i, c in enumerate(configs):
        if not isinstance(c, Mapping) or sorted(k for k in c if not str(k).startswith("_")) != sorted(_CONFIG_FIELDS):
            raise ValueError(f"{at}[{i}]: expected a mapping of exactly {', '.join(_CONFIG_FIELDS)}, got {c!r}")
        k_max = c["k_max"]
        if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max <= last:
            raise ValueError(f"{at}[{i}]: k_max must be an int above the previous schedule's ({last}), got {k_max!r}")
        last = k_max
        try:
            DecodeConfig(*(c[f] for f in _CONFIG_FIELDS[1:]))
        except ValueError as e:
            raise ValueError(f"{at}[{i}]: {e}") from None


def check_table(table, what: str = "table") -> dict:
    """``table`` if it is a dispatch table of the packaged JSON's shape: ``{GPU name: {key: {field: value}}}``, where
    names, keys and fields starting with ``_`` (notes such as ``_doc`` / ``_measured``) may hold anything, the keys
    are those of :data:`mxkit.tune.STAGES` and each key's fields those its code reads (:data:`_FIELDS`): ints >= 0
    (``decode_mma.ring_min_k`` / ``ring2_min_n`` may be null: off), ``decode_mma.m8_loop`` one of :data:`M8_LOOPS`,
    ``decode_w4a16.configs`` a list of :class:`DecodeConfig` schedules with ascending ``k_max``, ``moe.mma_strips``
    one of the grouped decode kernels' strip counts (1, 2, 4). Else ValueError
    naming ``what`` and the first bad part (a typo'd key or field would otherwise change nothing, silently)."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{what} is not a dispatch table ({{GPU name: {{key: {{field: value}}}}}}, as `mxkit tune "
                         f"gemm` writes), got {type(table).__name__}")
    for name, entry in table.items():
        if str(name).startswith("_"):
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"{what}: the entry of {name!r} is not a mapping of keys (got {type(entry).__name__})")
        for key, fields in entry.items():
            if str(key).startswith("_"):
                continue
            if key not in _FIELDS:
                raise ValueError(f"{what}: {name!r} / {key!r} is not a key of the dispatch table (its keys: "
                                 f"{', '.join(_FIELDS)})")
            if not isinstance(fields, Mapping):
                raise ValueError(f"{what}: {name!r} / {key!r} is not a mapping of fields (got {type(fields).__name__})")
            _check_fields(key, fields, f"{what}: {name!r} / {key!r}")
    return dict(table)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _no_repeats(pairs: list) -> dict:
    """A JSON object whose keys are all different (json keeps the last of a repeated key: a hand-merged table lost
    an entry silently)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def load_table(path: Union[str, Path], what: Optional[str] = None) -> dict:
    """The dispatch table in the JSON file ``path`` (:func:`check_table`); ValueError naming ``what`` (default the
    path) where it cannot be read or is not such a table."""
    what = what or repr(str(path))
    check_nonempty(path, what)  # ("" is the current folder to pathlib)
    try:
        table = json.loads(Path(path).read_text(), parse_constant=_no_constant, object_pairs_hook=_no_repeats)
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
    """decode-w16's schedule for a K on ``device``: the first of the table's ``decode_w4a16.configs`` whose
    ``k_max`` >= K, else :class:`DecodeConfig`'s defaults (a table whose last ``k_max`` is under K)."""
    entry = _envelope(device, "decode_w4a16")
    for c in (entry or {}).get("configs", ()):
        if K <= c["k_max"]:
            return DecodeConfig(c["block_n"], c["block_k"], c["split_k"], c["num_warps"], c["num_stages"])
    return DecodeConfig()


def _envelope(device: torch.device, key: str) -> Optional[Mapping]:
    """The table's entry ``key`` for ``device``, its missing fields (a table `mxkit tune gemm` wrote before they
    existed, or one without the entry) taken from the ``"default"`` entry of the table in force, then from the
    packaged default's (so an edited copy of the packaged table reaches the GPU entries that inherit the field it
    edits); None where none has it."""
    entry, default = _entry(device, key), _packaged_table()["default"].get(key)
    over = _TABLE.get()  # (an override's own default, between the two; the packaged table's is ``default``)
    own = over.get("default", {}).get(key) if over is not None else None
    if own is not None and default is not None:
        default = {**default, **own}
    elif own is not None:
        default = own
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
    ``decode_mma.m8_loop`` ("" the register loop, "l" the lean loop, "g" or "g2"; default ""; a table's "g2" past 8
    rows, where there is no ring of 2, gives "g"). Every loop gives the same bits. Where the K rule gives "g" the
    m16 kernels take their ring loops too at 9-16 rows (:func:`.matmul_details._mma_decode.m16_loop`); "g2" never
    reaches them (M <= 8)."""
    entry = _envelope(device, "decode_mma") or {}
    ring2 = entry.get("ring2_min_n")
    if ring2 is not None and M <= 8 and N >= int(ring2):
        return "g2"
    ring = entry.get("ring_min_k")
    loop = "g" if ring is not None and K >= int(ring) else str(entry.get("m8_loop", ""))
    return "g" if loop == "g2" and M > 8 else loop


DECODE_W16_MAX_M = 64  # the largest M decode-w16's envelope opens to (its tile grows with M; tune times up to 64)


def _decode_max_m(device: torch.device) -> int:
    """decode-w16's envelope (``decode_w4a16.max_m``, at most :data:`DECODE_W16_MAX_M`; an override without the
    entry keeps the packaged one, as every envelope does: :func:`_envelope`)."""
    entry = _envelope(device, "decode_w4a16")
    return min(int(entry["max_m"]), DECODE_W16_MAX_M) if entry else 0
