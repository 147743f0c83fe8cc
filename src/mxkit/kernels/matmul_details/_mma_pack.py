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
def _pack_mma_kernel(src_ptr, ssrc_ptr, dst_ptr, sdst_ptr, stats_ptr, T, W32, KS, TILES: tl.constexpr,
                     STATS: tl.constexpr):
    """Group r = program_id(0), tiles [TILES * program_id(1), + TILES) of T: dst words [r, tile, lane, j] from
    the codes as int32 words (W32 = K / 8 per row), and the scale bytes sdst [r, tile, g, h, blk] =
    ssrc[16 r + 8 h + g, 2 tile + blk] (KS = K / 32 per row). The loads run along the rows (32 TILES
    contiguous bytes of codes and 2 TILES of scales a row); the words are built in that order and permuted to
    the layout's on the way to the stores. STATS: this program's statistics of its scale bytes at
    stats[3 * program]: the smallest and the largest byte other than 0xFF (255 / -1 when none), whether a 0xFF
    occurs."""
    r = tl.program_id(0)
    t0 = tl.program_id(1) * TILES
    g = tl.arange(0, 8)[:, None, None, None]
    tile = t0 + tl.arange(0, TILES)[None, :, None, None]
    b = tl.arange(0, 2)[None, None, :, None]
    t = tl.arange(0, 4)[None, None, None, :]
    ok = (tile < T) & (g >= 0) & (b >= 0) & (t >= 0)                         # [8, TILES, 2, 4]: g, tile, b, t
    at = (16 * r + g).to(tl.int64) * W32 + 8 * tile + 4 * b + t
    x0 = tl.load(src_ptr + at, mask=ok, other=0)                              # rows 16 r + g (h = 0)
    x1 = tl.load(src_ptr + at + 8 * W32, mask=ok, other=0)                    # rows 16 r + 8 + g (h = 1)
    # k-step s of the word: source bytes 2 s (kh = 0, element pair h) and 2 s + 1 (kh = 1, pair h + 2)
    w0 = (_place(x0 & 0xFF, 0) | _place((x0 >> 8) & 0xFF, 2)
          | _place(x1 & 0xFF, 1) | _place((x1 >> 8) & 0xFF, 3))
    w1 = (_place((x0 >> 16) & 0xFF, 0) | _place((x0 >> 24) & 0xFF, 2)
          | _place((x1 >> 16) & 0xFF, 1) | _place((x1 >> 24) & 0xFF, 3))
    words = tl.reshape(tl.permute(tl.join(w0, w1), (1, 0, 3, 2, 4)), (TILES, 128))  # tile, (g, t, b, s)
    trow = t0 + tl.arange(0, TILES)[:, None]
    out = (r.to(tl.int64) * T + trow) * 128 + tl.arange(0, 128)[None, :]
    tl.store(dst_ptr + out, words, mask=(trow < T) & (out >= 0))
    h = tl.arange(0, 2)[:, None, None, None]
    gs = tl.arange(0, 8)[None, :, None, None]
    st = t0 + tl.arange(0, TILES)[None, None, :, None]
    blk = tl.arange(0, 2)[None, None, None, :]
    sok = (st < T) & (h >= 0) & (gs >= 0) & (blk >= 0)                        # [2, 8, TILES, 2]: h, g, tile, blk
    v = tl.load(ssrc_ptr + (16 * r + 8 * h + gs).to(tl.int64) * KS + 2 * st + blk, mask=sok, other=0)
    sv = tl.reshape(tl.permute(v, (2, 1, 0, 3)), (TILES, 32))                 # tile, (g, h, blk)
    sout = (r.to(tl.int64) * T + trow) * 32 + tl.arange(0, 32)[None, :]
    tl.store(sdst_ptr + sout, sv, mask=(trow < T) & (sout >= 0))
    if STATS:
        vi = v.to(tl.int32)
        keep = sok & (vi != 255)
        at_s = stats_ptr + 3 * (r.to(tl.int64) * tl.num_programs(1) + tl.program_id(1))
        tl.store(at_s, tl.min(tl.min(tl.min(tl.min(tl.where(keep, vi, 255), 3), 2), 1), 0))
        tl.store(at_s + 1, tl.max(tl.max(tl.max(tl.max(tl.where(keep, vi, -1), 3), 2), 1), 0))
        tl.store(at_s + 2, tl.max(tl.max(tl.max(tl.max((sok & (vi == 255)).to(tl.int32), 3), 2), 1), 0))


@triton.jit
def _take(w, P: tl.constexpr):
    """The inverse of :func:`_place`: the byte whose low / high nibble are elements (P, 0) / (P, 1) of word w."""
    if P == 0:
        x = ((w >> 6) & 0x70007) | ((w >> 12) & 0x80008)
    elif P == 1:
        x = ((w >> 3) & 0x70007) | ((w >> 9) & 0x80008)
    elif P == 2:
        x = (w & 0x70007) | ((w >> 6) & 0x80008)
    else:
        x = ((w >> 10) & 0x30003) | ((w >> 11) & 0x40004) | ((w >> 11) & 0x80008)
    return (x & 0xF) | ((x >> 12) & 0xF0)


