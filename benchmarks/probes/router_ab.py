"""A/B of GPT-OSS's router at decode sizes (T tokens, E experts, H = 2880): cuBLAS's GEMM + mxkit's routing kernel
(the shipped path: 3 launches) against one-launch Triton routers that sum the logits in float64.

Each variant runs 24 times in one CUDA graph (24 layers' router weights, as in a GPT-OSS-20B step), timed after a
clean-L2 read flush; the table gives µs a layer. `python benchmarks/probes/router_ab.py [T] [E] [--all]` (--all:
the variants tried besides the shipped one, `mxkit`)."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from mxkit.bench.timing import cuda_event_bench  # noqa: E402
from mxkit.kernels.matmul_details._route import _top_k_softmax, route_gpt_oss, router_gpt_oss  # noqa: E402

LAYERS = 24


@triton.jit
def _finish(f, t, logits_ptr, w_ptr, ids_ptr, E, cols, K: tl.constexpr, E_P2: tl.constexpr, K_P2: tl.constexpr,
            LOG_K_P2: tl.constexpr):
    """float32 logits f [1, E_P2] of token t -> bf16 logits (to nearest even), top-K ids and weights stored."""
    ok = cols < E
    b32 = f.to(tl.int32, bitcast=True)
    bits = (b32 + 0x7FFF + ((b32 >> 16) & 1)) >> 16
    bits = tl.where(f != f, 0x7FC0, bits).to(tl.int16)
    tl.store(logits_ptr + t * E + cols, bits, mask=ok)
    v = bits.to(tl.bfloat16, bitcast=True).to(tl.float32)
    w, ids, slot = _top_k_softmax(v, ok, cols, K, E_P2, K_P2, LOG_K_P2, 1, True)
    keep = slot < K
    tl.store(w_ptr + t * K + slot, w, mask=keep)
    tl.store(ids_ptr + t * K + slot, ids, mask=keep)


@triton.jit
def _split_h_kernel(x_ptr, wt_ptr, b_ptr, part_ptr, logits_ptr, w_ptr, ids_ptr, cnt_ptr, E, H,
                    S: tl.constexpr, S_P2: tl.constexpr, BH: tl.constexpr, F64: tl.constexpr, K: tl.constexpr,
                    E_P2: tl.constexpr, K_P2: tl.constexpr, LOG_K_P2: tl.constexpr):
    """Token program_id(0), columns [BH * program_id(1), + BH) of every expert: partial sums into part (T, S, E_P2);
    the token's last program adds the S partials in order, the bias, and routes."""
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    e = tl.arange(0, E_P2)
    hh = p * BH + tl.arange(0, BH)
    xv = tl.load(x_ptr + t * H + hh, mask=hh < H, other=0.0).to(tl.float32)
    wv = tl.load(wt_ptr + e[:, None].to(tl.int64) * H + hh[None, :], mask=(e[:, None] < E) & (hh[None, :] < H),
                 other=0.0).to(tl.float32)
    prod = wv * xv[None, :]  # exact: bf16 x bf16
    if F64:
        s = tl.sum(prod.to(tl.float64), axis=1)
    else:
        s = tl.sum(prod, axis=1).to(tl.float64)
    tl.store(part_ptr + (t * S + p) * E_P2 + e, s)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel")
    if arrived == S - 1:
        rows = tl.arange(0, S_P2)[:, None]
        cols = tl.arange(0, E_P2)[None, :]
        parts = tl.load(part_ptr + (t * S + rows) * E_P2 + cols, mask=rows < S, other=0.0, volatile=True)
        tot = tl.sum(parts, axis=0)[None, :] + tl.load(b_ptr + cols, mask=cols < E, other=0.0).to(tl.float64)
        _finish(tot.to(tl.float32), t, logits_ptr, w_ptr, ids_ptr, E, cols, K, E_P2, K_P2, LOG_K_P2)
        tl.store(cnt_ptr + t, 0)


