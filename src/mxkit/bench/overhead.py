"""``mxkit bench overhead``: host µs per eager call of mxkit's public ops, side by side with a plain torch op.

Method (issue #23, "Host overhead"). Every call gets tiny-to-small operands, so that its GPU time is below its
host time. The calls, the torch op among them, are timed in ``--rounds`` interleaved rounds (each round times
every call in turn), ``ceil(--calls / --rounds)`` calls each per round (so at least ``--calls`` in all, and at
least one per round: ``--calls 5 --rounds 10`` times 10), one call at a time with ``time.perf_counter_ns`` around the
call alone, after ``--warmup`` untimed calls. Nothing inside a timed call synchronizes. Every ``--sync-every``
calls, a ``torch.cuda.synchronize`` runs outside the timed windows, so the launch queue never fills; a full
queue would block the launching call and count as host time.

Reported per call:
* the median and p90 host µs over all its timed calls;
* "× torch op": the median over the rounds of the call's median over the median of ``x * 2`` (one elementwise
  kernel on a (256, 1024) bf16 x) in the same round. The host's speed drifts by up to 50% within minutes on the
  device machines; a ratio within a round follows it, one between runs does not;
* GPU µs per call: CUDA events around ``GPU_CALLS`` back-to-back calls. The calls are queued behind a GPU spin
  long enough for the host to enqueue them all, and the event time is divided by ``GPU_CALLS``. A GPU µs well
  under the host µs says the call is host-bound. A call that syncs the host waits for the spin, so its GPU
  column reads about as high as its host column.

The target (issue #23): every call ≤ 1.5× the torch op. Needs CUDA; ``--list`` shows the calls without one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import output, timing
from .output import Column, fmt_num

NAME = "overhead"
HELP = "host µs per eager call of quantize / dequantize / cast_transpose / matmul / MXLinear, × a plain torch op"

TARGET = 1.5  # × the torch op's host time (issue #23)
GPU_CALLS = 20
BASELINE = "torch x * 2"
X_SHAPE = (256, 1024)  # quantize, dequantize, cast_transpose and the torch op
N, K = 1024, 1024  # the matmul / MXLinear weight


@dataclass(frozen=True)
class Call:
    """One call to time: ``make(device) -> (zero-argument callable, note)``, its operands built once."""

    name: str
    shape: str
    make: Callable[[str], tuple[Callable[[], object], str]]


@dataclass
class OverheadRow:
    """One call. Host µs: median and p90 per call; ``gpu_us``: device µs per call; ``x_torch``: host median over
    the torch op's; ``ok``: ``x_torch`` <= :data:`TARGET`. ``status``: ok | error (``note`` says why)."""

    op: str
    shape: str
    host_us: Optional[float] = None
    host_p90_us: Optional[float] = None
    gpu_us: Optional[float] = None
    x_torch: Optional[float] = None
    ok: Optional[bool] = None
    calls: int = 0
    status: str = "ok"
    note: str = ""


def _x(device: str, shape=X_SHAPE) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=torch.bfloat16)


def _torch_op(device: str):
    x = _x(device)
    return (lambda: x * 2), ""


def _quantize(fmt: str):
    def make(device: str):
        import mxkit

        x = _x(device)
        return (lambda: mxkit.quantize(x, fmt)), ""

    return make


def _dequantize(device: str):
    import mxkit

    q = mxkit.quantize(_x(device), "mxfp4_e2m1")
    return (lambda: mxkit.dequantize(q, torch.bfloat16)), ""


def _cast_transpose(device: str):
    import mxkit

    x = _x(device)
    return (lambda: mxkit.cast_transpose(x, "mxfp8_e4m3")), ""


def _matmul(m: int, a_fmt: Optional[str], w_fmt: str = "mxfp4_e2m1", n: int = N, k: int = K):
    def make(device: str):
        import mxkit

        b = mxkit.pack_weight(mxkit.quantize(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 2.0**-5,
                                             w_fmt))
        a = _x(device, (m, k))
        a = a if a_fmt is None else mxkit.quantize(a, a_fmt)
        return (lambda: mxkit.matmul(a, b)), f"path {mxkit.gemm_plan(a, b).path}"

    return make


