"""Row folding (mxkit.fold): the derived fold ranges against an independent ml_dtypes enumeration, and the
exactness of fold_reference (unfold == float64 dequantize) over random rows of chosen block-scale spreads,
NaN rows, all-zero blocks and the extreme scale bytes 0 / 1 / 254.

``rand_mx`` (random MX tensors of chosen per-row spreads) is shared with tests/kernel_tests/test_fold.py.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ml_decode, ml_dtype, rand_tensor  # noqa: E402

from mxkit.fold import (  # noqa: E402
    WIDEN,
    Folded,
    can_fold,
    fold_range,
    fold_reference,
    quantize_fold_reference,
    unfold_reference,
    widen_fp6,
)
from mxkit.formats import get_format  # noqa: E402
from mxkit.reference import dequantize_reference, pack_codes, quantize_reference  # noqa: E402
from mxkit.tensor import MXTensor  # noqa: E402

FOLD_FORMATS = ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2")
# written out from the element tables (min subnormal, max normal and mantissa width against E4M3's 2^-9 …
# 448 with 3 mantissa bits); derived in mxkit.fold and re-derived with ml_dtypes below
EXPECTED_RANGES = {"mxfp4_e2m1": (-8, 6), "mxfp6_e2m3": (-6, 5), "mxfp6_e3m2": (-5, 4), "mxfp8_e4m3": (0, 0),
                   "mxfp8_e5m2": None, "mxint8": None}
NAN_ROW = -1  # a spread entry of rand_mx: the row gets a NaN scale byte
ZERO_ROW = -2  # a spread entry of rand_mx: every block of the row is ±0


def window(fmt: str) -> int:
    lo, hi = EXPECTED_RANGES[fmt]
    return hi - lo


def rand_mx(g: torch.Generator, fmt: str, R: int, K: int, spreads, *, lead=None) -> MXTensor:
    """A random MX tensor (R, K) (or lead + (K,)) along its last axis: uniformly random codes, ~15% all-zero
    blocks (codes +0 / -0, random scale bytes), and per row r the spread ``spreads[r % len(spreads)]`` of its
    non-zero blocks' scale bytes (the largest and smallest both present when the row has two blocks), the
    top byte random, or 254, or so that the bottom is 0 (rows 0, 1, 2 mod 5). NAN_ROW / ZERO_ROW rows: a 0xFF
    scale byte somewhere / all blocks zero."""
    f = get_format(fmt)
    nb = K // 32
    codes = torch.randint(0, 1 << f.bits, (R, nb, 32), generator=g, dtype=torch.int32)
    zero = torch.rand(R, nb, generator=g) < 0.15
    signs = torch.randint(0, 2, (R, nb, 32), generator=g, dtype=torch.int32) << (f.bits - 1)
    codes = torch.where(zero[..., None], signs, codes)
    scale = torch.randint(0, 255, (R, nb), generator=g, dtype=torch.int32)
    for r in range(R):
        s = spreads[r % len(spreads)]
        if s == ZERO_ROW:
            codes[r] = signs[r]
            continue
        if s == NAN_ROW:
            scale[r, int(torch.randint(0, nb, (1,), generator=g))] = 255
            continue
        if r % 5 == 1:
            top = 254
        elif r % 5 == 2:
            top = s
        else:
            top = int(torch.randint(min(s, 254), 255, (1,), generator=g))
        sr = top - torch.randint(0, s + 1, (nb,), generator=g, dtype=torch.int32).clamp(max=top)
        live = torch.nonzero(~zero[r]).flatten()
        if live.numel() < 2:  # make two blocks non-zero so that the spread is there
            live = torch.arange(min(2, nb))
            codes[r, live, 0] = 1
        sr[live[0]] = top
        sr[live[-1]] = top - min(s, top)
        scale[r] = torch.where(zero[r] & (torch.arange(nb) != live[0]) & (torch.arange(nb) != live[-1]),
                               scale[r], sr)
    lead = (R,) if lead is None else tuple(lead)
    assert math.prod(lead) == R
    q = pack_codes(codes.reshape(R, K).to(torch.uint8), f).reshape(*lead, -1)
    return MXTensor(q, scale.to(torch.uint8).reshape(*lead, nb), f, len(lead), 32, (*lead, K))


def expected_slices(q: MXTensor) -> list[int]:
    """Slices per row (0 for a NaN row), counted row by row in Python: the greedy windows of W + 1 scale values
    over the non-zero blocks' scales, from the top."""
    w = window(q.fmt.name)
    R = math.prod(q.shape[:-1])
    vals = dequantize_reference(MXTensor(q.qdata, torch.full_like(q.scale, 127), q.fmt, q.axis, 32, q.shape))
    nonzero = (vals.reshape(R, -1, 32) != 0).any(-1)
    out = []
    for r in range(R):
        s = q.scale.reshape(R, -1)[r].tolist()
        if 255 in s:
            out.append(0)
            continue
        left = sorted({b for b, nz in zip(s, nonzero[r].tolist()) if nz}, reverse=True)
        n = 0
        while left:
            n += 1
            top = left[0]
            left = [b for b in left if b < top - w]
        out.append(max(n, 1))
    return out


