"""``mxkit bench quantize``: bf16 → MX quantize (rowwise, columnwise, cast-transpose) and dequantize.

Cases are op × format × shape. Per case every implementation runs once untimed (compilation), the
mxkit output is compared byte for byte with the eager reference, then each is timed
(:mod:`mxkit.bench.timing`: median after a read flush and after do_bench's write flush).

Ops (``x`` of shape (..., K); the bytes counted, each once, are the least any implementation moves):

* ``rowwise`` — ``quantize(x, fmt, axis=-1)``: reads x, writes qdata + scales.
* ``columnwise`` — ``quantize(x2, fmt, axis=0)`` on the 2-D flattening ``x2`` (prod(lead), K).
* ``cast_transpose`` — ``quantize(x2, fmt, axis=(-1, 0))``: reads x2 once, writes both MXTensors.
* ``dequantize`` — ``dequantize(q, dtype)`` of the rowwise ``q``: reads qdata + scales, writes ``dtype``.

Implementations (``impl``): ``mxkit`` (the public API with ``--backend``, default ``triton``);
``reference-compiled`` (``torch.compile`` of :mod:`mxkit.reference`); ``torchao-compiled``
(``torch.compile`` of torchao's ``to_mx`` / ``to_dtype``, when importable; columnwise is torchao's own
torch path, ``to_mx(x.t().contiguous())``); ``reference-eager`` (off unless asked for).
An implementation that cannot run gives an ``n/a`` row with the reason; nothing aborts the run. The
outputs of ``mxkit`` and the ``reference-*`` peers are compared byte for byte with the eager reference
(``check`` column); exit status 1 if an mxkit output differs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from ..formats import BLOCK_SIZE, ElementFormat, ScaleMode, get_format
from ..reference import dequantize_reference, quantize_reference
from ..tensor import MXTensor
from . import timing
from .timing import BenchUnavailable, Column, Context, Impl

NAME = "quantize"
HELP = "bf16 → MX quantize (rowwise, columnwise, cast-transpose) and dequantize bandwidth"

OPS = ("rowwise", "columnwise", "cast_transpose", "dequantize")
DEFAULT_FORMATS = ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3")
DEFAULT_SHAPES = ("8192x8192", "16384x16384", "4096x4096", "32768x160", "8x2048x4096")
QUICK_SHAPES = ("8192x8192", "32768x160")
DEFAULT_PEERS = ("reference-compiled", "torchao-compiled")
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32}
PEER_LABELS = {"reference-compiled": "ref.compiled", "torchao-compiled": "torchao", "reference-eager": "ref.eager"}
REF_IMPL = "reference-compiled"  # the × column: its µs over each row's


# -------------------------------------------------------------------------------------------------------
# cases and the bytes they move


@dataclass(frozen=True)
class Case:
    """One benchmark case. ``shape`` is as requested; :attr:`run_shape` is what the op is given."""

    op: str
    fmt: ElementFormat
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    scale_mode: ScaleMode = ScaleMode.FLOOR
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; known: {', '.join(OPS)}")

    @property
    def run_shape(self) -> tuple[int, ...]:
        """Columnwise and cast-transpose take the 2-D flattening (prod(lead), K) of an N-D input."""
        if self.op in ("columnwise", "cast_transpose") and len(self.shape) != 2:
            return (math.prod(self.shape[:-1]), self.shape[-1])
        return tuple(self.shape)

    @property
    def axis(self) -> Union[int, tuple[int, int]]:
        return {"rowwise": -1, "columnwise": 0, "cast_transpose": (-1, 0), "dequantize": -1}[self.op]

    @property
    def label(self) -> str:
        return timing.format_shape(self.shape)

    @property
    def note(self) -> str:
        if self.run_shape != tuple(self.shape):
            return f"2-D view {timing.format_shape(self.run_shape)}"
        return ""

    @property
    def fmt_name(self) -> str:
        return self.fmt.name

    def nbytes(self) -> int:
        return case_bytes(self.op, self.run_shape, self.fmt, self.dtype, self.block_size)

    def make_inputs(self, ctx: Context) -> "Inputs":
        return make_inputs(self, ctx)

    def expected(self, inputs: "Inputs") -> object:
        return expected_output(self, inputs)

    def check(self, out: object, expected: object) -> dict:
        return {"check": check_output(self, out, expected)}

    def invalid_reason(self) -> Optional[str]:
        """Why this case cannot be quantized (an axis length not a multiple of the block), else None."""
        s = self.run_shape
        axes = {"rowwise": [len(s) - 1], "dequantize": [len(s) - 1], "columnwise": [0],
                "cast_transpose": [len(s) - 1, 0]}[self.op]
        for a in axes:
            if s[a] % self.block_size:
                return f"shape {timing.format_shape(s)}: dim {a} = {s[a]} is not a multiple of {self.block_size}"
        return None


def mx_bytes(numel: int, fmt: ElementFormat, block_size: int = BLOCK_SIZE) -> tuple[int, int]:
    """(qdata bytes, scale bytes) of an MXTensor of ``numel`` elements: ``numel * pack_bytes / pack``
    (FP8 1, FP6 3/4, FP4 1/2 byte per element) and one E8M0 byte per ``block_size`` elements."""
    if numel % block_size:
        raise ValueError(f"{numel=} is not a multiple of {block_size=}")
    return numel * fmt.pack_bytes // fmt.pack, numel // block_size


def case_bytes(op: str, shape: Sequence[int], fmt: ElementFormat, dtype: torch.dtype,
               block_size: int = BLOCK_SIZE) -> int:
    """Bytes read + written, each once, by ``op`` on a ``dtype`` tensor of ``shape``.

    quantize (rowwise / columnwise): input + qdata + scales; cast_transpose: input + 2 × (qdata + scales);
    dequantize: qdata + scales read + ``dtype`` output written.
    """
    numel = math.prod(shape)
    dense = numel * torch.empty((), dtype=dtype).element_size()
    q, s = mx_bytes(numel, fmt, block_size)
    if op in ("rowwise", "columnwise", "dequantize"):
        return dense + q + s
    if op == "cast_transpose":
        return dense + 2 * (q + s)
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def plan_cases(ops: Sequence[str], formats: Sequence[str], shapes: Sequence[tuple[int, ...]],
               dtype: torch.dtype, scale_mode: ScaleMode = ScaleMode.FLOOR) -> list[Case]:
    """Shape-major order (all ops and formats of a shape together), the order rows are printed in."""
    return [Case(op, get_format(f), tuple(s), dtype, scale_mode) for s in shapes for op in ops for f in formats]


# -------------------------------------------------------------------------------------------------------
# implementations


@dataclass
class Inputs:
    x: torch.Tensor  # the op's input (run_shape); for dequantize the dense tensor q was made from
    q: Optional[MXTensor] = None  # dequantize only


def make_inputs(case: Case, ctx: Context) -> Inputs:
    """Random normal values times a random power of two per row (exact; varied block scales), never zeros."""
    shape = case.run_shape
    x = torch.randn(shape, dtype=case.dtype, device=ctx.device)
    rows = torch.randint(-12, 12, shape[:-1] + (1,), device=ctx.device)
    x.mul_(torch.exp2(rows.to(torch.float32)).to(case.dtype))
    q = None
    if case.op == "dequantize":
        q = _quantize_for_dequant(x, case, ctx)
    return Inputs(x, q)


def _quantize_for_dequant(x: torch.Tensor, case: Case, ctx: Context) -> MXTensor:
    if ctx.backend != "reference":
        try:
            import mxkit

            q = mxkit.quantize(x, case.fmt, axis=-1, scale_mode=case.scale_mode, backend=ctx.backend)
            if isinstance(q, MXTensor) and q.scale_layout == "plain":
                return q
        except Exception:
            pass  # kernel not there yet: the reference makes the same bytes
    return quantize_reference(x, case.fmt, axis=-1, scale_mode=case.scale_mode)


def _mxkit(case: Case, inp: Inputs, ctx: Context) -> Callable[[], object]:
    import mxkit

    x, fmt, sm, be = inp.x, case.fmt, case.scale_mode, ctx.backend
    if case.op == "dequantize":
        q, dt = inp.q, case.dtype
        return lambda: mxkit.dequantize(q, dt, backend=be)
    axis = case.axis
    return lambda: mxkit.quantize(x, fmt, axis=axis, scale_mode=sm, backend=be)


def _reference_fn(case: Case) -> Callable:
    """The op written with :mod:`mxkit.reference` only (what ``reference-*`` peers run)."""
    fmt, dt, bs, scale_mode = case.fmt, case.dtype, case.block_size, case.scale_mode
    if case.op == "rowwise":
        return lambda x: quantize_reference(x, fmt, axis=-1, scale_mode=scale_mode)
    if case.op == "columnwise":
        return lambda x: quantize_reference(x, fmt, axis=0, scale_mode=scale_mode)
    if case.op == "cast_transpose":
        return lambda x: (quantize_reference(x, fmt, axis=-1, scale_mode=scale_mode),
                          quantize_reference(x, fmt, axis=0, scale_mode=scale_mode))

    return dequantize_fn(fmt, dt, bs)


def dequantize_fn(fmt: ElementFormat, dtype: torch.dtype, block_size: int = BLOCK_SIZE) -> Callable:
    """``deq(qdata, scale) -> dtype`` tensor: :func:`dequantize_reference` of the plain rowwise MXTensor those
    bytes make. The logical shape follows from the tensors, so a compiled version stays shape-generic."""
    def deq(qdata: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        shape = tuple(qdata.shape[:-1]) + (qdata.shape[-1] * fmt.pack // fmt.pack_bytes,)
        return dequantize_reference(MXTensor(qdata, scale, fmt, len(shape) - 1, block_size, shape), dtype)

    return deq


def _reference(case: Case, inp: Inputs, ctx: Context, *, compiled: bool) -> Callable[[], object]:
    if compiled:
        key = ("reference", case.op, case.fmt.name, case.dtype, case.scale_mode, len(case.run_shape))
        fn = ctx.compiled_fn(key, lambda: _reference_fn(case))
    else:
        fn = _reference_fn(case)
    if case.op == "dequantize":
        qd, sc = inp.q.qdata, inp.q.scale
        return lambda: fn(qd, sc)
    x = inp.x
    return lambda: fn(x)


_TORCHAO_ELEM = {  # torchao's elem_dtype per mxkit format (torchao.prototype.mx_formats.constants)
    "mxfp8_e4m3": "float8_e4m3fn",
    "mxfp8_e5m2": "float8_e5m2",
    "mxfp4_e2m1": "float4_e2m1fn_x2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp6_e3m2": "fp6_e3m2",
}


def _torchao_fn(case: Case) -> Callable:
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except Exception as e:
        raise BenchUnavailable(f"torchao not importable ({type(e).__name__})") from None
    name = _TORCHAO_ELEM.get(case.fmt.name)
    if name is None:
        raise BenchUnavailable(f"torchao has no {case.fmt.name}")
    elem = getattr(torch, name, None) or name  # FP6 elements are named by strings in torchao
    if case.dtype not in (torch.bfloat16, torch.float32):
        raise BenchUnavailable(f"torchao to_mx takes bfloat16 / float32, not {case.dtype}")
    mode = ScaleCalculationMode[case.scale_mode.name]
    bs, dt = case.block_size, case.dtype
    if case.op == "rowwise":
        return lambda x: to_mx(x, elem, bs, mode)
    if case.op == "columnwise":
        return lambda x: to_mx(x.t().contiguous(), elem, bs, mode)
    if case.op == "cast_transpose":
        return lambda x: (to_mx(x, elem, bs, mode), to_mx(x.t().contiguous(), elem, bs, mode))
    if case.fmt.pack == 4:
        raise BenchUnavailable("torchao dequantizes FP6 from unpacked bytes only; mxkit packs 4 in 3")
    view = case.fmt.torch_dtype if case.fmt.pack == 1 else torch.uint8  # torchao unpacks FP4 from uint8
    # torchao's to_dtype: (data_lp, scale_e8m0, elem_dtype, block_size, target_dtype); our qdata / scale
    # bytes are its layout (FP4 element 2i in the low nibble)
    return lambda qd, sc: to_dtype(qd.view(view), sc.view(torch.float8_e8m0fnu), elem, bs, dt)


def _torchao(case: Case, inp: Inputs, ctx: Context) -> Callable[[], object]:
    key = ("torchao", case.op, case.fmt.name, case.dtype, case.scale_mode, len(case.run_shape))
    raw = _torchao_fn(case)  # raises BenchUnavailable before anything compiles
    fn = ctx.compiled_fn(key, lambda: raw)
    if case.op == "dequantize":
        qd, sc = inp.q.qdata, inp.q.scale
        return lambda: fn(qd, sc)
    x = inp.x
    return lambda: fn(x)


IMPLS: dict[str, Impl] = {
    i.name: i
    for i in (
        Impl("mxkit", _mxkit, checked=True),
        Impl("reference-compiled", lambda c, i, x: _reference(c, i, x, compiled=True), compiled=True, checked=True),
        Impl("torchao-compiled", _torchao, compiled=True),  # torchao's own layout (FP6 unpacked): not compared
        Impl("reference-eager", lambda c, i, x: _reference(c, i, x, compiled=False), checked=True),
    )
}


# -------------------------------------------------------------------------------------------------------
# correctness of the timed output


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _same_mx(a: object, b: MXTensor) -> bool:
    return (isinstance(a, MXTensor) and a.scale_layout == "plain" and a.axis == b.axis
            and _same(a.qdata, b.qdata) and _same(a.scale, b.scale))


def expected_output(case: Case, inp: Inputs) -> object:
    """The eager reference's result for the case: an MXTensor, a pair of them, or the dense tensor."""
    if case.op == "dequantize":
        return dequantize_reference(inp.q, case.dtype)
    if case.op == "cast_transpose":
        return (quantize_reference(inp.x, case.fmt, axis=-1, scale_mode=case.scale_mode),
                quantize_reference(inp.x, case.fmt, axis=0, scale_mode=case.scale_mode))
    return quantize_reference(inp.x, case.fmt, axis=case.axis, scale_mode=case.scale_mode)


