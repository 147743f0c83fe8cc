"""MoE checks found by mutation testing of ``mxkit/moe.py``, ``mxkit/moe_reference.py`` and ``mxkit/nn/moe.py``:
behaviours the documentation promises that no other test checked. Most tests name the mutant they were written
against (a one-line change that every other CPU test let pass, and the test fails on).

Oracles are written here in float64 from the definitions: expert weights decoded with conftest's
``oracle_unpack`` + ml_dtypes (not mxkit's dequantize), routing as a stable sort of float64 logits and a float64
softmax, the layer as a loop over tokens and their selected experts. Random inputs come from conftest's ``rng``
(a fresh seed per test, printed for replay).
"""

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import mxkit
from mxkit.moe_reference import route
from mxkit.nn import MXMoE
from test_moe import one_thread, oracle_act  # noqa: F401  (one_thread: test_moe's autouse fixture, here too)
from test_moe import oracle_weights as _oracle_mx

moe_op = sys.modules["mxkit.moe"]  # the module (the name ``mxkit.moe`` is the function, exported by mxkit)

H, I = 64, 32  # noqa: E741  (hidden, expert intermediate: both multiples of the block of 32)


# --- float64 oracles ----------------------------------------------------------------------------------------


def oracle_weights(q: torch.Tensor, s: torch.Tensor, fmt: str, block: int = 32) -> np.ndarray:
    """float64 values of MX expert bytes (E, N, K/pack) with E8M0 scales (E, N, K/block), decoded by ml_dtypes
    (test_moe's oracle on the module's buffers)."""
    return _oracle_mx(SimpleNamespace(qdata=q, scale=s, fmt=SimpleNamespace(name=fmt), block_size=block)).numpy()


def oracle_route(logits: np.ndarray, k: int):
    """GPT-OSS routing in float64: the k largest logits (ties to the lower index), softmax over those k."""
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, axis=-1)
    e = np.exp(top - top.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), ids


def oracle_mxmoe(m: MXMoE, x: torch.Tensor, router_w: torch.Tensor, router_b) -> np.ndarray:
    """The layer of a GPT-OSS MXMoE (routing gpt_oss, activation swiglu_gpt_oss, all experts held) on x (T, H),
    in float64: the router from ``router_w`` / ``router_b`` (the dense router the module was built from), the
    experts from the module's bytes decoded here, a loop over tokens and their experts."""
    fmt = m.weight_format.name
    Wgu = oracle_weights(m.gate_up_qdata, m.gate_up_scale, fmt)
    Wd = oracle_weights(m.down_qdata, m.down_scale, fmt)
    bgu = m.gate_up_bias.detach().double().numpy() if m.gate_up_bias is not None else np.zeros(Wgu.shape[:2])
    bd = m.down_bias.detach().double().numpy() if m.down_bias is not None else np.zeros(Wd.shape[:2])
    x64 = x.double().numpy()
    logits = x64 @ router_w.detach().double().numpy().T
    if router_b is not None:
        logits = logits + router_b.detach().double().numpy()
    w, ids = oracle_route(logits, m.top_k)
    out = np.zeros((x.shape[0], Wd.shape[1]))
    for t in range(x.shape[0]):
        for j in range(m.top_k):
            e = ids[t, j]
            a = oracle_act(Wgu[e] @ x64[t] + bgu[e], "swiglu_gpt_oss")
            out[t] += w[t, j] * (Wd[e] @ a + bd[e])
    return out


def assert_close_to_oracle(y: torch.Tensor, ref: np.ndarray, rtol: float):
    """|y - ref| <= rtol * max|ref| elementwise (ref float64)."""
    ref = torch.from_numpy(ref)
    err = (y.double() - ref).abs().max().item()
    bound = rtol * ref.abs().max().item()
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g}"


def dense_experts(E, rng, bias=True, scale=0.4):
    w_gu = torch.randn(E, 2 * I, H, generator=rng) * scale
    w_d = torch.randn(E, H, I, generator=rng) * scale
    b_gu = torch.randn(E, 2 * I, generator=rng) if bias else None
    b_d = torch.randn(E, H, generator=rng) if bias else None
    return w_gu, b_gu, w_d, b_d


# the module computes its logits in float32 (nn.Linear), routes them with a float32 softmax and sums in float64
# with one rounding to float32: against the float64 oracle the difference is the float32 logits' and weights'
# error, a few 2^-24 relative (1e-5 of the output's magnitude leaves a wide margin, and a mutant moves it by O(1))
LAYER_RTOL = 1e-5


# --- routing and the layer at top_k = E -------------------------------------------------------------------


def test_route_and_mxmoe_take_every_expert(rng):
    """top_k = E is in the documented range [1, E]: route selects every expert (by decreasing logit, weights the
    softmax over all of them) and an MXMoE with top_k = num_experts builds and computes the float64 layer.
    (Mutants: ``1 <= top_k < E`` in MXMoE.__init__ and in moe_reference._check_top_k.)"""
    E, T = 4, 9
    logits = torch.randn(T, E, generator=rng, dtype=torch.float64)
    w, ids = route(logits, E)
    ref_w, ref_ids = oracle_route(logits.numpy(), E)
    assert torch.equal(ids.long(), torch.from_numpy(ref_ids))
    torch.testing.assert_close(w.double(), torch.from_numpy(ref_w), rtol=1e-6, atol=1e-7)  # float32 softmax

    router = nn.Linear(H, E)
    w_gu, b_gu, w_d, b_d = dense_experts(E, rng)
    m = MXMoE.from_dense(router, w_gu, b_gu, w_d, b_d, E, "mxfp4")
    assert m.top_k == E
    x = torch.randn(T, H, generator=rng)
    with torch.no_grad():
        y = m(x)
    assert_close_to_oracle(y, oracle_mxmoe(m, x, router.weight, router.bias), LAYER_RTOL)


