"""``@triton.jit`` code of the MX quantize / dequantize kernels (host side: :mod:`mxkit.kernels.quantize`; the
specification they match byte for byte: :mod:`mxkit.reference`).

Everything that decides a byte is integer work on fp32 bit patterns, or fp32 arithmetic that is exact or
correctly rounded (IEEE fp32 with subnormals, as PTX ``mul.f32`` / ``add.f32`` without ``.ftz`` and numpy
compute it):

* amax = integer max of ``bits & 0x7FFFFFFF`` (order-preserving for non-negative floats; NaN / Inf are the
  patterns >= 0x7F800000, so the non-finite test is the same max).
* scale byte: the rules of :func:`mxkit.formats.shared_exponent` on the amax bits (fp32 denormal amax
  normalised through an exact int -> float conversion of its mantissa), :mod:`._scale`.
* element: ``v = |x| * 2^-X`` (exact while v is an fp32 normal; smaller v round to zero anyway), saturated
  at max_normal, then rounded with the "magic number" add ``(v + 2^(e - mbits + 23))``: the fp32 add rounds
  v to the element grid (ulp 2^(e - mbits)) with round-to-nearest-even, and the bit difference of the sum
  and the magic number *is* the number of element ulps. Ties-away adds one where the add rounded a tie down.
  The hardware-conversion paths (HW_CVT / HW_DEC: FP8 ``cvt.rn.satfinite``, FP4 bf16x2 arithmetic, FP6 through
  the FP8 grid) are inline asm, GPU only (the CPU interpreter cannot run inline asm); the identities behind
  each are checked on the CPU in tests/kernel_tests/test_codecs.py, which runs their PTX through a CPU emulator.
  :mod:`._codecs`.
* MASKED is False when the tiles divide the tensor: the masks fold to constants and vanish.

Files, by concern: ``_common`` (the format spec, constants, loads, program ids), ``_codecs`` (element codecs and
PTX helpers), ``_scale`` (the scale rule), ``_store`` (code packing, scale stores and layouts), ``_rows`` (row tiles
and the rowwise kernel), ``_cols`` (column tiles and the columnwise kernel), ``_cast_transpose`` (the fused, tile
and one-direction cast-transpose kernels, the scale byte transpose), ``_dequantize`` (the rowwise and transposed
dequantize kernels). One kernel per algorithm, each with at most 16 constexprs: the element format is ONE
constexpr (``FMT``, an :class:`~._common.ElementSpec` with named fields), the rest are the scale rule, the scale
layout, the tile and the few choices its algorithm reads.
Inputs are passed as fp32 bits (int32 view), bf16 bits (int16 view) or float16. Outputs are uint8 (FP6 data
through an int32 view: 16 codes = 12 bytes = 3 little-endian words).
"""
