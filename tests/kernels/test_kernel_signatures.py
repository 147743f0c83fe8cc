"""The jit kernels' signatures: few constexprs per kernel (issue #26), and every config-selected path of the
quantize / dequantize kernels compiles for sm_90 on the CPU (Triton's bundled ptxas: what the interpreter never
sees, inline asm included)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re

import pytest
import triton

import mxkit.kernels
from mxkit.kernels.quantize_details import _cast_transpose, _dequantize, _quantize

_KERNELS = {"_quantize_kernel": _quantize._quantize_kernel,
            "_cast_transpose_split_kernel": _cast_transpose._cast_transpose_split_kernel,
            "_dequantize_kernel": _dequantize._dequantize_kernel}

MAX_CONSTEXPRS = 16
# The legacy kernels steered by flags, over the limit until they are split into one kernel per algorithm
# (issue #26). This list may only shrink: a kernel that is not on it fails at 17 constexprs.
LEGACY_OVER_LIMIT = {
    "mxkit.kernels.quantize_details._quantize._quantize_kernel",
    "mxkit.kernels.quantize_details._cast_transpose._cast_transpose_split_kernel",
    "mxkit.kernels.quantize_details._dequantize._dequantize_kernel",
}


def _jit_functions() -> dict:
    """Every @triton.jit function defined in a module of mxkit.kernels, by qualified name."""
    found = {}
    for info in pkgutil.walk_packages(mxkit.kernels.__path__, "mxkit.kernels."):
        for v in vars(importlib.import_module(info.name)).values():
            if isinstance(v, triton.runtime.JITFunction) and v.fn.__module__.startswith("mxkit.kernels."):
                found[f"{v.fn.__module__}.{v.fn.__name__}"] = v
    return found


def _kernels() -> dict:
    """The launched ones: jit functions that no other jit function of the package calls."""
    fns = _jit_functions()
    called = set()
    for name, f in fns.items():
        called |= {n for n in fns if n != name and re.search(r"\b%s\s*\(" % re.escape(fns[n].fn.__name__), f.src)}
    return {n: f for n, f in fns.items() if n not in called}


def test_kernels_take_at_most_16_constexprs():
    """No @triton.jit kernel of mxkit.kernels takes more than 16 constexpr parameters (formats, tiles and
    function-valued choices; optional tensors as None), except the legacy kernels listed above, which must
    still exist and still be over the limit (remove a kernel from the list once it is split)."""
    kernels = _kernels()
    assert "mxkit.kernels.quantize_details._quantize._quantize_kernel" in kernels, sorted(kernels)
    counts = {n: sum(p.is_constexpr for p in f.params) for n, f in kernels.items()}
    over = {n: c for n, c in counts.items() if c > MAX_CONSTEXPRS and n not in LEGACY_OVER_LIMIT}
    assert not over, f"kernels with more than {MAX_CONSTEXPRS} constexpr parameters: {over}"
    stale = {n for n in LEGACY_OVER_LIMIT if counts.get(n, 0) <= MAX_CONSTEXPRS}
    assert not stale, f"no longer over the limit (or gone): drop from LEGACY_OVER_LIMIT: {stale}"


def _sm90_compile(kernel_name: str, num_warps: int, **constexprs):
    """Compile a kernel for sm_90 without a GPU (Triton's bundled ptxas): catches errors of the compiled
    path that the CPU interpreter never sees (inline asm, early returns, layouts). Returns SASS size."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _KERNELS[kernel_name]
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


@pytest.mark.parametrize("variant", ["rows_hw", "cols_hw_cd", "castT_hw", "dequant_load3d", "dequant_hw"])
def test_opt_in_paths_compile_for_sm90(variant):
    """The compiled (non-interpreted) kernels of the config-selected paths build for sm_90 on the CPU (Triton's
    bundled ptxas); their bytes are checked by the GPU variant tests (interpreter: the *_interpreted tests)."""
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "the interpreter replaces the compiler"
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401 (the NVIDIA backend, with the [dev] install)

    from mxkit.formats import get_format
    from mxkit.kernels.quantize import _format_constexprs

    def quant(fmt, do_row, do_col, br, bc, warps, **kw):
        ce = dict(IN_KIND=1, DO_ROW=do_row, DO_COL=do_col, LAYOUT_R=0, LAYOUT_C=1, AWAY=False, BLOCK_R=br,
                  BLOCK_C=bc, INT64=False, MASKED=True, HW_CVT=False, SCALE_MODE=0,
                  COL_DIRECT=False, **_format_constexprs(get_format(fmt)))
        ce.update(kw)
        return _sm90_compile("_quantize_kernel", warps, **ce)

    if variant == "rows_hw":
        assert quant("mxfp8_e4m3", True, False, 16, 256, 4, HW_CVT=True) > 0
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
            ce = dict(IN_KIND=1, LAYOUT_R=0, LAYOUT_C=3, AWAY=False, INT64=False, MASKED=True,
                      SCALE_MODE=1, ROW_HW=True, COL_BC=64, **_format_constexprs(get_format(fmt)), **kw)
            assert _sm90_compile("_cast_transpose_split_kernel", 2 if kw["COL_BR"] > 32 else 1, **ce) > 0
        for fmt, br in (("mxfp8_e4m3", 64), ("mxfp4_e2m1", 128)):  # columnwise FP8 / FP4: 64-bit units
            assert quant(fmt, False, True, br, 64, 2, HW_CVT=True, COL_PACKED=True, COL_WIDE=True, SCALE_MODE=2) > 0
        # the session-7 columnwise defaults: col_units for FP8 (through the cvt), FP6 (the unit asm, both FP6
        # formats, both load widths) and MXINT8; rowwise FP6 through the unit asm
        for fmt, hw, units in (("mxfp8_e4m3", True, 2), ("mxfp6_e3m2", True, 2), ("mxfp6_e2m3", True, 1),
                               ("mxint8", False, 2)):
            assert quant(fmt, False, True, 128, 64, 4, HW_CVT=hw, COL_UNITS=units, SCALE_MODE=0,
                         FP6_ASM=hw) > 0
        # session 10: FP8 codes made and masked as words (rows: the mask inside the cvt asm; columns: col_packed
        # 32-bit units and col_units), alone and in the fused cast-transpose, E4M3 / E5M2, fp32 / fp16 inputs
        assert quant("mxfp8_e4m3", True, True, 32, 128, 2, HW_CVT=True, COL_PACKED=True, FP8_WORDS=True,
                     SCALE_MODE=0) > 0
        assert quant("mxfp8_e4m3", True, True, 32, 256, 4, HW_CVT=True, COL_UNITS=2, FP8_WORDS=True, CT_EVICT=1,
                     SCALE_MODE=0) > 0
        assert quant("mxfp8_e5m2", True, False, 8, 1024, 8, HW_CVT=True, FP8_WORDS=True, IN_KIND=0) > 0
        assert quant("mxfp8_e4m3", False, True, 256, 64, 8, HW_CVT=True, COL_UNITS=2, FP8_WORDS=True, IN_KIND=2,
                     SCALE_MODE=2) > 0
        for fmt in ("mxfp6_e2m3", "mxfp6_e3m2"):
            assert quant(fmt, True, False, 4, 512, 2, RB=4, SCALE_MODE=0, FP6_WORDS=True, HW_CVT=True,
                         FP6_ASM=True) > 0
        # session 11: FP4 columns from bf16 pairs in the col_units layout (_cols_fp4_units), the fused FP4
        # cast-transpose default (rows from pairs with the blocks outer, ct_evict), 64-bit units, and columnwise
        for br, bc, w, wide, row in ((64, 128, 4, False, True), (32, 256, 4, True, True), (128, 64, 4, False, False)):
            assert quant("mxfp4_e2m1", row, True, br, bc, w, HW_CVT=True, COL_UNITS=2, COL_FP4W=True, COL_WIDE=wide,
                         FP4_PAIRS=row, CT_EVICT=1, SCALE_MODE=3) > 0
        # session 12: FP6 from bf16 pairs (rows, columns, the fused and the one-direction cast-transposes), the
        # [groups, rows, 4] row store
        for fmt, row, col, br, bc, w, st4 in (("mxfp6_e2m3", True, False, 4, 512, 2, False),
                                              ("mxfp6_e3m2", False, True, 128, 64, 4, False),
                                              ("mxfp6_e2m3", True, True, 128, 64, 4, True),
                                              ("mxfp6_e3m2", True, True, 64, 128, 4, True)):
            assert quant(fmt, row, col, br, bc, w, HW_CVT=True, COL_UNITS=2 if col else 0, FP6_WORDS=row,
                         FP6_ASM=True,
                         FP6P_R=row, FP6P_C=col, FP6_ST4=st4, CT_EVICT=1 if row and col else 0, SCALE_MODE=1) > 0
        f6 = get_format("mxfp6_e2m3")
        ce = dict(IN_KIND=1, LAYOUT_R=0, LAYOUT_C=3, AWAY=False, INT64=False, MASKED=True, SCALE_MODE=0,
                  ROW_HW=True, ROW_BR=2, ROW_BC=512, ROW_RB=4, FP6_WORDS=True, FP4_PAIRS=False, COL_BR=64, COL_BC=64,
                  COL_HW=True, COL_PACKED=False, COL_WIDE=False, COL_UNITS=2, FP6_ASM=True, FP6P_R=True,
                  FP6P_C=True, FP6_ST4=True, **_format_constexprs(f6))
        assert _sm90_compile("_cast_transpose_split_kernel", 2, **ce) > 0
    elif variant == "cols_hw_cd":
        assert quant("mxfp8_e4m3", False, True, 32, 64, 2, HW_CVT=True, COL_DIRECT=True) > 0
        # programs walking 8 / 4 tiles down R
        assert quant("mxfp8_e4m3", False, True, 32, 64, 1, HW_CVT=True, COL_DIRECT=True, RB=8, LAYOUT_C=0) > 0
        assert quant("mxfp4_e2m1", True, True, 32, 64, 2, HW_CVT=True, RB=4, LAYOUT_C=0) > 0
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
