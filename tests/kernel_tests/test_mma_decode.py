"""The tensor-core decode GEMM (path ``decode-mma``): its weight layout on the CPU (byte-exact round trip,
every fragment position), the shipped PTX against its source, and the kernel on the GPU against float64."""

from __future__ import annotations

import hashlib
import itertools
import re

import pytest
import torch
from conftest import assert_graph_replays, poison_allocator

import mxkit
from mxkit.kernels.matmul import gemm_table_override
from mxkit.kernels.matmul_details import _mma_decode
from mxkit.kernels.matmul_details._mma_decode import pack_mma, unpack_mma
from mxkit.packed import PackedWeight

from .test_matmul import assert_within_bound, check, rand_mx
from .test_mma_a8w8 import in_launch

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


@pytest.mark.parametrize("N,K", [(16, 64), (48, 192), (32, 2880), (160, 4096)])
def test_pack_mma_round_trip(N, K, rng):
    q = torch.randint(0, 256, (N, K // 2), generator=rng, dtype=torch.uint8)
    s = torch.randint(0, 256, (N, K // 32), generator=rng, dtype=torch.uint8)
    pq, ps = pack_mma(q, s)
    assert pq.dtype == ps.dtype == torch.int32
    assert pq.shape == (N // 16, K // 64, 32, 4) and ps.shape == (N // 16, K // 64, 8)
    q2, s2 = unpack_mma(pq, ps)
    assert torch.equal(q2, q) and torch.equal(s2, s)


def test_pack_mma_every_fragment_position(rng):
    """Each code of each lane's word is where mma_decode.cu's header says: code bits (m, e0, e1, sign) of
    pair p = h + 2 kh, half e at BITS[p, e], for row 16r + 8h + g, column 64 tile + 32 b + 8 t + 4 s + 2 kh + e
    of word j = 2b + s of lane 4g + t; the 32 bit positions used once each; each lane's scale word holds
    (g, block 0), (g, 1), (g + 8, 0), (g + 8, 1)."""
    assert sorted(b for pos in _mma_decode.BITS.values() for b in pos) == list(range(32))
    N, K = 32, 128
    q = torch.randint(0, 256, (N, K // 2), generator=rng, dtype=torch.uint8)
    s = torch.randint(0, 256, (N, K // 32), generator=rng, dtype=torch.uint8)
    codes = torch.stack([q & 0xF, q >> 4], -1).flatten(-2)
    pq, ps = pack_mma(q, s)
    sw = ps.view(torch.uint8).view(N // 16, K // 64, 8, 4)
    for r in range(N // 16):
        for tile in range(K // 64):
            for lane in range(32):
                g, t = divmod(lane, 4)
                for j in range(4):
                    b, st = divmod(j, 2)
                    word = int(pq[r, tile, lane, j]) & 0xFFFFFFFF
                    for (p, e), pos in _mma_decode.BITS.items():
                        h, kh = p & 1, p >> 1
                        code = sum(((word >> at) & 1) << bit for bit, at in enumerate(pos))
                        assert code == int(codes[16 * r + 8 * h + g, 64 * tile + 32 * b + 8 * t + 4 * st + 2 * kh + e])
            for g in range(8):
                want = [s[16 * r + g, 2 * tile], s[16 * r + g, 2 * tile + 1], s[16 * r + g + 8, 2 * tile],
                        s[16 * r + g + 8, 2 * tile + 1]]
                assert [int(v) for v in sw[r, tile, g]] == [int(v) for v in want]


@pytest.mark.parametrize("shape", [(8, 64), (16, 32), (16, 96)])
def test_pack_mma_rejects_shapes(shape):
    N, K = shape
    with pytest.raises(ValueError, match="N % 16 == 0 and K % 64 == 0"):
        pack_mma(torch.zeros(N, K // 2, dtype=torch.uint8), torch.zeros(N, K // 32, dtype=torch.uint8))


def test_ptx_matches_source():
    """The shipped PTX was generated from the current .cu (scripts/build_ptx.sh writes the source's hash), it
    declares PTX ISA 7.8 for sm_80 and defines every kernel the launchers name (dense: m8 / m8l / m8g by the table, m16,
    m16l, m16n by shape, m16g / m16ng where the table takes the ring;
    grouped: each activation, 1 or 2 tiles a batch; pairs: each activation; each with its special-scale
    variant)."""
    ptx = _mma_decode.PTX.read_text()
    digest = hashlib.sha256(_mma_decode.SOURCE.read_bytes() + _mma_decode.COMMON.read_bytes()).hexdigest()[:16]
    assert f"(sha256 {digest})" in ptx.splitlines()[0], "run scripts/build_ptx.sh after editing mma_decode.cu"
    assert re.search(r"^\.version 7\.8$", ptx, re.M) and re.search(r"^\.target sm_80$", ptx, re.M)
    names = set()
    for M, N, K in [(1, 4096, 4096), (16, 6144, 4096), (16, 4096, 4096), (16, 8192, 8192)]:
        for out in _mma_decode._OUT_NAMES:
            for sp in (False, True):
                for loop in _mma_decode.M8_LOOPS[: 3 if M > 8 else None]:  # (the ring of 2: up to 8 rows)
                    names.add(_mma_decode.dense_kernel_name(M, N, K, out, sp, loop, sms=132))
    for act in ("swiglu_gpt_oss", "swiglu", None):
        for n in (1, _mma_decode.SMALL_PAIRS, _mma_decode.SMALL_PAIRS + 1, 256):
            for sp in (False, True):
                for sn in _mma_decode.GROUPED_STRIPS:
                    names.add(_mma_decode.grouped_kernel_name(act, n, sp, sn))
    for act in ("swiglu_gpt_oss", "swiglu", None):
        for sp in (False, True):
            names.add(_mma_decode.pairs_kernel_name(act, sp))
    # m8 / m8l / m8g / m8g2 / m16 / m16l / m16n / m16g / m16ng x 3 dtypes x 2; 3 activations x (u2, u1 at 1 / 2 / 4
    # strips) x 2; pairs 3 x 2
    assert len(names) == 54 + 24 + 6
    assert "mxfp4_mma_decode_m16ng_f32_special" in names and "mxfp4_mma_decode_m16g_bf16" in names
    assert "mxfp4_mma_decode_m8g_f16_special" in names and "mxfp4_mma_decode_m8g2_bf16" in names
    assert "mxfp4_mma_grouped_swiglu_s4_special" in names
    with pytest.raises(ValueError, match="strips a block"):
        _mma_decode.grouped_kernel_name(None, 64, False, 3)
    assert "mxfp4_mma_decode_m16l_f32_special" in names and "mxfp4_mma_grouped_down_u2" in names
    assert "mxfp4_mma_pairs_down_special" in names
    for name in names:
        assert f".entry {name}(" in ptx, name


def test_pack_weight_carries_the_mma_layout(rng):
    w = rand_mx((64, 256), "mxfp4_e2m1", rng)
    pw = mxkit.pack_weight(w)
    assert pw.mma_q is not None and pw.mma_s is not None
    q, s = unpack_mma(pw.mma_q, pw.mma_s)
    assert torch.equal(q, w.qdata) and torch.equal(s, w.scale)
    assert pw.nbytes == w.nbytes + pw.folded.data.numel() + 4 * pw.folded.scale.numel() + 4 * (
        pw.mma_q.numel() + pw.mma_s.numel())
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(pw)
    back = pytree.tree_unflatten(leaves, spec)
    assert torch.equal(back.mma_q, pw.mma_q) and torch.equal(back.mma_s, pw.mma_s)
    assert torch.equal(pw.to("cpu").mma_q, pw.mma_q)
    # state_dict keeps the source only; packing again rebuilds the same layout
    again = mxkit.pack_weight(PackedWeight.source_from_state_dict(pw.state_dict()))
    assert torch.equal(again.mma_q, pw.mma_q) and torch.equal(again.mma_s, pw.mma_s)
    for other in (rand_mx((64, 256), "mxint8", rng), rand_mx((40, 256), "mxfp4_e2m1", rng),
                  rand_mx((64, 96), "mxfp4_e2m1", rng), rand_mx((40, 256), "mxfp8_e5m2", rng)):
        assert mxkit.pack_weight(other).mma_q is None  # (MXFP8 of N % 16 == 0, K % 64 == 0: the a8w8 layout)


def test_split_k_policy():
    from mxkit.kernels.matmul_details._mma_decode import split_k

    assert split_k(256, 14336, 8, 132) == 2 and split_k(512, 28672, 8, 132) == 1
    assert split_k(64, 4096, 8, 132) == 1 and split_k(256, 14336, 16, 132) == 1
    # 4 strips a block (m16n): 2 only for a grid short of the multiprocessors and a long K
    assert split_k(128, 28672, 16, 132, 4) == 2 and split_k(128, 8192, 16, 132, 4) == 1
    assert split_k(448, 28672, 16, 132, 4) == 1


def test_grouped_mma_refuses_strips_it_has_no_kernel_for():
    """grouped_mma's strips a block: one of GROUPED_STRIPS, refused before any device work otherwise."""
    z = torch.zeros(1)
    for bad in (0, 3, 8):
        with pytest.raises(ValueError, match="strips a block"):
            _mma_decode.grouped_mma(z, z, z, False, 64, 64, z, z, 16, 4, gather=False, bias=None, activation=None,
                                    rw=z, out=z, strips=bad)


def test_m16_kernel_by_shape():
    """m16n (4 strips a block sharing x) for N >= 8192 in whole blocks of strips, else m16 / m16l as before;
    up to 8 rows the m8 kernels whatever N; at 9-16 rows where the m8 kernel takes its ring, the ring loops
    (m16g, m16ng)."""
    md = _mma_decode
    assert md.m16_loop(8192, 8192) == "n" and md.m16_loop(28672, 4096) == "n"
    assert md.m16_loop(8192 + 16, 4096) == "" and md.m16_loop(4096, 14336) == "l" and md.m16_loop(6144, 4096) == ""
    assert md.kernel_shape(16, 28672, 8192) == (4, 4) and md.kernel_shape(64, 8192, 8192) == (4, 4)
    assert md.kernel_shape(8, 28672, 8192) == (4, 1) and md.kernel_shape(16, 4096, 4096) == (8, 1)
    assert md.dense_kernel_name(33, 8192, 8192, torch.bfloat16, False) == "mxfp4_mma_decode_m16n_bf16"
    assert md.dense_kernel_name(8, 8192, 8192, torch.bfloat16, False, "l") == "mxfp4_mma_decode_m8l_bf16"
    # where the m8 kernel takes its ring ("g"), the m16 kernels take theirs: m16ng (2 strips) for m16n up to K < 16384
    # where its grid fits one wave of 3 blocks an SM, m16g (8 warps) for m16l; the cp.async kernel stays
    assert md.m16_loop(8192, 8192, True, 132) == "ng" and md.m16_loop(8192, 16384, True, 132) == "n"
    assert md.m16_loop(12672, 8192, True, 132) == "ng" and md.m16_loop(12672 + 64, 8192, True, 132) == "n"
    assert md.m16_loop(8192, 8192, True) == "n" and md.m16_loop(14336, 8192, True, 132) == "n"
    assert md.m16_loop(4096, 14336, True) == "g" and md.m16_loop(6144, 4096, True) == ""
    assert md.kernel_shape(16, 8192, 8192, True, 132) == (4, 2) and md.kernel_shape(16, 4096, 14336, True) == (8, 1)
    assert md.kernel_shape(16, 8192, 8192, True, 85) == (4, 4)  # (256 blocks of 2 strips: more than a wave)
    assert md.kernel_shape(8, 8192, 8192, True, 132) == (4, 1) and md.kernel_shape(16, 8192, 28672, True, 132) == (4, 4)
    assert md.dense_kernel_name(16, 8192, 8192, torch.bfloat16, True, "g", 132) == \
        "mxfp4_mma_decode_m16ng_bf16_special"
    assert md.dense_kernel_name(12, 4096, 14336, torch.float16, False, "g") == "mxfp4_mma_decode_m16g_f16"
    assert md.dense_kernel_name(12, 4096, 14336, torch.float16, False, "l") == "mxfp4_mma_decode_m16l_f16"
    # past 16 rows (more than one block of tokens) the lean loops, as measured
    assert md.dense_kernel_name(17, 4096, 14336, torch.float16, False, "g") == "mxfp4_mma_decode_m16l_f16"
    assert md.dense_kernel_name(33, 8192, 8192, torch.bfloat16, False, "g", 132) == "mxfp4_mma_decode_m16n_bf16"
    assert md.kernel_shape(64, 8192, 8192, True, 132) == (4, 4) and md.kernel_shape(16, 8192, 8192, True, 132)[1] == 2


def test_cpu_plan_never_takes_decode_mma(rng):
    """On the CPU the plan of bf16 x a packed MXFP4 weight at M = 1 (what run_gemm runs there) is dense-exact:
    the decode kernel needs CUDA."""
    from mxkit.kernels import matmul as km

    pw = mxkit.pack_weight(rand_mx((64, 256), "mxfp4_e2m1", rng))
    assert km.plan_gemm(torch.randn(1, 256).to(torch.bfloat16), pw).path == "dense-exact"


# ---------------------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("K", [64, 2880, 4096, 8192, 28672])
def test_gpu_decode_mma(K, rng):
    """M in issue #23's list and 8 / 9 / 17 (token-block edges), with and without bias (float32 and bf16), bf16 / fp16 / fp32 out, 3-D x;
    the scale bytes 0 (2^-127) and 200 in the weight (every scale byte is exact on this path: the block sums
    are scaled in float32); N = 16, and N = 1040 (65 strips); outputs poisoned before each call."""
    N = 16 if K == 64 else 1040
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
    w.scale[3, 1] = 0
    w.scale[5, 0] = 200  # 6 * 2^73: far from the float32 / bf16 overflow
    pw = mxkit.pack_weight(w)
    w16 = mxkit.MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, tuple(w.shape))
    w16.scale[5, 0] = 127  # fp16 out: a row of 2^73 would overflow it
    pw16 = mxkit.pack_weight(w16)
    bias = torch.randn(N, generator=rng).cuda()
    with gemm_table_override({"default": {"decode_mma": {"max_m": 64}}}):  # the H200's table stops at 32
        for M in (1, 2, 3, 7, 8, 9, 16, 17, 33, 64):
            a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
            poison_allocator()
            check(a, pw, backend="auto", path="decode-mma", bias=bias if M % 2 else None)
            poison_allocator()
            check(a, pw, backend="auto", path="decode-mma", out_dtype=torch.float32,
                  bias=bias.to(torch.bfloat16) if M == 3 else None)
            poison_allocator()
            check(a, pw16, backend="auto", path="decode-mma", out_dtype=torch.float16)
        y, _ = check(torch.randn(2, 3, K, generator=rng).to(torch.bfloat16).cuda(), pw, backend="auto",
                     path="decode-mma")
    assert y.shape == (2, 3, N)


@pytest.mark.gpu
@gpu
def test_gpu_decode_mma_nan_block(rng):
    """A NaN scale byte (0xFF) makes its row's outputs NaN and leaves every other column byte-identical."""
    K, N = 2880, 512
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
    wn = mxkit.MXTensor(w.qdata, w.scale.clone(), w.fmt, 1, 32, tuple(w.shape))
    wn.scale[7, -1] = 255
    a = torch.randn(5, K, generator=rng).to(torch.bfloat16).cuda()
    y, yn = mxkit.matmul(a, mxkit.pack_weight(w)), mxkit.matmul(a, mxkit.pack_weight(wn))
    assert mxkit.gemm_plan(a, mxkit.pack_weight(wn)).path == "decode-mma"
    assert torch.isnan(yn[:, 7]).all()
    keep = torch.arange(N, device="cuda") != 7
    assert torch.equal(y[:, keep].view(torch.int16), yn[:, keep].view(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("K", [64, 192, 1600, 2880, 8192])
def test_gpu_decode_mma_m8_loops_give_the_same_bytes(K, rng):
    """The four m8 kernels (register loop, 4 tiles a batch; lean loop, 2; ring loops, 4 or 2 in flight) split K over
    the same 4 warps: the same bytes for 1 .. 8 rows, bias or not, every out dtype, the special-scale variant too,
    K tiles short of a batch or of the ring (K = 64, 192; 1600: 6-7 tiles a warp, the ring's tail refilled) and a
    split along K (8192 on few strips); within the bound of the float64 product."""
    from mxkit.kernels.matmul_details._mma_decode import MmaDecode

    N = 48 if K < 2880 else 1040
    bias = torch.randn(N, generator=rng).cuda()
    for special in (False, True):
        w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
        if special:
            w.scale[3, 0] = 0  # (the special-scale variant)
        pw = mxkit.pack_weight(w)
        for M, out in ((1, torch.bfloat16), (3, torch.float32), (8, torch.float16)):
            x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
            ys = []
            for loop in _mma_decode.M8_LOOPS:
                run = MmaDecode.of(pw, M, out, loop)
                assert run.kernel is not None and f"_m8{loop}_" in run.kernel.name
                assert run.kernel.name.endswith("_special") == special
                poison_allocator()
                ys.append(run(x, bias if M != 3 else None))
            for y in ys[1:]:
                assert torch.equal(ys[0].view(torch.uint8), y.view(torch.uint8)), (M, out, special)
            assert_within_bound(ys[1], x, w, bias if M != 3 else None)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("K", [64, 192, 2880, 8192])
def test_gpu_decode_mma_m16n_gives_m8l_bytes(K, rng):
    """m16n (4 warps, 4 strips a block sharing each x load, 16 tokens a block) computes each block of 8 tokens as
    m8l does (the same 4 warps split K): byte-equal to m8l on rows 0-7, 8-15, ... for 9 / 16 / 17 / 33 / 64 rows
    (absent tokens of the last block), bias float32 / bf16 or none, every out dtype, the special-scale variant,
    split 1 and 2; within the bound of the float64 product; the dispatch picks it for N >= 8192."""
    from mxkit.kernels.matmul_details._mma_decode import MmaDecode

    N = 8192
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
    w.scale[3, 0] = 0  # (the special-scale variant)
    w.scale[4100, -1] = 131  # (2^4: fp16 out holds the row)
    pw = mxkit.pack_weight(w)
    bias = torch.randn(N, generator=rng).cuda()
    cases = ((9, torch.bfloat16, bias), (16, torch.float32, bias.to(torch.bfloat16)), (17, torch.float16, None),
             (33, torch.bfloat16, None), (64, torch.bfloat16, bias))
    for (M, out, b), split in itertools.product(cases, (1, 2)):
        if split == 2 and K == 64:
            continue
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        run = MmaDecode(pw.mma_q, pw.mma_s, N, K, M, out, special=True, split=split)
        assert "_m16n_" in run.kernel.name and run.block == 128 and run.grid[1] == N // 64 and run.split == split
        poison_allocator()
        y = run(x, b)
        for r0 in range(0, M, 8):
            rows = min(8, M - r0)
            poison_allocator()
            ref = MmaDecode(pw.mma_q, pw.mma_s, N, K, rows, out, special=True, split=split, m8_loop="l")(
                x[r0:r0 + rows], b)
            assert torch.equal(y[r0:r0 + rows].view(torch.uint8), ref.view(torch.uint8)), (M, out, split, r0)
        assert_within_bound(y, x, w, b.float() if b is not None else None)
    a = torch.randn(16, K, generator=rng).to(torch.bfloat16).cuda()
    assert mxkit.gemm_plan(a, pw).path == "decode-mma"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("N,K", [(1040, 192), (1040, 1600), (1040, 8192), (8192, 64), (8192, 2880), (8192, 8192)])
def test_gpu_decode_mma_m16_rings_give_the_same_bytes(N, K, rng):
    """The m16 kernels' ring loops (m8_loop "g" up to 16 rows: m16g, 8 warps, in m16l's place; m16ng, 4 warps and 2
    strips a block, in m16n's) split K over the same warps as the lean loops they replace: the same bytes for 9 /
    12 / 16 rows, bias or not, every out dtype, a weight with and without the special scale, K short of the ring
    (64, 192) and a split along K; within the bound of the float64 product. Past 16 rows "g" takes the lean
    loops."""
    from mxkit.kernels.matmul_details._mma_decode import MmaDecode

    bias = torch.randn(N, generator=rng).cuda()
    for special in (False, True):
        w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
        if special:
            w.scale[3, 0] = 0
        pw = mxkit.pack_weight(w)
        for M, out, split in ((9, torch.bfloat16, 1), (16, torch.float32, 2 if K >= 1600 else 1),
                              (12, torch.float16, 1)):
            x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
            b = bias if M != 16 else None
            ys = []
            for loop, name in (("l", "n" if N == 8192 else "l"), ("g", "ng" if N == 8192 else "g")):
                run = MmaDecode(pw.mma_q, pw.mma_s, N, K, M, out, special=special, split=split, m8_loop=loop)
                assert f"_m16{name}_" in run.kernel.name and run.split == split
                assert run.grid[1] == N // 16 // {"n": 4, "ng": 2}.get(name, 1)
                poison_allocator()
                ys.append(run(x, b))
            assert torch.equal(ys[0].view(torch.uint8), ys[1].view(torch.uint8)), (M, out, special)
            assert_within_bound(ys[1], x, w, b)
    lean = "n" if N == 8192 else "l"
    assert f"_m16{lean}_" in MmaDecode(pw.mma_q, pw.mma_s, N, K, 33, torch.bfloat16, m8_loop="g").kernel.name


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("split", [2, 3, 7])
def test_gpu_decode_mma_split_k(split, rng):
    """K split over blocks (partials in a workspace, the last block of a strip adds them in order): within the
    bound, the same bytes on every call (deterministic, and the counters reset), bias and 17 tokens too, the m16n
    kernel (4 strips a block) on N = 8192."""
    from mxkit.kernels.matmul_details._mma_decode import MmaDecode

    K = 4096 + 64 * split  # K tiles not a multiple of the split
    for N in (1024, 8192):  # (8192: m16n at 17 tokens, 4 strips a block)
        w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
        pw = mxkit.pack_weight(w)
        bias = torch.randn(N, generator=rng).cuda()
        for M in (1, 17):
            run = MmaDecode(pw.mma_q, pw.mma_s, N, K, M, torch.bfloat16, special=False, split=split)
            assert run.split == split and ("_m16n_" in run.kernel.name) == (M == 17 and N == 8192)
            x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
            poison_allocator()
            y = run(x, bias)
            assert_within_bound(y, x, w, bias)
            for _ in range(3):  # (poisoned first: each call's output would be the freed last one's block)
                poison_allocator()
                assert torch.equal(run(x, bias).view(torch.int16), y.view(torch.int16))
            assert int(run.cnt.sum()) == 0


@pytest.mark.gpu
@gpu
def test_gpu_decode_mma_strided_and_unaligned_x(rng):
    """x a column slice (row stride not K: read in place), a view starting 2 elements in (not 16-byte aligned),
    a row stride that is not a multiple of 8, 3-D slices whose leading dims flatten to one row stride (read in
    place) and a transposed 3-D x whose do not (copied first): every one through the eager prepared call and
    the planned one."""
    from mxkit.kernels.matmul import plan_gemm, run_gemm

    K, N = 2880, 512
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4"))
    big = torch.randn(4, K + 8, generator=rng).to(torch.bfloat16).cuda()
    odd = torch.randn(3, K + 4, generator=rng).to(torch.bfloat16).cuda()
    big3 = torch.randn(2, 3, K + 8, generator=rng).to(torch.bfloat16).cuda()
    for a in (big[:, :K], big[:, 2:K + 2], big.flatten()[2:2 + 3 * K].view(3, K), odd[:, :K], big3[:, :, :K],
              big3[:, 1:, 8:K + 8], big3[:, :, :K].transpose(0, 1), big3[:1, :1, :K]):
        y, _ = check(a, pw, backend="auto", path="decode-mma")
        assert y.shape == (*a.shape[:-1], N)
        y2 = run_gemm(a, pw, plan_gemm(a, pw))
        assert torch.equal(y.view(torch.int16), y2.view(torch.int16))


@pytest.mark.parametrize("shape,stride,ld", [
    ((1, 64), (64, 1), 64), ((4, 64), (72, 1), 72), ((4, 64), (68, 1), None), ((2, 3, 64), (216, 72, 1), 72),
    ((3, 2, 64), (72, 216, 1), None), ((1, 1, 64), (5, 3, 1), 64), ((64,), (1,), 64), ((2, 64), (0, 1), None),
    ((2, 64), (128, 2), None), ((2, 1, 64), (72, 7, 1), 72)])
def test_row_stride(shape, stride, ld):
    """Which x the decode-mma call reads in place: leading dims that flatten to one row stride, a multiple of
    8 elements, unit stride along K (dims of size 1 take any stride)."""
    from mxkit.kernels.matmul_details._mma_calls import row_stride

    assert row_stride(shape, stride) == ld


@pytest.mark.gpu
@gpu
def test_gpu_decode_mma_matches_decode_w16(rng):
    """The two decode kernels agree within the bound of each other's float32 accumulation on a real-shape
    layer, and the eager prepared call equals the planned one byte for byte (the same kernel)."""
    K, N = 4096, 2880
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4")
    pw = mxkit.pack_weight(w)
    for M in (1, 16):
        a = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        y1 = mxkit.matmul(a, pw)
        y2 = mxkit.matmul(a, w)  # an MXTensor: the Triton decode kernel
        assert mxkit.gemm_plan(a, w).path == "decode-w16"
        assert_within_bound(y1, a, w)
        assert_within_bound(y2, a, w)
        from mxkit.kernels.matmul import plan_gemm, run_gemm

        assert torch.equal(run_gemm(a, pw, plan_gemm(a, pw)).view(torch.int16), y1.view(torch.int16))


@pytest.mark.gpu
@gpu
def test_gpu_decode_mma_in_a_cuda_graph(rng):
    """decode-mma with a float32 bias within the bound, then captured in a CUDA graph: replays on new x (outputs
    poisoned first) give the eager bytes."""
    K, N = 2880, 5120
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(N, K, generator=rng).cuda(), "mxfp4"))
    bias = torch.randn(N, generator=rng).cuda()
    x = torch.randn(4, K, generator=rng).to(torch.bfloat16).cuda()
    assert_within_bound(mxkit.matmul(x, pw, bias=bias), x, pw, bias)
    assert_graph_replays(lambda x: mxkit.matmul(x, pw, bias=bias), [x],
                         lambda: [torch.randn(4, K, generator=rng).to(torch.bfloat16).cuda()])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", ["decode-mma", "w8a16-mma", "a8w8-mma", "a8w8 in-kernel"])
def test_gpu_bf16_bias_read_as_it_is(case, rng, packaged_default):
    """A bf16 bias reaches the CUDA C++ GEMMs as it is (the kernel adds its float32 value: no conversion launch):
    the bytes of the same bias converted to float32 first, on the first call and on the prepared calls after it
    (fast call), 1 / 5 / 8 rows, every out dtype; within the bound of the float64 product."""
    from mxkit.kernels.matmul import a8w8_linear

    N, K = 1040, 2880
    fmt = "mxfp4_e2m1" if case == "decode-mma" else "mxfp8_e4m3"
    w = mxkit.quantize(torch.randn(N, K, generator=rng).cuda() * 0.05, fmt)
    pw = mxkit.pack_weight(w)
    b16 = torch.randn(N, generator=rng).to(torch.bfloat16).cuda()
    for M, out in ((1, torch.bfloat16), (5, torch.float32), (8, torch.float16)):
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        a = mxkit.quantize(x, "mxfp8_e4m3") if case == "a8w8-mma" else x
        if case == "a8w8 in-kernel":  # (x quantized inside the launch at these M whatever this GPU's table says)
            def run(bias, x=x, out=out):
                with in_launch():
                    return a8w8_linear(x, pw, bias, out)
        else:
            assert mxkit.gemm_plan(a, pw).path == case
            run = (lambda bias: mxkit.matmul(a, pw, bias=bias, out_dtype=out))
        for _ in range(3):  # (the first call, then the prepared call and its fast call)
            poison_allocator()
            y = run(b16)
            poison_allocator()
            y32 = run(b16.float())
            assert torch.equal(y.view(torch.uint8), y32.view(torch.uint8)), (case, M, out)
        assert_within_bound(y, mxkit.quantize(x, "mxfp8_e4m3") if case == "a8w8 in-kernel" else a, w, b16)


def test_counters_and_zero_ids_made_inside_a_capture_are_the_graphs_own(monkeypatch):
    """pair_counters / zero_ids inside a CUDA graph capture that finds none made: a zero fill there is a node of the
    graph, run only at its replays. The counters are then the graph's own (returned, kept alive, never handed to
    an eager launch or a later capture, which read unset bytes through the kept set before); zero_ids is None (the
    caller takes the GEMM path). Outside a capture both are made once and kept. CPU tensors stand in for CUDA."""
    from mxkit.kernels.matmul_details import _mma_decode as md

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(md, "_raw_stream", lambda idx: 7)
    monkeypatch.setattr(md, "_COUNTERS", {})
    monkeypatch.setattr(md, "_ZERO_IDS", {})
    monkeypatch.setattr(md, "_CAPTURED_COUNTERS", [])
    dev = torch.device("cpu", 0)
    capturing[0] = True
    inside = md.pair_counters(dev, 10)
    assert inside.numel() >= 10 and md._CAPTURED_COUNTERS == [inside] and md._COUNTERS[(0, 7, "pairs")] == []
    assert md.zero_ids(dev) is None and md._ZERO_IDS == {}
    capturing[0] = False
    eager = md.pair_counters(dev, 10)
    assert eager is not inside and md.pair_counters(dev, 10) is eager and md._COUNTERS[(0, 7, "pairs")] == [eager]
    ids = md.zero_ids(dev)
    assert torch.equal(ids, torch.zeros(md.SMALL_PAIRS, dtype=torch.int32)) and md.zero_ids(dev) is ids
    capturing[0] = True  # (a set large enough made before the capture: the capture reads it, as warmed-up ones do)
    assert md.pair_counters(dev, 10) is eager and md.zero_ids(dev) is ids
    bigger = md.pair_counters(dev, 10_000)
    assert bigger.numel() >= 10_000 and md._COUNTERS[(0, 7, "pairs")] == [eager] and md._CAPTURED_COUNTERS[-1] is bigger
