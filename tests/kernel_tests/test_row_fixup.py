"""The fold path without a host sync (``mxkit.kernels.matmul_details._row_fixup``): the FP8
GEMM runs every row of a deferred fold, then one kernel overwrites the output of the rows it could not take
(block scales spanning more than the fold window, row scales outside the FP8 epilogue's envelope) and of the
weight's special rows with the exact product. Held to issue #22's row-wise bound against y64; the rows the fix-up
leaves alone are byte-equal to the completed fold's path (the same FP8 GEMM). Under Triton's CPU interpreter
(CPU ``torch._scaled_mm``) and on the GPU, where it is also captured in a CUDA graph."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch
from conftest import assert_graph_replays

import mxkit
from mxkit.fold import fold_range
from mxkit.reference import pack_codes
from mxkit.tensor import MXTensor

try:
    from .test_matmul import assert_within_bound, rand_mx
except ImportError:  # run as a script under the interpreter (conftest.run_interpreted)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_matmul import assert_within_bound, rand_mx

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def _bound(y, a, b, bias=None, truncating=False):
    assert_within_bound(y, a, b, bias, truncating=truncating)


def _activations(M: int, K: int, dtype, g, device: str) -> torch.Tensor:
    """Rows of every kind the fold meets: a span of 80 scale steps (24 in fp16: past every fold window either
    way), a span of about 15, tiny (row scale below 2^-54), huge (above 2^54; not in fp16), a NaN, zero; the rest
    random."""
    x = torch.randn(M, K, generator=g).to(dtype)
    wide = 40 if dtype != torch.float16 else 12  # fp16: 2^40 overflows (an Inf row is a NaN row, not a wide one)
    x[1, :32] *= 2.0**wide
    x[1, 32:64] *= 2.0**-wide
    x[2, 32:64] *= 2.0**-15  # a span of about 15 scale steps
    x[3] *= 2.0**-100
    x[4] *= 2.0**90 if dtype != torch.float16 else 1.0
    x[5, 40] = float("nan")
    x[6] = 0
    return x.to(device)


def _check_fixup(device: str, g) -> int:
    """Deferred folds (of bf16 / fp32 rows, and of MX tensors) times packed weights with and without special
    rows, bias or not, bf16 / fp32 out: within the bound, NaN rows NaN, zero rows zero, and every element the
    fix-up does not own byte-equal to the completed fold's result."""
    from mxkit.kernels.fold import PendingFold, fold_triton, quantize_fold_triton

    n = 0
    M, K, N = 9, 192, 80
    for wfmt, wspread in (("mxfp4_e2m1", 2), ("mxfp6_e3m2", 20), ("mxfp6_e2m3", 3)):
        qb = rand_mx((N, K), wfmt, g, spread=wspread, device=device)
        pw = mxkit.pack_weight(qb)
        assert (pw.special_rows.numel() > 0) == (wspread > fold_range(wfmt)[1] - fold_range(wfmt)[0])
        for afmt, dtype in (("mxfp4_e2m1", torch.bfloat16), ("mxfp6_e2m3", torch.float32)):
            x = _activations(M, K, dtype, g, device)
            qa = mxkit.quantize(x, afmt)
            for bias, out in ((None, torch.bfloat16), (torch.randn(N, generator=g).to(device), torch.float32)):
                for pend in (quantize_fold_triton(x, afmt, defer=True), fold_triton(qa, defer=True)):
                    assert isinstance(pend, PendingFold) and pend.source is not None
                    y = mxkit.matmul(pend, pw, bias=bias, out_dtype=out, backend="triton")
                    # (the interpreter's bf16 casts truncate: a bound of one ulp there)
                    _bound(y, qa, pw, bias, truncating=device != "cuda" and out == torch.bfloat16)
                    assert torch.isnan(y[5]).all() and not torch.isnan(y[[0, 1, 2, 3, 4, 6, 7, 8]]).any()
                    if device == "cuda" and out == torch.float32:  # not the FP8 GEMM: dequantized to bf16
                        assert mxkit.gemm_plan(pend, pw, out_dtype=out).path == "bf16-exact"
                        y2 = mxkit.matmul(qa, pw, bias=bias, out_dtype=out)
                        assert mxkit.gemm_plan(qa, pw, out_dtype=out).path == "bf16-exact"
                        assert torch.equal(y.view(torch.uint8), y2.view(torch.uint8))
                        n += 1
                        continue
                    want = mxkit.matmul(pend.complete(), pw, bias=bias, out_dtype=out, backend="triton")
                    fixed = (pend.status == 1) | ~((pend.folded.scale >= 2.0**-54) & (pend.folded.scale <= 2.0**54))
                    fixed &= ~torch.isnan(pend.folded.scale)
                    assert fixed[[1, 3, 4]].all() if dtype != torch.float16 else True
                    keep = ~fixed[:, None].expand(M, N).clone()
                    keep[:, pw.special_rows] = False
                    assert torch.equal(y[keep].view(torch.uint8), want[keep].view(torch.uint8))
                    n += 1
    return n


