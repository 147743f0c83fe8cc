"""Dequantize (:mod:`mxkit.kernels.quantize_details._dequantize`) against the reference, byte for byte (NaNs
included: both write the canonical NaN of the output dtype). CPU: Triton's interpreter in a subprocess; the hardware FP8 -> fp16 decode and the FP4 / FP6
decode asm are inline asm, checked on the CPU by tests/kernel_tests/test_codecs.py and by the GPU tests here."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    AXIS_CASES, DEV, FORMAT_NAMES, FULL, INPUT_DTYPES, assert_dequant_equal, interpreted_rng, ml_decode,
    oracle_unpack, rand_tensor, run_interpreted, scale_bytes,
)

from mxkit.kernels import quantize as kq
from mxkit.kernels.quantize import DequantizeConfig as DC
from mxkit.reference import dequantize_reference, quantize_reference
from mxkit.tensor import MXTensor
from mxkit.formats import get_format

_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _random_mx(shape, axis, fmt, g):
    """An MXTensor of random bytes (every code; scale bytes 0 / 254 / 255 included)."""
    ref_q = quantize_reference(rand_tensor(shape, axis, generator=g), fmt, axis=axis)
    qd = torch.randint(0, 256, ref_q.qdata.shape, generator=g, dtype=torch.uint8)
    sc = torch.randint(0, 256, ref_q.scale.shape, generator=g, dtype=torch.uint8)
    sc.view(-1)[:3] = torch.tensor([0, 254, 255], dtype=torch.uint8)
    return type(ref_q)(qd, sc, ref_q.fmt, ref_q.axis, 32, ref_q.shape)


def _check_dequantize_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`); raises on a mismatch."""
    from mxkit.kernels.quantize import _dequantize_impl, dequantize_triton
    from mxkit.kernels.quantize_details import _dequantize

    g = interpreted_rng(_dequantize._dequantize_rows_kernel, _dequantize._dequantize_cols_kernel)
    n = 0
    dts = INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        # rowwise and transposed (blocks along dim 0), every output dtype
        for k, (shape, axis) in enumerate((((3, 64), -1), ((64, 3), 0))):
            q = _random_mx(shape, axis, fmt, g)
            odt = dts[(i + k) % 3]
            assert_dequant_equal(dequantize_triton(q, odt), dequantize_reference(q, odt),
                                 f"dequantize {fmt} {shape} axis={axis} -> {odt}")
            n += 1
        q = _random_mx((6, 96), -1, fmt, g)
        if not fmt.startswith("mxfp6"):  # FP8 / FP4: [n, l // 32, 32] tiles; MXINT8: 2-D tiles
            cfg = DC(block_n=4, block_l=64, num_warps=2, int64=False)
            got = _dequantize_impl(q.qdata, q.scale, fmt, -1, (6, 96), dts[i % 3], cfg=cfg)
            assert_dequant_equal(got, dequantize_reference(q, dts[i % 3]), f"dequantize rows {fmt}")
            n += 1
        else:  # FP6: each thread unpacks whole 3-word groups, ragged last tiles
            for k, odt in enumerate(dts):
                cfg = DC(block_n=4, block_l=64 if k % 2 else 32, num_warps=2, int64=False)
                got = _dequantize_impl(q.qdata, q.scale, fmt, -1, (6, 96), odt, cfg=cfg)
                assert_dequant_equal(got, dequantize_reference(q, odt), f"dequantize fp6 groups {fmt} -> {odt}")
                n += 1
        # tiles that divide the problem (the unmasked path), 32- and 64-bit offsets, rows and columns
        for int64 in (False, True):
            q = _random_mx((8, 128), -1, fmt, g)
            got = _dequantize_impl(q.qdata, q.scale, fmt, -1, (8, 128), dts[(i + int64) % 3],
                                   cfg=DC(block_n=4, block_l=64, num_warps=1, int64=int64))
            assert_dequant_equal(got, dequantize_reference(q, dts[(i + int64) % 3]), f"rows {fmt} int64={int64}")
            q = _random_mx((128, 32), 0, fmt, g)
            got = _dequantize_impl(q.qdata, q.scale, fmt, 0, (128, 32), dts[(i + 2 * int64) % 3],
                                   cfg=DC(block_n=16, block_l=64, num_warps=1, int64=int64))
            assert_dequant_equal(got, dequantize_reference(q, dts[(i + 2 * int64) % 3]), f"cols {fmt} int64={int64}")
            n += 2
        # no elements: an empty result, no launch (a zero extent after the axis planned rows of 0-byte reads and
        # writes, out of bounds: a segfault under the interpreter)
        for shape, axis in (((64, 0), 0), ((2, 64, 0), 1), ((64, 0, 3), 0), ((0, 64), -1)):
            qs, ss = MXTensor.expected_shapes(shape, axis, get_format(fmt), 32)
            q = MXTensor(torch.empty(qs, dtype=torch.uint8), torch.empty(ss, dtype=torch.uint8), fmt, axis, 32, shape)
            got = dequantize_triton(q, dts[i % 3])
            assert got.shape == shape and got.dtype == dts[i % 3], (fmt, shape, got.shape)
            n += 1
    print(f"interpreter checks passed: {n}")


