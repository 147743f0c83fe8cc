"""The benchmark harness (mxkit.bench) on CPU: byte counting, output writers, argument parsing, the registry,
the whole case pipeline with an injected timer, graceful n/a rows, the compiled peers (per shape, never
dynamic), and the no-CUDA exit. No GPU needed."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest
import torch

import mxkit
from mxkit import bench, cli
from mxkit.bench import output
from mxkit.bench import quantize as bq
from mxkit.bench import timing
from mxkit.bench.timing import BenchUnavailable, Row
from mxkit.formats import FORMATS, get_format

BF16 = torch.bfloat16


# --------------------------------------------------------------------------------------------------------
# byte counting


def test_case_bytes_hand_counted():
    n = 8192 * 8192
    # bf16 input 2 B/element; FP4 half a byte, FP6 3/4, FP8 one; one scale byte per 32 elements
    assert bq.case_bytes("rowwise", (8192, 8192), get_format("mxfp4"), BF16) == 2 * n + n // 2 + n // 32
    assert bq.case_bytes("columnwise", (8192, 8192), get_format("mxfp6_e2m3"), BF16) == 2 * n + 3 * n // 4 + n // 32
    assert bq.case_bytes("cast_transpose", (8192, 8192), get_format("mxfp8"), BF16) == 2 * n + 2 * (n + n // 32)
    assert bq.case_bytes("dequantize", (8192, 8192), get_format("mxfp4"), torch.float32) == n // 2 + n // 32 + 4 * n
    assert bq.mx_bytes(32 * 5, get_format("mxfp6_e2m3")) == (120, 5)
    assert bq.case_bytes("rowwise", (8, 2048, 4096), get_format("mxfp8"), BF16) == bq.case_bytes(
        "rowwise", (16384, 4096), get_format("mxfp8"), BF16)


def test_byte_count_errors_name_the_values():
    with pytest.raises(ValueError, match="numel=48"):
        bq.mx_bytes(48, get_format("mxfp8"))
    with pytest.raises(ValueError, match="unknown op 'transpose'"):
        bq.case_bytes("transpose", (64, 64), get_format("mxfp8"), BF16)


@pytest.mark.parametrize("op", bq.OPS)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_case_bytes_equal_the_tensors_the_reference_makes(op, fmt):
    dtype = [torch.bfloat16, torch.float16, torch.float32][torch.randint(0, 3, ()).item()]
    shape = (32 * int(torch.randint(1, 4, ())), 32 * int(torch.randint(1, 4, ())))
    x = torch.randn(shape, dtype=dtype)
    f = get_format(fmt)
    if op == "dequantize":
        q = mxkit.quantize(x, f, backend="reference")
        y = mxkit.dequantize(q, dtype, backend="reference")
        moved = q.qdata.nbytes + q.scale.nbytes + y.nbytes
    else:
        out = mxkit.quantize(x, f, axis=bq.Case(op, f, shape).axis, backend="reference")
        out = out if isinstance(out, tuple) else (out,)
        moved = x.nbytes + sum(q.qdata.nbytes + q.scale.nbytes for q in out)
    assert bq.case_bytes(op, shape, f, dtype) == moved


def test_case_shapes_and_invalid_reasons():
    f = get_format("mxfp4")
    assert bq.Case("columnwise", f, (8, 2048, 4096)).run_shape == (16384, 4096)
    assert bq.Case("cast_transpose", f, (8, 2048, 4096)).note == "2-D view 16384x4096"
    assert bq.Case("rowwise", f, (8, 2048, 4096)).run_shape == (8, 2048, 4096)
    assert bq.Case("columnwise", f, (32768, 160)).invalid_reason() is None
    assert "dim 0 = 48" in bq.Case("columnwise", f, (48, 64)).invalid_reason()
    assert "dim 1 = 48" in bq.Case("rowwise", f, (64, 48)).invalid_reason()
    assert bq.Case("cast_transpose", f, (64, 64)).axis == (-1, 0)
    with pytest.raises(ValueError, match="unknown op"):
        bq.Case("nope", f, (64, 64))


def test_small_helpers():
    assert timing.gbps(3_000_000, 1.0) == 3000.0  # 3 MB in 1 µs = 3000 GB/s
    assert timing.gbps(100, None) is None and timing.gbps(100, 0.0) is None
    assert timing.parse_shape("8x2048x4096") == (8, 2048, 4096)
    assert timing.format_shape((32768, 160)) == "32768x160"
    for bad in ("12xz", "0x64", "", "-1x32"):
        with pytest.raises(ValueError):
            timing.parse_shape(bad)


# --------------------------------------------------------------------------------------------------------
# writers


def _rows() -> list[Row]:
    return [
        Row("rowwise", "mxfp4_e2m1", "8192x8192", "mxkit", us=50.0, nbytes=169_869_312, gbps=3397.4,
            pct_copy=79.6, vs_ref=3.42, check="match"),
        Row("rowwise", "mxfp4_e2m1", "8192x8192", "reference-compiled", us=171.0, nbytes=169_869_312,
            gbps=993.4, pct_copy=23.3, vs_ref=1.0, compile_s=9.5),
        Row("cast_transpose", "mxfp8_e4m3", "8192x8192", "mxkit", status="n/a",
            note="ModuleNotFoundError: No module named 'mxkit.kernels.quantize'"),
        Row("cast_transpose", "mxfp8_e4m3", "8192x8192", "torchao-compiled", status="n/a",
            note="torchao not importable (ModuleNotFoundError)"),
    ]


def test_csv_and_json_round_trip(tmp_path):
    rows = _rows()
    env = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "copy_gbps": 4270.0}
    p_csv = output.write_csv(rows, tmp_path / "a" / "b.csv")
    with p_csv.open() as fh:
        got = list(csv.DictReader(fh))
    assert [g["impl"] for g in got] == [r.impl for r in rows]
    assert got[0]["us"] == "50.0" and got[2]["us"] == "" and got[2]["status"] == "n/a"
    assert list(got[0]) == [f.name for f in dataclasses.fields(Row)]
    p_json = output.write_json(rows, env, tmp_path / "b.json", config={"quick": True, "_cli_parser": object()})
    doc = json.loads(p_json.read_text())
    assert doc["env"] == env and doc["config"] == {"quick": True}  # (the CLI's own "_" entries left out)
    assert doc["rows"][2]["us"] is None
    assert [Row(**r) for r in doc["rows"]] == rows
    # any dataclass rows (the overhead and decode benches write their own)
    Other = dataclasses.make_dataclass("Other", [("name", str), ("value", float)])
    p_other = output.write_csv([Other("a", 1.5), Other("b", None)], tmp_path / "o.csv")
    assert p_other.read_text().splitlines() == ["name,value", "a,1.5", "b,"]


def test_table_plain_and_rich(capsys):
    lines = timing.summary_lines(_rows())
    assert [(d["op"], d["main"].impl) for d in lines] == [("rowwise", "mxkit"), ("cast_transpose", "mxkit")]
    cols = bq.table_columns(["reference-compiled", "torchao-compiled"])
    text = output.render_table(lines, cols, title="T", plain=True)
    assert capsys.readouterr().out == text
    head, rule, r1, r2 = text.splitlines()[1:5]
    assert "× vs ref.compiled" in head and "ref.compiled µs" in head and "torchao µs" in head
    assert set(rule) <= {"-", " "}
    assert "50.0" in r1 and "3397" in r1 and "79.6" in r1 and "3.42" in r1 and "171.0" in r1 and "match" in r1
    assert r2.count("n/a") >= 5 and "ModuleNotFoundError" in r2
    pytest.importorskip("rich")
    text2 = output.render_table(lines, cols, title="T")
    out = capsys.readouterr().out
    assert text2 == text and "3397" in out and "ModuleNotFoundError" in out


def test_chart_png_or_clear_skip(tmp_path, monkeypatch):
    rows = _rows()
    kw = dict(value="pct_copy", ylabel="% copy", is_main=lambda r: r.impl == "mxkit")
    if _has("matplotlib"):
        import matplotlib.pyplot as plt

        grids, subplots = [], plt.subplots
        with monkeypatch.context() as m:
            m.setattr(plt, "subplots", lambda *a, **k: grids.append(a) or subplots(*a, **k))
            path, note = output.write_chart(rows, tmp_path / "c.png", **kw)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "chart" in note
        assert grids == [(1, 1)]  # (one panel: cast_transpose's main row has no value to draw)
        # whole or not at all: a write that fails leaves the chart before it (savefig to the path truncated it)
        before = path.read_bytes()
        with monkeypatch.context() as m:
            m.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(27, "File too large")))
            with pytest.raises(OSError, match="File too large"):
                output.write_chart(rows, path, **dict(kw, title="another"))
        assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["c.png"]
        path, note = output.write_chart(rows, tmp_path / "e.png", **dict(kw, is_main=lambda r: r.impl == "nobody"))
        assert path is None and "no rows" in note and not (tmp_path / "e.png").exists()
        mains = [r for r in rows if r.impl == "mxkit"]  # (a main row without a value is no peer: no peer ticks)
        titles = []
        with monkeypatch.context() as m:
            m.setattr(plt.Axes, "set", lambda ax, **k: titles.append(k.get("title")) or None)
            output.write_chart(mains, tmp_path / "m.png", **kw)
        assert titles == ["rowwise"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path, note = output.write_chart(rows, tmp_path / "d.png", **kw)
    assert path is None and "matplotlib" in note and not (tmp_path / "d.png").exists()


def _has(mod: str) -> bool:
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


# --------------------------------------------------------------------------------------------------------
# argument parsing and the registry


def _cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mxkit")
    sub = parser.add_subparsers(dest="cmd")
    bench.add_bench_parser(sub)
    return parser


def test_add_bench_parser_parses_quantize_options():
    args = _cli().parse_args(["bench", "quantize", "--formats", "mxfp4, mxfp8_e5m2", "--shapes",
                              "1024x1024,8x64x128", "--ops", "rowwise,dequantize", "--peers", "none",
                              "--dtype", "fp16", "--scale-mode", "RCEIL", "--quick", "--out", "r"])
    assert args.func is bq.run and args.bench_op == "quantize"
    assert args.formats == ("mxfp4_e2m1", "mxfp8_e5m2")
    assert args.shapes == ((1024, 1024), (8, 64, 128))
    assert args.ops == ("rowwise", "dequantize") and args.peers == ()
    assert args.dtype is torch.float16 and args.scale_mode is mxkit.ScaleMode.RCEIL
    assert str(args.out) == "r" and args.rep_ms is None  # resolved by timing_config: 40 ms with --quick
    assert timing.timing_config(args).rep_ms == timing.QUICK_REP_MS
    assert timing.timing_config(_cli().parse_args(["bench", "quantize"])).rep_ms == timing.DEFAULT_REP_MS
    with pytest.raises(ValueError, match=r"^--rep-ms must be in \(0, 60000\], got -1.0$"):  # (not --spin-us)
        timing.timing_config(_cli().parse_args(["bench", "quantize", "--rep-ms", "-1"]))
    # the GPU spin that hides the host's launch path: on by default, 0 = none, negative refused
    assert timing.timing_config(args).spin_us == 100.0
    assert timing.timing_config(_cli().parse_args(["bench", "quantize", "--spin-us", "0"])).spin_us == 0.0
    for bad in ("-5", "inf", "nan"):  # (inf / nan passed the sign check and failed in int(us * MHz) on a GPU)
        with pytest.raises(ValueError, match=rf"^--spin-us must be in \[0, 100000\], got {float(bad)}$"):
            timing.timing_config(_cli().parse_args(["bench", "quantize", "--spin-us", bad]))
    with pytest.raises(ValueError, match=r"--rep-ms must be in \(0, 60000\], got nan"):
        timing.timing_config(_cli().parse_args(["bench", "quantize", "--rep-ms", "nan"]))
    # upper bounds: 1e9 µs of spin before each of >= 25 timed runs hung the run (and 1e300 overflowed the spin's
    # int64 cycle count outside any handler)
    for flag, bad in (("--spin-us", "1e9"), ("--spin-us", "1e300"), ("--rep-ms", "1e9")):
        with pytest.raises(ValueError, match=re.escape(f"{flag} must be in ") + ".*" + re.escape(f"got {float(bad)}")):
            timing.timing_config(_cli().parse_args(["bench", "quantize", flag, bad]))
    assert timing.timing_config(_cli().parse_args(["bench", "quantize", "--spin-us", "1e5"])).spin_us == 1e5
    # --peers none in any case, as the names are; an unknown name's error says none is a choice
    assert _cli().parse_args(["bench", "quantize", "--peers", "NONE"]).peers == ()
    # both flushes are always timed (read: the clean-L2 measure; write: do_bench's); nothing else is a flush
    assert timing.FLUSH_MODES == ("read", "write")
    with pytest.raises(ValueError, match="flush='none'"):
        timing.cuda_event_bench(lambda: None, flush="none")
    cases = bq.cases_from_args(args)
    assert len(cases) == 2 * 2 * 2 and cases[0].shape == (1024, 1024) and cases[-1].shape == (8, 64, 128)
    defaults = _cli().parse_args(["bench", "quantize"])
    assert defaults.formats == bq.DEFAULT_FORMATS and defaults.peers == bq.DEFAULT_PEERS
    assert len(bq.cases_from_args(defaults)) == len(bq.OPS) * 3 * 5
    quick = _cli().parse_args(["bench", "quantize", "--quick"])
    assert {c.label for c in bq.cases_from_args(quick)} == set(bq.QUICK_SHAPES)


@pytest.mark.parametrize("argv, needle", [
    (["--formats", "mxfp9"], "unknown MX format 'mxfp9'"),
    (["--shapes", "12xz"], "12xz"),
    (["--ops", "rowwise,diagonal"], "unknown op 'diagonal'"),
    (["--peers", "cublas"], "unknown peer 'cublas'"),
    (["--peers", "cublas"], "(or 'none' alone: no peers)"),
    (["--dtype", "int8"], "unknown dtype 'int8'"),
    (["--scale-mode", "round"], "round"),
    (["--formats", "mxfp4,mxfp4_e2m1"], "lists 'mxfp4_e2m1' twice"),
    (["--shapes", "64x64,64x64"], "lists (64, 64) twice"),
])
def test_bad_options_are_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        _cli().parse_args(["bench", "quantize", *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["gemm", "--quick", "--list", "--rounds", "0"], ["gemm", "--quick", "--list", "--rep-ms", "-1"],
    ["moe", "--quick", "--list", "--rep-ms", "nan"], ["quantize", "--list", "--spin-us", "-1"],
    ["overhead", "--list", "--rounds", "0"], ["gemm", "--list", "--pairs", "w4a16", "--modes", "from-bf16"]])
def test_list_checks_the_timing_options_too(argv, capsys):
    """--list printed the cases and exited 0 past timing options that a run refuses (and bench gemm past options
    that select no case: a W4A16 pair has no from-bf16 mode; it would have run only the copy row)."""
    from mxkit import cli

    assert cli.main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("mxkit: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("argv,needle", [
    (["gemm", "--shapes", "1x64x33"], "case(s) cannot run: 1x64x33: K=33 is not a multiple of 32 (--list"),
    (["quantize", "--shapes", "4x4", "--formats", "mxfp4"], "case(s) cannot run: "),
    (["gemm", "--quick", "--rounds", "3", "--peers", "torchao"],
     "--rounds 3 interleaves mxkit with the reference peer")])
def test_a_run_refuses_up_front_what_it_cannot_run(argv, needle, monkeypatch, capsys):
    """Cases no kernel takes (K not a multiple of 32) and --rounds without the reference peer are usage errors
    before any timing (they ran the whole bench, then exited 1 on n/a rows / printed an n/a x column), whether or
    not a GPU is here; --list still shows such cases with the reason."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (refused before the CUDA check)
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and needle in err and err.count("\n") == 1, err
    assert cli.main(["bench", *argv, "--list"]) == 0


