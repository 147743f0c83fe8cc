"""A/B of the decode-mma layout's packing kernel (``kernels/matmul_details/_mma_pack.py``): session 31's kernel
(each warp load 8 rows x 16 bytes, kept here as ``_old_kernel``) against the row-order loads of session 32 at
several tiles per program and warps, the same words checked; then ``pack_weight(act="float")`` whole (no host
sync since session 32: its scale statistics are read by the first GEMM) and that first read. µs after a clean-L2
read flush with a GPU spin ahead (the host's launch path hidden); % of a copy_ of the same codes and scales.

    PYTHONPATH=src python3 benchmarks/probes/pack_weight_ab.py   # on the GPU
"""
import sys

import torch
import triton
import triton.language as tl

import mxkit
from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels.launch import _Launcher
from mxkit.kernels.matmul_details import _mma_pack
from mxkit.kernels.matmul_details._mma_pack import _place, pack_mma_fused
from mxkit.packed import partial_stats_host


@triton.jit
def _old_kernel(src_ptr, ssrc_ptr, dst_ptr, sdst_ptr, stats_ptr, R, T, W32, KS, TILES: tl.constexpr,
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




_OLD = _Launcher(sys.modules[__name__], "_old_kernel")


def old_pack(qdata, scale, stats=False, tiles=4):
    N, K = qdata.shape[0], qdata.shape[1] * 2
    R, T = N // 16, K // 64
    q = torch.empty(R, T, 32, 4, dtype=torch.int32, device=qdata.device)
    s = torch.empty(R, T, 8, dtype=torch.int32, device=qdata.device)
    grid = (R, triton.cdiv(T, tiles))
    part = torch.empty(grid[0] * grid[1], 3, dtype=torch.int32, device=qdata.device) if stats else None
    _OLD(grid, (qdata.view(torch.int32), scale, q, s.view(torch.uint8), q if part is None else part, R, T, K // 8,
                K // 32), (("TILES", tiles), ("STATS", stats)), 4)
    return (q, s, part) if stats else (q, s)


def t(fn):
    return cuda_event_bench(fn, 10, 60, 100.0, "read")


def row(N: int, K: int) -> str:
    w = mxkit.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "mxfp4")
    q, s = w.qdata.contiguous(), w.scale.contiguous()
    nb = 2 * (q.numel() + s.numel())
    buf, sbuf = torch.empty_like(q), torch.empty_like(s)
    copy = t(lambda: (buf.copy_(q), sbuf.copy_(s)))
    want = old_pack(q, s, True)
    cells = [f"{N}x{K}: {nb / 1e6:.0f} MB, copy {copy:.1f} us ({nb / copy / 1e3:.0f} GB/s)",
             f"old {t(lambda: old_pack(q, s, True)):.1f}"]
    for tiles in (4, 8, 16, 32):
        for warps in (2, 4, 8):
            got = pack_mma_fused(q, s, True, tiles=tiles, warps=warps)
            ok = (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
                  and partial_stats_host(got[2]) == partial_stats_host(want[2]))
            us = t(lambda: pack_mma_fused(q, s, True, tiles=tiles, warps=warps))
            cells.append(f"t{tiles}w{warps} {us:.1f} ({100 * copy / us:.0f}%){'' if ok else ' MISMATCH'}")
    whole = t(lambda: mxkit.pack_weight(w, act="float"))
    cells.append(f"pack_weight {whole:.1f} ({100 * copy / whole:.0f}%)")
    first = t(lambda: mxkit.pack_weight(w, act="float").scale_max)
    cells.append(f"+ first stats read {first:.1f}")
    return " | ".join(cells)


def main():
    print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "| triton", triton.__version__)
    print(f"production: TILES={_mma_pack.TILES} WARPS={_mma_pack.WARPS}")
    for N, K in [(4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672), (5760 * 32, 2880), (5760 * 128, 2880)]:
        print(row(N, K), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
