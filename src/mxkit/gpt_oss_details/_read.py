"""Reading a GPT-OSS directory (:func:`load_gpt_oss`): its safetensors files memory-mapped, the MoE tensors
checked and viewed as MXTensors."""

from __future__ import annotations

import contextlib
import math
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import torch

from ..tensor import MXTensor, as_int
from ._layout import (INDEX_NAME, MOE_ROLES, SINGLE_NAME, CheckpointError, GptOssDims, _ANY_FLOAT_DTYPES, _DTYPE_BYTES,
                      _FLOAT_DTYPES, _gpt_oss_config, _read_json, _cut_off, as_path, blocks_from_mxtensor,
                      moe_tensor_name, mxtensor_from_blocks)


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
                    what = "is a directory, not a file" if f.is_dir() else "is missing"
                    raise CheckpointError(f"shard {str(f)!r} listed by {str(index)!r} (e.g. for {example}) {what}")
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

            from .._files import check_readable, openable_name

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
        """The loaded layer with index ``i`` (an int; NumPy's taken); KeyError if it was not loaded, TypeError for
        an ``i`` that is not an int."""
        i = as_int(i)
        if isinstance(i, bool) or not isinstance(i, int):  # ("0" was "not loaded" beside a loaded layer 0)
            raise TypeError(f"layer index must be an int, got {i!r}")
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
    ValueError for a layer index out of range or named twice, TypeError for ``layers`` that is not an iterable of ints
    or a ``path`` that is not a str or os.PathLike.
    """
    from tqdm.auto import tqdm

    # (absolute: with a relative path save_gpt_oss would read another cwd's directory)
    root = Path(os.path.abspath(as_path(path, "path")))
    if not root.is_dir():
        raise CheckpointError(f"{str(root)!r} is not a directory")
    config, dims = _gpt_oss_config(root)
    idx = _layer_list(layers, dims)
    with contextlib.ExitStack() as stack:  # the tensors outlive the handles: they hold their own mappings
        reader = _Reader(root, stack)
        loaded = tuple(_load_layer(reader, dims, i)
                       for i in tqdm(idx, desc="load GPT-OSS MoE", unit="layer", disable=not progress))
    return GptOssCheckpoint(root, config, dims, loaded)
