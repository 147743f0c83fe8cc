"""The C++ fast call (mxkit.kernels.fast_call) on the CPU: built into a temporary directory and initialised with a
recording stand-in for cuLaunchKernel, a Plan must allocate its outputs (shape, dtype, zero fill), write each
input's and output's data pointer (0 for None) into its own copy of the parameter block and leave the shared block
alone, pass the grid, block, shared bytes and the getter's stream, bind the context and launch again on
CUDA_ERROR_INVALID_CONTEXT, and raise through the error check on any other code. Its CPU outputs (device -1) stand
in for the CUDA ones the device runs (every quantize / dequantize / decode GEMM GPU test goes through it there)."""

from __future__ import annotations

import contextlib
import ctypes

import pytest
import torch

from mxkit.kernels import cuda_driver, fast_call, fast_launch

from .test_fast_launch import _SIG  # (cuLaunchKernel's signature, for the recording stand-in)
from .test_mma_a8w8 import in_launch


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        path = fast_call.build(tmp_path_factory.mktemp("fast_call"))
    except RuntimeError as e:  # no C++ compiler or headers on this host: the Python path is used
        pytest.skip(str(e))
    return path


class Recorder:
    """A cuLaunchKernel stand-in: records each call's scalars and its first n parameter values (64-bit), returns
    the codes of ``rcs`` in turn (then 0)."""

    def __init__(self, n_read: int, rcs=()):
        self.calls, self.n_read, self.rcs = [], n_read, list(rcs)
        self.fn = _SIG(self._call)

    def _call(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        vals = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(self.n_read)]
        self.calls.append(((f, gx, gy, gz, bx, by, bz, shared, stream, extra), vals))
        return self.rcs.pop(0) if self.rcs else 0

    @property
    def address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


def _module(built, rec, streams, bound=None, errors=None):
    mod = fast_launch.load(built, "_mxkit_fast_call")

    def check(rc, what):
        if errors is not None:
            errors.append((rc, what))
        raise RuntimeError(f"{what}: CUresult {rc}")

    mod.init(rec.address, lambda dev: streams[dev], bound.append if bound is not None else (lambda dev: None), check)
    return mod


def _block(values):
    vals = (ctypes.c_uint64 * len(values))(*values)
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(vals) + 8 * i for i in range(len(values))])
    return vals, params


def test_plan_allocates_writes_pointers_and_launches(built):
    rec = Recorder(5)
    mod = _module(built, rec, {-1: 0x5678})
    vals, params = _block([11, 22, 33, 44, 55])
    outs = (((3, 4), torch.uint8, False), ((2,), torch.float32, True), ((), torch.bfloat16, False))
    plan = mod.Plan(0xABC0, (5, 6, 7), 128, 4096, -1, ctypes.addressof(params), 5, (1, -1, 0, -3), outs, 2,
                    False, params, "k")
    a, b = torch.randn(7), torch.randn(3)
    got = plan(b, a)
    assert isinstance(got, tuple) and len(got) == 3
    assert [(t.shape, t.dtype) for t in got] == [((3, 4), torch.uint8), ((2,), torch.float32), ((), torch.bfloat16)]
    assert torch.equal(got[1], torch.zeros(2))
    (scalars, ptrs), = rec.calls
    assert scalars == (0xABC0, 5, 6, 7, 128, 1, 1, 4096, 0x5678, None)
    assert ptrs == [a.data_ptr(), got[0].data_ptr(), b.data_ptr(), got[2].data_ptr(), 55]  # the fifth as it stood
    assert list(vals) == [11, 22, 33, 44, 55]  # the shared block untouched
    one = mod.Plan(1, (1, 1, 1), 32, 0, -1, ctypes.addressof(params), 5, (-1, 0), (((8,), torch.int32, False),), 1,
                   True, params, "k1")
    y = one(None)
    assert isinstance(y, torch.Tensor) and y.shape == (8,) and y.dtype == torch.int32
    assert rec.calls[-1][1][:2] == [y.data_ptr(), 0]
    assert "k1" in repr(one)


def test_plan_allocates_without_the_dispatcher_as_at_empty_would(built):
    """With fast_alloc on (the default) a Plan's outputs after the first come from at::detail::empty_generic with
    the allocator at::empty used: tensors like at::empty's (shape, dtype, device, contiguous, their own storage of
    the right size, writable, the same allocator's memory); under torch.use_deterministic_algorithms with
    fill_uninitialized_memory the at::empty path fills them (NaN for floats) as PyTorch does."""
    rec = Recorder(2)
    mod = _module(built, rec, {-1: 0})
    vals, params = _block([0, 0])
    outs = (((5, 7), torch.float32, False), ((3,), torch.uint8, False))
    plan = mod.Plan(1, (1, 1, 1), 32, 0, -1, ctypes.addressof(params), 2, (-1, -2), outs, 0, False, params, "k")
    assert mod.fast_alloc() is True
    made = {}
    for flag in (True, False):
        prev = mod.fast_alloc(flag)
        try:
            a, b = plan()
            n0 = mod.fast_alloc_count()
            a2, b2 = plan()
            assert mod.fast_alloc_count() - n0 == (2 if flag else 0)  # (the first call may have learned the allocator)
        finally:
            mod.fast_alloc(prev)
        made[flag] = (a2, b2)
        for t, (shape, dtype, _) in zip((a, b, a2, b2), outs * 2):
            assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0
            assert not t.requires_grad and t.grad_fn is None
        assert len({t.data_ptr() for t in (a, b, a2, b2)}) == 4
        a2.fill_(1.5)
        assert torch.equal(a2 * 2, torch.full((5, 7), 3.0)) and torch.equal(b2.zero_(), torch.zeros(3, dtype=torch.uint8))
    fast, slow = made[True][0], made[False][0]
    assert type(fast) is type(slow) and fast._version == slow._version == 1  # (a version counter, as at::empty's)
    with torch.inference_mode():
        got, _ = plan()
        assert got.is_inference()
    det, fill = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        n0 = mod.fast_alloc_count()
        a, b = plan()
        assert torch.isnan(a).all() and mod.fast_alloc_count() == n0, "deterministic fill: at::empty makes them"
    finally:
        torch.use_deterministic_algorithms(det)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    with pytest.raises(TypeError, match="fast_alloc"):
        mod.fast_alloc(True, False)


