"""mxkit vs torchao's ``to_mx`` (torchao.prototype.mx_formats.mx_tensor), byte for byte.

Two parts:
* golden vectors (tests/golden/torchao_mx.npz, made by scripts/make_golden.py with torchao 0.18.0): run
  everywhere, torchao not needed;
* live comparisons on fresh random data: skipped cleanly when torchao is not installed.

Known, intentional divergences (each has a test below that shows it exactly):
1. Scale byte 0 (a block with amax < max_normal * 2^-126, roughly): mxkit follows OCP MX v1.0 (byte 0 means
   2^-127, so elements are x * 2^127). torchao FLOOR / CEIL / EVEN compute the scale as a float and clamp it
   to F32_MIN_NORMAL = 2^-126, i.e. divide by 2^-126; torchao RCEIL (like TransformerEngine) multiplies by
   1.0 when the byte is 0. Scale bytes agree; element codes differ.
2. ±Inf in a block: mxkit gives scale 0xFF (NaN, OCP: the block is not representable); torchao derives a
   finite scale from amax = Inf (FLOOR/CEIL/EVEN: exponent 255 - 127 - emax; RCEIL: 0xFE).
3. RCEIL when amax / max_pos lies a few fp32 ulps above a power of two 2^k with |k| large: torchao's eager
   fallback computes ceil(torch.log2(descale)) in fp32, and log2 rounds k + tiny down to k, so its scale is
   one binade too small and the amax element saturates. mxkit computes the exact smallest X with
   amax <= max_pos * 2^X (what the Blackwell ``cvt.rp.satfinite.ue8m0x2.f32`` path also gives).
4. RCEIL at the byte 0/1 boundary: torchao divides amax / max_pos in fp32, and a quotient just above 2^-127
   is an fp32 denormal that can round down to 2^-127 (byte 0); mxkit's exact rule gives byte 1.
5. NaN in a block: both give scale 0xFF; mxkit writes every element code 0 (the block holds no value), torchao
   keeps each element's own code (a NaN element's NaN code, the finite ones theirs). Scale bytes agree.
The live random tests compare every block outside these classes and assert that those are the vast majority.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

from conftest import assert_bytes_equal, oracle_unpack, rand_blocks
from mxkit.formats import encode_elements, get_format
from mxkit.reference import quantize_reference

GOLDEN = pathlib.Path(__file__).parent / "golden" / "torchao_mx.npz"
FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")
MODES = ("floor", "ceil", "rceil", "even")


def mx_codes(x, fmt, mode):
    q = quantize_reference(x, fmt, scale_mode=mode)
    return q.scale, oracle_unpack(q.qdata, fmt)


# ---------------------------------------------------------------------------------------------------------
# golden vectors (no torchao needed)


@pytest.fixture(scope="module")
def golden():
    assert GOLDEN.exists(), f"{GOLDEN} missing: run python scripts/make_golden.py"
    with np.load(GOLDEN) as z:
        data = {k: z[k] for k in z.files}
    data["meta"] = json.loads(str(data["meta"]))
    return data


def test_golden_file_is_complete(golden):
    meta = golden["meta"]
    assert meta["torchao"] and meta["seed"] == 20261121 and meta["block_size"] == 32
    for d in ("float32", "bfloat16"):
        for fmt in FORMATS:
            for mode in MODES:
                assert golden[f"{d}/{fmt}/{mode}/scale"].shape == (32, 8)
                assert golden[f"{d}/{fmt}/{mode}/codes"].shape == (32, 256)
    x = torch.from_numpy(golden["x_f32"])
    xb = torch.from_numpy(golden["x_bf16_bits"].view(np.int16)).view(torch.bfloat16)
    assert torch.equal(x.to(torch.bfloat16).view(torch.int16), xb.view(torch.int16)), "bf16 = RNE of f32"
    assert GOLDEN.stat().st_size < 1_000_000


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dname", ["float32", "bfloat16"])
def test_golden_matches_mxkit(golden, dname, fmt, mode):
    if dname == "float32":
        x = torch.from_numpy(golden["x_f32"])
    else:
        x = torch.from_numpy(golden["x_bf16_bits"].view(np.int16)).view(torch.bfloat16)
    s, c = mx_codes(x, fmt, mode)
    assert_bytes_equal(s, torch.from_numpy(golden[f"{dname}/{fmt}/{mode}/scale"]), f"{dname} {fmt} {mode} scale")
    assert_bytes_equal(c, torch.from_numpy(golden[f"{dname}/{fmt}/{mode}/codes"]), f"{dname} {fmt} {mode} codes")


# ---------------------------------------------------------------------------------------------------------
# live torchao


@pytest.fixture(scope="module")
def ao():
    pytest.importorskip("torchao")
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
        from torchao.prototype.mx_formats.mx_tensor import to_mx
    except Exception as e:  # pragma: no cover - depends on the torchao build
        pytest.skip(f"torchao MX formats unavailable: {e}")
    elem = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp6_e3m2": DTYPE_FP6_E3M2,
            "mxfp6_e2m3": DTYPE_FP6_E2M3, "mxfp4_e2m1": torch.float4_e2m1fn_x2}

    def run(x, fmt, mode):
        s, d = to_mx(x.contiguous(), elem[fmt], 32, ScaleCalculationMode(mode))
        s, d = s.view(torch.uint8), d.view(torch.uint8)
        if fmt == "mxfp4_e2m1":
            d = oracle_unpack(d, fmt)  # torchao packs element 2i in the low nibble, as mxkit
        return s, d.reshape(x.shape)

    return run


def rceil_fragile(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Blocks whose fp32 amax / max_pos is within 2^-13 above a power of two (divergence 3), or an fp32
    denormal (divergence 4)."""
    amax = x.to(torch.float32).reshape(*x.shape[:-1], -1, 32).abs().amax(-1)
    q = amax / get_format(fmt).max_normal
    mant = q.view(torch.int32) & 0x7FFFFF
    return ((mant > 0) & (mant < (1 << 10))) | (q < 2.0**-126)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_live_random_wide_range(ao, fmt, dtype, rng):
    x = rand_blocks(1024, generator=rng, dtype=dtype, exp_range=(-110, 110)).reshape(32, 1024)
    for mode in MODES:
        s_ao, c_ao = ao(x, fmt, mode)
        s_mx, c_mx = mx_codes(x, fmt, mode)
        comparable = (s_mx != 0) & (s_ao != 0)  # divergence 1 (and 4) excluded
        if mode == "rceil":
            comparable &= ~rceil_fragile(x, fmt)  # divergence 3
        amax = x.to(torch.float32).reshape(32, 32, 32).abs().amax(-1)
        comparable |= amax == 0  # zero blocks agree (scale 0, codes ±0)
        assert comparable.float().mean() > 0.8, "the comparison must cover most blocks"
        assert_bytes_equal(s_mx[comparable], s_ao[comparable], f"{fmt} {mode} scale")
        cm = comparable.repeat_interleave(32, dim=-1)
        assert_bytes_equal(c_mx[cm], c_ao[cm], f"{fmt} {mode} codes")


