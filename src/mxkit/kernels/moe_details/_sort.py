"""Token sorting of the MoE expert computation (:mod:`mxkit.kernels.moe`): the (token, slot) pairs grouped by
expert in vLLM's ``moe_align_block_size`` convention (flat ids i = t * k + j, stable, each expert's group padded to
a multiple of ``block_m`` with the sentinel T * k), on the device without a host sync: one Triton program for a
few pairs (decode), one program per expert above (:mod:`mxkit.kernels.moe_details._align`), PyTorch ops on
the CPU; and the tables of the prefill path's mixed block sizes."""

from __future__ import annotations

import torch

from ..launch import _Launcher
from ..matmul_details import _mma_decode
from . import _align

# direct launches of the row kernels (Triton's own launcher took ~20 us of host time per launch)
_ALIGN_SMALL = _Launcher(_align, "_align_small_kernel")
_ALIGN_HIST = _Launcher(_align, "_align_hist_kernel")
_ALIGN_EXPERT = _Launcher(_align, "_align_expert_kernel")
_MIXED = _Launcher(_align, "_mixed_blocks_kernel")


SMALL_PAIRS = 128  # up to this many (token, slot) pairs, one program sorts them (decode)


def max_blocks(n_pairs: int, num_experts: int, block_m: int, wide: int = 0) -> int:
    """An upper bound on the padded blocks of :func:`align_device`: every expert that receives a pair pads its
    group by at most block_m - 1 (with ``wide`` > block_m, :func:`padded_rows`: by less than wide / 2)."""
    pad = max(block_m, wide // 2)
    return -(-(n_pairs + min(num_experts, n_pairs) * (pad - 1)) // block_m)


def padded_rows(counts: torch.Tensor, block_m: int, wide: int = 0) -> torch.Tensor:
    """Each expert's group of ``counts`` rows padded: to a multiple of block_m, or (``wide`` > block_m, for
    :func:`mixed_blocks` of the sizes wide, wide / 2, .. block_m) to blocks of ``wide`` rows plus, for the rows
    past them, the smallest of block_m, 2 block_m, .. wide that holds them, so each group's rows past its wide
    blocks run in one block (one more pass over the expert's weight, not one a size)."""
    if wide <= block_m:
        return (counts + block_m - 1) // block_m * block_m
    if wide % block_m or (wide // block_m) & (wide // block_m - 1) or wide // block_m > 128:
        raise ValueError(f"wide {wide}: block_m {block_m} times a power of two up to 128")
    rem = counts % wide
    size = torch.where(rem > 0, block_m, 0)
    s = block_m
    while s < wide:
        size = torch.where(rem > s, 2 * s, size)
        s *= 2
    return counts - rem + size


def align_device(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, lo: int = 0, wide: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert on the device, without a host sync (vLLM's
    ``moe_align_block_size`` convention, as :func:`mxkit.moe_reference.align_block_size`): on CUDA one Triton
    program for up to :data:`SMALL_PAIRS` pairs (decode), one program per expert above; PyTorch ops
    (scatter-add, stable argsort, searchsorted) on the CPU.

    topk_ids: (T, k) int, global expert ids; the experts held are lo .. lo + num_experts - 1 (others' pairs
    are left out). Returns (sorted_ids int32 [B * block_m], expert_ids int32 [B]) with B =
    :func:`max_blocks`: the first blocks equal ``align_block_size``'s output (local expert ids), the rest
    are padding (sentinel T * k, expert -1). ``wide`` > block_m pads each group as :func:`padded_rows` (for
    :func:`mixed_blocks`; no longer ``align_block_size``'s padding)."""
    n = topk_ids.numel()
    E = num_experts
    B = max_blocks(n, E, block_m, wide)
    if 0 < n <= SMALL_PAIRS and E <= 256 and topk_ids.is_cuda and wide <= block_m:
        return _align_small(topk_ids, E, block_m, lo, B)
    if n > SMALL_PAIRS and _experts_sort_runs(topk_ids, E):
        return _align_experts(topk_ids, E, block_m, lo, B, wide=wide)
    return _align_torch(topk_ids, E, block_m, lo, B, wide)


def _align_torch(topk_ids: torch.Tensor, E: int, block_m: int, lo: int, B: int, wide: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    n = topk_ids.numel()
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64) - lo
    key = torch.where((flat >= 0) & (flat < E), flat, E)  # bin E: other ranks' experts, sorted last
    # (torch.bincount reads the largest key on the host: a sync)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = padded_rows(counts[:E], block_m, wide)
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


# chunks of 1024 pairs a program of _align_expert_kernel sorts (one program per expert and group): each program
# also reads every chunk's histogram, so fewer chunks a program cost more reads (H200,
# ``benchmarks/probes/align_group_ab.py``, µs at GPT-OSS-120B 16384 / 4096 tokens, GPT-OSS-20B 16384:
# 8 -> 54 / 19 / 19; 4 -> 72 / 17 / 16; 16 -> 46 / 26 / 27)
ALIGN_GROUP = 8
_INTERPRET_ALIGN = False  # tests: run _align_expert_kernel on CPU tensors (under TRITON_INTERPRET=1)


def _experts_sort_runs(topk_ids: torch.Tensor, E: int) -> bool:
    """Whether :func:`_align_experts` sorts these pairs over E experts: CUDA ids (or the interpreter tests'), its
    histograms hold up to 1024 experts, int32 positions, and its grid's y (n / 8192 groups of chunks) within CUDA's
    65535."""
    return E <= 1024 and topk_ids.numel() <= 8192 * _mma_decode.MAX_STRIPS and (topk_ids.is_cuda or _INTERPRET_ALIGN)


def _align_experts(topk_ids: torch.Tensor, E: int, block_m: int, lo: int, B: int, top_k: int = 0,
                   offs: bool = False, wide: int = 0) -> tuple:
    """:func:`._align._align_expert_kernel`: (sorted_ids, expert_ids), plus pos (each pair's sorted row) when
    ``top_k`` > 0, plus (``offs``) int32 [E] the end row of each expert's padded group."""
    import triton

    ids = _flat_ids(topk_ids)
    n, chunk, group = ids.numel(), 1024, ALIGN_GROUP
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
                   ("BLOCK_M", block_m), ("TOP_K", top_k), ("OFFS", offs), ("WIDE", wide)), 4)
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


MIXED_SIZES = (256, 128, 64)  # the block sizes of mixed_blocks by default, one launch each


def mixed_sizes(smallest: int) -> tuple[int, ...]:
    """The block sizes of :func:`mixed_blocks` down to ``smallest`` (128, 64 or 32): 256, 128, .., smallest."""
    if smallest not in (32, 64, 128):
        raise ValueError(f"the smallest mixed block is 32, 64 or 128 rows, not {smallest}")
    return tuple(256 >> i for i in range((256 // smallest).bit_length()))


_MIXED_PLANS = {mixed_sizes(s) for s in (128, 64, 32)}


def _check_sizes(sizes: tuple) -> None:
    if tuple(sizes) not in _MIXED_PLANS:
        raise ValueError(f"mixed block sizes {tuple(sizes)}: 256 halving down to 128, 64 or 32 (mixed_sizes)")


def mixed_blocks_device(ends: torch.Tensor, n: int, sizes: tuple[int, ...] = MIXED_SIZES
                        ) -> list[tuple[int, torch.Tensor]]:
    """:func:`mixed_blocks` in one Triton launch (``_align._mixed_blocks_kernel``; the same tables)."""
    import triton

    _check_sizes(sizes)
    E = ends.numel()
    L, pad = sizes[0], sizes[-1]
    full = torch.empty(2, n // L + E, dtype=torch.int32, device=ends.device)
    tails = torch.empty(len(sizes) - 1, 2, E, dtype=torch.int32, device=ends.device)
    nb = full.shape[1]
    ends = ends if ends.dtype == torch.int32 and ends.is_contiguous() else ends.to(torch.int32).contiguous()
    _MIXED((-(-nb // 128),), (ends, full, tails, E, nb),
           (("E_P2", max(16, triton.next_power_of_2(E))), ("BLOCK", 128), ("L", L), ("PAD", pad),
            ("NS", len(sizes) - 1)), 4)
    return [(L, full)] + [(bm, tails[j]) for j, bm in enumerate(sizes[1:])]


def mixed_blocks(ends: torch.Tensor, n: int, sizes: tuple[int, ...] = MIXED_SIZES
                 ) -> list[tuple[int, torch.Tensor]]:
    """Blocks of several sizes covering experts' sorted groups padded to ``sizes[-1]`` rows (:func:`align_device`
    with that block_m): each group's first rows in blocks of ``sizes[0]`` rows, the rest in at most one block of
    each smaller size, larger first, so a group pads to the smallest size while most of its rows still run in
    the widest tile. ``sizes``: powers of two halving from the widest (:func:`mixed_sizes`; default 256 / 128 /
    64). ``ends``: int32 [E], the end row of each expert's group (groups in expert order from row 0); ``n``: the
    (token, slot) pairs (bounds the block count without a host sync). Returns [(bm, table int32 [2, NB])] for bm
    in ``sizes``: table[0] the block's local expert (-1: no block), table[1] its first row, for
    :func:`~mxkit.kernels.matmul_details._w4a16_wgmma.w4a16_wgmma`'s ``starts`` (one launch per size)."""
    _check_sizes(sizes)
    E = ends.numel()
    dev = ends.device
    L, pad = sizes[0], sizes[-1]
    end = ends.to(torch.int64)
    start = torch.cat([end.new_zeros(1), end[:-1]])
    g = (end - start) // pad  # pad-row blocks of each group
    nfull, t = g // (L // pad), g % (L // pad)
    # blocks of L rows: expert e's j-th at start_e + L j (at most n / L + E of them)
    nb = n // L + E
    cum = torch.cumsum(nfull, 0)
    idx = torch.arange(nb, device=dev)
    owner = torch.searchsorted(cum, idx, right=True)
    ok = owner < E
    oc = owner.clamp(max=E - 1)
    first = start[oc] + L * (idx - (cum[oc] - nfull[oc]))
    experts = torch.arange(E, device=dev)
    rest = start + L * nfull
    tables = [torch.stack([torch.where(ok, oc, -1), torch.where(ok, first, 0)])]
    for bm in sizes[1:]:  # at most one block of each smaller size: t's bit bm / pad, after the larger pieces
        bit = bm // pad
        has = (t & bit) != 0
        first = rest + pad * (t - t % (2 * bit))
        tables.append(torch.stack([torch.where(has, experts, -1), torch.where(has, first, 0)]))
    return [(bm, tab.to(torch.int32).contiguous()) for bm, tab in zip(sizes, tables)]


def _sorted_rows(ids: torch.Tensor, n: int) -> torch.Tensor:
    """int32 (n,): the sorted row of each flat (token, slot) pair of :func:`align_device`'s ``ids``; -1 for a
    pair not held here."""
    pos = torch.full((n + 1,), -1, dtype=torch.int32, device=ids.device)
    pos.scatter_(0, torch.where(ids < n, ids, n).long(), torch.arange(ids.numel(), dtype=torch.int32,
                                                                       device=ids.device))
    return pos[:n]


def _align_rows(topk_ids: torch.Tensor, E: int, bm: int, lo: int, B: int, offs: bool = False, wide: int = 0
                ) -> tuple:
    """:func:`align_device`'s (sorted_ids, expert_ids) and each pair's sorted row (-1: not held here), plus
    (``offs``) int32 [E] the end row of each expert's padded group, from the sort's kernels where they run."""
    if _experts_sort_runs(topk_ids, E):
        return _align_experts(topk_ids, E, bm, lo, B, top_k=topk_ids.shape[1], offs=offs, wide=wide)
    ids, eids = align_device(topk_ids, E, bm, lo=lo, wide=wide)
    rows = (ids, eids, _sorted_rows(ids, topk_ids.numel()))
    if not offs:
        return rows
    # each expert's group ends where the blocks of experts <= e end (unused blocks, expert -1, sort last)
    block_e = torch.where(eids < 0, E, eids)
    ends = torch.searchsorted(block_e, torch.arange(E, device=eids.device, dtype=block_e.dtype), right=True) * bm
    return rows + (ends.to(torch.int32),)