def test_bench_needs_an_op(capsys):
    with pytest.raises(SystemExit) as e:
        _cli().parse_args(["bench"])
    assert e.value.code == 2 and "OP" in capsys.readouterr().err


def test_registry():
    reg = bench.registry()
    assert list(reg) == list(bench.BENCH_MODULES) and {"quantize", "gemm", "overhead", "decode"} <= set(reg)
    assert reg["quantize"] is bq and all(reg[name].NAME == name for name in reg)
    # a new op joins with one module: its sub-command and func come out of the same code path
    fake = types.SimpleNamespace(NAME="fake", HELP="fake op", add_arguments=lambda p: p.add_argument("--m", type=int),
                                 run=lambda a: 7)
    parser = argparse.ArgumentParser()
    bench.add_bench_parser(parser.add_subparsers(dest="cmd"), {"quantize": bq, "fake": fake})
    args = parser.parse_args(["bench", "fake", "--m", "3"])
    assert args.m == 3 and args.func(args) == 7 and parser.parse_args(["bench", "quantize"]).func is bq.run


def test_bench_parsers_do_not_import_transformers():
    """``mxkit --help`` builds every bench parser: that must not import transformers (slow, optional)."""
    code = "import sys, mxkit.bench as b; b.registry(); print('transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "False", r.stderr[-2000:]


