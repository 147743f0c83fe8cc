"""GPT-OSS routing in one kernel: the router's logits (T, E) -> the top-k expert ids and the softmax over their
logits, for the MoE paths on CUDA. Its reference twin is :func:`mxkit.moe_reference.route` (``mode="gpt_oss"``),
which takes one stable sort, a gather, a cast, a softmax and another cast (six launches or more); this kernel
writes the same bytes in one.

Selection: the k largest logits of a row, largest first; equal logits by increasing expert index; NaN above
every number; -0.0 equal to +0.0 (the reference's integer keys, ``_order_key``; here packed with the index into
one int64 so that a max picks each slot). Weights: the float32 softmax of
the k selected logits written as PyTorch's CUDA softmax computes a row of up to 1024 elements
(``aten/src/ATen/native/cuda/PersistentSoftmax.cuh``, ``softmax_warp_forward``): m = max, e_j = expf(l_j - m)
(full-precision ``expf``), their sum by the warp's butterfly over the next power of two P >= k lanes (the lanes
past k hold 0: expf(-inf)), e_j / sum rounded to nearest. The butterfly adds lane j and lane j xor P / 2, then
j xor P / 4, ...: the first half of the row plus the second half, repeated, which is what the kernel does.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from ..launch import _Launcher

try:  # full-precision expf (PyTorch's std::exp)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover (older Triton)
    libdevice = None

_LOGITS = (torch.float32, torch.bfloat16, torch.float16)
MAX_EXPERTS, MAX_TOP_K = 1024, 32


@triton.jit
def _route_gpt_oss_kernel(logits_ptr, w_ptr, ids_ptr, T, E, stride, K: tl.constexpr, E_P2: tl.constexpr,
                          K_P2: tl.constexpr, LOG_K_P2: tl.constexpr, ROWS: tl.constexpr, EXPF: tl.constexpr):
    """Rows [ROWS * program_id(0), + ROWS) of logits (T, E) (row stride ``stride``) -> w float32 (T, K),
    ids int32 (T, K). K_P2 = 2^LOG_K_P2: the next power of two >= K. EXPF: libdevice's full-precision expf (the
    GPU; the CPU interpreter has no libdevice: tl.exp)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    r = rows[:, None]
    cols = tl.arange(0, E_P2)[None, :]
    ok = (r < T) & (cols < E)
    v = tl.load(logits_ptr + r.to(tl.int64) * stride + cols, mask=ok, other=0.0).to(tl.float32)
    # an int32 key ordered as the values, NaN above +inf, -0.0 equal to +0.0; then the index, lower first
    bits = v.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = tl.where(v == 0.0, 0, key)
    key = tl.where(v != v, 0x7FFFFFFF, key)
    key = (key.to(tl.int64) << 32) | (E_P2 - 1 - cols).to(tl.int64)
    key = tl.where(ok, key, -0x8000000000000000)
    slot = tl.arange(0, K_P2)[None, :]
    sel = tl.full([ROWS, K_P2], float("-inf"), tl.float32)  # lanes past K: -inf, as PyTorch's softmax pads
    ids = tl.zeros([ROWS, K_P2], dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(key, axis=1)[:, None]
        idx = (E_P2 - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        hit = cols == idx
        val = tl.sum(tl.where(hit, v, 0.0), axis=1)[:, None]
        sel = tl.where(slot == j, val, sel)
        ids = tl.where(slot == j, idx, ids)
        key = tl.where(hit, -0x8000000000000000, key)
    m = tl.max(sel, axis=1)[:, None]
    if EXPF:
        e = libdevice.exp(sel - m)
    else:
        e = tl.exp(sel - m)
    e = tl.where(slot < K, e, 0.0)
    s = e
    for h in tl.static_range(LOG_K_P2):  # the butterfly: first half + second half, until one lane
        s = tl.sum(tl.reshape(s, [ROWS, 2, K_P2 >> (h + 1)]), axis=1)
    w = tl.math.div_rn(e, s)
    out = r.to(tl.int64) * K + slot
    keep = (r < T) & (slot < K)
    tl.store(w_ptr + out, w, mask=keep)
    tl.store(ids_ptr + out, ids, mask=keep)


_LAUNCH = _Launcher(sys.modules[__name__], "_route_gpt_oss_kernel")


def takes(router_logits: torch.Tensor, top_k: int) -> bool:
    """Whether :func:`route_gpt_oss` takes these logits: CUDA, float32 / bfloat16 / float16, (T, E) with a unit
    column stride, E <= 1024 and 1 <= top_k <= min(E, 32)."""
    return (router_logits.is_cuda and router_logits.dtype in _LOGITS and router_logits.dim() == 2
            and router_logits.stride(1) == 1 and 0 < router_logits.shape[1] <= MAX_EXPERTS
            and type(top_k) is int and 1 <= top_k <= min(router_logits.shape[1], MAX_TOP_K)
            and libdevice is not None)


def route_gpt_oss(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_weights (T, k) float32, topk_ids (T, k) int32)`` of :func:`mxkit.moe_reference.route` in
    ``"gpt_oss"`` mode, in one launch (the module docstring has the arithmetic). The caller checks
    :func:`takes`."""
    T, E = router_logits.shape
    w = torch.empty(T, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=router_logits.device)
    if T:
        e_p2, k_p2 = triton.next_power_of_2(E), triton.next_power_of_2(top_k)
        rows = max(1, min(16, 4096 // e_p2))
        _LAUNCH((triton.cdiv(T, rows),), (router_logits, w, ids, T, E, router_logits.stride(0)),
                (("K", top_k), ("E_P2", e_p2), ("K_P2", k_p2), ("LOG_K_P2", k_p2.bit_length() - 1), ("ROWS", rows),
                 ("EXPF", router_logits.is_cuda)), 4)
    return w, ids