class _Box:
    """A plain class object.__new__ makes, with a __dict__: what Plan.wrapping builds besides MXTensor."""


def test_plan_groups_outputs_into_one_allocation(built):
    """``wrapping(wraps, group=True)``: an object's outputs live in its lowest-numbered output's allocation, each
    after the ones before it at a multiple of 256 bytes (one allocation an object; a cast-transpose's four outputs
    take two); each is a tensor of its own (shape, dtype, contiguous, writable without touching the others, its own
    version counter), and the launch gets each one's own address. Made one by one while fast_alloc is off
    (at::empty's path); an output named twice or a zero-filled one is refused."""
    rec = Recorder(4)
    mod = _module(built, rec, {-1: 0})
    vals, params = _block([0, 0, 0, 0])
    addr = ctypes.addressof(params)
    outs = (((5, 7), torch.float32, False), ((3,), torch.uint8, False), ((2, 3), torch.int32, False),
            ((9,), torch.uint8, False))
    base_plan = mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 4, (-1, -2, -3, -4), outs, 0, False, params, "k")
    plan = base_plan.wrapping(((_Box, {}, (("d", 3), ("a", 0), ("b", 1))), (_Box, {}, (("c", 2),))), True)
    plan()  # (the first call may learn the allocator)
    n0 = mod.fast_alloc_count()
    one, two = plan()
    a, b, c, d = got = one.a, one.b, two.c, one.d
    assert mod.fast_alloc_count() - n0 == 4  # (outputs made without the dispatcher, grouped or not)
    for t, (shape, dtype, _) in zip(got, outs):
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    base = a.data_ptr()
    assert a.untyped_storage().data_ptr() == base and a.storage_offset() == 0
    assert (b.data_ptr() - base, d.data_ptr() - base) == (256, 512)  # (140 bytes, then 3, then 9)
    assert b.untyped_storage().data_ptr() == d.untyped_storage().data_ptr() == base
    assert a.untyped_storage().nbytes() == 512 + 9
    assert c.untyped_storage().nbytes() == 24 and c.untyped_storage().data_ptr() != base
    assert rec.calls[-1][1] == [a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr()]
    a.fill_(2.0), b.fill_(7), c.fill_(-1), d.fill_(9)
    assert torch.equal(a, torch.full((5, 7), 2.0)) and torch.equal(b, torch.full((3,), 7, dtype=torch.uint8))
    assert torch.equal(d, torch.full((9,), 9, dtype=torch.uint8)) and torch.equal(c, torch.full((2, 3), -1,
                                                                                               dtype=torch.int32))
    assert (a._version, b._version, d._version) == (1, 1, 1)
    del a, c, d, one, two, got
    assert torch.equal(b + 0, torch.full((3,), 7, dtype=torch.uint8))  # (the storage lives while any output does)
    prev = mod.fast_alloc(False)
    try:
        one, two = plan()
    finally:
        mod.fast_alloc(prev)
    got = one.a, one.b, two.c, one.d
    assert [t.untyped_storage().nbytes() for t in got] == [140, 3, 24, 9]
    assert all(t.storage_offset() == 0 for t in got)
    assert [t.untyped_storage().nbytes() for t in base_plan()] == [140, 3, 24, 9]  # (the Plan wrapped: apart)
    with pytest.raises(ValueError, match="named twice"):
        base_plan.wrapping(((_Box, {}, (("a", 0), ("b", 1))), (_Box, {}, (("c", 1),))), True)
    for zeros in ((True, False), (False, True)):
        zplan = mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 4, (-1,), (((4,), torch.uint8, zeros[0]),
                         ((4,), torch.uint8, zeros[1])), 0, False, params, "zero")
        with pytest.raises(ValueError, match="zero-filled"):
            zplan.wrapping(((_Box, {}, (("a", 0), ("b", 1))),), True)