@triton.jit
def _single_kernel(x_ptr, wt_ptr, b_ptr, logits_ptr, w_ptr, ids_ptr, E, H, BH: tl.constexpr, K: tl.constexpr,
                   E_P2: tl.constexpr, K_P2: tl.constexpr, LOG_K_P2: tl.constexpr):
    """Token program_id(0): every expert over all of H in one program, float64 sums, then routes."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_P2)
    acc = tl.zeros([E_P2, BH], dtype=tl.float64)
    for h0 in range(0, H, BH):
        hh = h0 + tl.arange(0, BH)
        xv = tl.load(x_ptr + t * H + hh, mask=hh < H, other=0.0).to(tl.float32)
        wv = tl.load(wt_ptr + e[:, None].to(tl.int64) * H + hh[None, :],
                     mask=(e[:, None] < E) & (hh[None, :] < H), other=0.0).to(tl.float32)
        acc += (wv * xv[None, :]).to(tl.float64)
    cols = tl.arange(0, E_P2)[None, :]
    tot = tl.sum(acc, axis=1)[None, :] + tl.load(b_ptr + cols, mask=cols < E, other=0.0).to(tl.float64)
    _finish(tot.to(tl.float32), t, logits_ptr, w_ptr, ids_ptr, E, cols, K, E_P2, K_P2, LOG_K_P2)


def make(kind, T, E, H, K, warps, bh, f64=True):
    e_p2, k_p2 = triton.next_power_of_2(E), triton.next_power_of_2(K)
    common = dict(K=K, E_P2=e_p2, K_P2=k_p2, LOG_K_P2=k_p2.bit_length() - 1, num_warps=warps)

    def run(x, w, b, st):
        if kind == "cublas+route":
            lg = F.linear(x, w, b)
            tw, ti = route_gpt_oss(lg, K)
            return lg, tw, ti
        if kind == "mxkit":  # the shipped one-launch router
            return router_gpt_oss(x, w, b, K)
        lg, tw, ti = st["logits"], st["w"], st["ids"]
        if kind == "split_h":
            S = triton.cdiv(H, bh)
            _split_h_kernel[(T, S)](x, w, b, st["part"], lg.view(torch.int16), tw, ti, st["cnt"], E, H, S=S,
                                    S_P2=triton.next_power_of_2(S), BH=bh, F64=f64, **common)
        else:
            _single_kernel[(T,)](x, w, b, lg.view(torch.int16), tw, ti, E, H, BH=bh, **common)
        return lg, tw, ti
    return run


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    T = int(args[0]) if args else 1
    E = int(args[1]) if len(args) > 1 else 32
    H, K = 2880, 4
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(0), f"T={T} E={E} H={H} top-{K}, {LAYERS} routers in one graph")
    xs = [torch.randn(T, H, device=dev).to(torch.bfloat16) for _ in range(LAYERS)]
    ws = [(torch.randn(E, H, device=dev) * 0.02).to(torch.bfloat16) for _ in range(LAYERS)]
    bs = [(torch.randn(E, device=dev) * 0.1).to(torch.bfloat16) for _ in range(LAYERS)]
    variants = [("cublas+route", 4, 0, True), ("mxkit", 8, 0, True)]
    if "--all" in sys.argv:
        for warps in (4, 8):
            for bh in (128, 256):
                variants.append(("split_h", warps, bh, True))
        variants += [("split_h", 4, 128, False), ("split_h", 4, 64, True), ("single", 8, 64, True),
                     ("single", 16, 64, True)]
    rows = []
    for kind, warps, bh, f64 in variants:
        run = make(kind, T, E, H, K, warps, bh, f64)
        S = triton.cdiv(H, bh) if bh else 1
        e_p2 = triton.next_power_of_2(E)
        states = [dict(logits=torch.empty(T, E, dtype=torch.bfloat16, device=dev),
                       w=torch.empty(T, K, device=dev), ids=torch.empty(T, K, dtype=torch.int32, device=dev),
                       part=torch.empty(T * S * e_p2, dtype=torch.float64, device=dev),
                       cnt=torch.zeros(T, dtype=torch.int32, device=dev)) for _ in range(LAYERS)]
        outs = [run(xs[i], ws[i], bs[i], states[i]) for i in range(LAYERS)]
        torch.cuda.synchronize()
        bad = 0
        for i in range(LAYERS):
            ref = (xs[i].double() @ ws[i].double().T + bs[i].double()).float().to(torch.bfloat16)
            lg, tw, ti = outs[i]
            rw, ri = route_gpt_oss(ref, K)
            bad += int((lg.view(torch.int16) != ref.view(torch.int16)).sum())
            bad += 0 if kind == "cublas+route" else int((~torch.eq(ti, ri)).sum() + (~torch.eq(tw, rw)).sum())
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(LAYERS):
                run(xs[i], ws[i], bs[i], states[i])
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for i in range(LAYERS):
                run(xs[i], ws[i], bs[i], states[i])
        us = cuda_event_bench(g.replay, 10, 100, 0, "read") / LAYERS
        usw = cuda_event_bench(g.replay, 10, 100, 0, "write") / LAYERS
        name = f"{kind} warps={warps} BH={bh}{'' if f64 else ' fp32-partials'}"
        rows.append((name, us, usw, bad))
        print(f"{name:40s} {us:7.2f} us/layer (write flush {usw:6.2f})  logits off-reference bits/ids/w: {bad}",
              flush=True)


if __name__ == "__main__":
    main()
