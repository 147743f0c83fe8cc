"""The schedule: configs, their heuristics, the per-GPU table and its override (:mod:`mxkit.kernels.opt_flags`,
:mod:`mxkit.kernels.opt_flags_nvidia`). Pure functions of the problem, tested without a GPU; the configs' bytes
are tested by the kernel test files."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEV, SKIP_REASON_CUDA, assert_bytes_equal, rand_tensor

from mxkit.kernels import opt_flags, opt_flags_nvidia
from mxkit.kernels import quantize as kq
from mxkit.reference import quantize_reference


def test_int64_guard_is_a_function_of_shapes():
    kq = opt_flags
    assert not kq.needs_int64(2**31 - 1)
    assert kq.needs_int64(2**31)
    # 2^31 elements on the quantized axis's view, rowwise, columnwise and cast-transpose
    assert kq.quantize_config(1, 2**16, 2**15, True, False, "mxfp4").int64
    assert kq.quantize_config(2, 2**15, 2**15, False, True, "mxfp8").int64
    assert kq.quantize_config(1, 2**16, 2**15, True, True, "mxfp8").int64
    assert not kq.quantize_config(1, 8192, 8192, True, False, "mxfp4").int64
    # tile padding counts: 65535 rows of 32768 fit, but a padded tile grid reaches past 2^31
    assert kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").int64 == (
        -(-65535 // kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").block_r)
        * kq.quantize_config(1, 65535, 32768, True, False, "mxfp8").block_r * 32768 > 2**31 - 1
    )
    # programs walking rblocks tiles down R pad R to block_r * rblocks: 2^31 - 2^15 elements of FP6 in
    # 65535 rows fit, the 32-row span pads past 2^31
    c6 = kq.quantize_config(1, 65535, 32768, True, False, "mxfp6")
    assert c6.rblocks > 1 and c6.int64 and not kq.quantize_config(1, 65535 - 32, 32768, True, False, "mxfp6").int64
    assert kq.dequantize_config(1, 2**16, 2**15, False, "mxfp4").int64
    assert not kq.dequantize_config(4, 1024, 1024, True, "mxfp4").int64


def test_gpu_tuning_table():
    """GPU_TUNING (immutable: a tuple of frozen entries) replaces fields of the default config for its GPU, path,
    format and size only, re-derives int64 for the new tile span, and reaches the launch plan through the device
    name."""
    qc = opt_flags.quantize_config
    assert isinstance(opt_flags.GPU_TUNING, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt_flags.GPU_TUNING[0].fields = ()
    base = qc(1, 8192, 8192, True, True, "mxfp4_e2m1")
    assert base.rblocks == 1
    assert qc(1, 8192, 8192, True, True, "mxfp4_e2m1", gpu="NVIDIA H200") == dataclasses.replace(base, rblocks=2)
    assert qc(1, 8192, 8192, True, True, "mxfp4_e2m1", gpu="NVIDIA H100 80GB HBM3") == base
    assert qc(1, 4096, 4096, True, True, "mxfp4_e2m1", gpu="NVIDIA H200").rblocks == 1  # < 2^26
    # names match exactly, as the GEMM table's: the NVL part (other memory, other clocks) was not measured
    assert qc(1, 8192, 8192, True, True, "mxfp4_e2m1", gpu="NVIDIA H200 NVL") == base
    for args in ((1, 8192, 8192, True, True, "mxfp8_e4m3"), (1, 8192, 8192, True, False, "mxfp4_e2m1"),
                 (1, 8192, 8192, False, True, "mxfp4_e2m1")):
        assert qc(*args, gpu="NVIDIA H200") == qc(*args)
    # 65472 rows are 1023 tiles of 64 (65472 * 32768 < 2^31 elements), but 512 spans of two tiles pad to 2^31
    assert not qc(1, 65472, 32768, True, True, "mxfp4_e2m1").int64
    assert qc(1, 65472, 32768, True, True, "mxfp4_e2m1", gpu="NVIDIA H200").int64
    plan = kq._quantize_plan((8192, 8192), torch.bfloat16, "mxfp4_e2m1", None, "floor", "rne", "plain", None,
                             "NVIDIA H200")
    assert dict(plan.consts)["RB"] == 2 and plan.grid == (64 * 32,)
    assert kq._gpu_name(torch.zeros(1)) == ""
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2"):  # the H100's FP8 cast-transpose tile, from 2^26 elements
        base = qc(1, 8192, 8192, True, True, fmt)
        assert qc(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H100 PCIe") == base  # (measured on the SXM part)
        got = qc(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H100 80GB HBM3")
        assert got == dataclasses.replace(base, block_r=64, num_warps=8) and base.block_r == 32
        assert qc(1, 4096, 8192, True, True, fmt, gpu="NVIDIA H100 80GB HBM3") == qc(1, 4096, 8192, True, True, fmt)
        assert qc(1, 8192, 8192, True, True, fmt, gpu="NVIDIA H200") == base
    for fmt in ("mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"):  # the H100's rowwise FP4 / FP6: one tile per program
        base = qc(1, 16384, 16384, True, False, fmt)
        got = qc(1, 16384, 16384, True, False, fmt, gpu="NVIDIA H100 80GB HBM3")
        assert base.rblocks == (2 if fmt == "mxfp4_e2m1" else 4) and got == dataclasses.replace(base, rblocks=1)
        assert qc(1, 16384, 16384, True, False, fmt, gpu="NVIDIA H200") == base


def test_override_replaces_the_choice_and_clears_the_caches():
    """override() (A/B runs): the table and forced fields take effect at once, also on plans cached before the
    block (no stale config), and everything is back on exit, also after an exception."""
    qc = opt_flags.quantize_config
    shape, args = (8192, 8192), (1, 8192, 8192, True, False, "mxfp4_e2m1")
    base, plan = qc(*args), kq._quantize_plan(shape, torch.bfloat16, "mxfp4_e2m1", -1, "floor", "rne", "plain", None)
    assert base.rblocks == 2 and dict(plan.consts)["RB"] == 2
    with opt_flags.override(quantize={"rblocks": 1}):
        assert qc(*args) == dataclasses.replace(base, rblocks=1)
        p = kq._quantize_plan(shape, torch.bfloat16, "mxfp4_e2m1", -1, "floor", "rne", "plain", None)
        assert dict(p.consts)["RB"] == 1 and p.grid[0] == 2 * plan.grid[0]
    assert qc(*args) == base
    assert kq._quantize_plan(shape, torch.bfloat16, "mxfp4_e2m1", -1, "floor", "rne", "plain",
                             None).consts == plan.consts
    entry = opt_flags.TuningEntry(gpu="Test GPU", path="rows", fmt="mxfp4_e2m1", min_elements=0,
                                  fields=(("rblocks", 2),))
    with pytest.raises(RuntimeError, match="^leave the override by an exception$"):  # (no other RuntimeError)
        with opt_flags.override(table=(entry,)):
            assert qc(1, 4096, 1280, True, False, "mxfp4_e2m1", gpu="Test GPU").rblocks == 2
            assert qc(1, 4096, 1280, True, False, "mxfp4_e2m1", gpu="Test GPU X").rblocks == 1  # (exact names)
            assert qc(1, 4096, 1280, True, False, "mxfp4_e2m1").rblocks == 1
            assert qc(*args, gpu="NVIDIA H100 80GB HBM3") == base  # (the table in force replaces GPU_TUNING)
            raise RuntimeError("leave the override by an exception")
    assert qc(1, 4096, 1280, True, False, "mxfp4_e2m1", gpu="Test GPU").rblocks == 1
    with pytest.raises(TypeError, match="no_such_field"):
        with opt_flags.override(quantize={"no_such_field": 1}):
            pass
    with opt_flags.override(dequantize={"num_warps": 8}):
        assert opt_flags.dequantize_config(1, 64, 4096, False, "mxfp8_e4m3").num_warps == 8
    assert opt_flags.dequantize_config(1, 64, 4096, False, "mxfp8_e4m3").num_warps == 1
    # the GEMMs' prepared calls (keyed by the dispatch-table token; their bound dequantize launches carry a config)
    # are made apart inside the block, and those made before serve again after it
    from mxkit.kernels.matmul_table import _table_token

    before = _table_token()
    with opt_flags.override(dequantize={"num_warps": 8}):
        inside = _table_token()
        with opt_flags.override():
            assert _table_token() not in (before, inside)
    assert inside != before and _table_token() == before


@pytest.mark.parametrize("kw, error, match", [
    ({"quantize": {"block_r": 0}}, ValueError, r"QuantizeConfig\.block_r must be an int, a power of two, got 0"),
    ({"quantize": {"block_c": 96}}, ValueError, "block_c must be an int, a power of two, got 96"),
    ({"quantize": {"rblocks": 0}}, ValueError, "rblocks must be an int, >= 1, got 0"),
    ({"quantize": {"rblocks": True}}, ValueError, "rblocks must be an int"),
    ({"quantize": {"col_units": 1}}, ValueError, "col_units must be an int, 0 or 2, got 1"),
    ({"quantize": {"hw_cvt": 1}}, ValueError, "hw_cvt must be a bool, got 1"),
    ({"quantize": {"split_rows": (64, 100, 4)}}, ValueError, "split_rows must be"),
    ({"quantize": {"split_rows": (64, 128)}}, ValueError, "split_rows must be"),
    ({"quantize": {"resolved": True}}, TypeError, r"\['resolved'\] are set by resolution"),
    ({"dequantize": {"num_warps": 3}}, ValueError, r"DequantizeConfig\.num_warps must be an int, 1, 2, 4"),
    ({"dequantize": {"block_l": 48}}, ValueError, "block_l must be an int, a power of two"),
    ({"table": ("not an entry",)}, TypeError, "table must hold TuningEntry items, got str"),
    ({"table": (opt_flags.TuningEntry("G", "rows", "mxfp4_e2m1", 0, (("block_r", 3),)),)}, ValueError,
     "block_r must be an int, a power of two, got 3"),
])
def test_override_refuses_values_the_kernels_cannot_take(kw, error, match):
    """A forced value is checked on entry (block_r=0 once failed later, in the plan, with ZeroDivisionError), and
    a refused override leaves the state and the caches as they were."""
    qc = opt_flags.quantize_config
    base = qc(1, 4096, 1280, True, False, "mxfp4_e2m1")
    state = opt_flags._active
    with pytest.raises(error, match=match):
        with opt_flags.override(**kw):
            pytest.fail("entered")
    assert opt_flags._active is state and qc(1, 4096, 1280, True, False, "mxfp4_e2m1") == base
    with opt_flags.override(quantize={"split_rows": [2, 64, 4], "rblocks": 2, "hw_cvt": False}):  # (JSON's list)
        assert opt_flags._active.quantize[0] == ("split_rows", (2, 64, 4))


def test_configs_are_pure_and_frozen():
    """A config is a function of the problem alone (the same value when computed afresh, the caches cleared in
    between), frozen, hashable, and holds only immutable values; the heuristics build it by keyword."""
    problems = [((1, 727, 608, True, False, "mxfp8"), {}), ((3, 96, 50, False, True, "mxfp6"), {}),
                ((1, 64, 64, True, True, "mxfp4"), {}), ((1, 8192, 8192, True, True, "mxfp4_e2m1"),
                                                         {"gpu": "NVIDIA H200"})]
    first = [opt_flags.quantize_config(*a, **kw) for a, kw in problems]
    opt_flags.quantize_config.cache_clear()
    again = [opt_flags.quantize_config(*a, **kw) for a, kw in problems]
    assert first == again and all(x is not y for x, y in zip(first, again))
    d1 = opt_flags.dequantize_config(1, 64, 4096, False, "mxfp4")
    opt_flags.dequantize_config.cache_clear()
    assert opt_flags.dequantize_config(1, 64, 4096, False, "mxfp4") == d1
    for cfg in first + [d1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.num_warps = 1
        hash(cfg)
        assert all(isinstance(v, (bool, int, tuple)) for v in dataclasses.astuple(cfg)), cfg
    for cfg in first:
        assert cfg.block_r & (cfg.block_r - 1) == 0 and cfg.block_c & (cfg.block_c - 1) == 0


def test_resolved_config_says_what_runs():
    """Given the input dtype and the rounding, quantize_config returns a resolved config whose fields are the
    paths that run (the plan's constexprs read them one to one); the schedule alone (no dtype) is unresolved."""
    qc = opt_flags.quantize_config
    sched = qc(1, 4096, 4096, True, False, "mxfp4_e2m1")
    assert not sched.resolved and sched.fp4_pairs and sched.hw_cvt
    bf = qc(1, 4096, 4096, True, False, "mxfp4_e2m1", dtype=torch.bfloat16, rounding="rne")
    assert bf.resolved and bf.hw_cvt and bf.fp4_pairs and bf.hw_cvt_rows
    for kw in ({"dtype": torch.float32, "rounding": "rne"}, {"dtype": torch.bfloat16, "rounding": "away"},
               {"dtype": torch.bfloat16, "rounding": "rne", "asm": False}):
        c = qc(1, 4096, 4096, True, False, "mxfp4_e2m1", **kw)
        assert c.resolved and not (c.hw_cvt or c.fp4_pairs or c.hw_cvt_rows), kw
    # FP6 cast-transpose from bf16: pairs in both directions (so no 16-byte FP6 asm); from fp32: the split kernel
    ct = qc(1, 4096, 4096, True, True, "mxfp6_e2m3", dtype=torch.bfloat16, rounding="rne")
    assert ct.fp6_pairs_rows and ct.fp6_pairs_cols and not ct.fp6_asm and not ct.split_rows
    sp = qc(1, 4096, 4096, True, True, "mxfp6_e2m3", dtype=torch.float32, rounding="rne")
    assert sp.split_rows and not (sp.fp6_pairs_rows or sp.fp6_pairs_cols) and sp.hw_cvt_rows
    # scales written transposed only in the plain layout
    big = dict(dtype=torch.bfloat16, rounding="rne")
    assert qc(1, 8192, 8192, True, True, "mxfp8_e4m3", **big).scale_t
    assert not qc(1, 8192, 8192, True, True, "mxfp8_e4m3", scale_layout="nvidia_128x4", **big).scale_t
    # resolving a resolved config changes nothing; the plan's constexprs are its fields
    from mxkit.formats import get_format

    assert opt_flags_nvidia.resolve_quantize(bf, 1, 4096, 4096, True, False, get_format("mxfp4_e2m1"),
                                             torch.float32, "away") is bf
    d = dict(kq._quantize_plan((4096, 4096), torch.bfloat16, "mxfp4_e2m1", -1, "floor", "rne", "plain",
                               None).consts)
    assert (d["HW_CVT"], d["PAIRS"], d["BLOCK_R"], d["BLOCK_C"], d["RB"]) == (
        bf.hw_cvt, bf.fp4_pairs, bf.block_r, bf.block_c, bf.rblocks)
    dq = opt_flags.dequantize_config(1, 64, 4096, False, "mxfp4_e2m1", torch.float32, resolve=True)
    assert dq.resolved and dq.hw_dec and not dq.fp4_asm  # (the FP4 word asm writes 16-bit outputs only)
    assert not opt_flags.dequantize_config(1, 64, 4096, False, "mxfp4_e2m1").resolved


def test_row_tiles_of_padded_rows():
    """Rows that 1024-wide tiles would pad by more than 1/8 take narrower tiles, one per program (rowwise quantize:
    FP8 8 x 512, FP4 / FP6 as many elements as the 1024-wide tile), and the 2-D tiles (dequantize; FP8 only below
    2048 elements); the others keep the 1024-wide tiles, whose programs walk 2 / 4 tiles down R from 16384 tiles.
    Shorter rows: FP4 / FP6 narrow only where a 256-wide tile pads them less than their tile (544, 640, 768)."""
    kq = opt_flags
    widths = {1024: 1024, 1056: 256, 1152: 256, 1280: 256, 1536: 512, 2048: 1024, 2080: 256, 2560: 512,
              2880: 1024, 3584: 512, 5760: 1024, 8192: 1024}
    assert {L: opt_flags_nvidia._row_width(L) for L in widths} == widths
    for L, w in widths.items():
        c8, c4, c6 = (kq.quantize_config(1, 16384, L, True, False, f)
                      for f in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3"))
        assert (c8.block_r, c8.block_c, c8.num_warps) == ((8, 1024, 8) if w == 1024 else (8, 512, 4)), L
        assert (c4.block_c, c4.block_r * c4.block_c, c4.num_warps) == (w, 1024, 1), L
        assert (c6.block_c, c6.block_r * c6.block_c, c6.num_warps, c6.fp6_pairs) == (w, 2048, 2, True), L
        assert c4.rblocks == (2 if w == 1024 else 1) and c6.rblocks == (4 if w == 1024 and L > 1024 else 1), L
        d4, d8 = (kq.dequantize_config(1, 16384, L, False, f) for f in ("mxfp4_e2m1", "mxfp8_e4m3"))
        assert (d4.block_n == 1) == (w == 1024) and d4.fp4_asm, L
        assert (d8.block_n == 1) == (w == 1024 or L >= 2048), L
    assert kq.quantize_config(1, 1024, 2048, True, False, "mxfp6_e2m3").rblocks == 1  # (1024 tiles)
    # FP6 from fp32 past 1024 (no bf16 pairs): 4 x 512 tiles, or 8 x 256 where those pad less
    c6 = kq.quantize_config(1, 16384, 1056, True, False, "mxfp6_e2m3", in_bf16=False)
    assert (c6.block_r, c6.block_c, c6.rblocks, c6.fp6_pairs) == (8, 256, 1, False)
    assert kq.quantize_config(1, 16384, 2048, True, False, "mxfp6_e2m3", in_bf16=False).block_c == 512
    # shorter rows, (block_r, block_c, num_warps, rblocks) of FP8 / FP4 / FP6 at 32768 rows
    short = {384: ((16, 256, 4, 1), (4, 512, 2, 1), (4, 512, 2, 1)),  # (256-wide tiles pad 384 as much as 512)
             512: ((16, 256, 4, 1), (4, 512, 2, 1), (4, 512, 2, 1)),
             544: ((16, 256, 4, 1), (4, 256, 1, 1), (8, 256, 2, 1)),
             768: ((16, 256, 4, 1), (4, 256, 1, 1), (8, 256, 2, 1)),
             800: ((16, 256, 4, 1), (2, 1024, 2, 4), (4, 512, 2, 4))}  # (25 blocks: no narrower tile fits better)
    for C, want in short.items():
        got = tuple((c.block_r, c.block_c, c.num_warps, c.rblocks) for c in (
            kq.quantize_config(1, 32768, C, True, False, f) for f in ("mxfp8_e4m3", "mxfp4_e2m1", "mxfp6_e2m3")))
        assert got == want, C


@pytest.mark.gpu
def test_gpu_tuning_entries_match_reference(rng, poison):
    """Every GPU_TUNING entry, whichever GPU runs the test (the launcher applies an entry only on its own GPU and
    from its size on): the entry's fields on the default config of a ragged problem past the entry's size (tiles
    and spans that do not divide it) and of a small one, both scale modes, bf16 with NaN / Inf / subnormal blocks,
    give the reference's bytes in both directions."""
    from mxkit.kernels import quantize as kq

    if DEV != "cuda":
        pytest.skip(SKIP_REASON_CUDA)  # (2^26 elements: too many for the interpreter)
    for e in opt_flags.GPU_TUNING:
        prefix, path, fmt, least, fields = e.gpu, e.path, e.fmt, e.min_elements, dict(e.fields)
        assert path in ("cast_transpose", "rows"), path  # (the paths with entries so far)
        ct = path == "cast_transpose"
        for shape in ((8224, 8224), (3, 320, 544)):
            B, R, C = (1, *shape) if len(shape) == 2 else shape
            assert len(shape) == 3 or B * R * C >= least
            cfg = dataclasses.replace(kq.quantize_config(B, R, C, True, ct, fmt), **fields)
            x = rand_tensor(shape, -1, generator=rng, dtype=torch.bfloat16, nonfinite=True).to(DEV)
            for mode in ("floor", "rceil"):
                if ct:
                    qr, sr, qc, sc = kq._cast_transpose_impl(x, fmt, mode, "rne", "plain", cfg)
                    outs = (((qr, sr), -1), ((qc, sc), -2))
                else:
                    outs = ((kq._quantize_impl(x, fmt, -1, mode, "rne", "plain", cfg), -1),)
                for (q, s), a in outs:
                    ref = quantize_reference(x, fmt, axis=a, scale_mode=mode)
                    what = f"{prefix} {fmt} {fields} {shape} {mode} axis={a}"
                    assert_bytes_equal(q, ref.qdata, what + " qdata")
                    assert_bytes_equal(s, ref.scale, what + " scale")
