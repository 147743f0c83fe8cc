"""GPT-OSS checkpoints: the MXFP4 experts of a Hugging Face safetensors directory as :class:`~mxkit.MXTensor` s,
loaded memory-mapped and saved back byte for byte, never dequantized on the way (layer ``nn``: imports ``tensor``,
``ops`` and ``_table``).

Checkpoint layout of decoder layer ``i`` (E experts, hidden H, expert intermediate I; prefix
``model.layers.{i}.mlp.``), matched to transformers 5.23: ``integrations/mxfp4.py`` (``_convert_moe_packed_tensors``,
the dequantizer), ``quantizers/quantizer_mxfp4.py`` (``Mxfp4HfQuantizer.serialized_names``) and
``models/gpt_oss/modeling_gpt_oss.py`` (``GptOssExperts``, ``GptOssTopKRouter``):

* ``experts.gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16], ``experts.gate_up_proj_scales`` uint8 [E, 2I, H/32],
  ``experts.gate_up_proj_bias`` bf16 [E, 2I];
* ``experts.down_proj_blocks`` uint8 [E, H, I/32, 16], ``experts.down_proj_scales`` uint8 [E, H, I/32],
  ``experts.down_proj_bias`` bf16 [E, H];
* ``router.weight`` bf16 [E, H], ``router.bias`` bf16 [E].

Conventions (each with the line of transformers it is read from):

* a block's 16 bytes hold its 32 E2M1 codes, element 2j in the low nibble of byte j
  (``sub[:, 0::2] = lut[blk & 0x0F]``, ``sub[:, 1::2] = lut[blk >> 4]``): blocks [E, N, G, 16] reshaped to
  [E, N, G·16] are exactly mxkit's FP4 ``qdata`` of an [E, N, K = 32·G] tensor quantized along its last axis;
* a scale byte s means 2^(s − 127) (``torch.ldexp(sub, scales - 127)``): E8M0. Byte 0xFF is NaN for mxkit
  (OCP MX v1.0 §5.4) and 2^128 for transformers; GPT-OSS checkpoints hold neither;
* weights are [E, N, K] in the checkpoint (output rows N, input K along the blocks), while transformers'
  dequantized ``GptOssExperts.gate_up_proj`` is [E, H, 2I] and ``down_proj`` [E, I, H], i.e. [E, K, N]
  (``_convert_moe_packed_tensors`` ends in ``.transpose(1, 2)``); :func:`hf_state_dict` transposes;
* gate_up rows interleave gate (even rows) and up (odd rows) (``GptOssExperts._apply_gate``:
  ``gate_up[..., ::2], gate_up[..., 1::2]``).

A directory is ``config.json`` (``model_type`` ``"gpt_oss"``, ``quantization_config`` ``{"quant_method": "mxfp4",
"modules_to_not_convert": [...]}``) plus either ``model.safetensors`` or shards listed by
``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}``, each file a
path relative to the directory, subfolders allowed, ``..`` and absolute paths not).

Errors: :class:`CheckpointError` (a ValueError) names the tensor and the file for a missing, misshapen or mistyped
tensor, and the file for an unreadable (truncated, corrupt) one.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import math
import operator
import os
import re
import shutil
import stat
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import torch

from .ops import dequantize
from .tensor import MXTensor

__all__ = [
    "CheckpointError",
    "GptOssDims",
    "GptOssMoE",
    "GptOssCheckpoint",
    "GptOssSummary",
    "MOE_ROLES",
    "REAL_20B_CONFIG",
    "moe_tensor_name",
    "mxtensor_from_blocks",
    "blocks_from_mxtensor",
    "is_gpt_oss_mxfp4_dir",
    "load_gpt_oss",
    "save_gpt_oss",
    "write_synthetic_gpt_oss",
    "summarize_gpt_oss",
    "print_gpt_oss_summary",
    "hf_state_dict",
    "hf_config",
    "load_hf_model",
]

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
    Raises ValueError for a role not in :data:`MOE_ROLES`."""
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


def is_gpt_oss_mxfp4_dir(path: Union[str, Path]) -> bool:
    """True when ``path`` is a directory whose config.json names ``model_type`` ``"gpt_oss"`` with
    ``quantization_config.quant_method`` ``"mxfp4"``. False for anything else (a file, no config.json, another
    model, a config.json that is not a readable JSON object: :func:`load_gpt_oss` names what is wrong with it)."""
    path = Path(path)
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
# reading


