"""The harness of the kernel benchmarks (``quantize.py``, ``gemm.py``). An op module supplies cases and
implementations (:class:`Impl`); :func:`run_benchmark` times them, turns failures into ``n/a`` rows with the
reason, and writes the table and files (:mod:`.output`) the same way for every op.

Timing (:func:`cuda_event_bench`): the median of CUDA-event runs, each after an L2 flush through a 256 MB buffer
and a GPU spin (the events bracket device time, not the host's launch path). Two flushes, both reported: ``read``
(``Row.us``, what targets are judged on) sums the buffer, leaving L2 cold and clean; ``write`` (``Row.us_write``)
zero-fills it as ``triton.testing.do_bench`` does (which has neither the read flush nor the spin), so each run
also writes back dirty lines (4-6 µs on an H200). Bandwidth counts bytes read plus written once each, against a
1 GiB device ``copy_`` timed the same way in the same process; GEMM rows count 2·M·N·K flops.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from .output import (Column, check_out_folder, env_line, environment, fmt_num, out_folder,  # noqa: F401
                     progress, reason, render_table, save, usage_error, write_chart)

L2_FLUSH_BYTES = 256 * 1024 * 1024  # over 4x any Hopper L2 (H100 50 MB, H200 60 MB), as do_bench
FLUSH_MODES = ("read", "write")
MIN_RUNS = 25  # timed runs at least, whatever rep_ms allows (a 23 ms peer call got one run under --rep-ms 40)
BAD_CHECKS = ("MISMATCH", "FAIL")  # a checked output that is wrong (bytes / numerics bound)
DEFAULT_REP_MS, QUICK_REP_MS = 100.0, 40.0


class BenchUnavailable(Exception):
    """An implementation cannot run here (peer not installed, pair not covered): an ``n/a`` row, never an abort."""


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0
    rep_ms: float = DEFAULT_REP_MS
    spin_us: float = 100.0  # GPU spin before each timed run (hides the host's launch path); 0 = none
    rounds: int = 1  # > 1: each row's × column from that many interleaved rounds against the reference impl


@dataclass
class Row:
    """One implementation of one case. Times are medians in µs: ``us`` after the read flush, ``us_write`` after
    the write flush; None when the row did not run. ``gbps`` / ``pct_copy`` / ``tflops`` derive from ``us``
    (``pct_copy_write`` from ``us_write`` against the write-flushed copy). ``vs_ref``: the reference impl's µs
    over this row's. ``status``: ok | n/a | error | skip (not run by design, kept out of the notes).
    ``check``: match / MISMATCH (bytes), ok / FAIL (numerics bound), "" when not checked. With ``--rounds`` R > 1,
    ``vs_ref`` is the median of R per-round ratios, the reference and the row timed back to back in alternating
    order each round (read flush), and ``vs_ref_lo`` / ``vs_ref_hi`` their range. GEMM rows add
    ``path`` (what mxkit.gemm_plan says), ``pack_us`` / ``pack_gbps``, ``err`` against ``err_bound`` and
    ``pct_floor``: the case's ``floor_bytes()`` (the MX weight's element and scale bytes) at the copy bandwidth
    over ``us``, issue #23's weight-bytes floor (``pct_copy`` counts the activations and the output too)."""

    op: str
    fmt: str
    shape: str
    impl: str
    dtype: str = "bfloat16"
    us: Optional[float] = None
    us_write: Optional[float] = None
    nbytes: int = 0
    gbps: Optional[float] = None
    pct_copy: Optional[float] = None
    pct_copy_write: Optional[float] = None
    floor_bytes: int = 0
    pct_floor: Optional[float] = None
    flops: int = 0
    tflops: Optional[float] = None
    vs_ref: Optional[float] = None
    vs_ref_lo: Optional[float] = None  # with rounds > 1: the smallest and largest per-round ratio
    vs_ref_hi: Optional[float] = None
    status: str = "ok"
    check: str = ""
    compile_s: Optional[float] = None
    path: str = ""
    pack_us: Optional[float] = None
    pack_gbps: Optional[float] = None
    err: Optional[float] = None
    err_bound: Optional[float] = None
    note: str = ""


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8192x8192"`` / ``"8x2048x4096"`` → tuple of positive ints. Raises ValueError naming the text."""
    try:
        dims = tuple(int(p) for p in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r} is not of the form 8192x8192 (positive ints joined by 'x')") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"shape {text!r} must have positive dimensions")
    return dims


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def gbps(nbytes: int, us: Optional[float]) -> Optional[float]:
    """Bytes over µs in GB/s (1e9 B/s); None unless ``us`` > 0. TFLOP/s is ``gbps(flops, us) / 1e3``."""
    return nbytes / us / 1e3 if us is not None and us > 0 else None


