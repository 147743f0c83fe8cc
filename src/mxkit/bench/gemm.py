"""``mxkit bench gemm``: y = a @ b.T with MX weights (``mxkit.matmul``), against same-run peers.

Cases are (format pair, mode, M×N×K). Pairs: MXFP4×MXFP4, MXFP6 E2M3×MXFP6 E2M3, MXFP8 E4M3×MXFP8 E4M3,
W4A16 (bf16 × MXFP4), W4A8 (FP8 E4M3 per-row-scaled activations × MXFP4) and, on request (``--pairs``), W8A16
(bf16 × MXFP8 E4M3). Modes: ``ready`` times
``mxkit.matmul`` on prepared operands (a from ``mxkit.quantize``, ``mxkit.quantize_fp8_rowwise`` or bf16);
``from-bf16`` (MX×MX only) times ``mxkit.matmul(mxkit.quantize_fold(x, fmt), packed)``, the fused
quantize-and-fold included (MXFP8×MXFP8 at small M: ``mxkit.kernels.matmul.a8w8_linear``, x quantized inside
the GEMM's one launch, but for ``--backend reference``; elsewhere ``quantize`` then ``matmul``). The weight is
packed once (``mxkit.pack_weight``), timed apart ("pack µs"). ``--backend`` goes to every mxkit call that takes
one (``quantize``, ``quantize_fold``, ``quantize_fp8_rowwise``, ``matmul``, ``gemm_plan``); ``pack_weight`` and
``a8w8_linear`` take none.

Peers (each in its own try; a failing one leaves its error in its row): ``cublas-bf16`` (``torch.matmul`` of
the bf16 dequantized operands; the × column), ``scaled-mm-fp8`` (``torch._scaled_mm`` on E4M3 casts of those
with per-row scales: another quantization, so its error is reported and held to no bound), ``dot-scaled``
(:mod:`mxkit.bench.peers_dot_scaled`, MXFP8×MXFP8, MXFP4×MXFP4, W4A16), ``torchao`` (its emulated MX matmul,
MXFP8 / MXFP4 pairs, when importable) and ``reference-compiled`` (``torch.compile`` of dequantize-then-matmul).

Numerics (every row): rel. error ‖y − y64‖/‖y64‖ against the bound 1.2 × ‖bf16(y64) − y64‖/‖y64‖, y64 the
float64 product of the dequantized operands on up to 64 random rows (:func:`rel_error`, :func:`error_bound`).
Exit status 1 if an mxkit row raised or is past its bound.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..formats import BLOCK_SIZE, get_format
from . import timing
from .quantize import dequantize_fn, mx_bytes
from .timing import BenchUnavailable, Column, Impl

NAME = "gemm"
HELP = "y = a @ b.T with MX weights: µs, TFLOP/s, × cuBLAS bf16, path, pack time, error against float64"

# pair -> (a format: an MX format, "bf16" or "fp8_rowwise"; b format), label
PAIRS = {
    "mxfp4": (("mxfp4_e2m1", "mxfp4_e2m1"), "mxfp4×mxfp4"),
    "mxfp6": (("mxfp6_e2m3", "mxfp6_e2m3"), "mxfp6_e2m3×mxfp6_e2m3"),
    "mxfp8": (("mxfp8_e4m3", "mxfp8_e4m3"), "mxfp8_e4m3×mxfp8_e4m3"),
    "w4a16": (("bf16", "mxfp4_e2m1"), "bf16×mxfp4 (W4A16)"),
    "w4a8": (("fp8_rowwise", "mxfp4_e2m1"), "fp8-rowwise×mxfp4 (W4A8)"),
    "w8a16": (("bf16", "mxfp8_e4m3"), "bf16×mxfp8 (W8A16)"),
    "w6a16": (("bf16", "mxfp6_e2m3"), "bf16×mxfp6 (W6A16)"),
}
DEFAULT_PAIRS = ("mxfp4", "mxfp6", "mxfp8", "w4a16", "w4a8")  # (w8a16, w6a16 on request: --pairs)
MODES = ("ready", "from-bf16")
SEED = (10000, 16384, 16384)  # IREE's MXFP4 problem
SQUARES = ((8192, 8192, 8192), (4096, 4096, 4096))
LAYERS = {"Llama-3-70B up": (28672, 8192), "Llama-3-70B down": (8192, 28672), "GPT-OSS qkv": (5120, 2880),
          "GPT-OSS o": (2880, 4096)}  # N x K
LAYER_MS = (256, 1024, 4096, 8192)
DEFAULT_SHAPES = (SEED, *SQUARES, *((m, n, k) for n, k in LAYERS.values() for m in LAYER_MS))
QUICK_SHAPES = (*SQUARES, *((1024, n, k) for n, k in list(LAYERS.values())[:2]))
# issue #23's decode targets: M = 1 / 16 / 64 on 8192^2 and the Llama-3-70B / GPT-OSS layers, where the weight's
# bytes are the cost ("% of floor": the weight's bytes alone at copy bandwidth; "% of copy" counts a and y too)
DECODE_MS = (1, 16, 64)
DECODE_SHAPES = tuple((m, n, k) for n, k in ((8192, 8192), *LAYERS.values()) for m in DECODE_MS)
DECODE_PAIRS = ("w4a16", "w8a16", "mxfp8")
PEERS = ("cublas-bf16", "scaled-mm-fp8", "dot-scaled", "torchao", "reference-compiled")
PEER_LABELS = {"cublas-bf16": "cuBLAS bf16", "scaled-mm-fp8": "_scaled_mm fp8", "dot-scaled": "dot_scaled",
               "torchao": "torchao", "reference-compiled": "ref.compiled"}
REF_IMPL = "cublas-bf16"
SAMPLE_ROWS = 64


def is_mx(fmt: str) -> bool:
    return fmt.startswith("mx")


@dataclass(frozen=True)
class GemmCase:
    """One GEMM: y (M, N) bf16 = a (M, K) @ b (N, K).T for a format ``pair`` (a key of :data:`PAIRS`)."""

    pair: str
    mode: str
    M: int
    N: int
    K: int
    dtype: torch.dtype = torch.bfloat16  # of x and of the output

    def __post_init__(self) -> None:
        if self.pair not in PAIRS or self.mode not in MODES:
            raise ValueError(f"pair={self.pair!r} / mode={self.mode!r}: pairs {', '.join(PAIRS)}; modes {MODES}")
        if self.mode == "from-bf16" and not is_mx(self.formats[0]):
            raise ValueError(f"mode 'from-bf16' is for MX x MX pairs, not {self.pair!r}")

    op = property(lambda self: self.mode)
    fmt_name = property(lambda self: PAIRS[self.pair][1])
    formats = property(lambda self: PAIRS[self.pair][0])
    label = property(lambda self: timing.format_shape((self.M, self.N, self.K)))
    note = ""
    flops = property(lambda self: 2 * self.M * self.N * self.K)

    def nbytes(self) -> int:
        """a as mxkit reads it (bf16 for from-bf16 / W4A16, FP8 + a scale per row for W4A8) + b's MX bytes +
        the bf16 output: the problem's bytes, the same for every path and peer (a fold path reads a re-laid FP8
        copy of b, about twice an MXFP4 b's bytes: its GB/s from these bytes is a lower bound)."""
        fa, fb = self.formats
        a = {"bf16": 2 * self.M * self.K, "fp8_rowwise": self.M * self.K + 4 * self.M}.get(fa)
        if a is None:
            a = 2 * self.M * self.K if self.mode == "from-bf16" else mx_nbytes(self.M * self.K, fa)
        return a + mx_nbytes(self.N * self.K, fb) + 2 * self.M * self.N

    def floor_bytes(self) -> int:
        """b's MX bytes (elements and E8M0 scales): issue #23's weight-bytes floor, at the copy bandwidth."""
        return mx_nbytes(self.N * self.K, self.formats[1])

    def invalid_reason(self) -> Optional[str]:
        return None if self.K % BLOCK_SIZE == 0 else f"K={self.K} is not a multiple of {BLOCK_SIZE}"

    def make_inputs(self, ctx) -> "Inputs":
        return make_inputs(self, ctx)

    def expected(self, inp: "Inputs") -> tuple[torch.Tensor, torch.Tensor]:
        return expected_rows(inp)

    def check(self, out: Any, expected: tuple[torch.Tensor, torch.Tensor]) -> dict:
        return check_rows(out, expected, self.M, self.N)


