"""The GEMM / MoE dispatch table (mxkit.kernels.matmul_table): read-only data with overrides, missing fields from
the packaged default."""

from __future__ import annotations

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
    with mt.gemm_table_override({"default": {"x": 1}}):
        outer = mt._table_token()
        assert mt.gemm_table()["default"]["x"] == 1 and outer != 0
        with mt.gemm_table_override({"default": {"x": 2}}):
            assert mt.gemm_table()["default"]["x"] == 2 and mt._table_token() not in (0, outer)
            entered.set()
            checked.wait(10)
        assert mt.gemm_table()["default"]["x"] == 1 and mt._table_token() == outer
    t.join(10)
    assert seen == {"table": packaged, "token": 0}
    assert mt.gemm_table() is packaged and mt._table_token() == 0
