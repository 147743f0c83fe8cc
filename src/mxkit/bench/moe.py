"""``mxkit bench moe``: the expert computation of a GPT-OSS MoE layer (both expert GEMMs, the activation, the
routing weights and the combine) with MXFP4 experts, against same-run peers.

Cases are (model, tokens, routing, mode). Models: GPT-OSS-120B (E = 128) and GPT-OSS-20B (E = 32) experts,
hidden 2880, intermediate 2880, top-4. Routing: ``uniform`` (the top-4 of normal logits) or ``zipf`` (expert e
drawn with weight 1 / (e + 1): a few hot experts), fixed per case (seed 0). Without ``--routings``: uniform for
every model, zipf too for GPT-OSS-120B; the routings given apply to every model given. The mxkit rows call the
MoE kernels directly (they take no backend: there is no ``--backend`` option). Modes: ``w4a16`` times
:func:`mxkit.kernels.moe.moe_triton` (bf16 tokens, MXFP4 experts read as MX bytes); ``w8a16`` the same with
MXFP8 E4M3 experts (the same random weights quantized to MXFP8; the peers then run on their bf16 values);
``w4a8`` times ``mxkit.quantize_fp8_rowwise`` plus :func:`mxkit.kernels.moe.moe_w4a8_triton` (experts folded to
E4M3 once: "pack µs"); ``mxfp4`` :func:`mxkit.kernels.moe.moe_mxfp4_triton` (MXFP4 x MXFP4: the tokens and the
intermediate quantized to MXFP4 and folded inside the call, experts folded once).

Peers (bf16 experts dequantized once, outside the timing, but for ``dequant-bf16``): ``grouped-mm-gemms``
(the two ``torch._grouped_mm`` bf16 GEMMs alone on tokens already sorted by expert, activation excluded: the
peer of ANCHORS.md and of the issue's targets; the × column), ``grouped-mm-bf16`` (the whole layer around them in
eager PyTorch: gather, gate_up, GPT-OSS activation, down, weighted combine), ``loop-bf16`` (one cuBLAS matmul per
expert that received tokens) and ``dequant-bf16`` (HF transformers' fallback: the MXFP4 experts dequantized to bf16
on every call, then as ``grouped-mm-bf16``). The full-layer peers' outputs are held to a sanity bound of 2e-2
(``PEER_BOUND``; bf16 arithmetic throughout reads ~5e-3; no bound in mode ``mxfp4``, checked against MXFP4 tokens);
``grouped-mm-gemms`` is checked once on 64 of its rows against each row's expert multiplied alone.

Up to ``--graph-tokens`` tokens (default 64, decode) every implementation is captured in a CUDA graph and the
replay is timed, as a serving engine runs decode steps; above, eager calls behind the harness's GPU spin.

Bytes, as in ``mxkit bench gemm`` (the problem's, whatever copy a path reads): "% of floor" is the MX bytes
(elements and E8M0 scales) of the experts the routing touches, both GEMMs, at the same-run copy bandwidth, in every
mode (the ``w4a8`` / ``mxfp4`` kernels read an E4M3 fold of about twice an MXFP4 copy's bytes, so theirs is a lower
bound); "GB/s" adds the bf16 tokens read and the output written. Numerics: on up to 64 tokens,
‖y − y64‖ / ‖y64‖ against :func:`mxkit.moe_reference.moe_reference`
(the intermediate rounded to bf16 as the kernels do): bound 1.5 × the bf16 rounding of y64
(``w4a16``, ``w8a16``); 0.1 for ``w4a8`` (FP8 activations against the bf16-activation reference: a sanity bound,
not the exactness one); ``mxfp4`` against its twin :func:`mxkit.moe_reference.moe_mxfp4_reference` with 0.02 (the
twin's float64 activation may move an intermediate element by one FP4 step on a rounding boundary).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import timing
from .timing import BenchUnavailable, Column, Impl

NAME = "moe"
HELP = "GPT-OSS MoE experts (MXFP4): µs, TFLOP/s, × torch._grouped_mm bf16, touched-weight bytes, error"

MODELS = {"gpt-oss-120b": 128, "gpt-oss-20b": 32}  # experts
HIDDEN = INTER = 2880
TOP_K = 4
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
ROUTINGS = ("uniform", "zipf")
MODES = ("w4a16", "w4a8", "w8a16", "mxfp4")
EXPERT_FORMAT = {"w4a16": "mxfp4", "w4a8": "mxfp4", "w8a16": "mxfp8_e4m3", "mxfp4": "mxfp4"}
MODE_TITLES = {"w4a16": "bf16 tokens x MXFP4 experts", "w4a8": "FP8 rowwise tokens x MXFP4 experts",
               "w8a16": "bf16 tokens x MXFP8 experts", "mxfp4": "MXFP4 tokens x MXFP4 experts"}
PEERS = ("grouped-mm-gemms", "grouped-mm-bf16", "loop-bf16", "dequant-bf16")
PEER_LABELS = {"grouped-mm-gemms": "_grouped_mm GEMMs", "grouped-mm-bf16": "bf16 layer", "loop-bf16": "loop bf16",
               "dequant-bf16": "dequant+bf16"}
REF_IMPL = "grouped-mm-gemms"
SAMPLE_TOKENS = 64
BYTES_PER_ELEMENT = {"mxfp4": 0.5 + 1 / 32, "mxfp8_e4m3": 1 + 1 / 32}  # MX elements + a scale byte per 32
PEER_BOUND = 2e-2  # the bf16 peers' sanity bound (bf16 intermediates: ~5e-3; a wrong layout or a dropped term: ~1)


def _peer_bound(case) -> float | bool:
    """The full-layer bf16 peers against the bf16-token reference (mode ``mxfp4`` is checked against MXFP4 tokens,
    another product: reported, no bound)."""
    return PEER_BOUND if case.mode != "mxfp4" else False
QUICK = {"models": ("gpt-oss-120b",), "tokens": (1, 64, 4096), "routings": ("uniform",)}


def routing(T: int, E: int, kind: str, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights (T, 4) float32, topk_ids (T, 4) int32), fixed by the case (seed 0)."""
    g = torch.Generator().manual_seed(0)
    if kind == "uniform":
        logits = torch.randn(T, E, generator=g)
    else:  # Zipf: Gumbel top-k over log(1 / (e + 1)) draws expert e with weight 1 / (e + 1), without repeats
        gumbel = -torch.log(-torch.log(torch.rand(T, E, generator=g).clamp_min(1e-20)))
        logits = gumbel - torch.log(torch.arange(1, E + 1, dtype=torch.float32))
    top, ids = torch.topk(logits, TOP_K, dim=-1)
    return torch.softmax(top, -1).to(device), ids.to(torch.int32).to(device)


