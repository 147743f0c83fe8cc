"""Scaled MX GEMMs ``y = a @ b.T`` on Hopper: the plan (which path a call takes, and why) and the paths.

Hopper has no MX tensor-core instruction, so every path re-expresses the MX operands exactly in a type the
tensor cores do take, then accumulates in float32 (the numerics bound of issue #22: the error is that of
float32 accumulation plus one output rounding; on the FP8 paths, fold-fp8 and w4a8-fp8, each 128-deep step's
products are added in the FP8 tensor cores' ~14-bit accumulator and the steps in float32, see ``fold-fp8``):

``fold-fp8``
    FP4 / FP6 × FP4 / FP6. Each row of 32-element blocks is folded into FP8 E4M3 with one power-of-two
    float32 scale per row (:mod:`mxkit.fold`; exact when the row's block scales span at most the format's
    fold range, e.g. 14 for E2M1), then cuBLAS' FP8 GEMM with rowwise scales (``torch._scaled_mm``).
    bf16 / fp16 outputs only on CUDA: Hopper's FP8 tensor cores add products with fewer bits than float32
    (up to 5e-5 relative error on MXFP6 rows, measured), so a float32 output takes ``bf16-exact`` (every
    FP4 / FP6 value times its scale is as exact in bf16 as in float32) or ``fp32-exact``.
``w4a8-fp8``
    FP4 / FP6 weights × FP8 E4M3 activations with a float32 scale per row (:class:`mxkit.Fp8Rowwise`,
    TensorRT-LLM's W4A8): the folded weight into the same FP8 GEMM (cuBLAS' epilogue, measured on the H100:
    row scales of 2^-149 to 2^120 against weight scales of 2^-54 to 2^54 come out finite wherever the product
    is, ``benchmarks/probes/cublas_rowwise_order.py``); the weight's special rows' columns are then recomputed
    by the fix-up kernel on CUDA (no host sync; it also redoes any row whose scale lies outside 2^+-54).
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
    MXFP8 (E4M3) activations × an MXFP8 (E4M3) weight at small M (the tuned table's ``a8w8_mma.max_m``, default 16,
    and ``max_m_no_wgmma``, 64, on layers w8a16-wgmma does not take; N % 16 == 0, K % 64 == 0; sm_89+): both operands'
    E4M3 codes straight into FP8 tensor cores (``mma.sync`` m16n8k32, a CUDA C++ kernel shipped as PTX,
    :mod:`.matmul_details._mma_a8w8`), each 32-element block's product summed in float32 and multiplied by its two
    E8M0 factors in float32 (the weight's first, exact for weight scale bytes 19-232, the envelope; the activation's
    inside the fma, any byte); read as mxkit stores them or in ``pack_weight``'s a8w8 layout. :func:`a8w8_linear` is
    the same kernel from bf16 activations, quantized inside it up to the table's ``quant_max_m`` rows (one launch; the
    bytes of ``mxkit.quantize(x, "mxfp8")``). On sm_90 from MXFP8 a at M <= 8 on layers of at least one 16-row strip
    per multiprocessor, the packed weight is streamed by Hopper bulk copies (``mma_a8w8_bulk.cu``: a producer warp, a
    ring of shared-memory chunks, persistent blocks) into the same arithmetic: the bits of the kernel at one thread
    block along K (from bf16 x too, up to 2 rows, or 4 on layers of N >= 14336: x quantized once a block).
``w8a16-mma``
    bf16 activations × a packed MXFP8 (E4M3 / E5M2) weight without NaN / Inf codes at small M (the tuned
    table's ``w8a16_mma.max_m``, default 8; N % 16 == 0, K % 64 == 0; sm_89+): the a8w8-mma kernel's file and
    weight layout, the codes decoded to bf16 exactly and multiplied by bf16 x on ``mma.sync`` m16n8k16, each
    block's float32 sum scaled once by its E8M0 factor (every scale byte exact).
``decode-w16``
    bf16 / fp16 activations × an MXFP4, MXFP8 or MXINT8 weight, or an MXFP6 one up to
    ``decode_w4a16.fp6_max_nk`` elements, at small M (the tuned table's ``max_m``): a Triton
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
layout (:mod:`mxkit.kernels.matmul_calls`): the decode paths as one C++ fast call each, and the
prefill paths of two or three launches (``dense-exact``, ``fold-fp8`` from MX activations, ``bf16-exact``) with
their fold / dequantize launches as fast calls and the fix-up's parameter block bound after the first calls,
which run :func:`run_gemm` (the same launches and bytes).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import torch

from .. import reference
from .._autocast import autocast_off
from ..fold import WIDEN, Folded, can_fold, check_owners, fold_reference, unfold_reference, widen_fp6
from ..formats import FORMATS, ElementFormat, _exp2_f32
from ..packed import Fp8Rowwise, PackedWeight, partial_stats, planned_dtypes
from ..tensor import MXTensor, check_out_dtype
from .matmul_table import (  # (re-exported: the dispatch table's API has lived here)
    DecodeConfig,
    _decode_max_m,
    _envelope,
    _mma_max_m,
    decode_config,
    gemm_table,
    gemm_table_override,
)
from .matmul_details._envelope import (
    FOLD_EXP_LIMIT,
    _per_version,
    exact_scale_range,
    host_ints,
    in_range,
    out_of_envelope,
    scale_extrema,
    scale_stats,
)
from .._precision import exact_matmul
from .matmul_details._cublas import dense_gemm, fp32_gemm
from .matmul_details._mma_calls import W_KINDS, DecodeCall, MmaCall, W16Call, decode_w16, kernel_bias, plain, run_a8w8

__all__ = ["GemmPlan", "PATHS", "plan_gemm", "run_gemm", "pack_weight",
           "exact_scale_range", "FOLD_EXP_LIMIT", "check_bias", "a8w8_linear", "DecodeConfig", "gemm_table",
           "gemm_table_override", "decode_config", "decode_w16", "W_KINDS"]

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


@dataclass(frozen=True)
class GemmPlan:
    """Which path ``mxkit.matmul(a, b)`` takes, and why (:func:`mxkit.gemm_plan`).

    path: a key of :data:`PATHS`; reason: one line; exact: always True (every path multiplies the MX values
    exactly; its error is float32 accumulation, on the FP8 paths with each 128-deep step in the FP8 tensor cores'
    ~14-bit accumulator, plus one output rounding); M, N, K: the GEMM's extents (M = rows of ``a`` flattened);
    out_dtype: the output dtype.
    """

    path: str
    reason: str
    M: int
    N: int
    K: int
    out_dtype: torch.dtype
    exact: bool = True


@functools.lru_cache(maxsize=None)
def _fp8_capable(index: int) -> bool:
    """Whether CUDA device ``index`` has FP8 tensor cores and types (sm_89+): ``torch._scaled_mm`` (fold-fp8,
    w4a8-fp8) and Triton's ``float8e4nv`` (decode-w16 of E4M3 weights) need them; an A100 takes the other paths."""
    return torch.cuda.get_device_capability(index) >= (8, 9)


