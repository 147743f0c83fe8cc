import collections, sys, torch, mxkit
from mxkit.bench.decode import build_model, Decoder
torch.manual_seed(0)
for fmt in sys.argv[1].split(","):
    model = build_model("llama-3-8b", device="cuda")
    if fmt != "bf16":
        mxkit.quantize_model(model, "mxfp4_e2m1", skip="lm_head", compute_qsnr=False, progress=False, fuse=True)
    with torch.no_grad():
        dec = Decoder(model, 1, 8, 40)
        dec.compile()
        g = dec.capture()
        for _ in range(5): g.replay()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20): g.replay()
        e.record(); torch.cuda.synchronize()
        print(f"{fmt}: replay {s.elapsed_time(e) / 20 * 1e3:.0f} us")
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10): g.replay()
            torch.cuda.synchronize()
    tot = collections.Counter(); cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            k = ev.name[:90]
            tot[k] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            cnt[k] += 1
    all_us = sum(tot.values()) / 10
    print(f"{fmt} compiled: kernel time per step {all_us:.0f} us, {sum(cnt.values()) // 10} kernels")
    for k, v in tot.most_common(16):
        print(f"{v / 10:9.1f} us  {cnt[k] // 10:4d}/step  {v / cnt[k]:7.2f} us each  {k}")
    del model, dec, g
    torch.cuda.empty_cache()
