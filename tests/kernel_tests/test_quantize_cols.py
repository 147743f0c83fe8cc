"""Columnwise quantize (blocks of 32 along a dim other than the last; :mod:`mxkit.kernels.quantize_details._cols`)
against the reference, byte for byte.

CPU: the kernels run under Triton's interpreter (a subprocess). The interpreter cannot run inline asm, so the
hardware-convert column paths (FP8 unit words, FP4 bf16 pairs and bf16x2 codes, the FP6 unit asm) fall back to the
integer encoder there; their PTX is run on the CPU by tests/kernel_tests/test_codecs.py and their bytes are checked by
the GPU tests here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    DEV, FORMAT_NAMES, INPUT_DTYPES, ROUNDINGS, SCALE_MODES, assert_bytes_equal, assert_mx_equal,
    fp8_tie_blocks, interpreted_rng, rand_tensor, ref_layout, run_interpreted, tie_blocks, variant_modes,
)

from mxkit.kernels.quantize import QuantizeConfig as QC
from mxkit.reference import quantize_reference


def _check_cols_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`); raises on a mismatch."""
    from mxkit.kernels.quantize import _quantize_impl, quantize_triton
    from mxkit.kernels.quantize_details import _cols

    g = interpreted_rng(_cols._quantize_cols_kernel)
    n, dts = 0, INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        for j in range(4):
            # every mode on each format, blocks along dim 0; rounding and dtype rotate
            mode, rnd, dt = SCALE_MODES[j], ROUNDINGS[(i + j + 1) % 2], dts[(i + j + 1) % 3]
            x = rand_tensor((64, 3), 0, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
            x = torch.cat([x, tie_blocks(fmt, 6, dt, g).reshape(3, 64).T], dim=1)  # (element ties)
            ref = quantize_reference(x, fmt, axis=0, scale_mode=mode, rounding=rnd)
            assert_mx_equal(quantize_triton(x, fmt, axis=0, scale_mode=mode, rounding=rnd), ref,
                            what=f"{fmt} {mode} {rnd} {dt} axis=0")
            n += 1
        mode, rnd, dt = SCALE_MODES[i % 4], ROUNDINGS[i % 2], dts[i % 3]
        layout = ("plain", "nvidia_128x4", "aiter_shuffle")[i % 3]
        # the column path of each format (FP4: codes packed into words along R before the transpose, col_wide:
        # 64-bit words; the others: whole units per thread from 2-element loads): a batch, ragged R and C tiles, a
        # layout per format, scale_t, the 3-D launch grid, 128-row tiles, 256 x 64 on eight warps (the FP8
        # default from 256 rows; one ragged tile)
        lay = "plain" if i % 3 == 0 else layout
        for k, cfg in enumerate((
                QC(block_r=(64, 32, 128)[i % 3], block_c=(32, 16, 16)[i % 3], num_warps=1 + i % 3 // 2, int64=False,
                   scale_t=i % 2 == 0, col_wide=i != 1),
                QC(block_r=(128, 64, 32, 256)[i % 4], block_c=(64, 16, 32, 64)[i % 4], num_warps=(4, 2, 1, 8)[i % 4],
                   int64=False, scale_t=i % 2 == 1, grid3=i % 3 != 1))):
            x = rand_tensor((2, 160, 40), 1, generator=g, dtype=dts[(i + 1 + k) % 3], nonfinite=True)
            m = ("even", "ceil")[k]
            q, s = _quantize_impl(x, fmt, 1, m, rnd, lay, cfg=cfg)
            ref = quantize_reference(x, fmt, axis=1, scale_mode=m, rounding=rnd)
            assert_bytes_equal(q, ref.qdata, f"cols {cfg} {fmt} qdata")
            assert_bytes_equal(s, ref.scale if lay == "plain" else ref_layout(ref.scale, lay),
                               f"cols {cfg} {fmt} scale")
        # 3-D middle axis, swizzled layout
        x = rand_tensor((3, 32, 5), 1, generator=g, dtype=dt)
        assert_mx_equal(quantize_triton(x, fmt, axis=1, scale_layout="nvidia_128x4"),
                        quantize_reference(x, fmt, axis=1), "nvidia_128x4", what=f"{fmt} 3-D axis 1")
        n += 3
        x = rand_tensor((3, 64, 40), 1, generator=g, dtype=dt)
        ref = quantize_reference(x, fmt, axis=1, scale_mode=mode, rounding=rnd)
        # columnwise scales through a transposed buffer (scale_t), with a batch
        q, s = _quantize_impl(x, fmt, 1, mode, rnd, "plain",
                              cfg=QC(block_r=32, block_c=16, num_warps=1, int64=False, scale_t=True))
        assert_bytes_equal(q, ref.qdata, f"scale_t {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"scale_t {fmt} scale")
        # tiles that divide the problem (the unmasked path) with 64-bit offsets
        x = rand_tensor((128, 64), 0, generator=g, dtype=dts[(i + 2) % 3], nonfinite=True)
        q, s = _quantize_impl(x, fmt, 0, mode, rnd, "plain", cfg=QC(block_r=64, block_c=32, num_warps=2, int64=True))
        ref = quantize_reference(x, fmt, axis=0, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"int64 unmasked {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"int64 unmasked {fmt} scale")
        n += 3
    print(f"interpreter checks passed: {n}")


def test_cols_interpreted():
    """Every format x mode, both roundings, every dtype; the column path of each format on several tiles, scale_t,
    the 3-D launch grid, a middle axis and the swizzled layouts, run by Triton's CPU interpreter in a
    subprocess."""
    run_interpreted(__file__, "_check_cols_interpreted")


def _col_variants(fmt: str) -> list:
    """Columnwise configs beside the production ones, each also run as a cast-transpose (col_units 2: the fused
    kernel; 0: the tile kernel; FP6 split_rows: the one-direction programs)."""
    hw = fmt.startswith(("mxfp8", "mxfp6", "mxfp4"))  # formats with a hardware-convert path
    cfgs = [QC(block_r=32, block_c=64, num_warps=2, int64=False, hw_cvt=hw),
            QC(block_r=64, block_c=32, num_warps=1, int64=False, col_units=2),
            QC(block_r=64, block_c=64, num_warps=2, int64=False, scale_t=True, hw_cvt=hw),
            QC(block_r=128, block_c=64, num_warps=2, int64=False, col_wide=True, hw_cvt=hw, col_units=2),
            QC(block_r=64, block_c=64, num_warps=2, int64=False, col_wide=True, scale_t=True, hw_cvt=hw),
            QC(block_r=128, block_c=64, num_warps=4, int64=False, hw_cvt=hw, fp6_asm=True, grid3=True, col_units=2),
            QC(block_r=256, block_c=64, num_warps=8, int64=False, hw_cvt=hw, col_units=2),
            QC(block_r=32, block_c=128, num_warps=2, int64=False, hw_cvt=hw, scale_t=True, col_units=2),
            QC(block_r=128, block_c=64, num_warps=2, int64=False, col_fp4_words=True, col_wide=True, hw_cvt=hw),
            QC(block_r=32, block_c=64, num_warps=1, int64=False, group_c=2, scale_t=True)]
    if fmt.startswith("mxfp6"):  # the one-direction cast-transpose
        cfgs += [QC(block_r=64, block_c=64, num_warps=2, int64=False, col_units=2, hw_cvt=hw, scale_t=True,
                    split_rows=(2, 128, 4), fp6_asm=True),
                 QC(block_r=32, block_c=64, num_warps=1, int64=False, col_units=2, hw_cvt=hw, split_rows=(1, 128, 8))]
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
@pytest.mark.parametrize("k", [0, 1, 2])
def test_gpu_fp4_units(k, rng, poison):
    """FP4 from bf16 pairs (``quantize_details._cols._cols_fp4_units`` in the fused cast-transpose, with the rows
    from bf16 pairs with the blocks outer; ``_cols_fp4_words`` columnwise): the fused FP4 cast-transpose default
    (64 x 128) and other tiles (32 x 256, 8 warps), columnwise and cast-transpose, on bf16 (the asm paths) and
    fp32 (the per-element fallback of the same config), ragged shapes (masked rows and columns), NaN / Inf / zero
    / subnormal / saturating blocks and the crafted tie blocks; outputs in poisoned memory."""
    from mxkit.kernels.quantize import _cast_transpose_impl, _quantize_impl

    fmt = "mxfp4_e2m1"
    kw = dict(hw_cvt=True, col_units=2, col_fp4_words=True, fp4_pairs=True)
    cfgs = [QC(block_r=64, block_c=128, num_warps=4, int64=False, scale_t=True, **kw),
            QC(block_r=32, block_c=256, num_warps=4, int64=False, col_wide=True, **kw),
            QC(block_r=64, block_c=256, num_warps=8, int64=False, rblocks=2, **kw)]
    ties = fp8_tie_blocks(fmt, multiple=32)  # (a multiple of 32 blocks: the cast-transpose runs too)
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