class _Reader:
    """The safetensors files of a directory: tensor → file, headers, tensors (memory-mapped by ``safe_open``). The
    files are transformers' choice: ``model.safetensors`` where it exists (a stale index or shards beside it, left by
    a re-save as one file, are not read), else the index's shards, else every ``*.safetensors`` file (a tensor in
    two of them: CheckpointError). Every failure is a CheckpointError naming the tensor and file; an index
    value that is absolute or holds ``..`` (a file outside the directory, which a save could not write back into
    it) is one naming the tensor and the value."""

    def __init__(self, root: Path, stack: contextlib.ExitStack):
        self.root, self._stack, self._handles = root, stack, {}
        index = root / INDEX_NAME
        if index.is_file() and not (root / SINGLE_NAME).is_file():
            data = _read_json(index)
            wmap = data.get("weight_map")
            if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
                raise CheckpointError(f"{str(index)!r} has no weight_map of tensor → file name")
            for k, v in wmap.items():
                if Path(v).is_absolute() or ".." in Path(v).parts:
                    raise CheckpointError(f"{str(index)!r} maps {k} to {v!r}, outside the directory; weight_map "
                                          "values must be paths relative to it without '..'")
            self.index: Optional[Path] = index
            self.weight_map = {k: root / v for k, v in wmap.items()}
            for f in sorted(set(self.weight_map.values())):
                if not f.is_file():
                    example = next(k for k, v in self.weight_map.items() if v == f)
                    raise CheckpointError(f"shard {str(f)!r} listed by {str(index)!r} (e.g. for {example}) is missing")
        else:
            self.index, self.weight_map = None, {}
            single = root / SINGLE_NAME
            files = [single] if single.is_file() else sorted(  # (iterdir: an unlistable folder raises, not "none")
                f for f in root.iterdir() if f.suffix == ".safetensors" and f.is_file())
            if not files:
                raise CheckpointError(f"no *.safetensors files and no {INDEX_NAME} in {str(root)!r}")
            for f in files:
                for k in self.open(f).keys():
                    if k in self.weight_map:
                        raise CheckpointError(f"{k} is in both {str(self.weight_map[k])!r} and {str(f)!r}")
                    self.weight_map[k] = f
        self.files = tuple(sorted(set(self.weight_map.values())))

    def open(self, f: Path):
        if f not in self._handles:
            from safetensors import SafetensorError, safe_open

            from ._files import check_readable, openable_name

            try:
                check_readable(f)  # (safetensors reports a file it may not read as missing)
                self._handles[f] = self._stack.enter_context(safe_open(openable_name(f, self._stack), framework="pt"))
            except SafetensorError as e:  # truncated or corrupt: one line naming the file, and the tensors cut off
                raise CheckpointError(f"{str(f)!r} is not a readable safetensors file: "
                                      f"{' '.join(str(e).split())}{_cut_off(f)}") from e
            except OSError as e:  # (a folder or a dangling link named *.safetensors, no permission)
                raise CheckpointError(f"{str(f)!r} cannot be read: {e.strerror or e}") from e
        return self._handles[f]

    def _file_of(self, name: str) -> Path:
        f = self.weight_map.get(name)
        if f is None:
            where = repr(str(self.index)) if self.index else ", ".join(repr(p.name) for p in self.files)
            raise CheckpointError(f"missing tensor {name}: not in {where} ({self.root})")
        return f

    def meta(self, name: str) -> tuple[tuple[int, ...], str]:
        """(shape, safetensors dtype string) from the header."""
        f = self._file_of(name)
        fh = self.open(f)
        if name not in fh.keys():
            raise CheckpointError(f"missing tensor {name}: {str(self.index)!r} maps it to {str(f)!r}, "
                                  "which does not hold it")
        sl = fh.get_slice(name)
        return tuple(sl.get_shape()), sl.get_dtype()

    def tensor(self, name: str) -> torch.Tensor:
        f = self._file_of(name)
        try:
            return self.open(f).get_tensor(name)
        except Exception as e:  # safetensors / torch errors on a damaged data section
            raise CheckpointError(f"{name} in {str(f)!r} cannot be read: {' '.join(str(e).split())}") from e

    def checked(self, name: str, shape: tuple[int, ...], dtypes: Sequence[str]) -> torch.Tensor:
        """The tensor, after its header's shape and dtype are checked against ``shape`` / ``dtypes``."""
        got_shape, got_dtype = self.meta(name)
        f = self._file_of(name)
        if got_dtype not in dtypes:
            raise CheckpointError(f"{name} in {str(f)!r}: dtype {got_dtype}, expected {' or '.join(dtypes)}")
        if got_shape != tuple(shape):
            raise CheckpointError(f"{name} in {str(f)!r}: shape {list(got_shape)}, expected {list(shape)} "
                                  "(from config.json)")
        return self.tensor(name)

    def float_tensor(self, name: str) -> torch.Tensor:
        """A tensor outside the MoE experts (every one of GPT-OSS's is bf16 in the real checkpoints): a floating
        dtype is checked in its header (an integer one was cast to float silently, or failed inside torch)."""
        _, got = self.meta(name)
        if got not in _ANY_FLOAT_DTYPES:
            raise CheckpointError(f"{name} in {str(self._file_of(name))!r}: dtype {got}, expected a float dtype "
                                  f"({' / '.join(_ANY_FLOAT_DTYPES)})")
        return self.tensor(name)

    def nbytes(self, name: str) -> int:
        shape, dtype = self.meta(name)
        if dtype in _DTYPE_BYTES:
            return math.prod(shape) * _DTYPE_BYTES[dtype]
        return self.tensor(name).nbytes  # a dtype the table lacks: ask torch (memory-mapped, no read)


