"""A gated MLP's gate / up GEMM and SiLU product in one launch (:mod:`mxkit.nn.gated_mlp`): on the CPU (the
interleaved GEMM, then HF's ``silu(gate) * up``) the bytes of the unfused MXLinear layers; on the GPU (the MoE
pairs kernel over one expert, one row) within a row-wise bound of the float64 product, with byte-equal CUDA graph
replays and torch.compile, and made again for a loaded or repacked weight; which modules are and are not
replaced."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import mxkit
from conftest import assert_graph_replays, poison_allocator, scale_bytes
from mxkit.nn import MXGatedMLP, MXLinear, fuse_gated_mlp, fuse_siblings
from mxkit.nn._ops import module_of_key

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


class _MLP(nn.Module):
    """HF's gated MLP (LlamaMLP's forward)."""

    def __init__(self, H: int, I: int, act: nn.Module = None, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=bias)
        self.up_proj = nn.Linear(H, I, bias=bias)
        self.down_proj = nn.Linear(I, H, bias=False)
        self.act_fn = nn.SiLU() if act is None else act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _seed(rng) -> None:
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))  # (fresh weights each run)


def test_gated_mlp_gives_the_unfused_bytes_on_the_cpu(rng):
    _seed(rng)
    model = nn.Sequential(_MLP(64, 96), _MLP(64, 32))
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 5, 64, generator=rng)
    with torch.no_grad():
        want = model(x)
        acts = [m.act_fn(m.gate_proj(x)) * m.up_proj(x) for m in model]
        assert fuse_gated_mlp(model) == ["0", "1"]
        assert all(isinstance(m, MXGatedMLP) for m in model)
        assert torch.equal(model(x), want)  # (the same float32 sums, column by column; the same SiLU and product)
        assert all(torch.equal(m.act(x), a) for m, a in zip(model, acts))
    assert set(model[0].state_dict()) == {"gate_up.weight_qdata", "gate_up.weight_scale", "down_proj.weight_qdata",
                                          "down_proj.weight_scale"}


def test_gated_mlp_state_dict_moves_and_copies(rng):
    _seed(rng)
    a, b = _MLP(64, 32), _MLP(64, 32)
    for m in (a, b):
        mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    fa, fb = MXGatedMLP(a.gate_proj, a.up_proj, a.down_proj), MXGatedMLP(b.gate_proj, b.up_proj, b.down_proj)
    x = torch.randn(4, 64, generator=rng)
    with torch.no_grad():
        want = fa(x)
        assert not torch.equal(fb(x), want)
        fb.load_state_dict(fa.state_dict())
        assert torch.equal(fb(x), want)
        c = copy.deepcopy(fa)
        assert module_of_key(c.gate_up.weight_qdata, "gated", "t") is c and torch.equal(c(x), want)
        fa.compile(backend="aot_eager")  # (a compiled forward is not pickled: nn.Module's own state)
        d = pickle.loads(pickle.dumps(fa))
        assert module_of_key(d.gate_up.weight_qdata, "gated", "t") is d and torch.equal(d(x), want)
        assert torch.equal(fa.to(torch.device("cpu"))(x), want)


def test_fuse_gated_mlp_leaves_other_modules_alone(rng):
    _seed(rng)
    other_act = _MLP(64, 32, act=nn.GELU())
    biased = _MLP(64, 32, bias=True)
    dense = _MLP(64, 32)  # not quantized: nn.Linear members
    patched = _MLP(64, 32)
    model = nn.ModuleDict(dict(other_act=other_act, biased=biased, patched=patched))
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    patched.forward = lambda x: x  # (a forward patched on the instance: its computation is unknown)
    mixed = _MLP(64, 32)
    mxkit.quantize_model(mixed, "mxfp4", progress=False, compute_qsnr=False)
    mixed.up_proj = MXLinear.from_linear(nn.Linear(64, 32, bias=False), "mxfp8")  # (another format than gate's)
    hooked = _MLP(64, 32)
    mxkit.quantize_model(hooked, "mxfp4", progress=False, compute_qsnr=False)
    hooked.up_proj.register_forward_hook(lambda *a: None)
    # what the one launch would drop too: a hook on act_fn, a member's forward patched on the instance, a
    # backward hook on a member
    act_hooked, member_patched, back_hooked = _MLP(64, 32), _MLP(64, 32), _MLP(64, 32)
    for m in (act_hooked, member_patched, back_hooked):
        mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    act_hooked.act_fn.register_forward_hook(lambda mod, i, o: o.clamp(max=1.0))
    up = member_patched.up_proj
    member_patched.up_proj.forward = lambda x, f=up.forward: f(x) * 0.5
    back_hooked.gate_proj.register_full_backward_hook(lambda *a: None)
    state_hooked = _MLP(64, 32)  # (a member's state_dict hook, written for its keys: the fused layer holds others)
    mxkit.quantize_model(state_hooked, "mxfp4", progress=False, compute_qsnr=False)
    state_hooked.up_proj.register_state_dict_post_hook(lambda *a: None)

    class _Scaled(_MLP):  # an MLP with a multiplier of its own (FalconH1-like): not HF's forward
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * self.scale

    scaled = _Scaled(64, 32)
    scaled.scale = 0.5
    mxkit.quantize_model(scaled, "mxfp4", progress=False, compute_qsnr=False)

    # the same four names, another computation (the check reads the bytecode, not only the names)
    class _Literal(_MLP):  # a multiplier written in the code
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 0.5)

    class _Swapped(_MLP):  # the activation on up, not gate
        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))

    class _Added(_MLP):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))

    class _TwoInputs(_MLP):
        def forward(self, x, y=None):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x if y is None else y))

    class _Outside(_MLP):  # the product after the down projection: the same attributes in the same order
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x))) * self.up_proj(x)

    class _Inside(_MLP):  # the activation of the product
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x) * self.up_proj(x)))

    others = {}
    for cls in (_Literal, _Swapped, _Added, _TwoInputs, _Outside, _Inside):
        others[cls.__name__] = m = cls(64, 64 if cls is _Outside else 32)  # (_Outside: H = I, its product's shapes)
        mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    root = nn.ModuleDict(dict(model=model, dense=dense, mixed=mixed, hooked=hooked, scaled=scaled,
                              act_hooked=act_hooked, member_patched=member_patched, back_hooked=back_hooked,
                              state_hooked=state_hooked, **others))
    x = torch.randn(3, 64)
    mlps = {n: m for n, m in root.named_modules() if isinstance(m, _MLP)}
    want = {n: m(x) for n, m in mlps.items()}
    assert fuse_gated_mlp(root) == []
    for n, m in root.named_modules():
        if n in want:
            assert type(m) is not MXGatedMLP and torch.equal(m(x), want[n]), n
    assert fuse_gated_mlp(_MLP(64, 32)) == []  # (the root itself: no parent to take it)
    with pytest.raises(ValueError, match="share"):
        MXGatedMLP(mixed.gate_proj, mixed.up_proj, mixed.down_proj)
    with pytest.raises(ValueError, match="MXLinear"):
        MXGatedMLP(dense.gate_proj, dense.up_proj, dense.down_proj)
    for down in (None, "x"):  # (built, then failed at the first forward: "'NoneType' object is not callable")
        with pytest.raises(TypeError, match="down projection must be an nn.Module"):
            MXGatedMLP(mixed.gate_proj, mixed.gate_proj, down)


def test_fuse_gated_mlp_leaves_a_silu_subclass_with_its_own_forward_alone(rng):
    """An nn.SiLU subclass with a forward of its own is another activation: the fused plain SiLU gave other
    outputs (a clamped SiLU's MLP was replaced); an nn.SiLU subclass that keeps SiLU's forward still fuses."""
    _seed(rng)

    class _ClampedSiLU(nn.SiLU):
        def forward(self, x):
            return super().forward(x).clamp(max=0.1)

    class _PlainSubclass(nn.SiLU):
        pass

    root = nn.ModuleDict(dict(clamped=_MLP(64, 32, act=_ClampedSiLU()), plain=_MLP(64, 32, act=_PlainSubclass())))
    mxkit.quantize_model(root, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 64, generator=rng)
    with torch.no_grad():
        want = {n: root[n](x) for n in ("clamped", "plain")}
        assert fuse_gated_mlp(root) == ["plain"]
        assert type(root["clamped"]) is _MLP and isinstance(root["plain"], MXGatedMLP)
        for n in ("clamped", "plain"):
            assert torch.equal(root[n](x), want[n]), n


def test_fuse_gated_mlp_leaves_an_mlp_with_other_state_alone(rng):
    """An MLP that holds a buffer, a parameter or a child its forward does not read keeps them: its replacement
    dropped them from the state_dict without a word. The same MLP without them fuses."""
    _seed(rng)
    mlps = {n: _MLP(64, 32) for n in ("buffer", "param", "child", "plain")}
    mlps["buffer"].register_buffer("calib", torch.randn(32, generator=rng))
    mlps["param"].extra = nn.Parameter(torch.randn(4, generator=rng))
    mlps["child"].norm = nn.LayerNorm(64)
    root = nn.ModuleDict(mlps)
    mxkit.quantize_model(root, "mxfp4", progress=False, compute_qsnr=False)
    keys = set(root.state_dict())
    assert fuse_gated_mlp(root) == ["plain"]
    assert {"buffer.calib", "param.extra", "child.norm.weight"} <= set(root.state_dict())
    assert {k for k in keys if not k.startswith("plain.")} <= set(root.state_dict())


def test_hf_gated_mlp_forwards_pass_the_bytecode_check():
    """transformers' own gated MLP forwards (where installed) are read as down(act_fn(gate(x)) * up(x))."""
    import importlib

    pytest.importorskip("transformers")
    from mxkit.nn.gated_mlp import _plain_gated_forward

    for mod, cls in (("llama", "LlamaMLP"), ("mistral", "MistralMLP"), ("qwen2", "Qwen2MLP"), ("qwen3", "Qwen3MLP")):
        try:
            forward = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), cls).forward
        except (ImportError, AttributeError):
            continue
        assert _plain_gated_forward(forward.__code__, "gate_proj", "up_proj", "down_proj"), cls


