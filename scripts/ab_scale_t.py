"""Why `scale_t` cost 60-120 us per call at small shapes in the session-4 bench (open question, issue #3).

For columnwise / cast-transpose at 4096^2, 32768 x 160 and 8192^2 (bf16), with and without scale_t (the
production config otherwise), it prints three times per call:
  device  CUDA-event median with a 100 us GPU spin queued first (what the bench reports)
  e2e     triton.testing.do_bench median (host enqueue included when it is the longer side)
  host    wall time per call of 200 back-to-back calls without synchronising (the enqueue cost)
A host time above ~100 us would explain a device time that includes idle GPU waiting after the spin.

    PYTHONPATH=src python3 scripts/ab_scale_t.py            # GPU
    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/ab_scale_t.py --dry   # CPU: logic only, tiny shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from mxkit.bench.timing import cuda_event_bench
from mxkit.kernels import quantize as kq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.dry else "cuda"
    shapes = [(64, 64)] if args.dry else [(4096, 4096), (32768, 160), (8192, 8192)]
    print(f"{'op':<6} {'format':<11} {'shape':<11} {'scale_t':<7} {'device us':>9} {'e2e us':>8} {'host us':>8}")
    for R, C in shapes:
        x = torch.randn(R, C, device=dev).to(torch.bfloat16)
        for kind in ("cols", "ct"):
            for fmt in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"):
                base = kq.quantize_config(1, R, C, kind == "ct", True, fmt)
                outs = {}
                for st in (False, True):
                    cfg = dataclasses.replace(base, scale_t=st)
                    if kind == "cols":
                        fn = lambda cfg=cfg: kq._quantize_impl(x, fmt, 0, "floor", "rne", "plain", cfg)  # noqa: E731
                    else:
                        fn = lambda cfg=cfg: kq._cast_transpose_impl(x, fmt, "floor", "rne", "plain", cfg)  # noqa: E731
                    outs[st] = fn()
                    if args.dry:
                        d = e = h = float("nan")
                    else:
                        import triton.testing as tt

                        d = cuda_event_bench(fn, 10.0, 50.0, spin_us=100.0)
                        e = tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(200):
                            fn()
                        h = (time.perf_counter() - t0) / 200 * 1e6
                        torch.cuda.synchronize()
                    print(f"{kind:<6} {fmt:<11} {f'{R}x{C}':<11} {str(st):<7} {d:>9.1f} {e:>8.1f} {h:>8.1f}", flush=True)
                same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                           for a, b in zip(outs[False], outs[True]))
                assert same, f"{kind} {fmt} {R}x{C}: scale_t changed the bytes"


if __name__ == "__main__":
    main()
