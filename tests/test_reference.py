"""mxkit.reference (quantize / dequantize / packing) against hand-built blocks and an independent float64 model
(``conftest.oracle_quantize``). Bytes are compared exactly; the only float comparisons are exact ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mxkit
from conftest import (
    FORMAT_NAMES,
    INPUT_DTYPES,
    ROUNDINGS,
    SCALE_MODES,
    SPECS,
    assert_bytes_equal,
    assert_mx_equal,
    element_grid,
    ml_decode,
    oracle_quantize,
    oracle_round,
    oracle_unpack,
    rand_blocks,
    rand_tensor,
    special_blocks,
)
from mxkit.formats import decode_elements, e8m0_to_float32
from mxkit.reference import dequantize_reference, pack_codes, quantize_reference, unpack_codes

HYP = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def q_codes(x, fmt, mode="floor", rounding="rne", **kw):
    """(scale bytes, unpacked element codes) of mxkit's reference, unpacked by the independent unpacker."""
    q = quantize_reference(x, fmt, scale_mode=mode, rounding=rounding, **kw)
    return q.scale, oracle_unpack(q.qdata, fmt)


def block(vals, n=32):
    t = torch.zeros(1, n)
    t[0, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return t


def dec(codes, fmt):
    return torch.from_numpy(ml_decode(codes.numpy(), fmt))


# ---------------------------------------------------------------------------------------------------------
# scale modes on hand-built blocks (expected bytes worked out by hand, reason in the comment)

# FP4 (emax 2, max normal 6):
#   amax 7   = 1.75 * 2^2 (bits 0x40E00000): FLOOR 2-2 = 0; CEIL 3-2 = 1; RCEIL 7/6 -> 2^1; EVEN mantissa
#              0x600000 + 0x200000 = 0x800000 carries into the exponent -> 8 -> 3-2 = 1
#   amax 5.9 = 1.475 * 2^2 (0x40BCCCCD): FLOOR 0; CEIL 1; RCEIL 5.9 <= 6 -> 0; EVEN 0x3CCCCD + 0x200000 =
#              0x5CCCCD < 0x800000, no carry -> 0
#   amax 6   = 1.5 * 2^2: FLOOR 0; CEIL 1 (not a power of two); RCEIL 0 (6 <= 6); EVEN 0x400000+0x200000 -> 0
#   amax 4   = 2^2: every mode 0
FP4_SCALE_CASES = [
    (7.0, {"floor": 0, "ceil": 1, "rceil": 1, "even": 1}),
    (5.9, {"floor": 0, "ceil": 1, "rceil": 0, "even": 0}),
    (6.0, {"floor": 0, "ceil": 1, "rceil": 0, "even": 0}),
    (4.0, {"floor": 0, "ceil": 0, "rceil": 0, "even": 0}),
]
# E4M3 (emax 8, max normal 448 = 1.75 * 2^8, EVEN adds 1 << 19 = 0x80000):
#   448 (mant 0x600000): FLOOR 0, CEIL 1, RCEIL 0, EVEN 0x680000 no carry -> 0
#   449 (mant 0x608000): FLOOR 0 (449 saturates to 448), CEIL 1, RCEIL 1, EVEN 0x688000 -> 0 (saturates)
#   480 (mant 0x700000): FLOOR 0, CEIL 1, RCEIL 1, EVEN 0x780000 -> 0 (480 saturates to 448)
#   496 (mant 0x780000): EVEN 0x800000 carries -> 1
E4M3_SCALE_CASES = [
    (448.0, {"floor": 0, "ceil": 1, "rceil": 0, "even": 0}),
    (449.0, {"floor": 0, "ceil": 1, "rceil": 1, "even": 0}),
    (480.0, {"floor": 0, "ceil": 1, "rceil": 1, "even": 0}),
    (496.0, {"floor": 0, "ceil": 1, "rceil": 1, "even": 1}),
]


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize(
    "fmt,amax,expected",
    [("mxfp4_e2m1", a, e) for a, e in FP4_SCALE_CASES] + [("mxfp8_e4m3", a, e) for a, e in E4M3_SCALE_CASES],
)
def test_scale_modes_hand_built(fmt, amax, expected, mode):
    s, c = q_codes(block([amax, -1.0]), fmt, mode)
    X = expected[mode]
    assert s.tolist() == [[127 + X]], (fmt, amax, mode)
    # the amax element: amax / 2^X rounded (RNE), saturating at max normal
    want = ml_decode(oracle_round(np.array([amax / 2**X]), fmt, "rne"), fmt).item()
    assert dec(c[:, :1], fmt).item() == want
    assert dec(c[:, 1:2], fmt).item() == -1.0 / 2**X


def test_fp4_amax7_floor_clips_rceil_does_not():
    x = block([7.0, 3.5, -7.0])
    s, c = q_codes(x, "mxfp4", "floor")
    assert s.item() == 127 and c[0, :3].tolist() == [0x7, 0x6, 0xF]  # 7 -> 6 (clipped), 3.5 -> 4 (RNE)
    s, c = q_codes(x, "mxfp4", "rceil")
    assert s.item() == 128 and c[0, :3].tolist() == [0x6, 0x4, 0xE]  # 7/2 = 3.5 -> 4, 3.5/2 = 1.75 -> 2


@pytest.mark.parametrize("k", [-120, -5, 0, 7, 100])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_amax_exactly_max_normal_times_power_of_two(fmt, k):
    # max_normal is not a power of two in any format and its mantissa needs no rounding at mbits:
    # FLOOR k, CEIL k + 1, RCEIL k (exact fit), EVEN k; the amax element is then the max code (or its half)
    mn = SPECS[fmt].max_normal
    x = block([mn * 2.0**k, -mn * 2.0**k / 4])
    for mode, X in (("floor", k), ("ceil", k + 1), ("rceil", k), ("even", k)):
        s, c = q_codes(x, fmt, mode)
        assert s.item() == 127 + X, (fmt, k, mode)
        if mode != "ceil":
            assert dec(c[:, :1], fmt).item() == mn


@pytest.mark.parametrize("j", [-100, -1, 0, 1, 20, 120])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_amax_power_of_two_all_modes_agree(fmt, j):
    emax = SPECS[fmt].emax
    x = block([2.0**j, 2.0**j / 3])
    for mode in SCALE_MODES:
        s, c = q_codes(x, fmt, mode)
        assert s.item() == 127 + j - emax, (fmt, j, mode)
        assert dec(c[:, :1], fmt).item() == 2.0**emax


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_zero_blocks(fmt):
    x = torch.stack([torch.zeros(32), -torch.zeros(32)])
    spec = SPECS[fmt]
    for mode in SCALE_MODES:
        for rnd in ROUNDINGS:
            q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
            assert q.scale.tolist() == [[0], [0]]
            codes = oracle_unpack(q.qdata, fmt)
            assert (codes[0] == 0).all()
            assert (codes[1] == (0 if spec.is_int else spec.sign_bit)).all(), "-0 keeps its sign (floats)"
            d = dequantize_reference(q)
            assert torch.equal(d, x) and torch.equal(torch.signbit(d[1]), torch.full((32,), not spec.is_int))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_nonfinite_blocks(fmt):
    nan, inf = float("nan"), float("inf")
    x = torch.stack(
        [torch.full((32,), nan), torch.full((32,), inf), torch.full((32,), -inf), block([1.0, nan, 3.0])[0],
         block([5.0, -inf])[0], block([2.0, 1.0])[0]]
    )
    for mode in SCALE_MODES:
        for rnd in ROUNDINGS:
            q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
            assert q.scale[:5].flatten().tolist() == [255] * 5 and q.scale[5].item() != 255
            assert (q.qdata[:5] == 0).all(), "data bytes of NaN-scale blocks are 0"
            d = dequantize_reference(q)
            assert torch.isnan(d[:5]).all() and torch.isfinite(d[5]).all()


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_scale_clamp_low(fmt):
    # tiny amax (fp32 denormal, and a tiny normal) -> X below -127 -> clamped to byte 0 in every mode
    for a in (2.0**-149, 2.0**-140, (2.0**-126) * (1 - 2.0**-23), 2.0**-126 * 1.5):
        if fmt == "mxint8" and a > 2.0**-140:
            continue  # INT8 has emax 0: amax near 2^-126 gives X = -126 / -127 (see the byte-1 test)
        for mode in SCALE_MODES:
            s, _ = q_codes(block([a]), fmt, mode)
            assert s.item() == 0, (fmt, a, mode)


def test_scale_clamp_high_mxint8():
    f32max = float(torch.finfo(torch.float32).max)
    # amax 3e38 = 1.763 * 2^127: FLOOR 127; CEIL 128 -> clamp 127; RCEIL 3e38 <= (127/64) * 2^127 -> 127;
    # EVEN 1.763 rounds (6 fraction bits) to 1.765625, no carry -> 127. All byte 254.
    for mode in SCALE_MODES:
        s, c = q_codes(block([3.0e38, -1.0]), "mxint8", mode)
        assert s.item() == 254, mode
        assert c[0, 0].item() == 113  # 3e38 / 2^127 = 1.7632 -> 112.85/64 -> 113
    # fp32 max = (2 - 2^-23) * 2^127: RCEIL/CEIL/EVEN want 128, the E8M0 clamp keeps 127, so the element
    # saturates to 127/64 -- the one place where RCEIL clips
    for mode in SCALE_MODES:
        s, c = q_codes(block([f32max, -f32max]), "mxint8", mode)
        assert s.item() == 254 and c[0, :2].tolist() == [0x7F, 0x81], mode


def test_scale_byte1_mxint8_tiny_normal():
    # INT8 (emax 0): amax 1.5 * 2^-126 -> FLOOR X = -126 (byte 1); EVEN: 1.5 needs no carry -> byte 1
    for mode, b in (("floor", 1), ("ceil", 2), ("rceil", 1), ("even", 1)):
        s, _ = q_codes(block([1.5 * 2.0**-126]), "mxint8", mode)
        assert s.item() == b, mode


def test_exact_dequant_of_fp32_denormals_byte0_scale():
    # E4M3, amax 2^-130 -> X = -138 -> clamp -127 (byte 0). x * 2^127:
    #   2^-130 -> 2^-3 = 0x20 (exp field -3 + 7 = 4);  2^-136 -> 2^-9 = 0x01 (min subnormal)
    #   2^-137 -> 2^-10: tie 0|2^-9 -> RNE 0, AWAY 0x01;  2^-140 -> 2^-13 -> 0 either way
    x = block([2.0**-130, 2.0**-136, 2.0**-137, 2.0**-140, -(2.0**-136)])
    for rnd, third in (("rne", 0x00), ("away", 0x01)):
        q = quantize_reference(x, "mxfp8_e4m3", rounding=rnd)
        assert q.scale.item() == 0
        assert q.qdata[0, :5].tolist() == [0x20, 0x01, third, 0x00, 0x81]
        d = dequantize_reference(q)[0, :5].tolist()
        assert d == [2.0**-130, 2.0**-136, 2.0**-136 if third else 0.0, 0.0, -(2.0**-136)]
    # FP4, byte-0 scale: amax 6 * 2^-127 = 1.5 * 2^-125 (normal) -> FLOOR X = -125 - 2 = -127.
    #   6*2^-127 -> 6 (code 7); 2^-128 -> 0.5 (code 1); 2^-129 -> 0.25: RNE 0, AWAY 0.5; 2^-140 -> 0
    x = block([6 * 2.0**-127, 2.0**-128, 2.0**-129, 2.0**-140])
    for rnd, third in (("rne", 0x0), ("away", 0x1)):
        q = quantize_reference(x, "mxfp4", rounding=rnd)
        assert q.scale.item() == 0
        assert q.qdata[0, :2].tolist() == [0x7 | 0x1 << 4, third | 0x0 << 4]
        d = dequantize_reference(q)[0, :4].tolist()
        assert d == [6 * 2.0**-127, 2.0**-128, 2.0**-128 if third else 0.0, 0.0]


# ---------------------------------------------------------------------------------------------------------
# layout: axes, packing, dtypes, views


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_every_axis_of_3d(fmt, axis, rng):
    bs = 8
    x = rand_tensor((16, 8, 24), axis=axis, block_size=bs, generator=rng, special=False)
    q = quantize_reference(x, fmt, axis=axis, block_size=bs, scale_mode="even")
    ref = quantize_reference(x.movedim(axis, -1).contiguous(), fmt, block_size=bs, scale_mode="even")
    ax = axis % 3
    assert q.axis == ax and q.shape == x.shape
    lead = tuple(d for i, d in enumerate(x.shape) if i != ax)
    f = mxkit.get_format(fmt)
    assert tuple(q.qdata.shape) == lead + (x.shape[ax] * f.pack_bytes // f.pack,)
    assert tuple(q.scale.shape) == lead + (x.shape[ax] // bs,)
    assert_bytes_equal(q.qdata, ref.qdata, "qdata")
    assert_bytes_equal(q.scale, ref.scale, "scale")
    s, c = oracle_quantize(x.movedim(axis, -1), fmt, "even", "rne", block_size=bs)
    assert_bytes_equal(q.scale, torch.from_numpy(s), "scale vs oracle")
    assert_bytes_equal(oracle_unpack(q.qdata, fmt), torch.from_numpy(c), "codes vs oracle")
    d = dequantize_reference(q)
    assert d.shape == x.shape
    assert_bytes_equal(d, dequantize_reference(ref).movedim(-1, axis), "dequantize")  # (bytes: -0 is not +0)


def test_non_contiguous_input(rng):
    x = rand_blocks(64, generator=rng).reshape(32, 64)
    xt = x.t()  # (64, 32), axis 0 of the view is contiguous memory
    for fmt in FORMAT_NAMES:
        a = quantize_reference(xt, fmt, axis=0)
        b = quantize_reference(xt.contiguous(), fmt, axis=0)
        assert torch.equal(a.qdata, b.qdata) and torch.equal(a.scale, b.scale)
    y = rand_blocks(64, generator=rng).reshape(16, 128)[:, ::2]  # strided
    for fmt in FORMAT_NAMES:
        assert torch.equal(quantize_reference(y, fmt).qdata, quantize_reference(y.contiguous(), fmt).qdata)


def test_fp6_pack_layout_by_hand():
    a, b, c, d = 0x01, 0x02, 0x2A, 0x3F
    w = a | b << 6 | c << 12 | d << 18  # little-endian 24-bit word
    packed = pack_codes(torch.tensor([[a, b, c, d]], dtype=torch.uint8), "mxfp6_e3m2")
    assert packed.tolist() == [[w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF]]
    assert packed.tolist() == [[0x81, 0xA0, 0xFE]]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_pack_unpack_round_trip(fmt, rng):
    bits = SPECS[fmt].bits
    codes = torch.randint(0, 1 << bits, (3, 5, 64), generator=rng).to(torch.uint8)
    packed = pack_codes(codes, fmt)
    f = mxkit.get_format(fmt)
    assert packed.shape == (3, 5, 64 * f.pack_bytes // f.pack) and packed.dtype == torch.uint8
    assert torch.equal(unpack_codes(packed, fmt), codes)
    assert torch.equal(oracle_unpack(packed, fmt), codes)


def test_reference_helpers_check_their_inputs():
    """pack_codes / unpack_codes / matmul_reference / quantize_fp8_rowwise_reference: a code past the format's bits
    (packed into the next nibble: silent garbage), a length that does not pack, a non-uint8 or 0-d tensor, an
    integer x are TypeError / ValueError naming them (raw reshape / index errors before)."""
    from mxkit.reference import matmul_reference, quantize_fp8_rowwise_reference

    u8 = torch.uint8
    with pytest.raises(ValueError, match="past 4 bits"):
        pack_codes(torch.tensor([[17, 1]], dtype=u8), "mxfp4")
    with pytest.raises(ValueError, match="past 6 bits"):
        pack_codes(torch.tensor([[0, 64, 0, 0]], dtype=u8), "mxfp6_e2m3")
    with pytest.raises(ValueError, match="multiple of 2"):
        pack_codes(torch.zeros(2, 3, dtype=u8), "mxfp4")
    with pytest.raises(ValueError, match="multiple of 3"):
        unpack_codes(torch.zeros(2, 4, dtype=u8), "mxfp6_e3m2")
    with pytest.raises(TypeError, match="uint8"):
        pack_codes(torch.tensor([[1.7, 1.0]]), "mxfp4")
    with pytest.raises(TypeError, match="uint8"):
        unpack_codes(torch.zeros(2, 4, dtype=torch.int32), "mxfp4")
    for fn in (lambda: pack_codes(torch.tensor(3, dtype=u8), "mxfp4"),
               lambda: unpack_codes(torch.tensor(3, dtype=u8), "mxfp8_e4m3"),
               lambda: matmul_reference(torch.tensor(1.0), quantize_reference(torch.randn(4, 32), "mxfp4")),
               lambda: quantize_fp8_rowwise_reference(torch.tensor(1.0))):
        with pytest.raises(ValueError, match="at least one dimension"):
            fn()
    with pytest.raises(TypeError, match="float32 / bfloat16 / float16"):
        quantize_fp8_rowwise_reference(torch.ones(2, 4, dtype=torch.int32))
    assert torch.equal(pack_codes(torch.tensor([[15, 1]], dtype=u8), "mxfp4"), torch.tensor([[0x1F]], dtype=u8))


def test_fp4_nibble_order():
    # block amax 6 -> FLOOR scale 2^0; element 2i in the low nibble
    x = block([6.0, 0.5, -1.0, 2.0, 0.0, -0.0])
    q = quantize_reference(x, "mxfp4")
    assert q.scale.item() == 127
    assert q.qdata[0, :3].tolist() == [0x7 | 0x1 << 4, 0xA | 0x4 << 4, 0x0 | 0x8 << 4]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_half_inputs_equal_fp32(fmt, dtype, rng):
    x = rand_blocks(256, generator=rng, dtype=dtype).reshape(16, 512)
    for mode in SCALE_MODES:
        for rnd in ROUNDINGS:
            a = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
            b = quantize_reference(x.to(torch.float32), fmt, scale_mode=mode, rounding=rnd)
            assert torch.equal(a.qdata, b.qdata) and torch.equal(a.scale, b.scale), (mode, rnd)


def test_mxtensor_views_and_torch_decoders(rng):
    x = rand_blocks(64, generator=rng).reshape(8, 256)
    for fmt, tdt in (("mxfp8_e4m3", torch.float8_e4m3fn), ("mxfp8_e5m2", torch.float8_e5m2)):
        q = quantize_reference(x, fmt)
        v = q.qdata_view()
        assert v.dtype == tdt and v.shape == q.qdata.shape
        assert torch.equal(v.to(torch.float32), decode_elements(q.qdata, fmt))  # torch's own fp8 decoder
    q = quantize_reference(x, "mxint8")
    assert q.qdata_view().dtype == torch.int8
    assert torch.equal(q.qdata_view().to(torch.float32) / 64, decode_elements(q.qdata, "mxint8"))
    q = quantize_reference(x, "mxfp4")
    v = q.qdata_view()
    assert v.dtype == torch.float4_e2m1fn_x2 and v.shape == q.qdata.shape
    with pytest.raises(TypeError, match="mxfp6"):
        quantize_reference(x, "mxfp6_e2m3").qdata_view()
    s = q.scale_view()
    assert s.dtype == torch.float8_e8m0fnu
    assert torch.equal(s.to(torch.float32), e8m0_to_float32(q.scale))  # torch's own e8m0 decoder


def test_dequantize_output_dtypes(rng):
    x = rand_blocks(64, generator=rng).reshape(8, 256)
    q = quantize_reference(x, "mxfp8_e5m2")
    d32 = dequantize_reference(q)
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        assert_bytes_equal(dequantize_reference(q, dt), d32.to(dt), f"dequantize {dt}")
    assert dequantize_reference(q, None).dtype == torch.float32
    with pytest.raises(TypeError, match="int32"):
        dequantize_reference(q, torch.int32)
    # a dtype's name is no dtype (the message read "dtype=float32 is not supported; expected float32, ...")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype .* or None, got str 'float32'"):
        mxkit.dequantize(q, "float32")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype .* or None, got str 'bfloat16'"):
        mxkit.matmul(torch.randn(2, 256), mxkit.quantize(torch.randn(4, 256), "mxfp4"), out_dtype="bfloat16")
    with pytest.raises(TypeError, match="dtype='float32': torch.float32"):
        mxkit.quantize_fp8_rowwise(x).dequantize("float32")
    # expected_shapes takes a format's name, and an axis out of range is an error (axis 2 of 2-D gave axis 0's)
    assert mxkit.MXTensor.expected_shapes((4, 64), 1, "mxfp4", 32) == ((4, 32), (4, 2))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for a 2-D shape \(4, 64\)"):
        mxkit.MXTensor.expected_shapes((4, 64), 2, "mxfp4", 32)


def test_ops_quantize_on_cpu_is_the_reference(rng):
    x = rand_blocks(64, generator=rng).reshape(8, 256)
    for fmt in FORMAT_NAMES:
        a = mxkit.quantize(x, fmt, scale_mode="rceil")
        b = quantize_reference(x, fmt, scale_mode="rceil")
        assert torch.equal(a.qdata, b.qdata) and torch.equal(a.scale, b.scale)
        assert_bytes_equal(mxkit.dequantize(a), dequantize_reference(b), f"dequantize {fmt}")


# ---------------------------------------------------------------------------------------------------------
# errors


def test_errors():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match=r"x.shape\[1\]=48.*\(4, 48\).*axis=1.*block_size=32"):
        quantize_reference(torch.randn(4, 48), "mxfp4")
    with pytest.raises(ValueError, match=r"x.shape\[0\]=4"):
        quantize_reference(x, "mxfp4", axis=0)
    for bad in (torch.ones(4, 64, dtype=torch.int32), torch.randn(4, 64, dtype=torch.float64)):
        with pytest.raises(TypeError, match="dtype"):
            quantize_reference(bad, "mxfp4")
    with pytest.raises(TypeError):
        quantize_reference([1.0] * 32, "mxfp4")
    with pytest.raises(ValueError, match="empty"):
        quantize_reference(torch.empty(0, 32), "mxfp4")
    with pytest.raises(ValueError, match="0-dim"):
        quantize_reference(torch.tensor(1.0), "mxfp4")
    with pytest.raises(ValueError, match="known: .*mxfp8_e4m3"):
        quantize_reference(x, "fp4")
    with pytest.raises(ValueError, match="'floor', 'ceil', 'rceil', 'even'"):
        quantize_reference(x, "mxfp4", scale_mode="round")
    with pytest.raises(ValueError, match="'rne', 'away'"):
        quantize_reference(x, "mxfp4", rounding="nearest")
    for axis in (2, -3):
        with pytest.raises(ValueError, match=f"axis={axis}.*out of range"):
            quantize_reference(x, "mxfp4", axis=axis)
    with pytest.raises(TypeError, match="axis"):
        quantize_reference(x, "mxfp4", axis=1.0)
    with pytest.raises(ValueError, match="multiple of 4 for mxfp6_e3m2"):
        quantize_reference(torch.randn(4, 60), "mxfp6_e3m2", block_size=30)
    with pytest.raises(ValueError, match="multiple of 2 for mxfp4_e2m1"):
        quantize_reference(torch.randn(4, 63), "mxfp4", block_size=21)
    for bs in (0, -32, True, 32.0):
        with pytest.raises(ValueError, match="block_size"):
            quantize_reference(x, "mxfp4", block_size=bs)
    with pytest.raises(TypeError, match="MXTensor"):
        dequantize_reference(x)


@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_axis_pair_and_cast_transpose_on_the_cpu_give_each_axis_bytes(fmt, rng):
    """On the CPU (the reference backend), quantize with a pair of axes and cast_transpose give, for each axis, the
    bytes of quantize_reference along that axis alone, under non-default scale modes, roundings and (quantize's)
    a swizzled scale layout: each option reaches both outputs (dropping one on the pair path, or scale_mode in
    cast_transpose, passed every CPU test before this one)."""
    x = rand_tensor((64, 96), -1, generator=rng, nonfinite=True)
    layout = "nvidia_128x4"
    for mode, rounding in (("even", "away"), ("rceil", "rne"), ("ceil", "away")):
        kw = dict(scale_mode=mode, rounding=rounding)
        pair = mxkit.quantize(x, fmt, axis=(1, 0), scale_layout=layout, **kw)
        rows, cols = mxkit.cast_transpose(x, fmt, **kw)
        for a, q, ct in ((1, pair[0], rows), (0, pair[1], cols)):
            ref = quantize_reference(x, fmt, axis=a, **kw)
            assert_mx_equal(q, ref, layout, what=f"quantize axis=(1, 0) [{a}] {mode} {rounding}")
            assert_mx_equal(ct, ref, what=f"cast_transpose [{a}] {mode} {rounding}")
            assert (q.scale_mode, q.rounding, ct.scale_mode, ct.rounding) == (ref.scale_mode, ref.rounding) * 2
    default = quantize_reference(x, fmt, axis=1)  # (the options change these bytes: the checks above can fail)
    assert not (torch.equal(rows.qdata, default.qdata) and torch.equal(rows.scale, default.scale))


def test_public_entry_points_name_the_bad_argument():
    """mxkit.quantize / quantize_fold / cast_transpose check what their own signatures add (a non-tensor x, the
    pair of axes) before any backend, with the argument's name; dequantize a dtype outside its four."""
    x = torch.randn(4, 64)
    for f in (mxkit.quantize, mxkit.quantize_fold, mxkit.cast_transpose):
        with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
            f([1.0] * 64, "mxfp4")
    for axis in (1.0, (0, 1, 0), (0, True), "1", None):
        with pytest.raises(TypeError, match="axis must be an int or a pair of ints"):
            mxkit.quantize(x, "mxfp8", axis=axis)
    with pytest.raises(ValueError, match=r"axis 1 is out of range for a 1-D tensor \(shape \(64,\)\)"):
        mxkit.quantize(torch.randn(64), "mxfp8", axis=(0, 1))
    with pytest.raises(ValueError, match="must differ"):
        mxkit.quantize(x, "mxfp8", axis=(1, -1))
    rows, cols = mxkit.quantize(torch.randn(64, 64), "mxfp8", axis=[1, 0])  # a list is a pair too
    assert rows.axis == 1 and cols.axis == 0
    q = mxkit.quantize(x, "mxfp4", axis=np.int64(1))  # a NumPy integer axis, as MXTensor takes
    assert q.axis == 1 and torch.equal(q.qdata, mxkit.quantize(x, "mxfp4", axis=1).qdata)
    # NumPy integers as block_size and inside an axis pair too (the same bytes as Python ints)
    q = mxkit.quantize(x, "mxfp4", block_size=np.int64(32))
    assert type(q.block_size) is int and torch.equal(q.qdata, mxkit.quantize(x, "mxfp4").qdata)
    pair = mxkit.quantize(torch.randn(64, 64), "mxfp8", axis=(np.int64(1), 0))
    assert [t.axis for t in pair] == [1, 0]
    assert mxkit.cast_transpose(torch.randn(64, 64), "mxfp8", block_size=np.int32(32))[1].block_size == 32
    for bs in (0, "32", 32.0, True):  # cast_transpose checks block_size before using it
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            mxkit.cast_transpose(torch.randn(2, 16, 64), "mxfp8", block_size=bs)
    with pytest.raises(TypeError, match="int32"):
        mxkit.dequantize(mxkit.quantize(x, "mxfp8"), torch.int32)
    assert mxkit.quantize_fold(torch.randn(0, 64), "mxfp4").data.shape[0] == 0  # an empty batch (documented)
    # ... after the checks a non-empty x gets (an empty one skipped them)
    with pytest.raises(TypeError, match="x.dtype=torch.int64 is not supported"):
        mxkit.quantize_fold(torch.ones(0, 64, dtype=torch.int64), "mxfp4")
    with pytest.raises(ValueError, match="unknown ScaleMode 'foo'"):
        mxkit.quantize_fold(torch.empty(0, 64), "mxfp4", scale_mode="foo")
    # cast_transpose: an empty x is a ValueError (it was torch's reshape RuntimeError), and the M of an N-D x is
    # named as prod(leading dims), not as the shape[0] of a (1, K) the caller never passed
    for shape in ((2, 3, 0), (0,), (0, 64)):
        with pytest.raises(ValueError, match=r"cannot quantize an empty tensor of shape"):
            mxkit.cast_transpose(torch.empty(shape), "mxfp8")
    with pytest.raises(ValueError, match=r"M = prod\(leading dims\) = 1 \(x of shape \(64,\)"):
        mxkit.cast_transpose(torch.randn(64), "mxfp8")
    with pytest.raises(ValueError, match=r"M = prod\(leading dims\) = 6 \(x of shape \(2, 3, 64\)"):
        mxkit.cast_transpose(torch.randn(2, 3, 64), "mxfp8")


def test_mxtensor_block_size_must_hold_whole_packs():
    with pytest.raises(ValueError, match="block_size=1 is not a multiple of mxfp6_e2m3's packing"):
        mxkit.MXTensor(torch.zeros(4, 1, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8), "mxfp6", 1, 1,
                       (4, 2))
    with pytest.raises(TypeError, match="shape must be a sequence of ints, got 64"):
        mxkit.MXTensor(torch.zeros(64, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8), "mxfp8", 0, 32, 64)


def test_other_block_sizes_match_oracle(rng):
    x = rand_blocks(64, 64, generator=rng, special=False).reshape(16, 256)
    for fmt in FORMAT_NAMES:
        for bs in (4, 16, 64):
            q = quantize_reference(x, fmt, block_size=bs, scale_mode="ceil", rounding="away")
            s, c = oracle_quantize(x, fmt, "ceil", "away", block_size=bs)
            assert_bytes_equal(q.scale, torch.from_numpy(s), f"{fmt} bs={bs} scale")
            assert_bytes_equal(oracle_unpack(q.qdata, fmt), torch.from_numpy(c), f"{fmt} bs={bs} codes")


def test_e8m0_to_float32_rejects_wide_dtypes():
    with pytest.raises(TypeError):
        e8m0_to_float32(torch.tensor([127, 128], dtype=torch.int32))


# ---------------------------------------------------------------------------------------------------------
# the independent float64 model: random wide-range data + crafted blocks, and hypothesis


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_matches_float64_model_random(fmt, dtype, rng):
    x = rand_blocks(300, generator=rng, dtype=dtype, nonfinite=dtype != torch.float16)
    for mode in SCALE_MODES:
        for rnd in ROUNDINGS:
            q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
            s, c = oracle_quantize(x, fmt, mode, rnd)
            assert_bytes_equal(q.scale, torch.from_numpy(s), f"{fmt} {mode} {rnd} scale")
            assert_bytes_equal(oracle_unpack(q.qdata, fmt), torch.from_numpy(c), f"{fmt} {mode} {rnd} codes")


def _check_against_model(x: torch.Tensor, fmt, mode, rnd):
    q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
    s, c = oracle_quantize(x, fmt, mode, rnd)
    assert_bytes_equal(q.scale, torch.from_numpy(s), f"{fmt} {mode} {rnd} scale")
    assert_bytes_equal(oracle_unpack(q.qdata, fmt), torch.from_numpy(c), f"{fmt} {mode} {rnd} codes")
    _check_dequant_bounds(q, x, fmt, mode)


def _check_dequant_bounds(q, x, fmt, mode):
    """|dequant - x| <= half an element step at |x| / 2^X, or exactly ± max_normal * 2^X when saturated;
    CEIL and RCEIL never saturate (except where the E8M0 clamp at +127 binds)."""
    spec = SPECS[fmt]
    d = dequantize_reference(q).to(torch.float64).numpy().reshape(-1, q.block_size)
    # MX values above the fp32 range (e.g. FP4 4 * 2^126 = 2^128 from CEIL/RCEIL/EVEN near fp32 max) come
    # back as Inf from the fp32 dequantize (documented; see test_dequant_float64_above_fp32_range): compare
    # those through the exact float64 decode instead
    codes = oracle_unpack(q.qdata, fmt).numpy().reshape(d.shape)
    exact = np.ldexp(ml_decode(codes, fmt), q.scale.to(torch.int64).numpy().reshape(-1, 1) - 127)
    d = np.where(np.isinf(d) & np.isfinite(exact), exact, d)
    xs = x.to(torch.float64).numpy().reshape(-1, q.block_size)
    X = q.scale.to(torch.int64).numpy().reshape(-1) - 127
    ok = np.isfinite(xs).all(axis=1) & (q.scale.numpy().reshape(-1) != 255)
    d, xs, X = d[ok], xs[ok], X[ok][:, None]
    v = np.ldexp(np.abs(xs), -X)
    sat = v > spec.max_normal
    if mode in ("ceil", "rceil"):
        assert not (sat & (X < 127)).any(), "CEIL/RCEIL saturated an element"
    _, e = np.frexp(np.where(v > 0, v, 1.0))
    if spec.is_int:
        step = np.broadcast_to(np.ldexp(1.0, X - 6), v.shape)
    else:
        step = np.ldexp(1.0, np.maximum(e - 1, spec.emin) - spec.mbits + X)
    err = np.abs(d - xs)
    assert (err[~sat] <= step[~sat] / 2).all(), "error above half a step"
    assert (np.abs(d[sat]) == np.ldexp(spec.max_normal, np.broadcast_to(X, sat.shape)[sat])).all()
    assert (np.signbit(d) == np.signbit(xs))[xs != 0].all() or spec.is_int


f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
FMT = st.sampled_from(FORMAT_NAMES)
MODE = st.sampled_from(SCALE_MODES)
RND = st.sampled_from(ROUNDINGS)


@HYP
@given(vals=st.lists(f32, min_size=32, max_size=32), fmt=FMT, mode=MODE, rnd=RND)
def test_property_any_fp32_block(vals, fmt, mode, rnd):
    _check_against_model(torch.tensor([vals], dtype=torch.float32), fmt, mode, rnd)


@HYP
@given(
    data=st.data(), fmt=FMT, mode=MODE, rnd=RND, X=st.integers(-135, 100),
)
def test_property_tie_heavy_blocks(data, fmt, mode, rnd, X):
    # elements at grid midpoints (ties) and grid points times 2^X, pinned by a max-normal element
    grid, _ = element_grid(fmt)
    mids = (grid[1:] + grid[:-1]) / 2
    pool = np.concatenate([mids, grid, grid[-1:] * 1.02])
    idx = data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=31, max_size=31))
    signs = data.draw(st.lists(st.booleans(), min_size=31, max_size=31))
    vals = np.array([SPECS[fmt].max_normal] + [(-1 if s else 1) * pool[i] for i, s in zip(idx, signs)])
    x = np.ldexp(vals, X).astype(np.float32)
    _check_against_model(torch.from_numpy(x)[None], fmt, mode, rnd)


@HYP
@given(mags=st.lists(st.integers(0, 0x7BFF), min_size=32, max_size=32),  # every finite fp16 magnitude
       signs=st.lists(st.booleans(), min_size=32, max_size=32), fmt=FMT, mode=MODE, rnd=RND)
def test_property_fp16_blocks(mags, signs, fmt, mode, rnd):
    bits = torch.tensor([m | (0x8000 if sg else 0) for m, sg in zip(mags, signs)], dtype=torch.int32)
    x = bits.to(torch.int16).view(torch.float16)[None]
    q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
    s, c = oracle_quantize(x, fmt, mode, rnd)
    assert_bytes_equal(q.scale, torch.from_numpy(s), "scale")
    assert_bytes_equal(oracle_unpack(q.qdata, fmt), torch.from_numpy(c), "codes")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequant_bounds_random(fmt, rng):
    x = rand_blocks(400, generator=rng)
    for mode in SCALE_MODES:
        _check_dequant_bounds(quantize_reference(x, fmt, scale_mode=mode), x, fmt, mode)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_dequant_is_exact_decode_times_scale(fmt, rng):
    x = rand_blocks(200, generator=rng, nonfinite=True)
    q = quantize_reference(x, fmt, scale_mode="rceil")
    s, c = oracle_quantize(x, fmt, "rceil", "rne")
    vals = ml_decode(c, fmt).reshape(-1, 32)
    X = s.astype(np.int64) - 127
    with np.errstate(over="ignore"):
        want = np.ldexp(vals, X).astype(np.float32)  # computed in fp32: values above its range become Inf
    want[np.broadcast_to(s == 255, want.shape)] = np.nan
    got = dequantize_reference(q, torch.float32).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    m = ~np.isnan(want)
    assert np.array_equal(got[m], want[m]) and np.array_equal(np.signbit(got[m]), np.signbit(want[m]))


def test_special_blocks_cover_what_they_claim():
    s = special_blocks(nonfinite=True)
    assert (s == 0).all(dim=1).any() and torch.isnan(s).any() and torch.isinf(s).any()
    assert ((s != 0) & (s.abs() < 2.0**-126)).any(), "fp32 denormals present"


def test_dequant_float64_above_fp32_range():
    x = block([3.0e38])
    for mode in ("ceil", "rceil", "even"):
        q = quantize_reference(x, "mxfp4", scale_mode=mode)
        assert q.scale.item() == 127 + 126 and q.qdata[0, 0].item() == 0x6  # 3e38 / 2^126 = 3.53 -> 4 (RNE)
        assert dequantize_reference(q, torch.float64)[0, 0].item() == 2.0**128


def test_quantize_near_fp32_max_rounds_above_fp32_range():
    # finite input, Inf after an fp32 dequantize (2^128 is above fp32 max; float64 keeps it). FLOOR never
    # does this (its largest element is max_normal * 2^(127 - emax) < fp32 max).
    x = block([3.0e38, float(torch.finfo(torch.float32).max)])
    for fmt in FORMAT_NAMES:
        d = dequantize_reference(quantize_reference(x, fmt, scale_mode="floor"))
        assert torch.isfinite(d).all(), fmt
    assert torch.isinf(dequantize_reference(quantize_reference(x, "mxfp4", scale_mode="rceil"))[0, 0])


def test_round_from_float64_rounds_once(rng):
    """float64 -> bf16 / fp16 rounded once: torch's conversion goes through float32 and double-rounds values just
    off a tie (7.046874977... becomes the tie 7.046875 in float32, then 7.0625; once-rounded it is 7.03125);
    checked against an exact rounding of fresh random values, ties and near-ties, and specials."""
    from mxkit.reference import round_from_float64

    assert float(round_from_float64(torch.tensor([7.046874977773901], dtype=torch.float64), torch.bfloat16)) == 7.03125
    assert float(torch.tensor([7.046874977773901], dtype=torch.float64).to(torch.bfloat16)) == 7.0625  # (torch's)
    for dtype, mant in ((torch.bfloat16, 7), (torch.float16, 10)):
        grid = torch.randn(4000, generator=rng, dtype=torch.float64).to(dtype).to(torch.float64)
        nxt = torch.nextafter(grid.to(dtype), torch.full_like(grid.to(dtype), float("inf"))).to(torch.float64)
        ties = (grid + nxt) / 2
        x = torch.cat([torch.randn(20000, generator=rng, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (20000,), generator=rng),
                       ties, ties * (1 + 2.0**-40), ties * (1 - 2.0**-40), ties * (1 + 2.0**-30),
                       torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-300, -1e-300, 1e300], dtype=torch.float64)])
        got = round_from_float64(x, dtype).to(torch.float64)
        # exact RNE to `dtype`: the two neighbours on its grid, nearest wins, ties to the even mantissa
        lo = x.to(dtype).to(torch.float64)
        up = torch.nextafter(x.to(dtype), torch.full_like(x.to(dtype), float("inf"))).to(torch.float64)
        dn = torch.nextafter(x.to(dtype), torch.full_like(x.to(dtype), -float("inf"))).to(torch.float64)
        cand = torch.stack([dn, lo, up])
        d = (cand - x).abs()
        best = d.min(0).values
        # (chosen from the input alone: a NaN or Inf the rounding returned for a finite x must not drop out)
        fin = torch.isfinite(x) & torch.isfinite(x.to(dtype))
        assert torch.isfinite(got[fin]).all(), dtype
        over = torch.isfinite(x) & ~fin  # beyond the dtype's range: +-Inf, the sign kept
        assert over.any() and torch.equal(got[over], torch.copysign(torch.full_like(x[over], float("inf")), x[over]))
        assert ((got - x).abs()[fin] <= best[fin]).all(), dtype
        tie = fin & ((d == best).sum(0) > 1)
        even = (got.to(dtype).view(torch.int16) & 1) == 0
        assert even[tie].all(), dtype
        assert torch.equal(got[~torch.isfinite(x)], x.to(dtype).to(torch.float64)[~torch.isfinite(x)])
        # differentiable like .to: the same bits, the identity's gradient
        xg = x.clone().requires_grad_()
        out = round_from_float64(xg, dtype)
        assert out.grad_fn is not None and torch.equal(out.view(torch.int16), round_from_float64(x, dtype).view(
            torch.int16))
        out.to(torch.float64).sum().backward()
        assert torch.equal(xg.grad, torch.ones_like(x))


