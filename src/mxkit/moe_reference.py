"""Mixture-of-experts, the reference (layer ``reference``): routing, token sorting, activations, the grouped
GEMMs and the combine, in plain PyTorch (CPU or CUDA), float64 inside. The oracle of the GPU MoE kernels.

One MoE layer, for tokens ``x`` (T, H) and experts e = 0..E-1 (checkpoint layout, ``nn.Linear`` convention,
each expert weight quantized along its K = last axis):

1. :func:`route` — router logits (T, E) → ``topk_weights`` (T, k) float32, ``topk_ids`` (T, k) int32.
2. :func:`align_block_size` — the (token, slot) pairs sorted by expert and padded per expert to a multiple of
   ``block_m`` (vLLM's ``moe_align_block_size`` convention): ``sorted_token_ids``, ``expert_ids``.
3. :func:`grouped_matmul_reference` with ``gather=True`` — ``h = x[token] @ W_gate_up[e].T + b_gate_up[e]``
   (P, 2I) in sorted order.
4. :func:`swiglu_gpt_oss` or :func:`swiglu` — (P, 2I) → (P, I).
5. :func:`grouped_matmul_reference` with ``gather=False`` — ``y = act @ W_down[e].T + b_down[e]`` (P, H).
6. :func:`combine_reference` — ``out[t] = Σ_j topk_weights[t, j] · y[(t, j)]`` in token order.

:func:`moe_reference` runs the six steps and rounds once to the output dtype. Expert parallelism: with
``expert_range=(lo, hi)`` only experts lo..hi-1 are present (the weight tensors hold those, indexed by the
local id e - lo) and the other slots contribute nothing, so the sum over ranks of the partial outputs is the
whole layer (:mod:`mxkit.distributed`).
"""

from __future__ import annotations

import operator
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .formats import MXFP4_E2M1, check_bools
from .reference import dequantize_reference, quantize_fp8_rowwise_reference, quantize_reference, round_from_float64
from .tensor import MXTensor, as_int, check_out_dtype

__all__ = [
    "ROUTING_MODES",
    "ACTIVATIONS",
    "GPT_OSS_SWIGLU_ALPHA",
    "GPT_OSS_SWIGLU_LIMIT",
    "REFERENCE_BLOCK_M",
    "MoeShapes",
    "route",
    "align_block_size",
    "swiglu_gpt_oss",
    "swiglu",
    "select_experts",
    "grouped_matmul_reference",
    "combine_reference",
    "check_moe_args",
    "moe_reference",
    "moe_w4a8_reference",
    "moe_mxfp4_reference",
]

ROUTING_MODES = ("gpt_oss", "softmax_topk")
GPT_OSS_SWIGLU_ALPHA = 1.702  # GptOssConfig.swiglu_alpha (transformers), OpenAI gpt-oss ``swiglu(alpha=1.702)``
GPT_OSS_SWIGLU_LIMIT = 7.0  # GptOssConfig.swiglu_limit
REFERENCE_BLOCK_M = 16  # moe_reference's block_m: any value gives the same result (padding rows are skipped)
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INTS = (torch.int32, torch.int64)


# --- routing ----------------------------------------------------------------------------------------------


def _check_top_k(top_k, num_experts: int) -> int:
    """top_k as a Python int (a NumPy integer taken, as ``axis`` is) if it is an integer in [1, num_experts], else
    ValueError."""
    top_k = as_int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k!r} must be an int in [1, num_experts={num_experts}]")
    return top_k


def _one_device(what: str, **tensors) -> None:
    """ValueError naming the tensors (None entries skipped) where they are not all on one device: a CPU operand
    times a meta one gives uninitialised memory in torch, not an error."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{what}: the tensors must share one device, got "
                         + ", ".join(f"{name} on {d}" for name, d in devices.items()))


def _check_count(v, name: str, low: int = 1) -> int:
    """v as a Python int (a NumPy integer taken) if it is an int >= low, else ValueError naming it."""
    v = as_int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name}={v!r} must be an int >= {low}")
    return v


def _order_key(values: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as the float ``values``: NaN (any sign or payload) above +inf, -0.0 equal to +0.0.
    Integer keys sort the same on every device: CUDA's ``torch.sort`` of floats did not put NaN first (torch
    2.11: a row with two NaNs and +inf came out +inf first, the NaNs past the top 4), the CPU's does."""
    if values.dtype == torch.float64:
        bits, flip = values.view(torch.int64), (1 << 63) - 1
    else:
        values = values.to(torch.float32)
        bits, flip = values.view(torch.int32).to(torch.int64), (1 << 31) - 1
    key = torch.where(bits >= 0, bits, bits ^ flip)
    key = torch.where(values == 0, 0, key)
    return torch.where(values.isnan(), torch.iinfo(torch.int64).max, key)


