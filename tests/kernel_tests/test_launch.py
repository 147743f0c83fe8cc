"""The direct launch (:mod:`mxkit.kernels.launch`) and the launch grids of the quantize plans."""

from __future__ import annotations

import inspect

import torch

from mxkit.kernels import quantize as kq


def test_direct_launch_supported_by_installed_triton():
    """The installed Triton (the README's, in CI) has the launch convention the direct launch replays, so no
    install silently takes the slow path: ``JITFunction.run`` launches the ``CompiledKernel`` with every bound
    argument, constexprs included, and returns it; ``CompiledKernel[grid]`` is a runner of the same arguments.
    A Triton that changes this fails here (then fix mxkit.kernels.launch or drop the direct launch)."""
    import triton
    from triton.compiler.compiler import CompiledKernel

    from mxkit.kernels import launch

    assert launch.direct_launch_supported(), triton.__version__
    params = list(inspect.signature(CompiledKernel.__getitem__).parameters)
    assert params == ["self", "grid"], params


def test_direct_launch_keys_on_every_specialisation(monkeypatch):
    """The direct launch (:class:`mxkit.kernels.launch._Launcher`) reuses a CompiledKernel only for calls with the same
    specialisation: tensor dtype and 16-byte alignment, int == 1 / % 16 / 32-bit range, constexprs and
    num_warps; it passes every argument in signature order (constexpr defaults filled in). Checked on the CPU
    with a stand-in for Triton's JITFunction launch that records what it is given."""
    import types

    import triton
    import triton.language as tl

    from mxkit.kernels import launch

    @triton.jit
    def _probe(x_ptr, n, m, A: tl.constexpr, B: tl.constexpr = 7):
        pass

    jit_calls, direct_calls = [], []

    class Compiled:
        function = object()

        def __getitem__(self, grid):  # Triton's runner reads grid[0], grid[1] and grid[2]
            assert len(grid) == 3
            return lambda *a: direct_calls.append((grid, a))

    def jit_getitem(self, grid):
        def launch(*a, **kw):
            jit_calls.append((grid, a, kw))
            return Compiled()
        return launch

    assert isinstance(_probe, triton.runtime.JITFunction), "run the CPU tests without TRITON_INTERPRET"
    _probe.__class__ = type("RecordingJIT", (type(_probe),), {"__getitem__": jit_getitem})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert launch.direct_launch_supported()
    module = types.SimpleNamespace(_probe=_probe)
    launcher = launch._Launcher(module, "_probe")
    buf = torch.zeros(64, dtype=torch.uint8)
    aligned = buf[(-buf.data_ptr()) % 16:][:32]
    assert aligned.data_ptr() % 16 == 0
    launcher((3,), (aligned, 32, 5), (("A", 1),), 4)
    assert len(jit_calls) == 1 and not direct_calls
    launcher((4,), (aligned, 48, 7), (("A", 1),), 4)  # same specialisation (48 % 16 == 0, 7 neither 1 nor % 16)
    assert len(jit_calls) == 1 and direct_calls == [((4, 1, 1), (aligned, 48, 7, 1, 7))]
    variants = [
        ((aligned[1:], 32, 5), (("A", 1),), 4),  # misaligned pointer
        ((aligned.view(torch.int8), 32, 5), (("A", 1),), 4),  # other dtype
        ((aligned, 33, 5), (("A", 1),), 4),  # not % 16
        ((aligned, 32, 1), (("A", 1),), 4),  # == 1
        ((aligned, 32, 2**31), (("A", 1),), 4),  # 64-bit
        ((aligned, 32, 5), (("A", 2),), 4),  # constexpr
        ((aligned, 32, 5), (("A", 1), ("B", 3)), 4),  # constexpr default overridden
        ((aligned, 32, 5), (("A", 1),), 8),  # num_warps
    ]
    for k, (args, consts, warps) in enumerate(variants):
        launcher((1,), args, consts, warps)
        assert len(jit_calls) == 2 + k, f"variant {k} reused a kernel of another specialisation"
    launcher((1,), (aligned, 32, 5), (("A", 1), ("B", 3)), 4)
    assert direct_calls[-1] == ((1, 1, 1), (aligned, 32, 5, 1, 3))
    from mxkit.kernels.launch import triton_launch_only

    with triton_launch_only():  # off: Triton's path every time
        launcher((1,), (aligned, 32, 5), (("A", 1),), 4)
    assert len(jit_calls) == 2 + len(variants)
    # args_launch keeps one ArgsLaunch a specialisation; private_args_launch makes a new one each time (its block
    # its caller's), leaving the kept one; neither before the specialisation ran, nor with direct launches off
    made = []
    monkeypatch.setattr(launch.ArgsLaunch, "make", classmethod(lambda cls, k, a, g: made.append(k) or object()))
    spec = ((1,), (aligned, 64, 9), (("A", 5),), 4)
    assert launcher.args_launch(*spec) is None and launcher.private_args_launch(*spec) is None and not made
    launcher(*spec)
    kept = launcher.args_launch(*spec)
    assert kept is not None and launcher.args_launch(*spec) is kept and len(made) == 1
    own = [launcher.private_args_launch(*spec) for _ in range(2)]
    assert len(made) == 3 and len({id(o) for o in own + [kept]}) == 3 and launcher.args_launch(*spec) is kept
    with triton_launch_only():
        assert launcher.args_launch(*spec) is None and launcher.private_args_launch(*spec) is None


