"""``mxkit bench decode``: end-to-end greedy decode of a Hugging Face causal LM with a real architecture. The
model is built from a config written here (no hub access) with random weights of the real shapes. It runs in
bf16 and after :func:`mxkit.quantize_model` to MX weights, eager and with CUDA graphs.

Models:
* ``llama-3-8b`` (default): Llama-3-8B's config. Its bf16 weights (16 GB) fit an H100 or an H200.
* ``gpt-oss-20b`` (when the installed transformers has GptOss): GPT-OSS-20B's config, MoE included (32 experts,
  top-4; its bf16 weights, 42 GB, fit an H100). The bf16 model runs transformers' ``grouped_mm`` experts (two
  ``torch._grouped_mm`` over the tokens sorted on the device: no host sync, so CUDA graphs capture it; on CPU
  transformers' default). With graphs, prompt + tokens + 2 must fit the 128-token sliding window: the
  sliding layers keep their length in a Python int, frozen at capture.
* ``tiny-llama``, ``tiny-gpt-oss``: 2 layers of hidden 64, for smoke tests on CPU.

``--layers N`` keeps the first N decoder layers. Every format starts from the same weights (one seed).
quantize_model converts every ``nn.Linear`` except ``lm_head``; the head stays bf16 as in MX checkpoints such as
GPT-OSS, unless ``--quantize-head`` is given. A model's MoE blocks become :class:`mxkit.nn.MXMoE` layers with
their experts in the format (:func:`mxkit.nn.swap_gpt_oss_moe`: the router stays bf16). A format spelled
``mxfp4+fused`` also runs the sibling projections that read the same input (q / k / v, gate / up) as one GEMM
each (``quantize_model(fuse=True)``, :mod:`mxkit.nn.fused`); ``mxfp4+fusedmlp`` does too, but runs each gated
MLP's gate / up GEMM with its SiLU product in one launch first (:func:`mxkit.nn.fuse_gated_mlp`, at one token a
step); the bf16 model it is compared with stays HF's unfused one. ``mxfp4+experts`` quantizes the MoE experts only
(a GPT-OSS checkpoint's split: MXFP4 experts, bf16 attention). One suffix a format at most.

Method, per (format, batch): a transformers ``StaticCache`` of prompt + tokens + 2 positions. The prefill of a
random prompt of ``--prompt`` tokens is not timed. Then ``--tokens`` greedy steps. One step runs the model on
the (batch, 1) token ids at the position held in a device tensor, and the last logits' argmax and the next
position are written back into those tensors. The step reads nothing on the host, so it can be replayed.

* ``eager``: the step in a Python loop, after one untimed run.
* ``graphs``: the step captured once in a ``torch.cuda.CUDAGraph`` after two warm-up steps on a side stream;
  the loop is ``graph.replay()``. It compiles nothing and records MXLinear's launches as they run. It needs a
  step without host syncs, which mxkit's bf16 x MX paths (the decode kernel, dense-exact) are.
* ``compiled`` (not in the default modes: it compiles each model): the model's forward under
  ``torch.compile`` (Inductor, ``dynamic=False``; the prefill stays eager), then captured and replayed as in
  ``graphs``. Inductor fuses the small kernels of the attention, rotary embedding, RMSNorm and residual adds;
  each MXLinear (or fused part) is one custom op that runs its kernels eagerly, recorded by the capture. bf16 and
  MX models alike.

Time per run: wall clock between two device syncs around the loop; the median over ``--repeats`` runs, each
with a reset cache and a fresh prefill. ms per token = time / tokens (one token per sequence per step);
tokens/s = batch · tokens / time. The GEMM path column is what :func:`mxkit.gemm_plan` picks for the first
quantized layer at M = batch.

``--order interleaved`` (the default) builds every format's model first and holds them all (Llama-3-8B in bf16,
MXFP4 and MXFP8: ~32 GB; GPT-OSS-20B: ~80 GB, past an H100), then, per (batch, mode), runs repeat k of every
format before repeat k + 1, the formats' order rotated by one each repeat. × bf16 is then the (log-space) median
of the per-repeat ratios, each from a bf16 run and a format's run seconds apart, and ``x_bf16_lo`` /
``x_bf16_hi`` their range: the eager steps are host-bound, and the host's speed drifts by tens of percent over
the minutes that lie between two formats' runs in a sequential order. (ms per token stays each format's own
median, so under such a drift it need not divide into × bf16: the paired ratio is the measure.) ``--order
sequential`` builds, times and frees one format at a time (the memory of one model); × bf16 is then the ratio of
the two medians. Where the
models do not fit the GPU together (a build runs out of memory), an interleaved run says so and runs sequential.
Target (mxkit's, for information): MXFP4 ≥ 2.5× bf16 tokens/s at batch 1 with graphs, ≥ 1.5× eager.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import output, timing
from .output import Column, fmt_num

NAME = "decode"
HELP = ("end-to-end decode of a real LM architecture (Llama-3-8B, GPT-OSS-20B), bf16 vs MXFP4 / MXFP8 weights, "
        "eager and graphs")

MODES = ("eager", "graphs")  # the default
MODE_CHOICES = MODES + ("compiled",)
ORDERS = ("interleaved", "sequential")
WARMUP_STEPS = 2  # eager steps before a capture (Triton compiles, cuBLAS workspaces)
QUICK = dict(layers=4, tokens=16, repeats=1)
FUSED = "+fused"  # a format suffix: quantize_model(..., fuse=True)
FUSED_MLP = "+fusedmlp"  # a format suffix: fuse_gated_mlp, then fuse_siblings (q / k / v)
EXPERTS = "+experts"  # a format suffix: only the MoE experts quantized (swap_gpt_oss_moe; no quantize_model)
TARGETS = {"eager": 1.5, "graphs": 2.5, "compiled": 2.5}  # MXFP4 × bf16 tokens/s at batch 1 (issue #23)
_LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                   rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, bos_token_id=128000,
                   eos_token_id=128001, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
_GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                    num_key_value_heads=8, head_dim=64, vocab_size=201088, sliding_window=128,
                    max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False,
                    num_local_experts=32, num_experts_per_tok=4, swiglu_limit=7.0,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False})
_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=256)
# (transformers config class, its arguments, attention implementation)
MODELS = {
    "llama-3-8b": ("LlamaConfig", _LLAMA_3_8B, "sdpa"),
    "gpt-oss-20b": ("GptOssConfig", _GPT_OSS_20B, "eager"),
    "tiny-llama": ("LlamaConfig", dict(_LLAMA_3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                       bos_token_id=1, eos_token_id=2), "sdpa"),
    "tiny-gpt-oss": ("GptOssConfig", dict(_GPT_OSS_20B, **_TINY, intermediate_size=64, num_local_experts=4,
                                          num_experts_per_tok=2), "eager"),
}


@dataclass
class DecodeRow:
    """One (format, batch, mode) run. ``ms_per_token`` / ``tokens_per_s``: medians over the repeats;
    ``x_bf16``: tokens/s over bf16's at the same batch and mode (interleaved: the median of the per-repeat ratios,
    ``x_bf16_lo`` / ``_hi`` their range). ``status``: ok | error (``note`` says why)."""

    model: str
    fmt: str
    batch: int
    mode: str
    layers: int
    prompt: int
    tokens: int
    ms_per_token: Optional[float] = None
    tokens_per_s: Optional[float] = None
    x_bf16: Optional[float] = None
    path: str = ""
    status: str = "ok"
    note: str = ""
    x_bf16_lo: Optional[float] = None  # the range of the per-repeat ratios (--order interleaved)
    x_bf16_hi: Optional[float] = None


def model_layers(name: str) -> int:
    return MODELS[name][1]["num_hidden_layers"]


def build_model(name: str, *, layers: Optional[int] = None, device: str = "cuda", seed: int = 0,
                dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The transformers causal LM of :data:`MODELS` ``name`` with its first ``layers`` decoder layers (default all),
    random weights (transformers' init after ``torch.manual_seed(seed)``) in ``dtype`` on ``device``, in eval mode.
    Raises ValueError for a layer count out of range or a model this transformers lacks."""
    import transformers

    cls_name, kw, attn = MODELS[name]
    n = kw["num_hidden_layers"]
    if layers is not None and not 1 <= layers <= n:
        raise ValueError(f"--layers={layers}: {name} has {n} decoder layers")
    if not hasattr(transformers, cls_name):
        raise ValueError(f"{name} needs transformers.{cls_name}, which transformers {transformers.__version__} lacks")
    config = getattr(transformers, cls_name)(**dict(kw, num_hidden_layers=layers or n))
    extra = {}
    if kw.get("num_local_experts") and device != "cpu" and _has_experts_implementation("grouped_mm"):
        extra["experts_implementation"] = "grouped_mm"  # no host sync: CUDA graphs capture it
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn, **extra)
    return model.eval()


