import sys
sys.path.insert(0, "src")
import torch, triton
from mxkit.bench.timing import TimingConfig, time_us
from mxkit.bench import moe as bm
from mxkit.kernels.matmul_details._moe_epilogue import _bias_act_fp8_kernel, _gather_rows_kernel
from mxkit.kernels.matmul_details._grouped import ACTS
from mxkit.kernels.quantize_details._fp8_rowwise import _fp8_rowwise_kernel
from mxkit.kernels.moe import _align_rows, max_blocks
cfg = TimingConfig(warmup_ms=10, rep_ms=30)
T, H, E, k = 16384, 2880, 128, 4
tw, tids = bm.routing(T, E, "uniform", "cuda")
x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
for bmk in (256, 16):
    ids, eids, pos = _align_rows(tids, E, bmk, 0, max_blocks(T * k, E, bmk))
    R = ids.numel()
    for dt in (torch.bfloat16, torch.float8_e4m3fn):
        xx = x.to(dt) if dt != torch.bfloat16 else x
        W = H * xx.element_size() // 4
        xs = torch.empty(R, H, dtype=dt, device="cuda")
        src, dst = xx.view(torch.uint8).view(torch.int32), xs.view(torch.uint8).view(torch.int32)
        sc = torch.rand(T, device="cuda"); ss = torch.empty(R, device="cuda")
        for rows, bw, w in ((4, 256, 4), (2, 512, 4), (4, 512, 8), (8, 256, 8), (1, 1024, 4), (2, 1024, 8), (4, 128, 4)):
            f = lambda: _gather_rows_kernel[(triton.cdiv(R, rows),)](src, ids, dst, sc, ss, T * k, R, W, TOP_K=k, ROWS=rows,
                                                                      BLOCK_W=bw, HAS_SCALE=dt != torch.bfloat16, num_warps=w)
            t = time_us(f, cfg)[0]
            byts = T * k * H * xx.element_size() * 2
            print(f"gather bm={bmk} {dt} R={R} rows={rows} bw={bw} warps={w}: {t:.1f} us {byts / t / 1e3:.0f} GB/s (valid rows r+w)", flush=True)
q = torch.empty(T, H, dtype=torch.uint8, device="cuda"); s = torch.empty(T, device="cuda")
for rows, bk, w in ((1, 4096, 8), (1, 4096, 4), (2, 4096, 8), (1, 4096, 16), (4, 4096, 16)):
    f = lambda: _fp8_rowwise_kernel[(triton.cdiv(T, rows),)](x.view(torch.int16), q, s, T, H, ROWS=rows, BLOCK_K=bk, ONE_PASS=True,
                                                          BF16_BITS=True, HW_CVT=True, num_warps=w)
    t = time_us(f, cfg)[0]
    print(f"fp8 rowwise {T}x{H} rows={rows} bk={bk} warps={w} one pass: {t:.1f} us {T * H * 3 / t / 1e3:.0f} GB/s", flush=True)
R, N1 = 70000, 5760
h = torch.randn(R, N1, device="cuda", dtype=torch.bfloat16)
b = torch.randn(128, N1, device="cuda")
ids = torch.arange(R, device="cuda", dtype=torch.int32)
eids = (torch.arange(R // 16 + 1, device="cuda", dtype=torch.int32) % 128)
q = torch.empty(R, N1 // 2, dtype=torch.uint8, device="cuda")
s = torch.empty(R, device="cuda")
for w in (4, 8):
    f = lambda: _bias_act_fp8_kernel[(R,)](h, b, ids, eids, q, s, R, N1, ACT=ACTS["swiglu_gpt_oss"], HAS_BIAS=True,
                                           BLOCK_M=16, BLOCK_N=8192, HW_CVT=True, num_warps=w)
    t = time_us(f, cfg)[0]
    print(f"bias_act R={R} N={N1} warps={w}: {t:.1f} us, {(R * N1 * 2 + R * N1 // 2) / t / 1e3:.0f} GB/s", flush=True)