# --------------------------------------------------------------------------------------------------------
# running without CUDA


def test_no_cuda_exits_with_a_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "quantize", "--shapes", "64x64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and err.count("\n") == 1
    assert "needs a CUDA GPU" in err and "Traceback" not in err


def test_no_cuda_with_mxkit_traceback_raises(monkeypatch, tmp_path):
    """MXKIT_TRACEBACK=1 turns the no-GPU error of bench and tune into a raised error (a traceback, exit status 1),
    as it does the CLI's other errors (both printed their line and returned 2 whatever it said)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("MXKIT_TRACEBACK", "1")
    for argv in (["bench", "quantize", "--shapes", "64x64"], ["tune", "gemm", "--out", str(tmp_path / "t.json")]):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            cli.main(argv)


def test_no_cuda_subprocess_has_no_traceback():
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    import os

    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-m", "mxkit", "bench", "quantize", "--quick"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_list_needs_no_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "quantize", "--list", "--formats", "mxfp4", "--shapes", "32768x160,48x64,33x33"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(bq.OPS) * 3
    assert any("columnwise" in line and "dim 0 = 48" in line for line in out)
    assert sum("dim 1 = 33" in line and "n/a MB" in line for line in out) == 3  # all but columnwise
    # the runner turns such a case into n/a rows, too
    rows = timing.bench_case(bq.Case("rowwise", get_format("mxfp4"), (33, 33)), _ctx(), bq.IMPLS)
    assert [(r.status, r.nbytes) for r in rows] == [("n/a", 0), ("n/a", 0)]


# --------------------------------------------------------------------------------------------------------
# the case pipeline on CPU (injected timer, compile off)


def _ctx(**kw) -> timing.Context:
    base = dict(device="cpu", time_fn=lambda fn: (getattr(fn, "fake_us", 10.0), 2 * getattr(fn, "fake_us", 10.0)),
                sync=lambda: None, backend="reference", impls=("mxkit", "reference-compiled"), compile=False,
                copy_gbps=1000.0, copy_gbps_write=1000.0)
    base.update(kw)
    return timing.Context(**base)


def _slow_ref():
    impl = bq.IMPLS["reference-compiled"]

    def make(case, inp, ctx):
        fn = impl.make(case, inp, ctx)

        def timed():
            return fn()

        timed.fake_us = 40.0
        return timed

    return timing.Impl("reference-compiled", make, compiled=True, checked=True)


def test_interleaved_rounds_divide_out_a_drift():
    """--rounds R: each row's × column is the median of R per-round ratios, the reference and the row timed back to
    back in alternating order; a device whose speed drifts over the run (here 10% slower every timing) reads the
    true 4x, where the rows' own timings (taken minutes apart) would not; R = 1 keeps the rows' own timings."""
    impls = {"mxkit": bq.IMPLS["mxkit"], "reference-compiled": _slow_ref()}
    cases = bq.plan_cases(("rowwise",), ["mxfp8_e4m3"], [(64, 96)], BF16)
    clock = [1.0]

    def drifting(fn):
        clock[0] *= 1.1
        return getattr(fn, "fake_us", 10.0) * clock[0]

    for rounds in (1, 4):
        clock[0] = 1.0
        rows = timing.run_cases(cases, _ctx(rounds=rounds, time_read=drifting), impls, log=lambda s: None)
        mine = next(r for r in rows if r.impl == "mxkit")
        if rounds == 1:
            assert mine.vs_ref == 4.0 and mine.vs_ref_lo is None and clock[0] == 1.0  # (time_read unused)
        else:
            assert clock[0] == 1.1 ** 8  # 4 rounds of two timings
            assert mine.vs_ref == pytest.approx(4.0) and mine.vs_ref_lo == pytest.approx(4.0 / 1.1)
            assert mine.vs_ref_hi == pytest.approx(4.0 * 1.1)
    with pytest.raises(ValueError, match="--rounds must be a positive int"):
        timing.timing_config(types.SimpleNamespace(rep_ms=10.0, spin_us=0.0, rounds=0))


@dataclasses.dataclass(frozen=True)
class _Problem:
    """A case of the runner's protocol (quantize.Case's) whose label does not name its problem, as a MoE case's
    (the token count) does not."""

    model: str
    label: str = "T=64"
    op: str = "mxfp4"
    dtype: torch.dtype = torch.bfloat16
    note: str = ""
    fmt_name = property(lambda self: self.model)
    problem_key = property(lambda self: (self.model, self.label))

    def invalid_reason(self):
        return None

    def nbytes(self):
        return 1

    def make_inputs(self, ctx):
        return None


def test_the_discarded_first_timing_follows_the_problem():
    """The first timing after a new problem is discarded (it read 1.8-3.4x slow, clocks ramping); a case's
    problem_key names the problem where its label does not: MoE cases of two models at one token count each get
    it (only the first did, keyed on the label)."""
    from mxkit.bench import moe as bm

    timed = []
    ctx = _ctx(impls=("mxkit",), time_fn=lambda fn: (timed.append(fn), (10.0, 20.0))[1])
    impl = timing.Impl("mxkit", lambda case, inp, ctx: (lambda: None))
    timing.run_cases([_Problem("a"), _Problem("a"), _Problem("b")], ctx, {"mxkit": impl}, log=lambda s: None)
    assert len(timed) == 2 + 1 + 2
    a, b = (bm.MoeCase(m, 64, "uniform", "mxfp4") for m in bm.MODELS)
    assert a.label == b.label and a.problem_key != b.problem_key
    assert bm.MoeCase("gpt-oss-20b", 64, "zipf", "mxfp4").problem_key != b.problem_key


def test_a_failed_round_keeps_the_rows_own_ratio():
    """An exception in the interleaved rounds (out of memory, a kernel error on a later run) leaves the row its own
    timing's × and a note, and the run goes on to the next case (it escaped bench_case and ended the run, its rows
    lost, before)."""
    impls = {"mxkit": bq.IMPLS["mxkit"], "reference-compiled": _slow_ref()}
    cases = bq.plan_cases(("rowwise",), ["mxfp8_e4m3", "mxfp4_e2m1"], [(64, 96)], BF16)
    calls = [0]

    def flaky(fn):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return getattr(fn, "fake_us", 10.0)

    rows = timing.run_cases(cases, _ctx(rounds=2, time_read=flaky), impls, log=lambda s: None)
    mine = [r for r in rows if r.impl == "mxkit"]
    assert [r.fmt for r in mine] == ["mxfp8_e4m3", "mxfp4_e2m1"] and all(r.status == "ok" for r in mine)
    assert mine[0].vs_ref == 4.0 and mine[0].vs_ref_lo is None  # (its own timings: 40 / 10)
    assert "rounds failed, × from one timing: RuntimeError: CUDA error" in mine[0].note
    assert mine[1].vs_ref_lo == 4.0 and "rounds failed" not in mine[1].note  # (the next case's rounds ran)


def test_pipeline_checks_bytes_and_computes_ratios():
    impls = {"mxkit": bq.IMPLS["mxkit"], "reference-compiled": _slow_ref()}
    cases = bq.plan_cases(bq.OPS, ["mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"], [(64, 96), (2, 32, 64)], BF16)
    log = []
    saved = []
    rows = timing.run_cases(cases, _ctx(), impls, log=log.append, on_rows=lambda rs: saved.append(len(rs)))
    assert saved == [2 * k for k in range(1, len(cases) + 1)]  # the files are rewritten after every case
    assert len(rows) == 2 * len(cases) and len(log) == len(cases)
    mine = [r for r in rows if r.impl == "mxkit"]
    assert all(r.status == "ok" and r.check == "match" for r in mine), [(r.op, r.note) for r in mine]
    for r in mine:
        assert r.us == 10.0 and r.us_write == 20.0 and r.vs_ref == 4.0
        assert math.isclose(r.gbps, r.nbytes / 10.0 / 1e3) and math.isclose(r.pct_copy, r.gbps / 10.0)
        assert math.isclose(r.pct_copy_write, r.pct_copy / 2) and r.flops == 0 and r.tflops is None
    ref = [r for r in rows if r.impl == "reference-compiled"]
    assert all(r.us == 40.0 and r.vs_ref == 1.0 and r.compile_s is not None and r.check == "match" for r in ref)
    assert {r.note for r in rows if r.op == "columnwise" and r.shape == "2x32x64"} == {"2-D view 64x64"}
    assert all(r.floor_bytes == 0 and r.pct_floor is None for r in rows)  # (quantize cases have no weight floor)

    @dataclasses.dataclass(frozen=True)
    class Floored(type(cases[0])):  # a case with a weight-bytes floor (GemmCase's floor_bytes)
        def floor_bytes(self) -> int:
            return 3000

    rows = timing.run_cases([Floored(**{f.name: getattr(cases[0], f.name) for f in dataclasses.fields(cases[0])})],
                            _ctx(), impls, log=lambda _: None)
    # 3000 bytes in 10 µs (mxkit) / 40 µs (the reference) at the context's 1000 GB/s copy: 0.3 / 0.075 GB/s
    assert [r.pct_floor for r in rows] == [pytest.approx(0.03), pytest.approx(0.0075)]


def test_compiled_peers_are_per_shape_and_never_dynamic(monkeypatch):
    """Issue #23: with the shape-generic compile (dynamic=True) every reference-compiled row of ``mxkit bench
    quantize`` was n/a on torch 2.11 ("RuntimeError when making fake tensor call"). Each compiled peer is one
    ``torch.compile(..., dynamic=False)`` per (op, format, shape). Compiled for real here with backend aot_eager
    (dynamo and fake tensors, no C++ compiler needed) and byte-checked against the eager reference."""
    seen = []
    real_compile = torch.compile

    def recording(fn, **kw):
        seen.append(kw)
        return real_compile(fn, **dict(kw, backend="aot_eager"))

    monkeypatch.setattr(torch, "compile", recording)
    ctx = _ctx(compile=True)
    impls = {"mxkit": bq.IMPLS["mxkit"], "reference-compiled": bq.IMPLS["reference-compiled"]}
    cases = bq.plan_cases(("rowwise", "dequantize"), ["mxfp4_e2m1"], [(64, 64), (32, 128)], BF16)
    rows = timing.run_cases(cases, ctx, impls, log=lambda s: None)
    ref = [r for r in rows if r.impl == "reference-compiled"]
    assert all(r.status == "ok" and r.check == "match" and r.compile_s is not None for r in ref), ref
    assert seen == [{"dynamic": False}] * len(cases)
    assert sorted(shape for _, shape in ctx.compiled) == [(32, 128), (32, 128), (64, 64), (64, 64)]
    # the same case again reuses its compiled function
    timing.bench_case(cases[0], ctx, impls)
    assert len(seen) == len(cases)


def test_unavailable_and_failing_impls_become_rows():
    def missing(case, inp, ctx):
        raise ModuleNotFoundError("No module named 'mxkit.kernels.quantize'")

    def boom(case, inp, ctx):
        def fn():
            raise RuntimeError("illegal memory access\nmore")
        return fn

    def wrong(case, inp, ctx):  # right shapes, wrong bytes: the reference of a different tensor
        x = inp.x + 1
        return lambda: mxkit.quantize(x, case.fmt, axis=case.axis, backend="reference")

    Impl = timing.Impl
    impls = {"mxkit": Impl("mxkit", wrong, checked=True), "gone": Impl("gone", missing),
             "crash": Impl("crash", boom), "compiled-crash": Impl("compiled-crash", boom, compiled=True),
             "skip": Impl("skip", lambda c, i, x: (_ for _ in ()).throw(BenchUnavailable("torchao absent")))}
    case = bq.Case("rowwise", get_format("mxfp4"), (64, 64))
    rows = {r.impl: r for r in timing.bench_case(case, _ctx(impls=tuple(impls)), impls)}
    assert rows["mxkit"].check == "MISMATCH" and rows["mxkit"].status == "ok"
    assert rows["gone"].status == "n/a" and "ModuleNotFoundError: No module named" in rows["gone"].note
    assert rows["crash"].status == "error" and rows["crash"].note == "error: RuntimeError: illegal memory access"
    assert rows["compiled-crash"].status == "n/a" and rows["compiled-crash"].note.startswith("torch.compile failed")
    assert rows["skip"].status == "n/a" and rows["skip"].note == "torchao absent"
    assert all(rows[k].us is None and rows[k].gbps is None for k in ("gone", "crash", "compiled-crash", "skip"))


def test_unbounded_peer_reports_its_error_without_a_check():
    """A peer of other numerics (``bounded=False``: ``scaled-mm-fp8``, FP8 rowwise casts of the MX values) keeps
    its error and no check or bound, where a bounded impl past the same bound is FAIL."""
    from mxkit.bench import gemm as bg

    class Case:  # the attributes bench_case reads, a numerics check that always misses its bound
        op, fmt_name, label, dtype, note, flops = "ready", "w4a16", "1x8x32", BF16, "", 16

        def invalid_reason(self):
            return None

        def nbytes(self):
            return 64

        def make_inputs(self, ctx):
            return None

        def expected(self, inputs):
            return None

        def check(self, out, expected):
            return {"err": 0.04, "err_bound": 0.002, "check": "FAIL"}

    Impl = timing.Impl
    make = lambda c, i, x: lambda: None  # noqa: E731
    impls = {"mxkit": Impl("mxkit", make, checked=True), "fp8": Impl("fp8", make, checked=True, bounded=False)}
    rows = {r.impl: r for r in timing.bench_case(Case(), _ctx(impls=tuple(impls)), impls)}
    assert (rows["mxkit"].check, rows["mxkit"].err_bound) == ("FAIL", 0.002)
    assert (rows["fp8"].check, rows["fp8"].err, rows["fp8"].err_bound) == ("", 0.04, None)
    assert bg.IMPLS["scaled-mm-fp8"].bounded is False
    assert all(i.bounded for n, i in bg.IMPLS.items() if n != "scaled-mm-fp8")
    # a float: a sanity bound of the peer's own, in place of the case's (the MoE bench's bf16 peers)
    impls = {"mxkit": Impl("mxkit", make, checked=True), "loose": Impl("loose", make, checked=True, bounded=0.05),
             "tight": Impl("tight", make, checked=True, bounded=0.01)}
    rows = {r.impl: r for r in timing.bench_case(Case(), _ctx(impls=tuple(impls)), impls)}
    assert (rows["loose"].check, rows["loose"].err_bound) == ("ok", 0.05)
    assert (rows["tight"].check, rows["tight"].err_bound) == ("FAIL", 0.01)


def test_pooled_reference_and_one_time_steps():
    """pool_reference: a row's × over the median of the reference rows of its key (one problem timed in each case of
    a shape), its range over their fastest / slowest; rows with interleaved rounds keep theirs. time_once_made: a
    pack timed after one discarded timing."""
    Row = timing.Row
    rows = [Row(op="ready", fmt=p, shape="8x8x8", impl=i, us=u) for p, i, u in
            (("a", "cublas", 100.0), ("a", "mxkit", 50.0), ("b", "cublas", 120.0), ("b", "mxkit", 60.0),
             ("c", "cublas", 90.0))]
    rows += [Row(op="ready", fmt="a", shape="4x4x4", impl="cublas", us=10.0), Row(op="ready", fmt="a", shape="4x4x4",
             impl="mxkit", us=5.0, vs_ref=2.0), Row(op="ready", fmt="a", shape="9x9x9", impl="mxkit", us=5.0,
             vs_ref=3.0, vs_ref_lo=2.9, vs_ref_hi=3.1), Row(op="ready", fmt="a", shape="9x9x9", impl="cublas", us=15.0),
             Row(op="ready", fmt="b", shape="9x9x9", impl="cublas", us=16.0)]
    timing.pool_reference(rows, "cublas", key=lambda r: r.shape)
    a, b = rows[1], rows[3]
    assert (a.vs_ref, a.vs_ref_lo, a.vs_ref_hi) == (2.0, 1.8, 2.4) and b.vs_ref == pytest.approx(100 / 60)
    assert rows[0].vs_ref == 1.0 and rows[0].vs_ref_lo == 0.9  # (the peer's own rows against the pooled median)
    assert rows[6].vs_ref == 2.0 and rows[6].vs_ref_lo is None  # (one reference timing: the row's own)
    assert (rows[7].vs_ref, rows[7].vs_ref_lo) == (3.0, 2.9)  # (interleaved rounds kept)
    calls = []
    ctx = _ctx(time_fn=lambda fn: (calls.append(fn) or (len(calls) * 10.0, 0.0)))
    assert timing.time_once_made(ctx, lambda: None) == 20.0 and len(calls) == 2


def test_invalid_and_skipped_cases():
    f = get_format("mxfp8")
    rows = timing.bench_case(bq.Case("columnwise", f, (48, 64)), _ctx(), bq.IMPLS)
    assert [r.status for r in rows] == ["n/a", "n/a"] and "dim 0 = 48" in rows[0].note
    # an impl that does not cover a case is a "skip" row, kept out of the table's notes
    impls = dict(bq.IMPLS, **{"reference-compiled": timing.Impl("reference-compiled", bq.IMPLS["mxkit"].make,
                                                                skip=lambda c: "not this one")})
    rows = timing.bench_case(bq.Case("rowwise", f, (64, 64)), _ctx(), impls)
    assert rows[0].status == "ok" and (rows[1].status, rows[1].note, rows[1].us) == ("skip", "not this one", None)
    assert timing.summary_lines(rows)[0]["note"] == ""


def test_inputs_are_random_and_never_zero():
    case = bq.Case("dequantize", get_format("mxfp4"), (64, 128))
    a, b = bq.make_inputs(case, _ctx()), bq.make_inputs(case, _ctx())
    assert a.x.dtype is BF16 and a.x.shape == (64, 128) and torch.isfinite(a.x).all()
    assert (a.x != 0).float().mean() > 0.99 and not torch.equal(a.x, b.x)
    assert a.q is not None and a.q.shape == (64, 128)


def test_torchao_peer_wiring_on_cpu():
    pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    ctx = _ctx(impls=("mxkit", "torchao-compiled"))
    for op in bq.OPS:
        for fmt in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"):
            case = bq.Case(op, get_format(fmt), (64, 64), torch.float32)
            inp = bq.make_inputs(case, ctx)
            try:
                fn = bq.IMPLS["torchao-compiled"].make(case, inp, ctx)
            except BenchUnavailable as e:
                assert op == "dequantize" and fmt == "mxfp6_e2m3", e
                continue
            out = fn()
            if op == "dequantize":  # torchao decodes our bytes to the same values
                assert torch.equal(out, mxkit.dequantize(inp.q, torch.float32, backend="reference"))
            elif op == "rowwise" and fmt != "mxfp6_e2m3":  # same scale bytes as the OCP FLOOR reference
                ref = mxkit.quantize(inp.x, fmt, backend="reference")
                assert torch.equal(out[0].view(torch.uint8).reshape(ref.scale.shape), ref.scale)
                assert torch.equal(out[1].view(torch.uint8), ref.qdata)
    fp16 = bq.Case("rowwise", get_format("mxfp8"), (64, 64), torch.float16)
    with pytest.raises(BenchUnavailable, match="float16"):
        bq.IMPLS["torchao-compiled"].make(fp16, bq.make_inputs(fp16, ctx), ctx)


def test_scale_mode_reaches_every_impl():
    f = get_format("mxfp4")
    x = torch.randn(64, 64, dtype=BF16)
    x[:, 0] = 7.5  # amax 7.5: FLOOR gives 2^(2-2) = 1, EVEN rounds 7.5 up to 8 and gives 2^1
    inp = bq.Inputs(x)
    floor = mxkit.quantize(x, f, scale_mode="floor", backend="reference")
    for mode in ("floor", "even"):
        case = bq.Case("rowwise", f, (64, 64), BF16, mxkit.ScaleMode.parse(mode))
        want = mxkit.quantize(x, f, scale_mode=mode, backend="reference")
        for name in ("mxkit", "reference-compiled", "reference-eager"):
            out = bq.IMPLS[name].make(case, inp, _ctx())()
            assert torch.equal(out.scale, want.scale), (name, mode)
            # (check returns a dict, always true as a bool: its verdict is compared)
            assert case.check(out, case.expected(inp)) == {"check": "match"}, (name, mode)
        assert case.check(floor, case.expected(inp)) == {"check": "match" if mode == "floor" else "MISMATCH"}
    assert not torch.equal(want.scale, floor.scale)


def test_run_benchmark_end_to_end_on_cpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: (2000.0, 1600.0, 200_000_000))
    monkeypatch.setattr(timing, "time_us", lambda fn, cfg: (25.0, 30.0))
    args = _cli().parse_args(["bench", "quantize", "--shapes", "64x64", "--formats", "mxfp8,mxfp4",
                              "--peers", "reference-eager", "--backend", "reference", "--out", str(tmp_path),
                              "--plain", "--quick"])  # (--quick with no --rep-ms: the env records QUICK_REP_MS)
    cases = bq.cases_from_args(args)
    rc = timing.run_benchmark(args, cases, bq.IMPLS, what="t", stem="bench_quantize", peers=args.peers,
                              columns=bq.table_columns(args.peers), ref_impl="reference-eager", title="T",
                              device="cpu")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "copy limit: 2000 GB/s after a read flush, 1600 after a write flush" in out and "ref.eager µs" in out
    doc = json.loads((tmp_path / "bench_quantize.json").read_text())
    env, rows = doc["env"], [Row(**r) for r in doc["rows"]]
    assert env["copy_gbps"] == 2000.0 and env["copy_gbps_write"] == 1600.0 and "torch" in env and "date_utc" in env
    assert env["timing"]["l2_flush_bytes"] == timing.L2_FLUSH_BYTES and env["timing"]["min_runs"] == timing.MIN_RUNS
    assert env["timing"]["rep_ms"] == timing.QUICK_REP_MS and env["timing"]["warmup_ms"] > 0  # (not the null option)
    assert rows[0].impl == "copy" and len(rows) == 1 + 2 * len(cases)
    assert all(r.check == "match" and (r.us, r.us_write) == (25.0, 30.0) and r.vs_ref == 1.0 for r in rows[1:]), rows
    assert (tmp_path / "bench_quantize.csv").read_text().count("\n") == len(rows) + 1
    # the same run with a kernel that returns wrong bytes exits 1 and names the case
    wrong = dict(bq.IMPLS, mxkit=timing.Impl("mxkit", lambda c, i, x: lambda: "not an MXTensor", checked=True))
    rc = timing.run_benchmark(args, cases[:1], wrong, what="t", stem="b2", peers=(), columns=bq.table_columns(()),
                              ref_impl="reference-eager", title="T", device="cpu")
    assert rc == 1 and "rowwise/mxfp8_e4m3/64x64" in capsys.readouterr().err
    assert json.loads((tmp_path / "b2.json").read_text())["rows"][1]["check"] == "MISMATCH"


def test_copy_limit_timed_again_at_the_end(monkeypatch, tmp_path, capsys):
    """The copy limit is timed again after the cases (env copy_gbps_end); a drift past 3% is a warning."""
    monkeypatch.setattr(timing, "time_us", lambda fn, cfg: (25.0, 30.0))
    args = _cli().parse_args(["bench", "quantize", "--shapes", "64x64", "--formats", "mxfp8", "--ops", "rowwise",
                              "--peers", "none", "--backend", "reference", "--out", str(tmp_path), "--plain"])
    for limits, warned in (([2000.0, 2050.0], False), ([2000.0, 1900.0], True)):
        seq = iter(limits)
        monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: (next(seq), 1600.0, 200_000_000))
        assert _run_cpu(args, bq.IMPLS, stem="bench_quantize") == 0
        err = capsys.readouterr().err
        assert ("copy limit moved over the run: 2000 GB/s at the start, 1900 at the end" in err) == warned, err
        assert json.loads((tmp_path / "bench_quantize.json").read_text())["env"]["copy_gbps_end"] == limits[1]


def _run_cpu(args, impls, **kw) -> int:
    """run_benchmark on the CPU (copy limit and timer faked by the caller)."""
    return timing.run_benchmark(args, bq.cases_from_args(args), impls, what="t", stem=kw.get("stem", "b"),
                                peers=args.peers, columns=bq.table_columns(args.peers), ref_impl="reference-eager",
                                title="T", device="cpu")


def test_run_benchmark_fails_when_an_mxkit_row_raises(monkeypatch, capsys):
    """Exit status 1 when an mxkit row raised (status error: its output was never checked), naming the case;
    a peer that raises only fills its row (scripts/gpu_check.sh reads 0 as "every mxkit output ran and was
    checked")."""
    monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: (2000.0, 1600.0, 200_000_000))
    monkeypatch.setattr(timing, "time_us", lambda fn, cfg: (25.0, 30.0))
    args = _cli().parse_args(["bench", "quantize", "--shapes", "64x64", "--formats", "mxfp8", "--ops", "rowwise",
                              "--peers", "reference-eager", "--backend", "reference", "--plain"])

    def boom(case, inputs, ctx):
        raise RuntimeError("kernel exploded")

    assert _run_cpu(args, dict(bq.IMPLS, mxkit=timing.Impl("mxkit", boom, checked=True))) == 1
    out, err = capsys.readouterr()
    assert "RuntimeError: kernel exploded" in out
    assert err.endswith("\nmxkit: error: 1 mxkit row(s) raised: rowwise/mxfp8_e4m3/64x64\n")  # (after progress)
    peer = timing.Impl("reference-eager", boom, checked=True)
    assert _run_cpu(args, dict(bq.IMPLS, **{"reference-eager": peer})) == 0
    out, err = capsys.readouterr()
    assert "reference-eager: error: RuntimeError: kernel exploded" in out and "mxkit: error" not in err

    # an mxkit row that could not run (n/a: a kernel module that fails to import, a case a kernel no longer covers)
    # fails the run too; a peer's n/a does not
    def unavailable(case, inputs, ctx):
        raise NotImplementedError("no kernel for this case")

    assert _run_cpu(args, dict(bq.IMPLS, mxkit=timing.Impl("mxkit", unavailable, checked=True))) == 1
    assert capsys.readouterr().err.endswith("\nmxkit: error: 1 mxkit row(s) could not run: rowwise/mxfp8_e4m3/64x64\n")
    peer = timing.Impl("reference-eager", unavailable, checked=True)
    assert _run_cpu(args, dict(bq.IMPLS, **{"reference-eager": peer})) == 0