def test_plan_wrapping_returns_mxtensors_made_of_its_outputs(built):
    """``plan.wrapping(wraps)`` is the same launch returning objects made of its outputs: MXTensors with the fields of
    ``MXTensor._trusted_maker`` (the hot quantize / cast-transpose runners' construction), the named outputs set;
    one object alone, several as a tuple; the field dict copied at each call (objects do not share it); the
    original Plan unchanged. With ``group`` each object's outputs share one allocation (the scale 256-byte aligned
    after the elements), the objects apart. A class object.__new__ cannot make, an output out of range, or a
    malformed wrap is refused; with ``group``, an output named twice or a zero-filled one."""
    import dataclasses

    from mxkit.formats import Rounding, ScaleMode, get_format
    from mxkit.tensor import MXTensor

    rec = Recorder(4)
    mod = _module(built, rec, {-1: 0})
    vals, params = _block([0, 0, 0, 0])
    addr = ctypes.addressof(params)
    outs = (((64, 32), torch.uint8, False), ((64, 1), torch.uint8, False), ((32, 64), torch.uint8, False),
            ((32, 2), torch.uint8, False))
    plan = mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 4, (-1, -2, -3, -4), outs, 1, False, params, "ct")
    f = get_format("mxfp8_e4m3")
    shape = torch.Size((64, 32))
    make_r = MXTensor._trusted_maker(f, 1, 32, shape, ScaleMode.FLOOR, Rounding.RNE, "plain")
    make_c = MXTensor._trusted_maker(f, 0, 32, shape, ScaleMode.FLOOR, Rounding.RNE, "plain")
    pair = plan.wrapping((make_r.wrap(0, 1), make_c.wrap(2, 3)))
    x = torch.randn(64, 32)
    rows, cols = got = pair(x)
    assert rec.calls[-1][1] == [rows.qdata.data_ptr(), rows.scale.data_ptr(), cols.qdata.data_ptr(),
                                cols.scale.data_ptr()]
    for t, want in zip(got, (make_r(rows.qdata, rows.scale), make_c(cols.qdata, cols.scale))):
        assert type(t) is MXTensor and t.__dict__ is not want.__dict__
        for fld in dataclasses.fields(MXTensor):
            assert getattr(t, fld.name) is getattr(want, fld.name), fld.name
        with pytest.raises(dataclasses.FrozenInstanceError):
            t.axis = 3
    assert rows.__dict__ is not cols.__dict__ and rows.shape == cols.shape == shape and (rows.axis, cols.axis) == (1, 0)
    rows.qdata.fill_(0x38), rows.scale.fill_(127)  # 1.0 in E4M3, scale 2^0
    assert torch.equal(_dequantize_ref(rows), torch.ones(64, 32))
    assert rows.qdata.untyped_storage().data_ptr() != rows.scale.untyped_storage().data_ptr()  # (not grouped)
    one = plan.wrapping((make_c.wrap(2, 3),))(x)
    assert type(one) is MXTensor and one.axis == 0 and one.qdata.shape == (32, 64)
    plain = plan(x)
    assert isinstance(plain, tuple) and len(plain) == 4  # (the Plan wrapped is unchanged: four allocations)
    assert len({t.untyped_storage().data_ptr() for t in plain}) == 4
    assert "ct" in repr(pair)
    # group: each object's outputs in one allocation, the scale 256 bytes past its 2048 element bytes
    grouped = plan.wrapping((make_r.wrap(0, 1), make_c.wrap(2, 3)), True)
    for _ in range(2):  # (the first call may learn the allocator)
        r, c = grouped(x)
    for t in (r, c):
        assert t.scale.untyped_storage().data_ptr() == t.qdata.data_ptr()
        assert t.scale.data_ptr() - t.qdata.data_ptr() == 2048 and t.scale.storage_offset() == 2048
    assert r.qdata.untyped_storage().data_ptr() != c.qdata.untyped_storage().data_ptr()
    assert rec.calls[-1][1] == [r.qdata.data_ptr(), r.scale.data_ptr(), c.qdata.data_ptr(), c.scale.data_ptr()]
    for t, want in ((r, make_r), (c, make_c)):
        for fld in dataclasses.fields(MXTensor):
            if fld.name not in ("qdata", "scale"):
                assert getattr(t, fld.name) is getattr(want(r.qdata, r.scale), fld.name), fld.name
    with pytest.raises(ValueError, match="named twice"):
        plan.wrapping((make_r.wrap(0, 1), make_c.wrap(1, 3)), True)
    zeros = mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 4, (-1, -2), (((4,), torch.uint8, False),
                     ((4,), torch.uint8, True)), 1, False, params, "z")
    with pytest.raises(ValueError, match="zero-filled"):
        zeros.wrapping((make_r.wrap(0, 1),), True)
    with pytest.raises(TypeError, match="object.__new__"):
        plan.wrapping(((int, {}, ()),))
    with pytest.raises(ValueError, match="outputs"):
        plan.wrapping((make_r.wrap(0, 4),))
    for bad in ((), (make_r.wrap(0, 1)[:2],), [make_r.wrap(0, 1)], ((MXTensor, [], ()),)):
        with pytest.raises(TypeError, match="wrapping"):
            plan.wrapping(bad)


@pytest.mark.parametrize("shape,layout,grouped", [((64, 64), "plain", True), ((64, 64), "nvidia_128x4", False),
                                                   ((256, 512), "nvidia_128x4", True)])
