"""The tensor-core decode GEMM (``decode-mma``): bf16 activations x an MXFP4 weight at small M, a CUDA C++
kernel (``mma_decode.cu``, shipped as PTX) launched through the driver API.

:func:`pack_mma` rearranges an MXFP4 weight once into the layout the kernel reads (each lane's A-fragment
codes of ``mma.sync.m16n8k16`` in one 16-byte load; the layout is spelled out in ``mma_decode.cu``), and
:func:`unpack_mma` is its inverse, for the tests. :class:`MmaDecode` launches it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from pathlib import Path
from typing import Optional

import torch

from ...packed import PackedWeight
from ..cuda_driver import _raw_stream, device_index as _index, shipped_kernel, shipped_ptx_unavailable
from ..cuda_driver import sm_count as _sm_count

PTX = Path(__file__).with_name("mma_decode.ptx")
COMMON = Path(__file__).with_name("mma_common.cuh")  # included by every .cu (hashed with it in the PTX's line 1)
SOURCE = Path(__file__).with_name("mma_decode.cu")
MAX_M = 64  # the largest M this kernel takes (blocks of 16 tokens; the plan's envelope may be smaller)
WARPS = {8: 4, 16: 8}  # warps per block of the m8 / m16 kernels (mma_decode.cu's instantiations; m16n, m16ng: 4)
SMALL_PAIRS = 8  # up to this many (token, slot) pairs the grouped kernels take 2 tiles a batch (_u2; same bits),
#                 and the MoE decode path runs one block per pair without the sort (pairs_mma)
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _nibbles(qdata: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] (element 2i in byte i's low nibble) -> codes uint8 [N, K]."""
    return torch.stack([qdata & 0xF, qdata >> 4], dim=-1).flatten(-2)


# bit positions of code bits (m, e0, e1, sign) of the lane word's 8 elements, pair p = h + 2 kh (row g + 8h,
# fragment column pair kh), half e (column +e): mma_decode.cu's table
BITS = {(0, 0): (6, 7, 8, 15), (0, 1): (22, 23, 24, 31), (1, 0): (3, 4, 5, 12), (1, 1): (19, 20, 21, 28),
        (2, 0): (0, 1, 2, 9), (2, 1): (16, 17, 18, 25), (3, 0): (10, 11, 13, 14), (3, 1): (26, 27, 29, 30)}