def _topk_lowest_index_on_ties(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64) of the k largest entries of each row, largest first, equal values by increasing index,
    NaN above every number (:func:`_order_key`).

    ``torch.topk`` does not fix the order of ties (on CPU it returned [1, 3] for the top 2 of [1, 3, 3, 3, 0]
    and [86, 85, 84, 87] for the top 4 of 128 zeros, torch 2.13), so a stable descending sort decides them."""
    return torch.sort(_order_key(values), dim=-1, descending=True, stable=True).indices[..., :k]


def route(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    mode: str = "gpt_oss",
    renormalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: router logits → per-token expert weights and ids.

    router_logits: (T, E) float32 | bfloat16 | float16 | float64, the router's output *including its bias*
      (GPT-OSS: ``F.linear(x, router.weight, router.bias)``, computed by the caller in the model dtype).
    top_k: 1 ≤ top_k ≤ E.
    mode:
      ``"gpt_oss"`` — the k largest logits, then a softmax over those k logits. This is transformers'
      ``GptOssTopKRouter.forward`` (``models/gpt_oss/modeling_gpt_oss.py``: ``torch.topk(logits, k)``, then
      ``softmax(top_values, dim=1)``). The selection is made on the logits in their own dtype and the softmax in
      float32: for float32 logits the ids and weights are bit-identical to HF's in rows without tied logits (ties
      below: ``torch.topk`` may pick or order tied experts otherwise); for bfloat16 logits HF rounds
      the weights to bfloat16 (its softmax runs in the logits' dtype) and these are the float32 values before
      that rounding (float64 logits: the k selected ones are rounded to float32 first).
      ``"softmax_topk"`` — a float32 softmax over all E logits, then the k largest probabilities (selected on
      the logits, the same order since softmax is monotone); with ``renormalize=True`` they are divided by
      their sum (Mixtral / Qwen-MoE's ``norm_topk_prob``), otherwise left as they are.
    Ties: equal logits go to the lower expert index, deterministically on every device (``torch.topk`` leaves
    the order of ties unspecified; see :func:`_topk_lowest_index_on_ties`); -0.0 equals +0.0; NaN ranks above
    every number (the same on CPU and CUDA). Slots are ordered by decreasing logit, as ``torch.topk(sorted=True)``
    orders them. Infinite logits follow ``torch.softmax``: a +inf among the softmax's logits (or all of them -inf)
    makes that token's weights NaN, as a NaN logit does; -inf logits next to finite ones get weight 0.

    Returns ``(topk_weights (T, k) float32, topk_ids (T, k) int32)`` on the logits' device.
    Raises TypeError for a non-float tensor or a non-bool ``renormalize``, ValueError for a shape other than
    (T, E), a ``top_k`` outside [1, E], an unknown ``mode`` or ``renormalize=True`` with ``mode="gpt_oss"`` (its
    weights sum to 1).
    """
    if not isinstance(router_logits, torch.Tensor) or router_logits.dtype not in _FLOATS:
        raise TypeError(f"router_logits must be a float tensor, got {getattr(router_logits, 'dtype', router_logits)}")
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be (T, E), got shape {tuple(router_logits.shape)}")
    if mode not in ROUTING_MODES:
        raise ValueError(f"unknown routing mode={mode!r}; known: {', '.join(ROUTING_MODES)}")
    check_bools(dict(renormalize=renormalize))
    if renormalize and mode == "gpt_oss":
        raise ValueError("renormalize=True applies to mode='softmax_topk' (gpt_oss weights already sum to 1)")
    top_k = _check_top_k(top_k, router_logits.shape[1])
    ids = _topk_lowest_index_on_ties(router_logits, top_k)
    if mode == "gpt_oss":
        weights = torch.softmax(router_logits.gather(1, ids).to(torch.float32), dim=1)
    else:
        weights = torch.softmax(router_logits.to(torch.float32), dim=1).gather(1, ids)
        if renormalize:
            weights = weights / weights.sum(dim=1, keepdim=True)
    return weights, ids.to(torch.int32)


def router_logits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A router's logits as mxkit's one-launch router computes them (:func:`mxkit.moe.router_gpt_oss`):
    ``x @ weight.T + bias`` with the products and their sum in float64, rounded once to float32 and then to x's
    dtype, NaN as the positive canonical quiet NaN (bfloat16 0x7FC0, float16 0x7E00; PyTorch's own casts write
    other NaN bits on other paths), a zero sum as +0.0.

    x: (T, H) bfloat16 | float16; weight: (E, H) and bias: (E,) or None, in x's dtype. Returns (T, E) in x's
    dtype. The products of two bfloat16 / float16 values are exact in float64, so the float64 sum is the exact one
    but for addends more than 2^53 below the largest partial sum, and another summation order changes the
    result only where it lies that close to a rounding boundary of x's dtype. ``F.linear`` (cuBLAS's float32
    accumulation, transformers' GPT-OSS router) rounds about 0.1% of such logits to the neighbouring value.
    Raises TypeError for a non-tensor or another dtype, ValueError for shapes that do not fit or tensors on more
    than one device."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"router_logits: {name} must be a tensor{' or None' if name == 'bias' else ''}, got "
                            f"{type(t).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype \
            or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"router_logits takes bfloat16 / float16 x, weight and bias of one dtype; got {x.dtype}, "
                        f"{weight.dtype}, {None if bias is None else bias.dtype}")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] \
            or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"router_logits takes x (T, H), weight (E, H), bias (E,); got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}, {None if bias is None else tuple(bias.shape)}")
    _one_device("router_logits", x=x, weight=weight, bias=bias)
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    out = y.float().to(x.dtype)
    out.masked_fill_(y == 0, 0.0)  # +0.0 whatever the signs of the products
    out.view(torch.int16).masked_fill_(y.isnan(), 0x7FC0 if x.dtype == torch.bfloat16 else 0x7E00)
    return out


# --- token sorting ----------------------------------------------------------------------------------------


def _check_expert_range(expert_range, num_experts: int) -> tuple[int, int]:
    """(lo, hi) as Python ints from None (all the experts) or a pair of integers (NumPy's included) with
    0 <= lo < hi <= num_experts; ValueError otherwise (floats, bools, another length)."""
    if expert_range is None:
        return 0, num_experts
    pair = tuple(expert_range) if isinstance(expert_range, (tuple, list)) else ()
    try:
        lo, hi = (operator.index(v) for v in pair) if len(pair) == 2 and not any(isinstance(v, bool) for v in pair) \
            else (None, None)
    except TypeError:
        lo = hi = None
    if not (lo is not None and 0 <= lo < hi <= num_experts):
        raise ValueError(f"expert_range={expert_range!r} must be (lo, hi) with 0 <= lo < hi <= {num_experts=}")
    return lo, hi