@dataclass(frozen=True, eq=False)
class GptOssMoE:
    """One decoder layer's MoE weights as loaded (E experts, hidden H, intermediate I).

    gate_up: MXTensor mxfp4_e2m1 [E, 2I, H], axis 2 (rows interleave gate / up); down: MXTensor [E, H, I], axis 2;
    gate_up_bias [E, 2I], down_bias [E, H], router_weight [E, H], router_bias [E]: the checkpoint's dtype (bf16).
    Weights are [E, N, K] (``y = x @ W[e].T + b[e]``), the checkpoint's orientation, not transformers' [E, K, N].
    """

    layer: int
    gate_up: MXTensor
    gate_up_bias: torch.Tensor
    down: MXTensor
    down_bias: torch.Tensor
    router_weight: torch.Tensor
    router_bias: torch.Tensor

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The eight tensors under their checkpoint names (``*_blocks`` [E, N, G, 16], ``*_scales`` [E, N, G]).
        Raises CheckpointError when an MXTensor is not MXFP4 along its last axis with plain scales."""
        out = {}
        for proj, t in (("gate_up_proj", self.gate_up), ("down_proj", self.down)):
            blocks_name = moe_tensor_name(self.layer, f"{proj}_blocks")
            out[blocks_name], out[moe_tensor_name(self.layer, f"{proj}_scales")] = blocks_from_mxtensor(t, blocks_name)
        out[moe_tensor_name(self.layer, "gate_up_proj_bias")] = self.gate_up_bias
        out[moe_tensor_name(self.layer, "down_proj_bias")] = self.down_bias
        out[moe_tensor_name(self.layer, "router.weight")] = self.router_weight
        out[moe_tensor_name(self.layer, "router.bias")] = self.router_bias
        return out


@dataclass(frozen=True, eq=False)
class GptOssCheckpoint:
    """The MoE layers of a GPT-OSS directory: ``path``, its config.json (``config``), ``dims`` and ``layers``
    (the :class:`GptOssMoE` of the layers loaded, in the order asked). Tensors are memory-mapped views of the files."""

    path: Path
    config: dict
    dims: GptOssDims
    layers: tuple[GptOssMoE, ...]

    def layer(self, i: int) -> GptOssMoE:
        """The loaded layer with index ``i``; KeyError if it was not loaded."""
        for moe in self.layers:
            if moe.layer == i:
                return moe
        raise KeyError(f"layer {i} was not loaded (loaded: {[m.layer for m in self.layers]})")


def _load_layer(reader: _Reader, dims: GptOssDims, i: int) -> GptOssMoE:
    shapes = dims.moe_shapes()
    t = {role: reader.checked(moe_tensor_name(i, role), shapes[role],
                              ("U8",) if role.endswith(("_blocks", "_scales")) else _FLOAT_DTYPES)
         for role in MOE_ROLES}
    return GptOssMoE(
        layer=i,
        gate_up=mxtensor_from_blocks(t["gate_up_proj_blocks"], t["gate_up_proj_scales"],
                                     moe_tensor_name(i, "gate_up_proj_blocks")),
        gate_up_bias=t["gate_up_proj_bias"],
        down=mxtensor_from_blocks(t["down_proj_blocks"], t["down_proj_scales"], moe_tensor_name(i, "down_proj_blocks")),
        down_bias=t["down_proj_bias"], router_weight=t["router.weight"], router_bias=t["router.bias"],
    )


def _layer_list(layers: Optional[Iterable[int]], dims: GptOssDims) -> list[int]:
    if layers is not None and (isinstance(layers, (str, bytes, int)) or not isinstance(layers, Iterable)):
        raise TypeError(f"layers must be an iterable of layer indices (ints) or None, got {layers!r}")
    idx = list(range(dims.num_layers)) if layers is None else list(layers)
    try:
        if any(isinstance(i, bool) for i in idx):
            raise TypeError
        idx = [operator.index(i) for i in idx]
    except TypeError:
        raise TypeError(f"layers must hold ints, got {idx!r}") from None
    bad = [i for i in idx if not 0 <= i < dims.num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for num_hidden_layers={dims.num_layers}")
    if len(set(idx)) != len(idx):
        raise ValueError(f"layers {idx} names a layer more than once")
    return idx


def load_gpt_oss(path: Union[str, Path], *, layers: Optional[Iterable[int]] = None,
                 progress: bool = True) -> GptOssCheckpoint:
    """Load the MoE tensors of an MXFP4 GPT-OSS directory without dequantizing them (layout: module docstring).

    path: a Hugging Face directory (config.json, ``model.safetensors`` or shards with ``model.safetensors.index.json``).
    layers: which decoder layers (default all). progress: a tqdm bar over the layers.
    Returns a :class:`GptOssCheckpoint` (its ``path`` absolute: a later save reads the same directory whatever
    the working directory is then); each expert weight is an MXTensor mxfp4_e2m1 [E, N, K] whose qdata
    (uint8 [E, N, K/2]) and scale (uint8 [E, N, K/32]) are views of the memory-mapped files (``safe_open``).
    Raises CheckpointError (a ValueError) for: no / unreadable / non-GPT-OSS / non-MXFP4 config.json; a missing
    shard, a truncated or corrupt file (naming the file); a missing tensor, a wrong shape (against config.json) or
    dtype (uint8 for blocks and scales, BF16 / F16 / F32 for biases and router) (naming the tensor and file).
    ValueError for a layer index out of range or named twice, TypeError for ``layers`` that is not an iterable of ints.
    """
    from tqdm.auto import tqdm

    root = Path(os.path.abspath(path))  # (a relative path: save_gpt_oss would read another cwd's directory)
    if not root.is_dir():
        raise CheckpointError(f"{str(root)!r} is not a directory")
    config, dims = _gpt_oss_config(root)
    idx = _layer_list(layers, dims)
    with contextlib.ExitStack() as stack:  # the tensors outlive the handles: they hold their own mappings
        reader = _Reader(root, stack)
        loaded = tuple(_load_layer(reader, dims, i)
                       for i in tqdm(idx, desc="load GPT-OSS MoE", unit="layer", disable=not progress))
    return GptOssCheckpoint(root, config, dims, loaded)


# --------------------------------------------------------------------------------------------------------
# writing


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under ``root`` (symlinks are not followed), ``root`` last."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            if not os.path.islink(os.path.join(dirpath, name)):
                _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _check_replacement(reader: _Reader, name: str, t: torch.Tensor) -> None:
    shape, dtype = reader.meta(name)
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"{name}: the value to save is a {type(t).__name__}, not a tensor")
    if tuple(t.shape) != shape or _TORCH_DTYPE_NAMES.get(t.dtype) != dtype:
        raise CheckpointError(f"{name}: the tensor to save is {t.dtype} {list(t.shape)}, but "
                              f"{str(reader.weight_map[name])!r} holds {dtype} {list(shape)}; a save keeps the "
                              "directory's shapes and dtypes")


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


def _write_shard(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Copy the safetensors file ``src`` to ``dst`` byte for byte (its mode too), then overwrite the data of each
    tensor of ``tensors`` (name → tensor of the stored dtype and shape, any device, contiguous or not) in place, one
    at a time. Raises CheckpointError (naming the tensor and file) when a tensor's byte count is not its stored
    range's, before ``dst`` is written."""
    ranges = _data_ranges(src, tensors)
    for name, t in tensors.items():
        begin, end = ranges[name]
        if t.nbytes != end - begin:
            raise CheckpointError(f"{name}: the tensor to save has {t.nbytes} bytes, but {str(src)!r} stores it in "
                                  f"{end - begin}")
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        for name, t in tensors.items():
            fh.seek(ranges[name][0])
            fh.write(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    shutil.copymode(src, dst)


def _carry_tree(src: Path, dst: Path, skip: set[Path]) -> list[Path]:
    """Recreate the directory ``src`` in ``dst`` (which may exist) without using disk: regular files hard-linked
    (copied by ``shutil.copy2`` where linking fails, e.g. across file systems), symlinks recreated with the same
    target, subdirectories recursively; FIFOs, sockets and devices are left out, and so are the files in ``skip``.
    Returns the directories made, parents first (their modes are the caller's to set, once they are filled)."""
    made = []
    if not dst.is_dir():
        dst.mkdir()
        made.append(dst)
    for entry in os.scandir(src):
        s, d = Path(entry.path), dst / entry.name
        if s in skip:
            continue
        if entry.is_symlink() and not d.is_dir():  # (a symlinked folder that holds a written shard: walked below)
            os.symlink(os.readlink(s), d)
        elif entry.is_dir():
            made += _carry_tree(s, d, skip)
        elif entry.is_file():
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)
    return made


