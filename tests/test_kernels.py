"""Triton MX quantize / dequantize kernels (mxkit.kernels.quantize) against the reference, byte for byte.

* CPU (CI): the kernels run under Triton's interpreter in a subprocess (TRITON_INTERPRET=1 must be set before
  triton is imported) on small shapes covering every format, scale mode, rounding, dtype, axis kind,
  cast-transpose, the swizzled scale layouts, dequantize and the 64-bit-offset path; plus the int64 guard
  (a pure function of shapes), the fake (meta) implementations of the custom ops and argument errors.
* GPU (``-m gpu``): fresh random data with crafted special blocks, odd shapes, all formats x modes x
  roundings x dtypes x axes; outputs land in memory poisoned with 0xAB first, so an unwritten byte shows.

Run the interpreter checks by hand: ``TRITON_INTERPRET=1 python tests/test_kernels.py --interpret``.
Quick GPU timings: ``python tests/test_kernels.py --timing``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402
    FORMAT_NAMES,
    INPUT_DTYPES,
    ROUNDINGS,
    SCALE_MODES,
    assert_bytes_equal,
    make_generator,
    rand_blocks,
    rand_tensor,
)

from mxkit.reference import dequantize_reference, quantize_reference  # noqa: E402

triton = pytest.importorskip("triton") if __name__ != "__main__" else None
HAS_CUDA = torch.cuda.is_available()


def _q():
    from mxkit.kernels import quantize as kq

    return kq


def _ref_layout(scale: torch.Tensor, layout: str) -> torch.Tensor:
    from mxkit.layouts import to_layout

    return to_layout(scale.reshape(-1, scale.shape[-1]), layout)


def _assert_mx_equal(got, ref, layout: str = "plain", what: str = "") -> None:
    assert got.qdata.shape == ref.qdata.shape, f"{what}: qdata shape {got.qdata.shape} != {ref.qdata.shape}"
    assert_bytes_equal(got.qdata.cpu(), ref.qdata.cpu(), f"{what} qdata")
    exp_scale = ref.scale if layout == "plain" else _ref_layout(ref.scale, layout)
    assert_bytes_equal(got.scale.cpu(), exp_scale.cpu(), f"{what} scale[{layout}]")
    assert got.axis == ref.axis and got.shape == ref.shape and got.scale_layout == layout


def _assert_dequant_equal(got: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Byte equality except NaN payloads (the reference's NaN bits differ between CPU and CUDA)."""
    got, ref = got.cpu(), ref.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    gn, rn = torch.isnan(got), torch.isnan(ref)
    assert torch.equal(gn, rn), f"{what}: NaN positions differ ({int((gn != rn).sum())})"
    assert_bytes_equal(got[~rn], ref[~rn], f"{what} (non-NaN)")


# ---------------------------------------------------------------------------------------------------------
# CPU: interpreter run (subprocess), guard, fakes, errors


