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
from typing import Iterator, Optional

import torch
import triton

from ._env import choice

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
# _Launcher's hits through ArgsLaunch (one cuLaunchKernel) rather than Triton's runner; MXKIT_ARGS_LAUNCH=0: off
# (read once, at import: set it before importing mxkit)
_ARGS_LAUNCH = choice("MXKIT_ARGS_LAUNCH", ("0", "1")) != "0"


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

    def _key(self, args: tuple, consts: tuple, num_warps: int) -> tuple:
        """The cache key of a launch of these arguments (see the class docstring)."""
        return tuple(map(self._spec, args)), consts, num_warps, torch.cuda.current_device()

    def __call__(self, grid: tuple, args: tuple, consts: tuple, num_warps: int) -> None:
        """consts: the constexprs as a tuple of (name, value) items (hashable: part of the key as they are; quick
        to hash: a kernel's Gluon layouts reach it as closure constexprs, not arguments)."""
        fn = getattr(self.module, self.name)
        if not (_enabled and isinstance(fn, triton.runtime.JITFunction) and direct_launch_supported()):
            fn[grid](*args, **dict(consts), num_warps=num_warps)  # (the interpreter: not a JITFunction)
            return
        _, ok, names, defaults = self._meta(fn)
        key = self._key(args, consts, num_warps)
        hit = self.cache.get(key) if ok else None
        if hit is None:
            given = dict(consts)
            k = fn[grid](*args, **given, num_warps=num_warps)
            if ok and hasattr(k, "function") and hasattr(k, "__getitem__"):
                # (a kernel that declares num_warps as a constexpr gets the launch option's value, as Triton binds it)
                self.cache[key] = (k, tuple(num_warps if n == "num_warps" else given.get(n, defaults[n])
                                            for n in names), None)
            return
        k, full_consts, fast = hit
        if fast is None and _ARGS_LAUNCH:  # (made at the second call: the first may have compiled the kernel)
            fast = ArgsLaunch.make(k, args, grid) or False
            self.cache[key] = (k, full_consts, fast)
        if fast and fast(grid, args):
            return
        k[(grid + (1, 1))[:3]](*args, *full_consts)  # (the compiled kernel's runner reads all three grid dims)

    def _hit(self, args: tuple, consts: tuple, num_warps: int):
        """(key, cache entry) of the specialisation these arguments hit, or None where direct launches or ArgsLaunch
        are off or the kernel is not compiled for them yet."""
        fn = getattr(self.module, self.name)
        if not (_enabled and _ARGS_LAUNCH and isinstance(fn, triton.runtime.JITFunction)
                and direct_launch_supported()):
            return None
        _, ok, _, _ = self._meta(fn)
        key = self._key(args, consts, num_warps)
        hit = self.cache.get(key) if ok else None
        return None if hit is None else (key, hit)

    def args_launch(self, grid: tuple, args: tuple, consts: tuple, num_warps: int):
        """The :class:`ArgsLaunch` of the specialisation these arguments hit (made here where the hit has none yet),
        after at least one call of it: a caller that keeps it launches later calls of the same specialisation
        (argument kinds, dtypes, 16-byte alignment of every pointer, the same ints) with one ``fast(grid, args)``
        and none of this launcher's per-call key. None where direct launches or ArgsLaunch are off, the kernel is
        not compiled for these arguments yet, or the launch cannot be derived."""
        got = self._hit(args, consts, num_warps)
        if got is None:
            return None
        key, (k, full_consts, fast) = got
        if fast is None:
            fast = ArgsLaunch.make(k, args, grid) or False
            self.cache[key] = (k, full_consts, fast)
        return fast or None

    def private_args_launch(self, grid: tuple, args: tuple, consts: tuple, num_warps: int):
        """A new :class:`ArgsLaunch` of the specialisation these arguments hit (after at least one call of it), its
        parameter block its caller's alone (:meth:`ArgsLaunch.with_outputs`); None as :meth:`args_launch`."""
        got = self._hit(args, consts, num_warps)
        return None if got is None else ArgsLaunch.make(got[1][0], args, grid)

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
        hit = self.cache.get(self._key(args, consts, num_warps))
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


