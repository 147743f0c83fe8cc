"""``mxkit tune gemm``: regenerate the GEMM dispatch table (:mod:`mxkit.kernels.matmul`'s
``matmul_tuning.json``) for the GPU it runs on.

For each K class (K <= 4096, larger K) it times every decode-kernel schedule of a small grid on the given
(N, K) shapes at M = 1 and keeps the fastest (sum of clean-L2 medians over the shapes); then it times the
decode kernel for M = 1, 2, 4, ..., 64 against the path the plan takes without it and without decode-mma (the
wgmma kernel where its envelope takes the call, else dequantize + cuBLAS) and sets ``max_m`` to
the largest M up to which the decode kernel is faster on every shape; ``decode_mma.max_m`` likewise for the
tensor-core decode kernel on packed MXFP4 weights, against the path the plan takes without it (decode-w16 within
its envelope, the wgmma kernel within its own, else dequantize + cuBLAS) (with ``decode_mma.m8_loop``, the batch
loop of its kernel up to 8 rows that is faster at M = 1, ``decode_mma.ring_min_k``, the K from which its ring loop is
faster, and ``decode_mma.ring2_min_n``, the N from which its ring of 2 is faster still, judged at M = 1 on the
shapes given (the N it sets is one of theirs: the H100's packaged 14336 needs a shape 14336 wide, as
:data:`DEFAULT_SHAPES` has); at 9-16 rows
the m16 kernels take their ring loops from the same K), ``w8a16_mma.max_m`` for the W8A16 kernel on packed MXFP8
weights against the path the plan takes without it, and ``a8w8_mma.max_m`` for the MXFP8 × MXFP8 kernel on
packed MXFP8 weights against the path the plan takes without it (w8a16-wgmma on Hopper, else both operands
dequantized, cuBLAS); 0 where a kernel cannot run, and the key left out (the table in force keeps its value) where
it could but no shape given fits it. For the Hopper wgmma kernel on MXFP4 weights
(``w4a16_wgmma``) and on MXFP8 ones (``w8a16_wgmma``) it times the kernel against dequantize + cuBLAS at M = 64,
128, 256, ..., 4096 and keeps the envelope (``max_m``, ``min_nk``) that is won on every shape of
N * K >= min_nk at every M timed up to max_m (64 too: the envelope takes every M <= max_m), covering the most
(shape, M) points. Each stage runs under the table in force with the keys this run measured before it merged in
(a later stage's rival is the path the written table takes). For MoE (``moe.mma_max_pairs``) it times
the decode and the prefill path of packed MXFP4 GPT-OSS experts (E = 32 and 128) at 8 to 1024 (token, slot) pairs
and keeps the largest count up to which decode wins on both, and that count per expert; and ``moe.mma_strips``,
the strips a block of the decode kernels (1, 2 or 4) with the least total time at 16 to 256 pairs. The result is written as a table of the
packaged file's shape with one entry, keyed by the GPU's name (``torch.cuda.get_device_name()``), of the keys
measured (``--stages`` picks some); use it merged into the packaged table
(``gemm_table_override(merge_tables(gemm_table(), table))``, as ``mxkit bench ... --table FILE`` does), or
copy its keys into the packaged file.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import json
import math
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ._files import check_writable, write_text_atomic

__all__ = ["tune_gemm", "TuneError", "check_shapes", "check_stages", "check_rep_ms", "DEFAULT_SHAPES", "STAGES",
           "moe_envelope", "moe_strips"]

# (N, K) of real layers: Llama-3-70B's q / o projection and its MLP's gate (or up), GPT-OSS's fused q | k | v,
# Llama-3-8B's MLP gate (or up) and GPT-OSS's o projection (14336: the N from which the H100's ring of 2 wins, which
# a tune without a shape of N in [8192, 28672) would read as 28672)
DEFAULT_SHAPES = ((8192, 8192), (28672, 8192), (5120, 2880), (14336, 4096), (2880, 4096))
MAX_WEIGHT = 1 << 31  # the largest N * K a tune shape may have
# the table keys a tune measures, in its order (each one stage; `mxkit tune gemm --stages` picks some)
STAGES = ("decode_w4a16", "decode_mma", "a8w8_mma", "w8a16_mma", "w4a16_wgmma", "w8a16_wgmma", "moe")
_GRID = dict(block_n=(32, 64), block_k=(128, 256), split_k=(1, 2, 4, 8), num_stages=(2, 3, 4))


class TuneError(RuntimeError):
    """A tune that cannot measure what it was asked to on this GPU (no decode schedule runs for a K class; a closed
    envelope the plan still takes): ``mxkit tune gemm`` prints it as one error line."""


def _time(fn, rep_ms: float) -> float:
    from .bench.timing import cuda_event_bench

    return cuda_event_bench(fn, warmup_ms=5.0, rep_ms=rep_ms, spin_us=50.0, flush="read")


def check_shapes(shapes: Sequence[tuple[int, int]]) -> None:
    """Raises ValueError unless ``shapes`` is a non-empty list of distinct (N, K) with N >= 1, K a positive
    multiple of 32 (the MX block) and N * K at most :data:`MAX_WEIGHT` (2^31 elements, past any real layer: the
    tuner makes every shape's weights up front, and a huge one would run the GPU out of memory), naming the first
    bad or repeated shape (a repeat would weigh one shape twice in the sums a schedule is chosen by)."""
    from .formats import BLOCK_SIZE

    if not shapes:
        raise ValueError("no shapes to tune on")
    for i, s in enumerate(shapes):
        if len(s) != 2 or s[0] < 1 or s[1] < 1 or s[1] % BLOCK_SIZE:
            raise ValueError(f"shape {'x'.join(map(str, s))}: an NxK weight needs N >= 1 and K a positive multiple "
                             f"of {BLOCK_SIZE}")
        if s[0] * s[1] > MAX_WEIGHT:
            raise ValueError(f"shape {'x'.join(map(str, s))}: N * K = {s[0] * s[1]} is more than the tuner's "
                             f"{MAX_WEIGHT} elements")
        if tuple(s) in map(tuple, shapes[:i]):
            raise ValueError(f"shape {'x'.join(map(str, s))} named twice")


def check_stages(stages: Optional[Sequence[str]]) -> tuple[str, ...]:
    """The stages of :data:`STAGES` named by ``stages`` (None: all), in the table's order; raises ValueError naming
    an unknown or repeated stage, or for an empty list."""
    if stages is None:
        return STAGES
    stages = [stages] if isinstance(stages, str) else list(stages)  # (one name: not its letters)
    if not stages:
        raise ValueError(f"no stage to tune (choose from {', '.join(STAGES)})")
    stages = [st.lower() if isinstance(st, str) and st.lower() in STAGES else st for st in stages]  # (any case)
    for i, st in enumerate(stages):
        if st not in STAGES:
            raise ValueError(f"unknown tune stage {st!r} (choose from {', '.join(STAGES)})")
        if st in stages[:i]:
            raise ValueError(f"tune stage {st!r} named twice")
    return tuple(st for st in STAGES if st in stages)


def check_rep_ms(rep_ms: float, name: str = "rep_ms") -> None:
    """ValueError naming ``name`` unless ``rep_ms`` is a number of milliseconds in (0, MAX_REP_MS] (the benches'
    cap, :data:`mxkit.bench.timing.MAX_REP_MS`: a minute of runs a measurement; 1e9 would never end)."""
    from .bench.timing import MAX_REP_MS

    if isinstance(rep_ms, bool) or not (isinstance(rep_ms, (int, float)) and 0 < rep_ms <= MAX_REP_MS):
        raise ValueError(f"{name} must be a number of milliseconds in (0, {MAX_REP_MS:g}], got {rep_ms!r}")


def tune_gemm(shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES, *, out: Optional[Path] = None,
              rep_ms: float = 20.0, log=print, stages: Optional[Sequence[str]] = None) -> dict:
    """Tune on the current CUDA device; returns the table ``{GPU name: entry}``. shapes: (N, K) weight shapes
    (:func:`check_shapes`). ``stages``: the table keys to measure (:data:`STAGES`, :func:`check_stages`; None: all);
    a key not measured is left to the table it is merged into (:func:`~mxkit.kernels.matmul_table.merge_tables`;
    ``mxkit bench ... --table`` merges into the packaged table). Each measured key holds its own ``_measured`` (date,
    torch, rep_ms, shapes); the entry's names the keys this run measured. ``rep_ms``: the timing window of each
    measurement (ms, in (0, 60000]; 20 by default; 5 took ~50 s for every key but ``decode_w4a16`` on an H200). ``out``:
    written after every stage, so a run cut short keeps its finished stages: a table file already there is updated
    (this GPU's measured keys replaced whole, its other keys and other GPUs' entries kept), else made (whole,
    through a temporary file renamed over it; its folders made at the first write). Raises ValueError for a bad
    shape, stage or ``rep_ms`` or an ``out`` file there that is not a dispatch table, RuntimeError without CUDA,
    OSError (IsADirectoryError for a directory) when ``out`` cannot be written (all before any work, leaving no
    folder behind), :class:`TuneError` when no decode schedule runs for a K class (:func:`_best_decode_config`) or a
    kernel's closed envelope still takes it (:func:`_check_closed`)."""
    check_shapes(shapes)
    stages = check_stages(stages)
    check_rep_ms(rep_ms)
    if not torch.cuda.is_available():
        raise RuntimeError("mxkit tune gemm needs a CUDA GPU")
    base: dict = {}
    if out is not None:
        base = _table_there(Path(out))
        check_writable(out, "out")
    from . import ops
    from .kernels import matmul as mm
    from .kernels.matmul_table import merge_tables

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    weights = {}
    for N, K in shapes:
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g)
        weights[(N, K)] = ops.quantize(w, "mxfp4")
    name = torch.cuda.get_device_name()
    entry: dict = {}
    t0 = time.perf_counter()
    how = f"{datetime.date.today()}, {name}, torch {torch.__version__}, rep_ms {rep_ms:g}, shapes {list(shapes)}"

    def done(stage: str) -> None:  # the table so far, written after every stage
        entry[stage] = {**entry[stage], "_measured": how}
        entry.pop("_measured", None)  # (kept the entry's last field)
        entry["_measured"] = (f"{datetime.date.today()}, {name}, torch {torch.__version__}, by mxkit tune gemm: "
                              f"{', '.join(k for k in entry if k != '_measured')} (each key's _measured: how)")
        log(f"[{time.perf_counter() - t0:.0f} s] {stage}: {json.dumps(entry[stage])}")
        if out is not None:
            kept = {k: v for k, v in base.get(name, {}).items() if k not in entry}
            write_text_atomic(out, json.dumps({**base, name: {**kept, **entry}}, indent=2) + "\n")

    def measured_so_far():  # (the table in force with this run's keys merged in: each stage's rivals as written)
        return mm.gemm_table_override(merge_tables(mm.gemm_table(), {name: entry}))

    if "decode_w4a16" in stages:
        configs = decode_configs(shapes, lambda label, ks: _best_decode_config(label, ks, weights, g, rep_ms, log,
                                                                              dev), dev, log)
        entry["decode_w4a16"] = {"max_m": 64, "configs": configs}
        with measured_so_far():
            # against the plan without decode-w16 and decode-mma (an unpacked weight's path past it; a packed one's
            # past both): the wgmma kernel within its envelope, else dequantize + cuBLAS
            entry["decode_w4a16"]["max_m"] = _envelope(
                "decode-w16", {s: (mm.pack_weight(w), lambda M, w=w: lambda x: mm.decode_w16(
                    x, w, mm.decode_config(dev, x.shape[1]))) for s, w in weights.items()},
                {"decode_w4a16": {"max_m": 0}, "decode_mma": {"max_m": 0}}, g, rep_ms, log)
        done("decode_w4a16")
    tuners = {"decode_mma": lambda: _tune_mma(weights, g, rep_ms, log),
              "a8w8_mma": lambda: _tune_a8w8(shapes, g, rep_ms, log),
              "w8a16_mma": lambda: _tune_w8a16_mma(shapes, g, rep_ms, log),
              "w4a16_wgmma": lambda: _tune_wgmma(weights, g, rep_ms, log),
              "w8a16_wgmma": lambda: _tune_wgmma(weights, g, rep_ms, log, fp8=True),
              "moe": lambda: _tune_moe(g, rep_ms, log)}
    for stage in stages:
        if stage in tuners:
            with measured_so_far():
                got = tuners[stage]()
            if got is None:  # (a closed envelope written here would turn the kernel off for every layer)
                log(f"{stage}: no shape of {list(shapes)} fits its kernel; not measured (the table it is merged "
                    f"into keeps its value)")
                continue
            entry[stage] = got
            done(stage)
    table = {name: entry}
    if out is not None:
        log(f"wrote {out}")
    return table