def _has_experts_implementation(name: str) -> bool:
    """Whether the installed transformers has the MoE experts implementation ``name`` (transformers 5)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    return name in ALL_EXPERTS_FUNCTIONS


class Decoder:
    """Greedy decode of ``batch`` random prompts of ``prompt`` tokens with a ``StaticCache``. :meth:`step` decodes one
    token per sequence from device tensors only (``ids`` (batch, 1), ``pos`` (1, 1)), so a CUDA graph can replay it.

    With transformers' ``eager`` attention (GPT-OSS), whose mask builder copies a host scalar to the GPU on every
    call (not capturable), a step passes its own masks: the additive (batch, 1, 1, cache length) mask of keys at
    positions <= ``pos``, made on the device, for the full and the sliding layers alike (when the cache fits the
    sliding window, as ``graphs`` needs: every cached key is then inside the window)."""

    def __init__(self, model: torch.nn.Module, batch: int, prompt: int, tokens: int, seed: int = 0) -> None:
        from transformers import StaticCache

        device = next(model.parameters()).device
        self.model = model
        length = prompt + tokens + WARMUP_STEPS
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        # the cache argument's name: ``cache`` from transformers 5.2x (``past_key_values`` deprecated), before it
        # ``past_key_values``
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.mask = None
        window = getattr(model.config, "sliding_window", None)
        if model.config._attn_implementation == "eager" and (window is None or length <= window):
            dtype = next(model.parameters()).dtype
            self.mask = torch.empty(batch, 1, 1, length, dtype=dtype, device=device)
            self.key_pos = torch.arange(length, device=device)
            self.mask_values = torch.tensor([torch.finfo(dtype).min, 0.0], dtype=dtype, device=device)
        gen = torch.Generator().manual_seed(seed)
        self.prompt_ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=gen).to(device)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.step_forward = model  # what step calls: the model, or its compiled forward (compile)

    def compile(self, reset: bool = True, models: int = 1) -> None:
        """Run :meth:`step` through ``torch.compile`` of the model's forward (``dynamic=False``: one graph for
        the (batch, 1) step; the prefill stays eager). The first step compiles. Dynamo's caches are reset
        first (an earlier model's or batch's compiles count against its recompile limit; ``reset=False`` keeps
        them, for ``models`` models compiled side by side) and the limit raised to twice the layer count per
        model (and kept raised): where a module graph-breaks (with gradients, or a module of another library),
        each decoder layer's attention is its own frame, specialised on its ``layer_idx``, and past the default
        limit (8) the later layers would run uncompiled."""
        import torch._dynamo

        if reset:
            torch._dynamo.reset()
        need = models * (2 * self.model.config.num_hidden_layers + 8)
        if torch._dynamo.config.recompile_limit < need:
            torch._dynamo.config.recompile_limit = need
        self.step_forward = torch.compile(self.model.forward, dynamic=False)

    def _next(self, ids: torch.Tensor, pos: torch.Tensor, forward: Callable, **kw) -> None:
        kw[self.cache_arg] = self.cache
        logits = forward(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **kw).logits
        self.ids.copy_(logits[:, -1:].argmax(-1))

    def prefill(self) -> None:
        """Empty the cache, run the prompt, leave its next token in ``ids`` and its length in ``pos``."""
        self.cache.reset()
        n = self.prompt_ids.shape[1]
        self._next(self.prompt_ids, torch.arange(n, device=self.pos.device)[None], self.model)
        self.pos.fill_(n)

    def step(self) -> None:
        kw = {}
        if self.mask is not None:  # 0 where the key's position <= pos, the dtype's min elsewhere
            self.mask.copy_(self.mask_values[(self.key_pos <= self.pos).long()].expand_as(self.mask))
            kw["attention_mask"] = {"full_attention": self.mask, "sliding_attention": self.mask}
        self._next(self.ids, self.pos, self.step_forward, **kw)
        self.pos.add_(1)

    def capture(self) -> "torch.cuda.CUDAGraph":
        """A CUDA graph of one :meth:`step`, after a prefill and ``WARMUP_STEPS`` steps on a side stream."""
        self.prefill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()
        return graph


def time_decode(dec: Decoder, step: Callable[[], None], tokens: int, repeats: int, sync: Callable[[], None],
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``tokens`` calls of ``step`` after a prefill, between two ``sync()`` (``repeats`` runs).
    Python's garbage collector is off while a run is timed (as ``timeit`` does; collected before each run): a
    collection of the large heap a model leaves (tens to hundreds of ms) landing in one eager run would be
    counted against the format timed then."""
    times = []
    enabled = gc.isenabled()
    try:
        for _ in range(repeats):
            dec.prefill()
            gc.collect()
            gc.disable()
            sync()
            t0 = clock()
            for _ in range(tokens):
                step()
            sync()
            times.append(clock() - t0)
            if enabled:
                gc.enable()
    finally:
        if enabled:
            gc.enable()
    return statistics.median(times)


