"""mxkit.tensor: MXTensor is frozen, a pytree node (two uint8 leaves), traceable by torch.compile, and its
constructor names what is inconsistent. Also the error a missing Triton gives for ``backend="triton"``."""

import dataclasses
import io
import os
import sys
import time

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import mxkit
import mxkit.kernels
from mxkit import MXTensor

FIELDS = [f.name for f in dataclasses.fields(MXTensor)]


def _q(fmt="mxfp4", shape=(4, 64), axis=-1, **kw):
    """A fresh random MXTensor (normal values scaled by 3, so no block is all zero or a NaN block)."""
    x = torch.randn(shape) * 3
    return mxkit.quantize(x, fmt, axis=axis, backend="reference", **kw)


def _fields(t):
    return {f: getattr(t, f) for f in FIELDS}


def _same(a: MXTensor, b: MXTensor) -> bool:
    """Equal bytes and equal context fields (MXTensor compares by identity)."""
    fa, fb = _fields(a), _fields(b)
    tensors = ("qdata", "scale")
    return (all(torch.equal(fa.pop(t), fb.pop(t)) for t in tensors) and fa == fb)


# ---------------------------------------------------------------------------------------------------------
# frozen, identity semantics, replace


def test_frozen_every_field():
    q = _q()
    for f in FIELDS:
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{f}'"):
            setattr(q, f, getattr(q, f))
    with pytest.raises(dataclasses.FrozenInstanceError):
        del q.scale
    # the bytes stay mutable: frozen is about the fields, not the storage
    q.scale[0, 0] = 0xFF
    assert int(q.scale[0, 0]) == 0xFF


def test_identity_equality_and_hash():
    q = _q()
    r = dataclasses.replace(q)
    assert q == q and q != r and hash(q) != hash(r) and len({q, r}) == 2


def test_replace_normalises_and_rechecks():
    q = _q("mxfp6_e2m3", (2, 96, 3), axis=1)
    r = dataclasses.replace(q, scale_mode="rceil", rounding="away")
    assert r.scale_mode is mxkit.ScaleMode.RCEIL and r.rounding is mxkit.Rounding.AWAY
    assert r.qdata is q.qdata and r.scale is q.scale and r.shape == q.shape and r.axis == 1
    with pytest.raises(ValueError, match=r"scale has shape \(2, 3, 1\), expected \(2, 3, 3\)"):
        dataclasses.replace(q, scale=q.scale[..., :1])
    assert _same(q.to("cpu"), q)


def test_trusted_equals_checked():
    """The kernels' unchecked constructor builds the same object as the checked one, and stays frozen."""
    q = _q("mxfp8_e4m3", (96, 3), axis=0)
    t = MXTensor._trusted(**_fields(q))
    assert _same(t, q)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.axis = 1


# ---------------------------------------------------------------------------------------------------------
# pytree