# --- matmul_reference: y = a @ b.T in float32 on the dequantized operands ---------------------------------------


def _mx_weight(n, k, fmt="mxfp4", g=None):
    return quantize_reference(torch.randn(n, k, generator=g) * 3, fmt, axis=1)


@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_kind", ["float", "mx"])
def test_matmul_reference_matches_float64_product(a_dtype, a_kind, rng):
    """Against the float64 product of the dequantized operands: float32 accumulation over K terms
    (|err| <= K * 2^-24 * sum|a||b|, row-wise) plus one rounding to the output dtype (half an ulp of |y|)."""
    m, n, k = 5, 24, 96
    w = _mx_weight(n, k, g=rng)
    x = (torch.randn(3, m, k, generator=rng) * 2).to(a_dtype)
    a = quantize_reference(x, "mxfp8_e4m3", axis=-1) if a_kind == "mx" else x
    y = mxkit.reference.matmul_reference(a, w)
    want_dtype = torch.bfloat16 if a_kind == "mx" else a_dtype
    assert y.dtype == want_dtype and y.shape == (3, m, n)
    af = dequantize_reference(a, torch.float64) if a_kind == "mx" else x.to(torch.float64)
    wf = dequantize_reference(w, torch.float64)
    exact = af @ wf.t()
    mag = af.abs() @ wf.abs().t()
    ulp = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[want_dtype]
    bound = k * 2.0**-24 * mag + ulp * exact.abs() * (1 + k * 2.0**-24) + 1e-30
    err = (y.to(torch.float64) - exact).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    # the float32 result rounded once to the output dtype is what an explicit out_dtype=float32 gives, rounded
    y32 = mxkit.reference.matmul_reference(a, w, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    assert torch.equal(y32.to(want_dtype).view(torch.uint8), y.contiguous().view(torch.uint8))


def test_matmul_reference_rejects_bad_operands():
    w = _mx_weight(8, 64)
    x = torch.randn(2, 64)
    with pytest.raises(TypeError, match="b must be an MXTensor"):
        mxkit.reference.matmul_reference(x, dequantize_reference(w))
    with pytest.raises(ValueError, match="axis=1"):
        mxkit.reference.matmul_reference(x, quantize_reference(torch.randn(64, 8), "mxfp4", axis=0))
    with pytest.raises(ValueError, match="K mismatch"):
        mxkit.reference.matmul_reference(torch.randn(2, 32), w)
    with pytest.raises(TypeError, match="not supported"):
        mxkit.reference.matmul_reference(x.to(torch.float64), w)
    with pytest.raises(TypeError, match="tensor or MXTensor"):
        mxkit.reference.matmul_reference(x.numpy(), w)
    with pytest.raises(ValueError, match="last axis"):
        mxkit.reference.matmul_reference(quantize_reference(torch.randn(64, 4), "mxfp8_e4m3", axis=0), w)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxint8"])
def test_gemm_bits_do_not_depend_on_the_weight_layout(fmt, rng):
    """The same weight bytes in a column-major qdata give the same GEMM bits on every CPU route (one code per
    byte: the decoded values kept qdata's strides, and the CPU BLAS picks its kernel by layout: ~3e-5 apart)."""
    import dataclasses

    w = mxkit.quantize(torch.randn(64, 256, generator=rng), fmt)
    wt = dataclasses.replace(w, qdata=w.qdata.t().contiguous().t())
    assert not wt.qdata.is_contiguous() and torch.equal(wt.qdata, w.qdata)
    x = torch.randn(8, 256, generator=rng)
    for backend in ("reference", "auto", "triton"):
        assert torch.equal(mxkit.matmul(x, w, backend=backend), mxkit.matmul(x, wt, backend=backend)), backend


# --------------------------------------------------------------------------------------------------------
# cases a mutation review found no test would fail on (each test fails under its mutant)


def test_float64_nan_is_the_canonical_quiet_nan():
    """A NaN-scale block dequantized to float64 holds torch's / NumPy's canonical NaN, 0x7FF8000000000000 (the
    expected bits written out here: the test read them from the code under test)."""
    q = mxkit.quantize(torch.full((1, 32), float("nan")), "mxfp4", backend="reference")
    got = mxkit.dequantize(q, torch.float64).view(torch.int64)
    assert torch.equal(got, torch.full_like(got, 0x7FF8000000000000))
    assert np.float64(np.nan).view(np.int64) == 0x7FF8000000000000


def test_exp2_f32_is_exact_down_to_the_smallest_denormal():
    """formats._exp2_f32 gives 2^e exactly for every e of float32's range, denormals included: the reference calls
    it with -127..127 only, but matmul's FP8-rowwise row-scale split calls it down to -149."""
    from mxkit.formats import _exp2_f32

    e = torch.arange(-149, 128)
    assert torch.equal(_exp2_f32(e), torch.ldexp(torch.ones(e.numel()), e.to(torch.float32)))


def test_fp8_rowwise_row_of_a_denormal_scale_is_exact():
    """An FP8-rowwise activation row whose float32 scale is the smallest denormal (2^-149) times a weight: row 0 is
    the reference product of the dequantized operands to the bit (a 2^-149 read as 2^-148 doubled it)."""
    w = mxkit.quantize(torch.randn(64, 128), "mxfp4")
    x = torch.zeros(2, 128)
    x[0, :4] = torch.tensor([2.0**-149, 0, -(2.0**-149), 0])
    x[1] = torch.randn(128)
    a = mxkit.quantize_fp8_rowwise(x)
    assert a.scale.view(torch.int32)[0].item() == 1  # (2^-149)
    y = mxkit.matmul(a, mxkit.pack_weight(w), out_dtype=torch.float32)
    want = mxkit.reference.matmul_reference(a.dequantize(), w)
    assert torch.equal(y[0].view(torch.int32), want[0].view(torch.int32))


def test_mxint8_constants():
    """MXINT8 (OCP MX v1.0 §5.4): codes -127..127 (symmetric saturation at 127/64), step 2^-6."""
    from mxkit.formats import MXINT8

    assert MXINT8.max_code == 127
    assert MXINT8.min_subnormal == 2.0**-6 == MXINT8.min_normal


def test_int64_codes_past_32_bits_are_out_of_range():
    """An int64 code past 2^32 is out of the format's range (NaN, the documented convention), not its low bits."""
    assert torch.isnan(decode_elements(torch.tensor([2**32 + 3], dtype=torch.int64), "mxfp4")).all()


def test_reference_refuses_a_bool_axis_a_device_mismatch_and_a_3d_weight():
    """quantize_reference takes an int axis (True is not axis 1); matmul_reference names a device mismatch (no CUDA
    needed: the meta device) and a weight that is not 2-D, as ValueErrors, before any arithmetic."""
    from mxkit.reference import matmul_reference, quantize_reference

    with pytest.raises(TypeError, match="axis"):
        quantize_reference(torch.randn(4, 64), "mxfp4", axis=True)
    w = quantize_reference(torch.randn(64, 128), "mxfp4")
    with pytest.raises(ValueError, match="is on meta but b on cpu"):
        matmul_reference(torch.randn(2, 128, device="meta"), w)
    with pytest.raises(ValueError, match="2-D"):
        matmul_reference(torch.randn(3, 64), quantize_reference(torch.randn(2, 4, 64), "mxfp4"))


def test_a_custom_format_with_a_registered_name_pickles_as_itself():
    """A format made from a registered one with another spec keeps its fields through pickle (pickled by name, it
    came back as the registered format)."""
    import dataclasses
    import pickle

    from mxkit.formats import MXFP4_E2M1

    f = dataclasses.replace(MXFP4_E2M1, spec="custom")
    g = pickle.loads(pickle.dumps(f))
    assert g == f and g is not MXFP4_E2M1
