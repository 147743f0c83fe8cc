"""A/B of the decode-mma kernels' K loop (benchmarks/probes/decode_variants.cu): warps x tiles a batch x
loop kind, dense (M = 1, 16) and grouped (GPT-OSS-120B experts, 1 .. 64 tokens). Every variant's output
is checked byte for byte against the production kernel (at M <= 8 the loop this GPU's table picks); times are
medians after a clean-L2 read flush (µs).

    nvcc -ptx -arch=sm_80 -O3 -o /tmp/variants.ptx benchmarks/probes/decode_variants.cu   # (CUDA 12.4+)
    python3 benchmarks/probes/decode_ab.py /tmp/variants.ptx[,OTHER.ptx ...] [dense,grouped,pairs] [MxNxK,...] [REGEX]

Variants named _n<SN> (SN strips a block sharing x) run at split 1, 2, 4 and split_k's (columns /z<S>); with
SPLITS=1,2,3 (environment) every dense variant runs at those splits too. Grouped variants named _n<SN> take SN
strips a block.
"""
import ctypes
import os
import re
import sys
from pathlib import Path

import torch
from _probe import DEV as dev, kernels, split_buffers, time_us as t

import mxkit
from mxkit.bench.moe import routing
from mxkit.kernels.matmul_details import _mma_decode as md
from mxkit.kernels.matmul_table import mma_m8_loop
from mxkit.kernels.moe import align_device, pack_experts_mma

SMS = torch.cuda.get_device_properties(0).multi_processor_count
names = {(Path(p).stem, n): k for p in sys.argv[1].split(",") for n, k in kernels(p).items()}
PICK = sys.argv[4] if len(sys.argv) > 4 else ""  # a regex the dense variants' names must match
SPLITS = [int(v) for v in os.environ.get("SPLITS", "").split(",") if v]  # SPLITS=1,2,3: splits of K to time


def threads(name):
    """block size of a variant: 32 per warp (6edf583's bulk-copy variants, _b<B>, had one producer warp more)"""
    return 32 * (int(re.search(r"_w(\d+)", name).group(1)) + bool(re.search(r"_b\d+$", name)))


def close(a, b):
    """bits differ (another split of K over warps): still within 1e-2 relative of the production output"""
    return bool(((a.float() - b.float()).norm() <= 1e-2 * b.float().norm()).item())