@pytest.mark.parametrize("fmt, shape, axis, layout", [
    ("mxfp4", (4, 64), -1, "plain"), ("mxfp6_e3m2", (2, 64, 3), 1, "plain"), ("mxfp8_e4m3", (130, 64), -1,
                                                                              "nvidia_128x4"),
])
def test_pytree_flatten_unflatten_round_trip(fmt, shape, axis, layout):
    q = _q(fmt, shape, axis=axis, scale_mode="even", scale_layout=layout)
    leaves, spec = pytree.tree_flatten(q)
    assert len(leaves) == 2 and leaves[0] is q.qdata and leaves[1] is q.scale  # the leaves: the two tensors
    assert spec.num_leaves == 2 and spec.type is MXTensor
    back = pytree.tree_unflatten(leaves, spec)
    assert type(back) is MXTensor and back is not q and _same(back, q)
    assert back.qdata is q.qdata and back.scale is q.scale  # no copies
    # everything that is not a leaf is context: a second tensor of the same metadata has an equal spec
    assert pytree.tree_structure(dataclasses.replace(q, qdata=q.qdata.clone())) == spec
    assert pytree.tree_structure(dataclasses.replace(q, rounding="away")) != spec
    # keyed paths (torch.export) and a JSON round trip of the spec (torch.export serialisation)
    assert [pytree.keystr(k) for k, _ in pytree.tree_flatten_with_path(q)[0]] == [".qdata", ".scale"]
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
    # an unregistered custom format is refused at the dump (the load failed: "unknown MX format 'my_fp4'")
    custom = dataclasses.replace(q, fmt=dataclasses.replace(q.fmt, name="my_fp4"))
    with pytest.raises(ValueError, match="unregistered element format 'my_fp4' cannot be serialised by name"):
        pytree.treespec_dumps(pytree.tree_structure(custom))
    # tree_map rebuilds through the checked constructor
    mapped = pytree.tree_map_only(torch.Tensor, torch.clone, {"w": q, "n": 3})
    assert _same(mapped["w"], q) and mapped["w"].qdata is not q.qdata and mapped["n"] == 3
    # leaves that are not tensors (vmap's out_dims, a map to shapes): an unchecked container of them (it raised
    # "MXTensor qdata must be a torch.Tensor, got int")
    dims = pytree.tree_unflatten([0, 1], spec)
    assert type(dims) is MXTensor and (dims.qdata, dims.scale) == (0, 1) and dims.fmt is q.fmt
    shapes = pytree.tree_map(lambda t: t.shape, q)
    assert (shapes.qdata, shapes.scale) == (q.qdata.shape, q.scale.shape)


def test_torch_load_takes_an_mxtensor_by_default(tmp_path):
    """torch.load's default (weights_only=True) rebuilds an MXTensor alone or inside a dict (mxkit allowlists it
    and its field types at import): every field and byte as saved."""
    q = _q("mxfp6_e3m2", (2, 64, 3), axis=1, scale_mode="even")
    torch.save({"w": q, "step": 3}, tmp_path / "q.pt")
    back = torch.load(tmp_path / "q.pt")
    assert back["step"] == 3 and type(back["w"]) is MXTensor and _same(back["w"], q)


def test_loading_checks_the_fields_and_repr_names_them(tmp_path):
    """torch.load / pickle / deepcopy go through the constructor's checks: a file whose fields disagree (a stale
    logical shape) raises ValueError on load instead of dequantizing to another shape; repr names a non-default
    rounding and scale layout."""
    import copy
    import pickle

    q = mxkit.quantize(torch.randn(4, 64), "mxfp8", rounding="away", scale_layout="nvidia_128x4")
    assert "rounding=away, scale_layout=nvidia_128x4" in repr(q)
    assert "rounding" not in repr(_q("mxfp4", (2, 64), axis=1)) and "scale_layout" not in repr(_q("mxfp4", (2, 64), axis=1))
    for back in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert _same(back, q)
    bad = MXTensor._trusted(q.qdata, q.scale, q.fmt, 1, 32, torch.Size([4, 128]), q.scale_mode, q.rounding,
                            q.scale_layout)
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="inconsistent MXTensor: qdata has shape"):
        torch.load(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="inconsistent MXTensor"):
        pickle.loads(pickle.dumps(bad))


def test_weights_copy_and_pickle_after_the_gemm_paths_cached_launches_on_them():
    """The GEMM paths keep prepared launches on the weight objects (``_a8w8`` on an MXTensor, ``_calls`` /
    ``_fold_operands`` / ``_wgmma`` on a PackedWeight: locks and device pointers on CUDA). Copies and pickles carry
    the fields only: they failed after the first CUDA GEMM (``MXTensor(**state)`` got ``_a8w8``; a lock does not
    pickle). Simulated on CPU with the caches' own helper and a lock."""
    import copy
    import pickle
    import threading

    from mxkit.kernels.matmul_details._mma_calls import calls_on

    w = mxkit.quantize(torch.randn(16, 64), "mxfp8")
    calls_on(w, "_a8w8")[("key",)] = threading.Lock()
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(16, 64), "mxfp4"))
    calls_on(pw, "_calls")[("key",)] = threading.Lock()
    object.__setattr__(pw, "_wgmma", threading.Lock())
    for obj in (w, pw):
        for back in (copy.copy(obj), copy.deepcopy(obj), pickle.loads(pickle.dumps(obj))):
            assert type(back) is type(obj) and not any(k.startswith("_") for k in vars(back))
            src, got = (obj, back) if obj is w else (obj.source, back.source)
            assert _same(got, src)
    from mxkit.packed import packed_of

    back = pickle.loads(pickle.dumps(pw))
    assert packed_of(id(back)) is back  # (registered like a new one)


