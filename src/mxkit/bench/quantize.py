"""``mxkit bench quantize``: bf16 → MX quantize (rowwise, columnwise, cast-transpose) and dequantize.

Cases are op × format × shape; bytes are the least any implementation moves, each once:

* ``rowwise`` — ``quantize(x, fmt, axis=-1)``: reads x, writes qdata + scales;
* ``columnwise`` — ``quantize(x2, fmt, axis=0)`` on the 2-D flattening ``x2`` (prod(lead), K);
* ``cast_transpose`` — ``quantize(x2, fmt, axis=(-1, 0))``: reads x2 once, writes both MXTensors;
* ``dequantize`` — ``dequantize(q, dtype)`` of the rowwise ``q``: reads qdata + scales, writes ``dtype``.

Implementations: ``mxkit`` (the public API, ``--backend``); ``reference-compiled`` (``torch.compile`` of
:mod:`mxkit.reference`, the × column); ``torchao-compiled`` (``torch.compile`` of torchao's ``to_mx`` /
``to_dtype``, in torchao's own layout, not compared); ``reference-eager``. The outputs of ``mxkit`` and the
references are compared byte for byte with the eager reference; exit status 1 if an mxkit output differs or an
mxkit row raised.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..formats import BLOCK_SIZE, ElementFormat, ScaleMode, get_format
from ..reference import dequantize_reference, quantize_reference
from ..tensor import MXTensor
from . import timing
from .timing import BenchUnavailable, Column, Impl

NAME = "quantize"
HELP = "bf16 → MX quantize (rowwise, columnwise, cast-transpose) and dequantize bandwidth"

OPS = ("rowwise", "columnwise", "cast_transpose", "dequantize")
AXES = {"rowwise": -1, "columnwise": 0, "cast_transpose": (-1, 0), "dequantize": -1}
DEFAULT_FORMATS = ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3")
DEFAULT_SHAPES = ("8192x8192", "16384x16384", "4096x4096", "32768x160", "8x2048x4096")
QUICK_SHAPES = ("8192x8192", "32768x160")
DEFAULT_PEERS = ("reference-compiled", "torchao-compiled")
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}
PEER_LABELS = {"reference-compiled": "ref.compiled", "torchao-compiled": "torchao", "reference-eager": "ref.eager"}
REF_IMPL = "reference-compiled"


@dataclass(frozen=True)
class Case:
    """One case. ``shape`` as requested; :attr:`run_shape` is what the op is given (2-D for the column ops)."""

    op: str
    fmt: ElementFormat
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    scale_mode: ScaleMode = ScaleMode.FLOOR
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        timing.choice("op", OPS)(self.op)

    @property
    def run_shape(self) -> tuple[int, ...]:
        if self.op in ("columnwise", "cast_transpose") and len(self.shape) != 2:
            return (math.prod(self.shape[:-1]), self.shape[-1])
        return tuple(self.shape)

    axis = property(lambda self: AXES[self.op])
    label = property(lambda self: timing.format_shape(self.shape))
    fmt_name = property(lambda self: self.fmt.name)
    note = property(lambda self: "" if self.run_shape == tuple(self.shape) else
                    f"2-D view {timing.format_shape(self.run_shape)}")

    def nbytes(self) -> int:
        return case_bytes(self.op, self.run_shape, self.fmt, self.dtype, self.block_size)

    def invalid_reason(self) -> Optional[str]:
        """Why the case cannot be quantized (an axis length not a multiple of the block), else None."""
        s = self.run_shape
        for a in {"columnwise": (0,), "cast_transpose": (len(s) - 1, 0)}.get(self.op, (len(s) - 1,)):
            if s[a] % self.block_size:
                return f"shape {timing.format_shape(s)}: dim {a} = {s[a]} is not a multiple of {self.block_size}"
        return None

    def make_inputs(self, ctx) -> "Inputs":
        return make_inputs(self, ctx)

    def expected(self, inp: "Inputs") -> object:
        return expected_output(self, inp)

    def check(self, out: object, expected: object) -> dict:
        return {"check": check_output(self, out, expected)}


def mx_bytes(numel: int, fmt: ElementFormat, block_size: int = BLOCK_SIZE) -> tuple[int, int]:
    """(qdata, scale) bytes of ``numel`` elements: FP8 1, FP6 3/4, FP4 1/2 byte each; one E8M0 per block."""
    if numel % block_size:
        raise ValueError(f"{numel=} is not a multiple of {block_size=}")
    return numel * fmt.pack_bytes // fmt.pack, numel // block_size


def case_bytes(op: str, shape: Sequence[int], fmt: ElementFormat, dtype: torch.dtype, block_size: int = BLOCK_SIZE) -> int:
    """Bytes read + written, each once: the dense tensor plus qdata + scales (twice for cast_transpose)."""
    timing.choice("op", OPS)(op)
    numel = math.prod(shape)
    return numel * torch.empty((), dtype=dtype).element_size() + (2 if op == "cast_transpose" else 1) * sum(
        mx_bytes(numel, fmt, block_size))


def plan_cases(ops: Sequence[str], formats: Sequence[str], shapes: Sequence[tuple[int, ...]], dtype: torch.dtype,
               scale_mode: ScaleMode = ScaleMode.FLOOR) -> list[Case]:
    """Shape-major order (all ops and formats of a shape together), the order rows are printed in."""
    return [Case(op, get_format(f), tuple(s), dtype, scale_mode) for s in shapes for op in ops for f in formats]


# -------------------------------------------------------------------------------------------------------
# inputs, implementations, checks


@dataclass
class Inputs:
    x: torch.Tensor  # the op's input (run_shape); for dequantize the dense tensor q was made from
    q: Optional[MXTensor] = None  # dequantize only


def make_inputs(case: Case, ctx) -> Inputs:
    """Normal values times a random power of two per row (varied block scales, never zeros); ``q`` by mxkit
    (the reference where that fails: the same bytes)."""
    x = torch.randn(case.run_shape, dtype=case.dtype, device=ctx.device)
    x.mul_(torch.exp2(torch.randint(-12, 12, case.run_shape[:-1] + (1,), device=ctx.device).float()).to(case.dtype))
    if case.op != "dequantize":
        return Inputs(x)
    try:
        import mxkit

        q = mxkit.quantize(x, case.fmt, scale_mode=case.scale_mode, backend=ctx.backend)
        assert q.scale_layout == "plain"
    except Exception:
        q = quantize_reference(x, case.fmt, axis=-1, scale_mode=case.scale_mode)
    return Inputs(x, q)


def _mxkit(case: Case, inp: Inputs, ctx) -> Callable[[], object]:
    import mxkit

    x, q, fmt, sm, be, axis, dt = inp.x, inp.q, case.fmt, case.scale_mode, ctx.backend, case.axis, case.dtype
    if case.op == "dequantize":
        return lambda: mxkit.dequantize(q, dt, backend=be)
    return lambda: mxkit.quantize(x, fmt, axis=axis, scale_mode=sm, backend=be)


def dequantize_fn(fmt: ElementFormat, dtype: torch.dtype, block_size: int = BLOCK_SIZE) -> Callable:
    """``deq(qdata, scale) -> dtype`` tensor: :func:`dequantize_reference` of the plain MXTensor along the last
    axis those bytes make (the shape follows from the tensors)."""
    def deq(qdata: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        shape = tuple(qdata.shape[:-1]) + (qdata.shape[-1] * fmt.pack // fmt.pack_bytes,)
        return dequantize_reference(MXTensor(qdata, scale, fmt, len(shape) - 1, block_size, shape), dtype)

    return deq


def _reference_fn(case: Case) -> Callable:
    """The op written with :mod:`mxkit.reference` only (what the ``reference-*`` peers run)."""
    if case.op == "dequantize":
        return dequantize_fn(case.fmt, case.dtype, case.block_size)
    fmt, sm = case.fmt, case.scale_mode
    axes = (-1, 0) if case.op == "cast_transpose" else (case.axis,)
    outs = [lambda x, a=a: quantize_reference(x, fmt, axis=a, scale_mode=sm) for a in axes]
    return outs[0] if len(outs) == 1 else (lambda x: tuple(f(x) for f in outs))


def _bind(case: Case, inp: Inputs, fn: Callable) -> Callable[[], object]:
    args = (inp.q.qdata, inp.q.scale) if case.op == "dequantize" else (inp.x,)
    return lambda: fn(*args)


_TORCHAO_ELEM = {"mxfp8_e4m3": "float8_e4m3fn", "mxfp8_e5m2": "float8_e5m2", "mxfp4_e2m1": "float4_e2m1fn_x2",
                 "mxfp6_e2m3": "fp6_e2m3", "mxfp6_e3m2": "fp6_e3m2"}  # FP6 elements are strings in torchao


def _torchao_fn(case: Case) -> Callable:
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except Exception as e:
        raise BenchUnavailable(f"torchao not importable ({type(e).__name__})") from None
    if case.fmt.name not in _TORCHAO_ELEM:
        raise BenchUnavailable(f"torchao has no {case.fmt.name}")
    if case.dtype not in (torch.bfloat16, torch.float32):
        raise BenchUnavailable(f"torchao to_mx takes bfloat16 / float32, not {case.dtype}")
    elem = getattr(torch, _TORCHAO_ELEM[case.fmt.name], None) or _TORCHAO_ELEM[case.fmt.name]
    mode, bs, dt = ScaleCalculationMode[case.scale_mode.name], case.block_size, case.dtype
    if case.op == "dequantize":
        if case.fmt.pack == 4:
            raise BenchUnavailable("torchao dequantizes FP6 from unpacked bytes only; mxkit packs 4 in 3")
        view = case.fmt.torch_dtype if case.fmt.pack == 1 else torch.uint8  # our FP4 bytes are torchao's layout
        return lambda qd, sc: to_dtype(qd.view(view), sc.view(torch.float8_e8m0fnu), elem, bs, dt)
    rows, cols = (lambda x: to_mx(x, elem, bs, mode)), (lambda x: to_mx(x.t().contiguous(), elem, bs, mode))
    return {"rowwise": rows, "columnwise": cols, "cast_transpose": lambda x: (rows(x), cols(x))}[case.op]


def _compiled(name: str, make_fn: Callable[[Case], Callable]) -> Callable:
    def make(case: Case, inp: Inputs, ctx) -> Callable[[], object]:
        raw = make_fn(case)  # raises BenchUnavailable before anything compiles
        key = (name, case.op, case.fmt.name, case.dtype, case.scale_mode)
        return _bind(case, inp, ctx.compiled_fn(key, case.run_shape, lambda: raw))

    return make


IMPLS: dict[str, Impl] = {i.name: i for i in (
    Impl("mxkit", _mxkit, checked=True),
    Impl("reference-compiled", _compiled("reference", _reference_fn), compiled=True, checked=True),
    Impl("torchao-compiled", _compiled("torchao", _torchao_fn), compiled=True),
    Impl("reference-eager", lambda c, i, x: _bind(c, i, _reference_fn(c)), checked=True),
)}


def _same(a: object, b: torch.Tensor) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def _same_mx(a: object, b: MXTensor) -> bool:
    return (isinstance(a, MXTensor) and a.scale_layout == "plain" and a.axis == b.axis and _same(a.qdata, b.qdata)
            and _same(a.scale, b.scale))


def expected_output(case: Case, inp: Inputs) -> object:
    """The eager reference's result: an MXTensor, a pair of them (cast_transpose), or the dense tensor."""
    return _reference_fn(case)(*((inp.q.qdata, inp.q.scale) if case.op == "dequantize" else (inp.x,)))


