"""Saving a GPT-OSS checkpoint (:func:`save_gpt_oss`): new shards written beside the directory, synced and
swapped into place, so that nothing is half-written."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Union

import torch

from ._layout import CheckpointError, _TORCH_DTYPE_NAMES, _data_ranges, as_path
from ._read import GptOssCheckpoint, GptOssMoE, _Reader


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
    if t.device.type == "meta":
        raise CheckpointError(f"{name}: the tensor to save is on the meta device (it holds no bytes)")
    if tuple(t.shape) != shape or _TORCH_DTYPE_NAMES.get(t.dtype) != dtype:
        raise CheckpointError(f"{name}: the tensor to save is {t.dtype} {list(t.shape)}, but "
                              f"{str(reader.weight_map[name])!r} holds {dtype} {list(shape)}; a save keeps the "
                              "directory's shapes and dtypes")


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
    Returns ``dst`` as given. Raises TypeError for a ``ckpt`` that is not a GptOssCheckpoint (or whose ``layers``
    are not GptOssMoE); ValueError for ``ckpt.layers`` holding a layer twice; FileExistsError if ``dst`` exists
    and ``overwrite`` is False, is not a directory, or is a non-empty directory holding no checkpoint; ValueError
    for a ``dst`` that holds ``ckpt.path`` (a parent of it: replacing it would delete the source); CheckpointError
    (naming the tensor) when a layer's tensor no longer matches the source's shape or dtype, or an MXTensor is not
    MXFP4 along its last axis; and the errors of reading the source (see :func:`load_gpt_oss`).
    """
    from tqdm.auto import tqdm

    if not isinstance(ckpt, GptOssCheckpoint):
        raise TypeError(f"save_gpt_oss takes a GptOssCheckpoint (load_gpt_oss), got {type(ckpt).__name__}")
    if not isinstance(ckpt.layers, (tuple, list)):
        raise TypeError(f"ckpt.layers must be a tuple of GptOssMoE, got {type(ckpt.layers).__name__}")
    bad = next((m for m in ckpt.layers if not isinstance(m, GptOssMoE)), None)
    if bad is not None:
        raise TypeError(f"ckpt.layers must be a tuple of GptOssMoE, holds a {type(bad).__name__}")
    seen = [m.layer for m in ckpt.layers]
    if len(set(seen)) != len(seen):
        raise ValueError(f"ckpt.layers holds layer {next(i for i in seen if seen.count(i) > 1)} more than once")
    src, given = Path(os.path.abspath(ckpt.path)), as_path(dst, "dst")
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