def mx_nbytes(numel: int, fmt: str) -> int:
    return sum(mx_bytes(numel, get_format(fmt)))


def plan_cases(pairs, modes, shapes) -> list[GemmCase]:
    """Shape-major; ``from-bf16`` only for MX×MX pairs."""
    return [GemmCase(p, m, *s) for s in shapes for p in pairs for m in modes
            if m == "ready" or is_mx(PAIRS[p][0][0])]


# -------------------------------------------------------------------------------------------------------
# inputs and numerics


@dataclass
class Inputs:
    x: torch.Tensor  # (M, K) bf16 activations
    a: Any  # what mxkit.matmul gets as a in "ready" mode: MXTensor, bf16 x, FP8 rowwise object (or None)
    a_bf16: torch.Tensor  # the dense a every peer multiplies (exact in bf16 but for W4A8)
    a64: torch.Tensor  # float64 values of a
    wq: Any  # MXTensor (N, K) along K
    b_bf16: torch.Tensor
    note: str = ""


def _quantize(t: torch.Tensor, fmt: str, ctx):
    import mxkit

    try:
        return mxkit.quantize(t, fmt, axis=-1, backend=ctx.backend)
    except Exception:  # a kernel not there: the reference makes the same bytes
        return mxkit.quantize(t, fmt, axis=-1, backend="reference")


