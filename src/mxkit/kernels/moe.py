"""The MoE expert computation on Hopper: token sorting on the device, two grouped GEMMs over MX expert weights
read as MX bytes (bf16 activations: W4A16 / W8A16), the activation fused into the first GEMM's epilogue, the
routing weight into the second's, and a fixed-order weighted combine.

Reference twin: :func:`mxkit.moe_reference.moe_reference` (``intermediate_dtype`` = the activation dtype, as
here); :func:`moe_triton` takes :func:`mxkit.moe.moe_experts`'s arguments less ``backend``. The jit body of the
grouped Triton GEMM is :mod:`mxkit.kernels.matmul_details._grouped`; the paths past it are in
:mod:`mxkit.kernels.moe_details` (``_sort``, ``_rows``, ``_decode``, ``_prefill``, ``_fold``), re-exported here.

Steps (no host sync, so a call can be captured in a CUDA graph):

1. :func:`align_device`: vLLM's ``moe_align_block_size`` convention (flat (token, slot) ids i = t * k + j
   grouped by expert in expert order, stable, each group padded to a multiple of ``block_m`` with the sentinel
   T * k), on the device, into a buffer sized for the worst case; unused blocks carry expert -1.
2. gate_up GEMM: rows gathered from ``x`` by token (i // k), bias, activation, stored as h (T * k, I) in the
   activation dtype (the rounding HF's bf16 forward also makes).
3. down GEMM: rows i of h, bias, times the routing weight of pair i, stored float32 (T * k, H).
4. combine: the k float32 rows of each token summed in slot order, rounded once to ``out_dtype``.

Weights outside the bf16-exact scale envelope (:func:`mxkit.kernels.matmul.exact_scale_range`) and formats the
weight tile does not decode (FP6) take the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..moe_reference import check_moe_args, moe_reference
from ..tensor import MXTensor
from .matmul import W_KINDS
from .matmul_details import _mma_decode
from .moe_details._decode import (MMA_MAX_PAIRS, W16_MMA_MAX_PER_EXPERT, MmaExperts, _moe_mma, _moe_mma_pairs,
                                  _moe_w16_mma, _mma_takes, _w16_mma_elem, mma_max_pairs, mma_strips,
                                  pack_experts_mma)
from .moe_details._envelope import supported
from .moe_details._fold import ACT_MXFP4, FoldedExperts, fold_experts, moe_mxfp4_triton, moe_w4a8_triton
from .moe_details._prefill import WgmmaExperts, _moe_wgmma, _wgmma_takes, pack_experts_wgmma, wgmma_block_m
from .moe_details._rows import _combine_direct, gather_rows
from .moe_details._sort import (MIXED_SIZES, SMALL_PAIRS, align_device, max_blocks, mixed_blocks,
                                mixed_blocks_device, mixed_sizes)

__all__ = ["MoeConfig", "moe_config", "align_device", "max_blocks", "SMALL_PAIRS", "grouped_matmul_w16", "moe_triton",
           "moe_packed", "packed_path", "supported", "MmaExperts", "pack_experts_mma", "MMA_MAX_PAIRS",
           "mma_max_pairs", "mma_strips", "W16_MMA_MAX_PER_EXPERT", "WgmmaExperts", "pack_experts_wgmma",
           "wgmma_block_m", "mixed_blocks", "mixed_blocks_device", "MIXED_SIZES", "mixed_sizes", "gather_rows",
           "FoldedExperts", "fold_experts", "moe_w4a8_triton", "moe_mxfp4_triton", "ACT_MXFP4"]


@dataclass(frozen=True)
class MoeConfig:
    """Schedule of one grouped GEMM: BLOCK_M sorted rows x BLOCK_N weight rows per program, K in BLOCK_K steps."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def moe_config(rows_per_expert: float, N: int, K: int) -> MoeConfig:
    """The schedule for an average of ``rows_per_expert`` routed rows per expert (decode: a few; prefill: many),
    timed on an H100 for GPT-OSS-120B's experts (BENCHMARKS.md)."""
    if rows_per_expert <= 16:
        return MoeConfig(16, 64, 256, 4, 3)
    if rows_per_expert <= 64:
        return MoeConfig(16, 64, 128, 4, 3)
    return MoeConfig(128, 128, 64, 8, 3)


