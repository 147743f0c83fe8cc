"""The small-M MXFP8 x MXFP8 GEMM (``a8w8-mma``): E4M3 codes of both operands straight into FP8 tensor cores
(``mma.sync.m16n8k32`` e4m3, sm_89+), a CUDA C++ kernel (``mma_a8w8.cu``, shipped as PTX) launched through
the driver API. Both operands are read as mxkit stores them (no repacking). The activations come as an MXFP8
MXTensor, or as bf16 rows that the kernel quantizes itself (OCP FLOOR scale, round to nearest even: the bytes
of ``mxkit.quantize(x, "mxfp8")``), so the fused call is one launch.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Optional

import torch

from ._mma_decode import split_k

PTX = Path(__file__).with_name("mma_a8w8.ptx")
SOURCE = Path(__file__).with_name("mma_a8w8.cu")
MAX_M = 64  # the kernel takes any M (blocks of 8 tokens on the grid); past this the plan stops offering it
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
UNROLL = {1: 4, 2: 2}  # tiles per warp and batch of the r1 / r2 kernels (mma_a8w8.cu's instantiations)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def available(device: torch.device) -> Optional[str]:
    """None when the kernel can run on CUDA ``device``, else why not (no PTX, a GPU older than sm_89, the
    driver refusing the module, ``MXKIT_MMA_DECODE=0``, which turns off every CUDA C++ decode kernel)."""
    return _available(_index(device))


@functools.lru_cache(maxsize=None)
def _available(device_index: int) -> Optional[str]:
    if os.environ.get("MXKIT_MMA_DECODE", "1") == "0":
        return "MXKIT_MMA_DECODE=0"
    if not PTX.exists():
        return f"{PTX.name} is missing"
    if torch.cuda.get_device_capability(device_index) < (8, 9):
        return "needs sm_89 or newer (mma.sync e4m3)"
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


def shape_ok(N: int, K: int) -> bool:
    return N % 16 == 0 and K % 64 == 0 and N > 0 and K > 0


def weight_ok(qdata: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether the kernel reads an E4M3 weight's codes [N, K] and plain scales [N, K / 32] as they are:
    row-major, codes 16-byte aligned, scales 2-byte aligned."""
    return (qdata.is_contiguous() and scale.is_contiguous() and qdata.data_ptr() % 16 == 0
            and scale.data_ptr() % 2 == 0)


def x_ok(x: torch.Tensor, quant: bool) -> bool:
    """Whether the kernel reads activations x as they are: unit stride along K, rows 16-byte (bf16) or 8-byte
    (codes) aligned."""
    return x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % (16 if quant else 8) == 0


class A8W8:
    """One prepared launch of the MXFP8 x MXFP8 kernel: weight codes ``w`` uint8 [N, K] and scales ``sw`` uint8
    [N, K / 32] (an E4M3 MXTensor's qdata / plain scale), M rows of activations, ``out`` dtype out; ``quant``:
    the activations are bf16 and the kernel quantizes them. ``split``: thread blocks along K (default
    :func:`mxkit.kernels.matmul_details._mma_decode.split_k`); with more than one, the launch owns a float32
    workspace and a counter array (one stream at a time)."""

    def __init__(self, w: torch.Tensor, sw: torch.Tensor, M: int, out: torch.dtype, quant: bool,
                 split: Optional[int] = None):
        N, K = w.shape
        if not (M > 0 and shape_ok(N, K)):
            raise ValueError(f"a8w8-mma takes M >= 1, N % 16 == 0 and K % 64 == 0; got M={M}, N={N}, K={K}")
        dev = w.device
        idx = _index(dev)
        self.r = 2 if N % 32 == 0 else 1
        self.kernel = _kernel(f"mxfp8_a8w8_r{self.r}_{_OUT_NAMES[out]}{'_bf16in' if quant else ''}", idx)
        self.w, self.sw, self.N, self.K, self.M, self.out, self.quant = w, sw, N, K, M, out, quant
        groups, strips = -(-M // 8), N // (16 * self.r)
        if split is None:
            split = split_k(groups * strips, K, 8, torch.cuda.get_device_properties(idx).multi_processor_count)
        self.split = max(1, min(int(split), K // 64))
        self.grid = (groups, strips, self.split)
        if self.split > 1:
            self.ws = torch.empty(groups * strips * self.split * self.r * 128, device=dev, dtype=torch.float32)
            self.cnt = torch.zeros(groups * strips, device=dev, dtype=torch.int32)
        else:
            self.ws = self.cnt = None
        self.launch = None  # bound on the first call
        self.ld = None

    def __call__(self, x: torch.Tensor, xs: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: bf16 [M, K] (``quant``) or E4M3 codes uint8 [M, K] with scales ``xs`` uint8 [M, K / 32] (rows as
        :func:`x_ok` says; xs contiguous rows, 2-byte aligned); bias float32 [N] contiguous or None; y: the
        output, contiguous, M x N elements (allocated when None). Returns y."""
        if y is None:
            y = torch.empty(self.M, self.N, device=x.device, dtype=self.out)
        ld = (x.stride(0), 0 if xs is None else xs.stride(0))
        launch = self.launch
        if launch is None or ld != self.ld:
            self.ld = ld
            self.launch = launch = self.kernel.bind((
                x, xs, self.w, self.sw, bias, y, self.ws, self.cnt, ctypes.c_int(self.M), ctypes.c_int(self.N),
                ctypes.c_int(self.K), ctypes.c_longlong(ld[0]), ctypes.c_longlong(ld[1]),
                ctypes.c_longlong(self.N)))
        else:
            launch.set_ptr(0, x)
            launch.set_ptr(1, xs)
            launch.set_ptr(4, bias)
            launch.set_ptr(5, y)
        launch.launch(*self.grid, 128)
        return y


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
