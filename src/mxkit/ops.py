"""Public MX operations with backend dispatch.

``backend="auto"`` runs the Triton kernels (:mod:`mxkit.kernels`) for CUDA tensors when Triton is present
and the reference (:mod:`mxkit.reference`) otherwise; ``"reference"`` and ``"triton"`` force one.
Quantize and dequantize return the same bytes on every backend: the reference is the specification. GEMMs are
exact to a stated bound (:func:`matmul`): float32 accumulation in the order each path sums, one output rounding.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional, Sequence, Union

import torch
from torch.autograd import forward_ad as _fwad

from . import reference
from ._autocast import autocast_off
from ._cache import tensor_version
from ._precision import exact_matmul
from ._device import elsewhere, exporting, on_operand_device, other_device, plain_traced
from .formats import BLOCK_SIZE, FormatLike, Rounding, ScaleMode, check_bools
from .fold import Folded, quantize_fold_reference
from .packed import Fp8Rowwise, PackedWeight, note_planned, packed_of
from .tensor import SUPPORTED_INPUT_DTYPES, MXTensor, as_int

__all__ = [
    "quantize", "cast_transpose", "dequantize", "matmul", "pack_weight", "gemm_plan", "quantize_fold",
    "quantize_fp8_rowwise", "BACKENDS",
]

BACKENDS = ("auto", "reference", "triton")


def _resolve_backend(backend: str, device: torch.device, block_size: int = BLOCK_SIZE) -> str:
    """The backend of a quantize / dequantize call: "auto" is the Triton kernels on CUDA for blocks of 32 (the only
    size they take) and the reference elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    from .kernels import triton_available

    if backend == "auto":
        return "triton" if device.type == "cuda" and block_size == BLOCK_SIZE and triton_available() else "reference"
    if backend == "triton" and not triton_available():
        raise ImportError("backend='triton' needs Triton, which failed to import: pip install 'mxkit[triton]'")
    return backend


def quantize(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    axis: Union[int, Sequence[int]] = -1,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    scale_layout: str = "plain",
    backend: str = "auto",
) -> Union[MXTensor, tuple[MXTensor, ...]]:
    """Quantize ``x`` to an MX format along ``axis``. See :func:`mxkit.reference.quantize_reference`.

    x: (..., L, ...) float32 | bfloat16 | float16, ``x.shape[axis] % block_size == 0``.
    axis: an int, or a tuple of two ints for a cast-transpose: one MXTensor per axis, each byte-identical
      to quantizing along that axis alone (the Triton backend reads ``x`` once for both).
    Returns MXTensor: qdata uint8 (axis moved last, packed), scale uint8 E8M0 (…, L // block_size) (a swizzled
    ``scale_layout``: 2-D ``scale_layout_shape(prod(leading dims), L // block_size, layout)``, pad bytes 0); for a
    pair of axes, one MXTensor per axis in the order given.
    Scale rule (:class:`~mxkit.formats.ScaleMode`): ``FLOOR`` = OCP MX v1.0 §6.3 (default); ``CEIL`` = torchao's
    CEIL; ``RCEIL`` = NVIDIA cuBLAS / TransformerEngine (and triton_kernels' ROUND_UP but at amax <= max_normal *
    2^-127); ``EVEN`` = aiter's Triton MXFP4 quantizers and torchao's EVEN. Rounding: ``"rne"`` (default) or
    ``"away"``.
    scale_layout: ``"plain"`` or a swizzled layout of :mod:`mxkit.layouts` (``"nvidia_128x4"``: the Triton
      backend writes it directly; byte-identical to quantize then :func:`mxkit.layouts.to_layout`).
    backend: ``"auto"`` (the Triton kernels on CUDA for blocks of 32, the reference otherwise: other block sizes
      too), ``"reference"`` or ``"triton"`` (NotImplementedError for blocks other than 32).
    Raises TypeError for an x that is not a float32 / bfloat16 / float16 tensor or an axis that is not an int or a
    pair of ints; ValueError for an empty x, an axis out of range, an axis length not a multiple of block_size,
    a block_size that is not a positive multiple of the format's packing, unknown format / mode / rounding /
    layout / backend names, and ``backend="triton"`` on an x not on CUDA; ImportError for ``backend="triton"``
    where Triton does not import.
    """
    if type(block_size) is not int:
        block_size = as_int(block_size)  # (a NumPy integer, as axis; a bool or non-integer is refused below)
    if isinstance(x, torch.Tensor) and x.is_cuda and elsewhere(x):  # (the kernels launch on the current device)
        with torch.cuda.device(x.device):
            return quantize(x, fmt, axis=axis, block_size=block_size, scale_mode=scale_mode, rounding=rounding,
                            scale_layout=scale_layout, backend=backend)
    if backend == "auto" and type(axis) is int and type(block_size) is int and block_size == BLOCK_SIZE \
            and isinstance(x, torch.Tensor) and x.is_cuda:
        k = _KERNELS or _cuda_kernels()
        if k is not None:  # the eager fast path: what _resolve_backend would pick, without its checks
            try:
                return k.quantize_eager(x, fmt, axis, block_size, scale_mode, rounding, scale_layout)
            except RuntimeError:
                if not _functorch_wrapped(x):
                    raise
                backend = "reference"  # (a torch.func wrapper, vmap's or jvp's: no storage for the kernels)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    kwargs = dict(block_size=block_size, scale_mode=scale_mode, rounding=rounding)
    if isinstance(axis, bool):
        raise TypeError(f"axis must be an int or a pair of ints, got {axis!r}")
    axis = as_int(axis)  # (a NumPy integer, as MXTensor takes)
    if not isinstance(axis, int):
        pair = tuple(as_int(a) for a in axis) if isinstance(axis, (tuple, list, torch.Size)) else ()
        if len(pair) != 2 or not all(isinstance(a, int) and not isinstance(a, bool) for a in pair):
            raise TypeError(f"axis must be an int or a pair of ints, got {axis!r}")
        for a in pair:
            if not -x.dim() <= a < x.dim():
                raise ValueError(f"axis {a} is out of range for a {x.dim()}-D tensor (shape {tuple(x.shape)})")
        if pair[0] % x.dim() == pair[1] % x.dim():
            raise ValueError(f"the two axes of a cast-transpose must differ, got {axis!r}")
        axis = pair
    if _resolve_backend(backend, x.device, block_size) == "triton":
        from .kernels import quantize_triton

        return quantize_triton(x, fmt, axis=axis, scale_layout=scale_layout, **kwargs)
    if isinstance(axis, tuple):
        return tuple(_relayout(reference.quantize_reference(x, fmt, axis=a, **kwargs), scale_layout) for a in axis)
    return _relayout(reference.quantize_reference(x, fmt, axis=axis, **kwargs), scale_layout)


