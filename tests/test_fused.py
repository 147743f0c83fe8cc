"""Sibling MXLinear layers as one GEMM (:mod:`mxkit.nn.fused`): the same outputs as the members (within issue
#22's bound, bitwise on the CPU reference), one fused GEMM per group and input, state moves with ``.to()``,
and an HF Llama decoder built from a config gives the logits of the unfused model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import mxkit
from conftest import assert_graph_replays
from mxkit.nn import FusedMXLinear, FusedPart, MXLinear, fuse_siblings

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


class _Attn(nn.Module):
    def __init__(self, K: int, bias: bool):
        super().__init__()
        self.q_proj = nn.Linear(K, 96, bias=bias)
        self.k_proj = nn.Linear(K, 32, bias=bias)
        self.v_proj = nn.Linear(K, 32, bias=bias)
        self.o_proj = nn.Linear(96, K, bias=False)

    def forward(self, x):
        return self.o_proj(self.q_proj(x) * torch.cat([self.k_proj(x), self.v_proj(x), self.k_proj(x)], -1))


def _model(K=128, bias=True, device="cpu", dtype=torch.float32, g=None):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    return nn.Sequential(_Attn(K, bias), _Attn(K, not bias)).to(device=device, dtype=dtype)


def test_fuse_siblings_outputs_and_calls(rng):
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 5, 128, generator=rng)
    want = model(x)
    parts = [dict(model.named_modules())[f"{i}.{n}"] for i in range(2) for n in ("q_proj", "k_proj", "v_proj")]
    names = fuse_siblings(model)
    assert names == ["0.q_proj_k_proj_v_proj", "1.q_proj_k_proj_v_proj"]
    assert all(isinstance(m, FusedPart) for i in range(2) for m in (model[i].q_proj, model[i].k_proj))
    assert isinstance(model[0].o_proj, MXLinear)  # not a member of any group
    calls = []
    for i in range(2):
        g = getattr(model[i], "q_proj_k_proj_v_proj")
        f = g.fused.forward
        g.fused.forward = lambda x, f=f: calls.append(1) or f(x)
    got = model(x)
    assert torch.equal(got, want)  # the CPU reference: the same float32 sums column by column
    # each layer's three members share one GEMM; its k_proj, called twice with x, recomputes the second time
    assert len(calls) == 4
    # a member called alone with another input still gets its own output
    y = torch.randn(2, 128, generator=rng)
    assert torch.equal(model[0].k_proj(y), parts[1](y))
    # an in-place change between two members' calls is seen
    g0 = getattr(model[0], "q_proj_k_proj_v_proj")
    z = torch.randn(2, 128, generator=rng)
    q = model[0].q_proj(z)
    z.mul_(2)
    assert torch.equal(model[0].k_proj(z), parts[1](z))
    assert torch.equal(q, parts[0](z / 2))
    del g0


def test_fused_under_inference_mode(rng):
    """Inference-mode tensors keep no version counter: the fused parts still run (one GEMM per group)."""
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 128, generator=rng)
    want = model(x)
    fuse_siblings(model)
    with torch.inference_mode():
        assert torch.equal(model(x.clone()), want)


def test_fused_state_dict_and_mismatches(rng):
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False, fuse=True)
    keys = set(model.state_dict())
    assert "0.q_proj_k_proj_v_proj.fused.weight_qdata" in keys and not any(".q_proj." in k for k in keys)
    other = _model(g=rng)
    mxkit.quantize_model(other, "mxfp4", progress=False, compute_qsnr=False, fuse=True)
    other.load_state_dict(model.state_dict())
    x = torch.randn(4, 128, generator=rng)
    assert torch.equal(other(x), model(x))
    a, b = MXLinear(64, 16, "mxfp4"), MXLinear(64, 16, "mxfp8")
    with pytest.raises(ValueError, match="share"):
        FusedMXLinear([a, b])
    with pytest.raises(ValueError, match="two or more"):
        FusedMXLinear([a])
    with pytest.raises(ValueError, match="plain MXLinear layers.*got a Linear"):
        FusedMXLinear([a, nn.Linear(64, 16)])

    class Shard(MXLinear):  # (as a tensor-parallel shard: a forward of its own, which stacked rows would skip)
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(ValueError, match="plain MXLinear layers.*got a Shard"):
        FusedMXLinear([MXLinear(64, 16, "mxfp4"), Shard(64, 16, "mxfp4")])


def test_fused_output_kept_only_for_the_same_weights(rng):
    """A part served after a load_state_dict (or an in-place edit of the fused weight) recomputes; a module left
    with one part read pickles (its kept output is a weak reference, dropped from the state); biases that differ
    in requires_grad are not fused (the fused bias would train the frozen ones)."""
    import io

    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False, fuse=True)
    other = _model(g=rng)
    mxkit.quantize_model(other, "mxfp4", progress=False, compute_qsnr=False, fuse=True)
    x = torch.randn(2, 128, generator=rng)
    model[0].q_proj(x)  # the fused output kept for k and v
    buf = io.BytesIO()
    torch.save(model, buf)  # (raised "cannot pickle 'weakref.ReferenceType'")
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    assert torch.equal(again[0].k_proj(x), model[0].k_proj(x))
    model[0].q_proj(x)
    model.load_state_dict(other.state_dict())
    assert torch.equal(model[0].k_proj(x), other[0].k_proj(x))  # (was the old weights' k)
    lin = [MXLinear.from_linear(nn.Linear(64, 16), "mxfp4") for _ in range(3)]
    lin[1].bias.requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        FusedMXLinear(lin)


def test_fuse_siblings_leaves_cross_attention_alone(rng):
    model = nn.Module()
    model.self_attn, model.encoder_attn = _Attn(128, True), _Attn(128, True)
    model.cross_attn, model.vision_cross_attn = _Attn(128, True), _Attn(128, True)  # (Mllama's, SAM 3's names)
    mxkit.quantize_model(model, "mxfp8", progress=False, compute_qsnr=False)
    assert fuse_siblings(model) == ["self_attn.q_proj_k_proj_v_proj"]
    for name in ("encoder_attn", "cross_attn", "vision_cross_attn"):
        assert isinstance(getattr(model, name).q_proj, MXLinear), name


def test_llama_decoder_fused_matches(rng):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))  # (a fresh model each run)
    model = transformers.LlamaForCausalLM(cfg).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False)
    ids = torch.randint(0, 64, (2, 9), generator=rng)
    with torch.no_grad():
        want = model(ids).logits
        assert fuse_siblings(model) == [f"model.layers.{i}.{g}" for i in range(2)
                                        for g in ("self_attn.q_proj_k_proj_v_proj", "mlp.gate_proj_up_proj")]
        got = model(ids).logits
    assert torch.equal(got, want)
    # every member read its slice once: no fused output is kept past the forward
    assert all(m._last is None for m in model.modules() if isinstance(m, FusedMXLinear))


@pytest.mark.gpu
@gpu
def test_gpu_fused_llama_decode_in_a_cuda_graph(rng):
    """On the GPU (decode-mma at M = 16: 8 tokens a sequence, so that the attention reads q and k, whose softmax
    weight is 1 at one token): the fused model's logits within bf16 tolerance of the unfused one's, and a layer's
    fused projections captured in a CUDA graph replay (M = 2) to the eager bytes."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))  # (a fresh model each run)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False)
    ids = torch.randint(0, 256, (2, 8), generator=rng).cuda()
    with torch.no_grad():
        want = model(ids).logits.float()
        fuse_siblings(model)
        got = model(ids).logits.float()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        layer = model.model.layers[0]
        x = torch.randn(2, 512, generator=rng).to("cuda", torch.bfloat16)

        def step(x):
            a = layer.self_attn
            return a.q_proj(x), a.k_proj(x), a.v_proj(x), layer.mlp(x)

        # (captured outputs poisoned before each replay, new x each time, against eager steps byte for byte)
        assert_graph_replays(step, [x], lambda: [torch.randn(2, 512, generator=rng).to("cuda", torch.bfloat16)])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fuse,mode", [(False, None), (False, "reduce-overhead"), (True, None),
                                       (True, "reduce-overhead")])
