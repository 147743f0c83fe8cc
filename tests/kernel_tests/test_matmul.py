"""Scaled MX GEMMs (``mxkit.matmul`` / ``pack_weight`` / ``gemm_plan``; :mod:`mxkit.kernels.matmul`).

Every path is held to issue #22's bound against y64, the float64 product of the dequantized operands:

    ‖y_r − y64_r‖ ≤ 1.2 · ‖round(y64_r) − y64_r‖ + ‖acc_r‖,   row by row (norms over the N outputs),

where ``round`` is the output dtype's rounding (bf16, fp16 or float32) and, element by element,
``acc = 2^-12 · (|y64| + rss) + 8 · 2^-24 · √K · rss`` with ``rss = sqrt(Σ_k (a_k b_nk)²)`` bounds the accumulation
(the only other error an exact path may add; without it a row whose y64 happens to be representable would demand
bit-exact sums): float32 sums grow a random error of about 2^-24 · √K · rss; Hopper's FP8 tensor cores add with
~14 bits inside a promotion interval (2^-14 of the partial sums: |y64| for same-sign products, rss for random
signs), and truncating tensor-core adds drift by about K · 2^-24 / 64 · |y64|. The bound is about 2.5e-4 of |y64|,
so a lost K tile, bf16 partial sums or a float32 output rounded through bf16 fail it
(:func:`test_the_bound_catches_lost_precision`); the worst-case bound K · 2^-24 · ‖|a| · |b|ᵀ‖ used before was ~0.2
of |y64| at K = 28672.
A row whose y64 is NaN must be NaN in y (a NaN scale byte in a block of ``a`` makes its output row NaN).

CPU: the paths themselves run from CPU parts (``backend="triton"`` on CPU: the fold reference and CPU
``torch._scaled_mm``), so the fold arithmetic, the special-row fix-ups, the packing and the plan are tested in
CI. GPU (``-m gpu``): the same checks on CUDA with the Triton fold kernels and cuBLAS, on the issue's shapes.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import mxkit
import mxkit.nn  # (MXLinear: not imported by mxkit itself)
from mxkit.fold import fold_range
from mxkit.formats import get_format
from mxkit.kernels.matmul import PATHS, W_KINDS, exact_scale_range
from mxkit.kernels.matmul_details._mx_weight import _fp6_tile, _mx_weight_tile
from mxkit.packed import PackedWeight
from mxkit.reference import dequantize_reference, pack_codes
from mxkit.tensor import MXTensor

FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1", "mxint8")
FOLDABLE = ("mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")
HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


# ---------------------------------------------------------------------------------------------------------
# helpers


def values64(x) -> torch.Tensor:
    """Exact float64 values of an operand (float tensor, MXTensor, Folded, Fp8Rowwise) as (rows, K)."""
    if isinstance(x, MXTensor):
        return dequantize_reference(x, torch.float64).reshape(-1, x.shape[-1])
    if isinstance(x, mxkit.Fp8Rowwise):
        return (x.data.to(torch.float64) * x.scale.to(torch.float64)).reshape(-1, x.data.shape[-1])
    if isinstance(x, mxkit.PackedWeight):
        return values64(x.source)
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64).reshape(-1, x.shape[-1])
    from mxkit.fold import unfold_reference

    return unfold_reference(x).to(torch.float64)


def accumulation_bound(y64: torch.Tensor, rss: torch.Tensor, K: int) -> torch.Tensor:
    """The accumulation term ``acc`` of the bound, element by element (module docstring): y64 the float64
    products, rss their products' root sum of squares over K."""
    return 2.0**-12 * (y64.abs() + rss) + 8 * 2.0**-24 * K**0.5 * rss


def assert_within_bound(y: torch.Tensor, a, b, bias=None, truncating: bool = False) -> None:
    """Issue #22's row-wise bound (module docstring) for the output dtype of ``y``; ``truncating``: for bf16 outputs
    rounded toward zero (the CPU interpreter's casts), one bf16 ulp of each element instead of the rounding
    error."""
    out = y.dtype
    a64, b64 = values64(a).cpu(), values64(b).cpu()
    y64 = a64 @ b64.T
    if bias is not None:
        y64 = y64 + bias.to(torch.float64).cpu()
    y = y.reshape(-1, y.shape[-1]).to(torch.float64).cpu()
    assert y.shape == y64.shape
    nan = torch.isnan(y64).any(dim=1)
    assert torch.isnan(y[nan]).all(), "a row whose exact product is NaN must be NaN"
    y, y64, a64 = y[~nan], y64[~nan], a64[~nan]
    inf = torch.isinf(y64)  # (an Inf element code): the same infinity, then left out of the norms
    assert torch.equal(y[inf], y64[inf]), "an element whose exact product is +-Inf must be it"
    y, y64 = y.masked_fill(inf, 0), y64.masked_fill(inf, 0)
    acc = accumulation_bound(y64, ((a64 * a64) @ (b64 * b64).T).sqrt(), a64.shape[1]).masked_fill(inf, 0).norm(dim=1)
    err = (y - y64).norm(dim=1)
    if truncating:
        bound = (2.0 ** (torch.floor(torch.log2(y64.abs().clamp(min=2.0**-133))) - 7)).norm(dim=1) + acc
    else:
        rounded = y64.to(out).to(torch.float64)
        bound = 1.2 * (rounded - y64).norm(dim=1) + acc
    bad = torch.nonzero(~(err <= bound)).flatten()  # (a NaN error is over it)
    assert bad.numel() == 0, (f"{bad.numel()} rows over the bound, e.g. row {bad[0].item()}: "
                              f"err {err[bad[0]].item():.3e} > bound {bound[bad[0]].item():.3e}")


def check(a, b, *, out_dtype=None, bias=None, backend="triton", path=None):
    """mxkit.matmul(a, b) within the row-wise bound of the float64 product, on the path ``path`` where given; on
    CUDA the allocator's free memory is poisoned first (NaN bytes: an output element the kernel does not write
    fails the bound)."""
    if getattr(a, "is_cuda", False) or getattr(getattr(a, "device", None), "type", None) == "cuda":
        from conftest import poison_allocator

        poison_allocator()
    y = mxkit.matmul(a, b, out_dtype=out_dtype, bias=bias, backend=backend)
    plan = mxkit.gemm_plan(a, b, out_dtype=out_dtype, backend=backend)
    assert y.dtype == plan.out_dtype
    if path is not None:
        assert plan.path == path, plan
    assert_within_bound(y, a, b, bias)
    return y, plan


def rand_mx(shape, fmt, g, *, spread=None, base=127, device="cpu") -> MXTensor:
    """An MXTensor (…, K) with random non-zero element codes and chosen block scales: when ``spread`` is given
    every row's scale bytes span exactly ``spread`` (first block base, second base - spread, the rest
    in between), else scale bytes base ± 3."""
    f = get_format(fmt)
    *lead, K = shape
    rows = 1
    for d in lead:
        rows *= d
    nb = K // 32
    codes = torch.randint(1, 1 << f.bits, (rows, K), generator=g, dtype=torch.int32)
    if f.is_float and f.name.startswith("mxfp8"):
        nan_codes = {"mxfp8_e4m3": (0x7F, 0xFF), "mxfp8_e5m2": tuple(range(0x7C, 0x80)) + tuple(range(0xFC, 0x100))}
        for c in nan_codes[f.name]:
            codes[codes == c] = 0x11
    codes = codes.to(torch.uint8)
    if spread is None:
        scale = torch.randint(base - 3, base + 4, (rows, nb), generator=g, dtype=torch.int32)
    else:
        assert nb >= 2
        scale = torch.randint(base - spread, base + 1, (rows, nb), generator=g, dtype=torch.int32)
        scale[:, 0] = base
        scale[:, 1] = base - spread
    qdata = pack_codes(codes, f).reshape(*lead, -1)
    q = MXTensor(qdata, scale.to(torch.uint8).reshape(*lead, nb), f, len(shape) - 1, 32, tuple(shape))
    return q.to(device)


# ---------------------------------------------------------------------------------------------------------
# CPU: plan, envelopes, packing


def test_exact_scale_range_is_derived_and_tight():
    for name in FORMATS:
        f = get_format(name)
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            lo, hi = exact_scale_range(f, dt)
            assert lo <= hi
            codes = torch.arange(1 << f.bits, dtype=torch.int32)
            from mxkit.formats import decode_elements

            vals = decode_elements(codes, f).to(torch.float64)
            vals = vals[torch.isfinite(vals)]
            for s, inside in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
                if not 0 <= s <= 254:
                    continue
                v = vals * 2.0 ** (s - 127)
                back = v.to(dt).to(torch.float64)
                exact = bool(torch.isfinite(back).all()) and torch.equal(back, v)
                assert exact == inside, (name, dt, s)
    assert exact_scale_range(get_format("mxfp8_e4m3"), torch.bfloat16) == (3, 246)


@pytest.mark.parametrize("fa", FORMATS)
@pytest.mark.parametrize("fb", FORMATS)
def test_every_format_pair_is_exact(fa, fb, rng):
    """All 36 pairs: FP4 / FP6 pairs fold to FP8, the rest take the exact bf16 path."""
    a = torch.randn(5, 96, generator=rng).to(torch.bfloat16)
    w = torch.randn(32, 96, generator=rng).to(torch.bfloat16)
    qa, qb = mxkit.quantize(a, fa), mxkit.quantize(w, fb)
    path = "fold-fp8" if fa in FOLDABLE and fb in FOLDABLE else "bf16-exact"
    check(qa, mxkit.pack_weight(qb), path=path)
    check(qa, qb, path=path)  # an unpacked weight is packed per call


@pytest.mark.parametrize("spread", [0, 14, 15, 40])
def test_fold_rows_of_spread(spread, rng):
    """Rows of block-scale spread 0 and 14 fold into one E4M3 row; 15 and 40 are split, and their outputs
    come from the float32 route (weight rows: output columns; activation rows: output rows)."""
    qa = rand_mx((9, 128), "mxfp4_e2m1", rng, spread=spread)
    qb = rand_mx((48, 128), "mxfp4_e2m1", rng, spread=spread)
    pw = mxkit.pack_weight(qb)
    assert (pw.special_rows.numel() > 0) == (spread > 14)
    y, _ = check(qa, pw, path="fold-fp8")
    check(qa, pw, out_dtype=torch.float32, path="fold-fp8")
    # mixed: one wide row among folding ones, on each side
    qa2 = rand_mx((9, 128), "mxfp4_e2m1", rng, spread=3)
    check(qa2, pw, path="fold-fp8")
    check(qa, mxkit.pack_weight(rand_mx((48, 128), "mxfp4_e2m1", rng, spread=2)), path="fold-fp8")


def test_fold_ranges_are_the_documented_ones():
    assert fold_range("mxfp4_e2m1") == (-8, 6)
    assert fold_range("mxfp6_e2m3") == (-6, 5)
    assert fold_range("mxfp6_e3m2") == (-5, 4)


def test_fold_rows_outside_the_epilogue_envelope(rng):
    """Row scales beyond 2^±54 (E8M0 bytes near 0 or 254) go through the float32 route, exactly while the MX
    values fit float32. A value past float32's largest (E2M1 6 at scale byte 253: 1.5 * 2^128) decodes to Inf
    there as in the reference (its float32 decode), so such a row is the reference's, not the float64 product."""
    qa = rand_mx((4, 64), "mxfp4_e2m1", rng, base=249)  # scale bytes 246 .. 252: values below 2^127
    qb = rand_mx((32, 64), "mxfp4_e2m1", rng, base=10)
    pw = mxkit.pack_weight(qb)
    assert pw.special_rows.numel() == 32
    check(qa, pw, out_dtype=torch.float32, path="fold-fp8")
    qa.scale[1, 0] = 253
    qa.qdata[1, 0] = 0x77  # elements 0 and 1: 6 * 2^126 each
    y = mxkit.matmul(qa, pw, out_dtype=torch.float32, backend="triton")
    want = mxkit.matmul(qa, pw, out_dtype=torch.float32, backend="reference")
    assert not torch.isfinite(want[1]).all() and torch.isfinite(want[[0, 2, 3]]).all()
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and torch.equal(torch.isinf(y), torch.isinf(want))


def test_nan_scale_makes_the_row_nan_and_zero_blocks_add_nothing(rng):
    for fa, fb in (("mxfp4_e2m1", "mxfp4_e2m1"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp6_e2m3", "mxint8")):
        a = torch.randn(6, 128, generator=rng).to(torch.bfloat16)
        a[2, 32:64] = 0  # a zero block
        a[4] = 0  # a zero row
        qa = mxkit.quantize(a, fa)
        qa.scale[1, 2] = 0xFF
        qb = mxkit.quantize(torch.randn(40, 128, generator=rng), fb)
        y, _ = check(qa, mxkit.pack_weight(qb))
        assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3, 4, 5]]).any()
        assert (y[4] == 0).all()


def test_float_activations_w4a16_and_3d(rng):
    w = mxkit.quantize(torch.randn(64, 2880, generator=rng), "mxfp4")
    pw = mxkit.pack_weight(w)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(2, 3, 2880, generator=rng).to(dt)
        y, plan = check(a, pw, path="dense-exact" if dt != torch.float32 else "fp32-exact")
        assert y.shape == (2, 3, 64)


@pytest.mark.parametrize("case", ["overflow", "underflow"])
def test_w4a8_float32_routes_keep_the_product_in_range(case, rng):
    """FP8 rowwise activations on the float32 routes (the reference, fp32-exact, the special rows' recompute): the row
    scale's power of two goes onto the E4M3 values before the GEMM and its mantissa after, so a product inside
    float32 comes out exact where the raw E4M3 sums would overflow (FP4 weights of -6 * 2^117 times 448: -Inf, NaN
    with mixed signs) or underflow (an E5M2 weight of 2^-143 times 2^-9: 0) before the row scale (2^-20 / 2^100)."""
    def mx(codes, byte, fmt, N, K):
        return MXTensor(pack_codes(codes, fmt), torch.full((N, K // 32), byte, dtype=torch.uint8), fmt, 1, 32, (N, K))

    if case == "overflow":  # (codes 0xF / 0x7: -6 / +6, random signs per element)
        codes = torch.where(torch.rand(16, 64, generator=rng) < 0.5, 0xF, 0x7).to(torch.uint8)
        w, v, s = mx(codes, 244, "mxfp4_e2m1", 16, 64), 448.0, 2.0**-20
    else:
        w, v, s = mx(torch.ones(1, 32, dtype=torch.uint8), 0, "mxfp8_e5m2", 1, 32), 2.0**-9, 2.0**100
    data = (torch.full((3, w.shape[1]), v) * torch.where(torch.rand(3, 1, generator=rng) < 0.5, -1.0, 1.0))
    a = mxkit.Fp8Rowwise(data.to(torch.float8_e4m3fn), torch.full((3, 1), s))
    a64, w64 = a.data.double() * a.scale.double(), dequantize_reference(w, torch.float64)
    want, mag = a64 @ w64.T, a64.abs() @ w64.abs().T
    assert mag.max() < 3e38 and mag.min() > 0  # (inside float32, the sums of magnitudes too)
    for backend in ("auto", "reference", "triton"):
        for b in (w, mxkit.pack_weight(w)):
            got = mxkit.matmul(a, b, backend=backend, out_dtype=torch.float32).double()
            assert torch.isfinite(got).all() and bool(((got - want).abs() <= 1e-6 * mag).all()), backend


def test_w4a8_fp8_rowwise(rng):
    a = torch.randn(7, 2880, generator=rng).to(torch.bfloat16)
    a[3] = 0
    x8 = mxkit.quantize_fp8_rowwise(a)
    assert x8.data.dtype == torch.float8_e4m3fn and x8.scale.shape == (7, 1)
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(48, 2880, generator=rng), "mxfp4"))
    check(x8, pw, path="w4a8-fp8")
    check(x8, mxkit.pack_weight(mxkit.quantize(torch.randn(48, 2880, generator=rng), "mxfp8")), path="fp32-exact")


def test_quantize_fold_activations(rng):
    a = torch.randn(3, 5, 2880, generator=rng).to(torch.bfloat16)
    f = mxkit.quantize_fold(a, "mxfp4")
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(32, 2880, generator=rng), "mxfp6_e3m2"))
    y, _ = check(f, pw, path="fold-fp8")
    assert y.shape == (3, 5, 32)
    # the same values as quantize then matmul
    y2 = mxkit.matmul(mxkit.quantize(a, "mxfp4"), pw, backend="triton")
    assert torch.equal(y, y2)