def test_fuse_gated_mlp_takes_hf_forms_of_the_forward(rng):
    """HF's own forward (a local name, then return it) and the factors in the other order are the same computation:
    fused, with the unfused bytes."""
    _seed(rng)

    class _Local(_MLP):  # LlamaMLP's forward as written in transformers
        def forward(self, x):
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            return down_proj

    class _UpFirst(_MLP):
        def forward(self, x):
            return self.down_proj(self.up_proj(x) * self.act_fn(self.gate_proj(x)))

    model = nn.Sequential(_Local(64, 32), _UpFirst(64, 32))
    mxkit.quantize_model(model, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 64, generator=rng)
    with torch.no_grad():
        want = model(x)
        assert fuse_gated_mlp(model) == ["0", "1"]
        assert all(isinstance(m, MXGatedMLP) for m in model)
        assert torch.equal(model(x), want)


def test_fuse_gated_mlp_replaces_a_shared_module_once(rng):
    _seed(rng)
    mlp = _MLP(64, 32)
    mxkit.quantize_model(mlp, "mxfp4", progress=False, compute_qsnr=False)
    root = nn.ModuleDict(dict(a=nn.Sequential(mlp), b=nn.Sequential(mlp)))
    assert fuse_gated_mlp(root) == ["a.0"]
    assert isinstance(root.a[0], MXGatedMLP) and root.a[0] is root.b[0]


