"""The GEMM / MoE dispatch table (mxkit.kernels.matmul_table): read-only data with overrides, missing fields from
the packaged default."""

from __future__ import annotations

import json

import pytest
import torch


def test_gemm_table_is_data_with_an_override():
    from mxkit.kernels import matmul
    from mxkit.kernels.matmul_table import DecodeConfig, decode_config, gemm_table, gemm_table_override

    # (mxkit.kernels.matmul re-exports the table's API, where it lived before)
    assert (matmul.gemm_table, matmul.gemm_table_override, matmul.decode_config, matmul.DecodeConfig) == (
        gemm_table, gemm_table_override, decode_config, DecodeConfig)

    table = gemm_table()
    assert table["default"]["decode_w4a16"]["max_m"] >= 1
    with pytest.raises(TypeError):
        table["default"]["decode_w4a16"]["max_m"] = 99  # read-only
    cpu = torch.device("cpu")
    with gemm_table_override({"default": {"decode_w4a16": {"max_m": 4, "configs": [
            {"k_max": 100, "block_n": 16, "block_k": 64, "split_k": 1, "num_warps": 2, "num_stages": 2}]}}}):
        assert decode_config(cpu, 96) == DecodeConfig(16, 64, 1, 2, 2)
        assert decode_config(cpu, 8192) == DecodeConfig()  # no entry covers K: the defaults
    assert decode_config(cpu, 96) != DecodeConfig(16, 64, 1, 2, 2)


def test_table_entry_missing_fields_come_from_the_packaged_default():
    """A dispatch table whose entry lacks fields (written by an older `mxkit tune gemm`) takes them from the packaged
    default; the fields it has win; an entry absent from both is None."""
    from mxkit.kernels.matmul_table import (DecodeConfig, _decode_max_m, _envelope, _packaged_table, decode_config,
                                            gemm_table_override)

    cpu = torch.device("cpu")
    packaged = _packaged_table()["default"]["w4a16_wgmma"]
    with gemm_table_override({"default": {"w4a16_wgmma": {"max_m": 7, "min_nk": 5}}}):
        e = _envelope(cpu, "w4a16_wgmma")
        assert (e["max_m"], e["min_nk"]) == (7, 5)
        assert (e["small_max_m"], e["small_min_nk"]) == (packaged["small_max_m"], packaged["small_min_nk"])
        assert _envelope(cpu, "decode_mma") == _packaged_table()["default"]["decode_mma"]
        assert _envelope(cpu, "no_such_entry") is None
        # decode-w16's envelope and schedules too (an override without them no longer turns decode-w16 off)
        assert _decode_max_m(cpu) == _packaged_table()["default"]["decode_w4a16"]["max_m"]
        c = _packaged_table()["default"]["decode_w4a16"]["configs"][0]
        assert decode_config(cpu, c["k_max"]) == DecodeConfig(c["block_n"], c["block_k"], c["split_k"], c["num_warps"],
                                                              c["num_stages"])
    with gemm_table_override({"default": {"decode_w4a16": {"max_m": 0}}}):
        assert _decode_max_m(cpu) == 0
    # an edited copy of the packaged table: its default's field reaches a GPU entry that inherits it (it took the
    # packaged default's), and the GPU entry's own fields still win
    from mxkit.kernels import matmul_table

    h200, cuda = "NVIDIA H200", torch.device("cuda", 0)
    edited = json.loads(matmul_table._TABLE_FILE.read_text())
    assert "max_m" not in edited[h200]["w4a16_wgmma"] and "small_max_m" in edited[h200]["w4a16_wgmma"]
    edited["default"]["w4a16_wgmma"]["max_m"] = 256
    edited["default"]["w4a16_wgmma"]["small_max_m"] = 3
    real = matmul_table._gpu_name
    try:
        matmul_table._gpu_name = lambda index: h200
        with gemm_table_override(edited):
            e = _envelope(cuda, "w4a16_wgmma")
            assert e["max_m"] == 256 and e["small_max_m"] == edited[h200]["w4a16_wgmma"]["small_max_m"] != 3
    finally:
        matmul_table._gpu_name = real


