import sys
sys.path.insert(0, "src")
import torch, triton
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.kernels.matmul_details._moe_epilogue import _bias_act_fp8_kernel
from mxkit.kernels.matmul_details._grouped import ACTS
cfg = TimingConfig(warmup_ms=10, rep_ms=30)
R, N1 = 70016, 5760
h = torch.randn(R, N1, device="cuda", dtype=torch.bfloat16)
b = torch.randn(128, N1, device="cuda")
ids = torch.arange(R, device="cuda", dtype=torch.int32)
eids = (torch.arange(R // 16 + 1, device="cuda", dtype=torch.int32) % 128)
q = torch.empty(R, N1 // 2, dtype=torch.float8_e4m3fn, device="cuda")
s = torch.empty(R, device="cuda")
ref = None
for rows in (1, 2, 4, 8, 16):
    for w in (4, 8):
        f = lambda: _bias_act_fp8_kernel[(R // rows,)](h, b, ids, eids, q, s, R, N1, ACT=ACTS["swiglu_gpt_oss"], HAS_BIAS=True,
                                               BLOCK_M=16, BLOCK_N=8192, ROWS=rows, num_warps=w)
        f()
        if ref is None:
            ref = (q.view(torch.uint8).clone(), s.clone())
        same = torch.equal(q.view(torch.uint8), ref[0]) and torch.equal(s, ref[1])
        t = time_us(f, cfg)[0]
        print(f"bias_act R={R} N={N1} rows={rows} warps={w}: {t:.1f} us, {(R * N1 * 2 + R * N1 // 2) / t / 1e3:.0f} GB/s same={same}", flush=True)
