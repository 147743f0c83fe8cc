"""GPT-OSS routing in one kernel (``kernels/moe_details/_route.py``) against its reference twin
``mxkit.moe_reference.route``: the ids to the bit always; the weights to the bit on the GPU (the kernel computes
PyTorch's CUDA softmax; the reference there is that softmax) and within 8 ulp under the CPU interpreter (its
expf is numpy's, the reference's PyTorch's CPU one). Random logits of each dtype plus crafted rows: ties, NaN,
+-inf, -0.0 beside +0.0, a row of -inf, strided rows. ``mxkit.moe.route`` (the module's) dispatches to it on CUDA and keeps the
reference's errors."""

from __future__ import annotations

import pytest
import torch
from conftest import HAS_CUDA, poison_allocator

from mxkit.moe import route as dispatch_route
from mxkit.moe_reference import route as reference_route

gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
CASES = [(1, 32, 4), (3, 128, 4), (727, 32, 4), (64, 128, 8), (5, 5, 5), (9, 1000, 3), (17, 16, 1), (33, 64, 32)]


def _crafted(E: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows that decide the order's edge cases (E >= 5)."""
    nan, inf = float("nan"), float("inf")
    rows = [torch.zeros(E), torch.full((E,), 1.5), torch.arange(E, dtype=torch.float32) % 3,
            torch.full((E,), -inf), -torch.arange(E, dtype=torch.float32)]
    special = [(1, nan), (3, nan), (0, inf), (2, -inf), (4, -0.0)]
    for at, v in special:  # one special value per row, then all of them in one row
        r = torch.linspace(-2, 2, E)
        r[at] = v
        rows.append(r)
    r = torch.zeros(E)
    r[0], r[2] = -0.0, 0.0  # -0.0 and +0.0 tie: index order
    rows.append(r)
    r = torch.linspace(-2, 2, E)
    for at, v in special:
        r[at] = v
    rows.append(r)
    return torch.stack(rows).to(dtype)


def _assert_routed(w, ids, ref_w, ref_ids, exact: bool, case) -> None:
    """ids int32 equal to the reference's; weights float32 with the reference's NaNs and, elsewhere, its bits
    (``exact``: the GPU) or within 1e-6 relative (the interpreter: numpy's expf)."""
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and w.shape == ids.shape == ref_ids.shape, case
    assert torch.equal(ids.cpu(), ref_ids.cpu()), case
    w, ref_w = w.cpu(), ref_w.cpu()
    assert torch.equal(w.isnan(), ref_w.isnan()), case
    ok = ~ref_w.isnan()
    if exact:
        assert torch.equal(w[ok].view(torch.int32), ref_w[ok].view(torch.int32)), case
    else:
        assert torch.allclose(w[ok], ref_w[ok], rtol=1e-6, atol=1e-30), case


def _check_route(device: str, g: torch.Generator, exact: bool) -> int:
    from mxkit.kernels.moe_details._route import route_gpt_oss

    n = 0
    for T, E, k in CASES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            logits = (torch.randn(T, E, generator=g) * 3).to(dtype)
            if E >= 5:
                logits = torch.cat([logits, _crafted(E, dtype)])
            if T == 3:  # rows of a wider tensor: a row stride other than E
                logits = torch.randn(logits.shape[0], E + 7, generator=g).to(dtype)[:, 3:3 + E]
            ref_w, ref_ids = reference_route(logits.to(device), k)
            w, ids = route_gpt_oss(logits.to(device), k)
            _assert_routed(w, ids, ref_w, ref_ids, exact, (T, E, k, dtype))
            n += 1
    return n


def _check_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`): the routing kernel and the one-launch
    router (defined below)."""
    from conftest import interpreted_rng

    from mxkit.kernels.moe_details import _route

    g = interpreted_rng(_route._route_gpt_oss_kernel, _route._router_gpt_oss_kernel)
    n = _check_route("cpu", g, exact=False) + _check_router("cpu", g, exact=False)
    print(f"interpreter checks passed: {n}")


def test_route_kernels_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_route_kernel_writes_the_reference_bytes(rng):
    poison_allocator()
    assert _check_route("cuda", rng, exact=True) == 3 * len(CASES)


@pytest.mark.gpu
@gpu
def test_gpu_route_dispatch(rng, monkeypatch):
    """The dispatching route takes the kernel on CUDA for gpt_oss (the reference's bytes), the reference otherwise."""
    from mxkit.kernels.moe_details import _route

    logits = torch.randn(40, 32, generator=rng).to("cuda", torch.bfloat16)
    calls = []
    real = _route.route_gpt_oss
    monkeypatch.setattr(_route, "route_gpt_oss", lambda *a: calls.append(a) or real(*a))
    got = dispatch_route(logits, 4)
    soft = dispatch_route(logits, 4, mode="softmax_topk")
    wide = dispatch_route(logits.double(), 4)
    assert len(calls) == 1
    for a, b in zip(got, reference_route(logits, 4)):
        assert torch.equal(a, b)
    for a, b in zip(soft, reference_route(logits, 4, mode="softmax_topk")):
        assert torch.equal(a, b)
    for a, b in zip(wide, reference_route(logits.double(), 4)):
        assert torch.equal(a, b)


def test_route_dispatch_keeps_the_reference_contract():
    """Off CUDA the dispatching route is the reference; bad arguments raise the reference's errors on every device."""
    logits = torch.randn(6, 8)
    for a, b in zip(dispatch_route(logits, 2), reference_route(logits, 2)):
        assert torch.equal(a, b)
    devices = ["cpu"] + (["cuda"] if HAS_CUDA else [])
    for dev in devices:
        x = logits.to(dev)
        for args, kw, err, match in [((x, 0), {}, ValueError, "top_k=0"), ((x, 9), {}, ValueError, "top_k=9"),
                                     ((x[0], 2), {}, ValueError, r"must be \(T, E\)"),
                                     ((x.int(), 2), {}, TypeError, "float tensor"),
                                     ((x, 2), {"mode": "top"}, ValueError, "unknown routing mode='top'"),
                                     ((x, 2), {"renormalize": True}, ValueError, "renormalize=True applies")]:
            with pytest.raises(err, match=match):
                dispatch_route(*args, **kw)


@pytest.mark.gpu
@gpu
def test_gpu_mxmoe_routes_once_for_output_and_scores(rng, monkeypatch):
    """An MXMoE that returns its router scores (GPT-OSS's (hidden, scores)) routes once a forward on CUDA: its
    output is the bits of the same layer without scores, its scores the reference routing's weights (of the
    one-launch router's logits up to ``router_max_tokens(E)`` tokens, of the nn.Linear's above: the routing kernel
    runs there)."""
    from mxkit.kernels.moe_details import _route
    from mxkit.moe_reference import router_logits
    from mxkit.nn import MXMoE

    E, H, I, k = 32, 256, 128, 4
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [t.to(torch.bfloat16).cuda() for t in (torch.randn(E, 2 * I, H, generator=rng),
                                                    torch.randn(E, 2 * I, generator=rng),
                                                    torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng))]
    plain = MXMoE.from_dense(router, *dense, k, "mxfp4")
    scored = MXMoE.from_dense(router, *dense, k, "mxfp4", return_router_scores=True)
    calls = {"route": [], "router": []}
    for name in ("route_gpt_oss", "router_gpt_oss"):
        real = getattr(_route, name)
        monkeypatch.setattr(_route, name, lambda *a, real=real, name=name: calls[name[:-8]].append(a) or real(*a))
    one = _route.router_max_tokens(E)  # 32
    for T in (1, 5, 33, 300):  # the decode pairs, the sorted decode blocks (two), the prefill kernel
        x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
        with torch.no_grad():
            want = plain(x)
            for v in calls.values():
                del v[:]
            y, scores = scored(x)
            logits = router_logits(x, router.weight, router.bias) if T <= one else router(x)
        assert (len(calls["route"]), len(calls["router"])) == ((0, 1) if T <= one else (1, 0)), T
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), T
        ref_w, _ = reference_route(logits, k)
        assert torch.equal(scores, ref_w.to(torch.bfloat16)), T


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tokens", [(1,), (2, 3), (4, 8), (33,)])
def test_gpu_mxmoe_decode_router_in_one_launch(rng, tokens):
    """Up to ``router_max_tokens(E)`` tokens (32 here) a CUDA MXMoE (GPT-OSS routing, bf16 router) takes its router,
    top-k and softmax from the one-launch kernel: its output is the bits of the experts routed by the reference
    twin's logits (``router_logits``), its recorded logits those logits; 33 tokens take the nn.Linear as before. Under
    torch.compile (fullgraph; the routed layer one custom op, ``mxkit::mx_moe_routed``) the bits are the eager
    ones, the scores the reference routing's weights in bf16; a router needing a gradient takes the nn.Linear."""
    from mxkit.kernels.moe_details._route import router_max_tokens
    from mxkit.moe_reference import router_logits
    from mxkit.nn import MXMoE

    E, H, I, k = 32, 256, 128, 4
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [t.to(torch.bfloat16).cuda() for t in (torch.randn(E, 2 * I, H, generator=rng) * 0.1,
                                                    torch.randn(E, 2 * I, generator=rng),
                                                    torch.randn(E, H, I, generator=rng) * 0.1,
                                                    torch.randn(E, H, generator=rng))]
    layer = MXMoE.from_dense(router, *dense, k, "mxfp4", return_router_scores=True)
    seen = []
    layer.logits_recorder = lambda t: seen.append(t) or t
    x = torch.randn(*tokens, H, generator=rng).to(torch.bfloat16).cuda()
    x2 = x.reshape(-1, H)
    with torch.no_grad():
        y, scores = layer(x)
        fused = x2.shape[0] <= router_max_tokens(E)
        logits = router_logits(x2, router.weight, router.bias) if fused else router(x2)
        assert torch.equal(seen[-1].view(torch.int16), logits.view(torch.int16))
        want = layer._experts(x, logits.view(*x.shape[:-1], E))  # (routes these logits itself)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))
        assert torch.equal(scores, reference_route(logits, k)[0].to(torch.bfloat16))
        compiled = torch.compile(layer, fullgraph=True, dynamic=False)
        for _ in range(2):
            y2, scores2 = compiled(x)
            assert torch.equal(y2.view(torch.int16), y.view(torch.int16)) and torch.equal(scores2, scores)
    router.weight.requires_grad_(True)
    layer.router.weight.requires_grad_(True)
    y3, _ = layer(x)  # a gradient to record: the nn.Linear (the forward of the path without autograd)
    with torch.no_grad():
        want3 = layer._experts(x, layer.router(x))
    assert torch.equal(y3.detach().view(torch.int16), want3.view(torch.int16))


# --------------------------------------------------------------------------------------------------------
# the router GEMM, top-k and softmax in one launch

ROUTER_CASES = [(1, 32, 2880, 4), (3, 128, 64, 4), (8, 32, 100, 4), (2, 5, 96, 5), (5, 1000, 40, 3), (4, 16, 8, 1),
                (20, 32, 300, 4)]


def _router_inputs(T: int, E: int, H: int, dtype: torch.dtype, bias: bool, g: torch.Generator, subnormal: bool):
    """x (T, H), weight (E, H), bias (E,) or None; from T >= 4 crafted rows: token 1 has a +inf (logits +-inf or
    NaN), token 2 is subnormal (``subnormal``; else tiny normals), token 3 a NaN, token 4 (T >= 5) zero; experts 1 and
    0 equal (every token ties them)."""
    x = torch.randn(T, H, generator=g)
    w = torch.randn(E, H, generator=g) * H ** -0.5
    b = torch.randn(E, generator=g) if bias else None
    if T >= 4:
        x[1, 3] = float("inf")
        x[2] = x[2] * 2.0 ** ((-130 if dtype == torch.bfloat16 else -20) if subnormal else -100)
        x[3, 0] = float("nan")
    if T >= 5:
        x[4] = 0.0  # products of either sign of zero: the logits +0.0 (or the bias)
    if E >= 2:
        w[1] = w[0]
        if b is not None:
            b[1] = b[0]
    return x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)


def _check_router(device: str, g: torch.Generator, exact: bool) -> int:
    """exact: the GPU (the interpreter's expf is numpy's, and it misreads bf16 subnormals: loaded as bf16 and
    converted, 2^-130-scale values came out up to 8x too large; no subnormal bf16 rows there)."""
    from mxkit.kernels.moe_details._route import router_gpt_oss
    from mxkit.moe_reference import router_logits

    n = 0
    for T, E, H, k in ROUTER_CASES:
        for dtype in (torch.bfloat16, torch.float16):
            for bias in (True, False):
                x, w, b = _router_inputs(T, E, H, dtype, bias, g, subnormal=exact or dtype != torch.bfloat16)
                want = router_logits(x, w, b)
                ref_w, ref_ids = reference_route(want.to(device), k)
                logits, wts, ids = router_gpt_oss(x.to(device), w.to(device), None if b is None else b.to(device), k)
                case = (T, E, H, k, dtype, bias)
                assert logits.dtype == dtype, case
                assert torch.equal(logits.cpu().view(torch.int16), want.view(torch.int16)), case
                _assert_routed(wts, ids, ref_w, ref_ids, exact, case)
                n += 1
    return n


@pytest.mark.gpu
@gpu
def test_gpu_router_kernel_writes_the_reference_bytes(rng):
    """The one-launch router writes router_logits' bytes and the reference routing's ids and weights on them, in
    poisoned memory, twice in a row (its arrival counters are back at 0 after each launch)."""
    poison_allocator()
    for _ in range(2):
        assert _check_router("cuda", rng, exact=True) == 4 * len(ROUTER_CASES)


def test_router_max_tokens():
    """The one-launch router's token envelope: T * ceil(E / 32) <= 32, at least one token."""
    from mxkit.kernels.moe_details._route import router_max_tokens

    assert [router_max_tokens(E) for E in (1, 5, 32, 33, 64, 128, 1000, 1024)] == [32, 32, 32, 16, 16, 8, 1, 1]


def test_router_logits_reference_contract():
    """router_logits is the float64 sum rounded twice (checked by hand on a sum that float32 accumulation rounds
    otherwise), and refuses other dtypes and shapes."""
    from mxkit.moe_reference import router_logits

    x = torch.tensor([[1.0, 2.0 ** -20, 2.0 ** -20]], dtype=torch.bfloat16)
    w = torch.ones(1, 3, dtype=torch.bfloat16)
    assert router_logits(x, w).item() == torch.tensor(1.0 + 2.0 ** -19).to(torch.bfloat16).item()
    with pytest.raises(TypeError):
        router_logits(x.float(), w.float())
    with pytest.raises(ValueError):
        router_logits(x, w[:, :2])