def _check_fixup_writes_only_flags(device: str, g) -> int:
    """The kernel alone on a poisoned output: exactly the flagged rows' and columns' elements are written."""
    from mxkit.kernels.fold import quantize_fold_triton
    from mxkit.kernels.matmul_details._row_fixup import fixup

    M, K, N = 70, 96, 72  # two row tiles, two column tiles
    x = torch.randn(M, K, generator=g)
    x[65, :32] *= 2.0**30
    x[65, 32:64] *= 2.0**-30
    pend = quantize_fold_triton(x.to(device), "mxfp4", defer=True)
    pw = mxkit.pack_weight(rand_mx((N, K), "mxfp4_e2m1", g, spread=20, device=device))
    assert pw.special_rows.numel() == N
    pw = mxkit.PackedWeight(pw.source, pw.folded, pw.stats, torch.tensor([3, 70], device=device))
    y = torch.full((M, N), float("nan"), device=device)
    fixup(y, pend.source, pw.source, None, M, N, K, fold=(pend.status, pend.folded.scale), special=pw.special_rows)
    written = ~torch.isnan(y)
    want = torch.zeros(M, N, dtype=torch.bool)
    want[65] = True
    want[:, [3, 70]] = True
    assert torch.equal(written.cpu(), want)
    _bound(y[:, [3, 70]], mxkit.quantize(x, "mxfp4"), mxkit.MXTensor(pw.source.qdata[[3, 70]],
                                                                     pw.source.scale[[3, 70]], pw.source.fmt, 1,
                                                                     32, (2, K)))
    return 1


def _check_fixup_quantizes_in_every_mode(device: str, g) -> int:
    """The fix-up of a deferred quantize-fold quantizes its flagged rows of x itself, in the fold's scale mode and
    rounding, from fp16 / fp32 / bf16 x: those rows byte-equal the fix-up of the same rows quantized by
    mxkit.quantize, and are within the bound (float32 out: the interpreter's bf16 casts truncate)."""
    from mxkit.kernels.fold import quantize_fold_triton
    from mxkit.kernels.matmul_details._row_fixup import fixup

    M, K, N = 9, 192, 72
    pw = mxkit.pack_weight(rand_mx((N, K), "mxfp4_e2m1", g, spread=2, device=device))
    n = 0
    for k, (dt, mode, rnd) in enumerate(((torch.float16, "rceil", "away"), (torch.float32, "even", "rne"),
                                         (torch.bfloat16, "ceil", "away"), (torch.float32, "floor", "away"))):
        x = _activations(M, K, dt, g, device)
        fmt = ("mxfp4", "mxfp6_e2m3")[k % 2]
        pend = quantize_fold_triton(x, fmt, scale_mode=mode, rounding=rnd, defer=True)
        qa = mxkit.quantize(x, fmt, scale_mode=mode, rounding=rnd)
        y, want = (torch.full((M, N), float("nan"), device=device) for _ in range(2))
        fixup(y, pend.source, pw.source, None, M, N, K, fold=(pend.status, pend.folded.scale))
        fixup(want, qa, pw.source, None, M, N, K, fold=(pend.status, pend.folded.scale))
        rows = ~torch.isnan(want).all(dim=1)
        assert rows.sum() >= 1 and torch.equal(torch.isnan(y), torch.isnan(want)), (dt, mode, rnd)
        assert torch.equal(y[rows].view(torch.int32), want[rows].view(torch.int32)), (dt, mode, rnd)
        keep = rows.clone()
        keep[5] = False  # (the NaN row)
        _bound(y[keep], MXTensor(qa.qdata[keep], qa.scale[keep], qa.fmt, 1, 32, (int(keep.sum()), K)), pw.source)
        n += 1
    return n