def _mxlinear(w_fmt: str, act: Optional[str], bias: bool = False, m: int = 1):
    def make(device: str):
        import mxkit
        from ..nn import MXLinear

        mod = MXLinear.from_linear(torch.nn.Linear(K, N, bias=bias, device=device, dtype=torch.bfloat16), w_fmt,
                                   act_format=act).requires_grad_(False)  # (frozen, as served: no autograd path)
        x = _x(device, (m, K))
        w = mod.weight_mx if mod._packed is None else mod._packed
        a = x if act is None else mxkit.quantize(x, act)
        path = mxkit.gemm_plan(a, w).path
        how = "" if act is None else " (x quantized in the GEMM)" if path == "a8w8-mma" else " (x quantized first)"
        return (lambda: mod(x)), f"path {path}{how}"

    return make


CALLS = (  # the torch op first, then mxkit's public API (backend "auto")
    Call(BASELINE, "x".join(map(str, X_SHAPE)), _torch_op),
    Call("quantize mxfp4", "x".join(map(str, X_SHAPE)), _quantize("mxfp4_e2m1")),
    Call("quantize mxfp8", "x".join(map(str, X_SHAPE)), _quantize("mxfp8_e4m3")),
    Call("dequantize mxfp4", "x".join(map(str, X_SHAPE)), _dequantize),
    Call("cast_transpose mxfp8", "x".join(map(str, X_SHAPE)), _cast_transpose),
    Call("matmul bf16 x mxfp4 (M=1)", f"1x{N}x{K}", _matmul(1, None)),
    Call("matmul bf16 x mxfp4 (M=256)", f"256x{N}x{K}", _matmul(256, None)),
    Call("matmul bf16 x mxfp4 (M=64, 8192x8192)", "64x8192x8192", _matmul(64, None, n=8192, k=8192)),
    Call("matmul mxfp4 x mxfp4 (M=256)", f"256x{N}x{K}", _matmul(256, "mxfp4_e2m1")),
    Call("matmul mxfp8 x mxfp4 (M=256)", f"256x{N}x{K}", _matmul(256, "mxfp8_e4m3")),
    Call("matmul mxfp8 x mxfp8 (M=1)", f"1x{N}x{K}", _matmul(1, "mxfp8_e4m3", "mxfp8_e4m3")),
    Call("MXLinear.forward mxfp4 (M=1)", f"1x{N}x{K}", _mxlinear("mxfp4_e2m1", None)),
    Call("MXLinear.forward mxfp4 + bf16 bias (M=1)", f"1x{N}x{K}", _mxlinear("mxfp4_e2m1", None, bias=True)),
    Call("MXLinear.forward mxfp8 x mxfp8 (M=1)", f"1x{N}x{K}", _mxlinear("mxfp8_e4m3", "mxfp8_e4m3")),
    Call("MXLinear.forward mxfp4 x mxfp4 (M=256)", f"256x{N}x{K}", _mxlinear("mxfp4_e2m1", "mxfp4_e2m1", m=256)),
)


def _matches(part: str) -> list[Call]:
    """The calls named ``part`` (case-insensitive), else the calls whose name holds it."""
    p = part.lower()
    return [c for c in CALLS if c.name.lower() == p] or [c for c in CALLS if p in c.name.lower()]


def select(only: Optional[Sequence[str]]) -> list[Call]:
    """The torch op and, for each part of ``only``, the call of that exact name (case-insensitive), or where no
    call has it the calls whose name holds it (None: all). Raises ValueError naming a part that no call holds."""
    if only is None:
        return list(CALLS)
    chosen = set()
    for part in only:
        hits = _matches(part)
        if not hits:
            raise ValueError(f"no call named like {part!r}; calls: {', '.join(c.name for c in CALLS)}")
        chosen.update(c.name for c in hits)
    return [CALLS[0]] + [c for c in CALLS[1:] if c.name in chosen]