def test_mma_m8_loop_from_the_table():
    """decode_mma.m8_loop picks the decode-mma kernel up to 8 rows ("" register loop, "l" lean loop, "g" ring loop;
    default "") and names its PTX entry, ring_min_k the K from which the ring loop is taken whatever m8_loop says (the
    m16 kernels' ring loops too), ring2_min_n the N from which the ring of 2 ("g2") is taken up to 8 rows;
    any other loop is refused where the launch is made."""
    from mxkit.kernels.matmul_details._mma_decode import dense_kernel_name
    from mxkit.kernels.matmul_table import _packaged_table, gemm_table_override, mma_m8_loop

    cpu = torch.device("cpu")
    assert "m8_loop" not in _packaged_table()["default"]["decode_mma"] and mma_m8_loop(cpu, 4096) == ""
    assert _packaged_table()["NVIDIA H200"]["decode_mma"]["m8_loop"] == "l"
    assert _packaged_table()["NVIDIA H200"]["decode_mma"]["ring_min_k"] == 8192
    with gemm_table_override({"default": {"decode_mma": {"max_m": 16, "m8_loop": "l"}}}):
        assert mma_m8_loop(cpu, 4096) == "l" and mma_m8_loop(cpu, 28672) == "l"
    with gemm_table_override({"default": {"decode_mma": {"max_m": 16, "m8_loop": "l", "ring_min_k": 8192}}}):
        assert [mma_m8_loop(cpu, K) for K in (0, 4096, 8191, 8192, 28672)] == ["l", "l", "l", "g", "g"]
    with gemm_table_override({"default": {"decode_mma": {"max_m": 16, "ring_min_k": None}}}):
        assert mma_m8_loop(cpu, 8192) == ""
    # ring2_min_n: the ring of 2 up to 8 rows on weights of N >= it, over ring_min_k; past 8 rows the K rule
    with gemm_table_override({"default": {"decode_mma": {"max_m": 16, "ring_min_k": 8192, "ring2_min_n": 14336}}}):
        got = [mma_m8_loop(cpu, K, N, M) for K, N, M in [(4096, 14335, 1), (4096, 14336, 1), (8192, 28672, 8),
                                                          (8192, 28672, 9), (4096, 28672, 16), (8192, 8192, 1)]]
        assert got == ["", "g2", "g2", "g", "", "g"]
    assert dense_kernel_name(1, 28672, 4096, torch.bfloat16, False, "g2") == "mxfp4_mma_decode_m8g2_bf16"
    with pytest.raises(ValueError, match="up to 8 rows"):
        dense_kernel_name(9, 28672, 4096, torch.bfloat16, False, "g2", 132)
    assert dense_kernel_name(1, 8192, 8192, torch.bfloat16, False, "g") == "mxfp4_mma_decode_m8g_bf16"
    assert dense_kernel_name(16, 8192, 8192, torch.bfloat16, False, "g", 132) == "mxfp4_mma_decode_m16ng_bf16"
    assert dense_kernel_name(16, 8192, 8192, torch.bfloat16, False, "l") == "mxfp4_mma_decode_m16n_bf16"
    assert dense_kernel_name(8, 4096, 4096, torch.bfloat16, False, "l") == "mxfp4_mma_decode_m8l_bf16"
    assert dense_kernel_name(9, 4096, 8192, torch.float32, True, "l") == "mxfp4_mma_decode_m16l_f32_special"
    assert dense_kernel_name(1, 4096, 4096, torch.float16, True) == "mxfp4_mma_decode_m8_f16_special"
    with pytest.raises(ValueError, match="m8 loop"):
        dense_kernel_name(1, 4096, 4096, torch.bfloat16, False, "x")


def test_table_override_is_per_thread_and_nests():
    """An override holds in its own thread (or asyncio task) only, with its own prepared-call key; nested ones
    restore the outer one; another thread meanwhile sees the packaged table."""
    import threading

    from mxkit.kernels import matmul_table as mt

    packaged = mt.gemm_table()
    seen = {}
    entered, checked = threading.Event(), threading.Event()

    def other():
        entered.wait(10)
        seen["table"], seen["token"] = mt.gemm_table(), mt._table_token()
        checked.set()

    t = threading.Thread(target=other)
    t.start()
    def strips(n):
        return {"default": {"moe": {"mma_strips": n}}}

    def held():
        return mt.gemm_table()["default"]["moe"]["mma_strips"]

    with mt.gemm_table_override(strips(1)):
        outer = mt._table_token()
        assert held() == 1 and outer != 0
        with mt.gemm_table_override(strips(2)):
            assert held() == 2 and mt._table_token() not in (0, outer)
            entered.set()
            checked.wait(10)
        assert held() == 1 and mt._table_token() == outer
    t.join(10)
    assert seen == {"table": packaged, "token": 0}
    assert mt.gemm_table() is packaged and mt._table_token() == 0


