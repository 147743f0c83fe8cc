"""The eager hot path of ``mxkit.matmul`` and ``MXLinear`` on a :class:`~mxkit.packed.PackedWeight`: each call's
plan and launches made once per (operand shape, strides, dtype, device, out dtype, bias, dispatch table) and kept
on the weight (:func:`prepared_call` for float activations, :func:`prepared_call_mx` for MX ones,
:func:`prepared_call_a8w8` for bf16 x quantized inside the a8w8-mma launch, :func:`prepared_call_quantize_fold`
for MXLinear's folding activations).

The decode paths are one C++ fast call each (:mod:`.matmul_details._mma_calls`). The prefill paths of two or
three launches (``dense-exact``, ``fold-fp8``, ``bf16-exact``: :class:`DenseExactCall`, :class:`FoldCall`,
:class:`QuantizeFoldCall`, :class:`Bf16ExactCall`) run :func:`~mxkit.kernels.matmul.run_gemm` on their first
calls, then bind its launches (the fold / dequantize kernels as fast calls, the fix-up's parameter block) and
make the same launches and bytes without its per-call dispatch.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..fold import Folded
from ..formats import ElementFormat
from ..packed import PackedWeight, note_planned
from ..tensor import MXTensor, check_out_dtype
from . import launch
from .cuda_driver import fast_call_loaded
from .matmul import GemmPlan, _a8w8_ok, _a8w8_quant_max_m, _twin, check_bias, plan_gemm, run_gemm
from .._precision import exact_cublas
from .matmul_details._mma_calls import (UNSEEN, A8W8Call, A8W8InCall, DecodeCall, MmaCall, W16Call, calls_on,
                                        kernel_bias, plain)
from .matmul_table import _TOKEN, _table_token

__all__ = ["prepared_call", "prepared_call_mx", "prepared_call_a8w8", "prepared_call_quantize_fold"]

_WGMMA_FORMATS = ("mxfp4_e2m1", "mxfp8_e4m3", "mxfp8_e5m2")  # the weights WgmmaCall reads (wgmma's packed_of)


def prepared_call_a8w8(x: torch.Tensor, b: PackedWeight, out_dtype: torch.dtype, bias: Optional[torch.Tensor]):
    """The eager host path of :func:`~mxkit.kernels.matmul.a8w8_linear` for bf16 ``x`` on CUDA and a PackedWeight
    in the a8w8 layout at M <= ``a8w8_mma.quant_max_m`` (one launch): made on the first call of each (shape,
    strides, device, out dtype, bias shape / dtype, dispatch table) and kept on ``b``; None where a8w8_linear would
    not take that one-launch form (the caller then calls it). Returns a callable ``(x, bias) -> y``."""
    key = ("a8w8-bf16", x.shape, x.stride(), x.dtype, x.get_device(), out_dtype,
           _TOKEN.get(),
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    calls = b.__dict__.get("_calls")
    call = calls.get(key, UNSEEN) if calls is not None else UNSEEN
    if call is not UNSEEN:
        return call
    calls = calls_on(b, "_calls")
    call = None
    w = b.source
    M = x.shape[:-1].numel()
    if (x.dtype == torch.bfloat16 and x.dim() >= 1 and b.mma_q is not None and w.ndim == 2 and w.axis == 1
            and x.shape[-1] == w.shape[1] and w.device == x.device and 0 < M <= _a8w8_quant_max_m(x.device)
            and _a8w8_ok(w.fmt, b, M, x.device)):
        out = check_out_dtype(out_dtype)
        check_bias(bias, GemmPlan("a8w8-mma", "", M, w.shape[0], w.shape[1], out), w.device)
        call = A8W8InCall(b, M, tuple(x.shape), x.stride(), out)
        if call.run.split_fallback:  # (a capture's unsplit stand-in: not kept, the next call makes the split one)
            return call
        call.kept = True
    calls[key] = call
    return call


def _mm_t_twin(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a @ w.T through PyTorch's Python API: the C++ fast call's ``mm_t`` where the module lacks it."""
    return a @ w.t()


