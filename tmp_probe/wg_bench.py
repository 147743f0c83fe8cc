"""Device: mxkit.matmul W4A16 prefill (w4a16-wgmma vs dense-exact) against cuBLAS bf16, clean-L2 read flush."""
import os, sys, time
sys.path.insert(0, 'src')
import torch
import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.reference import dequantize_reference

torch.manual_seed(int(time.time()))
cfg = TimingConfig(warmup_ms=10, rep_ms=float(sys.argv[1]) if len(sys.argv) > 1 else 30)
shapes = [tuple(int(v) for v in s.split('x')) for s in sys.argv[2].split(',')]
print("shape | cuBLAS bf16 us | wgmma us (x cuBLAS) | dense-exact us (x) | path | err/bound")
for (M, N, K) in shapes:
    w = torch.randn(N, K, device='cuda') * 2.0 ** torch.randint(-7, 0, (N, 1), device='cuda')
    wq = mxkit.quantize(w.to(torch.bfloat16), 'mxfp4_e2m1')
    pw = mxkit.pack_weight(wq)
    x = torch.randn(M, K, device='cuda').to(torch.bfloat16)
    wd = dequantize_reference(wq, torch.bfloat16)
    t_cub = time_us(lambda: x @ wd.T, cfg)
    plan = mxkit.gemm_plan(x, pw)
    y = mxkit.matmul(x, pw)
    y64 = x.double() @ wd.double().T
    err = ((y.double() - y64).norm() / y64.norm()).item()
    bound = 1.2 * ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
    t_wg = time_us(lambda: mxkit.matmul(x, pw), cfg)
    os.environ["MXKIT_W4A16_WGMMA"] = "0"
    pw2 = mxkit.pack_weight(wq)  # a new PackedWeight: its own prepared-call cache
    p2 = mxkit.gemm_plan(x, pw2).path
    t_de = time_us(lambda: mxkit.matmul(x, pw2), cfg)
    del os.environ["MXKIT_W4A16_WGMMA"]
    print(f"{M}x{N}x{K} | {t_cub[0]:.1f} | {t_wg[0]:.1f} ({t_cub[0] / t_wg[0]:.2f}x, write {t_wg[1]:.1f}) | "
          f"{t_de[0]:.1f} ({t_cub[0] / t_de[0]:.2f}x) [{p2}] | {plan.path} | {err:.2e}/{bound:.2e}", flush=True)