def test_fp8_rowwise_is_not_differentiable_on_any_device():
    """quantize_fp8_rowwise's result carries no autograd graph (the CUDA kernel's never did; the CPU reference's
    did, and a matmul of it gave x a gradient through the FP8 cast and the scale's amax, CPU only)."""
    x = torch.randn(4, 64, requires_grad=True)
    a = mxkit.quantize_fp8_rowwise(x)
    assert not a.data.requires_grad and not a.scale.requires_grad and a.data.grad_fn is None
    assert torch.equal(a.data.view(torch.uint8), mxkit.quantize_fp8_rowwise(x.detach()).data.view(torch.uint8))


def test_wgmma_descriptor_cache_lives_beside_the_weight_not_on_it():
    """The w4a16-wgmma kernel's TMA descriptors are kept per weight tensor while it lives, outside its __dict__
    (a module buffer carried them into deep copies and pickles) and without keeping it alive (their bases alias its
    memory, not the tensor object). A stand-in layout on CPU."""
    import gc
    import weakref

    from mxkit.kernels.matmul_details import _w4a16_wgmma as wg

    class Layout:
        @staticmethod
        def descs(q, st, elem):
            return (q.view(torch.uint8).view(-1), st.view(st.shape))

    wg.LAYOUTS["test-stand-in"] = Layout
    try:
        q, st = torch.arange(8, dtype=torch.int32), torch.ones(2)
        d = wg._weight_descs(q, st, "test-stand-in", "e2m1")
        assert wg._weight_descs(q, st, "test-stand-in", "e2m1") is d and not vars(q)
        assert d[0].data_ptr() == q.data_ptr() and torch.equal(d[0], q.view(torch.uint8))
        n, alive = len(wg._DESCS), weakref.ref(q)
        del q, d
        gc.collect()
        assert alive() is None and len(wg._DESCS) == n - 1
    finally:
        del wg.LAYOUTS["test-stand-in"]


def test_packed_weight_pytree_reaches_every_tensor():
    """A PackedWeight's folded operand is a pytree node too (its tensors were one opaque leaf: a tensor map left
    them where they were)."""
    pw = mxkit.pack_weight(mxkit.quantize(torch.randn(16, 128), "mxfp4", axis=1))
    leaves = pytree.tree_leaves(pw)
    assert all(isinstance(t, torch.Tensor) for t in leaves if t is not None)
    assert any(t is pw.folded.data for t in leaves) and any(t is pw.folded.owner for t in leaves)
    meta = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), pw)
    assert meta.folded.device.type == "meta" and meta.source.device.type == "meta"
    assert meta.folded.fmt is pw.folded.fmt and meta.folded.lead_shape == pw.folded.lead_shape


def test_pytree_unflatten_checks_leaves():
    q = _q()
    leaves, spec = pytree.tree_flatten(q)
    with pytest.raises(ValueError, match=r"qdata has shape \(4, 16\), expected \(4, 32\)"):
        pytree.tree_unflatten([leaves[0][:, :16], leaves[1]], spec)
    with pytest.raises(TypeError, match="scale must be uint8, got torch.float32"):
        pytree.tree_unflatten([leaves[0], leaves[1].float()], spec)


