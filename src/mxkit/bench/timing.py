"""The shared benchmark harness: timing, the copy-bandwidth limit, the environment, the case runner, and
result output (table, CSV, JSON, PNG).

An op module (``quantize.py``, one per op) supplies cases (:class:`BenchCase`: bytes, inputs, reference,
byte check) and implementations (:class:`Impl`); :func:`run_benchmark` does the rest, so every op times
the same way, degrades the same way (``n/a`` rows with the reason) and writes the same files.

Timing (quack ``bench_utils`` / torchao ``cast_bench.py`` practice): one untimed call first (compilation,
autotuning), then :func:`cuda_event_bench`, the protocol of :func:`triton.testing.do_bench` with
``return_mode="median"`` (a 256 MB write between runs so every run starts with a cold L2; CUDA events)
plus a GPU spin of ``spin_us`` queued before each timed run: the device is busy while the host enqueues
the run, so the time is the device's, not the host's launch path (Python dispatch, 10-60 us per call,
which host contention from a neighbouring ``torch.compile`` stretched to 2x on 8192^2 rows). Launch
overhead is measured on its own (``scripts/ab_dispatch.py``). ``spin_us=0`` gives plain ``do_bench``.
Times are medians in microseconds.

The flush (``flush``): ``"write"`` (default) zero-fills the buffer as ``do_bench`` does, which leaves the
L2 full of the buffer's dirty lines, so every timed run also writes those back to DRAM (on an H200 about
4-6 us per run, whatever the run's size: 8192^2 rowwise FP4 47.8 -> 42.1 us, the 1 GiB copy 257 -> 253 us;
``benchmarks/h200-2026-11-22-s9/flush_probe.txt``). ``"read"`` reads the buffer instead: the L2 is as cold
but clean, and the time is the kernel's own traffic only.

Bandwidth counts bytes read plus bytes written once each (the least traffic any implementation needs);
the limit is a large device-to-device ``Tensor.copy_`` measured in the same process, counted the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence

import torch

__all__ = [
    "BenchCase",
    "BenchUnavailable",
    "Context",
    "Impl",
    "bench_case",
    "run_cases",
    "run_benchmark",
    "summary_lines",
    "main_columns",
    "csv_arg",
    "Row",
    "TimingConfig",
    "add_common_arguments",
    "cuda_event_bench",
    "copy_bandwidth_gbps",
    "environment",
    "gbps",
    "median_us",
    "no_cuda_message",
    "progress",
    "render_table",
    "write_csv",
    "write_json",
    "write_chart",
    "write_outputs",
    "format_shape",
    "parse_shape",
]

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any Hopper L2 (50 MB), as Triton's do_bench uses
FLUSH_MODES = ("write", "read")


class BenchUnavailable(Exception):
    """An implementation cannot run here (kernel missing, peer not installed, dtype unsupported).

    The harness turns it into an ``n/a`` row carrying ``str(exc)`` as the reason; it never aborts a run.
    """


@dataclass(frozen=True)
class TimingConfig:
    """How long to time each implementation (milliseconds, as :func:`triton.testing.do_bench` takes)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    use_triton: bool = True  # with spin_us == 0: do_bench when Triton is importable, else the CUDA-event loop
    spin_us: float = 100.0  # GPU spin before each timed run (hides the host's launch path); 0 = none
    # L2 flush before each run: "write" = zero-fill a 256 MB buffer (do_bench's; leaves dirty lines the run
    # writes back), "read" = read it (cold and clean); "read" always times with cuda_event_bench
    flush: str = "write"


@dataclass
class Row:
    """One timed implementation of one case. ``us`` is None when the row is n/a or failed.

    op / fmt / shape / dtype identify the case (``shape`` as ``"8192x8192"``); ``impl`` names what ran
    (``"mxkit"``, ``"reference-compiled"``, ``"torchao-compiled"``, ``"copy"``). ``nbytes`` is the bytes
    read + written; ``gbps`` = nbytes / us / 1e3; ``pct_copy`` = 100 * gbps / copy GB/s;
    ``vs_ref`` = compiled-reference µs / this row's µs (> 1: faster than ``torch.compile`` of the
    reference). ``status`` is ``"ok"``, ``"n/a"`` (unavailable, reason in ``note``) or ``"error"``;
    ``check`` is ``"match"`` / ``"MISMATCH"`` (bytes against the reference) or ``""`` when not checked.
    """

    op: str
    fmt: str
    shape: str
    impl: str
    dtype: str = "bfloat16"
    us: Optional[float] = None
    nbytes: int = 0
    gbps: Optional[float] = None
    pct_copy: Optional[float] = None
    vs_ref: Optional[float] = None
    status: str = "ok"
    check: str = ""
    compile_s: Optional[float] = None
    note: str = ""

    @classmethod
    def fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


