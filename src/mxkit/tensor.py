"""`MXTensor`, the container every backend returns, and the argument checks every backend shares.

An MXTensor is plain data: no autograd, no ``__torch_dispatch__``. Layout (OCP MX v1.0 §5, torchao names):

* ``qdata`` — uint8, the logical tensor with the quantized ``axis`` moved last and packed along it:
  FP8 / INT8 one byte per element; FP6 four 6-bit codes per 3 bytes, little-endian word
  ``a | b << 6 | c << 12 | d << 18``; FP4 two codes per byte, element 2i in the low nibble.
* ``scale`` — uint8 E8M0 (bias 127, 0xFF = NaN), same leading dims as ``qdata``, last dim
  ``shape[axis] // block_size``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.utils._pytree as pytree

from .layouts import from_layout, scale_layout_shape
from .formats import (  # (as_int: here too, where most callers import it)
    BLOCK_SIZE,
    ElementFormat,
    FormatLike,
    Rounding,
    ScaleMode,
    as_int,
    get_format,
)

__all__ = ["MXTensor", "QuantizeArgs", "check_quantize_args", "SUPPORTED_INPUT_DTYPES"]

SUPPORTED_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SUPPORTED_OUTPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class QuantizeArgs:
    """Validated, normalised quantize arguments (``axis`` non-negative)."""

    fmt: ElementFormat
    axis: int
    block_size: int
    scale_mode: ScaleMode
    rounding: Rounding


def check_quantize_args(
    x: torch.Tensor,
    fmt: FormatLike,
    axis: int = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
) -> QuantizeArgs:
    """Validate quantize arguments; returns :class:`QuantizeArgs` (format resolved, axis made non-negative,
    modes parsed). x: a non-empty-rank float32 | bfloat16 | float16 tensor (only its shape and dtype are read).
    Raises TypeError for an x that is not such a tensor or an axis that is not an int; ValueError for a 0-d x, an
    axis out of range, ``x.shape[axis] % block_size != 0``, a block_size that is not a positive multiple of the
    format's packing, or unknown format / mode / rounding names."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"x.dtype={x.dtype} is not supported; expected one of float32, bfloat16, float16")
    f = get_format(fmt)
    mode = ScaleMode.parse(scale_mode)
    rnd = Rounding.parse(rounding)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if block_size % f.pack:
        raise ValueError(f"{block_size=} must be a multiple of {f.pack} for {f.name} (packing)")
    if x.dim() == 0:
        raise ValueError("cannot quantize a 0-dim tensor: MX blocks run along an axis")
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis={axis} is out of range for a tensor of shape {tuple(x.shape)}")
    axis = axis % x.dim()
    if x.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor of shape {tuple(x.shape)}")
    if x.shape[axis] % block_size:
        raise ValueError(
            f"x.shape[{axis}]={x.shape[axis]} (shape {tuple(x.shape)}, axis={axis}) "
            f"is not a multiple of {block_size=}"
        )
    return QuantizeArgs(f, axis, block_size, mode, rnd)


def _unavailable(device, where: str) -> Optional[str]:
    """Why ``device`` cannot hold tensors here: an accelerator's device (a name or a torch.device: cuda, mps, xpu,
    ...) where its ``torch.<type>.is_available()`` says no, a backend without such a module (privateuse1, lazy, ...)
    where an empty tensor cannot be made, an index where no accelerator is; None otherwise. ValueError naming
    ``where`` for a string torch does not parse (torch's bare RuntimeError named no argument)."""
    if isinstance(device, int) and not isinstance(device, bool):  # (torch: the current accelerator's, any kind)
        return "no accelerator is available here" if device >= 0 and not torch.accelerator.is_available() else None
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{where}: {device!r} is not a device: {e}") from None
    if isinstance(device, torch.device) and device.type not in ("cpu", "meta"):
        # (torch raised RuntimeError / AssertionError / ModuleNotFoundError for cuda / mps / xpu / hpu without them)
        available = getattr(getattr(torch, device.type, None), "is_available", None)
        if callable(available):
            return None if available() else f"{'CUDA' if device.type == 'cuda' else device.type} is not available here"
        try:  # a backend without a torch.<type> module (privateuse1, lazy, ...): whether it can hold a tensor
            torch.empty(0, device=device)
        except Exception as e:
            return f"{device.type} is not available here ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return None


def check_device_name(device, where: str) -> None:
    """ValueError naming ``where`` for a ``device`` string torch does not parse, and for a device that cannot hold
    tensors here (a CUDA device without CUDA, an index without an accelerator: torch's AssertionError /
    RuntimeError said neither which call nor why); anything else passes."""
    why = _unavailable(device, where)
    if why is not None:
        raise ValueError(f"{where}: device {device!r}: {why}")