def gemm_path(model: torch.nn.Module, batch: int) -> str:
    """What :func:`mxkit.gemm_plan` picks for the first MXLinear at M = ``batch`` ("" when there is none): for
    bf16 x, or for x quantized to the layer's activation format (MXFP8 activations: ``a8w8-mma`` also where
    the layer quantizes x inside that kernel). ``+ MXMoE`` where the model has MX experts."""
    import mxkit
    from ..nn import MXLinear, MXMoE

    moe = " + MXMoE" if any(isinstance(m, MXMoE) for m in model.modules()) else ""
    mod = next((m for m in model.modules() if isinstance(m, MXLinear)), None)
    if mod is None:
        return moe.removeprefix(" + ")
    x = torch.randn(batch, mod.in_features, dtype=torch.bfloat16, device=mod.weight_qdata.device)
    act = getattr(mod.act_format, "name", mod.act_format)
    a = mxkit.quantize(x, act) if act is not None and act.startswith("mx") else x
    return mxkit.gemm_plan(a, mod.weight_mx if mod._packed is None else mod._packed).path + moe


def _row(args, fmt: str, batch: int, mode: str, status: str = "ok", note: str = "") -> DecodeRow:
    return DecodeRow(args.model, fmt, batch, mode, args.layers or model_layers(args.model), args.prompt, args.tokens,
                     status=status, note=note)


