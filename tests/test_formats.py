"""Element codecs, E8M0, format constants and name parsing (mxkit.formats) against ml_dtypes and hand-derived
tables. Byte comparisons only; no tolerances."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import (
    FLOAT_FORMAT_NAMES,
    FORMAT_NAMES,
    ROUNDINGS,
    SPECS,
    assert_bytes_equal,
    element_grid,
    ml_decode,
    ml_dtype,
    ml_dtypes,
    oracle_round,
    oracle_scale_exp,
)
from mxkit import formats as F
from mxkit.formats import (
    Rounding,
    ScaleMode,
    decode_elements,
    e8m0_to_float32,
    encode_elements,
    floor_log2,
    get_format,
    shared_exponent,
)


def _enc(vals, fmt, rounding):
    return encode_elements(torch.tensor(vals, dtype=torch.float32), fmt, rounding)


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as IEEE values including NaN positions and the sign of zero."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nan = np.isnan(a)
    return (
        np.array_equal(nan, np.isnan(b))
        and np.array_equal(a[~nan], b[~nan])
        and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan]))
    )


# ---------------------------------------------------------------------------------------------------------
# exhaustive code space


@pytest.mark.parametrize("fmt", FLOAT_FORMAT_NAMES)
def test_decode_every_code_matches_ml_dtypes(fmt):
    spec = SPECS[fmt]
    codes = np.arange(1 << spec.bits, dtype=np.uint8)
    ours = decode_elements(torch.from_numpy(codes), fmt)
    assert ours.dtype == torch.float32
    assert _same_values(ours.numpy(), ml_decode(codes, fmt)), fmt


def test_decode_special_codes_by_hand():
    dec = lambda c, f: decode_elements(torch.tensor(c, dtype=torch.uint8), f).tolist()  # noqa: E731
    # E4M3: S.1111.111 is the only NaN (no Inf); 0x7E = 448; 0x80 = -0
    e4 = dec([0x7F, 0xFF, 0x7E, 0xFE, 0x80, 0x01, 0x08], "mxfp8_e4m3")
    assert math.isnan(e4[0]) and math.isnan(e4[1])
    assert e4[2:4] == [448.0, -448.0] and math.copysign(1, e4[4]) == -1 and e4[4] == 0
    assert e4[5] == 2.0**-9 and e4[6] == 2.0**-6  # min subnormal, min normal
    # E5M2: exponent 11111 with mantissa 0 = Inf, else NaN; 0x7B = 57344
    e5 = dec([0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFF, 0x7B, 0x01], "mxfp8_e5m2")
    assert e5[0] == math.inf and e5[1] == -math.inf and all(math.isnan(v) for v in e5[2:6])
    assert e5[6] == 57344.0 and e5[7] == 2.0**-16
    # FP6/FP4 have no specials: the all-ones codes are ± max normal
    assert dec([0x1F, 0x3F], "mxfp6_e3m2") == [28.0, -28.0]
    assert dec([0x1F, 0x3F], "mxfp6_e2m3") == [7.5, -7.5]
    assert dec(list(range(16)), "mxfp4_e2m1") == [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]


def test_decode_mxint8_all_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = decode_elements(codes, "mxint8")
    expected = torch.tensor([(c - 256 if c >= 128 else c) / 64 for c in range(256)], dtype=torch.float32)
    assert torch.equal(ours, expected)
    assert ours[0x80].item() == -2.0 and ours[0x7F].item() == 127 / 64 and ours[0x81].item() == -127 / 64


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_decode_codes_out_of_range_give_nan(fmt):
    """A code outside [0, 2^bits) (bits above the format's in a uint8, or an int32 / int64 one past the range or
    negative) decodes to NaN: the extra bits landed in the sign or were dropped, giving plausible values. int8 codes
    are their bytes (two's complement), as uint8 ones."""
    bits = SPECS[fmt].bits
    valid = torch.arange(1 << bits, dtype=torch.int64)
    want = decode_elements(valid.to(torch.uint8), fmt)
    for dtype in (torch.int16, torch.int32, torch.int64):
        assert _same_values(decode_elements(valid.to(dtype), fmt).numpy(), want.numpy()), dtype
        bad = decode_elements(torch.tensor([-1, 1 << bits, (1 << bits) + 3, 1000], dtype=dtype), fmt)
        assert bad.isnan().all(), (dtype, bad)
    if bits < 8:
        assert decode_elements(torch.arange(1 << bits, 256, dtype=torch.int32).to(torch.uint8), fmt).isnan().all()
    got = decode_elements(torch.arange(-128, 128, dtype=torch.int8), fmt)
    want = decode_elements(torch.arange(-128, 128, dtype=torch.int8).view(torch.uint8), fmt)
    assert _same_values(got.numpy(), want.numpy())


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_finite_value_reencodes_to_its_code(fmt, rounding):
    spec = SPECS[fmt]
    codes = np.arange(1 << spec.bits, dtype=np.uint8)
    vals = ml_decode(codes, fmt)
    keep = np.isfinite(vals)
    if spec.is_int:
        keep &= codes != 0x80  # -128/64 = -2.0 lies outside the symmetric range; checked below
    got = encode_elements(torch.from_numpy(vals[keep].astype(np.float32)), fmt, rounding)
    assert_bytes_equal(got, torch.from_numpy(codes[keep]), f"{fmt} {rounding} re-encode")


def test_mxint8_saturates_symmetrically():
    # OCP §5.4 / mxkit doc: MXINT8 saturates to ±127/64; -2.0 (code 0x80) is never produced
    got = _enc([-2.0, -1.99, 2.0, 1e30, -1e30, -127 / 64], "mxint8", "rne")
    assert got.tolist() == [0x81, 0x81, 0x7F, 0x7F, 0x81, 0x81]


def test_e8m0_every_code():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = e8m0_to_float32(b)
    ref = b.numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert _same_values(ours.numpy(), ref)
    # byte 0 = 2^-127 exactly: an fp32 denormal with bits 0x00400000 (not flushed, not 2^-126)
    assert ours[0].view(torch.int32).item() == 0x00400000 and ours[0].item() == 2.0**-127
    assert ours[1].item() == 2.0**-126 and ours[127].item() == 1.0 and ours[254].item() == 2.0**127
    assert math.isnan(ours[255].item())
    # the float8_e8m0fnu view decodes the same, and torch's own decoder agrees
    assert torch.equal(e8m0_to_float32(b.view(torch.float8_e8m0fnu)).nan_to_num(3.0), ours.nan_to_num(3.0))
    assert torch.equal(b.view(torch.float8_e8m0fnu).to(torch.float32).nan_to_num(3.0), ours.nan_to_num(3.0))


# ---------------------------------------------------------------------------------------------------------
# rounding: written-out ties (value, RNE result, AWAY result, why)

TIES = {
    "mxfp4_e2m1": [  # grid 0 .5 1 1.5 2 3 4 6; codes 0..7, "even" = code with mantissa bit 0
        (0.25, 0.0, 0.5, "0|0.5: code 0 even"),
        (0.75, 1.0, 1.0, "0.5|1.0: code 2 (1.0) even"),
        (1.25, 1.0, 1.5, "1.0|1.5: 1.0 = code 2 even"),
        (1.75, 2.0, 2.0, "1.5|2.0: 2.0 = code 4 even"),
        (2.5, 2.0, 3.0, "2|3: 2 = code 4 even"),
        (3.5, 4.0, 4.0, "3|4: 4 = code 6 even"),
        (5.0, 4.0, 6.0, "4|6: 4 = code 6 even"),
        (6.5, 6.0, 6.0, "above max: saturates"),
    ],
    "mxfp6_e2m3": [  # subnormal step 1/8 below 1; step 1/8 in [1,2), 1/4 in [2,4), 1/2 in [4,7.5]
        (0.0625, 0.0, 0.125, "0|1/8 (subnormal): 0 even"),
        (0.1875, 0.25, 0.25, "1/8 (code 1)|1/4 (code 2): code 2 even"),
        (0.3125, 0.25, 0.375, "1/4 (code 2)|3/8 (code 3): code 2 even"),
        (0.9375, 1.0, 1.0, "7/8 (max subnormal, code 7)|1.0 (code 8): code 8 even"),
        (1.0625, 1.0, 1.125, "1.0 (code 8)|1.125 (code 9)"),
        (2.125, 2.0, 2.25, "2.0 (code 16)|2.25 (code 17)"),
        (2.375, 2.5, 2.5, "2.25 (17)|2.5 (18)"),
        (3.875, 4.0, 4.0, "3.75 (23)|4.0 (24): binade carry"),
        (7.25, 7.0, 7.5, "7.0 (30)|7.5 (31)"),
        (7.75, 7.5, 7.5, "above max: saturates"),
    ],
    "mxfp6_e3m2": [  # subnormal step 1/16 below 1/4; step 1/4 in [1,2); 4 in [16, 28]
        (0.03125, 0.0, 0.0625, "0|1/16 (subnormal)"),
        (0.09375, 0.125, 0.125, "1/16 (code 1)|1/8 (code 2)"),
        (0.15625, 0.125, 0.1875, "1/8 (code 2)|3/16 (code 3)"),
        (0.234375, 0.25, 0.25, "3/16 (code 3, max subnormal)|1/4 (code 4, min normal)"),
        (1.125, 1.0, 1.25, "1.0 (code 12)|1.25 (code 13)"),
        (18.0, 16.0, 20.0, "16 (code 28)|20 (code 29)"),
        (26.0, 24.0, 28.0, "24 (code 30)|28 (code 31)"),
        (30.0, 28.0, 28.0, "above max: saturates"),
    ],
    "mxfp8_e4m3": [  # subnormal step 2^-9 below 2^-6
        (2.0**-10, 0.0, 2.0**-9, "0|2^-9 (min subnormal)"),
        (3 * 2.0**-10, 2.0**-8, 2.0**-8, "2^-9 (code 1)|2^-8 (code 2)"),
        (5 * 2.0**-10, 2.0**-8, 3 * 2.0**-9, "2^-8 (code 2)|3*2^-9 (code 3)"),
        (13 * 2.0**-10, 6 * 2.0**-9, 7 * 2.0**-9, "code 6|code 7 (max subnormal)"),
        (15 * 2.0**-10, 2.0**-6, 2.0**-6, "7*2^-9 (code 7)|2^-6 (code 8): subnormal -> normal carry"),
        (1.0625, 1.0, 1.125, "1.0 (0x38)|1.125 (0x39)"),
        (400.0, 384.0, 416.0, "384 (0x7C)|416 (0x7D)"),
        (432.0, 448.0, 448.0, "416 (0x7D)|448 (0x7E); 0x7F is NaN"),
        (464.0, 448.0, 448.0, "above max: saturates, never the NaN code"),
    ],
    "mxfp8_e5m2": [  # subnormal step 2^-16 below 2^-14
        (2.0**-17, 0.0, 2.0**-16, "0|2^-16"),
        (3 * 2.0**-17, 2.0**-15, 2.0**-15, "2^-16 (code 1)|2^-15 (code 2)"),
        (1.125, 1.0, 1.25, "1.0 (0x3C)|1.25 (0x3D)"),
        (1.375, 1.5, 1.5, "1.25 (0x3D)|1.5 (0x3E)"),
        (36864.0, 32768.0, 40960.0, "32768 (0x78)|40960 (0x79)"),
        (53248.0, 49152.0, 57344.0, "49152 (0x7A, mantissa 10: even)|57344 (0x7B)"),
        (61440.0, 57344.0, 57344.0, "above max: saturates, never Inf"),
    ],
    "mxint8": [  # grid n/64, two's complement
        (0.5 / 64, 0.0, 1 / 64, "0|1: 0 even"),
        (1.5 / 64, 2 / 64, 2 / 64, "1|2: 2 even"),
        (2.5 / 64, 2 / 64, 3 / 64, "2|3: 2 even"),
        (126.5 / 64, 126 / 64, 127 / 64, "126|127: 126 even"),
        (127.5 / 64, 127 / 64, 127 / 64, "above max: saturates to 127 (symmetric)"),
    ],
}


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_ties_written_out(fmt):
    rows = TIES[fmt]
    for rounding, col in (("rne", 1), ("away", 2)):
        for sign in (1.0, -1.0):
            vals = [sign * r[0] for r in rows]
            want = [sign * r[col] for r in rows]
            got = decode_elements(_enc(vals, fmt, rounding), fmt).tolist()
            for r, g, w in zip(rows, got, want):
                assert g == w, f"{fmt} {rounding} {sign * r[0]!r}: got {g!r}, expected {w!r} ({r[3]})"


@pytest.mark.parametrize("fmt", FLOAT_FORMAT_NAMES)
def test_rne_matches_ml_dtypes_cast(fmt, rng):
    # ml_dtypes' float32 -> element cast is round-to-nearest-even; inside ± max_normal it must agree bytewise
    spec = SPECS[fmt]
    x = torch.randn(20000, generator=rng) * torch.exp2(torch.randint(-30, 12, (20000,), generator=rng).float())
    x = x.clamp(-spec.max_normal, spec.max_normal)
    grid, _ = element_grid(fmt)
    mids = torch.tensor((grid[1:] + grid[:-1]) / 2, dtype=torch.float32)  # every tie, both signs
    x = torch.cat([x, mids, -mids, torch.tensor([0.0, -0.0, 2.0**-149, -(2.0**-149), 1e-40])])
    ours = encode_elements(x, fmt, "rne")
    ref = x.numpy().astype(ml_dtype(fmt)).view(np.uint8)
    assert_bytes_equal(ours, torch.from_numpy(ref.copy()), f"{fmt} rne vs ml_dtypes")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_encode_matches_float64_model(fmt, rounding, rng):
    spec = SPECS[fmt]
    grid, _ = element_grid(fmt)
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.randn(20000, generator=rng) * torch.exp2(torch.randint(-30, 20, (20000,), generator=rng).float())
    x = torch.cat([x, torch.tensor(np.concatenate([mids, -mids, grid, -grid]), dtype=torch.float32)])
    ours = encode_elements(x, fmt, rounding)
    mag = oracle_round(np.abs(x.numpy().astype(np.float64)), fmt, rounding).astype(np.int64)
    neg = np.signbit(x.numpy())
    if spec.is_int:
        ref = np.where(neg, (-mag) & 0xFF, mag)
    else:
        ref = np.where(neg, mag | spec.sign_bit, mag)
    assert_bytes_equal(ours, torch.from_numpy(ref.astype(np.uint8)), f"{fmt} {rounding}")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_saturation_never_makes_specials(fmt, rounding):
    spec = SPECS[fmt]
    big = [spec.max_normal * 1.0001, spec.max_normal * 1.5, spec.max_normal * 2, 1e20, 3.0e38,
           float(torch.finfo(torch.float32).max)]
    vals = big + [-v for v in big]
    codes = _enc(vals, fmt, rounding)
    dec = decode_elements(codes, fmt)
    want = torch.tensor([spec.max_normal] * len(big) + [-spec.max_normal] * len(big))
    assert torch.equal(dec, want), f"{fmt}: {dec.tolist()}"
    assert torch.isfinite(dec).all()


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_fp32_denormal_inputs_round_to_signed_zero(fmt, rounding):
    spec = SPECS[fmt]
    den = [2.0**-149, 2.0**-130, (2.0**-126) * (1 - 2.0**-23), 1e-40]
    codes = _enc(den + [-d for d in den] + [0.0, -0.0], fmt, rounding).tolist()
    neg_zero = 0 if spec.is_int else spec.sign_bit  # float formats keep the sign; INT8 has no -0
    assert codes == [0] * 4 + [neg_zero] * 4 + [0, neg_zero]


@pytest.mark.parametrize("fmt", FLOAT_FORMAT_NAMES)
def test_subnormal_element_results(fmt):
    # every element subnormal k * min_subnormal encodes to code k (exponent field 0)
    spec = SPECS[fmt]
    step = 2.0 ** (spec.emin - spec.mbits)
    ks = list(range(1, 1 << spec.mbits))
    for rounding in ROUNDINGS:
        assert _enc([k * step for k in ks], fmt, rounding).tolist() == ks


# ---------------------------------------------------------------------------------------------------------
# constants, helpers, names


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_format_constants(fmt):
    f = get_format(fmt)
    spec = SPECS[fmt]
    assert (f.bits, f.mbits, f.emax, f.max_normal) == (spec.bits, spec.mbits, spec.emax, spec.max_normal)
    if not spec.is_int:
        fi = ml_dtypes.finfo(ml_dtype(fmt))
        assert f.max_normal == float(fi.max)
        assert f.min_normal == float(fi.smallest_normal)
        assert f.min_subnormal == float(fi.smallest_subnormal)
        assert f.emin == spec.emin
        assert f.max_code == int(element_grid(fmt)[1][-1])
    assert f.bits_per_element() == spec.bits + 0.25


def test_format_names_and_aliases():
    assert get_format("mxfp4").name == "mxfp4_e2m1"
    assert get_format(" MXFP8 ").name == "mxfp8_e4m3"
    assert get_format("mxfp6").name == "mxfp6_e2m3"
    assert get_format(F.MXINT8) is F.MXINT8
    with pytest.raises(ValueError, match="known: .*mxfp4_e2m1"):
        get_format("mxfp5")
    with pytest.raises(TypeError):
        get_format(4)


def test_mode_and_rounding_names():
    assert ScaleMode.parse("RCEIL") is ScaleMode.RCEIL and ScaleMode.parse(ScaleMode.EVEN) is ScaleMode.EVEN
    assert Rounding.parse(" Away ") is Rounding.AWAY
    with pytest.raises(ValueError, match="'floor', 'ceil', 'rceil', 'even'"):
        ScaleMode.parse("nearest")
    with pytest.raises(ValueError, match="'rne', 'away'"):
        Rounding.parse("stochastic")
    with pytest.raises(ValueError):
        ScaleMode.parse(3)


def test_bit_helpers_take_a_negative_bit_view(rng):
    """floor_log2 and shared_exponent of a negative-bit view (torch._neg_view; c.conj().imag) are those of its values
    (a dtype view of it raised)."""
    v = torch.randn(64, generator=rng).abs() * 100
    neg = torch._neg_view(-v)
    assert neg.is_neg() and torch.equal(neg, v)
    for got, want in zip(floor_log2(neg), floor_log2(v.clone())):
        assert torch.equal(got, want)
    for mode in ("floor", "rceil"):
        assert torch.equal(shared_exponent(neg, "mxfp8_e4m3", mode), shared_exponent(v.clone(), "mxfp8_e4m3", mode))


def test_floor_log2_exact_including_denormals(rng):
    bits = torch.randint(1, 0x7F800000, (50000,), generator=rng, dtype=torch.int32)
    bits = torch.cat([bits, torch.tensor([1, 2, 0x007FFFFF, 0x00800000, 0x7F7FFFFF], dtype=torch.int32)])
    a = bits.view(torch.float32)
    e, frac = floor_log2(a)
    m, ee = np.frexp(a.numpy().astype(np.float64))
    assert np.array_equal(e.numpy(), ee - 1)
    assert np.array_equal(frac.numpy().astype(np.float64), (2 * m - 1) * 2.0**23)
    e0, f0 = floor_log2(torch.zeros(1))
    assert e0.item() == -150 and f0.item() == 0
    assert [t.item() for t in floor_log2(torch.tensor([-8.0]))] == [3, 0]  # (the sign ignored, as documented)
    # its siblings' input check (a Python float raised AttributeError; float64 1e300 gave E = 128, rounded to Inf)
    for bad, match in ((3.0, "got float"), (torch.tensor([1e300], dtype=torch.float64), "got torch.float64"),
                       (torch.tensor([1j]), "got torch.complex64")):
        with pytest.raises(TypeError, match=match):
            floor_log2(bad)


def test_small_helpers_refuse_what_gave_garbage():
    """decode_elements of a wide unsigned code past the format's (a uint64 2^32 + 3 wrapped to code 3, 1.5 in
    FP4) is NaN as documented; bits_per_element refuses a block size that is not a positive int (0 divided by
    zero, -32 gave 3.75 bits)."""
    f4 = get_format("mxfp4")
    got = decode_elements(torch.tensor([3, 2**32 + 3, 2**63 + 3], dtype=torch.uint64), f4)
    assert got[0].item() == 1.5 and bool(got[1:].isnan().all())
    got = decode_elements(torch.tensor([0x38, 2**31 + 0x38], dtype=torch.uint32), "mxfp8_e4m3")
    assert got[0].item() == 1.0 and bool(got[1].isnan())
    for bad in (0, -32, True, 32.0):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            f4.bits_per_element(bad)
    assert f4.bits_per_element(np.int64(32)) == 4.25
    # as_int leaves what is no integer to the caller's own check (a one-element array raised NumPy's TypeError)
    arr = np.array([5])
    assert F.as_int(arr) is arr and F.as_int(np.int32(5)) == 5 and type(F.as_int(np.int32(5))) is int


def test_bitcast_under_vmap(rng):
    """F.bitcast views a tensor's bits as another dtype of the same size, also through torch.func.vmap (nested, the
    batch dimension anywhere; torch 2.11's vmap has no rule for view.dtype): the bits of the unbatched view, and
    mxkit's reference quantize under vmap gives the bytes of the unbatched call."""
    x = torch.randn(3, 4, 64, generator=rng)
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])  # (specials and a float32 denormal)
    assert torch.equal(F.bitcast(x, torch.int32), x.view(torch.int32))
    nested = torch.func.vmap(torch.func.vmap(lambda t: F.bitcast(t, torch.int32), in_dims=1), in_dims=2)(x)
    assert torch.equal(nested, x.permute(2, 1, 0).contiguous().view(torch.int32))
    back = torch.func.vmap(lambda t: F.bitcast(F.bitcast(t, torch.int32), torch.float32), in_dims=1)(x)
    assert torch.equal(back.view(torch.int32), x.transpose(0, 1).view(torch.int32))
    from mxkit.reference import quantize_reference

    for fmt in ("mxfp8_e4m3", "mxfp4_e2m1"):
        got = torch.func.vmap(lambda t: quantize_reference(t, fmt).qdata, in_dims=1)(x)
        assert torch.equal(got, quantize_reference(x.transpose(0, 1).contiguous(), fmt).qdata), fmt


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_shared_exponent_specials(fmt):
    amax = torch.tensor([0.0, float("nan"), float("inf"), 2.0**-149, 3.0e38])
    for mode in ("floor", "ceil", "rceil", "even"):
        s = shared_exponent(amax, fmt, mode).tolist()
        assert s[0] == 0 and s[1] == 255 and s[2] == 255, (fmt, mode, s)
        assert s[3] == 0, "fp32 denormal amax clamps to 2^-127"
        top = int(np.clip(oracle_scale_exp(np.array([amax[4].item()]), fmt, mode), -127, 127)[0]) + 127
        assert s[4] == top, (fmt, mode, s[4], top)  # (the clamp at float32's top: `<= 254` let any byte pass)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_encode_nan_and_inf_are_defined(fmt):
    """NaN gives the format's NaN code (0x7F) where it has one, else code 0 (+0); ±Inf saturates to ± max normal;
    the finite neighbours in the same call keep their codes."""
    f = get_format(fmt)
    v = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 1.0])
    got = encode_elements(v, fmt).tolist()
    nan_code = 0x7F if (f.has_nan or f.has_inf) else 0
    assert got[:2] == [nan_code, nan_code], (fmt, got)
    top = _enc([f.max_normal, -f.max_normal, 1.0], fmt, "rne").tolist()
    assert got[2:] == top, (fmt, got, top)
    if nan_code:
        assert math.isnan(decode_elements(torch.tensor([nan_code], dtype=torch.uint8), fmt).item())