def _strict_json(text: str):
    """json.loads refusing the bare NaN / Infinity / -Infinity that strict JSON does not have."""
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_non_finite_numbers_are_null_in_json_and_shown_in_tables(tmp_path, capsys):
    """A NaN error (an output of NaNs) or an infinite ratio: null in the JSON, which stays strict; "nan" / "inf"
    in the table, where "n/a" means the value does not exist (the row did not run)."""
    from mxkit.bench import gemm as bg

    rows = [Row("ready", "bf16×mxfp4 (W4A16)", "4x32x64", "mxkit", us=1.0, err=math.nan, err_bound=1.8e-3,
                vs_ref=math.inf, check="FAIL")]
    path = output.write_json(rows, {"copy_gbps": math.nan}, tmp_path / "r.json", config={"x": (1.0, -math.inf)})
    doc = _strict_json(path.read_text())
    assert doc["rows"][0]["err"] is None and doc["rows"][0]["vs_ref"] is None
    assert doc["rows"][0]["err_bound"] == 1.8e-3 and doc["rows"][0]["us"] == 1.0
    assert doc["env"] == {"copy_gbps": None} and doc["config"] == {"x": [1.0, None]}
    assert [output.fmt_num(v, ".2e") for v in (math.nan, math.inf, -math.inf, None)] == ["nan", "inf", "-inf", "n/a"]
    text = output.render_table(timing.summary_lines(rows), bg.table_columns(()), plain=True)
    capsys.readouterr()
    line = text.splitlines()[-1].split()
    assert "nan" in line and "inf" in line and "FAIL" in line  # rel. err, × cuBLAS bf16
    assert "n/a" in line  # µs after the write flush: not measured