def host_times_ns(fn: Callable[[], object], calls: int, *, warmup: int = 50, sync_every: int = 64,
                  sync: Callable[[], None] = torch.cuda.synchronize,
                  clock: Callable[[], int] = time.perf_counter_ns) -> list[int]:
    """ns of each of ``calls`` calls of ``fn`` (the clock read right before and right after the call), after
    ``warmup`` untimed calls. ``sync()`` after the warm-up, after every ``sync_every`` timed calls and at the end,
    never inside a timed window. Raises ValueError unless calls >= 1 and sync_every >= 1."""
    if calls < 1 or sync_every < 1:
        raise ValueError(f"{calls=} and {sync_every=} must be >= 1")
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for i in range(1, calls + 1):
        t0 = clock()
        fn()
        times.append(clock() - t0)
        if i % sync_every == 0:
            sync()
    sync()
    return times


def median_p90_us(times_ns: Sequence[int]) -> tuple[float, float]:
    """(median, 90th percentile) in µs of per-call ns (inclusive quantiles). ValueError when empty."""
    if not times_ns:
        raise ValueError("no timings")
    p90 = statistics.quantiles(times_ns, n=10, method="inclusive")[-1] if len(times_ns) > 1 else times_ns[0]
    return statistics.median(times_ns) / 1e3, p90 / 1e3


def gpu_us_per_call(fn: Callable[[], object], host_us: float, calls: int = GPU_CALLS, repeats: int = 5) -> float:
    """Device µs per call: CUDA events around ``calls`` back-to-back calls queued behind a spin of twice their
    host time plus 200 µs; the median over ``repeats``."""
    cycles = timing.spin_cycles(2 * calls * host_us + 200)
    got = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        got.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(got)


def measure_rounds(todo: Sequence[Call], args, device: str = "cuda",
                   sync: Callable[[], None] = torch.cuda.synchronize,
                   gpu_time: Callable[[Callable[[], object], float], float] = gpu_us_per_call,
                   clock: Callable[[], int] = time.perf_counter_ns) -> list[OverheadRow]:
    """The rows of ``todo`` (the torch op first): operands built once, then ``args.rounds`` rounds that time every
    call in turn (``args.calls / rounds`` calls each, the first round after ``args.warmup`` untimed calls, later
    ones after up to 5), then each call's device time. ``x_torch``: the median over the rounds of the call's
    median over the torch op's in that round. A call that raises becomes an ``error`` row and is not timed again."""
    rows = [OverheadRow(c.name, c.shape) for c in todo]
    fns = []
    for c, row in zip(todo, rows):
        try:
            fn, row.note = c.make(device)
        except Exception as e:
            fn, row.status, row.note = None, "error", output.reason(e)
        fns.append(fn)
    per_round = max(1, -(-args.calls // args.rounds))
    times = [[] for _ in todo]
    medians = [[] for _ in todo]
    for r in range(args.rounds):
        for i, fn in enumerate(fns):
            if fn is None:
                continue
            try:
                t = host_times_ns(fn, per_round, warmup=args.warmup if r == 0 else min(args.warmup, 5),
                                  sync_every=args.sync_every, sync=sync, clock=clock)
            except Exception as e:
                fns[i], rows[i].status, rows[i].note = None, "error", output.reason(e)
                continue
            times[i] += t
            medians[i].append(statistics.median(t))
    for i, (row, fn) in enumerate(zip(rows, fns)):
        if fn is None:
            continue
        row.calls = len(times[i])
        row.host_us, row.host_p90_us = median_p90_us(times[i])
        if fns[0] is not None and len(medians[0]) == len(medians[i]):
            row.x_torch = statistics.median(m / b for m, b in zip(medians[i], medians[0]))
        try:
            row.gpu_us = gpu_time(fn, row.host_p90_us)
        except Exception as e:
            row.status, row.note = "error", output.reason(e)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=2000,
                   help="timed calls per op, all rounds (default 2000); each round times ceil(CALLS / ROUNDS) of them, "
                        "so at least CALLS in all and at least ROUNDS")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds over the calls (default 10)")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls first (default 50)")
    p.add_argument("--sync-every", type=int, default=64, help="synchronize every N calls, untimed (default 64)")
    p.add_argument("--only", type=timing.csv_arg(lambda s: select([s]) and s), default=None,
                   help="comma list of call names, or parts of them: the calls to run besides the torch op "
                        "('matmul,M=1'); a whole name picks that call alone ('quantize mxfp4'), a part every call "
                        "whose name holds it (case-insensitive)")
    p.add_argument("--list", action="store_true", help="print the calls and exit (no GPU needed)")
    p.add_argument("--out", type=output.out_folder, default=None,
                   help="write bench_overhead.csv / .json into this folder")
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")


