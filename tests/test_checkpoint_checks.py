"""Checks of mxkit.gpt_oss and mxkit.packed found by mutation testing: documented behaviour that no other test
checked (config validation, the modules_to_not_convert match, mxtensor_from_blocks / blocks_from_mxtensor errors,
duplicate tensors across single files, save-time shape / dtype checks, the synthetic writer's documented config and
scale range, and PackedWeight / Fp8Rowwise's checks, .to and pytree round trip)."""

import dataclasses
import json
import os
import re
import sys

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import mxkit
from mxkit import gpt_oss
from mxkit.gpt_oss_details import _write as gpt_oss_write
from mxkit.gpt_oss import CheckpointError, moe_tensor_name
from mxkit.packed import Fp8Rowwise, PackedWeight, partial_stats_host

safetensors = pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402
from test_gpt_oss import _edit_json, _file_tensors, _rewrite, _same_bytes, _write  # noqa: E402  (its helpers)

# --------------------------------------------------------------------------------------------------------
# config.json


def test_moe_tensor_name_rejects_an_unknown_role():
    assert moe_tensor_name(3, "router.bias") == "model.layers.3.mlp.router.bias"
    assert moe_tensor_name(3, "down_proj_scales") == "model.layers.3.mlp.experts.down_proj_scales"
    with pytest.raises(ValueError, match="unknown MoE tensor role 'up_proj_blocks'"):
        moe_tensor_name(0, "up_proj_blocks")
    for bad in (-1, "0", 1.0, True):  # (-1 made "model.layers.-1.mlp.router.bias")
        with pytest.raises(ValueError, match="layer must be an int >= 0"):
            moe_tensor_name(bad, "router.bias")
    assert moe_tensor_name(np.int64(3), "router.bias") == "model.layers.3.mlp.router.bias"


def test_config_sizes_must_be_positive_ints_and_multiples_of_the_block(tmp_path, rng):
    """A bool size (JSON true) is not an int size; intermediate_size is checked against the MXFP4 block as
    hidden_size is (named in the message, not a later shape error)."""
    root = _write(tmp_path, rng, num_layers=1)
    good = (root / "config.json").read_text()
    for edit, message in ((dict(num_hidden_layers=True), "num_hidden_layers=True (need positive integers)"),
                          (dict(num_local_experts=True), "num_local_experts=True (need positive integers)"),
                          (dict(intermediate_size=80), "intermediate_size=80 is not a multiple of the MXFP4 block 32")):
        _edit_json(root / "config.json", lambda d: d.update(edit))
        with pytest.raises(CheckpointError) as e:
            gpt_oss.load_gpt_oss(root, progress=False)
        assert message in str(e.value), str(e.value)
        (root / "config.json").write_text(good)
    assert gpt_oss.load_gpt_oss(root, progress=False).dims.num_layers == 1


def test_modules_to_not_convert_matches_as_transformers_does(tmp_path, rng):
    """transformers' should_convert_module: a regex from the start up to a module boundary, or a suffix. A prefix
    that stops inside a name ("experts" vs "exp") does not keep the experts; a suffix ("mlp.experts") keeps them in
    every layer; a layer prefix ("model.layers.1") keeps that layer's, not layer 10's or 11's."""
    root = _write(tmp_path, rng, num_layers=12, num_experts=2, top_k=2, hidden_size=32, intermediate_size=32)

    def load_with(patterns):
        _edit_json(root / "config.json", lambda d: d["quantization_config"].update(modules_to_not_convert=patterns))
        return gpt_oss.load_gpt_oss(root, layers=[0], progress=False)

    for patterns in (["model.layers.1.mlp.exp"], ["model.layers.1.mlp.experts_x"], ["mlp.router", "lm_head"]):
        assert [m.layer for m in load_with(patterns).layers] == [0], patterns
    for patterns, kept in ((["mlp.experts"], list(range(12))), (["experts"], list(range(12))),
                           (["model.layers.1"], [1]), (["model.layers.1.mlp.experts"], [1])):
        with pytest.raises(CheckpointError, match=re.escape(f"keeps the experts of layers {kept} ")):
            load_with(patterns)