def decode_configs(shapes: Sequence[tuple[int, int]], best, device: torch.device, log=print) -> list[dict]:
    """``decode_w4a16.configs`` for ``shapes``: per K class (K <= 4096, then K > 4096) the schedule ``best(label,
    shapes of the class)`` returns (a :class:`~mxkit.kernels.matmul_table.DecodeConfig`), or, for a class no shape
    measured, the one in force for it on ``device`` (logged): a table tuned on one class, merged into the packaged
    one (whose ``configs`` it replaces whole), keeps the other's schedule."""
    from .kernels.matmul_table import decode_config

    configs = []
    for k_max, label, k in ((4096, "K <= 4096", 4096), (1 << 30, "K > 4096", 4097)):
        ks = [s for s in shapes if (s[1] <= 4096) == (k_max == 4096)]
        cfg = best(label, ks) if ks else decode_config(device, k)
        if not ks:
            log(f"decode_w4a16: no shape of {label}; the schedule in force kept: {cfg}")
        configs.append(dict(k_max=k_max, **dataclasses.asdict(cfg)))
    return configs


def _table_there(out: Path) -> dict:
    """The dispatch table in the file ``out`` ({} where there is none); ValueError naming it where it holds
    something else (a tune would replace it)."""
    if not out.is_file():
        return {}
    from .kernels.matmul_table import load_table

    try:
        return load_table(out, "it")
    except ValueError as e:
        raise ValueError(f"out {str(out)!r} is there and is not a dispatch table to update ({e}); remove it or "
                         f"choose another file") from None