def _is_checkpoint_dir(d: Path) -> bool:
    """Whether ``d`` is empty or holds a config.json or a *.safetensors file (what ``overwrite=True`` may replace)."""
    entries = list(d.iterdir())
    return not entries or any(e.name == "config.json" or e.name.endswith(".safetensors") for e in entries)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the two existing paths ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the system or file system has no such call (nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_into_place(tmp: Path, dst: Path) -> None:
    """Put the finished ``tmp`` directory at ``dst`` (not a symlink). An existing ``dst`` is exchanged with ``tmp``
    in one atomic step where the system can (Linux), else renamed aside first and restored if the second rename is
    interrupted or fails: ``dst`` holds the old or the new contents whatever happens, but for the instant between
    the two renames of the fallback. The previous contents are removed after: where that fails, a warning names the
    directory left behind, and the save still stands."""
    if not dst.exists():
        os.rename(tmp, dst)
        return
    if _exchange(tmp, dst):
        old = tmp  # (now holding the previous contents: named as such before it is removed)
        with contextlib.suppress(OSError):
            aside = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
            os.rmdir(aside)
            os.rename(tmp, aside)
            old = aside
    else:
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
        os.rmdir(old)
        try:
            os.rename(dst, old)
            os.rename(tmp, dst)
        except BaseException:  # (an interrupt between the renames included: put the old contents back)
            if old.exists() and not dst.exists():
                os.rename(old, dst)
            raise
    try:
        shutil.rmtree(old)
    except OSError as e:
        warnings.warn(f"saved {str(dst)!r}, but its previous contents, moved to {str(old)!r}, could not be "
                      f"removed ({e}); delete that directory by hand", RuntimeWarning, stacklevel=3)


def save_gpt_oss(ckpt: GptOssCheckpoint, dst: Union[str, Path], *, overwrite: bool = False,
                 progress: bool = True) -> Path:
    """Write ``ckpt``'s directory to ``dst`` with its MoE layers taken from ``ckpt.layers``, in the same layout.

    Every safetensors file of ``ckpt.path`` is copied byte for byte to the same path relative to ``dst`` (a shard
    the index lists as ``w/name`` goes to ``dst/w/name``), then the loaded layers' eight MoE tensors are written over
    their stored bytes: MXTensors back to ``*_blocks`` [E, N, G, 16] and ``*_scales`` [E, N, G] by
    :func:`blocks_from_mxtensor`, each tensor's bytes in place (shapes and dtypes are the source's, so no header
    changes; tensors may share memory). Every other regular file at the top of ``ckpt.path`` (config.json, the
    index, tokenizer files) is copied byte for byte. Files keep their source's mode, and the new directory that of
    the ``dst`` it replaces, else that of ``ckpt.path``. A load → save round trip gives identical files, whatever
    wrote the source. Memory: one tensor at a time (made contiguous on the CPU if it is not).

    Subdirectories (the real openai/gpt-oss-20b holds ``original/`` and ``metal/``): where ``dst`` is ``ckpt.path``
    itself (same file, symlinks followed), every one is carried into the new directory by hard links (copies where
    linking fails), taking no extra disk; for another ``dst`` they are not copied, beyond the folders holding shards.

    Atomic: everything is written to a temporary directory beside ``dst`` (fsynced) and renamed to ``dst``; on any
    exception the temporary directory and any parent folders of ``dst`` the save made are removed and ``dst`` is
    untouched. With ``overwrite=True`` an existing ``dst`` (``ckpt.path`` itself included) that is empty or holds a
    checkpoint (a config.json or *.safetensors) is replaced whole (a separate ``dst``'s own files and
    subdirectories are gone): exchanged with the new directory in one atomic step on Linux (elsewhere renamed aside
    first, restored if interrupted; between the two renames ``dst`` is briefly absent), then its old contents are
    deleted (a failed deletion is a RuntimeWarning naming the directory left; an interrupt during it propagates
    with the new checkpoint already at ``dst``). A ``dst`` that is a symlink is
    resolved first: its target is replaced and the link keeps pointing at it.
    Returns ``dst`` as given. Raises TypeError for a ``ckpt`` that is not a GptOssCheckpoint; ValueError for
    ``ckpt.layers`` holding a layer twice; FileExistsError if ``dst`` exists and ``overwrite`` is False, is not a
    directory, or is a non-empty directory holding no checkpoint; ValueError for a ``dst`` that holds ``ckpt.path``
    (a parent of it: replacing it would delete the source); CheckpointError (naming the tensor) when a layer's
    tensor no longer matches the source's shape or dtype, or an MXTensor is not MXFP4 along its last axis; and the
    errors of reading the source (see :func:`load_gpt_oss`).
    """
    from tqdm.auto import tqdm

    if not isinstance(ckpt, GptOssCheckpoint):
        raise TypeError(f"save_gpt_oss takes a GptOssCheckpoint (load_gpt_oss), got {type(ckpt).__name__}")
    seen = [m.layer for m in ckpt.layers]
    if len(set(seen)) != len(seen):
        raise ValueError(f"ckpt.layers holds layer {next(i for i in seen if seen.count(i) > 1)} more than once")
    src, given = Path(os.path.abspath(ckpt.path)), Path(dst)
    # (absolute: "." has no name and is its own parent, which put the temporary folder inside dst)
    dst = given.resolve() if given.is_symlink() else Path(os.path.abspath(given))
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{str(given)!r} exists; pass overwrite=True to replace it")
    if dst.exists() and not dst.is_dir():
        raise FileExistsError(f"{str(given)!r} exists and is not a directory")
    replace = {}
    for moe in ckpt.layers:
        replace.update(moe.checkpoint_tensors())
    with contextlib.ExitStack() as stack:
        reader = _Reader(src, stack)
        for name, t in replace.items():
            _check_replacement(reader, name, t)
        in_place = dst.exists() and dst.samefile(src)
        if dst.exists() and not in_place and src.resolve().is_relative_to(dst.resolve()):
            raise ValueError(f"{str(given)!r} holds the source directory {str(src)!r}: replacing it would delete "
                             "the source; save elsewhere or onto the source itself")
        if dst.exists() and not in_place and not _is_checkpoint_dir(dst):
            raise FileExistsError(f"{str(given)!r} is a non-empty directory that holds no checkpoint (no config.json "
                                  "or *.safetensors): overwrite=True replaces a saved checkpoint, not any folder; "
                                  "save to a new or empty directory")
        mode = _mode(dst if dst.exists() else src)
        new_parents = []
        p = dst.parent
        while not p.exists():
            new_parents.append(p)
            p = p.parent
        tmp = None
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)  # (in the try: a failure here removes what it made too)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent))
            made = []  # folders of tmp to give their source's mode, once filled
            for f in tqdm(reader.files, desc="save GPT-OSS", unit="file", disable=not progress):
                rel = f.relative_to(src)
                for part in reversed(rel.parents[:-1]):
                    if not (tmp / part).is_dir():
                        (tmp / part).mkdir()
                        made.append(tmp / part)
                # (only where the index puts the tensor: a stale copy in another shard is carried as it is)
                _write_shard(f, tmp / rel, {k: replace[k] for k in reader.open(f).keys()
                                            if k in replace and reader.weight_map.get(k) == f})
            for f in sorted(src.iterdir()):
                if f in reader.files:
                    continue
                if f.is_file():
                    shutil.copy2(f, tmp / f.name)
                elif in_place and f.is_symlink() and f.is_dir() and not (tmp / f.name).is_dir():
                    os.symlink(os.readlink(f), tmp / f.name)
                elif in_place and f.is_dir():
                    made += _carry_tree(f, tmp / f.name, set(reader.files))
            for d in reversed(made):
                os.chmod(d, _mode(src / d.relative_to(tmp)))
            os.chmod(tmp, mode)
            _fsync_tree(tmp)
            _swap_into_place(tmp, dst)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for p in new_parents:
                with contextlib.suppress(OSError):
                    os.rmdir(p)
            raise
    return given