def test_gpu_llama_under_torch_compile(fuse, mode, rng):
    """torch.compile(fullgraph=True) of a quantized (and fused) Llama on the GPU: an MXLinear is one custom op
    (``mxkit::mx_linear``), a fused group's GEMM too (``mxkit::mx_fused``); both run the eager kernels (their
    driver-API launches are not traceable), also under ``mode="reduce-overhead"``. The compiled model's logits
    are the eager model's within bf16 tolerance (Inductor fuses the bf16 norms and adds, rounding once where
    eager rounds each op), and a fused group runs one GEMM per input (decode-mma launches counted: the parts share
    it in the traced graph; a cache at run time lost it where Inductor handed layer 0's parts other copies of x, or
    freed q's and k's slices before v ran). 8 tokens a sequence (M = 16, decode-mma): the attention reads q and k
    (at one token its softmax weight is 1 whatever they are)."""
    transformers = pytest.importorskip("transformers")
    from mxkit.kernels.matmul_details import _mma_calls as kmm

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False, fuse=fuse)
    ids = torch.randint(0, 256, (2, 8), generator=rng).cuda()
    compiled = torch.compile(model, dynamic=False, fullgraph=True, mode=mode)
    with torch.no_grad():
        want = model(ids).logits
        got = compiled(ids).logits
        torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
        if mode is not None:  # CUDA graphs of the compiled model: replays with new token ids
            for _ in range(2):
                ids2 = torch.randint(0, 256, (2, 8), generator=rng).cuda()
                torch.testing.assert_close(compiled(ids2).logits.float(), model(ids2).logits.float(), rtol=3e-2,
                                           atol=3e-2)
            return
        calls = []
        real = kmm.MmaCall.__call__

        def counting(self, *a):
            calls.append(1)
            return real(self, *a)

        kmm.MmaCall.__call__ = counting
        try:
            assert torch.equal(compiled(ids).logits, got)  # (the same compiled graph: the same bits)
        finally:
            kmm.MmaCall.__call__ = real
    assert len(calls) == (8 if fuse else 14)  # per layer: qkv, o, gate_up, down fused; else 7 projections


