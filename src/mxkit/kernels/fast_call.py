"""The eager call fast path: a small C++ module (``_fast_call.cpp``) whose ``Plan`` allocates a bound launch's outputs
with ``at::empty`` and launches it, in one call from Python.

On the device machines an eager quantize spent ~4 µs of host time on each ``torch.empty`` it made from Python (its
argument parsing and wrapping) against ~2 for ``at::empty`` from C++, and the issue's budget for the whole call is
1.5× one ``x * 2``. :meth:`mxkit.kernels.cuda_driver.BoundLaunch.with_outputs` makes a Plan of a bound launch; the
quantize, dequantize and decode GEMM hot paths call it where it exists, and otherwise allocate with ``torch.empty``
and launch through :mod:`~mxkit.kernels.fast_launch`: the same kernel, the same bytes. A Plan may also carry host
TMA descriptors (the wgmma prefill GEMM's): each call points them at its inputs with ``cuTensorMapReplaceAddress``
(:func:`maps_supported`), their shapes and strides fixed by the plan. ``plan.wrapping(wraps, group)`` returns a
Plan whose call also makes the objects of its outputs (the hot quantize / cast-transpose runners' MXTensors, as
``MXTensor._trusted_maker`` makes them), with ``group`` each object's outputs in one allocation (a cast-transpose's
copies: two allocations for four outputs, ~0.6 µs less a call on the H100's host; not for a custom op's body,
whose outputs PyTorch refuses to see share a storage). ``mm_t(a, w)`` is ``a @ w.T`` by the backend's
mm kernel called directly (torch.mm's kernel and bytes, no Python argument parsing or autograd), for the prepared
dense-exact and bf16-exact calls (:func:`mxkit.kernels.matmul_calls.mm_t_fn`).

The module is built against the installed PyTorch's headers and libraries with the host's C++ compiler (about 15 s,
once per machine and PyTorch build: cached under ``$MXKIT_CACHE_DIR`` like the C fast launch). The build runs in a
background thread started by the first :func:`module` call, so no call waits for it; calls made before it is loaded
take the Python path. ``module(wait=True)`` waits (tests, benchmarks). ``MXKIT_FAST_CALL=0`` turns it off; a build
that fails is reported once (a warning naming why) and the Python path stays."""

from __future__ import annotations

import os
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Optional

from ._env import choice
from .fast_launch import build_extension, cache_dir, compiler, load

__all__ = ["module", "build", "maps_supported", "MAX_SLOTS", "MAX_OUTS", "MAX_DIMS", "MAX_MAPS"]

# the C++ Plan's limits (_fast_call.cpp's kMaxSlots, kMaxOuts, kMaxDims, kMaxMaps; a test checks them): launches
# past them keep the Python path (BoundLaunch.with_outputs returns None)
MAX_SLOTS, MAX_OUTS, MAX_DIMS, MAX_MAPS = 16, 8, 8, 4

_NAME = "_mxkit_fast_call"
_SRC = Path(__file__).with_name("_fast_call.cpp")


def build(directory: Optional[Path] = None) -> Path:
    """Compile ``_fast_call.cpp`` into ``directory`` (default :func:`~mxkit.kernels.fast_launch.cache_dir`) unless
    a module of the same source, compiler, flags, Python ABI and PyTorch build is there; returns its path. Raises
    RuntimeError where it cannot be built (no C++ compiler, no Python or PyTorch headers, a failed compile)."""
    import torch

    cxx = compiler("CXX", ("c++", "g++", "clang++"))
    py_include = sysconfig.get_paths().get("include")
    root = Path(torch.__file__).parent
    include, lib = root / "include", root / "lib"
    if cxx is None:
        raise RuntimeError("no C++ compiler found (CXX, c++, g++, clang++)")
    if not py_include or not Path(py_include, "Python.h").exists():
        raise RuntimeError(f"Python.h not found under {py_include!r}")
    if not (include / "ATen" / "core" / "Tensor.h").exists():
        raise RuntimeError(f"PyTorch's C++ headers not found under {str(include)!r}")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cmd = [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{py_include}"]
    link = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    out_dir = Path(directory) if directory is not None else cache_dir()
    return build_extension(_SRC, _NAME, cmd, link, out_dir, tag_extra=f"torch {torch.__version__} {root}",
                           timeout=600)


_lock = threading.Lock()
_ready = threading.Event()
_state: dict = {"module": None, "thread": None, "maps": False}


def _init(mod: ModuleType) -> None:
    import ctypes

    from .cuda_driver import _check, _libcuda, _raw_stream, bind_primary_context

    lib = _libcuda()
    addr = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
    mod.init(addr, _raw_stream, bind_primary_context, lambda rc, what: _check(rc, f"launching {what}"))
    try:  # (CUDA 12.0+ drivers: Plans with host TMA descriptors need it; without it none is made)
        mod.init_maps(ctypes.cast(lib.cuTensorMapReplaceAddress, ctypes.c_void_p).value)
        _state["maps"] = True
    except AttributeError:
        pass


def _build_and_load() -> None:
    try:
        mod = load(build(), _NAME)
        _init(mod)
        _state["module"] = mod
    except Exception as e:  # (a best-effort speed-up: any failure keeps the Python path)
        import warnings

        warnings.warn(f"mxkit: the C++ fast call is not available ({type(e).__name__}: {str(e)[:300]}); eager calls "
                      f"allocate from Python (~2 µs more host time an output). MXKIT_FAST_CALL=0 silences this.",
                      RuntimeWarning, stacklevel=2)
    finally:
        _ready.set()


def module(wait: bool = False) -> Optional[ModuleType]:
    """The built module, initialised with ``cuLaunchKernel``, PyTorch's current-stream accessor, the context binder
    and the driver error check; or None: off (``MXKIT_FAST_CALL=0``), no CUDA driver, the build failed, or still
    building (the first call starts the build in a background thread; ``wait=True`` waits for it to end)."""
    mod = _state["module"]
    if mod is not None:
        return mod
    if _state["thread"] is None:
        with _lock:
            if _state["thread"] is None:
                if choice("MXKIT_FAST_CALL", ("0", "1")) == "0" or not _driver_present():
                    _state["thread"] = False
                    _ready.set()
                else:
                    _state["thread"] = t = threading.Thread(target=_build_and_load, name="mxkit-fast-call-build",
                                                            daemon=True)
                    t.start()
    if wait:
        _ready.wait()
    return _state["module"]


def maps_supported() -> bool:
    """Whether the loaded module can make Plans with host TMA descriptors (the driver has
    ``cuTensorMapReplaceAddress``)."""
    return bool(_state.get("maps")) and _state["module"] is not None


def _after_fork_in_child() -> None:
    """A child forked while the build thread ran has no such thread: start over (the next call builds or loads).
    A build that had ended (loaded, or failed and reported) stays as it was. The lock is made anew: another
    thread of the parent may have held it."""
    global _ready, _lock
    _lock = threading.Lock()
    t = _state["thread"]
    if _state["module"] is None and t and not _ready.is_set():
        _state["thread"] = None
        _ready = threading.Event()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _driver_present() -> bool:
    from .cuda_driver import CudaDriverUnavailable, _libcuda

    try:
        _libcuda()
    except (CudaDriverUnavailable, OSError):
        return False
    return True
