"""Issue #22's "offsets past 2^31 are safe or rejected before launch", for the GEMM and MoE kernels (the quantize
and fold kernels have theirs in test_opt_flags.py / test_fold.py).

The audit behind these tests: every Triton / Gluon kernel of ``kernels/matmul_details`` computes row offsets in
int64 (``_w16_decode``'s x and output rows since this file: ``m * stride`` and ``s * M * N`` were int32), the TMA
descriptors take 64-bit strides and int32 coordinates (each extent < 2^31), and the CUDA C++ kernels
(``mma_decode.cu``, ``mma_a8w8.cu``) use ``long long`` offsets throughout. What does not scale is a launch grid's
y dimension (at most 65535): the CUDA C++ kernels put the 16-row weight strips there, the grouped Triton MoE kernel
its column tiles and the expert sort its chunk groups. Past those limits the plan takes another path (a weight
of more than 1048560 rows gets no decode-mma / a8w8-mma layout; MoE experts of more than 4194240 rows take the
reference; more than 8192 * 65535 routed pairs the PyTorch sort), and the launchers raise ValueError.

CPU: the limits and the rerouting, planned on shapes past them without allocating them (expanded tensors, the
CUDA device faked as in test_matmul's plan tests). GPU (``-m gpu``; about 25 GB at the peak, an H200): each GEMM
path on operands past 2^31 bytes or elements (activations of 2^20 + 3 rows of 1024 bf16: row 2^20 starts at
byte 2^31; weights of 2^31 + bytes; decode outputs past 2^31 elements) and the MoE on 2^20 + 3 tokens, checked on
sampled rows (the last ones among them) against float64 with issue #22's bound, outputs allocated in NaN-poisoned
memory where they are large enough to reuse it.
"""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch
from conftest import cuda_generator, poison_allocator

import mxkit
from mxkit.formats import get_format
from mxkit.kernels import matmul as km
from mxkit.kernels import matmul_table
from mxkit.kernels import moe as kmoe
from mxkit.kernels.matmul_details import _mma_a8w8, _mma_decode
from mxkit.tensor import MXTensor

from .test_matmul import assert_within_bound, rand_mx

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
STRIPS = _mma_decode.MAX_STRIPS  # CUDA's largest gridDim.y


@pytest.fixture(autouse=True)
def _release_memory():
    yield
    if HAS_CUDA:
        gc.collect()
        torch.cuda.empty_cache()


