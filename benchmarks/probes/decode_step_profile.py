"""Kernel time of one captured decode step of `mxkit bench decode` (batch 1, all layers) per format: torch
profiler over 10 graph replays, the kernels summed by name (the largest printed), optionally of the compiled
step (``--compiled``: the bench's ``compiled`` mode) and with lm_head in MXFP4 (``--quantize-head``).

    PYTHONPATH=src python3 benchmarks/probes/decode_step_profile.py bf16,mxfp4_e2m1+experts   # on the GPU
    PYTHONPATH=src python3 benchmarks/probes/decode_step_profile.py mxfp4_e2m1+fused --compiled --quantize-head \
        --model gpt-oss-20b --top 40
"""
import argparse
import collections

import torch
from mxkit.bench import decode as bd
from torch.profiler import profile, ProfilerActivity

p = argparse.ArgumentParser()
p.add_argument("formats")
p.add_argument("--model", default="gpt-oss-20b")
p.add_argument("--compiled", action="store_true")
p.add_argument("--quantize-head", action="store_true")
p.add_argument("--top", type=int, default=22)
args = p.parse_args()

for fmt in args.formats.split(","):
    m = bd.build_model(args.model)
    if fmt != "bf16":
        bd.quantize(m, fmt, args.quantize_head)
    dec = bd.Decoder(m, 1, 8, 32)
    with torch.no_grad():
        if args.compiled:
            dec.compile()
        g = dec.capture()
        dec.prefill()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        replay_ms = start.elapsed_time(end) / 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                g.replay()
            torch.cuda.synchronize()
    by = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name][0] += e.device_time / 10
            by[e.name][1] += 1
    tot = sum(v[0] for v in by.values())
    print(f"\n## {args.model} {fmt}{' compiled' if args.compiled else ''}"
          f"{' +head' if args.quantize_head else ''}: replay {replay_ms:.3f} ms, {tot / 1e3:.3f} ms of kernels "
          f"per step, {sum(v[1] for v in by.values()) // 10} kernels")
    for name, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{us:9.1f} us  {n // 10:4d}x  {us / max(1, n // 10):7.2f} us each  {name[:120]}")
    del m, dec, g
    torch.cuda.empty_cache()
