#!/usr/bin/env python
"""Generate tests/golden/torchao_mx.npz: a small fixed input set and torchao's MX outputs for it.

    python scripts/make_golden.py            # writes tests/golden/torchao_mx.npz and prints a summary

Needs torchao (its ``to_mx`` runs on CPU). tests/test_torchao_parity.py checks mxkit against this file even
where torchao is not installed. Contents (numpy arrays, all small):

* ``x_f32``        float32 (32, 256): the input, 256 blocks of 32 along the last axis.
* ``x_bf16_bits``  uint16 (32, 256): the same values rounded to bfloat16 (RNE), as raw bits.
* ``{dtype}/{fmt}/{mode}/scale``  uint8 (32, 8): torchao's E8M0 scale bytes.
* ``{dtype}/{fmt}/{mode}/codes``  uint8 (32, 256): torchao's element codes, one per byte (FP4 unpacked from
  torchao's packed bytes, low nibble = even element; FP6 as torchao returns them, unpacked).
* ``meta``  a JSON string: versions, seed, command, and the input recipe.

The input avoids the blocks where mxkit intentionally differs from torchao (see test_torchao_parity.py):
every non-zero block has amax in [2^-60, 2^60] (no scale byte 0, no fp32 denormals), nothing is NaN/Inf, and
no block sits within 2^-13 (relative) above max_pos * 2^k, where torchao's RCEIL fp32 ``log2`` rounds.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import torch

SEED = 20261121
ROWS, COLS = 32, 256
FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1")
MODES = ("floor", "ceil", "rceil", "even")
MAX_POS = {"mxfp8_e4m3": 448.0, "mxfp8_e5m2": 57344.0, "mxfp6_e3m2": 28.0, "mxfp6_e2m3": 7.5, "mxfp4_e2m1": 6.0}
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "golden" / "torchao_mx.npz"


def make_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    n_blocks = ROWS * COLS // 32
    base = torch.randint(-36, 36, (n_blocks, 1), generator=g).float()
    x = torch.randn(n_blocks, 32, generator=g) * torch.exp2(base)
    shift = torch.randint(0, 12, (n_blocks, 32), generator=g).float()
    x = x * torch.exp2(-torch.where(torch.rand(n_blocks, 32, generator=g) < 0.25, shift, 0 * shift))
    x = torch.where(torch.rand(n_blocks, 32, generator=g) < 0.05, torch.zeros_like(x), x)
    crafted = []
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 1.0625, 2.125, 7.25, 1.125, 18.0, 26.0, 400.0, 432.0, 36864.0]
    for k in (-20, 0, 9):
        crafted.append([6.0 * 2.0**k] + [t * 2.0**k * (-1) ** i for i, t in enumerate(ties)])
    for mp in MAX_POS.values():
        for k in (-30, 0, 25):
            crafted.append([mp * 2.0**k, -mp * 2.0**k / 3, mp * 2.0**k / 5])
    for amax in (7.0, 5.9, 6.0, 449.0, 480.0, 496.0, 2.0**10, 2.0**-10, 2.0**30):
        crafted.append([amax, -amax / 7, amax / 16])
    crafted.append([0.0] * 32)
    crafted.append([-0.0] * 32)
    for i, row in enumerate(crafted):
        t = torch.zeros(32)
        t[: len(row)] = torch.tensor(row[:32])
        x[i] = t
    return x.reshape(ROWS, COLS)


def rceil_fragile(x: torch.Tensor) -> torch.Tensor:
    """Blocks whose fp32 amax / max_pos lies within 2^-13 above a power of two (any format)."""
    amax = x.reshape(-1, 32).abs().amax(dim=-1)
    bad = torch.zeros_like(amax, dtype=torch.bool)
    for mp in MAX_POS.values():
        q = (amax / mp).view(torch.int32) & 0x7FFFFF
        bad |= (q > 0) & (q < (1 << 10))
    return bad


def main() -> int:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    import torchao

    elem = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp6_e3m2": DTYPE_FP6_E3M2,
            "mxfp6_e2m3": DTYPE_FP6_E2M3, "mxfp4_e2m1": torch.float4_e2m1fn_x2}
    x = make_input()
    # replace fragile blocks deterministically (scale by 1.01 until clean)
    for _ in range(10):
        bad = rceil_fragile(x)
        if not bad.any():
            break
        xb = x.reshape(-1, 32)
        xb[bad] *= 1.01
    assert not rceil_fragile(x).any() and not rceil_fragile(x.to(torch.bfloat16).float()).any()
    amax = x.reshape(-1, 32).abs().amax(-1)
    assert ((amax == 0) | ((amax >= 2.0**-60) & (amax <= 2.0**60))).all()

    arrays = {"x_f32": x.numpy(), "x_bf16_bits": x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)}
    for dname, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        xi = x.to(dt)
        for fmt in FORMATS:
            for mode in MODES:
                s, d = to_mx(xi, elem[fmt], 32, ScaleCalculationMode(mode))
                s = s.view(torch.uint8)
                d = d.view(torch.uint8)
                if fmt == "mxfp4_e2m1":
                    codes = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(ROWS, COLS)
                else:
                    codes = d
                nonzero = amax.reshape(ROWS, COLS // 32) > 0
                assert (s[nonzero] != 0).all() and (s != 255).all(), (dname, fmt, mode)
                arrays[f"{dname}/{fmt}/{mode}/scale"] = s.numpy().copy()
                arrays[f"{dname}/{fmt}/{mode}/codes"] = codes.numpy().astype(np.uint8).copy()
    meta = {
        "made_by": "python scripts/make_golden.py",
        "torchao": torchao.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "shape": [ROWS, COLS],
        "block_size": 32,
        "function": "torchao.prototype.mx_formats.mx_tensor.to_mx(x, elem_dtype, 32, ScaleCalculationMode(mode))",
        "formats": list(FORMATS),
        "modes": list(MODES),
        "dtypes": ["float32", "bfloat16"],
    }
    arrays["meta"] = np.array(json.dumps(meta))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes), {len(arrays) - 3} outputs, meta={meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
