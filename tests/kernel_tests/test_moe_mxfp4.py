"""The MXFP4 x MXFP4 MoE kernels (issue #24's "MXFP4 x MXFP4" weight-format option):
:func:`mxkit.kernels.moe.moe_mxfp4_triton` and its grouped fix-up
(:func:`mxkit.kernels.matmul_details._row_fixup.grouped_fixup`), against float64 of the dequantized operands and
against the twin :func:`mxkit.moe_reference.moe_mxfp4_reference` (whose CPU tests are in tests/test_moe.py).

Tokens: random rows after crafted ones, a row whose block scales span 40 steps (the first, so that one token
takes the non-folding route), 15 (one past the fold window of 14), 14 and 0, a tiny row (row scale below
2^-54: outside the FP8 epilogue's envelope), a NaN row and a zero row; 32 experts, top-4, an expert that receives
every token and one that receives none; 1, 3 and 727 tokens on the GPU.

Bounds, row by row (issue #22's):

* one grouped GEMM on its given MXFP4 operands (the tokens quantized by ``mxkit.quantize``, or the kernel's own
  intermediate quantized so), against y64 = float64 of the dequantized operands:
  ``‖y_r − y64_r‖ ≤ 1.2 · ‖round(y64_r) − y64_r‖ + acc_r`` for a bf16 or float32 output, with ``acc_r`` the
  accumulation term of test_matmul's bound (``accumulation_bound``: about 2.5e-4 of |y64|). Under Triton's CPU
  interpreter, whose bf16 casts truncate, a bf16 row may be off by one bf16 ulp an element:
  ``‖ulp_bf16(y64_r)‖ + acc_r``;
* the middle pass (bias, activation in float32): within 1e-5 of the same in PyTorch's float32 (Triton's
  sigmoid); padding rows exactly 0;
* the combine: the float32 sum of the kernel's rows, rounded once: within 1e-6 of its float64;
* the layer against its twin: the kernel's float32 activation (and its FP8 accumulator's sums before the bf16
  rounding of h) may move an element of the MXFP4 intermediate by one step, or a block's scale, where v sits on
  a rounding boundary; a moved scale can move its token's output by tens of percent (a GPU run saw 27%). So the
  kernel's h (stage ``h``) is held to the GEMM bound of the twin's float64 h, and its intermediate (stage ``v``)
  to the middle pass' rule against the twin's float64 activation of that h; the twin then takes the kernel's
  quantized blocks where they differ from its own (its down GEMM and bf16 rounding redone for those pairs);
  then at most 4% of the tokens past 1% of their norm (``max(1, T // 25)``: one of 1-49 tokens; bf16 roundings
  of y, summed with cancellation), none past 5%. Under the interpreter the tokens of fixed-up rows are left out
  of this last comparison (its truncating bf16 casts), so a plain T = 1 token is run beside the crafted one.

CPU (in CI): the grouped fix-up alone and the whole layer under Triton's interpreter, where the grouped FP8 GEMM
(``torch._scaled_grouped_mm``, CUDA sm_90 only) and the combine (whose scalar-masked loads the interpreter does
not take; the W4A8 path's, tested on the GPU) are float64 PyTorch stand-ins; the new kernels compile for sm_90.
GPU: ``pytest tests/kernel_tests/test_moe_mxfp4.py -m gpu`` (names ``test_gpu_*mxfp4*``).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import pytest
import torch

import mxkit

from conftest import assert_graph_replays

try:
    from .test_matmul import accumulation_bound
    from .test_moe_kernels import pair_rows, pair_rows64, rand_ids, twin_takes
except ImportError:  # run as a script under the interpreter (conftest.run_interpreted)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_matmul import accumulation_bound
    from test_moe_kernels import pair_rows, pair_rows64, rand_ids, twin_takes

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
SPANS = (40, 15, 14, 0)  # the block-scale spans of the first token rows
LIMIT = 2.0**54  # 2^FOLD_EXP_LIMIT: row scales outside [1 / LIMIT, LIMIT] are fixed up


def span_tokens(T: int, H: int, g: torch.Generator, *, huge: bool = False) -> torch.Tensor:
    """(T, H) bf16 tokens (H % 64 == 0): random rows after the crafted ones that fit (module docstring): blocks
    whose amax is 1.5 * 2^p (FLOOR scale byte 125 + p) spanning SPANS, a tiny row (p = -100), with ``huge`` a huge
    one (p = 70, row scale above 2^54), a NaN row, a zero row. A crafted row's first block holds one non-zero,
    at column 0, which :func:`mx_experts` zeroes: the product is then its other blocks' alone, so a row whose
    low blocks a fold drops (spanning more than the window) is far from its exact product, not within bf16's
    rounding of it."""
    nb = H // 32

    def blocks(ps):
        v = torch.randn(nb, 32, generator=g)
        v[0] = 0.0
        v[0, 0] = 1.0
        v = v / v.abs().amax(dim=1, keepdim=True) * 1.5
        return (v * torch.tensor([2.0**p for p in ps])[:, None]).reshape(H)

    rows = [blocks([0] + [-s] * (nb - 1)) if s == 40 else blocks([0, -s] * (nb // 2)) for s in SPANS]
    rows.append(blocks([-100] * nb))
    if huge:
        rows.append(blocks([70] * nb))
    nan = torch.randn(H, generator=g)
    nan[5] = float("nan")
    rows += [nan, torch.zeros(H)]
    x = torch.randn(T, H, generator=g)
    for i, r in enumerate(rows[:T]):
        x[i] = r
    return x.to(torch.bfloat16)


def check_spans(x: torch.Tensor) -> None:
    """The crafted rows really span SPANS (the quantized tokens' scale bytes)."""
    sc = mxkit.quantize(x.cpu(), "mxfp4").scale.to(torch.int32)
    for i, s in enumerate(SPANS[: x.shape[0]]):
        assert int(sc[i].max() - sc[i].min()) == s, (i, sc[i])


def mx_experts(E: int, N: int, K: int, g: torch.Generator, device: str) -> mxkit.MXTensor:
    """MXFP4 experts (E, N, K) along K whose rows fold (a scale of 2^-3 .. 2^3 per row), column 0 zero (see
    :func:`span_tokens`)."""
    w = torch.randn(E, N, K, generator=g) * 2.0 ** torch.randint(-3, 4, (E, N, 1), generator=g)
    w[..., 0] = 0.0
    return mxkit.quantize(w, "mxfp4").to(device)


def folded_values(f) -> torch.Tensor:
    """float64 (E, N, K) of FoldedExperts: each E4M3 byte times its row scale (the MX values, in the folded row
    order)."""
    return f.data.to(torch.float64) * f.scale.to(torch.float64)[..., None]


def mx_values(x: torch.Tensor) -> torch.Tensor:
    """float64 of rows x (R, K) quantized to MXFP4 by mxkit.quantize (the bytes the kernels' quantize-folds
    encode), dequantized."""
    return mxkit.dequantize(mxkit.quantize(x, "mxfp4"), torch.float64).cpu()


def assert_gemm_rows(y: torch.Tensor, a64: torch.Tensor, w64: torch.Tensor, truncating: bool = False) -> None:
    """Rows y (P, N) against y64 = rowwise a64 (P, K) @ w64 (P, N, K).T in float64 (module docstring's bound);
    rows whose y64 is NaN must be NaN."""
    y, a64, w64 = y.cpu(), a64.cpu(), w64.cpu()
    y64 = torch.einsum("pk,pnk->pn", a64, w64)
    rss = torch.einsum("pk,pnk->pn", a64**2, w64**2).sqrt()
    assert_rows_within(y, y64, accumulation_bound(y64, rss, a64.shape[1]), truncating)


def assert_rows_within(y: torch.Tensor, y64: torch.Tensor, acc: torch.Tensor, truncating: bool) -> None:
    """:func:`assert_gemm_rows`' bound on rows y (P, N) of a product whose float64 is y64, acc (P, N) its
    accumulation term (``accumulation_bound``)."""
    y, y64, acc = y.cpu(), y64.cpu(), acc.cpu()
    nan = torch.isnan(y64).any(dim=1)
    assert torch.isnan(y[nan]).any(dim=1).all(), "a row whose exact product is NaN must be NaN"
    keep = ~nan
    y, y64, acc = y[keep].to(torch.float64), y64[keep], acc[keep].norm(dim=1)
    err = (y - y64).norm(dim=1)
    if truncating:
        ulp = 2.0 ** (torch.floor(torch.log2(y64.abs().clamp(min=2.0**-133))) - 7)
        bound = ulp.norm(dim=1) + acc
    else:
        bound = 1.2 * (y64.to(torch.bfloat16).to(torch.float64) - y64).norm(dim=1) + acc
    bad = torch.nonzero(~(err <= bound)).flatten()  # (a NaN error is over it)
    assert bad.numel() == 0, f"{bad.numel()} rows over the bound, e.g. {err[bad[0]]:.3e} > {bound[bad[0]]:.3e}"


def assert_f32_rows(y: torch.Tensor, a64: torch.Tensor, w64: torch.Tensor) -> None:
    """float32 rows y: within 1.2 times their float32 rounding plus the accumulation term of their float64
    product (test_matmul's bound)."""
    y64 = torch.einsum("pk,pnk->pn", a64.cpu(), w64.cpu())
    rss = torch.einsum("pk,pnk->pn", a64.cpu() ** 2, w64.cpu() ** 2).sqrt()
    acc = accumulation_bound(y64, rss, a64.shape[1]).norm(dim=1)
    err = (y.cpu().to(torch.float64) - y64).norm(dim=1)
    assert (err <= 1.2 * (y64.float().double() - y64).norm(dim=1) + acc).all(), (err, y64.norm(dim=1))


# ---------------------------------------------------------------------------------------------------------
# CPU: the twin, the op and the module


def _ml_values(q: mxkit.MXTensor) -> torch.Tensor:
    """float64 of an MXTensor along its last axis, decoded by ml_dtypes (not by mxkit); a 0xFF scale gives NaN."""
    import numpy as np
    from conftest import ml_decode, oracle_unpack

    codes = oracle_unpack(q.qdata, q.fmt.name).numpy()
    s = q.scale.numpy().astype(np.int64)
    factor = np.where(s == 255, np.nan, np.ldexp(1.0, s - 127)).repeat(q.block_size, axis=-1)
    return torch.from_numpy(ml_decode(codes, q.fmt.name) * factor)


def _act64(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The activations from their definitions (float64)."""
    if activation == "swiglu_gpt_oss":
        gate, up = h[:, 0::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
        return (up + 1.0) * gate / (1.0 + torch.exp(-1.702 * gate))
    gate, up = h.chunk(2, dim=1)
    return gate / (1.0 + torch.exp(-gate)) * up


def _oracle(x, w1, b1, w2, b2, tw, ids, activation) -> torch.Tensor:
    """float64 of the MXFP4 x MXFP4 layer written from moe_mxfp4_reference's docstring, one expert at a time (no
    sort, grouped GEMM or combine of mxkit.moe_reference; MX values decoded by ml_dtypes)."""
    bf = lambda t: t.to(torch.bfloat16).to(torch.float64)  # noqa: E731
    a = _ml_values(mxkit.quantize(x, "mxfp4", backend="reference"))
    W1, W2 = _ml_values(w1), _ml_values(w2)
    pairs = torch.zeros(*ids.shape, x.shape[1], dtype=torch.float64)
    for e in ids.unique().tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        h = bf(a[t] @ W1[e].T) + b1[e].to(torch.float64)
        v = _act64(h, activation).to(torch.float32)
        v4 = _ml_values(mxkit.quantize(v, "mxfp4", backend="reference"))
        pairs[t, j] = bf(v4 @ W2[e].T) + b2[e].to(torch.float64)
    return (tw.to(torch.float64)[..., None] * pairs).sum(1)


@pytest.mark.parametrize("activation", ["swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("T", [1, 3, 727])
def test_moe_mxfp4_reference_against_an_expert_loop(T, activation, rng):
    """moe_mxfp4_reference against :func:`_oracle`: the tokens quantized to MXFP4 (rows spanning 40, 15, 14 and
    0 scale steps, tiny, NaN, zero), bf16 after each GEMM, the intermediate in MXFP4, the biases, the weighted
    sum over the slots; 32 experts, top-4, an expert that every token reaches and one that none does."""
    from mxkit.moe_reference import moe_mxfp4_reference
    from mxkit.reference import round_from_float64

    E, k, H, I = 32, 4, 128, 64  # noqa: E741
    w1, w2 = mx_experts(E, 2 * I, H, rng, "cpu"), mx_experts(E, H, I, rng, "cpu")
    b1, b2 = torch.randn(E, 2 * I, generator=rng), torch.randn(E, H, generator=rng)
    x = span_tokens(T, H, rng, huge=activation == "swiglu_gpt_oss")  # (its clamps keep a huge row finite)
    check_spans(x)
    ids = rand_ids(T, k, E, rng, every=1, none=2)
    tw = torch.softmax(torch.randn(T, k, generator=rng), -1)
    got = moe_mxfp4_reference(mxkit.quantize(x, "mxfp4"), w1, b1, w2, b2, tw, ids, activation=activation,
                              out_dtype=torch.float64)
    torch.testing.assert_close(got, _oracle(x, w1, b1, w2, b2, tw, ids, activation), rtol=1e-12, atol=1e-12,
                               equal_nan=True)
    nan = torch.isnan(got).any(dim=1)
    assert nan.sum() == (1 if T > 6 else 0)  # the NaN token alone
    if T > 3:
        return
    bf16 = moe_mxfp4_reference(mxkit.quantize(x, "mxfp4"), w1, b1, w2, b2, tw, ids, activation=activation)
    assert bf16.dtype == torch.bfloat16 and torch.isnan(bf16[nan]).all()  # the default out_dtype, rounded once
    once = round_from_float64(got[~nan], torch.bfloat16)  # (torch's float64 -> bf16 cast rounds twice)
    assert torch.equal(bf16[~nan].view(torch.int16), once.view(torch.int16))


def test_moe_mxfp4_on_cpu_is_its_reference(rng):
    """mxkit.moe.moe_mxfp4 on CPU: routes (a token whose logits tie goes to the lower experts; leading dims kept),
    quantizes the tokens to MXFP4 and runs the twin, bytes equal; no tokens give an empty result; bad arguments
    raise."""
    from mxkit.moe import moe_mxfp4, route
    from mxkit.moe_reference import moe_mxfp4_reference

    E, k, H, I = 32, 4, 128, 64  # noqa: E741
    w1, w2 = mx_experts(E, 2 * I, H, rng, "cpu"), mx_experts(E, H, I, rng, "cpu")
    b1, b2 = torch.randn(E, 2 * I, generator=rng), torch.randn(E, H, generator=rng)
    x = span_tokens(40, H, rng).reshape(2, 20, H)
    logits = torch.randn(2, 20, E, generator=rng)
    logits[0, 7] = 0.0
    logits[0, 7, [3, 9, 20, 30, 31]] = 2.0  # a tie over five experts: the top-4 are 3, 9, 20, 30
    y = moe_mxfp4(x, w1, b1, w2, b2, logits, k)
    tw, ids = route(logits.reshape(-1, E), k)
    assert ids[7].tolist() == [3, 9, 20, 30]
    ref = moe_mxfp4_reference(mxkit.quantize(x.reshape(-1, H), "mxfp4"), w1, b1, w2, b2, tw, ids, out_dtype=x.dtype)
    assert y.shape == x.shape and torch.equal(y.view(torch.int16), ref.reshape(x.shape).view(torch.int16))
    empty = moe_mxfp4(x[:, :0], w1, b1, w2, b2, logits[:, :0], k)
    assert empty.shape == (2, 0, H) and empty.dtype == x.dtype
    with pytest.raises(TypeError, match="mxfp4_e2m1"):
        moe_mxfp4_reference(x.reshape(-1, H), w1, b1, w2, b2, tw, ids)
    with pytest.raises(TypeError, match="mxfp4_e2m1"):
        moe_mxfp4_reference(mxkit.quantize(x.reshape(-1, H), "mxfp8"), w1, b1, w2, b2, tw, ids)
    with pytest.raises(ValueError, match="top_k"):
        moe_mxfp4(x, w1, b1, w2, b2, logits, E + 1)


def test_mxmoe_mxfp4_on_cpu(rng):
    """MXMoE(act_format="mxfp4") (any spelling of MXFP4, held as "mxfp4_e2m1") routes, quantizes the tokens to
    MXFP4 and runs the twin on CPU; its gradients are those of the quantized function (checked against a float64
    autograd in test_moe.py::test_mxmoe_quantized_activation_gradients): the down bias' (the routing weights times
    grad y) is the W4A16 layer's, bit for bit, the router's is not; other act_formats and expert parallelism are
    refused."""
    from mxkit.formats import get_format
    from mxkit.moe_reference import moe_mxfp4_reference, route
    from mxkit.nn import MXMoE

    E, k, H, I = 8, 2, 64, 32  # noqa: E741
    router = torch.nn.Linear(H, E)
    dense = [torch.randn(E, 2 * I, H, generator=rng), torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng)]
    m = MXMoE.from_dense(router, *dense, k, "mxfp4", act_format="mxfp4")
    assert m.act_format == "mxfp4_e2m1" and "act_format=mxfp4_e2m1" in repr(m)
    x = torch.randn(2, 3, H, generator=rng)
    with torch.no_grad():
        y = m(x)
        tw, ids = route(m.router(x).reshape(-1, E), k)
        ref = moe_mxfp4_reference(mxkit.quantize(x.reshape(-1, H), "mxfp4"), m.gate_up_mx, m.gate_up_bias,
                                  m.down_mx, m.down_bias, tw, ids, out_dtype=x.dtype)
    assert torch.equal(y, ref.reshape(2, 3, H))
    out = []
    for act_format in (None, "mxfp4"):
        mod = MXMoE.from_dense(router, *dense, k, "mxfp4", act_format=act_format)
        xi = x.clone().requires_grad_()
        yi = mod(xi)
        yi.backward(torch.ones_like(yi))
        out.append((yi.detach(), xi.grad, mod.router.weight.grad, mod.gate_up_bias.grad, mod.down_bias.grad))
    assert torch.equal(out[1][0], y) and not torch.equal(out[0][0], out[1][0])
    assert all(torch.isfinite(g).all() for g in out[1][1:])
    assert torch.equal(out[0][4], out[1][4]) and not torch.equal(out[0][2], out[1][2])
    flat = x.reshape(-1, H).clone().requires_grad_()  # (the same tokens as rows: the same x gradient, row for row;
    yf = mod(flat)  # after the parameters' gradients were read: this backward adds to them)
    yf.backward(torch.ones_like(yf))
    assert out[1][1].abs().sum() > 0 and torch.equal(out[1][1].reshape(-1, H), flat.grad)
    for spelling in ("MXFP4", "mxfp4_e2m1", get_format("mxfp4")):
        assert MXMoE(H, I, E, k, "mxfp4", act_format=spelling).act_format == "mxfp4_e2m1"
    for bad in ("mxfp8", "mxfp6_e2m3", "fp4", 3):
        with pytest.raises(ValueError, match="act_format"):
            MXMoE(H, I, E, k, "mxfp4", act_format=bad)
    with pytest.raises(ValueError, match="no expert_range"):
        MXMoE(H, I, E, k, "mxfp4", expert_range=(0, 2), act_format="mxfp4")


# ---------------------------------------------------------------------------------------------------------
# the grouped fix-up alone


def _flagged(status: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rows the fix-up owns: fold status 1, or a row scale outside [2^-54, 2^54] (NaN rows are not)."""
    s = scale.cpu()
    return (status.cpu() == 1) | (((s < 1 / LIMIT) | (s > LIMIT)) & ~torch.isnan(s))


