"""The MoE expert computation on Hopper: token sorting on the device, two grouped GEMMs over MX expert weights
read as MX bytes (bf16 activations: W4A16 / W8A16), the activation fused into the first GEMM's epilogue, the
routing weight into the second's, and a fixed-order weighted combine.

Reference twin: :func:`mxkit.moe_reference.moe_reference` (``intermediate_dtype`` = the activation dtype, as
here); :func:`moe_triton` takes :func:`mxkit.moe.moe_experts`'s arguments less ``backend``. The jit body is
:mod:`mxkit.kernels.matmul_details._grouped`, whose weight tile the dense decode kernel shares.

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

import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from ..moe_reference import check_moe_args, moe_reference
from ..packed import partial_stats_host
from ..tensor import MXTensor
from .launch import _Launcher
from .matmul import W_KINDS, _nonfinite_codes
from .matmul_table import _envelope, _packaged_table
from .matmul_details._envelope import exact_scale_range, host_ints, scale_extrema, scale_stats
from .matmul_details import _align, _mma_decode, _moe_epilogue

# direct launches of the row kernels (Triton's own launcher took ~20 us of host time per launch)
_ALIGN_SMALL = _Launcher(_align, "_align_small_kernel")
_ALIGN_HIST = _Launcher(_align, "_align_hist_kernel")
_ALIGN_EXPERT = _Launcher(_align, "_align_expert_kernel")
_GATHER = _Launcher(_moe_epilogue, "_gather_rows_kernel")
_COMBINE = _Launcher(_moe_epilogue, "_combine_kernel")
_MIXED = _Launcher(_align, "_mixed_blocks_kernel")
_BIAS_ACT_FP8 = _Launcher(_moe_epilogue, "_bias_act_fp8_kernel")
_BIAS_ACT = _Launcher(_moe_epilogue, "_bias_act_kernel")
_WORDS = ((torch.int32, 4), (torch.int16, 2), (torch.uint8, 1))

__all__ = ["MoeConfig", "moe_config", "align_device", "grouped_matmul_w16", "moe_triton", "MmaExperts",
           "pack_experts_mma", "MMA_MAX_PAIRS", "mma_max_pairs", "WgmmaExperts", "pack_experts_wgmma",
           "wgmma_block_m", "mixed_blocks", "MIXED_SIZES", "moe_packed", "packed_path", "moe_mxfp4_triton"]


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


SMALL_PAIRS = 128  # up to this many (token, slot) pairs, one program sorts them (decode)


def max_blocks(n_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on the padded blocks of :func:`align_device`: every expert that receives a pair pads its
    group by at most block_m - 1."""
    return -(-(n_pairs + min(num_experts, n_pairs) * (block_m - 1)) // block_m)


def align_device(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, lo: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert on the device, without a host sync (vLLM's
    ``moe_align_block_size`` convention, as :func:`mxkit.moe_reference.align_block_size`): on CUDA one Triton
    program for up to :data:`SMALL_PAIRS` pairs (decode), one program per expert above; PyTorch ops
    (scatter-add, stable argsort, searchsorted) on the CPU.

    topk_ids: (T, k) int, global expert ids; the experts held are lo .. lo + num_experts - 1 (others' pairs
    are left out). Returns (sorted_ids int32 [B * block_m], expert_ids int32 [B]) with B =
    :func:`max_blocks`: the first blocks equal ``align_block_size``'s output (local expert ids), the rest
    are padding (sentinel T * k, expert -1)."""
    n = topk_ids.numel()
    E = num_experts
    B = max_blocks(n, E, block_m)
    if 0 < n <= SMALL_PAIRS and E <= 256 and topk_ids.is_cuda:
        return _align_small(topk_ids, E, block_m, lo, B)
    if n > SMALL_PAIRS and _experts_sort_runs(topk_ids, E):
        return _align_experts(topk_ids, E, block_m, lo, B)
    return _align_torch(topk_ids, E, block_m, lo, B)


def _align_torch(topk_ids: torch.Tensor, E: int, block_m: int, lo: int, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = topk_ids.numel()
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64) - lo
    key = torch.where((flat >= 0) & (flat < E), flat, E)  # bin E: other ranks' experts, sorted last
    # (torch.bincount reads the largest key on the host: a sync)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:E] + block_m - 1) // block_m * block_m
    pend = torch.cumsum(padded, 0)
    cend = torch.cumsum(counts, 0)
    order = torch.argsort(key, stable=True)
    ks = key[order]
    pstart = torch.cat([pend - padded, pend.new_zeros(1)])
    pos = pstart[ks] + torch.arange(n, device=dev) - (cend - counts)[ks]
    pos = torch.where(ks < E, pos, B * block_m)  # left out: one junk slot past the end
    sorted_ids = torch.full((B * block_m + 1,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, pos, order.to(torch.int32))
    eids = torch.searchsorted(pend // block_m, torch.arange(B, device=dev), right=True)
    eids = torch.where(eids < E, eids, -1).to(torch.int32)
    return sorted_ids[:-1], eids


_INTERPRET_ALIGN = False  # tests: run _align_expert_kernel on CPU tensors (under TRITON_INTERPRET=1)


def _experts_sort_runs(topk_ids: torch.Tensor, E: int) -> bool:
    """Whether :func:`_align_experts` sorts these pairs over E experts: CUDA ids (or the interpreter tests'), its
    histograms hold up to 1024 experts, int32 positions, and its grid's y (n / 8192 groups of chunks) within CUDA's
    65535."""
    return E <= 1024 and topk_ids.numel() <= 8192 * _mma_decode.MAX_STRIPS and (topk_ids.is_cuda or _INTERPRET_ALIGN)


def _align_experts(topk_ids: torch.Tensor, E: int, block_m: int, lo: int, B: int, top_k: int = 0,
                   offs: bool = False) -> tuple:
    """:func:`._align._align_expert_kernel`: (sorted_ids, expert_ids), plus pos (each pair's sorted row) when
    ``top_k`` > 0, plus (``offs``) int32 [E] the end row of each expert's padded group."""
    import triton

    ids = _flat_ids(topk_ids)
    n, chunk, group = ids.numel(), 1024, 8
    e_p2 = max(16, triton.next_power_of_2(E))
    n_chunks = -(-n // chunk)
    hist = torch.empty(n_chunks, e_p2, dtype=torch.int32, device=ids.device)
    sorted_ids = torch.empty(B * block_m, dtype=torch.int32, device=ids.device)
    eids = torch.empty(B, dtype=torch.int32, device=ids.device)
    pos = torch.empty(n if top_k else 0, dtype=torch.int32, device=ids.device)
    ends = torch.empty(E if offs else 0, dtype=torch.int32, device=ids.device)
    _ALIGN_HIST((n_chunks,), (ids, hist, pos, n, lo, E), (("E_P2", e_p2), ("CHUNK", chunk), ("ROWS", top_k > 0)), 4)
    _ALIGN_EXPERT((E, -(-n_chunks // group)), (ids, hist, sorted_ids, eids, pos, ends, n, lo, E, B, n_chunks),
                  (("E_P2", e_p2), ("CHUNK", chunk), ("GROUP", group), ("HROWS", max(1, 2048 // e_p2)),
                   ("BLOCK_M", block_m), ("TOP_K", top_k), ("OFFS", offs)), 4)
    return (sorted_ids, eids) + ((pos,) if top_k else ()) + ((ends,) if offs else ())


def _flat_ids(topk_ids: torch.Tensor) -> torch.Tensor:
    """The ids as the align kernels read them: flat and contiguous, int32 or int64 as given (no cast kernel: the
    router's int64 ids are read as they are)."""
    ids = topk_ids.reshape(-1)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int32)
    return ids if ids.is_contiguous() else ids.contiguous()


def _align_small(topk_ids: torch.Tensor, E: int, block_m: int, lo: int, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    n = topk_ids.numel()
    ids = _flat_ids(topk_ids)
    sorted_ids = torch.empty(B * block_m, dtype=torch.int32, device=ids.device)
    eids = torch.empty(B, dtype=torch.int32, device=ids.device)
    _ALIGN_SMALL((1,), (ids, sorted_ids, eids, n, lo, E, B),
                 (("N_P2", max(16, triton.next_power_of_2(n))), ("E_P2", max(16, triton.next_power_of_2(E))),
                  ("NB_P2", max(16, triton.next_power_of_2(B))), ("BLOCK_M", block_m)), 8)
    return sorted_ids, eids


_PER_VERSION: dict[tuple, tuple] = {}  # (what, id(t)) -> (weakref to t, its _version, the value)


def _per_version(what: str, t: torch.Tensor, compute):
    """``compute()`` for tensor ``t``, kept while ``t`` lives at that ``_version`` (a host sync once per tensor and
    version, not per call; at most 4096 entries)."""
    key = (what, id(t))
    hit = _PER_VERSION.get(key)
    if hit is None or hit[0]() is not t or hit[1] != t._version:
        if len(_PER_VERSION) > 4096:
            _PER_VERSION.clear()
        hit = (weakref.ref(t), t._version, compute())
        _PER_VERSION[key] = hit
    return hit[2]


def _in_envelope(w: MXTensor) -> bool:
    """Whether every scale byte of ``w`` (other than 0xFF, which yields NaN as the reference does) lies in the
    bf16-exact range of its format. One host sync per scale tensor and version (cached)."""
    lo, hi, _ = _per_version("extrema", w.scale, lambda: scale_extrema(w.scale))
    return _envelope_ok(w.fmt, lo, hi)


def _envelope_ok(fmt, lo: int, hi: int) -> bool:
    """Whether scale bytes in [lo, hi] (0xFF aside; hi < lo: none) are all in fmt's bf16-exact range."""
    rng = exact_scale_range(fmt, torch.bfloat16)
    return hi < lo or (rng[0] <= lo and hi <= rng[1])


def supported(w: MXTensor) -> bool:
    """Whether the grouped kernel takes expert weights ``w`` (element kind, plain scales, envelope, and N rows an
    expert within its grid's y: N / 64 <= 65535, CUDA's limit)."""
    return (w.fmt.name in W_KINDS and w.fmt.bits != 6 and w.block_size == 32
            and w.shape[-2] <= 64 * _mma_decode.MAX_STRIPS and _in_envelope(w))


def _codes_finite(w: MXTensor) -> bool:
    """Whether no element code of the experts ``w`` is NaN or Inf (True for formats without such codes; MXFP8:
    the W8A16 tensor-core kernels decode them as finite values). One host sync per MXFP8 codes tensor and version
    (cached)."""
    def compute() -> bool:
        bad = _nonfinite_codes(w)
        return bad is None or not bool(bad)

    return _per_version("finite", w.qdata, compute)


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


# the decode path: both expert GEMMs on the tensor-core decode kernel (matmul_details/mma_decode.cu)

# (token, slot) pairs up to which moe_triton takes the packed experts' decode kernels (64 tokens at top-4): the
# packaged default of the dispatch table's ``moe.mma_max_pairs``, which mma_max_pairs reads per GPU
MMA_MAX_PAIRS = int(_packaged_table()["default"]["moe"]["mma_max_pairs"])


def mma_max_pairs(device: torch.device, num_experts: int = 0) -> int:
    """The (token, slot) pairs up to which :func:`moe_triton` runs packed MXFP4 experts on the tensor-core decode
    kernels rather than the grouped wgmma prefill kernel, for a layer holding ``num_experts`` experts (0: not
    said): the larger of the dispatch table's ``moe.mma_max_pairs`` and ``moe.mma_max_pairs_per_expert`` ×
    ``num_experts`` for ``device``'s GPU (:func:`mxkit.kernels.matmul.gemm_table`; an override applies; a
    missing field takes the packaged default's: :data:`MMA_MAX_PAIRS`, 0 per expert). The H200's table says 256
    and 8 per expert (``mxkit tune gemm``: decode wins up to 8 pairs per expert on GPT-OSS-20B and -120B
    experts)."""
    entry = _envelope(device, "moe")
    if not entry:
        return MMA_MAX_PAIRS
    return max(int(entry["mma_max_pairs"]), int(entry.get("mma_max_pairs_per_expert", 0)) * num_experts)


@dataclass(frozen=True, eq=False)
class MmaExperts:
    """MXFP4 experts (E, N, K) in the layout of the tensor-core decode kernel (:func:`pack_experts_mma`): q, s
    of :func:`mxkit.kernels.matmul_details._mma_decode.pack_mma` on the (E * N, K) weight; ``special``: a scale
    byte 0 or 255 is present; ``interleaved``: rows reordered from ``[gate; up]`` halves to (gate, up) pairs;
    ``one_mul``: every scale byte is <= 128 (the prefill kernel's one-multiply decode); ``bf16_exact``: every
    scale byte in the bf16-exact envelope (:func:`supported`; the packed paths need it, as the grouped kernel
    does). The prefill path reads the same bytes (:func:`moe_triton`): one copy of the experts serves every
    token count."""

    q: torch.Tensor
    s: torch.Tensor
    shape: tuple
    special: bool
    interleaved: bool = False
    one_mul: bool = False
    bf16_exact: bool = True


def pack_experts_mma(w: MXTensor, *, interleave_halves: bool = False) -> Optional[MmaExperts]:
    """Pack MXFP4 experts (E, N, K) along K once for :func:`moe_triton` (``packed=``): the decode kernel's
    layout, which the prefill kernel reads too. None for other formats or shapes (N % 16, K % 64, N past
    1048560: :func:`~mxkit.kernels.matmul_details._mma_decode.shape_ok`). One host sync (the scale statistics
    behind the flags)."""
    from .matmul_details._mma_decode import pack_mma

    E, N, K = w.shape
    if w.fmt.name != "mxfp4_e2m1" or w.block_size != 32 or not _mma_decode.shape_ok(N, K) or w.axis != 2:
        return None
    qd, sc = w.qdata.reshape(E, N, K // 2), w.plain_scale().reshape(E, N, K // 32)
    if interleave_halves:
        qd, sc = _interleave_halves(qd, 1), _interleave_halves(sc, 1)
    sc = sc.reshape(E * N, K // 32).contiguous()
    q, s, part = pack_mma(qd.reshape(E * N, K // 2).contiguous(), sc, stats=True)
    lo, hi, nan = partial_stats_host(part) if part is not None else host_ints(scale_stats(sc))
    # special: a byte 0 or 0xFF; one_mul: every byte <= 128
    return MmaExperts(q, s, (E, N, K), lo == 0 or bool(nan), interleave_halves, hi <= 128 and not nan,
                      _envelope_ok(w.fmt, lo, hi))


def _mma_takes(packed: tuple, n: int, activation: str, x: torch.Tensor) -> bool:
    """Whether moe_triton's decode path runs: both experts packed (gate_up interleaved for "swiglu"), at most
    :func:`mma_max_pairs` pairs, x's rows readable as they are, the kernel loadable here."""
    from .matmul_details import _mma_decode as mma

    p1, p2 = packed
    return (p1 is not None and p2 is not None and n <= mma_max_pairs(x.device, p1.shape[0])
            and p1.interleaved == (activation == "swiglu")
            and mma.rows_ok(x) and mma.available(x.device) is None)


def mma_strips(device: torch.device) -> int:
    """16-row strips a block of the grouped decode kernels (:func:`~mxkit.kernels.matmul_details._mma_decode.
    grouped_mma`) on ``device``: the dispatch table's ``moe.mma_strips`` (default 1; a value the kernels do not
    have, :data:`~mxkit.kernels.matmul_details._mma_decode.GROUPED_STRIPS`, counts as 1). The same bits at each."""
    entry = _envelope(device, "moe")
    sn = (entry or {}).get("mma_strips", 1)
    return sn if sn in _mma_decode.GROUPED_STRIPS else 1


def _moe_mma(x, p1: MmaExperts, b1, p2: MmaExperts, b2, rw, topk_ids, E, lo, T, k, I, H,
             activation) -> torch.Tensor:
    from .matmul_details._mma_decode import grouped_mma

    n = T * k
    ids, eids = align_device(topk_ids, E, 8, lo=lo)
    b1, b2 = _mma_biases(b1, b2, p1, I, H)
    sn = mma_strips(x.device)
    h = torch.empty(n, I, device=x.device, dtype=torch.bfloat16)
    grouped_mma(x, p1.q, p1.s, p1.special, 2 * I, H, ids, eids, n, k, gather=True, bias=b1, activation=activation,
                rw=None, out=h, strips=sn)
    y = torch.empty(n, H, device=x.device, dtype=torch.float32)  # (rows of pairs not held here: left unwritten)
    grouped_mma(h, p2.q, p2.s, p2.special, H, I, ids, eids, n, k, gather=False, bias=b2, activation=None,
                rw=rw.contiguous(), out=y, strips=sn)
    return y


def _mma_biases(b1, b2, p1: MmaExperts, I: int, H: int) -> tuple:
    """The expert biases of the decode kernels: float32 in the packed row order, kept per tensor and version (a
    bf16 model's would otherwise cost two cast kernels a decode step); None stays None."""
    return (None if b1 is None else _packed_bias(b1, 2 * I, ("mma", p1.interleaved)),
            None if b2 is None else _packed_bias(b2, H, ("mma", False)))


def _moe_mma_pairs(x, p1: MmaExperts, b1, p2: MmaExperts, b2, rw, topk_ids, E, T, k, I, H,
                   activation) -> torch.Tensor:
    """Up to ``_mma_decode.SMALL_PAIRS`` (token, slot) pairs on all the experts, bf16 out: both GEMMs one block per
    pair from the router's ids (no sort, no int32 copy), the down GEMM combining the slots (no combine kernel);
    the bytes of _moe_mma and the combine."""
    pairs_mma = _mma_decode.pairs_mma
    ids = _flat_ids(topk_ids)
    b1, b2 = _mma_biases(b1, b2, p1, I, H)
    n = T * k
    h = torch.empty(n, I, device=x.device, dtype=torch.bfloat16)
    pairs_mma(x, p1.q, p1.s, p1.special, 2 * I, H, ids, k, E, bias=b1, activation=activation, rw=None, out=h)
    out = torch.empty(T, H, device=x.device, dtype=torch.bfloat16)
    ws = torch.empty(n, H, device=x.device, dtype=torch.float32)
    return pairs_mma(h, p2.q, p2.s, p2.special, H, I, ids, k, E, bias=b2, activation=None, rw=rw, out=out, ws=ws)


# (token, slot) pairs per expert (of all ranks) up to which MXFP8 experts take the W8A16 tensor-core kernels in
# blocks of 8 sorted rows; past it the grouped Triton kernel's larger blocks read each expert's bytes fewer times
# (H200, GPT-OSS experts, CUDA graphs: 2 pairs an expert 21-25% faster on these kernels, 8 pairs 8% slower)
W16_MMA_MAX_PER_EXPERT = 4


def _w16_mma_elem(w1: MXTensor, w2: MXTensor, n: int, per_expert: float, activation: str,
                  x: torch.Tensor) -> Optional[str]:
    """The element ("e4m3" / "e5m2") where moe_triton's W8A16 decode path takes MXFP8 experts as stored: at most
    :func:`mma_max_pairs` pairs (the envelope MXMoE hands the prefill its packed experts past) and
    :data:`W16_MMA_MAX_PER_EXPERT` an expert on average, both GEMMs' shapes in the kernels' tiles, x's rows
    readable as they are, no NaN / Inf code, the kernel loadable here; else None (the grouped Triton kernel)."""
    from .matmul_details import _mma_a8w8

    elem = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2"}.get(w1.fmt.name)
    if elem is None or w2.fmt.name != w1.fmt.name or n > mma_max_pairs(x.device) \
            or per_expert > W16_MMA_MAX_PER_EXPERT:
        return None
    E, N1, H = w1.shape
    I = w2.shape[2]
    if N1 % (32 if activation == "swiglu" else 16) or H % 64 or I % 64:
        return None
    if not _mma_a8w8.x_ok(x, True) or _mma_a8w8.available(x.device) is not None:
        return None
    return elem if _codes_finite(w1) and _codes_finite(w2) else None


def _moe_w16_mma(x, w1: MXTensor, b1, w2: MXTensor, b2, rw, topk_ids, E, lo, T, k, I, H, activation,
                 elem: str) -> torch.Tensor:
    """Both expert GEMMs of MXFP8 experts on the W8A16 tensor-core kernels (``mma_a8w8.cu``), tokens sorted by
    expert in blocks of 8 (the MXFP4 decode path's sort, bias, activation and routing weight): y float32 (T k,
    H), the rows of pairs not held here unwritten, for :func:`_combine_direct`."""
    from .matmul_details._mma_a8w8 import grouped_w16

    n = T * k
    ids, eids = align_device(topk_ids, E, 8, lo=lo)
    b1 = None if b1 is None else _packed_bias(b1, 2 * I, ("mma", False))  # (float32, rows as stored)
    b2 = None if b2 is None else _packed_bias(b2, H, ("mma", False))
    h = torch.empty(n, I, device=x.device, dtype=torch.bfloat16)
    grouped_w16(x, w1.qdata.contiguous(), w1.scale.contiguous(), elem, 2 * I, H, ids, eids, n, k, gather=True,
                bias=b1, activation=activation, rw=None, out=h)
    y = torch.empty(n, H, device=x.device, dtype=torch.float32)
    grouped_w16(h, w2.qdata.contiguous(), w2.scale.contiguous(), elem, H, I, ids, eids, n, k, gather=False, bias=b2,
                activation=None, rw=rw.contiguous(), out=y)
    return y


# the prefill path: both expert GEMMs on the W4A16 wgmma kernel (matmul_details/_w4a16_wgmma.py), grouped


@dataclass(frozen=True, eq=False)
class WgmmaExperts:
    """MXFP4 or MXFP8 experts (E, N, K) in the grouped wgmma kernel's layout (:func:`pack_experts_wgmma`): q, st,
    one_mul of :func:`mxkit.kernels.matmul_details._w4a16_wgmma.pack_wgmma_experts`; ``act_pairs``: the
    activation whose (gate, up) row order the rows were packed in (gate_up experts), or None; ``elem``: the
    kernel's element decode ("e2m1", "e4m3", "e5m2")."""

    q: torch.Tensor
    st: torch.Tensor
    one_mul: bool
    shape: tuple
    act_pairs: Optional[str] = None
    elem: str = "e2m1"


def pack_experts_wgmma(w: MXTensor, *, act_pairs: Optional[str] = None) -> Optional[WgmmaExperts]:
    """Pack MXFP4 or MXFP8 (E4M3 / E5M2) experts (E, N, K) along K once for the prefill path of
    :func:`moe_triton` (``packed=``); ``act_pairs``: the gate_up experts' activation (``"swiglu_gpt_oss"``: rows
    interleaved gate, up, ...; ``"swiglu"``: ``[gate; up]`` halves), whose pairs the kernel's epilogue fuses.
    None for other formats or shapes (N % 16, K % 32, E * N % 8), and for MXFP8 experts with a scale byte
    outside the bf16-exact envelope or a NaN / Inf code (the wgmma decode does not keep them; the grouped
    Triton kernel takes those). Same bytes as the experts (a copy); one or two host syncs (scale extrema,
    MXFP8 codes)."""
    from .matmul_details._w4a16_wgmma import FP8_ELEMS, pack_wgmma_experts

    E, N, K = w.shape
    elem = FP8_ELEMS.get(w.fmt.name, "e2m1" if w.fmt.name == "mxfp4_e2m1" else None)
    if elem is None or w.axis != 2 or w.block_size != 32 or N % 16 or K % 32 or (E * N) % 8:
        return None
    if elem == "e2m1":
        qd, sc = w.qdata.reshape(E, N, K // 2), w.plain_scale().reshape(E, N, K // 32)
        return WgmmaExperts(*pack_wgmma_experts(qd, sc, act_pairs), (E, N, K), act_pairs)
    lo, hi, nan = scale_extrema(w.scale)
    if not _envelope_ok(w.fmt, lo, hi) or bool(_nonfinite_codes(w)):
        return None
    sc = w.plain_scale().reshape(E, N, K // 32)  # (a 0xFF byte: the two-multiply decode, which keeps its NaN)
    q, st, one_mul = pack_wgmma_experts(w.qdata.reshape(E, N, K), sc, act_pairs, elem, 255 if nan else hi)
    return WgmmaExperts(q, st, one_mul, (E, N, K), act_pairs, elem)


def wgmma_block_m(pairs_per_expert: float) -> int:
    """Sorted rows per program of the grouped wgmma kernel for an average of ``pairs_per_expert`` routed rows
    per expert (the padding of each expert's group against the tile's efficiency; H100, BENCHMARKS.md)."""
    import os

    forced = os.environ.get("MXKIT_MOE_WGMMA_BM")
    if forced:
        return int(forced)
    if pairs_per_expert <= 16:
        return 32
    if pairs_per_expert <= 48:
        return 64
    return 128 if pairs_per_expert <= 384 else 256


MIXED_SIZES = (256, 128, 64)  # the block sizes of mixed_blocks, one launch each


def mixed_blocks_device(ends: torch.Tensor, n: int) -> list[tuple[int, torch.Tensor]]:
    """:func:`mixed_blocks` in one Triton launch (``_align._mixed_blocks_kernel``; the same tables)."""
    import triton

    E = ends.numel()
    tabs = [(bm, torch.empty(2, n // 256 + E if bm == 256 else E, dtype=torch.int32, device=ends.device))
            for bm in MIXED_SIZES]
    nb = tabs[0][1].shape[1]
    ends = ends if ends.dtype == torch.int32 and ends.is_contiguous() else ends.to(torch.int32).contiguous()
    _MIXED((-(-nb // 128),), (ends, tabs[0][1], tabs[1][1], tabs[2][1], E, nb),
           (("E_P2", max(16, triton.next_power_of_2(E))), ("BLOCK", 128)), 4)
    return tabs


def mixed_blocks(ends: torch.Tensor, n: int) -> list[tuple[int, torch.Tensor]]:
    """Blocks of several sizes covering experts' sorted groups padded to 64 rows (:func:`align_device` with
    block_m 64): each group's first rows in blocks of 256 rows, the rest in at most one block of 128 and one of
    64, so a group pads to 64 rows rather than to 256 while most of its rows still run in the widest tile.
    ``ends``: int32 [E], the end row of each expert's group (groups in expert order from row 0); ``n``: the
    (token, slot) pairs (bounds the block count without a host sync). Returns [(bm, table int32 [2, NB])] for bm
    in :data:`MIXED_SIZES`: table[0] the block's local expert (-1: no block), table[1] its first row, for
    :func:`~mxkit.kernels.matmul_details._w4a16_wgmma.w4a16_wgmma`'s ``starts`` (one launch per size)."""
    E = ends.numel()
    dev = ends.device
    end = ends.to(torch.int64)
    start = torch.cat([end.new_zeros(1), end[:-1]])
    g = (end - start) // 64  # 64-row blocks of each group
    nfull, t = g // 4, g % 4
    # blocks of 256: expert e's j-th at start_e + 256 j (at most n / 256 + E of them)
    nb = n // 256 + E
    cum = torch.cumsum(nfull, 0)
    idx = torch.arange(nb, device=dev)
    owner = torch.searchsorted(cum, idx, right=True)
    ok = owner < E
    oc = owner.clamp(max=E - 1)
    first = start[oc] + 256 * (idx - (cum[oc] - nfull[oc]))
    experts = torch.arange(E, device=dev)
    rest = start + 256 * nfull
    half, tail = t >= 2, t % 2 == 1
    tables = [torch.stack([torch.where(ok, oc, -1), torch.where(ok, first, 0)]),
              torch.stack([torch.where(half, experts, -1), torch.where(half, rest, 0)]),
              torch.stack([torch.where(tail, experts, -1), torch.where(tail, rest + 128 * half, 0)])]
    return [(bm, tab.to(torch.int32).contiguous()) for bm, tab in zip(MIXED_SIZES, tables)]


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


def _wgmma_takes(packed: tuple, n: int, activation: str, x: torch.Tensor) -> bool:
    """Whether moe_triton's prefill path runs: more than :func:`mma_max_pairs` pairs, the kernel available here, and
    both experts packed for it (gate_up in ``activation``'s row order) or for the decode path (the same bytes
    read in that layout)."""
    from .matmul_details import _w4a16_wgmma as wg

    p1, p2 = packed
    # (the per-expert part of the envelope holds where the decode kernel could take the experts: MmaExperts)
    held = p1.shape[0] if isinstance(p1, MmaExperts) else 0
    if n <= mma_max_pairs(x.device, held) or wg.available(x.device) is not None:
        return False
    if isinstance(p1, MmaExperts) and isinstance(p2, MmaExperts):
        return p1.interleaved == (activation == "swiglu") and not p2.interleaved
    return (isinstance(p1, WgmmaExperts) and isinstance(p2, WgmmaExperts) and p1.act_pairs == activation
            and p2.act_pairs is None)


def _sorted_rows(ids: torch.Tensor, n: int) -> torch.Tensor:
    """int32 (n,): the sorted row of each flat (token, slot) pair of :func:`align_device`'s ``ids``; -1 for a
    pair not held here."""
    pos = torch.full((n + 1,), -1, dtype=torch.int32, device=ids.device)
    pos.scatter_(0, torch.where(ids < n, ids, n).long(), torch.arange(ids.numel(), dtype=torch.int32,
                                                                       device=ids.device))
    return pos[:n]


def _align_rows(topk_ids: torch.Tensor, E: int, bm: int, lo: int, B: int, offs: bool = False) -> tuple:
    """:func:`align_device`'s (sorted_ids, expert_ids) and each pair's sorted row (-1: not held here), plus
    (``offs``) int32 [E] the end row of each expert's padded group, from the sort's kernels where they run."""
    if _experts_sort_runs(topk_ids, E):
        return _align_experts(topk_ids, E, bm, lo, B, top_k=topk_ids.shape[1], offs=offs)
    ids, eids = align_device(topk_ids, E, bm, lo=lo)
    rows = (ids, eids, _sorted_rows(ids, topk_ids.numel()))
    if not offs:
        return rows
    # each expert's group ends where the blocks of experts <= e end (unused blocks, expert -1, sort last)
    block_e = torch.where(eids < 0, E, eids)
    ends = torch.searchsorted(block_e, torch.arange(E, device=eids.device, dtype=block_e.dtype), right=True) * bm
    return rows + (ends.to(torch.int32),)


def gather_rows(x: torch.Tensor, ids: torch.Tensor, n: int, top_k: int, scale: Optional[torch.Tensor] = None,
                mma_k_order: bool = False):
    """The token rows of x (T, H) in the sorted order of :func:`align_device`'s ``ids`` (R,): row r is
    x[ids[r] // top_k] where ids[r] < n; padding rows are left unwritten (the grouped GEMMs compute them and
    nothing reads them). One Triton kernel. With ``scale`` (T,) float32 (the FP8 rowwise scales) also returns
    their (R,) gather, 0 on padding rows. ``mma_k_order`` (bf16 x, H % 64 == 0): the columns in the order of
    :func:`mxkit.kernels.matmul_details._w4a16_wgmma.mma_k_order` (the prefill kernel on decode-mma experts).
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


def _moe_wgmma(x, p1, b1, p2, b2, topk_weights, topk_ids, E, lo, n_total_experts, activation, out_dtype
               ) -> torch.Tensor:
    """Both GEMMs on the grouped wgmma kernel, the experts in its layout (WgmmaExperts) or in the decode
    kernel's (MmaExperts: x gathered in that layout's K order, h written in it)."""
    from .matmul_details._w4a16_wgmma import w4a16_wgmma

    T, k = topk_ids.shape
    n = T * k
    _, N1, H = p1.shape
    mma = isinstance(p1, MmaExperts)
    bm = wgmma_block_m(n / n_total_experts)
    mixed = bm == 256 and _mixed_on()
    B = max_blocks(n, E, 64 if mixed else bm)
    if mixed:  # groups padded to 64 rows, covered by blocks of 256, then 128 / 64 (mixed_blocks)
        ids, _, pos, ends = _align_rows(topk_ids, E, 64, lo, B, offs=True)
        launches = [(b, tab, True) for b, tab in mixed_blocks_device(ends, n)]
    else:
        ids, eids, pos = _align_rows(topk_ids, E, bm, lo, B)
        launches = [(bm, eids, False)]
    xs = gather_rows(x, ids, n, k, mma_k_order=mma)
    if b1 is not None:
        b1 = _packed_bias(b1, N1, ("mma", p1.interleaved) if mma else activation)
    h = torch.empty(ids.numel(), N1 // 2, dtype=torch.bfloat16, device=x.device)
    y = torch.empty(ids.numel(), H, dtype=torch.float32, device=x.device)
    (s1, s2), layout = ((p1.s, p2.s), "mma") if mma else ((p1.st, p2.st), "wgmma")
    e1, e2 = ("e2m1", "e2m1") if mma else (p1.elem, p2.elem)
    for b, tab, starts in launches:  # (h in the K order the second GEMM's layout reads)
        w4a16_wgmma(xs, p1.q, s1, N1, p1.one_mul, bias=b1, y=h, expert_ids=tab, bm=b, activation=activation,
                    layout=layout, perm_out=mma, starts=starts, elem=e1)
    for b, tab, starts in launches:
        w4a16_wgmma(h, p2.q, s2, H, p2.one_mul, out=torch.float32, y=y, expert_ids=tab, bm=b, layout=layout,
                    starts=starts, elem=e2)
    return _combine(y, b2, topk_weights, pos, topk_ids if lo == 0 else topk_ids - lo, out_dtype)


def _mixed_on() -> bool:
    """Mixed block sizes for the prefill GEMMs where blocks of 256 rows would run (at 384 pairs per expert and
    more: H100 GPT-OSS-120B at 16384 tokens 6.72 -> 6.16 ms; at 128 rows a block they gained nothing and their
    extra launches cost host time). ``MXKIT_MOE_MIXED=0`` turns them off, for A/B runs."""
    import os

    return os.environ.get("MXKIT_MOE_MIXED", "1") != "0"


_BIAS: dict = {}  # (id(bias), its _version, activation) -> (weakref to it, float32 bias in the packed row order)


def _packed_bias(b: torch.Tensor, N: int, order) -> torch.Tensor:
    """An expert bias (E, N) as float32 [E * N] in the packed experts' row order: :func:`pack_experts_wgmma`'s
    for ``order`` = its activation, :func:`pack_experts_mma`'s for ``("mma", interleaved)``; kept per tensor and
    version while the tensor lives (no per-call kernels; a CUDA graph captured after a first call reads the kept
    tensor, which stays valid: entries go only with their bias, or past 4096 live ones)."""
    from .matmul_details._w4a16_wgmma import expert_row_order

    key = (id(b), b._version, order)
    hit = _BIAS.get(key)
    if hit is None or hit[0]() is not b:
        for k_, (ref, _) in list(_BIAS.items()):  # drop the entries of biases that are gone
            if ref() is None:
                del _BIAS[k_]
        if len(_BIAS) > 4096:
            _BIAS.clear()
        f = b.detach().to(torch.float32)
        if isinstance(order, tuple):
            f = _interleave_halves(f, 1) if order[1] else f
        else:
            f = f[:, expert_row_order(N, order, b.device)]
        hit = (weakref.ref(b), f.reshape(-1).contiguous())
        _BIAS[key] = hit
    return hit[1]


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
    if x.stride(-1) != 1:
        x = x.contiguous()
    path = packed_path(packed, topk_ids.numel(), activation, x)
    if path is None:
        return None
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

    packed: (gate_up, down) of :func:`pack_experts_mma` made from these experts (gate_up with
    ``interleave_halves`` for ``"swiglu"``), one copy for every token count: up to :func:`mma_max_pairs` (token,
    slot) pairs both GEMMs run on the tensor-core decode kernel (blocks of 8 sorted rows; any scale byte exact;
    the same roundings: h in bf16, the down GEMM in float32); above, on the grouped W4A16 wgmma kernel
    (Hopper) reading the same bytes: rows gathered into sorted order (columns in that layout's K order), bias
    and activation in the first GEMM's epilogue, h in bf16 (written in the K order), the down GEMM stored
    float32 in sorted order, then the combine (bias, routing weight, k slots in order). Or (gate_up, down) of
    :func:`pack_experts_wgmma` (gate_up with ``act_pairs`` = ``activation``; any K % 32): the prefill path
    only, in the wgmma kernel's own layout (4-14% slower, H100: BENCHMARKS.md).

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
    if x.stride(-1) != 1:
        x = x.contiguous()
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


# --------------------------------------------------------------------------------------------------------
# W4A8: FP8 E4M3 rowwise activations x MXFP4 / MXFP6 experts folded to E4M3 (the fold path of issue #22)


def _interleave_halves(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate; up] halves along ``dim`` -> interleaved (gate 0, up 0, gate 1, ...)."""
    n = t.shape[dim] // 2
    return torch.stack([t.narrow(dim, 0, n), t.narrow(dim, n, n)], dim=dim + 1).flatten(dim, dim + 1)


@dataclass(frozen=True, eq=False)
class FoldedExperts:
    """Experts (E, N, K) folded once to FP8 E4M3 with one float32 power-of-two scale per row, for
    ``torch._scaled_grouped_mm`` (:func:`fold_experts`): data float8_e4m3fn (E, N, K), scale float32 (E, N),
    ``interleaved``: rows reordered from ``[gate; up]`` halves to interleaved pairs (for ``"swiglu"``)."""

    data: torch.Tensor
    scale: torch.Tensor
    interleaved: bool = False


def fold_experts(w: MXTensor, *, interleave_halves: bool = False) -> Optional[FoldedExperts]:
    """Fold MX experts (E, N, K) along K (FP4 / FP6) for the W4A8 and the MXFP4 x MXFP4 MoE (:func:`moe_w4a8_triton`,
    :func:`moe_mxfp4_triton`): exact (:mod:`mxkit.fold`). Returns None
    when a row does not fold into one E4M3 row with a row scale inside the FP8 epilogue's envelope (block scales
    spanning more than the fold range, or :data:`mxkit.kernels.matmul.FOLD_EXP_LIMIT`): such experts take the
    reference. One host sync (pack time)."""
    from .matmul import pack_weight

    E, N, K = w.shape
    flat = MXTensor._trusted(w.qdata.reshape(E * N, -1), w.plain_scale().reshape(E * N, -1), w.fmt, 1,
                             w.block_size, torch.Size((E * N, K)), w.scale_mode, w.rounding, "plain")
    pw = pack_weight(flat, act="fp8_rowwise")
    if pw.folded is None or pw.special_rows.numel() or pw.folded.owner.numel():
        return None
    data, scale = pw.folded.data.view(E, N, K), pw.folded.scale.view(E, N)
    if interleave_halves:
        data, scale = _interleave_halves(data, 1).contiguous(), _interleave_halves(scale, 1).contiguous()
    return FoldedExperts(data, scale, interleave_halves)


def _grouped_fp8(a: torch.Tensor, sa: torch.Tensor, w: FoldedExperts, offs: torch.Tensor) -> torch.Tensor:
    """bf16 (R, N): row r of ``a`` (R, K) float8_e4m3fn times its scale ``sa[r]`` (float32) times expert e's folded
    rows, for the rows of expert e's group (ending at ``offs[e]``, int32 [E]), by ``torch._scaled_grouped_mm``
    (CUDA sm_90: float32 accumulation, one rounding); rows past ``offs[-1]`` unspecified."""
    return torch._scaled_grouped_mm(a, w.data.transpose(1, 2), sa, w.scale, offs=offs, out_dtype=torch.bfloat16)


def moe_w4a8_triton(
    xq,
    w_gate_up: FoldedExperts,
    b_gate_up: Optional[torch.Tensor],
    w_down: FoldedExperts,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
    stages: Optional[dict] = None,
) -> torch.Tensor:
    """The W4A8 expert computation (TensorRT-LLM's GPT-OSS mode on Hopper) on FP8 tensor cores; reference twin
    :func:`mxkit.moe_reference.moe_w4a8_reference` (MXTensor experts; the same rounding points):

    1. ``h = (xq.data * xq.scale)[token] @ W1[e].T`` by ``torch._scaled_grouped_mm`` on the tokens sorted by
       expert (padded to 16 rows per expert), rounded once to bf16;
    2. one pass per row: ``v = act(h + b1[e])`` in float32, then FP8 E4M3 rowwise (:func:`mxkit.quantize_fp8_rowwise`'s
       rule) -> (h8, s2);
    3. ``y = (h8 * s2) @ W2[e].T`` the same way, rounded once to bf16;
    4. one pass per token: ``(y + b2[e]) * topk_weight`` summed over the k slots in float32, rounded to
       ``out_dtype``.
    Each GEMM is exact for its FP8 inputs (the fold is exact; float32 accumulation, one rounding).

    xq: :class:`mxkit.Fp8Rowwise` (T, H); w_gate_up / w_down: :func:`fold_experts` of (E, 2I, H) / (E, H, I)
    (w_gate_up interleaved for ``"swiglu"``); b_gate_up (E, 2I) in the checkpoint's row order, b_down (E, H);
    topk (T, k). ``stages``: a dict that receives the intermediates (tests). Returns (T, H). No host sync."""
    from .matmul_details._grouped import ACTS
    import triton

    bm = 16
    T, H = xq.data.shape
    k = topk_ids.shape[1]
    E, N1, _ = w_gate_up.data.shape
    I = N1 // 2  # noqa: E741 (GPT-OSS's name)
    n = T * k
    ids, eids, pos, offs = _align_rows(topk_ids, E, bm, 0, max_blocks(n, E, bm), offs=True)
    R = ids.numel()
    xa, sa = gather_rows(xq.data, ids, n, k, scale=xq.scale)  # (padding rows: any codes, scale 0)
    h = _grouped_fp8(xa, sa, w_gate_up, offs)
    b1 = b_gate_up
    if b1 is not None and w_gate_up.interleaved:
        b1 = _interleave_halves(b1, 1)
    h8 = torch.empty(R, I, dtype=torch.float8_e4m3fn, device=h.device)
    s2 = torch.empty(R, dtype=torch.float32, device=h.device)
    if R:
        _BIAS_ACT_FP8((R,), (h, h if b1 is None else b1.contiguous(), ids, eids, h8, s2, n, N1),
                      (("ACT", ACTS[activation]), ("HAS_BIAS", b1 is not None), ("BLOCK_M", bm),
                       ("BLOCK_N", triton.next_power_of_2(N1))), 4)
    y = _grouped_fp8(h8, s2, w_down, offs)
    out = _combine(y, b_down, topk_weights, pos, topk_ids, out_dtype)
    if stages is not None:
        stages.update(ids=ids, eids=eids, h=h, h8=h8, s2=s2, y=y, xa=xa, sa=sa)
    return out


# --------------------------------------------------------------------------------------------------------
# MXFP4 x MXFP4: the tokens and the intermediate quantized to MXFP4 x MXFP4 / MXFP6 experts, each side folded to
# E4M3 (the fold path of issue #22) on FP8 tensor cores; rows that do not fold exactly are fixed up on the device


ACT_MXFP4 = "mxfp4_e2m1"  # the activation format of moe_mxfp4_triton (OCP FLOOR scales, RNE: mxkit.quantize's)


def moe_mxfp4_triton(
    x: torch.Tensor,
    w_gate_up: FoldedExperts,
    b_gate_up: Optional[torch.Tensor],
    w_down: FoldedExperts,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
    stages: Optional[dict] = None,
) -> torch.Tensor:
    """The MXFP4 x MXFP4 expert computation on FP8 tensor cores; reference twin
    :func:`mxkit.moe_reference.moe_mxfp4_reference` (the same rounding points):

    1. the tokens quantized to MXFP4 along H (:func:`mxkit.quantize`'s bytes: OCP FLOOR scales, RNE) and folded
       to E4M3 rows with power-of-two row scales in one pass (:func:`mxkit.kernels.fold.quantize_fold_triton`,
       deferred: no host sync), gathered into the expert-sorted order (groups padded to 16 rows);
    2. ``h = xq[token] @ W1[e].T`` by ``torch._scaled_grouped_mm``, rounded once to bf16; then the grouped
       fix-up (:func:`mxkit.kernels.matmul_details._row_fixup.grouped_fixup`) recomputes, from x's rows and the
       folded experts, the rows whose token does not fold exactly (block scales spanning more than 14 steps, or
       a row scale outside 2^+-FOLD_EXP_LIMIT);
    3. one pass per sorted row: ``v = act(h + b1[e])`` in float32, then v quantized to MXFP4 and folded the same
       way (sorted order: no gather);
    4. ``y = vq @ W2[e].T`` the same way (GEMM, bf16 rounding, fix-up of v's rows that do not fold);
    5. one pass per token: ``(y + b2[e]) * topk_weight`` summed over the k slots in order in float32, rounded
       to ``out_dtype``.
    Each GEMM is exact for its MXFP4 operands: float32 accumulation and one rounding of the product of the
    dequantized values (the folds are exact, the fix-up reads exact values).

    x: (T, H) float32 | bfloat16 | float16 (H % 32 == 0); w_gate_up / w_down: :func:`fold_experts` of
    (E, 2I, H) / (E, H, I) MXFP4 / MXFP6 experts (w_gate_up interleaved for ``"swiglu"``); b_gate_up (E, 2I) in
    the checkpoint's row order, b_down (E, H), or None; topk_weights / topk_ids (T, k). ``stages``: a dict that
    receives the intermediates (tests). Returns (T, H) in ``out_dtype``. No host sync (CUDA-graph capturable);
    needs CUDA sm_90 (``torch._scaled_grouped_mm``). Raises TypeError for another x dtype. Expert ids are not
    range-checked: a pair whose id is outside 0 .. E - 1 contributes 0."""
    import triton

    from .fold import quantize_fold_triton
    from .matmul_details._grouped import ACTS
    from .matmul_details._row_fixup import grouped_fixup

    bm = 16  # rows an expert's group is padded to (the grouped GEMM's), the fix-up's row tile
    T, H = x.shape
    k = topk_ids.shape[1]
    E, N1, _ = w_gate_up.data.shape
    n = T * k
    if n == 0:
        return torch.zeros(T, H, dtype=out_dtype, device=x.device)
    x = x if x.is_contiguous() else x.contiguous()
    ids, eids, pos, offs = _align_rows(topk_ids, E, bm, 0, max_blocks(n, E, bm), offs=True)
    R = ids.numel()
    xf = quantize_fold_triton(x, ACT_MXFP4, defer=True)  # (status-1 rows: unspecified until the fix-up)
    xa, sa = gather_rows(xf.folded.data, ids, n, k, scale=xf.folded.scale)  # (padding rows: any codes, scale 0)
    h = _grouped_fp8(xa, sa, w_gate_up, offs)
    grouped_fixup(h, xf.source, xf.status, xf.folded.scale, ids, eids, w_gate_up.data, w_gate_up.scale, n_valid=n,
                  top_k=k, gather=True)
    b1 = b_gate_up
    if b1 is not None and w_gate_up.interleaved:
        b1 = _interleave_halves(b1, 1)
    v = torch.empty(R, N1 // 2, dtype=torch.float32, device=x.device)
    _BIAS_ACT((R,), (h, h if b1 is None else b1.contiguous(), ids, eids, v, n, N1),
              (("ACT", ACTS[activation]), ("HAS_BIAS", b1 is not None), ("BLOCK_M", bm),
               ("BLOCK_N", triton.next_power_of_2(N1))), 4)
    vf = quantize_fold_triton(v, ACT_MXFP4, defer=True)  # (padding rows: zeros)
    y = _grouped_fp8(vf.folded.data, vf.folded.scale, w_down, offs)
    grouped_fixup(y, vf.source, vf.status, vf.folded.scale, ids, eids, w_down.data, w_down.scale, n_valid=n,
                  top_k=k, gather=False)
    out = _combine(y, b_down, topk_weights, pos, topk_ids, out_dtype)
    if stages is not None:
        stages.update(ids=ids, eids=eids, h=h, v=v, y=y, x_fold=xf, v_fold=vf)
    return out