def test_fused_custom_op(rng):
    """``mxkit::mx_fused`` (torch.compile's view of a CUDA group's GEMM) gives the fused layer's output, bit for bit,
    eagerly and under torch.compile (fullgraph, the aot_eager backend: no compiler on CPU); its fake has that
    shape, contiguous."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16, 16)])
    x = torch.randn(3, 64, generator=rng)
    with torch.no_grad():
        want = group.fused(x)
        key = group.fused.weight_qdata
        op = torch.compile(lambda t: torch.ops.mxkit.mx_fused(t, key), fullgraph=True, backend="aot_eager")
        assert torch.equal(torch.ops.mxkit.mx_fused(x, key), want) and torch.equal(op(x), want)
    with FakeTensorMode() as mode:
        fake = torch.ops.mxkit.mx_fused(mode.from_tensor(x), mode.from_tensor(key))
    assert fake.shape == (3, 64) and fake.is_contiguous() and fake.dtype == want.dtype


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_compiled_parts_share_one_traced_gemm(rng, order):
    """Under torch.compile the group's parts called with one input share one fused GEMM in the traced graph
    (counted where it is traced: one GEMM per input), in any order of the parts, with each part's
    columns bit for bit; a second input traces a GEMM of its own; what the trace keeps is dropped once every part
    has its slice, and every compiled call gives the eager values."""
    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16, 16)])
    traced = []
    real = group.fused.forward

    def forward(t):
        if torch.compiler.is_compiling():
            traced.append(1)
        return real(t)

    group.fused.forward = forward

    def step(a, b):
        out = {i: group.output(a, i) for i in order}
        return [out[i] for i in range(3)], [group.output(b, i) for i in range(3)]

    x, x2 = (torch.randn(3, 64, generator=rng) for _ in range(2))
    with torch.no_grad():
        want, want2 = group(x), group(x2)
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        got, got2 = compiled(x, x2)
        assert group._traced[0] is None and len(traced) == 2  # (Dynamo replays the traced appends on each call)
        again, _ = compiled(x2, x)
        assert len(traced) == 4
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and all(torch.equal(g, w) for g, w in zip(got2, want2))
    assert all(torch.equal(g, w) for g, w in zip(again, want2))


def test_fused_parts_share_one_gemm_across_views_of_one_base(rng):
    """Compiled code hands each part a new view object of one buffer: views of one base with the same data
    pointer, shape and strides share the fused GEMM; another view of that base (other rows) recomputes."""
    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16)])
    base = torch.randn(4, 64, generator=rng)
    calls = []
    real = group.fused.forward
    group.fused.forward = lambda t: calls.append(1) or real(t)
    with torch.no_grad():
        a = group.output(base[:2], 0)
        b = group.output(base[:2], 1)  # a new view object, the same geometry: no second GEMM
        assert len(calls) == 1
        c = group.output(base[2:], 0)  # other rows of the same base: recomputed
        assert len(calls) == 2
        top, bottom = group(base[:2].clone()), group(base[2:].clone())
    assert torch.equal(a, top[0]) and torch.equal(b, top[1]) and torch.equal(c, bottom[0])


def test_eager_parts_keep_the_fused_output_until_every_part_has_read_it(rng):
    """Eager calls keep the fused output until every part has read it (HF's MLP drops gate's output before it calls
    up), then drop it; a part called again after that recomputes."""
    import gc

    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16, 16)])
    x = torch.randn(3, 64, generator=rng)
    calls = []
    real = group.fused.forward
    group.fused.forward = lambda t: calls.append(1) or real(t)
    with torch.no_grad():
        want = group(x)
        calls.clear()
        group.output(x, 0)  # part 0's slice dropped at once
        gc.collect()
        b = group.output(x, 1)
        assert len(calls) == 1 and group._last is not None
        c = group.output(x, 2)
        assert len(calls) == 1 and group._last is None
        a = group.output(x, 0)
        assert len(calls) == 2
    assert all(torch.equal(g, w) for g, w in zip((a, b, c), want))
    # a part index out of range is refused before the GEMM (it ran it, then counted the bad index as a part, so
    # the output was kept past its last part); -1 is not part 2; NumPy integers are indices
    np = pytest.importorskip("numpy")
    calls.clear()
    kept = group._last and (group._last[2], set(group._last[3]))
    with torch.no_grad():
        for bad, err in ((3, IndexError), (-1, IndexError), (1.0, TypeError), (True, TypeError), ("0", TypeError)):
            with pytest.raises(err):
                group.output(x, bad)
        assert calls == [] and (group._last and (group._last[2], set(group._last[3]))) == kept
        assert torch.equal(group.output(x, np.int64(1)), want[1])


@pytest.mark.parametrize("first", ["no_grad", "x_without_grad"])
def test_fused_output_without_a_graph_is_not_served_to_a_grad_call(first, rng):
    """The first part called where its output carries no graph (under no_grad; or, bias-free members, before
    ``x.requires_grad_()``), then its sibling with gradients on and the same input: the sibling recomputes, its
    output carries the graph, and x's gradient is the one the unfused layers give (the cached output would carry
    none)."""
    bias = first == "no_grad"
    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n, bias=bias), "mxfp4") for n in (32, 16)])
    x = torch.randn(4, 64, generator=rng, requires_grad=bias)
    if first == "no_grad":
        with torch.no_grad():
            group.output(x, 0)
    else:
        assert not group.output(x, 0).requires_grad
        x.requires_grad_(True)
    k = group.output(x, 1)
    assert k.requires_grad
    k.sum().backward()
    w = group.fused.dequantize_weight(torch.float32)[32:48]
    assert torch.allclose(x.grad, w.sum(0).expand(4, 64))


def test_fused_output_is_not_served_to_a_dual_input(rng):
    """A dual tensor (forward mode) is a view of its primal with the same pointer, shape, strides and version: a
    part called with it after a sibling's plain call recomputes, and its tangent is the unfused layer's (the
    cached output, made without a tangent, was served: tangent None). Two duals of one primal get their own."""
    import torch.autograd.forward_ad as fwad

    layers = [MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16)]
    group = FusedMXLinear(layers)
    x, t1, t2 = (torch.randn(3, 64, generator=rng) for _ in range(3))
    with fwad.dual_level():
        want = [fwad.unpack_dual(layers[1](fwad.make_dual(x, t))).tangent for t in (t1, t2)]
        group.output(x, 0)
        got = fwad.unpack_dual(group.output(fwad.make_dual(x, t1), 1)).tangent
        assert got is not None and torch.allclose(got, want[0], rtol=1e-5, atol=1e-5)
        got = fwad.unpack_dual(group.output(fwad.make_dual(x, t2), 0)).tangent  # (part 0, served already: new)
        assert got is not None
        got = fwad.unpack_dual(group.output(fwad.make_dual(x, t2), 1)).tangent
        assert torch.allclose(got, want[1], rtol=1e-5, atol=1e-5)


def test_fused_group_copies_and_pickles_after_compile(rng):
    """A group compiled in place (``group.compile()``) deep-copies without the compiled call (the copy ran the
    original's weights after loading others) and pickles (it raised PicklingError); bad constructor arguments
    are named (they raised IndexError / "has no len()")."""
    import copy
    import pickle

    mk = lambda: MXLinear.from_linear(nn.Linear(64, 32), "mxfp4")  # noqa: E731
    group, other = FusedMXLinear([mk(), mk()]), FusedMXLinear([mk(), mk()])
    group.compile(backend="eager")
    dup = copy.deepcopy(group)
    assert "_compiled_call_impl" not in dup.__dict__
    dup.load_state_dict(other.state_dict())
    x = torch.randn(2, 64, generator=rng)
    with torch.no_grad():
        assert torch.equal(dup(x)[0], other(x)[0])
        assert torch.equal(pickle.loads(pickle.dumps(group))(x)[0], group(x)[0])
    with pytest.raises(ValueError, match=r"index=2 must be a part of the group: 0 \.\. 1"):
        FusedPart(group, 2)
    assert FusedPart(group, np.int64(1)).index == 1  # (as group.output takes it; "np.int64(0) must be a part")
    with pytest.raises(ValueError, match="fuses plain MXLinear layers, as fuse_siblings and MXGatedMLP do; got a "
                                         "NoneType"):  # (None was the check's own "no other layer": AttributeError)
        FusedMXLinear([mk(), None])
    with pytest.raises(TypeError, match="FusedPart takes a FusedMXLinear, got MXLinear"):
        FusedPart(mk(), 0)
    for bad in ((m for m in (mk(), mk())), mk()):
        with pytest.raises(TypeError, match="FusedMXLinear takes a sequence of MXLinear layers"):
            FusedMXLinear(bad)


def test_fuse_siblings_fuses_members_shared_by_two_parents_once(rng):
    """Tied layers: two parents holding the same MXLinear objects get one FusedMXLinear, registered on both (one
    copy of the stacked weight, as the members were one copy), with the unfused outputs."""
    mk = lambda: MXLinear.from_linear(nn.Linear(64, 32), "mxfp4")  # noqa: E731
    shared = [mk(), mk()]
    m = nn.Module()
    m.a, m.b = nn.Module(), nn.Module()
    for p in (m.a, m.b):
        p.gate_proj, p.up_proj = shared
    x = torch.randn(3, 64, generator=rng)
    want = [shared[0](x), shared[1](x)]
    assert fuse_siblings(m) == ["a.gate_proj_up_proj", "b.gate_proj_up_proj"]
    assert m.a.gate_proj_up_proj is m.b.gate_proj_up_proj
    assert len(list(m.buffers())) == 2  # one stacked qdata and one scale (buffers() dedups shared modules)
    for p in (m.a, m.b):
        assert torch.equal(p.gate_proj(x), want[0]) and torch.equal(p.up_proj(x), want[1])


def test_fuse_siblings_leaves_a_group_whose_name_is_taken(rng):
    """A group whose joined name the parent already has (a module of that name, or an earlier group: "a" + "b_c"
    and "a_b" + "c" both join to "a_b_c") is left alone: the existing module and the first group stay registered,
    so state_dict and .to() still see every weight."""
    mk = lambda: MXLinear.from_linear(nn.Linear(64, 32), "mxfp4")  # noqa: E731
    m = nn.Module()
    m.a, m.b_c, m.a_b, m.c = mk(), mk(), mk(), mk()
    x = torch.randn(3, 64, generator=rng)
    want = {n: getattr(m, n)(x) for n in ("a", "b_c", "a_b", "c")}
    assert fuse_siblings(m, [("a", "b_c"), ("a_b", "c")]) == ["a_b_c"]
    assert type(m.a_b).__name__ == "MXLinear" and type(m.c).__name__ == "MXLinear"
    assert len(list(m.buffers())) == 2 + 2 * 2  # (the fused pair's qdata and scale, and the two left alone's)
    for n, y in want.items():
        torch.testing.assert_close(getattr(m, n)(x), y, rtol=1e-6, atol=1e-6)
    q = nn.Module()
    q.q, q.k, q.q_k = mk(), mk(), nn.Linear(3, 3)
    assert fuse_siblings(q, [("q", "k")]) == [] and isinstance(q.q_k, nn.Linear)


def test_fused_model_under_vmap(rng):
    """torch.func.vmap of a fused model (its input a BatchedTensor, which has no data pointer to key the reuse by)
    gives the unfused model's vmap, bit for bit (raised "Cannot access data pointer of Tensor that doesn't have
    storage"); eager calls still share one GEMM afterwards."""
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(4, 3, 128, generator=rng)
    with torch.no_grad():  # (MXLinear's gradient Function has no functorch rule: vmap it without autograd)
        want = torch.func.vmap(model)(x)
        fuse_siblings(model)
        got = torch.func.vmap(model)(x)
        assert torch.equal(got, want)
        assert torch.equal(torch.func.vmap(model, in_dims=1, out_dims=1)(x.transpose(0, 1)), want.transpose(0, 1))
        group = getattr(model[0], "q_proj_k_proj_v_proj")
        assert group._last is None  # nothing kept for a BatchedTensor
        calls = []
        real = group.fused.forward
        group.fused.forward = lambda t: calls.append(1) or real(t)
        y = torch.randn(2, 128, generator=rng)
        model[0].q_proj(y), model[0].k_proj(y)
        assert len(calls) == 1


def test_fuse_siblings_rejects_malformed_groups(rng):
    """A flat tuple of names (one group, not a list of groups) iterated the names' characters and fused nothing;
    a str group, a non-str name, groups that are not iterable or a model that is not a module raise TypeError with
    the right form, a group naming a layer twice ValueError, before the model is touched."""
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    before = dict(model.named_modules())
    for bad in (("q_proj", "k_proj", "v_proj"), "q_proj", [("q_proj", 1)], [("q_proj", "k_proj"), 7]):
        with pytest.raises(TypeError, match=r"list of groups of sibling names, e\.g\. \[\('q_proj', 'k_proj'"):
            fuse_siblings(model, bad)
    with pytest.raises(TypeError, match=r"pass \[names\]"):
        fuse_siblings(model, ("q_proj", "k_proj", "v_proj"))
    with pytest.raises(TypeError, match="got 5"):  # (was: 'int' object is not iterable)
        fuse_siblings(model, 5)
    with pytest.raises(ValueError, match="names a layer more than once"):  # (fused a layer with itself: 2x memory)
        fuse_siblings(model, [("q_proj", "q_proj")])
    for one in ([("q_proj",)], [()]):  # (skipped without a word)
        with pytest.raises(ValueError, match="names fewer than two layers: nothing to fuse"):
            fuse_siblings(model, one)
    with pytest.raises(TypeError, match="takes an nn.Module, got list"):
        fuse_siblings([model])
    assert dict(model.named_modules()) == before
    # the right forms: a list of groups, one group in a list, a generator of lists
    want = ["0.q_proj_k_proj_v_proj", "1.q_proj_k_proj_v_proj"]
    assert fuse_siblings(model, [("q_proj", "k_proj", "v_proj")]) == want
    other = _model(g=rng)
    mxkit.quantize_model(other, "mxfp4", progress=False, compute_qsnr=False)
    assert fuse_siblings(other, (list(n) for n in [("q_proj", "k_proj")])) == ["0.q_proj_k_proj", "1.q_proj_k_proj"]


def test_fused_part_rejects_a_non_tensor(rng):
    """A fused part given a list raises the member MXLinear's TypeError (was AttributeError: 'list' object has no
    attribute 'is_inference')."""
    model = _model(g=rng)
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = [[0.0] * 128]
    with pytest.raises(TypeError, match=r"MXLinear takes a float tensor \(\.\.\., 128\), got list") as unfused:
        model[0].k_proj(x)
    fuse_siblings(model)
    with pytest.raises(TypeError) as fused:
        model[0].k_proj(x)
    assert str(fused.value) == str(unfused.value)
    with pytest.raises(TypeError, match="got list"):
        getattr(model[0], "q_proj_k_proj_v_proj").output(x, 0)


# layers of different act_format must not be fused
def test_fuse_siblings_leaves_siblings_of_different_act_format_alone():
    parent = nn.Module()
    parent.q_proj = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4", act_format="mxfp8_e4m3")
    parent.k_proj = MXLinear.from_linear(nn.Linear(64, 16), "mxfp4")
    parent.v_proj = MXLinear.from_linear(nn.Linear(64, 16), "mxfp4")
    x = torch.randn(3, 64)
    want = [parent.q_proj(x), parent.k_proj(x)]
    with pytest.raises(ValueError, match="share"):
        FusedMXLinear([parent.q_proj, parent.k_proj])
    assert fuse_siblings(parent) == []
    assert torch.equal(parent.q_proj(x), want[0]) and torch.equal(parent.k_proj(x), want[1])


# the reuse key must hold the view's shape (same data pointer and strides, fewer rows)
def test_fused_part_with_a_shorter_view_of_the_same_base_recomputes():
    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16)])
    base = torch.randn(4, 64)
    with torch.no_grad():
        group.output(base, 0)
        b = group.output(base[:2], 1)  # same data_ptr and strides as base, 2 rows
        want = group(base[:2].clone())[1]
    assert b.shape == (2, 16)
    assert torch.equal(b, want)