DEFAULT_REP_MS = 100.0
QUICK_REP_MS = 40.0


def add_common_arguments(p) -> None:
    """Options every op benchmark shares (backend, budgets, timing, output), read by :func:`run_benchmark`."""
    p.add_argument("--backend", choices=("triton", "reference", "auto"), default="triton",
                   help="backend of the mxkit rows (default triton)")
    p.add_argument("--compile-budget-s", type=float, default=150.0,
                   help="stop compiling new peer variants after this many seconds of compiling (default 150)")
    p.add_argument("--compile-static", action="store_true",
                   help="torch.compile peers per shape (dynamic=False) instead of once shape-generic (dynamic=True)")
    p.add_argument("--peer-shapes", default=None,
                   help="comma list of shapes (e.g. 8192x8192) at which peers run; default: every shape")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="after this many seconds of benchmarking, mark the remaining cases n/a (default: none)")
    p.add_argument("--no-check", action="store_true", help="skip the byte comparison with the reference")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="warm-up per row, ms (default 25)")
    p.add_argument("--rep-ms", type=float, default=None,
                   help=f"timed repetitions per row, ms (default {DEFAULT_REP_MS:g}; {QUICK_REP_MS:g} with --quick)")
    p.add_argument("--spin-us", type=float, default=100.0,
                   help="GPU spin queued before each timed run so the host's launch path is not timed "
                        "(default 100; 0 = plain triton do_bench)")
    p.add_argument("--flush", choices=FLUSH_MODES, default="write",
                   help="L2 flush before each timed run: 'write' zero-fills a 256 MB buffer as triton's do_bench "
                        "(default; the run then also writes the buffer's dirty lines back), 'read' reads it "
                        "(a cold, clean L2)")
    p.add_argument("--copy-mib", type=int, default=1024,
                   help="bytes read + written by the copy that sets the limit, MiB (default 1024)")
    p.add_argument("--out", type=Path, default=None, help="write CSV, JSON and a PNG chart into this folder")
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")


def timing_config(args) -> TimingConfig:
    """From ``--warmup-ms`` / ``--rep-ms`` (None: the default, shorter with ``--quick``); ValueError if not positive."""
    rep = args.rep_ms
    if rep is None:
        rep = QUICK_REP_MS if getattr(args, "quick", False) else DEFAULT_REP_MS
    spin = getattr(args, "spin_us", 100.0)
    if args.warmup_ms < 0 or rep <= 0 or spin < 0:
        raise ValueError(f"--warmup-ms={args.warmup_ms} and --spin-us={spin} must be >= 0 and --rep-ms={rep} > 0")
    flush = getattr(args, "flush", "write")
    if flush not in FLUSH_MODES:
        raise ValueError(f"--flush={flush!r} must be one of {FLUSH_MODES}")
    return TimingConfig(warmup_ms=args.warmup_ms, rep_ms=rep, spin_us=spin, flush=flush)


# -------------------------------------------------------------------------------------------------------
# small pure helpers


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8192x8192"`` / ``"8x2048x4096"`` → tuple of positive ints. Raises ValueError naming the text."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"shape {text!r} is not of the form 8192x8192 (positive ints joined by 'x')") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"shape {text!r} must have positive dimensions")
    return dims


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def gbps(nbytes: int, us: Optional[float]) -> Optional[float]:
    """Bytes over microseconds in GB/s (1e9 bytes per second); None if ``us`` is None or not positive."""
    if us is None or not us > 0:
        return None
    return nbytes / us / 1e3


