"""Which L2 partition holds which address, seen from each SM (session 9 probe; GPU only).

Nsight puts every quantize kernel at the limit of the fabric between the H200's two L2 partitions
(lts__ltcfabric2ltc_cycles_active 87-88%, benchmarks/h200-2026-11-22-s9/ncu_l2_breakdown.txt). A kernel whose
programs touched only addresses homed in their own SM's partition would not cross it. This probe measures
whether that is possible: one single-warp program per SM slot times a chain of DEPTH dependent L2-hit loads
(ld.global.cg) to each CHUNK-byte chunk of an L2-resident buffer, so every (SM, chunk) pair gets a latency;
the SMs split into two groups by those latencies, and each chunk is "near" for one group. Prints the split, the
latency gap and the granularity of the address -> partition map (runs of consecutive chunks, and which
address bits predict it).

    PYTHONPATH=src python3 scripts/probe_l2_partition.py [--chunk 256] [--mib 8]
"""

import argparse

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _clock(v):
    # (v is an input only so the asm has a tensor to take its shape from; ptxas keeps clock reads in program
    # order, and the chain's loads are serialised through their addresses)
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [v], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _probe_kernel(buf_ptr, lat_ptr, sm_ptr, zero, n_chunks, CHUNK_WORDS: tl.constexpr, DEPTH: tl.constexpr):
    pid = tl.program_id(0)
    one = tl.full([1], 0, tl.int32)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [one], dtype=tl.int32, is_pure=False, pack=1)
    v = one + zero
    acc = one
    for i in range(n_chunks):
        p = buf_ptr + i * CHUNK_WORDS
        t0 = _clock(v)
        for _ in tl.static_range(DEPTH):
            v = tl.load(p + (v & zero), cache_modifier=".cg")
        t1 = _clock(v)
        acc += v
        tl.store(lat_ptr + pid * n_chunks + i + tl.arange(0, 1), t1 - t0)
    tl.store(sm_ptr + pid + tl.arange(0, 1), sm + acc)  # (acc is 0: keeps the loads alive)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=256, help="bytes between probed addresses (default 256)")
    ap.add_argument("--mib", type=int, default=4, help="probed span, MiB (default 4: L2-resident)")
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--out", default=None, help="write latencies / SM ids as .npy here")
    args = ap.parse_args()
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    words = args.mib * 2**20 // 4
    buf = torch.zeros(words, dtype=torch.int32, device="cuda")
    n_chunks = args.mib * 2**20 // args.chunk
    progs = 2 * n_sm
    lat = torch.empty(progs, n_chunks, dtype=torch.int64, device="cuda")
    sm = torch.full((progs,), -1, dtype=torch.int32, device="cuda")
    for _ in range(2):  # the second run times L2 hits (the first brought the buffer in)
        buf.sum()
        _probe_kernel[(progs,)](buf, lat, sm, 0, n_chunks, CHUNK_WORDS=args.chunk // 4, DEPTH=args.depth,
                                num_warps=1)
        torch.cuda.synchronize()
    L = lat.cpu().numpy().astype(np.float64) / args.depth  # cycles per load
    S = sm.cpu().numpy()
    print(f"# {torch.cuda.get_device_name()}  {progs} programs on {len(set(S.tolist()))} SMs, {n_chunks} chunks of "
          f"{args.chunk} B, {args.depth} dependent loads each")
    print(f"cycles per L2-hit load: min {L.min():.0f}  median {np.median(L):.0f}  max {L.max():.0f}")
    # two SM groups: split on the first principal direction of the centred latency rows
    Z = L - L.mean(axis=1, keepdims=True)
    u, s_, vt = np.linalg.svd(Z, full_matrices=False)
    grp = (u[:, 0] > 0).astype(int)
    near_a = L[grp == 0].mean(axis=0) < L[grp == 1].mean(axis=0)  # chunk near for group 0
    gap = np.abs(L[grp == 0].mean(axis=0) - L[grp == 1].mean(axis=0))
    print(f"SM groups: {np.bincount(grp).tolist()} programs; singular values {np.round(s_[:4], 0).tolist()}")
    print(f"latency gap between the groups per chunk: median {np.median(gap):.0f} cycles "
          f"(min {gap.min():.0f}); chunks near group 0: {near_a.mean():.3f}")
    sms0 = sorted(set(S[grp == 0].tolist()))
    print(f"group 0 SM ids: {sms0}")
    runs = np.diff(np.flatnonzero(np.diff(np.r_[-1, near_a.astype(int), -1]) != 0))
    print(f"runs of consecutive same-partition chunks: median {np.median(runs):.0f}, mean {runs.mean():.1f}, "
          f"max {runs.max()} (chunks of {args.chunk} B)")
    print("first 128 chunks (1 = near group 0):", "".join(str(int(b)) for b in near_a[:128]))
    addr = np.arange(n_chunks, dtype=np.int64) * args.chunk
    for bit in range(int(np.log2(args.chunk)), int(np.log2(args.mib * 2**20))):
        agree = ((addr >> bit) & 1 == near_a).mean()
        if abs(agree - 0.5) > 0.1:
            print(f"  address bit {bit}: agrees {agree:.2f}")
    if args.out:
        np.save(f"{args.out}/l2_probe_lat.npy", L.astype(np.float32))
        np.save(f"{args.out}/l2_probe_sm.npy", S)


if __name__ == "__main__":
    main()
