"""Scaled MX GEMMs ``y = a @ b.T`` on Hopper: the plan (which path a call takes, and why) and the paths.

Hopper has no MX tensor-core instruction, so every path re-expresses the MX operands exactly in a type the
tensor cores do take, then accumulates in float32 (the numerics bound of issue #22: the error is that of
float32 accumulation plus one output rounding):

``fold-fp8``
    FP4 / FP6 × FP4 / FP6. Each row of 32-element blocks is folded into FP8 E4M3 with one power-of-two
    float32 scale per row (:mod:`mxkit.fold`; exact when the row's block scales span at most the format's
    fold range, e.g. 14 for E2M1), then cuBLAS' FP8 GEMM with rowwise scales (``torch._scaled_mm``).
    bf16 / fp16 outputs only on CUDA: Hopper's FP8 tensor cores add products with fewer bits than float32
    (up to 5e-5 relative error on MXFP6 rows, measured), so a float32 output takes ``bf16-exact`` (every
    FP4 / FP6 value times its scale is as exact in bf16 as in float32) or ``fp32-exact``.
``w4a8-fp8``
    FP4 / FP6 weights × FP8 E4M3 activations with a float32 scale per row (:class:`mxkit.Fp8Rowwise`,
    TensorRT-LLM's W4A8): the folded weight into the same FP8 GEMM.
``bf16-exact``
    Any other MX × MX pair: both dequantized to bf16 (every MX value times its E8M0 scale is exact in bf16
    inside an envelope of scale bytes: the weight's is checked at pack time), then cuBLAS bf16 with float32
    accumulation; on CUDA the rows of ``a`` with a scale byte outside it are then recomputed exactly by the
    fix-up kernel (no host sync; elsewhere the plan reads a's scale range and takes ``fp32-exact``).
``dense-exact``
    bf16 / fp16 activations × an MX weight (W4A16 … W8A16 prefill): the weight dequantized to the
    activation dtype (exact inside the envelope), then cuBLAS.
``decode-mma``
    bf16 activations × a packed MXFP4 weight at small M (the tuned table's ``decode_mma.max_m``, default 32;
    N % 16 == 0, K % 64 == 0): a CUDA C++ kernel shipped as
    PTX and launched through the driver API (:mod:`.matmul_details._mma_decode`): E2M1 codes to bf16 in two
    integer operations per pair, ``mma.sync`` with float32 accumulation, each 32-element block's sum scaled by
    its E8M0 factor in float32 (so any scale byte is exact), K split over a block's warps and reduced in a
    fixed order.
``a8w8-mma``
    MXFP8 (E4M3) activations × an MXFP8 (E4M3) weight at small M (the tuned table's ``a8w8_mma.max_m``,
    default 64; N % 16 == 0, K % 64 == 0; sm_89+): both operands' E4M3 codes straight into FP8 tensor cores
    (``mma.sync`` m16n8k32, a CUDA C++ kernel shipped as PTX, :mod:`.matmul_details._mma_a8w8`), each
    32-element block's product summed in float32 and multiplied by its two E8M0 factors in float32; read as
    mxkit stores them or in ``pack_weight``'s a8w8 layout. :func:`a8w8_linear` is the same kernel from bf16
    activations, quantized inside it up to the table's ``quant_max_m`` rows (one launch; the bytes of
    ``mxkit.quantize(x, "mxfp8")``). On sm_90 from MXFP8 a at M <= 8 on layers of at least one 16-row strip per
    multiprocessor, the packed weight is streamed by Hopper bulk copies (``mma_a8w8_bulk.cu``: a producer warp,
    a ring of shared-memory chunks, persistent blocks) into the same arithmetic: the bits of the kernel at one
    thread block along K.
``w8a16-mma``
    bf16 activations × a packed MXFP8 (E4M3 / E5M2) weight without NaN / Inf codes at small M (the tuned
    table's ``w8a16_mma.max_m``, default 8; N % 16 == 0, K % 64 == 0; sm_89+): the a8w8-mma kernel's file and
    weight layout, the codes decoded to bf16 exactly and multiplied by bf16 x on ``mma.sync`` m16n8k16, each
    block's float32 sum scaled once by its E8M0 factor (every scale byte exact).
``decode-w16``
    bf16 activations × an MXFP4, MXFP8 or MXINT8 weight at small M (the tuned table's ``max_m``): a Triton
    kernel that reads the MX bytes (4.25 or 8.25 bits per weight), decodes them to bf16 in registers and
    accumulates in float32, with a split-K whose partial sums are reduced in a fixed order (deterministic).
``w4a16-wgmma`` / ``w8a16-wgmma``
    Hopper (sm_90), past the decode envelopes (the tuned table's ``w4a16_wgmma`` / ``w8a16_wgmma``): bf16
    activations × an MXFP4 weight, or a packed MXFP8 (E4M3 / E5M2) one without NaN / Inf codes, on a Gluon
    kernel that decodes the weight codes to bf16 in registers as wgmma's register operand (TMA, warp-specialized,
    split along K at small M; :mod:`.matmul_details._w4a16_wgmma`). ``w8a16-wgmma`` also takes MX activations
    × such a weight: a dequantized to bf16 first (exact), its rows outside bf16's range recomputed by the fix-up
    kernel as in ``bf16-exact``.
``fp32-exact``
    Everything outside those envelopes: float32 operands (exact MX values), float32 GEMM with TF32 off.

Rows the fold path cannot take (a row whose block scales span more than the fold range, or a row scale
outside the FP8 epilogue's envelope) are recomputed exactly and written into the same output, so no shape or
value ever takes an inexact path silently: for a deferred fold (MX activations, or bf16 ones through the
fused quantize-fold) by one fix-up kernel after the FP8 GEMM, without a host sync (so the call is CUDA-graph
capturable); for a completed :class:`~mxkit.fold.Folded` through the float32 route after one host sync.

Eager calls on a :class:`~mxkit.packed.PackedWeight` keep their plan and launches on it, per operand shape and
layout (:func:`prepared_call`, :func:`prepared_call_mx`): the decode paths as one C++ fast call each, and the
prefill paths of two or three launches (``dense-exact``, ``fold-fp8`` from MX activations, ``bf16-exact``) with
their fold / dequantize launches as fast calls and the fix-up's parameter block bound after the first calls,
which run :func:`run_gemm` (the same launches and bytes).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .. import reference
from ..fold import WIDEN, Folded, can_fold, fold_reference, unfold_reference, widen_fp6
from ..formats import ElementFormat
from ..packed import Fp8Rowwise, PackedWeight, partial_stats
from ..tensor import MXTensor, check_out_dtype
from .cuda_driver import fast_call_loaded
from .matmul_table import (  # (re-exported: the dispatch table's API has lived here)
    DecodeConfig,
    _decode_max_m,
    _envelope,
    _mma_max_m,
    _table_token,
    _token_stack,
    decode_config,
    gemm_table,
    gemm_table_override,
    mma_m8_loop,
)
from .matmul_details._envelope import (
    FOLD_EXP_LIMIT,
    exact_scale_range,
    host_ints,
    in_range,
    out_of_envelope,
    scale_extrema,
    scale_stats,
)
from .matmul_details._mma_decode import bias_flag

__all__ = ["GemmPlan", "PATHS", "plan_gemm", "run_gemm", "prepared_call", "prepared_call_mx", "prepared_call_a8w8",
           "pack_weight",
           "exact_scale_range", "FOLD_EXP_LIMIT", "check_bias", "a8w8_linear", "DecodeConfig", "gemm_table",
           "gemm_table_override", "decode_config", "W_KINDS"]

PATHS = {
    "fold-fp8": "FP4/FP6 x FP4/FP6 folded to FP8 E4M3 with power-of-two row scales; cuBLAS FP8 rowwise GEMM",
    "w4a8-fp8": "FP4/FP6 weight folded to FP8 E4M3 x FP8 rowwise activations; cuBLAS FP8 rowwise GEMM",
    "bf16-exact": "both operands dequantized to bf16 (exact); cuBLAS bf16, fp32 accumulation",
    "dense-exact": "MX weight dequantized to the activation dtype (exact); cuBLAS, fp32 accumulation",
    "dense-cached": "the PackedWeight's dequantized-weight cache (pack_weight(dense=...), exact); cuBLAS, fp32 "
                    "accumulation",
    "decode-mma": "small M: MXFP4 codes decoded to bf16 in registers, mma.sync tensor cores (CUDA C++ as "
                  "PTX), fp32 accumulation, block scales in fp32",
    "a8w8-mma": "small M: MXFP8 x MXFP8 E4M3 codes on FP8 tensor cores (mma.sync e4m3, CUDA C++ as PTX), "
                "fp32 accumulation, block scales in fp32",
    "w8a16-mma": "small M: packed MXFP8 (E4M3 / E5M2) codes decoded to bf16 in registers, mma.sync tensor cores "
                 "(CUDA C++ as PTX), fp32 accumulation, block scales in fp32",
    "decode-w16": "small M: MXFP4 / MXFP6 / MXFP8 / MXINT8 bytes decoded to bf16 (fp16 for fp16 activations) in "
                  "registers (Triton), fp32 accumulation, split-K",
    "w4a16-wgmma": "prefill on Hopper: MXFP4 codes decoded to bf16 in registers as wgmma's register operand "
                   "(Gluon, TMA), fp32 accumulation",
    "w8a16-wgmma": "Hopper: MXFP8 (E4M3 / E5M2) codes decoded to bf16 in registers as wgmma's register operand "
                   "(Gluon, TMA), fp32 accumulation; bf16 activations, or MX ones dequantized to bf16 (exact)",
    "fp32-exact": "float32 operands (exact MX values); float32 GEMM, TF32 off",
    "reference": "mxkit.reference.matmul_reference (dequantize, float32 matmul)",
}

# the weight element kinds of the bf16-activation kernels (``W_KIND`` of matmul_details._mx_weight)
W_KINDS = {"mxfp4_e2m1": 0, "mxfp8_e4m3": 1, "mxfp8_e5m2": 2, "mxint8": 3, "mxfp6_e2m3": 4, "mxfp6_e3m2": 5}


@dataclass(frozen=True)
class GemmPlan:
    """Which path ``mxkit.matmul(a, b)`` takes, and why (:func:`mxkit.gemm_plan`).

    path: a key of :data:`PATHS`; reason: one line; exact: always True (every path is exact up to float32
    accumulation and output rounding); M, N, K: the GEMM's extents (M = rows of ``a`` flattened);
    out_dtype: the output dtype.
    """

    path: str
    reason: str
    M: int
    N: int
    K: int
    out_dtype: torch.dtype
    exact: bool = True


def _decode_takes(wf: ElementFormat, N: int, K: int, device: torch.device) -> bool:
    """Whether decode-w16 takes a weight of format ``wf`` and shape (N, K): every kind of :data:`W_KINDS`, MXFP6
    only up to ``decode_w4a16.fp6_max_nk`` elements (its unpacking is ALU-bound past that: dense-exact is faster)."""
    if wf.name not in W_KINDS:
        return False
    if wf.bits != 6:
        return True
    entry = _envelope(device, "decode_w4a16") or {}
    return N * K <= int(entry.get("fp6_max_nk", 0))


# --------------------------------------------------------------------------------------------------------
# packing


def _fold(q: MXTensor, defer: bool = False, stats: bool = False):
    """Folded (or, with ``defer`` on CUDA, a :class:`mxkit.kernels.fold.PendingFold`, with ``stats`` carrying the
    weight statistics the kernel made on the way) of an MX tensor."""
    if q.device.type == "cuda":
        from .fold import fold_triton

        return fold_triton(q, defer=defer, stats=stats)
    return fold_reference(q)


def _to_host_async(flag: torch.Tensor):
    """(pinned host copy of a 0-dim bool, event to wait on) without blocking the host now."""
    if flag.device.type != "cuda":
        return flag, _NoEvent()
    host = torch.empty((), dtype=torch.bool, pin_memory=True)
    host.copy_(flag, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    return host, ev


class _NoEvent:
    def synchronize(self) -> None:
        pass


def _dequantize(q: MXTensor, dtype: torch.dtype) -> torch.Tensor:
    if q.device.type == "cuda":
        from .quantize import dequantize_triton

        return dequantize_triton(q, dtype)
    return reference.dequantize_reference(q, dtype)


def _plain(q: MXTensor) -> MXTensor:
    if q.scale_layout == "plain":
        return q
    return dataclasses.replace(q, scale=q.plain_scale().contiguous(), scale_layout="plain")


def _check_weight(b: MXTensor, name: str = "b") -> None:
    if not isinstance(b, MXTensor):
        raise TypeError(f"{name} must be an MXTensor (N, K) or a PackedWeight, got {type(b).__name__}")
    if b.ndim != 2 or b.axis != 1:
        raise ValueError(f"{name} must be 2-D (N, K) quantized along K (axis=1); got shape {tuple(b.shape)}, "
                         f"axis={b.axis}")


def _special_rows(f: Folded, rows: int) -> torch.Tensor:
    """Rows of a folded operand that the FP8 path cannot take: owners of extra slices, and non-zero rows whose
    scale exponent lies outside +-FOLD_EXP_LIMIT (one host sync)."""
    cand = torch.nonzero(out_of_envelope(f.scale[:rows])).flatten()
    if cand.numel():  # an all-zero row's product is 0 whatever its scale
        nonzero = (f.data[cand].view(torch.uint8) & 0x7F).amax(dim=1) > 0
        cand = cand[nonzero]
    if f.owner.numel():
        cand = torch.cat([cand, f.owner.to(cand.device)])
    return torch.unique(cand)


PACK_ACTS = (None, "float", "fp8_rowwise", "mx")  # pack_weight's act: the activations a weight meets


def pack_weight(w: MXTensor, *, act: Optional[str] = None, dense: Optional[torch.dtype] = None) -> PackedWeight:
    """One-time re-layout of an MX weight (N, K) along K into what the GEMM paths read (see PackedWeight).

    FP4 / FP6 weights are folded to FP8 E4M3 with row scales (a memory-bound kernel on CUDA, the reference
    on CPU); MXFP4 / MXFP8 E4M3 weights of the small-M kernels' shapes get their layouts (``mma_q``); every
    weight gets its scale extrema: with a fold, in the fold's one host sync; without (``act="float"``, FP8 / INT8
    weights), left on the device and read by the first GEMM call (so packing a model's weights queues kernels
    only: ``PackedWeight.stats``). ``act`` (:data:`PACK_ACTS`) builds only the layouts of the
    paths those activations take: None all; ``"float"`` the decode-mma one (no fold); ``"fp8_rowwise"`` /
    ``"mx"`` the fold, and with ``"mx"`` the a8w8-mma one of an MXFP8 E4M3 weight. An MXFP6 weight packed for
    float activations (None / ``"float"``) also gets its exact MXFP8 twin, packed (``PackedWeight.wide``), which
    bf16 activations read on the MXFP8 weight kernels. ``dense`` (None, torch.bfloat16 or torch.float16) also keeps
    the weight dequantized to that dtype (``PackedWeight.dense``, 2 bytes per element more): activations of that
    dtype then run on cuBLAS against it past the small-M kernels (path ``dense-cached``), where the scale bytes
    are in the dtype's exact envelope (elsewhere the exact paths as without it; an MXFP6 weight's bf16 cache is its
    twin's, so scale bytes past the twin's envelope, above 240 for E2M3 / 227 for E3M2, take dense-exact). A fold path given a packed
    weight without its fold packs the weight again on the call (correct, slower). Raises TypeError /
    ValueError on a weight that is not an MXTensor (N, K) along K, or an unknown ``act``.
    """
    if act not in PACK_ACTS:
        raise ValueError(f"act={act!r}: one of {PACK_ACTS}")
    if isinstance(w, PackedWeight):
        if dense is not None and (w.dense if w.wide is None else w.wide.dense) is None:
            raise ValueError("pack_weight(dense=...) of a weight packed without that cache: pack its .source again")
        return w
    if dense not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"dense={dense!r}: None, torch.bfloat16 or torch.float16")
    _check_weight(w, "w")
    w = _plain(w)
    fold = _fold(w, defer=True, stats=True) if can_fold(w.fmt) and act != "float" else None
    pending = None if fold is None or isinstance(fold, Folded) else fold
    folded = pending.folded if pending is not None else fold
    builds_mma = act is None or act in {"mxfp4_e2m1": ("float",), "mxfp8_e4m3": ("float", "mx"),
                                        "mxfp8_e5m2": ("float",)}.get(w.fmt.name, ())
    mma_q, mma_s, part = _pack_mma(w) if builds_mma else (None, None, None)
    special = torch.zeros(0, dtype=torch.int64, device=w.device)
    twin = None
    if w.fmt.name in WIDEN and act in (None, "float"):  # (scale bytes with no twin: checked at plan time, _twin)
        twin = pack_weight(widen_fp6(w, check=False), act="float", dense=dense if dense == torch.bfloat16 else None)
    # the dequantized-weight cache (exact where the plan uses it: scale bytes in dense's envelope); an MXFP6
    # weight's bf16 one is its twin's (bf16 activations read the twin)
    dense = _dequantize(w, dense) if dense is not None and (twin is None or dense != torch.bfloat16) else None
    if folded is None:  # no host sync: the scale statistics stay on the device until the first GEMM reads them
        if part is None:
            lo, hi, nan = scale_stats(w.scale)
            codes = _nonfinite_codes(w)
            part = torch.stack([t.to(torch.int32) for t in (lo, hi, nan if codes is None else nan | codes)]).view(1, 3)
        return PackedWeight(w, None, part, special, mma_q, mma_s, twin, dense)
    # one host sync for everything the fold needs: scale extrema, NaN, rows to complete or route aside (the fold
    # kernel makes them on the way; a complete Folded, made on the CPU or empty, has no rows to complete)
    if pending is not None:
        from .fold import weight_stats

        lo, hi, has_nan, out_env, wide = weight_stats(pending.stats)
    else:
        stats = [*(partial_stats(part) if part is not None else scale_stats(w.scale)),
                 out_of_envelope(folded.scale[: w.shape[0]]).any()]
        (lo, hi, has_nan, out_env), wide = host_ints(stats), False
    if wide:
        folded = pending.complete()
    if out_env or folded.owner.numel():
        special = _special_rows(folded, w.shape[0])
    return PackedWeight(w, folded, (lo, hi, bool(has_nan)), special, mma_q, mma_s, twin, dense)


def _nonfinite_codes(w: MXTensor) -> Optional[torch.Tensor]:
    """For an MXFP8 weight, a 0-dim bool device tensor: whether an element code is NaN or Inf (E4M3: 0x7F / 0xFF;
    E5M2: exponent field all ones); None for other formats (their codes are finite)."""
    if w.fmt.name not in ("mxfp8_e4m3", "mxfp8_e5m2"):
        return None
    mag = w.qdata.view(torch.uint8) & 0x7F
    return (mag == 0x7F).any() if w.fmt.name == "mxfp8_e4m3" else (mag >= 0x7C).any()


def _pack_mma(w: MXTensor) -> tuple:
    """(q, s, scale statistics or None) of the decode-mma layout for an MXFP4 weight (on CUDA the packing
    kernel's per-program statistics, int32 [P, 3]), of the a8w8-mma layout for an MXFP8 E4M3 weight, of a shape
    the kernel takes; else (None, None, None)."""
    from .matmul_details import _mma_a8w8, _mma_decode

    N, K = w.shape
    if not _mma_decode.shape_ok(N, K):
        return None, None, None
    if w.fmt.name == "mxfp4_e2m1":
        return _mma_decode.pack_mma(w.qdata.contiguous(), w.scale.contiguous(), stats=True)
    if w.fmt.name in ("mxfp8_e4m3", "mxfp8_e5m2"):  # (the a8w8 layout: the same bytes whatever the codes)
        return (*_mma_a8w8.pack_a8w8(w.qdata, w.scale), None)
    return None, None, None


def _a8w8_max_m(b, M: int, dev: torch.device) -> int:
    """The a8w8-mma envelope for weight ``b`` (MXTensor or PackedWeight) at M rows: the table's ``max_m``
    (measured against w8a16-wgmma, the path past it on Hopper's large layers), or its ``max_m_no_wgmma``
    (against bf16-exact) where the wgmma kernel does not take the call (not Hopper, a layer outside its
    envelope, an unpacked weight)."""
    w = b.source if isinstance(b, PackedWeight) else b
    if _wgmma_ok(b, w, M, dev):
        return _mma_max_m(dev, "a8w8_mma")
    return _mma_max_m(dev, "a8w8_mma", "max_m_no_wgmma")


def _a8w8_quant_max_m(dev: torch.device) -> int:
    """The M up to which :func:`a8w8_linear` quantizes bf16 activations inside the a8w8-mma launch (the table's
    ``a8w8_mma.quant_max_m``, default 8); past it, one quantize call first."""
    entry = _envelope(dev, "a8w8_mma") or {}
    return int(entry.get("quant_max_m", 8))


def _a8w8_ok(a_fmt: ElementFormat, b, M: int, dev: torch.device) -> bool:
    """MXFP8 E4M3 activations (``a_fmt``) x weight ``b`` (MXTensor or PackedWeight) of M rows on a8w8-mma."""
    w = b.source if isinstance(b, PackedWeight) else b
    if not (a_fmt.name == "mxfp8_e4m3" and w.fmt.name == "mxfp8_e4m3" and dev.type == "cuda"
            and 0 < M <= _a8w8_max_m(b, M, dev)):
        return False
    from .matmul_details import _mma_a8w8

    return _mma_a8w8.shape_ok(*w.shape) and _mma_a8w8.available(dev) is None


def _wgmma_ok(b, w: MXTensor, M: int, dev: torch.device) -> bool:
    """bf16 activations x an MXFP4 weight, or a packed MXFP8 (E4M3 / E5M2) one without NaN / Inf, on the Hopper
    wgmma kernel (the caller checks the bf16-exact scale envelope and the activations): the table's
    ``w4a16_wgmma`` / ``w8a16_wgmma`` envelope, M <= max_m and N * K >= min_nk, or (the kernel's split-K schedule
    at small M) M <= small_max_m and N * K >= small_min_nk (where it beats dequantize + cuBLAS)."""
    fp8 = w.fmt.name in ("mxfp8_e4m3", "mxfp8_e5m2")
    if not ((w.fmt.name == "mxfp4_e2m1" or fp8) and dev.type == "cuda" and M > 0):
        return False
    if fp8 and not (isinstance(b, PackedWeight) and not b.has_nan):  # (NaN / Inf codes: another path decodes them)
        return False
    from .matmul_details import _w4a16_wgmma

    entry = _envelope(dev, "w8a16_wgmma" if fp8 else "w4a16_wgmma") or {}
    nk = w.shape.numel()
    small = M <= int(entry.get("small_max_m", 0)) and nk >= int(entry.get("small_min_nk", 0))
    return ((small or (M <= int(entry.get("max_m", 0)) and nk >= int(entry.get("min_nk", 0))))
            and _w4a16_wgmma.shape_ok(*w.shape)
            and _w4a16_wgmma.available(dev) is None)


def _w8_mma_envelope(dev: torch.device, nk: int) -> int:
    """The W8A16 mma kernel's M envelope for a weight of N * K = ``nk``: the table's ``w8a16_mma.max_m``, or its
    ``large_max_m`` where ``nk >= large_min_nk`` (16 tokens a block pay on large weights only)."""
    m = _mma_max_m(dev, "w8a16_mma")
    if nk >= int((_envelope(dev, "w8a16_mma") or {}).get("large_min_nk", 1 << 62)):
        m = max(m, _mma_max_m(dev, "w8a16_mma", "large_max_m"))
    return m


def _w8_mma_ok(b, a: torch.Tensor, M: int, dev: torch.device) -> bool:
    """bf16 activations x a packed MXFP8 weight (a8w8 layout, no NaN / Inf) on the W8A16 mma kernel: M within
    :func:`_w8_mma_envelope`."""
    if not (isinstance(b, PackedWeight) and b.mma_q is not None and b.source.fmt.name in ("mxfp8_e4m3", "mxfp8_e5m2")
            and a.dtype == torch.bfloat16 and dev.type == "cuda" and not b.has_nan
            and 0 < M <= _w8_mma_envelope(dev, b.shape[0] * b.shape[1])):
        return False
    from .matmul_details import _mma_a8w8

    return _mma_a8w8.available(dev) is None


def _mma_ok(b, a: torch.Tensor, M: int, dev: torch.device) -> bool:
    if not (isinstance(b, PackedWeight) and b.mma_q is not None and b.source.fmt.name == "mxfp4_e2m1"
            and a.dtype == torch.bfloat16
            and dev.type == "cuda" and 0 < M <= _mma_max_m(dev)):
        return False
    from .matmul_details import _mma_decode

    return _mma_decode.available(dev) is None


# --------------------------------------------------------------------------------------------------------
# the plan


def _a_kind(a) -> str:
    if isinstance(a, MXTensor):
        return "mx"
    if isinstance(a, Folded):
        return "folded"
    if type(a).__name__ == "PendingFold":  # mxkit.kernels.fold.PendingFold (imported lazily: needs triton)
        return "pending"
    if isinstance(a, Fp8Rowwise):
        return "fp8_rowwise"
    if isinstance(a, torch.Tensor):
        return "float"
    raise TypeError(f"a must be a float tensor, an MXTensor, a Folded or an Fp8Rowwise, got {type(a).__name__}")


def _a_rows_k(a, kind: str) -> tuple[int, int]:
    if kind == "mx":
        if a.axis != a.ndim - 1:
            raise ValueError(f"an MXTensor a must be quantized along its last axis, got axis={a.axis}")
        return a.shape[:-1].numel(), a.shape[-1]
    if kind == "folded":
        return a.rows(), a.data.shape[-1]
    if kind == "pending":
        return a.folded.rows(), a.folded.data.shape[-1]
    if kind == "fp8_rowwise":
        return a.data.shape[:-1].numel(), a.data.shape[-1]
    if a.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"a.dtype={a.dtype} is not supported; expected float32, bfloat16 or float16")
    if a.dim() < 1:
        raise ValueError("a must have at least one dimension (..., K)")
    return a.shape[:-1].numel(), a.shape[-1]


def _a_device(a, kind: str) -> torch.device:
    if kind == "pending":
        return a.folded.device
    return a.data.device if kind in ("folded", "fp8_rowwise") else a.device


def _twin(a, b, kind: str):
    """The operand a GEMM of ``a`` reads for weight ``b``: ``b.wide``, the packed MXFP8 twin of an MXFP6 weight,
    for bf16 activations when every scale byte has its twin (``b.scale_max`` <= 254 - shift: one host sync the
    first time a weight's statistics are read) and the twin's scale bytes lie in the MXFP8 bf16-exact envelope
    (the twin's paths check that one, wider than the values need); else ``b``. (fp16 activations keep the MXFP6
    weight: E5M2's fp16 envelope is far narrower than E3M2's.)"""
    if not (kind == "float" and isinstance(b, PackedWeight) and b.wide is not None and a.dtype == torch.bfloat16):
        return b
    shift = WIDEN[b.fmt.name][1]
    ok = b.scale_max <= 254 - shift and in_range(b.scale_min + shift, b.scale_max + shift,
                                                 exact_scale_range(b.wide.fmt, torch.bfloat16))
    return b.wide if ok else b


def plan_gemm(a, b: Union[MXTensor, PackedWeight], out_dtype: Optional[torch.dtype] = None) -> GemmPlan:
    """The path ``run_gemm(a, b)`` takes on its device, with a one-line reason. Reads a PackedWeight's scale
    statistics (one host sync the first time they are read, then kept: read them before a CUDA-graph capture,
    as MXLinear does); an MXTensor weight's scale extrema (one host sync), and on the CPU an MX ``a``'s.
    Raises TypeError / ValueError on operands that do not fit together."""
    kind = _a_kind(a)
    twin = _twin(a, b, kind)
    if twin is not b:
        p = plan_gemm(a, twin, out_dtype)
        return dataclasses.replace(p, reason=f"{b.fmt.name} weight read as its exact {twin.fmt.name} twin "
                                             f"(pack_weight): {p.reason}")
    w = b.source if isinstance(b, PackedWeight) else b
    _check_weight(w)
    M, K = _a_rows_k(a, kind)
    N = w.shape[0]
    if K != w.shape[1]:
        raise ValueError(f"K mismatch: a has K={K}, b (N, K) = {tuple(w.shape)}")
    dev = _a_device(a, kind)
    if dev != w.device:
        raise ValueError(f"a is on {dev} but b on {w.device}")
    default = a.dtype if kind == "float" else torch.bfloat16
    out = check_out_dtype(out_dtype or default)

    def plan(path: str, reason: str) -> GemmPlan:
        return GemmPlan(path, reason, M, N, K, out)

    wf = w.fmt
    # Hopper's FP8 tensor cores add products with fewer bits than float32 (about 1e-5 relative): a float32
    # output takes an exact route instead of the FP8 GEMM (bf16 / fp16 outputs round far coarser than that)
    f32 = out == torch.float32 and dev.type == "cuda"
    why32 = ("a float32 output: the FP8 tensor cores' accumulation is below float32 precision (FP4 / FP6 values "
             "are as exact in bf16 as in float32)")
    if kind == "pending":
        if not can_fold(wf):
            raise ValueError(f"a pending fold needs a weight that folds, got {wf.name}")
        if f32:
            return plan("bf16-exact" if a.source is not None else "fp32-exact", why32)
        return plan("fold-fp8", f"{a.folded.fmt.name} x {wf.name} both fold to E4M3 (fold ranges of mxkit.fold)")
    if kind in ("mx", "folded") and can_fold(wf) and (kind == "folded" or can_fold(a.fmt)):
        if f32:
            return plan("bf16-exact" if kind == "mx" else "fp32-exact", why32)
        return plan("fold-fp8", f"{a.fmt.name} x {wf.name} both fold to E4M3 (fold ranges of mxkit.fold)")
    if kind == "fp8_rowwise" and can_fold(wf):
        if f32:
            return plan("fp32-exact", why32)
        return plan("w4a8-fp8", f"{wf.name} weight folds to E4M3; activations are FP8 E4M3 rowwise")
    if kind == "mx" and _a8w8_ok(a.fmt, b, M, dev):
        return plan("a8w8-mma", f"M={M} <= the MXFP8 x MXFP8 envelope ({_a8w8_max_m(b, M, dev)}, "
                                f"gemm_table): E4M3 codes on FP8 tensor cores, every scale byte exact")
    lo, hi = ((b.scale_min, b.scale_max) if isinstance(b, PackedWeight) else scale_extrema(w.scale)[:2])
    if kind == "mx" and dev.type == "cuda":  # a's scales are not read: the fix-up takes its rows outside
        if not in_range(lo, hi, exact_scale_range(wf, torch.bfloat16)):
            return plan("fp32-exact", f"{a.fmt.name} x {wf.name}: weight scale bytes [{lo}, {hi}] outside the "
                                      f"bf16-exact envelope")
        r0, r1 = exact_scale_range(a.fmt, torch.bfloat16)
        if wf.name != "mxfp4_e2m1" and _wgmma_ok(b, w, M, dev):
            return plan("w8a16-wgmma", f"{a.fmt.name} x packed {wf.name}, M={M} in the w8a16_wgmma envelope "
                                       f"(gemm_table): a dequantized to bf16, the weight decoded on the wgmma "
                                       f"kernel (scale bytes [{lo}, {hi}] exact in bf16); rows of a with a scale "
                                       f"byte outside [{r0}, {r1}] are recomputed exactly by the fix-up kernel")
        return plan("bf16-exact", f"{a.fmt.name} x {wf.name}: the weight is exact in bf16 (scale bytes [{lo}, "
                                  f"{hi}]); rows of a with a scale byte outside [{r0}, {r1}] are recomputed "
                                  f"exactly by the fix-up kernel")
    if kind == "mx":
        alo, ahi, _ = scale_extrema(a.scale)
        if in_range(alo, ahi, exact_scale_range(a.fmt, torch.bfloat16)) and in_range(
                lo, hi, exact_scale_range(wf, torch.bfloat16)):
            return plan("bf16-exact", f"{a.fmt.name} x {wf.name}: every value is exact in bf16 "
                                      f"(scale bytes a [{alo}, {ahi}], b [{lo}, {hi}])")
        return plan("fp32-exact", f"{a.fmt.name} x {wf.name}: scale bytes outside the bf16-exact envelope")
    if kind == "float" and _w8_mma_ok(b, a, M, dev):
        return plan("w8a16-mma", f"M={M} <= the W8A16 envelope ({_w8_mma_envelope(dev, N * K)}, gemm_table): bf16 x "
                                 f"packed {wf.name} codes on tensor cores (exact for every scale byte)")
    if kind == "float" and _mma_ok(b, a, M, dev):
        return plan("decode-mma", f"M={M} <= the tensor-core decode envelope ({_mma_max_m(dev)}, gemm_table), "
                                  f"bf16 x packed {wf.name} (exact for every scale byte)")
    if kind == "float" and a.dtype in (torch.bfloat16, torch.float16):
        rng = exact_scale_range(wf, a.dtype)
        if (dev.type == "cuda" and in_range(lo, hi, rng) and 0 < M <= _decode_max_m(dev)
                and _decode_takes(wf, N, K, dev)):
            return plan("decode-w16", f"M={M} <= the decode envelope ({_decode_max_m(dev)}, gemm_table) for "
                                      f"{a.dtype} x {wf.name}")
        if isinstance(b, PackedWeight) and b.dense is not None and b.dense.dtype == a.dtype and in_range(lo, hi, rng):
            return plan("dense-cached", f"M={M} past the decode envelopes: {a.dtype} x the weight's dequantized "
                                        f"cache (pack_weight(dense=...)), cuBLAS with no dequantize per call")
        if a.dtype == torch.bfloat16 and in_range(lo, hi, rng) and _wgmma_ok(b, w, M, dev):
            path = "w4a16-wgmma" if wf.name == "mxfp4_e2m1" else "w8a16-wgmma"
            return plan(path, f"M={M} past the decode envelopes: bf16 x {wf.name} on the Hopper wgmma "
                              f"kernel (scale bytes [{lo}, {hi}] exact in bf16)")
        if in_range(lo, hi, rng):
            return plan("dense-exact", f"{a.dtype} activations x {wf.name} weight: the weight is exact in "
                                       f"{a.dtype} (scale bytes [{lo}, {hi}] within [{rng[0]}, {rng[1]}])")
        return plan("fp32-exact", f"{wf.name} weight scale bytes [{lo}, {hi}] outside the {a.dtype}-exact "
                                  f"range [{rng[0]}, {rng[1]}]")
    if kind == "float":
        return plan("fp32-exact", "float32 activations")
    return plan("fp32-exact", f"{kind} activations x {wf.name} weight: no folded FP8 path for this pair")


# --------------------------------------------------------------------------------------------------------
# the paths


def _cublas_flags():
    """(getters, setters) of cuBLAS's TF32 and bf16 / fp16 reduced-precision reduction settings in ``torch._C``
    where this PyTorch has them and its getters give a bool or a (bool, bool) pair, else None (then the
    ``torch.backends.cuda.matmul`` properties, which cost ~4 µs of host time for the six reads and writes of
    :func:`_exact_cublas`). Probed by reading only, at the first use."""
    C = torch._C
    try:
        get = (C._get_cublas_allow_tf32, C._get_cublas_allow_bf16_reduced_precision_reduction,
               C._get_cublas_allow_fp16_reduced_precision_reduction)
        put = (C._set_cublas_allow_tf32, C._set_cublas_allow_bf16_reduced_precision_reduction,
               C._set_cublas_allow_fp16_reduced_precision_reduction)
        vals = [g() for g in get]
    except (AttributeError, TypeError, RuntimeError):
        return None
    ok = isinstance(vals[0], bool) and all(
        isinstance(v, bool) or isinstance(v, tuple) and len(v) == 2 and all(isinstance(b, bool) for b in v)
        for v in vals[1:])
    return (get, put) if ok else None


_CUBLAS: list = []  # [_cublas_flags(), _fp32_precision_api()], filled at the first use


def _fp32_precision_api():
    """torch._C's getter and setter of the newer per-backend float32 precision (``fp32_precision``), where this
    PyTorch has them (2.9 on), else None."""
    C = torch._C
    get, put = getattr(C, "_get_fp32_precision_getter", None), getattr(C, "_set_fp32_precision_setter", None)
    try:
        return (get, put) if isinstance(get("cuda", "matmul"), str) and callable(put) else None
    except (TypeError, RuntimeError):
        return None


def _tf32_off_new_api(api) -> Optional[str]:
    """cuBLAS's TF32 switched off through the newer API (``torch.backends.cuda.matmul.fp32_precision`` to
    "ieee"), which keeps every view of the setting as it was once restored (a write through the legacy setters
    makes torch refuse to read ``get_float32_matmul_precision`` back: "mix of the legacy and new APIs"). Returns
    the precision to restore ("none" where the value was its parent's, so that it follows the parent again),
    None where it was "ieee" already (nothing written)."""
    get, put = api
    p = get("cuda", "matmul")
    if p == "ieee":
        return None
    put("cuda", "matmul", "ieee")
    return "none" if p == get("cuda", "all") else p


class _exact_cublas:
    """Context: TF32 off and no reduced-precision reductions in cuBLAS for the duration (cuBLAS reads these per
    call; a split-K setting stays as it is), the settings before restored after. Only a setting that is on is
    written (with all off, the default, nothing is); TF32 through torch's newer ``fp32_precision`` API where this
    PyTorch has it (:func:`_tf32_off_new_api`), else the legacy setters."""

    __slots__ = ("saved",)

    def __enter__(self):
        if not _CUBLAS:
            _CUBLAS.append(_cublas_flags())
            _CUBLAS.append(_fp32_precision_api())
        fns = _CUBLAS[0]
        m = torch.backends.cuda.matmul
        if fns is None:
            get = (lambda: m.allow_tf32, lambda: m.allow_bf16_reduced_precision_reduction,
                   lambda: m.allow_fp16_reduced_precision_reduction)
        else:
            get = fns[0]
        try:
            on = get[0]()
        except RuntimeError:  # (a state of the newer API the legacy getter refuses to read)
            on = True
        tf32 = None
        if on:
            api = _CUBLAS[1]
            if api is not None:
                p = _tf32_off_new_api(api)
                tf32 = None if p is None else (p,)
            else:
                tf32 = True
                if fns is None:
                    m.allow_tf32 = False
                else:
                    fns[1][0](False)
        saved = [tf32, None, None]
        for i in (1, 2):
            v = get[i]()
            if v[0] if isinstance(v, tuple) else v:
                saved[i] = v
                if fns is None:
                    setattr(m, _REDUCTIONS[i - 1], False)
                else:
                    fns[1][i](False, v[1]) if isinstance(v, tuple) else fns[1][i](False)
        self.saved = saved

    def __exit__(self, *exc) -> None:
        tf32, bf16, fp16 = self.saved
        if tf32 is None and bf16 is None and fp16 is None:
            return
        fns = _CUBLAS[0]
        m = torch.backends.cuda.matmul
        if isinstance(tf32, tuple):
            _CUBLAS[1][1]("cuda", "matmul", tf32[0])
        elif tf32 is not None:
            if fns is None:
                m.allow_tf32 = True
            else:
                fns[1][0](True)
        for i, v in ((1, bf16), (2, fp16)):
            if v is None:
                continue
            if fns is None:
                setattr(m, _REDUCTIONS[i - 1], v)
            else:
                fns[1][i](*v) if isinstance(v, tuple) else fns[1][i](v)


_REDUCTIONS = ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")


def _values_fp32(a, kind: str) -> torch.Tensor:
    """a's exact values as float32 (R, K) (Fp8Rowwise: the E4M3 values only; its row scale is applied after)."""
    if kind == "mx":
        return _dequantize(_plain(a), torch.float32).reshape(-1, a.shape[-1])
    if kind == "folded":
        return _unfold_fp32(a)
    if kind == "fp8_rowwise":
        return a.data.reshape(-1, a.data.shape[-1]).to(torch.float32)
    return a.reshape(-1, a.shape[-1]).to(torch.float32)


def _unfold_fp32(f: Folded, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Exact float32 values of a Folded's source rows (all, or ``rows``): each row plus its extra slices (disjoint
    blocks, so the sums are exact); NaN rows NaN."""
    R = f.rows()
    if rows is None:
        rows = torch.arange(R, device=f.data.device)
    vals = f.data[rows].to(torch.float32) * f.scale[rows, None]
    if f.owner.numel():
        where = torch.full((R,), -1, dtype=torch.int64, device=vals.device)
        where[rows] = torch.arange(rows.numel(), device=vals.device)
        dest = where[f.owner.to(vals.device)]
        keep = dest >= 0
        extra = f.data[R:][keep].to(torch.float32) * f.scale[R:][keep, None]
        vals = vals.index_add(0, dest[keep], extra)
    return vals


def _fp32_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with _exact_cublas():
        return x @ w.t()


def _row_scale(kind: str, a, R: int) -> Optional[torch.Tensor]:
    return a.scale.reshape(R, 1) if kind == "fp8_rowwise" else None


def _fp8_gemm(A: torch.Tensor, sa: torch.Tensor, fb: Folded, N: int, out_dtype: torch.dtype,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """cuBLAS FP8 GEMM with rowwise float32 scales: (A * sa) @ (B * sb).T [+ bias], one output rounding. Off CUDA
    (the CPU interpreter's runs) the same in float32 (exact products; torch's CPU ``_scaled_mm`` takes per-tensor
    scales only before torch 2.13)."""
    B = fb.data[:N]
    sb = fb.scale[:N].reshape(1, N)
    if A.device.type != "cuda":
        y = (A.to(torch.float32) @ B.to(torch.float32).t()) * sa.reshape(-1, 1) * sb
        return (y if bias is None else y + bias.to(torch.float32)).to(out_dtype)
    pad = -N % 16
    if pad:  # cuBLAS FP8 needs N % 16 == 0: zero rows appended (a copy of B per call; real N are multiples)
        B = torch.cat([B, B.new_zeros(pad, B.shape[1])])
        sb = torch.cat([sb, sb.new_ones(1, pad)], dim=1)
    if out_dtype == torch.bfloat16 and bias is None:
        y = torch._scaled_mm(A, B.t(), sa.contiguous(), sb.contiguous(), out_dtype=torch.bfloat16)
    else:
        y = torch._scaled_mm(A, B.t(), sa.contiguous(), sb.contiguous(), out_dtype=torch.float32)
        y = y if bias is None else y + torch.nn.functional.pad(bias.to(torch.float32), (0, pad))
        y = y.to(out_dtype)
    return y[:, :N].contiguous() if pad else y


def run_gemm(a, b: Union[MXTensor, PackedWeight], plan: GemmPlan, bias: Optional[torch.Tensor] = None
             ) -> torch.Tensor:
    """Execute ``plan`` (from :func:`plan_gemm` on the same operands). Returns (..., N) in plan.out_dtype."""
    kind = _a_kind(a)
    lead = _lead_shape(a, kind)
    M, N, K, out = plan.M, plan.N, plan.K, plan.out_dtype
    path = plan.path
    if path == "reference":
        return reference_gemm(a, b, out, bias)
    b = _twin(a, b, kind)
    packed = b if isinstance(b, PackedWeight) else None
    w = packed.source if packed is not None else _plain(b)
    if M == 0:  # no rows: an empty output, no launch
        return torch.empty(*lead, N, dtype=out, device=w.device)
    if kind == "pending" and path == "bf16-exact":  # (a float32 output): the MX tensor the fold was made from
        a, kind = _mx_source(a.source), "mx"
    if kind == "pending" and (path != "fold-fp8" or a.source is None):
        a, kind = a.complete(), "folded"
    if path in ("fold-fp8", "w4a8-fp8"):
        pw = packed if packed is not None and packed.folded is not None else pack_weight(w)
        fb = pw.folded
        if kind == "fp8_rowwise":
            y = _fp8_gemm(a.data.reshape(M, K), a.scale.reshape(M, 1), fb, N, out, bias)
            if pw.special_rows.numel():
                y = _fix_special(y, a, kind, M, pw, pw.special_rows[:0], pw.special_rows, bias)
            return y.reshape(*lead, N)
        # an MX a: a PendingFold on CUDA (it keeps its source), a complete Folded on the CPU
        fa = _fold(_plain(a), defer=True) if kind == "mx" else a
        if not isinstance(fa, Folded):  # deferred: the FP8 GEMM, then the fix-up kernel; no host sync
            from .matmul_details._row_fixup import fixup

            y = _fp8_gemm(fa.folded.data[:M], fa.folded.scale[:M].reshape(M, 1), fb, N, out, bias)
            fixup(y, fa.source, pw.source, bias, M, N, K, fold=(fa.status, fa.folded.scale),
                  special=pw.special_rows)
            return y.reshape(*lead, N)
        # a complete Folded: one host sync, after the GEMM is enqueued: whether any row needs the float32 route
        flag_host, ready = _to_host_async(out_of_envelope(fa.scale[:M]).any())
        y = _fp8_gemm(fa.data[:M], fa.scale[:M].reshape(M, 1), fb, N, out, bias)
        ready.synchronize()
        a_fix = bool(flag_host) or fa.owner.numel() > 0
        if a_fix or pw.special_rows.numel():
            a_rows = _special_rows(fa, M) if a_fix else pw.special_rows[:0]
            y = _fix_special(y, fa, "folded", M, pw, a_rows, pw.special_rows, bias)
        return y.reshape(*lead, N)
    acc = out if bias is None else torch.float32  # (with a bias: added in float32, then the one rounding)
    if path == "bf16-exact":
        a = _plain(a)
        y = _dense(_dequantize(a, torch.bfloat16).reshape(M, K), _dequantize(w, torch.bfloat16), acc)
    elif path == "dense-exact":
        wb = _dequantize(w, a.dtype)
        y = _dense(a.reshape(M, K), wb, acc)
    elif path == "dense-cached":
        y = _dense(a.reshape(M, K), packed.dense, acc)
    elif path == "decode-mma":
        return _MmaCall(packed, M, tuple(a.shape), a.stride(), out)(a, bias)
    elif path == "w8a16-mma":
        return _W16Call(packed, M, tuple(a.shape), a.stride(), out)(a, bias)
    elif path == "w4a16-wgmma":
        from .matmul_details import _w4a16_wgmma as wg

        x = a.reshape(M, K)
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # TMA: 16-byte aligned rows
            x = x.clone(memory_format=torch.contiguous_format)
        q, st, one_mul = wg.packed_of(packed) if packed is not None else wg.pack_wgmma(w.qdata, w.scale)
        bm, split = wg.dense_schedule(M, N, K, x.device)
        return wg.w4a16_wgmma(x, q, st, N, one_mul, out, _f32_bias(bias), bm=bm, split=split).reshape(*lead, N)
    elif path == "w8a16-wgmma":
        from .matmul_details import _w4a16_wgmma as wg

        if kind == "mx":
            a = _plain(a)
        x = a.reshape(M, K) if kind == "float" else _dequantize(a, torch.bfloat16).reshape(M, K)
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # TMA: 16-byte aligned rows
            x = x.clone(memory_format=torch.contiguous_format)
        q, st, one_mul = wg.packed_of(packed)
        bm, split = wg.dense_schedule(M, N, K, x.device)
        y = wg.w4a16_wgmma(x, q, st, N, one_mul, out, _f32_bias(bias), bm=bm, split=split,
                           elem=wg.FP8_ELEMS[w.fmt.name])
        if kind == "mx":  # rows of a whose values bf16 does not hold exactly: recomputed
            from .matmul_details._row_fixup import fixup

            fixup(y, a, w, bias, M, N, K)
        return y.reshape(*lead, N)
    elif path == "a8w8-mma":
        return _a8w8(_plain(a), None, w, M, lead, out, bias, packed)
    elif path == "decode-w16":
        x = a if a.is_contiguous() else a.contiguous()
        bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
        return _DecodeCall(w, M, lead, out, bias is not None, a.device)(x, bias)
    elif path == "fp32-exact":
        y = _fp32_gemm(_values_fp32(a, kind), _dequantize(w, torch.float32))
        rs = _row_scale(kind, a, M)
        if rs is not None:
            y = y * rs
    else:
        raise ValueError(f"unknown GEMM path {path!r}; known: {', '.join(PATHS)}")
    if bias is not None:
        y = y.to(torch.float32) + bias.to(torch.float32)
    y = y.to(out)
    if path == "bf16-exact" and y.is_cuda:  # rows of a whose values bf16 does not hold exactly: recomputed
        from .matmul_details._row_fixup import fixup

        fixup(y, a, w, bias, M, N, K)
    return y.reshape(*lead, N)


@functools.lru_cache(maxsize=1)
def _decode_launchers():
    """The direct launchers of the decode GEMM and its split-K sum, one per process, so every call (prepared or
    not) reuses their compiled kernels."""
    from . import launch
    from .matmul_details import _w16_decode

    return (launch._Launcher(_w16_decode, "_w16_decode_kernel"),
            launch._Launcher(_w16_decode, "_splitk_reduce_kernel"))


class _DecodeCall:
    """The decode-w16 launch of one (weight, M, K, out dtype, bias or not), prepared once: two launches per
    call (the GEMM's split-K partials, then their fixed-order sum with the bias and the output rounding) through
    :class:`mxkit.kernels.launch._Launcher` (:func:`prepared_call`)."""

    def __init__(self, w: MXTensor, M: int, lead: tuple, out: torch.dtype, has_bias: bool, device: torch.device,
                 cfg: Optional[DecodeConfig] = None):
        import triton

        cfg = cfg or decode_config(device, w.shape[1])
        N, K = w.shape
        bk = cfg.block_k
        k_split = triton.cdiv(triton.cdiv(K, cfg.split_k), bk) * bk
        self.nsplit = triton.cdiv(K, k_split)
        self.q, self.s = w.qdata.contiguous(), w.scale.contiguous()
        self.M, self.N, self.K, self.k_split, self.lead, self.out = M, N, K, k_split, lead, out
        self.grid = (triton.cdiv(N, cfg.block_n), self.nsplit)
        self.consts = (("BLOCK_M", max(16, triton.next_power_of_2(M))), ("BLOCK_N", cfg.block_n), ("BLOCK_K", bk),
                       ("W_KIND", W_KINDS[w.fmt.name]), ("num_stages", cfg.num_stages))
        self.warps = cfg.num_warps
        self.rgrid = (triton.cdiv(M * N, 1024),)
        self.rconsts = (("NSPLIT", self.nsplit), ("HAS_BIAS", has_bias), ("BLOCK", 1024))
        self.gemm, self.reduce = _decode_launchers()

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        M, N = self.M, self.N
        x = a.reshape(M, self.K)
        part = torch.empty(self.nsplit, M, N, device=a.device, dtype=torch.float32)
        self.gemm(self.grid, (x, self.q, self.s, part, M, N, self.K, x.stride(0), self.k_split), self.consts,
                  self.warps)
        y = torch.empty(M, N, device=a.device, dtype=self.out)
        # (the launcher takes tensors and ints only: without a bias, part stands in, never read)
        self.reduce(self.rgrid, (part, part if bias is None else bias, y, M * N, N), self.rconsts, 4)
        return y.view(*self.lead, N)


def decode_w16(x: torch.Tensor, w: MXTensor, cfg: Optional[DecodeConfig] = None) -> torch.Tensor:
    """The decode-w16 kernel alone on x bf16 (M, K) and an MX weight (N, K) with schedule ``cfg`` (default: the
    table's), bf16 out, no bias: ``mxkit tune gemm``'s timed call. No envelope check (the caller's)."""
    return _DecodeCall(w, x.shape[0], (x.shape[0],), torch.bfloat16, False, x.device, cfg)(x, None)


def _a8w8(a: Optional[MXTensor], x: Optional[torch.Tensor], w: MXTensor, M: int, lead: tuple,
          out: torch.dtype, bias: Optional[torch.Tensor], packed: Optional[PackedWeight] = None) -> torch.Tensor:
    """The a8w8-mma kernel on an MXFP8 ``a`` (plain scales) or, with ``a`` None, bf16 rows ``x`` quantized in
    the kernel; weight ``w`` E4M3 (N, K), plain scales, read in ``packed``'s a8w8 layout where it has one.
    Returns (*lead, N) in ``out``."""
    from .matmul_details._mma_a8w8 import A8W8, weight_ok, x_ok

    N, K = w.shape
    shape = None
    if packed is not None and packed.mma_q is not None:
        wq, ws, shape = packed.mma_q, packed.mma_s, (N, K)
    else:
        wq, ws = w.qdata, w.scale
        if not weight_ok(wq, ws):
            wq, ws = wq.contiguous().clone(), ws.contiguous().clone()
    quant = a is None
    if quant:
        xv, xs = x.reshape(M, K), None
    else:
        xv, xs = a.qdata.reshape(M, K), a.scale.reshape(M, K // 32)
        if xs.stride(-1) != 1 or xs.stride(0) % 2 or xs.data_ptr() % 2:
            xs = xs.contiguous().clone()
    if not x_ok(xv, quant):
        xv = xv.contiguous().clone()
    bias = _kernel_bias(bias)
    y = torch.empty(*lead, N, device=w.device, dtype=out)
    # the prepared launch (kernel, grid, split-K workspace) is kept on the weight object, one per (M, out, mode)
    runs = _calls_on(packed if shape is not None else w, "_a8w8")
    key = (M, out, quant, wq.data_ptr())
    run = runs.get(key)
    if run is None:
        run = runs[key] = A8W8(wq, ws, M, out, quant, shape=shape)
    return run(xv, xs, bias, y)


_UNSEEN = object()  # (a key not in a dict of prepared calls, whose values may be None)


def _calls_on(holder, name: str) -> dict:
    """The dict of prepared calls kept on a weight object (PackedWeight or MXTensor) under ``name``: not a field,
    so dataclasses.replace / .to() start a new one; emptied when it reaches 64 entries (many shapes, e.g.
    prefill of varying lengths) so that it stays small."""
    calls = holder.__dict__.get(name)
    if calls is None:
        calls = {}
        object.__setattr__(holder, name, calls)
    elif len(calls) >= 64:
        calls.clear()
    return calls


def a8w8_linear(x: torch.Tensor, w: Union[MXTensor, PackedWeight], bias: Optional[torch.Tensor] = None,
                out_dtype: Optional[torch.dtype] = None) -> Optional[torch.Tensor]:
    """``quantize(x, "mxfp8") @ w.T + bias``: bf16 activations x (..., K) quantized to MXFP8 E4M3 inside the
    a8w8-mma kernel up to ``a8w8_mma.quant_max_m`` rows (default 8: one launch; past that x is quantized once
    first, two launches) (OCP FLOOR scale, round to nearest even: the bytes of :func:`mxkit.quantize`; with the
    same split of K the kernel gives the bits it gives on ``quantize(x, "mxfp8")``, and this call may split K
    more on small grids, so it agrees with ``matmul(quantize(x, "mxfp8"), w)`` within the GEMM bound), weight
    an MXFP8 E4M3 MXTensor (N, K) or its PackedWeight. Returns (..., N) in ``out_dtype`` (default bf16), or None
    where the kernel does not take the call (not CUDA, not bf16, another format, M past the
    envelope, N % 16 or K % 64, a GPU older than sm_89, while torch.compile traces): the caller then quantizes
    and calls matmul."""
    packed = w if isinstance(w, PackedWeight) else None
    w = w.source if packed is not None else w
    if not (isinstance(w, MXTensor) and x.dtype == torch.bfloat16 and x.is_cuda and w.ndim == 2
            and w.axis == 1 and x.dim() >= 1 and x.shape[-1] == w.shape[1] and w.device == x.device
            and not torch.compiler.is_compiling()):
        return None
    M = x.shape[:-1].numel()
    if not _a8w8_ok(w.fmt, packed if packed is not None else w, M, x.device):  # (x quantized to E4M3)
        return None
    out = check_out_dtype(out_dtype or torch.bfloat16)
    if bias is not None:
        check_bias(bias, GemmPlan("a8w8-mma", "", M, w.shape[0], w.shape[1], out), w.device)
    if M > _a8w8_quant_max_m(x.device):  # (past it: quantize once, then the GEMM: two launches)
        from .quantize import quantize_triton

        return _a8w8(_plain(quantize_triton(x, "mxfp8_e4m3")), None, _plain(w), M, tuple(x.shape[:-1]), out, bias,
                     packed)
    return _a8w8(None, x, _plain(w), M, tuple(x.shape[:-1]), out, bias, packed)


def check_bias(bias: Optional[torch.Tensor], plan: GemmPlan, device: torch.device) -> None:
    """A GEMM bias is None or a 1-D (N,) floating-point tensor on the weight's device (it is added in float32);
    TypeError for another dtype, ValueError otherwise."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or bias.dim() != 1:
        raise ValueError(f"bias must be a 1-D tensor (N,), got {getattr(bias, 'shape', type(bias).__name__)}")
    if not bias.dtype.is_floating_point:
        raise TypeError(f"bias must be a floating-point tensor (added in float32), got {bias.dtype}")
    if bias.shape[0] != plan.N or bias.device != device:
        raise ValueError(f"bias has shape {tuple(bias.shape)} on {bias.device}; expected ({plan.N},) on {device}")


class _MmaCall:
    """The decode-mma launch of one (packed weight, shape and strides of a, out dtype): one kernel, the bias
    added in float32 before the one output rounding. Where a's leading dims flatten to rows of one stride (a
    view), the kernel reads a in place and writes the output in its final shape: no reshape, no view."""

    def __init__(self, b: PackedWeight, M: int, a_shape: tuple, a_stride: tuple, out: torch.dtype):
        from .matmul_details._mma_decode import MmaDecode

        self._rows(MmaDecode.of(b, M, out, mma_m8_loop(b.device)), b, M, a_shape, a_stride)

    def _rows(self, run, b: PackedWeight, M: int, a_shape: tuple, a_stride: tuple) -> None:
        self.run = run
        self.M, self.N, self.K = M, *b.shape
        self.out_shape = (*a_shape[:-1], self.N)
        self.ldx = _row_stride(a_shape, a_stride)  # None: a is copied into rows first
        self.device = b.device
        # the C++ fast call of the launch at ldx (y allocated and the kernel launched in one call from Python),
        # made after the first call that ran it where the call object is kept (``kept``: the prepared calls; a
        # one-off call of run_gemm makes none); its inputs: a, the launch's fixed pointers (_pre), the bias
        self.fast, self.fast_pre, self.kept = None, (), False

    def _pre(self) -> tuple:
        """The pointer arguments of the launch between a and the bias (the weight's codes and scales)."""
        return (self.run.q, self.run.s)

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ldx = self.ldx
        if ldx is None or a.data_ptr() % 16:  # the kernel reads rows in 16-byte loads
            a = a.reshape(self.M, self.K).clone(memory_format=torch.contiguous_format)
            ldx = self.K
        else:
            fast = self.fast
            if fast is not None:
                return fast(a, *self.fast_pre, _kernel_bias(bias))
        y = torch.empty(self.out_shape, device=self.device, dtype=self.run.out)
        bias = _kernel_bias(bias)
        y = self._into(a, ldx, bias, y)
        launch = self.run.launch  # (the one launch object read once: its ld is the one it was bound with)
        if (self.kept and ldx == self.ldx and self.fast is None and launch.ld == self._ld(ldx, bias)
                and fast_call_loaded()):
            pre = self._pre()
            n = len(pre) + 2
            fast = launch.with_outputs(tuple(range(n)) + (-1,), [(self.out_shape, self.run.out, False)], n,
                                       single=True)
            if fast is not None:
                self.fast, self.fast_pre = fast, pre
        return y

    def _into(self, a: torch.Tensor, ldx: int, bias: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return self.run.into(a, ldx, bias, y)

    @staticmethod
    def _ld(ldx: int, bias: Optional[torch.Tensor]):
        """The ``ld`` a launch bound by :meth:`_into` at row stride ldx with ``bias`` carries (MmaDecode: ldx and
        the bias flag)."""
        return (ldx, bias_flag(bias))


def _f32_bias(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bias as the Triton GEMM kernels read it: float32, contiguous (converted only where it is not)."""
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    return bias


def _kernel_bias(bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bias as the CUDA C++ kernels read it: float32 or bf16 as it is where contiguous (a bf16 bias needs no
    conversion launch: :func:`._mma_decode.bias_flag`), else converted to float32, contiguous."""
    if bias is not None and (bias.dtype not in (torch.float32, torch.bfloat16) or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    return bias


def _row_stride(shape: tuple, stride: tuple) -> Optional[int]:
    """The stride between a's rows when its leading dims flatten into rows of one stride with unit stride along
    K and that stride a multiple of 8 elements (16 bytes of bf16); None otherwise."""
    if not shape or stride[-1] != 1 and shape[-1] > 1:
        return None
    rows = [(n, st) for n, st in zip(shape[:-1], stride[:-1]) if n != 1]
    ld = rows[-1][1] if rows else shape[-1]
    for (n, st), (n2, st2) in zip(rows, rows[1:]):
        if st != st2 * n2:
            return None
    return ld if ld % 8 == 0 and ld >= shape[-1] else None


class _A8W8Call:
    """The a8w8-mma path of one (packed weight, MXFP8 a's shape and layout, out dtype)."""

    def __init__(self, b: PackedWeight, plan: GemmPlan, lead: tuple):
        self.b, self.M, self.lead, self.out = b, plan.M, lead, plan.out_dtype
        # the C++ fast call of the launch for contiguous plain-layout a (codes rows of K bytes, 16-byte aligned;
        # scale rows of K / 32): y allocated and the kernel launched in one call; made after the first such call
        self.fast, self.fast_pre = None, ()

    def __call__(self, a: MXTensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        q, s = a.qdata, a.scale
        plain = (a.scale_layout == "plain" and q.is_contiguous() and s.is_contiguous() and q.data_ptr() % 16 == 0
                 and s.data_ptr() % 2 == 0)
        fast = self.fast
        if plain and fast is not None:
            return fast(q, s, *self.fast_pre, _kernel_bias(bias))
        y = _a8w8(_plain(a), None, self.b.source, self.M, self.lead, self.out, bias, self.b)
        if plain and fast is None and fast_call_loaded():
            b = self.b
            run = b.__dict__.get("_a8w8", {}).get((self.M, self.out, False, b.mma_q.data_ptr())) \
                if b.mma_q is not None else None
            K = b.shape[1]
            launch = run.launch if run is not None else None  # (read once: its ld is the one it was bound with)
            if launch is not None and launch.ld == (K, K // 32, bias_flag(_kernel_bias(bias))):
                fast = launch.with_outputs((0, 1, 2, 3, 4, -1), [((*self.lead, b.shape[0]), self.out, False)], 5,
                                           single=True)
                if fast is not None:
                    self.fast, self.fast_pre = fast, (run.w, run.sw)
        return y


class _A8W8InCall(_MmaCall):
    """:func:`a8w8_linear`'s one-launch form (bf16 x quantized in the kernel, M <= 8) of one (packed weight,
    shape and strides of x, out dtype): the same kernel, split and bits; x's rows handled as :class:`_MmaCall`
    does."""

    def __init__(self, b: PackedWeight, M: int, x_shape: tuple, x_stride: tuple, out: torch.dtype):
        from .matmul_details._mma_a8w8 import A8W8

        self._rows(A8W8(b.mma_q, b.mma_s, M, out, True, shape=b.shape), b, M, x_shape, x_stride)

    def _pre(self) -> tuple:
        return (None, self.run.w, self.run.sw)  # (x's scales: none, the kernel quantizes x)

    def _into(self, x: torch.Tensor, ldx: int, bias: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return self.run.into(x, ldx, None, 0, bias, y)

    @staticmethod
    def _ld(ldx: int, bias: Optional[torch.Tensor]):
        return (ldx, 0, bias_flag(bias))  # A8W8's: (x's row stride, its scales' row stride: none here, bias flag)


class _W16Call(_A8W8InCall):
    """The w8a16-mma launch of one (packed MXFP8 weight, shape and strides of x, out dtype), x's rows as
    :class:`_MmaCall` handles them."""

    def __init__(self, b: PackedWeight, M: int, x_shape: tuple, x_stride: tuple, out: torch.dtype):
        from .matmul_details._mma_a8w8 import A8W8

        elem = b.source.fmt.name[-4:]
        self._rows(A8W8(b.mma_q, b.mma_s, M, out, True, shape=b.shape, w16=elem), b, M, x_shape, x_stride)


def prepared_call_a8w8(x: torch.Tensor, b: PackedWeight, out_dtype: torch.dtype, bias: Optional[torch.Tensor]):
    """The eager host path of :func:`a8w8_linear` for bf16 ``x`` on CUDA and a PackedWeight in the a8w8 layout at
    M <= ``a8w8_mma.quant_max_m`` (one launch): made on the first call of each (shape, strides, device, out
    dtype, bias shape / dtype, dispatch table) and kept on ``b``; None where a8w8_linear would not take that
    one-launch form (the caller then calls it). Returns a callable ``(x, bias) -> y``."""
    key = ("a8w8-bf16", x.shape, x.stride(), x.dtype, x.get_device(), out_dtype,
           _token_stack[-1] if _token_stack else 0,
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    calls = b.__dict__.get("_calls")
    call = calls.get(key, _UNSEEN) if calls is not None else _UNSEEN
    if call is not _UNSEEN:
        return call
    calls = _calls_on(b, "_calls")
    call = None
    w = b.source
    M = x.shape[:-1].numel()
    if (x.dtype == torch.bfloat16 and x.dim() >= 1 and b.mma_q is not None and w.ndim == 2 and w.axis == 1
            and x.shape[-1] == w.shape[1] and w.device == x.device and 0 < M <= _a8w8_quant_max_m(x.device)
            and _a8w8_ok(w.fmt, b, M, x.device)):
        out = check_out_dtype(out_dtype)
        check_bias(bias, GemmPlan("a8w8-mma", "", M, w.shape[0], w.shape[1], out), w.device)
        call = _A8W8InCall(b, M, tuple(x.shape), x.stride(), out)
        call.kept = True
    calls[key] = call
    return call


class _DenseExactCall:
    """The dense-exact path of one (packed weight, shape of a), a's dtype out, no bias, on CUDA: the weight
    dequantized to a's dtype by the dequantize kernel's C++ fast call (its problem fixed: made by the first call),
    then cuBLAS with float32 accumulation (:func:`_exact_cublas`): :func:`run_gemm`'s launches and bytes, without
    its per-call dispatch. A call with a bias, or before the fast call exists (looked for at up to three calls),
    runs :func:`run_gemm`."""

    def __init__(self, b: PackedWeight, plan: GemmPlan, lead: tuple):
        self.b, self.plan, self.out_shape = b, plan, (*lead, plan.N)
        self.w = _plain(b.source)
        self.deq = None
        self.tries = 0

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        from . import launch

        deq = self.deq
        if deq is None or bias is not None or not launch._enabled:
            y = run_gemm(a, self.b, self.plan, bias)
            if deq is None and self.tries < 3:  # (the fast call exists from the problem's second dequantize)
                from .quantize import dequantize_fast

                self.tries += 1
                self.deq = dequantize_fast(self.w, a.dtype)
            return y
        wb = deq(self.w.qdata, self.w.scale)
        with _exact_cublas():
            y = a.reshape(self.plan.M, self.plan.K) @ wb.t()
        return y.view(self.out_shape)


class _MxBoundCall:
    """A prepared call of an MX a times a PackedWeight (bf16 out, no bias, on CUDA) whose launches are bound after
    :func:`run_gemm` ran them (:meth:`_bind`, tried at up to three calls: the C++ fast calls appear from a
    problem's second call, or once the module is built), then made by :meth:`_fast` with :func:`run_gemm`'s bytes.
    A call with a bias, a's codes or scales not 16-byte aligned (the bound launches' specialisation), or direct
    launches off, runs :func:`run_gemm`."""

    def __init__(self, b: PackedWeight, plan: Optional[GemmPlan], lead: tuple):
        self.b, self.plan, self.out_shape = b, plan, (*lead, b.shape[0])
        self.w = _plain(b.source)
        self.fix = None  # the fix-up's bound launch, set last by _bind
        self.tries = 0

    def __call__(self, a: MXTensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        from . import launch

        q, s = a.qdata, a.scale
        aligned = not (q.data_ptr() % 16 or s.data_ptr() % 16)
        if self.fix is not None and bias is None and aligned and launch._enabled:
            return self._fast(q, s)
        y = run_gemm(a, self.b, self.plan, bias)
        if (self.fix is None and self.tries < 3 and bias is None and aligned and q.is_cuda
                and q.get_device() == torch.cuda.current_device()):  # (launches bind to the current device)
            self.tries += 1
            self._bind(_plain(a))
        return y

    def _bind_fixup(self, a: MXTensor, fold: Optional[tuple], cols: Optional[torch.Tensor]) -> None:
        """The fix-up's bound launch (``self.fix``, and the weight's operands it reads) for problems of a's."""
        from .matmul_details._row_fixup import _launcher, fixup_launch

        M, N, K = self.plan.M, self.plan.N, self.plan.K
        y = torch.empty(M, N, dtype=torch.bfloat16, device=self.b.device)
        grid, tensors, ints, consts, nw = fixup_launch(y, a, self.w, None, M, N, K, fold=fold, cols=cols)
        fix = _launcher().launcher.bind(grid, tensors + ints, consts, nw)
        if fix is not None:
            self.wq, self.ws = tensors[5], tensors[6]
            self.fix = fix


def _fold_operands(b: PackedWeight) -> tuple:
    """The weight's operands of the prepared fold-fp8 calls, made once per PackedWeight (every shape of a shares
    them): its folded E4M3 rows transposed (K, N), their row scales (1, N) and the fix-up's column flags (None
    without special rows; made on this stream and waited for once, so that calls on any stream may read them)."""
    ops = b.__dict__.get("_fold_operands")
    if ops is None:
        from .matmul_details._row_fixup import column_flags

        N = b.shape[0]
        cols = column_flags(b.special_rows, N, b.device)
        if cols is not None:
            torch.cuda.current_stream(b.device).synchronize()
        ops = (b.folded.data[:N].t(), b.folded.scale[:N].reshape(1, N).contiguous(), cols)
        object.__setattr__(b, "_fold_operands", ops)
    return ops


class _FoldCall(_MxBoundCall):
    """The fold-fp8 path (:class:`_MxBoundCall`): a's fold (one C++ fast call: its three outputs allocated and the
    kernel launched; deferred, no host sync), cuBLAS's FP8 GEMM with rowwise scales, the fix-up, with the weight's
    folded operands and the fix-up's column flags made once."""

    def __init__(self, b: PackedWeight, plan: Optional[GemmPlan], lead: tuple):
        super().__init__(b, plan, lead)
        self.bt, self.sb, self.cols = _fold_operands(b)

    def _fast(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self._gemm_fixup(*self.fold(q, s), q, s)

    def _gemm_fixup(self, data: torch.Tensor, scale: torch.Tensor, status: torch.Tensor, aq: torch.Tensor,
                    a_s: Optional[torch.Tensor]) -> torch.Tensor:
        """cuBLAS's FP8 GEMM of a's fold (data, row scale, status) and the fix-up reading a at aq (its codes, or
        the rows a quantize-fold read) and a_s (its scales; None: unread)."""
        y = torch._scaled_mm(data, self.bt, scale, self.sb, out_dtype=torch.bfloat16)
        self.fix.run(y, aq, y if a_s is None else a_s, status, scale, self.wq, self.ws,
                     self.cols if self.cols is not None else y, y)
        return y.view(self.out_shape)

    def _bind(self, a: MXTensor) -> None:
        from .fold import _outputs, bind_fold

        if not fast_call_loaded():
            return
        M, K = self.plan.M, self.plan.K
        data, scale, status = _outputs(M, K, a.device)
        bl = bind_fold(a, data, scale, status)
        self.fold = None if bl is None else bl.with_outputs(
            (0, 1, -1, -2, -3, -3), [((M, K), torch.float8_e4m3fn, False), ((M, 1), torch.float32, False),
                                     ((M,), torch.uint8, False)], 2)
        if self.fold is not None:
            self._bind_fixup(a, (status, scale), self.cols)


class _QuantizeFoldCall(_FoldCall):
    """MXLinear's eager forward where activations fold (act_format and weight both MXFP4 / MXFP6), for one
    (packed weight, bf16 x's shape, activation scale mode and rounding), no bias, on CUDA: x's quantize-fold (one
    C++ fast call: its three outputs allocated and the kernel launched), cuBLAS's FP8 GEMM with rowwise scales,
    the fix-up (rows whose fold is not exact, recomputed from x): the bytes of ``quantize_fold_triton(x,
    defer=True)`` then :func:`run_gemm`, which the first calls (and a call on an x not 16-byte aligned, or with
    direct launches off) run; the launches are bound after them."""

    def __init__(self, b: PackedWeight, lead: tuple, fmt: ElementFormat, mode, rounding):
        super().__init__(b, None, lead)
        self.fmt, self.mode, self.rounding = fmt, mode, rounding

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from . import launch
        from .fold import quantize_fold_triton

        aligned = x.data_ptr() % 16 == 0
        if self.fix is not None and aligned and launch._enabled:
            return self._gemm_fixup(*self.fold(x), x, None)
        pend = quantize_fold_triton(x, self.fmt, scale_mode=self.mode, rounding=self.rounding, defer=True)
        plan = self.plan or plan_gemm(pend, self.b, x.dtype)
        y = run_gemm(pend, self.b, plan, None)
        if (self.fix is None and self.tries < 3 and aligned and plan.path == "fold-fp8" and plan.M
                and plan.out_dtype == torch.bfloat16 and plan.N % 16 == 0
                and x.get_device() == torch.cuda.current_device()):  # (launches bind to the current device)
            self.tries += 1
            self.plan = plan
            self._bind(x)
        return y

    def _bind(self, x: torch.Tensor) -> None:
        from .fold import QuantizedRows, _outputs, bind_quantize_fold

        if not fast_call_loaded():
            return
        M, K = self.plan.M, self.plan.K
        x2 = x.view(M, K)
        data, scale, status = _outputs(M, K, x.device)
        bl = bind_quantize_fold(x2, self.fmt, self.mode, self.rounding, data, scale, status)
        self.fold = None if bl is None else bl.with_outputs(
            (0, -1, -2, -3), [((M, K), torch.float8_e4m3fn, False), ((M, 1), torch.float32, False),
                              ((M,), torch.uint8, False)], 1)
        if self.fold is not None:
            self._bind_fixup(QuantizedRows(x2, self.fmt, self.mode, self.rounding), (status, scale), self.cols)


def prepared_call_quantize_fold(x: torch.Tensor, b: PackedWeight, fmt: ElementFormat, scale_mode, rounding):
    """MXLinear's eager hot path where its activations fold: the :class:`_QuantizeFoldCall` of (b, x's shape,
    strides and device, fmt, scale mode, rounding), made once and kept on b; None where it does not apply (x
    not bf16 or not contiguous, a weight without its fold, no rows)."""
    key = ("qfold", x.shape, x.stride(), x.dtype, x.get_device(), fmt, scale_mode, rounding,
           _token_stack[-1] if _token_stack else 0)
    calls = b.__dict__.get("_calls")
    call = calls.get(key, _UNSEEN) if calls is not None else _UNSEEN
    if call is _UNSEEN:
        if torch.cuda.is_current_stream_capturing():
            return None  # (its operands are made once, outside a capture: a later call makes it)
        calls = _calls_on(b, "_calls")
        call = None
        if (x.dtype == torch.bfloat16 and x.is_contiguous() and x.dim() >= 1 and x.shape[:-1].numel()
                and isinstance(b.folded, Folded) and x.shape[-1] == b.shape[1]):
            call = _QuantizeFoldCall(b, tuple(x.shape[:-1]), fmt, scale_mode, rounding)
        calls[key] = call
    return call


class _Bf16ExactCall(_MxBoundCall):
    """The bf16-exact path (:class:`_MxBoundCall`): a and the weight dequantized to bf16 by the dequantize
    kernel's C++ fast calls, cuBLAS with float32 accumulation (:func:`_exact_cublas`), the fix-up (a's rows with
    a scale byte outside the bf16-exact range)."""

    def _fast(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        w = self.w
        xa = self.deq_a(q, s)
        with _exact_cublas():
            y = xa.view(self.plan.M, self.plan.K) @ self.deq_w(w.qdata, w.scale).t()
        self.fix.run(y, q, s, y, y, self.wq, self.ws, y, y)
        return y.view(self.out_shape)

    def _bind(self, a: MXTensor) -> None:
        from .quantize import dequantize_fast

        self.deq_a, self.deq_w = dequantize_fast(a, torch.bfloat16), dequantize_fast(self.w, torch.bfloat16)
        if self.deq_a is not None and self.deq_w is not None:
            self._bind_fixup(a, None, None)


class _PlannedCall:
    """Any other path with its plan made once (:func:`prepared_call`)."""

    def __init__(self, b: PackedWeight, plan: GemmPlan):
        self.b, self.plan = b, plan

    def __call__(self, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return run_gemm(a, self.b, self.plan, bias)


def prepared_call(a: torch.Tensor, b: PackedWeight, out_dtype: Optional[torch.dtype], bias: Optional[torch.Tensor]):
    """The eager host path of ``matmul(a, b)`` for a float ``a`` on CUDA and a PackedWeight: the plan and the
    launch arguments are made on the first call of each (shape, strides, dtype, device, out dtype, bias
    shape / dtype, dispatch table) and kept on ``b``; later calls only allocate and launch. Returns a callable
    ``(a, bias) -> y``. Validation (:func:`plan_gemm`) runs on the first call of each key."""
    key = (a.shape, a.stride(), a.dtype, a.get_device(), out_dtype, _token_stack[-1] if _token_stack else 0,
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    calls = b.__dict__.get("_calls")
    call = calls.get(key) if calls is not None else None
    if call is None:
        calls = _calls_on(b, "_calls")
        plan = plan_gemm(a, b, out_dtype)
        check_bias(bias, plan, b.device)
        b = _twin(a, b, "float")
        if plan.path == "decode-mma":
            call = _MmaCall(b, plan.M, tuple(a.shape), a.stride(), plan.out_dtype)
            call.kept = True
        elif plan.path == "w8a16-mma":
            call = _W16Call(b, plan.M, tuple(a.shape), a.stride(), plan.out_dtype)
            call.kept = True
        elif plan.path == "decode-w16" and a.is_contiguous() and (bias is None or bias.is_contiguous()):
            call = _DecodeCall(b.source, plan.M, tuple(a.shape[:-1]), plan.out_dtype, bias is not None, a.device)
        elif plan.path == "dense-exact" and plan.out_dtype == a.dtype and bias is None and plan.M:
            call = _DenseExactCall(b, plan, tuple(a.shape[:-1]))
        else:
            call = _PlannedCall(b, plan)
        calls[key] = call
    return call


def prepared_call_mx(a: MXTensor, b: PackedWeight, out_dtype: Optional[torch.dtype],
                     bias: Optional[torch.Tensor]):
    """:func:`prepared_call` for an MX ``a`` on CUDA: the call of the a8w8-mma path, or of the fold-fp8 and
    bf16-exact paths (bf16 out, no bias, plain contiguous a: :class:`_FoldCall`, :class:`_Bf16ExactCall`), whose
    plans depend on shapes and formats only, made once per key and kept on ``b``; None for the other paths (the
    caller plans each call)."""
    calls = _calls_on(b, "_calls")
    key = ("mx", a.shape, a.fmt, a.axis, a.block_size, a.scale_layout, a.qdata.stride(), a.scale.stride(),
           a.qdata.device, out_dtype, _table_token(),
           None if bias is None else (bias.shape, bias.dtype, bias.device, bias.stride()))
    if key in calls:
        return calls[key]
    call = None
    if a.fmt.name == "mxfp8_e4m3" and b.source.fmt.name == "mxfp8_e4m3":
        plan = plan_gemm(a, b, out_dtype)
        check_bias(bias, plan, b.device)
        if plan.path == "a8w8-mma":
            call = _A8W8Call(b, plan, tuple(a.shape[:-1]))
    elif (bias is None and a.scale_layout == "plain" and a.block_size == 32 and a.axis == a.ndim - 1
          and a.qdata.is_contiguous() and a.scale.is_contiguous()):
        if a.qdata.is_cuda and torch.cuda.is_current_stream_capturing():
            return None  # (its operands are made once, outside a capture: a later call makes it)
        plan = plan_gemm(a, b, out_dtype)  # (on CUDA these plans read no value of a)
        if plan.out_dtype == torch.bfloat16 and plan.M:
            if plan.path == "fold-fp8" and plan.N % 16 == 0 and isinstance(b.folded, Folded):
                call = _FoldCall(b, plan, tuple(a.shape[:-1]))
            elif plan.path == "bf16-exact" and a.qdata.is_cuda:  # (on the CPU this plan reads a's scales)
                call = _Bf16ExactCall(b, plan, tuple(a.shape[:-1]))
    calls[key] = call
    return call


def _dense(x: torch.Tensor, w: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """x @ w.T for 16-bit x, w with float32 accumulation; output in ``out`` with one rounding."""
    with _exact_cublas():
        if out == x.dtype or x.device.type != "cuda":
            return (x @ w.t()) if x.device.type == "cuda" else (x.float() @ w.float().t()).to(out)
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            return x.float() @ w.float().t()


def _mx_source(src) -> MXTensor:
    """The MXTensor a deferred fold was made from (a :class:`~mxkit.kernels.fold.QuantizedRows`: quantized now,
    mxkit.quantize's bytes)."""
    if isinstance(src, MXTensor):
        return src
    from .quantize import quantize_triton

    return quantize_triton(src.x, src.fmt, axis=-1, scale_mode=src.scale_mode, rounding=src.rounding)


def _fix_special(y: torch.Tensor, a, kind: str, M: int, pw: PackedWeight, a_rows: torch.Tensor,
                 b_rows: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Recompute the output rows of ``a_rows`` and columns of ``b_rows`` through the float32 route."""
    y = y.clone()
    rs = _row_scale(kind, a, M)
    xa = _values_fp32(a, kind)
    if a_rows.numel():
        part = _fp32_gemm(xa[a_rows], _dequantize(pw.source, torch.float32))
        if rs is not None:
            part = part * rs[a_rows]
        if bias is not None:
            part = part + bias.to(torch.float32)
        y[a_rows] = part.to(y.dtype)
    if b_rows.numel():
        part = _fp32_gemm(xa, _unfold_fp32(pw.folded, b_rows))
        if rs is not None:
            part = part * rs
        if bias is not None:
            part = part + bias[b_rows].to(torch.float32)
        y[:, b_rows] = part.to(y.dtype)
    return y


def _lead_shape(a, kind: str) -> tuple:
    if kind == "mx":
        return tuple(a.shape[:-1])
    if kind == "folded":
        return tuple(a.lead_shape)
    if kind == "pending":
        return tuple(a.folded.lead_shape)
    if kind == "fp8_rowwise":
        return tuple(a.data.shape[:-1])
    return tuple(a.shape[:-1])


def reference_gemm(a, b, out: torch.dtype, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference twin: float32 matmul of the exact operand values (any a kind), then bias, then ``out``."""
    kind = _a_kind(a)
    if kind == "pending":
        a, kind = a.complete(), "folded"
    w = b.source if isinstance(b, PackedWeight) else b
    if kind == "mx":
        y = reference.matmul_reference(a, w, out_dtype=torch.float32)
    else:
        xa = (unfold_reference(a) if kind == "folded" else _values_fp32(a, kind)).to(torch.float32)
        y = xa @ reference.dequantize_reference(w, torch.float32).t()
        rs = _row_scale(kind, a, xa.shape[0])
        if rs is not None:
            y = y * rs
        y = y.reshape(*_lead_shape(a, kind), w.shape[0])
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out)
