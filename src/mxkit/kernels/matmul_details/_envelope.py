"""The envelopes of the GEMM paths (:mod:`mxkit.kernels.matmul`): which E8M0 scale bytes make every element
value of a format exact in a dtype, the scale statistics read at pack time, and the FP8 epilogue's row-scale
envelope of the fold path. Plain PyTorch (no kernel)."""

from __future__ import annotations

import weakref

import torch

from ..._cache import constant_cache, tensor_version
from ...formats import ElementFormat, decode_elements

__all__ = ["FOLD_EXP_LIMIT", "exact_scale_range", "scale_stats", "host_ints", "scale_extrema", "in_range",
           "out_of_envelope"]

# A folded row scale 2^e with |e| <= FOLD_EXP_LIMIT keeps cuBLAS' float32 epilogue (acc * scale_a * scale_b)
# normal for every non-zero accumulator: |acc| lies in [2^-18, K * 448^2] (products of E4M3 values are multiples
# of 2^-18; K * 448^2 < 2^33 up to K = 42800), so acc * 2^ea stays normal and acc * 2^(ea + eb) overflows only
# where the true result does.
FOLD_EXP_LIMIT = 54

@constant_cache
def exact_scale_range(fmt: ElementFormat, dtype: torch.dtype) -> tuple[int, int]:
    """The E8M0 bytes ``[lo, hi]`` for which every element value of ``fmt`` times 2^(s - 127) is finite and
    exactly representable in ``dtype`` (derived by enumerating the element codes in float64).

    Returns ``(1, 0)`` (an empty range) when no scale byte qualifies.
    """
    codes = torch.arange(1 << fmt.bits, dtype=torch.int32)
    vals = decode_elements(codes, fmt).to(torch.float64)
    vals = vals[torch.isfinite(vals)]
    ok = []
    for s in range(255):
        v = vals * 2.0 ** (s - 127)
        back = v.to(dtype).to(torch.float64)
        ok.append(bool(torch.isfinite(back).all()) and bool(torch.equal(back, v)))
    good = [s for s, g in enumerate(ok) if g]
    if not good:
        return 1, 0
    lo, hi = good[0], good[-1]
    assert all(ok[lo : hi + 1]), f"the exact range of {fmt.name} in {dtype} is not an interval"
    return lo, hi


def scale_stats(scale: torch.Tensor) -> list[torch.Tensor]:
    """0-dim device tensors: the smallest and largest E8M0 byte other than 0xFF, and whether a 0xFF occurs."""
    s = scale.reshape(-1).to(torch.int16)
    nan = s == 0xFF
    if not s.numel():
        return [s.new_tensor(255), s.new_tensor(-1), nan.any()]
    return [torch.where(nan, 255, s).amin(), torch.where(nan, -1, s).amax(), nan.any()]


def host_ints(stats: list[torch.Tensor]) -> list[int]:
    """The 0-dim tensors as host ints, in one sync."""
    return torch.stack([t.to(torch.int32) for t in stats]).tolist()


def scale_extrema(scale: torch.Tensor) -> tuple[int, int, bool]:
    """(smallest, largest) E8M0 byte other than 0xFF, and whether a 0xFF byte occurs (one host sync)."""
    lo, hi, nan = host_ints(scale_stats(scale))
    return lo, hi, bool(nan)


_PER_VERSION: dict[tuple, tuple] = {}  # (what, id(t)) -> (weakref to t, (its _version, data_ptr, dtype, device), value)


def _per_version(what: str, t: torch.Tensor, compute):
    """``compute()`` for tensor ``t``, kept while ``t`` lives with that ``_version`` and storage (a host sync once per
    tensor and version, not per call; at most 4096 entries). Not seen: an in-place change of an inference tensor
    (it keeps no version; recomputing each call would put a host sync in every call and CUDA graph capture), or an
    edit through ``t.data`` (no version bump, the same storage)."""
    state = (tensor_version(t), t.data_ptr(), t.dtype, t.device)
    key = (what, id(t))
    hit = _PER_VERSION.get(key)
    if hit is None or hit[0]() is not t or hit[1] != state:
        if len(_PER_VERSION) > 4096:
            _PER_VERSION.clear()
        hit = (weakref.ref(t), state, compute())
        _PER_VERSION[key] = hit
    return hit[2]


def in_range(lo: int, hi: int, rng: tuple[int, int]) -> bool:
    return hi < lo or (rng[0] <= lo and hi <= rng[1])  # hi < lo: no finite scale at all


def out_of_envelope(scale: torch.Tensor) -> torch.Tensor:
    """Rows whose folded scale 2^e has |e| > FOLD_EXP_LIMIT (NaN rows are not: NaN propagates as it should)."""
    lim = 2.0 ** FOLD_EXP_LIMIT
    return ~((scale >= 1.0 / lim) & (scale <= lim)) & ~torch.isnan(scale)