def check_output(case: Case, out: object, expected: object) -> str:
    """``"match"`` if ``out`` has the bytes of ``expected`` (:func:`expected_output`), else ``"MISMATCH"``."""
    if case.op == "dequantize":
        ok = _same(out, expected)
    elif case.op == "cast_transpose":
        ok = isinstance(out, (tuple, list)) and len(out) == 2 and all(map(_same_mx, out, expected))
    else:
        ok = _same_mx(out, expected)
    return "match" if ok else "MISMATCH"


# -------------------------------------------------------------------------------------------------------
# table and command line


def table_columns(peers: Sequence[str]) -> list[Column]:
    """case, mxkit's µs / GB/s / % copy after each flush / × the compiled reference / check, peers' µs, note."""
    main = timing.main_value
    return [Column("op", lambda d: d["op"], right=False), Column("format", lambda d: d["fmt"], right=False),
            Column("shape", lambda d: d["shape"], right=False), Column("µs", main("us", ".1f")),
            Column("GB/s", main("gbps", ".0f")), Column("% copy", main("pct_copy", ".1f")),
            Column("µs (write flush)", main("us_write", ".1f")),
            Column("% copy (write flush)", main("pct_copy_write", ".1f")),
            Column(f"× vs {PEER_LABELS[REF_IMPL]}", main("vs_ref", ".2f")),
            Column("check", lambda d: d["main"].check or "-"),
            *(timing.peer_us_column(p, PEER_LABELS.get(p, p)) for p in peers),
            Column("note", lambda d: d["note"][:90], right=False)]


