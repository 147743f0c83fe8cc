"""The bound direct launch of the Triton quantize / dequantize / cast-transpose kernels
(:func:`mxkit.kernels.launch.triton_bound_launch`, the plans' ``bound`` launches): the parameter block derived
from a compiled kernel, and on the GPU the bytes of repeated calls, which take it."""

from __future__ import annotations

import ctypes
import types

import pytest
import torch
from conftest import DEV, FORMAT_NAMES, assert_dequant_equal, assert_mx_equal, rand_tensor

import mxkit
from mxkit.kernels import cuda_driver, launch
from mxkit.kernels import quantize as kq
from mxkit.reference import dequantize_reference, quantize_reference


def _compiled(signature, constants, **md):
    meta = dict(num_ctas=1, shared=96, num_warps=4, launch_cooperative_grid=False, launch_pdl=False,
                global_scratch_size=0, profile_scratch_size=0)
    meta.update(md)
    return types.SimpleNamespace(src=types.SimpleNamespace(signature=signature, constants=constants),
                                 metadata=types.SimpleNamespace(**meta), function=1234, name="probe",
                                 _init_handles=lambda: None)


def test_bound_launch_derives_the_parameters_and_checks_them_with_the_driver(monkeypatch):
    """Runtime arguments in signature order, less constexprs and arguments specialised into constants, then the
    two scratch pointers; sizes checked against the driver's list; anything unusual gives None."""
    # "one": an int argument equal to 1, specialised (Triton 3.6 writes it as a constexpr of the signature);
    # "none": a None argument; "B": a constexpr parameter
    sig = {"x_ptr": "*i16", "q_ptr": "*u8", "n": "i32", "one": "constexpr", "big": "i64", "none": "constexpr",
           "f": "fp32", "B": "constexpr"}
    k = _compiled(sig, {(3,): 1, (5,): None, (7,): 64})
    x, q = torch.zeros(8, dtype=torch.int16), torch.zeros(8, dtype=torch.uint8)
    sizes = [8, 8, 4, 8, 4, 8, 8]
    monkeypatch.setattr(cuda_driver, "param_sizes", lambda handle: list(sizes) if handle == 1234 else None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    b = launch.triton_bound_launch(k, (x, q, 5, 1, 2**40, None, 0.5), (3,))
    assert b is not None and b.owner is k  # (kept: the compiled kernel owns the module of the raw handle)
    assert (b.grid, b.block, b.shared, b.kernel.fn.value) == ((3, 1, 1), 128, 96, 1234)
    assert [v.value for v in b.vals[:2]] == [x.data_ptr(), q.data_ptr()]
    assert [type(v) for v in b.vals[2:5]] == [ctypes.c_int32, ctypes.c_int64, ctypes.c_float]
    assert [b.vals[2].value, b.vals[3].value, b.vals[4].value] == [5, 2**40, 0.5]
    assert [v.value for v in b.vals[5:]] == [None, None]  # the scratch pointers: null
    b.set_ptr(1, x)
    assert b.vals[1].value == x.data_ptr()
    calls = []
    monkeypatch.setattr(cuda_driver, "_fast_module", None)  # the ctypes path (test_fast_launch: the C one)
    monkeypatch.setattr(b, "_launch_ctypes", lambda *shape: calls.append((shape, [v.value for v in b.vals[:2]])))
    b.run(q, x)  # the first pointer arguments swapped under the lock, then the launch of the kernel's shape
    assert calls == [((3, 1, 1, 128), [q.data_ptr(), x.data_ptr()])] and not b.lock.locked()
    sizes.pop()  # the driver counts one parameter fewer than derived
    assert launch.triton_bound_launch(k, (x, q, 5, 1, 2**40, None, 0.5), (3,)) is None
    sizes.append(8)
    k_int = _compiled(dict(sig, one="i32"), {(5,): None, (7,): 64})  # "one" not specialised: a parameter
    sizes[3:3] = [4]
    b = launch.triton_bound_launch(k_int, (x, q, 5, 1, 2**40, None, 0.5), (3,))
    assert [v.value for v in b.vals[2:6]] == [5, 1, 2**40, 0.5]
    del sizes[3]
    for md in ({"global_scratch_size": 128}, {"num_ctas": 2}, {"launch_pdl": True}):
        kk = _compiled(sig, {(3,): 1, (5,): None}, **md)
        assert launch.triton_bound_launch(kk, (x, q, 5, 1, 2**40, None, 0.5), (1,)) is None
    assert launch.triton_bound_launch(_compiled({"p": "*fp32", "t": "bf16x2"}, {}), (x, 1), (1,)) is None
    assert launch.triton_bound_launch(_compiled({"p": "*fp32"}, {}), (5,), (1,)) is None  # an int for a pointer


def test_launch_binds_the_primary_context_on_a_thread_without_one(monkeypatch):
    """A launch that the driver refuses for want of a current context (CUDA_ERROR_INVALID_CONTEXT: autograd's
    backward worker thread) binds the device's primary context to the thread and is made again, once; any other
    error is raised."""
    k = cuda_driver.Kernel.from_handle(1234, "probe", torch.device("cuda", 3))
    b = k.bind((torch.zeros(2), ctypes.c_int(1)))
    rcs, bound = [201, 0], []
    monkeypatch.setattr(cuda_driver, "_fast_module", None)
    monkeypatch.setattr(cuda_driver, "_launch_fn", lambda: lambda *a: rcs.pop(0))
    monkeypatch.setattr(cuda_driver, "_raw_stream", lambda index: 0)
    monkeypatch.setattr(cuda_driver, "bind_primary_context", bound.append)
    b.launch(1, 1, 1, 32)
    assert bound == [3] and not rcs
    rcs[:] = [201, 201]
    monkeypatch.setattr(cuda_driver, "_libcuda", lambda: types.SimpleNamespace(
        cuGetErrorString=lambda rc, msg: 0))
    with pytest.raises(cuda_driver.CudaDriverUnavailable, match="launching probe failed: CUDA error 201"):
        b.launch(1, 1, 1, 32)


def test_kernel_call_reuses_its_parameter_block(monkeypatch):
    """``Kernel(grid, block, args)`` binds its parameter block on the first call and afterwards only replaces the
    values (tensor pointers, None as null, ctypes scalars): each launch passes that call's values."""
    k = cuda_driver.Kernel.from_handle(1234, "probe", torch.device("cuda", 0))
    seen = []

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = ctypes.cast(params.value, ctypes.POINTER(ctypes.c_void_p))
        seen.append((gx, ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_void_p))[0],
                     ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_void_p))[0],
                     ctypes.cast(ptrs[2], ctypes.POINTER(ctypes.c_int))[0]))
        return 0

    monkeypatch.setattr(cuda_driver, "_fast_module", None)
    monkeypatch.setattr(cuda_driver, "_launch_fn", lambda: launch)
    monkeypatch.setattr(cuda_driver, "_raw_stream", lambda index: 0)
    a, b = torch.zeros(4), torch.zeros(8)
    k((1,), 32, (a, None, ctypes.c_int(5)))
    first = k._bound
    k((2,), 32, (b, a, ctypes.c_int(7)))
    k((3,), 32, (None, b, ctypes.c_int(-1)))
    assert k._bound is first and not first.lock.locked()
    assert seen == [(1, a.data_ptr(), None, 5), (2, b.data_ptr(), a.data_ptr(), 7), (3, None, b.data_ptr(), -1)]