def _check_topk_ids(topk_ids) -> None:
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in _INTS:
        raise TypeError(f"topk_ids must be an int32 / int64 tensor, got {getattr(topk_ids, 'dtype', topk_ids)}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be (T, top_k), got shape {tuple(topk_ids.shape)}")


def align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    *,
    expert_range: Optional[tuple[int, int]] = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sort the (token, slot) pairs by expert and pad each expert's group to a multiple of ``block_m``, the grouped
    GEMM's M tile (vLLM's ``block_size``; not the MX block of 32 elements).

    The convention of vLLM's ``moe_align_block_size`` (``vllm/model_executor/layers/fused_moe/
    moe_align_block_size.py``; golden model ``torch_moe_align_block_size`` in vLLM's tests): the pair (token t,
    slot j) has the flat index ``i = t * k + j``; ``sorted_token_ids`` lists the flat indices grouped by expert,
    experts in increasing order, each group padded up to a multiple of ``block_m`` with the sentinel
    ``T * k``; ``expert_ids[b]`` is the expert of rows ``b * block_m .. (b + 1) * block_m - 1``. A grouped GEMM
    reads token ``sorted_token_ids[p] // k`` for row p and skips sentinel rows.

    Where this differs from vLLM:
      * the outputs have their exact length P (vLLM allocates ``numel + E * (block_m - 1)`` entries and
        returns P in a one-element tensor), so P is a host int here (one host sync on CUDA);
      * within an expert the order is the increasing flat index (stable); vLLM's CUDA kernel does not fix it
        (its test compares the sets);
      * ``expert_range=(lo, hi)`` (expert parallelism): only experts lo..hi-1 get blocks, pairs routed
        elsewhere are left out, and ``expert_ids`` holds *local* ids ``e - lo`` that index a weight tensor
        holding experts lo..hi-1. vLLM's ``expert_map`` keeps every expert's blocks and marks the
        non-local ones -1. The sentinel stays ``T * k``.
    Experts with no pairs get no blocks.

    topk_ids: (T, k) int32 | int64, values in [0, num_experts), on any device.
    Returns ``(sorted_token_ids (P,) int32, expert_ids (P // block_m,) int32, P)``. Vectorised (bincount,
    cumsum, stable sort): no host loop over tokens or experts.
    Raises TypeError / ValueError for a wrong dtype or rank, an id outside [0, num_experts), a non-positive
    ``block_m`` or ``num_experts`` (NumPy integers taken), an ``expert_range`` outside [0, num_experts], T * k,
    P, ``block_m`` or ``num_experts`` ≥ 2^31; NotImplementedError for meta ids.
    """
    _check_topk_ids(topk_ids)
    num_experts, block_m = _check_count(num_experts, "num_experts"), _check_count(block_m, "block_m")
    for name, v in (("num_experts", num_experts), ("block_m", block_m)):
        if v >= 2**31:
            raise ValueError(f"{name}={v} does not fit the int32 expert_ids / sorted_token_ids")
    lo, hi = _check_expert_range(expert_range, num_experts)
    if topk_ids.device.type == "meta":  # (the length P depends on the ids' values)
        raise NotImplementedError("align_block_size: the sorted length depends on topk_ids' values, which a meta "
                                  "tensor does not hold")
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    if n >= 2**31:
        raise ValueError(f"T * top_k = {n} does not fit the int32 sorted_token_ids")
    n_local = hi - lo
    # local expert of each pair; pairs of other experts get the key n_local and sort after every local one
    local = flat - lo
    key = torch.where((local >= 0) & (local < n_local), local, n_local)
    counts = torch.bincount(key, minlength=n_local + 1)[:n_local]
    blocks = (counts + block_m - 1) // block_m
    stats = torch.stack([flat.min(), flat.max()]) if n else torch.zeros(2, dtype=torch.int64, device=flat.device)
    id_min, id_max, kept, num_blocks = torch.cat([stats, counts.sum().view(1), blocks.sum().view(1)]).tolist()
    if id_min < 0 or id_max >= num_experts:
        raise ValueError(f"topk_ids holds expert ids in [{id_min}, {id_max}], outside [0, {num_experts=})")
    if num_blocks * block_m >= 2**31:
        raise ValueError(f"the padded length P = {num_blocks} blocks x block_m={block_m} does not fit the int32 "
                         f"sorted_token_ids (2^31)")
    padded = blocks * block_m
    group_start = torch.cumsum(padded, 0) - padded  # first row of each expert's group
    pair_start = torch.cumsum(counts, 0) - counts  # first sorted pair of each expert
    order = torch.sort(key, stable=True).indices[:kept]
    e_sorted = key[order]
    rank = torch.arange(kept, device=flat.device) - pair_start[e_sorted]
    P = num_blocks * block_m
    sorted_token_ids = torch.full((P,), n, dtype=torch.int32, device=flat.device)
    sorted_token_ids[group_start[e_sorted] + rank] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(
        torch.arange(n_local, dtype=torch.int32, device=flat.device), blocks, output_size=num_blocks
    )
    return sorted_token_ids, expert_ids, P


# --- activations ------------------------------------------------------------------------------------------


def _check_even_last(h: torch.Tensor, what: str) -> None:
    if not isinstance(h, torch.Tensor) or h.dtype not in _FLOATS:
        raise TypeError(f"{what} takes a float tensor (float32 | bfloat16 | float16 | float64), got "
                        f"{getattr(h, 'dtype', type(h).__name__)}")
    if h.dim() == 0 or h.shape[-1] % 2:
        raise ValueError(f"{what} needs (..., 2I) with an even last dim, got {getattr(h, 'shape', h)}")


def swiglu_gpt_oss(
    h: torch.Tensor, *, alpha: float = GPT_OSS_SWIGLU_ALPHA, limit: float = GPT_OSS_SWIGLU_LIMIT
) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU: (..., 2I) → (..., I), computed in ``h.dtype``.

    gate = h[..., 0::2], up = h[..., 1::2] (interleaved rows of the gate_up weight); gate clamped to ≤ limit
    (no lower clamp), up clamped to [-limit, limit]; out = (up + 1) * (gate * sigmoid(gate * alpha)).
    The operations and their order are those of transformers' ``GptOssExperts._apply_gate``
    (``models/gpt_oss/modeling_gpt_oss.py``, alpha = ``swiglu_alpha`` = 1.702, limit = ``swiglu_limit`` =
    7.0), so the result is bit-identical to HF's in every dtype. NaN propagates (``clamp`` keeps NaN).
    Raises TypeError for a tensor that is not float32 / bfloat16 / float16 / float64, ValueError for an odd last dim.
    """
    _check_even_last(h, "swiglu_gpt_oss")
    gate, up = h[..., 0::2], h[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """Plain SwiGLU: (..., 2I) → (..., I) = silu(gate) * up, computed in ``h.dtype``.

    gate = h[..., :I] (first half), up = h[..., I:] (second half): the concatenated ``[gate; up]`` layout of a
    fused gate_up weight built from Llama's separate ``gate_proj`` / ``up_proj`` (vLLM ``SiluAndMul``:
    ``F.silu(x[..., :d]) * x[..., d:]``). No clamp. Raises TypeError for a
    tensor that is not float32 / bfloat16 / float16 / float64, ValueError for an odd last dim.
    """
    _check_even_last(h, "swiglu")
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swiglu_gpt_oss": swiglu_gpt_oss,
    "swiglu": swiglu,
}


# --- experts and the grouped GEMM ---------------------------------------------------------------------------


def _check_experts(w, name: str) -> tuple[int, int, int]:
    """(E, N, K) of an MX expert weight (E, N, K) quantized along K; TypeError / ValueError otherwise."""
    if not isinstance(w, MXTensor):
        raise TypeError(f"{name} must be an MXTensor (E, N, K) quantized along K, got {type(w).__name__}")
    if w.ndim != 3 or w.axis != 2:
        raise ValueError(f"{name} must be 3-D (E, N, K) quantized along K (axis=2); got shape {tuple(w.shape)}, "
                         f"axis={w.axis}")
    return tuple(w.shape)


def _check_bias(bias, shape: tuple[int, int], name: str) -> None:
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or bias.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a float tensor {shape} or None, got {getattr(bias, 'dtype', bias)}")
    if tuple(bias.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(bias.shape)}, expected {shape} (experts, N)")


def select_experts(w: MXTensor, lo: int, hi: int) -> MXTensor:
    """Experts lo..hi-1 of an (E, N, K) MX expert weight, as an (hi - lo, N, K) MXTensor (views, no copy).
    Raises TypeError / ValueError for a w that is not an (E, N, K) MXTensor along K, ValueError unless lo and hi
    are ints (NumPy's taken) with 0 <= lo < hi <= E."""
    E, N, K = _check_experts(w, "w")
    lo, hi = as_int(lo), as_int(hi)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 0 <= lo < hi <= E:
        raise ValueError(f"expert slice [{lo}, {hi}) is outside [0, {E=})")
    return MXTensor(w.qdata[lo:hi], w.plain_scale()[lo:hi], w.fmt, 2, w.block_size, (hi - lo, N, K), w.scale_mode,
                    w.rounding)


def _expert_weight(w: MXTensor, plain_scale: torch.Tensor, e: int) -> torch.Tensor:
    """Expert e of an (E, N, K) MX weight, dequantized exactly to float64 (N, K)."""
    one = MXTensor._trusted(w.qdata[e], plain_scale[e], w.fmt, 1, w.block_size, w.shape[1:], w.scale_mode,
                            w.rounding, "plain")
    return dequantize_reference(one, torch.float64)


def grouped_matmul_reference(
    a: torch.Tensor,
    w: MXTensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    block_m: int,
    top_k: int,
    bias: Optional[torch.Tensor] = None,
    gather: bool = True,
    *,
    num_tokens: Optional[int] = None,
) -> torch.Tensor:
    """One grouped GEMM over sorted tokens: row p = ``a[src(p)] @ W[e].T + bias[e]`` in float64, e = expert_ids[p
    // block_m]; exact products of the dequantized expert weights, float64 accumulation.

    a: float (T, K) with ``gather=True`` (row p reads token ``sorted_token_ids[p] // top_k``: the first GEMM,
      gather fused into its loads) or (P, K) with ``gather=False`` (row p reads row p: the second GEMM).
    w: MXTensor (E, N, K) quantized along K (axis 2); ``expert_ids`` index its first dim.
    sorted_token_ids (P,), expert_ids (P // block_m,): from :func:`align_block_size` with the same block_m.
    top_k: the k of the sort's ``topk_ids`` (T, k): with another one the ids name other tokens and the sentinel
      moves (a larger one reads padding rows as tokens; ids past ``T * top_k`` are refused).
    bias: optional (E, N) float, added to each row of expert e.
    num_tokens: T, the token count whose sentinel ``T * top_k`` marks padding rows; defaults to ``a.shape[0]``
      with ``gather=True`` and is required with ``gather=False``.
    Returns (P, N) float64 in sorted order; **sentinel (padding) rows are zero** (a kernel may leave them
    unspecified: compare rows with ``sorted_token_ids < T * top_k`` only).
    Raises TypeError for a non-MX ``w``, a non-float ``a``, ids that are not int32 / int64 tensors or a ``gather``
    that is not a bool; ValueError for a non-3-D ``w``, a K mismatch, lengths that do not agree with ``block_m``,
    a ``top_k`` / ``block_m`` that is not a positive int or a ``num_tokens`` that is not an int >= 0 (NumPy
    integers taken), an id outside [0, T * top_k] (T * top_k: padding), an expert id outside [0, E), a bias of
    the wrong shape, a missing ``num_tokens``, or tensors on more than one device.
    """
    E, N, K = _check_experts(w, "w")
    if not isinstance(a, torch.Tensor) or a.dtype not in _FLOATS or a.dim() != 2:
        raise TypeError(f"a must be a 2-D float tensor, got {getattr(a, 'dtype', type(a).__name__)} "
                        f"{tuple(getattr(a, 'shape', ()))}")
    if a.shape[1] != K:
        raise ValueError(f"K mismatch: a has K={a.shape[1]}, w (E, N, K) = {tuple(w.shape)}")
    _check_bias(bias, (E, N), "bias")
    for name, t in (("sorted_token_ids", sorted_token_ids), ("expert_ids", expert_ids)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _INTS:
            raise TypeError(f"{name} must be an int32 / int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    check_bools(dict(gather=gather))
    top_k = _check_count(top_k, "top_k")
    if num_tokens is not None:
        num_tokens = _check_count(num_tokens, "num_tokens", 0)
    _one_device("grouped_matmul_reference", a=a, w=w.qdata, sorted_token_ids=sorted_token_ids,
                expert_ids=expert_ids, bias=bias)
    P = sorted_token_ids.numel()
    block_m = as_int(block_m)
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m <= 0 or P % block_m:
        raise ValueError(f"{block_m=} must be a positive int dividing len(sorted_token_ids)={P}")
    if expert_ids.numel() != P // block_m:
        raise ValueError(f"expert_ids has {expert_ids.numel()} entries, expected P // block_m = {P // block_m}")
    if gather:
        num_tokens = a.shape[0] if num_tokens is None else num_tokens
        if num_tokens != a.shape[0]:
            raise ValueError(f"{num_tokens=} but a has {a.shape[0]} rows (gather=True reads token rows)")
    elif num_tokens is None:
        raise ValueError("gather=False needs num_tokens (T) to recognise the sentinel rows T * top_k")
    elif a.shape[0] != P:
        raise ValueError(f"gather=False reads row p of a: a has {a.shape[0]} rows, expected P={P}")
    out = torch.zeros(P, N, dtype=torch.float64, device=a.device)
    if P == 0:
        return out
    ids = sorted_token_ids.reshape(-1).to(torch.int64)
    if bool((ids < 0).any() | (ids > num_tokens * top_k).any()):  # (-1 would read token -1 as a real row; an id
        # past the sentinel, a top_k other than the sort's, would read padding as tokens)
        raise ValueError(f"sorted_token_ids holds ids in [{int(ids.min())}, {int(ids.max())}], outside [0, T * top_k = "
                         f"{num_tokens * top_k}]: ids are token * top_k + slot, T * top_k marks padding (is top_k "
                         f"the sort's?)")
    valid = ids < num_tokens * top_k
    row_expert = expert_ids.reshape(-1).to(torch.int64).repeat_interleave(block_m)
    hit = torch.unique(row_expert[valid]).tolist()
    if hit and (hit[0] < 0 or hit[-1] >= E):
        raise ValueError(f"expert_ids holds experts in [{hit[0]}, {hit[-1]}], outside [0, E={E})")
    src = ids // top_k if gather else torch.arange(P, device=a.device)
    scale = w.plain_scale()
    for e in hit:
        rows = (valid & (row_expert == e)).nonzero().squeeze(1)
        y = a[src[rows]].to(torch.float64) @ _expert_weight(w, scale, e).t()
        out[rows] = y if bias is None else y + bias[e].to(torch.float64)
    return out


def combine_reference(
    y: torch.Tensor, sorted_token_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """The weighted combine: ``out[t] = Σ_j topk_weights[t, j] · y[p(t, j)]`` in float64, j = 0..k-1 in order.

    y: (P, H) expert outputs in sorted order; sorted_token_ids (P,) as from :func:`align_block_size`;
    topk_weights (T, k). Pairs absent from ``sorted_token_ids`` (other ranks' experts) contribute 0.
    The sum runs as ``(w[..., None] * y_pairs.view(T, k, H)).sum(1)`` on the (T, k, H) tensor of pairs in flat
    order, so one rank and the expert-parallel path (which sums the same (T, k, H) products) agree.
    Returns (T, H) float64. Raises TypeError for a non-float ``y`` / ``topk_weights`` or ids that are not an
    int32 / int64 tensor, ValueError for ranks or lengths that do not agree (y (P, H), sorted_token_ids (P,),
    topk_weights (T, k)), an id outside [0, T * k] (T * k: padding) or tensors on more than one device.
    """
    for name, t in (("y", y), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be a float tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if not isinstance(sorted_token_ids, torch.Tensor) or sorted_token_ids.dtype not in _INTS:
        raise TypeError(f"sorted_token_ids must be an int32 / int64 tensor, got "
                        f"{getattr(sorted_token_ids, 'dtype', type(sorted_token_ids).__name__)}")
    if y.dim() != 2 or topk_weights.dim() != 2 or sorted_token_ids.dim() != 1 \
            or y.shape[0] != sorted_token_ids.shape[0]:
        raise ValueError(f"combine_reference takes y (P, H), sorted_token_ids (P,), topk_weights (T, k); got "
                         f"{tuple(y.shape)}, {tuple(sorted_token_ids.shape)}, {tuple(topk_weights.shape)}")
    _one_device("combine_reference", y=y, sorted_token_ids=sorted_token_ids, topk_weights=topk_weights)
    T, k = topk_weights.shape
    H = y.shape[1]
    ids = sorted_token_ids.reshape(-1).to(torch.int64)
    if ids.numel() and bool((ids < 0).any() | (ids > T * k).any()):  # (an id past T * k: a pair of a token that
        # topk_weights lacks, dropped silently before)
        raise ValueError(f"sorted_token_ids holds ids in [{int(ids.min())}, {int(ids.max())}], outside [0, T * k = "
                         f"{T * k}] (T, k from topk_weights {tuple(topk_weights.shape)})")
    valid = ids < T * k
    pairs = torch.zeros(T * k, H, dtype=torch.float64, device=y.device)
    pairs[ids[valid]] = y[valid].to(torch.float64)
    return (topk_weights.to(torch.float64).unsqueeze(-1) * pairs.view(T, k, H)).sum(1)


# --- the layer ----------------------------------------------------------------------------------------------


class MoeShapes(NamedTuple):
    """Sizes of a validated MoE call (:func:`check_moe_args`): tokens T, hidden H, expert intermediate I,
    experts held E_local, experts per token top_k."""

    T: int
    H: int
    I: int  # noqa: E741 (the name GPT-OSS's config uses: intermediate_size)
    E_local: int
    top_k: int


def check_moe_args(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, *, activation: str,
                   expert_range=None, num_experts: Optional[int] = None) -> MoeShapes:
    """Validate the arguments of :func:`moe_reference` (shared with the kernel backends); returns
    :class:`MoeShapes`. Checks only shapes, dtypes and types (no host sync): expert ids are range-checked
    by :func:`align_block_size`. Raises TypeError / ValueError naming the argument and its shape."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
        raise TypeError(f"x must be a float tensor (T, H), got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 2:
        raise ValueError(f"x must be (T, H), got shape {tuple(x.shape)}")
    T, H = x.shape
    E, N1, K1 = _check_experts(w_gate_up, "w_gate_up")
    E2, N2, K2 = _check_experts(w_down, "w_down")
    if K1 != H:
        raise ValueError(f"K mismatch: x has H={H}, w_gate_up (E, 2I, H) = {tuple(w_gate_up.shape)}")
    if N1 % 2:
        raise ValueError(f"w_gate_up (E, 2I, H) = {tuple(w_gate_up.shape)} needs an even 2I (gate and up)")
    if (E2, N2, K2) != (E, H, N1 // 2):
        raise ValueError(f"w_down has shape {tuple(w_down.shape)}, expected (E, H, I) = {(E, H, N1 // 2)} "
                         f"from w_gate_up {tuple(w_gate_up.shape)}")
    _check_bias(b_gate_up, (E, N1), "b_gate_up")
    _check_bias(b_down, (E, H), "b_down")
    _check_topk_ids(topk_ids)
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype not in _FLOATS:
        raise TypeError(f"topk_weights must be a float tensor (T, k), got {getattr(topk_weights, 'dtype', None)}")
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != T:
        raise ValueError(f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} must "
                         f"both be (T, k) with T={T} (x {tuple(x.shape)})")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:  # (a list: not an unhashable-type error)
        raise ValueError(f"unknown activation={activation!r}; known: {', '.join(ACTIVATIONS)}")
    if expert_range is None:
        if num_experts is not None and num_experts != E:  # (mxkit.moe passes router_logits' last dim as num_experts)
            raise ValueError(f"the routing is over {num_experts} experts (router_logits' last dim, or num_experts) "
                             f"but the experts hold E={E} (pass expert_range for a slice)")
    else:
        if num_experts is None:
            raise ValueError("expert_range needs num_experts (the global expert count the ids refer to)")
        lo, hi = _check_expert_range(expert_range, num_experts)
        if hi - lo != E:
            raise ValueError(f"expert_range={expert_range} holds {hi - lo} experts but the weights hold E={E}")
    k = topk_ids.shape[1]
    _check_top_k(k, num_experts if num_experts is not None else E)
    _one_device("the MoE layer", x=x, w_gate_up=w_gate_up.qdata, w_down=w_down.qdata, topk_ids=topk_ids,
                topk_weights=topk_weights, b_gate_up=b_gate_up, b_down=b_down)
    return MoeShapes(T, H, N1 // 2, E, k)


def moe_reference(
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
    intermediate_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """An MoE layer on routed tokens, the oracle of the GPU kernels (see the module docstring for the steps).

    x: (T, H) float32 | bfloat16 | float16 | float64.
    w_gate_up: MXTensor (E, 2I, H) quantized along H (axis 2) — the checkpoint layout (GPT-OSS
      ``gate_up_proj_blocks [E, 2I, H/32, 16]`` is its qdata); rows interleave gate / up for
      ``"swiglu_gpt_oss"``, are ``[gate; up]`` for ``"swiglu"``. b_gate_up: (E, 2I) or None.
    w_down: MXTensor (E, H, I) quantized along I; b_down: (E, H) or None.
    topk_weights (T, k) float, topk_ids (T, k) int32 | int64: from :func:`route`.
    activation: ``"swiglu_gpt_oss"`` (:func:`swiglu_gpt_oss`) or ``"swiglu"`` (:func:`swiglu`).
    out_dtype: default ``x.dtype``; any of float32 / bfloat16 / float16 / float64.
    expert_range, num_experts: expert parallelism — the weights hold experts lo..hi-1 of ``num_experts`` and the
      result is the contribution of those experts only (0 for tokens routed elsewhere).
    intermediate_dtype: None keeps the activation output in float64; a dtype rounds it to that dtype before
      the down GEMM (what a kernel that stores the intermediate in bf16 computes).

    Every expert weight is dequantized exactly to float64 (one expert at a time, only experts that received
    tokens), both GEMMs, the bias adds, the activation and the weighted combine run in float64, and the result
    is rounded once to ``out_dtype``. Returns (T, H). Raises the TypeError / ValueError of
    :func:`check_moe_args` and :func:`align_block_size` (ids outside [0, num_experts)).
    """
    T, H, _, E, k = check_moe_args(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids,
                                   activation=activation, expert_range=expert_range, num_experts=num_experts)
    out_dtype = check_out_dtype(x.dtype if out_dtype is None else out_dtype)
    sorted_ids, expert_ids, _ = align_block_size(topk_ids, num_experts or E, REFERENCE_BLOCK_M,
                                                 expert_range=expert_range)
    h = grouped_matmul_reference(x, w_gate_up, sorted_ids, expert_ids, REFERENCE_BLOCK_M, k, b_gate_up)
    act = ACTIVATIONS[activation](h)
    if intermediate_dtype is not None:
        intermediate_dtype = check_out_dtype(intermediate_dtype)  # (a float dtype: an int one truncated silently)
        act = _through(lambda v: round_from_float64(v, intermediate_dtype).to(torch.float64))(act)
    y = grouped_matmul_reference(act, w_down, sorted_ids, expert_ids, REFERENCE_BLOCK_M, k, b_down, gather=False,
                                 num_tokens=T)
    return round_from_float64(combine_reference(y, sorted_ids, topk_weights), out_dtype)


class _StraightThrough(torch.autograd.Function):
    """``values(v)`` in value (its bits, untouched by autograd), the identity in gradient at the gradient's own
    precision (cast to v's dtype; ``v.to(torch.bfloat16).to(torch.float64)`` would round the gradient to bf16):
    a rounding or quantization passed straight through."""

    @staticmethod
    def forward(v, values):
        return values(v)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype), None


def _through(values: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``values`` made differentiable as a straight-through estimator where its input needs a gradient (the
    activations' quantizations of :func:`moe_w4a8_reference` / :func:`moe_mxfp4_reference` and
    :class:`mxkit.nn.MXMoE`'s backward): without one, ``values`` itself."""

    def q(v: torch.Tensor) -> torch.Tensor:
        return _StraightThrough.apply(v, values) if v.requires_grad else values(v)

    return q


def _bf16_cast(v: torch.Tensor) -> torch.Tensor:
    """float64 v rounded to bfloat16 (a GEMM's output rounding), as float64: through float32, as torch's ``.to``
    converts, so rounded twice (the kernels round their float32 sums once to bf16; the float32 step stands for the
    sum's own precision). Unlike the outputs, which are rounded once (:func:`round_from_float64`)."""
    return v.to(torch.bfloat16).to(torch.float64)


_bf16_values = _through(_bf16_cast)


def _fp8_rowwise_cast(v: torch.Tensor) -> torch.Tensor:
    """float64 of the FP8 E4M3 rowwise cast of v (R, C) rounded to float32
    (:func:`~mxkit.reference.quantize_fp8_rowwise_reference`'s bytes, dequantized: exact)."""
    data, scale = quantize_fp8_rowwise_reference(v.to(torch.float32))
    return data.to(torch.float64) * scale.to(torch.float64)


_fp8_rowwise_values = _through(_fp8_rowwise_cast)


def moe_w4a8_reference(
    xq,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The W4A8 MoE (TensorRT-LLM's GPT-OSS serving mode on Hopper), the twin of
    :func:`mxkit.kernels.moe.moe_w4a8_triton` with its rounding points, float64 elsewhere (bf16(.): float64 to
    float32 to bfloat16, the kernels' float32 sums rounded, :func:`_bf16_cast`):

    1. ``h = bf16(a[token] @ W1[e].T)`` with ``a = xq.data * xq.scale`` (FP8 E4M3 rowwise tokens,
       :class:`mxkit.Fp8Rowwise`), the expert exact (dequantized MX; the kernel reads it folded to E4M3, the same
       values);
    2. ``v = act(h + b1[e])``; the FP8 E4M3 rowwise cast of v (:func:`mxkit.quantize_fp8_rowwise`'s rule);
    3. ``y = bf16(v8 @ W2[e].T)``;
    4. ``out[t] = Σ_j topk_weights[t, j] · (y + b2[e])``, rounded once to ``out_dtype``.
    xq: Fp8Rowwise (T, H), or the tokens x (T, H) float32 | bfloat16 | float16, cast here by
    :func:`mxkit.quantize_fp8_rowwise`'s rule; experts MXTensor (E, 2I, H) / (E, H, I) along K, biases (E, 2I) /
    (E, H) or None; topk (T, k). Gradients: both FP8 casts (x's, the intermediate's) pass straight through, as in
    :class:`mxkit.nn.MXMoE` (the scales are constants to autograd: no gradient through their amax). A kernel
    matches it but for float32 vs float64 in the activation, which may move an element of v8 by one E4M3 step
    where v sits on a rounding boundary. Raises TypeError for an xq that is neither, and the errors of
    :func:`check_moe_args`."""
    if isinstance(xq, torch.Tensor):
        if xq.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"x must be a float32 / bfloat16 / float16 tensor, got {xq.dtype}")
        a = _fp8_rowwise_values(xq) if xq.dim() == 2 else xq  # (check_moe_args names a wrong rank)
    elif hasattr(xq, "data") and hasattr(xq, "scale"):
        a = xq.data.to(torch.float64) * xq.scale.to(torch.float64).reshape(-1, 1)
    else:
        raise TypeError(f"xq must be an Fp8Rowwise or a tensor (T, H), got {type(xq).__name__}")
    return _quantized_moe(a, _fp8_rowwise_values, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids,
                          activation, out_dtype)


def _mxfp4_cast(v: torch.Tensor) -> torch.Tensor:
    """float64 of v (R, C) rounded to float32, quantized to MXFP4 along C (:func:`mxkit.quantize`'s bytes: OCP
    FLOOR scales, RNE) and dequantized (exact)."""
    if v.numel() == 0:
        return v.new_empty(v.shape, dtype=torch.float64)
    q = quantize_reference(v.to(torch.float32), MXFP4_E2M1, axis=-1)
    return dequantize_reference(q, torch.float64)


_mxfp4_values = _through(_mxfp4_cast)


def moe_mxfp4_reference(
    xq: MXTensor,
    w_gate_up: MXTensor,
    b_gate_up: Optional[torch.Tensor],
    w_down: MXTensor,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The MXFP4 x MXFP4 MoE (the tokens and the intermediate in MXFP4), the twin of
    :func:`mxkit.kernels.moe.moe_mxfp4_triton` with its rounding points, float64 elsewhere (bf16(.): float64 to
    float32 to bfloat16, :func:`_bf16_cast`):

    1. ``h = bf16(a[token] @ W1[e].T)`` with ``a`` = xq dequantized (exact), the expert exact (dequantized MX;
       the kernel reads both folded to E4M3 where they fold, the same values);
    2. ``v = act(h + b1[e])``, rounded to float32 and quantized to MXFP4 along I (:func:`mxkit.quantize`: OCP
       FLOOR scales, RNE), dequantized: v4;
    3. ``y = bf16(v4 @ W2[e].T)``;
    4. ``out[t] = Σ_j topk_weights[t, j] · (y + b2[e])``, rounded once to ``out_dtype``.
    xq: MXTensor (T, H) mxfp4_e2m1 quantized along H (``mxkit.quantize(x, "mxfp4")``); experts MXTensor (E, 2I, H)
    / (E, H, I) along K, biases (E, 2I) / (E, H) or None; topk (T, k). A kernel matches it but for float32 vs
    float64 in the activation (and a float32 vs float64 sum before h's bf16 rounding), which may move an element
    of v4 by one FP4 step, or a block scale, where v sits on a rounding boundary. Raises TypeError / ValueError
    for an xq that is not such an MXTensor, and the errors of :func:`check_moe_args`."""
    if not isinstance(xq, MXTensor) or xq.fmt != MXFP4_E2M1 or xq.ndim != 2 or xq.axis != 1:
        what = (f"{xq.fmt.name} {tuple(xq.shape)} along axis {xq.axis}" if isinstance(xq, MXTensor)
                else type(xq).__name__)
        raise TypeError(f"xq must be an MXTensor (T, H) of mxfp4_e2m1 quantized along H, got {what}")
    a = dequantize_reference(xq, torch.float64)
    return _quantized_moe(a, _mxfp4_values, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids,
                          activation, out_dtype)


def _quantized_moe(a: torch.Tensor, quantize_act: Callable[[torch.Tensor], torch.Tensor], w_gate_up: MXTensor,
                   b_gate_up: Optional[torch.Tensor], w_down: MXTensor, b_down: Optional[torch.Tensor],
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """The MoE with quantized activations (:func:`moe_w4a8_reference`, :func:`moe_mxfp4_reference`) from the
    float64 token values ``a`` (T, H): each GEMM rounded to bf16, the expert bias added after, the activation's
    output replaced by ``quantize_act(v)`` (float64 values of its quantization), the combine, one rounding."""
    T, H, _, E, k = check_moe_args(a, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids,
                                   activation=activation)
    out_dtype = check_out_dtype(out_dtype)
    sorted_ids, expert_ids, _ = align_block_size(topk_ids, E, REFERENCE_BLOCK_M)
    valid = sorted_ids.to(torch.int64) < T * k
    row_e = expert_ids.to(torch.int64).repeat_interleave(REFERENCE_BLOCK_M)

    def row_bias(b):  # each sorted row's expert bias (0 on padding rows), added after the bf16 rounding
        return 0.0 if b is None else torch.where(valid[:, None], b.to(torch.float64)[row_e.clamp(0, E - 1)], 0.0)

    h = grouped_matmul_reference(a, w_gate_up, sorted_ids, expert_ids, REFERENCE_BLOCK_M, k)
    h = _bf16_values(h)
    h = h + row_bias(b_gate_up)
    vq = quantize_act(ACTIVATIONS[activation](h))
    y = grouped_matmul_reference(vq, w_down, sorted_ids, expert_ids, REFERENCE_BLOCK_M, k, gather=False,
                                 num_tokens=T)
    y = _bf16_values(y)
    y = y + row_bias(b_down)
    return round_from_float64(combine_reference(y, sorted_ids, topk_weights), out_dtype)
