"""Output-file checks shared by the CLI and the benchmarks: an output path is checked before any long work."""

from __future__ import annotations

from pathlib import Path
from typing import Union


def check_writable(path: Union[str, Path], option: str = "") -> Path:
    """Make the parent folders of the file ``path`` and check that it can be written, by opening it for appending
    (nothing is written; a file the check created is removed). Raises OSError naming ``option`` (e.g. ``--out``)
    and the path: a directory, a parent that is a file, a place where files cannot be made (/proc, no permission)."""
    path = Path(path)
    what = f"{option} {str(path)!r}" if option else repr(str(path))
    if path.is_dir():
        raise IsADirectoryError(f"{what} is a directory, not a file that can be written")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        target = path.resolve()  # (a symlink, dangling or not: the check makes and removes the file it points to)
        existed = target.exists()
        with path.open("a"):
            pass
        if not existed:
            target.unlink()
    except OSError as e:
        raise OSError(f"{what} cannot be written: {e.strerror or e}") from None
    return path
