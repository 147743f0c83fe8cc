import torch, mxkit
print("a8w8-mma fp32 out: max row error relative to the row norm (vs float64); and bf16 out")
for K in (192, 2880, 8192):
    for spread in (0, 6):
        x = torch.randn(16, K, device="cuda") * torch.exp2(torch.randint(-spread, spread + 1, (16, K), device="cuda").float())
        w = torch.randn(256, K, device="cuda") * torch.exp2(torch.randint(-spread, spread + 1, (256, K), device="cuda").float())
        a, pw = mxkit.quantize(x, "mxfp8_e4m3"), mxkit.pack_weight(mxkit.quantize(w, "mxfp8_e4m3"))
        y64 = mxkit.dequantize(a, torch.float32).double() @ mxkit.dequantize(pw.source, torch.float32).double().T
        y = mxkit.matmul(a, pw, out_dtype=torch.float32)
        p = mxkit.gemm_plan(a, pw, out_dtype=torch.float32).path
        rel = ((y.double() - y64).norm(dim=1) / y64.norm(dim=1)).max().item()
        print(f"K={K} spread={spread}: {p} {rel:.2e}  (1e-5 + K*2^-24 = {1e-5 + K * 2**-24:.1e})", flush=True)