def _flip_signs_halve_scales(q: MXTensor) -> tuple[MXTensor, MXTensor, MXTensor]:
    """Negate every FP4 element (bit 3 of each nibble) and halve every scale: dequantizes to -x / 2 (no
    byte-0 or NaN scale in the inputs). Three ways to build the output: constructor, replace, pytree."""
    qdata, scale = q.qdata ^ 0x88, q.scale - 1
    a = MXTensor(qdata, scale, q.fmt, q.axis, q.block_size, q.shape, q.scale_mode, q.rounding, q.scale_layout)
    b = dataclasses.replace(q, qdata=qdata, scale=scale)
    _, spec = pytree.tree_flatten(q)
    return a, b, pytree.tree_unflatten([qdata, scale], spec)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_fullgraph_takes_and_returns_mxtensor(backend):
    """fullgraph=True: any graph break (an untraceable constructor, check or pytree call) is an error.
    aot_eager runs Dynamo and AOTAutograd (1 s); inductor also generates and builds C++ (9 s with a cold cache
    on 2 busy cores: marked slow, still well inside a CI run)."""
    torch._dynamo.reset()
    q = _q("mxfp4", (8, 64), scale_mode="rceil")
    assert int(q.scale.min()) > 0 and int(q.scale.max()) < 0xFF
    t0 = time.perf_counter()
    outs = torch.compile(_flip_signs_halve_scales, fullgraph=True, backend=backend)(q)
    print(f"torch.compile(backend={backend!r}) first call: {time.perf_counter() - t0:.1f} s")
    want = mxkit.dequantize(q) / -2
    for out, eager in zip(outs, _flip_signs_halve_scales(q)):
        assert type(out) is MXTensor and _same(out, eager)
        assert out.fmt is mxkit.MXFP4_E2M1 and out.scale_mode is mxkit.ScaleMode.RCEIL
        assert torch.equal(mxkit.dequantize(out), want)


# ---------------------------------------------------------------------------------------------------------
# bad input


def _args(q, **kw):
    return dict(_fields(q), **kw)


@pytest.mark.parametrize("fmt, shape, axis, bad, good, expected, got", [
    # qdata of an (8, 96) FP4 tensor quantized along K: 96 codes pack into 48 bytes
    ("mxfp4", (8, 96), 1, "qdata", "scale", (8, 48), (8, 47)),
    ("mxfp4", (8, 96), 1, "scale", "qdata", (8, 3), (8, 2)),
    # FP6 along axis 0 of (64, 5): the axis moves last, 64 codes pack into 48 bytes, 2 scales
    ("mxfp6_e2m3", (64, 5), 0, "qdata", "scale", (5, 48), (64, 5)),
    ("mxfp6_e2m3", (64, 5), 0, "scale", "qdata", (5, 2), (2, 5)),
])
def test_inconsistent_shape_names_the_field(fmt, shape, axis, bad, good, expected, got):
    q = _q(fmt, shape, axis=axis)
    arg = torch.zeros(got, dtype=torch.uint8)
    with pytest.raises(ValueError) as e:
        MXTensor(**_args(q, **{bad: arg}))
    msg = str(e.value)
    assert f"{bad} has shape {got}, expected {expected}" in msg
    assert f"{good} has shape" not in msg  # the consistent field is not blamed
    assert f"shape {shape}, axis={axis % len(shape)}, {q.fmt.name}, block_size=32" in msg


def test_inconsistent_both_fields_and_swizzled_scale():
    q = _q("mxfp8_e5m2", (4, 64))
    with pytest.raises(ValueError, match=r"qdata has shape \(4, 32\), expected \(4, 64\); "
                                         r"scale has shape \(4, 1\), expected \(4, 2\)"):
        MXTensor(**_args(q, qdata=q.qdata[:, :32], scale=q.scale[:, :1]))
    # a swizzled layout pads the 2-D (4, 2) scale to (128, 4)
    with pytest.raises(ValueError, match=r"scale has shape \(4, 2\), expected \(128, 4\).*'nvidia_128x4'"):
        MXTensor(**_args(q, scale_layout="nvidia_128x4"))