def _fp8_rowwise_rows(M: int, K: int, g, device: str):
    """FP8 rowwise activations [M, K] whose rows 0-4 carry scales outside the FP8 epilogue's proven range 2^+-54
    (2^-70, 2^60, 2^-149, 2^120, Inf), rows 5 / 6 its ends (2^-54, 2^54, inside), row 7 NaN, the rest amax / 448.
    Returns (the Fp8Rowwise, the flagged rows bool [M])."""
    a = mxkit.quantize_fp8_rowwise(torch.randn(M, K, generator=g))
    scale = a.scale.clone()
    scale[:8, 0] = torch.tensor([2.0**-70, 2.0**60, 2.0**-149, 2.0**120, float("inf"), 2.0**-54, 2.0**54,
                                 float("nan")])
    flagged = torch.zeros(M, dtype=torch.bool)
    flagged[:5] = True
    return mxkit.Fp8Rowwise(a.data.to(device), scale.to(device)), flagged


def _check_fixup_fp8_rowwise(device: str, g) -> int:
    """The w4a8-fp8 path's fix-up (an Fp8Rowwise a): on a NaN-poisoned output it writes exactly the rows whose
    row scale lies outside 2^+-54 (where an epilogue applying it before the weight's could overflow or round
    twice) and the weight's special rows' columns, each within the bound (float32 out, and bf16 on CUDA;
    with and without a bias)."""
    from mxkit.kernels.matmul_details._row_fixup import fixup

    M, K, N = 12, 192, 72
    n = 0
    for wfmt, spread, base, out, with_bias in (("mxfp4_e2m1", 2, 100, torch.float32, True),
                                                ("mxfp6_e3m2", 20, 87, torch.bfloat16, False)):
        pw = mxkit.pack_weight(rand_mx((N, K), wfmt, g, spread=spread, base=base, device=device), act="fp8_rowwise")
        assert (pw.special_rows.numel() > 0) == (spread > 2)
        a, flagged = _fp8_rowwise_rows(M, K, g, device)
        bias = torch.randn(N, generator=g).to(device) if with_bias else None
        out = out if device == "cuda" else torch.float32  # (the interpreter's bf16 casts truncate)
        y = torch.full((M, N), float("nan"), dtype=out, device=device)
        fixup(y, a, pw.source, bias, M, N, K, fold=(None, a.scale), special=pw.special_rows)
        written = ~torch.isnan(y.float()).cpu()
        want = flagged[:, None].expand(M, N).clone()
        want[:, pw.special_rows.cpu()] = True
        want[7] = False  # (a NaN row scale: not flagged; NaN in the special columns)
        assert torch.isinf(y[4].float()).any() and (torch.isinf(y[4].float()) | torch.isnan(y[4].float())).all()
        written[4] = want[4]  # (an Inf row scale: +-Inf, or NaN where a sum is 0)
        assert torch.equal(written, want), (wfmt, written.int())
        rows = torch.tensor([0, 1, 2, 3])
        sub = mxkit.Fp8Rowwise(a.data[rows.to(device)], a.scale[rows.to(device)])
        assert torch.isfinite(y[rows.to(device)].float()).all(), wfmt
        _bound(y[rows.to(device)], sub, pw.source, bias)
        if pw.special_rows.numel():
            cols = pw.special_rows
            keep = torch.tensor([r for r in range(M) if r not in (4, 7)])
            sub = mxkit.Fp8Rowwise(a.data[keep.to(device)], a.scale[keep.to(device)])
            w = MXTensor(pw.source.qdata[cols], pw.source.scale[cols], pw.source.fmt, 1, 32, (cols.numel(), K))
            _bound(y[keep.to(device)][:, cols], sub, w)
        n += 1
    return n


