"""The block scale rule (E8M0 shared exponent) on amax bits, one constexpr-selected rule per
:class:`mxkit.formats.ScaleMode`."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import MODE_CEIL, MODE_EVEN, MODE_FLOOR, MODE_RCEIL


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
    MODE: the scale rule (MODE_FLOOR / _CEIL / _RCEIL / _EVEN), a constexpr, so only its arithmetic is emitted.
    scale_mode is not read (the rule is the constexpr MODE); it stays in the signature for the fold kernels, which
    pass it positionally. The quantize kernels call :func:`_scale_of`."""
    ef = amax >> 23
    frac = amax & 0x7FFFFF
    # fp32 denormal amax: the int -> float conversion of its mantissa is exact and normal
    fm = frac.to(tl.float32).to(tl.int32, bitcast=True)
    den = ef == 0
    e = tl.where(den, (fm >> 23) - 127 - 149, ef - 127)
    frac = tl.where(den, fm & 0x7FFFFF, frac)
    # CEIL: +1 unless amax is a power of two; RCEIL: amax <= max_normal * 2^X <=> mantissa(amax) <=
    # mantissa(max_normal) once the exponents align
    tl.static_assert(MODE >= 0, "the scale rule is a constexpr (MODE)")
    if MODE == MODE_EVEN:
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


@triton.jit
def _scale_of(amax, FMT: tl.constexpr, MODE: tl.constexpr):
    """:func:`_block_scale` of format FMT (an :class:`~._common.ElementSpec`) under rule MODE."""
    return _block_scale(amax, 0, FMT.mbits, FMT.emax, FMT.max_frac, MODE)


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