def test_numpy_integer_top_k_and_dims_are_taken(rng, monkeypatch):
    """A NumPy integer top_k (and MXMoE dims), as a config read back through NumPy gives them, is taken as its int
    (as quantize's ``axis`` / ``block_size`` are): route (reference and mxkit.moe's), router_gpt_oss, mxkit.moe and
    MXMoE give the bytes of the int call, and mxkit.moe.route hands on a Python int (the CUDA kernel's check takes
    only that); a bool, a float or an out-of-range value is still refused with the same errors."""
    import mxkit

    E, k, T = 8, 2, 5
    logits = torch.randn(T, E, generator=rng)
    for routing in ("gpt_oss", "softmax_topk"):
        want, got = route(logits, k, mode=routing), route(logits, np.int64(k), mode=routing)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), routing
    seen, real = [], moe_op.reference_route
    monkeypatch.setattr(moe_op, "reference_route", lambda lg, kk, **kw: seen.append(type(kk)) or real(lg, kk, **kw))
    assert all(torch.equal(a, b) for a, b in zip(moe_op.route(logits, np.int64(k)), route(logits, k)))
    assert seen == [int]
    xr, wr, br = (torch.randn(*s, generator=rng).to(torch.bfloat16) for s in ((T, H), (E, H), (E,)))
    assert all(torch.equal(a, b) for a, b in zip(moe_op.router_gpt_oss(xr, wr, br, np.int64(k)),
                                                 moe_op.router_gpt_oss(xr, wr, br, k)))
    router = nn.Linear(H, E)
    w_gu, b_gu, w_d, b_d = dense_experts(E, rng)
    m = MXMoE.from_dense(router, w_gu, b_gu, w_d, b_d, k, "mxfp4")
    x = torch.randn(T, H, generator=rng)
    with torch.no_grad():
        y = m(x)
        args = (x, m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias, router(x))
        assert torch.equal(mxkit.moe(*args, np.int32(k)), mxkit.moe(*args, k))
    m_np = MXMoE(np.int64(H), np.int64(I), np.int64(E), np.int64(k), "mxfp4")
    assert (m_np.hidden_size, m_np.intermediate_size, m_np.num_experts, m_np.top_k) == (H, I, E, k)
    assert all(type(v) is int for v in (m_np.hidden_size, m_np.num_experts, m_np.top_k))
    m_np.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert torch.equal(m_np(x), y)
    for bad in (True, 2.0, np.int64(0), np.int64(E + 1)):
        with pytest.raises(ValueError, match="must be an int in"):
            route(logits, bad)
        with pytest.raises(ValueError, match="must be an int in"):
            MXMoE(H, I, E, bad, "mxfp4")


def test_mxmoe_from_dense_keeps_a_bias_free_router(rng):
    """A router without a bias stays without one (no randomly initialised bias slipped in): the module's
    router has bias None and its forward is the float64 layer of x @ W.T. (Mutant: ``router_bias=True`` in
    MXMoE._filled.)"""
    E, k, T = 8, 2, 7
    router = nn.Linear(H, E, bias=False)
    m = MXMoE.from_dense(router, *dense_experts(E, rng), k, "mxfp4")
    assert m.router.bias is None and "router.bias" not in m.state_dict()
    x = torch.randn(T, H, generator=rng)
    with torch.no_grad():
        y = m(x)
    assert_close_to_oracle(y, oracle_mxmoe(m, x, router.weight, None), LAYER_RTOL)


# --- MXMoE constructors -------------------------------------------------------------------------------------


def test_mxmoe_constructor_names_an_unknown_routing():
    """An unknown routing name fails at construction, naming it (not at the first forward). (Mutant: the
    ``routing not in ROUTING_MODES`` check skipped.)"""
    with pytest.raises(ValueError, match="unknown routing='sigmoid'"):
        MXMoE(H, I, 4, 2, "mxfp4", routing="sigmoid")


def test_from_hf_gpt_oss_refuses_another_swiglu(rng):
    """from_hf_gpt_oss raises ValueError for a GptOssExperts whose swiglu limit or alpha is not GPT-OSS's 7.0 /
    1.702 (MXMoE implements only those) rather than convert it to a layer computing something else. (Mutant: the
    alpha / limit check skipped.)"""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    from transformers import GptOssConfig

    def mlp():
        cfg = GptOssConfig(num_hidden_layers=1, hidden_size=H, intermediate_size=I, num_local_experts=4,
                           num_experts_per_tok=2, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16)
        block = gpt_oss.GptOssMLP(cfg)
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(generator=rng)
        return block

    assert MXMoE.from_hf_gpt_oss(mlp()).top_k == 2  # the default config converts
    # (set on the module: transformers 5.17 holds limit = 7.0 whatever the config's swiglu_limit; 5.24 reads it)
    other = mlp()
    other.experts.limit = 5.0
    with pytest.raises(ValueError, match="limit=5.0"):
        MXMoE.from_hf_gpt_oss(other)
    other = mlp()
    other.experts.alpha = 1.5
    with pytest.raises(ValueError, match="alpha=1.5"):
        MXMoE.from_hf_gpt_oss(other)


def test_from_dense_and_from_mx_refuse_an_odd_gate_up(rng):
    """A gate_up of odd N (gate and up cannot pair) is a ValueError naming it, in from_dense and from_mx (a
    RuntimeError from copy_ into the buffers otherwise). (Mutant: ``gs[1] % 2`` dropped from _expert_dims.)"""
    E, k = 4, 2
    router = nn.Linear(H, E)
    w_gu, w_d = torch.randn(E, 2 * I + 1, H, generator=rng), torch.randn(E, H, I, generator=rng)
    with pytest.raises(ValueError, match=r"w_gate_up has shape \(4, 65, 64\)"):
        MXMoE.from_dense(router, w_gu, None, w_d, None, k, "mxfp4")
    with pytest.raises(ValueError, match=r"gate_up has shape \(4, 65, 64\)"):
        MXMoE.from_mx(router, mxkit.quantize(w_gu, "mxfp4"), None, mxkit.quantize(w_d, "mxfp4"), None, k)