def test_launch_grid_limits():
    """The 3-D launch grid (tile indices straight from the program ids) only where CUDA allows it: dims 1 and
    2 up to 65535, dim 0 up to 2^31 - 1; else the 1-D grid of every tile, which the kernel splits."""
    assert kq._grid(256, 64, 1, True) == ((256, 64, 1), True)
    assert kq._grid(2, 65535, 65535, True) == ((2, 65535, 65535), True)
    assert kq._grid(2, 65536, 1, True) == ((2 * 65536,), False)
    assert kq._grid(1, 3, 65536, True) == ((3 * 65536,), False)
    assert kq._grid(2**31, 1, 1, True) == ((2**31,), False)
    assert kq._grid(256, 64, 3, False) == ((256 * 64 * 3,), False)
    # the planned launches: columnwise FP6 of 4 x 4096 x 4096 (128 x 64 tiles: the 3-D grid), of 2^23 x 64 (65536
    # row tiles: 1-D), of 4096^2 (below 2^26 elements: 1-D), columnwise FP8 (1-D)
    plan = kq._quantize_plan((4, 4096, 4096), torch.bfloat16, "mxfp6_e2m3", 1, "floor", "rne", "plain", None)
    assert plan.grid == (64, 32, 4) and dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((2**23, 64), torch.bfloat16, "mxfp6_e2m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (65536,) and not dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((4096, 4096), torch.bfloat16, "mxfp6_e2m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (64 * 32,) and not dict(plan.consts)["GRID3"]
    plan = kq._quantize_plan((4096, 4096), torch.bfloat16, "mxfp8_e4m3", 0, "floor", "rne", "plain", None)
    assert plan.grid == (64 * 16,) and not dict(plan.consts)["GRID3"]


def test_launch_spec_of_a_tensor_descriptor():
    """The direct launch's specialisation key of a host TensorDescriptor (Gluon / TMA): the base's dtype, block
    shape and shared layout, with the base's and the strides' 16-byte alignment; ints and tensors as Triton
    specialises them."""
    import types

    from mxkit.kernels.launch import _Launcher

    base = torch.empty(64, 96, dtype=torch.bfloat16)
    desc = types.SimpleNamespace(base=base, block_shape=[32, 64], layout="nvmma128", strides=[96, 1], shape=[64, 96])
    spec = _Launcher._spec(desc)
    assert spec == ("desc", torch.bfloat16, (32, 64), "nvmma128", base.data_ptr() % 16 == 0, (True, False))
    assert _Launcher._spec(desc) == spec and hash(spec) == hash(_Launcher._spec(desc))
    assert _Launcher._spec(types.SimpleNamespace(**{**vars(desc), "strides": [100, 1]}))[-1] == (False, False)
    assert _Launcher._spec(16) == (False, True, True) and _Launcher._spec(1) == (True, False, True)
    assert _Launcher._spec(2**40)[2] is False


def test_env_reads_follow_os_environ(monkeypatch):
    """kernels._env.env (the hot paths' A/B switches, read per call) sees what os.environ holds after each change:
    set, changed, removed, unset with a default; the same values os.environ.get gives."""
    import os

    from mxkit.kernels._env import env

    name = "MXKIT_TEST_ENV_READ"
    monkeypatch.delenv(name, raising=False)
    assert env(name) is None and env(name, "d") == "d"
    for value in ("1", "128,256", "fit", ""):
        monkeypatch.setenv(name, value)
        assert env(name) == os.environ.get(name) == value
    os.environ[name] = "x"
    assert env(name, "d") == "x"
    del os.environ[name]
    assert env(name) is None and env(name, "d") == "d"


def test_driver_lookups_are_kept():
    """The CUDA driver lookups that every new GEMM plan and launch consults are computed once per argument set
    (functools caches): the PTX availability check (which reads the file and loads the module), the module and
    kernel handles and the SM count. An uncached one goes unnoticed on the CPU and in the GPU tests' results, but
    costs each new plan host time (a decorator once lost its function this way in a refactor)."""
    from mxkit.kernels import cuda_driver as cd

    for f in (cd.shipped_ptx_unavailable, cd.shipped_kernel, cd._module, cd.sm_count, cd._libcuda):
        assert callable(getattr(f, "cache_info", None)) and callable(getattr(f, "cache_clear", None)), f
