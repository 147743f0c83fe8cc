import collections, torch, mxkit
from mxkit.bench.decode import build_model, Decoder
torch.manual_seed(0)
for fuse in (True,):
    model = build_model("llama-3-8b", device="cuda")
    mxkit.quantize_model(model, "mxfp4_e2m1", skip="lm_head", compute_qsnr=False, progress=False, fuse=fuse)
    with torch.no_grad():
        dec = Decoder(model, 1, 8, 40)
        g = dec.capture()
        for _ in range(5): g.replay()
        torch.cuda.synchronize()
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10): g.replay()
            torch.cuda.synchronize()
    tot = collections.Counter(); cnt = collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            k = e.name[:90]
            tot[k] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            cnt[k] += 1
    all_us = sum(tot.values()) / 10
    print(f"fuse={fuse}: kernel time per step {all_us:.0f} us")
    for k, v in tot.most_common(25):
        print(f"{v / 10:9.1f} us  {cnt[k] // 10:4d}/step  {v / cnt[k]:7.2f} us each  {k}")
