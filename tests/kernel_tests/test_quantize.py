"""The public entry of the Triton backend (:func:`mxkit.kernels.quantize.quantize_triton` /
``dequantize_triton``): argument checks, the custom ops' fakes, the hardware-path guards, and on the GPU the
format x mode x rounding x dtype x axis matrix, odd / tiny shapes, repeated and misaligned calls, torch.compile."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import (
    AXIS_CASES,
    DEV, FORMAT_NAMES, FULL, HAS_CUDA, ROUNDINGS, SCALE_MODES, SKIP_REASON_CUDA, assert_dequant_equal,
    assert_mx_equal, rand_tensor,
)

from mxkit.kernels import quantize as kq
from mxkit.reference import dequantize_reference, quantize_reference


_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
if FULL:
    QUANT_CASES = [(r, d) for r in ROUNDINGS for d in _DT]
else:  # both roundings, all three dtypes, every format: (rounding, dtype) pairs rotate with the format
    QUANT_CASES = [("rne", "bfloat16"), ("away", "float32"), ("rne", "float16")]


def _quant_params():
    if FULL:
        return [(f, r, d) for f in FORMAT_NAMES for r, d in QUANT_CASES]
    return [(f, *QUANT_CASES[(i + k) % 3]) for i, f in enumerate(FORMAT_NAMES) for k in range(2)]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_fake_impls_give_reference_shapes(fmt):
    """The register_fake implementations (what torch.compile traces) agree with the reference's shapes."""
    ops = torch.ops.mxkit
    for shape, axis in (((6, 64), -1), ((64, 5), 0), ((2, 32, 7), 1)):
        x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
        ref = quantize_reference(torch.zeros(shape), fmt, axis=axis)
        q, s = ops.quantize_mx(x, fmt, axis % len(shape), "floor", "rne", "plain")
        assert q.shape == ref.qdata.shape and s.shape == ref.scale.shape and q.dtype == torch.uint8
        q, s = ops.quantize_mx(x, fmt, axis % len(shape), "floor", "rne", "nvidia_128x4")
        assert s.shape == (128, 4)
        d = ops.dequantize_mx(q, s, fmt, axis % len(shape), list(shape), torch.float16)
        assert d.shape == shape and d.dtype == torch.float16
    x = torch.empty((2, 64, 96), device="meta")
    qr, sr, qc, sc = ops.cast_transpose_mx(x, fmt, "floor", "rne", "plain")
    r0 = quantize_reference(torch.zeros(2, 64, 96), fmt, axis=-1)
    r1 = quantize_reference(torch.zeros(2, 64, 96), fmt, axis=-2)
    assert (qr.shape, sr.shape, qc.shape, sc.shape) == (r0.qdata.shape, r0.scale.shape, r1.qdata.shape,
                                                        r1.scale.shape)


def test_argument_errors_match_reference():
    cases = [
        (torch.zeros(4, 64, dtype=torch.float64), dict(), TypeError),
        (torch.zeros(4, 48), dict(), ValueError),
        (torch.zeros(4, 64), dict(axis=2), ValueError),
        (torch.zeros(0, 64), dict(), ValueError),
        (torch.zeros(4, 64), dict(scale_mode="nearest"), ValueError),
    ]
    for x, kw, exc in cases:
        with pytest.raises(exc) as e_ref:
            quantize_reference(x, "mxfp8", **kw)
        with pytest.raises(exc) as e_k:
            kq.quantize_triton(x, "mxfp8", **kw)
        assert str(e_k.value) == str(e_ref.value)
    with pytest.raises(NotImplementedError, match="block_size"):
        kq.quantize_triton(torch.zeros(4, 64), "mxfp8", block_size=64)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        with pytest.raises(ValueError, match="CUDA"):
            kq.quantize_triton(torch.zeros(4, 64), "mxfp8")
    with pytest.raises(ValueError, match="pair"):
        kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=(0, 1, 1))
    with pytest.raises(ValueError, match="differ"):
        kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=(1, -1))
    for bad in (True, 1.0, None, "1"):  # ('bool' object is not iterable, ...; '1' was taken as a pair of chars)
        with pytest.raises(TypeError, match=r"axis must be an int or a pair of ints, got"):
            kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=bad)
    # the checks are cached per problem: a bad call raises every time (exceptions are not cached), and an
    # unhashable argument (a list of axes) is checked the same way, uncached
    for _ in range(2):
        with pytest.raises(ValueError, match="multiple"):
            kq.quantize_triton(torch.zeros(4, 48), "mxfp8")
        with pytest.raises(ValueError, match="differ"):
            kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=[1, -1])
        with pytest.raises(ValueError, match="multiple"):
            kq.quantize_triton(torch.zeros(48, 64), "mxfp8", axis=[1, 0])


