"""Programmatic dependent launch (PDL) of the decode kernels, on against off (``cuda_driver.set_pdl``), in one
process: the same kernels (mma_decode_sm90.ptx) and bits either way, launched with or without programmatic
stream serialization. Interleaved rounds, each a fresh CUDA graph capture; µs / ms medians.

1. the GPT-OSS-120B MoE layer's experts at 1 / 4 / 16 / 64 tokens (``bench moe``'s weights and routing; a graph
   replay after a clean-L2 read flush);
2. single decode GEMMs (M = 1 and 16), each alone in a graph after the flush;
3. Llama-3-8B (``bench decode``'s model, all 32 layers, random weights): bf16 graphs, then MXFP4 fused, graphs at
   batch 1 and 16, PDL on and off; then both compiled (``--compiled``).

    PYTHONPATH=src python benchmarks/probes/pdl_ab.py [--skip-moe] [--skip-gemm] [--skip-model] [--compiled]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _probe import time_us  # noqa: E402

import mxkit  # noqa: E402
from mxkit.bench import decode as bd, moe as bm  # noqa: E402
from mxkit.kernels import cuda_driver  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--skip-moe", action="store_true")
ap.add_argument("--skip-gemm", action="store_true")
ap.add_argument("--skip-model", action="store_true")
ap.add_argument("--compiled", action="store_true")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
dev = torch.device("cuda")
print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "| pdl available:", cuda_driver.pdl_enabled())


def ab(make, rounds=args.rounds):
    """{True: [µs...], False: [...]} of graph replays of make() captured with PDL on / off; and whether the
    outputs of the two captures are the same bits."""
    res, outs = {True: [], False: []}, {}
    for _ in range(rounds):
        for on in (True, False):
            cuda_driver.set_pdl(on)
            replay = bm.graphed(make())
            outs[on] = replay().clone()
            res[on].append(time_us(replay))
    cuda_driver.set_pdl(True)
    same = torch.equal(outs[True].view(torch.uint8), outs[False].view(torch.uint8))
    return {k: statistics.median(v) for k, v in res.items()}, same


if not args.skip_moe:
    from mxkit.kernels.moe import moe_triton, pack_experts_mma

    print("\n## MoE experts, GPT-OSS-120B (E = 128, top-4), W4A16 decode path, graph replay µs")
    print("| tokens | PDL off | PDL on | on / off | same bits |\n|---|---|---|---|---|")
    w = bm.weights("gpt-oss-120b", dev)
    packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
    for T in (1, 4, 16, 64):
        tw, ids = bm.routing(T, bm.MODELS["gpt-oss-120b"], "uniform", dev)
        x = torch.randn(T, bm.HIDDEN, device=dev, dtype=torch.bfloat16)
        t, same = ab(lambda: (lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)))
        print(f"| {T} | {t[False]:.1f} | {t[True]:.1f} | {t[True] / t[False]:.3f} | {same} |", flush=True)
    del packed, w
    bm._WEIGHTS.clear()
    torch.cuda.empty_cache()

if not args.skip_gemm:
    print("\n## One decode GEMM (bf16 x packed MXFP4) in a graph, µs")
    print("| M×N×K | PDL off | PDL on | on / off | same bits |\n|---|---|---|---|---|")
    for N, K in [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (28672, 8192)]:
        pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4"))
        for M in (1, 16):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            t, same = ab(lambda: (lambda: mxkit.matmul(x, pw)))
            print(f"| {M}×{N}×{K} | {t[False]:.1f} | {t[True]:.1f} | {t[True] / t[False]:.3f} | {same} |", flush=True)
        del pw

if not args.skip_model:
    print("\n## Llama-3-8B decode (32 layers, random weights), ms per token, graphs (32 tokens x 3 runs, median)")
    print("| model | batch | mode | PDL off | PDL on | on / off |\n|---|---|---|---|---|---|")
    TOK, REP = 32, 3
    model = bd.build_model("llama-3-8b")

    def timed(dec, step):
        return 1e3 * bd.time_decode(dec, step, TOK, REP, torch.cuda.synchronize) / TOK

    def measure(label, batches, compiled=False):
        for b in batches:
            dec = bd.Decoder(model, b, 8, TOK)
            if compiled:
                dec.compile()
            res = {True: [], False: []}
            with torch.no_grad():
                for _ in range(args.rounds):
                    for on in (True, False):
                        cuda_driver.set_pdl(on)
                        res[on].append(timed(dec, dec.capture().replay))
            cuda_driver.set_pdl(True)
            off, on = statistics.median(res[False]), statistics.median(res[True])
            mode = "compiled" if compiled else "graphs"
            print(f"| {label} | {b} | {mode} | {off:.3f} | {on:.3f} | {on / off:.3f} |", flush=True)
            del dec

    measure("bf16", (1,))
    if args.compiled:
        measure("bf16", (1,), compiled=True)
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", compute_qsnr=False, progress=False, fuse=True)
    measure("mxfp4 fused", (1, 16))
    if args.compiled:
        measure("mxfp4 fused", (1,), compiled=True)
