"""Where an eager call's host time goes: host µs of the public calls of ``mxkit bench overhead`` and of the pieces
their hot paths are made of (allocations, views, the bound launch, MXTensor construction), on the device host.

    PYTHONPATH=src python benchmarks/probes/host_breakdown.py [--calls 3000] [--rounds 6]

Same clock as the benchmark (``perf_counter_ns`` around each call alone, a sync every 64 calls outside the timed
windows); the median per call over interleaved rounds, and that median over ``x * 2``'s in the same round.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import mxkit
from mxkit.bench.overhead import host_times_ns
from mxkit.kernels import quantize as kq
from mxkit.kernels import matmul_calls as kc
from mxkit.nn import MXLinear
from mxkit.tensor import MXTensor


def cases(dev: str, small: bool = False) -> list[tuple[str, object]]:
    from mxkit.kernels import fast_call

    print("C++ fast call:", fast_call.module(wait=True))
    x = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)
    u8 = torch.uint8
    q8 = mxkit.quantize(x, "mxfp8_e4m3")
    q4 = mxkit.quantize(x, "mxfp4_e2m1")
    ct = mxkit.cast_transpose(x, "mxfp8_e4m3")
    for _ in range(2):  # (the fast calls are made at the second call of a problem)
        mxkit.quantize(x, "mxfp8_e4m3"), mxkit.quantize(x, "mxfp4_e2m1"), mxkit.cast_transpose(x, "mxfp8_e4m3")
    key = (tuple(x.shape), x.dtype, "mxfp8_e4m3", -1, 32, mxkit.ScaleMode.FLOOR, mxkit.Rounding.RNE, "plain")
    margs, plan = kq._HOT[(key, 0)]
    ckey = (tuple(x.shape), x.dtype, "mxfp8_e4m3", (1, 0), 32, mxkit.ScaleMode.FLOOR, mxkit.Rounding.RNE, "plain")
    cmargs, cplan = kq._HOT[(ckey, 0)]
    qo, so = torch.empty_like(q8.qdata), torch.empty_like(q8.scale)
    bkey = (0, True, True)
    bound = plan.bound[bkey]
    sizes = [256 * 1024, 256 * 32]
    a = q8.fmt
    lin = MXLinear.from_linear(torch.nn.Linear(1024, 1024, bias=False, device=dev, dtype=torch.bfloat16),
                               "mxfp4_e2m1").requires_grad_(False)
    x1 = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
    lin(x1)
    packed = lin._packed
    call = kc.prepared_call(x1, packed, x1.dtype, None)
    out1 = torch.empty(1, 1024, device=dev, dtype=torch.bfloat16)
    from mxkit.kernels.cuda_driver import _raw_stream

    mk = MXTensor._trusted_maker(a, 1, 32, x.shape, q8.scale_mode, q8.rounding, "plain")

    got = [
        ("x * 2", lambda: x * 2),
        ("torch.empty (256,1024) u8", lambda: torch.empty((256, 1024), dtype=u8, device=dev)),
        ("torch.empty (256,32) u8", lambda: torch.empty((256, 32), dtype=u8, device=dev)),
        ("x.new_empty (256,1024) u8", lambda: x.new_empty((256, 1024), dtype=u8)),
        ("torch.empty flat + split + 2 views", lambda: [t.view(s) for t, s in zip(
            torch.empty(sum(sizes), dtype=u8, device=dev).split(sizes), ((256, 1024), (256, 32)))]),
        ("torch.empty flat + 2 slices/views", lambda: (lambda b: (b[:262144].view(256, 1024), b[262144:].view(256, 32)))(
            torch.empty(sum(sizes), dtype=u8, device=dev))),
        ("x.contiguous()", lambda: x.contiguous()),
        ("x.data_ptr()", lambda: x.data_ptr()),
        ("x.get_device()", lambda: x.get_device()),
        ("x.device", lambda: x.device),
        ("x.shape tuple", lambda: tuple(x.shape)),
        ("is_compiling", lambda: torch.compiler.is_compiling()),
        ("raw stream", lambda: _raw_stream(0)),
        ("_HOT.get(key)", lambda: kq._HOT.get(((tuple(x.shape), x.dtype, "mxfp8_e4m3", -1, 32, mxkit.ScaleMode.FLOOR,
                                                mxkit.Rounding.RNE, "plain"), 0))),
        ("bound.run(x, q, s)", lambda: bound.run(x, qo, so)),
        ("MXTensor._trusted", lambda: MXTensor._trusted(qo, so, a, 1, 32, x.shape, q8.scale_mode, q8.rounding,
                                                        "plain")),
        ("_run_quantize(plan, x)", lambda: kq._run_quantize(plan, x)),
        ("hot.run(x) quantize", lambda: kq._HOT[(key, 0)].run(x)),
        ("plan.fast[key](x)", lambda: plan.fast[bkey](x)) if plan.fast.get(bkey) else ("(no fast call)", lambda: None),
        ("quantize_triton mxfp8", lambda: kq.quantize_triton(x, "mxfp8_e4m3")),
        ("mxkit.quantize mxfp8", lambda: mxkit.quantize(x, "mxfp8_e4m3")),
        ("mxkit.quantize mxfp4", lambda: mxkit.quantize(x, "mxfp4_e2m1")),
        ("_run_quantize(ct plan, x)", lambda: kq._run_quantize(cplan, x)),
        ("ct plan.fast[key](x)", lambda: cplan.fast[bkey](x)) if cplan.fast.get(bkey) else ("(no ct fast call)",
                                                                                           lambda: None),
        ("ct hot.run(x)", lambda: kq._HOT[(ckey, 0)].run(x)),
        ("ct quantize_hot(...)", lambda: kq.quantize_hot(x, "mxfp8_e4m3", (1, 0), 32, mxkit.ScaleMode.FLOOR,
                                                         mxkit.Rounding.RNE, "plain")),
        ("2 MXTensor makers", lambda: (mk(qo, so), mk(qo, so))),
        ("mxkit.cast_transpose mxfp8", lambda: mxkit.cast_transpose(x, "mxfp8_e4m3")),
        ("mxkit.dequantize mxfp4", lambda: mxkit.dequantize(q4, torch.bfloat16)),
        ("prepared_call lookup", lambda: kc.prepared_call(x1, packed, x1.dtype, None)),
        ("call(x, None)", lambda: call(x1, None)),
        ("mxkit.matmul(x, packed)", lambda: mxkit.matmul(x1, packed)),
        ("lin.forward(x)", lambda: lin.forward(x1)),
        ("lin(x)", lambda: lin(x1)),
    ]
    if hasattr(call, "_into"):
        got.append(("decode call._into (preallocated)", lambda: call._into(x1, 1024, None, out1)))
    del ct
    return got if small else got + wgmma_cases(dev)


def wgmma_cases(dev: str) -> list[tuple[str, object]]:
    """The prefill-size W4A16 call (w4a16-wgmma, 8192 x 8192; M = 64: split-K 2, two launches; M = 2048: one) and
    its pieces: the matmul, WgmmaCall, the prepared problem's run_dense, its C++ fast calls alone."""
    from mxkit.kernels.matmul_details._cublas import exact_cublas

    got = []
    # the dense-exact path at M = 256 on 1024 x 1024 (bench overhead's row): dequantize, then cuBLAS
    pw1 = mxkit.pack_weight(mxkit.quantize(torch.randn(1024, 1024, device=dev).to(torch.bfloat16), "mxfp4_e2m1"))
    x1 = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)
    for _ in range(4):
        mxkit.matmul(x1, pw1)
    call1 = next(c for k, c in pw1._calls.items() if k[0] == x1.shape)
    if isinstance(call1, kc.DenseExactCall) and call1.deq is not None:
        w1 = call1.w
        wb = call1.deq(w1.qdata, w1.scale)

        def ctx():
            with exact_cublas():
                pass

        def mm_exact():
            with exact_cublas():
                return x1 @ wb.t()

        got += [("M=256 1024^2: mxkit.matmul", lambda: mxkit.matmul(x1, pw1)),
                ("M=256 1024^2: DenseExactCall(x, None)", lambda: call1(x1, None)),
                ("M=256 1024^2: dequantize fast call", lambda: call1.deq(w1.qdata, w1.scale)),
                ("M=256 1024^2: exact_cublas() enter+exit", ctx),
                ("M=256 1024^2: x @ wb.t()", lambda: x1 @ wb.t()),
                ("M=256 1024^2: exact_cublas + x @ wb.t()", mm_exact),
                ("M=256 1024^2: torch.mm(x, wb.t())", lambda: torch.mm(x1, wb.t()))]
    else:
        got.append((f"M=256 1024^2: ({type(call1).__name__}, no fast call)", lambda: None))
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(8192, 8192, device=dev).to(torch.bfloat16) * 2.0**-4,
                                          "mxfp4_e2m1"))
    for M in (64, 2048):
        x = torch.randn(M, 8192, device=dev, dtype=torch.bfloat16)
        for _ in range(4):
            mxkit.matmul(x, pw)
        call = next(c for k, c in pw._calls.items() if k[0] == x.shape)
        prep = getattr(call, "prep", None)
        if not (isinstance(call, kc.WgmmaCall) and prep is not None):
            got.append((f"M={M}: (not a prepared wgmma call: {type(call).__name__})", lambda: None))
            continue
        q, st = call.q, call.st
        part = prep.plan(x, q, st)
        got += [(f"M={M}: mxkit.matmul(x, pw)", lambda x=x: mxkit.matmul(x, pw)),
                (f"M={M}: prepared_call lookup", lambda x=x: kc.prepared_call(x, pw, None, None)),
                (f"M={M}: WgmmaCall(x, None)", lambda x=x, call=call: call(x, None)),
                (f"M={M}: WgmmaCall._settings()", lambda call=call: call._settings()),
                (f"M={M}: prep.run_dense(x, q, st)", lambda x=x, p=prep, q=q, st=st: p.run_dense(x, q, st)),
                (f"M={M}: prep.plan(x, q, st)", lambda x=x, p=prep, q=q, st=st: p.plan(x, q, st))]
        if prep.split > 1:
            got.append((f"M={M}: prep.sum_plan(part)", lambda p=prep, part=part: p.sum_plan(part)))
    return got


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--small", action="store_true", help="the eager decode-size calls only (no prefill-size cases)")
    args = p.parse_args()
    todo = cases("cuda", args.small)
    per = args.calls // args.rounds
    med = {n: [] for n, _ in todo}
    for r in range(args.rounds):
        for n, fn in todo:
            med[n].append(statistics.median(host_times_ns(fn, per, warmup=50 if r == 0 else 5)) / 1e3)
    base = med["x * 2"]
    print(f"{'call':40s} {'host us':>8s} {'x x*2':>6s}")
    for n, _ in todo:
        m = statistics.median(med[n])
        ratio = statistics.median(a / b for a, b in zip(med[n], base))
        print(f"{n:40s} {m:8.2f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