def _check_grouped_fixup(device: str, g, T: int) -> int:
    """grouped_fixup after a (skipped) grouped GEMM, into NaN-poisoned outputs (bf16 and float32): exactly the
    valid sorted rows whose operand row does not fold exactly are written, each within the bound; the tokens
    gathered (first GEMM) and sorted rows of their own (second GEMM); N not a multiple of the column tile."""
    from mxkit.kernels.fold import quantize_fold_triton
    from mxkit.kernels.matmul_details._row_fixup import grouped_fixup
    from mxkit.kernels.moe import align_device, fold_experts

    E, k, K, N, bm = 32, 4, 128, 96, 16
    x = span_tokens(T, K, g, huge=True).to(device)
    check_spans(x)
    w = mx_experts(E, N, K, g, device)
    f = fold_experts(w)
    assert f is not None
    w64 = folded_values(f).cpu()
    ids = rand_ids(T, k, E, g, every=1, none=2).to(device)
    sid, eid = align_device(ids, E, bm)
    R, n = sid.numel(), T * k
    valid = (sid < n).cpu()
    e_row = eid.cpu().clamp(min=0).repeat_interleave(bm).long()
    xf = quantize_fold_triton(x, "mxfp4", defer=True)
    tok = torch.where(valid, sid.cpu().long() // k, 0)
    want = valid & _flagged(xf.status, xf.folded.scale)[tok]
    st = xf.status.cpu()
    for i, s in enumerate(SPANS[:T]):  # spans past the fold window of 14 do not fold
        assert st[i] == (1 if s > 14 else 0), (i, s, st[i])
    if T > 4:  # the tiny row (row scale 2^-107) and the huge one (2^62) lie outside the envelope
        assert _flagged(xf.status, xf.folded.scale)[4:6].all()
    # a second operand of sorted rows (R, K) float32 (padding rows 0): each pair's token row, so that rows of
    # every kind occur
    v = (x.cpu().float()[tok] * torch.where(valid, 1.0, 0.0)[:, None]).to(device)
    vf = quantize_fold_triton(v, "mxfp4", defer=True)
    want_v = valid & _flagged(vf.status, vf.folded.scale)
    n_checked = 0
    for out in (torch.float32, torch.bfloat16):
        for pend, gather, flags in ((xf, True, want), (vf, False, want_v)):
            y = torch.full((R, N), float("nan"), dtype=out, device=device)
            grouped_fixup(y, pend.source, pend.status, pend.folded.scale, sid, eid, f.data, f.scale, n_valid=n,
                          top_k=k, gather=gather)
            written = ~torch.isnan(y).any(dim=1).cpu()
            assert torch.equal(written, flags), (out, gather, written.nonzero().flatten(), flags.nonzero().flatten())
            assert torch.isnan(y[~flags.to(device)]).all()  # nothing else touched
            r = flags.nonzero().flatten()
            a64 = mx_values(x)[tok[r]] if gather else mx_values(v)[r]
            if out == torch.float32:
                assert_f32_rows(y[r.to(device)], a64, w64[e_row[r]])
            else:
                assert_gemm_rows(y[r.to(device)], a64, w64[e_row[r]], truncating=device == "cpu")
            n_checked += 1
    return n_checked


# ---------------------------------------------------------------------------------------------------------
# the whole layer, stage by stage


def _check_layer(device: str, g, T: int, activation: str, *, H: int, I: int,  # noqa: E741
                 crafted: bool = True) -> dict:
    """moe_mxfp4_triton with its stages: the down GEMM within the GEMM bound on its MXFP4 operands (the kernel's own
    intermediate quantized by mxkit.quantize), the middle pass within float32 of act(h + b1), padding rows 0, the
    combine within float32 rounding of its float64. The tokens: :func:`span_tokens` (``crafted``), else plain
    random bf16 rows, none of which the fix-up owns. Returns what the twin check, which holds the gate_up GEMM to
    its bound on the tokens' bytes, needs: every caller runs it next."""
    from mxkit.kernels.moe import fold_experts, moe_mxfp4_triton
    from mxkit.moe_reference import swiglu, swiglu_gpt_oss

    E, k, bm = 32, 4, 16
    w1, w2 = mx_experts(E, 2 * I, H, g, device), mx_experts(E, H, I, g, device)
    b1, b2 = torch.randn(E, 2 * I, generator=g).to(device), torch.randn(E, H, generator=g).to(device)
    if crafted:
        x = span_tokens(T, H, g).to(device)
        check_spans(x)
    else:
        x = torch.randn(T, H, generator=g).to(torch.bfloat16).to(device)
    ids = rand_ids(T, k, E, g, every=1, none=2).to(device)
    tw = torch.softmax(torch.randn(T, k, generator=g), -1).to(device)
    f1, f2 = fold_experts(w1, interleave_halves=activation == "swiglu"), fold_experts(w2)
    st = {}
    out = moe_mxfp4_triton(x, f1, b1, f2, b2, tw, ids, activation=activation, out_dtype=torch.float32, stages=st)
    sid, eid = st["ids"].cpu(), st["eids"].cpu()
    valid = sid < T * k
    tok = sid[valid].long() // k
    e_row = eid.clamp(min=0).repeat_interleave(bm).long()[valid]
    trunc = device == "cpu"
    # the gate_up GEMM: :func:`_assert_twin`, which the callers run next, holds h to the GEMM bound (fixed-up
    # rows included: those of tokens 0, 1 and the tiny one)
    fixed = _flagged(st["x_fold"].status, st["x_fold"].folded.scale)
    assert fixed[tok].any() == crafted
    # the middle pass, from the kernel's own h
    b1i = b1.cpu() if activation != "swiglu" else torch.stack([b1.cpu()[:, :I], b1.cpu()[:, I:]], 2).flatten(1, 2)
    hv = st["h"].cpu()[valid].to(torch.float32) + b1i[e_row]
    v = swiglu_gpt_oss(hv) if activation == "swiglu_gpt_oss" else swiglu(torch.cat([hv[:, 0::2], hv[:, 1::2]], 1))
    got_v = st["v"].cpu()
    torch.testing.assert_close(got_v[valid], v, rtol=1e-5, atol=1e-5 * float(v.nan_to_num().abs().max()),
                               equal_nan=True)
    assert (got_v[~valid] == 0).all()
    # the down GEMM on the intermediate's MXFP4 bytes (mxkit.quantize of the kernel's own v)
    assert_gemm_rows(st["y"].cpu()[valid], mx_values(got_v)[valid], folded_values(f2).cpu()[e_row], trunc)
    # the combine
    pairs = torch.zeros(T * k, H, dtype=torch.float64)
    pairs[sid[valid].long()] = st["y"].cpu()[valid].to(torch.float64) + b2.cpu().to(torch.float64)[e_row]
    o64 = (pairs.view(T, k, H) * tw.cpu().to(torch.float64)[..., None]).sum(1)
    o = out.cpu().to(torch.float64)
    nan = torch.isnan(o64).any(dim=1)
    assert torch.isnan(o[nan]).all() and not torch.isnan(o[~nan]).any()
    assert ((o - o64)[~nan].norm(dim=1) <= 1e-6 * o64[~nan].norm(dim=1)).all()
    return dict(x=x, w=(w1, b1, w2, b2), tw=tw, ids=ids, out=out, fixed=fixed, **kernel_pairs(st, T, k, activation))


def kernel_pairs(st: dict, T: int, k: int, activation: str) -> dict:
    """The kernel's stages per (token, slot) pair, one row at ``t * k + j``, float64: ``h`` (T * k, 2I), its
    gate_up GEMM in the checkpoint's row order (halves again for ``"swiglu"``), ``v`` (T * k, I) its intermediate
    (float32 act(h + b1)), and ``v4`` that quantized to MXFP4 by mxkit.quantize and dequantized."""
    h = pair_rows(st["h"], st["ids"], T * k)
    if activation == "swiglu":
        h = torch.cat([h[:, 0::2], h[:, 1::2]], 1)
    return dict(h=h, v=pair_rows(st["v"], st["ids"], T * k), v4=pair_rows(mx_values(st["v"].cpu()), st["ids"], T * k))


def kernel_run(x, w, tw, ids, activation: str, out_dtype: torch.dtype) -> dict:
    """moe_mxfp4_triton on the MX experts w = (w1, b1, w2, b2), folded here, with its stages: the run dict of
    :func:`_assert_twin`."""
    from mxkit.kernels.moe import fold_experts, moe_mxfp4_triton

    w1, b1, w2, b2 = w
    st = {}
    out = moe_mxfp4_triton(x, fold_experts(w1, interleave_halves=activation == "swiglu"), b1, fold_experts(w2), b2,
                           tw, ids, activation=activation, out_dtype=out_dtype, stages=st)
    return dict(x=x, w=w, tw=tw, ids=ids, out=out, **kernel_pairs(st, *ids.shape, activation))


def _assert_twin(run: dict, activation: str, skip: Optional[torch.Tensor] = None) -> int:
    """The layer against moe_mxfp4_reference (module docstring's rule), leaving out the tokens of ``skip``; run
    holds the kernel's h and intermediate per pair (:func:`kernel_pairs`). Returns how many tokens' outputs it
    compared (h and the intermediate: every pair's)."""
    from mxkit.moe_reference import ACTIVATIONS, _bf16_cast, _mxfp4_cast, moe_mxfp4_reference

    w1, b1, w2, b2 = run["w"]
    T = run["ids"].shape[0]
    ref = moe_mxfp4_reference(mxkit.quantize(run["x"], "mxfp4"), w1, b1, w2, b2, run["tw"], run["ids"],
                              activation=activation, out_dtype=torch.float64).cpu()
    # the twin's intermediate per pair, as moe_mxfp4_reference makes it
    a = mx_values(run["x"])
    h, acc = pair_rows64(a, w1.to("cpu"), run["ids"].cpu(), 16)
    bias1 = 0.0 if b1 is None else b1.cpu().to(torch.float64)[run["ids"].cpu().long().flatten()]
    v4 = _mxfp4_cast(ACTIVATIONS[activation](_bf16_cast(h) + bias1))

    # the kernel's h within the GEMM bound of the twin's float64 one, its v within float32 of the twin's float64
    # activation of that h (the middle pass' rule)
    assert_rows_within(run["h"], h, acc, truncating=not run["out"].is_cuda)
    v64 = ACTIVATIONS[activation](run["h"] + bias1)
    torch.testing.assert_close(run["v"], v64, rtol=1e-5, atol=1e-5 * float(v64.nan_to_num().abs().max()),
                               equal_nan=True)
    W2 = mxkit.dequantize(w2, torch.float64).cpu()
    twin_takes(ref, run["v4"], v4, W2, run["ids"], run["tw"])  # the kernel's blocks where they differ from its own
    out = run["out"].cpu().to(torch.float64)
    nan = torch.isnan(ref).any(dim=1)
    assert torch.equal(torch.isnan(out).any(dim=1), nan)
    keep = ~nan if skip is None else ~nan & ~skip
    rel = (out - ref)[keep].norm(dim=1) / ref[keep].norm(dim=1).clamp(min=1e-300)
    assert (rel > 0.01).sum() <= max(1, T // 25) and (rel <= 0.05).all(), (int((rel > 0.01).sum()), rel)
    return int(keep.sum())


# ---------------------------------------------------------------------------------------------------------
# under Triton's CPU interpreter


def _grouped_fp8_float64(a, sa, w, offs, table=None) -> torch.Tensor:
    """``torch._scaled_grouped_mm``'s contract on the CPU: each expert group's rows of a (E4M3) times sa, times
    the expert's folded rows, in float64, rounded once to bf16; rows past the last group NaN (unspecified)."""
    out = torch.full((a.shape[0], w.data.shape[1]), float("nan"), dtype=torch.bfloat16)
    a64 = a.to(torch.float64) * sa.to(torch.float64)[:, None]
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = (a64[start:end] @ folded_values(w)[e].T).to(torch.bfloat16)
        start = end
    return out


def _combine_float64(y, b, topk_weights, pos, experts, out_dtype) -> torch.Tensor:
    """The combine's contract: out[t] = sum_j w[t, j] (y[pos[t, j]] + b[e[t, j]]) (pos -1: 0), rounded once."""
    T, k = topk_weights.shape
    pos = pos.reshape(T, k)
    v = y.to(torch.float64)[pos.clamp(min=0).long()]
    if b is not None:
        v = v + b.to(torch.float64)[experts.long().clamp(min=0)]
    v = torch.where((pos >= 0)[..., None], v, 0.0)
    return (topk_weights.to(torch.float64)[..., None] * v).sum(1).to(out_dtype)


def _check_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.matmul_details import _row_fixup
    from mxkit.kernels.moe_details import _moe_epilogue
    from mxkit.kernels.moe_details import _fold

    g = interpreted_rng(_row_fixup._grouped_fixup_kernel, _moe_epilogue._bias_act_kernel)
    n = sum(_check_grouped_fixup("cpu", g, T) for T in (1, 3, 37))
    _fold._grouped_fp8, _fold._combine = _grouped_fp8_float64, _combine_float64
    # T = 1 twice: its crafted token is a fixed-up row, which the twin check leaves out; the plain one is compared
    for T, act, crafted in ((1, "swiglu_gpt_oss", True), (1, "swiglu_gpt_oss", False), (37, "swiglu_gpt_oss", True),
                            (37, "swiglu", True)):
        run = _check_layer("cpu", g, T, act, H=128, I=64, crafted=crafted)
        # the interpreter's bf16 casts truncate the fixed-up rows of h: their tokens' outputs are left out here
        compared = _assert_twin(run, act, skip=run["fixed"])
        assert (compared == 1) if not crafted else ((compared > 0) == (T > 1)), (T, crafted, compared)
        n += 1
    print(f"interpreter checks passed: {n}")


def test_moe_mxfp4_kernels_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_interpreted")


def test_moe_mxfp4_kernels_compile_for_sm90():
    """The new jit kernels build for sm_90 on the CPU (Triton's bundled ptxas): the bf16 tensor-core dot of the
    fix-up, the fp8 bitcast of the folded experts and the early return of unused blocks are compiled only
    there."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxkit.formats import get_format
    from mxkit.kernels.moe_details._moe_epilogue import _bias_act_kernel
    from mxkit.kernels.matmul_details._row_fixup import _grouped_fixup_kernel
    from mxkit.kernels.quantize_details._common import element_spec

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "the interpreter replaces the compiler"

    def build(fn, ptrs, consts):
        sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in fn.arg_names}
        k = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": 3})
        return len(k.asm["cubin"])

    ptrs = {"y_ptr": "*bf16", "st_ptr": "*u8", "rs_ptr": "*fp32", "ids_ptr": "*i32", "eids_ptr": "*i32",
            "wd_ptr": "*u8", "ws_ptr": "*fp32"}
    for x_ty, kind, gather in (("*i16", 1, True), ("*i32", 0, False)):
        consts = dict(TOP_K=4, GATHER=gather, IN_KIND=kind, A_FMT=element_spec(get_format("mxfp4")), MODE=0,
                      AWAY=False, LO=2.0**-54, HI=2.0**54, DOT_BF16=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64)
        assert build(_grouped_fixup_kernel, dict(ptrs, x_ptr=x_ty), consts) > 0
    bptrs = {"h_ptr": "*bf16", "b_ptr": "*fp32", "ids_ptr": "*i32", "eids_ptr": "*i32", "v_ptr": "*fp32"}
    for act in (1, 2):
        assert build(_bias_act_kernel, bptrs, dict(ACT=act, HAS_BIAS=True, BLOCK_M=16, BLOCK_N=512)) > 0


def test_mma_max_pairs_is_a_table_entry():
    """MMA_MAX_PAIRS lives in the dispatch table (``moe.mma_max_pairs``, packaged value 256): read per device,
    overridable like the GEMM envelopes, with the packaged default for a table without the entry; with
    ``mma_max_pairs_per_expert`` the envelope is the larger of the two for the experts a layer holds."""
    from mxkit.kernels.matmul import gemm_table_override
    from mxkit.kernels.matmul_table import _packaged_table
    from mxkit.kernels.moe import MMA_MAX_PAIRS, mma_max_pairs

    cpu = torch.device("cpu")
    assert MMA_MAX_PAIRS == _packaged_table()["default"]["moe"]["mma_max_pairs"] == 256 == mma_max_pairs(cpu)
    with gemm_table_override({"default": {"moe": {"mma_max_pairs": 64}}}):
        assert mma_max_pairs(cpu) == 64
    with gemm_table_override({"default": {}}):
        assert mma_max_pairs(cpu) == 256
    # the per-expert part (the H200's table: 8): the larger of the two for a layer holding that many experts
    with gemm_table_override({"default": {"moe": {"mma_max_pairs": 256, "mma_max_pairs_per_expert": 8}}}):
        assert mma_max_pairs(cpu) == 256 and mma_max_pairs(cpu, 16) == 256 and mma_max_pairs(cpu, 128) == 1024
    assert mma_max_pairs(cpu, 128) == 256  # the packaged default: no per-expert part
    h200 = _packaged_table()["NVIDIA H200"]["moe"]
    assert h200["mma_max_pairs"] == 256 and h200["mma_max_pairs_per_expert"] == 8


# ---------------------------------------------------------------------------------------------------------
# GPU (H200): pytest tests/kernel_tests/test_moe_mxfp4.py -m gpu


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("T", [1, 3, 727])
def test_gpu_grouped_fixup_mxfp4(T, rng):
    assert _check_grouped_fixup("cuda", rng, T) == 4


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("activation", ["swiglu_gpt_oss", "swiglu"])
@pytest.mark.parametrize("T", [1, 3, 727])
def test_gpu_moe_mxfp4_stages(T, activation, rng, poison):
    """The layer on the H200, stage by stage (outputs allocated after the poison fixture), then against the
    twin."""
    run = _check_layer("cuda", rng, T, activation, H=256, I=192)
    _assert_twin(run, activation)


@pytest.mark.gpu
@gpu
def test_gpu_moe_mxfp4_public_op_and_router_tie(rng):
    """mxkit.moe.moe_mxfp4 on CUDA: routes (a token whose logits tie goes to the lower experts), folds the experts
    on the call, runs the kernels; the same bytes as the kernel on the routed tokens and within the twin rule;
    experts that do not fold take the twin itself."""
    from mxkit.kernels.moe import fold_experts
    from mxkit.moe import moe_mxfp4, route
    from mxkit.moe_reference import moe_mxfp4_reference

    E, H, I, k, T = 32, 256, 192, 4, 40  # noqa: E741
    w1, w2 = mx_experts(E, 2 * I, H, rng, "cuda"), mx_experts(E, H, I, rng, "cuda")
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = span_tokens(T, H, rng).cuda()
    logits = torch.randn(T, E, generator=rng).to(torch.bfloat16).cuda()
    logits[7] = 0.0
    logits[7, [3, 9, 20, 30, 31]] = 2.0  # a tie over five experts: the top-4 are 3, 9, 20, 30
    y = moe_mxfp4(x, w1, b1, w2, b2, logits, k)
    tw, ids = route(logits, k)
    assert ids[7].tolist() == [3, 9, 20, 30]
    want = kernel_run(x, (w1, b1, w2, b2), tw, ids, "swiglu_gpt_oss", x.dtype)
    assert torch.equal(y.view(torch.int16), want["out"].view(torch.int16))
    _assert_twin(want, "swiglu_gpt_oss")
    w1.scale[2, 5, 0], w1.scale[2, 5, 1] = 150, 100  # a weight row spanning 50: the experts do not fold
    assert fold_experts(w1) is None
    y = moe_mxfp4(x, w1, b1, w2, b2, logits, k)
    ref = moe_mxfp4_reference(mxkit.quantize(x, "mxfp4"), w1, b1, w2, b2, tw, ids, out_dtype=x.dtype)
    assert torch.equal(y.view(torch.int16), ref.view(torch.int16))


@pytest.mark.gpu
@gpu
def test_gpu_moe_mxfp4_in_a_cuda_graph(rng):
    """moe_mxfp4_triton has no host sync: captured in a CUDA graph and replayed on new tokens (crafted rows
    included, so the fix-up runs) and new routing, it gives the eager bytes."""
    from mxkit.kernels.moe import fold_experts, moe_mxfp4_triton

    E, H, I, k, T = 32, 256, 192, 4, 64  # noqa: E741
    f1 = fold_experts(mx_experts(E, 2 * I, H, rng, "cuda"))
    f2 = fold_experts(mx_experts(E, H, I, rng, "cuda"))
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = span_tokens(T, H, rng).cuda()
    ids = rand_ids(T, k, E, rng).cuda()
    tw = torch.softmax(torch.randn(T, k, generator=rng), -1).cuda()

    def fresh():
        return [span_tokens(T, H, rng)[torch.randperm(T, generator=rng)].cuda(),
                rand_ids(T, k, E, rng, every=int(torch.randint(0, E, (1,), generator=rng))).cuda()]

    assert_graph_replays(lambda x, ids: moe_mxfp4_triton(x, f1, b1, f2, b2, tw, ids), [x, ids], fresh)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("activation", ["swiglu_gpt_oss", "swiglu"])
def test_gpu_mxmoe_mxfp4_layer(activation, rng):
    """MXMoE(act_format="mxfp4") on CUDA (bf16 router, biases and tokens): its first forward folds the experts in
    place (layout "fold"), its output is the bits of a module that keeps its MX bytes and a folded copy, its
    state_dict the checkpoint bytes it was built with, and it keeps the twin rule against moe_mxfp4_reference."""
    from mxkit.moe_reference import route
    from mxkit.nn import MXMoE

    E, H, I, k = 32, 256, 128, 4  # noqa: E741
    router = torch.nn.Linear(H, E).to(torch.bfloat16).cuda()
    dense = [torch.randn(E, 2 * I, H, generator=rng), torch.randn(E, 2 * I, generator=rng),
             torch.randn(E, H, I, generator=rng), torch.randn(E, H, generator=rng)]
    dense = [t.to(torch.bfloat16).cuda() for t in dense]
    m = MXMoE.from_dense(router, *dense, k, "mxfp4", act_format="mxfp4", activation=activation)
    x = span_tokens(37, H, rng).cuda()
    sd0 = {n: t.clone() for n, t in m.state_dict().items()}
    with torch.no_grad():
        y = m(x)
        assert m.expert_layout == "fold" and m.gate_up_qdata.shape == (E, 2 * I, H)
        keep = MXMoE.from_dense(router, *dense, k, "mxfp4", act_format="mxfp4", activation=activation,
                                keep_source=True)
        assert torch.equal(keep(x).view(torch.int16), y.view(torch.int16)) and keep.expert_layout == "checkpoint"
        sd1 = m.state_dict()
        assert all(torch.equal(sd1[n], sd0[n]) for n in sd0)
        tw, ids = route(m.router(x), k)
        run = kernel_run(x, (m.gate_up_mx, m.gate_up_bias, m.down_mx, m.down_bias), tw, ids, activation, x.dtype)
        assert torch.equal(run["out"].view(torch.int16), y.view(torch.int16))  # the module's kernel call
        _assert_twin(run, activation)
