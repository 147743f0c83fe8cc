"""MX element formats, the E8M0 scale, scale rules and element rounding (OCP MX v1.0).

This is the bottom layer of mxkit: constants and bit-exact element codecs in plain PyTorch, with no
knowledge of blocks or tensors. Block scaling lives in :mod:`mxkit.reference`.

Every codec works on CPU and CUDA tensors alike and on any shape (elementwise).

Sources: OCP Microscaling Formats (MX) v1.0 spec, §5.1 (E8M0), §5.3 (FP8), §5.3.2 (FP6), §5.3.3 (FP4),
§5.4 (INT8), §6.3 (the conversion and its shared-exponent rule). Scale rules CEIL / RCEIL / EVEN are the ones
torchao's ``ScaleCalculationMode`` names (RCEIL: NVIDIA cuBLAS "D block quantization" / TransformerEngine;
EVEN: Triton / aiter MXFP4 quantizers).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Optional, Union

import torch

__all__ = [
    "ElementFormat",
    "FORMATS",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXFP6_E3M2",
    "MXFP6_E2M3",
    "MXFP4_E2M1",
    "MXINT8",
    "ScaleMode",
    "Rounding",
    "get_format",
    "E8M0_BIAS",
    "E8M0_NAN",
    "BLOCK_SIZE",
    "encode_elements",
    "decode_elements",
    "e8m0_to_float32",
    "floor_log2",
    "shared_exponent",
    "format_table",
]

BLOCK_SIZE = 32  # OCP MX v1.0 §5: k = 32 for every concrete MX format
E8M0_BIAS = 127  # §5.1: E8M0 value = 2^(byte - 127)
E8M0_NAN = 0xFF  # §5.1: the one NaN encoding; E8M0 has no Inf and no zero
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127

_F32_MANT_BITS = 23
_F32_EXP_MASK = 0x7F800000
_F32_MANT_MASK = 0x007FFFFF


@dataclass(frozen=True)
class ElementFormat:
    """One MX element type (a "concrete MX format" of OCP MX v1.0 §5.2, table 1).

    For the floating-point elements, ``ebits``/``mbits``/``bias`` describe the IEEE-like layout
    ``sign | exponent | mantissa``; ``emax`` is the exponent of the largest normal, the ``emax_elem`` of §6.3.
    For MXINT8 (§5.4) the element is an 8-bit two's complement integer with an implicit scale 2^-6
    (``mbits`` = 6 fraction bits, ``emax`` = 0); it is saturated symmetrically to ±127/64, as microxcaling does
    (code 0x80, -2, is never written; it decodes to -2).

    ``pack`` is how many elements share ``pack_bytes`` bytes in :attr:`MXTensor.qdata`.
    """

    name: str
    kind: str  # "float" | "int"
    bits: int
    ebits: int
    mbits: int
    bias: int
    emax: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool
    spec: str
    pack: int  # elements per pack_bytes
    pack_bytes: int
    torch_dtype: Optional[torch.dtype]  # torch's own dtype for a view of qdata, when torch has one

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal (float formats): 1 - bias."""
        return 1 - self.bias

    @property
    def is_float(self) -> bool:
        """bool: a floating-point element (``kind == "float"``); False for MXINT8."""
        return self.kind == "float"

    @property
    def sign_bit(self) -> int:
        """int: the mask of the sign bit in an element code, ``1 << (bits - 1)`` (0x08 FP4, 0x20 FP6, 0x80 FP8 /
        INT8)."""
        return 1 << (self.bits - 1)

    @property
    def max_code(self) -> int:
        """Magnitude code of ±max_normal (float) or the largest integer (int)."""
        if self.kind == "int":
            return (1 << (self.bits - 1)) - 1
        return _max_magnitude_code(self)

    def bits_per_element(self, block_size: int = BLOCK_SIZE) -> float:
        """Storage bits per element including the shared 8-bit scale (OCP MX v1.0: one E8M0 byte a block).
        Raises ValueError for a block_size that is not a positive int (NumPy's taken)."""
        block_size = as_int(block_size)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        return self.bits + 8.0 / block_size

    def __str__(self) -> str:  # the canonical string name
        return self.name

    def __reduce_ex__(self, protocol):
        # a registered format pickles (and deep-copies) by name, so it comes back as the same object
        if FORMATS.get(self.name) is self:
            return get_format, (self.name,)
        return super().__reduce_ex__(protocol)