def _derive(k, args: tuple, descs: bool):
    """(values, sizes, plan) of Triton ``CompiledKernel`` ``k``'s parameter block for runtime arguments ``args``
    (see :func:`triton_bound_launch`), or None: one value per kernel parameter (tensors as given, ctypes scalars,
    and with ``descs`` each host TMA descriptor's :class:`_TmaSlot` values), its size, and per runtime argument
    that is a parameter (argument index, its ctypes value or slot) for :class:`ArgsLaunch`. Raises what the
    inspection of an unusual kernel raises (the callers catch it)."""
    sig, consts, md = k.src.signature, k.src.constants, k.metadata
    if (not isinstance(sig, dict) or not isinstance(consts, dict) or getattr(md, "num_ctas", 1) != 1
            or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False)
            or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)):
        return None
    types_ = list(sig.values())
    if len(types_) < len(args):
        return None
    tdm = list(getattr(md, "tensordesc_meta", None) or [])
    vals, sizes, plan = [], [], []
    for i, a in enumerate(args):  # the runtime parameters: the first len(args) of the signature
        ty = types_[i]
        if ty == "constexpr" or (i,) in consts:  # specialised into the kernel (an int equal to 1, None)
            continue
        if isinstance(ty, str) and ty.startswith("tensordesc"):
            if not (descs and tdm and hasattr(a, "base") and hasattr(a, "block_shape")):
                return None
            slot = _TmaSlot.make(tdm.pop(0), len(a.shape))
            if slot is None:
                return None
            vals += slot.values
            sizes += [128] + [4] * slot.ndim + [8] * slot.ndim
            plan.append((i, slot))
        elif ty.startswith("*"):
            if not (a is None or isinstance(a, torch.Tensor)):
                return None
            vals.append(a)
            sizes.append(8)
            plan.append((i, None))
        elif ty in _C_INTS:
            c = _C_INTS[ty](a)
            vals.append(c)
            sizes.append(ctypes.sizeof(c))
            plan.append((i, c))
        else:
            return None
    if tdm:
        return None
    return vals, sizes, plan


def _bind(k, vals: list, sizes: list, grid: tuple):
    """The BoundLaunch of ``k`` with parameter values ``vals`` (then the two null scratch pointers), where the
    driver's parameter sizes equal ``sizes`` (+ the scratch pointers'), else None."""
    from .cuda_driver import Kernel, param_sizes

    k._init_handles()
    if param_sizes(k.function) != sizes + [8, 8]:
        return None
    dev = torch.device("cuda", torch.cuda.current_device())
    launch = Kernel.from_handle(k.function, k.name, dev).bind(vals + [None, None])
    launch.shared = int(k.metadata.shared)
    launch.grid = tuple((tuple(grid) + (1, 1))[:3])
    launch.block = 32 * int(k.metadata.num_warps)
    launch.owner = k  # (the CompiledKernel owns the module of the raw handle: newer Triton unloads it when collected)
    return launch


def triton_bound_launch(k, args: tuple, grid: tuple):
    """A BoundLaunch of Triton ``CompiledKernel`` ``k`` with runtime arguments ``args`` (tensors, ints, floats:
    the kernel's non-constexpr parameters, which come first in its signature), or None. The kernel's parameters
    are those arguments not specialised into constants (Triton turns ints equal to 1 and None into constexprs
    of the compiled signature, entries of ``constants``), then the global and profile scratch pointers
    (null: kernels that need either scratch, several CTAs, PDL or a cooperative launch are not taken). The
    derived sizes must equal the driver's (:func:`~mxkit.kernels.cuda_driver.param_sizes`), else None.
    Its ``grid`` (3 ints), ``block`` (threads) and ``shared`` bytes are the kernel's: ``launch.run(*tensors)``."""
    from .cuda_driver import CudaDriverUnavailable

    try:
        got = _derive(k, args, descs=False)
        return None if got is None else _bind(k, got[0], got[1], grid)
    except (AttributeError, TypeError, ValueError, CudaDriverUnavailable):
        return None


