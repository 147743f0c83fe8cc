"""Shared test helpers for mxkit: random inputs with a wide dynamic range, crafted special blocks, byte
comparisons, and an independent float64 model of MX quantization (``oracle_quantize``).

Everything here is independent of mxkit's own helpers on purpose: the element grids come from ml_dtypes
(FP4 / FP6 / FP8) or from the OCP table (INT8), the scale rules are written out from their definitions with
``numpy.frexp`` / ``numpy.ldexp`` in float64, so a bug in ``mxkit.formats`` cannot hide in its own oracle.

Other test files import from here (``from conftest import rand_blocks, oracle_quantize, ...``); pytest puts
``tests/`` on ``sys.path`` because the directory has no ``__init__.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
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

AXIS_CASES = {  # GPU quantize / dequantize shapes, name: (shape, axis)
    "rows_727x608": ((727, 608), -1),
    "cols_608x727": ((608, 727), 0),
    "cols_320x208": ((320, 208), 0),  # C a multiple of 16: the FP6 unit asm (col_units, ragged column tiles)
    "mid_3x96x50": ((3, 96, 50), 1),
    "one_row": ((1, 4096), -1),
}
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


def cuda_generator(rng: torch.Generator) -> torch.Generator:
    """A CUDA generator seeded from ``rng`` (so from the test's printed seed): for inputs too large to draw on the
    CPU (one thread a worker under gpu_check) and copy over."""
    return torch.Generator("cuda").manual_seed(int(torch.randint(0, 2**62, (1,), generator=rng)))


def make_generator(seed: Optional[int] = None) -> tuple[torch.Generator, int]:
    """A torch CPU generator with a fresh seed (printed by the ``rng`` fixture so a failure can be replayed)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    return g, seed


def _test_seed(request) -> int:
    """The test's seed: MXKIT_TEST_SEED, else a fresh one (drawn once per test, printed by :func:`_seeded`)."""
    seed = getattr(request.node, "_mxkit_seed", None)
    if seed is None:
        env = os.environ.get("MXKIT_TEST_SEED")
        seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
        request.node._mxkit_seed = seed
    return seed


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every test starts from its seed: torch's global generators (nn.Module inits, unseeded randn), Python's
    and NumPy's, so that a failure replays with MXKIT_TEST_SEED=<seed> whatever draws from them, and no test
    depends on the draws of the tests before it. The seed is printed (pytest shows it on failure)."""
    seed = _test_seed(request)
    print(f"[{request.node.nodeid}] seed={seed} (replay: MXKIT_TEST_SEED={seed})")
    other = (seed * 2654435761 + 1) % 2**32  # (not the rng fixture's seed: its draws and these stay independent)
    torch.manual_seed(other)
    random.seed(other)
    np.random.seed(other)
    yield


@pytest.fixture
def rng(request) -> torch.Generator:
    """Fresh random generator per test, from the test's seed (printed; replay with MXKIT_TEST_SEED=<seed>)."""
    return make_generator(_test_seed(request))[0]


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
    With ``special``, :func:`special_blocks` too: all of them as the first rows when there are at least twice as
    many blocks; else a random half of the blocks at random places are a random choice of them (one non-finite
    block among them with ``nonfinite``), so that small inputs are not mostly the first crafted blocks (zeros).
    Those that do not survive the cast to ``dtype`` as finite values are replaced by random blocks unless
    ``nonfinite``.
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
        if n_blocks >= 2 * len(s):
            x[: len(s)] = s
        elif n_blocks >= 2:
            k = n_blocks // 2
            pick = torch.randperm(len(s), generator=g)[:k]
            finite = torch.isfinite(s).all(dim=1)
            if nonfinite and finite[pick].all():
                bad = torch.nonzero(~finite).flatten()
                pick[-1] = bad[torch.randint(len(bad), (1,), generator=g)]
            x[torch.randperm(n_blocks, generator=g)[:k]] = s[pick]
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
    """The bytes of ``t`` (its shape, the last dim times the element size), whatever its strides (a dim of size 1
    may carry any stride in a "contiguous" tensor, which ``view(torch.uint8)`` refuses)."""
    c = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    c.copy_(t)
    return c.view(torch.uint8)


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
# layout tests

# rows/cols below, at and above every padding multiple, degenerate 1x1, a GPT-OSS-like K/32 = 90, big
SCALE_SHAPES = [
    (1, 1), (1, 3), (3, 1), (5, 7), (31, 4), (32, 8), (33, 9), (127, 5), (128, 4), (129, 4), (200, 3),
    (255, 8), (256, 8), (257, 9), (300, 17), (640, 90), (1000, 1), (2880, 90),
]


def rand_bytes(*shape, device="cpu") -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, device=device)


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same bytes (any 1-byte dtype, any strides)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---------------------------------------------------------------------------------------------------------
# kernel tests: devices, byte checks of MXTensors, the interpreter subprocess


