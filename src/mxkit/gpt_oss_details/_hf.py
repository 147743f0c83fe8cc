"""transformers' ``GptOssForCausalLM`` of a GPT-OSS directory, the experts dequantized by mxkit
(:func:`load_hf_model`)."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from pathlib import Path
from typing import Optional, Union

import torch

from ..ops import dequantize
from ._layout import MOE_ROLES, CheckpointError, moe_tensor_name
from ._read import GptOssMoE, _Reader, load_gpt_oss


def hf_state_dict(moe: GptOssMoE, dtype: Optional[torch.dtype] = torch.bfloat16) -> dict[str, torch.Tensor]:
    """One layer's MoE parameters under transformers' ``GptOssForCausalLM`` names, experts dequantized by
    :func:`mxkit.dequantize` (exact: E2M1 × 2^k fits bf16 for the scales GPT-OSS uses) and transposed to transformers'
    [E, K, N]: ``mlp.experts.gate_up_proj`` [E, H, 2I], ``mlp.experts.down_proj`` [E, I, H] (contiguous),
    ``*_bias``, ``mlp.router.weight`` [E, H] / ``.bias`` [E], all in ``dtype``. Raises TypeError for a ``moe``
    that is not a GptOssMoE (one layer of :func:`load_gpt_oss`'s checkpoint: ``checkpoint.layer(i)``) or a
    ``dtype`` :func:`mxkit.dequantize` does not write (float32 / bfloat16 / float16 / float64; None: float32, as
    there, for the biases and the router too)."""
    if not isinstance(moe, GptOssMoE):
        raise TypeError(f"hf_state_dict takes one layer's GptOssMoE (checkpoint.layer(i)), got {type(moe).__name__}")
    if dtype is None:  # (dequantize's float32: the biases and router were left in the checkpoint's bf16 by .to(None))
        dtype = torch.float32
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
    (:func:`load_device`) or a ``dtype`` that is not floating-point (transformers' check), ImportError without
    transformers' GPT-OSS classes, CheckpointError for a bad directory or when the directory and the model's parameters
    do not match (naming them)."""
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
