"""A/B of benchmarks/probes/w4_f8wgmma.cu (bf16 x MXFP4 at M = 1..4 on FP8 wgmma, the weight decoded to E4M3)
against production decode-mma: µs after a clean-L2 read flush, the relative error against the float64 product of
the dequantized operands (w16_case's bound), and the relative difference from production's output.

    nvcc -ptx -arch=sm_90a -O3 -o /tmp/w4f8.ptx benchmarks/probes/w4_f8wgmma.cu
    python3 benchmarks/probes/w4_f8wgmma_ab.py /tmp/w4f8.ptx 1x8192x8192,1x28672x8192 [REGEX]
"""
import ctypes
import os
import re
import sys

import torch
from _probe import DEV as dev, kernels, time_us, w16_case

from mxkit.kernels import cuda_driver
from mxkit.kernels.matmul_details import _mma_decode as md
from mxkit.kernels.matmul_table import mma_m8_loop

KS = kernels(sys.argv[1])
PICK = sys.argv[3] if len(sys.argv) > 3 else ""
SPLITS = [int(v) for v in os.environ.get("SPLITS", "1,2,4").split(",")]  # w4f8r's CTAs along K


def codes(qdata: torch.Tensor) -> torch.Tensor:
    """[N, K/2] E2M1 bytes (low nibble = even element) -> [N, K] codes"""
    return torch.stack((qdata & 15, qdata >> 4), -1).reshape(qdata.shape[0], -1)


def pack(qdata: torch.Tensor, scale: torch.Tensor):
    C = codes(qdata).long()
    N, K = C.shape
    S, P = N // 64, K // 64
    ar = lambda n: torch.arange(n, device=C.device)  # noqa: E731
    s_, p_, wi, g, t, j, e = torch.meshgrid(ar(S), ar(P), ar(4), ar(8), ar(4), ar(4), ar(4), indexing="ij")
    ra = 64 * s_ + 16 * wi + g
    col = 64 * p_ + 32 * (j // 2) + 16 * (j % 2) + 4 * t + e
    ca, cb = C[ra, col], C[ra + 8, col]
    bit = lambda c, i: (c >> i) & 1  # noqa: E731
    byte = (bit(ca, 3) << 7) | (bit(ca, 2) << 4) | (bit(ca, 1) << 3) | (bit(ca, 0) << 2)
    byte |= (bit(cb, 2) << 6) | (bit(cb, 1) << 5) | bit(cb, 0)
    byte |= torch.roll(bit(cb, 3), 1, dims=-1) << 1
    q = byte.to(torch.uint8).reshape(S, P, 128, 16).contiguous()
    sc = scale.long()
    s2, p2, wi2, g2 = torch.meshgrid(ar(S), ar(P), ar(4), ar(8), indexing="ij")
    ra2 = 64 * s2 + 16 * wi2 + g2
    wsc = sc[ra2, 2 * p2] | (sc[ra2, 2 * p2 + 1] << 8) | (sc[ra2 + 8, 2 * p2] << 16) | (sc[ra2 + 8, 2 * p2 + 1] << 24)
    return q, torch.where(wsc >= 2**31, wsc - 2**32, wsc).to(torch.int32).contiguous()


def smem_bytes(K: int, MP: int, WG: int) -> int:
    xs = -(-((K // 16) * 32 * MP + 128) // 128) * 128
    return max(xs + (K // 32) * 16, WG * 1024)


def ring_rows(name, k, x, q, s, M, N, K, MP, WG, err, bound, ref) -> list:
    """w4f8r (session 57) at S = 1, 2, 4 CTAs along K (S > 1: float32 y added into by atomicAdd, its zeroing not
    timed)"""
    rows = []
    for S in SPLITS:
        sm = smem_bytes((K // 64 // S + 1) * 64, MP, WG)
        cuda_driver._check(cuda_driver._libcuda().cuFuncSetAttribute(k.fn, 8, sm), "cuFuncSetAttribute")
        y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16) if S == 1 else \
            torch.zeros(M, N, device=dev)
        launch = k.bind((x, q, s, y, ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K), ctypes.c_longlong(K),
                         ctypes.c_longlong(N)))
        launch.shared = sm
        go = lambda: launch.launch(N // 64, S, 1, WG * 128)  # noqa: E731
        go()
        torch.cuda.synchronize()
        e = err(y)
        d = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        rows.append(f"  {name}_s{S}: {time_us(go):.1f} err {e:.2e} {'ok' if e <= bound else 'OVER'} vs prod {d:.1e}")
    return rows


def row(M: int, N: int, K: int) -> str:
    x, wq, b, wd, y64, bound = w16_case(M, N, K, "mxfp4")
    scale = wq.plain_scale()
    assert not ((scale == 0) | (scale == 255)).any()
    q, s = pack(wq.qdata, scale)
    prod = md.MmaDecode(b.mma_q, b.mma_s, N, K, M, torch.bfloat16, special=False, m8_loop=mma_m8_loop(dev, K, N, M))
    ref = prod(x, None)
    err = lambda y: ((y.double() - y64).norm() / y64.norm()).item()  # noqa: E731
    out = [f"{M}x{N}x{K}: prod {time_us(lambda: prod(x, None)):.1f} (err {err(ref):.2e}, bound {bound:.2e})"]
    MP = 1 if M == 1 else 2 if M == 2 else 4
    for name, k in KS.items():
        m = re.match(r"w4f8_m(\d+)_wg(\d+)_(?:u\d+|d(\d+))", name)
        r = re.match(r"w4f8r_m(\d+)_wg(\d+)_d(\d+)(?:_nox)?$", name)
        if r and int(r.group(1)) == MP and re.search(PICK, name):
            out += ring_rows(name, k, x, q, s, M, N, K, MP, int(r.group(2)), err, bound, ref)
        if not m or int(m.group(1)) != MP or not re.search(PICK, name):
            continue
        WG = int(m.group(2))
        sm = smem_bytes(K, MP, WG) + (WG * int(m.group(3)) * 128 * 20 if m.group(3) else 0)
        cuda_driver._check(cuda_driver._libcuda().cuFuncSetAttribute(k.fn, 8, sm), "cuFuncSetAttribute")
        y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        qq, ss = (q.transpose(0, 1).contiguous(), s.transpose(0, 1).contiguous()) if name.endswith("_pm") else (q, s)
        launch = k.bind((x, qq, ss, y, ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K), ctypes.c_longlong(K),
                         ctypes.c_longlong(N)))
        launch.shared = sm
        go = lambda: launch.launch(N // 64, 1, 1, WG * 128)  # noqa: E731
        go()
        torch.cuda.synchronize()
        e = err(y)
        d = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        out.append(f"  {name}: {time_us(go):.1f} err {e:.2e} {'ok' if e <= bound else 'OVER'} vs prod {d:.1e}")
    return "\n".join(out)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0), flush=True)
    for shp in sys.argv[2].split(","):
        print(row(*(int(v) for v in shp.split("x"))), flush=True)
        torch.cuda.empty_cache()