def test_dequantize_interpreted():
    """Every format to every output dtype, rowwise and transposed, random bytes (every code, scale bytes 0 /
    254 / 255), the [n, l // 32, 32] tiles and FP6 whole groups, run by Triton's CPU interpreter in a subprocess."""
    run_interpreted(__file__, "_check_dequantize_interpreted")


def _nan_cases(fmt: str, g: torch.Generator):
    """An MXTensor (4, 64) along the last axis whose NaNs come every way the format has: a 0xFF scale byte over
    random codes (row 0, first block), and for FP8 its NaN codes with either sign under ordinary scales (E4M3
    S.1111.111; E5M2 S.11111.xx, xx != 0, beside its ±Inf codes S.11111.00), the rest random finite codes.
    Returns (MXTensor, the bool mask of the NaN outputs)."""
    from mxkit.formats import get_format
    from mxkit.tensor import MXTensor

    f = get_format(fmt)
    q = quantize_reference(torch.randn(4, 64, generator=g) * 4, fmt)
    qd, sc = q.qdata.clone(), q.scale.clone()
    sc[0, 0] = 255
    nan = torch.zeros(4, 64, dtype=torch.bool)
    nan[0, :32] = True
    if f.name == "mxfp8_e4m3":
        qd[1, :6] = torch.tensor([0x7F, 0xFF, 0x7F, 0xFF, 0x00, 0x80], dtype=torch.uint8)
        nan[1, :4] = True
    elif f.name == "mxfp8_e5m2":
        qd[1, :8] = torch.tensor([0x7D, 0xFE, 0x7F, 0xFD, 0x7C, 0xFC, 0x7E, 0xFF], dtype=torch.uint8)
        nan[1, :8] = torch.tensor([1, 1, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    return MXTensor(qd, sc, fmt, 1, 32, (4, 64)), nan


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_reference_dequantize_writes_the_canonical_nan(fmt, rng):
    """Every NaN output of the reference is the canonical positive quiet NaN of the output dtype (float64, float32
    0x7FC00000, bf16 0x7FC0, fp16 0x7E00), whatever made it (scale 0xFF, an FP8 NaN code, a negative one);
    every other output is unchanged by the canonicalisation and the E5M2 ±Inf codes stay ±Inf."""
    from mxkit.reference import CANONICAL_NAN_BITS

    q, nan = _nan_cases(fmt, rng)
    # the other outputs, decoded independently (ml_dtypes on codes unpacked by the oracle) times 2^(s - 127),
    # rounded as the reference rounds: to float32, then to the output dtype
    codes = oracle_unpack(q.qdata, fmt).numpy()
    factor = torch.exp2(q.scale.to(torch.float64) - 127).repeat_interleave(32, dim=1)
    want64 = torch.from_numpy(ml_decode(codes, fmt)) * factor
    for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        got = dequantize_reference(q, dt)
        int_dtype, bits = CANONICAL_NAN_BITS[dt]
        assert torch.equal(torch.isnan(got), nan), (fmt, dt)
        assert bool((got.view(int_dtype)[nan] == bits).all()), (fmt, dt, got.view(int_dtype)[nan].unique())
        want = want64.to(torch.float32).to(dt)
        assert torch.equal(got[~nan].view(int_dtype), want[~nan].view(int_dtype)), (fmt, dt)
    if fmt == "mxfp8_e5m2":
        assert dequantize_reference(q, torch.float32)[1, 4:6].tolist() == [float("inf"), float("-inf")]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_dequantize_writes_the_reference_nan_bytes(fmt, rng, poison):
    """The kernels write the reference's bytes for the crafted NaN cases, canonical NaNs included, to every output
    dtype, rowwise (FP4 and FP6 to 16-bit outputs through their decode asm) and transposed."""
    from mxkit.kernels.quantize import dequantize_triton
    from mxkit.tensor import MXTensor

    q, _ = _nan_cases(fmt, rng)
    qt = MXTensor(q.qdata, q.scale, q.fmt, 0, 32, (64, 4))  # the same bytes read as blocks along dim 0
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for m in (q, qt):
            assert_dequant_equal(dequantize_triton(m.to(DEV), dt), dequantize_reference(m, dt),
                                  f"{fmt} axis={m.axis} -> {dt}")
            assert_dequant_equal(kq.dequantize_triton(m.to(DEV), dt).cpu(), dequantize_reference(m.to(DEV), dt).cpu(),
                                  f"{fmt} axis={m.axis} -> {dt}, reference on CUDA")


def test_dequantize_float64_is_exact_above_fp32_range(monkeypatch):
    # FP4 RCEIL of 3e38: scale 2^126, element 4.0 -> 2^128, above fp32 max. The kernels multiply in fp32
    # (Inf), so dequantize_triton hands float64 to the reference, which multiplies in float64 (on a CPU tensor
    # here, its CUDA check stood down: the delegation is what is tested)
    from mxkit.kernels import quantize as kq
    from mxkit.kernels.quantize import dequantize_triton

    monkeypatch.setattr(kq, "_check_device", lambda *a, **kw: None)

    x = torch.zeros(1, 32)
    x[0, 0] = 3.0e38
    x[0, 1:] = torch.randn(31)
    q = quantize_reference(x, "mxfp4", scale_mode="rceil")
    got = dequantize_triton(q, torch.float64)
    assert got[0, 0].item() == 2.0**128
    assert torch.equal(got.view(torch.uint8), dequantize_reference(q, torch.float64).view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", list(_DT) if FULL else ["rotate"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_dequantize_matches_reference(fmt, out_dtype, rng, poison):
    """Quantized data and random bytes (every element code with scale bytes 0 / 1 / 254 / 255: products
    below 2^-126 are fp32 denormals) decode like the reference, rowwise and transposed."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    for k, (name, (shape, axis)) in enumerate(AXIS_CASES.items()):
        odt = _DT[out_dtype] if out_dtype in _DT else list(_DT.values())[(FORMAT_NAMES.index(fmt) + k) % 3]
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.float32, nonfinite=True)
        q = quantize_reference(x, fmt, axis=axis, scale_mode="rceil")
        assert_dequant_equal(dequantize_triton(q.to(DEV), odt), dequantize_reference(q, odt),
                              f"dequantize {name} {fmt} -> {odt}")
        qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
        sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
        sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
        qr = type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)
        assert_dequant_equal(dequantize_triton(qr.to(DEV), odt), dequantize_reference(qr, odt),
                              f"dequantize random bytes {name} {fmt} -> {odt}")
    # a swizzled-scale MXTensor is converted back first
    x = rand_tensor((130, 96), -1, generator=rng, dtype=torch.bfloat16)
    qn = quantize_triton(x.to(DEV), fmt, scale_layout="nvidia_128x4")
    assert_dequant_equal(dequantize_triton(qn, torch.bfloat16),
                          dequantize_reference(quantize_reference(x, fmt), torch.bfloat16), "dequantize nvidia_128x4")


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_gpu_fp4_word_decode_matches_reference(out, rng, poison):
    """Rowwise MXFP4 -> bf16 / fp16 through the word decode asm (fp4_asm, the default there): random bytes under
    random scale bytes (all 256 where a case has that many blocks), quantized data, shapes whose rows and row
    lengths the tile does not divide, a 3-D tensor, and qdata views 4 and 2 bytes into their storage (the
    second is copied to an aligned buffer first) give the reference's bits; the tile-dividing case also through
    other tiles; rows of 1024 codes and more (one row per program), also ragged (2880); ragged rows those tiles
    would pad by more than 1/8 (1056, 2080) on the 2-D tiles. (1, 32) has too
    few elements per thread for the asm and checks the fallback. An unwritten output byte would read 0xAB
    (poison)."""
    from mxkit.kernels.quantize import _dequantize_impl, dequantize_config, dequantize_triton
    from mxkit.tensor import MXTensor

    assert dequantize_config(1, 4096, 4096, False, "mxfp4_e2m1").fp4_asm  # (one 1024-element row per program)
    assert dequantize_config(1, 4096, 512, False, "mxfp4_e2m1").fp4_asm  # (a 2-D tile of shorter rows)
    asm = DEV != "cpu"  # (the plan of the CPU interpreter's dry run turns inline asm off: there the fallback's bits)
    dt = getattr(torch, out)
    for shape in ((727, 608), (64, 8192), (3, 5, 256), (1, 32), (9, 4096), (5, 1056), (2, 3, 2080), (3, 2880)):
        L = shape[-1]
        qd = torch.randint(0, 256, (*shape[:-1], L // 2), generator=rng, dtype=torch.uint8)
        sc = scale_bytes((*shape[:-1], L // 32), rng)
        q = MXTensor(qd, sc, "mxfp4_e2m1", len(shape) - 1, 32, shape)
        plan = dict(kq._dequantize_plan("mxfp4_e2m1", len(shape) - 1, shape, dt, None)[5])
        assert plan["FP4_ASM"] == (asm and shape != (1, 32)), shape
        want = dequantize_reference(q, dt)
        assert_dequant_equal(dequantize_triton(q.to(DEV), dt), want, f"fp4 words {shape}")
        if shape == (64, 8192):
            for cfg in (DC(block_n=8, block_l=512, num_warps=4, int64=False, hw_dec=True, fp4_asm=True),
                        DC(block_n=2, block_l=1024, num_warps=2, int64=False, hw_dec=True,
                                         fp4_asm=True)):
                got = _dequantize_impl(qd.to(DEV), sc.to(DEV), "mxfp4_e2m1", -1, shape, dt, cfg)
                assert_dequant_equal(got, want, f"fp4 words {cfg}")
    x = rand_tensor((130, 96), -1, generator=rng, dtype=dt, nonfinite=True)
    q = quantize_reference(x, "mxfp4_e2m1")
    assert_dequant_equal(dequantize_triton(q.to(DEV), dt), dequantize_reference(q, dt),
                          "fp4 words quantized")
    for off in (4, 2):  # qdata not at the start of its storage
        buf = torch.randint(0, 256, (130 * 48 + off,), generator=rng, dtype=torch.uint8).to(DEV)
        qv = buf[off:].view(130, 48)
        qo = MXTensor(qv, q.scale.to(DEV), "mxfp4_e2m1", 1, 32, (130, 96))
        want = dequantize_reference(MXTensor(qv.cpu(), q.scale, "mxfp4_e2m1", 1, 32, (130, 96)), dt)
        assert_dequant_equal(dequantize_triton(qo, dt), want, f"fp4 words offset {off}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_gpu_fp8_row_tiles_match_reference(fmt, rng, poison):
    """Rowwise MXFP8 -> bf16 / fp16 on one 1024-element row per program (the default from rows of 1024 codes,
    unless they are ragged and shorter than 2048), also ragged (2080, 2880) and 3-D; 1056 on the 2-D tile; random
    bytes (NaN / Inf codes included) under every scale byte; fp32 output on the 2-D tile of the same shapes."""
    from mxkit.kernels.quantize import dequantize_config, dequantize_triton
    from mxkit.tensor import MXTensor

    assert dequantize_config(1, 64, 8192, False, fmt).block_n == 1
    assert dequantize_config(1, 64, 8192, False, fmt, torch.float32).block_n > 1
    assert dequantize_config(1, 5, 1056, False, fmt).block_n > 1
    assert dequantize_config(1, 3, 2880, False, fmt).block_n == 1
    for shape in ((5, 1056), (2, 3, 2080), (3, 2880), (64, 8192)):
        L = shape[-1]
        qd = torch.randint(0, 256, shape, generator=rng, dtype=torch.uint8)
        sc = scale_bytes((*shape[:-1], L // 32), rng)
        q = MXTensor(qd, sc, fmt, len(shape) - 1, 32, shape)
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            assert_dequant_equal(dequantize_triton(q.to(DEV), dt), dequantize_reference(q, dt),
                                  f"{fmt} {shape} {dt}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [f for f in FORMAT_NAMES if not f.startswith("mxfp6")])  # FP6: below
def test_gpu_dequantize_variants_match_reference(fmt, rng, poison):
    """The integer decode and the hardware FP8 -> fp16 decode (hw_dec) of the rowwise tiles (FP4 to bf16 / fp16:
    also the word decode asm on a masked tile), of quantized data and of random bytes (every code, scale bytes
    0 / 1 / 254 / 255), to every output dtype."""
    from mxkit.kernels.quantize import _dequantize_impl

    x = rand_tensor((300, 608), -1, generator=rng, dtype=torch.float32, nonfinite=True)
    q = quantize_reference(x, fmt, scale_mode="rceil")
    qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
    sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
    sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    cfgs = [DC(block_n=16, block_l=256, num_warps=4, int64=False),
            DC(block_n=16, block_l=256, num_warps=4, int64=False, hw_dec=True)]
    if fmt == "mxfp4_e2m1":
        cfgs.append(DC(block_n=16, block_l=512, num_warps=4, int64=False, hw_dec=True, fp4_asm=True))
    for qq in (q, type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)):
        for odt in INPUT_DTYPES:
            for cfg in cfgs:
                got = _dequantize_impl(qq.qdata.to(DEV), qq.scale.to(DEV), fmt, -1, x.shape, odt, cfg)
                assert_dequant_equal(got, dequantize_reference(qq, odt), f"dequantize {cfg} {fmt} -> {odt}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_fp6_words_dequantize(fmt, rng, poison):
    """The rowwise FP6 dequantize paths (whole 16-code groups per thread; the lane-pair swap for 16-bit outputs;
    the group decode asm for bf16) of quantized data and of random bytes (every code, scale bytes 0 / 1 / 254 /
    255), to every output dtype; tiles whose pairs straddle lanes (8 x 32, one warp)."""
    from mxkit.kernels.quantize import _dequantize_impl

    x = rand_tensor((300, 608), -1, generator=rng, dtype=torch.float32, nonfinite=True)
    q = quantize_reference(x, fmt, scale_mode="rceil")
    qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
    sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
    sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    cfgs = (DC(block_n=16, block_l=256, num_warps=4, int64=False, hw_dec=True),
            DC(block_n=8, block_l=512, num_warps=4, int64=False),
            DC(block_n=16, block_l=256, num_warps=4, int64=False, hw_dec=True, pair_swap=True),
            DC(block_n=8, block_l=32, num_warps=1, int64=False, pair_swap=True),
            DC(block_n=4, block_l=512, num_warps=2, int64=False, hw_dec=True, pair_swap=True,
               fp6_asm=True),
            DC(block_n=16, block_l=256, num_warps=4, int64=False, hw_dec=True, fp6_asm=True),
            DC(block_n=8, block_l=32, num_warps=1, int64=False, hw_dec=True, pair_swap=True,
               fp6_asm=True))
    for qq in (q, type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)):
        for odt in INPUT_DTYPES:
            for cfg in cfgs:
                got = _dequantize_impl(qq.qdata.to(DEV), qq.scale.to(DEV), fmt, -1, x.shape, odt, cfg)
                assert_dequant_equal(got, dequantize_reference(qq, odt), f"dequantize {cfg} {fmt} -> {odt}")