def test_out_that_is_not_a_writable_folder_is_refused_before_the_run(monkeypatch, tmp_path, capsys):
    """--out names a folder: an existing file there (or a place where nothing can be made) is one error line and
    exit status 2 before any timing, not an abort after the first case."""
    monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: pytest.fail("the run started"))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out in (afile, "/proc/mxkit-bench", tmp_path / "dangling"):
        args = _cli().parse_args(["bench", "quantize", "--shapes", "64x64", "--out", str(out)])
        assert _run_cpu(args, bq.IMPLS) == 2
        err = capsys.readouterr().err
        assert err.startswith("mxkit: error: --out ") and str(out) in err and err.count("\n") == 1, err
        assert "File exists" not in err  # (a dangling link's mkdir said so)
    assert afile.read_text() == "keep"
    with pytest.raises(SystemExit):  # ("" is the current folder to pathlib: refused as a usage error)
        _cli().parse_args(["bench", "quantize", "--out", ""])
    assert "argument --out: empty" in capsys.readouterr().err
    args = _cli().parse_args(["bench", "quantize", "--shapes", "64x64", "--out", str(tmp_path / "new" / "dir")])
    monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: (2000.0, 1600.0, 200_000_000))
    monkeypatch.setattr(timing, "time_us", lambda fn, cfg: (25.0, 30.0))
    args.peers, args.backend = ("reference-eager",), "reference"
    assert _run_cpu(args, bq.IMPLS, stem="bench_quantize") == 0  # a folder still to make is fine
    assert (tmp_path / "new" / "dir" / "bench_quantize.json").is_file()
    output.check_out_folder(tmp_path / "empty", ["a.csv", "a.json"])
    assert not (tmp_path / "empty").exists()  # the check leaves no files or folders behind (the writer makes them)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("flush", timing.FLUSH_MODES)
