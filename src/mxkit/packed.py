"""Operands prepared for the scaled GEMMs: :class:`PackedWeight` (an MX weight re-laid-out once, at
``pack_weight`` time) and :class:`Fp8Rowwise` (FP8 E4M3 activations with one float32 scale per row, the
W4A8 serving mode of TensorRT-LLM).

Plain data, like :class:`~mxkit.MXTensor`: frozen dataclasses of tensors, registered as pytree nodes, with
``to(device)``; a PackedWeight saves as its source's bytes (``PackedWeight.state_dict()``) and loads by
``pack_weight(PackedWeight.source_from_state_dict(sd))`` (the layouts are rebuilt, not stored).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.utils._pytree as pytree

from .fold import Folded
from .formats import ElementFormat, Rounding, ScaleMode
from .tensor import MXTensor, as_int, device_only

__all__ = ["PackedWeight", "Fp8Rowwise", "packed_of"]

_LIVE: "dict[int, weakref.ref]" = {}  # id -> PackedWeight, for torch.compile's custom op (mxkit.ops.matmul)


@dataclass(frozen=True, eq=False)
class Fp8Rowwise:
    """FP8 E4M3 activations with one float32 scale per row: value = ``data.float() * scale``.

    data: torch.float8_e4m3fn (..., K); scale: float32 (..., 1). Made by :func:`mxkit.quantize_fp8_rowwise`
    (scale = row amax / 448, TensorRT-LLM's per-token FP8) or by the caller. A GEMM applies each row's scale to
    the row's sums (as cuBLAS's rowwise FP8 GEMM does): a caller's infinite scale over finite codes gives ±Inf
    where the dequantized operands' product has NaN (0 · Inf). (quantize_fp8_rowwise gives a row holding ±Inf an
    Inf scale and the Inf element a NaN code, so such a row is NaN both ways.)
    Raises TypeError / ValueError on wrong dtypes, shapes or devices.
    """

    data: torch.Tensor
    scale: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.float8_e4m3fn:
            raise TypeError(f"Fp8Rowwise data must be a torch.float8_e4m3fn tensor, got "
                            f"{getattr(self.data, 'dtype', type(self.data).__name__)}")
        if not isinstance(self.scale, torch.Tensor) or self.scale.dtype != torch.float32:
            raise TypeError(f"Fp8Rowwise scale must be a float32 tensor, got "
                            f"{getattr(self.scale, 'dtype', type(self.scale).__name__)}")
        if self.data.dim() < 1:
            raise ValueError("Fp8Rowwise data must be at least 1-D (..., K), got a 0-d tensor")
        if tuple(self.scale.shape) != tuple(self.data.shape[:-1]) + (1,):
            raise ValueError(f"Fp8Rowwise scale has shape {tuple(self.scale.shape)}, expected "
                             f"{tuple(self.data.shape[:-1]) + (1,)} for data of shape {tuple(self.data.shape)}")
        if self.data.device != self.scale.device:
            raise ValueError(f"Fp8Rowwise data is on {self.data.device} but scale on {self.scale.device}")

    @property
    def shape(self) -> torch.Size:
        """torch.Size (..., K) of ``data``: the activations' logical shape, in elements."""
        return self.data.shape

    @property
    def device(self) -> torch.device:
        """torch.device of data and scale (one device, checked at construction)."""
        return self.data.device

    def to(self, device: Union[str, torch.device]) -> "Fp8Rowwise":
        """The same activations with data and scale on ``device`` (values unchanged). Raises TypeError for a
        dtype, a tensor or anything else that is no device, ValueError for a string that is not a device, a negative
        index, or a device that cannot hold tensors here (:meth:`MXTensor.to`)."""
        device_only(device, "Fp8Rowwise", "a.dequantize(dtype)")
        return Fp8Rowwise(self.data.to(device), self.scale.to(device))

    def __reduce__(self):
        # as mxkit.fold.Folded: the float8 codes pickle as their uint8 view (torch's pickle of float8 fails)
        return _fp8_rowwise_from_codes, (self.data.view(torch.uint8), self.scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data.float() * scale`` (..., K) in float32, then cast to ``dtype`` (float32 | bfloat16 | float16; round
        to nearest even); for float64 the product in float64, exact (4 significant bits times 24), as
        :meth:`MXTensor`'s float64 dequantize is. Raises TypeError for another dtype."""
        if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.bfloat16, torch.float16,
                                                               torch.float64):
            raise TypeError(f"dtype={dtype!r}: torch.float32, bfloat16, float16 or float64")
        if dtype == torch.float64:
            return self.data.to(torch.float64) * self.scale.to(torch.float64)
        return (self.data.to(torch.float32) * self.scale).to(dtype)


