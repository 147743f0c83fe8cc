"""The C fast launch (mxkit.kernels.fast_launch) on the CPU: built into a temporary directory and initialised
with a recording stand-in for cuLaunchKernel, it must write each tensor's data pointer (0 for None) into the
parameter block, pass the grid, block, shared bytes and the getter's stream, and return the driver's code;
BoundLaunch must launch through it with the same block the ctypes path writes. The device runs it for real
(every kernel test launches through it there)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from mxkit.kernels import cuda_driver, fast_launch

_SIG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                        ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        path = fast_launch.build(tmp_path_factory.mktemp("fast_launch"))
    except RuntimeError as e:  # no C compiler or Python headers on this host: the ctypes path is used
        pytest.skip(str(e))
    return path


class Recorder:
    """A cuLaunchKernel stand-in: records each call's scalars and the first n parameter values (read as 64-bit)."""

    def __init__(self, n_read: int, rc: int = 0):
        self.calls, self.n_read, self.rc = [], n_read, rc
        self.fn = _SIG(self._call)

    def _call(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        vals = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(self.n_read)]
        self.calls.append(((f, gx, gy, gz, bx, by, bz, shared, stream, extra), vals))
        return self.rc

    @property
    def address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


def _module(built, rec, streams):
    mod = fast_launch.load(built)
    mod.init(rec.address, lambda dev: streams[dev])
    return mod


def test_launch_writes_pointers_and_passes_the_launch(built):
    rec = Recorder(4)
    mod = _module(built, rec, {0: 0x1234, 3: 0x5678})
    a, b = torch.randn(7), torch.randn(3, 5)
    vals = (ctypes.c_uint64 * 4)(11, 22, 33, 44)
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(vals) + 8 * i for i in range(4)])
    rc = mod.launch(0xABC0, 5, 6, 7, 128, 4096, 3, ctypes.addressof(params), 4, a, None, b)
    assert rc == 0
    (scalars, got), = rec.calls
    assert scalars == (0xABC0, 5, 6, 7, 128, 1, 1, 4096, 0x5678, None)
    assert got == [a.data_ptr(), 0, b.data_ptr(), 44]  # the fourth value left as it was
    assert list(vals) == got
    rec.calls.clear()
    assert mod.launch(0xABC0, 1, 1, 1, 32, 0, 0, ctypes.addressof(params), 4) == 0  # no pointers: the block as is
    assert rec.calls[0][0][8] == 0x1234 and rec.calls[0][1] == got


def test_launch_returns_the_driver_code_and_rejects_bad_arguments(built):
    rec = Recorder(1, rc=700)
    mod = _module(built, rec, {0: 1})
    val = ctypes.c_uint64(0)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(val))
    assert mod.launch(1, 1, 1, 1, 32, 0, 0, ctypes.addressof(params), 1, torch.zeros(1)) == 700
    with pytest.raises(TypeError):
        mod.launch(1, 1, 1)
    with pytest.raises(OverflowError):
        mod.launch(1, 2**32, 1, 1, 32, 0, 0, ctypes.addressof(params), 1)
    with pytest.raises(ValueError):
        mod.launch(1, 1, 1, 1, 32, 0, 0, 0, 1)  # a null parameter block
    with pytest.raises(AttributeError):
        mod.launch(1, 1, 1, 1, 32, 0, 0, ctypes.addressof(params), 1, object())  # not a tensor: no data_ptr()
    with pytest.raises(ValueError, match="2 pointers for 1 parameters"):
        mod.launch(1, 1, 1, 1, 32, 0, 0, ctypes.addressof(params), 1, None, None)
    with pytest.raises(ValueError, match="at most 512"):
        mod.launch(1, 1, 1, 1, 32, 0, 0, ctypes.addressof(params), 513)
    with pytest.raises(KeyError):  # the stream getter's own error passes through
        mod.launch(1, 1, 1, 1, 32, 0, 5, ctypes.addressof(params), 1)
    assert len(rec.calls) == 1


def test_bound_launch_goes_through_the_fast_launch(built, monkeypatch):
    rec = Recorder(4)
    mod = _module(built, rec, {0: 0x99})
    monkeypatch.setattr(cuda_driver, "_fast_module", mod)
    kernel = cuda_driver.Kernel.from_handle(0x4000, "k", torch.device("cuda", 0))
    x, y, w = torch.randn(4), torch.randn(8), torch.randn(2)
    launch = kernel.bind((x, None, w, ctypes.c_longlong(-5)))
    assert launch.n_ptr == 3
    launch.grid, launch.block, launch.shared = (9, 2, 1), 256, 100
    launch.run(y, x)
    (scalars, got), = rec.calls
    assert scalars == (0x4000, 9, 2, 1, 256, 1, 1, 100, 0x99, None)
    assert got == [y.data_ptr(), x.data_ptr(), w.data_ptr(), (-5) % 2**64]
    launch.set_ptr(2, None)
    launch(grid=(3,), block=64)
    assert rec.calls[1][0][1:5] == (3, 1, 1, 64) and rec.calls[1][1] == [y.data_ptr(), x.data_ptr(), 0, (-5) % 2**64]