def test_fuse_gated_mlp_names_bad_arguments(rng):
    """names that are not three str (a str was unpacked into its characters and fused nothing; two names raised
    Python's unpacking error) and a model that is not a module raise TypeError naming them."""
    _seed(rng)
    mlp = nn.Sequential(_MLP(64, 32))
    mxkit.quantize_model(mlp, "mxfp4", progress=False, compute_qsnr=False)
    for bad in ("gud", ("gate_proj", "up_proj"), ("gate_proj", "up_proj", 3)):
        with pytest.raises(TypeError, match="names must be the three child names"):
            fuse_gated_mlp(mlp, names=bad)
    with pytest.raises(TypeError, match="takes an nn.Module, got list"):
        fuse_gated_mlp([mlp])
    assert fuse_gated_mlp(mlp, names=["gate_proj", "up_proj", "down_proj"]) == ["0"]


def test_llama_fused_mlp_logits_equal_the_unfused_model(rng):
    """An HF Llama decoder built from a config: ``fuse_gated_mlp`` then ``fuse_siblings`` (q / k / v) gives the
    unfused quantized model's logits byte for byte on the CPU; the MLPs' gate / up are not also a FusedMXLinear."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    _seed(rng)
    model = transformers.LlamaForCausalLM(cfg).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False)
    ids = torch.randint(0, 64, (2, 9), generator=rng)
    with torch.no_grad():
        want = model(ids).logits
        assert fuse_gated_mlp(model) == [f"model.layers.{i}.mlp" for i in range(2)]
        assert fuse_siblings(model) == [f"model.layers.{i}.self_attn.q_proj_k_proj_v_proj" for i in range(2)]
        assert torch.equal(model(ids).logits, want)


@pytest.mark.parametrize("arch,fused", [("Mistral", True), ("Qwen2", True), ("Qwen3", True), ("Gemma", False)])
def test_other_hf_decoders(arch, fused, rng):
    """The other HF decoders the docstring names (Mistral, Qwen2, Qwen3: SiLU-gated MLPs) are fused, with the
    unfused logits' bytes on the CPU; Gemma's MLP (GELU-tanh) is left alone."""
    transformers = pytest.importorskip("transformers")
    cfg_cls, model_cls = (getattr(transformers, f"{arch}{k}", None) for k in ("Config", "ForCausalLM"))
    if cfg_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {arch}")
    cfg = cfg_cls(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=64)
    _seed(rng)
    model = model_cls(cfg).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False)
    ids = torch.randint(0, 64, (2, 9), generator=rng)
    with torch.no_grad():
        want = model(ids).logits
        assert fuse_gated_mlp(model) == ([f"model.layers.{i}.mlp" for i in range(2)] if fused else [])
        assert torch.equal(model(ids).logits, want)
    assert isinstance(model.model.layers[0].mlp, MXGatedMLP) == fused


def test_gated_act_custom_op(rng):
    """``mxkit::mx_gated_act``, given gate_up's weight codes (a deep copy's its own), gives ``act(x)``'s bytes eagerly
    and under torch.compile (aot_eager: no compiler on the CPU); its fake has the (..., I) shape; a tensor that is
    not the key of a module is a clear error."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _seed(rng)
    m = _MLP(64, 32)
    mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    g = MXGatedMLP(m.gate_proj, m.up_proj, m.down_proj)
    x = torch.randn(2, 3, 64, generator=rng)
    with torch.no_grad():
        want = g.act(x)
        key = g.gate_up.weight_qdata
        op = torch.compile(lambda t: torch.ops.mxkit.mx_gated_act(t, key), fullgraph=True, backend="aot_eager")
        assert torch.equal(torch.ops.mxkit.mx_gated_act(x, key), want) and torch.equal(op(x), want)
        assert torch.equal(torch.compile(g, fullgraph=True, backend="aot_eager")(x), g(x))
        twin = copy.deepcopy(g)  # (its own key: its gate_up's buffer)
        assert torch.equal(torch.ops.mxkit.mx_gated_act(x, twin.gate_up.weight_qdata), want)
    with FakeTensorMode() as mode:
        fake = torch.ops.mxkit.mx_gated_act(mode.from_tensor(x), mode.from_tensor(key))
    assert fake.shape == (2, 3, 32) and fake.dtype == want.dtype
    with pytest.raises(RuntimeError, match="mx_gated_act: its weight tensor is not the buffer of a live mxkit"):
        torch.ops.mxkit.mx_gated_act(x, key.clone())


