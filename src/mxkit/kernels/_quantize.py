"""``@triton.jit`` bodies of the MX quantize / dequantize kernels (launchers: :mod:`mxkit.kernels.quantize`).

Everything that decides a byte is integer work on fp32 bit patterns, or fp32 arithmetic that is exact or
correctly rounded (IEEE fp32 with subnormals, as PTX ``mul.f32`` / ``add.f32`` without ``.ftz`` and numpy
compute it; see DENORM for a compiler that flushes):

* amax = integer max of ``bits & 0x7FFFFFFF`` (order-preserving for non-negative floats; NaN / Inf are the
  patterns >= 0x7F800000, so the non-finite test is the same max).
* scale byte: the rules of :func:`mxkit.formats.shared_exponent` on the amax bits (fp32 denormal amax
  normalised through an exact int -> float conversion of its mantissa).
* element: ``v = |x| * 2^-X`` (exact while v is an fp32 normal; smaller v round to zero anyway), saturated
  at max_normal, then rounded with the "magic number" add ``(v + 2^(e - mbits + 23))``: the fp32 add rounds
  v to the element grid (ulp 2^(e - mbits)) with round-to-nearest-even, and the bit difference of the sum
  and the magic number *is* the number of element ulps. Ties-away adds one where the add rounded a tie down.
  fp32-denormal inputs (bf16 / fp32) only matter when X <= -23, where x * 2^-X is exact as long as the
  multiply keeps subnormal operands (DENORM_NONE, the default). DENORM_BRANCH / DENORM_ALWAYS rebuild v
  from their integer mantissa instead (in tiles with a block at X < -22, found by a CTA-wide min / always):
  same bytes, for a compiler that flushes; the CPU interpreter test runs all three.
* MASKED is False when the tiles divide the tensor: the masks fold to constants and vanish.

Paths selected by the launcher's config (constexprs; the defaults are chosen in
:func:`mxkit.kernels.quantize.quantize_config`):

* HW_CVT (RNE on a GPU; the CPU interpreter cannot run inline asm, so it checks the integer path; the
  identities behind each variant are checked on the CPU in tests/test_kernels.py):
  - FP8: an explicit ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (inline asm, 4 per asm block) of the exact signed
    ``x * 2^-X``: one IEEE RNE rounding from fp32 with the reference's saturation. (An earlier
    ``.to(tl.float8e4nv)`` attempt did not match for FLOOR / RCEIL blocks.)
  - FP4 from bf16 inputs: bf16x2 arithmetic (a magic-number add per pair, _FP4_CODE), :func:`_fp4_bf16x2`;
    FP4_PAIRS (rowwise): bf16 pairs read as 32-bit words and rounded straight into packed bytes, the bad-block
    mask applied inside the asm, :func:`_rows_fp4_pairs`; COL_FP4W (columnwise): pairs of adjacent columns,
    one asm per pair packing both columns' units, with COL_PACKED :func:`_cols_fp4_words`, with COL_UNITS
    :func:`_cols_fp4_units` (the fused FP4 cast-transpose, session 11). The block amax of bf16 pairs:
    :func:`_hmax_abs`.
  - FP6 (rowwise): the FP8 cvt on the FP8 grid that contains the FP6 grid (see :func:`_encode`). FP6P_R /
    FP6P_C (FP6 from bf16, the fused cast-transpose default since session 12): bf16 pairs read as words, the
    amax on pairs, one asm per unit that clamps in bf16x2, scales, rounds and packs (:func:`_fp6_pairs_asm`,
    :func:`_rows_fp6_pairs`, :func:`_cols_fp6_pairs`); FP6_ST4: the rows' group words stored as one
    [groups, rows, 4] tile.
  - FP8_WORDS (FP8, session 10): four codes made and masked as one 32-bit word, the bad-block mask inside the
    cvt asm (rowwise, :func:`_cvt_fp8_rn_keep`) or each unit's word straight from the asm (COL_PACKED 32-bit
    units and COL_UNITS, :func:`_fp8_words`).
* HW_DEC (dequantize, FP8 / FP6 / FP4 on a GPU): hardware FP8 -> fp16 decode, :func:`_decode_hw`. FP4_ASM
  (rowwise FP4 to bf16 / fp16, session 15): each word of 8 codes straight to four bf16 / fp16 pairs, the code
  bits placed in a bf16 and two bf16x2 multiplies (:func:`_fp4_word_decode_asm`; H200 16384^2 185.6 -> 173.9
  us).
* ROW3D (opt-in): the rowwise tile is loaded as [BLOCK_R, BLOCK_C // 32, 32] (no reshapes; same SASS size).
* COL_UNITS (columnwise FP8 / FP6 / MXINT8, the columns of the FP6 cast-transpose): the tile loaded with 2-
  or 4-byte loads so the lanes run along the columns and the warps along the 32-row blocks; each thread packs
  whole units of codes along R and only the packed words are transposed, :func:`_cols_units` (H200, bf16
  16384^2: columnwise FP6 366 -> 250 us, MXINT8 286 -> 245 us, FP8 216 -> 214 us).
* COL_PACKED (columnwise FP4, cast-transpose FP8 / FP4): codes packed into 32-bit (COL_WIDE: 64-bit) words
  along R in-thread from 16-byte loads, only the words transposed, :func:`_cols_packed`.
* COL_DIRECT (the fused FP6 cast-transpose): blocks along R reduced in the untransposed tile, only the 1-byte
  codes transposed.
* GROUP_C: program order in strips of column tiles walked down R (with COL_DIRECT).
* RB: a program walks RB tiles down R (4 for rowwise FP4 / FP6 on large problems: it amortises the
  per-program index arithmetic). SCALE_WORD (opt-in; no gain in the A/B): blocks along R store each column's
  RB scale bytes as one word.
* SCALE_MODE >= 0 (default): the scale rule as a constexpr, so only its arithmetic is emitted (one compile
  per mode); -1 selects the rule at run time from ``scale_mode``.
* FP6_WORDS (rowwise FP6 quantize and dequantize): each thread owns whole 16-element groups, so the
  4-codes-in-3-bytes pack / unpack needs no exchange between threads (H200, bf16 16384^2: quantize 264 ->
  227 us, dequantize 285 -> 279 us). With DO_COL (cast-transpose FP6) the column half reloads the tile.
* SWAP (dequantize with FP6_WORDS, 16-bit outputs): lane pairs swap half groups through ``shfl.sync`` so
  every store writes whole 32-byte sectors (285 -> 220 us), see :func:`_dequant_fp6_words`.
* LAYOUT_PLAIN_T (the launcher's scale_t): column scales written transposed, [R / 32, B * C], so a program's
  bytes of one block row are contiguous; :func:`_transpose_bytes_kernel` moves them into place.

Cast-transpose FP6 runs :func:`_cast_transpose_split_kernel` (one direction per program, same helpers).

Nsight Compute (H200, 8192^2) put L2 at 75-90% of its peak in every kernel, with L2 write sectors 1.5-7x the
bytes written: partial 32-byte-sector stores are the common limit, which SWAP and LAYOUT_PLAIN_T cut.

Inputs are passed as fp32 bits (int32 view), bf16 bits (int16 view) or float16. Outputs are uint8 (FP6
data through an int32 view: 16 codes = 12 bytes = 3 little-endian words).
"""

from __future__ import annotations

import triton
import triton.language as tl

# scale rules (constexpr ints; the launcher maps ScaleMode onto them)
MODE_FLOOR = tl.constexpr(0)
MODE_CEIL = tl.constexpr(1)
MODE_RCEIL = tl.constexpr(2)
MODE_EVEN = tl.constexpr(3)

# input kinds
IN_F32_BITS = tl.constexpr(0)
IN_BF16_BITS = tl.constexpr(1)
IN_F16 = tl.constexpr(2)

# output kinds (dequantize)
OUT_F32 = tl.constexpr(0)
OUT_BF16 = tl.constexpr(1)
OUT_F16 = tl.constexpr(2)

# fp32-denormal inputs (x * 2^-X with x an fp32 denormal): DENORM_NONE multiplies them as they are, exact
# wherever fp32 multiplies keep subnormal operands (PTX mul.f32 without .ftz, which is what Triton emits for
# sm_90; numpy in the interpreter); DENORM_BRANCH / DENORM_ALWAYS rebuild v from the integer mantissa (in
# tiles that need it / always), for a compiler that flushes
DENORM_NONE = tl.constexpr(0)
DENORM_BRANCH = tl.constexpr(1)
DENORM_ALWAYS = tl.constexpr(2)

# load eviction hints (_load_raw)
EVICT_LAST = tl.constexpr(1)
EVICT_FIRST = tl.constexpr(2)

# scale layouts
LAYOUT_PLAIN = tl.constexpr(0)
LAYOUT_NV128X4 = tl.constexpr(1)
LAYOUT_AITER = tl.constexpr(2)
LAYOUT_PLAIN_T = tl.constexpr(3)  # a plain scale stored transposed, [ncols, rows] (cols_p = rows)


@triton.jit
def _load_raw(ptrs, mask, IN_KIND: tl.constexpr, EVICT: tl.constexpr = 0):
    """The input elements as stored (int32 fp32 bits, int16 bf16 bits or float16); masked lanes read +0.
    EVICT: the load's eviction policy in L1 and L2 (0 = default, EVICT_LAST, EVICT_FIRST; Triton's
    eviction_policy, which also sets an L2 cache-hint policy)."""
    other: tl.constexpr = 0.0 if IN_KIND == IN_F16 else 0
    if EVICT == EVICT_LAST:
        return tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_last")
    elif EVICT == EVICT_FIRST:
        return tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
    else:
        return tl.load(ptrs, mask=mask, other=other)


@triton.jit
def _to_bits(raw, IN_KIND: tl.constexpr):
    """fp32 bit patterns (int32) of the raw input elements (exact conversions)."""
    if IN_KIND == IN_F32_BITS:
        return raw
    elif IN_KIND == IN_BF16_BITS:
        # bf16 -> fp32: the 16 bits become the top half (the shift drops the sign-extended upper bits)
        return raw.to(tl.int32) << 16
    else:
        return raw.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def _even_exponent(e, frac, MBITS: tl.constexpr):
    """EVEN rule (Triton / aiter): the amax exponent after adding half an element-ulp to the normalised amax
    bits (a carry into the exponent rounds up); e, frac: unbiased exponent and 23-bit mantissa of the amax."""
    ec = tl.minimum(tl.maximum(e, -126), 127)
    rounded = ((((ec + 127) << 23) | frac) + (1 << (22 - MBITS))) & 0x7F800000
    return ((rounded >> 23) - 127) + (e - ec)


@triton.jit
def _block_scale(amax, scale_mode, MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr,
                 MODE: tl.constexpr = -1):
    """amax bits (int32 >= 0) of each block -> (E8M0 byte, X = byte - 127, 0 for non-finite blocks).
    MODE >= 0: the scale rule as a constexpr (only its arithmetic is emitted); -1: the runtime scale_mode."""
    ef = amax >> 23
    frac = amax & 0x7FFFFF
    # fp32 denormal amax: the int -> float conversion of its mantissa is exact and normal
    fm = frac.to(tl.float32).to(tl.int32, bitcast=True)
    den = ef == 0
    e = tl.where(den, (fm >> 23) - 127 - 149, ef - 127)
    frac = tl.where(den, fm & 0x7FFFFF, frac)
    # CEIL: +1 unless amax is a power of two; RCEIL: amax <= max_normal * 2^X <=> mantissa(amax) <=
    # mantissa(max_normal) once the exponents align
    if MODE < 0:  # the rule as a runtime value (per-block work only; saves a compile per mode)
        up = tl.where(scale_mode == MODE_CEIL, (frac != 0).to(tl.int32),
                      tl.where(scale_mode == MODE_RCEIL, (frac > MAX_FRAC).to(tl.int32), 0))
        x = tl.where(scale_mode == MODE_EVEN, _even_exponent(e, frac, MBITS), e + up)
    elif MODE == MODE_EVEN:
        x = _even_exponent(e, frac, MBITS)
    elif MODE == MODE_CEIL:
        x = e + (frac != 0).to(tl.int32)
    elif MODE == MODE_RCEIL:
        x = e + (frac > MAX_FRAC).to(tl.int32)
    else:
        tl.static_assert(MODE == MODE_FLOOR)
        x = e
    x = tl.minimum(tl.maximum(x - EMAX, -127), 127)
    nonfinite = amax >= 0x7F800000
    byte = tl.where(amax == 0, 0, x + 127)
    byte = tl.where(nonfinite, 255, byte)
    x = tl.where(nonfinite, 0, x)
    return byte, x


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
    selected and repacked (11 ALU instructions per four codes; session 10)."""
    tl.static_assert(MBITS == 3 or MBITS == 2)
    if MBITS == 3:
        asm: tl.constexpr = _FP8X4_KEEP_E4M3
    else:
        asm: tl.constexpr = _FP8X4_KEEP_E5M2
    return tl.inline_asm_elementwise(asm, "=r,r,r,r,r,r,r,r,r", [vbits, keep], dtype=tl.uint8, is_pure=True,
                                     pack=4)


@triton.jit
def _split4(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 4] -> its four [A, B] slices along the last dim (register renames when the 4 are in-thread)."""
    x0, x1 = tl.split(tl.reshape(t, [A, B, 2, 2]))  # x_j[., ., i]: element 2i + j
    e0, e2 = tl.split(x0)
    e1, e3 = tl.split(x1)
    return e0, e1, e2, e3


