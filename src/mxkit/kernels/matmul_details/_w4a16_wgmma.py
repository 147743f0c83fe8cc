"""W4A16 prefill GEMM on Hopper (``w4a16-wgmma``): y = x @ W.T from bf16 activations x [M, K] and an MXFP4
weight W [N, K] (OCP MX v1.0 E2M1 codes, E8M0 scales per 32 elements of K), a Gluon kernel on wgmma; also MXFP8
weights (W8A16) and MoE experts (grouped, with the fused activation).

The weight is wgmma's register operand, after triton_kernels' Hopper design (triton PR #8917): each program
computes the transposed tile y^T [BN, BM] = W [BN, 64] @ x^T [64, BM] per 64-column step of K, so the decoded
weight never goes through shared memory. Per step, one TMA brings each of x [BM, 64] (bf16), the weight bytes
and the step's scale bytes into a ring of ``STAGES`` shared-memory slots; each thread loads its wgmma A fragment's
codes, decodes them to bf16 in registers (exact) and issues the step's wgmma while it decodes the next step's
weight (one wgmma group in flight). Float32 accumulation; the bias (float32, or bf16 read as float32) is added to
the accumulator and the output rounded once.

One kernel per weight layout, each a module (:data:`LAYOUTS`): ``_layout_wgmma`` (this kernel's own layout of
E2M1 or FP8 codes, made once per weight by :func:`packed_of`) and ``_layout_mma`` (the decode-mma kernel's MXFP4
layout, so that one copy of MoE experts serves decode and prefill). A layout module gives the kernel its Gluon
pieces (the ring's weight slots, a step's TMA, the decode, the fused activation's row pairs); :func:`_kernel`
builds the kernel around them for one layout and block size, so the kernel's constexprs are the schedule and the
epilogue's alone.

Schedule: warp-specialized (dense calls, and grouped ones of >= 128-token blocks): one producer warp issues the
TMA loads of each step once the 8 consumer warps free its slot (``empty`` mbarriers); the consumers only wait,
decode and multiply, two steps per loop iteration with the decoded operands alternating between two register
sets. This took the 5 ``bar.sync`` + ``MEMBAR`` a step that Gluon puts around TMA issues in a single-partition
loop out of the consumers' path (H100: 1024 x 8192^2 212 -> 184 us). Grouped calls of smaller blocks (the MoE at
a few rows per expert) keep the single-partition loop; ``MXKIT_WGMMA_WS=0`` / ``1`` forces either (:func:`_ws`).
Grouped launches of one block size run it persistent (:func:`_persist`): one program an SM over the tiles,
the producer loading the next tile's first steps during the last one's epilogue.

On the H100 the MXFP8 weights make bf16 x MXFP8 at M = 64 a 2.7-3.7x faster GEMM than dequantize + cuBLAS
(8192 x 8192: 46 against 125 us) and 1.1-1.5x cuBLAS bf16 on the bf16 weight.
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch

from ...packed import PackedWeight
from .._env import choice, env
from . import _layout_mma, _layout_wgmma
from ._layout_wgmma import pack_wgmma, pack_wgmma8
from ._split_sum import split_sum, split_sum_launch, split_sum_plan
from ..cuda_driver import sm_count
from ._wgmma_gluon import BN, WARPS, acc_layouts, gluon, launch_order, tma_load

FP8_ELEMS = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2"}  # the MXFP8 weights the kernel reads (``elem``)
# the weight layouts the kernel reads, by ``layout`` name: each a module with the element formats it holds
# (ELEMS), the K steps and TMA descriptors of a packed weight (steps, descs) and the kernel's Gluon pieces
LAYOUTS = {"wgmma": _layout_wgmma, "mma": _layout_mma}
STAGES = 4    # slots of the TMA ring
STAGES_SMALL_M = 6  # ... in dense calls of 64-token tiles (M <= 64), whose steps are short (:func:`_stages`)
GROUP_M = 8   # programs along M that share weight tiles in L2 (launch order)


def shape_ok(N: int, K: int) -> bool:
    """Whether the kernel takes a weight of this shape (TMA: the step-major scale rows of 2N bytes are 16-byte
    aligned)."""
    return N % 8 == 0 and K % 32 == 0 and N > 0 and K > 0


def available(device: torch.device) -> Optional[str]:
    """None when the kernel can run on ``device``, else why not (not CUDA, not sm_90 (wgmma is Hopper's), no
    Gluon in the installed Triton, ``MXKIT_W4A16_WGMMA=0``)."""
    if device.type != "cuda":
        return "not a CUDA device"
    if choice("MXKIT_W4A16_WGMMA", ("0", "1")) == "0":
        return "MXKIT_W4A16_WGMMA=0"
    return _available_on(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _available_on(index: int) -> Optional[str]:
    cc = torch.cuda.get_device_capability(index)
    if cc != (9, 0):
        return f"wgmma needs sm_90, this GPU is sm_{''.join(map(str, cc))}"
    g = gluon()
    return g if isinstance(g, str) else None


@functools.lru_cache(maxsize=None)
def _kernel(layout: str, elem: str, bm: int):
    """Build the Gluon kernel for one weight layout (``layout``, ``elem``: :data:`LAYOUTS`) at ``bm`` tokens a
    program (once each; needs Triton's Gluon). Its constexprs: STAGES (ring slots), ONE_MUL (the one-multiply
    decode), HAS_BIAS, GROUPED (expert blocks), ACT (``_grouped.ACTS``), SCHEDULE (0: every warp loads and
    multiplies, 1: a one-warp TMA producer (WS), 2: that persistent, one program an SM over the tiles), PERM_OUT
    (the columns written in the decode-mma layout's K order), STARTS (grouped: blocks of mixed sizes)."""
    g, gl, mbarrier, _, warpgroup_mma, warpgroup_mma_wait, _ = gluon()
    import triton.language as tl

    lay = LAYOUTS[layout].gluon_parts(elem, bm)
    decode, load_weight, alloc_weight = lay.decode, lay.load, lay.alloc
    split_pairs, pair_column = lay.split_pairs, lay.pair_column
    order = launch_order()
    load_tma = tma_load()
    NAN_ALL = gl.constexpr(tl.PropagateNan.ALL)
    BNc, BM, GROUP = gl.constexpr(BN), gl.constexpr(bm), gl.constexpr(GROUP_M)
    ACC = gl.constexpr(acc_layouts(bm)[0])

    @g.jit
    def _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES):
        # step t (K step T0 + t of the weight: a split-K program starts at T0) into slot sl, signalling ready[sl]
        mbarrier.expect(ready.index(sl), NBYTES)
        k = T0 + t
        load_tma(x_desc, [off_m, k * 64], ready.index(sl), x_smem.index(sl))
        load_weight(k, sl, ready, w_desc, s_desc, w_smem, s_smem, row0)

    @g.jit
    def _step(t, acc, w_use, w_next, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0,
              T0, STEPS, NBYTES, STAGES, ONE_MUL, WS, C0):
        # step t (the ring's step C0 + t: C0 counts the steps of a persistent program's earlier tiles): its wgmma on
        # w_use; then (step t - 1's wgmma done: its slot free, w_next reusable) the slot goes back to the producer
        # (WS) or takes step t + STAGES - 1's TMA, and step t + 1's weight is decoded into w_next while this wgmma runs
        acc = warpgroup_mma(w_use, x_smem.index((C0 + t) % STAGES).permute((1, 0)), acc, is_async=True)
        acc, w_next = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_next))
        if WS:
            mbarrier.arrive(empty.index((C0 + t + STAGES - 1) % STAGES), pred=t > 0)
        else:
            tn = t + STAGES - 1
            if tn < STEPS:
                _load(tn, tn % STAGES, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES)
        t1 = C0 + gl.minimum(t + 1, STEPS - 1)
        s1 = t1 % STAGES
        mbarrier.wait(ready.index(s1), (t1 // STAGES) & 1)
        w_next = decode(w_smem.index(s1), s_smem.index(s1), ONE_MUL)
        return acc, w_next

    @g.jit
    def _mainloop(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0, T0, STEPS, NBYTES,
                  STAGES, ONE_MUL, WS, C0=0, PERSIST=False):
        # the decode + wgmma loop (the consumers, or every warp without WS), two steps per iteration with the
        # weight operands alternating between w0 and w1 (no register copies); the ring's steps C0 .. C0 + STEPS - 1
        acc = gl.zeros([BNc, BM], gl.float32, layout=ACC)
        mbarrier.wait(ready.index(C0 % STAGES), (C0 // STAGES) & 1)
        w0 = decode(w_smem.index(C0 % STAGES), s_smem.index(C0 % STAGES), ONE_MUL)
        w1 = w0
        for t in range(0, STEPS - 1, 2):
            acc, w1 = _step(t, acc, w0, w1, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m,
                            row0, T0, STEPS, NBYTES, STAGES, ONE_MUL, WS, C0)
            acc, w0 = _step(t + 1, acc, w1, w0, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m,
                            row0, T0, STEPS, NBYTES, STAGES, ONE_MUL, WS, C0)
        if STEPS % 2 == 1:  # the last step's weight is in w0
            acc = warpgroup_mma(w0, x_smem.index((C0 + STEPS - 1) % STAGES).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if PERSIST:  # the slots the loop did not give back (its last step's, and with STEPS odd the one before)
            if STEPS % 2 == 1:
                mbarrier.arrive(empty.index((C0 + STEPS - 2) % STAGES), pred=STEPS > 1)
            mbarrier.arrive(empty.index((C0 + STEPS - 1) % STAGES))
        return (acc,)  # a tuple: gl.warp_specialize flattens the default partition's results

    @g.jit
    def _produce(x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, off_m, row0, T0, STEPS, NBYTES,
                 STAGES):
        # the TMA producer (one warp): step t into slot t % STAGES once the consumers freed it
        for t in range(STEPS):
            sl = t % STAGES
            mbarrier.wait(empty.index(sl), ((t // STAGES) & 1) ^ 1)
            _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES)

    @g.jit
    def _act(gate, up, ACT: gl.constexpr):
        # _grouped._act_pairs' activations, float32
        if ACT == 1:  # transformers' GptOssExperts: alpha 1.702, limit 7.0
            gate = gl.minimum(gate, 7.0, propagate_nan=NAN_ALL)  # NaN stays NaN, as torch's clamp
            up = gl.minimum(gl.maximum(up, -7.0, propagate_nan=NAN_ALL), 7.0, propagate_nan=NAN_ALL)
            out = (up + 1.0) * (gate / (1.0 + gl.exp(-1.702 * gate)))
        else:
            out = gate / (1.0 + gl.exp(-gate)) * up
        return out

    @g.jit
    def _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, pid_k, stride_ym, stride_yk, HAS_BIAS: gl.constexpr,
                  ACT: gl.constexpr, PERM_OUT: gl.constexpr):
        # bias, activation, the one rounding and the store of a tile's float32 sums (acc [BN weight rows, BM tokens])
        n_o = off_n + gl.arange(0, BNc, layout=gl.SliceLayout(1, ACC))
        m_o = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, ACC))
        if HAS_BIAS:
            b = gl.load(b_ptr + (row0 - off_n) + n_o, mask=n_o < N, other=0.0).to(gl.float32)  # (bf16: exact)
            acc = acc + gl.expand_dims(b, 1)
        n2 = gl.expand_dims(n_o, 1) + gl.zeros([BNc, BM], gl.int32, ACC)
        m2 = gl.expand_dims(m_o, 0) + gl.zeros([BNc, BM], gl.int32, ACC)
        if ACT != 0:  # each (gate, up) pair of rows in one thread (the layout's row order), its output column
            gate, up = split_pairs(acc)
            out = _act(gate, up, ACT)
            n2, _ = split_pairs(n2)
            m2, _ = split_pairs(m2)
            col = pair_column(n2)
        else:
            out = acc
            col = n2
        if PERM_OUT:  # columns in the decode-mma layout's K order (the next GEMM's x): 64 c + k -> 64 c + kl(k)
            k = col % 64
            col = col - k + ((k & 1) | (((k >> 3) & 3) << 1) | (((k >> 1) & 1) << 3) | (((k >> 2) & 1) << 4) | (k & 32))
        ptr = y_ptr + pid_k.to(gl.int64) * stride_yk + m2.to(gl.int64) * stride_ym + col
        mask = (n2 < N) & (m2 < M)
        gl.store(ptr, out.to(y_ptr.dtype.element_ty), mask=mask)

    @g.jit
    def _tile(tile, e_ptr, M, N, NB, GROUPED: gl.constexpr, STARTS: gl.constexpr):
        # output tile `tile` of the launch order (GROUP programs along M share weight tiles): its expert (grouped:
        # -1 for an unused block, whose tile is skipped; 0 dense), first token row, first output column and first
        # packed weight row
        pid_m, pid_n = order(tile, NB if GROUPED else gl.cdiv(M, BM), gl.cdiv(N, BNc), GROUP)
        off_n = pid_n * BNc
        off_m = pid_m * BM
        e = pid_m * 0
        if GROUPED:  # block pid_m of the sorted rows is expert e's; its N rows follow expert e - 1's
            e = gl.load(e_ptr + pid_m)
            if STARTS:  # the block's first sorted row from the table's second half (blocks of mixed sizes)
                off_m = gl.load(e_ptr + NB + pid_m)
        return e, off_m, off_n, e * N + off_n

    @g.jit
    def _consume_tiles(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, y_ptr, b_ptr, e_ptr, M, N, NB,
                       STEPS, stride_ym, NBYTES, STAGES, ONE_MUL, HAS_BIAS, ACT, PERM_OUT, GROUPED, STARTS):
        # the persistent program's consumers: tiles program_id, + num_programs, ...; each tile's K loop on the
        # ring's next STEPS steps, then its epilogue while the producer already loads the next tile's first steps
        n_tiles = (NB if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BNc)
        c0 = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, off_m, off_n, row0 = _tile(tile, e_ptr, M, N, NB, GROUPED, STARTS)
            if e >= 0:
                (acc,) = _mainloop(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0, 0, STEPS,
                                   NBYTES, STAGES, ONE_MUL, True, c0, True)
                _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, gl.program_id(1), stride_ym, 0, HAS_BIAS, ACT,
                          PERM_OUT)
                c0 += STEPS
        return ()

    @g.jit
    def _produce_tiles(x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, e_ptr, M, N, NB, STEPS, NBYTES,
                       STAGES, GROUPED, STARTS):
        # the persistent program's TMA producer (one warp): the same tiles in the same order, ring step c into slot
        # c % STAGES once the consumers freed it
        n_tiles = (NB if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BNc)
        c0 = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, off_m, off_n, row0 = _tile(tile, e_ptr, M, N, NB, GROUPED, STARTS)
            if e >= 0:
                for t in range(STEPS):
                    c = c0 + t
                    sl = c % STAGES
                    mbarrier.wait(empty.index(sl), ((c // STAGES) & 1) ^ 1)
                    _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, 0, NBYTES)
                c0 += STEPS

    @g.jit
    def _ring(x_desc, w_desc, s_desc, STAGES: gl.constexpr):
        # the TMA ring's slots (x, weight bytes, scale bytes), its `ready` mbarriers (initialized) and the `empty`
        # ones (the warp-specialized schedules initialize them)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, 64], x_desc.layout)
        w_smem, s_smem = alloc_weight(w_desc, s_desc, STAGES)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        return x_smem, w_smem, s_smem, bars, empty

    @g.jit
    def w4a16_wgmma_kernel(x_desc, w_desc, s_desc, y_ptr, b_ptr, e_ptr, M, N, ALL_STEPS, KSTEPS, stride_ym,
                           stride_yk, NB, STAGES: gl.constexpr, ONE_MUL: gl.constexpr, HAS_BIAS: gl.constexpr,
                           GROUPED: gl.constexpr, ACT: gl.constexpr, SCHEDULE: gl.constexpr, PERM_OUT: gl.constexpr,
                           STARTS: gl.constexpr, num_warps: gl.constexpr):
        WS: gl.constexpr = SCHEDULE >= 1
        PERSIST: gl.constexpr = SCHEDULE == 2
        # split-K (program_id(1) of the grid): K steps [T0, T0 + STEPS) into partial sum pid_k of y
        pid_k = gl.program_id(1)
        T0 = pid_k * KSTEPS
        STEPS = gl.minimum(ALL_STEPS - T0, KSTEPS)
        NBYTES: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
        if PERSIST:  # one program an SM over tiles program_id, + num_programs, ... (warp-specialized, no split)
            x_smem, w_smem, s_smem, bars, empty = _ring(x_desc, w_desc, s_desc, STAGES)
            for s in gl.static_range(STAGES):
                mbarrier.init(empty.index(s), count=1)
            gl.warp_specialize([(_consume_tiles, (x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc, y_ptr,
                                                  b_ptr, e_ptr, M, N, NB, ALL_STEPS, stride_ym, NBYTES, STAGES,
                                                  ONE_MUL, HAS_BIAS, ACT, PERM_OUT, GROUPED, STARTS)),
                                (_produce_tiles, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, bars, empty, e_ptr,
                                                  M, N, NB, ALL_STEPS, NBYTES, STAGES, GROUPED, STARTS))], [1], [24])
            for s in gl.static_range(STAGES):
                mbarrier.invalidate(empty.index(s))
                mbarrier.invalidate(bars.index(s))
            return
        e, off_m, off_n, row0 = _tile(gl.program_id(0), e_ptr, M, N, NB, GROUPED, STARTS)
        if e < 0:  # (grouped: an unused block)
            return
        x_smem, w_smem, s_smem, bars, empty = _ring(x_desc, w_desc, s_desc, STAGES)
        if WS:  # a one-warp TMA producer; the 8 warps decode and multiply, freeing slots through `empty`
            for s in gl.static_range(STAGES):
                mbarrier.init(empty.index(s), count=1)
            (acc,) = gl.warp_specialize([(_mainloop, (x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc,
                                                      off_m, row0, T0, STEPS, NBYTES, STAGES, ONE_MUL, WS)),
                                         (_produce, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, bars, empty,
                                                     off_m, row0, T0, STEPS, NBYTES, STAGES))], [1], [24])
            for s in gl.static_range(STAGES):
                mbarrier.invalidate(empty.index(s))
        else:  # every warp: the first STAGES - 1 steps' TMA, then each step issues the one STAGES - 1 ahead
            for s in gl.static_range(STAGES - 1):
                if s < STEPS:
                    _load(s, s, bars, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES)
            (acc,) = _mainloop(x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc, off_m, row0, T0, STEPS,
                               NBYTES, STAGES, ONE_MUL, WS)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, pid_k, stride_ym, stride_yk, HAS_BIAS, ACT, PERM_OUT)

    return w4a16_wgmma_kernel


@functools.lru_cache(maxsize=None)
def _x_layout(BM: int):
    """The shared layout of x's TMA tile [BM, 64] (bf16, swizzled for wgmma)."""
    gl = gluon()[1]
    return gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16)


def _stages(bm: int, grouped: bool) -> int:
    """Slots of the TMA ring: 6 in dense calls of 64-token tiles, where a step (64 tokens x 128 weight rows) is
    short and more bytes in flight per SM pay (H200, session 39, ``benchmarks/probes/w4a16_stages_ab.py``, W4A16
    split as :func:`dense_schedule`: 64 x 8192^2 44.5 -> 42.9 us, 64 x 28672 x 8192 108.4 -> 104.4, 64 x 8192 x
    28672 106.1 -> 103.9; 3 and 8 slots no better); 4 elsewhere (the prefill tiles and the grouped MoE calls,
    tuned with 4)."""
    return STAGES_SMALL_M if bm == 64 and not grouped else STAGES


def _ws(bm: int, grouped: bool) -> bool:
    """The warp-specialized schedule (a one-warp TMA producer; 168 registers a thread, so one program an SM): every
    dense call, and grouped (MoE) calls of >= 128-token blocks. Below that a grouped step is too short for the
    producer round trip and the single-partition loop is faster (H100 / H200, MoE at 256 tokens: 1.0 against
    1.27 ms). Dense calls of 64-token tiles take it too since session 48, with :func:`dense_schedule` keeping their
    grid within one program an SM (H200, ``benchmarks/probes/wgmma_small_ab.py``, µs, single-partition at the old
    schedule -> warp-specialized at the new one: 64 x 8192^2 35.6 -> 32.4, 64 x 14336 x 4096 35.0 -> 28.9,
    64 x 5120 x 2880 18.0 -> 15.6). MXKIT_WGMMA_WS=0 / 1 forces either (A/B runs, tests)."""
    forced = choice("MXKIT_WGMMA_WS", ("0", "1"))
    return forced == "1" if forced is not None else (bm >= 128 or not grouped)


def _persist(default: bool, bm: int = 0) -> bool:
    """The persistent schedule of the warp-specialized kernel (calls with no split): one program an SM walks the
    output tiles in launch order, its producer loading the next tile's first steps while the consumers run the
    last one's epilogue (a tile's prologue and epilogue otherwise cost ~9 us at K = 2880 on the H200: dense
    16384 x 5760 x K took 814 us at K = 2880 and 1431 at 5760, ``benchmarks/probes/moe_prefill_profile.py``).
    ``default``: on for the grouped (MoE) launches of one block size, off for the rest, as measured on the H200
    (``benchmarks/probes/wgmma_persist_ab.py``): GPT-OSS-120B's MoE prefill at 4096 tokens 2253 -> 2113 us and
    at 8192 3978 -> 3644, but the launches of mixed block sizes at 16384 tokens slower (the gate_up one of
    256-row blocks 3242 -> 4181 us) and dense 2048 x 8192 x 8192 356 -> 370 us: at 256-token tiles the persistent
    consumers spill at the 168-register cap (the float32-out variant 304 bytes a thread) and run 6-9% more
    instructions (Nsight Compute, ``benchmarks/h200-2026-12-04e/``).
    MXKIT_WGMMA_PERSIST=0 / 1 forces it off / on (A/B runs, tests); a list of block sizes ("128" or "128,256")
    turns it on for those alone."""
    forced = env("MXKIT_WGMMA_PERSIST")
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        return bm in _persist_sizes(forced)
    return default


@functools.lru_cache(maxsize=16)
def _persist_sizes(forced: str) -> frozenset:
    """MXKIT_WGMMA_PERSIST's list of block sizes ("128" or "128, 256"); ValueError naming the variable for anything
    else (``true`` read as a list turned the schedule off)."""
    try:
        sizes = frozenset(int(v) for v in forced.split(","))
    except ValueError:
        sizes = frozenset()
    if not sizes or not sizes <= {32, 64, 128, 256}:
        raise ValueError(f"MXKIT_WGMMA_PERSIST={forced!r}: expected 0, 1 or block sizes of 32, 64, 128, 256 "
                         f"(\"128,256\"), or unset")
    return sizes


def _persist_setting() -> Optional[str]:
    """MXKIT_WGMMA_PERSIST as set now (:func:`_persist`; part of a prepared launch's key)."""
    return env("MXKIT_WGMMA_PERSIST")


def block_m(M: int) -> int:
    """Tokens per program: 256 (wgmma's widest N) unless M fits 128."""
    return 128 if M <= 128 else 256


def dense_schedule(M: int, N: int, K: int, device: torch.device) -> tuple[int, int]:
    """(tokens per program, split-K) of a dense call: 64 tokens up to M = 64, 128 up to 128, 256 above, but 128
    up to M = 256 where 256-token tiles would not give every SM one (M = 256 on 8192 x 8192: 86 against 64 us;
    on 28672 x 8192 256 stays ahead, 183 against 247, H100); then K split the most ways of 8 .. 2 that keeps the
    grid within one program an SM (the warp-specialized kernel holds one an SM: :func:`_ws`) and every split at
    >= 8 K steps. H200 (``benchmarks/probes/wgmma_small_ab.py``, session 48, µs): M = 64 on 8192 x 8192 split 2
    32.4 (split 4: 35.8), 5120 x 2880 split 3 15.6 (4: 20.4), 2880 x 4096 split 5 14.9 (8: 19.8), 4096 x 14336
    split 4 29.6 (8: 33.4)."""
    sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    tiles_n = -(-N // BN)
    bm = 64 if M <= 64 else 128 if M <= 128 or (M <= 256 and -(-M // 256) * tiles_n < sms) else 256
    tiles = -(-M // bm) * tiles_n
    steps = -(-K // 64)
    split = next((s for s in range(8, 1, -1) if tiles * s <= sms and steps // s >= 8), 1)
    return bm, split


def w4a16_wgmma(x: torch.Tensor, q: torch.Tensor, st: torch.Tensor, N: int, one_mul: bool,
                out: torch.dtype = torch.bfloat16, bias: Optional[torch.Tensor] = None,
                y: Optional[torch.Tensor] = None, *, expert_ids: Optional[torch.Tensor] = None,
                bm: Optional[int] = None, activation: Optional[str] = None, layout: str = "wgmma",
                perm_out: bool = False, starts: bool = False, split: int = 1, elem: str = "e2m1") -> torch.Tensor:
    """y [M, N] (``out``: bfloat16 / float16 / float32) = x [M, K] (bf16, rows contiguous, 16-byte aligned) @
    W.T for the weight (q, st) of :func:`pack_wgmma`; ``bias`` float32 or bfloat16 [N] (contiguous; a bf16 one
    read as float32, so the same bytes as its float32 copy, with no conversion launch) or None, added before the
    one rounding. The caller checks :func:`available`, :func:`shape_ok` and that the weight's scale bytes keep
    every value exact in bf16.

    Grouped (MoE experts; ``expert_ids`` given): (q, st) are E experts of N rows each, packed as one [E * N, K]
    weight (:func:`pack_wgmma_experts`), x's rows are sorted in blocks of ``bm`` rows (32, 64, 128 or 256)
    and block b is multiplied by expert ``expert_ids[b]`` (int32; -1: skipped, its rows of y untouched);
    ``bias`` float32 [E * N] in the packed row order; ``activation`` ``"swiglu_gpt_oss"`` / ``"swiglu"`` (the
    experts packed with ``act_pairs``) makes y [M, N / 2] of the activation of each (gate, up) pair.

    ``layout="mma"``: (q, st) are the decode-mma kernel's (:func:`mxkit.kernels.matmul_details._mma_decode.pack_mma`,
    q int32 [N / 16, K / 64, 32, 4], st int32 [N / 16, K / 64, 8]; K % 64 == 0), one copy serving decode and
    prefill; x's columns must then be in that layout's K order (:func:`mma_k_order`), gate_up rows in pairs
    (gate 2c, up 2c + 1) for ``activation``; ``perm_out`` writes y's columns in that K order (the next GEMM's
    x). ``starts``: ``expert_ids`` is int32 [2, NB], the expert of each block then its first row (any multiple
    of 64 whose ``bm`` rows lie in that expert's sorted group), so groups can be covered by blocks of several
    sizes, one launch per size (:func:`mxkit.kernels.moe.mixed_blocks`).

    ``split`` > 1 (dense calls: not grouped, no activation, ``y`` None): K is split over that many programs per
    output tile (the grid of a small M is otherwise a few programs per SM), each writing a float32 partial sum;
    the partials are then added in a fixed order (deterministic), the bias added and the output rounded once.

    ``elem`` ``"e4m3"`` / ``"e5m2"``: an MXFP8 weight (W8A16) in :func:`pack_wgmma8`'s layout (``layout`` "wgmma"),
    whose codes hold no NaN / Inf (they do not decode to NaN / Inf here: the caller checks).

    Host path: the launch of each problem (everything but the call's tensors) is prepared once (:class:`_Prepared`)
    and, from its second call, launched by one ``cuLaunchKernel`` with x's TMA descriptor encoded from x alone;
    a dense problem's calls from its third on are one C++ fast call (and the split's sum another)."""
    M, K = x.shape
    if layout not in LAYOUTS or elem not in LAYOUTS[layout].ELEMS:
        pairs = {name: m.ELEMS for name, m in LAYOUTS.items()}
        raise ValueError(f"layout={layout!r} with elem={elem!r}: one of {pairs} (FP8 weights are read in "
                         f"the wgmma layout only)")
    grouped = expert_ids is not None
    bm = bm or block_m(M)
    # everything but the call's tensors fixes the launch: its grid, constexprs and ints are made once (_Prepared)
    ptrs = x.data_ptr() | (bias.data_ptr() if bias is not None else 0) | \
        (expert_ids.data_ptr() if grouped else 0) | (y.data_ptr() if y is not None else 0)
    aligned = not ptrs & 15
    key = _key(x, q, N, one_mul, out, bias, y, expert_ids, bm, activation, layout, perm_out, starts, split, elem,
               aligned)
    prep = _PREPARED.get(key)
    if prep is None:
        if len(_PREPARED) >= 1024:
            _PREPARED.clear()
        prep = _PREPARED[key] = _Prepared(x, q, N, one_mul, bias is not None, y, expert_ids, bm, activation, layout,
                                          perm_out, starts, split, elem, out)
    from .. import launch

    if prep.plan and launch._enabled:  # (a dense problem's C++ fast call: its key holds everything it fixes)
        return prep.run_dense(x, q, st, bias)
    split = prep.split
    if y is None:  # (split-K: float32 partial sums, added below)
        y = torch.empty(M, prep.n_out, dtype=out, device=x.device) if split == 1 else \
            torch.empty(split, M, prep.n_out, dtype=torch.float32, device=x.device)
    final_bias = None
    if split > 1:
        final_bias, bias = bias, None
    if prep.grid[0] == 0:  # (no rows or no columns: nothing to compute)
        return y if split == 1 else torch.empty(M, prep.n_out, dtype=out, device=x.device)
    w_desc, s_desc = _weight_descs(q, st, prep.layout, prep.elem)
    rest = prep.rest(w_desc, s_desc, y, bias, expert_ids, M)
    prep.launch(x, rest, aligned)
    y_out = y if split == 1 else prep.sum(y, final_bias)
    if prep.plan is None and prep.dense and prep.fast and (split == 1 or prep.sum_launch) and launch._enabled:
        prep.make_plan(x, rest, bias if split == 1 else final_bias, y_out)
    return y_out


_PREPARED: dict = {}  # w4a16_wgmma's problems (everything but the call's tensors) -> their _Prepared launch


def _key(x, q, N, one_mul, out, bias, y, expert_ids, bm, activation, layout, perm_out, starts, split, elem,
         aligned: bool) -> tuple:
    """The problem of a :func:`w4a16_wgmma` call (its key in :data:`_PREPARED`): shapes, strides, dtypes, flags,
    the A/B settings in force, whether every tensor is 16-byte aligned, x's device and the current one."""
    grouped = expert_ids is not None
    return (x.shape, x.stride(), x.dtype, tuple(q.shape), N, bool(one_mul), out,
            None if bias is None else (bias.dtype, bias.shape, bias.stride()),
            None if y is None else (y.dtype, tuple(y.shape), y.stride()),
            (expert_ids.numel(), expert_ids.dtype) if grouped else None, bm, activation, layout, perm_out, starts,
            split, elem, _ws(bm, grouped), _persist_setting(), aligned, x.device.index, torch.cuda.current_device())


def dense_prepared(x: torch.Tensor, q: torch.Tensor, N: int, one_mul: bool, out: torch.dtype, bm: int, split: int,
                   elem: str, bias: Optional[torch.Tensor] = None) -> Optional["_Prepared"]:
    """The prepared launch of a dense :func:`w4a16_wgmma` call (no y, experts or activation; this module's
    layout; ``bias`` float32 or bfloat16 [N] or None) on an aligned x (and bias) as these arguments make it, if one
    was made and holds its C++ fast call (:meth:`_Prepared.run_dense` then runs such calls); else None."""
    ptrs = x.data_ptr() | (bias.data_ptr() if bias is not None else 0)
    prep = _PREPARED.get(_key(x, q, N, one_mul, out, bias, None, None, bm, None, "wgmma", False, False, split, elem,
                              not ptrs & 15))
    return prep if prep is not None and prep.plan else None


class _Prepared:
    """One problem of :func:`w4a16_wgmma` (shapes, strides, flags, block size, schedule, the tensors' 16-byte
    alignment): its grid, constexprs and ints, made once; after its first call the :class:`ArgsLaunch` of its
    specialisation (``fast``: None until made, False where it cannot be), which later calls launch with x's TMA
    descriptor encoded from x alone (:class:`_XDesc`): ~20 µs of host time a call less than building Triton's
    descriptor and the launcher's key (H200 host); and for a dense problem (no experts, activation or y) after
    its second call a C++ fast call of its own launch (``plan``, with a split ``sum_plan``: None until made,
    False where none can be), which allocates y and points the three TMA descriptors at the call's x and weight
    (:meth:`run_dense`; ~6 µs less again)."""

    def __init__(self, x, q, N, one_mul, has_bias, y, expert_ids, bm, activation, layout, perm_out, starts, split,
                 elem, out):
        from ._grouped import ACTS

        M, _ = x.shape
        self.layout, self.elem = layout, elem
        self.steps = steps = LAYOUTS[layout].steps(q, elem)
        grouped = expert_ids is not None
        self.n_out = N // 2 if activation else N
        self.ksteps = -(-steps // max(1, split))
        self.split = split = -(-steps // self.ksteps) if steps else 1
        if split > 1 and (grouped or activation or perm_out or y is not None):
            raise ValueError("split-K runs dense calls only (no expert_ids, activation, perm_out or y)")
        self.grid_m = (expert_ids.numel() // (2 if starts else 1)) if grouped else -(-M // bm)
        grid = (self.grid_m * -(-N // BN), split)
        ws = _ws(bm, grouped)
        persist = ws and split == 1 and _persist(grouped and not starts, bm)
        if persist:  # (one program an SM, each over tiles pid, pid + grid, ...)
            grid = (min(grid[0], sm_count(x.device.index if x.device.index is not None
                                           else torch.cuda.current_device())), 1)
        self.grid = grid
        # the kernel of this layout and block size (:func:`_launcher`) and its constexprs
        self.launcher = _launcher(layout, elem, bm)
        self.consts = (("STAGES", _stages(bm, grouped)), ("ONE_MUL", bool(one_mul)),
                       ("HAS_BIAS", has_bias and split == 1), ("GROUPED", grouped), ("ACT", ACTS[activation]),
                       ("SCHEDULE", int(ws) + int(persist)), ("PERM_OUT", bool(perm_out)),
                       ("STARTS", grouped and bool(starts)))
        self.fast, self.tries = None, 0
        self.sum_launch = None  # (split > 1: the sum's (ArgsLaunch, grid) once made after its first call; False: none)
        self.bm, self.N, self.out, self.has_bias = bm, N, out, has_bias
        self.dense = not grouped and not activation and not perm_out and y is None and M > 0 and N > 0
        self.plan = self.sum_plan = None

    def rest(self, w_desc, s_desc, y: torch.Tensor, bias: Optional[torch.Tensor],
             expert_ids: Optional[torch.Tensor], M: int) -> tuple:
        """The kernel's runtime arguments after x's descriptor (y the float32 partial sums [split, M, n] of a
        split)."""
        ym, yk = (y.stride(1), y.stride(0)) if self.split > 1 else (y.stride(0), 0)
        return (w_desc, s_desc, y, bias if bias is not None else y, expert_ids if expert_ids is not None else y, M,
                self.N, self.steps, self.ksteps, ym, yk, self.grid_m)

    def launch(self, x: torch.Tensor, rest: tuple, aligned: bool) -> None:
        """The main launch on x (arguments ``rest`` after its descriptor): by the ArgsLaunch where made, else by
        Triton's launcher with a TensorDescriptor of x, making the ArgsLaunch at the problem's second call (as
        _Launcher makes its own; one hit's ArgsLaunch serves every later call) where every tensor is aligned."""
        from .. import launch

        fast = self.fast
        if fast and launch._enabled and fast(self.grid, (_XDesc(x, self.bm),) + rest):
            return
        TensorDescriptor = gluon()[6]
        args = (TensorDescriptor.from_tensor(x, [self.bm, 64], _x_layout(self.bm)),) + rest
        self.launcher(self.grid, args, self.consts, WARPS)
        if fast is None and aligned and launch._enabled:
            self.tries += 1
            if self.tries >= 2:
                self.fast = self.launcher.args_launch(self.grid, args, self.consts, WARPS) or \
                    (None if self.tries < 4 else False)

    def sum(self, part: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """y [M, n] of a split's float32 partial sums (+ the float32 bias), added in a fixed order (the same bits
        every run): by the sum's own ArgsLaunch once made (after the main launch's), else :func:`split_sum`."""
        from .. import launch

        M = part.shape[1]
        summed = self.sum_launch
        if summed and launch._enabled:  # (bias: the key's dtype, shape and strides, and aligned)
            y = torch.empty(M, self.n_out, dtype=self.out, device=part.device)
            if summed[0](summed[1], (part, bias if bias is not None else part, y, M * self.n_out, self.n_out)):
                return y
        y = split_sum(part, bias, self.out)
        if summed is None and M and launch._enabled and self.fast:
            fast_sum, grid = split_sum_launch(part, bias, y)
            self.sum_launch = (fast_sum, grid) if fast_sum else False  # (one attribute: threads see both or neither)
        return y

    def make_plan(self, x: torch.Tensor, rest: tuple, bias: Optional[torch.Tensor], y: torch.Tensor) -> None:
        """Make the C++ fast calls of this dense problem from a call's arguments that just ran (x, the arguments
        after its descriptor, the call's bias, its output): ``plan`` (and with a split ``sum_plan``, set first), or
        False where they cannot be made; nothing while the C++ module is not loaded yet, or on another device than
        the current one."""
        from ..cuda_driver import fast_call_loaded

        if not fast_call_loaded() or x.device.index != torch.cuda.current_device():
            return
        TensorDescriptor = gluon()[6]
        args = (TensorDescriptor.from_tensor(x, [self.bm, 64], _x_layout(self.bm)),) + rest
        priv = self.launcher.private_args_launch(self.grid, args, self.consts, WARPS)
        M = x.shape[0]
        with_bias = bias is not None and self.split == 1
        # x's, the weight codes' and scales' descriptors from inputs 0-2, y (or the partials) output 0, the bias
        # input 3; the expert table is y (unused)
        roles = (0, 1, 2, -1, 3 if with_bias else -1, -1) + (None,) * (len(args) - 6)
        outs = (((M, self.n_out), self.out, False),) if self.split == 1 else \
            (((self.split, M, self.n_out), torch.float32, False),)
        plan = priv.with_outputs(args, roles, outs, 4 if with_bias else 3) if priv else None
        if plan and self.split > 1:
            sum_plan = split_sum_plan(rest[2], bias, y)
            if not sum_plan:
                plan = None
            self.sum_plan = sum_plan or False
        self.plan = plan or False

    def run_dense(self, x: torch.Tensor, q: torch.Tensor, st: torch.Tensor,
                  bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """y [M, N] of a dense call of this problem (``plan`` made: same shapes, strides, dtypes and 16-byte
        alignment as the key's) on new tensors: one C++ fast call, with a split two (the partials, then their
        sum); the bytes of w4a16_wgmma's launches."""
        if self.split == 1:
            return self.plan(x, q, st, bias) if self.has_bias else self.plan(x, q, st)
        part = self.plan(x, q, st)
        return self.sum_plan(part, bias) if self.has_bias else self.sum_plan(part)


class _XDesc:
    """x's TMA descriptor [bm, 64] as :class:`~mxkit.kernels.launch.ArgsLaunch` encodes it (the fields it reads of
    Triton's TensorDescriptor, without that class's per-call checks: a prepared launch's x is a 2-D bf16 tensor of
    16-byte aligned rows, as the first call's TensorDescriptor checked)."""

    __slots__ = ("base", "shape", "strides", "block_shape")
    padding = "zero"

    def __init__(self, x: torch.Tensor, bm: int):
        self.base, self.shape, self.strides, self.block_shape = x, x.shape, x.stride(), (bm, 64)


_DESCS: dict = {}  # id(q) -> (key, descs, weakref to q) while q lives (see _weight_descs)


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor of t's storage, offset, shape and strides that is not a view of t (no ``_base``: it does not keep the
    Python object t alive, only its memory)."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def _weight_descs(q: torch.Tensor, st: torch.Tensor, layout: str, elem: str) -> tuple:
    """The TMA descriptors of a packed weight's codes and scales (its layout module's ``descs``), made once and kept
    while ``q`` lives (~10 µs of host time a call otherwise), beside it rather than on it: ``q`` may be a module's
    buffer (an MXMoE's experts in the decode layout), which a deep copy or a pickle of the module would carry with
    the descriptors in its ``__dict__``. Their bases alias q's and st's memory (:func:`_alias`), which they keep
    only until ``q`` is freed."""
    key = (q.data_ptr(), tuple(q.shape), q.dtype, st.data_ptr(), tuple(st.shape), st.dtype, layout, elem)
    h = id(q)
    got = _DESCS.get(h)
    if got is not None and got[2]() is q:
        if got[0] == key:
            return got[1]
    else:  # (the first for this object: dropped when it is freed)
        weakref.finalize(q, _DESCS.pop, h, None)
    descs = LAYOUTS[layout].descs(_alias(q), _alias(st), elem)
    _DESCS[h] = (key, descs, weakref.ref(q))
    return descs


@functools.lru_cache(maxsize=None)
def _launcher(layout: str, elem: str, bm: int):
    """The direct launch (:class:`mxkit.kernels.launch._Launcher`) of :func:`_kernel`'s kernel for this layout and
    block size (Gluon's own launcher took ~100 us of host time a call)."""
    import types

    from ..launch import _Launcher

    return _Launcher(types.SimpleNamespace(w4a16_wgmma_kernel=_kernel(layout, elem, bm)), "w4a16_wgmma_kernel")


def packed_of(b: PackedWeight) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The weight of a PackedWeight in this kernel's layout, made on first use and kept on the PackedWeight
    (not in its state_dict; ``.to()`` copies drop it)."""
    got = b.__dict__.get("_wgmma")
    if got is None:
        elem = FP8_ELEMS.get(b.source.fmt.name)
        got = pack_wgmma(b.source.qdata, b.source.scale) if elem is None else \
            pack_wgmma8(b.source.qdata, b.source.scale, elem, 255 if b.has_nan else b.scale_max)
        object.__setattr__(b, "_wgmma", got)
    return got