def _bound_plans() -> list:
    return [b for _, plan in kq._HOT.values() for b in plan.bound.values() if b]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_gpu_repeated_calls_take_the_bound_launch(fmt, rng, poison):
    """The second call of a problem launches through the bound launch: the same bytes as the reference for
    fresh data on every call, for x at a 16-byte-aligned address and at an offset of 4 bytes (another
    specialisation, bound separately), for quantize, cast_transpose and dequantize."""
    kq._HOT.clear()
    kq._dequantize_plan.cache_clear()
    shape = (96, 256)
    n = shape[0] * shape[1]
    for offset in (0, 2):  # bf16 elements: x at +0 and +4 bytes
        for call in range(3):
            x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
            buf = torch.empty(n + offset, dtype=torch.bfloat16, device=DEV)
            xd = buf[offset:].view(shape)
            xd.copy_(x)
            got = mxkit.quantize(xd, fmt)
            assert_mx_equal(got, quantize_reference(x, fmt), what=f"{fmt} quantize call {call} offset {offset}")
            ref = quantize_reference(x, fmt)
            for dtype in (torch.bfloat16, torch.float32):
                assert_dequant_equal(mxkit.dequantize(got, dtype), dequantize_reference(ref, dtype),
                                     what=f"{fmt} dequantize {dtype} call {call}")
            rows, cols = mxkit.cast_transpose(xd, fmt)
            assert_mx_equal(rows, quantize_reference(x, fmt, axis=1), what=f"{fmt} cast_transpose rows {call}")
            assert_mx_equal(cols, quantize_reference(x, fmt, axis=0), what=f"{fmt} cast_transpose cols {call}")
    assert _bound_plans(), "no quantize plan holds a bound launch: the fast path never ran"
    for dtype in (torch.bfloat16, torch.float32):
        plan = kq._dequantize_plan(kq.get_format(fmt).name, 1, shape, dtype, None)
        assert any(plan.bound.values()), f"the {dtype} dequantize plan holds no bound launch"


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp8_e4m3"])
def test_gpu_hot_calls_take_strided_and_negative_views(fmt, rng, poison):
    """A problem seen before (its hot runner) given, in turn, a contiguous x, a transposed view of the same shape and
    a negative-bit view (torch._neg_view: its memory holds -x): quantize and cast_transpose give the reference bytes
    of x's values each time (the runner resolves such views into a contiguous copy before the raw-pointer launch)."""
    kq._HOT.clear()
    shape = (128, 256)
    for call in range(3):
        for kind in ("contiguous", "transposed", "negative"):
            x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
            if kind == "contiguous":
                xd = x.to(DEV)
            elif kind == "transposed":
                xd = x.t().contiguous().to(DEV).t()
                assert not xd.is_contiguous()
            else:
                xd = torch._neg_view((-x).to(DEV))
                assert xd.is_neg()
            want = quantize_reference(x, fmt)
            assert_mx_equal(mxkit.quantize(xd, fmt), want, what=f"{fmt} quantize {kind} call {call}")
            rows, cols = mxkit.cast_transpose(xd, fmt)
            assert_mx_equal(rows, want, what=f"{fmt} cast_transpose rows {kind} call {call}")
            assert_mx_equal(cols, quantize_reference(x, fmt, axis=0), what=f"{fmt} cast_transpose cols {kind} {call}")
    assert len(kq._HOT) == 2, "quantize and cast_transpose: one hot problem each"