def test_cuda_event_bench_flush_modes_time_the_run(flush):
    # both flushes time the run itself: a 64 MiB copy takes longer than a 1 MiB one, and the copy is done
    src = torch.randn(32 << 20, device="cuda", dtype=torch.bfloat16)
    dst = torch.full_like(src, float("nan"))
    big = timing.cuda_event_bench(lambda: dst.copy_(src), 2.0, 10.0, spin_us=20.0, flush=flush)
    small = timing.cuda_event_bench(lambda: dst[:1 << 19].copy_(src[:1 << 19]), 2.0, 10.0, flush=flush)
    assert math.isfinite(big) and 0 < small < big
    assert torch.equal(dst.view(torch.int16), src.view(torch.int16))


# --------------------------------------------------------------------------------------------------------
# BENCHMARKS.md's result tables against the runs they name


def _bench_table_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_table.py"
    spec = importlib.util.spec_from_file_location("bench_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_missing_ids_leaves_out_only_what_passed_or_skipped(tmp_path, monkeypatch, capsys):
    """scripts/gpu_missing_ids.py: a test the JUnit XML records as passed or skipped is done; one that failed,
    errored, or is not in it (a budget cut it off) is run again; ids come from the matrix the run used."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_missing_ids.py"
    spec = importlib.util.spec_from_file_location("gpu_missing_ids", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    xml = tmp_path / "pytest_gpu.xml"
    xml.write_text("""<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.kernel_tests.test_a" name="test_ok[1-x]" time="1"/>
<testcase classname="tests.test_b" name="test_skip" time="0"><skipped message="needs two CUDA devices"/></testcase>
<testcase classname="tests.test_b" name="test_fail" time="1"><failure message="assert"/></testcase>
<testcase classname="tests.test_b" name="test_error" time="1"><error message="boom"/></testcase>
<testcase classname="" name="" time="0"/>
</testsuite></testsuites>""")
    assert mod.passed_ids(str(xml)) == {"tests/kernel_tests/test_a.py::test_ok[1-x]", "tests/test_b.py::test_skip"}
    # MXKIT_GPU_FULL unset: the matrix whose ids the run holds is taken (the other's would not be found)
    matrices = {"1": ["tests/kernel_tests/test_a.py::test_ok[1-x-full]", "tests/test_b.py::test_skip"],
                "0": ["tests/kernel_tests/test_a.py::test_ok[1-x]", "tests/test_b.py::test_skip",
                      "tests/test_b.py::test_fail"]}
    monkeypatch.setattr(mod, "collect", matrices.get)
    monkeypatch.delenv("MXKIT_GPU_FULL", raising=False)
    assert mod.main([str(xml)]) == 0
    assert capsys.readouterr().out.split() == ["tests/test_b.py::test_fail"]
    monkeypatch.setenv("MXKIT_GPU_FULL", "1")
    assert mod.main([str(xml)]) == 0
    assert capsys.readouterr().out.split() == ["tests/kernel_tests/test_a.py::test_ok[1-x-full]"]
    # the matrix gpu_check.sh logged beside the XML; a tie without either refuses to guess
    monkeypatch.delenv("MXKIT_GPU_FULL")
    (tmp_path / "gpu_check.log").write_text("[10:34:44 +24s] stage 1: pytest -m gpu -n 8 (budget 280 s, "
                                            "MXKIT_GPU_FULL=1, 1 paths or ids)\n")
    assert mod.main([str(xml)]) == 0
    assert capsys.readouterr().out.split() == ["tests/kernel_tests/test_a.py::test_ok[1-x-full]"]
    (tmp_path / "gpu_check.log").unlink()
    matrices["1"] = matrices["0"][:2] + ["tests/test_b.py::test_fail[full]"]
    assert mod.main([str(xml)]) == 2
    assert "set MXKIT_GPU_FULL" in capsys.readouterr().err


def test_benchmarks_md_tables_are_their_runs(tmp_path):
    """Each GPU result table in BENCHMARKS.md ("**H200** (`folder/`...", "**H100** (...") is exactly what
    scripts/bench_table.py makes of the folder it names; and bench_table refuses a run with a missing or
    mismatching row."""
    import re
    from pathlib import Path

    bt = _bench_table_module()
    root = Path(__file__).resolve().parents[1]
    lines = (root / "BENCHMARKS.md").read_text().split("\n")
    heads = [(i, m.group(1)) for i, line in enumerate(lines)
             if (m := re.match(r"\*\*H[12]00\*\* \(`([^`]+)/`", line))]
    assert len(heads) == 2, heads
    for i, folder in heads:
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("| op |"))
        got = lines[j + 2:j + 14]
        assert lines[j] == bt.HEADER and got == bt.table_rows(root / "benchmarks" / folder), folder
    # a run whose output differed from the reference, or without its JSON, is refused
    src = root / "benchmarks" / heads[0][1]
    with pytest.raises(OSError):
        bt.table_rows(tmp_path)
    doc = json.loads((src / "bench_quantize.json").read_text())
    (tmp_path / "bench_quantize.json").write_text(json.dumps(doc))
    assert bt.table_rows(tmp_path) == bt.table_rows(src)
    next(r for r in doc["rows"] if r["impl"] == "mxkit" and r["shape"] == "8192x8192")["check"] = "MISMATCH"
    (tmp_path / "bench_quantize.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="no matching mxkit row"):
        bt.table_rows(tmp_path)
    assert bt.main([str(tmp_path)]) == 1


def test_environment_names_the_commit():
    """The JSON's environment holds mxkit's commit (``+dirty`` with uncommitted changes), None outside a checkout."""
    from mxkit.bench import output

    env = output.environment()
    root = pathlib.Path(output.__file__).resolve().parents[3]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        assert env["commit"] is None
    else:
        assert env["commit"].split("+")[0] == head.stdout.strip() and "commit" in output.env_line(env)


def test_installed_copy_names_no_other_repositorys_commit(tmp_path, monkeypatch):
    """An installed mxkit (site-packages inside some project's git repository, e.g. its .venv) reports no commit:
    git walked up from lib/python3.X and named the enclosing repository's HEAD."""
    from mxkit.bench import output

    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("no git")
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "mxkit" / "bench"
    site.mkdir(parents=True)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "other"], check=True)
    monkeypatch.setattr(output, "__file__", str(site / "output.py"))
    assert output._git_commit() is None


