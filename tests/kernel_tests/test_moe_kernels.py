"""The MoE kernels (:mod:`mxkit.kernels.moe`): the device-side token sort, the grouped W16 GEMM and the whole
expert computation, against :mod:`mxkit.moe_reference`.

Bounds (issue #22's, row by row, against float64 of the dequantized experts):

* one grouped GEMM, bf16 output: ``‖y_r − y64_r‖ ≤ 1.2 · ‖bf16(y64_r) − y64_r‖ + ‖acc_r‖`` with, element by
  element, ``acc`` test_matmul's accumulation term of h = a · Wᵀ + bias (``accumulation_bound``: about 2.5e-4 of
  |h| + rss, where rss = sqrt(Σ_k (a_k W_nk)²)) carried through the activation by :func:`act_slack`, times the
  routing weight (:func:`test_the_moe_bound_catches_lost_precision` shows it catches 16 lost products and bf16
  partial sums on every row; the worst-case ``K · 2^-24 · ‖(|a| · |W|ᵀ)_r‖`` used before passed some);
* the whole layer against ``moe_reference(intermediate_dtype=bfloat16)``: factor 1.5 instead of 1.2, because
  the kernel rounds h from a float32 sum and the reference from a float64 one, so a few h elements may
  differ by one bf16 ulp.
CPU: the device sort (pure PyTorch) against ``align_block_size``. GPU: the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch
from conftest import assert_graph_replays, cuda_generator, poison_allocator

import mxkit
from mxkit.kernels.matmul_table import gemm_table_override
from mxkit.kernels.moe import MoeConfig, align_device, grouped_matmul_w16, max_blocks, moe_triton
from mxkit.kernels.moe_details._sort import _align_experts
from mxkit.moe_reference import (align_block_size, grouped_matmul_reference, moe_reference, select_experts,
                                 swiglu, swiglu_gpt_oss)
from mxkit.reference import dequantize_reference

try:
    from .test_matmul import accumulation_bound
except ImportError:  # run as a script (conftest.run_interpreted)
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_matmul import accumulation_bound

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def _poisoned(run):
    """``run()`` on memory that holds 0xFF (NaN) bytes: the cached blocks a previous run freed (which still hold its
    right answer) released first, then one large and many small blocks filled and freed, which the run's
    intermediates and output are carved from: a tile it skips shows, not the last run's bytes."""
    torch.cuda.empty_cache()
    poison_allocator(1 << 30)
    return run()


def rand_ids(T, k, E, g, *, every=None, none=None):
    """(T, k) distinct expert ids per token; ``every``: an expert in slot 0 of every token; ``none``: an expert
    that no token gets."""
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k)
    if none is not None:
        ids = torch.where(ids == none, (none + 1) % E, ids)
    if every is not None:
        ids[:, 0] = every
        for t in range(T):  # keep the row's ids distinct
            rest = [e for e in torch.randperm(E, generator=g).tolist() if e not in (every, none)][: k - 1]
            ids[t, 1:] = torch.tensor(rest)
    return ids.to(torch.int32)