def assert_exact(q: MXTensor, fo: Folded) -> None:
    """unfold(fold(q)) == float64 dequantize(q) on every row without a NaN block; NaN rows all NaN."""
    R, K = math.prod(q.shape[:-1]), q.shape[-1]
    ref = dequantize_reference(q, torch.float64).reshape(R, K)
    got = unfold_reference(fo)
    assert got.dtype == torch.float64 and got.shape == (R, K)
    nan_row = (q.scale.reshape(R, -1) == 255).any(-1)
    assert torch.equal(ref[~nan_row], got[~nan_row]), "fold is not exact"
    assert bool(got[nan_row].isnan().all())
    assert bool(fo.scale[:R][nan_row].isnan().all()) and not bool(fo.scale[:R][~nan_row].isnan().any())
    assert not bool(fo.data[:R][nan_row].view(torch.uint8).any())


# ---------------------------------------------------------------------------------------------------------
# fold ranges


@pytest.mark.parametrize("fmt", list(EXPECTED_RANGES))
def test_fold_range_values(fmt):
    assert fold_range(fmt) == EXPECTED_RANGES[fmt]
    assert fold_range(get_format(fmt)) == EXPECTED_RANGES[fmt]
    assert can_fold(fmt) == (fmt in FOLD_FORMATS)


@pytest.mark.parametrize("fmt", list(EXPECTED_RANGES))
def test_fold_range_matches_ml_dtypes(fmt):
    """Independent enumeration: every finite element value (ml_dtypes; INT8 from its definition) times 2^d
    round-trips through ml_dtypes' float8_e4m3fn unchanged exactly for the d of fold_range, and for no other
    d in [-40, 40]."""
    import ml_dtypes  # noqa: F401  (skips through ml_dtype() when missing)

    e4m3 = ml_dtype("mxfp8_e4m3")
    if fmt == "mxint8":
        vals = np.arange(-127, 128, dtype=np.float64) / 64.0
    else:
        vals = ml_decode(np.arange(1 << get_format(fmt).bits, dtype=np.uint8), fmt)
        vals = vals[np.isfinite(vals)]
    good = []
    for d in range(-40, 41):
        v = np.ldexp(vals, d)
        with np.errstate(over="ignore", invalid="ignore"):
            back = v.astype(e4m3).astype(np.float64)
        if np.array_equal(back, v):
            good.append(d)
    expect = None if not good else (good[0], good[-1])
    if good:
        assert good == list(range(good[0], good[-1] + 1))
    assert fold_range(fmt) == expect


def test_e2m1_fact_from_anchors():
    """ANCHORS.md: E2M1 x 2^d is exact in E4M3 for d in [-8, 6] and for no wider range."""
    assert fold_range("mxfp4") == (-8, 6)


# ---------------------------------------------------------------------------------------------------------
# exactness of fold_reference