def _fp8_rowwise_from_codes(codes: torch.Tensor, scale: torch.Tensor) -> Fp8Rowwise:
    return Fp8Rowwise(codes.view(torch.float8_e4m3fn), scale)


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """An MX weight (N, K), quantized along K, in the layouts the GEMM paths read (:func:`mxkit.pack_weight`).

    Fields:
      source: the MX weight itself (plain scale layout): element codes uint8 and E8M0 scales; the exact
        reference and every path that reads MX bytes use it. Always kept.
      folded: for FP4 / FP6 weights, the same values re-expressed as FP8 E4M3 with one float32 power-of-two
        scale per row (:class:`mxkit.fold.Folded`, exact by construction); rows whose block scales span more
        than the format's fold range also have extra slice rows (``folded.owner``), which the GEMM computes
        through the exact float32 route. ``None`` for FP8 / INT8 weights, and when packed for float activations
        (``pack_weight(act="float")``, what a W4A16 :class:`mxkit.nn.MXLinear` keeps).
      stats: the scale statistics of ``source``: host values ``(scale_min, scale_max, has_nan)``, or, until they
        are first read, the device tensor of per-part statistics they reduce from (int32 [P, 3], see
        :func:`partial_stats_host`), so packing for float activations needs no host sync. Read them through
        the properties:
      scale_min / scale_max: the smallest and largest E8M0 byte of ``source`` other than 0xFF (the exact-in-bf16
        envelope check); 255 / -1 when every byte is 0xFF. The first read of a pending ``stats`` takes one host
        sync (RuntimeError during CUDA-graph capture: read them, or call once, before capturing).
      has_nan: whether a block has the NaN scale byte 0xFF, or (MXFP8 weights, whatever ``act``) an element code
        is NaN or Inf: such weights stay off the wgmma kernel.
      special_rows: int64 (S,) rows of the weight the fold path cannot take (slices or row scales outside
        the FP8 epilogue's envelope); computed through the exact float32 route and written into the output.
      mma_q / mma_s: for weights with N % 16 == 0 and K % 64 == 0, the same codes and scales rearranged for a
        small-M tensor-core kernel: MXFP4 for decode-mma (int32 [N/16, K/64, 32, 4] and [N/16, K/64, 8]; the
        layout is spelled out in ``kernels/matmul_details/mma_decode.cu``), MXFP8 E4M3 / E5M2 for a8w8-mma and
        w8a16-mma (int32 [N/16, K/64, 2, 32, 4] and [N/16, K/64, 8], ``mma_a8w8.cu``: the codes a second time, so
        an MXFP8 PackedWeight holds about twice the MXFP8 bytes); None otherwise.
      wide: for MXFP6 weights packed for float activations (``act`` None or "float"), their exact MXFP8 twin
        (:func:`mxkit.fold.widen_fp6`: E2M3 as E4M3, E3M2 as E5M2, scale bytes + 6 / + 12) packed as an MXFP8
        weight, which bf16 activations read on the MXFP8 weight kernels (about 2.75 bytes per element held
        in all); None otherwise.
      dense: the dequantized-weight cache (``pack_weight(w, dense=dtype)``, opt-in): the weight's values in bf16 or
        fp16 (N, K), which activations of that dtype read past the small-M kernels (path ``dense-cached``: cuBLAS on
        the cached weight, no dequantize per call; 2 bytes per element more, used only where the scale bytes lie
        in that dtype's exact envelope); None otherwise. Not in the ``state_dict``: pack again on load.

    Packing is one-time; ``state_dict()`` holds only ``source`` (the rest is rebuilt by
    :func:`mxkit.pack_weight` on load, a memory-bound pass). The packed layouts are copies made then, and
    ``source`` is the caller's own tensors (not copied): after an in-place edit of ``source``'s bytes, pack again
    (:meth:`mxkit.nn.MXLinear.repack` for a layer). Until then the paths that read a packed layout see the old
    weight and those that read ``source`` (the float32 routes, special rows, gradients) the new one, even within one
    call; nothing checks (a version check per call would cost host time on the decode path). Each PackedWeight
    is findable by its ``id`` while it lives (:func:`packed_of`): a compiled graph calls ``mxkit::packed_matmul``
    with that id, a constant that dynamo guards on (one compiled function called with many PackedWeights compiles
    once per weight, up to torch._dynamo's recompile limit). ``torch.export`` records the ``source`` tensors
    instead (``mxkit::mx_matmul``), so that an exported program runs in another process.
    """

    source: MXTensor
    folded: Optional[Folded]
    stats: Union[tuple, torch.Tensor]
    special_rows: torch.Tensor
    mma_q: Optional[torch.Tensor] = None
    mma_s: Optional[torch.Tensor] = None
    wide: Optional["PackedWeight"] = None
    dense: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        h = id(self)
        _LIVE[h] = weakref.ref(self)
        weakref.finalize(self, _LIVE.pop, h, None)

    def __getstate__(self) -> dict:
        # the fields only: the GEMM paths keep prepared launches and re-laid copies on it (``_calls``,
        # ``_fold_operands``, ``_wgmma``: locks, device pointers), which neither pickle nor belong to a copy
        return {f.name: self.__dict__[f.name] for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict) -> None:  # (copy.deepcopy, pickle: registered like a new one)
        self.__dict__.update({f.name: state[f.name] for f in dataclasses.fields(self) if f.name in state})
        self.__post_init__()

    def _host_stats(self) -> tuple:
        st = self.stats
        if isinstance(st, torch.Tensor):  # read once, then kept (the dataclass is frozen; the value is not new)
            st = partial_stats_host(st)
            object.__setattr__(self, "stats", st)
        return st

    @property
    def scale_min(self) -> int:
        """int: the smallest E8M0 byte of ``source`` other than 0xFF (255 when all are 0xFF); see ``stats``."""
        return self._host_stats()[0]

    @property
    def scale_max(self) -> int:
        """int: the largest E8M0 byte of ``source`` other than 0xFF (-1 when all are 0xFF); see ``stats``."""
        return self._host_stats()[1]

    @property
    def has_nan(self) -> bool:
        """bool: a 0xFF (NaN) scale byte, or for MXFP8 a NaN / Inf element code, occurs; see ``stats``."""
        return self._host_stats()[2]

    @property
    def shape(self) -> torch.Size:
        """torch.Size (N, K): the weight's logical shape in elements (``source.shape``)."""
        return self.source.shape

    @property
    def fmt(self) -> ElementFormat:
        """The element format of ``source`` (:class:`mxkit.formats.ElementFormat`)."""
        return self.source.fmt

    @property
    def device(self) -> torch.device:
        """torch.device of ``source``."""
        return self.source.device

    def __repr__(self) -> str:  # (the dataclass's would print every tensor it holds)
        layouts = [n for n, v in (("folded", self.folded), ("mma", self.mma_q), ("wide", self.wide),
                                  ("dense", self.dense)) if v is not None]
        return (f"PackedWeight({self.fmt.name}, shape={tuple(self.shape)}, layouts=[{', '.join(layouts)}], "
                f"nbytes={self.nbytes}, device={self.device})")

    @property
    def nbytes(self) -> int:
        """Bytes held on the device: the MX source plus the folded, the decode-layout, the MXFP8-twin and the
        dequantized (``dense``) copies."""
        n = self.source.nbytes
        if self.folded is not None:
            n += self.folded.data.numel() + 4 * self.folded.scale.numel()
        if self.mma_q is not None:
            n += 4 * (self.mma_q.numel() + self.mma_s.numel())
        if self.wide is not None:
            n += self.wide.nbytes
        if self.dense is not None:
            n += self.dense.numel() * self.dense.element_size()
        return n

    def to(self, device: Union[str, torch.device]) -> "PackedWeight":
        """The same weight with every tensor on ``device`` (bytes unchanged). Raises TypeError for a dtype, a
        tensor or anything else that is no device, ValueError for a string that is not a device, a negative index,
        or a device that cannot hold tensors here (:meth:`MXTensor.to`)."""
        device_only(device, "PackedWeight", "mxkit.dequantize(w.source, dtype)")
        f = self.folded
        if f is not None:
            f = dataclasses.replace(f, data=f.data.to(device), scale=f.scale.to(device), owner=f.owner.to(device))
        mma = {} if self.mma_q is None else {"mma_q": self.mma_q.to(device), "mma_s": self.mma_s.to(device)}
        st = self.stats.to(device) if isinstance(self.stats, torch.Tensor) else self.stats
        wide = None if self.wide is None else self.wide.to(device)
        dense = None if self.dense is None else self.dense.to(device)
        return dataclasses.replace(self, source=self.source.to(device), folded=f, stats=st,
                                   special_rows=self.special_rows.to(device), wide=wide, dense=dense, **mma)

    def state_dict(self) -> dict:
        """The bytes that define the weight, plus its format metadata (strings and ints): ``{"qdata": uint8 (N,
        K·b), "scale": uint8 (N, K / block_size) plain, "fmt": str, "shape": [N, K], "block_size": int,
        "scale_mode": str, "rounding": str}`` (b: packed bytes per element); :meth:`source_from_state_dict` reads
        it back."""
        s = self.source
        return {"qdata": s.qdata, "scale": s.plain_scale(), "fmt": s.fmt.name, "shape": list(s.shape),
                "block_size": s.block_size, "scale_mode": s.scale_mode.value, "rounding": s.rounding.value}

    @staticmethod
    def source_from_state_dict(sd: dict) -> MXTensor:
        """The MX weight (N, K) of a :meth:`state_dict` (pack it again with :func:`mxkit.pack_weight`). Raises
        TypeError for an ``sd`` that is not a mapping or a ``shape`` that is not a sequence of ints, KeyError naming
        a missing key, and MXTensor's TypeError / ValueError for inconsistent bytes or fields."""
        if not isinstance(sd, Mapping):
            raise TypeError(f"source_from_state_dict takes a PackedWeight state_dict (a dict), got {type(sd).__name__}")
        missing = [k for k in ("qdata", "scale", "fmt", "shape", "block_size", "scale_mode", "rounding") if k not in sd]
        if missing:
            raise KeyError(f"PackedWeight state_dict lacks {', '.join(missing)}")
        # (block_size as saved: an int, or a NumPy / 0-d tensor integer; int() truncated a float and parsed a string)
        bs = sd["block_size"]
        bs = bs.item() if isinstance(bs, torch.Tensor) and bs.dim() == 0 and not bs.is_floating_point() else as_int(bs)
        shape = sd["shape"]  # (a tuple, list or torch.Size; a 1-D int tensor or NumPy array as metadata comes back)
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or getattr(shape, "ndim", 1) != 1:
            raise TypeError(f"PackedWeight state_dict's shape must be a sequence of ints (N, K), got {shape!r}")
        shape = tuple(as_int(n.item() if isinstance(n, torch.Tensor) else n) for n in shape)
        return MXTensor(sd["qdata"], sd["scale"], sd["fmt"], 1, bs, shape,
                        ScaleMode.parse(sd["scale_mode"]), Rounding.parse(sd["rounding"]))


