import statistics, sys, time
sys.path.insert(0, "src")
import torch, mxkit
from mxkit.kernels import quantize as kq

dev = "cuda"
x = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)


def host(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t0)
        if i % 64 == 63:
            torch.cuda.synchronize()
    return statistics.median(ts) / 1e3

mxkit.cast_transpose(x, "mxfp8"); mxkit.cast_transpose(x, "mxfp8")
for (key, d), (margs, plan) in kq._HOT.items():
    print("HOT", key[:4], "bound", plan.bound, "launcher", plan.launcher.name, "scale_t", plan.scale_t)
hotkey = [k for k in kq._HOT if isinstance(k[0][3], tuple)][0]
margs, plan = kq._HOT[hotkey]
rows = {
    "x * 2": lambda: x * 2,
    "torch.empty x1": lambda: torch.empty((256, 1024), dtype=torch.uint8, device=dev),
    "mxkit.quantize mxfp8": lambda: mxkit.quantize(x, "mxfp8"),
    "mxkit.cast_transpose": lambda: mxkit.cast_transpose(x, "mxfp8"),
    "quantize_triton axis=(1,0)": lambda: kq.quantize_triton(x, "mxfp8", axis=(1, 0)),
    "_run_quantize(ct plan)": lambda: kq._run_quantize(plan, x),
    "_hot_call": lambda: kq._hot_call((margs, plan), x, 32, "plain"),
    "mxkit.dequantize": (lambda q: lambda: mxkit.dequantize(q, torch.bfloat16))(mxkit.quantize(x, "mxfp4")),
}
for name, fn in rows.items():
    print(f"{name:28s} {host(fn):6.1f} us", flush=True)
# bytes check of the bound path
from mxkit.reference import quantize_reference
r, c = mxkit.cast_transpose(x, "mxfp8")
xr = x.cpu()
rr, cr = quantize_reference(xr, "mxfp8", axis=1), quantize_reference(xr, "mxfp8", axis=0)
print("ct bytes ok", torch.equal(r.qdata.cpu(), rr.qdata), torch.equal(r.scale.cpu(), rr.scale),
      torch.equal(c.qdata.cpu(), cr.qdata), torch.equal(c.scale.cpu(), cr.scale))
# scale_t shape: 8192x8192
xb = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
for fmt in ("mxfp8", "mxfp6_e2m3"):
    for _ in range(3):
        r, c = mxkit.cast_transpose(xb, fmt)
    ks = [k for k in kq._HOT if k[0][0] == (8192, 8192) and isinstance(k[0][3], tuple) and k[0][2] == fmt]
    pl = kq._HOT[ks[0]][1]
    rr, cr = quantize_reference(xb.cpu(), fmt, axis=1), quantize_reference(xb.cpu(), fmt, axis=0)
    print(fmt, "8192^2 scale_t", pl.scale_t is not None, "bound", pl.bound, "bytes ok",
          torch.equal(r.qdata.cpu(), rr.qdata), torch.equal(r.scale.cpu(), rr.scale),
          torch.equal(c.qdata.cpu(), cr.qdata), torch.equal(c.scale.cpu(), cr.scale), flush=True)
    print(f"  host {fmt} 8192^2 cast_transpose {host(lambda: mxkit.cast_transpose(xb, fmt), 200):.1f} us")