def pair_rows(rows: torch.Tensor, sorted_ids: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """A kernel's expert-sorted rows (R, C) (stages) as float64 (n_pairs, C) on the CPU, pair p's row at p (the
    sorted ids: a pair index, or >= n_pairs on padding rows)."""
    sid = sorted_ids.cpu().long()
    valid = sid < n_pairs
    out = torch.zeros(n_pairs, rows.shape[1], dtype=torch.float64)
    out[sid[valid]] = rows.cpu().to(torch.float64)[valid]
    return out


def twin_takes(ref: torch.Tensor, v_kernel: torch.Tensor, v_twin: torch.Tensor, w2: torch.Tensor,
               ids: torch.Tensor, tw: torch.Tensor) -> None:
    """The MoE twin's float64 output ref (T, H) moved, in place, to the kernel's intermediate v_kernel where it
    differs from the twin's own v_twin (pairs (T * k, I)): those pairs' ``bf16(v @ w2[e].T)`` redone."""
    from mxkit.moe_reference import _bf16_cast

    e, k = ids.cpu().long().flatten(), ids.shape[1]
    tw = tw.cpu().to(torch.float64).flatten()
    same = (v_kernel == v_twin) | (torch.isnan(v_kernel) & torch.isnan(v_twin))
    for p in (~same).any(dim=1).nonzero().flatten().tolist():
        ref[p // k] += tw[p] * (_bf16_cast(v_kernel[p] @ w2[e[p]].T) - _bf16_cast(v_twin[p] @ w2[e[p]].T))


@pytest.mark.parametrize("T,E,k,block_m", [(1, 128, 4, 16), (3, 32, 4, 16), (727, 32, 4, 64), (727, 128, 4, 16),
                                           (0, 32, 4, 16)])
def test_align_device_matches_reference(T, E, k, block_m, rng):
    ids = rand_ids(T, k, E, rng, every=5 if T > 1 else None, none=7)
    ref_ids, ref_eids, P = align_block_size(ids, E, block_m)
    got_ids, got_eids = align_device(ids, E, block_m)
    B = max_blocks(T * k, E, block_m)
    assert got_ids.shape == (B * block_m,) and got_eids.shape == (B,)
    assert torch.equal(got_ids[:P], ref_ids) and torch.equal(got_eids[: P // block_m], ref_eids)
    assert (got_ids[P:] == T * k).all() and (got_eids[P // block_m:] == -1).all()
    assert not (got_eids == 7).any()  # no blocks for an expert without tokens


@pytest.mark.parametrize("lo,hi", [(0, 8), (8, 24), (24, 32)])
def test_align_device_expert_range(lo, hi, rng):
    ids = rand_ids(200, 4, 32, rng)
    ref_ids, ref_eids, P = align_block_size(ids, 32, 16, expert_range=(lo, hi))
    got_ids, got_eids = align_device(ids, hi - lo, 16, lo=lo)
    assert torch.equal(got_ids[:P], ref_ids) and torch.equal(got_eids[: P // 16], ref_eids)
    assert (got_ids[P:] == 800).all() and (got_eids[P // 16:] == -1).all()


ALIGN_EXPERT_CASES = [(727, 32, 4, 64, None), (727, 128, 4, 16, None), (33, 8, 4, 256, None), (300, 32, 4, 16, (8, 24)),
                      (200, 32, 4, 128, (24, 32)), (2100, 32, 4, 64, None), (4096, 128, 4, 256, None)]


def _check_align_experts(device: str, g, cases) -> int:
    """The one-program-per-expert sort (above SMALL_PAIRS pairs) equals align_block_size, padding blocks
    included; an expert that receives every token, one that receives none; int32 ids and (every other case) the
    router's int64."""
    for c, (T, E, k, block_m, rng_) in enumerate(cases):
        ids = rand_ids(T, k, E, g, every=1, none=5).to(device).to(torch.int64 if c % 2 else torch.int32)
        lo, hi = rng_ or (0, E)
        ref_ids, ref_eids, P = align_block_size(ids.cpu(), E, block_m, expert_range=rng_)
        got_ids, got_eids = align_device(ids, hi - lo, block_m, lo=lo)
        B = max_blocks(T * k, hi - lo, block_m)
        assert got_ids.shape == (B * block_m,) and got_eids.shape == (B,)
        got_ids, got_eids = got_ids.cpu(), got_eids.cpu()
        assert torch.equal(got_ids[:P], ref_ids) and torch.equal(got_eids[: P // block_m], ref_eids), (T, E, block_m)
        assert (got_ids[P:] == T * k).all() and (got_eids[P // block_m:] == -1).all()
        # with the rows of the prefill path: each held pair's sorted row (-1: not held), each group's end row
        _, _, pos, ends = _align_experts(ids, hi - lo, block_m, lo, B, top_k=k, offs=True)
        block_e = torch.where(got_eids < 0, hi - lo, got_eids)
        want_ends = torch.searchsorted(block_e, torch.arange(hi - lo, dtype=block_e.dtype), right=True) * block_m
        assert torch.equal(ends.cpu(), want_ends.to(torch.int32)), (T, E, block_m)
        want_pos = torch.full((T * k,), -1, dtype=torch.int32)
        want_pos[ref_ids[ref_ids < T * k].long()] = torch.nonzero(ref_ids < T * k).flatten().to(torch.int32)
        assert torch.equal(pos.cpu(), want_pos)
    return len(cases)


def _check_align_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.moe_details import _align
    from mxkit.kernels.moe_details import _sort

    g = interpreted_rng(_align._align_expert_kernel, _align._align_hist_kernel)
    _sort._INTERPRET_ALIGN = True
    n = _check_align_experts("cpu", g, ALIGN_EXPERT_CASES[:-1])
    n += _check_align_wide("cpu", g, ALIGN_WIDE_CASES[:-1])
    n += _check_align_small(g)
    print(f"interpreter checks passed: {n}")


def _check_align_small(g) -> int:
    """The one-program sort of the decode path (up to SMALL_PAIRS pairs: every CUDA MoE call at decode sizes)
    equals align_block_size, padding included, and the PyTorch path: one token, a rank's range of experts (ids
    outside it sorted out), int32 and the router's int64 ids, block sizes 16 to 64."""
    from mxkit.kernels.moe_details._sort import SMALL_PAIRS, _align_small, _align_torch

    cases = [(1, 1, 4, 16, None), (1, 4, 128, 16, None), (3, 4, 32, 16, None), (7, 2, 8, 32, None),
             (16, 4, 128, 16, (64, 128)), (SMALL_PAIRS // 4, 4, 256, 64, None), (5, 4, 32, 32, (8, 24))]
    for c, (T, k, E, bm, rng_) in enumerate(cases):
        ids = rand_ids(T, k, E, g, every=1 if T > 1 else None, none=2 if E > 2 else None)
        ids = ids.to(torch.int64 if c % 2 else torch.int32)
        lo, hi = rng_ or (0, E)
        B = max_blocks(T * k, hi - lo, bm)
        got_ids, got_eids = _align_small(ids, hi - lo, bm, lo, B)
        want_ids, want_eids = _align_torch(ids, hi - lo, bm, lo, B)
        assert torch.equal(got_ids, want_ids) and torch.equal(got_eids, want_eids), (T, k, E, bm, rng_)
        ref_ids, ref_eids, P = align_block_size(ids, E, bm, expert_range=rng_)
        assert torch.equal(got_ids[:P], ref_ids) and torch.equal(got_eids[: P // bm], ref_eids), (T, k, E, bm, rng_)
        assert (got_ids[P:] == T * k).all() and (got_eids[P // bm:] == -1).all()
    return len(cases)


ALIGN_WIDE_CASES = [(727, 32, 4, 64, 256), (300, 8, 4, 32, 256), (500, 16, 4, 32, 128), (2100, 32, 4, 64, 256),
                    (4096, 128, 4, 64, 256)]


def _check_align_wide(device: str, g, cases) -> int:
    """The per-expert sort with groups padded for mixed block sizes (``wide``: padded_rows) equals the PyTorch
    path: sorted ids, block experts, each pair's row and each group's end, the group sizes padded_rows' (an
    expert with every token, one with none)."""
    from mxkit.kernels.moe_details._sort import _align_experts, _align_torch, padded_rows

    for T, E, k, bm, wide in cases:
        ids = rand_ids(T, k, E, g, every=1, none=5).to(device)
        B = max_blocks(T * k, E, bm, wide)
        want_ids, want_eids = _align_torch(ids.cpu(), E, bm, 0, B, wide)
        got_ids, got_eids, pos, ends = _align_experts(ids, E, bm, 0, B, top_k=k, offs=True, wide=wide)
        assert torch.equal(got_ids.cpu(), want_ids) and torch.equal(got_eids.cpu(), want_eids), (T, E, bm, wide)
        counts = torch.bincount(ids.cpu().long().flatten(), minlength=E)
        sizes = torch.diff(ends.cpu().long(), prepend=torch.zeros(1, dtype=torch.long))
        assert torch.equal(sizes, padded_rows(counts, bm, wide))
        flat = torch.arange(T * k, dtype=torch.int32)
        assert torch.equal(got_ids.cpu()[pos.cpu().long()], flat)
    return len(cases)


@pytest.mark.parametrize("bm,wide", [(64, 256), (32, 256), (64, 128), (64, 0), (16, 16)])
def test_padded_rows(bm, wide):
    """padded_rows: a multiple of bm, at least the rows, and (wide > bm) wide-row blocks plus one block of a
    power-of-two multiple of bm, the smallest that holds the rest; max_blocks bounds the blocks."""
    from mxkit.kernels.moe_details._sort import padded_rows

    c = torch.arange(0, 1100)
    p = padded_rows(c, bm, wide)
    assert (p >= c).all() and (p % bm == 0).all()
    if wide <= bm:
        assert torch.equal(p, (c + bm - 1) // bm * bm)
    else:
        rem, prem = c % wide, p - c // wide * wide
        sizes = torch.tensor([0] + [bm << j for j in range((wide // bm).bit_length())])
        assert torch.isin(prem, sizes).all()
        fit = torch.where(rem[:, None] <= sizes[None, :], sizes[None, :], 1 << 30).min(dim=1).values
        assert torch.equal(prem, fit)
    for n in (1, 7, 100, 1000):
        assert max_blocks(n, 32, bm, wide) * bm >= n + ((p - c).max() * min(n, 32))


def test_align_experts_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_align_interpreted")


def _check_gather_rows(device: str, g) -> int:
    """gather_rows: each valid sorted row is its token's row of x (bf16 and FP8 codes, with the FP8 scales) and
    padding scales are 0; padding rows are left unwritten by design (not checked). Experts that receive every
    token and none, one expert per token (k = 1), a row of 2880 bf16 (several column tiles)."""
    from mxkit.kernels.moe import align_device, gather_rows

    n_checks = 0
    for T, E, k, block_m, H in ((5, 8, 2, 16, 96), (37, 16, 4, 32, 2880), (3, 4, 1, 16, 40)):
        ids = rand_ids(T, k, E, g, every=1, none=2).to(device)  # (expert 1 gets every token, expert 2 none)
        sid, _ = align_device(ids, E, block_m)
        valid = (sid < T * k).cpu()
        tok = torch.where(valid, sid.cpu() // k, 0)
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        xs = gather_rows(x.to(device), sid, T * k, k).cpu()
        assert torch.equal(xs[valid].view(torch.int16), x[tok[valid]].view(torch.int16)), (T, E, H)
        if H % 64 == 0:  # the decode-mma layout's K order (the prefill kernel on decode-packed experts)
            from mxkit.kernels.matmul_details._layout_mma import mma_k_order

            xp = gather_rows(x.to(device), sid, T * k, k, mma_k_order=True).cpu()
            assert torch.equal(xp[valid].view(torch.int16), x[tok[valid]][:, mma_k_order(H)].view(torch.int16))
        codes = torch.randint(0, 256, (T, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        scale = torch.rand(T, 1, generator=g) + 0.5
        xa, sa = gather_rows(codes.to(device), sid, T * k, k, scale=scale.to(device))
        assert torch.equal(xa.cpu()[valid].view(torch.uint8), codes[tok[valid]].view(torch.uint8))
        assert torch.equal(sa.cpu()[valid], scale[tok[valid], 0]) and (sa.cpu()[~valid] == 0).all()
        n_checks += 1
    return n_checks


def _check_combine(device: str, g, outs=(torch.float32, torch.float16, torch.bfloat16)) -> int:
    """The combine kernel, both forms, against the in-order float32 sum: sorted rows y (bf16) with per-expert
    biases and routing weights, pairs whose expert is not held (pos -1) contributing 0, a ragged last tile of H;
    the decode path's direct form (rows in token order, the router's int64 ids, a rank's slice of experts)."""
    from mxkit.kernels.moe_details._rows import _combine, _combine_direct

    n = 0
    for T, k, H, E in ((5, 4, 1500, 8), (1, 1, 64, 2), (33, 2, 2880, 16)):
        R = 2 * T * k
        y = (torch.randn(R, H, generator=g) * 4).to(torch.bfloat16)
        b = torch.randn(E, H, generator=g).to(torch.bfloat16)
        w = torch.rand(T, k, generator=g)
        pos = torch.randperm(R, generator=g)[: T * k].reshape(T, k).to(torch.int32)
        pos[0, k - 1] = -1
        ex = torch.randint(0, E, (T, k), generator=g, dtype=torch.int32)
        acc = torch.zeros(T, H)
        for j in range(k):
            v = y[pos[:, j].clamp(min=0).long()].float() + b[ex[:, j].long()].float()
            acc = acc + torch.where((pos[:, j] >= 0)[:, None], w[:, j : j + 1] * v, 0.0)
        mag = sum((w[:, j : j + 1] * (y[pos[:, j].clamp(min=0).long()].float()
                                     + b[ex[:, j].long()].float())).abs() for j in range(k))
        for od in outs:
            got = _combine(y.to(device), b.to(device), w.to(device), pos.to(device), ex.to(device), od).cpu()
            if device == "cpu":  # (the interpreter: w * v and the add rounded apart, as torch's sum)
                assert torch.equal(got.view(torch.uint8), acc.to(od).view(torch.uint8)), (T, k, H, od)
            else:  # (the GPU fuses w * v + acc into an fma: float32 sums that differ in the last bits; the out
                # dtype's rounding, eps of |acc| or, where a cancelling sum lands below its normal range, eps of tiny:
                # fp16 at |acc| < 2^-14, one run in ~25 before that term)
                tol = 2.0**-22 * mag + torch.finfo(od).eps * (acc.abs() + torch.finfo(od).tiny)
                assert bool(((got.float() - acc).abs() <= tol).all()), (T, k, H, od)
        ids = torch.randint(0, E + 4, (T, k), generator=g)  # int64, as torch.topk gives them
        yd = torch.randn(T * k, H, generator=g)
        got = _combine_direct(yd.to(device), ids.to(device), 2, E, torch.float32).cpu()
        held = (ids >= 2) & (ids < 2 + E)
        want = sum(torch.where(held[:, j : j + 1], yd.view(T, k, H)[:, j], 0.0) for j in range(k))
        assert torch.equal(got, want), (T, k, H)
        n += 1
    return n


def _check_combine_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (float32 / float16 out: the interpreter's float32 -> bf16 cast truncates)."""
    from conftest import interpreted_rng

    from mxkit.kernels.moe_details import _moe_epilogue

    g = interpreted_rng(_moe_epilogue._combine_kernel)
    print(f"interpreter checks passed: {_check_combine('cpu', g, outs=(torch.float32, torch.float16))}")


def test_combine_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_combine_interpreted")


@pytest.mark.gpu
def test_gpu_combine(rng):
    assert _check_combine("cuda", rng)


def _check_gather_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.moe_details import _moe_epilogue

    g = interpreted_rng(_moe_epilogue._gather_rows_kernel)
    print(f"interpreter checks passed: {_check_gather_rows('cpu', g)}")


def test_gather_rows_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_gather_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_gather_rows(rng):
    assert _check_gather_rows("cuda", rng) == 3


def test_mma_k_order():
    """The decode-mma layout's K order (mma_k_order) is a permutation inside each 64 columns, the inverse of the
    wgmma kernel's PERM_OUT column map (its formula, replicated), and matches pack_mma: the codes of column
    mma_k_order[16 j + 8 kh + 2 t + e] are those of lane (g, t)'s word j, pair (h = 0, kh), half e."""
    from mxkit.kernels.matmul_details._mma_decode import BITS, pack_mma
    from mxkit.kernels.matmul_details._layout_mma import mma_k_order

    K = 192
    order = mma_k_order(K)
    assert torch.equal(order.sort().values, torch.arange(K)) and torch.equal(order // 64, torch.arange(K) // 64)
    ka = torch.arange(K) % 64
    kl = (ka & 1) | (((ka >> 3) & 3) << 1) | (((ka >> 1) & 1) << 3) | (((ka >> 2) & 1) << 4) | (ka & 32)
    assert torch.equal(order[torch.arange(K) // 64 * 64 + kl], torch.arange(K))
    with pytest.raises(ValueError, match="multiple of 64"):
        from mxkit.kernels.moe import gather_rows

        gather_rows(torch.zeros(2, 96, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32), 2, 1,
                    mma_k_order=True)
    # row 0's codes 0..63, distinct modulo 16 inside each 16: the word bits say which column each lane holds
    codes = (torch.arange(K) % 16).to(torch.uint8)
    qd = torch.zeros(16, K // 2, dtype=torch.uint8)
    qd[0] = codes[0::2] | (codes[1::2] << 4)
    q, _ = pack_mma(qd, torch.full((16, K // 32), 127, dtype=torch.uint8))
    word = q[0, :, :4].to(torch.int64) & 0xFFFFFFFF  # tile, lane (g = 0, t), j
    for tile in range(K // 64):
        for t in range(4):
            for j in range(4):
                for kh in range(2):
                    for e in range(2):
                        code = sum(((int(word[tile, t, j]) >> at) & 1) << bit
                                   for bit, at in enumerate(BITS[(2 * kh, e)]))
                        assert code == int(codes[order[64 * tile + 16 * j + 8 * kh + 2 * t + e]])


# ---------------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,k,block_m,rng_", [(1, 128, 4, 16, None), (3, 32, 4, 16, None), (32, 128, 4, 16, None),
                                                (7, 32, 2, 64, None), (32, 32, 4, 16, (8, 24)), (1, 8, 4, 16, (4, 8))])
def test_gpu_align_one_program(T, E, k, block_m, rng_, rng):
    """The one-program sort (up to SMALL_PAIRS pairs) equals align_block_size, padding blocks included, from
    int32 ids and from the router's int64 ones (read as they are)."""
    from mxkit.kernels.moe import SMALL_PAIRS

    assert T * k <= SMALL_PAIRS
    ids = rand_ids(T, k, E, rng, every=1 if T > 1 else None).cuda()
    lo, hi = rng_ or (0, E)
    ref_ids, ref_eids, P = align_block_size(ids, E, block_m, expert_range=rng_)
    for dtype in (torch.int32, torch.int64):
        got_ids, got_eids = align_device(ids.to(dtype), hi - lo, block_m, lo=lo)
        assert torch.equal(got_ids[:P], ref_ids) and torch.equal(got_eids[: P // block_m], ref_eids)
        assert (got_ids[P:] == T * k).all() and (got_eids[P // block_m:] == -1).all()


@pytest.mark.gpu
@gpu
def test_gpu_align_per_expert(rng):
    """The one-program-per-expert sort on the GPU (above SMALL_PAIRS pairs) equals align_block_size, and with
    the groups padded for mixed block sizes its PyTorch path."""
    _check_align_experts("cuda", rng, ALIGN_EXPERT_CASES)
    _check_align_wide("cuda", rng, ALIGN_WIDE_CASES)


def act_flips(y64, x, w1, b1, w2, b2, tw, ids, act="swiglu_gpt_oss"):
    """Per token, twice what rounding every element of the activation output v = act(x @ W1.T + b1) to bf16
    moves the output (the float64 reference with v in float64 against y64, which rounds v as the kernel does).
    The kernel's v, from float32 sums, can sit on the other side of a bf16 rounding boundary than the exact v:
    that element then rounds to the neighbouring bf16 (one ulp away, where rounding moves it by at most half of
    one), and the output moves with it; such elements are a few of all, so twice the all-elements effect
    bounds them (seen: 1 of 727 tokens 12% past the bare 1.5x output-rounding bound, H200)."""
    wide = moe_reference(x, w1, b1, w2, b2, tw, ids, activation=act, out_dtype=torch.float64)
    d = wide - y64
    return 2 * torch.where(torch.isinf(wide) & (wide == y64), 0.0, d).norm(dim=1)  # (the same infinity: no move)


def experts(E, N, K, fmt, g, *, band=3):
    """(E, N, K) CUDA experts quantized along K: rows of N(0, 1) times 2^j (j uniform in -band .. band), drawn on
    the GPU from a generator seeded by ``g`` and quantized 8 experts at a time (the float32 weight of 128 GPT-OSS
    experts is 7.9 GiB: too much for one GPU shared by the test workers, an out-of-memory failure seen under xdist;
    drawn on the CPU, one thread a worker, it took ~20 s a test)."""
    gen = cuda_generator(g)
    parts = []
    for e in range(0, E, 8):
        n = min(8, E - e)
        w = torch.randn(n, N, K, generator=gen, device="cuda")
        w *= 2.0 ** torch.randint(-band, band + 1, (n, N, 1), generator=gen, device="cuda")
        parts.append(mxkit.quantize(w, fmt))
    return dataclasses.replace(parts[0], qdata=torch.cat([p.qdata for p in parts]),
                               scale=torch.cat([p.scale for p in parts]), shape=torch.Size((E, N, K)))


def assert_rows(y, y64, err_scale, factor=1.2):
    """Rows y within ``factor`` times their bf16 rounding of y64 plus ``err_scale``: a row's slack (R,), or an
    element's (R, N), whose norm over the row's finite elements is taken. NaN rows of y64 must be NaN in y, and
    its infinities the same infinities."""
    y, y64 = y.to(torch.float64).cpu(), y64.cpu()
    nan = torch.isnan(y64).any(dim=1)
    assert torch.isnan(y[nan]).all()
    y, y64, err_scale = y[~nan], y64[~nan], err_scale.cpu()[~nan]
    inf = torch.isinf(y64)  # (an Inf element code): the same infinity, then left out of the norms
    assert torch.equal(y[inf], y64[inf])
    y, y64 = y.masked_fill(inf, 0), y64.masked_fill(inf, 0)
    if err_scale.dim() == 2:
        err_scale = err_scale.masked_fill(inf, 0).norm(dim=1)
    bound = factor * (y64.to(torch.bfloat16).to(torch.float64) - y64).norm(dim=1) + err_scale
    err = (y - y64).norm(dim=1)
    bad = torch.nonzero(~(err <= bound)).flatten()  # (a NaN error is over it)
    assert bad.numel() == 0, (f"{bad.numel()} rows over the bound, e.g. row {bad[0].item()}: "
                              f"{err[bad[0]].item():.3e} > {bound[bad[0]].item():.3e}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3", "mxint8"])
@pytest.mark.parametrize("act", [None, "swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("cfg", [MoeConfig(16, 64, 128, 4, 3), MoeConfig(64, 128, 64, 4, 4)])
def test_gpu_grouped_gemm(fmt, act, cfg, rng):
    """One grouped GEMM with gather, bias, activation and routing weights, into a NaN-poisoned output: every
    routed row is written and within the bound; K = 2880 (not a multiple of the K tile)."""
    T, k, E, N, K = 37, 4, 8, 320, 2880
    w = experts(E, N, K, fmt, rng)
    x = torch.randn(T, K, generator=rng).to(torch.bfloat16).cuda()
    bias = torch.randn(E, N, generator=rng).cuda()
    rw = torch.rand(T * k, generator=rng).cuda()
    ids = rand_ids(T, k, E, rng, every=2).cuda()
    sid, eid = align_device(ids, E, cfg.block_m)
    out = torch.full((T * k, N // 2 if act else N), float("nan"), dtype=torch.bfloat16, device="cuda")
    grouped_matmul_w16(x, w, sid, eid, cfg, n_valid=T * k, top_k=k, gather=True, bias=bias, routing_weights=rw,
                       activation=act, out=out)
    y64, acc = pair_rows64(x, w, ids, cfg.block_m, bias, act, rw)
    assert_rows(out, y64, acc)


ACT = {None: lambda h: h, "swiglu_gpt_oss": swiglu_gpt_oss, "swiglu": swiglu}


def act_slack(h64: torch.Tensor, acc: torch.Tensor, act) -> torch.Tensor:
    """Element by element, a bound on |act(h) − act(h64)| for any h within ``acc`` of h64 (both float64, (..., N)),
    plus act's own float32 evaluation: twice the largest move of act(h64) over the four corners of the box (each
    output's gate ± acc, up ± acc; over a box this small act is first-order, so its largest move is at a corner,
    and twice it covers the second-order terms), plus 8 float32 ulps of the output. ``act`` None: acc itself."""
    if act is None:
        return acc
    f = ACT[act]
    gate = torch.zeros(h64.shape[-1], dtype=torch.bool, device=h64.device)
    if act == "swiglu_gpt_oss":
        gate[0::2] = True  # (interleaved gate / up rows)
    else:
        gate[: h64.shape[-1] // 2] = True  # ([gate; up] halves)
    y = f(h64)
    move = torch.zeros_like(y)
    for sg in (-1.0, 1.0):
        for su in (-1.0, 1.0):
            move = torch.maximum(move, (f(h64 + torch.where(gate, sg * acc, su * acc)) - y).abs())
    return 2 * move + 8 * 2.0**-24 * y.abs()


def pair_rows64(x, w, ids, block_m, bias=None, act=None, rw=None):
    """(y64, acc) of a grouped GEMM's rows in pair order (token t's slot j: row t·k + j): the float64 product of x's
    token and the pair's expert, plus bias, through ``act``, times ``rw``; acc its elements' slack (module
    docstring), (T·k, N or N / 2)."""
    T, k = ids.shape
    E, N, K = w.shape
    rid, reid, _ = align_block_size(ids, E, block_m)
    h64 = grouped_matmul_reference(x, w, rid, reid, block_m, k, bias=bias)  # sorted order
    flat = torch.zeros(T * k, N, dtype=torch.float64, device=x.device)
    valid = rid < T * k
    flat[rid[valid].long()] = h64[valid]
    w64 = dequantize_reference(w, torch.float64)
    a64 = x.to(torch.float64)[torch.arange(T * k, device=x.device) // k]
    pair_e = ids.reshape(-1).long()
    rss = torch.zeros(T * k, N, dtype=torch.float64, device=x.device)
    for e in range(E):
        r = pair_e == e
        rss[r] = ((a64[r] * a64[r]) @ (w64[e] * w64[e]).T).sqrt()
    acc = act_slack(flat, accumulation_bound(flat, rss, K), act)
    y64 = ACT[act](flat)
    if rw is not None:
        rw64 = rw.to(torch.float64)[:, None]
        y64, acc = y64 * rw64, acc * rw64 + 2.0**-24 * (y64 * rw64).abs()
    return y64, acc


@pytest.mark.parametrize("act", [None, "swiglu_gpt_oss", "swiglu"])
def test_the_moe_bound_catches_lost_precision(act, rng):
    """The grouped GEMMs' checker itself (CPU): float32 sums of the exact values, through the activation in float32,
    times the routing weights, rounded to bf16, pass; 16 products lost from K = 2880 (what a kernel skipping half
    a K step of 32 does) fail on every row (the worst-case bound used before passed some). (bf16 partial sums
    are caught by test_matmul's float32-output negative control: under a bf16 output their error is the size
    of its rounding.)"""
    T, k, E, N, K = 6, 4, 4, 256, 2880
    w = mxkit.quantize(torch.randn(E, N, K, generator=rng) * 2.0 ** torch.randint(-3, 4, (E, N, 1), generator=rng),
                       "mxfp4")
    x = torch.randn(T, K, generator=rng).to(torch.bfloat16)
    bias = torch.randn(E, N, generator=rng)
    rw = torch.rand(T * k, generator=rng) + 0.5
    ids = rand_ids(T, k, E, rng)
    y64, acc = pair_rows64(x, w, ids, 16, bias, act, rw)
    a32 = x.float()[torch.arange(T * k) // k]
    w32 = dequantize_reference(w, torch.float32)[ids.reshape(-1).long()]
    b32 = bias[ids.reshape(-1).long()]

    def rows(h32):
        return (ACT[act](h32) * rw[:, None]).bfloat16()

    def sums(a):
        return torch.einsum("pk,pnk->pn", a, w32)

    assert_rows(rows(sums(a32) + b32), y64, acc)
    lost = a32.clone()
    lost[:, 1024:1040] = 0
    y = rows(sums(lost) + b32)
    for r in range(T * k):
        with pytest.raises(AssertionError, match="over the bound"):
            assert_rows(y[r:r + 1], y64[r:r + 1], acc[r:r + 1])


def layer_case(T, E, H, I, fmt, rng, k=4, act="swiglu_gpt_oss"):
    """(x, w1, b1, w2, b2, topk_weights, topk_ids) of a layer: biases, top-k, an expert that receives every
    token (3) and one that receives none (9). The down bias is drawn at the root mean square of the layer's
    output without it under ``act`` (a unit bias under outputs of hundreds was below the bound's slack: a kernel
    that dropped it passed); the allocator's free memory is poisoned last (NaN bytes), for the kernel call that
    follows."""
    w1, w2 = experts(E, 2 * I, H, fmt, rng), experts(E, H, I, fmt, rng)
    b1 = torch.randn(E, 2 * I, generator=rng).cuda()
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng, every=3, none=9).cuda()
    tw = torch.softmax(torch.randn(T, k, generator=rng), -1).cuda()
    y = moe_reference(x, w1, b1, w2, None, tw, ids, activation=act, out_dtype=torch.float64)
    rms = y[torch.isfinite(y)].square().mean().sqrt().item()
    b2 = (torch.randn(E, H, generator=rng) * max(rms, 1.0)).cuda()
    del y
    poison_allocator()
    return x, w1, b1, w2, b2, tw, ids


def check_layer(y, case, act):
    """y (bf16, (T, H)) within the layer's bound of the float64 reference (h rounded to bf16 as the kernels do;
    act_flips for the activation's rounding flips)."""
    y64 = moe_reference(*case, activation=act, out_dtype=torch.float64, intermediate_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (case[0].shape[0], case[0].shape[1])
    assert_rows(y, y64, act_flips(y64, *case, act), factor=1.5)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I,fmt", [(1, 128, 2880, 2880, "mxfp4_e2m1"), (3, 32, 2880, 2880, "mxfp4_e2m1"),
                                         (727, 32, 256, 192, "mxfp4_e2m1"), (727, 128, 256, 192, "mxfp8_e4m3"),
                                         (200, 32, 512, 256, "mxfp4_e2m1")])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_moe_layer(T, E, H, I, fmt, act, rng):
    """The whole expert computation against the reference: an expert that receives every token, one that
    receives none, biases, top-4."""
    case = layer_case(T, E, H, I, fmt, rng, act=act)
    case[1].scale[5, 1, 0] = 255  # a NaN in an up (GPT-OSS) / gate row: NaN through the clamps of its tokens' rows
    check_layer(moe_triton(*case, activation=act), case, act)


@pytest.mark.gpu
@gpu
def test_gpu_moe_expert_parallel_slices_sum_to_the_layer(rng):
    """expert_range: the partial outputs of a partition of the experts sum to the whole layer (float32 out;
    within the layer's bound of the float64 reference: the slices round h as the whole does, but the sum over
    slots runs in another order); each slice with its experts' biases (indexed by local expert id)."""
    T, E, H, I, k = 64, 32, 256, 128, 4
    w1, w2 = experts(E, 2 * I, H, "mxfp4", rng), experts(E, H, I, "mxfp4", rng)
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng).cuda()
    tw = torch.rand(T, k, generator=rng).cuda()
    whole = moe_triton(x, w1, b1, w2, b2, tw, ids, out_dtype=torch.float32)
    parts = sum(moe_triton(x, select_experts(w1, lo, hi), b1[lo:hi], select_experts(w2, lo, hi), b2[lo:hi], tw, ids,
                           out_dtype=torch.float32,
                           expert_range=(lo, hi), num_experts=E) for lo, hi in ((0, 12), (12, 13), (13, 32)))
    y64 = moe_reference(x, w1, b1, w2, b2, tw, ids, out_dtype=torch.float64, intermediate_dtype=torch.bfloat16)
    flips = act_flips(y64, x, w1, b1, w2, b2, tw, ids)
    assert_rows(whole, y64, flips, factor=1.5)
    assert_rows(parts, y64, flips, factor=1.5)
    assert_sums_agree(parts, whole)


def assert_sums_agree(parts, whole):
    """float32 outputs that differ only in the order of their slot sums: within 64 float32 ulps of the row's largest
    magnitude (a path rounding its partials or the slot sum to bf16 is ~2^-9 off, and passes a bf16-sized bound)."""
    scale = whole.double().abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    err = (parts.double() - whole.double()).abs() / scale
    assert bool((err <= 64 * 2.0**-24).all()), f"slices vs whole: {err.max().item():.3e} of the row's largest"


@pytest.mark.gpu
@gpu
def test_gpu_moe_fallbacks_equal_the_reference(rng):
    """FP6 experts and a weight scale outside the bf16-exact envelope take the reference (bytes equal)."""
    T, E, H, I, k = 5, 4, 64, 32, 2
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng).cuda()
    tw = torch.rand(T, k, generator=rng).cuda()
    for fmt, poke in (("mxfp6_e2m3", None), ("mxfp4", 254)):
        w1, w2 = experts(E, 2 * I, H, fmt, rng), experts(E, H, I, fmt, rng)
        if poke is not None:
            w1.scale[0, 0, 0] = poke
        y = moe_triton(x, w1, None, w2, None, tw, ids)
        ref = moe_reference(x, w1, None, w2, None, tw, ids, intermediate_dtype=torch.bfloat16)
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16))


@pytest.mark.parametrize("w_kind", [0, 1, 2, 3, 4, 5])
def test_w16_kernels_compile_for_sm90(w_kind):
    """The grouped and the dense decode kernel build for sm_90 on the CPU (Triton's bundled ptxas) for every
    weight kind and epilogue: the inline asm and the early return of unused blocks are only compiled there
    (the interpreter runs neither faithfully; their results are checked by the GPU tests above)."""
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxkit.kernels.matmul_details._grouped import _grouped_w16_kernel
    from mxkit.kernels.matmul_details._w16_decode import _w16_decode_kernel

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "the interpreter replaces the compiler"

    def build(fn, ptrs, consts, warps=4):
        sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in fn.arg_names}
        k = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": warps, "num_stages": 3})
        return len(k.asm["cubin"])

    gptrs = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*fp32", "rw_ptr": "*fp32",
             "out_ptr": "*bf16", "ids_ptr": "*i32", "eids_ptr": "*i32"}
    for act, gather, tiles in ((0, True, (16, 64, 128)), (1, True, (64, 128, 64)), (2, False, (32, 64, 128))):
        consts = dict(TOP_K=4, GATHER=gather, HAS_BIAS=True, MUL_RW=not gather, ACT=act, W_KIND=w_kind,
                      BLOCK_M=tiles[0], BLOCK_N=tiles[1], BLOCK_K=tiles[2])
        assert build(_grouped_w16_kernel, gptrs, consts) > 0
    if w_kind == 0:
        from mxkit.kernels.moe_details._align import _align_small_kernel

        aptrs = {"ids_ptr": "*i32", "sorted_ptr": "*i32", "eids_ptr": "*i32"}
        assert build(_align_small_kernel, aptrs, dict(N_P2=128, E_P2=128, NB_P2=128, BLOCK_M=16), 8) > 0
        from mxkit.kernels.moe_details._align import _align_expert_kernel

        from mxkit.kernels.moe_details._align import _align_hist_kernel

        aptrs.update(hist_ptr="*i32", pos_ptr="*i32", offs_ptr="*i32")
        for top_k in (0, 4):
            assert build(_align_hist_kernel, aptrs, dict(E_P2=128, CHUNK=1024, ROWS=top_k > 0)) > 0
            assert build(_align_expert_kernel, aptrs, dict(E_P2=128, CHUNK=1024, GROUP=8, HROWS=16, BLOCK_M=256,
                                                           TOP_K=top_k, OFFS=top_k > 0)) > 0
        # the row passes around the grouped GEMMs (gather, W4A8 middle pass) and the FP8 rowwise quantization
        from mxkit.kernels.moe_details._moe_epilogue import (_bias_act_fp8_kernel, _combine_kernel,
                                                                _gather_rows_kernel)
        from mxkit.kernels.quantize_details._fp8_rowwise import _fp8_rowwise_kernel

        rptrs = {"src_ptr": "*i32", "ids_ptr": "*i32", "dst_ptr": "*i32", "ssrc_ptr": "*fp32", "sdst_ptr": "*fp32"}
        assert build(_gather_rows_kernel, rptrs, dict(TOP_K=4, ROWS=4, BLOCK_W=256, HAS_SCALE=True,
                                                      PERM64=False)) > 0
        assert build(_gather_rows_kernel, rptrs, dict(TOP_K=4, ROWS=4, BLOCK_W=256, HAS_SCALE=False,
                                                      PERM64=True)) > 0
        cptrs = {"y_ptr": "*fp32", "b_ptr": "*fp32", "w_ptr": "*fp32", "pos_ptr": "*i32", "e_ptr": "*i32",
                 "out_ptr": "*bf16"}
        for direct in (False, True):
            assert build(_combine_kernel, cptrs, dict(TOP_K=4, HAS_BIAS=not direct, BLOCK_H=1024, DIRECT=direct)) > 0
        assert build(_combine_kernel, dict(cptrs, pos_ptr="*i64"), dict(TOP_K=4, HAS_BIAS=False, BLOCK_H=1024,
                                                                        DIRECT=True)) > 0
        bptrs = {"h_ptr": "*bf16", "b_ptr": "*fp32", "ids_ptr": "*i32", "eids_ptr": "*i32", "q_ptr": "*u8",
                 "s_ptr": "*fp32"}
        for act in (1, 2):
            for n2 in (0, 256):
                assert build(_bias_act_fp8_kernel, bptrs, dict(ACT=act, HAS_BIAS=True, BLOCK_M=16, BLOCK_N=512,
                                                               BLOCK_N2=n2)) > 0
        for x_ty, bf16 in (("*i16", True), ("*fp32", False), ("*fp16", False)):
            fptrs = {"x_ptr": x_ty, "q_ptr": "*u8", "s_ptr": "*fp32"}
            for one_pass in (True, False):
                assert build(_fp8_rowwise_kernel, fptrs, dict(ROWS=1, BLOCK_K=4096, ONE_PASS=one_pass, BF16_BITS=bf16,
                                                              HW_CVT=True), 8) > 0
    for x_ty in ("*bf16", "*fp16"):
        dptrs = {"x_ptr": x_ty, "q_ptr": "*u8", "s_ptr": "*u8", "out_ptr": "*fp32"}
        assert build(_w16_decode_kernel, dptrs, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, W_KIND=w_kind)) > 0


def _middle_cases(g, device):
    """The W4A8 middle pass (``_bias_act_fp8_kernel``) against float32 PyTorch: the scales those of
    quantize_fp8_rowwise's rule on v = act(h + b[e]), the codes within 1.2x that rule's own rounding error a row
    (the kernel multiplies by the row's reciprocal); a NaN row, an all-zero row, padding rows (q = 0, s = 0);
    rows in one piece (N = 512) and in two (N = 384: 256 + 128). Returns the number of cases."""
    from mxkit.kernels.moe_details._fold import _BIAS_ACT_FP8, _middle_blocks

    n_cases = 0
    for N in (384, 512):
        for act, code in (("swiglu_gpt_oss", 1), ("swiglu", 2)):
            R, E, n = 48, 5, 40
            h = (torch.randn(R, N, generator=g) * 2.0 ** torch.randint(-3, 4, (R, 1), generator=g)).to(torch.bfloat16)
            h[3] = float("nan")
            h[5] = 0
            b = torch.randn(E, N, generator=g) * 0.5
            b[torch.randint(0, E, (1,), generator=g)] = 0
            ids = torch.randperm(R, generator=g).to(torch.int32)  # ids >= n: padding rows
            eids = torch.randint(0, E, (R // 16,), generator=g, dtype=torch.int32)
            e_row = eids.repeat_interleave(16).long()
            b[e_row[5]] = 0
            q = torch.full((R, N // 2), 0x55, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
            s = torch.full((R,), float("nan"), device=device)  # (poisoned: every row must be written)
            blocks = _middle_blocks(N)
            _BIAS_ACT_FP8((R,), (h.to(device), b.to(device), ids.to(device), eids.to(device), q.view(torch.uint8), s, n,
                                 N), (("ACT", code), ("HAS_BIAS", True), ("BLOCK_M", 16), ("BLOCK_N", blocks[0]),
                                      ("BLOCK_N2", blocks[1]), ("HW_CVT", device != "cpu")), 4)
            q, s = q.cpu(), s.cpu()
            hv = h.float() + b[e_row]
            v = swiglu_gpt_oss(hv) if act == "swiglu_gpt_oss" else swiglu(torch.cat([hv[:, 0::2], hv[:, 1::2]], 1))
            valid = ids < n
            ref = mxkit.quantize_fp8_rowwise(v)  # (the reference twin on CPU)
            sv = ref.scale.view(-1)
            assert torch.equal(s[valid].isnan(), sv[valid].isnan()) and bool(s[3].isnan()) == bool(valid[3])
            ok = valid & ~sv.isnan()
            # (within 8 ulp: the kernel's float32 activation and PyTorch's differ in their last bits)
            rel = ((s[ok] - sv[ok]).abs() / sv[ok]).max()
            assert rel <= 2.0 ** -20 and (s[~valid] == 0).all(), rel
            assert (q[~valid].view(torch.uint8) == 0).all()
            got = q[ok].double() * s[ok].double()[:, None]
            err = (got - v[ok].double()).norm(dim=1)
            bound = 1.2 * (ref.dequantize(torch.float64)[ok] - v[ok].double()).norm(dim=1) + 1e-6 * v[ok].norm(dim=1)
            assert (err <= bound).all(), (err - bound).max()
            n_cases += 1
    return n_cases


def interpreted_middle_checks():
    from conftest import interpreted_rng
    from mxkit.kernels.moe_details._moe_epilogue import _bias_act_fp8_kernel

    g = interpreted_rng(_bias_act_fp8_kernel)
    print(f"interpreter checks passed: {_middle_cases(g, 'cpu')}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="runs itself under the interpreter")
def test_w4a8_middle_pass_under_the_interpreter():
    from conftest import run_interpreted

    run_interpreted(__file__, "interpreted_middle_checks")


@pytest.mark.gpu
@gpu
def test_gpu_w4a8_middle_pass(rng):
    assert _middle_cases(rng, "cuda") == 4


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("T,E", [(3, 8), (300, 32)])
def test_gpu_moe_w4a8_stages(act, T, E, rng):
    """The W4A8 MoE stage by stage: each FP8 grouped GEMM within the GEMM bound of float64 on its FP8 inputs,
    the middle pass within one FP8 rounding of float32 act(h + b), the combine within bf16 rounding; an expert
    that receives every token and one that receives none; padding rows zero; then the whole against the
    twin moe_w4a8_reference."""
    from mxkit.kernels.moe import fold_experts, moe_w4a8_triton

    H, I, k = 256, 192, 4
    w1, w2 = experts(E, 2 * I, H, "mxfp4", rng), experts(E, H, I, "mxfp4", rng)
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng, every=1, none=2).cuda()
    tw = torch.softmax(torch.randn(T, k, generator=rng), -1).cuda()
    f1, f2 = fold_experts(w1, interleave_halves=act == "swiglu"), fold_experts(w2)
    xq = mxkit.quantize_fp8_rowwise(x)
    st = {}
    out = moe_w4a8_triton(xq, f1, b1, f2, b2, tw, ids, activation=act, stages=st)
    sid, eid = st["ids"], st["eids"]
    valid = sid < T * k
    e_row = eid.clamp(min=0).repeat_interleave(16).long()
    w1v = dequantize_reference(w1, torch.float64)
    if act == "swiglu":
        w1v = torch.cat([w1v[:, :I, None], w1v[:, I:, None]], 2).flatten(1, 2)
    xv = (xq.data.to(torch.float64) * xq.scale.to(torch.float64).reshape(-1, 1)).cpu()  # the tokens' FP8 values
    # (the tokens themselves, not the kernel's gathered copy st["xa"] / st["sa"]: a wrong gather reads as wrong h)
    h64 = torch.einsum("rk,rnk->rn", xv[sid[valid].long().cpu() // k], w1v.cpu()[e_row[valid].cpu()])
    assert_rows(st["h"][valid], h64, torch.zeros(int(valid.sum())))
    # the middle pass, from the kernel's own h
    b1i = b1 if act != "swiglu" else torch.stack([b1[:, :I], b1[:, I:]], 2).flatten(1, 2)
    hv = st["h"][valid].to(torch.float32) + b1i[e_row[valid]]
    v = (swiglu_gpt_oss(hv) if act == "swiglu_gpt_oss" else swiglu(torch.cat([hv[:, 0::2], hv[:, 1::2]], 1)))
    ref8 = mxkit.quantize_fp8_rowwise(v)
    got = st["h8"][valid].to(torch.float64) * st["s2"][valid].to(torch.float64)[:, None]
    err = (got - v.to(torch.float64)).norm(dim=1)
    bound = 1.2 * (ref8.dequantize(torch.float64) - v.to(torch.float64)).norm(dim=1) + 1e-5 * v.norm(dim=1)
    assert (err <= bound).all(), (err - bound).max()
    assert (st["h8"][~valid].view(torch.uint8) == 0).all() and (st["s2"][~valid] == 0).all()
    # the down GEMM and the combine
    y64 = torch.einsum("rk,rnk->rn", got, dequantize_reference(w2, torch.float64)[e_row[valid]])
    assert_rows(st["y"][valid], y64, torch.zeros(int(valid.sum())))
    pairs = torch.zeros(T * k, H, dtype=torch.float64, device="cuda")
    pairs[sid[valid].long()] = st["y"][valid].to(torch.float64) + b2.to(torch.float64)[e_row[valid]]
    o64 = (pairs.view(T, k, H) * tw.to(torch.float64)[..., None]).sum(1)
    assert_rows(out, o64, 1e-6 * o64.norm(dim=1))
    # and against the twin. The kernel's h is its FP8 tensor cores' sums rounded to bf16, the twin's float64 sums
    # rounded so: where they differ by an ulp, the FP8 cast of v may move an element by a step, the row's scale,
    # or (where h + b cancels) an element by far more than a step of its own (a whole-layer allowance of 4% of
    # the tokens past 1% once met 4, 8 and 7 of 300 here). h is checked above, from the tokens themselves, so the
    # twin continues from the kernel's h: its v8 is the float64 activation of the kernel's h + b1, FP8-cast; the
    # kernel's v8 (float32 activation) within one E4M3 step of it element by element, where it differs at all;
    # the twin's output moved by the difference of those pairs' bf16(v8 @ W2[e].T) from its own. Then every
    # token within 5% of its norm and at most 4% (2 at T = 3) past 1% (bf16 roundings of y, summed with
    # cancellation).
    from mxkit.moe_reference import ACTIVATIONS, _bf16_cast, _fp8_rowwise_cast, moe_w4a8_reference

    ref = moe_w4a8_reference(xq, w1, b1, w2, b2, tw, ids, activation=act, out_dtype=torch.float64).cpu()
    h = pair_rows64(xv, w1.to("cpu"), ids.cpu(), 16)[0]
    bias1 = b1.cpu().to(torch.float64)[ids.cpu().long().flatten()]
    v8 = _fp8_rowwise_cast(ACTIVATIONS[act](_bf16_cast(h) + bias1))  # the twin's own
    hk = pair_rows(st["h"], sid, T * k)  # the kernel's h per pair, in the checkpoint's row order
    if act == "swiglu":
        hk = torch.cat([hk[:, 0::2], hk[:, 1::2]], 1)
    v8t = _fp8_rowwise_cast(ACTIVATIONS[act](hk + bias1))
    v8k = pair_rows(st["h8"].to(torch.float64) * st["s2"].to(torch.float64)[:, None], sid, T * k)
    # one E4M3 step: 1/8 of the larger magnitude, or the subnormal step 2^-9 of the larger row scale (amax / 448)
    scale = torch.maximum(v8k.abs().amax(dim=1), v8t.abs().amax(dim=1)) / 448
    step = torch.maximum(0.125 * torch.maximum(v8k.abs(), v8t.abs()), 2.0**-9 * scale[:, None])
    assert ((v8k - v8t).abs() <= 1.001 * step).all(), float(((v8k - v8t).abs() / step).max())
    twin_takes(ref, v8k, v8, dequantize_reference(w2, torch.float64).cpu(), ids, tw)
    rel = (out.cpu().to(torch.float64) - ref).norm(dim=1) / ref.norm(dim=1).clamp(min=1e-300)
    assert (rel > 0.01).sum() <= max(2, T // 25) and rel.max() <= 0.05, (int((rel > 0.01).sum()), rel.max())


@pytest.mark.parametrize("interleave", [False, True])
def test_fold_experts_is_exact_and_refuses_rows_that_do_not_fold(rng, interleave):
    """Pack time runs on any device: the folded E4M3 rows times their row scales are the experts' values, and a
    row whose block scales span more than the fold range makes the whole set refuse (None)."""
    from mxkit.kernels.moe import fold_experts

    E, N, K = 4, 64, 128
    w = mxkit.quantize(torch.randn(E, N, K, generator=rng) * 2.0 ** torch.randint(-3, 4, (E, N, 1), generator=rng),
                       "mxfp4")
    f = fold_experts(w, interleave_halves=interleave)
    assert f is not None and f.data.dtype == torch.float8_e4m3fn and f.data.shape == (E, N, K)
    want = dequantize_reference(w, torch.float64)
    if interleave:  # rows (gate_i, up_i) side by side: the first half's row i, then the second half's
        want = torch.stack([want[:, :N // 2], want[:, N // 2:]], 2).flatten(1, 2)
    got = f.data.to(torch.float64) * f.scale.to(torch.float64)[..., None]
    assert torch.equal(got, want)
    w.scale[2, 5, 0], w.scale[2, 5, 1] = 150, 100  # a span of 50 > 14
    assert fold_experts(w) is None


@pytest.mark.gpu
@gpu
def test_gpu_ops_capture_in_cuda_graphs(rng):
    """quantize (rowwise), dequantize and the MoE expert computation (decode size) captured in one CUDA graph
    and replayed on new input data give the eager bytes (issue #23: every op capturable)."""
    import mxkit

    T, E, H, I, k = 2, 16, 256, 128, 4
    w1, w2 = experts(E, 2 * I, H, "mxfp4", rng), experts(E, H, I, "mxfp4", rng)
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng).cuda()
    tw = torch.softmax(torch.randn(T, k, generator=rng), -1).cuda()

    def step(x, ids):
        q = mxkit.quantize(x, "mxfp8")
        return q, mxkit.dequantize(q, torch.bfloat16), moe_triton(x, w1, b1, w2, b2, tw, ids)

    assert_graph_replays(step, [x, ids], lambda: [torch.randn(T, H, generator=rng).to(torch.bfloat16),
                                                  rand_ids(T, k, E, rng)])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("act_format", [None, "fp8_e4m3_rowwise"])
def test_gpu_mxmoe_layer(act_format, rng):
    """MXMoE on CUDA (bf16 router, biases and tokens) takes the kernels and agrees with its references: W4A16
    with moe_reference (intermediate in bf16), W4A8 with moe_w4a8_reference. The W4A8 module's first forward
    folds its experts in place (layout "fold", twice the MXFP4 bytes): its output is the bits of a module that
    keeps its MX bytes and a folded copy, and its state_dict the checkpoint bytes it was built with."""
    from mxkit.moe_reference import moe_w4a8_reference, route
    from mxkit.nn import MXMoE

    E, H, I, k = 32, 256, 128, 4
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [torch.randn(E, 2 * I, H, generator=rng), torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng)]
    x = torch.randn(37, H, generator=rng).to(torch.bfloat16).cuda()

    def build(**kw):
        return MXMoE.from_dense(router, *(t.to(torch.bfloat16).cuda() for t in dense), k, "mxfp4",
                                act_format=act_format, **kw)

    m = build()
    with torch.no_grad():  # (the down bias at the output's size: a unit one was under W4A8's slack, dropped or not)
        tw, ids = route(m.router(x), k)
        y0 = moe_reference(x, m.gate_up_mx, m.gate_up_bias, m.down_mx, None, tw, ids, out_dtype=torch.float64)
    dense[3] = dense[3] * y0.square().mean().sqrt().item()
    m = build()
    sd0 = {n: t.clone() for n, t in m.state_dict().items()}
    with torch.no_grad():
        y = m(x)
        if act_format is not None:
            assert m.expert_layout == "fold" and m.gate_up_qdata.shape == (E, 2 * I, H)
            keep = build(keep_source=True)
            assert torch.equal(keep(x).view(torch.int16), y.view(torch.int16)) and keep.expert_layout == "checkpoint"
            sd1 = m.state_dict()
            assert all(torch.equal(sd1[n], sd0[n]) for n in sd0)
        tw, ids = route(m.router(x), k)
        if act_format is None:
            ref = moe_reference(x, m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias, tw, ids,
                                out_dtype=torch.float64, intermediate_dtype=torch.bfloat16)
            assert_rows(y, ref, torch.zeros(37), factor=1.5)
        else:
            ref = moe_w4a8_reference(mxkit.quantize_fp8_rowwise(x), m.gate_up_mx, m.gate_up_bias, m.down_mx,
                                     m.down_bias, tw, ids, out_dtype=torch.float64)
            assert_rows(y, ref, 0.01 * ref.norm(dim=1), factor=1.5)


# ---------------------------------------------------------------------------------------------------------
# the decode path: both expert GEMMs on the tensor-core decode kernel (packed experts)


def _count(monkeypatch, module, name: str, record) -> list:
    """Wrap ``module.name`` for the test: each call appends ``record(kwargs)`` to the returned list."""
    calls = []
    real = getattr(module, name)

    def counting(*a, **kw):
        calls.append(record(kw))
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counting)
    return calls


def _count_grouped_mma(monkeypatch):
    """The decode path's GEMM launches: the sorted blocks' (grouped_mma: the activation) and the unsorted pairs'
    (pairs_mma: ("pairs", the activation)), in call order."""
    from mxkit.kernels.matmul_details import _mma_decode

    calls = _count(monkeypatch, _mma_decode, "grouped_mma", lambda kw: kw["activation"])
    real = _mma_decode.pairs_mma
    monkeypatch.setattr(_mma_decode, "pairs_mma", lambda *a, **kw: calls.append(("pairs", kw["activation"]))
                        or real(*a, **kw))
    return calls


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I", [(1, 128, 2880, 2880), (3, 32, 2880, 2880), (64, 128, 256, 192),
                                     (61, 32, 512, 256)])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_moe_decode_mma(T, E, H, I, act, rng, monkeypatch):
    """Packed MXFP4 experts (pack_experts_mma): up to 64 tokens both GEMMs run on the tensor-core decode kernel
    (counted), within the layer's bound of the float64 reference; an expert that receives every token, one that
    receives none, biases, a scale byte 0 (the kernel's special-scale variant), top-4."""
    from mxkit.kernels.moe import moe_triton, pack_experts_mma

    case = layer_case(T, E, H, I, "mxfp4", rng, act=act)
    w1, w2 = case[1], case[3]
    w1.scale[0, 3, 1] = 0
    w1.scale[5, 1, 0] = 255  # a NaN in an up (GPT-OSS) / gate row: NaN through the clamps of its tokens' rows
    packed = (pack_experts_mma(w1, interleave_halves=act == "swiglu"), pack_experts_mma(w2))
    assert packed[0].special and not packed[1].special
    calls = _count_grouped_mma(monkeypatch)
    y = moe_triton(*case, activation=act, packed=packed)
    assert calls == ([("pairs", act), ("pairs", None)] if T * 4 <= 8 else [act, None])
    check_layer(y, case, act)


def _count_grouped_w16(monkeypatch):
    """The MXFP8 decode path's GEMM launches (grouped_w16: the activation, None for the down GEMM)."""
    from mxkit.kernels.matmul_details import _mma_a8w8

    return _count(monkeypatch, _mma_a8w8, "grouped_w16", lambda kw: kw["activation"])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I,fmt", [(1, 128, 2880, 2880, "mxfp8_e4m3"), (3, 32, 2880, 2880, "mxfp8_e5m2"),
                                         (64, 128, 256, 192, "mxfp8_e4m3"), (29, 32, 512, 256, "mxfp8_e5m2"),
                                         (61, 32, 512, 256, "mxfp8_e4m3")])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_moe_decode_w8a16_mma(T, E, H, I, fmt, act, rng, monkeypatch):
    """MXFP8 experts read as stored: up to mma_max_pairs (token, slot) pairs and W16_MMA_MAX_PER_EXPERT an expert
    both GEMMs run on the W8A16 tensor-core kernels (counted; past it, 61 tokens on 32 experts, the grouped Triton
    kernel), within the layer's bound of the float64 reference; an expert that receives
    every token, one that receives none, biases, a scale byte 255 (NaN through its tokens' rows), top-4. A NaN /
    Inf element code sends the layer to the grouped Triton kernel (no launch here), which matches the reference
    (E5M2's Inf decoded as Inf). (Scale bytes outside the bf16-exact envelope, 0 among them, take the reference
    before either.)"""
    case = layer_case(T, E, H, I, fmt, rng, act=act)
    w1 = case[1]
    w1.scale[5, 1, 0] = 255
    from mxkit.kernels.moe import W16_MMA_MAX_PER_EXPERT

    calls = _count_grouped_w16(monkeypatch)
    check_layer(moe_triton(*case, activation=act), case, act)
    assert calls == ([act, None] if T * 4 / E <= W16_MMA_MAX_PER_EXPERT else [])
    w1.qdata[7, 2, 5] = 0x7F if fmt == "mxfp8_e4m3" else 0x7C  # (a new version of the codes: checked again)
    calls.clear()
    from mxkit.kernels import moe as kmoe

    triton_calls = _count(monkeypatch, kmoe, "grouped_matmul_w16", lambda kw: kw["gather"])
    poison_allocator()  # (the first call's output, freed, would otherwise be this one's memory: rows it misses)
    check_layer(moe_triton(*case, activation=act), case, act)
    assert calls == [] and triton_calls == [True, False]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_gpu_grouped_w16_rows_are_the_dense_kernels_bytes(elem, rng, poison):
    """Each row of the grouped W8A16 down GEMM (no activation, routing weight 1, top-1) is the dense W8A16 kernel's
    float32 row at one thread block along K, byte for byte (the same K loop on the same codes, packed there, as
    stored here), bias included; the sorted list's padding entries (ids past the T rows) write nothing: the NaN
    rows after the output in its buffer stay NaN."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8, grouped_w16, pack_a8w8

    E, N, K, T = 6, 96, 448, 21
    fmt = f"mxfp8_{elem}"
    w = experts(E, N, K, fmt, rng)
    bias = torch.randn(E, N, generator=rng).cuda()
    x = torch.randn(T, K, generator=rng).to(torch.bfloat16).cuda()
    ids = torch.randint(0, E - 1, (T, 1), generator=rng).cuda()  # (expert E - 1 receives none)
    sorted_ids, eids = align_device(ids, E, 8)
    buf = torch.full((T + 16, N), float("nan"), device="cuda")
    y = buf[:T]
    assert (sorted_ids >= T).any()  # (padding entries there are)
    grouped_w16(x, w.qdata, w.scale, elem, N, K, sorted_ids, eids, T, 1, gather=False, bias=bias, activation=None,
                rw=torch.ones(T, device="cuda"), out=y)
    assert torch.isnan(buf[T:]).all()
    for e in range(E - 1):
        rows = (ids[:, 0] == e).nonzero().flatten()
        if not len(rows):
            continue
        q, s = pack_a8w8(w.qdata[e], w.scale[e])
        dense = A8W8(q, s, len(rows), torch.float32, True, split=1, shape=(N, K), w16=elem, r=1)
        want = dense(x[rows].contiguous(), None, bias[e].contiguous())
        assert torch.equal(y[rows].view(torch.int32), want.view(torch.int32)), f"expert {e}"


def test_w16_mma_envelope(monkeypatch, rng):
    """Where moe_triton sends MXFP8 experts to the W8A16 tensor-core kernels (the kernel's availability and x's
    alignment taken as given here): E4M3 / E5M2 on both GEMMs, up to mma_max_pairs pairs and
    W16_MMA_MAX_PER_EXPERT an expert, shapes in the kernels' tiles, no NaN / Inf code (a new version of the codes
    is checked again)."""
    from mxkit.kernels import moe
    from mxkit.kernels.matmul_details import _mma_a8w8
    from mxkit.kernels.moe_details import _decode

    monkeypatch.setattr(_mma_a8w8, "available", lambda device: None)
    monkeypatch.setattr(_mma_a8w8, "x_ok", lambda x, quant: True)
    E, H, I = 4, 128, 64
    x = torch.zeros(2, H, dtype=torch.bfloat16)
    w = {f: (mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), f),
             mxkit.quantize(torch.randn(E, H, I, generator=rng), f)) for f in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4")}
    cap = moe.mma_max_pairs(x.device)
    assert _decode._w16_mma_elem(*w["mxfp8_e4m3"], 8, 2.0, "swiglu_gpt_oss", x) == "e4m3"
    assert _decode._w16_mma_elem(*w["mxfp8_e5m2"], 8, 2.0, "swiglu", x) == "e5m2"
    assert _decode._w16_mma_elem(*w["mxfp8_e4m3"], cap, moe.W16_MMA_MAX_PER_EXPERT, "swiglu", x) == "e4m3"
    assert _decode._w16_mma_elem(*w["mxfp8_e4m3"], cap + 1, 1.0, "swiglu", x) is None
    assert _decode._w16_mma_elem(*w["mxfp8_e4m3"], 8, moe.W16_MMA_MAX_PER_EXPERT + 0.5, "swiglu", x) is None
    assert _decode._w16_mma_elem(*w["mxfp4"], 8, 2.0, "swiglu", x) is None
    assert _decode._w16_mma_elem(w["mxfp8_e4m3"][0], w["mxfp8_e5m2"][1], 8, 2.0, "swiglu", x) is None
    odd = mxkit.quantize(torch.randn(E, H, 96, generator=rng), "mxfp8_e4m3")  # (K = 96: not a multiple of 64)
    assert _decode._w16_mma_elem(mxkit.quantize(torch.randn(E, 192, H, generator=rng), "mxfp8_e4m3"), odd, 8, 2.0,
                             "swiglu", x) is None
    w1, w2 = w["mxfp8_e5m2"]
    w2.qdata[1, 3, 5] = 0xFE  # a NaN code
    assert _decode._w16_mma_elem(w1, w2, 8, 2.0, "swiglu", x) is None
    w2.qdata[1, 3, 5] = 0x3C
    assert _decode._w16_mma_elem(w1, w2, 8, 2.0, "swiglu", x) == "e5m2"


def test_grouped_w16_refuses_what_its_kernels_do_not_take():
    """grouped_w16's checks, before any launch (CPU tensors: the errors come first)."""
    from mxkit.kernels.matmul_details._mma_a8w8 import grouped_w16

    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    w, sw = torch.zeros(2, 64, 128, dtype=torch.uint8), torch.zeros(2, 64, 4, dtype=torch.uint8)
    ids, eids = torch.zeros(8, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out = torch.zeros(4, 32, dtype=torch.bfloat16)
    kw = dict(gather=True, bias=None, activation="swiglu", rw=None, out=out)
    with pytest.raises(ValueError, match="elem"):
        grouped_w16(x, w, sw, "e2m1", 64, 128, ids, eids, 4, 1, **kw)
    with pytest.raises(ValueError, match="activation"):
        grouped_w16(x, w, sw, "e4m3", 64, 128, ids, eids, 4, 1, **{**kw, "gather": False})
    with pytest.raises(ValueError, match="N % 32"):
        grouped_w16(x, w[:, :48], sw[:, :48], "e4m3", 48, 128, ids, eids, 4, 1, **kw)
    with pytest.raises(ValueError, match="K % 64"):
        grouped_w16(x[:, :96], w[..., :96], sw[..., :3], "e4m3", 64, 96, ids, eids, 4, 1, **kw)
    with pytest.raises(ValueError, match="contiguous"):
        grouped_w16(x, w.transpose(1, 2).contiguous().transpose(1, 2), sw, "e4m3", 64, 128, ids, eids, 4, 1, **kw)
    with pytest.raises(ValueError, match="bf16 x"):
        grouped_w16(x.float(), w, sw, "e4m3", 64, 128, ids, eids, 4, 1, **kw)


def test_moe_mma_strips_from_the_table():
    """moe.mma_strips of the dispatch table (an override's too); 1 where no entry says otherwise; a value that is
    not a strip count the kernels have is refused by the table's check (it ran as 1, silently)."""
    from mxkit.kernels.moe import mma_strips

    cpu = torch.device("cpu")
    assert mma_strips(cpu) == 1
    with gemm_table_override({"default": {"moe": {"mma_strips": 4}}}):
        assert mma_strips(cpu) == 4
    for bad in (0, 3):  # (no such kernels)
        with pytest.raises(ValueError, match=rf"'mma_strips': {bad} is not a strip count"):
            with gemm_table_override({"default": {"moe": {"mma_strips": bad}}}):
                pass
    with pytest.raises(ValueError, match="'mma_strips': expected an int"):  # (a string was 1, silently)
        with gemm_table_override({"default": {"moe": {"mma_strips": "2"}}}):
            pass


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I", [(16, 32, 256, 192), (61, 32, 512, 256), (64, 128, 2880, 2880)])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_moe_decode_mma_strips_give_the_same_bytes(T, E, H, I, act, rng, monkeypatch):
    """The sorted decode path with 2 and 4 strips a block sharing each x load (the table's moe.mma_strips): the
    bytes of 1 strip (the same warps split K), the special-scale variant and biases included, the kernels of
    that many strips launched; within the bound."""
    from mxkit.kernels.matmul_details import _mma_decode
    from mxkit.kernels.moe import moe_triton, pack_experts_mma

    case = layer_case(T, E, H, I, "mxfp4", rng, act=act)
    case[1].scale[0, 3, 1] = 0
    packed = (pack_experts_mma(case[1], interleave_halves=act == "swiglu"), pack_experts_mma(case[3]))
    names = []
    real = _mma_decode._kernel
    monkeypatch.setattr(_mma_decode, "_kernel", lambda name, idx: names.append(name) or real(name, idx))
    ys = []
    for sn in _mma_decode.GROUPED_STRIPS:
        names.clear()
        with gemm_table_override({"default": {"moe": {"mma_strips": sn, "mma_max_pairs": 256}}}):
            poison_allocator()
            ys.append(moe_triton(*case, activation=act, packed=packed))
        want = [f"_s{sn}" if sn > 1 else ""] * 2
        got = [n.removeprefix(f"mxfp4_mma_grouped_{a}").removesuffix("_special")
               for n, a in zip(names, (act, "down"))]
        assert got == want, (sn, names)
        assert torch.equal(ys[-1].view(torch.int16), ys[0].view(torch.int16)), sn
    check_layer(ys[0], case, act)


@pytest.mark.gpu
@gpu
def test_gpu_grouped_mma_strips_fall_back_to_one(rng):
    """grouped_mma on a weight of 25 strips (N = 400: no multiple of 2 or 4) runs 1 strip a block at any strips
    asked for: the same bytes; a valid MoE layer never has such an N (K % 64 == 0 makes N / 16 a multiple of 4)."""
    from mxkit.kernels.matmul_details import _mma_decode
    from mxkit.kernels.moe import align_device, pack_experts_mma

    E, N, K, T, k = 8, 400, 256, 12, 2
    w = experts(E, N, K, "mxfp4", rng)
    p = pack_experts_mma(w, interleave_halves=True)
    x = torch.randn(T, K, generator=rng).to(torch.bfloat16).cuda()
    tid = rand_ids(T, k, E, rng).cuda()
    ids, eids = align_device(tid, E, 8)
    hs = []
    for sn in _mma_decode.GROUPED_STRIPS:
        poison_allocator()
        h = torch.empty(T * k, N // 2, device="cuda", dtype=torch.bfloat16)
        hs.append(_mma_decode.grouped_mma(x, p.q, p.s, p.special, N, K, ids, eids, T * k, k, gather=True,
                                          bias=None, activation="swiglu", rw=None, out=h, strips=sn))
        assert torch.equal(hs[-1].view(torch.int16), hs[0].view(torch.int16)), sn
    y64, acc = pair_rows64(x, w, tid, 8, act="swiglu")  # (the bytes every strip count gave are right ones)
    assert_rows(hs[0], y64, acc)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,k", [(1, 4), (2, 4), (8, 1), (3, 2)])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("H,I", [(256, 128), (2880, 704)])
def test_gpu_moe_decode_pairs_without_sort(T, k, act, H, I, rng, monkeypatch):
    """Up to 8 (token, slot) pairs on all the experts with bf16 out, both GEMMs run one block per pair from the
    router's ids (int64 as torch.topk gives them, or int32), with no sort and no combine kernel (the down GEMM
    sums the slots): the bytes of the sorted blocks and the combine kernel (which a slice holding every expert
    takes, float32 out, rounded once to bf16 here); a pair routed to an expert id outside the layer contributes
    0 (the sorted path with that pair's weight 0); fresh inputs in a CUDA graph replay; the allocator's free
    memory poisoned before the calls. H, I: at most 1 tile of 64 a warp, and a warp's 11-12 tiles of the gate_up
    GEMM at H = 2880 (the ring loop's steady state and its refilled tail; the down GEMM 2-3 at I = 704)."""
    from mxkit.kernels import moe as kmoe
    from mxkit.kernels.moe_details import _decode, _rows

    E = 32
    case = layer_case(T, E, H, I, "mxfp4", rng, k=k, act=act)
    x, w1, b1, w2, b2, tw, ids = case
    w1.scale[3, 1, 0] = 0  # the special-scale variant of the gate_up kernel
    packed = (kmoe.pack_experts_mma(w1, interleave_halves=act == "swiglu"), kmoe.pack_experts_mma(w2))
    calls = _count_grouped_mma(monkeypatch)
    sorts, combines = _count(monkeypatch, _decode, "align_device", lambda kw: 1), []
    real_combine = _rows._COMBINE
    monkeypatch.setattr(_rows, "_COMBINE", lambda *a, **kw: combines.append(1) or real_combine(*a, **kw))

    def sorted_path(ids_, tw_):  # every expert held as a slice: the sorted blocks, float32 partials, the combine
        return kmoe.moe_triton(x, w1, b1, w2, b2, tw_, ids_, activation=act, packed=packed, out_dtype=torch.float32,
                               expert_range=(0, E), num_experts=E)

    for dtype in (torch.int64, torch.int32):
        i = ids.to(dtype)
        poison_allocator()
        y = kmoe.moe_triton(x, w1, b1, w2, b2, tw, i, activation=act, packed=packed)
        assert calls == [("pairs", act), ("pairs", None)] and not sorts and not combines
        calls.clear()
        want = sorted_path(i, tw)
        assert calls == [act, None] and sorts and combines
        calls.clear(), sorts.clear(), combines.clear()
        assert y.dtype == torch.bfloat16 and torch.equal(y.view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
        check_layer(y, case, act)
    bad, tw0 = ids.clone(), tw.clone()
    bad[T - 1, k - 1], tw0[T - 1, k - 1] = E, 0.0  # an id outside the layer: its pair contributes 0
    y = kmoe.moe_triton(x, w1, b1, w2, b2, tw, bad, activation=act, packed=packed)
    want = sorted_path(torch.where(bad >= E, 0, bad), tw0)
    assert torch.equal(y.view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
    xs, idss, tws = x.clone(), ids.clone(), tw.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kmoe.moe_triton(xs, w1, b1, w2, b2, tws, idss, activation=act, packed=packed)
    for _ in range(2):
        xs.copy_(torch.randn(T, H, generator=rng).to(torch.bfloat16))
        idss.copy_(rand_ids(T, k, E, rng))
        poison_allocator()
        g.replay()
        torch.cuda.synchronize()
        want = kmoe.moe_triton(xs, w1, b1, w2, b2, tws, idss, activation=act, packed=packed)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T", [5, 40])
def test_gpu_moe_id_outside_the_layer_contributes_zero(T, rng):
    """A (token, slot) pair whose expert id is outside the layer (a router bug; the reference raises, the GPU
    paths cannot without a host sync) contributes 0 on the sorted decode path and the Triton grouped path alike,
    instead of the unwritten row it used to sum: the result of the same pair with a valid id and weight 0."""
    from mxkit.kernels import moe as kmoe

    E, H, I, k = 32, 256, 128, 4
    x, w1, b1, w2, b2, tw, ids = layer_case(T, E, H, I, "mxfp4", rng, k=k)
    packed = (kmoe.pack_experts_mma(w1), kmoe.pack_experts_mma(w2))
    bad, tw0 = ids.clone(), tw.clone()
    bad[1, 2], tw0[1, 2] = E + 5, 0.0
    for pk in (packed, None):
        poison_allocator()
        y = kmoe.moe_triton(x, w1, b1, w2, b2, tw, bad, packed=pk)
        want = kmoe.moe_triton(x, w1, b1, w2, b2, tw0, torch.where(bad >= E, 0, bad), packed=pk)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), pk is None


def _slices_and_graph(rng, T, pack, calls, E=32, H=256, I=128, k=4):
    """A packed path on slices of the experts (their float32 partials sum to the layer within its bound; both
    GEMMs of each slice counted in ``calls``) and a CUDA graph replay equal to eager; ``pack(w, gate_up)``: the
    packed experts of w. Returns (w1, w2, packed)."""
    w1, w2 = experts(E, 2 * I, H, "mxfp4", rng), experts(E, H, I, "mxfp4", rng)
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
    ids = rand_ids(T, k, E, rng).cuda()
    tw = torch.rand(T, k, generator=rng).cuda()
    parts = 0
    for lo, hi in ((0, 12), (12, 13), (13, 32)):  # (each slice with its experts' biases, by local expert id)
        s1, s2 = select_experts(w1, lo, hi), select_experts(w2, lo, hi)
        parts = parts + moe_triton(x, s1, b1[lo:hi], s2, b2[lo:hi], tw, ids, out_dtype=torch.float32,
                                   expert_range=(lo, hi), num_experts=E, packed=(pack(s1, True), pack(s2, False)))
    assert len(calls) == 6
    y64 = moe_reference(x, w1, b1, w2, b2, tw, ids, out_dtype=torch.float64, intermediate_dtype=torch.bfloat16)
    assert_rows(parts, y64, act_flips(y64, x, w1, b1, w2, b2, tw, ids), factor=1.5)
    packed = (pack(w1, True), pack(w2, False))
    whole = moe_triton(x, w1, b1, w2, b2, tw, ids, out_dtype=torch.float32, packed=packed)
    assert_sums_agree(parts, whole)  # (the slices' float32 sum: the whole layer's up to summation order)
    calls.clear()
    # a CUDA graph replays with new tokens, routing weights and expert ids (routing read at capture would pass a
    # replay on the captured inputs), its output poisoned before each replay
    assert_graph_replays(lambda x_, tw_, ids_: moe_triton(x_, w1, None, w2, None, tw_, ids_, packed=packed),
                         [x.clone(), tw.clone(), ids.clone()],
                         lambda: [torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda(),
                                  torch.rand(T, k, generator=rng).cuda(), rand_ids(T, k, E, rng).cuda()])
    return w1, w2, packed


@pytest.mark.gpu
@gpu
def test_gpu_moe_decode_mma_expert_range_and_graph(rng, monkeypatch, packaged_default):
    """The packed decode path on a slice of the experts and in a CUDA graph (_slices_and_graph); beyond 64
    tokens the Triton kernels (not counted). Under the packaged default entry: its 256 pairs, not a GPU's tuned
    envelope, is the edge the 65 tokens pass."""
    from mxkit.kernels.moe import pack_experts_mma

    calls = _count_grouped_mma(monkeypatch)
    w1, w2, packed = _slices_and_graph(rng, 16, lambda w, gate_up: pack_experts_mma(w), calls)
    calls.clear()
    xl = torch.randn(65, w1.shape[2], generator=rng).to(torch.bfloat16).cuda()
    moe_triton(xl, w1, None, w2, None, torch.rand(65, 4, generator=rng).cuda(),
               rand_ids(65, 4, w1.shape[0], rng).cuda(), packed=packed)
    assert not calls  # 260 pairs > MMA_MAX_PAIRS: the Triton kernels


@pytest.mark.gpu
@gpu
def test_gpu_moe_decode_mma_up_to_the_per_expert_envelope(rng, monkeypatch):
    """With ``moe.mma_max_pairs_per_expert`` (the H200's table: 8), a layer of 128 experts runs 800 (token, slot)
    pairs on the decode kernels (counted), within the layer's bound of the float64 reference; 260 pairs on 16
    experts (past both parts of the envelope) do not."""
    from mxkit.kernels.matmul import gemm_table_override
    from mxkit.kernels.moe import pack_experts_mma

    name = torch.cuda.get_device_name()
    calls = _count_grouped_mma(monkeypatch)
    with gemm_table_override({name: {"moe": {"mma_max_pairs": 256, "mma_max_pairs_per_expert": 8}}}):
        for T, E, decode in ((200, 128, True), (65, 16, False)):
            case = layer_case(T, E, 256, 128, "mxfp4", rng)
            packed = (pack_experts_mma(case[1]), pack_experts_mma(case[3]))
            calls.clear()
            y = moe_triton(*case, packed=packed)
            assert bool(calls) == decode, (T, E, calls)
            check_layer(y, case, "swiglu_gpt_oss")


# ---------------------------------------------------------------------------------------------------------
# the prefill path: both expert GEMMs on the grouped W4A16 wgmma kernel (Hopper; packed experts)


def _wgmma_here():
    if not HAS_CUDA:
        return "needs CUDA"
    from mxkit.kernels.matmul_details._w4a16_wgmma import available

    return available(torch.device("cuda"))


def _count_wgmma(monkeypatch):
    from mxkit.kernels.matmul_details import _w4a16_wgmma

    return _count(monkeypatch, _w4a16_wgmma, "w4a16_wgmma", lambda kw: (kw.get("activation"), kw.get("bm")))


@pytest.mark.parametrize("act", [None, "swiglu_gpt_oss", "swiglu"])
def test_pack_wgmma_experts_row_order(act, rng):
    """pack_wgmma_experts = pack_wgmma of the experts' rows in expert_row_order: in each 16 packed rows, 8 gate
    rows then the 8 up rows of the same output columns (GPT-OSS's interleaved rows, or [gate; up] halves); MXFP8
    experts in the FP8 layout likewise, None for those with a NaN / Inf code and for MXINT8."""
    from mxkit.kernels.matmul_details._layout_wgmma import (expert_row_order, pack_wgmma_experts, unpack_wgmma,
                                                            unpack_wgmma8)
    from mxkit.kernels.moe import pack_experts_wgmma

    E, N, K = 3, 48, 96
    qd = torch.randint(0, 256, (E, N, K // 2), generator=rng, dtype=torch.uint8)
    sc = torch.randint(100, 140, (E, N, K // 32), generator=rng, dtype=torch.uint8)
    q, st, one_mul = pack_wgmma_experts(qd, sc, act)
    assert one_mul == bool(sc.max() <= 128)
    order = expert_row_order(N, act)
    got_q, got_s = unpack_wgmma(q, st, K)
    assert torch.equal(got_q.view(E, N, -1), qd[:, order]) and torch.equal(got_s.view(E, N, -1), sc[:, order])
    p = torch.arange(N)
    col, up = 8 * (p // 16) + p % 8, p // 8 % 2
    if act == "swiglu_gpt_oss":
        assert torch.equal(order, 2 * col + up)
    elif act == "swiglu":
        assert torch.equal(order, col + up * (N // 2))
    else:
        assert torch.equal(order, p)
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):  # MXFP8 experts: the FP8 layout of the same reordered rows
        w = mxkit.quantize(torch.randn(E, N, K, generator=rng), fmt)
        p = pack_experts_wgmma(w, act_pairs=act)
        assert p.elem == fmt[-4:] and p.act_pairs == act and p.shape == (E, N, K)
        got_q, got_s = unpack_wgmma8(p.q, p.st, K)
        assert torch.equal(got_q.view(E, N, K), w.qdata[:, order]) and torch.equal(got_s.view(E, N, -1),
                                                                                   w.scale[:, order])
        w.qdata[1, 2, 3] = 0x7F if fmt == "mxfp8_e4m3" else 0x7C  # a NaN / Inf code: not this kernel's
        assert pack_experts_wgmma(w) is None
    assert pack_experts_wgmma(mxkit.quantize(torch.randn(E, N, K, generator=rng), "mxint8")) is None
    with pytest.raises(ValueError, match="N % 16"):
        expert_row_order(40, "swiglu")


def _check_blocks(y, x, w, bias, blocks, bm, act, nan_expert):
    """The grouped kernel's output y: block b of bm sorted rows of x times expert blocks[b] (bias, activation)
    within the bound of the float64 product; blocks of expert -1 untouched (still the NaN poison); the output
    column fed by ``nan_expert``'s NaN scale byte NaN in its blocks, no other."""
    K = x.shape[1]
    w64 = dequantize_reference(w, torch.float64)
    for b, e in enumerate(blocks.tolist()):
        rows = slice(b * bm, (b + 1) * bm)
        if e < 0:
            assert torch.isnan(y[rows].float()).all()
            continue
        a64 = x[rows].to(torch.float64)
        h64 = a64 @ w64[e].T + bias[e].to(torch.float64)
        y64 = ACT[act](h64)
        acc = act_slack(h64, accumulation_bound(h64, ((a64 * a64) @ (w64[e] * w64[e]).T).sqrt(), K), act)
        nan = torch.isnan(y64).any(0)
        assert nan.sum() == (e == nan_expert)
        assert torch.isnan(y[rows][:, nan].float()).all()
        assert_rows(y[rows][:, ~nan], y64[:, ~nan], acc[:, ~nan])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("bm", [64, 128, 256])
@pytest.mark.parametrize("act", [None, "swiglu_gpt_oss", "swiglu"])
def test_gpu_grouped_wgmma_kernel(bm, act, rng):
    """The grouped wgmma kernel alone, into a NaN-poisoned output: each block of sorted rows times its expert's
    weight (bias, activation) within the bound of the float64 product; blocks of expert -1 untouched; K = 2880
    (padded to 2944), an expert's N rows not a multiple of the 128-row tile (tiles read the next expert's rows,
    masked), a scale byte 0 and a NaN scale byte (255): that row's outputs NaN."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.matmul_details._layout_wgmma import expert_row_order, pack_wgmma_experts
    from mxkit.kernels.matmul_details._w4a16_wgmma import w4a16_wgmma

    E, N, K = 5, 208, 2880
    w = experts(E, N, K, "mxfp4", rng)
    w.scale[1, 5, 3] = 0
    w.scale[2, 17, 7] = 255
    blocks = torch.tensor([0, 0, 3, -1, 1, 4, 2, -1, 3], dtype=torch.int32)
    R = blocks.numel() * bm
    x = torch.randn(R, K, generator=rng).to(torch.bfloat16).cuda()
    bias = torch.randn(E, N, generator=rng).cuda()
    order = expert_row_order(N, act, "cuda")
    q, st, one_mul = pack_wgmma_experts(w.qdata, w.scale, act)
    n_out = N // 2 if act else N
    y = torch.full((R, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
    w4a16_wgmma(x, q, st, N, one_mul, bias=bias[:, order].reshape(-1).contiguous(), y=y,
                expert_ids=blocks.cuda(), bm=bm, activation=act)
    _check_blocks(y, x, w, bias, blocks, bm, act, nan_expert=2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("bm", [32, 64, 256])
@pytest.mark.parametrize("act", [None, "swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("base", [120, 135])
def test_gpu_grouped_wgmma_kernel_mma_layout(bm, act, base, rng):
    """The grouped wgmma kernel on experts in the decode kernel's layout (pack_experts_mma: one copy for decode
    and prefill), x in that layout's K order, into a NaN-poisoned output: within the bound of the float64
    product; h written in the K order (perm_out) is the same values permuted; blocks of expert -1 untouched;
    both decodes (every scale byte <= 128: one multiply; above: two), a scale byte 0 and a NaN scale byte."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.matmul_details._layout_mma import mma_k_order
    from mxkit.kernels.matmul_details._w4a16_wgmma import w4a16_wgmma
    from mxkit.kernels.moe import pack_experts_mma
    from mxkit.kernels.moe_details._rows import _interleave_halves

    # N: 2.5 tiles of 128 rows; with an activation 3 tiles, so that its h (N / 2 = 192 columns) takes perm_out, as
    # the gate_up GEMM does in the layer (a half tile's 160 columns have no K order of 64)
    E, N, K = 5, (384 if act else 320), 2880
    w = experts(E, N, K, "mxfp4", rng)
    w.scale.copy_(torch.randint(base - 8, base + 8, w.scale.shape, generator=rng, dtype=torch.uint8).cuda())
    w.scale[1, 5, 3] = 0
    if base > 128:  # (a NaN byte is above 128: it selects the two-multiply decode)
        w.scale[2, 17, 7] = 255
    p = pack_experts_mma(w, interleave_halves=act == "swiglu")
    assert p.one_mul == (base < 128) and p.special
    blocks = torch.tensor([0, 0, 3, -1, 1, 4, 2, -1, 3], dtype=torch.int32)
    R = blocks.numel() * bm
    x = torch.randn(R, K, generator=rng).to(torch.bfloat16).cuda()
    bias = torch.randn(E, N, generator=rng).cuda()
    kb = _interleave_halves(bias, 1) if act == "swiglu" else bias
    n_out = N // 2 if act else N
    y = torch.full((R, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
    xk = x[:, mma_k_order(K, "cuda")].contiguous()
    w4a16_wgmma(xk, p.q, p.s, N, p.one_mul, bias=kb.reshape(-1).contiguous(), y=y, expert_ids=blocks.cuda(), bm=bm,
                activation=act, layout="mma")
    if n_out % 64 == 0:
        yp = torch.full_like(y, float("nan"))
        w4a16_wgmma(xk, p.q, p.s, N, p.one_mul, bias=kb.reshape(-1).contiguous(), y=yp, expert_ids=blocks.cuda(),
                    bm=bm, activation=act, layout="mma", perm_out=True)
        used = (blocks >= 0).repeat_interleave(bm).cuda()
        assert torch.equal(yp[used].view(torch.int16), y[used][:, mma_k_order(n_out, "cuda")].view(torch.int16))
    _check_blocks(y, x, w, bias, blocks, bm, act, nan_expert=2 if base > 128 else None)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I", [(65, 32, 512, 256), (727, 32, 2880, 2880), (727, 128, 256, 192),
                                     (300, 128, 2880, 2880), (3200, 32, 256, 192)])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("layout", ["mma", "wgmma"])
def test_gpu_moe_prefill_wgmma(T, E, H, I, act, layout, rng, monkeypatch, packaged_default):
    """Experts packed for the decode path (pack_experts_mma, what MXMoE keeps: one copy) or for the prefill
    kernel's own layout (pack_experts_wgmma): above MMA_MAX_PAIRS pairs both GEMMs run on the grouped wgmma
    kernel (counted), within the layer's bound of the float64 reference; an expert that receives every token,
    one that receives none, biases, top-4, a scale byte 0 and a NaN scale byte. Under the packaged default
    entry (256 pairs: a GPU's per-expert envelope, 8 x 32 = 256 on the H100 / H200, would leave 260 pairs on
    decode once a tune raised it)."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.moe import pack_experts_mma, pack_experts_wgmma, wgmma_block_m
    from mxkit.kernels.moe_details._prefill import block_plan

    case = layer_case(T, E, H, I, "mxfp4", rng, act=act)
    case[1].scale[0, 3, 1] = 0
    case[1].scale[5, 1, 0] = 255  # a NaN in an up (GPT-OSS) / gate row: NaN through the clamps of its tokens' rows
    if layout == "mma":
        packed = (pack_experts_mma(case[1], interleave_halves=act == "swiglu"), pack_experts_mma(case[3]))
    else:
        packed = (pack_experts_wgmma(case[1], act_pairs=act), pack_experts_wgmma(case[3]))
    calls = _count_wgmma(monkeypatch)
    y = moe_triton(*case, activation=act, packed=packed)
    bm = wgmma_block_m(T * 4 / E)
    sizes = list(block_plan(T * 4 / E)[0])  # mixed_blocks' launches above 128 pairs an expert
    assert sizes == ([256, 128, 64] if T * 4 / E > 128 else [bm])
    assert calls == [(act, b) for b in sizes] + [(None, b) for b in sizes]
    check_layer(y, case, act)
    if len(sizes) > 1:  # the same layer with every group padded to one block size (MXKIT_MOE_MIXED=0)
        monkeypatch.setenv("MXKIT_MOE_MIXED", "0")
        calls.clear()
        y1 = _poisoned(lambda: moe_triton(*case, activation=act, packed=packed))
        assert calls == [(act, bm), (None, bm)]
        check_layer(y1, case, act)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I,fmt,layout", [  # (the decode-mma layout holds MXFP4 experts only: no MXFP8 case)
    (T, E, H, I, fmt, layout)
    for T, E, H, I, fmt in ((727, 32, 2880, 2880, "mxfp4"), (3200, 32, 256, 192, "mxfp4"),
                            (4096, 32, 2880, 704, "mxfp4"), (727, 32, 2880, 2880, "mxfp8_e4m3"))
    for layout in ("mma", "wgmma") if fmt == "mxfp4" or layout == "wgmma"])
def test_gpu_moe_prefill_wgmma_persistent_same_bytes(T, E, H, I, fmt, layout, rng, monkeypatch):
    """The wgmma kernel's persistent schedule (one program an SM walking the tiles, the TMA producer running into
    the next tile during the epilogue; the default for launches of one block size, MXKIT_WGMMA_PERSIST=1 forces
    it) gives the layer's bytes of one program a tile (MXKIT_WGMMA_PERSIST=0): blocks of 128 rows and mixed
    256 / 128 / 64 (the 64-row launches keep the single-partition loop), several tiles a program (4096 tokens:
    ~20 a program), unused blocks skipped, K of odd (45) and even (11) step counts, both layouts, MXFP8 experts;
    and the layer within its bound."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.moe import pack_experts_mma, pack_experts_wgmma

    case = layer_case(T, E, H, I, fmt, rng)
    if layout == "mma":
        packed = (pack_experts_mma(case[1]), pack_experts_mma(case[3]))
    else:
        packed = (pack_experts_wgmma(case[1], act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(case[3]))
    outs = []
    for persist in ("1", "0"):
        monkeypatch.setenv("MXKIT_WGMMA_PERSIST", persist)
        outs.append(_poisoned(lambda: moe_triton(*case, packed=packed)))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    check_layer(outs[0], case, "swiglu_gpt_oss")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("layout", ["mma", "wgmma"])
def test_gpu_moe_prefill_prepared_launches_same_bytes(layout, rng):
    """The grouped wgmma launches through their prepared launch (one cuLaunchKernel per launch from a problem's
    second call, x's TMA descriptor encoded from x alone) give the bytes of Triton's own launcher
    (launch.triton_launch_only) call after call, with new tokens each call and two token counts taking turns (one
    block size, and mixed 256 / 128 / 64); the prepared launches are made."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels import launch
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg
    from mxkit.kernels.moe import pack_experts_mma, pack_experts_wgmma

    E, H, I = 16, 512, 256
    cases = [layer_case(T, E, H, I, "mxfp4", rng) for T in (400, 2200)]  # 100 / 550 pairs an expert
    w1, w2 = cases[0][1], cases[0][3]
    if layout == "mma":
        packed = (pack_experts_mma(w1), pack_experts_mma(w2))
    else:
        packed = (pack_experts_wgmma(w1, act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(w2))
    wg._PREPARED.clear()
    for i in range(4):
        for case in cases:  # (new tokens and routing each call)
            T = case[0].shape[0]
            x = torch.randn(case[0].shape, generator=rng).to(torch.bfloat16).cuda()
            ids = rand_ids(T, 4, E, rng).cuda()
            tw = torch.softmax(torch.randn(T, 4, generator=rng), -1).cuda()
            args = (x, w1, case[2], w2, case[4], tw, ids)
            with launch.triton_launch_only():
                want = moe_triton(*args, packed=packed)
            poison_allocator()
            got = moe_triton(*args, packed=packed)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (i, T)
    assert sum(1 for p in wg._PREPARED.values() if p.fast) >= 8  # (2 GEMMs x (1 + 3 block sizes))
    check_layer(got, args, "swiglu_gpt_oss")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I", [(3200, 32, 2880, 704), (2000, 16, 256, 192), (1024, 32, 512, 256)])
@pytest.mark.parametrize("layout", ["mma", "wgmma"])
def test_gpu_moe_prefill_block_plans_same_bytes(T, E, H, I, layout, rng, monkeypatch):
    """The prefill GEMMs' block plans (block_plan) give the same bytes: one block size (MXKIT_MOE_MIXED=0), mixed
    256 / 128 / 64 with the groups padded to 64 rows (1) or to fit one block past their 256-row ones (fit), and
    both down to 32 rows (MXKIT_MOE_MIXED_SIZES=32), each with the persistent schedule off, on, and on for
    128-row launches alone; at 400 and 500 pairs an expert, and at 128 (mixed from 48: MXKIT_MOE_MIXED_FROM);
    the launches counted; the layer within its bound."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.moe import pack_experts_mma, pack_experts_wgmma, wgmma_block_m

    bm = wgmma_block_m(T * 4 / E)
    assert bm == (256 if T * 4 / E > 384 else 128)
    monkeypatch.setenv("MXKIT_MOE_MIXED_FROM", "48")
    case = layer_case(T, E, H, I, "mxfp4", rng)
    if layout == "mma":
        packed = (pack_experts_mma(case[1]), pack_experts_mma(case[3]))
    else:
        packed = (pack_experts_wgmma(case[1], act_pairs="swiglu_gpt_oss"), pack_experts_wgmma(case[3]))
    calls = _count_wgmma(monkeypatch)
    outs = {}
    for mixed, smallest, sizes in (("0", "64", [bm]), ("1", "64", [256, 128, 64]), ("1", "32", [256, 128, 64, 32]),
                                   ("fit", "64", [256, 128, 64]), ("fit", "32", [256, 128, 64, 32])):
        monkeypatch.setenv("MXKIT_MOE_MIXED", mixed)
        monkeypatch.setenv("MXKIT_MOE_MIXED_SIZES", smallest)
        for persist in ("0", "1", "128"):
            monkeypatch.setenv("MXKIT_WGMMA_PERSIST", persist)
            calls.clear()
            outs[mixed, smallest, persist] = _poisoned(lambda: moe_triton(*case, packed=packed))
            assert [b for _, b in calls] == sizes * 2
    first = outs["0", "64", "0"]
    for key, y in outs.items():
        assert torch.equal(y.view(torch.int16), first.view(torch.int16)), key
    check_layer(first, case, "swiglu_gpt_oss")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T,E,H,I", [(727, 32, 2880, 2880), (300, 128, 256, 192)])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("act", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_moe_prefill_wgmma_mxfp8(T, E, H, I, fmt, act, rng, monkeypatch):
    """MXFP8 experts (W8A16) in the prefill kernel's layout: above MMA_MAX_PAIRS both GEMMs run on the grouped
    wgmma kernel's FP8 decode (counted), within the layer's bound of the float64 reference (an expert that
    receives every token, one that receives none, biases, a NaN scale byte); an MXMoE of such experts takes the
    same path on a prefill call and the grouped Triton kernel on a decode call."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.moe import pack_experts_wgmma
    from mxkit.moe_reference import route
    from mxkit.nn import MXMoE

    case = layer_case(T, E, H, I, fmt, rng, act=act)
    case[1].scale[5, 1, 0] = 255
    packed = (pack_experts_wgmma(case[1], act_pairs=act), pack_experts_wgmma(case[3]))
    assert packed[0].elem == packed[1].elem == fmt[-4:]
    calls = _count_wgmma(monkeypatch)
    y = moe_triton(*case, activation=act, packed=packed)
    assert [c[0] for c in calls] == [act] * (len(calls) // 2) + [None] * (len(calls) // 2) and calls
    check_layer(y, case, act)
    if E != 32:
        return
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [torch.randn(E, 2 * I, H, generator=rng) / 8, torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, H, I, generator=rng) / 8, torch.randn(E, H, generator=rng)]
    m = MXMoE.from_dense(router, *(t.to(torch.bfloat16).cuda() for t in dense), 4, fmt, activation=act)
    for n_tok, n_calls in ((200, 2), (2, 0)):
        xm = torch.randn(n_tok, H, generator=rng).to(torch.bfloat16).cuda()
        calls.clear()
        with torch.no_grad():
            ym = m(xm)
            tw_m, ids_m = route(m.router(xm), 4)
        assert len(calls) == n_calls, (n_tok, calls)
        cm = (xm, m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias, tw_m, ids_m)
        check_layer(ym, cm, act)


def _mixed_cases(g, count=40, pad=64):
    """(rows, ends int32 [E], n) of random groups: experts without tokens, groups of up to 768 rows, padded to
    ``pad``."""
    for _ in range(count):
        E = int(torch.randint(1, 40, (1,), generator=g))
        rows = torch.randint(0, 768, (E,), generator=g)
        rows[torch.rand(E, generator=g) < 0.2] = 0
        yield rows, torch.cumsum((rows + pad - 1) // pad * pad, 0).to(torch.int32), int(rows.sum())


def _check_mixed_kernel(device: str, g) -> int:
    """The tables kernel (mixed_blocks_device) equals its PyTorch twin (mixed_blocks), word for word, for the
    default sizes (256 / 128 / 64) and those down to 32 rows."""
    from mxkit.kernels.moe import MIXED_SIZES, mixed_blocks, mixed_blocks_device, mixed_sizes

    n = 0
    for sizes in (MIXED_SIZES, mixed_sizes(32)):
        for _, ends, pairs in _mixed_cases(g, 20, sizes[-1]):
            want = mixed_blocks(ends, pairs, sizes)
            got = mixed_blocks_device(ends.to(device), pairs, sizes)
            assert [b for b, _ in got] == [b for b, _ in want] == list(sizes)
            for (_, a), (_, b) in zip(got, want):
                assert a.is_contiguous() and torch.equal(a.cpu(), b), (ends, a, b)
            n += 1
    return n


def _check_mixed_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.moe_details import _align

    g = interpreted_rng(_align._mixed_blocks_kernel)
    print(f"interpreter checks passed: {_check_mixed_kernel('cpu', g)}")


def test_mixed_blocks_kernel_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_mixed_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_mixed_blocks_kernel(rng):
    assert _check_mixed_kernel("cuda", rng)


@pytest.mark.parametrize("smallest", [64, 32])
def test_mixed_blocks_cover_each_group_once(smallest, rng):
    """mixed_blocks: every smallest-size block of every expert's group (padded to that size) is covered by
    exactly one block, each block lies inside its expert's group, and no expert has more than one block of each
    smaller size."""
    from mxkit.kernels.moe import MIXED_SIZES, mixed_blocks, mixed_sizes

    sizes = mixed_sizes(smallest)
    assert sizes == ((256, 128, 64) if smallest == 64 else (256, 128, 64, 32))
    assert mixed_sizes(64) == MIXED_SIZES
    for rows, ends, n in _mixed_cases(rng, pad=smallest):
        E = rows.numel()
        padded = (rows + smallest - 1) // smallest * smallest
        owner = torch.repeat_interleave(torch.arange(E), padded // smallest)  # the expert of each smallest block
        seen = torch.zeros(owner.numel(), dtype=torch.int64)
        for bm, tab in mixed_blocks(ends, n, sizes):
            assert tab.dtype == torch.int32 and tab.shape[0] == 2
            if bm < 256:
                assert tab.shape[1] == E
            for e, start in tab.t().tolist():
                if e < 0:
                    continue
                assert start % smallest == 0
                blocks = range(start // smallest, start // smallest + bm // smallest)
                assert all(owner[b] == e for b in blocks), (bm, e, start)
                for b in blocks:
                    seen[b] += 1
        assert torch.equal(seen, torch.ones_like(seen)), rows


def test_mixed_sizes_rejects():
    """mixed_sizes, mixed_blocks and padded_rows reject sizes their tables and padding do not hold."""
    from mxkit.kernels.moe import mixed_blocks, mixed_blocks_device, mixed_sizes
    from mxkit.kernels.moe_details._sort import padded_rows

    for bad in (16, 48, 256):
        with pytest.raises(ValueError, match="smallest mixed block"):
            mixed_sizes(bad)
    ends = torch.tensor([64, 128], dtype=torch.int32)
    for sizes in ((256, 64), (128, 64), (256, 128, 64, 16)):
        for f in (mixed_blocks, mixed_blocks_device):
            with pytest.raises(ValueError, match="mixed block sizes"):
                f(ends, 100, sizes)
    for bm, wide in ((64, 192), (48, 256), (1, 256)):
        with pytest.raises(ValueError, match="power of two"):
            padded_rows(torch.arange(5), bm, wide)


@pytest.mark.gpu
@gpu
def test_gpu_moe_prefill_wgmma_expert_range_graph_and_mxmoe(rng, monkeypatch, packaged_default):
    """The prefill path on slices of the experts (float32 partials sum to the layer within its bound), a CUDA
    graph replay equal to eager, and MXMoE taking it above 64 tokens (and the decode path at 16); under the
    packaged default entry's 256 pairs."""
    if _wgmma_here():
        pytest.skip(_wgmma_here())
    from mxkit.kernels.moe import pack_experts_wgmma
    from mxkit.moe_reference import route
    from mxkit.nn import MXMoE

    calls = _count_wgmma(monkeypatch)
    _slices_and_graph(rng, 200, lambda w, gate_up: pack_experts_wgmma(w, act_pairs="swiglu_gpt_oss" if gate_up
                                                                      else None), calls)
    E, H, I, k = 32, 256, 128, 4
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [torch.randn(E, 2 * I, H, generator=rng), torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng)]
    m = MXMoE.from_dense(router, *(t.to(torch.bfloat16).cuda() for t in dense), k, "mxfp4")
    keep = MXMoE.from_dense(router, *(t.to(torch.bfloat16).cuda() for t in dense), k, "mxfp4", keep_source=True)
    xs = [torch.randn(n_tok, H, generator=rng).to(torch.bfloat16).cuda() for n_tok in (100, 16)]
    with torch.no_grad():
        y_keep = [keep(xm) for xm in xs]  # (also warms the kernels' caches before m's memory is measured)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for xm, yk, (n_tok, n_calls) in zip(xs, y_keep, ((100, 2), (16, 0))):
        calls.clear()
        with torch.no_grad():
            y = m(xm)
            tw_m, ids_m = route(m.router(xm), k)
        assert len(calls) == n_calls and torch.equal(yk, y)  # keep: the checkpoint buffers plus a packed copy
        ref = moe_reference(xm, m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias, tw_m, ids_m,
                            out_dtype=torch.float64, intermediate_dtype=torch.bfloat16)
        assert_rows(y, ref, act_flips(ref, xm, m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias, tw_m, ids_m),
                    factor=1.5)
    # one copy: the first forward re-laid m's buffers in place (a second copy would add expert_nbytes)
    assert m.expert_layout == "mma" and keep.expert_layout == "checkpoint" and keep._packed is not None
    del xm, y, ref
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < m.expert_nbytes // 4
    with torch.no_grad():  # a module packed on the CPU, then moved: its packed buffers move, the same result
        moved = copy.deepcopy(keep).cpu()
        assert moved.pack_()
        moved = moved.cuda()
        assert moved.expert_layout == "mma" and torch.equal(moved(xs[1]), y_keep[1])
    m.backend = keep.backend = "reference"  # no packed path: m's experts unpacked on the fly, the same result
    with torch.no_grad():
        assert torch.equal(m(xs[1]), keep(xs[1]))
