"""The MoE decode path (:mod:`mxkit.kernels.moe`, up to :func:`mma_max_pairs` (token, slot) pairs): both expert
GEMMs on the tensor-core decode kernels, MXFP4 experts in the dense decode GEMM's layout
(``matmul_details/mma_decode.cu``, :func:`pack_experts_mma`) and MXFP8 experts as stored (``mma_a8w8.cu``'s
W8A16 kernels): tokens sorted by expert in blocks of 8 with the gather, bias, activation and routing weight
fused, or up to ``_mma_decode.SMALL_PAIRS`` pairs one block per pair with no sort."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...packed import partial_stats_host
from ...tensor import MXTensor
from ..matmul_details import _mma_decode
from ..matmul_details._envelope import host_ints, scale_stats
from ..matmul_table import _envelope, _packaged_table
from ._envelope import _codes_finite, _envelope_ok
from ._rows import _interleave_halves, _packed_bias
from ._sort import _flat_ids, align_device

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
    scale byte in the bf16-exact envelope (:func:`mxkit.kernels.moe.supported`; the packed paths need it, as the grouped kernel
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
    from ..matmul_details._mma_decode import pack_mma

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


def packed_flags(s: torch.Tensor, fmt) -> tuple[bool, bool, bool]:
    """(special, one_mul, bf16_exact) of :class:`MmaExperts` read from its packed scales ``s`` (a permutation of the
    scale bytes), as :func:`pack_experts_mma` sets them: for buffers written in place after packing. One host sync."""
    lo, hi, nan = host_ints(scale_stats(s.view(torch.uint8)))
    return lo == 0 or bool(nan), hi <= 128 and not nan, _envelope_ok(fmt, lo, hi)


def _mma_takes(packed: tuple, n: int, activation: str, x: torch.Tensor) -> bool:
    """Whether moe_triton's decode path runs: both experts packed (gate_up interleaved for "swiglu"), at most
    :func:`mma_max_pairs` pairs, x's rows readable as they are, the kernel loadable here."""
    from ..matmul_details import _mma_decode as mma

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
    from ..matmul_details._mma_decode import grouped_mma

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
    from ..matmul_details import _mma_a8w8

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
    from ..matmul_details._mma_a8w8 import grouped_w16

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