def test_gated_mlp_gradients_reach_x(rng):
    """With gradients the module runs the interleaved GEMM (MXLinear's input gradient) and torch's SiLU: x's
    gradient that of the unfused layers up to float32 summation order (one GEMM over the interleaved rows)."""
    _seed(rng)
    m = _MLP(64, 32)
    mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    x = torch.randn(3, 64, generator=rng, requires_grad=True)
    m(x).sum().backward()
    want = x.grad.clone()
    x.grad = None
    MXGatedMLP(m.gate_proj, m.up_proj, m.down_proj)(x).sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(x.grad, torch.zeros_like(want))


def _mx_mlp(H: int, I: int, rng, special: bool = False) -> MXGatedMLP:
    _seed(rng)
    m = _MLP(H, I).to("cuda", torch.bfloat16)
    mxkit.quantize_model(m, "mxfp4", progress=False, compute_qsnr=False)
    if special:  # every scale byte somewhere, 0 and 0xFF (NaN blocks) included, on gate and up rows alike
        for lin in (m.gate_proj, m.up_proj):
            with torch.no_grad():
                sc = scale_bytes(tuple(lin.weight_scale.shape), rng)
                lin.weight_scale.copy_(((sc.to(torch.int32) % 24) + 115).to(torch.uint8))  # (a bf16-exact range)
                lin.weight_scale.view(-1)[:3] = torch.tensor([0, 0xFF, 0], dtype=torch.uint8)
            lin.repack()
    return MXGatedMLP(m.gate_proj, m.up_proj, m.down_proj)