HAS_CUDA = torch.cuda.is_available()
FULL = os.environ.get("MXKIT_GPU_FULL", "0") == "1"  # the complete GPU matrix (scripts/gpu_check.sh sets it)
DEV = os.environ.get("MXKIT_TEST_DEVICE", "cuda")  # "cpu" + TRITON_INTERPRET=1: a dry run of the GPU tests
RUN_GPU = HAS_CUDA or (DEV == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
SKIP_REASON_CUDA = "needs CUDA"  # the skip reasons a [dev] install may show (pytest_runtest_makereport): no GPU,
SKIP_REASON_TWO_GPUS = "needs two CUDA devices"  # or one GPU only,
# or a CPU whose float32 matmul no precision setting lowers (oneDNN has no bf16 matmul on AVX2-only CPUs)
SKIP_REASON_NO_BF16_MATMUL = "needs a CPU with bf16 matmul (the precision setting changes no float32 matmul here)"


@pytest.fixture(scope="session", autouse=True)
def _fast_call_loaded():
    """On a CUDA host the eager hot paths take the C++ fast call once its background build is done
    (:mod:`mxkit.kernels.fast_call`): wait for it, so that the GPU tests run the path users get (a test that needs
    the Python path switches it off)."""
    if HAS_CUDA:
        from mxkit.kernels import fast_call

        fast_call.module(wait=True)
    yield


@pytest.fixture
def packaged_default():
    """The packaged dispatch table's default entry in force on whatever GPU runs the test (the GPU's own entry left
    out): for GPU tests that name the path a shape takes under the default entry's envelopes, not the path a GPU's
    tune chose (the H100's entry sends 3-8 rows of bf16 x MXFP8 to decode-w16, the default's to w8a16-mma)."""
    from mxkit.kernels.matmul_table import _packaged_table, gemm_table_override

    with gemm_table_override({"default": _packaged_table()["default"]}):
        yield


def fill_free_memory(value: int, nbytes: int = 64 << 20) -> None:
    """Fill (then free) CUDA caching-allocator memory with the byte ``value``: one large block of ``nbytes``, and
    small blocks of 512 B to 1 MiB, which the allocator serves from its separate small-block pool (requests up to
    1 MiB: most scale tensors, pads and small outputs), where the large block's bytes never go."""
    big = torch.full((nbytes,), value, dtype=torch.uint8, device="cuda")
    small = [torch.full((1 << k,), value, dtype=torch.uint8, device="cuda") for k in range(9, 21) for _ in range(8)]
    small += [torch.full((1 << 20,), value, dtype=torch.uint8, device="cuda") for _ in range(24)]
    del big, small


def poison_allocator(nbytes: int = 64 << 20) -> None:
    """Fill freed CUDA allocator memory (large and small blocks) with 0xFF bytes (NaN in every float format) and
    wait: an output a kernel fails to write, or a row it should leave alone but reads, shows up."""
    fill_free_memory(0xFF, nbytes)
    torch.cuda.synchronize()


@pytest.fixture
def poison():
    """Fill (then free) the CUDA caching allocator's large and small blocks with 0xAB: outputs allocated with
    torch.empty right after reuse them, so a byte the kernel forgets to write is 0xAB, not a lucky 0."""
    if DEV == "cuda":
        fill_free_memory(0xAB)
    yield


def ref_layout(scale: torch.Tensor, layout: str) -> torch.Tensor:
    """The reference scale in ``layout`` (ND scales flattened to rows first, as the kernels write them)."""
    from mxkit.layouts import to_layout

    return to_layout(scale.reshape(-1, scale.shape[-1]), layout)


def assert_mx_equal(got, ref, layout: str = "plain", what: str = "") -> None:
    """Two MXTensors hold the same bytes (qdata, scale in ``layout``) and metadata."""
    assert got.qdata.shape == ref.qdata.shape, f"{what}: qdata shape {got.qdata.shape} != {ref.qdata.shape}"
    assert_bytes_equal(got.qdata.cpu(), ref.qdata.cpu(), f"{what} qdata")
    exp_scale = ref.scale if layout == "plain" else ref_layout(ref.scale, layout)
    assert_bytes_equal(got.scale.cpu(), exp_scale.cpu(), f"{what} scale[{layout}]")
    assert got.axis == ref.axis and got.shape == ref.shape and got.scale_layout == layout


def assert_dequant_equal(got: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Byte equality, NaNs included: every NaN of either is the canonical one of its dtype
    (:data:`mxkit.reference.CANONICAL_NAN_BITS`, which the reference and the kernels write on every device)."""
    from mxkit.reference import CANONICAL_NAN_BITS

    got, ref = got.cpu(), ref.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    gn, rn = torch.isnan(got), torch.isnan(ref)
    assert torch.equal(gn, rn), f"{what}: NaN positions differ ({int((gn != rn).sum())})"
    int_dtype, bits = CANONICAL_NAN_BITS[got.dtype] if got.dtype in CANONICAL_NAN_BITS else (None, None)
    if int_dtype is not None and bool(rn.any()):
        for name, t in (("got", got), ("reference", ref)):
            nb = t.view(int_dtype)[rn]
            assert bool((nb == bits).all()), f"{what}: {name} NaN bits {hex(int(nb[nb != bits][0]))} != {hex(bits)}"
    assert_bytes_equal(got, ref, what)


def run_interpreted(path: str, func: str) -> str:
    """Run ``func()`` of the test module at ``path`` in a subprocess under Triton's CPU interpreter
    (TRITON_INTERPRET=1 must be set before triton is imported). The function asserts that it really ran
    interpreted and prints ``interpreter checks passed: <n>``; returns the subprocess's stdout."""
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(tests), "src"), tests,
                                         env.get("PYTHONPATH", "")])
    code = f"import runpy; runpy.run_path({path!r})[{func!r}]()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "interpreter checks passed" in r.stdout, r.stdout[-2000:]
    return r.stdout