def _scale_mode(name: str) -> ScaleMode:
    try:
        return ScaleMode.parse(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    csv = timing.csv_arg
    p.add_argument("--ops", type=csv(timing.choice("op", OPS)), default=OPS,
                   help=f"comma list of {', '.join(OPS)} (default all)")
    p.add_argument("--formats", type=csv(lambda s: get_format(s).name), default=DEFAULT_FORMATS,
                   help=f"comma list of MX formats (default {','.join(DEFAULT_FORMATS)})")
    p.add_argument("--shapes", type=csv(timing.parse_shape), default=None,
                   help=f"comma list like 8192x8192,8x2048x4096 (default {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--quick", action="store_true",
                   help=f"shapes {','.join(QUICK_SHAPES)} and --rep-ms {timing.QUICK_REP_MS:g} unless given")
    p.add_argument("--dtype", type=lambda s: DTYPES[timing.choice("dtype", DTYPES)(s)], default=torch.bfloat16,
                   help=f"input / dequantize output dtype: {' | '.join(DTYPES)} (default bfloat16)")
    p.add_argument("--scale-mode", type=_scale_mode, default=ScaleMode.FLOOR, help="floor (OCP, default) | ceil | rceil | even")
    p.add_argument("--peers", type=timing.peers_arg("peer", [k for k in IMPLS if k != "mxkit"]), default=DEFAULT_PEERS,
                   help=f"comma list of {', '.join(k for k in IMPLS if k != 'mxkit')} or none (default {','.join(DEFAULT_PEERS)})")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    timing.add_common_arguments(p)


def cases_from_args(args) -> list[Case]:
    shapes = args.shapes or tuple(timing.parse_shape(s) for s in (QUICK_SHAPES if args.quick else DEFAULT_SHAPES))
    return plan_cases(args.ops, args.formats, shapes, args.dtype, args.scale_mode)


def run(args) -> int:
    """``mxkit bench quantize``. 0: ran; 1: an mxkit row raised or its output differs from the reference; 2: cannot
    run here."""
    cases = cases_from_args(args)
    title = f"mxkit bench quantize — {str(args.dtype).replace('torch.', '')} in, scale {args.scale_mode}, backend {args.backend}"
    return timing.run_benchmark(args, cases, IMPLS, what="mxkit bench quantize", stem="bench_quantize",
                                peers=args.peers, columns=table_columns(args.peers), ref_impl=REF_IMPL, title=title,
                                list_line=_list_line)


def _list_line(c) -> str:
    bad = c.invalid_reason()
    return (f"{c.op:15s} {c.fmt.name:12s} {c.label:14s} {'n/a' if bad else f'{c.nbytes() / 1e6:.1f}':>10s} MB  "
            f"{bad or c.note}")
