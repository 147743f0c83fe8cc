"""The summary of a GPT-OSS directory that ``mxkit inspect DIR`` prints (:func:`summarize_gpt_oss`)."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from ._layout import BLOCK, MOE_ROLES, CheckpointError, GptOssDims, moe_tensor_name
from ._read import _Reader, load_gpt_oss


@dataclass(frozen=True)
class GptOssSummary:
    """What ``mxkit inspect DIR`` prints for a GPT-OSS directory.

    files: the safetensors file names; index: the index file name or None; moe_shapes: ``(role, shape, dtype)`` of
    one layer's MoE tensors (every layer's shapes are checked to be the same; dtype names every one the layers
    use, e.g. ``BF16/F32``); mxfp4_bytes: the experts' blocks + scales;
    bf16_bytes: 2 bytes per expert weight; moe_other_bytes: biases and router; scale_hist: 256 counts of E8M0
    scale bytes over all layers; other_tensors / other_bytes: every tensor that is not a MoE tensor.
    """

    path: Path
    dims: GptOssDims
    files: tuple[str, ...]
    index: Optional[str]
    moe_shapes: tuple[tuple[str, tuple[int, ...], str], ...]
    mxfp4_bytes: int
    bf16_bytes: int
    moe_other_bytes: int
    scale_hist: tuple[int, ...]
    other_tensors: int
    other_bytes: int


def summarize_gpt_oss(path: Union[str, Path], *, progress: bool = False) -> GptOssSummary:
    """Summarise an MXFP4 GPT-OSS directory: loads (and so checks) every layer as :func:`load_gpt_oss` does, reads
    every scale byte for the histogram and every other tensor's header. Raises what :func:`load_gpt_oss` raises,
    and CheckpointError for tensors of layers past config.json's ``num_hidden_layers``."""
    ckpt = load_gpt_oss(path, progress=progress)
    hist = torch.zeros(256, dtype=torch.int64)
    mx_bytes = bf16_bytes = moe_other = 0
    for moe in ckpt.layers:
        for t in (moe.gate_up, moe.down):
            hist += torch.bincount(t.scale.reshape(-1), minlength=256)
            mx_bytes += t.nbytes
            bf16_bytes += 2 * t.shape.numel()
        moe_other += sum(t.nbytes for t in (moe.gate_up_bias, moe.down_bias, moe.router_weight, moe.router_bias))
    with contextlib.ExitStack() as stack:
        reader = _Reader(ckpt.path, stack)
        moe_names = {moe_tensor_name(i, r) for i in range(ckpt.dims.num_layers) for r in MOE_ROLES}
        others = [n for n in reader.weight_map if n not in moe_names]
        past = sorted({int(m.group(1)) for n in others if (m := re.match(r"model\.layers\.(\d+)\.", n))
                       and int(m.group(1)) >= ckpt.dims.num_layers})
        if past:  # (counted as non-MoE tensors, the experts' bytes from config.json's layers alone, before)
            raise CheckpointError(f"{str(ckpt.path)!r}: config.json says {ckpt.dims.num_layers} layers, but the "
                                  f"directory holds tensors of layer(s) {past[:8]}")
        other_bytes = sum(reader.nbytes(n) for n in others)
        # (one layer's shapes: every layer's are the same, load_gpt_oss checked; the dtypes of them all: biases and
        # the router may be BF16 / F16 / F32 layer by layer, which showed as layer 0's)
        shapes = tuple((r, reader.meta(moe_tensor_name(0, r))[0], "/".join(sorted(
            {str(reader.meta(moe_tensor_name(i, r))[1]) for i in range(ckpt.dims.num_layers)}))) for r in MOE_ROLES)
        files, index = tuple(f.name for f in reader.files), reader.index.name if reader.index else None
    return GptOssSummary(ckpt.path, ckpt.dims, files, index, shapes, mx_bytes, bf16_bytes, moe_other,
                         tuple(int(v) for v in hist), len(others), other_bytes)


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.3f} MB"


def print_gpt_oss_summary(s: GptOssSummary, *, plain: bool = False, file=None) -> None:
    """Print a :class:`GptOssSummary`: config, one layer's MoE tensor shapes (a table), MXFP4 vs bf16 bytes, the
    E8M0 scale range and the non-MoE tensors."""
    import sys

    from .._table import print_table

    out = file if file is not None else sys.stdout
    d = s.dims
    sharding = f"{len(s.files)} shards, {s.index}" if s.index else f"{len(s.files)} file"
    print(f"GPT-OSS MXFP4 checkpoint {s.path} ({sharding})", file=out)
    print(f"config: {d.num_layers} layers, {d.num_experts} experts, top-{d.top_k}, hidden {d.hidden_size}, "
          f"intermediate {d.intermediate_size}, vocab {d.vocab_size}", file=out)
    rows = []
    for role, shape, dtype in s.moe_shapes:
        logical = "-"
        if role.endswith("_blocks"):
            logical = f"mxfp4_e2m1 {list(shape[:-2]) + [shape[-2] * BLOCK]}"
        elif role.endswith("_scales"):
            logical = "E8M0 scales"
        rows.append([moe_tensor_name(0, role).replace("layers.0.", "layers.{i}."), dtype, str(list(shape)), logical])
    print_table(["tensor (each layer)", "dtype", "shape", "mx"], rows, plain=plain, file=out)
    n = s.bf16_bytes // 2
    print(f"MXFP4 experts: {_gb(s.mxfp4_bytes)} (blocks + scales, {8 * s.mxfp4_bytes / n:.2f} bits/weight) vs "
          f"{_gb(s.bf16_bytes)} as bf16 ({s.mxfp4_bytes / s.bf16_bytes:.3f}x); "
          f"biases + router {_gb(s.moe_other_bytes)}",
          file=out)
    hist = torch.tensor(s.scale_hist)
    finite = hist[:255]
    present = finite.nonzero().flatten()
    if len(present):
        lo, hi = int(present[0]), int(present[-1])
        med = int(torch.searchsorted(finite.cumsum(0), (int(finite.sum()) + 1) // 2))
        print(f"E8M0 scales: {int(hist.sum())}, bytes {lo}..{hi} (2^{lo - 127} .. 2^{hi - 127}), median 2^{med - 127}, "
              f"NaN (0xFF) {int(hist[255])}", file=out)
    else:
        print(f"E8M0 scales: all {int(hist[255])} NaN (0xFF)", file=out)
    print(f"non-MoE tensors: {s.other_tensors}, {_gb(s.other_bytes)}", file=out)
