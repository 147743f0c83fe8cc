"""The MoE op (layer ``ops``): routing plus the expert computation, dispatched by backend.

``backend="reference"`` runs :func:`mxkit.moe_reference.moe_reference` (float64 inside, one output rounding).
``"triton"`` runs ``mxkit.kernels.moe.moe_triton``, imported lazily; ``"auto"`` takes it for CUDA tensors when
Triton imports and that module exists, and the reference otherwise (so CPU, and CUDA before the kernels land,
still work). The kernel contract: ``moe_triton`` takes exactly :func:`moe_experts`'s arguments less
``backend`` — those of :func:`~mxkit.moe_reference.moe_reference` less ``intermediate_dtype`` — and returns
what the reference returns, within the kernel's stated bound.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from ._autocast import autocast_off
from ._device import on_operand_device
from .ops import needs_grad
from .moe_reference import check_moe_args, moe_mxfp4_reference, moe_reference, moe_w4a8_reference
from .moe_reference import route as reference_route
from .moe_reference import router_logits
from .tensor import MXTensor, as_int, check_out_dtype

__all__ = ["moe", "moe_experts", "moe_w4a8", "moe_mxfp4", "route", "route_tokens", "router_gpt_oss", "MOE_BACKENDS",
           "resolve_moe_backend"]

MOE_BACKENDS = ("auto", "reference", "triton")
_KERNEL_MODULE = "mxkit.kernels.moe"


def _load_moe_triton() -> Optional[Callable]:
    """``mxkit.kernels.moe.moe_triton``, or None when that module does not exist (an ImportError raised
    *inside* the module is not swallowed)."""
    try:
        from .kernels.moe import moe_triton
    except ModuleNotFoundError as e:
        if e.name == _KERNEL_MODULE:
            return None
        raise
    return moe_triton


def resolve_moe_backend(backend: str, device: Union[str, torch.device]) -> str:
    """``"reference"`` or ``"triton"`` for a call on ``device`` (a torch.device or a string it takes, ``"cpu"``,
    ``"cuda:0"``). Raises ValueError for an unknown backend name or device string, or for ``"triton"`` on a
    non-CUDA device; TypeError for a device of another type; ImportError for ``"triton"`` without Triton or
    without ``mxkit.kernels.moe``."""
    if backend not in MOE_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(MOE_BACKENDS)}")
    if not isinstance(device, torch.device):
        if not isinstance(device, str):
            raise TypeError(f"device must be a torch.device or a string, got {type(device).__name__}")
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device={device!r} is not a device: {e}") from None
    if backend == "reference":
        return backend
    from .kernels import triton_available

    usable = device.type == "cuda" and triton_available() and _load_moe_triton() is not None
    if backend == "auto":
        return "triton" if usable else "reference"
    if device.type != "cuda":
        raise ValueError(f"backend='triton' runs the GPU MoE kernels and needs CUDA tensors, got {device}")
    if not triton_available():
        raise ImportError("backend='triton' needs Triton, which failed to import: pip install 'mxkit[triton]'")
    if _load_moe_triton() is None:
        raise ImportError(f"backend='triton': the MoE kernels ({_KERNEL_MODULE}.moe_triton) are not in this "
                          "build of mxkit; use backend='auto' or 'reference'")
    return backend


def _run_reference(*args, **kwargs) -> torch.Tensor:
    return moe_reference(*args, **kwargs)


def _run_triton(*args, **kwargs) -> torch.Tensor:
    return _load_moe_triton()(*args, **kwargs)


_IMPLS: dict[str, Callable[..., torch.Tensor]] = {"reference": _run_reference, "triton": _run_triton}


@autocast_off
@on_operand_device()
def moe_experts(
    x: torch.Tensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: Optional[torch.dtype] = None,
    expert_range: Optional[tuple[int, int]] = None,
    num_experts: Optional[int] = None,
    backend: str = "auto",
    packed: Optional[tuple] = None,
) -> torch.Tensor:
    """The expert computation on routed tokens: :func:`~mxkit.moe_reference.moe_reference`'s arguments (but
    ``intermediate_dtype``: each backend keeps its own) and result (x (T, H), experts (E, 2I, H) / (E, H, I) MX
    along K, topk (T, k); returns (T, H) in ``out_dtype``, default ``x.dtype``), run by ``backend``. ``packed``: the
    experts of :func:`mxkit.kernels.moe.pack_experts_mma` for the Triton backend's decode path (ignored elsewhere).
    Gradients: where x, the routing weights or a bias needs one, the reference runs (the Triton kernels have no
    backward; they ran and gave none). Raises its TypeError / ValueError, and those of :func:`resolve_moe_backend`."""
    check_moe_args(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, activation=activation,
                   expert_range=expert_range, num_experts=num_experts)
    if out_dtype is not None:  # (every backend's refusal: the kernels' combine truncated into an int output)
        check_out_dtype(out_dtype)
    name = resolve_moe_backend(backend, x.device)
    if name == "triton" and needs_grad(x, topk_weights, b_gate_up, b_down):
        name = "reference"
    extra = {"packed": packed} if name == "triton" and packed is not None else {}
    return _IMPLS[name](x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, activation=activation,
                        out_dtype=out_dtype, expert_range=expert_range, num_experts=num_experts, **extra)


@on_operand_device()
def moe(
    x: torch.Tensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
    backend: str = "auto",
    expert_range: Optional[tuple[int, int]] = None,
    packed: Optional[tuple] = None,
) -> torch.Tensor:
    """A mixture-of-experts layer with MX experts: route, run the experts, combine.

    x: (..., H) float32 | bfloat16 | float16 (float64 too, on the reference backend); router_logits: (..., E)
      float32 | bfloat16 | float16 | float64 with the same leading dims (the router Linear's output, bias
      included; routed in float32).
    w_gate_up: MXTensor (E_local, 2I, H) quantized along H; b_gate_up: (E_local, 2I) float or None.
    w_down: MXTensor (E_local, H, I) quantized along I; b_down: (E_local, H) float or None.
    top_k, routing: :func:`~mxkit.moe_reference.route` (``"gpt_oss"``: softmax over the top-k logits;
      ``"softmax_topk"``: softmax then top-k; ties go to the lower expert index). Mixtral / Qwen-MoE's routing
      with ``norm_topk_prob`` (softmax, top-k, then divided by their sum) is ``"gpt_oss"``: the same weights but
      for float32 rounding (``exp(l_i) / Σ_topk exp(l_j)`` either way).
    activation: ``"swiglu_gpt_oss"`` (gate / up interleaved, clamped at 7, alpha 1.702: GPT-OSS's, as
      transformers' ``GptOssExperts`` and OpenAI's reference ``swiglu``) or ``"swiglu"`` (``[gate; up]`` halves).
    expert_range: (lo, hi) when the weights hold only experts lo..hi-1 of the E routed over (E_local = hi - lo):
      the result is their contribution alone; summed over a partition of the experts it is the whole layer
      (:mod:`mxkit.distributed` does that with an all-to-all).
    backend: ``"auto"``, ``"reference"`` or ``"triton"`` (module docstring).
    packed: optional (gate_up, down) of :func:`mxkit.kernels.moe.pack_experts_mma` (MXFP4 experts packed once
      for the tensor-core decode kernel, which the Triton backend takes up to 64 tokens; :class:`mxkit.nn.MXMoE`
      keeps them per weight buffer).
    Returns (..., H) in ``x.dtype``. Raises TypeError / ValueError for mismatched shapes (naming them), a
    ``top_k`` outside [1, E], non-MXTensor experts, a K that does not match, unknown names.
    The module's other functions (routing, the W4A8 / MXFP4 paths) are reached by ``from mxkit.moe import ...``:
    ``mxkit.moe`` itself is this function.
    """
    x2, weights, ids = route_tokens(x, router_logits, top_k, routing)
    out = moe_experts(x2, w_gate_up, b_gate_up, w_down, b_down, weights, ids, activation=activation,
                      expert_range=expert_range, num_experts=router_logits.shape[-1], backend=backend,
                      packed=packed)
    if x2.shape[0] == 0:  # (no tokens: zeros still in the graph of every input that needs a gradient, as moe_w4a8's)
        return _no_tokens(x, b_gate_up, b_down, router_logits) + out.reshape(x.shape)
    return out.reshape(x.shape)


def route_tokens(x: torch.Tensor, router_logits: torch.Tensor, top_k: int,
                 routing: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., H) and its router logits (..., E) → ``(x (T, H), topk_weights (T, k), topk_ids (T, k))`` with
    T = prod(...) (:func:`~mxkit.moe_reference.route`). Raises TypeError for non-tensors, ValueError when the
    leading dims differ, router_logits has E = 0 or the routing arguments are bad (an H = 0 passes: the experts'
    check then names the K mismatch)."""
    if not isinstance(x, torch.Tensor) or not isinstance(router_logits, torch.Tensor):
        raise TypeError("x and router_logits must be tensors")
    if x.dim() == 0 or router_logits.dim() == 0 or x.shape[:-1] != router_logits.shape[:-1]:
        raise ValueError(f"x (..., H) {tuple(x.shape)} and router_logits (..., E) {tuple(router_logits.shape)} "
                         "must have the same leading dims")
    if router_logits.shape[-1] == 0:
        raise ValueError(f"router_logits (..., E) {tuple(router_logits.shape)} route over no experts (E = 0)")
    T = x.shape[:-1].numel()  # (not reshape(-1, ...): a last dim of 0 leaves -1 undetermined)
    weights, ids = route(router_logits.reshape(T, router_logits.shape[-1]), top_k, mode=routing)
    return x.reshape(T, x.shape[-1]), weights, ids


