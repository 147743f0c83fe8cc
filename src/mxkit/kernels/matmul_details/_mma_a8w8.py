"""The small-M MXFP8 x MXFP8 GEMM (``a8w8-mma``): E4M3 codes of both operands straight into FP8 tensor cores
(``mma.sync.m16n8k32`` e4m3, sm_89+), a CUDA C++ kernel (``mma_a8w8.cu``, shipped as PTX) launched through
the driver API. The weight is read in the a8w8 layout :func:`pack_a8w8` writes once (``pack_weight``: each
lane's A fragment of a block one 16-byte load, a warp's loads 512 contiguous bytes; 84-90% of copy bandwidth
for a load-only kernel on an H100, against 66% for 8-byte loads of the rows as stored), or as stored (an
MXTensor weight). The activations come as an MXFP8 MXTensor, or as bf16 rows that the kernel quantizes itself
(OCP FLOOR scale, round to nearest even: the bytes of ``mxkit.quantize(x, "mxfp8")``): one launch.

On sm_90, from MXFP8 codes at M <= 8 on layers of at least one 16-row strip per multiprocessor, the kernel streams
the weight by Hopper bulk copies instead (``mma_a8w8_bulk.cu``, its own PTX: a producer warp a block, a ring of
17 KB chunks, persistent blocks; the bits of the kernel here at one thread block along K): H200, M = 1, 28672 x
8192 80.3 -> 67.4 us (``benchmarks/a8w8_ab.md``; the W8A16 kernel, less load-bound, did not gain in its shipped
form). From bf16 at up to 2 rows (4 on layers of N >= 14336) the bulk kernel quantizes x once per block into shared
memory: 96.7 -> 70.8 us there at M = 1.

The same file's W8A16 kernels (``w8a16-mma``; :class:`A8W8` with ``w16``) take bf16 rows as they are against an
MXFP8 E4M3 or E5M2 weight in the a8w8 layout: the codes decoded to bf16 exactly, two bf16 ``mma.sync`` per
block, each block's float32 sum scaled once (every scale byte exact).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Optional

import torch

from .._env import choice
from ..cuda_driver import device_index as _index, shipped_kernel, shipped_ptx_unavailable, sm_count
from ._mma_decode import bias_flag, check_shape, shape_ok, split_buffers, split_k  # the same strips, tiles and bias

PTX = Path(__file__).with_name("mma_a8w8.ptx")
PTX_BULK = Path(__file__).with_name("mma_a8w8_bulk.ptx")  # sm_90: the bulk-copy kernels (mma_a8w8_bulk.cu)
COMMON = Path(__file__).with_name("mma_common.cuh")  # included by every .cu (hashed with it in the PTX's line 1)
SOURCE = Path(__file__).with_name("mma_a8w8.cu")
MAX_M = 64  # the kernel takes any M (blocks of 8 tokens on the grid); past this the plan stops offering it
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
# the strips per warp (R) of mma_a8w8.cu's instantiations: as stored, and in the a8w8 layout
KERNEL_R = {"": (1, 2), "p": (1, 2, 4)}


def strips_per_warp(N: int, M: int, quant: bool, packed: bool) -> int:
    """R of the kernel a call takes (measured on an H100, ``benchmarks/a8w8_ab.md``): one strip for M <= 8
    from MXFP8 activations; on the packed layout two up to 16 tokens and four past that (more rows per
    activation load); two when the kernel quantizes bf16 activations (their quantization shared by more rows);
    each as N allows."""
    want = 2 if quant else (1 if M <= 8 or not packed else (2 if M <= 16 else 4))
    return max(r for r in KERNEL_R["p" if packed else ""] if r <= want and N % (16 * r) == 0)


def available(device: torch.device) -> Optional[str]:
    """None when the kernel can run on CUDA ``device``, else why not (no PTX, a GPU older than sm_89, the
    driver refusing the module, ``MXKIT_MMA_DECODE=0``, which turns off every CUDA C++ decode kernel)."""
    return shipped_ptx_unavailable(str(PTX), _index(device), (8, 9), "mma.sync e4m3")


def _kernel(name: str, index: int, bulk: bool = False):
    return shipped_kernel(str(PTX_BULK if bulk else PTX), name, index)


BULK_MAX_M = 8  # the bulk-copy kernels' rows (one block of 8 tokens along the grid's x)
# the weight's E8M0 bytes the kernels take: each block's float32 sum c (a multiple of 2^-18, at most 32 * 448^2 <
# 2^22.7) times the weight's factor 2^(s - 127) stays a normal float32, exact, for s in this range; the
# activation's factor then enters the fma (one rounding, any byte). Weights with other bytes take another path.
WEIGHT_SCALE_BYTES = (19, 232)
BULK_MIN_STRIPS_PER_SM = 1  # ... on layers of at least this many 16-row strips per multiprocessor (N >= 2112 on 132)
BULK_BLOCKS_PER_SM = 2  # persistent blocks per multiprocessor (each loops over strips)
# bf16 x quantized in the bulk kernel's launch: its M rows' codes and scale bytes in dynamic shared memory, up to
# this many bytes (M (K + K / 32): K = 8192 up to 8 rows, 28672 up to 2); with the 36 KB ring, 2 blocks an SM
BULK_X_SMEM = 72 * 1024
# the policy's rows for it: the quantization, once a block, is the kernel's prologue (QB blocks a lane in flight),
# paid again by every persistent block: up to 2 rows on any layer, 4 where N >= BULK_QUANT_WIDE_N, whose blocks
# loop over more strips (H200, from bf16, us, register kernel -> bulk: 8192^2 33.5 -> 28.7 at M = 2, 33.6 -> 34.5
# at 4, 33.2 -> 46.9 at 8; 28672 x 8192 95.4 -> 78.4 at 4, 95.9 -> 96.8 at 8; 14336 x 4096 30.8 -> 28.9 at 4;
# benchmarks/a8w8_ab.md)
BULK_QUANT_MAX_M = 2
BULK_QUANT_WIDE_M, BULK_QUANT_WIDE_N = 4, 14336


def bulk_fits(N: int, K: int, M: int, quant: bool, packed: bool, w16: Optional[str], r: Optional[int],
              nt: int, split: Optional[int]) -> bool:
    """Whether the bulk-copy kernel can run the call :class:`A8W8` was given (``r`` / ``split`` as passed, None:
    the policy's): a packed weight, one strip a warp, one token tile, M <= :data:`BULK_MAX_M`, MXFP8 codes or bf16
    x whose M rows' codes and scales fit :data:`BULK_X_SMEM`, no W8A16, no split along K."""
    x_bytes = M * (K + K // 32) if quant else 0
    return (packed and r in (None, 1) and nt == 1 and M <= BULK_MAX_M and w16 is None and x_bytes <= BULK_X_SMEM
            and (split is None or int(split) == 1))


def bulk_policy(N: int, M: int, quant: bool, sms: int) -> bool:
    """Whether the default (``bulk=None``, split and r left to the policy) takes the bulk-copy kernel where it fits:
    at least :data:`BULK_MIN_STRIPS_PER_SM` strips per multiprocessor, and from bf16 at most
    :data:`BULK_QUANT_MAX_M` rows (:data:`BULK_QUANT_WIDE_M` where N >= :data:`BULK_QUANT_WIDE_N`)."""
    rows = BULK_QUANT_WIDE_M if N >= BULK_QUANT_WIDE_N else BULK_QUANT_MAX_M
    return N // 16 >= BULK_MIN_STRIPS_PER_SM * sms and (not quant or M <= rows)


@functools.lru_cache(maxsize=None)
def _bulk_x_kernel(name: str, index: int):
    """A bulk bf16-in kernel with its dynamic shared memory allowed up to :data:`BULK_X_SMEM` (past the 48 KB that
    needs no opt-in, with the static ring)."""
    k = _kernel(name, index, True)
    from ..cuda_driver import _check, _libcuda

    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
    _check(_libcuda().cuFuncSetAttribute(k.fn, ctypes.c_int(8), ctypes.c_int(BULK_X_SMEM)), f"sizing {name}")
    return k


@functools.lru_cache(maxsize=None)
def bulk_unavailable(index: int) -> Optional[str]:
    """None when the bulk-copy kernels (``mma_a8w8_bulk.ptx``) run on CUDA device ``index``, else why not: no
    file, a GPU older than sm_90, the driver refusing the module, ``MXKIT_MMA_DECODE=0``, or ``MXKIT_A8W8_BULK=0``
    (the register-load kernels instead, for A/B runs). Kept per device: the switches are read on the first call
    (set them before; unlike the per-call switches of :mod:`mxkit.kernels._env`)."""
    if choice("MXKIT_A8W8_BULK", ("0", "1")) == "0":
        return "MXKIT_A8W8_BULK=0"
    return shipped_ptx_unavailable(str(PTX_BULK), index, (9, 0), "cp.async.bulk")


def pack_a8w8(qdata: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 codes ``qdata`` uint8 [N, K] and E8M0 ``scale`` uint8 [N, K / 32] (N % 16 == 0, K % 64 == 0) ->
    (q int32 [N / 16, K / 64, 2, 32, 4], s int32 [N / 16, K / 64, 8]): for strip r (rows 16r ..), tile kt,
    block b and lane 4g + t, the words W[g][c .. c+3], W[g+8][c .. c+3], W[g][c+4 .. c+7], W[g+8][c+4 .. c+7]
    with c = 64kt + 32b + 8t (the mma's A fragment, a0 .. a3); s: decode-mma's scale words (bytes of rows g
    and g + 8, blocks 0 and 1). Same bytes, rearranged. ValueError on other shapes."""
    N, K = qdata.shape
    if qdata.dim() != 2 or N % 16 or K % 64 or tuple(scale.shape) != (N, K // 32):
        raise ValueError(f"pack_a8w8 needs qdata [N, K] and scale [N, K/32] with N % 16 == 0 and K % 64 == 0; "
                         f"got {tuple(qdata.shape)} and {tuple(scale.shape)}")
    q = qdata.contiguous().view(N // 16, 2, 8, K // 64, 2, 4, 2, 4)  # r, h, g, kt, b, t, half, i
    q = q.permute(0, 3, 4, 2, 5, 6, 1, 7).contiguous()               # r, kt, b, g, t, half, h, i
    s = scale.contiguous().view(N // 16, 2, 8, K // 64, 2).permute(0, 3, 2, 1, 4).contiguous()  # r, kt, g, h, b
    return q.view(N // 16, K // 64, 2, 32, 16).view(torch.int32), s.view(N // 16, K // 64, 8, 4).view(
        torch.int32).squeeze(-1)


def unpack_a8w8(q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_a8w8`: (qdata uint8 [N, K], scale uint8 [N, K / 32])."""
    R, T = q.shape[0], q.shape[1]
    qb = q.contiguous().view(torch.uint8).view(R, T, 2, 8, 4, 2, 2, 4)  # r, kt, b, g, t, half, h, i
    qd = qb.permute(0, 6, 3, 1, 2, 4, 5, 7).reshape(R * 16, T * 64)      # r, h, g, kt, b, t, half, i
    sb = s.contiguous().view(torch.uint8).view(R, T, 8, 2, 2).permute(0, 3, 2, 1, 4)  # r, h, g, kt, b
    return qd.contiguous(), sb.reshape(R * 16, T * 2).contiguous()


def weight_ok(qdata: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether the kernel reads an E4M3 weight's codes [N, K] and plain scales [N, K / 32] as they are:
    row-major, codes 16-byte aligned, scales 2-byte aligned."""
    return (qdata.is_contiguous() and scale.is_contiguous() and qdata.data_ptr() % 16 == 0
            and scale.data_ptr() % 2 == 0)


def x_ok(x: torch.Tensor, quant: bool) -> bool:
    """Whether the kernel reads activations x as they are: unit stride along K, rows 16-byte (bf16) or 8-byte
    (codes) aligned."""
    return x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % (16 if quant else 8) == 0


def split_quant(blocks: int, K: int, sms: int) -> int:
    """Thread blocks along K for the kernels that quantize x: a grid of fewer than two blocks per multiprocessor
    is split until it has them, each split keeping at least 8 tiles of K, at most 4 (the quantization makes each
    warp's chain of tiles long: 1 x 5120 x 2880 took 24.2 us unsplit and 18.5 us in two on an H100)."""
    if blocks >= 2 * sms:
        return 1
    return max(1, min(4, -(-2 * sms // blocks), K // 64 // 8))


def split_w16(blocks: int, K: int, sms: int, nt: int = 1) -> int:
    """Thread blocks along K for the W8A16 kernel. One strip a warp, 8 tokens a block (``nt`` 1): the fewest of
    1, 2, 4 that give the grid 4 blocks per multiprocessor, doubled (at most 4) for K >= 16384 (H200, session 38,
    ``w8a16_mma_ab.py`` at M = 1: 8192 x 8192 31.0 / 28.7 / 29.2 us at 1 / 2 / 4, 8192 x 28672 92.7 / 83.7 /
    79.4, 28672 x 8192 76.7 / 77.8 / 80.4, 2880 x 4096 15.3 / 12.2 / 11.6, 4096 x 14336 41.7 / 29.7 / 26.5).
    Two strips a warp, 16 tokens a block (``nt`` 2, 121 registers): the fewest giving 2 blocks per multiprocessor
    (H200, session 39, M = 16: 28672 x 8192 93.6 / 97.6 / 102.4, 8192 x 8192 39.4 / 33.5 / 35.9, 8192 x 28672
    120.4 / 93.6 / 94.8). Each split keeps at least 8 tiles of K."""
    if nt > 1:
        split = next((s for s in (1, 2, 4) if blocks * s >= 2 * sms), 4)
    else:
        split = next((s for s in (1, 2, 4) if blocks * s >= 4 * sms), 4)
        if K >= 16384:
            split = min(4, 2 * split)
    return max(1, min(split, K // 64 // 8))


W16_R1_MAX_M = 8  # up to this M the W8A16 kernel runs one strip a warp (56 registers against 96 at two)
W16_NT2_MAX_M = 16  # ... past it, up to this M, two strips a warp and 16 tokens a block (N % 32 == 0)


class A8W8:
    """One prepared launch of the MXFP8 x MXFP8 kernel: weight codes ``w`` uint8 [N, K] and scales ``sw`` uint8
    [N, K / 32] (an E4M3 MXTensor's qdata / plain scale), or with ``shape=(N, K)`` the (q, s) of
    :func:`pack_a8w8`; M rows of activations, ``out`` dtype out; ``quant``:
    the activations are bf16 and the kernel quantizes them. ``w16`` ("e4m3" / "e5m2"; needs ``shape`` and
    ``quant``): the W8A16 kernel instead, bf16 activations as they are times the weight's codes of that element
    format (which must hold no NaN / Inf code). ``split``: thread blocks along K (default
    :func:`split_quant` for bf16 activations, else :func:`mxkit.kernels.matmul_details._mma_decode.split_k`);
    with more than one, the launch uses a float32
    workspace and a counter array kept with the weight for its launch shape
    (:func:`~._mma_decode.split_buffers`: one stream at a time for this launch; W8A16: :func:`split_w16`). ``r``:
    16-row strips a warp computes (default: the policy, :func:`strips_per_warp`, or for W8A16 1 up to
    :data:`W16_R1_MAX_M` rows, else the largest of 1, 2 that divides N / 16; for A/B probes); ``nt`` (W8A16
    only): token tiles of 8 a block, 1 or 2 (2 only at ``r`` 2; default 2 for :data:`W16_R1_MAX_M` <
    M <= :data:`W16_NT2_MAX_M` at ``r`` 2, else 1; each token's row the bits of ``nt`` 1 at the same split).
    ``bulk``: the bulk-copy kernel (``mma_a8w8_bulk.cu``: MXFP8 codes in, or bf16 x quantized once per block
    where its rows take at most :data:`BULK_X_SMEM` bytes of codes and scales; packed, one strip a warp, M <=
    :data:`BULK_MAX_M`, no split along K, the bits of split 1 here); None (default) takes it on sm_90 where
    ``split`` and ``r`` are left to the policy and the layer has :data:`BULK_MIN_STRIPS_PER_SM` strips per
    multiprocessor (from bf16 up to the rows of :func:`bulk_policy`), False never, True always (ValueError where
    it cannot run).
    ValueError where the file has no such kernel or N is not a multiple of 16 r."""

    def __init__(self, w: torch.Tensor, sw: torch.Tensor, M: int, out: torch.dtype, quant: bool,
                 split: Optional[int] = None, shape: Optional[tuple[int, int]] = None, w16: Optional[str] = None,
                 r: Optional[int] = None, nt: Optional[int] = None, bulk: Optional[bool] = None):
        packed = shape is not None  # w, sw from pack_a8w8 of an (N, K) = shape weight
        auto, r_arg = split is None and r is None, r
        N, K = shape if packed else w.shape
        if M <= 0:
            raise ValueError(f"a8w8-mma takes M >= 1, got M={M}")
        check_shape(N, K, "a8w8-mma")  # (gridDim.y: N / (16 r) strip groups, r >= 1)
        if w16 is not None and not (packed and quant and w16 in ("e4m3", "e5m2")):
            raise ValueError(f"the W8A16 kernel takes bf16 activations and a packed E4M3 / E5M2 weight; got "
                             f"w16={w16!r}, quant={quant}, packed={packed}")
        if r is None:
            r = strips_per_warp(N, M, quant, packed) if w16 is None else (1 if M <= W16_R1_MAX_M else max(
                r for r in (1, 2) if N % (16 * r) == 0))
        elif r not in ((1, 2) if w16 is not None else KERNEL_R["p" if packed else ""]) or N % (16 * r):
            raise ValueError(f"a8w8-mma has no kernel of {r} strips a warp for this call (N={N})")
        if nt is None:
            nt = 2 if w16 is not None and r == 2 and W16_R1_MAX_M < M <= W16_NT2_MAX_M else 1
        elif nt not in (1, 2) or (nt == 2 and (w16 is None or r != 2)):
            raise ValueError(f"a8w8-mma has no kernel of {nt} token tiles a block at r={r} (w16={w16!r})")
        dev = w.device
        idx = _index(dev)
        self.r, self.nt = r, nt
        sms = sm_count(idx)
        fits = bulk_fits(N, K, M, quant, packed, w16, r_arg, nt, split)
        if bulk and (not fits or bulk_unavailable(idx) is not None):
            raise ValueError(f"the bulk-copy a8w8 kernel takes a packed weight, one strip a warp, M <= {BULK_MAX_M}, "
                             f"MXFP8 codes or bf16 rows of at most {BULK_X_SMEM} bytes quantized, on sm_90 "
                             f"({bulk_unavailable(idx) or 'this call does not fit'})")
        self.bulk = bool(bulk) or (bulk is None and auto and fits and bulk_policy(N, M, quant, sms)
                                   and bulk_unavailable(idx) is None)
        name = f"mxfp8_a8w8{'p' if packed else ''}_r{self.r}_{_OUT_NAMES[out]}{'_bf16in' if quant else ''}"
        if w16 is not None:
            name = f"mxfp8_w16p_r{self.r}{'_nt2' if nt == 2 else ''}_{_OUT_NAMES[out]}_{w16}"
        self.shared = 0  # dynamic shared memory bytes of a launch
        if self.bulk:
            self.r = r = 1
            name = f"mxfp8_a8w8p_bulk_{_OUT_NAMES[out]}{'_bf16in' if quant else ''}"
            self.shared = -(-(M * (K + K // 32) if quant else 0) // 16) * 16  # (x's codes and scales)
        self.kernel = _bulk_x_kernel(name, idx) if self.bulk and quant else _kernel(name, idx, self.bulk)
        self.w, self.sw, self.N, self.K, self.M, self.out, self.quant = w, sw, N, K, M, out, quant
        groups, strips = -(-M // (8 * nt)), N // (16 * self.r)
        self.block = 160 if self.bulk else 128  # (bulk: 4 consumer warps and a producer)
        if self.bulk:  # persistent blocks along y, each looping over strips; no split along K
            split = 1
            strips = min(strips, BULK_BLOCKS_PER_SM * sms)
        elif split is None:
            if w16 is not None and (self.r == 1 or nt == 2):
                split = split_w16(groups * strips, K, sms, nt)
            else:
                split = split_quant(groups * strips, K, sms) if quant else split_k(groups * strips, K, 8, sms)
        self.split = max(1, min(int(split), K // 64))
        self.ws = self.cnt = None
        self.split_fallback = False  # (unsplit for a capture that found no buffers: not to be kept)
        if self.split > 1:  # (kept with the weight, per launch: split_buffers)
            bufs = split_buffers(w, ("a8w8", name, M, self.split), groups * strips * self.split * self.r * nt * 128,
                                 groups * strips)
            if bufs is None:
                self.split, self.split_fallback = 1, True
            else:
                self.ws, self.cnt = bufs
        self.grid = (groups, strips, self.split)
        self.launch = None  # bound on the first call

    def __call__(self, x: torch.Tensor, xs: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: bf16 [M, K] (``quant``) or E4M3 codes uint8 [M, K] with scales ``xs`` uint8 [M, K / 32] (rows as
        :func:`x_ok` says; xs contiguous rows, 2-byte aligned); bias float32 or bf16 [N] contiguous
        (:func:`mxkit.kernels.matmul_details._mma_decode.bias_flag`) or None; y: the
        output, contiguous, M x N elements (allocated when None). Returns y."""
        if y is None:
            y = torch.empty(self.M, self.N, device=x.device, dtype=self.out)
        return self.into(x, x.stride(0), xs, 0 if xs is None else xs.stride(0), bias, y)

    def into(self, x: torch.Tensor, ldx: int, xs: Optional[torch.Tensor], ldxs: int, bias: Optional[torch.Tensor],
             y: torch.Tensor) -> torch.Tensor:
        """The launch writing ``y`` (M x N contiguous, any shape of that many elements) from the M rows of ``ldx``
        elements at ``x.data_ptr()`` (scales: rows of ``ldxs`` bytes at ``xs``), as :meth:`__call__`. Returns y.
        The bound launch carries ``ld`` = (ldx, ldxs, the bias flag)."""
        ld = (ldx, ldxs, bias_flag(bias))
        launch = self.launch
        if launch is None or ld != launch.ld:
            # (made whole before it is published: a thread that reads self.launch sees a launch and its ld together)
            launch = self.kernel.bind((
                x, xs, self.w, self.sw, bias, y, self.ws, self.cnt, ctypes.c_int(self.M), ctypes.c_int(self.N),
                ctypes.c_int(self.K), ctypes.c_longlong(ld[0]), ctypes.c_longlong(ld[1]),
                ctypes.c_longlong(self.N), ctypes.c_int(ld[2])))
            launch.grid, launch.block, launch.ld, launch.shared = self.grid, self.block, ld, self.shared
            self.launch = launch
        launch.run(x, xs, self.w, self.sw, bias, y)
        return y


def grouped_w16_kernel_name(activation: Optional[str], elem: str) -> str:
    """The ``mma_a8w8.cu`` entry of a :func:`grouped_w16` launch (``activation`` None: the down GEMM)."""
    return f"mxfp8_w16_grouped_{activation or 'down'}_{elem}"


def grouped_w16(x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, elem: str, N: int, K: int, ids: torch.Tensor,
                eids: torch.Tensor, n_valid: int, top_k: int, *, gather: bool, bias: Optional[torch.Tensor],
                activation: Optional[str], rw: Optional[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """One grouped (MoE expert) W8A16 GEMM of ``mma_a8w8.cu``'s ``mxfp8_w16_grouped_*`` kernels (the contract is
    beside ``mxfp8_w16_grouped``): x bf16 [*, K] (rows 16-byte aligned); the experts as stored, codes ``w`` uint8
    [E, N, K] and plain scales ``sw`` uint8 [E, N, K / 32] of element format ``elem`` ("e4m3" / "e5m2"), no NaN /
    Inf code (the caller checks); ids / eids int32 of ``align_device`` with blocks of 8; bias float32 [E, N] or
    None; activation "swiglu_gpt_oss" (rows interleaved) / "swiglu" ([gate; up] halves) with gather and bf16
    ``out`` of N / 2 columns, or None (the down GEMM: float32 ``out`` of N columns, rw float32 [n_valid], no
    gather). Writes the valid rows of ``out`` and returns it. ValueError for shapes or operands the kernels do not
    take."""
    if activation not in ("swiglu_gpt_oss", "swiglu", None) or (activation is not None) != gather \
            or (activation is None) != (rw is not None) or elem not in ("e4m3", "e5m2"):
        raise ValueError("grouped_w16: an activation (swiglu_gpt_oss / swiglu) goes with gather and bf16 out, rw with "
                         f"the down GEMM; elem e4m3 / e5m2 (got {elem!r})")
    rows = 32 if activation == "swiglu" else 16  # weight rows a block
    if N % rows or K % 64 or N // rows > 65535 or w.dim() != 3 or tuple(w.shape[1:]) != (N, K) \
            or tuple(sw.shape) != (w.shape[0], N, K // 32):
        raise ValueError(f"grouped_w16 takes codes [E, N, K] and scales [E, N, K / 32] with N % {rows} == 0, "
                         f"K % 64 == 0; got {tuple(w.shape)} / {tuple(sw.shape)} for N={N}, K={K}")
    if not (w.is_contiguous() and sw.is_contiguous() and w.dtype == sw.dtype == torch.uint8
            and w.data_ptr() % 8 == 0 and sw.data_ptr() % 2 == 0 and x_ok(x, True) and x.dtype == torch.bfloat16):
        raise ValueError("grouped_w16: contiguous uint8 codes (8-byte aligned) and scales, and bf16 x rows "
                         "16-byte aligned with unit stride along K")
    k = _kernel(grouped_w16_kernel_name(activation, elem), _index(x.device))
    k((eids.numel(), N // rows), 128, (x, w, sw, bias, rw, out, ids, eids, ctypes.c_int(N), ctypes.c_int(K),
                                      ctypes.c_int(n_valid), ctypes.c_int(top_k), ctypes.c_longlong(x.stride(0)),
                                      ctypes.c_longlong(out.stride(0))))
    return out


def quantize_probe(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's activation quantization alone (``mxfp8_quantize_probe``, the device function the _bf16in
    kernels run): x bf16 [rows, K] (K % 32 == 0, rows 16-byte aligned) -> (codes uint8 [rows, K], scales uint8
    [rows, K / 32]), for the byte-exact tests against :func:`mxkit.quantize`."""
    rows, K = x.shape
    if x.dtype != torch.bfloat16 or K % 32 or not x_ok(x, True):
        raise ValueError("quantize_probe takes bf16 rows [rows, K], K % 32 == 0, 16-byte aligned")
    q = torch.empty(rows, K, dtype=torch.uint8, device=x.device)
    s = torch.empty(rows, K // 32, dtype=torch.uint8, device=x.device)
    k = _kernel("mxfp8_quantize_probe", _index(x.device))
    k((K // 32, -(-rows // 8)), 32, (x, q, s, ctypes.c_int(rows), ctypes.c_int(K), ctypes.c_longlong(x.stride(0))))
    return q, s
