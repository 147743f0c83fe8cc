"""The small-M MXFP8 x MXFP8 GEMM (path ``a8w8-mma``, ``mma_a8w8.cu``): the shipped PTX against its source on
the CPU; on the GPU its in-kernel activation quantization byte for byte against mxkit.quantize, the GEMM
against float64 (issue #22's row-wise bound), the fused call bit for bit against quantize-then-matmul."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re

import pytest
import torch
from conftest import assert_graph_replays, poison_allocator

import mxkit
import mxkit.nn
from mxkit.kernels.matmul import a8w8_linear, gemm_table_override, reference_gemm
from mxkit.kernels.matmul_details import _mma_a8w8
from mxkit.kernels.matmul_table import gemm_table, merge_tables

from .test_matmul import assert_within_bound, check, rand_mx

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
sm89 = pytest.mark.skipif(HAS_CUDA and torch.cuda.get_device_capability() < (8, 9), reason="needs sm_89 or newer")
WIDE = {"default": {"a8w8_mma": {"max_m": 64}}}  # the envelope's full range, whatever the GPU's table says


def in_launch(quant_max_m: int = 8):
    """The table in force with ``a8w8_mma.quant_max_m`` set for the default entry and this GPU's (the packaged
    value is 1): bf16 x of up to that many rows quantized inside the a8w8-mma launch, whatever the table says."""
    over = {"a8w8_mma": {"quant_max_m": quant_max_m}}
    return gemm_table_override(merge_tables(gemm_table(), {"default": over, torch.cuda.get_device_name(): over}))


def test_ptx_matches_source():
    """The shipped PTX was generated from the current .cu (its hash in the first line), declares PTX ISA 8.4
    for sm_89 and defines every kernel the launcher names."""
    ptx = _mma_a8w8.PTX.read_text()
    digest = hashlib.sha256(_mma_a8w8.SOURCE.read_bytes() + _mma_a8w8.COMMON.read_bytes()).hexdigest()[:16]
    assert f"(sha256 {digest})" in ptx.splitlines()[0], "run scripts/build_ptx.sh after editing mma_a8w8.cu"
    assert re.search(r"^\.version 8\.4$", ptx, re.M) and re.search(r"^\.target sm_89$", ptx, re.M)
    for p, rs in _mma_a8w8.KERNEL_R.items():
        for r in rs:
            for o in _mma_a8w8._OUT_NAMES.values():
                for q in ("", "_bf16in"):
                    assert f".entry mxfp8_a8w8{p}_r{r}_{o}{q}(" in ptx
    assert ".entry mxfp8_quantize_probe(" in ptx
    for r in (1, 2):  # the W8A16 kernels
        for o in _mma_a8w8._OUT_NAMES.values():
            for e in ("e4m3", "e5m2"):
                assert f".entry mxfp8_w16p_r{r}_{o}_{e}(" in ptx
    for act in ("swiglu_gpt_oss", "swiglu", None):  # the grouped (MoE) W8A16 kernels
        for e in ("e4m3", "e5m2"):
            assert f".entry {_mma_a8w8.grouped_w16_kernel_name(act, e)}(" in ptx


def test_bulk_ptx_matches_source():
    """The bulk-copy kernels' PTX (sm_90) was generated from the current mma_a8w8_bulk.cu, the mma_a8w8.cu it
    includes and the common header, and defines every kernel A8W8 names for it."""
    ptx = _mma_a8w8.PTX_BULK.read_text()
    src = _mma_a8w8.PTX_BULK.with_suffix(".cu").read_bytes() + _mma_a8w8.SOURCE.read_bytes()
    digest = hashlib.sha256(src + _mma_a8w8.COMMON.read_bytes()).hexdigest()[:16]
    assert f"(sha256 {digest})" in ptx.splitlines()[0], "run scripts/build_ptx.sh after editing the .cu files"
    assert re.search(r"^\.version 8\.4$", ptx, re.M) and re.search(r"^\.target sm_90$", ptx, re.M)
    entries = re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.M)
    assert sorted(entries) == sorted(f"mxfp8_a8w8p_bulk_{o}{q}" for o in _mma_a8w8._OUT_NAMES.values()
                                     for q in ("", "_bf16in"))


def test_bulk_policy():
    """Where the bulk-copy kernel fits and where the default takes it (132 SMs: N >= 2112; from bf16 at
    most BULK_X_SMEM bytes of x, up to 2 rows, 4 on N >= 14336; never W8A16, a weight as stored, a forced split or
    r, past 8 rows)."""
    fits = _mma_a8w8.bulk_fits
    assert fits(2112, 8192, 8, False, True, None, None, 1, None) and fits(2112, 8192, 1, True, True, None, 1, 1, 1)
    assert fits(64, 28672, 2, True, True, None, None, 1, None)
    assert not fits(64, 28672, 3, True, True, None, None, 1, None)  # (x of 88704 bytes)
    for args in [(2112, 8192, 9, False, True, None, None, 1, None), (2112, 8192, 1, False, False, None, None, 1, None),
                 (2112, 8192, 1, True, True, "e4m3", None, 1, None), (2112, 8192, 1, False, True, None, 2, 1, None),
                 (2112, 8192, 1, False, True, None, None, 1, 2)]:
        assert not fits(*args), args
    policy = _mma_a8w8.bulk_policy
    assert policy(2112, 8, False, 132) and not policy(2096, 1, False, 132)
    assert policy(4096, 2, True, 132) and not policy(4096, 3, True, 132) and not policy(14335, 3, True, 132)
    assert policy(14336, 4, True, 132) and not policy(14336, 5, True, 132) and policy(14336, 8, False, 132)


@pytest.mark.parametrize("N,K", [(16, 64), (48, 192), (32, 2880)])
def test_pack_a8w8_round_trip_and_fragments(N, K, rng):
    """The a8w8 layout holds the same bytes (round trip), lane 4g + t's words are its mma A fragment (rows g,
    g + 8 of the strip; block columns 8t .. 8t + 3, then 8t + 4 .. 8t + 7), and pack_weight carries it for E4M3
    weights (state_dict keeps the source only; packing again rebuilds it)."""
    from mxkit.kernels.matmul_details._mma_a8w8 import pack_a8w8, unpack_a8w8
    from mxkit.packed import PackedWeight

    w = rand_mx((N, K), "mxfp8_e4m3", rng)
    q, s = pack_a8w8(w.qdata, w.scale)
    assert q.dtype == torch.int32 and q.shape == (N // 16, K // 64, 2, 32, 4) and s.shape == (N // 16, K // 64, 8)
    back_q, back_s = unpack_a8w8(q, s)
    assert torch.equal(back_q, w.qdata) and torch.equal(back_s, w.scale)
    qb = q.view(torch.uint8).view(N // 16, K // 64, 2, 32, 16)
    for _ in range(20):
        r, kt, b, g, t = (int(torch.randint(n, (1,), generator=rng)) for n in (N // 16, K // 64, 2, 8, 4))
        c, n = 64 * kt + 32 * b + 8 * t, 16 * r + g
        want = torch.cat([w.qdata[n, c:c + 4], w.qdata[n + 8, c:c + 4], w.qdata[n, c + 4:c + 8],
                          w.qdata[n + 8, c + 4:c + 8]])
        assert torch.equal(qb[r, kt, b, 4 * g + t], want)
        sw = s[r, kt, g:g + 1].view(torch.uint8)
        assert sw.tolist() == [int(w.scale[n, 2 * kt]), int(w.scale[n, 2 * kt + 1]), int(w.scale[n + 8, 2 * kt]),
                               int(w.scale[n + 8, 2 * kt + 1])]
    pw = mxkit.pack_weight(w)
    assert torch.equal(pw.mma_q, q) and torch.equal(pw.mma_s, s)
    again = mxkit.pack_weight(PackedWeight.source_from_state_dict(pw.state_dict()))
    assert torch.equal(again.mma_q, q)


@pytest.mark.parametrize("r,w16,N", [(3, None, 96), (4, None, 64), (4, "e4m3", 128), (2, "e4m3", 48)])
def test_a8w8_refuses_strips_a_warp_it_has_no_kernel_for(r, w16, N):
    """``A8W8(r=...)`` (for A/B probes) is refused before any device work where mma_a8w8.cu has no kernel of r
    strips a warp for the call (plain layout: 1, 2; W8A16: 1, 2) or N is not a multiple of 16 r."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    w, sw = torch.zeros(N, 64, dtype=torch.uint8), torch.zeros(N, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="strips a warp"):
        A8W8(w, sw, 1, torch.bfloat16, w16 is not None, shape=(N, 64) if w16 else None, w16=w16, r=r)