def compile_gluon_sm90(kernel, sig: dict, consts: dict, num_warps: int, divisible: tuple = ()):
    """A Gluon kernel compiled for sm_90 on the CPU by the installed Triton (its compiler and ptxas; the
    interpreter would replace them): ``sig`` the runtime arguments' types by name in signature order, ``consts``
    the constexprs after them (num_warps included where the kernel declares it), ``divisible`` the pointer
    arguments marked 16-byte aligned."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "the interpreter replaces the compiler"
    full = dict(sig, **{k: "constexpr" for k in consts})
    names = list(full)
    src = GluonASTSource(kernel, full, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs={(names.index(k),): [["tt.divisibility", 16]] for k in divisible})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def interpreted_rng(*kernels) -> torch.Generator:
    """Inside run_interpreted: asserts that the kernels really run under the interpreter (not compiled, not
    skipped); returns a generator with a fresh seed, printed for replay (MXKIT_TEST_SEED=<seed>)."""
    from triton.runtime.interpreter import InterpretedFunction

    assert os.environ.get("TRITON_INTERPRET") == "1"
    for k in kernels:
        assert isinstance(k, InterpretedFunction), type(k)
    g, seed = make_generator(int(os.environ["MXKIT_TEST_SEED"]) if "MXKIT_TEST_SEED" in os.environ else None)
    print(f"interpreter checks, seed={seed}")
    return g


def variant_modes(k: int) -> tuple:
    """Scale modes a variant config is checked with: the scale rule is a constexpr (a compile per mode), so
    outside FULL runs each config takes one mode, rotating with k (production configs get every mode in the
    matrix tests)."""
    return SCALE_MODES if FULL else (SCALE_MODES[k % 4],)


def tie_blocks(fmt: str, n: int, dtype: torch.dtype, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``n`` random blocks (n, 32) of :func:`fp8_tie_blocks` that stay finite and non-zero in ``dtype``, in
    ``dtype``: element ties (and their neighbours) for small checks of a rounding."""
    t = fp8_tie_blocks(fmt).to(dtype)
    ok = torch.nonzero(torch.isfinite(t).all(dim=1) & (t != 0).any(dim=1)).flatten()
    return t[ok[torch.randint(len(ok), (n,), generator=generator)]]


