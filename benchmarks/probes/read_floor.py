"""What reading a decode layer's weight bytes costs on its own, beside the M = 1 GEMM that reads them: the
floor issue #23 sets (weight + scale bytes at the 1 GiB copy's bandwidth) ignores a kernel's fixed costs
(launch, the first DRAM round trip after the flush, the tail), which weigh on layers of 2-35 MB. Per shape
N x K (MXFP4: N K / 2 code bytes + N K / 32 scale bytes), µs after the clean-L2 read flush:
  empty    a one-program Triton kernel (the harness's fixed cost)
  read     a Triton kernel reading the same bytes once (16-byte loads, one int32 sum a program; the best of
           2048 / 4096 / 8192 bytes a program)
  copy     ``dst.copy_(src)`` of half the bytes (reads and writes them: the same traffic)
  floor    the bytes at the same run's 1 GiB copy bandwidth (issue #23's floor)
  mxkit    ``mxkit.matmul`` of x [1, K] bf16 and the packed MXFP4 weight (decode-mma)
  cublas   ``x @ w.T`` with the bf16 weight (4x the bytes)
A second table: the same calls back to back, as a decode step runs them: L layers of distinct weights (L x the
bytes well past the 50 MB L2: 400 MB, at most 64 layers) captured in one CUDA graph, µs per layer of a replay.

    PYTHONPATH=src python3 benchmarks/probes/read_floor.py [NxK,...]
"""
import sys

import torch
import triton
import triton.language as tl
from _probe import DEV as dev, time_us as t

import mxkit
from mxkit.bench.moe import graphed
from mxkit.bench.timing import TimingConfig, copy_bandwidth


@triton.jit
def _read(p, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(p + offs, mask=offs < n, other=0)
    tl.store(out + tl.program_id(0), tl.sum(v, 0))


@triton.jit
def _empty(out):
    tl.store(out, 1)


def row(N: int, K: int, gbps: float, empty: float) -> tuple[str, str]:
    """The two tables' rows of the N x K MXFP4 layer."""
    nbytes = N * K // 2 + N * K // 32
    buf = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device=dev, dtype=torch.int32)
    reads = {}
    for block in (512, 1024, 2048):  # int32 a program: 2, 4, 8 KB
        part = torch.empty(triton.cdiv(buf.numel(), block), device=dev, dtype=torch.int32)
        reads[block] = t(lambda: _read[(part.numel(),)](buf, part, buf.numel(), BLOCK=block, num_warps=4))
    block = min(reads, key=reads.get)
    read = reads[block]
    half = buf[: buf.numel() // 2]
    dst = torch.empty_like(half)
    copy = t(lambda: dst.copy_(half))
    wb = (torch.randn(N, K, device=dev) * 0.05).to(torch.bfloat16)
    packed = mxkit.pack_weight(mxkit.quantize(wb, "mxfp4"))
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    ours = t(lambda: mxkit.matmul(x, packed))
    cublas = t(lambda: x @ wb.T)
    first = (f"| {N}x{K} | {nbytes / 1e6:.1f} | {empty:.1f} | {read:.1f} | {copy:.1f} | {nbytes / gbps / 1e3:.1f} | "
             f"{ours:.1f} | {cublas:.1f} | {ours / read:.2f} |")
    # back to back: L distinct layers, L x the bytes well past the 50 MB L2 (400 MB, at most 64 layers)
    L = max(4, min(64, -(-400_000_000 // nbytes)))
    bufs = [torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device=dev, dtype=torch.int32) for _ in range(L)]
    part = torch.empty(triton.cdiv(buf.numel(), block), device=dev, dtype=torch.int32)
    g_read = in_graph(lambda: [_read[(part.numel(),)](b, part, b.numel(), BLOCK=block, num_warps=4) for b in bufs])
    bufs.clear()
    pws = [mxkit.pack_weight(mxkit.quantize((torch.randn(N, K, device=dev) * 0.05).to(torch.bfloat16), "mxfp4"))
           for _ in range(L)]
    g_ours = in_graph(lambda: [mxkit.matmul(x, pw) for pw in pws])
    pws.clear()
    L16 = max(4, min(64, -(-400_000_000 // (2 * N * K))))
    wbs = [(torch.randn(N, K, device=dev) * 0.05).to(torch.bfloat16) for _ in range(L16)]
    g_cublas = in_graph(lambda: [x @ w.T for w in wbs]) / L16
    wbs.clear()
    torch.cuda.empty_cache()
    second = (f"| {N}x{K} | {L} | {g_read / L:.1f} | {g_ours / L:.1f} | {g_cublas:.1f} | {g_ours / g_read:.2f} |")
    return first, second


def main():
    shapes = sys.argv[1] if len(sys.argv) > 1 else \
        "1024x4096,4096x4096,6144x4096,4096x14336,28672x4096,8192x8192,28672x8192"
    gbps, _, _ = copy_bandwidth(TimingConfig())
    print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__, f"copy {gbps:.0f} GB/s")
    one = torch.zeros(1, device=dev, dtype=torch.int32)
    empty = t(lambda: _empty[(1,)](one))
    print("\n| N x K | MB | empty | read | copy | floor | mxkit | cublas bf16 | mxkit / read |")
    print("|---|---|---|---|---|---|---|---|---|")
    seconds = []
    for s in shapes.split(","):
        first, second = row(*(int(v) for v in s.split("x")), gbps, empty)
        print(first, flush=True)
        seconds.append(second)
    print("\n| N x K | layers in the graph | read | mxkit | cublas bf16 | mxkit / read |  (µs a layer, back to back)")
    print("|---|---|---|---|---|---|")
    print("\n".join(seconds))


def in_graph(step) -> float:
    """µs of one replay of ``step`` (a list of calls) captured in a CUDA graph (:func:`mxkit.bench.moe.graphed`),
    after the read flush."""
    return t(graphed(step))


if __name__ == "__main__":
    main()
