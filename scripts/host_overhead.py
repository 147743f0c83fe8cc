"""Host (CPU) time per call of the quantize entry points, layer by layer (issue #3: at 4096^2 and 32768 x 160
the bench timed 60-120 us more per call with scale_t, whose kernels take ~1 us more on the device).

For each case it prints the wall time per call of N back-to-back calls without synchronising (the GPU is not
the limit as long as it is faster than the host), for:
  public   mxkit.quantize / mxkit.cast_transpose (argument checks, MXTensor built), and the same with the
           direct launch off (kernels.quantize._FAST_LAUNCH = False: Triton's JITFunction launch)
  impl     kernels.quantize._quantize_impl / _cast_transpose_impl (allocation + launches)
  launch   the captured Triton launch(es) alone, same arguments
  empty    the torch.empty allocations alone
then a cProfile of the public call (top functions by own time).

    PYTHONPATH=src python3 scripts/host_overhead.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

import mxkit
from mxkit.kernels import _quantize as K
from mxkit.kernels import quantize as kq


def per_call(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def captured_launches(fn):
    """The (kernel, grid, args, kwargs) of every Triton launch fn makes."""
    calls = []
    names = ("_quantize_kernel", "_cast_transpose_split_kernel", "_transpose_bytes_kernel")
    real = {nm: getattr(K, nm) for nm in names}

    class Cap:
        def __init__(self, nm):
            self.nm = nm

        def __getitem__(self, grid):
            def call(*a, **kw):
                calls.append((real[self.nm], grid, a, kw))
                return real[self.nm][grid](*a, **kw)
            return call

    for nm in names:
        setattr(K, nm, Cap(nm))
    try:
        fn()
    finally:
        for nm in names:
            setattr(K, nm, real[nm])
    return calls


def main():
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {__import__('triton').__version__}")
    rows = []
    prof_case = None
    fast_default = kq._FAST_LAUNCH
    for R, C in ((4096, 4096), (32768, 160)):
        x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
        for kind, fmt in (("rows", "mxfp8_e4m3"), ("cols", "mxfp4_e2m1"), ("ct", "mxfp4_e2m1"), ("ct", "mxfp8_e4m3")):
            if kind == "rows":
                pub = lambda: mxkit.quantize(x, fmt, axis=-1)  # noqa: E731
                imp = lambda: kq._quantize_impl(x, fmt, -1, "floor", "rne", "plain")  # noqa: E731
                n_out = 2
            elif kind == "cols":
                pub = lambda: mxkit.quantize(x, fmt, axis=0)  # noqa: E731
                imp = lambda: kq._quantize_impl(x, fmt, 0, "floor", "rne", "plain")  # noqa: E731
                n_out = 2
            else:
                pub = lambda: mxkit.cast_transpose(x, fmt)  # noqa: E731
                imp = lambda: kq._cast_transpose_impl(x, fmt, "floor", "rne", "plain")  # noqa: E731
                n_out = 4
            calls = captured_launches(imp)

            def launch():
                for kern, grid, a, kw in calls:
                    kern[grid](*a, **kw)

            def empty():
                for _ in range(n_out + (1 if len(calls) > 1 else 0)):
                    torch.empty(1 << 20, dtype=torch.uint8, device="cuda")

            kq._FAST_LAUNCH = False
            slow = per_call(pub)
            kq._FAST_LAUNCH = fast_default
            r = (kind, fmt, f"{R}x{C}", len(calls), per_call(pub), slow, per_call(imp), per_call(launch),
                 per_call(empty))
            rows.append(r)
            print(*r, flush=True)
            if prof_case is None and kind == "ct":
                prof_case = pub
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        prof_case()
    pr.disable()
    torch.cuda.synchronize()
    sio = io.StringIO()
    pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(25)
    print(sio.getvalue())
    print(f"# host us per call; public: mxkit API (direct launch {'on' if fast_default else 'off'}), public jit: "
          "through Triton's JITFunction launch, impl: _quantize_impl, launch: the Triton launch(es) alone "
          "(JITFunction), empty: the output allocations")
    print(f"{'op':<5} {'format':<11} {'shape':<10} {'launches':>8} {'public':>7} {'pub jit':>7} {'impl':>7} "
          f"{'launch':>7} {'empty':>6}")
    for r in rows:
        print(f"{r[0]:<5} {r[1]:<11} {r[2]:<10} {r[3]:>8} {r[4]:>7.1f} {r[5]:>7.1f} {r[6]:>7.1f} {r[7]:>7.1f} "
              f"{r[8]:>6.1f}")


if __name__ == "__main__":
    main()