def device_only(device, what: str, instead: str) -> None:
    """TypeError where the ``device`` of ``what.to(device)`` is a dtype (MX bytes have a fixed format: ``instead``
    gives values in a dtype), a tensor or anything else that is no device (a bool, a float: torch's ``.to`` took a
    dtype from them); ValueError for a string that is not a device, a negative index, and a device that cannot
    hold tensors here (:func:`check_device_name`)."""
    if isinstance(device, torch.dtype):
        raise TypeError(f"{what}.to takes a device, not a dtype ({device}): the element format is fixed; use "
                        f"{instead} for values in a dtype")
    if isinstance(device, torch.Tensor):
        raise TypeError(f"{what}.to takes a device, not a tensor (torch's .to(other) would take its dtype too): "
                        f"pass other.device")
    device = as_int(device)  # (a NumPy integer index)
    if isinstance(device, bool) or not (device is None or isinstance(device, (str, int, torch.device))):
        # (torch's .to(True) / .to(1.5) / .to(float) took a dtype from it: a TypeError about the bytes' dtype)
        raise TypeError(f"{what}.to takes a device (a str, torch.device or index), got {device!r}")
    if isinstance(device, int) and device < 0:  # (torch's bare RuntimeError)
        raise ValueError(f"{what}.to({device!r}): a device index is >= 0")
    why = _unavailable(device, f"{what}.to")
    if why is not None:
        raise ValueError(f"{what}.to({device!r}): {why}")