def _scale_rows(M: int, K: int, fmt: str, g, device: str):
    """An MX ``a`` whose rows 2 (every scale byte 0 or 1: E4M3's subnormals times 2^-127 are not bf16 values) and
    5 (one block at byte 247, small codes) lie outside the bf16-exact envelope of FP8 elements, and row 6 (one
    block at the byte just above the format's envelope, one element of the smallest code) outside every
    format's."""
    from mxkit.kernels.matmul import exact_scale_range

    qa = rand_mx((M, K), fmt, g)
    qa.scale[2] = torch.randint(0, 2, (K // 32,), generator=g, dtype=torch.uint8)
    qa.scale[5, 1] = 247
    qa.scale[6, 2] = exact_scale_range(qa.fmt, torch.bfloat16)[1] + 1
    codes = decode_codes(qa)
    codes[5, 32:64] &= 0x31  # small magnitudes (every format: at most an exponent bit or two), so row 5 stays finite
    codes[6, 64:96] = 0
    codes[6, 64] = 1  # one value of at most 2^125 (FP4's 0.5 times 2^126): its products stay finite in float32
    return MXTensor(pack_codes(codes, qa.fmt), qa.scale, qa.fmt, 1, 32, (M, K)).to(device)


def decode_codes(q):
    from mxkit.reference import unpack_codes

    return unpack_codes(q.qdata, q.fmt).to(torch.uint8).clone()


def _check_scale_fixup(device: str, g) -> int:
    """The bf16-exact path's fix-up (no fold): on a NaN-poisoned output it writes exactly the rows of ``a``
    with a scale byte outside a's bf16-exact range, each within the bound; every pair of element kinds."""
    from mxkit.kernels.matmul_details._envelope import exact_scale_range
    from mxkit.kernels.matmul_details._row_fixup import fixup

    M, K, N = 9, 192, 40
    n = 0
    for fa, fb in (("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxint8"), ("mxint8", "mxfp4_e2m1"),
                   ("mxfp6_e3m2", "mxfp8_e4m3"), ("mxfp4_e2m1", "mxfp8_e5m2")):
        qa = _scale_rows(M, K, fa, g, device)
        w = mxkit.quantize(torch.randn(N, K, generator=g), fb).to(device)
        bias = torch.randn(N, generator=g).to(device)
        y = torch.full((M, N), float("nan"), device=device)
        fixup(y, qa, w, bias, M, N, K)
        lo, hi = exact_scale_range(qa.fmt, torch.bfloat16)
        sc = qa.scale.cpu().to(torch.int32)
        want = ((sc < lo) | ((sc > hi) & (sc != 255))).any(dim=1)
        written = ~torch.isnan(y).any(dim=1).cpu()
        assert torch.equal(written, want), (fa, fb, written, want)
        assert want[6], (fa, "row 6 lies outside every format's envelope")
        rows = torch.nonzero(want).flatten()
        sub = MXTensor(qa.qdata[rows.to(device)], qa.scale[rows.to(device)], qa.fmt, 1, 32, (rows.numel(), K))
        _bound(y[rows.to(device)], sub, w, bias)
        n += 1
    return n


def _check_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.matmul_details import _row_fixup

    g = interpreted_rng(_row_fixup._fixup_kernel)
    n = _check_fixup("cpu", g) + _check_fixup_writes_only_flags("cpu", g) + _check_scale_fixup("cpu", g)
    n += _check_fixup_quantizes_in_every_mode("cpu", g) + _check_fixup_fp8_rowwise("cpu", g)
    print(f"interpreter checks passed: {n}")


def test_fixup_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_fixup(rng):
    assert _check_fixup("cuda", rng) and _check_fixup_writes_only_flags("cuda", rng)
    assert _check_scale_fixup("cuda", rng) and _check_fixup_quantizes_in_every_mode("cuda", rng)
    assert _check_fixup_fp8_rowwise("cuda", rng) == 2


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("spread", [2, 20])
def test_gpu_w4a8_rows_outside_the_epilogue_range(spread, rng):
    """w4a8-fp8 on CUDA: token rows whose FP8 row scale lies outside 2^+-54 (2^120 times sums up to ~2^23 against
    weights near 2^-45; 2^-149) come out finite and within the bound: by cuBLAS' epilogue alone (spread 2: no
    special rows, its bytes), or with the fix-up kernel (spread 20: the weight's special rows' columns and those
    rows recomputed); captured in a CUDA graph and replayed on new rows of those scales, the eager bytes."""
    M, K, N = 16, 2880, 256
    w = rand_mx((N, K), "mxfp4_e2m1", rng, spread=spread, base=82, device="cuda")
    pw = mxkit.pack_weight(w, act="fp8_rowwise")
    assert (pw.special_rows.numel() > 0) == (spread > 2)
    a, flagged = _fp8_rowwise_rows(M, K, rng, "cuda")
    assert mxkit.gemm_plan(a, pw).path == "w4a8-fp8"
    y = mxkit.matmul(a, pw)
    keep = torch.tensor([r not in (4, 7) for r in range(M)], device="cuda")
    assert torch.isfinite(y[keep]).all()
    _bound(y[keep], mxkit.Fp8Rowwise(a.data[keep], a.scale[keep]), pw.source)
    if spread == 2:
        raw = torch._scaled_mm(a.data, pw.folded.data.t(), a.scale, pw.folded.scale.reshape(1, N),
                               out_dtype=torch.bfloat16)
        assert torch.equal(y[keep].view(torch.int16), raw[keep].view(torch.int16))

    def fresh():
        new = _fp8_rowwise_rows(M, K, rng, "cuda")[0]
        return [new.data, new.scale]

    assert_graph_replays(lambda d, s: mxkit.matmul(mxkit.Fp8Rowwise(d, s), pw), fresh(), fresh)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fa,fb", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e5m2", "mxint8"),
                                   ("mxfp4_e2m1", "mxfp6_e2m3")])
