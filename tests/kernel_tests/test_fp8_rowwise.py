"""FP8 E4M3 rowwise quantization (``mxkit.quantize_fp8_rowwise``, the W4A8 activations): the Triton kernel
against its reference twin byte for byte (data codes and float32 scales), on crafted rows (ties, E4M3
subnormals, fp32 denormals, zeros, -0, NaN, ±Inf, the 448 clamp) and fresh random ones; the CPU runs it
under Triton's interpreter, the GPU compiled."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import DEV, RUN_GPU, SKIP_REASON_CUDA, interpreted_rng, run_interpreted

import mxkit
from mxkit.reference import quantize_fp8_rowwise_reference

_E4M3_GRID = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def crafted_rows(g: torch.Generator, K: int) -> torch.Tensor:
    """float32 [R, K]: special rows first, then random rows of magnitudes 2^-140 .. 2^100."""
    fin = _E4M3_GRID[torch.isfinite(_E4M3_GRID) & (_E4M3_GRID >= 0)].unique()
    mids = (fin[1:] + fin[:-1]) / 2  # ties between neighbouring E4M3 values (exact in fp32)
    rows = []

    def row(vals):
        vals = torch.as_tensor(vals, dtype=torch.float32).flatten()
        out = vals[torch.randint(len(vals), (K,), generator=g)]
        return out * torch.where(torch.rand(K, generator=g) < 0.5, -1.0, 1.0)

    for k in (-130, -20, 0, 7, 90):  # amax 448 * 2^k: scale 2^k exactly, so the elements are ties at 2^k
        r = row(torch.cat([mids, mids + mids * 2.0**-20, fin])) * 2.0**k
        r[0] = 448.0 * 2.0**k
        rows.append(r)
    rows.append(torch.zeros(K))
    rows.append(-torch.zeros(K))
    r = row(fin)
    r[K // 2] = float("nan")
    rows.append(r)
    r = row(fin)
    r[K // 3] = -float("nan")
    rows.append(r)
    r = row(fin)
    r[1 % K] = float("inf")
    rows.append(r)
    r = row(fin)
    r[0] = -float("inf")
    rows.append(r)
    rows.append(row([1e-45, 3e-44, 1e-39, 1e-38]))  # fp32 denormals
    rows.append(row([1e-45, 0.0]))  # amax / 448 underflows to 0: the scale is 2^-149, the zeros stay 0
    rows.append(row([1e-42, -3e-43, 0.0]))  # amax / 448 a denormal under 2^-149 too
    rows.append(row([448.0 * 1.0000001, 1.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11]))  # clamp, subnormals, underflow
    for _ in range(6):
        rows.append(torch.randn(K, generator=g) * 2.0 ** float(torch.randint(-140, 100, (1,), generator=g)))
    return torch.stack(rows)


def check(x: torch.Tensor, what: str, device: str = DEV) -> None:
    got = mxkit.quantize_fp8_rowwise(x.to(device), backend="triton")
    data, scale = quantize_fp8_rowwise_reference(x.cpu())
    assert got.data.shape == x.shape and got.scale.shape == (*x.shape[:-1], 1), what
    assert torch.equal(got.data.cpu().view(torch.uint8), data.view(torch.uint8)), \
        f"{what}: data codes differ at {(got.data.cpu().view(torch.uint8) != data.view(torch.uint8)).nonzero()[:8].tolist()}"
    assert torch.equal(got.scale.cpu().view(torch.int32), scale.view(torch.int32)), f"{what}: scales differ"


def _cases(g: torch.Generator):
    for K in (64, 2880, 8200):  # several rows a program; one pass; two passes over a row of 3 tiles
        base = crafted_rows(g, K)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            yield f"K={K} {dtype}", base.to(dtype)
    yield "3-D", (torch.randn(2, 3, 96, generator=g) * 5).to(torch.bfloat16)
    yield "no rows", torch.randn(0, 64, generator=g)
    yield "K = 0", torch.randn(4, 0, generator=g)


def test_reference_rule_on_hand_values():
    """The rule itself: scale = amax / 448; ties to even; NaN canonical; a row of zeros has scale 1."""
    x = torch.tensor([[448.0, 1.0, 2.125, -0.0], [0.0, -0.0, 0.0, 0.0], [1.0, float("-nan"), 2.0, 3.0],
                      [float("inf"), 1.0, -2.0, 0.0]])
    data, scale = quantize_fp8_rowwise_reference(x)
    assert scale[:, 0].tolist()[:2] == [1.0, 1.0] and scale.view(torch.int32)[2, 0] == 0x7FC00000
    assert scale[3, 0] == float("inf")
    codes = data.view(torch.uint8)
    assert codes[0].tolist() == [0x7E, 0x38, 0x40, 0x80]  # 2.125: the tie of 2.0 and 2.25 goes to even 2.0
    assert codes[2].tolist() == [0x7F] * 4
    assert codes[3].tolist() == [0x7F, 0x00, 0x80, 0x00]
    # a row of fp32 denormals whose amax / 448 underflows to 0: the scale is 2^-149 (not 0, whose 0 / 0 was NaN)
    data, scale = quantize_fp8_rowwise_reference(torch.tensor([[2.0**-149, 0.0, -(2.0**-148), -0.0]]))
    assert scale.view(torch.int32).item() == 1
    assert data.view(torch.uint8)[0].tolist() == [0x38, 0x00, 0xC0, 0x80]


def interpreted_checks():
    from mxkit.kernels.quantize_details._fp8_rowwise import _fp8_rowwise_kernel

    g = interpreted_rng(_fp8_rowwise_kernel)
    n = 0
    for what, x in _cases(g):
        check(x, what, "cpu")
        n += 1
    print(f"interpreter checks passed: {n}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="runs itself under the interpreter")
def test_kernel_under_the_interpreter():
    run_interpreted(__file__, "interpreted_checks")


@pytest.mark.gpu
@pytest.mark.skipif(not RUN_GPU, reason=SKIP_REASON_CUDA)
def test_gpu_fp8_rowwise_matches_the_reference(rng, poison):
    for what, x in _cases(rng):
        check(x, what)
    x = torch.randn(3000, 4096, generator=rng) * torch.logspace(-30, 30, 3000, base=2.0)[:, None]
    check(x.to(torch.bfloat16), "3000x4096 bf16 random")


def test_traces_under_torch_compile_fullgraph(rng):
    """torch.compile(fullgraph=True) traces mxkit.quantize_fp8_rowwise (its reference ops) with the eager bytes."""
    x = (torch.randn(6, 96, generator=rng) * 3).to(torch.bfloat16)
    got = torch.compile(lambda t: mxkit.quantize_fp8_rowwise(t), fullgraph=True, backend="eager")(x)
    data, scale = quantize_fp8_rowwise_reference(x)
    assert torch.equal(got.data.view(torch.uint8), data.view(torch.uint8)) and torch.equal(got.scale, scale)
