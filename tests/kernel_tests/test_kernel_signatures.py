"""The jit kernels' signatures: few constexprs per kernel (issue #26: one kernel per algorithm, the format as one
constexpr), and every kernel path the heuristics select compiles for sm_90 on the CPU (Triton's bundled ptxas:
what the interpreter never sees, inline asm included)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re

import pytest
import torch
import triton

import mxkit.kernels
from mxkit.kernels.quantize_details import _cast_transpose, _cols, _dequantize, _rows

MAX_CONSTEXPRS = 16
_LAUNCHED = {_rows._quantize_rows_kernel, _cols._quantize_cols_kernel, _cast_transpose._cast_transpose_kernel,
             _cast_transpose._cast_transpose_tile_kernel, _cast_transpose._cast_transpose_split_kernel,
             _cast_transpose._transpose_bytes_kernel, _dequantize._dequantize_rows_kernel,
             _dequantize._dequantize_cols_kernel}


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


def _constexprs(f) -> int:
    return sum(p.is_constexpr for p in f.params)


def test_kernels_take_at_most_16_constexprs():
    """No @triton.jit kernel of mxkit.kernels takes more than 16 constexpr parameters (formats, tiles and
    function-valued choices; optional tensors as None), and no jit function of the quantize / dequantize package
    does either (its helpers included)."""
    kernels = _kernels()
    assert {f"{k.fn.__module__}.{k.fn.__name__}" for k in _LAUNCHED} <= set(kernels), sorted(kernels)
    over = {n: _constexprs(f) for n, f in kernels.items() if _constexprs(f) > MAX_CONSTEXPRS}
    assert not over, f"kernels with more than {MAX_CONSTEXPRS} constexpr parameters: {over}"
    helpers = {n: _constexprs(f) for n, f in _jit_functions().items() if ".quantize_details." in n}
    over = {n: c for n, c in helpers.items() if c > MAX_CONSTEXPRS}
    assert not over, f"jit functions with more than {MAX_CONSTEXPRS} constexpr parameters: {over}"


_PTR = {torch.int32: "*i32", torch.int16: "*i16", torch.uint8: "*u8", torch.float16: "*fp16",
        torch.float32: "*fp32", torch.bfloat16: "*bf16"}


def _sm90_compile(launcher, args: tuple, consts: tuple, num_warps: int) -> int:
    """Compile a launch (the kernel of ``launcher``, ``args``: the dtypes of its pointer arguments, then its
    runtime ints as launched) for sm_90 without a GPU (Triton's bundled ptxas). Returns the cubin's size."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(launcher.module, launcher.name)
    constexprs = dict(consts)
    runtime = [p.name for p in fn.params if not p.is_constexpr]
    assert len(runtime) == len(args), (runtime, args)
    sig = {}
    for name, a in zip(runtime, args):
        if isinstance(a, torch.dtype):
            sig[name] = _PTR[a]
        elif a == 1:  # (Triton specialises ints equal to 1 as constants)
            sig[name], constexprs[name] = "constexpr", 1
        else:
            sig[name] = "i32"
    sig.update({p.name: "constexpr" for p in fn.params if p.is_constexpr})
    k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps})
    return len(k.asm["cubin"])


