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
def _top_k_softmax(v, ok, cols, K: tl.constexpr, E_P2: tl.constexpr, K_P2: tl.constexpr, LOG_K_P2: tl.constexpr,
                   ROWS: tl.constexpr, EXPF: tl.constexpr):
    """The selection and softmax of the module docstring on logits v float32 [ROWS, E_P2] (``ok``: the real
    entries, ``cols`` [1, E_P2] their expert indices) -> (w float32 [ROWS, K_P2], ids int32 [ROWS, K_P2], slot
    [1, K_P2]); the slots past K hold w = 0."""
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
    return tl.math.div_rn(e, s), ids, slot


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
    w, ids, slot = _top_k_softmax(v, ok, cols, K, E_P2, K_P2, LOG_K_P2, ROWS, EXPF)
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


# --------------------------------------------------------------------------------------------------------
# the router GEMM, top-k and softmax in one launch (decode)

ROUTER_BLOCK_H, ROUTER_BLOCK_E = 128, 32  # the columns of H and the experts of one program
ROUTER_MAX_WORK = 32  # MXMoE routes T tokens of E experts through router_gpt_oss while T * ceil(E / 32) <= this
#                      (above: cuBLAS's GEMM and the routing kernel above). 24 routers of H = 2880 in one CUDA graph
#                      on the H200, µs a layer, this kernel against those two (h200-2026-12-03e/router_ab*.txt):
#                      E = 32: 4.5 / 8.8 at 1 token, 6.1 / 9.4 at 32, 8.3 / 9.5 at 64; E = 128: 7.5 / 10.1 at 1
#                      token, 12.0 / 10.5 at 16.


def router_max_tokens(E: int) -> int:
    """The most tokens MXMoE routes through :func:`router_gpt_oss` for E experts: 32 up to E = 32, 8 at E = 128
    (:data:`ROUTER_MAX_WORK`), at least 1."""
    return max(1, ROUTER_MAX_WORK // max(1, triton.cdiv(E, ROUTER_BLOCK_E)))  # (E = 0: a weight router_takes refuses)


_ROUTER_X = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}  # x dtypes taken -> PyTorch's NaN bits in that dtype


@triton.jit
def _router_gpt_oss_kernel(x_ptr, wt_ptr, b_ptr, part_ptr, logits_ptr, w_ptr, ids_ptr, cnt_ptr, E, H, stride_x,
                           HAS_BIAS: tl.constexpr, OUT_BF16: tl.constexpr, NAN_BITS: tl.constexpr,
                           S: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, EB: tl.constexpr,
                           SC: tl.constexpr, K: tl.constexpr, E_P2: tl.constexpr, K_P2: tl.constexpr,
                           LOG_K_P2: tl.constexpr, EXPF: tl.constexpr):
    """Token program_id(0), columns [BH * program_id(1), + BH) of H, experts [EB * program_id(2), + EB): the
    products and their sum in float64 -> part (T, S, G * EB) float64. The token's last program of its S * G to
    arrive (its counter in cnt, reset to 0 after) adds the S partial sums (SC rows at a time, a fixed order), the
    bias, rounds to float32 and then to x's dtype (NaN as NAN_BITS; an exact zero as +0.0), stores the logits
    (T, E) as int16 bits and writes the top-K ids and weights of :func:`_top_k_softmax` into w / ids (T, K)."""
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    e = tl.program_id(2) * EB + tl.arange(0, EB)
    hh = p * BH + tl.arange(0, BH)
    xv = tl.load(x_ptr + t * stride_x + hh, mask=hh < H, other=0.0).to(tl.float64)
    wv = tl.load(wt_ptr + e[:, None].to(tl.int64) * H + hh[None, :], mask=(e[:, None] < E) & (hh[None, :] < H),
                 other=0.0).to(tl.float64)
    s = tl.sum(wv * xv[None, :], axis=1)  # (bf16 / fp16 products are exact in float64)
    tl.store(part_ptr + (t * S + p) * (G * EB) + e, s)
    tl.debug_barrier()  # every thread's partial sums stored before the release below
    arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel")
    if arrived == S * G - 1:
        cols = tl.arange(0, E_P2)[None, :]
        ok = cols < E
        tot = tl.zeros([E_P2], dtype=tl.float64)
        for s0 in tl.static_range(0, S, SC):
            rows = s0 + tl.arange(0, SC)[:, None]
            part = tl.load(part_ptr + (t * S + rows) * (G * EB) + cols, mask=(rows < S) & ok, other=0.0,
                           volatile=True)
            tot += tl.sum(part, axis=0)
        tot = tot[None, :]
        if HAS_BIAS:
            tot += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float64)
        f = tl.where(tot == 0.0, 0.0, tot.to(tl.float32))
        if OUT_BF16:  # to nearest, ties to even, in integers (the CPU interpreter's bf16 cast truncates)
            b32 = f.to(tl.int32, bitcast=True)
            bits = (b32 + 0x7FFF + ((b32 >> 16) & 1)) >> 16
            v = tl.where(f != f, f, (bits << 16).to(tl.float32, bitcast=True))
        else:
            h16 = f.to(tl.float16)
            bits = h16.to(tl.int16, bitcast=True).to(tl.int32)
            v = h16.to(tl.float32)
        bits = tl.where(f != f, NAN_BITS, bits).to(tl.int16)
        tl.store(logits_ptr + t * E + cols, bits, mask=ok)
        w, ids, slot = _top_k_softmax(v, ok, cols, K, E_P2, K_P2, LOG_K_P2, 1, EXPF)
        keep = slot < K
        tl.store(w_ptr + t * K + slot, w, mask=keep)
        tl.store(ids_ptr + t * K + slot, ids, mask=keep)
        tl.store(cnt_ptr + t, 0)