def _build(args, fmt: str) -> torch.nn.Module:
    model = build_model(args.model, layers=args.layers, device=args.device, seed=args.seed)
    if fmt != "bf16":
        quantize(model, fmt, args.quantize_head)
    return model


def _sync(args) -> Callable[[], None]:
    return torch.cuda.synchronize if args.device == "cuda" else (lambda: None)


def _prepare(dec: Decoder, mode: str, args, sync: Callable[[], None], *, reset: bool = True,
             models: int = 1) -> Callable[[], None]:
    """The step :func:`time_decode` times in ``mode``: eager (after one untimed run: compiles, workspaces), a CUDA
    graph's replay (after one untimed replay: the first uploads the graph), or the compiled forward (captured on
    CUDA; on CPU run as eager, after an untimed run)."""
    dec.step_forward = dec.model
    if mode == "compiled":
        dec.compile(reset=reset, models=models)
    if mode == "eager" or (mode == "compiled" and args.device != "cuda"):
        time_decode(dec, dec.step, args.tokens, 1, sync)
        return dec.step
    replay = dec.capture().replay
    time_decode(dec, replay, 1, 1, sync)
    return replay


def _set_times(row: DecodeRow, times: list[float]) -> None:
    s = statistics.median(times)
    row.ms_per_token, row.tokens_per_s = 1e3 * s / row.tokens, row.batch * row.tokens / s


def _free(args) -> None:
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()


