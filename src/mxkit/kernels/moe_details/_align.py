"""The token sort of the MoE GEMMs for decode-sized problems in one program (vLLM's ``moe_align_block_size``
convention; :func:`mxkit.kernels.moe.align_device` is the host side and the many-token path)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _local_key(ids_ptr, i, n, lo, E):
    """The local expert (int32) of pairs i of the flat expert ids (int32 or int64, global): id - lo where
    lo <= id < lo + E and i < n, else -1 (a pair of another rank's expert, an id out of range, or past n)."""
    raw = tl.load(ids_ptr + i, mask=i < n, other=-1)
    return tl.where((i < n) & (raw >= lo) & (raw < lo + E), raw - lo, -1).to(tl.int32)


@triton.jit
def _align_small_kernel(ids_ptr, sorted_ptr, eids_ptr, n, lo, E, n_blocks,
                        N_P2: tl.constexpr, E_P2: tl.constexpr, NB_P2: tl.constexpr, BLOCK_M: tl.constexpr):
    """ids int32 or int64 [n] (flat (token, slot) expert ids, global; the experts held are lo .. lo + E - 1) ->
    sorted int32 [n_blocks * BLOCK_M] (pair indices grouped by expert, stable, each group padded to BLOCK_M
    with the sentinel n), eids int32 [n_blocks] (the local expert of each block, -1 past the last).
    One program; every pair against every pair ([N_P2, N_P2]) and every expert ([N_P2, E_P2])."""
    i = tl.arange(0, N_P2)
    key = _local_key(ids_ptr, i, n, lo, E)
    held = key >= 0
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


@triton.jit
def _align_hist_kernel(ids_ptr, hist_ptr, pos_ptr, n, lo, E, E_P2: tl.constexpr, CHUNK: tl.constexpr,
                       ROWS: tl.constexpr):
    """Chunk c of CHUNK pairs: hist[c, e] = its pairs of local expert e (int32 [n_chunks, E_P2]); with ROWS,
    pos[i] = -1 for its pairs (the expert kernel then writes the held pairs' rows)."""
    c = tl.program_id(0)
    i = c * CHUNK + tl.arange(0, CHUNK)
    key = _local_key(ids_ptr, i, n, lo, E)
    h = tl.histogram(key, E_P2, mask=key >= 0)
    tl.store(hist_ptr + c * E_P2 + tl.arange(0, E_P2), h)
    if ROWS:
        tl.store(pos_ptr + i, -1, mask=i < n)


@triton.jit
def _padded(counts, BLOCK_M: tl.constexpr, WIDE: tl.constexpr):
    """Each group's rows padded: to BLOCK_M (WIDE <= BLOCK_M), or (WIDE > BLOCK_M: blocks of mixed sizes) to
    WIDE-row blocks plus, for the rows past them, the smallest of BLOCK_M, 2 BLOCK_M, .. WIDE that holds them
    (:func:`mxkit.kernels.moe_details._sort.padded_rows`)."""
    if WIDE > BLOCK_M:
        rem = counts % WIDE
        size = tl.where(rem > 0, BLOCK_M, 0)
        for j in tl.static_range(8):
            if (BLOCK_M << (j + 1)) <= WIDE:
                size = tl.where(rem > (BLOCK_M << j), BLOCK_M << (j + 1), size)
        return counts - rem + size
    else:
        return (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M


@triton.jit
def _align_expert_kernel(ids_ptr, hist_ptr, sorted_ptr, eids_ptr, pos_ptr, offs_ptr, n, lo, E, n_blocks, n_chunks,
                         E_P2: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr, HROWS: tl.constexpr,
                         BLOCK_M: tl.constexpr, TOP_K: tl.constexpr, OFFS: tl.constexpr, WIDE: tl.constexpr):
    """The same result as :func:`_align_small_kernel` for any n, from the chunk histograms of
    :func:`_align_hist_kernel`: program (e, g) writes local expert e's pairs of chunks g * GROUP .. + GROUP - 1
    at its group's start (the padded groups of experts < e) plus its pairs in earlier chunks, in order (a
    running cumulative sum: stable); program (e, 0) also writes its group's padding sentinels and the expert id
    of its blocks, program (E - 1, 0) the unused blocks (sentinels, expert -1). With TOP_K > 0 also pos[i] =
    the sorted row of held pair i (for the combine of :func:`mxkit.kernels.moe.moe_triton`'s prefill path);
    with OFFS, offs[e] = the end row of expert e's padded group (``torch._scaled_grouped_mm``'s group ends).
    WIDE > BLOCK_M pads the groups for blocks of mixed sizes (:func:`_padded`)."""
    e = tl.program_id(0)
    g = tl.program_id(1)
    bins = tl.arange(0, E_P2)
    counts = tl.zeros([E_P2], dtype=tl.int32)
    before = tl.zeros([E_P2], dtype=tl.int32)  # pairs of each expert in the chunks before this group's
    for r0 in range(0, n_chunks, HROWS):
        r = r0 + tl.arange(0, HROWS)
        h = tl.load(hist_ptr + r[:, None] * E_P2 + bins[None, :], mask=(r < n_chunks)[:, None], other=0)
        counts += tl.sum(h, axis=0)
        before += tl.sum(tl.where((r < g * GROUP)[:, None], h, 0), axis=0)
    padded = _padded(counts, BLOCK_M, WIDE)
    start = tl.sum(tl.where(bins < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(bins == e, counts, 0), axis=0)
    run = start + tl.sum(tl.where(bins == e, before, 0), axis=0)
    for c in range(g * GROUP, tl.minimum(g * GROUP + GROUP, n_chunks)):
        i = c * CHUNK + tl.arange(0, CHUNK)
        key = _local_key(ids_ptr, i, n, lo, E)
        m = key == e
        row = run + tl.cumsum(m.to(tl.int32), axis=0) - 1
        tl.store(sorted_ptr + row, i, mask=m)
        if TOP_K > 0:
            tl.store(pos_ptr + i, row, mask=m)
        run += tl.sum(m.to(tl.int32), axis=0)
    if g == 0:
        end = start + _padded(mine, BLOCK_M, WIDE)
        if OFFS:
            tl.store(offs_ptr + e, end)
        for p0 in range(start + mine, end, BLOCK_M):  # (WIDE: the padding can exceed BLOCK_M rows)
            pad = p0 + tl.arange(0, BLOCK_M)
            tl.store(sorted_ptr + pad, n, mask=pad < end)
        for b0 in range(start // BLOCK_M, end // BLOCK_M, CHUNK):
            b = b0 + tl.arange(0, CHUNK)
            tl.store(eids_ptr + b, e, mask=b < end // BLOCK_M)
        if e == E - 1:  # the unused blocks past the last group
            used = tl.sum(padded, axis=0)
            for p0 in range(used, n_blocks * BLOCK_M, CHUNK):
                p = p0 + tl.arange(0, CHUNK)
                tl.store(sorted_ptr + p, n, mask=p < n_blocks * BLOCK_M)
            for b0 in range(used // BLOCK_M, n_blocks, CHUNK):
                b = b0 + tl.arange(0, CHUNK)
                tl.store(eids_ptr + b, -1, mask=b < n_blocks)


@triton.jit
def _mixed_blocks_kernel(ends_ptr, full_ptr, tails_ptr, E, NB, E_P2: tl.constexpr, BLOCK: tl.constexpr,
                         L: tl.constexpr, PAD: tl.constexpr, NS: tl.constexpr):
    """The block tables of :func:`mxkit.kernels.moe.mixed_blocks` (its PyTorch twin) from ends int32 [E] (the end
    row of each expert's group, padded to PAD rows, groups in expert order from row 0), for the sizes L, L / 2,
    .. PAD (NS = log2(L / PAD) smaller ones): program p writes slots p * BLOCK .. of the L-row table full [2, NB]
    (expert, first row; -1 / 0 past the blocks), program 0 also the smaller sizes' tables tails [NS, 2, E]."""
    PER: tl.constexpr = L // PAD
    e = tl.arange(0, E_P2)
    em = e < E
    end = tl.load(ends_ptr + e, mask=em, other=0)
    prev = tl.load(ends_ptr + e - 1, mask=em & (e > 0), other=0)
    g = (end - prev) // PAD
    nfull = tl.where(em, g // PER, 0)
    t = g % PER
    cum = tl.cumsum(nfull, axis=0)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    owner = tl.sum((cum[None, :] <= i[:, None]).to(tl.int32), axis=1)  # experts whose L-row blocks end by slot i
    sel = e[None, :] == owner[:, None]
    first = tl.sum(tl.where(sel, (prev - L * (cum - nfull))[None, :], 0), axis=1) + L * i
    ok = owner < E
    im = i < NB
    tl.store(full_ptr + i, tl.where(ok, owner, -1), mask=im)
    tl.store(full_ptr + NB + i, tl.where(ok, first, 0), mask=im)
    if tl.program_id(0) == 0:
        rest = prev + L * nfull
        for j in tl.static_range(NS):  # size L >> (j + 1): bit PER >> (j + 1) of t, after the larger pieces
            bit = PER >> (j + 1)
            has = em & ((t & bit) != 0)
            tl.store(tails_ptr + j * 2 * E + e, tl.where(has, e, -1), mask=em)
            tl.store(tails_ptr + j * 2 * E + E + e, tl.where(has, rest + PAD * (t - t % (2 * bit)), 0), mask=em)
