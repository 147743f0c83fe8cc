"""The Triton ``tl.dot_scaled`` peer of ``mxkit bench gemm``: a simple tiled kernel, y = a @ b.T in bf16.

The kernel of ``shared/anchors/peers_h200.py`` (the ANCHORS.md dot_scaled numbers): grouped program order,
one ``tl.dot_scaled`` per K tile, fp32 accumulator. On sm_90 Triton decomposes ``dot_scaled`` to bf16
(operands upcast on CUDA cores, then a bf16 ``tl.dot``), which is what a Hopper user of it gets.

a: (M, K) float8_e4m3fn with scales (M, K // 32) uint8 E8M0 ("e4m3"), uint8 (M, K // 2) two E2M1 codes per
byte, element 2i in the low nibble ("e2m1", mxkit's MXFP4 qdata as is), or bfloat16 without scales ("bf16").
b: (N, K) likewise, "e4m3" or "e2m1" (the weight as stored). K must be a multiple of 64.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import triton
import triton.language as tl

FORMATS = ("e4m3", "e2m1", "bf16")
# (BM, BN, BK, GROUP_M, warps, stages), first fit wins: the anchors' best configs at 8192^3 / decode sizes
CONFIGS = ((128, 256, 128, 8, 8, 3), (128, 128, 128, 8, 4, 3), (128, 128, 64, 8, 4, 4), (64, 128, 128, 8, 4, 4),
           (16, 128, 128, 1, 4, 4), (16, 128, 64, 1, 4, 4))


@triton.jit
def _mm_dot_scaled(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K, A_FMT: tl.constexpr, B_FMT: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    tl.static_assert(BK % 32 == 0)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    gsz = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % gsz)
    pid_n = (pid % group) // gsz
    ADIV: tl.constexpr = 2 if A_FMT == "e2m1" else 1  # elements per byte along K
    BDIV: tl.constexpr = 2 if B_FMT == "e2m1" else 1
    offs_m = (pid_m * BM + tl.arange(0, BM)) % M  # rows past the edge re-read valid rows; the store masks them
    offs_n = (pid_n * BN + tl.arange(0, BN)) % N
    ka = tl.arange(0, BK // ADIV)
    kb = tl.arange(0, BK // BDIV)
    ks = tl.arange(0, BK // 32)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K // BK):
        a = tl.load(a_ptr + offs_m[:, None] * (K // ADIV) + (k * (BK // ADIV) + ka)[None, :])
        b = tl.load(b_ptr + offs_n[None, :] * (K // BDIV) + (k * (BK // BDIV) + kb)[:, None])  # (BK/BDIV, BN)
        bs = tl.load(bs_ptr + offs_n[:, None] * (K // 32) + (k * (BK // 32) + ks)[None, :])
        if A_FMT == "bf16":
            acc = tl.dot_scaled(a, None, A_FMT, b, bs, B_FMT, acc)
        else:
            a_s = tl.load(as_ptr + offs_m[:, None] * (K // 32) + (k * (BK // 32) + ks)[None, :])
            acc = tl.dot_scaled(a, a_s, A_FMT, b, bs, B_FMT, acc)
    om = pid_m * BM + tl.arange(0, BM)
    on = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + om[:, None] * N + on[None, :], acc.to(tl.bfloat16), mask=(om[:, None] < M) & (on[None, :] < N))


def fitting_configs(M: int, K: int) -> list[tuple[int, int, int, int, int, int]]:
    """The :data:`CONFIGS` whose BK divides K and whose BM suits M (16-row tiles for M <= 64), in order.
    Raises ValueError when none does."""
    fit = [c for c in CONFIGS if K % c[2] == 0 and (c[0] <= 16) == (M <= 64)]
    if not fit:
        raise ValueError(f"no dot_scaled config for M={M}, K={K} (K must be a multiple of 64)")
    return fit


def pick_config(M: int, K: int) -> tuple[int, int, int, int, int, int]:
    return fitting_configs(M, K)[0]


def dot_scaled_mm(a: torch.Tensor, a_scale: Optional[torch.Tensor], a_fmt: str, b: torch.Tensor,
                  b_scale: torch.Tensor, b_fmt: str, K: int, config=None) -> Callable[[], torch.Tensor]:
    """A zero-argument callable computing the bf16 (M, N) product into one preallocated output (operands: the
    module docstring). Its first call takes the first config that compiles and launches (a tile can run out of
    shared memory for one format pair and not another). Raises ValueError for an unknown format or a K it
    cannot tile."""
    if a_fmt not in FORMATS or b_fmt not in FORMATS[:2]:
        raise ValueError(f"formats {a_fmt!r} x {b_fmt!r}: a in {FORMATS}, b in {FORMATS[:2]}")
    M, N = a.shape[0], b.shape[0]
    todo = [config] if config else fitting_configs(M, K)
    c = torch.empty(M, N, device=a.device, dtype=torch.bfloat16)
    a_s = a_scale if a_scale is not None else b_scale  # unused for bf16 a

    def launch(cfg) -> torch.Tensor:
        BM, BN, BK, G, W, S = cfg
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        _mm_dot_scaled[grid](a, a_s, b, b_scale, c, M, N, K, a_fmt, b_fmt, BM, BN, BK, G, num_warps=W, num_stages=S)
        return c

    def run() -> torch.Tensor:
        while len(todo) > 1:  # until one config has launched, a failing one gives way to the next
            try:
                out = launch(todo[0])
                del todo[1:]
                return out
            except Exception:
                todo.pop(0)
        return launch(todo[0])

    return run
