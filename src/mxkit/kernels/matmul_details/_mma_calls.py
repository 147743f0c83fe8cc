"""The small-M launches of :mod:`mxkit.kernels.matmul`'s decode paths, each prepared once per (weight, problem)
and reused: ``decode-mma`` (:class:`MmaCall`), ``a8w8-mma`` (:func:`run_a8w8`, :class:`A8W8Call`, and
:class:`A8W8InCall` for bf16 x quantized in the launch), ``w8a16-mma`` (:class:`W16Call`) and ``decode-w16``
(:class:`DecodeCall`, the Triton kernel). :func:`mxkit.kernels.matmul.run_gemm` launches them for one call;
:mod:`mxkit.kernels.matmul_calls` keeps them on a PackedWeight and, after the first calls, reaches each through
one C++ fast call (its output allocated and its kernel launched in one call from Python).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Optional

import torch

from ..._cache import tensor_version
from ...packed import PackedWeight
from ...tensor import MXTensor
from ..cuda_driver import fast_call_loaded
from ..matmul_table import DecodeConfig, decode_config, mma_m8_loop
from . import _split_sum
from ._mma_decode import bias_flag

if TYPE_CHECKING:
    from ..matmul import GemmPlan

# the weight element kinds of the bf16-activation kernels (``W_KIND`` of matmul_details._mx_weight)
W_KINDS = {"mxfp4_e2m1": 0, "mxfp8_e4m3": 1, "mxfp8_e5m2": 2, "mxint8": 3, "mxfp6_e2m3": 4, "mxfp6_e3m2": 5}


def plain(q: MXTensor) -> MXTensor:
    """``q`` with its scales in the plain layout (one byte per block, row-major), the layout the kernels read."""
    if q.scale_layout == "plain":
        return q
    return dataclasses.replace(q, scale=q.plain_scale().contiguous(), scale_layout="plain")


@functools.lru_cache(maxsize=1)
def decode_launchers():
    """The direct launchers of the decode GEMM and its split-K sum (:mod:`._split_sum`'s, the wgmma kernel's
    too), one per process, so every call (prepared or not) reuses their compiled kernels."""
    from .. import launch
    from . import _w16_decode

    return launch._Launcher(_w16_decode, "_w16_decode_kernel"), _split_sum._launch


class DecodeCall:
    """The decode-w16 launch of one (weight, M, K, out dtype, bias or not), prepared once: two launches per
    call (the GEMM's split-K partials, then their fixed-order sum with the bias and the output rounding) through
    :class:`mxkit.kernels.launch._Launcher` (:func:`mxkit.kernels.matmul_calls.prepared_call`)."""

    def __init__(self, w: MXTensor, M: int, lead: tuple, out: torch.dtype, has_bias: bool, device: torch.device,
                 cfg: Optional[DecodeConfig] = None):
        import triton

        cfg = cfg or decode_config(device, w.shape[1])
        N, K = w.shape
        bk = cfg.block_k
        k_split = triton.cdiv(triton.cdiv(K, cfg.split_k), bk) * bk
        self.nsplit = triton.cdiv(K, k_split)
        self.q, self.s = w.qdata.contiguous(), w.scale.contiguous()
        self.M, self.N, self.K, self.k_split, self.lead, self.out = M, N, K, k_split, lead, out
        self.grid = (triton.cdiv(N, cfg.block_n), self.nsplit)
        self.consts = (("BLOCK_M", max(16, triton.next_power_of_2(M))), ("BLOCK_N", cfg.block_n), ("BLOCK_K", bk),
                       ("W_KIND", W_KINDS[w.fmt.name]), ("num_stages", cfg.num_stages))
        self.warps = cfg.num_warps
        self.rgrid = (triton.cdiv(M * N, _split_sum.BLOCK),)
        self.rconsts = _split_sum._consts(self.nsplit, has_bias, out)
        self.gemm, self.reduce = decode_launchers()

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        M, N = self.M, self.N
        x = a.reshape(M, self.K)
        part = torch.empty(self.nsplit, M, N, device=a.device, dtype=torch.float32)
        self.gemm(self.grid, (x, self.q, self.s, part, M, N, self.K, x.stride(0), self.k_split), self.consts,
                  self.warps)
        y = torch.empty(M, N, device=a.device, dtype=self.out)
        # (the launcher takes tensors and ints only: without a bias, part stands in, never read)
        self.reduce(self.rgrid, (part, part if bias is None else bias, y, M * N, N), self.rconsts, _split_sum.WARPS)
        return y.view(*self.lead, N)


def decode_w16(x: torch.Tensor, w: MXTensor, cfg: Optional[DecodeConfig] = None) -> torch.Tensor:
    """The decode-w16 kernel alone on x bf16 (M, K) and an MX weight (N, K) with schedule ``cfg`` (default: the
    table's), bf16 out, no bias: ``mxkit tune gemm``'s timed call. No envelope check (the caller's)."""
    return DecodeCall(w, x.shape[0], (x.shape[0],), torch.bfloat16, False, x.device, cfg)(x, None)


def run_a8w8(a: Optional[MXTensor], x: Optional[torch.Tensor], w: MXTensor, M: int, lead: tuple,
          out: torch.dtype, bias: Optional[torch.Tensor], packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """The a8w8-mma kernel on an MXFP8 ``a`` (plain scales) or, with ``a`` None, bf16 rows ``x`` quantized in
    the kernel; weight ``w`` E4M3 (N, K), plain scales, read in ``packed``'s a8w8 layout where it has one.
    Returns (*lead, N) in ``out``."""
    from ._mma_a8w8 import A8W8, weight_ok, x_ok

    N, K = w.shape
    shape = None
    copy = False
    if packed is not None and packed.mma_q is not None:
        wq, ws, shape = packed.mma_q, packed.mma_s, (N, K)
    else:
        wq, ws = w.qdata, w.scale
        copy = not weight_ok(wq, ws)  # (copied once, by the launch made below: keyed on w's own codes)
    quant = a is None
    if quant:
        xv, xs = x.reshape(M, K), None
    else:
        xv, xs = a.qdata.reshape(M, K), a.scale.reshape(M, K // 32)
        if xs.stride(-1) != 1 or xs.stride(0) % 2 or xs.data_ptr() % 2:
            xs = xs.contiguous().clone()
    if not x_ok(xv, quant):
        xv = xv.contiguous().clone()
    bias = kernel_bias(bias)
    y = torch.empty(*lead, N, device=w.device, dtype=out)
    # the prepared launch (kernel, grid, split-K workspace) is kept on the weight object, one per (M, out, mode)
    runs = calls_on(packed if shape is not None else w, "_a8w8")
    versions = (tensor_version(wq), tensor_version(ws)) if copy else ()
    key = (M, out, quant, wq.data_ptr()) + versions
    run = runs.get(key)
    if run is None:
        if copy:
            wq, ws = wq.contiguous().clone(), ws.contiguous().clone()
        run = A8W8(wq, ws, M, out, quant, shape=shape)
        # (not kept: a capture's unsplit stand-in; a copy of inference tensors, whose changes no version shows)
        if not run.split_fallback and None not in versions:
            runs[key] = run
    return run(xv, xs, bias, y)


UNSEEN = object()  # (a key not in a dict of prepared calls, whose values may be None)


def calls_on(holder, name: str) -> dict:
    """The dict of prepared calls kept on a weight object (PackedWeight or MXTensor) under ``name``: not a field,
    so dataclasses.replace / .to() start a new one; emptied when it reaches 64 entries (many shapes, e.g.
    prefill of varying lengths) so that it stays small."""
    calls = holder.__dict__.get(name)
    if calls is None:
        calls = {}
        object.__setattr__(holder, name, calls)
    elif len(calls) >= 64:
        calls.clear()
    return calls


class MmaCall:
    """The decode-mma launch of one (packed weight, shape and strides of a, out dtype): one kernel, the bias
    added in float32 before the one output rounding. Where a's leading dims flatten to rows of one stride (a
    view), the kernel reads a in place and writes the output in its final shape: no reshape, no view."""

    def __init__(self, b: PackedWeight, M: int, a_shape: tuple, a_stride: tuple, out: torch.dtype):
        from ._mma_decode import MmaDecode

        loop = mma_m8_loop(b.device, b.shape[1], b.shape[0], M)
        self._rows(MmaDecode.of(b, M, out, loop), b, M, a_shape, a_stride)

    def _rows(self, run, b: PackedWeight, M: int, a_shape: tuple, a_stride: tuple) -> None:
        self.run = run
        self.M, self.N, self.K = M, *b.shape
        self.out_shape = (*a_shape[:-1], self.N)
        self.ldx = row_stride(a_shape, a_stride)  # None: a is copied into rows first
        self.device = b.device
        # the C++ fast call of the launch at ldx (y allocated and the kernel launched in one call from Python),
        # made after the first call that ran it where the call object is kept (``kept``: the prepared calls; a
        # one-off call of run_gemm makes none); its inputs: a, the launch's fixed pointers (_pre), the bias
        self.fast, self.fast_pre, self.kept = None, (), False

    def _pre(self) -> tuple:
        """The pointer arguments of the launch between a and the bias (the weight's codes and scales)."""
        return (self.run.q, self.run.s)

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ldx = self.ldx
        if ldx is None or a.data_ptr() % 16:  # the kernel reads rows in 16-byte loads
            a = a.reshape(self.M, self.K).clone(memory_format=torch.contiguous_format)
            ldx = self.K
        else:
            fast = self.fast
            if fast is not None:
                return fast(a, *self.fast_pre, kernel_bias(bias))
        y = torch.empty(self.out_shape, device=self.device, dtype=self.run.out)
        bias = kernel_bias(bias)
        y = self._into(a, ldx, bias, y)
        launch = self.run.launch  # (the one launch object read once: its ld is the one it was bound with)
        if (self.kept and ldx == self.ldx and self.fast is None and launch.ld == self._ld(ldx, bias)
                and fast_call_loaded()):
            pre = self._pre()
            n = len(pre) + 2
            fast = launch.with_outputs(tuple(range(n)) + (-1,), [(self.out_shape, self.run.out, False)], n,
                                       single=True)
            if fast is not None:
                self.fast_pre = pre  # (before fast: a thread that sees fast sees its arguments)
                self.fast = fast
        return y

    def _into(self, a: torch.Tensor, ldx: int, bias: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return self.run.into(a, ldx, bias, y)

    @staticmethod
    def _ld(ldx: int, bias: Optional[torch.Tensor]):
        """The ``ld`` a launch bound by :meth:`_into` at row stride ldx with ``bias`` carries (MmaDecode: ldx and
        the bias flag)."""
        return (ldx, bias_flag(bias))


def kernel_bias(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bias as the CUDA C++ kernels and the wgmma kernel (with its split sum) read it: float32 or bf16 as it
    is where contiguous (a bf16 bias needs no conversion launch: :func:`._mma_decode.bias_flag`; both kernels
    widen it to float32, exact), else converted to float32, contiguous."""
    if bias is not None and (bias.dtype not in (torch.float32, torch.bfloat16) or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    return bias


def row_stride(shape: tuple, stride: tuple) -> Optional[int]:
    """The stride between a's rows when its leading dims flatten into rows of one stride with unit stride along
    K and that stride a multiple of 8 elements (16 bytes of bf16); None otherwise."""
    if not shape or stride[-1] != 1 and shape[-1] > 1:
        return None
    rows = [(n, st) for n, st in zip(shape[:-1], stride[:-1]) if n != 1]
    ld = rows[-1][1] if rows else shape[-1]
    for (n, st), (n2, st2) in zip(rows, rows[1:]):
        if st != st2 * n2:
            return None
    return ld if ld % 8 == 0 and ld >= shape[-1] else None


class A8W8Call:
    """The a8w8-mma path of one (packed weight, MXFP8 a's shape and layout, out dtype)."""

    def __init__(self, b: PackedWeight, plan: GemmPlan, lead: tuple):
        self.b, self.M, self.lead, self.out = b, plan.M, lead, plan.out_dtype
        # the C++ fast call of the launch for contiguous plain-layout a (codes rows of K bytes, 16-byte aligned;
        # scale rows of K / 32): y allocated and the kernel launched in one call; made after the first such call
        self.fast, self.fast_pre = None, ()

    def __call__(self, a: MXTensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        q, s = a.qdata, a.scale
        plain_a = (a.scale_layout == "plain" and q.is_contiguous() and s.is_contiguous() and q.data_ptr() % 16 == 0
                   and s.data_ptr() % 2 == 0)
        fast = self.fast
        if plain_a and fast is not None:
            return fast(q, s, *self.fast_pre, kernel_bias(bias))
        y = run_a8w8(plain(a), None, self.b.source, self.M, self.lead, self.out, bias, self.b)
        if plain_a and fast is None and fast_call_loaded():
            b = self.b
            run = b.__dict__.get("_a8w8", {}).get((self.M, self.out, False, b.mma_q.data_ptr())) \
                if b.mma_q is not None else None
            K = b.shape[1]
            launch = run.launch if run is not None else None  # (read once: its ld is the one it was bound with)
            if launch is not None and launch.ld == (K, K // 32, bias_flag(kernel_bias(bias))):
                fast = launch.with_outputs((0, 1, 2, 3, 4, -1), [((*self.lead, b.shape[0]), self.out, False)], 5,
                                           single=True)
                if fast is not None:
                    self.fast_pre = (run.w, run.sw)  # (before fast, as MmaCall's)
                    self.fast = fast
        return y


class A8W8InCall(MmaCall):
    """:func:`~mxkit.kernels.matmul.a8w8_linear`'s one-launch form (bf16 x quantized in the kernel, M <= 8) of one (packed weight,
    shape and strides of x, out dtype): the same kernel, split and bits; x's rows handled as :class:`MmaCall`
    does."""

    def __init__(self, b: PackedWeight, M: int, x_shape: tuple, x_stride: tuple, out: torch.dtype):
        from ._mma_a8w8 import A8W8

        self._rows(A8W8(b.mma_q, b.mma_s, M, out, True, shape=b.shape), b, M, x_shape, x_stride)

    def _pre(self) -> tuple:
        return (None, self.run.w, self.run.sw)  # (x's scales: none, the kernel quantizes x)

    def _into(self, x: torch.Tensor, ldx: int, bias: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return self.run.into(x, ldx, None, 0, bias, y)

    @staticmethod
    def _ld(ldx: int, bias: Optional[torch.Tensor]):
        return (ldx, 0, bias_flag(bias))  # A8W8's: (x's row stride, its scales' row stride: none here, bias flag)


class W16Call(A8W8InCall):
    """The w8a16-mma launch of one (packed MXFP8 weight, shape and strides of x, out dtype), x's rows as
    :class:`MmaCall` handles them."""

    def __init__(self, b: PackedWeight, M: int, x_shape: tuple, x_stride: tuple, out: torch.dtype):
        from ._mma_a8w8 import A8W8

        elem = b.source.fmt.name[-4:]
        self._rows(A8W8(b.mma_q, b.mma_s, M, out, True, shape=b.shape, w16=elem), b, M, x_shape, x_stride)