def test_other_bad_fields():
    q = _q()
    with pytest.raises(ValueError, match=r"shape \(-4, 64\) has a negative size"):  # (named qdata's bytes)
        MXTensor(**_args(q, shape=(-4, 64)))
    with pytest.raises(TypeError, match="qdata must be uint8, got torch.int8"):
        MXTensor(**_args(q, qdata=q.qdata.view(torch.int8)))
    with pytest.raises(TypeError, match="scale must be a torch.Tensor, got list"):
        MXTensor(**_args(q, scale=q.scale.tolist()))
    for axis in (2, -3):
        with pytest.raises(ValueError, match=rf"axis={axis} out of range for shape \(4, 64\)"):
            MXTensor(**_args(q, axis=axis))
    for axis in (True, 1.0, "1"):
        with pytest.raises(TypeError, match=rf"MXTensor axis must be an int, got {axis!r}"):
            MXTensor(**_args(q, axis=axis))
    with pytest.raises(TypeError, match="MXTensor block_size must be an int, got 32.0"):
        MXTensor(**_args(q, block_size=32.0))
    # a NumPy integer (metadata read back from NumPy) and a negative axis are taken, stored as a Python int
    for axis, bs in ((np.int64(1), np.int32(32)), (-1, 32)):
        t = MXTensor(**_args(q, axis=axis, block_size=bs))
        assert type(t.axis) is int and t.axis == 1 and type(t.block_size) is int and t.block_size == 32
        assert torch.equal(mxkit.dequantize(t), mxkit.dequantize(q))
    # the shape's dims too: NumPy ints become Python ints (a NumPy int in the context made torch.load with
    # weights_only=True refuse the saved tensor); a bool is no size
    t = MXTensor(**_args(q, shape=(np.int64(4), np.int32(64))))
    assert all(type(d) is int for d in t.shape) and t.shape == (4, 64) and repr(t) == repr(q)
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    assert torch.load(buf).shape == (4, 64)
    for shape in ((True, 64), (4, 64.0)):
        with pytest.raises(TypeError, match=r"MXTensor shape must be a sequence of ints"):
            MXTensor(**_args(q, shape=shape))
    with pytest.raises(ValueError, match=r"shape\[1\]=64 \(shape \(4, 64\)\) is not a multiple of block_size=48"):
        MXTensor(**_args(q, block_size=48))
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        MXTensor(**_args(q, block_size=0))
    with pytest.raises(ValueError, match="unknown MX format 'mxfp5'"):
        MXTensor(**_args(q, fmt="mxfp5"))