def _count_launches(monkeypatch) -> list:
    """A list that grows by one at each call of ``swiglu_mma`` (the one-launch path)."""
    from mxkit.kernels.matmul_details import _mma_decode

    calls, real = [], _mma_decode.swiglu_mma
    monkeypatch.setattr(_mma_decode, "swiglu_mma", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _want(g: MXGatedMLP, x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in float64 from the dequantized interleaved weight."""
    w = mxkit.dequantize(g.gate_up.weight_mx, torch.float64)
    y = x.double() @ w.T
    gate, up = y[..., 0::2], y[..., 1::2]
    return gate * torch.sigmoid(gate) * up


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("H,I", [(512, 1024), (4096, 14336), (2880, 2880)])
@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_gpu_gated_mlp_one_launch(H, I, shape, rng, monkeypatch):
    """One bf16 row on the pairs kernel: within 1.2 x bf16's own rounding error of the float64 product (poisoned
    memory first: every output byte written)."""
    g = _mx_mlp(H, I, rng)
    x = torch.randn(*shape, H, generator=rng).to("cuda", torch.bfloat16)
    poison_allocator()
    calls = _count_launches(monkeypatch)
    with torch.no_grad():
        got = g.act(x)
    assert calls == [1], "the one-launch path was not taken"
    assert got.shape == (*shape, I)
    got, x = got.reshape(1, I), x.reshape(1, H)
    want = _want(g, x)
    err = (got.double() - want).norm(dim=1)
    bound = 1.2 * (want.to(torch.bfloat16).double() - want).norm(dim=1) + 1e-6 * want.norm(dim=1)
    assert torch.all(err <= bound), (err / want.norm(dim=1)).max()
    with torch.no_grad():  # HF's order (gate and up rounded to bf16 first): within a few bf16 ulps
        torch.testing.assert_close(got.float(), g._act_gemm(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_gated_mlp_special_scales_and_other_paths(rng, monkeypatch):
    """Scale bytes 0 and 0xFF take the kernel's special variant: NaN exactly in the columns where the float64
    product has it, the other columns within the bound. Two or more rows, fp16 x and gradients take the
    interleaved GEMM."""
    g = _mx_mlp(512, 1024, rng, special=True)
    x = torch.randn(1, 512, generator=rng).to("cuda", torch.bfloat16)
    calls = _count_launches(monkeypatch)
    with torch.no_grad():
        got = g.act(x)
        assert calls == [1] and g._launch()[2]  # (the special variant)
        want = _want(g, x)
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
        fin = ~want.isnan()
        err = (got[fin].double() - want[fin]).norm()
        assert fin.any() and err <= 1.2 * (want[fin].to(torch.bfloat16).double() - want[fin]).norm() + 1e-6
        for other in (torch.randn(2, 512, generator=rng).to("cuda", torch.bfloat16), x.half(),
                      torch.randn(3, 1, 512, generator=rng).to("cuda", torch.bfloat16)):
            assert torch.equal(g.act(other).view(torch.int16), g._act_gemm(other).view(torch.int16))  # (NaN too)
        assert calls == [1]
    plain = _mx_mlp(512, 1024, rng)
    xg = x.clone().requires_grad_()
    plain(xg).float().sum().backward()
    assert calls == [1] and xg.grad.isfinite().all() and xg.grad.abs().sum() > 0


@pytest.mark.gpu
@gpu
def test_gpu_gated_mlp_in_a_cuda_graph_compiled_and_reloaded(rng, monkeypatch):
    """A captured MLP replays with new x to the eager bytes (the one launch inside the graph); torch.compile
    (fullgraph=True: mxkit::mx_gated_act, the same eager launch) gives the eager bytes; after loading another
    module's weights, or a repack of edited bytes, the one launch reads the new weight."""
    g = _mx_mlp(512, 1024, rng)
    x = torch.randn(1, 1, 512, generator=rng).to("cuda", torch.bfloat16)
    calls = _count_launches(monkeypatch)
    with torch.no_grad():
        want = g(x)
        assert calls == [1]
        assert_graph_replays(g, [x.clone()], lambda: [torch.randn(1, 1, 512, generator=rng).to("cuda", torch.bfloat16)])
        compiled = torch.compile(g, dynamic=False, fullgraph=True)
        assert torch.equal(compiled(x), want)
        other = _mx_mlp(512, 1024, rng)
        g.load_state_dict(other.state_dict())
        n = len(calls)
        assert torch.equal(g.act(x), other.act(x)) and len(calls) == n + 2
        g.gate_up.weight_qdata.zero_()  # (every code +0: silu(0) * 0)
        g.gate_up.repack()
        assert torch.equal(g.act(x), torch.zeros(1, 1, 1024, device="cuda", dtype=torch.bfloat16))


@pytest.mark.gpu
@gpu
def test_gpu_gated_mlp_compiled_op_at_one_row_only(rng):
    """Under torch.compile one bf16 row traces to ``mxkit::mx_gated_act`` (the one launch); two rows trace the
    GEMM op and leave SiLU x up to the compiler (the recording backend runs the traced graph as it is: the eager
    values)."""
    g = _mx_mlp(512, 1024, rng)
    seen = []

    def record(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    for rows in (1, 2):
        x = torch.randn(rows, 512, generator=rng).to("cuda", torch.bfloat16)
        with torch.no_grad():
            got = torch.compile(g.act, backend=record, fullgraph=True, dynamic=False)(x)
            want = g.act(x)
        ops = " ".join(seen[-1])
        assert ("mx_gated_act" in ops) == (rows == 1) and ("mx_linear" in ops) == (rows == 2), ops
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), rows  # (the eager values: the bytes)
        torch._dynamo.reset()


@pytest.mark.gpu
@gpu
def test_gpu_llama_fused_mlp_logits(rng, monkeypatch):
    """An HF Llama decoder on the GPU at 1 token a sequence: ``fuse_gated_mlp`` + ``fuse_siblings`` logits within
    bf16 tolerance of the unfused quantized model's; and at 8 tokens a sequence (16 rows, still decode-mma), where
    the attention reads q and k (at one token its softmax weight is 1 whatever q and k are)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
    _seed(rng)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    mxkit.quantize_model(model, "mxfp4", skip="lm_head", progress=False, compute_qsnr=False)
    ids = torch.randint(0, 256, (2, 1), generator=rng).cuda()
    ids8 = torch.randint(0, 256, (2, 8), generator=rng).cuda()
    with torch.no_grad():
        want, want1 = model(ids).logits.float(), model(ids[:1]).logits.float()
        want8 = model(ids8).logits.float()
        fuse_gated_mlp(model)
        fuse_siblings(model)
        got8 = model(ids8).logits.float()
        got = model(ids).logits.float()  # (two rows: the interleaved GEMM)
        calls = _count_launches(monkeypatch)
        got1 = model(ids[:1]).logits.float()  # (one row: the one launch in each layer)
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got1, want1, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got8, want8, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@gpu
def test_gpu_gated_mlp_act_format_set_after_fusing(rng):
    """gate_up.act_format set after fusing: one row quantizes its input as two rows do (the one-launch path,
    kept for float activations, ran it unquantized)."""
    g = _mx_mlp(512, 1024, rng)
    x = torch.randn(1, 512, generator=rng).to("cuda", torch.bfloat16)
    with torch.no_grad():
        assert g._launch() is not None
        g.act(x)
        g.gate_up.act_format = mxkit.get_format("mxfp8")
        assert g._launch() is None
        assert torch.equal(g.act(x).view(torch.int16), g._act_gemm(x).view(torch.int16))


@pytest.mark.gpu
@gpu
def test_gpu_gated_mlp_first_one_row_call_inside_a_capture(rng, monkeypatch):
    """The first one-row call of a module whose scale statistics were read (a prefill before), made inside a CUDA
    graph capture with no one-launch call before it on this device: the zero expert ids the one launch reads are
    not made there (their fill would run only at the graph's replays: an eager call before any replay read unset
    ids and left the output unwritten); the capture takes the GEMM path, and the eager call after it the one
    launch (within 1.2 x bf16's rounding error of the float64 product; the replay: the GEMM path's bytes)."""
    from mxkit.kernels.matmul_details import _mma_decode

    g = _mx_mlp(512, 1024, rng)
    p = g.gate_up._live_packed()
    assert p.scale_min is not None  # (the statistics read, as a prefill does)
    # as for a module built off this device and moved here (its construction made no ids on it): none made yet
    monkeypatch.setattr(_mma_decode, "_ZERO_IDS", {})
    g._one_launch = (None, None)
    x = torch.randn(1, 512, generator=rng).to("cuda", torch.bfloat16)
    calls = _count_launches(monkeypatch)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        captured = g.act(x)
    torch.cuda.current_stream().wait_stream(side)
    assert calls == [] and _mma_decode._ZERO_IDS == {}  # (the GEMM path inside the capture, no ids made there)
    poison_allocator()
    x1 = torch.randn(1, 512, generator=rng).to("cuda", torch.bfloat16)
    with torch.no_grad():
        eager = g.act(x1)
    assert calls == [1]

    want = _want(g, x1)
    err = (eager.double() - want).norm(dim=1)
    assert torch.all(err <= 1.2 * (want.to(torch.bfloat16).double() - want).norm(dim=1) + 1e-6 * want.norm(dim=1))
    x.copy_(x1)
    captured.fill_(float("nan"))
    graph.replay()
    with torch.no_grad():
        assert torch.equal(captured.view(torch.int16), g._act_gemm(x1).view(torch.int16))
