"""README's GEMM tables, generated from the code so they cannot drift from it (a test compares them with README):
:func:`envelope_markdown`, the small-M and Hopper kernels' envelopes from the packaged dispatch table, and
:func:`support_matrix_markdown`, the path :func:`mxkit.kernels.matmul.plan_gemm` picks past them per operand pair."""

from __future__ import annotations

from typing import Mapping

import torch

from .. import reference
from ..fold import can_fold
from ..packed import Fp8Rowwise
from .matmul import W_KINDS, pack_weight, plan_gemm
from .matmul_table import _packaged_table

__all__ = ["support_matrix", "support_matrix_markdown", "envelope_rows", "envelope_markdown"]


def support_matrix() -> list[dict]:
    """One row per ``a`` operand kind, one column per weight format: the path :func:`plan_gemm` picks on a
    Hopper GPU for in-envelope scales (generated from the plan itself, so README cannot drift from it)."""
    from ..formats import FORMATS

    fmts = sorted({f.name: f for f in FORMATS.values()}.values(), key=lambda f: (-f.bits, f.name))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, generator=g)
    weights = {f.name: pack_weight(reference.quantize_reference(torch.randn(16, 64, generator=g), f, axis=1))
               for f in fmts}
    kinds = [("bf16 / fp16 activations", x.to(torch.bfloat16)), ("fp32 activations", x)]
    kinds += [(f"{f.name} (MXTensor)", reference.quantize_reference(x, f)) for f in fmts]
    kinds += [("mxfp4 / mxfp6 via quantize_fold", None), ("FP8 E4M3 rowwise (W4A8)", Fp8Rowwise(
        x.to(torch.float8_e4m3fn), torch.ones(2, 1)))]
    rows = []
    for label, a in kinds:
        row = {"a": label}
        for name, w in weights.items():
            if a is None:
                row[name] = "fold-fp8" if can_fold(w.fmt) else "fp32-exact"
            else:
                row[name] = plan_gemm(a, w).path
        rows.append(row)
    return rows


def _count(n: int) -> str:
    """2^k for a power of two, c·2^20 for a multiple of 2^20, else the number."""
    n = int(n)
    if n > 0 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{n >> 20}·2^20" if n > 0 and n % (1 << 20) == 0 else str(n)


def _m_env(e: Mapping, field: str = "max_m", nk: str = "min_nk") -> str:
    return f"≤ {e[field]}" + (f" on N·K ≥ {_count(e[nk])}" if nk in e else "")


