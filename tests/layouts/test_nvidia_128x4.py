"""mxkit.layouts.nvidia_128x4 (cuBLAS blocked scale-factor layout): hand-placed bytes, torchao's ``to_blocked`` /
``from_blocked``, and the one offset formula shared by the host swizzle and the quantize kernels."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import SCALE_SHAPES, bytes_equal, rand_bytes

from mxkit.layouts import from_layout, to_layout


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


def test_nvidia_matches_torchao_to_blocked():
    utils = pytest.importorskip("torchao.prototype.mx_formats.utils")
    for shape in SCALE_SHAPES + [(random.randint(1, 600), random.randint(1, 50)) for _ in range(10)]:
        s = rand_bytes(*shape)
        ours = to_layout(s, "nvidia_128x4")
        theirs = utils.to_blocked(s)  # flat (32 * ceil(rows/128)) * (16 * ceil(cols/4)) bytes
        assert bytes_equal(ours.flatten(), theirs), shape
        assert bytes_equal(utils.from_blocked(ours.flatten(), *shape), s), shape
        assert bytes_equal(from_layout(theirs, "nvidia_128x4", shape), s), shape
    # e8m0 dtype in, e8m0 dtype in torchao: same bytes
    s = rand_bytes(200, 7).view(torch.float8_e8m0fnu)
    assert bytes_equal(to_layout(s, "nvidia_128x4").flatten(), utils.to_blocked(s))


def test_one_formula_for_host_and_kernels():
    """The offset formula is written once: the quantize kernels' jit helper is the same Python function as the
    host's ``offsets``, which the host swizzle applies per tile; both agree with the byte placement above."""
    import triton

    from mxkit.layouts import nvidia_128x4
    from mxkit.kernels.quantize_details import _store

    assert isinstance(nvidia_128x4._offsets, triton.runtime.JITFunction)
    assert nvidia_128x4._offsets.fn is nvidia_128x4.offsets
    assert _store._nv128x4_offsets is nvidia_128x4._offsets
    rows, cols = 300, 9
    R, C = 384, 12
    r, c = torch.arange(rows).view(-1, 1), torch.arange(cols).view(1, -1)
    s = rand_bytes(rows, cols)
    out = to_layout(s, "nvidia_128x4").flatten()
    assert bytes_equal(out[nvidia_128x4.offsets(r, c, C).flatten()], s.flatten())
    assert to_layout(s, "nvidia_128x4").shape == (R, C)
