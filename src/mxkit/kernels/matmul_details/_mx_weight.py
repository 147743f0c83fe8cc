"""The MX weight tile of the bf16-activation GEMMs (dense decode and grouped MoE): MX bytes and E8M0 scales
decoded to bf16 in registers, exactly (every element value times its block factor 2^(s - 127) is a bf16 value
inside the bf16-exact scale envelope the host checks), ready for ``tl.dot`` with float32 accumulation.

Element kinds (the ``W_KIND`` constexpr): 0 E2M1 (two codes per byte, element 2i in the low nibble), 1 E4M3,
2 E5M2, 3 INT8 (two's complement times 2^-6: the 2^-6 goes into the block factor), 4 E2M3 and 5 E3M2 (FP6: four
codes per three little-endian bytes, code j of a group at bit 6j); the host's names are
``mxkit.kernels.matmul.W_KINDS``.
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
def _e8m0_bf16(sb, SHIFT: tl.constexpr = 0):
    # 2^(s - SHIFT - 127) as bf16 bits: the exponent field is s - SHIFT when that is >= 1, else the subnormal
    # 0x0040 >> (SHIFT - s) (2^-127 ... 2^-133); s = 255 NaN
    e = sb - SHIFT
    bits = tl.where(e >= 1, e << 7, 0x0040 >> tl.minimum(tl.maximum(-e, 0), 7))
    bits = tl.where(sb == 255, 0x7FC0, bits)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _fp6_tile(q_ptr, rows, nmask, k0, k_hi, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_KIND: tl.constexpr):
    """float32 [BLOCK_N, BLOCK_K]: the FP6 element values (E2M3: W_KIND 4, E3M2: 5; unscaled, exact in bf16) of
    elements [k0, k0 + BLOCK_K) (zero at and past k_hi) of rows of K * 3 / 4 bytes. Each group of four codes is
    its three bytes joined into 24 bits; a code's value is its integer significand times a power of two built
    on the float32 exponent bits (exact), signed."""
    MB: tl.constexpr = 3 if W_KIND == 4 else 2  # mantissa bits
    BIAS: tl.constexpr = 1 if W_KIND == 4 else 3
    G: tl.constexpr = BLOCK_K // 4
    gi = k0 // 4 + tl.arange(0, G)
    j = tl.arange(0, 4)
    m = nmask[:, None, None] & (gi < k_hi // 4)[None, :, None] & (j < 3)[None, None, :]
    byt = tl.load(q_ptr + rows[:, None, None] * (K // 4 * 3) + (gi * 3)[None, :, None] + j[None, None, :],
                  mask=m, other=0).to(tl.int32)
    word = tl.sum(byt << (8 * j)[None, None, :], axis=2)  # [BLOCK_N, G] 24-bit groups
    codes = tl.reshape((word[:, :, None] >> (6 * j)[None, None, :]) & 0x3F, [BLOCK_N, BLOCK_K])
    e = (codes >> MB) & ((1 << (5 - MB)) - 1)
    mant = codes & ((1 << MB) - 1)
    sig = tl.where(e == 0, mant, mant + (1 << MB))  # the integer significand
    p2 = ((tl.maximum(e, 1) - BIAS - MB + 127) << 23).to(tl.float32, bitcast=True)  # 2^(max(e, 1) - bias - MB)
    v = sig.to(tl.float32) * p2
    # the sign bit set by bits (a select of -v gave +0 for the code of -0 on the H200)
    return (v.to(tl.int32, bitcast=True) | ((codes & 0x20) << 26)).to(tl.float32, bitcast=True)


@triton.jit
def _mx_weight_tile(q_ptr, s_ptr, rows, nmask, k0, k_hi, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    W_KIND: tl.constexpr):
    """bf16 [BLOCK_N, BLOCK_K]: elements [k0, k0 + BLOCK_K) (zero at and past k_hi) of weight rows ``rows``
    (int64 [BLOCK_N], masked by ``nmask``; zero where masked) of a weight whose rows hold K elements: qdata rows
    of K / 2 (E2M1), K * 3 / 4 (FP6) or K bytes, scale rows of K / 32 bytes. k0 and k_hi are multiples of 32."""
    ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sb = tl.load(s_ptr + rows[:, None] * (K // 32) + ks[None, :],
                 mask=nmask[:, None] & (ks < k_hi // 32)[None, :], other=0).to(tl.int32)
    if W_KIND == 4 or W_KIND == 5:
        v = _fp6_tile(q_ptr, rows, nmask, k0, k_hi, K, BLOCK_N, BLOCK_K, W_KIND).to(tl.bfloat16)
        fac = tl.reshape(tl.broadcast_to(_e8m0_bf16(sb)[:, :, None], [BLOCK_N, BLOCK_K // 32, 32]),
                         [BLOCK_N, BLOCK_K])
        w = v * fac
    elif W_KIND == 0:
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        byt = tl.load(q_ptr + rows[:, None] * (K // 2) + kb[None, :], mask=nmask[:, None] & (kb < k_hi // 2)[None, :],
                      other=0)
        fac = tl.reshape(tl.broadcast_to(_e8m0_bf16(sb)[:, :, None], [BLOCK_N, BLOCK_K // 32, 16]),
                         [BLOCK_N, BLOCK_K // 2])
        even, odd = tl.inline_asm_elementwise(FP4_BYTES_BF16, "=r,=r,=r,=r,r,r,r", [byt, fac],
                                              dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        w = tl.reshape(tl.join(even, odd), [BLOCK_N, BLOCK_K])  # byte j -> elements 2j, 2j + 1
    else:
        kb = k0 + tl.arange(0, BLOCK_K)
        byt = tl.load(q_ptr + rows[:, None] * K + kb[None, :], mask=nmask[:, None] & (kb < k_hi)[None, :], other=0)
        if W_KIND == 1:
            v = byt.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
            fac = _e8m0_bf16(sb)
        elif W_KIND == 2:
            # an E5M2 code is the high byte of the fp16 of its value, Inf and NaN included (Triton's float8e5 ->
            # bf16 cast gave 65536 for an Inf code on the H200, triton 3.6)
            v = (byt.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(tl.bfloat16)
            fac = _e8m0_bf16(sb)
        else:
            v = byt.to(tl.int8, bitcast=True).to(tl.bfloat16)
            fac = _e8m0_bf16(sb, 6)
        fac = tl.reshape(tl.broadcast_to(fac[:, :, None], [BLOCK_N, BLOCK_K // 32, 32]), [BLOCK_N, BLOCK_K])
        w = v * fac
    return w
