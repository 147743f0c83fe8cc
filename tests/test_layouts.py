"""Tests for mxkit.layouts: scale swizzles (nvidia_128x4, aiter_shuffle) and the aiter FP4 data shuffle.

The implementation uses view/permute chains; the expectations here are built independently, byte by byte,
from the closed-form offsets (written out below with their sources), plus hand-placed bytes and a live
comparison with torchao's ``to_blocked`` / ``from_blocked``.
"""

from __future__ import annotations

import random

import pytest
import torch

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
from mxkit.tensor import MXTensor

SWIZZLED = ["nvidia_128x4", "aiter_shuffle"]
ALL_SCALE = list(SCALE_LAYOUTS)

# rows/cols below, at and above every padding multiple, degenerate 1×1, a GPT-OSS-like K/32 = 90, big
SCALE_SHAPES = [
    (1, 1), (1, 3), (3, 1), (5, 7), (31, 4), (32, 8), (33, 9), (127, 5), (128, 4), (129, 4), (200, 3),
    (255, 8), (256, 8), (257, 9), (300, 17), (640, 90), (1000, 1), (2880, 90),
]


def _rand_bytes(*shape, device="cpu") -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, device=device)


def _u8_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


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


def _data_offsets(N: int, KB: int) -> torch.Tensor:
    # aiter shuffle_weight(layout=(16, 16)) on 1-byte data: 16 rows x 32 B tiles (512 B), row-major tile order;
    # inside: K half (kb // 16 % 2) major, then row n % 16, then byte kb % 16.
    n = torch.arange(N).view(-1, 1)
    kb = torch.arange(KB).view(1, -1)
    return (n // 16) * 16 * KB + (kb // 32) * 512 + (kb // 16 % 2) * 256 + (n % 16) * 16 + kb % 16


def _expected_data_shuffle(q: torch.Tensor) -> torch.Tensor:
    N, KB = q.shape[-2:]
    flat = q.reshape(-1, N * KB)
    out = torch.empty_like(flat)
    out[:, _data_offsets(N, KB).flatten()] = flat
    return out.view(q.shape)


# --- scale layouts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ALL_SCALE)
@pytest.mark.parametrize("shape", SCALE_SHAPES)
def test_scale_round_trip_and_formula(layout, shape):
    s = _rand_bytes(*shape)
    out = to_layout(s, layout)
    assert out.dtype == torch.uint8 and out.is_contiguous()
    assert tuple(out.shape) == scale_layout_shape(*shape, layout)
    assert _u8_equal(out, _expected_swizzle(s, layout))
    assert _u8_equal(from_layout(out, layout, shape), s)
    assert _u8_equal(from_layout(out.flatten(), layout, shape), s)  # flat form (torchao / TE style)


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_scale_round_trip_random_shapes(layout):
    rng = random.Random()
    for _ in range(25):
        shape = (rng.randint(1, 700), rng.randint(1, 40))
        s = _rand_bytes(*shape)
        out = to_layout(s, layout)
        assert _u8_equal(out, _expected_swizzle(s, layout)), shape
        assert _u8_equal(from_layout(out, layout, shape), s), shape


@pytest.mark.parametrize("layout", SWIZZLED)
def test_scale_big(layout):
    s = _rand_bytes(4100, 513)
    out = to_layout(s, layout)
    assert _u8_equal(from_layout(out, layout, s.shape), s)
    assert _u8_equal(out, _expected_swizzle(s, layout))


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
    s = _rand_bytes(*shape)
    out = to_layout(s, layout).flatten().clone()
    pad = torch.ones(out.numel(), dtype=torch.bool)
    pad[_scale_offsets(layout, *shape).flatten()] = False
    out[pad] = _rand_bytes(int(pad.sum())) | 1  # non-zero garbage
    assert _u8_equal(from_layout(out, layout, shape), s)


def test_nvidia_128x4_hand_placed():
    # offset(r, c) = tile * 512 + (r % 32) * 16 + (r // 32) * 4 + c % 4, tile = (r // 128) * (C // 4) + c // 4
    cases = {  # (rows, cols): {(r, c): offset}
        (128, 4): {(0, 0): 0, (0, 3): 3, (1, 0): 16, (31, 0): 496, (32, 0): 4, (33, 2): 16 + 4 + 2, (64, 1): 9,
                   (96, 0): 12, (127, 3): 31 * 16 + 3 * 4 + 3},
        (128, 8): {(0, 4): 512, (127, 7): 512 + 511},  # second column tile follows the first
        (256, 8): {(128, 0): 1024, (0, 4): 512, (129, 5): 1536 + 16 + 1},  # tiles row-major over (2, 2)
        (5, 3): {(4, 2): 4 * 16 + 2},  # padded to (128, 4)
    }
    for (rows, cols), placed in cases.items():
        for (r, c), off in placed.items():
            s = torch.zeros(rows, cols, dtype=torch.uint8)
            s[r, c] = 0xA5
            out = to_layout(s, "nvidia_128x4").flatten()
            assert out[off] == 0xA5 and int(torch.count_nonzero(out)) == 1, ((rows, cols), (r, c), off)


def test_aiter_shuffle_hand_placed():
    # offset(r, c) = (r // 32) * 32 * C + (c // 8) * 256 + (c % 4) * 64 + (r % 16) * 4 + (c // 4 % 2) * 2 + r // 16 % 2
    C = 16
    placed = {(0, 0): 0, (16, 0): 1, (0, 4): 2, (16, 4): 3, (1, 0): 4, (15, 0): 60, (0, 1): 64, (0, 3): 192,
              (0, 8): 256, (0, 9): 256 + 64, (32, 0): 32 * C, (255, 15): 7 * 32 * C + 256 + 3 * 64 + 15 * 4 + 2 + 1}
    for (r, c), off in placed.items():
        s = torch.zeros(256, C, dtype=torch.uint8)
        s[r, c] = 0x5A
        out = to_layout(s, "aiter_shuffle").flatten()
        assert out[off] == 0x5A and int(torch.count_nonzero(out)) == 1, ((r, c), off)


def test_nvidia_matches_torchao_to_blocked():
    utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    for shape in SCALE_SHAPES + [(random.randint(1, 600), random.randint(1, 50)) for _ in range(10)]:
        s = _rand_bytes(*shape)
        ours = to_layout(s, "nvidia_128x4")
        theirs = utils.to_blocked(s)  # flat (32 * ceil(rows/128)) * (16 * ceil(cols/4)) bytes
        assert _u8_equal(ours.flatten(), theirs), shape
        assert _u8_equal(utils.from_blocked(ours.flatten(), *shape), s), shape
        assert _u8_equal(from_layout(theirs, "nvidia_128x4", shape), s), shape
    # e8m0 dtype in, e8m0 dtype in torchao: same bytes
    s = _rand_bytes(200, 7).view(torch.float8_e8m0fnu)
    assert _u8_equal(to_layout(s, "nvidia_128x4").flatten(), utils.to_blocked(s))


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_scale_e8m0_dtype_and_noncontiguous(layout):
    base = _rand_bytes(40, 130)
    s = base.t()  # (130, 40), non-contiguous
    assert not s.is_contiguous()
    expect = to_layout(s.contiguous(), layout)
    assert _u8_equal(to_layout(s, layout), expect)
    assert _u8_equal(to_layout(s.view(torch.float8_e8m0fnu), layout), expect)
    back = from_layout(expect.view(torch.float8_e8m0fnu), layout, (130, 40))
    assert back.dtype == torch.uint8 and _u8_equal(back, s.contiguous())


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
    s = _rand_bytes(4, 4)
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
            to_layout(_rand_bytes(*shape), "aiter_shuffle")
    with pytest.raises(ValueError, match="non-negative"):
        scale_layout_shape(-1, 4, "plain")


@pytest.mark.parametrize("layout", ALL_SCALE)
def test_from_layout_shape_mismatch(layout):
    shape = (130, 5)
    out = to_layout(_rand_bytes(*shape), layout)
    R, C = out.shape
    for bad_shape in [(R + 1, 5) if layout == "plain" else (R + 300, 5), (130, C + 9), (130,), (130, 5, 1), 130]:
        with pytest.raises(ValueError):
            from_layout(out, layout, bad_shape)
    with pytest.raises(ValueError, match="non-negative"):
        from_layout(out, layout, (-130, 5))
    # right numel, wrong 2-D shape (transposed) is refused too
    with pytest.raises(ValueError, match="stored as"):
        from_layout(out.reshape(C, R), layout, shape)  # R != C for these shapes
    with pytest.raises(ValueError, match="stored as"):
        from_layout(out.flatten()[:-1], layout, shape)


# --- data shuffle ------------------------------------------------------------------------------------------------
DATA_SHAPES = [(16, 32), (32, 32), (16, 64), (48, 96), (128, 1440), (2880, 1440), (4, 32, 64), (2, 3, 16, 32)]


@pytest.mark.parametrize("shape", DATA_SHAPES)
def test_data_shuffle_round_trip_and_formula(shape):
    q = _rand_bytes(*shape)
    out = to_data_layout(q, "aiter_shuffle")
    assert out.dtype == torch.uint8 and out.shape == q.shape and out.is_contiguous()
    assert _u8_equal(out, _expected_data_shuffle(q))
    assert not torch.equal(out, q)  # it really moves bytes (random data: equality has probability ~0)
    assert _u8_equal(from_data_layout(out, "aiter_shuffle", shape), q)
    assert _u8_equal(from_data_layout(out.flatten(), "aiter_shuffle", shape), q)


def test_data_shuffle_random_shapes():
    rng = random.Random()
    for _ in range(20):
        shape = (rng.randint(0, 3),) * rng.randint(0, 1) + (16 * rng.randint(1, 20), 32 * rng.randint(1, 12))
        q = _rand_bytes(*shape)
        out = to_data_layout(q, "aiter_shuffle")
        assert _u8_equal(out, _expected_data_shuffle(q)), shape
        assert _u8_equal(from_data_layout(out, "aiter_shuffle", shape), q), shape


def test_data_shuffle_hand_placed():
    # offset(n, kb) = (n // 16) * 16 * KB + (kb // 32) * 512 + (kb // 16 % 2) * 256 + (n % 16) * 16 + kb % 16
    N, KB = 32, 64
    placed = {(0, 0): 0, (0, 15): 15, (0, 16): 256, (1, 0): 16, (15, 31): 256 + 240 + 15, (0, 32): 512,
              (16, 0): 16 * 64, (31, 63): 1024 + 512 + 256 + 240 + 15}
    for (n, kb), off in placed.items():
        q = torch.zeros(N, KB, dtype=torch.uint8)
        q[n, kb] = 0x3C  # nibbles stay together: whole bytes move
        out = to_data_layout(q, "aiter_shuffle").flatten()
        assert out[off] == 0x3C and int(torch.count_nonzero(out)) == 1, ((n, kb), off)


def test_data_plain_fp4_dtype_noncontiguous():
    q = _rand_bytes(64, 32)
    assert _u8_equal(to_data_layout(q, "plain"), q)
    assert _u8_equal(from_data_layout(q, "plain", (64, 32)), q)
    nc = _rand_bytes(64, 32).t()  # (32, 64) non-contiguous
    assert _u8_equal(to_data_layout(nc, "aiter_shuffle"), to_data_layout(nc.contiguous(), "aiter_shuffle"))
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert _u8_equal(to_data_layout(q.view(torch.float4_e2m1fn_x2), "aiter_shuffle"),
                         to_data_layout(q, "aiter_shuffle"))


def test_data_shuffle_of_quantized_weight():
    # a real MXFP4 weight (N, K) -> qdata (N, K // 2); shuffle and back gives the same MXTensor bytes
    w = torch.randn(48, 128)
    q = mxkit.quantize(w, "mxfp4", backend="reference")
    sh = to_data_layout(q.qdata, "aiter_shuffle")
    assert _u8_equal(from_data_layout(sh, "aiter_shuffle", q.qdata.shape), q.qdata)


def test_data_errors():
    q = _rand_bytes(32, 64)
    for bad in ["aiter", "nvidia_128x4", None, "shuffle"]:
        with pytest.raises(ValueError, match="unknown data layout"):
            to_data_layout(q, bad)
        with pytest.raises(ValueError, match="unknown data layout"):
            from_data_layout(q, bad, q.shape)
    for dtype in (torch.float32, torch.int8, torch.float8_e4m3fn, torch.float8_e8m0fnu):
        with pytest.raises(ValueError, match="dtype"):
            to_data_layout(q.to(dtype), "aiter_shuffle")
    with pytest.raises(ValueError, match="2-D"):
        to_data_layout(_rand_bytes(64), "aiter_shuffle")
    for shape in [(24, 64), (32, 48), (15, 32), (32, 16), (2, 8, 32)]:
        with pytest.raises(ValueError, match=r"N % 16 == 0 and K-bytes % 32 == 0"):
            to_data_layout(_rand_bytes(*shape), "aiter_shuffle")
    out = to_data_layout(q, "aiter_shuffle")
    for bad_shape in [(64, 32), (32, 65), (16, 64), (2048,)]:
        with pytest.raises(ValueError):
            from_data_layout(out, "aiter_shuffle", bad_shape)
    with pytest.raises(ValueError, match="K-bytes"):  # right numel, shape the layout cannot take
        from_data_layout(out.flatten(), "aiter_shuffle", (128, 16))
    with pytest.raises(ValueError, match="non-negative"):
        from_data_layout(out, "aiter_shuffle", (32, -64))


# --- through MXTensor ---------------------------------------------------------------------------------------------
def _varied(*shape, axis=-1):
    """Random values whose 32-blocks along ``axis`` span 2^-20 … 2^20, so the scales differ block to block."""
    x = torch.randn(*shape)
    x = x.movedim(axis, -1)
    mag = torch.randint(-20, 21, (*x.shape[:-1], x.shape[-1] // 32)).float().exp2()
    return (x * mag.repeat_interleave(32, dim=-1)).movedim(-1, axis)


@pytest.mark.parametrize("layout", SWIZZLED)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("shape,axis", [((200, 96), -1), ((3, 70, 64), -1), ((64, 50), 0), ((300, 576), -1)])
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
    assert _u8_equal(got, ref)
    # a wrong layout name on the same bytes must not silently agree (guards the test itself)
    other = [o for o in SWIZZLED if o != layout][0]
    if scale_layout_shape(rows, q.scale.shape[-1], other) == tuple(sw.shape):
        q3 = MXTensor(q.qdata, sw, q.fmt, q.axis, q.block_size, q.shape, scale_layout=other)
        assert not _u8_equal(mxkit.dequantize(q3, backend="reference"), ref)


@pytest.mark.parametrize("layout", SWIZZLED)
def test_quantize_scale_layout_argument(layout):
    x = _varied(130, 160)
    plain = mxkit.quantize(x, "mxfp4", backend="reference")
    q = mxkit.quantize(x, "mxfp4", scale_layout=layout, backend="reference")
    assert q.scale_layout == layout
    assert _u8_equal(q.scale, to_layout(plain.scale, layout))
    assert _u8_equal(from_layout(q.scale, layout, plain.scale.shape), plain.scale)


# --- device ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    for layout in SWIZZLED:
        s = _rand_bytes(300, 17)
        out = to_layout(s.cuda(), layout)
        assert out.device.type == "cuda"
        assert _u8_equal(out.cpu(), to_layout(s, layout))
        assert _u8_equal(from_layout(out, layout, s.shape).cpu(), s)
    q = _rand_bytes(64, 96)
    d = to_data_layout(q.cuda(), "aiter_shuffle")
    assert _u8_equal(d.cpu(), to_data_layout(q, "aiter_shuffle"))
    assert _u8_equal(from_data_layout(d, "aiter_shuffle", q.shape).cpu(), q)


def test_layout_tables():
    assert SCALE_LAYOUTS == {"plain": (1, 1), "nvidia_128x4": (128, 4), "aiter_shuffle": (256, 8)}
    assert set(DATA_LAYOUTS) == {"plain", "aiter_shuffle"}
