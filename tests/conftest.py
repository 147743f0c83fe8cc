"""Shared test helpers for mxkit: random inputs with a wide dynamic range, crafted special blocks, byte
comparisons, and an independent float64 model of MX quantization (``oracle_quantize``).

Everything here is independent of mxkit's own helpers on purpose: the element grids come from ml_dtypes
(FP4 / FP6 / FP8) or from the OCP table (INT8), the scale rules are written out from their definitions with
``numpy.frexp`` / ``numpy.ldexp`` in float64, so a bug in ``mxkit.formats`` cannot hide in its own oracle.

Other test files import from here (``from conftest import rand_blocks, oracle_quantize, ...``); pytest puts
``tests/`` on ``sys.path`` because the directory has no ``__init__.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    ml_dtypes = None

# ---------------------------------------------------------------------------------------------------------
# names

FORMAT_NAMES = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8")
FLOAT_FORMAT_NAMES = FORMAT_NAMES[:-1]
SCALE_MODES = ("floor", "ceil", "rceil", "even")
ROUNDINGS = ("rne", "away")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------------------------------------
# an independent description of the element formats (OCP MX v1.0 table 1), NOT read from mxkit


@dataclass(frozen=True)
class Spec:
    name: str
    bits: int
    mbits: int
    emax: int  # exponent of the largest normal (emax_elem of OCP §6.3)
    emin: int  # exponent of the smallest normal (floats); INT8: -6 (its fixed step)
    max_normal: float
    ml_dtype: Optional[str]  # ml_dtypes name, None for INT8
    is_int: bool = False

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)


SPECS = {
    "mxfp8_e4m3": Spec("mxfp8_e4m3", 8, 3, 8, -6, 448.0, "float8_e4m3fn"),
    "mxfp8_e5m2": Spec("mxfp8_e5m2", 8, 2, 15, -14, 57344.0, "float8_e5m2"),
    "mxfp6_e3m2": Spec("mxfp6_e3m2", 6, 2, 4, -2, 28.0, "float6_e3m2fn"),
    "mxfp6_e2m3": Spec("mxfp6_e2m3", 6, 3, 2, 0, 7.5, "float6_e2m3fn"),
    "mxfp4_e2m1": Spec("mxfp4_e2m1", 4, 1, 2, 0, 6.0, "float4_e2m1fn"),
    "mxint8": Spec("mxint8", 8, 6, 0, -6, 127 / 64, None, is_int=True),
}


def ml_dtype(fmt: str):
    """The ml_dtypes scalar type of a float format (skips the test when ml_dtypes is missing)."""
    if ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    return getattr(ml_dtypes, SPECS[fmt].ml_dtype)


def ml_decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Element codes (uint8, one per byte, low bits) -> float64 through ml_dtypes (the independent decoder)."""
    spec = SPECS[fmt]
    codes = np.asarray(codes, dtype=np.uint8)
    if spec.is_int:
        return codes.view(np.int8).astype(np.float64) / 64.0
    return codes.view(ml_dtype(fmt)).astype(np.float64)


