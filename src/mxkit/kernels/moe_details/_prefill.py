"""The MoE prefill path (:mod:`mxkit.kernels.moe`, past :func:`~mxkit.kernels.moe_details._decode.mma_max_pairs`
pairs on Hopper): both expert GEMMs on the grouped W4A16 / W8A16 wgmma kernel
(``matmul_details/_w4a16_wgmma.py``), tokens sorted by expert into blocks of 32 to 256 rows (or mixed sizes),
gathered into that order, the bias and activation in the first GEMM's epilogue, then the combine. It reads the
experts in its own layout (:func:`pack_experts_wgmma`) or in the decode kernel's (:class:`MmaExperts`: one copy
for every token count)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...tensor import MXTensor
from .._env import choice, number
from ..matmul import _nonfinite_codes
from ..matmul_details._envelope import scale_extrema
from ._decode import MmaExperts, mma_max_pairs
from ._envelope import _envelope_ok
from ._rows import _combine, _packed_bias, gather_rows
from ._sort import _align_rows, max_blocks, mixed_blocks_device, mixed_sizes


@dataclass(frozen=True, eq=False)
class WgmmaExperts:
    """MXFP4 or MXFP8 experts (E, N, K) in the grouped wgmma kernel's layout (:func:`pack_experts_wgmma`): q, st,
    one_mul of :func:`mxkit.kernels.matmul_details._layout_wgmma.pack_wgmma_experts`; ``act_pairs``: the
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
    from ..matmul_details._layout_wgmma import pack_wgmma_experts
    from ..matmul_details._w4a16_wgmma import FP8_ELEMS

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
    forced = number("MXKIT_MOE_WGMMA_BM", None, int, (32, 64, 128, 256))
    if forced is not None:
        return forced
    if pairs_per_expert <= 16:
        return 32
    if pairs_per_expert <= 48:
        return 64
    return 128 if pairs_per_expert <= 384 else 256


def _wgmma_takes(packed: tuple, n: int, activation: str, x: torch.Tensor) -> bool:
    """Whether moe_triton's prefill path runs: more than :func:`mma_max_pairs` pairs, the kernel available here, and
    both experts packed for it (gate_up in ``activation``'s row order) or for the decode path (the same bytes
    read in that layout)."""
    from ..matmul_details import _w4a16_wgmma as wg

    p1, p2 = packed
    # (the per-expert part of the envelope holds where the decode kernel could take the experts: MmaExperts)
    held = p1.shape[0] if isinstance(p1, MmaExperts) else 0
    if n <= mma_max_pairs(x.device, held) or wg.available(x.device) is not None:
        return False
    if isinstance(p1, MmaExperts) and isinstance(p2, MmaExperts):
        return p1.interleaved == (activation == "swiglu") and not p2.interleaved
    return (isinstance(p1, WgmmaExperts) and isinstance(p2, WgmmaExperts) and p1.act_pairs == activation
            and p2.act_pairs is None)


def _moe_wgmma(x, p1, b1, p2, b2, topk_weights, topk_ids, E, lo, n_total_experts, activation, out_dtype
               ) -> torch.Tensor:
    """Both GEMMs on the grouped wgmma kernel, the experts in its layout (WgmmaExperts) or in the decode
    kernel's (MmaExperts: x gathered in that layout's K order, h written in it)."""
    from ..matmul_details._w4a16_wgmma import w4a16_wgmma

    T, k = topk_ids.shape
    n = T * k
    _, N1, H = p1.shape
    mma = isinstance(p1, MmaExperts)
    sizes, wide = block_plan(n / n_total_experts)
    B = max_blocks(n, E, sizes[-1], wide)
    if len(sizes) > 1:  # groups covered by blocks of 256, then at most one of each smaller size (mixed_blocks)
        ids, _, pos, ends = _align_rows(topk_ids, E, sizes[-1], lo, B, offs=True, wide=wide)
        launches = [(b, tab, True) for b, tab in mixed_blocks_device(ends, n, sizes)]
    else:
        ids, eids, pos = _align_rows(topk_ids, E, sizes[0], lo, B)
        launches = [(sizes[0], eids, False)]
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


def block_plan(pairs_per_expert: float) -> tuple[tuple[int, ...], int]:
    """(block sizes, wide) of the prefill GEMMs for an average of ``pairs_per_expert`` routed rows per expert,
    one launch per size: above 128 pairs an expert, mixed sizes 256 / 128 / 64 (:func:`mixed_blocks`) with wide
    256, each expert's group padded as :func:`padded_rows` (its rows past its 256-row blocks in one block of 64,
    128 or 256: one more pass over the expert's weight, where a 128-row block padded to 128 rows wasted up to half
    its tile); up to 128, one size ``(wgmma_block_m(..),)`` and wide 0 (groups padded to it).
    H200, GPT-OSS W4A16 prefill, µs one size -> mixed (``benchmarks/probes/moe_blocks_ab.py``,
    ``benchmarks/h200-2026-12-04d/``): GPT-OSS-120B 5120 tokens 2925 -> 2655, 6144 3049 -> 2764, 8192 3866 -> 3426,
    12288 5470 -> 5196; GPT-OSS-20B 2048 tokens 930 -> 855; at 128 pairs an expert level (120B 4096 tokens, 20B
    1024), at 96 slower (120B 3072 tokens 1486 -> 1684). A/B settings: ``MXKIT_MOE_MIXED`` ``0`` (one size), ``1``
    (mixed, groups padded to the smallest size, wide 0: the plan before), ``fit`` (the default);
    ``MXKIT_MOE_MIXED_FROM``: mixed above that many pairs per expert (128); ``MXKIT_MOE_MIXED_SIZES``: the
    smallest size (64; 32)."""
    bm = wgmma_block_m(pairs_per_expert)
    mode = choice("MXKIT_MOE_MIXED", ("0", "1", "fit"), "fit")
    if mode == "0" or pairs_per_expert <= number("MXKIT_MOE_MIXED_FROM", "128", float):
        return (bm,), 0
    sizes = mixed_sizes(number("MXKIT_MOE_MIXED_SIZES", "64", int, (32, 64, 128)))
    return sizes, (sizes[0] if mode == "fit" else 0)