def _dequantize(q, dtype: torch.dtype) -> torch.Tensor:
    import mxkit

    return mxkit.dequantize(q, dtype, backend="reference")


def fp8_rowwise_dense(x: torch.Tensor) -> torch.Tensor:
    """float64 of E4M3(x / s) · s with s = row amax / 448 (float32): what an FP8 rowwise cast keeps of x."""
    s = (x.float().abs().amax(-1, keepdim=True) / 448.0).clamp_min(2.0**-126)
    return (x.float() / s).to(torch.float8_e4m3fn).double() * s.double()


def _fp8_object_dense(obj: Any) -> torch.Tensor:
    """float64 values of mxkit.quantize_fp8_rowwise's result, read from its data and per-row scale."""
    data = next(getattr(obj, k) for k in ("qdata", "data", "fp8") if isinstance(getattr(obj, k, None), torch.Tensor))
    scale = next(getattr(obj, k) for k in ("scale", "row_scale", "scales") if isinstance(getattr(obj, k, None), torch.Tensor))
    return data.double() * scale.double().reshape(*data.shape[:-1], -1)


def make_inputs(case: GemmCase, ctx) -> Inputs:
    """x: normal values times a power of two in [2^-3, 2^3] per row; w: normal · 2^-5. Quantized by mxkit
    (``ctx.backend``, the reference where that fails)."""
    import mxkit

    fa, fb = case.formats
    x = torch.randn(case.M, case.K, device=ctx.device, dtype=case.dtype)
    x.mul_(torch.exp2(torch.randint(-3, 4, (case.M, 1), device=ctx.device).to(case.dtype)))
    wq = _quantize(torch.randn(case.N, case.K, device=ctx.device, dtype=case.dtype) * 2.0**-5, fb, ctx)
    note = ""
    if is_mx(fa):
        a = _quantize(x, fa, ctx)
        a64 = _dequantize(a, torch.float32).double()
    elif fa == "bf16":
        a, a64 = x, x.double()
    else:
        try:
            a = mxkit.quantize_fp8_rowwise(x, backend=ctx.backend)
            a64 = _fp8_object_dense(a)
        except Exception as e:
            a, a64 = None, fp8_rowwise_dense(x)
            note = f"FP8 rowwise a from the bench's own cast ({type(e).__name__})"
    return Inputs(x, a, a64.to(torch.bfloat16), a64, wq, _dequantize(wq, torch.bfloat16), note)


def sample_rows(M: int, n: int = SAMPLE_ROWS, device="cpu") -> torch.Tensor:
    """Every row when M <= n, else n distinct random rows in ascending order."""
    return torch.arange(M, device=device) if M <= n else torch.randperm(M, device=device)[:n].sort().values


def rel_error(y: torch.Tensor, y64: torch.Tensor) -> float:
    """‖y − y64‖ / ‖y64‖ in float64 (0 when both are 0; inf when only y64 is)."""
    num, den = (y.double() - y64).norm().item(), y64.norm().item()
    return (num / den) if den else (0.0 if num == 0 else float("inf"))


def error_bound(y64: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, factor: float = 1.2) -> float:
    """``factor`` × the relative error of rounding y64 to ``out_dtype``: what an exact product with fp32
    accumulation may add to the output's own rounding (issue #22's bound for bf16 outputs)."""
    return factor * rel_error(y64.to(out_dtype), y64)


def expected_rows(inp: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, y64 of those rows) on the inputs' device, in float64."""
    idx = sample_rows(inp.x.shape[0], device=inp.x.device)
    b64 = _dequantize(inp.wq, torch.float32).double()
    return idx, inp.a64[idx] @ b64.T


