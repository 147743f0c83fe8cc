"""A synthetic GPT-OSS directory in the exact HF layout and config (:func:`write_synthetic_gpt_oss`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

import torch

from ._layout import (BLOCK, INDEX_NAME, SINGLE_NAME, CheckpointError, GptOssDims, REAL_20B_CONFIG, as_path,
                      moe_tensor_name)


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

    Defaults: GPT-OSS-20B's dims (:data:`REAL_20B_CONFIG`) with 2 layers: about 3.1 GB on disk (the two bf16
    embeddings of 201088 x 2880 are 2.3 GB of it; a small ``vocab_size`` / ``num_experts`` for tests).
    config.json is the real one with the
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
    layers written. ``dst`` is created (it must not hold a checkpoint's files already); the files are written into a
    temporary folder in it and renamed into place, config.json last, so a failure leaves no partial checkpoint.
    Returns ``dst``. Raises ValueError for sizes that are not multiples of 32, a bad ``scale_range`` or ``shards``,
    or heads that are not a multiple of the k / v heads; TypeError for a ``seed`` that is not an int or None
    (ValueError outside [0, 2^64)) or a ``dst`` that is not a str or os.PathLike;
    :class:`CheckpointError` (a ValueError) for a ``num_layers``, ``num_experts``, ``top_k``, ``hidden_size``,
    ``intermediate_size``, ``vocab_size`` or attention size that is not a positive int (named by its config.json
    key: ``num_hidden_layers``, ``num_local_experts``, ``num_experts_per_tok``, ...); FileExistsError when ``dst``
    is a file or already holds a config.json, an index or a *.safetensors file (checked before the model is drawn).
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    dst = as_path(dst, "dst")
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
    if seed is not None and not 0 <= seed < 2**64:  # (torch.Generator's range, checked before any file is made)
        raise ValueError(f"seed must be in [0, 2^64), got {seed}")
    if hidden_size % BLOCK or intermediate_size % BLOCK:
        raise ValueError(f"{hidden_size=} and {intermediate_size=} must be multiples of {BLOCK}")
    if vocab_size < 2 or not 1 <= top_k <= num_experts:
        raise ValueError(f"need vocab_size >= 2 and 1 <= top_k <= num_experts, got {vocab_size=} {top_k=} "
                         f"{num_experts=}")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:  # (before the model is drawn)
        raise ValueError(f"shards={shards!r} must be a positive int")
    if dst.exists() and not dst.is_dir():  # (before the model is drawn: mkdir refused it after ~3 GB of it)
        raise FileExistsError(f"{str(dst)!r} exists and is not a directory")
    held = sorted(f.name for f in dst.iterdir() if f.name in ("config.json", INDEX_NAME)
                  or f.suffix == ".safetensors") if dst.is_dir() else []
    if held:  # (a stale model.safetensors beside new shards was read in their place)
        raise FileExistsError(f"{str(dst)!r} already holds {', '.join(held)}: write into an empty or new directory")
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