@triton.jit
def _unpack_mma_kernel(src_ptr, ssrc_ptr, dst_ptr, sdst_ptr, T, W32, KS, TILES: tl.constexpr):
    """The inverse of :func:`_pack_mma_kernel` (group r = program_id(0), tiles [TILES * program_id(1), + TILES)):
    the words of the layout read in their order, each row-word of codes (int32, W32 = K / 8 a row) rebuilt from
    the two k-step words it was spread over and stored along the rows; the scale bytes likewise (KS = K / 32)."""
    r = tl.program_id(0)
    t0 = tl.program_id(1) * TILES
    trow = t0 + tl.arange(0, TILES)[:, None]
    words = tl.load(src_ptr + (r.to(tl.int64) * T + trow) * 128 + tl.arange(0, 128)[None, :],
                    mask=(trow < T) & (trow >= 0), other=0)                   # tile, (g, t, b, s)
    w0, w1 = tl.split(tl.permute(tl.reshape(words, (TILES, 8, 4, 2, 2)), (1, 0, 3, 2, 4)))  # g, tile, b, t
    g = tl.arange(0, 8)[:, None, None, None]
    tile = t0 + tl.arange(0, TILES)[None, :, None, None]
    b = tl.arange(0, 2)[None, None, :, None]
    t = tl.arange(0, 4)[None, None, None, :]
    ok = (tile < T) & (g >= 0) & (b >= 0) & (t >= 0)
    at = (16 * r + g).to(tl.int64) * W32 + 8 * tile + 4 * b + t
    for h in tl.static_range(2):  # rows 16 r + 8 h + g: bytes 2 s + kh from element pair h + 2 kh of word s
        a = _take(w0, h) | (_take(w0, h + 2) << 8) | (_take(w1, h) << 16) | (_take(w1, h + 2) << 24)
        tl.store(dst_ptr + at + h * 8 * W32, a, mask=ok)
    v = tl.load(ssrc_ptr + (r.to(tl.int64) * T + trow) * 32 + tl.arange(0, 32)[None, :],
                mask=(trow < T) & (trow >= 0), other=0)                       # tile, (g, h, blk)
    v = tl.permute(tl.reshape(v, (TILES, 8, 2, 2)), (2, 1, 0, 3))             # h, g, tile, blk
    h = tl.arange(0, 2)[:, None, None, None]
    gs = tl.arange(0, 8)[None, :, None, None]
    st = t0 + tl.arange(0, TILES)[None, None, :, None]
    blk = tl.arange(0, 2)[None, None, None, :]
    sok = (st < T) & (h >= 0) & (gs >= 0) & (blk >= 0)
    tl.store(sdst_ptr + (16 * r + 8 * h + gs).to(tl.int64) * KS + 2 * st + blk, v, mask=sok)


TILES = 16  # 64-column tiles per program (1024 columns of 16 rows: 8 KiB in, 8 KiB out)
WARPS = 2  # t16w2: H100 83-96%, H200 79-92% of copy (benchmarks/h*-2026-11-25h/pack_weight_ab*.txt)
# the direct launch (Triton's own launcher: ~150 us of host time a call with Triton 3.6)
_LAUNCH = _Launcher(sys.modules[__name__], "_pack_mma_kernel")
_UNPACK = _Launcher(sys.modules[__name__], "_unpack_mma_kernel")


def pack_mma_fused(qdata: torch.Tensor, scale: torch.Tensor, stats: bool = False, *, tiles: int = TILES,
                   warps: int = WARPS) -> tuple:
    """``pack_mma``'s (q, s) in one kernel. qdata uint8 [N, K / 2] (4-byte aligned), scale uint8 [N, K / 32],
    both contiguous. ``stats``: also the per-program partials of the scale statistics, int32 [P, 3] (each row:
    the smallest and the largest byte other than 0xFF, 255 / -1 when there is none, whether a 0xFF occurs);
    :func:`mxkit.packed.partial_stats_host` reduces them (not done here: the call stays one launch with no
    host sync). ``tiles`` / ``warps``: the schedule (A/B runs)."""
    N, K = qdata.shape[0], qdata.shape[1] * 2
    R, T = N // 16, K // 64
    q = torch.empty(R, T, 32, 4, dtype=torch.int32, device=qdata.device)
    s = torch.empty(R, T, 8, dtype=torch.int32, device=qdata.device)
    grid = (R, triton.cdiv(T, tiles))
    if not (R and T):  # no program: the empty weight's 255 / -1 / 0
        part = torch.tensor([[255, -1, 0]], dtype=torch.int32, device=qdata.device) if stats else None
    else:  # every program writes its row (its first tile is inside the weight)
        part = torch.empty(grid[0] * grid[1], 3, dtype=torch.int32, device=qdata.device) if stats else None
        _LAUNCH(grid, (qdata.view(torch.int32), scale, q, s.view(torch.uint8), q if part is None else part, T,
                       K // 8, K // 32), (("TILES", tiles), ("STATS", stats)), warps)
    return (q, s, part) if stats else (q, s)


def unpack_mma_fused(q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``unpack_mma`` in one kernel: q int32 [N / 16, K / 64, 32, 4] and s int32 [N / 16, K / 64, 8] (contiguous)
    -> (qdata uint8 [N, K / 2], scale uint8 [N, K / 32])."""
    R, T = q.shape[0], q.shape[1]
    N, K = 16 * R, 64 * T
    qdata = torch.empty(N, K // 2, dtype=torch.uint8, device=q.device)
    scale = torch.empty(N, K // 32, dtype=torch.uint8, device=q.device)
    if R and T:
        _UNPACK((R, triton.cdiv(T, TILES)), (q, s.view(torch.uint8), qdata.view(torch.int32), scale, T, K // 8,
                                             K // 32), (("TILES", TILES),), WARPS)
    return qdata, scale