@pytest.mark.gpu
def test_gpu_triton_launch_only_takes_tritons_launcher(rng):
    """Inside launch.triton_launch_only() (host-overhead A/B runs) calls go through Triton's launcher even for a
    problem with a bound launch, and no plan first run there is stuck without one."""
    from mxkit.kernels.launch import triton_launch_only

    kq._HOT.clear()
    x = rand_tensor((64, 256), -1, generator=rng, dtype=torch.bfloat16).to(DEV)
    with triton_launch_only():
        for _ in range(2):
            assert_mx_equal(mxkit.quantize(x, "mxfp4"), quantize_reference(x.cpu(), "mxfp4"), what="launch only")
    assert not any(plan.bound for _, plan in kq._HOT.values())
    for _ in range(2):
        assert_mx_equal(mxkit.quantize(x, "mxfp4"), quantize_reference(x.cpu(), "mxfp4"), what="after")
    assert _bound_plans()


@pytest.mark.gpu
def test_gpu_bound_launch_is_captured_by_cuda_graphs(rng):
    """A quantize call through the bound launch inside a CUDA graph: replays with new input data give the
    reference bytes."""
    x = torch.empty(64, 512, dtype=torch.bfloat16, device=DEV)
    x.copy_(rand_tensor(x.shape, -1, generator=rng, dtype=torch.bfloat16))
    for _ in range(2):
        mxkit.quantize(x, "mxfp8")  # the second call binds the launch
    assert _bound_plans()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        mxkit.quantize(x, "mxfp8")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mxkit.quantize(x, "mxfp8")
    for _ in range(2):
        new = rand_tensor(x.shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
        x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert_mx_equal(out, quantize_reference(new, "mxfp8"), what="graph replay")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp6_e2m3"])
def test_gpu_cast_transpose_with_a_transposed_scale_binds_both_launches(fmt, rng):
    """A cast-transpose whose column scale is written transposed and then moved into place (``scale_t``: the
    default from 2^26 elements, forced here on a small problem) binds its two launches together: repeated calls
    with fresh data give the reference bytes through them."""
    from mxkit.kernels import opt_flags

    shape = (128, 384)
    with opt_flags.override(quantize={"scale_t": True}):
        for call in range(3):
            x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True)
            rows, cols = mxkit.cast_transpose(x.to(DEV), fmt)
            assert_mx_equal(rows, quantize_reference(x, fmt, axis=1), what=f"{fmt} rows, call {call}")
            assert_mx_equal(cols, quantize_reference(x, fmt, axis=0), what=f"{fmt} cols, call {call}")
        plans = [plan for (key, _), (_, plan) in kq._HOT.items() if key[0] == shape and isinstance(key[3], tuple)]
        assert plans and plans[0].scale_t is not None, "the override did not give the transposed-scale plan"
        assert any(isinstance(b, tuple) and len(b) == 2 for b in plans[0].bound.values()), plans[0].bound