def test_hot_cast_transpose_runner_groups_only_unpadded_copies(built, shape, layout, grouped):
    """The hot cast-transpose runner (kernels.quantize._hot_runner) over a recording Plan with its plan's outputs:
    each copy's elements and scale in one allocation where neither is zero-filled (a swizzled scale padded to its
    128 x 4 tiles is, and wrapping refused to group it: every call from the third raised), apart otherwise; the two
    MXTensors of the axes asked for, in order, every call."""
    from mxkit.kernels import quantize as kq

    rec = Recorder(5)
    mod = _module(built, rec, {-1: 0})
    fmt, axes = "mxfp8_e4m3", (1, 0)
    _, margs = kq._checked(shape, torch.bfloat16, fmt, axes, 32, kq.ScaleMode.FLOOR, kq.Rounding.RNE, layout)
    plan = kq._quantize_plan(shape, torch.bfloat16, fmt, None, "floor", "rne", layout, None, "")
    assert any(z for _, z in plan.outs) != grouped  # (the case as meant: padded scales zero-filled)
    vals, params = _block([0] * 5)
    n = len(plan.outs)
    fast = mod.Plan(1, (1, 1, 1), 32, 0, -1, ctypes.addressof(params), 5, tuple(range(-1, -1 - n, -1)),
                    tuple((tuple(sh), torch.uint8, z) for sh, z in plan.outs), 1, False, params, "ct")
    x = torch.randn(shape).to(torch.bfloat16)
    run = kq._hot_runner(margs, plan, torch.Size(shape), 32, layout, -1)
    plan.fast[(-1, x.data_ptr() % 16 == 0, True)] = fast
    try:
        for call in range(4):
            rows, cols = run(x)
            assert (rows.axis, cols.axis) == (1, 0) and rows.scale_layout == cols.scale_layout == layout
            for t in (rows, cols):
                same = t.scale.untyped_storage().data_ptr() == t.qdata.untyped_storage().data_ptr()
                # (the module's first call may learn the allocator: that one comes back apart)
                assert same == grouped or (call == 0 and not same), (shape, layout, call)
            assert rows.qdata.untyped_storage().data_ptr() != cols.qdata.untyped_storage().data_ptr()
            assert rec.calls[-1][1][:4] == [rows.qdata.data_ptr(), rows.scale.data_ptr(), cols.qdata.data_ptr(),
                                            cols.scale.data_ptr()]
    finally:
        plan.fast.clear()


def _dequantize_ref(q):
    from mxkit.reference import dequantize_reference

    return dequantize_reference(q, torch.float32)


@pytest.mark.parametrize("grid", [(0, 1, 1), (3, 0, 1), (1, 1, 0)])
def test_plan_of_an_empty_grid_returns_its_outputs_and_launches_nothing(built, grid):
    """A grid with a 0 (an empty problem's) is not launched (cuLaunchKernel refuses it): the call still makes and
    returns the outputs, as BoundLaunch.launch does nothing for such a grid."""
    rec = Recorder(1)
    mod = _module(built, rec, {-1: 0})
    vals, params = _block([0])
    plan = mod.Plan(1, grid, 32, 0, -1, ctypes.addressof(params), 1, (-1,), (((0, 4), torch.uint8, False),), 0, True,
                    params, "empty")
    y = plan()
    assert y.shape == (0, 4) and y.dtype == torch.uint8 and not rec.calls


def test_plan_rejects_bad_arguments(built):
    rec = Recorder(1)
    mod = _module(built, rec, {-1: 0})
    vals, params = _block([0, 0])
    addr = ctypes.addressof(params)
    plan = mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (0, -1), (((4,), torch.uint8, False),), 1, False, params, "k")
    with pytest.raises(TypeError, match="takes 1 tensors"):
        plan()
    with pytest.raises(TypeError, match="not a tensor"):
        plan(3)
    with pytest.raises(ValueError, match="no such input"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (1, -1), (((4,), torch.uint8, False),), 1, False, params, "k")
    with pytest.raises(ValueError, match="no such input"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (0, -2), (((4,), torch.uint8, False),), 1, False, params, "k")
    with pytest.raises(ValueError, match="pointer slots"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (0, -1, -1), (((4,), torch.uint8, False),), 1, False, params, "k")
    with pytest.raises(ValueError, match="negative size"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (0,), (((-4,), torch.uint8, False),), 1, False, params, "k")
    with pytest.raises(TypeError):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 2, (0,), (((4,), "uint8", False),), 1, False, params, "k")
    with pytest.raises(ValueError, match="null parameter block"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, 0, 2, (0,), (), 1, False, params, "k")
    with pytest.raises(ValueError, match="at most 512"):
        mod.Plan(1, (1, 1, 1), 32, 0, -1, addr, 513, (0,), (), 1, False, params, "k")
    bare = mod.Plan.__new__(mod.Plan)
    assert "not initialised" in repr(bare)
    with pytest.raises(RuntimeError, match="not initialised"):
        bare()
    with pytest.raises(TypeError, match="initialised once"):  # a live Plan's fields never change
        plan.__init__(2, (1, 1, 1), 32, 0, -1, addr, 2, (0,), (), 1, False, params, "other")
    with pytest.raises(ValueError, match="no such input"):  # a failed init leaves the Plan uninitialised...
        bare.__init__(1, (1, 1, 1), 32, 0, -1, addr, 2, (5,), (), 1, False, params, "k")
    assert "not initialised" in repr(bare)
    bare.__init__(1, (1, 1, 1), 32, 0, -1, addr, 2, (0,), (), 1, False, params, "k2")  # ...and initialisable
    assert "k2" in repr(bare)
    with pytest.raises(KeyError):  # the stream getter's own error passes through; nothing launched
        mod.Plan(1, (1, 1, 1), 32, 0, 3, addr, 2, (0,), (), 1, False, params, "k")(None)
    assert not rec.calls


