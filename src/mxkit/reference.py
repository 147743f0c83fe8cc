"""The bit-exact reference: MX quantize / dequantize / matmul in vectorised PyTorch (CPU or CUDA).

This module is the specification every kernel is tested against (byte equality for quantize and
dequantize). Its GEMM, :func:`matmul_reference`, multiplies the dequantized operands in float32 at full
precision (TF32 and oneDNN's bf16 off whatever the process-wide setting) with one rounding; the GEMM tests hold
every path, this one included, to a bound against the float64 product of the dequantized operands. It favours
clarity over speed but has no Python loop over elements or blocks.

Quantize, per block of ``block_size`` elements along ``axis`` (OCP MX v1.0 §6.3):

1. ``amax`` = max |x| over the block (inputs upcast to float32 exactly).
2. Scale byte from :func:`mxkit.formats.shared_exponent` (rule :class:`~mxkit.formats.ScaleMode`).
3. Elements ``x * 2^-X`` (exact power-of-two scaling) rounded by :func:`mxkit.formats.encode_elements`
   (RNE or ties-away, saturating to ± max normal).

Special blocks: any NaN or ±Inf in a block → scale 0xFF and element bytes 0 (dequantizes to all NaN);
an all-zero block → scale byte 0 and element bytes 0 (−0 keeps its sign bit). Scale byte 0 means 2^-127
exactly; torchao divides by 2^-126 instead for such blocks (its ``F32_MIN_NORMAL`` clamp) and TE / torchao
RCEIL multiply by 1 — they differ from the spec only for blocks with amax < max_normal * 2^-126.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ._autocast import autocast_off
from ._precision import exact_matmul
from .formats import (
    BLOCK_SIZE,
    E8M0_BIAS,
    E8M0_NAN,
    FormatLike,
    Rounding,
    ScaleMode,
    _exp2_f32,
    bitcast,
    decode_elements,
    e8m0_to_float32,
    encode_elements,
    get_format,
    shared_exponent,
)
from .tensor import MXTensor, check_out_dtype, check_quantize_args

__all__ = [
    "quantize_reference",
    "dequantize_reference",
    "matmul_reference",
    "pack_codes",
    "unpack_codes",
    "block_amax",
]


def pack_codes(codes: torch.Tensor, fmt: FormatLike) -> torch.Tensor:
    """Pack element codes (uint8, last dim n, one code per byte) into qdata bytes along the last dim.

    FP4: two codes per byte, element 2i in the low nibble → (..., n // 2) (torch's ``float4_e2m1fn_x2``, torchao
    and the GPT-OSS checkpoints' order).
    FP6: four codes per 3 bytes, little-endian word ``a | b << 6 | c << 12 | d << 18`` → (..., 3n // 4) (mxkit's
    own packing: OCP MX v1.0 specifies none).
    FP8 / INT8: unchanged.
    Raises TypeError for codes that are not a uint8 tensor; ValueError for a 0-d tensor, a last dim that is not a
    multiple of the format's packing (2 for FP4, 4 for FP6), or a code of more than the format's bits.
    """
    f = get_format(fmt)
    _check_code_tensor(codes, "codes", f.pack, "codes")
    if (f.bits < 8 and codes.numel() and not codes.is_meta and not torch.compiler.is_compiling()
            and bool((codes >> f.bits).any())):  # (a host read: not on meta tensors, nor while tracing)
        raise ValueError(f"codes hold a value past {f.bits} bits ({f.name} codes are 0 .. {(1 << f.bits) - 1})")
    return _pack_codes(codes, f)


def _pack_codes(codes: torch.Tensor, f) -> torch.Tensor:
    """:func:`pack_codes` of valid codes (uint8 below 2^bits, a last dim that packs), unchecked."""
    if f.pack == 1:
        return codes
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], codes.shape[-1] // f.pack, f.pack)
    if f.bits == 4:
        return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
    b = torch.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], dim=-1)
    return b.reshape(*codes.shape[:-1], codes.shape[-1] * 3 // 4).to(torch.uint8)


def _check_code_tensor(t, name: str, multiple: int, what: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise TypeError(f"{name} must be a uint8 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (..., n)")
    if t.shape[-1] % multiple:
        raise ValueError(f"{name} of shape {tuple(t.shape)}: the last dim must be a multiple of {multiple} ({what})")


def unpack_codes(qdata: torch.Tensor, fmt: FormatLike) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: qdata bytes (..., m) → element codes (uint8) (..., m * pack / pack_bytes).
    Raises TypeError for qdata that is not a uint8 tensor; ValueError for a 0-d tensor or an m that is not a
    multiple of the format's packed bytes (3 for FP6)."""
    f = get_format(fmt)
    _check_code_tensor(qdata, "qdata", f.pack_bytes, "packed bytes")
    if f.pack == 1:
        return qdata
    q = qdata.to(torch.int32)
    if f.bits == 4:
        c = torch.stack([q & 0xF, q >> 4], dim=-1)
        return c.reshape(*qdata.shape[:-1], qdata.shape[-1] * 2).to(torch.uint8)
    b = q.reshape(*qdata.shape[:-1], qdata.shape[-1] // 3, 3)
    w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    c = torch.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], dim=-1)
    return c.reshape(*qdata.shape[:-1], qdata.shape[-1] * 4 // 3).to(torch.uint8)


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """blocks (..., B) → (...) max |x| over the last dim, in blocks' dtype (the reference passes float32 blocks);
    NaN if the block holds a NaN."""
    return blocks.abs().amax(dim=-1)


def quantize_reference(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    axis: int = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
) -> MXTensor:
    """Quantize ``x`` to an MX format along ``axis``: the reference (spec) implementation.

    x: float32 | bfloat16 | float16, any rank ≥ 1, CPU or CUDA, ``x.shape[axis] % block_size == 0``.
    fmt: ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp6_e3m2"``, ``"mxfp6_e2m3"``, ``"mxfp4_e2m1"``
      (``"mxfp4"``), ``"mxint8"`` or an :class:`~mxkit.formats.ElementFormat`.
    scale_mode: :class:`~mxkit.formats.ScaleMode` or its name (``"floor"`` = OCP §6.3, default).
    rounding: ``"rne"`` (default) or ``"away"`` (:class:`~mxkit.formats.Rounding`).

    Returns an :class:`~mxkit.MXTensor` (``qdata`` uint8 with ``axis`` moved last and packed,
    ``scale`` uint8 E8M0). Raises TypeError for a wrong dtype, ValueError for an empty tensor, a bad axis,
    an axis length that is not a multiple of ``block_size``, or an unknown format / mode name.
    """
    args = check_quantize_args(x, fmt, axis, block_size, scale_mode, rounding)
    f = args.fmt
    xm = x.movedim(args.axis, -1).to(torch.float32)
    lead, n = xm.shape[:-1], xm.shape[-1]
    blocks = xm.reshape(*lead, n // block_size, block_size)

    nonfinite = ~torch.isfinite(blocks).all(dim=-1)
    scale = shared_exponent(block_amax(blocks), f, args.scale_mode)
    scale = torch.where(nonfinite, torch.full_like(scale, E8M0_NAN), scale)

    # x * 2^-X is exact whenever the result is an fp32 normal; results below 2^-126 lie far under half
    # the smallest element step (≥ 2^-17) and round to ±0 either way
    x_exp = torch.where(nonfinite, 0, scale.to(torch.int32) - E8M0_BIAS)
    v = blocks * _exp2_f32(-x_exp).unsqueeze(-1)
    codes = encode_elements(v, f, args.rounding)
    codes = torch.where(nonfinite.unsqueeze(-1), torch.zeros_like(codes), codes)
    qdata = _pack_codes(codes.reshape(*lead, n), f)
    return MXTensor(qdata, scale, f, args.axis, block_size, x.shape, args.scale_mode, args.rounding)


def dequantize_reference(q: MXTensor, dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
    """Decode an :class:`~mxkit.MXTensor` to a dense tensor of its logical shape.

    Each element is ``decode(code) * 2^(scale - 127)`` computed in float32 (IEEE, round to nearest even;
    exact unless the product overflows: MX values above fp32 max, reachable with CEIL/RCEIL/EVEN scales near
    2^127, become ±Inf; products down to the smallest, 2^-143, are exact fp32 subnormals: at most 7 significant
    bits), then cast to ``dtype`` (float32 | bfloat16 | float16;
    round to nearest even). For ``dtype=float64`` the product is computed in float64 and is always exact.
    Scale 0xFF and the element NaN codes give NaN, always the canonical positive quiet NaN of ``dtype``
    (:data:`CANONICAL_NAN_BITS`: torch's own, float32 0x7FC00000, bfloat16 0x7FC0, float16 0x7E00), on every device,
    whatever the NaN's sign or how the arithmetic produced it (CUDA's float32 NaN is 0x7FFFFFFF): the Triton
    dequantize writes the same bytes. Raises TypeError for a ``q`` that is not an MXTensor or a ``dtype`` other
    than float32 / bfloat16 / float16 / float64 (None: float32).
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    dtype = check_out_dtype(dtype)
    codes = unpack_codes(q.qdata, q.fmt)
    vals = decode_elements(codes, q.fmt)
    lead, n = vals.shape[:-1], vals.shape[-1]
    scale = q.plain_scale()
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    s = e8m0_to_float32(scale).to(compute).unsqueeze(-1)
    out = (vals.to(compute).reshape(*lead, n // q.block_size, q.block_size) * s).reshape(*lead, n)
    return canonical_nan(out.to(dtype)).movedim(-1, q.axis)


# the canonical positive quiet NaN of each float dtype (the bits torch writes for float("nan"))
CANONICAL_NAN_BITS = {torch.float64: (torch.int64, 0x7FF8000000000000), torch.float32: (torch.int32, 0x7FC00000),
                      torch.bfloat16: (torch.int16, 0x7FC0), torch.float16: (torch.int16, 0x7E00)}


def canonical_nan(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every NaN replaced by :data:`CANONICAL_NAN_BITS` of its dtype, selected on the integer bits (a
    float NaN constant would go through the device's own NaN on CUDA). Other values keep their bytes."""
    int_dtype, bits = CANONICAL_NAN_BITS[x.dtype]
    return bitcast(torch.where(torch.isnan(x), bits, bitcast(x, int_dtype)), x.dtype)


def round_from_float64(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``x`` rounded ONCE to ``dtype`` (round to nearest even), as the reference results are specified.
    torch's float64 -> bfloat16 / float16 conversion goes through float32 and so rounds twice (a value just
    below a bf16 tie becomes the tie in float32, then goes to even); here the float32 step rounds to odd
    (truncate, then set the last bit where inexact), which keeps the final rounding exact for any format at
    least two bits narrower than float32. Other dtypes: a plain ``.to``. Differentiable like ``.to`` (where x
    needs a gradient, the rounded value is attached to ``x.to(dtype)``'s graph)."""
    if dtype not in (torch.bfloat16, torch.float16) or x.dtype != torch.float64:
        return x.to(dtype)
    if x.requires_grad and torch.is_grad_enabled():  # the bit steps below are not differentiable
        return _RoundOnce.apply(x, dtype)
    r = x.to(torch.float32)
    # r rounded to nearest: step it toward zero where it rounded away from it (finite values only)
    away = torch.isfinite(r) & (r.to(torch.float64).abs() > x.abs())
    bits = bitcast(r, torch.int32) - away.to(torch.int32)  # |r| one float32 ulp smaller (same sign)
    inexact = torch.isfinite(r) & (bitcast(bits, torch.float32).to(torch.float64) != x)
    odd = bitcast(bits | inexact.to(torch.int32), torch.float32)
    return odd.to(dtype)


class _RoundOnce(torch.autograd.Function):
    """:func:`round_from_float64` with the gradient of ``.to(dtype)`` (the identity, cast back)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return round_from_float64(x, dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g.to(torch.float64), None


@autocast_off
def matmul_reference(
    a: Union[torch.Tensor, MXTensor],
    b: MXTensor,
    *,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """``y = a @ b.T`` with ``b`` an MX weight, computed in float32 on the dequantized operands, at full float32
    precision whatever ``torch.set_float32_matmul_precision`` / TF32 say (:class:`mxkit._precision.exact_float32`),
    then rounded once to ``out_dtype``. Values past float32's range overflow to ±inf.

    a: float tensor (..., K) (float32 | bfloat16 | float16) or an MXTensor quantized along its last axis.
    b: MXTensor of logical shape (N, K) quantized along K (axis 1, the ``nn.Linear`` weight layout).
    out_dtype: default ``a.dtype`` for a float ``a``, bfloat16 for an MXTensor ``a``.
    Returns (..., N). Raises TypeError for a ``b`` that is not an MXTensor, an ``a`` dtype other than float32 /
    bfloat16 / float16, or an ``out_dtype`` other than the four; ValueError on a K mismatch or a ``b`` not
    quantized along K.
    """
    if not isinstance(b, MXTensor):
        raise TypeError(f"b must be an MXTensor (N, K), got {type(b).__name__}")
    if b.ndim != 2 or b.axis != 1:
        raise ValueError(f"b must be 2-D (N, K) quantized along K (axis=1); got shape {tuple(b.shape)}, axis={b.axis}")
    if isinstance(a, MXTensor):
        if a.axis != a.ndim - 1:
            raise ValueError(f"an MXTensor a must be quantized along its last axis, got axis={a.axis}")
        a_f = dequantize_reference(a, torch.float32)
        default_dtype = torch.bfloat16
    elif isinstance(a, torch.Tensor):
        if a.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"a.dtype={a.dtype} is not supported; expected float32, bfloat16 or float16")
        if a.dim() == 0:
            raise ValueError("a must have at least one dimension (..., K)")
        a_f = a.to(torch.float32).contiguous()  # (BLAS picks its kernel by layout: the bits of the contiguous copy)
        default_dtype = a.dtype
    else:
        raise TypeError(f"a must be a tensor or MXTensor, got {type(a).__name__}")
    if a_f.shape[-1] != b.shape[1]:
        raise ValueError(f"K mismatch: a has K={a_f.shape[-1]}, b (N, K) = {tuple(b.shape)}")
    if a_f.device != b.device:
        raise ValueError(f"a is on {a_f.device} but b on {b.device}")
    b_f = dequantize_reference(b, torch.float32).contiguous()  # (an FP8 / INT8 b of strided qdata: strided values)
    y = exact_matmul(a_f, b_f.t())  # (not TF32, nor oneDNN's bf16 under a "medium" float32 precision)
    return y.to(check_out_dtype(out_dtype or default_dtype))


def quantize_fp8_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 with one float32 scale per row (TensorRT-LLM's per-token FP8; the W4A8 activations).

    x: (..., K) float32 | bfloat16 | float16. In float32: ``scale = amax(|row|) / 448`` (IEEE division, at least
    2^-149, the smallest fp32 denormal, so a row of fp32 denormals keeps a scale; 1 for a row of zeros, K = 0
    included; NaN for a row holding NaN), ``data = E4M3(x / scale)`` after clamping to ±448, rounded
    to nearest even (E4M3 subnormals included). NaN is canonical: scale 0x7FC00000, data code 0x7F (an Inf in a
    row makes its scale Inf, that element NaN and the rest ±0). Returns (data float8_e4m3fn (..., K), scale
    float32 (..., 1)). The twin of :func:`mxkit.kernels.quantize.quantize_fp8_rowwise_triton` (byte-identical).
    Raises TypeError for an x that is not a float32 / bfloat16 / float16 tensor, ValueError for a 0-d x."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be a float32 / bfloat16 / float16 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., K)")
    xf = x.to(torch.float32)
    if x.shape[-1]:
        amax = xf.abs().amax(dim=-1, keepdim=True)
    else:
        amax = torch.zeros(*x.shape[:-1], 1, device=x.device, dtype=torch.float32)
    # (at least 2^-149: an amax under 448 * 2^-150 would make the quotient 0, and the row's zeros 0 / 0 = NaN)
    scale = torch.where(amax > 0, (amax / 448.0).clamp_min(2.0**-149), torch.ones_like(amax))
    scale = torch.where(torch.isnan(amax), float("nan"), scale)
    y = (xf / scale).clamp(-448.0, 448.0)
    data = torch.where(torch.isnan(y), float("nan"), y).to(torch.float8_e4m3fn)
    return data.contiguous(), scale.contiguous()
