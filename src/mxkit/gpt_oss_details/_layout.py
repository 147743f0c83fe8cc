"""The GPT-OSS checkpoint layout: tensor names and shapes, config.json, safetensors headers, the errors, and
the MXFP4 blocks / scales <-> :class:`~mxkit.MXTensor` view (all documented in :mod:`mxkit.gpt_oss`)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

import torch

from ..tensor import MXTensor, as_int

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
BLOCK = 32  # E2M1 elements per E8M0 scale
BLOCK_BYTES = 16  # bytes of one block's codes

# The MoE tensors of one layer, by role: the name after "model.layers.{i}.mlp." less the "experts." of the first six.
MOE_ROLES = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
             "down_proj_blocks", "down_proj_scales", "down_proj_bias", "router.weight", "router.bias")
_FLOAT_DTYPES = ("BF16", "F16", "F32")
_ANY_FLOAT_DTYPES = _FLOAT_DTYPES + ("F64",)  # (the tensors outside the experts: _Reader.float_tensor)
_TORCH_DTYPE_NAMES = {torch.uint8: "U8", torch.int8: "I8", torch.bfloat16: "BF16", torch.float16: "F16",
                      torch.float32: "F32", torch.float64: "F64", torch.int16: "I16", torch.int32: "I32",
                      torch.int64: "I64", torch.bool: "BOOL"}
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

# openai/gpt-oss-20b's config.json (https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json); the values
# agree with transformers' GptOssConfig defaults (36 layers / 128 experts there are the 120B's).
REAL_20B_CONFIG: dict = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


class CheckpointError(ValueError):
    """A GPT-OSS directory that cannot be read as one: the message names the tensor and / or the file."""


def moe_tensor_name(layer: int, role: str) -> str:
    """The checkpoint name of one MoE tensor: ``model.layers.{layer}.mlp.experts.{role}`` (router:
    ``model.layers.{layer}.mlp.{role}``), the safetensors keys of HF's GPT-OSS checkpoints (transformers'
    ``GptOssMLP.router`` / ``.experts`` and ``Mxfp4HfQuantizer.serialized_names``: ``*_blocks``, ``*_scales``).
    Raises ValueError for a role not in :data:`MOE_ROLES` or a layer that is not an int >= 0 (NumPy's taken)."""
    layer = as_int(layer)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be an int >= 0, got {layer!r}")
    if role not in MOE_ROLES:
        raise ValueError(f"unknown MoE tensor role {role!r}; known: {', '.join(MOE_ROLES)}")
    return f"model.layers.{layer}.mlp.{'' if role.startswith('router.') else 'experts.'}{role}"


# --------------------------------------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class GptOssDims:
    """The sizes of a GPT-OSS model that fix its MoE tensors' shapes (config.json keys in brackets):
    num_layers [num_hidden_layers], num_experts [num_local_experts], top_k [num_experts_per_tok], hidden_size,
    intermediate_size, vocab_size."""

    num_layers: int
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_config(cls, config: dict, where: str = "config.json") -> "GptOssDims":
        """Read the sizes from a config.json dict. Raises CheckpointError (naming ``where``) for a missing or
        non-positive size, a top-k above the expert count, or a hidden / intermediate size that is not a multiple
        of 32 (the MXFP4 block)."""
        keys = ("num_hidden_layers", "num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size",
                "vocab_size")
        vals = [config.get(k) for k in keys]
        bad = [f"{k}={v!r}" for k, v in zip(keys, vals) if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:
            raise CheckpointError(f"{where}: {', '.join(bad)} (need positive integers)")
        dims = cls(*vals)
        if dims.top_k > dims.num_experts:
            raise CheckpointError(f"{where}: num_experts_per_tok={dims.top_k} is more than num_local_experts="
                                  f"{dims.num_experts}")
        for k in ("hidden_size", "intermediate_size"):
            if getattr(dims, k) % BLOCK:
                raise CheckpointError(f"{where}: {k}={getattr(dims, k)} is not a multiple of the MXFP4 block {BLOCK}")
        return dims

    def moe_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint shape of each role of :data:`MOE_ROLES`."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        return {"gate_up_proj_blocks": (E, 2 * I, H // BLOCK, BLOCK_BYTES),
                "gate_up_proj_scales": (E, 2 * I, H // BLOCK),
                "gate_up_proj_bias": (E, 2 * I), "down_proj_blocks": (E, H, I // BLOCK, BLOCK_BYTES),
                "down_proj_scales": (E, H, I // BLOCK), "down_proj_bias": (E, H), "router.weight": (E, H),
                "router.bias": (E,)}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not readable JSON: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} holds a JSON {type(data).__name__}, not an object")
    return data


def _stays_unquantized(module: str, patterns: Sequence[str]) -> bool:
    """Whether a ``modules_to_not_convert`` pattern covers ``module``: transformers' ``should_convert_module``
    (quantizers/quantizers_utils.py), negated: a regex matched from the start up to a module boundary, or a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return any(re.match(rf"(?:{p}){boundary}", module) or module.endswith(p) for p in patterns)


def _gpt_oss_config(root: Path) -> tuple[dict, GptOssDims]:
    """config.json of an MXFP4 GPT-OSS directory and its dims; CheckpointError when it is not one."""
    path = root / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {str(root)!r}")
    config = _read_json(path)
    if config.get("model_type") != "gpt_oss":
        raise CheckpointError(f"{str(path)!r}: model_type is {config.get('model_type')!r}, not 'gpt_oss'")
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "mxfp4":
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        raise CheckpointError(f"{str(path)!r}: quantization_config.quant_method is {method!r}, not 'mxfp4' "
                              "(the experts are not stored as MXFP4 blocks and scales)")
    dims = GptOssDims.from_config(config, where=repr(str(path)))
    patterns = qc.get("modules_to_not_convert") or []
    if not isinstance(patterns, list) or not all(isinstance(q, str) for q in patterns):
        raise CheckpointError(f"{str(path)!r}: quantization_config.modules_to_not_convert must be a list of strings, "
                              f"got {patterns!r}")
    try:
        kept = [i for i in range(dims.num_layers) if _stays_unquantized(f"model.layers.{i}.mlp.experts", patterns)]
    except re.error as e:
        raise CheckpointError(f"{str(path)!r}: a modules_to_not_convert pattern is not a regex: {e}") from e
    if kept:
        raise CheckpointError(f"{str(path)!r}: modules_to_not_convert {patterns} keeps the experts of layers {kept} "
                              "unquantized; only MXFP4 experts are supported")
    return config, dims


def as_path(path, what: str) -> Path:
    """``path`` (a str or os.PathLike) as a Path; TypeError naming ``what`` for anything else (pathlib's own error
    named no argument)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike), got {type(path).__name__}")
    return Path(path)


def is_gpt_oss_mxfp4_dir(path: Union[str, Path]) -> bool:
    """True when ``path`` is a directory whose config.json names ``model_type`` ``"gpt_oss"`` with
    ``quantization_config.quant_method`` ``"mxfp4"``. False for anything else (a file, no config.json, another
    model, a config.json that is not a readable JSON object: :func:`load_gpt_oss` names what is wrong with it);
    TypeError for a ``path`` that is not a str or os.PathLike."""
    path = as_path(path, "path")
    if not (path / "config.json").is_file():
        return False
    try:
        config = _read_json(path / "config.json")
    except CheckpointError:
        return False
    qc = config.get("quantization_config")
    return config.get("model_type") == "gpt_oss" and isinstance(qc, dict) and qc.get("quant_method") == "mxfp4"


# --------------------------------------------------------------------------------------------------------
# MXTensor <-> blocks / scales


def mxtensor_from_blocks(blocks: torch.Tensor, scales: torch.Tensor, name: str = "blocks") -> MXTensor:
    """GPT-OSS ``*_blocks`` / ``*_scales`` → an MXFP4 :class:`~mxkit.MXTensor`, without copying.

    blocks: uint8 (..., G, 16), 32 E2M1 codes per 16 bytes, element 2j in the low nibble of byte j.
    scales: uint8 (..., G), E8M0.
    Returns MXTensor ``mxfp4_e2m1`` of logical shape (..., 32·G), axis last, block 32: ``qdata`` (..., 16·G) is
    ``blocks`` reshaped (a view when ``blocks`` is contiguous, as safetensors tensors are), ``scale`` is ``scales``.
    Source: the GPT-OSS checkpoint layout as transformers reads it (element 2j in the low nibble):
    ``transformers.integrations.mxfp4.convert_moe_packed_tensors(blocks, scales)`` is ``dequantize`` of this
    MXTensor transposed (1, 2), bit for bit in float32 and bfloat16, for scale bytes other than 0xFF.
    Raises CheckpointError (naming ``name``) for a non-tensor, another dtype or shapes that do not pair.
    """
    for what, t in (("blocks", blocks), ("scales", scales)):
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{name}: {what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.uint8:
            raise CheckpointError(f"{name}: {what} must be uint8, got {t.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK_BYTES or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise CheckpointError(f"{name}: blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair "
                              f"as (..., G, {BLOCK_BYTES}) and (..., G)")
    *lead, groups, _ = blocks.shape
    qdata = blocks.reshape(*lead, groups * BLOCK_BYTES)
    return MXTensor(qdata, scales, "mxfp4_e2m1", axis=len(lead), block_size=BLOCK, shape=(*lead, groups * BLOCK))


def blocks_from_mxtensor(t: MXTensor, name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """An MXFP4 :class:`~mxkit.MXTensor` (axis last, block 32, plain scales) → GPT-OSS ``(blocks, scales)``:
    blocks uint8 (..., G, 16) (a view of ``qdata`` when it is contiguous), scales uint8 (..., G) (``t.scale``).
    The inverse of :func:`mxtensor_from_blocks` (the same source: the GPT-OSS checkpoint layout, nibble order as
    ``transformers.integrations.mxfp4.convert_moe_packed_tensors``). Raises CheckpointError (naming ``name``) for
    a non-MXTensor, another format, axis, block size or scale layout."""
    if not isinstance(t, MXTensor):
        raise CheckpointError(f"{name}: expected an MXTensor, got {type(t).__name__}")
    if (t.fmt.name, t.axis, t.block_size, t.scale_layout) != ("mxfp4_e2m1", t.ndim - 1, BLOCK, "plain"):
        raise CheckpointError(f"{name}: GPT-OSS stores mxfp4_e2m1 along the last axis in blocks of {BLOCK} with plain "
                              f"scales; got {t.fmt.name}, axis={t.axis} of {t.ndim}, block_size={t.block_size}, "
                              f"scale_layout={t.scale_layout!r}")
    *lead, groups = t.scale.shape
    return t.qdata.reshape(*lead, groups, BLOCK_BYTES), t.scale


# --------------------------------------------------------------------------------------------------------
# safetensors headers


def _header(path: Path) -> tuple[int, int, object]:
    """(file size, header length n, the parsed JSON header) of a safetensors file: an 8-byte little-endian n, then
    n bytes of JSON. Raises ValueError (or UnicodeDecodeError) for a header that does not fit or parse."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if size < 8 or n > size - 8:
            raise ValueError(f"header length {n} does not fit the file's {size} bytes")
        return size, n, json.loads(fh.read(n))  # (json.JSONDecodeError is a ValueError)


def _cut_off(path: Path) -> str:
    """For the error of an unreadable safetensors file: ``"; tensors past the end of the file: ..."`` naming those
    whose header data range runs past the file's bytes (a truncated file whose header is intact), else ""."""
    try:
        size, n, header = _header(path)
    except (OSError, ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(header, dict):
        return ""
    cut = [k for k, v in header.items() if isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
           and len(v["data_offsets"]) == 2 and isinstance(v["data_offsets"][1], int)
           and v["data_offsets"][1] > size - 8 - n]
    if not cut:
        return ""
    more = f" and {len(cut) - 8} more" if len(cut) > 8 else ""
    return f"; tensors past the end of the file ({size} bytes): {', '.join(cut[:8])}{more}"


def _data_ranges(path: Path, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Absolute byte range ``[begin, end)`` of each named tensor's data in a safetensors file, parsed from the file
    itself: an 8-byte little-endian header length n, n bytes of JSON ``{name: {"data_offsets": [b, e], ...}}``, then
    the data (offsets relative to its start, 8 + n). Raises CheckpointError naming the file (and the tensor) for an
    unreadable header or a range outside the file."""
    try:
        size, n, header = _header(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file: {e}") from e
    out = {}
    for name in names:
        entry = header.get(name) if isinstance(header, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        ok = (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
              and 0 <= offsets[0] <= offsets[1] <= size - 8 - n)
        if not ok:
            raise CheckpointError(f"{name} in {str(path)!r}: header data_offsets {offsets!r} are not a range of the "
                                  f"file's {size - 8 - n} data bytes")
        out[name] = (8 + n + offsets[0], 8 + n + offsets[1])
    return out