@dataclass(frozen=True)
class MoeCase:
    model: str
    T: int
    routing: str
    mode: str
    dtype: torch.dtype = torch.bfloat16

    op = property(lambda self: self.mode)
    fmt_name = property(lambda self: f"{self.model} {self.routing}")
    label = property(lambda self: f"T={self.T}")
    problem_key = property(lambda self: (self.model, self.routing, self.T))  # (timing's discard after a new problem)
    note = ""
    E = property(lambda self: MODELS[self.model])
    flops = property(lambda self: 2 * self.T * TOP_K * 3 * HIDDEN * INTER)

    def experts_hit(self) -> int:
        return int(torch.unique(routing(self.T, self.E, self.routing)[1]).numel())

    def floor_bytes(self) -> int:
        """The layer's unavoidable bytes: the touched experts' gate_up (2I, H) and down (H, I) as MX bytes (elements
        and E8M0 scales), in every mode (the fold modes' kernels read an E4M3 copy of about twice an MXFP4 one's
        bytes: as in ``mxkit bench gemm``, the problem's bytes count, not a path's copy)."""
        return int(self.experts_hit() * 3 * HIDDEN * INTER * BYTES_PER_ELEMENT[EXPERT_FORMAT[self.mode]])

    def nbytes(self) -> int:
        """Bytes moved at the least: :meth:`floor_bytes` plus the bf16 tokens read and the bf16 output written."""
        return self.floor_bytes() + 2 * 2 * self.T * HIDDEN

    def invalid_reason(self) -> Optional[str]:
        return None

    def make_inputs(self, ctx) -> "Inputs":
        return make_inputs(self, ctx)

    def expected(self, inp: "Inputs") -> tuple[torch.Tensor, torch.Tensor]:
        from ..moe_reference import moe_reference

        idx = torch.arange(self.T, device=inp.x.device)
        if self.T > SAMPLE_TOKENS:
            idx = torch.randperm(self.T, device=inp.x.device)[:SAMPLE_TOKENS].sort().values
        w = inp.weights
        if self.mode == "mxfp4":
            from ..moe_reference import moe_mxfp4_reference
            from ..ops import quantize

            y64 = moe_mxfp4_reference(quantize(inp.x[idx], "mxfp4_e2m1"), w.w1, w.b1, w.w2, w.b2, inp.tw[idx],
                                      inp.ids[idx], out_dtype=torch.float64)
            return idx, y64
        y64 = moe_reference(inp.x[idx], w.w1, w.b1, w.w2, w.b2, inp.tw[idx], inp.ids[idx], out_dtype=torch.float64,
                            intermediate_dtype=torch.bfloat16)
        return idx, y64

    def check(self, out: Any, expected: tuple[torch.Tensor, torch.Tensor]) -> dict:
        idx, y64 = expected
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (self.T, HIDDEN):
            return {"check": "FAIL", "note": f"output {getattr(out, 'shape', type(out).__name__)}"}
        err = ((out[idx].double() - y64).norm() / y64.norm()).item()
        bound = 0.1 if self.mode == "w4a8" else 0.02 if self.mode == "mxfp4" else \
            1.5 * ((y64.to(torch.bfloat16).double() - y64).norm() / y64.norm()).item()
        return {"err": err, "err_bound": bound, "check": "ok" if err <= bound else "FAIL"}


