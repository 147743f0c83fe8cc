"""The MXKIT_* switches (README.md's environment table) take only their documented values: anything else raises a
ValueError naming the variable where it is read (``true`` for a 0 / 1 switch left the path on, or, read as a block
size list, turned the persistent schedule off). Also the dispatch table's and opt_flags' entry checks. CPU only."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxkit import cli
from mxkit.kernels import _env, fast_call, fast_launch, opt_flags
from mxkit.kernels.cuda_driver import shipped_ptx_unavailable
from mxkit.kernels.matmul_details import _fp8_wgmma, _mma_a8w8, _w4a16_wgmma
from mxkit.kernels.matmul_table import check_table
from mxkit.kernels.moe_details._prefill import block_plan, wgmma_block_m

CUDA0 = torch.device("cuda", 0)  # (only its type is read before the switch)


def test_choice_and_number(monkeypatch):
    monkeypatch.delenv("MXKIT_TEST_SWITCH", raising=False)
    assert _env.choice("MXKIT_TEST_SWITCH", ("0", "1")) is None
    assert _env.choice("MXKIT_TEST_SWITCH", ("0", "1", "fit"), "fit") == "fit"
    assert _env.number("MXKIT_TEST_SWITCH", "128", float) == 128.0
    for v, want in (("", None), ("0", "0"), ("1", "1")):
        monkeypatch.setenv("MXKIT_TEST_SWITCH", v)
        assert _env.choice("MXKIT_TEST_SWITCH", ("0", "1")) == want
    for v in ("true", "off", " 1", "01"):
        monkeypatch.setenv("MXKIT_TEST_SWITCH", v)
        with pytest.raises(ValueError, match=rf"MXKIT_TEST_SWITCH={v!r}: expected 0 or 1 \(or unset\)"):
            _env.choice("MXKIT_TEST_SWITCH", ("0", "1"))
    monkeypatch.setenv("MXKIT_TEST_SWITCH", "64")
    assert _env.number("MXKIT_TEST_SWITCH", "0", int, (32, 64)) == 64
    for v in ("abc", "-1", "nan", "inf", "1.5"):
        monkeypatch.setenv("MXKIT_TEST_SWITCH", v)
        with pytest.raises(ValueError, match=rf"MXKIT_TEST_SWITCH={v!r}: expected a finite int >= 0"):
            _env.number("MXKIT_TEST_SWITCH", "0", int)
    monkeypatch.setenv("MXKIT_TEST_SWITCH", "100")
    with pytest.raises(ValueError, match=r"MXKIT_TEST_SWITCH='100': expected one of 32, 64 \(or unset\)"):
        _env.number("MXKIT_TEST_SWITCH", "0", int, (32, 64))


def test_wgmma_schedule_switches(monkeypatch):
    monkeypatch.setenv("MXKIT_WGMMA_PERSIST", "128, 256")  # (a space after the comma: 256 was left out)
    assert _w4a16_wgmma._persist(False, 256) and _w4a16_wgmma._persist(False, 128)
    assert not _w4a16_wgmma._persist(True, 64)
    for v, on in (("0", False), ("1", True)):
        monkeypatch.setenv("MXKIT_WGMMA_PERSIST", v)
        assert _w4a16_wgmma._persist(not on, 128) is on
    for v in ("true", "on", "128,abc", "100", ","):
        monkeypatch.setenv("MXKIT_WGMMA_PERSIST", v)
        with pytest.raises(ValueError, match=rf"MXKIT_WGMMA_PERSIST={v!r}: expected 0, 1 or block sizes"):
            _w4a16_wgmma._persist(True, 256)
    monkeypatch.setenv("MXKIT_WGMMA_WS", "true")
    with pytest.raises(ValueError, match="MXKIT_WGMMA_WS='true'"):
        _w4a16_wgmma._ws(128, False)
    for v, on in (("0", False), ("1", True)):
        monkeypatch.setenv("MXKIT_WGMMA_WS", v)
        assert _w4a16_wgmma._ws(128, False) is on


@pytest.mark.parametrize("name, read", [
    ("MXKIT_W4A16_WGMMA", lambda: _w4a16_wgmma.available(CUDA0)),
    ("MXKIT_FP8_WGMMA", lambda: _fp8_wgmma.available(CUDA0)),
    ("MXKIT_A8W8_BULK", lambda: _mma_a8w8.bulk_unavailable.__wrapped__(0)),
    ("MXKIT_MMA_DECODE", lambda: shipped_ptx_unavailable.__wrapped__("x.ptx", 0, (9, 0), "test")),
    ("MXKIT_FAST_LAUNCH", lambda: fast_launch.module.__wrapped__()),
])
def test_off_switches(monkeypatch, name, read):
    """The 0 = off switches: 0 turns the path off (the reason names it), false / off / no raise (they left it on)."""
    monkeypatch.setenv(name, "0")
    got = read()
    assert got is None or got == f"{name}=0"
    for v in ("false", "off", "no"):
        monkeypatch.setenv(name, v)
        with pytest.raises(ValueError, match=rf"{name}={v!r}: expected 0 or 1"):
            read()


def test_fast_call_switch(monkeypatch):
    monkeypatch.setattr(fast_call, "_state", {"module": None, "thread": None})
    monkeypatch.setattr(fast_call, "_ready", fast_call.threading.Event())
    monkeypatch.setenv("MXKIT_FAST_CALL", "false")
    with pytest.raises(ValueError, match="MXKIT_FAST_CALL='false'"):
        fast_call.module(wait=True)
    monkeypatch.setenv("MXKIT_FAST_CALL", "0")
    assert fast_call.module(wait=True) is None and fast_call._state["thread"] is False


def test_moe_block_plan_switches(monkeypatch):
    for name in ("MXKIT_MOE_WGMMA_BM", "MXKIT_MOE_MIXED", "MXKIT_MOE_MIXED_FROM", "MXKIT_MOE_MIXED_SIZES"):
        monkeypatch.delenv(name, raising=False)
    default = block_plan(512.0)
    monkeypatch.setenv("MXKIT_MOE_MIXED", "fit")
    assert block_plan(512.0) == default
    monkeypatch.setenv("MXKIT_MOE_MIXED", "0")
    assert block_plan(512.0) == ((wgmma_block_m(512.0),), 0)
    monkeypatch.setenv("MXKIT_MOE_MIXED", "false")  # (was mode 1)
    with pytest.raises(ValueError, match="MXKIT_MOE_MIXED='false': expected 0 or 1 or fit"):
        block_plan(512.0)
    monkeypatch.delenv("MXKIT_MOE_MIXED")
    monkeypatch.setenv("MXKIT_MOE_MIXED_FROM", "abc")
    with pytest.raises(ValueError, match="MXKIT_MOE_MIXED_FROM='abc': expected a finite float >= 0"):
        block_plan(512.0)
    monkeypatch.delenv("MXKIT_MOE_MIXED_FROM")
    monkeypatch.setenv("MXKIT_MOE_MIXED_SIZES", "48")
    with pytest.raises(ValueError, match="MXKIT_MOE_MIXED_SIZES='48': expected one of 32, 64, 128"):
        block_plan(512.0)
    monkeypatch.delenv("MXKIT_MOE_MIXED_SIZES")
    monkeypatch.setenv("MXKIT_MOE_WGMMA_BM", "64")
    assert wgmma_block_m(512.0) == 64
    for v in ("0", "100", "-64", "abc"):  # (0 divided by zero, 100 / -64 reached the kernel's launch)
        monkeypatch.setenv("MXKIT_MOE_WGMMA_BM", v)
        with pytest.raises(ValueError, match=rf"MXKIT_MOE_WGMMA_BM={v!r}: expected one of 32, 64, 128, 256"):
            wgmma_block_m(512.0)


def test_cli_traceback_switch(monkeypatch, capsys):
    monkeypatch.setenv("MXKIT_TRACEBACK", "false")  # (was on: a traceback and exit status 1)
    assert cli.main(["inspect", "/nonexistent/x.safetensors"]) == 2
    assert "MXKIT_TRACEBACK='false': expected 0 or 1" in capsys.readouterr().err
    monkeypatch.setenv("MXKIT_TRACEBACK", "0")
    assert cli.main(["inspect", "/nonexistent/x.safetensors"]) == 2
    assert capsys.readouterr().err.startswith("mxkit: error:")


def test_table_strip_counts():
    assert check_table({"default": {"moe": {"mma_strips": 2}}})
    for v in (0, 3, 1000):  # (ran as 1, silently)
        with pytest.raises(ValueError, match=rf"'mma_strips': {v} is not a strip count of the grouped decode"):
            check_table({"default": {"moe": {"mma_strips": v}}})


def test_tuning_entry_checks():
    base = opt_flags.TuningEntry(gpu="G", path="rows", fmt="mxfp4_e2m1", min_elements=0, fields=(("rblocks", 4),))
    with pytest.raises(ValueError, match="TuningEntry.path must be one of rows, cols, cast_transpose, got 'row'"):
        with opt_flags.override(table=[dataclasses.replace(base, path="row")]):
            pass
    with pytest.raises(ValueError, match="mxfp5"):
        with opt_flags.override(table=[dataclasses.replace(base, fmt="mxfp5")]):
            pass
    # an alias of the format is taken as the format (it never matched, so the entry did nothing)
    for fmt in ("mxfp4_e2m1", "mxfp4"):
        with opt_flags.override(table=[dataclasses.replace(base, fmt=fmt)]):
            assert opt_flags.quantize_config(1, 256, 1024, True, False, "mxfp4_e2m1", gpu="G").rblocks == 4