def dense(M, N, K):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
    b = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    prod = md.MmaDecode(b.mma_q, b.mma_s, N, K, M, torch.bfloat16, special=False, m8_loop=mma_m8_loop(dev, K, N, M))
    ref = prod(x, None)
    row = {"prod": t(lambda: prod(x, None))}
    if M > 16:  # the dispatched path (mxkit.matmul) and cuBLAS bf16 beside the kernels of 32 / 64 tokens a block
        wb = mxkit.dequantize(w, torch.bfloat16)
        row["matmul"] = t(lambda: mxkit.matmul(x, b))
        row["cublas"] = t(lambda: x @ wb.T)
    mt = 8 if M <= 8 else 16
    for (stem, n), k in names.items():
        vt = int(re.match(r"m(\d+)", n).group(1)) if re.match(r"m\d+_", n) else 0  # tokens a block of the variant
        if not (vt == mt or (M > 16 and vt > 16)) or not re.search(PICK, n):
            continue
        mt_v = vt
        W = threads(n)
        sn = int(m.group(1)) if (m := re.search(r"_n(\d+)(?:_x)?$", n)) else 1  # strips a block (session 38)
        groups, strips = -(-M // mt_v), N // 16
        if strips % sn:
            continue
        dflt = md.split_k(groups * strips // sn, K, mt, SMS, sn)
        splits = sorted({dflt, 1, 2, 4}) if sn > 1 or mt_v > 16 else (dflt,)
        if SPLITS:  # every variant at these splits too (columns /z<S>)
            splits = sorted(set(splits) | set(SPLITS))
        for split in splits:
            ws, cnt = split_buffers(groups * strips // sn, split, sn * mt_v * 16)
            y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
            launch = k.bind((x, b.mma_q, b.mma_s, None, y, ws, cnt, ctypes.c_int(M), ctypes.c_int(N),
                             ctypes.c_int(K), ctypes.c_longlong(K), ctypes.c_longlong(N), ctypes.c_int(0)))  # (no bias)
            go = lambda: launch.launch(groups, strips // sn, split, W)  # noqa: E731
            go()
            torch.cuda.synchronize()
            name = n.replace("_bf16", "") if mt_v > 16 else n[len(f'm{mt}_bf16_'):]
            tag = f"{stem}:{name}" + (f"/z{split}" if sn > 1 or mt_v > 16 or SPLITS else "")
            row[tag] = (t(go), torch.equal(y, ref), close(y, ref))
    return row


E, H, I, TOPK = 128, 2880, 2880, 4
g = torch.Generator(device=dev).manual_seed(1)
w1 = mxkit.quantize(torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")
w2 = mxkit.quantize(torch.randn(E, H, I, device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")
p1, p2 = pack_experts_mma(w1), pack_experts_mma(w2)
b1 = torch.randn(E, 2 * I, device=dev) * 0.1
b2 = torch.randn(E, H, device=dev) * 0.1


def grouped(T):
    tw, tid = routing(T, E, "uniform", dev)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    ids, eids = align_device(tid, E, 8)
    n = T * TOPK
    rw = tw.reshape(-1).contiguous()
    h_ref = torch.empty(n, I, device=dev, dtype=torch.bfloat16)
    y_ref = torch.empty(n, H, device=dev)

    def prod_gu():
        md.grouped_mma(x, p1.q, p1.s, False, 2 * I, H, ids, eids, n, TOPK, gather=True, bias=b1,
                       activation="swiglu_gpt_oss", rw=None, out=h_ref)

    def prod_dn():
        md.grouped_mma(h_ref, p2.q, p2.s, False, H, I, ids, eids, n, TOPK, gather=False, bias=b2, activation=None,
                       rw=rw, out=y_ref)
    prod_gu(); prod_dn()
    row = {"prod": (t(prod_gu), t(prod_dn))}
    for sn in md.GROUPED_STRIPS[1:]:  # the production kernels at sn strips a block (session 38): the same bits
        h = torch.full((n, I), float("nan"), device=dev, dtype=torch.bfloat16)
        y = torch.full((n, H), float("nan"), device=dev)

        def gu(sn=sn, h=h):
            md.grouped_mma(x, p1.q, p1.s, False, 2 * I, H, ids, eids, n, TOPK, gather=True, bias=b1,
                           activation="swiglu_gpt_oss", rw=None, out=h, strips=sn)

        def dn(sn=sn, y=y):
            md.grouped_mma(h_ref, p2.q, p2.s, False, H, I, ids, eids, n, TOPK, gather=False, bias=b2,
                           activation=None, rw=rw, out=y, strips=sn)
        gu(); dn()
        torch.cuda.synchronize()
        ok = torch.equal(h, h_ref) and torch.equal(y, y_ref)
        row[f"prod_s{sn}"] = (t(gu), t(dn), ok, close(h, h_ref) and close(y, y_ref))
    for (stem, nm), k in names.items():
        if not nm.startswith("gu_"):
            continue
        W = threads(nm)
        gsn = int(m.group(1)) if (m := re.search(r"_n(\d+)$", nm)) else 1  # strips a block
        kd = names[(stem, "dn_" + nm[3:])]
        h = torch.full((n, I), float("nan"), device=dev, dtype=torch.bfloat16)
        y = torch.full((n, H), float("nan"), device=dev)
        a1 = (x, p1.q, p1.s, b1, None, h, ids, eids, ctypes.c_int(2 * I), ctypes.c_int(H), ctypes.c_int(n),
              ctypes.c_int(TOPK), ctypes.c_longlong(H), ctypes.c_longlong(I))
        a2 = (h_ref, p2.q, p2.s, b2, rw, y, ids, eids, ctypes.c_int(H), ctypes.c_int(I), ctypes.c_int(n),
              ctypes.c_int(TOPK), ctypes.c_longlong(I), ctypes.c_longlong(H))
        l1, l2 = k.bind(a1), kd.bind(a2)
        f1 = lambda: l1.launch(eids.numel(), 2 * I // 16 // gsn, 1, W)  # noqa: E731
        f2 = lambda: l2.launch(eids.numel(), H // 16 // gsn, 1, W)  # noqa: E731
        f1(); f2()
        torch.cuda.synchronize()
        ok = torch.equal(h, h_ref) and torch.equal(y, y_ref)
        row[f"{stem}:{nm[3:]}"] = (t(f1), t(f2), ok, close(h, h_ref) and close(y, y_ref))
    return row


def pairs(T):
    """one block per (token, slot) pair (production's pairs_mma up to 8 pairs) against the pgu_ / pdn_ variants"""
    tw, tid = routing(T, E, "uniform", dev)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    n = T * TOPK
    ids = tid.reshape(-1).contiguous()
    rw = tw.reshape(-1).contiguous()
    ws = torch.empty(n, H, device=dev)
    h_ref = torch.empty(n, I, device=dev, dtype=torch.bfloat16)
    y_ref = torch.empty(T, H, device=dev, dtype=torch.bfloat16)

    def prod_gu():
        md.pairs_mma(x, p1.q, p1.s, False, 2 * I, H, ids, TOPK, E, bias=b1, activation="swiglu_gpt_oss", rw=None,
                     out=h_ref)

    def prod_dn():
        md.pairs_mma(h_ref, p2.q, p2.s, False, H, I, ids, TOPK, E, bias=b2, activation=None, rw=rw, out=y_ref, ws=ws)
    prod_gu(); prod_dn()
    torch.cuda.synchronize()
    row = {"prod": (t(prod_gu), t(prod_dn))}
    cnt = md.pair_counters(dev, T * (H // 16))
    for (stem, nm), k in names.items():
        if not nm.startswith("pgu_"):
            continue
        W = threads(nm)
        kd = names[(stem, "pdn_" + nm[4:])]
        h = torch.full((n, I), float("nan"), device=dev, dtype=torch.bfloat16)
        y = torch.full((T, H), float("nan"), device=dev, dtype=torch.bfloat16)
        a1 = (x, p1.q, p1.s, b1, None, h, ids, ctypes.c_int(0), None, None, ctypes.c_int(2 * I), ctypes.c_int(H),
              ctypes.c_int(n), ctypes.c_int(TOPK), ctypes.c_int(E), ctypes.c_longlong(H), ctypes.c_longlong(I))
        a2 = (h_ref, p2.q, p2.s, b2, rw, y, ids, ctypes.c_int(0), ws, cnt, ctypes.c_int(H), ctypes.c_int(I),
              ctypes.c_int(n), ctypes.c_int(TOPK), ctypes.c_int(E), ctypes.c_longlong(I), ctypes.c_longlong(H))
        l1, l2 = k.bind(a1), kd.bind(a2)
        f1 = lambda: l1.launch(n, 2 * I // 16, 1, W)  # noqa: E731
        f2 = lambda: l2.launch(n, H // 16, 1, W)  # noqa: E731
        f1(); f2()
        torch.cuda.synchronize()
        ok = torch.equal(h, h_ref) and torch.equal(y, y_ref)
        row[f"{stem}:{nm[4:]}"] = (t(f1), t(f2), ok, close(h, h_ref) and close(y, y_ref))
    return row


def show(title, rows):
    cols = list(next(iter(rows.values())).keys())
    print(f"\n## {title}\n")
    print("| case | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for case, r in rows.items():
        cells = []
        for c in r.values():
            c = c if isinstance(c, tuple) else (c,)
            ts = [v for v in c if isinstance(v, float)]
            mark = "" if len(c) == len(ts) or c[len(ts)] else (" ≈" if c[len(ts) + 1] else " WRONG")
            cells.append(" / ".join(f"{v:.1f}" for v in ts) + mark)
        print(f"| {case} | " + " | ".join(cells) + " |")


print(torch.cuda.get_device_name(0), torch.__version__)
ONLY = sys.argv[2] if len(sys.argv) > 2 else "dense,grouped"  # which tables
SHAPES = [(1, 8192, 8192), (1, 28672, 8192), (1, 8192, 28672), (1, 5120, 2880), (1, 2880, 4096), (1, 4096, 4096),
          (1, 14336, 4096), (1, 4096, 14336), (1, 6144, 4096), (1, 28672, 4096), (16, 8192, 8192), (16, 28672, 8192),
          (16, 4096, 4096)]
if len(sys.argv) > 3 and sys.argv[3]:  # MxNxK,... instead of SHAPES
    SHAPES = [tuple(int(v) for v in c.split("x")) for c in sys.argv[3].split(",")]
if "dense" in ONLY:
  show("dense, µs", {f"{M}x{N}x{K}": dense(M, N, K) for M, N, K in SHAPES})
if "grouped" in ONLY:
  show("grouped GPT-OSS-120B, gate_up / down µs", {f"T={T}": grouped(T) for T in (1, 4, 16, 64, 256)})
if "pairs" in ONLY:
  show("pairs GPT-OSS-120B, gate_up / down µs", {f"T={T}": pairs(T) for T in (1, 2)})