class ChoiceError(ValueError, argparse.ArgumentTypeError):
    """An unknown name: a ValueError, and a usage error (with its message) when argparse parses it."""


def choice(what: str, known) -> Callable[[str], str]:
    """A parser of one name among ``known``, in any case (``GPT-OSS-20B`` is ``gpt-oss-20b``, as ``--formats MXFP4``
    and ``--scale-mode FLOOR`` are taken), returned as ``known`` spells it; :class:`ChoiceError` naming the choices
    otherwise."""
    folded = {str(k).lower(): k for k in known}

    def parse(name: str) -> str:
        if name in known:
            return name
        if isinstance(name, str) and name.lower() in folded:
            return folded[name.lower()]
        raise ChoiceError(f"unknown {what} {name!r}; known: {', '.join(map(str, known))}")

    return parse


def first_repeat(keys: Sequence) -> Optional[int]:
    """The index of the first item of ``keys`` equal to an earlier one, or None."""
    return next((i for i, k in enumerate(keys) if k in keys[:i]), None)


def csv_arg(convert: Callable[[str], object]) -> Callable[[str], tuple]:
    """An argparse ``type`` for a comma list, each item through ``convert`` (ValueError → usage error)."""
    def parse(text: str) -> tuple:
        try:
            items = tuple(convert(t) for t in (s.strip() for s in text.split(",")) if t)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        i = first_repeat(items)  # (a repeated item would run, and print, twice)
        if i is not None:
            raise argparse.ArgumentTypeError(f"{text!r} lists {items[i]!r} twice")
        return items

    return parse


def nonnegative_int(text: str) -> int:
    """An argparse ``type``: an int >= 0 (usage error otherwise)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative")
    return v


def peers_arg(what: str, known) -> Callable[[str], tuple]:
    """``--peers``: a comma list of ``known`` names, or ``none`` alone."""
    def parse(text: str) -> tuple:
        if text.strip().lower() == "none":  # (case-insensitive, as the names are)
            return ()
        if "none" in (t.strip().lower() for t in text.split(",")):  # (it read "unknown peer 'none'", which help lists)
            raise argparse.ArgumentTypeError(f"{text!r}: 'none' (no peers) goes alone, not with other {what}s")
        try:
            return csv_arg(choice(what, known))(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (or 'none' alone: no {what}s)") from None

    return parse


def no_cuda(what: str, hint: str = "'--list' shows the cases without a GPU") -> int:
    """The one-line error of a GPU benchmark on a machine without CUDA; returns the exit status 2."""
    return usage_error(f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False (torch {torch.__version__}, "
                       f"CUDA build {torch.version.cuda}); {hint}.")


def spin_cycles(us: float) -> int:
    """GPU cycles of a ``us`` µs ``torch.cuda._sleep`` spin at the device's clock (2 GHz when it is not known)."""
    mhz = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) / 1e3 or 2000.0
    return int(us * mhz)