def packed_of(handle: int) -> PackedWeight:
    """The live PackedWeight whose ``id`` is ``handle``; RuntimeError when it no longer exists."""
    ref = _LIVE.get(handle)
    p = ref() if ref is not None else None
    if p is None:
        raise RuntimeError(f"mxkit::packed_matmul: the PackedWeight of id {handle} no longer exists")
    return p


def partial_stats(part: torch.Tensor) -> list:
    """Three 0-dim device tensors, the smallest byte other than 0xFF, the largest, and whether a 0xFF occurs,
    from per-part scale statistics int32 [P, 3] (:func:`partial_stats_host`); no host sync."""
    return [part[:, 0].amin(), part[:, 1].amax(), part[:, 2].amax()]


def note_planned(p: PackedWeight, dtype: torch.dtype) -> None:
    """Record on ``p`` that a GEMM plan for activations of ``dtype`` was made on it (a prepared call, a call planned
    per call, a layer's forward; quantized activations count as bf16: their paths read bf16 envelopes only), which
    a CUDA graph may hold: :func:`mxkit.kernels.matmul.refill_packed` holds p to those dtypes' envelopes, and
    :meth:`mxkit.nn.MXLinear.repack` warns where p is replaced after one. Only grows (unlike the calls kept on p,
    a bounded cache)."""
    p.__dict__.setdefault("_planned_dtypes", set()).add(dtype)