COLUMNS = [Column("call", lambda r: r.op, right=False), Column("shape", lambda r: r.shape, right=False),
           Column("host µs", lambda r: fmt_num(r.host_us, ".1f")),
           Column("p90 µs", lambda r: fmt_num(r.host_p90_us, ".1f")),
           Column("GPU µs", lambda r: fmt_num(r.gpu_us, ".1f")),
           Column("× torch op", lambda r: fmt_num(r.x_torch, ".2f")),
           Column(f"≤ {TARGET:g}×", lambda r: "-" if r.ok is None else ("yes" if r.ok else "NO")),
           Column("note", lambda r: r.note[:70], right=False)]


def run(args) -> int:
    """``mxkit bench overhead``. 0: ran (the target is information); 1: an mxkit call raised; 2: cannot run here."""
    todo = select(args.only)
    for name, value, least in (("calls", args.calls, 1), ("rounds", args.rounds, 1),
                               ("sync-every", args.sync_every, 1), ("warmup", args.warmup, 0)):  # (with --list too)
        if value < least:
            return output.usage_error(f"--{name} must be >= {least}, got {value}")
    if args.list:
        print("\n".join(f"{c.name:32s} {c.shape}" for c in todo))
        return 0
    if args.out is not None:
        try:
            output.check_out_folder(args.out, ["bench_overhead.csv", "bench_overhead.json"])
        except OSError as e:
            return output.usage_error(str(e))
    if not torch.cuda.is_available():
        return timing.no_cuda("mxkit bench overhead", "'--list' shows the calls without a GPU")
    env = output.environment()
    from ..kernels import fast_call
    from ..kernels.cuda_driver import _fast

    env["launch"] = "C fast launch" if _fast() is not None else "ctypes (MXKIT_FAST_LAUNCH=0 or not built)"
    # (the C++ fast call builds in the background at first use: wait for it, so the calls time the path they keep)
    env["fast_call"] = "C++ fast call" if fast_call.module(wait=True) is not None else \
        "none (MXKIT_FAST_CALL=0 or not built): outputs allocated from Python"
    env["launch"] += f", outputs: {env['fast_call']}"
    print(output.env_line(env))
    per_round = -(-args.calls // args.rounds)
    print(f"{per_round * args.rounds} timed calls each in {args.rounds} interleaved rounds of {per_round}, "
          f"{args.warmup} warm-up calls first, "
          f"a sync every {args.sync_every} (untimed); GPU µs over {GPU_CALLS} queued calls; bound launches: "
          f"{env['launch']}", flush=True)
    rows = measure_rounds(todo, args)
    for r in rows:
        r.ok = None if r.x_torch is None else r.x_torch <= TARGET
    env.update(torch_op_host_us=rows[0].host_us, rounds=args.rounds)
    print()
    output.render_table(rows, COLUMNS, plain=args.plain,
                        title=f"mxkit bench overhead — {env['gpu']} — torch op {fmt_num(rows[0].host_us, '.1f')} µs "
                              f"— {env['date_utc']}")
    for line in output.save(rows, args, "bench_overhead", env):
        print(line)
    bad = [r.op for r in rows if r.status != "ok"]
    if bad:
        print(f"mxkit: error: {len(bad)} call(s) raised: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