@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_fold_exact_spreads(fmt, rng):
    w = window(fmt)
    spreads = [0, 14, 15, 40, w, w + 1, 0, NAN_ROW, ZERO_ROW, 254]
    q = rand_mx(rng, fmt, 30, 32 * 24, spreads)
    fo = fold_reference(q)
    assert fo.data.dtype == torch.float8_e4m3fn and fo.scale.dtype == torch.float32 and fo.owner.dtype == torch.int64
    assert fo.rows() == 30 and fo.lead_shape == (30,) and fo.fmt is get_format(fmt) and fo.K == 32 * 24
    moved = fo.to("cpu")
    assert moved.device == torch.device("cpu") and torch.equal(moved.owner, fo.owner)
    assert_exact(q, fo)
    n = expected_slices(q)
    counts = torch.bincount(fo.owner, minlength=30) + 1
    assert counts.tolist() == [max(k, 1) for k in n]
    assert bool((fo.owner[1:] >= fo.owner[:-1]).all()), "extra slices ordered by owner"
    for r, s in enumerate(spreads * 3):
        if 0 <= s <= w:
            assert n[r] == 1, (r, s)
        elif s > w:
            assert n[r] >= 2, (r, s)


def test_folded_and_fp8_rowwise_pickle(rng):
    """pickle.dumps of a float8 tensor fails in torch (2.11-2.13); a Folded, a PackedWeight holding one and
    Fp8Rowwise activations pickle through their uint8 view, bytes and results unchanged."""
    import copy
    import pickle

    import mxkit
    from mxkit.packed import Fp8Rowwise

    q = rand_mx(rng, "mxfp4_e2m1", 20, 32 * 6, [0, 3, NAN_ROW, 40, 254])
    fo = fold_reference(q)
    for back in (pickle.loads(pickle.dumps(fo)), copy.deepcopy(fo)):
        assert back.data.dtype == torch.float8_e4m3fn and back.fmt is fo.fmt and back.lead_shape == fo.lead_shape
        assert torch.equal(back.data.view(torch.uint8), fo.data.view(torch.uint8))
        assert torch.equal(back.scale.view(torch.int32), fo.scale.view(torch.int32))
        assert torch.equal(back.owner, fo.owner)
    w = torch.randn(64, 128, generator=rng).to(torch.bfloat16)
    pw = mxkit.pack_weight(mxkit.quantize(w, "mxfp4", axis=1))
    assert pw.folded is not None
    pw2 = pickle.loads(pickle.dumps(pw))
    a = mxkit.quantize_fp8_rowwise(torch.randn(3, 128, generator=rng))
    a2 = pickle.loads(pickle.dumps(a))
    assert isinstance(a2, Fp8Rowwise) and torch.equal(a2.data.view(torch.uint8), a.data.view(torch.uint8))
    assert torch.equal(a2.scale, a.scale)
    x = torch.randn(3, 128, generator=rng).to(torch.bfloat16)
    assert torch.equal(mxkit.matmul(x, pw2), mxkit.matmul(x, pw))
    assert torch.equal(mxkit.matmul(a2, pw2), mxkit.matmul(a, pw))


