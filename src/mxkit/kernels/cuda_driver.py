"""Launch a PTX kernel shipped with mxkit through the CUDA driver API (``libcuda`` by ``ctypes``).

The PTX is loaded once per device into the context PyTorch made current (its primary context); the driver
compiles it for the GPU at load time, so no CUDA toolkit is needed at run time. Launches go on PyTorch's
current stream, so they order with PyTorch's work and are captured by CUDA graphs. Where ``libcuda`` or the
module cannot be loaded, :func:`load_module` raises :class:`CudaDriverUnavailable` and the caller takes its
Triton path.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from ._env import choice
from .fast_launch import MAX_PARAMS as _FAST_MAX_PARAMS  # kernels with more parameters launch through ctypes

__all__ = ["CudaDriverUnavailable", "load_module", "Kernel", "BoundLaunch", "shipped_ptx_unavailable",
           "shipped_kernel", "device_index", "param_sizes"]


class CudaDriverUnavailable(RuntimeError):
    """libcuda, the device or the PTX module is not usable here."""


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise CudaDriverUnavailable("libcuda is not loadable")
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
        ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _libcuda().cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaDriverUnavailable(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


@functools.lru_cache(maxsize=None)
def _module(path: str, device_index: int) -> ctypes.c_void_p:
    lib = _libcuda()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream()  # makes PyTorch's primary context current on this thread
        torch.empty(1, device=f"cuda:{device_index}")
        mod = ctypes.c_void_p()
        _check(lib.cuModuleLoadData(ctypes.byref(mod), Path(path).read_bytes() + b"\0"), f"loading {path}")
    return mod


def load_module(path: Union[str, Path], device: torch.device) -> ctypes.c_void_p:
    """The module of PTX file ``path`` on CUDA ``device`` (loaded once per process and device).
    Raises CudaDriverUnavailable."""
    if device.type != "cuda":
        raise CudaDriverUnavailable(f"{device} is not a CUDA device")
    return _module(str(path), device_index(device))


def device_index(device: torch.device) -> int:
    """The index of CUDA ``device`` (the current device for a bare ``"cuda"``)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """The multiprocessor count of CUDA device ``index`` (kept: asked on every plan of the GEMM kernels)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def shipped_ptx_unavailable(path: str, device_index: int, min_cc: tuple[int, int], needs: str) -> Optional[str]:
    """None when the PTX file ``path`` can run on CUDA device ``device_index``, else why not: the file missing, a
    GPU older than ``min_cc`` (``needs``: what for), the driver refusing the module, or ``MXKIT_MMA_DECODE=0``
    (which turns off every CUDA C++ kernel mxkit ships; read on the first call for each file and device, then
    kept: set it before)."""
    if choice("MXKIT_MMA_DECODE", ("0", "1")) == "0":
        return "MXKIT_MMA_DECODE=0"
    if not Path(path).exists():
        return f"{Path(path).name} is missing"
    if torch.cuda.get_device_capability(device_index) < min_cc:
        return f"needs sm_{min_cc[0]}{min_cc[1]} or newer ({needs})"
    try:
        load_module(path, torch.device("cuda", device_index))
    except CudaDriverUnavailable as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def shipped_kernel(path: str, name: str, device_index: int) -> "Kernel":
    """:class:`Kernel` ``name`` of the PTX file ``path`` on device ``device_index``, made once."""
    return Kernel(path, name, torch.device("cuda", device_index))


class Kernel:
    """Function ``name`` of the PTX module ``path`` on ``device``: ``kernel(grid, block, args)`` launches it
    on the current stream. ``args`` are tensors (passed as their data pointers; None passes a null pointer)
    and ``ctypes`` scalars (``ctypes.c_int``, ``ctypes.c_longlong``) in the kernel's parameter order.
    :meth:`from_handle` wraps a function loaded by someone else (a Triton ``CompiledKernel``'s)."""

    def __init__(self, path: Union[str, Path], name: str, device: torch.device):
        mod = load_module(path, device)
        self.fn = ctypes.c_void_p()
        _check(_libcuda().cuModuleGetFunction(ctypes.byref(self.fn), mod, name.encode()), f"finding {name}")
        self.name, self.device = name, device
        self.index = device_index(device)

    @classmethod
    def from_handle(cls, handle: int, name: str, device: torch.device) -> "Kernel":
        """The kernel of an already loaded ``CUfunction`` ``handle`` (its module stays owned by its loader)."""
        k = cls.__new__(cls)
        k.fn, k.name, k.device, k.index = ctypes.c_void_p(handle), name, device, device_index(device)
        return k

    def __call__(self, grid: Sequence[int], block: int, args: Sequence) -> None:
        """One launch with ``args``: the parameter block of the first call is kept and its values replaced (the
        same kinds of argument in the same order each call: a tensor or None where a pointer goes), so a call
        builds no ctypes objects (binding 17 arguments afresh took ~50 µs of host time). A grid with a 0 in it
        launches nothing (the driver refuses it; Triton's launcher skips it alike)."""
        if 0 in grid:
            return
        b = self.__dict__.get("_bound")
        if b is None or len(b.vals) != len(args):
            b = self.bind(args)
            with b.lock:  # (published inside: another thread's call waits for this launch to read the block)
                self._bound = b
                b(grid, block)
            return
        with b.lock:
            for v, a in zip(b.vals, args):
                v.value = a.data_ptr() if isinstance(a, torch.Tensor) else None if a is None else a.value
            b(grid, block)

    def bind(self, args: Sequence) -> "BoundLaunch":
        """The launch with its parameter block built once; :meth:`BoundLaunch.set_ptr` swaps a pointer argument
        (the per-call tensors) without rebuilding it (the eager hot path)."""
        return BoundLaunch(self, args)


class BoundLaunch:
    """A kernel and its ``ctypes`` parameter block (see :meth:`Kernel.bind`).

    A launch is one ``cuLaunchKernel`` of that block (its pointer arguments ``ctypes`` objects made once: argument
    conversion was a third of the call's host time) on the raw handle of PyTorch's current stream
    (``torch.cuda.current_stream()`` builds a Python Stream object: ~9 µs a call), called by the C fast launch
    (:mod:`mxkit.kernels.fast_launch`) where it is built, else through a prototype-free ``ctypes`` handle."""

    def __init__(self, kernel: Kernel, args: Sequence):
        self.kernel = kernel
        self.vals = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor)
                     else ctypes.c_void_p(0) if a is None else a for a in args]
        self.params = (ctypes.c_void_p * len(self.vals))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in self.vals])
        self._fn = ctypes.c_void_p(kernel.fn.value)
        self._params = ctypes.c_void_p(ctypes.addressof(self.params))
        self._fn_int, self._params_int = kernel.fn.value, ctypes.addressof(self.params)
        # the leading pointer parameters, the ones run() / the fast launch may rewrite
        self.n_ptr = next((i for i, v in enumerate(self.vals) if not isinstance(v, ctypes.c_void_p)), len(self.vals))
        self._fast_ok = len(self.vals) <= _FAST_MAX_PARAMS
        self._stream = (None, None)  # (raw handle, its ctypes object)
        self.shared = 0  # dynamic shared memory bytes of each launch
        self.grid, self.block = (1, 1, 1), 32  # the launch shape of run()
        self.ld = None  # the leading dimensions bound into the block, where its maker records them
        # held around set_ptr + launch where several threads may share this launch (the driver reads the
        # parameter block during cuLaunchKernel, which runs without the GIL): run() does
        self.lock = threading.Lock()

    def set_ptr(self, i: int, t: Optional[torch.Tensor]) -> None:
        self.vals[i].value = t.data_ptr() if t is not None else 0

    def __call__(self, grid: Sequence[int], block: int) -> None:
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        self.launch(gx, gy, gz, block)

    def run(self, *tensors: Optional[torch.Tensor]) -> None:
        """The launch of shape ``grid`` / ``block`` with ``tensors`` (None: a null pointer) as its first pointer
        arguments, atomically for threads sharing this launch: through the C fast launch where it is built
        (:mod:`mxkit.kernels.fast_launch`), else ``ctypes``."""
        if len(tensors) > self.n_ptr:
            raise ValueError(f"{self.kernel.name}: {len(tensors)} tensors for {self.n_ptr} leading pointer parameters")
        if 0 in self.grid:  # (an empty grid launches nothing, as Kernel.__call__)
            return
        fast = _fast() if self._fast_ok else None
        if fast is not None:
            gx, gy, gz = self.grid
            rc = fast.launch(self._fn_int, gx, gy, gz, self.block, self.shared, self.kernel.index, self._params_int,
                             len(self.vals), *tensors)
            if rc:
                self._retry(rc, gx, gy, gz, self.block, tensors)
            return
        with self.lock:
            for i, t in enumerate(tensors):
                self.vals[i].value = t.data_ptr() if t is not None else 0
            self._launch_ctypes(*self.grid, self.block)

    def with_outputs(self, slots: Sequence[int], outs: Sequence[tuple], n_inputs: int, single: bool = False,
                     at: Optional[Sequence[int]] = None, maps: Sequence[tuple] = ()):
        """The C++ fast call of this launch (:mod:`mxkit.kernels.fast_call`), or None where that module is not
        loaded (yet): ``call(*inputs)`` allocates ``outs`` — (shape, dtype, zero-filled) each, on this launch's
        device — writes pointer parameter ``i`` (``at[i]`` where given) from input ``slots[i]`` (>= 0; a tensor or
        None) or output ``-1 - slots[i]``, points each host TMA descriptor of ``maps`` — (parameter index, input
        index, its 128 bytes as encoded) — at that input's data, launches ``grid`` / ``block`` / ``shared`` as they
        stand now on the current stream, and returns the outputs (a tuple, or the one tensor with ``single``). The
        other parameters are the block's values as they stand at each call (this launch's ints). Raises ValueError
        for more slots than leading pointer parameters (without ``at``); None also where the module cannot
        re-address descriptors (:func:`~mxkit.kernels.fast_call.maps_supported`)."""
        if at is None and len(slots) > self.n_ptr:
            raise ValueError(f"{self.kernel.name}: {len(slots)} pointer slots for {self.n_ptr} pointer parameters")
        mod = _fast_call() if self._fast_ok else None
        if mod is None:
            return None
        from .fast_call import MAX_DIMS, MAX_MAPS, MAX_OUTS, MAX_SLOTS, maps_supported

        if len(slots) > MAX_SLOTS or n_inputs > MAX_SLOTS or len(outs) > MAX_OUTS \
                or any(len(shape) > MAX_DIMS for shape, _, _ in outs) or len(maps) > MAX_MAPS \
                or (maps and not maps_supported()):
            return None  # (past the C++ module's limits: the caller keeps its Python path)
        grid = (tuple(self.grid) + (1, 1))[:3]
        extra = () if at is None and not maps else \
            (tuple(range(len(slots))) if at is None else tuple(at), tuple(maps))
        return mod.Plan(self._fn_int, grid, self.block, self.shared, self.kernel.index, self._params_int,
                        len(self.vals), tuple(slots), tuple((tuple(s), d, bool(z)) for s, d, z in outs), n_inputs,
                        single, self, self.kernel.name, *extra)

    def launch(self, gx: int, gy: int, gz: int, block: int) -> None:
        """The launch on the current stream, grid (gx, gy, gz) and ``block`` threads, of the parameter block as
        it stands (:meth:`set_ptr`); nothing where a grid dimension is 0."""
        if not (gx and gy and gz):
            return
        fast = _fast() if self._fast_ok else None
        if fast is None:
            self._launch_ctypes(gx, gy, gz, block)
            return
        rc = fast.launch(self._fn_int, gx, gy, gz, block, self.shared, self.kernel.index, self._params_int,
                         len(self.vals))
        if rc:
            self._retry(rc, gx, gy, gz, block, ())

    def _retry(self, rc: int, gx: int, gy: int, gz: int, block: int, tensors: tuple) -> None:
        """After a fast launch returned ``rc``: on a thread without a current context, bind it and launch again
        with the same ``tensors`` (not the shared block as it stands: another thread may have written it since);
        raise for any other error."""
        if rc == _INVALID_CONTEXT:
            bind_primary_context(self.kernel.index)
            rc = _fast().launch(self._fn_int, gx, gy, gz, block, self.shared, self.kernel.index, self._params_int,
                                len(self.vals), *tensors)
        if rc:
            _check(rc, f"launching {self.kernel.name}")

    def _launch_ctypes(self, gx: int, gy: int, gz: int, block: int) -> None:
        raw = _raw_stream(self.kernel.index)
        stream = self._stream  # (read once: another thread may replace it)
        if raw != stream[0]:
            stream = self._stream = (raw, ctypes.c_void_p(raw))
        rc = _launch_fn()(self._fn, gx, gy, gz, block, 1, 1, self.shared, stream[1], self._params, None)
        if rc == _INVALID_CONTEXT:  # a thread without a current context (autograd's backward worker): bind it, retry
            bind_primary_context(self.kernel.index)
            rc = _launch_fn()(self._fn, gx, gy, gz, block, 1, 1, self.shared, stream[1], self._params, None)
        if rc:
            _check(rc, f"launching {self.kernel.name}")


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT


def bind_primary_context(index: int) -> None:
    """Make device ``index``'s primary context (the one PyTorch uses, into which the modules were loaded) current on
    this thread. A thread that has made no CUDA runtime call that needs one, such as the autograd engine's
    worker running a backward, has no current context, and driver-API launches there fail with
    CUDA_ERROR_INVALID_CONTEXT. Raises CudaDriverUnavailable."""
    lib = _libcuda()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(index)), "cuDeviceGet")
    # (retained, not released: PyTorch holds this context for the life of the process anyway)
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def param_sizes(handle: int) -> Optional[list[int]]:
    """The byte sizes of the parameters of ``CUfunction`` ``handle`` in order (``cuFuncGetParamInfo``, CUDA 12.4
    drivers and newer), or None where the driver cannot say."""
    try:
        fn = _libcuda()["cuFuncGetParamInfo"]
    except (CudaDriverUnavailable, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    sizes, off, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    while len(sizes) < 256:
        if fn(ctypes.c_void_p(handle), len(sizes), ctypes.byref(off), ctypes.byref(size)) != 0:
            return sizes  # (past the last parameter: CUDA_ERROR_INVALID_VALUE)
        sizes.append(size.value)
    return None


_FAST_UNSET = object()
_fast_module = _FAST_UNSET


def _fast():
    """The built C fast launch (:func:`mxkit.kernels.fast_launch.module`), or None; looked up once."""
    global _fast_module
    if _fast_module is _FAST_UNSET:
        from .fast_launch import module

        _fast_module = module()
    return _fast_module


def fast_call_loaded() -> bool:
    """Whether the C++ fast call module is loaded (:meth:`BoundLaunch.with_outputs` can make a call): callers skip
    building its arguments otherwise."""
    return _fast_call() is not None


def _fast_call():
    """The C++ fast call module (:func:`mxkit.kernels.fast_call.module`): None while it builds, where it is off or
    where it cannot be built."""
    mod = _fast_call_state[0]
    if mod is None and not _fast_call_state[1]:
        from .fast_call import _ready, module

        settled = _ready.is_set()  # (read first: a build that ends between the two reads is seen next time)
        mod = module()
        _fast_call_state[0] = mod
        _fast_call_state[1] = settled  # loaded, off or failed: no more lookups
    return mod


_fast_call_state = [None, False]  # (module, settled)


@functools.lru_cache(maxsize=1)
def _launch_fn():
    """``cuLaunchKernel`` without a prototype: every argument is passed as given (ctypes objects for the
    pointers, Python ints, < 2**31, for the unsigned ints), which skips ctypes' per-argument conversion."""
    fn = _libcuda()["cuLaunchKernel"]  # a new function object: the prototyped one keeps its argtypes
    fn.restype = ctypes.c_int
    return fn


def _raw_stream_public(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# the raw cudaStream_t PyTorch launches on, by device index: torch's own accessor (the one Triton's launcher
# calls), or the public form where a build lacks it
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_public