def expanded_mx(shape, fmt: str, scale_byte: int = 127) -> MXTensor:
    """An MXTensor of ``shape`` (quantized along the last axis) whose codes and scale bytes are one row expanded:
    the plan and the envelope checks read its shape and scale bytes, nothing of size N * K is allocated."""
    f = get_format(fmt)
    *lead, K = shape
    q = torch.zeros(*[1] * len(lead), K * f.bits // 8, dtype=torch.uint8).expand(*lead, -1)
    s = torch.full((*[1] * len(lead), K // 32), scale_byte, dtype=torch.uint8).expand(*lead, -1)
    return MXTensor(q, s, f, len(shape) - 1, 32, tuple(shape))


def fake_cuda(monkeypatch) -> None:
    """Plan as on a CUDA device without one (test_matmul's plan tests do the same): the operands' device and the
    dispatch table's GPU name are faked; the plan reads shapes, dtypes and scale bytes only."""
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(km, "_a_device", lambda a, kind: dev)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: "a GPU without a table entry")
    monkeypatch.setattr(MXTensor, "device", property(lambda self: dev), raising=False)


# ---------------------------------------------------------------------------------------------------------
# CPU: the limits, the launchers' guards and the plan's rerouting


def test_mma_shape_limits_and_launch_guards():
    """The CUDA C++ kernels take at most 65535 strips of 16 rows (gridDim.y) and an int32 K; their launchers raise
    ValueError past that before touching a device (CPU tensors here)."""
    assert _mma_decode.shape_ok(16 * STRIPS, 64) and not _mma_decode.shape_ok(16 * STRIPS + 16, 64)
    assert _mma_decode.shape_ok(16, 2**31 - 64) and not _mma_decode.shape_ok(16, 2**31)
    assert _mma_a8w8.shape_ok is _mma_decode.shape_ok  # (the a8w8 kernels' strips: N / (16 r), r >= 1)
    N, K = 16 * STRIPS + 16, 64
    i32 = torch.zeros(1, dtype=torch.int32)
    bf = torch.zeros(1, K, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gridDim.y"):
        _mma_decode.MmaDecode(i32, i32, N, K, 1, torch.bfloat16)
    with pytest.raises(ValueError, match="gridDim.y"):
        _mma_a8w8.A8W8(i32, i32, 1, torch.bfloat16, True, shape=(N, K))
    with pytest.raises(ValueError, match="gridDim.y"):
        _mma_a8w8.A8W8(i32, i32, 1, torch.bfloat16, True, shape=(N, K), w16="e4m3")
    with pytest.raises(ValueError, match="gridDim.y"):
        _mma_decode.grouped_mma(bf, i32, i32, False, N, K, i32, i32, 1, 1, gather=False, bias=None, activation=None,
                                rw=torch.ones(1), out=torch.empty(1, N))
    with pytest.raises(ValueError, match="gridDim.y"):
        _mma_decode.pairs_mma(bf, i32, i32, False, N, K, i32, 1, 1, bias=None, activation=None, rw=torch.ones(1),
                              out=torch.empty(1, N, dtype=torch.bfloat16), ws=torch.empty(1, N))


def test_plan_takes_another_path_past_the_strip_limit(monkeypatch):
    """A weight of more than 65535 strips gets no decode-mma layout, so bf16 activations take decode-w16; an MXFP8
    one is not offered to a8w8-mma (bf16-exact instead), which still takes it at the limit."""
    N = 16 * STRIPS + 16
    pw = mxkit.pack_weight(expanded_mx((N, 64), "mxfp4_e2m1"), act="float")
    assert pw.mma_q is None
    a = mxkit.quantize(torch.randn(1, 64), "mxfp8_e4m3")
    fake_cuda(monkeypatch)
    assert km.plan_gemm(torch.randn(1, 64).to(torch.bfloat16), pw).path == "decode-w16"
    assert km.plan_gemm(a, expanded_mx((N, 64), "mxfp8_e4m3")).path == "bf16-exact"
    monkeypatch.setattr(_mma_a8w8, "available", lambda device: None)  # (no PTX loads on the CPU)
    assert km.plan_gemm(a, expanded_mx((N - 16, 64), "mxfp8_e4m3")).path == "a8w8-mma"
    assert km.plan_gemm(a, expanded_mx((N, 64), "mxfp8_e4m3")).path == "bf16-exact"


def test_moe_guards_past_the_grid_limits(monkeypatch):
    """The grouped Triton kernel puts an expert's column tiles (N / 64 at the narrowest) on the grid's y: experts
    past 65535 tiles are not ``supported`` (moe_triton takes the reference) and grouped_matmul_w16 raises before
    the launch; pack_experts_mma refuses experts past the decode kernel's strips; the expert sort (grid y: pairs /
    8192) runs up to 8192 * 65535 pairs, the PyTorch sort past that."""
    wide = expanded_mx((1, 64 * STRIPS + 64, 32), "mxfp4_e2m1")
    assert kmoe.supported(expanded_mx((1, 64 * STRIPS, 32), "mxfp4_e2m1")) and not kmoe.supported(wide)
    assert kmoe.pack_experts_mma(expanded_mx((1, 16 * STRIPS + 16, 64), "mxfp4_e2m1")) is None
    ids, eids = torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="grid y"):
        kmoe.grouped_matmul_w16(torch.zeros(1, 32, dtype=torch.bfloat16), wide, ids, eids,
                                kmoe.MoeConfig(16, 64, 256, 4, 3), n_valid=1, top_k=1, gather=True)
    from mxkit.kernels.moe_details import _sort

    monkeypatch.setattr(_sort, "_INTERPRET_ALIGN", True)  # (the sort's kernels on CPU ids: only the size decides)
    pairs = 8192 * STRIPS
    assert _sort._experts_sort_runs(torch.zeros(1, 1, dtype=torch.int32).expand(pairs, 1), 32)
    assert not _sort._experts_sort_runs(torch.zeros(1, 1, dtype=torch.int32).expand(pairs + 1, 1), 32)


# ---------------------------------------------------------------------------------------------------------
# GPU: the paths past 2^31


def need_gib(gib: float) -> None:
    free = torch.cuda.mem_get_info()[0]
    if free < gib * 2**30:
        pytest.skip(f"needs {gib} GiB of free GPU memory, {free / 2**30:.1f} GiB free")


def poison_cache(nbytes: int) -> None:
    """Empty the allocator's cache, then leave one block of ``nbytes`` filled with NaN in it: the call's large
    allocations (output included) are carved from it, so an element the kernel does not write stays NaN."""
    gc.collect()
    torch.cuda.empty_cache()
    poison_allocator(nbytes)


def check_rows(y: torch.Tensor, a, b) -> None:
    """Sampled output rows y against float64 of the operands' same rows a and b: finite (nothing left of the NaN
    poison) and within issue #22's row-wise bound (test_matmul's assert_within_bound)."""
    assert torch.isfinite(y).all(), "an output element is not finite: unwritten (NaN poison) or wrong"
    assert_within_bound(y, a, b)


def random_weight(N: int, K: int, fmt: str, g: torch.Generator) -> MXTensor:
    """An MXFP4 or MXFP8 E4M3 weight (N, K) made on the GPU: random codes (no E4M3 NaN code 0x7F / 0xFF) and
    scale bytes 124 .. 130."""
    if fmt == "mxfp4_e2m1":
        q = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda", generator=g)
    else:
        q = torch.randint(0, 254, (N, K), dtype=torch.uint8, device="cuda", generator=g)
        q += q >= 0x7F  # 0 .. 253 onto 0 .. 0x7E, 0x80 .. 0xFE
    s = torch.randint(124, 131, (N, K // 32), dtype=torch.uint8, device="cuda", generator=g)
    return MXTensor(q, s, fmt, 1, 32, (N, K))


def weight_rows(w: MXTensor, cols: torch.Tensor) -> MXTensor:
    return MXTensor(w.qdata[cols], w.scale[cols], w.fmt, 1, 32, (cols.numel(), w.shape[1]))


def sample_cols(N: int, g: torch.Generator) -> torch.Tensor:
    """64 output columns (weight rows) to check of N: the first 2, the last 6 and 56 random ones between."""
    return torch.cat([torch.arange(2, device="cuda"), torch.arange(N - 6, N, device="cuda"),
                      torch.randint(2, N - 6, (56,), device="cuda", generator=g)])


def wgmma_here() -> bool:
    from mxkit.kernels.matmul_details import _w4a16_wgmma

    return _w4a16_wgmma.available(torch.device("cuda")) is None


M_BIG, K_BIG = 2**20 + 3, 1024  # bf16 rows of 2048 bytes: row 2^20 starts at byte 2^31
ROWS = (0, 1, M_BIG // 2, M_BIG - 3, M_BIG - 2, M_BIG - 1)
WGMMA_ANY_M = {"default": {k: {"max_m": 2**22, "min_nk": 0} for k in ("w4a16_wgmma", "w8a16_wgmma")}}
ACT_PATHS = ("dense-exact", "w4a16-wgmma", "w8a16-wgmma", "fold-fp8", "w4a8-fp8", "bf16-exact")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", ACT_PATHS)
def test_gpu_activations_and_outputs_past_2_31_bytes(path, rng):
    """a (2^20 + 3, 1024) and y (2^20 + 3, 1024), bf16 or 1-byte codes, on each prefill path; the last row of a
    is one the fast GEMM is not exact for on the fold (block scales spanning 80 binades) and bf16-exact (a scale
    byte below bf16's range) paths, so the fix-up kernel reads and writes it past 2^31 bytes. The wgmma paths are
    taken at this M through a dispatch table whose envelope has no bound on M (gemm_table_override)."""
    need_gib(24)
    if "wgmma" in path and not wgmma_here():
        pytest.skip("the wgmma kernel needs Hopper (sm_90)")
    g = cuda_generator(rng)
    x = torch.randn(M_BIG, K_BIG, device="cuda", generator=g, dtype=torch.bfloat16)
    rows = torch.tensor(ROWS, device="cuda")
    fmt = "mxfp8_e4m3" if path in ("w8a16-wgmma", "bf16-exact") else "mxfp4_e2m1"
    w = rand_mx((1024, K_BIG), fmt, rng, device="cuda")
    if path in ("dense-exact", "bf16-exact"):
        b = w
    else:
        b = mxkit.pack_weight(w, act={"fold-fp8": None, "w4a8-fp8": "fp8_rowwise"}.get(path, "float"))
    if path == "fold-fp8":
        x[-1, :32] *= 2.0**40
        x[-1, 32:64] *= 2.0**-40
        a = mxkit.quantize_fold(x, "mxfp4", defer=True)
        a_rows = mxkit.quantize(x[rows], "mxfp4")
    elif path == "w4a8-fp8":
        a = mxkit.quantize_fp8_rowwise(x)
        a_rows = mxkit.Fp8Rowwise(a.data[rows], a.scale[rows])
    elif path == "bf16-exact":
        a = mxkit.quantize(x, "mxfp8_e4m3")
        a.scale[-1, 0] = 1  # 2^-126: E4M3 values below bf16's smallest subnormal
        a_rows = MXTensor(a.qdata[rows], a.scale[rows], a.fmt, 1, 32, (rows.numel(), K_BIG))
    else:
        a, a_rows = x, x[rows]
    if a is not x:
        del x
    with km.gemm_table_override(WGMMA_ANY_M) if "wgmma" in path else contextlib.nullcontext():
        assert mxkit.gemm_plan(a, b).path == path
        poison_cache(3 * M_BIG * 1024 * 2 + (1 << 30))
        y = mxkit.matmul(a, b)
    assert y.shape == (M_BIG, 1024)
    check_rows(y[rows], a_rows, b)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt,K", [("mxfp4_e2m1", 65600), ("mxfp8_e4m3", 32832)])
def test_gpu_weight_past_2_31_bytes(fmt, K, rng):
    """A weight of 65536 x K whose codes pass 2^31 bytes (its last 63 / 127 rows start past byte 2^31, in the MX
    bytes and in the packed layouts) on every small-M path and the wgmma one; the bound checked on output columns
    of the first and the last weight rows and random ones."""
    need_gib(20)
    g = cuda_generator(rng)
    N = 65536
    w = random_weight(N, K, fmt, g)
    assert w.qdata.numel() > 2**31
    pw = mxkit.pack_weight(w, act="float" if fmt == "mxfp4_e2m1" else None)
    assert pw.mma_q is not None
    cols = sample_cols(N, g)
    sub = weight_rows(w, cols)
    x = torch.randn(100, K, device="cuda", generator=g, dtype=torch.bfloat16)
    wide = ("w4a16-wgmma" if fmt == "mxfp4_e2m1" else "w8a16-wgmma") if wgmma_here() else "dense-exact"
    cases = [(x[:3], w, "decode-w16"), (x, pw, wide)]
    if fmt == "mxfp4_e2m1":
        cases.append((x[:3], pw, "decode-mma"))
    else:
        cases += [(x[:3], pw, "w8a16-mma"), (mxkit.quantize(x[:3], "mxfp8_e4m3"), pw, "a8w8-mma")]
    for a, b, path in cases:
        assert mxkit.gemm_plan(a, b).path == path
        y = mxkit.matmul(a, b)
        check_rows(y[:, cols], a, sub)
        del y
        torch.cuda.empty_cache()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", ["x_rows", "out_rows", "split_sums"])
def test_gpu_decode_w16_offsets_past_2_31(case, rng):
    """decode-w16's int64 offsets (M <= 16 rows): x rows 2^27 + 2^24 elements apart (a strided view, read in place
    by the kernel alone), an output of 16 x 150994944 (row 15 past element 2^31; through the plan), and the split-K
    sum over 8 partials of 16 x 20971520 (partial 7 at element 2.3e9: ``s * M * N`` was int32)."""
    from mxkit.kernels.matmul import DecodeConfig, decode_w16

    need_gib(30)
    g = cuda_generator(rng)
    M = 16
    if case == "x_rows":
        K, S = 1024, 2**27 + 2**24
        w = random_weight(1008, K, "mxfp4_e2m1", g)
        x = torch.empty(15 * S + K, device="cuda", dtype=torch.bfloat16).as_strided((M, K), (S, 1))
        x.copy_(torch.randn(M, K, device="cuda", generator=g))
        y = decode_w16(x, w)
        check_rows(y, x, w)
        return
    N, K = (150994944, 32) if case == "out_rows" else (20971520, 1024)
    w = random_weight(N, K, "mxfp4_e2m1", g)
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    poison_cache(M * N * (4 * (8 if case == "split_sums" else 1) + 2) + (1 << 30))
    if case == "out_rows":
        assert mxkit.gemm_plan(x, w).path == "decode-w16"
        y = mxkit.matmul(x, w)
    else:
        y = decode_w16(x, w, DecodeConfig(block_n=64, block_k=128, split_k=8, num_warps=4, num_stages=2))
    cols = sample_cols(N, g)
    check_rows(y[:, cols], x, weight_rows(w, cols))


@pytest.mark.gpu
@gpu
def test_gpu_weight_past_the_strip_limit_takes_another_path(rng):
    """N = 2^20 (65536 strips of 16 rows, one past gridDim.y): no decode-mma / a8w8-mma layout, the plan's other
    paths, correct to the last column."""
    g = cuda_generator(rng)
    N, K = 2**20, 64
    cols = sample_cols(N, g)
    x = torch.randn(1, K, device="cuda", generator=g, dtype=torch.bfloat16)
    for fmt in ("mxfp4_e2m1", "mxfp8_e4m3"):
        w = random_weight(N, K, fmt, g)
        pw = mxkit.pack_weight(w)
        assert pw.mma_q is None
        assert km.a8w8_linear(x, w) is None
        for a in (x, mxkit.quantize(x, fmt)):
            assert mxkit.gemm_plan(a, pw).path not in ("decode-mma", "a8w8-mma", "w8a16-mma")
            check_rows(mxkit.matmul(a, pw)[:, cols], a, weight_rows(w, cols))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_moe_tokens_past_2_31(packed, rng, monkeypatch):
    """2^20 + 3 tokens of 1024 bf16 (x, the gathered rows, the float32 rows of the down GEMM and the output all
    past 2^31 bytes), top-2 of 8 MXFP4 experts: the grouped Triton kernels (experts as MXTensors) or, packed, both
    GEMMs on the grouped wgmma kernel (blocks of 256 rows only); sampled tokens, the last three among them,
    within the layer's bound (test_moe_kernels.check_layer)."""
    from .test_moe_kernels import check_layer, experts

    need_gib(30)
    if packed and not wgmma_here():
        pytest.skip("the wgmma kernel needs Hopper (sm_90)")
    monkeypatch.setenv("MXKIT_MOE_MIXED", "0")  # (one block size: fewer kernels to build)
    g = cuda_generator(rng)
    T, H, I, E, k, act = M_BIG, K_BIG, 256, 8, 2, "swiglu_gpt_oss"
    w1, w2 = experts(E, 2 * I, H, "mxfp4_e2m1", rng), experts(E, H, I, "mxfp4_e2m1", rng)
    b1, b2 = torch.randn(E, 2 * I, generator=rng).cuda(), torch.randn(E, H, generator=rng).cuda()
    x = torch.randn(T, H, device="cuda", generator=g, dtype=torch.bfloat16)
    ids = torch.rand(T, E, device="cuda", generator=g).argsort(dim=1)[:, :k].to(torch.int32)
    tw = torch.softmax(torch.randn(T, k, device="cuda", generator=g), -1)
    pk = (kmoe.pack_experts_mma(w1), kmoe.pack_experts_mma(w2)) if packed else None
    assert kmoe.packed_path(pk, T * k, act, x) == ("wgmma" if packed else None)
    poison_cache(T * k * H * 8 + (2 << 30))
    y = kmoe.moe_triton(x, w1, b1, w2, b2, tw, ids, activation=act, packed=pk)
    tok = torch.tensor(ROWS, device="cuda")
    assert torch.isfinite(y[tok]).all()
    check_layer(y[tok], (x[tok], w1, b1, w2, b2, tw[tok], ids[tok]), act)