def fp8_tie_blocks(fmt: str, multiple: int = 1) -> torch.Tensor:
    """fp32 blocks for the FP8 / FP6 / FP4 element rounding (the hardware-cvt paths): blocks with amax =
    max_normal * 2^k (every scale mode picks the same X) whose other elements are the midpoints between neighbouring FP8 grid values (ties), one
    fp32 ulp above them, and their negatives; blocks whose mantissa exceeds max_normal's (saturation under
    FLOOR); tiny elements (FP8 subnormals / underflow); k spans fp32-denormal to huge; fp32-denormal blocks."""
    from mxkit.formats import decode_elements, get_format

    f = get_format(fmt)
    grid = decode_elements(torch.arange(1 << (f.bits - 1), dtype=torch.uint8), fmt).double()  # codes >= 0
    grid = torch.unique(grid[torch.isfinite(grid)])  # sorted
    mids = ((grid[1:] + grid[:-1]) / 2).float()  # exact in fp32 (a few significant bits)
    up = (mids.view(torch.int32) + 1).view(torch.float32)
    mx = float(grid[-1])
    vals = torch.cat([mids, -mids, up, -up])
    vals = vals[torch.randperm(vals.numel())]
    nb = -(-vals.numel() // 31)
    vals = torch.cat([vals, torch.zeros(nb * 31 - vals.numel())]).reshape(nb, 31)
    ties = torch.cat([torch.full((nb, 1), mx), vals], dim=1)  # amax = max_normal exactly
    sat = torch.tensor([mx * 1.0625, -mx * 1.125, mx * 1.1, -mx, mx * 0.999, 2.0**-12, -(2.0**-11), 3 * 2.0**-12]
                       + [0.0] * 24).reshape(1, 32)
    out = [b * 2.0**k for k in (-120, -60, 0, 40, 100) for b in (ties, sat, -sat)]
    den = torch.randint(-(2**23 - 1), 2**23, (4, 32), dtype=torch.int32)
    out.append((den.abs() | (den < 0).to(torch.int32) << 31).view(torch.float32))
    out = torch.cat(out)
    return torch.cat([out, out[: -len(out) % multiple]])  # (``multiple``: the first blocks again, to a multiple)


def scale_bytes(shape: tuple, rng) -> torch.Tensor:
    """Random E8M0 scale bytes of ``shape`` holding every byte value 0-255 at random places (as many distinct
    values as there are bytes, when fewer than 256)."""
    sc = torch.randint(0, 256, shape, generator=rng, dtype=torch.uint8)
    flat = sc.view(-1)
    k = min(256, flat.numel())
    flat[torch.randperm(flat.numel(), generator=rng)[:k]] = torch.randperm(256, generator=rng)[:k].to(torch.uint8)
    return sc


# ---------------------------------------------------------------------------------------------------------
# skips: GPU tests skip without CUDA; with the [dev] install nothing else may skip


_DEV_EXTRAS = ("triton", "transformers", "safetensors", "torchao")


def _dev_install() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in _DEV_EXTRAS)


