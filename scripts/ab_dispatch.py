"""A/B in one process: eager quantize through the torch custom op vs the direct launcher (same kernel).

Interleaves the two paths several times per shape so clock / machine effects hit both alike.
Usage (GPU): PYTHONPATH=src python3 scripts/ab_dispatch.py
"""

import statistics

import torch
import triton.testing as tt

import mxkit.kernels.quantize as Q

CASES = [("mxfp8_e4m3", (8192, 8192)), ("mxfp4", (8192, 8192)), ("mxfp8_e4m3", (4096, 4096)),
         ("mxfp4", (4096, 4096)), ("mxfp8_e4m3", (32768, 160)), ("mxfp4", (32768, 160)), ("mxfp4", (256, 4096))]


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(0))
    print(f"{'format':<12} {'shape':<12} {'op path us':>11} {'direct us':>10}  rounds")
    for fmt, shape in CASES:
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        f = Q.get_format(fmt)

        def op():
            return torch.ops.mxkit.quantize_mx(x, f.name, 1, "floor", "rne", "plain")

        def direct():
            return Q._quantize_impl(x, f.name, 1, "floor", "rne", "plain")

        a, b = op(), direct()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        ta, tb = [], []
        for _ in range(5):
            ta.append(tt.do_bench(op, warmup=50, rep=100, return_mode="median") * 1e3)
            tb.append(tt.do_bench(direct, warmup=50, rep=100, return_mode="median") * 1e3)
        print(f"{fmt:<12} {'x'.join(map(str, shape)):<12} {statistics.median(ta):>11.1f} "
              f"{statistics.median(tb):>10.1f}  op {[round(t) for t in ta]} direct {[round(t) for t in tb]}")


if __name__ == "__main__":
    main()