# (shape, dtype, format, axis (None: the cast-transpose), rounding, layout, GPU name, the unaligned-input launch)
_QUANTIZE = {
    "rows": [((4096, 2880), torch.bfloat16, "mxfp8_e4m3", -1, "rne", "plain", "", False),  # cvt words
             ((8192, 8192), torch.bfloat16, "mxfp4_e2m1", -1, "rne", "nvidia_128x4", "", False),  # bf16 pairs
             ((8192, 8192), torch.bfloat16, "mxfp4_e2m1", -1, "rne", "plain", "", True),  # bf16x2 codes
             ((8192, 1280), torch.float16, "mxfp6_e2m3", -1, "rne", "plain", "", False),  # the unit asm
             ((8192, 8192), torch.bfloat16, "mxfp6_e3m2", -1, "rne", "aiter_shuffle", "", False),  # FP6 pairs
             ((127, 96), torch.float32, "mxint8", -1, "away", "plain", "", False)],
    "cols": [((8192, 8192), torch.bfloat16, "mxfp4_e2m1", 0, "rne", "plain", "", False),  # bf16 pairs, 64-bit
             ((4096, 2880), torch.float32, "mxfp4_e2m1", 0, "away", "nvidia_128x4", "", False),  # packed words
             ((8192, 8192), torch.float16, "mxfp8_e5m2", 0, "rne", "plain", "", False),  # units, cvt words
             ((8192, 8192), torch.bfloat16, "mxfp6_e2m3", 0, "rne", "plain", "", False),  # unit asm, 3-D grid
             ((4096, 2880), torch.bfloat16, "mxint8", 0, "rne", "aiter_shuffle", "", False)],
    "cast_transpose": [
        ((8192, 8192), torch.bfloat16, "mxfp8_e4m3", None, "rne", "plain", "NVIDIA H100 80GB HBM3", False),
        ((8192, 8192), torch.bfloat16, "mxfp4_e2m1", None, "rne", "plain", "NVIDIA H200", False),  # pairs, RB 2
        ((8192, 8192), torch.bfloat16, "mxfp6_e2m3", None, "rne", "nvidia_128x4", "", False),  # pairs, 3-D grid
        ((4096, 2880), torch.float16, "mxfp6_e3m2", None, "rne", "plain", "", False),  # split, unit asm
        ((4096, 2880), torch.float32, "mxfp6_e2m3", None, "away", "plain", "", False),  # split, integer
        ((4096, 256), torch.bfloat16, "mxfp6_e2m3", None, "rne", "plain", "", False),  # tile kernel, strips
        ((4096, 2880), torch.bfloat16, "mxint8", None, "rne", "nvidia_128x4", "", False)],  # tile kernel
}
# (shape, format, axis, output dtype)
_DEQUANTIZE = [((8192, 8192), "mxfp4_e2m1", -1, torch.bfloat16),  # the FP4 word asm
               ((8192, 8192), "mxfp6_e2m3", -1, torch.bfloat16),  # the FP6 group asm, lane-pair swaps
               ((4096, 2880), "mxfp8_e4m3", -1, torch.float16),  # one row per program
               ((127, 96), "mxint8", -1, torch.float32),
               ((4096, 2880), "mxfp8_e5m2", 0, torch.bfloat16)]  # transposed


@pytest.mark.parametrize("path", [*_QUANTIZE, "dequantize"])
def test_production_paths_compile_for_sm90(path):
    """The launches the heuristics plan for representative problems (every kernel and each path it selects: the
    hardware converts, bf16 pairs, the FP6 unit asm, the unaligned-input fallback, both launch grids, the
    per-GPU table) build for sm_90 on the CPU (Triton's bundled ptxas); their bytes are checked by the GPU tests
    (interpreter: the *_interpreted tests, without the inline asm)."""
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "the interpreter replaces the compiler"
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401 (the NVIDIA backend, with the [dev] install)

    from mxkit.kernels import quantize as kq

    if path == "dequantize":
        for shape, fmt, axis, dt in _DEQUANTIZE:
            kdtype, view16, words, _, ints, consts, warps, launcher = kq._dequantize_plan(fmt, axis, shape, dt, None)
            ptrs = (torch.int32 if words else torch.uint8, torch.uint8, torch.int16 if view16 else kdtype)
            assert _sm90_compile(launcher, ptrs + tuple(ints), consts, warps) > 0, (shape, fmt, axis, dt)
        return
    seen = set()
    for shape, dt, fmt, axis, rnd, layout, gpu, unaligned in _QUANTIZE[path]:
        plan = kq._quantize_plan(shape, dt, fmt, axis, "rceil", rnd, layout, None, gpu)
        consts = plan.unaligned[1] if unaligned else plan.consts
        assert not unaligned or consts != plan.consts
        x = plan.in_view or torch.float16
        ptrs = tuple(torch.int32 if word else torch.uint8 for _, word in plan.slots)
        assert _sm90_compile(plan.launcher, (x,) + ptrs + tuple(plan.ints), consts, plan.num_warps) > 0, (
            shape, dt, fmt, axis)
        seen.add(plan.launcher.name)
    want = {"rows": {"_quantize_rows_kernel"}, "cols": {"_quantize_cols_kernel"},
            "cast_transpose": {"_cast_transpose_kernel", "_cast_transpose_tile_kernel", "_cast_transpose_split_kernel"}}
    assert seen == want[path], seen
