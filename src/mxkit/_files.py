"""File checks shared by the CLI and the benchmarks: an output path is checked before any long work; an input file
read by a reader whose own errors mislead (safetensors) is checked first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union


def check_writable(path: Union[str, Path], option: str = "") -> Path:
    """Check that the file ``path`` can be written, by opening it for appending in its folder (nothing is
    written; the file, and any folder the check had to make on the way, are removed again: a run that fails
    later leaves nothing behind; the writer makes the folders). Raises OSError naming ``option`` (e.g.
    ``--out``) and the path: a directory, a parent that is a file, a place where files cannot be made (/proc,
    no permission)."""
    check_nonempty(path, option or "the output path")
    path = Path(path)
    what = f"{option} {str(path)!r}" if option else repr(str(path))
    if path.is_symlink() and not path.exists():  # (written through: its target is made, in the target's folder)
        target = os.readlink(path)
        if not (path.parent / target).parent.is_dir():
            raise FileNotFoundError(f"{what} cannot be written: it is a symbolic link to {target!r}, whose folder "
                                    f"does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"{what} is a directory, not a file that can be written")
    made: list[Path] = []
    try:
        missing = [p for p in path.parents if not p.exists()]
        above = path.parents[len(missing)] if len(missing) < len(path.parents) else Path(".")
        if not above.is_dir():
            raise NotADirectoryError(f"{what} cannot be written: {str(above)!r} is a file, not a folder")
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:  # ("new/.." exists once "new" is made: the writer's mkdir(parents) agrees)
                if folder.is_dir():
                    continue
                raise
            made.append(folder)
        target = path.resolve()  # (a symlink, dangling or not: the check makes and removes the file it points to)
        existed = target.exists()
        with path.open("a"):
            pass
        if not existed:
            target.unlink()
    except NotADirectoryError:
        raise
    except OSError as e:
        raise OSError(f"{what} cannot be written: {e.strerror or e}") from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:  # (something else put a file there meanwhile: leave it)
                pass
    return path


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all: :func:`write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Union[str, Path], data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a temporary file beside it, then renamed over it (its
    folders made first). The file gets the mode of the one it replaces, else that of a new file under the umask
    (``mkstemp`` makes its file 0600: results another user or service could not read). A symbolic link is written
    through: its target gets the data and the link stays (the rename replaced the link and left the target stale)."""
    import os
    import tempfile

    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_nonempty(path: Union[str, Path], what: str) -> None:
    """ValueError naming ``what`` for an empty path ("" is the current folder to pathlib: a typo, not a choice)."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{what} is empty: name a path")


def check_readable(path: Union[str, Path]) -> None:
    """Raises what opening the file ``path`` for reading raises (PermissionError: "[Errno 13] Permission denied:
    'path'"): the Rust safetensors reader reports an unreadable file as missing."""
    with open(path, "rb"):
        pass


def openable_name(path: Path, stack) -> str:
    """A name of the file ``path`` that readers taking only valid UTF-8 paths (safetensors' ``safe_open``) can open:
    the path itself, or for a path whose bytes are not UTF-8, ``/proc/self/fd/N`` of a descriptor held open until
    ``stack`` (a contextlib.ExitStack) closes (Linux; elsewhere the path as it is, and the reader's error)."""
    name = str(path)
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        if not os.path.isdir("/proc/self/fd"):
            return name
    fd = os.open(path, os.O_RDONLY)
    stack.callback(os.close, fd)
    return f"/proc/self/fd/{fd}"