def pack_mma(qdata: torch.Tensor, scale: torch.Tensor, *, stats: bool = False) -> tuple:
    """MXFP4 bytes ``qdata`` uint8 [N, K / 2] and E8M0 ``scale`` uint8 [N, K / 32] (rowwise, K along the
    last axis; N % 16 == 0, K % 64 == 0) -> (q int32 [N / 16, K / 64, 32, 4], s int32 [N / 16, K / 64, 8]),
    the kernel's layout (``mma_decode.cu``): same codes and scales, rearranged. ValueError on other shapes.
    ``stats``: a third item, the per-program partials of the scale statistics the packing kernel made on the
    way (int32 [P, 3], see :func:`._mma_pack.pack_mma_fused`; :func:`mxkit.packed.partial_stats_host` reduces them), or
    None where the PyTorch path ran (the caller computes them)."""
    N, K = qdata.shape[0], qdata.shape[1] * 2
    if qdata.dim() != 2 or N % 16 or K % 64 or tuple(scale.shape) != (N, K // 32):
        raise ValueError(f"pack_mma needs qdata [N, K/2] and scale [N, K/32] with N % 16 == 0 and K % 64 == 0; "
                         f"got {tuple(qdata.shape)} and {tuple(scale.shape)}")
    if kernel_packs(qdata, scale):  # one Triton kernel (its twin: below)
        from ._mma_pack import pack_mma_fused

        return pack_mma_fused(qdata, scale, stats)
    q = pack_mma_codes_reference(qdata)
    s = scale.view(N // 16, 2, 8, K // 64, 2).permute(0, 3, 2, 1, 4)  # r, tile, g, h, block
    s = s.contiguous().view(N // 16, K // 64, 8, 4).view(torch.int32).squeeze(-1)
    return (q, s, None) if stats else (q, s)


def kernel_packs(qdata: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether :func:`pack_mma` runs its Triton kernel (``_mma_pack``): CUDA, contiguous, 4-byte aligned codes."""
    return (qdata.is_cuda and scale.is_cuda and qdata.is_contiguous() and scale.is_contiguous()
            and qdata.data_ptr() % 4 == 0)


def pack_mma_codes_reference(qdata: torch.Tensor) -> torch.Tensor:
    """The codes of :func:`pack_mma` in PyTorch (int32 [N / 16, K / 64, 32, 4]; chunks of 4M codes): the twin of
    :func:`._mma_pack.pack_mma_fused`'s codes, and the CPU path."""
    N, K = qdata.shape[0], qdata.shape[1] * 2
    q = torch.empty(N // 16, K // 64, 32, 4, dtype=torch.int32, device=qdata.device)
    step = max(16, (1 << 22) // K // 16 * 16)  # rows per chunk: 4M codes, int64 temporaries of 32 MB
    for r0 in range(0, N, step):
        q[r0 // 16:(r0 + step) // 16] = _pack_words(qdata[r0:r0 + step])
    return q


def _pack_words(qdata: torch.Tensor) -> torch.Tensor:
    """The lane words of rows qdata [n, K / 2] (n % 16 == 0): int32 [n / 16, K / 64, 32, 4]."""
    n, K = qdata.shape[0], qdata.shape[1] * 2
    # column = 64 tile + 32 b + 8 t + 4 s + 2 kh + e; row = 16 r + 8 h + g; k-step j = 2 b + s
    c = _nibbles(qdata).view(n // 16, 2, 8, K // 64, 2, 4, 2, 2, 2)  # r, h, g, tile, b, t, s, kh, e
    c = c.permute(0, 3, 2, 5, 4, 6, 7, 1, 8).to(torch.int64)          # r, tile, g, t, b, s, kh, h, e
    c = c.reshape(n // 16, K // 64, 32, 4, 4, 2)                      # ..., lane, j, pair p = h + 2 kh, half e
    # each code's bits at their positions: one table of 8 elements x 16 codes (disjoint bits: sum = or)
    idx = c.flatten(-2) + 16 * torch.arange(8, device=c.device)
    word = _word_table(c.device)[idx].sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


@functools.lru_cache(maxsize=None)
def _word_table(device: torch.device) -> torch.Tensor:
    """int64 [8 * 16]: entry 16 (2p + e) + code = that code's bits placed where BITS puts element (p, e)."""
    t = torch.zeros(8, 16, dtype=torch.int64)
    for (p, e), pos in BITS.items():
        for code in range(16):
            t[2 * p + e, code] = sum(((code >> bit) & 1) << at for bit, at in enumerate(pos))
    return t.flatten().to(device)


def unpack_mma(q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_mma`: (qdata uint8 [N, K / 2], scale uint8 [N, K / 32]); on CUDA one Triton
    kernel (``_mma_pack.unpack_mma_fused``; this body is its twin)."""
    if q.is_cuda and s.is_cuda and q.is_contiguous() and s.is_contiguous():
        from ._mma_pack import unpack_mma_fused

        return unpack_mma_fused(q, s)
    return unpack_mma_reference(q, s)


def unpack_mma_reference(q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`unpack_mma` in PyTorch (the CPU path, and the twin of its kernel)."""
    R, T = q.shape[0], q.shape[1]
    word = q.to(torch.int64) & 0xFFFFFFFF                                # r, tile, lane, j
    c = torch.zeros(*word.shape, 4, 2, dtype=torch.int64, device=q.device)
    for (p, e), pos in BITS.items():
        for bit, at in enumerate(pos):
            c[..., p, e] |= ((word >> at) & 1) << bit
    c = c.view(R, T, 8, 4, 2, 2, 2, 2, 2)                                 # r, tile, g, t, b, s, kh, h, e
    c = c.permute(0, 7, 2, 1, 4, 3, 5, 6, 8).reshape(R * 16, T * 64).to(torch.uint8)  # r, h, g, tile, b, t, s, kh, e
    qdata = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
    sb = s.contiguous().view(torch.uint8).view(R, T, 8, 2, 2).permute(0, 3, 2, 1, 4)  # r, h, g, tile, block
    return qdata, sb.reshape(R * 16, T * 2).contiguous()


MAX_STRIPS = 65535  # CUDA's largest gridDim.y: every launch of mma_decode.cu / mma_a8w8.cu puts a strip there


def shape_ok(N: int, K: int) -> bool:
    """Whether the kernels of this file and ``mma_a8w8.cu`` take an N x K weight: 16-row strips (at most
    :data:`MAX_STRIPS`, gridDim.y: N <= 1048560) and 64-column tiles, K an int32 (the kernels' ``int K``; their
    offsets are 64-bit, so weights past 2^31 bytes are fine)."""
    return N % 16 == 0 and K % 64 == 0 and 0 < N <= 16 * MAX_STRIPS and 0 < K < 2**31


def check_shape(N: int, K: int, what: str) -> None:
    """ValueError before a launch unless :func:`shape_ok` (past MAX_STRIPS strips the driver refuses the grid)."""
    if not shape_ok(N, K):
        raise ValueError(f"{what} takes N % 16 == 0, N <= {16 * MAX_STRIPS} (gridDim.y) and K % 64 == 0; got N={N}, "
                         f"K={K}")


def rows_ok(x: torch.Tensor) -> bool:
    """Whether the kernels can read x's rows as they are: unit stride along K, rows 16-byte aligned."""
    return x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0


def available(device: torch.device) -> Optional[str]:
    """None when the kernel can run on CUDA ``device``, else the reason it cannot (no PTX, a GPU older than
    sm_80, the driver refusing the module, ``MXKIT_MMA_DECODE=0``)."""
    return shipped_ptx_unavailable(str(PTX), _index(device), (8, 0), "mma.sync bf16")


def _kernel(name: str, index: int):
    return shipped_kernel(str(PTX), name, index)


def split_k(blocks: int, K: int, mt: int, sms: int, strips: int = 1) -> int:
    """How many blocks split K, for a grid of ``blocks`` (token blocks x strip blocks of ``strips`` strips) on
    ``sms`` multiprocessors: 2 when the grid has fewer than two blocks per multiprocessor and K >= 8192 at M <= 8
    (each warp's chain of tiles is long: 4096 x 14336 went from 25.7 to 21.9 us on an H100); with 4 strips a
    block (m16n), 2 when it has fewer blocks than multiprocessors and K >= 16384 (H200: 16 x 8192 x 28672 63.6 ->
    52.7 us; 8192 x 8192 and 8192 x 4096 no faster split); else 1 (splitting the shorter K of 1024 / 2880 /
    4096 x 4096 gained at most 0.4 us or lost up to 4: measured with 1, 2, 3, 4 and 8)."""
    if strips > 1:
        return 2 if blocks < sms and K >= 16384 else 1
    return 2 if blocks < 2 * sms and K >= 8192 and mt == 8 else 1


M8_LOOPS = ("", "l", "g", "g2")  # the m8 kernels (4 warps): 4 tiles a batch in the register loop (""), 2 in the
#                                  lean loop ("l"), 4 or 2 in flight a lane in the ring loop ("g", "g2"); the same bits


def bias_flag(bias: Optional[torch.Tensor]) -> int:
    """The ``bias_bf16`` argument of the dense kernels of this file and ``mma_a8w8.cu`` for ``bias`` (float32 or
    bf16 [N], contiguous, or None): 1 for bf16, read as it is and added in float32 (the bytes of converting it to
    float32 first), else 0. ValueError for another dtype."""
    if bias is None or bias.dtype == torch.float32:
        return 0
    if bias.dtype == torch.bfloat16:
        return 1
    raise ValueError(f"the CUDA C++ GEMM kernels take a float32 or bf16 bias, got {bias.dtype}")


def dense_kernel_name(M: int, N: int, K: int, out: torch.dtype, special: bool, m8_loop: str = "",
                      sms: int = 0) -> str:
    """The ``mma_decode.cu`` entry of the dense launch for M rows of an N x K weight (m8, m8l, m8g or m8g2 by
    ``m8_loop``, one of :data:`M8_LOOPS` (:func:`mxkit.kernels.matmul_table.mma_m8_loop`), up to 8 rows, else m16,
    m16l, m16g, m16n or m16ng by :func:`m16_loop`, the ring loops up to 16 rows where ``m8_loop`` is the ring, "g",
    on a GPU of ``sms`` multiprocessors; its block's warps and strips: :func:`kernel_shape`), ``out`` dtype out,
    ``special``: the variant for scale bytes 0 / 255. The m8 kernels split K over the same 4 warps: the same
    bits. ValueError for another loop, or for "g2" (an m8 loop only: the m16 kernels have no ring of 2 of their
    own) past 8 rows."""
    if m8_loop not in M8_LOOPS:
        raise ValueError(f"decode-mma's m8 loop is one of {M8_LOOPS}, got {m8_loop!r}")
    if m8_loop == "g2" and M > 8:
        raise ValueError(f"decode-mma's ring of 2 ('g2') runs up to 8 rows, got M = {M}")
    mt = 8 if M <= 8 else 16
    loop = m16_loop(N, K, m8_loop == "g" and M <= 16, sms) if mt == 16 else m8_loop
    return f"mxfp4_mma_decode_m{mt}{loop}_{_OUT_NAMES[out]}{'_special' if special else ''}"


GROUPED_STRIPS = (1, 2, 4)  # strips a block of the grouped kernels past SMALL_PAIRS (the same bits)


def grouped_kernel_name(activation: Optional[str], n_valid: int, special: bool, strips: int = 1) -> str:
    """The ``mma_decode.cu`` entry of a grouped launch over ``n_valid`` (token, slot) pairs: 2 tiles a batch up
    to :data:`SMALL_PAIRS` (``_u2``), else 1 with ``strips`` 16-row strips a block sharing each x load (one of
    :data:`GROUPED_STRIPS`; ``_s2``, ``_s4``); ``activation`` "swiglu_gpt_oss" / "swiglu" or None (down)."""
    if strips not in GROUPED_STRIPS:
        raise ValueError(f"the grouped kernels take {GROUPED_STRIPS} strips a block, got {strips}")
    size = "_u2" if n_valid <= SMALL_PAIRS else (f"_s{strips}" if strips > 1 else "")
    return f"mxfp4_mma_grouped_{activation or 'down'}{size}{'_special' if special else ''}"


def m16_loop(N: int, K: int, ring: bool = False, sms: int = 0) -> str:
    """The m16 kernel's K loop for an N x K weight: "n" (4 warps x 2 tiles in the lean loop, 4 strips a block
    sharing each x load: N >= 8192, where 1 strip a block reads 4x the weight's bytes of x from L2; H200:
    16 x 28672 x 8192 75.0 -> 58.8 us, 64 x 8192 x 8192 85.5 -> 57.7; the bits of m8l on each 8 tokens at the same
    split of K; measured on the H200 only), "" (8 warps, 4 cp.async stages, 60 registers: the other layers with
    K <= 4096 and N > 4096, many blocks of short chains) or "l" (8 warps, the lean loop, 2 tiles a batch: the
    rest, where its fewer instructions per tile win; H100, benchmarks/decode_mma_ab.md). "" and "l" give the same
    bits. With ``ring`` (the m8 kernel takes its ring loop at this K: :func:`mxkit.kernels.matmul_table.mma_m8_loop`)
    the ring loop (2 tiles a lane in flight) replaces the lean one: "g" (8 warps) for "l", and "ng" (4 warps, 2
    strips a block sharing x) for "n" where K < 16384 (there "n" splits K: 16 x 8192 x 28672 52.4 against 56.4 us)
    and its grid fits one wave of :data:`M16NG_BLOCKS_PER_SM` blocks on each of ``sms`` multiprocessors (at 168
    registers; 16 x 14336 x 8192, 1.1 waves, 31.7 -> 37.8 us). H200, session 58
    (``benchmarks/probes/m16_ring_ab.py``): 16 x 8192^2 23.6 -> 21.3 us, 16 x 4096 x 14336 21.9 -> 19.4, 16 x 2880 x
    8192 15.2 -> 13.8, 16 x 1024 x 8192 12.4 -> 10.9; the bits of "n" and "l"."""
    if N >= 8192 and N % (16 * M16N_STRIPS) == 0:
        fits = N // (16 * M16NG_STRIPS) <= M16NG_BLOCKS_PER_SM * sms
        return "ng" if ring and K < 16384 and fits else "n"
    if K <= 4096 and N > 4096:
        return ""
    return "g" if ring else "l"


M16N_STRIPS = 4  # strips a block of the m16n kernel
M16NG_STRIPS = 2  # ... of the m16ng kernel (its ring of 2 tiles at 4 strips holds 255 registers and spills)
M16NG_BLOCKS_PER_SM = 3  # m16ng's blocks resident on a multiprocessor (168 registers x 128 threads)


def kernel_shape(M: int, N: int, K: int, ring: bool = False, sms: int = 0) -> tuple[int, int]:
    """(warps, strips) a block of the dense kernel that :func:`dense_kernel_name` picks for M rows of N x K
    (``ring``: the m8 kernel's loop is the ring; ``sms``: as :func:`m16_loop`'s)."""
    loop = m16_loop(N, K, ring and M <= 16, sms) if M > 8 else None
    if loop in ("n", "ng"):
        return 4, M16N_STRIPS if loop == "n" else M16NG_STRIPS
    return WARPS[8 if M <= 8 else 16], 1


class MmaDecode:
    """One prepared launch: weight (q, s) of pack_mma, N x K, M <= MAX_M bf16 rows in, ``out`` dtype out.
    ``special``: the weight has a scale byte 0 or 255 (the kernel variant that decodes them exactly).
    ``split``: blocks along K (default :func:`split_k`); with more than one, the launch uses a float32 workspace
    and a counter array kept with the weight for its launch shape (:func:`split_buffers`: one stream at a time for
    this launch; launches of other shapes have their own). ``m8_loop``: the m8 kernel's loop up to 8 rows, its ring
    "g" the m16 kernel's ring loops too at 9-16 rows (:func:`dense_kernel_name`; the same bits)."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, N: int, K: int, M: int, out: torch.dtype,
                 special: bool = True, split: Optional[int] = None, m8_loop: str = ""):
        if not 0 < M <= MAX_M:
            raise ValueError(f"decode-mma takes 1 <= M <= {MAX_M}, got {M}")
        check_shape(N, K, "decode-mma")
        dev = q.device
        idx = _index(dev)
        mt = 8 if M <= 8 else 16
        sms = _sm_count(idx)
        warps, sn = kernel_shape(M, N, K, m8_loop == "g", sms)
        self.block = 32 * warps
        self.kernel = _kernel(dense_kernel_name(M, N, K, out, special, m8_loop, sms), idx)
        self.q, self.s, self.N, self.K, self.M, self.out = q, s, N, K, M, out
        groups, blocks = -(-M // mt), N // 16 // sn
        if split is None:
            split = split_k(groups * blocks, K, mt, sms, sn)
        self.split = max(1, min(int(split), K // 64))
        self.ws = self.cnt = None
        self.split_fallback = False  # (unsplit for a capture that found no buffers: not to be kept)
        if self.split > 1:
            bufs = split_buffers(q, ("mma", M, out, special, m8_loop, self.split),
                                 groups * N // 16 * self.split * mt * 16, groups * blocks)
            if bufs is None:
                self.split, self.split_fallback = 1, True
            else:
                self.ws, self.cnt = bufs
        self.grid = (groups, blocks, self.split)
        self.launch = None  # bound on the first call (x's row stride is an argument)

    @classmethod
    def of(cls, b: PackedWeight, M: int, out: torch.dtype, m8_loop: str = "") -> "MmaDecode":
        """The launch for packed weight ``b`` (its ``mma_q`` / ``mma_s``; the special-scale variant when its
        scale extrema hold a byte 0 or 255)."""
        N, K = b.shape
        return cls(b.mma_q, b.mma_s, N, K, M, out, special=b.has_nan or b.scale_min == 0, m8_loop=m8_loop)

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x bf16 [M, K] (rows 16-byte aligned, unit stride along K); bias float32 or bf16 [N] contiguous (see
        :func:`bias_flag`) or None -> [M, N]."""
        return self.into(x, x.stride(0), bias, torch.empty(self.M, self.N, device=x.device, dtype=self.out))

    def into(self, x: torch.Tensor, ldx: int, bias: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """The launch writing ``y`` (M x N contiguous, any shape of that many elements) from the M rows of
        ``ldx`` elements at ``x.data_ptr()`` (16-byte aligned, ldx % 8 == 0, unit stride along K). Returns y.
        The bound launch carries ``ld`` = (ldx, :func:`bias_flag` of bias)."""
        launch = self.launch
        ld = (ldx, bias_flag(bias))
        if launch is None or ld != launch.ld:
            # (made whole before it is published: a thread that reads self.launch sees a launch and its ld together)
            launch = self.kernel.bind((x, self.q, self.s, bias, y, self.ws, self.cnt, ctypes.c_int(self.M),
                                       ctypes.c_int(self.N), ctypes.c_int(self.K), ctypes.c_longlong(ldx),
                                       ctypes.c_longlong(self.N), ctypes.c_int(ld[1])))
            launch.grid, launch.block, launch.ld = self.grid, self.block, ld
            self.launch = launch
        launch.run(x, self.q, self.s, bias, y)
        return y


# --------------------------------------------------------------------------------------------------------
# grouped (MoE experts)

def grouped_mma(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, special: bool, N: int, K: int,
                ids: torch.Tensor, eids: torch.Tensor, n_valid: int, top_k: int, *, gather: bool,
                bias: Optional[torch.Tensor], activation: Optional[str], rw: Optional[torch.Tensor],
                out: torch.Tensor, strips: int = 1) -> torch.Tensor:
    """One grouped GEMM of ``mma_decode.cu``'s ``mxfp4_mma_grouped_*`` kernels (its comment has the contract):
    x bf16 [*, K] (rows 16-byte aligned); experts (q, s) of :func:`pack_mma` on the (E * N, K) weight; ids /
    eids int32 of ``align_device`` with blocks of 8; bias float32 [E, N] or None; activation "swiglu_gpt_oss" /
    "swiglu" (rows interleaved: gate 2c, up 2c + 1; bf16 out, N / 2 columns, gather=True, no rw) or None (float32
    out, N columns, gather=False, rw float32 [n_valid]); ``strips``: 16-row strips a block past
    :data:`SMALL_PAIRS` pairs (1 where N / 16 is not a multiple; the same bits). Writes the valid rows of ``out``
    and returns it."""
    if activation not in ("swiglu_gpt_oss", "swiglu", None) or (activation is not None) != gather \
            or (activation is None) != (rw is not None):
        raise ValueError("grouped_mma: an activation (swiglu_gpt_oss / swiglu) goes with gather and bf16 out, "
                         "rw with the down GEMM")
    check_shape(N, K, "grouped_mma")
    if strips not in GROUPED_STRIPS:
        raise ValueError(f"grouped_mma takes {GROUPED_STRIPS} strips a block, got {strips}")
    if n_valid <= SMALL_PAIRS or (N // 16) % strips:
        strips = 1
    k = _kernel(grouped_kernel_name(activation, n_valid, special, strips), _index(x.device))
    k((eids.numel(), N // 16 // strips), 128, (x, q, s, bias, rw, out, ids, eids, ctypes.c_int(N), ctypes.c_int(K),
                                     ctypes.c_int(n_valid), ctypes.c_int(top_k), ctypes.c_longlong(x.stride(0)),
                                     ctypes.c_longlong(out.stride(0))))
    return out


def pairs_kernel_name(activation: Optional[str], special: bool) -> str:
    """The ``mma_decode.cu`` entry of a :func:`pairs_mma` launch (``activation`` None: the down GEMM)."""
    return f"mxfp4_mma_pairs_{activation or 'down'}{'_special' if special else ''}"


_SPLIT: dict = {}  # id(weight codes) -> (weakref to them, {launch key: (float32 workspace, int32 counters)})
_SPLIT_LOCK = threading.Lock()


def split_buffers(q: torch.Tensor, key: tuple, ws_numel: int,
                  cnt_numel: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The float32 workspace and int32 arrival counters (zero between launches: each launch's last blocks reset
    theirs) of a split-K launch (:class:`MmaDecode`, :class:`~._mma_a8w8.A8W8`) over weight codes ``q``, one
    pair per launch ``key`` (its shape and kind: as when each launch owned its own, two launches of one weight
    run on two streams at once without sharing; one launch on two streams at once is not supported). Kept while
    ``q`` lives (in a registry, not on the tensor: copies and pickles of it do not carry them; a layer holds one
    pair per split launch shape it has run, e.g. 8 pairs of ~1 MB for Llama-3-70B's down_proj at M = 9 .. 16),
    so a launch made
    again after its prepared call was dropped (the call caches empty at 64 entries: e.g. prefill lengths) finds
    the same buffers, and a CUDA graph captured with the earlier launch never points at freed memory. None during
    a CUDA-graph capture that finds no pair for ``key`` (a zero fill made there would run only inside the graph,
    leaving the counters unset for eager launches): the caller runs that launch unsplit and does not keep it
    (warm-up calls before a capture, as CUDA graphs need anyway, make the pair)."""
    with _SPLIT_LOCK:
        hit = _SPLIT.get(id(q))
        if hit is None or hit[0]() is not q:
            hit = _SPLIT[id(q)] = (weakref.ref(q), {})
            weakref.finalize(q, _drop_split, id(q), hit[1])
        pairs = hit[1]
        pair = pairs.get(key)
        if pair is None or pair[0].numel() < ws_numel or pair[1].numel() < cnt_numel:
            if q.is_cuda and torch.cuda.is_current_stream_capturing():
                return None
            if pair is not None:  # (a larger need under one key: the smaller pair kept too, a graph may hold it)
                pairs.setdefault("replaced", []).append(pair)
            pair = pairs[key] = (torch.empty(ws_numel, device=q.device, dtype=torch.float32),
                                 torch.zeros(cnt_numel, device=q.device, dtype=torch.int32))
        return pair


def _drop_split(index: int, pairs: dict) -> None:
    if _SPLIT.get(index, (None, None))[1] is pairs:
        del _SPLIT[index]


_ZERO_IDS: dict = {}  # device index -> int32 zeros (SMALL_PAIRS): the ids of swiglu_mma's one expert


def zero_ids(device: torch.device) -> Optional[torch.Tensor]:
    """int32 zeros of :data:`SMALL_PAIRS` on CUDA ``device``, made once (read only by the kernels: one per device
    serves every stream). None during a CUDA graph capture that finds none made yet (the capture would record the
    fill, not run it: eager launches would read unset memory); the caller takes another path and keeps nothing."""
    idx = _index(device)
    ids = _ZERO_IDS.get(idx)
    if ids is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        ids = _ZERO_IDS[idx] = torch.zeros(SMALL_PAIRS, dtype=torch.int32, device=device)
    return ids


def swiglu_mma(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, special: bool, N: int, K: int, ids: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    """A gated MLP's gate and up projections with SwiGLU, ``silu(gate) * up`` (float32 from the float32 sums, one
    bf16 rounding), for up to :data:`SMALL_PAIRS` rows of bf16 ``x`` (M, K): the MoE pairs kernel
    (:func:`pairs_mma`, activation "swiglu") over one expert, each row a pair. ``q`` / ``s``: the decode-mma layout
    (:func:`pack_mma`) of the MXFP4 weight (N = 2I, K) whose rows interleave gate and up (gate 0, up 0, gate 1,
    ...); ``special``: a scale byte 0 or 0xFF in it; ``ids``: int32 zeros, at least M, contiguous
    (:func:`zero_ids`). Writes and returns ``out`` bf16 (M, I)."""
    return pairs_mma(x, q, s, special, N, K, ids[: x.shape[0]], 1, 1, bias=None, activation="swiglu", rw=None,
                     out=out)


_COUNTERS: dict = {}  # (device index, raw stream, owner) -> [int32 zeros in use, the smaller ones it replaced]


def pair_counters(device: torch.device, n: int, owner: str = "pairs") -> torch.Tensor:
    """At least ``n`` int32 arrival counters for the kernels of ``owner`` ("pairs": the down GEMM of
    :func:`pairs_mma`; "router": :func:`mxkit.kernels.moe_details._route.router_gpt_oss`) on the current stream
    of ``device``: zero between launches (each launch's last blocks reset theirs), one set per owner and stream
    (two streams running at once would otherwise share them). A larger request replaces the set but keeps the old
    one alive: a CUDA graph captured with it still points there. During a CUDA graph capture that finds no set
    large enough, a set of the graph's own (its zero fill a node of the graph, run at every replay; kept alive, never
    handed to another launch): a set made and kept there would be zeroed only inside that graph, and an eager launch
    or another graph captured after it would read its unset bytes."""
    idx = _index(device)
    kept = _COUNTERS.setdefault((idx, _raw_stream(idx), owner), [])
    if not kept or kept[0].numel() < n:
        fresh = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        if torch.cuda.is_current_stream_capturing():
            _CAPTURED_COUNTERS.append(fresh)
            return fresh
        kept.insert(0, fresh)
    return kept[0]


_CAPTURED_COUNTERS: list = []  # pair_counters' sets made inside a capture: their graphs read them at every replay


def pairs_mma(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, special: bool, N: int, K: int,
              topk_ids: torch.Tensor, top_k: int, n_experts: int, *, bias: Optional[torch.Tensor],
              activation: Optional[str], rw: Optional[torch.Tensor], out: torch.Tensor,
              ws: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One GEMM of the MoE decode path without the sort, up to :data:`SMALL_PAIRS` (token, slot) pairs:
    ``mma_decode.cu``'s ``mxfp4_mma_pairs_*`` kernels, one block per pair (the contract is beside
    ``mxfp4_mma_grouped``'s PAIRS). topk_ids: the router's ids (T, top_k) or flat, int32 or int64, contiguous; an
    id outside 0 .. n_experts - 1 contributes 0. The gate_up GEMM (``activation`` "swiglu_gpt_oss" / "swiglu",
    x (T, K) gathered by pair, rows interleaved) writes h bf16 (pairs, N / 2) to ``out``. The down GEMM
    (``activation`` None, x = h, ``rw`` float32 per pair, ``ws`` float32 (pairs, N) scratch) also combines each
    token's ``top_k`` slots in order into ``out`` bf16 (T, N): the bytes of the sorted path and its combine
    kernel. Returns ``out``."""
    n = topk_ids.numel()
    if not (0 < n <= SMALL_PAIRS and topk_ids.dtype in (torch.int32, torch.int64) and topk_ids.is_contiguous()
            and (activation is None) == (rw is not None) == (ws is not None) and out.dtype == torch.bfloat16):
        raise ValueError(f"pairs_mma takes 1 to {SMALL_PAIRS} contiguous int32 / int64 ids, bf16 out, and rw with ws "
                         f"for the down GEMM (activation None)")
    check_shape(N, K, "pairs_mma")
    cnt = pair_counters(x.device, (n // top_k) * (N // 16)) if activation is None else None
    k = _kernel(pairs_kernel_name(activation, special), _index(x.device))
    k((n, N // 16), 128, (x, q, s, bias, rw, out, topk_ids, ctypes.c_int(topk_ids.dtype == torch.int64), ws, cnt,
                          ctypes.c_int(N), ctypes.c_int(K), ctypes.c_int(n), ctypes.c_int(top_k),
                          ctypes.c_int(n_experts), ctypes.c_longlong(x.stride(0)), ctypes.c_longlong(out.stride(0))))
    return out