def mm_t_fn():
    """a @ w.T (a [M, K], w [N, K], one dtype and device; no autograd) for the prepared cuBLAS calls: the C++ fast
    call's ``mm_t`` where the module is loaded (the backend's mm kernel called directly: torch.mm's kernel and
    bytes without its Python dispatch, 2-3 µs of host time a call on the H200's host), else :func:`_mm_t_twin`."""
    from .cuda_driver import _fast_call

    return getattr(_fast_call(), "mm_t", None) or _mm_t_twin


class DenseExactCall:
    """The dense-exact path of one (packed weight, shape of a), a's dtype out, no bias, on CUDA: the weight
    dequantized to a's dtype by the dequantize kernel's C++ fast call (its problem fixed: made by the first call),
    then cuBLAS with float32 accumulation (:func:`exact_cublas`) through the fast call's ``mm_t``
    (:func:`mm_t_fn`): :func:`run_gemm`'s launches and bytes, without its per-call dispatch. A call with a bias,
    or before the fast call exists (looked for at up to three calls), runs :func:`run_gemm`."""

    def __init__(self, b: PackedWeight, plan: GemmPlan, lead: tuple):
        self.b, self.plan, self.out_shape = b, plan, (*lead, plan.N)
        self.w = plain(b.source)
        self.mm = _mm_t_twin
        self.deq = None  # set last (threads: a call that sees it sees mm too)
        self.tries = 0

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        deq = self.deq
        if deq is None or bias is not None or not launch._enabled:
            y = run_gemm(a, self.b, self.plan, bias)
            if deq is None and self.tries < 3:  # (the fast call exists from the problem's second dequantize)
                from .quantize import dequantize_fast

                self.tries += 1
                self.mm = mm_t_fn()
                self.deq = dequantize_fast(self.w, a.dtype)
            return y
        wb = deq(self.w.qdata, self.w.scale)
        with exact_cublas():
            y = self.mm(a.reshape(self.plan.M, self.plan.K), wb)
        return y.view(self.out_shape)


