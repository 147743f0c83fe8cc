"""Issue #23, "every op is CUDA-graph capturable", for the ops whose own test files do not capture them: columnwise
quantize, FP8 rowwise quantize, the deferred quantize-fold and its MX x MX GEMM, W4A8 (matmul and MXLinear), the
Hopper wgmma prefill paths (W4A16 and W8A16), decode-w16 and GPT-OSS routing. Each step is captured once, replayed
on fresh input data copied into its static inputs (outputs poisoned with NaN / 0xFF before each replay), and must
give the bytes of the eager step on the same inputs."""

from __future__ import annotations

import pytest
import torch

import mxkit
import mxkit.nn
from conftest import SKIP_REASON_TWO_GPUS, assert_graph_replays, capture_graph

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def _randn(rng, *shape, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=rng) * 2).to(dtype).cuda()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2"])
def test_gpu_quantize_columnwise_and_fp8_rowwise_capture(fmt, rng):
    x = _randn(rng, 256, 512)
    assert_graph_replays(lambda x: (mxkit.quantize(x, fmt, axis=0), mxkit.quantize(x, fmt, axis=-1),
                                    mxkit.quantize_fp8_rowwise(x)), [x], lambda: [_randn(rng, 256, 512)])


@pytest.mark.gpu
@gpu
def test_gpu_mx_x_mx_and_w4a8_capture(rng):
    """MXFP4 x MXFP4 from bf16 activations (the deferred quantize-fold, the FP8 GEMM and the fix-up of rows the fold
    does not cover: some rows of the fresh data span more than the fold window) and W4A8, through matmul and
    MXLinear."""
    N, K, M = 512, 1024, 8
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
    pw = mxkit.pack_weight(w, act="mx")
    p8 = mxkit.pack_weight(w, act="fp8_rowwise")

    def fresh():
        x = torch.randn(M, K, generator=rng)
        x[1, :32] *= 2.0**30  # a row whose block scales span 30 > 14: the fix-up's row
        return [x.to(torch.bfloat16).cuda()]

    x = fresh()[0]
    assert mxkit.gemm_plan(mxkit.quantize_fold(x, "mxfp4", defer=True), pw).path == "fold-fp8"
    assert mxkit.gemm_plan(mxkit.quantize_fp8_rowwise(x), p8).path == "w4a8-fp8"
    assert_graph_replays(lambda x: (mxkit.matmul(mxkit.quantize_fold(x, "mxfp4", defer=True), pw),
                                    mxkit.matmul(mxkit.quantize_fp8_rowwise(x), p8)), [x], fresh)
    lin = torch.nn.Linear(K, N, bias=True).cuda().to(torch.bfloat16)
    for act in ("mxfp4", "fp8_e4m3_rowwise"):
        m = mxkit.nn.MXLinear.from_linear(lin, "mxfp4", act_format=act)
        with torch.no_grad():
            assert_graph_replays(m, [x.clone()], fresh)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,path", [("mxfp4_e2m1", "w4a16-wgmma"), ("mxfp8_e4m3", "w8a16-wgmma")])
def test_gpu_wgmma_prefill_capture(fmt, path, rng):
    """The Hopper wgmma kernel (split along K at this M) captured with bias."""
    from mxkit.kernels.matmul_details import _w4a16_wgmma

    if _w4a16_wgmma.available(torch.device("cuda")) is not None:
        pytest.skip(_w4a16_wgmma.available(torch.device("cuda")))
    N, K, M = 4096, 4096, 64
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda() / 8, fmt))
    bias = torch.randn(N, generator=rng).cuda()
    x = _randn(rng, M, K)
    assert mxkit.gemm_plan(x, pw).path == path
    assert_graph_replays(lambda x: mxkit.matmul(x, pw, bias=bias), [x], lambda: [_randn(rng, M, K)])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,dt", [("mxint8", torch.bfloat16), ("mxfp6_e2m3", torch.float16)])