def test_bias_is_added_before_rounding(rng):
    qa = mxkit.quantize(torch.randn(4, 64, generator=rng), "mxfp4")
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(32, 64, generator=rng), "mxfp4"))
    bias = torch.randn(32, generator=rng)
    check(qa, pw, bias=bias)
    pw40 = mxkit.pack_weight(mxkit.quantize(torch.randn(40, 64, generator=rng), "mxfp4"))  # N padded to 48
    check(qa, pw40, bias=torch.randn(40, generator=rng), path="fold-fp8")
    with pytest.raises(ValueError, match="bias"):
        mxkit.matmul(qa, pw, bias=torch.randn(31))
    with pytest.raises(ValueError, match=r"bias must be a 1-D tensor \(N,\), got shape \(1, 32\)"):
        mxkit.matmul(qa, pw, bias=torch.randn(1, 32))
    with pytest.raises(TypeError, match="bias must be a 1-D tensor .N,. or None, got list"):  # (was a ValueError)
        mxkit.matmul(qa, pw, bias=[0.0] * 32)


def test_reference_backend_and_cpu_auto_agree_with_the_paths(rng):
    qa = mxkit.quantize(torch.randn(4, 64, generator=rng), "mxfp4")
    qb = mxkit.quantize(torch.randn(32, 64, generator=rng), "mxfp4")
    assert mxkit.gemm_plan(qa, qb).path == "reference"  # CPU under auto
    y_ref = mxkit.matmul(qa, qb, out_dtype=torch.float32)
    y_path = mxkit.matmul(qa, qb, out_dtype=torch.float32, backend="triton")
    torch.testing.assert_close(y_path, y_ref, rtol=1e-6, atol=1e-6)  # both float32 sums of exact products


@pytest.mark.parametrize("K", [256, 8192])
def test_the_bound_catches_lost_precision(K, rng):
    """The checker itself: float32 sums of the exact values, and their bf16 / fp16 / float32 roundings, pass;
    a lost K tile, a float32 output rounded through bf16, and two split-K partials rounded to bf16 before their
    sum fail (the worst-case bound used before passed all three at large K)."""
    M, N = 8, 64
    a = rand_mx((M, K), "mxfp8_e4m3", rng)
    b = rand_mx((N, K), "mxfp4_e2m1", rng)
    a32, b32 = values64(a).float(), values64(b).float()
    y32 = a32 @ b32.T  # (float32 sums, another order than any kernel's)
    for out in (torch.float32, torch.bfloat16, torch.float16):
        assert_within_bound(y32.to(out), a, b)
    pos = rand_mx((M, K), "mxfp4_e2m1", rng)  # every E2M1 code positive: products of one sign, sums that only grow
    pos, bpos = (MXTensor(t.qdata & 0x77, t.scale, t.fmt, 1, 32, t.shape) for t in (pos, b))
    assert_within_bound(values64(pos).float() @ values64(bpos).float().T, pos, bpos)
    lost_tile = a32[:, : K - 64] @ b32[:, : K - 64].T
    half = K // 2
    bf16_partials = (a32[:, :half] @ b32[:, :half].T).bfloat16().float() + (a32[:, half:] @ b32[:, half:].T
                                                                             ).bfloat16().float()
    for bad in (lost_tile, y32.bfloat16().float(), bf16_partials):
        with pytest.raises(AssertionError, match="over the bound"):
            assert_within_bound(bad, a, b)


def test_bad_operands_raise(rng):
    qa = mxkit.quantize(torch.randn(4, 64, generator=rng), "mxfp4")
    qb = mxkit.quantize(torch.randn(32, 96, generator=rng), "mxfp4")
    with pytest.raises(ValueError, match="K mismatch"):
        mxkit.matmul(qa, qb)
    with pytest.raises(TypeError, match="MXTensor"):
        mxkit.matmul(qa, torch.randn(32, 64))
    with pytest.raises(ValueError, match="quantized along K"):
        mxkit.matmul(qa, mxkit.quantize(torch.randn(64, 32, generator=rng), "mxfp4", axis=0))
    with pytest.raises(TypeError, match="dtype"):
        mxkit.matmul(torch.zeros(4, 64, dtype=torch.int32), mxkit.quantize(torch.randn(8, 64), "mxfp4"))
    with pytest.raises(ValueError, match="unknown backend"):
        mxkit.matmul(qa, mxkit.quantize(torch.randn(8, 64), "mxfp4"), backend="cuda")
    assert set(PATHS) >= {"fold-fp8", "w4a8-fp8", "bf16-exact", "dense-exact", "fp32-exact", "reference"}


def test_support_matrix_is_in_the_readme():
    from pathlib import Path

    from mxkit.kernels.matmul_support import support_matrix_markdown

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert support_matrix_markdown() in readme, "README's GEMM support matrix is stale: paste support_matrix_markdown()"
    from mxkit.kernels.matmul_support import envelope_markdown, envelope_rows

    assert envelope_markdown() in readme, "README's GEMM envelope table is stale: paste envelope_markdown()"
    rows = {r["path"]: r for r in envelope_rows()}
    assert set(rows) <= set(PATHS) and rows["decode-w16"]["weight"].count("mx") == 6


def test_packed_weight_state_dict_and_to(rng):
    w = mxkit.quantize(torch.randn(48, 96, generator=rng), "mxfp4")
    pw = mxkit.pack_weight(w)
    assert isinstance(pw, PackedWeight) and pw.folded is not None and pw.nbytes > w.nbytes
    assert repr(pw) == f"PackedWeight(mxfp4_e2m1, shape=(48, 96), layouts=[folded], nbytes={pw.nbytes}, device=cpu)"
    buf = io.BytesIO()
    torch.save(pw.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)
    pw2 = mxkit.pack_weight(PackedWeight.source_from_state_dict(sd))
    assert torch.equal(pw2.source.qdata, w.qdata) and torch.equal(pw2.source.scale, w.scale)
    assert torch.equal(pw2.folded.data.view(torch.uint8), pw.folded.data.view(torch.uint8))
    assert pw.to("cpu").folded.data.device.type == "cpu"
    leaves, spec = torch.utils._pytree.tree_flatten(pw)
    assert torch.utils._pytree.tree_unflatten(leaves, spec).scale_max == pw.scale_max
    for bs in (np.int64(32), torch.tensor(32)):  # (integers of other types are the int)
        assert PackedWeight.source_from_state_dict({**sd, "block_size": bs}).block_size == 32
    for bs in (32.9, "32"):  # (int() truncated the float and parsed the string)
        with pytest.raises(TypeError, match="block_size must be an int"):
            PackedWeight.source_from_state_dict({**sd, "block_size": bs})
    del sd["rounding"], sd["shape"]
    with pytest.raises(KeyError, match="PackedWeight state_dict lacks shape, rounding"):
        PackedWeight.source_from_state_dict(sd)


def test_bad_arguments_of_the_gemm_entry_points(rng):
    """A non-float bias (a bool one used to add 1.0), pack_weight's argument name and its act checked on a packed
    weight too, Fp8Rowwise.dequantize's dtypes."""
    w = mxkit.quantize(torch.randn(48, 64, generator=rng), "mxfp4")
    x = torch.randn(2, 64, generator=rng)
    for bias in (torch.ones(48, dtype=torch.bool), torch.ones(48, dtype=torch.int32), torch.ones(48) * (1 + 5j)):
        with pytest.raises(TypeError, match=f"bias must be a floating-point tensor.*{bias.dtype}"):
            mxkit.matmul(x, w, bias=bias)
    assert torch.equal(mxkit.matmul(x, w, bias=torch.ones(48, dtype=torch.float64)),
                       mxkit.matmul(x, w, bias=torch.ones(48)))  # (float64 is a float: added in float32)
    with pytest.raises(TypeError, match="w must be an MXTensor"):
        mxkit.pack_weight(torch.randn(48, 64))
    with pytest.raises(ValueError, match="act='garbage'"):
        mxkit.pack_weight(mxkit.pack_weight(w), act="garbage")
    a = mxkit.quantize_fp8_rowwise(x)
    assert a.dequantize(torch.float64).dtype == torch.float64
    with pytest.raises(TypeError, match="int32"):
        a.dequantize(torch.int32)
    # dense= is checked on a packed weight too: a cache of another dtype (or none) is not there to use
    pb = mxkit.pack_weight(w, dense=torch.bfloat16)
    assert mxkit.pack_weight(pb, dense=torch.bfloat16) is pb and mxkit.pack_weight(pb) is pb
    for dense in (torch.float16, torch.float32):
        with pytest.raises(ValueError, match="dense="):
            mxkit.pack_weight(pb, dense=dense)
    with pytest.raises(ValueError, match="without a torch.bfloat16 cache"):
        mxkit.pack_weight(mxkit.pack_weight(w), dense=torch.bfloat16)
    w6 = mxkit.quantize(torch.randn(48, 64, generator=rng), "mxfp6_e2m3")  # (its bf16 cache is its twin's)
    assert mxkit.pack_weight(p6 := mxkit.pack_weight(w6, dense=torch.bfloat16), dense=torch.bfloat16) is p6


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, gpu])])
def test_k_zero_is_the_empty_sum(device, rng):
    """K = 0: zeros plus the bias, rounded once, on every backend (used to be a raw reshape error), packed or not
    (pack_weight of an FP4 / FP6 weight refused it: its fold has no rows of blocks), for float32 / bf16 / fp16
    activations at M = 1 and 3 (on CUDA a bf16 / fp16 row planned decode-w16, whose prepared call divided by K's
    split: ZeroDivisionError)."""
    from mxkit import MXTensor

    def empty(fmt):
        z = torch.zeros(16, 0, dtype=torch.uint8, device=device)
        return MXTensor(z, z.clone(), fmt, 1, 32, (16, 0))

    w = empty("mxfp4")
    bias = torch.randn(16, generator=rng).to(device)
    for backend in ("auto", "reference", "triton"):
        x = torch.randn(2, 3, 0, generator=rng).to(device, torch.bfloat16)
        y = mxkit.matmul(x, w, bias=bias, backend=backend)
        assert y.shape == (2, 3, 16) and y.dtype == torch.bfloat16
        assert torch.equal(y, bias.to(torch.bfloat16).expand(2, 3, 16))
        assert torch.equal(mxkit.matmul(x.float(), w, backend=backend), torch.zeros(2, 3, 16, device=device))
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3"):
        w = empty(fmt)
        for act in (None, "float", "mx", "fp8_rowwise"):
            pw = mxkit.pack_weight(w, act=act)
            for M in (1, 3):
                x = torch.randn(M, 0, generator=rng).to(device)
                for a in (x, x.to(torch.bfloat16), x.to(torch.float16), mxkit.quantize_fp8_rowwise(x)):
                    y = mxkit.matmul(a, pw, bias=bias)  # (bf16 for FP8 rowwise activations: the bias rounded once)
                    assert torch.equal(y, bias.to(y.dtype).expand(M, 16)), (fmt, act, M, y.dtype)
                    y = mxkit.matmul(a, pw)  # (and a second call: the prepared one)
                    assert torch.equal(y, torch.zeros_like(y)), (fmt, act, M, y.dtype)


def test_pack_weight_float_reads_its_scale_statistics_lazily(rng):
    """pack_weight without a fold (act="float", FP8 weights) takes no host sync: its scale statistics stay a device
    tensor of per-part rows until the first read, which gives scale_extrema's values and keeps them; to(), the
    pytree round trip and state_dict see the same values; the fold path reads them in its one sync."""
    from mxkit.kernels.matmul_details._envelope import scale_extrema

    for fmt in ("mxfp4", "mxfp8_e4m3", "mxint8"):
        w = mxkit.quantize(torch.randn(48, 128, generator=rng) * 2.0 ** torch.randint(-20, 20, (48, 1),
                                                                                       generator=rng), fmt)
        w.scale[3, 1] = 255 if fmt == "mxfp4" else w.scale[3, 1]
        pw = mxkit.pack_weight(w, act="float")
        assert isinstance(pw.stats, torch.Tensor) and pw.stats.dtype == torch.int32 and pw.stats.shape[1] == 3
        moved = pw.to("cpu")
        assert isinstance(moved.stats, torch.Tensor)
        lo, hi, nan = scale_extrema(w.scale)
        assert (pw.scale_min, pw.scale_max, pw.has_nan) == (lo, hi, nan) == (moved.scale_min, moved.scale_max,
                                                                             moved.has_nan)
        assert pw.stats == (lo, hi, nan) and nan == (fmt == "mxfp4")
        leaves, spec = torch.utils._pytree.tree_flatten(mxkit.pack_weight(w, act="float"))
        back = torch.utils._pytree.tree_unflatten(leaves, spec)  # (unread statistics: a leaf, still unread)
        assert isinstance(back.stats, torch.Tensor) and (back.scale_min, back.scale_max, back.has_nan) == (lo, hi, nan)
    folded = mxkit.pack_weight(w4 := mxkit.quantize(torch.randn(32, 64, generator=rng), "mxfp4"))
    assert folded.stats == scale_extrema(w4.scale)


