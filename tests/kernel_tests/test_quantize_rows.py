"""Rowwise quantize (blocks of 32 along the contiguous dim; :mod:`mxkit.kernels.quantize_details._rows`)
against the reference, byte for byte.

CPU: the kernels run under Triton's interpreter (a subprocess: TRITON_INTERPRET=1 must be set before triton is
imported). The interpreter cannot run inline asm, so the hardware-convert paths (HW_CVT: FP8 cvt, FP4 bf16x2,
FP6 unit asm) fall back to the integer encoder there; their PTX is checked on the CPU by tests/kernel_tests/
test_codecs.py and their bytes by the GPU tests here (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    DEV, FORMAT_NAMES, INPUT_DTYPES, ROUNDINGS, SCALE_MODES, assert_bytes_equal, assert_dequant_equal,
    assert_mx_equal, fp8_tie_blocks, interpreted_rng, rand_tensor, run_interpreted, special_blocks, tie_blocks,
    variant_modes,
)

from mxkit.kernels.quantize import QuantizeConfig as QC
from mxkit.reference import dequantize_reference, quantize_reference


def _check_rows_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`); raises on a mismatch."""
    from mxkit.kernels.quantize import _quantize_impl, quantize_triton
    from mxkit.kernels.quantize_details import _rows

    g = interpreted_rng(_rows._quantize_rows_kernel)
    n = 0
    dts = INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        for j in range(4):
            # every mode on each format; rounding and dtype rotate (the GPU tests run the full matrix)
            mode, rnd, dt = SCALE_MODES[j], ROUNDINGS[(i + j) % 2], dts[(i + j) % 3]
            x = rand_tensor((2, 64), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
            x = torch.cat([x, tie_blocks(fmt, 4, dt, g).reshape(2, 64)])  # (element ties: the rounding shows)
            ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
            assert_mx_equal(quantize_triton(x, fmt, scale_mode=mode, rounding=rnd), ref,
                            what=f"{fmt} {mode} {rnd} {dt}")
            n += 1
        # crafted blocks, fp32 (all special blocks, both roundings)
        x = special_blocks(nonfinite=True)
        rnd = ROUNDINGS[i % 2]
        assert_mx_equal(quantize_triton(x, fmt, rounding=rnd), quantize_reference(x, fmt, rounding=rnd),
                        what=f"{fmt} special blocks {rnd}")
        # programs walking 2 tiles down R (the last span ragged)
        mode, dt = SCALE_MODES[i % 4], dts[i % 3]
        x = rand_tensor((40, 96), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
        q, s = _quantize_impl(x, fmt, -1, mode, rnd, "plain",
                              cfg=QC(block_r=8, block_c=64, num_warps=2, int64=False, rblocks=2))
        ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"rows rblocks=2 {fmt} {mode} qdata")
        assert_bytes_equal(s, ref.scale, f"rows rblocks=2 {fmt} {mode} scale")
        n += 2
        if fmt.startswith("mxfp6"):  # each thread packs whole 3-word groups, ragged last tiles
            for k, dt in enumerate(dts):
                x = rand_tensor((6, 96), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
                m = SCALE_MODES[(i + k) % 4]
                cfg = QC(block_r=4, block_c=64 if k % 2 else 256, num_warps=2, int64=False, rblocks=1 + k % 2,
                         fp6_store4=k == 1)
                q, s = _quantize_impl(x, fmt, -1, m, rnd, "plain", cfg=cfg)
                ref = quantize_reference(x, fmt, scale_mode=m, rounding=rnd)
                assert_bytes_equal(q, ref.qdata, f"fp6 groups {cfg} {fmt} {m} {rnd} {dt} qdata")
                assert_bytes_equal(s, ref.scale, f"fp6 groups {cfg} {fmt} {m} {rnd} {dt} scale")
                n += 1
    # scales written in the swizzled layouts (ragged 40 x 160: partial 128-row and 4-column tiles), every format
    for i, fmt in enumerate(FORMAT_NAMES):
        for j, layout in enumerate(("nvidia_128x4", "aiter_shuffle")):
            mode, rnd, dt = SCALE_MODES[(i + j) % 4], ROUNDINGS[(i + j) % 2], dts[(i + 2 * j) % 3]
            x = rand_tensor((40, 160), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
            assert_mx_equal(quantize_triton(x, fmt, scale_mode=mode, rounding=rnd, scale_layout=layout),
                            quantize_reference(x, fmt, scale_mode=mode, rounding=rnd), layout,
                            what=f"{fmt} {mode} {rnd} {dt} {layout}")
            n += 1
    # the 64-bit offset path, forced on a small problem
    x = rand_tensor((4, 64), -1, generator=g, dtype=torch.bfloat16)
    for fmt in ("mxfp6_e2m3", "mxfp8_e4m3"):
        q, s = _quantize_impl(x, fmt, -1, "floor", "rne", "plain",
                              cfg=QC(block_r=4, block_c=64, num_warps=4, int64=True))
        ref = quantize_reference(x, fmt)
        assert_bytes_equal(q, ref.qdata, f"int64 path {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"int64 path {fmt} scale")
        n += 1
    # a block_size that only equals 32 (32.0) is refused whether or not the problem's checks are cached (a call
    # with block_size=32 cached them, and 32.0 found them: an unchecked MXTensor with a float block size)
    import mxkit

    for warm in (False, True):
        if warm:
            mxkit.quantize(x, "mxfp8", backend="triton")
        with pytest.raises(ValueError, match="block_size"):
            quantize_triton(x, "mxfp8_e4m3", block_size=32.0)
        with pytest.raises(ValueError, match="block_size"):
            mxkit.quantize(x, "mxfp8", block_size=32.0, backend="triton")
        n += 1
    print(f"interpreter checks passed: {n}")


def test_rows_interpreted():
    """Every format x mode, both roundings, every dtype, special blocks, multi-tile programs, FP6 whole groups per
    thread (both word stores) and the 64-bit offsets, run by Triton's CPU interpreter (asserted inside) in a
    subprocess. The interpreter cannot run inline asm: the hardware-convert paths (FP8 cvt with the mask in the
    asm, FP4 bf16x2 and bf16 pairs, the FP6 unit and pairs asm) run on the GPU only (the GPU tests below; their
    PTX is run on the CPU by tests/kernel_tests/test_codecs.py)."""
    run_interpreted(__file__, "_check_rows_interpreted")


def _row_variants(fmt: str) -> list:
    """Rowwise configs beside the production ones: the integer paths on every format; with a hardware-convert
    path (FP8 / FP6 / FP4), the hw_cvt configs (the FP6 unit asm, FP6 and FP4 bf16 pairs, FP8 words)."""
    cfgs = [QC(block_r=16, block_c=256, num_warps=4, int64=False),
            QC(block_r=16, block_c=256, num_warps=4, int64=False, rblocks=4)]
    if fmt.startswith(("mxfp8", "mxfp6", "mxfp4")):
        cfgs += [QC(block_r=16, block_c=256, num_warps=4, int64=False, hw_cvt=True),
                 QC(block_r=16, block_c=256, num_warps=4, int64=False, rblocks=2, hw_cvt=True),
                 # on tiles wider than the 608-element rows (masked)
                 QC(block_r=4, block_c=512, num_warps=2, int64=False, rblocks=4, hw_cvt=True),
                 QC(block_r=2, block_c=1024, num_warps=2, int64=False, rblocks=4, fp4_pairs=True, hw_cvt=True),
                 QC(block_r=4, block_c=512, num_warps=2, int64=False, rblocks=4, fp6_asm=True, hw_cvt=True),
                 QC(block_r=2, block_c=256, num_warps=1, int64=False, fp6_asm=True, hw_cvt=True),
                 QC(block_r=8, block_c=1024, num_warps=8, int64=False, hw_cvt=True),
                 QC(block_r=2, block_c=1024, num_warps=2, int64=False, fp6_pairs=True, fp6_store4=True, hw_cvt=True)]
    return cfgs


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,k", [(f, k) for f in FORMAT_NAMES for k in range(len(_row_variants(f)))])
def test_gpu_row_variants_match_reference(fmt, k, rng, poison):
    """Each rowwise variant config byte-equals the reference: its scale mode(s), both roundings (AWAY falls back
    to the integer path), fp32 / bf16 / fp16 rotating, wide-range random data with special blocks, ragged
    shapes, and with a hardware path crafted ties / saturation / subnormals / fp32 denormals (fp32 and bf16)."""
    from mxkit.kernels.quantize import _quantize_impl

    cfg = _row_variants(fmt)[k]
    hw = fmt.startswith(("mxfp8", "mxfp6", "mxfp4"))
    x = rand_tensor((300, 608), -1, generator=rng, dtype=INPUT_DTYPES[k % 3], nonfinite=True)
    xs = [x] + ([fp8_tie_blocks(fmt), fp8_tie_blocks(fmt).to(torch.bfloat16)] if hw else [])
    for ix, x in enumerate(xs):
        for mode in variant_modes(k + ix):
            for rnd in ROUNDINGS if ix == 0 else ("rne",):
                ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
                q, s = _quantize_impl(x.to(DEV), fmt, -1, mode, rnd, "plain", cfg)
                assert_bytes_equal(q.cpu(), ref.qdata, f"rows {cfg} {mode} {rnd} {x.dtype} qdata")
                assert_bytes_equal(s.cpu(), ref.scale, f"rows {cfg} {mode} {rnd} {x.dtype} scale")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 1])
@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_fp6_words(fmt, k, rng, poison):
    """Rowwise FP6 with whole 16-element groups per thread (either word store) byte-equals the reference:
    fp32 / bf16 / fp16, both roundings, wide-range data with special blocks, ragged tiles."""
    from mxkit.kernels.quantize import _quantize_impl

    cfg = (QC(block_r=8, block_c=256, num_warps=2, int64=False, rblocks=4),
           QC(block_r=16, block_c=256, num_warps=4, int64=False, fp6_store4=True))[k]
    for dt in INPUT_DTYPES:
        x = rand_tensor((300, 608), -1, generator=rng, dtype=dt, nonfinite=True)
        for mode in variant_modes(k):
            for rnd in ROUNDINGS:
                ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
                q, s = _quantize_impl(x.to(DEV), fmt, -1, mode, rnd, "plain", cfg)
                assert_bytes_equal(q.cpu(), ref.qdata, f"rows {cfg} {mode} {rnd} {dt} qdata")
                assert_bytes_equal(s.cpu(), ref.scale, f"rows {cfg} {mode} {rnd} {dt} scale")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_row_tiles_of_padded_rows_match_reference(fmt, rng, poison):
    """Rowwise quantize of rows that 1024-wide tiles would pad by more than 1/8 (narrower tiles, one per program:
    _row_width; also shorter rows, 544 / 768) and of ragged rows that keep them (2880), row counts the tiles do
    not divide (one and two rows too), bf16 (FP6: the pairs path from 1024) and fp32 with NaN / Inf / subnormal
    blocks, two scale modes: the reference's bytes; the references of the bf16 inputs dequantize (2-D tiles, or
    one row per program) to the reference's bits."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    for shape in ((37, 1056), (1, 1056), (5, 1280), (2, 1280), (3, 2, 1536), (9, 2560), (4, 2880), (33, 544),
                  (6, 768)):
        for dt in (torch.bfloat16, torch.float32):
            x = rand_tensor(shape, -1, generator=rng, dtype=dt, nonfinite=True)
            for mode in ("floor", "rceil"):
                ref = quantize_reference(x, fmt, axis=-1, scale_mode=mode)
                assert_mx_equal(quantize_triton(x.to(DEV), fmt, axis=-1, scale_mode=mode), ref,
                                 what=f"rows {fmt} {shape} {dt} {mode}")
                if dt == torch.bfloat16:
                    for out in (torch.bfloat16, torch.float16):
                        assert_dequant_equal(dequantize_triton(ref.to(DEV), out), dequantize_reference(ref, out),
                                              f"dequantize {fmt} {shape} {mode} {out}")
