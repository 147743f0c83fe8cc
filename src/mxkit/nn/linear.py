"""`MXLinear` (an ``nn.Linear`` whose weight is stored in an MX format) and model conversion.

Layout: the weight (out_features, in_features) is quantized along ``in_features`` (K, axis 1), the layout
:func:`mxkit.matmul` expects (``y = x @ W.T``) and the one OCP MX v1.0 §6 describes for a dot product.
It is held as two uint8 buffers, ``weight_qdata`` (packed element codes) and ``weight_scale`` (E8M0, one
byte per 32 elements), so ``state_dict()``, ``.to(device)`` and ``load_state_dict()`` work as for any
buffer. The bias stays in the original dtype.

With ``act_format`` set, the input is quantized along K on every call (dynamic, per block of
``block_size``, same scale rule) and the MX pair goes to :func:`mxkit.matmul` — a fake-quant of the input
as in torchao's ``MXLinear`` and microxcaling's ``MxLinear``. On CUDA an FP4 / FP6 pair is quantized and
folded in one pass (:func:`mxkit.quantize_fold`) and runs on the FP8 tensor cores; ``act_format=
"fp8_e4m3_rowwise"`` quantizes the input to FP8 E4M3 with a scale per row (TensorRT-LLM's W4A8).

On CUDA the weight is packed once (:func:`mxkit.pack_weight`: FP4 / FP6 weights folded to FP8 E4M3 with
row scales) when the module is built by :meth:`MXLinear.from_linear`, moved by ``.to()`` or loaded by
``load_state_dict``; the packed copy is not part of the ``state_dict`` (it is rebuilt from the MX bytes).

Under ``torch.compile`` an MXLinear (CUDA or CPU) is one opaque custom op, ``mxkit::mx_linear(x, bias,
weight_qdata)``, whose kernel is this module's eager forward (the GEMM kernels launch through the driver API, which
dynamo does not trace): ``fullgraph=True`` and ``mode="reduce-overhead"`` work. The op is given the layer's
``weight_qdata`` buffer, a graph input, and finds the layer by it (:mod:`mxkit.nn._ops`), so repeated blocks
compiled one by one share one graph; the kernel reads the layer's packed copy. The gradients of x and the bias
are registered on the op (x's by ``mxkit::mx_linear_dgrad``, the rule of :func:`mxkit.ops.with_input_grad`), so
training around a frozen MX layer compiles with ``fullgraph`` too.

Under ``torch.export`` (strict or not) an MXLinear without activation quantization is ``mxkit::mx_matmul`` on
its weight buffers, so the program holds the weight and runs after ``torch.export.load`` in another process (on
CUDA it takes the MXTensor routes, not the packed ones). With ``act_format`` it is ``mxkit::mx_linear_export`` on
its weight buffers (:mod:`mxkit.nn._linear_export`: the op rebuilds the layer around them once, packed as the module
is, and carries x's and the bias' gradients), so that program too runs in another process, which must ``import
mxkit.nn`` first (that registers the op).
"""

from __future__ import annotations

import fnmatch
import functools
import math
import warnings
import weakref
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Optional, Union

import torch
from torch import nn
from torch.autograd import forward_ad as _fwad

from .._cache import same_objects
from .._device import elsewhere, exporting, plain_traced
from ..ops import (_functorch_wrapped, dequantize, has_tangent, linear_input_grad, matmul, pack_weight, quantize,
                   quantize_fp8_rowwise, refuse_forward_ad, with_input_grad)
from ..fold import can_fold
from ..formats import BLOCK_SIZE, ElementFormat, FormatLike, Rounding, ScaleMode, check_bools, get_format
from ..packed import PackedWeight, note_planned
from ..tensor import SUPPORTED_INPUT_DTYPES, MXTensor, as_int, check_device_name
from ..kernels.matmul import a8w8_linear, refill_packed
from ..kernels.matmul_calls import prepared_call, prepared_call_a8w8, prepared_call_quantize_fold
from . import _linear_export, _ops

__all__ = ["MXLinear", "LayerReport", "quantize_model", "qsnr_db", "SkipLike", "FP8_ROWWISE"]

FP8_ROWWISE = "fp8_e4m3_rowwise"  # act_format of W4A8: FP8 E4M3 activations, one float32 scale per row

SkipLike = Union[None, str, Iterable[str], Callable[[str, nn.Module], bool]]


def _ran(p: PackedWeight) -> bool:
    """Whether a CUDA forward read packed weight ``p`` (could have been captured in a graph): the launches kept on
    it (the eager hot paths'), or a plan recorded on it (:func:`mxkit.packed.note_planned`)."""
    d = p.__dict__
    return bool(d.get("_calls") or d.get("_a8w8") or d.get("_planned_dtypes"))


def qsnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Quantization signal-to-noise ratio ``10·log10(‖x‖² / ‖x − x̂‖²)`` in dB, computed in float64 (float64
    inputs scaled first by one power of two, their largest finite magnitude's, so that values near its range
    neither overflow nor underflow).

    Returns NaN where either holds NaN or both the signal and the error are infinite; else ``inf`` when ``x̂ == x``
    exactly (equal infinities and two empty tensors included), or the signal is infinite and the error not, and
    ``-inf`` when ``x`` is all zero but ``x̂`` is not, or the error is infinite and the signal not. Raises TypeError
    for an argument that is not a tensor or is complex, ValueError when the shapes differ (no broadcasting). The ratio
    is torchao's SQNR (``torchao.quantization.utils.compute_error``: ``20·log10(‖x‖ / ‖x − x̂‖)``, in float32 there);
    the float64 scaling and the NaN / ±inf cases are mxkit's own."""
    for name, t in (("x", x), ("x_hat", x_hat)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"qsnr_db: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex():  # (the cast to float64 dropped the imaginary part: 1j against 0j read as exact)
            raise TypeError(f"qsnr_db: {name} is complex ({t.dtype}); pass real tensors")
    if tuple(x.shape) != tuple(x_hat.shape):
        raise ValueError(f"qsnr_db: x has shape {tuple(x.shape)} but x_hat {tuple(x_hat.shape)}")
    x64, h64 = x.detach().to(torch.float64), x_hat.detach().to(torch.float64)
    if torch.float64 in (x.dtype, x_hat.dtype) and x64.numel():  # (narrower floats' squares fit float64 as they are)
        top = max(t.abs().nan_to_num(0.0, 0.0, 0.0).max().item() for t in (x64, h64))
        if top > 0.0:  # (a power of two, at most 2^±1000: the scaling is exact)
            scale = math.ldexp(1.0, min(max(-math.frexp(top)[1], -1000), 1000))
            x64, h64 = x64 * scale, h64 * scale
    err = torch.where(x64 == h64, 0.0, x64 - h64).pow(2).sum().item()  # (equal infinities: no error, not inf - inf)
    sig = x64.pow(2).sum().item()
    if math.isnan(err) or math.isnan(sig) or math.isinf(err) and math.isinf(sig):
        return math.nan
    if err == 0.0 or math.isinf(sig):
        return math.inf
    if sig == 0.0 or math.isinf(err):
        return -math.inf
    return 10.0 * math.log10(sig / err)


class MXLinear(nn.Module):
    """``y = x @ dequant(W).T + b`` with ``W`` stored in an MX format (see module docstring for layout).

    Args (constructor; most users call :meth:`from_linear`):
      in_features, out_features: as ``nn.Linear``; ``in_features % block_size`` must be 0.
      weight_format: element format of the weight (``"mxfp4"``, ``"mxfp8_e4m3"``, …).
      bias: add a bias (kept as an ``nn.Parameter`` of ``dtype``).
      act_format: optional element format for the input, quantized along K on the fly, or
        ``"fp8_e4m3_rowwise"`` (W4A8: FP8 E4M3 with a float32 scale per row).
      scale_mode / rounding / block_size: passed to :func:`mxkit.quantize` (weight and activation).
      dense_cache: None, torch.bfloat16 or torch.float16: on CUDA also keep the weight dequantized to that dtype
        (:func:`mxkit.pack_weight`'s ``dense``: 2 bytes per element more), which float inputs of that dtype read
        on cuBLAS past the small-M kernels (path ``dense-cached``; prefill at cuBLAS speed). Weight-only layers:
        ValueError with an act_format.
      device / dtype: of the bias and of the output when the input has that dtype (the weight
        buffers are uint8).

    Buffers: ``weight_qdata`` uint8 (out_features, in_features · pack_bytes / pack),
    ``weight_scale`` uint8 (out_features, in_features // block_size). Zero-initialised by the
    constructor (a zero weight); :meth:`from_linear` fills them. On CUDA the forward reads a packed copy made from
    them (:meth:`repack`), made again by ``load_state_dict`` and ``.to()`` / ``.cuda()``: after writing the
    buffers in place (``weight_qdata.copy_(...)``), call :meth:`repack`, or the CUDA forward keeps the old weight.

    forward: x (..., in_features) float32 | bfloat16 | float16 on the buffers' device → (..., out_features)
    in ``x.dtype``. Computed by :func:`mxkit.matmul` (float32 accumulation on CPU today). Gradients flow to
    ``x`` and the bias, not to the frozen weight, on every device and path (:func:`mxkit.ops.with_input_grad`:
    ``grad_y @ dequantize(W)``, ``act_format``'s quantization passed straight through); the forward's result is
    the same with or without them.
    Raises ValueError if ``in_features`` or ``out_features`` is not positive, ``in_features % block_size != 0``,
    or ``block_size`` is not a positive multiple of the formats' packing, TypeError for a ``dtype`` that is not a
    floating torch.dtype or a ``bias`` that is not a bool; ``load_state_dict`` raises TypeError for
    ``weight_qdata`` / ``weight_scale`` that are not uint8, and ValueError for bytes saved from a layer of another
    format or block size (:func:`check_format`: the state_dict's metadata names them; a state_dict without it,
    such as a safetensors file's, holds the bytes only, and bytes of another format of the same width would load
    as this layer's format); forward raises TypeError for an x that is not
    a float32 / bfloat16 / float16 tensor, ValueError for ``x.shape[-1] != in_features``, NotImplementedError for
    forward-mode AD inside ``torch.compile`` or a torch.export program. The constructor also raises ValueError for
    unknown ``weight_format`` / ``act_format`` / mode / rounding names and a ``dense_cache`` other than None /
    bfloat16 / float16.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        weight_format: FormatLike,
        *,
        bias: bool = True,
        act_format: Optional[FormatLike] = None,
        scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
        rounding: Union[str, Rounding] = Rounding.RNE,
        block_size: int = BLOCK_SIZE,
        device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None,
        dense_cache: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        fmt = get_format(weight_format)
        act = _parse_act(act_format)
        # (NumPy integers as Python ints, as mxkit.quantize takes them)
        block_size, in_features, out_features = as_int(block_size), as_int(in_features), as_int(out_features)
        _check_block_size(block_size, fmt, act)
        check_device_name(device, "MXLinear(device=...)")
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"{name} must be a positive int for MXLinear, got {n!r}")
        if in_features % block_size:
            raise ValueError(f"{in_features=} must be a multiple of {block_size=} for MXLinear")
        self.in_features = in_features
        self.out_features = out_features
        self.weight_format: ElementFormat = fmt
        self.act_format: Optional[Union[ElementFormat, str]] = act
        self.scale_mode = ScaleMode.parse(scale_mode)
        self.rounding = Rounding.parse(rounding)
        self.block_size = block_size
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise TypeError(f"dtype={dtype!r} must be a floating torch.dtype (the bias's)")
        _check_dense_cache(dense_cache, act)
        check_bools(dict(bias=bias))  # (bias="no" made a bias)
        self.dense_cache = dense_cache
        q_shape, s_shape = MXTensor.expected_shapes((out_features, in_features), 1, fmt, block_size)
        self.register_buffer("weight_qdata", torch.zeros(q_shape, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros(s_shape, dtype=torch.uint8, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype or torch.float32))
        else:
            self.register_parameter("bias", None)
        self._packed = None  # PackedWeight on CUDA (not a buffer: rebuilt from the MX bytes)
        self._own_buffers()
        self._register_load_state_dict_pre_hook(_check_loaded_bytes)
        self.register_state_dict_post_hook(record_format)
        self.register_load_state_dict_pre_hook(check_format)
        self.register_load_state_dict_post_hook(_repack_after_load)

    def repack(self) -> None:
        """Re-pack the weight for the CUDA GEMM paths (drops the packed copy on CPU): only the layouts this
        module's activations read (:func:`mxkit.pack_weight`'s ``act``: no FP8 fold for float inputs).

        ``load_state_dict`` and in-place writes followed by ``repack()`` keep the packed tensors (and their
        addresses) where the new weight packs alike: the same buffers, scale statistics (smallest and largest E8M0
        byte, NaN) on the same side of every path envelope, and the same special rows
        (:func:`mxkit.kernels.matmul.refill_packed`); a CUDA graph captured
        before, or ``torch.compile(mode="reduce-overhead")``, then replays the new weight, as with ``nn.Linear``.
        Otherwise (a statistic crossed an envelope, e.g. a 0 or NaN scale byte appeared; ``.to()``; act_format
        replaced) the packed copy is a new one, and such a graph must be captured again: after a layer's first CUDA
        call, a repack of its buffers that makes a new copy warns (RuntimeWarning)."""
        act = self._act_kind()
        dense = getattr(self, "dense_cache", None) if act == "float" else None  # (None: pickled before it existed)
        # (blocks other than 32 elements: none of the 32-element layouts, the scale statistics and the dense cache
        # only, read by matmul's exact dense routes)
        new = pack_weight(self.weight_mx, act=act, dense=dense) if self.weight_qdata.is_cuda else None
        if new is not None:  # its scale statistics read now (one sync), so a graph may be captured at once
            for p in (new, new.wide):
                if p is not None:
                    p.scale_max
        self._own_buffers()
        old = self.__dict__.get("_packed")
        same = old is not None and new is not None and self.__dict__.get("_packed_act") == act
        kept = same and refill_packed(old, new)
        if same and not kept and old.source.qdata is new.source.qdata and _ran(old):
            # (the buffers written in place, the layer called on CUDA before: a graph it was captured in would replay
            # the old packed copy's freed memory, and nothing else can tell; one text: shown once by default)
            warnings.warn("MXLinear.repack: the weight written in place does not pack alike (a scale byte crossed a "
                          "path's envelope, e.g. a 0 or NaN byte appeared; or its fold's special rows changed): its "
                          "packed copy is a new one, so a CUDA graph captured before must be captured again",
                          RuntimeWarning, stacklevel=2)
        self._packed = old if kept else new
        self.__dict__["_packed_act"] = act  # (what it was packed for: act_format replaced later repacks once)

    def _own_buffers(self) -> None:
        """Record the weight's buffers as the layer's own (at construction and each repack): a compiled forward
        that finds others (swapped in by torch.func.functional_call, or assigned) takes the route whose op is given
        the weight's tensors, not the layer's key (weight_qdata, recorded here), whose op reads the layer's own."""
        b = self._buffers  # (weak: a replaced buffer is freed, e.g. accelerate's offload swapping it every call)
        own = (weakref.ref(b["weight_qdata"]), weakref.ref(b["weight_scale"]))
        # (buffers another live layer owns, shared with it: not this layer's own to its op)
        self.__dict__["_own"] = own if _ops.own_key(self, b["weight_qdata"], "linear") else None

    def _owns_weight(self) -> bool:
        """Whether the weight's buffers are the ones :meth:`_own_buffers` recorded (not swapped in)."""
        own, b = self.__dict__.get("_own"), self._buffers
        return own is not None and same_objects(own, (b["weight_qdata"], b["weight_scale"]))

    def _act_kind(self) -> str:
        """The layouts this layer's activations read: pack_weight's ``act``."""
        act = self.act_format
        return "float" if act is None else "fp8_rowwise" if act == FP8_ROWWISE else "mx"

    def _live_packed(self):
        """``_packed`` where it packs the buffers the layer holds now, else None: buffers replaced rather than
        written (an assignment, ``torch.func.functional_call``) are read through the unpacked paths, which read
        ``weight_mx`` (an in-place write still needs :meth:`repack`). Packed for other activations than
        ``act_format`` now asks for (act_format replaced after construction): packed again, once."""
        d = self.__dict__
        p = d["_packed"]
        if p is None:
            return None
        b, src = d["_buffers"], p.source
        if src.qdata is not b["weight_qdata"] or src.scale is not b["weight_scale"]:
            return None
        kind = d.get("_packed_act")
        if kind != "float" if d.get("act_format") is None else kind != self._act_kind():
            self.repack()
            return self._packed
        return p

    def __getstate__(self) -> dict:
        # (the packed copy is made again from the MX bytes on unpickling: pickled, it stored the CUDA layouts, a
        # fold and a dense cache beside the bytes, ~5x the state_dict's size)
        return dict(super().__getstate__(), _packed=None, _own=None)  # (both made again by repack on unpickling)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self.repack()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self._packed is not None or self.weight_qdata.is_cuda:
            self.repack()
        else:
            self._own_buffers()  # (the CPU's buffers may be new tensors too: to_empty, a cloning fn)
        return out

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        weight_format: FormatLike,
        *,
        act_format: Optional[FormatLike] = None,
        scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
        rounding: Union[str, Rounding] = Rounding.RNE,
        block_size: int = BLOCK_SIZE,
        dense_cache: Optional[torch.dtype] = None,
    ) -> "MXLinear":
        """Quantize ``linear.weight`` along ``in_features`` and return an MXLinear on the same device.

        The bias is copied (same dtype and device). Raises ValueError if ``linear.in_features`` is not a
        multiple of ``block_size`` or ``in_features`` / ``out_features`` is 0 (an empty layer), TypeError if
        ``linear`` is not an ``nn.Linear`` or its weight is not float32 / bfloat16 / float16.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(f"from_linear quantizes float32 / bfloat16 / float16 weights; linear.weight is {w.dtype}")
        mod = cls(
            linear.in_features, linear.out_features, weight_format, bias=linear.bias is not None,
            act_format=act_format, scale_mode=scale_mode, rounding=rounding, block_size=block_size,
            device=w.device, dtype=w.dtype, dense_cache=dense_cache,
        )
        q = quantize(w, mod.weight_format, axis=1, block_size=block_size, scale_mode=mod.scale_mode,
                     rounding=mod.rounding)
        mod.weight_qdata.copy_(q.qdata)
        mod.weight_scale.copy_(q.scale)
        mod.repack()
        if linear.bias is not None:
            mod.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=linear.bias.requires_grad)
        return mod

    @property
    def weight_mx(self) -> MXTensor:
        """The weight as an :class:`~mxkit.MXTensor` (N, K) quantized along K, sharing the buffers."""
        return MXTensor(
            self.weight_qdata, self.weight_scale, self.weight_format, 1, self.block_size,
            (self.out_features, self.in_features), self.scale_mode, self.rounding,
        )

    def dequantize_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense (out_features, in_features) weight in ``dtype``: float32 (None means float32), bfloat16, float16 or
        float64, as :func:`mxkit.dequantize`; exact in float64, and in float32 within its range (a value past it,
        from a scale byte near 254, is ±Inf there). Raises TypeError for another dtype."""
        return dequantize(self.weight_mx, dtype)

    @property
    def weight_nbytes(self) -> int:
        """Storage bytes of the weight: element codes plus E8M0 scales."""
        return self.weight_qdata.numel() + self.weight_scale.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (the bias read once, from the parameter dict: nn.Module.__getattr__ costs ~0.3 us a read on the hot path)
        bias = self._parameters["bias"]
        if torch.compiler.is_compiling() and plain_traced(x):
            if exporting() or not self._owns_weight():
                # torch.export, or buffers not the layer's own (functional_call): the weight's tensors in the program,
                # not this process's key (whose op reads the layer's own buffers)
                if self.act_format is None:
                    return matmul(x, self.weight_mx, bias=bias, out_dtype=x.dtype)  # (mxkit::mx_matmul)
                refuse_forward_ad("MXLinear")
                return torch.ops.mxkit.mx_linear_export(x, self.weight_qdata, self.weight_scale, bias,
                                                        _linear_export.export_spec(self))
            # the CUDA GEMMs launch through the driver API (ctypes), which dynamo does not trace, and the CPU
            # reference reads scale statistics on the host: one opaque op on every device, with the gradients of
            # x and the bias (with_input_grad's) registered on it
            refuse_forward_ad("MXLinear")
            return torch.ops.mxkit.mx_linear(x, bias, self.weight_qdata)
        return self._eager(x, bias)

    def _eager(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``forward`` outside torch.compile (and mxkit::mx_linear's kernel, where autograd is off)."""
        try:
            # (needs_grad(x, bias) written out: this runs on every eager call)
            if (torch.is_grad_enabled() and (getattr(x, "requires_grad", False)
                                             or bias is not None and bias.requires_grad)
                    or _fwad._current_level >= 0 and has_tangent(x, bias)):  # (forward mode: tangents)
                # training through a frozen MX weight (e.g. adapters): this forward outside autograd (the same bits as
                # without gradients), the input's and the bias' gradients by the dequantized weight
                return with_input_grad(x, bias, self.weight_mx, self._forward)
            packed = self._live_packed()
            if packed is not None and type(x) is torch.Tensor and x.is_cuda:
                if x.is_neg():
                    x = x.resolve_neg()  # (a negative-bit view: its memory holds -x, which the kernels read raw)
                if elsewhere(x):  # (the kernels launch on the current device)
                    with torch.cuda.device(x.device):
                        return self._eager(x, bias)
                act = self.act_format
                if act is None:
                    # the eager hot path (decode): what matmul's own fast path runs, minus its checks
                    return prepared_call(x, packed, x.dtype, bias)(x, bias)
                route = self._route()
                if route == "a8w8":  # _a8w8's one launch (x quantized in it), from its prepared call
                    call = prepared_call_a8w8(x, packed, x.dtype, bias)
                    if call is not None:
                        return call(x, bias)
                elif route == "fold" and bias is None:
                    # activations that fold: _forward's quantize-fold, FP8 GEMM and fix-up with their launches bound
                    call = prepared_call_quantize_fold(x, packed, act, self.scale_mode, self.rounding)
                    if call is not None:
                        return call(x)
            return self._forward(x, bias)
        except (TypeError, ValueError) as e:
            # (matmul / quantize name their operands a and b; a layer user passed x: say it in the layer's terms,
            # here on the error path only, so that the hot path makes no check of its own; an error this method
            # already worded, from its call on x's own device, passes as it is)
            if getattr(e, "_mxkit_layer_worded", False):
                raise
            if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[-1] != self.in_features):
                worded = ValueError(f"{type(self).__name__}: x has shape {tuple(x.shape)}; expected "
                                    f"(..., {self.in_features})")
            elif isinstance(x, torch.Tensor) and x.dtype not in SUPPORTED_INPUT_DTYPES:
                worded = TypeError(f"{type(self).__name__} takes float32 / bfloat16 / float16 x, got {x.dtype}")
            elif isinstance(x, torch.Tensor) and x.device != self.weight_qdata.device:
                worded = ValueError(f"{type(self).__name__}'s weight is on {self.weight_qdata.device} but x on "
                                    f"{x.device}: move one to the other's device")
            else:
                raise
            worded._mxkit_layer_worded = True
            raise worded from e

    def _route(self) -> Optional[str]:
        """The route of :meth:`_eager_route`, made again where act_format, scale_mode or rounding was replaced."""
        r = self.__dict__.get("_route_kept")
        if r is None or not (r[0] is self.act_format and r[1] is self.scale_mode and r[2] is self.rounding):
            r = self._eager_route()
        return r[3]

    def _eager_route(self) -> tuple:
        """(act_format, scale_mode, rounding, route) kept on the layer: which prepared eager call its quantized
        activations take on CUDA: "a8w8" (the conditions of :meth:`_a8w8`), "fold" (activations and weight that
        fold, blocks of 32), else None (:meth:`_forward`). Made again when one of the three is replaced (weight_format
        and block_size are the quantized weight's; the prepared calls check the weight's layouts themselves)."""
        act, wf = self.act_format, self.weight_format
        route = None
        if (getattr(act, "name", None) == "mxfp8_e4m3" and wf.name == "mxfp8_e4m3" and self.block_size == 32
                and self.scale_mode is ScaleMode.FLOOR and self.rounding is Rounding.RNE):
            route = "a8w8"
        elif act is not None and act != FP8_ROWWISE and self.block_size == 32 and can_fold(act) and can_fold(wf):
            route = "fold"
        r = (act, self.scale_mode, self.rounding, route)
        self.__dict__["_route_kept"] = r  # (a plain attribute, set past nn.Module.__setattr__: not in the state_dict)
        return r

    def _forward(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        packed, act = self._live_packed(), self.act_format
        if packed is not None:  # (what repack's warning asks, and the envelopes a refill holds: quantized x, bf16's)
            note_planned(packed, x.dtype if act is None and isinstance(x, torch.Tensor) else torch.bfloat16)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__} takes a float tensor (..., {self.in_features}), got "
                            f"{type(x).__name__}")
        if x.numel() == 0 and act is not None:  # an empty batch: nothing to quantize
            if x.dtype not in SUPPORTED_INPUT_DTYPES:
                raise TypeError(f"{type(self).__name__} with act_format takes float32 / bfloat16 / float16 x, got "
                                f"{x.dtype}")
            if x.dim() == 0 or x.shape[-1] != self.in_features:
                raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., {self.in_features})")
            return x.new_empty((*x.shape[:-1], self.out_features))
        w = packed if packed is not None else self.weight_mx
        a = x
        if act == FP8_ROWWISE:
            a = quantize_fp8_rowwise(x)
        elif (act is not None and x.is_cuda and self.block_size == BLOCK_SIZE and can_fold(act)
              and can_fold(self.weight_format) and not _functorch_wrapped(x)):
            # (the fold kernel's blocks are of 32; others, and vmap's BatchedTensors: matmul's exact path)
            from ..kernels.fold import quantize_fold_triton  # deferred: matmul completes it after enqueuing

            a = quantize_fold_triton(x.contiguous(), act, block_size=self.block_size, scale_mode=self.scale_mode,
                                     rounding=self.rounding, defer=True)
        elif act is not None:
            y = self._a8w8(x, w, bias)
            if y is not None:
                return y
            a = quantize(x, act, axis=-1, block_size=self.block_size, scale_mode=self.scale_mode,
                         rounding=self.rounding)
        # the bias added in float32 before the one output rounding
        return matmul(a, w, bias=None if bias is None else bias.detach(), out_dtype=x.dtype)

    def _a8w8(self, x: torch.Tensor, w, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """MXFP8 activations x an MXFP8 weight at small M in one launch (x quantized inside the a8w8-mma kernel,
        the bytes of :func:`mxkit.quantize` with this layer's FLOOR / RNE), or None where it does not apply."""
        if self._route() != "a8w8" or _functorch_wrapped(x):  # (vmap's BatchedTensors: no storage for a kernel)
            return None  # (a8w8_linear checks the rest: CUDA, bf16 x, shapes, envelope, not while compiling)
        if isinstance(w, PackedWeight) and type(x) is torch.Tensor and x.is_cuda \
                and not torch.compiler.is_compiling():
            call = prepared_call_a8w8(x, w, x.dtype, bias)  # the eager hot path: one launch, checks made once
            if call is not None:
                return call(x, bias)
        return a8w8_linear(x, w, bias, x.dtype)

    def extra_repr(self) -> str:
        act = getattr(self.act_format, "name", self.act_format)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"weight_format={self.weight_format.name}, act_format={act}, "
            f"scale_mode={ScaleMode.parse(self.scale_mode).value}, "
            f"rounding={Rounding.parse(self.rounding).value}, block_size={self.block_size}"
            + (f", dense_cache={self.dense_cache}" if getattr(self, "dense_cache", None) is not None else "")
        )