def test_fused_part_with_a_negated_view_of_the_same_base_recomputes(rng):
    """x and a view of it with the sign bit (torch._neg_view; c.imag and c.conj().imag) share base, pointer, geometry
    and version: the second part recomputes for the negated values (it was served the first part's output)."""
    group = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, n), "mxfp4") for n in (32, 16)])
    x = torch.randn(4, 64, generator=rng)
    c = torch.randn(4, 64, dtype=torch.complex64, generator=rng)
    with torch.no_grad():
        for a, b in ((x, torch._neg_view(x)), (c.imag, c.conj().imag)):
            assert b.is_neg() and not a.is_neg()
            group.output(a, 0)
            got = group.output(b, 1)
            assert torch.equal(got, group(b.resolve_neg().clone())[1])


def test_fuse_siblings_leaves_hooked_or_patched_members_alone(rng):
    """A group with a member that has a forward / pre / backward / state_dict / load_state_dict hook or a forward
    patched on the instance is left alone (the FusedPart in its place would silently drop them; an MXLinear's own
    state_dict hooks do not count), also through quantize_model(fuse=True), which first carries each nn.Linear's
    hooks onto its MXLinear."""
    for how in ("pre", "post", "backward", "patched", "state_dict", "load"):
        model = _model(g=rng)
        q = model[0].q_proj
        if how == "pre":
            q.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        elif how == "post":
            q.register_forward_hook(lambda mod, args, out: out * 0)
        elif how == "backward":
            q.register_full_backward_hook(lambda *a: None)
        x = torch.randn(3, 128, generator=rng)
        mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
        if how == "patched":
            q = model[0].q_proj
            q.forward = lambda x, f=q.forward: f(x) * 0
        elif how == "state_dict":  # (written for the member's keys: the fused layer holds others)
            model[0].q_proj.register_state_dict_post_hook(lambda *a: None)
        elif how == "load":
            model[0].q_proj.register_load_state_dict_pre_hook(lambda *a: None)
        want = model(x)
        names = fuse_siblings(model)
        assert names == ["1.q_proj_k_proj_v_proj"], how  # (only the second layer's group)
        assert type(model[0].q_proj) is MXLinear and torch.equal(model(x), want), how
        again = _model(g=rng)
        if how == "post":
            again[0].q_proj.register_forward_hook(lambda mod, args, out: out * 0)
            mxkit.quantize_model(again, "mxfp4", progress=False, compute_qsnr=False, fuse=True)
            assert type(again[0].q_proj) is MXLinear and isinstance(again[1].q_proj, FusedPart)
            assert torch.equal(again[0].q_proj(x), torch.zeros(3, 96))


