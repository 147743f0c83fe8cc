"""What Triton's FP8 bitcast conversions (``.to(tl.float8e5 / tl.float8e4nv, bitcast=True).to(tl.bfloat16)``, the
decode of ``matmul_details/_mx_weight.py``'s ``_mx_weight_tile``) make of the Inf / NaN codes, against torch's
``float8_e5m2`` / ``float8_e4m3fn`` views.

    PYTHONPATH=src python benchmarks/probes/triton_fp8_specials.py            # the GPU (if any)
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/triton_fp8_specials.py

Seen (triton 3.6): under the interpreter both conversions ignore the special codes (E5M2 0x7C -> 65536, 0x7F ->
114688; E4M3 0x7F -> 480). On the H200 the grouped MoE Triton kernel gave finite rows for an E5M2 expert holding an
Inf code (so those experts now take the reference in ``moe_triton``), while E4M3 NaN codes came out NaN there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _convert(q_ptr, e5_ptr, e4_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    byt = tl.load(q_ptr + i)
    tl.store(e5_ptr + i, byt.to(tl.float8e5, bitcast=True).to(tl.bfloat16))
    tl.store(e4_ptr + i, byt.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16))


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    codes = [0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFF, 0x7B, 0x78, 0x7E, 0x3C, 0xBC, 0x04, 0x01, 0x00, 0x80, 0x77]
    q = torch.tensor(codes, dtype=torch.uint8, device=dev)
    e5 = torch.empty(16, dtype=torch.bfloat16, device=dev)
    e4 = torch.empty(16, dtype=torch.bfloat16, device=dev)
    _convert[(1,)](q, e5, e4, N=16)
    want5, want4 = q.cpu().view(torch.float8_e5m2).float(), q.cpu().view(torch.float8_e4m3fn).float()
    print(f"{'code':>6} {'e5m2 triton':>14} {'e5m2 torch':>12} {'e4m3 triton':>14} {'e4m3 torch':>12}")
    for c, a, b, d, e in zip(codes, e5.float().cpu().tolist(), want5.tolist(), e4.float().cpu().tolist(),
                             want4.tolist()):
        print(f"{c:#6x} {a:14.6g} {b:12.6g} {d:14.6g} {e:12.6g}")


if __name__ == "__main__":
    main()