def test_gpu_bf16_exact_without_a_sync(fa, fb, rng):
    """MX x MX past the a8w8 envelope (and a float32 output of a fold pair) takes bf16-exact with no host sync:
    rows of a outside the bf16 envelope are fixed up; captured in a CUDA graph and replayed on new data, the
    eager bytes."""
    M, K, N = 100, 2880, 256
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng), fb).to("cuda"))
    out = torch.float32 if fa == "mxfp4_e2m1" else torch.bfloat16
    qa = _scale_rows(M, K, fa, rng, "cuda")
    assert mxkit.gemm_plan(qa, pw, out_dtype=out).path == "bf16-exact"
    y = mxkit.matmul(qa, pw, out_dtype=out)
    _bound(y, qa, pw)
    static = _scale_rows(M, K, fa, rng, "cuda")

    def fresh():
        new = _scale_rows(M, K, fa, rng, "cuda")
        return [new.qdata, new.scale]

    assert_graph_replays(lambda q, s: mxkit.matmul(dataclasses.replace(static, qdata=q, scale=s), pw, out_dtype=out),
                         [static.qdata, static.scale], fresh, replays=2, check=lambda ys: _bound(ys, static, pw))


@pytest.mark.gpu
@gpu
def test_gpu_mx_activation_linear_in_a_cuda_graph(rng):
    """MXLinear(act_format="mxfp4") no longer syncs: captured in a CUDA graph, replayed on new rows (one of them
    spanning 80 scale steps, one tiny), it gives the eager bytes."""
    from mxkit.nn import MXLinear

    lin = torch.nn.Linear(2880, 512).cuda()
    m = MXLinear.from_linear(lin, "mxfp4", act_format="mxfp4")
    static = torch.randn(8, 2880, device="cuda")
    with torch.no_grad():  # (row 5 of each new x is NaN: the byte comparison takes it)
        assert_graph_replays(m, [static], lambda: [_activations(8, 2880, torch.float32, rng, "cuda")],
                             check=lambda out: _bound(out, mxkit.quantize(static, "mxfp4"), m.weight_mx,
                                                      lin.bias.detach()))


@pytest.mark.gpu
@gpu
def test_gpu_empty_rows(rng):
    """No rows: an empty (0, N) output from the fold and bf16-exact paths, and from a deferred fold."""
    from mxkit.kernels.fold import quantize_fold_triton

    for fa, fb in (("mxfp4_e2m1", "mxfp4_e2m1"), ("mxfp8_e4m3", "mxfp8_e4m3")):
        pw = mxkit.pack_weight(mxkit.quantize(torch.randn(64, 128, generator=rng), fb).to("cuda"))
        full = mxkit.quantize(torch.randn(1, 128, device="cuda"), fa)  # (quantize rejects an empty tensor)
        qa = MXTensor(full.qdata[:0], full.scale[:0], full.fmt, 1, 32, (0, 128))
        for out in (torch.bfloat16, torch.float32):
            y = mxkit.matmul(qa, pw, out_dtype=out)
            assert y.shape == (0, 64) and y.dtype == out
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp4").to("cuda"))
    y = mxkit.matmul(quantize_fold_triton(torch.randn(0, 3, 128, device="cuda"), "mxfp4", defer=True), pw)
    assert y.shape == (0, 3, 64)


@pytest.mark.gpu
@gpu
def test_gpu_mx_plans_read_no_device_value(rng):
    """On CUDA a PackedWeight's MX x MX plan (and the call) reads nothing back from the GPU, also when the weight
    lies outside the bf16-exact envelope (then fp32-exact, decided from its packed scale range)."""
    w = mxkit.quantize(torch.randn(64, 256, generator=rng), "mxfp8_e4m3")
    w.scale[3, 1] = 0  # below E4M3's bf16-exact range
    cases = [(mxkit.pack_weight(w.to("cuda")), "fp32-exact"),
             (mxkit.pack_weight(mxkit.quantize(torch.randn(64, 256, generator=rng), "mxfp8_e4m3").to("cuda")),
              "bf16-exact")]
    qa = mxkit.quantize(torch.randn(100, 256, device="cuda"), "mxfp8_e5m2")
    for pw, path in cases:
        mxkit.matmul(qa, pw)  # warm up (compiles, caches)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            assert mxkit.gemm_plan(qa, pw).path == path
            if path == "bf16-exact":
                mxkit.matmul(qa, pw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
