"""The direct launch of a ``@triton.jit`` kernel through its compiled handle (:class:`_Launcher`).

``JITFunction.run`` binds and specialises every argument on each call: at activation sizes its host time was
more than the kernels' device time. The direct launch keeps that path for the first call of each
specialisation and reuses the ``CompiledKernel`` it returns afterwards. It relies on two properties of
Triton's runtime, checked once per process against the installed Triton (:func:`direct_launch_supported`,
and by a CPU test with the ``[dev]`` install): ``JITFunction.run`` returns the ``CompiledKernel`` and
launches it with every bound argument in signature order, constexprs included, as
``CompiledKernel[grid](*args)`` does. Where either fails (another Triton, the CPU interpreter), every call
takes ``JITFunction``'s own launch.

:meth:`_Launcher.bind` goes one step further for callers that launch one problem many times (the quantize /
dequantize plans): a :class:`~mxkit.kernels.cuda_driver.BoundLaunch` of the compiled kernel's ``CUfunction``,
its parameter block built once and checked against the driver's own count and sizes of the kernel's
parameters (:func:`triton_bound_launch`), launched by one ``cuLaunchKernel`` (Triton's runner and the
specialisation key took ~20 µs of host time a call).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
from types import ModuleType
from typing import Iterator

import torch
import triton

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@functools.lru_cache(maxsize=None)
def direct_launch_supported() -> bool:
    """Whether the installed Triton has the launch convention the direct launch replays (see the module
    docstring): ``CompiledKernel.__getitem__`` builds a runner, and ``JITFunction.run`` passes its bound
    arguments (constexprs included) to ``kernel.run`` and returns the kernel."""
    try:
        from triton.compiler.compiler import CompiledKernel

        run_src = inspect.getsource(triton.runtime.jit.JITFunction.run)
        item_src = inspect.getsource(CompiledKernel.__getitem__)
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    return ("*bound_args.values()" in run_src and "return kernel" in run_src
            and "def runner(*args" in item_src and "*args)" in item_src)


_enabled = True  # switched off only inside triton_launch_only()


@contextlib.contextmanager
def triton_launch_only() -> Iterator[None]:
    """Within the block every launch goes through ``JITFunction.run`` (host-overhead A/B runs)."""
    global _enabled
    prev, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = prev


class _Launcher:
    """Launches kernel ``name`` of ``module`` (looked up at each call, so a kernel replaced on the module is the
    one launched), through its compiled handle after the first launch of a specialisation.

    The cache key holds every property Triton specialises on (tensor dtype and 16-byte alignment; int
    value == 1, % 16, 32-bit range) plus the constexprs, num_warps and the device, so a hit has the same
    specialisation; a hit calls the ``CompiledKernel`` with the runtime arguments and then every constexpr in
    signature order (defaults filled in). The kernel's runtime parameters must come before its constexprs."""

    def __init__(self, module: ModuleType, name: str):
        self.module = module
        self.name = name
        self.cache: dict = {}
        self.meta = None  # (fn, runtime args come first?, constexpr names, their defaults)

    def _meta(self, fn):
        if self.meta is None or self.meta[0] is not fn:
            params = fn.params
            n_rt = sum(1 for p in params if not p.is_constexpr)
            ok = all(not p.is_constexpr for p in params[:n_rt])
            self.meta = (fn, ok, [p.name for p in params[n_rt:]], {p.name: p.default for p in params[n_rt:]})
            self.cache.clear()
        return self.meta

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, int):
            return (a == 1, a % 16 == 0, _INT32_MIN <= a <= _INT32_MAX)
        # a host TensorDescriptor (Gluon / TMA): its type is the base's dtype, block shape and shared layout; the
        # strides' and base's 16-byte alignment are kept in the key too (conservative: a miss only recompiles)
        return ("desc", a.base.dtype, tuple(a.block_shape), a.layout, a.base.data_ptr() % 16 == 0,
                tuple(st % 16 == 0 for st in a.strides))

    def __call__(self, grid: tuple, args: tuple, consts: tuple, num_warps: int, consts_key=None) -> None:
        """consts: the constexprs as a tuple of (name, value) items (hashable: part of the key as they are);
        consts_key: a hashable stand-in that determines them, keyed instead (constexprs slow to hash: Gluon
        layouts, ~70 us a call with Triton 3.6)."""
        fn = getattr(self.module, self.name)
        if not (_enabled and isinstance(fn, triton.runtime.JITFunction) and direct_launch_supported()):
            fn[grid](*args, **dict(consts), num_warps=num_warps)  # (the interpreter: not a JITFunction)
            return
        _, ok, names, defaults = self._meta(fn)
        key = (tuple(map(self._spec, args)), consts if consts_key is None else ("key", consts_key), num_warps,
               torch.cuda.current_device())
        hit = self.cache.get(key) if ok else None
        if hit is None:
            given = dict(consts)
            k = fn[grid](*args, **given, num_warps=num_warps)
            if ok and hasattr(k, "function") and hasattr(k, "__getitem__"):
                # (a kernel that declares num_warps as a constexpr gets the launch option's value, as Triton binds it)
                self.cache[key] = (k, tuple(num_warps if n == "num_warps" else given.get(n, defaults[n])
                                            for n in names))
            return
        k, full_consts = hit
        k[(grid + (1, 1))[:3]](*args, *full_consts)  # (the compiled kernel's runner reads all three grid dims)

    def bind(self, grid: tuple, args: tuple, consts: tuple, num_warps: int):
        """A :class:`~mxkit.kernels.cuda_driver.BoundLaunch` of the kernel this launcher ran for exactly these
        arguments' specialisation (call it once first), with ``args``' values bound; or None where the direct
        launch is off or cannot be derived (:func:`triton_bound_launch`). The caller swaps the tensor pointers
        (:meth:`BoundLaunch.set_ptr`, in the order of the kernel's pointer parameters) for tensors of the same
        16-byte alignment, and launches ``grid`` with ``block``."""
        fn = getattr(self.module, self.name)
        if not (_enabled and isinstance(fn, triton.runtime.JITFunction) and direct_launch_supported()):
            return None
        _, ok, _, _ = self._meta(fn)
        hit = self.cache.get((tuple(map(self._spec, args)), consts, num_warps, torch.cuda.current_device()))
        return triton_bound_launch(hit[0], args, grid) if ok and hit is not None else None

    def bind_once(self, bound: dict, key: tuple, device: int, grid: tuple, args: tuple, consts: tuple,
                  num_warps: int) -> None:
        """After a launch of these arguments on CUDA device ``device``: ``bound[key]`` = :meth:`bind`'s launch (or
        False where it cannot be made), unless the key was tried, direct launches are off (nothing is stored then,
        so the key is tried again later) or ``device`` is not the current one (-1: not CUDA)."""
        if key not in bound and _enabled and device >= 0 and device == torch.cuda.current_device():
            bound[key] = self.bind(grid, args, consts, num_warps) or False


def bind_once_all(bound: dict, key: tuple, device: int, launches: tuple) -> None:
    """:meth:`_Launcher.bind_once` for a call made of several launches, each ``(launcher, grid, args, consts,
    num_warps)`` as it just ran (None: one that could not run): ``bound[key]`` = the tuple of their bound launches,
    or False where any cannot be made."""
    if key not in bound and _enabled and device >= 0 and device == torch.cuda.current_device():
        made = tuple(entry[0].bind(*entry[1:]) if entry else None for entry in launches)
        bound[key] = made if all(made) else False


class BoundCache:
    """Launches of one :class:`_Launcher`'s kernel whose runtime arguments are tensors then ints: the first call
    of a problem (grid, ints, constexprs, num_warps, the tensors' dtypes and 16-byte alignment, device) goes
    through the launcher and binds a direct launch (:meth:`_Launcher.bind_once`); later calls of that problem run
    it with their own tensors' pointers (one ``cuLaunchKernel``: Triton's runner took ~40 µs of host time a
    launch on the device machines). At most ``max_entries`` problems are kept (then all are dropped)."""

    def __init__(self, launcher: _Launcher, max_entries: int = 4096):
        self.launcher = launcher
        self.bound: dict = {}
        self.max_entries = max_entries

    def __call__(self, grid: tuple, tensors: tuple, ints: tuple, consts: tuple, num_warps: int) -> None:
        dev = tensors[0].get_device()
        key = (grid, ints, consts, num_warps, tuple(t.data_ptr() % 16 == 0 for t in tensors),
               tuple(t.dtype for t in tensors), dev)
        hit = bound_launch(self.bound, key)
        if hit:
            hit.run(*tensors)
            return
        args = tensors + ints
        self.launcher(grid, args, consts, num_warps)
        if len(self.bound) >= self.max_entries:
            self.bound.clear()
        self.launcher.bind_once(self.bound, key, dev, grid, args, consts, num_warps)


def bound_launch(bound: dict, key: tuple):
    """The launch :meth:`_Launcher.bind_once` stored under ``key`` (None / False: none), while direct launches
    are on."""
    return bound.get(key) if _enabled else None


_C_INTS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
           "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
           "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "fp64": ctypes.c_double}


def triton_bound_launch(k, args: tuple, grid: tuple):
    """A BoundLaunch of Triton ``CompiledKernel`` ``k`` with runtime arguments ``args`` (tensors, ints, floats:
    the kernel's non-constexpr parameters, which come first in its signature), or None. The kernel's parameters
    are those arguments not specialised into constants (Triton turns ints equal to 1 and None into constexprs
    of the compiled signature, entries of ``constants``), then the global and profile scratch pointers
    (null: kernels that need either scratch, several CTAs, PDL or a cooperative launch are not taken). The
    derived sizes must equal the driver's (:func:`~mxkit.kernels.cuda_driver.param_sizes`), else None.
    Its ``grid`` (3 ints), ``block`` (threads) and ``shared`` bytes are the kernel's: ``launch.run(*tensors)``."""
    from .cuda_driver import CudaDriverUnavailable, Kernel, param_sizes

    try:
        sig, consts, md = k.src.signature, k.src.constants, k.metadata
        if (not isinstance(sig, dict) or not isinstance(consts, dict) or getattr(md, "num_ctas", 1) != 1
                or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False)
                or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)):
            return None
        types_ = list(sig.values())
        if len(types_) < len(args):
            return None
        vals, sizes = [], []
        for i, a in enumerate(args):  # the runtime parameters: the first len(args) of the signature
            ty = types_[i]
            if ty == "constexpr" or (i,) in consts:  # specialised into the kernel (an int equal to 1, None)
                continue
            if ty.startswith("*"):
                if not (a is None or isinstance(a, torch.Tensor)):
                    return None
                vals.append(a)
                sizes.append(8)
            elif ty in _C_INTS:
                c = _C_INTS[ty](a)
                vals.append(c)
                sizes.append(ctypes.sizeof(c))
            else:
                return None
        k._init_handles()
        if param_sizes(k.function) != sizes + [8, 8]:
            return None
        dev = torch.device("cuda", torch.cuda.current_device())
        launch = Kernel.from_handle(k.function, k.name, dev).bind(vals + [None, None])
    except (AttributeError, TypeError, ValueError, CudaDriverUnavailable):
        return None
    launch.shared = int(md.shared)
    launch.grid = tuple((tuple(grid) + (1, 1))[:3])
    launch.block = 32 * int(md.num_warps)
    return launch