def test_mxmoe_input_checks_and_strided_x(rng):
    """A strided x gives its contiguous copy's bytes (the router's BLAS picks its kernel by layout); x on another
    device than the experts, and a router that does not give E logits, are ValueErrors naming them; integer expert
    biases are a TypeError (as mxkit.moe's); from_mx keeps the experts' scale mode and rounding."""
    E, k = 4, 2
    w_gu, b_gu, w_d, b_d = dense_experts(E, rng)
    m = MXMoE.from_dense(nn.Linear(H, E), w_gu, b_gu, w_d, b_d, k, "mxfp4")
    x = torch.randn(H, 5, generator=rng).t()
    assert not x.is_contiguous()
    assert torch.equal(m(x), m(x.contiguous()))
    with pytest.raises(ValueError, match="experts are on cpu but x on meta"):
        m(torch.randn(5, H, device="meta"))
    m.router = nn.Linear(H, 3)
    with pytest.raises(ValueError, match="router gives 3 logits a token, expected num_experts=4"):
        m(x)
    with pytest.raises(TypeError, match="b_gate_up must be a floating-point tensor, got torch.int64"):
        MXMoE.from_dense(nn.Linear(H, E), w_gu, b_gu.long(), w_d, b_d.long(), k, "mxfp4")
    q = [mxkit.quantize(w, "mxfp4", scale_mode="rceil", rounding="away") for w in (w_gu, w_d)]
    m = MXMoE.from_mx(nn.Linear(H, E), q[0], None, q[1], None, k)
    assert (m.scale_mode.value, m.rounding.value) == ("rceil", "away")
    assert MXMoE.from_mx(nn.Linear(H, E), q[0], None, q[1], None, k, scale_mode="floor").scale_mode.value == "floor"
    d_floor = mxkit.quantize(w_d, "mxfp4", rounding="away")
    with pytest.raises(ValueError, match="gate_up's scale_mode is rceil but down's floor: pass scale_mode="):
        MXMoE.from_mx(nn.Linear(H, E), q[0], None, d_floor, None, k)
    assert MXMoE.from_mx(nn.Linear(H, E), q[0], None, d_floor, None, k, scale_mode="ceil").scale_mode.value == "ceil"