def _best_decode_config(k_class: str, ks: Sequence[tuple[int, int]], weights: dict, g: torch.Generator,
                        rep_ms: float, log, dev: torch.device):
    """The decode-w16 schedule of :data:`_GRID` with the least M = 1 time summed over the shapes ``ks`` (those of
    the K class ``k_class``, e.g. ``"K <= 4096"``; ``weights[(N, K)]`` their MXFP4 weights); a schedule that raises
    (does not compile here: shared memory) is skipped. Raises :class:`TuneError` naming the K class when none ran."""
    from .kernels import matmul as mm

    best, skipped = None, []
    for bn, bk, sk, st in itertools.product(*_GRID.values()):
        cfg = mm.DecodeConfig(bn, bk, sk, 4, st)
        total = 0.0
        try:
            for N, K in ks:
                x = torch.randn(1, K, device=dev, dtype=torch.bfloat16, generator=g)
                total += _time(lambda: mm.decode_w16(x, weights[(N, K)], cfg), rep_ms)
        except Exception as e:  # a schedule that does not compile here (shared memory) is skipped
            skipped.append(str(e).splitlines()[0][:100] if str(e) else type(e).__name__)
            log(f"  skip {cfg}: {skipped[-1]}")
            continue
        if best is None or total < best[0]:
            best = (total, cfg)
    if best is None:
        raise TuneError(f"mxkit tune gemm: no decode-w16 schedule compiled and ran for the K class {k_class} "
                           f"(shapes {list(ks)}; all {len(skipped)} failed, the first with: "
                           f"{skipped[0] if skipped else 'nothing tried'})")
    log(f"{k_class}: best {best[1]} ({best[0]:.1f} us summed over {list(ks)})")
    return best[1]