def test_device_mismatch_meta():
    """The device check without a GPU: a meta-device qdata (shape and dtype only) beside a CPU scale."""
    q = _q()
    with pytest.raises(ValueError, match="qdata and scale must be on one device: qdata is on meta, scale on cpu"):
        MXTensor(**_args(q, qdata=q.qdata.to("meta")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_mismatch_cuda_qdata_cpu_scale():
    q = _q()
    with pytest.raises(ValueError, match="qdata and scale must be on one device: qdata is on cuda:0, scale on cpu"):
        MXTensor(**_args(q, qdata=q.qdata.cuda()))
    with pytest.raises(ValueError, match="qdata is on cpu, scale on cuda:0"):
        MXTensor(**_args(q, scale=q.scale.cuda()))
    g = q.to("cuda")  # both moved: consistent
    assert g.device.type == "cuda" and g.scale.device == g.qdata.device


# ---------------------------------------------------------------------------------------------------------
# backend="triton" without Triton


def test_backend_triton_without_triton_names_the_extra(monkeypatch):
    """Both the lazy check (``triton_available``) and a real import fail, whichever ops.py consults."""
    x = torch.randn(4, 64)
    q = mxkit.quantize(x, "mxfp4", backend="reference")
    real = mxkit.kernels.triton_available
    real.cache_clear()
    monkeypatch.setattr(mxkit.kernels, "triton_available", lambda: False)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    try:
        with pytest.raises((ImportError, RuntimeError), match=r"mxkit\[triton\]"):
            mxkit.quantize(x, "mxfp4", backend="triton")
        with pytest.raises((ImportError, RuntimeError), match=r"mxkit\[triton\]"):
            mxkit.dequantize(q, backend="triton")
    finally:
        real.cache_clear()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs the kernels on CPU")
def test_backend_triton_off_cuda_is_refused_for_every_dtype():
    """dequantize(backend="triton") of a CPU tensor raises ValueError as documented, float64 included (that dtype
    went to the reference before the device check and ran silently)."""
    q = mxkit.quantize(torch.randn(4, 64), "mxfp4")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        with pytest.raises(ValueError, match="need a CUDA tensor"):
            mxkit.dequantize(q, dtype, backend="triton")


def test_sibling_checks_agree_on_folded_to_and_empty_int_cast_transpose():
    """Folded.to(dtype) says it takes a device, as MXTensor / PackedWeight / Fp8Rowwise do; cast_transpose of an
    empty int tensor is the documented TypeError (dtype), not the empty-tensor ValueError."""
    from mxkit.fold import fold_reference

    f = fold_reference(mxkit.quantize(torch.randn(4, 64), "mxfp4"))
    with pytest.raises(TypeError, match="Folded.to takes a device, not a dtype"):
        f.to(torch.float16)
    assert f.to("cpu").device.type == "cpu"
    with pytest.raises(TypeError, match="x.dtype=torch.int32 is not supported"):
        mxkit.cast_transpose(torch.empty(0, 32, dtype=torch.int32), "mxfp8")


def test_to_takes_a_device_not_a_dtype():
    """MXTensor / PackedWeight / Fp8Rowwise .to(dtype) raise a TypeError that says so and names what gives values
    in a dtype (it was a TypeError about qdata's dtype, from the constructor), and so does .to(another tensor); .to
    of a string that is not a device a ValueError naming the class; Fp8Rowwise with 0-d data names it."""
    from mxkit.packed import Fp8Rowwise

    q = _q()
    a = mxkit.quantize_fp8_rowwise(torch.randn(2, 64))
    for obj, name, instead in ((q, "MXTensor", "mxkit.dequantize"), (mxkit.pack_weight(q), "PackedWeight",
                               "mxkit.dequantize"), (a, "Fp8Rowwise", "a.dequantize")):
        with pytest.raises(TypeError, match=rf"{name}.to takes a device, not a dtype \(torch.float16\).*{instead}"):
            obj.to(torch.float16)
        assert obj.to("cpu").device == torch.device("cpu")
        with pytest.raises(ValueError, match=rf"{name}.to: 'bogus' is not a device"):  # (torch's bare RuntimeError)
            obj.to("bogus")
        with pytest.raises(TypeError, match=rf"{name}.to takes a device, not a tensor"):  # (torch's .to(other))
            obj.to(torch.randn(2))
        if not torch.cuda.is_available():  # (torch's AssertionError "not compiled with CUDA")
            for dev in ("cuda", torch.device("cuda", 1)):
                with pytest.raises(ValueError, match=rf"{name}.to\(.*\): CUDA is not available here"):
                    obj.to(dev)
        if not torch.accelerator.is_available():  # (an index is the current accelerator's, of any kind)
            with pytest.raises(ValueError, match=rf"{name}.to\(0\): no accelerator is available here"):
                obj.to(0)
    with pytest.raises(ValueError, match=r"Fp8Rowwise data must be at least 1-D"):
        Fp8Rowwise(torch.tensor(1.0).to(torch.float8_e4m3fn), torch.ones(1))


def test_expected_shapes_refuses_a_block_size_it_cannot_divide_by():
    assert MXTensor.expected_shapes((4, 64), 1, "mxfp4", 32) == ((4, 32), (4, 2))
    assert MXTensor.expected_shapes((4, 64), 1, "mxfp4", np.int64(32)) == ((4, 32), (4, 2))
    for bad in (0, -32, True, 32.0):  # (0: ZeroDivisionError)
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            MXTensor.expected_shapes((4, 64), 1, "mxfp4", bad)


def test_expected_shapes_refuses_an_axis_below_the_range():
    """A negative axis past the first dim is out of range (it wrapped around to the last)."""
    with pytest.raises(ValueError, match="out of range"):
        MXTensor.expected_shapes((4, 64), -3, "mxfp4", 32)
    assert MXTensor.expected_shapes((4, 64), -1, "mxfp4", 32) == ((4, 32), (4, 2))


def test_an_empty_mxtensor_has_zero_bits_per_element():
    q = MXTensor(torch.zeros(0, 32, dtype=torch.uint8), torch.zeros(0, 2, dtype=torch.uint8), "mxfp4", 1, 32, (0, 64))
    assert q.bits_per_element == 0.0


def test_packed_weight_nbytes_counts_every_copy_at_its_element_size():
    """PackedWeight.nbytes: the source's bytes plus each packed copy's, float32 fold scales at 4 bytes each."""
    w = mxkit.quantize(torch.randn(64, 128), "mxfp4", backend="reference")
    p = mxkit.pack_weight(w)
    ts = [w.qdata, w.scale, p.folded.data, p.folded.scale] + [t for t in (p.mma_q, p.mma_s) if t is not None]
    assert p.folded.scale.dtype == torch.float32
    assert p.nbytes == sum(t.numel() * t.element_size() for t in ts)


def test_to_refuses_what_is_no_device():
    """.to(True) / .to(1.5) / .to(float) of an MXTensor, PackedWeight, Fp8Rowwise or Folded is a TypeError saying it
    takes a device (torch's .to took a dtype from them: a TypeError about the bytes' dtype, bool or float64), and a
    negative index a ValueError naming the class (torch's bare RuntimeError)."""
    q = mxkit.quantize(torch.randn(4, 64), "mxfp4")
    objs = {"MXTensor": q, "PackedWeight": mxkit.pack_weight(q), "Fp8Rowwise": mxkit.quantize_fp8_rowwise(
        torch.randn(2, 64)), "Folded": mxkit.quantize_fold(torch.randn(2, 64), "mxfp4")}
    for name, obj in objs.items():
        for bad in (True, 1.5, float, ["cpu"]):
            with pytest.raises(TypeError, match=rf"{name}.to takes a device \(a str, torch.device or index\)"):
                obj.to(bad)
        with pytest.raises(ValueError, match=rf"{name}.to\(-1\): a device index is >= 0"):
            obj.to(-1)
        assert obj.to(None).device.type == "cpu"


def test_to_an_accelerator_torch_lacks_is_a_value_error():
    """.to('mps') / ('xpu') / ('hpu') / ('lazy') where torch has no such backend is the documented ValueError naming
    the call (torch raised RuntimeError, AssertionError, ModuleNotFoundError or NotImplementedError), as .to('cuda')
    without CUDA is; MXLinear's device= is checked the same way. A backend without a torch.<type> module is probed
    with an empty tensor (a working privateuse1 backend passes)."""
    from mxkit.nn import MXLinear

    q = mxkit.quantize(torch.randn(4, 64), "mxfp4")
    for dev in ("mps", "xpu", "hpu", torch.device("mps"), "lazy"):  # (lazy: no torch.lazy; torch.empty there fails)
        kind = torch.device(dev).type
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            continue
        with pytest.raises(ValueError, match=rf"MXTensor.to\(.*\): {kind} is not available here"):
            q.to(dev)
        with pytest.raises(ValueError, match=rf"MXLinear\(device=...\): device .*: {kind} is not available here"):
            MXLinear(64, 8, "mxfp4", device=dev)
    assert q.to("meta").device.type == "meta"