def check_rows(out: Any, expected: tuple[torch.Tensor, torch.Tensor], M: int, N: int) -> dict:
    """Row fields ``err``, ``err_bound`` and ``check`` (ok / FAIL) of an output against the sampled y64."""
    idx, y64 = expected
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return {"check": "FAIL", "note": f"output {got}, expected a ({M}, {N}) tensor"}
    err, bound = rel_error(out[idx], y64), error_bound(y64)
    return {"err": err, "err_bound": bound, "check": "ok" if err <= bound else "FAIL"}


# -------------------------------------------------------------------------------------------------------
# implementations


def _api(name: str) -> Callable:
    import mxkit

    fn = getattr(mxkit, name, None)
    if fn is None:
        raise BenchUnavailable(f"mxkit.{name} is not there yet")
    return fn


def tensor_bytes(obj: Any, _depth: int = 0, _seen: Optional[set] = None) -> int:
    """Bytes of the distinct tensors reachable from ``obj`` (attributes, dataclass fields, dicts, sequences)."""
    seen = set() if _seen is None else _seen
    if isinstance(obj, torch.Tensor):
        key = (obj.data_ptr(), obj.nbytes)
        if key in seen:
            return 0
        seen.add(key)
        return obj.nbytes
    if _depth > 4 or isinstance(obj, (str, bytes, int, float, type(None))):
        return 0
    if isinstance(obj, dict):
        vals = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        vals = list(obj)
    elif dataclasses.is_dataclass(obj):
        vals = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        vals = list(getattr(obj, "__dict__", {}).values())
    return sum(tensor_bytes(v, _depth + 1, seen) for v in vals)


def _mxkit(case: GemmCase, inp: Inputs, ctx):
    matmul, pack_weight, gemm_plan = _api("matmul"), _api("pack_weight"), _api("gemm_plan")
    # packed as MXLinear packs it for these activations (only the layouts they read)
    act = {"bf16": "float", "fp8_rowwise": "fp8_rowwise"}.get(case.formats[0], "mx")
    packed = pack_weight(inp.wq, act=act)
    pack_us = timing.time_once_made(ctx, lambda: pack_weight(inp.wq, act=act))  # one-time cost, read flush
    pack_bytes = tensor_bytes((inp.wq, packed))  # (the source read once and the layouts written: packed holds wq)
    x, fa, be = inp.x, case.formats[0], ctx.backend
    if case.mode == "from-bf16":
        import mxkit

        prepare = _api("quantize_fold")
        try:
            a_plan = prepare(x, fa, backend=be)
        except ValueError:  # a format that does not fold (MXFP8): its plain quantize is the fused pass
            prepare = mxkit.quantize
            a_plan = prepare(x, fa, backend=be)

        if prepare is not mxkit.quantize:  # MXLinear's path: the fold's host sync after the GEMM is enqueued
            def fn():
                return matmul(prepare(x, fa, defer=True, backend=be), packed, backend=be)
        else:
            from ..kernels.matmul import a8w8_linear

            # one launch, x quantized inside the a8w8-mma kernel (a GPU path: it takes no backend)
            if be != "reference" and a8w8_linear(x, packed) is not None:
                def fn():
                    return a8w8_linear(x, packed)
            else:
                def fn():
                    return matmul(prepare(x, fa, backend=be), packed, backend=be)
    else:
        if inp.a is None:
            raise BenchUnavailable(f"no mxkit activation for {case.pair} ({inp.note})")
        a = a_plan = inp.a

        def fn():
            return matmul(a, packed, backend=be)
    plan = gemm_plan(a_plan, packed, backend=be)
    return fn, {"path": str(plan.path), "pack_us": pack_us, "pack_gbps": timing.gbps(pack_bytes, pack_us),
                "note": f"plan: {plan.reason}"[:80]}


def _cublas(case: GemmCase, inp: Inputs, ctx):
    a, b = inp.a_bf16, inp.b_bf16
    return lambda: torch.matmul(a, b.T)


