"""Tensor-parallel MXLinear on CPU: gloo process groups of 2 and 4 ranks (mxkit.nn.parallel), against the unsharded
MXLinear and a float64 oracle.

Ranks are forked (``torch.multiprocessing.start_processes(start_method="fork")``, as tests/test_moe_distributed.py
does: a spawned rank re-imports torch, seconds on the 2-core CI box) and drop to one OpenMP thread. They meet
through a FileStore in ``tmp_path`` (no ports); collectives time out after 20 s and the test kills its ranks after
45 s, so a hang fails the test instead of the run. Every rank draws the same full layer and inputs from a fresh
seed (printed by the ``rng`` fixture), then checks its own shard and the collective result.

Numerics (issue #22's bound, the one tests/kernel_tests/test_matmul.py uses), row by row against y64, the float64 product
of the dequantized operands: ``‖y_r − y64_r‖ ≤ 1.2·‖round(y64_r) − y64_r‖ + K·2^-24·‖(|a|·|b|ᵀ)_r‖`` for a bf16
output, ``1e-5·‖y64_r‖ + K·2^-24·‖(|a|·|b|ᵀ)_r‖`` for float32. Column-parallel outputs are also compared byte for
byte with the shards computed one by one in the rank (the same GEMM per element). Every check is shown to fail
on a wrong shard (a neighbour's offset, a swapped gather order).
"""

from __future__ import annotations

import copy
import io
from datetime import timedelta
from typing import Optional

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import mxkit
from conftest import run_forked_ranks
from mxkit.nn import MXLinear, _ops
from mxkit.nn.parallel import ColumnParallelMXLinear, RowParallelMXLinear, shard_mxlinear
from mxkit.tensor import MXTensor

TIMEOUT_S = 45  # the whole test, ranks killed after it
COLLECTIVE_TIMEOUT_S = 20
N = 96  # out_features: splits over 2 and 4 ranks
FORMATS = ("mxfp4_e2m1", "mxfp8_e4m3", "mxfp6_e3m2")

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


# ---------------------------------------------------------------------------------------------------------
# helpers (run inside the ranks)