def envelope_rows() -> list[dict]:
    """The CUDA paths that take a call before :func:`support_matrix`'s (checked in this order), each with its
    operands and its envelope as the packaged dispatch table states it (``default``, then the GPUs with entries of
    their own): generated from the table, so README cannot drift from it."""
    table = _packaged_table()
    d = table["default"]
    gpus = [g for g in table if g not in ("default", "_doc")]

    def listed(key: str, text, lead: str = " (", tail: str = ")") -> str:
        """The GPUs whose ``key`` entry says something of its own: ``text(entry, merged)`` (the GPU's entry, and it
        over the default) is that, or None; listed as "gpu: text" between ``lead`` and ``tail``."""
        own = [f"{g}: {t}" for g in gpus
               if (t := text(table[g].get(key, {}), {**d.get(key, {}), **table[g].get(key, {})})) is not None]
        return f"{lead}{', '.join(own)}{tail}" if own else ""

    def per_gpu(key: str, field: str = "max_m") -> str:
        return listed(key, lambda e, m: e[field] if field in e and e[field] != d.get(key, {}).get(field) else None)

    def large(key: str) -> str:  # (the envelopes widened on large weights: large_max_m on N·K >= large_min_nk)
        return listed(key, lambda e, m: f"≤ {e['large_max_m']} on N·K ≥ {_count(e['large_min_nk'])}"
                      if "large_max_m" in e else None, "; ", "")

    def own(key: str, field: str = "max_m", nk: str = "min_nk") -> str:  # (a GPU's own field on N·K >= nk)
        return listed(key, lambda e, m: _m_env(m, field, nk)
                      if any(f in e and e[f] != d[key][f] for f in (field, nk)) else None)

    def small(key: str) -> str:  # (a GPU's own split-K envelope at small M: small_max_m on N·K >= small_min_nk)
        return own(key, "small_max_m", "small_min_nk")

    def mid(key: str) -> str:  # (a GPU's third envelope: mid_max_m on N·K >= mid_min_nk; none in the default)
        return listed(key, lambda e, m: _m_env(e, "mid_max_m", "mid_min_nk") if e.get("mid_max_m") else None, "; ", "")

    def per_gpu_nk(key: str) -> str:  # (a GPU's wgmma_min_nk: the weights below it keep the other envelope)
        return listed(key, lambda e, m: f"of N·K ≥ {_count(e['wgmma_min_nk'])}" if "wgmma_min_nk" in e else None)

    kinds = " / ".join(W_KINDS)
    wg, w8 = d["w4a16_wgmma"], d["w8a16_wgmma"]

    def wgmma_m(key: str, e: Mapping) -> str:  # (the main envelope, then the split-K one at small M, then the third)
        return f"{_m_env(e)}{own(key)}; {_m_env(e, 'small_max_m', 'small_min_nk')}{small(key)}{mid(key)}"

    twin = "(or, for bf16 a, a packed mxfp6's MXFP8 twin)"
    return [
        {"path": "a8w8-mma", "a": f"MXFP8 E4M3 (MXTensor; bf16 quantized in the launch via MXLinear up to M ≤ "
                                 f"{d['a8w8_mma']['quant_max_m']}{per_gpu('a8w8_mma', 'quant_max_m')})",
         "weight": "mxfp8_e4m3",
         "M": f"≤ {d['a8w8_mma']['max_m']} where w8a16-wgmma takes the layer{per_gpu_nk('a8w8_mma')}, else "
              f"≤ {d['a8w8_mma']['max_m_no_wgmma']}",
         "also": "N % 16 = 0, K % 64 = 0, sm_89+"},
        {"path": "w8a16-mma", "a": "bf16", "weight": f"packed mxfp8_e4m3 / e5m2 {twin}, no NaN / Inf codes",
         "M": f"≤ {d['w8a16_mma']['max_m']}{per_gpu('w8a16_mma')}{large('w8a16_mma')}",
         "also": "N % 16 = 0, K % 64 = 0, sm_89+"},
        {"path": "decode-mma", "a": "bf16", "weight": "packed mxfp4_e2m1",
         "M": f"≤ {d['decode_mma']['max_m']}{per_gpu('decode_mma')}", "also": "N % 16 = 0, K % 64 = 0, sm_80+"},
        {"path": "decode-w16", "a": "bf16 / fp16", "weight": kinds,
         "M": f"≤ {d['decode_w4a16']['max_m']}{per_gpu('decode_w4a16')}",
         "also": f"fp6 on N·K ≤ {_count(d['decode_w4a16']['fp6_max_nk'])}; weight scales in the "
                 f"activation dtype's exact envelope"},
        {"path": "w4a16-wgmma", "a": "bf16", "weight": "mxfp4_e2m1",
         "M": wgmma_m("w4a16_wgmma", wg),
         "also": "N % 8 = 0, sm_90"},
        {"path": "w8a16-wgmma", "a": "bf16, or MX dequantized to bf16",
         "weight": f"packed mxfp8_e4m3 / e5m2 {twin}, no NaN / Inf codes",
         "M": wgmma_m("w8a16_wgmma", w8),
         "also": "N % 8 = 0, sm_90"},
    ]


def envelope_markdown() -> str:
    """:func:`envelope_rows` as a markdown table (README's)."""
    rows = envelope_rows()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def support_matrix_markdown() -> str:
    rows = support_matrix()
    cols = list(rows[0])
    lines = ["| a \\ b (weight) | " + " | ".join(cols[1:]) + " |", "|---" * len(cols) + "|"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