def element_grid(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, codes): every non-negative finite element value (ascending, float64) and its magnitude code."""
    spec = SPECS[fmt]
    if spec.is_int:
        codes = np.arange(128, dtype=np.uint8)
        return codes.astype(np.float64) / 64.0, codes
    codes = np.arange(spec.sign_bit, dtype=np.uint8)
    vals = ml_decode(codes, fmt)
    keep = np.isfinite(vals)
    vals, codes = vals[keep], codes[keep]
    order = np.argsort(vals, kind="stable")
    assert np.all(np.diff(vals[order]) > 0), "element grid must be strictly increasing"
    assert vals[order][-1] == spec.max_normal
    return vals[order], codes[order]


# ---------------------------------------------------------------------------------------------------------
# the independent float64 model of MX quantization


def oracle_scale_exp(amax: np.ndarray, fmt: str, mode: str) -> np.ndarray:
    """Unbiased shared exponent X (int64) of each block amax (float64 >= 0, finite), before the E8M0 clamp.

    Definitions (written from the rule, not from mxkit): with amax = (1 + f) * 2^E, 0 <= f < 1,
    FLOOR X = E - emax (OCP §6.3); CEIL X = ceil(log2 amax) - emax; RCEIL X = the smallest integer with
    amax <= max_normal * 2^X; EVEN X = E(round_half_up(amax to mbits+1 significant bits)) - emax (the
    "add 0x200000 and mask" trick for FP4). amax == 0 gives an arbitrary value (callers override).
    """
    spec = SPECS[fmt]
    a = np.asarray(amax, dtype=np.float64)
    safe = np.where(a > 0, a, 1.0)
    m, e = np.frexp(safe)  # safe = m * 2^e, m in [0.5, 1)
    E = e.astype(np.int64) - 1
    is_pow2 = m == 0.5
    if mode == "floor":
        x = E - spec.emax
    elif mode == "ceil":
        x = E + (~is_pow2) - spec.emax
    elif mode == "rceil":
        x = E - spec.emax
        x = x + (safe > np.ldexp(spec.max_normal, x))  # max_normal * 2^X exact in float64
    elif mode == "even":
        sig = np.ldexp(safe, -(E - spec.mbits))  # in [2^mbits, 2^(mbits+1)), exact
        rounded = np.floor(sig + 0.5)  # round half up at mbits fraction bits (exact: sig has <= 24 bits)
        x = E + (rounded >= 2 ** (spec.mbits + 1)) - spec.emax
    else:
        raise ValueError(mode)
    return x.astype(np.int64)


def oracle_round(v: np.ndarray, fmt: str, rounding: str) -> np.ndarray:
    """|v| (float64, >= 0, already divided by the scale) -> magnitude code: nearest grid value, ties to even
    code (RNE) or to the larger magnitude (AWAY), saturating at max_normal."""
    vals, codes = element_grid(fmt)
    v = np.minimum(np.asarray(v, dtype=np.float64), vals[-1])
    lo_i = np.clip(np.searchsorted(vals, v, side="right") - 1, 0, len(vals) - 1)
    hi_i = np.minimum(lo_i + 1, len(vals) - 1)
    d_lo = v - vals[lo_i]
    d_hi = vals[hi_i] - v
    if rounding == "rne":
        tie_pick_hi = (codes[hi_i] & 1) == 0  # the even code; for INT8 the even integer
    elif rounding == "away":
        tie_pick_hi = np.ones_like(d_lo, dtype=bool)
    else:
        raise ValueError(rounding)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & tie_pick_hi)
    return np.where(pick_hi, codes[hi_i], codes[lo_i]).astype(np.uint8)


def oracle_quantize(
    x, fmt: str, mode: str = "floor", rounding: str = "rne", block_size: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Independent MX quantization along the LAST axis: returns (scale bytes uint8 (..., n/bs),
    element codes uint8 (..., n), unpacked: FP4/FP6 codes in the low bits, INT8 two's complement).

    x: numpy float32 array or torch tensor (any float dtype, converted to float32 exactly).
    Special blocks: amax == 0 -> scale 0 (elements keep the sign of -0 for float formats); any NaN/Inf ->
    scale 0xFF and codes 0. Scale clamped to [-127, 127] (bytes 0..254).
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.float32).cpu().numpy()
    x = np.asarray(x, dtype=np.float32)
    spec = SPECS[fmt]
    lead, n = x.shape[:-1], x.shape[-1]
    b = x.astype(np.float64).reshape(*lead, n // block_size, block_size)
    finite = np.isfinite(b).all(axis=-1)
    bf = np.where(finite[..., None], b, 0.0)
    amax = np.abs(bf).max(axis=-1)
    X = np.clip(oracle_scale_exp(amax, fmt, mode), -127, 127)
    X = np.where(amax == 0, -127, X)
    scale = np.where(finite, X + 127, 255).astype(np.uint8)
    v = np.ldexp(np.abs(bf), -X[..., None])  # exact: power-of-two scaling in float64
    mag = oracle_round(v, fmt, rounding).astype(np.int64)
    neg = np.signbit(bf)
    if spec.is_int:
        codes = np.where(neg, (-mag) & 0xFF, mag)
    else:
        codes = np.where(neg, mag | spec.sign_bit, mag)
    codes = np.where(finite[..., None], codes, 0).astype(np.uint8)
    return scale, codes.reshape(*lead, n)


ALIASES = {"mxfp4": "mxfp4_e2m1", "mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e2m3"}


def oracle_unpack(qdata: torch.Tensor, fmt: str) -> torch.Tensor:
    """qdata bytes -> element codes, written independently of mxkit.reference.unpack_codes.

    FP4: element 2i in the low nibble; FP6: 4 codes in 3 little-endian bytes, a | b<<6 | c<<12 | d<<18."""
    q = qdata.to(torch.int64)
    bits = SPECS[ALIASES.get(fmt, fmt)].bits
    if bits == 8:
        return qdata.to(torch.uint8)
    if bits == 4:
        out = torch.empty(*q.shape[:-1], q.shape[-1] * 2, dtype=torch.int64)
        out[..., 0::2] = q & 0xF
        out[..., 1::2] = q >> 4
        return out.to(torch.uint8)
    b0, b1, b2 = q[..., 0::3], q[..., 1::3], q[..., 2::3]
    w = b0 + 256 * b1 + 65536 * b2
    out = torch.empty(*q.shape[:-1], q.shape[-1] // 3 * 4, dtype=torch.int64)
    for i in range(4):
        out[..., i::4] = (w >> (6 * i)) & 0x3F
    return out.to(torch.uint8)


# ---------------------------------------------------------------------------------------------------------
# random inputs


def make_generator(seed: Optional[int] = None) -> tuple[torch.Generator, int]:
    """A torch CPU generator with a fresh seed (printed by the ``rng`` fixture so a failure can be replayed)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    return g, seed