def _fp8_ok(dev: torch.device) -> bool:
    """:func:`_fp8_capable` of ``dev``; True off CUDA (the CPU runs the FP8 paths' emulation) and where CUDA is not
    there to ask (a plan judged for a device of another process, tests)."""
    if dev.type != "cuda" or not torch.cuda.is_available():
        return True
    return _fp8_capable(dev.index if dev.index is not None else torch.cuda.current_device())


def _decode_takes(wf: ElementFormat, N: int, K: int, device: torch.device) -> bool:
    """Whether decode-w16 takes a weight of format ``wf`` and shape (N, K): every kind of :data:`W_KINDS`, MXFP6
    only up to ``decode_w4a16.fp6_max_nk`` elements (its unpacking is ALU-bound past that: dense-exact is faster)."""
    if wf.name not in W_KINDS:
        return False
    if wf.name == "mxfp8_e4m3" and not _fp8_ok(device):  # (Triton's float8e4nv: sm_89+)
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

        if not (q.qdata.is_contiguous() and q.scale.is_contiguous()):  # (a K-slice of a weight: the kernel reads rows)
            q = dataclasses.replace(q, qdata=q.qdata.contiguous(), scale=q.scale.contiguous())
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
    if q.device.type == "cuda" and q.block_size == 32:  # (the Triton kernel's only block size)
        from .quantize import dequantize_triton

        return dequantize_triton(q, dtype)
    return reference.dequantize_reference(q, dtype)


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
        check_owners(f)  # (an owner of -1 added its slice into the last row)
        cand = torch.cat([cand, f.owner.to(cand.device)])
    return torch.unique(cand)


PACK_ACTS = (None, "float", "fp8_rowwise", "mx")  # pack_weight's act: the activations a weight meets


