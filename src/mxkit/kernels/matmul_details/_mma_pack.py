"""The decode-mma layout's packing on the GPU: one Triton kernel writing what
:func:`mxkit.kernels.matmul_details._mma_decode.pack_mma` writes (its PyTorch body is this kernel's reference
twin, and the CPU path), so packing a weight or GPT-OSS's experts is a memory-bound pass.

Each output word (16-row group r, 64-column tile, lane l = 4 g + t, k-step j = 2 b + s) holds the E2M1 codes of
rows 16 r + g + 8 h, columns 64 tile + 32 b + 8 t + 4 s + 2 kh + e (h, kh, e in {0, 1}) at ``BITS[(h + 2 kh, e)]``:
the codes of (h, kh) are the two nibbles of one source byte, placed by a mask and shift or two per pair (the word
is the OR over the four bytes), the bytes read as the int32 holding columns 64 tile + 32 b + 8 t .. + 7 of the row
(bytes s, kh at 2 s + kh).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from ..launch import _Launcher


@triton.jit
def _place(b, P: tl.constexpr):
    """The bits of byte b's two codes as elements (P, 0) (low nibble) and (P, 1) (high nibble) of the word
    (``_mma_decode.BITS``: element (p, 1) sits 16 bits above (p, 0)): both nibbles spread to bits 0-3 and
    16-19, then each pair's mask-and-shift."""
    x = (b & 0xF) | ((b & 0xF0) << 12)
    if P == 0:
        out = ((x & 0x70007) << 6) | ((x & 0x80008) << 12)
    elif P == 1:
        out = ((x & 0x70007) << 3) | ((x & 0x80008) << 9)
    elif P == 2:
        out = (x & 0x70007) | ((x & 0x80008) << 6)
    else:
        out = ((x & 0x30003) << 10) | ((x & 0x40004) << 11) | ((x & 0x80008) << 11)
    return out


@triton.jit
def _pack_mma_kernel(src_ptr, ssrc_ptr, dst_ptr, sdst_ptr, stats_ptr, R, T, W32, KS, TILES: tl.constexpr,
                     STATS: tl.constexpr):
    """Group r = program_id(0), tiles [TILES * program_id(1), + TILES) of T: dst words [r, tile, lane, j] from
    the codes as int32 words (W32 = K / 8 per row), and the scale bytes sdst [r, tile, g, h, blk] =
    ssrc[16 r + 8 h + g, 2 tile + blk] (KS = K / 32 per row). STATS: this program's statistics of those bytes
    at stats[3 * program]: the smallest and the largest byte other than 0xFF (255 / -1 when none), whether a
    0xFF occurs."""
    r = tl.program_id(0)
    tile = tl.program_id(1) * TILES + tl.arange(0, TILES)[:, None, None]      # [TILES, 1, 1]
    lane = tl.arange(0, 32)[None, :, None]
    j = tl.arange(0, 4)[None, None, :]
    g, t, b, s = lane // 4, lane % 4, j // 2, j % 2
    ok = (tile < T) & (lane >= 0) & (j >= 0)
    col = 8 * tile + 4 * b + t                                                # int32 word of the row
    word = tl.zeros([TILES, 32, 4], dtype=tl.int32)
    for h in tl.static_range(2):
        row = (16 * r + 8 * h + g).to(tl.int64)
        a = tl.load(src_ptr + row * W32 + col, mask=ok, other=0)
        for kh in tl.static_range(2):
            word = word | _place((a >> (8 * (2 * s + kh))) & 0xFF, h + 2 * kh)
    out = (r.to(tl.int64) * T + tile) * 128 + lane * 4 + j
    tl.store(dst_ptr + out, word, mask=ok)
    gs = tl.arange(0, 8)[None, :, None]
    q = tl.arange(0, 4)[None, None, :]                                        # 2 h + blk
    sok = (tile < T) & (gs >= 0) & (q >= 0)
    srow = (16 * r + 8 * (q // 2) + gs).to(tl.int64)
    v = tl.load(ssrc_ptr + srow * KS + 2 * tile + q % 2, mask=sok, other=0).to(tl.int32)
    tl.store(sdst_ptr + (r.to(tl.int64) * T + tile) * 32 + gs * 4 + q, v.to(tl.uint8), mask=sok)
    if STATS:
        keep = sok & (v != 255)
        at = stats_ptr + 3 * (r.to(tl.int64) * tl.num_programs(1) + tl.program_id(1))
        tl.store(at, tl.min(tl.where(keep, v, 255)))
        tl.store(at + 1, tl.max(tl.where(keep, v, -1)))
        tl.store(at + 2, tl.max((sok & (v == 255)).to(tl.int32)))


TILES = 4  # 64-column tiles per program (256 columns of 16 rows: 2 KiB in, 2 KiB out; H100: 4 to 32 swept)
# the direct launch (Triton's own launcher: ~150 us of host time a call with Triton 3.6)
_LAUNCH = _Launcher(sys.modules[__name__], "_pack_mma_kernel")


def pack_mma_fused(qdata: torch.Tensor, scale: torch.Tensor, stats: bool = False) -> tuple:
    """``pack_mma``'s (q, s) in one kernel. qdata uint8 [N, K / 2] (4-byte aligned), scale uint8 [N, K / 32],
    both contiguous. ``stats``: also the scale statistics of :func:`._envelope.scale_stats` (a list of 0-dim
    int32 device tensors: the smallest and the largest byte other than 0xFF, 255 / -1 when there is none,
    whether a 0xFF occurs), from the kernel's per-program partials."""
    N, K = qdata.shape[0], qdata.shape[1] * 2
    R, T = N // 16, K // 64
    q = torch.empty(R, T, 32, 4, dtype=torch.int32, device=qdata.device)
    s = torch.empty(R, T, 8, dtype=torch.int32, device=qdata.device)
    grid = (R, triton.cdiv(T, TILES))
    if not (R and T):  # no program: the empty weight's 255 / -1 / 0
        part = torch.tensor([[255, -1, 0]], dtype=torch.int32, device=qdata.device) if stats else None
    else:  # every program writes its row (its first tile is inside the weight)
        part = torch.empty(grid[0] * grid[1], 3, dtype=torch.int32, device=qdata.device) if stats else None
        _LAUNCH(grid, (qdata.view(torch.int32), scale, q, s.view(torch.uint8), q if part is None else part, R, T,
                       K // 8, K // 32), (("TILES", TILES), ("STATS", stats)), 4)
    if not stats:
        return q, s
    return q, s, [part[:, 0].amin(), part[:, 1].amax(), part[:, 2].amax()]