def test_gpu_decode_w16_capture(fmt, dt, rng):
    """(A PackedWeight: an MXTensor weight's scale range is read on the host each call, which a capture refuses.)"""
    N, K, M = 1024, 2880, 3
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), fmt))
    x = _randn(rng, M, K, dtype=dt)
    assert mxkit.gemm_plan(x, pw).path == "decode-w16"
    assert_graph_replays(lambda x: mxkit.matmul(x, pw), [x], lambda: [_randn(rng, M, K, dtype=dt)])


@pytest.mark.gpu
@gpu
def test_gpu_route_capture(rng):
    """GPT-OSS routing (the Triton kernel: top-4 of 128 experts, softmax over them) captured."""
    logits = _randn(rng, 64, 128)
    from mxkit.moe import route

    assert_graph_replays(lambda lg: route(lg, 4), [logits], lambda: [_randn(rng, 64, 128)])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,act,N", [("mxfp4_e2m1", None, 4096), ("mxfp8_e4m3", "mxfp8_e4m3", 2048)])
def test_gpu_split_k_graph_survives_a_full_call_cache(fmt, act, N, rng):
    """A decode GEMM split along K (decode-mma for MXFP4, a8w8-mma for MXFP8 x MXFP8 at M = 1: grids under two
    blocks a multiprocessor, K = 8192; N = 2048 keeps a8w8 off its unsplit bulk kernel) captured in a graph, then
    70 eager calls of other shapes, which
    empty the weight's prepared-call cache (64 entries) and make new launches: the replay still finds its split-K
    workspace and counters (they live on the weight, not on the dropped call), writes nothing into the memory the
    eager calls freed (a sentinel allocated after them), and gives the eager bytes."""
    from mxkit.kernels.matmul_details import _mma_decode

    K = 8192
    lin = torch.nn.Linear(K, N, bias=False).cuda().to(torch.bfloat16)
    m = mxkit.nn.MXLinear.from_linear(lin, fmt, act_format=act)
    x = _randn(rng, 1, K)
    with torch.no_grad():
        m(x)
        q = m._packed.mma_q
        assert q is not None and id(q) in _mma_decode._SPLIT, "the launch is not split"
        held = dict(_mma_decode._SPLIT[id(q)][1])
        assert len(held) == 1
        graph, y = capture_graph(m, x)
        for M in range(2, 72):  # other shapes: new keys in the weight's call cache, which empties at 64
            m(_randn(rng, M, K))
        torch.cuda.synchronize()
        sentinel = torch.full((64 << 20,), 7, dtype=torch.int32, device="cuda")  # takes what was freed
        for _ in range(3):
            x.copy_(_randn(rng, 1, K))
            y.fill_(float("nan"))
            graph.replay()
            assert torch.equal(y.view(torch.uint8), m(x.clone()).view(torch.uint8))
        torch.cuda.synchronize()
        assert bool((sentinel == 7).all())
        pairs = _mma_decode._SPLIT[id(q)][1]
        assert all(pairs[k] is v for k, v in held.items())  # the graph's pair kept, whatever the other calls made


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason=SKIP_REASON_TWO_GPUS)
def test_gpu_ops_on_a_device_that_is_not_current(rng):
    """Operands on cuda:1 while cuda:0 is current (a model spread over GPUs): every op runs on cuda:1, gives the
    bytes it gives with cuda:1 current, and leaves cuda:0 current. Not yet run: the device runs so far had one GPU
    (the two-GPU kind is not lent; every gpu_check log skips it), and no other test runs the routing it covers
    (mxkit._device's ``elsewhere`` / ``other_device`` with a CUDA operand on another device)."""
    from mxkit.nn import MXLinear, MXMoE

    dev = torch.device("cuda", 1)
    x = (torch.randn(8, 256, generator=rng) * 2).to(torch.bfloat16).to(dev)
    w = mxkit.quantize(torch.randn(512, 256, generator=rng).to(dev), "mxfp4")
    pw = mxkit.pack_weight(w)
    lin = MXLinear.from_linear(torch.nn.Linear(256, 512).to(torch.bfloat16).to(dev), "mxfp4")
    E, I = 4, 64  # noqa: E741
    moe = MXMoE.from_dense(torch.nn.Linear(256, E).to(dev), torch.randn(E, 2 * I, 256, generator=rng).to(dev), None,
                           torch.randn(E, 256, I, generator=rng).to(dev), None, 2, "mxfp4")

    def steps():
        with torch.no_grad():
            q = mxkit.quantize(x, "mxfp8")
            rows, cols = mxkit.cast_transpose(x.reshape(64, 32), "mxfp4")  # (M and K multiples of 32)
            return [q.qdata, q.scale, rows.qdata, rows.scale, cols.qdata, cols.scale,
                    mxkit.dequantize(w, torch.bfloat16),
                    mxkit.matmul(x[:1], pw), mxkit.matmul(x, pw), lin(x[:1]), lin(x), moe(x)]

    with torch.cuda.device(1):
        want = steps()
    torch.cuda.set_device(0)
    got = steps()
    assert torch.cuda.current_device() == 0
    for g, w_ in zip(got, want):
        assert g.device == dev and torch.equal(g.view(torch.uint8), w_.view(torch.uint8))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,act", [("mxfp4", None), ("mxfp8_e4m3", None), ("mxfp4", "mxfp8"),
                                     ("mxfp6_e2m3", None), ("mxfp4", "fp8_e4m3_rowwise")])
