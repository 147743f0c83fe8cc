"""Element codecs: the integer encoder / decoder of each MX element format and the PTX (inline asm) helpers of the
hardware-conversion paths. Each asm builder's comment proves why the instruction sequence is exact."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import _split4


def _fp8x4_asm(mbits: int, keep: bool) -> str:
    """PTX: four fp32 values ($1 .. $4) -> their FP8 codes (E4M3: mbits 3, E5M2: 2) in the bytes of $0, element
    order, through ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (in the x2 form the FIRST source lands in the UPPER
    byte, hence ($2, $1) for bytes (0, 1)). keep: four more inputs ($5 .. $8, -1 to keep a code, 0 to zero
    it), whose low bytes become a byte mask (3 prmt) ANDed onto the codes."""
    t = "e4m3x2" if mbits == 3 else "e5m2x2"
    cvt = f"cvt.rn.satfinite.{t}.f32 lo, $2, $1; cvt.rn.satfinite.{t}.f32 hi, $4, $3; "
    if not keep:
        return "{ .reg .b16 lo, hi; " + cvt + "mov.b32 $0, {lo, hi}; }"
    return ("{ .reg .b16 lo, hi; .reg .b32 w, k01, k23, k; " + cvt + "mov.b32 w, {lo, hi}; "
            "prmt.b32 k01, $5, $6, 0x0040; prmt.b32 k23, $7, $8, 0x0040; prmt.b32 k, k01, k23, 0x5410; "
            "and.b32 $0, w, k; }")


_FP8X4_E4M3 = tl.constexpr(_fp8x4_asm(3, False))
_FP8X4_E5M2 = tl.constexpr(_fp8x4_asm(2, False))
_FP8X4_KEEP_E4M3 = tl.constexpr(_fp8x4_asm(3, True))
_FP8X4_KEEP_E5M2 = tl.constexpr(_fp8x4_asm(2, True))


@triton.jit
def _cvt_fp8_rn(vbits, MBITS: tl.constexpr):
    """fp32 bits -> FP8 bytes (uint8) with the hardware ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (sm_89+):
    one IEEE round-to-nearest-even from fp32, saturating to +-max_normal. Four elements per asm block
    (:func:`_fp8x4_asm`)."""
    tl.static_assert(MBITS == 3 or MBITS == 2)
    if MBITS == 3:
        asm: tl.constexpr = _FP8X4_E4M3
    else:
        asm: tl.constexpr = _FP8X4_E5M2
    return tl.inline_asm_elementwise(asm, "=r,r,r,r,r", [vbits], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def _cvt_fp8_rn_keep(vbits, keep, MBITS: tl.constexpr):
    """:func:`_cvt_fp8_rn` with the bad-block mask applied inside the asm: keep (int32, -1 to keep the code, 0
    for a NaN / Inf block's 0) per element. Four elements per asm block, each with its own keep (any layout:
    the four need not share a block). A ``tl.where`` on the uint8 codes instead had every byte unpacked,
    selected and repacked (11 ALU instructions per four codes)."""
    tl.static_assert(MBITS == 3 or MBITS == 2)
    if MBITS == 3:
        asm: tl.constexpr = _FP8X4_KEEP_E4M3
    else:
        asm: tl.constexpr = _FP8X4_KEEP_E5M2
    return tl.inline_asm_elementwise(asm, "=r,r,r,r,r,r,r,r,r", [vbits, keep], dtype=tl.uint8, is_pure=True,
                                     pack=4)


@triton.jit
def _fp8_words(v, bad, A: tl.constexpr, B: tl.constexpr, MBITS: tl.constexpr):
    """Scaled values v [A, B, 4] (fp32, the exact x * 2^-X; the 4 of a word in one thread's registers) and
    bad [A, B, 4] (int32, nonzero in a NaN / Inf block; a broadcast, so v's layout) -> int32 words [A, B]: the
    four FP8 codes little-endian (element 0 in the low byte), rounded by ``cvt.rn.satfinite`` as in
    :func:`_cvt_fp8_rn`, 0 where bad. One asm and one select per word: the per-code ``tl.where`` on uint8
    codes had every byte unpacked, selected and repacked (11 ALU instructions per word). bad goes
    through the same reshape and splits as v, so the select needs no layout conversion."""
    e0, e1, e2, e3 = _split4(v.to(tl.int32, bitcast=True), A, B)
    m, _m1, _m2, _m3 = _split4(bad, A, B)
    tl.static_assert(MBITS == 3 or MBITS == 2)
    if MBITS == 3:
        asm: tl.constexpr = _FP8X4_E4M3
    else:
        asm: tl.constexpr = _FP8X4_E5M2
    w = tl.inline_asm_elementwise(asm, "=r,r,r,r,r", [e0, e1, e2, e3], dtype=tl.int32, is_pure=True, pack=1)
    return tl.where(m != 0, 0, w)


# One E2M1 code per 16-bit half of a bf16 pair ({x}: the pair, {f}: the pair's block factors 2^-X, {d}: the
# result, code of the low element in bits 0-3, of the high element in bits 16-19, nothing else set):
#   a = x * 2^-X, |a| clamped to 6    exact product (power-of-two factor; a subnormal a rounds to code 0 anyway),
#                                     then min.xorsign.abs with +6: min(|a|, 6) with a's sign
#   e = max(|a|, 1) & 0x7F80          2^E, E = floor(log2 |a|) clamped to [0, 2]: the E2M1 step at a is 2^(E-1)
#                                     (max.xorsign.abs keeps a's sign, which the mask drops)
#   m = 130 * Eb + 514, signed as a   bf16 bits of 64 * 2^E + 2E ulps (Eb = E + 127): a magic number whose ulp
#                                     is the step at a and whose low mantissa bits hold the code offset 2E
#   t = a + m                         add.rn rounds |a| to the step (RNE, symmetric in the sign); t's low 3 bits
#                                     are the code 2E + |a| / step
#   d = (t & 7) + (sign >> 12)        the sign bit of a (= x's: -0 and negatives rounding to 0 keep it) moved
#                                     to bit 3
# m comes from e by one mul.hi (65 * Eb in each half), one mad.lo (x 2, plus the sign bits) and one add (514 in
# each half); the sign is masked from a itself (a float x * (+0) would turn a NaN into bits across both halves,
# and the two halves of a pair may belong to different blocks). 11 instructions per pair, 6 of them on the ALU
# pipe. The 514 is an add after the mad.lo, not mad.hi's addend: SASS's IMAD.HI takes its addend as the high word
# of a 64-bit register pair, which ptxas would re-make with extra moves. Every bf16 bit pattern under every X is
# checked against mxkit.formats.encode_elements by running this PTX through a CPU interpreter
# (tests/kernel_tests/test_codecs.py).
_FP4_CODE = ("mul.rn.bf16x2 a, {x}, {f}; min.xorsign.abs.bf16x2 a, a, k6; max.xorsign.abs.bf16x2 e, a, k1; "
             "and.b32 e, e, 0x7F807F80; mul.hi.u32 m, e, 0x82000000; and.b32 s, a, 0x80008000; "
             "mad.lo.u32 m, m, 2, s; add.u32 m, m, 0x02020202; add.rn.bf16x2 t, a, m; and.b32 t, t, 0x00070007; "
             "mad.hi.u32 {d}, s, 0x00100000, t; ")
_FP4_REGS = "{ .reg .b32 k6, k1, a, e, m, t, s, "
_FP4_CONSTS = "mov.b32 k6, 0x40C040C0; mov.b32 k1, 0x3F803F80; "
# two bf16 pairs ($1, $2) and their factors ($3, $4) -> four code bytes (element order)
_FP4_ELEMENTS_ASM = tl.constexpr(_FP4_REGS + "y0, y1; " + _FP4_CONSTS + _FP4_CODE.format(x="$1", f="$3", d="y0")
                                 + _FP4_CODE.format(x="$2", f="$4", d="y1") + "prmt.b32 $0, y0, y1, 0x6420; }")


@triton.jit
def _fp4_bf16x2(xh, fh):
    """bf16 inputs (int16 bits) and their block factors 2^-X (int16 bf16 bits, X in [-127, 126]) -> E2M1
    codes (uint8: sign in bit 3), RNE, two elements per instruction (bf16x2 arithmetic, sm_90; the steps in
    _FP4_CODE). The sign comes from x (through a = x * 2^-X), so -0 and negative values rounding to 0 keep
    it. Elementwise: any layout gives the same codes."""
    return tl.inline_asm_elementwise(_FP4_ELEMENTS_ASM, "=r,r,r,r,r", [xh, fh], dtype=tl.uint8, is_pure=True,
                                     pack=4)


# four bf16 pairs (one 32-bit word each, $1-$4) and their factors ($5-$8) -> four packed bytes. The codes of a
# pair sit in bits 0-3 and 16-19 of y; z = y0 + y1 * 256 holds both pairs' codes in its nibbles 0, 2, 4, 6,
# and z + (z >> 12) (one mad.hi) the two packed bytes in its low 16 bits; one prmt joins two such halves
_FP4_PAIRS_ASM = tl.constexpr(
    _FP4_REGS + "y0, y1, z, h0, h1; " + _FP4_CONSTS
    + _FP4_CODE.format(x="$1", f="$5", d="y0") + _FP4_CODE.format(x="$2", f="$6", d="y1")
    + "mad.lo.u32 z, y1, 256, y0; mad.hi.u32 h0, z, 0x00100000, z; "
    + _FP4_CODE.format(x="$3", f="$7", d="y0") + _FP4_CODE.format(x="$4", f="$8", d="y1")
    + "mad.lo.u32 z, y1, 256, y0; mad.hi.u32 h1, z, 0x00100000, z; "
    + "prmt.b32 z, h0, h1, 0x5410; and.b32 $0, z, $9; }")


@triton.jit
def _fp4_bf16x2_pairs(xw, fw, keep):
    """:func:`_fp4_bf16x2` on bf16 pairs loaded as 32-bit words (xw: int32, even element in the low half; fw:
    int32, the pair's block factor 2^-X in both halves) -> the packed byte of each pair (even code in the low
    nibble, as stored). Four pairs per asm block (_FP4_PAIRS_ASM). Elementwise on words, so any layout gives
    the same bytes."""
    return tl.inline_asm_elementwise(_FP4_PAIRS_ASM, "=r,r,r,r,r,r,r,r,r,r,r,r,r", [xw, fw, keep], dtype=tl.uint8,
                                     is_pure=True, pack=4)


def _fp4_cols_asm(rows: int) -> str:
    """PTX for columnwise FP4 from bf16 (:func:`_cols_fp4_words`): ``rows`` (8 or 16) bf16 pairs (operands
    $2 .., one per row of a packed unit: the same two adjacent columns c, c + 1 in consecutive rows) and their
    factor pair (the last operand) -> the packed unit of each column ($0: column c, $1: column c + 1; 32-bit
    for 8 rows, 64-bit for 16: rows 8-15 in the high word), code of row j in nibble j as stored. Per 8 rows:
    the codes of rows 2k and 2k + 1 merge into one byte per column (p_k = y_2k + y_2k+1 * 16: column c's byte
    in bits 0-7, column c + 1's in bits 16-23), and four prmt gather the four bytes of each column."""
    f = f"${2 + rows}"
    body = [_FP4_REGS + ", ".join(f"y{j}" for j in range(8)) + ", p0, p1, p2, p3, q0, q1, "
            + ", ".join(f"c{k}, d{k}" for k in range(rows // 8)) + "; " + _FP4_CONSTS]
    for g in range(rows // 8):
        body += [_FP4_CODE.format(x=f"${2 + 8 * g + j}", f=f, d=f"y{j}") for j in range(8)]
        body += [f"mad.lo.u32 p{k}, y{2 * k + 1}, 16, y{2 * k}; " for k in range(4)]
        body += [f"prmt.b32 q0, p0, p1, 0x6240; prmt.b32 q1, p2, p3, 0x6240; prmt.b32 c{g}, q0, q1, 0x5410; "
                 f"prmt.b32 d{g}, q0, q1, 0x7632; "]
    body += ["mov.b64 $0, {c0, c1}; mov.b64 $1, {d0, d1}; }" if rows == 16 else "mov.b32 $0, c0; mov.b32 $1, d0; }"]
    return "".join(body)


_FP4_COLS_ASM8 = tl.constexpr(_fp4_cols_asm(8))
_FP4_COLS_ASM16 = tl.constexpr(_fp4_cols_asm(16))


@triton.jit
def _fp4_cols_pack(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, fw, WIDE: tl.constexpr):
    """The packed units (we, wo) of both columns of each bf16 pair from J row tiles of words and their factor
    pairs fw (:func:`_fp4_cols_asm`, elementwise): WIDE, 16 rows into 64-bit units; else 8 rows (x0 .. x7)
    into 32-bit units, x8 .. x15 unused."""
    if WIDE:
        we, wo = tl.inline_asm_elementwise(
            _FP4_COLS_ASM16, "=l,=l,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            [x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, fw], dtype=(tl.int64, tl.int64),
            is_pure=True, pack=1)
    else:
        we, wo = tl.inline_asm_elementwise(_FP4_COLS_ASM8, "=r,=r,r,r,r,r,r,r,r,r,r",
                                           [x0, x1, x2, x3, x4, x5, x6, x7, fw], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)
    return we, wo


@triton.jit
def _scaled(xbits, X):
    """The exact signed v = x * 2^-X (fp32) of fp32 bits x, X in [-127, 126] broadcast to their shape (exact
    for fp32-denormal x too: Triton's sm_90 fp32 multiply and numpy keep subnormal operands)."""
    v = xbits.to(tl.float32, bitcast=True) * ((127 - X) << 23).to(tl.float32, bitcast=True)
    return v


def _fp6_units_asm(mbits: int, vec: int, n_out: int) -> str:
    """PTX that turns VEC 16-element units (inputs: v = x * 2^-X * 2^-6 (E2M3) / 2^-12 (E3M2) as fp32 bits,
    element j of unit v in operand n_out + v + VEC * j: the thread's register order in _cols_units, or the
    two 8-element halves of _rows_fp6_words) into each unit's three FP6 words (outputs: word k of unit v in
    operand v + VEC * k; the other n_out - 3 VEC outputs are left unset and never read).

    Per 4 elements: two ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (RNE on the FP8 grid, whose values with
    exponent field < 4 / < 8 are the FP6 values times 2^-6 / 2^-12, see _encode); then, on the 4 bytes at
    once, bytes with exponent field >= 4 / 8 (bits 5-6 of the byte) saturate to magnitude 0x1F (RNE then
    saturate = saturate then RNE: rounding is monotone and max_normal is on both grids), the sign moves from
    bit 7 to bit 5, and the four 6-bit codes are compressed to 24 bits with two bit-selects (``lop3`` 0xE4);
    four such groups make the unit's 96-bit little-endian word triple. Nsight Compute had the FP6 kernels
    ALU-pipe-bound (84-90% of peak) with the per-element encoder: this does the per-element work 4 at a time."""
    cvt = "e4m3x2" if mbits == 3 else "e5m2x2"
    p = n_out
    lines = ["{", ".reg .b16 h0, h1;", ".reg .b32 w, t, s, g0, g1, g2, g3;"]
    for v in range(vec):
        def x(j, v=v):
            return f"${p + v + vec * j}"
        for q in range(4):
            j = 4 * q
            lines += [f"cvt.rn.satfinite.{cvt}.f32 h0, {x(j + 1)}, {x(j)};",
                      f"cvt.rn.satfinite.{cvt}.f32 h1, {x(j + 3)}, {x(j + 2)};",
                      "mov.b32 w, {h0, h1};",
                      "and.b32 t, w, 0x60606060;", "shr.u32 s, t, 1;", "or.b32 t, t, s;",
                      "and.b32 t, t, 0x20202020;", "shr.u32 s, t, 5;", "sub.u32 t, t, s;",
                      "or.b32 t, w, t;", "and.b32 t, t, 0x1F1F1F1F;",
                      "shr.u32 s, w, 2;", "and.b32 s, s, 0x20202020;", "or.b32 w, t, s;",
                      "shr.u32 s, w, 2;", "lop3.b32 w, w, s, 0x003F003F, 0xE4;",
                      "shr.u32 s, w, 4;", f"lop3.b32 g{q}, w, s, 0x00000FFF, 0xE4;"]
        lines += ["shl.b32 t, g1, 24;", f"or.b32 ${v}, g0, t;",
                  "shr.u32 t, g1, 8;", "shl.b32 s, g2, 16;", f"or.b32 ${v + vec}, t, s;",
                  "shr.u32 t, g2, 16;", "shl.b32 s, g3, 8;", f"or.b32 ${v + 2 * vec}, t, s;"]
    return " ".join(lines + ["}"])


def _fp6_pairs_asm(mbits: int, cols: bool) -> str:
    """PTX for FP6 from bf16 pairs (FP6P_R / FP6P_C; 32-bit words, element 2i in the low half): clamp, scale, round
    and pack 16 codes per unit. Rows (``cols`` False): $3-$10 the 8 words of one 16-element group (one block),
    $11 the block factor f, $12 the clamp pair, $13 the keep mask -> $0-$2 the group's three little-endian
    words. Columns (``cols`` True): $6-$21 one word per row of a unit (bf16 pairs of two adjacent columns,
    each column its own block), $22 / $23 the factors of the even / odd column, $24 the clamp pair (even
    column's in the low half), $25 / $26 their keep masks -> $0-$2 the even column's unit, $3-$5 the odd one's.

    Per word: ``min.xorsign.abs.bf16x2`` with the clamp pair M = max_normal * 2^X (+Inf where that overflows
    bf16, where no finite x can exceed it) saturates each half, sign kept, exactly (one ALU instruction per
    two elements; rounding is monotone, so clamp-then-round = round-then-saturate, and M is on the grid); the
    halves to fp32 bits (shl / and) and one ``mul.rn.f32`` each by f = 2^(-X-6) (E2M3) / 2^(-X-12) (E3M2),
    exact (a subnormal product is below 2^-10 and rounds to code 0 whatever its rounding); then per 4 codes,
    as in :func:`_fp6_units_asm`, two ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (RNE on the FP8 grid, which
    holds the FP6 values times f / 2^-X below the saturation point), whose bytes are sign-bit-7, bits 5-6
    clear (clamped): the sign moves to bit 5 with one subtraction per 4 bytes (b - 3/4 (b & 0x80) per
    byte: ``mul.hi`` by 0xC0000000 makes the 3/4) and two bit-selects compress the 4 codes to 24 bits; four
    such groups make the 3 words, ANDed with the keep mask (0 for a block holding NaN / Inf: those halves
    are clamped to finite garbage here and zeroed). The amax on pairs (:func:`_hmax_abs`) and this clamp
    replace the fp32 unpacking, amax and byte-SIMD saturation of the unit asm."""
    cvt = "e4m3x2" if mbits == 3 else "e5m2x2"
    lines = ["{", ".reg .b16 h0, h1;", ".reg .b32 y, w, s, t, g0, g1, g2, g3;",
             ".reg .f32 " + ", ".join(f"v{i}" for i in range(8)) + ";"]
    if cols:
        words, fa, fb, m, keeps = [f"${6 + j}" for j in range(16)], "$22", "$23", "$24", ("$25", "$26")
    else:
        words, fa, fb, m, keeps = [f"${3 + j}" for j in range(8)], "$11", "$11", "$12", ("$13",)

    def scaled(word, lo, hi):  # the word's two clamped, scaled halves -> f32 registers lo, hi
        return [f"min.xorsign.abs.bf16x2 y, {word}, {m};", "shl.b32 s, y, 16;", "and.b32 y, y, 0xFFFF0000;",
                f"mul.rn.f32 {lo}, s, {fa};", f"mul.rn.f32 {hi}, y, {fb};"]

    def codes4(a, b, c, d, g):  # four scaled values (element order) -> 24-bit field of 4 FP6 codes in g
        return [f"cvt.rn.satfinite.{cvt}.f32 h0, {b}, {a};", f"cvt.rn.satfinite.{cvt}.f32 h1, {d}, {c};",
                "mov.b32 w, {h0, h1};", "and.b32 s, w, 0x80808080;", "mul.hi.u32 s, s, 0xC0000000;",
                "sub.u32 w, w, s;", "shr.u32 s, w, 2;", "lop3.b32 w, w, s, 0x003F003F, 0xE4;",
                "shr.u32 s, w, 4;", f"lop3.b32 {g}, w, s, 0x00000FFF, 0xE4;"]

    def pack(g, o, keep):  # four 24-bit fields -> the unit's three words, masked
        return [f"shl.b32 t, {g[1]}, 24; or.b32 t, {g[0]}, t; and.b32 {o[0]}, t, {keep};",
                f"shr.u32 t, {g[1]}, 8; shl.b32 s, {g[2]}, 16; or.b32 t, t, s; and.b32 {o[1]}, t, {keep};",
                f"shr.u32 t, {g[2]}, 16; shl.b32 s, {g[3]}, 8; or.b32 t, t, s; and.b32 {o[2]}, t, {keep};"]

    if not cols:
        for q in range(4):  # words 2q, 2q + 1 = elements 4q .. 4q + 3
            lines += scaled(words[2 * q], "v0", "v1") + scaled(words[2 * q + 1], "v2", "v3")
            lines += codes4("v0", "v1", "v2", "v3", f"g{q}")
        lines += pack(("g0", "g1", "g2", "g3"), ("$0", "$1", "$2"), keeps[0])
    else:
        lines += [".reg .b32 e0, e1, e2, e3;"]
        for q in range(4):  # rows 4q .. 4q + 3: even column in v0-v3, odd column in v4-v7
            for k in range(4):
                lines += scaled(words[4 * q + k], f"v{k}", f"v{4 + k}")
            lines += codes4("v0", "v1", "v2", "v3", f"g{q}") + codes4("v4", "v5", "v6", "v7", f"e{q}")
        lines += pack(("g0", "g1", "g2", "g3"), ("$0", "$1", "$2"), keeps[0])
        lines += pack(("e0", "e1", "e2", "e3"), ("$3", "$4", "$5"), keeps[1])
    return " ".join(lines + ["}"])


FP6_PAIRS_ROWS_E2M3 = tl.constexpr(_fp6_pairs_asm(3, False))
FP6_PAIRS_ROWS_E3M2 = tl.constexpr(_fp6_pairs_asm(2, False))
FP6_PAIRS_COLS_E2M3 = tl.constexpr(_fp6_pairs_asm(3, True))
FP6_PAIRS_COLS_E3M2 = tl.constexpr(_fp6_pairs_asm(2, True))
FP6_PAIRS_ROWS_RW = tl.constexpr(",".join(["=r"] * 3 + ["r"] * 11))
FP6_PAIRS_COLS_RW = tl.constexpr(",".join(["=r"] * 6 + ["r"] * 21))


FP6_UNITS_E2M3_2 = tl.constexpr(_fp6_units_asm(3, 2, 32))
FP6_UNITS_E3M2_2 = tl.constexpr(_fp6_units_asm(2, 2, 32))
FP6_HALVES_E2M3 = tl.constexpr(_fp6_units_asm(3, 1, 8))
FP6_HALVES_E3M2 = tl.constexpr(_fp6_units_asm(2, 1, 8))
FP6_UNITS_RW_2 = tl.constexpr(",".join(["=r"] * 32 + ["r"] * 32))
FP6_HALVES_RW = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 16))


def _fp6_group_decode_asm(mbits: int) -> str:
    """PTX that decodes one 16-code FP6 group to bf16 (the inverse of _fp6_units_asm): inputs $8-$10 the
    group's three little-endian words, $11 the fp32 bits of the block factor 2^(s - 127) (as _decode_hw:
    0x00400000 for s = 0, NaN for s = 255); outputs $0-$7 the 16 bf16 results as pairs (element 2i in the
    low half of $i). Per 4 codes: the 24-bit field of 4 codes spread to 4 bytes with two bit-selects
    (``lop3`` 0xE4), the sign moved from bit 5 to bit 7 (an E4M3 / E5M2 byte whose value is the FP6 value times
    2^-6 / 2^-12), two ``cvt.rn.f16x2.{e4m3,e5m2}x2`` (exact), ``cvt.f32.f16`` (exact), the exact * 2^6 / 2^12
    and ONE fp32 multiply by the factor (correctly rounded, subnormal results included), then
    ``cvt.rn.bf16x2.f32`` (RNE): the same roundings as the reference's fp32 value then bf16."""
    cvt = "e4m3x2" if mbits == 3 else "e5m2x2"
    unit = "0f45800000" if mbits == 2 else "0f42800000"  # 4096.0 / 64.0
    lines = ["{", ".reg .b16 l, h, a0, a1, b0, b1;", ".reg .b32 g, t, s, c, a, b;",
             ".reg .f32 f0, f1, f2, f3;"]
    # the four 24-bit fields: bits 0-23 of w0, 24-47, 48-71, 72-95 of (w2:w1:w0)
    fields = ["and.b32 g, $8, 0x00FFFFFF;", "shf.r.clamp.b32 g, $8, $9, 24; and.b32 g, g, 0x00FFFFFF;",
              "shf.r.clamp.b32 g, $9, $10, 16; and.b32 g, g, 0x00FFFFFF;", "shr.u32 g, $10, 8;"]
    for q in range(4):
        lines += [fields[q],
                  "shl.b32 s, g, 4;", "lop3.b32 t, g, s, 0x00000FFF, 0xE4;",  # codes 0|1<<6 at 0-11, 2|3<<6 at 16-27
                  "shl.b32 s, t, 2;", "lop3.b32 c, t, s, 0x003F003F, 0xE4;",  # one code per byte
                  "shl.b32 s, c, 2;", "and.b32 s, s, 0x80808080;", "and.b32 c, c, 0x1F1F1F1F;", "or.b32 c, c, s;",
                  "mov.b32 {l, h}, c;", f"cvt.rn.f16x2.{cvt} a, l;", f"cvt.rn.f16x2.{cvt} b, h;",
                  "mov.b32 {a0, a1}, a;", "mov.b32 {b0, b1}, b;",
                  "cvt.f32.f16 f0, a0;", "cvt.f32.f16 f1, a1;", "cvt.f32.f16 f2, b0;", "cvt.f32.f16 f3, b1;",
                  f"mul.rn.f32 f0, f0, {unit};", f"mul.rn.f32 f1, f1, {unit};",
                  f"mul.rn.f32 f2, f2, {unit};", f"mul.rn.f32 f3, f3, {unit};",
                  "mul.rn.f32 f0, f0, $11;", "mul.rn.f32 f1, f1, $11;", "mul.rn.f32 f2, f2, $11;",
                  "mul.rn.f32 f3, f3, $11;",
                  f"cvt.rn.bf16x2.f32 ${2 * q}, f1, f0;", f"cvt.rn.bf16x2.f32 ${2 * q + 1}, f3, f2;"]
    return " ".join(lines + ["}"])


def _fp4_word_decode_asm(out_f16: bool = False) -> str:
    """PTX that decodes one 32-bit word of 8 E2M1 codes (little-endian nibbles, code k in bits 4k .. 4k+3:
    the packed MXFP4 layout) straight to bf16: input $4 the word, $5 the block factor 2^(s - 127) as bf16 in
    both halves (0x0040, a bf16 subnormal, for s = 0; NaN for s = 255); outputs $0-$3 the bf16 pairs, code
    2i in the low half of $i. Per pair (byte i of the word): the byte alone (``prmt``), its magnitude bits
    e1 e0 m placed at bits 8-6 of each bf16 half (one multiply by 2^6 + 2^18: the byte's two shifted copies
    do not overlap) and its sign bits at bits 15 and 31 (a multiply by 2^12 + 2^24), masked and joined (two
    ``lop3``): a bf16 whose exponent field is e1 e0 and whose mantissa top bit is m, which is exactly the
    E2M1 value times 2^-126, the subnormal 0.5 (e = 0) included. Then two ``mul.rn.bf16x2``: by 2^126
    (exact) and by the factor. Every E2M1 value times 2^(s - 127) has at most two significant bits and is
    0 or at least 2^-128, so the product is exact in bf16 unless it exceeds bf16's range, where it rounds to
    Inf as the reference's fp32 product (fp32 max ~ 2^128, the same as bf16's) does: the reference's bits
    (its fp32 value, then bf16 RNE); ±0 keeps its sign; NaN for s = 255 (the payload may differ: bf16x2
    NaNs are canonical). 5 integer and 2 bf16x2 instructions per pair, where :func:`_decode_hw` unpacked
    nibbles to int32 codes, built E4M3 bytes and converted through fp16 and fp32 back to bf16.

    out_f16: fp16 pairs instead: each exact bf16 result widened to fp32 (its bits shifted up 16: exact, Inf
    kept) and both rounded by one ``cvt.rn.f16x2.f32`` (RNE, fp16 subnormals kept, overflow to Inf): the
    reference's fp32 value rounded once to fp16, as it does."""
    lines = ["{", ".reg .b32 b, z, s, k;", "mov.b32 k, 0x7E807E80;"]  # 2^126 in both bf16 halves
    if out_f16:
        lines[1] = ".reg .b32 b, z, s, k, lo, hi;"
    for i in range(4):
        lines += [f"prmt.b32 b, $4, 0, 0x{0x4440 + i:04X};",  # byte i, zero-extended
                  "mul.lo.u32 z, b, 0x00040040;", "mul.lo.u32 s, b, 0x01001000;",
                  "and.b32 z, z, 0x01C001C0;", "lop3.b32 z, z, s, 0x80008000, 0xF8;",  # z | (s & signs)
                  "mul.rn.bf16x2 z, z, k;"]
        if out_f16:
            lines += ["mul.rn.bf16x2 z, z, $5;", "shl.b32 lo, z, 16;", "and.b32 hi, z, 0xFFFF0000;",
                      f"cvt.rn.f16x2.f32 ${i}, hi, lo;"]  # (the first source lands in the upper half)
        else:
            lines += [f"mul.rn.bf16x2 ${i}, z, $5;"]
    return " ".join(lines + ["}"])


FP4_DEC = tl.constexpr(_fp4_word_decode_asm())
FP4_DEC_F16 = tl.constexpr(_fp4_word_decode_asm(True))
FP4_DEC_RW = tl.constexpr(",".join(["=r"] * 4 + ["r"] * 2))


FP6_DEC_E2M3 = tl.constexpr(_fp6_group_decode_asm(3))
FP6_DEC_E3M2 = tl.constexpr(_fp6_group_decode_asm(2))
FP6_DEC_RW = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 3 + ["f"]))


@triton.jit
def _fp6_units_hw(vbits, MBITS: tl.constexpr):
    """:func:`_fp6_units_asm` on vbits [..., 16 (j), U, 2 (v)] (fp32 bits of the scaled elements, registers in
    (v, j, u) order): the same shape of int32, word k of a unit at j = k (k < 3), the rest unset."""
    tl.static_assert(MBITS == 2 or MBITS == 3)
    return tl.inline_asm_elementwise(FP6_UNITS_E2M3_2 if MBITS == 3 else FP6_UNITS_E3M2_2, FP6_UNITS_RW_2, [vbits],
                                     dtype=tl.int32, is_pure=True, pack=32)


@triton.jit
def _fp6_asm_input(xbits, X, MBITS: tl.constexpr):
    """The unit asms' inputs: fp32 bits of x * 2^-X * 2^-6 (E2M3) / 2^-12 (E3M2), exact (see _encode); no
    clamp (the asm saturates on the cvt bytes)."""
    v = _scaled(xbits, X) * (0.015625 if MBITS == 3 else 0.000244140625)
    return v.to(tl.int32, bitcast=True)


@triton.jit
def _fp6_asm_words(o, k, bad, AX: tl.constexpr):
    """The three words of each unit from a unit asm's output o (word i at position k == i along axis AX, the
    other positions unset and never read), 0 for blocks with NaN / Inf (bad, broadcast to the result)."""
    w0 = tl.where(bad, 0, tl.sum(tl.where(k == 0, o, 0), axis=AX))
    w1 = tl.where(bad, 0, tl.sum(tl.where(k == 1, o, 0), axis=AX))
    w2 = tl.where(bad, 0, tl.sum(tl.where(k == 2, o, 0), axis=AX))
    return w0, w1, w2


@triton.jit
def _encode(xbits, X, bad, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
            EMAX: tl.constexpr, IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, AWAY: tl.constexpr,
            HW_CVT: tl.constexpr = False, KEEP_ASM: tl.constexpr = False):
    """fp32 bits -> element codes (int32, low BITS bits), X broadcast to the same shape.

    HW_CVT and FP4 (bf16 inputs, RNE; GPU only): :func:`_fp4_bf16x2`.
    HW_CVT (FP8 / FP6 with RNE only; GPU only, the interpreter cannot run inline asm): the exact signed
    v = x * 2^-X goes through the hardware cvt.rn.satfinite (uint8 codes). FP8: satfinite = the reference's
    saturation (every |v| >= max_normal gives max_normal either way). FP6: E2M3 / E3M2 values times 2^-6 /
    2^-12 are exactly the E4M3 / E5M2 values whose exponent field is < 4 / < 8 (subnormals included), with
    the same bits below the sign: so v is clamped to +-max_normal (on the grid: same as rounding then
    saturating), scaled exactly, rounded by the FP8 cvt (same grid, same ties-to-even), and the sign moved
    from bit 7 to bit 5. fp32-subnormal v round to a signed zero either way; NaN / Inf blocks are masked to 0
    afterwards (KEEP_ASM, FP8 with HW_CVT: inside the cvt asm, :func:`_cvt_fp8_rn_keep`)."""
    if HW_CVT and BITS == 4:
        # FP4 from bf16 inputs (the launcher enables it only for them): bf16x2 arithmetic, see _fp4_bf16x2
        tl.static_assert(not IS_INT and not AWAY)
        if xbits.dtype == tl.int16:  # RAW16: the bf16 bits as loaded
            xh = xbits
        else:
            xh = (xbits >> 16).to(tl.int16)
        fh = tl.broadcast_to(((127 - X) << 7).to(tl.int16), xh.shape)
        code = _fp4_bf16x2(xh, fh)
    elif HW_CVT:
        tl.static_assert((BITS == 8 or BITS == 6) and not IS_INT and not AWAY and EMAX != 0)
        v = _scaled(xbits, X)
        if BITS == 6:
            # clamp keeps the sign of zero (min / max of -0 and a positive bound is -0); the 2^-6 / 2^-12
            # product is exact for every |v| >= 2^-120, and smaller |v| round to a signed zero either way
            v = tl.minimum(tl.maximum(v, -MAX_NORMAL), MAX_NORMAL) * (0.015625 if MBITS == 3 else 0.000244140625)
            b8 = _cvt_fp8_rn(v.to(tl.int32, bitcast=True), MBITS).to(tl.int32)
            code = ((b8 >> 2) & 0x20) | (b8 & 0x1F)
        elif KEEP_ASM:
            code = _cvt_fp8_rn_keep(v.to(tl.int32, bitcast=True), tl.broadcast_to(tl.where(bad, 0, -1), v.shape),
                                    MBITS)
        else:
            code = _cvt_fp8_rn(v.to(tl.int32, bitcast=True), MBITS)
    else:
        abits = xbits & 0x7FFFFFFF
        ax = abits.to(tl.float32, bitcast=True)
        if EMAX == 0:
            # only MXINT8 (emax 0) reaches X = 127, whose 2^-127 is not an fp32 normal: split it
            xa = tl.minimum(X, 126)
            v = ax * ((127 - xa) << 23).to(tl.float32, bitcast=True)
            v = tl.where(X > 126, v * 0.5, v)
        else:
            v = ax * ((127 - X) << 23).to(tl.float32, bitcast=True)  # exact 2^-X, X in [-127, 126]
        a = tl.minimum(v, MAX_NORMAL)  # saturate: rounding is monotone and max_normal is on the grid
        if IS_INT:
            # fixed step 2^-6: 2^17 + a has ulp 2^-6, so the add rounds a*64 to an integer (RNE)
            t = a + 131072.0
            n = t.to(tl.int32, bitcast=True) - 0x48000000
            if AWAY:
                # a tie rounded down by RNE leaves exactly half a step behind
                n += ((a - (t - 131072.0)) == 0.0078125).to(tl.int32)
            code = tl.where(xbits < 0, -n, n) & 0xFF
        else:
            # element exponent e = max(floor(log2 a), emin); the magic 2^(e - mbits + 23) has ulp 2^(e - mbits)
            ef = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, EMIN + 127)
            mb = (ef + (23 - MBITS)) << 23
            magic = mb.to(tl.float32, bitcast=True)
            t = a + magic
            n = t.to(tl.int32, bitcast=True) - mb  # a / ulp rounded, in [0, 2^(mbits+1)]
            if AWAY:
                half = (mb - (24 << 23)).to(tl.float32, bitcast=True)  # 2^(e - mbits - 1)
                n += ((a - (t - magic)) == half).to(tl.int32)
            # one expression covers subnormals, the subnormal -> normal carry and the binade carry
            code = ((ef - (EMIN + 127)) << MBITS) + n
            code = code | ((xbits >> 31) & (1 << (BITS - 1)))  # sign kept on zero results
    if not (KEEP_ASM and HW_CVT and BITS == 8):  # (else masked inside the asm)
        code = tl.where(bad, 0, code)
    return code


@triton.jit
def _encode_as(xbits, X, bad, FMT: tl.constexpr, AWAY: tl.constexpr, HW_CVT: tl.constexpr = False,
               KEEP_ASM: tl.constexpr = False):
    """:func:`_encode` to format FMT (an :class:`~._common.ElementSpec`)."""
    return _encode(xbits, X, bad, FMT.bits, FMT.mbits, FMT.emin, FMT.emax, FMT.is_int, FMT.max_normal, AWAY, HW_CVT,
                   KEEP_ASM)


@triton.jit
def _fp6_unit_words(codes):
    """FP6 codes [..., 16] (int32, 6 bits each) -> the three words (w0, w1, w2) [...] of each 16-code unit:
    code k at bit 6k of the unit's 96-bit little-endian word triple (OCP MX v1.0 packs FP6 elements
    little-endian, 4 codes in 3 bytes; a unit is 4 such groups)."""
    k = tl.arange(0, 16)
    AX: tl.constexpr = len(codes.shape) - 1
    w0 = tl.sum(tl.where(k < 6, codes << tl.minimum(6 * k, 30), 0), axis=AX)
    w1 = tl.sum(tl.where(k == 5, codes >> 2, tl.where((k > 5) & (k < 11), codes << tl.maximum(6 * k - 32, 0), 0)),
                axis=AX)
    w2 = tl.sum(tl.where(k == 10, codes >> 4, tl.where(k > 10, codes << tl.maximum(6 * k - 64, 0), 0)), axis=AX)
    return w0, w1, w2


@triton.jit
def _decode(code, sbyte, FMT: tl.constexpr):
    """codes (int32) of format FMT (an :class:`~._common.ElementSpec`) and their scale bytes (broadcast) -> fp32
    decode(code) * 2^(scale - 127), one rounding."""
    BITS: tl.constexpr = FMT.bits
    MBITS: tl.constexpr = FMT.mbits
    EMIN: tl.constexpr = FMT.emin
    BIAS: tl.constexpr = FMT.bias
    if FMT.is_int:
        val = ((code ^ 0x80) - 0x80).to(tl.float32) * 0.015625  # two's complement * 2^-6, exact
        isnan = sbyte == 255
    else:
        SIGN: tl.constexpr = 1 << (BITS - 1)
        mag = code & (SIGN - 1)
        ef = mag >> MBITS
        mant = mag & ((1 << MBITS) - 1)
        # normal: rebias the exponent field; subnormal: exact int -> float of the mantissa times 2^(emin - mbits)
        nb = (mag << (23 - MBITS)) + ((127 - BIAS) << 23)
        sub_step = tl.full([], (127 + EMIN - MBITS) << 23, tl.int32).to(tl.float32, bitcast=True)
        sub = mant.to(tl.float32) * sub_step
        vb = tl.where(ef == 0, sub.to(tl.int32, bitcast=True), nb)
        vb = vb | ((code & SIGN) << (32 - BITS))
        val = vb.to(tl.float32, bitcast=True)
        isnan = sbyte == 255
        if FMT.has_inf:
            top = ef == (1 << (BITS - 1 - MBITS)) - 1
            isnan = isnan | (top & (mant != 0))
            inf = tl.where((code & SIGN) != 0, float("-inf"), float("inf"))
            val = tl.where(top & (mant == 0), inf, val)
        elif FMT.has_nan:
            isnan = isnan | (mag == SIGN - 1)
    # 2^(s - 127) for s >= 1 is an fp32 normal; s == 0 (2^-127) is applied as 0.5 (exact on the element
    # value, which is >= 2^-16) times 2^-126, so the product is the single correctly rounded fp32 result
    fac = (tl.maximum(sbyte, 1) << 23).to(tl.float32, bitcast=True)
    val = tl.where(sbyte == 0, val * 0.5, val) * fac
    return tl.where(isnan, float("nan"), val)


@triton.jit
def _cvt_fp8_to_f32(code, MBITS: tl.constexpr):
    """FP8 bytes (uint8) -> fp32 with the hardware ``cvt.rn.f16x2.{e4m3,e5m2}x2`` (sm_89+; exact: every FP8
    value, NaN and Inf are fp16 values) and ``cvt.f32.f16`` (exact). Four bytes per asm block; in the x2
    form the low byte becomes the low half."""
    if MBITS == 3:
        asm: tl.constexpr = ("{ .reg .b16 l, h, a0, a1, b0, b1; .reg .b32 a, b; mov.b32 {l, h}, $4; "
                             "cvt.rn.f16x2.e4m3x2 a, l; cvt.rn.f16x2.e4m3x2 b, h; mov.b32 {a0, a1}, a; "
                             "mov.b32 {b0, b1}, b; cvt.f32.f16 $0, a0; cvt.f32.f16 $1, a1; cvt.f32.f16 $2, b0; "
                             "cvt.f32.f16 $3, b1; }")
    else:
        tl.static_assert(MBITS == 2)
        asm: tl.constexpr = ("{ .reg .b16 l, h, a0, a1, b0, b1; .reg .b32 a, b; mov.b32 {l, h}, $4; "
                             "cvt.rn.f16x2.e5m2x2 a, l; cvt.rn.f16x2.e5m2x2 b, h; mov.b32 {a0, a1}, a; "
                             "mov.b32 {b0, b1}, b; cvt.f32.f16 $0, a0; cvt.f32.f16 $1, a1; cvt.f32.f16 $2, b0; "
                             "cvt.f32.f16 $3, b1; }")
    return tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r", [code], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _decode_hw(code, sbyte, BITS: tl.constexpr, MBITS: tl.constexpr):
    """HW_DEC path of :func:`_decode` (GPU only: inline asm) for FP8 / FP6 / FP4 codes (int32, low BITS bits):
    the element through the hardware FP8 -> fp16 cvt, then ONE fp32 multiply by 2^(s - 127), which is
    correctly rounded including a subnormal result (PTX mul.f32 without .ftz) and for s = 0 (2^-127 is an
    fp32 subnormal operand); s = 255 multiplies by NaN. FP4: E2M1 code s.e1e0.m placed in an E4M3 byte as
    s000.e1e0m.00 is exactly its value times 2^-6 (the subnormal 0.5 included), undone by an exact * 64;
    FP6 likewise (see :func:`_encode`)."""
    if BITS == 4:
        e8 = ((code & 7) << 2) | ((code & 8) << 4)
        val = _cvt_fp8_to_f32(e8.to(tl.uint8), 3) * 64.0
    elif BITS == 6:
        # E2M3 / E3M2 magnitude bits as the low bits of an E4M3 / E5M2 byte: the value times 2^-6 / 2^-12
        e8 = ((code & 0x20) << 2) | (code & 0x1F)
        val = _cvt_fp8_to_f32(e8.to(tl.uint8), MBITS) * (64.0 if MBITS == 3 else 4096.0)
    else:
        tl.static_assert(BITS == 8)
        val = _cvt_fp8_to_f32(code.to(tl.uint8), MBITS)
    fbits = tl.where(sbyte == 0, 0x00400000, tl.where(sbyte == 255, 0x7FC00000, sbyte << 23))
    return val * fbits.to(tl.float32, bitcast=True)


@triton.jit
def _fp6_codes16(w0, w1, w2):
    """The 16 FP6 codes of each 3-word group: w0, w1, w2 [A, B] (int32, the 96-bit little-endian group, code k
    at bit 6k) -> codes [A, B, 16] (int32), all 16 in the thread that holds the words."""
    k = tl.arange(0, 16)[None, None, :]
    u0 = w0.to(tl.uint32, bitcast=True)[:, :, None]
    u1 = w1.to(tl.uint32, bitcast=True)[:, :, None]
    u2 = w2.to(tl.uint32, bitcast=True)[:, :, None]
    src = tl.where(k < 6, u0, tl.where(k < 11, u1, u2))
    sh = tl.where(k < 6, 6 * k, tl.where(k < 11, 6 * k - 32, 6 * k - 64)).to(tl.uint32)
    # codes 5 and 10 straddle two words: their high bits come from the next word's bottom
    hi = tl.where(k == 5, u1 << 2, tl.where(k == 10, u2 << 4, 0))
    return ((src >> sh) | hi).to(tl.int32, bitcast=True) & 0x3F