def pct_of(value: Optional[float], limit: Optional[float]) -> Optional[float]:
    if value is None or not limit:
        return None
    return 100.0 * value / limit


def median_us(times_ms: Iterable[float]) -> float:
    """Median of per-run times given in ms, returned in µs."""
    t = list(times_ms)
    if not t:
        raise ValueError("no timings to take the median of")
    return 1e3 * statistics.median(t)


def progress(msg: str) -> None:
    """A timestamped progress line on stderr (the table goes to stdout)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%S")
    print(f"[{stamp}] {msg}", file=sys.stderr, flush=True)


def no_cuda_message(what: str) -> str:
    return (
        f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False "
        f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). "
        "Run it on a GPU machine (scripts/gpu_check.sh runs it there); '--list' shows the cases without a GPU."
    )


# -------------------------------------------------------------------------------------------------------
# timing on the device


def _spin_cycles(us: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` for about ``us`` microseconds (at the SM clock's maximum)."""
    try:
        mhz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate / 1e3
    except Exception:
        mhz = 2000.0
    return int(us * (mhz or 2000.0))


def cuda_event_bench(fn: Callable[[], object], warmup_ms: float = 25.0, rep_ms: float = 100.0,
                     spin_us: float = 0.0, flush: str = "write") -> float:
    """Median µs of ``fn()`` with CUDA events, the L2 flushed through a 256 MB buffer before each run.

    The protocol of ``triton.testing.do_bench(return_mode="median")``: one call, a 5-run estimate,
    ``warmup_ms`` of untimed runs, then ``rep_ms`` of timed runs. ``spin_us`` > 0 queues a GPU spin
    (``torch.cuda._sleep``) between the flush and each start event, so the host has enqueued the run before
    the device reaches it: the events then bracket device time only. ``flush``: ``"write"`` zero-fills the
    buffer (do_bench's; the L2 is left holding its dirty lines), ``"read"`` reads it (a clean L2; the
    module docstring has the difference). Raises ValueError for another ``flush``.
    """
    if flush not in FLUSH_MODES:
        raise ValueError(f"flush={flush!r} must be one of {FLUSH_MODES}")
    buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    if flush == "read":
        buf.zero_()
        total = torch.empty((), dtype=torch.int64, device="cuda")

        def do_flush():
            torch.sum(buf, dim=0, out=total)
    else:
        do_flush = buf.zero_
    cycles = _spin_cycles(spin_us) if spin_us > 0 else 0
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        do_flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)  # includes the flush: an upper bound, as do_bench
    n_warmup = max(1, int(warmup_ms / estimate_ms))
    n_rep = max(1, int(rep_ms / (estimate_ms + spin_us / 1e3)))
    for _ in range(n_warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for s, e in zip(starts, ends):
        do_flush()
        if cycles:
            torch.cuda._sleep(cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return median_us(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_us(fn: Callable[[], object], cfg: TimingConfig) -> float:
    """Median µs of ``fn()`` with L2 flushed between runs: :func:`cuda_event_bench` with a GPU spin before
    each run (``cfg.spin_us`` > 0) or a read flush (``cfg.flush``), else do_bench if Triton imports, else the
    plain CUDA-event loop."""
    if cfg.spin_us > 0 or cfg.flush != "write":
        return cuda_event_bench(fn, cfg.warmup_ms, cfg.rep_ms, cfg.spin_us, cfg.flush)
    if cfg.use_triton:
        try:
            from triton.testing import do_bench
        except Exception:
            do_bench = None
        if do_bench is not None:
            return 1e3 * float(do_bench(fn, warmup=cfg.warmup_ms, rep=cfg.rep_ms, return_mode="median"))
    return cuda_event_bench(fn, cfg.warmup_ms, cfg.rep_ms)


def first_call_s(fn: Callable[[], object]) -> tuple[object, float]:
    """Run ``fn`` once (compilation, autotuning happen here) and return (result, seconds incl. sync)."""
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def copy_bandwidth_gbps(cfg: TimingConfig, total_mib: int = 1024) -> tuple[float, float, int]:
    """The limit: a device-to-device ``dst.copy_(src)`` of ``total_mib / 2`` MiB each way.

    Returns (GB/s counting bytes read + written, µs, bytes). Raises ValueError for ``total_mib < 2``.
    """
    if total_mib < 2:
        raise ValueError(f"copy size total_mib={total_mib} must be at least 2")
    n = (total_mib * 1024 * 1024 // 2) // 2  # bf16 elements of the source
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), cfg)
    nbytes = 2 * src.numel() * src.element_size()
    return float(gbps(nbytes, us)), us, nbytes


# -------------------------------------------------------------------------------------------------------
# environment


def _triton_version() -> Optional[str]:
    try:
        import triton

        return triton.__version__
    except Exception:
        return None


def environment(extra: Optional[dict] = None) -> dict:
    """GPU, library versions, date (UTC), host: printed above the table and stored in the JSON."""
    import mxkit

    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _triton_version(),
        "mxkit": getattr(mxkit, "__version__", None),
        "gpu": None,
        "capability": None,
        "sm_count": None,
        "gpu_mem_gib": None,
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            gpu_mem_gib=round(p.total_memory / 2**30, 1),
        )
    if extra:
        env.update(extra)
    return env


def environment_line(env: dict) -> str:
    keys = ("gpu", "capability", "torch", "cuda", "triton", "mxkit", "date_utc")
    return " | ".join(f"{k} {env.get(k)}" for k in keys)


# -------------------------------------------------------------------------------------------------------
# output: table, CSV, JSON, chart


def _fmt_num(v: Optional[float], spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return format(v, spec)


@dataclass(frozen=True)
class Column:
    title: str
    get: Callable[[dict], str]
    right: bool = True


def render_table(lines: Sequence[dict], columns: Sequence[Column], *, title: str = "", plain: bool = False,
                 file=None) -> str:
    """Print ``lines`` (dicts) with ``columns``; rich when installed and not ``plain``. Returns the plain text.

    The plain text is returned in every case (the caller may log it); rich only changes what is printed.
    """
    from .._table import print_table

    cells = [[c.get(d) for c in columns] for d in lines]
    return print_table([c.title for c in columns], cells, title=title or None, plain=plain, file=file,
                       right=[c.title for c in columns if c.right])


def write_csv(rows: Sequence[Row], path: Path) -> Path:
    """All rows, one per (case, implementation), columns :meth:`Row.fields`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=Row.fields())
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.as_dict().items()})
    return path


def write_json(rows: Sequence[Row], env: dict, path: Path, *, config: Optional[dict] = None) -> Path:
    """``{"env": {...}, "config": {...}, "rows": [...]}``; missing numbers are ``null``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"env": env, "config": config or {}, "rows": [r.as_dict() for r in rows]}
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def read_json_rows(path: Path) -> tuple[dict, list[Row]]:
    doc = json.loads(Path(path).read_text())
    return doc["env"], [Row(**r) for r in doc["rows"]]


def write_chart(rows: Sequence[Row], path: Path, *, impl: str = "mxkit", peer: str = "reference-compiled",
                title: str = "") -> tuple[Optional[Path], str]:
    """PNG: % of copy bandwidth of ``impl`` per op (one panel each) and shape, bars grouped by format;
    ``peer`` drawn as black ticks on the same axes. Returns (path or None, note). Needs matplotlib (Agg);
    without it returns (None, reason) and writes nothing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # optional dependency
        return None, f"chart skipped: matplotlib not importable ({type(e).__name__}: {e})"
    ops = list(dict.fromkeys(r.op for r in rows if r.impl == impl))
    if not ops:
        return None, f"chart skipped: no rows of impl {impl!r}"
    fmts = list(dict.fromkeys(r.fmt for r in rows if r.impl == impl))
    ncols = min(2, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 3.6 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(fmts))
    by_key = {(r.op, r.fmt, r.shape, r.impl): r for r in rows}
    for k, op in enumerate(ops):
        ax = axes[k // ncols][k % ncols]
        shapes = list(dict.fromkeys(r.shape for r in rows if r.op == op and r.impl == impl))
        for j, fmt in enumerate(fmts):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(shapes))]
            mine = [by_key.get((op, fmt, s, impl)) for s in shapes]
            theirs = [by_key.get((op, fmt, s, peer)) for s in shapes]
            hs = [r.pct_copy if r is not None and r.pct_copy is not None else 0.0 for r in mine]
            ax.bar(xs, hs, width=width * 0.95, color=colors[j % len(colors)], label=fmt)
            for x, r in zip(xs, mine):
                if r is None or r.pct_copy is None:
                    ax.text(x, 1, "n/a", rotation=90, ha="center", va="bottom", fontsize=7)
            px = [x for x, r in zip(xs, theirs) if r is not None and r.pct_copy is not None]
            py = [r.pct_copy for r in theirs if r is not None and r.pct_copy is not None]
            if px:
                ax.scatter(px, py, marker="_", s=120, color="black", zorder=3,
                           label=peer if j == 0 else None)
        ax.axhline(100, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, fontsize=8)
        ax.set_ylabel("% of copy bandwidth")
        ax.set_title(op)
        top = max([r.pct_copy for r in rows if r.op == op and r.pct_copy is not None and r.impl in (impl, peer)],
                  default=0.0)
        ax.set_ylim(0, max(110.0, 1.1 * top))
    for k in range(len(ops), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    axes[0][0].legend(fontsize=8, loc="upper right")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, f"chart: {path}"


def write_outputs(rows: Sequence[Row], env: dict, out_dir: Path, stem: str, *,
                  config: Optional[dict] = None) -> list[str]:
    """CSV + JSON + PNG named ``<stem>.*`` in ``out_dir``; returns human-readable notes (paths, skips)."""
    out_dir = Path(out_dir)
    notes = [f"csv: {write_csv(rows, out_dir / f'{stem}.csv')}",
             f"json: {write_json(rows, env, out_dir / f'{stem}.json', config=config)}"]
    title = f"{stem} — {env.get('gpu')} — {env.get('date_utc')}"
    _, note = write_chart(rows, out_dir / f"{stem}.png", title=title)
    notes.append(note)
    return notes


# -------------------------------------------------------------------------------------------------------
# the case runner every op shares


class BenchCase(Protocol):
    """What an op module's case offers the runner (see ``mxkit.bench.quantize.Case``)."""

    op: str
    dtype: torch.dtype

    @property
    def fmt_name(self) -> str: ...
    @property
    def label(self) -> str: ...  # the shape as "8192x8192"
    @property
    def note(self) -> str: ...  # shown on every row of the case ("" for none)
    def nbytes(self) -> int: ...  # bytes read + written, each once
    def invalid_reason(self) -> Optional[str]: ...
    def make_inputs(self, ctx: "Context") -> Any: ...
    def expected(self, inputs: Any) -> Any: ...  # the eager reference's result
    def check(self, out: Any, expected: Any) -> bool: ...  # byte equality


@dataclass(frozen=True)
class Impl:
    """One implementation: ``make(case, inputs, ctx)`` returns the zero-argument callable that is timed.

    ``make`` (or the first call) raises :class:`BenchUnavailable` / ImportError / NotImplementedError when it
    cannot run here → an ``n/a`` row. ``compiled``: the first call compiles (its time is ``compile_s``;
    a failure there reads "torch.compile failed"). ``checked``: its output is compared with the reference.
    """

    name: str
    make: Callable[[Any, Any, "Context"], Callable[[], object]]
    compiled: bool = False
    checked: bool = False


@dataclass
class Context:
    """What one run shares across cases: device, timer, settings, budgets, the compiled-function cache.

    ``time_fn(fn) -> µs`` and ``sync()`` are injected (``time_us`` and ``torch.cuda.synchronize`` on a GPU),
    so the whole pipeline also runs on CPU in tests. ``backend`` is what the ``mxkit`` rows ask for.
    """

    device: str
    time_fn: Callable[[Callable[[], object]], float]
    sync: Callable[[], None]
    impls: tuple[str, ...] = ("mxkit",)
    backend: str = "triton"
    compile: bool = True
    compile_dynamic: bool = True
    compile_budget_s: float = 150.0
    peer_shapes: Optional[frozenset] = None  # shape labels at which peers run (None: all)
    check: bool = True
    copy_gbps: Optional[float] = None
    ref_impl: str = "reference-compiled"  # the × column: this impl's µs over each row's
    compile_spent_s: float = 0.0
    compiled: dict = dataclasses.field(default_factory=dict)
    last_shape: Optional[str] = None  # the first timed row after a shape change is run twice (clock ramp)

    def compiled_fn(self, key: tuple, make: Callable[[], Callable]) -> Callable:
        """``torch.compile(make())`` once per ``key`` (op, format, rank, …); plain ``make()`` if compile is off.

        Shape-generic (``dynamic=True``) unless ``compile_dynamic`` is False. Raises BenchUnavailable for a new
        key once ``compile_budget_s`` seconds of first calls were spent (cached keys keep running).
        """
        if not self.compile:
            return make()
        if key not in self.compiled:
            if self.compile_spent_s >= self.compile_budget_s:
                raise BenchUnavailable(
                    f"skipped: torch.compile budget of {self.compile_budget_s:.0f} s spent "
                    f"({self.compile_spent_s:.0f} s); raise --compile-budget-s")
            # dynamic=False, not None: None turns shape-generic on the second shape (automatic dynamic)
            self.compiled[key] = torch.compile(make(), dynamic=self.compile_dynamic)
        return self.compiled[key]


_UNAVAILABLE = (BenchUnavailable, ImportError, NotImplementedError)


def _reason(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return msg[:160] if isinstance(e, BenchUnavailable) else f"{type(e).__name__}: {msg}"[:160]


def blank_rows(case: BenchCase, impls: Sequence[str], status: str = "ok", note: str = "") -> list[Row]:
    try:
        nbytes = case.nbytes()
    except ValueError:
        nbytes = 0
    return [Row(op=case.op, fmt=case.fmt_name, shape=case.label, impl=name,
                dtype=str(case.dtype).replace("torch.", ""), nbytes=nbytes, status=status, note=note)
            for name in impls]


def _first_call(fn: Callable[[], object], ctx: Context) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn()
    ctx.sync()
    return out, time.perf_counter() - t0


def bench_case(case: BenchCase, ctx: Context, impls: dict[str, Impl]) -> list[Row]:
    """One row per name in ``ctx.impls``: first call (compile), byte check, timing. Never raises for an impl:
    unavailable → ``n/a`` with the reason, any other exception → ``error`` (compiled impls: ``n/a``)."""
    bad = case.invalid_reason()
    if bad:
        return blank_rows(case, ctx.impls, "n/a", bad)
    rows = blank_rows(case, ctx.impls)
    try:
        inputs = case.make_inputs(ctx)
    except Exception as e:  # e.g. out of memory for the input itself
        for r in rows:
            r.status, r.note = "error", f"inputs: {_reason(e)}"
        return rows
    expected = None  # the eager reference's result, made once when the first checked impl needs it
    for row in rows:
        impl = impls[row.impl]
        if row.impl != ctx.impls[0] and ctx.peer_shapes is not None and case.label not in ctx.peer_shapes:
            row.status, row.note = "n/a", "peer not run at this shape (--peer-shapes)"
            continue
        try:
            fn = impl.make(case, inputs, ctx)
            spent0 = ctx.compile_spent_s
            out, first_s = _first_call(fn, ctx)
            if impl.compiled:
                row.compile_s = round(first_s, 2)
                ctx.compile_spent_s = spent0 + first_s
            if impl.checked and ctx.check:
                if expected is None:
                    expected = case.expected(inputs)
                row.check = "match" if case.check(out, expected) else "MISMATCH"
            del out
            if ctx.last_shape != case.label:
                # the first timing after a new shape read 1.8-3.4x slow on an H200 (clocks ramping after the
                # host-side byte check): time once and throw it away
                ctx.time_fn(fn)
                ctx.last_shape = case.label
            row.us = ctx.time_fn(fn)
        except _UNAVAILABLE as e:
            row.status, row.note = "n/a", _reason(e)
        except Exception as e:
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            what = "torch.compile failed" if impl.compiled and row.compile_s is None else "error"
            row.status, row.note = ("n/a" if impl.compiled else "error"), f"{what}: {_reason(e)}"
        row.gbps = gbps(row.nbytes, row.us)
        row.pct_copy = pct_of(row.gbps, ctx.copy_gbps)
        if case.note and not row.note:
            row.note = case.note
    ref = next((r for r in rows if r.impl == ctx.ref_impl and r.us), None)
    for r in rows:
        if ref is not None and r.us:
            r.vs_ref = ref.us / r.us
    return rows


@contextlib.contextmanager
def dynamo_settings():
    """Many (op, format, rank) variants compile in one process: lift the recompile limit, and make hitting
    it an error (an n/a row) instead of a silent fall back to eager that would pass for compiled timings."""
    try:
        import torch._dynamo.config as cfg
    except Exception:
        yield
        return
    patch = {k: v for k, v in (("recompile_limit", 64), ("accumulated_recompile_limit", 1024),
                               ("fail_on_recompile_limit_hit", True)) if hasattr(cfg, k)}
    with cfg.patch(**patch):
        yield


def run_cases(cases: Sequence[BenchCase], ctx: Context, impls: dict[str, Impl], *,
              log: Callable[[str], None] = progress, time_budget_s: Optional[float] = None) -> list[Row]:
    """Bench every case in order, one progress line each. Past ``time_budget_s`` seconds the remaining cases
    become n/a rows, so a bounded run still prints its table and writes its files."""
    rows: list[Row] = []
    t0 = time.perf_counter()
    with dynamo_settings():
        for i, case in enumerate(cases, 1):
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                got = blank_rows(case, ctx.impls, "n/a", f"skipped: --time-budget-s {time_budget_s:g} spent")
            else:
                got = bench_case(case, ctx, impls)
            rows.extend(got)
            log(f"{i}/{len(cases)} {case.op} {case.fmt_name} {case.label}: " + "; ".join(map(_brief, got)))
    return rows


def _brief(r: Row) -> str:
    if r.us is None:
        return f"{r.impl} {r.status} ({r.note})"
    s = f"{r.impl} {r.us:.1f} us {r.gbps:.0f} GB/s"
    if r.compile_s is not None and r.compile_s > 1:
        s += f" (first call {r.compile_s:.0f} s)"
    return s + (f" {r.check}" if r.check else "")


def summary_lines(rows: Sequence[Row], main: str = "mxkit") -> list[dict]:
    """One dict per case (op, fmt, shape): ``main`` (the ``main`` impl's row), ``peers`` (impl → row) and
    ``note`` (reasons of rows that did not run, peers whose output differs). Rows of op "copy" are left out."""
    by_case: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if r.op != "copy":
            by_case.setdefault((r.op, r.fmt, r.shape), {})[r.impl] = r
    lines = []
    for (op, fmt, shape), d in by_case.items():
        m = d.get(main) or next(iter(d.values()))
        notes = [f"{k}: {v.note}" for k, v in d.items() if v.status != "ok" and v.note]
        notes += [f"{k} output differs from the eager reference" for k, v in d.items()
                  if k != main and v.check == "MISMATCH"]
        if m.status == "ok" and m.note:
            notes.insert(0, m.note)
        lines.append({"op": op, "fmt": fmt, "shape": shape, "main": m, "peers": d, "note": "; ".join(notes)})
    return lines


def fmt_us(r: Optional[Row]) -> str:
    return _fmt_num(r.us if r is not None else None, ".1f")


def main_columns(peers: Sequence[str], labels: Optional[dict] = None, ref_label: str = "ref.compiled") -> list[Column]:
    """The table's columns: case, the main impl's µs / GB/s / % copy / × vs the reference / check, each
    peer's µs, and the note."""
    labels = labels or {}
    cols = [
        Column("op", lambda d: d["op"], right=False),
        Column("format", lambda d: d["fmt"], right=False),
        Column("shape", lambda d: d["shape"], right=False),
        Column("µs", lambda d: fmt_us(d["main"])),
        Column("GB/s", lambda d: _fmt_num(d["main"].gbps, ".0f")),
        Column("% copy", lambda d: _fmt_num(d["main"].pct_copy, ".1f")),
        Column(f"× vs {ref_label}", lambda d: _fmt_num(d["main"].vs_ref, ".2f")),
        Column("check", lambda d: d["main"].check or "-"),
    ]
    for p in peers:
        cols.append(Column(f"{labels.get(p, p)} µs", lambda d, p=p: fmt_us(d["peers"].get(p))))
    cols.append(Column("note", lambda d: d["note"][:90], right=False))
    return cols


def csv_arg(convert: Callable[[str], object]) -> Callable[[str], tuple]:
    """An argparse ``type`` for a comma-separated list, each item through ``convert`` (ValueError → usage error)."""
    def parse(text: str) -> tuple:
        items = [t for t in (s.strip() for s in text.split(",")) if t]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return tuple(convert(t) for t in items)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_benchmark(args, cases: Sequence[BenchCase], impls: dict[str, Impl], *, what: str, stem: str,
                  peers: Sequence[str], columns: Sequence[Column], ref_impl: str, title: str,
                  main: str = "mxkit", device: str = "cuda") -> int:
    """The run every op shares: CUDA check, environment, the copy limit, all cases, table, files.

    ``args`` carries :func:`add_common_arguments` plus ``backend``, ``compile_static``, ``compile_budget_s``,
    ``no_check`` and ``time_budget_s``. Returns 0, 1 if a ``main`` output differs from the reference, or 2
    when it cannot run here (no CUDA, bad timing options) — with a message, not a traceback.
    """
    if device == "cuda" and not torch.cuda.is_available():
        print(f"error: {no_cuda_message(what)}", file=sys.stderr)
        return 2
    try:
        cfg = timing_config(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = environment()
    print(environment_line(env), flush=True)
    copy_gbps, copy_us, copy_bytes = copy_bandwidth_gbps(cfg, args.copy_mib)
    env.update(copy_gbps=round(copy_gbps, 1), copy_bytes=copy_bytes, l2_flush=cfg.flush)
    print(f"copy limit: {copy_gbps:.0f} GB/s ({copy_bytes / 2**20:.0f} MiB read + written in {copy_us:.0f} µs); "
          f"{len(cases)} cases; {main}[{args.backend}] + {', '.join(peers) or 'no peers'}; "
          f"timing: median of {cfg.rep_ms:g} ms after {cfg.warmup_ms:g} ms warm-up, L2 flushed "
          f"({'written' if cfg.flush == 'write' else 'read'})", flush=True)
    ctx = Context(
        device=device, time_fn=lambda fn: time_us(fn, cfg), sync=lambda: _sync(device),
        impls=(main,) + tuple(peers), backend=args.backend, compile_dynamic=not args.compile_static,
        compile_budget_s=args.compile_budget_s, check=not args.no_check,
        peer_shapes=None if not getattr(args, "peer_shapes", None) else frozenset(
            format_shape(parse_shape(s)) for s in args.peer_shapes.split(",")), copy_gbps=copy_gbps, ref_impl=ref_impl,
    )
    rows = [Row(op="copy", fmt="-", shape=f"{copy_bytes // 2 // 2**20}MiB", impl="copy", us=copy_us,
                nbytes=copy_bytes, gbps=copy_gbps, pct_copy=100.0)]
    rows += run_cases(cases, ctx, impls, time_budget_s=args.time_budget_s)
    print()
    render_table(summary_lines(rows, main), columns, plain=args.plain,
                 title=f"{title} — {env['gpu']} — copy {copy_gbps:.0f} GB/s — {env['date_utc']}")
    if args.out is not None:
        config = {k: (v if isinstance(v, (int, float, bool, str, type(None))) else str(v))
                  for k, v in vars(args).items() if k != "func"}
        for note in write_outputs(rows, env, args.out, stem, config=config):
            print(note)
    peer_bad = [r for r in rows if r.check == "MISMATCH" and r.impl != main]
    if peer_bad:
        print(f"warning: {len(peer_bad)} peer output(s) differ from the eager reference: "
              + ", ".join(f"{r.impl} {r.op}/{r.fmt}/{r.shape}" for r in peer_bad), file=sys.stderr)
    bad = [r for r in rows if r.check == "MISMATCH" and r.impl == main]
    if bad:
        print(f"error: {len(bad)} {main} output(s) differ from the reference: "
              + ", ".join(f"{r.op}/{r.fmt}/{r.shape}" for r in bad), file=sys.stderr)
        return 1
    return 0