def test_pack_weight_act_builds_only_what_the_activations_read(rng):
    """pack_weight(act=...): float activations get the decode-mma layout and no FP8 fold (a W4A16 MXLinear's
    weight: its MX bytes twice, not four times); FP8 rowwise / MX activations get the fold and no decode
    layout; an MXFP8 E4M3 weight with MX or float activations and an E5M2 one with float activations get the a8w8
    layout; MXLinear packs per its act_format."""
    from mxkit.nn import MXLinear

    w4 = mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp4")
    full, flt, fp8 = (mxkit.pack_weight(w4, act=a) for a in (None, "float", "fp8_rowwise"))
    assert full.folded is not None and full.mma_q is not None
    assert flt.folded is None and flt.mma_q is not None and flt.nbytes == 2 * w4.nbytes
    assert fp8.folded is not None and fp8.mma_q is None and torch.equal(fp8.folded.data.view(torch.uint8),
                                                                        full.folded.data.view(torch.uint8))
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):  # the a8w8 layout, read by w8a16-mma (and E4M3 x E4M3 by a8w8-mma)
        w8 = mxkit.quantize(torch.randn(64, 128, generator=rng), fmt)
        pw8 = mxkit.pack_weight(w8, act="float")
        assert pw8.mma_q is not None and pw8.folded is None and pw8.nbytes == 2 * w8.nbytes
    assert mxkit.pack_weight(w8, act="mx").mma_q is None  # (E5M2 x MX: no kernel reads that layout)
    assert mxkit.pack_weight(mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp8_e4m3"), act="mx").mma_q \
        is not None
    with pytest.raises(ValueError, match="act="):
        mxkit.pack_weight(w4, act="bf16")
    lin = torch.nn.Linear(128, 64)
    for act, folded, mma in ((None, False, True), ("fp8_e4m3_rowwise", True, False), ("mxfp4", True, False)):
        m = MXLinear.from_linear(lin, "mxfp4", act_format=act)
        pw = mxkit.pack_weight(m.weight_mx, act={None: "float", "mxfp4": "mx"}.get(act, "fp8_rowwise"))
        assert (pw.folded is not None, pw.mma_q is not None) == (folded, mma)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mxint8"])
def test_pack_weight_of_other_blocks_takes_the_exact_paths(fmt, block_size, rng):
    """A weight of 16- or 64-element blocks packs (every act) with none of the 32-element layouts (fold, small-M,
    MXFP6 twin), and its GEMMs with float and MX activations stay within the bound of the float64 product of the
    dequantized operands."""
    w = mxkit.quantize(torch.randn(48, 256, generator=rng), fmt, block_size=block_size)
    x = torch.randn(5, 256, generator=rng)
    xq = mxkit.quantize(x, "mxfp8_e4m3", block_size=block_size)
    for act in (None, "float", "mx"):
        p = mxkit.pack_weight(w, act=act)
        assert p.folded is None and p.mma_q is None and p.wide is None
        a = xq if act == "mx" else x
        assert_within_bound(mxkit.matmul(a, p), a, p)
    # backend="triton" plans for them too (it chose fold-fp8 / w4a8-fp8 with no fold to read: an AttributeError),
    # FP8 rowwise, MX of 32 and of the weight's blocks, and folded activations
    for a in (mxkit.quantize_fp8_rowwise(x), mxkit.quantize(x, "mxfp4"), xq, mxkit.quantize_fold(x, "mxfp4")):
        for b in (w, mxkit.pack_weight(w)):
            assert mxkit.gemm_plan(a, b, backend="triton").path == "fp32-exact"
            assert torch.equal(mxkit.matmul(a, b, backend="triton"), mxkit.matmul(a, b, backend="reference"))
    # 16-bit float activations keep the dense routes, which read any block size (the weight's dequantized cache too)
    xb = x.to(torch.bfloat16)
    for b, path in ((w, "dense-exact"), (mxkit.pack_weight(w, dense=torch.bfloat16), "dense-cached")):
        assert mxkit.gemm_plan(xb, b, backend="triton").path == path
        assert_within_bound(mxkit.matmul(xb, b, backend="triton"), xb, w)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_gpu_weight_of_64_element_blocks(fmt, rng):
    """On CUDA a weight of 64-element blocks (no 32-element layout) multiplies bf16 and MX activations at M = 1
    and 64 within the bound of the float64 product, packed and not (bf16 rows on the dense routes under auto, the
    dequantized cache where kept), and through MXLinear."""
    from mxkit.nn import MXLinear

    w = mxkit.quantize(torch.randn(128, 512, generator=rng).cuda(), fmt, block_size=64)
    for M in (1, 64):
        x = torch.randn(M, 512, generator=rng).cuda().to(torch.bfloat16)
        for b, path in ((w, "dense-exact"), (mxkit.pack_weight(w), "dense-exact"),
                        (mxkit.pack_weight(w, dense=torch.bfloat16), "dense-cached")):
            assert mxkit.gemm_plan(x, b).path == path  # (auto ran the float32 reference, the dense cache unread)
            assert_within_bound(mxkit.matmul(x, b), x, b)
        xq = mxkit.quantize(x, "mxfp8_e4m3", block_size=64)
        assert_within_bound(mxkit.matmul(xq, mxkit.pack_weight(w, act="mx")), xq, w)
    lin = torch.nn.Linear(512, 128).cuda().to(torch.bfloat16)
    m = MXLinear.from_linear(lin, fmt, block_size=64)
    x = torch.randn(3, 512, generator=rng).cuda().to(torch.bfloat16)
    assert_within_bound(m(x), x, m.weight_mx, lin.bias.detach())
    assert mxkit.gemm_plan(x, m._packed).path == "dense-exact"
    from conftest import assert_graph_replays

    with torch.no_grad():  # (packed at construction: the scale statistics read then, none in the capture)
        assert_graph_replays(m, [x.clone()], lambda: [torch.randn(3, 512, generator=rng).cuda().to(torch.bfloat16)])
    # activations quantized in blocks of 64 too, the FP4 / FP6 ones included (they raised from the fold kernel,
    # which takes blocks of 32 only: the fold is defined for them): the exact path, within the bound of the
    # quantized operands
    for act in ("mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"):
        m = MXLinear.from_linear(lin, fmt, act_format=act, block_size=64)
        with torch.no_grad():
            y = m(x)
        assert_within_bound(y, mxkit.quantize(x, act, block_size=64), m.weight_mx, lin.bias.detach())


def test_mxlinear_on_cpu_is_within_the_bound(rng):
    """MXLinear on the CPU (matmul's reference backend there) for float, MXFP4 and FP8-rowwise activations: within
    the row bound of its quantized operands (NaN rows included in the check)."""
    from mxkit.nn import MXLinear

    lin = torch.nn.Linear(96, 40)
    x = torch.randn(3, 96, generator=rng)
    for act in (None, "mxfp4", "fp8_e4m3_rowwise"):
        m = MXLinear.from_linear(lin, "mxfp4", act_format=act)
        with torch.no_grad():
            y = m(x)
        a = x if act is None else (mxkit.quantize_fp8_rowwise(x) if act == "fp8_e4m3_rowwise"
                                   else mxkit.quantize(x, act))
        assert mxkit.gemm_plan(a, m.weight_mx).path == "reference"
        assert_within_bound(y, a, m.weight_mx, lin.bias.detach())


# ---------------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fa", FORMATS)
@pytest.mark.parametrize("fb", FORMATS)
def test_gpu_every_format_pair(fa, fb, rng):
    a = torch.randn(727, 2880, generator=rng).to(torch.bfloat16).cuda()
    w = torch.randn(200, 2880, generator=rng).to(torch.bfloat16).cuda()  # N % 16 != 0: padded for cuBLAS FP8
    qa, qb = mxkit.quantize(a, fa), mxkit.quantize(w, fb)
    path = "fold-fp8" if fa in FOLDABLE and fb in FOLDABLE else "bf16-exact"
    check(qa, mxkit.pack_weight(qb), path=path, backend="auto")
    if fa == fb:  # a float32 output does not take the FP8 GEMM (its accumulation is below float32 precision)
        check(qa, mxkit.pack_weight(qb), path="bf16-exact", backend="auto", out_dtype=torch.float32)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("spread", [0, 14, 15, 40])
def test_gpu_fold_rows_of_spread(spread, rng):
    qa = rand_mx((33, 2880), "mxfp4_e2m1", rng, spread=spread, device="cuda")
    qb = rand_mx((160, 2880), "mxfp4_e2m1", rng, spread=spread, device="cuda")
    check(qa, mxkit.pack_weight(qb), path="fold-fp8", backend="auto")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M", [1, 3, 727])
def test_gpu_shapes_and_paths(M, rng):
    w = mxkit.quantize(torch.randn(512, 2880, generator=rng).cuda(), "mxfp4")
    pw = mxkit.pack_weight(w)
    a = torch.randn(M, 2880, generator=rng).to(torch.bfloat16).cuda()
    check(a, pw, backend="auto", path="decode-mma" if M <= 16 else "dense-exact")  # a small layer: not wgmma
    check(a.to(torch.float16), pw, backend="auto", path="decode-w16" if M <= 16 else "dense-exact")  # fp16 x
    folded = mxkit.quantize_fold(a, "mxfp4")
    check(folded, pw, backend="auto", path="fold-fp8")
    # (check's bound reads the fold's own values: that they are quantize's MX values is checked here)
    assert torch.equal(values64(folded), values64(mxkit.quantize(a, "mxfp4")))
    check(mxkit.quantize_fp8_rowwise(a), pw, backend="auto", path="w4a8-fp8")
    check(mxkit.quantize(a, "mxfp6_e2m3"), pw, backend="auto", path="fold-fp8",
          bias=torch.randn(512, generator=rng).cuda())
    a3 = torch.randn(2, M, 2880, generator=rng).to(torch.bfloat16).cuda()
    folded3 = mxkit.quantize_fold(a3, "mxfp4")
    y, _ = check(folded3, pw, backend="auto", path="fold-fp8")
    assert y.shape == (2, M, 512)
    assert torch.equal(values64(folded3).reshape(-1, 2880), values64(mxkit.quantize(a3, "mxfp4")))


@pytest.mark.parametrize("N,K", [(8, 32), (40, 2880), (16, 2912), (24, 4096)])
def test_w4a16_wgmma_pack_roundtrip(N, K, rng):
    """The wgmma layout holds the same codes and scale bytes (K padded to a multiple of 64 with zero bytes):
    lane c's 8 bytes of a 64-column step are bytes c, c + 4, ..., c + 28 of the step, contiguous; the scales
    are step-major; one_mul says whether every scale byte is <= 128."""
    from mxkit.kernels.matmul_details._layout_wgmma import pack_wgmma, unpack_wgmma

    w = rand_mx((N, K), "mxfp4_e2m1", rng, base=125)
    q, st, one_mul = pack_wgmma(w.qdata, w.scale)
    Kp = -(-K // 64) * 64
    assert q.shape == (N, Kp // 2) and st.shape == (Kp // 64, 2 * N) and one_mul
    qd, sc = unpack_wgmma(q, st, K)
    assert torch.equal(qd, w.qdata) and torch.equal(sc, w.scale)
    if K >= 64:
        assert torch.equal(q[3, 8 * 2 + 5], w.qdata[3, 2 + 4 * 5])  # step 0, lane c = 2, register i = 5
        assert torch.equal(st[0, 2 * 5 + 1], w.scale[5, 1])
    if Kp != K:  # the padding: zero codes and zero scale bytes in the last step
        last = q[:, -32:].view(N, 4, 8).transpose(1, 2).reshape(N, 32)
        assert (last[:, (K % 64) // 2:] == 0).all() and (st[-1].view(N, 2)[:, (K % 64) // 32:] == 0).all()
    w.scale[0, 0] = 129
    assert not pack_wgmma(w.qdata, w.scale)[2]
    with pytest.raises(ValueError, match="N % 8"):
        pack_wgmma(w.qdata[:5], w.scale[:5])


@pytest.mark.parametrize("N,K", [(8, 32), (40, 2880), (16, 2912), (24, 4096)])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_w8a16_wgmma_pack_roundtrip(N, K, fmt, rng):
    """The FP8 wgmma layout holds the same codes and scale bytes (K padded to a multiple of 64 with zero bytes):
    lane c's 16 codes of a 64-column step are columns 8 i + 2 c + e (register j = 2 i + e), contiguous; the
    scales step-major; one_mul from the largest scale byte (E4M3: <= 134, E5M2: <= 142)."""
    from mxkit.kernels.matmul_details._layout_wgmma import FP8, pack_wgmma8, unpack_wgmma8

    elem = fmt[-4:]
    w = rand_mx((N, K), fmt, rng, base=125)
    q, st, one_mul = pack_wgmma8(w.qdata, w.scale, elem, int(w.scale.max()))
    Kp = -(-K // 64) * 64
    assert q.shape == (N, Kp) and st.shape == (Kp // 64, 2 * N) and one_mul
    qd, sc = unpack_wgmma8(q, st, K)
    assert torch.equal(qd, w.qdata) and torch.equal(sc, w.scale)
    if K >= 64:
        assert torch.equal(q[3, 16 * 2 + 2 * 5 + 1], w.qdata[3, 8 * 5 + 2 * 2 + 1])  # lane c = 2, i = 5, e = 1
    if Kp != K:  # the padding: zero codes in the last step
        last = q[:, -64:].view(N, 4, 8, 2).permute(0, 2, 1, 3).reshape(N, 64)
        assert (last[:, K % 64:] == 0).all()
    limit = FP8[elem][3]
    assert pack_wgmma8(w.qdata, w.scale, elem, limit)[2] and not pack_wgmma8(w.qdata, w.scale, elem, limit + 1)[2]
    with pytest.raises(ValueError, match="N % 8"):
        pack_wgmma8(w.qdata[:5], w.scale[:5], elem, 127)


def _run_ptx(asm: str, regs: dict) -> dict:
    """A small interpreter of the decode asm's instructions (mov, prmt, shr, and, lop3, mul.rn.bf16x2) on 32-bit
    registers; ``regs`` maps "$i" to values. Returns the registers."""
    import struct

    def bf16(h):  # bits -> float
        return struct.unpack("<f", struct.pack("<I", h << 16))[0]

    def to_bf16(v):  # float (a product of two bf16: exact in float32) -> bits, rounded to nearest even
        return int(torch.tensor([v], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF

    def val(t):
        t = t.strip()
        return int(t, 0) if t[0].isdigit() else regs[t]

    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        v = [val(a) for a in src]
        if op == "mov.b32":
            r = v[0]
        elif op == "prmt.b32":
            pool = [(v[0] >> (8 * i)) & 0xFF for i in range(4)] + [(v[1] >> (8 * i)) & 0xFF for i in range(4)]
            r = sum(pool[(v[2] >> (4 * i)) & 7] << (8 * i) for i in range(4))
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "lop3.b32":
            assert v[3] == 0xEA  # (a & b) | c
            r = (v[0] & v[1]) | v[2]
        elif op == "mul.rn.bf16x2":
            r = sum(to_bf16(bf16((v[0] >> (16 * i)) & 0xFFFF) * bf16((v[1] >> (16 * i)) & 0xFFFF)) << (16 * i)
                    for i in range(2))
        else:
            raise AssertionError(f"unknown instruction {op}")
        regs[d] = r & 0xFFFFFFFF
    return regs


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_w8a16_decode_asm_exact(fmt):
    """The kernel's FP8 decode (the PTX it inlines, run by a small interpreter): every finite E4M3 / E5M2 code,
    subnormals and negative zero included, times 2^(s - 127) for scale bytes across the bf16-exact envelope,
    bit-equal to the reference value in bf16; the one-multiply form for scale bytes up to its limit, the
    two-multiply form everywhere (the kernel feeds the factor as a bf16, as ``_e8m0_bf16`` makes it)."""
    from mxkit.formats import decode_elements
    from mxkit.kernels.matmul_details._layout_wgmma import FP8, _fp8_pairs_asm

    f = get_format(fmt)
    elem = fmt[-4:]
    _, _, r, limit = FP8[elem]
    codes = torch.arange(256, dtype=torch.int32)
    vals = decode_elements(codes, f).to(torch.float64)
    finite = torch.isfinite(vals)
    lo, hi = exact_scale_range(f, torch.bfloat16)

    def factor_bits(e):  # _e8m0_bf16: 2^(e - 127) as bf16 bits
        return 0x0040 if e == 0 else e << 7

    for s in sorted({lo, lo + 1, 100, 127, 130, limit, min(hi, limit + 3), hi}):
        for one in (True, False):
            if one and s > limit:
                continue
            asm = _fp8_pairs_asm(elem, one)
            fb = factor_bits(s + r if one else s)
            fac = fb | (fb << 16)
            for c0 in range(0, 256, 4):
                word = sum((c0 + i) << (8 * i) for i in range(4))
                out = _run_ptx(asm, {"$2": word, "$3": fac, "$4": fac})
                for i in range(4):
                    c = c0 + i
                    if not finite[c]:
                        continue
                    got = (out[f"${i // 2}"] >> (16 * (i % 2))) & 0xFFFF
                    want = vals[c] * 2.0 ** (s - 127)
                    wb = int(torch.tensor([want]).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF
                    assert got == wb, (fmt, s, one, hex(c), hex(got), hex(wb))


def test_w4a16_wgmma_rejects_a_layout_it_does_not_read():
    """FP8 codes are read in the wgmma layout only (the decode-mma layout is E2M1's), and unknown names are
    refused before anything is launched."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as W
    from mxkit.kernels.matmul_details._wgmma_gluon import gluon

    if isinstance(gluon(), str):
        pytest.skip(gluon())
    x, q, st = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.uint8), torch.zeros(1, 16)
    for layout, elem in (("mma", "e4m3"), ("mma", "e5m2"), ("wgmma", "e3m2"), ("nvidia", "e2m1")):
        with pytest.raises(ValueError, match="wgmma layout only"):
            W.w4a16_wgmma(x, q, st, 8, True, layout=layout, elem=elem)
    assert {name: m.ELEMS for name, m in W.LAYOUTS.items()} == {"wgmma": ("e2m1", "e4m3", "e5m2"), "mma": ("e2m1",)}


def test_w4a16_wgmma_kernels_differ_by_layout_and_block():
    """Each (layout, element, block size) has its own kernel, built around its layout module's Gluon pieces, whose
    layouts reach it as closure constexprs: Triton's cache key (its on-disk compile cache's) must tell every pair
    apart, or one layout's cached binary would run on another's bytes."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as W
    from mxkit.kernels.matmul_details._wgmma_gluon import gluon

    if isinstance(gluon(), str):
        pytest.skip(gluon())
    keys = {(layout, elem, bm): W._kernel(layout, elem, bm).cache_key
            for layout, m in W.LAYOUTS.items() for elem in m.ELEMS for bm in (32, 64, 128, 256)}
    assert len(set(keys.values())) == len(keys) == 16
    assert W._kernel("mma", "e2m1", 64) is W._kernel("mma", "e2m1", 64)  # (built once)


def test_w4a16_wgmma_prepared_key_tells_problems_apart(monkeypatch):
    """A prepared wgmma launch is reused only by calls of its problem: the key changes with x's shape, strides and
    dtype, the weight's shape, the output dtype, the bias's dtype / shape / strides, a given y's dtype / shape /
    strides, the expert table's size and dtype, the flags, the split, the A/B settings in force, the alignment and
    the devices; and it does not change with the tensors' data. dense_prepared finds nothing before a call."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as W

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("MXKIT_WGMMA_WS", raising=False)
    monkeypatch.delenv("MXKIT_WGMMA_PERSIST", raising=False)
    x, q = torch.zeros(64, 256, dtype=torch.bfloat16), torch.zeros(128, 128, dtype=torch.uint8)
    b, y, e = torch.zeros(128), torch.zeros(64, 128), torch.zeros(2, 8, dtype=torch.int32)

    def key(x=x, q=q, N=128, one_mul=True, out=torch.bfloat16, bias=None, y=None, e=None, bm=64, act=None,
            layout="wgmma", perm=False, starts=False, split=1, elem="e2m1", aligned=True):
        return W._key(x, q, N, one_mul, out, bias, y, e, bm, act, layout, perm, starts, split, elem, aligned)

    base = key()
    assert key(x=torch.ones(64, 256, dtype=torch.bfloat16)) == base  # (the data is not part of it)
    others = [key(x=torch.zeros(32, 256, dtype=torch.bfloat16)), key(x=torch.zeros(64, 512, dtype=torch.bfloat16)[:, :256]),
              key(x=torch.zeros(64, 256, dtype=torch.float16)), key(q=torch.zeros(128, 64, dtype=torch.uint8)),
              key(N=64), key(one_mul=False), key(out=torch.float32), key(bias=b), key(bias=b.double()),
              key(bias=torch.zeros(256)[::2]), key(y=y), key(y=torch.zeros(64, 256)[:, :128]), key(e=e),
              key(e=e.long()), key(e=torch.zeros(2, 4, dtype=torch.int32)), key(bm=128), key(act="swiglu"),
              key(layout="mma"), key(perm=True), key(starts=True), key(split=2), key(elem="e4m3"),
              key(aligned=False)]
    assert base not in others and len(set(others)) == len(others)
    monkeypatch.setenv("MXKIT_WGMMA_PERSIST", "1")
    assert key() != base
    monkeypatch.setenv("MXKIT_WGMMA_WS", "0")
    assert key() not in (base, key(split=3))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert key() != base
    W._PREPARED.clear()
    assert W.dense_prepared(x, q, 128, True, torch.bfloat16, 64, 1, "e2m1") is None
    # its constexprs are flags (the layouts are the kernel's own), so the launcher's key is quick to hash
    prep = W._Prepared(x, q, 128, True, False, None, None, 64, None, "wgmma", False, False, 1, "e2m1", torch.bfloat16)
    assert prep.consts and all(type(v) in (bool, int) for _, v in prep.consts), prep.consts


@pytest.mark.parametrize("bm,grouped,act,out,schedule,mma,w8", [
    (256, False, 0, "bf16", 1, False, 0), (128, False, 0, "fp32", 1, False, 0),
    (64, True, 1, "bf16", 1, False, 0), (32, True, 2, "bf16", 1, False, 0), (256, True, 0, "fp32", 1, False, 0),
    (256, False, 0, "bf16", 0, False, 0), (64, True, 1, "bf16", 0, False, 0),
    (256, True, 1, "bf16", 1, True, 0), (32, True, 2, "bf16", 0, True, 0), (128, True, 0, "fp32", 1, True, 0),
    (64, True, 0, "fp32", 0, True, 0), (256, False, 0, "bf16", 1, False, 1), (64, False, 0, "fp32", 0, False, 1),
    (128, False, 0, "bf16", 1, False, 2), (64, False, 0, "bf16", 0, False, 2),
    (256, False, 0, "fp32", 2, False, 0), (256, True, 1, "bf16", 2, True, 0), (128, True, 0, "fp32", 2, True, 0),
    (128, True, 1, "bf16", 2, False, 1), (256, False, 0, "bf16", 2, False, 2)])
def test_w4a16_wgmma_compiles_for_sm90(bm, grouped, act, out, schedule, mma, w8):
    """The Gluon kernel builds for sm_90 on the CPU (the installed Triton's compiler and ptxas): dense and grouped
    (expert blocks, fused activation), every block size the dispatch uses, each schedule (0: every warp, 1: a
    one-warp TMA producer, the default, 2: that persistent), its own weight layout and the decode kernel's (mma:
    the layout conversions asserted free), blocks at the rows of a table (grouped: with and without STARTS, the
    MoE's mixed block sizes), and MXFP8 weights (w8: E4M3, E5M2). Its results are checked by the GPU tests (the
    interpreter does not run Gluon)."""
    from conftest import compile_gluon_sm90

    from mxkit.kernels.matmul_details import _w4a16_wgmma as W
    from mxkit.kernels.matmul_details._wgmma_gluon import BN, WARPS, gluon, u8_layout

    if isinstance(gluon(), str):
        pytest.skip(gluon())
    gl = gluon()[1]
    xl = gl.NVMMASharedLayout.get_default_for([bm, 64], gl.bfloat16)
    w_ty, s_ty = (f"u8[{BN // 16}, 2, 256],{u8_layout(3)}", f"u8[{BN // 16}, 32],{u8_layout(2)}") if mma else \
        (f"u8[{BN}, {64 if w8 else 32}],{u8_layout(2)}", f"u8[1, {2 * BN}],{u8_layout(2)}")
    sig = {"x_desc": f"tensordesc<bf16[{bm}, 64],{xl}>", "w_desc": f"tensordesc<{w_ty}>",
           "s_desc": f"tensordesc<{s_ty}>", "y_ptr": "*" + out, "b_ptr": "*fp32", "e_ptr": "*i32",
           "M": "i32", "N": "i32", "ALL_STEPS": "i32", "KSTEPS": "i32", "stride_ym": "i32", "stride_yk": "i32",
           "NB": "i32"}
    layout, elem = ("mma", "e2m1") if mma else ("wgmma", ("e2m1", "e4m3", "e5m2")[w8])
    for starts in (False, True) if grouped else (False,):
        cx = dict(STAGES=W.STAGES, ONE_MUL=act != 1, HAS_BIAS=True, GROUPED=grouped, ACT=act, SCHEDULE=schedule,
                  PERM_OUT=mma and act != 0, STARTS=starts, num_warps=WARPS)
        k = compile_gluon_sm90(W._kernel(layout, elem, bm), sig, cx, WARPS, ("y_ptr", "b_ptr", "e_ptr"))
        assert len(k.asm["cubin"]) > 0 and "wgmma.mma_async" in k.asm["ptx"]


@pytest.mark.gpu
@gpu
def test_gpu_w4a16_wgmma_envelope():
    """The packaged table: the wgmma kernel for bf16 x MXFP4 on large layers up to the GPU's max_m (default
    entry: 2048; the H100's: 4096), dense-exact past it and on small layers; on weights of N * K >= small_min_nk up
    to the GPU's small_max_m (H200: 256), and where the GPU has one its mid envelope (H200: M <= 512 on
    N * K >= 2^24)."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg
    from mxkit.kernels.matmul_table import _envelope

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    env = _envelope(torch.device("cuda"), "w4a16_wgmma")
    big = mxkit.pack_weight(mxkit.quantize(torch.randn(8192, 8192, device="cuda") / 8, "mxfp4"))
    small = mxkit.pack_weight(mxkit.quantize(torch.randn(5120, 2880, device="cuda") / 8, "mxfp4"))
    top = env["max_m"]
    for M, w, path in ((128, big, "w4a16-wgmma"), (top, big, "w4a16-wgmma"), (top + 1, big, "dense-exact"),
                       (1024, small, "dense-exact")):
        a = torch.empty(M, w.shape[1], dtype=torch.bfloat16, device="cuda")
        assert mxkit.gemm_plan(a, w).path == path, (M, w.shape, env)
    # the small-M envelope (the split schedule) on a weight of N * K = small_min_nk, below min_nk: its edge, within
    # the bound there
    n = env["small_min_nk"] // 4096
    if env["small_max_m"] and n * 4096 < env["min_nk"]:
        mid = mxkit.pack_weight(mxkit.quantize(torch.randn(n, 4096, device="cuda") / 8, "mxfp4"))
        for M, path in ((env["small_max_m"], "w4a16-wgmma"), (env["small_max_m"] + 1, "dense-exact")):
            a = torch.randn(M, 4096, device="cuda").to(torch.bfloat16)
            assert mxkit.gemm_plan(a, mid).path == path, (M, mid.shape, env)
        check(torch.randn(env["small_max_m"], 4096, device="cuda").to(torch.bfloat16), mid, backend="auto",
              path="w4a16-wgmma")
    # a GPU's third envelope (H200: M <= 512 on N * K >= 2^24), at its edge on a weight of N * K = mid_min_nk
    n = env.get("mid_min_nk", 0) // 4096
    if env.get("mid_max_m") and n * 4096 < env["min_nk"] and env["mid_max_m"] > env["small_max_m"]:
        w = mxkit.pack_weight(mxkit.quantize(torch.randn(n, 4096, device="cuda") / 8, "mxfp4"))
        for M, path in ((env["mid_max_m"], "w4a16-wgmma"), (env["mid_max_m"] + 1, "dense-exact")):
            a = torch.empty(M, 4096, dtype=torch.bfloat16, device="cuda")
            assert mxkit.gemm_plan(a, w).path == path, (M, w.shape, env)
        check(torch.randn(env["mid_max_m"], 4096, device="cuda").to(torch.bfloat16), w, backend="auto",
              path="w4a16-wgmma")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,N,K", [(1, 256, 4096), (33, 520, 2880), (64, 4096, 14336), (100, 384, 2912)])
def test_gpu_w4a16_wgmma_split_k(M, N, K, rng):
    """Split-K (the kernel's K steps over 2 to 8 programs per tile, float32 partials added in a fixed order):
    every split and tile within the float64 bound row by row, with bias and both output dtypes, deterministic
    (a second run gives the same bytes), an uneven split (45 or 46 K steps); and the plan takes it at M = 64 on
    4096 x 14336 (dense_schedule: 64-token tiles, split 4: 128 programs, one an SM)."""
    from mxkit.kernels.matmul import pack_weight
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    w = rand_mx((N, K), "mxfp4_e2m1", rng, base=126, device="cuda")
    pw = pack_weight(w, act="float")
    q, st, one = wg.packed_of(pw)
    a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=rng).cuda()
    for bm in (64, 128):
        for split in (1, 2, 4, 8):
            for out, b in ((torch.bfloat16, None), (torch.float32, bias)):
                y = wg.w4a16_wgmma(a, q, st, N, one, out, b, bm=bm, split=split)
                assert y.shape == (M, N) and y.dtype == out
                assert_within_bound(y, a, pw, b)
                assert torch.equal(y, wg.w4a16_wgmma(a, q, st, N, one, out, b, bm=bm, split=split))
    if (M, N, K) == (64, 4096, 14336):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert wg.dense_schedule(M, N, K, a.device) == (64, 4 if sms >= 128 else 2)
        y, plan = check(a, pw, backend="auto", bias=bias, path="w4a16-wgmma")
    with pytest.raises(ValueError, match="split-K"):
        wg.w4a16_wgmma(a, q, st, N, one, y=torch.empty(M, N, dtype=torch.bfloat16, device="cuda"), split=2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,N,K", [(17, 200, 2880), (129, 512, 4096), (727, 1000, 2912), (1024, 5120, 2880)])
@pytest.mark.parametrize("base", [125, 140])
@pytest.mark.parametrize("ws", ["1", "0"])
def test_gpu_w4a16_wgmma(M, N, K, base, ws, rng, monkeypatch):
    """The Hopper prefill kernel (its envelope widened to these shapes by a table override) against the float64
    bound: K not a multiple of 64 (2912) or of 128 (2880), N not a multiple of the 128-row tile, 3-D and strided
    activations, bias, float32 out, both decodes (every scale byte <= 128: one multiply; above: two), a NaN
    scale byte (its output column NaN), an output poisoned before the kernel writes it; warp-specialized (the
    default) and the single-partition loop (MXKIT_WGMMA_WS=0)."""
    monkeypatch.setenv("MXKIT_WGMMA_WS", ws)
    from mxkit.kernels.matmul import gemm_table_override, pack_weight
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    w = rand_mx((N, K), "mxfp4_e2m1", rng, base=base, device="cuda")
    pw = pack_weight(w)
    assert wg.packed_of(pw)[2] == (base <= 125)
    # (the bias at the product's size: a unit bias under 2^(base - 127) weights was below the bound's slack at the
    # high bases, so a GEMM that dropped it passed)
    bias = (torch.randn(N, generator=rng) * 2.0 ** (base - 127) * K ** 0.5).cuda()
    table = {"w4a16_wgmma": {"max_m": 4096, "min_nk": 0}, "decode_mma": {"max_m": 16}, "a8w8_mma": {"max_m": 64},
             "decode_w4a16": {"max_m": 16, "configs": []}}
    with gemm_table_override({"default": table}):
        a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        y, _ = check(a, pw, backend="auto", path="w4a16-wgmma")
        check(a, pw, backend="auto", bias=bias, out_dtype=torch.float32, path="w4a16-wgmma")
        a3 = torch.randn(2, M, K + 64, generator=rng).to(torch.bfloat16).cuda()[..., 32:K + 32]  # strided
        y3, _ = check(a3, w, backend="auto", bias=bias, path="w4a16-wgmma")  # unpacked: packed per call
        assert y3.shape == (2, M, N)
        q, st, one = wg.packed_of(pw)
        bm, split = wg.dense_schedule(M, N, K, a.device)
        assert torch.equal(wg.w4a16_wgmma(a.contiguous(), q, st, N, one, bm=bm, split=split), y)  # the plan's
        poisoned = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        got = wg.w4a16_wgmma(a.contiguous(), q, st, N, one, torch.bfloat16, None, y=poisoned, bm=bm)  # split 1
        assert not torch.isnan(got).any()
        assert_within_bound(got, a, pw, None)
        # a NaN scale byte: its output column is NaN, the other columns are the same bits (the two-multiply
        # decode, which a NaN byte selects, is exact as the one-multiply one is)
        wn = MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, w.shape)
        wn.scale[7, 3] = 0xFF
        yn = mxkit.matmul(a, pack_weight(wn), backend="auto")
        assert mxkit.gemm_plan(a, pack_weight(wn), backend="auto").path == "w4a16-wgmma"
        assert torch.isnan(yn[:, 7]).all()
        keep = torch.arange(N, device="cuda") != 7
        assert torch.equal(yn[:, keep], y[:, keep])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,N,K,bm", [(4000, 5120, 2880, 256), (2048, 1000, 4096, 128), (700, 8192, 2912, 256)])
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_gpu_wgmma_persistent_same_bytes(M, N, K, bm, fmt, rng, monkeypatch):
    """Dense calls of the wgmma kernel on its persistent schedule (one program an SM over the tiles in launch
    order: here 2-5 tiles a program; off by default for dense calls, MXKIT_WGMMA_PERSIST=1) give the bytes of one
    program a tile (MXKIT_WGMMA_PERSIST=0), bf16 out and float32 out with a bias, M and N not multiples of the
    tile, K of odd (45) and even step counts, into NaN-poisoned outputs; and within the float64 bound."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    w = rand_mx((N, K), fmt, rng, device="cuda")
    pw = mxkit.pack_weight(w)
    q, st, one = wg.packed_of(pw)
    elem = wg.FP8_ELEMS.get(fmt, "e2m1")
    a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=rng).cuda()
    for out, b in ((torch.bfloat16, None), (torch.float32, bias)):
        got = []
        for persist in ("1", "0"):
            monkeypatch.setenv("MXKIT_WGMMA_PERSIST", persist)
            y = torch.full((M, N), float("nan"), dtype=out, device="cuda")
            got.append(wg.w4a16_wgmma(a, q, st, N, one, out, b, y=y, bm=bm, elem=elem))
        assert not torch.isnan(got[0]).any()
        assert torch.equal(got[0].view(torch.uint8), got[1].view(torch.uint8))
        assert_within_bound(got[0], a, pw, b)


def test_pack_weight_fp8_nonfinite_codes_count_as_nan(rng):
    """An MXFP8 weight with a NaN (E4M3 0x7F / 0xFF) or Inf (E5M2 exponent all ones) element code reads
    has_nan, so it stays off the wgmma kernel (whose decode does not keep them); finite codes do not."""
    for fmt, code in (("mxfp8_e4m3", 0x7F), ("mxfp8_e4m3", 0xFF), ("mxfp8_e5m2", 0x7C), ("mxfp8_e5m2", 0xFE)):
        w = rand_mx((16, 64), fmt, rng)
        assert not mxkit.pack_weight(w, act="float").has_nan
        w.qdata[3, 17] = code
        for act in ("float", None):
            assert mxkit.pack_weight(w, act=act).has_nan, (fmt, hex(code), act)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,N,K", [(17, 200, 2880), (64, 4096, 4096), (129, 512, 4096), (727, 1000, 2912),
                                   (1024, 5120, 2880)])
@pytest.mark.parametrize("fmt,base", [("mxfp8_e4m3", 120), ("mxfp8_e4m3", 140), ("mxfp8_e5m2", 110),
                                      ("mxfp8_e5m2", 146)])
def test_gpu_w8a16_wgmma(M, N, K, fmt, base, rng):
    """MXFP8 weights on the Hopper wgmma kernel (its envelope widened to these shapes by a table override)
    against the float64 bound row by row: bf16 activations (3-D and strided, bias, float32 out, split-K at small
    M), MXFP8 / MXFP4 activations dequantized to bf16 (a row with a scale byte outside bf16's range recomputed by
    the fix-up kernel; a NaN scale byte: its row NaN), both decodes (one multiply up to scale byte 134 / 142, two
    above), deterministic; a weight holding a NaN code takes dense-exact (its column NaN)."""
    from mxkit.kernels.matmul import gemm_table_override, pack_weight
    from mxkit.kernels.matmul_details import _layout_wgmma
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    w = rand_mx((N, K), fmt, rng, base=base, device="cuda")
    pw = pack_weight(w, act="float")
    assert wg.packed_of(pw)[2] == (base + 3 <= _layout_wgmma.FP8[fmt[-4:]][3])
    bias = (torch.randn(N, generator=rng) * 2.0 ** (base - 127) * K ** 0.5).cuda()  # (at the product's size)
    table = {"w8a16_wgmma": {"max_m": 4096, "min_nk": 0}, "decode_mma": {"max_m": 16}, "a8w8_mma": {"max_m": 0},
             "decode_w4a16": {"max_m": 16, "configs": []}}
    with gemm_table_override({"default": table}):
        a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        y, _ = check(a, pw, backend="auto", path="w8a16-wgmma")
        assert torch.equal(y, mxkit.matmul(a, pw, backend="auto"))
        check(a, pw, backend="auto", bias=bias, out_dtype=torch.float32, path="w8a16-wgmma")
        a3 = torch.randn(2, M, K + 64, generator=rng).to(torch.bfloat16).cuda()[..., 32:K + 32]  # strided
        y3, _ = check(a3, pw, backend="auto", bias=bias, path="w8a16-wgmma")
        assert y3.shape == (2, M, N)
        q, st, one = wg.packed_of(pw)
        from conftest import poison_allocator

        for split in (1, 2):  # (poisoned first: the same product was just computed and freed)
            poison_allocator()
            got = wg.w4a16_wgmma(a, q, st, N, one, torch.bfloat16, None, bm=64 if M <= 64 else 128, split=split,
                                 elem=fmt[-4:])
            assert_within_bound(got, a, pw, None)
        for afmt in ("mxfp8_e4m3", "mxfp4_e2m1"):
            am = mxkit.quantize(a * 4, afmt)
            if afmt == "mxfp8_e4m3":  # below E4M3's bf16-exact range: the fix-up's row (above it, the values
                # pass float32's range: Inf there, as in the reference, where the float64 bound has none)
                am.scale[min(5, M - 1), 0] = exact_scale_range(get_format(afmt), torch.bfloat16)[0] - 1
            if M > 2:
                am.scale[1, 1] = 0xFF
            check(am, pw, backend="auto", bias=bias, path="w8a16-wgmma")
        am = mxkit.quantize(a * 4, "mxfp8_e4m3")
        am.scale[0, 0] = 250  # values past float32's largest: Inf in every path, as in the reference (a stated case)
        yh = mxkit.matmul(am, pw, backend="auto")
        want = mxkit.matmul(am, pw, backend="reference")
        assert not torch.isfinite(want[0]).any() and not torch.isfinite(yh[0]).any()
        assert torch.equal(torch.isnan(yh[0]).cpu(), torch.isnan(want[0]).cpu())  # (NaN for ±Inf would pass above)
        assert torch.equal(yh[0][torch.isinf(yh[0])].cpu(), want[0][torch.isinf(want[0])].to(yh.dtype).cpu())
        rest = MXTensor(am.qdata[1:], am.scale[1:], am.fmt, 1, 32, (M - 1, K))
        if M > 1:
            assert_within_bound(yh[1:], rest, pw)
        wn = MXTensor(w.qdata.clone(), w.scale, w.fmt, 1, 32, w.shape)
        wn.qdata[7, 3] = 0x7F if fmt == "mxfp8_e4m3" else 0x7E
        pn = pack_weight(wn, act="float")
        assert mxkit.gemm_plan(a, pn, backend="auto").path == "dense-exact"
        yn = mxkit.matmul(a, pn, backend="auto")
        keep = torch.arange(N) != 7
        assert torch.isnan(yn[:, 7]).all() and not torch.isnan(yn[:, keep.cuda()]).any()
        assert_within_bound(yn[:, keep.cuda()], a, dequantize_reference(w, torch.float64)[keep])


@pytest.mark.gpu
@gpu
def test_gpu_w8a16_wgmma_envelope():
    """The packaged table: the wgmma kernel for bf16 x packed MXFP8 on large layers up to its max_m, dense-exact
    past it; an unpacked MXFP8 weight stays off it (its codes are not checked for NaN / Inf)."""
    from mxkit.kernels.matmul import _envelope
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    dev = torch.device("cuda")
    if wg.available(dev) is not None:
        pytest.skip(wg.available(dev))
    env = _envelope(dev, "w8a16_wgmma")
    w = mxkit.quantize(torch.randn(8192, 8192, device="cuda") / 8, "mxfp8_e4m3")
    big = mxkit.pack_weight(w, act="float")
    for M, path in ((env["small_max_m"], "w8a16-wgmma"), (env["max_m"], "w8a16-wgmma"),
                    (env["max_m"] + 1, "dense-exact")):
        a = torch.empty(M, 8192, dtype=torch.bfloat16, device="cuda")
        assert mxkit.gemm_plan(a, big).path == path, M
    a = torch.empty(env["max_m"], 8192, dtype=torch.bfloat16, device="cuda")
    assert mxkit.gemm_plan(a, w).path == "dense-exact"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("K,fmt", [(2880, "mxfp4_e2m1"), (4096, "mxfp4_e2m1"), (8192, "mxfp4_e2m1"),
                                   (28672, "mxfp4_e2m1"), (2880, "mxfp8_e4m3"), (8192, "mxfp8_e5m2"),
                                   (4096, "mxint8")])
def test_gpu_decode_w16(K, fmt, rng):
    """The small-M kernel for M in issue #23's list, forced up to 64 by a table override; bias, 3-D x, N not a
    multiple of the tile, the smallest scale byte of the bf16-exact envelope and a large one in the weight."""
    from mxkit.kernels.matmul import gemm_table_override

    N = 200 if K == 28672 else 1000
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt)
    w.scale[3, 1] = exact_scale_range(w.fmt, torch.bfloat16)[0]  # 0 for E2M1; subnormal bf16 products
    w.scale[5, 0] = 200  # large (6 * 2^73): the products stay far from the float32 / bf16 overflow
    pw = mxkit.pack_weight(w)
    bias = torch.randn(N, generator=rng).cuda()
    with gemm_table_override({"default": {"decode_w4a16": {"max_m": 64, "configs": [
            {"k_max": 4096, "block_n": 64, "block_k": 128, "split_k": 8, "num_warps": 4, "num_stages": 2},
            {"k_max": 1 << 30, "block_n": 32, "block_k": 256, "split_k": 3, "num_warps": 4, "num_stages": 3}]}}}):
        for M in (1, 2, 3, 7, 16, 33, 64):
            a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
            check(a, pw, backend="auto", path="decode-w16", bias=bias if M % 2 else None)
            check(a, pw, backend="auto", path="decode-w16", out_dtype=torch.float32)
        y, _ = check(torch.randn(2, 3, K, generator=rng).to(torch.bfloat16).cuda(), pw, backend="auto",
                     path="decode-w16")
        assert y.shape == (2, 3, N)


@triton.jit
def _fp6_tile_kernel(q_ptr, out_ptr, N, K, k_hi, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     W_KIND: tl.constexpr):
    """out [N, K] float32 = the FP6 element values of rows n, elements [k0, k0 + BLOCK_K) (a test kernel)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    k0 = tl.program_id(1) * BLOCK_K
    v = _fp6_tile(q_ptr, n.to(tl.int64), nmask, k0, k_hi, K, BLOCK_N, BLOCK_K, W_KIND)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + n[:, None] * K + k[None, :], v, mask=nmask[:, None] & (k < K)[None, :])


def _check_fp6_tile_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1: the FP6 codes of the decode kernels' weight tile
    (``_mx_weight._fp6_tile``: three bytes to four codes, each to its value) equal the reference's element values
    (dequantize under scale byte 127) for every code of E2M3 and E3M2, ragged rows and a K range that ends inside
    the tile (zeros past it). The bf16 scaling after it is the FP8 kinds' (the interpreter's bf16 is not the
    GPU's: the GPU tests check the whole tile)."""
    import triton
    from conftest import interpreted_rng

    from mxkit.kernels.matmul import W_KINDS

    g = interpreted_rng(_fp6_tile_kernel)
    done = 0
    for fmt in ("mxfp6_e2m3", "mxfp6_e3m2"):
        N, K = 5, 256
        codes = torch.randint(0, 64, (N, K), generator=g, dtype=torch.uint8)
        codes[0, :64] = torch.arange(64, dtype=torch.uint8)  # every code
        qd = pack_codes(codes, get_format(fmt))
        w = MXTensor(qd, torch.full((N, K // 32), 127, dtype=torch.uint8), fmt, 1, 32, (N, K))
        want = dequantize_reference(w, torch.float32)
        for block_n, block_k, k_hi in ((4, 64, K), (8, 128, K), (4, 64, 96), (2, 256, 224)):
            out = torch.full((N, K), float("nan"))
            _fp6_tile_kernel[(triton.cdiv(N, block_n), triton.cdiv(K, block_k))](
                qd, out, N, K, k_hi, BLOCK_N=block_n, BLOCK_K=block_k, W_KIND=W_KINDS[fmt])
            exp = want.clone()
            exp[:, k_hi:] = 0
            assert torch.equal(out.view(torch.int32), exp.view(torch.int32)), (fmt, block_n, block_k, k_hi)
            done += 1
    print(f"interpreter checks passed: {done}")


def test_fp6_tile_interpreted():
    """The decode kernels' FP6 weight codes under Triton's CPU interpreter."""
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_fp6_tile_interpreted")


@triton.jit
def _mx_weight_tile_kernel(q_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           W_KIND: tl.constexpr):
    """out [N, K] bf16 = the weight tile of the decode kernels (``_mx_weight._mx_weight_tile``; a test kernel)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    k0 = tl.program_id(1) * BLOCK_K
    w = _mx_weight_tile(q_ptr, s_ptr, n.to(tl.int64), nmask, k0, K, K, BLOCK_N, BLOCK_K, W_KIND)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + n[:, None] * K + k[None, :], w, mask=nmask[:, None])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_mx_weight_tile_every_code(fmt, rng, poison):
    """The weight tile of the decode and grouped kernels, element by element, is the reference's bf16
    dequantize byte for byte for every element code (MXFP8's NaN and Inf codes, MXINT8's -128 included) under
    random scale bytes of the bf16-exact envelope; a scale byte 255 gives NaN blocks (compared as NaN: the
    payload is not specified)."""
    f = get_format(fmt)
    N, K = 24, 512
    lo, hi = exact_scale_range(f, torch.bfloat16)
    codes = torch.randint(0, 1 << f.bits, (N, K), generator=rng, dtype=torch.int32)
    codes[: (1 << f.bits) // K + 1].view(-1)[: 1 << f.bits] = torch.arange(1 << f.bits, dtype=torch.int32)
    scale = torch.randint(lo, hi + 1, (N, K // 32), generator=rng, dtype=torch.int32)
    scale[0, 0], scale[-1, -1], scale[5, 3] = lo, hi, 255
    w = MXTensor(pack_codes(codes.to(torch.uint8), f), scale.to(torch.uint8), f, 1, 32, (N, K))
    want = dequantize_reference(w, torch.bfloat16)
    wc = w.to("cuda")
    out = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
    _mx_weight_tile_kernel[(triton.cdiv(N, 16), K // 128)](wc.qdata, wc.scale, out, N, K, BLOCK_N=16, BLOCK_K=128,
                                                            W_KIND=W_KINDS[fmt])
    got = out.cpu()
    nan = torch.isnan(want)
    assert nan[5, 96:128].all() and (fmt != "mxfp8_e5m2" or torch.isinf(want).any())
    bad = (torch.isnan(got) != nan) | (~nan & (got.view(torch.int16) != want.view(torch.int16)))
    show = [(n, k, hex(codes[n, k].item()), scale[n, k // 32].item(), got[n, k].item(), want[n, k].item())
            for n, k in bad.nonzero()[:6].tolist()]
    assert not bad.any(), f"{int(bad.sum())} elements differ: (n, k, code, scale byte, tile, reference) {show}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,special", [
    ("mxfp8_e5m2", {5: [(105, 0x7C)], 17: [(117, 0xFC)], 40: [(140, 0x7E)], 41: [(7, 0x7C), (9, 0xFC)]}),
    ("mxfp8_e4m3", {5: [(105, 0x7F)], 17: [(117, 0xFF)]})])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_decode_w16_nonfinite_codes(fmt, special, dtype, rng):
    """A weight holding Inf / NaN element codes (E5M2 +Inf, -Inf, NaN, and a column with both infinities;
    E4M3's two NaN) on decode-w16 (small M; such a weight stays off the tensor-core decode kernels): the
    columns that read them are the float64 product's (+Inf, -Inf or NaN, element by element), the other columns
    within the bound."""
    N, K, M = 64, 1024, 3
    w = rand_mx((N, K), fmt, rng, base=123)  # (scale bytes in fp16's envelope too)
    for c, at in special.items():
        for k, code in at:
            w.qdata[c, k] = code
    pw = mxkit.pack_weight(w.to("cuda"))
    a = torch.randn(M, K, generator=rng).to(dtype)
    assert mxkit.gemm_plan(a.cuda(), pw, backend="auto").path == "decode-w16"
    y = mxkit.matmul(a.cuda(), pw, backend="auto").cpu().to(torch.float64)
    y64 = values64(a) @ values64(w).T
    cols = torch.zeros(N, dtype=torch.bool)
    cols[list(special)] = True
    assert not torch.isfinite(y64[:, cols]).any()
    assert torch.equal(torch.isnan(y[:, cols]), torch.isnan(y64[:, cols]))
    inf = torch.isinf(y64[:, cols])
    assert torch.equal(y[:, cols][inf], y64[:, cols][inf])
    keep = MXTensor(w.qdata[~cols], w.scale[~cols], w.fmt, 1, 32, (N - len(special), K))
    assert_within_bound(y[:, ~cols].to(dtype), a, keep)


def test_prepared_call_of_k_zero_and_of_other_blocks(monkeypatch, rng):
    """matmul's eager hot path on CUDA (planned here with the device faked), for plans its small-M and fast-dequantize
    calls cannot run: K = 0 under decode-w16 (bf16 / fp16 rows: the call divided by K's split, ZeroDivisionError)
    takes the planned call (run_gemm's empty sum); a weight of 64-element blocks under dense-exact takes the planned
    call, not the one whose fast call is the Triton dequantize of 32-element blocks."""
    from mxkit import MXTensor
    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_calls, matmul_table

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(km, "_a_device", lambda a, kind: dev)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    z = torch.zeros(64, 0, dtype=torch.uint8)
    pw = mxkit.pack_weight(MXTensor(z, z.clone(), "mxfp4_e2m1", 1, 32, (64, 0)))
    p64 = mxkit.pack_weight(mxkit.quantize(torch.randn(48, 256, generator=rng), "mxfp4", block_size=64))
    monkeypatch.setattr(MXTensor, "device", property(lambda self: dev), raising=False)  # (packed on the CPU)
    for dt in (torch.bfloat16, torch.float16):
        a = torch.zeros(1, 0, dtype=dt)
        assert km.plan_gemm(a, pw).path == "decode-w16"
        call = matmul_calls.prepared_call(a, pw, None, None)  # (its result: test_k_zero_is_the_empty_sum on CUDA)
        assert type(call) is matmul_calls.PlannedCall and call.plan.K == 0
    a = torch.randn(5, 256, generator=rng).to(torch.bfloat16)
    assert km.plan_gemm(a, p64).path == "dense-exact"
    assert type(matmul_calls.prepared_call(a, p64, None, None)) is matmul_calls.PlannedCall


def test_plan_decode_w16_takes_fp16_and_fp6(monkeypatch):
    """fp16 activations and MXFP6 weights take decode-w16 at small M on CUDA (planned here with the device
    faked: the plan reads shapes, dtypes and scale bytes only); a weight outside the fp16-exact envelope does
    not."""
    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_table

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(km, "_a_device", lambda a, kind: dev)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    for fmt, dt in (("mxfp6_e2m3", torch.bfloat16), ("mxfp6_e3m2", torch.float16), ("mxfp4_e2m1", torch.float16),
                    ("mxfp8_e4m3", torch.float16), ("mxint8", torch.float16)):
        w = mxkit.quantize(torch.randn(64, 128), fmt)
        monkeypatch.setattr(type(w), "device", property(lambda self: dev), raising=False)
        a = torch.randn(3, 128).to(dt)
        p = km.plan_gemm(a, w)
        assert p.path == "decode-w16", (fmt, dt, p)
        assert str(dt) in p.reason
        w.scale[0, 0] = 10  # 2^-117: below fp16's range for every element format
        assert km.plan_gemm(a, w).path == ("decode-w16" if dt == torch.bfloat16 else "fp32-exact"), (fmt, dt)
    w6 = mxkit.quantize(torch.randn(64, 128), "mxfp6_e2m3")
    monkeypatch.setattr(type(w6), "device", property(lambda self: dev), raising=False)
    assert km.plan_gemm(torch.randn(17, 128).to(torch.float16), w6).path == "dense-exact"  # past max_m
    # MXFP6 only up to decode_w4a16.fp6_max_nk elements (an entry's missing fields come from the packaged one)
    with km.gemm_table_override({"default": {"decode_w4a16": {"max_m": 16, "fp6_max_nk": 64 * 128 - 32}}}):
        assert km.plan_gemm(torch.randn(3, 128).to(torch.bfloat16), w6).path == "dense-exact"
        assert km.plan_gemm(torch.randn(3, 128).to(torch.bfloat16), mxkit.quantize(torch.randn(64, 128), "mxint8")
                            ).path == "decode-w16"
    with km.gemm_table_override({"default": {"decode_w4a16": {"max_m": 16}}}):
        assert km.plan_gemm(torch.randn(3, 128).to(torch.bfloat16), w6).path == "decode-w16"


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_fp6_packed_weight_reads_its_mxfp8_twin(fmt, monkeypatch, rng):
    """pack_weight of an MXFP6 weight for float activations keeps its exact MXFP8 twin (``wide``), which bf16 /
    fp16 activations read: the MXFP8 weight paths in the plan (the device faked), the same bytes as the MXTensor
    on the CPU; not packed for MX activations; not read when a scale byte has no twin; kept by .to / pytree."""
    import torch.utils._pytree as pytree

    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_table
    from mxkit.kernels.matmul_details import _mma_a8w8

    wide_fmt, shift = mxkit.fold.WIDEN[fmt]
    w = rand_mx((64, 256), fmt, rng)
    pw = mxkit.pack_weight(w)
    assert pw.wide is not None and pw.wide.fmt.name == wide_fmt and pw.wide.mma_q is not None
    assert pw.nbytes == w.nbytes + (pw.folded.data.numel() + 4 * pw.folded.scale.numel()) + pw.wide.nbytes
    assert mxkit.pack_weight(w, act="mx").wide is None and mxkit.pack_weight(w, act="float").folded is None
    leaves, spec = pytree.tree_flatten(pw)
    assert pytree.tree_unflatten(leaves, spec).wide.fmt.name == wide_fmt and pw.to("cpu").wide is not None
    a = torch.randn(3, 256, generator=rng).to(torch.bfloat16)
    y, plan = check(a, pw, bias=torch.randn(64, generator=rng))
    assert "twin" in plan.reason
    # the twin's path against the MXFP6 weight's own (a PackedWeight without its twin), both run on the CPU
    assert torch.equal(mxkit.matmul(a, pw, backend="triton").view(torch.uint8),
                       mxkit.matmul(a, mxkit.pack_weight(w, act="mx"), backend="triton").view(torch.uint8))
    for dt in (torch.float16, torch.float32):  # the MXFP6 weight's own paths
        assert "twin" not in mxkit.gemm_plan(torch.randn(3, 256).to(dt), pw).reason
    w2 = MXTensor(w.qdata, w.scale.clone(), fmt, 1, 32, w.shape)
    w2.scale[5, 2] = 255 - shift  # a block whose scale has no twin: the MXFP6 weight's own paths
    pw2 = mxkit.pack_weight(w2)
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(km, "_a_device", lambda a, kind: dev)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    monkeypatch.setattr(type(w), "device", property(lambda self: dev), raising=False)
    monkeypatch.setattr(_mma_a8w8, "available", lambda d: None)
    a = torch.randn(1, 256).to(torch.bfloat16)
    p = km.plan_gemm(a, pw)
    assert p.path == "w8a16-mma" and f"{fmt} weight read as its exact {wide_fmt} twin" in p.reason, p
    assert km.plan_gemm(torch.randn(12, 256).to(torch.bfloat16), pw).path == "decode-w16"
    p = km.plan_gemm(a, pw2)
    assert "twin" not in p.reason and p.path == "decode-w16", p


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_fp6_weight_on_mxfp8_kernels(fmt, rng, poison):
    """bf16 x a packed MXFP6 weight runs on the MXFP8 weight kernels through its twin (w8a16-mma at M <= 8,
    decode-w16 to 16, w8a16-wgmma past that on a layer in its envelope), held to the bound row by row against
    the MXFP6 weight's own values; MXLinear from an MXFP6 format takes the same route."""
    N, K = 4096, 4096
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt)
    w.scale[7, 3] = 0  # the smallest scale byte: 2^-127 (the twin's byte 6 / 12)
    pw = mxkit.pack_weight(w, act="float")
    bias = torch.randn(N, generator=rng).cuda()
    seen = set()
    for M in (1, 3, 8, 16, 64, 200):
        a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        _, plan = check(a, pw, backend="auto", bias=bias if M % 2 else None)
        assert "twin" in plan.reason, plan
        seen.add(plan.path)
    assert {"w8a16-mma", "decode-w16"} <= seen, seen
    lin = torch.nn.Linear(K, 256, bias=True).cuda().to(torch.bfloat16)
    m = mxkit.nn.MXLinear.from_linear(lin, fmt)
    x = torch.randn(2, K, generator=rng).to(torch.bfloat16).cuda()
    assert "twin" in mxkit.gemm_plan(x, m._packed).reason


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("K,fmt,dt", [(2880, "mxfp6_e2m3", torch.bfloat16), (4096, "mxfp6_e3m2", torch.float16),
                                      (8192, "mxfp6_e3m2", torch.bfloat16), (2880, "mxfp4_e2m1", torch.float16),
                                      (4096, "mxfp8_e4m3", torch.float16), (2880, "mxint8", torch.float16)])
def test_gpu_decode_w16_fp16_and_fp6(K, fmt, dt, rng, poison):
    """decode-w16 for MXFP6 weights (bf16 and fp16 activations) and for fp16 activations on every other kind,
    M in issue #23's list, held to the bound row by row; bias, a float32 output, and the smallest scale byte of
    the activation dtype's exact envelope in the weight."""
    N = 1000
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt)
    w.scale[3, 1] = exact_scale_range(w.fmt, dt)[0]
    bias = torch.randn(N, generator=rng).cuda()
    for M in (1, 2, 3, 7, 16):
        a = torch.randn(M, K, generator=rng).to(dt).cuda()
        for b in (w, mxkit.pack_weight(w)):
            check(a, b, backend="auto", path="decode-w16", bias=bias if M % 2 else None)
        check(a, w, backend="auto", path="decode-w16", out_dtype=torch.float32)


@pytest.mark.gpu
@gpu
def test_gpu_vocabulary_width(rng):
    """N = 201088 (GPT-OSS vocabulary, 2^7 * 1571: a ragged last tile) at small M; every column within the bound
    (checked in slices of 32768), the output poisoned first."""
    from conftest import poison_allocator

    N, K = 201088, 2880
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    pw = mxkit.pack_weight(w)
    runs = []
    for M in (1, 3):
        a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        for x in (mxkit.quantize_fold(a, "mxfp4"), a):
            poison_allocator()
            y = mxkit.matmul(x, pw)
            assert y.shape == (M, N)
            runs.append((x, y))
    for c0 in range(0, N, 32768):  # (each slice of the weight dequantized once, for the four products)
        c1 = min(N, c0 + 32768)
        # (dequantized on the CPU, where the bound is computed: a slice's float64 intermediates on the GPU took
        # ~4 GB, kept by the worker's caching allocator)
        sub = values64(mxkit.MXTensor(w.qdata[c0:c1].cpu(), w.scale[c0:c1].cpu(), w.fmt, 1, 32, (c1 - c0, K)))
        for x, y in runs:
            assert_within_bound(y[:, c0:c1], x, sub)


@pytest.mark.gpu
@gpu
def test_gpu_nan_and_special_rows(rng):
    a = torch.randn(64, 2880, generator=rng).to(torch.bfloat16).cuda()
    a[5] = 0
    qa = mxkit.quantize(a, "mxfp4")
    qa.scale[7, 3] = 0xFF
    pw = mxkit.pack_weight(rand_mx((96, 2880), "mxfp4_e2m1", rng, spread=20, device="cuda"))
    y, _ = check(qa, pw, backend="auto", path="fold-fp8")
    assert torch.isnan(y[7]).all() and (y[5] == 0).all()
    y8 = mxkit.quantize(a, "mxfp8_e4m3")
    y8.scale[9, 0] = 0xFF
    y, _ = check(y8, mxkit.pack_weight(mxkit.quantize(torch.randn(96, 2880).cuda(), "mxfp8")), backend="auto")
    assert torch.isnan(y[9]).all()


@pytest.mark.gpu
@gpu
def test_gpu_mxlinear_packs_once_and_moves(rng):
    from mxkit.nn import MXLinear

    lin = torch.nn.Linear(2880, 256).cuda()
    m = MXLinear.from_linear(lin, "mxfp4", act_format="mxfp4")
    assert m._packed is not None and m._packed.folded is not None and m._packed.mma_q is None
    w16 = MXLinear.from_linear(lin, "mxfp4")  # W4A16: the decode layout, no fold
    assert w16._packed.folded is None and w16._packed.mma_q is not None
    x = torch.randn(17, 2880, device="cuda")
    # an MX activation meeting a weight packed without its fold: the fold path packs it on the call, same bytes
    qa = mxkit.quantize(x, "mxfp4")
    assert torch.equal(mxkit.matmul(qa, w16._packed), mxkit.matmul(qa, m._packed))
    with torch.no_grad():
        y = m(x)
    assert_within_bound(y, mxkit.quantize(x, "mxfp4"), m.weight_mx, lin.bias.detach())
    m2 = MXLinear(2880, 256, "mxfp4", act_format="mxfp4").cuda()
    m2.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert torch.equal(m2(x), y)
    assert m.cpu()._packed is None


@pytest.mark.gpu
@gpu
def test_gpu_deferred_fold_completes_wide_rows(rng):
    """MXLinear's path: the fused quantize-fold without its host sync, completed by matmul after the GEMM is
    enqueued; rows whose block scales span more than 14 (row 1: 2^40 next to 2^-40; row 4: wide only through a
    block that is all zero, so the kernel flags it but the reference folds it whole) must come out exact."""
    from mxkit.kernels.fold import PendingFold, quantize_fold_triton

    x = torch.randn(9, 2880, generator=rng).to(torch.bfloat16)
    x[1, :32] *= 2.0**40
    x[1, 32:64] *= 2.0**-40
    x[4, :32] = 0
    x[6] = 0
    x = x.cuda()
    pend = quantize_fold_triton(x, "mxfp4", defer=True)
    assert isinstance(pend, PendingFold)
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(64, 2880, generator=rng).cuda(), "mxfp4"))
    y = mxkit.matmul(pend, pw)
    assert_within_bound(y, mxkit.quantize(x, "mxfp4"), pw)
    # the rows both ways fold alike take the same FP8 GEMM: the same bits. Rows 1 and 4 are computed two exact
    # ways (the fix-up's float32 sums here, the folded slices there): the row-wise bound above, not the bits (row 1
    # differed in a last bf16 place in 8 of 60 seeded runs on an H100; no other row ever did)
    same = [r for r in range(9) if r not in (1, 4)]
    assert torch.equal(y[same], mxkit.matmul(mxkit.quantize_fold(x, "mxfp4"), pw)[same])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_gpu_prepared_calls_and_cuda_graphs(fmt, rng):
    """The eager hot path (plan and launch arguments kept on the PackedWeight): repeated calls with new data,
    with and without bias, 3-D and non-contiguous inputs agree with the reference path in bytes; the same
    call captured in a CUDA graph and replayed on new input data gives the eager bytes."""
    from conftest import assert_graph_replays

    N, K = 1000, 4096
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt))
    bias = torch.randn(N, generator=rng).cuda().to(torch.bfloat16)
    for shape in ((1, K), (3, K), (2, 5, K), (40, K)):
        for b in (None, bias):
            for _ in range(2):
                a = torch.randn(*shape, generator=rng).to(torch.bfloat16).cuda()
                y = mxkit.matmul(a, pw, bias=b)
                assert torch.equal(y, mxkit.matmul(a, pw, bias=b, backend="triton")), (shape, b is None)
                check(a, pw, bias=b, backend="auto")
    a_nc = torch.randn(K, 4, generator=rng).to(torch.bfloat16).cuda().t()
    assert torch.equal(mxkit.matmul(a_nc, pw), mxkit.matmul(a_nc.contiguous(), pw, backend="triton"))
    static = torch.randn(2, K, generator=rng).to(torch.bfloat16).cuda()
    assert_graph_replays(lambda a: mxkit.matmul(a, pw, bias=bias), [static],
                         lambda: [torch.randn(2, K, generator=rng).to(torch.bfloat16)],
                         check=lambda out: assert_within_bound(out, static, pw, bias))


_CUBLAS_SCENARIO = r"""
import sys
import torch
from mxkit import _precision as cb

m, C = torch.backends.cuda.matmul, torch._C
if sys.argv[2] == "legacy":
    cb._CUBLAS[:] = [cb._cublas_flags(), None]  # (a PyTorch without the newer API)


def views():
    out = []
    for f in (lambda: C._get_fp32_precision_getter("cuda", "matmul"), lambda: m.fp32_precision,
              lambda: C._get_cublas_allow_tf32(), torch.get_float32_matmul_precision,
              lambda: C._get_cublas_allow_bf16_reduced_precision_reduction(),
              lambda: C._get_cublas_allow_fp16_reduced_precision_reduction()):
        try:
            out.append(f())
        except RuntimeError:
            out.append("refused")
    return out


exec(sys.argv[1])
before = views()
for raise_inside in (False, True, False):
    try:
        with cb.exact_cublas():
            p = C._get_fp32_precision_getter("cuda", "matmul")
            assert p == "ieee" or p == "none" and C._get_cublas_allow_tf32() is False, views()
            assert not m.allow_bf16_reduced_precision_reduction and not m.allow_fp16_reduced_precision_reduction
            if raise_inside:
                raise KeyError
    except KeyError:
        pass
    assert views() == before, (before, views())
print("restored", before)
"""


@pytest.mark.parametrize("api,setup", [
    ("new", "pass"), ("new", "torch.set_float32_matmul_precision('medium')"), ("new", "m.allow_tf32 = True"),
    ("new", "m.fp32_precision = 'tf32'"), ("new", "torch.backends.fp32_precision = 'tf32'"),
    ("new", "torch.set_float32_matmul_precision('high'); m.fp32_precision = 'ieee'"),
    ("new", "m.allow_bf16_reduced_precision_reduction = True; m.allow_fp16_reduced_precision_reduction = False"),
    ("legacy", "pass"), ("legacy", "m.allow_tf32 = True"),
    ("legacy", "m.allow_tf32 = True; m.allow_fp16_reduced_precision_reduction = True")])
def test_exact_cublas_sets_and_restores_the_settings(api, setup):
    """Inside ``exact_cublas`` TF32 and the bf16 / fp16 reduced-precision reductions are off; after it (an
    exception inside included) every view of them reads as before: torch's newer fp32_precision, the legacy
    getters, get_float32_matmul_precision (which torch refuses to read after a mix of the two APIs: its refusal
    is kept, never caused), from a fresh process per starting state: set through either API, globally, or not
    at all (nothing is written then); "legacy": a PyTorch without the newer API."""
    import subprocess
    import sys

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _CUBLAS_SCENARIO, setup, api], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "restored" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    if setup == "torch.backends.fp32_precision = 'tf32'":
        assert "refused" in r.stdout  # (the state torch itself refuses to read through the legacy getter)


def test_cublas_probe_only_reads_the_settings():
    """Finding torch._C's cuBLAS setters writes nothing: a precision set through torch's newer API stays readable
    (a write through the legacy setters would mix the two APIs, which torch refuses to read back)."""
    from mxkit import _precision as cb

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        cb._cublas_flags()
        cb._fp32_precision_api()
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_input_gradient_is_full_float32_whatever_the_matmul_precision(rng):
    """x's gradient (grad_y @ dequantize(W)) is computed at full float32 as the forward is: the same bits under
    torch.set_float32_matmul_precision("medium") (CPU oneDNN then multiplies in bf16: the gradient moved by ~1e-4)."""
    w = mxkit.quantize(torch.randn(256, 512, generator=rng), "mxfp8")
    x, g = torch.randn(64, 512, generator=rng), torch.randn(64, 256, generator=rng)
    grads = []
    before = torch.get_float32_matmul_precision()
    try:
        for setting in ("highest", "medium"):
            torch.set_float32_matmul_precision(setting)
            xi = x.clone().requires_grad_()
            mxkit.matmul(xi, w, out_dtype=torch.float32).backward(g)
            grads.append(xi.grad)
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(grads[0], grads[1])
    want = g.double() @ dequantize_reference(w, torch.float64)
    assert float((grads[0].double() - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_prepared_prefill_calls_select_their_paths_and_fall_back(rng):
    """The prepared calls of the prefill paths (made for CUDA operands; here on CPU, where their launches are never
    bound): fold-fp8 of an MX a with bf16 out and no bias gets a ``FoldCall`` (not with a bias, another out dtype
    or N % 16 != 0), a bf16 a on dense-exact a ``DenseExactCall``; each call of them is run_gemm's, bytes and
    all, since nothing is bound."""
    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_calls as kc

    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(48, 256, generator=rng), "mxfp4"))
    a = mxkit.quantize(torch.randn(5, 256, generator=rng), "mxfp4")
    call = kc.prepared_call_mx(a, pw, None, None)
    assert isinstance(call, kc.FoldCall) and kc.prepared_call_mx(a, pw, None, None) is call
    for _ in range(3):
        a = mxkit.quantize(torch.randn(5, 256, generator=rng), "mxfp4")
        y = call(a, None)
        assert torch.equal(y, mxkit.matmul(a, pw, backend="triton"))
        assert_within_bound(y, a, pw.source)
    assert call.fix is None  # (no CUDA: nothing bound)
    bias = torch.randn(48, generator=rng)
    assert kc.prepared_call_mx(a, pw, None, bias) is None
    assert kc.prepared_call_mx(a, pw, torch.float32, None) is None
    odd = mxkit.pack_weight(mxkit.quantize(torch.randn(40, 256, generator=rng), "mxfp4"))
    assert kc.prepared_call_mx(a, odd, None, None) is None
    a8 = mxkit.quantize(torch.randn(5, 256, generator=rng), "mxfp8_e4m3")
    assert km.plan_gemm(a8, pw).path == "bf16-exact" and kc.prepared_call_mx(a8, pw, None, None) is None  # (CPU)
    x = torch.randn(7, 256, generator=rng).to(torch.bfloat16)
    assert km.plan_gemm(x, pw).path == "dense-exact"
    dcall = kc.prepared_call(x, pw, None, None)
    assert isinstance(dcall, kc.DenseExactCall)
    for _ in range(2):
        y = dcall(x, None)
        assert torch.equal(y, mxkit.matmul(x, pw, backend="triton"))
        assert_within_bound(y, x, pw.source)
    assert dcall.deq is None and dcall.tries == 2  # (no CUDA: no dequantize fast call; looked for at 3 calls at most)
    dcall(x, None), dcall(x, None)
    assert dcall.tries == 3
    assert isinstance(kc.prepared_call(x, pw, None, bias), kc.PlannedCall)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fa,fw", [("mxfp4_e2m1", "mxfp4_e2m1"), ("mxfp6_e3m2", "mxfp4_e2m1"),
                                   ("mxfp4_e2m1", "mxfp6_e2m3"), ("mxfp8_e4m3", "mxfp4_e2m1"),
                                   ("mxfp8_e5m2", "mxfp6_e2m3")])
def test_gpu_mx_prepared_calls_are_run_gemms_bytes(fa, fw, rng, poison):
    """An MX a times a PackedWeight, eager, on the fold path (``FoldCall``: the fold by one C++ fast call, cuBLAS's
    FP8 GEMM, the fix-up by a bound launch) or the bf16-exact path (``Bf16ExactCall``: both operands dequantized
    by fast calls, cuBLAS, the fix-up) gives run_gemm's bytes call after call with new data in poisoned memory:
    rows whose blocks span past the fold window or whose scale bytes lie outside the bf16-exact range (the
    fix-up's rows), a zero row, a NaN block and a weight with special rows (its columns redone) included; 2-D and
    3-D a, N % 16 != 0 (the fold path's padding: no prepared call); and under a CUDA graph."""
    from conftest import assert_graph_replays, poison_allocator

    from mxkit.kernels import fast_call
    from mxkit.kernels import matmul_calls as kc

    K = 2880
    w = torch.randn(1024, K, generator=rng)
    w[5, :32] *= 2.0**50  # a special row: its blocks span past the fold window
    w[5, 32:64] *= 2.0**-50
    pw = mxkit.pack_weight(mxkit.quantize(w.cuda(), fw))
    assert pw.special_rows.numel()

    def fresh(*lead):
        x = torch.randn(*lead, K, generator=rng)
        x.view(-1, K)[1, :32] *= 2.0**40
        x.view(-1, K)[1, 32:64] *= 2.0**-40
        x.view(-1, K)[2] = 0
        x.view(-1, K)[3, 64:96] = float("nan")
        x.view(-1, K)[4] *= 2.0**-126  # scale bytes near the bottom: outside the bf16-exact range of FP8 a
        return mxkit.quantize(x.to(torch.bfloat16).cuda(), fa)

    kind = {"fold-fp8": kc.FoldCall, "bf16-exact": kc.Bf16ExactCall}

    for lead in ((37,), (2, 9)):
        for i in range(4):
            a = fresh(*lead)
            want = mxkit.matmul(a, pw, backend="triton")
            poison_allocator()
            y = mxkit.matmul(a, pw)
            assert torch.equal(y.view(torch.int16), want.view(torch.int16)), (lead, i)
        path = mxkit.gemm_plan(a, pw).path
        assert path in kind, path
        calls = [c for c in pw._calls.values() if isinstance(c, kind[path])]
        assert calls and calls[-1].fix is not None, "the prepared launches were not made"
        if path == "bf16-exact":  # (cuBLAS through the C++ fast call's mm_t)
            assert calls[-1].mm is getattr(fast_call.module(), "mm_t", kc._mm_t_twin)
    static = fresh(5)
    assert_graph_replays(lambda q, s: mxkit.matmul(MXTensor(q, s, static.fmt, static.axis, 32, static.shape), pw),
                         [static.qdata, static.scale], lambda: (lambda q: [q.qdata, q.scale])(fresh(5)))
    pw_odd = mxkit.pack_weight(mxkit.quantize(torch.randn(1000, K, generator=rng).cuda(), fw))
    a = fresh(7)
    for _ in range(3):
        assert torch.equal(mxkit.matmul(a, pw_odd).view(torch.int16),  # (bytes: the NaN block's row is NaN)
                           mxkit.matmul(a, pw_odd, backend="triton").view(torch.int16))
    if mxkit.gemm_plan(a, pw_odd).path == "fold-fp8":
        assert not any(isinstance(c, kc.FoldCall) for c in pw_odd._calls.values())


@pytest.mark.gpu
@gpu
def test_gpu_dense_exact_prepared_call_is_run_gemms_bytes(rng, poison):
    """bf16 a times a PackedWeight on the dense-exact path, eager (``DenseExactCall``: the weight dequantized by
    the dequantize kernel's C++ fast call, then cuBLAS through the fast call's ``mm_t``): run_gemm's bytes call
    after call with new data, 2-D and 3-D a; with a bias (run_gemm each call) too; a CUDA graph of the call replays
    new a to the eager bytes."""
    from conftest import assert_graph_replays, poison_allocator

    from mxkit.kernels import fast_call
    from mxkit.kernels import matmul_calls as kc

    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(1024, 1024, generator=rng).cuda(), "mxfp4"))
    M = next((m for m in (256, 512, 1024, 2048) if mxkit.gemm_plan(
        torch.empty(m, 1024, dtype=torch.bfloat16, device="cuda"), pw).path == "dense-exact"), None)
    if M is None:
        pytest.skip("this GPU's dispatch table takes no 1024 x 1024 layer to dense-exact")
    bias = torch.randn(1024, generator=rng).cuda()
    for b in (None, bias):
        for lead in ((M,), (2, M // 2)):
            for i in range(4):
                a = torch.randn(*lead, 1024, generator=rng).to(torch.bfloat16).cuda()
                want = mxkit.matmul(a, pw, bias=b, backend="triton")
                poison_allocator()
                got = mxkit.matmul(a, pw, bias=b)
                assert got.shape == want.shape and torch.equal(got, want), (b is None, lead, i)
    calls = [c for c in pw._calls.values() if isinstance(c, kc.DenseExactCall)]
    assert len(calls) == 2 and all(c.deq is not None for c in calls), "the dequantize fast call was not made"
    mod = fast_call.module(wait=True)
    assert all(c.mm is (mod.mm_t if mod is not None else kc._mm_t_twin) for c in calls)
    static = torch.randn(M, 1024, generator=rng).to(torch.bfloat16).cuda()
    assert_graph_replays(lambda x: mxkit.matmul(x, pw), [static],
                         lambda: [torch.randn(M, 1024, generator=rng).to(torch.bfloat16).cuda()])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_gpu_wgmma_prepared_call_is_tritons_launch(fmt, rng, poison):
    """bf16 a times a PackedWeight on the w4a16-wgmma / w8a16-wgmma path, eager (``WgmmaCall``: one w4a16_wgmma a
    call, its launch prepared per problem: one cuLaunchKernel from the problem's second call, x's TMA descriptor
    encoded from x alone, and the split's sum): the bytes of Triton's own launcher (launch.triton_launch_only) call
    after call with new data, at split-K M's and one without a split taking turns, 3-D a, without a bias and with a
    float32 or a bf16 one (read as it is: the bytes of its float32 copy), into poisoned memory; within the float64
    bound; the calls' prepared launches made and taken."""
    from conftest import poison_allocator

    from mxkit.kernels import launch
    from mxkit.kernels import matmul_calls as kc
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    N = K = 8192
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda() * 2.0**-4, fmt))
    Ms = [m for m in (64, 96, 2048) if mxkit.gemm_plan(torch.empty(m, K, dtype=torch.bfloat16, device="cuda"),
                                                       pw).path.endswith("-wgmma")]
    if not Ms:
        pytest.skip("this GPU's dispatch table takes no 8192 x 8192 layer to the wgmma paths")
    wg._PREPARED.clear()
    bias16 = torch.randn(N, generator=rng).to(torch.bfloat16).cuda()
    bias = bias16.float() * (1 + 2.0**-12)  # (float32 values off the bf16 grid)
    for i in range(4):
        for M in Ms:
            for b in (None, bias, bias16):
                a = torch.randn(2, M // 2, K, generator=rng).to(torch.bfloat16).cuda()
                with launch.triton_launch_only():
                    want = mxkit.matmul(a, pw, bias=b)
                poison_allocator()
                got = mxkit.matmul(a, pw, bias=b)
                assert got.shape == (2, M // 2, N) and torch.equal(got.view(torch.int16), want.view(torch.int16)), \
                    (M, i, b is None)
                if b is bias16:  # (read as float32: exact)
                    y32 = mxkit.matmul(a, pw, bias=bias16.float())
                    assert torch.equal(got.view(torch.int16), y32.view(torch.int16)), (M, i)
                if i == 3 and M == Ms[0]:
                    assert_within_bound(got, a, pw, b)
    calls = [c for c in pw._calls.values() if isinstance(c, kc.WgmmaCall)]  # (no bias, float32 and bf16 bias)
    assert len(calls) == 3 * len(Ms) and all(c.prep is not None for c in calls), [c.prep for c in calls]
    assert sum(1 for p in wg._PREPARED.values() if p.fast) >= 2 * len(Ms)  # (with a bias: another problem)
    splits = {c.prep.split for c in calls}
    assert all(c.prep.sum_launch for c in calls if c.prep.split > 1), splits
    assert all(c.prep.plan and (c.prep.split == 1 or c.prep.sum_plan) for c in calls), "no C++ fast call"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,bias_dtype", [(64, None), (64, torch.float32), (64, torch.bfloat16), (2048, None),
                                          (2048, torch.float32), (2048, torch.bfloat16)])
def test_gpu_wgmma_fast_call_plans_are_tritons_bytes_and_capturable(M, bias_dtype, rng, poison):
    """w4a16_wgmma's dense problems from their third call: one C++ fast call (the three TMA descriptors re-addressed
    to each call's x, weight codes and scales; y allocated in C++), with a split a second one for the sum: the
    bytes of Triton's own launcher call after call on new x at new addresses, two weights of one shape taking
    turns (the descriptors follow the weight), a float32 or bf16 bias on the main launch or the sum (a bf16 one:
    the bytes of its float32 copy), into poisoned memory; within the float64 bound; the plans made; a CUDA graph
    of the call replays new x to the eager bytes."""
    from conftest import poison_allocator

    from mxkit.kernels import launch
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    N = K = 8192
    pws = [mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda() * 2.0**-4, "mxfp4_e2m1"))
           for _ in range(2)]
    packed = [wg.packed_of(pw) for pw in pws]
    bm, split = wg.dense_schedule(M, N, K, torch.device("cuda"))
    bias = torch.randn(N, generator=rng).to(bias_dtype).cuda() if bias_dtype else None
    wg._PREPARED.clear()
    kept = []  # (the inputs stay alive: each call's x at a new address)

    def call(x, i):
        q, st, one = packed[i % 2]
        return wg.w4a16_wgmma(x, q, st, N, one, torch.bfloat16, bias, bm=bm, split=split)

    for i in range(6):
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        kept.append(x)
        with launch.triton_launch_only():
            want = call(x, i)
        poison_allocator()
        got = call(x, i)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (M, i)
        if i == 5:
            assert_within_bound(got, x, pws[1], bias)
    if bias_dtype == torch.bfloat16:
        q, st, one = packed[1]
        with launch.triton_launch_only():
            y32 = wg.w4a16_wgmma(x, q, st, N, one, torch.bfloat16, bias.float(), bm=bm, split=split)
        assert torch.equal(got.view(torch.int16), y32.view(torch.int16))
    prep, = [p for p in wg._PREPARED.values() if p.dense and p.plan is not None]
    assert prep.plan and (split == 1 or (prep.split == split and prep.sum_plan)), (prep.plan, split)
    static = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(static, 0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static, 0)
    for _ in range(2):
        static.copy_(torch.randn(M, K, generator=rng).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        with launch.triton_launch_only():
            want = call(static.clone(), 0)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def _compiled_matmul_equals_eager(device: str, backend: str, rng) -> None:
    """torch.compile(fullgraph=True) of mxkit.matmul on a PackedWeight (one opaque op, ``mxkit::packed_matmul``, the
    weight found by its id): the eager bytes, with a bias and an out dtype, for two weights passed as arguments (a
    guard on the weight's identity: each gets its own graph) and one held in a closure, weights of 16 / 64-element
    blocks and another backend; on an MXTensor weight, with gradients (under Inductor the bias gradient, a sum over
    rows it fuses, within the float32 summation bound of the float64 sum)."""
    pws = [mxkit.pack_weight(mxkit.quantize(torch.randn(N, 256, generator=rng).to(device), fmt))
           for N, fmt in ((64, "mxfp4"), (96, "mxfp8_e4m3"))]
    bias = torch.randn(96, generator=rng).to(device)
    f = torch.compile(lambda x, b, bias: mxkit.matmul(x, b, bias=bias, out_dtype=torch.float32) * 2,
                      fullgraph=True, backend=backend)
    for M in (1, 3, 40):
        x = torch.randn(M, 256, generator=rng).to(torch.bfloat16).to(device)
        for pw in pws:
            bb = bias[:pw.shape[0]]
            want = mxkit.matmul(x, pw, bias=bb, out_dtype=torch.float32) * 2
            assert torch.equal(f(x, pw, bb), want), (M, pw.fmt)
        g = torch.compile(lambda x: mxkit.matmul(x, pws[0]), fullgraph=True, backend=backend)
        assert torch.equal(g(x), mxkit.matmul(x, pws[0]))
    with pytest.raises(RuntimeError, match="no longer exists"):
        mxkit.packed.packed_of(-1)
    # weights of 16 / 64-element blocks, and another backend (tracing the plan failed on a data-dependent guard)
    for bs, be in ((16, "auto"), (64, "auto"), (32, "reference")):
        pw = mxkit.pack_weight(mxkit.quantize(torch.randn(40, 256, generator=rng).to(device), "mxfp4", block_size=bs))
        k = torch.compile(lambda x: mxkit.matmul(x, pw, backend=be), fullgraph=True, backend=backend)
        x = torch.randn(3, 256, generator=rng).to(torch.bfloat16).to(device)
        assert torch.equal(k(x), mxkit.matmul(x, pw, backend=be)), (bs, be)
    # an MXTensor weight: one opaque op too (mxkit::mx_matmul, the weight's tensors and metadata its arguments),
    # with gradients (tracing the plan failed on the host read of the weight's scale statistics)
    w = mxkit.quantize(torch.randn(48, 256, generator=rng).to(device), "mxfp4")
    h = torch.compile(lambda x, bias: mxkit.matmul(x, w, bias=bias), fullgraph=True, backend=backend)
    x, b48 = torch.randn(5, 256, generator=rng).to(device), torch.randn(48, generator=rng).to(device)
    xs, bs = [x.clone().requires_grad_() for _ in range(2)], [b48.clone().requires_grad_() for _ in range(2)]
    got, want = h(xs[0], bs[0]), mxkit.matmul(xs[1], w, bias=bs[1])
    assert torch.equal(got, want)
    g = torch.randn(want.shape, generator=rng).to(device)
    got.backward(g)
    want.backward(g)
    assert torch.equal(xs[0].grad, xs[1].grad)
    if backend == "inductor":  # (Inductor fuses the bias gradient's sum over rows in an order of its own)
        want_b = g.double().sum(0)
        assert ((bs[0].grad.double() - want_b).abs() <= 4 * 2.0**-24 * g.double().abs().sum(0)).all()
        assert ((bs[1].grad.double() - want_b).abs() <= 4 * 2.0**-24 * g.double().abs().sum(0)).all()
    else:
        assert torch.equal(bs[0].grad, bs[1].grad)
    with torch.no_grad():
        assert torch.equal(h(x.bfloat16(), None), mxkit.matmul(x.bfloat16(), w))


def test_compiled_matmul_packed_weight(rng):
    _compiled_matmul_equals_eager("cpu", "aot_eager", rng)


@pytest.mark.gpu
@gpu
def test_gpu_compiled_matmul_packed_weight(rng):
    """The same on CUDA with Inductor: the eager kernels (decode-mma, w8a16-mma, decode-w16, dense-exact) inside
    the compiled graph."""
    _compiled_matmul_equals_eager("cuda", "inductor", rng)


def _compiled_mx_activations_equal_eager(device: str, backend: str, rng) -> None:
    """mxkit.matmul(quantize(x), w) under torch.compile(fullgraph=True, dynamic=True): one op (mxkit::mx_matmul_mx,
    or mxkit::packed_matmul_mx for a PackedWeight) whose bytes are eager's, at 4 batch sizes in one graph a weight;
    and under torch.export, whose program holds mx_matmul_mx on the weight's tensors."""
    from torch._dynamo.utils import counters

    w = mxkit.quantize(torch.randn(96, 256, generator=rng), "mxfp4").to(device)
    pw = mxkit.pack_weight(w)
    bias = torch.randn(96, generator=rng).to(device)
    xs = [torch.randn(n, 256, generator=rng).to(device, torch.bfloat16) for n in (3, 17, 64, 5)]
    for b in (w, pw):
        for kw in ({}, dict(bias=bias, out_dtype=torch.float32)):
            def f(x):
                return mxkit.matmul(mxkit.quantize(x, "mxfp8_e4m3"), b, **kw)

            torch._dynamo.reset()
            counters.clear()
            g = torch.compile(f, fullgraph=True, dynamic=True, backend=backend)
            for x in xs:
                assert torch.equal(g(x), f(x)), (type(b).__name__, kw.keys(), x.shape)
            assert counters["stats"]["unique_graphs"] == 1, counters["stats"]

    class Layer(torch.nn.Module):
        def forward(self, x):
            return mxkit.matmul(mxkit.quantize(x, "mxfp8_e4m3"), pw, bias=bias)

    ep = torch.export.export(Layer(), (xs[0],), strict=False)
    assert "mx_matmul_mx" in str(ep.graph)
    assert torch.equal(ep.module()(xs[0]), Layer()(xs[0]))
    torch._dynamo.reset()


def test_compiled_matmul_of_mx_activations(rng):
    """An MXTensor ``a`` (quantized activations) under torch.compile: the plan read a's scale statistics, a
    data-dependent guard, so fullgraph raised and graphs broke and recompiled per batch size."""
    _compiled_mx_activations_equal_eager("cpu", "aot_eager", rng)


@pytest.mark.gpu
@gpu
def test_gpu_compiled_matmul_of_mx_activations(rng):
    """The same on CUDA with Inductor (the a8w8 and fold paths inside the compiled graph)."""
    _compiled_mx_activations_equal_eager("cuda", "inductor", rng)


@pytest.mark.parametrize("fmt", ["mxint8", "mxfp4_e2m1", "mxfp6_e2m3"])
def test_dense_cache_plan_and_values(fmt, monkeypatch, rng):
    """pack_weight(dense=dtype) keeps the weight dequantized (the reference's bytes; an MXFP6 weight's bf16 cache
    on its twin), which activations of that dtype read past the small-M kernels (path dense-cached, the device
    faked) where the scale bytes are in the dtype's exact envelope; kept by .to / pytree; counted in nbytes."""
    import torch.utils._pytree as pytree

    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_table
    from mxkit.reference import dequantize_reference

    with pytest.raises(ValueError, match="dense="):
        mxkit.pack_weight(rand_mx((16, 64), fmt, rng), dense=torch.float32)
    w = rand_mx((64, 256), fmt, rng)
    pw = mxkit.pack_weight(w, act="float", dense=torch.bfloat16)
    holder = pw.wide if fmt.startswith("mxfp6") else pw
    assert holder.dense.dtype == torch.bfloat16 and (pw.dense is None) == fmt.startswith("mxfp6")
    assert torch.equal(holder.dense.view(torch.int16), dequantize_reference(w, torch.bfloat16).view(torch.int16))
    assert pw.nbytes == mxkit.pack_weight(w, act="float").nbytes + 2 * w.shape.numel()
    leaves, spec = pytree.tree_flatten(pw)
    assert pytree.tree_unflatten(leaves, spec).to("cpu").nbytes == pw.nbytes
    a = torch.randn(40, 256, generator=rng).to(torch.bfloat16)
    assert km.plan_gemm(a, pw).path == "dense-cached"  # (backend "triton": the CPU runs that path, not the reference)
    assert torch.equal(mxkit.matmul(a, pw, backend="triton").view(torch.int16),
                       mxkit.matmul(a, w, backend="triton").view(torch.int16))
    p16 = mxkit.pack_weight(w, act="float", dense=torch.float16)
    assert p16.dense.dtype == torch.float16
    w2 = MXTensor(w.qdata, w.scale.clone(), fmt, 1, 32, w.shape)
    w2.scale[3, 1] = 5 if fmt != "mxint8" else 2  # below fp16's range: the cache is not exact there
    p16_low = mxkit.pack_weight(w2, act="float", dense=torch.float16)
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(km, "_a_device", lambda a, kind: dev)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    monkeypatch.setattr(type(w), "device", property(lambda self: dev), raising=False)
    from mxkit.kernels.matmul_details import _mma_a8w8, _mma_decode

    for mod in (_mma_a8w8, _mma_decode):  # (no driver here: the CUDA C++ kernels counted out)
        monkeypatch.setattr(mod, "available", lambda d: "no GPU in this test")
    assert km.plan_gemm(a, pw).path == "dense-cached"
    assert km.plan_gemm(a[:1], pw).path != "dense-cached"  # small M: the decode kernels
    assert km.plan_gemm(a.to(torch.float16), p16).path == "dense-cached"
    assert km.plan_gemm(a.to(torch.float16), pw).path != "dense-cached"  # a bf16 cache for fp16 x: not read
    assert km.plan_gemm(a.to(torch.float16), p16_low).path == "fp32-exact"


def test_mxlinear_dense_cache_argument():
    lin = torch.nn.Linear(64, 32)
    m = mxkit.nn.MXLinear.from_linear(lin, "mxint8", dense_cache=torch.bfloat16)
    assert m.dense_cache == torch.bfloat16 and "dense_cache=torch.bfloat16" in repr(m) and m._packed is None
    with pytest.raises(ValueError, match="dense_cache"):
        mxkit.nn.MXLinear(64, 32, "mxint8", dense_cache=torch.float32)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    mxkit.nn.quantize_model(model, "mxfp4", dense_cache=torch.float16, progress=False)
    assert model[0].dense_cache == torch.float16
    # a layer that quantizes its input never reads the cache: refused (it was accepted, shown, and never built)
    with pytest.raises(ValueError, match="dense_cache=torch.bfloat16 is for weight-only layers"):
        mxkit.nn.MXLinear(64, 32, "mxfp4", act_format="mxfp8", dense_cache=torch.bfloat16)
    with pytest.raises(ValueError, match="is for weight-only layers"):
        mxkit.nn.quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 64)), "mxfp4", act_format="fp8_e4m3_rowwise",
                                dense_cache=torch.bfloat16, progress=False)
    # a cached layer given an act_format later fuses / shards without the cache
    q, k = (mxkit.nn.MXLinear.from_linear(torch.nn.Linear(64, 32), "mxfp4", dense_cache=torch.bfloat16) for _ in "qk")
    for m in (q, k):
        m.act_format = mxkit.get_format("mxfp8")
    assert mxkit.nn.FusedMXLinear([q, k]).fused.dense_cache is None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxint8", "mxfp4_e2m1", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_gpu_dense_cache(fmt, rng, poison):
    """Prefill on the dequantized-weight cache: path dense-cached at M = 300 (bias, bf16 and fp16 caches), within
    the bound row by row; on MXINT8 the bytes of dense-exact (the same dequantized weight and cuBLAS call); MXLinear
    and quantize_model with dense_cache take it."""
    N, K = 1024, 2880
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt)
    bias = torch.randn(N, generator=rng).cuda()
    for dt in (torch.bfloat16, torch.float16):
        pw = mxkit.pack_weight(w, act="float", dense=dt)
        a = torch.randn(300, K, generator=rng).to(dt).cuda()
        y, _ = check(a, pw, backend="auto", path="dense-cached", bias=bias)
        if fmt == "mxint8":
            y0, _ = check(a, mxkit.pack_weight(w, act="float"), backend="auto", path="dense-exact", bias=bias)
            assert torch.equal(y.view(torch.int16), y0.view(torch.int16))
    lin = torch.nn.Linear(K, 512).cuda().to(torch.bfloat16)
    m = mxkit.nn.MXLinear.from_linear(lin, fmt, dense_cache=torch.bfloat16)
    x = torch.randn(2, 150, K, generator=rng).to(torch.bfloat16).cuda()
    assert mxkit.gemm_plan(x, m._packed).path == "dense-cached"
    with torch.no_grad():
        assert torch.equal(m(x).view(torch.int16), mxkit.matmul(x, m._packed, bias=m.bias).view(torch.int16))


