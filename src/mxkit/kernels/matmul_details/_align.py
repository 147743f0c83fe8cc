"""The token sort of the MoE GEMMs for decode-sized problems in one program (vLLM's ``moe_align_block_size``
convention; :func:`mxkit.kernels.moe.align_device` is the host side and the many-token path)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _align_small_kernel(ids_ptr, sorted_ptr, eids_ptr, n, lo, E, n_blocks,
                        N_P2: tl.constexpr, E_P2: tl.constexpr, NB_P2: tl.constexpr, BLOCK_M: tl.constexpr):
    """ids int32 [n] (flat (token, slot) expert ids, global; the experts held are lo .. lo + E - 1) ->
    sorted int32 [n_blocks * BLOCK_M] (pair indices grouped by expert, stable, each group padded to BLOCK_M
    with the sentinel n), eids int32 [n_blocks] (the local expert of each block, -1 past the last).
    One program; every pair against every pair ([N_P2, N_P2]) and every expert ([N_P2, E_P2])."""
    i = tl.arange(0, N_P2)
    key = tl.load(ids_ptr + i, mask=i < n, other=-1 - lo) - lo
    held = (i < n) & (key >= 0) & (key < E)
    key = tl.where(held, key, -1)
    e = tl.arange(0, E_P2)
    onehot = key[:, None] == e[None, :]
    counts = tl.sum(onehot.to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pend = tl.cumsum(padded, axis=0)
    start = tl.sum(tl.where(onehot, (pend - padded)[None, :], 0), axis=1)
    earlier = (key[:, None] == key[None, :]) & (i[None, :] < i[:, None])  # pairs j < i of the same expert
    pos = start + tl.sum(earlier.to(tl.int32), axis=1)
    p = tl.arange(0, NB_P2 * BLOCK_M)
    tl.store(sorted_ptr + p, n, mask=p < n_blocks * BLOCK_M)
    tl.debug_barrier()  # the sentinels land before the pairs
    tl.store(sorted_ptr + pos, i, mask=held)
    b = tl.arange(0, NB_P2)
    bend = pend // BLOCK_M
    eid = tl.sum(((bend[None, :] <= b[:, None]) & (e[None, :] < E)).to(tl.int32), axis=1)
    eid = tl.where(b < tl.max(bend, axis=0), eid, -1)
    tl.store(eids_ptr + b, eid, mask=b < n_blocks)