def _desc(t, shape, strides, block, padding="zero"):
    return types.SimpleNamespace(base=t, shape=list(shape), strides=list(strides), block_shape=list(block),
                                 padding=padding)


def test_args_launch_rewrites_its_block_from_each_calls_arguments(monkeypatch):
    """ArgsLaunch (the _Launcher's hits): a host TMA descriptor's parameters are its CUtensorMap (128 bytes,
    64-byte aligned), shape (int32) and strides (int64); the map is encoded as Triton encodes it (dims and box
    innermost first, byte strides, swizzle and element type from the kernel's metadata) and again only when the
    descriptor changes; pointers and ints are rewritten each call, ints specialised to 1 and constexprs skipped;
    a map the driver refuses launches nothing (False: the caller takes Triton's runner)."""
    sig = {"x_desc": "tensordesc<bf16[256, 64]>", "y_ptr": "*bf16", "M": "i32", "one": "constexpr", "K": "i64",
           "B": "constexpr"}
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [256, 64], "fp4_padded": False}
    k = _compiled(sig, {(3,): 1, (5,): 64}, tensordesc_meta=[meta])
    x1, x2 = torch.zeros(64, dtype=torch.bfloat16), torch.zeros(96, dtype=torch.bfloat16)
    y = torch.zeros(8, dtype=torch.bfloat16)
    sizes = [128, 4, 4, 8, 8, 8, 4, 8]
    monkeypatch.setattr(cuda_driver, "param_sizes", lambda handle: list(sizes) + [8, 8])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    encoded, launched, rc = [], [], [0]

    def encode(addr, dtype, rank, ptr, dims, gstrides, box, estrides, interleave, swizzle, l2, fill):
        encoded.append((addr % 64, dtype, rank, ptr, list(dims[:rank]), list(gstrides[:rank - 1]), list(box[:rank]),
                        list(estrides[:rank]), interleave, swizzle, l2, fill))
        return rc[0]

    monkeypatch.setattr(launch, "_encode_tiled", lambda: encode)
    monkeypatch.setattr(launch, "_TMA_TRITON", True)  # (the encoding is Triton 3.6's; CI may install another)
    args = (_desc(x1, (1000, 2880), (2880, 1), (256, 64)), y, 1000, 1, 2**40)
    al = launch.ArgsLaunch.make(k, args, (4,))
    assert al is not None
    b = al.launch
    monkeypatch.setattr(cuda_driver, "_fast_module", None)
    monkeypatch.setattr(b, "_launch_ctypes", lambda *shape: launched.append(
        (shape, [v.value for v in b.vals[1:8]])))
    assert al((7, 2), args)
    assert encoded == [(0, 8, 2, x1.data_ptr(), [2880, 1000], [2 * 2880], [64, 256], [1, 1], 0, 3, 2, 0)]
    assert launched == [((7, 2, 1, 128), [1000, 2880, 2880, 1, y.data_ptr(), 1000, 2**40])]
    assert bytes(b.vals[0]) is not None and len(b.vals) == 10  # map, 2 + 2 ints, y, M, K, 2 scratch pointers
    assert al((7, 2), (args[0], x1, 5, 1, 7))  # the same descriptor: not encoded again
    assert len(encoded) == 1 and launched[-1][1][4:] == [x1.data_ptr(), 5, 7]
    nan = _desc(x2, (3, 32), (32, 1), (2, 32), padding="nan")
    assert al((1,), (nan, y, 3, 1, 2))
    assert encoded[-1][3:5] == (x2.data_ptr(), [32, 3]) and encoded[-1][-1] == 1
    assert encoded[-1][6] == [64, 256]  # the box of the kernel's metadata (Triton's), not the descriptor's block
    assert launched[-1][1][:4] == [3, 32, 32, 1]
    rc[0] = 1  # the driver refuses the next map: nothing launched
    n = len(launched)
    assert not al((1,), (_desc(x2, (4, 32), (32, 1), (2, 32)), y, 3, 1, 2)) and len(launched) == n
    rc[0] = 0
    assert al((0, 2), args) and len(launched) == n  # an empty grid: nothing launched (as Triton's launcher)
    # metadata this encoding does not know (another Triton's), or another Triton: no ArgsLaunch
    k_tf32 = _compiled(sig, {(3,): 1, (5,): 64}, tensordesc_meta=[dict(meta, round_f32_to_tf32=True)])
    assert launch.ArgsLaunch.make(k_tf32, args, (4,)) is None
    monkeypatch.setattr(launch, "_TMA_TRITON", False)
    assert launch.ArgsLaunch.make(k, args, (4,)) is None
    monkeypatch.setattr(launch, "_TMA_TRITON", True)
    # descriptors lowered to pointers (no metadata), or a size the driver does not count: no ArgsLaunch
    assert launch.ArgsLaunch.make(_compiled(sig, {(3,): 1, (5,): 64}), args, (4,)) is None
    sizes.pop()
    assert launch.ArgsLaunch.make(k, args, (4,)) is None