@torch.library.custom_op("mxkit::mx_linear", mutates_args=())
def _mx_linear_op(x: torch.Tensor, bias: Optional[torch.Tensor], weight_qdata: torch.Tensor) -> torch.Tensor:
    """``module(x)`` of the MXLinear whose ``weight_qdata`` buffer this is (:func:`mxkit.nn._ops.own_key`) with
    ``bias`` (its bias parameter, passed so that autograd sees it), eagerly: torch.compile's view of an MXLinear.
    Returns (..., out_features) in x's dtype."""
    m = _ops.module_of_key(weight_qdata, "linear", "mx_linear")
    with torch.no_grad():  # (autograd is the op's: the registered backward below)
        return m._eager(x, bias)  # (a new tensor: no path returns a view of x)


@_mx_linear_op.register_fake
def _mx_linear_fake(x: torch.Tensor, bias: Optional[torch.Tensor], weight_qdata: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight_qdata.shape[0]))


@torch.library.custom_op("mxkit::mx_linear_dgrad", mutates_args=())
def _mx_linear_dgrad_op(grad: torch.Tensor, weight_qdata: torch.Tensor, in_features: int,
                        dtype: torch.dtype) -> torch.Tensor:
    """x's gradient of ``mxkit::mx_linear``: ``grad (..., out_features) @ dequantize(weight)`` in float32, cast
    to ``dtype`` (:func:`mxkit.ops.with_input_grad`'s rule: the straight-through estimator for ``act_format``)."""
    return linear_input_grad(grad, _ops.module_of_key(weight_qdata, "linear", "mx_linear_dgrad").weight_mx, dtype)


