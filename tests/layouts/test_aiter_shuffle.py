"""mxkit.layouts.aiter_shuffle: the shuffled E8M0 scale layout (hand-placed bytes) and the 16x16 FP4 weight
shuffle (closed-form offsets, round trips, errors)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import bytes_equal, rand_bytes

import mxkit
from mxkit.layouts import from_data_layout, to_data_layout, to_layout


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


# --- data shuffle ------------------------------------------------------------------------------------------------
DATA_SHAPES = [(16, 32), (32, 32), (16, 64), (48, 96), (128, 1440), (2880, 1440), (4, 32, 64), (2, 3, 16, 32)]


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


@pytest.mark.parametrize("shape", DATA_SHAPES)
def test_data_shuffle_round_trip_and_formula(shape):
    q = rand_bytes(*shape)
    out = to_data_layout(q, "aiter_shuffle")
    assert out.dtype == torch.uint8 and out.shape == q.shape and out.is_contiguous()
    assert bytes_equal(out, _expected_data_shuffle(q))
    assert not torch.equal(out, q)  # it really moves bytes (random data: equality has probability ~0)
    assert bytes_equal(from_data_layout(out, "aiter_shuffle", shape), q)
    assert bytes_equal(from_data_layout(out.flatten(), "aiter_shuffle", shape), q)


def test_data_shuffle_random_shapes():
    rng = random.Random(random.getrandbits(64))  # (from the suite's seed: a failing shape replays)
    for _ in range(20):
        shape = (rng.randint(0, 3),) * rng.randint(0, 1) + (16 * rng.randint(1, 20), 32 * rng.randint(1, 12))
        q = rand_bytes(*shape)
        out = to_data_layout(q, "aiter_shuffle")
        assert bytes_equal(out, _expected_data_shuffle(q)), shape
        assert bytes_equal(from_data_layout(out, "aiter_shuffle", shape), q), shape


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
    q = rand_bytes(64, 32)
    assert bytes_equal(to_data_layout(q, "plain"), q)
    assert bytes_equal(from_data_layout(q, "plain", (64, 32)), q)
    nc = rand_bytes(64, 32).t()  # (32, 64) non-contiguous
    assert bytes_equal(to_data_layout(nc, "aiter_shuffle"), to_data_layout(nc.contiguous(), "aiter_shuffle"))
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert bytes_equal(to_data_layout(q.view(torch.float4_e2m1fn_x2), "aiter_shuffle"),
                         to_data_layout(q, "aiter_shuffle"))


def test_data_shuffle_of_quantized_weight():
    # a real MXFP4 weight (N, K) -> qdata (N, K // 2); shuffle and back gives the same MXTensor bytes
    w = torch.randn(48, 128)
    q = mxkit.quantize(w, "mxfp4", backend="reference")
    sh = to_data_layout(q.qdata, "aiter_shuffle")
    assert bytes_equal(from_data_layout(sh, "aiter_shuffle", q.qdata.shape), q.qdata)


def test_data_errors():
    q = rand_bytes(32, 64)
    for bad in ["aiter", "nvidia_128x4", None, "shuffle"]:
        with pytest.raises(ValueError, match="unknown data layout"):
            to_data_layout(q, bad)
        with pytest.raises(ValueError, match="unknown data layout"):
            from_data_layout(q, bad, q.shape)
    for dtype in (torch.float32, torch.int8, torch.float8_e4m3fn, torch.float8_e8m0fnu):
        with pytest.raises(ValueError, match="dtype"):
            to_data_layout(q.to(dtype), "aiter_shuffle")
    with pytest.raises(ValueError, match="2-D"):
        to_data_layout(rand_bytes(64), "aiter_shuffle")
    for shape in [(24, 64), (32, 48), (15, 32), (32, 16), (2, 8, 32)]:
        with pytest.raises(ValueError, match=r"N % 16 == 0 and K-bytes % 32 == 0"):
            to_data_layout(rand_bytes(*shape), "aiter_shuffle")
    out = to_data_layout(q, "aiter_shuffle")
    for bad_shape in [(64, 32), (32, 65), (16, 64), (2048,)]:
        with pytest.raises(ValueError, match="shuffled has shape"):
            from_data_layout(out, "aiter_shuffle", bad_shape)
    with pytest.raises(ValueError, match="K-bytes"):  # right numel, shape the layout cannot take
        from_data_layout(out.flatten(), "aiter_shuffle", (128, 16))
    with pytest.raises(ValueError, match="non-negative"):
        from_data_layout(out, "aiter_shuffle", (32, -64))


def test_one_formula_for_host_and_kernels():
    """The kernels' offset formula (``aiter_shuffle.offsets``, the 32 x 8 tile's position included) is where the host
    swizzle puts each scale byte, over several tiles in both directions (ragged 300 x 9: the tile term was never
    exercised: the host swizzle calls the formula inside one tile)."""
    from mxkit.layouts import aiter_shuffle, scale_layout_shape

    rows, cols = 300, 9
    _, C = scale_layout_shape(rows, cols, "aiter_shuffle")
    s = torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
    r, c = torch.arange(rows).view(-1, 1), torch.arange(cols).view(1, -1)
    out = to_layout(s, "aiter_shuffle").flatten()
    assert torch.equal(out[aiter_shuffle.offsets(r, c, C).flatten()], s.flatten())
