"""The ceiling of a cast-transpose's memory pattern, without its arithmetic (session 10 probe; GPU only).

The MXFP8 cast-transpose reads x (bf16) once and writes one byte per element twice: rowwise, in x's layout,
and columnwise, transposed. This probe times kernels that do exactly that traffic with no quantization: each
output byte is the high byte of the bf16 element (no scales, 1/32 of the traffic, are written). If even
these stay far below the copy, the limit is the memory pattern, not the quantizer.

Variants (plain Triton, one [BR, BC] tile per program):
- ``rows``: the row bytes only (the traffic of rowwise MXFP8);
- ``cols``: the transposed bytes only, Triton choosing the store layout (a shared-memory conversion);
- ``cols pk``: 4 rows' bytes packed into a 32-bit word in-thread before the transpose (mxkit's col_packed);
- ``both`` / ``both pk``: both copies from one load (the cast-transpose's traffic);
- torch ``x.t().contiguous()`` (bf16), the copy of the same bytes and mxkit's MXFP8 kernels, as anchors.

    PYTHONPATH=src python3 scripts/probe_transpose_ceiling.py [--sizes 8192,16384] [--flush write|read]
"""

import argparse

import torch
import triton
import triton.language as tl

from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels import quantize as kq


@triton.jit
def _bytes_kernel(x_ptr, qr_ptr, qc_ptr, R, C, tiles_c, BR: tl.constexpr, BC: tl.constexpr, ROW: tl.constexpr,
                  COL: tl.constexpr, PACK: tl.constexpr):
    pid = tl.program_id(0)
    pc = pid % tiles_c
    pr = pid // tiles_c
    r = pr * BR + tl.arange(0, BR)
    c = pc * BC + tl.arange(0, BC)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])  # int16 bits; the tiles divide the tensor
    q = (x >> 8) & 0xFF  # [BR, BC] int16, one byte's value
    if ROW:
        tl.store(qr_ptr + r[:, None] * C + c[None, :], q.to(tl.int8))
    if COL:
        if PACK:
            # rows 4w .. 4w + 3 of a column -> one little-endian word, then only the words are transposed
            k = tl.arange(0, 4)[None, :, None]
            words = tl.sum(tl.reshape(q.to(tl.int32), [BR // 4, 4, BC]) << (8 * k), axis=1)  # [BR / 4, BC]
            w = pr * (BR // 4) + tl.arange(0, BR // 4)
            tl.store(qc_ptr.to(tl.pointer_type(tl.int32)) + c[None, :] * (R // 4) + w[:, None], words)
        else:
            tl.store(qc_ptr + c[None, :] * R + r[:, None], q.to(tl.int8))


def run(x, qr, qc, br, bc, warps, row, col, pack):
    R, C = x.shape
    grid = (R // br * (C // bc),)
    _bytes_kernel[grid](x, qr, qc, R, C, C // bc, BR=br, BC=bc, ROW=row, COL=col, PACK=pack, num_warps=warps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8192,16384")
    ap.add_argument("--flush", default="write", choices=("write", "read"))
    args = ap.parse_args()
    w = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):  # clocks up
        w @ w
    torch.cuda.synchronize()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"flush {args.flush}; % of the copy of the same bytes (read + written) in this run")
    print(f"{'n':>6s} {'variant':28s} {'us':>8s} {'GB/s':>6s} {'%copy':>6s}  check")
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16).view(torch.int16)
        want_r = (x >> 8).to(torch.int8)
        want_c = want_r.t().contiguous()
        qr = torch.empty(n, n, device="cuda", dtype=torch.int8)
        qc = torch.empty(n, n, device="cuda", dtype=torch.int8)
        src = torch.empty(2 * n * n, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        t_copy = cuda_event_bench(lambda: dst.copy_(src), 10.0, 50.0, spin_us=100.0, flush=args.flush)
        cases = [("copy 2n^2 bytes", lambda: dst.copy_(src), 4 * n * n, None)]
        xb = x.view(torch.bfloat16)
        cases.append(("torch bf16 .t().contiguous()", lambda: xb.t().contiguous(), 4 * n * n, None))
        cases.append(("mxkit rowwise MXFP8", lambda: kq._quantize_impl(xb, "mxfp8_e4m3", -1, "floor", "rne", "plain"),
                      (3 + 1 / 32) * n * n, None))
        cases.append(("mxkit columnwise MXFP8", lambda: kq._quantize_impl(xb, "mxfp8_e4m3", 0, "floor", "rne",
                                                                          "plain"), (3 + 1 / 32) * n * n, None))
        cases.append(("mxkit cast-transpose MXFP8", lambda: kq._cast_transpose_impl(xb, "mxfp8_e4m3", "floor", "rne",
                                                                                    "plain"), (4 + 2 / 32) * n * n,
                      None))
        tiles = [(32, 128, 2), (32, 64, 1), (64, 64, 2), (64, 128, 4), (128, 64, 4), (128, 128, 4), (128, 128, 8),
                 (256, 64, 8)]
        for row, col, name, nb in ((True, False, "rows", 3), (False, True, "cols", 3), (True, True, "both", 4)):
            for pack in ((False,) if not col else (False, True)):
                for br, bc, wp in (tiles[:1] if not col else tiles):
                    label = f"{name}{' pk' if pack else ''} {br}x{bc}w{wp}"
                    cases.append((label, lambda a=(br, bc, wp, row, col, pack): run(x, qr, qc, *a), nb * n * n,
                                  (row, col)))
        for label, fn, nbytes, check in cases:
            ok = ""
            if check is not None:
                qr.fill_(-1)
                qc.fill_(-1)
                fn()
                torch.cuda.synchronize()
                good = (not check[0] or torch.equal(qr, want_r)) and (not check[1] or torch.equal(qc, want_c))
                ok = "ok" if good else "MISMATCH"
            t = t_copy if label.startswith("copy") else cuda_event_bench(fn, 10.0, 50.0, spin_us=100.0,
                                                                         flush=args.flush)
            gbs = nbytes / t / 1e3
            print(f"{n:6d} {label:28s} {t:8.1f} {gbs:6.0f} {100 * gbs / (4 * n * n / t_copy / 1e3):6.1f}  {ok}",
                  flush=True)


if __name__ == "__main__":
    main()