def _with_entry(name: str, changes: dict) -> dict:
    """The table in force with GPU ``name``'s entry changed by ``changes`` (``{key: {field: value}}``), each merged
    into that entry's own ``key``: its other fields and keys stay this GPU's (an override of ``{name: {key:
    change}}`` alone would leave every other field to the packaged ``"default"`` entry). For
    :func:`~mxkit.kernels.matmul.gemm_table_override`."""
    from .kernels import matmul as mm

    table = mm.gemm_table()
    entry = dict(table.get(name, {}))
    for key, change in changes.items():
        entry[key] = {**entry.get(key, {}), **change}
    return {**table, name: entry}


def _tune_mma(weights: dict, g: torch.Generator, rep_ms: float, log) -> dict:
    """``{"max_m", "m8_loop", "ring_min_k", "ring2_min_n"}``: the m8 kernel's loops timed at M = 1 on every shape and
    chosen by :func:`m8_loops` (a batch loop, and the K from which the ring loop is taken) and :func:`ring2_min_n`
    (the N from which the ring of 2 is); then the largest M of 1, 2, 4,
    ..., 64 up to which decode-mma with them beats, on every shape, the path the plan takes without it
    (decode-w16, the wgmma kernel or dequantize + cuBLAS, by the table in force). None where no shape packs to its
    layout (not measured)."""
    from .kernels import matmul as mm
    from .kernels.matmul_details import _mma_decode

    why = _mma_decode.available(torch.device("cuda"))
    packed = {s: pw for s, pw in ({} if why else {s: mm.pack_weight(w) for s, w in weights.items()}).items()
              if pw.mma_q is not None}
    us = {}  # (loop, shape) -> µs at M = 1
    for loop in _mma_decode.M8_LOOPS if packed else ():
        for (N, K), pw in packed.items():
            run = _mma_decode.MmaDecode.of(pw, 1, torch.bfloat16, loop)
            x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16, generator=g)
            us[loop, (N, K)] = _time(lambda: run(x, None), rep_ms)
        log(f"decode-mma m8 loop {loop or 'register'}: " + ", ".join(
            f"{N}x{K} {us[loop, (N, K)]:.1f}" for N, K in packed) + " us at M = 1")
    m8_loop, ring_min_k = m8_loops(us)

    def by_k(K: int) -> str:
        return "g" if ring_min_k is not None and K >= ring_min_k else m8_loop
    ring2 = ring2_min_n(us, by_k)

    def loop_of(N: int, K: int, M: int) -> str:
        return "g2" if ring2 is not None and M <= 8 and N >= ring2 else by_k(K)
    runs = {s: (pw, lambda M, pw=pw, s=s: functools.partial(
        _mma_decode.MmaDecode.of(pw, M, torch.bfloat16, loop_of(*s, M)), bias=None)) for s, pw in packed.items()}
    if why is not None:
        log(f"decode-mma cannot run here: {why}")
        max_m = 0
    elif not runs:
        return None  # (no shape packs to its layout, N % 16, K % 64: not measured)
    else:
        max_m = _envelope("decode-mma", runs, {"decode_mma": {"max_m": 0}}, g, rep_ms, log)
    return {"max_m": max_m, "m8_loop": m8_loop, "ring_min_k": ring_min_k, "ring2_min_n": ring2}


def ring2_min_n(us: dict, by_k) -> Optional[int]:
    """The smallest N of the shapes from which the ring of 2 ("g2") is faster at M = 1 than the loop ``by_k(K)``
    takes (m8_loop or the ring of 4 by ring_min_k) at every N of that N or more, µs summed over the shapes of each
    N (``us`` as :func:`m8_loops`'); None where it loses on the largest N or was not timed."""
    shapes = list(dict.fromkeys(s for _, s in us))
    if not shapes or any(("g2", s) not in us or (by_k(s[1]), s) not in us for s in shapes):
        return None
    found = None
    for n0 in sorted({N for N, _ in shapes}, reverse=True):
        of_n = [s for s in shapes if s[0] == n0]
        if not sum(us["g2", s] for s in of_n) < sum(us[by_k(s[1]), s] for s in of_n):
            break
        found = n0
    return found


def m8_loops(us: dict) -> tuple[str, Optional[int]]:
    """(m8_loop, ring_min_k) from ``us`` ({(loop, (N, K)): µs at M = 1} over ``_mma_decode.M8_LOOPS``): of the
    batch loops ("" and "l"), the one with the least total over the shapes ("" where nothing was timed; a tie
    keeps the earlier loop), and the smallest K of the shapes from which the ring loop ("g") is faster than it
    at every K of that K or more, its µs summed over the shapes of each K (None where the ring loses on the
    largest K or was not timed; summed, as quant_max_m is: the H100's tune had the ring 1.1 µs behind on
    28672x8192 and 2.4 ahead on 8192^2, and an A/B then measured 20.0 -> 18.2 and a tie). A table may still name
    "g" as its m8_loop; the tuner takes the ring by K."""
    if not us:
        return "", None
    loops = list(dict.fromkeys(loop for loop, _ in us))
    shapes = list(dict.fromkeys(s for _, s in us))
    batch = [lp for lp in loops if lp not in ("g", "g2")] or loops
    m8_loop = min(batch, key=lambda lp: (sum(us[lp, s] for s in shapes), batch.index(lp)))
    ring_min_k = None
    if m8_loop != "g" and "g" in loops:
        for k0 in sorted({K for _, K in shapes}, reverse=True):
            of_k = [s for s in shapes if s[1] == k0]
            if not sum(us["g", s] for s in of_k) < sum(us[m8_loop, s] for s in of_k):
                break
            ring_min_k = k0
    return m8_loop, ring_min_k