@_mx_linear_dgrad_op.register_fake
def _mx_linear_dgrad_fake(grad: torch.Tensor, weight_qdata: torch.Tensor, in_features: int,
                          dtype: torch.dtype) -> torch.Tensor:
    return grad.new_empty((*grad.shape[:-1], in_features), dtype=dtype)


def _mx_linear_setup(ctx, inputs, output) -> None:
    x, bias, weight_qdata = inputs
    ctx.weight_qdata, ctx.in_features, ctx.x_dtype = weight_qdata, x.shape[-1], x.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _mx_linear_backward(ctx, grad):
    gx = gb = None
    if ctx.needs_input_grad[0]:
        gx = torch.ops.mxkit.mx_linear_dgrad(grad, ctx.weight_qdata, ctx.in_features, ctx.x_dtype)
    if ctx.needs_input_grad[1]:
        gb = grad.reshape(-1, grad.shape[-1]).to(torch.float32).sum(0).to(ctx.bias_dtype)
    return gx, gb, None


_mx_linear_op.register_autograd(_mx_linear_backward, setup_context=_mx_linear_setup)


@dataclass
class LayerReport:
    """One row of :func:`quantize_model`'s report.

    status: ``"quantized"``, ``"skipped"`` (matched ``skip``) or ``"unsupported"`` (in_features not a
    multiple of block_size, an empty layer, a weight dtype other than float32 / bfloat16 / float16: ``reason``
    says which). qsnr_db: weight QSNR in dB (``None`` unless quantized and computed).
    bits_per_weight: storage bits per weight element including scales (``None`` unless quantized).
    shared_with: for a module registered at more than one path, the first path's name on the rows of the others
    (the same module and status; leave these rows out of totals).
    """

    name: str
    out_features: int
    in_features: int
    status: str
    reason: str = ""
    qsnr_db: Optional[float] = None
    bits_per_weight: Optional[float] = None
    weight_nbytes: Optional[int] = None
    shared_with: Optional[str] = None

    @property
    def numel(self) -> int:
        """int: the weight's element count, ``out_features * in_features``."""
        return self.out_features * self.in_features

    def as_dict(self) -> dict:
        """The report's fields as a plain dict (JSON-ready: strings, numbers, None)."""
        return asdict(self)