def test_bound_launch_refuses_more_tensors_than_pointer_slots(built, monkeypatch):
    rec = Recorder(2)
    monkeypatch.setattr(cuda_driver, "_fast_module", _module(built, rec, {0: 0}))
    launch = cuda_driver.Kernel.from_handle(1, "k", torch.device("cuda", 0)).bind((torch.zeros(1), ctypes.c_int(3)))
    with pytest.raises(ValueError, match="2 tensors for 1 leading pointer parameters"):
        launch.run(torch.zeros(2), torch.zeros(2))
    monkeypatch.setattr(cuda_driver, "_fast_module", None)  # the ctypes path refuses the same way
    with pytest.raises(ValueError, match="2 tensors"):
        launch.run(torch.zeros(2), torch.zeros(2))
    assert not rec.calls


def test_bound_launch_raises_the_driver_error(built, monkeypatch):
    rec = Recorder(1, rc=700)  # CUDA_ERROR_ILLEGAL_ADDRESS
    monkeypatch.setattr(cuda_driver, "_fast_module", _module(built, rec, {0: 0}))
    monkeypatch.setattr(cuda_driver, "_check", lambda rc, what: (_ for _ in ()).throw(RuntimeError(f"{what}: {rc}")))
    launch = cuda_driver.Kernel.from_handle(1, "k", torch.device("cuda", 0)).bind((torch.zeros(1),))
    with pytest.raises(RuntimeError, match="launching k: 700"):
        launch.run(torch.zeros(2))


def test_bound_launch_binds_the_context_and_launches_again(built, monkeypatch):
    """CUDA_ERROR_INVALID_CONTEXT (a thread without a current context: autograd's backward worker) from the fast
    launch: the device's primary context is bound to the thread and the launch made again, once."""
    rec = Recorder(1)
    rcs = [201, 0]
    rec.fn = _SIG(lambda *a: (rec._call(*a), rcs.pop(0))[1])
    monkeypatch.setattr(cuda_driver, "_fast_module", _module(built, rec, {2: 7}))
    launch = cuda_driver.Kernel.from_handle(1, "k", torch.device("cuda", 2)).bind((torch.zeros(1),))
    other = torch.zeros(5)
    bound = []

    def bind(index):  # another thread rewrites the shared block while this one binds its context
        bound.append(index)
        launch.set_ptr(0, other)

    monkeypatch.setattr(cuda_driver, "bind_primary_context", bind)
    x = torch.zeros(3)
    launch.run(x)
    assert bound == [2] and not rcs and [c[1] for c in rec.calls] == [[x.data_ptr()]] * 2


def test_module_is_off_with_the_environment_switch(monkeypatch):
    monkeypatch.setenv("MXKIT_FAST_LAUNCH", "0")
    fast_launch.module.cache_clear()
    try:
        assert fast_launch.module() is None
    finally:
        fast_launch.module.cache_clear()


def test_build_reuses_the_cached_module(built):
    assert fast_launch.build(built.parent) == built


def test_a_launch_of_more_parameters_than_the_module_takes_goes_through_ctypes(built, monkeypatch):
    """The C module's parameter limit is the one BoundLaunch routes by: a kernel with more parameters launches
    through ctypes, the same block."""
    assert f"#define MAX_PARAMS {fast_launch.MAX_PARAMS} " in fast_launch._SRC.read_text()
    rec = Recorder(1)
    monkeypatch.setattr(cuda_driver, "_fast_module", _module(built, rec, {0: 0}))
    monkeypatch.setattr(cuda_driver, "_FAST_MAX_PARAMS", 3)
    calls = []
    launch = cuda_driver.Kernel.from_handle(1, "k", torch.device("cuda", 0)).bind(
        (torch.zeros(1), *[ctypes.c_int(i) for i in range(3)]))
    monkeypatch.setattr(launch, "_launch_ctypes", lambda *shape: calls.append([v.value for v in launch.vals[:1]]))
    x = torch.zeros(2)
    launch.run(x)
    assert calls == [[x.data_ptr()]] and not rec.calls