def _tune_a8w8(shapes: Sequence[tuple[int, int]], g: torch.Generator, rep_ms: float, log) -> dict:
    """The ``a8w8_mma`` envelope: a8w8-mma (MXFP8 activations x a packed MXFP8 weight) against the path the plan
    takes without it, at M = 1, 2, 4, ..., 64 on every shape. ``max_m``: the largest M up to which it wins at
    every (shape, M) the plan bounds by ``max_m`` (:func:`~mxkit.kernels.matmul.a8w8_envelope_field`: w8a16-wgmma
    takes the call and N * K >= ``wgmma_min_nk``; left out when none is, so the packaged value stands);
    ``max_m_no_wgmma``: the same over the others (left out alike); ``quant_max_m``: the largest M of 1, 2, 4, 8,
    16 up to which quantizing bf16
    activations inside the launch (:func:`mxkit.kernels.matmul.a8w8_linear`) beats one quantize call, then the
    kernel, summed over the shapes (on every shape, the H100's M = 1 came out 0 on a 0.8 us loss on 8192^2 against
    1.0-2.5 us won on the small layers). ``{"max_m": 0, "max_m_no_wgmma": 0}`` where the kernel cannot run; None
    where no shape packs to its layout (not measured)."""
    from . import ops
    from .kernels import matmul as mm
    from .kernels.matmul_details import _mma_a8w8

    dev = torch.device("cuda")
    why = _mma_a8w8.available(dev)
    if why is not None:
        log(f"a8w8-mma cannot run here: {why}")
        return {"max_m": 0, "max_m_no_wgmma": 0}
    name = torch.cuda.get_device_name()
    won: dict = {"max_m": {}, "max_m_no_wgmma": {}}  # field -> {M: won on every shape of that kind}
    q_total: dict = {}  # M -> [µs in the launch, µs quantized first], summed over the shapes
    for N, K in shapes:
        w = ops.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g), "mxfp8")
        pw = mm.pack_weight(w)
        if pw.mma_q is None:
            continue
        for M in (1, 2, 4, 8, 16, 32, 64):
            x = ops.quantize(torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g), "mxfp8")
            run = _mma_a8w8.A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, False, shape=(N, K))
            t_run = _time(lambda: run(x.qdata, x.plain_scale(), None), rep_ms)
            path, t_other = _plan_without(x, pw, name, {"a8w8_mma": {"max_m": 0, "max_m_no_wgmma": 0}}, rep_ms)
            _check_closed(path, "a8w8-mma")
            log(f"M={M} N={N} K={K}: a8w8-mma {t_run:.1f} us, {path} {t_other:.1f} us")
            field = mm.a8w8_envelope_field(pw, M, dev)  # (the field the plan bounds this (weight, M) by)
            won[field][M] = won[field].get(M, True) and t_run < t_other
            if M <= 16:  # the activation quantize inside the launch, or one quantize call first
                xb = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
                t_q = {}
                for qm in (64, 0):
                    with mm.gemm_table_override(_with_entry(name, {"a8w8_mma": {
                            "max_m": 64, "max_m_no_wgmma": 64, "quant_max_m": qm}})):
                        t_q[qm] = _time(lambda: mm.a8w8_linear(xb, pw), rep_ms)
                log(f"M={M} N={N} K={K}: x quantized in the launch {t_q[64]:.1f} us, first {t_q[0]:.1f} us")
                tot = q_total.setdefault(M, [0.0, 0.0])
                tot[0], tot[1] = tot[0] + t_q[64], tot[1] + t_q[0]
    won["quant_max_m"] = _won_summed(q_total)
    if not q_total:
        return None  # (no shape packs to its layout, N % 16, K % 64: not measured)
    return {field: _largest_won(by_m) for field, by_m in won.items() if by_m}


W8A16_MS = (1, 2, 4, 8, 16, 32, 64)
# the w8a16_mma fields that close its envelope (large_max_m too: with max_m alone closed, the H200's large-weight
# envelope kept w8a16-mma as the path it was timed against)
W8A16_CLOSED = {"max_m": 0, "large_max_m": 0}


def _tune_w8a16_mma(shapes: Sequence[tuple[int, int]], g: torch.Generator, rep_ms: float, log) -> dict:
    """The ``w8a16_mma`` envelope: ``max_m``, the largest M of :data:`W8A16_MS` up to which w8a16-mma (bf16 x a
    packed MXFP8 E4M3 weight) beats, on every shape, the path the plan takes without it (decode-w16,
    w8a16-wgmma or dense-exact, by the packaged table), 0 where the kernel cannot run or no shape packs to its
    layout; past it, where the larger weights win on: ``large_max_m`` and ``large_min_nk``, 0 and 0 where none do
    (:func:`w8a16_envelope`). None where no shape packs to its layout (not measured)."""
    from . import ops
    from .kernels import matmul as mm
    from .kernels.matmul_details import _mma_a8w8

    dev = torch.device("cuda")
    why = _mma_a8w8.available(dev)
    if why is not None:
        log(f"w8a16-mma cannot run here: {why}")
        return w8a16_envelope({})
    name = torch.cuda.get_device_name()
    packed = [mm.pack_weight(ops.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g),
                                          "mxfp8_e4m3"), act="float") for N, K in shapes]
    if all(pw.mma_q is None for pw in packed):
        return None  # (no shape packs to its layout: not measured)
    won: dict = {}  # (N, K, M) -> won
    for pw in packed:
        if pw.mma_q is None:
            continue
        N, K = pw.shape
        for M in W8A16_MS:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
            run = _mma_a8w8.A8W8(pw.mma_q, pw.mma_s, M, torch.bfloat16, True, shape=(N, K), w16="e4m3")
            t_run = _time(lambda: run(x, None, None), rep_ms)
            path, t_other = _plan_without(x, pw, name, {"w8a16_mma": W8A16_CLOSED}, rep_ms)
            _check_closed(path, "w8a16-mma")
            log(f"M={M} N={N} K={K}: w8a16-mma {t_run:.1f} us, {path} {t_other:.1f} us")
            won[(N, K, M)] = t_run < t_other
    return w8a16_envelope(won)


