"""mxkit.layouts: every scale layout against expectations built independently, byte by byte, from the closed-form
offsets (written out here with their sources): round trips, zero padding, dtypes, errors, MXTensors; the registry of
layout names; the quantize kernels writing the swizzled layouts directly (GPU)."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from conftest import DEV, FORMAT_NAMES, FULL, SCALE_SHAPES, assert_mx_equal, bytes_equal, rand_bytes, rand_tensor

import mxkit
from mxkit.layouts import (
    DATA_LAYOUTS,
    SCALE_LAYOUTS,
    from_data_layout,
    from_layout,
    scale_layout_shape,
    to_data_layout,
    to_layout,
)
from mxkit.reference import quantize_reference
from mxkit.tensor import MXTensor


SWIZZLED = ["nvidia_128x4", "aiter_shuffle"]


ALL_SCALE = list(SCALE_LAYOUTS)


# --- independent expectations (closed-form offsets) ----------------------------------------------------------
def _scale_offsets(layout: str, rows: int, cols: int) -> torch.Tensor:
    """Flat offset in the swizzled (R, C) buffer of plain byte (r, c), as an int64 (rows, cols) tensor."""
    R, C = scale_layout_shape(rows, cols, layout)
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(cols).view(1, -1)
    if layout == "plain":
        return r * C + c
    if layout == "nvidia_128x4":
        # cuBLAS "1D Block Scaling Factors Layout": 128x4 tiles (512 B) in row-major tile order; inside a tile
        # byte (r, c) sits at (r % 32) * 16 + (r // 32) * 4 + c  (32 rows of 16 B, each 16 B = 4 rows x 4 cols)
        tile = (r // 128) * (C // 4) + c // 4
        return tile * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4
    if layout == "aiter_shuffle":
        # aiter fp4_utils.py, _dynamic_mxfp4_quant_kernel_asm_layout, SHUFFLE branch (bs_offs):
        #   (r%32)//16 + ((c%8)//4)*2 + (r%16)*4 + (c%4)*64 + (c//8)*256 + (r//32)*32*C
        return (r % 32) // 16 + ((c % 8) // 4) * 2 + (r % 16) * 4 + (c % 4) * 64 + (c // 8) * 256 + (r // 32) * 32 * C
    raise AssertionError(layout)


def _expected_swizzle(scale: torch.Tensor, layout: str) -> torch.Tensor:
    rows, cols = scale.shape
    R, C = scale_layout_shape(rows, cols, layout)
    out = torch.zeros(R * C, dtype=torch.uint8)
    out[_scale_offsets(layout, rows, cols).flatten()] = scale.flatten()
    return out.view(R, C)


# --- scale layouts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ALL_SCALE)
@pytest.mark.parametrize("shape", SCALE_SHAPES)
def test_scale_round_trip_and_formula(layout, shape):
    s = rand_bytes(*shape)
    out = to_layout(s, layout)
    assert out.dtype == torch.uint8 and out.is_contiguous()
    assert tuple(out.shape) == scale_layout_shape(*shape, layout)
    assert bytes_equal(out, _expected_swizzle(s, layout))
    assert bytes_equal(from_layout(out, layout, shape), s)
    assert bytes_equal(from_layout(out.flatten(), layout, shape), s)  # flat form (torchao / TE style)


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_scale_round_trip_random_shapes(layout):
    rng = random.Random(random.getrandbits(64))  # (fresh shapes from the test's printed seed: replayable)
    for _ in range(25):
        shape = (rng.randint(1, 700), rng.randint(1, 40))
        s = rand_bytes(*shape)
        out = to_layout(s, layout)
        assert bytes_equal(out, _expected_swizzle(s, layout)), shape
        assert bytes_equal(from_layout(out, layout, shape), s), shape


@pytest.mark.parametrize("layout", SWIZZLED)
def test_scale_big(layout):
    s = rand_bytes(4100, 513)
    out = to_layout(s, layout)
    assert bytes_equal(from_layout(out, layout, s.shape), s)
    assert bytes_equal(out, _expected_swizzle(s, layout))


@pytest.mark.parametrize("layout", SWIZZLED)
@pytest.mark.parametrize("shape", [(1, 1), (127, 5), (129, 9), (300, 17)])
def test_scale_padding_is_zero(layout, shape):
    # all-0xFF input: every 0 in the output is padding, and there are exactly R*C - rows*cols of them
    s = torch.full(shape, 0xFF, dtype=torch.uint8)
    out = to_layout(s, layout).flatten()
    R, C = scale_layout_shape(*shape, layout)
    pad = torch.ones(R * C, dtype=torch.bool)
    pad[_scale_offsets(layout, *shape).flatten()] = False
    assert int(pad.sum()) == R * C - shape[0] * shape[1] > 0
    assert torch.all(out[pad] == 0) and torch.all(out[~pad] == 0xFF)


@pytest.mark.parametrize("layout", SWIZZLED)
def test_from_layout_ignores_padding_content(layout):
    # aiter allocates its padding with torch.empty: garbage there must not change the plain scale
    shape = (200, 11)
    s = rand_bytes(*shape)
    out = to_layout(s, layout).flatten().clone()
    pad = torch.ones(out.numel(), dtype=torch.bool)
    pad[_scale_offsets(layout, *shape).flatten()] = False
    out[pad] = rand_bytes(int(pad.sum())) | 1  # non-zero garbage
    assert bytes_equal(from_layout(out, layout, shape), s)


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_scale_e8m0_dtype_and_noncontiguous(layout):
    base = rand_bytes(40, 130)
    s = base.t()  # (130, 40), non-contiguous
    assert not s.is_contiguous()
    expect = to_layout(s.contiguous(), layout)
    assert bytes_equal(to_layout(s, layout), expect)
    assert bytes_equal(to_layout(s.view(torch.float8_e8m0fnu), layout), expect)
    back = from_layout(expect.view(torch.float8_e8m0fnu), layout, (130, 40))
    assert back.dtype == torch.uint8 and bytes_equal(back, s.contiguous())


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_scale_zero_size(layout):
    for shape in [(0, 3), (5, 0)]:
        s = torch.zeros(shape, dtype=torch.uint8)
        out = to_layout(s, layout)
        assert tuple(out.shape) == scale_layout_shape(*shape, layout)
        assert torch.count_nonzero(out) == 0
        assert tuple(from_layout(out, layout, shape).shape) == shape


def test_scale_layout_shape():
    assert scale_layout_shape(1, 1, "plain") == (1, 1)
    assert scale_layout_shape(1, 1, "nvidia_128x4") == (128, 4)
    assert scale_layout_shape(129, 5, "nvidia_128x4") == (256, 8)
    assert scale_layout_shape(256, 8, "aiter_shuffle") == (256, 8)
    assert scale_layout_shape(257, 90, "aiter_shuffle") == (512, 96)
    assert scale_layout_shape(0, 0, "nvidia_128x4") == (0, 0)


# --- errors ------------------------------------------------------------------------------------------------------
def test_scale_errors():
    s = rand_bytes(4, 4)
    for bad in ["nvidia", "NVIDIA_128x4", "", None, "aiter"]:
        with pytest.raises(ValueError, match="unknown scale layout"):
            to_layout(s, bad)
        with pytest.raises(ValueError, match="unknown scale layout"):
            from_layout(s, bad, (4, 4))
        with pytest.raises(ValueError, match="unknown scale layout"):
            scale_layout_shape(4, 4, bad)
    for dtype in (torch.float32, torch.int8, torch.float8_e4m3fn, torch.int32):
        with pytest.raises(ValueError, match="dtype"):
            to_layout(s.to(dtype), "nvidia_128x4")
        with pytest.raises(ValueError, match="dtype"):
            from_layout(torch.zeros(128, 4, dtype=dtype), "nvidia_128x4", (4, 4))
    with pytest.raises(TypeError):
        to_layout([[1, 2]], "plain")
    for shape in [(4,), (2, 3, 4), ()]:
        with pytest.raises(ValueError, match="2-D"):
            to_layout(rand_bytes(*shape), "aiter_shuffle")
    with pytest.raises(ValueError, match="non-negative"):
        scale_layout_shape(-1, 4, "plain")


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_from_layout_shape_mismatch(layout):
    shape = (130, 5)
    out = to_layout(rand_bytes(*shape), layout)
    R, C = out.shape
    for bad_shape in [(R + 1, 5) if layout == "plain" else (R + 300, 5), (130, C + 9), (130,), (130, 5, 1), 130]:
        with pytest.raises(ValueError, match=r"swizzled has shape|shape must be \(rows, cols\)"):
            from_layout(out, layout, bad_shape)
    with pytest.raises(ValueError, match="non-negative"):
        from_layout(out, layout, (-130, 5))
    # right numel, wrong 2-D shape (transposed) is refused too
    with pytest.raises(ValueError, match="stored as"):
        from_layout(out.reshape(C, R), layout, shape)  # R != C for these shapes
    with pytest.raises(ValueError, match="stored as"):
        from_layout(out.flatten()[:-1], layout, shape)


# --- through MXTensor ---------------------------------------------------------------------------------------------
def _varied(*shape, axis=-1):
    """Random values whose 32-blocks along ``axis`` span 2^-20 … 2^20, so the scales differ block to block."""
    x = torch.randn(*shape)
    x = x.movedim(axis, -1)
    mag = torch.randint(-20, 21, (*x.shape[:-1], x.shape[-1] // 32)).float().exp2()
    return (x * mag.repeat_interleave(32, dim=-1)).movedim(-1, axis)


@pytest.mark.parametrize("layout", SWIZZLED)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("shape,axis", [((200, 96), -1), ((3, 70, 64), -1), ((64, 50), 0), ((300, 576), -1),
                                        ((256, 256), -1)])
def test_mxtensor_with_swizzled_scale(layout, fmt, shape, axis):
    x = _varied(*shape, axis=axis)
    q = mxkit.quantize(x, fmt, axis=axis, backend="reference")
    q.scale.view(-1)[7] = 0xFF  # a NaN scale must land on the same 32 elements
    assert q.scale.unique().numel() > 5  # the test can only catch misplaced scales if they differ
    rows = q.scale.shape[:-1].numel()
    sw = to_layout(q.scale.reshape(rows, -1), layout)
    q2 = MXTensor(q.qdata, sw, q.fmt, q.axis, q.block_size, q.shape, q.scale_mode, q.rounding, scale_layout=layout)
    ref = mxkit.dequantize(q, backend="reference")
    got = mxkit.dequantize(q2, backend="reference")
    assert torch.isnan(ref).sum() == 32
    assert bytes_equal(got, ref)
    # a wrong layout name on the same bytes must not silently agree (guards the test itself)
    other = [o for o in SWIZZLED if o != layout][0]
    same = scale_layout_shape(rows, q.scale.shape[-1], other) == tuple(sw.shape)
    assert same or shape != (256, 256)  # (256 rows of 8 scale bytes: both layouts' shape, so the guard runs)
    if same:
        q3 = MXTensor(q.qdata, sw, q.fmt, q.axis, q.block_size, q.shape, scale_layout=other)
        assert not bytes_equal(mxkit.dequantize(q3, backend="reference"), ref)


@pytest.mark.parametrize("layout", SWIZZLED)
def test_quantize_scale_layout_argument(layout):
    x = _varied(130, 160)
    plain = mxkit.quantize(x, "mxfp4", backend="reference")
    q = mxkit.quantize(x, "mxfp4", scale_layout=layout, backend="reference")
    assert q.scale_layout == layout
    assert bytes_equal(q.scale, to_layout(plain.scale, layout))
    assert bytes_equal(from_layout(q.scale, layout, plain.scale.shape), plain.scale)


@pytest.mark.parametrize("layout", SWIZZLED)
def test_swizzled_layouts_under_torch_compile(layout):
    """quantize into a swizzled layout compiles for a second row count (a dynamic dim: the layout's shape check
    took only an int and raised 'rows must be a non-negative int, got s77'), and dequantize of a swizzled MXTensor
    compiles with fullgraph=True (the tile permutation's check sorted a list, which dynamo does not trace); the
    eager bytes; and no warning that dynamo ignored the tile permutation's lru_cache."""
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compile_both(layout)
    assert not [w for w in seen if "lru_cache" in str(w.message)], [str(w.message) for w in seen]


def _compile_both(layout):
    f = torch.compile(lambda x: mxkit.quantize(x, "mxfp8_e4m3", scale_layout=layout, backend="reference"),
                      backend="aot_eager")
    for rows in (64, 96, 160):
        x = rand_tensor((rows, 64))
        got, want = f(x), mxkit.quantize(x, "mxfp8_e4m3", scale_layout=layout, backend="reference")
        assert bytes_equal(got.qdata, want.qdata) and bytes_equal(got.scale, want.scale), rows
    q = mxkit.quantize(rand_tensor((64, 64)), "mxfp8_e4m3", scale_layout=layout, backend="reference")
    g = torch.compile(lambda q: mxkit.dequantize(q, backend="reference"), backend="aot_eager", fullgraph=True)
    assert bytes_equal(g(q), mxkit.dequantize(q, backend="reference"))


# --- device ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    for layout in SWIZZLED:
        s = rand_bytes(300, 17)
        out = to_layout(s.cuda(), layout)
        assert out.device.type == "cuda"
        assert bytes_equal(out.cpu(), to_layout(s, layout))
        assert bytes_equal(from_layout(out, layout, s.shape).cpu(), s)
    q = rand_bytes(64, 96)
    d = to_data_layout(q.cuda(), "aiter_shuffle")
    assert bytes_equal(d.cpu(), to_data_layout(q, "aiter_shuffle"))
    assert bytes_equal(from_data_layout(d, "aiter_shuffle", q.shape).cpu(), q)


def test_layout_tables():
    assert SCALE_LAYOUTS == {"plain": (1, 1), "nvidia_128x4": (128, 4), "aiter_shuffle": (256, 8)}
    assert set(DATA_LAYOUTS) == {"plain", "aiter_shuffle"}


def test_one_registry_of_layout_names():
    """SCALE_LAYOUTS, DATA_LAYOUTS, the kernels' layout ids (KERNEL_LAYOUT_IDS = quantize's KERNEL_SCALE_LAYOUTS)
    and the jit LAYOUT_* constexprs all come from the layout modules; the tables are read-only."""
    from mxkit import layouts
    from mxkit.kernels import quantize
    from mxkit.kernels.quantize_details import _common

    assert set(layouts.SCALE_LAYOUTS) == set(layouts.KERNEL_LAYOUT_IDS) == {"plain", "nvidia_128x4", "aiter_shuffle"}
    assert quantize.KERNEL_SCALE_LAYOUTS is layouts.KERNEL_LAYOUT_IDS
    for name, jit_id in (("plain", _common.LAYOUT_PLAIN), ("nvidia_128x4", _common.LAYOUT_NV128X4),
                         ("aiter_shuffle", _common.LAYOUT_AITER)):
        assert layouts.KERNEL_LAYOUT_IDS[name] == jit_id.value
    assert _common.LAYOUT_PLAIN_T.value not in layouts.KERNEL_LAYOUT_IDS.values()
    with pytest.raises(TypeError):
        layouts.SCALE_LAYOUTS["new"] = (1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nvidia_128x4", "aiter_shuffle"] if FULL else ["nvidia_128x4"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_swizzled_scale_layout(fmt, layout, rng, poison):
    """Scales written directly in the swizzled layout equal plain + to_layout, pad bytes included (0)."""
    from mxkit.kernels.quantize import quantize_triton

    cases = (((727, 608), -1), ((130, 96), -1), ((256, 128), -1), ((3, 96, 50), 1), ((64, 33), 0))
    for shape, axis in cases if FULL else cases[1:2] + cases[3:4]:
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.bfloat16, nonfinite=True)
        got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_layout=layout)
        assert_mx_equal(got, quantize_reference(x, fmt, axis=axis), layout, what=f"{layout} {shape} axis={axis}")
    x = rand_tensor((160, 224), -1, generator=rng, dtype=torch.float32)
    for o, a in zip(quantize_triton(x.to(DEV), fmt, axis=(-1, 0), scale_layout=layout), (-1, 0)):
        assert_mx_equal(o, quantize_reference(x, fmt, axis=a), layout, what=f"cast-transpose {layout} axis={a}")
    if not FULL:  # the other layout on one case
        got = quantize_triton(x.to(DEV), fmt, scale_layout="aiter_shuffle")
        assert_mx_equal(got, quantize_reference(x, fmt), "aiter_shuffle", what="aiter_shuffle rows")