def full_layer(g: torch.Generator, K: int, fmt: str, bias: bool, n: int = N, act_format=None) -> MXLinear:
    lin = torch.nn.Linear(K, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, K, generator=g) * torch.exp2(torch.randint(-3, 4, (n, K // 32), generator=g)
                                                                       .float()).repeat_interleave(32, dim=1))
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return MXLinear.from_linear(lin, fmt, act_format=act_format)


def weight64(layer: MXLinear) -> torch.Tensor:
    return mxkit.dequantize(layer.weight_mx, torch.float64)


def bound_error(y: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor, bias: Optional[torch.Tensor] = None) -> str:
    """'' if ``y ≈ a64 @ b64.T + bias`` within issue #22's row bound (module docstring), else what is over it."""
    y64 = a64.reshape(-1, a64.shape[-1]) @ b64.T
    if bias is not None:
        y64 = y64 + bias.to(torch.float64)
    K = a64.shape[-1]
    acc = K * 2.0**-24 * (a64.reshape(-1, K).abs() @ b64.abs().T).norm(dim=1)
    err = (y.reshape(y64.shape).to(torch.float64) - y64).norm(dim=1)
    if y.dtype == torch.float32:
        bound = 1e-5 * y64.norm(dim=1) + acc
    else:
        bound = 1.2 * (y64.to(y.dtype).to(torch.float64) - y64).norm(dim=1) + acc
    bad = torch.nonzero(~(err <= bound)).flatten()  # (a NaN error is over it)
    if bad.numel() == 0:
        return ""
    r = bad[0].item()
    return f"{bad.numel()} of {err.numel()} rows over the bound, e.g. row {r}: {err[r]:.3e} > {bound[r]:.3e}"


def assert_bound(y, a64, b64, bias=None, what="") -> None:
    msg = bound_error(y, a64, b64, bias)
    assert not msg, f"{what}: {msg}"


def assert_bound_fails(y, a64, b64, bias=None, what="") -> None:
    """The negative control: the check does reject a wrong answer."""
    assert bound_error(y, a64, b64, bias), f"{what}: a wrong shard passed the bound check"


def local_shard(t: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank's equal slice of ``t`` along ``dim``, written out independently of mxkit.nn.parallel."""
    w = t.shape[dim] // world
    return t.narrow(dim, rank * w, w)


def shard_mx(full: MXLinear, dim: int, s: int, world: int) -> MXTensor:
    """Shard s of the full weight's bytes along dim (0: rows N, 1: K, as equal byte slices)."""
    shape = list(full.weight_mx.shape)
    shape[dim] //= world
    return MXTensor(local_shard(full.weight_qdata, dim, s, world), local_shard(full.weight_scale, dim, s, world),
                    full.weight_format, 1, full.block_size, tuple(shape))


def gather_all(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return parts


# ---------------------------------------------------------------------------------------------------------
# the cases (each runs on every rank)


def case_column(rank: int, world: int, g: torch.Generator) -> None:
    for fmt in FORMATS:
        for bias in (True, False):
            full = full_layer(g, 256, fmt, bias)
            w64 = weight64(full)
            col = shard_mxlinear(full, "column")
            part = shard_mxlinear(full, "column", gather_output=False)
            assert isinstance(col, ColumnParallelMXLinear) and col.out_features == N // world
            for shape, dtype in (((7, 256), torch.bfloat16), ((2, 5, 256), torch.float32), ((1, 256), torch.bfloat16)):
                x = torch.randn(shape, generator=g).to(dtype)
                with torch.no_grad():
                    y, y_part, y_full = col(x), part(x), full(x)
                assert y.shape == shape[:-1] + (N,) and y.dtype == dtype
                assert y_part.shape == shape[:-1] + (N // world,)
                # byte for byte: each block of columns is what that shard's GEMM gives (computed here, one by one)
                for s in range(world):
                    w_s = shard_mx(full, 0, s, world)
                    b_s = None if not bias else local_shard(full.bias.detach(), 0, s, world)
                    want = mxkit.matmul(x, w_s, bias=b_s, out_dtype=dtype)
                    assert torch.equal(local_shard(y, -1, s, world), want), f"{fmt} {shape}: column block {s}"
                    if s == rank:
                        assert torch.equal(y_part, want), f"{fmt} {shape}: rank {rank}'s shard"
                b = full.bias.detach() if bias else None
                what = f"column {fmt} bias={bias} {shape} {dtype} rank {rank}/{world}"
                assert_bound(y, x.double(), w64, b, what)
                assert_bound(y_full, x.double(), w64, b, what + " (unsharded)")
                # negative control: the shards gathered in the wrong order
                assert_bound_fails(torch.roll(y, N // world, dims=-1), x.double(), w64, b, what)


def case_row(rank: int, world: int, g: torch.Generator) -> None:
    K = 128 * 3  # 12 blocks: 6 (2 ranks) or 3 (4 ranks) whole blocks per rank
    for fmt in FORMATS:
        for bias in (True, False):
            full = full_layer(g, K, fmt, bias)
            w64 = weight64(full)
            row = shard_mxlinear(full, "row")
            par = shard_mxlinear(full, "row", input_is_parallel=True)
            assert isinstance(row, RowParallelMXLinear) and row.in_features == K // world
            b = full.bias.detach() if bias else None
            for shape, dtype in (((7, K), torch.bfloat16), ((2, 5, K), torch.float32), ((3, 1, K), torch.bfloat16)):
                x = torch.randn(shape, generator=g).to(dtype)
                with torch.no_grad():
                    y, y_par = row(x), par(local_shard(x, -1, rank, world))
                assert y.shape == shape[:-1] + (N,) and y.dtype == dtype
                what = f"row {fmt} bias={bias} {shape} {dtype} rank {rank}/{world}"
                assert_bound(y, x.double(), w64, b, what)
                assert torch.equal(y, y_par), what + ": input_is_parallel gives another result"
                # negative control: this rank's K slice of x against the neighbour's K slice of W
                w_nb = shard_mx(full, 1, (rank + 1) % world, world)
                wrong = mxkit.matmul(local_shard(x, -1, rank, world), w_nb, out_dtype=torch.float32)
                dist.all_reduce(wrong)
                assert_bound_fails(wrong.to(dtype), x.double(), w64, b, what)
    # an MX act_format: each rank quantizes its own K slice, whose blocks are those of the full input
    full = full_layer(g, K, "mxfp4_e2m1", True, act_format="mxfp8_e4m3")
    x = torch.randn(4, 3, K, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        y = shard_mxlinear(full, "row")(x)
    a64 = mxkit.dequantize(mxkit.quantize(x, "mxfp8_e4m3", axis=-1), torch.float64)
    assert_bound(y, a64, weight64(full), full.bias.detach(), f"row act_format rank {rank}/{world}")
    assert_bound_fails(y, x.double() * 1.01, weight64(full), full.bias.detach(), "row act_format")


def case_mlp(rank: int, world: int, g: torch.Generator) -> None:
    """Megatron's MLP: column (gather_output=False) → row (input_is_parallel=True), one all_reduce."""
    up, down = full_layer(g, 128, "mxfp4_e2m1", True, n=256), full_layer(g, 256, "mxfp8_e4m3", True, n=128)
    col = ColumnParallelMXLinear.from_mxlinear(up, gather_output=False)
    row = RowParallelMXLinear.from_mxlinear(down, input_is_parallel=True)
    x = torch.randn(3, 4, 128, generator=g)
    with torch.no_grad():
        h = col(x)
        y = row(h)
    assert h.shape == (3, 4, 256 // world) and y.shape == (3, 4, 128)
    h_all = torch.cat(gather_all(h, world), -1)  # the hidden activations no rank holds whole
    what = f"mlp rank {rank}/{world}"
    assert_bound(h_all, x.double(), weight64(up), up.bias.detach(), what + " up")
    assert_bound(y, h_all.double(), weight64(down), down.bias.detach(), what + " down")
    assert_bound_fails(y, torch.roll(h_all, 256 // world, dims=-1).double(), weight64(down), down.bias.detach(), what)


def case_bytes(rank: int, world: int, g: torch.Generator) -> None:
    """Each shard holds exactly its bytes (FP6: 24 bytes per block, FP4: 16), from MXLinear or nn.Linear."""
    K = 32 * 4 * world  # 4 blocks per rank
    for fmt in FORMATS:
        f = mxkit.formats.get_format(fmt)
        lin = torch.nn.Linear(K, N)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(N, K, generator=g))
            lin.bias.copy_(torch.randn(N, generator=g))
        full = MXLinear.from_linear(lin, fmt)
        for style, cls in (("column", ColumnParallelMXLinear), ("row", RowParallelMXLinear)):
            shard, direct = shard_mxlinear(full, style), cls.from_linear(lin, fmt)
            assert f"tp_rank={rank}, tp_world_size={world}" in repr(shard)
            if style == "column":
                want_q, want_s = shard_mx(full, 0, rank, world).qdata, shard_mx(full, 0, rank, world).scale
                want_b = local_shard(full.bias.detach(), 0, rank, world)
            else:
                kb = 4 * 32 * f.pack_bytes // f.pack  # bytes of 4 blocks of K in this format, counted by hand
                assert kb == {"mxfp4_e2m1": 64, "mxfp6_e3m2": 96, "mxfp8_e4m3": 128}[fmt]
                want_q = full.weight_qdata[:, rank * kb : (rank + 1) * kb]
                want_s = full.weight_scale[:, rank * 4 : rank * 4 + 4]
                want_b = full.bias.detach()
            for m in (shard, direct):
                what = f"{style} {fmt} {type(m).__name__} rank {rank}/{world}"
                assert torch.equal(m.weight_qdata, want_q), what + " qdata"
                assert torch.equal(m.weight_scale, want_s), what + " scale"
                assert torch.equal(m.bias.detach(), want_b), what + " bias"
                sd = m.state_dict()
                assert set(sd) == {"weight_qdata", "weight_scale", "bias"}
                for k, t in sd.items():  # the shard's own storage, not a view of the full layer's
                    assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), what + f" {k} storage"
                own = sum(t.numel() * t.element_size() for t in sd.values())
                assert own == full.weight_nbytes // world + 4 * want_b.numel(), what + " state_dict bytes"
                buf = io.BytesIO()
                torch.save(sd, buf)
                assert buf.tell() < own + 4096, what + f": saved {buf.tell()} bytes for {own} of its own"
            # the other ranks' shards are not this one: a wrong offset would be seen
            others = gather_all(shard.weight_qdata, world)
            assert sum(torch.equal(o, shard.weight_qdata) for o in others) == 1, f"{style} {fmt}: shards coincide"
            # a state_dict loads into a module built for the same rank and reproduces the output
            fresh = cls(K, N, fmt)
            fresh.load_state_dict(shard.state_dict())
            x = torch.randn(5, K, generator=g)
            with torch.no_grad():
                assert torch.equal(fresh(x), shard(x)), f"{style} {fmt}: loaded shard"


def case_errors(rank: int, world: int, g: torch.Generator) -> None:
    """Sizes that do not split raise before any communication; the sizes next to them are accepted."""
    bad_k = 32 * (world + 1)  # a multiple of world (elements) but not world * 32 (whole blocks)
    with pytest.raises(ValueError, match=rf"K={bad_k} .*world_size={world}.*block_size=32.*{world * 32}"):
        RowParallelMXLinear(bad_k, N, "mxfp4")
    with pytest.raises(ValueError, match=rf"K={bad_k} .*world_size={world}"):
        shard_mxlinear(MXLinear(bad_k, N, "mxfp6_e3m2"), "row")
    RowParallelMXLinear(32 * 2 * world, N, "mxfp4")  # 2 blocks per rank
    for cls in (RowParallelMXLinear, ColumnParallelMXLinear):  # MXLinear's message (the row layer divided by it)
        for bad in (0, None, 32.0):
            with pytest.raises(ValueError, match=rf"block_size must be a positive int, got {bad!r}"):
                cls(128 * world, N, "mxfp4", block_size=bad)
    with pytest.raises(ValueError, match=rf"N={N + 1} .*world_size={world}"):
        ColumnParallelMXLinear(64, N + 1, "mxfp4")
    ColumnParallelMXLinear(bad_k, N, "mxfp4")  # a column split does not cut K
    with pytest.raises(ValueError, match="fp8_e4m3_rowwise"):
        RowParallelMXLinear(128 * world, N, "mxfp4", act_format="fp8_e4m3_rowwise")
    row = RowParallelMXLinear(128 * world, N, "mxfp4")
    with pytest.raises(ValueError, match=rf"expected \(\.\.\., {128 * world}\)"):
        row(torch.randn(2, 128))
    with pytest.raises(TypeError, match="unsharded MXLinear"):
        shard_mxlinear(row, "row")
    only0 = dist.new_group([0])  # (every rank makes it; rank 0 alone is in it)
    if rank != 0:  # torch.distributed's rank -1 in a group this rank is not in: a negative width before
        for cls in (ColumnParallelMXLinear, RowParallelMXLinear):
            with pytest.raises(ValueError, match=rf"global rank {rank}\) is not a member of the process group"):
                cls(128, 64, "mxfp4", group=only0)
    # bad x: the layer's own wording before any collective (the row layer named matmul's operand "a", or failed
    # with AttributeError on a list); from_linear of a float64 layer names its weight (was quantize's "x")
    for m in (row, ColumnParallelMXLinear(128, N, "mxfp4")):
        K = m.global_in_features if isinstance(m, RowParallelMXLinear) else m.in_features
        name = type(m).__name__
        with pytest.raises(TypeError, match=rf"{name} takes a float tensor \(\.\.\., {K}\), got list"):
            m([[0.0] * K])
        with pytest.raises(TypeError, match=f"{name} takes float32 / bfloat16 / float16 x, got torch.float64"):
            m(torch.randn(2, K, dtype=torch.float64))
        with pytest.raises(ValueError, match=f"{name}'s weight is on cpu but x on meta"):
            m(torch.empty(2, K, device="meta"))
    for cls in (ColumnParallelMXLinear, RowParallelMXLinear):
        with pytest.raises(TypeError, match="linear.weight is torch.float64"):
            cls.from_linear(torch.nn.Linear(128 * world, N, dtype=torch.float64), "mxfp4")
    dist.barrier()  # every rank got here: nothing above waited on a collective


def case_func(rank: int, world: int, g: torch.Generator) -> None:
    """Forward mode and torch.func through both shard kinds, as on MXLinear (their collectives had no jvp and no
    setup_context: torch-internal errors): the tangent (torch.func.jvp, forward_ad), torch.func.grad and vmap
    within the bound of the unsharded layer's float64 product."""
    import torch.autograd.forward_ad as fwad

    K = 256
    for style, kw in (("column", {}), ("column", {"gather_output": False}), ("row", {}),
                      ("row", {"input_is_parallel": True})):
        full = full_layer(g, K, "mxfp4_e2m1", True)
        m = shard_mxlinear(full, style, **kw)
        w64 = weight64(full)
        if kw.get("gather_output") is False:  # this rank's N slice
            w64 = local_shard(w64, 0, rank, world)
        x, t = torch.randn(6, K, generator=g), torch.randn(6, K, generator=g)
        xin, tin = x, t
        if kw.get("input_is_parallel"):  # this rank's K slice
            xin, tin, w64 = local_shard(x, 1, rank, world), local_shard(t, 1, rank, world), w64
        what = f"func {style} {kw} rank {rank}/{world}"
        y, y_t = torch.func.jvp(m, (xin,), (tin,))
        assert torch.equal(y, m(xin)), what + " jvp primal"
        assert_bound(y_t, t.double(), w64, None, what + " jvp tangent")
        assert_bound_fails(y_t * 0.9, t.double(), w64, None, what + " jvp tangent")
        with fwad.dual_level():
            y_t2 = fwad.unpack_dual(m(fwad.make_dual(xin, tin))).tangent
        assert torch.equal(y_t2, y_t), what + " forward_ad"
        gy = torch.randn(y.shape, generator=g)  # (the same on every rank)
        gx = torch.func.grad(lambda x_: (m(x_) * gy).sum())(xin)
        xs = xin.clone().requires_grad_()
        (m(xs) * gy).sum().backward()
        assert torch.equal(gx, xs.grad), what + " torch.func.grad"
        xb = torch.randn(3, 2, xin.shape[-1], generator=g)
        yb = torch.func.vmap(m)(xb)
        for i in range(3):  # (the row layer's float32 partial GEMM of 6 rows, not 2: another summation order)
            want = m(xb[i])
            torch.testing.assert_close(yb[i], want, rtol=0, atol=1e-6 * want.abs().max().item(),
                                       msg=what + f" vmap item {i}")
        yb1 = torch.func.vmap(m, in_dims=1, out_dims=1)(xb.transpose(0, 1).contiguous())
        torch.testing.assert_close(yb1.transpose(0, 1), yb, rtol=0, atol=1e-6 * yb.abs().max().item(),
                                   msg=what + " vmap along dim 1")
    dist.barrier()


def case_compile(rank: int, world: int, g: torch.Generator) -> None:
    """torch.compile(fullgraph=True) of both shard kinds under autograd: the output and the gradients of x and the
    bias equal eager's (the collectives' torch.func rules, a custom jvp, are left out of what dynamo traces: it
    refuses a Function with one); and under no_grad, one graph with eager's output."""
    K = 256
    for style in ("column", "row"):
        torch._dynamo.reset()
        m = shard_mxlinear(full_layer(g, K, "mxfp4_e2m1", True), style)
        x, gy = torch.randn(3, K, generator=g), torch.randn(3, N, generator=g)
        got = []
        for fn in (m, torch.compile(m, backend="aot_eager", fullgraph=True)):
            xs = x.clone().requires_grad_()
            y = fn(xs)
            (y * gy).sum().backward()
            got.append((y.detach(), xs.grad, m.bias.grad.clone()))
            m.bias.grad = None
        for what, a, b in zip(("y", "x.grad", "bias.grad"), *got):
            assert torch.equal(a, b), f"compile {style} rank {rank}/{world}: {what}"
        # inference (no autograd), the usual case: one graph too, eager's bits (the vmap question was traced)
        torch._dynamo.reset()
        with torch.no_grad():
            want = m(x)
            got_y = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
        assert torch.equal(got_y, want), f"compile no_grad {style} rank {rank}/{world}"
    dist.barrier()


def case_grad(rank: int, world: int, g: torch.Generator) -> None:
    """x.grad and the bias gradient through both layers equal the unsharded layer's within the bound, with float and
    MX activations (the quantization passed straight through: the row layer's x got no gradient with an
    act_format); an empty batch runs forward and backward."""
    K = 256
    for style, act in (("column", None), ("row", None), ("column", "mxfp8_e4m3"), ("row", "mxfp8_e4m3"),
                       ("row", "mxfp4_e2m1")):
        full = full_layer(g, K, "mxfp4_e2m1", True, act_format=act)
        x = torch.randn(6, K, generator=g)
        gy = torch.randn(6, N, generator=g)  # the same upstream gradient on every rank
        xs = x.clone().requires_grad_()
        m = shard_mxlinear(full, style)
        (m(xs) * gy).sum().backward()
        what = f"grad {style} {act} rank {rank}/{world}"
        assert xs.grad is not None, what + ": x got no gradient"
        assert_bound(xs.grad, gy.double(), weight64(full).T, None, what + " x")
        assert_bound_fails(xs.grad * 0.9, gy.double(), weight64(full).T, None, what + " x")
        want_b = gy.double().sum(0)
        if style == "column":
            want_b = local_shard(want_b, 0, rank, world)
        tol = 6 * 2.0**-24 * gy.abs().double().sum(0)
        tol = local_shard(tol, 0, rank, world) if style == "column" else tol
        assert bool(((m.bias.grad.double() - want_b).abs() <= tol).all()), what + " bias"
        # the weight stays frozen: the bias is the one parameter, the weight bytes unchanged by the backward
        assert [n for n, _ in m.named_parameters()] == ["bias"], what
        assert torch.equal(m.weight_qdata, shard_mxlinear(full, style).weight_qdata), what
        x0 = torch.randn(0, K, generator=g, requires_grad=True)
        y0 = m(x0)
        assert y0.shape == (0, N), what + " empty batch"  # (the column layer gathers its output)
        y0.sum().backward()
        assert x0.grad is not None and x0.grad.shape == (0, K), what + " empty batch"


def case_double(rank: int, world: int, g: torch.Generator) -> None:
    """Second-order gradients (a gradient penalty, create_graph=True) through both shards, and a row shard beside an
    unsharded layer, against float64: the row shard's backward all-gather was no autograd op (the penalty's
    gradient raised, or beside another path came out ~50% off) and the reduce's backward summed nothing."""
    K = 128
    full = full_layer(g, K, "mxfp4_e2m1", True)
    side = full_layer(g, K, "mxfp4_e2m1", False)
    # x scaled by 1/32 keeps the layers' outputs near 1 (at unit scale they reach ~40 through weights up to 2^3, and
    # a saturated tanh leaves the gradient to float32's rounding of 1 - tanh^2: past 1e-4 of it in ~1% of seeds)
    x0, gy = torch.randn(5, K, generator=g) / 32, torch.randn(5, N, generator=g)
    W, Ws = weight64(full), weight64(side)

    def penalty(f, x):
        (gx,) = torch.autograd.grad((torch.tanh(f(x)) * gy.to(x.dtype)).sum(), x, create_graph=True)
        return (gx**2).sum()

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    for style, with_side in (("column", False), ("row", False), ("row", True)):
        b64, x64 = full.bias.detach().double().requires_grad_(), x0.double().requires_grad_()
        f64 = (lambda t: F.linear(t, W, b64) + F.linear(t, Ws)) if with_side else (lambda t: F.linear(t, W, b64))
        want_b, want_x = torch.autograd.grad(penalty(f64, x64), (b64, x64))
        m = shard_mxlinear(full, style)
        x = x0.clone().requires_grad_()
        got_b, got_x = torch.autograd.grad(penalty((lambda t: m(t) + side(t)) if with_side else m, x), (m.bias, x))
        what = f"double {style}{' + side' if with_side else ''} rank {rank}/{world}"
        # (float32 through tanh'' and two GEMMs of weights scaled up to 2^3: at most 6.4e-6 of the float64 gradient
        # over 300 seeds (one rank, both layers); the cut or unsummed paths were 0.4-0.6 off)
        eb = rel(got_b, local_shard(want_b, 0, rank, world) if style == "column" else want_b)
        assert eb <= 1e-4 and rel(got_x, want_x) <= 1e-4, (what, eb, rel(got_x, want_x))


def case_copy(rank: int, world: int, g: torch.Generator) -> None:
    """A shard deep-copies with any group (raised "cannot pickle 'ProcessGroup'" with an explicit one): the copy
    shares the group, has buffers of its own (the key its compiled op finds it by) and gives the same output;
    torch.save of a shard works with the default group (None or the world group, saved as None) and raises a clear
    TypeError with another (whose state_dict saves and loads)."""
    full = full_layer(g, 64 * world, "mxfp4_e2m1", True)
    custom = dist.new_group(list(range(world)))  # every rank, but not the world group object
    assert custom is not dist.group.WORLD
    x = torch.randn(3, 64 * world, generator=g)
    for style in ("column", "row"):
        for group in (None, dist.group.WORLD, custom):
            what = f"copy {style} group={'custom' if group is custom else group} rank {rank}/{world}"
            shard = shard_mxlinear(full, style, group=group)
            dup = copy.deepcopy(shard)
            assert type(dup) is type(shard) and dup.tp_group is group, what
            assert _ops.module_of_key(dup.weight_qdata, "linear", "test") is dup, what
            for name, t in shard.named_buffers():
                assert dup.get_buffer(name).data_ptr() != t.data_ptr(), what + f" {name} shared"
                assert torch.equal(dup.get_buffer(name), t), what + f" {name}"
            assert dup.bias is not shard.bias and torch.equal(dup.bias, shard.bias), what + " bias"
            with torch.no_grad():
                y = shard(x)
                assert torch.equal(dup(x), y), what
            # a model holding the shard deep-copies too (the group shared through the memo)
            outer = copy.deepcopy(torch.nn.Sequential(shard))
            assert outer[0].tp_group is group and outer[0] is not shard, what
            buf = io.BytesIO()
            if group is custom:
                with pytest.raises(TypeError, match="custom process group cannot be pickled.*state_dict"):
                    torch.save(shard, buf)
                buf = io.BytesIO()
                torch.save(shard.state_dict(), buf)
                buf.seek(0)
                fresh = type(shard)(full.in_features, full.out_features, "mxfp4_e2m1", group=custom)
                fresh.load_state_dict(torch.load(buf))
            else:
                torch.save(shard, buf)
                buf.seek(0)
                fresh = torch.load(buf, weights_only=False)
                assert fresh.tp_group is None and fresh.tp_rank == rank, what
            with torch.no_grad():
                assert torch.equal(fresh(x), y), what + " loaded"
    if world > 1:
        # each rank loads the next rank's pickled shard: a ValueError on its first forward (it gave that rank's
        # columns as this rank's, silently), before any collective
        buf = io.BytesIO()
        torch.save(shard_mxlinear(full, "column"), buf)
        files = [None] * world
        dist.all_gather_object(files, buf.getvalue())
        other = torch.load(io.BytesIO(files[(rank + 1) % world]), weights_only=False)
        with pytest.raises(ValueError, match=rf"pickled by another rank or world size than this process's \(rank {rank} of"):
            other(x)
        # every rank loads rank 0's file: the others raise, and rank 0 with them, at once (it waited in the layer's
        # all_gather until the group's timeout); a second call raises again, without a collective; the group is in step
        zero = torch.load(io.BytesIO(files[0]), weights_only=False)
        for _ in range(2):
            with pytest.raises(ValueError, match="pickled by another rank" if rank else "another rank of this"):
                zero(x)
        flag = torch.ones(1)
        dist.all_reduce(flag)
        assert flag.item() == world
        # and the next rank's saved state_dict (every rank's shard has the same shapes: it loaded silently, the
        # output off by the other rank's columns / rows), of each style: a ValueError before anything is copied
        for style in ("column", "row"):
            shard = shard_mxlinear(full, style)
            buf = io.BytesIO()
            torch.save(shard.state_dict(), buf)
            files = [None] * world
            dist.all_gather_object(files, buf.getvalue())
            before = {n: t.clone() for n, t in shard.state_dict().items()}
            with pytest.raises(ValueError, match=rf"holds the {style} shard of rank {(rank + 1) % world} of {world} "
                                                 rf".*this module is the {style} shard of rank {rank} of {world}"):
                shard.load_state_dict(torch.load(io.BytesIO(files[(rank + 1) % world])))
            assert all(torch.equal(t, before[n]) for n, t in shard.state_dict().items()), style
            shard.load_state_dict(torch.load(io.BytesIO(files[rank])))  # (its own loads)
    dist.barrier()


CASES = {f.__name__: f for f in (case_column, case_row, case_mlp, case_bytes, case_errors, case_grad, case_copy,
                                 case_func, case_compile, case_double)}


# ---------------------------------------------------------------------------------------------------------
# the process group


def ranks_main(rank: int, world: int, store: str, seed: int, case: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        CASES[case](rank, world, torch.Generator().manual_seed(seed))
    finally:
        dist.destroy_process_group()


def run_ranks(case: str, world: int, tmp_path, rng) -> None:
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    run_forked_ranks(ranks_main, world, (world, str(tmp_path / "store"), seed, case), TIMEOUT_S, case)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", sorted(set(CASES) - {"case_compile"}))  # (compile: its own test, 2 ranks)
def test_tensor_parallel(case, world, tmp_path, rng):
    run_ranks(case, world, tmp_path, rng)


def test_tensor_parallel_compiles_under_autograd(tmp_path, rng):
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    run_forked_ranks(ranks_main, 2, (2, str(tmp_path / "store"), seed, "case_compile"), 4 * TIMEOUT_S, "case_compile")


def test_tensor_parallel_func_on_one_rank(tmp_path, rng):
    """A one-rank group (the column layer wrapped x in its collective even there) under torch.func."""
    run_ranks("case_func", 1, tmp_path, rng)


# ---------------------------------------------------------------------------------------------------------
# single process


def test_shard_mxlinear_rejects_bad_arguments():
    layer = MXLinear(64, 32, "mxfp4")
    with pytest.raises(ValueError, match="unknown tensor-parallel style 'diagonal'.*column, row"):
        shard_mxlinear(layer, "diagonal")
    with pytest.raises(TypeError, match="unsharded MXLinear, got Linear"):
        shard_mxlinear(torch.nn.Linear(64, 32), "column")
    with pytest.raises(TypeError, match="nn.Linear"):
        ColumnParallelMXLinear.from_linear(layer, "mxfp4")
    # the other style's flag (MXLinear's constructor's "unexpected keyword argument" named neither style)
    with pytest.raises(TypeError, match="a row shard takes input_is_parallel=, not gather_output"):
        shard_mxlinear(layer, "row", gather_output=False)
    with pytest.raises(TypeError, match="a column shard takes gather_output=, not input_is_parallel"):
        shard_mxlinear(layer, "column", input_is_parallel=True)


def test_shard_mxlinear_refuses_a_stacked_column_shard_without_the_gather(tmp_path):
    """A FusedMXLinear's stacked [q | k | v] rows split as one block give rank r no member's r-th shard: a column
    shard with gather_output=False of them raises before any collective; gathered, and row shards, still build."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    group = mxkit.nn.FusedMXLinear([MXLinear(64, n, "mxfp4") for n in (32, 16, 16)])
    with pytest.raises(ValueError, match=r"parts \(32, 16, 16\).*gather_output=True"):
        shard_mxlinear(group.fused, "column", gather_output=False)
    with pytest.raises(ValueError, match="stacked rows"):
        ColumnParallelMXLinear.from_mxlinear(copy.deepcopy(group).fused, gather_output=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.randn(3, 64)
        for shard in (shard_mxlinear(group.fused, "column"), shard_mxlinear(group.fused, "row")):
            torch.testing.assert_close(shard(x), group.fused(x), rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


def test_shards_under_torch_export(tmp_path, rng):
    """torch.export in a one-rank group: column and row shards of a weight-only layer and a column shard with MX
    activations export with the eager bytes; a row shard with MX activations raises NotImplementedError naming the
    case (it failed on a data-dependent guard deep in torch)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        lin = torch.nn.Linear(64, 48)
        x = torch.randn(5, 64, generator=rng)
        cases = ((None, ColumnParallelMXLinear), (None, RowParallelMXLinear), ("mxfp8", ColumnParallelMXLinear))
        for act, cls in cases:
            m = cls.from_linear(lin, "mxfp4", act_format=act)
            with torch.no_grad():
                assert torch.equal(torch.export.export(m, (x,)).module()(x), m(x)), (act, cls.__name__)
        m = RowParallelMXLinear.from_linear(lin, "mxfp4", act_format="mxfp8")
        with torch.no_grad(), pytest.raises(NotImplementedError, match="RowParallelMXLinear with act_format"):
            torch.export.export(m, (x,))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_shards_quantize_activations_of_64_element_blocks(tmp_path, rng):
    """On CUDA, shards of a layer of 64-element blocks with FP4 / FP6 activations (which fold to FP8 only in blocks
    of 32: they raised from the fold kernel) take the exact path: within the bound of the quantized operands, in a
    one-rank group (no collective), column and row."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        lin = torch.nn.Linear(256, 64).cuda()
        x = torch.randn(3, 256, generator=rng).cuda()
        for act in ("mxfp4", "mxfp6_e2m3"):
            for cls in (ColumnParallelMXLinear, RowParallelMXLinear):
                m = cls.from_linear(lin, "mxfp4", act_format=act, block_size=64)
                with torch.no_grad():
                    y = m(x)
                a64 = mxkit.dequantize(mxkit.quantize(x, act, block_size=64), torch.float64).cpu()
                err = bound_error(y.cpu(), a64, weight64(m).cpu(), lin.bias.detach().cpu())
                assert not err, (act, cls.__name__, err)
    finally:
        dist.destroy_process_group()


def test_constructor_checks_before_any_collective():
    """From a bad-input audit, checked before the process group is read (no group needed): the global sizes
    ("64" failed inside a string format's %, a negative N that divides was named as N / W), non-bool flags ("no"
    was taken as True: the opposite of what was asked), a group that is not a ProcessGroup (AttributeError), a
    style that is not a str (unhashable type)."""
    from mxkit.distributed import group_position

    for cls in (ColumnParallelMXLinear, RowParallelMXLinear):
        for args, name in (((64, "64"), "out_features"), (("64", 64), "in_features"), ((64, None), "out_features"),
                           ((64, -64), "out_features"), ((0, 64), "in_features"), ((True, 64), "in_features")):
            with pytest.raises(ValueError, match=rf"{name} must be a positive int for {cls.__name__}, got"):
                cls(*args, "mxfp4")
    with pytest.raises(TypeError, match="gather_output must be a bool, got 'no'"):
        ColumnParallelMXLinear(64, 64, "mxfp4", gather_output="no")
    with pytest.raises(TypeError, match="input_is_parallel must be a bool, got 'no'"):
        RowParallelMXLinear(64, 64, "mxfp4", input_is_parallel="no")
    with pytest.raises(TypeError, match="who: group must be a torch.distributed ProcessGroup or None, got str"):
        group_position("foo", "who")
    with pytest.raises(ValueError, match=r"unknown tensor-parallel style \['row'\]"):
        shard_mxlinear(MXLinear(64, 64, "mxfp4"), ["row"])