def grouped_matmul_w16(
    a: torch.Tensor,
    w: MXTensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    cfg: MoeConfig,
    *,
    n_valid: int,
    top_k: int,
    gather: bool,
    bias: Optional[torch.Tensor] = None,
    routing_weights: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """One grouped GEMM (:mod:`mxkit.kernels.matmul_details._grouped`): row i (flat (token, slot) order) of the
    result is ``act(a[i // top_k if gather else i] @ W[e(i)].T + bias[e(i)]) * routing_weights[i]``.

    a: bf16 (rows, K), last dim contiguous; w: MXTensor (E, N, K) along K, plain scales, a format of
    :data:`W_KINDS`; sorted_ids / expert_ids: from :func:`align_device` with ``cfg.block_m``; bias (E, N) or
    None; routing_weights (n_valid,) float32 or None; activation None, ``"swiglu_gpt_oss"`` or ``"swiglu"``
    (output N / 2 columns). Writes into ``out`` (n_valid, N or N / 2) when given (rows of pairs absent from
    ``sorted_ids`` untouched), else a new tensor of ``out_dtype`` (such rows unspecified)."""
    import triton

    from .matmul_details._grouped import ACTS, _grouped_w16_kernel

    E, N, K = w.shape
    n_out = N // 2 if activation else N
    if out is None:
        out = torch.empty(n_valid, n_out, dtype=out_dtype, device=a.device)
    if n_valid == 0 or expert_ids.numel() == 0:
        return out
    b = None if bias is None else bias.to(torch.float32).contiguous()
    rw = None if routing_weights is None else routing_weights.reshape(-1).to(torch.float32).contiguous()
    bn = cfg.block_n
    grid = (expert_ids.numel(), triton.cdiv(n_out * 2 if activation else N, bn))
    if grid[1] > _mma_decode.MAX_STRIPS:
        raise ValueError(f"grouped_matmul_w16: N={N} rows an expert make {grid[1]} column tiles of {bn}, past CUDA's "
                         f"grid y limit {_mma_decode.MAX_STRIPS}")
    _grouped_w16_kernel[grid](
        a, w.qdata.contiguous(), w.scale.contiguous(), b, rw, out, sorted_ids, expert_ids,
        N, K, n_valid, a.stride(0), out.stride(0),
        TOP_K=top_k, GATHER=gather, HAS_BIAS=b is not None, MUL_RW=rw is not None, ACT=ACTS[activation],
        W_KIND=W_KINDS[w.fmt.name], BLOCK_M=cfg.block_m, BLOCK_N=bn, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def packed_path(packed: Optional[tuple], n: int, activation: str, x: torch.Tensor) -> Optional[str]:
    """Which path :func:`moe_triton` takes on ``packed`` experts for ``n`` (token, slot) pairs of the 2-D bf16
    ``x``: ``"wgmma"`` (prefill), ``"mma"`` (decode), or None (neither: the experts' MXTensors are read)."""
    if packed is None or x.dtype != torch.bfloat16:
        return None
    p1, p2 = packed
    mma = isinstance(p1, MmaExperts) and isinstance(p2, MmaExperts)
    if mma and not (p1.bf16_exact and p2.bf16_exact):
        return None
    if _wgmma_takes(packed, n, activation, x):
        return "wgmma"
    return "mma" if mma and _mma_takes(packed, n, activation, x) else None


def _run_packed(path: str, x, packed, b1, b2, topk_weights, topk_ids, activation, out_dtype, expert_range,
                n_experts) -> torch.Tensor:
    T, k = topk_ids.shape
    E, N1, H = packed[0].shape
    lo = expert_range[0] if expert_range is not None else 0
    if path == "wgmma":
        return _moe_wgmma(x, packed[0], b1, packed[1], b2, topk_weights, topk_ids, E, lo, n_experts, activation,
                          out_dtype)
    rw = topk_weights.reshape(-1).to(torch.float32)
    if 0 < T * k <= _mma_decode.SMALL_PAIRS and expert_range is None and out_dtype == torch.bfloat16:
        return _moe_mma_pairs(x, packed[0], b1, packed[1], b2, rw.contiguous(), topk_ids, E, T, k, N1 // 2, H,
                              activation)
    y = _moe_mma(x, packed[0], b1, packed[1], b2, rw, topk_ids, E, lo, T, k, N1 // 2, H, activation)
    return _combine_direct(y, topk_ids, lo, E, out_dtype)


def moe_packed(
    x: torch.Tensor,
    packed: tuple,
    b_gate_up: Optional[torch.Tensor],
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: Optional[torch.dtype] = None,
    expert_range: Optional[tuple[int, int]] = None,
    num_experts: Optional[int] = None,
) -> Optional[torch.Tensor]:
    """:func:`moe_triton` on experts held only packed (``packed``: the (gate_up, down) pair of
    :func:`pack_experts_mma`, as :meth:`mxkit.nn.MXMoE.pack_` keeps them): the decode or the prefill path, the
    same kernels and result. Returns None when neither path takes the call (:func:`packed_path`: x not bf16,
    scale bytes outside the bf16-exact envelope, no kernel here); the caller then runs the experts' MXTensors.
    x (T, H) bf16 on CUDA, topk (T, k); biases (E_local, 2I) / (E_local, H) or None. Raises ValueError for
    shapes that do not match the packed experts."""
    p1, p2 = packed
    if not (isinstance(p1, MmaExperts) and isinstance(p2, MmaExperts)):
        raise TypeError("moe_packed takes the (gate_up, down) pair of pack_experts_mma")
    E, N1, H = p1.shape
    if x.dim() != 2 or x.shape[1] != H or tuple(p2.shape) != (E, H, N1 // 2) or topk_ids.dim() != 2 \
            or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"moe_packed: x {tuple(x.shape)}, experts {p1.shape} / {p2.shape}, topk "
                         f"{tuple(topk_weights.shape)} / {tuple(topk_ids.shape)} do not match")
    if x.stride(-1) != 1 or x.is_neg():
        x = x.contiguous().resolve_neg()  # (a negative-bit view's memory holds -x, which the kernels read raw)
    path = packed_path(packed, topk_ids.numel(), activation, x)
    if path is None:
        return None
    if topk_ids.numel() == 0:  # (no tokens: the decode path's grid of 0 blocks was an invalid launch)
        return x.new_empty((x.shape[0], H), dtype=out_dtype or x.dtype)
    return _run_packed(path, x, packed, b_gate_up, b_down, topk_weights, topk_ids, activation,
                       out_dtype or x.dtype, expert_range, num_experts or E)


def moe_triton(
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
    packed: Optional[tuple] = None,
) -> torch.Tensor:
    """The expert computation of :func:`mxkit.moe.moe_experts` on CUDA (module docstring). x (T, H) bf16 (other
    float dtypes, FP6 experts and weights outside the bf16-exact envelope take the reference with the
    intermediate rounded to x's dtype). Returns (T, H) in ``out_dtype`` (default x.dtype).

    packed: (gate_up, down) of :func:`pack_experts_mma` made from these experts (gate_up with ``interleave_halves``
    for ``"swiglu"``; ValueError for a pair of other shapes), one copy for every token count: up to
    :func:`mma_max_pairs` (token, slot) pairs both GEMMs run on the tensor-core decode kernel (blocks of 8 sorted
    rows; any scale byte exact; the same roundings: h in bf16, the down GEMM in float32); above, on the grouped W4A16
    wgmma kernel (Hopper) reading the same bytes: rows gathered into sorted order (columns in that layout's K order),
    bias and activation in the first GEMM's epilogue, h in bf16 (written in the K order), the down GEMM stored float32
    in sorted order, then the combine (bias, routing weight, k slots in order). Or (gate_up, down) of
    :func:`pack_experts_wgmma` (gate_up with ``act_pairs`` = ``activation``; any K % 32): the prefill path only, in
    the wgmma kernel's own layout (4-14% slower, H100: BENCHMARKS.md).

    MXFP8 experts (E4M3 / E5M2) without ``packed``, up to :func:`mma_max_pairs` pairs and
    :data:`W16_MMA_MAX_PER_EXPERT` an expert: both GEMMs on the W8A16
    tensor-core kernels (``mma_a8w8.cu``) reading the experts' bytes as stored, sorted as the MXFP4 decode path
    (no NaN / Inf element code: else, and past that envelope, the grouped Triton kernel).

    Expert ids are not range-checked here (that would be a host sync): a pair whose id is outside the experts
    held contributes 0 on every path (where the reference raises)."""
    T, H, I, E, k = check_moe_args(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids,
                                   activation=activation, expert_range=expert_range, num_experts=num_experts)
    out_dtype = out_dtype or x.dtype
    plain = w_gate_up.scale_layout == "plain" and w_down.scale_layout == "plain"
    if x.dtype != torch.bfloat16 or not plain or not (supported(w_gate_up) and supported(w_down)):
        return moe_reference(x, w_gate_up, b_gate_up, w_down, b_down, topk_weights, topk_ids, activation=activation,
                             out_dtype=out_dtype, expert_range=expert_range, num_experts=num_experts,
                             intermediate_dtype=x.dtype)
    n = T * k
    if x.stride(-1) != 1 or x.is_neg():
        x = x.contiguous().resolve_neg()  # (a negative-bit view's memory holds -x, which the kernels read raw)
    if packed is not None and (tuple(packed[0].shape) != tuple(w_gate_up.shape)
                               or tuple(packed[1].shape) != tuple(w_down.shape)):
        raise ValueError(f"packed experts of shapes {tuple(packed[0].shape)} / {tuple(packed[1].shape)} were not made "
                         f"from these experts, {tuple(w_gate_up.shape)} / {tuple(w_down.shape)}")
    path = packed_path(packed, n, activation, x)
    if path is not None:
        return _run_packed(path, x, packed, b_gate_up, b_down, topk_weights, topk_ids, activation, out_dtype,
                           expert_range, num_experts or E)
    lo = expert_range[0] if expert_range is not None else 0
    rw = topk_weights.reshape(-1).to(torch.float32)
    per_expert = n / (num_experts or E)  # routed rows per expert (of all ranks: the same schedule on each)
    elem = _w16_mma_elem(w_gate_up, w_down, n, per_expert, activation, x) if n else None
    if elem is not None:
        y = _moe_w16_mma(x, w_gate_up, b_gate_up, w_down, b_down, rw, topk_ids, E, lo, T, k, I, H, activation, elem)
        return _combine_direct(y, topk_ids, lo, E, out_dtype)
    cfg1 = moe_config(per_expert, 2 * I, H)
    ids, eids = align_device(topk_ids, E, cfg1.block_m, lo=lo)
    h = grouped_matmul_w16(x, w_gate_up, ids, eids, cfg1, n_valid=n, top_k=k, gather=True, bias=b_gate_up,
                           activation=activation, out_dtype=x.dtype)
    cfg2 = moe_config(per_expert, H, I)
    if cfg2.block_m != cfg1.block_m:
        ids, eids = align_device(topk_ids, E, cfg2.block_m, lo=lo)
    # pairs routed to experts not held here (other ranks', or ids out of range) are left out of the sum: their
    # rows are not written by the kernel
    y = grouped_matmul_w16(h, w_down, ids, eids, cfg2, n_valid=n, top_k=k, gather=False, bias=b_down,
                           routing_weights=rw, out_dtype=torch.float32)
    return _combine_direct(y, topk_ids, lo, E, out_dtype)