_ROUTER_LAUNCH = _Launcher(sys.modules[__name__], "_router_gpt_oss_kernel")


def router_takes(x: torch.Tensor, weight: torch.Tensor, bias, top_k: int) -> bool:
    """Whether :func:`router_gpt_oss` takes these: CUDA x (T, H) bfloat16 / float16 with a unit column stride and
    1 <= T <= :func:`router_max_tokens` (E), weight (E, H) and bias (E,) or None contiguous in x's dtype on x's device,
    E <= 1024, 1 <= top_k <= min(E, 32)."""
    E = weight.shape[0] if weight.dim() == 2 else 0
    return (x.is_cuda and x.dtype in _ROUTER_X and x.dim() == 2 and 0 < x.shape[0] <= router_max_tokens(E)
            and x.stride(1) == 1 and weight.dtype == x.dtype and weight.device == x.device and weight.dim() == 2
            and weight.shape[1] == x.shape[1] and weight.is_contiguous() and 0 < E <= MAX_EXPERTS
            and (bias is None or (bias.dtype == x.dtype and bias.device == x.device and tuple(bias.shape) == (E,)
                                  and bias.is_contiguous()))
            and type(top_k) is int and 1 <= top_k <= min(E, MAX_TOP_K) and libdevice is not None)


def router_gpt_oss(x: torch.Tensor, weight: torch.Tensor, bias, top_k: int) -> tuple:
    """``(logits (T, E) in x's dtype, topk_weights (T, k) float32, topk_ids (T, k) int32)``: GPT-OSS's router
    (``x @ weight.T + bias``) and its routing in one launch, the bytes of
    :func:`mxkit.moe_reference.router_logits` and :func:`mxkit.moe_reference.route` (``"gpt_oss"``) on them. The
    caller checks :func:`router_takes`."""
    from ..matmul_details._mma_decode import pair_counters

    T, H = x.shape
    E = weight.shape[0]
    logits = torch.empty(T, E, dtype=x.dtype, device=x.device)
    w = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    e_p2, k_p2 = triton.next_power_of_2(E), triton.next_power_of_2(top_k)
    bh, eb = min(ROUTER_BLOCK_H, triton.next_power_of_2(H)), min(ROUTER_BLOCK_E, e_p2)
    S, G = triton.cdiv(H, bh), triton.cdiv(E, eb)  # S * G programs a token (GPT-OSS-20B: 23 * 1)
    part = torch.empty(T, S, G * eb, dtype=torch.float64, device=x.device)
    cnt = pair_counters(x.device, T, "router") if x.is_cuda else torch.zeros(T, dtype=torch.int32)  # (interpreter)
    _ROUTER_LAUNCH((T, S, G),
                   (x, weight, weight if bias is None else bias, part, logits.view(torch.int16), w, ids, cnt, E, H,
                    x.stride(0)),
                   (("HAS_BIAS", bias is not None), ("OUT_BF16", x.dtype == torch.bfloat16),
                    ("NAN_BITS", _ROUTER_X[x.dtype]), ("S", S), ("G", G), ("BH", bh), ("EB", eb),
                    ("SC", max(1, min(triton.next_power_of_2(S), 4096 // e_p2))), ("K", top_k),
                    ("E_P2", e_p2), ("K_P2", k_p2), ("LOG_K_P2", k_p2.bit_length() - 1), ("EXPF", x.is_cuda)), 8)
    return logits, w, ids