def test_codecs_refuse_values_that_are_not_theirs(rng):
    """float64 values would round twice (to float32, then to the grid): TypeError, as for codes that are floats;
    a float8 view of E4M3 / E5M2 codes is read as its bytes."""
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        encode_elements(torch.ones(2, dtype=torch.float64), "mxfp4")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        shared_exponent(torch.ones(2, dtype=torch.float64), "mxfp4", "floor")
    for bad in (torch.ones(2), torch.ones(2, dtype=torch.bool), [1, 2]):
        with pytest.raises(TypeError, match="element codes"):
            decode_elements(bad, "mxfp8")
    # (non-tensors raised AttributeError: 'list' object has no attribute 'dtype')
    with pytest.raises(TypeError, match="encode_elements takes a float32, bfloat16 or float16 tensor, got list"):
        encode_elements([1.0, 2.0], "mxfp4")
    with pytest.raises(TypeError, match="shared_exponent takes a float32, bfloat16 or float16 tensor, got list"):
        shared_exponent([1.0], "mxfp4", "floor")
    with pytest.raises(TypeError, match="E8M0 scales must be a uint8 or float8_e8m0fnu tensor, got list"):
        F.e8m0_to_float32([127])
    for fmt, view in (("mxfp8_e4m3", torch.float8_e4m3fn), ("mxfp8_e5m2", torch.float8_e5m2)):
        codes = torch.randint(0, 256, (64,), generator=rng, dtype=torch.int32).to(torch.uint8)
        assert _same_values(decode_elements(codes.view(view), fmt).numpy(), decode_elements(codes, fmt).numpy())


def test_codecs_ignore_torch_default_device(rng):
    """RCEIL's constant and the scale layouts' tile permutation do not allocate on torch's default device: a CPU
    tensor quantizes inside ``with torch.device("meta")`` (deferred init) to the same bytes."""
    import mxkit

    x = torch.randn(4, 64, generator=rng)
    want = [mxkit.quantize(x, "mxfp8", scale_mode="rceil"), mxkit.quantize(x, "mxfp4", scale_layout="nvidia_128x4")]
    with torch.device("meta"):
        got = [mxkit.quantize(x, "mxfp8", scale_mode="rceil"),
               mxkit.quantize(x, "mxfp4", scale_layout="nvidia_128x4")]
    for a, b in zip(got, want):
        assert a.qdata.device.type == "cpu"
        assert_bytes_equal(a.qdata, b.qdata)  # (two statements: it returns None, so `and` skipped the scale)
        assert_bytes_equal(a.scale, b.scale)

