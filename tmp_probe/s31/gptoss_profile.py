"""Kernel time of one captured GPT-OSS-20B decode step (batch 1), bf16 (HF grouped_mm) and MXFP4 experts."""
import sys, collections, torch
sys.path.insert(0, "src")
from mxkit.bench import decode as bd
from torch.profiler import profile, ProfilerActivity

for fmt in sys.argv[1].split(","):
    m = bd.build_model("gpt-oss-20b")
    if fmt != "bf16":
        bd.quantize(m, fmt)
    dec = bd.Decoder(m, 1, 8, 32)
    with torch.no_grad():
        g = dec.capture()
        dec.prefill()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
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
    print(f"\n## {fmt}: {tot/1e3:.3f} ms of kernels per step, {sum(v[1] for v in by.values())//10} kernels")
    for name, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:22]:
        print(f"{us:9.1f} us  {n//10:4d}x  {name[:110]}")
    del m, dec, g
    torch.cuda.empty_cache()