_REPLACE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def test_plan_re_addresses_descriptors_and_writes_slots_at_their_parameters(built):
    """``at`` puts pointer slots at any parameters; each descriptor of ``maps`` is copied from the plan's bytes into
    a 64-byte aligned buffer of the call, re-addressed to its input (cuTensorMapReplaceAddress; here a stand-in
    writing the address into the first 8 bytes) and passed in place of the block's parameter; the template and the
    shared block stay as they were; a refused re-addressing raises and launches nothing."""
    seen, rcs = [], []

    def replace(tmap, addr):
        seen.append((tmap % 64, bytes(ctypes.string_at(tmap, 128))))
        ctypes.c_uint64.from_address(tmap).value = addr
        return rcs.pop(0) if rcs else 0

    fn = _REPLACE(replace)
    rec = Recorder(6)
    mod = _module(built, rec, {-1: 0})
    mod.init_maps(ctypes.cast(fn, ctypes.c_void_p).value)
    vals, params = _block([11, 22, 33, 44, 55, 66])
    tmpl_a, tmpl_b = bytes(range(128)), bytes(range(128, 256))
    maps = ((0, 0, tmpl_a), (4, 2, tmpl_b))  # (parameter, input, bytes)
    plan = mod.Plan(7, (1, 1, 1), 32, 0, -1, ctypes.addressof(params), 6, (-1, 1, -1), (((3,), torch.int16, False),),
                    3, True, params, "k", (2, 3, 5), maps)
    x, w, s = torch.randn(4), torch.randn(8), torch.randn(2)
    y = plan(x, w, s)
    (_, got), = rec.calls
    assert got == [x.data_ptr(), 22, y.data_ptr(), w.data_ptr(), s.data_ptr(), y.data_ptr()]
    assert [(a, b[8:]) for a, b in seen] == [(0, tmpl_a[8:]), (0, tmpl_b[8:])]  # aligned copies of the templates
    assert seen[0][1][:8] == tmpl_a[:8]
    assert list(vals) == [11, 22, 33, 44, 55, 66]
    x2 = torch.randn(4)
    plan(x2, w, s)
    assert rec.calls[-1][1][0] == x2.data_ptr() and seen[2][1] == tmpl_a  # (from the template again, each call)
    rcs.append(1)
    n = len(rec.calls)
    with pytest.raises(RuntimeError, match="re-addressing descriptor 0: CUresult 1"):
        plan(x, w, s)
    with pytest.raises(RuntimeError, match="input is None"):
        plan(None, w, s)
    assert len(rec.calls) == n
    addr = ctypes.addressof(params)
    one = (((3,), torch.int16, False),)
    bad = [((0,), (0, 1), (), "at: 2 parameter indices for 1"), ((0,), (6,), (), "names parameter 6 of 6"),
           ((0, -1), (1, 1), (), "parameter 1 is written twice"), ((0,), (1,), ((1, 0, tmpl_a),), "descriptor 0"),
           ((0,), (1,), ((2, 3, tmpl_a),), "input 3 of 3"), ((0,), (1,), ((2, 0, tmpl_a[:64]),), "64 bytes"),
           ((0,), (1,), ((2, 0, tmpl_a),) * 5, "at most 4")]
    for slots, at, mp, msg in bad:
        with pytest.raises(ValueError, match=msg):
            mod.Plan(7, (1, 1, 1), 32, 0, -1, addr, 6, slots, one, 3, True, params, "k", at, mp)


def test_plan_binds_the_context_then_raises_driver_errors(built):
    vals, params = _block([0])
    bound, errors = [], []
    rec = Recorder(1, rcs=[201, 0])  # CUDA_ERROR_INVALID_CONTEXT once: bind, launch again
    mod = _module(built, rec, {-1: 0}, bound, errors)
    plan = mod.Plan(1, (1, 1, 1), 32, 0, -1, ctypes.addressof(params), 1, (-1,), (((4,), torch.uint8, False),), 0,
                    True, params, "kern")
    y = plan()
    assert bound == [-1] and len(rec.calls) == 2 and rec.calls[1][1] == [y.data_ptr()]
    rec.rcs = [700]
    with pytest.raises(RuntimeError, match="kern: CUresult 700"):
        plan()
    assert errors == [(700, "kern")]


def test_bound_launch_with_outputs(built, monkeypatch):
    rec = Recorder(4)
    mod = _module(built, rec, {-1: 0x99})
    monkeypatch.setattr(cuda_driver, "_fast_call_state", [mod, True])
    kernel = cuda_driver.Kernel.from_handle(0x4000, "k", torch.device("cuda", 0))
    kernel.index = -1  # (CPU outputs: this host has no GPU)
    x = torch.randn(4)
    launch = kernel.bind((x, None, None, ctypes.c_longlong(-5)))
    launch.grid, launch.block, launch.shared = (9, 2), 256, 100
    with pytest.raises(ValueError, match="4 pointer slots for 3"):
        launch.with_outputs((0, -1, -1, -1), [((2,), torch.uint8, False)], 1)
    call = launch.with_outputs((0, -2, -1), [((2, 3), torch.uint8, False), ((5,), torch.float16, False)], 1)
    q, s = call(x)
    (scalars, got), = rec.calls
    assert scalars == (0x4000, 9, 2, 1, 256, 1, 1, 100, 0x99, None)
    assert got == [x.data_ptr(), s.data_ptr(), q.data_ptr(), (-5) % 2**64]
    # past the C++ limits (here 9 dims: a quantize of a 9-D tensor), and without the module: the Python path
    assert launch.with_outputs((0, -1), [((1,) * (fast_call.MAX_DIMS + 1), torch.uint8, False)], 1) is None
    assert launch.with_outputs((0,), [((1,), torch.uint8, False)] * (fast_call.MAX_OUTS + 1), 1) is None
    assert launch.with_outputs((0,), [], fast_call.MAX_SLOTS + 1) is None
    assert cuda_driver.fast_call_loaded()
    monkeypatch.setattr(cuda_driver, "_fast_call_state", [None, True])
    assert launch.with_outputs((0,), [], 1) is None and not cuda_driver.fast_call_loaded()
    assert launch.ld is None  # (the leading dimensions a launch was bound with: its maker records them)