def _tie_blocks(shape, rng) -> torch.Tensor:
    """Values whose MXFP4 elements sit on rounding ties: each block of 32 has its amax 6 * 2^s (scale 2^s under
    every scale mode's FLOOR), the rest midpoints of the E2M1 grid (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) times
    2^s with random signs, so RNE and round-away give other codes."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    v = mids[torch.randint(0, 7, shape, generator=rng)]
    v = v * (torch.randint(0, 2, shape, generator=rng) * 2 - 1)
    v = v.reshape(*shape[:-1], shape[-1] // 32, 32)
    v[..., 0] = 6.0
    s = torch.randint(-3, 4, v.shape[:-1] + (1,), generator=rng).to(torch.float32)
    return (v * torch.exp2(s)).reshape(shape)


@pytest.mark.parametrize("kw", [dict(scale_mode="ceil"), dict(rounding="away")], ids=["ceil", "away"])
def test_from_dense_quantizes_with_the_module_settings(kw, rng):
    """from_dense passes scale_mode / rounding to mxkit.quantize (as its docstring says): the module's bytes are
    quantize's bytes with those settings, which differ here from the defaults'. (Mutants: scale_mode, or
    rounding, not passed to quantize in from_dense.)"""
    E, k = 4, 2
    router = nn.Linear(H, E)
    if "rounding" in kw:
        w_gu, w_d = _tie_blocks((E, 2 * I, H), rng), _tie_blocks((E, H, I), rng)
    else:
        w_gu, w_d = torch.randn(E, 2 * I, H, generator=rng), torch.randn(E, H, I, generator=rng)
    m = MXMoE.from_dense(router, w_gu, None, w_d, None, k, "mxfp4", **kw)
    for name, dense in (("gate_up", w_gu), ("down", w_d)):
        want = mxkit.quantize(dense, "mxfp4", axis=-1, **kw)
        default = mxkit.quantize(dense, "mxfp4", axis=-1)
        got = (getattr(m, f"{name}_qdata"), getattr(m, f"{name}_scale"))
        assert torch.equal(got[0], want.qdata) and torch.equal(got[1], want.scale), name
        assert not (torch.equal(want.qdata, default.qdata) and torch.equal(want.scale, default.scale))


# --- expert parallelism guards ------------------------------------------------------------------------------


def test_shard_experts_refuses_a_module_holding_part_of_the_experts(rng):
    """shard_experts needs a module holding every expert: a module of expert_range (1, 3) is refused with a
    ValueError naming its range, before any process-group call. (Mutant: that check skipped.)"""
    m = MXMoE(H, I, 4, 2, "mxfp4", expert_range=(1, 3))
    with pytest.raises(ValueError, match=r"holding every expert, this one holds \(1, 3\)"):
        m.shard_experts(ranges=[(0, 2), (2, 4)])


@pytest.mark.parametrize("act_format", ["fp8_e4m3_rowwise", "mxfp4"])
def test_quantized_activation_mxmoe_refuses_expert_parallel_forward(act_format, rng):
    """A W4A8 / MXFP4 x MXFP4 module with ``ep_ranges`` set (what shard_experts sets) raises NotImplementedError
    on forward rather than run the local layer as if it were the whole one (they have no expert parallelism).
    (Mutant: the ep_ranges check in MXMoE._experts skipped.)"""
    E, k = 4, 2
    m = MXMoE.from_dense(nn.Linear(H, E), *dense_experts(E, rng), k, "mxfp4", act_format=act_format)
    m.ep_ranges = [(0, 2), (2, 4)]
    with torch.no_grad(), pytest.raises(NotImplementedError, match="expert parallelism"):
        m(torch.randn(3, H, generator=rng))


def test_shard_experts_refuses_a_quantized_activation_module(rng):
    """shard_experts on a W4A8 / MXFP4 x MXFP4 module raises before it touches the process group or the experts
    (the constructor refuses an expert_range for them; forward would raise only after the shard)."""
    E, k = 4, 2
    for act_format in ("fp8_e4m3_rowwise", "mxfp4"):
        m = MXMoE.from_dense(nn.Linear(H, E), *dense_experts(E, rng), k, "mxfp4", act_format=act_format)
        before = m.gate_up_qdata.clone()
        with pytest.raises(ValueError, match="no expert parallelism"):
            m.shard_experts(ranges=[(0, 2), (2, 4)])
        assert m.expert_range == (0, E) and m.ep_ranges is None
        assert torch.equal(before.view(torch.uint8), m.gate_up_qdata.view(torch.uint8))


# --- the op module: mxkit.moe and friends -------------------------------------------------------------------


def test_route_tokens_checks_the_leading_dims_not_their_count(rng):
    """x (2, 3, H) and router_logits (3, 2, E) hold as many tokens but not the same ones: a ValueError naming the
    leading dims, in route_tokens and moe. (Mutant: the leading dims compared by their product only.)"""
    E = 8
    x, logits = torch.randn(2, 3, H, generator=rng), torch.randn(3, 2, E, generator=rng)
    with pytest.raises(ValueError, match="leading dims"):
        moe_op.route_tokens(x, logits, 2, "gpt_oss")
    w_gu, b_gu, w_d, b_d = (mxkit.quantize(t, "mxfp4", axis=-1) if t.dim() == 3 else t
                            for t in dense_experts(E, rng))
    with pytest.raises(ValueError, match="leading dims"):
        mxkit.moe(x, w_gu, b_gu, w_d, b_d, logits, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_layers_take_no_tokens(dtype, rng):
    """moe_w4a8 / moe_mxfp4 (the unfolded entry points) and an MXMoE with an act_format, on x with no tokens
    ((0, H) and (2, 0, H)): zeros of x's shape and dtype (moe_mxfp4 used to reach quantize of an empty tensor).
    (Mutant: the T = 0 early return in moe._quantized_layer dropped.)"""
    E, k = 4, 2
    dense = dense_experts(E, rng)
    w_gu, b_gu, w_d, b_d = (mxkit.quantize(t, "mxfp4", axis=-1) if t.dim() == 3 else t for t in dense)
    for shape in ((0, H), (2, 0, H)):
        x, logits = torch.zeros(shape, dtype=dtype), torch.zeros(*shape[:-1], E, dtype=dtype)
        for fn in (moe_op.moe_w4a8, moe_op.moe_mxfp4):
            y = fn(x, w_gu, b_gu, w_d, b_d, logits, k)
            assert y.shape == shape and y.dtype == dtype, fn.__name__
    for act_format in ("fp8_e4m3_rowwise", "mxfp4"):
        m = MXMoE.from_dense(nn.Linear(H, E), *dense, k, "mxfp4", act_format=act_format).to(dtype)
        with torch.no_grad():
            y = m(torch.zeros(0, H, dtype=dtype))
        assert y.shape == (0, H) and y.dtype == dtype, act_format


def test_quantized_layers_with_no_tokens_keep_the_autograd_graph(rng):
    """moe_w4a8 / moe_mxfp4 with no tokens and inputs that need a gradient: the zeros stay in the graph, so a
    backward runs (as for mxkit.moe) and gives every such input zeros of its shape (it raised "does not require
    grad" when the empty result was a fresh tensor)."""
    E, k = 4, 2
    dense = dense_experts(E, rng)
    w_gu, b_gu, w_d, b_d = (mxkit.quantize(t, "mxfp4", axis=-1) if t.dim() == 3 else t for t in dense)
    for fn, grads in ((moe_op.moe_w4a8, ("x", "b_gu", "b_d", "logits")), (moe_op.moe_mxfp4, ("b_d", "logits"))):
        t = {"x": torch.randn(0, H), "b_gu": b_gu.clone(), "b_d": b_d.clone(), "logits": torch.randn(0, E)}
        for name in grads:
            t[name].requires_grad_(True)
        y = fn(t["x"], w_gu, t["b_gu"], w_d, t["b_d"], t["logits"], k)
        assert y.shape == (0, H) and y.requires_grad, fn.__name__
        y.sum().backward()
        for name in grads:
            g = t[name].grad
            assert g is not None and g.shape == t[name].shape and not g.any(), (fn.__name__, name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_router_gpt_oss_on_cpu(dtype, bias, rng):
    """mxkit.moe.router_gpt_oss off CUDA (the reference twin): logits = x @ W.T + b in float64 rounded to x's
    dtype (within the double rounding float64 -> float32 -> dtype: half an ulp of dtype plus 2^-24 relative),
    ids the k largest of those logits (ties to the lower index), weights their softmax (float32: 1e-6
    relative). (Mutants: the fallback drops the bias; the fallback routes softmax_topk.)"""
    T, E, k = 11, 8, 3
    x = torch.randn(T, H, generator=rng).to(dtype)
    w = (torch.randn(E, H, generator=rng) * H ** -0.5).to(dtype)
    b = torch.randn(E, generator=rng).to(dtype) if bias else None
    logits, weights, ids = moe_op.router_gpt_oss(x, w, b, k)
    assert logits.dtype == dtype and logits.shape == (T, E)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (T, k)
    ref = x.double().numpy() @ w.double().numpy().T + (b.double().numpy() if bias else 0.0)
    half_ulp = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    err = np.abs(logits.double().numpy() - ref)
    # (+ 2^-24 absolute: float16's subnormal logits, |ref| < 2^-14, have a half ulp of 2^-25)
    assert (err <= (half_ulp + 2.0**-24) * np.abs(ref) + 2.0**-24).all(), err.max()
    ref_w, ref_ids = oracle_route(logits.double().numpy(), k)  # routing of the returned logits
    assert torch.equal(ids.long(), torch.from_numpy(ref_ids))
    torch.testing.assert_close(weights.double(), torch.from_numpy(ref_w), rtol=1e-6, atol=1e-7)


def test_moe_ignores_packed_off_the_triton_backend(rng):
    """``packed`` is for the Triton backend's decode path and ignored elsewhere (moe_experts' docstring): on CPU
    (backend reference or auto) moe with a packed argument is moe without it, bit for bit. (Mutant: packed
    passed on to the reference, which takes no such argument.)"""
    E, k = 8, 2
    w_gu, b_gu, w_d, b_d = (mxkit.quantize(t, "mxfp4", axis=-1) if t.dim() == 3 else t
                            for t in dense_experts(E, rng))
    x, logits = torch.randn(5, H, generator=rng), torch.randn(5, E, generator=rng)
    want = mxkit.moe(x, w_gu, b_gu, w_d, b_d, logits, k, backend="reference")
    for backend in ("reference", "auto"):
        got = mxkit.moe(x, w_gu, b_gu, w_d, b_d, logits, k, backend=backend, packed=(object(), object()))
        assert torch.equal(got, want), backend


def test_route_orders_signed_zeros_and_nans_on_cpu():
    """route's documented order, checked without Triton (the interpreter test caught these mutants alone): -0.0
    equals +0.0 (a tie: the lower expert first), NaN of either sign ranks above +inf, then the numbers."""
    nan, inf = float("nan"), float("inf")
    neg_nan = torch.tensor([nan]).neg()  # (sign bit set)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        logits = torch.tensor([[0.0, -0.0, 1.0, -1.0, -2.0], [-0.0, 0.0, -1.0, -3.0, -2.0],
                               [1.0, inf, nan, 0.0, 2.0], [1.0, inf, 0.0, nan, 2.0]], dtype=dtype)
        logits[3, 3] = neg_nan.to(dtype)[0]
        _, ids = route(logits, 3, mode="softmax_topk")
        assert ids.tolist() == [[2, 0, 1], [0, 1, 2], [2, 1, 4], [3, 1, 4]], dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_route_gpt_oss_softmax_runs_in_float32(dtype, rng):
    """mode="gpt_oss" on bf16 / fp16 logits: the weights are the float32 softmax of the k selected logits, bit for
    bit (not the softmax in the logits' dtype, which HF then rounds)."""
    logits = (torch.randn(64, 16, generator=rng) * 3).to(dtype)
    w, ids = route(logits, 4, mode="gpt_oss")
    sel = logits.gather(1, ids.long()).to(torch.float32)
    assert torch.equal(w, torch.softmax(sel, dim=-1))
    assert not torch.equal(w, torch.softmax(logits.gather(1, ids.long()), dim=-1).to(torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_router_logits_adds_the_bias_once(dtype, rng):
    """mxkit.moe_reference.router_logits: x @ W.T + b, exact in float64, rounded to float32 then to x's dtype."""
    from mxkit.moe_reference import router_logits

    x, w = torch.randn(9, 96, generator=rng).to(dtype), torch.randn(8, 96, generator=rng).to(dtype)
    b = (torch.randn(8, generator=rng) * 4).to(dtype)
    want = (x.double() @ w.double().T + b.double()).to(torch.float32).to(dtype)
    assert torch.equal(router_logits(x, w, b).view(torch.uint8), want.view(torch.uint8))
    want0 = (x.double() @ w.double().T).to(torch.float32).to(dtype)
    assert torch.equal(router_logits(x, w).view(torch.uint8), want0.view(torch.uint8))


def test_check_moe_args_refusals(rng):
    """check_moe_args (shared by the reference and the kernel backends, which have no later check to fall back on):
    an odd gate_up row count under SwiGLU, routing for another token count, an expert range of another width than
    the experts held (wider as narrower), operands on two devices."""
    from mxkit.moe_reference import check_moe_args

    def args(E=4, H=64, I=32, T=6, n1=None):
        wgu = mxkit.quantize(torch.randn(E, n1 or 2 * I, H, generator=rng), "mxfp4")
        wd = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
        w, ids = route(torch.randn(T, E, generator=rng), 2)
        return [torch.randn(T, H, generator=rng), wgu, None, wd, None, w, ids]

    assert check_moe_args(*args(), activation="swiglu").E_local == 4
    with pytest.raises(ValueError, match="even 2I"):
        check_moe_args(*args(n1=65), activation="swiglu")
    a = args()
    a[5], a[6] = route(torch.randn(4, 4, generator=rng), 2)
    with pytest.raises(ValueError, match=r"\(T, k\)"):
        check_moe_args(*a, activation="swiglu")
    for hi in (6, 3):
        with pytest.raises(ValueError, match=f"holds {hi} experts"):
            check_moe_args(*args(), activation="swiglu", expert_range=(0, hi), num_experts=8)
    a = args()
    a[6] = a[6].to("meta")
    with pytest.raises(ValueError, match="one device"):
        check_moe_args(*a, activation="swiglu")


def test_moe_op_edges_from_an_audit(rng, monkeypatch):
    """mxkit.moe where a gradient is needed runs the reference whatever backend resolves (the Triton kernels have
    no backward: on CUDA the gradients were silently dropped); moe with no tokens keeps every input that needs a
    gradient in the graph (as moe_w4a8 does); moe_mxfp4 refuses float64 x, H or I not a multiple of 32 and an x that
    needs a gradient for every token count (0 tokens skipped the check); the reference's grouped GEMM refuses
    negative token ids (they read token -1) and moe_reference an integer intermediate_dtype (it truncated)."""
    from mxkit.moe_reference import align_block_size, grouped_matmul_reference, moe_reference

    E, H, I, k = 4, 64, 32, 2
    wg = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    wd = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    b1, b2 = torch.randn(E, 2 * I, generator=rng), torch.randn(E, H, generator=rng)
    x, logits = torch.randn(5, H, generator=rng), torch.randn(5, E, generator=rng)
    # a backend that resolves to the kernels: with a gradient to give, the reference runs
    monkeypatch.setattr(moe_op, "resolve_moe_backend", lambda backend, device: "triton")
    monkeypatch.setitem(moe_op._IMPLS, "triton", lambda *a, **kw: pytest.fail("the kernels ran for a gradient"))
    xg = x.clone().requires_grad_()
    moe_op.moe(xg, wg, b1, wd, b2, logits, k).sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0
    monkeypatch.undo()
    bg = b2.clone().requires_grad_()
    y0 = moe_op.moe(x[:0], wg, b1, wd, bg, logits[:0], k)
    assert y0.shape == (0, H) and y0.requires_grad
    y0.sum().backward()
    assert torch.equal(bg.grad, torch.zeros_like(b2))
    for bad, err, match in ((x.double(), TypeError, "float64"),
                            (x[:0].clone().requires_grad_(), ValueError, "x or b_gate_up")):
        with pytest.raises(err, match=match):
            moe_op.moe_mxfp4(bad, wg, b1, wd, b2, logits[: bad.shape[0]], k)
    w16 = mxkit.quantize(torch.randn(E, H, 48, generator=rng), "mxfp4", block_size=16)
    wg48 = mxkit.quantize(torch.randn(E, 96, H, generator=rng), "mxfp4")
    with pytest.raises(ValueError, match="blocks of 32: got 48"):
        moe_op.moe_mxfp4(x, wg48, None, w16, None, logits, k)
    w, ids = route(logits, k)
    sorted_ids, expert_ids, _ = align_block_size(ids, E, 16)
    bad = sorted_ids.clone()
    bad[0] = -1
    with pytest.raises(ValueError, match=r"holds ids in \[-1, 10\], outside \[0, T \* top_k = 10\]"):
        grouped_matmul_reference(x, wg, bad, expert_ids, 16, k)
    with pytest.raises(TypeError):
        moe_reference(x, wg, b1, wd, b2, w, ids, intermediate_dtype=torch.int32)


def test_bad_names_and_settings_from_the_session_78_audit(rng):
    """moe_w4a8 / moe_mxfp4 refuse an unknown backend with a gradient to give and with no tokens (both returned a
    result before); MXMoE names a routing / activation / backend that is not a str (a list raised 'unhashable')
    and a dtype that is not floating (torch's own error named no argument); route refuses a renormalize that is not
    a bool (the str 'no' read as True)."""
    E, k = 4, 2
    wg = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    wd = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    x, logits = torch.randn(3, H, generator=rng), torch.randn(3, E, generator=rng)
    for fn in (moe_op.moe_w4a8, moe_op.moe_mxfp4):
        for xx, lg in ((x.detach(), logits.clone().requires_grad_()), (x[:0], logits[:0])):
            with pytest.raises(ValueError, match="unknown backend 'bogus'"):
                fn(xx, wg, None, wd, None, lg, k, backend="bogus")
    assert moe_op.moe_w4a8(x, wg, None, wd, None, logits, k, backend="reference").shape == (3, H)
    for kw, err, match in ((dict(activation=["swiglu"]), ValueError, "activation"),
                           (dict(routing=("gpt_oss",)), ValueError, "routing"),
                           (dict(backend=None), ValueError, "backend"),
                           (dict(dtype=torch.int32), TypeError, "dtype"),
                           # (float8 is floating but no router dtype: nn.Linear's init failed, naming no argument)
                           (dict(dtype=torch.float8_e4m3fn), TypeError, "dtype=torch.float8_e4m3fn must be"),
                           # (a truthy str: biases made, a (y, scores) tuple returned, a copy kept)
                           (dict(bias="False"), TypeError, "MXMoE: bias must be a bool, got 'False'"),
                           (dict(router_bias=0), TypeError, "router_bias must be a bool"),
                           (dict(return_router_scores="no"), TypeError, "return_router_scores must be a bool"),
                           (dict(keep_source=None), TypeError, "keep_source must be a bool")):
        with pytest.raises(err, match=match):
            MXMoE(H, I, E, k, "mxfp4", **kw)
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        route(logits, k, mode="softmax_topk", renormalize="no")
    w, ids = route(logits, k, mode="softmax_topk", renormalize=True)
    assert torch.allclose(w.sum(1), torch.ones(3))


def test_quantized_layers_check_a_callers_fold_and_dtypes_from_the_session_80_audit(rng):
    """moe_w4a8 / moe_mxfp4 refuse a ``folded`` pair that does not fit the call, on every backend and token count:
    gate_up folded without interleave_halves for activation="swiglu" (or with it for GPT-OSS's: the kernels' middle
    pass pairs rows 2c, 2c + 1, so gate rows were paired with gate rows, silently), a down fold interleaved,
    another layer's shapes, a non-pair. moe_w4a8 refuses float64 x with no tokens too (it returned float64 zeros
    there and raised with tokens); moe_experts refuses a non-float out_dtype on every backend (the kernels' combine
    truncated into an int32 output); router_max_tokens of no experts is 1 (it divided by zero)."""
    from mxkit.kernels.moe import fold_experts
    from mxkit.kernels.moe_details._route import router_max_tokens

    E, k = 4, 2
    wg = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    wd = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    x, logits = torch.randn(5, H, generator=rng), torch.randn(5, E, generator=rng)
    plain, inter, down = fold_experts(wg), fold_experts(wg, interleave_halves=True), fold_experts(wd)
    assert plain is not None and inter is not None and down is not None
    wg_other = mxkit.quantize(torch.randn(E, 4 * I, H, generator=rng), "mxfp4")
    for fn in (moe_op.moe_w4a8, moe_op.moe_mxfp4):
        for T in (5, 0):
            for folded, act, err, match in (
                    ((plain, down), "swiglu", ValueError, r"folded\[0\] \(gate_up\) has interleaved=False; "
                                                          r"activation='swiglu' needs interleaved=True"),
                    ((inter, down), "swiglu_gpt_oss", ValueError, r"interleaved=True; activation='swiglu_gpt_oss'"),
                    ((inter, fold_experts(wd, interleave_halves=True)), "swiglu", ValueError, r"folded\[1\] \(down\)"),
                    ((fold_experts(wg_other), down), "swiglu_gpt_oss", ValueError,
                     rf"has shape \({E}, {4 * I}, {H}\) but the experts given \({E}, {2 * I}, {H}\)"),
                    ([plain, down], "swiglu_gpt_oss", TypeError, "the \\(gate_up, down\\) pair")):
                with pytest.raises(err, match=match):
                    fn(x[:T], wg, None, wd, None, logits[:T], k, activation=act, folded=folded)
            # the right pairs run (the reference on the CPU) and give the unfolded call's bytes
            for folded, act in (((plain, down), "swiglu_gpt_oss"), ((inter, down), "swiglu"), ((None, None), "swiglu")):
                got = fn(x[:T], wg, None, wd, None, logits[:T], k, activation=act, folded=folded)
                assert torch.equal(got, fn(x[:T], wg, None, wd, None, logits[:T], k, activation=act)), (fn, act)
        with pytest.raises(TypeError, match=r"float32 / bfloat16 / float16 x, got torch.float64"):
            fn(x[:0].double(), wg, None, wd, None, logits[:0], k)
    w, ids = route(logits, k)
    for backend in ("reference", "auto"):
        with pytest.raises(TypeError, match="dtype=torch.int32 is not supported"):
            moe_op.moe_experts(x, wg, None, wd, None, w, ids, out_dtype=torch.int32, backend=backend)
    assert router_max_tokens(0) == router_max_tokens(1) >= 1


def test_moe_triton_refuses_packed_experts_of_another_layer(rng):
    """moe_triton's packed experts must be of the experts given (the kernels took E, 2I and H from the packed pair:
    another layer's, or the full layer's for an expert range, ran with no error). Checked before any kernel, so
    here on the CPU with stand-ins of the packed shapes."""
    from mxkit.kernels.moe import moe_triton

    E, k = 4, 2
    wg = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    wd = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    x = torch.randn(3, H, generator=rng).to(torch.bfloat16)
    w, ids = route(torch.randn(3, E, generator=rng), k)
    for shapes in (((2 * E, 2 * I, H), (2 * E, H, I)), ((E, 2 * I, H), (E, 2 * H, I))):
        packed = tuple(SimpleNamespace(shape=torch.Size(s)) for s in shapes)
        with pytest.raises(ValueError, match="were not made from these experts"):
            moe_triton(x, wg, None, wd, None, w, ids, packed=packed)


def test_moe_reference_helpers_refuse_what_gave_garbage(rng):
    """From a bad-input audit: the public reference helpers check devices, counts and ids (a CPU operand times a meta
    one is uninitialised memory in torch; top_k=-1 gave all-zero rows; a combine with fewer weight rows than
    tokens dropped pairs), each refusal naming the argument; the good calls give what they gave."""
    import mxkit.moe_reference as mr
    from mxkit.moe import router_gpt_oss

    x = torch.randn(5, 64, generator=rng).bfloat16()
    w = torch.randn(4, 64, generator=rng).bfloat16()
    for call in (lambda: mr.router_logits(x, w.to("meta")), lambda: router_gpt_oss(x, w.to("meta"), None, 2),
                 lambda: mr.router_logits(x, w, torch.zeros(4, dtype=torch.bfloat16, device="meta"))):
        with pytest.raises(ValueError, match="must share one device, got x on cpu, weight on (cpu|meta)"):
            call()
    with pytest.raises(TypeError, match="router_logits: x must be a tensor, got list"):
        mr.router_logits([1], w)
    wq = mxkit.quantize(torch.randn(4, 8, 64, generator=rng), "mxfp4")
    a = torch.randn(5, 64, generator=rng)
    tw, ti = route(torch.randn(5, 4, generator=rng), 2)
    s, e, P = mr.align_block_size(ti, 4, 16)
    good = mr.grouped_matmul_reference(a, wq, s, e, 16, 2)
    assert torch.equal(mr.grouped_matmul_reference(a, wq, s, e, np.int64(16), np.int64(2)), good)
    assert int((good != 0).any(1).sum()) == 10  # (the 10 pairs; padding rows 0)
    for kw, error, match in ((dict(top_k=-1), ValueError, "top_k=-1 must be an int >= 1"),
                             (dict(top_k=0), ValueError, "top_k=0 must be an int >= 1"),
                             (dict(top_k=2.0), ValueError, "top_k=2.0 must be an int >= 1"),
                             (dict(top_k=1), ValueError, r"holds ids in \[0, 10\], outside \[0, T \* top_k = 5\]"),
                             (dict(gather="yes"), TypeError, "gather must be a bool"),
                             (dict(s=s.tolist()), TypeError, "sorted_token_ids must be an int32 / int64 tensor"),
                             (dict(e=e.float()), TypeError, "expert_ids must be an int32 / int64 tensor"),
                             (dict(wq=wq.to("meta")), ValueError, "w on meta")):
        args = dict(a=a, wq=wq, s=s, e=e, block_m=16, top_k=2, gather=True) | kw
        with pytest.raises(error, match=match):
            mr.grouped_matmul_reference(args["a"], args["wq"], args["s"], args["e"], args["block_m"], args["top_k"],
                                        gather=args["gather"])
    with pytest.raises(ValueError, match="num_tokens=-1 must be an int >= 0"):
        mr.grouped_matmul_reference(torch.randn(P, 64), wq, s, e, 16, 2, gather=False, num_tokens=-1)
    y = torch.randn(P, 8, generator=rng)
    assert mr.combine_reference(y, s, tw).shape == (5, 8)
    for args, error, match in (((y, s, tw[:2]), ValueError, r"outside \[0, T \* k = 4\]"),
                               ((y, s - 100, tw), ValueError, r"holds ids in \[-100, -90\]"),
                               ((y[:, 0], s, tw), ValueError, "takes y \\(P, H\\)"),
                               ((y[:-1], s, tw), ValueError, "takes y \\(P, H\\)"),
                               ((y, s.float(), tw), TypeError, "sorted_token_ids must be an int32 / int64 tensor"),
                               ((y.long(), s, tw), TypeError, "y must be a float tensor"),
                               ((y, s, tw.to("meta")), ValueError, "topk_weights on meta")):
        with pytest.raises(error, match=match):
            mr.combine_reference(*args)
    for args, error, match in (((ti, 4, 2**40), ValueError, "block_m=1099511627776 does not fit"),
                               ((ti, 2**40, 16), ValueError, "num_experts=1099511627776 does not fit"),
                               ((ti.to("meta"), 4, 16), NotImplementedError, "meta tensor does not hold"),
                               ((ti, 4, 0), ValueError, "block_m=0 must be an int >= 1"),
                               ((ti[:0], 4, 2**31), ValueError, "block_m=2147483648 does not fit")):
        with pytest.raises(error, match=match):
            mr.align_block_size(*args)
    assert [torch.equal(u, v) for u, v in zip(mr.align_block_size(ti, np.int64(4), np.int64(16)), (s, e))] == [True] * 2
    with pytest.raises(ValueError, match=r"the padded length P = [2-4] blocks x block_m=1073741824 does not fit"):
        mr.align_block_size(ti, 4, 2**30)  # (P >= 2^31: refused before its allocation, 8+ GiB of int32)
    for fn in (mr.swiglu, mr.swiglu_gpt_oss):
        with pytest.raises(TypeError, match="takes a float tensor"):
            fn(torch.ones(3, 4, dtype=torch.int32))
        with pytest.raises(TypeError, match="takes a float tensor .* got list"):
            fn([1, 2])
    with pytest.raises(ValueError, match=r"expert slice \[1.0, 3.0\) is outside"):
        mr.select_experts(wq, 1.0, 3.0)
    assert mr.select_experts(wq, np.int64(1), np.int64(3)).shape == (2, 8, 64)


def test_folded_layers_refuse_what_they_cannot_run(rng):
    """moe_w4a8_folded / moe_mxfp4_folded (public, CUDA): a None entry (experts that did not fold), a swapped or
    misshapen pair, and an x off CUDA are refused by name (AssertionError / AttributeError before)."""
    from mxkit.kernels.moe import fold_experts

    E, H, I, k = 4, 64, 32, 2  # noqa: E741
    w1 = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    w2 = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    f1, f2 = fold_experts(w1), fold_experts(w2)
    x, logits = torch.randn(3, H, generator=rng), torch.randn(3, E, generator=rng)
    for fn in (moe_op.moe_w4a8_folded, moe_op.moe_mxfp4_folded):
        for folded, error, match in (((None, None), ValueError, "holds None"), ((f1, None), ValueError, "holds None"),
                                     ((f2, f1), ValueError, r"do not fit x \(\.\.\., H=64\)"),
                                     ([f1, f2], TypeError, "must be the \\(gate_up, down\\) pair"),
                                     ((f1, f2), ValueError, "run on CUDA only \\(x on cpu\\)")):
            with pytest.raises(error, match=match):
                fn(x, folded, None, None, logits, k)
        with pytest.raises(ValueError, match="route over 5 experts but the folded experts hold 4"):
            fn(x, (f1, f2), None, None, torch.randn(3, 5, generator=rng), k)


def test_from_mx_refuses_a_block_size_other_than_the_experts(rng):
    """MXMoE.from_mx(..., block_size=16 / 64): a ValueError naming block_size (torch's RuntimeError of the scales'
    copy, "The size of tensor a (4) must match ...", before); block_size=32 builds the module on the experts' bytes."""
    E, k = 3, 2
    w1 = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4")
    w2 = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4")
    router = nn.Linear(H, E)
    for bad in (16, 64):
        with pytest.raises(ValueError, match=f"block_size={bad}: from_mx holds the experts' own blocks of 32"):
            MXMoE.from_mx(router, w1, None, w2, None, k, block_size=bad)
    m = MXMoE.from_mx(router, w1, None, w2, None, k, block_size=np.int64(32))
    assert torch.equal(m.gate_up_qdata, w1.qdata) and torch.equal(m.down_scale, w2.scale)
