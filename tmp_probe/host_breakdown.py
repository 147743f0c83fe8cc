import statistics, sys, time
sys.path.insert(0, "src")
import torch, mxkit
from mxkit.kernels import quantize as kq

dev = "cuda"
x = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)


def host(fn, n=2000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t0)
        if i % 64 == 63:
            torch.cuda.synchronize()
    return statistics.median(ts) / 1e3


a = kq.check_quantize_args(x, "mxfp4_e2m1", -1, 32, "floor", "rne") if hasattr(kq, "check_quantize_args") else None
plan = kq._quantize_plan(tuple(x.shape), x.dtype, "mxfp4_e2m1", 1, "floor", "rne", "plain", None, kq._gpu_name(x))
outs = kq._run_quantize(plan, x)
ptrs = [outs[i].view(torch.int32) if w else outs[i] for i, w in plan.slots]
xv = x.view(plan.in_view)
args = (xv, *ptrs, *plan.ints)
L = plan.launcher
L(plan.grid, args, plan.consts, plan.num_warps)
(k, full), = list(L.cache.values())[:1]
grid3 = (plan.grid + (1, 1))[:3]
runner = k[grid3]
rows = {
    "x * 2": lambda: x * 2,
    "torch.empty uint8 x1": lambda: torch.empty((256, 512), dtype=torch.uint8, device=dev),
    "mxkit.quantize": lambda: mxkit.quantize(x, "mxfp4"),
    "quantize_triton": lambda: kq.quantize_triton(x, "mxfp4"),
    "_quantize_impl": lambda: kq._quantize_impl(x, "mxfp4_e2m1", 1, "floor", "rne", "plain"),
    "_run_quantize(plan)": lambda: kq._run_quantize(plan, x),
    "_Launcher call": lambda: L(plan.grid, args, plan.consts, plan.num_warps),
    "k[grid](*args)": lambda: k[grid3](*args, *full),
    "runner(*args) (prebuilt)": lambda: runner(*args, *full),
    "mxkit.dequantize": (lambda q: lambda: mxkit.dequantize(q, torch.bfloat16))(mxkit.quantize(x, "mxfp4")),
    "mxkit.cast_transpose": lambda: mxkit.cast_transpose(x, "mxfp8"),
}
for name, fn in rows.items():
    print(f"{name:28s} {host(fn):6.1f} us")
print("metadata", {k_: v for k_, v in k.metadata._asdict().items() if k_ not in ("target",)} if hasattr(k.metadata, "_asdict") else k.metadata)
print("signature", getattr(k.src, "signature", None), "constants", getattr(k.src, "constants", None))
print("function", k.function, "n_regs", getattr(k, "n_regs", None), "shared", k.metadata.shared)
import inspect
print(inspect.getsource(type(k).__getitem__)[:1500])
print(inspect.getsource(type(k)._init_handles)[:2000] if hasattr(type(k), "_init_handles") else "")