def test_module_is_off_with_the_environment_switch(monkeypatch):
    monkeypatch.setenv("MXKIT_FAST_CALL", "0")
    monkeypatch.setattr(fast_call, "_state", {"module": None, "thread": None})
    monkeypatch.setattr(fast_call, "_ready", fast_call.threading.Event())
    assert fast_call.module(wait=True) is None and fast_call._state["thread"] is False


def test_python_limits_are_the_modules():
    src = fast_call._SRC.read_text()
    for name, value in (("kMaxSlots", fast_call.MAX_SLOTS), ("kMaxOuts", fast_call.MAX_OUTS),
                        ("kMaxDims", fast_call.MAX_DIMS), ("kMaxMaps", fast_call.MAX_MAPS)):
        assert f"constexpr int {name} = {value};" in src, name


def test_build_reuses_the_cached_module(built):
    assert fast_call.build(built.parent) == built


def test_mm_t_is_torch_mm_bytes_without_autograd(built):
    """mm_t(a, w): the backend's mm kernel called directly (here the CPU's, on CUDA cuBLAS's): torch.mm(a, w.t())'s
    bytes for float32 / bf16, strided a and w, a new contiguous y made like a Plan's outputs (the fast allocator
    learned from the first) and no autograd record; bad operands raise."""
    from mxkit.kernels import matmul_calls as kc

    mod = fast_launch.load(built, "_mxkit_fast_call")
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for dtype in (torch.float32, torch.bfloat16):
        for a, w in ((torch.randn(7, 96, generator=g), torch.randn(5, 96, generator=g)),
                     (torch.randn(96, 7, generator=g).t(), torch.randn(5, 192, generator=g)[:, ::2]),
                     (torch.randn(1, 32, generator=g), torch.randn(33, 32, generator=g))):
            a, w = a.to(dtype), w.to(dtype)
            y = mod.mm_t(a, w)
            want = torch.mm(a, w.t())
            assert y.shape == want.shape and y.dtype == dtype and y.is_contiguous()
            assert torch.equal(y.view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))
            assert torch.equal(kc._mm_t_twin(a, w), want)
    before = mod.fast_alloc_count()
    a = torch.randn(4, 64, requires_grad=True)
    y = mod.mm_t(a, torch.randn(3, 64))
    assert not y.requires_grad and y.grad_fn is None and mod.fast_alloc_count() == before + 1
    for bad in ((torch.randn(4, 64), torch.randn(3, 32)), (torch.randn(4, 64), torch.randn(3, 64).double()),
                (torch.randn(2, 4, 64), torch.randn(3, 64))):
        with pytest.raises(ValueError, match="mm_t"):
            mod.mm_t(*bad)
    with pytest.raises(TypeError, match="mm_t"):
        mod.mm_t(torch.randn(4, 64))


@pytest.mark.parametrize("kind", ["decode-mma", "a8w8 in-kernel", "w8a16-mma"])
def test_prepared_calls_expect_the_ld_their_launch_publishes(kind):
    """A prepared decode call makes its fast call only from a launch bound at its own row stride and bias dtype:
    ``_ld(ldx, bias)`` must be what its run's ``into`` publishes as ``launch.ld`` (MmaDecode: (ldx, bias flag);
    A8W8: (ldx, 0, bias flag)), else the fast call is never made (the bug the GPU test caught for w8a16-mma and
    a8w8 in-kernel)."""
    from mxkit.kernels.matmul_details import _mma_calls as mc
    from mxkit.kernels.matmul_details._mma_a8w8 import A8W8
    from mxkit.kernels.matmul_details._mma_decode import MmaDecode

    class Launch:
        def run(self, *args):
            pass

    class Kernel:
        def bind(self, args):
            return Launch()

    cls, run_cls = {"decode-mma": (mc.MmaCall, MmaDecode), "a8w8 in-kernel": (mc.A8W8InCall, A8W8),
                    "w8a16-mma": (mc.W16Call, A8W8)}[kind]
    run = object.__new__(run_cls)
    run.kernel, run.launch, run.grid = Kernel(), None, (1, 1, 1)
    run.q = run.s = run.w = run.sw = run.ws = run.cnt = None
    run.M, run.N, run.K, run.block, run.shared = 2, 32, 64, 128, 0
    call = object.__new__(cls)
    call.run = run
    x, y = torch.zeros(2, 72, dtype=torch.bfloat16), torch.zeros(2, 32, dtype=torch.bfloat16)
    for bias in (None, torch.zeros(32), torch.zeros(32, dtype=torch.bfloat16)):
        call._into(x, 72, bias, y)
        assert run.launch.ld == call._ld(72, bias) and run.launch.ld != call._ld(64, bias)
    assert call._ld(72, torch.zeros(32)) != call._ld(72, torch.zeros(32, dtype=torch.bfloat16))


