"""The tensor-core decode GEMM (``decode-mma``): bf16 activations x an MXFP4 weight for M <= 16, a CUDA C++
kernel (``mma_decode.cu``, shipped as PTX) launched through the driver API.

:func:`pack_mma` rearranges an MXFP4 weight once into the layout the kernel reads (each lane's A-fragment
codes of ``mma.sync.m16n8k16`` in one 16-byte load; the layout is spelled out in ``mma_decode.cu``), and
:func:`unpack_mma` is its inverse, for the tests. :class:`MmaDecode` launches it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Optional

import torch

PTX = Path(__file__).with_name("mma_decode.ptx")
SOURCE = Path(__file__).with_name("mma_decode.cu")
MAX_M = 16
WARPS = 8
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _nibbles(qdata: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] (element 2i in byte i's low nibble) -> codes uint8 [N, K]."""
    return torch.stack([qdata & 0xF, qdata >> 4], dim=-1).flatten(-2)


def pack_mma(qdata: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 bytes ``qdata`` uint8 [N, K / 2] and E8M0 ``scale`` uint8 [N, K / 32] (rowwise, K along the
    last axis; N % 16 == 0, K % 64 == 0) -> (q int32 [N / 16, K / 64, 32, 4], s int32 [N / 16, K / 64, 8]),
    the kernel's layout (``mma_decode.cu``): same codes and scales, rearranged. ValueError on other shapes."""
    N, K = qdata.shape[0], qdata.shape[1] * 2
    if qdata.dim() != 2 or N % 16 or K % 64 or tuple(scale.shape) != (N, K // 32):
        raise ValueError(f"pack_mma needs qdata [N, K/2] and scale [N, K/32] with N % 16 == 0 and K % 64 == 0; "
                         f"got {tuple(qdata.shape)} and {tuple(scale.shape)}")
    # column = 64 tile + 32 b + 8 t + 4 s + 2 kh + e; row = 16 r + 8 h + g; k-step j = 2 b + s
    c = _nibbles(qdata).view(N // 16, 2, 8, K // 64, 2, 4, 2, 2, 2)  # r, h, g, tile, b, t, s, kh, e
    c = c.permute(0, 3, 2, 5, 4, 6, 8, 1, 7)                          # r, tile, g, t, b, s, e, h, kh
    c = c.reshape(N // 16, K // 64, 32, 4, 4, 2)                      # ..., lane, j, byte (e, h), nibble kh
    q = (c[..., 0] | (c[..., 1] << 4)).contiguous().view(torch.int32).squeeze(-1)
    s = scale.view(N // 16, 2, 8, K // 64, 2).permute(0, 3, 2, 1, 4)  # r, tile, g, h, block
    return q.contiguous(), s.contiguous().view(N // 16, K // 64, 8, 4).view(torch.int32).squeeze(-1)


def unpack_mma(q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_mma`: (qdata uint8 [N, K / 2], scale uint8 [N, K / 32])."""
    R, T = q.shape[0], q.shape[1]
    b = q.contiguous().view(torch.uint8).view(R, T, 8, 4, 2, 2, 2, 2)  # r, tile, g, t, b, s, e, h (bytes)
    c = torch.stack([b & 0xF, b >> 4], dim=-1)                          # ..., kh
    c = c.permute(0, 7, 2, 1, 4, 3, 5, 8, 6).reshape(R * 16, T * 64)    # r, h, g, tile, b, t, s, kh, e
    qdata = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
    sb = s.contiguous().view(torch.uint8).view(R, T, 8, 2, 2).permute(0, 3, 2, 1, 4)  # r, h, g, tile, block
    return qdata, sb.reshape(R * 16, T * 2).contiguous()


def shape_ok(N: int, K: int) -> bool:
    return N % 16 == 0 and K % 64 == 0 and N > 0 and K > 0


@functools.lru_cache(maxsize=None)
def available(device_index: int) -> Optional[str]:
    """None when the kernel can run on CUDA device ``device_index``, else the reason it cannot (no PTX, a GPU
    older than sm_80, the driver refusing the module, ``MXKIT_MMA_DECODE=0``)."""
    if os.environ.get("MXKIT_MMA_DECODE", "1") == "0":
        return "MXKIT_MMA_DECODE=0"
    if not PTX.exists():
        return f"{PTX.name} is missing"
    if torch.cuda.get_device_capability(device_index) < (8, 0):
        return "needs sm_80 or newer (mma.sync bf16)"
    from ..cuda_driver import CudaDriverUnavailable, load_module

    try:
        load_module(PTX, torch.device("cuda", device_index))
    except CudaDriverUnavailable as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def _kernel(name: str, device_index: int):
    from ..cuda_driver import Kernel

    return Kernel(PTX, name, torch.device("cuda", device_index))


class MmaDecode:
    """One prepared launch: weight (q, s) of pack_mma, N x K, M <= 16 bf16 rows in, ``out`` dtype out."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, N: int, K: int, M: int, out: torch.dtype):
        if not 0 < M <= MAX_M:
            raise ValueError(f"decode-mma takes 1 <= M <= {MAX_M}, got {M}")
        dev = q.device
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        self.kernel = _kernel(f"mxfp4_mma_decode_m{8 if M <= 8 else 16}_{_OUT_NAMES[out]}", idx)
        self.q, self.s, self.N, self.K, self.M, self.out = q, s, N, K, M, out
        self.grid = (N // 16,)
        self.scalars = (ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K))

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x bf16 [M, K] (rows 4-byte aligned, unit stride along K); bias float32 [N] or None -> [M, N]."""
        y = torch.empty(self.M, self.N, device=x.device, dtype=self.out)
        self.kernel(self.grid, 32 * WARPS, (x, self.q, self.s, bias, y) + self.scalars
                    + (ctypes.c_longlong(x.stride(0)), ctypes.c_longlong(self.N)))
        return y