def test_kept_output_follows_the_weights():
    """A kept fused output is of the weights it was made with: a bias edited in place between two parts' calls, or
    the module moved / cast, makes it again (the next part read the output of the old bias)."""
    layers = [MXLinear.from_linear(nn.Linear(64, 32), "mxfp4") for _ in range(3)]
    g = FusedMXLinear(layers)
    x = torch.randn(4, 64)
    with torch.no_grad():
        g.output(x, 0)
        g.fused.bias.add_(1.0)
        assert torch.equal(g.output(x, 1), g.fused(x)[..., 32:64])
        g.output(x, 2)
        g.output(x, 0)  # (every part served: nothing kept)
        g.output(x, 0)  # (kept for parts 1 and 2)
        assert g._last is not None
        g.half()  # (the bias rounded to fp16: the kept output is of the float32 one)
        assert g._last is None and torch.equal(g.output(x, 1), g(x)[1])
        assert g.output(x.half(), 1).dtype == torch.float16


def test_kept_output_follows_weight_buffers_swapped_in():
    """Weight buffers of another group put in place with their versions unchanged (a load into ``fused`` itself with
    ``assign=True``, past the group's load hook): the next part gets the new weights' output, not the kept one."""
    mk = [lambda: MXLinear.from_linear(nn.Linear(64, n, bias=False), "mxfp4") for n in (32, 16)]
    ga, gb = FusedMXLinear([m() for m in mk]), FusedMXLinear([m() for m in mk])
    x = torch.randn(3, 64)
    with torch.no_grad():
        ga.output(x, 0)
        ga.fused.load_state_dict(gb.fused.state_dict(), assign=True)
        assert torch.equal(ga.output(x, 1), gb(x)[1])  # (was the old weights' part 1)
        ga.output(x, 0)
        ga.load_state_dict(gb.state_dict(), assign=True)  # (through the group: the kept output dropped at once)
        assert ga._last is None


