"""GPT-OSS models with :class:`mxkit.nn.MXMoE` experts: :func:`swap_gpt_oss_moe` converts a transformers
``GptOssForCausalLM`` in place, :func:`load_gpt_oss_model` builds one from an MXFP4 checkpoint directory without
dequantizing its experts. Importing this module does not need transformers; calling either function does."""

from __future__ import annotations

import contextlib
from typing import Union

import torch
from torch import nn

from ..formats import FormatLike
from ..moe_reference import GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT
from .linear import _set_submodule
from .moe import MXMoE

__all__ = ["swap_gpt_oss_moe", "load_gpt_oss_model"]


def swap_gpt_oss_moe(model: nn.Module, weight_format: FormatLike = "mxfp4", **kwargs) -> nn.Module:
    """Replace every transformers ``GptOssMLP`` in ``model`` (e.g. a ``GptOssForCausalLM``) by an
    :class:`MXMoE` (:meth:`MXMoE.from_hf_gpt_oss` with ``return_router_scores=True``, the ``(hidden, scores)``
    pair the decoder layer unpacks), in place. Returns ``model``.

    The swapped model still records ``router_logits`` (``output_router_logits=True``, and so the router's
    auxiliary loss): each MXMoE's ``logits_recorder`` is a :class:`GptOssRouterLogits`, the module class
    transformers' output recorder hooks, called with the layer's (T, E) logits. Raises ImportError without
    transformers' GPT-OSS, TypeError for a ``model`` that is not an nn.Module, ValueError if the model has no
    GptOssMLP.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_gpt_oss_moe takes an nn.Module, got {type(model).__name__}")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    names = [n for n, m in model.named_modules() if isinstance(m, GptOssMLP)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no GptOssMLP to swap")
    for name in names:
        mlp = model.get_submodule(name)
        new = MXMoE.from_hf_gpt_oss(mlp, weight_format, return_router_scores=True, **kwargs)
        new.logits_recorder = __getattr__("GptOssRouterLogits")()
        # a model that recorded outputs before has transformers' recorder hooks on its routers already (installed
        # once a model): the new recorder takes the old router's forward hooks, or its logits would go unrecorded
        for hook in getattr(getattr(mlp, "router", None), "_forward_hooks", {}).values():
            new.logits_recorder.register_forward_hook(hook)
        _set_submodule(model, name, new)
    return model


def load_gpt_oss_model(path, *, dtype: torch.dtype = torch.bfloat16, device: Union[str, torch.device] = "cpu",
                       progress: bool = True, **kwargs) -> nn.Module:
    """transformers' ``GptOssForCausalLM`` of an MXFP4 GPT-OSS directory with every MoE block an :class:`MXMoE`
    holding the checkpoint's expert bytes as they are: no expert is ever dequantized or held dense, so a model
    whose experts only fit as MXFP4 (GPT-OSS-120B: 60.9 GB of experts, 234 GB in bf16) loads onto one GPU.

    The model is built on the meta device from config.json less its ``quantization_config`` (so transformers'
    MXFP4 integration, which wants its own GPU kernels, is not involved); each ``GptOssMLP`` is replaced by
    :meth:`MXMoE.from_mx` on ``device`` (``return_router_scores=True``, GPT-OSS routing and activation) from
    :func:`mxkit.gpt_oss.load_gpt_oss`'s memory-mapped MXTensors (router logits recorded as by
    :func:`swap_gpt_oss_moe`); every other tensor is read from the directory
    in ``dtype`` straight onto ``device``; the rotary embedding's buffers (not in a checkpoint) are computed there.
    kwargs: :class:`MXMoE`'s (``backend``, ``act_format``, ``keep_source``). Returns the model in eval mode.
    Its logits are those of :func:`mxkit.gpt_oss.load_hf_model` (the experts dequantized to ``dtype``) up to the
    MoE's rounding: MXMoE computes in float32 (CPU: float64) with one rounding per GEMM.
    Raises ValueError for a ``device`` this machine or torch build lacks, or ``meta``, or a ``dtype`` that is not
    floating-point (transformers' check), ImportError without transformers' GPT-OSS classes, CheckpointError for a bad
    directory or one that does not match the model (naming the tensors), or a config whose ``swiglu_limit`` /
    ``swiglu_alpha`` is not GPT-OSS's 7.0 / 1.702 (the activation MXMoE implements)."""
    from ..gpt_oss import MOE_ROLES, CheckpointError, hf_config, moe_tensor_name
    from ..gpt_oss_details._hf import load_device, tie_head, use_generation_config
    from ..gpt_oss_details._read import _Reader

    device = load_device(device)  # (before reading the directory)
    ckpt, config = hf_config(path, progress)  # (ImportError without transformers' GPT-OSS classes)
    from transformers import AutoModelForCausalLM
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    mlps = {n: m for n, m in model.named_modules() if isinstance(m, GptOssMLP)}
    for moe_w in ckpt.layers:
        name = f"model.layers.{moe_w.layer}.mlp"
        if name not in mlps:
            raise CheckpointError(f"{ckpt.path}: the model has no GptOssMLP {name!r}")
        experts = mlps[name].experts  # (the activation's constants as transformers read them from the config)
        alpha, limit = getattr(experts, "alpha", GPT_OSS_SWIGLU_ALPHA), getattr(experts, "limit", GPT_OSS_SWIGLU_LIMIT)
        if (alpha, limit) != (GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT):
            raise CheckpointError(f"{ckpt.path}/config.json: the experts' SwiGLU has alpha={alpha}, limit={limit}; "
                                  f"MXMoE implements GPT-OSS's alpha={GPT_OSS_SWIGLU_ALPHA}, "
                                  f"limit={GPT_OSS_SWIGLU_LIMIT}")
        router = nn.Linear(ckpt.dims.hidden_size, ckpt.dims.num_experts, device=device, dtype=dtype)
        with torch.no_grad():
            router.weight.copy_(moe_w.router_weight)
            router.bias.copy_(moe_w.router_bias)
        new = MXMoE.from_mx(router, moe_w.gate_up, moe_w.gate_up_bias.to(dtype), moe_w.down,
                            moe_w.down_bias.to(dtype), mlps[name].router.top_k, device=device, routing="gpt_oss",
                            activation="swiglu_gpt_oss", return_router_scores=True, **kwargs)
        new.logits_recorder = __getattr__("GptOssRouterLogits")()
        _set_submodule(model, name, new)
    state = {}
    with contextlib.ExitStack() as stack:
        reader = _Reader(ckpt.path, stack)
        moe_names = {moe_tensor_name(m.layer, r) for m in ckpt.layers for r in MOE_ROLES}
        for name in reader.weight_map:
            if name not in moe_names:
                t = reader.float_tensor(name)  # (assign=True keeps what it is given: cast here)
                state[name] = t.to(device=device, dtype=dtype)
        try:
            result = model.load_state_dict(state, strict=False, assign=True)
        except RuntimeError as e:  # shape mismatches, listed by torch with the parameter names
            raise CheckpointError(f"{ckpt.path}: {' '.join(str(e).split())}") from e
    # a tied lm_head: tied again where the directory does not hold its own (assign=True replaced the tied
    # parameter); one stored with other values is kept, untied, as transformers 5 keeps it
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False) and tie_head(model, "lm_head.weight" in state, ckpt.path):
        tied = {"lm_head.weight"}
    # the MXMoE modules' own tensors are theirs already; anything else the directory lacks stays on meta
    missing = [k for k in result.missing_keys if k not in tied and (".mlp." not in k or not isinstance(
        model.get_submodule(k.rsplit(".mlp.", 1)[0] + ".mlp"), MXMoE))]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"{ckpt.path}: the directory does not match GptOssForCausalLM: parameters missing "
                              f"from it {missing[:5]}, tensors the model lacks {result.unexpected_keys[:5]}")
    for name, m in list(model.named_modules()):  # non-persistent buffers (rotary inv_freq): computed on device
        if type(m).__name__.endswith("RotaryEmbedding") and any(b.is_meta for b in m.buffers(recurse=False)):
            with torch.device(device):
                _set_submodule(model, name, type(m)(config=model.config))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"{ckpt.path}: no tensor in the directory for {left[:5]}")
    use_generation_config(model, ckpt.path)
    return model.eval()


def __getattr__(name: str):
    """``GptOssRouterLogits``, made on first use (it subclasses transformers' ``GptOssTopKRouter``, so importing
    this module does not need transformers; a pickled swapped model finds it here)."""
    if name != "GptOssRouterLogits":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in globals():  # (made already: one class, which pickle finds by name)
        return globals()[name]
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    class GptOssRouterLogits(GptOssTopKRouter):
        """The router logits of an :class:`MXMoE` as transformers records them: an instance of
        ``GptOssTopKRouter`` (whose outputs ``output_router_logits`` collects by class), without parameters,
        returning the (T, E) logits it is called with."""

        def __init__(self):
            nn.Module.__init__(self)

        def forward(self, logits: torch.Tensor) -> torch.Tensor:
            return logits

    GptOssRouterLogits.__module__, GptOssRouterLogits.__qualname__ = __name__, "GptOssRouterLogits"
    globals()["GptOssRouterLogits"] = GptOssRouterLogits
    return GptOssRouterLogits