def pack_weight(w: MXTensor, *, act: Optional[str] = None, dense: Optional[torch.dtype] = None) -> PackedWeight:
    """One-time re-layout of an MX weight (N, K) along K into what the GEMM paths read (see PackedWeight).

    FP4 / FP6 weights are folded to FP8 E4M3 with row scales (a memory-bound kernel on CUDA, the reference
    on CPU); MXFP4 / MXFP8 (E4M3, E5M2) weights of the small-M kernels' shapes get their layouts (``mma_q``); every
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
    twin's, so scale bytes past the twin's envelope, above 240 for E2M3 / 227 for E3M2, take dense-exact). A fold
    path given a packed weight without its fold packs the weight again on the call (correct, slower). A weight of
    blocks other than 32 elements gets none of these layouts (the scale extrema and the dense cache only): its GEMMs
    take the exact paths. Raises TypeError /
    ValueError on a weight that is not an MXTensor (N, K) along K, or an unknown ``act``; NotImplementedError on the
    meta device (packing reads the scale statistics; ``matmul`` of a meta MXTensor gives the output's shape).
    """
    if act not in PACK_ACTS:
        raise ValueError(f"act={act!r}: one of {PACK_ACTS}")
    if dense not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"dense={dense!r}: None, torch.bfloat16 or torch.float16")
    if isinstance(w, PackedWeight):
        caches = (w.dense, None if w.wide is None else w.wide.dense)  # (an MXFP6 weight's bf16 cache is its twin's)
        if dense is not None and not any(c is not None and c.dtype == dense for c in caches):
            raise ValueError(f"pack_weight(dense={dense}) of a weight packed without a {dense} cache: pack its "
                             ".source again")
        return w
    _check_weight(w, "w")
    if w.device.type == "meta":
        raise NotImplementedError("pack_weight reads the weight's scale statistics: not on the meta device")
    w = plain(w)
    blocks32 = w.block_size == 32  # (the fold, the small-M layouts and the MXFP6 twin are of 32-element blocks)
    fold = (_fold(w, defer=True, stats=True) if blocks32 and can_fold(w.fmt) and act != "float" and w.shape[1]
            else None)  # (K = 0: the empty sum, no fold)
    pending = None if fold is None or isinstance(fold, Folded) else fold
    folded = pending.folded if pending is not None else fold
    builds_mma = blocks32 and (act is None or act in {"mxfp4_e2m1": ("float",), "mxfp8_e4m3": ("float", "mx"),
                                                      "mxfp8_e5m2": ("float",)}.get(w.fmt.name, ()))
    mma_q, mma_s, part = _pack_mma(w) if builds_mma else (None, None, None)
    special = torch.zeros(0, dtype=torch.int64, device=w.device)
    twin = None
    if blocks32 and w.fmt.name in WIDEN and act in (None, "float"):  # (scale bytes with no twin: at plan time)
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


def _alike_tensors(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.stride() == b.stride()


_FLOAT_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))


