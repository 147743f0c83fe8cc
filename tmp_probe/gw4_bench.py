"""Device: correctness + timing of the Gluon W4A16 prototype against cuBLAS bf16 and mxkit's current path."""
import sys, itertools, time
sys.path.insert(0, 'tmp_probe'); sys.path.insert(0, 'src')
import torch, triton
import mxkit
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.reference import dequantize_reference
import gw4

torch.manual_seed(int(time.time()))
cfg = TimingConfig(warmup_ms=10, rep_ms=float(sys.argv[1]) if len(sys.argv) > 1 else 30)
shapes = [(8192, 8192, 8192), (1024, 28672, 8192), (1024, 8192, 28672), (4096, 28672, 8192), (1024, 5120, 2880),
          (1024, 2880, 4096), (8192, 5760, 2880), (727, 2880, 2880)]
configs = [(128, 128, 4, 8, 0), (128, 256, 3, 8, 0), (128, 256, 4, 8, 0), (64, 256, 4, 4, 0)]
if len(sys.argv) > 3:
    shapes = [tuple(int(v) for v in c.split('x')) for c in sys.argv[3].split(',')]
if len(sys.argv) > 2:
    configs = [tuple(int(v) for v in c.split('x')) for c in sys.argv[2].split(',')]
for (M, N, K) in shapes:
    w = torch.randn(N, K, device='cuda') * 2.0 ** torch.randint(-7, 0, (N, 1), device='cuda')
    wq = mxkit.quantize(w.to(torch.bfloat16), 'mxfp4_e2m1')
    x = torch.randn(M, K, device='cuda').to(torch.bfloat16)
    q, s = gw4.pack_fp4(wq.qdata, wq.scale)
    qt, stt = gw4.pack_tma(wq.qdata, wq.scale)
    wd = dequantize_reference(wq, torch.bfloat16)
    y64 = (x.double() @ wd.double().T)
    ref_err = ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
    t_cub = time_us(lambda: x @ wd.T, cfg)[0]
    t_mx = time_us(lambda: mxkit.matmul(x, wq), cfg)[0]
    flops = 2 * M * N * K
    line = f"{M}x{N}x{K}: cuBLAS {t_cub:.1f} us ({flops / t_cub / 1e6:.0f} TF/s)  mxkit-now {t_mx:.1f} ({t_cub / t_mx:.2f}x)"
    print(line, flush=True)
    for c in configs:
        BN, BM, ST, NW, MODE = c[:5]
        TMA = c[5] if len(c) > 5 else 1
        PAIRS = bool(c[6]) if len(c) > 6 else True
        ONE = bool(c[7]) if len(c) > 7 else False
        if ONE and int(wq.scale.max()) > 128:
            print('   scales > 128: ONE_MUL skipped'); continue
        fn = (lambda: gw4.w4a16_tma(x, qt, stt, N, BN, BM, ST, NW, MODE, PAIRS, ONE)) if TMA else (lambda: gw4.w4a16(x, q, s, N, BN, BM, ST, NW, MODE))
        try:
            y = fn()
            err = ((y.double() - y64).norm() / y64.norm()).item()
            rows = ((y.double() - y64).norm(dim=1) / y64.norm(dim=1).clamp_min(1e-30))
            rb = ((y64.to(torch.bfloat16).double() - y64).norm(dim=1) / y64.norm(dim=1).clamp_min(1e-30))
            ok = bool((rows <= 1.2 * rb + 1e-12).all())
            t = time_us(fn, cfg)
            print(f"   {c}{'' if ok or MODE else ' WRONG'}: {t[0]:.1f} us ({flops / t[0] / 1e6:.0f} TF/s, {t_cub / t[0]:.2f}x cuBLAS) write {t[1]:.1f}"
                  f"  err {err:.2e} / {1.2 * ref_err:.2e} rows-ok {ok}", flush=True)
        except Exception as e:
            print(f"   {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
