"""The reduction of a split-K GEMM's float32 partial sums in one kernel: part [S, M, N] -> y [M, N] =
round(((part[0] + part[1]) + ...) + part[S - 1] + bias), each element's S partials added in order s = 0, 1, ...
in float32 (the same bits every run, whatever the grid), then the bias (float32 or bfloat16 [N], optional, read as
float32: exact), then one rounding to y's dtype (round to nearest even, as ``Tensor.to``).

Its reference twin is :func:`split_sum_reference` (``torch`` ops, the same order, so the same bytes on the GPU).
The W4A16 / W8A16 wgmma kernel splits K 2-8 ways where its tiles give too few programs (``dense_schedule``: M up
to 256); its PyTorch reduction (``part.sum(0)``, ``+= bias``, ``.to``) took 11-13 µs on the H200 at 64 x 8192,
three launches and two float32 round trips (session 39, ``benchmarks/probes/w4a16_stages_ab.py``), a quarter of
the whole call.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional

import torch
import triton
import triton.language as tl

from .._env import interpreting
from ..launch import _Launcher

OUT_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
BIAS_DTYPES = (torch.float32, torch.bfloat16)  # (a bf16 bias read as it is: no conversion launch, the same sums)
BLOCK = 1024
WARPS = 4


@triton.jit
def _split_sum_kernel(part_ptr, bias_ptr, y_ptr, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      OUT: tl.constexpr, BLOCK: tl.constexpr):
    """Elements [BLOCK * program_id(0), + BLOCK) of y (M * N = MN elements, contiguous) from part (SPLIT
    contiguous [M, N] planes). OUT: 0 bfloat16, 1 float16, 2 float32."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    p = part_ptr + offs
    acc = tl.load(p, mask=ok, other=0.0)
    for _ in tl.static_range(1, SPLIT):
        p += MN  # (a pointer step: no 32-bit product s * MN)
        acc += tl.load(p, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    if OUT == 0:
        out = acc.to(tl.bfloat16)
    elif OUT == 1:
        out = acc.to(tl.float16)
    else:
        out = acc
    tl.store(y_ptr + offs, out, mask=ok)


_launch = _Launcher(sys.modules[__name__], "_split_sum_kernel")


def _check(part: torch.Tensor, bias: Optional[torch.Tensor], out: torch.dtype) -> None:
    if part.dtype != torch.float32 or part.dim() != 3 or not part.is_contiguous():
        raise ValueError(f"part: a contiguous float32 [S, M, N] tensor, got {part.dtype} {tuple(part.shape)}")
    if part.shape[0] == 0:
        raise ValueError("part: at least one partial sum (S >= 1)")
    if out not in OUT_DTYPES:
        raise ValueError(f"out: one of {list(OUT_DTYPES)}, got {out}")
    if bias is not None and (bias.dtype not in BIAS_DTYPES or bias.shape != (part.shape[2],) or
                             not bias.is_contiguous() or bias.device != part.device):
        raise ValueError(f"bias: a contiguous float32 or bfloat16 [{part.shape[2]}] tensor on {part.device}, got "
                         f"{bias.dtype} {tuple(bias.shape)} on {bias.device}")


def split_sum_reference(part: torch.Tensor, bias: Optional[torch.Tensor] = None,
                        out: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """y [M, N] (``out``) of part float32 [S, M, N]: the partials added in order s = 0 .. S - 1 in float32, then
    ``bias`` (float32 or bfloat16 [N], contiguous, or None; a bf16 one read as float32), then one rounding to
    ``out``. Raises ValueError on another dtype, rank or layout of ``part`` / ``bias``, S = 0 or an ``out``
    outside bfloat16 / float16 / float32."""
    _check(part, bias, out)
    acc = part[0].clone()
    for s in range(1, part.shape[0]):
        acc += part[s]
    if bias is not None:
        acc += bias.to(torch.float32)
    return acc.to(out)


def _consts(S: int, has_bias: bool, out: torch.dtype) -> tuple:
    """The kernel's constexprs (its launcher's key) for S partials, a bias or not, ``out``."""
    return (("SPLIT", S), ("HAS_BIAS", has_bias), ("OUT", OUT_DTYPES[out]), ("BLOCK", BLOCK))


def split_sum(part: torch.Tensor, bias: Optional[torch.Tensor] = None,
              out: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """:func:`split_sum_reference` in one Triton kernel: part float32 [S, M, N] contiguous, 1 <= S, on a CUDA
    device (the same bytes as the reference there), or the CPU under TRITON_INTERPRET=1 (whose float32 -> bfloat16
    conversion truncates: the same bytes for float16 / float32 out only); returns a new contiguous [M, N] tensor
    of ``out`` on part's device. ValueError as the reference, and for a CPU ``part`` outside the interpreter."""
    _check(part, bias, out)
    if not part.is_cuda and not interpreting():
        raise ValueError(f"split_sum runs on CUDA tensors, got part on {part.device} (split_sum_reference on CPU)")
    S, M, N = part.shape
    y = torch.empty(M, N, dtype=out, device=part.device)
    MN = M * N
    if MN == 0:
        return y
    consts = _consts(S, bias is not None, out)
    here = not part.is_cuda or part.device.index == torch.cuda.current_device()
    with contextlib.nullcontext() if here else torch.cuda.device(part.device):
        _launch((triton.cdiv(MN, BLOCK),), (part, bias if bias is not None else part, y, MN, N), consts, WARPS)
    return y


def _sum_launch_args(part: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor) -> Optional[tuple]:
    """(grid, arguments, constexprs) of the sum of part into y that just ran on part's device, the current one;
    None where no prepared launch is made (not CUDA, another device current, nothing to add)."""
    S, M, N = part.shape
    MN = M * N
    if not part.is_cuda or part.device.index != torch.cuda.current_device() or not MN:
        return None
    return ((triton.cdiv(MN, BLOCK),), (part, bias if bias is not None else part, y, MN, N),
            _consts(S, bias is not None, y.dtype))


def split_sum_launch(part: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor) -> tuple:
    """(the kernel's ArgsLaunch, its grid) for later :func:`split_sum` calls of the problem (part's shape, bias or
    not, y's dtype) that just ran with these tensors: ``fast(grid, (part, bias or part, y, M * N, N))`` launches one
    on new tensors of the same dtypes, shapes and 16-byte alignment, without the checks. (False, None) where it
    cannot be made (direct launches off, another device current)."""
    got = _sum_launch_args(part, bias, y)
    fast = _launch.args_launch(got[0], got[1], got[2], WARPS) if got else None
    return (fast, got[0]) if fast else (False, None)


def split_sum_plan(part: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor):
    """A C++ fast call of the sum for the problem (part's shape, bias or not, y's dtype) of a :func:`split_sum`
    that just ran into y: ``call(part)`` (``call(part, bias)`` with a bias) -> a new y, on new tensors of the same
    dtypes, shapes and 16-byte alignment, without the checks; its launch its own (ints bound once). None where it
    cannot be made (direct launches off, another device current, the C++ module not loaded)."""
    got = _sum_launch_args(part, bias, y)
    priv = _launch.private_args_launch(got[0], got[1], got[2], WARPS) if got else None
    if priv is None:
        return None
    roles = (0, 1 if bias is not None else 0, -1, None, None)
    return priv.with_outputs(got[1], roles, ((tuple(y.shape), y.dtype, False),), 2 if bias is not None else 1)