def test_args_launch_with_outputs_maps_roles_to_parameters(monkeypatch):
    """ArgsLaunch.with_outputs (a private launch's C++ fast call): the block is filled from the arguments once; each
    pointer argument's role becomes a slot at its parameter index, each descriptor's a re-addressed map of the
    bytes just encoded at its map's index, scalars stay bound; a role that does not fit its argument (a pointer or
    descriptor without one, a scalar with one, a descriptor from no input, the wrong count) gives None."""
    sig = {"x_desc": "tensordesc<bf16[256, 64]>", "y_ptr": "*bf16", "M": "i32", "one": "constexpr", "b_ptr": "*fp32",
           "B": "constexpr"}
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [256, 64], "fp4_padded": False}
    k = _compiled(sig, {(3,): 1, (5,): 64}, tensordesc_meta=[meta])
    monkeypatch.setattr(cuda_driver, "param_sizes", lambda handle: [128, 4, 4, 8, 8, 8, 4, 8, 8, 8])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def encode(addr, dtype, rank, ptr, *rest):
        ctypes.memset(addr, 0x5A, 128)
        ctypes.c_uint64.from_address(addr).value = ptr
        return 0

    monkeypatch.setattr(launch, "_encode_tiled", lambda: encode)
    monkeypatch.setattr(launch, "_TMA_TRITON", True)
    x, y, b = torch.zeros(64, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16), torch.zeros(4)
    args = (_desc(x, (1000, 2880), (2880, 1), (256, 64)), y, 1000, 1, b)
    al = launch.ArgsLaunch.make(k, args, (4,))
    made = []
    monkeypatch.setattr(al.launch, "with_outputs", lambda *a, **kw: made.append((a, kw)) or "plan")
    outs = (((1000, 8), torch.bfloat16, False),)
    assert al.with_outputs(args, (0, -1, None, None, 1), outs, 2) == "plan"
    (a, kw), = made
    want_map = (ctypes.c_uint64(x.data_ptr()).value.to_bytes(8, "little") + b"\x5a" * 120)
    assert a == ((-1, 1), outs, 2, True) and kw == {"at": (5, 7), "maps": ((0, 0, want_map),)}
    assert al.launch.vals[6].value == 1000  # (M bound from the arguments)
    for roles in [(0, None, None, None, 1), (0, -1, 5, None, 1), (None, -1, None, None, 1), (2, -1, None, None, 1),
                  (0, -1, None, None)]:
        assert al.with_outputs(args, roles, outs, 2) is None, roles
    assert len(made) == 1