@triton.jit
def _fp8_words(v, bad, A: tl.constexpr, B: tl.constexpr, MBITS: tl.constexpr):
    """Scaled values v [A, B, 4] (fp32, the exact x * 2^-X; the 4 of a word in one thread's registers) and
    bad [A, B, 4] (int32, nonzero in a NaN / Inf block; a broadcast, so v's layout) -> int32 words [A, B]: the
    four FP8 codes little-endian (element 0 in the low byte), rounded by ``cvt.rn.satfinite`` as in
    :func:`_cvt_fp8_rn`, 0 where bad. One asm and one select per word: the per-code ``tl.where`` on uint8
    codes had every byte unpacked, selected and repacked (11 ALU instructions per word; session 10). bad goes
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
# pipe (session 7: 15, 10 on the ALU pipe; sessions 8-11: 11, 7 with a separate abs before an unsigned add;
# session 12: the fused FP4 cast-transpose 726 -> 662 ALU instructions per thread, H200 16384^2 272.7 -> 268.2
# us). Session 14: the 257 had been mad.hi's addend, which SASS's IMAD.HI takes as the high word of a 64-bit
# register pair, so ptxas re-made the pair {0, 0x01010101} with one or two moves before most of them; as an
# add after the mad.lo (a VIADD) the fused FP4 cast-transpose has 1216 SASS instructions, not 1240 (H200
# 16384^2 261.5 -> 257.8 us; H100 equal; rowwise and columnwise FP4 equal on both). Every
# bf16 bit pattern under every X is checked against mxkit.formats.encode_elements by running this PTX through
# a CPU interpreter (tests/test_kernels.py).
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
def _load_rows8(p, rs, m, EVICT: tl.constexpr = 0):
    """Eight tiles of 32-bit words: at p, p + rs, .., p + 7 * rs (rs: words per input row), masked lanes 0;
    EVICT as in :func:`_load_raw`."""
    return (_load_raw(p, m, IN_F32_BITS, EVICT), _load_raw(p + rs, m, IN_F32_BITS, EVICT),
            _load_raw(p + 2 * rs, m, IN_F32_BITS, EVICT), _load_raw(p + 3 * rs, m, IN_F32_BITS, EVICT),
            _load_raw(p + 4 * rs, m, IN_F32_BITS, EVICT), _load_raw(p + 5 * rs, m, IN_F32_BITS, EVICT),
            _load_raw(p + 6 * rs, m, IN_F32_BITS, EVICT), _load_raw(p + 7 * rs, m, IN_F32_BITS, EVICT))


@triton.jit
def _hmax_abs(a, b):
    """max(|a|, |b|) of each bf16 half of two int32 words (sm_90 ``max.NaN.xorsign.abs.bf16x2``, one ALU
    instruction): the magnitude bits of the larger (exact, subnormals kept: no .ftz; a NaN half gives the
    canonical NaN 0x7FFF, Inf 0x7F80, so the non-finite test stays ``>= 0x7F80``) and a sign bit that is the
    XOR of the two signs, cleared once after the block's last step (:func:`_block_absmax`). A step of the FP4
    amax over bf16 pairs, rowwise (_rows_fp4_pairs) and columnwise (_cols_fp4_words, _cols_fp4_units); it
    replaced a sign mask and a max.u16x2 per word (session 11: rowwise / columnwise FP4 0.3-1% faster, the
    fused FP4 cast-transpose 1.5%). Checked on the GPU against the integer max of the masked halves for every bf16 class
    (tests/test_kernels.py)."""
    return tl.inline_asm_elementwise("max.NaN.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _absmax8(x0, x1, x2, x3, x4, x5, x6, x7):
    """The elementwise max of |x| over eight tiles of bf16 pairs, in each 16-bit half (bf16 bits; sign bits
    not yet cleared: :func:`_hmax_abs`)."""
    return _hmax_abs(_hmax_abs(_hmax_abs(x0, x1), _hmax_abs(x2, x3)), _hmax_abs(_hmax_abs(x4, x5), _hmax_abs(x6, x7)))


@triton.jit
def _block_absmax(am, axis: tl.constexpr):
    """Reduce bf16 pairs (words) or partial maxima of |x| from :func:`_absmax8` along ``axis``: the clean bf16
    magnitude bits of the max in each half."""
    return tl.reduce(am, axis, _hmax_abs) & 0x7FFF7FFF


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
def _cols_fp4_words(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, scale_mode, LAYOUT: tl.constexpr,
                    MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr, MODE: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, WIDE: tl.constexpr):
    """Columnwise FP4 from bf16 (COL_FP4W; GPU only; C even, the input address a multiple of 4): rows r0 ..
    r0 + BLOCK_R, columns c0 .. c0 + BLOCK_C read as 32-bit words (bf16 pairs of adjacent columns: x_ptr is
    the input's int32 view), one [W, BLOCK_C / 2] tile per row j of the J-row units (J = 16 with WIDE, else
    8). One asm per word rounds the J pairs and packs each column's unit (:func:`_fp4_cols_asm`): the asm is
    elementwise over the J row tiles, so any layout gives the same bytes. The amax runs on both halves of the
    words at once (:func:`_hmax_abs`). The packed units are transposed and stored as in :func:`_cols_packed`."""
    J: tl.constexpr = 16 if WIDE else 8
    W: tl.constexpr = BLOCK_R // J
    NB: tl.constexpr = BLOCK_R // 32
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    cw = c0 // 2 + tl.arange(0, H)
    urow = r0 + tl.arange(0, W) * J  # first row of each unit (R is a multiple of 32: whole units in or out)
    m = ((urow < R) | (not MASKED))[:, None] & ((cw < C // 2) | (not MASKED))[None, :]
    p = x32 + (b * R + urow)[:, None] * (C // 2) + cw[None, :]
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m)
    am = _absmax8(x0, x1, x2, x3, x4, x5, x6, x7)
    if WIDE:
        x8, x9, x10, x11, x12, x13, x14, x15 = _load_rows8(p + 8 * rs, rs, m)
        am = _hmax_abs(am, _absmax8(x8, x9, x10, x11, x12, x13, x14, x15))
    else:  # (unused by the 8-row asm)
        x8, x9, x10, x11, x12, x13, x14, x15 = x0, x1, x2, x3, x4, x5, x6, x7
    am = _block_absmax(tl.reshape(am, [NB, W // NB, H]), 1)  # [NB, H]: both columns' block amax
    amax = tl.reshape(tl.join((am & 0xFFFF) << 16, (am >> 16) << 16), [NB, BLOCK_C])  # fp32 bits, per column
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    fe, fo = tl.split(tl.reshape((127 - x) << 7, [NB, H, 2]))
    fw = tl.reshape(tl.broadcast_to((fe | (fo << 16))[:, None, :], [NB, W // NB, H]), [W, H])
    we, wo = _fp4_cols_pack(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, fw, WIDE)
    words = tl.reshape(tl.join(we, wo), [W, BLOCK_C])  # the unit of (w, column c)
    bad = tl.reshape(tl.broadcast_to((amax >= 0x7F800000)[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    words = tl.where(bad, 0, words)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    wcol = r0 // J + tl.arange(0, W)
    wm = cmask[:, None] & ((wcol < R // J) | (not MASKED))[None, :]
    if WIDE:
        q64 = q_ptr.to(tl.pointer_type(tl.int64))  # (rows of R / 2 bytes, a multiple of 16)
        tl.store(q64 + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    else:
        tl.store(q_ptr + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    _store_scales(s_ptr, tl.trans(sbyte.to(tl.uint8)), g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _cols_fp4_units(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, scale_mode, LAYOUT: tl.constexpr,
                    MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr, MODE: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, WIDE: tl.constexpr,
                    EVICT: tl.constexpr = 0):
    """Columnwise FP4 from bf16 with COL_UNITS and COL_FP4W (GPU only; C even, the input address a multiple of
    4): the words of :func:`_cols_fp4_words` (bf16 pairs of adjacent columns, one asm per 8 / 16 rows packing
    both columns' units) in the thread layout of :func:`_cols_units`. The J row tiles are [NB, H, UB] (32-row
    block n, column pair h, unit u of the block), one word per load (``tl.max_contiguous`` 1), so the lanes
    run along the blocks first and then along the pairs: each thread holds every unit of one block of its
    pair (the block amax in-thread, no exchange), and the NB lanes of a pair store its columns' NB pieces of
    16 bytes next to each other, one contiguous 16 * NB-byte piece of each output row per store instruction
    (session 11: a [pairs, units] tile, each lane storing all of its pair's pieces, measured the same: the
    fused kernel's surplus L2 store sectors came from its rows, :func:`_rows_fp4_pairs`). EVICT: the loads'
    eviction policy (CT_EVICT)."""
    J: tl.constexpr = 16 if WIDE else 8
    NB: tl.constexpr = BLOCK_R // 32
    UB: tl.constexpr = 32 // J  # units per block
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, NB)[:, None, None]
    h = tl.arange(0, H)[None, :, None]
    u = tl.arange(0, UB)[None, None, :]
    urow = r0 + n * 32 + u * J  # [NB, 1, UB]: first row of each unit (R is a multiple of 32)
    m = ((urow < R) | (not MASKED)) & ((c0 // 2 + h < C // 2) | (not MASKED))  # [NB, H, UB]
    p = x32 + tl.max_contiguous((b * R + urow) * (C // 2) + c0 // 2 + h, [1, 1, 1])
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m, EVICT)
    am = _absmax8(x0, x1, x2, x3, x4, x5, x6, x7)
    if WIDE:
        x8, x9, x10, x11, x12, x13, x14, x15 = _load_rows8(p + 8 * rs, rs, m, EVICT)
        am = _hmax_abs(am, _absmax8(x8, x9, x10, x11, x12, x13, x14, x15))
    else:  # (unused by the 8-row asm)
        x8, x9, x10, x11, x12, x13, x14, x15 = x0, x1, x2, x3, x4, x5, x6, x7
    am = _block_absmax(am, 2)  # [NB, H]: both columns' block amax
    amax = tl.join((am & 0xFFFF) << 16, (am >> 16) << 16)  # [NB, H, 2]: fp32 bits, column 2h + k
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    fe, fo = tl.split((127 - x) << 7)  # [NB, H]
    fw = tl.broadcast_to((fe | (fo << 16))[:, :, None], [NB, H, UB])
    we, wo = _fp4_cols_pack(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, fw, WIDE)
    be, bo = tl.split(amax >= 0x7F800000)  # [NB, H]
    we = tl.where(tl.broadcast_to(be[:, :, None], [NB, H, UB]), 0, we)
    wo = tl.where(tl.broadcast_to(bo[:, :, None], [NB, H, UB]), 0, wo)
    # output row of the even column of pair h, unit (r0 / J + UB n + u): the UB units of a block start at a
    # multiple of UB (R and r0 are multiples of 32)
    offs = (b * C + c0 + 2 * h) * (R // J) + r0 // J + n * UB + u
    wm = ((c0 // 2 + h < C // 2) | (not MASKED)) & ((r0 + n * 32 < R) | (not MASKED))
    qw = q_ptr.to(tl.pointer_type(tl.int64)) if WIDE else q_ptr  # (rows of R / 2 bytes, a multiple of 16)
    tl.store(qw + tl.multiple_of(tl.max_contiguous(offs, [1, 1, UB]), [1, 1, UB]), we, mask=wm)
    tl.store(qw + tl.multiple_of(tl.max_contiguous(offs + R // J, [1, 1, UB]), [1, 1, UB]), wo, mask=wm)
    c = c0 + tl.arange(0, BLOCK_C)
    sb = tl.reshape(tl.permute(sbyte, [1, 2, 0]), [BLOCK_C, NB])  # [H, 2, NB] -> column 2h + k
    _store_scales(s_ptr, sb, b * C + c, (c < C) | (not MASKED), r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _rows_fp4_pairs(x_ptr, q_ptr, s_ptr, g, gmask, n0, Ltot, cols_p, scale_mode, LAYOUT: tl.constexpr,
                    MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr, MODE: tl.constexpr,
                    A: tl.constexpr, N: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr = 0,
                    BLOCKS_OUTER: tl.constexpr = False):
    """Rowwise FP4 from bf16 (HW_CVT; GPU only): rows g, elements n0 .. n0 + N, loaded as 32-bit words (bf16
    pairs: x_ptr is the int32 view of the input), rounded pair-wise straight into the packed bytes
    (:func:`_fp4_bf16x2_pairs`; the per-element path unpacked its codes to shift and OR them back together).
    Each thread holds the 16 words of a block. The tile is [A, N / 32, 16], or with BLOCKS_OUTER [N / 32, A,
    16]: Triton puts the lanes along the lowest dim first, so on tall tiles (the fused cast-transpose's) the
    first form gives every lane its own row and each store a half sector per lane, the second neighbouring
    blocks of a row to neighbouring lanes (session 11: the fused FP4 cast-transpose's L2 store sectors 1.4x its
    bytes, 3.47 M -> 2.42 M with BLOCKS_OUTER). EVICT: the load's eviction policy (:func:`_load_raw`; the fused cast-transpose,
    CT_EVICT)."""
    if BLOCKS_OUTER:
        wc = n0 // 2 + tl.arange(0, N // 32)[:, None, None] * 16 + tl.arange(0, 16)[None, None, :]  # [N / 32, 1, 16]
        m = gmask[None, :, None] & ((wc < Ltot // 2) | (not MASKED))
        offs = g[None, :, None] * _half_row(Ltot) + wc  # [N / 32, A, 16]
    else:
        wc = n0 // 2 + tl.arange(0, N // 32)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, N / 32, 16]
        m = gmask[:, None, None] & ((wc < Ltot // 2) | (not MASKED))
        offs = g[:, None, None] * _half_row(Ltot) + wc  # [A, N / 32, 16]
    xw = _load_raw(x_ptr + offs, m, IN_F32_BITS, EVICT)
    am = _block_absmax(xw, 2)  # |x| of both halves, the block's max in each half
    amax = tl.maximum(am & 0xFFFF, (am >> 16) & 0xFFFF) << 16  # the fp32 bits of the bf16 amax of each block
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    f = (127 - x) << 7
    fw = tl.broadcast_to((f | (f << 16))[:, :, None], xw.shape)
    keep = tl.broadcast_to(tl.where(amax >= 0x7F800000, 0, -1)[:, :, None], xw.shape)
    packed = _fp4_bf16x2_pairs(xw, fw, keep)
    tl.store(q_ptr + offs, packed, mask=m)
    _store_scales(s_ptr, tl.trans(sbyte) if BLOCKS_OUTER else sbyte, g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)


@triton.jit
def _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED: tl.constexpr):
    """Store FP6 column units: w4 [units, columns, 4] (words 0, 1, 2 and a copy of word 2, which is masked), unit
    the units' indices along R / 16, g the output rows (columns), cmask their mask; q_ptr: int32 words. The 4th
    word's mask is not constant along the 4, so the store's lanes run along (word, unit): a warp writes
    contiguous pieces of an output row (:func:`_cols_units`, :func:`_cols_fp6_pairs`)."""
    j = tl.arange(0, 4)[None, None, :]
    offs = g[None, :, None] * (R // 16 * 3) + (unit * 3)[:, None, None] + j
    wm = ((unit < R // 16) | (not MASKED))[:, None, None] & cmask[None, :, None] & (j < 3)
    tl.store(q_ptr + offs, w4, mask=wm)


@triton.jit
def _store_group_words(q_ptr, w0, w1, w2, wofs, gm, STORE4: tl.constexpr):
    """Store the three words of each 16-code FP6 group ([G, BLOCK_R] tiles; wofs: word offset of word 0, gm:
    the groups' mask). STORE4 (fp6_store4): one [G, BLOCK_R, 4] store of words 0, 1, 2 and a masked copy of
    word 2 (the mask is not constant along the 4, so the 4 go to 4 lanes, then the groups: a warp's store
    covers contiguous pieces of a row); else three stride-3 word stores."""
    if STORE4:
        w4 = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w2)), [w0.shape[0], w0.shape[1], 4])
        j4 = tl.arange(0, 4)[None, None, :]
        tl.store(q_ptr + wofs[:, :, None] + j4, w4, mask=gm[:, :, None] & (j4 < 3))
    else:
        tl.store(q_ptr + wofs, w0, mask=gm)
        tl.store(q_ptr + wofs + 1, w1, mask=gm)
        tl.store(q_ptr + wofs + 2, w2, mask=gm)


@triton.jit
def _fp6_pairs_factor(X, MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr):
    """Per block X (int32, [-127, 126]) -> (fp32 bits of the factor 2^(-X-6) (E2M3) / 2^(-X-12) (E3M2), a
    subnormal for the largest X; bf16 bits of the clamp max_normal * 2^X, +Inf where that overflows bf16:
    no finite bf16 x then exceeds it) of :func:`_fp6_pairs_asm`."""
    e = 127 - X - (6 if MBITS == 3 else 12)
    fac = tl.where(e > 0, e << 23, 1 << (22 + e))
    t = X + EMAX + 127
    clamp = tl.where(t < 255, (t << 7) | (MAX_FRAC >> 16), 0x7F80)
    return fac, clamp


@triton.jit
def _rows_fp6_pairs(x_ptr, q_ptr, s_ptr, grow, rmask, c0, C, cols_p, scale_mode, LAYOUT: tl.constexpr,
                    MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr, MODE: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr = 0,
                    STORE4: tl.constexpr = False):
    """Rowwise FP6 from bf16 pairs (FP6P_R; GPU only; the input address a multiple of 4): rows grow, elements
    c0 .. c0 + BLOCK_C read as 32-bit words (x_ptr: the input's int32 view), two [G, BLOCK_R, 4] word tiles
    per 16-element group (16-byte loads; lanes along the groups first as in :func:`_rows_fp6_words`). The
    block amax on the pairs (:func:`_hmax_abs`), then one asm per group (:func:`_fp6_pairs_asm`: clamp, scale,
    round, pack, mask), elementwise over eight [G, BLOCK_R] word tiles, so any layout gives the same bytes;
    the per-block operands reach the groups by a broadcast (a join / permute / reshape gave them a layout
    with two lanes per group, and Triton ran the asm in that layout: twice the work). Stores as
    :func:`_rows_fp6_words` (STORE4: one [G, BLOCK_R, 4] store). q_ptr: int32 words."""
    G: tl.constexpr = BLOCK_C // 16
    gi = c0 // 16 + tl.arange(0, G)
    gm = ((gi < C // 16) | (not MASKED))[:, None] & rmask[None, :]  # [G, BLOCK_R]
    e = tl.arange(0, 4)[None, None, :]
    wp = x_ptr + (grow[None, :] * (C // 2) + (gi * 8)[:, None])[:, :, None] + e
    xl = _load_raw(wp, gm[:, :, None], IN_F32_BITS, EVICT)  # [G, BLOCK_R, 4]: words 0-3 of each group (16 bytes)
    xh = _load_raw(wp + 4, gm[:, :, None], IN_F32_BITS, EVICT)  # words 4-7
    gmax = _block_absmax(_hmax_abs(xl, xh), 2)  # [G, BLOCK_R]: each group's max |x| in each half
    bm = tl.reduce(tl.reshape(gmax, [G // 2, 2, BLOCK_R]), 1, _hmax_abs)  # blocks: [G // 2, BLOCK_R]
    amax = tl.maximum(bm & 0xFFFF, bm >> 16) << 16  # fp32 bits of the bf16 amax
    sbyte, X = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    fac, clamp = _fp6_pairs_factor(X, MBITS, EMAX, MAX_FRAC)
    keep = tl.where(amax >= 0x7F800000, 0, -1)
    # back to groups (group gi takes block gi // 2) by a broadcast, which keeps the groups' layout (a join /
    # permute / reshape gave a layout with two lanes per group, and Triton ran the asm on that: 2x the work)
    facg = tl.reshape(tl.broadcast_to(fac[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    clampg = tl.reshape(tl.broadcast_to(clamp[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    keepg = tl.reshape(tl.broadcast_to(keep[:, None, :], [G // 2, 2, BLOCK_R]), [G, BLOCK_R])
    x0, x1, x2, x3 = _split4(xl, G, BLOCK_R)
    x4, x5, x6, x7 = _split4(xh, G, BLOCK_R)
    w0, w1, w2 = tl.inline_asm_elementwise(
        FP6_PAIRS_ROWS_E2M3 if MBITS == 3 else FP6_PAIRS_ROWS_E3M2, FP6_PAIRS_ROWS_RW,
        [x0, x1, x2, x3, x4, x5, x6, x7, facg, clampg | (clampg << 16), keepg], dtype=(tl.int32, tl.int32, tl.int32),
        is_pure=True, pack=1)
    _store_group_words(q_ptr, w0, w1, w2, grow[None, :] * (C // 16 * 3) + gi[:, None] * 3, gm, STORE4)
    _store_scales(s_ptr, tl.trans(sbyte), grow, rmask, c0, C, cols_p, BLOCK_C, LAYOUT, MASKED)


@triton.jit
def _cols_fp6_pairs(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, scale_mode, LAYOUT: tl.constexpr,
                    MBITS: tl.constexpr, EMAX: tl.constexpr, MAX_FRAC: tl.constexpr, MODE: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr = 0):
    """Columnwise FP6 from bf16 pairs of adjacent columns (FP6P_C; GPU only; C even, the input address a
    multiple of 4), in the thread layout of :func:`_cols_fp4_units`: 16 row tiles [NB, H, 2] of words (32-row
    block n, column pair h, 16-row unit u), one word per load, so each thread holds both units of one block
    of its pair and the amax is in-thread (:func:`_hmax_abs`, both columns at once). One asm per unit pair
    (:func:`_fp6_pairs_asm`, elementwise over the 16 tiles) makes both columns' three words; the words are
    stored as :func:`_cols_units` stores its FP6 units (one [units, columns, 4] store). q_ptr: int32 words."""
    NB: tl.constexpr = BLOCK_R // 32
    H: tl.constexpr = BLOCK_C // 2
    x32 = x_ptr.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, NB)[:, None, None]
    h = tl.arange(0, H)[None, :, None]
    u = tl.arange(0, 2)[None, None, :]
    urow = r0 + n * 32 + u * 16  # [NB, 1, 2]: first row of each unit (R is a multiple of 32)
    m = ((urow < R) | (not MASKED)) & ((c0 // 2 + h < C // 2) | (not MASKED))  # [NB, H, 2]
    p = x32 + tl.max_contiguous((b * R + urow) * (C // 2) + c0 // 2 + h, [1, 1, 1])
    rs = C // 2  # words per input row
    x0, x1, x2, x3, x4, x5, x6, x7 = _load_rows8(p, rs, m, EVICT)
    x8, x9, x10, x11, x12, x13, x14, x15 = _load_rows8(p + 8 * rs, rs, m, EVICT)
    am = _hmax_abs(_absmax8(x0, x1, x2, x3, x4, x5, x6, x7), _absmax8(x8, x9, x10, x11, x12, x13, x14, x15))
    am = _block_absmax(am, 2)  # [NB, H]: both columns' block amax
    amax = tl.join((am & 0xFFFF) << 16, (am >> 16) << 16)  # [NB, H, 2]: fp32 bits, column 2h + k
    sbyte, X = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    fac, clamp = _fp6_pairs_factor(X, MBITS, EMAX, MAX_FRAC)
    fe, fo = tl.split(fac)
    ce, co = tl.split(clamp)
    ke, ko = tl.split(tl.where(amax >= 0x7F800000, 0, -1))
    w0e, w1e, w2e, w0o, w1o, w2o = tl.inline_asm_elementwise(
        FP6_PAIRS_COLS_E2M3 if MBITS == 3 else FP6_PAIRS_COLS_E3M2, FP6_PAIRS_COLS_RW,
        [x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
         tl.broadcast_to(fe[:, :, None], [NB, H, 2]), tl.broadcast_to(fo[:, :, None], [NB, H, 2]),
         tl.broadcast_to((ce | (co << 16))[:, :, None], [NB, H, 2]), tl.broadcast_to(ke[:, :, None], [NB, H, 2]),
         tl.broadcast_to(ko[:, :, None], [NB, H, 2])],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    # per column: [NB, H, 2 (u), 2 (parity)] -> [units (n, u), columns (h, parity)]
    W0 = tl.reshape(tl.permute(tl.join(w0e, w0o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    W1 = tl.reshape(tl.permute(tl.join(w1e, w1o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    W2 = tl.reshape(tl.permute(tl.join(w2e, w2o), [0, 2, 1, 3]), [NB * 2, BLOCK_C])
    w4 = tl.reshape(tl.join(tl.join(W0, W2), tl.join(W1, W2)), [NB * 2, BLOCK_C, 4])
    unit = r0 // 16 + tl.arange(0, NB * 2)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED)
    sb = tl.reshape(tl.permute(sbyte, [1, 2, 0]), [BLOCK_C, NB])  # [H, 2, NB] -> column 2h + k
    _store_scales(s_ptr, sb, g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _scaled(xbits, X, DENORM: tl.constexpr):
    """The exact signed v = x * 2^-X (fp32) of fp32 bits x, X in [-127, 126] broadcast to their shape. DENORM:
    fp32-denormal x as the exact float(m) * 2^(-149 - X) (as in the integer path of _encode); the sign goes on
    with an OR (a float negation would turn -0 into +0)."""
    v = xbits.to(tl.float32, bitcast=True) * ((127 - X) << 23).to(tl.float32, bitcast=True)
    if DENORM:
        ad = xbits & 0x7FFFFFFF
        vd = (ad.to(tl.float32)
              * ((127 + tl.maximum(-149 - X, -126)) << 23).to(tl.float32, bitcast=True))
        vdb = vd.to(tl.int32, bitcast=True) | (xbits & -2147483648)
        v = tl.where((ad >> 23) == 0, vdb, v.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
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
        words, fa, fb, m, keeps, n_units = [f"${6 + j}" for j in range(16)], "$22", "$23", "$24", ("$25", "$26"), 2
    else:
        words, fa, fb, m, keeps, n_units = [f"${3 + j}" for j in range(8)], "$11", "$11", "$12", ("$13",), 1

    def scaled(word, lo, hi):  # the word's two clamped, scaled halves -> f32 registers lo, hi
        return [f"min.xorsign.abs.bf16x2 y, {word}, {m};", f"shl.b32 s, y, 16;", "and.b32 y, y, 0xFFFF0000;",
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


FP6_UNITS_E2M3_1 = tl.constexpr(_fp6_units_asm(3, 1, 16))
FP6_UNITS_E2M3_2 = tl.constexpr(_fp6_units_asm(3, 2, 32))
FP6_UNITS_E3M2_1 = tl.constexpr(_fp6_units_asm(2, 1, 16))
FP6_UNITS_E3M2_2 = tl.constexpr(_fp6_units_asm(2, 2, 32))
FP6_HALVES_E2M3 = tl.constexpr(_fp6_units_asm(3, 1, 8))
FP6_HALVES_E3M2 = tl.constexpr(_fp6_units_asm(2, 1, 8))
FP6_UNITS_RW_1 = tl.constexpr(",".join(["=r"] * 16 + ["r"] * 16))
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
def _fp6_units_hw(vbits, MBITS: tl.constexpr, VEC: tl.constexpr):
    """:func:`_fp6_units_asm` on vbits [..., 16 (j), U, VEC] (fp32 bits of the scaled elements, registers in
    (v, j, u) order): the same shape of int32, word k of a unit at j = k (k < 3), the rest unset."""
    tl.static_assert((VEC == 1 or VEC == 2) and (MBITS == 2 or MBITS == 3))
    if VEC == 1:
        o = tl.inline_asm_elementwise(FP6_UNITS_E2M3_1 if MBITS == 3 else FP6_UNITS_E3M2_1, FP6_UNITS_RW_1, [vbits],
                                      dtype=tl.int32, is_pure=True, pack=16)
    else:
        o = tl.inline_asm_elementwise(FP6_UNITS_E2M3_2 if MBITS == 3 else FP6_UNITS_E3M2_2, FP6_UNITS_RW_2, [vbits],
                                      dtype=tl.int32, is_pure=True, pack=32)
    return o


@triton.jit
def _fp6_asm_input(xbits, X, DENORM: tl.constexpr, MBITS: tl.constexpr):
    """The unit asms' inputs: fp32 bits of x * 2^-X * 2^-6 (E2M3) / 2^-12 (E3M2), exact (see _encode); no
    clamp (the asm saturates on the cvt bytes); a DENORM policy other than none rebuilds every fp32-denormal
    input (same bytes)."""
    v = _scaled(xbits, X, DENORM != DENORM_NONE) * (0.015625 if MBITS == 3 else 0.000244140625)
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
            DENORM: tl.constexpr, HW_CVT: tl.constexpr = False, KEEP_ASM: tl.constexpr = False):
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
        v = _scaled(xbits, X, DENORM)
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
        if DENORM:
            # fp32-denormal x = m * 2^-149: scale the exact float(m) instead (no denormal operand anywhere);
            # when -149 - X < -126 the true v is < 2^-103 and rounds to zero, as m * 2^-126 does
            vd = (abits.to(tl.float32)
                  * ((127 + tl.maximum(-149 - X, -126)) << 23).to(tl.float32, bitcast=True))
            v = tl.where((abits >> 23) == 0, vd, v)
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
def _encode_tile(b3, xb, x, bad, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                 IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, AWAY: tl.constexpr, DENORM: tl.constexpr,
                 HW_CVT: tl.constexpr, KEEP_ASM: tl.constexpr = False):
    """_encode of a tile with the DENORM policy applied: x is the 2-D tile of block exponents (xb broadcast)."""
    if DENORM == DENORM_BRANCH:
        if tl.min(tl.min(x, axis=1), axis=0) < -22:  # uniform branch: a block needs fp32-denormal inputs
            codes = _encode(b3, xb, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, True, HW_CVT, KEEP_ASM)
        else:
            codes = _encode(b3, xb, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, False, HW_CVT, KEEP_ASM)
    else:
        codes = _encode(b3, xb, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, DENORM == DENORM_ALWAYS,
                        HW_CVT, KEEP_ASM)
    return codes


@triton.jit
def _quantize_rows(xbits, BR: tl.constexpr, BC: tl.constexpr,
                   BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                   IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
                   scale_mode, AWAY: tl.constexpr, DENORM: tl.constexpr, HW_CVT: tl.constexpr = False,
                   IS3D: tl.constexpr = False, RAW16: tl.constexpr = False, MODE: tl.constexpr = -1,
                   KEEP_ASM: tl.constexpr = False):
    """[BR, BC] fp32 bits, blocks of 32 along the last dim -> (codes [BR, BC], scale bytes [BR, BC // 32]).
    IS3D: xbits is already [BR, BC // 32, 32] and the codes come back in that shape (no reshapes).
    RAW16 (FP4 through bf16x2 only): xbits are the bf16 bits themselves (int16). KEEP_ASM: see :func:`_encode`."""
    tl.static_assert(BC % 32 == 0)
    if IS3D:
        b3 = xbits
    else:
        b3 = tl.reshape(xbits, [BR, BC // 32, 32])
    if RAW16:
        tl.static_assert(HW_CVT and BITS == 4)
        amax = tl.max(b3 & 0x7FFF, axis=2).to(tl.int32) << 16  # the fp32 bits of the bf16 amax
    else:
        amax = tl.max(b3 & 0x7FFFFFFF, axis=2)
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    bad = tl.expand_dims(amax >= 0x7F800000, 2)
    xb = tl.expand_dims(x, 2)
    codes = _encode_tile(b3, xb, x, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, DENORM, HW_CVT, KEEP_ASM)
    if not IS3D:
        codes = tl.reshape(codes, [BR, BC])
    return codes, sbyte


@triton.jit
def _quantize_cols(xbits, BR: tl.constexpr, BC: tl.constexpr,
                   BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                   IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
                   scale_mode, AWAY: tl.constexpr, DENORM: tl.constexpr, HW_CVT: tl.constexpr,
                   MODE: tl.constexpr = -1):
    """[BR, BC] fp32 bits, blocks of 32 along dim 0 (no transpose) -> (codes [BR // 32, 32, BC],
    scale bytes [BR // 32, BC])."""
    tl.static_assert(BR % 32 == 0)
    b3 = tl.reshape(xbits, [BR // 32, 32, BC])
    amax = tl.max(b3 & 0x7FFFFFFF, axis=1)
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    bad = tl.expand_dims(amax >= 0x7F800000, 1)
    xb = tl.expand_dims(x, 1)
    codes = _encode_tile(b3, xb, x, bad, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, DENORM, HW_CVT)
    return codes, sbyte


@triton.jit
def _half_row(L):
    """Bytes per FP4 row of a quantized dim of length L: L is a multiple of the block (32), so L / 2 is a
    multiple of 16. Said explicitly: Triton's specialisation only knows L % 16 == 0, hence L / 2 % 8, which
    limited FP4 row accesses to 8-byte vectors."""
    return tl.multiple_of(L // 2, 16)


@triton.jit
def _deinterleave(x, A: tl.constexpr, N: tl.constexpr):
    """[A, N] -> (even columns, odd columns), each [A, N // 2]."""
    return tl.split(tl.reshape(x, [A, N // 2, 2]))


@triton.jit
def _interleave(a, b, A: tl.constexpr, N: tl.constexpr):
    """two [A, N] -> [A, 2N] with a in the even columns."""
    return tl.reshape(tl.join(a, b), [A, 2 * N])


@triton.jit
def _scale_offsets(row, col, ncols, cols_p, LAYOUT: tl.constexpr):
    """Byte offsets of scale (row, col) in a plain (rows, ncols) scale or a swizzled one whose padded
    width is cols_p (offsets as in :func:`mxkit.layouts.to_layout`).

    nvidia_128x4: 512-byte tiles in row-major order over (rows_p / 128, cols_p / 4); inside a tile (r, c)
    sits at (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4 (cuBLAS "1D block scaling factors layout").
    aiter_shuffle: 32 x 8 blocks of 256 bytes, each word holds rows (r, r + 16) x cols (c, c + 4)."""
    r = row[:, None]
    c = col[None, :]
    if LAYOUT == LAYOUT_PLAIN:
        return r * ncols + c
    elif LAYOUT == LAYOUT_PLAIN_T:  # (cols_p: the number of rows)
        return c * cols_p + r
    elif LAYOUT == LAYOUT_NV128X4:
        return ((r // 128) * (cols_p // 4) + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + (c % 4)
    else:
        tl.static_assert(LAYOUT == LAYOUT_AITER)
        return ((r // 32) * 32 * cols_p + (c // 8) * 256 + (c % 4) * 64 + (r % 16) * 4
                + ((c // 4) % 2) * 2 + ((r // 16) % 2))


@triton.jit
def _store_quantized(q_ptr, s_ptr, codes, sbyte, g, gmask, n0, Ltot, cols_p,
                     A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr,
                     MASKED: tl.constexpr, STORE_SCALES: tl.constexpr = True):
    """Pack codes [A, N] (rows g, elements n0 .. n0+N of a quantized dim of length Ltot) and store them with
    their scale bytes [A, N // 32] (unless STORE_SCALES is False: the caller stores them). FP6 goes through
    an int32 view of qdata (q_ptr points to int32)."""
    cols = n0 + tl.arange(0, N)
    cmask = (cols < Ltot) | (not MASKED)
    if BITS == 8:
        offs = g[:, None] * Ltot + cols[None, :]
        tl.store(q_ptr + offs, codes.to(tl.uint8), mask=gmask[:, None] & cmask[None, :])
    elif BITS == 4:
        # element 2i in the low nibble: disjoint bit fields, so the sum over the pair is their OR
        sh = tl.arange(0, 2) * 4
        packed = tl.sum(tl.reshape(codes, [A, N // 2, 2]) << sh[None, None, :], axis=2)
        bcols = n0 // 2 + tl.arange(0, N // 2)
        offs = g[:, None] * _half_row(Ltot) + bcols[None, :]
        tl.store(q_ptr + offs, packed.to(tl.uint8), mask=gmask[:, None] & ((bcols < Ltot // 2) | (not MASKED))[None, :])
    else:
        tl.static_assert(BITS == 6)
        tl.static_assert(N % 16 == 0)
        # four 6-bit codes -> one 24-bit group a | b<<6 | c<<12 | d<<18 (sum of disjoint fields = OR)
        sh = tl.arange(0, 4) * 6
        grp = tl.sum(tl.reshape(codes, [A, N // 4, 4]) << sh[None, None, :], axis=2)
        # four groups (96 bits, little-endian) -> words j = 0, 1, 2 (j = 3 is not stored): group k sits at
        # bit 24k, so it lands in word j shifted by 24k - 32j (left if >= 0, right otherwise)
        g4 = tl.reshape(grp, [A, N // 16, 1, 4])
        kk = tl.arange(0, 4)[None, :]
        jj = tl.arange(0, 4)[:, None]
        shift = 24 * kk - 32 * jj  # [4 (j), 4 (k)]
        lsh = tl.where((shift >= 0) & (shift < 32), shift, 0)
        rsh = tl.where((shift < 0) & (shift > -24), -shift, 0)
        part = tl.where((shift >= 0) & (shift < 32), g4 << lsh[None, None, :, :],
                        tl.where((shift < 0) & (shift > -24), g4 >> rsh[None, None, :, :], 0))
        words = tl.sum(part, axis=3)  # [A, N // 16, 4]
        wcols = n0 // 16 + tl.arange(0, N // 16)
        offs = (g[:, None, None] * (Ltot // 16 * 3) + wcols[None, :, None] * 3
                + tl.arange(0, 4)[None, None, :])
        m = (gmask[:, None, None] & ((wcols < Ltot // 16) | (not MASKED))[None, :, None]
             & (tl.arange(0, 4) < 3)[None, None, :])
        tl.store(q_ptr + offs, words, mask=m)
    if STORE_SCALES:
        _store_scales(s_ptr, sbyte, g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)


@triton.jit
def _store_scales(s_ptr, sbyte, g, gmask, n0, Ltot, cols_p, N: tl.constexpr, LAYOUT: tl.constexpr,
                  MASKED: tl.constexpr):
    """Scale bytes [A, N // 32] of rows g, blocks n0 // 32 .. of a quantized dim of length Ltot."""
    scols = n0 // 32 + tl.arange(0, N // 32)
    soffs = _scale_offsets(g, scols, Ltot // 32, cols_p, LAYOUT)
    tl.store(s_ptr + soffs, sbyte.to(tl.uint8), mask=gmask[:, None] & ((scols < Ltot // 32) | (not MASKED))[None, :])


@triton.jit
def _store_rows3d(q_ptr, s_ptr, codes, sbyte, g, gmask, n0, Ltot, cols_p,
                  A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr,
                  MASKED: tl.constexpr):
    """Like _store_quantized for codes [A, N // 32, 32] (the 3-D rowwise tile): FP8 / FP4 are packed and
    stored in that shape (no reshape to 2-D); FP6 goes through the 2-D path."""
    if BITS == 6:
        _store_quantized(q_ptr, s_ptr, tl.reshape(codes, [A, N]), sbyte, g, gmask, n0, Ltot, cols_p,
                         A, N, BITS, LAYOUT, MASKED)
    else:
        j = tl.arange(0, N // 32)[None, :, None]
        if BITS == 8:
            cols = n0 + j * 32 + tl.arange(0, 32)[None, None, :]
            m = gmask[:, None, None] & ((cols < Ltot) | (not MASKED))
            tl.store(q_ptr + g[:, None, None] * Ltot + cols, codes.to(tl.uint8), mask=m)
        else:
            tl.static_assert(BITS == 4)
            sh = tl.arange(0, 2) * 4
            packed = tl.sum(tl.reshape(codes, [A, N // 32, 16, 2]) << sh[None, None, None, :], axis=3)
            bcols = n0 // 2 + j * 16 + tl.arange(0, 16)[None, None, :]
            m = gmask[:, None, None] & ((bcols < Ltot // 2) | (not MASKED))
            tl.store(q_ptr + g[:, None, None] * _half_row(Ltot) + bcols, packed.to(tl.uint8), mask=m)
        _store_scales(s_ptr, sbyte, g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)


@triton.jit
def _store_cols_direct(q_ptr, s_ptr, codes, sbyte, g, gmask, n0, Ltot, cols_p,
                       A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr, LAYOUT: tl.constexpr,
                       MASKED: tl.constexpr, STORE_SCALES: tl.constexpr = True):
    """Store codes [N // 32, 32, A] / scale bytes [N // 32, A] quantized along dim 0 of the raw tile as the
    transposed rows g (A of them) x elements n0 .. n0 + N: only the (packed) 1-byte codes are transposed."""
    if BITS == 4:
        # pack element pairs along the quantized dim first: half the bytes go through the transpose
        sh = tl.arange(0, 2) * 4
        packed = tl.sum(tl.reshape(codes, [N // 2, 2, A]) << sh[None, :, None], axis=1).to(tl.uint8)
        pt = tl.trans(packed)  # [A, N // 2]
        bcols = n0 // 2 + tl.arange(0, N // 2)
        offs = g[:, None] * _half_row(Ltot) + bcols[None, :]
        tl.store(q_ptr + offs, pt, mask=gmask[:, None] & ((bcols < Ltot // 2) | (not MASKED))[None, :])
        if STORE_SCALES:
            _store_scales(s_ptr, tl.trans(sbyte.to(tl.uint8)), g, gmask, n0, Ltot, cols_p, N, LAYOUT, MASKED)
    else:
        ct = tl.trans(tl.reshape(codes.to(tl.uint8), [N, A]))
        if BITS == 6:
            ct = ct.to(tl.int32)
        _store_quantized(q_ptr, s_ptr, ct, tl.trans(sbyte.to(tl.uint8)), g, gmask, n0, Ltot, cols_p,
                         A, N, BITS, LAYOUT, MASKED, STORE_SCALES)


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
def _rows_fp6_words(x_ptr, q_ptr, s_ptr, grow, rmask, c0, C, cols_p, scale_mode, IN_KIND: tl.constexpr,
                    LAYOUT: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                    MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, AWAY: tl.constexpr, DENORM: tl.constexpr,
                    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr,
                    HW_CVT: tl.constexpr = False, UNIT_ASM: tl.constexpr = False, EVICT: tl.constexpr = 0,
                    STORE4: tl.constexpr = False):
    """FP6_WORDS (rowwise FP6 quantize): rows grow, elements c0 .. c0 + BLOCK_C, with each thread holding whole
    16-element groups (two 8-element loads over a [groups, rows, 8] tile: lanes go along the groups, the lower
    of the equally contiguous dims), so the 4-codes-in-3-bytes pack needs no exchange: the thread writes its
    group's 3 words itself (three strided word stores). A 32-element block is two neighbouring lanes (one
    shuffle for the amax). q_ptr: int32 words. EVICT: the loads' eviction policy (the fused cast-transpose,
    CT_EVICT)."""
    G: tl.constexpr = BLOCK_C // 16
    gi = c0 // 16 + tl.arange(0, G)
    gm = ((gi < C // 16) | (not MASKED))[:, None] & rmask[None, :]  # [G, BLOCK_R]
    base = grow[None, :] * C + (gi * 16)[:, None]
    e = tl.arange(0, 8)[None, None, :]
    lo = _to_bits(_load_raw(x_ptr + base[:, :, None] + e, gm[:, :, None], IN_KIND, EVICT), IN_KIND)
    hi = _to_bits(_load_raw(x_ptr + base[:, :, None] + 8 + e, gm[:, :, None], IN_KIND, EVICT), IN_KIND)
    gmax = tl.maximum(tl.max(lo & 0x7FFFFFFF, axis=2), tl.max(hi & 0x7FFFFFFF, axis=2))  # [G, BLOCK_R]
    amax = tl.max(tl.reshape(gmax, [G // 2, 2, BLOCK_R]), axis=1)  # blocks of 32: [G // 2, BLOCK_R]
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    # back to groups: group gi takes block gi // 2
    xg = tl.reshape(tl.permute(tl.join(x, x), [0, 2, 1]), [G, BLOCK_R])
    badg = tl.reshape(tl.permute(tl.join(amax, amax), [0, 2, 1]), [G, BLOCK_R]) >= 0x7F800000
    if UNIT_ASM:
        # the unit asm on the two halves as loaded (8 consecutive registers each; no clamp, see _cols_units)
        tl.static_assert(HW_CVT and not AWAY)
        vlo = _fp6_asm_input(lo, xg[:, :, None], DENORM, MBITS)
        vhi = _fp6_asm_input(hi, xg[:, :, None], DENORM, MBITS)
        o = tl.inline_asm_elementwise(FP6_HALVES_E2M3 if MBITS == 3 else FP6_HALVES_E3M2, FP6_HALVES_RW, [vlo, vhi],
                                      dtype=tl.int32, is_pure=True, pack=8)
        w0, w1, w2 = _fp6_asm_words(o, e, badg, 2)
    else:
        bits = tl.reshape(tl.permute(tl.join(lo, hi), [0, 1, 3, 2]), [G, BLOCK_R, 16])  # element h * 8 + e
        codes = _encode_tile(bits, xg[:, :, None], xg, badg[:, :, None], 6, MBITS, EMIN, EMAX, False, MAX_NORMAL,
                             AWAY, DENORM, HW_CVT).to(tl.int32)  # [G, BLOCK_R, 16]
        w0, w1, w2 = _fp6_unit_words(codes)
    _store_group_words(q_ptr, w0, w1, w2, grow[None, :] * (C // 16 * 3) + gi[:, None] * 3, gm, STORE4)
    _store_scales(s_ptr, tl.trans(sbyte), grow, rmask, c0, C, cols_p, BLOCK_C, LAYOUT, MASKED)


@triton.jit
def _cols_packed(x_ptr, q_ptr, s_ptr, b, r0, c, cmask, R, C, cols_p, scale_mode, IN_KIND: tl.constexpr,
                 LAYOUT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                 EMAX: tl.constexpr, IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
                 AWAY: tl.constexpr, DENORM: tl.constexpr, HW_CVT: tl.constexpr, MODE: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MASKED: tl.constexpr, WIDE: tl.constexpr = False,
                 FP8W: tl.constexpr = False):
    """COL_PACKED (blocks along R): rows r0 .. r0 + BLOCK_R, columns c, with the codes packed into 32-bit words
    before the transpose (WIDE, FP8 / MXINT8 / FP4: 8 / 16 codes into one 64-bit word, half the transposed
    elements). The tile is loaded as [W, J, BLOCK_C], element (w, j, c) at row r0 + J * w + j, where
    J codes make one packed unit (FP8 / MXINT8: 4 codes = 1 word, FP4: 8 = 1 word, FP6: 16 = 3 words).
    Triton's load layout gives threads to the contiguous dim (c), then to the lower of the equally
    contiguous dims (w), so a tile wide enough to use up the warp's lanes on (c, w) leaves the J codes of a
    unit in one thread's registers: packing needs no exchange, and only the packed words are transposed (the
    1-byte code transpose of COL_DIRECT had shared-memory bank conflicts, the raw transpose 2-4 bytes per
    element). Any layout gives the same bytes; only the speed depends on it. FP8W (FP8 with HW_CVT, 32-bit
    units): each unit's word straight from :func:`_fp8_words`. q_ptr: int32 words."""
    tl.static_assert(not WIDE or BITS == 8 or BITS == 4)
    tl.static_assert(not FP8W or (BITS == 8 and HW_CVT and not WIDE))
    J: tl.constexpr = 16 if BITS == 6 else (64 if WIDE else 32) // BITS
    W: tl.constexpr = BLOCK_R // J
    NB: tl.constexpr = BLOCK_R // 32
    rows = r0 + tl.arange(0, W)[:, None, None] * J + tl.arange(0, J)[None, :, None]  # [W, J, 1]
    m = ((rows < R) | (not MASKED)) & cmask[None, None, :]
    raw = _load_raw(x_ptr + (b * R + rows) * C + c[None, None, :], m, IN_KIND)
    if HW_CVT and BITS == 4 and IN_KIND == IN_BF16_BITS:
        # FP4 through bf16x2 (RAW16): the bf16 bits go to the rounding as loaded; the amax on 16 bits
        bits = raw
        amax = tl.max(tl.reshape(tl.max(raw & 0x7FFF, axis=1), [NB, W // NB, BLOCK_C]), axis=1).to(tl.int32) << 16
    else:
        bits = _to_bits(raw, IN_KIND)
        amax = tl.max(tl.reshape(tl.max(bits & 0x7FFFFFFF, axis=1), [NB, W // NB, BLOCK_C]), axis=1)  # [NB, BC]
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    xw = tl.reshape(tl.broadcast_to(x[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    badw = tl.reshape(tl.broadcast_to((amax >= 0x7F800000)[:, None, :], [NB, W // NB, BLOCK_C]), [W, BLOCK_C])
    g = b * C + c  # output rows
    if FP8W:
        bad = tl.broadcast_to(badw.to(tl.int32)[:, None, :], [W, J, BLOCK_C])
        words = _fp8_words(tl.permute(_scaled(bits, xw[:, None, :], DENORM), [0, 2, 1]), tl.permute(bad, [0, 2, 1]),
                           W, BLOCK_C, MBITS)  # [W, BC]
    else:
        codes = _encode_tile(bits, xw[:, None, :], xw, badw[:, None, :], BITS, MBITS, EMIN, EMAX, IS_INT,
                             MAX_NORMAL, AWAY, DENORM, HW_CVT).to(tl.int32)  # [W, J, BC]
        if not (HW_CVT and BITS == 4):  # (the bf16x2 codes are 4 bits: finite inputs give 0..15, bad blocks 0)
            codes = codes & ((1 << BITS) - 1)
    if BITS == 6:
        w0, w1, w2 = _fp6_unit_words(tl.permute(codes, [0, 2, 1]))
        # the unit's words as [BC, W, 4] (word 3 repeats word 2 and is not stored): one layout conversion, then
        # the store's lanes run along (word, unit), so with W >= 8 (BLOCK_R >= 128) a warp writes 8 units = 96
        # contiguous bytes = 3 whole 32-byte sectors of an output row per instruction (three separate word
        # stores, or 32-row tiles, wrote 12-byte-strided or 24-byte pieces: partial sectors)
        w4 = tl.permute(tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w2)), [W, BLOCK_C, 4]), [1, 0, 2])
        wcol = r0 // 16 + tl.arange(0, W)
        j = tl.arange(0, 4)[None, None, :]
        offs = g[:, None, None] * (R // 16 * 3) + (wcol * 3)[None, :, None] + j
        wm = cmask[:, None, None] & ((wcol < R // 16) | (not MASKED))[None, :, None] & (j < 3)
        tl.store(q_ptr + offs, w4, mask=wm)
    else:
        # disjoint bit fields: the sum over the unit is their OR (the top field may set the sign bit)
        wcol = r0 // J + tl.arange(0, W)
        wm = cmask[:, None] & ((wcol < R // J) | (not MASKED))[None, :]
        if WIDE:
            # two 32-bit halves packed as usual, then joined (64-bit shifts per code cost twice the 32-bit ones)
            kh = tl.arange(0, J // 2)[None, None, :, None]
            halves = tl.sum(tl.reshape(codes, [W, 2, J // 2, BLOCK_C]) << (kh * BITS), axis=2)  # [W, 2, BC]
            lo, hi = tl.split(tl.permute(halves, [0, 2, 1]))
            words = (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)  # [W, BC]
            q64 = q_ptr.to(tl.pointer_type(tl.int64))  # (rows of R * BITS / 8 bytes, a multiple of 16)
            tl.store(q64 + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
        else:
            if not FP8W:
                words = tl.sum(codes << (tl.arange(0, J)[None, :, None] * BITS), axis=1)  # [W, BC]
            tl.store(q_ptr + g[:, None] * (R // J) + wcol[None, :], tl.trans(words), mask=wm)
    _store_scales(s_ptr, tl.trans(sbyte.to(tl.uint8)), g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _cols_units(x_ptr, q_ptr, s_ptr, b, r0, c0, R, C, cols_p, scale_mode, IN_KIND: tl.constexpr, LAYOUT: tl.constexpr,
                BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, IS_INT: tl.constexpr,
                MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, AWAY: tl.constexpr, DENORM: tl.constexpr,
                HW_CVT: tl.constexpr, MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                MASKED: tl.constexpr, VEC: tl.constexpr, UNIT_ASM: tl.constexpr = False, FP8W: tl.constexpr = False,
                EVICT: tl.constexpr = 0):
    """COL_UNITS (blocks along R): rows r0 .. r0 + BLOCK_R, columns c0 .. c0 + BLOCK_C, loaded as
    [BLOCK_C / VEC, NB, U, VEC, J] with element (l, n, u, v, j) at row r0 + 32n + Ju + j, column
    c0 + VEC * l + v, where J codes make one packed unit (FP6: 16 codes = 3 words; FP8 / MXINT8: 4 = 1 word;
    FP4: 8 = 1 word) and U = 32 / J units make a block; with the FP6 unit asm (UNIT_ASM) as [L, NB, J, U, VEC]
    instead, so the thread's registers run over (v, j, u) as the asm expects. The loads are held to VEC
    elements (2 or 4 bytes; ``tl.max_contiguous``), so the lanes go along the columns and the warps along the
    blocks n: each block, and so each unit, is in one thread, with 32 * VEC elements per thread (COL_PACKED's
    16-byte loads put 8 columns x J rows in a thread for the same). The units' words reach the store through
    one layout conversion of [units, columns(, 4)]: a warp's store runs along the units of one output row
    (FP6: 32 lanes along (word, unit), word 3 repeating word 2 and masked; with BLOCK_R = 128, 96 contiguous
    bytes = 3 whole 32-byte sectors, where COL_DIRECT's 32-row tiles wrote 24-byte pieces). FP8W (FP8 with
    HW_CVT): each unit's word from :func:`_fp8_words`. EVICT: the tile load's eviction policy (the fused
    cast-transpose's reload, CT_EVICT). q_ptr: int32 words."""
    J: tl.constexpr = 16 if BITS == 6 else 32 // BITS
    U: tl.constexpr = 32 // J
    NB: tl.constexpr = BLOCK_R // 32
    L: tl.constexpr = BLOCK_C // VEC
    ASM: tl.constexpr = BITS == 6 and HW_CVT and UNIT_ASM
    jj = tl.arange(0, J)[None, None, :, None, None]
    rows = r0 + tl.arange(0, NB)[None, :, None, None, None] * 32 + jj + tl.arange(0, U)[None, None, None, :, None] * J
    cols = c0 + tl.arange(0, L)[:, None, None, None, None] * VEC + tl.arange(0, VEC)[None, None, None, None, :]
    offs = (b * R + rows) * C + cols  # [L, NB, J, U, VEC]
    m = ((rows < R) | (not MASKED)) & ((cols < C) | (not MASKED))
    if ASM:
        # loaded as [L, NB, J, U, VEC]: the thread's registers run over (v, j, u), v fastest, which the unit asm
        # relies on
        bits = _to_bits(_load_raw(x_ptr + tl.max_contiguous(offs, [1, 1, 1, 1, VEC]), m, IN_KIND, EVICT), IN_KIND)
        amax = tl.max(tl.max(bits & 0x7FFFFFFF, axis=3), axis=2)  # [L, NB, VEC]
    else:
        # loaded as [L, NB, U, VEC, J], the unit's codes last (the per-element encoder then needs 96 registers,
        # not 128)
        offs = tl.max_contiguous(tl.permute(offs, [0, 1, 3, 4, 2]), [1, 1, 1, VEC, 1])
        bits = _to_bits(_load_raw(x_ptr + offs, tl.permute(m, [0, 1, 3, 4, 2]), IN_KIND, EVICT), IN_KIND)
        amax = tl.max(tl.max(bits & 0x7FFFFFFF, axis=4), axis=2)  # [L, NB, VEC]
    sbyte, x = _block_scale(amax, scale_mode, MBITS, EMAX, MAX_FRAC, MODE)
    bad = (amax >= 0x7F800000)[:, :, None, :]  # [L, NB, 1, VEC]
    if ASM:
        tl.static_assert(not AWAY)
        o = _fp6_units_hw(_fp6_asm_input(bits, x[:, :, None, None, :], DENORM, MBITS), MBITS, VEC)
        w0, w1, w2 = _fp6_asm_words(o, jj, bad, 2)  # [L, NB, U, VEC]
    elif FP8W:
        tl.static_assert(BITS == 8 and HW_CVT)
        v = _scaled(bits, x[:, :, None, :, None], DENORM)  # [L, NB, U, VEC, J]
        badu = tl.broadcast_to(bad.to(tl.int32)[:, :, :, :, None], [L, NB, U, VEC, J])
        words = _fp8_words(tl.reshape(v, [L * NB * U, VEC, J]), tl.reshape(badu, [L * NB * U, VEC, J]),
                           L * NB * U, VEC, MBITS)
        words = tl.reshape(tl.permute(tl.reshape(words, [L, NB, U, VEC]), [1, 2, 0, 3]), [NB * U, BLOCK_C])
    else:
        codes = _encode_tile(bits, x[:, :, None, :, None], tl.reshape(x, [L, NB * VEC]), bad[:, :, :, :, None],
                             BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, AWAY, DENORM, HW_CVT).to(tl.int32)
        if BITS == 6:
            w0, w1, w2 = _fp6_unit_words(codes)  # [L, NB, U, VEC]
        else:
            if not (HW_CVT and BITS == 4):  # (the bf16x2 codes are 4 bits: finite inputs give 0..15, bad blocks 0)
                codes = codes & ((1 << BITS) - 1)
            # disjoint bit fields: the sum over the unit is their OR (the top field may set the sign bit)
            words = tl.sum(codes << (tl.arange(0, J) * BITS), axis=4)  # [L, NB, U, VEC]
            words = tl.reshape(tl.permute(words, [1, 2, 0, 3]), [NB * U, BLOCK_C])
    if BITS == 6:
        # [L, NB, U, VEC, 4] (words 0, 1, 2, 2) -> [units, columns, 4]
        w4 = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w2)), [L, NB, U, VEC, 4])
        w4 = tl.reshape(tl.permute(w4, [1, 2, 0, 3, 4]), [NB * U, BLOCK_C, 4])
    unit = r0 // J + tl.arange(0, NB * U)
    c = c0 + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)
    g = b * C + c  # output rows
    if BITS == 6:
        _store_fp6_units(q_ptr, w4, unit, g, cmask, R, MASKED)
    else:
        wm = ((unit < R // J) | (not MASKED))[:, None] & cmask[None, :]
        tl.store(q_ptr + g[None, :] * (R // J) + unit[:, None], words, mask=wm)
    sb = tl.reshape(tl.permute(sbyte, [0, 2, 1]), [BLOCK_C, NB])
    _store_scales(s_ptr, sb, g, cmask, r0, R, cols_p, BLOCK_R, LAYOUT, MASKED)


@triton.jit
def _split_pid(pid, n_fast, n_mid):
    """Program id -> (fast, mid, batch) indices of a grid of batch x n_mid x n_fast tiles (fast varies fastest)."""
    t = pid // n_fast
    return pid % n_fast, t % n_mid, t // n_mid


@triton.jit
def _tile_ids(n_fast, n_mid, INT64: tl.constexpr, GRID3: tl.constexpr):
    """(fast, mid, batch) tile indices of this program, fast varying fastest. GRID3: the launch grid is
    (n_fast, n_mid, batch) and the indices are its program ids (the launcher's choice with
    QuantizeConfig.grid3, where n_mid and batch fit the grid's 65535 limit of dims 1 and 2); else a 1-D grid
    split by :func:`_split_pid`, whose two 32-bit divisions by runtime ints cost ~60 instructions before a
    program's first load. Same program order either way (CUDA walks dim 0 fastest). INT64: the indices as
    int64."""
    if GRID3:
        f = tl.program_id(0)
        m = tl.program_id(1)
        b = tl.program_id(2)
        if INT64:
            f, m, b = f.to(tl.int64), m.to(tl.int64), b.to(tl.int64)
    else:
        pid = tl.program_id(0)
        if INT64:  # every index derived from pid is then 64-bit
            pid = pid.to(tl.int64)
        f, m, b = _split_pid(pid, n_fast, n_mid)
    return f, m, b


@triton.jit(do_not_specialize=["tiles_r", "tiles_c", "colsp_r", "colsp_c", "scale_mode"])
def _quantize_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
    R, C, tiles_r, tiles_c, colsp_r, colsp_c, scale_mode,
    IN_KIND: tl.constexpr, DO_ROW: tl.constexpr, DO_COL: tl.constexpr,
    LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr,
    AWAY: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr, DENORM: tl.constexpr,
    MASKED: tl.constexpr, HW_CVT: tl.constexpr = False, ROW3D: tl.constexpr = False,
    COL_DIRECT: tl.constexpr = False, GROUP_C: tl.constexpr = 0, RB: tl.constexpr = 1,
    SCALE_WORD: tl.constexpr = False, SCALE_MODE: tl.constexpr = -1, FP6_WORDS: tl.constexpr = False,
    COL_PACKED: tl.constexpr = False, FP4_PAIRS: tl.constexpr = False,
    COL_WIDE: tl.constexpr = False, COL_UNITS: tl.constexpr = 0, FP6_ASM: tl.constexpr = False,
    COL_FP4W: tl.constexpr = False, FP8_WORDS: tl.constexpr = False, CT_EVICT: tl.constexpr = 0,
    FP6_ST4: tl.constexpr = False, FP6P_R: tl.constexpr = False, FP6P_C: tl.constexpr = False,
    GRID3: tl.constexpr = False,
):
    """x viewed [B, R, C] (C contiguous), one [BLOCK_R, BLOCK_C] tile per program.

    DO_ROW: quantize along C -> qr [B, R, C packed], sr [B, R, C / 32] (or 128x4 over rows B*R).
    DO_COL: quantize along R -> qc [B, C, R packed], sc [B, C, R / 32] (the transposed copy).
    Both from the same load: that is the fused cast-transpose.
    HW_CVT: FP8 (RNE) elements through the hardware cvt (GPU only). ROW3D (rowwise only): load the tile
    directly as [BLOCK_R, BLOCK_C // 32, 32] (blocks along the fastest axis, no reshapes). COL_DIRECT:
    quantize along dim 0 of the raw tile and transpose only the 1-byte codes (not the raw input).
    GROUP_C > 0: programs ordered in strips of GROUP_C column tiles walked down R (else C fastest).
    RB: each program walks RB tiles down R (tiles_r counts groups of RB tiles). SCALE_WORD (DO_COL, plain
    scale layout, RB = 4 or 8, RB * BLOCK_R dividing R): the RB scale bytes of each column are gathered and
    stored as one little-endian 4- / 8-byte word instead of RB scattered single bytes.
    SCALE_MODE >= 0: the scale rule as a constexpr (the runtime scale_mode is then ignored).
    FP6_WORDS (FP6, DO_ROW): :func:`_rows_fp6_words`; with DO_COL (cast-transpose), the column half reloads the
    tile in its own layout (from L1 / L2: one DRAM read) instead of converting one layout to the other.
    COL_PACKED (DO_COL): :func:`_cols_packed`, which loads the tile in its own layout too (with DO_ROW, a reload).
    FP4_PAIRS (DO_ROW, FP4 from bf16 with HW_CVT): :func:`_rows_fp4_pairs`. COL_WIDE (with COL_PACKED, 8- or 4-bit
    elements): 64-bit packed units. COL_UNITS > 0 (DO_COL): :func:`_cols_units` with COL_UNITS-element
    loads. FP8_WORDS (FP8 with HW_CVT): the bad-block mask inside the cvt asm, rowwise
    (:func:`_cvt_fp8_rn_keep`), and each unit's word straight from :func:`_fp8_words` in COL_PACKED columns of
    32-bit units and in COL_UNITS columns. CT_EVICT (fused cast-transpose with COL_UNITS): 1 = the rows' load
    of the tile evict_last and the columns' reload evict_first, so the reload finds the tile in L1 more often
    (session 10: 314 -> 304 us at 16384^2); 2 = the rows' hint only. GRID3 (GROUP_C 0): a (tiles_c, tiles_r,
    B) launch grid, :func:`_tile_ids`."""
    if GROUP_C > 0:
        tl.static_assert(not GRID3)
        pid = tl.program_id(0)
        if INT64:  # every index derived from pid is then 64-bit
            pid = pid.to(tl.int64)
        # strips of GROUP_C column tiles walked down R: neighbouring programs read neighbouring columns of
        # the same rows and extend the same transposed output rows
        per_b = tiles_r * tiles_c
        b = pid // per_b
        t = pid % per_b
        g = t // (GROUP_C * tiles_r)
        gw = tl.minimum(tiles_c - g * GROUP_C, GROUP_C)  # the last strip may be narrower
        t = t - g * (GROUP_C * tiles_r)
        pc = g * GROUP_C + t % gw
        pr = t // gw
    else:
        pc, pr, b = _tile_ids(tiles_c, tiles_r, INT64, GRID3)
    c = pc * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = (c < C) | (not MASKED)  # folds to an unmasked access when the tiles divide the tensor
    if ROW3D:
        tl.static_assert(DO_ROW and not DO_COL and RB == 1)
        r = pr * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = (r < R) | (not MASKED)
        grow = b * R + r
        c3 = pc * BLOCK_C + tl.arange(0, BLOCK_C // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        raw3 = _load_raw(x_ptr + grow[:, None, None] * C + c3, rmask[:, None, None] & ((c3 < C) | (not MASKED)),
                         IN_KIND)
        codes, sbyte = _quantize_rows(_to_bits(raw3, IN_KIND), BLOCK_R, BLOCK_C, BITS, MBITS, EMIN, EMAX, IS_INT,
                                      MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM, HW_CVT, True, False,
                                      SCALE_MODE)
        _store_rows3d(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, colsp_r,
                      BLOCK_R, BLOCK_C, BITS, LAYOUT_R, MASKED)
    else:
        # FP4 through bf16x2 (HW_CVT, bf16 inputs only): the quantizer takes the bf16 bits as loaded
        RAW16: tl.constexpr = HW_CVT and BITS == 4 and IN_KIND == IN_BF16_BITS
        if SCALE_WORD:
            # (the packed / unit column paths store their scales themselves)
            tl.static_assert(DO_COL and (RB == 4 or RB == 8) and LAYOUT_C == LAYOUT_PLAIN
                             and not (COL_PACKED or COL_UNITS > 0 or COL_FP4W))
            word = tl.zeros([BLOCK_C, 1], dtype=tl.int64 if RB == 8 else tl.int32)
        for i in tl.range(0, RB, num_stages=1):  # a real loop (unrolled, it spilled registers)
            r0 = (pr * RB + i) * BLOCK_R
            r = r0 + tl.arange(0, BLOCK_R)
            rmask = (r < R) | (not MASKED)
            grow = b * R + r
            if FP6_WORDS and FP6P_R:
                _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                                colsp_r, scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C,
                                MASKED, EVICT_LAST if CT_EVICT > 0 else 0, FP6_ST4)
            elif FP6_WORDS:
                tl.static_assert(DO_ROW and BITS == 6)
                _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C, colsp_r, scale_mode, IN_KIND,
                                LAYOUT_R, MBITS, EMIN, EMAX, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, SCALE_MODE,
                                BLOCK_R, BLOCK_C, MASKED, HW_CVT, FP6_ASM, EVICT_LAST if CT_EVICT > 0 else 0, FP6_ST4)
            if (DO_COL and not (COL_PACKED or COL_UNITS > 0)) or (DO_ROW and not (FP6_WORDS or FP4_PAIRS)):
                # (cast-transpose with FP6_WORDS: the column half loads the tile again, in its own layout; the
                # program's first load just brought it into L1 / L2)
                raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :], rmask[:, None] & cmask[None, :], IN_KIND,
                                EVICT_LAST if CT_EVICT > 0 else 0)
            if DO_ROW and FP4_PAIRS:
                tl.static_assert(RAW16)
                _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, pc * BLOCK_C, C,
                                colsp_r, scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C,
                                MASKED, EVICT_LAST if CT_EVICT > 0 else 0, DO_COL)
            elif DO_ROW and not FP6_WORDS:
                codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, BITS,
                                              MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY,
                                              DENORM, HW_CVT, False, RAW16, SCALE_MODE, FP8_WORDS)
                _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, pc * BLOCK_C, C, colsp_r,
                                 BLOCK_R, BLOCK_C, BITS, LAYOUT_R, MASKED)
            if DO_COL and COL_UNITS > 0 and COL_FP4W:
                _cols_fp4_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                                EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, COL_WIDE,
                                EVICT_FIRST if CT_EVICT == 1 else 0)
            elif DO_COL and COL_UNITS > 0 and FP6P_C:
                _cols_fp6_pairs(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                                EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, EVICT_FIRST if CT_EVICT == 1 else 0)
            elif DO_COL and COL_UNITS > 0:
                tl.static_assert(not SCALE_WORD)
                _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C,
                            BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, HW_CVT, SCALE_MODE,
                            BLOCK_R, BLOCK_C, MASKED, COL_UNITS, FP6_ASM, FP8_WORDS,
                            EVICT_FIRST if CT_EVICT == 1 else 0)
            elif DO_COL and COL_FP4W:
                _cols_fp4_words(x_ptr, qc_ptr, sc_ptr, b, r0, pc * BLOCK_C, R, C, colsp_c, scale_mode, LAYOUT_C, MBITS,
                                EMAX, MAX_FRAC, SCALE_MODE, BLOCK_R, BLOCK_C, MASKED, 8)
            elif DO_COL and COL_PACKED:
                _cols_packed(x_ptr, qc_ptr, sc_ptr, b, r0, c, cmask, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C,
                             BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, HW_CVT, SCALE_MODE,
                             BLOCK_R, BLOCK_C, MASKED, COL_WIDE, FP8_WORDS and not COL_WIDE)
            elif DO_COL and COL_DIRECT:
                codes, sbyte = _quantize_cols(_to_bits(raw, IN_KIND), BLOCK_R, BLOCK_C, BITS, MBITS, EMIN, EMAX,
                                              IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM, HW_CVT,
                                              SCALE_MODE)
                _store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c,
                                   BLOCK_C, BLOCK_R, BITS, LAYOUT_C, MASKED, not SCALE_WORD)
                if SCALE_WORD:
                    tl.static_assert(BLOCK_R == 32)
                    word = word | (tl.trans(sbyte).to(word.dtype) << (8 * i))
            elif DO_COL:
                # transpose the raw tile (2 bytes / element for 16-bit inputs) and quantize its rows: blocks of
                # 32 along R become contiguous in each row, and the output rows (one per column c) are contiguous
                rt = tl.trans(raw)
                codes, sbyte = _quantize_rows(rt if RAW16 else _to_bits(rt, IN_KIND), BLOCK_C, BLOCK_R, BITS, MBITS,
                                              EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM,
                                              HW_CVT, False, RAW16, SCALE_MODE)
                _store_quantized(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c,
                                 BLOCK_C, BLOCK_R, BITS, LAYOUT_C, MASKED, not SCALE_WORD)
                if SCALE_WORD:
                    tl.static_assert(BLOCK_R == 32)
                    word = word | (sbyte.to(word.dtype) << (8 * i))
        if SCALE_WORD:
            # scale row (b, c) holds R / 32 bytes = R / (32 RB) words; this program's word is number pr
            wptr = sc_ptr.to(tl.pointer_type(word.dtype))
            tl.store(wptr + (b * C + c)[:, None] * (R // (32 * RB)) + pr, word, mask=cmask[:, None])


@triton.jit(do_not_specialize=["regions_r", "regions_c", "colsp_r", "colsp_c", "scale_mode"])
def _cast_transpose_split_kernel(
    x_ptr, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
    R, C, regions_r, regions_c, colsp_r, colsp_c, scale_mode,
    IN_KIND: tl.constexpr, LAYOUT_R: tl.constexpr, LAYOUT_C: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
    IS_INT: tl.constexpr, MAX_NORMAL: tl.constexpr, MAX_FRAC: tl.constexpr, AWAY: tl.constexpr,
    INT64: tl.constexpr, DENORM: tl.constexpr, MASKED: tl.constexpr, SCALE_MODE: tl.constexpr,
    ROW_BR: tl.constexpr, ROW_BC: tl.constexpr, ROW_RB: tl.constexpr, ROW_HW: tl.constexpr,
    FP6_WORDS: tl.constexpr, FP4_PAIRS: tl.constexpr,
    COL_BR: tl.constexpr, COL_BC: tl.constexpr, COL_HW: tl.constexpr, COL_PACKED: tl.constexpr,
    COL_WIDE: tl.constexpr, COL_UNITS: tl.constexpr = 0, FP6_ASM: tl.constexpr = False,
    COL_FP4W: tl.constexpr = False, FP6_ST4: tl.constexpr = False, FP6P_R: tl.constexpr = False,
    FP6P_C: tl.constexpr = False,
):
    """Cast-transpose of x viewed [B, R, C] by programs that each do ONE direction: the tensor is cut into
    regions of COL_BR x ROW_BC elements, and each region gets NR row programs (ROW_RB tiles of ROW_BR x ROW_BC
    each, blocks along C: the rowwise paths) followed by NC column programs (COL_BR x COL_BC tiles, blocks
    along R: COL_PACKED / col_direct). The programs of a region run next to each other, so the second read
    of its 64-256 KB comes from L2: DRAM reads x about once (as the fused kernel, whose column half reloads
    its tile from L1 / L2 too), while each program runs one lean path on its own best tile (the fused tile
    had to serve both, with both paths' registers live in every program). Outputs as in _quantize_kernel
    with DO_ROW and DO_COL; same bytes."""
    NR: tl.constexpr = COL_BR // (ROW_BR * ROW_RB)
    NC: tl.constexpr = ROW_BC // COL_BC
    tl.static_assert(NR * ROW_BR * ROW_RB == COL_BR and NC * COL_BC == ROW_BC)
    pid = tl.program_id(0)
    if INT64:
        pid = pid.to(tl.int64)
    region = pid // (NR + NC)
    k = pid % (NR + NC)
    rc, rr, b = _split_pid(region, regions_c, regions_r)
    r0 = rr * COL_BR
    if k < NR:
        c0 = rc * ROW_BC
        RAW16: tl.constexpr = ROW_HW and BITS == 4 and IN_KIND == IN_BF16_BITS
        for i in tl.range(0, ROW_RB, num_stages=1):
            r = r0 + (k * ROW_RB + i) * ROW_BR + tl.arange(0, ROW_BR)
            rmask = (r < R) | (not MASKED)
            grow = b * R + r
            if FP6_WORDS and FP6P_R:
                _rows_fp6_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r,
                                scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, ROW_BR, ROW_BC, MASKED, 0,
                                FP6_ST4)
            elif FP6_WORDS:
                _rows_fp6_words(x_ptr, qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r, scale_mode, IN_KIND, LAYOUT_R,
                                MBITS, EMIN, EMAX, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, SCALE_MODE, ROW_BR, ROW_BC,
                                MASKED, ROW_HW, FP6_ASM, 0, FP6_ST4)
            elif FP4_PAIRS:
                tl.static_assert(RAW16)
                _rows_fp4_pairs(x_ptr.to(tl.pointer_type(tl.int32)), qr_ptr, sr_ptr, grow, rmask, c0, C, colsp_r,
                                scale_mode, LAYOUT_R, MBITS, EMAX, MAX_FRAC, SCALE_MODE, ROW_BR, ROW_BC, MASKED)
            else:
                c = c0 + tl.arange(0, ROW_BC)
                raw = _load_raw(x_ptr + grow[:, None] * C + c[None, :],
                                rmask[:, None] & ((c < C) | (not MASKED))[None, :], IN_KIND)
                codes, sbyte = _quantize_rows(raw if RAW16 else _to_bits(raw, IN_KIND), ROW_BR, ROW_BC, BITS, MBITS,
                                              EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM,
                                              ROW_HW, False, RAW16, SCALE_MODE)
                _store_quantized(qr_ptr, sr_ptr, codes, sbyte, grow, rmask, c0, C, colsp_r, ROW_BR, ROW_BC, BITS,
                                 LAYOUT_R, MASKED)
    else:
        c = rc * ROW_BC + (k - NR) * COL_BC + tl.arange(0, COL_BC)
        cmask = (c < C) | (not MASKED)
        if COL_UNITS > 0 and COL_FP4W:
            _cols_fp4_units(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED, COL_WIDE)
        elif COL_UNITS > 0 and FP6P_C:
            _cols_fp6_pairs(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED)
        elif COL_UNITS > 0:
            _cols_units(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                        IN_KIND, LAYOUT_C, BITS, MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, COL_HW,
                        SCALE_MODE, COL_BR, COL_BC, MASKED, COL_UNITS, FP6_ASM)
        elif COL_FP4W:
            _cols_fp4_words(x_ptr, qc_ptr, sc_ptr, b, r0, rc * ROW_BC + (k - NR) * COL_BC, R, C, colsp_c, scale_mode,
                            LAYOUT_C, MBITS, EMAX, MAX_FRAC, SCALE_MODE, COL_BR, COL_BC, MASKED, COL_WIDE)
        elif COL_PACKED:
            _cols_packed(x_ptr, qc_ptr, sc_ptr, b, r0, c, cmask, R, C, colsp_c, scale_mode, IN_KIND, LAYOUT_C, BITS,
                         MBITS, EMIN, EMAX, IS_INT, MAX_NORMAL, MAX_FRAC, AWAY, DENORM, COL_HW, SCALE_MODE, COL_BR,
                         COL_BC, MASKED, COL_WIDE)
        else:  # col_direct
            r = r0 + tl.arange(0, COL_BR)
            raw = _load_raw(x_ptr + (b * R + r)[:, None] * C + c[None, :],
                            ((r < R) | (not MASKED))[:, None] & cmask[None, :], IN_KIND)
            codes, sbyte = _quantize_cols(_to_bits(raw, IN_KIND), COL_BR, COL_BC, BITS, MBITS, EMIN, EMAX, IS_INT,
                                          MAX_NORMAL, MAX_FRAC, scale_mode, AWAY, DENORM, COL_HW, SCALE_MODE)
            _store_cols_direct(qc_ptr, sc_ptr, codes, sbyte, b * C + c, cmask, r0, R, colsp_c, COL_BC, COL_BR, BITS,
                               LAYOUT_C, MASKED)


@triton.jit
def _transpose_bytes_kernel(src_ptr, dst_ptr, M, N, tiles_n, BLOCK: tl.constexpr):
    """dst [N, M] = src [M, N]^T for bytes (the scale_t scales), one BLOCK x BLOCK tile per program (both sides
    read and written along rows; the transpose goes through shared memory)."""
    pid = tl.program_id(0)
    pm = pid // tiles_n
    pn = pid % tiles_n
    rm = pm * BLOCK + tl.arange(0, BLOCK)
    rn = pn * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(src_ptr + rm[:, None] * N + rn[None, :], mask=(rm < M)[:, None] & (rn < N)[None, :])
    tl.store(dst_ptr + rn[:, None] * M + rm[None, :], tl.trans(t), mask=(rn < N)[:, None] & (rm < M)[None, :])


# ---------------------------------------------------------------------------------------------------------
# dequantize


@triton.jit
def _load_codes(q_ptr, g, gmask, n0, Ltot, A: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr,
                MASKED: tl.constexpr):
    """Element codes [A, N] (int32) of rows g, elements n0 .. n0+N (inverse of the packing in
    _store_quantized). FP6: q_ptr points to int32 words."""
    if BITS == 8:
        cols = n0 + tl.arange(0, N)
        m = gmask[:, None] & ((cols < Ltot) | (not MASKED))[None, :]
        return tl.load(q_ptr + g[:, None] * Ltot + cols[None, :], mask=m, other=0).to(tl.int32)
    elif BITS == 4:
        bcols = n0 // 2 + tl.arange(0, N // 2)
        m = gmask[:, None] & ((bcols < Ltot // 2) | (not MASKED))[None, :]
        byte = tl.load(q_ptr + g[:, None] * _half_row(Ltot) + bcols[None, :], mask=m, other=0).to(tl.int32)
        sh = tl.arange(0, 2) * 4
        return tl.reshape((byte[:, :, None] >> sh[None, None, :]) & 0xF, [A, N])
    else:
        tl.static_assert(BITS == 6)
        wcols = n0 // 16 + tl.arange(0, N // 16)
        m = gmask[:, None, None] & ((wcols < Ltot // 16) | (not MASKED))[None, :, None] & (tl.arange(0, 4) < 3)[None, None, :]
        offs = (g[:, None, None] * (Ltot // 16 * 3) + wcols[None, :, None] * 3
                + tl.arange(0, 4)[None, None, :])
        w = tl.load(q_ptr + offs, mask=m, other=0).to(tl.uint32, bitcast=True)  # [A, N // 16, 4 (word j)]
        # group k (24 bits at bit 24k of the 96-bit little-endian word triple) = OR over words j of
        # word j shifted (logically) by 32j - 24k, masked to 24 bits
        w4 = tl.reshape(w, [A, N // 16, 1, 4])
        jj = tl.arange(0, 4)[None, :]
        kk = tl.arange(0, 4)[:, None]
        shift = 32 * jj - 24 * kk  # [4 (k), 4 (j)]
        lsh = tl.where((shift >= 0) & (shift < 24), shift, 0).to(tl.uint32)
        rsh = tl.where((shift < 0) & (shift > -32), -shift, 0).to(tl.uint32)
        part = tl.where((shift >= 0) & (shift < 24), w4 << lsh[None, None, :, :],
                        tl.where((shift < 0) & (shift > -32), w4 >> rsh[None, None, :, :], 0))
        grp = (tl.sum(part, axis=3) & 0xFFFFFF).to(tl.int32)  # [A, N // 16, 4 (k)]
        sh = tl.arange(0, 4) * 6
        codes = (grp[:, :, :, None] >> sh[None, None, None, :]) & 0x3F
        return tl.reshape(codes, [A, N])


@triton.jit
def _decode(code, sbyte, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
            IS_INT: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr):
    """codes (int32) and their scale bytes (broadcast) -> fp32 decode(code) * 2^(scale - 127), one rounding."""
    if IS_INT:
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
        if HAS_INF:
            top = ef == (1 << (BITS - 1 - MBITS)) - 1
            isnan = isnan | (top & (mant != 0))
            inf = tl.where((code & SIGN) != 0, float("-inf"), float("inf"))
            val = tl.where(top & (mant == 0), inf, val)
        elif HAS_NAN:
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
def _to_out(val, OUT_KIND: tl.constexpr, HW_DEC: tl.constexpr):
    """fp32 -> the stored output: fp32, bf16 bits (int16) or fp16, each with round-to-nearest-even."""
    if OUT_KIND == OUT_F32:
        return val
    elif OUT_KIND == OUT_BF16:
        if HW_DEC:  # cvt.rn.bf16.f32 (RNE, subnormals kept; NaN -> a quiet NaN)
            return val.to(tl.bfloat16).to(tl.int16, bitcast=True)
        # fp32 -> bf16 round to nearest even on the bits (exact for denormals too); NaN -> 0x7FC0
        u = val.to(tl.int32, bitcast=True)
        rb = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        return tl.where(val != val, 0x7FC0, rb).to(tl.int16)
    else:
        return val.to(tl.float16)


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


@triton.jit
def _shfl_xor1(v):
    """Each lane gets the value of the same register in lane ^ 1 (``shfl.sync.bfly.b32``, all 32 lanes; GPU only:
    inline asm). 16-bit values travel two per 32-bit register."""
    if v.dtype.primitive_bitwidth == 16:
        return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r", [v], dtype=v.dtype,
                                         is_pure=False, pack=2)
    else:
        tl.static_assert(v.dtype.primitive_bitwidth == 32)
        return tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, 1, 0x1f, -1;", "=r,r", [v], dtype=v.dtype,
                                         is_pure=False, pack=1)


@triton.jit
def _dequant_fp6_words(q_ptr, s_ptr, out_ptr, g, nmask, pl, L, OUT_KIND: tl.constexpr, MBITS: tl.constexpr,
                       EMIN: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, MASKED: tl.constexpr, HW_DEC: tl.constexpr,
                       SWAP: tl.constexpr = False, GROUP_ASM: tl.constexpr = False):
    """FP6_WORDS (rowwise FP6 dequantize): each thread loads the 3 words of one 16-code group (three strided
    word loads over a [groups, rows] tile: equal contiguity, so Triton's coalescing puts lanes along the groups,
    the lower dim) and unpacks, decodes and stores its 16 elements itself (two 8-element stores whose pointer
    tiles have the layout the values already have): no shared-memory exchange. q_ptr: int32 words.
    GROUP_ASM (bf16 output, HW_DEC): the whole group in one inline asm (_fp6_group_decode_asm), whose bf16
    pairs are stored as 32-bit words; the same bytes as the per-element path."""
    G: tl.constexpr = BLOCK_L // 16
    gi = pl * G + tl.arange(0, G)  # group index along L (16 elements each)
    m2 = ((gi < L // 16) | (not MASKED))[:, None] & nmask[None, :]  # [G, BLOCK_N]
    wofs = g[None, :] * (L // 16 * 3) + gi[:, None] * 3
    w0 = tl.load(q_ptr + wofs, mask=m2, other=0)
    w1 = tl.load(q_ptr + wofs + 1, mask=m2, other=0)
    w2 = tl.load(q_ptr + wofs + 2, mask=m2, other=0)
    sb = tl.load(s_ptr + g[None, :] * (L // 32) + (gi // 2)[:, None], mask=m2, other=0).to(tl.int32)
    if GROUP_ASM:
        tl.static_assert(HW_DEC and OUT_KIND == OUT_BF16)
        fac = tl.where(sb == 0, 0x00400000, tl.where(sb == 255, 0x7FC00000, sb << 23)).to(tl.float32, bitcast=True)
        o = tl.inline_asm_elementwise(FP6_DEC_E2M3 if MBITS == 3 else FP6_DEC_E3M2, FP6_DEC_RW, [w0, w1, w2, fac],
                                      dtype=(tl.int32, ) * 8, is_pure=True, pack=1)
        # bf16 pairs as words: elements 0-7 = words 0-3, 8-15 = words 4-7 (the stores below count in words)
        lo = tl.reshape(tl.join(tl.join(o[0], o[2]), tl.join(o[1], o[3])), [G, BLOCK_N, 4])
        hi = tl.reshape(tl.join(tl.join(o[4], o[6]), tl.join(o[5], o[7])), [G, BLOCK_N, 4])
        out_ptr = out_ptr.to(tl.pointer_type(tl.int32))
        H: tl.constexpr = 4  # a half group in stored units
        offs = g[None, :, None] * (L // 2) + (gi * 8)[:, None, None] + tl.arange(0, 4)[None, None, :]
    else:
        codes = _fp6_codes16(w0, w1, w2)  # [G, BLOCK_N, 16]
        if HW_DEC:
            val = _decode_hw(codes, sb[:, :, None], 6, MBITS)
        else:
            val = _decode(codes, sb[:, :, None], 6, MBITS, EMIN, BIAS, False, HAS_INF, HAS_NAN)
        out = _to_out(val, OUT_KIND, HW_DEC)
        lo, hi = tl.split(tl.permute(tl.reshape(out, [G, BLOCK_N, 2, 8]), [0, 1, 3, 2]))  # elements 0-7, 8-15
        H: tl.constexpr = 8
        offs = g[None, :, None] * L + (gi * 16)[:, None, None] + tl.arange(0, 8)[None, None, :]
    mm = m2[:, :, None]
    if SWAP:
        # Stored as above, each instruction writes half of every 32-byte sector it touches (16 bytes per lane,
        # lanes 32 bytes apart). Lanes holding groups 2k and 2k + 1 of a row swap one half (shfl.bfly 1), so
        # each instruction writes whole sectors: lane 2k lo(2k) next to lane 2k + 1 hi(2k), then lo(2k + 1)
        # next to hi(2k + 1). The partner is checked with a key exchanged the same way (one flag per group and
        # row, so the 8-element stores stay vectorised; a lane holding part of a row's group also holds it in
        # this [G, BLOCK_N] key, so a split of the 8 elements over lanes fails the check too). Where the partner
        # is not group gi ^ 1 of the same row (small tiles: fewer (group, row) pairs than threads), the lane
        # stores its own halves as without SWAP. 16-bit outputs only (the launcher): an fp32 half is a whole
        # sector already. H200, bf16 16384^2: 285 -> 220 us.
        nn = tl.arange(0, BLOCK_N)[None, :]
        key = gi[:, None] * BLOCK_N + nn + w0 * 0  # w0's layout: the slice the 3-D tiles broadcast from
        ok = (_shfl_xor1(key) == (gi ^ 1)[:, None] * BLOCK_N + nn)[:, :, None]
        even = (gi % 2 == 0)[:, None, None]
        recv = _shfl_xor1(tl.where(even, hi, lo))
        pair = offs - (gi % 2)[:, None, None] * H  # lo(2k), hi(2k) | lo(2k + 1), hi(2k + 1) at + a group
        # where the check fails, the same two stores write the lane's own halves (selects, not more stores)
        tl.store(out_ptr + tl.where(ok, pair, offs), tl.where(ok, tl.where(even, lo, recv), lo), mask=mm)
        tl.store(out_ptr + tl.where(ok, pair + 2 * H, offs + H), tl.where(ok, tl.where(even, recv, hi), hi), mask=mm)
    else:
        tl.store(out_ptr + offs, lo, mask=mm)
        tl.store(out_ptr + offs + H, hi, mask=mm)


@triton.jit(do_not_specialize=["tiles_n", "tiles_l", "row_words"])
def _dequantize_kernel(
    q_ptr, s_ptr, out_ptr,
    N, L, tiles_n, tiles_l, row_words,
    TRANS: tl.constexpr, OUT_KIND: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
    IS_INT: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, INT64: tl.constexpr, MASKED: tl.constexpr,
    LOAD3D: tl.constexpr = False, HW_DEC: tl.constexpr = False, FP6_WORDS: tl.constexpr = False,
    SWAP: tl.constexpr = False, GROUP_ASM: tl.constexpr = False, FP4_ASM: tl.constexpr = False,
):
    """qdata viewed [B, N, L packed], scale [B, N, L / 32] -> out [B, N, L] (TRANS False) or [B, L, N]
    (TRANS: the quantized axis goes back in front of the N trailing elements).
    LOAD3D (not TRANS, FP8 / FP4 / MXINT8): codes and output addressed directly as [BLOCK_N, BLOCK_L // 32, 32]
    tiles (the scale broadcasts along the fastest axis, no reshapes). HW_DEC (FP8 / FP6 / FP4, GPU only): decode
    through the hardware FP8 -> fp16 cvt and one scale multiply (:func:`_decode_hw`). FP6_WORDS (rowwise FP6):
    :func:`_dequant_fp6_words`; SWAP (with it, GPU only): lane pairs exchange halves so stores write whole sectors.
    FP4_ASM (rowwise FP4 to bf16 / fp16, GPU only): q_ptr points to int32 words of 8 codes, each decoded straight
    to four bf16 / fp16 pairs by one inline asm (:func:`_fp4_word_decode_asm`), stored as int32 words;
    row_words = L / 8 (the launcher passes it for every path; only FP4_ASM reads it)."""
    pid = tl.program_id(0)
    if INT64:  # every index derived from pid is then 64-bit
        pid = pid.to(tl.int64)
    if TRANS:
        pn, pl, b = _split_pid(pid, tiles_n, tiles_l)  # neighbouring programs write neighbouring output columns
    else:
        pl, pn, b = _split_pid(pid, tiles_l, tiles_n)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = (n < N) | (not MASKED)
    g = b * N + n
    if FP6_WORDS:
        _dequant_fp6_words(q_ptr, s_ptr, out_ptr, g, nmask, pl, L, OUT_KIND, MBITS, EMIN, BIAS, HAS_INF, HAS_NAN,
                           BLOCK_N, BLOCK_L, MASKED, HW_DEC, SWAP, GROUP_ASM)
    elif FP4_ASM:
        # One word (8 codes) per lane and per load: row_words (L / 8, a runtime int Triton does not specialise)
        # hides the rows' 8- / 16-byte alignment, so Triton's coalescing keeps one word per thread, lanes along
        # the row, and each lane's 16 output bytes sit next to its neighbours' (a warp's store: 512 contiguous
        # bytes, whole sectors, no layout conversion; with 2- or 4-word loads the 32- / 64-byte outputs per
        # thread went through shared memory to be stored)
        tl.static_assert(not TRANS and BITS == 4 and (OUT_KIND == OUT_BF16 or OUT_KIND == OUT_F16))
        W: tl.constexpr = BLOCK_L // 8
        wi = pl * W + tl.arange(0, W)
        m2 = nmask[:, None] & ((wi < L // 8) | (not MASKED))[None, :]
        w = tl.load(q_ptr + g[:, None] * row_words + wi[None, :], mask=m2, other=0)
        sb = tl.load(s_ptr + g[:, None] * (L // 32) + (wi // 4)[None, :], mask=m2, other=0).to(tl.int32)
        fac = tl.where(sb == 0, 0x0040, tl.where(sb == 255, 0x7FC0, sb << 7))  # 2^(s - 127) as bf16 bits
        o = tl.inline_asm_elementwise(FP4_DEC if OUT_KIND == OUT_BF16 else FP4_DEC_F16, FP4_DEC_RW,
                                      [w, fac | (fac << 16)], dtype=(tl.int32, ) * 4, is_pure=True, pack=1)
        # word j of a row -> output words 4j .. 4j + 3 (bf16 / fp16 pairs)
        out = tl.reshape(tl.join(tl.join(o[0], o[2]), tl.join(o[1], o[3])), [BLOCK_N, 4 * W])
        o4 = pl * (4 * W) + tl.arange(0, 4 * W)
        tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + g[:, None] * (row_words * 4) + o4[None, :], out,
                 mask=nmask[:, None] & ((o4 < L // 2) | (not MASKED))[None, :])
    elif LOAD3D:
        tl.static_assert(not TRANS and BITS != 6)
        scols = pl * (BLOCK_L // 32) + tl.arange(0, BLOCK_L // 32)
        smask = nmask[:, None] & ((scols < L // 32) | (not MASKED))[None, :]
        sbyte = tl.load(s_ptr + g[:, None] * (L // 32) + scols[None, :], mask=smask, other=0).to(tl.int32)
        l3 = pl * BLOCK_L + tl.arange(0, BLOCK_L // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
        m3 = nmask[:, None, None] & ((l3 < L) | (not MASKED))
        if BITS == 8:
            c3 = tl.load(q_ptr + g[:, None, None] * L + l3, mask=m3, other=0).to(tl.int32)
        else:
            b3 = (pl * BLOCK_L // 2 + tl.arange(0, BLOCK_L // 32)[None, :, None] * 16
                  + tl.arange(0, 16)[None, None, :])
            byte = tl.load(q_ptr + g[:, None, None] * _half_row(L) + b3,
                           mask=nmask[:, None, None] & ((b3 < L // 2) | (not MASKED)), other=0).to(tl.int32)
            sh = tl.arange(0, 2) * 4
            c3 = tl.reshape((byte[:, :, :, None] >> sh[None, None, None, :]) & 0xF, [BLOCK_N, BLOCK_L // 32, 32])
        if HW_DEC:
            val = _decode_hw(c3, tl.expand_dims(sbyte, 2), BITS, MBITS)
        else:
            val = _decode(c3, tl.expand_dims(sbyte, 2), BITS, MBITS, EMIN, BIAS, IS_INT, HAS_INF, HAS_NAN)
        tl.store(out_ptr + g[:, None, None] * L + l3, _to_out(val, OUT_KIND, HW_DEC), mask=m3)
    else:
        codes = _load_codes(q_ptr, g, nmask, pl * BLOCK_L, L, BLOCK_N, BLOCK_L, BITS, MASKED)
        scols = pl * (BLOCK_L // 32) + tl.arange(0, BLOCK_L // 32)
        smask = nmask[:, None] & ((scols < L // 32) | (not MASKED))[None, :]
        sbyte = tl.load(s_ptr + g[:, None] * (L // 32) + scols[None, :], mask=smask, other=0).to(tl.int32)
        c3 = tl.reshape(codes, [BLOCK_N, BLOCK_L // 32, 32])
        if HW_DEC:
            val = _decode_hw(c3, tl.expand_dims(sbyte, 2), BITS, MBITS)
        else:
            val = _decode(c3, tl.expand_dims(sbyte, 2), BITS, MBITS, EMIN, BIAS, IS_INT, HAS_INF, HAS_NAN)
        out = _to_out(tl.reshape(val, [BLOCK_N, BLOCK_L]), OUT_KIND, HW_DEC)
        l = pl * BLOCK_L + tl.arange(0, BLOCK_L)
        lmask = (l < L) | (not MASKED)
        if TRANS:
            offs = (b * L + l)[:, None] * N + n[None, :]
            tl.store(out_ptr + offs, tl.trans(out), mask=lmask[:, None] & nmask[None, :])
        else:
            offs = g[:, None] * L + l[None, :]
            tl.store(out_ptr + offs, out, mask=nmask[:, None] & lmask[None, :])