def test_event_timing_spin_covers_the_host_enqueue_of_many_launches(monkeypatch):
    """cuda_event_bench on a simulated stream (host clock h, GPU busy-until g, in µs): a callable of 30 launches
    (2 µs of GPU, 10 µs of host each) reads its 60 µs of device time (the spin lengthened to 1.5x the host's 300
    µs; at the fixed 100 µs it read 139), one of a single 20 µs kernel its 20 µs, a GPU-bound one its device time;
    every timed run (start event, fn's launches, end event) comes after its own flush (and spin), in both modes."""
    import types

    S = {"h": 0.0, "g": 0.0}
    log = []  # what reached the stream: "flush", "sleep", "rec" (an event), "k" (one of fn's kernels)

    def launch(gpu_us, host_us=5.0, what="k"):
        log.append(what)
        S["h"] += host_us
        S["g"] = max(S["g"], S["h"]) + gpu_us

    class Ev:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            log.append("rec")
            S["h"] += 2.0
            self.t = S["g"] = max(S["g"], S["h"])

        def elapsed_time(self, other):
            return (other.t - self.t) / 1e3

    cuda = types.SimpleNamespace(Event=Ev, synchronize=lambda: S.__setitem__("h", max(S["h"], S["g"]) + 5.0),
                                 _sleep=lambda cycles: launch(cycles / 2000.0, what="sleep"),
                                 get_device_properties=lambda i: types.SimpleNamespace(clock_rate=2_000_000),
                                 current_device=lambda: 0)
    buf = types.SimpleNamespace(zero_=lambda: launch(90.0, what="flush"))
    monkeypatch.setattr(timing, "torch", types.SimpleNamespace(cuda=cuda, int32=None, int64=None,
                                                               zeros=lambda *a, **k: buf, empty=lambda *a, **k: None,
                                                               sum=lambda *a, **k: launch(70.0, what="flush")))
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: S["h"] / 1e6))
    for kernels, gpu_us, host_us in ((30, 2.0, 10.0), (1, 20.0, 8.0), (60, 20.0, 10.0)):
        def fn():
            for _ in range(kernels):
                launch(gpu_us, host_us)
        for flush in ("read", "write"):
            log.clear()
            got = timing.cuda_event_bench(fn, 2.0, 20.0, spin_us=100.0, flush=flush)
            assert got == pytest.approx(kernels * gpu_us), (kernels, flush, got)
            recs = [i for i, w in enumerate(log) if w == "rec"]
            timed = [i for i, j in zip(recs, recs[1:]) if j > i + 1 and set(log[i + 1:j]) == {"k"}]
            assert len(timed) >= timing.MIN_RUNS, (kernels, flush)
            for i in timed:
                assert [w for w in log[:i] if w != "sleep"][-1] == "flush" and log[i - 1] == "sleep", (kernels, i)