@pytest.mark.parametrize("entry, match", [
    ({"decode_mmma": {"max_m": 16}}, "'decode_mmma' is not a key"),
    ({"decode_mma": {"maxm": 16}}, "'maxm': not a field of 'decode_mma'"),
    ({"decode_mma": {"max_m": "abc"}}, "'max_m': expected an int >= 0"),
    ({"decode_mma": {"max_m": None}}, "'max_m': expected an int >= 0"),
    ({"decode_mma": {"max_m": True}}, "'max_m': expected an int >= 0"),
    ({"decode_mma": {"max_m": 15.9}}, "'max_m': expected an int >= 0"),
    ({"decode_mma": {"max_m": -1}}, "'max_m': expected an int >= 0"),
    ({"decode_mma": {"ring_min_k": "8k"}}, "'ring_min_k': expected an int >= 0 or null"),
    ({"decode_mma": {"m8_loop": "x"}}, "'m8_loop': 'x' is not a loop"),
    ({"moe": {"mma_strips": "2"}}, "'mma_strips': expected an int"),
    ({"decode_w4a16": {"configs": {"k_max": 4096}}}, "'configs': expected a list"),
    ({"decode_w4a16": {"configs": [{"k_max": 4096, "block_n": 64}]}}, r"'configs'\[0\]: expected a mapping of exactly"),
    ({"decode_w4a16": {"configs": [dict(k_max=4096, block_n=-64, block_k=128, split_k=1, num_warps=4,
                                        num_stages=2)]}}, r"'configs'\[0\]: DecodeConfig.block_n must be a power of 2"),
    ({"decode_w4a16": {"configs": [dict(k_max=4096, block_n=48, block_k=128, split_k=1, num_warps=4,
                                        num_stages=2)]}}, "block_n must be a power of 2"),
    ({"decode_w4a16": {"configs": [dict(k_max=4096, block_n=64, block_k=96, split_k=1, num_warps=4,
                                        num_stages=2)]}}, "block_k must be a power of 2"),
    ({"decode_w4a16": {"configs": [dict(k_max=4096, block_n=64, block_k=128, split_k=0, num_warps=4,
                                        num_stages=2)]}}, "split_k must be in \\[1, 64\\] and num_stages in \\[1, 8\\]"),
    ({"decode_w4a16": {"configs": [dict(k_max=4096, block_n=64, block_k=128, split_k=1, num_warps=3,
                                        num_stages=2)]}}, "num_warps must be a power of 2"),
    ({"decode_w4a16": {"configs": [dict(k_max=8192, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=2),
                                   dict(k_max=4096, block_n=64, block_k=128, split_k=1, num_warps=4,
                                        num_stages=2)]}}, r"'configs'\[1\]: k_max must be an int above"),
])
def test_check_table_refuses_what_the_lookups_cannot_use(entry, match, tmp_path):
    """A user table (`--table`, gemm_table_override) is checked when it is loaded, naming the GPU, key and field: a
    typo'd key or field used to change nothing silently, a negative block_n gave a grid of no programs (a split-K sum
    of uninitialised memory), other bad values failed at the first GEMM with errors that named nothing."""
    import json

    from mxkit.kernels.matmul_table import check_table, gemm_table_override, load_table

    table = {"NVIDIA H200": entry}
    with pytest.raises(ValueError, match=match) as e:
        check_table(table)
    assert "'NVIDIA H200'" in str(e.value)
    with pytest.raises(ValueError, match=match):
        with gemm_table_override(table):  # (a mapping is checked as a file is)
            pass
    f = tmp_path / "t.json"
    f.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=match):
        load_table(f)


def test_load_table_refuses_non_finite_numbers_and_takes_the_packaged_table(tmp_path):
    from mxkit.kernels.matmul_table import _TABLE_FILE, check_table, load_table

    for const in ("NaN", "Infinity", "-Infinity"):  # (json.loads takes them; int() then failed deep in a plan)
        f = tmp_path / "t.json"
        f.write_text('{"default": {"decode_mma": {"max_m": %s}}}' % const)
        with pytest.raises(ValueError, match=f"{const} is not a JSON number"):
            load_table(f)
    assert load_table(_TABLE_FILE) == check_table(load_table(_TABLE_FILE))
    # a key twice in one object (json keeps the last: a hand-merged table lost an entry silently)
    f.write_text('{"NVIDIA H200": {"decode_mma": {"max_m": 8}}, "NVIDIA H200": {"moe": {"mma_strips": 2}}}')
    with pytest.raises(ValueError, match="key 'NVIDIA H200' appears twice"):
        load_table(f)
    f.write_text('{"default": {"decode_mma": {"max_m": 16, "max_m": 64}}}')
    with pytest.raises(ValueError, match="key 'max_m' appears twice"):
        load_table(f)
    # notes (names starting with _) hold anything, at every level; an empty schedule list means the defaults
    check_table({"_doc": 1, "default": {"_x": [1], "decode_w4a16": {"_measured": None, "configs": []}}})