def test_torch_load_takes_folded_fp8_rowwise_and_packed_weights_by_default(tmp_path, rng):
    """torch.load's default (weights_only=True) rebuilds a Folded, an Fp8Rowwise and a PackedWeight, as it does an
    MXTensor (it refused the three: "Unsupported global"): bytes as saved, the same GEMM results."""
    import mxkit
    from mxkit.packed import Fp8Rowwise, PackedWeight

    fo = fold_reference(rand_mx(rng, "mxfp4_e2m1", 20, 32 * 6, [0, 3, NAN_ROW, 40, 254]))
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp4"))
    a = mxkit.quantize_fp8_rowwise(torch.randn(3, 128, generator=rng))
    torch.save({"fold": fo, "w": pw, "a": a}, tmp_path / "objs.pt")
    back = torch.load(tmp_path / "objs.pt")
    assert type(back["fold"]) is Folded and type(back["w"]) is PackedWeight and type(back["a"]) is Fp8Rowwise
    assert torch.equal(back["fold"].data.view(torch.uint8), fo.data.view(torch.uint8))
    assert torch.equal(back["fold"].scale.view(torch.int32), fo.scale.view(torch.int32))
    assert torch.equal(back["fold"].owner, fo.owner) and back["fold"].fmt is fo.fmt
    assert torch.equal(back["a"].data.view(torch.uint8), a.data.view(torch.uint8))
    assert torch.equal(mxkit.matmul(back["a"], back["w"]), mxkit.matmul(a, pw))
    x = torch.randn(3, 128, generator=rng)
    assert torch.equal(mxkit.matmul(x, back["w"]), mxkit.matmul(x, pw))


@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_fold_row_scale_and_window(fmt, rng):
    """The row scale is 2^(max_s - 127 - d_hi) of the non-zero blocks; each extra slice's scale is below its
    owner's first slice and every non-zero byte of a slice lies in its own window's blocks."""
    lo, hi = EXPECTED_RANGES[fmt]
    q = rand_mx(rng, fmt, 12, 32 * 16, [0, hi - lo, 40, 100])
    fo = fold_reference(q)
    vals = dequantize_reference(MXTensor(q.qdata, torch.full_like(q.scale, 127), q.fmt, 1, 32, q.shape))
    nonzero = (vals.reshape(12, -1, 32) != 0).any(-1)
    smax = torch.where(nonzero, q.scale.to(torch.int64), -1).amax(1)
    assert torch.equal(fo.scale[:12].to(torch.float64), torch.exp2((smax - 127 - hi).to(torch.float64)))
    for i, r in enumerate(fo.owner.tolist()):
        assert fo.scale[12 + i] < fo.scale[r]
        e = int(torch.log2(fo.scale[12 + i].to(torch.float64)))
        top = e + 127 + hi
        live = (fo.data[12 + i].view(torch.uint8).reshape(-1, 32) != 0).any(-1)
        assert bool((q.scale[r][live].to(torch.int64) <= top).all())
        assert bool((q.scale[r][live].to(torch.int64) >= top - (hi - lo)).all())