def test_kernel_bias_is_float32_or_bf16_as_it_is():
    """The CUDA C++ GEMMs read a contiguous float32 or bf16 bias as it is (flag 1 for bf16: no conversion launch);
    another dtype or a strided bias is converted to float32 first; the flag refuses other dtypes."""
    from mxkit.kernels.matmul_details._mma_calls import kernel_bias
    from mxkit.kernels.matmul_details._mma_decode import bias_flag

    f32, b16 = torch.randn(8), torch.randn(8).to(torch.bfloat16)
    assert kernel_bias(None) is None and kernel_bias(f32) is f32 and kernel_bias(b16) is b16
    for other in (b16.to(torch.float16), torch.randn(16).to(torch.bfloat16)[::2]):
        got = kernel_bias(other)
        assert got.dtype == torch.float32 and got.is_contiguous() and torch.equal(got, other.float())
    assert (bias_flag(None), bias_flag(f32), bias_flag(b16)) == (0, 0, 1)
    with pytest.raises(ValueError, match="float32 or bf16 bias"):
        bias_flag(b16.half())


# --- on the GPU: the hot paths through the fast call, byte for byte against the Python path and the reference ---

def _python_path(monkeypatch):
    """Every later call takes the Python path (torch.empty, then the C fast launch): no fast call module."""
    monkeypatch.setattr(cuda_driver, "_fast_call_state", [None, True])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp6_e3m2", "mxfp8_e4m3", "mxint8"])
def test_gpu_quantize_dequantize_cast_transpose_through_the_fast_call(fmt, rng, poison, monkeypatch):
    """Repeated calls of a problem go through its plan's fast call (checked: the plans hold one) and give the
    reference's bytes for fresh data, specials included; the Python path gives the same bytes."""
    from conftest import DEV, assert_dequant_equal, assert_mx_equal, rand_tensor

    import mxkit
    from mxkit.kernels import quantize as kq
    from mxkit.reference import dequantize_reference, quantize_reference

    assert fast_call.module(wait=True) is not None, "the C++ fast call did not build on the device"
    shape = (96, 256)
    got = {}
    for path in ("fast", "python"):
        if path == "python":
            _python_path(monkeypatch)
        kq._HOT.clear()
        kq._quantize_plan.cache_clear()
        kq._dequantize_plan.cache_clear()
        for call in range(3):
            x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
            xd = x.to(DEV)
            q = mxkit.quantize(xd, fmt)
            ref = quantize_reference(x, fmt)
            assert_mx_equal(q, ref, what=f"{path} {fmt} quantize call {call}")
            d = mxkit.dequantize(q, torch.bfloat16)
            assert_dequant_equal(d, dequantize_reference(ref, torch.bfloat16), what=f"{path} dequantize {call}")
            rows, cols = mxkit.cast_transpose(xd, fmt)
            assert_mx_equal(rows, quantize_reference(x, fmt, axis=1), what=f"{path} {fmt} rows {call}")
            assert_mx_equal(cols, quantize_reference(x, fmt, axis=0), what=f"{path} {fmt} cols {call}")
        fast_plans = [plan for _, plan in kq._HOT.values() if plan.fast]
        dq = kq._dequantize_plan(kq.get_format(fmt).name, 1, shape, torch.bfloat16, None)
        got[path] = (len(fast_plans), bool(dq.fast))
    assert got["fast"] == (2, True), f"the quantize / cast_transpose / dequantize plans hold no fast call: {got}"
    assert got["python"] == (0, False), got


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["decode-mma", "decode-mma bias", "w8a16-mma", "a8w8-mma mx", "a8w8 in-kernel",
                                  "mxlinear"])
def test_gpu_decode_gemms_through_the_fast_call(case, rng, poison, monkeypatch, packaged_default):
    """The decode GEMM calls (decode-mma, w8a16-mma, a8w8-mma with x quantized in the kernel, MXLinear) go through
    their fast call from the second call of a shape on (checked) and give the same bytes as the Python path (the
    same kernel and arguments), for fresh x on every call."""
    import mxkit
    from mxkit.nn import MXLinear

    assert fast_call.module(wait=True) is not None
    N, K, M = 1024, 2048, 3
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    fmt = "mxfp8_e4m3" if case in ("w8a16-mma", "a8w8-mma mx", "a8w8 in-kernel") else "mxfp4_e2m1"
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if case == "decode-mma bias" else None
    if case == "mxlinear" or case == "a8w8 in-kernel":
        lin = torch.nn.Linear(K, N, bias=True, device="cuda", dtype=torch.bfloat16)
        mod = MXLinear.from_linear(lin, fmt, act_format="mxfp8_e4m3" if case == "a8w8 in-kernel" else None)
        mod.requires_grad_(False)
        run = mod
    else:
        packed = mxkit.pack_weight(mxkit.quantize(w, fmt))
        run = (lambda x: mxkit.matmul(x, packed, bias=bias))
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    if case == "a8w8-mma mx":  # MXFP8 activations, quantized before the call
        xs = [mxkit.quantize(x, "mxfp8_e4m3") for x in xs]
    if case not in ("mxlinear", "a8w8 in-kernel"):
        assert mxkit.gemm_plan(xs[0], packed).path == case.split()[0]
    outs = {}
    for path in ("fast", "python"):
        if path == "python":
            _python_path(monkeypatch)
        made = []
        # (x of M rows quantized inside the a8w8 launch whatever this GPU's table says: the packaged quant_max_m is 1)
        with in_launch() if case == "a8w8 in-kernel" else contextlib.nullcontext():
            for x in xs:
                made.append(run(x).clone())
        outs[path] = made
        if path == "fast":
            holder = mod._packed if case in ("mxlinear", "a8w8 in-kernel") else packed
            calls = [c for c in holder.__dict__.get("_calls", {}).values() if getattr(c, "fast", None) is not None]
            assert calls, f"{case}: no prepared call holds a fast call"
            for c in calls:  # the Python path next: drop the fast calls made
                c.fast = None
    for i, (a, b) in enumerate(zip(outs["fast"], outs["python"])):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{case}: call {i} differs from the Python path"