def test_modules_to_not_convert_must_be_a_list_of_strings(tmp_path, rng):
    """A bare string (iterated letter by letter it matched "s" at the end of "experts") or a non-string item is a
    CheckpointError naming the field."""
    root = _write(tmp_path, rng, num_layers=1)
    for value in ("lm_head_and_experts", [1], {"a": 1}):
        _edit_json(root / "config.json", lambda d: d["quantization_config"].update(modules_to_not_convert=value))
        with pytest.raises(CheckpointError, match="modules_to_not_convert must be a list of strings"):
            gpt_oss.load_gpt_oss(root, progress=False)
    _edit_json(root / "config.json", lambda d: d["quantization_config"].update(modules_to_not_convert=None))
    assert gpt_oss.load_gpt_oss(root, progress=False).dims.num_layers == 1


def test_is_gpt_oss_mxfp4_dir_needs_the_model_type(tmp_path, rng):
    root = _write(tmp_path, rng, num_layers=1)
    assert gpt_oss.is_gpt_oss_mxfp4_dir(root)
    _edit_json(root / "config.json", lambda d: d.update(model_type="llama"))  # (quantization_config still mxfp4)
    assert not gpt_oss.is_gpt_oss_mxfp4_dir(root)


# --------------------------------------------------------------------------------------------------------
# blocks <-> MXTensor


def test_mxtensor_from_blocks_errors_are_checkpoint_errors(rng):
    G = 3
    blocks = torch.randint(0, 256, (2, 5, G, 16), dtype=torch.uint8, generator=rng)
    scales = torch.randint(100, 140, (2, 5, G), dtype=torch.uint8, generator=rng)
    t = gpt_oss.mxtensor_from_blocks(blocks, scales, "w")
    assert tuple(t.shape) == (2, 5, 96) and torch.equal(t.qdata, blocks.reshape(2, 5, 16 * G))
    for b, s, message in ((blocks, scales.view(torch.int8), "w: scales must be uint8, got torch.int8"),
                          (blocks.view(torch.int8), scales, "w: blocks must be uint8, got torch.int8"),
                          (blocks[..., :8], scales, r"w: blocks \(2, 5, 3, 8\) and scales \(2, 5, 3\) do not pair"),
                          (blocks.reshape(2, 5, G, 8, 2), scales.reshape(2, 5, G, 1).expand(2, 5, G, 8),
                           "do not pair")):
        with pytest.raises(CheckpointError, match=message):
            gpt_oss.mxtensor_from_blocks(b, s, "w")


def test_blocks_from_mxtensor_refuses_other_layouts(rng):
    """Only MXFP4 along the last axis, blocks of 32, plain scales reshape to GPT-OSS blocks; any other is a
    CheckpointError naming the tensor (not a silent reshape of the wrong bytes, nor a torch error)."""
    x = torch.randn(2, 128, 256, generator=rng)
    good = mxkit.quantize(x, "mxfp4")
    b, s = gpt_oss.blocks_from_mxtensor(good, "w")
    assert tuple(b.shape) == (2, 128, 8, 16) and torch.equal(b.reshape(2, 128, 128), good.qdata)
    others = {
        "block 16": mxkit.quantize(x, "mxfp4", block_size=16),
        "axis 1": mxkit.quantize(x, "mxfp4", axis=1),
        "swizzled": mxkit.quantize(x[0], "mxfp4", scale_layout="nvidia_128x4"),
    }
    for what, t in others.items():
        with pytest.raises(CheckpointError, match="w: GPT-OSS stores mxfp4_e2m1 along the last axis"):
            gpt_oss.blocks_from_mxtensor(t, "w")
    assert gpt_oss.blocks_from_mxtensor(mxkit.quantize(x[0], "mxfp4"))[0].shape == (128, 8, 16)


# --------------------------------------------------------------------------------------------------------
# reading