def test_layout_shape_refuses_bools_and_plain_is_contiguous():
    """scale_layout_shape takes int extents (a bool is refused, as elsewhere); the plain layout of a
    non-contiguous scale is a contiguous tensor (the kernels read it by row-major offsets)."""
    with pytest.raises(ValueError):
        scale_layout_shape(True, 4, "plain")
    s = torch.randint(0, 256, (40, 130), dtype=torch.uint8).t()
    out = to_layout(s, "plain")
    assert out.is_contiguous() and torch.equal(out, s)


def test_layout_sizes_take_numpy_integers():
    """scale_layout_shape / from_layout / from_data_layout take NumPy integer sizes as the rest of mxkit does (they
    were refused: "rows must be a non-negative int, got np.int64(5)"); a NumPy float is still refused."""
    import numpy as np

    from mxkit.layouts import from_data_layout, to_data_layout

    assert scale_layout_shape(np.int64(5), np.int32(3), "nvidia_128x4") == (128, 4)
    s = rand_bytes(200, 6)
    assert bytes_equal(from_layout(to_layout(s, "nvidia_128x4"), "nvidia_128x4", tuple(np.array([200, 6]))), s)
    q = rand_bytes(3, 32, 64)
    assert bytes_equal(from_data_layout(to_data_layout(q, "aiter_shuffle"), "aiter_shuffle",
                                        tuple(np.array([3, 32, 64]))), q)
    with pytest.raises(ValueError, match=r"rows must be a non-negative int, got np.float64\(3.0\)"):
        scale_layout_shape(np.float64(3.0), 3, "plain")
