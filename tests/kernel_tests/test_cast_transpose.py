"""Cast-transpose (one call quantizes x along its last two dims: the fused kernels, or FP6 one-direction programs
over regions, :mod:`mxkit.kernels.quantize_details._cast_transpose`) and the scale byte transpose, against the
reference byte for byte. CPU: Triton's interpreter in a subprocess (no inline asm there: the hardware-convert
paths, FP8 cvt words, FP4 bf16x2 and bf16 pairs, the FP6 pairs and unit asm, run on the GPU only; their PTX is run
on the CPU by tests/kernel_tests/test_codecs.py and their bytes are checked by the GPU tests here)."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    DEV, FORMAT_NAMES, FULL, INPUT_DTYPES, ROUNDINGS, SCALE_MODES, SKIP_REASON_CUDA, assert_bytes_equal,
    assert_mx_equal, fp8_tie_blocks, interpreted_rng, rand_tensor, ref_layout, run_interpreted,
)

from mxkit.kernels.quantize import QuantizeConfig as QC
from mxkit.reference import quantize_reference

_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_ct(outs, x, fmt, mode, rnd, layout, what):
    for o, a in zip((outs[:2], outs[2:]), (-1, -2)):
        ref = quantize_reference(x, fmt, axis=a, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(o[0], ref.qdata, f"{what} axis={a} qdata")
        assert_bytes_equal(o[1], ref.scale if layout == "plain" else ref_layout(ref.scale, layout),
                           f"{what} axis={a} scale")


def _check_cast_transpose_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`); raises on a mismatch."""
    from mxkit.kernels.quantize import _cast_transpose_impl, _transpose_bytes, quantize_triton
    from mxkit.kernels.quantize_details import _cast_transpose

    g = interpreted_rng(_cast_transpose._cast_transpose_kernel, _cast_transpose._cast_transpose_tile_kernel,
                        _cast_transpose._cast_transpose_split_kernel, _cast_transpose._transpose_bytes_kernel)
    n = 0
    dts = INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        mode, rnd, dt = SCALE_MODES[i % 4], ROUNDINGS[i % 2], dts[i % 3]
        # the public call, 3-D [B, M, K], one order per format (both appear), a layout per format
        x = rand_tensor((2, 32, 64), -1, generator=g, dtype=dt)
        layout = ("plain", "nvidia_128x4", "aiter_shuffle")[i % 3]
        axes = ((-1, -2), (-2, -1))[i % 2]
        outs = quantize_triton(x, fmt, axis=axes, scale_mode="rceil", scale_layout=layout)
        for o, a in zip(outs, axes):
            assert_mx_equal(o, quantize_reference(x, fmt, axis=a, scale_mode="rceil"), layout,
                            what=f"cast-transpose {fmt} {dt} axes={axes} axis={a}")
        # the tile kernel (one raw tile for both halves: FP6 codes transposed, the others the raw tile); FP6 by
        # one-direction programs (split_rows; the other formats: the fused kernel with the same tiles), ragged R
        x = rand_tensor((96, 64), -1, generator=g, dtype=dts[i % 3])
        cfg = QC(block_r=64, block_c=32, num_warps=2, int64=False)
        _check_ct(_cast_transpose_impl(x, fmt, "floor", rnd, "plain", cfg=cfg), x, fmt, "floor", rnd, "plain",
                  f"tile {fmt}")
        split = QC(block_r=(32, 64)[i % 2], block_c=32, num_warps=1, int64=False, col_units=2,
                   split_rows=((1, 64, 8), (2, 64, 4))[i % 2])
        _check_ct(_cast_transpose_impl(x, fmt, "even", rnd, "nvidia_128x4", cfg=split), x, fmt, "even", rnd,
                  "nvidia_128x4", f"split {fmt}")
        # the fused kernel (whole units per thread in the columns; also the 3-D grid), and split
        x = rand_tensor((96, 128), -1, generator=g, dtype=dts[(i + 1) % 3], nonfinite=True)
        lay = "plain" if i % 3 == 0 else layout
        for cfg in (QC(block_r=64, block_c=32, num_warps=2, int64=False, col_units=2, grid3=i % 2 == 0),
                    QC(block_r=64, block_c=32, num_warps=2, int64=False, col_units=2, split_rows=(2, 64, 4))):
            _check_ct(_cast_transpose_impl(x, fmt, "rceil", rnd, lay, cfg=cfg), x, fmt, "rceil", rnd, lay,
                      f"{cfg} {fmt}")
        # the tile kernel in strips of 2 column tiles (3 x 3 tiles: the last strip narrower) and in C-fastest
        # order; the fused kernel with programs walking 4 tiles down R
        x = rand_tensor((96, 96), -1, generator=g, dtype=dt)
        cfg = QC(block_r=32, block_c=32, num_warps=1, int64=False, group_c=2)
        _check_ct(_cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=cfg), x, fmt, mode, rnd, "plain",
                  f"tile group_c {fmt}")
        x = rand_tensor((64, 96), -1, generator=g, dtype=dt)
        cfg = QC(block_r=32, block_c=32, num_warps=1, int64=False)
        _check_ct(_cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=cfg), x, fmt, mode, rnd, "plain",
                  f"{cfg} {fmt}")
        x = rand_tensor((128, 64), -1, generator=g, dtype=dt)
        cfg = QC(block_r=32, block_c=32, num_warps=1, int64=False, rblocks=4, col_units=2)
        _check_ct(_cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=cfg), x, fmt, mode, rnd, "plain",
                  f"rblocks=4 {fmt}")
        for cfg in (QC(block_r=64, block_c=32, num_warps=2, int64=True),  # 64-bit offsets: tile and fused kernels
                    QC(block_r=64, block_c=32, num_warps=2, int64=True, col_units=2)):
            _check_ct(_cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=cfg), x, fmt, mode, rnd, "plain",
                      f"int64 {cfg} {fmt}")
        n += 10
    # the tiled byte transpose behind scale_t, ragged tiles both ways
    for m, nn in ((1, 1), (70, 130), (64, 64), (3, 200)):
        src = torch.randint(0, 256, (m, nn), generator=g, dtype=torch.uint8)
        dst = torch.full((nn, m), 0xAB, dtype=torch.uint8)
        _transpose_bytes(src, dst)
        assert torch.equal(dst, src.t()), (m, nn)
    n += 1
    # the 3-D launch grid (program ids = tile indices) and the 1-D one that the kernel splits: a batched
    # cast-transpose with ragged tiles both ways, every tile index from the one or the other
    x = rand_tensor((3, 96, 160), -1, generator=g, dtype=torch.float32, nonfinite=True)
    for grid3 in (True, False):
        for cfg in (QC(block_r=64, block_c=32, num_warps=2, int64=False, col_units=2, grid3=grid3),
                    QC(block_r=32, block_c=64, num_warps=1, int64=False, col_units=2, rblocks=2, grid3=grid3)):
            _check_ct(_cast_transpose_impl(x, "mxfp8_e4m3", "rceil", "rne", "plain", cfg=cfg), x, "mxfp8_e4m3",
                      "rceil", "rne", "plain", f"{cfg}")
            n += 1
    print(f"interpreter checks passed: {n}")


