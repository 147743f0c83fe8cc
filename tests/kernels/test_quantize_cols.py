"""Columnwise quantize (blocks of 32 along a dim other than the last; :mod:`mxkit.kernels.quantize_details._cols`)
against the reference, byte for byte.

CPU: the kernels run under Triton's interpreter (a subprocess). The interpreter cannot run inline asm, so the
hardware-convert column paths (FP8 unit words, FP4 pairs, the FP6 unit asm) fall back to the integer encoder
there; their PTX is checked on the CPU by tests/kernels/test_codecs.py and their bytes by the GPU tests here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    DEV, FORMAT_NAMES, INPUT_DTYPES, ROUNDINGS, SCALE_MODES, assert_bytes_equal, assert_mx_equal,
    fp8_tie_blocks, interpreted_rng, rand_tensor, ref_layout, run_interpreted, variant_modes,
)

from mxkit.kernels.quantize import QuantizeConfig as QC
from mxkit.reference import quantize_reference


def _check_cols_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`); raises on a mismatch."""
    from mxkit.kernels.quantize import _quantize_impl, quantize_triton
    from mxkit.kernels.quantize_details import _quantize

    g = interpreted_rng(_quantize._quantize_kernel)
    n, dts = 0, INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        for j in range(4):
            # every mode on each format, blocks along dim 0; rounding and dtype rotate
            mode, rnd, dt = SCALE_MODES[j], ROUNDINGS[(i + j + 1) % 2], dts[(i + j + 1) % 3]
            x = rand_tensor((64, 3), 0, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
            ref = quantize_reference(x, fmt, axis=0, scale_mode=mode, rounding=rnd)
            assert_mx_equal(quantize_triton(x, fmt, axis=0, scale_mode=mode, rounding=rnd), ref,
                            what=f"{fmt} {mode} {rnd} {dt} axis=0")
            n += 1
        mode, rnd, dt = SCALE_MODES[i % 4], ROUNDINGS[i % 2], dts[i % 3]
        layout = ("plain", "nvidia_128x4", "aiter_shuffle")[i % 3]
        # col_packed (codes packed into words along R before the transpose: the FP4 columnwise path) on every
        # format: a batch, ragged R and C tiles, a layout per format, scale_t; 128-row tiles (stores along
        # (word, unit)); col_wide: 64-bit units for the 8- / 4-bit formats (e5m2 keeps 32-bit)
        x = rand_tensor((2, 160, 40), 1, generator=g, dtype=dts[(i + 1) % 3], nonfinite=True)
        cfg = QC(block_r=(64, 32, 128)[i % 3], block_c=(32, 16, 16)[i % 3], num_warps=1 + i % 3 // 2, int64=False,
                 col_packed=True, scale_t=i % 2 == 0, col_wide=i != 1)
        lay = "plain" if i % 3 == 0 else layout
        q, s = _quantize_impl(x, fmt, 1, "even", rnd, lay, cfg=cfg)
        ref = quantize_reference(x, fmt, axis=1, scale_mode="even", rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_packed {fmt} qdata")
        assert_bytes_equal(s, ref.scale if lay == "plain" else ref_layout(ref.scale, lay), f"col_packed {fmt} scale")
        # col_units (lanes along the columns with 1- / 2-element loads, warps along the blocks, whole units per
        # thread: the FP8 / FP6 / MXINT8 columnwise path) on every format: a batch, ragged R and C tiles,
        # scale_t, the 3-D launch grid, 256 x 64 on eight warps (the FP8 default from 256 rows; one ragged tile)
        x = rand_tensor((2, 160, 40), 1, generator=g, dtype=dts[(i + 2) % 3], nonfinite=True)
        cfg = QC(block_r=(128, 64, 32, 256)[i % 4], block_c=(64, 16, 32, 64)[i % 4], num_warps=(4, 2, 1, 8)[i % 4],
                 int64=False, col_units=1 + i % 2, scale_t=i % 2 == 1, grid3=i % 3 != 1)
        q, s = _quantize_impl(x, fmt, 1, "ceil", rnd, lay, cfg=cfg)
        ref = quantize_reference(x, fmt, axis=1, scale_mode="ceil", rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_units {cfg} {fmt} qdata")
        assert_bytes_equal(s, ref.scale if lay == "plain" else ref_layout(ref.scale, lay), f"col_units {fmt} scale")
        # 3-D middle axis, swizzled layout
        x = rand_tensor((3, 32, 5), 1, generator=g, dtype=dt)
        assert_mx_equal(quantize_triton(x, fmt, axis=1, scale_layout="nvidia_128x4"),
                        quantize_reference(x, fmt, axis=1), "nvidia_128x4", what=f"{fmt} 3-D axis 1")
        # col_direct: the untransposed tile quantized, only the codes transposed
        x = rand_tensor((64, 40), 0, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
        layout = ("plain", "nvidia_128x4")[i % 2]
        q, s = _quantize_impl(x, fmt, 0, mode, rnd, layout,
                              cfg=QC(block_r=32, block_c=32, num_warps=2, int64=False, col_direct=True))
        ref = quantize_reference(x, fmt, axis=0, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_direct {fmt} qdata")
        assert_bytes_equal(s, ref.scale if layout == "plain" else ref_layout(ref.scale, layout),
                           f"col_direct {fmt} scale")
        n += 4
        # programs walking 8 / 4 / 2 tiles down R: a batch of 3, a span that does not divide R (masked), a
        # swizzled layout; the column path rotates (col_direct, col_packed, the raw transpose)
        for k, (shape, axis, rb, layout) in enumerate((((256, 40), 0, 8, "plain"), ((3, 128, 40), 1, 4, "plain"),
                                                       ((96, 40), 0, 2, "plain"), ((128, 40), 0, 4, "nvidia_128x4"))):
            x = rand_tensor(shape, axis, generator=g, dtype=dt)
            cfg = QC(block_r=32, block_c=16, num_warps=1, int64=False, col_direct=(i + k) % 3 == 0,
                     col_packed=(i + k) % 3 == 1, rblocks=rb)
            q, s = _quantize_impl(x, fmt, axis, mode, rnd, layout, cfg=cfg)
            ref = quantize_reference(x, fmt, axis=axis, scale_mode=mode, rounding=rnd)
            assert_bytes_equal(q, ref.qdata, f"rblocks={rb} {fmt} {shape} qdata")
            assert_bytes_equal(s, ref.scale if layout == "plain" else ref_layout(ref.scale, layout),
                               f"rblocks={rb} {fmt} {shape} scale")
            n += 1
        # strip order (group_c) with a batch dim: [B=3, R=64, C=40] quantized along R
        x = rand_tensor((3, 64, 40), 1, generator=g, dtype=dt)
        q, s = _quantize_impl(x, fmt, 1, mode, rnd, "plain",
                              cfg=QC(block_r=32, block_c=16, num_warps=1, int64=False, group_c=2))
        ref = quantize_reference(x, fmt, axis=1, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"group_c {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"group_c {fmt} scale")
        # columnwise scales through a transposed buffer (scale_t), with a batch
        q, s = _quantize_impl(x, fmt, 1, mode, rnd, "plain",
                              cfg=QC(block_r=32, block_c=16, num_warps=1, int64=False, col_direct=bool(i % 2),
                                     scale_t=True))
        assert_bytes_equal(q, ref.qdata, f"scale_t {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"scale_t {fmt} scale")
        n += 2
    print(f"interpreter checks passed: {n}")


def test_cols_interpreted():
    """Every format x mode, both roundings, every dtype; col_packed, col_units, col_direct, multi-tile programs,
    strips, scale_t, a middle axis and the swizzled layouts, run by Triton's CPU interpreter in a subprocess."""
    run_interpreted(__file__, "_check_cols_interpreted")


def _col_variants(fmt: str) -> list:
    """Columnwise configs beside the production ones, each also run as a fused cast-transpose."""
    hw = fmt.startswith(("mxfp8", "mxfp6", "mxfp4"))  # formats with a hardware-convert path
    cfgs = [QC(block_r=32, block_c=64, num_warps=2, int64=False, col_direct=True)]
    if hw:
        cfgs += [QC(block_r=32, block_c=64, num_warps=2, int64=False, group_c=3, hw_cvt=True),
                 QC(block_r=32, block_c=64, num_warps=2, int64=False, col_direct=True, hw_cvt=True),
                 QC(block_r=32, block_c=64, num_warps=1, int64=False, col_direct=True, rblocks=8, hw_cvt=True),
                 QC(block_r=32, block_c=64, num_warps=1, int64=False, col_direct=True, rblocks=4, hw_cvt=True)]
    # col_packed on every format, other tiles and scale_t; 64-bit units (col_wide; ignored for FP6)
    cfgs += [QC(block_r=64, block_c=32, num_warps=1, int64=False, col_packed=True),
             QC(block_r=32, block_c=64, num_warps=2, int64=False, col_packed=True, group_c=16, hw_cvt=hw),
             QC(block_r=64, block_c=64, num_warps=2, int64=False, col_packed=True, scale_t=True, hw_cvt=hw),
             QC(block_r=128, block_c=64, num_warps=2, int64=False, col_packed=True, col_wide=True, hw_cvt=hw),
             QC(block_r=64, block_c=64, num_warps=2, int64=False, col_packed=True, col_wide=True, scale_t=True,
                hw_cvt=hw),
             QC(block_r=64, block_c=32, num_warps=1, int64=False, col_packed=True, col_wide=True)]
    # cast-transpose by one-direction programs (split_rows): both column paths
    cfgs += [QC(block_r=128, block_c=64, num_warps=2, int64=False, col_packed=True, col_wide=True, fp4_pairs=True,
                fp6_words=True, hw_cvt=hw, split_rows=(2, 256, 4)),
             QC(block_r=32, block_c=64, num_warps=1, int64=False, col_direct=True, fp6_words=True, fp4_pairs=True,
                hw_cvt=hw, scale_t=True, split_rows=(1, 128, 8))]
    # col_units: 1- / 2-element loads, scale_t, the FP6 unit asm, the one-direction cast-transpose
    cfgs += [QC(block_r=128, block_c=64, num_warps=4, int64=False, col_units=2, hw_cvt=hw, fp6_asm=True),
             QC(block_r=64, block_c=32, num_warps=2, int64=False, col_units=1, scale_t=True, hw_cvt=hw, fp6_asm=True),
             QC(block_r=64, block_c=64, num_warps=2, int64=False, col_units=2, fp6_words=True, fp4_pairs=True,
                hw_cvt=hw, scale_t=True, split_rows=(2, 128, 4), fp6_asm=True)]
    # programs walking 4 tiles down R, on the raw-transpose path and on packed tiles (the packed path stores its
    # own scales); strips with scale_t
    cfgs += [QC(block_r=32, block_c=64, num_warps=1, int64=False, rblocks=4),
             QC(block_r=32, block_c=128, num_warps=2, int64=False, col_packed=True, rblocks=4, hw_cvt=hw),
             QC(block_r=32, block_c=64, num_warps=1, int64=False, col_direct=True, group_c=16, scale_t=True)]
    # FP8 unit words straight from the cvt asm (fp8_words) on col_packed 32-bit units and col_units; the
    # cast-transpose's eviction hints (ct_evict 2: the rows' hint only)
    cfgs += [QC(block_r=32, block_c=128, num_warps=2, int64=False, col_packed=True, fp8_words=True, hw_cvt=hw),
             QC(block_r=256, block_c=64, num_warps=8, int64=False, col_units=2, fp8_words=True, hw_cvt=hw),
             QC(block_r=32, block_c=64, num_warps=1, int64=False, col_packed=True, fp8_words=True, hw_cvt=hw,
                scale_t=True),
             QC(block_r=32, block_c=256, num_warps=4, int64=False, col_units=2, fp8_words=True, ct_evict=2,
                hw_cvt=hw)]
    if fmt.startswith("mxfp6"):  # cast-transpose with the rows through fp6_words (the columns reload the tile)
        cfgs += [QC(block_r=32, block_c=32, num_warps=1, int64=False, fp6_words=True, group_c=16),
                 QC(block_r=32, block_c=64, num_warps=1, int64=False, fp6_words=True, col_direct=True),
                 QC(block_r=128, block_c=32, num_warps=2, int64=False, col_packed=True)]
    return cfgs


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,k", [(f, k) for f in FORMAT_NAMES for k in range(len(_col_variants(f)))])
def test_gpu_col_variants_match_reference(fmt, k, rng, poison):
    """Each columnwise variant config byte-equals the reference, columnwise and as a fused cast-transpose: its
    scale mode(s), both roundings, fp32 / bf16 / fp16 rotating, wide-range random data with special blocks,
    ragged shapes, and with a hardware path the crafted tie / saturation / subnormal blocks (RNE)."""
    from mxkit.kernels.quantize import _cast_transpose_impl, _quantize_impl

    cfg = _col_variants(fmt)[k]
    hw = fmt.startswith(("mxfp8", "mxfp6", "mxfp4"))
    # (col_units: 208 columns, a multiple of 16, so that FP6 takes the unit asm; ragged column tiles either way)
    x = rand_tensor((512 if cfg.rblocks > 1 else 320, 208 if cfg.col_units else 200), 0, generator=rng,
                    dtype=INPUT_DTYPES[(k + 1) % 3], nonfinite=True)
    xt = fp8_tie_blocks(fmt).T.contiguous() if hw else None
    if xt is not None and k % 2:
        xt = xt.to(torch.bfloat16)
    for mode in variant_modes(k):
        for rnd in ROUNDINGS:
            for xx in (x, xt) if (xt is not None and rnd == "rne") else (x,):
                ref = quantize_reference(xx, fmt, axis=0, scale_mode=mode, rounding=rnd)
                lay = "plain" if (cfg.rblocks > 1 or cfg.scale_t) else "nvidia_128x4"
                q, s = _quantize_impl(xx.to(DEV), fmt, 0, mode, rnd, lay, cfg)
                assert_bytes_equal(q.cpu(), ref.qdata, f"cols {cfg} {mode} {rnd} {xx.dtype} qdata")
                assert_bytes_equal(s.cpu(), ref_layout(ref.scale, lay).cpu(), f"cols {cfg} {mode} scale")
            # fused cast-transpose with the same config (rows and columns from one tile)
            xc = x[:, :192] if k % 2 else x[:256, :96]
            qr, sr, qc, sc = _cast_transpose_impl(xc.to(DEV), fmt, mode, rnd, "plain", cfg)
            for got, a in (((qr, sr), -1), ((qc, sc), 0)):
                ref = quantize_reference(xc, fmt, axis=a, scale_mode=mode, rounding=rnd)
                assert_bytes_equal(got[0].cpu(), ref.qdata, f"cast-T {cfg} axis={a} {mode} {rnd} qdata")
                assert_bytes_equal(got[1].cpu(), ref.scale, f"cast-T {cfg} axis={a} {mode} {rnd} scale")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_gpu_fp4_units(k, rng, poison):
    """FP4 columns from bf16 pairs in the col_units layout (``quantize_details._cols._cols_fp4_units``): the fused
    FP4 cast-transpose default (64 x 128, rows from bf16 pairs with the blocks outer, ct_evict) and other tiles
    (32 rows with 64-bit units, 8 warps, one-direction programs), columnwise and cast-transpose, on bf16 (the asm paths) and fp32 (the per-element fallback of the same config), ragged
    shapes (masked rows and columns), NaN / Inf / zero / subnormal / saturating blocks and the crafted tie
    blocks; outputs in poisoned memory."""
    from mxkit.kernels.quantize import _cast_transpose_impl, _quantize_impl

    fmt = "mxfp4_e2m1"
    kw = dict(hw_cvt=True, col_units=2, col_fp4_words=True, fp4_pairs=True)
    cfgs = [QC(block_r=64, block_c=128, num_warps=4, int64=False, ct_evict=1, scale_t=True, **kw),
            QC(block_r=32, block_c=256, num_warps=4, int64=False, col_wide=True, ct_evict=2, **kw),
            QC(block_r=64, block_c=256, num_warps=8, int64=False, ct_evict=1, **kw),
            QC(block_r=64, block_c=64, num_warps=2, int64=False, split_rows=(2, 128, 4), **kw)]
    ties = fp8_tie_blocks(fmt)
    cfg = cfgs[k]
    xs = [rand_tensor(shape, 0, generator=rng, dtype=torch.bfloat16, nonfinite=True)
          for shape in ((320, 208), (96, 288), (256, 1024))]
    xs += [ties.T.contiguous().to(torch.bfloat16), rand_tensor((160, 96), 0, generator=rng, nonfinite=True)]
    for i, x in enumerate(xs):
        for mode in variant_modes(k + i):
            lay = "plain" if cfg.scale_t else "nvidia_128x4"
            ref = quantize_reference(x, fmt, axis=0, scale_mode=mode)
            q, s = _quantize_impl(x.to(DEV), fmt, 0, mode, "rne", lay, cfg)
            assert_bytes_equal(q.cpu(), ref.qdata, f"cols {cfg} {mode} {x.shape} {x.dtype} qdata")
            assert_bytes_equal(s.cpu(), ref_layout(ref.scale, lay).cpu(), f"cols {cfg} {mode} scale")
            if x.shape[1] % 32:
                continue
            outs = _cast_transpose_impl(x.to(DEV), fmt, mode, "rne", lay, cfg)
            for got, a in ((outs[:2], -1), (outs[2:], 0)):
                ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                assert_bytes_equal(got[0].cpu(), ref.qdata, f"cast-T {cfg} axis={a} {mode} {x.shape} qdata")
                assert_bytes_equal(got[1].cpu(), ref_layout(ref.scale, lay).cpu(),
                                   f"cast-T {cfg} axis={a} {mode} {x.shape} scale")