def test_bench_table_option_runs_under_the_given_dispatch_table(tmp_path, capsys, monkeypatch):
    """`mxkit bench gemm|moe|overhead|decode --table FILE` runs the bench under that dispatch table merged field by
    field into the packaged one (a key or field the file lacks keeps the packaged GPU entry's value, not the
    "default" entry's) and names the file in the environment; without it, the packaged table; a file that is not a
    table is one error line (exit 2) before the bench runs; an edited copy of the packaged file (its "_doc" note)
    is a table; quantize (no GEMM) has no such option."""
    from mxkit.kernels import matmul_table as mt

    seen = []

    def run(args):
        seen.append((mt.gemm_table(), output.environment()["gemm_table"]))
        return 0

    fakes = {n: types.SimpleNamespace(NAME=n, HELP=n, add_arguments=lambda p: None, run=run)
             for n in ("gemm", "quantize")}
    monkeypatch.setattr(bench, "registry", lambda modules=bench.BENCH_MODULES: fakes)
    h200 = mt._packaged_table()["NVIDIA H200"]
    table = {"NVIDIA H200": {"moe": {"mma_strips": 4}, "_measured": "x"}, "NVIDIA Fake": {"decode_mma": {"max_m": 3}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    assert cli.main(["bench", "gemm", "--table", str(tmp_path / "t.json")]) == 0
    got, source = seen[-1]
    assert source == str((tmp_path / "t.json").resolve()) and got["NVIDIA Fake"]["decode_mma"]["max_m"] == 3
    assert dict(got["NVIDIA H200"]["moe"]) == {**h200["moe"], "mma_strips": 4}  # (its other fields kept)
    assert all(got["NVIDIA H200"][k] == v for k, v in h200.items() if k not in ("moe", "_measured"))
    assert mt.gemm_table() is mt._packaged_table() and output.environment()["gemm_table"] == "packaged"
    assert cli.main(["bench", "gemm"]) == 0 and seen[-1] == (mt._packaged_table(), "packaged")
    packaged = json.loads(mt._TABLE_FILE.read_text())  # an edited copy of the packaged file
    packaged["default"]["decode_mma"]["max_m"] = 5
    (tmp_path / "copy.json").write_text(json.dumps(packaged))
    assert cli.main(["bench", "gemm", "--table", str(tmp_path / "copy.json")]) == 0
    assert seen[-1][0]["default"]["decode_mma"]["max_m"] == 5
    with pytest.raises(SystemExit):  # (argparse: no such option)
        cli.main(["bench", "quantize", "--table", "t.json"])
    capsys.readouterr()
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "int.json").write_text('{"NVIDIA H200": {"decode_mma": 32}}')
    n = len(seen)
    for bad, msg in (("list.json", "is not a dispatch table"), ("none.json", "cannot be read as a JSON"),
                     ("int.json", "'NVIDIA H200' / 'decode_mma' is not a mapping of fields")):
        assert cli.main(["bench", "gemm", "--table", str(tmp_path / bad)]) == 2 and len(seen) == n
        err = capsys.readouterr().err
        assert err.startswith("mxkit: error: --table") and err.count("\n") == 1 and msg in err, err
    env = dict(output.environment(), gemm_table="t.json")
    assert output.env_line(env).endswith("| gemm_table t.json")
    assert "gemm_table" not in output.env_line(output.environment())


def test_merge_tables_field_by_field():
    """merge_tables: a GPU's key in the second table replaces the fields it names and keeps the first's others;
    new keys, GPUs and notes are added; the first table is not changed."""
    from mxkit.kernels.matmul_table import merge_tables

    base = {"_doc": "d", "A": {"k": {"x": 1, "y": 2}, "j": {"z": 3}, "_measured": "old"}, "default": {"k": {"x": 0}}}
    over = {"A": {"k": {"y": 5, "w": 6}, "n": {"q": 1}, "_measured": "new"}, "B": {"k": {"x": 9}}, "_doc": "e"}
    got = merge_tables(base, over)
    assert got == {"_doc": "e", "A": {"k": {"x": 1, "y": 5, "w": 6}, "j": {"z": 3}, "n": {"q": 1}, "_measured": "new"},
                   "default": {"k": {"x": 0}}, "B": {"k": {"x": 9}}}
    assert base["A"] == {"k": {"x": 1, "y": 2}, "j": {"z": 3}, "_measured": "old"}


def test_names_on_the_command_line_are_taken_in_any_case():
    """Bench and tune choices are taken in any case and returned as the code spells them, as --formats MXFP4 and
    --scale-mode FLOOR were (bench --pairs / --models / --dtype and tune --stages refused upper case)."""
    from mxkit.tune import check_stages

    parse = timing.choice("model", ("gpt-oss-20b", "gpt-oss-120b"))
    assert parse("GPT-OSS-20B") == "gpt-oss-20b" and parse("gpt-oss-120b") == "gpt-oss-120b"
    with pytest.raises(timing.ChoiceError, match="unknown model 'gpt-oss-7b'"):
        parse("gpt-oss-7b")
    assert check_stages(["MOE", "Decode_MMA"]) == ("decode_mma", "moe")
    with pytest.raises(ValueError, match="named twice"):
        check_stages(["moe", "MOE"])
    assert check_stages("MOE") == ("moe",)  # (one name: it said "unknown tune stage 'm'")
    args = _cli().parse_args(["bench", "quantize", "--dtype", "BF16", "--ops", "ROWWISE"])
    assert args.dtype == torch.bfloat16 and args.ops == ("rowwise",)


def test_decode_device_help_says_compiled_runs_on_cpu():
    """`mxkit bench decode --device cpu` takes --modes compiled (torch.compile, no CUDA graph): its help and the
    graphs error name it (they said "eager only" / "use --modes eager")."""
    import argparse

    from mxkit.bench import decode

    p = argparse.ArgumentParser()
    decode.add_arguments(p)
    device = next(a for a in p._actions if a.dest == "device")
    assert "compiled" in device.help and "eager only" not in device.help
    args = p.parse_args(["--model", "tiny-llama", "--device", "cpu", "--modes", "eager,compiled"])
    decode.resolve(args)  # (the CPU run's checks pass)
    args = p.parse_args(["--model", "tiny-llama", "--device", "cpu", "--modes", "graphs"])
    with pytest.raises(ValueError, match="use --modes eager or compiled on CPU"):
        decode.resolve(args)