def run_format(args, fmt: str, on_row: Callable[[DecodeRow], None]) -> None:
    """``--order sequential``: build the model in ``fmt`` and time every (batch, mode); ``on_row`` gets each row
    (errors included)."""
    try:
        model = _build(args, fmt)
    except Exception as e:
        for b in args.batches:
            for mode in args.modes:
                on_row(_row(args, fmt, b, mode, "error", f"build / quantize: {output.reason(e)}"))
        return
    sync = _sync(args)
    try:
        with torch.no_grad():
            for b in args.batches:
                try:  # (a batch whose cache or first GEMM plan does not fit: its rows, the other batches go on)
                    dec, path = Decoder(model, b, args.prompt, args.tokens, seed=args.seed), gemm_path(model, b)
                except Exception as e:
                    for mode in args.modes:
                        on_row(_row(args, fmt, b, mode, "error", f"decoder: {output.reason(e)}"))
                    _free(args)
                    continue
                for mode in args.modes:
                    row = _row(args, fmt, b, mode)
                    row.path = path
                    try:
                        step = _prepare(dec, mode, args, sync)
                        _set_times(row, [time_decode(dec, step, args.tokens, args.repeats, sync)])
                    except Exception as e:
                        row.status, row.note = "error", f"{mode}: {output.reason(e)}"
                    on_row(row)
                del dec
    finally:
        del model
        _free(args)


def run_interleaved(args, on_row: Callable[[DecodeRow], None]) -> bool:
    """``--order interleaved``: build every format's model, then per (batch, mode) run repeat k of every format
    before repeat k + 1 (the order rotated by one a repeat) and set × bf16 from the per-repeat ratios. A format
    that fails (build, capture or a run) gets error rows and leaves the others running. False, having run nothing
    and freed what it built, where the models do not fit the GPU together."""
    models: dict[str, torch.nn.Module] = {}
    failed = []
    for fmt in args.formats:
        try:
            models[fmt] = _build(args, fmt)
        except torch.cuda.OutOfMemoryError:
            models.clear()
            _free(args)
            return False
        except Exception as e:
            failed += [_row(args, fmt, b, mode, "error", f"build / quantize: {output.reason(e)}")
                       for b in args.batches for mode in args.modes]
    for row in failed:
        on_row(row)
    sync = _sync(args)
    with torch.no_grad():
        for b in args.batches:
            decs, paths = {}, {}
            for fmt, m in models.items():
                try:  # (a format whose cache or first GEMM plan does not fit: its rows, the others go on)
                    decs[fmt], paths[fmt] = Decoder(m, b, args.prompt, args.tokens, seed=args.seed), gemm_path(m, b)
                except Exception as e:
                    for mode in args.modes:
                        on_row(_row(args, fmt, b, mode, "error", f"decoder: {output.reason(e)}"))
            for mode in args.modes:
                rows = {fmt: _row(args, fmt, b, mode) for fmt in decs}
                steps: dict[str, Callable[[], None]] = {}
                for i, (fmt, dec) in enumerate(decs.items()):
                    rows[fmt].path = paths[fmt]
                    try:
                        steps[fmt] = _prepare(dec, mode, args, sync, reset=i == 0, models=len(decs))
                    except Exception as e:
                        rows[fmt].status, rows[fmt].note = "error", f"{mode}: {output.reason(e)}"
                times: dict[str, list[float]] = {fmt: [] for fmt in steps}
                for k in range(args.repeats):
                    order = list(steps)
                    for fmt in order[k % len(order):] + order[:k % len(order)] if order else []:
                        try:
                            times[fmt].append(time_decode(decs[fmt], steps[fmt], args.tokens, 1, sync))
                        except Exception as e:
                            rows[fmt].status, rows[fmt].note = "error", f"{mode}: {output.reason(e)}"
                            del steps[fmt], times[fmt]
                for fmt, t in times.items():
                    _set_times(rows[fmt], t)
                if "bf16" in times:
                    for fmt, t in times.items():
                        ratios = [ref / x for ref, x in zip(times["bf16"], t)]
                        # the median in log space: with an even count the geometric mean of the middle two
                        rows[fmt].x_bf16 = math.exp(statistics.median(math.log(v) for v in ratios))
                        rows[fmt].x_bf16_lo, rows[fmt].x_bf16_hi = min(ratios), max(ratios)
                steps.clear()
                for row in rows.values():
                    on_row(row)
            del decs
            _free(args)
    models.clear()
    _free(args)
    return True


