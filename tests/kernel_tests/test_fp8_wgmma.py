"""The fp8-wgmma kernel (``mxkit.kernels.matmul_details._fp8_wgmma``): the FP8 rowwise-scaled GEMM, dense and
grouped, of the fold paths. GPU: against the float64 twin within one bf16 rounding plus the FP8 accumulation's
bound, into NaN-poisoned outputs; CPU: the tile table in the interpreter and the operand checks."""

from __future__ import annotations

import os

import pytest
import torch

from mxkit.kernels.matmul_details import _fp8_wgmma as f8

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")  # (an H100 / H200: sm_90 with Gluon)


def fp8_rows(R, K, g, device="cuda"):
    """(float8_e4m3fn [R, K], float32 [R]): rowwise-quantized random rows over a spread of magnitudes, some
    elements at E4M3's largest magnitude and subnormals."""
    x = torch.randn(R, K, generator=g) * 2.0 ** torch.randint(-6, 6, (R, 1), generator=g)
    s = x.abs().amax(1).clamp(min=1e-30) / 448.0
    q = (x / s[:, None]).to(torch.float8_e4m3fn)
    flat = q.view(torch.uint8).view(-1)
    pick = torch.randint(0, flat.numel(), (max(1, flat.numel() // 64),), generator=g)
    flat[pick[0::2]] = torch.randint(1, 8, (pick[0::2].numel(),), generator=g, dtype=torch.uint8)  # subnormals
    flat[pick[1::2]] = 0x7E | (torch.randint(0, 2, (pick[1::2].numel(),), generator=g, dtype=torch.uint8) << 7)
    return q.to(device), s.float().to(device)


def check(y, ref64, a, b, sa, sb, rows, b_rows):
    """Every element of y's ``rows`` within one bf16 rounding of the float64 product plus 2^-10 of the sum of
    the absolute products (the FP8 wgmma's partial sums, promoted every 128 columns); NaN where it is NaN."""
    y = y[rows].double().cpu()
    ref = ref64.cpu()
    nan = ref.isnan()
    assert torch.equal(y.isnan(), nan)
    absum = ((a[rows].double().abs() * sa[rows].double()[:, None]).cpu()
             @ (b[b_rows].double().abs() * sb[b_rows].double()[:, None]).cpu().T) if b_rows is not None else None
    bound = (ref - ref.to(torch.bfloat16).double()).abs() * 1.01 + 2.0 ** -10 * absum
    err = (y - ref).abs()
    bad = ~nan & ~(err <= bound)
    assert not bad.any(), f"{int(bad.sum())} elements over the bound, max excess {(err - bound)[bad].max():.3e}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("M,N,K", [(1, 8, 16), (257, 384, 2880), (129, 136, 272), (600, 1000, 4096)])
def test_gpu_fp8_gemm_dense(M, N, K, rng):
    a, sa = fp8_rows(M, K, rng)
    b, sb = fp8_rows(N, K, rng)
    sa[M // 2] = 0.0  # a zero row scale
    if M > 5:
        a.view(torch.uint8)[5, 3] = 0x7F  # a NaN code: its row NaN
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    f8.fp8_gemm(a, b, sa, sb, y=y)
    ref = a.double() * sa.double()[:, None] @ (b.double() * sb.double()[:, None]).T
    check(y, ref, a, b, sa, sb, torch.arange(M), torch.arange(N))
    # the twin is that float64 product rounded once
    twin = f8.fp8_gemm_reference(a, b, sa, sb)
    assert torch.equal(twin.view(torch.int16), ref.to(torch.bfloat16).view(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("E,N,K", [(8, 320, 2880), (32, 128, 256)])
def test_gpu_fp8_gemm_grouped(E, N, K, rng):
    """Groups of 0 rows, one of every row of a tile and more, partial tiles, N not a multiple of the tile; rows past
    the last group's end stay as they were."""
    cnt = torch.randint(0, 200, (E,), generator=rng)
    cnt[0], cnt[E // 2], cnt[E - 1] = 0, 300, 1
    offs = cnt.cumsum(0).to(torch.int32).cuda()
    R = int(offs[-1]) + 21
    a, sa = fp8_rows(R, K, rng)
    b, sb = fp8_rows(E * N, K, rng)
    y = torch.full((R, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    table = f8.tile_table(offs, R)
    assert torch.equal(table.cpu(), f8.tile_table_reference(offs.cpu(), R))
    f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs, table=table, y=y)
    assert y[int(offs[-1]):].isnan().all()
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            rows = torch.arange(start, end)
            ref = (a[start:end].double() * sa[start:end].double()[:, None]) @ \
                (b[e * N:(e + 1) * N].double() * sb[e * N:(e + 1) * N].double()[:, None]).T
            check(y, ref, a, b, sa, sb, rows, torch.arange(e * N, (e + 1) * N))
        start = end
    # without a table given, and into a fresh output: the same bytes
    y2 = f8.fp8_gemm(a, b, sa, sb, n=N, offs=offs)
    end = int(offs[-1])
    assert torch.equal(y2[:end].view(torch.int16), y[:end].view(torch.int16))


@pytest.mark.gpu
@gpu
def test_gpu_fp8_gemm_row_scales_of_any_magnitude(rng):
    """The weight's power-of-two scale goes on first: rows of a with scales 2^120 / 2^-140 (an FP8 rowwise token's
    amax / 448 can be either) times weight rows scaled 2^-50 / 2^50 come out within the bound, where applying sa
    first would overflow or round twice in float32."""
    M, N, K = 64, 128, 2880
    a, sa = fp8_rows(M, K, rng)
    b, _ = fp8_rows(N, K, rng)
    sb = torch.where(torch.arange(N, device="cuda") % 2 == 0, 2.0**-50, 2.0**50).float()
    sa[::4] = 2.0**120
    sa[1::4] = 2.0**-140
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    f8.fp8_gemm(a, b, sa, sb, y=y)
    ref = a.double() * sa.double()[:, None] @ (b.double() * sb.double()[:, None]).T
    live = torch.isfinite(ref.to(torch.bfloat16))
    assert live[::4, ::2].all()  # (2^120 * 2^-50: inside bf16's range)
    assert torch.equal(torch.isfinite(y).cpu(), live.cpu())
    check(y, ref, a, b, sa, sb, torch.arange(M), torch.arange(N))


def _tile_table_cases(g, device):
    """The tile-table kernel against its PyTorch twin: empty groups, groups of exactly a tile, rows to spare;
    every sorted row of a group in exactly one used row of the table. Returns the number of cases."""
    n = 0
    for E in (1, 5, 128):
        for _ in range(3):
            cnt = torch.randint(0, 400, (E,), generator=g)
            cnt[torch.randint(0, E, (1,), generator=g)] = 0
            cnt[torch.randint(0, E, (1,), generator=g)] = f8.BM
            offs = cnt.cumsum(0).to(torch.int32)
            R = int(offs[-1]) + int(torch.randint(0, 300, (1,), generator=g))
            got = f8.tile_table(offs.to(device), R).cpu()
            want = f8.tile_table_reference(offs, R)
            assert torch.equal(got, want), (E, offs)
            used = want[want[:, 0] >= 0]
            assert int((used[:, 2] - used[:, 1]).clamp(max=f8.BM).sum()) == int(offs[-1])
            n += 1
    return n


def interpreted_checks():
    from conftest import interpreted_rng

    g = interpreted_rng(f8._tile_table_kernel)
    print(f"interpreter checks passed: {_tile_table_cases(g, 'cpu')}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="runs itself under the interpreter")
def test_tile_table_under_the_interpreter():
    from conftest import run_interpreted

    run_interpreted(__file__, "interpreted_checks")


@pytest.mark.gpu
@gpu
def test_gpu_tile_table(rng):
    assert _tile_table_cases(rng, "cuda") == 9


@pytest.mark.parametrize("grouped,precise,out", [(False, True, "bf16"), (True, True, "bf16"), (True, True, "fp32"),
                                                  (False, False, "fp16")])
def test_fp8_wgmma_compiles_for_sm90(grouped, precise, out):
    """The Gluon kernel builds for sm_90 on the CPU (the installed Triton's compiler and ptxas), dense and grouped,
    with the promotion (precise) and without: two consumer warpgroups of FP8 wgmma (m64n128k32) and the producer.
    Its results are checked by the GPU tests (the interpreter does not run Gluon)."""
    from conftest import compile_gluon_sm90

    from mxkit.kernels.matmul_details._wgmma_gluon import gluon

    if isinstance(gluon(), str):
        pytest.skip(gluon())
    a_l, b_l = f8._smem_layouts()
    sig = {"a_desc": f"tensordesc<fp8e4nv[{f8.BM}, {f8.BK}],{a_l}>",
           "b_desc": f"tensordesc<fp8e4nv[{f8.BN}, {f8.BK}],{b_l}>", "y_ptr": "*" + out, "sa_ptr": "*fp32",
           "sb_ptr": "*fp32", "t_ptr": "*i32", "M": "i32", "N": "i32", "NT": "i32", "KSTEPS": "i32", "stride_ym": "i32"}
    k = compile_gluon_sm90(f8._kernel(), sig, dict(STAGES=f8.STAGES, GROUPED=grouped, PRECISE=precise, num_warps=4),
                           4, ("y_ptr", "sa_ptr", "sb_ptr"))
    ptx = k.asm["ptx"]
    assert len(k.asm["cubin"]) > 0 and "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx
    assert ptx.count("cp.async.bulk.tensor.2d") == 2  # (the producer's two TMA loads a step)


def test_fp8_gemm_refuses_bad_operands():
    a = torch.zeros(4, 32, dtype=torch.float8_e4m3fn)
    b = torch.zeros(8, 32, dtype=torch.float8_e4m3fn)
    sa, sb = torch.ones(4), torch.ones(8)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        f8.fp8_gemm_reference(a.view(torch.uint8), b, sa, sb)
    with pytest.raises(TypeError, match="float32"):
        f8.fp8_gemm_reference(a, b, sa.double(), sb)
    with pytest.raises(ValueError, match="a \\[M, K\\]"):
        f8.fp8_gemm_reference(a, b[:, :16], sa, sb)
    with pytest.raises(ValueError, match="sa \\[4\\]"):
        f8.fp8_gemm_reference(a, b, sa[:3], sb)
    with pytest.raises(ValueError, match="grouped ones both"):
        f8.fp8_gemm_reference(a, b, sa, sb, n=4)
    with pytest.raises(TypeError, match="offs int32"):
        f8.fp8_gemm_reference(a, b, sa, sb, n=4, offs=torch.tensor([2, 4]))
    with pytest.raises(ValueError, match="contiguous"):
        f8.fp8_gemm_reference(torch.zeros(32, 4, dtype=torch.float8_e4m3fn).T, b, sa, sb)
    with pytest.raises(ValueError, match="K % 16"):
        f8.fp8_gemm_reference(a[:, :8].contiguous(), b[:, :8].contiguous(), sa, sb)
    with pytest.raises(ValueError, match="tile_table"):
        f8.fp8_gemm_reference(a, b, sa, sb, n=4, offs=torch.tensor([2, 4], dtype=torch.int32),
                              table=torch.zeros(1, 3, dtype=torch.int32))
    # grouped twin: rows past the last group untouched
    y = torch.full((4, 4), 7.0, dtype=torch.bfloat16)
    f8.fp8_gemm_reference(a, b, sa, sb, n=4, offs=torch.tensor([1, 3], dtype=torch.int32), y=y)
    assert (y[3] == 7).all() and (y[:3] == 0).all()


def test_fold_moe_takes_the_kernel_between_its_row_limits(monkeypatch):
    # the MoE fold paths' dispatch (`_fold._tile_table`): the kernel from FP8_WGMMA_MIN_ROWS sorted rows a call up
    # to FP8_WGMMA_MAX_ROWS an expert (their padding to 16 rows not counted), cuBLAS's grouped GEMM (None) outside;
    # MXKIT_FP8_WGMMA=1 takes it at every size, K % 16 != 0 never
    from mxkit.kernels.moe_details import _fold

    monkeypatch.setattr(f8, "available", lambda device: None)
    monkeypatch.setattr(f8, "tile_table", lambda offs, rows: ("table", rows))
    monkeypatch.delenv("MXKIT_FP8_WGMMA", raising=False)
    E, lo, hi = 4, _fold.FP8_WGMMA_MIN_ROWS, _fold.FP8_WGMMA_MAX_ROWS
    offs = torch.zeros(E, dtype=torch.int32)

    def rows(R, K=32):
        return _fold._tile_table(torch.empty(R, K, dtype=torch.float8_e4m3fn), offs)

    assert rows(lo - 1) is None and rows(lo) == ("table", lo)
    assert rows((hi + 15) * E) == ("table", (hi + 15) * E) and rows((hi + 15) * E + 1) is None
    assert rows(lo, K=40) is None
    monkeypatch.setenv("MXKIT_FP8_WGMMA", "1")
    assert rows(1) == ("table", 1) and rows((hi + 16) * E) is not None