@functools.lru_cache(maxsize=None)
def _stats_bounds(fmt: ElementFormat, dtypes: frozenset = _FLOAT_DTYPES) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(lows, highs), sorted: every scale byte ``t`` that a path or kernel-variant decision on a weight of format
    ``fmt`` compares its smallest finite scale byte with (``lo >= t``) or its largest (``hi <= t``): the format's
    exact envelopes in ``dtypes`` (the activations' of the plans in question; bf16's always:
    :func:`plan_gemm`'s paths, the gated MLP's one-launch kernel), an MXFP6 weight's twin envelope and headroom
    (:func:`_twin`, shifted back), an MXFP8 weight's a8w8-mma bytes, the wgmma layouts' one-multiply bounds (MXFP8's,
    MXFP4's 128), and 1 (a 0 byte: decode-mma's special variant). A decision on another bound must add it here
    (``tests/test_caches.py`` checks the ones above)."""
    from .matmul_details._layout_wgmma import FP8
    from .matmul_details._mma_a8w8 import WEIGHT_SCALE_BYTES

    lows, highs = {1}, set()
    for dt in dtypes | {torch.bfloat16}:
        r = exact_scale_range(fmt, dt)
        lows.add(r[0])
        highs.add(r[1])
    if fmt.name in WIDEN:
        wide, shift = WIDEN[fmt.name]
        r = exact_scale_range(FORMATS[wide], torch.bfloat16)
        lows.add(r[0] - shift)
        highs |= {r[1] - shift, 254 - shift}
    if fmt.name in ("mxfp8_e4m3", "mxfp8_e5m2"):
        lows.add(WEIGHT_SCALE_BYTES[0])
        highs |= {WEIGHT_SCALE_BYTES[1], FP8[fmt.name[-4:]][3]}
    if fmt.name == "mxfp4_e2m1":
        highs.add(128)
    return tuple(sorted(lows)), tuple(sorted(highs))


def stats_class(fmt: ElementFormat, stats: tuple, dtypes: frozenset = _FLOAT_DTYPES) -> tuple:
    """The decision class of a weight's host scale statistics ``(scale_min, scale_max, has_nan)``
    (:class:`PackedWeight`'s) for its format ``fmt`` and plans of activations in ``dtypes`` (default: every float
    dtype): two weights of one class take the same paths, kernel variants and launch bounds for such plans
    (every comparison of :func:`_stats_bounds` comes out alike), whatever their exact extremes. What lets
    :func:`refill_packed` write a re-quantized weight in place after a weight sync moved its smallest or largest
    scale byte within the envelopes."""
    lo, hi, nan = stats
    lows, highs = _stats_bounds(fmt, frozenset(dtypes))
    return bool(nan), hi < lo, bisect.bisect_right(lows, lo), bisect.bisect_left(highs, hi)


def _called_dtypes(p: PackedWeight) -> frozenset:
    """The activation dtypes of the plans recorded on ``p`` (:func:`mxkit.packed.note_planned`: its prepared calls,
    calls planned per call, layers' forwards), bf16 always, float ones only: the envelopes whose decisions those
    plans hold (a plan of another dtype made later reads the statistics then)."""
    return frozenset({torch.bfloat16, *planned_dtypes(p)} & _FLOAT_DTYPES)


def _alike(old: PackedWeight, new: PackedWeight, own_source: bool) -> bool:
    """Whether ``new`` can be written into ``old``'s tensors with every decision made on ``old`` still right: the
    same source tensors (``own_source``; an MXFP6 twin's are layouts of their own, compared by shape), format and
    metadata, host scale statistics of one :func:`stats_class` and the same special rows (which choose the paths,
    kernel variants and fix-ups its prepared calls bound), layouts of the same shapes."""
    so, sn = old.source, new.source
    if own_source:
        if so.qdata is not sn.qdata or so.scale is not sn.scale:
            return False
    elif not (_alike_tensors(so.qdata, sn.qdata) and _alike_tensors(so.scale, sn.scale)):
        return False
    if (so.fmt, so.shape, so.block_size, so.axis, so.scale_mode, so.rounding) != \
            (sn.fmt, sn.shape, sn.block_size, sn.axis, sn.scale_mode, sn.rounding):
        return False
    dtypes = _called_dtypes(old)
    if stats_class(so.fmt, old._host_stats(), dtypes) != stats_class(so.fmt, new._host_stats(), dtypes) \
            or not _alike_tensors(old.special_rows, new.special_rows) \
            or not torch.equal(old.special_rows, new.special_rows):
        return False
    fo, fn = old.folded, new.folded
    if (fo is None) != (fn is None) or fo is not None and not (
            _alike_tensors(fo.data, fn.data) and _alike_tensors(fo.scale, fn.scale) and fo.fmt == fn.fmt
            and fo.lead_shape == fn.lead_shape and _alike_tensors(fo.owner, fn.owner)
            and torch.equal(fo.owner, fn.owner)):
        return False
    if not (_alike_tensors(old.mma_q, new.mma_q) and _alike_tensors(old.mma_s, new.mma_s)
            and _alike_tensors(old.dense, new.dense)):
        return False
    if (old.wide is None) != (new.wide is None) or old.wide is not None and not _alike(old.wide, new.wide, False):
        return False
    wg = old.__dict__.get("_wgmma")  # (the wgmma kernel's re-laid copy, made on first use)
    if wg is not None:
        from .matmul_details._w4a16_wgmma import packed_of

        got = packed_of(new)
        if not (_alike_tensors(wg[0], got[0]) and _alike_tensors(wg[1], got[1]) and wg[2:] == got[2:]):
            return False
    return True


def _copy_into(old: PackedWeight, new: PackedWeight, own_source: bool) -> None:
    pairs = [(old.mma_q, new.mma_q), (old.mma_s, new.mma_s), (old.dense, new.dense)]
    if old.folded is not None:
        pairs += [(old.folded.data, new.folded.data), (old.folded.scale, new.folded.scale)]
    if not own_source:
        pairs += [(old.source.qdata, new.source.qdata), (old.source.scale, new.source.scale)]
    wg = old.__dict__.get("_wgmma")
    if wg is not None:
        pairs += list(zip(wg[:2], new.__dict__["_wgmma"][:2]))
    for dst, src in pairs:
        if dst is not None:
            dst.copy_(src)
    object.__setattr__(old, "stats", new._host_stats())  # (of old's class: its decisions stand; the values are new)
    if old.wide is not None:
        _copy_into(old.wide, new.wide, False)


def refill_packed(old: PackedWeight, new: PackedWeight) -> bool:
    """Write ``new``, a packing of the same source tensors, into ``old``'s tensors in place, and return True, where
    the two are alike (the same source tensors and metadata, scale statistics of one :func:`stats_class`, the same
    special rows and layout shapes: then every path, kernel variant and launch bound on ``old`` is right for
    ``new``); else leave both alone and return False. What :meth:`mxkit.nn.MXLinear.repack` does after
    ``load_state_dict``: a CUDA graph captured before then (or ``torch.compile(mode="reduce-overhead")``) replays
    the new weight, as an ``nn.Linear``'s does (its tensors keep their addresses). Where they differ the caller
    keeps ``new``: a graph captured before must be captured again."""
    if old is new or not _alike(old, new, True):
        return old is new
    _copy_into(old, new, True)
    return True


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


def a8w8_envelope_field(b, M: int, dev: torch.device) -> str:
    """Which ``a8w8_mma`` field bounds weight ``b`` (MXTensor or PackedWeight) at M rows: ``"max_m"`` (measured
    against w8a16-wgmma, the path past it on Hopper's large layers) where the wgmma kernel takes the call and the
    weight is at least ``wgmma_min_nk`` (N * K; default 0), else ``"max_m_no_wgmma"`` (against bf16-exact: not
    Hopper, a layer outside the wgmma envelope, an unpacked weight, a smaller weight). ``mxkit tune gemm`` sorts
    its timings by the same rule."""
    w = b.source if isinstance(b, PackedWeight) else b
    min_nk = int((_envelope(dev, "a8w8_mma") or {}).get("wgmma_min_nk", 0))
    return "max_m" if w.shape.numel() >= min_nk and _wgmma_ok(b, w, M, dev) else "max_m_no_wgmma"


def _a8w8_max_m(b, M: int, dev: torch.device) -> int:
    """The a8w8-mma envelope for weight ``b`` (MXTensor or PackedWeight) at M rows: the table's field
    :func:`a8w8_envelope_field` names."""
    return _mma_max_m(dev, "a8w8_mma", a8w8_envelope_field(b, M, dev))


def _a8w8_quant_max_m(dev: torch.device) -> int:
    """The M up to which :func:`a8w8_linear` quantizes bf16 activations inside the a8w8-mma launch (the table's
    ``a8w8_mma.quant_max_m``, default 1); past it, one quantize call first."""
    entry = _envelope(dev, "a8w8_mma") or {}
    return int(entry.get("quant_max_m", 1))


def _a8w8_ok(a_fmt: ElementFormat, b, M: int, dev: torch.device) -> bool:
    """MXFP8 E4M3 activations (``a_fmt``) x weight ``b`` (MXTensor or PackedWeight) of M rows on a8w8-mma."""
    w = b.source if isinstance(b, PackedWeight) else b
    # (blocks of 32 along the weight's last axis, plain scales: the kernel reads K / 32 scale bytes a row; plan_gemm
    # refuses the others before asking, a8w8_linear does not go through it)
    if not (a_fmt.name == "mxfp8_e4m3" and w.fmt.name == "mxfp8_e4m3" and dev.type == "cuda"
            and w.block_size == 32 and w.axis == w.ndim - 1 and w.scale_layout == "plain"
            and 0 < M <= _a8w8_max_m(b, M, dev)):
        return False
    from .matmul_details import _mma_a8w8

    if not (_mma_a8w8.shape_ok(*w.shape) and _mma_a8w8.available(dev) is None):
        return False
    # (a PackedWeight's statistics; an MXTensor's read once per scale tensor and version)
    lo, hi = (b.scale_min, b.scale_max) if isinstance(b, PackedWeight) else \
        _per_version("extrema", w.scale, lambda: scale_extrema(w.scale))[:2]
    return in_range(lo, hi, _mma_a8w8.WEIGHT_SCALE_BYTES)


_WGMMA_ENVELOPES = (("max_m", "min_nk"), ("small_max_m", "small_min_nk"), ("mid_max_m", "mid_min_nk"))


def wgmma_envelope_holds(entry: Mapping, M: int, nk: int) -> bool:
    """Whether a ``w4a16_wgmma`` / ``w8a16_wgmma`` table entry takes M rows of a weight of N * K = ``nk``: one of its
    envelopes (``max_m`` / ``min_nk``, ``small_*``, ``mid_*``) holds M <= its max_m and nk >= its min_nk. An
    envelope is open only where both of its fields are given (half a pair, e.g. a table's ``mid_max_m`` without
    ``mid_min_nk``, is off, as ``w8a16_mma``'s ``large_*`` pair is)."""
    return any(M <= int(entry[m]) and nk >= int(entry[n]) for m, n in _WGMMA_ENVELOPES if m in entry and n in entry)


def _wgmma_ok(b, w: MXTensor, M: int, dev: torch.device) -> bool:
    """bf16 activations x an MXFP4 weight, or a packed MXFP8 (E4M3 / E5M2) one without NaN / Inf, on the Hopper
    wgmma kernel (the caller checks the bf16-exact scale envelope and the activations): the table's
    ``w4a16_wgmma`` / ``w8a16_wgmma`` envelope, M <= max_m and N * K >= min_nk, or (the kernel's split-K schedule
    at small M) M <= small_max_m and N * K >= small_min_nk, or M <= mid_max_m and N * K >= mid_min_nk (a GPU's own
    third envelope; each where it beats dequantize + cuBLAS, and open only where both of its fields are given)."""
    fp8 = w.fmt.name in ("mxfp8_e4m3", "mxfp8_e5m2")
    if not ((w.fmt.name == "mxfp4_e2m1" or fp8) and dev.type == "cuda" and M > 0):
        return False
    if fp8 and not (isinstance(b, PackedWeight) and not b.has_nan):  # (NaN / Inf codes: another path decodes them)
        return False
    from .matmul_details import _w4a16_wgmma

    entry = _envelope(dev, "w8a16_wgmma" if fp8 else "w4a16_wgmma") or {}
    nk = w.shape.numel()
    return (wgmma_envelope_holds(entry, M, nk)
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
    return b.wide if twin_ok(b.fmt.name, b.scale_min, b.scale_max) else b


def twin_ok(fmt: str, lo: int, hi: int) -> bool:
    """Whether an MXFP6 weight (format name ``fmt``) with finite scale bytes in [lo, hi] reads as its MXFP8 twin
    for bf16 activations (:func:`_twin`): each byte has its twin (<= 254 - shift) in the twin's bf16 envelope."""
    wide, shift = WIDEN[fmt]
    return hi <= 254 - shift and in_range(lo + shift, hi + shift, exact_scale_range(FORMATS[wide], torch.bfloat16))


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
    if kind == "pending" and not can_fold(wf):
        raise ValueError(f"a pending fold needs a weight that folds, got {wf.name}")
    if dev.type == "meta":  # (no values: the reference's shapes and dtype, without reading a scale statistic)
        return plan("reference", "meta tensors: the output's shape and dtype only")
    if out == torch.float64 and dev.type == "cuda":  # (the tensor-core kernels write 16- and 32-bit outputs)
        return plan("fp32-exact", "a float64 output: the exact values in float32, cuBLAS float32 with TF32 off, "
                                  "widened")
    if w.block_size != 32 or (kind == "mx" and a.block_size != 32):  # (the kernels' layouts: blocks of 32)
        sizes = f"{w.block_size}" if kind != "mx" else f"{a.block_size} x {w.block_size}"
        if kind == "float" and a.dtype in (torch.bfloat16, torch.float16):  # (the dense routes read any block)
            lo, hi = ((b.scale_min, b.scale_max) if isinstance(b, PackedWeight) else scale_extrema(w.scale)[:2])
            rng = exact_scale_range(wf, a.dtype)
            if in_range(lo, hi, rng):
                if isinstance(b, PackedWeight) and b.dense is not None and b.dense.dtype == a.dtype:
                    return plan("dense-cached", f"blocks of {sizes}: {a.dtype} x the weight's dequantized cache")
                return plan("dense-exact", f"blocks of {sizes}: {a.dtype} x the weight dequantized (exact in "
                                           f"{a.dtype}: scale bytes [{lo}, {hi}])")
        return plan("fp32-exact", f"blocks of {sizes}: the tensor-core paths take blocks of 32; the exact values in "
                                  f"float32, float32 GEMM")
    why_sm = "this GPU has no FP8 tensor cores (sm_89+): the exact values off them"
    if kind == "pending":
        fp8 = _fp8_ok(dev)
        if f32 or not fp8:
            return plan("bf16-exact" if a.source is not None else "fp32-exact", why32 if f32 else why_sm)
        return plan("fold-fp8", f"{a.folded.fmt.name} x {wf.name} both fold to E4M3 (fold ranges of mxkit.fold)")
    if kind in ("mx", "folded") and can_fold(wf) and (kind == "folded" or can_fold(a.fmt)):
        fp8 = _fp8_ok(dev)
        if f32 or not fp8:
            return plan("bf16-exact" if kind == "mx" else "fp32-exact", why32 if f32 else why_sm)
        return plan("fold-fp8", f"{a.fmt.name} x {wf.name} both fold to E4M3 (fold ranges of mxkit.fold)")
    if kind == "fp8_rowwise" and can_fold(wf):
        fp8 = _fp8_ok(dev)
        if f32 or not fp8:
            return plan("fp32-exact", why32 if f32 else why_sm)
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
        if _batched(a.scale):  # (inside torch.func.vmap: no host read of a's scale statistics)
            return plan("fp32-exact", f"{a.fmt.name} x {wf.name} under torch.func.vmap: exact in float32")
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


def _batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is a functorch BatchedTensor (inside ``torch.func.vmap``: no data to read on the host)."""
    check = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None)
    return check is not None and check(t)


def _values_fp32(a, kind: str) -> torch.Tensor:
    """a's exact values as float32 (R, K) (Fp8Rowwise: the E4M3 values only; its row scale is applied after)."""
    if kind == "mx":
        return _dequantize(plain(a), torch.float32).reshape(-1, a.shape[-1])
    if kind == "folded":
        return _unfold_fp32(a)
    if kind == "fp8_rowwise":
        return a.data.reshape(-1, a.data.shape[-1]).to(torch.float32)
    return a.reshape(-1, a.shape[-1]).to(torch.float32)


def _unfold_fp32(f: Folded, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Exact float32 values of a Folded's source rows (all, or ``rows``): each row plus its extra slices (disjoint
    blocks, so the sums are exact); NaN rows NaN."""
    R = f.rows()
    if rows is None:  # (all rows: the fp32-exact path's operand, whose owners nothing else has read)
        check_owners(f)
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


def _split_row_scale(xa: torch.Tensor, kind: str, a, R: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """For the float32 routes: ``(xa', m)`` with ``xa' @ w.T * m`` the product of a's values. Fp8Rowwise: its row
    scale s = m 2^e, m in [1, 2), the power of two applied to the E4M3 values before the GEMM (exact: 4 significant
    bits) and m after, so the float32 sums neither overflow nor underflow where the product itself does not (the
    scale applied after the GEMM gave ±Inf / NaN / 0 for weights near float32's range); m None for other kinds."""
    if kind != "fp8_rowwise":
        return xa, None
    frac, e = torch.frexp(a.scale.reshape(R, 1))  # rs = frac 2^e, frac in [0.5, 1) (0, NaN, Inf: frac itself, e 0)
    return xa * _exp2_f32((e - 1).clamp(-149, 127)), frac * 2


def _fp8_gemm(A: torch.Tensor, sa: torch.Tensor, fb: Folded, N: int, out_dtype: torch.dtype,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """cuBLAS FP8 GEMM with rowwise float32 scales: (A * sa) @ (B * sb).T [+ bias], one output rounding. Off CUDA
    (the CPU interpreter's runs) the same in float32 (exact products; torch's CPU ``_scaled_mm`` takes per-tensor
    scales only before torch 2.13)."""
    B = fb.data[:N]
    sb = fb.scale[:N].reshape(1, N)
    if A.device.type != "cuda":
        # (the weight's power-of-two row scale first, exact inside FOLD_EXP_LIMIT; then the activation's, one
        # rounding whatever its range)
        y = exact_matmul(A.to(torch.float32), B.to(torch.float32).t()) * sb * sa.reshape(-1, 1)
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


@autocast_off
def run_gemm(a, b: Union[MXTensor, PackedWeight], plan: GemmPlan, bias: Optional[torch.Tensor] = None
             ) -> torch.Tensor:
    """Execute ``plan`` (from :func:`plan_gemm` on the same operands). Returns (..., N) in plan.out_dtype."""
    kind = _a_kind(a)
    lead = _lead_shape(a, kind)
    M, N, K, out = plan.M, plan.N, plan.K, plan.out_dtype
    path = plan.path
    if K == 0:
        return _empty_sum(a, kind, N, out, bias)
    if path == "reference":
        return reference_gemm(a, b, out, bias)
    b = _twin(a, b, kind)
    packed = b if isinstance(b, PackedWeight) else None
    w = packed.source if packed is not None else plain(b)
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
            if pw.special_rows.numel() and y.is_cuda:  # the weight's special rows' columns (and any row whose
                from .matmul_details._row_fixup import fixup  # scale lies outside 2^+-54), one launch, no sync

                fixup(y, a, pw.source, bias, M, N, K, fold=(None, a.scale), special=pw.special_rows)
            elif pw.special_rows.numel():
                y = _fix_special(y, a, kind, M, pw, pw.special_rows[:0], pw.special_rows, bias)
            return y.reshape(*lead, N)
        # an MX a: a PendingFold on CUDA (it keeps its source), a complete Folded on the CPU
        fa = _fold(plain(a), defer=True) if kind == "mx" else a
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
        a = plain(a)
        y = dense_gemm(_dequantize(a, torch.bfloat16).reshape(M, K), _dequantize(w, torch.bfloat16), acc)
    elif path == "dense-exact":
        wb = _dequantize(w, a.dtype)
        y = dense_gemm(a.reshape(M, K), wb, acc)
    elif path == "dense-cached":
        y = dense_gemm(a.reshape(M, K), packed.dense, acc)
    elif path == "decode-mma":
        return MmaCall(packed, M, tuple(a.shape), a.stride(), out)(a, bias)
    elif path == "w8a16-mma":
        return W16Call(packed, M, tuple(a.shape), a.stride(), out)(a, bias)
    elif path == "w4a16-wgmma":
        from .matmul_details import _w4a16_wgmma as wg

        x = a.reshape(M, K)
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # TMA: 16-byte aligned rows
            x = x.clone(memory_format=torch.contiguous_format)
        q, st, one_mul = wg.packed_of(packed) if packed is not None else wg.pack_wgmma(w.qdata, w.scale)
        bm, split = wg.dense_schedule(M, N, K, x.device)
        return wg.w4a16_wgmma(x, q, st, N, one_mul, out, kernel_bias(bias), bm=bm, split=split).reshape(*lead, N)
    elif path == "w8a16-wgmma":
        from .matmul_details import _w4a16_wgmma as wg

        if kind == "mx":
            a = plain(a)
        x = a.reshape(M, K) if kind == "float" else _dequantize(a, torch.bfloat16).reshape(M, K)
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # TMA: 16-byte aligned rows
            x = x.clone(memory_format=torch.contiguous_format)
        q, st, one_mul = wg.packed_of(packed)
        bm, split = wg.dense_schedule(M, N, K, x.device)
        y = wg.w4a16_wgmma(x, q, st, N, one_mul, out, kernel_bias(bias), bm=bm, split=split,
                           elem=wg.FP8_ELEMS[w.fmt.name])
        if kind == "mx":  # rows of a whose values bf16 does not hold exactly: recomputed
            from .matmul_details._row_fixup import fixup

            fixup(y, a, w, bias, M, N, K)
        return y.reshape(*lead, N)
    elif path == "a8w8-mma":
        return run_a8w8(plain(a), None, w, M, lead, out, bias, packed)
    elif path == "decode-w16":
        x = a if a.is_contiguous() else a.contiguous()
        bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
        return DecodeCall(w, M, lead, out, bias is not None, a.device)(x, bias)
    elif path == "fp32-exact":
        xa, m = _split_row_scale(_values_fp32(a, kind), kind, a, M)
        y = fp32_gemm(xa, _dequantize(w, torch.float32))
        if m is not None:
            y = y * m
    else:
        raise ValueError(f"unknown GEMM path {path!r}; known: {', '.join(PATHS)}")
    if bias is not None:
        y = y.to(torch.float32) + bias.to(torch.float32)
    y = y.to(out)
    if path == "bf16-exact" and y.is_cuda:  # rows of a whose values bf16 does not hold exactly: recomputed
        from .matmul_details._row_fixup import fixup

        fixup(y, a, w, bias, M, N, K)
    return y.reshape(*lead, N)


def a8w8_linear(x: torch.Tensor, w: Union[MXTensor, PackedWeight], bias: Optional[torch.Tensor] = None,
                out_dtype: Optional[torch.dtype] = None) -> Optional[torch.Tensor]:
    """``quantize(x, "mxfp8") @ w.T + bias``: bf16 activations x (..., K) quantized to MXFP8 E4M3 inside the
    a8w8-mma kernel up to ``a8w8_mma.quant_max_m`` rows (default 1: one launch; past that x is quantized once
    first, two launches) (OCP FLOOR scale, round to nearest even: the bytes of :func:`mxkit.quantize`; with the
    same split of K the kernel gives the bits it gives on ``quantize(x, "mxfp8")``, and this call may split K
    more on small grids, so it agrees with ``matmul(quantize(x, "mxfp8"), w)`` within the GEMM bound), weight
    an MXFP8 E4M3 MXTensor (N, K) or its PackedWeight. Returns (..., N) in ``out_dtype`` (default bf16), or None
    where the kernel does not take the call (not CUDA, not bf16, another format, M past the
    envelope, N % 16 or K % 64, a GPU older than sm_89, a float64 output, while torch.compile traces): the
    caller then quantizes and calls matmul."""
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
    if out == torch.float64:  # (the kernel writes 16- and 32-bit outputs: matmul's fp32-exact takes it)
        return None
    if bias is not None:
        check_bias(bias, GemmPlan("a8w8-mma", "", M, w.shape[0], w.shape[1], out), w.device)
    if M > _a8w8_quant_max_m(x.device):  # (past it: quantize once, then the GEMM: two launches)
        from .quantize import quantize_triton

        return run_a8w8(plain(quantize_triton(x, "mxfp8_e4m3")), None, plain(w), M, tuple(x.shape[:-1]), out, bias,
                     packed)
    return run_a8w8(None, x, plain(w), M, tuple(x.shape[:-1]), out, bias, packed)


def check_bias(bias: Optional[torch.Tensor], plan: GemmPlan, device: torch.device) -> None:
    """A GEMM bias is None or a 1-D (N,) floating-point tensor on the weight's device (it is added in float32);
    TypeError for a non-tensor or another dtype, ValueError otherwise."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a 1-D tensor (N,) or None, got {type(bias).__name__}")
    if bias.dim() != 1:
        raise ValueError(f"bias must be a 1-D tensor (N,), got shape {tuple(bias.shape)}")
    if not bias.dtype.is_floating_point:
        raise TypeError(f"bias must be a floating-point tensor (added in float32), got {bias.dtype}")
    if bias.shape[0] != plan.N or bias.device != device:
        raise ValueError(f"bias has shape {tuple(bias.shape)} on {bias.device}; expected ({plan.N},) on {device}")


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
    xa, m = _split_row_scale(_values_fp32(a, kind), kind, a, M)
    if a_rows.numel():
        part = fp32_gemm(xa[a_rows], _dequantize(pw.source, torch.float32))
        if m is not None:
            part = part * m[a_rows]
        if bias is not None:
            part = part + bias.to(torch.float32)
        y[a_rows] = part.to(y.dtype)
    if b_rows.numel():
        part = fp32_gemm(xa, _unfold_fp32(pw.folded, b_rows))
        if m is not None:
            part = part * m
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


def _empty_sum(a, kind: str, N: int, out: torch.dtype, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The product of a K = 0 call: an empty sum, zeros, plus the bias, rounded once (every path's result)."""
    y = torch.zeros(*_lead_shape(a, kind), N, dtype=torch.float32, device=_a_device(a, kind))
    return (y if bias is None else y + bias.to(torch.float32)).to(out)


@autocast_off
def reference_gemm(a, b, out: torch.dtype, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference twin: float32 matmul of the exact operand values (any a kind), then bias, then ``out``."""
    kind = _a_kind(a)
    w = b.source if isinstance(b, PackedWeight) else b
    if w.shape[1] == 0:
        return _empty_sum(a, kind, w.shape[0], out, bias)
    if kind == "pending":
        a, kind = a.complete(), "folded"
    if kind == "mx":
        y = reference.matmul_reference(a, w, out_dtype=torch.float32)
    else:
        xa = (unfold_reference(a) if kind == "folded" else _values_fp32(a, kind)).to(torch.float32)
        xa, m = _split_row_scale(xa, kind, a, xa.shape[0])
        y = exact_matmul(xa.contiguous(), reference.dequantize_reference(w, torch.float32).contiguous().t())
        if m is not None:
            y = y * m
        y = y.reshape(*_lead_shape(a, kind), w.shape[0])
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out)
