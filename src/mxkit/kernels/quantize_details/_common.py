"""Constants and shared helpers of the quantize / dequantize jit code: the element-format spec, input / output
kinds, eviction hints, scale-layout ids, loads, bit views, block amax of bf16 pairs, program-id arithmetic."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import triton
import triton.language as tl

from ...formats import ElementFormat
from ...layouts import aiter_shuffle, nvidia_128x4, plain


@dataclass(frozen=True)
class ElementSpec:
    """The constants of one element format that the jit code reads, passed as ONE constexpr (``FMT``; the kernels
    read ``FMT.bits``, ``FMT.mbits``, ...): named fields, so no positional constexpr can be misordered. Frozen and
    hashable (Triton keys its compile cache on the value). Built by :func:`element_spec`.

    bits / mbits: element width and mantissa bits; emin: exponent of the smallest normal (MXINT8: -6, its fixed
    step 2^-6); emax: exponent of max_normal (the scale rule's offset); bias: exponent bias (decode); is_int:
    MXINT8; has_inf / has_nan: the element has Inf / NaN codes; max_normal: the saturation value; max_frac: the
    23-bit fp32 mantissa of max_normal (the RCEIL rule)."""

    bits: int
    mbits: int
    emin: int
    emax: int
    bias: int
    is_int: bool
    has_inf: bool
    has_nan: bool
    max_normal: float
    max_frac: int

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f) for f in self.__dataclass_fields__)))

    def __hash__(self) -> int:  # computed once: every launch hashes its constexprs (the direct launch's key)
        return self._hash


@functools.lru_cache(maxsize=None)
def element_spec(f: ElementFormat) -> ElementSpec:
    """The :class:`ElementSpec` of format f."""
    max_frac = struct.unpack("<I", struct.pack("<f", f.max_normal))[0] & 0x7FFFFF
    return ElementSpec(bits=f.bits, mbits=f.mbits, emin=f.emin if f.is_float else -6, emax=f.emax, bias=f.bias,
                       is_int=not f.is_float, has_inf=f.has_inf, has_nan=f.has_nan,
                       max_normal=float(f.max_normal), max_frac=max_frac)


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

# load eviction hints (_load_raw)
EVICT_LAST = tl.constexpr(1)
EVICT_FIRST = tl.constexpr(2)

# scale layouts (ids from mxkit.layouts' registry)
LAYOUT_PLAIN = tl.constexpr(plain.KERNEL_ID)
LAYOUT_NV128X4 = tl.constexpr(nvidia_128x4.KERNEL_ID)
LAYOUT_AITER = tl.constexpr(aiter_shuffle.KERNEL_ID)
LAYOUT_PLAIN_T = tl.constexpr(plain.KERNEL_ID_T)  # a plain scale stored transposed, [ncols, rows] (cols_p = rows)


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
def _split4(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 4] -> its four [A, B] slices along the last dim (register renames when the 4 are in-thread)."""
    x0, x1 = tl.split(tl.reshape(t, [A, B, 2, 2]))  # x_j[., ., i]: element 2i + j
    e0, e2 = tl.split(x0)
    e1, e3 = tl.split(x1)
    return e0, e1, e2, e3


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
    XOR of the two signs, cleared once after the block's last step (:func:`_block_absmax`). A step of the amax
    over bf16 pairs (FP4: _rows_fp4_pairs, _cols_fp4_words, _cols_fp4_units; FP6: _rows_fp6_pairs,
    _cols_fp6_pairs). Checked on the GPU against the integer max of the masked halves for every bf16 class
    (tests/kernel_tests/test_codecs.py)."""
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
def _half_row(L):
    """Bytes per FP4 row of a quantized dim of length L: L is a multiple of the block (32), so L / 2 is a
    multiple of 16. Said explicitly: Triton's specialisation only knows L % 16 == 0, hence L / 2 % 8, which
    limited FP4 row accesses to 8-byte vectors."""
    return tl.multiple_of(L // 2, 16)


@triton.jit
def _split_pid(pid, n_fast, n_mid):
    """Program id -> (fast, mid, batch) indices of a grid of batch x n_mid x n_fast tiles (fast varies fastest)."""
    t = pid // n_fast
    return pid % n_fast, t % n_mid, t // n_mid


@triton.jit
def _tile_ids(n_fast, n_mid, INT64: tl.constexpr, GRID3: tl.constexpr):
    """(fast, mid, batch) tile indices of this program, fast varying fastest. GRID3: the launch grid is
    (n_fast, n_mid, batch) and the indices are its program ids (the plan's choice with QuantizeConfig.grid3,
    where n_mid and batch fit the grid's 65535 limit of dims 1 and 2); else a 1-D grid split by
    :func:`_split_pid`, whose two 32-bit divisions by runtime ints cost ~60 instructions before a program's
    first load. Same program order either way (CUDA walks dim 0 fastest). INT64: the indices as int64."""
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