def cast_transpose(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    backend: str = "auto",
) -> tuple[MXTensor, MXTensor]:
    """Rowwise and columnwise MX copies of ``x`` in one launch that reads x from DRAM about once on CUDA
    (TransformerEngine's cast-transpose; :func:`mxkit.kernels.quantize.quantize_triton`).

    x: (..., K) is flattened to 2-D (M, K) with M = prod(leading dims); both M and K must be multiples of
    ``block_size``. Returns ``(rowwise, columnwise)``, two MXTensors of logical shape (M, K) (an N-D x comes back
    flattened) with plain scales: rowwise ``axis=1``, qdata uint8 (M, K·b), scale uint8 (M, K / block_size);
    columnwise ``axis=0``, qdata uint8 (K, M·b), scale uint8 (K, M / block_size) (the transposed layout the
    backward / wgrad GEMM reads); b = packed bytes per element: 1/2 for FP4, 3/4 for FP6, 1 for FP8 / INT8.
    scale_mode / rounding / backend: as :func:`quantize`.
    On CUDA's eager path (a 2-D problem seen before) each copy's qdata and scale share one allocation, the scale
    256-byte aligned after the elements (two allocations for the four tensors; the copies apart, so the rowwise one
    can be freed after the forward GEMM): ``torch.save`` or ``pickle`` of one of them alone writes the whole
    allocation, a ``resize_`` of qdata may reach the scale, and a ``torch.library.custom_op`` may not return two
    of them (PyTorch refuses outputs that share a storage); ``clone()`` a tensor to keep it alone.
    Raises TypeError for an x that is not a float32 / bfloat16 / float16 tensor; ValueError for a 0-d or empty x,
    M or K not a multiple of block_size, unknown names (as :func:`quantize`).
    """
    if backend == "auto" and _KERNELS and type(x) is torch.Tensor and x.is_cuda and x.dim() == 2 and not elsewhere(x):
        # the eager hot path: a 2-D problem seen before on this device (its checks passed then) runs as it did (2-D
        # only: quantize's axis=(1, 0) of a 3-D x, keyed alike, is not the cast-transpose of x flattened)
        got = _KERNELS.quantize_hot(x, fmt, (1, 0), block_size, scale_mode, rounding, "plain")
        if got is not None:
            return got
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:  # (first: an empty int tensor is a dtype error, as documented)
        raise TypeError(f"x.dtype={x.dtype} is not supported; expected one of float32, bfloat16, float16")
    nd = x.dim()
    if nd == 0:
        raise ValueError("cast_transpose needs a tensor with at least one dimension")
    if x.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor of shape {tuple(x.shape)}")
    block_size = as_int(block_size)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if nd != 2 and (x.numel() // x.shape[-1]) % block_size:
        raise ValueError(f"cast_transpose: M = prod(leading dims) = {x.numel() // x.shape[-1]} (x of shape "
                         f"{tuple(x.shape)}, flattened to (M, K)) is not a multiple of block_size={block_size}")
    x2 = x if nd == 2 else x.reshape(-1, x.shape[-1])
    if x.is_cuda and elsewhere(x):  # (the kernels launch on the current device)
        with torch.cuda.device(x.device):
            return cast_transpose(x, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding,
                                  backend=backend)
    if backend == "auto" and x.is_cuda and block_size == BLOCK_SIZE:
        k = _KERNELS or _cuda_kernels()
        if k is not None:  # the eager fast path (quantize's, for the pair of axes)
            return k.quantize_eager(x2, fmt, (1, 0), block_size, scale_mode, rounding, "plain")
    return quantize(
        x2, fmt, axis=(1, 0), block_size=block_size, scale_mode=scale_mode, rounding=rounding, backend=backend
    )


def _relayout(q: MXTensor, scale_layout: str) -> MXTensor:
    if scale_layout == "plain":
        return q
    from .layouts import to_layout

    rows = q.scale.shape[:-1].numel()
    swizzled = to_layout(q.scale.reshape(rows, q.scale.shape[-1]), scale_layout)
    return dataclasses.replace(q, scale=swizzled, scale_layout=scale_layout)


def dequantize(q: MXTensor, dtype: Optional[torch.dtype] = torch.float32, *, backend: str = "auto") -> torch.Tensor:
    """MXTensor → dense tensor of ``q.shape`` in ``dtype`` (float32 | bfloat16 | float16 | float64; None means
    float32).

    Value = decode(element) × 2^(scale − 127) (OCP MX v1.0 §5: v_i = X × P_i) in float32, then cast
    (round to nearest even); for ``dtype=float64`` the product is computed in float64 (always exact: an MX value
    past float32's range, e.g. 2^128, stays finite).
    Scale 0xFF or an element NaN code gives NaN; an E5M2 Inf code gives ±Inf. See
    :func:`mxkit.reference.dequantize_reference`.
    Raises TypeError if ``q`` is not an MXTensor or ``dtype`` is not one of the four; ValueError for an unknown
    backend and for ``backend="triton"`` on a tensor not on CUDA (the kernels' backend; :func:`matmul` instead
    runs its CPU parts there); NotImplementedError for ``backend="triton"`` with blocks other than 32 elements;
    ImportError for ``backend="triton"`` where Triton does not import.
    """
    if not isinstance(q, MXTensor):
        raise TypeError(f"expected an MXTensor, got {type(q).__name__}")
    if q.qdata.is_cuda and elsewhere(q.qdata):  # (the kernels launch on the current device)
        with torch.cuda.device(q.qdata.device):
            return dequantize(q, dtype, backend=backend)
    if backend == "auto" and q.qdata.is_cuda and q.block_size == BLOCK_SIZE:
        k = _KERNELS or _cuda_kernels()
        if k is not None:
            return k.dequantize_triton(q, dtype)
    if _resolve_backend(backend, q.device, q.block_size) == "triton":
        from .kernels import dequantize_triton

        return dequantize_triton(q, dtype)
    return reference.dequantize_reference(q, dtype)


GemmOperandA = Union[torch.Tensor, MXTensor, Folded, Fp8Rowwise]


def _gemm_backend(a, b, backend: str) -> str:
    w = b.source if isinstance(b, PackedWeight) else b
    if not isinstance(w, MXTensor):
        raise TypeError(f"b must be an MXTensor (N, K) or a PackedWeight, got {type(b).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "auto":  # (on CUDA the plans: other block sizes than 32 take their exact dense / float32 paths)
        return "triton" if w.device.type == "cuda" else "reference"
    if backend == "triton" and w.device.type == "cuda":
        return _resolve_backend(backend, w.device)
    return backend  # "triton" on CPU runs the same paths from CPU parts (fold reference, CPU _scaled_mm)


def gemm_plan(a: GemmOperandA, b: Union[MXTensor, PackedWeight], *, out_dtype: Optional[torch.dtype] = None,
              backend: str = "auto"):
    """Which path :func:`matmul` takes for ``(a, b)`` and why: a :class:`mxkit.kernels.matmul.GemmPlan`
    (``.path``, ``.reason``, ``.exact``, ``.M``, ``.N``, ``.K``, ``.out_dtype``). Paths are listed in
    :data:`mxkit.kernels.matmul.PATHS`; every one is exact (the MX values multiplied exactly, float32 accumulation,
    one output rounding; the FP8 tensor-core paths: see :func:`matmul`).
    On CUDA with a PackedWeight it reads no device value (no host sync) once the weight's scale statistics have
    been read (a pack with the fold reads them; one without it, e.g. act="float" or an FP8 / INT8 weight, keeps
    them on the device until the first plan); an MXTensor weight's scale range is read once per call (pack it
    with :func:`pack_weight`). Raises what :func:`matmul` raises for its operands
    (TypeError / ValueError: types, dtypes, a K mismatch, devices) and ValueError for an unknown backend."""
    from .kernels.matmul import GemmPlan, plan_gemm

    p = plan_gemm(a, b, out_dtype)
    if _gemm_backend(a, b, backend) == "reference":
        why = "backend='reference'" if backend == "reference" else f"operands on {b.device} (no GPU paths)"
        return GemmPlan("reference", why, p.M, p.N, p.K, p.out_dtype)
    return p


def matmul(
    a: GemmOperandA,
    b: Union[MXTensor, PackedWeight],
    *,
    bias: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """``y = a @ b.T + bias`` with ``b`` an MX weight (N, K) quantized along K (``nn.Linear`` layout).

    a: float tensor (..., K) (float32 | bfloat16 | float16), an MXTensor quantized along its last axis, a
      :class:`mxkit.fold.Folded` (from :func:`quantize_fold`) or an :class:`mxkit.Fp8Rowwise` (W4A8).
    b: MXTensor (N, K) along K, or a :class:`mxkit.PackedWeight` (:func:`pack_weight`: pack once, call many).
    bias: optional (N,), added in float32 before the output rounding.
    out_dtype: float32 | bfloat16 | float16 | float64; default ``a.dtype`` for a float ``a``, bfloat16 otherwise.
    backend: ``"auto"`` | ``"triton"`` (the GPU paths; on CPU operands the same plans run from CPU parts:
      the fold's reference, CPU ``_scaled_mm``, with the reference's bytes) | ``"reference"``.
    Returns (..., N); K = 0 gives the empty sum (zeros, plus the bias). On CUDA the path is chosen by
    :func:`gemm_plan` (FP8 tensor cores for FP4 / FP6 pairs, cuBLAS bf16 for the rest); every path is exact: the
    MX values are multiplied exactly, the error is float32 accumulation plus one output rounding (the tests'
    row-wise bound against the float64 product of the dequantized operands; on the FP8 tensor-core paths each
    128-deep step's products are added in Hopper's FP8 accumulator, which keeps about 14 bits (measured by the
    DeepSeek-V3 technical report, "Increasing Accumulation Precision"), and the steps in float32, so those
    paths give bf16 / fp16 only). Values past float32's range overflow to ±inf or NaN, not always where or as
    the reference does (each path sums in its own order; a8w8-mma scales each block's sum, so there such a value
    times a small enough weight gives the finite product); so where partial products of opposite signs pass
    float32's range (block scales near 2^127) a row whose exact sum is finite comes out ±inf or NaN.
    ``backend="reference"`` (and CPU under ``"auto"``) computes in float32 on the dequantized operands
    (:func:`mxkit.reference.matmul_reference`, at full float32 precision whatever
    ``torch.set_float32_matmul_precision`` says, inside ``torch.compile`` too: there the custom op
    ``mxkit::mx_matmul``, whose kernel is this eager call).
    Gradients (every device and path, :func:`with_input_grad`): a float ``a`` and ``bias`` that require grad
    get ``grad_y @ dequantize(b)`` (full float32 too, inside ``torch.compile`` as well: there the custom op
    ``mxkit::mx_dgrad``) and ``grad_y`` summed; the MX weight is frozen (its bytes take none).
    Raises TypeError for an ``a`` / ``b`` / ``bias`` / ``out_dtype`` of the wrong type or dtype (a float64 or
    integer ``a`` included); ValueError for a K mismatch, a ``b`` not (N, K) along K, an MXTensor ``a`` not
    quantized along its last axis, a bias not of shape (N,), operands on different devices, an unknown backend;
    NotImplementedError for forward-mode AD (``torch.func.jvp``) inside ``torch.compile`` or a torch.export program.
    """
    d = (a.device if a.is_cuda and elsewhere(a) else None) if type(a) is torch.Tensor else other_device(b)
    if d is not None:
        with torch.cuda.device(d):  # (the kernels launch on the current device)
            return matmul(a, b, bias=bias, out_dtype=out_dtype, backend=backend)
    if not torch.compiler.is_compiling():  # (a negative-bit view's memory holds -a, which the kernels read raw)
        if type(a) is torch.Tensor and a.is_neg():
            a = a.resolve_neg()
        if type(bias) is torch.Tensor and bias.is_neg():
            bias = bias.resolve_neg()
    if exporting() and type(b) in (MXTensor, PackedWeight) and plain_traced(a):
        # torch.export: the op on the weight's tensors, which the program then holds (it runs in another process),
        # with its gradients registered on it (with_input_grad's Function would be recorded detached)
        return _mx_matmul_traced(a, b.source if type(b) is PackedWeight else b, bias, out_dtype, backend)
    if needs_grad(a, bias):
        return with_input_grad(a, bias, b, lambda a_, bias_: matmul(a_, b, bias=bias_, out_dtype=out_dtype,
                                                                     backend=backend))
    if type(a) is MXTensor and type(b) in (MXTensor, PackedWeight) and torch.compiler.is_compiling():
        refuse_forward_ad("mxkit.matmul")
        # one opaque op in the graph, a's tensors and metadata its arguments (tracing the plan would read a's scale
        # statistics on the host: a data-dependent guard); a PackedWeight by its id, as for a float a (torch.export:
        # its source's tensors, which the program holds)
        if type(b) is PackedWeight and backend == "auto" and not exporting():
            return torch.ops.mxkit.packed_matmul_mx(*_weight_args(a), bias, id(b), out_dtype)
        w = b.source if type(b) is PackedWeight else b
        return torch.ops.mxkit.mx_matmul_mx(*_weight_args(a), *_weight_args(w), bias, out_dtype, backend)
    if type(b) is MXTensor and torch.compiler.is_compiling() and plain_traced(a):
        refuse_forward_ad("mxkit.matmul")
        # one opaque op in the graph, the weight's tensors and metadata its arguments (tracing the plan would read
        # the weight's scale statistics on the host)
        return _mx_matmul_traced(a, b, bias, out_dtype, backend)
    if type(b) is PackedWeight and torch.compiler.is_compiling() and isinstance(a, torch.Tensor):
        refuse_forward_ad("mxkit.matmul")
        if backend == "auto":
            # one opaque op in the graph (the kernels launch through the driver API, which dynamo does not
            # trace); the weight is found by its id, a constant guarded on b's identity
            return torch.ops.mxkit.packed_matmul(a, bias, id(b), out_dtype)
        # (another backend: the MXTensor's op, as for an MXTensor b; tracing the plan read statistics)
        return _mx_matmul_traced(a, b.source, bias, out_dtype, backend)
    if backend == "auto" and type(b) is PackedWeight and b.source.block_size == BLOCK_SIZE:
        if bias is None or type(bias) is torch.Tensor:
            # the eager hot paths: plan and launch arguments made once per operand shape, kept on b
            if type(a) is torch.Tensor and a.is_cuda:
                return _hot().prepared_call(a, b, out_dtype, bias)(a, bias)
            if type(a) is MXTensor and a.qdata.is_cuda:
                call = _hot().prepared_call_mx(a, b, out_dtype, bias)
                if call is not None:
                    return call(a, bias)
    from .kernels.matmul import check_bias, plan_gemm, reference_gemm, run_gemm

    plan = plan_gemm(a, b, out_dtype)
    check_bias(bias, plan, b.device)
    if type(b) is PackedWeight:  # (a plan a CUDA graph may hold; quantized a reads bf16 envelopes)
        note_planned(b, a.dtype if isinstance(a, torch.Tensor) else torch.bfloat16)
    if _gemm_backend(a, b, backend) == "reference" or _wrapped_operand(a):
        return reference_gemm(a, b, plan.out_dtype, bias)  # (torch.func's wrappers have no storage for the kernels)
    return run_gemm(a, b, plan, bias)


def _wrapped_operand(a) -> bool:
    """Whether matmul's ``a`` (a tensor, or the tensors of an MXTensor / Fp8Rowwise) is a torch.func wrapper: under
    vmap an MXLinear's quantized input is an MXTensor of BatchedTensors."""
    if isinstance(a, torch.Tensor):
        return _functorch_wrapped(a)
    return any(isinstance(t, torch.Tensor) and _functorch_wrapped(t)
               for t in (getattr(a, "qdata", None), getattr(a, "data", None), getattr(a, "scale", None)))


@torch.library.custom_op("mxkit::packed_matmul", mutates_args=())
def _packed_matmul_op(a: torch.Tensor, bias: Optional[torch.Tensor], handle: int,
                      out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """``matmul(a, packed_of(handle), bias=bias, out_dtype=out_dtype)``: what a compiled graph calls for a float
    ``a`` times a PackedWeight (:func:`mxkit.packed.packed_of`)."""
    return matmul(a, packed_of(handle), bias=bias, out_dtype=out_dtype)


@_packed_matmul_op.register_fake
def _(a, bias, handle, out_dtype):
    return a.new_empty((*a.shape[:-1], packed_of(handle).shape[0]), dtype=out_dtype or a.dtype)


def _weight_args(w: MXTensor) -> tuple:
    """An MXTensor as a custom op's arguments: (qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding,
    scale_layout)."""
    return (w.qdata, w.scale, w.fmt.name, w.axis, w.block_size, list(w.shape), w.scale_mode.value, w.rounding.value,
            w.scale_layout)


def _from_args(qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout) -> MXTensor:
    """The MXTensor of :func:`_weight_args`' fields (a custom op's arguments)."""
    return MXTensor(qdata, scale, fmt, axis, block_size, torch.Size(shape), scale_mode, rounding, scale_layout)


@torch.library.custom_op("mxkit::mx_matmul_mx", mutates_args=())
def _mx_matmul_mx_op(a_qdata: torch.Tensor, a_scale: torch.Tensor, a_fmt: str, a_axis: int, a_block_size: int,
                     a_shape: list[int], a_scale_mode: str, a_rounding: str, a_scale_layout: str, qdata: torch.Tensor,
                     scale: torch.Tensor, fmt: str, axis: int, block_size: int, shape: list[int], scale_mode: str,
                     rounding: str, scale_layout: str, bias: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                     backend: str) -> torch.Tensor:
    """``matmul(MXTensor a, MXTensor b, bias=bias, out_dtype=out_dtype, backend=backend)``, each operand given by
    :func:`_weight_args`' fields: what a compiled graph (or a torch.export program) calls for quantized activations
    times an MX weight. Returns (..., N) in ``out_dtype``, bfloat16 by default."""
    a = _from_args(a_qdata, a_scale, a_fmt, a_axis, a_block_size, a_shape, a_scale_mode, a_rounding, a_scale_layout)
    b = _from_args(qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout)
    return matmul(a, b, bias=bias, out_dtype=out_dtype, backend=backend)


@_mx_matmul_mx_op.register_fake
def _(a_qdata, a_scale, a_fmt, a_axis, a_block_size, a_shape, a_scale_mode, a_rounding, a_scale_layout, qdata, scale,
      fmt, axis, block_size, shape, scale_mode, rounding, scale_layout, bias, out_dtype, backend):
    return a_qdata.new_empty((*a_shape[:-1], shape[0]), dtype=out_dtype or torch.bfloat16)


@torch.library.custom_op("mxkit::packed_matmul_mx", mutates_args=())
def _packed_matmul_mx_op(a_qdata: torch.Tensor, a_scale: torch.Tensor, a_fmt: str, a_axis: int, a_block_size: int,
                         a_shape: list[int], a_scale_mode: str, a_rounding: str, a_scale_layout: str,
                         bias: Optional[torch.Tensor], handle: int, out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """``matmul(MXTensor a, packed_of(handle), bias=bias, out_dtype=out_dtype)``: what a compiled graph calls for
    quantized activations times a PackedWeight (found by its id, as ``mxkit::packed_matmul`` finds it)."""
    a = _from_args(a_qdata, a_scale, a_fmt, a_axis, a_block_size, a_shape, a_scale_mode, a_rounding, a_scale_layout)
    return matmul(a, packed_of(handle), bias=bias, out_dtype=out_dtype)


@_packed_matmul_mx_op.register_fake
def _(a_qdata, a_scale, a_fmt, a_axis, a_block_size, a_shape, a_scale_mode, a_rounding, a_scale_layout, bias, handle,
      out_dtype):
    return a_qdata.new_empty((*a_shape[:-1], packed_of(handle).shape[0]), dtype=out_dtype or torch.bfloat16)


def _mx_matmul_traced(a: torch.Tensor, w: MXTensor, bias, out_dtype, backend: str) -> torch.Tensor:
    """``mxkit::mx_matmul`` of a and MXTensor w: a traced graph's one op, the weight's tensors its arguments."""
    q, sc, *meta = _weight_args(w)
    return torch.ops.mxkit.mx_matmul(a, q, sc, bias, *meta, out_dtype, backend)


@torch.library.custom_op("mxkit::mx_matmul", mutates_args=())
def _mx_matmul_op(a: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor], fmt: str,
                  axis: int, block_size: int, shape: list[int], scale_mode: str, rounding: str, scale_layout: str,
                  out_dtype: Optional[torch.dtype], backend: str) -> torch.Tensor:
    """``matmul(a, MXTensor(qdata, scale, ...), bias=bias, out_dtype=out_dtype, backend=backend)``: what a compiled
    graph calls for a float ``a`` times an MXTensor weight (gradients: :func:`with_input_grad` around it)."""
    refuse_forward_ad("mxkit::mx_matmul")
    b = _from_args(qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout)
    return matmul(a, b, bias=bias, out_dtype=out_dtype, backend=backend)


@_mx_matmul_op.register_fake
def _(a, qdata, scale, bias, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout, out_dtype, backend):
    return a.new_empty((*a.shape[:-1], shape[0]), dtype=out_dtype or a.dtype)


def _mx_matmul_setup(ctx, inputs, output) -> None:
    a, qdata, scale, bias, *meta = inputs
    ctx.save_for_backward(qdata, scale)
    ctx.meta, ctx.a_dtype = meta[:7], a.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _mx_matmul_backward(ctx, g):
    """with_input_grad's rule: a gets ``g @ dequantize(w)`` (mxkit::mx_dgrad), the bias ``g`` summed."""
    qdata, scale = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = torch.ops.mxkit.mx_dgrad(g, qdata, scale, *ctx.meta, ctx.a_dtype)
    if ctx.needs_input_grad[3]:
        gb = g.reshape(-1, g.shape[-1]).float().sum(0).to(ctx.bias_dtype)
    return (ga, None, None, gb) + (None,) * 9


_mx_matmul_op.register_autograd(_mx_matmul_backward, setup_context=_mx_matmul_setup)


def needs_grad(*tensors) -> bool:
    """Whether autograd would record an op on any of ``tensors`` (None and non-tensors such as an MXTensor
    skipped): then a fast path whose kernels autograd does not see gives way to the gradient path
    (:func:`with_input_grad`, MXMoE's per-expert backward, the reference routing) or, under torch.compile, a custom
    op to a graph break. Also True inside forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``'s
    dual level), whose tangents reach only the gradient paths (the fast paths dropped them: a zero tangent)."""
    if _fwad._current_level >= 0 and has_tangent(*tensors):
        return True
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # (a loop, not any(): this runs on every eager MXLinear call)
        if getattr(t, "requires_grad", False):
            return True
    return False


def refuse_forward_ad(what: str) -> None:
    """NotImplementedError inside a dual level (forward-mode AD: ``torch.func.jvp`` / ``jacfwd``,
    ``torch.autograd.forward_ad``); asked where a traced graph takes one of mxkit's custom ops, which have no
    forward-mode rule (dynamo gave wrong tangents without a word), and by the ops a torch.export program runs
    (``torch.func.jvp`` of the program gave a zero tangent)."""
    if _fwad._current_level >= 0:
        raise NotImplementedError(f"{what}: forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) "
                                  f"inside torch.compile or through a torch.export program is not supported "
                                  f"(mxkit's custom ops have no forward rule); differentiate the eager modules in "
                                  f"forward mode")


_IN_RULE = threading.local()  # .on: inside _InputGradForward's forward, whose rule gives the tangent


def _functorch_wrapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is a torch.func wrapper (vmap's BatchedTensor, jvp's / grad's TensorWrapper): no storage."""
    check = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return check is not None and check(t)


def has_tangent(*tensors) -> bool:
    """Whether any of ``tensors`` carries a forward-mode tangent (at the current dual level; None and non-tensors
    skipped; a tensor that cannot say, such as vmap's BatchedTensor, counts as one). Asked only inside a dual level
    (``torch.autograd.forward_ad._current_level >= 0``); False inside :class:`_InputGradForward`'s forward, where
    its jvp rule gives the tangent."""
    if getattr(_IN_RULE, "on", False):
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor):
            try:
                if _fwad.unpack_dual(t).tangent is not None:
                    return True
            except RuntimeError:
                return True
    return False


class _InputGrad(torch.autograd.Function):
    """See :func:`with_input_grad`. (forward and setup_context apart, and a generated vmap rule: torch.func's
    transforms, vmap and grad, take it.)"""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, bias, held, fn):  # (autograd records nothing in here: fn's kernels need not be traceable)
        return fn(x, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, bias, held, _ = inputs
        ctx.w, ctx.x_meta = held.w, (x.dtype, x.shape) if isinstance(x, torch.Tensor) else None
        # (a record: under torch.func only inputs and outputs are saved; none while dynamo traces, whose versions
        # are symbols)
        ctx.w_versions = None if torch.compiler.is_compiling() else _weight_versions(held.w)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.out_dtype, ctx.out_shape = output.dtype, output.shape

    @staticmethod
    def backward(ctx, g):
        gx = gb = None
        if ctx.needs_input_grad[0]:
            if (ctx.w_versions is not None and not torch.compiler.is_compiling()
                    and _weight_versions(ctx.w) != ctx.w_versions):
                raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                                   "inplace operation: the MX weight's bytes were written between the forward and "
                                   "this backward (as for nn.Linear's weight: backward before loading new weights)")
            dtype, shape = ctx.x_meta
            gx = linear_input_grad(g, ctx.w, dtype).reshape(shape)
        if ctx.needs_input_grad[1]:
            gb = g.reshape(-1, g.shape[-1]).float().sum(0).to(ctx.bias_dtype)
        return gx, gb, None, None


class _InputGradForward(_InputGrad):
    """:class:`_InputGrad` with a forward-mode rule, used inside a dual level only (dynamo does not trace a
    Function that defines ``jvp``)."""

    @staticmethod
    def forward(x, bias, held, fn):
        outer = getattr(_IN_RULE, "on", False)
        _IN_RULE.on = True  # (fn's calls take their fast paths: this Function's rule gives the tangent)
        try:
            return fn(x, bias)
        finally:
            _IN_RULE.on = outer

    @staticmethod
    def jvp(ctx, x_t, bias_t, held_t, fn_t):
        """Forward mode (``torch.func.jvp``): y's tangent ``x_t @ dequantize(w).T + bias_t`` in float32, cast to
        y's dtype (quantization of x inside ``fn`` passed straight through, as in backward)."""
        w = ctx.w.source if isinstance(ctx.w, PackedWeight) else ctx.w
        yt = None
        if x_t is not None:
            # (the reference's aten ops: torch.func may hand the rule wrappers, which have no storage for a kernel)
            w32 = reference.dequantize_reference(w, torch.float32)
            yt = exact_matmul(x_t.reshape(-1, x_t.shape[-1]).float(), w32.t())
            yt = yt.reshape(*x_t.shape[:-1], w.shape[0])
        if bias_t is not None:
            yt = bias_t.float().expand(ctx.out_shape) if yt is None else yt + bias_t.float()
        return None if yt is None else yt.to(ctx.out_dtype)


@autocast_off
def linear_input_grad(g: torch.Tensor, w: Union[MXTensor, PackedWeight], dtype: torch.dtype) -> torch.Tensor:
    """x's gradient of y = x @ dequantize(w).T: ``g (..., N) @ dequantize(w) (N, K)`` in float32, cast to ``dtype``
    ((..., K); :func:`with_input_grad`'s rule, and ``mxkit::mx_linear``'s)."""
    w = w.source if isinstance(w, PackedWeight) else w
    if torch.compiler.is_compiling():  # (one op: a traced product would follow the float32 matmul precision)
        q, sc, *meta = _weight_args(w)
        return torch.ops.mxkit.mx_dgrad(g, q, sc, *meta, dtype)
    g2 = g.reshape(-1, g.shape[-1]).float()
    # (full float32 whatever torch.set_float32_matmul_precision says, as the forward's float32 routes)
    return exact_matmul(g2, dequantize(w, torch.float32)).to(dtype).reshape(*g.shape[:-1], w.shape[1])


@torch.library.custom_op("mxkit::mx_dgrad", mutates_args=())
def _mx_dgrad_op(g: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, fmt: str, axis: int, block_size: int,
                 shape: list[int], scale_mode: str, rounding: str, scale_layout: str,
                 dtype: torch.dtype) -> torch.Tensor:
    """:func:`linear_input_grad` of ``g`` and ``MXTensor(qdata, scale, ...)``: what a compiled graph calls for the
    input gradient of :func:`mxkit.matmul` (eagerly, at full float32 precision)."""
    w = _from_args(qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout)
    return linear_input_grad(g, w, dtype)


@_mx_dgrad_op.register_fake
def _(g, qdata, scale, fmt, axis, block_size, shape, scale_mode, rounding, scale_layout, dtype):
    return g.new_empty((*g.shape[:-1], shape[1]), dtype=dtype)


def _weight_versions(w) -> tuple:
    """The version counters of an MX weight's element and scale bytes (None where a tensor keeps none)."""
    src = w.source if isinstance(w, PackedWeight) else w
    try:
        return tuple(tensor_version(t) for t in (src.qdata, src.scale))
    except (RuntimeError, AttributeError):  # (functorch wrappers)
        return (None, None)


class _Held:
    """The weight of :class:`_InputGrad`, out of pytree's sight (torch.func's vmap maps over the operands'
    pytrees, and an MXTensor's leaves are no operands to batch)."""

    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w


def with_input_grad(x, bias: Optional[torch.Tensor], w: Union[MXTensor, PackedWeight], fn) -> torch.Tensor:
    """``fn(x, bias)`` — a linear layer's forward y = f(x) @ dequantize(w).T + bias, by any path — with the
    gradients autograd needs: x (a float tensor; an MXTensor takes none) gets ``grad_y @ dequantize(w)``,
    computed in float32 and cast to x's dtype (any quantization of x inside ``fn``, such as ``MXLinear``'s
    ``act_format``, passed straight through: the straight-through estimator of quantization-aware training);
    ``bias`` gets ``grad_y`` summed over the leading dims, in its dtype. The MX weight ``w`` (N, K) is frozen.
    ``fn`` runs outside autograd, so its kernels need not be differentiable; its result is the one the same
    call gives without gradients, bit for bit."""
    fn_class = _InputGradForward if _fwad._current_level >= 0 else _InputGrad
    return fn_class.apply(x, bias, _Held(w), fn)


_KERNELS = None  # mxkit.kernels.quantize where Triton imports, False where it does not (None: not asked yet)


def _cuda_kernels():
    """mxkit.kernels.quantize (quantize_triton, dequantize_triton) when Triton is importable, else None;
    imported once (backend "auto" on CUDA tensors: the eager fast path)."""
    global _KERNELS
    if _KERNELS is None:
        from .kernels import triton_available

        if triton_available():
            from .kernels import quantize as kernels_quantize

            _KERNELS = kernels_quantize
        else:
            _KERNELS = False
    return _KERNELS or None


_HOT = None


def _hot():
    """mxkit.kernels.matmul_calls, imported once (an import statement in the hot path costs ~1 µs a call)."""
    global _HOT
    if _HOT is None:
        from .kernels import matmul_calls

        _HOT = matmul_calls
    return _HOT


@on_operand_device()
def pack_weight(w: MXTensor, *, act: Optional[str] = None, dense: Optional[torch.dtype] = None) -> PackedWeight:
    """One-time re-layout of an MX weight (N, K) along K for :func:`matmul` (``data tiling``): FP4 / FP6
    weights are folded to FP8 E4M3 with power-of-two row scales (exact), MXFP4 / MXFP8 (E4M3, E5M2) weights of
    the small-M kernels' shapes get their layouts, every weight gets its scale envelope. ``act`` limits the layouts
    to those the weight's activations read (memory): None every one; ``"float"`` (bf16 / fp16 / fp32
    activations: no fold); ``"fp8_rowwise"`` or ``"mx"`` (the fold; for MXFP8 E4M3 weights and ``"mx"`` the
    MXFP8 x MXFP8 layout). MXFP6 weights for float activations also keep an exact MXFP8 twin (the MXFP8 kernels
    read it). ``dense`` (None, torch.bfloat16, torch.float16): also keep the weight dequantized to that dtype, a
    cache that activations of that dtype read on cuBLAS past the small-M kernels (2 bytes per element more;
    path ``dense-cached``). A path whose layout was not built still runs, packing per call. Returns a
    :class:`mxkit.PackedWeight` (``.to(device)``, ``state_dict()``). Given a PackedWeight, returns it as it is
    (``act`` does not add layouts; ValueError where it lacks the ``dense`` cache asked for): to pack again after an
    in-place edit of the weight's bytes, pass its ``.source``. The fold and the small-M layouts are mxkit's own
    conventions (no peer). Raises TypeError / ValueError on a weight that is not
    an MXTensor (N, K) along K, an unknown ``act`` or ``dense``; NotImplementedError for a weight on the meta
    device (the pack reads its scale bytes). See :func:`mxkit.kernels.matmul.pack_weight`."""
    from .kernels.matmul import pack_weight as impl

    return impl(w, act=act, dense=dense)


@on_operand_device()
def quantize_fold(
    x: torch.Tensor,
    fmt: FormatLike,
    *,
    block_size: int = BLOCK_SIZE,
    scale_mode: Union[str, ScaleMode] = ScaleMode.FLOOR,
    rounding: Union[str, Rounding] = Rounding.RNE,
    backend: str = "auto",
    defer: bool = False,
) -> Folded:
    """Quantize activations x (..., K) to MX ``fmt`` (FP4 / FP6) along K and fold them to FP8 E4M3 with one
    power-of-two scale per row, in one pass over x on CUDA: the ``a`` operand of the fold-fp8 GEMM path.
    Byte-identical to ``mxkit.fold.fold_reference(quantize(x, fmt, ...))``.
    Returns :class:`mxkit.fold.Folded`: data float8_e4m3fn [R + X, K], scale float32 [R + X], owner int64 [X],
    R = prod(x.shape[:-1]) (X: the extra slices). backend: ``"auto"``, ``"reference"``
    (:func:`mxkit.fold.quantize_fold_reference`) or ``"triton"`` (CUDA). The fold is mxkit's own convention (no
    peer; :class:`mxkit.fold.Folded`).

    defer (CUDA): return a :class:`mxkit.kernels.fold.PendingFold` without the host sync that completes rows
    whose block scales span more than the fold window; :func:`matmul` completes it after enqueuing the GEMM
    (``MXLinear``'s path). An x with no rows gives a Folded of 0 rows (activations: an empty batch). Raises
    TypeError for an x that is not a float32 / bfloat16 / float16 tensor or a ``defer`` that is not a bool;
    ValueError for a format that does not fold (FP8, INT8), a block_size other than 32, and the other bad
    inputs :func:`quantize` rejects;
    NotImplementedError on the meta device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    block_size = as_int(block_size)  # (a NumPy integer, as quantize takes)
    check_bools(dict(defer=defer))
    if x.device.type == "meta":
        raise NotImplementedError("quantize_fold: the folded row count depends on the values (rows whose block "
                                  "scales span more than the fold window): not on the meta device")
    if _resolve_backend(backend, x.device) == "triton":
        from .kernels.fold import quantize_fold_triton

        return quantize_fold_triton(x if x.is_contiguous() else x.contiguous(), fmt, block_size=block_size,
                                    scale_mode=scale_mode, rounding=rounding, defer=defer)
    return quantize_fold_reference(x, fmt, block_size=block_size, scale_mode=scale_mode, rounding=rounding)


@on_operand_device()
def quantize_fp8_rowwise(x: torch.Tensor, *, backend: str = "auto") -> Fp8Rowwise:
    """FP8 E4M3 activations with one float32 scale per row (TensorRT-LLM's per-token FP8, the W4A8 ``a``):
    scale = max(amax(|row|) / 448, 2^-149) (1 for an all-zero row), data = E4M3(x / scale) rounded to nearest
    even; the rule of :func:`mxkit.reference.quantize_fp8_rowwise_reference`, which CUDA tensors meet byte for
    byte in one pass over x (:func:`mxkit.kernels.quantize.quantize_fp8_rowwise_triton`).

    x: (..., K) float32 | bfloat16 | float16. Returns :class:`mxkit.Fp8Rowwise` (data (..., K), scale (..., 1)).
    A row holding NaN gets a NaN scale and NaN codes (0x7F); one holding ±Inf (no NaN) an Inf scale, the Inf
    elements NaN codes and the others ±0, so it dequantizes to NaN, as an MX block holding Inf. Not
    differentiable on any device (as an MXTensor's bytes): :func:`matmul` gives a float ``a`` its gradient; a
    layer that quantizes its input (:class:`mxkit.nn.MXLinear` with ``act_format="fp8_e4m3_rowwise"``) passes it
    straight through. Raises TypeError on other dtypes, ValueError on a 0-dim x, an unknown backend, or
    ``backend="triton"`` on a tensor not on CUDA.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be a float32 / bfloat16 / float16 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., K)")
    # (while torch.compile traces, and for torch.func's wrappers (no storage): the reference, the same bytes)
    if (_resolve_backend(backend, x.device) == "triton" and not torch.compiler.is_compiling()
            and not _functorch_wrapped(x)):
        from .kernels.quantize import quantize_fp8_rowwise_triton

        return Fp8Rowwise(*quantize_fp8_rowwise_triton(x))
    data, scale = reference.quantize_fp8_rowwise_reference(x)
    return Fp8Rowwise(data.detach(), scale.detach())  # (no gradient on any path, as the kernel's and MXTensor's)