def test_cast_transpose_interpreted():
    """Every format: the public call (3-D, both orders, the three layouts), the fused and the tile kernel, FP6
    one-direction programs, strips, multi-tile programs, both launch grids, the scale byte transpose, run by
    Triton's CPU interpreter in a subprocess."""
    run_interpreted(__file__, "_check_cast_transpose_interpreted")


@pytest.mark.gpu
@pytest.mark.parametrize("case", [0, 1])  # 2-D / 3-D input (separate tests: shared over the GPU test processes)
@pytest.mark.parametrize("dtype", list(_DT) if FULL else ["bfloat16"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_cast_transpose(fmt, dtype, case, rng, poison):
    """Fused (last, second-to-last) pairs in both orders on 2-D and 3-D inputs, and an unfused pair. The 2-D
    rows (1056 elements) are wide enough for the FP6 defaults of C >= 512 (bf16: the fused kernel from bf16
    pairs, 128 x 128 tiles; fp32 / fp16: the one-direction programs, split_rows), with ragged last tiles /
    regions; the 3-D input takes the fused kernel."""
    from mxkit.kernels.quantize import quantize_triton

    cases = [((320, 1056), ((-1, -2), (0, 1))), ((32, 64, 96), ((-2, -1), (0, 2)))]
    if FULL:
        cases = [((320, 1056), ((-1, -2), (0, 1), (1, 0))), ((32, 64, 96), ((-1, -2), (-2, -1), (0, 2)))]
    j, (shape, pairs) = case, cases[case]
    x = rand_tensor(shape, -1, generator=rng, dtype=_DT[dtype], nonfinite=True)
    rounding = ROUNDINGS[(FORMAT_NAMES.index(fmt) + j) % 2]
    for p, axes in enumerate(pairs):
        # two modes per (shape, pair) outside FULL runs; the fused pairs of the two shapes cover all four
        for mode in SCALE_MODES if FULL else (SCALE_MODES[(j + p) % 4], SCALE_MODES[(j + p + 2) % 4]):
            outs = quantize_triton(x.to(DEV), fmt, axis=axes, scale_mode=mode, rounding=rounding)
            assert len(outs) == 2
            for o, a in zip(outs, axes):
                ref = quantize_reference(x, fmt, axis=a, scale_mode=mode, rounding=rounding)
                assert_mx_equal(o, ref, what=f"cast-transpose {shape} axes={axes} axis={a} {mode} {rounding}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"])
def test_gpu_cast_transpose_streams_and_graphs(fmt, rng, poison):
    """The large cast-transposes (2^26 elements and more: the column scales go through the transposed buffer and
    a second launch, scale_t) with a batch (R / 32 = 130: ragged scale-transpose tiles; FP6: a ragged last row
    tile), on fresh data: two calls at once on two side streams, and a CUDA graph captured once and replayed
    twice on new input."""
    from mxkit.kernels import quantize as kq
    from mxkit.kernels.quantize import quantize_triton

    if DEV != "cuda":
        pytest.skip(SKIP_REASON_CUDA)  # (2^26 elements: too many for the interpreter)
    shape = (4, 4160, 4096)
    assert kq.quantize_config(4, 4160, 4096, True, True, fmt).scale_t

    def fresh():
        e = torch.randint(-30, 30, (shape[0], shape[1], 1), generator=rng).float()
        return (torch.randn(shape, generator=rng) * torch.exp2(e)).to(torch.bfloat16).cuda()

    def check(outs, x, what):
        for o, a in zip(outs, (-1, -2)):
            ref = quantize_reference(x, fmt, axis=a)
            assert torch.equal(o.qdata, ref.qdata), f"{what} axis={a} qdata"
            assert torch.equal(o.scale, ref.scale), f"{what} axis={a} scale"

    xs, streams, outs = [fresh(), fresh()], [torch.cuda.Stream(), torch.cuda.Stream()], []
    for x, st in zip(xs, streams):
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            outs.append(quantize_triton(x, fmt, axis=(-1, -2)))
    torch.cuda.synchronize()
    for k in range(2):
        check(outs[k], xs[k], f"stream {k}")
    static = fresh()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = quantize_triton(static, fmt, axis=(-1, -2))
    for i in range(2):
        static.copy_(fresh())
        graph.replay()
        torch.cuda.synchronize()
        check(gout, static, f"graph replay {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("half", [0, 1])  # two halves of the configs (pytest-xdist spreads them)
@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_fp6_pairs(fmt, half, rng, poison):
    """FP6 from bf16 pairs (``fp6_pairs``: ``quantize_details._rows._rows_fp6_pairs``, ``_cols._cols_fp6_pairs``,
    the asm ``_codecs._fp6_pairs_asm``) with and without the [groups, rows, 4] row store (fp6_store4):
    rowwise, the fused cast-transpose on several tiles and the default cast-transposes, on
    bf16 (the pairs paths), fp32 (the same configs' fallbacks) and a bf16 input at an address that is not a
    multiple of 4 (the fallback too); ragged shapes (masked rows and columns), NaN / Inf / zero / subnormal /
    saturating blocks and the crafted tie blocks; a batch of matrices through the public call (the default
    fused kernel with B > 1); outputs in poisoned memory."""
    import dataclasses

    from mxkit.kernels.quantize import _cast_transpose_impl, _quantize_impl, quantize_config, quantize_triton

    def default(x, rows, cols):
        return quantize_config(1, x.shape[0], x.shape[1], rows, cols, fmt)

    kw = dict(hw_cvt=True, col_units=2, fp6_asm=True, fp6_pairs=True)
    fused = [QC(block_r=128, block_c=64, num_warps=4, int64=False, fp6_store4=True, scale_t=True, **kw),
             QC(block_r=64, block_c=64, num_warps=2, int64=False, **kw),
             QC(block_r=64, block_c=128, num_warps=4, int64=False, fp6_store4=True, **kw),
             QC(block_r=32, block_c=256, num_warps=4, int64=False, fp6_store4=True, scale_t=True, **kw)]
    ties = fp8_tie_blocks(fmt, multiple=32)  # (a multiple of 32 blocks: the rows and cast-transpose run too)
    xs = [rand_tensor(shape, 0, generator=rng, dtype=torch.bfloat16, nonfinite=True)
          for shape in ((320, 208), (96, 544), (256, 1024))]
    xs += [ties.T.contiguous().to(torch.bfloat16), rand_tensor((160, 96), 0, generator=rng, nonfinite=True)]
    buf = torch.empty(192 * 512 + 1, dtype=torch.bfloat16)
    odd = buf[1:].view(192, 512)  # (the device copy keeps the 2-byte offset: see below)
    odd.copy_(rand_tensor((192, 512), 0, generator=rng, dtype=torch.bfloat16, nonfinite=True))
    for i, x in enumerate(xs + [odd]):
        xd = x.to(DEV)
        if x is odd:  # an input address 2 bytes past a 4-byte boundary
            big = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEV)
            xd = big[1:].view(x.shape)
            xd.copy_(x.to(DEV))
            assert xd.data_ptr() % 4 == 2
        cfgs = [("rows", dataclasses.replace(default(x, True, False), fp6_pairs=True, fp6_store4=bool(i % 2))),
                ("cols", default(x, False, True)),
                ("ct", default(x, True, True))]
        cfgs += [("ct", c) for k, c in enumerate(fused) if (k + i) % 2 == half]
        for k, (kind, cfg) in enumerate(cfgs):
            if kind == "rows" and half == 1 or kind == "cols" and half == 0:
                continue
            mode = SCALE_MODES[(i + k + half) % 4]
            if kind in ("rows", "cols"):
                a = -1 if kind == "rows" else 0
                if x.shape[a] % 32:
                    continue
                ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                q, s = _quantize_impl(xd, fmt, a, mode, "rne", "plain", cfg)
                assert_bytes_equal(q.cpu(), ref.qdata, f"{kind} {cfg} {mode} {x.shape} {x.dtype} qdata")
                assert_bytes_equal(s.cpu(), ref.scale, f"{kind} {cfg} {mode} {x.shape} scale")
                continue
            if x.shape[1] % 32:
                continue
            lay = "plain" if cfg.scale_t else "nvidia_128x4"
            outs = _cast_transpose_impl(xd, fmt, mode, "rne", lay, cfg)
            for got, a in ((outs[:2], -1), (outs[2:], 0)):
                ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                assert_bytes_equal(got[0].cpu(), ref.qdata, f"cast-T {cfg} axis={a} {mode} {x.shape} qdata")
                assert_bytes_equal(got[1].cpu(), ref_layout(ref.scale, lay).cpu(),
                                   f"cast-T {cfg} axis={a} {mode} {x.shape} scale")
    # a batch of matrices through the public call (the default config: the fused pairs kernel with B > 1)
    x3 = rand_tensor((3, 96, 1056), -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
    mode = SCALE_MODES[half + 2]
    rows, cols = quantize_triton(x3.to(DEV), fmt, axis=(-1, -2), scale_mode=mode)
    assert_mx_equal(rows, quantize_reference(x3, fmt, axis=-1, scale_mode=mode), what=f"{fmt} 3-D rows {mode}")
    assert_mx_equal(cols, quantize_reference(x3, fmt, axis=-2, scale_mode=mode), what=f"{fmt} 3-D cols {mode}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=SKIP_REASON_CUDA)
def test_gpu_cast_transpose_hot_path_is_the_checked_call(rng):
    """mxkit.cast_transpose's eager hot path (a 2-D problem seen before runs from quantize's cached plan): repeated
    calls give the reference's bytes, a 3-D x is still flattened (quantize's axis=(1, 0) of that 3-D x, keyed like
    it, is another problem), and an x the checks refuse is refused on every call."""
    import mxkit

    x2 = rand_tensor((64, 96), -1, generator=rng, dtype=torch.bfloat16).to(DEV)
    x3 = rand_tensor((32, 64, 96), -1, generator=rng, dtype=torch.bfloat16).to(DEV)
    mxkit.quantize(x3, "mxfp8", axis=(1, 0))  # (a hot entry under x3's shape and the axes (1, 0))
    for _ in range(3):
        for x in (x2, x3):
            rows, cols = mxkit.cast_transpose(x, "mxfp8")
            flat = x.reshape(-1, 96).cpu()
            assert_mx_equal(rows, quantize_reference(flat, "mxfp8", axis=1), what=f"rows {tuple(x.shape)}")
            assert_mx_equal(cols, quantize_reference(flat, "mxfp8", axis=0), what=f"cols {tuple(x.shape)}")
        with pytest.raises(ValueError, match="multiple of block_size"):
            mxkit.cast_transpose(x2[:48, :64].contiguous(), "mxfp8")
