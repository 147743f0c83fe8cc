"""FP8 E4M3 rowwise quantization (one float32 scale per row: TensorRT-LLM's per-token FP8, the W4A8 activations):
one pass over x for rows that fit one tile, else two passes over the row (the second from L2).
The rule and its reference twin: :func:`mxkit.reference.quantize_fp8_rowwise_reference`."""

from __future__ import annotations

import triton
import triton.language as tl

from ._codecs import _encode


@triton.jit
def _fp8_codes(y, HW_CVT: tl.constexpr):
    # E4M3 codes (uint8) of float32 y, saturated to +-448 and rounded to nearest even: HW_CVT by Triton's fp32 ->
    # fp8e4nv conversion (cvt.rn.satfinite on sm_89+), else (the interpreter, whose conversion rounds ties away
    # and can drop the carry into the exponent) by _encode's magic-number add; NaN as the code 0x7F
    nan = y != y
    if HW_CVT:
        code = tl.where(nan, float("nan"), y).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        yb = y.to(tl.int32, bitcast=True)
        code = tl.where(nan, 0x7F, _encode(yb, tl.zeros_like(yb), nan, 8, 3, -6, 8, False, 448.0, False)).to(tl.uint8)
    return code


@triton.jit
def _fp8_cast_rows(x, scale, HW_CVT: tl.constexpr):
    # E4M3 codes (uint8) of x / scale (IEEE division, as the reference's): :func:`_fp8_codes`
    return _fp8_codes(tl.math.div_rn(x, scale), HW_CVT)


@triton.jit
def _load_f32(ptrs, m, BF16_BITS: tl.constexpr):
    # fp32 values of x (bf16 passed as its int16 bits: the exact shift also under the interpreter, whose bf16
    # conversion loses subnormals)
    if BF16_BITS:
        return (tl.load(ptrs, mask=m, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.load(ptrs, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _row_scale(amax, nans):
    # amax / 448 (IEEE division) but at least 2^-149 (the bit pattern 1: a row of fp32 denormals keeps a scale),
    # 1 for a row of zeros, NaN for a row holding NaN (tl.max skips NaN: counted)
    tiny = tl.full(amax.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, tl.maximum(tl.math.div_rn(amax, 448.0), tiny), 1.0)
    return tl.where(nans > 0, float("nan"), scale)


@triton.jit
def _fp8_rowwise_kernel(x_ptr, q_ptr, s_ptr, R, K, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                        ONE_PASS: tl.constexpr, BF16_BITS: tl.constexpr, HW_CVT: tl.constexpr):
    """Rows [ROWS * pid, + ROWS) of x [R, K] (float32 / bfloat16 bits as int16 / float16, contiguous) -> q uint8
    [R, K] (E4M3 codes), s float32 [R]: s = max(amax|row| / 448, 2^-149) (1 for a row of zeros, NaN for a row
    holding NaN).
    ONE_PASS: K <= BLOCK_K (else a pass for the amax, a second for the codes, from L2). HW_CVT: the hardware
    conversion (GPU only)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    base = rows.to(tl.int64) * K
    c = tl.arange(0, BLOCK_K)
    if ONE_PASS:  # K <= BLOCK_K: the row stays in registers
        m = rmask[:, None] & (c < K)[None, :]
        x = _load_f32(x_ptr + base[:, None] + c[None, :], m, BF16_BITS)
        scale = _row_scale(tl.max(tl.abs(x), axis=1), tl.sum((x != x).to(tl.int32), axis=1))
        tl.store(s_ptr + rows, scale, mask=rmask)
        tl.store(q_ptr + base[:, None] + c[None, :], _fp8_cast_rows(x, scale[:, None], HW_CVT), mask=m)
    else:
        amax = tl.zeros([ROWS], dtype=tl.float32)
        nans = tl.zeros([ROWS], dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            m = rmask[:, None] & (k0 + c < K)[None, :]
            x = _load_f32(x_ptr + base[:, None] + k0 + c[None, :], m, BF16_BITS)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
            nans += tl.sum((x != x).to(tl.int32), axis=1)
        scale = _row_scale(amax, nans)
        tl.store(s_ptr + rows, scale, mask=rmask)
        for k0 in range(0, K, BLOCK_K):
            m = rmask[:, None] & (k0 + c < K)[None, :]
            x = _load_f32(x_ptr + base[:, None] + k0 + c[None, :], m, BF16_BITS)
            tl.store(q_ptr + base[:, None] + k0 + c[None, :], _fp8_cast_rows(x, scale[:, None], HW_CVT), mask=m)