def test_packed_weight_copies_are_findable_and_repacking_checks_dense(rng):
    """A deep copy (or torch.load) of a PackedWeight registers its own id for mxkit::packed_matmul; packing a
    PackedWeight again asks for no cache it lacks."""
    import copy

    from mxkit.packed import packed_of

    pw = mxkit.pack_weight(rand_mx((32, 64), "mxfp4_e2m1", rng))
    c = copy.deepcopy(pw)
    assert packed_of(id(c)) is c and packed_of(id(pw)) is pw
    assert mxkit.pack_weight(pw) is pw
    with pytest.raises(ValueError, match="without a torch.bfloat16 cache"):
        mxkit.pack_weight(pw, dense=torch.bfloat16)
    pd = mxkit.pack_weight(pw.source, act="float", dense=torch.bfloat16)
    assert mxkit.pack_weight(pd, dense=torch.bfloat16) is pd


def test_a8w8_envelope_wgmma_min_nk(monkeypatch):
    """``a8w8_mma.wgmma_min_nk``: where w8a16-wgmma would take the call, a8w8-mma keeps ``max_m`` rows on weights
    of N * K >= wgmma_min_nk and ``max_m_no_wgmma`` on smaller ones (H200: the GPT-OSS layers, where a8w8-mma
    stays ahead at M = 32); without the field (default 0) ``max_m`` everywhere; without wgmma ``max_m_no_wgmma``."""
    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_table

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    small, big = mxkit.quantize(torch.randn(64, 128), "mxfp8_e4m3"), mxkit.quantize(torch.randn(128, 256), "mxfp8_e4m3")
    entry = {"max_m": 16, "max_m_no_wgmma": 64, "quant_max_m": 8}
    for wg_ok in (True, False):
        monkeypatch.setattr(km, "_wgmma_ok", lambda b, w, M, d, ok=wg_ok: ok)
        with km.gemm_table_override({"default": {"a8w8_mma": {**entry, "wgmma_min_nk": 128 * 256}}}):
            assert km._a8w8_max_m(small, 32, dev) == 64
            assert km._a8w8_max_m(big, 32, dev) == (16 if wg_ok else 64)
        with km.gemm_table_override({"default": {"a8w8_mma": entry}}):
            assert km._a8w8_max_m(small, 32, dev) == (16 if wg_ok else 64)