class MxBoundCall:
    """A prepared call of an MX a times a PackedWeight (bf16 out, no bias, on CUDA) whose launches are bound after
    :func:`run_gemm` ran them (:meth:`_bind`, tried at up to three calls: the C++ fast calls appear from a
    problem's second call, or once the module is built), then made by :meth:`_fast` with :func:`run_gemm`'s bytes.
    A call with a bias, a's codes or scales not 16-byte aligned (the bound launches' specialisation), or direct
    launches off, runs :func:`run_gemm`."""

    def __init__(self, b: PackedWeight, plan: Optional[GemmPlan], lead: tuple):
        self.b, self.plan, self.out_shape = b, plan, (*lead, b.shape[0])
        self.w = plain(b.source)
        self.fix = None  # the fix-up's bound launch, set last by _bind
        self.tries = 0

    def __call__(self, a: MXTensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        q, s = a.qdata, a.scale
        aligned = not (q.data_ptr() % 16 or s.data_ptr() % 16)
        if self.fix is not None and bias is None and aligned and launch._enabled:
            return self._fast(q, s)
        y = run_gemm(a, self.b, self.plan, bias)
        if (self.fix is None and self.tries < 3 and bias is None and aligned and q.is_cuda
                and q.get_device() == torch.cuda.current_device()):  # (launches bind to the current device)
            self.tries += 1
            self._bind(plain(a))
        return y

    def _bind_fixup(self, a: MXTensor, fold: Optional[tuple], cols: Optional[torch.Tensor]) -> None:
        """The fix-up's bound launch (``self.fix``, and the weight's operands it reads) for problems of a's."""
        from .matmul_details._row_fixup import _launcher, fixup_launch

        M, N, K = self.plan.M, self.plan.N, self.plan.K
        y = torch.empty(M, N, dtype=torch.bfloat16, device=self.b.device)
        grid, tensors, ints, consts, nw = fixup_launch(y, a, self.w, None, M, N, K, fold=fold, cols=cols)
        fix = _launcher().launcher.bind(grid, tensors + ints, consts, nw)
        if fix is not None:
            self.wq, self.ws = tensors[5], tensors[6]
            self.fix = fix


def fold_operands(b: PackedWeight) -> tuple:
    """The weight's operands of the prepared fold-fp8 calls, made once per PackedWeight (every shape of a shares
    them): its folded E4M3 rows transposed (K, N), their row scales (1, N) and the fix-up's column flags (None
    without special rows; made on this stream and waited for once, so that calls on any stream may read them)."""
    ops = b.__dict__.get("_fold_operands")
    if ops is None:
        from .matmul_details._row_fixup import column_flags

        N = b.shape[0]
        cols = column_flags(b.special_rows, N, b.device)
        if cols is not None:
            torch.cuda.current_stream(b.device).synchronize()
        ops = (b.folded.data[:N].t(), b.folded.scale[:N].reshape(1, N).contiguous(), cols)
        object.__setattr__(b, "_fold_operands", ops)
    return ops


class FoldCall(MxBoundCall):
    """The fold-fp8 path (:class:`MxBoundCall`): a's fold (one C++ fast call: its three outputs allocated and the
    kernel launched; deferred, no host sync), cuBLAS's FP8 GEMM with rowwise scales, the fix-up, with the weight's
    folded operands and the fix-up's column flags made once."""

    def __init__(self, b: PackedWeight, plan: Optional[GemmPlan], lead: tuple):
        super().__init__(b, plan, lead)
        self.bt, self.sb, self.cols = fold_operands(b)

    def _fast(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self._gemm_fixup(*self.fold(q, s), q, s)

    def _gemm_fixup(self, data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor, aq: torch.Tensor,
                    a_s: Optional[torch.Tensor]) -> torch.Tensor:
        """cuBLAS's FP8 GEMM of a's fold (data, row scale, status) and the fix-up reading a at aq (its codes, or
        the rows a quantize-fold read) and a_s (its scales; None: unread)."""
        y = torch._scaled_mm(data, self.bt, scale, self.sb, out_dtype=torch.bfloat16)
        self.fix.run(y, aq, y if a_s is None else a_s, status, scale, self.wq, self.ws,
                     self.cols if self.cols is not None else y, y)
        return y.view(self.out_shape)

    def _bind(self, a: MXTensor) -> None:
        from .fold import _outputs, bind_fold

        if not fast_call_loaded():
            return
        M, K = self.plan.M, self.plan.K
        data, scale, status = _outputs(M, K, a.device)
        bl = bind_fold(a, data, scale, status)
        self.fold = None if bl is None else bl.with_outputs(
            (0, 1, -1, -2, -3, -3), [((M, K), torch.float8_e4m3fn, False), ((M, 1), torch.float32, False),
                                     ((M,), torch.uint8, False)], 2)
        if self.fold is not None:
            self._bind_fixup(a, (status, scale), self.cols)


class QuantizeFoldCall(FoldCall):
    """MXLinear's eager forward where activations fold (act_format and weight both MXFP4 / MXFP6), for one
    (packed weight, bf16 x's shape, activation scale mode and rounding), no bias, on CUDA: x's quantize-fold (one
    C++ fast call: its three outputs allocated and the kernel launched), cuBLAS's FP8 GEMM with rowwise scales,
    the fix-up (rows whose fold is not exact, recomputed from x): the bytes of ``quantize_fold_triton(x,
    defer=True)`` then :func:`run_gemm`, which the first calls (and a call on an x not 16-byte aligned, or with
    direct launches off) run; the launches are bound after them."""

    def __init__(self, b: PackedWeight, lead: tuple, fmt: ElementFormat, mode, rounding):
        super().__init__(b, None, lead)
        self.fmt, self.mode, self.rounding = fmt, mode, rounding

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from .fold import quantize_fold_triton

        aligned = x.data_ptr() % 16 == 0
        if self.fix is not None and aligned and launch._enabled:
            return self._gemm_fixup(*self.fold(x), x, None)
        pend = quantize_fold_triton(x, self.fmt, scale_mode=self.mode, rounding=self.rounding, defer=True)
        plan = self.plan or plan_gemm(pend, self.b, x.dtype)
        y = run_gemm(pend, self.b, plan, None)
        if (self.fix is None and self.tries < 3 and aligned and plan.path == "fold-fp8" and plan.M
                and plan.out_dtype == torch.bfloat16 and plan.N % 16 == 0
                and x.get_device() == torch.cuda.current_device()):  # (launches bind to the current device)
            self.tries += 1
            self.plan = plan
            self._bind(x)
        return y

    def _bind(self, x: torch.Tensor) -> None:
        from .fold import QuantizedRows, _outputs, bind_quantize_fold

        if not fast_call_loaded():
            return
        M, K = self.plan.M, self.plan.K
        x2 = x.view(M, K)
        data, scale, status = _outputs(M, K, x.device)
        bl = bind_quantize_fold(x2, self.fmt, self.mode, self.rounding, data, scale, status)
        self.fold = None if bl is None else bl.with_outputs(
            (0, -1, -2, -3), [((M, K), torch.float8_e4m3fn, False), ((M, 1), torch.float32, False),
                              ((M,), torch.uint8, False)], 1)
        if self.fold is not None:
            self._bind_fixup(QuantizedRows(x2, self.fmt, self.mode, self.rounding), (status, scale), self.cols)


def prepared_call_quantize_fold(x: torch.Tensor, b: PackedWeight, fmt: ElementFormat, scale_mode, rounding):
    """MXLinear's eager hot path where its activations fold: the :class:`QuantizeFoldCall` of (b, x's shape,
    strides and device, fmt, scale mode, rounding), made once and kept on b; None where it does not apply (x
    not bf16 or not contiguous, a weight without its fold, no rows)."""
    key = ("qfold", x.shape, x.stride(), x.dtype, x.get_device(), fmt, scale_mode, rounding,
           _TOKEN.get())
    calls = b.__dict__.get("_calls")
    call = calls.get(key, UNSEEN) if calls is not None else UNSEEN
    if call is UNSEEN:
        if torch.cuda.is_current_stream_capturing():
            return None  # (its operands are made once, outside a capture: a later call makes it)
        calls = calls_on(b, "_calls")
        call = None
        if (x.dtype == torch.bfloat16 and x.is_contiguous() and x.dim() >= 1 and x.shape[:-1].numel()
                and isinstance(b.folded, Folded) and x.shape[-1] == b.shape[1]):
            call = QuantizeFoldCall(b, tuple(x.shape[:-1]), fmt, scale_mode, rounding)
        calls[key] = call
    return call


class Bf16ExactCall(MxBoundCall):
    """The bf16-exact path (:class:`MxBoundCall`): a and the weight dequantized to bf16 by the dequantize
    kernel's C++ fast calls, cuBLAS with float32 accumulation (:func:`exact_cublas`) through the fast call's
    ``mm_t`` (:func:`mm_t_fn`), the fix-up (a's rows with a scale byte outside the bf16-exact range)."""

    def _fast(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        w = self.w
        xa = self.deq_a(q, s)
        with exact_cublas():
            y = self.mm(xa.view(self.plan.M, self.plan.K), self.deq_w(w.qdata, w.scale))
        self.fix.run(y, q, s, y, y, self.wq, self.ws, y, y)
        return y.view(self.out_shape)

    def _bind(self, a: MXTensor) -> None:
        from .quantize import dequantize_fast

        self.mm = mm_t_fn()
        self.deq_a, self.deq_w = dequantize_fast(a, torch.bfloat16), dequantize_fast(self.w, torch.bfloat16)
        if self.deq_a is not None and self.deq_w is not None:
            self._bind_fixup(a, None, None)


class WgmmaCall:
    """The w4a16-wgmma / w8a16-wgmma path (prefill) of one (packed weight, shape and strides of a float a, out
    dtype, bias or not), on CUDA: the weight in the kernel's layout, the tile size and split-K fixed once
    (:func:`~mxkit.kernels.matmul_details._w4a16_wgmma.dense_schedule`); each call is one ``w4a16_wgmma`` on a's
    rows (a float32 or bf16 bias as it is, another converted to float32), whose launch is prepared per problem
    (from the problem's third call one C++ fast call, plus the split's fixed-order sum), which this call runs
    directly once made: :func:`run_gemm`'s launches and bytes without its per-call dispatch. A call on rows (or a
    bias) not 16-byte aligned (TMA, and the launch's specialisation) runs :func:`run_gemm`."""

    def __init__(self, b: PackedWeight, plan: GemmPlan, lead: tuple):
        from .matmul_details import _w4a16_wgmma as wg

        self.b, self.plan, self.out_shape = b, plan, (*lead, plan.N)
        self.q, self.st, self.one_mul = wg.packed_of(b)
        self.bm, self.split = wg.dense_schedule(plan.M, plan.N, plan.K, b.device)
        self.elem = wg.FP8_ELEMS.get(b.source.fmt.name, "e2m1")
        self.wg = wg
        self.tries = 0
        # the problem's prepared launch, looked for after the first calls, and what it was made for (x's strides, the
        # A/B settings, the current device); prep is set last (threads: see _find)
        self.prep = self.xs = self.settings = self.dev = None

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        p, wg = self.plan, self.wg
        flat = a.dim() == 2
        x = a if flat else a.reshape(p.M, p.K)
        b32 = kernel_bias(bias)  # (float32 or bf16 as it is; the key of this call fixes its dtype and shape)
        ptrs = x.data_ptr() | (b32.data_ptr() if b32 is not None else 0)
        prep = self.prep
        # (the problem as prepared: x's strides, 16-byte aligned rows and bias, the settings, the device: one C++ call)
        if (prep is not None and launch._enabled and x.stride() == self.xs and not ptrs & 15
                and self.settings == self._settings() and x.get_device() == self.dev == torch.cuda.current_device()):
            y = prep.run_dense(x, self.q, self.st, b32)
            return y if flat else y.reshape(self.out_shape)
        if ptrs & 15 or x.stride(-1) != 1 or x.stride(0) % 8:
            return run_gemm(a, self.b, p, bias)
        y = wg.w4a16_wgmma(x, self.q, self.st, p.N, self.one_mul, p.out_dtype, b32, bm=self.bm, split=self.split,
                           elem=self.elem)
        if prep is None and self.tries < 6 and launch._enabled:
            self.tries += 1
            self._find(x, b32)
        return y if flat else y.reshape(self.out_shape)

    def _find(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        """Keep the prepared launch of x's problem (:func:`~mxkit.kernels.matmul_details._w4a16_wgmma.dense_prepared`)
        with what it was made for, setting ``prep`` last so that another thread sees all of it or none."""
        p, wg = self.plan, self.wg
        prep = wg.dense_prepared(x, self.q, p.N, self.one_mul, p.out_dtype, self.bm, self.split, self.elem, bias)
        if prep is not None and x.device.index == torch.cuda.current_device():
            self.xs, self.settings, self.dev = x.stride(), self._settings(), x.device.index
            self.prep = prep

    def _settings(self) -> tuple:
        """The wgmma kernel's A/B settings in force (part of its prepared launch's problem)."""
        return self.wg._ws(self.bm, False), self.wg._persist_setting()


class PlannedCall:
    """Any other path with its plan made once (:func:`prepared_call`)."""

    def __init__(self, b: PackedWeight, plan: GemmPlan):
        self.b, self.plan = b, plan

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return run_gemm(a, self.b, self.plan, bias)


def prepared_call(a: torch.Tensor, b: PackedWeight, out_dtype: Optional[torch.dtype], bias: Optional[torch.Tensor]):
    """The eager host path of ``matmul(a, b)`` for a float ``a`` on CUDA and a PackedWeight: the plan and the
    launch arguments are made on the first call of each (shape, strides, dtype, device, out dtype, bias
    shape / dtype, dispatch table) and kept on ``b``; later calls only allocate and launch. Returns a callable
    ``(a, bias) -> y``. Validation (:func:`plan_gemm`) runs on the first call of each key."""
    key = (a.shape, a.stride(), a.dtype, a.get_device(), out_dtype, _TOKEN.get(),
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    calls = b.__dict__.get("_calls")
    call = calls.get(key) if calls is not None else None
    if call is None:
        calls = calls_on(b, "_calls")
        plan = plan_gemm(a, b, out_dtype)
        check_bias(bias, plan, b.device)
        note_planned(b, a.dtype)  # (kept past the bounded calls: what a refill of b is held to)
        b = _twin(a, b, "float")
        if not plan.K:  # (the empty sum: run_gemm's; the small-M calls split K)
            call = PlannedCall(b, plan)
        elif plan.path == "decode-mma":
            call = MmaCall(b, plan.M, tuple(a.shape), a.stride(), plan.out_dtype)
            call.kept = True
        elif plan.path == "w8a16-mma":
            call = W16Call(b, plan.M, tuple(a.shape), a.stride(), plan.out_dtype)
            call.kept = True
        elif plan.path == "decode-w16" and a.is_contiguous() and (bias is None or bias.is_contiguous()):
            call = DecodeCall(b.source, plan.M, tuple(a.shape[:-1]), plan.out_dtype, bias is not None, a.device)
        elif plan.path == "dense-exact" and plan.out_dtype == a.dtype and bias is None and plan.M \
                and b.source.block_size == 32:  # (its fast call is the Triton dequantize's: blocks of 32)
            call = DenseExactCall(b, plan, tuple(a.shape[:-1]))
        elif (plan.path in ("w4a16-wgmma", "w8a16-wgmma") and plan.M and b.source.fmt.name in _WGMMA_FORMATS
              and b.device.type == "cuda"):
            call = WgmmaCall(b, plan, tuple(a.shape[:-1]))
        else:
            call = PlannedCall(b, plan)
        if getattr(getattr(call, "run", None), "split_fallback", False):
            call.kept = False  # (a capture's unsplit stand-in: not kept, the next call makes the split one)
            return call
        calls[key] = call
    return call


def prepared_call_mx(a: MXTensor, b: PackedWeight, out_dtype: Optional[torch.dtype],
                     bias: Optional[torch.Tensor]):
    """:func:`prepared_call` for an MX ``a`` on CUDA: the call of the a8w8-mma path, or of the fold-fp8 and
    bf16-exact paths (bf16 out, no bias, plain contiguous a: :class:`FoldCall`, :class:`Bf16ExactCall`), whose
    plans depend on shapes and formats only, made once per key and kept on ``b``; None for the other paths (the
    caller plans each call)."""
    calls = calls_on(b, "_calls")
    key = ("mx", a.shape, a.fmt, a.axis, a.block_size, a.scale_layout, a.qdata.stride(), a.scale.stride(),
           a.qdata.device, out_dtype, _table_token(),
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    call = calls.get(key, UNSEEN)  # (one lookup: another thread's calls_on may empty the dict between two)
    if call is not UNSEEN:
        return call
    call = None
    if a.fmt.name == "mxfp8_e4m3" and b.source.fmt.name == "mxfp8_e4m3":
        plan = plan_gemm(a, b, out_dtype)
        check_bias(bias, plan, b.device)
        if plan.path == "a8w8-mma":
            call = A8W8Call(b, plan, tuple(a.shape[:-1]))
    elif (bias is None and a.scale_layout == "plain" and a.block_size == 32 and a.axis == a.ndim - 1
          and a.qdata.is_contiguous() and a.scale.is_contiguous()):
        if a.qdata.is_cuda and torch.cuda.is_current_stream_capturing():
            return None  # (its operands are made once, outside a capture: a later call makes it)
        plan = plan_gemm(a, b, out_dtype)  # (on CUDA these plans read no value of a)
        if plan.out_dtype == torch.bfloat16 and plan.M:
            if plan.path == "fold-fp8" and plan.N % 16 == 0 and isinstance(b.folded, Folded):
                call = FoldCall(b, plan, tuple(a.shape[:-1]))
            elif plan.path == "bf16-exact" and a.qdata.is_cuda:  # (on the CPU this plan reads a's scales)
                call = Bf16ExactCall(b, plan, tuple(a.shape[:-1]))
    calls[key] = call
    return call