def pytest_collection_modifyitems(config, items):
    if RUN_GPU:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON_CUDA)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _unexpected_skip(report) -> Optional[str]:
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    return None if reason in (SKIP_REASON_CUDA, SKIP_REASON_TWO_GPUS, SKIP_REASON_NO_BF16_MATMUL) else reason


def _fail_unexpected_skip(report, gpu_test: bool) -> None:
    reason = _unexpected_skip(report)
    if reason is not None and (_dev_install() or HAS_CUDA and gpu_test):
        report.outcome = "failed"
        where = "with the [dev] install" if _dev_install() else "on a GPU"
        report.longrepr = f"unexpected skip {where}: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With the [dev] install (triton, transformers, safetensors and torchao importable), and for a gpu-marked test
    on a GPU whatever is installed (the device machine lacks torchao: a parameter set that always skipped went
    unseen there), a skip for any reason but "needs CUDA" / "needs two CUDA devices" fails the test: a broken import
    or a missing extra must not leave CI green. (Without the [dev] install a skip at collection, a module's
    importorskip, stays a skip on a GPU too.)"""
    outcome = yield
    _fail_unexpected_skip(outcome.get_result(), "gpu" in item.keywords)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped at collection (``pytest.importorskip``) fails the same way (with the [dev] install)."""
    outcome = yield
    _fail_unexpected_skip(outcome.get_result(), False)


def run_forked_ranks(main, world: int, args: tuple, timeout_s: float, what: str) -> None:
    """Run ``main(rank, *args)`` in ``world`` forked processes (gloo tests: forking takes 0.1 s where spawning 4
    ranks took 7 s); fails the test if they do not all finish within ``timeout_s`` (the ranks are killed, so CI
    never hangs) or if one raises."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.start_processes(main, args=args, nprocs=world, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=0.5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{what}: {world} gloo ranks did not finish in {timeout_s} s")


# --- CUDA graphs ----------------------------------------------------------------------------------------


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of a step's result (a tensor, an MXTensor, an Fp8Rowwise, a Folded, or tuples of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    for names in (("qdata", "scale"), ("data", "scale")):
        if all(hasattr(out, n) for n in names):
            return [getattr(out, n) for n in names]
    raise TypeError(type(out).__name__)


@contextlib.contextmanager
def faked_capture():
    """``torch.cuda.is_current_stream_capturing()`` True inside (on CPU: what the layers' CUDA-graph records see
    during a capture, for tests of the warnings they give when a graph they were captured in goes stale)."""
    real = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_current_stream_capturing = real


def capture_graph(step, *inputs):
    """(graph, output) of ``step(*inputs)`` captured in a CUDA graph after two warm-up calls on a side stream (as
    torch.cuda.graphs' documentation does)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*inputs)
        step(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*inputs)
    return graph, out


def assert_graph_replays(step, inputs: list[torch.Tensor], fresh, replays: int = 3, check=None) -> None:
    """Capture ``step(*inputs)`` in a CUDA graph (:func:`capture_graph`), then ``replays`` times: copy ``fresh()`` (a
    list like ``inputs``) into the static inputs, poison the captured outputs, replay, and compare every output byte
    with an eager ``step`` on clones of the same inputs; then ``check(out)`` where given (e.g. the bound against the
    float64 product), on the captured output as ``step`` returned it."""
    graph, out = capture_graph(step, *inputs)
    outs = _tensors(out)
    for _ in range(replays):
        for dst, src in zip(inputs, fresh()):
            dst.copy_(src)
        for o in outs:  # in place whatever the strides (a copy would leave a stale output unpoisoned)
            o.fill_(float("nan") if o.is_floating_point() else -1 if o.dtype.is_signed else 0xFF)
        graph.replay()
        want = _tensors(step(*[t.clone() for t in inputs]))
        assert len(want) == len(outs)
        for i, (o, w) in enumerate(zip(outs, want)):
            assert o.shape == w.shape and o.dtype == w.dtype, i
            assert torch.equal(u8(o), u8(w)), f"output {i} of the replay differs from the eager step"
        if check is not None:
            check(out)