def test_a8w8_takes_only_blocks_of_32(monkeypatch):
    """a8w8-mma reads K / 32 scale bytes a weight row: a weight of other blocks (or one along another axis) is not
    its case (a8w8_linear, which does not go through plan_gemm, ran it: blocks of 16 read other rows' scales, of 64
    past the scale buffer). Judged on the CPU with the device checks standing down."""
    from mxkit.kernels import matmul as km
    from mxkit.kernels import matmul_table
    from mxkit.kernels.matmul_details import _mma_a8w8

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    monkeypatch.setattr(_mma_a8w8, "available", lambda d: None)
    w = torch.randn(64, 256)
    ok = mxkit.quantize(w, "mxfp8_e4m3")
    assert km._a8w8_ok(ok.fmt, ok, 4, dev)
    for bad in (mxkit.quantize(w, "mxfp8_e4m3", block_size=16), mxkit.quantize(w, "mxfp8_e4m3", block_size=64)):
        for b in (bad, km.pack_weight(bad)):
            assert not km._a8w8_ok(bad.fmt, b, 4, dev), (bad, type(b).__name__)
    swizzled = mxkit.quantize(w, "mxfp8_e4m3", scale_layout="nvidia_128x4")  # (packing makes its scales plain)
    assert not km._a8w8_ok(swizzled.fmt, swizzled, 4, dev) and km._a8w8_ok(ok.fmt, km.pack_weight(swizzled), 4, dev)


