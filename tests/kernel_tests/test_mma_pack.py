"""The decode-mma layout's packing kernel (``kernels/matmul_details/_mma_pack.py``) against its PyTorch twin
(``_mma_decode.pack_mma_codes_reference``), word for word: under Triton's CPU interpreter and on the GPU."""

from __future__ import annotations

import pytest
import torch

import mxkit
from mxkit.kernels.matmul_details import _mma_decode
from mxkit.kernels.matmul_details._mma_decode import pack_mma, unpack_mma
from mxkit.packed import partial_stats_host

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


PACK_CASES = [(16, 64), (48, 192), (32, 2880), (160, 4096), (16, 576)]  # tiles past a program's 8; odd counts


def _check_pack_kernel(device: str, g) -> int:
    """The packing kernel (_mma_pack.pack_mma_fused) writes pack_mma's reference codes and scale words word for
    word on random bytes (every code in every position), with and without the scale statistics, and those
    statistics are _scale_stats' (a NaN byte; every byte NaN: no extrema)."""
    from mxkit.kernels.matmul_details import _mma_pack

    for N, K in PACK_CASES:
        q = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
        sc = torch.randint(0, 256, (N, K // 32), generator=g, dtype=torch.uint8)
        sc[3, 1] = 255
        want = _mma_decode.pack_mma_codes_reference(q)
        want_s = sc.view(N // 16, 2, 8, K // 64, 2).permute(0, 3, 2, 1, 4).reshape(N // 16, K // 64, 32)
        want_s = want_s.contiguous().view(torch.int32)
        qp, sp = _mma_pack.pack_mma_fused(q.to(device), sc.to(device))
        assert torch.equal(qp.cpu(), want) and torch.equal(sp.cpu(), want_s), (N, K)
        qf, sf, part = _mma_pack.pack_mma_fused(q.to(device), sc.to(device), stats=True)
        assert torch.equal(qf.cpu(), want) and torch.equal(sf.cpu(), want_s), (N, K)
        qu, su = _mma_pack.unpack_mma_fused(qp, sp)  # the inverse kernel gives the bytes back
        assert torch.equal(qu.cpu(), q) and torch.equal(su.cpu(), sc), (N, K)
        keep = sc[sc != 255].to(torch.int32)
        assert partial_stats_host(part) == (int(keep.min()), int(keep.max()), True)
        _, _, part = _mma_pack.pack_mma_fused(q.to(device), torch.full_like(sc, 255).to(device), stats=True)
        assert partial_stats_host(part) == (255, -1, True)  # every byte NaN: no extrema (the _scale_stats fill)
        one = sc.clone()
        one[one == 255] = 254
        one[-1, -1] = 7  # the extrema in the last program, no NaN
        one[0, 0] = 250
        _, _, part = _mma_pack.pack_mma_fused(q.to(device), one.to(device), stats=True)
        assert partial_stats_host(part) == (int(one.min()), int(one.max()), False)
    return len(PACK_CASES)


def _check_pack_interpreted() -> None:
    """Runs under TRITON_INTERPRET=1 (:func:`conftest.run_interpreted`)."""
    from conftest import interpreted_rng

    from mxkit.kernels.matmul_details import _mma_pack

    g = interpreted_rng(_mma_pack._pack_mma_kernel, _mma_pack._unpack_mma_kernel)
    print(f"interpreter checks passed: {_check_pack_kernel('cpu', g)}")


def test_pack_mma_kernel_interpreted():
    from conftest import run_interpreted

    run_interpreted(__file__, "_check_pack_interpreted")


@pytest.mark.gpu
@gpu
def test_gpu_pack_mma_kernel(rng):
    assert _check_pack_kernel("cuda", rng) == len(PACK_CASES)
    w = mxkit.quantize(torch.randn(4096, 2880, device="cuda"), "mxfp4")  # pack_mma's CUDA path is the kernel
    q, s = pack_mma(w.qdata, w.scale)
    q_ref = _mma_decode.pack_mma_codes_reference(w.qdata.cpu())
    assert torch.equal(q.cpu(), q_ref) and torch.equal(unpack_mma(q, s)[1], w.scale)
    # pack_weight(act="float") on CUDA (the fused kernel and its statistics) = on the CPU (the torch twin)
    w.scale[5, 7] = 255
    gpu, cpu = mxkit.pack_weight(w, act="float"), mxkit.pack_weight(w.to("cpu"), act="float")
    assert torch.equal(gpu.mma_q.cpu(), cpu.mma_q) and torch.equal(gpu.mma_s.cpu(), cpu.mma_s)
    assert (gpu.scale_min, gpu.scale_max, gpu.has_nan) == (cpu.scale_min, cpu.scale_max, cpu.has_nan) \
        and gpu.has_nan and gpu.folded is None and gpu.special_rows.numel() == 0