@pytest.fixture
def rng(request) -> torch.Generator:
    """Fresh random generator per test; the seed is printed (shown by pytest on failure).
    Replay with MXKIT_TEST_SEED=<seed>."""
    env = os.environ.get("MXKIT_TEST_SEED")
    g, seed = make_generator(int(env) if env else None)
    print(f"[{request.node.nodeid}] seed={seed} (replay: MXKIT_TEST_SEED={seed})")
    return g


_MAX_NORMALS = (6.0, 7.5, 28.0, 448.0, 57344.0, 127 / 64)


def special_blocks(block_size: int = 32, nonfinite: bool = False) -> torch.Tensor:
    """Crafted float32 blocks (k, block_size) that stress scale rules and element rounding.

    Zero blocks (+0, -0, mixed), single-nonzero blocks, amax exactly max_normal * 2^k for every format,
    amax at powers of two and one ulp either side, amax 7 / 5.9 (FP4 EVEN), FP4 ties, fp32 denormals (amax
    2^-140, 2^-149, largest denormal), tiny normals, huge values (3e38, fp32 max), alternating signs.
    With ``nonfinite``: a NaN block, a +Inf block, a -Inf block and a block with one NaN among finite values.
    """
    n = block_size
    rows = []

    def blk(vals):
        t = torch.zeros(n, dtype=torch.float32)
        v = torch.tensor(vals, dtype=torch.float32).flatten()[:n]
        t[: v.numel()] = v
        return t

    rows.append(torch.zeros(n))
    rows.append(-torch.zeros(n))
    rows.append(torch.tensor([0.0, -0.0] * (n // 2) + [0.0] * (n % 2)))
    rows.append(blk([1.0]))
    rows.append(blk([-3.0e-3]))
    for mn in _MAX_NORMALS:
        for k in (-100, -3, 0, 5, 90):
            rows.append(blk([mn * 2.0**k, -mn * 2.0**k / 3, mn * 2.0**k / 7]))
    for k in (-126, -20, -1, 0, 1, 7, 100, 127):
        p = torch.tensor(2.0**k, dtype=torch.float32)
        up = (p.view(torch.int32) + 1).view(torch.float32).item()
        dn = (p.view(torch.int32) - 1).view(torch.float32).item()
        rows.append(blk([p.item(), p.item() / 2, -p.item() / 3]))
        rows.append(blk([up, -p.item() / 5]))
        rows.append(blk([dn, p.item() / 9]))
    rows.append(blk([7.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.25, -2.5, -5.0]))
    rows.append(blk([5.9, 0.25, 1.25, 2.5, -5.0]))
    rows.append(blk([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.25, -2.5, -5.0]))
    rows.append(blk([2.0**-140, -(2.0**-141), 2.0**-149]))
    rows.append(blk([2.0**-149]))
    rows.append(blk([(2.0**-126) * (1 - 2.0**-23), 2.0**-130, -(2.0**-127)]))
    rows.append(blk([6.0 * 2.0**-127, 1.5 * 2.0**-127, 2.0**-128]))
    rows.append(blk([448.0 * 2.0**-127, 2.0**-130, 2.0**-135]))
    rows.append(blk([3.0e38, -1.0, 1.0e30]))
    rows.append(blk([float(torch.finfo(torch.float32).max), 2.0**100]))
    rows.append(blk([(-1.0) ** i * 1.1 ** i for i in range(n)]))
    rows.append(torch.full((n,), 0.3))
    if nonfinite:
        rows.append(torch.full((n,), float("nan")))
        rows.append(torch.full((n,), float("inf")))
        rows.append(torch.full((n,), float("-inf")))
        rows.append(blk([1.0, 2.0, float("nan"), 4.0]))
        rows.append(blk([1.0, float("-inf"), 4.0]))
    return torch.stack(rows).to(torch.float32)


def rand_blocks(
    n_blocks: int,
    block_size: int = 32,
    *,
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
    exp_range: tuple[int, int] = (-90, 90),
    special: bool = True,
    nonfinite: bool = False,
) -> torch.Tensor:
    """Random blocks (n_blocks, block_size) in ``dtype`` with a wide dynamic range.

    Each block gets its own power-of-two magnitude drawn from ``exp_range`` and, per element, an extra
    down-shift of 0..24 binades for a quarter of the elements (so element results land in the element
    subnormal range and flush to zero), random signs, ~5% exact zeros and ~2% ±0 blocks of fp32 denormals.
    With ``special`` the first rows are :func:`special_blocks` (those that do not survive the cast to
    ``dtype`` as finite values are replaced by random blocks unless ``nonfinite``).
    """
    g = generator
    lo, hi = exp_range
    if dtype == torch.float16:
        lo, hi = max(lo, -20), min(hi, 12)
    base = torch.randint(lo, hi + 1, (n_blocks, 1), generator=g).to(torch.float32)
    x = torch.randn(n_blocks, block_size, generator=g)
    shift = torch.randint(0, 25, (n_blocks, block_size), generator=g).to(torch.float32)
    shift = torch.where(torch.rand(n_blocks, block_size, generator=g) < 0.25, shift, torch.zeros_like(shift))
    x = x * torch.exp2(base - shift)
    x = torch.where(torch.rand(n_blocks, block_size, generator=g) < 0.05, torch.zeros_like(x), x)
    if dtype == torch.float32 and n_blocks >= 50:
        # a few blocks made only of fp32 denormals
        k = max(1, n_blocks // 50)
        idx = torch.randperm(n_blocks, generator=g)[:k]
        den = torch.randint(-(2**23 - 1), 2**23, (k, block_size), generator=g, dtype=torch.int32)
        x[idx] = (den.abs() | (den < 0).to(torch.int32) << 31).view(torch.float32)
    if special:
        s = special_blocks(block_size, nonfinite=nonfinite)
        k = min(len(s), n_blocks)
        x[:k] = s[:k]
    out = x.to(dtype)
    if not nonfinite:
        bad = ~torch.isfinite(out).all(dim=-1)
        if bad.any():
            out[bad] = torch.randn(int(bad.sum()), block_size, generator=g).to(dtype)
    return out


def rand_tensor(shape, axis: int = -1, **kw) -> torch.Tensor:
    """A random tensor of ``shape`` whose blocks along ``axis`` come from :func:`rand_blocks`."""
    shape = tuple(shape)
    axis = axis % len(shape)
    block_size = kw.pop("block_size", 32)
    moved = shape[:axis] + shape[axis + 1 :] + (shape[axis],)
    n = 1
    for d in moved:
        n *= d
    x = rand_blocks(n // block_size, block_size, **kw).reshape(moved)
    return x.movedim(-1, axis)


# ---------------------------------------------------------------------------------------------------------
# byte comparisons


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def assert_bytes_equal(actual, expected, what: str = "") -> None:
    """Byte equality with the first mismatches named (index, actual, expected)."""
    a = u8(torch.as_tensor(actual))
    e = u8(torch.as_tensor(expected))
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
    if torch.equal(a, e):
        return
    bad = (a != e).nonzero()
    first = [(tuple(i.tolist()), int(a[tuple(i)]), int(e[tuple(i)])) for i in bad[:8]]
    raise AssertionError(f"{what}: {len(bad)} of {a.numel()} bytes differ; first (index, got, expected): {first}")


# ---------------------------------------------------------------------------------------------------------
# dynamic sharding of the GPU tests over several pytest processes (scripts/gpu_check.sh)
#
# With MXKIT_TEST_CLAIM_DIR set, each process collects every test, orders them costliest first, and runs a
# test only if it is the first to create the test's claim file in that folder (O_CREAT | O_EXCL). N processes
# sharing the folder thus split the suite like a work queue: a worker that finishes early takes the next
# unclaimed test. The GPU tests' time is Triton compiles (CPU-bound, one per kernel specialisation), so a
# static split left some processes with several of the slowest tests and others idle.

_CLAIM_DIR = os.environ.get("MXKIT_TEST_CLAIM_DIR")
# rough relative cost (compiled kernel specialisations) by test-function name; unknown tests count 1
_COST = {"test_gpu_variants_match_reference": 12, "test_gpu_fp6_words": 8, "test_gpu_cast_transpose": 10,
         "test_gpu_quantize_matches_reference": 3, "test_gpu_dequantize_matches_reference": 3,
         "test_gpu_small_shapes": 2, "test_gpu_swizzled_scale_layout": 2,
         "test_gpu_fp6_pairs": 6, "test_gpu_cast_transpose_streams_and_graphs": 3}

if _CLAIM_DIR:
    import hashlib

    from _pytest.runner import runtestprotocol

    def pytest_collection_modifyitems(config, items):
        items.sort(key=lambda it: -_COST.get(getattr(it, "originalname", it.name), 1))  # stable

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(item, nextitem):
        claim = os.path.join(_CLAIM_DIR, hashlib.sha1(item.nodeid.encode()).hexdigest())
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return True  # another process runs it: no report here
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        # nextitem=None: tear everything down, since the next test this process runs is not known
        runtestprotocol(item, nextitem=None, log=True)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True
