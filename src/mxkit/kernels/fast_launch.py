"""The launch fast path: a small C module (``_fast_launch.c``) that writes a bound launch's tensor pointers into its
parameter block and calls ``cuLaunchKernel``, in place of the ``ctypes`` call (~6 µs of host time a launch on the
device machines, ~4 of it ``ctypes``).

The module is built at first use with the host's C compiler and Python headers, as Triton builds its own
launcher, and cached under ``$MXKIT_CACHE_DIR`` (default ``~/.cache/mxkit``) by a hash of its source, the
compiler and the Python ABI. It needs no CUDA or PyTorch headers: :func:`module` hands it ``cuLaunchKernel``'s
address and PyTorch's current-stream accessor. Where it cannot be built or loaded (no compiler, no headers, a
read-only cache), or with ``MXKIT_FAST_LAUNCH=0``, :func:`module` returns None and launches keep ``ctypes``:
the same launch either way.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Optional

from ._env import choice

__all__ = ["module", "build", "build_extension", "cache_dir", "MAX_PARAMS"]

MAX_PARAMS = 512  # the C module's limit on a kernel's parameters (_fast_launch.c); more launch through ctypes

_NAME = "_mxkit_fast_launch"
_SRC = Path(__file__).with_name("_fast_launch.c")


def cache_dir() -> Path:
    """Where built modules are kept: ``$MXKIT_CACHE_DIR`` or ``~/.cache/mxkit``, then ``fast_launch/``."""
    root = os.environ.get("MXKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "mxkit")
    return Path(root) / "fast_launch"


def compiler(var: str = "CC", alternatives: tuple = ("cc", "gcc", "clang")) -> Optional[list[str]]:
    """The compiler command of environment variable ``var`` (else Python's build configuration's), split as a
    shell would, where its program is on PATH; else the first of ``alternatives`` on PATH; else None. ``"CXX"``,
    ``("c++", "g++", "clang++")`` for C++."""
    cmd = shlex.split(os.environ.get(var) or sysconfig.get_config_var(var) or alternatives[0])
    if cmd and shutil.which(cmd[0]):
        return cmd
    for alt in alternatives:
        if shutil.which(alt):
            return [alt]
    return None


def build(directory: Optional[Path] = None) -> Path:
    """Compile ``_fast_launch.c`` into ``directory`` (default :func:`cache_dir`) unless a module of the same
    source, compiler and Python ABI is there; returns its path. The file is written under a temporary name and
    renamed, so concurrent builders never load a partial file. Raises RuntimeError where it cannot be built."""
    cc = compiler()
    include = sysconfig.get_paths().get("include")
    if cc is None:
        raise RuntimeError("no C compiler found (CC, cc, gcc, clang)")
    if not include or not Path(include, "Python.h").exists():
        raise RuntimeError(f"Python.h not found under {include!r}")
    out_dir = Path(directory) if directory is not None else cache_dir()
    return build_extension(_SRC, _NAME, [*cc, "-O2", "-shared", "-fPIC", f"-I{include}"], [], out_dir)


def build_extension(src_path: Path, name: str, compile_cmd: list[str], link_flags: list[str], out_dir: Path,
                    tag_extra: str = "", timeout: int = 120) -> Path:
    """Compile the one-file extension ``src_path`` into module ``name`` under ``out_dir``:
    ``compile_cmd + [src, "-o", out] + link_flags``, unless a module of the same source, command, flags, Python
    ABI and ``tag_extra`` is there; returns its path. The file is written under a temporary name and renamed,
    so concurrent builders never load a partial file. Raises RuntimeError where it cannot be built."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    src = Path(src_path).read_bytes()
    key = " ".join(compile_cmd + link_flags) + suffix + tag_extra
    tag = hashlib.sha256(src + key.encode()).hexdigest()[:16]
    out = out_dir / f"{name}-{tag}{suffix}"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}-", suffix=suffix)
    os.close(fd)
    try:
        cmd = [*compile_cmd, str(src_path), "-o", tmp, *link_flags]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"building {name} failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(path: Path, name: str = _NAME) -> ModuleType:
    """Import the built module ``name`` at ``path`` (not registered in ``sys.modules``)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=1)
def module() -> Optional[ModuleType]:
    """The built module, initialised with ``cuLaunchKernel`` and PyTorch's current-stream accessor, or None
    (``MXKIT_FAST_LAUNCH=0``, no libcuda, or the module cannot be built or loaded: see the module docstring).
    ``module().launch(function, gx, gy, gz, block, shared, device, params, nparams, *pointers)`` returns the
    CUresult. A module that cannot be built or loaded where the driver is present is reported once (a warning
    naming why); launches then keep ``ctypes``."""
    if choice("MXKIT_FAST_LAUNCH", ("0", "1")) == "0" or sys.platform == "win32":
        return None
    import ctypes

    from .cuda_driver import CudaDriverUnavailable, _libcuda, _raw_stream

    try:
        addr = ctypes.cast(_libcuda().cuLaunchKernel, ctypes.c_void_p).value
    except (CudaDriverUnavailable, OSError, AttributeError):
        return None  # no driver: nothing launches through it anyway
    try:
        mod = load(build())
        mod.init(addr, _raw_stream)
    except Exception as e:  # (a best-effort speed-up: any failure keeps the ctypes launch)
        import warnings

        warnings.warn(f"mxkit: the C fast launch is not available ({type(e).__name__}: {str(e)[:300]}); kernels "
                      f"launch through ctypes (~2 µs more host time a launch). MXKIT_FAST_LAUNCH=0 silences this.",
                      RuntimeWarning, stacklevel=2)
        return None
    return mod