def _interpret_checks() -> int:
    """Runs under TRITON_INTERPRET=1 (see __main__). Returns the number of checks; raises on a mismatch."""
    from triton.runtime.interpreter import InterpretedFunction

    from mxkit.kernels import _quantize as K
    from mxkit.kernels.quantize import (DequantizeConfig, QuantizeConfig, _cast_transpose_impl, _dequantize_impl,
                                        _quantize_impl, dequantize_triton, quantize_triton)
    from mxkit.formats import get_format

    def kq_bits(fmt):
        return get_format(fmt).bits

    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert isinstance(K._quantize_kernel, InterpretedFunction), type(K._quantize_kernel)
    assert isinstance(K._dequantize_kernel, InterpretedFunction), type(K._dequantize_kernel)
    g, seed = make_generator(int(os.environ["MXKIT_TEST_SEED"]) if "MXKIT_TEST_SEED" in os.environ else None)
    print(f"interpreter checks, seed={seed}")
    n = 0
    dts = INPUT_DTYPES
    for i, fmt in enumerate(FORMAT_NAMES):
        for j in (i % 4, (i + 2) % 4):
            # two modes per format (each mode on three formats; the GPU tests run the full matrix); rounding,
            # dtype and orientation rotate: rowwise (2 x 64) and columnwise (64 x 3, blocks along dim 0)
            mode = SCALE_MODES[j]
            rnd = ROUNDINGS[(i + j) % 2]
            dt = dts[(i + j) % 3]
            shape, axis = (((2, 64), -1), ((64, 3), 0))[(i + j // 2) % 2]
            x = rand_tensor(shape, axis, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
            ref = quantize_reference(x, fmt, axis=axis, scale_mode=mode, rounding=rnd)
            _assert_mx_equal(quantize_triton(x, fmt, axis=axis, scale_mode=mode, rounding=rnd), ref,
                             what=f"{fmt} {mode} {rnd} {dt} {shape} axis={axis}")
            n += 1
        # crafted blocks, fp32 (all special blocks, both roundings), rowwise
        x = rand_blocks(64, generator=g, dtype=torch.float32, nonfinite=True)
        rnd = ROUNDINGS[i % 2]
        _assert_mx_equal(quantize_triton(x, fmt, rounding=rnd), quantize_reference(x, fmt, rounding=rnd),
                         what=f"{fmt} special blocks {rnd}")
        n += 1
        # cast-transpose, 3-D [B, M, K], one order per format (both appear), a swizzled scale layout
        dt = dts[i % 3]
        x = rand_tensor((2, 32, 64), -1, generator=g, dtype=dt)
        layout = ("plain", "nvidia_128x4", "aiter_shuffle")[i % 3]
        axes = ((-1, -2), (-2, -1))[i % 2]
        outs = quantize_triton(x, fmt, axis=axes, scale_mode="rceil", scale_layout=layout)
        for o, a in zip(outs, axes):
            _assert_mx_equal(o, quantize_reference(x, fmt, axis=a, scale_mode="rceil"), layout,
                             what=f"cast-transpose {fmt} {dt} axes={axes} axis={a}")
            n += 1
        # col_packed (codes packed into words along R before the transpose) on every format (the production
        # path for FP8 / FP4 columns): a batch, ragged R and C tiles, a layout per format, cast-transpose too
        # (128-row tiles: the FP6 columnwise default, whose stores run along (word, unit); one full, one ragged)
        x = rand_tensor((2, 160, 40), 1, generator=g, dtype=dts[(i + 1) % 3], nonfinite=True)
        # (col_wide: 64-bit units for the 8- / 4-bit formats, the FP8 / FP4 columnwise default; e5m2 keeps 32-bit)
        cfg = QuantizeConfig((64, 32, 128)[i % 3], (32, 16, 16)[i % 3], 1 + i % 3 // 2, False, col_packed=True,
                             scale_t=(i % 2 == 0), col_wide=(i != 1))
        lay = "plain" if i % 3 == 0 else layout
        q, s = _quantize_impl(x, fmt, 1, "even", rnd, lay, cfg=cfg)
        ref = quantize_reference(x, fmt, axis=1, scale_mode="even", rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_packed {fmt} qdata")
        assert_bytes_equal(s, ref.scale if lay == "plain" else _ref_layout(ref.scale, lay), f"col_packed {fmt} scale")
        x = rand_tensor((96, 64), -1, generator=g, dtype=dts[i % 3])
        outs = _cast_transpose_impl(x, fmt, "floor", rnd, "plain", cfg=QuantizeConfig(64, 32, 2, False, col_packed=True))
        # and by one-direction programs (split_rows: the FP4 / FP6 default) with either column path, ragged R
        split = QuantizeConfig((32, 64)[i % 2], 32, 1, False, col_packed=(i % 2 == 1), col_direct=(i % 2 == 0),
                               col_wide=True, fp6_words=True, split_rows=((1, 64, 8), (2, 64, 4))[i % 2])
        outs_s = _cast_transpose_impl(x, fmt, "even", rnd, "nvidia_128x4", cfg=split)
        for o, os_, a in zip((outs[:2], outs[2:]), (outs_s[:2], outs_s[2:]), (-1, 0)):
            ref = quantize_reference(x, fmt, axis=a, rounding=rnd)
            assert_bytes_equal(o[0], ref.qdata, f"cast-transpose col_packed {fmt} axis={a} qdata")
            assert_bytes_equal(o[1], ref.scale, f"cast-transpose col_packed {fmt} axis={a} scale")
            ref = quantize_reference(x, fmt, axis=a, scale_mode="even", rounding=rnd)
            assert_bytes_equal(os_[0], ref.qdata, f"cast-transpose split {fmt} axis={a} qdata")
            assert_bytes_equal(os_[1], _ref_layout(ref.scale, "nvidia_128x4"),
                               f"cast-transpose split {fmt} axis={a} scale")
        n += 5
        # col_units (lanes along the columns with 1- / 2-element loads, warps along the blocks, whole units per
        # thread: the FP8 / FP6 / MXINT8 columnwise and FP6 cast-transpose default) on every format: a batch,
        # ragged R and C tiles, scale_t, a layout per format; in the fused and the split cast-transpose too
        x = rand_tensor((2, 160, 40), 1, generator=g, dtype=dts[(i + 2) % 3], nonfinite=True)
        # (256 x 64 on eight warps: the FP8 columnwise default from 256 rows; one ragged tile here)
        cfg = QuantizeConfig((128, 64, 32, 256)[i % 4], (64, 16, 32, 64)[i % 4], (4, 2, 1, 8)[i % 4], False,
                             col_units=1 + i % 2, scale_t=(i % 2 == 1), grid3=(i % 3 != 1))
        q, s = _quantize_impl(x, fmt, 1, "ceil", rnd, lay, cfg=cfg)
        ref = quantize_reference(x, fmt, axis=1, scale_mode="ceil", rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_units {cfg} {fmt} qdata")
        assert_bytes_equal(s, ref.scale if lay == "plain" else _ref_layout(ref.scale, lay), f"col_units {fmt} scale")
        x = rand_tensor((96, 128), -1, generator=g, dtype=dts[(i + 1) % 3], nonfinite=True)
        fused = QuantizeConfig(64, 32, 2, False, col_units=2 - i % 2, fp6_words=True, grid3=(i % 2 == 0))
        split = QuantizeConfig(64, 32, 2, False, col_units=1 + i % 2, fp6_words=True, split_rows=(2, 64, 4))
        for cfg in (fused, split):
            outs = _cast_transpose_impl(x, fmt, "rceil", rnd, lay, cfg=cfg)
            for o, a in zip((outs[:2], outs[2:]), (-1, 0)):
                ref = quantize_reference(x, fmt, axis=a, scale_mode="rceil", rounding=rnd)
                assert_bytes_equal(o[0], ref.qdata, f"cast-transpose {cfg} {fmt} axis={a} qdata")
                assert_bytes_equal(o[1], ref.scale if lay == "plain" else _ref_layout(ref.scale, lay),
                                   f"cast-transpose col_units {fmt} axis={a} scale")
        n += 5
        # 3-D middle axis, swizzled layout on a columnwise output
        x = rand_tensor((3, 32, 5), 1, generator=g, dtype=dt)
        _assert_mx_equal(quantize_triton(x, fmt, axis=1, scale_layout="nvidia_128x4"),
                         quantize_reference(x, fmt, axis=1), "nvidia_128x4", what=f"{fmt} 3-D axis 1")
        n += 1
        # dequantize: random bytes (every code, scale bytes 0 / 254 / 255 included), rowwise + transposed
        for k, (shape, axis) in enumerate([(((3, 64), -1), ((64, 3), 0))[i % 2]]):
            ref_q = quantize_reference(rand_tensor(shape, axis, generator=g), fmt, axis=axis)
            qd = torch.randint(0, 256, ref_q.qdata.shape, generator=g, dtype=torch.uint8)
            sc = torch.randint(0, 256, ref_q.scale.shape, generator=g, dtype=torch.uint8)
            sc.view(-1)[:3] = torch.tensor([0, 254, 255], dtype=torch.uint8)
            q = type(ref_q)(qd, sc, ref_q.fmt, ref_q.axis, 32, ref_q.shape)
            odt = dts[(i + k) % 3]
            _assert_dequant_equal(dequantize_triton(q, odt), dequantize_reference(q, odt),
                                  f"dequantize {fmt} {shape} axis={axis} -> {odt}")
            n += 1
    # the non-default layouts (selected by the config): rowwise 3-D tile, columnwise / cast-transpose that
    # transpose only the codes, 3-D dequantize; hw_cvt is ignored here (inline asm: GPU tests only)
    for i, fmt in enumerate(FORMAT_NAMES):
        mode, rnd, dt = SCALE_MODES[i % 4], ROUNDINGS[i % 2], dts[i % 3]
        x = rand_tensor((8, 96), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
        q, s = _quantize_impl(x, fmt, -1, mode, rnd, "plain", cfg=QuantizeConfig(4, 64, 2, False, 1, row3d=True))
        ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"row3d {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"row3d {fmt} scale")
        x = rand_tensor((64, 40), 0, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
        layout = ("plain", "nvidia_128x4")[i % 2]
        q, s = _quantize_impl(x, fmt, 0, mode, rnd, layout, cfg=QuantizeConfig(32, 32, 2, False, 1 + i % 2,
                                                                               col_direct=True))
        ref = quantize_reference(x, fmt, axis=0, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"col_direct {fmt} qdata")
        assert_bytes_equal(s, ref.scale if layout == "plain" else _ref_layout(ref.scale, layout), f"col_direct {fmt} scale")
        x = rand_tensor((96, 96), -1, generator=g, dtype=dt)  # 3 x 3 tiles: strips of 2 (the last one narrower)
        outs = _cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=QuantizeConfig(32, 32, 1, False, 2, col_direct=True,
                                                                                   group_c=2))
        for o, a in zip((outs[:2], outs[2:]), (-1, 0)):
            ref = quantize_reference(x, fmt, axis=a, scale_mode=mode, rounding=rnd)
            assert_bytes_equal(o[0], ref.qdata, f"cast-transpose col_direct {fmt} axis={a} qdata")
            assert_bytes_equal(o[1], ref.scale, f"cast-transpose col_direct {fmt} axis={a} scale")
        # programs walking 8 / 4 / 2 tiles down R: one 8- or 4-byte scale word per column (plain layout,
        # R a multiple of the span), a batch of 3, a span that does not divide R (bytes, masked), a swizzled
        # layout (bytes), cast-transpose; the column path rotates (col_direct, col_packed, the raw transpose:
        # the packed path stores its own scales, so it takes no scale word)
        for k, (shape, axis, rb, layout) in enumerate((((256, 40), 0, 8, "plain"), ((3, 128, 40), 1, 4, "plain"),
                                                       ((96, 40), 0, 2, "plain"), ((128, 40), 0, 4, "nvidia_128x4"))):
            x = rand_tensor(shape, axis, generator=g, dtype=dt)
            cfg = QuantizeConfig(32, 16, 1, False, col_direct=((i + k) % 3 == 0), col_packed=((i + k) % 3 == 1),
                                 rblocks=rb)
            q, s = _quantize_impl(x, fmt, axis, mode, rnd, layout, cfg=cfg)
            ref = quantize_reference(x, fmt, axis=axis, scale_mode=mode, rounding=rnd)
            assert_bytes_equal(q, ref.qdata, f"rblocks={rb} {fmt} {shape} qdata")
            assert_bytes_equal(s, ref.scale if layout == "plain" else _ref_layout(ref.scale, layout),
                               f"rblocks={rb} {fmt} {shape} scale")
        x = rand_tensor((128, 64), -1, generator=g, dtype=dt)
        outs = _cast_transpose_impl(x, fmt, mode, rnd, "plain",
                                    cfg=QuantizeConfig(32, 32, 1, False, rblocks=4, col_packed=(i % 2 == 1)))
        for o, a in zip((outs[:2], outs[2:]), (-1, 0)):
            ref = quantize_reference(x, fmt, axis=a, scale_mode=mode, rounding=rnd)
            assert_bytes_equal(o[0], ref.qdata, f"cast-transpose rblocks=4 {fmt} axis={a} qdata")
            assert_bytes_equal(o[1], ref.scale, f"cast-transpose rblocks=4 {fmt} axis={a} scale")
        # the scale rule as a constexpr (modes rotate over the formats), rowwise programs walking 2 tiles
        # down R (the last span ragged), cast-transpose
        x = rand_tensor((40, 96), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
        q, s = _quantize_impl(x, fmt, -1, mode, rnd, "plain",
                              cfg=QuantizeConfig(8, 64, 2, False, rblocks=2, mode_const=True))
        ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"mode_const rows rblocks=2 {fmt} {mode} qdata")
        assert_bytes_equal(s, ref.scale, f"mode_const rows rblocks=2 {fmt} {mode} scale")
        x = rand_tensor((64, 96), -1, generator=g, dtype=dt)
        outs = _cast_transpose_impl(x, fmt, mode, rnd, "plain", cfg=QuantizeConfig(32, 32, 1, False, mode_const=True,
                                                                                   col_direct=(i % 2 == 1)))
        for o, a in zip((outs[:2], outs[2:]), (-1, 0)):
            ref = quantize_reference(x, fmt, axis=a, scale_mode=mode, rounding=rnd)
            assert_bytes_equal(o[0], ref.qdata, f"cast-transpose mode_const {fmt} {mode} axis={a} qdata")
            assert_bytes_equal(o[1], ref.scale, f"cast-transpose mode_const {fmt} {mode} axis={a} scale")
        # strip order with a batch dim: [B=3, R=64, C=40] quantized along R
        x = rand_tensor((3, 64, 40), 1, generator=g, dtype=dt)
        q, s = _quantize_impl(x, fmt, 1, mode, rnd, "plain", cfg=QuantizeConfig(32, 16, 1, False, group_c=2))
        ref = quantize_reference(x, fmt, axis=1, scale_mode=mode, rounding=rnd)
        assert_bytes_equal(q, ref.qdata, f"group_c {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"group_c {fmt} scale")
        # columnwise scales through a transposed buffer (scale_t), with a batch
        q, s = _quantize_impl(x, fmt, 1, mode, rnd, "plain", cfg=QuantizeConfig(32, 16, 1, False, col_direct=bool(i % 2),
                                                                                  scale_t=True))
        assert_bytes_equal(q, ref.qdata, f"scale_t {fmt} qdata")
        assert_bytes_equal(s, ref.scale, f"scale_t {fmt} scale")
        n += 11
        if kq_bits(fmt) != 6:
            ref_q = quantize_reference(rand_tensor((6, 96), -1, generator=g), fmt)
            qd = torch.randint(0, 256, ref_q.qdata.shape, generator=g, dtype=torch.uint8)
            sc = torch.randint(0, 256, ref_q.scale.shape, generator=g, dtype=torch.uint8)
            sc.view(-1)[:3] = torch.tensor([0, 254, 255], dtype=torch.uint8)
            q = type(ref_q)(qd, sc, ref_q.fmt, ref_q.axis, 32, ref_q.shape)
            got = _dequantize_impl(qd, sc, fmt, -1, (6, 96), dts[i % 3], cfg=DequantizeConfig(4, 64, 2, False, True))
            _assert_dequant_equal(got, dequantize_reference(q, dts[i % 3]), f"dequantize load3d {fmt}")
            n += 1
        else:  # FP6: each thread packs / unpacks whole 3-word groups (fp6_words), ragged last tiles
            for k, dt in enumerate(dts):
                x = rand_tensor((6, 96), -1, generator=g, dtype=dt, nonfinite=(dt != torch.float16))
                m = SCALE_MODES[(i + k) % 4]
                cfg = QuantizeConfig(4, 64 if k % 2 else 256, 2, False, fp6_words=True, rblocks=1 + k % 2,
                                     mode_const=bool(k % 2))
                q, s = _quantize_impl(x, fmt, -1, m, rnd, "plain", cfg=cfg)
                ref = quantize_reference(x, fmt, scale_mode=m, rounding=rnd)
                assert_bytes_equal(q, ref.qdata, f"fp6_words {fmt} {m} {rnd} {dt} qdata")
                assert_bytes_equal(s, ref.scale, f"fp6_words {fmt} {m} {rnd} {dt} scale")
            ref_q = quantize_reference(rand_tensor((6, 96), -1, generator=g), fmt)
            qd = torch.randint(0, 256, ref_q.qdata.shape, generator=g, dtype=torch.uint8)
            sc = torch.randint(0, 256, ref_q.scale.shape, generator=g, dtype=torch.uint8)
            sc.view(-1)[:3] = torch.tensor([0, 254, 255], dtype=torch.uint8)
            q = type(ref_q)(qd, sc, ref_q.fmt, ref_q.axis, 32, ref_q.shape)
            for k, odt in enumerate(dts):
                got = _dequantize_impl(qd, sc, fmt, -1, (6, 96), odt,
                                       cfg=DequantizeConfig(4, 64 if k % 2 else 32, 2, False, fp6_words=True))
                _assert_dequant_equal(got, dequantize_reference(q, odt), f"dequantize fp6_words {fmt} -> {odt}")
            n += 1
    # the tiled byte transpose behind scale_t, ragged tiles both ways
    from mxkit.kernels.quantize import _transpose_bytes

    for m, nn in ((1, 1), (70, 130), (64, 64), (3, 200)):
        src = torch.randint(0, 256, (m, nn), generator=g, dtype=torch.uint8)
        dst = torch.full((nn, m), 0xAB, dtype=torch.uint8)
        _transpose_bytes(src, dst)
        assert torch.equal(dst, src.t()), (m, nn)
    n += 1
    # the 64-bit offset path and the always-rebuild fp32-denormal path, forced on a small problem (with the 3-D
    # launch grid and with the 1-D one that the kernel splits itself)
    x = rand_tensor((4, 64), -1, generator=g, dtype=torch.bfloat16)
    for grid3 in (True, False):
        q, s = _quantize_impl(x, "mxfp6_e2m3", -1, "floor", "rne", "plain",
                              cfg=QuantizeConfig(4, 64, 4, True, 2, grid3=grid3))
        ref = quantize_reference(x, "mxfp6_e2m3")
        assert_bytes_equal(q, ref.qdata, f"int64 path grid3={grid3} qdata")
        assert_bytes_equal(s, ref.scale, f"int64 path grid3={grid3} scale")
    n += 1
    # the 3-D launch grid (program ids = tile indices) and the 1-D one that the kernel splits: a batched
    # cast-transpose with ragged tiles both ways, every tile index from the one or the other
    x = rand_tensor((3, 96, 160), -1, generator=g, dtype=torch.float32, nonfinite=True)
    for grid3 in (True, False):
        for cfg in (QuantizeConfig(64, 32, 2, False, col_units=2, grid3=grid3),
                    QuantizeConfig(32, 64, 1, False, col_packed=True, rblocks=2, grid3=grid3)):
            outs = _cast_transpose_impl(x, "mxfp8_e4m3", "rceil", "rne", "plain", cfg=cfg)
            for o, a in zip((outs[:2], outs[2:]), (-1, -2)):
                ref = quantize_reference(x, "mxfp8_e4m3", axis=a, scale_mode="rceil")
                assert_bytes_equal(o[0], ref.qdata, f"{cfg} axis={a} qdata")
                assert_bytes_equal(o[1], ref.scale, f"{cfg} axis={a} scale")
    n += 1
    print(f"interpreter checks passed: {n}")
    return n


def test_interpreter_matches_reference():
    """Every format x mode x rounding, rowwise / columnwise / cast-transpose / swizzled scales / dequantize,
    run by Triton's CPU interpreter (asserted inside) in a subprocess."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"), env.get("PYTHONPATH", "")]
    )
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--interpret"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "interpreter checks passed" in r.stdout, r.stdout[-2000:]


def test_int64_guard_is_a_function_of_shapes():
    kq = _q()
    assert not kq.needs_int64(2**31 - 1)
    assert kq.needs_int64(2**31)
    # 2^31 elements on the quantized axis's view, rowwise, columnwise and cast-transpose
    assert kq.quantize_config(1, 2**16, 2**15, True, False, "mxfp4").int64
    assert kq.quantize_config(2, 2**15, 2**15, False, True, "mxfp8").int64
    assert kq.quantize_config(1, 2**16, 2**15, True, True, "mxfp8").int64
    assert not kq.quantize_config(1, 8192, 8192, True, False, "mxfp4").int64
    # tile padding counts: 65535 rows of 32768 fit, but a padded tile grid reaches past 2^31
    assert kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").int64 == (
        -(-65535 // kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").block_r)
        * kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").block_r * 32768 > 2**31 - 1
    )
    # programs walking rblocks tiles down R pad R to block_r * rblocks: 2^31 - 2^15 elements of FP6 in
    # 65535 rows fit, the 32-row span pads past 2^31
    c6 = kq.quantize_config(1, 65535, 32768, True, False, "mxfp6")
    assert c6.rblocks > 1 and c6.int64 and not kq.quantize_config(1, 65535 - 32, 32768, True, False, "mxfp6").int64
    assert kq.dequantize_config(1, 2**16, 2**15, False, "mxfp4").int64
    assert not kq.dequantize_config(4, 1024, 1024, True, "mxfp4").int64


def test_launch_grid_limits():
    """The 3-D launch grid (tile indices straight from the program ids) only where CUDA allows it: dims 1 and
    2 up to 65535, dim 0 up to 2^31 - 1; else the 1-D grid of every tile, which the kernel splits."""
    kq = _q()
    assert kq._grid(256, 64, 1, True) == ((256, 64, 1), True)
    assert kq._grid(2, 65535, 65535, True) == ((2, 65535, 65535), True)
    assert kq._grid(2, 65536, 1, True) == ((2 * 65536,), False)
    assert kq._grid(1, 3, 65536, True) == ((3 * 65536,), False)
    assert kq._grid(2**31, 1, 1, True) == ((2**31,), False)
    assert kq._grid(256, 64, 3, False) == ((256 * 64 * 3,), False)
    # the planned launches: columnwise FP6 of 4 x 4096 x 4096 (128 x 64 tiles: the 3-D grid), of 2^23 x 64 (65536
    # row tiles: 1-D), of 4096^2 (below 2^26 elements: 1-D), columnwise FP8 (1-D)
    plan = kq._quantize_plan((4, 4096, 4096), torch.bfloat16, "mxfp6_e2m3", 1, "floor", "rne", "plain", None)
    assert plan.grid == (64, 32, 4) and dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((2**23, 64), torch.bfloat16, "mxfp6_e2m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (65536,) and not dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((4096, 4096), torch.bfloat16, "mxfp6_e2m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (64 * 32,) and not dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((4096, 4096), torch.bfloat16, "mxfp8_e4m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (64 * 16,) and not dict(plan.consts)["GRID3"]


def test_gpu_tuning_table():
    """GPU_TUNING replaces fields of the default config for its GPU, path, format and size only, re-derives
    int64 for the new tile span, and reaches the launch plan through the device name."""
    kq = _q()
    base = kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1")
    assert kq.GPU_TUNING["NVIDIA H200"][0][3] == {"rblocks": 2} and base.rblocks == 1
    assert kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1", gpu="NVIDIA H200") == dataclasses.replace(
        base, rblocks=2)
    assert kq.quantize_config(1, 8192, 8192, True, True, "mxfp4_e2m1", gpu="NVIDIA H100 80GB HBM3") == base
    assert kq.quantize_config(1, 4096, 4096, True, True, "mxfp4_e2m1", gpu="NVIDIA H200").rblocks == 1  # < 2^26
    for args in ((1, 8192, 8192, True, True, "mxfp8_e4m3"), (1, 8192, 8192, True, False, "mxfp4_e2m1"),
                 (1, 8192, 8192, False, True, "mxfp4_e2m1")):
        assert kq.quantize_config(*args, gpu="NVIDIA H200") == kq.quantize_config(*args)
    # 65472 rows are 1023 tiles of 64 (65472 * 32768 < 2^31 elements), but 512 spans of two tiles pad to 2^31
    assert not kq.quantize_config(1, 65472, 32768, True, True, "mxfp4_e2m1").int64
    assert kq.quantize_config(1, 65472, 32768, True, True, "mxfp4_e2m1", gpu="NVIDIA H200").int64
    plan = kq._quantize_plan((8192, 8192), torch.bfloat16, "mxfp4_e2m1", None, "floor", "rne", "plain", None,
                             "NVIDIA H200")
    assert dict(plan.consts)["RB"] == 2 and plan.grid == (64 * 32,)
    assert kq._gpu_name(torch.zeros(1)) == ""
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):  # the H100's FP8 cast-transpose tile, from 2^26 elements
        assert kq.quantize_config(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H100 PCIe") == \
            kq.quantize_config(1, 8192, 8192, True, True, fmt)  # (measured on the SXM part only)
        base = kq.quantize_config(1, 8192, 8192, True, True, fmt)
        got = kq.quantize_config(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H100 80GB HBM3")
        assert got == dataclasses.replace(base, block_r=64, num_warps=8) and base.block_r == 32
        assert kq.quantize_config(1, 4096, 8192, True, True, fmt, gpu="NVIDIA H100 80GB HBM3") == \
            kq.quantize_config(1, 4096, 8192, True, True, fmt)
        assert kq.quantize_config(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H200") == base
    for fmt in ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"):  # the H100's rowwise FP4 / FP6: one tile per program
        base = kq.quantize_config(1, 16384, 16384, True, False, fmt)
        got = kq.quantize_config(1, 16384, 16384, True, False, fmt, gpu="NVIDIA H100 80GB HBM3")
        assert base.rblocks == (2 if fmt == "mxfp4_e2m1" else 4) and got == dataclasses.replace(base, rblocks=1)
        assert kq.quantize_config(1, 16384, 16384, True, False, fmt, gpu="NVIDIA H200") == base


def test_row_tiles_of_padded_rows():
    """Rows that 1024-wide tiles would pad by more than 1/8 take narrower tiles, one per program (rowwise quantize:
    FP8 8 x 512, FP4 / FP6 as many elements as the 1024-wide tile), and the 2-D tiles (dequantize; FP8 only below
    2048 elements); the others keep the 1024-wide tiles, whose programs walk 2 / 4 tiles down R from 16384 tiles.
    Shorter rows: FP4 / FP6 narrow only where a 256-wide tile pads them less than their tile (544, 640, 768)."""
    kq = _q()
    widths = {1024: 1024, 1056: 256, 1152: 256, 1280: 256, 1536: 512, 2048: 1024, 2080: 256, 2560: 512,
              2880: 1024, 3584: 512, 5760: 1024, 8192: 1024}
    assert {L: kq._row_width(L) for L in widths} == widths
    for L, w in widths.items():
        c8, c4, c6 = (kq.quantize_config(1, 16384, L, True, False, f)
                      for f in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"))
        assert (c8.block_r, c8.block_c, c8.num_warps) == ((8, 1024, 8) if w == 1024 else (8, 512, 4)), L
        assert (c4.block_c, c4.block_r * c4.block_c, c4.num_warps) == (w, 1024, 1), L
        assert (c6.block_c, c6.block_r * c6.block_c, c6.num_warps, c6.fp6_pairs) == (w, 2048, 2, True), L
        assert c4.rblocks == (2 if w == 1024 else 1) and c6.rblocks == (4 if w == 1024 and L > 1024 else 1), L
        d4, d8 = (kq.dequantize_config(1, 16384, L, False, f) for f in ("mxfp4_e2m1", "mxfp8_e4m3"))
        assert (d4.block_n == 1) == (w == 1024) and d4.fp4_asm, L
        assert (d8.block_n == 1) == (w == 1024 or L >= 2048), L
    assert kq.quantize_config(1, 1024, 2048, True, False, "mxfp6_e2m3").rblocks == 1  # (1024 tiles)
    # FP6 from fp32 past 1024 (no bf16 pairs): 4 x 512 tiles, or 8 x 256 where those pad less
    c6 = kq.quantize_config(1, 16384, 1056, True, False, "mxfp6_e2m3", in_bf16=False)
    assert (c6.block_r, c6.block_c, c6.rblocks, c6.fp6_pairs) == (8, 256, 1, False)
    assert kq.quantize_config(1, 16384, 2048, True, False, "mxfp6_e2m3", in_bf16=False).block_c == 512
    # shorter rows, (block_r, block_c, num_warps, rblocks) of FP8 / FP4 / FP6 at 32768 rows
    short = {384: ((16, 256, 4, 1), (4, 512, 2, 1), (4, 512, 2, 1)),  # (256-wide tiles pad 384 as much as 512)
             512: ((16, 256, 4, 1), (4, 512, 2, 1), (4, 512, 2, 1)),
             544: ((16, 256, 4, 1), (4, 256, 1, 1), (8, 256, 2, 1)),
             768: ((16, 256, 4, 1), (4, 256, 1, 1), (8, 256, 2, 1)),
             800: ((16, 256, 4, 1), (2, 1024, 2, 4), (4, 512, 2, 4))}  # (25 blocks: no narrower tile fits better)
    for C, want in short.items():
        got = tuple((c.block_r, c.block_c, c.num_warps, c.rblocks) for c in (
            kq.quantize_config(1, 32768, C, True, False, f) for f in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3")))
        assert got == want, C


def test_configs_are_pure_and_frozen():
    kq = _q()
    a = kq.quantize_config(1, 727, 608, True, False, "mxfp8")
    assert a == kq.quantize_config(1, 727, 608, True, False, "mxfp8")
    with pytest.raises(Exception):
        a.block_r = 1  # frozen dataclass
    for cfg in (a, kq.quantize_config(3, 96, 50, False, True, "mxfp6"), kq.quantize_config(1, 64, 64, True, True, "mxfp4")):
        assert cfg.block_r & (cfg.block_r - 1) == 0 and cfg.block_c & (cfg.block_c - 1) == 0


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_fake_impls_give_reference_shapes(fmt):
    """The register_fake implementations (what torch.compile traces) agree with the reference's shapes."""
    _q()
    ops = torch.ops.mxkit
    for shape, axis in (((6, 64), -1), ((64, 5), 0), ((2, 32, 7), 1)):
        x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
        ref = quantize_reference(torch.zeros(shape), fmt, axis=axis)
        q, s = ops.quantize_mx(x, fmt, axis % len(shape), "floor", "rne", "plain")
        assert q.shape == ref.qdata.shape and s.shape == ref.scale.shape and q.dtype == torch.uint8
        q, s = ops.quantize_mx(x, fmt, axis % len(shape), "floor", "rne", "nvidia_128x4")
        assert s.shape == (128, 4)
        d = ops.dequantize_mx(q, s, fmt, axis % len(shape), list(shape), torch.float16)
        assert d.shape == shape and d.dtype == torch.float16
    x = torch.empty((2, 64, 96), device="meta")
    qr, sr, qc, sc = ops.cast_transpose_mx(x, fmt, "floor", "rne", "plain")
    r0 = quantize_reference(torch.zeros(2, 64, 96), fmt, axis=-1)
    r1 = quantize_reference(torch.zeros(2, 64, 96), fmt, axis=-2)
    assert (qr.shape, sr.shape, qc.shape, sc.shape) == (r0.qdata.shape, r0.scale.shape, r1.qdata.shape, r1.scale.shape)


def _sm90_compile(kernel_name: str, num_warps: int, **constexprs):
    """Compile a kernel for sm_90 without a GPU (Triton's bundled ptxas): catches errors of the compiled
    path that the CPU interpreter never sees (inline asm, early returns, layouts). Returns SASS size."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxkit.kernels import _quantize as K

    fn = getattr(K, kernel_name)
    for prm in fn.params:  # constexpr parameters left out take their defaults
        if prm.is_constexpr and prm.name not in constexprs and prm.default is not inspect.Parameter.empty:
            constexprs[prm.name] = prm.default
    ptr = {"x_ptr": ("*i32", "*i16", "*fp16")[constexprs.get("IN_KIND", 1)], "s_ptr": "*u8",
           "out_ptr": ("*fp32", "*i16", "*fp16")[constexprs.get("OUT_KIND", 1)]}
    sig = {}
    for a in fn.arg_names:
        if a in constexprs:
            sig[a] = "constexpr"
        elif a.endswith("_ptr"):
            words = constexprs.get("BITS") == 6 or constexprs.get("FP4_ASM") or (
                a == "qc_ptr" and (constexprs.get("COL_PACKED") or constexprs.get("COL_UNITS")))
            sig[a] = ptr.get(a, "*i32" if (a.startswith("q") and words) else "*u8")
        else:
            sig[a] = "i32"
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps})
    return len(k.asm["cubin"])


@pytest.mark.parametrize("variant", ["rows_hw_r3d", "cols_hw_cd", "castT_hw", "dequant_load3d", "dequant_hw"])
def test_opt_in_paths_compile_for_sm90(variant):
    """The compiled (non-interpreted) kernels of the opt-in paths build for sm_90 on the CPU; their bytes
    are checked by test_gpu_variants_match_reference (interpreter: test_interpreter_matches_reference)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the interpreter replaces the compiler")
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except Exception:
        pytest.skip("no NVIDIA backend in this Triton")
    from mxkit.formats import get_format
    from mxkit.kernels.quantize import _format_constexprs

    def quant(fmt, do_row, do_col, br, bc, warps, **kw):
        ce = dict(IN_KIND=1, DO_ROW=do_row, DO_COL=do_col, LAYOUT_R=0, LAYOUT_C=1, AWAY=False, BLOCK_R=br,
                  BLOCK_C=bc, INT64=False, DENORM=1, MASKED=True, HW_CVT=False, ROW3D=False,
                  COL_DIRECT=False, **_format_constexprs(get_format(fmt)))
        ce.update(kw)
        return _sm90_compile("_quantize_kernel", warps, **ce)

    if variant == "rows_hw_r3d":
        assert quant("mxfp8_e4m3", True, False, 16, 256, 4, HW_CVT=True, ROW3D=True) > 0
        assert quant("mxfp8_e5m2", True, False, 16, 256, 4, HW_CVT=True, IN_KIND=0) > 0
        assert quant("mxfp6_e2m3", True, False, 16, 256, 4, HW_CVT=True) > 0  # FP6 through the FP8 grid
        assert quant("mxfp6_e3m2", False, True, 32, 64, 1, HW_CVT=True, IN_KIND=2) > 0
        # the default rowwise FP4 / FP6 on large problems: 4 tiles per program, the scale rule as a constexpr
        for mode in range(4):
            assert quant("mxfp4_e2m1", True, False, 16, 256, 4, HW_CVT=True, RB=4, SCALE_MODE=mode) > 0
        assert quant("mxfp6_e2m3", True, False, 8, 256, 2, RB=4, SCALE_MODE=3) > 0
        assert quant("mxfp6_e3m2", True, False, 8, 256, 2, RB=4, SCALE_MODE=1, FP6_WORDS=True) > 0
        # session-6 defaults: rowwise FP6 words through the FP8 cvt, rowwise FP4 pairs (alone and in a
        # cast-transpose), FP6 columns packed with the word-interleaved store
        assert quant("mxfp6_e2m3", True, False, 4, 512, 2, RB=4, SCALE_MODE=2, FP6_WORDS=True, HW_CVT=True) > 0
        assert quant("mxfp4_e2m1", True, False, 2, 1024, 2, HW_CVT=True, RB=4, SCALE_MODE=0, FP4_PAIRS=True) > 0
        assert quant("mxfp4_e2m1", True, True, 64, 64, 2, HW_CVT=True, COL_PACKED=True, FP4_PAIRS=True) > 0
        assert quant("mxfp6_e3m2", False, True, 128, 64, 2, COL_PACKED=True) > 0
        for fmt, kw in (("mxfp4_e2m1", dict(ROW_BR=2, ROW_BC=1024, ROW_RB=4, FP6_WORDS=False, FP4_PAIRS=True,
                                           COL_BR=128, COL_HW=True, COL_PACKED=True, COL_WIDE=True)),
                        ("mxfp6_e2m3", dict(ROW_BR=1, ROW_BC=512, ROW_RB=8, FP6_WORDS=True, FP4_PAIRS=False,
                                           COL_BR=32, COL_HW=False, COL_PACKED=False, COL_WIDE=False)),
                        ("mxfp6_e2m3", dict(ROW_BR=2, ROW_BC=512, ROW_RB=4, FP6_WORDS=True, FP4_PAIRS=False,
                                           COL_BR=64, COL_HW=True, COL_PACKED=False, COL_WIDE=False, COL_UNITS=2,
                                           FP6_ASM=True))):
            # cast-transpose by one-direction programs (the FP4 / FP6 default; FP6 columns: col_units since
            # session 7)
            ce = dict(IN_KIND=1, LAYOUT_R=0, LAYOUT_C=3, AWAY=False, INT64=False, DENORM=0, MASKED=True,
                      SCALE_MODE=1, ROW_HW=True, COL_BC=64, **_format_constexprs(get_format(fmt)), **kw)
            assert _sm90_compile("_cast_transpose_split_kernel", 2 if kw["COL_BR"] > 32 else 1, **ce) > 0
        for fmt, br in (("mxfp8_e4m3", 64), ("mxfp4_e2m1", 128)):  # columnwise FP8 / FP4: 64-bit units
            assert quant(fmt, False, True, br, 64, 2, HW_CVT=True, COL_PACKED=True, COL_WIDE=True, SCALE_MODE=2) > 0
        # the session-7 columnwise defaults: col_units for FP8 (through the cvt), FP6 (the unit asm, both FP6
        # formats, both load widths) and MXINT8; rowwise FP6 through the unit asm
        for fmt, hw, units in (("mxfp8_e4m3", True, 2), ("mxfp6_e3m2", True, 2), ("mxfp6_e2m3", True, 1),
                               ("mxint8", False, 2)):
            assert quant(fmt, False, True, 128, 64, 4, HW_CVT=hw, COL_UNITS=units, SCALE_MODE=0, DENORM=0,
                         FP6_ASM=hw) > 0
        # session 10: FP8 codes made and masked as words (rows: the mask inside the cvt asm; columns: col_packed
        # 32-bit units and col_units), alone and in the fused cast-transpose, E4M3 / E5M2, fp32 / fp16 inputs
        assert quant("mxfp8_e4m3", True, True, 32, 128, 2, HW_CVT=True, COL_PACKED=True, FP8_WORDS=True,
                     SCALE_MODE=0, DENORM=0) > 0
        assert quant("mxfp8_e4m3", True, True, 32, 256, 4, HW_CVT=True, COL_UNITS=2, FP8_WORDS=True, CT_EVICT=1,
                     SCALE_MODE=0, DENORM=0) > 0
        assert quant("mxfp8_e5m2", True, False, 8, 1024, 8, HW_CVT=True, FP8_WORDS=True, IN_KIND=0) > 0
        assert quant("mxfp8_e4m3", False, True, 256, 64, 8, HW_CVT=True, COL_UNITS=2, FP8_WORDS=True, IN_KIND=2,
                     SCALE_MODE=2, DENORM=2) > 0
        for fmt in ("mxfp6_e2m3", "mxfp6_e3m2"):
            assert quant(fmt, True, False, 4, 512, 2, RB=4, SCALE_MODE=0, FP6_WORDS=True, HW_CVT=True,
                         FP6_ASM=True, DENORM=2) > 0
        # session 11: FP4 columns from bf16 pairs in the col_units layout (_cols_fp4_units), the fused FP4
        # cast-transpose default (rows from pairs with the blocks outer, ct_evict), 64-bit units, and columnwise
        for br, bc, w, wide, row in ((64, 128, 4, False, True), (32, 256, 4, True, True), (128, 64, 4, False, False)):
            assert quant("mxfp4_e2m1", row, True, br, bc, w, HW_CVT=True, COL_UNITS=2, COL_FP4W=True, COL_WIDE=wide,
                         FP4_PAIRS=row, CT_EVICT=1, SCALE_MODE=3, DENORM=0) > 0
        # session 12: FP6 from bf16 pairs (rows, columns, the fused and the one-direction cast-transposes), the
        # [groups, rows, 4] row store
        for fmt, row, col, br, bc, w, st4 in (("mxfp6_e2m3", True, False, 4, 512, 2, False),
                                              ("mxfp6_e3m2", False, True, 128, 64, 4, False),
                                              ("mxfp6_e2m3", True, True, 128, 64, 4, True),
                                              ("mxfp6_e3m2", True, True, 64, 128, 4, True)):
            assert quant(fmt, row, col, br, bc, w, HW_CVT=True, COL_UNITS=2 if col else 0, FP6_WORDS=row, FP6_ASM=True,
                         FP6P_R=row, FP6P_C=col, FP6_ST4=st4, CT_EVICT=1 if row and col else 0, SCALE_MODE=1,
                         DENORM=0) > 0
        f6 = get_format("mxfp6_e2m3")
        ce = dict(IN_KIND=1, LAYOUT_R=0, LAYOUT_C=3, AWAY=False, INT64=False, DENORM=0, MASKED=True, SCALE_MODE=0,
                  ROW_HW=True, ROW_BR=2, ROW_BC=512, ROW_RB=4, FP6_WORDS=True, FP4_PAIRS=False, COL_BR=64, COL_BC=64,
                  COL_HW=True, COL_PACKED=False, COL_WIDE=False, COL_UNITS=2, FP6_ASM=True, FP6P_R=True,
                  FP6P_C=True, FP6_ST4=True, **_format_constexprs(f6))
        assert _sm90_compile("_cast_transpose_split_kernel", 2, **ce) > 0
    elif variant == "cols_hw_cd":
        assert quant("mxfp8_e4m3", False, True, 32, 64, 2, HW_CVT=True, COL_DIRECT=True) > 0
        # programs walking 8 / 4 tiles down R with one scale word per column
        assert quant("mxfp8_e4m3", False, True, 32, 64, 1, HW_CVT=True, COL_DIRECT=True, RB=8, SCALE_WORD=True,
                     LAYOUT_C=0) > 0
        assert quant("mxfp4_e2m1", True, True, 32, 64, 2, HW_CVT=True, RB=4, SCALE_WORD=True, LAYOUT_C=0) > 0
    elif variant == "castT_hw":
        assert quant("mxfp8_e4m3", True, True, 32, 32, 1, HW_CVT=True) > 0
    elif variant == "dequant_load3d":
        f = get_format("mxfp4_e2m1")
        assert _sm90_compile("_dequantize_kernel", 4, TRANS=False, OUT_KIND=1, BITS=f.bits, MBITS=f.mbits,
                             EMIN=f.emin, BIAS=f.bias, IS_INT=False, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
                             BLOCK_N=16, BLOCK_L=256, INT64=False, MASKED=True, LOAD3D=True) > 0
    else:  # the hardware FP8 -> fp16 decode (inline asm): e4m3, e5m2 and FP4 through e4m3, both layouts
        for fmt in ("mxfp6_e3m2", "mxfp6_e2m3"):  # FP6 with whole 3-word groups per thread (fp6_words)
            f = get_format(fmt)
            for asm in (False, True):  # (the session-7 default: one group decode asm, bf16 pairs as words)
                assert _sm90_compile("_dequantize_kernel", 4, TRANS=False, OUT_KIND=1, BITS=f.bits, MBITS=f.mbits,
                                     EMIN=f.emin, BIAS=f.bias, IS_INT=False, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
                                     BLOCK_N=16, BLOCK_L=256, INT64=False, MASKED=True, HW_DEC=True, FP6_WORDS=True,
                                     SWAP=asm, GROUP_ASM=asm) > 0
        for name, trans, out in (("mxfp8_e4m3", False, 1), ("mxfp8_e5m2", True, 2), ("mxfp4_e2m1", False, 0),
                                 ("mxfp4_e2m1", True, 1)):
            f = get_format(name)
            assert _sm90_compile("_dequantize_kernel", 4, TRANS=trans, OUT_KIND=out, BITS=f.bits, MBITS=f.mbits,
                                 EMIN=f.emin, BIAS=f.bias, IS_INT=False, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
                                 BLOCK_N=16, BLOCK_L=256, INT64=False, MASKED=True, LOAD3D=not trans,
                                 HW_DEC=True) > 0
        f = get_format("mxfp4_e2m1")  # FP4 -> bf16 by the word decode asm (fp4_asm), masked and not, int64 offsets
        for masked, int64, out in ((True, False, 1), (False, True, 1), (True, False, 2)):  # (2: fp16 output)
            assert _sm90_compile("_dequantize_kernel", 4, TRANS=False, OUT_KIND=out, BITS=f.bits, MBITS=f.mbits,
                                 EMIN=f.emin, BIAS=f.bias, IS_INT=False, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
                                 BLOCK_N=8, BLOCK_L=512, INT64=int64, MASKED=masked, HW_DEC=True, FP4_ASM=True) > 0
        # the one-row tiles of rows >= 1024 (one warp): FP4 words, FP8 load3d
        assert _sm90_compile("_dequantize_kernel", 1, TRANS=False, OUT_KIND=1, BITS=f.bits, MBITS=f.mbits,
                             EMIN=f.emin, BIAS=f.bias, IS_INT=False, HAS_INF=f.has_inf, HAS_NAN=f.has_nan,
                             BLOCK_N=1, BLOCK_L=1024, INT64=False, MASKED=True, HW_DEC=True, FP4_ASM=True) > 0
        f8 = get_format("mxfp8_e4m3")
        assert _sm90_compile("_dequantize_kernel", 1, TRANS=False, OUT_KIND=2, BITS=f8.bits, MBITS=f8.mbits,
                             EMIN=f8.emin, BIAS=f8.bias, IS_INT=False, HAS_INF=f8.has_inf, HAS_NAN=f8.has_nan,
                             BLOCK_N=1, BLOCK_L=1024, INT64=False, MASKED=True, LOAD3D=True, HW_DEC=True) > 0


def test_argument_errors_match_reference():
    kq = _q()
    cases = [
        (torch.zeros(4, 64, dtype=torch.float64), dict(), TypeError),
        (torch.zeros(4, 48), dict(), ValueError),
        (torch.zeros(4, 64), dict(axis=2), ValueError),
        (torch.zeros(0, 64), dict(), ValueError),
        (torch.zeros(4, 64), dict(scale_mode="nearest"), ValueError),
    ]
    for x, kw, exc in cases:
        with pytest.raises(exc) as e_ref:
            quantize_reference(x, "mxfp8", **kw)
        with pytest.raises(exc) as e_k:
            kq.quantize_triton(x, "mxfp8", **kw)
        assert str(e_k.value) == str(e_ref.value)
    with pytest.raises(NotImplementedError, match="block_size"):
        kq.quantize_triton(torch.zeros(4, 64), "mxfp8", block_size=64)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        with pytest.raises(ValueError, match="CUDA"):
            kq.quantize_triton(torch.zeros(4, 64), "mxfp8")
    with pytest.raises(ValueError, match="pair"):
        kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=(0, 1, 1))
    with pytest.raises(ValueError, match="differ"):
        kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=(1, -1))
    # the checks are cached per problem: a bad call raises every time (exceptions are not cached), and an
    # unhashable argument (a list of axes) is checked the same way, uncached
    for _ in range(2):
        with pytest.raises(ValueError, match="multiple"):
            kq.quantize_triton(torch.zeros(4, 48), "mxfp8")
        with pytest.raises(ValueError, match="differ"):
            kq.quantize_triton(torch.zeros(64, 64), "mxfp8", axis=[1, -1])
        with pytest.raises(ValueError, match="multiple"):
            kq.quantize_triton(torch.zeros(48, 64), "mxfp8", axis=[1, 0])


def test_direct_launch_keys_on_every_specialisation(monkeypatch):
    """The direct launch (kernels.quantize._Launcher) reuses a CompiledKernel only for calls with the same
    specialisation: tensor dtype and 16-byte alignment, int == 1 / % 16 / 32-bit range, constexprs and
    num_warps; it passes every argument in signature order (constexpr defaults filled in). Checked on the CPU
    with a stand-in for Triton's JITFunction launch that records what it is given."""
    import triton.language as tl

    kq = _q()
    from mxkit.kernels import _quantize as K

    @triton.jit
    def _probe(x_ptr, n, m, A: tl.constexpr, B: tl.constexpr = 7):
        pass

    jit_calls, direct_calls = [], []

    class Compiled:
        function = object()

        def __getitem__(self, grid):  # Triton's runner reads grid[0], grid[1] and grid[2]
            assert len(grid) == 3
            return lambda *a: direct_calls.append((grid, a))

    def jit_getitem(self, grid):
        def launch(*a, **kw):
            jit_calls.append((grid, a, kw))
            return Compiled()
        return launch

    if not isinstance(_probe, triton.runtime.JITFunction):
        pytest.skip("under the interpreter @triton.jit is not a JITFunction (the direct launch is off there)")
    _probe.__class__ = type("RecordingJIT", (type(_probe),), {"__getitem__": jit_getitem})
    monkeypatch.setattr(K, "_probe", _probe, raising=False)
    monkeypatch.setattr(kq, "_FAST_LAUNCH", True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    launch = kq._Launcher("_probe")
    buf = torch.zeros(64, dtype=torch.uint8)
    aligned = buf[(-buf.data_ptr()) % 16:][:32]
    assert aligned.data_ptr() % 16 == 0
    launch((3,), (aligned, 32, 5), (("A", 1),), 4)
    assert len(jit_calls) == 1 and not direct_calls
    launch((4,), (aligned, 48, 7), (("A", 1),), 4)  # same specialisation (48 % 16 == 0, 7 neither 1 nor % 16)
    assert len(jit_calls) == 1 and direct_calls == [((4, 1, 1), (aligned, 48, 7, 1, 7))]
    variants = [
        ((aligned[1:], 32, 5), (("A", 1),), 4),  # misaligned pointer
        ((aligned.view(torch.int8), 32, 5), (("A", 1),), 4),  # other dtype
        ((aligned, 33, 5), (("A", 1),), 4),  # not % 16
        ((aligned, 32, 1), (("A", 1),), 4),  # == 1
        ((aligned, 32, 2**31), (("A", 1),), 4),  # 64-bit
        ((aligned, 32, 5), (("A", 2),), 4),  # constexpr
        ((aligned, 32, 5), (("A", 1), ("B", 3)), 4),  # constexpr default overridden
        ((aligned, 32, 5), (("A", 1),), 8),  # num_warps
    ]
    for k, (args, consts, warps) in enumerate(variants):
        launch((1,), args, consts, warps)
        assert len(jit_calls) == 2 + k, f"variant {k} reused a kernel of another specialisation"
    launch((1,), (aligned, 32, 5), (("A", 1), ("B", 3)), 4)
    assert direct_calls[-1] == ((1, 1, 1), (aligned, 32, 5, 1, 3))
    monkeypatch.setattr(kq, "_FAST_LAUNCH", False)  # off: Triton's path every time
    launch((1,), (aligned, 32, 5), (("A", 1),), 4)
    assert len(jit_calls) == 2 + len(variants)


# ---------------------------------------------------------------------------------------------------------
# GPU


# Every kernel variant (format x scale mode x rounding x input dtype x orientation x tile) is a separate
# Triton compile of 1-3 s, which dominates the GPU test time. Without MXKIT_GPU_FULL the GPU tests cover every
# format x scale mode x rounding x orientation with the input dtypes and some modes rotated (87 tests);
# MXKIT_GPU_FULL=1 (scripts/gpu_check.sh's default) runs the complete format x mode x rounding x dtype x axis
# matrix (156 tests: about 75 s in gpu_check's 16 processes on an H200 machine, ~10 min in one process).
FULL = os.environ.get("MXKIT_GPU_FULL", "0") == "1"
DEV = os.environ.get("MXKIT_TEST_DEVICE", "cuda")  # "cpu" + TRITON_INTERPRET=1: a dry run of the GPU tests
RUN_GPU = HAS_CUDA or (DEV == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
needs_gpu = pytest.mark.skipif(not RUN_GPU, reason="needs a CUDA GPU")


@pytest.fixture
def poison():
    """Fill (then free) a large chunk of the CUDA caching allocator with 0xAB: outputs allocated with
    torch.empty right after reuse it, so a byte the kernel forgets to write is 0xAB, not a lucky 0."""
    if DEV == "cuda":
        p = torch.full((64 << 20,), 0xAB, dtype=torch.uint8, device="cuda")
        del p
    yield


AXIS_CASES = {  # name: (shape, axis)
    "rows_727x608": ((727, 608), -1),
    "cols_608x727": ((608, 727), 0),
    "cols_320x208": ((320, 208), 0),  # C a multiple of 16: the FP6 unit asm (col_units, ragged column tiles)
    "mid_3x96x50": ((3, 96, 50), 1),
    "one_row": ((1, 4096), -1),
}
_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
if FULL:
    QUANT_CASES = [(r, d) for r in ROUNDINGS for d in _DT]
else:  # both roundings, all three dtypes, every format: (rounding, dtype) pairs rotate with the format
    QUANT_CASES = [("rne", "bfloat16"), ("away", "float32"), ("rne", "float16")]


def _quant_params():
    if FULL:
        return [(f, r, d) for f in FORMAT_NAMES for r, d in QUANT_CASES]
    return [(f, *QUANT_CASES[(i + k) % 3]) for i, f in enumerate(FORMAT_NAMES) for k in range(2)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt,rounding,dtype", _quant_params())
def test_gpu_quantize_matches_reference(fmt, rounding, dtype, rng, poison):
    """Every scale mode on rowwise, columnwise (dim 0), middle-axis and one-row inputs with NaN / Inf /
    zero / denormal / saturating blocks; outputs land in poisoned memory."""
    from mxkit.kernels.quantize import quantize_triton

    # every mode is a compile of its own (the scale rule is a constexpr): outside FULL runs, each case takes
    # two modes, rotating with the format's (rounding, dtype) params so both params cover all four per case
    k = [p[0] for p in _quant_params()].index(fmt) != _quant_params().index((fmt, rounding, dtype))
    for i, (name, (shape, axis)) in enumerate(AXIS_CASES.items()):
        x = rand_tensor(shape, axis, generator=rng, dtype=_DT[dtype], nonfinite=True)
        for mode in SCALE_MODES if FULL else (SCALE_MODES[(i + k) % 4], SCALE_MODES[(i + k + 2) % 4]):
            ref = quantize_reference(x, fmt, axis=axis, scale_mode=mode, rounding=rounding)
            got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_mode=mode, rounding=rounding)
            _assert_mx_equal(got, ref, what=f"{name} {fmt} {mode} {rounding} {dtype}")


@pytest.mark.gpu
@needs_gpu
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
                _assert_mx_equal(o, ref, what=f"cast-transpose {shape} axes={axes} axis={a} {mode} {rounding}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", ["nvidia_128x4", "aiter_shuffle"] if FULL else ["nvidia_128x4"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_swizzled_scale_layout(fmt, layout, rng, poison):
    """Scales written directly in the swizzled layout equal plain + to_layout, pad bytes included (0)."""
    from mxkit.kernels.quantize import quantize_triton

    cases = (((727, 608), -1), ((130, 96), -1), ((256, 128), -1), ((3, 96, 50), 1), ((64, 33), 0))
    for shape, axis in cases if FULL else cases[1:2] + cases[3:4]:
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.bfloat16, nonfinite=True)
        got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_layout=layout)
        _assert_mx_equal(got, quantize_reference(x, fmt, axis=axis), layout, what=f"{layout} {shape} axis={axis}")
    x = rand_tensor((160, 224), -1, generator=rng, dtype=torch.float32)
    for o, a in zip(quantize_triton(x.to(DEV), fmt, axis=(-1, 0), scale_layout=layout), (-1, 0)):
        _assert_mx_equal(o, quantize_reference(x, fmt, axis=a), layout, what=f"cast-transpose {layout} axis={a}")
    if not FULL:  # the other layout on one case
        got = quantize_triton(x.to(DEV), fmt, scale_layout="aiter_shuffle")
        _assert_mx_equal(got, quantize_reference(x, fmt), "aiter_shuffle", what="aiter_shuffle rows")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("out_dtype", list(_DT) if FULL else ["rotate"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_dequantize_matches_reference(fmt, out_dtype, rng, poison):
    """Quantized data and random bytes (every element code with scale bytes 0 / 1 / 254 / 255: products
    below 2^-126 are fp32 denormals) decode like the reference, rowwise and transposed."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    for k, (name, (shape, axis)) in enumerate(AXIS_CASES.items()):
        odt = _DT[out_dtype] if out_dtype in _DT else list(_DT.values())[(FORMAT_NAMES.index(fmt) + k) % 3]
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.float32, nonfinite=True)
        q = quantize_reference(x, fmt, axis=axis, scale_mode="rceil")
        _assert_dequant_equal(dequantize_triton(q.to(DEV), odt), dequantize_reference(q, odt),
                              f"dequantize {name} {fmt} -> {odt}")
        qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
        sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
        sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
        qr = type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)
        _assert_dequant_equal(dequantize_triton(qr.to(DEV), odt), dequantize_reference(qr, odt),
                              f"dequantize random bytes {name} {fmt} -> {odt}")
    # a swizzled-scale MXTensor is converted back first
    x = rand_tensor((130, 96), -1, generator=rng, dtype=torch.bfloat16)
    qn = quantize_triton(x.to(DEV), fmt, scale_layout="nvidia_128x4")
    _assert_dequant_equal(dequantize_triton(qn, torch.bfloat16),
                          dequantize_reference(quantize_reference(x, fmt), torch.bfloat16), "dequantize nvidia_128x4")


def _scale_bytes(shape: tuple, rng) -> torch.Tensor:
    """Random E8M0 scale bytes of ``shape`` holding every byte value 0-255 at random places (as many distinct
    values as there are bytes, when fewer than 256)."""
    sc = torch.randint(0, 256, shape, generator=rng, dtype=torch.uint8)
    flat = sc.view(-1)
    k = min(256, flat.numel())
    flat[torch.randperm(flat.numel(), generator=rng)[:k]] = torch.randperm(256, generator=rng)[:k].to(torch.uint8)
    return sc


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_gpu_fp4_word_decode_matches_reference(out, rng, poison):
    """Rowwise MXFP4 -> bf16 / fp16 through the word decode asm (fp4_asm, the default there): random bytes under
    random scale bytes (all 256 where a case has that many blocks), quantized data, shapes whose rows and row
    lengths the tile does not divide, a 3-D tensor, and qdata views 4 and 2 bytes into their storage (the
    second is copied to an aligned buffer first) give the reference's bits; the tile-dividing case also through
    other tiles; rows of 1024 codes and more (one row per program), also ragged (2880); ragged rows those tiles
    would pad by more than 1/8 (1056, 2080) on the 2-D tiles. (1, 32) has too
    few elements per thread for the asm and checks the fallback. An unwritten output byte would read 0xAB
    (poison)."""
    from mxkit.kernels.quantize import DequantizeConfig, _dequantize_impl, dequantize_config, dequantize_triton
    from mxkit.tensor import MXTensor

    assert dequantize_config(1, 4096, 4096, False, "mxfp4_e2m1").fp4_asm  # (one 1024-element row per program)
    assert dequantize_config(1, 4096, 512, False, "mxfp4_e2m1").fp4_asm  # (a 2-D tile of shorter rows)
    dt = getattr(torch, out)
    for shape in ((727, 608), (64, 8192), (3, 5, 256), (1, 32), (9, 4096), (5, 1056), (2, 3, 2080), (3, 2880)):
        n, L = math.prod(shape[:-1]), shape[-1]
        qd = torch.randint(0, 256, (*shape[:-1], L // 2), generator=rng, dtype=torch.uint8)
        sc = _scale_bytes((*shape[:-1], L // 32), rng)
        q = MXTensor(qd, sc, "mxfp4_e2m1", len(shape) - 1, 32, shape)
        plan = dict(_q()._dequantize_plan("mxfp4_e2m1", len(shape) - 1, shape, dt, None)[5])
        assert plan["FP4_ASM"] == (shape != (1, 32)), shape
        want = dequantize_reference(q, dt)
        _assert_dequant_equal(dequantize_triton(q.to(DEV), dt), want, f"fp4 words {shape}")
        if shape == (64, 8192):
            for cfg in (DequantizeConfig(8, 512, 4, False, hw_dec=True, fp4_asm=True),
                        DequantizeConfig(2, 1024, 2, False, hw_dec=True, fp4_asm=True)):
                got = _dequantize_impl(qd.to(DEV), sc.to(DEV), "mxfp4_e2m1", -1, shape, dt, cfg)
                _assert_dequant_equal(got, want, f"fp4 words {cfg}")
    x = rand_tensor((130, 96), -1, generator=rng, dtype=dt, nonfinite=True)
    q = quantize_reference(x, "mxfp4_e2m1")
    _assert_dequant_equal(dequantize_triton(q.to(DEV), dt), dequantize_reference(q, dt),
                          "fp4 words quantized")
    for off in (4, 2):  # qdata not at the start of its storage
        buf = torch.randint(0, 256, (130 * 48 + off,), generator=rng, dtype=torch.uint8).to(DEV)
        qv = buf[off:].view(130, 48)
        qo = MXTensor(qv, q.scale.to(DEV), "mxfp4_e2m1", 1, 32, (130, 96))
        want = dequantize_reference(MXTensor(qv.cpu(), q.scale, "mxfp4_e2m1", 1, 32, (130, 96)), dt)
        _assert_dequant_equal(dequantize_triton(qo, dt), want, f"fp4 words offset {off}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_gpu_fp8_row_tiles_match_reference(fmt, rng, poison):
    """Rowwise MXFP8 -> bf16 / fp16 on one 1024-element row per program (the default from rows of 1024 codes,
    unless they are ragged and shorter than 2048), also ragged (2080, 2880) and 3-D; 1056 on the 2-D tile; random
    bytes (NaN / Inf codes included) under every scale byte; fp32 output on the 2-D tile of the same shapes."""
    from mxkit.kernels.quantize import dequantize_config, dequantize_triton
    from mxkit.tensor import MXTensor

    assert dequantize_config(1, 64, 8192, False, fmt).block_n == 1
    assert dequantize_config(1, 64, 8192, False, fmt, torch.float32).block_n > 1
    assert dequantize_config(1, 5, 1056, False, fmt).block_n > 1
    assert dequantize_config(1, 3, 2880, False, fmt).block_n == 1
    for shape in ((5, 1056), (2, 3, 2080), (3, 2880), (64, 8192)):
        L = shape[-1]
        qd = torch.randint(0, 256, shape, generator=rng, dtype=torch.uint8)
        sc = _scale_bytes((*shape[:-1], L // 32), rng)
        q = MXTensor(qd, sc, fmt, len(shape) - 1, 32, shape)
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            _assert_dequant_equal(dequantize_triton(q.to(DEV), dt), dequantize_reference(q, dt), f"{fmt} {shape} {dt}")


def _fp8_tie_blocks(fmt: str) -> torch.Tensor:
    """fp32 blocks for the FP8 / FP6 / FP4 element rounding (the hardware-cvt paths): blocks with amax = max_normal * 2^k (every scale mode picks
    the same X) whose other elements are the midpoints between neighbouring FP8 grid values (ties), one
    fp32 ulp above them, and their negatives; blocks whose mantissa exceeds max_normal's (saturation under
    FLOOR); tiny elements (FP8 subnormals / underflow); k spans fp32-denormal to huge; fp32-denormal blocks."""
    from mxkit.formats import decode_elements, get_format

    f = get_format(fmt)
    grid = decode_elements(torch.arange(1 << (f.bits - 1), dtype=torch.uint8), fmt).double()  # codes >= 0
    grid = torch.unique(grid[torch.isfinite(grid)])  # sorted
    mids = ((grid[1:] + grid[:-1]) / 2).float()  # exact in fp32 (a few significant bits)
    up = (mids.view(torch.int32) + 1).view(torch.float32)
    mx = float(grid[-1])
    vals = torch.cat([mids, -mids, up, -up])
    vals = vals[torch.randperm(vals.numel())]
    nb = -(-vals.numel() // 31)
    vals = torch.cat([vals, torch.zeros(nb * 31 - vals.numel())]).reshape(nb, 31)
    ties = torch.cat([torch.full((nb, 1), mx), vals], dim=1)  # amax = max_normal exactly
    sat = torch.tensor([mx * 1.0625, -mx * 1.125, mx * 1.1, -mx, mx * 0.999, 2.0**-12, -(2.0**-11), 3 * 2.0**-12]
                       + [0.0] * 24).reshape(1, 32)
    out = [b * 2.0**k for k in (-120, -60, 0, 40, 100) for b in (ties, sat, -sat)]
    den = torch.randint(-(2**23 - 1), 2**23, (4, 32), dtype=torch.int32)
    out.append((den.abs() | (den < 0).to(torch.int32) << 31).view(torch.float32))
    return torch.cat(out)


def _variant_modes(cfg, k: int) -> tuple:
    """Scale modes a variant config is checked with: all four for the runtime-mode kernels (one compile);
    a config with the scale rule as a constexpr compiles once per mode, so it takes one mode, rotating with
    k (the production configs, all constexpr-mode, get every mode in the tests above)."""
    return SCALE_MODES if (FULL or not cfg.mode_const) else (SCALE_MODES[k % 4],)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt,part", [(f, p) for f in FORMAT_NAMES
                                      for p in ("rows0", "rows1", *(f"cols{i}" for i in range(8)), "dequant")
                                      if not (p == "dequant" and f.startswith("mxfp6"))])  # FP6: test_gpu_fp6_words
def test_gpu_variants_match_reference(fmt, part, rng, poison):
    """The config-selected code paths (hw_cvt: FP8 through the hardware cvt, inline asm the interpreter cannot
    run; row3d; col_direct; dequantize load3d) byte-equal the reference: every scale mode, both roundings
    (AWAY falls back to the integer path), fp32 / bf16 / fp16, wide-range random data with special blocks,
    ragged shapes, and for FP8 crafted ties / saturation / subnormals / fp32 denormals in fp32.
    ``part``: rows configs split in two by index parity, columns (with cast-transpose) in eight by index mod 8
    (in four, the longest part took 207 s of a 360 s test phase), and dequantize, so the GPU test processes
    share the compiles evenly."""
    from mxkit.kernels.quantize import (DequantizeConfig, QuantizeConfig, _cast_transpose_impl,
                                        _dequantize_impl, _quantize_impl)

    QC = QuantizeConfig
    hw = fmt.startswith(("mxfp8", "mxfp6", "mxfp4"))  # formats with a hardware-cvt path (crafted ties below)
    # denorm 1 / 2: the fp32-denormal rebuild paths (branch / always) next to the default multiply; these
    # and row3d / rblocks=4 columns keep the runtime scale mode (all four modes, one compile each). The
    # hardware paths take the scale rule as a constexpr, like the production configs (one compile per mode:
    # one rotating mode each, and RNE only on the crafted tie blocks, whose AWAY runs use the integer path
    # the runtime-mode configs already check). rblocks on rows: programs walking 2 / 4 tiles down R.
    row_cfgs = [QC(16, 256, 4, False, row3d=True), QC(16, 256, 4, False, 1),
                QC(16, 256, 4, False, rblocks=4, mode_const=True)]
    col_cfgs = [QC(32, 64, 2, False, 2, col_direct=True)]
    if hw:
        mc = dict(hw_cvt=True, mode_const=True)
        row_cfgs += [QC(16, 256, 4, False, **mc), QC(16, 256, 4, False, row3d=True, **mc),
                     QC(16, 256, 4, False, rblocks=2, **mc)]
        # the session-6 rowwise defaults (FP6 words through the FP8 cvt; FP4 bf16 pairs, on bf16 at k = 7),
        # on tiles wider than the 608-element rows (masked)
        row_cfgs += [QC(4, 512, 2, False, rblocks=4, fp6_words=True, **mc),
                     QC(2, 1024, 2, False, rblocks=4, fp4_pairs=True, **mc)]
        # session 7: rowwise FP6 through the unit asm (the default), also with fp32-denormal inputs rebuilt
        row_cfgs += [QC(4, 512, 2, False, rblocks=4, fp6_words=True, fp6_asm=True, **mc),
                     QC(2, 256, 1, False, 2, fp6_words=True, fp6_asm=True, **mc)]
        # session 10: FP8 with the bad-block mask inside the cvt asm (fp8_words), also with fp32 denormals rebuilt
        row_cfgs += [QC(8, 1024, 8, False, fp8_words=True, **mc), QC(16, 256, 4, False, 2, fp8_words=True, **mc)]
        col_cfgs += [QC(32, 64, 2, False, group_c=3, **mc), QC(32, 64, 2, False, col_direct=True, **mc),
                     QC(32, 64, 1, False, col_direct=True, rblocks=8, **mc),
                     QC(32, 64, 1, False, col_direct=True, rblocks=4, **mc)]
    # col_packed (the FP8 / FP4 default) on every format, other tiles, runtime mode and scale_t
    col_cfgs += [QC(64, 32, 1, False, col_packed=True), QC(32, 64, 2, False, col_packed=True, group_c=16,
                                                           mode_const=True, hw_cvt=hw)]
    col_cfgs += [QC(64, 64, 2, False, col_packed=True, scale_t=True, mode_const=True, hw_cvt=hw)]
    # 64-bit packed units (col_wide: the FP8 / FP4 columnwise default; ignored for FP6), scale_t and swizzled
    col_cfgs += [QC(128, 64, 2, False, col_packed=True, col_wide=True, mode_const=True, hw_cvt=hw),
                 QC(64, 64, 2, False, col_packed=True, col_wide=True, scale_t=True, mode_const=True, hw_cvt=hw),
                 QC(64, 32, 1, False, col_packed=True, col_wide=True)]
    # cast-transpose by one-direction programs (split_rows, the FP4 / FP6 default): both column paths
    col_cfgs += [QC(128, 64, 2, False, col_packed=True, col_wide=True, fp4_pairs=True, fp6_words=True, hw_cvt=hw,
                    mode_const=True, split_rows=(2, 256, 4)),
                 QC(32, 64, 1, False, col_direct=True, fp6_words=True, fp4_pairs=True, hw_cvt=hw, scale_t=True,
                    split_rows=(1, 128, 8))]
    # col_units (the FP8 / FP6 / MXINT8 columnwise default since session 7, 128 x 64 on four warps; the FP6
    # cast-transpose columns, 64 x 64, by one-direction programs): 1- / 2-element loads, scale_t
    # (fp6_asm: FP6 through the unit asm, the FP6 default with hw_cvt; denorm 2: fp32-denormal inputs rebuilt)
    col_cfgs += [QC(128, 64, 4, False, col_units=2, mode_const=True, hw_cvt=hw, fp6_asm=True),
                 QC(64, 32, 2, False, col_units=1, scale_t=True, mode_const=True, hw_cvt=hw, fp6_asm=True),
                 QC(64, 64, 2, False, col_units=2, fp6_words=True, fp4_pairs=True, hw_cvt=hw, mode_const=True,
                    scale_t=True, split_rows=(2, 128, 4), fp6_asm=True),
                 QC(64, 64, 2, False, 2, col_units=2, hw_cvt=hw, fp6_asm=True)]
    col_cfgs += [QC(32, 64, 1, False, rblocks=4)]  # scale words (plain layout, R a multiple of 128)
    # rblocks on packed tiles (the FP8 / FP4 cast-transpose default tile): no scale word, the packed path stores
    # its own scales (session 9: the scale word had overwritten them)
    col_cfgs += [QC(32, 128, 2, False, col_packed=True, rblocks=4, mode_const=True, hw_cvt=hw)]
    col_cfgs += [QC(32, 64, 1, False, col_direct=True, group_c=16, scale_t=True)]  # scales via a transposed buffer
    # session 10: FP8 unit words straight from the cvt asm (fp8_words) on col_packed 32-bit units (the FP8
    # cast-transpose default) and col_units (the columnwise FP8 default), runtime mode with fp32 denormals rebuilt
    col_cfgs += [QC(32, 128, 2, False, col_packed=True, fp8_words=True, mode_const=True, hw_cvt=hw),
                 QC(256, 64, 8, False, col_units=2, fp8_words=True, mode_const=True, hw_cvt=hw),
                 QC(64, 64, 2, False, 2, col_units=2, fp8_words=True, hw_cvt=hw),
                 QC(32, 64, 1, False, 2, col_packed=True, fp8_words=True, hw_cvt=hw, scale_t=True),
                 # the cast-transpose's eviction hints (ct_evict 1: the FP8 default; 2: the rows' hint only)
                 QC(32, 256, 4, False, col_units=2, fp8_words=True, ct_evict=2, mode_const=True, hw_cvt=hw)]
    if fmt.startswith("mxfp6"):  # cast-transpose with the rows through fp6_words (the columns reload the tile)
        col_cfgs += [QC(32, 32, 1, False, fp6_words=True, group_c=16, mode_const=True),
                     QC(32, 64, 1, False, fp6_words=True, col_direct=True)]
        col_cfgs += [QC(128, 32, 2, False, col_packed=True)]  # 128-row packed tiles, word-interleaved store
    dts = [torch.float32, torch.bfloat16, torch.float16]
    for k, cfg in enumerate(row_cfgs):
        if part != f"rows{k % 2}":
            continue
        dt = dts[k % 3]
        xs = [rand_tensor((300, 608), -1, generator=rng, dtype=dt, nonfinite=True)]
        if hw:
            xs.append(_fp8_tie_blocks(fmt))
            xs.append(xs[-1].to(torch.bfloat16))  # FP4's bf16x2 path takes bf16 inputs only
        for ix, x in enumerate(xs):
            for mode in _variant_modes(cfg, k + ix):
                for rnd in ROUNDINGS if (ix == 0 or not cfg.mode_const) else ("rne",):
                    ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
                    q, s = _quantize_impl(x.to(DEV), fmt, -1, mode, rnd, "plain", cfg)
                    assert_bytes_equal(q.cpu(), ref.qdata, f"rows {cfg} {mode} {rnd} {x.dtype} qdata")
                    assert_bytes_equal(s.cpu(), ref.scale, f"rows {cfg} {mode} {rnd} {x.dtype} scale")
    for k, cfg in enumerate(col_cfgs):
        if part != f"cols{k % 8}":
            continue
        dt = dts[(k + 1) % 3]
        # (col_units: 208 columns, a multiple of 16, so that FP6 takes the unit asm; ragged column tiles either way)
        x = rand_tensor((512 if cfg.rblocks > 1 else 320, 208 if cfg.col_units else 200), 0, generator=rng, dtype=dt,
                        nonfinite=True)
        xt = _fp8_tie_blocks(fmt).T.contiguous() if hw else None
        if xt is not None and k % 2:
            xt = xt.to(torch.bfloat16)
        for mode in _variant_modes(cfg, k):
            for rnd in ROUNDINGS:
                for xx in (x, xt) if (xt is not None and (rnd == "rne" or not cfg.mode_const)) else (x,):
                    ref = quantize_reference(xx, fmt, axis=0, scale_mode=mode, rounding=rnd)
                    lay = "plain" if (cfg.rblocks > 1 or cfg.scale_t) else "nvidia_128x4"  # plain: scale words / scale_t
                    q, s = _quantize_impl(xx.to(DEV), fmt, 0, mode, rnd, lay, cfg)
                    assert_bytes_equal(q.cpu(), ref.qdata, f"cols {cfg} {mode} {rnd} {xx.dtype} qdata")
                    assert_bytes_equal(s.cpu(), _ref_layout(ref.scale, lay).cpu(), f"cols {cfg} {mode} scale")
                # fused cast-transpose with the same config (rows and columns from one tile)
                xc = x[:, :192] if k % 2 else x[:256, :96]
                qr, sr, qc, sc = _cast_transpose_impl(xc.to(DEV), fmt, mode, rnd, "plain", cfg)
                for got, a in (((qr, sr), -1), ((qc, sc), 0)):
                    ref = quantize_reference(xc, fmt, axis=a, scale_mode=mode, rounding=rnd)
                    assert_bytes_equal(got[0].cpu(), ref.qdata, f"cast-T {cfg} axis={a} {mode} {rnd} qdata")
                    assert_bytes_equal(got[1].cpu(), ref.scale, f"cast-T {cfg} axis={a} {mode} {rnd} scale")
    if part == "dequant":
        x = rand_tensor((300, 608), -1, generator=rng, dtype=torch.float32, nonfinite=True)
        q = quantize_reference(x, fmt, scale_mode="rceil")
        qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
        sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
        sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
        DC = DequantizeConfig
        for qq in (q, type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)):
            for odt in dts:
                # integer decode (load3d), hardware FP8 -> fp16 decode (hw_dec) with and without load3d
                # (FP4 to bf16: also the word decode asm on a masked tile)
                for cfg in (DC(16, 256, 4, False, load3d=True), DC(16, 256, 4, False, load3d=True, hw_dec=True),
                            DC(16, 256, 4, False, hw_dec=True),
                            *([DC(16, 512, 4, False, hw_dec=True, fp4_asm=True)] if fmt == "mxfp4_e2m1" else [])):
                    got = _dequantize_impl(qq.qdata.to(DEV), qq.scale.to(DEV), fmt, -1, x.shape, odt, cfg)
                    _assert_dequant_equal(got, dequantize_reference(qq, odt), f"dequantize {cfg} {fmt} -> {odt}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("part", ["quantize0", "quantize1", "dequantize"])  # split for the GPU test processes
@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_fp6_words(fmt, part, rng, poison):
    """The opt-in fp6_words paths (rowwise FP6 quantize / dequantize with whole 16-element groups per thread)
    byte-equal the reference: fp32 / bf16 / fp16, both roundings, wide-range data with special blocks, ragged
    tiles; dequantize of quantized data and of random bytes (every code, scale bytes 0 / 1 / 254 / 255)."""
    from mxkit.kernels.quantize import DequantizeConfig, QuantizeConfig, _dequantize_impl, _quantize_impl

    QC = QuantizeConfig
    dts = [torch.float32, torch.bfloat16, torch.float16]
    for k, cfg in enumerate((QC(8, 256, 2, False, fp6_words=True, rblocks=4, mode_const=True),
                             QC(16, 256, 4, False, fp6_words=True))):
        if part != f"quantize{k}":
            continue
        for dt in dts:
            x = rand_tensor((300, 608), -1, generator=rng, dtype=dt, nonfinite=True)
            for mode in _variant_modes(cfg, k):
                for rnd in ROUNDINGS:
                    ref = quantize_reference(x, fmt, scale_mode=mode, rounding=rnd)
                    q, s = _quantize_impl(x.to(DEV), fmt, -1, mode, rnd, "plain", cfg)
                    assert_bytes_equal(q.cpu(), ref.qdata, f"rows {cfg} {mode} {rnd} {dt} qdata")
                    assert_bytes_equal(s.cpu(), ref.scale, f"rows {cfg} {mode} {rnd} {dt} scale")
    if part != "dequantize":
        return
    DC = DequantizeConfig
    x = rand_tensor((300, 608), -1, generator=rng, dtype=torch.float32, nonfinite=True)
    q = quantize_reference(x, fmt, scale_mode="rceil")
    qd = torch.randint(0, 256, q.qdata.shape, generator=rng, dtype=torch.uint8)
    sc = torch.randint(0, 256, q.scale.shape, generator=rng, dtype=torch.uint8)
    sc.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    for qq in (q, type(q)(qd, sc, q.fmt, q.axis, 32, q.shape)):
        for k, odt in enumerate(dts):
            for cfg in (DC(16, 256, 4, False, hw_dec=True, fp6_words=True), DC(8, 512, 4, False, fp6_words=True),
                        DC(16, 256, 4, False, hw_dec=True, fp6_words=True, pair_swap=True),
                        DC(8, 32, 1, False, fp6_words=True, pair_swap=True),
                        # the group decode asm (bf16 output; other outputs take the per-element path), with and
                        # without the pair swap, and on a tile whose pairs straddle lanes (8 x 32, one warp)
                        DC(4, 512, 2, False, hw_dec=True, fp6_words=True, pair_swap=True, fp6_asm=True),
                        DC(16, 256, 4, False, hw_dec=True, fp6_words=True, fp6_asm=True),
                        DC(8, 32, 1, False, hw_dec=True, fp6_words=True, pair_swap=True, fp6_asm=True)):
                got = _dequantize_impl(qq.qdata.to(DEV), qq.scale.to(DEV), fmt, -1, x.shape, odt, cfg)
                _assert_dequant_equal(got, dequantize_reference(qq, odt), f"dequantize {cfg} {fmt} -> {odt}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2"] if FULL else ["mxfp4_e2m1"])
def test_gpu_large_tiles(fmt, rng):
    """8192 x 8192 bf16 (the benchmark shape, production tile configs) rowwise / columnwise /
    cast-transpose against the reference computed on the GPU (same torch ops as on CPU), and dequantize."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    if DEV != "cuda":
        pytest.skip("8192^2 is too large for the interpreter")
    x = (torch.randn(8192, 8192, generator=rng) * torch.exp2(torch.randint(-30, 30, (8192, 1), generator=rng).float()))
    x = x.to(torch.bfloat16).cuda()
    for axis in (-1, 0):
        ref = quantize_reference(x, fmt, axis=axis)
        got = quantize_triton(x, fmt, axis=axis)
        assert torch.equal(got.qdata, ref.qdata) and torch.equal(got.scale, ref.scale), f"axis={axis}"
        d = dequantize_triton(got, torch.bfloat16)
        assert torch.equal(d.view(torch.int16), dequantize_reference(ref, torch.bfloat16).view(torch.int16))
        del ref, got, d
    rq, cq = quantize_triton(x, fmt, axis=(-1, 0))
    ref = quantize_reference(x, fmt, axis=-1)
    assert torch.equal(rq.qdata, ref.qdata) and torch.equal(rq.scale, ref.scale)
    del ref
    ref = quantize_reference(x, fmt, axis=0)
    assert torch.equal(cq.qdata, ref.qdata) and torch.equal(cq.scale, ref.scale)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"])
def test_gpu_cast_transpose_streams_and_graphs(fmt, rng, poison):
    """The large cast-transposes (2^26 elements and more: the column scales go through the transposed buffer and
    a second launch, scale_t) with a batch (R / 32 = 130: ragged scale-transpose tiles; FP6: a ragged last row
    tile), on fresh data: two calls at once on two side streams, and a CUDA graph captured once and replayed
    twice on new input."""
    from mxkit.kernels import quantize as kq
    from mxkit.kernels.quantize import quantize_triton

    if DEV != "cuda":
        pytest.skip("2^26 elements are too many for the interpreter")
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
@needs_gpu
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
                _assert_mx_equal(quantize_triton(x.to(DEV), fmt, axis=-1, scale_mode=mode), ref,
                                 what=f"rows {fmt} {shape} {dt} {mode}")
                if dt == torch.bfloat16:
                    for out in (torch.bfloat16, torch.float16):
                        _assert_dequant_equal(dequantize_triton(ref.to(DEV), out), dequantize_reference(ref, out),
                                              f"dequantize {fmt} {shape} {mode} {out}")


@pytest.mark.gpu
@needs_gpu
def test_gpu_tuning_entries_match_reference(rng, poison):
    """Every GPU_TUNING entry, whichever GPU runs the test (the launcher applies an entry only on its own GPU and
    from its size on): the entry's fields on the default config of a ragged problem past the entry's size (tiles
    and spans that do not divide it) and of a small one, both scale modes, bf16 with NaN / Inf / subnormal blocks,
    give the reference's bytes in both directions."""
    import dataclasses

    from mxkit.kernels import quantize as kq

    if DEV != "cuda":
        pytest.skip("2^26 elements are too many for the interpreter")
    for prefix, entries in kq.GPU_TUNING.items():
        for path, fmt, least, fields in entries:
            assert path in ("cast_transpose", "rows"), path  # (the paths with entries so far)
            ct = path == "cast_transpose"
            for shape in ((8224, 8224), (3, 320, 544)):
                B, R, C = (1, *shape) if len(shape) == 2 else shape
                assert len(shape) == 3 or B * R * C >= least
                cfg = dataclasses.replace(kq.quantize_config(B, R, C, True, ct, fmt), **fields)
                x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True).to(DEV)
                for mode in ("floor", "rceil"):
                    if ct:
                        qr, sr, qc, sc = kq._cast_transpose_impl(x, fmt, mode, "rne", "plain", cfg)
                        outs = (((qr, sr), -1), ((qc, sc), -2))
                    else:
                        outs = ((kq._quantize_impl(x, fmt, -1, mode, "rne", "plain", cfg), -1),)
                    for (q, s), a in outs:
                        ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                        what = f"{prefix} {fmt} {fields} {shape} {mode} axis={a}"
                        assert_bytes_equal(q, ref.qdata, what + " qdata")
                        assert_bytes_equal(s, ref.scale, what + " scale")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_small_shapes(fmt, rng, poison):
    """Tiny and ragged shapes (also what compute-sanitizer runs: `-k small`)."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    for shape, axis in (((1, 32), -1), ((5, 96), -1), ((32, 7), 0), ((2, 32, 3), 1)):
        x = rand_tensor(shape, axis, generator=rng, dtype=torch.float32, nonfinite=True)
        for layout in ("plain", "nvidia_128x4"):
            got = quantize_triton(x.to(DEV), fmt, axis=axis, scale_mode="even", scale_layout=layout)
            ref = quantize_reference(x, fmt, axis=axis, scale_mode="even")
            _assert_mx_equal(got, ref, layout, what=f"small {shape} axis={axis}")
        _assert_dequant_equal(dequantize_triton(ref.to(DEV), torch.bfloat16), dequantize_reference(ref, torch.bfloat16))
    x = rand_tensor((32, 64), -1, generator=rng, dtype=torch.float16)
    for o, a in zip(quantize_triton(x.to(DEV), fmt, axis=(-1, 0)), (-1, 0)):
        _assert_mx_equal(o, quantize_reference(x, fmt, axis=a), what=f"small cast-transpose axis={a}")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1"] if FULL else ["mxfp4_e2m1"])
def test_gpu_torch_compile_fullgraph(fmt, rng):
    """The custom ops trace under torch.compile(fullgraph=True) and give the eager bytes."""
    _q()  # importing mxkit.kernels.quantize registers the mxkit:: ops

    x = rand_tensor((256, 512), -1, generator=rng, dtype=torch.bfloat16).cuda()

    def raw(t):
        q, s = torch.ops.mxkit.quantize_mx(t * 2, fmt, 1, "rceil", "rne", "plain")
        qr, sr, qc, sc = torch.ops.mxkit.cast_transpose_mx(t, fmt, "floor", "rne", "nvidia_128x4")
        d = torch.ops.mxkit.dequantize_mx(q, s, fmt, 1, list(t.shape), torch.bfloat16)
        return q, s, qr, sr, qc, sc, d + 1

    eager = raw(x)
    compiled = torch.compile(raw, fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_torch_compile_fullgraph_public_api(rng):
    """quantize_triton / dequantize_triton themselves (argument checks, MXTensor) trace without a break."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    fmt = "mxfp4_e2m1"
    x = rand_tensor((256, 512), -1, generator=rng, dtype=torch.bfloat16).cuda()

    def wrapped(t):
        q = quantize_triton(t, fmt, scale_mode="rceil")
        return q.qdata, q.scale, dequantize_triton(q, torch.bfloat16)

    eager = wrapped(x)
    compiled = torch.compile(wrapped, fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ---------------------------------------------------------------------------------------------------------
# quick timings (not a test): python tests/test_kernels.py --timing


def _timing(sweep: bool = True) -> None:
    """Median times (do_bench, L2 flushed) of each path for bf16 8192^2 over a few tile configs, then the
    best config and the default on 16384^2; % of a device-to-device copy measured in the same process."""
    import glob

    import triton.testing as tt

    from mxkit.kernels import quantize as kq

    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {__import__('triton').__version__}")

    def bench(fn):
        return tt.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e-3

    QC, DC = kq.QuantizeConfig, kq.DequantizeConfig
    row_cfgs = [None, QC(8, 256, 4, False), QC(8, 256, 4, False, False), QC(16, 256, 8, False),
                QC(16, 256, 8, False, False), QC(4, 512, 4, False, False), QC(16, 256, 4, False),
                QC(8, 512, 8, False, False), QC(16, 128, 4, False, False), QC(4, 256, 2, False, False)]
    col_cfgs = [None, QC(32, 64, 4, False), QC(32, 64, 4, False, False), QC(32, 128, 4, False, False),
                QC(32, 64, 2, False, False), QC(64, 32, 4, False, False), QC(32, 32, 2, False, False),
                QC(32, 128, 8, False, False), QC(64, 64, 8, False, False), QC(32, 32, 1, False, False)]
    drow_cfgs = [None, DC(16, 256, 4, False), DC(8, 256, 4, False), DC(16, 512, 8, False), DC(8, 512, 8, False),
                 DC(4, 256, 2, False)]
    dcol_cfgs = [None, DC(32, 64, 4, False), DC(64, 32, 4, False), DC(32, 32, 2, False), DC(32, 128, 4, False),
                 DC(128, 32, 8, False), DC(16, 64, 2, False)]

    def paths(x):
        out = {}
        for fmt in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"):
            f = kq.get_format(fmt)
            qb = x.numel() * f.pack_bytes // f.pack + x.numel() // 32
            inb = 2 * x.numel()
            out[f"quant rows {fmt}"] = (lambda c, fmt=fmt: kq._quantize_impl(x, fmt, -1, "floor", "rne", "plain", c), inb + qb, row_cfgs)
            out[f"quant cols {fmt}"] = (lambda c, fmt=fmt: kq._quantize_impl(x, fmt, 0, "floor", "rne", "plain", c), inb + qb, col_cfgs)
            out[f"cast-T {fmt}"] = (lambda c, fmt=fmt: kq._cast_transpose_impl(x, fmt, "floor", "rne", "plain", c), inb + 2 * qb, col_cfgs)
            q, s = kq._quantize_impl(x, fmt, -1, "floor", "rne", "plain")
            out[f"dequant rows {fmt}"] = (lambda c, fmt=fmt, q=q, s=s: kq._dequantize_impl(q, s, fmt, 1, x.shape, torch.bfloat16, c), inb + qb, drow_cfgs)
            qc, sc = kq._quantize_impl(x, fmt, 0, "floor", "rne", "plain")
            out[f"dequant cols {fmt}"] = (lambda c, fmt=fmt, q=qc, s=sc: kq._dequantize_impl(q, s, fmt, 0, x.shape, torch.bfloat16, c), inb + qb, dcol_cfgs)
        return out

    best = {}
    summary = []
    for n in (8192, 16384):
        x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(x)
        t_copy = bench(lambda: dst.copy_(x))
        copy_bw = 2 * x.numel() * 2 / t_copy
        print(f"copy bf16 {n}^2: {t_copy * 1e6:.1f} us {copy_bw / 1e9:.0f} GB/s", flush=True)
        for name, (fn, nbytes, cfgs) in paths(x).items():
            todo = cfgs if (sweep and n == 8192) else [None] + ([best[name][0]] if name in best and best[name][0] else [])
            res = []
            for c in todo:
                try:
                    t = bench(lambda: fn(c))
                except Exception as e:  # a config that does not compile is reported, not fatal
                    print(f"  {name} {c}: {type(e).__name__}", flush=True)
                    continue
                res.append((t, c))
                if n == 8192 and sweep:
                    print(f"  {name:28s} {str(c):90s} {t * 1e6:8.1f} us {100 * nbytes / t / copy_bw:6.1f}%", flush=True)
            t, c = min(res, key=lambda r: r[0])
            t_def = [r for r in res if r[1] is None][0][0]
            if n == 8192:
                best[name] = (c, t)
            summary.append((f"{name} {n}^2", t_def, nbytes / t_def, 100 * nbytes / t_def / copy_bw,
                            t, nbytes / t, 100 * nbytes / t / copy_bw, c))
        del x, dst
        torch.cuda.empty_cache()
    print(f"{'case':34s} {'default us':>10s} {'GB/s':>6s} {'%copy':>6s} | {'best us':>8s} {'GB/s':>6s} {'%copy':>6s} best cfg")
    for name, td, bwd, pd, tb, bwb, pb, c in summary:
        print(f"{name:34s} {td * 1e6:10.1f} {bwd / 1e9:6.0f} {pd:6.1f} | {tb * 1e6:8.1f} {bwb / 1e9:6.0f} {pb:6.1f} {c}")
    ptx = glob.glob(os.path.expanduser("~/.triton/cache/*/*quantize_kernel*.ptx"))
    print(f"# ptx files: {len(ptx)}, with .ftz: {sum('.ftz' in open(p).read() for p in ptx)}")


if __name__ == "__main__":
    if "--interpret" in sys.argv:
        _interpret_checks()
    elif "--timing" in sys.argv:
        _timing(sweep="--no-sweep" not in sys.argv)


def test_dequantize_float64_is_exact_above_fp32_range():
    # FP4 RCEIL of 3e38: scale 2^126, element 4.0 -> 2^128, above fp32 max. The kernels multiply in fp32
    # (Inf), so dequantize_triton hands float64 to the reference, which multiplies in float64.
    from mxkit.kernels.quantize import dequantize_triton

    x = torch.zeros(1, 32)
    x[0, 0] = 3.0e38
    x[0, 1:] = torch.randn(31)
    q = quantize_reference(x, "mxfp4", scale_mode="rceil")
    got = dequantize_triton(q, torch.float64)
    assert got[0, 0].item() == 2.0**128
    assert torch.equal(got.view(torch.uint8), dequantize_reference(q, torch.float64).view(torch.uint8))


# ---------------------------------------------------------------------------------------------------------
# the FP8-grid identities behind the hardware-cvt paths (hw_cvt / hw_dec), checked on the CPU with torch's
# float8 casts standing in for cvt.rn.satfinite / cvt.rn.f16x2.{e4m3,e5m2}x2 (the kernels' bytes are checked
# on the GPU by the gpu tests)


@pytest.mark.parametrize("fmt,f8,shift", [("mxfp6_e2m3", torch.float8_e4m3fn, 6), ("mxfp6_e3m2", torch.float8_e5m2, 12)])
def test_fp6_encode_through_fp8_grid(fmt, f8, shift, rng):
    """FP6 (RNE) = the FP8 cast of clamp(v, +-max_normal) * 2^-shift with the sign moved from bit 7 to bit 5:
    random values over the whole range (sub-grid, ties, above max_normal, signed zeros)."""
    from mxkit.formats import decode_elements, encode_elements, get_format

    f = get_format(fmt)
    grid = decode_elements(torch.arange(64, dtype=torch.uint8), fmt)
    mids = (grid[:-1] + grid[1:]) / 2  # ties (positive half of the table is monotone)
    v = torch.cat([
        torch.randn(50000, generator=rng) * f.max_normal / 2,
        (torch.rand(20000, generator=rng) - 0.5) * 4 * f.max_normal,
        torch.exp2(torch.rand(20000, generator=rng) * 40 - 30) * torch.sign(torch.randn(20000, generator=rng)),
        mids[: len(mids) // 2], -mids[: len(mids) // 2], grid, torch.tensor([0.0, -0.0, 1e-30, -1e-30]),
    ]).to(torch.float32)
    want = encode_elements(v, fmt, "rne")
    b8 = (v.clamp(-f.max_normal, f.max_normal) * 2.0**-shift).to(f8).view(torch.uint8).to(torch.int32)
    got = ((b8 >> 2) & 0x20) | (b8 & 0x1F)
    assert torch.equal(got.to(torch.uint8), want), f"{int((got.to(torch.uint8) != want).sum())} codes differ"


@pytest.mark.parametrize("fmt,f8,shift", [("mxfp4_e2m1", torch.float8_e4m3fn, 6), ("mxfp6_e2m3", torch.float8_e4m3fn, 6),
                                          ("mxfp6_e3m2", torch.float8_e5m2, 12)])
def test_fp4_fp6_decode_through_fp8_grid(fmt, f8, shift):
    """Every FP4 / FP6 code placed in the low bits of an FP8 byte (sign to bit 7) decodes to its value
    times 2^-shift: the hw_dec embedding."""
    from mxkit.formats import decode_elements, get_format

    f = get_format(fmt)
    codes = torch.arange(1 << f.bits, dtype=torch.int32)
    sign = 1 << (f.bits - 1)
    e8 = (((codes & sign) << (8 - f.bits)) | (codes & (sign - 1))).to(torch.uint8)
    if f.bits == 4:
        e8 = (((codes & 7) << 2) | ((codes & 8) << 4)).to(torch.uint8)
    got = e8.view(f8).to(torch.float32) * 2.0**shift
    want = decode_elements(codes.to(torch.uint8), fmt)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def _run_ptx_subset(asm: str, operands: dict) -> dict:
    """A CPU interpreter for the instructions of the FP6 unit asm (``_quantize._fp6_units_asm``), the FP6 pairs
    asm (``_fp6_pairs_asm``), the FP6 group
    decode asm (``_fp6_group_decode_asm``), the FP4 word decode asm (``_fp4_word_decode_asm``), the FP4 encoder
    asm (``_FP4_ELEMENTS_ASM``, ``_FP4_PAIRS_ASM``) and
    the FP8 cvt asm (``_fp8x4_asm``):
    cvt.rn.satfinite.{e4m3,e5m2}x2.f32, cvt.rn.f16x2.{e4m3,e5m2}x2, cvt.f32.f16, cvt.rn.{bf16x2,f16x2}.f32, mul.rn.f32,
    {abs, min, max, min / max.xorsign.abs, mul.rn, add.rn}.bf16x2, mov.b32 (also to / from a b16 pair), mov.b64 from a b32 pair (kept as
    the pair), and / or / shl / shr / sub / add,
    mul.hi / mul.lo / mad.lo / mad.hi .u32, prmt (default mode), shf.r.clamp, lop3. Registers and $n operands are int64
    tensors of bit patterns (one per unit); the float steps use torch's IEEE casts and fp32 arithmetic (RNE,
    subnormals kept; a bf16x2 product or sum is exact in fp32 for the operands these asm blocks see, then
    rounded to bf16 once); the satfinite cvt clamps to the format's max before rounding (= clamping the
    rounded result: rounding is monotone). Returns every register and operand."""
    regs = dict(operands)
    m32 = 0xFFFFFFFF

    def val(tok):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return int(tok[2:], 16) if tok.startswith("0f") else int(tok, 0)  # 0fXXXXXXXX: fp32 bits

    def f32(bits):
        return (bits & m32).to(torch.int32).view(torch.float32) if torch.is_tensor(bits) else \
            torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)

    def bits32(x):
        return x.view(torch.int32).to(torch.int64) & m32

    for ins in asm.strip().strip("{}").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        if op == "mov.b64":  # {lo, hi} -> a (lo, hi) pair of 32-bit tensors (int64 has no room for the top bit)
            d, src = rest.split(",", 1)
            regs[d.strip()] = tuple(regs[t.strip()] for t in src.strip().strip("{}").split(","))
            continue
        if op == "mov.b32" and "{" not in rest:
            d, src = (t.strip() for t in rest.split(","))
            regs[d] = val(src) & m32
            continue
        if op == "mov.b32":
            cut = rest.index("}") + 1 if rest.startswith("{") else rest.index(",")
            d, src = rest[:cut].strip(), rest[cut:].strip().lstrip(",").strip()
            if d.startswith("{"):  # split a 32-bit value into two b16
                lo, hi = (t.strip() for t in d.strip("{}").split(","))
                regs[lo], regs[hi] = regs[src] & 0xFFFF, (regs[src] >> 16) & 0xFFFF
            else:
                lo, hi = (t.strip() for t in src.strip("{}").split(","))
                regs[d] = regs[lo] | (regs[hi] << 16)
            continue
        args = [a.strip() for a in rest.split(",")]
        d = args[0]
        if op.startswith("cvt.rn.f16x2.e"):  # two FP8 bytes (low byte -> low half), exact
            f8 = torch.float8_e4m3fn if ".e4m3x2" in op else torch.float8_e5m2
            b = regs[args[1]]
            h = [(b >> (8 * i) & 0xFF).to(torch.uint8).view(f8).to(torch.float16).view(torch.int16).to(torch.int64)
                 & 0xFFFF for i in (0, 1)]
            regs[d] = h[0] | (h[1] << 16)
            continue
        if op == "cvt.f32.f16":
            regs[d] = bits32(regs[args[1]].to(torch.int16).view(torch.float16).to(torch.float32))
            continue
        if op == "cvt.rn.f16x2.f32":  # the first source lands in the upper half
            hb = [f32(regs[t]).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF for t in args[1:3]]
            regs[d] = hb[1] | (hb[0] << 16)
            continue
        if op == "cvt.rn.bf16x2.f32":  # the first source lands in the upper half
            hb = [bits32(f32(regs[t])).to(torch.int32).view(torch.float32).to(torch.bfloat16).view(torch.int16)
                  .to(torch.int64) & 0xFFFF for t in args[1:3]]
            regs[d] = hb[1] | (hb[0] << 16)
            continue
        if op.endswith(".bf16x2"):  # per 16-bit half: bf16 -> fp32 (exact), the operation, RNE back to bf16
            halves = []
            for h in (0, 1):
                f = [((torch.as_tensor(val(t)) >> (16 * h)) & 0xFFFF).to(torch.int32) << 16 for t in args[1:]]
                f = [t.view(torch.float32) for t in f]
                if op in ("min.xorsign.abs.bf16x2", "max.xorsign.abs.bf16x2"):  # min / max(|a|, |b|), sign a ^ b
                    a_, b_ = f[0].abs(), f[1].abs()  # (a NaN gives the other; explicit: torch's fmin keeps an sNaN)
                    mm = torch.minimum if op.startswith("min") else torch.maximum
                    r = torch.where(torch.isnan(a_), b_, torch.where(torch.isnan(b_), a_, mm(a_, b_)))
                    sgn = (f[0].view(torch.int32) ^ f[1].view(torch.int32)) & -2147483648
                    r = ((r.view(torch.int32) & 0x7FFFFFFF) | sgn).view(torch.float32)
                elif op == "abs.bf16x2":
                    r = f[0].abs()
                elif op == "min.bf16x2":  # a NaN operand gives the other one
                    r = torch.fmin(f[0], f[1])
                elif op == "max.bf16x2":
                    r = torch.fmax(f[0], f[1])
                elif op == "mul.rn.bf16x2":
                    r = f[0] * f[1]
                elif op == "add.rn.bf16x2":
                    r = f[0] + f[1]
                else:
                    raise AssertionError(f"instruction not in the subset: {ins}")
                halves.append(r.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF)
            regs[d] = halves[0] | (halves[1] << 16)
            continue
        if op == "prmt.b32":  # default mode: selector nibble i picks byte i of d from {a, b} (bit 3: sign fill)
            a, b, sel = val(args[1]), val(args[2]), val(args[3])
            r = 0
            for i in range(4):
                nib = (sel >> (4 * i)) & 0xF
                byte = ((a if nib & 7 < 4 else b) >> (8 * (nib & 3))) & 0xFF
                if nib & 8:
                    byte = ((byte >> 7) & 1) * 0xFF
                r = r | (byte << (8 * i))
            regs[d] = r & m32
            continue
        if op == "mul.rn.f32":
            regs[d] = bits32(f32(val(args[1])) * f32(val(args[2])))
            continue
        if op == "shf.r.clamp.b32":
            regs[d] = (((val(args[2]) << 32) | val(args[1])) >> val(args[3])) & m32
            continue
        if op.startswith("cvt.rn.satfinite."):
            f8, mx = (torch.float8_e4m3fn, 448.0) if ".e4m3x2." in op else (torch.float8_e5m2, 57344.0)

            def byte(tok):
                v = (regs[tok] & m32).to(torch.int32).view(torch.float32).clamp(-mx, mx)
                return v.to(f8).view(torch.uint8).to(torch.int64)
            regs[d] = byte(args[2]) | (byte(args[1]) << 8)  # the first source lands in the upper byte
            continue
        a = [val(t) for t in args[1:]]
        if op == "and.b32":
            r = a[0] & a[1]
        elif op == "or.b32":
            r = a[0] | a[1]
        elif op == "shl.b32":
            r = a[0] << a[1]
        elif op == "shr.u32":
            r = a[0] >> a[1]
        elif op == "sub.u32":
            r = a[0] - a[1]
        elif op == "add.u32":
            r = a[0] + a[1]
        elif op in ("mul.hi.u32", "mad.hi.u32"):  # the 64-bit product's high word, in int64 without overflow
            lo = (a[0] & 0xFFFF) * a[1]
            r = ((((a[0] >> 16) * a[1]) + (lo >> 16)) >> 16) + (a[2] if op == "mad.hi.u32" else 0)
        elif op == "mul.lo.u32":
            r = a[0] * (a[1] & 0xFFFF) + ((a[0] * (a[1] >> 16)) << 16)
        elif op == "mad.lo.u32":
            r = a[0] * (a[1] & 0xFFFF) + ((a[0] * (a[1] >> 16)) << 16) + a[2]
        elif op == "lop3.b32":
            lut = a[3]
            r = torch.zeros_like(a[0] if torch.is_tensor(a[0]) else a[1])
            for bit in range(8):  # bit (a, b, c) of the LUT: index 4a + 2b + c with a = 0xF0, b = 0xCC, c = 0xAA
                if (lut >> bit) & 1:
                    ta = a[0] if bit & 4 else ~a[0]
                    tb = a[1] if bit & 2 else ~a[1]
                    tc = a[2] if bit & 1 else ~a[2]
                    r = r | (ta & tb & tc)
        else:
            raise AssertionError(f"instruction not in the subset: {ins}")
        regs[d] = r & m32
    return regs


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
@pytest.mark.parametrize("vec,n_out", [(1, 16), (2, 32), (1, 8)])
def test_fp6_unit_asm_matches_encode(fmt, vec, n_out):
    """The FP6 unit asm (``_quantize._fp6_units_asm``, inline PTX: GPU only), run instruction by instruction
    on the CPU: for units of scaled elements v * 2^-6 / 2^-12 (every FP6 grid value and every tie between
    neighbours, both signs and signed zeros, fp32-subnormal, saturating and random values), the three words
    of each unit equal the reference's packed FP6 bytes (:func:`mxkit.formats.encode_elements`, RNE, then
    :func:`mxkit.reference.pack_codes`)."""
    from mxkit.formats import decode_elements, encode_elements, get_format
    from mxkit.kernels._quantize import _fp6_units_asm
    from mxkit.reference import pack_codes

    f = get_format(fmt)
    g = torch.Generator().manual_seed(7)
    grid = decode_elements(torch.arange(1 << (f.bits - 1), dtype=torch.uint8), fmt)  # non-negative grid
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([grid, mids, torch.tensor([0.0, 2.0**-130, 1e-30, f.max_normal * 1.03, f.max_normal * 2,
                                                  3.0e38, f.max_normal + (grid[-1] - grid[-2]) / 2])])
    rnd = torch.exp2(torch.empty(4096).uniform_(-12, 6, generator=g)) * torch.empty(4096).uniform_(1, 2, generator=g)
    vals = torch.cat([vals, rnd])
    vals = torch.where(torch.rand(vals.shape, generator=g) < 0.5, -vals, vals)
    n_units = -(-vals.numel() // 16) * vec
    x = vals.repeat(-(-16 * n_units // vals.numel()))[: 16 * n_units]
    x = x[torch.randperm(x.numel(), generator=g)].reshape(n_units // vec, vec, 16)  # [asm calls, unit v, j]
    shift = 6 if f.mbits == 3 else 12
    vbits = (x * 2.0**-shift).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # exact power-of-two scaling
    ops = {f"${n_out + v + vec * j}": vbits[:, v, j] for v in range(vec) for j in range(16)}
    regs = _run_ptx_subset(_fp6_units_asm(f.mbits, vec, n_out), ops)
    want = pack_codes(encode_elements(x, fmt), fmt).reshape(n_units // vec, vec, 3, 4)
    want = (want.to(torch.int64) << (8 * torch.arange(4))).sum(-1)  # little-endian words
    for v in range(vec):
        for k in range(3):
            assert torch.equal(regs[f"${v + vec * k}"], want[:, v, k]), f"{fmt} vec={vec} unit {v} word {k}"


def _fp6_pairs_operands(X, f):
    """The per-block operands of the FP6 pairs asm for block exponents X (int64 tensor): the fp32 bits of the
    factor 2^(-X-6) (E2M3) / 2^(-X-12) (E3M2), subnormal where needed, and the bf16 bits of the clamp
    max_normal * 2^X (+Inf where that overflows bf16), as the kernels compute them (_fp6_pairs_factor)."""
    from mxkit.kernels.quantize import _max_frac

    e = 127 - X - (6 if f.mbits == 3 else 12)
    fac = torch.where(e > 0, e.clamp(min=1) << 23, 1 << (22 + e).clamp(min=0))
    t = X + f.emax + 127
    clamp = torch.where(t < 255, (t << 7) | (_max_frac(f) >> 16), 0x7F80)
    return fac, clamp


def _fp6_codes_of_words(words):
    """[..., 3] little-endian FP6 words (int64, 32 bits each) -> [..., 16] codes (code i at bit 6i)."""
    out = []
    for i in range(16):
        k, b = divmod(6 * i, 32)
        c = words[..., k] >> b
        if b > 26:  # the code straddles two words
            c = c | (words[..., k + 1] << (32 - b))
        out.append(c & 0x3F)
    return torch.stack(out, -1)


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
@pytest.mark.parametrize("cols", [False, True])
def test_fp6_pairs_asm_every_bf16_every_scale(fmt, cols):
    """The FP6 pairs asm (``_quantize._fp6_pairs_asm``: FP6 straight from bf16 pairs, inline PTX: GPU only), run
    instruction by instruction on the CPU: every bf16 bit pattern under every block exponent X in [-127, 126]
    (rows: a group of 16 elements of one block; columns: the two halves of each word in two columns with
    their own X), each finite element's code equals :func:`mxkit.formats.encode_elements` of the exact
    x * 2^-X (RNE, saturating; -0 and negatives rounding to 0 keep the sign). A unit holding NaN / Inf is a
    bad block, zeroed by its keep mask (checked too); in the column asm a NaN / Inf in one column's halves
    leaves the other column's unit alone."""
    from mxkit.formats import encode_elements, get_format
    from mxkit.kernels._quantize import _fp6_pairs_asm

    f = get_format(fmt)
    asm = _fp6_pairs_asm(f.mbits, cols)
    xs = torch.arange(1 << 16, dtype=torch.int64)
    g = torch.Generator().manual_seed(13)
    Xs = torch.arange(-127, 127, dtype=torch.int64)
    n_el = 32 if cols else 16
    for Xc in Xs[torch.randperm(Xs.numel(), generator=g)].split(16):
        n = xs.numel() // n_el * n_el
        x = torch.stack([xs[torch.randperm(xs.numel(), generator=g)[:n]] for _ in Xc])  # [len(Xc), n]
        x = x.reshape(-1, n_el // 2, 2)  # [units, word (columns: row j), half]
        # rows: one X per unit; columns: the even and odd column of each unit get different X
        Xe = Xc.repeat_interleave(n // n_el)
        Xo = Xe[torch.randperm(Xe.numel(), generator=g)] if cols else Xe
        keep = torch.where(torch.rand(Xe.shape, generator=g) < 0.1, 0, 0xFFFFFFFF)
        fe, ce = _fp6_pairs_operands(Xe, f)
        fo, co = _fp6_pairs_operands(Xo, f)
        words = x[..., 0] | (x[..., 1] << 16)  # [units, 16]
        if cols:
            ops = {f"${6 + j}": words[:, j] for j in range(16)}
            ops.update({"$22": fe, "$23": fo, "$24": ce | (co << 16), "$25": keep, "$26": 0xFFFFFFFF - keep})
            regs = _run_ptx_subset(asm, ops)
            units = [(x[..., 0], Xe, keep, [regs[f"${k}"] for k in range(3)]),
                     (x[..., 1], Xo, 0xFFFFFFFF - keep, [regs[f"${3 + k}"] for k in range(3)])]
        else:
            # rows: 16 elements of one block in 8 words, word i holding elements 2i, 2i + 1
            w8 = x.reshape(-1, 16)
            ops = {f"${3 + i}": words[:, i] for i in range(8)}
            ops.update({"$11": fe, "$12": ce | (ce << 16), "$13": keep})
            regs = _run_ptx_subset(asm, ops)
            units = [(w8, Xe, keep, [regs[f"${k}"] for k in range(3)])]
        for el, X, kp, out in units:
            got = _fp6_codes_of_words(torch.stack(out, -1))
            v = (el.to(torch.int32) << 16).view(torch.float32) * ((127 - X.to(torch.int32)) << 23).view(torch.float32)[:, None]
            want = encode_elements(v, fmt, "rne").to(torch.int64)
            # a unit holding NaN / Inf is one bad block (masked by its keep word in the kernels): compare the rest
            fin = _finite16(el).all(1, keepdim=True).expand_as(got)
            kept = (kp != 0)[:, None].expand_as(got)
            bad = (got != want) & fin & kept
            assert not bad.any(), (f"{fmt} cols={cols}: {int(bad.sum())} codes differ, first x=0x{int(el[bad][0]):04x} "
                                   f"X={int(X[:, None].expand_as(el)[bad][0])}: {int(got[bad][0])} vs {int(want[bad][0])}")
            assert not got[~kept].any(), "a masked unit must be 0"


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_fp6_group_decode_asm_matches_reference(fmt):
    """The FP6 group decode asm (``_quantize._fp6_group_decode_asm``, inline PTX: GPU only), run instruction
    by instruction on the CPU: random 96-bit groups (every code in every position) with scale bytes over the
    whole E8M0 range (0, 1, 127, 254, 255 included) give the reference's bf16 bits (NaN positions for s = 255,
    fp32-subnormal products included: one fp32 rounding, then bf16 RNE)."""
    from mxkit.formats import get_format
    from mxkit.kernels._quantize import _fp6_group_decode_asm
    from mxkit.tensor import MXTensor

    f = get_format(fmt)
    g = torch.Generator().manual_seed(11)
    n = 4096
    q = torch.randint(0, 256, (n, 12), generator=g, dtype=torch.uint8)  # one 16-element group per row
    sb = torch.randint(0, 256, (n, 1), generator=g, dtype=torch.uint8)
    sb[:5, 0] = torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8)
    # (a block is two groups: the reference decodes the group twice under the row's scale byte)
    want = dequantize_reference(MXTensor(torch.cat([q, q], 1), sb, fmt, 1, 32, (n, 32)), torch.bfloat16)[:, :16]
    words = q.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [n, 3] little-endian
    s = sb[:, 0].to(torch.int64)
    fac = torch.where(s == 0, 0x00400000, torch.where(s == 255, 0x7FC00000, s << 23))
    regs = _run_ptx_subset(_fp6_group_decode_asm(f.mbits),
                           {"$8": words[:, 0], "$9": words[:, 1], "$10": words[:, 2], "$11": fac})
    got = torch.stack([(regs[f"${i}"] >> (16 * h)) & 0xFFFF for i in range(8) for h in (0, 1)], 1)
    got = got.to(torch.int16).view(torch.bfloat16)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), fmt
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok].view(torch.int16), want[ok].view(torch.int16)), fmt


@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_fp4_word_decode_asm_matches_reference(out):
    """The FP4 word decode asm (``_quantize._fp4_word_decode_asm``, inline PTX: GPU only), run instruction by
    instruction on the CPU: every byte (two E2M1 codes) in every byte position of a word under every scale byte
    0-255 (products from 2^-128, bf16-subnormal, to beyond bf16 max, which round to Inf; in fp16 from zero
    through fp16 subnormals and ties to Inf), and random words, give the reference's bf16 / fp16 bits (NaN
    positions for s = 255). Limits: the factor bits are built here as the kernel builds them (a change there shows
    on the GPU only), and the interpreter keeps subnormals in ``mul.rn.bf16x2`` as PTX specifies (a hardware
    flush would show on the GPU: its tests include codes 0.5 and scale byte 0)."""
    from mxkit.kernels._quantize import _fp4_word_decode_asm
    from mxkit.tensor import MXTensor

    g = torch.Generator().manual_seed(13)
    b = torch.arange(256, dtype=torch.int64)
    rnd = torch.randint(0, 1 << 32, (4096,), generator=g, dtype=torch.int64)
    # each byte value in each position (the other bytes cycle through other values), under every scale
    words = torch.cat([b | ((b + 37) % 256) << 8 | ((b + 101) % 256) << 16 | ((b + 199) % 256) << 24,
                       b << 8 | b << 24, b << 16, rnd[:256]])
    words = words.repeat_interleave(256)
    s = torch.arange(256, dtype=torch.int64).repeat(words.numel() // 256)
    words, s = torch.cat([words, rnd]), torch.cat([s, torch.randint(0, 256, (rnd.numel(),), generator=g)])
    n = words.numel()
    q = torch.zeros(n, 16, dtype=torch.uint8)  # one 32-code block per row: the word, then 12 zero bytes
    q[:, :4] = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], 1).to(torch.uint8)
    dt = getattr(torch, out)
    want = dequantize_reference(MXTensor(q, s.to(torch.uint8)[:, None], "mxfp4_e2m1", 1, 32, (n, 32)), dt)[:, :8]
    f16 = torch.where(s == 0, 0x0040, torch.where(s == 255, 0x7FC0, s << 7))
    regs = _run_ptx_subset(_fp4_word_decode_asm(out == "float16"), {"$4": words, "$5": f16 | (f16 << 16)})
    got = torch.stack([(regs[f"${i}"] >> (16 * h)) & 0xFFFF for i in range(4) for h in (0, 1)], 1)
    got = got.to(torch.int16).view(dt)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    expo = 0x7F80 if out == "bfloat16" else 0x7C00
    assert bool(torch.isinf(want[ok]).any()) and bool((want[ok].view(torch.int16) & expo == 0).logical_and(
        want[ok] != 0).any()), "the cases must reach Inf and subnormals"
    assert torch.equal(got[ok].view(torch.int16), want[ok].view(torch.int16))


def _fp4_asm_cases():
    """(x, X): every bf16 bit pattern (int64; Inf and NaN included: a pair may hold one next to a finite
    element of another block) and every block exponent X in [-127, 126]."""
    return torch.arange(1 << 16, dtype=torch.int64), torch.arange(-127, 127, dtype=torch.int64)


def _finite16(x):
    return torch.isfinite((x.to(torch.int32) << 16).view(torch.float32))


def test_fp4_elements_asm_every_bf16_every_scale():
    """The bf16x2 FP4 encoder (``_quantize._FP4_ELEMENTS_ASM``, inline PTX: GPU only), run instruction by
    instruction on the CPU: for every finite bf16 input and every block exponent X, the four code bytes of
    each asm block (two bf16 pairs; the pairs mix values at random, Inf and NaN included: a pair's two
    elements may belong to different blocks, so a non-finite one must not disturb its neighbour) equal
    :func:`mxkit.formats.encode_elements` of the exact x * 2^-X (RNE; -0 and negative values rounding to 0
    keep the sign)."""
    from mxkit.formats import encode_elements
    from mxkit.kernels._quantize import _FP4_ELEMENTS_ASM

    xs, Xs = _fp4_asm_cases()
    g = torch.Generator().manual_seed(5)
    n = xs.numel() // 4 * 4
    for X in Xs.split(32):
        x = torch.stack([xs[torch.randperm(xs.numel(), generator=g)[:n]] for _ in X])  # [len(X), n] elements
        x = x.reshape(len(X), n // 4, 4)  # [len(X), asm blocks, element]
        f = ((127 - X) << 7)[:, None].expand(-1, n // 4)
        ops = {"$1": x[..., 0] | (x[..., 1] << 16), "$2": x[..., 2] | (x[..., 3] << 16),
               "$3": f | (f << 16), "$4": f | (f << 16)}
        got = _run_ptx_subset(_FP4_ELEMENTS_ASM.value, ops)["$0"]
        got = torch.stack([(got >> (8 * i)) & 0xFF for i in range(4)], -1)
        v = (x.to(torch.int32) << 16).view(torch.float32) * ((127 - X.to(torch.int32)) << 23).view(torch.float32)[:, None, None]
        want = encode_elements(v, "mxfp4_e2m1", "rne").to(torch.int64)
        bad = (got != want) & _finite16(x)  # (a non-finite element's block is zeroed after the asm)
        assert not bad.any(), (f"{int(bad.sum())} codes differ, first x=0x{int(x[bad][0]):04x} "
                               f"X={int(X[:, None, None].expand_as(x)[bad][0])}: {int(got[bad][0])} vs {int(want[bad][0])}")


def test_fp4_pairs_asm_packs_and_masks():
    """The rowwise FP4 pairs asm (``_quantize._FP4_PAIRS_ASM``: four bf16 pairs -> four packed bytes, even
    element in the low nibble, a block's bytes zeroed by its keep mask) on the CPU: every finite bf16 under
    random block exponents, the bytes equal :func:`mxkit.reference.pack_codes` of the reference codes, and 0
    where keep is 0 (the launcher's mask for a block holding Inf / NaN)."""
    from mxkit.formats import encode_elements
    from mxkit.kernels._quantize import _FP4_PAIRS_ASM
    from mxkit.reference import pack_codes

    xs, _ = _fp4_asm_cases()
    g = torch.Generator().manual_seed(6)
    n = xs.numel() // 8 * 8
    x = torch.cat([xs[torch.randperm(xs.numel(), generator=g)[:n]] for _ in range(4)]).reshape(-1, 4, 2)
    X = torch.randint(-127, 127, (x.shape[0],), generator=g)
    keep = torch.where(torch.rand(x.shape[0], generator=g) < 0.1, 0, 0xFFFFFFFF)
    f = (127 - X) << 7
    ops = {f"${1 + i}": x[:, i, 0] | (x[:, i, 1] << 16) for i in range(4)}
    ops.update({f"${5 + i}": f | (f << 16) for i in range(4)})
    ops.update({f"${9 + i}": keep for i in range(4)})
    got = _run_ptx_subset(_FP4_PAIRS_ASM.value, ops)["$0"]
    v = (x.to(torch.int32) << 16).view(torch.float32) * ((127 - X.to(torch.int32)) << 23).view(torch.float32)[:, None, None]
    want = pack_codes(encode_elements(v.reshape(-1, 8), "mxfp4_e2m1", "rne"), "mxfp4_e2m1").to(torch.int64)
    want = (want << (8 * torch.arange(4))).sum(-1) & keep
    ok = _finite16(x).all(-1).all(-1) | (keep == 0)  # (a block with Inf / NaN has keep 0)
    assert torch.equal(got[ok], want[ok]), f"{int((got != want)[ok].sum())} words differ"
    assert torch.equal(got[keep == 0], torch.zeros_like(got[keep == 0]))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("keep", [False, True])
def test_fp8x4_asm_matches_encode(fmt, keep):
    """The FP8 cvt asm (``_quantize._fp8x4_asm``: four fp32 values -> four code bytes in element order; with
    keep, each code zeroed by its own keep word, as ``_cvt_fp8_rn_keep`` masks a NaN / Inf block's codes and
    ``_fp8_words`` makes a unit's word) on the CPU: every FP8 grid value and every tie between neighbours,
    one fp32 ulp either side, both signs and signed zeros, fp32 subnormals and saturating values equal
    :func:`mxkit.formats.encode_elements` (RNE), byte for byte."""
    from mxkit.formats import decode_elements, encode_elements, get_format
    from mxkit.kernels._quantize import _fp8x4_asm

    f = get_format(fmt)
    g = torch.Generator().manual_seed(10)
    grid = decode_elements(torch.arange(128, dtype=torch.uint8), fmt)
    grid = grid[torch.isfinite(grid)].to(torch.float32)
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32: ties
    vals = torch.cat([grid, mids, torch.nextafter(mids, torch.tensor(0.0)), torch.nextafter(mids, torch.tensor(1e30)),
                      torch.tensor([f.max_normal * 1.5, 2.0**20, 1e-40, 2.0**-126, 0.0])])
    vals = torch.cat([vals, -vals])
    vals = torch.cat([vals, torch.zeros(-vals.numel() % 4)])[torch.randperm(vals.numel() + (-vals.numel() % 4),
                                                                            generator=g)]
    v = vals.reshape(-1, 4)
    kw = torch.where(torch.rand(v.shape, generator=g) < 0.25, 0, 0xFFFFFFFF)
    ops = {f"${1 + i}": v[:, i].view(torch.int32).to(torch.int64) & 0xFFFFFFFF for i in range(4)}
    if keep:
        ops.update({f"${5 + i}": kw[:, i] for i in range(4)})
    got = _run_ptx_subset(_fp8x4_asm(f.mbits, keep), ops)["$0"]
    codes = encode_elements(v, fmt, "rne").to(torch.int64)
    if keep:
        codes = torch.where(kw == 0, 0, codes)
    want = (codes << (8 * torch.arange(4))).sum(-1)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} words differ"


@pytest.mark.parametrize("rows", [8, 16])
def test_fp4_cols_asm_packs_units(rows):
    """The columnwise FP4 asm (``_quantize._fp4_cols_asm``: ``rows`` bf16 pairs of two adjacent columns, one
    per row of a packed unit, and their factor pair -> each column's packed unit) on the CPU: random bf16
    inputs (every bit pattern appears; Inf / NaN in one column must not disturb the other) and block
    exponents per column, the units of the finite columns equal
    :func:`mxkit.reference.pack_codes` of the reference codes down each column (row j in nibble j; with 16
    rows, rows 8-15 in the high word)."""
    from mxkit.formats import encode_elements
    from mxkit.kernels._quantize import _fp4_cols_asm
    from mxkit.reference import pack_codes

    xs, _ = _fp4_asm_cases()
    g = torch.Generator().manual_seed(8)
    n = xs.numel() // 4  # asm blocks: every finite bf16 appears 2 * rows / 4 times
    x = torch.cat([xs[torch.randperm(xs.numel(), generator=g)] for _ in range(rows // 2)])[: n * rows * 2]
    x = x.reshape(n, rows, 2)  # [asm block, row j, column c / c + 1]
    X = torch.randint(-127, 127, (n, 2), generator=g)
    f = (127 - X) << 7
    ops = {f"${2 + j}": x[:, j, 0] | (x[:, j, 1] << 16) for j in range(rows)}
    ops[f"${2 + rows}"] = f[:, 0] | (f[:, 1] << 16)
    regs = _run_ptx_subset(_fp4_cols_asm(rows), ops)
    v = (x.to(torch.int32) << 16).view(torch.float32) * ((127 - X.to(torch.int32)) << 23).view(torch.float32)[:, None, :]
    want = pack_codes(encode_elements(v.transpose(1, 2), "mxfp4_e2m1", "rne"), "mxfp4_e2m1").to(torch.int64)
    want = want.reshape(n, 2, rows // 8, 4)  # [block, column, 32-bit word, byte]
    want = (want << (8 * torch.arange(4))).sum(-1)
    for col in (0, 1):
        got = regs[f"${col}"]
        got = got if rows == 16 else (got,)
        ok = _finite16(x[:, :, col]).all(-1)  # (a column block with Inf / NaN is zeroed after the asm)
        assert ok.float().mean() > 0.5 and not ok.all()
        for w in range(rows // 8):
            assert torch.equal(got[w][ok], want[:, col, w][ok]), f"rows={rows} column {col} word {w}"


def test_hardware_path_guards():
    """The inline-asm paths take 4 elements per asm block: they are enabled only with >= 4 elements per
    thread, only for RNE, and FP4's bf16x2 path only for bf16 inputs (pure functions of the config)."""
    from mxkit.formats import Rounding, get_format
    from mxkit.kernels.quantize import DequantizeConfig as DC, QuantizeConfig as QC, hw_cvt_ok, hw_dec_ok

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("under the interpreter every hardware path is off")
    fp8, fp4, fp6, i8 = (get_format(n) for n in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e3m2", "mxint8"))
    cfg = QC(16, 256, 4, False, hw_cvt=True)
    assert hw_cvt_ok(cfg, fp8, Rounding.RNE, 0) and hw_cvt_ok(cfg, fp6, Rounding.RNE, 2)
    assert hw_cvt_ok(cfg, fp4, Rounding.RNE, 1) and not hw_cvt_ok(cfg, fp4, Rounding.RNE, 0)  # bf16 only
    assert not hw_cvt_ok(cfg, fp4, Rounding.RNE, 2) and not hw_cvt_ok(cfg, i8, Rounding.RNE, 1)
    assert not hw_cvt_ok(cfg, fp8, Rounding.AWAY, 1)
    assert not hw_cvt_ok(QC(16, 256, 4, False), fp8, Rounding.RNE, 1)  # not asked for
    assert not hw_cvt_ok(QC(1, 32, 1, False, hw_cvt=True), fp8, Rounding.RNE, 1)  # 1 element per thread
    assert hw_dec_ok(DC(8, 512, 4, False, hw_dec=True), fp4) and not hw_dec_ok(DC(8, 512, 4, False, hw_dec=True), i8)
    assert not hw_dec_ok(DC(1, 32, 1, False, hw_dec=True), fp8)  # 1 element per thread
    assert not hw_dec_ok(DC(1, 64, 1, False, hw_dec=True), fp8)  # 2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"])
def test_gpu_repeated_calls_and_misaligned_inputs(fmt, rng, poison):
    """Repeated calls (the second and later take the cached plan and the direct launch) with fresh data each
    time, alternating a 16-byte-aligned input with ones 2, 4 and 8 bytes off (other Triton specialisations;
    FP4 pairs need 4-byte, the FP6 unit asm 16-byte alignment and step aside otherwise): every result
    byte-equal to the reference, quantize (rows, columns, cast-transpose, also by one-direction programs)
    and dequantize."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    base = torch.empty(64 * 512 + 8, dtype=torch.bfloat16, device=DEV)
    for it in range(6):
        off = (0, 1, 0, 2, 0, 4)[it]
        x = base[off : off + 256 * 96].view(256, 96)
        x.copy_(rand_tensor((256, 96), -1, generator=rng, dtype=torch.bfloat16).to(DEV))
        assert (x.data_ptr() % 16 == 0) == (off == 0)
        xc = x.cpu()
        for axis in (-1, 0):
            ref = quantize_reference(xc, fmt, axis=axis)
            got = quantize_triton(x, fmt, axis=axis)
            _assert_mx_equal(got, ref, what=f"{fmt} axis {axis} call {it}")
            _assert_dequant_equal(dequantize_triton(got, torch.bfloat16), dequantize_reference(ref, torch.bfloat16),
                                  f"dequantize {fmt} axis {axis} call {it}")
        rows, cols = quantize_triton(x, fmt, axis=(-1, -2))
        _assert_mx_equal(rows, quantize_reference(xc, fmt, axis=-1), what=f"{fmt} cast-transpose rows call {it}")
        _assert_mx_equal(cols, quantize_reference(xc, fmt, axis=0), what=f"{fmt} cast-transpose cols call {it}")
        # C >= 512: the FP6 pairs kernel (at an address that is not a multiple of 4: its fallback)
        x2 = base[off : off + 64 * 512].view(64, 512)
        x2.copy_(rand_tensor((64, 512), -1, generator=rng, dtype=torch.bfloat16).to(DEV))
        rows, cols = quantize_triton(x2, fmt, axis=(-1, -2))
        _assert_mx_equal(rows, quantize_reference(x2.cpu(), fmt, axis=-1), what=f"{fmt} split rows call {it}")
        _assert_mx_equal(cols, quantize_reference(x2.cpu(), fmt, axis=0), what=f"{fmt} split cols call {it}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("part", [0, 1])  # the configs split in two for the GPU test processes
def test_gpu_fp4_units(part, rng, poison):
    """FP4 columns from bf16 pairs in the col_units layout (:func:`_quantize._cols_fp4_units`, session 11): the
    fused FP4 cast-transpose default (64 x 128, rows from bf16 pairs with the blocks outer, ct_evict) and
    other tiles (32 rows with 64-bit units, 8 warps, runtime scale mode, one-direction programs), columnwise
    and cast-transpose, on bf16 (the asm paths) and fp32 (the per-element fallback of the same config), ragged
    shapes (masked rows and columns), NaN / Inf / zero / subnormal / saturating blocks and the crafted tie
    blocks; outputs in poisoned memory."""
    from mxkit.kernels.quantize import QuantizeConfig, _cast_transpose_impl, _quantize_impl

    fmt = "mxfp4_e2m1"
    kw = dict(hw_cvt=True, col_units=2, col_fp4_words=True, fp4_pairs=True)
    cfgs = [QuantizeConfig(64, 128, 4, False, ct_evict=1, scale_t=True, mode_const=True, **kw),
            QuantizeConfig(32, 256, 4, False, col_wide=True, ct_evict=2, mode_const=True, **kw),
            QuantizeConfig(64, 256, 8, False, ct_evict=1, **kw),
            QuantizeConfig(64, 64, 2, False, split_rows=(2, 128, 4), mode_const=True, **kw)]
    ties = _fp8_tie_blocks(fmt)
    for k, cfg in enumerate(cfgs):
        if k % 2 != part:
            continue
        xs = [rand_tensor(shape, 0, generator=rng, dtype=torch.bfloat16, nonfinite=True)
              for shape in ((320, 208), (96, 288), (256, 1024))]
        xs += [ties.T.contiguous().to(torch.bfloat16), rand_tensor((160, 96), 0, generator=rng, nonfinite=True)]
        for i, x in enumerate(xs):
            for mode in _variant_modes(cfg, k + i):
                lay = "plain" if cfg.scale_t else "nvidia_128x4"
                ref = quantize_reference(x, fmt, axis=0, scale_mode=mode)
                q, s = _quantize_impl(x.to(DEV), fmt, 0, mode, "rne", lay, cfg)
                assert_bytes_equal(q.cpu(), ref.qdata, f"cols {cfg} {mode} {x.shape} {x.dtype} qdata")
                assert_bytes_equal(s.cpu(), _ref_layout(ref.scale, lay).cpu(), f"cols {cfg} {mode} scale")
                if x.shape[1] % 32:
                    continue
                outs = _cast_transpose_impl(x.to(DEV), fmt, mode, "rne", lay, cfg)
                for got, a in ((outs[:2], -1), (outs[2:], 0)):
                    ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                    assert_bytes_equal(got[0].cpu(), ref.qdata, f"cast-T {cfg} axis={a} {mode} {x.shape} qdata")
                    assert_bytes_equal(got[1].cpu(), _ref_layout(ref.scale, lay).cpu(),
                                       f"cast-T {cfg} axis={a} {mode} {x.shape} scale")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt,part", [(f, p) for f in ("mxfp6_e2m3", "mxfp6_e3m2") for p in (0, 1)])
def test_gpu_fp6_pairs(fmt, part, rng, poison):
    """FP6 from bf16 pairs (``fp6_pairs``, session 12: :func:`_quantize._rows_fp6_pairs`, :func:`_cols_fp6_pairs`,
    the asm :func:`_quantize._fp6_pairs_asm`) with and without the [groups, rows, 4] row store (fp6_store4):
    rowwise, columnwise, the one-direction cast-transpose and fused cast-transposes on several tiles, on
    bf16 (the pairs paths), fp32 (the same configs' fallbacks) and a bf16 input at an address that is not a
    multiple of 4 (the fallback too); ragged shapes (masked rows and columns), NaN / Inf / zero / subnormal /
    saturating blocks and the crafted tie blocks; a batch of matrices through the public call (the default
    fused kernel with B > 1); outputs in poisoned memory."""
    import dataclasses

    from mxkit.kernels.quantize import (QuantizeConfig, _cast_transpose_impl, _quantize_impl, quantize_config,
                                        quantize_triton)

    def default(x, rows, cols):
        return quantize_config(1, x.shape[0], x.shape[1], rows, cols, fmt)

    kw = dict(hw_cvt=True, col_units=2, fp6_words=True, fp6_asm=True, fp6_pairs=True, ct_evict=1, mode_const=True)
    fused = [QuantizeConfig(128, 64, 4, False, fp6_store4=True, scale_t=True, **kw),
             QuantizeConfig(64, 64, 2, False, **kw), QuantizeConfig(64, 128, 4, False, fp6_store4=True, **kw),
             QuantizeConfig(32, 256, 4, False, fp6_store4=True, scale_t=True, **dict(kw, mode_const=False))]
    ties = _fp8_tie_blocks(fmt)
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
                ("cols", dataclasses.replace(default(x, False, True), fp6_pairs=True)),
                ("ct", dataclasses.replace(default(x, True, True), fp6_pairs=True, fp6_store4=bool(i % 2)))]
        cfgs += [("ct", c) for k, c in enumerate(fused) if (k + i) % 2 == part]
        for k, (kind, cfg) in enumerate(cfgs):
            if kind == "rows" and part == 1 or kind == "cols" and part == 0:
                continue
            mode = SCALE_MODES[(i + k + part) % 4]
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
                assert_bytes_equal(got[1].cpu(), _ref_layout(ref.scale, lay).cpu(),
                                   f"cast-T {cfg} axis={a} {mode} {x.shape} scale")
    # a batch of matrices through the public call (the default config: the fused pairs kernel with B > 1)
    x3 = rand_tensor((3, 96, 1056), -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
    mode = SCALE_MODES[part + 2]
    rows, cols = quantize_triton(x3.to(DEV), fmt, axis=(-1, -2), scale_mode=mode)
    _assert_mx_equal(rows, quantize_reference(x3, fmt, axis=-1, scale_mode=mode), what=f"{fmt} 3-D rows {mode}")
    _assert_mx_equal(cols, quantize_reference(x3, fmt, axis=-2, scale_mode=mode), what=f"{fmt} 3-D cols {mode}")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (inline PTX)")
def test_gpu_hmax_abs_every_bf16_class():
    """``_quantize._hmax_abs`` (max.NaN.xorsign.abs.bf16x2, the FP4 amax step) on the GPU against the integer max of the masked halves (torch), for
    pairs drawn from every bf16 class (+-0, subnormals, normals, max finite, +-Inf, NaNs with any payload):
    after the sign mask, each half is the larger magnitude's exact bits, and any NaN gives a value >= 0x7F81
    (so >= 0x7F80 still flags the block)."""
    import triton
    import triton.language as tl

    from mxkit.kernels._quantize import _block_absmax

    @triton.jit
    def _k(x_ptr, o_ptr, N: tl.constexpr):
        rows = tl.program_id(0) * N + tl.arange(0, N)
        tl.store(o_ptr + rows, _block_absmax(tl.load(x_ptr + rows[:, None] * 8 + tl.arange(0, 8)[None, :]), 1))

    g = torch.Generator().manual_seed(11)
    h = torch.randint(0, 1 << 16, (1 << 16,), generator=g, dtype=torch.int32)
    special = torch.tensor([0, 0x8000, 1, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7F81, 0xFFC0,
                            0x7FFF, 0x3F80, 0xBF80], dtype=torch.int32)
    h[: special.numel() * 8] = special.repeat_interleave(8)[torch.randperm(special.numel() * 8, generator=g)]
    lo, hi = h[: 1 << 15], h[1 << 15 :]
    words = (lo | (hi << 16)).view(-1, 8)
    out = torch.empty(words.shape[0], dtype=torch.int32, device="cuda")
    _k[(words.shape[0] // 128,)](words.cuda(), out, N=128)
    got = out.cpu()
    for half, src in ((got & 0xFFFF, lo.view(-1, 8)), ((got >> 16) & 0xFFFF, hi.view(-1, 8))):
        mag = src & 0x7FFF
        nan = (mag > 0x7F80).any(1)
        want = mag.max(1).values
        assert torch.equal(half[~nan], want[~nan])
        assert bool((half[nan] > 0x7F80).all())


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_tiny_shapes(fmt, rng):
    """Problems smaller than a tile (1-2 rows of 32-64 elements, both axes, every dtype): the tile configs
    shrink below 4 elements per thread, where the inline-asm paths must step aside."""
    from mxkit.kernels.quantize import dequantize_triton, quantize_triton

    dts = (torch.bfloat16, torch.float32, torch.float16)  # rotated over the shapes (each dtype is a compile)
    for k, (shape, axis) in enumerate((((1, 32), -1), ((1, 64), -1), ((2, 32), -1), ((32, 1), 0), ((64, 2), 0),
                                       ((1, 64), -1))):
        dt = dts[k % 3]
        x = rand_tensor(shape, axis, generator=rng, dtype=dt)
        ref = quantize_reference(x, fmt, axis=axis)
        _assert_mx_equal(quantize_triton(x.to(DEV), fmt, axis=axis), ref, what=f"{fmt} {shape} {dt}")
        got = dequantize_triton(quantize_triton(x.to(DEV), fmt, axis=axis), torch.bfloat16)
        _assert_dequant_equal(got, dequantize_reference(ref, torch.bfloat16), f"dequantize {fmt} {shape} {dt}")