def test_a_tensor_in_two_single_files_is_an_error(tmp_path, rng):
    """Without model.safetensors or an index, every *.safetensors file is read: a tensor held by two of them is
    ambiguous. With model.safetensors, transformers' choice: it alone is read, whatever lies beside it (a leftover
    shard, a stale index whose shards are gone: it raised that a shard was missing, or read the index's shards)."""
    root = _write(tmp_path, rng, num_layers=1)
    name = moe_tensor_name(0, "router.bias")
    mine = _file_tensors(root / "model.safetensors")[0][name]
    save_file({name: mine + 1}, str(root / "extra.safetensors"))
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: "model-00001-of-00002.safetensors"}}))
    got = gpt_oss.load_gpt_oss(root, progress=False)
    assert torch.equal(got.layers[0].router_bias, mine)
    (root / "model.safetensors.index.json").unlink()
    (root / "model.safetensors").rename(root / "weights.safetensors")
    with pytest.raises(CheckpointError) as e:
        gpt_oss.load_gpt_oss(root, progress=False)
    assert f"{name} is in both" in str(e.value) and "extra.safetensors" in str(e.value), str(e.value)


def test_reader_skips_folders_and_names_unreadable_files(tmp_path, rng, monkeypatch):
    """Without an index only regular *.safetensors files are read (a folder or a dangling link of that name gave a
    bare OSError with no path); a file that cannot be opened is a CheckpointError naming it."""
    root = _write(tmp_path, rng, num_layers=1)
    (root / "old.safetensors").mkdir()
    os.symlink(root / "gone.safetensors", root / "dangling.safetensors")
    assert gpt_oss.load_gpt_oss(root, progress=False).dims.num_layers == 1
    import safetensors as st

    def refuse(path, **kw):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(st, "safe_open", refuse)
    with pytest.raises(CheckpointError, match=r"model.safetensors' cannot be read: Permission denied"):
        gpt_oss.load_gpt_oss(root, progress=False)


def test_config_top_k_above_the_expert_count_is_refused(tmp_path, rng):
    root = _write(tmp_path, rng, num_layers=1)
    _edit_json(root / "config.json", lambda d: d.update(num_experts_per_tok=5))
    with pytest.raises(CheckpointError, match="num_experts_per_tok=5 is more than num_local_experts=4"):
        gpt_oss.load_gpt_oss(root, progress=False)


def test_is_gpt_oss_mxfp4_dir_is_false_for_an_unreadable_config(tmp_path):
    """A directory whose config.json is not a JSON object is not a GPT-OSS directory (``mxkit inspect`` lists its
    tensors): False, not an error."""
    for text in ("[1, 2]", "{not json"):
        (tmp_path / "config.json").write_text(text)
        assert not gpt_oss.is_gpt_oss_mxfp4_dir(tmp_path)


def test_save_writes_a_tensor_only_where_the_index_puts_it(tmp_path, rng):
    """A stale copy of a tensor in a shard the index does not point to for it is carried as it is (it was
    overwritten too: another dtype's bytes silently, or a size mismatch stopped the save)."""
    root = _write(tmp_path, rng, num_layers=1, shards=2)
    index = json.loads((root / gpt_oss.INDEX_NAME).read_text())["weight_map"]
    name = moe_tensor_name(0, "router.bias")
    other = next(f for f in sorted(set(index.values())) if f != index[name])
    stale = torch.zeros(4, dtype=torch.float16)
    from test_gpt_oss import _file_tensors as tensors_of

    tensors, meta = tensors_of(root / other)
    save_file({**tensors, name: stale}, str(root / other), metadata=meta)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    m0 = ckpt.layer(0)
    new_bias = torch.randn(m0.router_bias.shape, generator=rng).to(m0.router_bias.dtype)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, router_bias=new_bias),))
    out = gpt_oss.save_gpt_oss(edited, tmp_path / "out", progress=False)
    assert _same_bytes(tensors_of(out / other)[0][name], stale)
    assert _same_bytes(tensors_of(out / index[name])[0][name], new_bias)


