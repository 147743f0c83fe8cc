"""The MoE fold paths (:mod:`mxkit.kernels.moe`; issue #22's fold on FP8 tensor cores): W4A8 (FP8 E4M3 rowwise
activations x MXFP4 / MXFP6 experts folded to E4M3) and MXFP4 x MXFP4 (the tokens and the intermediate quantized
to MXFP4 and folded, rows that do not fold fixed up on the device), both on the fp8-wgmma grouped GEMM
(:mod:`mxkit.kernels.matmul_details._fp8_wgmma`; ``torch._scaled_grouped_mm`` where it does not run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ...tensor import MXTensor
from .._env import choice, interpreting
from ..launch import _Launcher
from ..matmul_details import _fp8_wgmma
from . import _moe_epilogue
from ._rows import _combine, _interleave_halves, gather_rows
from ._sort import _align_rows, max_blocks

_BIAS_ACT_FP8 = _Launcher(_moe_epilogue, "_bias_act_fp8_kernel")
_BIAS_ACT = _Launcher(_moe_epilogue, "_bias_act_kernel")


@dataclass(frozen=True, eq=False)
class FoldedExperts:
    """Experts (E, N, K) folded once to FP8 E4M3 with one float32 power-of-two scale per row, for
    ``torch._scaled_grouped_mm`` (:func:`fold_experts`): data float8_e4m3fn (E, N, K), scale float32 (E, N),
    ``interleaved``: rows reordered from ``[gate; up]`` halves to interleaved pairs (for ``"swiglu"``)."""

    data: torch.Tensor
    scale: torch.Tensor
    interleaved: bool = False


def fold_experts(w: MXTensor, *, interleave_halves: bool = False) -> Optional[FoldedExperts]:
    """Fold MX experts (E, N, K) along K (FP4 / FP6) for the W4A8 and the MXFP4 x MXFP4 MoE (:func:`moe_w4a8_triton`,
    :func:`moe_mxfp4_triton`): exact (:mod:`mxkit.fold`). Returns None
    when a row does not fold into one E4M3 row with a row scale inside the FP8 epilogue's envelope (block scales
    spanning more than the fold range, or :data:`mxkit.kernels.matmul.FOLD_EXP_LIMIT`): such experts take the
    reference; so does a row with a NaN block (scale byte 0xFF: its other blocks' bytes would not survive the
    fold, and the module's state_dict would lose them). Two host syncs (pack time)."""
    from ..matmul import pack_weight

    E, N, K = w.shape
    if bool((w.scale == 0xFF).any()):
        return None
    flat = MXTensor._trusted(w.qdata.reshape(E * N, -1), w.plain_scale().reshape(E * N, -1), w.fmt, 1,
                             w.block_size, torch.Size((E * N, K)), w.scale_mode, w.rounding, "plain")
    pw = pack_weight(flat, act="fp8_rowwise")
    if pw.folded is None or pw.special_rows.numel() or pw.folded.owner.numel():
        return None
    data, scale = pw.folded.data.view(E, N, K), pw.folded.scale.view(E, N)
    if interleave_halves:
        data, scale = _interleave_halves(data, 1).contiguous(), _interleave_halves(scale, 1).contiguous()
    return FoldedExperts(data, scale, interleave_halves)


# where the fp8-wgmma kernel runs the grouped GEMMs: from FP8_WGMMA_MIN_ROWS sorted rows a call up to
# FP8_WGMMA_MAX_ROWS an expert on average. H200, the fold-path MoE in `mxkit bench moe` against cuBLAS's grouped
# GEMM (``benchmarks/fp8_wgmma_ab.md``): faster from 64 tokens of GPT-OSS-120B (2 rows an expert) to 16384 tokens of
# GPT-OSS-20B (2048 rows an expert: 3971 against 4236 us), the largest groups measured; slower at 1 token (64 rows:
# 4 tiles of 128 mostly padding), and on dense 8192^3 (846 against 772 us: cuBLAS's side as groups grow)
FP8_WGMMA_MIN_ROWS = 256
FP8_WGMMA_MAX_ROWS = 2048


def _tile_table(a: torch.Tensor, offs: torch.Tensor) -> Optional[torch.Tensor]:
    """The fp8-wgmma kernel's tile table of a call's groups (one for both GEMMs), or None where cuBLAS's grouped
    GEMM runs them (:func:`_grouped_fp8`): where the kernel does not run (:func:`_fp8_wgmma.available`), and past
    :data:`FP8_WGMMA_MAX_ROWS` sorted rows an expert or under :data:`FP8_WGMMA_MIN_ROWS` in all unless
    MXKIT_FP8_WGMMA=1."""
    if _fp8_wgmma.available(a.device) is not None or a.shape[1] % 16:
        return None
    R = a.shape[0]
    # (the groups' padding to 16 rows not counted)
    everywhere = choice("MXKIT_FP8_WGMMA", ("0", "1")) == "1"
    if not FP8_WGMMA_MIN_ROWS <= R <= (FP8_WGMMA_MAX_ROWS + 15) * offs.numel() and not everywhere:
        return None
    return _fp8_wgmma.tile_table(offs, a.shape[0])


def _grouped_fp8(a: torch.Tensor, sa: torch.Tensor, w: FoldedExperts, offs: torch.Tensor,
                 table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bf16 (R, N): row r of ``a`` (R, K) float8_e4m3fn times its scale ``sa[r]`` (float32) times expert e's folded
    rows, for the rows of expert e's group (ending at ``offs[e]``, int32 [E]); rows past ``offs[-1]`` unspecified.
    By mxkit's fp8-wgmma kernel where ``table`` (:func:`_tile_table`) is given, else ``torch._scaled_grouped_mm``
    (CUDA sm_90): float32 sums promoted every 128 columns, one rounding (the same bytes on GPT-OSS's shapes)."""
    if table is not None:
        E, N, K = w.data.shape
        return _fp8_wgmma.fp8_gemm(a, w.data.view(E * N, K), sa, w.scale.view(E * N), n=N, offs=offs, table=table)
    return torch._scaled_grouped_mm(a, w.data.transpose(1, 2), sa, w.scale, offs=offs, out_dtype=torch.bfloat16)


def _middle_blocks(N: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_N2) of the W4A8 middle pass (``_bias_act_fp8_kernel``) over rows of N (even) columns: the
    largest power of two <= N, then the rest's next power of two (0: none)."""
    first = 1 << (max(N, 2).bit_length() - 1)
    return first, (triton.next_power_of_2(N - first) if N > first else 0)


def moe_w4a8_triton(
    xq,
    w_gate_up: FoldedExperts,
    b_gate_up: Optional[torch.Tensor],
    w_down: FoldedExperts,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
    stages: Optional[dict] = None,
) -> torch.Tensor:
    """The W4A8 expert computation (TensorRT-LLM's GPT-OSS mode on Hopper) on FP8 tensor cores; reference twin
    :func:`mxkit.moe_reference.moe_w4a8_reference` (MXTensor experts; the same rounding points):

    1. ``h = (xq.data * xq.scale)[token] @ W1[e].T`` by the fp8-wgmma kernel (``torch._scaled_grouped_mm`` where
       it does not run) on the tokens sorted by expert (padded to 16 rows per expert), rounded once to bf16;
    2. one pass per row: ``v = act(h + b1[e])`` in float32, then FP8 E4M3 rowwise (:func:`mxkit.quantize_fp8_rowwise`'s
       rule) -> (h8, s2);
    3. ``y = (h8 * s2) @ W2[e].T`` the same way, rounded once to bf16;
    4. one pass per token: ``(y + b2[e]) * topk_weight`` summed over the k slots in float32, rounded to
       ``out_dtype``.
    Each GEMM is exact for its FP8 inputs (the fold is exact; float32 accumulation across 128-deep steps, each
    step's products in the FP8 tensor cores' ~14-bit accumulator; one rounding).

    xq: :class:`mxkit.Fp8Rowwise` (T, H); w_gate_up / w_down: :func:`fold_experts` of (E, 2I, H) / (E, H, I)
    (w_gate_up interleaved for ``"swiglu"``); b_gate_up (E, 2I) in the checkpoint's row order, b_down (E, H);
    topk (T, k). ``stages``: a dict that receives the intermediates (tests). Returns (T, H). No host sync."""
    from ..matmul_details._grouped import ACTS

    bm = 16
    T, H = xq.data.shape
    k = topk_ids.shape[1]
    E, N1, _ = w_gate_up.data.shape
    I = N1 // 2  # noqa: E741 (GPT-OSS's name)
    n = T * k
    ids, eids, pos, offs = _align_rows(topk_ids, E, bm, 0, max_blocks(n, E, bm), offs=True)
    R = ids.numel()
    xa, sa = gather_rows(xq.data, ids, n, k, scale=xq.scale)  # (padding rows: any codes, scale 0)
    table = _tile_table(xa, offs)
    h = _grouped_fp8(xa, sa, w_gate_up, offs, table)
    b1 = b_gate_up
    if b1 is not None and w_gate_up.interleaved:
        b1 = _interleave_halves(b1, 1)
    h8 = torch.empty(R, I, dtype=torch.float8_e4m3fn, device=h.device)
    s2 = torch.empty(R, dtype=torch.float32, device=h.device)
    if R:
        b_n, b_n2 = _middle_blocks(N1)
        _BIAS_ACT_FP8((R,), (h, h if b1 is None else b1.contiguous(), ids, eids, h8.view(torch.uint8), s2, n, N1),
                      (("ACT", ACTS[activation]), ("HAS_BIAS", b1 is not None), ("BLOCK_M", bm),
                       ("BLOCK_N", b_n), ("BLOCK_N2", b_n2), ("HW_CVT", not interpreting())),
                      4)
    y = _grouped_fp8(h8, s2, w_down, offs, table)
    out = _combine(y, b_down, topk_weights, pos, topk_ids, out_dtype)
    if stages is not None:
        stages.update(ids=ids, eids=eids, h=h, h8=h8, s2=s2, y=y, xa=xa, sa=sa)
    return out


# --------------------------------------------------------------------------------------------------------
# MXFP4 x MXFP4: the tokens and the intermediate quantized to MXFP4 x MXFP4 / MXFP6 experts, each side folded to
# E4M3 (the fold path of issue #22) on FP8 tensor cores; rows that do not fold exactly are fixed up on the device


ACT_MXFP4 = "mxfp4_e2m1"  # the activation format of moe_mxfp4_triton (OCP FLOOR scales, RNE: mxkit.quantize's)


def moe_mxfp4_triton(
    x: torch.Tensor,
    w_gate_up: FoldedExperts,
    b_gate_up: Optional[torch.Tensor],
    w_down: FoldedExperts,
    b_down: Optional[torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu_gpt_oss",
    out_dtype: torch.dtype = torch.bfloat16,
    stages: Optional[dict] = None,
) -> torch.Tensor:
    """The MXFP4 x MXFP4 expert computation on FP8 tensor cores; reference twin
    :func:`mxkit.moe_reference.moe_mxfp4_reference` (the same rounding points):

    1. the tokens quantized to MXFP4 along H (:func:`mxkit.quantize`'s bytes: OCP FLOOR scales, RNE) and folded
       to E4M3 rows with power-of-two row scales in one pass (:func:`mxkit.kernels.fold.quantize_fold_triton`,
       deferred: no host sync), gathered into the expert-sorted order (groups padded to 16 rows);
    2. ``h = xq[token] @ W1[e].T`` by ``torch._scaled_grouped_mm``, rounded once to bf16; then the grouped
       fix-up (:func:`mxkit.kernels.matmul_details._row_fixup.grouped_fixup`) recomputes, from x's rows and the
       folded experts, the rows whose token does not fold exactly (block scales spanning more than 14 steps, or
       a row scale outside 2^+-FOLD_EXP_LIMIT);
    3. one pass per sorted row: ``v = act(h + b1[e])`` in float32, then v quantized to MXFP4 and folded the same
       way (sorted order: no gather);
    4. ``y = vq @ W2[e].T`` the same way (GEMM, bf16 rounding, fix-up of v's rows that do not fold);
    5. one pass per token: ``(y + b2[e]) * topk_weight`` summed over the k slots in order in float32, rounded
       to ``out_dtype``.
    Each GEMM is exact for its MXFP4 operands: float32 accumulation (each 128-deep step's products in the FP8
    tensor cores' ~14-bit accumulator) and one rounding of the product of the dequantized values (the folds are
    exact, the fix-up reads exact values).

    x: (T, H) float32 | bfloat16 | float16 (H % 32 == 0); w_gate_up / w_down: :func:`fold_experts` of
    (E, 2I, H) / (E, H, I) MXFP4 / MXFP6 experts (w_gate_up interleaved for ``"swiglu"``); b_gate_up (E, 2I) in
    the checkpoint's row order, b_down (E, H), or None; topk_weights / topk_ids (T, k). ``stages``: a dict that
    receives the intermediates (tests). Returns (T, H) in ``out_dtype``. No host sync (CUDA-graph capturable);
    needs CUDA sm_90 (``torch._scaled_grouped_mm``). Raises TypeError for another x dtype. Expert ids are not
    range-checked: a pair whose id is outside 0 .. E - 1 contributes 0."""

    from ..fold import quantize_fold_triton
    from ..matmul_details._grouped import ACTS
    from ..matmul_details._row_fixup import grouped_fixup

    bm = 16  # rows an expert's group is padded to (the grouped GEMM's), the fix-up's row tile
    T, H = x.shape
    k = topk_ids.shape[1]
    E, N1, _ = w_gate_up.data.shape
    n = T * k
    if n == 0:
        return torch.zeros(T, H, dtype=out_dtype, device=x.device)
    x = x if x.is_contiguous() else x.contiguous()
    ids, eids, pos, offs = _align_rows(topk_ids, E, bm, 0, max_blocks(n, E, bm), offs=True)
    R = ids.numel()
    xf = quantize_fold_triton(x, ACT_MXFP4, defer=True)  # (status-1 rows: unspecified until the fix-up)
    xa, sa = gather_rows(xf.folded.data, ids, n, k, scale=xf.folded.scale)  # (padding rows: any codes, scale 0)
    table = _tile_table(xa, offs)
    h = _grouped_fp8(xa, sa, w_gate_up, offs, table)
    grouped_fixup(h, xf.source, xf.status, xf.folded.scale, ids, eids, w_gate_up.data, w_gate_up.scale, n_valid=n,
                  top_k=k, gather=True)
    b1 = b_gate_up
    if b1 is not None and w_gate_up.interleaved:
        b1 = _interleave_halves(b1, 1)
    v = torch.empty(R, N1 // 2, dtype=torch.float32, device=x.device)
    _BIAS_ACT((R,), (h, h if b1 is None else b1.contiguous(), ids, eids, v, n, N1),
              (("ACT", ACTS[activation]), ("HAS_BIAS", b1 is not None), ("BLOCK_M", bm),
               ("BLOCK_N", triton.next_power_of_2(N1))), 4)
    vf = quantize_fold_triton(v, ACT_MXFP4, defer=True)  # (padding rows: zeros)
    y = _grouped_fp8(vf.folded.data, vf.folded.scale, w_down, offs, table)
    grouped_fixup(y, vf.source, vf.status, vf.folded.scale, ids, eids, w_down.data, w_down.scale, n_valid=n,
                  top_k=k, gather=False)
    out = _combine(y, b_down, topk_weights, pos, topk_ids, out_dtype)
    if stages is not None:
        stages.update(ids=ids, eids=eids, h=h, v=v, y=y, x_fold=xf, v_fold=vf)
    return out