@dataclass
class Weights:
    w1: Any  # MXTensor (E, 2I, H), gate / up interleaved (GPT-OSS)
    b1: torch.Tensor
    w2: Any  # MXTensor (E, H, I)
    b2: torch.Tensor
    w1_bf16: torch.Tensor  # (E, H, 2I): the peers' bf16 experts, K-major like HF's GptOssExperts
    w2_bf16: torch.Tensor


@dataclass
class Inputs:
    x: torch.Tensor
    tw: torch.Tensor
    ids: torch.Tensor
    weights: Weights


_WEIGHTS: dict = {}  # model -> Weights (one model at a time: its experts fill GBs)


def weights(model: str, device, fmt: str = "mxfp4") -> Weights:
    """The experts of ``model`` in MX format ``fmt`` (the same random values whatever the format), kept."""
    if (model, fmt) not in _WEIGHTS:
        import mxkit

        _WEIGHTS.clear()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        E = MODELS[model]
        g = torch.Generator(device=device).manual_seed(1)

        def mx(*shape):
            return mxkit.quantize(torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g) * 0.05, fmt)

        w1, w2 = mx(E, 2 * INTER, HIDDEN), mx(E, HIDDEN, INTER)
        b1 = torch.randn(E, 2 * INTER, device=device, generator=g) * 0.1
        b2 = torch.randn(E, HIDDEN, device=device, generator=g) * 0.1
        _WEIGHTS[(model, fmt)] = Weights(w1, b1, w2, b2, mxkit.dequantize(w1, torch.bfloat16).transpose(1, 2),
                                         mxkit.dequantize(w2, torch.bfloat16).transpose(1, 2))
    return _WEIGHTS[(model, fmt)]


def make_inputs(case: MoeCase, ctx) -> Inputs:
    tw, ids = routing(case.T, case.E, case.routing, ctx.device)
    x = torch.randn(case.T, HIDDEN, device=ctx.device, dtype=case.dtype)
    return Inputs(x, tw, ids, weights(case.model, ctx.device, EXPERT_FORMAT[case.mode]))


# -------------------------------------------------------------------------------------------------------
# implementations


