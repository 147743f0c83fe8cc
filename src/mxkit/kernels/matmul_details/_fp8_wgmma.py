"""FP8 rowwise-scaled GEMM on Hopper wgmma (``fp8-wgmma``), dense and grouped: the fold paths' GEMM (issue #22's
MXFP4 weights folded exactly to E4M3 rows with one power-of-two scale a row; FP8 E4M3 rowwise activations).

    y[m, n] = round((sum_k a[m, k] * b[n, k]) * sb[n] * sa[m])       (float32 sums, one rounding to ``out``)

``a`` [M, K] and ``b`` [N, K] (grouped: [E * N, K], expert e's rows at e * N) float8_e4m3fn, K-major (both
wgmma operands from shared memory: FP8 wgmma takes K-major operands only); ``sa`` [M] / ``sb`` [N] (grouped
[E * N]) float32. The semantics of ``torch._scaled_mm`` / ``torch._scaled_grouped_mm`` with rowwise scales (the
peers and the reference twin, :func:`fp8_gemm_reference`). The epilogue applies sb first, which on the fold
paths is a power of two in 2^+-54 (exact: the accumulator stays normal), so that a row scale sa of any magnitude
(an FP8 rowwise token's amax / 448) is rounded once; where sa lies in 2^+-54 too, applying sa first gives the
same bytes.

Accumulation: Hopper's FP8 wgmma adds products into its accumulator with ~14 bits (DeepSeek-V3 sec. 3.3.2), so
each 128-column step (four wgmma) is summed in a zeroed partial accumulator and added to the float32 one (as Triton's
``max_num_imprecise_acc``; CUTLASS's promotion interval of 4): the bytes of cuBLAS's FP8 GEMMs without fast
accumulation on GPT-OSS's grouped shapes and 8192^3 (H200, ``benchmarks/probes/fp8_wgmma_ab.py``).

Schedule: persistent (one program an SM over the output tiles, the launch order grouping ``GROUP_M`` tiles along
M so that they share b's tiles in L2) and warp-specialized: one producer warp brings each step's [128, 128] tiles
of a and b into a ring of ``STAGES`` shared-memory slots by TMA; two consumer warpgroups, each its own partition,
multiply 64 rows of the tile each, hand the slots back through ``empty`` mbarriers (both arrive) and run the
tile's epilogue (scales, rounding, a layout of 16-byte stores, masked store) while the producer already loads the
next tile. The two warpgroups issue their steps' wgmma groups in turn (an mbarrier pair, ``order``): one
warpgroup's promotion adds then run under the other's wgmma, where left alone the two issue, finish and add
together (Nsight, 8192^3: tensor pipe 62% -> 78% of peak; 990 -> 846 us).

Grouped (MoE): the rows of ``a`` are sorted by expert, expert e's group the rows [start_e, end_e); the tile table
(:func:`tile_table`, made on the device from the group ends: no host sync) lists (e, first row, end row) per
128-row tile; a tile's rows past its group's end are computed (from the next group's rows, or TMA's zero fill
past M) and not stored. Unlike the w4a16-wgmma kernel the groups need no padding to the tile.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import torch
import triton
import triton.language as tl

from .._env import choice
from ..launch import _Launcher
from . import _w4a16_wgmma
from ..cuda_driver import sm_count as _sm_count
from ._wgmma_gluon import gluon as _gluon, launch_order as _launch_order
from ._wgmma_gluon import tma_load as _tma_load

BM, BN, BK = 128, 128, 128  # a tile: rows of a (two warpgroups of 64), rows of b, K columns a step (4 wgmma)
STAGES = 5    # slots of the TMA ring (32 KB each; with the epilogue's two 16 KB layout conversions, 192 KB)
GROUP_M = 8   # tiles along M that share b's tiles in L2 (launch order)


@functools.lru_cache(maxsize=None)
def _kernel():
    """Build the Gluon kernel (once; needs Triton's Gluon). The tile shape, the launch order's group and the
    accumulator and store layouts reach it as closure constexprs (:func:`_layouts`); its constexpr arguments are
    STAGES, GROUPED and PRECISE."""
    gluon, gl, mbarrier, _, warpgroup_mma, warpgroup_mma_wait, _ = _gluon()
    tma_load = _tma_load()
    # (a module global is no constexpr in a kernel; a closure's constexpr is)
    KT, BMc, BNc, GROUP = gl.constexpr(BK), gl.constexpr(BM), gl.constexpr(BN), gl.constexpr(GROUP_M)
    ACC, OUT = (gl.constexpr(v) for v in _layouts())
    launch_order = _launch_order()

    @gluon.jit
    def _tile(tile, t_ptr, M, N, NT, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr,
              GROUPED: gl.constexpr):
        # output tile `tile` of the launch order: (expert (-1: an unused table row), first row, end row, first column)
        pid_m, pid_n = launch_order(tile, NT if GROUPED else gl.cdiv(M, BM), gl.cdiv(N, BN), GROUP)
        if GROUPED:
            e = gl.load(t_ptr + 3 * pid_m)
            m0 = gl.load(t_ptr + 3 * pid_m + 1)
            m1 = gl.load(t_ptr + 3 * pid_m + 2)
        else:
            e = pid_m * 0
            m0 = pid_m * BM
            m1 = gl.minimum(m0 + BM, M)
        return e, m0, m1, pid_n * BN

    @gluon.jit
    def _produce(a_desc, b_desc, a_smem, b_smem, ready, empty, t_ptr, M, N, NT, KSTEPS, STAGES: gl.constexpr,
                 BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr, GROUPED: gl.constexpr):
        # the TMA producer (one warp): ring step c into slot c % STAGES once both consumers freed it
        NBYTES: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        n_tiles = (NT if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BN)
        c = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, m0, m1, off_n = _tile(tile, t_ptr, M, N, NT, BM, BN, GROUP, GROUPED)
            if e >= 0:
                for k in range(KSTEPS):
                    sl = c % STAGES
                    mbarrier.wait(empty.index(sl), ((c // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(sl), NBYTES)
                    tma_load(a_desc, [m0, k * KT], ready.index(sl), a_smem.index(sl))
                    tma_load(b_desc, [e * N + off_n, k * KT], ready.index(sl), b_smem.index(sl))
                    c += 1

    @gluon.jit
    def _epilogue(acc, y_ptr, sa_ptr, sb_ptr, e, m0, m1, off_n, N, stride_ym, BM: gl.constexpr, BN: gl.constexpr,
                  ACC: gl.constexpr, OUT: gl.constexpr):
        # the scales (acc * sb[n] * sa[m] in float32: the weight's power of two first, module docstring), the one
        # rounding, then the tile moved to OUT
        # (8 consecutive columns a thread: 16-byte stores; 8% faster than the accumulator layout's 4-byte ones)
        # and stored where its rows are the group's
        m_a = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC))
        sa = gl.load(sa_ptr + m_a, mask=m_a < m1, other=0.0)
        n_a = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC))
        sb = gl.load(sb_ptr + e * N + n_a, mask=n_a < N, other=0.0)
        out = gl.convert_layout((acc * gl.expand_dims(sb, 0) * gl.expand_dims(sa, 1)).to(y_ptr.dtype.element_ty), OUT)
        m_o = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, OUT))
        n_o = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, OUT))
        ptr = y_ptr + gl.expand_dims(m_o.to(gl.int64) * stride_ym, 1) + gl.expand_dims(n_o, 0)
        gl.store(ptr, out, mask=gl.expand_dims(m_o < m1, 1) & gl.expand_dims(n_o < N, 0))

    @gluon.jit
    def _consume(a_smem, b_smem, ready, empty, order, y_ptr, sa_ptr, sb_ptr, t_ptr, M, N, NT, KSTEPS, stride_ym,
                 STAGES: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr,
                 GROUPED: gl.constexpr, ACC: gl.constexpr, OUT: gl.constexpr, PRECISE: gl.constexpr,
                 ROW0: gl.constexpr):
        # a consumer warpgroup: rows ROW0 .. ROW0 + BM / 2 of each tile (the other partition has the other half;
        # as two partitions the warpgroups need no common barrier, so one's promotion adds run under the other's
        # wgmma: GPT-OSS-120B's grouped gate_up at 16384 tokens 2849 -> 2601 us against one 8-warp partition)
        HM: gl.constexpr = BM // 2
        ME: gl.constexpr = ROW0 // HM  # (which warpgroup: the order barrier it waits on)
        n_tiles = (NT if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BN)
        c = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, m0, m1, off_n = _tile(tile, t_ptr, M, N, NT, BM, BN, GROUP, GROUPED)
            if e >= 0:
                acc = gl.zeros([HM, BN], gl.float32, layout=ACC)
                for k in range(KSTEPS):
                    sl = c % STAGES
                    mbarrier.wait(ready.index(sl), (c // STAGES) & 1)
                    a = a_smem.index(sl).slice(ROW0, HM)
                    if PRECISE:
                        # the step's four wgmma into a zeroed partial accumulator, added once (the promotion), and
                        # issued only after the other warpgroup issued its previous step's: the two groups then
                        # queue one after the other and each warpgroup's adds run under the other's wgmma (left to
                        # themselves the two issue together, finish together and add together: 990 -> 846 us at
                        # 8192^3, 2732 -> 2381 on GPT-OSS-120B's grouped gate_up at 16384 tokens)
                        mbarrier.wait(order.index(ME), c & 1)
                        part = warpgroup_mma(a, b_smem.index(sl).permute((1, 0)), acc, use_acc=False, is_async=True)
                        mbarrier.arrive(order.index(1 - ME))
                        part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                        mbarrier.arrive(empty.index(sl))
                        acc = acc + part
                    else:  # fast accumulation (A/B runs): one wgmma group in flight, step c - 1's slot freed
                        acc = warpgroup_mma(a, b_smem.index(sl).permute((1, 0)), acc, is_async=True)
                        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=k > 0)
                    c += 1
                if not PRECISE:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES))
                _epilogue(acc, y_ptr, sa_ptr, sb_ptr, e, m0 + ROW0, m1, off_n, N, stride_ym, HM, BN, ACC, OUT)
        return ()

    @gluon.jit
    def fp8_wgmma_kernel(a_desc, b_desc, y_ptr, sa_ptr, sb_ptr, t_ptr, M, N, NT, KSTEPS, stride_ym,
                         STAGES: gl.constexpr, GROUPED: gl.constexpr, PRECISE: gl.constexpr, num_warps: gl.constexpr):
        a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BMc, KT], a_desc.layout)
        b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BNc, KT], b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)  # (each consumer warpgroup frees the slot)
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(order.index(0), count=1)
        mbarrier.init(order.index(1), count=1)
        mbarrier.arrive(order.index(0))  # (warpgroup 0 issues the first step's wgmma)
        gl.warp_specialize([(_consume, (a_smem, b_smem, ready, empty, order, y_ptr, sa_ptr, sb_ptr, t_ptr, M, N, NT,
                                        KSTEPS, stride_ym, STAGES, BMc, BNc, GROUP, GROUPED, ACC, OUT, PRECISE, 0)),
                            (_consume, (a_smem, b_smem, ready, empty, order, y_ptr, sa_ptr, sb_ptr, t_ptr, M, N, NT,
                                        KSTEPS, stride_ym, STAGES, BMc, BNc, GROUP, GROUPED, ACC, OUT, PRECISE,
                                        BMc // 2)),
                            (_produce, (a_desc, b_desc, a_smem, b_smem, ready, empty, t_ptr, M, N, NT, KSTEPS, STAGES,
                                        BMc, BNc, GROUP, GROUPED))], [4, 1], [232, 24])
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))
        mbarrier.invalidate(order.index(0))
        mbarrier.invalidate(order.index(1))

    return fp8_wgmma_kernel


@functools.lru_cache(maxsize=None)
def _layouts():
    """(a consumer warpgroup's accumulator layout [BM / 2, BN], its store layout: 8 columns a thread)."""
    gl = _gluon()[1]
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    out = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // (BN // 8), BN // 8],
                           warps_per_cta=[4, 1], order=[1, 0])
    return acc, out


@functools.lru_cache(maxsize=None)
def _smem_layouts():
    """(a's and b's shared tile layouts: the TMA descriptors')."""
    gl = _gluon()[1]
    return (gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([BN, BK], gl.float8e4nv))


@triton.jit
def _tile_table_kernel(offs_ptr, out_ptr, E, T, BM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr):
    # table rows [BLOCK_T * pid, + BLOCK_T): the experts' tile counts and their running sum (each program its own:
    # E is small), then each row t: its expert e (the number of experts whose tiles all come before t), its first
    # row and the group's end (one program over the whole table took 53 us at 16384 tokens of GPT-OSS-120B, H200)
    ei = tl.arange(0, BLOCK_E)
    ends = tl.load(offs_ptr + ei, mask=ei < E, other=0)
    starts = tl.load(offs_ptr + ei - 1, mask=(ei >= 1) & (ei < E), other=0)
    cnt = tl.where(ei < E, (ends - starts + BM - 1) // BM, 0)
    # the running sum by an [E, E] reduction (tl.cumsum fails in Triton 3.6's interpreter)
    cum = tl.sum(tl.where(ei[:, None] <= ei[None, :], cnt[:, None], 0), 0)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.sum((cum[None, :] <= t[:, None]).to(tl.int32), 1)
    before = tl.sum(tl.where(ei[None, :] < e[:, None], cnt[None, :], 0), 1)
    first = tl.sum(tl.where(ei[None, :] == e[:, None], starts[None, :], 0), 1) + (t - before) * BM
    end = tl.sum(tl.where(ei[None, :] == e[:, None], ends[None, :], 0), 1)
    used = e < E
    tl.store(out_ptr + 3 * t, tl.where(used, e, -1), mask=t < T)
    tl.store(out_ptr + 3 * t + 1, tl.where(used, first, 0), mask=t < T)
    tl.store(out_ptr + 3 * t + 2, tl.where(used, end, 0), mask=t < T)


_TILE_TABLE = _Launcher(sys.modules[__name__], "_tile_table_kernel")


def table_rows(max_rows: int, E: int) -> int:
    """Rows of :func:`tile_table` for at most ``max_rows`` sorted rows in E groups: ceil(max_rows / BM) + E."""
    return -(-max_rows // BM) + E


def tile_table(offs: torch.Tensor, max_rows: int) -> torch.Tensor:
    """int32 [T, 3] of a grouped call: (expert, first row, end row) per BM-row tile of each expert's group (the
    groups ending at ``offs``, int32 [E], cumulative from row 0), in expert order, then rows (-1, 0, 0) up to T =
    :func:`table_rows` (max_rows, E). One launch, no host sync (CUDA-graph capturable); reference twin
    :func:`tile_table_reference`."""
    E = offs.numel()
    T = table_rows(max_rows, E)
    out = torch.empty(T, 3, dtype=torch.int32, device=offs.device)
    if T:
        block_e = triton.next_power_of_2(max(E, 1))
        _TILE_TABLE((-(-T // 32),), (offs, out, E, T), (("BM", BM), ("BLOCK_E", block_e), ("BLOCK_T", 32)), 4)
    return out


def tile_table_reference(offs: torch.Tensor, max_rows: int) -> torch.Tensor:
    """:func:`tile_table` by PyTorch ops."""
    E = offs.numel()
    T = table_rows(max_rows, E)
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    cnt = (ends - starts + BM - 1).div(BM, rounding_mode="floor")
    cum = cnt.cumsum(0)
    t = torch.arange(T, device=offs.device)
    e = torch.searchsorted(cum, t, right=True)
    ec = e.clamp(max=max(E - 1, 0))
    used = e < E
    if E == 0:
        return torch.stack([t * 0 - 1, t * 0, t * 0], 1).to(torch.int32)
    m0 = starts[ec] + (t - (cum[ec] - cnt[ec])) * BM
    out = torch.stack([torch.where(used, e, -1), torch.where(used, m0, 0), torch.where(used, ends[ec], 0)], 1)
    return out.to(torch.int32).contiguous()


def _check(a, b, sa, sb, n, offs, table):
    """(M, N, K) of a call, or a ValueError / TypeError that names the operand."""
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_gemm takes float8_e4m3fn operands, got {a.dtype} and {b.dtype}")
    if sa.dtype != torch.float32 or sb.dtype != torch.float32:
        raise TypeError(f"fp8_gemm takes float32 row scales, got {sa.dtype} and {sb.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_gemm needs a [M, K] and b [N, K] (grouped: [E * N, K]); got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    M, K = a.shape
    N = b.shape[0] if n is None else n
    E = 1 if offs is None else offs.numel()
    if (offs is None) != (n is None) or N * E != b.shape[0]:
        raise ValueError(f"fp8_gemm: b has {b.shape[0]} rows; dense calls give neither n nor offs, grouped ones both "
                         f"(n = {n}, {E} groups)")
    if sa.shape != (M,) or sb.shape != (b.shape[0],):
        raise ValueError(f"fp8_gemm needs sa [{M}] and sb [{b.shape[0]}], got {tuple(sa.shape)} and "
                         f"{tuple(sb.shape)}")
    if offs is not None and (offs.dtype != torch.int32 or offs.dim() != 1):
        raise TypeError(f"fp8_gemm takes offs int32 [E], got {offs.dtype} {tuple(offs.shape)}")
    if table is not None and (offs is None or table.dtype != torch.int32 or table.shape != (table_rows(M, E), 3)):
        raise ValueError(f"fp8_gemm: table must be tile_table(offs, {M}) of a grouped call")
    for name, t in (("a", a), ("b", b), ("sa", sa), ("sb", sb)):
        if not t.is_contiguous():
            raise ValueError(f"fp8_gemm needs {name} contiguous")
    if K % 16:
        raise ValueError(f"fp8_gemm needs K % 16 == 0 (TMA rows of 16-byte multiples), got K = {K}")
    return M, N, K


def fp8_gemm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, *, n: Optional[int] = None,
             offs: Optional[torch.Tensor] = None, table: Optional[torch.Tensor] = None,
             out: torch.dtype = torch.bfloat16, y: Optional[torch.Tensor] = None, precise: bool = True
             ) -> torch.Tensor:
    """y [M, N] (``out``: bfloat16 / float16 / float32) = the rowwise-scaled FP8 product (module docstring).

    Dense: a [M, K], b [N, K]. Grouped: ``offs`` int32 [E] the cumulative ends of the experts' row groups in a
    (``torch._scaled_grouped_mm``'s convention), b [E * N, K] (expert e's rows at e * N, ``n`` = N), sb [E * N];
    ``table`` the :func:`tile_table` of offs (made here when None; one per call serves every GEMM on the same
    groups); rows of y past offs[-1] are not written. a, b float8_e4m3fn, sa / sb float32, all contiguous, K % 16
    == 0 (TMA). ``precise`` False: every wgmma into the float32 accumulator (fast accumulation; A/B runs only).
    ``y``: the output to write (else allocated). Needs CUDA sm_90 with Gluon (:func:`available`); TypeError /
    ValueError on other operands."""
    M, N, K = _check(a, b, sa, sb, n, offs, table)
    if y is None:
        y = torch.empty(M, N, dtype=out, device=a.device)
    grouped = offs is not None
    if grouped and table is None:
        table = tile_table(offs, M)
    NT = table.shape[0] if grouped else 0
    tiles = (NT if grouped else -(-M // BM)) * -(-N // BN)
    if tiles == 0 or K == 0:
        if K == 0 and M and N:  # (an empty sum; grouped: the groups' rows)
            (y[:int(offs[-1])] if grouped else y).zero_()
        return y
    TensorDescriptor = _gluon()[6]
    a_l, b_l = _smem_layouts()
    grid = (min(tiles, _sm_count(a.device.index if a.device.index is not None else torch.cuda.current_device())),)
    _launcher()(grid, (TensorDescriptor.from_tensor(a, [BM, BK], a_l), TensorDescriptor.from_tensor(b, [BN, BK], b_l),
                       y, sa, sb, table if grouped else y, M, N, NT, -(-K // BK), y.stride(0)),
                (("STAGES", STAGES), ("GROUPED", grouped), ("PRECISE", bool(precise))), 4)
    return y


@functools.lru_cache(maxsize=None)
def _launcher():
    """The kernel's direct launch (:class:`mxkit.kernels.launch._Launcher`)."""
    import types

    return _Launcher(types.SimpleNamespace(fp8_wgmma_kernel=_kernel()), "fp8_wgmma_kernel")


def fp8_gemm_reference(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, *,
                       n: Optional[int] = None, offs: Optional[torch.Tensor] = None,
                       table: Optional[torch.Tensor] = None, out: torch.dtype = torch.bfloat16,
                       y: Optional[torch.Tensor] = None, precise: bool = True) -> torch.Tensor:
    """The twin of :func:`fp8_gemm`: the float64 product of the scaled FP8 values (exact), rounded once to
    ``out``; rows of y past offs[-1] untouched. ``table`` and ``precise`` are accepted and unused."""
    M, N, K = _check(a, b, sa, sb, n, offs, table)
    y = torch.empty(M, N, dtype=out, device=a.device) if y is None else y
    af = a.double() * sa.double()[:, None]
    bf = b.double() * sb.double()[:, None]
    if offs is None:
        y.copy_((af @ bf.T).to(out))
        return y
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            y[start:end] = (af[start:end] @ bf[e * N:(e + 1) * N].T).to(out)
        start = max(start, end)
    return y


def available(device: torch.device) -> Optional[str]:
    """None when the kernel runs on ``device`` (CUDA sm_90 with Gluon: the w4a16-wgmma kernel's conditions), else
    why not; ``MXKIT_FP8_WGMMA=0`` turns it off (cuBLAS's grouped FP8 GEMM instead; ``=1`` makes the MoE fold
    paths take it at every size, :func:`mxkit.kernels.moe_details._fold._tile_table`)."""
    if choice("MXKIT_FP8_WGMMA", ("0", "1")) == "0":
        return "MXKIT_FP8_WGMMA=0"
    return _w4a16_wgmma.available(device)
