"""Token sorting of the MoE expert computation (:mod:`mxkit.kernels.moe`): the (token, slot) pairs grouped by
expert in vLLM's ``moe_align_block_size`` convention (flat ids i = t * k + j, stable, each expert's group padded to
a multiple of ``block_m`` with the sentinel T * k), on the device without a host sync: one Triton program for a
few pairs (decode), one program per expert above (:mod:`mxkit.kernels.matmul_details._align`), PyTorch ops on
the CPU; and the tables of the prefill path's mixed block sizes."""

from __future__ import annotations

import torch

from ..launch import _Launcher
from ..matmul_details import _align, _mma_decode

# direct launches of the row kernels (Triton's own launcher took ~20 us of host time per launch)
_ALIGN_SMALL = _Launcher(_align, "_align_small_kernel")
_ALIGN_HIST = _Launcher(_align, "_align_hist_kernel")
_ALIGN_EXPERT = _Launcher(_align, "_align_expert_kernel")
_MIXED = _Launcher(_align, "_mixed_blocks_kernel")


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