def quantize(model: torch.nn.Module, fmt: str, quantize_head: bool = False) -> None:
    """Convert ``model`` to the bench format ``fmt`` (not bf16) in place: every ``nn.Linear`` but ``lm_head``
    (unless ``quantize_head``) by :func:`mxkit.quantize_model` (not with ``+experts``), then the MoE blocks'
    experts by :func:`mxkit.nn.swap_gpt_oss_moe` (``+experts``: ValueError on a model without them)."""
    import mxkit
    from ..nn.gpt_oss import swap_gpt_oss_moe

    base = fmt.removesuffix(FUSED).removesuffix(FUSED_MLP).removesuffix(EXPERTS)
    w_fmt, act = ("mxfp8_e4m3", "mxfp8_e4m3") if base == A8W8 else (base, None)
    if not fmt.endswith(EXPERTS):
        mxkit.quantize_model(model, w_fmt, act_format=act, skip=None if quantize_head else "lm_head",
                             compute_qsnr=False, progress=False, fuse=fmt.endswith(FUSED))
    if fmt.endswith(FUSED_MLP):
        from ..nn import fuse_gated_mlp, fuse_siblings

        fuse_gated_mlp(model)
        fuse_siblings(model)
    if fmt.endswith(EXPERTS) or getattr(model.config, "num_local_experts", 0):
        swap_gpt_oss_moe(model, w_fmt)