# --------------------------------------------------------------------------------------------------------
# a synthetic directory


def _shard_plan(sizes: list[tuple[str, int]], shards: int) -> list[list[str]]:
    """Tensors in order, cut into ``shards`` runs of about equal bytes, none empty (needs ``len(sizes) >= shards``)."""
    total = sum(n for _, n in sizes)
    plan: list[list[str]] = [[] for _ in range(shards)]
    k = done = 0
    for j, (name, n) in enumerate(sizes):
        if j:  # the byte boundary's shard, one step at most, and never so late that a later shard stays empty
            k = max(min(done * shards // total, k + 1, shards - 1), k, shards - (len(sizes) - j))
        plan[k].append(name)
        done += n
    return plan


def _random_bytes(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Uniform uint8 of ``shape`` (numel a multiple of 8): int64 words viewed as bytes, 5x faster than randint."""
    n = math.prod(shape)
    return torch.empty(n // 8, dtype=torch.int64).random_(-2**63, 2**63 - 1, generator=g).view(torch.uint8).view(shape)


def write_synthetic_gpt_oss(
    dst: Union[str, Path],
    *,
    num_layers: int = 2,
    num_experts: int = 32,
    top_k: int = 4,
    hidden_size: int = 2880,
    intermediate_size: int = 2880,
    vocab_size: int = 201088,
    num_attention_heads: int = 64,
    num_key_value_heads: int = 8,
    head_dim: int = 64,
    shards: int = 1,
    scale_range: tuple[int, int] = (115, 130),
    seed: Optional[int] = None,
    progress: bool = False,
) -> Path:
    """Write a random GPT-OSS directory in the exact Hugging Face layout of openai/gpt-oss-20b into ``dst``.

    Defaults: GPT-OSS-20B's dims (:data:`REAL_20B_CONFIG`) with 2 layers. config.json is the real one with the
    given sizes (``layer_types`` alternating sliding / full as in the real 24, ``experts_per_token`` =
    ``num_experts_per_tok`` = ``top_k``); with ``vocab_size`` below the real 201088, ``pad_token_id`` /
    ``eos_token_id`` become ``vocab_size - 1`` / ``- 2`` so they stay inside the vocabulary.
    Tensors: every tensor of ``GptOssForCausalLM`` (names of the real checkpoint), experts as MXFP4 blocks of
    uniformly random bytes (all 16 E2M1 codes in both nibbles) and scales uniform in ``scale_range`` (inclusive;
    115..130 is 2^-12..2^3), the rest bf16: N(0, 0.02²) weights and biases, norms 1 + N(0, 0.02²), sinks N(0, 1).
    shards: 1 writes ``model.safetensors``; more write ``model-0000k-of-0000n.safetensors`` of about equal bytes
    plus ``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``), as ``save_pretrained`` does.
    num_attention_heads / num_key_value_heads / head_dim: the attention's shapes in config.json and the q / k /
    v / o tensors (GPT-OSS-20B's 64 / 8 / 64). seed: None draws a fresh one. progress: a tqdm bar over the
    layers written. ``dst`` is created (it must not hold a config.json already); the files are written into a
    temporary folder in it and renamed into place, config.json last, so a failure leaves no partial checkpoint.
    Returns ``dst``. Raises ValueError for sizes that are not multiples of 32, a bad ``scale_range`` or ``shards``,
    or heads that are not a multiple of the k / v heads; TypeError for a ``seed`` that is not an int or None;
    :class:`CheckpointError` (a ValueError) for a ``num_layers``, ``num_experts``, ``top_k``, ``hidden_size``,
    ``intermediate_size``, ``vocab_size`` or attention size that is not a positive int (named by its config.json
    key: ``num_hidden_layers``, ``num_local_experts``, ``num_experts_per_tok``, ...); FileExistsError when ``dst`` already holds a config.json.
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    dst = Path(dst)
    sizes = {"num_hidden_layers": num_layers, "num_local_experts": num_experts, "num_experts_per_tok": top_k,
             "hidden_size": hidden_size, "intermediate_size": intermediate_size, "vocab_size": vocab_size,
             "num_attention_heads": num_attention_heads, "num_key_value_heads": num_key_value_heads,
             "head_dim": head_dim}  # (checked before any arithmetic on them: a str or None raised from inside it)
    bad = [f"{k}={n!r}" for k, n in sizes.items() if isinstance(n, bool) or not isinstance(n, int) or n <= 0]
    if bad:
        raise CheckpointError(f"write_synthetic_gpt_oss's sizes: {', '.join(bad)} (need positive integers)")
    if num_attention_heads % num_key_value_heads:
        raise ValueError(f"{num_attention_heads=} must be a multiple of {num_key_value_heads=} (grouped-query "
                         f"attention shares each k / v head among a whole number of q heads)")
    pair = tuple(scale_range) if isinstance(scale_range, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 254 for b in pair) \
            or pair[0] > pair[1]:  # (a float, None or a str raised from inside torch.randint or the unpacking)
        raise ValueError(f"scale_range={scale_range!r} must be two finite E8M0 bytes (ints) lo <= hi in 0..254")
    lo, hi = pair
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    if hidden_size % BLOCK or intermediate_size % BLOCK:
        raise ValueError(f"{hidden_size=} and {intermediate_size=} must be multiples of {BLOCK}")
    if vocab_size < 2 or not 1 <= top_k <= num_experts:
        raise ValueError(f"need vocab_size >= 2 and 1 <= top_k <= num_experts, got {vocab_size=} {top_k=} "
                         f"{num_experts=}")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:  # (before the model is drawn)
        raise ValueError(f"shards={shards!r} must be a positive int")
    if (dst / "config.json").exists():
        raise FileExistsError(f"{str(dst)!r} already holds a config.json")
    config = json.loads(json.dumps(REAL_20B_CONFIG))
    config.update(num_hidden_layers=num_layers, num_local_experts=num_experts, num_experts_per_tok=top_k,
                  experts_per_token=top_k, hidden_size=hidden_size, intermediate_size=intermediate_size,
                  vocab_size=vocab_size, num_attention_heads=num_attention_heads,
                  num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                  layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(num_layers)])
    if vocab_size < REAL_20B_CONFIG["vocab_size"]:
        config.update(pad_token_id=vocab_size - 1, eos_token_id=vocab_size - 2)
    dims = GptOssDims.from_config(config, where="write_synthetic_gpt_oss's sizes")
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 2 if seed is None else seed)

    def bf16(shape, std=0.02, mean=0.0):
        return (torch.randn(shape, generator=g) * std + mean).to(torch.bfloat16)

    H, q, kv = hidden_size, num_attention_heads * head_dim, num_key_value_heads * head_dim
    layer_shapes = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
                    "self_attn.q_proj.weight": (q, H), "self_attn.q_proj.bias": (q,),
                    "self_attn.k_proj.weight": (kv, H), "self_attn.k_proj.bias": (kv,),
                    "self_attn.v_proj.weight": (kv, H), "self_attn.v_proj.bias": (kv,),
                    "self_attn.o_proj.weight": (H, q), "self_attn.o_proj.bias": (H,),
                    "self_attn.sinks": (num_attention_heads,)}
    tensors = {"model.embed_tokens.weight": bf16((vocab_size, H))}
    for i in tqdm(range(num_layers), desc="synthetic GPT-OSS", unit="layer", disable=not progress):
        for key, shape in layer_shapes.items():
            norm, sinks = key.endswith("layernorm.weight"), key.endswith("sinks")
            tensors[f"model.layers.{i}.{key}"] = bf16(shape, std=1.0 if sinks else 0.02, mean=1.0 if norm else 0.0)
        for role, shape in dims.moe_shapes().items():
            if role.endswith("_blocks"):
                t = _random_bytes(shape, g)
            elif role.endswith("_scales"):
                t = torch.randint(lo, hi + 1, shape, dtype=torch.uint8, generator=g)
            else:
                t = bf16(shape)
            tensors[moe_tensor_name(i, role)] = t
    tensors["model.norm.weight"] = bf16((H,), mean=1.0)
    tensors["lm_head.weight"] = bf16((vocab_size, H))

    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= len(tensors):
        raise ValueError(f"shards={shards!r} must be an int from 1 to {len(tensors)} (the number of tensors)")
    dst.mkdir(parents=True, exist_ok=True)
    # every file written into a temporary folder beside dst first, then renamed into it, config.json last: a full
    # disk or an interrupt leaves dst as it was (it left a config.json and some shards: a directory that looked
    # like a checkpoint, and a retry refused)
    tmp = Path(tempfile.mkdtemp(prefix=".mxkit-synthetic-", dir=dst))
    try:
        if shards == 1:
            save_file(tensors, str(tmp / SINGLE_NAME), metadata={"format": "pt"})
        else:
            weight_map = {}
            for k, names in enumerate(_shard_plan([(k, t.nbytes) for k, t in tensors.items()], shards)):
                fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
                save_file({n: tensors[n] for n in names}, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update((n, fname) for n in names)
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
            os.replace(f, dst / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


# --------------------------------------------------------------------------------------------------------
# summary (mxkit inspect DIR)


@dataclass(frozen=True)
class GptOssSummary:
    """What ``mxkit inspect DIR`` prints for a GPT-OSS directory.

    files: the safetensors file names; index: the index file name or None; moe_shapes: ``(role, shape, dtype)`` of
    one layer's MoE tensors (every layer's shapes are checked to be the same; dtype names every one the layers
    use, e.g. ``BF16/F32``); mxfp4_bytes: the experts' blocks + scales;
    bf16_bytes: 2 bytes per expert weight; moe_other_bytes: biases and router; scale_hist: 256 counts of E8M0
    scale bytes over all layers; other_tensors / other_bytes: every tensor that is not a MoE tensor.
    """

    path: Path
    dims: GptOssDims
    files: tuple[str, ...]
    index: Optional[str]
    moe_shapes: tuple[tuple[str, tuple[int, ...], str], ...]
    mxfp4_bytes: int
    bf16_bytes: int
    moe_other_bytes: int
    scale_hist: tuple[int, ...]
    other_tensors: int
    other_bytes: int


def summarize_gpt_oss(path: Union[str, Path], *, progress: bool = False) -> GptOssSummary:
    """Summarise an MXFP4 GPT-OSS directory: loads (and so checks) every layer as :func:`load_gpt_oss` does, reads
    every scale byte for the histogram and every other tensor's header. Raises what :func:`load_gpt_oss` raises,
    and CheckpointError for tensors of layers past config.json's ``num_hidden_layers``."""
    ckpt = load_gpt_oss(path, progress=progress)
    hist = torch.zeros(256, dtype=torch.int64)
    mx_bytes = bf16_bytes = moe_other = 0
    for moe in ckpt.layers:
        for t in (moe.gate_up, moe.down):
            hist += torch.bincount(t.scale.reshape(-1), minlength=256)
            mx_bytes += t.nbytes
            bf16_bytes += 2 * t.shape.numel()
        moe_other += sum(t.nbytes for t in (moe.gate_up_bias, moe.down_bias, moe.router_weight, moe.router_bias))
    with contextlib.ExitStack() as stack:
        reader = _Reader(ckpt.path, stack)
        moe_names = {moe_tensor_name(i, r) for i in range(ckpt.dims.num_layers) for r in MOE_ROLES}
        others = [n for n in reader.weight_map if n not in moe_names]
        past = sorted({int(m.group(1)) for n in others if (m := re.match(r"model\.layers\.(\d+)\.", n))
                       and int(m.group(1)) >= ckpt.dims.num_layers})
        if past:  # (counted as non-MoE tensors, the experts' bytes from config.json's layers alone, before)
            raise CheckpointError(f"{str(ckpt.path)!r}: config.json says {ckpt.dims.num_layers} layers, but the "
                                  f"directory holds tensors of layer(s) {past[:8]}")
        other_bytes = sum(reader.nbytes(n) for n in others)
        # (one layer's shapes: every layer's are the same, load_gpt_oss checked; the dtypes of them all: biases and
        # the router may be BF16 / F16 / F32 layer by layer, which showed as layer 0's)
        shapes = tuple((r, reader.meta(moe_tensor_name(0, r))[0], "/".join(sorted(
            {str(reader.meta(moe_tensor_name(i, r))[1]) for i in range(ckpt.dims.num_layers)}))) for r in MOE_ROLES)
        files, index = tuple(f.name for f in reader.files), reader.index.name if reader.index else None
    return GptOssSummary(ckpt.path, ckpt.dims, files, index, shapes, mx_bytes, bf16_bytes, moe_other,
                         tuple(int(v) for v in hist), len(others), other_bytes)


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.3f} MB"


def print_gpt_oss_summary(s: GptOssSummary, *, plain: bool = False, file=None) -> None:
    """Print a :class:`GptOssSummary`: config, one layer's MoE tensor shapes (a table), MXFP4 vs bf16 bytes, the
    E8M0 scale range and the non-MoE tensors."""
    import sys

    from ._table import print_table

    out = file if file is not None else sys.stdout
    d = s.dims
    sharding = f"{len(s.files)} shards, {s.index}" if s.index else f"{len(s.files)} file"
    print(f"GPT-OSS MXFP4 checkpoint {s.path} ({sharding})", file=out)
    print(f"config: {d.num_layers} layers, {d.num_experts} experts, top-{d.top_k}, hidden {d.hidden_size}, "
          f"intermediate {d.intermediate_size}, vocab {d.vocab_size}", file=out)
    rows = []
    for role, shape, dtype in s.moe_shapes:
        logical = "-"
        if role.endswith("_blocks"):
            logical = f"mxfp4_e2m1 {list(shape[:-2]) + [shape[-2] * BLOCK]}"
        elif role.endswith("_scales"):
            logical = "E8M0 scales"
        rows.append([moe_tensor_name(0, role).replace("layers.0.", "layers.{i}."), dtype, str(list(shape)), logical])
    print_table(["tensor (each layer)", "dtype", "shape", "mx"], rows, plain=plain, file=out)
    n = s.bf16_bytes // 2
    print(f"MXFP4 experts: {_gb(s.mxfp4_bytes)} (blocks + scales, {8 * s.mxfp4_bytes / n:.2f} bits/weight) vs "
          f"{_gb(s.bf16_bytes)} as bf16 ({s.mxfp4_bytes / s.bf16_bytes:.3f}x); "
          f"biases + router {_gb(s.moe_other_bytes)}",
          file=out)
    hist = torch.tensor(s.scale_hist)
    finite = hist[:255]
    present = finite.nonzero().flatten()
    if len(present):
        lo, hi = int(present[0]), int(present[-1])
        med = int(torch.searchsorted(finite.cumsum(0), (int(finite.sum()) + 1) // 2))
        print(f"E8M0 scales: {int(hist.sum())}, bytes {lo}..{hi} (2^{lo - 127} .. 2^{hi - 127}), median 2^{med - 127}, "
              f"NaN (0xFF) {int(hist[255])}", file=out)
    else:
        print(f"E8M0 scales: all {int(hist[255])} NaN (0xFF)", file=out)
    print(f"non-MoE tensors: {s.other_tensors}, {_gb(s.other_bytes)}", file=out)


# --------------------------------------------------------------------------------------------------------
# transformers' GptOssForCausalLM with the experts dequantized by mxkit


def hf_state_dict(moe: GptOssMoE, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """One layer's MoE parameters under transformers' ``GptOssForCausalLM`` names, experts dequantized by
    :func:`mxkit.dequantize` (exact: E2M1 × 2^k fits bf16 for the scales GPT-OSS uses) and transposed to transformers'
    [E, K, N]: ``mlp.experts.gate_up_proj`` [E, H, 2I], ``mlp.experts.down_proj`` [E, I, H] (contiguous),
    ``*_bias``, ``mlp.router.weight`` [E, H] / ``.bias`` [E], all in ``dtype``. Raises TypeError for a
    ``dtype`` :func:`mxkit.dequantize` does not write (float32 / bfloat16 / float16 / float64)."""
    p = f"model.layers.{moe.layer}.mlp."
    return {p + "experts.gate_up_proj": dequantize(moe.gate_up, dtype).transpose(1, 2).contiguous(),
            p + "experts.down_proj": dequantize(moe.down, dtype).transpose(1, 2).contiguous(),
            p + "experts.gate_up_proj_bias": moe.gate_up_bias.to(dtype),
            p + "experts.down_proj_bias": moe.down_bias.to(dtype),
            p + "router.weight": moe.router_weight.to(dtype), p + "router.bias": moe.router_bias.to(dtype)}


def hf_config(path: Union[str, Path], progress: bool = True):
    """``(checkpoint, config)`` of an MXFP4 GPT-OSS directory: :func:`load_gpt_oss`'s checkpoint (memory-mapped) and
    transformers' ``GptOssConfig`` of its config.json less ``quantization_config`` (so transformers' MXFP4
    integration, which wants GPU kernels, is not involved). ImportError without transformers' GPT-OSS classes; the
    errors of :func:`load_gpt_oss`."""
    try:
        from transformers import GptOssConfig
    except ImportError as e:
        raise ImportError(f"loading a GPT-OSS model needs transformers with GptOss classes: {e}") from e
    ckpt = load_gpt_oss(path, progress=progress)
    return ckpt, GptOssConfig.from_dict({k: v for k, v in ckpt.config.items() if k != "quantization_config"})


def use_generation_config(model, path: Union[str, Path]) -> None:
    """Give ``model`` the directory's ``generation_config.json`` where it has one (its stop ids: the real GPT-OSS
    directories list several, which ``from_config`` does not read), as ``from_pretrained`` does."""
    if (Path(path) / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(str(path))


def tie_head(model, head_stored: bool, path) -> bool:
    """For a config with ``tie_word_embeddings``: tie ``model``'s lm_head to its input embedding where the directory
    holds no lm_head of its own (``head_stored`` False) or one equal to the embedding; an lm_head stored with other
    values is kept, untied, with a UserWarning (transformers 5's rule: tying it replaced the stored head, silently).
    Returns whether the head is tied."""
    if head_stored:
        head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        if head.shape != emb.shape or not torch.equal(head, emb):
            warnings.warn(f"{path}: config.json ties the word embeddings, but the directory holds an lm_head.weight "
                          f"of other values: it is kept, untied (as transformers does)", stacklevel=3)
            return False
    model.tie_weights()
    return True


def load_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a torch.device that can hold a loaded checkpoint, checked before a directory is read: ValueError
    for one this torch build or machine lacks, and for ``meta`` (it holds no data: the loaded tensors vanished and
    the directory was blamed for missing them)."""
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise ValueError(f"device {str(device)!r} cannot hold tensors here: {' '.join(str(e).split())}") from e
    if device.type == "meta":
        raise ValueError("device='meta' holds no data to load a checkpoint into: pass a real device (a model of the "
                         "config's shapes alone: build it under `with torch.device('meta')`)")
    return device


def load_hf_model(path: Union[str, Path], *, dtype: torch.dtype = torch.bfloat16,
                  device: Union[str, torch.device] = "cpu", progress: bool = True):
    """transformers' ``GptOssForCausalLM`` of an MXFP4 GPT-OSS directory, experts dequantized by mxkit.

    The model is built on ``device`` from config.json less its ``quantization_config`` (so transformers' MXFP4
    integration, which wants GPU kernels, is not involved), without random initialisation, in ``dtype``; then every
    tensor is loaded: the experts through :func:`load_gpt_oss` and :func:`hf_state_dict`, dequantized on ``device``
    (one GPT-OSS-20B layer: about 80 s on 2 CPU cores, milliseconds on a GPU), all others as stored (cast to
    ``dtype``). Returns the model in eval mode on ``device``. Raises ValueError for a ``device`` that cannot hold it
    (:func:`load_device`), ImportError without transformers' GPT-OSS classes, CheckpointError for a bad directory
    or when the directory and the model's parameters do not match (naming them).
    """
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights  # (transformers 5)
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # (transformers 4)

    device = load_device(device)
    ckpt, config = hf_config(path, progress)
    with no_init_weights(), device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    loaded: set = set()
    unexpected: list = []

    def load(part: dict) -> None:  # (one MoE layer's dequantized experts at a time: no second copy of them all)
        try:
            result = model.load_state_dict(part, strict=False)
        except RuntimeError as e:  # shape mismatches, listed by torch with the parameter names
            raise CheckpointError(f"{ckpt.path}: {' '.join(str(e).split())}") from e
        unexpected.extend(result.unexpected_keys)
        loaded.update(k for k in part if k not in result.unexpected_keys)

    for moe in ckpt.layers:
        load(hf_state_dict(dataclasses.replace(moe, gate_up=moe.gate_up.to(device), down=moe.down.to(device)), dtype))
    with contextlib.ExitStack() as stack:
        reader = _Reader(ckpt.path, stack)
        moe_names = {moe_tensor_name(m.layer, r) for m in ckpt.layers for r in MOE_ROLES}
        load({name: reader.float_tensor(name) for name in reader.weight_map if name not in moe_names})
    if getattr(model.config, "tie_word_embeddings", False) and tie_head(model, "lm_head.weight" in loaded, ckpt.path):
        loaded.add("lm_head.weight")  # (a tied head is the loaded embedding: not missing from the directory)
    missing = [k for k in model.state_dict() if k not in loaded]
    if missing or unexpected:
        raise CheckpointError(f"{ckpt.path}: the directory does not match GptOssForCausalLM: parameters missing "
                              f"from it {missing[:5]}, tensors the model lacks {unexpected[:5]}")
    use_generation_config(model, ckpt.path)
    return model.eval().to(device)