def w8a16_envelope(won: dict) -> dict:
    """:func:`_tune_w8a16_mma`'s choice from ``won[(N, K, M)]`` (w8a16-mma beat the other path): ``max_m`` the
    largest M it won at, and at every smaller M, on every shape; past it :func:`wgmma_envelope` over the larger
    Ms (``large_max_m``, ``large_min_nk``: the weights of N * K >= large_min_nk win up to large_max_m), 0 and 0
    where no weights win past ``max_m``: written out, so that merged into the packaged table (:func:`merge_tables
    <mxkit.kernels.matmul_table.merge_tables>`) the measured result closes a packaged large envelope."""
    closed = {"max_m": 0, "large_max_m": 0, "large_min_nk": 0}
    if not won:
        return closed
    ms = sorted({M for _, _, M in won})
    max_m = _largest_won({M: all(v for (_, _, m), v in won.items() if m == M) for M in ms})
    entry = {**closed, "max_m": max_m}
    more = tuple(M for M in ms if M > max_m)
    if more:  # (max_m 0 too: the plan's large envelope holds past max_m whatever it is)
        large = wgmma_envelope({key: v for key, v in won.items() if key[2] > max_m}, more)
        if large["max_m"]:
            entry.update(large_max_m=large["max_m"], large_min_nk=large["min_nk"])
    return entry


def _plan_without(x, pw, name: str, off: dict, rep_ms: float) -> tuple[str, float]:
    """(path, µs) of the plan for ``x`` times ``pw`` with the fields ``off`` (``{key: {field: value}}``: a kernel's
    envelope closed) merged into this GPU's table entry, its other fields and keys as they are (:func:`_with_entry`):
    the path a kernel's envelope is measured against."""
    from .kernels import matmul as mm

    with mm.gemm_table_override(_with_entry(name, off)):
        plan = mm.plan_gemm(x, pw)
    return plan.path, _time(lambda: mm.run_gemm(x, pw, plan), rep_ms)


def _check_closed(path: str, kernel: str) -> None:
    """Raises :class:`TuneError` where the plan with ``kernel``'s envelope closed still took it (a field of the table
    that also opens it was left open): the kernel would be timed against itself."""
    if path == kernel:
        raise TuneError(f"mxkit tune gemm: with {kernel}'s envelope closed the plan still took {kernel} (a "
                           f"table field the tune does not close opens it)")


def _won_summed(totals: dict) -> dict:
    """{M: the first way won} from ``totals`` ({M: [µs one way, µs the other], each summed over the tuned shapes})."""
    return {M: t_one < t_other for M, (t_one, t_other) in totals.items()}


def _largest_won(won: dict) -> int:
    """The largest M of ``won`` ({M: the kernel won there}) up to which it won at every M; 0 if it lost the first."""
    best = 0
    for M in sorted(won):
        if not won[M]:
            break
        best = M
    return best


MOE_PAIRS = (8, 16, 32, 64, 128, 256, 512, 1024)  # (token, slot) pairs: 2 to 256 tokens at top-4
MOE_EXPERTS = ((32, 2880, 2880), (128, 2880, 2880))  # (E, hidden, intermediate): GPT-OSS-20B and -120B
MOE_STRIP_PAIRS = (16, 64, 256)  # the pair counts the decode kernels' strips a block are timed at
# the moe entry's fields that put every pair count on the decode kernels / on the prefill kernel (both fields: the
# envelope is the larger of them; with mma_max_pairs alone closed, the H200's per-expert field kept the "prefill"
# timings on decode, and the tune read a tie as a loss)
MOE_DECODE = {"mma_max_pairs": 1 << 30, "mma_max_pairs_per_expert": 1 << 30}
MOE_PREFILL = {"mma_max_pairs": 0, "mma_max_pairs_per_expert": 0}


