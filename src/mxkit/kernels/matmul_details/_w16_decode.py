"""Small-M GEMM ``y = x @ W.T`` from bf16 activations and an MXFP4 weight read as MX bytes (decode).

Memory-bound: each program streams BLOCK_N weight rows over its K range once, decodes each E2M1 byte pair to
bf16 in registers (one inline asm per 4 bytes: the E2M1 bits placed in a bf16, then the block factor
2^(s - 127) applied by ``mul.rn.bf16x2``; exact: every E2M1 value times an E8M0 scale in the bf16-exact
envelope is a bf16 value) and feeds ``tl.dot`` with float32 accumulation. Split-K programs write float32
partial sums that the host reduces in a fixed order (deterministic).
"""

from __future__ import annotations

import triton
import triton.language as tl


def _fp4_bytes_to_bf16_asm() -> str:
    """PTX: $4 four packed bytes (8 E2M1 codes, element 2i in byte i's low nibble), $5 / $6 the block factor
    2^(s - 127) of bytes 0, 1 / 2, 3 as bf16 (all four equal: four aligned bytes lie in one 32-element block;
    bf16 0x0040 for s = 0, NaN for s = 255) -> $0 $1 the even
    elements (codes 0, 2 | 4, 6) and $2 $3 the odd ones (1, 3 | 5, 7) as bf16 pairs. Per byte: its magnitude
    bits e1 e0 m placed at bits 8-6 of each bf16 half (one multiply by 2^6 + 2^18) and its sign bits at 15 and
    31 (by 2^12 + 2^24), joined by ``lop3``: a bf16 equal to the E2M1 value times 2^-126 (the subnormal 0.5
    included); then times 2^126 and times the factor (``mul.rn.bf16x2``, exact)."""
    lines = ["{", ".reg .b32 b, z, s, k, p0, p1, p2, p3;", "mov.b32 k, 0x7E807E80;"]  # 2^126 in both halves
    for i in range(4):
        lines += [f"prmt.b32 b, $4, 0, 0x{0x4440 + i:04X};",  # byte i, zero-extended
                  "mul.lo.u32 z, b, 0x00040040;", "mul.lo.u32 s, b, 0x01001000;",
                  "and.b32 z, z, 0x01C001C0;", "lop3.b32 z, z, s, 0x80008000, 0xF8;",  # z | (s & signs)
                  "mul.rn.bf16x2 z, z, k;", f"mul.rn.bf16x2 p{i}, z, $5;"]
    lines += ["prmt.b32 $0, p0, p1, 0x5410;", "prmt.b32 $1, p2, p3, 0x5410;",   # low halves: even elements
              "prmt.b32 $2, p0, p1, 0x7632;", "prmt.b32 $3, p2, p3, 0x7632;", "}"]  # high halves: odd ones
    return " ".join(lines)


FP4_BYTES_BF16 = tl.constexpr(_fp4_bytes_to_bf16_asm())


@triton.jit
def _e8m0_bf16(sb):
    # 2^(s - 127) as bf16 bits: the exponent field is s itself; s = 0 is the subnormal 2^-127 (0x0040),
    # s = 255 NaN
    bits = tl.where(sb == 0, 0x0040, tl.where(sb == 255, 0x7FC0, sb << 7))
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _w16_fp4_decode_kernel(x_ptr, q_ptr, s_ptr, out_ptr, M, N, K, stride_xm, k_split,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [M, K] bf16 (row stride stride_xm), q [N, K / 2] uint8, s [N, K / 32] uint8 -> out [SPLIT, M, N]
    float32 partial sums of the K range [pid_k * k_split, (pid_k + 1) * k_split)."""
    tl.static_assert(BLOCK_K % 32 == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, BLOCK_M)
    mmask = m < M
    rows = n.to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        kmask = kb < k_hi // 2
        byt = tl.load(q_ptr + rows[:, None] * (K // 2) + kb[None, :], mask=nmask[:, None] & kmask[None, :],
                      other=0)
        sb = tl.load(s_ptr + rows[:, None] * (K // 32) + ks[None, :],
                     mask=nmask[:, None] & (ks < k_hi // 32)[None, :], other=0).to(tl.int32)
        fac = tl.reshape(tl.broadcast_to(_e8m0_bf16(sb)[:, :, None], [BLOCK_N, BLOCK_K // 32, 16]),
                         [BLOCK_N, BLOCK_K // 2])
        even, odd = tl.inline_asm_elementwise(FP4_BYTES_BF16, "=r,=r,=r,=r,r,r,r", [byt, fac],
                                              dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        w = tl.reshape(tl.join(even, odd), [BLOCK_N, BLOCK_K])  # byte j -> elements 2j, 2j + 1
        kx = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + m[:, None] * stride_xm + kx[None, :], mask=mmask[:, None] & (kx < k_hi)[None, :],
                     other=0.0)
        acc += tl.dot(xk, tl.trans(w))
    out = out_ptr + pid_k.to(tl.int64) * M * N + m[:, None] * N + n[None, :]
    tl.store(out, acc, mask=mmask[:, None] & nmask[None, :])

