import sys, time
sys.path.insert(0, "src")
import torch
import mxkit
from mxkit.kernels import matmul as mm
from mxkit.kernels.matmul_details._mma_pack import pack_mma_fused
w = mxkit.quantize(torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16), "mxfp4")
for _ in range(3):
    mxkit.pack_weight(w, act="float")
torch.cuda.synchronize()
def t(name, f, n=20):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): r = f()
    torch.cuda.synchronize(); print(f"{name:40s} {(time.perf_counter()-t0)/n*1e6:8.1f} us", flush=True); return r
t("pack_weight(act=float)", lambda: mxkit.pack_weight(w, act="float"))
t("pack_mma_fused(stats)", lambda: pack_mma_fused(w.qdata, w.scale, stats=True))
t("pack_mma_fused(stats)+host_ints", lambda: mm._host_ints(pack_mma_fused(w.qdata, w.scale, stats=True)[2]))
t("pack_mma_fused(no stats)", lambda: pack_mma_fused(w.qdata, w.scale))
t("_plain", lambda: mm._plain(w))
t("_check_weight", lambda: mm._check_weight(w))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5): mxkit.pack_weight(w, act="float")
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14))
