"""What mxkit's Gluon wgmma kernels share: the Gluon modules (imported on first use: a Triton without Gluon
leaves the kernels unavailable, not the package), the output tiles' launch order, and for the
w16 kernel (``_w4a16_wgmma``) and its weight layouts (``_layout_wgmma``, ``_layout_mma``) the program's shape,
the accumulator and A-operand layouts and the E8M0 factor's decode.
"""

from __future__ import annotations

import functools

import torch

BN = 128      # weight rows per program of the w16 kernel (wgmma M: 8 warps x 16 rows); K goes in steps of 64
WARPS = 8


@functools.lru_cache(maxsize=None)
def gluon():
    """The Gluon modules (gluon, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, TensorDescriptor), or the
    ImportError's text."""
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                      warpgroup_mma_wait)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        return f"{type(e).__name__}: {e}"
    return gluon, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, TensorDescriptor


def tma_load():
    """Gluon's TMA load: async_copy_global_to_shared in Triton 3.6, renamed async_load later (the old name then
    raises)."""
    tma = gluon()[3]
    return getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@functools.lru_cache(maxsize=None)
def launch_order():
    """The Gluon helper both wgmma kernels (``_w4a16_wgmma``, ``_fp8_wgmma``) order their output tiles by: tile ->
    (pid_m, pid_n), ``GROUP`` tiles along M at a time so that they share the weight's tiles in L2."""
    g, gl = gluon()[:2]

    @g.jit
    def launch_order(tile, grid_m, grid_n, GROUP: gl.constexpr):
        per_group = GROUP * grid_n
        first_m = (tile // per_group) * GROUP
        rows_m = gl.minimum(grid_m - first_m, GROUP)
        return first_m + (tile % per_group) % rows_m, (tile % per_group) // rows_m

    return launch_order


def warp_bases(rows_per_warp: int, dims: int, at: int, scale: int = 1) -> list:
    """The warp bases of a distributed linear layout whose WARPS warps own consecutive ``rows_per_warp`` rows of
    dimension ``at`` (times ``scale``)."""
    out, w = [], rows_per_warp
    while w < rows_per_warp * WARPS:
        b = [0] * dims
        b[at] = w * scale
        out.append(b)
        w *= 2
    return out


@functools.lru_cache(maxsize=None)
def acc_layouts(BM: int) -> tuple:
    """(ACC, DOT): the w16 kernel's accumulator [BN weight rows, BM tokens] and its A-operand (the decoded
    weight [BN, 64], bf16 pairs) layouts."""
    gl = gluon()[1]
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16])
    return acc, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)


@functools.lru_cache(maxsize=None)
def u8_layout(rank: int):
    """The unswizzled shared layout of the weight layouts' byte tiles (TMA boxes of ``rank`` dimensions)."""
    return gluon()[1].NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=rank)


@functools.lru_cache(maxsize=None)
def e8m0_bf16():
    """The Gluon helper: E8M0 scale bytes (int32) -> 2^(s - 127) as bf16 (exponent field s for s >= 1, the
    subnormal 0x0040 for 0, NaN for 255)."""
    g, gl = gluon()[:2]

    @g.jit
    def e8m0_bf16(sb):
        bits = gl.where(sb >= 1, sb << 7, 0x0040)
        bits = gl.where(sb == 255, 0x7FC0, bits)
        return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)

    return e8m0_bf16
