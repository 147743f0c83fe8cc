"""Does cuBLAS' rowwise-scaled FP8 GEMM (torch._scaled_mm, scale_a [M, 1], scale_b [1, N]) overflow or round twice
where the row scale is extreme and the weight's power-of-two scale brings the product back into range? Prints,
per (row scale, column scale, out dtype), the max relative error against the float64 product and whether the
output is finite where the float64 product rounded to the out dtype is."""
import torch

torch.manual_seed(0)
M, N, K = 8, 64, 2880
a = (torch.randn(M, K, device="cuda") * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
b = (torch.randn(N, K, device="cuda") * 3).clamp(-448, 448).to(torch.float8_e4m3fn)
for sa_v, sb_v in ((2.0**120, 2.0**-45), (2.0**100, 2.0**-54), (2.0**-149, 2.0**50), (2.0**-140, 2.0**40),
                   (2.0**-70, 2.0**-50), (2.0**60, 2.0**54), (3.0 * 2.0**110, 2.0**-40)):
    sa = torch.full((M, 1), sa_v, device="cuda")
    sb = torch.full((1, N), sb_v, device="cuda")
    ref = (a.double() * sa.double()) @ (b.double() * sb.double().T).T
    for out in (torch.bfloat16, torch.float32):
        y = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=out).double()
        want = ref.to(out).double()
        fin = torch.isfinite(y)
        ok_fin = torch.equal(fin, torch.isfinite(want))
        rel = ((y - ref).abs() / ref.abs().clamp(min=1e-300))[fin & torch.isfinite(want) & (ref != 0)]
        print(f"sa={sa_v:.3e} sb={sb_v:.3e} out={str(out)[6:]:9s} finite-as-ref={ok_fin} "
              f"nonfinite={int((~fin).sum())} max_rel={rel.max().item() if rel.numel() else float('nan'):.3e}")