def add_arguments(p: argparse.ArgumentParser) -> None:
    csv = timing.csv_arg

    def positive(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise ValueError(f"{s!r} is not an integer") from None
        if v < 1:
            raise ValueError(f"{s} is not a positive integer")
        if v >= 2**31:  # (a run of 2^31 tokens or rows is no run: they failed at the first row, exit 1)
            raise ValueError(f"{s} is too large (at most {2**31 - 1})")
        return v

    def seed(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise ValueError(f"{s!r} is not an integer") from None
        if not 0 <= v < 2**63:  # (torch.manual_seed's range; outside it every row failed, exit 1)
            raise ValueError(f"{s} is not a seed in 0 .. 2^63 - 1")
        return v

    p.add_argument("--model", type=timing.choice("model", MODELS), default="llama-3-8b",
                   help=f"{', '.join(MODELS)} (default llama-3-8b)")
    p.add_argument("--layers", type=positive, default=None, help="keep the first N decoder layers (default all)")
    p.add_argument("--formats", type=csv(lambda s: s if s == "bf16" else _mx_name(s)),
                   default=("bf16", "mxfp4_e2m1", "mxfp8_e4m3"),
                   help="comma list of bf16, MX weight formats and a8w8 (MXFP8 weights and activations), the MX "
                        "ones optionally with +fused (q / k / v and gate / up as one GEMM each, "
                        "mxkit.nn.fuse_siblings), +fusedmlp (+fused with each gated MLP's SiLU product in the gate / "
                        "up GEMM's launch, mxkit.nn.fuse_gated_mlp) or +experts (the MoE experts only) "
                        "(default bf16,mxfp4,mxfp8)")
    p.add_argument("--batches", type=csv(positive), default=(1, 16, 64),
                   help="comma list of batch sizes (default 1,16,64)")
    p.add_argument("--modes", type=csv(timing.choice("mode", MODE_CHOICES)), default=MODES,
                   help="comma list of eager, graphs, compiled (torch.compile, then graphs on CUDA) (default "
                        "eager,graphs)")
    p.add_argument("--prompt", type=positive, default=8, help="prompt tokens (default 8)")
    p.add_argument("--tokens", type=positive, default=None, help="tokens decoded per run (default 64; 16 with --quick)")
    p.add_argument("--repeats", type=positive, default=None,
                   help="timed runs per row, median (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="--layers 4 (all of a smaller model) --tokens 16 --repeats 1 unless given")
    p.add_argument("--quantize-head", action="store_true", help="quantize lm_head too (default: kept in bf16)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: eager or compiled, without CUDA graphs (give --modes eager or compiled), for "
                        "smoke tests")
    p.add_argument("--order", choices=ORDERS, default="interleaved",
                   help="interleaved: every format's model held at once, repeat k of each format before repeat "
                        "k + 1, x bf16 from the per-repeat ratios; sequential: one model at a time (the memory of "
                        "one) (default interleaved)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the random weights and prompts (default 0)")
    p.add_argument("--out", type=output.out_folder, default=None,
                   help="write bench_decode.csv / .json / .png into this folder")
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")
    p.add_argument("--list", action="store_true", help="print the runs and exit (no GPU needed)")


A8W8 = "mxfp8xmxfp8"  # MXFP8 weights and MXFP8 activations (MXLinear act_format): the a8w8-mma path


def _mx_name(s: str) -> str:
    from ..formats import get_format

    suffixes = (FUSED, FUSED_MLP, EXPERTS)
    for suffix in suffixes:
        if s.endswith(suffix):
            base = s.removesuffix(suffix)
            if any(base.endswith(x) for x in suffixes):
                raise ValueError(f"{s}: one of {', '.join(suffixes)} at most")
            return _mx_name(base) + suffix
    if s.lower().replace("_e4m3", "").replace("×", "x") in (A8W8, "a8w8"):
        return A8W8
    return get_format(s).name


def resolve(args) -> None:
    """Fill the ``--quick`` defaults (``--layers``: 4, or all of a model with fewer); raise ValueError for options
    that do not go together (a prompt and token count past the model's positions included)."""
    quick = dict(QUICK, layers=min(QUICK["layers"], model_layers(args.model)))
    for k, v in quick.items():
        if getattr(args, k) is None and (args.quick or k != "layers"):
            setattr(args, k, v if args.quick else {"tokens": 64, "repeats": 3}[k])
    for what in ("formats", "batches", "modes"):  # (argparse's csv_arg checks it too; resolve's other callers)
        i = timing.first_repeat(getattr(args, what))
        if i is not None:
            raise ValueError(f"--{what} lists {getattr(args, what)[i]} twice")
    experts = [f for f in args.formats if f.endswith(EXPERTS)]
    if experts and MODELS[args.model][0] != "GptOssConfig":  # (it failed at the model's swap, after building it)
        raise ValueError(f"--formats {experts[0]}: {args.model} has no MoE experts (a GPT-OSS model has)")
    if args.layers is not None and args.layers > model_layers(args.model):
        raise ValueError(f"--layers={args.layers}: {args.model} has {model_layers(args.model)} decoder layers")
    if "graphs" in args.modes and args.device != "cuda":
        raise ValueError("--modes graphs needs --device cuda (CUDA graphs); use --modes eager or compiled on CPU")
    span = args.prompt + args.tokens + WARMUP_STEPS  # (the cache's length: --prompt 99999999 ran out of memory)
    positions = MODELS[args.model][1].get("max_position_embeddings")
    if positions and span > positions:
        raise ValueError(f"{args.model}: --prompt + --tokens + {WARMUP_STEPS} = {span} is past its "
                         f"max_position_embeddings of {positions}")
    window = MODELS[args.model][1].get("sliding_window")
    # (compiled is captured and replayed on CUDA as graphs is: a sliding layer's length is frozen at the capture)
    captured = [m for m in args.modes if m == "graphs" or (m == "compiled" and args.device == "cuda")]
    if window and captured and args.prompt + args.tokens + WARMUP_STEPS > window:
        raise ValueError(f"{args.model} with {captured[0]}: --prompt + --tokens + {WARMUP_STEPS} = "
                         f"{args.prompt + args.tokens + WARMUP_STEPS} must fit the sliding window of {window}")


COLUMNS = [Column("format", lambda r: r.fmt, right=False), Column("batch", lambda r: str(r.batch)),
           Column("mode", lambda r: r.mode, right=False),
           Column("ms/token", lambda r: fmt_num(r.ms_per_token, ".2f")),
           Column("tokens/s", lambda r: fmt_num(r.tokens_per_s, ".0f")),
           Column("× bf16", lambda r: fmt_num(r.x_bf16, ".2f")),
           Column("× range", lambda r: f"{r.x_bf16_lo:.2f}–{r.x_bf16_hi:.2f}" if r.x_bf16_lo is not None else "-"),
           Column("GEMM path", lambda r: r.path or "-", right=False),
           Column("note", lambda r: r.note[:80], right=False)]


def run(args) -> int:
    """``mxkit bench decode``. 0: every row ran; 1: a row failed (its note says why); 2: cannot run here."""
    try:
        resolve(args)
        if args.out is not None:
            output.check_out_folder(args.out, [f"bench_decode.{ext}" for ext in ("csv", "json", "png")])
    except (ValueError, OSError) as e:
        return output.usage_error(str(e))
    layers = args.layers or model_layers(args.model)
    head = (f"{args.model}, {layers} layers, prompt {args.prompt}, {args.tokens} tokens, median of {args.repeats} "
            f"({args.order}); formats {', '.join(args.formats)}; batches {', '.join(map(str, args.batches))}; "
            f"{', '.join(args.modes)}")
    if args.list:  # (the runs in the table's order: format, batch, mode)
        print(head)
        print("\n".join(f"{f:24s} batch {b:<4d} {m}" for f in args.formats for b in args.batches for m in args.modes))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        return timing.no_cuda("mxkit bench decode", "'--model tiny-llama --device cpu --modes eager' runs on CPU")
    from tqdm.auto import tqdm

    env = output.environment()
    print(output.env_line(env))
    print(head, flush=True)
    rows: list[DecodeRow] = []
    bar = tqdm(total=len(args.formats) * len(args.batches) * len(args.modes), desc="decode", unit="run")

    def on_row(r: DecodeRow) -> None:
        rows.append(r)
        bar.set_postfix_str(f"{r.fmt} b{r.batch} {r.mode}: {fmt_num(r.tokens_per_s, '.0f')} tok/s")
        bar.update()
        output.save(rows, args, "bench_decode", env)

    if args.order == "interleaved" and not run_interleaved(args, on_row):
        print("the formats' models do not fit the GPU together: timing them one at a time (--order sequential)",
              flush=True)
        args.order = "sequential"
    if args.order == "interleaved":
        key = {(f, b, m): i for i, (f, b, m) in enumerate(
            (f, b, m) for f in args.formats for b in args.batches for m in args.modes)}
        rows.sort(key=lambda r: key[r.fmt, r.batch, r.mode])  # the sequential order: format, batch, mode
    else:
        for fmt in args.formats:
            run_format(args, fmt, on_row)
    bar.close()
    base = {(r.batch, r.mode): r.tokens_per_s for r in rows if r.fmt == "bf16" and r.tokens_per_s}
    for r in rows:  # sequential: the ratio of the medians (interleaved rows have the per-repeat one)
        if r.x_bf16 is None and r.tokens_per_s and (r.batch, r.mode) in base:
            r.x_bf16 = r.tokens_per_s / base[r.batch, r.mode]
    output.render_table(rows, COLUMNS, plain=args.plain, title=f"mxkit bench decode — {args.model}, {layers} layers, "
                        f"{args.tokens} tokens — {env['gpu'] or 'cpu'} — {env['date_utc']}")
    for mode, target in TARGETS.items() if env["gpu"] else ():  # (issue #23's targets are GPU ones)
        for fmt, label in (("mxfp4_e2m1", "MXFP4"), ("mxfp4_e2m1" + FUSED, "MXFP4 fused"),
                           ("mxfp4_e2m1" + FUSED_MLP, "MXFP4 fused + one-launch MLP")):
            got = next((r.x_bf16 for r in rows if (r.fmt, r.batch, r.mode) == (fmt, 1, mode) and r.x_bf16), None)
            if got is not None:
                print(f"target ({mode}, batch 1): {label} {got:.2f}× bf16 tokens/s, target ≥ {target:g}× "
                      f"({'met' if got >= target else 'missed'})")
    notes = output.save(rows, args, "bench_decode", env)
    if args.out is not None:
        notes.append(output.write_chart(rows, args.out / "bench_decode.png", value="tokens_per_s", ylabel="tokens/s",
                                        panel="mode", x="batch", colour="fmt",
                                        title=f"bench_decode — {args.model} — {env['gpu'] or 'cpu'}")[1])
    print("\n".join(notes))
    bad = [f"{r.fmt}/b{r.batch}/{r.mode}" for r in rows if r.status != "ok"]
    if bad:
        print(f"mxkit: error: {len(bad)} run(s) failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
