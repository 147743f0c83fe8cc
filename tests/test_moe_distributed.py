"""Expert parallelism on CPU: gloo process groups of 2 and 4 ranks, each holding a contiguous range of experts and
its own tokens, against one process holding every expert (mxkit.moe_reference on the whole weights).

Ranks are forked (``torch.multiprocessing.start_processes(start_method="fork")``) from the test process: a
spawned rank re-imports torch and mxkit (7 s for 4 ranks on the 2-core CI box, 0.1 s forked); each child first
drops to one OpenMP thread, as DataLoader workers do after a fork. The process group rendezvous through a
FileStore in ``tmp_path`` (no ports), the collectives time out after 30 s and the test kills its ranks after
60 s, so a hang fails the test instead of the run. Every rank draws the same global problem from the seed,
then takes its share of tokens and experts.
"""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import mxkit
from conftest import run_forked_ranks
from mxkit.distributed import check_expert_ranges, ep_moe, expert_ranges
from mxkit.moe_reference import moe_reference, route, select_experts
from mxkit.nn import MXMoE

H, I = 64, 32  # noqa: E741
TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in float32 ulps between two float32 tensors of one sign pattern (0 when equal)."""
    if a.numel() == 0:
        return 0
    ia, ib = a.view(torch.int32).to(torch.int64), b.view(torch.int32).to(torch.int64)
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # sign-magnitude to a monotone integer line
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int((ia - ib).abs().max())


def problem(seed: int, E: int, fmt: str, bias: bool, T: int = 67):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    logits = torch.randn(T, E, generator=g)
    w_gu = mxkit.quantize(torch.randn(E, 2 * I, H, generator=g) * 0.4, fmt, axis=-1)
    w_d = mxkit.quantize(torch.randn(E, H, I, generator=g) * 0.4, fmt, axis=-1)
    b_gu = torch.randn(E, 2 * I, generator=g) if bias else None
    b_d = torch.randn(E, H, generator=g) if bias else None
    return x, logits, w_gu, b_gu, w_d, b_d


def my_share(t: torch.Tensor, splits, rank):
    start = sum(splits[:rank])
    return t[start : start + splits[rank]]


def check_case(rank, world, seed, *, E, ranges, splits, fmt="mxfp4", bias=True, routing="gpt_oss",
               activation="swiglu_gpt_oss", hot=None, combine_dtype=torch.float64):
    x, logits, w_gu, b_gu, w_d, b_d = problem(seed, E, fmt, bias, T=sum(splits))
    if hot is not None:
        logits[:, hot] += 100.0  # these experts take every token
    xs, ls = my_share(x, splits, rank), my_share(logits, splits, rank)
    lo, hi = ranges[rank]
    y = ep_moe(xs, select_experts(w_gu, lo, hi), None if b_gu is None else b_gu[lo:hi], select_experts(w_d, lo, hi),
               None if b_d is None else b_d[lo:hi], ls, 4, ranges=ranges, routing=routing, activation=activation,
               combine_dtype=combine_dtype)
    weights, ids = route(ls, 4, mode=routing)
    expect = moe_reference(xs, w_gu, b_gu, w_d, b_d, weights, ids, activation=activation)
    assert y.shape == xs.shape and y.dtype == xs.dtype
    if combine_dtype == torch.float64:
        # the same float64 sums as one rank (matmul blocking aside): at most one ulp after the final rounding
        apart = ulps_apart(y, expect)
        assert apart <= 1, f"rank {rank}/{world}: {apart} ulps from one rank holding every expert"
        return
    # float32 pairs: each w_j * y_j rounded once (2^-24 relative), the k pairs summed, the sum rounded once
    pairs = [moe_reference(xs, w_gu, b_gu, w_d, b_d, weights[:, j : j + 1], ids[:, j : j + 1],
                           activation=activation, out_dtype=torch.float64) for j in range(4)]
    exact = sum(pairs)
    bound = 2.0**-24 * (sum(p.abs() for p in pairs) + exact.abs()) * (1 + 1e-6)
    assert bool(((y.double() - exact).abs() <= bound).all()), f"rank {rank}/{world}: beyond the float32 bound"


def ranks_main(rank, world, store, seed):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                           timeout=timedelta(seconds=30))
    try:
        uneven = {2: [(0, 5), (5, 32)], 4: [(0, 1), (1, 9), (9, 30), (30, 32)]}[world]
        splits = {2: [0, 67], 4: [20, 0, 40, 7]}[world]  # a rank with no tokens
        check_case(rank, world, seed, E=32, ranges=uneven, splits=splits)
        check_case(rank, world, seed + 1, E=128, ranges=expert_ranges(128, world), splits=[13] * world, fmt="mxfp8",
                   bias=False, routing="softmax_topk", activation="swiglu")
        # every pair to the first rank's experts: the other ranks receive nothing and compute nothing
        check_case(rank, world, seed + 2, E=32, ranges=expert_ranges(32, world), splits=[9, 4] * (world // 2),
                   hot=[0, 1, 2, 3])
        # float32 on the way back: one more rounding per pair
        check_case(rank, world, seed + 3, E=32, ranges=uneven, splits=[11] * world, combine_dtype=torch.float32)
        # the nn layer: shard a full MXMoE, run it on this rank's tokens, against the unsharded layer
        g = torch.Generator().manual_seed(seed + 4)
        router = torch.nn.Linear(H, 32)
        with torch.no_grad():
            router.weight.copy_(torch.randn(32, H, generator=g) * 0.3)
            router.bias.copy_(torch.randn(32, generator=g))
        w_gu, w_d = torch.randn(32, 2 * I, H, generator=g) * 0.4, torch.randn(32, H, I, generator=g) * 0.4
        full = MXMoE.from_dense(router, w_gu, torch.randn(32, 2 * I, generator=g), w_d, torch.randn(32, H, generator=g),
                                4, "mxfp4")
        x = torch.randn(world, 5, 3, H, generator=g)[rank]
        with torch.no_grad():
            expect = full(x)
            sharded = MXMoE(H, I, 32, 4, "mxfp4")
            sharded.load_state_dict(full.state_dict())
            sharded.shard_experts()
            assert sharded.gate_up_qdata.shape[0] == 32 // world
            got = sharded(x)
        assert ulps_apart(got, expect) <= 1
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, tmp_path, seed: int) -> None:
    run_forked_ranks(ranks_main, world, (world, str(tmp_path / "store"), seed), TIMEOUT_S, "expert parallelism")


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_matches_one_rank(world, tmp_path, rng):
    run_ranks(world, tmp_path, int(torch.randint(0, 2**31 - 1 - 8, (1,), generator=rng)))


def test_expert_ranges():
    assert expert_ranges(32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert expert_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    check_expert_ranges(expert_ranges(10, 4), 10, 4)
    with pytest.raises(ValueError, match="every rank"):
        expert_ranges(3, 4)
    for bad in ([(0, 5), (6, 10)], [(0, 5), (5, 9)], [(0, 10)], [(0, 0), (0, 10)], [(1, 5), (5, 10)]):
        with pytest.raises(ValueError, match="contiguous"):
            check_expert_ranges(bad, 10, 2)
