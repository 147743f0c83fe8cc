"""GPT-OSS routing in one kernel (``kernels/matmul_details/_route.py``) against its reference twin
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


def _check_route(device: str, g: torch.Generator, exact: bool) -> int:
    from mxkit.kernels.matmul_details._route import route_gpt_oss

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
            assert ids.dtype == torch.int32 and w.dtype == torch.float32 and w.shape == ids.shape == ref_ids.shape
            assert torch.equal(ids.cpu(), ref_ids.cpu()), (T, E, k, dtype)
            w, ref_w = w.cpu(), ref_w.cpu()
            assert torch.equal(w.isnan(), ref_w.isnan()), (T, E, k, dtype)
            ok = ~ref_w.isnan()
            if exact:
                assert torch.equal(w[ok].view(torch.int32), ref_w[ok].view(torch.int32)), (T, E, k, dtype)
            else:
                assert torch.allclose(w[ok], ref_w[ok], rtol=1e-6, atol=1e-30), (T, E, k, dtype)
            n += 1
    return n


def _check_route_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.matmul_details import _route

    g = interpreted_rng(_route._route_gpt_oss_kernel)
    print(f"interpreter checks passed: {_check_route('cpu', g, exact=False)}")


def test_route_kernel_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_route_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_route_kernel_writes_the_reference_bytes(rng):
    poison_allocator()
    assert _check_route("cuda", rng, exact=True) == 3 * len(CASES)


@pytest.mark.gpu
@gpu
def test_gpu_route_dispatch(rng, monkeypatch):
    """The dispatching route takes the kernel on CUDA for gpt_oss (the reference's bytes), the reference otherwise."""
    from mxkit.kernels.matmul_details import _route

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
        for args, kw, err in [((x, 0), {}, ValueError), ((x, 9), {}, ValueError), ((x[0], 2), {}, ValueError),
                              ((x.int(), 2), {}, TypeError), ((x, 2), {"mode": "top"}, ValueError),
                              ((x, 2), {"renormalize": True}, ValueError)]:
            with pytest.raises(err):
                dispatch_route(*args, **kw)


@pytest.mark.gpu
@gpu
def test_gpu_mxmoe_routes_once_for_output_and_scores(rng, monkeypatch):
    """An MXMoE that returns its router scores (GPT-OSS's (hidden, scores)) routes once a forward on CUDA: its
    output is the bits of the same layer without scores, its scores the reference routing's weights."""
    from mxkit.kernels.matmul_details import _route
    from mxkit.nn import MXMoE

    E, H, I, k = 32, 256, 128, 4
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [t.to(torch.bfloat16).cuda() for t in (torch.randn(E, 2 * I, H, generator=rng),
                                                    torch.randn(E, 2 * I, generator=rng),
                                                    torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng))]
    plain = MXMoE.from_dense(router, *dense, k, "mxfp4")
    scored = MXMoE.from_dense(router, *dense, k, "mxfp4", return_router_scores=True)
    calls = []
    real = _route.route_gpt_oss
    monkeypatch.setattr(_route, "route_gpt_oss", lambda *a: calls.append(a) or real(*a))
    for T in (1, 5, 300):  # the decode pairs, the sorted decode blocks, the prefill kernel
        x = torch.randn(T, H, generator=rng).to(torch.bfloat16).cuda()
        with torch.no_grad():
            want = plain(x)
            del calls[:]
            y, scores = scored(x)
        assert len(calls) == 1, T
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), T
        ref_w, _ = reference_route(router(x).detach(), k)
        assert torch.equal(scores, ref_w.to(torch.bfloat16)), T