def cuda_event_bench(fn: Callable[[], object], warmup_ms: float = 25.0, rep_ms: float = 100.0,
                     spin_us: float = 0.0, flush: str = "read") -> float:
    """Median µs of ``fn()`` on the current CUDA device: one call, a 5-run estimate, ``warmup_ms`` of untimed runs
    (each after the flush, as the timed ones: the estimate includes it), then runs for ``rep_ms`` but at least
    :data:`MIN_RUNS`, each after the ``flush`` and a ``spin_us`` spin, lengthened to 1.5x the host time of one
    ``fn()`` call where that is longer (the estimate's median): the spin keeps the GPU busy while the host enqueues
    fn's kernels, so the events bracket device time also for a callable of many launches (at a fixed 100 µs, 30
    launches of 10 µs host time each read 139 µs for 60 µs of kernels). ``spin_us`` 0: no spin at all. ValueError
    for an unknown flush."""
    if flush not in FLUSH_MODES:
        raise ValueError(f"flush={flush!r} must be one of {FLUSH_MODES}")
    buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    # (an int32 sum: int64 out would have ATen convert the buffer first, writing a 2x temporary each flush)
    total = torch.empty((), dtype=torch.int32, device="cuda")
    do_flush = (lambda: torch.sum(buf, dim=0, out=total)) if flush == "read" else buf.zero_
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_us = []
    start.record()
    for _ in range(5):
        do_flush()
        t = time.perf_counter()
        fn()
        host_us.append(1e6 * (time.perf_counter() - t))
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)  # includes the flush: an upper bound, as do_bench
    if spin_us > 0:
        spin_us = max(spin_us, 1.5 * statistics.median(host_us))
    cycles = spin_cycles(spin_us)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        do_flush()
        fn()
    n = max(MIN_RUNS, int(rep_ms / (estimate_ms + spin_us / 1e3)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in events:
        do_flush()
        if cycles:
            torch.cuda._sleep(cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in events)


def time_us(fn: Callable[[], object], cfg: TimingConfig) -> tuple[float, float]:
    """(µs after the read flush, µs after the write flush) of ``fn``."""
    return tuple(cuda_event_bench(fn, cfg.warmup_ms, cfg.rep_ms, cfg.spin_us, f) for f in FLUSH_MODES)


def copy_bandwidth(cfg: TimingConfig) -> tuple[float, float, int]:
    """The limit: a device ``dst.copy_(src)`` moving 1 GiB (read + written), timed by :func:`time_us` after one
    discarded timing of the same (the first timing in a process read 8-25% low in some runs: clocks still rising).
    Returns (GB/s read flush, GB/s write flush, bytes)."""
    src = torch.randn(2**28, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 2
    cuda_event_bench(lambda: dst.copy_(src), cfg.warmup_ms, cfg.rep_ms, cfg.spin_us, "read")  # (discarded)
    us_read, us_write = time_us(lambda: dst.copy_(src), cfg)
    return gbps(nbytes, us_read), gbps(nbytes, us_write), nbytes


@dataclass(frozen=True)
class Impl:
    """An implementation. A case (``quantize.Case``, ``gemm.GemmCase``) offers ``op``, ``dtype``, ``fmt_name``,
    ``label`` (the shape), ``note``, ``nbytes()``, ``invalid_reason()``, ``make_inputs(ctx)``,
    ``expected(inputs)`` and ``check(out, expected) -> dict of Row fields`` (``{"check": "match"}``).
    ``make(case, inputs, ctx)`` returns the zero-argument callable that is timed, or (callable, dict of Row
    fields such as ``path``). It raises :class:`BenchUnavailable` / ImportError / NotImplementedError when it
    cannot run here (``n/a``); ``skip`` (case → reason or None) marks cases it does not cover. ``compiled``: the
    first call compiles; ``checked``: its output goes through ``case.check``; ``bounded`` False (or a function of
    the case that says False): a peer of other numerics (another quantization of the same values), whose error is
    reported but held to no bound (its ``check`` stays empty, its ``err_bound`` None); a float: a peer of coarser
    arithmetic (bf16 intermediates), held to that sanity bound on ``err`` instead of the case's (a peer that
    computes something else, a wrong layout or a dropped term, fails it)."""

    name: str
    make: Callable[[Any, Any, "Context"], Any]
    compiled: bool = False
    checked: bool = False
    skip: Callable[[Any], Optional[str]] = lambda case: None
    bounded: Union[bool, float, Callable[[Any], bool]] = True


@dataclass
class Context:
    """What one run shares: device, timer, settings, compiled functions. ``time_fn(fn) -> (µs read flush,
    µs write flush)`` and ``sync`` are injected, so the whole pipeline runs on CPU in tests."""

    device: str
    time_fn: Callable[[Callable[[], object]], tuple[float, float]]
    sync: Callable[[], None]
    impls: tuple[str, ...] = ("mxkit",)
    backend: str = "triton"
    compile: bool = True
    check: bool = True
    copy_gbps: Optional[float] = None  # read flush
    copy_gbps_write: Optional[float] = None
    ref_impl: str = "reference-compiled"  # vs_ref: this impl's µs over each row's
    rounds: int = 1  # > 1: vs_ref from interleaved rounds (time_read each), not the rows' own timings
    time_read: Optional[Callable[[Callable[[], object]], float]] = None  # µs after a read flush
    compiled: dict = dataclasses.field(default_factory=dict)
    last_shape: Optional[object] = None  # the problem of the last case timed (_run_impl)

    def compiled_fn(self, key: tuple, shape: tuple, make: Callable[[], Callable]) -> Callable:
        """``torch.compile(make(), dynamic=False)`` once per (``key``, ``shape``); plain ``make()`` when compile
        is off. Per shape and never dynamic: on torch 2.11 the shape-generic compile (dynamic=True) failed
        for every reference peer ("RuntimeError when making fake tensor call", issue #23)."""
        if not self.compile:
            return make()
        if (key, shape) not in self.compiled:
            self.compiled[key, shape] = torch.compile(make(), dynamic=False)
        return self.compiled[key, shape]


_UNAVAILABLE = (BenchUnavailable, ImportError, NotImplementedError)


def _reason(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160] if isinstance(e, BenchUnavailable) else reason(e)


def _run_impl(row: Row, impl: Impl, case, inputs: Any, ctx: Context, expected: list) -> Callable[[], object]:
    made = impl.make(case, inputs, ctx)
    fn, extra = made if isinstance(made, tuple) else (made, {})
    vars(row).update(extra)
    t0 = time.perf_counter()
    out = fn()
    ctx.sync()
    if impl.compiled:
        row.compile_s = round(time.perf_counter() - t0, 2)
    if impl.checked and ctx.check:
        if not expected:
            expected.append(case.expected(inputs))
        vars(row).update(case.check(out, expected[0]))
        bounded = impl.bounded(case) if callable(impl.bounded) else impl.bounded
        if not bounded:
            row.check, row.err_bound = "", None
        elif not isinstance(bounded, bool) and row.check in ("ok", "FAIL"):  # a sanity bound of its own
            row.err_bound = float(bounded)
            row.check = "ok" if row.err is not None and row.err <= row.err_bound else "FAIL"
    del out
    # the first timing after a new problem read 1.8-3.4x slow (clocks ramping); a case's ``problem_key`` where its
    # label alone does not name the problem (a MoE case's label is its token count, its model and routing elsewhere)
    problem = getattr(case, "problem_key", case.label)
    if ctx.last_shape != problem:
        ctx.time_fn(fn)
        ctx.last_shape = problem
    row.us, row.us_write = ctx.time_fn(fn)
    return fn


def _interleaved_ratios(rows: list[Row], fns: dict, ctx: Context, ref: Row) -> None:
    """Each timed row's ``vs_ref`` as the (log-space) median of ``ctx.rounds`` per-round ratios: the reference and
    the row timed back to back (read flush), which goes first alternating by round, so a drift of the device's speed
    over the run (the peer's one timing read ±7% across rows of one run) divides out."""
    for r in rows:
        if r is ref or r.us is None or r.impl not in fns:
            continue
        ratios = []
        try:  # (an exception here, out of memory or a kernel error, ended the whole run: the row keeps its own ×)
            for k in range(ctx.rounds):
                first, second = (fns[ref.impl], fns[r.impl]) if k % 2 == 0 else (fns[r.impl], fns[ref.impl])
                t1, t2 = ctx.time_read(first), ctx.time_read(second)
                t_ref, t_row = (t1, t2) if k % 2 == 0 else (t2, t1)
                ratios.append(t_ref / t_row)
        except Exception as e:
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            r.note = "; ".join(filter(None, (r.note, f"rounds failed, × from one timing: {_reason(e)}")))
            continue
        # (the median in log space: with an even count the geometric mean of the middle two, so a steady drift,
        # which makes alternate rounds' ratios x / d and x * d, gives x)
        r.vs_ref = math.exp(statistics.median(math.log(v) for v in ratios))
        r.vs_ref_lo, r.vs_ref_hi = min(ratios), max(ratios)


def time_once_made(ctx: Context, fn: Callable[[], object]) -> float:
    """µs (read flush) of a one-time step timed inside ``Impl.make`` (a pack), after one discarded timing: it runs
    before :func:`_run_impl`'s discard for a new shape (the first timing after one read up to 3.4x slow)."""
    ctx.time_fn(fn)
    return ctx.time_fn(fn)[0]


def pool_reference(rows: Sequence[Row], ref_impl: str, key: Callable[[Row], object]) -> None:
    """``vs_ref`` of each timed row over the median of the ``ref_impl`` rows that share its ``key`` (the same
    problem timed again in each case of a shape, e.g. cuBLAS bf16 beside every GEMM pair), with ``vs_ref_lo`` /
    ``_hi`` over their fastest and slowest timing: one timing of the peer read ±7% across the rows of a run, so a
    row's own gave its ratio that noise. Rows whose ``vs_ref`` came from interleaved rounds keep it."""
    groups: dict = {}
    for r in rows:
        if r.impl == ref_impl and r.us:
            groups.setdefault(key(r), []).append(r.us)
    for r in rows:
        ref = groups.get(key(r))
        if not ref or len(ref) < 2 or not r.us or r.vs_ref_lo is not None:
            continue
        r.vs_ref = statistics.median(ref) / r.us
        r.vs_ref_lo, r.vs_ref_hi = min(ref) / r.us, max(ref) / r.us


def bench_case(case, ctx: Context, impls: dict[str, Impl]) -> list[Row]:
    """One row per name in ``ctx.impls``: first call, check, timing. Never raises for an impl: unavailable →
    ``n/a`` with the reason, another exception → ``error`` (``n/a`` for a compiled impl whose compile failed)."""
    bad = case.invalid_reason()
    rows = [Row(op=case.op, fmt=case.fmt_name, shape=case.label, impl=name, dtype=str(case.dtype).replace("torch.", ""),
                nbytes=0 if bad else case.nbytes(), flops=getattr(case, "flops", 0), status="n/a" if bad else "ok",
                floor_bytes=0 if bad or not hasattr(case, "floor_bytes") else case.floor_bytes(),
                note=bad or "") for name in ctx.impls]
    if bad:
        return rows
    try:
        inputs = case.make_inputs(ctx)
    except Exception as e:  # e.g. out of memory for the inputs themselves
        for r in rows:
            r.status, r.note = "error", f"inputs: {_reason(e)}"
        return rows
    expected: list = []  # the reference result, made when the first checked impl needs it
    fns: dict = {}  # (kept for interleaved rounds only)
    for row in rows:
        impl = impls[row.impl]
        skip = impl.skip(case)
        if skip:
            row.status, row.note = "skip", skip
            continue
        try:
            fn = _run_impl(row, impl, case, inputs, ctx, expected)
            if ctx.rounds > 1 and ctx.time_read is not None:
                fns[row.impl] = fn
        except _UNAVAILABLE as e:
            row.status, row.note = "n/a", _reason(e)
        except Exception as e:
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            failed_compile = impl.compiled and row.compile_s is None
            row.status = "n/a" if failed_compile else "error"
            row.note = f"{'torch.compile failed' if failed_compile else 'error'}: {_reason(e)}"
        row.gbps, gb_write = (gbps(row.nbytes, row.us), gbps(row.nbytes, row.us_write)) if row.nbytes else (None, None)
        row.pct_copy = 100 * row.gbps / ctx.copy_gbps if row.gbps and ctx.copy_gbps else None
        row.pct_copy_write = 100 * gb_write / ctx.copy_gbps_write if gb_write and ctx.copy_gbps_write else None
        gb_floor = gbps(row.floor_bytes, row.us) if row.floor_bytes else None
        row.pct_floor = 100 * gb_floor / ctx.copy_gbps if gb_floor and ctx.copy_gbps else None
        row.tflops = gbps(row.flops, row.us) / 1e3 if row.flops and row.us else None
        row.note = row.note or case.note
    ref = next((r for r in rows if r.impl == ctx.ref_impl and r.us), None)
    for r in rows:
        r.vs_ref = ref.us / r.us if ref is not None and r.us else None
    if ref is not None and ref.impl in fns:
        _interleaved_ratios(rows, fns, ctx, ref)
    return rows


def run_cases(cases: Sequence, ctx: Context, impls: dict[str, Impl], *,
              log: Callable[[str], None] = progress, on_rows: Optional[Callable[[list[Row]], None]] = None) -> list[Row]:
    """Bench every case in order, one progress line each; ``on_rows(rows so far)`` after each case (the files
    are rewritten then, so a run stopped from outside keeps what it measured)."""
    import torch._dynamo.config as dcfg

    def brief(r: Row) -> str:
        return (f"{r.impl} {r.status} ({r.note})" if r.us is None else
                f"{r.impl} {r.us:.1f}/{r.us_write:.1f} us" + (f" {r.check}" if r.check else ""))

    rows: list[Row] = []
    limits = {k: v for k, v in (("recompile_limit", 64), ("accumulated_recompile_limit", 1024)) if hasattr(dcfg, k)}
    with dcfg.patch(**limits):  # many (op, format, shape) variants compile in one process
        for i, case in enumerate(cases, 1):
            got = bench_case(case, ctx, impls)
            rows.extend(got)
            log(f"{i}/{len(cases)} {case.op} {case.fmt_name} {case.label}: " + "; ".join(map(brief, got)))
            if on_rows is not None:
                on_rows(rows)
    return rows


def summary_lines(rows: Sequence[Row], main: str = "mxkit") -> list[dict]:
    """One dict per case (op, fmt, shape): ``main`` (the ``main`` impl's row, else the first), ``peers``
    (impl → row) and ``note`` (why rows did not run; peers whose check failed)."""
    by_case: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault((r.op, r.fmt, r.shape), {})[r.impl] = r
    lines = []
    for (op, fmt, shape), d in by_case.items():
        m = d.get(main) or next(iter(d.values()))
        notes = [f"{k}: {v.note}" for k, v in d.items() if v.status not in ("ok", "skip") and v.note]
        notes += [f"{k} check {v.check}" for k, v in d.items() if k != main and v.check in BAD_CHECKS]
        if m.status == "ok" and m.note:
            notes.insert(0, m.note)
        lines.append({"op": op, "fmt": fmt, "shape": shape, "main": m, "peers": d, "note": "; ".join(notes)})
    return lines


def main_value(attr: str, spec: str) -> Callable[[dict], str]:
    """A column getter: the main row's ``attr`` formatted with ``spec`` ("n/a" when missing)."""
    return lambda d: fmt_num(getattr(d["main"], attr), spec)


def peer_us_column(name: str, label: str) -> Column:
    return Column(f"{label} µs", lambda d: fmt_num(getattr(d["peers"].get(name), "us", None), ".1f"))


def error_peer_note_columns(peers: Sequence[str], labels: dict[str, str]) -> list[Column]:
    """The columns every checked-against-float64 bench ends its table with: the main row's error, bound and
    check, each peer's µs, the note."""
    main = main_value
    return [Column("rel. err", main("err", ".2e")), Column("bound", main("err_bound", ".2e")),
            Column("check", lambda d: d["main"].check or "-"), *(peer_us_column(p, labels[p]) for p in peers),
            Column("note", lambda d: d["note"][:90], right=False)]


def add_common_arguments(p, backend: bool = True, backend_help: str = "backend of the mxkit rows (default triton)",
                         backend_default: str = "triton") -> None:
    """Options every kernel benchmark shares, read by :func:`run_benchmark`; ``backend=False`` leaves out
    ``--backend`` (a bench whose mxkit rows take none)."""
    if backend:
        p.add_argument("--backend", choices=("triton", "reference", "auto"), default=backend_default,
                       help=backend_help)
    p.add_argument("--no-check", action="store_true", help="skip the output checks")
    p.add_argument("--rep-ms", type=float, default=None,
                   help=f"timed runs per timing, ms (default {DEFAULT_REP_MS:g}; {QUICK_REP_MS:g} with --quick; at most "
                        "60000)")
    p.add_argument("--spin-us", type=float, default=100.0,
                   help="GPU spin queued before each timed run so the host's launch path is not timed (default 100; "
                        "at most 1e5)")
    p.add_argument("--rounds", type=int, default=1,
                   help="the × column as the median of this many interleaved rounds against the reference peer, "
                        "each pair timed back to back (default 1: the rows' own timings)")
    p.add_argument("--out", type=out_folder, default=None,
                   help="write CSV, JSON and a PNG chart into this folder (made when missing; checked before the run)")
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")


MAX_SPIN_US = 1e5  # --spin-us: 0.1 s of spin before each timed run (the default is 100)
MAX_REP_MS = 6e4  # --rep-ms: a minute of runs per timing


def timing_config(args) -> TimingConfig:
    """From ``--rep-ms`` (None: shorter with ``--quick``), ``--spin-us`` and ``--rounds``; ValueError for a
    rep-ms not in (0, :data:`MAX_REP_MS`], a spin-us not in [0, :data:`MAX_SPIN_US`], a rounds not a positive
    int."""
    rep = args.rep_ms if args.rep_ms is not None else (QUICK_REP_MS if getattr(args, "quick", False) else DEFAULT_REP_MS)
    if not 0 < rep <= MAX_REP_MS:  # (NaN fails both; 1e9 ms or µs of spin before each of >= 25 runs: a hung run)
        raise ValueError(f"--rep-ms must be in (0, {MAX_REP_MS:g}], got {rep}")
    if not 0 <= args.spin_us <= MAX_SPIN_US:
        raise ValueError(f"--spin-us must be in [0, {MAX_SPIN_US:g}], got {args.spin_us}")
    rounds = getattr(args, "rounds", 1)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds must be a positive int, got {rounds!r}")
    return TimingConfig(rep_ms=rep, spin_us=args.spin_us, rounds=rounds)


def run_benchmark(args, cases: Sequence, impls: dict[str, Impl], *, what: str, stem: str,
                  peers: Sequence[str], columns: Sequence[Column], ref_impl: str, title: str,
                  chart: tuple[str, str] = ("pct_copy", "% of copy bandwidth (read flush)"),
                  main: str = "mxkit", device: str = "cuda", list_line: Optional[Callable[[object], str]] = None,
                  pool_ref_key: Optional[Callable[[Row], object]] = None) -> int:
    """The run every op shares: option and ``--out`` checks, CUDA check, environment, the copy limit, all cases,
    table, files. With ``args.list``: after the option checks, ``list_line(case)`` printed for each case (no GPU).
    ``pool_ref_key``: rows whose reference peer times the same problem share one (:func:`pool_reference`; not with
    ``--rounds``). The copy limit is timed again after the cases (``copy_gbps_end``; a warning past 3% drift).
    Returns 0; 1 if a ``main`` row raised (status ``error``; a peer's error does not count), could not run
    (``n/a``) or its output failed the check; 2 when it cannot run here (one ``mxkit: error: …`` line, no traceback)."""
    try:
        cfg = timing_config(args)
        if getattr(args, "list", False) and list_line is not None:
            print("\n".join(list_line(c) for c in cases))
            return 0
        # (up front, not as n/a rows after the whole run: a shape no kernel takes, e.g. K not a multiple of 32;
        # --list above shows them with the reason)
        bad = [(c, c.invalid_reason()) for c in cases if getattr(c, "invalid_reason", lambda: None)()]
        if bad:
            why = list(dict.fromkeys(f"{c.label}: {w}" for c, w in bad))  # (one line a shape, in order)
            raise ValueError(f"{len(bad)} case(s) cannot run: " + "; ".join(why[:4]) + (" ..." if len(why) > 4 else "")
                             + " (--list shows every case)")
        if cfg.rounds > 1 and ref_impl not in peers:  # (the x column would be n/a: nothing to interleave with)
            raise ValueError(f"--rounds {cfg.rounds} interleaves {main} with the reference peer {ref_impl}, "
                             f"which --peers leaves out")
        if args.out is not None:
            check_out_folder(args.out, [f"{stem}.{ext}" for ext in ("csv", "json", "png")])
    except (ValueError, OSError) as e:
        return usage_error(str(e))
    if device == "cuda" and not torch.cuda.is_available():
        return no_cuda(what)
    backend = getattr(args, "backend", None)  # (None: a bench without --backend)
    env = environment()
    copy_read, copy_write, copy_bytes = copy_bandwidth(cfg)
    env.update(copy_gbps=round(copy_read, 1), copy_gbps_write=round(copy_write, 1), copy_bytes=copy_bytes,
               # how the rows were timed (the options alone left --quick's rep_ms as null)
               timing=dict(dataclasses.asdict(cfg), l2_flush_bytes=L2_FLUSH_BYTES, min_runs=MIN_RUNS,
                           spin="lengthened to 1.5x one call's host time where longer"))
    print(env_line(env))
    print(f"copy limit: {copy_read:.0f} GB/s after a read flush, {copy_write:.0f} after a write flush "
          f"({copy_bytes / 2**20:.0f} MiB); {len(cases)} cases; {main}{f'[{backend}]' if backend else ''} + "
          f"{', '.join(peers) or 'no peers'}; median of {cfg.rep_ms:g} ms after {cfg.warmup_ms:g} ms warm-up, "
          f"spin {cfg.spin_us:g} µs" + (f"; × from {cfg.rounds} interleaved rounds" if cfg.rounds > 1 else ""),
          flush=True)
    ctx = Context(device=device, time_fn=lambda fn: time_us(fn, cfg), sync=torch.cuda.synchronize if device == "cuda"
                  else (lambda: None), impls=(main, *peers), **({"backend": backend} if backend else {}),
                  check=not args.no_check, copy_gbps=copy_read, copy_gbps_write=copy_write, ref_impl=ref_impl,
                  rounds=cfg.rounds,
                  time_read=lambda fn: cuda_event_bench(fn, cfg.warmup_ms, cfg.rep_ms, cfg.spin_us, "read"))
    copy_row = Row(op="copy", fmt="-", shape=f"{copy_bytes // 2 // 2**20}MiB", impl="copy", nbytes=copy_bytes,
                   us=copy_bytes / copy_read / 1e3, us_write=copy_bytes / copy_write / 1e3, gbps=copy_read,
                   pct_copy=100.0, pct_copy_write=100.0)
    rows = run_cases(cases, ctx, impls, on_rows=lambda rows: save([copy_row, *rows], args, stem, env))
    if pool_ref_key is not None and cfg.rounds == 1:
        pool_reference(rows, ref_impl, pool_ref_key)
    copy_end = copy_bandwidth(cfg)[0]
    env["copy_gbps_end"] = round(copy_end, 1)
    if abs(copy_end / copy_read - 1) > 0.03:
        print(f"mxkit: warning: the copy limit moved over the run: {copy_read:.0f} GB/s at the start, "
              f"{copy_end:.0f} at the end ('% copy' / '% of floor' divide by the first)", file=sys.stderr)
    print()
    render_table(summary_lines(rows, main), columns, plain=args.plain,
                 title=f"{title} — {env['gpu']} — copy {copy_read:.0f} GB/s — {env['date_utc']}")
    notes = save([copy_row, *rows], args, stem, env)
    if args.out is not None:
        notes.append(write_chart(rows, args.out / f"{stem}.png", value=chart[0], ylabel=chart[1],
                                 is_main=lambda r: r.impl == main, title=f"{stem} — {env['gpu']} — {env['date_utc']}")[1])
    print("\n".join(notes))
    # (a main row that could not run, n/a: an import or a kernel that no longer covers the case, fails the run too;
    # a peer's n/a does not)
    failed = {"raised": [r for r in rows if r.impl == main and r.status == "error"],
              "could not run": [r for r in rows if r.impl == main and r.status == "n/a"],
              "failed the check": [r for r in rows if r.impl == main and r.check in BAD_CHECKS]}
    for how, bad in failed.items():
        if bad:
            print(f"mxkit: error: {len(bad)} {main} row(s) {how}: "
                  + ", ".join(f"{r.op}/{r.fmt}/{r.shape}" for r in bad), file=sys.stderr)
    return 1 if any(failed.values()) else 0