def test_live_crafted_ties_and_boundaries(ao):
    # every tie of every format at several binades, amax = max_pos * 2^k, powers of two (all comparable)
    rows = []
    for fmt in FORMATS:
        f = get_format(fmt)
        codes = torch.arange(1 << (f.bits - 1), dtype=torch.uint8)
        from mxkit.formats import decode_elements
        g = decode_elements(codes, fmt)
        g = torch.unique(g[torch.isfinite(g)])
        mids = (g[1:] + g[:-1]) / 2
        vals = torch.cat([mids, g])
        for k in (-40, -3, 0, 11):
            for start in range(0, len(vals), 31):
                r = torch.zeros(32)
                chunk = vals[start : start + 31] * 2.0**k
                r[0] = f.max_normal * 2.0**k
                r[1 : 1 + len(chunk)] = chunk * torch.where(torch.arange(len(chunk)) % 2 == 0, 1.0, -1.0)
                rows.append(r)
    x = torch.stack(rows)
    x = torch.cat([x, torch.zeros(-len(rows) % 8, 32)]).reshape(-1, 256)
    for fmt in FORMATS:
        for mode in MODES:
            s_ao, c_ao = ao(x, fmt, mode)
            s_mx, c_mx = mx_codes(x, fmt, mode)
            ok = (s_mx != 0) | (x.reshape(-1, 8, 32).abs().amax(-1) == 0)
            assert ok.all()
            assert_bytes_equal(s_mx, s_ao, f"{fmt} {mode} scale")
            assert_bytes_equal(c_mx, c_ao, f"{fmt} {mode} codes")