def rowwise_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 (R, C), float32 scale (R, 1)) with t ≈ e4m3 · scale, scale = row amax / 448."""
    s = (t.float().abs().amax(-1, keepdim=True) / 448.0).clamp_min(2.0**-126)
    return (t.float() / s).to(torch.float8_e4m3fn), s


def _scaled_mm(case: GemmCase, inp: Inputs, ctx):
    (a8, sa), (b8, sb) = rowwise_e4m3(inp.a_bf16), rowwise_e4m3(inp.b_bf16)
    sb = sb.T.contiguous()
    return lambda: torch._scaled_mm(a8, b8.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


_DOT_SCALED = {"mxfp8": ("e4m3", "e4m3"), "mxfp4": ("e2m1", "e2m1"), "w4a16": ("bf16", "e2m1")}


def _dot_scaled(case: GemmCase, inp: Inputs, ctx):
    from .peers_dot_scaled import dot_scaled_mm, fitting_configs

    fa, fb = _DOT_SCALED[case.pair]
    try:
        fitting_configs(case.M, case.K)
    except ValueError as e:  # (a shape this peer's configs do not tile: n/a, not an error row)
        raise BenchUnavailable(str(e)) from None

    def operand(q, f):
        return q.qdata.view(torch.float8_e4m3fn) if f == "e4m3" else q.qdata

    a, a_s = (inp.x, None) if fa == "bf16" else (operand(inp.a, fa), inp.a.scale)
    return dot_scaled_mm(a, a_s, fa, operand(inp.wq, fb), inp.wq.scale, fb, case.K)


_TORCHAO_ELEM = {"mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn_x2"}


def _torchao(case: GemmCase, inp: Inputs, ctx):
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor as AoMX
    except Exception as e:
        raise BenchUnavailable(f"torchao not importable ({type(e).__name__})") from None
    elem = getattr(torch, _TORCHAO_ELEM[case.pair])
    am, bm = AoMX.to_mx(inp.a_bf16, elem, BLOCK_SIZE), AoMX.to_mx(inp.b_bf16, elem, BLOCK_SIZE)
    return lambda: torch.mm(am, bm.t())


def _reference(case: GemmCase, inp: Inputs, ctx):
    """torch.compile of dequantize (the mxkit reference, to bf16) then a bf16 matmul, per pair and shape."""
    fa, fb = case.formats
    deq_b = dequantize_fn(get_format(fb), torch.bfloat16)
    key, shape = ("gemm-reference", case.pair), (case.M, case.N, case.K)
    if is_mx(fa):
        deq_a = dequantize_fn(get_format(fa), torch.bfloat16)
        fn = ctx.compiled_fn(key, shape, lambda: lambda qa, sa, qb, sb: deq_a(qa, sa) @ deq_b(qb, sb).T)
        args = (inp.a.qdata, inp.a.scale, inp.wq.qdata, inp.wq.scale)
    else:  # W4A16 / W4A8: a as its bf16 values
        fn = ctx.compiled_fn(key, shape, lambda: lambda a, qb, sb: a @ deq_b(qb, sb).T)
        args = (inp.a_bf16, inp.wq.qdata, inp.wq.scale)
    return lambda: fn(*args)


def _only(pairs=tuple(PAIRS), ready_only=True) -> Callable[[GemmCase], Optional[str]]:
    def skip(case: GemmCase) -> Optional[str]:
        if case.pair not in pairs:
            return f"no such peer for {case.pair}"
        return "timed in the operands-ready row" if ready_only and case.mode != "ready" else None

    return skip


def _exact_in_bf16(case: GemmCase) -> bool:
    """Whether the bf16 peers (cuBLAS, the compiled reference) multiply the case's exact activations: every pair
    but W4A8, whose FP8 rowwise values times a float32 row scale are rounded to bf16 for them (another product:
    its error is reported, held to no bound)."""
    return case.pair != "w4a8"


IMPLS: dict[str, Impl] = {i.name: i for i in (
    Impl("mxkit", _mxkit, checked=True),
    Impl("cublas-bf16", _cublas, checked=True, skip=_only(ready_only=False), bounded=_exact_in_bf16),
    Impl("scaled-mm-fp8", _scaled_mm, checked=True, skip=_only(), bounded=False),
    Impl("dot-scaled", _dot_scaled, checked=True, skip=_only(tuple(_DOT_SCALED))),
    Impl("torchao", _torchao, checked=True, skip=_only(tuple(_TORCHAO_ELEM))),
    Impl("reference-compiled", _reference, compiled=True, checked=True, skip=_only(), bounded=_exact_in_bf16),
)}


# -------------------------------------------------------------------------------------------------------
# table and command line


def table_columns(peers) -> list[Column]:
    main = timing.main_value
    return [Column("mode", lambda d: d["op"], right=False), Column("pair", lambda d: d["fmt"], right=False),
            Column("M×N×K", lambda d: d["shape"], right=False), Column("µs", main("us", ".1f")),
            Column("µs (write flush)", main("us_write", ".1f")), Column("TFLOP/s", main("tflops", ".0f")),
            Column("× cuBLAS bf16", main("vs_ref", ".2f")), Column("% of copy", main("pct_copy", ".0f")),
            Column("% of floor", main("pct_floor", ".0f")),
            Column("path", lambda d: d["main"].path or "-", right=False),
            Column("pack µs", main("pack_us", ".1f")), Column("pack GB/s", main("pack_gbps", ".0f")),
            *timing.error_peer_note_columns(peers, PEER_LABELS)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    csv = timing.csv_arg
    p.add_argument("--pairs", type=csv(timing.choice("pair", PAIRS)), default=None,
                   help=f"comma list of {', '.join(PAIRS)} (default {','.join(DEFAULT_PAIRS)}; with --decode "
                        f"{','.join(DECODE_PAIRS)})")
    p.add_argument("--modes", type=csv(timing.choice("mode", MODES)), default=MODES,
                   help="ready (operands prepared) and/or from-bf16 (fused quantize-and-fold timed too; MX x MX) "
                        "(default both)")
    p.add_argument("--shapes", type=csv(timing.parse_shape), default=None,
                   help="comma list of MxNxK (default: the seed 10000x16384x16384, 8192^3, 4096^3, Llama-3-70B MLP "
                        "and GPT-OSS attention layers at M in 256,1024,4096,8192)")
    p.add_argument("--quick", action="store_true", help="8192^3, 4096^3 and M=1024 of the Llama-3-70B MLP layers, "
                   f"--rep-ms {timing.QUICK_REP_MS:g} unless given (with --decode: the decode shapes, that timing)")
    p.add_argument("--decode", action="store_true",
                   help="the decode shapes: M in 1,16,64 on 8192^2, the Llama-3-70B MLP and GPT-OSS attention "
                        "layers (\"%% of copy\": the bytes moved, mostly the weight's, at the same-run copy bandwidth)")
    p.add_argument("--peers", type=timing.peers_arg("peer", PEERS), default=PEERS,
                   help=f"comma list of {', '.join(PEERS)} or none (default all)")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    timing.add_common_arguments(p, backend_default="auto",
                                backend_help="backend of the mxkit rows' quantize, quantize_fold, "
                                "quantize_fp8_rowwise, matmul and gemm_plan calls (default auto: the calls as "
                                "MXLinear makes them, the eager fast path included; triton: the same kernels, "
                                "without it). pack_weight and a8w8_linear take none; reference leaves a8w8_linear "
                                "out")


def cases_from_args(args) -> list[GemmCase]:
    decode = getattr(args, "decode", False)
    shapes = args.shapes or (DECODE_SHAPES if decode else QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    bad = [timing.format_shape(s) for s in shapes if len(s) != 3]
    if bad:
        raise ValueError(f"gemm shapes are MxNxK, got {', '.join(bad)}")
    pairs = args.pairs or (DECODE_PAIRS if decode else DEFAULT_PAIRS)
    cases = plan_cases(pairs, args.modes, shapes)
    if not cases:  # (e.g. --pairs w4a16 --modes from-bf16: a W4A16 pair has no from-bf16 mode)
        raise ValueError(f"the options select no case (pairs {', '.join(pairs)} in modes {', '.join(args.modes)})")
    return cases


def run(args) -> int:
    """Entry point of ``mxkit bench gemm``. 0: ran; 1: an mxkit row raised or is past its error bound; 2: cannot
    run here. ``--list`` shows a case that cannot run (K not a multiple of 32) with ``n/a`` bytes and the reason."""
    try:
        cases = cases_from_args(args)
    except ValueError as e:
        return timing.usage_error(str(e))
    return timing.run_benchmark(args, cases, IMPLS, what="mxkit bench gemm", stem="bench_gemm", peers=args.peers,
                                columns=table_columns(args.peers), ref_impl=REF_IMPL,
                                title=f"mxkit bench gemm — bf16 out, mxkit backend {args.backend}",
                                chart=("tflops", "TFLOP/s (read flush)"), list_line=_list_line,
                                pool_ref_key=lambda r: r.shape)  # (cuBLAS bf16: one problem a shape)


def _list_line(c) -> str:
    bad = c.invalid_reason()
    return (f"{c.mode:9s} {c.fmt_name:26s} {c.label:18s} {c.flops / 1e9:10.1f} GFLOP "
            f"{'n/a' if bad else f'{c.nbytes() / 1e6:.1f}':>9s} MB" + (f"  {bad}" if bad else ""))