def check_output(case: Case, out: object, expected: object) -> str:
    """``"match"`` if ``out`` has the bytes of ``expected`` (:func:`expected_output`), else ``"MISMATCH"``."""
    if case.op == "dequantize":
        ok = isinstance(out, torch.Tensor) and _same(out, expected)
    elif case.op == "cast_transpose":
        ok = isinstance(out, (tuple, list)) and len(out) == 2 and all(_same_mx(o, e) for o, e in zip(out, expected))
    else:
        ok = _same_mx(out, expected)
    return "match" if ok else "MISMATCH"


def table_columns(peers: Sequence[str]) -> list[Column]:
    """case, mxkit's µs / GB/s / % copy after each flush / × the compiled reference / check, peers' µs, note."""
    f = timing.fmt_num
    return [Column("op", lambda d: d["op"], right=False), Column("format", lambda d: d["fmt"], right=False),
            Column("shape", lambda d: d["shape"], right=False), Column("µs", lambda d: f(d["main"].us, ".1f")),
            Column("GB/s", lambda d: f(d["main"].gbps, ".0f")), Column("% copy", lambda d: f(d["main"].pct_copy, ".1f")),
            Column("µs (write flush)", lambda d: f(d["main"].us_write, ".1f")),
            Column("% copy (write flush)", lambda d: f(d["main"].pct_copy_write, ".1f")),
            Column(f"× vs {PEER_LABELS[REF_IMPL]}", lambda d: f(d["main"].vs_ref, ".2f")),
            Column("check", lambda d: d["main"].check or "-"),
            *(timing.peer_us_column(p, PEER_LABELS.get(p, p)) for p in peers),
            Column("note", lambda d: d["note"][:90], right=False)]