def test_hardware_path_guards():
    """The inline-asm paths take 4 elements per asm block: they are enabled only with >= 4 elements per
    thread, only for RNE, and FP4's bf16x2 path only for bf16 inputs (pure functions of the config)."""
    from mxkit.formats import Rounding, get_format
    from mxkit.kernels.opt_flags import DequantizeConfig as DC, QuantizeConfig as QC
    from mxkit.kernels.opt_flags_nvidia import hw_cvt_ok, hw_dec_ok

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "under the interpreter every hardware path is off"
    fp8, fp4, fp6, i8 = (get_format(n) for n in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2", "mxint8"))
    cfg = QC(block_r=16, block_c=256, num_warps=4, int64=False, hw_cvt=True)
    assert hw_cvt_ok(cfg, fp8, Rounding.RNE, 0) and hw_cvt_ok(cfg, fp6, Rounding.RNE, 2)
    assert hw_cvt_ok(cfg, fp4, Rounding.RNE, 1) and not hw_cvt_ok(cfg, fp4, Rounding.RNE, 0)  # bf16 only
    assert not hw_cvt_ok(cfg, fp4, Rounding.RNE, 2) and not hw_cvt_ok(cfg, i8, Rounding.RNE, 1)
    assert not hw_cvt_ok(cfg, fp8, Rounding.AWAY, 1)
    assert not hw_cvt_ok(QC(block_r=16, block_c=256, num_warps=4, int64=False), fp8, Rounding.RNE, 1)  # not asked for
    assert not hw_cvt_ok(QC(block_r=1, block_c=32, num_warps=1, int64=False, hw_cvt=True), fp8, Rounding.RNE,
                         1)  # 1 element per thread
    assert hw_dec_ok(DC(block_n=8, block_l=512, num_warps=4, int64=False, hw_dec=True),
                     fp4) and not hw_dec_ok(DC(block_n=8, block_l=512, num_warps=4, int64=False, hw_dec=True), i8)
    assert not hw_dec_ok(DC(block_n=1, block_l=32, num_warps=1, int64=False, hw_dec=True),
                         fp8)  # 1 element per thread
    assert not hw_dec_ok(DC(block_n=1, block_l=64, num_warps=1, int64=False, hw_dec=True), fp8)  # 2


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rounding,dtype", _quant_params())
def test_gpu_quantize_matches_reference(fmt, rounding, dtype, rng, poison):
    """Every scale mode on rowwise, columnwise (dim 0), middle-axis and one-row inputs with NaN / Inf /
    zero / denormal / saturating blocks; outputs land in poisoned memory."""
    from mxkit.kernels.quantize import quantize_triton

    # every mode is a compile of its own (the scale rule is a constexpr): outside FULL runs, each case takes
    # two modes, rotating with the format's (rounding, dtype) params so both params cover all four per case
    k = [p[0] for p in _quant_params()].index(fmt) != _quant_params().index((fmt, rounding, dtype))
    for i, (name, (shape, axis)) in enumerate(AXIS_CASES.items()):
        x = rand_tensor(shape, axis, generator=rng, dtype=_DT[dtype], nonfinite=True)
        for mode in SCALE_MODES if FULL else (SCALE_MODES[(i + k) % 4], SCALE_MODES[(i + k + 2) % 4]):
            ref = quantize_reference(x, fmt, axis=axis, scale_mode=mode, rounding=rounding)
            got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_mode=mode, rounding=rounding)
            assert_mx_equal(got, ref, what=f"{name} {fmt} {mode} {rounding} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_small_shapes(fmt, rng, poison):
    """Tiny and ragged shapes (also what compute-sanitizer runs: `-k small`)."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    for shape, axis in (((1, 32), -1), ((5, 96), -1), ((32, 7), 0), ((2, 32, 3), 1)):
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.float32, nonfinite=True)
        for layout in ("plain", "nvidia_128x4"):
            got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_mode="even", scale_layout=layout)
            ref = quantize_reference(x, fmt, axis=axis, scale_mode="even")
            assert_mx_equal(got, ref, layout, what=f"small {shape} axis={axis}")
        assert_dequant_equal(dequantize_triton(ref.to(DEV), torch.bfloat16),
                              dequantize_reference(ref, torch.bfloat16))
    x = rand_tensor((32, 64), -1, generator=rng, dtype=torch.float16)
    for o, a in zip(quantize_triton(x.to(DEV), fmt, axis=(-1, 0)), (-1, 0)):
        assert_mx_equal(o, quantize_reference(x, fmt, axis=a), what=f"small cast-transpose axis={a}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_tiny_shapes(fmt, rng):
    """Problems smaller than a tile (1-2 rows of 32-64 elements, both axes, every dtype): the tile configs
    shrink below 4 elements per thread, where the inline-asm paths must step aside."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    dts = (torch.bfloat16, torch.float32, torch.float16)  # rotated over the shapes (each dtype is a compile)
    for k, (shape, axis) in enumerate((((1, 32), -1), ((1, 64), -1), ((2, 32), -1), ((32, 1), 0), ((64, 2), 0),
                                       ((1, 64), -1))):
        dt = dts[k % 3]
        x = rand_tensor(shape, axis, generator=rng, dtype=dt)
        ref = quantize_reference(x, fmt, axis=axis)
        assert_mx_equal(quantize_triton(x.to(DEV), fmt, axis=axis), ref, what=f"{fmt} {shape} {dt}")
        got = dequantize_triton(quantize_triton(x.to(DEV), fmt, axis=axis), torch.bfloat16)
        assert_dequant_equal(got, dequantize_reference(ref, torch.bfloat16), f"dequantize {fmt} {shape} {dt}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_repeated_calls_and_misaligned_inputs(fmt, rng, poison):
    """Repeated calls (the second and later take the cached plan and the direct launch) with fresh data each
    time, alternating a 16-byte-aligned input with ones 2, 4 and 8 bytes off (other Triton specialisations;
    FP4 pairs need 4-byte, the FP6 unit asm 16-byte alignment and step aside otherwise): every result
    byte-equal to the reference, quantize (rows, columns, cast-transpose, also by one-direction programs)
    and dequantize."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    base = torch.empty(64 * 512 + 8, dtype=torch.bfloat16, device=DEV)
    for it in range(6):
        off = (0, 1, 0, 2, 0, 4)[it]
        x = base[off : off + 256 * 96].view(256, 96)
        x.copy_(rand_tensor((256, 96), -1, generator=rng, dtype=torch.bfloat16).to(DEV))
        assert (x.data_ptr() % 16 == 0) == (off == 0)
        xc = x.cpu()
        for axis in (-1, 0):
            ref = quantize_reference(xc, fmt, axis=axis)
            got = quantize_triton(x, fmt, axis=axis)
            assert_mx_equal(got, ref, what=f"{fmt} axis {axis} call {it}")
            assert_dequant_equal(dequantize_triton(got, torch.bfloat16), dequantize_reference(ref, torch.bfloat16),
                                  f"dequantize {fmt} axis {axis} call {it}")
        rows, cols = quantize_triton(x, fmt, axis=(-1, -2))
        assert_mx_equal(rows, quantize_reference(xc, fmt, axis=-1), what=f"{fmt} cast-transpose rows call {it}")
        assert_mx_equal(cols, quantize_reference(xc, fmt, axis=0), what=f"{fmt} cast-transpose cols call {it}")
        # C >= 512: the FP6 pairs kernel (at an address that is not a multiple of 4: its fallback)
        x2 = base[off : off + 64 * 512].view(64, 512)
        x2.copy_(rand_tensor((64, 512), -1, generator=rng, dtype=torch.bfloat16).to(DEV))
        rows, cols = quantize_triton(x2, fmt, axis=(-1, -2))
        assert_mx_equal(rows, quantize_reference(x2.cpu(), fmt, axis=-1), what=f"{fmt} split rows call {it}")
        assert_mx_equal(cols, quantize_reference(x2.cpu(), fmt, axis=0), what=f"{fmt} split cols call {it}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_negative_bit_views_are_resolved(dtype, rng):
    """A tensor with the negative bit set (torch._neg_view: its memory holds -x) quantizes as x on every Triton
    entry, the cached fast calls included (repeated calls): the kernels read the memory raw, so fp16 returned the
    codes of -x and float32 / bf16 raised torch's view error. Also the FP8 rowwise and the fold's quantizations."""
    import mxkit

    for it in range(3):
        x = rand_tensor((64, 96), -1, generator=rng, dtype=dtype).to(DEV)
        y = torch._neg_view(x)
        assert y.is_neg()
        plain = y.resolve_neg()
        for axis in (-1, 0, (-1, 0)):
            got = kq.quantize_triton(y, "mxfp4_e2m1", axis=axis)
            want = kq.quantize_triton(plain, "mxfp4_e2m1", axis=axis)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert_mx_equal(g, w, what=f"{dtype} axis {axis} call {it}")
        a, b = mxkit.quantize_fp8_rowwise(y, backend="triton"), mxkit.quantize_fp8_rowwise(plain, backend="triton")
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)
        a, b = mxkit.quantize_fold(y, "mxfp4", backend="triton"), mxkit.quantize_fold(plain, "mxfp4", backend="triton")
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2"] if FULL else ["mxfp4_e2m1"])
def test_gpu_large_tiles(fmt, rng):
    """8192 x 8192 bf16 (the benchmark shape, production tile configs) rowwise / columnwise /
    cast-transpose against the reference computed on the GPU (same torch ops as on CPU), and dequantize."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    if DEV != "cuda":
        pytest.skip(SKIP_REASON_CUDA)  # (8192^2: too large for the interpreter)
    x = (torch.randn(8192, 8192,
                     generator=rng) * torch.exp2(torch.randint(-30, 30, (8192, 1), generator=rng).float()))
    x = x.to(torch.bfloat16).cuda()
    for axis in (-1, 0):
        ref = quantize_reference(x, fmt, axis=axis)
        got = quantize_triton(x, fmt, axis=axis)
        assert torch.equal(got.qdata, ref.qdata) and torch.equal(got.scale, ref.scale), f"axis={axis}"
        d = dequantize_triton(got, torch.bfloat16)
        assert torch.equal(d.view(torch.int16), dequantize_reference(ref, torch.bfloat16).view(torch.int16))
        del ref, got, d
    rq, cq = quantize_triton(x, fmt, axis=(-1, 0))
    ref = quantize_reference(x, fmt, axis=-1)
    assert torch.equal(rq.qdata, ref.qdata) and torch.equal(rq.scale, ref.scale)
    del ref
    ref = quantize_reference(x, fmt, axis=0)
    assert torch.equal(cq.qdata, ref.qdata) and torch.equal(cq.scale, ref.scale)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=SKIP_REASON_CUDA)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1"] if FULL else ["mxfp4_e2m1"])
def test_gpu_torch_compile_fullgraph(fmt, rng):
    """The custom ops trace under torch.compile(fullgraph=True) and give the eager bytes."""

    x = rand_tensor((256, 512), -1, generator=rng, dtype=torch.bfloat16).cuda()

    def raw(t):
        q, s = torch.ops.mxkit.quantize_mx(t * 2, fmt, 1, "rceil", "rne", "plain")
        qr, sr, qc, sc = torch.ops.mxkit.cast_transpose_mx(t, fmt, "floor", "rne", "nvidia_128x4")
        d = torch.ops.mxkit.dequantize_mx(q, s, fmt, 1, list(t.shape), torch.bfloat16)
        return q, s, qr, sr, qc, sc, d + 1

    eager = raw(x)
    compiled = torch.compile(raw, fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=SKIP_REASON_CUDA)
def test_gpu_custom_ops_after_the_hot_path_warms_up(rng):
    """Repeated calls of the custom ops, eager and compiled, after the public calls made the problem's fast calls
    (the hot cast-transpose's grouped outputs are its own: an op's outputs sharing a storage are refused by
    PyTorch from the fast call on, its 3rd-4th call), and the public calls' bytes."""
    import mxkit

    fmt = "mxfp8_e4m3"
    x = rand_tensor((256, 512), -1, generator=rng, dtype=torch.bfloat16).cuda()
    for _ in range(4):  # (the plans' fast calls made, the hot runner's grouped wrap too)
        rows, cols = mxkit.cast_transpose(x, fmt)
        q = mxkit.quantize(x, fmt)
    assert rows.qdata.untyped_storage().data_ptr() == rows.scale.untyped_storage().data_ptr()

    def raw(t):
        return (*torch.ops.mxkit.cast_transpose_mx(t, fmt, "floor", "rne", "plain"),
                *torch.ops.mxkit.quantize_mx(t, fmt, 1, "floor", "rne", "plain"))

    compiled = torch.compile(raw, fullgraph=True)
    want = (rows.qdata, rows.scale, cols.qdata, cols.scale, q.qdata, q.scale)
    for call in range(5):
        for how, fn in (("eager", raw), ("compiled", compiled)):
            got = fn(x)
            assert len({t.untyped_storage().data_ptr() for t in got}) == 6, (how, call)
            for a, b in zip(got, want):
                assert torch.equal(a, b), (how, call)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=SKIP_REASON_CUDA)
