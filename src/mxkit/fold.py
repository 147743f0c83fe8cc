"""Row folding: an MX row of FP4 / FP6 elements re-expressed exactly as FP8 E4M3 with one power-of-two row scale.

The fact (derived here by exhaustive enumeration, see :func:`fold_range`): for an element format F there is an
interval [d_lo, d_hi] of integers d such that ``elem * 2^d`` is exactly an E4M3 value for EVERY element value of
F (subnormals and ±0 included). E2M1: [-8, 6]; E2M3: [-6, 5]; E3M2: [-5, 4]; E4M3: [0, 0]; E5M2 and MXINT8:
none (E5M2's range 2^-16 … 57344 is wider than E4M3's, INT8's 127/64 needs 7 significant bits).

So a row along K whose block scale bytes (of its blocks that hold a non-zero element) span at most
``W = d_hi - d_lo`` folds to one E4M3 row with the fp32 row scale 2^e, ``e = max_s - 127 - d_hi``, block b's
elements becoming ``E4M3(elem * 2^(s_b - 127 - e))`` with ``s_b - 127 - e`` in [d_lo, d_hi]: exact, no rounding.
A row spanning more is split into slices (windows of W + 1 scale values taken greedily from the top): the
window holding the row's largest scale stays in the row, every further window becomes an extra row that holds
only its blocks (zeros elsewhere) and has its own scale; the row is the sum of its slices times their scales.
A row with a NaN scale byte (0xFF) is NaN: its scale is NaN and its bytes are 0. A row whose elements are all
±0 gets scale 1.0. Blocks whose 32 elements are all ±0 are ignored when computing the span and stay (with
their signs) in the row's first slice; other slices hold +0 outside their windows.

This module is the reference (pure PyTorch, CPU or CUDA); the Triton kernels are :mod:`mxkit.kernels.fold`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Union

import torch
import torch.utils._pytree as pytree

from ._cache import constant_cache
from .formats import (
    E8M0_BIAS,
    E8M0_NAN,
    MXFP8_E4M3,
    ElementFormat,
    FormatLike,
    Rounding,
    ScaleMode,
    _exp2_f32,
    decode_elements,
    get_format,
)
from .reference import quantize_reference, unpack_codes
from .tensor import MXTensor, device_only

__all__ = [
    "Folded",
    "fold_range",
    "can_fold",
    "fold_reference",
    "quantize_fold_reference",
    "unfold_reference",
    "fold_row_split",
    "WIDEN",
    "widen_fp6",
]

_D_SEARCH = 64  # |d| searched by fold_range; every format's values lie within 2^-16 … 2^16


def _exact_values(f: ElementFormat) -> set[Fraction]:
    """Every finite value of an element format, as exact fractions (decoded from every code)."""
    codes = torch.arange(1 << f.bits, dtype=torch.int32).to(torch.uint8)
    vals = decode_elements(codes, f).to(torch.float64).tolist()  # float32 -> float64 is exact
    return {Fraction(v) for v in vals if math.isfinite(v)}


@constant_cache
def fold_range(fmt: FormatLike) -> Optional[tuple[int, int]]:
    """``(d_lo, d_hi)``: the integers d for which ``v * 2^d`` is exactly an E4M3 value for every finite element
    value v of ``fmt`` form the interval [d_lo, d_hi]; None when no d works.

    Derived by enumeration in exact arithmetic (every code decoded, compared as fractions), not a table.
    Values: E2M1 (-8, 6), E2M3 (-6, 5), E3M2 (-5, 4), E4M3 (0, 0), E5M2 None, MXINT8 None.
    Raises what :func:`mxkit.formats.get_format` raises: ValueError for an unknown name, TypeError for another type.
    """
    f = get_format(fmt)
    src = _exact_values(f)
    e4m3 = _exact_values(MXFP8_E4M3)
    ok = [d for d in range(-_D_SEARCH, _D_SEARCH + 1) if all(v * Fraction(2) ** d in e4m3 for v in src)]
    if not ok:
        return None
    # the set of good d is an interval: a value exact at d_lo and d_hi is exact in between (same significand,
    # exponent between two representable ones)
    assert ok == list(range(ok[0], ok[-1] + 1)), ok
    return ok[0], ok[-1]


def can_fold(fmt: FormatLike) -> bool:
    """True for the formats whose rows fold with a useful window (W = d_hi - d_lo > 0): E2M1, E2M3, E3M2. Raises as
    :func:`fold_range`."""
    r = fold_range(fmt)
    return r is not None and r[1] > r[0]


def _check_foldable(fmt: FormatLike) -> tuple[ElementFormat, int, int]:
    f = get_format(fmt)
    r = fold_range(f)
    if r is None or r[1] == r[0]:
        why = "no d makes every element exact in E4M3" if r is None else "it is E4M3 already (fold range (0, 0))"
        raise ValueError(
            f"{f.name} does not fold ({why}, fold_range={r}); foldable formats: mxfp4_e2m1, mxfp6_e2m3, mxfp6_e3m2"
        )
    return f, r[0], r[1]


@dataclass(frozen=True, eq=False)  # (== is identity: a field-wise == of tensors raised)
class Folded:
    """An MX tensor (quantized along its last axis K) folded to FP8 E4M3 rows with fp32 power-of-two row scales.

    Fields (R = prod(lead_shape) source rows, X extra slices of rows whose block scales span more than W):
      data: torch.float8_e4m3fn [R + X, K]. Rows 0 … R-1 are the source rows in order; rows R … R+X-1 are the
        extra slices, ordered by owner row, then from the higher window down.
      scale: float32 [R + X]: 2^e (e an integer in [-127 - d_hi, 127 - d_hi]: fp32 denormals possible), or NaN
        for a row with a NaN block scale (that row's data bytes are 0 and it has no extra slices).
      owner: int64 [X]: the source row each extra slice adds into.
      fmt: the source element format.
      lead_shape: the source's logical shape without K.

    Exactness: for every source row r, ``dequantize(q)[r] == data[r] * scale[r] + sum over slices i with
    owner[i] == r of data[R + i] * scale[R + i]``, every product exact (see :func:`unfold_reference`).
    The fold and this layout are mxkit's own convention (no peer).

    Raises TypeError when data is not float8_e4m3fn, scale not float32 or owner not int64 (or one is not a
    tensor), or fmt is not a format name / ElementFormat; ValueError when data is not 2-D, scale not 1-D of
    data's length, owner not 1-D and no longer than data, the tensors are on different devices,
    ``lead_shape`` has a negative size or ``prod(lead_shape)`` is not ``len(data) - len(owner)``, or fmt is an
    unknown format name. owner's values (device data) are checked where they are read: :func:`unfold_reference`
    and :func:`mxkit.matmul` raise ValueError for an owner outside [0, R).
    """

    data: torch.Tensor
    scale: torch.Tensor
    owner: torch.Tensor
    fmt: ElementFormat
    lead_shape: torch.Size

    def __post_init__(self) -> None:
        # the fields' dtypes, shapes and devices (a malformed Folded would otherwise multiply as garbage: a
        # short scale broadcasts); owner's values are device data and are not read here
        d, s, o = self.data, self.scale, self.owner
        for name, t, dt in (("data", d, torch.float8_e4m3fn), ("scale", s, torch.float32), ("owner", o, torch.int64)):
            if not isinstance(t, torch.Tensor) or t.dtype != dt:
                raise TypeError(f"Folded.{name} must be a {dt} tensor, got "
                                f"{getattr(t, 'dtype', type(t).__name__)}")
        if d.dim() != 2 or s.dim() != 1 or o.dim() != 1 or s.shape[0] != d.shape[0] or o.shape[0] > d.shape[0]:
            raise ValueError(f"Folded needs data [R + X, K], scale [R + X], owner [X]; got data {tuple(d.shape)}, "
                             f"scale {tuple(s.shape)}, owner {tuple(o.shape)}")
        if not (d.device == s.device == o.device):
            raise ValueError(f"Folded's tensors must share a device; got data on {d.device}, scale on {s.device}, "
                             f"owner on {o.device}")
        object.__setattr__(self, "fmt", get_format(self.fmt))
        lead = torch.Size(self.lead_shape)
        object.__setattr__(self, "lead_shape", lead)
        if any(n < 0 for n in lead):  # ((-3, -2) holds "6" rows)
            raise ValueError(f"Folded.lead_shape {tuple(lead)} has a negative size")
        if math.prod(lead) != d.shape[0] - o.shape[0]:
            raise ValueError(f"Folded.lead_shape {tuple(lead)} holds {math.prod(lead)} rows, but data has "
                             f"{d.shape[0] - o.shape[0]} source rows ({d.shape[0]} rows, {o.shape[0]} extra slices)")

    @classmethod
    def _trusted(cls, data: torch.Tensor, scale: torch.Tensor, owner: torch.Tensor, fmt: ElementFormat,
                 lead_shape: torch.Size) -> "Folded":
        """Build without the checks of ``__post_init__`` (~3 us of host time): for the fold kernels, whose outputs
        have the fields' dtypes and shapes by construction, every field already normalised (as
        :meth:`mxkit.MXTensor._trusted`)."""
        f = object.__new__(cls)
        f.__dict__.update(data=data, scale=scale, owner=owner, fmt=fmt, lead_shape=lead_shape)
        return f

    def rows(self) -> int:
        """R, the number of source rows (the first R rows of ``data``)."""
        return self.data.shape[0] - self.owner.shape[0]

    @property
    def K(self) -> int:
        """int: the row length in elements (``data.shape[1]``, the source's last axis)."""
        return self.data.shape[1]

    def to(self, device: Union[str, torch.device]) -> "Folded":
        """The same Folded with its tensors on ``device`` (bytes unchanged). Raises TypeError for a dtype (its values
        are fixed: :func:`unfold_reference` gives them), a tensor or anything else that is no device, ValueError for a
        string that is not a device, a negative index, or a device that cannot hold tensors here
        (:meth:`MXTensor.to`)."""
        device_only(device, "Folded", "unfold_reference(a).to(dtype)")
        return Folded(self.data.to(device), self.scale.to(device), self.owner.to(device), self.fmt, self.lead_shape)

    @property
    def device(self) -> torch.device:
        """torch.device of data, scale and owner (one device, checked at construction)."""
        return self.data.device

    def __reduce__(self):
        # pickle.dumps of a float8 tensor fails in torch (2.11-2.13: its legacy storage reader asks
        # UntypedStorage for a dtype); the codes travel as their uint8 view, the same bytes
        return _folded_from_codes, (self.data.view(torch.uint8), self.data.dtype, self.scale, self.owner, self.fmt,
                                    self.lead_shape)


def _folded_from_codes(codes, dtype, scale, owner, fmt, lead_shape) -> Folded:
    return Folded(codes.view(dtype), scale, owner, fmt, lead_shape)


# torch.load with weights_only (its default) takes a saved Folded, as it takes an MXTensor
torch.serialization.add_safe_globals([Folded, _folded_from_codes])


# pytree: data, scale and owner are the leaves (tree maps reach them, e.g. a PackedWeight's .to by tree_map),
# fmt and lead_shape the context
pytree.register_pytree_node(Folded, lambda f: ([f.data, f.scale, f.owner], (f.fmt, f.lead_shape)),
                            lambda leaves, ctx: Folded(*leaves, *ctx), serialized_type_name="mxkit.Folded")


def _block_view(q: MXTensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes [R, K] uint8, scale [R, nb] uint8, K) of an MXTensor quantized along its last axis."""
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    if q.axis != q.ndim - 1:
        raise ValueError(f"fold needs an MXTensor quantized along its last axis; got axis={q.axis} of shape "
                         f"{tuple(q.shape)}")
    if q.block_size != 32:
        raise ValueError(f"fold supports block_size=32 only, got block_size={q.block_size}")
    K = q.shape[-1]
    if K == 0:
        raise ValueError(f"cannot fold an MXTensor with K=0 (shape {tuple(q.shape)})")
    R = math.prod(q.shape[:-1])
    codes = unpack_codes(q.qdata, q.fmt).reshape(R, K)
    return codes, q.plain_scale().reshape(R, K // 32), K


# An FP6 code s|e|m (E2M3: 2 exponent bits, bias 1; E3M2: 3, bias 3) read with its sign moved to bit 7 and two
# zero bits above its exponent is an FP8 code whose value is the FP6 value times 2^-shift, normals and subnormals
# alike: E2M3 -> E4M3 (bias 7: 2^(e-7) against 2^(e-1); subnormals 2^-6 against 2^0), E3M2 -> E5M2 (bias 15:
# 2^(e-15) against 2^(e-3); 2^-14 against 2^-2). The block scale byte takes the shift: exact, no rounding.
WIDEN = {"mxfp6_e2m3": ("mxfp8_e4m3", 6), "mxfp6_e3m2": ("mxfp8_e5m2", 12)}


def widen_fp6(q: MXTensor, *, check: bool = True) -> MXTensor:
    """An MXFP6 tensor re-expressed exactly as MXFP8 (:data:`WIDEN`): E2M3 codes as E4M3, E3M2 as E5M2, each code
    ``s eeemm`` becoming the byte ``s 00 eeemm`` (value times 2^-6 / 2^-12) and each E8M0 scale byte raised by 6 /
    12 (0xFF, NaN, stays). Same shape, axis, block size and metadata; qdata one byte per element, plain scales.

    The values are identical element for element (``dequantize`` gives the same bytes) wherever the raised scale
    byte stays <= 254; a scale byte above 254 - shift (values past 2^121 / 2^115) has no MXFP8 twin: ``check``
    raises ValueError then (one host sync); ``check=False`` saturates such bytes at 254 and leaves the check to
    the caller (:func:`mxkit.pack_weight` does, through the source's scale maximum). TypeError / ValueError on
    other formats. Used by ``pack_weight`` so that bf16 x MXFP6 GEMMs run on the MXFP8 weight kernels."""
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    if q.fmt.name not in WIDEN:
        raise ValueError(f"widen_fp6 takes {' / '.join(WIDEN)}, got {q.fmt.name}")
    name, shift = WIDEN[q.fmt.name]
    codes = unpack_codes(q.qdata, q.fmt)
    wide = ((codes & 0x20) << 2) | (codes & 0x1F)
    s = q.plain_scale()
    if check and bool(((s != E8M0_NAN) & (s > 254 - shift)).any()):
        raise ValueError(f"{q.fmt.name} scale bytes above {254 - shift} have no {name} twin (the byte + {shift} "
                         f"passes E8M0's largest, 254)")
    raised = torch.where(s == E8M0_NAN, s, (s.to(torch.int32) + shift).clamp_(max=254).to(torch.uint8))
    return MXTensor(wide, raised, name, q.axis, q.block_size, tuple(q.shape), q.scale_mode, q.rounding)


def fold_row_split(scale: torch.Tensor, nonzero: torch.Tensor, w: int) -> torch.Tensor:
    """Slice index of each block (int64 [R, nb]): 0 for the window [m0 - w, m0] below the row's largest
    scale m0 of the non-zero blocks, 1 for the window below the largest scale left, and so on (greedy from
    the top); all-zero blocks (``nonzero`` False) get 0. Scale bytes 0xFF must be excluded by the caller.
    scale: E8M0 bytes (uint8, or any integer dtype) [R, nb]; nonzero: bool [R, nb]; w: the window width in scale
    steps (d_hi - d_lo of :func:`fold_range`). One host sync per slice level (the loop ends when no block is left).
    Raises ValueError for a ``w`` that is not an int >= 0, TypeError for another dtype or shape of the tensors.
    """
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:  # (a negative window took no block: no end)
        raise ValueError(f"fold_row_split: w must be an int >= 0, got {w!r}")
    if not isinstance(scale, torch.Tensor) or scale.dim() != 2 or scale.dtype.is_floating_point \
            or scale.dtype.is_complex or scale.dtype == torch.bool:
        raise TypeError(f"fold_row_split: scale must be an integer tensor [R, nb], got "
                        f"{getattr(scale, 'dtype', type(scale).__name__)} {tuple(getattr(scale, 'shape', ()))}")
    if not isinstance(nonzero, torch.Tensor) or nonzero.dtype != torch.bool or nonzero.shape != scale.shape:
        raise TypeError(f"fold_row_split: nonzero must be a bool tensor of scale's shape {tuple(scale.shape)}, got "
                        f"{getattr(nonzero, 'dtype', type(nonzero).__name__)} {tuple(getattr(nonzero, 'shape', ()))}")
    s = scale.to(torch.int64)
    slice_id = torch.zeros_like(s)
    left = nonzero.clone()
    k = 0
    while bool(left.any()):
        top = torch.where(left, s, -1).amax(dim=1, keepdim=True)
        take = left & (s >= top - w)
        slice_id = torch.where(take, k, slice_id)
        left &= ~take
        k += 1
    return slice_id


def fold_reference(q: MXTensor) -> Folded:
    """Fold an MX tensor (FP4 E2M1, FP6 E2M3 or E3M2, quantized along its last axis, block_size 32) to E4M3 rows.

    q: MXTensor of logical shape (..., K), any scale layout (read through ``plain_scale``), CPU or CUDA.
    Returns :class:`Folded` (data float8_e4m3fn [R + X, K], scale float32 [R + X], owner int64 [X]), exact:
    ``unfold_reference(fold_reference(q)) == dequantize_reference(q, torch.float64)`` (NaN rows NaN).
    Raises ValueError for formats without a fold window (E4M3, E5M2, MXINT8), a quantized axis other than the
    last or a block size other than 32; TypeError for a non-MXTensor.
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    f, d_lo, d_hi = _check_foldable(q.fmt)
    codes, scale, K = _block_view(q)
    R, nb = scale.shape
    vals = decode_elements(codes, f).reshape(R, nb, 32)
    nan_blk = scale == E8M0_NAN
    nan_row = nan_blk.any(dim=1)
    nonzero = (vals != 0).any(dim=2) & ~nan_row[:, None]
    slice_id = fold_row_split(scale, nonzero, d_hi - d_lo)
    n_slices = torch.where(nonzero, slice_id + 1, 1).amax(dim=1)
    # output rows: (source row, slice) = (r, 0) for every r, then (r, k >= 1) by r then k
    extra = n_slices - 1
    owner = torch.repeat_interleave(torch.arange(R, device=scale.device), extra)
    first = torch.cumsum(extra, 0) - extra  # index of each row's first extra slice
    k_extra = torch.arange(owner.numel(), device=scale.device) - first[owner] + 1
    src = torch.cat([torch.arange(R, device=scale.device), owner])
    k_out = torch.cat([torch.zeros(R, dtype=torch.int64, device=scale.device), k_extra])

    s = scale.to(torch.int64)[src]  # [R + X, nb]
    mine = slice_id[src] == k_out[:, None]
    top = torch.where(mine & nonzero[src], s, -1).amax(dim=1)
    e = torch.where(top >= 0, top - E8M0_BIAS - d_hi, 0)  # all-zero rows: scale 1
    d = (s - E8M0_BIAS - e[:, None]).clamp(d_lo, d_hi)  # in range for the slice's own non-zero blocks
    out = vals[src] * _exp2_f32(d).unsqueeze(-1)  # exact: the fold range
    out = torch.where(mine.unsqueeze(-1), out, 0.0)
    out = torch.where(nan_row[src][:, None, None], 0.0, out)
    data = out.reshape(-1, K).to(torch.float8_e4m3fn)
    row_scale = torch.where(nan_row[src], float("nan"), _exp2_f32(e))
    return Folded(data, row_scale, owner, f, torch.Size(q.shape[:-1]))


def quantize_fold_reference(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    block_size: int = 32,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
) -> Folded:
    """``fold_reference(quantize_reference(x, fmt, axis=-1, ...))``: x (..., K) float32 | bfloat16 | float16,
    K % 32 == 0, quantized along its last axis, then folded (R = 0 rows: an empty Folded, after the same checks of
    x's dtype and the names). Raises as both (ValueError for formats that do not fold, before quantizing)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _check_foldable(fmt)
    if block_size != 32:
        raise ValueError(f"fold supports block_size=32 only, got {block_size=}")
    if x.dim() >= 1 and x.numel() == 0 and x.shape[-1] % 32 == 0 and x.shape[-1] > 0:  # R = 0: empty result
        # (the checks the quantize makes on a non-empty x: dtype, mode and rounding names)
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"x.dtype={x.dtype} is not supported; expected one of float32, bfloat16, float16")
        ScaleMode.parse(scale_mode)
        Rounding.parse(rounding)
        f = get_format(fmt)
        return Folded(torch.empty(0, x.shape[-1], dtype=torch.float8_e4m3fn, device=x.device),
                      torch.empty(0, dtype=torch.float32, device=x.device),
                      torch.empty(0, dtype=torch.int64, device=x.device), f, torch.Size(x.shape[:-1]))
    q = quantize_reference(x, fmt, axis=-1, block_size=block_size, scale_mode=scale_mode, rounding=rounding)
    return fold_reference(q)


def check_owners(f: Folded) -> None:
    """ValueError where an extra slice's owner is not a source row of ``f`` (in [0, R)); one host sync where there
    are slices, none otherwise."""
    if f.owner.numel():
        lo, hi = torch.stack(torch.aminmax(f.owner)).tolist()
        if lo < 0 or hi >= f.rows():
            raise ValueError(f"Folded.owner holds rows in [{lo}, {hi}], outside the source rows [0, {f.rows()})")


def unfold_reference(f: Folded) -> torch.Tensor:
    """The float64 [R, K] value of a :class:`Folded`: each row's slices times their scales, summed (index_add).

    Every product is exact in float64 and the slices of a row have disjoint non-zero positions, so the sum is
    exact too; NaN rows are NaN. Raises TypeError for an f that is not a Folded, ValueError for an owner outside
    [0, R).
    """
    if not isinstance(f, Folded):
        raise TypeError(f"unfold_reference takes a Folded, got {type(f).__name__}")
    check_owners(f)
    R = f.rows()
    v = f.data.to(torch.float64) * f.scale.to(torch.float64)[:, None]
    out = v[:R].clone()
    return out.index_add_(0, f.owner, v[R:])