def _max_magnitude_code(f: ElementFormat) -> int:
    # E4M3 reserves S.1111.111 for NaN, so its largest magnitude code is 0x7E; IEEE-like E5M2 reserves the
    # top exponent for Inf/NaN (0x7B); the FP6/FP4 formats have no specials and use every code.
    m = (1 << (f.bits - 1)) - 1
    if f.has_inf:
        return m - (1 << f.mbits)
    if f.has_nan:
        return m - 1
    return m


def _fp(name, bits, ebits, mbits, bias, has_inf, has_nan, spec, pack, pack_bytes, torch_dtype):
    emax_field = (1 << ebits) - 1 - (1 if has_inf else 0)
    max_mant = (1 << mbits) - 1 - (1 if (has_nan and not has_inf) else 0)
    emax = emax_field - bias
    max_normal = 2.0**emax * (1 + max_mant / 2**mbits)
    return ElementFormat(
        name=name, kind="float", bits=bits, ebits=ebits, mbits=mbits, bias=bias, emax=emax,
        max_normal=max_normal, min_normal=2.0 ** (1 - bias), min_subnormal=2.0 ** (1 - bias - mbits),
        has_inf=has_inf, has_nan=has_nan, spec=spec, pack=pack, pack_bytes=pack_bytes,
        torch_dtype=torch_dtype,
    )


MXFP8_E4M3 = _fp("mxfp8_e4m3", 8, 4, 3, 7, False, True, "OCP MX v1.0 §5.3.1", 1, 1, torch.float8_e4m3fn)
MXFP8_E5M2 = _fp("mxfp8_e5m2", 8, 5, 2, 15, True, True, "OCP MX v1.0 §5.3.1", 1, 1, torch.float8_e5m2)
MXFP6_E3M2 = _fp("mxfp6_e3m2", 6, 3, 2, 3, False, False, "OCP MX v1.0 §5.3.2", 4, 3, None)
MXFP6_E2M3 = _fp("mxfp6_e2m3", 6, 2, 3, 1, False, False, "OCP MX v1.0 §5.3.2", 4, 3, None)
MXFP4_E2M1 = _fp(
    "mxfp4_e2m1", 4, 2, 1, 1, False, False, "OCP MX v1.0 §5.3.3", 2, 1,
    getattr(torch, "float4_e2m1fn_x2", None),
)
MXINT8 = ElementFormat(
    name="mxint8", kind="int", bits=8, ebits=0, mbits=6, bias=0, emax=0, max_normal=127 / 64,
    min_normal=2.0**-6, min_subnormal=2.0**-6, has_inf=False, has_nan=False, spec="OCP MX v1.0 §5.4",
    pack=1, pack_bytes=1, torch_dtype=torch.int8,
)

FORMATS: dict[str, ElementFormat] = {
    f.name: f for f in (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E3M2, MXFP6_E2M3, MXFP4_E2M1, MXINT8)
}
_ALIASES = {"mxfp4": "mxfp4_e2m1", "mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e2m3"}

FormatLike = Union[str, ElementFormat]


def check_bools(flags: dict, where: str = "") -> None:
    """TypeError naming the first of ``flags`` ({name: value}) that is not a bool: a str such as ``"no"`` is
    truthy, so it was taken as True (``where``: a prefix naming the call)."""
    for name, v in flags.items():
        if not isinstance(v, bool):
            raise TypeError(f"{where}{name} must be a bool, got {v!r}")


def as_int(v):
    """v as a Python int where it is an integer of another type (a NumPy integer: ``__index__``), else v as it is
    (bools, tensors and non-integers are left for the caller's own check to refuse)."""
    if type(v) is int or isinstance(v, (bool, torch.Tensor)) or not hasattr(v, "__index__"):
        return v
    try:
        return v.__index__()
    except TypeError:  # (a NumPy array of one element has __index__ and refuses it: the caller's check names v)
        return v


