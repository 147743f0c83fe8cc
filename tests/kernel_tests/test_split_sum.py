"""The split-K reduction kernel (``kernels/matmul_details/_split_sum.py``) against its reference twin, byte for
byte: random partials of 1-8 planes with and without a bias (float32 or bf16) into bfloat16 / float16 / float32,
plus crafted values (bf16 / fp16 rounding ties, sums past the output's range, +-inf, NaN, -0.0 + -0.0, float32
denormals). On the GPU every output dtype; under the CPU interpreter float16 and float32 only (its float32 -> bfloat16
conversion truncates, where the GPU's rounds to nearest even), NaN there to NaN positions only (PyTorch's CPU
conversion writes 0x7fc0, the GPU's, like the kernel's, its own canonical NaN)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import DEV, RUN_GPU, SKIP_REASON_CUDA, interpreted_rng, run_interpreted

from mxkit.kernels.matmul_details._split_sum import split_sum, split_sum_reference

OUTS = (torch.bfloat16, torch.float16, torch.float32)


def _crafted(S: int, N: int) -> torch.Tensor:
    """[S, 4, N] partials whose sums hit the rounding edges of the outputs (N >= 16)."""
    nan, inf = float("nan"), float("inf")
    part = torch.zeros(S, 4, N)
    part[0, 0, :8] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11,  # ties
                                   3.4e38, 65504.0 + 16, 2 ** -133, -0.0])
    if S > 1:
        part[1, 0, 4:8] = torch.tensor([3.4e38, 16.0, 2 ** -133, -0.0])  # float32 overflow, fp16 past max, denormals
    part[0, 1, :4] = torch.tensor([inf, -inf, nan, 1.0])
    part[S - 1, 1, 4:8] = torch.tensor([-inf, nan, 2.0, -2.0])
    part[:, 2] = torch.linspace(-3, 3, N)  # random-looking rows below
    part[:, 3] = 2.0 ** torch.arange(-60, -60 + N).float()[None, :] * (1 - 2 * (torch.arange(S)[:, None] % 2))
    return part


def _cases(g: torch.Generator):
    for S in (1, 2, 3, 4, 8):
        for M, N in ((1, 16), (7, 1000), (64, 2880)):  # a partial block; several programs
            part = torch.randn(S, M, N, generator=g) * 2.0 ** torch.randint(-20, 20, (S, M, 1), generator=g)
            bias = torch.randn(N, generator=g) * 4
            yield f"S={S} {M}x{N}", part, None
            yield f"S={S} {M}x{N} bias", part, bias
            yield f"S={S} {M}x{N} bf16 bias", part, bias.to(torch.bfloat16)
        yield f"S={S} crafted", _crafted(S, 24), None
        yield f"S={S} crafted bias", _crafted(S, 24), torch.linspace(-1, 1, 24)
    yield "no rows", torch.randn(3, 0, 16, generator=g), None


def check(part, bias, what, device, nan_bits: bool, outs=OUTS):
    part = part.to(device)
    bias = bias.to(device) if bias is not None else None
    for out in outs:
        ref = split_sum_reference(part, bias, out)
        got = split_sum(part, bias, out)
        assert got.shape == ref.shape and got.dtype == out and got.is_contiguous(), what
        gn, rn = torch.isnan(got.float()), torch.isnan(ref.float())
        assert torch.equal(gn, rn), f"{what} {out}: NaN positions differ"
        if not nan_bits:
            got, ref = got.masked_fill(gn, 0), ref.masked_fill(rn, 0)
        gb, rb = got.cpu().view(torch.uint8), ref.cpu().view(torch.uint8)
        assert torch.equal(gb, rb), f"{what} {out}: bytes differ at {(got != ref).nonzero()[:8].tolist()}"


def interpreted_checks():
    from mxkit.kernels.matmul_details._split_sum import _split_sum_kernel

    g = interpreted_rng(_split_sum_kernel)
    n = 0
    for what, part, bias in _cases(g):
        check(part, bias, what, "cpu", nan_bits=False, outs=(torch.float16, torch.float32))
        n += 1
    print(f"interpreter checks passed: {n}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="runs itself under the interpreter")
def test_kernel_under_the_interpreter():
    run_interpreted(__file__, "interpreted_checks")


def test_reference_adds_in_order():
    """float32 addition is not associative: (2^24 + 1) + 1 = 2^24 in order, 2^24 + 2 the other way."""
    part = torch.tensor([2.0 ** 24, 1.0, 1.0]).view(3, 1, 1)
    assert split_sum_reference(part, out=torch.float32).item() == 2.0 ** 24
    assert split_sum_reference(part.flip(0).contiguous(), out=torch.float32).item() == 2.0 ** 24 + 2


@pytest.mark.parametrize("bad, match", [
    (lambda: (torch.randn(2, 3, 4, dtype=torch.float64), None, torch.bfloat16), "float32"),
    (lambda: (torch.randn(3, 4), None, torch.bfloat16), r"\[S, M, N\]"),
    (lambda: (torch.randn(2, 4, 3).transpose(1, 2), None, torch.bfloat16), "contiguous"),
    (lambda: (torch.randn(0, 3, 4), None, torch.bfloat16), "S >= 1"),
    (lambda: (torch.randn(2, 3, 4), torch.randn(5), torch.bfloat16), "bias"),
    (lambda: (torch.randn(2, 3, 4), torch.randn(4, dtype=torch.float16), torch.bfloat16), "bias"),
    (lambda: (torch.randn(2, 3, 4), torch.randn(8)[::2], torch.bfloat16), "bias"),
    (lambda: (torch.randn(2, 3, 4), None, torch.int8), "out"),
])
def test_bad_input_raises(bad, match):
    part, bias, out = bad()
    for fn in (split_sum, split_sum_reference):
        with pytest.raises(ValueError, match=match):
            fn(part, bias, out)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs CPU tensors")
def test_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match="CUDA"):
        split_sum(torch.randn(2, 3, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not RUN_GPU, reason=SKIP_REASON_CUDA)
def test_gpu_split_sum_matches_the_reference(rng, poison):
    for what, part, bias in _cases(rng):
        check(part, bias, what, DEV, nan_bits=DEV == "cuda", outs=OUTS if DEV == "cuda" else OUTS[1:])
    # planes of more than 2^31 elements (MN an int64 argument; 4 MN past 2^33): the last rows checked
    if DEV == "cuda" and torch.cuda.get_device_properties(0).total_memory > 40 << 30:
        part = torch.randn(5, 2 ** 14, 2 ** 15 + 16, device="cuda")  # 10.7 GB
        got = split_sum(part, None, torch.float32)
        ref = split_sum_reference(part[:, -2:].contiguous(), None, torch.float32)
        assert torch.equal(got[-2:], ref)