@pytest.mark.parametrize("fmt", FORMATS)
def test_divergence_scale_byte_zero(ao, fmt):
    # divergence 1: amax below max_normal * 2^-126 -> scale byte 0 in both; elements differ by design
    mn = get_format(fmt).max_normal
    x = torch.zeros(4, 32)
    x[0, :3] = torch.tensor([mn * 2.0**-128, mn * 2.0**-129, -mn * 2.0**-131])
    x[1, :2] = torch.tensor([2.0**-130, 2.0**-135])
    x[2, :2] = torch.tensor([mn * 2.0**-127 / 3, 2.0**-149])
    x[3, :1] = torch.tensor([2.0**-127])
    for mode in MODES:
        s_ao, c_ao = ao(x, fmt, mode)
        s_mx, c_mx = mx_codes(x, fmt, mode)
        assert (s_mx == 0).all() and (s_ao == 0).all(), mode
        # mxkit: byte 0 = 2^-127 (OCP), elements = x * 2^127
        assert_bytes_equal(c_mx, encode_elements(x * 2.0**127, fmt), f"mxkit {mode}")
        # torchao: FLOOR/CEIL/EVEN divide by 2^-126 (F32_MIN_NORMAL clamp), RCEIL multiplies by 1
        factor = 1.0 if mode == "rceil" else 2.0**126
        assert_bytes_equal(c_ao, encode_elements(x * factor, fmt), f"torchao {mode}")
        assert not torch.equal(c_mx, c_ao), "the divergence must show on these blocks"


@pytest.mark.parametrize("special", ["inf", "nan"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_divergence_nonfinite_blocks(ao, fmt, special):
    # divergence 2: mxkit marks a block holding ±Inf with the NaN scale, torchao gives a finite scale;
    # divergence 5: a block holding NaN gets 0xFF from both, mxkit's element codes 0, torchao's their own
    x = torch.full((2, 32), 1.0 if special == "inf" else 3.0)
    x[0, 5] = float(special)
    x[1, 0] = -float(special)
    for mode in MODES:
        s_ao, c_ao = ao(x, fmt, mode)
        s_mx, c_mx = mx_codes(x, fmt, mode)
        assert (s_mx == 255).all() and (c_mx == 0).all()
        if special == "inf":
            assert (s_ao != 255).all(), (fmt, mode, s_ao.tolist())
        else:
            assert (s_ao == 255).all() and not torch.equal(c_mx, c_ao), (fmt, mode, s_ao.tolist())


@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_divergence_rceil_log2_rounding(ao, fmt):
    # divergence 3: amax = max_pos * 2^60 plus one fp32 ulp. Exact rule: X = 60 - emax... + 1 because
    # amax > max_pos * 2^60; torchao's fp32 log2(2^60 * (1 + 2^-23)) rounds to exactly 60.
    mn = get_format(fmt).max_normal
    base = torch.tensor(mn * 2.0**60, dtype=torch.float32)
    amax = (base.view(torch.int32) + 1).view(torch.float32)
    x = torch.zeros(1, 32)
    x[0, 0] = amax
    s_ao, c_ao = ao(x, "mxfp4_e2m1" if fmt == "mxfp4_e2m1" else fmt, "rceil")
    s_mx, c_mx = mx_codes(x, fmt, "rceil")
    assert s_mx.item() == 127 + 61, "smallest X with amax <= max_pos * 2^X"
    assert s_ao.item() == s_mx.item() - 1, "torchao's scale is one binade too small"
    max_code = get_format(fmt).max_code
    assert c_ao[0, 0].item() == max_code, "so torchao saturates the amax element (RCEIL promises no clipping)"
    assert c_mx[0, 0].item() != max_code


def test_divergence_rceil_denormal_quotient(ao):
    # divergence 4: FP4, amax = 6 * 2^-127 + one ulp (1.5 * 2^-125 + 2^-148): exactly, X = -126 (byte 1);
    # torchao's fp32 quotient amax / 6 = 2^-127 + 2^-148/6 rounds (denormal grid 2^-149) to 2^-127 -> byte 0
    base = torch.tensor(6.0 * 2.0**-127, dtype=torch.float32)
    x = torch.zeros(1, 32)
    x[0, 0] = (base.view(torch.int32) + 1).view(torch.float32)
    s_ao, _ = ao(x, "mxfp4_e2m1", "rceil")
    s_mx, _ = mx_codes(x, "mxfp4_e2m1", "rceil")
    assert (s_mx.item(), s_ao.item()) == (1, 0)