def _repack_after_load(module: "MXLinear", incompatible_keys) -> None:
    module.repack()


def _check_loaded_bytes(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """load_state_dict pre-hook: the MX buffers load as bytes only (``copy_`` would cast a float tensor)."""
    for name in ("weight_qdata", "weight_scale"):
        t = state_dict.get(prefix + name)
        if isinstance(t, torch.Tensor) and t.dtype != torch.uint8:
            raise TypeError(f"{prefix + name} must be uint8 (MX bytes), got {t.dtype}")


def record_format(module: nn.Module, state_dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook of the MX layers (MXLinear, MXMoE): the element format and block size of the bytes, in
    the state_dict's metadata (``torch.save`` keeps it, safetensors does not), for :func:`check_format`."""
    local_metadata["mx_format"] = module.weight_format.name
    local_metadata["mx_block_size"] = module.block_size


def check_format(module: nn.Module, state_dict, prefix: str, local_metadata: dict, strict, missing_keys,
                 unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: bytes saved with another element format or block size than the layer's raise
    ValueError before anything is copied (the bytes alone, of one width, would load and decode as garbage). A
    state_dict without the metadata (safetensors, a plain dict) is not checked."""
    fmt, bs = local_metadata.get("mx_format"), local_metadata.get("mx_block_size")
    if fmt is not None and (fmt, bs) != (module.weight_format.name, module.block_size):
        raise ValueError(f"{prefix[:-1] or type(module).__name__}: the state_dict holds {fmt} bytes (block_size {bs}); "
                         f"this {type(module).__name__} is {module.weight_format.name} (block_size "
                         f"{module.block_size}): build it with the saved format")


def copied_dense_cache(layer: MXLinear) -> Optional[torch.dtype]:
    """The ``dense_cache`` a layer made from ``layer`` (fused, gated, sharded) takes: its own, none where it
    quantizes its input (an act_format set after construction: MXLinear refuses the two together)."""
    return getattr(layer, "dense_cache", None) if layer.act_format is None else None


def _check_dense_cache(dense_cache, act) -> None:
    if dense_cache not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"dense_cache={dense_cache!r}: None, torch.bfloat16 or torch.float16")
    if dense_cache is not None and act is not None:  # (it was accepted, shown in the repr, and never built)
        raise ValueError(f"dense_cache={dense_cache} is for weight-only layers: an act_format "
                         f"({getattr(act, 'name', act)!r}) "
                         f"quantizes the input, which never reads a dequantized weight")


def _check_block_size(block_size, fmt: ElementFormat, act) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    for f in (fmt, act):
        if isinstance(f, ElementFormat) and block_size % f.pack:
            raise ValueError(f"{block_size=} is not a multiple of the element packing of {f.name} ({f.pack})")


def _parse_act(act_format) -> Optional[Union[ElementFormat, str]]:
    if act_format is None:
        return None
    if isinstance(act_format, str) and act_format.lower() == FP8_ROWWISE:
        return FP8_ROWWISE
    return get_format(act_format)


def _skip_matcher(skip: SkipLike) -> Callable[[str, nn.Module], bool]:
    if skip is None:
        return lambda name, mod: False
    if callable(skip):
        return skip
    bad = "skip must be a name, an fnmatch pattern, a list of them or a callable; got {!r}"
    try:
        if isinstance(skip, (bytes, bytearray)):  # (iterable, but of ints: the error named the first byte)
            raise TypeError
        patterns = [skip] if isinstance(skip, str) else list(skip)
    except TypeError:
        raise TypeError(bad.format(skip)) from None
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(bad.format(p))
    return lambda name, mod: any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)


_CARRIED_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_pre_hooks",
                  "_backward_hooks", "_is_full_backward_hook")
_STATE_DICT_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                     "_load_state_dict_post_hooks")


def _hooked(m: nn.Module) -> bool:
    """Whether module ``m`` has forward / backward hooks of its own or a ``forward`` replaced on the instance:
    what a fused module in its place (fuse_siblings, fuse_gated_mlp) would silently drop."""
    d = m.__dict__
    return "forward" in d or any(d.get(a) for a in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                                                    "_backward_hooks"))


def _state_hooked(m: MXLinear) -> bool:
    """Whether MXLinear ``m`` has state_dict / load_state_dict hooks beyond the ones every MXLinear registers (the
    format record and checks): a fused layer in its place holds other keys, and would drop them silently."""
    base = _own_state_hook_counts()
    return any(len(m.__dict__.get(attr) or ()) > n for attr, n in zip(_STATE_DICT_HOOKS, base))


@functools.lru_cache(maxsize=1)
def _own_state_hook_counts() -> tuple:
    """How many of each of :data:`_STATE_DICT_HOOKS` an MXLinear registers itself."""
    m = MXLinear(32, 1, "mxfp8_e4m3", bias=False)
    return tuple(len(m.__dict__.get(attr) or ()) for attr in _STATE_DICT_HOOKS)


def _carry_hooks(lin: nn.Linear, new: "MXLinear") -> bool:
    """Give ``new`` the forward and backward hooks registered on ``lin`` (the same dicts: the handles a caller
    holds still remove them). Returns whether ``lin`` had state_dict hooks, which are not carried (they were
    written for nn.Linear's keys)."""
    for attr in _CARRIED_HOOKS:
        if attr in lin.__dict__:
            setattr(new, attr, lin.__dict__[attr])
    return any(lin.__dict__.get(attr) for attr in _STATE_DICT_HOOKS)


def _unsupported(lin: nn.Linear, block_size: int) -> str:
    """Why ``lin`` cannot become an MXLinear ("" if it can): checked for every layer before any is replaced."""
    if lin.in_features % block_size:
        return f"in_features={lin.in_features} % block_size={block_size} != 0"
    if lin.in_features == 0 or lin.out_features == 0:
        return f"weight_shape {lin.out_features} x {lin.in_features}: empty"
    if lin.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"weight_dtype {lin.weight.dtype}: float32, bfloat16 or float16 only"
    if type(lin).forward is not nn.Linear.forward:  # (an MXLinear computes x @ W.T + b: its forward would be lost)
        return f"{type(lin).__name__}: an nn.Linear subclass with a forward of its own"
    if "forward" in lin.__dict__:  # (accelerate's hooks, a LoRA-style patch: set on the instance, lost with it)
        return "its forward is replaced on the instance (an MXLinear computes x @ W.T + b)"
    norm = _legacy_norm_hook(lin)
    if norm:  # (the hook recomputes lin.weight each forward from parameters an MXLinear does not have)
        return (f"its weight is recomputed by a legacy {norm} pre-hook (torch.nn.utils.remove_{norm} first, or "
                f"torch.nn.utils.parametrizations.{norm}, whose weight quantizes)")
    return ""


def _legacy_norm_hook(m: nn.Module) -> str:
    """"weight_norm" / "spectral_norm" where ``m`` has a legacy ``torch.nn.utils.weight_norm`` / ``spectral_norm``
    forward pre-hook, else "": carried to an MXLinear, it would read ``weight_g`` / ``weight_orig``, which an MXLinear
    does not have (AttributeError on the first forward)."""
    for h in getattr(m, "_forward_pre_hooks", {}).values():
        name = {"WeightNorm": "weight_norm", "SpectralNorm": "spectral_norm"}.get(type(h).__name__)
        if name and type(h).__module__.startswith("torch.nn.utils"):
            return name
    return ""


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def quantize_model(
    model: nn.Module,
    weight_format: FormatLike,
    *,
    act_format: Optional[FormatLike] = None,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    block_size: int = BLOCK_SIZE,
    skip: SkipLike = None,
    compute_qsnr: bool = True,
    progress: bool = True,
    return_report: bool = False,
    fuse: bool = False,
    dense_cache: Optional[torch.dtype] = None,
):
    """Replace every ``nn.Linear`` of ``model`` by an :class:`MXLinear`, in place.

    skip: a module name, an ``fnmatch`` pattern (``"*.pooler.*"``, ``"lm_head"``), a list of them, or a
      callable ``(name, module) -> bool``; matching layers are left as they are.
    Layers whose ``in_features % block_size != 0``, empty layers, layers whose weight is not float32 /
    bfloat16 / float16, ``nn.Linear`` subclasses with a forward of their own or a forward replaced on the instance
    (accelerate's hooks), and layers whose owner reads their weight itself (``nn.MultiheadAttention``'s
    ``out_proj``; ``nn.TransformerEncoderLayer``'s ``linear1`` / ``linear2``, read by its fast path) and layers under
    the legacy ``torch.nn.utils.weight_norm`` / ``spectral_norm`` hooks (the ``parametrizations`` versions quantize
    the weight they compute) are left alone, reported with status ``"unsupported"`` and listed in one
    ``UserWarning``.
    A replaced layer's forward and backward hooks move to its MXLinear (their handles still remove them); its
    state_dict hooks, written for nn.Linear's keys, do not (a ``UserWarning`` names the layers).
    An MXMoE's router stays an ``nn.Linear`` (status ``"skipped"``). A layer whose weight is tied to another
    parameter (a tied ``lm_head``) is quantized into its own MX copy, untied, with a ``UserWarning`` naming it.
    compute_qsnr: measure each weight's QSNR (dB) against its dequantized MX copy (not on the meta device).
    progress: show a tqdm bar over the Linear layers.
    fuse: then run sibling layers that read the same input as one GEMM (:func:`mxkit.nn.fuse_siblings`:
      attention's q / k / v and a gated MLP's gate / up; the state_dict then holds the fused layers; a group
      with a hooked member stays unfused, its hooks kept).
    dense_cache: :class:`MXLinear`'s (a dequantized copy of each weight kept for prefill on CUDA).

    Returns ``model`` (or ``(model, report)`` with ``return_report=True``); the report — a list of
    :class:`LayerReport`, one per ``nn.Linear`` found, in ``named_modules`` order — is also stored as
    ``model.mx_report``. A Linear registered at two paths (one module, two names) becomes one MXLinear at both,
    a row each (the second's ``shared_with`` names the first; a ``skip`` matching either path keeps it at both).
    MXLinear layers already in ``model`` keep their formats (a ``UserWarning`` names them). Raises, before
    touching the model: TypeError for a ``model`` that is not an ``nn.Module``, ValueError / TypeError for unknown
    format or mode names, ValueError for a ``block_size`` that is not a positive multiple of the element packing
    or a ``dense_cache`` :class:`MXLinear` refuses,
    TypeError for a ``skip`` that is not a name, a pattern, a list of them or a callable, or a flag
    (``compute_qsnr``, ``progress``, ``return_report``, ``fuse``) that is not a bool, and TypeError when
    ``model`` is a bare ``nn.Linear`` (there is no parent to put the MXLinear into: use
    :meth:`MXLinear.from_linear`).
    """
    from tqdm.auto import tqdm

    fmt = get_format(weight_format)
    act = _parse_act(act_format)
    mode = ScaleMode.parse(scale_mode)
    rnd = Rounding.parse(rounding)
    block_size = as_int(block_size)
    _check_block_size(block_size, fmt, act)
    _check_dense_cache(dense_cache, act)  # (checked at the first layer only: a model with none took any value)
    check_bools(dict(compute_qsnr=compute_qsnr, progress=progress, return_report=return_report, fuse=fuse),
                "quantize_model: ")  # (return_report="no" returned a tuple)
    should_skip = _skip_matcher(skip)
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_model needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Linear):
        raise TypeError("quantize_model got a bare nn.Linear, which cannot be replaced in place; "
                        "use MXLinear.from_linear instead")

    from .moe import MXMoE

    # every path of every Linear (one module registered twice is replaced at both by one MXLinear)
    linears = [(n, m) for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, nn.Linear)]
    done = [n for n, m in model.named_modules() if isinstance(m, MXLinear)]
    if done:
        warnings.warn(f"quantize_model found {len(done)} MXLinear layer(s) already quantized ({', '.join(done[:4])}"
                      f"{', ...' if len(done) > 4 else ''}): they keep their formats (quantize the dense model "
                      f"again for others)", stacklevel=2)
    in_moe = {id(sub) for m in model.modules() if isinstance(m, MXMoE) for sub in m.modules()}
    # torch modules that read their Linears' weights themselves: nn.MultiheadAttention its out_proj's, and
    # nn.TransformerEncoderLayer (its fast path's checks) its linear1's and linear2's
    read = {id(m.out_proj): "nn.MultiheadAttention's out_proj" for m in model.modules()
            if isinstance(m, nn.MultiheadAttention)}
    read.update({id(getattr(m, n)): f"nn.TransformerEncoderLayer's {n}" for m in model.modules()
                 if isinstance(m, nn.TransformerEncoderLayer) for n in ("linear1", "linear2")})
    names_of = {}  # parameter id -> every name it has (tied weights: more than one)
    for n, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(n)
    report: list[LayerReport] = []
    unsupported, untied, dropped_hooks = [], [], []
    paths: dict[int, list[str]] = {}  # id(Linear) -> its paths (one module registered twice: two)
    for n, m in linears:
        paths.setdefault(id(m), []).append(n)
    made: dict[int, tuple[str, MXLinear, LayerReport]] = {}  # id(Linear) -> its first path, MXLinear and row
    for name, lin in tqdm(linears, desc=f"quantize {fmt.name}", disable=not progress, leave=False):
        row = LayerReport(name, lin.out_features, lin.in_features, "quantized")
        if id(lin) in made:  # the same module at a second path: the same MXLinear there (or left as the first)
            first, new, first_row = made[id(lin)]
            row = replace(first_row, name=name, shared_with=first)
            if new is not None:
                _set_submodule(model, name, new)
            report.append(row)
            continue
        if any(should_skip(p, lin) for p in paths[id(lin)]):  # (a skip of any of its paths keeps it at all)
            row.status, row.reason = "skipped", "matched skip"
        elif id(lin) in in_moe:  # (MXMoE's router: it reads its weight, and its logits choose the experts)
            row.status, row.reason = "skipped", "inside an MXMoE (its router)"
        elif id(lin) in read:
            row.status, row.reason = "unsupported", f"{read[id(lin)]}: its owner reads the weight"
            unsupported.append(f"{name} ({row.reason})")
        elif why := _unsupported(lin, block_size):
            row.status, row.reason = "unsupported", why
            unsupported.append(f"{name} ({why})")
        else:
            new = MXLinear.from_linear(lin, fmt, act_format=act, scale_mode=mode, rounding=rnd,
                                       block_size=block_size, dense_cache=dense_cache)
            if compute_qsnr and not lin.weight.is_meta:  # (a meta model has no values to measure: qsnr_db None)
                row.qsnr_db = qsnr_db(lin.weight, new.dequantize_weight(torch.float32))
            row.weight_nbytes = new.weight_nbytes
            row.bits_per_weight = 8.0 * new.weight_nbytes / row.numel
            own = {f"{n}.weight" for n in paths[id(lin)]}  # (its paths: one MXLinear at each)
            others = [n for n in names_of.get(id(lin.weight), ()) if n not in own]
            if others:
                untied.append(f"{name}.weight (tied to {', '.join(others)})")
            if _carry_hooks(lin, new):
                dropped_hooks.append(name)
            _set_submodule(model, name, new)
        made[id(lin)] = (name, new if row.status == "quantized" else None, row)
        report.append(row)
    if unsupported:
        warnings.warn(
            f"quantize_model left {len(unsupported)} nn.Linear layer(s) unquantized: {', '.join(unsupported)}",
            stacklevel=2,
        )
    if dropped_hooks:
        warnings.warn(
            f"quantize_model dropped the state_dict hooks of {len(dropped_hooks)} layer(s): {', '.join(dropped_hooks)} "
            "(they were written for nn.Linear's keys; an MXLinear's are weight_qdata / weight_scale)", stacklevel=2)
    if untied:
        warnings.warn(
            f"quantize_model untied {len(untied)} weight(s): {'; '.join(untied)}. Each MXLinear holds its own MX "
            "copy and the other holders (e.g. the input embedding) stay as they were; do not call the model's "
            "tie_weights() afterwards (pass skip=... to keep such a layer dense and tied)",
            stacklevel=2,
        )
    if fuse:
        from .fused import fuse_siblings

        fuse_siblings(model)
    model.mx_report = report
    return (model, report) if return_report else model