@pytest.mark.gpu
def test_gpu_fast_calls_are_captured_by_cuda_graphs(rng):
    """quantize then the decode GEMM through their fast calls inside a CUDA graph: replays with fresh x give the
    bytes of the eager calls."""
    from conftest import assert_graph_replays

    import mxkit

    assert fast_call.module(wait=True) is not None
    packed = mxkit.pack_weight(mxkit.quantize(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), "mxfp4"))
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)

    def step(x):
        return mxkit.quantize(x, "mxfp8_e4m3"), mxkit.matmul(x, packed)

    step(x)
    step(x)
    assert_graph_replays(step, [x], lambda: [torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)])


@pytest.mark.gpu
def test_gpu_outputs_come_from_the_caching_allocator_without_the_dispatcher(rng):
    """On CUDA the fast call's outputs after the first are made by empty_generic (counted) with PyTorch's CUDA
    caching allocator: torch.cuda.memory_allocated grows by their bytes while they live and falls back when they are
    freed; cast_transpose's four outputs (two allocations: each copy's elements, then its scale) and a decode
    GEMM's give the bytes of the at::empty path (fast_alloc off: four allocations);
    a CUDA graph captures them (the graph test above replays such calls)."""
    import mxkit

    mod = fast_call.module(wait=True)
    assert mod is not None
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    packed = mxkit.pack_weight(mxkit.quantize(torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16), "mxfp4"))
    xm = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # plans made, allocator learned
        mxkit.cast_transpose(x, "mxfp8_e4m3"), mxkit.matmul(xm, packed)
    torch.cuda.synchronize()
    got = {}
    for flag in (True, False):
        prev = mod.fast_alloc(flag)
        try:
            n0, m0 = mod.fast_alloc_count(), torch.cuda.memory_allocated()
            rows, cols = mxkit.cast_transpose(x, "mxfp8_e4m3")
            y = mxkit.matmul(xm, packed)
            n1, m1 = mod.fast_alloc_count(), torch.cuda.memory_allocated()
        finally:
            mod.fast_alloc(prev)
        assert (n1 - n0 >= 5) if flag else n1 == n0, (flag, n1 - n0)  # (4 of cast_transpose, y at least)
        made = [rows.qdata, rows.scale, cols.qdata, cols.scale, y]
        assert m1 - m0 >= sum(t.numel() * t.element_size() for t in made)
        assert all(t.is_cuda and t.device == x.device for t in made)
        storage = [t.untyped_storage().data_ptr() for t in made[:4]]
        if flag:  # each copy's elements and scale in one allocation, the scale 256-byte aligned after them
            assert storage[0] == storage[1] != storage[2] == storage[3], storage
            assert rows.scale.data_ptr() - rows.qdata.data_ptr() == 256 * -(-rows.qdata.numel() // 256)
            assert cols.scale.data_ptr() - cols.qdata.data_ptr() == 256 * -(-cols.qdata.numel() // 256)
        else:
            assert len(set(storage)) == 4
        got[flag] = [t.clone() for t in made]
        m2 = torch.cuda.memory_allocated()
        del rows, cols, y, made
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == m2 - (m1 - m0)  # every byte the calls took, given back
    for a, b in zip(got[True], got[False]):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_a_forked_child_starts_the_build_over(monkeypatch):
    """A child forked while the build thread ran has no such thread: its state goes back to "not asked", so a
    later call builds or loads again instead of waiting for a thread that does not exist there."""
    dead = fast_call.threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    monkeypatch.setattr(fast_call, "_lock", fast_call._lock)  # (the handler makes a new lock: restored after)
    monkeypatch.setattr(fast_call, "_state", {"module": None, "thread": dead})
    monkeypatch.setattr(fast_call, "_ready", fast_call.threading.Event())
    fast_call._after_fork_in_child()
    assert fast_call._state["thread"] is None and not fast_call._ready.is_set()
    # a build that had ended (here: failed and reported) stays ended in the child: no second build, no second warning
    monkeypatch.setattr(fast_call, "_state", {"module": None, "thread": dead})
    done = fast_call.threading.Event()
    done.set()
    monkeypatch.setattr(fast_call, "_ready", done)
    fast_call._after_fork_in_child()
    assert fast_call._state["thread"] is dead and fast_call._ready is done