def test_spread_boundaries_e2m1(rng):
    """Issue 22's cases: spreads 0 and 14 fold to one row, 15 needs two slices, 40 three (windows of 15)."""
    for spread, slices in ((0, 1), (14, 1), (15, 2), (40, 3)):
        scale = torch.tensor([[200, 200 - spread // 2, 200 - spread]], dtype=torch.uint8)
        codes = torch.randint(1, 16, (1, 96), generator=rng, dtype=torch.uint8) | 1  # odd: never ±0
        q = MXTensor(pack_codes(codes, "mxfp4"), scale, "mxfp4", 1, 32, (1, 96))
        fo = fold_reference(q)
        assert fo.data.shape[0] == slices, (spread, fo.data.shape)
        assert_exact(q, fo)


@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_extreme_scale_bytes(fmt, rng):
    """Rows all at scale byte 0 (row scale 2^(-127 - d_hi), an fp32 subnormal), 1, 254, and 0 with 254."""
    lo, hi = EXPECTED_RANGES[fmt]
    f = get_format(fmt)
    rows = [[0, 0], [1, 1], [254, 254], [254, 254 - (hi - lo)], [254, 0], [1, 0]]
    scale = torch.tensor(rows, dtype=torch.uint8)
    codes = torch.randint(0, 1 << f.bits, (len(rows), 64), generator=rng, dtype=torch.uint8)
    codes[:, 0] = codes[:, 32] = 1
    q = MXTensor(pack_codes(codes, f), scale, f, 1, 32, (len(rows), 64))
    fo = fold_reference(q)
    assert_exact(q, fo)
    assert fo.scale[0].item() == 2.0 ** (-127 - hi) and fo.scale[2].item() == 2.0 ** (127 - hi)
    assert fo.owner.tolist() == [4]  # only [254, 0] spans more than W


def test_zero_blocks_ignored_and_signs_kept(rng):
    """An all-zero block at scale 0 next to a block at 254 does not split the row; its -0 codes stay 0x80. A row
    of ±0 only gets scale 1.0."""
    codes = torch.zeros(2, 64, dtype=torch.uint8)
    codes[0, :32] = torch.randint(0, 16, (32,), generator=rng, dtype=torch.uint8) | 2
    codes[0, 32:40] = 8  # -0
    codes[1, 5] = 8
    q = MXTensor(pack_codes(codes, "mxfp4"), torch.tensor([[254, 0], [17, 200]], dtype=torch.uint8), "mxfp4",
                 1, 32, (2, 64))
    fo = fold_reference(q)
    assert fo.owner.numel() == 0
    assert_exact(q, fo)
    b = fo.data.view(torch.uint8)
    assert b[0, 32:40].tolist() == [0x80] * 8 and b[0, 40:].tolist() == [0] * 24
    assert fo.scale[1].item() == 1.0 and b[1, 5].item() == 0x80 and int(b[1].sum()) == 0x80


def test_nan_rows(rng):
    q = rand_mx(rng, "mxfp4", 6, 128, [NAN_ROW, 40, NAN_ROW, 3])
    fo = fold_reference(q)
    assert_exact(q, fo)
    assert fo.scale[[0, 2, 4]].isnan().all() and not fo.owner.eq(0).any() and not fo.owner.eq(2).any()
    assert torch.equal(fo.scale[[0]].view(torch.int32), torch.tensor([0x7FC00000], dtype=torch.int32))


@pytest.mark.parametrize("fmt", FOLD_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_fold_reference(fmt, dtype, rng):
    x = rand_tensor((2, 5, 96), generator=rng, dtype=dtype, nonfinite=True)
    for mode, rnd in (("floor", "rne"), ("rceil", "away")):
        q = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
        a = quantize_fold_reference(x, fmt, scale_mode=mode, rounding=rnd)
        b = fold_reference(q)
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        assert torch.equal(a.scale.view(torch.int32), b.scale.view(torch.int32)) and torch.equal(a.owner, b.owner)
        assert a.lead_shape == (2, 5) and a.rows() == 10
        assert_exact(q, a)


def test_empty_rows():
    fo = quantize_fold_reference(torch.empty(0, 64), "mxfp4")
    assert fo.data.shape == (0, 64) and fo.scale.shape == (0,) and fo.owner.shape == (0,) and fo.rows() == 0
    q = MXTensor(torch.empty(0, 48, dtype=torch.uint8), torch.empty(0, 2, dtype=torch.uint8), "mxfp6_e2m3", 1, 32,
                 (0, 64))
    fo = fold_reference(q)
    assert fo.data.shape == (0, 64) and fo.rows() == 0 and unfold_reference(fo).shape == (0, 64)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxint8"])
def test_unfoldable_formats_raise(fmt):
    q = quantize_reference(torch.ones(2, 32), fmt)
    with pytest.raises(ValueError, match=fmt):
        fold_reference(q)
    with pytest.raises(ValueError, match="foldable formats"):
        quantize_fold_reference(torch.ones(2, 32), fmt)


def test_bad_arguments():
    q = quantize_reference(torch.ones(64, 4), "mxfp4", axis=0)
    with pytest.raises(ValueError, match="last axis"):
        fold_reference(q)
    with pytest.raises(TypeError):
        fold_reference(torch.ones(2, 32))
    with pytest.raises(ValueError, match="block_size"):
        quantize_fold_reference(torch.ones(2, 64), "mxfp4", block_size=64)
    with pytest.raises(ValueError, match="multiple"):
        quantize_fold_reference(torch.ones(2, 48), "mxfp4")
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):  # (AttributeError: x.dim())
        quantize_fold_reference([1.0] * 32, "mxfp4")


def test_fold_row_split_windows_and_bad_arguments():
    """fold_row_split's greedy windows from the top (a crafted row), and its argument checks: a negative window took
    no block and looped forever; a non-bool mask, 1-D or mismatched tensors raised torch's errors."""
    from mxkit.fold import fold_row_split

    s = torch.tensor([[130, 120, 127, 1, 200], [5, 5, 5, 5, 5]], dtype=torch.uint8)
    nz = torch.tensor([[True, True, True, True, False], [True, False, True, True, True]])
    # row 0: top 130 takes [120, 130]; then 1 alone; the zero block 0. Row 1: all one window
    assert fold_row_split(s, nz, 10).tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]
    assert fold_row_split(s, nz, 0).tolist() == [[0, 2, 1, 3, 0], [0, 0, 0, 0, 0]]
    assert fold_row_split(s.to(torch.int32), nz, 3).tolist() == [[0, 1, 0, 2, 0], [0, 0, 0, 0, 0]]
    for w in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="w must be an int >= 0"):
            fold_row_split(s, nz, w)
    for scale in (s.float(), s[0], s.bool(), s.tolist()):
        with pytest.raises(TypeError, match=r"scale must be an integer tensor \[R, nb\]"):
            fold_row_split(scale, nz, 3)
    for mask in (nz.int(), nz[:, :4], nz[0]):
        with pytest.raises(TypeError, match=r"nonzero must be a bool tensor of scale's shape \(2, 5\)"):
            fold_row_split(s, mask, 3)


def test_malformed_folded_raises(rng):
    """A Folded checks its fields: a short scale used to broadcast into a wrong product, int8 codes were read as
    integers; a string format is normalised."""
    f = quantize_fold_reference(torch.randn(3, 2, 64, generator=rng), "mxfp4")
    R = f.rows()
    assert f.lead_shape == (3, 2) and R == 6
    g = Folded(f.data, f.scale, f.owner, "mxfp4", (3, 2))
    assert g.fmt is f.fmt and g.lead_shape == torch.Size([3, 2])
    bad = {
        "scale": (TypeError, dict(scale=f.scale.double())),
        "data": (TypeError, dict(data=f.data.view(torch.int8))),
        "owner": (TypeError, dict(owner=f.owner.int())),
        r"scale \[": (ValueError, dict(scale=f.scale[:1])),
        r"data \[": (ValueError, dict(data=f.data.reshape(-1))),
        "lead_shape": (ValueError, dict(lead_shape=torch.Size([7]))),
        r"lead_shape \(-3, -2\) has a negative size": (ValueError, dict(lead_shape=(-3, -2))),  # (prod 6: taken)
        "mxfp9": (ValueError, dict(fmt="mxfp9")),
    }
    for match, (err, kw) in bad.items():
        fields = dict(data=f.data, scale=f.scale, owner=f.owner, fmt=f.fmt, lead_shape=f.lead_shape) | kw
        with pytest.raises(err, match=match):
            Folded(**fields)
    # owner's values are read where they are used: an owner outside [0, R) is refused there (backend "triton" on
    # CPU added the slice into row -1, the last, with no error; "reference" raised index_add's RuntimeError)
    import mxkit

    w = mxkit.quantize(torch.randn(4, 64, generator=rng), "mxfp4")
    w8 = mxkit.quantize(torch.randn(4, 64, generator=rng), "mxfp8")  # (no fold: the fp32-exact path's own unfold)
    for owner in (-1, 2):
        g = Folded(torch.ones(3, 64).to(torch.float8_e4m3fn), torch.ones(3), torch.tensor([owner]), "mxfp4", (2,))
        for call in (lambda: mxkit.matmul(g, w, backend="triton"), lambda: mxkit.matmul(g, w, backend="reference"),
                     lambda: mxkit.matmul(g, w8, backend="triton"), lambda: unfold_reference(g)):
            with pytest.raises(ValueError, match=rf"Folded.owner holds rows in \[{owner}, {owner}\], outside the "
                                                 rf"source rows \[0, 2\)"):
                call()
    with pytest.raises(TypeError, match="unfold_reference takes a Folded, got list"):
        unfold_reference([1])


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_widen_fp6_every_code(fmt, rng):
    """widen_fp6: every FP6 code under every scale byte the twin holds (and NaN) dequantizes to the same bytes as
    its MXFP8 twin; a byte past 254 - shift raises, or saturates with check=False."""
    wide_fmt, shift = WIDEN[fmt]
    f = get_format(fmt)
    codes = torch.arange(64, dtype=torch.uint8).repeat(8, 1)[:, torch.randperm(64, generator=rng)]  # 8 rows x 64
    scales = torch.tensor([[0, 1], [2, 60], [127, 126], [128, 200], [254 - shift, 3], [255, 127], [100, 255],
                           [torch.randint(0, 255 - shift, (1,), generator=rng).item(), 7]], dtype=torch.uint8)
    q = MXTensor(pack_codes(codes, f), scales, fmt, 1, 32, (8, 64))
    w = widen_fp6(q)
    assert w.fmt.name == wide_fmt and w.qdata.shape == (8, 64) and w.shape == q.shape
    assert torch.equal(w.scale[scales == 255], scales[scales == 255])
    for dt in (torch.float32, torch.bfloat16):
        a, b = dequantize_reference(q, dt), dequantize_reference(w, dt)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (fmt, dt)
    bad = MXTensor(q.qdata, scales.clone().fill_(255 - shift), fmt, 1, 32, (8, 64))
    with pytest.raises(ValueError, match="no mxfp8"):
        widen_fp6(bad)
    assert (widen_fp6(bad, check=False).scale == 254).all()
    with pytest.raises(ValueError, match="widen_fp6 takes"):
        widen_fp6(quantize_reference(torch.randn(2, 32), "mxfp4"))


def test_fold_checks_blocks_lead_shape_and_empty_inputs(rng):
    """The fold's documented refusals: blocks other than 32 (a ValueError, not a reshape's RuntimeError), a
    lead_shape whose rows are not the data's (too few as too many), and on an empty x the block size and dtype
    checks a non-empty x gets."""
    import mxkit
    from mxkit.fold import Folded, fold_reference, quantize_fold_reference

    x = torch.randn(4, 64, generator=rng)
    with pytest.raises(ValueError, match="block_size=32"):
        fold_reference(mxkit.quantize(x, "mxfp4", block_size=16))
    f = fold_reference(mxkit.quantize(x, "mxfp4"))
    for lead in ((f.data.shape[0] - 1,), (f.data.shape[0] + 3,)):
        with pytest.raises(ValueError, match="lead_shape"):
            Folded(f.data, f.scale, f.owner, f.fmt, lead)
    with pytest.raises(ValueError, match="block_size=32"):
        quantize_fold_reference(torch.empty(0, 64), "mxfp4", block_size=16)
    with pytest.raises(TypeError, match="float64"):
        quantize_fold_reference(torch.empty(0, 64, dtype=torch.float64), "mxfp4")


def test_quantize_fold_inputs_and_folded_identity(rng):
    """quantize_fold takes a NumPy-integer block size as quantize does (it was refused as "not a positive int");
    a meta x raises NotImplementedError (the folded row count depends on the values; it was Tensor.item's error);
    Folded compares by identity like MXTensor (a field-wise == of its tensors raised)."""
    import mxkit

    x = torch.randn(4, 64, generator=rng)
    a = mxkit.quantize_fold(x, "mxfp4", block_size=np.int64(32))
    b = mxkit.quantize_fold(x, "mxfp4")
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    assert a == a and a != b and b in [a, b] and len({a, b}) == 2
    with pytest.raises(NotImplementedError, match="not on the meta device"):
        mxkit.quantize_fold(torch.empty(64, 64, device="meta"), "mxfp4")
    with pytest.raises(TypeError, match="defer must be a bool, got 'no'"):  # (taken by truthiness)
        mxkit.quantize_fold(x, "mxfp4", defer="no")