def test_w8a16_split_policy():
    """One strip a warp (W8A16 up to W16_R1_MAX_M rows): the fewest of 1, 2, 4 blocks along K giving 4 blocks a
    multiprocessor, doubled for K >= 16384, each split at least 8 tiles of K (the H200 shapes it was measured on)."""
    from mxkit.kernels.matmul_details._mma_a8w8 import W16_R1_MAX_M, split_w16

    assert W16_R1_MAX_M == 8
    assert split_w16(28672 // 16, 8192, 132) == 1 and split_w16(8192 // 16, 8192, 132) == 2
    assert split_w16(8192 // 16, 28672, 132) == 4 and split_w16(4096 // 16, 14336, 132) == 4
    assert split_w16(2880 // 16, 4096, 132) == 4 and split_w16(28672 // 16, 28672, 132) == 2
    assert split_w16(1, 512, 132) == 1  # (8 tiles of K: K = 512 stays whole)
    # two strips a warp, 16 tokens a block (W16_R1_MAX_M < M <= W16_NT2_MAX_M): 2 blocks a multiprocessor, no doubling
    assert split_w16(28672 // 32, 8192, 132, 2) == 1 and split_w16(8192 // 32, 8192, 132, 2) == 2
    assert split_w16(8192 // 32, 28672, 132, 2) == 2 and split_w16(2880 // 32, 4096, 132, 2) == 4


@pytest.mark.parametrize("r,nt,w16", [(1, 2, "e4m3"), (2, 3, "e4m3"), (2, 2, None)])
def test_a8w8_refuses_token_tiles_it_has_no_kernel_for(r, nt, w16):
    """16 tokens a block (``nt=2``) exist for the W8A16 kernels at two strips a warp only."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    N = 64
    w, sw = torch.zeros(N, 64, dtype=torch.uint8), torch.zeros(N, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="token tiles"):
        A8W8(w, sw, 12, torch.bfloat16, True, shape=(N, 64), w16=w16, r=r, nt=nt)


def test_cpu_never_takes_a8w8(rng):
    a, w = rand_mx((2, 128), "mxfp8_e4m3", rng), rand_mx((32, 128), "mxfp8_e4m3", rng)
    assert mxkit.gemm_plan(a, w).path == "reference"
    assert a8w8_linear(torch.randn(2, 128).to(torch.bfloat16), w) is None


# ---------------------------------------------------------------------------------------------------------
# GPU


def _crafted_rows(K: int, g: torch.Generator) -> torch.Tensor:
    """bf16 rows [16, K]: random magnitudes over a wide exponent range, then blocks of zeros, -0, NaN, +-Inf,
    bf16 subnormals, amax just under a power of two (saturation to 448), E4M3 ties, huge and tiny values."""
    x = torch.randn(16, K, generator=g) * torch.exp2(torch.randint(-40, 40, (16, K // 32, 1), generator=g)
                                                     .float()).repeat_interleave(32, 1).view(16, K)
    x = x.to(torch.bfloat16)
    x[0, :32] = 0
    x[0, 32:64] = -0.0
    x[1, 5] = float("nan")
    x[1, 40] = float("inf")
    x[1, 70] = -float("inf")
    x[2, :32] = torch.tensor(2.0**-130, dtype=torch.bfloat16) * torch.arange(-16, 16).to(torch.bfloat16)
    x[3, :32] = 1.99 * torch.linspace(-1, 1, 32)  # amax < 2: scale 2^-8, codes past 448 saturate
    # ties: odd multiples of half an E4M3 step at several binades (scale fixed by the block's amax of 256)
    x[4, :32] = torch.tensor([256.0] + [(2 * i + 1) * 2.0 ** (e - 4) for e in range(-6, 2) for i in (3, 4, 5, 6)]
                             [:31], dtype=torch.bfloat16)
    x[5, :32] = 3.0e38
    x[5, 32:64] = 1.0e-38
    x[6, :] = -x[6, :].abs()
    return x


@pytest.mark.gpu
@gpu
@sm89
@pytest.mark.parametrize("K", [128, 2880, 8192])
def test_gpu_quantize_probe_bytes(K, rng):
    """The kernel's activation quantization (mxfp8_quantize_probe runs its device function) writes the bytes
    of mxkit.quantize(x, "mxfp8") (FLOOR, RNE): codes and scales, special blocks included."""
    x = _crafted_rows(K, rng).cuda()
    poison_allocator()
    q, s = _mma_a8w8.quantize_probe(x)
    ref = mxkit.quantize(x, "mxfp8_e4m3", backend="reference")
    assert torch.equal(s, ref.scale), "scale bytes differ"
    assert torch.equal(q, ref.qdata), "codes differ"


@pytest.mark.gpu
@gpu
@sm89
@pytest.mark.parametrize("K", [64, 2880, 4096, 8192, 28672])
def test_gpu_a8w8(K, rng):
    """M in issue #23's list and 8 / 9 / 17 (token-block edges); bias (float32, bf16), bf16 / fp16 / fp32 out;
    the weight as stored (MXTensor) and packed (the a8w8 layout); N = 1088 (R = 1 or 4 strips per warp on the
    packed layout), 1040 (R = 1 only) and 48; outputs poisoned first."""
    for N in (48, 1040, 1088) if K <= 4096 else (1088,):
        w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
        pw = mxkit.pack_weight(w)
        assert pw.mma_q is not None
        bias = torch.randn(N, generator=rng).cuda()
        with gemm_table_override(WIDE):
            for M in (1, 2, 3, 7, 8, 9, 16, 17, 33, 64):
                a = mxkit.quantize(torch.randn(M, K, generator=rng).cuda(), "mxfp8_e4m3")
                for b in (w, pw):
                    poison_allocator()
                    check(a, b, backend="auto", path="a8w8-mma", bias=bias if M % 2 else None)
                    if M in (1, 9):
                        poison_allocator()
                        check(a, b, backend="auto", path="a8w8-mma", out_dtype=torch.float32,
                              bias=bias.to(torch.bfloat16))
                        poison_allocator()
                        check(a, b, backend="auto", path="a8w8-mma", out_dtype=torch.float16)
            for b in (w, pw):
                y, _ = check(mxkit.quantize(torch.randn(2, 3, K, generator=rng).cuda(), "mxfp8_e4m3"), b,
                             backend="auto", path="a8w8-mma")
                assert y.shape == (2, 3, N)


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_a8w8_fused_equals_quantize_then_matmul(rng):
    """bf16 x quantized inside the kernel: with the same split of K, the kernel gives the bits of the same kernel
    on quantize(x) (as stored and packed, R = 1 / 2 / 4 strips per warp: R does not change the sums); through
    a8w8_linear (its own split) within the bound of quantize(x) @ w, for plain, 3-D, strided, unaligned and
    crafted x, M = 1 .. 16, with a bias; MXLinear(act_format="mxfp8") takes it."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    K, N = 2880, 5120
    w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
    pw = mxkit.pack_weight(w)
    bias = torch.randn(N, generator=rng).cuda()
    for M in (1, 5, 16):
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        a = mxkit.quantize(x, "mxfp8_e4m3")
        for split in (1, 2):
            for packed in (False, True):
                args = ((pw.mma_q, pw.mma_s) if packed else (w.qdata, w.scale))
                shape = (N, K) if packed else None
                yq = A8W8(*args, M, torch.bfloat16, quant=True, split=split, shape=shape)(x, None, bias)
                ya = A8W8(*args, M, torch.bfloat16, quant=False, split=split, shape=shape)(a.qdata, a.scale, bias)
                assert torch.equal(yq.view(torch.int16), ya.view(torch.int16)), (M, split, packed)
    big = torch.randn(4, K + 8, generator=rng).to(torch.bfloat16).cuda()
    xs = [torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda() for M in (1, 5, 16)]
    xs += [_crafted_rows(K, rng).cuda()[:9], torch.randn(2, 3, K, generator=rng).to(torch.bfloat16).cuda(),
           big[:, :K], big[:, 2:K + 2]]
    for quant_max_m in (8, 16):  # x of 9 .. 16 rows quantized first (two launches), or in the launch
        with gemm_table_override({"default": {"a8w8_mma": {"max_m": 64, "quant_max_m": quant_max_m}}}):
            for b in (w, pw):
                for x in xs:
                    poison_allocator()
                    y = a8w8_linear(x, b, bias)
                    a = mxkit.quantize(x, "mxfp8_e4m3")
                    assert mxkit.gemm_plan(a, b).path == "a8w8-mma"
                    assert y.shape == (*x.shape[:-1], N)
                    assert_within_bound(y, a, w, bias)
            lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
            mx = mxkit.nn.MXLinear.from_linear(lin, "mxfp8_e4m3", act_format="mxfp8_e4m3")
            # up to quant_max_m rows the layer takes its prepared one-launch call (made on the first call of each
            # x layout, then reused): the bits of a8w8_linear; past them a8w8_linear itself
            for x in xs[:2] + [xs[3][:1], xs[4][:, :2], big[:2, :K], big[:3, 2:K + 2], xs[2]]:
                for _ in range(2):
                    with torch.no_grad():
                        y = mx(x)
                    ref = a8w8_linear(x, mx._packed, lin.bias.detach(), x.dtype)
                    assert y.shape == ref.shape, x.shape
                    assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), x.shape
            assert any(k[0] == "a8w8-bf16" and v is not None for k, v in mx._packed._calls.items())


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_a8w8_special_scales(rng):
    """Weight scale bytes at the envelope's edges (WEIGHT_SCALE_BYTES: 19 and 232) and 200 are exact; a weight
    byte 0 (2^-127, below the envelope) takes another exact path; a weight scale 255 makes its column NaN; an
    activation block holding NaN or Inf (scale 255) makes its row NaN; every other output keeps its bits."""
    from mxkit.kernels.matmul_details._mma_a8w8 import WEIGHT_SCALE_BYTES

    K, N, M = 2880, 512, 5
    w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
    w.scale[3, 1], w.scale[4, 2] = WEIGHT_SCALE_BYTES
    w.scale[5, 0] = 200
    x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
    a = mxkit.quantize(x, "mxfp8_e4m3")
    check(a, w, backend="auto", path="a8w8-mma", out_dtype=torch.float32)
    w0 = mxkit.MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, tuple(w.shape))
    w0.scale[3, 1] = 0
    assert mxkit.gemm_plan(a, w0).path != "a8w8-mma"
    check(a, w0, backend="auto", out_dtype=torch.float32)
    y = mxkit.matmul(a, w)
    wn = mxkit.MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, tuple(w.shape))
    wn.scale[7, -1] = 255
    yn = mxkit.matmul(a, wn)
    keep = torch.arange(N, device="cuda") != 7
    assert torch.isnan(yn[:, 7]).all() and torch.equal(y[:, keep].view(torch.int16), yn[:, keep].view(torch.int16))
    xi = x.clone()
    xi[2, 100] = float("inf")
    yi, y0 = a8w8_linear(xi, w), a8w8_linear(x, w)
    rows = torch.arange(M, device="cuda") != 2
    assert torch.isnan(yi[2]).all() and torch.equal(yi[rows].view(torch.int16), y0[rows].view(torch.int16))


@pytest.mark.gpu
@gpu
@sm89
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("K", [64, 2880, 4096, 28672])
def test_gpu_w8a16_mma(fmt, K, rng):
    """bf16 x times a packed MXFP8 weight on the W8A16 mma kernel (path w8a16-mma, its envelope widened to 64 by
    a table override): M in issue #23's list and 8 / 9 / 17, N = 1040 (one strip per warp) and 1088 (two; 16 tokens
    a block at 9-16 rows, the bits of 8 a block), bias,
    bf16 / fp16 / fp32 out, 3-D and strided x, outputs poisoned first; scale bytes 0 and 200 exact, a scale byte
    255 makes its column NaN; K split over thread blocks (the same bits every call, counters reset); a weight
    with a NaN / Inf code takes another path."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    wide = {"default": {"w8a16_mma": {"max_m": 64}, "w8a16_wgmma": {"max_m": 0, "small_max_m": 0}}}
    for N in (1040, 1088) if K <= 4096 else (1088,):
        w = rand_mx((N, K), fmt, rng, base=120 if fmt == "mxfp8_e4m3" else 110, device="cuda")
        w.scale[3, 0] = 0
        w.scale[N - 1, -1] = 200
        pw = mxkit.pack_weight(w, act="float")
        bias = torch.randn(N, generator=rng).cuda()
        with gemm_table_override(wide):
            for M in (1, 2, 3, 7, 8, 9, 16, 17, 33, 64) if K <= 4096 else (1, 16):
                x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
                poison_allocator()
                y, _ = check(x, pw, backend="auto", path="w8a16-mma", bias=bias if M % 2 else None)
                if M in (1, 9):
                    poison_allocator()
                    check(x, pw, backend="auto", path="w8a16-mma", out_dtype=torch.float32, bias=bias)
                    check(x.half(), pw, backend="auto")  # (fp16 x: another path)
                    yh = mxkit.matmul(x, pw, out_dtype=torch.float16)
                    assert_within_bound(yh, x, pw, None)
            x3 = torch.randn(2, 3, K + 64, generator=rng).to(torch.bfloat16).cuda()[..., 32:K + 32]
            y3, _ = check(x3, pw, backend="auto", path="w8a16-mma", bias=bias)
            assert y3.shape == (2, 3, N)
            wn = mxkit.MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, tuple(w.shape))
            wn.scale[7, -1] = 255
            x = torch.randn(5, K, generator=rng).to(torch.bfloat16).cuda()
            pn = mxkit.pack_weight(wn, act="float")
            assert mxkit.gemm_plan(x, pn).path != "w8a16-mma"  # (has_nan: a 0xFF byte)
            yn = A8W8(pn.mma_q, pn.mma_s, 5, torch.bfloat16, True, shape=(N, K), w16=fmt[-4:])(x, None, None)
            y = mxkit.matmul(x, pw)
            keep = torch.arange(N, device="cuda") != 7
            assert torch.isnan(yn[:, 7]).all() and torch.equal(yn[:, keep].view(torch.int16),
                                                                y[:, keep].view(torch.int16))
        if K >= 2880:  # split-K: the same bits every call, within the bound
            for split, M in itertools.product((2, 3), (3, 9, 12, 16)):  # (9-16 rows on N = 1088: nt2)
                run = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, split=split, shape=(N, K), w16=fmt[-4:])
                assert run.r == (2 if M > 8 and N % 32 == 0 else 1) and run.nt == (2 if run.r == 2 else 1)
                x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
                poison_allocator()
                y = run(x, None, bias)
                assert_within_bound(y, x, pw, bias)
                poison_allocator()  # (the repeat's output would be the freed first one's block)
                assert torch.equal(run(x, None, bias).view(torch.int16), y.view(torch.int16))
                assert int(run.cnt.sum()) == 0
                if run.nt == 2:  # 16 tokens a block: each row the bits of 8 a block at the same split
                    one = A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, split=split, shape=(N, K),
                               w16=fmt[-4:], r=2, nt=1)
                    poison_allocator()
                    assert torch.equal(one(x, None, bias).view(torch.int16), y.view(torch.int16))
    wc = rand_mx((64, 128), fmt, rng, device="cuda")
    wc.qdata[1, 2] = 0x7F if fmt == "mxfp8_e4m3" else 0x7C
    x = torch.randn(1, 128, generator=rng).to(torch.bfloat16).cuda()
    assert mxkit.gemm_plan(x, mxkit.pack_weight(wc, act="float")).path != "w8a16-mma"


sm90 = pytest.mark.skipif(HAS_CUDA and torch.cuda.get_device_capability() < (9, 0), reason="needs sm_90 or newer")


@pytest.mark.gpu
@gpu
@sm90
@pytest.mark.parametrize("K", [64, 2880, 4096, 28672])
def test_gpu_a8w8_bulk_kernels(K, rng, monkeypatch):
    """The bulk-copy kernel (mma_a8w8_bulk.cu, MXFP8 codes in) gives the bytes of the register-load kernel at one
    thread block along K, call after call (a slot freed too early would show as a changed row), in poisoned
    memory: M 1 / 3 / 8, bias none / float32 / bf16, bf16 / fp16 / fp32 out, K of one tile (64), a partial last
    chunk (2880: 45 tiles, chunks of 16) and whole chunks; N of 2112 (132 strips: a block per strip on 132 SMs)
    and 4800 (300: blocks looping over strips); within the bound. The same for bf16 x quantized once per block
    into shared memory against the register kernel quantizing it in its loop, up to BULK_X_SMEM bytes of x
    (K = 28672: up to 2 rows). The policy takes it at M <= 8 on layers of at least one strip per multiprocessor,
    not past 8 rows, not for W8A16; MXKIT_A8W8_BULK=0 turns it off."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for N in (2112, 4800) if K <= 4096 else (2112,):
        bias32 = torch.randn(N, generator=rng).cuda()
        w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
        pw = mxkit.pack_weight(w)
        for M, out, bias in ((1, torch.bfloat16, None), (2, torch.bfloat16, bias32), (3, torch.float16, bias32),
                             (8, torch.float32, bias32.to(torch.bfloat16)), (8, torch.bfloat16, bias32)):
            x = torch.randn(M, K, generator=rng).cuda()
            a = mxkit.quantize(x, "mxfp8_e4m3")
            xb = x.to(torch.bfloat16)
            for quant, xin, xs in ((False, a.qdata, a.scale), (True, xb, None)):
                args = (pw.mma_q, pw.mma_s, M, out, quant)
                fits = not quant or M * (K + K // 32) <= _mma_a8w8.BULK_X_SMEM
                policy = _mma_a8w8.bulk_policy(N, M, quant, sms)
                assert A8W8(*args, shape=(N, K)).bulk == (N // 16 >= sms and fits and policy)
                if not fits:
                    with pytest.raises(ValueError, match="bulk-copy"):
                        A8W8(*args, shape=(N, K), bulk=True)
                    continue
                bulk = A8W8(*args, shape=(N, K), bulk=True)
                assert bulk.bulk and bulk.block == 160 and bulk.grid == (1, min(N // 16, 2 * sms), 1)
                # (the register kernel at split 1: bf16 x quantized in it, r = 2 strips a warp: the same sums)
                ref = A8W8(*args, shape=(N, K), split=1, bulk=False)(xin, xs, bias)
                for _ in range(4):
                    poison_allocator()
                    y = bulk(xin, xs, bias)
                    assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8)), (N, K, M, quant)
                if M == 3:
                    assert_within_bound(y, mxkit.quantize(xb, "mxfp8_e4m3") if quant else a, w, bias)
    w = rand_mx((4800, 128), "mxfp8_e4m3", rng, device="cuda")
    pw = mxkit.pack_weight(w, act="float")
    assert A8W8(pw.mma_q, pw.mma_s, 1, torch.bfloat16, False, shape=(4800, 128)).bulk
    assert not A8W8(pw.mma_q, pw.mma_s, 9, torch.bfloat16, False, shape=(4800, 128)).bulk
    assert not A8W8(pw.mma_q, pw.mma_s, 1, torch.bfloat16, True, shape=(4800, 128), w16="e4m3").bulk
    assert A8W8(pw.mma_q, pw.mma_s, 1, torch.bfloat16, True, shape=(4800, 128)).bulk  # (bf16 x quantized)
    with pytest.raises(ValueError, match="bulk-copy"):
        A8W8(pw.mma_q, pw.mma_s, 9, torch.bfloat16, False, shape=(4800, 128), bulk=True)
    monkeypatch.setenv("MXKIT_A8W8_BULK", "0")
    _mma_a8w8.bulk_unavailable.cache_clear()
    try:
        assert not A8W8(pw.mma_q, pw.mma_s, 1, torch.bfloat16, False, shape=(4800, 128)).bulk
    finally:
        monkeypatch.delenv("MXKIT_A8W8_BULK")
        _mma_a8w8.bulk_unavailable.cache_clear()


@pytest.mark.gpu
@gpu
@sm90
def test_gpu_a8w8_bulk_graph(rng):
    """matmul(MXFP8 a, packed MXFP8 weight) at M = 2 on a layer the bulk-copy kernel takes, and an MXLinear with
    MXFP8 activations at M = 1 (x quantized in the bulk kernel's launch): within the bound, their prepared calls
    the bulk kernel, replays in a CUDA graph with new inputs equal to eager."""
    K, N = 2880, 4096
    pw = mxkit.pack_weight(rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda"))
    a = mxkit.quantize(torch.randn(2, K, generator=rng).cuda(), "mxfp8_e4m3")
    y = mxkit.matmul(a, pw)
    assert_within_bound(y, a, pw, None)
    assert any(run.bulk for run in pw.__dict__["_a8w8"].values())

    def fresh():
        new = mxkit.quantize(torch.randn(2, K, generator=rng).cuda(), "mxfp8_e4m3")
        return [new.qdata, new.scale]

    assert_graph_replays(lambda q, s: mxkit.matmul(dataclasses.replace(a, qdata=q, scale=s), pw), [a.qdata, a.scale],
                         fresh, replays=2, check=lambda yg: assert_within_bound(yg, a, pw, None))
    # MXLinear(act_format="mxfp8") at M = 1: bf16 x quantized in the bulk kernel's launch, replayed in a graph
    lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
    mx = mxkit.nn.MXLinear.from_linear(lin, "mxfp8_e4m3", act_format="mxfp8_e4m3")
    x = torch.randn(1, K, generator=rng).to(torch.bfloat16).cuda()
    with torch.no_grad():
        y0 = mx(x)
        assert_within_bound(y0, mxkit.quantize(x, "mxfp8_e4m3"), mx._packed, lin.bias)
        calls = mx._packed.__dict__.get("_calls", {}).values()
        assert any(getattr(getattr(c, "run", None), "bulk", False) for c in calls)
        _assert_graph_replays(mx, x, rng)


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_w8a16_mma_large_envelope(rng):
    """The table's ``w8a16_mma.large_max_m`` widens the W8A16 envelope on weights of N * K >= ``large_min_nk``
    only: 12 rows take w8a16-mma (16 tokens a block) on the larger weight, the other path on the smaller one, and
    17 rows neither; each output within the bound."""
    table = {"default": {"w8a16_mma": {"max_m": 8, "large_max_m": 16, "large_min_nk": 1088 * 1024}}}
    with gemm_table_override(table):
        for N, M, want in ((1088, 12, True), (512, 12, False), (1088, 17, False), (512, 8, True)):
            pw = mxkit.pack_weight(rand_mx((N, 1024), "mxfp8_e4m3", rng, base=120, device="cuda"), act="float")
            x = torch.randn(M, 1024, generator=rng).to(torch.bfloat16).cuda()
            path = mxkit.gemm_plan(x, pw).path
            assert (path == "w8a16-mma") == want, (N, M, path)
            poison_allocator()
            check(x, pw, backend="auto", path=path)


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_w8a16_mma_graph_and_mxlinear(rng):
    """An MXFP8 MXLinear at M = 1 takes w8a16-mma (its packed weight carries the a8w8 layout) and replays in a CUDA
    graph with new x equal to eager."""
    K, N = 4096, 2048
    lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):
        mx = mxkit.nn.MXLinear.from_linear(lin, fmt)
        x = torch.randn(1, K, generator=rng).to(torch.bfloat16).cuda()
        with torch.no_grad():
            y0 = mx(x)
            assert mxkit.gemm_plan(x, mx._packed).path == "w8a16-mma"
            assert_within_bound(y0, x, mx._packed, lin.bias)
            _assert_graph_replays(mx, x, rng)


@pytest.mark.gpu
@gpu
@sm89
@pytest.mark.parametrize("split", [2, 3, 7])
def test_gpu_a8w8_split_k(split, rng):
    """K split over thread blocks: within the bound, the same bits on every call, the counters reset."""
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8

    N, K = 1024, 4096 + 64 * split
    w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
    bias = torch.randn(N, generator=rng).cuda()
    pq, ps = _mma_a8w8.pack_a8w8(w.qdata, w.scale)
    for M, packed in ((1, False), (17, False), (1, True), (17, True)):
        a = mxkit.quantize(torch.randn(M, K, generator=rng).cuda(), "mxfp8_e4m3")
        run = (A8W8(pq, ps, M, torch.bfloat16, quant=False, split=split, shape=(N, K)) if packed
               else A8W8(w.qdata, w.scale, M, torch.bfloat16, quant=False, split=split))
        assert run.split == split
        poison_allocator()
        y = run(a.qdata, a.scale, bias)
        assert_within_bound(y, a, w, bias)
        for _ in range(3):  # (poisoned first: each call's output would be the freed last one's block)
            poison_allocator()
            assert torch.equal(run(a.qdata, a.scale, bias).view(torch.int16), y.view(torch.int16))
        assert int(run.cnt.sum()) == 0


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_a8w8_in_a_cuda_graph(rng):
    """MXLinear(act_format="mxfp8") (the fused launch) captured in a CUDA graph: replays with new x equal eager."""
    K, N = 4096, 2048
    lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
    mx = mxkit.nn.MXLinear.from_linear(lin, "mxfp8_e4m3", act_format="mxfp8_e4m3")
    x = torch.randn(4, K, generator=rng).to(torch.bfloat16).cuda()
    with torch.no_grad(), in_launch():
        mx(x)
        _assert_graph_replays(mx, x, rng)


def _assert_graph_replays(mx, x: torch.Tensor, rng) -> None:
    """``mx(x)`` captured in a CUDA graph: three replays with new values in x, outputs poisoned first, each output
    bit-equal to eager and within the bound."""
    def within_bound(y):
        a = x if mx.act_format is None else mxkit.quantize(x, mx.act_format)
        assert_within_bound(y, a, mx._packed, mx.bias)

    assert_graph_replays(mx, [x], lambda: [torch.randn(x.shape, generator=rng).to(torch.bfloat16)],
                         check=within_bound)


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_a8w8_prepared_call(rng):
    """matmul(MXFP8 a, packed MXFP8 weight) keeps its a8w8-mma call on the weight: repeated calls (and a bias)
    give the bits of the planned path; an MX pair of another path is planned every call (its plan reads a's
    scales) and still right."""
    from mxkit.kernels.matmul import plan_gemm, run_gemm

    K, N = 4096, 2048
    pw = mxkit.pack_weight(rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda"))
    bias = torch.randn(N, generator=rng).cuda()
    for M in (1, 7, 33):
        a = mxkit.quantize(torch.randn(M, K, generator=rng).cuda(), "mxfp8_e4m3")
        want = run_gemm(a, pw, plan_gemm(a, pw), bias)
        for _ in range(3):
            poison_allocator()
            assert torch.equal(mxkit.matmul(a, pw, bias=bias).view(torch.int16), want.view(torch.int16))
    assert any(c is not None for c in pw.__dict__["_calls"].values())
    a6 = mxkit.quantize(torch.randn(3, K, generator=rng).cuda(), "mxfp6_e2m3")
    for _ in range(2):
        check(a6, pw, backend="auto")


@pytest.mark.gpu
@gpu
@sm89
def test_gpu_a8w8_extreme_block_scales(rng):
    """Activation blocks at scale bytes up to 254 against weight blocks near the low edge of the a8w8 envelope
    (byte 20): the products are finite and the kernel's (weight factor first, activation factor in the fma)
    keeps them exact, within the bound (the activation factor first overflowed to inf); a weight with a byte
    below the envelope takes the float32 route (the reference twin's), where 448 * 2^127 is Inf."""
    N, K, M = 64, 256, 4
    w = rand_mx((N, K), "mxfp8_e4m3", rng, device="cuda")
    ws = w.scale.clone()
    ws[:, 1] = 20  # weight factor 2^-107
    w = mxkit.MXTensor(w.qdata, ws, w.fmt, 1, 32, (N, K))
    a = rand_mx((M, K), "mxfp8_e4m3", rng, device="cuda")
    s = a.scale.clone()
    s[:, 1] = torch.tensor([254, 250, 240, 230], dtype=torch.uint8)  # 2^127 .. 2^103 against 2^-107
    a = mxkit.MXTensor(a.qdata, s, a.fmt, 1, 32, (M, K))
    for weight in (w, mxkit.pack_weight(w)):
        assert mxkit.gemm_plan(a, weight).path == "a8w8-mma"
        y = mxkit.matmul(a, weight)
        assert torch.isfinite(y).all()
        assert_within_bound(y, a, w, None)
    # below the envelope the plan leaves a8w8-mma for the float32 route (every value decoded to float32, as the
    # reference twin does): the rows whose values fit float32 (bytes 240, 230) stay within the bound; those
    # past it (448 * 2^127, 448 * 2^123: Inf in float32) give the reference's non-finite results
    ws[0, 2] = 10
    low = mxkit.MXTensor(w.qdata, ws, w.fmt, 1, 32, (N, K))
    fits = mxkit.MXTensor(a.qdata[2:], a.scale[2:], a.fmt, 1, 32, (M - 2, K))
    ref = reference_gemm(a.to("cpu"), low.to("cpu"), torch.bfloat16)
    for weight in (low, mxkit.pack_weight(low)):
        assert mxkit.gemm_plan(a, weight).path != "a8w8-mma"
        y = mxkit.matmul(a, weight)
        assert_within_bound(y[2:], fits, low, None)
        assert torch.equal(torch.isfinite(y[:2]).cpu(), torch.isfinite(ref[:2]))
        assert not torch.isfinite(ref[:2]).all()


def test_weight_scale_envelope_keeps_the_products_exact():
    """WEIGHT_SCALE_BYTES: for every nonzero block sum c the kernel can form (a multiple of 2^-18 up to 32 * 448^2),
    c * 2^(s - 127) is a normal float32 (so exact) exactly for s in the envelope."""
    lo, hi = _mma_a8w8.WEIGHT_SCALE_BYTES
    tiny, big = torch.tensor(2.0**-18), torch.tensor(float(torch.finfo(torch.float32).max), dtype=torch.float32)
    big_c = torch.tensor(32 * 448.0 * 448.0)  # 32 products of the largest E4M3 values
    normal = torch.finfo(torch.float32).tiny
    for s in range(0, 255):
        f = torch.tensor(2.0 ** (s - 127), dtype=torch.float64)
        ok = bool((tiny.double() * f >= normal) & (big_c.double() * f <= big.double()))
        assert ok == (lo <= s <= hi), s