def planned_dtypes(p: PackedWeight) -> tuple:
    """The dtypes :func:`note_planned` recorded on ``p`` (a snapshot: another thread may add one)."""
    return tuple(p.__dict__.get("_planned_dtypes") or ())


def partial_stats_host(part: torch.Tensor) -> tuple:
    """``(scale_min, scale_max, has_nan)`` (int, int, bool) from per-part scale statistics int32 [P, 3], P >= 1
    (each row: the smallest and the largest E8M0 byte other than 0xFF of its part, 255 / -1 when it has none,
    and 1 where a 0xFF occurs; the packing kernel writes one row per program): one host sync. RuntimeError
    during CUDA-graph capture, which cannot read a device value."""
    if part.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a PackedWeight's scale statistics are read on its first GEMM call, which cannot "
                           "happen during CUDA-graph capture: call the GEMM once (or read .scale_max) before "
                           "capturing")
    lo, hi, nan = torch.stack(partial_stats(part)).tolist()
    return lo, hi, bool(nan)


def _packed_flatten(p: PackedWeight):
    f = p.folded
    leaves = [p.source, p.special_rows, p.mma_q, p.mma_s, f, p.wide, p.dense]
    if isinstance(p.stats, torch.Tensor):  # not read yet: a leaf (flattened under torch.export, it may be fake)
        return leaves + [p.stats], None
    return leaves, p.stats


def _packed_unflatten(leaves, stats) -> PackedWeight:
    if stats is None:
        stats = leaves[7]
    return PackedWeight(leaves[0], leaves[4], stats, leaves[1], leaves[2], leaves[3], leaves[5], leaves[6])


pytree.register_pytree_node(PackedWeight, _packed_flatten, _packed_unflatten,
                            serialized_type_name="mxkit.PackedWeight")
pytree.register_pytree_node(Fp8Rowwise, lambda t: ([t.data, t.scale], None),
                            lambda leaves, ctx: Fp8Rowwise(*leaves), serialized_type_name="mxkit.Fp8Rowwise")

# torch.load with weights_only (its default) takes a saved Fp8Rowwise or PackedWeight, as it takes an MXTensor
torch.serialization.add_safe_globals([Fp8Rowwise, _fp8_rowwise_from_codes, PackedWeight])
