"""The row passes around the MoE expert GEMMs (:mod:`mxkit.kernels.moe`): the token rows gathered into the
expert-sorted order, the weighted combine of each token's k slots back to token order (fixed order, float32,
one rounding), and the expert biases kept in the packed experts' row order
(:mod:`mxkit.kernels.moe_details._moe_epilogue`'s kernels)."""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from ..._cache import tensor_version
from ..launch import _Launcher
from . import _moe_epilogue
from ._sort import _flat_ids

_GATHER = _Launcher(_moe_epilogue, "_gather_rows_kernel")
_COMBINE = _Launcher(_moe_epilogue, "_combine_kernel")
_WORDS = ((torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))


def gather_rows(x: torch.Tensor, ids: torch.Tensor, n: int, top_k: int, scale: Optional[torch.Tensor] = None,
                mma_k_order: bool = False):
    """The token rows of x (T, H) in the sorted order of :func:`align_device`'s ``ids`` (R,): row r is
    x[ids[r] // top_k] where ids[r] < n; padding rows are left unwritten (the grouped GEMMs compute them and
    nothing reads them). One Triton kernel. With ``scale`` (T,) float32 (the FP8 rowwise scales) also returns
    their (R,) gather, 0 on padding rows. ``mma_k_order`` (bf16 x, H % 64 == 0): the columns in the order of
    :func:`mxkit.kernels.matmul_details._layout_mma.mma_k_order` (the prefill kernel on decode-mma experts).
    Returns xs (R, H) [, scales (R,)]."""
    R, H = ids.numel(), x.shape[1]
    if mma_k_order and (x.element_size() != 2 or H % 64):
        raise ValueError(f"mma_k_order needs 16-bit rows of a multiple of 64, got {x.dtype} rows of {H}")
    xs = torch.empty(R, H, dtype=x.dtype, device=x.device)
    ss = torch.empty(R, dtype=torch.float32, device=x.device) if scale is not None else None
    row_bytes = H * x.element_size()
    word, size = next((w, b) for w, b in _WORDS if row_bytes % b == 0)
    W = row_bytes // size
    if R and W:
        import triton

        block_w = min(256, triton.next_power_of_2(W))
        rows = max(1, 1024 // block_w)
        x = x if x.is_contiguous() else x.contiguous()
        s_src, s_dst = (scale.reshape(-1), ss) if scale is not None else (xs, xs)  # (unread without HAS_SCALE)
        _GATHER((-(-R // rows),), (x.view(torch.uint8).view(word), ids, xs.view(torch.uint8).view(word), s_src,
                                   s_dst, n, R, W),
                (("TOP_K", top_k), ("ROWS", rows), ("BLOCK_W", block_w), ("HAS_SCALE", scale is not None),
                 ("PERM64", mma_k_order)), 4)
    return (xs, ss) if scale is not None else xs


def _combine(y: torch.Tensor, b: Optional[torch.Tensor], topk_weights: torch.Tensor, pos: torch.Tensor,
             experts: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`._moe_epilogue._combine_kernel`: out (T, H) from the sorted rows y (R, H)."""
    T, k = topk_weights.shape
    H = y.shape[1]
    out = torch.empty(T, H, dtype=out_dtype, device=y.device)
    if T:
        rw = topk_weights.to(torch.float32).contiguous()  # (no copies when already so)
        e = experts.to(torch.int32).contiguous()
        _COMBINE((T, -(-H // 1024)), (y, y if b is None else b.contiguous(), rw, pos, e, out, H, 0, 0),
                 (("TOP_K", k), ("HAS_BIAS", b is not None), ("BLOCK_H", 1024)), 4)
    return out


# (id(bias), data_ptr, dtype, device, activation) -> [weakref to it, its _version, float32 bias in the packed row
# order]; the storage too: Module.to / .half() / `p.data = ...` swap a Parameter's data keeping its object and version
_BIAS: dict = {}


def _packed_bias(b: torch.Tensor, N: int, order) -> torch.Tensor:
    """An expert bias (E, N) as float32 [E * N] in the packed experts' row order: :func:`pack_experts_wgmma`'s
    for ``order`` = its activation, :func:`pack_experts_mma`'s for ``("mma", interleaved)``; kept per tensor while
    it lives (no per-call kernels; entries go only with their bias, or past 4096 live ones). An in-place change of
    the bias (a version the entry has not seen) is written into the kept tensor, whose address stays: a CUDA graph
    captured after a first call reads the new bias, and one copy is kept a bias, not one a version. The write is on
    the current stream, as an in-place update of nn.Linear's bias is: a kernel still reading it on another stream
    must be waited for first. Not seen: an in-place change of an inference tensor (it keeps no version) or through
    ``b.data``."""
    from ..matmul_details._layout_wgmma import expert_row_order

    key = (id(b), b.data_ptr(), b.dtype, b.device, order)
    version = tensor_version(b)
    hit = _BIAS.get(key)
    if hit is not None and hit[0]() is b and hit[1] == version:
        return hit[2]
    f = b.detach().to(torch.float32)
    if isinstance(order, tuple):
        f = _interleave_halves(f, 1) if order[1] else f
    else:
        f = f[:, expert_row_order(N, order, b.device)]
    f = f.reshape(-1).contiguous()
    if hit is not None and hit[0]() is b:  # (the same bias, written in place: into the kept tensor)
        if hit[2].data_ptr() != f.data_ptr():
            hit[2].copy_(f)
        hit[1] = version
        return hit[2]
    for k_, (ref, _, _) in list(_BIAS.items()):  # drop the entries of biases that are gone
        if ref() is None:
            del _BIAS[k_]
    if len(_BIAS) > 4096:
        _BIAS.clear()
    _BIAS[key] = [weakref.ref(b), version, f]
    return f


def _combine_direct(y: torch.Tensor, topk_ids: torch.Tensor, lo: int, E: int, out_dtype) -> torch.Tensor:
    """out (T, H): each token's k rows of y (n, H) float32 (the pairs in token order, weighted) summed in order in
    float32 and rounded once (one kernel), leaving out the pairs of experts outside lo .. lo + E - 1 (their rows
    are unwritten: another rank's experts, or an id out of range, contributing 0)."""
    T, k = topk_ids.shape
    H = y.shape[1]
    out = torch.empty(T, H, dtype=out_dtype, device=y.device)
    if T:
        _COMBINE((T, -(-H // 1024)), (y, y, y, _flat_ids(topk_ids), y, out, H, lo, E),
                 (("TOP_K", k), ("HAS_BIAS", False), ("BLOCK_H", 1024), ("DIRECT", True)), 4)
    return out




def _interleave_halves(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate; up] halves along ``dim`` -> interleaved (gate 0, up 0, gate 1, ...)."""
    n = t.shape[dim] // 2
    return torch.stack([t.narrow(dim, 0, n), t.narrow(dim, n, n)], dim=dim + 1).flatten(dim, dim + 1)