def _tune_moe(g: torch.Generator, rep_ms: float, log, top_k: int = 4) -> dict:
    """The ``moe`` envelope: ``mma_max_pairs``, the (token, slot) pair count up to which
    :func:`mxkit.kernels.moe.moe_triton` runs packed MXFP4 experts on the tensor-core decode kernels rather than
    the grouped wgmma prefill kernel, and ``mma_max_pairs_per_expert``, the same per expert held (the envelope
    is the larger of the two: :func:`mxkit.kernels.moe.mma_max_pairs`). Both paths are timed on the same packed
    experts (GPT-OSS's clamped SwiGLU,
    biases, uniform routing over :data:`MOE_EXPERTS`: (E, hidden, intermediate) each) at each count of
    :data:`MOE_PAIRS`; the result is :func:`moe_envelope` of the times, with ``mma_strips``: the decode kernels'
    strips a block (:data:`~mxkit.kernels.matmul_details._mma_decode.GROUPED_STRIPS`) timed at
    :data:`MOE_STRIP_PAIRS`, :func:`moe_strips` of the totals. The packaged value where either path cannot run
    here."""
    from . import ops
    from .kernels import matmul as mm
    from .kernels import moe as km
    from .kernels.matmul_details import _mma_decode, _w4a16_wgmma

    dev = torch.device("cuda")
    why = _mma_decode.available(dev) or _w4a16_wgmma.available(dev)
    if why is not None:
        log(f"moe: the decode or prefill kernel cannot run here ({why}); mma_max_pairs stays {km.MMA_MAX_PAIRS}")
        return {"mma_max_pairs": km.MMA_MAX_PAIRS}
    name = torch.cuda.get_device_name()
    times: dict = {}  # experts E -> {pairs: (decode us, prefill us)}
    strip_us = dict.fromkeys(_mma_decode.GROUPED_STRIPS, 0.0)  # strips a block -> total decode us
    for E, H, inter in MOE_EXPERTS:
        def mx(*shape):
            return ops.quantize(torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g) * 0.05, "mxfp4")

        wgu, wd = mx(E, 2 * inter, H), mx(E, H, inter)
        bgu = torch.randn(E, 2 * inter, device=dev, generator=g) * 0.01
        bd = torch.randn(E, H, device=dev, generator=g) * 0.01
        packed = (km.pack_experts_mma(wgu), km.pack_experts_mma(wd))
        if None in packed:
            log(f"moe: experts {E} x {H} x {inter} do not pack to the decode layout; skipped")
            continue
        for n in MOE_PAIRS:
            T = max(1, n // top_k)
            x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
            ids = torch.rand(T, E, device=dev, generator=g).topk(top_k, dim=-1).indices.to(torch.int32)
            tw = torch.softmax(torch.randn(T, top_k, device=dev, generator=g), dim=-1)
            got = []

            def run():
                return km.moe_triton(x, wgu, bgu, wd, bd, tw, ids, packed=packed)
            for path in (MOE_DECODE, MOE_PREFILL):  # decode every count, then prefill every count
                with mm.gemm_table_override(_with_entry(name, {"moe": path})):
                    got.append(_time(run, rep_ms))
            log(f"moe E={E} H={H} I={inter}, {T * top_k} pairs: decode {got[0]:.1f} us, prefill {got[1]:.1f} us")
            times.setdefault(E, {})[T * top_k] = tuple(got)
            if T * top_k in MOE_STRIP_PAIRS:  # the decode path at each strips a block, one after another
                for sn in _mma_decode.GROUPED_STRIPS:
                    with mm.gemm_table_override(_with_entry(name, {"moe": {**MOE_DECODE, "mma_strips": sn}})):
                        t = _time(run, rep_ms)
                    log(f"moe E={E}, {T * top_k} pairs: decode at {sn} strips a block {t:.1f} us")
                    strip_us[sn] += t
        del wgu, wd, packed
    if not times:
        return {"mma_max_pairs": km.MMA_MAX_PAIRS}
    return {**moe_envelope(times), "mma_strips": moe_strips(strip_us)}


def moe_strips(us: dict) -> int:
    """The strips a block with the least total time of ``us`` ({strips: µs}); a tie keeps fewer strips, none
    timed (every total 0) keeps 1."""
    timed = {sn: t for sn, t in us.items() if t > 0}
    return min(timed, key=lambda sn: (timed[sn], sn)) if timed else 1


def moe_envelope(times: dict) -> dict:
    """The ``moe`` entry from ``{E: {pairs: (decode µs, prefill µs)}}`` (one expert set per E): for each set the
    largest pair count up to which the decode path was at least as fast at every count (0 if it lost at the
    smallest); ``mma_max_pairs``: the least of those, ``mma_max_pairs_per_expert``: the least of those over E
    (rounded down)."""
    won = {E: _largest_won({n: d <= p for n, (d, p) in by_n.items()}) for E, by_n in times.items()}
    if not won:
        return {"mma_max_pairs": 0, "mma_max_pairs_per_expert": 0}
    return {"mma_max_pairs": min(won.values()), "mma_max_pairs_per_expert": min(n // E for E, n in won.items())}


# the main envelope's Ms: from 64, the largest M the small-M paths are timed at (the plan takes every M <= max_m of
# the envelope to the kernel, so an envelope won at 128 up but lost at 64 sent M = 17-64 to a loss)
WGMMA_MS = (64, 128, 256, 512, 1024, 2048, 4096)


def _tune_wgmma(weights: dict, g: torch.Generator, rep_ms: float, log, fp8: bool = False) -> dict:
    """The ``w4a16_wgmma`` envelope (``fp8``: ``w8a16_wgmma``, on MXFP8 E4M3 weights of the same shapes): for each
    candidate ``min_nk`` (the N * K of a shape), the largest M of :data:`WGMMA_MS` up to which the kernel beats
    dequantize + cuBLAS at every M on every shape of N * K >= min_nk; kept: the candidate whose envelope covers
    the most (shape, M) points, then the widest M; ``small_max_m`` / ``small_min_nk`` the same over
    :data:`SMALL_MS` (the split schedule's Ms, where smaller weights win too), ``mid_max_m`` / ``mid_min_nk`` over
    :data:`MID_MS` (the same timings). ``{"max_m": 0, ...}`` where it cannot run or never wins; None where no
    shape fits it (not measured)."""
    from . import ops
    from .kernels import matmul as mm
    from .kernels.matmul_details import _w4a16_wgmma as wg
    from .kernels.matmul_details._cublas import dense_gemm

    label = "w8a16-wgmma" if fp8 else "w4a16-wgmma"

    dev = torch.device("cuda")
    why = wg.available(dev)
    shapes = [s for s in weights if wg.shape_ok(*s)]
    if why is not None:
        log(f"{label} cannot run here: {why}")
        return {"max_m": 0, "min_nk": 0, "small_max_m": 0, "small_min_nk": 0, "mid_max_m": 0, "mid_min_nk": 0}
    if not shapes:
        return None  # (no shape fits the kernel: not measured)
    wins = {}
    for (N, K) in shapes:
        w = weights[(N, K)]
        if fp8:
            w = ops.quantize(torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g), "mxfp8_e4m3")
        q, st, one_mul = wg.packed_of(mm.pack_weight(w, act="float"))
        elem = wg.FP8_ELEMS.get(w.fmt.name, "e2m1")
        for M in sorted(set(SMALL_MS + WGMMA_MS)):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
            bm, split = wg.dense_schedule(M, N, K, dev)  # the plan's schedule
            t_run = _time(lambda: wg.w4a16_wgmma(x, q, st, N, one_mul, bm=bm, split=split, elem=elem), rep_ms)
            t_dense = _time(lambda: dense_gemm(x, mm._dequantize(w, torch.bfloat16), torch.bfloat16), rep_ms)
            log(f"M={M} N={N} K={K}: {label} {t_run:.1f} us (tile {bm}, split {split}), dense {t_dense:.1f} us")
            wins[(N, K, M)] = t_run < t_dense
    entry = wgmma_envelope({key: won for key, won in wins.items() if key[2] in WGMMA_MS})
    small = wgmma_envelope({key: won for key, won in wins.items() if key[2] in SMALL_MS}, SMALL_MS)
    mid = wgmma_envelope({key: won for key, won in wins.items() if key[2] in MID_MS}, MID_MS)
    return close_contained({**entry, "small_max_m": small["max_m"], "small_min_nk": small["min_nk"],
                            "mid_max_m": mid["max_m"], "mid_min_nk": mid["min_nk"]})


def close_contained(entry: dict) -> dict:
    """A wgmma envelope ``entry`` with its ``mid_*`` pair written as 0 and 0 (closed) where it routes nothing of its
    own: ``mid_max_m`` 0 (it never won), or the main envelope (``max_m`` on ``min_nk``) holds it (M no larger on
    weights no smaller). Written out rather than dropped: merged into the packaged table (:func:`merge_tables
    <mxkit.kernels.matmul_table.merge_tables>`), a missing pair kept the packaged GPU entry's, which the tune had
    just measured not to win."""
    mid_m, mid_nk = entry.get("mid_max_m", 0), entry.get("mid_min_nk", 0)
    if mid_m <= 0 or (mid_m <= entry.get("max_m", 0) and mid_nk >= entry.get("min_nk", 0)):
        return {**entry, "mid_max_m": 0, "mid_min_nk": 0}
    return entry


MID_MS = (64, 128, 256, 512)  # the third envelope's Ms (a subset of WGMMA_MS: no more timings; H200, session 62: the
# kernel wins at M <= 512 on N * K in [2^24, 2^26) where it ties or loses at 1024; 64 as WGMMA_MS')
SMALL_MS = (64, 128)  # the second envelope's Ms (the kernel split along K at small M: _w4a16_wgmma.dense_schedule;
# H200, session 39: 128 wins on N * K in [2^24, 2^26) once the split's sum is one kernel)


def wgmma_envelope(wins: dict, ms: tuple = WGMMA_MS) -> dict:
    """:func:`_tune_wgmma`'s choice from ``wins[(N, K, M)]`` (the kernel beat the dense path) over the Ms ``ms``:
    ``{"max_m", "min_nk"}``."""
    shapes = {(N, K) for N, K, _ in wins}
    best, best_key = {"max_m": 0, "min_nk": 0}, (0, 0)
    for cand in sorted({N * K for N, K in shapes}):
        big = [s for s in shapes if s[0] * s[1] >= cand]
        max_m = 0
        for M in ms:
            if not all(wins.get((N, K, M), False) for N, K in big):
                break
            max_m = M
        area = len(big) * sum(1 for M in ms if M <= max_m)
        if max_m and (area, max_m) > best_key:
            best, best_key = {"max_m": max_m, "min_nk": cand}, (area, max_m)
    return best


def _envelope(path: str, runs: dict, off: dict, g: torch.Generator, rep_ms: float, log,
              dev: Optional[torch.device] = None) -> int:
    """The largest M of 1, 2, 4, ..., 64 up to which ``runs[(N, K)] = (weight, make)`` beat, at every M and on
    every shape, the path the plan takes for that weight with the fields ``off`` merged into this GPU's entry
    (:func:`_plan_without`: ``path``'s envelope closed, the others as the table in force); ``make(M)`` is the timed
    call ``x -> y``, made once per M. ``dev``: the activations' device (CUDA). Raises :class:`TuneError` where the plan
    with ``off`` still takes ``path`` (:func:`_check_closed`)."""
    dev = dev or torch.device("cuda")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else ""
    max_m = 0
    for M in (1, 2, 4, 8, 16, 32, 64):
        wins = True
        for (N, K), (w, make) in runs.items():
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
            run = make(M)
            t_run = _time(lambda: run(x), rep_ms)
            other, t_other = _plan_without(x, w, name, off, rep_ms)
            _check_closed(other, path)
            log(f"M={M} N={N} K={K}: {path} {t_run:.1f} us, {other} {t_other:.1f} us")
            wins &= t_run < t_other
        if not wins:
            break
        max_m = M
    return max_m
