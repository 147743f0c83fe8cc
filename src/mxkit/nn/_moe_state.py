"""The state_dict hooks of :class:`mxkit.nn.MXMoE` (:mod:`mxkit.nn.moe`): the experts given in the checkpoint
layout whatever layout they are held in, their range and activation recorded and checked on load, checkpoint-layout
bytes packed on load into a module packed in place, and the warning for a CUDA graph whose kernel variants a load
or an in-place write made stale."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from ..tensor import MXTensor

if TYPE_CHECKING:
    from .moe import MXMoE

__all__: list[str] = []

_EXPERTS = ("gate_up", "down")  # the expert buffers' names: {name}_qdata / {name}_scale (and biases, row scales)


@torch.compiler.disable
def _record_experts(module: MXMoE, state_dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: which experts the bytes are (``expert_range`` of ``num_experts``) and the activation
    their gate_up rows are laid out for (interleaved for GPT-OSS's, halves for plain SwiGLU), for
    :func:`_check_experts` (like :func:`~mxkit.nn.linear.record_format`'s element format)."""
    local_metadata["mx_experts"] = [*module.expert_range, module.num_experts]
    local_metadata["mx_activation"] = module.activation


def _forget_expert_copies(module: MXMoE, incompatible_keys) -> None:
    """load_state_dict post-hook: where the state_dict held expert bytes, :meth:`MXMoE._forget_expert_copies` (made
    again at new addresses: warned, where a CUDA graph captured them, by :func:`_warn_new_copies`)."""
    if not module.__dict__.pop("_loading_experts", True):
        return
    if module._folded is not None or module._packed_wgmma is not None or (
            module._packed is not None and module.expert_layout != "mma"):
        _warn_new_copies(module)
    module._forget_expert_copies()


def _check_experts(module: MXMoE, state_dict, prefix: str, local_metadata: dict, *args) -> None:
    """load_state_dict pre-hook: experts saved from another range (or count) of experts, or for another activation's
    row layout, raise ValueError before anything is copied (the shapes match, so they would load as the wrong
    experts or decode gate and up swapped). A state_dict without the metadata is not checked."""
    name = prefix[:-1] or type(module).__name__
    experts, act = local_metadata.get("mx_experts"), local_metadata.get("mx_activation")
    mine = [*module.expert_range, module.num_experts]
    if experts is not None and list(experts) != mine:
        raise ValueError(f"{name}: the state_dict holds experts [{experts[0]}, {experts[1]}) of {experts[2]}; this "
                         f"MXMoE holds [{mine[0]}, {mine[1]}) of {mine[2]}")
    if act is not None and act != module.activation:
        raise ValueError(f"{name}: the state_dict's gate_up rows are laid out for activation={act!r}; this MXMoE's "
                         f"is {module.activation!r}")