@pytest.mark.parametrize("M", [1, 64, 300])
def test_gpu_graph_replays_the_weight_loaded_after_capture(fmt, act, M, rng):
    """A CUDA graph of an MXLinear captured, then load_state_dict of weights that pack alike (rows permuted: the
    same scale statistics; then every scale byte one larger, a weight sync inside the envelopes): the replay gives
    the new layer's bytes, with other layers packed in between (the old packed copy used to be freed and its blocks
    reused: another layer's weights read, split-K writes into freed memory). A weight with a 0 scale byte (another
    kernel variant) gets a new packed copy, with a warning that a graph must be captured again."""
    src = torch.nn.Linear(512, 384)
    with torch.no_grad():  # (block maxima ~0.5-1: scale bytes away from every envelope's edge, doubled or not)
        src.weight.copy_(torch.randn(384, 512, generator=rng) * 0.3)
    la = mxkit.nn.MXLinear.from_linear(src, fmt, act_format=act).cuda()
    with torch.no_grad():
        perm = torch.randperm(384, generator=rng)
        src.weight.copy_(src.weight[perm])
        src.bias.copy_(src.bias[perm])
    lb = mxkit.nn.MXLinear.from_linear(src, fmt, act_format=act).cuda()
    x = _randn(rng, M, 512)
    packed = la._packed
    with torch.no_grad():
        graph, y = capture_graph(la, x)
        la.load_state_dict(lb.state_dict())
        assert la._packed is packed  # (written in place)
        churn = [mxkit.nn.MXLinear.from_linear(torch.nn.Linear(512, 384), fmt, act_format=act).cuda()
                 for _ in range(3)]
        y.fill_(float("nan"))
        graph.replay()
        want = lb(x)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    with torch.no_grad():
        src.weight.mul_(2)
    lc = mxkit.nn.MXLinear.from_linear(src, fmt, act_format=act).cuda()
    assert not torch.equal(lc.weight_scale, lb.weight_scale)
    with torch.no_grad():
        la.load_state_dict(lc.state_dict())
        assert la._packed is packed
        y.fill_(float("nan"))
        graph.replay()
        want = lc(x)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    sd = lc.state_dict()
    sd["weight_scale"][0, 0] = 0
    with pytest.warns(RuntimeWarning, match="captured again"):
        la.load_state_dict(sd)
    assert la._packed is not packed and churn