def get_format(fmt: FormatLike) -> ElementFormat:
    """Return the :class:`ElementFormat` for a name (``"mxfp4"``, ``"mxfp8_e4m3"``, …) or a format.

    Names ignore case and surrounding spaces. The short aliases name one variant of OCP MX v1.0's table 1:
    ``"mxfp4"`` → mxfp4_e2m1 (its only FP4), ``"mxfp6"`` → mxfp6_e2m3 and ``"mxfp8"`` → mxfp8_e4m3 (the
    variants with more mantissa, as torchao's and TransformerEngine's default MXFP8 is E4M3).
    Raises ValueError naming the known formats for an unknown name, TypeError for other types.
    """
    if isinstance(fmt, ElementFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name or ElementFormat, got {type(fmt).__name__}")
    key = fmt.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        names = sorted(FORMATS) + sorted(_ALIASES)
        raise ValueError(f"unknown MX format {fmt!r}; known: {', '.join(names)}")
    return FORMATS[key]


class _ParseEnum(str, enum.Enum):
    @classmethod
    def parse(cls, value):
        """The member for ``value``: a member, or its name as a string (case and surrounding spaces ignored).
        Raises ValueError naming the known values for anything else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        known = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown {cls.__name__} {value!r}; known: {known}")

    def __str__(self) -> str:
        return self.value

    # the str's own C-level hash: a member hashes as its value, as it compares (Enum's Python-level __hash__, of the
    # member's name, cost ~0.3 us in every cached-plan key of the eager quantize path)
    __hash__ = str.__hash__


class ScaleMode(_ParseEnum):
    """How the shared E8M0 exponent X of a block is chosen from the block's amax.

    With ``E(a) = floor(log2 a)`` (exact, from the fp32 bits; fp32 denormals normalised first) and the
    element's ``emax``, the unbiased exponent is clamped to [-127, 127]:

    * ``FLOOR`` — OCP MX v1.0 §6.3: ``X = E(amax) - emax``. Values above the element's max normal
      saturate (FP4 amax 7 → 6).
    * ``CEIL`` — torchao's ``ScaleCalculationMode.CEIL``: ``X = ceil(log2 amax) - emax`` (E(amax), plus one if
      amax is not a power of two).
    * ``RCEIL`` — NVIDIA cuBLAS / TransformerEngine (and triton_kernels' ``DequantScaleRoundingMode.ROUND_UP``
      above the bottom of the range, below): ``X = ceil(log2(amax / max_normal))``, the smallest X
      with ``amax <= max_normal * 2^X``; nothing saturates (but where X would pass 127, MXINT8's amax above
      127/64 * 2^127 only: X is clamped to 127 as in every mode, and the elements saturate). Computed without a
      division:
      ``E(amax) - emax + (mantissa(amax) > mantissa(max_normal))``, which equals the exact quotient rounded
      up to a power of two. The peers round the fp32 quotient, which differs where it is an fp32 denormal
      (amax < max_normal * 2^-126): TransformerEngine's rounding can drop it to 2^-127 (byte 0 there, mxkit's
      byte 1); triton_kernels' ``(bits + 0x7FFFFF) & 0x7F800000`` writes byte 1 for every nonzero quotient up to
      2^-127 (amax <= max_normal * 2^-127), where the exact ceiling, mxkit's, is byte 0 (the codes differ too).
    * ``EVEN`` — aiter's Triton MXFP4 quantizers (``dynamic_mxfp4_quant``; its HIP kernels' default until aiter
      PR #3212, 2026-05, which made RCEIL the default there and EVEN an option) and torchao ``EVEN``: round amax to
      the element's precision first (``bits(amax) + (1 << (22 - mbits))``, masked to the exponent; for FP4 the
      constant is 0x200000), then ``E(·) - emax``. An fp32-denormal amax is normalised first (rounded to mbits + 1
      significant bits, as a normal one is); this differs from the bit formula on the raw bits only for MXINT8,
      every FP format's scale byte being 0 there. Where the rounding carries amax into fp32's exponent 255 (FP4:
      amax >= 1.75 * 2^127), that exponent is taken as 128, as torchao's bit formula does (FP4 byte 253);
      aiter's ``floor(log2(·))`` of the +Inf this makes clamps to 127 instead (byte 254).

    (triton_kernels' other mode, ``ROUND_DOWN``, is ``floor(log2(amax / max_normal))``: not OCP FLOOR, which
    takes the floor of amax alone; the two differ where amax's mantissa is below max_normal's. mxkit has no such
    mode.)

    A block whose amax is 0 gets scale byte 0 in every mode (as torchao); a block holding NaN or ±Inf gets
    the NaN scale 0xFF. Strings ``"floor"``, ``"ceil"``, ``"rceil"``, ``"even"`` are accepted everywhere:
    :meth:`parse` (what :func:`mxkit.quantize` applies to ``scale_mode``) ignores case and surrounding spaces
    (``"FLOOR"``) and raises ValueError for an unknown name or a non-str (the bare ``ScaleMode("FLOOR")`` is
    case-sensitive, as any Enum's).
    """

    FLOOR = "floor"
    CEIL = "ceil"
    RCEIL = "rceil"
    EVEN = "even"


class Rounding(_ParseEnum):
    """How a scaled value is rounded to the element grid. Both saturate to ± max normal (OCP MX v1.0 §6.3: a
    scaled value past the element's max normal is clamped to it; torchao and TransformerEngine saturate alike).

    * ``RNE`` — round to nearest, ties to even (OCP MX v1.0 §6.3, torchao, the hardware FP8 casts
      triton_kernels uses). Default.
    * ``AWAY`` — round to nearest, ties away from zero: microxcaling's ``"nearest"``, older triton_kernels'
      software E2M1 cast (``_compute_quant_and_scale``: ``+ 1 >> 1`` on the kept bits; later versions round ties
      to even, ``RNE``) and aiter's ``dynamic_mxfp4_quant``
      in ``aiter/utility/fp4_utils.py`` before aiter PR #2249 (2026-03) (0.25 → 0.5, 1.25 → 1.5, 2.5 → 3.0,
      5.0 → 6.0). That PR made it round ties to even, as aiter's other quantizer (``aiter.ops.triton.quant``)
      and its HIP kernels (PR #3992) do: current aiter is ``RNE``.

    Strings ``"rne"`` / ``"away"`` are accepted where a Rounding is: :meth:`parse` ignores case and surrounding
    spaces (``"RNE"``) and raises ValueError for an unknown name or a non-str (``"nearest"``).
    """

    RNE = "rne"
    AWAY = "away"


# ---------------------------------------------------------------------------------------------------------
# fp32 bit helpers (exact; no transcendental functions anywhere)


try:
    import torch._C._functorch as _functorch

    _is_batched = _functorch.is_batchedtensor
except (ImportError, AttributeError):  # (a torch without functorch's C bindings: nothing is batched)
    _functorch = _is_batched = None


def bitcast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.view(dtype)`` for a dtype of the same element size, also under ``torch.func.vmap``: a batched tensor is
    viewed through its unbatched value (torch 2.11's vmap has no batching rule for ``aten::view.dtype``)."""
    if _is_batched is not None and _is_batched(t):
        level, bdim = _functorch.maybe_get_level(t), _functorch.maybe_get_bdim(t)
        return _functorch._add_batch_dim(bitcast(_functorch.get_unwrapped(t), dtype), bdim, level)
    return t.view(dtype)


def _f32_bits(x: torch.Tensor) -> torch.Tensor:
    # (a negative-bit view: a dtype view of it raises; resolved, the bits of its values)
    return bitcast(x.to(torch.float32).resolve_neg().contiguous(), torch.int32)


def _exp2_f32(e: torch.Tensor) -> torch.Tensor:
    """Exact 2^e as float32 for integer tensors e in [-149, 127] (denormal powers included)."""
    e = e.to(torch.int32)
    normal = (e.clamp(-126, 127) + 127) << _F32_MANT_BITS
    denormal = torch.ones_like(e) << (e.clamp(-149, -127) + 149)  # 2^e = (1 << (e + 149)) * 2^-149
    return bitcast(torch.where(e >= -126, normal, denormal), torch.float32)


def _check_float_input(t: torch.Tensor, who: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who} takes a float32, bfloat16 or float16 tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{who} takes float32, bfloat16 or float16 values, got {t.dtype}")


def floor_log2(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``(E, frac)`` of float32 magnitudes: ``|a| = (1 + frac / 2^23) * 2^E``.

    a: float32 | bfloat16 | float16 (read as float32), its sign ignored; meant for finite values (NaN and Inf give
    meaningless E). fp32 denormals are normalised (E down to -149). For ``a == 0`` returns E = -150, frac = 0.
    Returns two int32 tensors of a's shape. Raises TypeError for a non-tensor or another dtype (a float64 value
    would be rounded to float32 first: its E could be off by one, or Inf's).
    """
    _check_float_input(a, "floor_log2")
    bits = _f32_bits(a) & 0x7FFFFFFF
    is_denormal = bits < (1 << _F32_MANT_BITS)
    # Scaling a denormal by 2^64 is exact and makes it normal; undo the 64 afterwards.
    renorm = _f32_bits(a.to(torch.float32).abs() * 2.0**64) & 0x7FFFFFFF
    bits = torch.where(is_denormal, renorm, bits)
    e = ((bits >> _F32_MANT_BITS) & 0xFF) - 127 - torch.where(is_denormal, 64, 0).to(torch.int32)
    e = torch.where(bits == 0, torch.full_like(e, -150), e)
    return e.to(torch.int32), (bits & _F32_MANT_MASK).to(torch.int32)


def shared_exponent(amax: torch.Tensor, fmt: FormatLike, scale_mode: Union[str, ScaleMode]) -> torch.Tensor:
    """Biased E8M0 scale byte (uint8) for each block amax (float32, bfloat16 or float16, >= 0 or NaN/Inf).

    Rules in :class:`ScaleMode`. amax == 0 → 0; NaN or Inf → 0xFF. The unbiased exponent is clamped to
    [-127, 127], so finite blocks get bytes 0 … 254; a negative amax is read as its magnitude. Raises TypeError
    for another dtype (a float64 amax would be rounded to float32 first: a second rounding that can move the
    byte), ValueError for an unknown format or mode name.
    """
    f = get_format(fmt)
    mode = ScaleMode.parse(scale_mode)
    _check_float_input(amax, "shared_exponent")
    amax = amax.to(torch.float32)
    if mode is ScaleMode.EVEN:
        # round amax at the element's mantissa width: adding half an element-ulp to the fp32 bits carries
        # into the exponent exactly when amax rounds up to the next power of two; the mask drops the mantissa
        e, frac = floor_log2(amax)
        normalised = ((e.clamp(-126, 127) + 127) << _F32_MANT_BITS) | frac  # exact fp32 bits of a·2^k form
        rounded = (normalised + (1 << (_F32_MANT_BITS - 1 - f.mbits))) & _F32_EXP_MASK
        x = ((rounded >> _F32_MANT_BITS) - 127) + (e - e.clamp(-126, 127))
    else:
        x, frac = floor_log2(amax)
        if mode is ScaleMode.CEIL:
            x = x + (frac != 0).to(torch.int32)
        elif mode is ScaleMode.RCEIL:
            # amax <= max_normal * 2^X  <=>  compare mantissas once the exponents are aligned
            # (max_normal's float32 mantissa field, from Python: no tensor on torch's default device)
            max_frac = struct.unpack("<I", struct.pack("<f", f.max_normal))[0] & _F32_MANT_MASK
            x = x + (frac > max_frac).to(torch.int32)
    x = (x - f.emax).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    byte = (x + E8M0_BIAS).to(torch.uint8)
    byte = torch.where(amax == 0, torch.zeros_like(byte), byte)
    return torch.where(torch.isfinite(amax), byte, torch.full_like(byte, E8M0_NAN))


def e8m0_to_float32(scale: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 bytes (uint8 or float8_e8m0fnu) to float32: 2^(byte - 127), 0xFF → NaN (OCP MX v1.0 §5.1:
    the E8M0 scale has no zero and no Inf, 0xFF its only NaN).

    Byte 0 decodes to 2^-127, an fp32 denormal, exactly. Raises TypeError for any other dtype (a wider
    integer or float tensor is not a tensor of E8M0 bytes).
    """
    if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise TypeError(f"E8M0 scales must be a uint8 or float8_e8m0fnu tensor, got "
                        f"{getattr(scale, 'dtype', type(scale).__name__)}")
    s = bitcast(scale, torch.uint8) if scale.dtype != torch.uint8 else scale
    v = _exp2_f32(s.to(torch.int32) - E8M0_BIAS)
    return torch.where(s == E8M0_NAN, torch.full_like(v, float("nan")), v)


# ---------------------------------------------------------------------------------------------------------
# element codecs


def encode_elements(v: torch.Tensor, fmt: FormatLike, rounding: Union[str, Rounding] = Rounding.RNE) -> torch.Tensor:
    """Round already-scaled values to element codes (uint8, one code per element, unpacked).

    v: float32, bfloat16 or float16 (any shape). Saturates to ± max normal (±Inf too); never produces an Inf
    code. NaN gives the format's NaN code (0x7F: E4M3, E5M2) and, in a format without one (FP6, FP4, INT8),
    code 0 (+0; :func:`~mxkit.reference.quantize_reference` never passes NaN: it marks the block's scale 0xFF).
    The sign of the input is kept on zero results for float formats (−0.1 → −0, as torchao and torch's fp8
    casts); MXINT8 has no −0. Codes for sub-byte formats sit in the low bits (FP4: 0..15, FP6: 0..63); MXINT8
    codes are the two's complement byte. Saturation: OCP MX v1.0 §6.3; NaN → +0 in the formats without a NaN code
    is mxkit's own choice (no peer writes one). Raises TypeError for another dtype (float64 would be rounded
    twice), ValueError for an unknown format or rounding name.
    """
    f = get_format(fmt)
    rnd = Rounding.parse(rounding)
    _check_float_input(v, "encode_elements")
    v = v.to(torch.float32)
    nan = torch.isnan(v)
    v = torch.where(nan, torch.zeros_like(v), v)  # (rounding NaN to an integer is undefined)
    nan_code = f.sign_bit - 1 if (f.has_nan or f.has_inf) else 0
    neg = _f32_bits(v) < 0
    a = v.abs().clamp(max=f.max_normal)  # saturate first: rounding is monotone and max_normal is on the grid
    if f.kind == "int":
        n = _round_to_int(a * 2.0**f.mbits, rnd).to(torch.int32)  # exact: power-of-two scaling
        n = torch.where(neg, -n, n)
        return torch.where(nan, nan_code, n & 0xFF).to(torch.uint8)
    e, _ = floor_log2(a)
    e = e.clamp(min=f.emin)  # below min normal the grid spacing stays at the subnormal step
    q = a * _exp2_f32(f.mbits - e)  # exact: a / ulp with ulp = 2^(e - mbits)
    n = _round_to_int(q, rnd).to(torch.int32)  # in [0, 2^(mbits+1)]
    # code = (e - emin) << mbits + n covers subnormals (e = emin, n < 2^mbits), the subnormal → normal
    # carry (n = 2^mbits) and the binade carry (n = 2^(mbits+1)) in one expression
    code = ((e - f.emin) << f.mbits) + n
    code = torch.where(neg, code | f.sign_bit, code)
    return torch.where(nan, nan_code, code).to(torch.uint8)


def _round_to_int(q: torch.Tensor, rnd: Rounding) -> torch.Tensor:
    if rnd is Rounding.RNE:
        return torch.round(q)  # half to even
    fl = torch.floor(q)
    return fl + ((q - fl) >= 0.5).to(q.dtype)  # q - floor(q) is exact, so the tie test is exact


def decode_elements(codes: torch.Tensor, fmt: FormatLike) -> torch.Tensor:
    """Element codes (uint8, or another integer dtype; unpacked, any shape) → float32 values, exactly.

    E4M3 0x7F/0xFF and E5M2's NaN codes decode to NaN, E5M2 Inf codes to ±Inf. A code outside [0, 2^fmt.bits)
    (bits above the format's, or negative) is no element's: it decodes to NaN (mxkit's convention). A float8
    tensor (:meth:`MXTensor.qdata_view`'s E4M3 / E5M2 view) or an int8 one is read as its bytes.
    Raises TypeError for any other floating, bool or complex dtype (its values are not codes), ValueError for an
    unknown format name.
    """
    f = get_format(fmt)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"decode_elements takes a tensor of element codes (uint8), got {type(codes).__name__}")
    if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8):  # (int8: the bytes, two's complement)
        codes = bitcast(codes, torch.uint8)
    elif codes.dtype == torch.bool or codes.dtype.is_floating_point or codes.dtype.is_complex:
        raise TypeError(f"decode_elements takes element codes (uint8), got {codes.dtype}")
    # (int64 for the wide dtypes: int32 wrapped a uint64 code of 2^32 + 3 to code 3; a uint64 past 2^63 turns
    # negative, out of range too)
    c = codes.to(torch.int64 if codes.dtype in (torch.int64, torch.uint32, torch.uint64) else torch.int32)
    val = _decode_codes(c, f)
    if codes.dtype == torch.uint8 and f.bits == 8:  # (every byte is a code)
        return val
    return torch.where((c < 0) | (c >= 1 << f.bits), float("nan"), val)


def _decode_codes(c: torch.Tensor, f: ElementFormat) -> torch.Tensor:
    """decode_elements of int32 / int64 codes in [0, 2^f.bits)."""
    if f.kind == "int":
        c = torch.where(c >= 128, c - 256, c)
        return c.to(torch.float32) * 2.0**-f.mbits
    mag = c & (f.sign_bit - 1)
    exp_field = mag >> f.mbits
    mant = mag & ((1 << f.mbits) - 1)
    # subnormal (exp_field 0): mant * 2^(emin - mbits); normal: (2^mbits + mant) * 2^(exp_field - bias - mbits)
    sig = torch.where(exp_field == 0, mant, mant + (1 << f.mbits))
    e = torch.where(exp_field == 0, torch.full_like(exp_field, f.emin), exp_field - f.bias) - f.mbits
    val = sig.to(torch.float32) * _exp2_f32(e)
    if f.has_inf:
        top = exp_field == (1 << f.ebits) - 1
        val = torch.where(top & (mant == 0), torch.full_like(val, float("inf")), val)
        val = torch.where(top & (mant != 0), torch.full_like(val, float("nan")), val)
    elif f.has_nan:
        val = torch.where(mag == (f.sign_bit - 1), torch.full_like(val, float("nan")), val)
    return torch.where((c & f.sign_bit) != 0, -val, val)


def format_table() -> list[dict]:
    """One row per format: the constants of OCP MX v1.0 table 1 plus storage cost, for `mxkit formats`."""
    rows = []
    for f in FORMATS.values():
        rows.append(
            {
                "format": f.name,
                "aliases": sorted(a for a, n in _ALIASES.items() if n == f.name),
                "element": "INT8" if f.kind == "int" else f"E{f.ebits}M{f.mbits}",
                "bits": f.bits,
                "emax": f.emax,
                "max_normal": f.max_normal,
                "min_normal": f.min_normal,
                "min_subnormal": f.min_subnormal if f.kind == "float" else None,
                "inf": f.has_inf,
                "nan": f.has_nan,
                "bits_per_element": f.bits_per_element(),
                "spec": f.spec,
            }
        )
    return rows
