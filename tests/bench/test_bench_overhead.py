"""``mxkit bench overhead`` on CPU: the per-call host timing loop under a fake clock (where it reads the clock
and where it syncs), its statistics, the calls' operands and API (each call runs once on CPU), the ratio to the
torch op and the files of a run with the measurement faked, and the command line's errors. No GPU needed."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import mxkit
from mxkit import bench, cli
from mxkit.bench import output
from mxkit.bench import overhead as bo


def _args(argv=()):
    parser = argparse.ArgumentParser(prog="mxkit")
    bench.add_bench_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["bench", "overhead", *argv])


class FakeClock:
    """ns that advance only when a call runs (its cost) or a sync runs (1e6, which must never be timed)."""

    def __init__(self, costs):
        self.now, self.costs, self.events = 0, iter(costs), []

    def __call__(self) -> int:
        self.events.append("clock")
        return self.now

    def call(self) -> None:
        self.events.append("call")
        self.now += next(self.costs)

    def sync(self) -> None:
        self.events.append("sync")
        self.now += 1_000_000


def test_host_times_read_the_clock_around_the_call_alone():
    warmup, calls, every = 3, 10, 4
    costs = [100 * (k + 1) for k in range(warmup + calls)]
    fake = FakeClock(costs)
    got = bo.host_times_ns(fake.call, calls, warmup=warmup, sync_every=every, sync=fake.sync, clock=fake)
    assert got == costs[warmup:]  # each time is that call's cost: no sync and no other call inside a window
    ev = fake.events
    assert ev[:warmup + 1] == ["call"] * warmup + ["sync"]  # the warm-up, then a sync before the first timed call
    timed = ev[warmup + 1:]
    # clock, call, clock per timed call; a sync after calls 4 and 8 and one at the end, each outside a window
    assert timed.count("sync") == calls // every + 1 and timed[-1] == "sync"
    windows = "".join({"clock": "c", "call": "x", "sync": "s"}[e] for e in timed)
    assert windows == "cxc" * 4 + "s" + "cxc" * 4 + "s" + "cxc" * 2 + "s"
    with pytest.raises(ValueError, match="calls=0"):
        bo.host_times_ns(fake.call, 0, sync=fake.sync, clock=fake)
    with pytest.raises(ValueError, match="sync_every=0"):
        bo.host_times_ns(fake.call, 3, sync_every=0, sync=fake.sync, clock=fake)


def test_median_and_p90():
    # 1..10 µs: median 5.5; the inclusive 90th percentile lies 0.1 of the way from 9 to 10
    assert bo.median_p90_us([k * 1000 for k in range(10, 0, -1)]) == pytest.approx((5.5, 9.1))
    assert bo.median_p90_us([7000]) == (7.0, 7.0)
    with pytest.raises(ValueError):
        bo.median_p90_us([])


def test_every_call_runs_on_cpu_through_the_public_api():
    """The calls' operands and API (cast_transpose's pair, matmul on a PackedWeight, MXLinear.forward), run once on
    CPU (the reference backend): a call that no longer matches the API fails here, not on the GPU."""
    got = {}
    for c in bo.CALLS:
        fn, note = c.make("cpu")
        got[c.name] = (fn(), note)
    assert [c.name for c in bo.CALLS][0] == bo.BASELINE and len(got) == 15
    base = got[bo.BASELINE][0]
    assert base.shape == bo.X_SHAPE and base.dtype == torch.bfloat16 and bool(base.abs().max() > 0)
    for fmt in ("mxfp4", "mxfp8"):
        q = got[f"quantize {fmt}"][0]
        assert isinstance(q, mxkit.MXTensor) and q.shape == bo.X_SHAPE and q.fmt.name.startswith(fmt)
    assert got["dequantize mxfp4"][0].dtype is torch.bfloat16 and got["dequantize mxfp4"][0].shape == bo.X_SHAPE
    rows, cols = got["cast_transpose mxfp8"][0]
    assert rows.axis != cols.axis and tuple(rows.shape) == tuple(cols.shape) == bo.X_SHAPE
    for name, m in (("matmul bf16 x mxfp4 (M=1)", 1), ("matmul bf16 x mxfp4 (M=256)", 256),
                    ("matmul mxfp4 x mxfp4 (M=256)", 256), ("matmul mxfp8 x mxfp4 (M=256)", 256),
                    ("MXLinear.forward mxfp4 (M=1)", 1)):
        y, note = got[name]
        assert y.shape == (m, bo.N) and y.dtype is torch.bfloat16 and note == "path reference", name
    y, note = got["matmul bf16 x mxfp4 (M=64, 8192x8192)"]  # (the wgmma kernel's path on the H200's table)
    assert y.shape == (64, 8192) and note == "path reference"
    y, note = got["MXLinear.forward mxfp4 x mxfp4 (M=256)"]
    assert y.shape == (256, bo.N) and note == "path reference (x quantized first)"


def test_select_and_options(capsys):
    assert [c.name for c in bo.select(None)] == [c.name for c in bo.CALLS]
    assert [c.name for c in bo.select(["MATMUL", "M=1"])] == [
        bo.BASELINE, "matmul bf16 x mxfp4 (M=1)", "matmul bf16 x mxfp4 (M=256)",
        "matmul bf16 x mxfp4 (M=64, 8192x8192)", "matmul mxfp4 x mxfp4 (M=256)",
        "matmul mxfp8 x mxfp4 (M=256)", "matmul mxfp8 x mxfp8 (M=1)", "MXLinear.forward mxfp4 (M=1)",
        "MXLinear.forward mxfp4 + bf16 bias (M=1)", "MXLinear.forward mxfp8 x mxfp8 (M=1)"]
    # a whole name (any case) picks that call alone; a part of names every call that holds it
    assert [c.name for c in bo.select(["quantize mxfp4"])] == [bo.BASELINE, "quantize mxfp4"]
    assert [c.name for c in bo.select(["QUANTIZE MXFP4", "dequantize mxfp4"])] == [
        bo.BASELINE, "quantize mxfp4", "dequantize mxfp4"]
    assert [c.name for c in bo.select(["quantize"])] == [
        bo.BASELINE, "quantize mxfp4", "quantize mxfp8", "dequantize mxfp4"]
    assert _args(["--only", "quantize mxfp4"]).only == ("quantize mxfp4",)
    args = _args(["--only", "dequantize", "--calls", "100", "--sync-every", "8", "--out", "r"])
    assert args.func is bo.run and args.only == ("dequantize",) and (args.calls, args.sync_every) == (100, 8)
    with pytest.raises(SystemExit):
        _args(["--only", "transpose2"])
    assert "no call named like 'transpose2'" in capsys.readouterr().err


def test_cli_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "overhead", "--list", "--only", "quantize"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = [bo.BASELINE, "quantize mxfp4", "quantize mxfp8", "dequantize mxfp4"]
    assert [line.split("  ")[0] for line in out] == want
    assert cli.main(["bench", "overhead", "--list", "--only", "quantize mxfp4"]) == 0
    assert [line.split("  ")[0] for line in capsys.readouterr().out.splitlines()] == [bo.BASELINE, "quantize mxfp4"]
    assert cli.main(["bench", "overhead"]) == 2
    err = capsys.readouterr().err
    assert "mxkit bench overhead needs a CUDA GPU" in err and "Traceback" not in err
    for flag, bad, least in (("--calls", "0", 1), ("--rounds", "0", 1), ("--sync-every", "0", 1),
                             ("--warmup", "-1", 0)):
        assert cli.main(["bench", "overhead", "--list", flag, bad]) == 2  # (only the bad one named, with its value)
        assert capsys.readouterr().err == f"mxkit: error: {flag} must be >= {least}, got {bad}\n"


def test_out_file_refused_and_the_calls_actually_timed(monkeypatch, tmp_path, capsys):
    """--out naming a file: one error line before anything runs. --calls below --rounds: every round still times
    one call (ceil(calls / rounds) a round), and the header says how many are timed."""
    afile = tmp_path / "afile"
    afile.write_text("keep")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(output, "environment", lambda: pytest.fail("the run started"))
    assert cli.main(["bench", "overhead", "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err == f"mxkit: error: --out '{afile}' is a file; it names the folder the results go into\n"
    seen = []
    monkeypatch.setattr(output, "environment", lambda: {"gpu": "FakeGPU", "date_utc": "today"})
    monkeypatch.setattr(bo, "measure_rounds", lambda todo, args, **kw: seen.append(args) or [
        bo.OverheadRow(c.name, c.shape, host_us=1.0, host_p90_us=1.0, x_torch=1.0) for c in todo])
    assert bo.run(_args(["--only", "quantize mxfp4", "--calls", "5", "--rounds", "10", "--plain"])) == 0
    assert "10 timed calls each in 10 interleaved rounds of 1," in capsys.readouterr().out
    parser = argparse.ArgumentParser()
    bo.add_arguments(parser)
    assert "ceil(CALLS / ROUNDS)" in next(a.help for a in parser._actions if a.dest == "calls")


def test_measure_rounds_interleaves_the_calls_and_ratios_per_round():
    """Every round times each call in turn; × torch op is the median over rounds of the call's median over the
    torch op's median in the same round (a host that slows down between rounds moves both); a call that raises
    when built or while timed becomes an error row."""
    order, speed = [], [1.0]

    def maker(name, cost):
        def make(device):
            def fn():
                order.append(name)
                clock.now += int(cost * speed[0])
            return fn, f"note {name}"
        return make

    class Clock:
        now = 0

        def __call__(self):
            return self.now

    clock = Clock()

    slowed = set()

    def sync():  # the host slows down by half after each round's "q" (3 calls a round), before the next torch op
        n = order.count("q")
        if order and order[-1] == "q" and n % 3 == 0 and n not in slowed:
            slowed.add(n)
            speed[0] *= 1.5

    def broken(device):
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    late = {"n": 0}

    def dies_late(device):
        def fn():
            late["n"] += 1
            if late["n"] > 3:
                raise ValueError("later")
        return fn, ""

    todo = [bo.Call("base", "1", maker("base", 1000)), bo.Call("q", "1", maker("q", 1500)),
            bo.Call("broken", "1", broken), bo.Call("late", "1", dies_late)]
    rows = bo.measure_rounds(todo, _args(["--calls", "6", "--rounds", "3", "--warmup", "1", "--sync-every", "100"]),
                             device="cpu", sync=sync, gpu_time=lambda fn, us: 2.0, clock=clock)
    assert [r.status for r in rows] == ["ok", "ok", "error", "error"]
    assert rows[2].note == "RuntimeError: CUDA error: an illegal memory access" and rows[3].note == "ValueError: later"
    # rounds: base x3 (1 warm-up + 2), q x3, then base x2 + 1 warm-up... each round base then q
    assert order[:6] == ["base"] * 3 + ["q"] * 3 and order.count("base") == order.count("q") == 3 + 2 * 3
    base, q = rows[0], rows[1]
    assert base.x_torch == pytest.approx(1.0) and q.x_torch == pytest.approx(1.5)
    assert base.host_us == pytest.approx(1.5)  # 1, 1.5, 2.25 µs in the three rounds: the host drifted
    assert q.calls == 6 and q.gpu_us == 2.0 and q.note == "note q"


def test_run_ratios_table_and_files(monkeypatch, tmp_path, capsys):
    """run() with the measurement faked: the ≤ 1.5× column from the rows' ratios, CSV / JSON, and exit status 1
    when a call raised."""
    ratio = {bo.BASELINE: 1.0, "quantize mxfp4": 1.5, "quantize mxfp8": 2.5}

    def fake_rounds(todo, args, device="cuda", **kw):
        assert args.rounds == 4
        return [bo.OverheadRow(c.name, c.shape, status="error", note="RuntimeError: boom") if c.name not in ratio
                else bo.OverheadRow(c.name, c.shape, host_us=10.0 * ratio[c.name], host_p90_us=40.0, gpu_us=3.0,
                                    x_torch=ratio[c.name]) for c in todo]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(output, "environment", lambda: {"gpu": "FakeGPU", "date_utc": "today"})
    monkeypatch.setattr(bo, "measure_rounds", fake_rounds)
    rc = bo.run(_args(["--only", "quantize", "--rounds", "4", "--out", str(tmp_path), "--plain"]))
    out = capsys.readouterr().out
    assert rc == 1 and "× torch op" in out and "torch op 10.0 µs" in out and "interleaved rounds" in out
    rows = {r["op"]: r for r in json.loads((tmp_path / "bench_overhead.json").read_text())["rows"]}
    assert list(rows) == [bo.BASELINE, "quantize mxfp4", "quantize mxfp8", "dequantize mxfp4"]
    assert rows["quantize mxfp4"]["x_torch"] == pytest.approx(1.5) and rows["quantize mxfp4"]["ok"] is True
    assert rows["quantize mxfp8"]["x_torch"] == pytest.approx(2.5) and rows["quantize mxfp8"]["ok"] is False
    assert rows["dequantize mxfp4"]["x_torch"] is None and rows["dequantize mxfp4"]["status"] == "error"
    assert (tmp_path / "bench_overhead.csv").read_text().splitlines()[0].startswith("op,shape,host_us,host_p90_us")
    assert bo.run(_args(["--rounds", "0"])) == 2