def test_fused_state_dict_records_its_parts():
    """A fused state_dict keeps the parts' row counts: loading one of other parts with the same total rows (another
    q / k / v split) raises before anything is copied; the same parts load; a dict without the metadata loads."""
    mk = lambda n: MXLinear.from_linear(nn.Linear(64, n), "mxfp4")  # noqa: E731
    a, b, c = (FusedMXLinear([mk(n) for n in ns]) for ns in ((32, 16, 16), (16, 32, 16), (32, 16, 16)))
    before = a.fused.weight_qdata.clone()
    with pytest.raises(ValueError, match=r"parts \(16, 32, 16\).*\(32, 16, 16\)"):
        a.load_state_dict(b.state_dict())
    assert torch.equal(a.fused.weight_qdata, before)
    a.load_state_dict(c.state_dict())
    assert torch.equal(a.fused.weight_qdata, c.fused.weight_qdata)
    a.load_state_dict(dict(b.state_dict()))  # (no metadata: the rows alone, not checked)
    assert torch.equal(a.fused.weight_qdata, b.fused.weight_qdata)


def test_fused_bias_keeps_the_members_requires_grad():
    """Members with frozen biases give a frozen fused bias (it would train otherwise)."""
    lin = [MXLinear.from_linear(nn.Linear(64, 16), "mxfp4") for _ in range(2)]
    for m in lin:
        m.bias.requires_grad_(False)
    assert not FusedMXLinear(lin).fused.bias.requires_grad
    assert FusedMXLinear([MXLinear.from_linear(nn.Linear(64, 16), "mxfp4") for _ in range(2)]).fused.bias.requires_grad


