"""scripts/ on CPU: the A/B tool's variant parsing and its clear exit without the config override hook, the
gpu_check summary on a kept run folder and on overhead / decode files, and gpu_check.sh's syntax and stage
switches."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ab_variants_and_missing_override(monkeypatch, tmp_path):
    ab = _script("ab")
    assert ab.parse_variant("base") == ("base", {})
    assert ab.parse_variant("t:block_r=4,num_warps=2,flag=true,mode=fast") == (
        "t", {"block_r": 4, "num_warps": 2, "flag": True, "mode": "fast"})
    assert ab.parse_variant(":x=null") == ("base", {"x": None})
    with pytest.raises(argparse.ArgumentTypeError, match="not field=value"):
        ab.parse_variant("t:block_r")
    with ab.override({}):  # the default config needs no hook
        pass
    # the fields go to the op family's argument of the hook; "table" replaces the per-GPU table
    seen = []

    def hook(*, table=None, quantize=None, dequantize=None):
        seen.append((table, quantize, dequantize))
        return ab.contextlib.nullcontext()

    monkeypatch.setitem(sys.modules, "mxkit.kernels.opt_flags", types.SimpleNamespace(override=hook))
    with ab.override({"block_r": 4, "table": []}, "columnwise"), ab.override({"block_n": 8}, "dequantize"):
        pass
    assert seen == [((), {"block_r": 4}, None), (None, None, {"block_n": 8})]
    # a GEMM variant is a dispatch table through gemm_table_override (opt_flags has no GEMM fields: table=[] there
    # timed the same kernels twice); any other field, or a table that is no mapping / file, exits
    from mxkit.kernels import matmul_table

    with ab.override({"table": {}}, "gemm"):  # {}: the packaged defaults alone
        assert dict(matmul_table.gemm_table()) == {}
    # a table of some keys (a mapping or a file) is merged into the packaged one field by field
    packaged = matmul_table._packaged_table()
    with ab.override({"table": {"NVIDIA H200": {"moe": {"mma_strips": 4}}}}, "gemm"):
        got = matmul_table.gemm_table()
        assert dict(got["NVIDIA H200"]["moe"]) == {**packaged["NVIDIA H200"]["moe"], "mma_strips": 4}
        assert got["NVIDIA H200"]["decode_mma"] == packaged["NVIDIA H200"]["decode_mma"]
    (tmp_path / "t.json").write_text('{"NVIDIA Fake": {"decode_mma": {"max_m": 2}}}')
    with ab.override({"table": str(tmp_path / "t.json")}, "gemm"):
        assert matmul_table.gemm_table()["NVIDIA Fake"]["decode_mma"]["max_m"] == 2 and "default" in matmul_table.gemm_table()
    (tmp_path / "bad.json").write_text('{"NVIDIA Fake": {"decode_mma": 2}}')
    with pytest.raises(SystemExit, match="not a mapping of fields"):
        ab.override({"table": str(tmp_path / "bad.json")}, "gemm")
    for bad in ({"block_m": 64}, {"table": []}):
        with pytest.raises(SystemExit, match="GEMM variant"):
            ab.override(bad, "gemm")
    monkeypatch.setitem(sys.modules, "mxkit.kernels.opt_flags", None)  # the hook is not importable
    with pytest.raises(SystemExit, match=r"variants need mxkit\.kernels\.opt_flags\.override"):
        ab.override({"block_r": 4})


def test_ab_refuses_bad_options_before_any_work(tmp_path, capsys):
    """--rounds 0, a negative --spin-us / --rep-ms, two variants of one name (':' alone is 'base': their rows were
    merged), an --out that is a file: a usage error before any timing (a GPU is not needed to get it)."""
    ab = _script("ab")
    (tmp_path / "f").write_text("")
    base = ["--op", "rowwise", "--formats", "mxfp4", "--shapes", "64x64"]
    for extra, message in ((["--variant", "base", "--rounds", "0"], "rounds"),
                           (["--variant", "base", "--spin-us", "-100"], "spin-us"),
                           (["--variant", "base", "--rep-ms", "-5"], "rep-ms"),
                           (["--variant", "base", "--variant", ":block_r=2"], "names must differ"),
                           (["--variant", "base", "--out", str(tmp_path / "f")], "is a file")):
        with pytest.raises(SystemExit) as e:
            ab.main(base + extra)
        assert e.value.code == 2 and message in capsys.readouterr().err, extra


def test_gpu_summary_on_a_kept_run(capsys):
    summary = _script("gpu_summary")
    run = ROOT / "benchmarks" / "h100-2026-11-24"
    assert summary.main([str(run), "560"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("==== gpu_check summary (560 s) ====")
    assert "488 passed, 0 failed" in out and "24 mxkit rows, 0 n/a or error, 0 byte mismatches" in out
    assert sum(" match" in line for line in out.splitlines()) == 24  # 12 op x format at two shapes
    assert "bench_gemm: NVIDIA H100" in out and sum(" fold-fp8 " in line for line in out.splitlines()) == 16
    assert "bench_moe: NVIDIA H100" in out and sum(line.startswith("w4a16 ") for line in out.splitlines()) == 24
    assert "bench_overhead: NVIDIA H100" in out and "bench_decode: NVIDIA H100" in out


def test_gpu_summary_counts_a_cut_off_run(capsys):
    """A run its budget stopped (pytest-xdist interrupted): the nameless testcases JUnit keeps for the tests the
    workers were in are counted as cut off, not as passes (pytest itself said 120 passed)."""
    run = ROOT / "benchmarks" / "h100-2026-12-06r" / "full_matrix_rest"
    assert _script("gpu_summary").main([str(run)]) == 0
    assert "tests (-m gpu): 120 passed, 0 failed, 0 errors, 0 skipped, 8 cut off while running" in \
        capsys.readouterr().out.splitlines()


def test_gpu_summary_of_overhead_and_decode(tmp_path, capsys):
    from mxkit.bench import decode, output, overhead

    env = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date_utc": "2026-11-24T10:00:00Z"}
    output.write_json([overhead.OverheadRow("torch x * 2", "256x1024", 12.0, 13.0, 2.0, 1.0, True),
                       overhead.OverheadRow("quantize mxfp4", "256x1024", 30.0, 33.0, 4.0, 2.5, False),
                       overhead.OverheadRow("dequantize mxfp4", "256x1024", status="error", note="RuntimeError: x")],
                      env, tmp_path / "bench_overhead.json")
    output.write_json([decode.DecodeRow("llama-3-8b", "bf16", 1, "graphs", 4, 8, 16, 4.0, 250.0, 1.0),
                       decode.DecodeRow("llama-3-8b", "mxfp4_e2m1", 1, "graphs", 4, 8, 16, 1.6, 625.0, 2.5,
                                        "decode-w4a16")], env, tmp_path / "bench_decode.json")
    assert _script("gpu_summary").main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "bench_overhead: NVIDIA H200; torch 2.11, triton 3.6; 2026-11-24T10:00:00Z" in out
    assert any(line.startswith("quantize mxfp4") and line.split()[-1] == "2.50" for line in out)
    assert any(line.startswith("dequantize mxfp4") and "[error: RuntimeError: x]" in line for line in out)
    assert "overhead: 1 of 3 calls within 1.5x the torch op, 1 raised" in out
    assert "decode: llama-3-8b, 4 layers, prompt 8, 16 tokens" in out
    assert any(line.split() == ["mxfp4_e2m1", "1", "graphs", "1.60", "625", "2.50", "decode-w4a16"] for line in out)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_runs_its_stages_without_a_gpu(tmp_path):
    script = ROOT / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"OUT": str(tmp_path), "MXKIT_SKIP_TESTS": "1", "MXKIT_SKIP_GEMM": "1", "MXKIT_SKIP_DECODE": "1",
           "MXKIT_TUNE": "1", "MXKIT_SANITIZE": "1", "MXKIT_SANITIZE_BUDGET": "20", "CUDA_VISIBLE_DEVICES": "",
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=300)
    summary = (tmp_path / "summary.txt").read_text()
    assert r.returncode == 1  # the benchmarks cannot run here: rc 2, so the check fails, and says so last
    assert "tests: skipped (MXKIT_SKIP_TESTS=1)" in summary and "bench quantize: rc 2" in summary
    assert "bench gemm: skipped (MXKIT_SKIP_GEMM=1)" in summary and "bench overhead: rc 2" in summary
    assert "bench decode: skipped (MXKIT_SKIP_DECODE=1)" in summary
    # the sanitizer is its own pytest run: it runs with the tests skipped (it was skipped, the summary saying
    # "MXKIT_SANITIZE=1 runs it"); here it fails, with no compute-sanitizer or GPU
    assert "compute-sanitizer: rc " in summary and "not run" not in summary.split("compute-sanitizer:")[1][:12]
    assert "tune: rc 2" in summary and "needs a CUDA GPU" in (tmp_path / "tune.log").read_text()
    assert "needs a CUDA GPU" in (tmp_path / "gpu_check.log").read_text()
    assert r.stdout.rstrip().endswith(summary.rstrip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_keeps_time_only_for_stages_that_run(tmp_path):
    """A benchmark stage's budget keeps 30 s for each later stage that will run, none for a skipped one: the
    overhead stage alone in a 90 s check gets its whole 45 s (it got 37, keeping 30 for the skipped decode stage,
    and ran out of time on an H100)."""
    env = {"OUT": str(tmp_path), "MXKIT_WALL_BUDGET": "90", "CUDA_VISIBLE_DEVICES": "",
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           **{f"MXKIT_SKIP_{s}": "1" for s in ("TESTS", "QUANTIZE", "GEMM", "MOE", "DECODE")}}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True, env=env,
                   timeout=300)
    assert "bench overhead: python3 -m mxkit bench overhead (budget 45 s)" in (tmp_path / "gpu_check.log").read_text()


def test_ab_enters_the_real_hook():
    ab = _script("ab")
    with ab.override({"rblocks": 1, "table": []}, "rowwise"), ab.override({"num_warps": 4}, "dequantize"):
        pass