# -------------------------------------------------------------------------------------------------------
# command line


def _op(name: str) -> str:
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; known: {', '.join(OPS)}")
    return name


def _peer(name: str) -> str:
    if name not in IMPLS or name == "mxkit":
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(k for k in IMPLS if k != 'mxkit')}, none")
    return name


def _peers(text: str) -> tuple:
    return () if text.strip() == "none" else timing.csv_arg(_peer)(text)


def _scale_mode(name: str) -> ScaleMode:
    try:
        return ScaleMode.parse(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    return DTYPES[name]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", type=timing.csv_arg(_op), default=OPS, help=f"comma list of {', '.join(OPS)} (default all)")
    p.add_argument("--formats", type=timing.csv_arg(lambda s: get_format(s).name), default=DEFAULT_FORMATS,
                   help=f"comma list of MX formats (default {','.join(DEFAULT_FORMATS)})")
    p.add_argument("--shapes", type=timing.csv_arg(timing.parse_shape), default=None,
                   help=f"comma list like 8192x8192,8x2048x4096 (default {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--quick", action="store_true",
                   help=f"shapes {','.join(QUICK_SHAPES)} and --rep-ms {timing.QUICK_REP_MS:g} unless given")
    p.add_argument("--dtype", type=_dtype, default=torch.bfloat16, help="input / dequantize output dtype (bfloat16)")
    p.add_argument("--scale-mode", type=_scale_mode, default=ScaleMode.FLOOR,
                   help="floor (OCP, default) | ceil | rceil | even")
    p.add_argument("--peers", type=_peers, default=DEFAULT_PEERS,
                   help=f"comma list of {', '.join(k for k in IMPLS if k != 'mxkit')} or none "
                        f"(default {','.join(DEFAULT_PEERS)})")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    timing.add_common_arguments(p)


def cases_from_args(args) -> list[Case]:
    shapes = args.shapes or tuple(timing.parse_shape(s) for s in (QUICK_SHAPES if args.quick else DEFAULT_SHAPES))
    return plan_cases(args.ops, args.formats, shapes, args.dtype, args.scale_mode)


def run(args) -> int:
    """Entry point of ``mxkit bench quantize``. 0: ran; 1: an mxkit output differs from the reference;
    2: cannot run here (no CUDA, bad options)."""
    cases = cases_from_args(args)
    if args.list:
        for c in cases:
            bad = c.invalid_reason()
            mb = "n/a" if bad else f"{c.nbytes() / 1e6:.1f}"
            print(f"{c.op:15s} {c.fmt.name:12s} {c.label:14s} {mb:>10s} MB  {bad or c.note}")
        return 0
    title = (f"mxkit bench quantize — {str(args.dtype).replace('torch.', '')} in, scale {args.scale_mode}, "
             f"mxkit backend {args.backend}, peers compiled {'per shape' if args.compile_static else 'shape-generic'}")
    return timing.run_benchmark(args, cases, IMPLS, what="mxkit bench quantize", stem="bench_quantize",
                                peers=args.peers, columns=table_columns(args.peers), ref_impl=REF_IMPL,
                                title=title)