@pytest.mark.parametrize("layout", ["plain", "nvidia_128x4"])
def test_gpu_hot_axis_pair_with_a_padded_scale(layout, rng):
    """An axis pair whose swizzled scales are padded (64 x 96: 3 and 2 blocks a row, under 128 rows) through the hot
    path, call after call (its grouped wrap refused zero-filled scales: every call from the third raised), fresh x
    each time: the reference's bytes."""
    import mxkit

    for call in range(4):
        x = rand_tensor((64, 96), -1, generator=rng, dtype=torch.bfloat16)
        got = mxkit.quantize(x.cuda(), "mxfp8_e4m3", axis=(-1, -2), scale_layout=layout)
        want = mxkit.quantize(x, "mxfp8_e4m3", axis=(-1, -2), scale_layout=layout, backend="reference")
        for g, w in zip(got, want):
            assert g.axis == w.axis and g.scale_layout == w.scale_layout == layout
            assert torch.equal(g.qdata.cpu(), w.qdata) and torch.equal(g.scale.cpu(), w.scale), (layout, call)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=SKIP_REASON_CUDA)
def test_gpu_torch_compile_fullgraph_public_api(rng):
    """quantize_triton / dequantize_triton themselves (argument checks, MXTensor) trace without a break."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    fmt = "mxfp4_e2m1"
    x = rand_tensor((256, 512), -1, generator=rng, dtype=torch.bfloat16).cuda()

    def wrapped(t):
        q = quantize_triton(t, fmt, scale_mode="rceil")
        return q.qdata, q.scale, dequantize_triton(q, torch.bfloat16)

    eager = wrapped(x)
    compiled = torch.compile(wrapped, fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