def _checkpoint_layout_state(module: MXMoE, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook: experts packed in place (:meth:`MXMoE.pack_`) are given in the checkpoint layout."""
    if module.expert_layout != "checkpoint":
        state_dict.update({prefix + name: t for name, t in module._checkpoint_buffers().items()})


def _pack_loaded_state(module: MXMoE, state_dict: dict, prefix: str, local_metadata, strict, missing_keys,
                       unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: checkpoint-layout experts loaded into a module packed in place are packed (on the
    module's device) before the copy. A module folded in place (W4A8) goes back to the checkpoint layout, and its
    next CUDA forward folds the loaded experts. Expert buffers that are not uint8 (MX bytes: ``copy_`` would cast
    them) are reported in ``error_msgs`` (load_state_dict raises) and not loaded: that expert's pair keeps its
    bytes (the module's own given in their place, so the keys are not also reported missing)."""
    loading = any(f"{prefix}{n}_{p}" in state_dict for n in _EXPERTS for p in ("qdata", "scale"))
    module.__dict__["_loading_experts"] = loading  # (for the post-hook: a load of other keys keeps every copy)
    if not loading:  # (the router, the biases, adapters: the experts and their layout stay as they are)
        return
    bad = set()
    for name in _EXPERTS:
        keys = (f"{prefix}{name}_qdata", f"{prefix}{name}_scale")
        for key in keys:
            t = state_dict.get(key)
            if isinstance(t, torch.Tensor) and t.dtype != torch.uint8:
                error_msgs.append(f"{key}: expected uint8 MX bytes, got {t.dtype}")
                bad.add(name)
        if name in bad:
            for key in keys:
                state_dict[key] = getattr(module, key[len(prefix):])
    if module.expert_layout == "fold":
        _warn_new_copies(module)  # (folded again, into new buffers, by the next CUDA forward)
        module._to_checkpoint_layout()
    if module.expert_layout != "mma":
        return
    flags = list(module._mma_flags)
    for i, name in enumerate(_EXPERTS):
        kq, ks = f"{prefix}{name}_qdata", f"{prefix}{name}_scale"
        if name in bad or kq not in state_dict or ks not in state_dict:
            continue  # (reported above, or as missing by load_state_dict)
        q, s = state_dict[kq], state_dict[ks]
        shape = module._expert_shapes(module.num_local_experts)[i]
        want = MXTensor.expected_shapes(shape, 2, module.weight_format, module.block_size)
        if (tuple(q.shape), tuple(s.shape)) != tuple(map(tuple, want)) or q.dtype != torch.uint8 \
                or s.dtype != torch.uint8:
            error_msgs.append(f"{kq} / {ks}: expected uint8 tensors of the checkpoint layout {tuple(want[0])} / "
                              f"{tuple(want[1])}, got {q.dtype} {tuple(q.shape)} / {s.dtype} {tuple(s.shape)}")
            del state_dict[kq], state_dict[ks]
            continue
        dev = getattr(module, kq[len(prefix):]).device
        p = module._packed_pair(name, q.to(dev), s.to(dev))
        state_dict[kq], state_dict[ks] = p.q, p.s
        flags[i] = (p.special, p.one_mul, p.bf16_exact)
    _warn_recapture(module, tuple(flags))
    module._mma_flags, module._packed = tuple(flags), None


def _warn_recapture(module: MXMoE, flags: tuple) -> None:
    """Warn where experts packed in place, captured in a CUDA graph with kernel flags (special, one_mul,
    bf16_exact) other than ``flags``, were written with bytes that need these (a load, a weight sync): their
    addresses are kept, so the graph replays the new bytes with the old kernel variants. (One text: the default
    warnings filter shows it once.)"""
    if module.__dict__.get("_captured") and flags != module._mma_flags:
        warnings.warn("MXMoE: experts written in place need other decode-kernel variants than a CUDA graph captured "
                      "(a scale byte crossed 0, 128 or the bf16 envelope): the graph decodes them with the old ones "
                      "and must be captured again", RuntimeWarning, stacklevel=3)


def _mark_captured(module: MXMoE) -> None:
    """Record, during a CUDA-graph capture (or ``torch.compile(mode="reduce-overhead")``'s), that a graph holds the
    addresses and kernel variants of the module's experts: what the warnings below ask (outside a capture, nothing:
    an eager user is not warned; an in-place write is seen by the next eager forward, as replays run no Python)."""
    try:
        capturing = torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # (a torch built without CUDA: no graphs)
        return
    if capturing:
        module.__dict__["_captured"] = True


def _warn_new_copies(module: MXMoE) -> None:
    """Warn where a CUDA graph captured expert tensors that a load or an in-place write now makes again at new
    addresses (``keep_source``'s packed or folded copies, the MXFP8 experts' prefill copy, the W4A8 fold layout's
    buffers): its replays would read the freed ones."""
    if module.__dict__.get("_captured"):
        warnings.warn("MXMoE: experts written since a CUDA graph captured them are packed or folded again into new "
                      "tensors (keep_source, MXFP8 prefill, or W4A8 fold layout): the graph must be captured again",
                      RuntimeWarning, stacklevel=3)
