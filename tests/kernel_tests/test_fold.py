"""The fold kernels (mxkit.kernels.fold) against the reference (mxkit.fold), byte for byte: data bytes, scale
bits, owner, and the kernel's per-row status (so a row the kernel wrongly sends to the host cannot hide).

* CPU (CI): sm_90 builds of the kernels (Triton's bundled ptxas); the kernels run under Triton's interpreter in a subprocess per format (TRITON_INTERPRET=1 must be
  set before triton is imported; the subprocess asserts that the kernels really are interpreted): every
  scale mode x rounding x input dtype on rows of crafted special blocks (NaN / Inf / zero / denormal /
  saturating) and random rows of spreads 0 / W / W+1 / 40, 7 x 96 and 33 x 2880 (masked tails, several K
  chunks), 8 x 2048 (unmasked chunks), a 3-D input. Plus argument errors and the config function in-process.
* GPU (``-m gpu``): 8192 x 8192, 727 x 2880 and 3-D inputs; R * K past 2^31.
Outputs are poisoned (0xAB, scale bits all ones) before the kernel writes, on both.

By hand: ``TRITON_INTERPRET=1 python tests/kernel_tests/test_fold.py --interpret mxfp4_e2m1``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
from conftest import (  # noqa: E402
    INPUT_DTYPES,
    ROUNDINGS,
    SCALE_MODES,
    assert_bytes_equal,
    make_generator,
    rand_blocks,
    rand_tensor,
    special_blocks,
)
from test_fold import FOLD_FORMATS, NAN_ROW, ZERO_ROW, rand_mx, window  # noqa: E402

from mxkit.fold import Folded, fold_reference, quantize_fold_reference  # noqa: E402
from mxkit.formats import get_format  # noqa: E402
from mxkit.reference import quantize_reference  # noqa: E402
from mxkit.tensor import MXTensor  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
POISON = 0xAB


def assert_folded_equal(got: Folded, ref: Folded, what: str = "") -> None:
    assert got.data.dtype == torch.float8_e4m3fn and got.scale.dtype == torch.float32, what
    assert_bytes_equal(got.data.cpu().view(torch.uint8), ref.data.cpu().view(torch.uint8), f"{what} data")
    assert_bytes_equal(got.scale.cpu().view(torch.int32), ref.scale.cpu().view(torch.int32), f"{what} scale")
    assert torch.equal(got.owner.cpu(), ref.owner.cpu()), f"{what} owner {got.owner} != {ref.owner}"
    assert got.lead_shape == ref.lead_shape and got.fmt is ref.fmt, what


def expected_status(ref: Folded) -> torch.Tensor:
    """0 folded, 1 split (the row owns extra slices), 2 NaN: what the kernel must say per row."""
    R = ref.rows()
    st = torch.zeros(R, dtype=torch.uint8)
    st[ref.owner.cpu()] = 1
    st[ref.scale[:R].cpu().isnan()] = 2
    return st


def check_kernel_rows(data, scale, status, ref: Folded, what: str) -> None:
    """The raw kernel outputs (before the host completes status-1 rows): status per row, and every row it
    folded (status 0) or made NaN (2) byte-equal to the reference."""
    st = expected_status(ref)
    assert_bytes_equal(status.cpu(), st, f"{what} status")
    R = ref.rows()
    keep = st != 1
    assert_bytes_equal(data.cpu()[keep], ref.data[:R].cpu().view(torch.uint8)[keep], f"{what} kernel data")
    assert_bytes_equal(scale.cpu().view(torch.int32)[keep], ref.scale[:R].cpu().view(torch.int32)[keep],
                       f"{what} kernel scale")


def run_fold_raw(q, poison: bool = True, cfg=None):
    from mxkit.kernels import fold as kf

    R, K = math.prod(q.shape[:-1]), q.shape[-1]
    data, scale, status = kf._outputs(R, K, q.device)
    if poison:
        data.fill_(POISON), scale.view(torch.int32).fill_(-1), status.fill_(POISON)
    kf._run_fold(q, data, scale, status, cfg)
    return data, scale, status


def check_weight_stats(g, fmt: str, spreads, device: str = "cpu") -> int:
    """The fold kernel's weight statistics (``fold_triton(stats=True)``, reduced by ``weight_stats``) equal the
    PyTorch ones pack_weight took before (scale extrema, NaN, a row scale outside the FP8 epilogue's envelope,
    a status-1 row), at fold_config's configs and at ones with masked rows and chunks: random rows of every
    spread, rows whose scale bytes put the row scale past 2^+-54, and rows of one 0xFF byte or all 0xFF."""
    from mxkit.kernels import fold as kf
    from mxkit.kernels.matmul_details._envelope import out_of_envelope, scale_extrema

    n = 0
    for R, K, cfg in ((7, 96, None), (33, 2880, None), (5, 2880, kf.FoldConfig(4, 1024, 4)),
                      (16, 2048, kf.FoldConfig(2, 512, 1))):
        for case in ("random", "envelope", "nan", "all_nan"):
            q = rand_mx(g, fmt, R, K, spreads if case == "random" else [0, 1])
            q = MXTensor(q.qdata.to(device), q.scale.to(device), q.fmt, 1, 32, (R, K))
            if case == "envelope":
                q.scale[1] = 250
                q.scale[R - 1] = 2
            elif case == "nan":
                q.scale[R // 2, -1] = 255
            elif case == "all_nan":
                q.scale.fill_(255)
            data, scale, status = kf._outputs(R, K, q.device)
            got = kf.weight_stats(kf._run_fold(q, data, scale, status, cfg, stats=True))
            ref = fold_reference(q)  # (the flags from the reference's fold, not from this run's own outputs)
            want = (*scale_extrema(q.scale), bool(out_of_envelope(ref.scale[:R]).any()), ref.owner.numel() > 0)
            assert got == want, (fmt, R, K, cfg, case, got, want)
            assert case != "envelope" or got[3], "the crafted rows must be outside the envelope"
            n += 1
        pend = kf.fold_triton(q, defer=True, stats=True)
        assert kf.weight_stats(pend.stats)[:3] == scale_extrema(q.scale)
    return n


def run_quantize_fold_raw(x, fmt, mode, rnd, poison: bool = True, cfg=None):
    from mxkit.formats import Rounding, ScaleMode
    from mxkit.kernels import fold as kf

    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    data, scale, status = kf._outputs(x2.shape[0], K, x.device)
    if poison:
        data.fill_(POISON), scale.view(torch.int32).fill_(-1), status.fill_(POISON)
    kf._run_quantize_fold(x2, get_format(fmt), ScaleMode.parse(mode), Rounding.parse(rnd), data, scale, status, cfg)
    return data, scale, status


def spread_rows(g, fmt: str, R: int, K: int, dtype, spreads) -> torch.Tensor:
    """Random activations (R, K) whose row r's block magnitudes span 2^spreads[r % len] (0 and the full
    spread both present), NaN rows for NAN_ROW entries; in float32 then cast to dtype (fp16 may overflow)."""
    nb = K // 32
    x = rand_blocks(R * nb, generator=g, exp_range=(-2, 2), special=False).reshape(R, nb, 32)
    for r in range(R):
        s = spreads[r % len(spreads)]
        if s == NAN_ROW:
            x[r, -1, 3] = float("nan")
            continue
        k = torch.randint(0, max(s, 0) + 1, (nb,), generator=g)
        k[0], k[-1] = 0, max(s, 0)
        x[r] = x[r] * torch.exp2(-k.to(torch.float32))[:, None]
    return x.reshape(R, K).to(dtype)


def special_rows(dtype) -> torch.Tensor:
    """One crafted special block per row (NaN / Inf / zeros / denormals / huge / ties), followed by two all-zero
    blocks: every row folds in the kernel (zero blocks are ignored by the span) or is NaN."""
    s = special_blocks(nonfinite=True)
    return torch.cat([s, torch.zeros(s.shape[0], 64)], dim=1).to(dtype)


# ---------------------------------------------------------------------------------------------------------
# interpreter checks (run in a subprocess)


def _interpret_checks(fmt: str, seed: int) -> int:
    """Runs under TRITON_INTERPRET=1. Returns the number of checks; raises on a mismatch."""
    from triton.runtime.interpreter import InterpretedFunction

    from mxkit.kernels.fold import fold_config, fold_triton, quantize_fold_triton
    from mxkit.kernels.fold_details import _fold

    assert isinstance(_fold._fold_kernel, InterpretedFunction), "the interpreter must run the fold kernel"
    assert isinstance(_fold._quantize_fold_kernel, InterpretedFunction)
    g, _ = make_generator(seed)
    w = window(fmt)
    n = 0
    spreads = [0, w, w + 1, 40, NAN_ROW, ZERO_ROW, 1]
    # fold_triton: odd shapes (one masked chunk; three chunks with a masked tail), unmasked chunks, 3-D
    for shape in ((7, 96), (33, 2880), (8, 2048), (2, 3, 64)):
        R = math.prod(shape[:-1])
        q = rand_mx(g, fmt, R, shape[-1], spreads, lead=shape[:-1])
        ref = fold_reference(q)
        check_kernel_rows(*run_fold_raw(q), ref, f"fold {fmt} {shape}")
        assert_folded_equal(fold_triton(q), ref, f"fold_triton {fmt} {shape}")
        n += 2
    n += check_weight_stats(g, fmt, spreads)
    # qdata at an offset that is not a multiple of 4 bytes (FP6 rows of 24 bytes): read through an aligned copy
    q = rand_mx(g, fmt, 6, 32, spreads)
    sub = MXTensor(q.qdata[1:], q.scale[1:], q.fmt, 1, 32, (5, 32))
    assert_folded_equal(fold_triton(sub), fold_reference(sub), f"fold_triton {fmt} row view")
    # quantize_fold_triton: every scale mode x rounding x dtype on special rows + random rows of spreads
    for dtype in INPUT_DTYPES:
        x = torch.cat([special_rows(dtype), spread_rows(g, fmt, 9, 96, dtype, spreads)])
        for mode in SCALE_MODES:
            for rnd in ROUNDINGS:
                what = f"quantize_fold {fmt} {dtype} {mode} {rnd}"
                ref = quantize_fold_reference(x, fmt, scale_mode=mode, rounding=rnd)
                check_kernel_rows(*run_quantize_fold_raw(x, fmt, mode, rnd), ref, what)
                n += 1
        got = quantize_fold_triton(x, fmt, scale_mode="even", rounding="away")
        assert_folded_equal(got, quantize_fold_reference(x, fmt, scale_mode="even", rounding="away"), str(dtype))
    # larger odd shapes: several chunks, masked tails, 3-D, wide random data (many rows split on the host)
    for shape, dtype, mode, rnd, raw, api in (((33, 2880), torch.bfloat16, "floor", "rne", True, True),
                                              ((8, 2048), torch.float32, "rceil", "away", True, False),
                                              ((2, 3, 64), torch.float16, "even", "rne", False, True)):
        x = rand_tensor(shape, generator=g, dtype=dtype, exp_range=(-4, 4))
        ref = quantize_fold_reference(x, fmt, scale_mode=mode, rounding=rnd)
        if raw:
            check_kernel_rows(*run_quantize_fold_raw(x, fmt, mode, rnd), ref, f"{fmt} {shape} {mode}")
        if api:
            assert_folded_equal(quantize_fold_triton(x, fmt, scale_mode=mode, rounding=rnd), ref, f"{shape}")
        n += 1
    # the GPU's tile configs (fold_config(on_gpu=True), no inline asm) on odd shapes: [2, 1024] chunks with a
    # masked tail and rows, [16, 32] x 3 chunks, one [2, 2048] chunk
    f = get_format(fmt)
    for R, K in ((5, 2880), (16, 96), (5, 2048)):
        q = rand_mx(g, fmt, R, K, spreads)
        x = spread_rows(g, fmt, R, K, torch.bfloat16, spreads)
        cfg = dataclasses.replace(fold_config(R, K, f), hw_cvt=False)
        check_kernel_rows(*run_fold_raw(q, cfg=cfg), fold_reference(q), f"fold {fmt} {R}x{K} {cfg}")
        ref = quantize_fold_reference(x, fmt, scale_mode="ceil")
        check_kernel_rows(*run_quantize_fold_raw(x, fmt, "ceil", "rne", cfg=cfg), ref, f"{fmt} {R}x{K} {cfg}")
        n += 2
    # R = 0
    e = quantize_fold_triton(torch.empty(0, 3, 64), fmt)
    assert e.data.shape == (0, 64) and e.scale.shape == (0,) and e.owner.shape == (0,) and e.lead_shape == (0, 3)
    # K = 0: refused, as fold_reference refuses it (its R row scales were returned unwritten)
    from mxkit.kernels.fold import fold_triton

    z = MXTensor(torch.empty(3, 0, dtype=torch.uint8), torch.empty(3, 0, dtype=torch.uint8), fmt, 1, 32, (3, 0))
    for fold in (fold_reference, fold_triton):
        try:
            fold(z)
        except ValueError as err:
            assert "K=0" in str(err), err
        else:
            raise AssertionError(f"{fold.__name__} folded K = 0")
    return n + 2


@pytest.fixture(scope="module")
def interpret_runs():
    """One interpreter subprocess per format, all started at once (CI has 2 cores; each is mostly single-threaded
    Python): {fmt: (Popen, seed)}."""
    pytest.importorskip("triton")
    base = int(os.environ.get("MXKIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    runs = {}
    for i, fmt in enumerate(FOLD_FORMATS):
        seed = (base + i) % 2**32
        env = dict(os.environ, TRITON_INTERPRET="1", MXKIT_TEST_SEED=str(seed), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), os.environ.get("PYTHONPATH", "")]))
        runs[fmt] = (subprocess.Popen([sys.executable, os.path.abspath(__file__), "--interpret", fmt], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), seed)
    yield runs
    for proc, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_interpret_fold_kernels(fmt, interpret_runs):
    proc, seed = interpret_runs[fmt]
    print(f"seed={seed} (replay: TRITON_INTERPRET=1 MXKIT_TEST_SEED={seed} python tests/kernel_tests/test_fold.py "
          f"--interpret {fmt})")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"seed={seed}\n{out[-4000:]}\n{err[-8000:]}"
    assert "interpret checks passed" in out


# ---------------------------------------------------------------------------------------------------------
# CPU: config and argument errors (no launch)


def test_fold_config_is_pure_and_bounded():
    from mxkit.kernels.fold import FoldConfig, fold_config

    f = get_format("mxfp4")
    for R in (1, 3, 727, 8192):
        for K in (32, 96, 1056, 2048, 2880, 4096, 8192, 16384, 28672):
            cfg = fold_config(R, K, f)
            assert cfg == fold_config(R, K, f) and isinstance(cfg, FoldConfig)
            if 2048 < K <= 4096:  # one row per program in one tile (measured faster on the H200 at K = 2880)
                assert cfg == FoldConfig(1, 4096, 8, False), (K, cfg)
                assert fold_config(R, 8192, f, quantize=True) == FoldConfig(1, 8192, 16, False)
                continue
            assert cfg.block_k % 32 == 0 and cfg.block_k & (cfg.block_k - 1) == 0 and cfg.block_k <= 2048
            assert cfg.block_r >= 1 and cfg.block_r * cfg.block_k <= 4096
            assert cfg.block_r * cfg.block_k <= 16 * 32 * cfg.num_warps  # <= 16 elements per thread
            chunks = -(-K // cfg.block_k)
            assert 8 * K >= 7 * chunks * cfg.block_k, (K, cfg)  # the tiles pad K by at most 1/8
            assert (chunks == 1) == (K in (32, 2048)) or (K == 96 and chunks == 3), (K, cfg)
            assert chunks == 1 or cfg.block_r == 1 or cfg.block_r * K <= 8192  # small rows for the L2 re-read
            assert cfg.block_r & (cfg.block_r - 1) == 0
            assert fold_config(R, K, f, on_gpu=False).block_k == min(1024, 1 << max(5, (K - 1).bit_length()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_r = 2  # frozen
    assert fold_config(8, 64, get_format("mxfp6_e2m3"), quantize=True, on_gpu=True).hw_cvt
    assert not fold_config(1, 32, get_format("mxfp6_e2m3"), quantize=True, on_gpu=True).hw_cvt  # < 4 per thread
    assert not fold_config(8, 64, get_format("mxfp6_e2m3"), quantize=True, rounding="away", on_gpu=True).hw_cvt
    assert not fold_config(8, 64, get_format("mxfp6_e2m3"), quantize=True, on_gpu=False).hw_cvt


def test_argument_errors():
    from mxkit.kernels.fold import fold_triton, quantize_fold_triton

    with pytest.raises(TypeError, match="float64"):
        quantize_fold_triton(torch.ones(2, 64, dtype=torch.float64), "mxfp4")
    with pytest.raises(TypeError, match="MXTensor"):
        fold_triton(torch.ones(2, 64))
    with pytest.raises(ValueError, match="x.shape\\[-1\\]=48"):
        quantize_fold_triton(torch.ones(2, 48), "mxfp4")
    with pytest.raises(ValueError, match="strides"):
        quantize_fold_triton(torch.ones(64, 4).t(), "mxfp4")
    with pytest.raises(ValueError, match="block_size=16"):
        quantize_fold_triton(torch.ones(2, 64), "mxfp4", block_size=16)
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2", "mxint8"):
        with pytest.raises(ValueError, match=fmt):
            quantize_fold_triton(torch.ones(2, 64), fmt)
        with pytest.raises(ValueError, match=fmt):
            fold_triton(quantize_reference(torch.ones(2, 64), fmt))
    q = quantize_reference(torch.ones(64, 4), "mxfp4", axis=0)
    with pytest.raises(ValueError, match="axis=0"):
        fold_triton(q)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        with pytest.raises(ValueError, match="device=cpu"):
            quantize_fold_triton(torch.ones(2, 64), "mxfp4")
        with pytest.raises(ValueError, match="device=cpu"):
            fold_triton(quantize_reference(torch.ones(2, 64), "mxfp4"))


@pytest.mark.parametrize("case", ["fold_fp4_chunks", "fold_fp6_one", "qfold_fp6_hw_chunks", "qfold_fp4_one_away"])
def test_fold_kernels_compile_for_sm90(case):
    """The compiled (non-interpreted) kernels build for sm_90 on the CPU with Triton's bundled ptxas (what the
    interpreter never sees: layouts of the joins and reshapes, the FP6 cvt asm); their bytes are the GPU tests'.
    (At the configs of fold_config, the sm_90 builds used 37-108 registers and no spills: ptxas -v, 2026-11-24.)"""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the interpreter replaces the compiler")
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.backends.nvidia.compiler")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxkit.fold import fold_range
    from mxkit.kernels.fold import _IN_KIND, _max_frac, fold_config
    from mxkit.kernels.fold_details import _fold

    fmt, R, K, quantize, dtype, mode, away = {
        "fold_fp4_chunks": ("mxfp4_e2m1", 727, 2880, False, None, 0, False),
        "fold_fp6_one": ("mxfp6_e3m2", 3, 2048, False, None, 0, False),
        "qfold_fp6_hw_chunks": ("mxfp6_e2m3", 8192, 8192, True, torch.bfloat16, 2, False),
        "qfold_fp4_one_away": ("mxfp4_e2m1", 5, 1024, True, torch.float16, 3, True),
    }[case]
    f = get_format(fmt)
    d_lo, d_hi = fold_range(f)
    cfg = fold_config(R, K, f, quantize=quantize, rounding="away" if away else "rne")
    ce = dict(BITS=f.bits, MBITS=f.mbits, EMIN=f.emin, BLOCK_R=cfg.block_r, BLOCK_K=cfg.block_k,
              ONE_CHUNK=K <= cfg.block_k, MASKED=R % cfg.block_r != 0 or K % cfg.block_k != 0)
    if quantize:
        fn = _fold._quantize_fold_kernel
        ce.update(IN_KIND=_IN_KIND[dtype], EMAX=f.emax, MAX_NORMAL=float(f.max_normal), MAX_FRAC=_max_frac(f),
                  MODE=mode, AWAY=away, D_HI=d_hi, W=d_hi - d_lo, HW_CVT=cfg.hw_cvt)
        ptrs = {"x_ptr": ("*i32", "*i16", "*fp16")[_IN_KIND[dtype]]}
    else:
        fn = _fold._fold_kernel
        ce.update(D_LO=d_lo, D_HI=d_hi, STATS=case == "fold_fp4_chunks", EXP_LIMIT=54)
        ptrs = {"q_ptr": "*i32", "s_ptr": "*u8", "stats_ptr": "*i32"}
    assert cfg.hw_cvt == (case == "qfold_fp6_hw_chunks")
    ptrs.update(out_ptr="*u8", rs_ptr="*i32", st_ptr="*u8")
    sig = {a: "constexpr" if a in ce else ptrs.get(a, "i32") for a in fn.arg_names}
    k = triton.compile(ASTSource(fn, sig, constexprs=ce), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": cfg.num_warps})
    assert len(k.asm["cubin"]) > 0


# ---------------------------------------------------------------------------------------------------------
# GPU

gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FOLD_FORMATS)
@pytest.mark.parametrize("shape", [(8192, 8192), (727, 2880), (3, 61, 2880), (1, 32), (5, 1056)])
def test_gpu_fold_matches_reference(fmt, shape, rng):
    from mxkit.kernels.fold import fold_triton

    w = window(fmt)
    R = math.prod(shape[:-1])
    q = rand_mx(rng, fmt, R, shape[-1], [0, 3, w, w + 1, 40, NAN_ROW, ZERO_ROW, 1, 2, 5], lead=shape[:-1]).to("cuda")
    ref = fold_reference(q)  # the reference on the GPU too (pure torch, exact)
    check_kernel_rows(*run_fold_raw(q, poison=True), ref, f"gpu fold {fmt} {shape}")
    assert_folded_equal(fold_triton(q), ref, f"gpu fold_triton {fmt} {shape}")
    if shape[0] <= 1024:  # the CUDA reference against the CPU one
        assert_folded_equal(ref, fold_reference(q.to("cpu")), "reference cuda vs cpu")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_gpu_fold_weight_stats(fmt, rng):
    w = window(fmt)
    assert check_weight_stats(rng, fmt, [0, 3, w, w + 1, 40, NAN_ROW, ZERO_ROW], "cuda") == 16


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FOLD_FORMATS)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("rnd", ROUNDINGS)
def test_gpu_quantize_fold_matches_reference(fmt, dtype, mode, rnd, rng):
    from mxkit.kernels.fold import quantize_fold_triton

    w = window(fmt)
    x = torch.cat([special_rows(dtype), spread_rows(rng, fmt, 650, 2880 // 30, dtype, [0, w, w + 1, 40, NAN_ROW]),
                   rand_tensor((1, 96), generator=rng, dtype=dtype)])
    x = torch.cat([x] * 30, dim=1)  # 727 x 2880: every row's blocks repeated (same span)
    assert x.shape == (727, 2880)
    for xs in (x, rand_tensor((3, 61, 2880), generator=rng, dtype=dtype, exp_range=(-3, 3))):
        xc = xs.to("cuda")
        ref = quantize_fold_reference(xs, fmt, scale_mode=mode, rounding=rnd)
        check_kernel_rows(*run_quantize_fold_raw(xc, fmt, mode, rnd, poison=True), ref, f"gpu {fmt} {tuple(xs.shape)}")
        assert_folded_equal(quantize_fold_triton(xc, fmt, scale_mode=mode, rounding=rnd), ref, f"gpu {fmt}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FOLD_FORMATS)
def test_gpu_quantize_fold_large(fmt, rng):
    from mxkit.kernels.fold import quantize_fold_triton

    R = K = 8192
    e = torch.randint(-3, 4, (R, K // 32, 1), generator=rng).float().expand(R, K // 32, 32).reshape(R, K)
    x = (torch.randn(R, K, generator=rng) * torch.exp2(e)).to(torch.bfloat16).cuda()  # block exponents span 6
    ref = quantize_fold_reference(x, fmt)  # on the GPU
    check_kernel_rows(*run_quantize_fold_raw(x, fmt, "floor", "rne", poison=True), ref, f"gpu 8192^2 {fmt}")
    assert_folded_equal(quantize_fold_triton(x, fmt), ref, "gpu 8192^2")


@pytest.mark.gpu
@gpu
def test_gpu_int64_offsets(rng):
    """R * K > 2^31 elements: the last rows (offsets past 2^31) against the reference of those rows."""
    from mxkit.kernels.fold import fold_triton, quantize_fold_triton

    R, K = 65600, 32768
    assert R * K > 2**31
    qd = torch.randint(0, 256, (R, K // 2), dtype=torch.uint8, device="cuda")
    sc = torch.randint(120, 130, (R, K // 32), dtype=torch.uint8, device="cuda")
    q = MXTensor(qd, sc, "mxfp4", 1, 32, (R, K))
    got = fold_triton(q)
    assert got.owner.numel() == 0  # spread 9 < 14: every row folds in the kernel
    for rows in (slice(0, 3), slice(R - 3, R)):
        sub = MXTensor(qd[rows].cpu(), sc[rows].cpu(), "mxfp4", 1, 32, (3, K))
        assert_folded_equal(Folded(got.data[rows], got.scale[rows], got.owner[:0], got.fmt, torch.Size([3])),
                            fold_reference(sub), f"rows {rows}")
    del got, qd, sc, q
    x = torch.randn(R, K, dtype=torch.bfloat16, device="cuda")
    got = quantize_fold_triton(x, "mxfp6_e2m3")
    ref = quantize_fold_reference(x[R - 3:].cpu(), "mxfp6_e2m3")
    assert_folded_equal(Folded(got.data[R - 3:R], got.scale[R - 3:R], got.owner[:0], got.fmt, torch.Size([3])),
                        ref, "last rows")


if __name__ == "__main__" and "--interpret" in sys.argv:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    fmt_arg = sys.argv[sys.argv.index("--interpret") + 1]
    seed_arg = int(os.environ.get("MXKIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed={seed_arg}: {_interpret_checks(fmt_arg, seed_arg)} interpret checks passed")