class ArgsLaunch:
    """One specialisation of a compiled Triton / Gluon kernel launched by one ``cuLaunchKernel`` of a parameter
    block rewritten from each call's runtime arguments (:meth:`_Launcher.__call__` on a hit): tensors' pointers,
    ints, floats, and host TMA descriptors (``TensorDescriptor``: its CUtensorMap encoded here as Triton's launcher
    encodes it, again only where its base, shape or strides changed). Triton's runner took 35-70 µs of host time a
    launch on the device machines, the wgmma kernel's with its three descriptors the most. It skips Triton's launch
    hooks (``knobs.runtime.launch_enter_hook``, which proton's profiler sets): set ``MXKIT_ARGS_LAUNCH=0`` to see
    these launches there."""

    def __init__(self, launch, plan: list):
        self.launch = launch
        self.plan = []  # (argument index, 0 pointer / 1 scalar / 2 descriptor, its ctypes value or slot)
        self.param = {}  # argument index -> its (first) parameter's index in the block
        pos = 0
        for i, slot in plan:
            if slot is None:
                self.plan.append((i, 0, launch.vals[pos]))
            else:
                self.plan.append((i, 2 if isinstance(slot, _TmaSlot) else 1, slot))
            self.param[i] = pos
            pos += 1 + 2 * slot.ndim if isinstance(slot, _TmaSlot) else 1

    @classmethod
    def make(cls, k, args: tuple, grid: tuple) -> Optional["ArgsLaunch"]:
        """The launch of ``k`` for arguments like ``args``, or None where it cannot be derived (then the caller
        keeps Triton's runner)."""
        from .cuda_driver import CudaDriverUnavailable

        try:
            got = _derive(k, args, descs=True)
            launch = None if got is None else _bind(k, got[0], got[1], grid)
        except (AttributeError, TypeError, ValueError, KeyError, ImportError, CudaDriverUnavailable):
            return None
        return None if launch is None else cls(launch, got[2])

    def __call__(self, grid: tuple, args: tuple) -> bool:
        """Launch with ``args`` (the same kinds, in the same order, of the specialisation it was made for) on
        ``grid``; False, launching nothing, where a descriptor cannot be encoded (the caller then takes Triton's
        runner, which raises its error)."""
        b = self.launch
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        if not gx * gy * gz:  # (as Triton's launcher: nothing to launch)
            return True
        with b.lock:
            if not self._fill(args):
                return False
            b.launch(gx, gy, gz, b.block)
        return True

    def _fill(self, args: tuple) -> bool:
        for i, kind, v in self.plan:
            a = args[i]
            if kind == 0:
                v.value = a.data_ptr() if a is not None else 0
            elif kind == 1:
                v.value = a
            elif not v.fill(a):
                return False
        return True

    def with_outputs(self, args: tuple, roles: tuple, outs: tuple, n_inputs: int, single: bool = True):
        """A C++ fast call (:meth:`~mxkit.kernels.cuda_driver.BoundLaunch.with_outputs`) of this launch with its
        block filled from ``args`` once: ``roles[i]`` says where runtime argument ``i`` comes from at each call:
        a pointer from input ``j`` (``j`` >= 0, a tensor or None) or output ``-1 - j``, a host TMA descriptor
        re-addressed to input ``j``'s data (its shape, strides and box as ``args`` encoded them), a scalar
        None (kept as bound). Only for a launch of one's own (:meth:`_Launcher.private_args_launch`): the block is
        read at each call. None where a role does not fit its argument or the call cannot be made."""
        if len(roles) != len(args) or not self._fill(args):
            return None
        slots, at, maps = [], [], []
        for i, kind, v in self.plan:
            role = roles[i]
            if (kind == 1) != (role is None) or (kind == 2 and not (0 <= role < n_inputs)):
                return None
            if kind == 0:
                slots.append(role)
                at.append(self.param[i])
            elif kind == 2:
                maps.append((self.param[i], role, bytes(v.map)))
        return self.launch.with_outputs(tuple(slots), outs, n_inputs, single, at=tuple(at), maps=tuple(maps))