def test_no_fp8_paths_without_fp8_tensor_cores(monkeypatch, rng):
    """On a GPU without FP8 tensor cores (sm_80: torch._scaled_mm and Triton's float8e4nv refuse it) the plans take
    the exact paths off them: MX x MX bf16-exact, a folded or FP8-rowwise a fp32-exact, no decode-w16 of E4M3
    weights (they raised there). Judged on the CPU with the capability check answering "sm_80"."""
    from mxkit.fold import fold_reference
    from mxkit.kernels import matmul as km

    x = torch.randn(4, 64, generator=rng)
    w = mxkit.quantize(torch.randn(32, 64, generator=rng), "mxfp4")
    a_mx = mxkit.quantize(x, "mxfp4")
    cases = ((a_mx, "fold-fp8", "bf16-exact"), (fold_reference(a_mx), "fold-fp8", "fp32-exact"),
             (mxkit.quantize_fp8_rowwise(x), "w4a8-fp8", "fp32-exact"))
    for a, fast, _ in cases:
        assert km.plan_gemm(a, w, torch.bfloat16).path == fast
    monkeypatch.setattr(km, "_fp8_ok", lambda dev: False)
    for a, _, exact in cases:
        p = km.plan_gemm(a, w, torch.bfloat16)
        assert p.path == exact and "no FP8 tensor cores" in p.reason, p
    assert not km._decode_takes(mxkit.MXFP8_E4M3, 64, 64, torch.device("cuda", 0))
    assert km._decode_takes(mxkit.MXFP8_E5M2, 64, 64, torch.device("cuda", 0))