def graphed(fn):
    """``fn`` captured in a CUDA graph (after two warm-up calls on a side stream); returns the replay, which gives
    the captured output tensor and keeps ``fn`` (and the input tensors its closure holds) alive."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out

    replay.keep = fn  # the tensors fn's closure holds are the graph's inputs: they must outlive it
    return replay


def _maybe_graphed(make):
    """An Impl.make whose callable is graphed for cases of at most ``GRAPH_TOKENS[0]`` tokens."""
    def wrapped(case: MoeCase, inp: Inputs, ctx):
        made = make(case, inp, ctx)
        fn, extra = made if isinstance(made, tuple) else (made, {})
        if case.T <= GRAPH_TOKENS[0] and ctx.device == "cuda":
            fn, extra = graphed(fn), {**extra, "note": "CUDA graph replay"}
        return fn, extra

    return wrapped


GRAPH_TOKENS = [64]  # set by --graph-tokens


def _mxkit(case: MoeCase, inp: Inputs, ctx):
    from ..kernels.matmul_details._w4a16_wgmma import available as wgmma_available
    from ..kernels.moe import (fold_experts, mma_max_pairs, moe_mxfp4_triton, moe_triton, moe_w4a8_triton,
                               pack_experts_mma, pack_experts_wgmma)
    from ..ops import quantize_fp8_rowwise

    w, x, tw, ids = inp.weights, inp.x, inp.tw, inp.ids
    max_pairs = mma_max_pairs(x.device)
    if case.mode == "w8a16":  # MXFP8 experts: MXMoE's copy in the wgmma layout for prefill; decode reads them
        if ids.numel() <= max_pairs or wgmma_available(x.device) is not None:
            return lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids)

        def pack():
            return pack_experts_wgmma(w.w1, act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(w.w2)
        packed = pack()
        return (lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)), \
            {"pack_us": timing.time_once_made(ctx, pack)}
    if case.mode == "w4a16":  # (MXFP4 on the decode kernel: the envelope's per-expert part holds)
        if ids.numel() > mma_max_pairs(x.device, w.w1.shape[0]) and wgmma_available(x.device) is not None:
            return lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids)
        # the experts packed once in the decode kernel's layout, which the decode (up to max_pairs pairs) and
        # the prefill kernels both read (MXMoE keeps this one copy per buffer)
        packed = (pack_experts_mma(w.w1), pack_experts_mma(w.w2))
        pack_us = timing.time_once_made(ctx, lambda: (pack_experts_mma(w.w1), pack_experts_mma(w.w2)))
        return (lambda: moe_triton(x, w.w1, w.b1, w.w2, w.b2, tw, ids, packed=packed)), {"pack_us": pack_us}
    f1, f2 = fold_experts(w.w1), fold_experts(w.w2)
    if f1 is None or f2 is None:
        raise BenchUnavailable("an expert row does not fold (block scales spanning more than 14)")
    pack_us = timing.time_once_made(ctx, lambda: (fold_experts(w.w1), fold_experts(w.w2)))
    if case.mode == "mxfp4":
        return (lambda: moe_mxfp4_triton(x, f1, w.b1, f2, w.b2, tw, ids)), {"pack_us": pack_us}
    return (lambda: moe_w4a8_triton(quantize_fp8_rowwise(x), f1, w.b1, f2, w.b2, tw, ids)), {"pack_us": pack_us}


def _act(h: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU on interleaved gate / up columns (transformers' GptOssExperts), in h's dtype."""
    gate, up = h[..., ::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


def _sorted(inp: Inputs, E: int):
    flat = inp.ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    return flat, order, offs


def _check_gemms(y: torch.Tensor, xs: torch.Tensor, w: Weights, e_sorted: torch.Tensor, rows: int = 64) -> None:
    """The × reference (``_grouped_mm`` GEMMs alone, no bias / activation / combine) checked on ``rows`` of its
    sorted rows against each row's expert multiplied alone (float32, h rounded to bf16 as the peer does), within
    :data:`PEER_BOUND`: a wrong ``offs`` or layout would still time plausibly. Raises RuntimeError (the peer's row
    then reads ``error``, and the × column n/a)."""
    idx = torch.linspace(0, xs.shape[0] - 1, min(rows, xs.shape[0]), device=xs.device).long().unique()
    want = torch.empty(idx.numel(), y.shape[1], device=y.device)
    for e in e_sorted[idx].unique().tolist():
        r = e_sorted[idx] == e
        h = (xs[idx[r]].float() @ w.w1_bf16[e].float()[:, :INTER]).to(torch.bfloat16)
        want[r] = h.float() @ w.w2_bf16[e].float()
    err = ((y[idx].float() - want).norm() / want.norm().clamp_min(1e-30)).item()
    if not err <= PEER_BOUND:
        raise RuntimeError(f"the _grouped_mm GEMMs' rows are {err:.2e} from each row's expert alone "
                           f"(bound {PEER_BOUND:g})")


def _grouped(case: MoeCase, inp: Inputs, ctx, dequant: bool = False, gemms_only: bool = False):
    import mxkit

    if not hasattr(torch, "_grouped_mm"):
        raise BenchUnavailable("torch._grouped_mm is not in this torch")
    w, x = inp.weights, inp.x
    flat, order, offs = _sorted(inp, case.E)
    tok = order // TOP_K
    rw = inp.tw.reshape(-1)[order].to(x.dtype)[:, None]
    e_sorted = flat[order]

    def gemms():
        h = torch._grouped_mm(xs, w.w1_bf16, offs=offs)[:, :INTER]  # (a strided view: no copy kernel timed)
        return torch._grouped_mm(h, w.w2_bf16, offs=offs)

    xs = x[tok].contiguous()
    if gemms_only:
        _check_gemms(gemms(), xs, w, e_sorted)
        return gemms

    def fn():
        w1 = mxkit.dequantize(w.w1, torch.bfloat16).transpose(1, 2) if dequant else w.w1_bf16
        w2 = mxkit.dequantize(w.w2, torch.bfloat16).transpose(1, 2) if dequant else w.w2_bf16
        h = torch._grouped_mm(x[tok], w1, offs=offs) + w.b1[e_sorted].to(x.dtype)
        y = torch._grouped_mm(_act(h), w2, offs=offs) + w.b2[e_sorted].to(x.dtype)
        return torch.zeros_like(x).index_add_(0, tok, y * rw)

    return fn


def _loop(case: MoeCase, inp: Inputs, ctx):
    w, x = inp.weights, inp.x
    flat, order, offs = _sorted(inp, case.E)
    bounds = [0, *offs.tolist()]
    groups = [(e, order[bounds[e]:bounds[e + 1]]) for e in range(case.E) if bounds[e + 1] > bounds[e]]
    groups = [(e, pairs // TOP_K, inp.tw.reshape(-1)[pairs].to(x.dtype)[:, None]) for e, pairs in groups]

    def fn():
        out = torch.zeros_like(x)
        for e, tok, rw in groups:
            h = x[tok] @ w.w1_bf16[e] + w.b1[e].to(x.dtype)
            out.index_add_(0, tok, (_act(h) @ w.w2_bf16[e] + w.b2[e].to(x.dtype)) * rw)
        return out

    return fn


IMPLS: dict[str, Impl] = {i.name: i for i in (
    Impl("mxkit", _maybe_graphed(_mxkit), checked=True),
    Impl("grouped-mm-gemms", _maybe_graphed(lambda c, i, x: _grouped(c, i, x, gemms_only=True))),
    Impl("grouped-mm-bf16", _maybe_graphed(_grouped), checked=True, bounded=_peer_bound),
    Impl("loop-bf16", _maybe_graphed(_loop), checked=True, bounded=_peer_bound,
         skip=lambda c: "a Python loop over experts: T <= 4096 only" if c.T > 4096 else None),
    Impl("dequant-bf16", _maybe_graphed(lambda c, i, x: _grouped(c, i, x, dequant=True)), checked=True,
         bounded=_peer_bound),
)}


# -------------------------------------------------------------------------------------------------------
# table and command line


def table_columns(peers) -> list[Column]:
    main = timing.main_value
    return [Column("mode", lambda d: d["op"], right=False), Column("experts, routing", lambda d: d["fmt"], right=False),
            Column("tokens", lambda d: d["shape"], right=False), Column("µs", main("us", ".1f")),
            Column("µs (write flush)", main("us_write", ".1f")), Column("TFLOP/s", main("tflops", ".1f")),
            Column("GB/s", main("gbps", ".0f")),  # MX expert bytes + tokens in and out (nbytes)
            Column("% of floor", main("pct_floor", ".0f")),  # MX expert bytes at the copy bandwidth
            Column("× _grouped_mm GEMMs", main("vs_ref", ".2f")), Column("pack µs", main("pack_us", ".0f")),
            *timing.error_peer_note_columns(peers, PEER_LABELS)]


MAX_TOKENS = 1 << 20  # (the routing of a case is made on the host: T x E floats)


def _token_count(text: str) -> int:
    try:
        t = int(text)
    except ValueError:
        raise ValueError(f"a token count is an integer, got {text!r}") from None
    if not 1 <= t <= MAX_TOKENS:
        raise ValueError(f"a token count is 1 to {MAX_TOKENS}, got {t}")
    return t


def add_arguments(p: argparse.ArgumentParser) -> None:
    csv = timing.csv_arg
    p.add_argument("--models", type=csv(timing.choice("model", MODELS)), default=None,
                   help=f"comma list of {', '.join(MODELS)} (default both; gpt-oss-120b with --quick)")
    p.add_argument("--tokens", type=csv(_token_count), default=None, help="comma list of token counts, 1 to "
                   f"{MAX_TOKENS} (default "
                   + ",".join(map(str, TOKENS)) + "; " + ",".join(map(str, QUICK["tokens"])) + " with --quick)")
    p.add_argument("--routings", type=csv(timing.choice("routing", ROUTINGS)), default=None,
                   help="uniform and/or zipf, each for every model given (default: uniform, and zipf for "
                        "gpt-oss-120b; uniform with --quick)")
    p.add_argument("--modes", type=csv(timing.choice("mode", MODES)), default=MODES[:2],
                   help="w4a16, w4a8, w8a16 (MXFP8 experts) and / or mxfp4 (MXFP4 x MXFP4) (default w4a16,w4a8)")
    p.add_argument("--quick", action="store_true",
                   help="defaults for the options not given: GPT-OSS-120B, tokens 1, 64, 4096, uniform routing")
    p.add_argument("--peers", type=timing.peers_arg("peer", PEERS), default=PEERS,
                   help=f"comma list of {', '.join(PEERS)} or none (default all)")
    p.add_argument("--graph-tokens", type=timing.nonnegative_int, default=64,
                   help="time CUDA-graph replays up to this many tokens (default 64; 0: eager everywhere)")
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    timing.add_common_arguments(p, backend=False)  # the MoE kernels are called directly: no backend to choose


def cases_from_args(args) -> list[MoeCase]:
    """The cases of the options; ``--quick`` fills in only the options left out (:data:`QUICK`). Without
    ``--routings``, zipf runs for GPT-OSS-120B only. ValueError for a token count below 1 or no case at all."""
    quick = QUICK if args.quick else {}
    models = args.models or quick.get("models", tuple(MODELS))
    tokens = args.tokens or quick.get("tokens", TOKENS)
    routings = args.routings or quick.get("routings")
    if any(t <= 0 for t in tokens):
        raise ValueError(f"token counts must be positive, got {tokens}")
    cases = [MoeCase(model, T, r, m) for model in models for r in (routings or ROUTINGS) for T in tokens
             for m in args.modes if routings or r == "uniform" or model == "gpt-oss-120b"]
    if not cases:
        raise ValueError("the options select no case (models, tokens, routings and modes must each name one)")
    return cases


def run(args) -> int:
    """Entry point of ``mxkit bench moe``. 0: ran; 1: an mxkit row raised or is past its error bound; 2: cannot run
    here, or the options select no case."""
    try:
        cases = cases_from_args(args)
    except ValueError as e:
        return timing.usage_error(str(e))
    GRAPH_TOKENS[0] = args.graph_tokens
    return timing.run_benchmark(args, cases, IMPLS, what="mxkit bench moe", stem="bench_moe", peers=args.peers,
                                columns=table_columns(args.peers), ref_impl=REF_IMPL,
                                title="mxkit bench moe — GPT-OSS experts — " + "; ".join(
                                    MODE_TITLES[m] for m in dict.fromkeys(c.mode for c in cases)),
                                chart=("tflops", "TFLOP/s (read flush)"),
                                list_line=lambda c: f"{c.mode:6s} {c.fmt_name:22s} {c.label:8s} "
                                                    f"{c.flops / 1e9:9.1f} GFLOP {c.nbytes() / 1e6:8.1f} MB")