class _TmaSlot:
    """The parameters of one host TMA descriptor as Triton's launcher passes them (``make_tensordesc_arg``): its
    CUtensorMap (128 bytes, 64-byte aligned), then the shape (int32) and the strides (int64); the map encoded by
    ``cuTensorMapEncodeTiled`` with Triton 3.6's arguments (``fillTMADescriptor``: dims and box innermost first,
    the box the kernel's metadata gives, byte strides, element strides 1, no interleave, the kernel's swizzle, L2
    promotion 128 B, NaN fill for a ``padding="nan"`` descriptor)."""

    @classmethod
    def make(cls, meta, ndim: int) -> Optional["_TmaSlot"]:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

        if not (_TMA_TRITON and isinstance(meta, dict) and set(meta) == _TMA_META and 1 <= ndim <= 5):
            return None  # (another Triton's launcher may encode differently: its runner keeps these launches)
        _encode_tiled()  # (resolved here: a driver without it leaves these launches to Triton's runner)
        t = cls()
        t.ndim = ndim
        t.swizzle, t.elem_size = int(meta["swizzle"]), int(meta["elem_size"])
        t.dtype, t.fp4_padded = int(TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]]), bool(meta["fp4_padded"])
        t.block = [int(b) for b in meta["block_size"]]  # (the box Triton encodes: capped, cut to the swizzle)
        if len(t.block) != ndim:
            return None
        t.raw = (ctypes.c_uint8 * 192)()
        t.map = (ctypes.c_uint8 * 128).from_address((ctypes.addressof(t.raw) + 63) // 64 * 64)
        t.shape = [ctypes.c_int32() for _ in range(ndim)]
        t.strides = [ctypes.c_int64() for _ in range(ndim)]
        t.dims, t.gstrides = (ctypes.c_uint64 * 5)(), (ctypes.c_uint64 * 5)()
        t.box, t.estrides = (ctypes.c_uint32 * 5)(), (ctypes.c_uint32 * 5)(1, 1, 1, 1, 1)
        t.last = None
        return t

    @property
    def values(self) -> list:
        return [self.map] + self.shape + self.strides

    def fill(self, desc) -> bool:
        """Encode ``desc`` (a host TensorDescriptor: base tensor, shape, strides, block_shape, padding) unless it
        is the one encoded last; False where the driver refuses it."""
        base = desc.base
        key = (base.data_ptr(), tuple(desc.shape), tuple(desc.strides), tuple(desc.block_shape), desc.padding)
        if key == self.last:
            return True
        shape, strides, block = list(key[1]), key[2], self.block
        if self.fp4_padded:
            shape[-1] *= 2
        r = self.ndim
        if len(shape) != r or len(strides) != r or strides[-1] != 1:
            return False
        for i in range(r):
            self.dims[r - 1 - i] = shape[i]
            self.box[r - 1 - i] = block[i]
        for i in range(r - 1):
            self.gstrides[r - 2 - i] = self.elem_size * strides[i]
        rc = _encode_tiled()(ctypes.addressof(self.map), self.dtype, r, key[0], self.dims, self.gstrides, self.box,
                             self.estrides, 0, self.swizzle, 2, 1 if desc.padding == "nan" else 0)
        if rc:
            self.last = None
            return False
        for c, v in zip(self.shape, shape):
            c.value = v
        for c, v in zip(self.strides, strides):
            c.value = v
        self.last = key
        return True


# The descriptor metadata of Triton 3.6's launcher (``make_tensordesc_arg``), the one ArgsLaunch encodes as: other
# Triton versions keep Triton's runner for kernels with TMA descriptors (3.9 passes another shape for fp4_padded
# maps, and has tf32 and im2col maps)
_TMA_META = {"swizzle", "elem_size", "elem_type", "block_size", "fp4_padded"}
_TMA_TRITON = triton.__version__.split(".")[:2] == ["3", "6"]


@functools.lru_cache(maxsize=1)
def _encode_tiled():
    """``cuTensorMapEncodeTiled`` of libcuda, prototyped."""
    from .cuda_driver import _libcuda

    fn = _libcuda()["cuTensorMapEncodeTiled"]
    fn.restype = ctypes.c_int
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn
