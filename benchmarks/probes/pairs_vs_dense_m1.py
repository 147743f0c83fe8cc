"""M bf16 rows (default 1) against an MXFP4 weight (N, K): the dense decode kernel in each of its m8 loops
(``_mma_decode.M8_LOOPS``: register, lean, ring of 4, ring of 2; the same bits) against, at M = 1, the MoE pairs
kernel over one expert (``_mma_decode.swiglu_mma``: the same weight
bytes, one block per 16 columns over all of K, SwiGLU epilogue so no combine scratch). L distinct weights (at least
~256 MB in all: no L2 reuse) chained in one CUDA graph, µs a weight over the replays, median of R alternating
rounds.

    PYTHONPATH=src python3 benchmarks/probes/pairs_vs_dense_m1.py [R [M [NxK ...]]]
"""
import math
import sys

import torch
from torch import nn

import mxkit
from mxkit.kernels.matmul_details import _mma_decode

R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
M = int(sys.argv[2]) if len(sys.argv) > 2 else 1
assert 1 <= M <= 8, "the m8 loops run up to 8 rows"
SHAPES = [tuple(map(int, a.split("x"))) for a in sys.argv[3:]] or [
    (8192, 8192), (28672, 8192), (8192, 28672), (28672, 4096), (14336, 4096), (6144, 4096), (4096, 4096),
    (4096, 14336), (5120, 2880), (2880, 4096), (128256, 4096)]


def weights(N: int, K: int):
    L = max(2, math.ceil(256e6 / (N * K * 17 / 32)))
    torch.manual_seed(0)
    out = []
    for _ in range(L):
        m = nn.Sequential(nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16))
        mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
        out.append(m[0])
    return out


def timed(fn, L):
    g = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run():
        g.replay()
        torch.cuda.synchronize()
        e0.record()
        for _ in range(10):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3 / 10 / L
    return run


LOOPS = _mma_decode.M8_LOOPS
print(f"gpu {torch.cuda.get_device_name()} | R {R} | M {M} | µs a weight, median")
print(f"{'N x K':>14} {'L':>3} " + " ".join(f"{'m8' + lp:>8}" for lp in LOOPS)
      + f" {'pairs':>8}  pairs/best  same bits")
for N, K in SHAPES:
    lins = weights(N, K)
    L = len(lins)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    ids = _mma_decode.zero_ids(x.device)
    outs = [torch.empty(1, N // 2, device="cuda", dtype=torch.bfloat16) for _ in lins]
    runs, ys = {}, {}
    for lp in LOOPS:
        calls = [_mma_decode.MmaDecode.of(lin._packed, M, torch.bfloat16, lp) for lin in lins]
        ys[lp] = [None] * L

        def dense(calls=calls, y=ys[lp]):
            for i, c in enumerate(calls):
                y[i] = c(x, None)
        runs[lp] = timed(dense, L)
    if M == 1:
        launches = [(lin._packed.mma_q, lin._packed.mma_s, bool(lin._packed.has_nan or lin._packed.scale_min == 0))
                    for lin in lins]

        def pairs():
            for (q, s, sp), o in zip(launches, outs):
                _mma_decode.swiglu_mma(x, q, s, sp, N, K, ids, o)
        runs["pairs"] = timed(pairs, L)
    t = {k: [] for k in runs}
    for r in range(R):
        for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t[k].append(runs[k]())
    med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
    same = all(torch.equal(ys[lp][0], ys[LOOPS[0]][0]) for lp in LOOPS)
    best = min(med[lp] for lp in LOOPS)
    print(f"{N:>7}x{K:<6} {L:>3} " + " ".join(f"{med[lp]:8.2f}" for lp in LOOPS)
          + (f" {med['pairs']:8.2f}  {med['pairs'] / best:10.3f}" if "pairs" in med else f" {'-':>8}  {'-':>10}")
          + f"  {same}", flush=True)
    del lins, outs, ys, runs
    torch.cuda.empty_cache()
