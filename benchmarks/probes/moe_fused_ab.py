"""A/B of the MoE decode path at 1-2 tokens (the pairs path, no sort): the two launches (gate_up + SwiGLU, then
down with its combine) against the one-launch kernel (`_mma_decode.pairs_fused`: blocks take gate_up strips, then
down strips, by a ticket counter; a down block copies its weight strip into shared memory while it waits for h). GPT-OSS experts (H = I = 2880, top-4, uniform
random routing), each variant captured in a CUDA graph, median µs after a clean-L2 read flush; every fused output
checked byte for byte against the two launches'.

    python benchmarks/probes/moe_fused_ab.py [E] [T,T,...]"""
import sys

import torch
from _probe import time_us

import mxkit
from mxkit.kernels.matmul_details import _mma_decode as md
from mxkit.kernels.moe import pack_experts_mma
from mxkit.kernels.moe_details._decode import _mma_biases

E = int(sys.argv[1]) if len(sys.argv) > 1 else 128
TOKENS = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1,2").split(",")]
H = I = 2880
K_TOP = 4
ACT = "swiglu_gpt_oss"
dev = torch.device("cuda")


def experts(N, K):
    parts = [mxkit.quantize((torch.randn(8, N, K, device=dev) * 0.05).to(torch.bfloat16), "mxfp4") for _ in range(E // 8)]
    import dataclasses

    return dataclasses.replace(parts[0], qdata=torch.cat([p.qdata for p in parts]),
                               scale=torch.cat([p.scale for p in parts]), shape=(E, N, K))


def graph(fn):
    g = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def main():
    p1, p2 = pack_experts_mma(experts(2 * I, H)), pack_experts_mma(experts(H, I))
    b1, b2 = _mma_biases(torch.randn(E, 2 * I, device=dev), torch.randn(E, H, device=dev), p1, I, H)
    print(torch.cuda.get_device_name(0), f"E={E} H={H} I={I} top-{K_TOP}; µs after the read flush, CUDA graph")
    print("| tokens | two launches | gate_up alone | down alone | " + "one launch |")
    for T in TOKENS:
        n = T * K_TOP
        x = torch.randn(T, H, device=dev).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=dev)[:K_TOP] for _ in range(T)]).reshape(-1)
        rw = torch.softmax(torch.randn(T, K_TOP, device=dev), -1).reshape(-1).contiguous()
        h = torch.empty(n, I, device=dev, dtype=torch.bfloat16)
        ws = torch.empty(n, H, device=dev)

        def gate_up():
            return md.pairs_mma(x, p1.q, p1.s, p1.special, 2 * I, H, ids, K_TOP, E, bias=b1, activation=ACT, rw=None,
                                out=h)

        def down():
            out = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            return md.pairs_mma(h, p2.q, p2.s, p2.special, H, I, ids, K_TOP, E, bias=b2, activation=None, rw=rw,
                                out=out, ws=ws)

        def two():
            gate_up()
            return down()

        cells = []
        g2, want = graph(two)
        cells.append(time_us(g2.replay))
        cells.append(time_us(graph(gate_up)[0].replay))
        cells.append(time_us(graph(down)[0].replay))
        g2.replay()
        torch.cuda.synchronize()

        def fused():
            out = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            return md.pairs_fused(x, (p1.q, p1.s), (p2.q, p2.s), p1.special or p2.special, H, I, ids, K_TOP, E,
                                  bias1=b1, bias2=b2, activation=ACT, rw=rw, h=h, ws=ws, out=out)
        gf, got = graph(fused)
        gf.replay()
        torch.cuda.synchronize()
        ok = torch.equal(got.view(torch.int16), want.view(torch.int16))
        cells.append(f"{time_us(gf.replay):.1f}{'' if ok else ' (BYTES DIFFER)'}")
        print(f"| {T} | " + " | ".join(c if isinstance(c, str) else f"{c:.1f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