@on_operand_device()
def route(router_logits: torch.Tensor, top_k: int, *, mode: str = "gpt_oss",
          renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mxkit.moe_reference.route` (the same arguments, results and errors): ``(topk_weights (T, k) float32,
    topk_ids (T, k) int32)``. On CUDA, ``mode="gpt_oss"`` with float32 / bfloat16 / float16 logits (E <= 1024,
    k <= 32) runs one Triton kernel (:mod:`mxkit.kernels.moe_details._route`) that writes the reference's
    bytes; everything else (logits that need a gradient, code torch.compile traces) runs the reference.

    Ties: equal logits go to the lower expert index. transformers' GPT-OSS router selects with ``torch.topk``,
    which does not fix the order of ties, so in a row whose logits tie HF may select other experts (a tie at the
    k-th place) or order the tied slots otherwise: for float32 logits the ids and weights are bit-identical to
    HF's in rows without ties only."""
    top_k = as_int(top_k)  # (a NumPy integer, as ``axis`` is taken: the kernel's check wants an int)
    if (mode == "gpt_oss" and not renormalize and isinstance(router_logits, torch.Tensor) and router_logits.is_cuda
            and not torch.compiler.is_compiling() and not needs_grad(router_logits)):  # (the kernel has no backward)
        from .kernels.moe_details import _route

        if _route.takes(router_logits, top_k):
            return _route.route_gpt_oss(router_logits, top_k)
    return reference_route(router_logits, top_k, mode=mode, renormalize=renormalize)


@on_operand_device()
def router_gpt_oss(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPT-OSS's router and its routing: ``(logits (T, E) in x's dtype, topk_weights (T, k) float32, topk_ids
    (T, k) int32)`` of :func:`mxkit.moe_reference.router_logits` (``x @ weight.T + bias`` summed in float64, rounded
    once to float32, then to x's dtype) and :func:`route` (``mode="gpt_oss"``) on them.

    x: (T, H) bfloat16 | float16; weight (E, H), bias (E,) or None, in x's dtype. On CUDA, up to
    :func:`~mxkit.kernels.moe_details._route.router_max_tokens` (E) tokens (decode: 32 up to E = 32, 8 at
    E = 128) with E <= 1024 and top_k <= 32, one Triton kernel writes all three (the reference's bytes; a
    GPT-OSS-20B layer's router in one launch instead of cuBLAS's split-K GEMM, its reduction and the routing
    kernel); elsewhere (and where autograd needs a gradient, or under torch.compile's tracing) the reference twin
    and :func:`route` run. The logits differ from ``F.linear``'s (cuBLAS's float32 sums, transformers' router) in
    the last bit of about 0.1% of them, which can change the experts of a token whose k-th and (k+1)-th logits are
    that close. Raises TypeError for an x or weight that is not a tensor, or a bias that is neither a tensor nor
    None (naming it), and the reference's errors."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"router_gpt_oss: {name} must be a tensor{' or None' if name == 'bias' else ''}, got "
                            f"{type(t).__name__}")
    top_k = as_int(top_k)
    if not torch.compiler.is_compiling() and not needs_grad(x, weight, bias):
        from .kernels.moe_details import _route

        if _route.router_takes(x, weight, bias, top_k):  # (a negative-bit view's memory holds -x: read raw)
            return _route.router_gpt_oss(x.resolve_neg(), weight.resolve_neg(),
                                         None if bias is None else bias.resolve_neg(), top_k)
    logits = router_logits(x, weight, bias)
    weights, ids = route(logits, top_k, mode="gpt_oss")
    return logits, weights, ids


@on_operand_device()
def moe_w4a8(
    x: torch.Tensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
    folded: Optional[tuple] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The MoE layer in W4A8 (TensorRT-LLM's GPT-OSS serving mode on Hopper): the tokens cast to FP8 E4M3 with a
    scale per token (:func:`mxkit.quantize_fp8_rowwise`), FP4 / FP6 experts, FP8 tensor cores on CUDA
    (:func:`mxkit.kernels.moe.moe_w4a8_triton`), :func:`~mxkit.moe_reference.moe_w4a8_reference` otherwise (and for
    experts of other formats, MXFP8 / MXINT8, which do not fold: the same function, exact, on the reference).

    Arguments as :func:`moe`; ``folded``: the experts' :func:`mxkit.kernels.moe.fold_experts` pair, made once by
    a caller that keeps it (:class:`mxkit.nn.MXMoE`; gate_up with ``interleave_halves=True`` for
    ``activation="swiglu"``, else without: ValueError otherwise); None folds them on the call (one host sync).
    Experts that do not fold (block scales spanning more than the fold range) take the reference. Returns (..., H) in
    x's dtype (float32 / bfloat16 / float16 x: TypeError for float64). No expert parallelism here. Gradients:
    where x, a bias or the logits need one, the reference runs
    (the FP8 casts passed straight through, their scales constants: :class:`mxkit.nn.MXMoE`'s gradients); the
    Triton path has no backward.
    Raises the TypeError / ValueError of :func:`moe` (shapes, names, a ``top_k`` outside [1, E]), and ValueError
    when router_logits' last dim E is not the experts' count (before any expert runs)."""
    return _quantized_layer(_w4a8_folded, _w4a8_reference, x, w_gate_up, b_gate_up, w_down, b_down, router_logits,
                            top_k, routing, activation, folded, backend)


@on_operand_device()
def moe_w4a8_folded(
    x: torch.Tensor,
    folded: tuple,
    b_gate_up: Optional[torch.Tensor],
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
) -> torch.Tensor:
    """:func:`moe_w4a8` on CUDA from experts that are already folded, with no MXTensor: ``folded`` is the
    (gate_up, down) pair of :class:`mxkit.kernels.moe.FoldedExperts` (E, 2I, H) / (E, H, I) that
    :class:`mxkit.nn.MXMoE` holds in place of its MX bytes (its ``"fold"`` layout). Returns (..., H) in x's dtype.
    No tokens: zeros of x's shape, before any check of the experts. Raises what :func:`route_tokens` raises;
    TypeError for a ``folded`` that is not a pair of FoldedExperts;
    ValueError for a None entry (experts that did not fold: pass the MX experts to :func:`moe_w4a8`), an x not
    on CUDA (the kernels' path; elsewhere :func:`moe_w4a8` with the MX experts), a pair whose shapes do not fit x
    ((E, 2I, H), (E, H, I)) or whose row order does not fit ``activation``, or tensors on other devices."""
    return _folded_layer(_w4a8_folded, x, folded, b_gate_up, b_down, router_logits, top_k, routing, activation)


@on_operand_device()
def moe_mxfp4(
    x: torch.Tensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
    folded: Optional[tuple] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The MoE layer in MXFP4 x MXFP4 (the dense ``mxkit.matmul`` / ``MXLinear(act_format="mxfp4")`` convention
    for MoE): the tokens quantized to MXFP4 along H and the intermediate (after the bias and the activation) to
    MXFP4 along I, both with :func:`mxkit.quantize`'s bytes (OCP FLOOR scales, RNE), times MXFP4 (or MXFP6)
    experts. On CUDA (:func:`mxkit.kernels.moe.moe_mxfp4_triton`) both sides are folded exactly to E4M3 and run
    on FP8 tensor cores, the rows that do not fold (block scales spanning more than 14 steps) recomputed exactly
    on the device with no host sync; elsewhere :func:`~mxkit.moe_reference.moe_mxfp4_reference`. Each GEMM is
    exact for its MXFP4 operands (float32 accumulation, each 128-deep step in the FP8 tensor cores' ~14-bit
    accumulator; one rounding to bf16); the expert biases are added after
    that rounding, the combine sums the k slots in float32.

    x: (..., H) float32 | bfloat16 | float16; router_logits (..., E); experts MXTensor (E, 2I, H) / (E, H, I) along K,
    biases (E, 2I) / (E, H) or None; top_k, routing, activation as :func:`moe` (ties go to the lower expert index).
    ``folded``: the experts' :func:`mxkit.kernels.moe.fold_experts` pair, made once by a caller that keeps it
    (:class:`mxkit.nn.MXMoE`; as :func:`moe_w4a8`'s); None folds them on the call (one host sync). Experts that do not
    fold (a row's block scales spanning more than the fold range, or a row scale outside the FP8 epilogue's envelope;
    experts of other formats) take the reference, whose combine sums the k slots in float64 and rounds once. H and I
    are multiples of 32 (the MXFP4 blocks; ValueError otherwise), x not float64 (TypeError). Returns (..., H) in x's
    dtype. No expert parallelism here. Gradients: the logits and ``b_down`` get theirs through the reference; x and
    ``b_gate_up`` get none (the MXFP4 quantizations), so a call where either needs one raises ValueError
    (:class:`mxkit.nn.MXMoE` with ``act_format="mxfp4"`` passes them straight through). Raises the TypeError /
    ValueError of :func:`moe` (shapes, names, a ``top_k`` outside [1, E]), and ValueError when router_logits' last dim
    E is not the experts' count."""
    return _quantized_layer(_mxfp4_folded, _mxfp4_reference, x, w_gate_up, b_gate_up, w_down, b_down,
                            router_logits, top_k, routing, activation, folded, backend)


@on_operand_device()
def moe_mxfp4_folded(
    x: torch.Tensor,
    folded: tuple,
    b_gate_up: Optional[torch.Tensor],
    b_down: Optional[torch.Tensor],
    router_logits: torch.Tensor,
    top_k: int,
    *,
    routing: str = "gpt_oss",
    activation: str = "swiglu_gpt_oss",
) -> torch.Tensor:
    """:func:`moe_mxfp4` on CUDA from experts that are already folded (:func:`moe_w4a8_folded`'s arguments: the
    pair :class:`mxkit.nn.MXMoE` holds in its ``"fold"`` layout). Returns (..., H) in x's dtype; raises as
    :func:`moe_w4a8_folded`."""
    return _folded_layer(_mxfp4_folded, x, folded, b_gate_up, b_down, router_logits, top_k, routing, activation)


# the two activation formats of the quantized-activation layers: (x2, folded pair, biases, topk, activation,
# out dtype) -> (T, H) on the folded experts; (x2, MX experts, biases, topk, activation, out dtype) -> the twin


def _w4a8_folded(x2, folded, b1, b2, weights, ids, activation, out_dtype) -> torch.Tensor:
    from .kernels.moe import moe_w4a8_triton
    from .ops import quantize_fp8_rowwise

    return moe_w4a8_triton(quantize_fp8_rowwise(x2), folded[0], b1, folded[1], b2, weights, ids,
                           activation=activation, out_dtype=out_dtype)


def _w4a8_reference(x2, w1, b1, w2, b2, weights, ids, activation, out_dtype) -> torch.Tensor:
    # (the tokens themselves: the reference casts them, straight through in gradient)
    return moe_w4a8_reference(x2, w1, b1, w2, b2, weights, ids, activation=activation, out_dtype=out_dtype)


def _mxfp4_folded(x2, folded, b1, b2, weights, ids, activation, out_dtype) -> torch.Tensor:
    from .kernels.moe import moe_mxfp4_triton

    return moe_mxfp4_triton(x2, folded[0], b1, folded[1], b2, weights, ids, activation=activation,
                            out_dtype=out_dtype)


def _mxfp4_reference(x2, w1, b1, w2, b2, weights, ids, activation, out_dtype) -> torch.Tensor:
    from .ops import quantize

    return moe_mxfp4_reference(quantize(x2, "mxfp4_e2m1", axis=-1), w1, b1, w2, b2, weights, ids,
                               activation=activation, out_dtype=out_dtype)


def _no_tokens(x, *inputs) -> torch.Tensor:
    """The layer's output for no tokens: zeros of x's shape, still in the autograd graph of every input that needs a
    gradient (each gets zeros), through an empty slice's sum (0 exactly, whatever the input holds)."""
    y = x.new_zeros(x.shape)
    for t in (x, *inputs):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            y = y + t.reshape(-1)[:0].sum().to(y.dtype)
    return y


def _quantized_layer(run_folded, run_reference, x, w_gate_up, b_gate_up, w_down, b_down, router_logits, top_k,
                     routing, activation, folded, backend) -> torch.Tensor:
    """:func:`moe_w4a8` / :func:`moe_mxfp4`: route, check, then ``run_folded`` on the experts folded (the Triton
    backend, FP4 / FP6 experts that fold; ``folded`` None: folded here) or ``run_reference``. No tokens: an empty
    result."""
    x2, weights, ids = route_tokens(x, router_logits, top_k, routing)  # (checks x first: it may be 0-d)
    resolved = resolve_moe_backend(backend, x.device)  # (the same refusals with a gradient and with no tokens)
    lead, H = x.shape[:-1], x.shape[-1]
    E = check_moe_args(x2, w_gate_up, b_gate_up, w_down, b_down, weights, ids, activation=activation).E_local
    if router_logits.shape[-1] != E:  # (the ids index the experts: routing over other experts is a caller's bug)
        raise ValueError(f"router_logits {tuple(router_logits.shape)} route over {router_logits.shape[-1]} experts "
                         f"but the experts hold E={E} (no expert parallelism here)")
    # (before the no-token return: the same refusals for every T)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        what = "MXFP4" if run_reference is _mxfp4_reference else "FP8 E4M3 (rowwise)"
        name = "moe_mxfp4" if run_reference is _mxfp4_reference else "moe_w4a8"
        raise TypeError(f"{name} quantizes x to {what}: float32 / bfloat16 / float16 x, got {x.dtype}")
    if folded is not None:
        _check_folded(folded, activation, w_gate_up, w_down)
    if run_reference is _mxfp4_reference:
        for name, n in (("H (x's last dim)", H), ("I (the down experts' K)", w_down.shape[-1])):
            if n % 32:
                raise ValueError(f"moe_mxfp4 quantizes along {name} in blocks of 32: got {n}")
        if needs_grad(x, b_gate_up):
            raise ValueError("moe_mxfp4 has no gradient for x or b_gate_up (their MXFP4 quantizations are not "
                             "differentiable); use mxkit.nn.MXMoE(act_format='mxfp4'), whose backward passes them "
                             "straight through, or detach them")
    if x2.shape[0] == 0:
        return _no_tokens(x, b_gate_up, b_down, router_logits)
    grad = needs_grad(x, b_gate_up, b_down, router_logits)
    if not grad and resolved == "triton" and w_gate_up.fmt.bits in (4, 6):
        from .kernels.moe import fold_experts

        if folded is None:
            folded = (fold_experts(w_gate_up, interleave_halves=activation == "swiglu"), fold_experts(w_down))
        if folded[0] is not None and folded[1] is not None:
            y = run_folded(x2, folded, b_gate_up, b_down, weights, ids, activation, x.dtype)
            return y.reshape(*lead, H)
    y = run_reference(x2, w_gate_up, b_gate_up, w_down, b_down, weights, ids, activation, x.dtype)
    return y.reshape(*lead, H)


def _check_folded(folded, activation: str, w_gate_up: Optional[MXTensor] = None,
                  w_down: Optional[MXTensor] = None) -> None:
    """ValueError where a caller's ``folded`` pair does not fit the call: gate_up folded with its rows interleaved
    exactly for ``activation="swiglu"`` (the middle pass pairs rows 2c, 2c + 1: the other order paired gate rows
    with gate rows, silently), down not interleaved, and the shapes of the experts given. A None entry (experts
    that did not fold) is the reference's."""
    from .kernels.moe import FoldedExperts

    if not (isinstance(folded, tuple) and len(folded) == 2):
        raise TypeError(f"folded must be the (gate_up, down) pair of fold_experts, got {type(folded).__name__}")
    for i, (f, w, part) in enumerate(zip(folded, (w_gate_up, w_down), ("gate_up", "down"))):
        if f is None:
            continue
        if not isinstance(f, FoldedExperts):
            raise TypeError(f"folded[{i}] ({part}) must be a FoldedExperts or None, got {type(f).__name__}")
        want = i == 0 and activation == "swiglu"
        if f.interleaved != want:
            how = "fold_experts(w, interleave_halves=True)" if want else "fold_experts(w)"
            raise ValueError(f"folded[{i}] ({part}) has interleaved={f.interleaved}; activation={activation!r} "
                             f"needs interleaved={want}: {how}")
        if w is not None and tuple(f.data.shape) != tuple(w.shape):
            raise ValueError(f"folded[{i}] ({part}) has shape {tuple(f.data.shape)} but the experts given "
                             f"{tuple(w.shape)}")


def _folded_layer(run_folded, x, folded, b_gate_up, b_down, router_logits, top_k, routing, activation
                  ) -> torch.Tensor:
    """:func:`moe_w4a8_folded` / :func:`moe_mxfp4_folded`: route, then ``run_folded``."""
    x2, weights, ids = route_tokens(x, router_logits, top_k, routing)  # (checks x first: it may be 0-d)
    lead, H = x.shape[:-1], x.shape[-1]
    if x2.shape[0] == 0:  # (no tokens: zeros, whatever the experts, as documented and tested)
        return _no_tokens(x, b_gate_up, b_down, router_logits)
    _check_folded(folded, activation)
    g, d = folded
    if g is None or d is None:
        raise ValueError("the folded experts' pair holds None (experts that did not fold): pass the MX experts to "
                         "moe_w4a8 / moe_mxfp4, which take the reference for them")
    (E, N1, K1), (E2, N2, K2) = g.data.shape, d.data.shape
    if K1 != H or N1 % 2 or (E2, N2, K2) != (E, H, N1 // 2):
        raise ValueError(f"the folded experts (gate_up {tuple(g.data.shape)}, down {tuple(d.data.shape)}) do not fit "
                         f"x (..., H={H}): expected (E, 2I, H) and (E, H, I)")
    if router_logits.shape[-1] != E:
        raise ValueError(f"router_logits route over {router_logits.shape[-1]} experts but the folded experts hold {E}")
    if not (x.device == g.data.device == d.data.device):
        raise ValueError(f"x is on {x.device} but the folded experts on {g.data.device} / {d.data.device}")
    if not x.is_cuda:
        raise ValueError(f"the folded experts run on CUDA only (x on {x.device}): pass the MX experts to moe_w4a8 / "
                         f"moe_mxfp4 elsewhere")
    return run_folded(x2, folded, b_gate_up, b_down, weights, ids, activation, x.dtype).reshape(*lead, H)