@pytest.mark.gpu
def test_gpu_args_launch_wgmma_same_bytes_and_maps_as_triton(rng):
    """The w4a16-wgmma kernel (three host TMA descriptors) on its ArgsLaunch: repeated calls with new x of other
    row counts and a MoE-style y give the bytes of Triton's own launcher (launch.triton_launch_only), the launcher
    holds an ArgsLaunch for the specialisation, and each CUtensorMap it encoded equals the one Triton's launcher
    encodes for the same descriptor (read from Triton's map object)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    from mxkit.kernels.matmul import pack_weight
    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg
    from mxkit.reference import quantize_reference

    if wg.available(torch.device("cuda")) is not None:
        pytest.skip(wg.available(torch.device("cuda")))
    N, K = 384, 2880
    w = quantize_reference(torch.randn(N, K, generator=rng).to(torch.bfloat16), "mxfp4_e2m1").to("cuda")
    q, st, one = wg.packed_of(pack_weight(w, act="float"))
    bias = torch.randn(N, generator=rng).cuda()
    L = wg._launcher("wgmma", "e2m1", 128)
    for M in (320, 160, 480, 320):
        x = torch.randn(M, K, generator=rng).to(torch.bfloat16).cuda()
        with launch.triton_launch_only():
            want = wg.w4a16_wgmma(x, q, st, N, one, torch.float32, bias, bm=128)
        for _ in range(2):
            got = wg.w4a16_wgmma(x, q, st, N, one, torch.float32, bias, bm=128)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), M
    fast = [e[2] for e in L.cache.values() if e[2]]
    assert fast, "no ArgsLaunch made for the wgmma kernel"
    k = next(e[0] for e in L.cache.values() if e[2])
    slots = [v for _, kind, v in fast[0].plan if kind == 2]
    assert len(slots) == 3 and all(s.last is not None for s in slots)
    for slot, meta in zip(slots, k.metadata.tensordesc_meta):
        ptr, shape, strides, block, padding = slot.last
        base = torch.empty(0, dtype=torch.uint8, device="cuda")
        desc = types.SimpleNamespace(base=types.SimpleNamespace(data_ptr=lambda p=ptr: p, dtype=base.dtype),
                                     shape=list(shape), strides=list(strides), block_shape=list(block),
                                     padding=padding)
        tmap = make_tensordesc_arg(desc, meta)[0]
        assert type(tmap).__basicsize__ >= 256  # (PyObject_HEAD, then the 128-byte aligned CUtensorMap)
        assert ctypes.string_at(id(tmap) + 128, 128) == bytes(slot.map)


def test_a_grid_with_a_zero_launches_nothing(monkeypatch):
    """A launch whose grid has a 0 in it (the MoE decode kernels' grid at no tokens: one block per sorted block of
    8 rows) returns without calling the driver, which refuses it (CUDA_ERROR_INVALID_VALUE); Triton's launcher and
    ArgsLaunch skip it alike. Every other grid still launches."""
    k = cuda_driver.Kernel.from_handle(1234, "k", torch.device("cuda", 0))
    monkeypatch.setattr(cuda_driver, "_fast_module", None)
    launched = []
    monkeypatch.setattr(cuda_driver.BoundLaunch, "_launch_ctypes", lambda self, *shape: launched.append(shape))
    x = torch.zeros(4)
    for grid in ((0, 360), (5, 0), (1, 1, 0)):
        k(grid, 128, (x, ctypes.c_int(3)))
    assert launched == []
    b = k.bind((x, ctypes.c_int(3)))
    b.grid = (0, 1, 1)
    b.run(x)
    b.launch(4, 0, 1, 128)
    assert launched == []
    k((2, 3), 128, (x, ctypes.c_int(3)))
    b.grid = (2, 1, 1)
    b.run(x)
    assert launched == [(2, 3, 1, 128), (2, 1, 1, 32)]
