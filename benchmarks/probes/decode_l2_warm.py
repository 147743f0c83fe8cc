"""Is the M = 1 decode GEMM faster when its weight is already in L2? The premise of prefetching the next layer's
weight on a side stream while the small kernels between GEMMs (attention, norms) run. Per Llama-3-8B decode
shape (MXFP4 W4A16, decode-mma, M = 1), µs of the GEMM alone (CUDA events around it), after:
  cold   a 256 MB read flush (the production benchmarks' measure)
  warm   the flush, then the packed weight read once (torch sum over its decode-layout words: into L2)
  half   the flush, then the first 20 MB of it read (what a bounded prefetch would leave)
and the prefetch itself: a side-stream read of the weight concurrent with 20 small kernels on the main stream.

    PYTHONPATH=src python3 benchmarks/probes/decode_l2_warm.py   # on the GPU
"""
import statistics

import torch

import mxkit


def timed(pre, fn, n=200):
    buf = torch.zeros(2**26, dtype=torch.int32, device="cuda")
    tot = torch.empty((), dtype=torch.int64, device="cuda")
    out = []
    for i in range(n + 10):
        torch.sum(buf, dim=0, out=tot)
        pre()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        out.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in out[10:])


def main():
    print(torch.cuda.get_device_name(0))
    for N, K in [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096), (8192, 8192)]:
        w = mxkit.quantize(torch.randn(N, K, device="cuda"), "mxfp4")
        pw = mxkit.pack_weight(w, act="float")
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        words = pw.mma_q.view(-1)
        first = words[: (20 << 20) // 4]
        sink = torch.empty((), dtype=torch.int64, device="cuda")
        gemm = lambda: mxkit.matmul(x, pw)  # noqa: E731
        gemm()
        cold = timed(lambda: None, gemm)
        warm = timed(lambda: (torch.sum(words, dim=0, out=sink), torch.sum(pw.mma_s.view(-1), dim=0, out=sink)), gemm)
        half = timed(lambda: torch.sum(first, dim=0, out=sink), gemm)
        mb = (pw.mma_q.numel() + pw.mma_s.numel()) * 4 / 1e6
        print(f"1x{N}x{K} ({mb:.1f} MB): cold {cold:.1f} | warm {warm:.1f} | first 20 MB warm {half:.1f} us",
              flush=True)


if __name__ == "__main__":
    main()
