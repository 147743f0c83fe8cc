"""A/B: x staged in shared memory (xs1) for the dense decode-mma kernel at M = 1 (session 28)."""
import ctypes, re, sys
sys.path.insert(0, "benchmarks/probes")
import torch
from _probe import DEV as dev, kernels, split_buffers, time_us as t
import mxkit
from mxkit.kernels.cuda_driver import _libcuda
from mxkit.kernels.matmul_details import _mma_decode as md

SMS = torch.cuda.get_device_properties(0).multi_processor_count
names = kernels(sys.argv[1])
set_attr = _libcuda()["cuFuncSetAttribute"]
set_attr.restype = ctypes.c_int
set_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
for k in names.values():
    print(k.name, "attr rc", set_attr(k.fn.value, 8, 64 * 1024))  # MAX_DYNAMIC_SHARED_SIZE_BYTES


def dense(M, N, K):
    w = mxkit.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, "mxfp4")
    b = mxkit.pack_weight(w)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    prod = md.MmaDecode(b.mma_q, b.mma_s, N, K, M, torch.bfloat16, special=False)
    ref = prod(x, None)
    row = {"prod": f"{t(lambda: prod(x, None)):.1f}"}
    for n, k in names.items():
        W = int(re.search(r"_w(\d+)", n).group(1))
        groups, strips = 1, N // 16
        split = md.split_k(groups * strips, K, 8, SMS)
        ws, cnt = split_buffers(groups * strips, split, 128)
        y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        launch = k.bind((x, b.mma_q, b.mma_s, None, y, ws, cnt, ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K),
                         ctypes.c_longlong(K), ctypes.c_longlong(N)))
        go = lambda: launch.launch(groups, strips, split, 32 * W)  # noqa: E731
        go()
        torch.cuda.synchronize()
        ok = torch.equal(y, ref)
        close = bool(((y.float() - ref.float()).norm() <= 1e-2 * ref.float().norm()).item())
        row[n[len("m8_bf16_"):]] = f"{t(go):.1f}" + ("" if ok else (" ≈" if close else " WRONG"))
    return row


print(torch.cuda.get_device_name(0))
rows = {f"{M}x{N}x{K}": dense(M, N, K) for M, N, K in [
    (1, 4096, 4096), (1, 6144, 4096), (1, 28672, 4096), (1, 4096, 14336), (1, 8192, 8192), (1, 28672, 8192),
    (1, 5120, 2880), (1, 2880, 4096)]}
cols = list(next(iter(rows.values())))
print("| case | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for c, r in rows.items():
    print(f"| {c} | " + " | ".join(r.values()) + " |")