def test_wgmma_dense_schedule(monkeypatch):
    """The wgmma kernel's dense schedule (warp-specialized, one program an SM): 64-token tiles up to M = 64, K split
    the most ways of 8..2 that keeps tiles x split within the SM count with >= 8 K steps a split (H200, session 48:
    64 x 5120 x 2880 at split 3, 8192^2 at 2, 2880 x 4096 at 5)."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    monkeypatch.setattr(wg, "sm_count", lambda index: 132)
    dev = torch.device("cuda", 0)
    for (M, N, K), want in (((64, 5120, 2880), (64, 3)), ((64, 8192, 8192), (64, 2)), ((64, 2880, 4096), (64, 5)),
                            ((17, 4096, 14336), (64, 4)), ((64, 28672, 8192), (64, 1)), ((128, 5120, 2880), (128, 3)),
                            ((96, 2880, 4096), (128, 5)), ((64, 128, 512), (64, 1)), ((64, 256, 1024), (64, 2)),
                            ((4096, 8192, 8192), (256, 1))):
        assert wg.dense_schedule(M, N, K, dev) == want, (M, N, K)
    monkeypatch.setenv("MXKIT_WGMMA_WS", "0")
    assert not wg._ws(64, False) and not wg._ws(256, True)
    monkeypatch.delenv("MXKIT_WGMMA_WS")
    assert wg._ws(64, False) and wg._ws(128, True) and not wg._ws(64, True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("M", [1, 64, 300])
def test_gpu_float64_outputs_take_fp32_exact(M, rng):
    """A float64 output on CUDA, from every kind of a (bf16 rows at decode and prefill sizes, MX, a pending fold,
    FP8 rowwise) and MXFP4 / MXFP8 weights, packed or not: fp32-exact (the tensor-core kernels write 16- and
    32-bit outputs; decode-w16 raised KeyError), within the bound."""
    K, N = 256, 128
    for wfmt in ("mxfp4_e2m1", "mxfp8_e4m3"):
        w = rand_mx((N, K), wfmt, rng, device="cuda")
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        operands = [x, mxkit.quantize(x, "mxfp8_e4m3"), mxkit.quantize_fp8_rowwise(x)]
        if wfmt == "mxfp4_e2m1":
            operands.append(mxkit.quantize_fold(x, "mxfp4", defer=True))
        for b in (w, mxkit.pack_weight(w)):
            for a in operands:
                assert mxkit.gemm_plan(a, b, out_dtype=torch.float64).path == "fp32-exact"
                y = mxkit.matmul(a, b, out_dtype=torch.float64)
                assert y.dtype == torch.float64
                assert_within_bound(y, a.complete() if hasattr(a, "complete") else a, b.source if hasattr(
                    b, "source") else b)