def test_check_table_knows_what_the_code_reads():
    """The table check's keys are the tuner's stages and its m8 loops the kernel's (two lists kept apart: the kernel
    module imports the table)."""
    from mxkit.kernels.matmul_details._mma_decode import M8_LOOPS
    from mxkit.kernels.matmul_table import _FIELDS, M8_LOOPS as TABLE_M8_LOOPS
    from mxkit.tune import STAGES

    assert set(_FIELDS) == set(STAGES) and TABLE_M8_LOOPS == M8_LOOPS


def test_decode_config_refuses_bad_schedules():
    from mxkit.kernels.matmul_table import DecodeConfig

    DecodeConfig(16, 32, 1, 1, 1)
    for bad in (dict(block_n=0), dict(block_n=-64), dict(block_k=16), dict(block_k=96), dict(split_k=0),
                dict(num_warps=3), dict(num_stages=0), dict(block_n=64.0), dict(split_k=True), dict(split_k=65),
                dict(num_stages=9)):
        with pytest.raises(ValueError, match="DecodeConfig"):
            DecodeConfig(**bad)


def test_table_lookups_cap_and_close_what_the_kernels_cannot_take():
    """decode_w4a16.max_m is capped at DECODE_W16_MAX_M as the mma envelopes are at their kernels' MAX_M; a table's
    m8_loop "g2" past 8 rows (no ring of 2 there) takes the ring of 4; half a wgmma envelope pair is off."""
    from mxkit.kernels.matmul import wgmma_envelope_holds
    from mxkit.kernels.matmul_table import DECODE_W16_MAX_M, _decode_max_m, gemm_table_override, mma_m8_loop

    cpu = torch.device("cpu")
    with gemm_table_override({"default": {"decode_w4a16": {"max_m": 100000}}}):
        assert _decode_max_m(cpu) == DECODE_W16_MAX_M == 64
    with gemm_table_override({"default": {"decode_mma": {"m8_loop": "g2"}}}):
        assert [mma_m8_loop(cpu, 4096, 4096, M) for M in (1, 8, 9, 16)] == ["g2", "g2", "g", "g"]
    full = {"max_m": 64, "min_nk": 1 << 26}
    assert wgmma_envelope_holds(full, 64, 1 << 26) and not wgmma_envelope_holds(full, 65, 1 << 26)
    assert not wgmma_envelope_holds(full, 64, (1 << 26) - 1)
    assert not wgmma_envelope_holds({**full, "mid_max_m": 512}, 512, 1 << 30)  # (was open on every weight)
    assert wgmma_envelope_holds({**full, "mid_max_m": 512, "mid_min_nk": 1 << 24}, 512, 1 << 24)
    assert not wgmma_envelope_holds({"min_nk": 0}, 1, 1)


def test_bench_table_without_this_gpus_entry_warns(tmp_path, monkeypatch, capsys):
    """`mxkit bench ... --table FILE` whose file has no entry for the GPU in use (names match exactly) nor a
    "default" one says so: it changes nothing there, yet the results record it as their table."""
    import argparse
    import json

    from mxkit import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    f = tmp_path / "t.json"
    for table, warned in (({"NVIDIA H100": {"moe": {"mma_strips": 2}}}, True),
                          ({"NVIDIA H100 80GB HBM3": {"moe": {"mma_strips": 2}}}, False),
                          ({"default": {"moe": {"mma_strips": 2}}}, False)):
        f.write_text(json.dumps(table))
        assert bench.run_with_table(lambda a: 0, argparse.Namespace(gemm_table=str(f))) == 0
        err = capsys.readouterr().err
        assert ("has no entry for this GPU ('NVIDIA H100 80GB HBM3')" in err) == warned, err
        assert not warned or "'NVIDIA H100'" in err