def test_overwrite_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, rng):
    """overwrite=True replaces a saved checkpoint (or an empty folder), not any folder: a non-empty one with no
    config.json or *.safetensors is refused and left as it is (it was deleted whole)."""
    ckpt = gpt_oss.load_gpt_oss(_write(tmp_path, rng, num_layers=1), progress=False)
    models = tmp_path / "models"
    (models / "llama").mkdir(parents=True)
    (models / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no checkpoint"):
        gpt_oss.save_gpt_oss(ckpt, models, overwrite=True, progress=False)
    assert (models / "notes.txt").read_text() == "mine" and (models / "llama").is_dir()
    (tmp_path / "empty").mkdir()
    gpt_oss.save_gpt_oss(ckpt, tmp_path / "empty", overwrite=True, progress=False)
    assert (tmp_path / "empty" / "config.json").is_file()


@pytest.mark.parametrize("exchange", [True, False])
def test_overwrite_keeps_the_old_or_the_new_directory_when_interrupted(tmp_path, rng, monkeypatch, exchange):
    """Replacing a checkpoint in place: with the atomic exchange (Linux) the swap is one step; without it, an
    interrupt (KeyboardInterrupt) right after the old directory was renamed aside puts it back (the source
    directory vanished: only a hidden .old folder was left)."""
    src = _write(tmp_path, rng, num_layers=1)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m0 = ckpt.layer(0)
    edited = dataclasses.replace(ckpt, layers=(dataclasses.replace(m0, down_bias=torch.zeros_like(m0.down_bias)),))
    before = sorted(p.name for p in src.iterdir())
    if exchange:
        if not sys.platform.startswith("linux"):
            pytest.skip("renameat2(RENAME_EXCHANGE) is Linux's")
        real_rename, moved = os.rename, []
        monkeypatch.setattr(os, "rename", lambda a, b: (moved.append(os.fspath(a)), real_rename(a, b))[1])
        gpt_oss.save_gpt_oss(edited, src, overwrite=True, progress=False)
        assert os.fspath(src) not in moved  # (one exchange: src was never renamed aside)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
        assert _same_bytes(gpt_oss.load_gpt_oss(src, progress=False).layer(0).down_bias, edited.layer(0).down_bias)
        return
    monkeypatch.setattr(gpt_oss_write, "_exchange", lambda a, b: False)
    real_rename, calls = os.rename, []

    def rename_then_interrupt(a, b):
        real_rename(a, b)
        calls.append(a)
        if str(b).endswith(".old"):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        gpt_oss.save_gpt_oss(edited, src, overwrite=True, progress=False)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"] and sorted(p.name for p in src.iterdir()) == before
    assert _same_bytes(gpt_oss.load_gpt_oss(src, progress=False).layer(0).down_bias, m0.down_bias)


def test_a_same_size_wrong_shape_is_refused_on_load(tmp_path, rng):
    """The header's shape is compared, not its element count: a transposed router weight [H, E] is refused."""
    root = _write(tmp_path, rng, num_layers=1)
    name = moe_tensor_name(0, "router.weight")
    _rewrite(root / "model.safetensors", lambda t: t.update({name: t[name].T.contiguous()}))
    with pytest.raises(CheckpointError, match=rf"{name} in .*: shape \[64, 4\], expected \[4, 64\]"):
        gpt_oss.load_gpt_oss(root, progress=False)


def test_float32_and_float16_biases_and_router_load_and_round_trip(tmp_path, rng):
    """BF16 / F16 / F32 are the documented dtypes of biases and router: loaded as stored, saved byte for byte."""
    root = _write(tmp_path, rng, num_layers=1)
    roles = {"gate_up_proj_bias": torch.float32, "down_proj_bias": torch.float16, "router.weight": torch.float32,
             "router.bias": torch.float16}

    def cast(t):
        for role, dtype in roles.items():
            t[moe_tensor_name(0, role)] = t[moe_tensor_name(0, role)].to(dtype)

    _rewrite(root / "model.safetensors", cast)
    m = gpt_oss.load_gpt_oss(root, progress=False).layer(0)
    files = _file_tensors(root / "model.safetensors")[0]
    for role, t in (("gate_up_proj_bias", m.gate_up_bias), ("down_proj_bias", m.down_bias),
                    ("router.weight", m.router_weight), ("router.bias", m.router_bias)):
        assert t.dtype == roles[role] and _same_bytes(t, files[moe_tensor_name(0, role)]), role
    dst = gpt_oss.save_gpt_oss(gpt_oss.load_gpt_oss(root, progress=False), tmp_path / "dst", progress=False)
    assert (dst / "model.safetensors").read_bytes() == (root / "model.safetensors").read_bytes()


def test_negative_layer_index_is_out_of_range(tmp_path, rng):
    root = _write(tmp_path, rng, num_layers=2)
    with pytest.raises(ValueError, match=r"layers \[-1\] out of range for num_hidden_layers=2"):
        gpt_oss.load_gpt_oss(root, layers=[-1], progress=False)
    ckpt = gpt_oss.load_gpt_oss(root, progress=False)
    assert ckpt.layer(np.int64(1)) is ckpt.layer(1)
    with pytest.raises(TypeError, match="layer index must be an int, got '0'"):  # (was "layer 0 was not loaded")
        ckpt.layer("0")
    with pytest.raises(KeyError, match=r"layer 2 was not loaded \(loaded: \[0, 1\]\)"):
        ckpt.layer(2)
    with pytest.raises(TypeError, match="takes one layer's GptOssMoE"):
        gpt_oss.hf_state_dict([ckpt.layer(0)])


# --------------------------------------------------------------------------------------------------------
# saving


def test_save_refuses_same_size_tensors_of_another_shape_or_dtype(tmp_path, rng):
    """A save keeps the directory's shapes and dtypes, compared exactly: a transposed router weight (same element
    count) and a float16 bias in a BF16 slot (same byte count) are refused, and nothing is written."""
    src = _write(tmp_path, rng, num_layers=1)
    ckpt = gpt_oss.load_gpt_oss(src, progress=False)
    m0 = ckpt.layer(0)
    cases = [
        (dataclasses.replace(m0, router_weight=torch.randn(64, 4, generator=rng).to(torch.bfloat16)),
         r"router.weight: the tensor to save is torch.bfloat16 \[64, 4\], but .* holds BF16 \[4, 64\]"),
        (dataclasses.replace(m0, gate_up_bias=m0.gate_up_bias.to(torch.float16)),
         r"gate_up_proj_bias: the tensor to save is torch.float16 \[4, 192\], but .* holds BF16 \[4, 192\]"),
        (dataclasses.replace(m0, down_bias=m0.down_bias.view(torch.int16)), r"down_proj_bias: .*torch.int16"),
    ]
    cases.append((dataclasses.replace(m0, gate_up_bias=m0.gate_up_bias.to("meta")),
                  r"gate_up_proj_bias: the tensor to save is on the meta device"))  # (torch's "Cannot copy out")
    for moe, message in cases:
        with pytest.raises(CheckpointError, match=message):
            gpt_oss.save_gpt_oss(dataclasses.replace(ckpt, layers=(moe,)), tmp_path / "dst", progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    for layers, message in (((m0, 1), "holds a int"), (m0, "got GptOssMoE")):  # (AttributeError: .layer)
        with pytest.raises(TypeError, match=f"ckpt.layers must be a tuple of GptOssMoE, {message}"):
            gpt_oss.save_gpt_oss(dataclasses.replace(ckpt, layers=layers), tmp_path / "dst", progress=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# --------------------------------------------------------------------------------------------------------
# the synthetic directory


def test_synthetic_writer_documented_config_and_scale_range(tmp_path, rng):
    """scale_range is inclusive at both ends; experts_per_token = num_experts_per_tok = top_k; a small vocabulary
    moves pad / eos to vocab_size - 1 / - 2; a reversed scale_range is a ValueError and writes nothing."""
    root = _write(tmp_path, rng, num_layers=1, top_k=2, scale_range=(120, 121))
    cfg = json.loads((root / "config.json").read_text())
    assert (cfg["experts_per_token"], cfg["num_experts_per_tok"]) == (2, 2)
    assert (cfg["pad_token_id"], cfg["eos_token_id"]) == (99, 98)
    tensors = _file_tensors(root / "model.safetensors")[0]
    for proj in ("gate_up_proj", "down_proj"):
        s = tensors[moe_tensor_name(0, f"{proj}_scales")]
        assert torch.equal(torch.bincount(s.reshape(-1).long(), minlength=256).nonzero().flatten(),
                           torch.tensor([120, 121])), proj  # (768 / 1536 bytes: both values, surely)
    with pytest.raises(ValueError, match=r"scale_range=\(130, 120\) must be two finite E8M0 bytes \(ints\) lo <= hi"):
        _write(tmp_path, rng, "bad", num_layers=1, scale_range=(130, 120))
    assert not (tmp_path / "bad").exists()


def test_synthetic_shards_as_many_as_tensors_are_non_empty(tmp_path, rng):
    """shards may be as large as the number of tensors (documented range): every shard then holds exactly one."""
    probe = _write(tmp_path, rng, "probe", num_layers=1)
    n = len(_file_tensors(probe / "model.safetensors")[0])
    root = _write(tmp_path, rng, num_layers=1, shards=n)
    wmap = json.loads((root / gpt_oss.INDEX_NAME).read_text())["weight_map"]
    files = sorted(root.glob("*.safetensors"))
    assert len(wmap) == n and len(files) == n and sorted(set(wmap.values())) == [f.name for f in files]
    assert all(len(_file_tensors(f)[0]) == 1 for f in files)
    with pytest.raises(ValueError, match=rf"shards={n + 1} must be an int from 1 to {n}"):
        _write(tmp_path, rng, "too_many", num_layers=1, shards=n + 1)


# --------------------------------------------------------------------------------------------------------
# mxkit.packed


def test_fp8_rowwise_checks_dtypes_shapes_and_devices():
    data = torch.randn(3, 64).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 1) + 0.5
    a = Fp8Rowwise(data, scale)
    assert torch.equal(a.dequantize(), data.float() * scale)
    # float64: the exact product (4 significant bits times 24), not the float32 one widened
    assert torch.equal(a.dequantize(torch.float64), data.double() * scale.double())
    one = Fp8Rowwise(data[0], scale[0])  # 1-D (K,) with scale (1,)
    assert torch.equal(one.dequantize(), data[0].float() * scale[0])
    with pytest.raises(TypeError, match="data must be a torch.float8_e4m3fn tensor, got torch.float32"):
        Fp8Rowwise(data.float(), scale)
    with pytest.raises(TypeError, match="data must be a torch.float8_e4m3fn tensor, got torch.float8_e5m2"):
        Fp8Rowwise(data.to(torch.float8_e5m2), scale)
    with pytest.raises(TypeError, match="scale must be a float32 tensor, got torch.bfloat16"):
        Fp8Rowwise(data, scale.bfloat16())
    for bad in (torch.ones(3, 2), torch.ones(1, 3), torch.ones(3), torch.ones(2, 1)):
        with pytest.raises(ValueError, match=r"scale has shape .*expected \(3, 1\)"):
            Fp8Rowwise(data, bad)
    with pytest.raises(ValueError, match="data is on cpu but scale on meta"):
        Fp8Rowwise(data, scale.to("meta"))


def test_fp8_rowwise_of_k0_keeps_float32_scales_whatever_the_default_dtype():
    """K = 0 (the empty sum's row scales): float32 as documented, also under torch.set_default_dtype(float64)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        a = mxkit.quantize_fp8_rowwise(torch.ones(3, 0, dtype=torch.float32))
    finally:
        torch.set_default_dtype(old)
    assert a.scale.dtype == torch.float32 and a.scale.shape == (3, 1) and a.data.shape == (3, 0)


def test_packed_weight_to_moves_every_tensor(rng):
    """to(device) moves every tensor (folded data / scale / owner, special_rows, the decode layout, the pending
    scale statistics, the dense cache) and drops none, checked on the meta device, the one other device a CPU
    has."""
    w = mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp4")
    full, flt = mxkit.pack_weight(w), mxkit.pack_weight(w, act="float")
    dense = mxkit.pack_weight(w, dense=torch.bfloat16)
    assert full.folded is not None and full.mma_q is not None and isinstance(flt.stats, torch.Tensor)
    assert dense.dense is not None
    for pw in (full, flt, dense):
        m = pw.to("meta")
        # (the optional fields read on the original: one that .to dropped would otherwise go unchecked)
        for field in ("folded", "stats", "dense", "wide", "mma_q"):
            assert (getattr(m, field) is None) == (getattr(pw, field) is None), field
        tensors = [m.source.qdata, m.source.scale, m.special_rows]
        tensors += [t for t in (m.mma_q, m.mma_s, m.dense, m.wide) if t is not None]
        if pw.folded is not None:
            tensors += [m.folded.data, m.folded.scale, m.folded.owner]
        if isinstance(pw.stats, torch.Tensor):
            tensors.append(m.stats)
        assert all(t.device.type == "meta" for t in tensors), [t.device for t in tensors]


def test_packed_weight_pytree_round_trip_keeps_each_field(rng):
    """tree_unflatten(tree_flatten(pw)) puts every leaf back in its own field (mma_q and mma_s differ in shape but
    not in what nbytes counts, so a swap is visible only field by field)."""
    w = mxkit.quantize(torch.randn(64, 128, generator=rng), "mxfp4")
    pw = mxkit.pack_weight(w, dense=torch.bfloat16)
    leaves, spec = pytree.tree_flatten(pw)
    back = pytree.tree_unflatten(leaves, spec)
    assert isinstance(back, PackedWeight) and back is not pw
    for field in ("special_rows", "mma_q", "mma_s", "dense"):
        assert getattr(back, field) is getattr(pw, field), field
    assert back.source.qdata is pw.source.qdata and back.folded.data is pw.folded.data
    assert back.stats == pw.stats


def test_packed_weight_state_dict_keeps_scale_mode_and_rounding(rng):
    w = mxkit.quantize(torch.randn(32, 64, generator=rng), "mxfp6_e2m3", scale_mode="even", rounding="away")
    sd = mxkit.pack_weight(w).state_dict()
    assert (sd["scale_mode"], sd["rounding"]) == ("even", "away")
    back = PackedWeight.source_from_state_dict(sd)
    assert (back.scale_mode, back.rounding, back.fmt.name, tuple(back.shape)) == (w.scale_mode, w.rounding,
                                                                                   "mxfp6_e2m3", (32, 64))
    assert torch.equal(back.qdata, w.qdata) and torch.equal(back.scale, w.scale)
    with pytest.raises(TypeError, match="takes a PackedWeight state_dict \\(a dict\\), got list"):  # (a KeyError)
        PackedWeight.source_from_state_dict([sd])
    for bad in (64, "32x64", torch.tensor(64)):  # (64: "not iterable"; a str was iterated)
        with pytest.raises(TypeError, match="shape must be a sequence of ints \\(N, K\\), got"):
            PackedWeight.source_from_state_dict({**sd, "shape": bad})
    for shape in (torch.tensor([32, 64]), np.array([32, 64]), [32, 64], torch.Size([32, 64])):  # (as metadata returns)
        got = PackedWeight.source_from_state_dict({**sd, "shape": shape})
        assert tuple(got.shape) == (32, 64) and all(type(n) is int for n in got.shape)


def test_partial_stats_host_reduces_every_part(rng):
    """(scale_min, scale_max, has_nan) of P per-part rows: the minimum of the minima, the maximum of the maxima,
    any part's NaN flag (a bool), whichever part holds them."""
    g = rng  # (the printed seed: replayable with MXKIT_TEST_SEED)
    for _ in range(20):
        P = int(torch.randint(2, 9, (), generator=g))
        lo = torch.randint(0, 200, (P,), generator=g)
        hi = lo + torch.randint(0, 50, (P,), generator=g)
        nan = torch.zeros(P, dtype=torch.int64)
        nan[int(torch.randint(1, P, (), generator=g))] = 1  # a NaN flag past the first part
        part = torch.stack([lo, hi, nan], 1).to(torch.int32)
        got = partial_stats_host(part)
        assert got == (int(lo.min()), int(hi.max()), True) and type(got[2]) is bool
        got = partial_stats_host(part * torch.tensor([1, 1, 0], dtype=torch.int32))
        assert got[2] is False
    empty_part = torch.tensor([[255, -1, 1], [7, 9, 0]], dtype=torch.int32)  # a part with only NaN bytes
    assert partial_stats_host(empty_part) == (7, 9, True)