@dataclass(frozen=True, eq=False)
class MXTensor:
    """A tensor in an OCP MX format: element codes plus one E8M0 scale per block of ``block_size``.

    Fields:
      qdata: uint8 (``*lead, axis_len * pack_bytes // pack``) — logical tensor with ``axis`` moved last,
        packed (see module docstring).
      scale: uint8 (``*lead, axis_len // block_size``) — E8M0, bias 127, 0xFF = NaN.
      fmt: the element format.
      axis: the quantized axis of the logical tensor, stored non-negative (a negative one given counts from the
        end; NumPy integers are taken as ints; TypeError for a non-integer, ValueError out of range).
      block_size: elements per scale (32 in OCP MX v1.0).
      scale_mode / rounding: how it was made (informational; dequantize does not need them).
      shape: logical shape (``torch.Size``) of the tensor that was quantized.
      scale_layout: ``"plain"`` (default) or a swizzled layout of :mod:`mxkit.layouts`
        (``"nvidia_128x4"``, ``"aiter_shuffle"``); then ``scale`` is 2-D ``(rows_padded, cols_padded)``
        holding the swizzled bytes of the plain ``(prod(lead), axis_len // block_size)`` scale.

    Frozen (``dataclasses.replace`` makes a changed copy; the tensors' bytes stay mutable) and compared by
    identity (``eq=False``: field-wise ``==`` on tensors has no single truth value). A pytree node
    (:mod:`torch.utils._pytree`): ``qdata`` and ``scale`` are the leaves, the other fields the context, so
    ``torch.compile`` / ``torch.export`` / ``tree_map`` see two uint8 tensors; unflattening runs the same
    checks as the constructor.

    Raises TypeError (a field of the wrong type or dtype) or ValueError (axis out of range, shapes that do
    not agree, naming the field with the shape it has and the one it should have, qdata and scale on
    different devices, a ``scale_mode`` / ``rounding`` that is not an enum member or its name (case and
    surrounding spaces ignored), or a ``scale_layout`` that is not one of :data:`mxkit.layouts.SCALE_LAYOUTS`'
    names, spelled exactly).

    Views: :meth:`qdata_view` (``torch.float8_e4m3fn``, ``float8_e5m2``, ``float4_e2m1fn_x2``, ``int8``
    where torch has the dtype) and :meth:`scale_view` (``torch.float8_e8m0fnu``).
    """

    qdata: torch.Tensor
    scale: torch.Tensor
    fmt: ElementFormat
    axis: int
    block_size: int
    shape: torch.Size
    scale_mode: ScaleMode = ScaleMode.FLOOR
    rounding: Rounding = Rounding.RNE
    scale_layout: str = "plain"

    def __post_init__(self) -> None:
        # frozen: normalise the fields through object.__setattr__ (the dataclasses idiom for __post_init__)
        object.__setattr__(self, "fmt", get_format(self.fmt))
        object.__setattr__(self, "scale_mode", ScaleMode.parse(self.scale_mode))
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding))
        try:  # (each dim through __index__, as axis and block_size below: a NumPy int stays out of the
            # context, which torch.load(weights_only=True) and the pytree's JSON would refuse; a bool is no size)
            dims = tuple(self.shape)
            if any(isinstance(d, bool) for d in dims):
                raise TypeError
            if not all(type(d) is int or isinstance(d, torch.SymInt) for d in dims):  # (__index__ of a SymInt
                # would specialise it: a graph per batch size under dynamic shapes)
                dims = tuple(d if isinstance(d, torch.SymInt) else operator.index(d) for d in dims)
            shape = torch.Size(dims)
        except TypeError:
            raise TypeError(f"MXTensor shape must be a sequence of ints, got {self.shape!r}") from None
        if any(type(d) is int and d < 0 for d in shape):  # (the qdata check below named a negative size's bytes)
            raise ValueError(f"MXTensor shape {tuple(shape)} has a negative size")
        object.__setattr__(self, "shape", shape)
        for name in ("qdata", "scale"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"MXTensor {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != torch.uint8:
                raise TypeError(f"MXTensor {name} must be uint8, got {t.dtype}")
        if self.qdata.device != self.scale.device:
            raise ValueError(f"MXTensor qdata and scale must be on one device: qdata is on {self.qdata.device}, "
                             f"scale on {self.scale.device}")
        # axis and block_size: Python ints, or anything with __index__ (NumPy integers: metadata read back from
        # NumPy or JSON); a negative axis counts from the end, as quantize's
        for name in ("axis", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or type(v) is not int:
                try:
                    if isinstance(v, bool):
                        raise TypeError
                    object.__setattr__(self, name, operator.index(v))
                except TypeError:
                    raise TypeError(f"MXTensor {name} must be an int, got {v!r}") from None
        if not -len(self.shape) <= self.axis < len(self.shape):
            raise ValueError(f"axis={self.axis} out of range for shape {tuple(self.shape)} (an axis in "
                             f"[{-len(self.shape)}, {len(self.shape)}))")
        if self.axis < 0:
            object.__setattr__(self, "axis", self.axis + len(self.shape))
        if self.block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {self.block_size}")
        if self.shape[self.axis] % self.block_size:
            raise ValueError(f"shape[{self.axis}]={self.shape[self.axis]} (shape {tuple(self.shape)}) is not a "
                             f"multiple of block_size={self.block_size}")
        if self.block_size % self.fmt.pack:  # (then shape[axis] is a multiple of the packing too)
            raise ValueError(f"block_size={self.block_size} is not a multiple of {self.fmt.name}'s packing "
                             f"({self.fmt.pack} elements in {self.fmt.pack_bytes} bytes)")
        exp_q, exp_s = self.expected_shapes(self.shape, self.axis, self.fmt, self.block_size)
        if self.scale_layout != "plain":
            exp_s = scale_layout_shape(math.prod(exp_s[:-1]), exp_s[-1], self.scale_layout)
        bad = [f"{name} has shape {tuple(t.shape)}, expected {exp}"
               for name, t, exp in (("qdata", self.qdata, exp_q), ("scale", self.scale, exp_s))
               if tuple(t.shape) != exp]
        if bad:
            raise ValueError(
                f"inconsistent MXTensor: {'; '.join(bad)} (shape {tuple(self.shape)}, axis={self.axis}, "
                f"{self.fmt.name}, block_size={self.block_size}, scale_layout={self.scale_layout!r})"
            )

    @classmethod
    def _trusted(cls, qdata: torch.Tensor, scale: torch.Tensor, fmt: ElementFormat, axis: int, block_size: int,
                 shape: torch.Size, scale_mode: ScaleMode, rounding: Rounding, scale_layout: str) -> "MXTensor":
        """Build without the checks of ``__post_init__`` (~10 us of host time per tensor): for kernels whose
        outputs have the expected shapes by construction, with every field already normalised (ElementFormat,
        ScaleMode, Rounding, torch.Size). Eager host path only: pytree unflattening and ``torch.compile``
        use the checked constructor."""
        t = object.__new__(cls)
        t.__dict__.update(qdata=qdata, scale=scale, fmt=fmt, axis=axis, block_size=block_size, shape=shape,
                          scale_mode=scale_mode, rounding=rounding, scale_layout=scale_layout)
        return t

    @classmethod
    def _trusted_maker(cls, fmt: ElementFormat, axis: int, block_size: int, shape: torch.Size, scale_mode: ScaleMode,
                       rounding: Rounding, scale_layout: str):
        """``make(qdata, scale)``: :meth:`_trusted` with every other field fixed, for a hot path that makes MXTensors
        of one problem over and over (a copy of a prepared field dict: about a third less host time a tensor).
        ``make.wrap(qi, si)``: the same construction as a C++ fast call's wrap (``Plan.wrapping``, of its outputs
        ``qi`` and ``si``)."""
        fields = dict(qdata=None, scale=None, fmt=fmt, axis=axis, block_size=block_size, shape=shape,
                      scale_mode=scale_mode, rounding=rounding, scale_layout=scale_layout)
        new, copy, put = object.__new__, fields.copy, object.__setattr__

        def make(qdata: torch.Tensor, scale: torch.Tensor) -> "MXTensor":
            t = new(cls)
            d = copy()
            d["qdata"] = qdata
            d["scale"] = scale
            put(t, "__dict__", d)
            return t

        make.wrap = lambda qi, si: (cls, fields, (("qdata", qi), ("scale", si)))
        return make

    @staticmethod
    def expected_shapes(shape, axis: int, fmt: FormatLike, block_size: int) -> tuple[tuple, tuple]:
        """(qdata's shape, the plain scale's shape) of an MXTensor of logical ``shape`` blocked along ``axis``:
        the other dimensions in order, then the packed bytes of the axis (``n * pack_bytes // pack``: n / 2 for
        FP4, 3n / 4 for FP6) / its ``n // block_size`` scale bytes; a negative ``axis`` counts from the end; ``fmt``
        a format or its name. Raises ValueError for an axis out of range (it wrapped around) or a block_size that is
        not a positive int (0 divided by zero); the caller validates n (a multiple of block_size and of the
        format's packing)."""
        shape = tuple(shape)
        fmt = get_format(fmt)
        block_size = as_int(block_size)  # (a NumPy integer, as the constructor takes)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not -len(shape) <= axis < len(shape):
            raise ValueError(f"axis {axis} is out of range for a {len(shape)}-D shape {shape}")
        axis %= len(shape)
        lead = shape[:axis] + shape[axis + 1 :]
        n = shape[axis]
        return lead + (n * fmt.pack_bytes // fmt.pack,), lead + (n // block_size,)

    # --- conveniences -----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """torch.device of qdata and scale (one device, checked at construction)."""
        return self.qdata.device

    @property
    def ndim(self) -> int:
        """int: the number of dimensions of the logical shape (``len(shape)``)."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Storage bytes: elements plus scales."""
        return self.qdata.numel() + self.scale.numel()

    @property
    def bits_per_element(self) -> float:
        """float: storage bits per logical element, scales included (``8 * nbytes / numel``: 4.25 for MXFP4 with
        plain scales; a swizzled scale layout's padding counts too)."""
        return 8.0 * self.nbytes / max(1, self.shape.numel())

    def to(self, device: Union[str, torch.device]) -> "MXTensor":
        """The same MXTensor with qdata and scale on ``device`` (bytes unchanged; a device, not a dtype: the
        element format is fixed, :func:`mxkit.dequantize` gives values in a dtype). Raises TypeError for a
        dtype, a tensor or anything else that is no device (a bool, a float), ValueError for a string that is not a
        device, a negative index, or a device that cannot hold tensors here (CUDA without CUDA, mps / xpu / ...)."""
        device_only(device, "MXTensor", "mxkit.dequantize(q, dtype)")
        return dataclasses.replace(self, qdata=self.qdata.to(device), scale=self.scale.to(device))

    def plain_scale(self) -> torch.Tensor:
        """The scale as plain E8M0 bytes (``*lead, axis_len // block_size``), undoing a swizzled
        ``scale_layout`` with :func:`mxkit.layouts.from_layout` (the tensor itself when already plain)."""
        if self.scale_layout == "plain":
            return self.scale
        plain = tuple(self.qdata.shape[:-1]) + (self.shape[self.axis] // self.block_size,)
        rows = math.prod(plain[:-1])
        return from_layout(self.scale, self.scale_layout, (rows, plain[-1])).reshape(plain)

    def qdata_view(self) -> torch.Tensor:
        """qdata viewed as torch's own element dtype (fp8, fp4x2, int8); TypeError for FP6 (torch has none)."""
        if self.fmt.torch_dtype is None:
            raise TypeError(f"torch has no dtype for {self.fmt.name}; use .qdata (packed uint8)")
        return self.qdata.view(self.fmt.torch_dtype)

    def scale_view(self) -> torch.Tensor:
        """scale viewed as ``torch.float8_e8m0fnu``."""
        return self.scale.view(torch.float8_e8m0fnu)

    def __getstate__(self) -> dict:
        # the fields only: the GEMM paths keep prepared launches on a weight (``_a8w8``: a lock, device pointers),
        # which neither pickle nor belong to a copy
        return {f: self.__dict__[f] for f in _FIELDS}

    def __setstate__(self, state: dict) -> None:
        # pickle / torch.load / deepcopy fill __dict__ without __init__: run the constructor's checks on what was
        # loaded (a stale or edited file whose fields disagree raises here, not later as a wrong dequantize)
        fields = {f: state[f] for f in _FIELDS if f in state}  # (a file written before __getstate__ may hold more)
        object.__setattr__(self, "__dict__", dict(MXTensor(**fields).__dict__))

    def __repr__(self) -> str:
        extra = "" if self.rounding is Rounding.RNE else f", rounding={self.rounding.value}"
        extra += "" if self.scale_layout == "plain" else f", scale_layout={self.scale_layout}"
        return (
            f"MXTensor({self.fmt.name}, shape={tuple(self.shape)}, axis={self.axis}, "
            f"block_size={self.block_size}, scale_mode={self.scale_mode.value}{extra}, device={self.device})"
        )


_FIELDS = tuple(f.name for f in dataclasses.fields(MXTensor))

# --- pytree: qdata and scale are the leaves, the rest is the (hashable) context ---------------------------

_CONTEXT_FIELDS = ("fmt", "axis", "block_size", "shape", "scale_mode", "rounding", "scale_layout")


def _flatten(t: MXTensor) -> tuple[list[torch.Tensor], tuple]:
    return [t.qdata, t.scale], tuple(getattr(t, f) for f in _CONTEXT_FIELDS)


def _flatten_with_keys(t: MXTensor) -> tuple[list[tuple[pytree.KeyEntry, torch.Tensor]], tuple]:
    leaves, context = _flatten(t)
    return [(pytree.GetAttrKey("qdata"), leaves[0]), (pytree.GetAttrKey("scale"), leaves[1])], context


def _unflatten(leaves, context: tuple) -> MXTensor:
    q, s = leaves
    if isinstance(q, torch.Tensor) and isinstance(s, torch.Tensor):
        return MXTensor(q, s, *context)  # (tensors a transform hands back: checked)
    # other leaves (vmap's out_dims, a tree_map to shapes): a container of them, unchecked, as pytree maps expect
    return MXTensor._trusted(q, s, *context)


def _dumpable_context(context: tuple) -> list:
    """JSON-ready context (``torch.export`` serialisation): names and values instead of objects. Raises ValueError
    for an element format the name does not give back (an unregistered custom ElementFormat: the dump took it and
    the load failed)."""
    fmt, axis, block_size, shape, mode, rounding, layout = context
    try:
        same = get_format(fmt.name) == fmt
    except ValueError:
        same = False
    if not same:
        raise ValueError(f"an MXTensor of the unregistered element format {fmt.name!r} cannot be serialised by name "
                         f"(its load would not find it); use a registered format")
    return [fmt.name, axis, block_size, list(shape), mode.value, rounding.value, layout]


def _context_from_dump(dumped: list) -> tuple:
    fmt, axis, block_size, shape, mode, rounding, layout = dumped
    return (get_format(fmt), axis, block_size, torch.Size(shape), ScaleMode.parse(mode), Rounding.parse(rounding),
            layout)


# torch.load's default unpickler (weights_only=True) takes only allowlisted classes: an MXTensor and its fields'
# types are plain data (uint8 tensors, names, ints), safe to rebuild; a registered format comes back through
# get_format (a lookup by name)
torch.serialization.add_safe_globals([MXTensor, ElementFormat, get_format, ScaleMode, Rounding])

pytree.register_pytree_node(
    MXTensor, _flatten, _unflatten, serialized_type_name="mxkit.MXTensor", flatten_with_keys_fn=_flatten_with_keys,
    to_dumpable_context=_dumpable_context, from_dumpable_context=_context_from_dump,
)


def check_out_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):  # (a name: "dtype=float32 is not supported; expected float32, ...")
        raise TypeError(f"dtype must be a torch.dtype (torch.float32, torch.bfloat16, torch.float16 or "
                        f"torch.float64) or None, got {type(dtype).__name__} {dtype!r}")
    if dtype not in SUPPORTED_OUTPUT_DTYPES:
        raise TypeError(f"dtype={dtype} is not supported; expected float32, bfloat16, float16 or float64")
    return dtype