def test_kept_output_follows_the_bias_requires_grad():
    """A bias unfrozen between two parts' calls: the second part gets an output with a graph (the kept one, made
    with the bias frozen, had none)."""
    g = FusedMXLinear([MXLinear.from_linear(nn.Linear(64, 32), "mxfp4") for _ in range(2)])
    x = torch.randn(4, 64)
    g.fused.bias.requires_grad_(False)
    assert not g.output(x, 0).requires_grad
    g.fused.bias.requires_grad_(True)
    k = g.output(x, 1)
    assert k.requires_grad
    k.sum().backward()
    assert g.fused.bias.grad is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_compiled_part_reads_weights_swapped_in(rng):
    """A part compiled inside torch.func.functional_call with another group's fused buffers multiplies by those (the
    group's handle op read its own); the group's own buffers keep that op."""
    import torch._dynamo

    ga, gb = (FusedMXLinear([MXLinear.from_linear(nn.Linear(256, 128), "mxfp4") for _ in range(2)]).cuda()
              for _ in "ab")
    x = torch.randn(2, 256, generator=rng).to("cuda", torch.bfloat16)
    names = ("fused.weight_qdata", "fused.weight_scale", "fused.bias")
    swap = {n: gb.get_submodule("fused").get_parameter(n[6:]) if n.endswith("bias") else gb.get_buffer(n)
            for n in names}
    part = FusedPart(ga, 1)

    def swapped(x):
        return torch.func.functional_call(part, {"group." + n: t for n, t in swap.items()}, (x,))

    with torch.no_grad():
        want = gb.output(x, 1).clone()
        torch._dynamo.reset()
        got = torch.compile(swapped, fullgraph=True)(x)
        own = torch.compile(part, fullgraph=True)(x)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert torch.equal(own.view(torch.int16), ga.output(x, 1).view(torch.int16))
