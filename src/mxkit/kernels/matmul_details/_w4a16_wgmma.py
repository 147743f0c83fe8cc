"""W4A16 prefill GEMM on Hopper (``w4a16-wgmma``): y = x @ W.T from bf16 activations x [M, K] and an MXFP4
weight W [N, K] (OCP MX v1.0 E2M1 codes, E8M0 scales per 32 elements of K), a Gluon kernel on wgmma.

The weight is wgmma's register operand, after triton_kernels' Hopper design (triton PR #8917): each program
computes the transposed tile y^T [BN, BM] = W [BN, 64] @ x^T [64, BM] per 64-column step of K, so the decoded
weight never goes through shared memory. Per step, one TMA brings each of x [BM, 64] (bf16), the weight bytes
[BN, 32] and the step's scale bytes [1, 2 BN] into a ring of ``STAGES`` shared-memory slots; each thread loads
the 16 weight bytes of its wgmma A fragment (two 8-byte loads), decodes them to bf16 in registers (exact:
E2M1 value times 2^-126 by placing its bits in a bf16, then times 2^126 and the block factor 2^(s - 127),
or times 2^(s - 1) at once when every scale byte is <= 128), and issues the step's wgmma while it decodes
the next step's weight (one wgmma group in flight). Float32 accumulation; the bias (float32, or bf16 read as
float32) is added to the accumulator and the output rounded once.

Schedule: warp-specialized (dense calls, and grouped ones of >= 128-token blocks): one producer warp issues the
TMA loads of each step once the 8 consumer warps free its slot (``empty`` mbarriers); the consumers only wait,
decode and multiply, two steps per loop iteration with the decoded operands alternating between two register
sets. This took the 5 ``bar.sync`` + ``MEMBAR`` a step that Gluon puts around TMA issues in a single-partition
loop out of the consumers' path (H100: 1024 x 8192^2 212 -> 184 us). Grouped calls of smaller blocks (the MoE at
a few rows per expert) keep the single-partition loop; ``MXKIT_WGMMA_WS=0`` / ``1`` forces either (:func:`_ws`).
Grouped launches of one block size run it persistent (:func:`_persist`): one program an SM over the tiles,
the producer loading the next tile's first steps during the last one's epilogue.

The weight layout (:func:`pack_wgmma`, once per weight): the codes [N, Kp / 2] with K padded to Kp, a
multiple of 64, and each 32-byte step permuted so that lane c of a quad finds its 8 bytes contiguous:
``q[n, 32 t + 8 c + i] = qdata[n, 32 t + c + 4 i]`` (c < 4, i < 8); the scales step-major,
``st[t, 2 n + j] = scale[n, 2 t + j]``. Element k = 64 t + 8 i + 2 c + e of row n is then the low (e = 0) or
high nibble of q[n, 32 t + 8 c + i], which is the wgmma A-fragment order of k (lanes c, registers i, e).
:func:`unpack_wgmma` is the inverse (tests).

The kernel also reads the decode-mma kernel's layout (``layout="mma"``, :func:`_mma_decode.pack_mma`: per 16
rows and 64 columns, lane l = 4 g + t's 16 bytes hold its A-fragment codes of rows g, g + 8 for four k-steps,
bits placed for a mask-and-shift decode), so one copy of MoE experts serves decode and prefill. That layout
permutes K inside each 64 columns (:func:`mma_k_order`); wgmma reads x from shared memory in its own order, so
x comes with its columns in that order (the MoE gather writes them so, and the first GEMM's epilogue writes h
so for the second). Its decode is cheaper (a mask, at most one shift, and the multiplies per register): the
MoE prefill runs 4-14% faster on it than on this module's layout (H100).

MXFP8 weights (``elem`` "e4m3" / "e5m2", W8A16; :func:`pack_wgmma8`): 64 code bytes a row per step, lane c's 16
contiguous (``q[n, 64 t + 16 c + j] = qdata[n, 64 t + 8 (j // 2) + 2 c + j % 2]``), the same scale layout. A
pair of codes decodes in four integer operations (each byte into a bf16's high byte, shifted onto the bf16
exponent and mantissa, the sign kept: the element value times 2^-120 for E4M3, 2^-112 for E5M2, subnormals
included) and one or two bf16 multiplies, exact like the E2M1 decode; NaN / Inf codes do not survive it, so
weights holding them stay off this kernel (``PackedWeight.has_nan``). On the H100 it makes bf16 x MXFP8 at
M = 64 a 2.7-3.7x faster GEMM than dequantize + cuBLAS (8192 x 8192: 46 against 125 us) and 1.1-1.5x cuBLAS
bf16 on the bf16 weight.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ...packed import PackedWeight
from .._env import env
from ._split_sum import split_sum, split_sum_launch, split_sum_plan

FP8_ELEMS = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2"}  # the MXFP8 weights the kernel reads (``elem``)
# the kernel's WEIGHT constexpr of each (layout, elem) it reads
WEIGHTS = {("wgmma", "e2m1"): 0, ("mma", "e2m1"): 1, ("wgmma", "e4m3"): 2, ("wgmma", "e5m2"): 3}
BN = 128      # weight rows per program (wgmma M: 8 warps x 16 rows); K goes in steps of 64
WARPS = 8
STAGES = 4    # slots of the TMA ring
STAGES_SMALL_M = 6  # ... in dense calls of 64-token tiles (M <= 64), whose steps are short (:func:`_stages`)
GROUP_M = 8   # programs along M that share weight tiles in L2 (launch order)


def _pack_codes(qdata: torch.Tensor, scale: torch.Tensor, code_bytes: int, name: str) -> tuple:
    """(q, st) of :func:`pack_wgmma` (``code_bytes`` 1: E2M1 codes, two a byte) or :func:`pack_wgmma8` (2: FP8
    codes): K padded with zero bytes to the next multiple of 64, each 64-column step of 32 * code_bytes bytes
    permuted from (register i, lane c, e) to (c, i, e), e the code_bytes bytes of a lane's register pair, so that
    lane c's bytes of a row are contiguous; scales step-major. ValueError on other shapes."""
    if qdata.dim() != 2 or scale.dim() != 2 or qdata.shape[0] != scale.shape[0] or qdata.shape[0] % 8 \
            or scale.shape[1] * 16 * code_bytes != qdata.shape[1]:
        k = "K/2" if code_bytes == 1 else "K"
        raise ValueError(f"{name} needs qdata [N, {k}] and scale [N, K/32] with N % 8 == 0; got "
                         f"{tuple(qdata.shape)} and {tuple(scale.shape)}")
    N, KB = qdata.shape
    step = 32 * code_bytes
    steps = -(-KB // step)
    q = torch.zeros(N, steps * step, dtype=torch.uint8, device=qdata.device)
    q[:, :KB] = qdata
    q = q.view(N, steps, 8, 4, code_bytes).transpose(2, 3).reshape(N, steps * step).contiguous()
    return q, _pack_scales(scale, steps)


def _unpack_codes(q: torch.Tensor, st: torch.Tensor, K: int, code_bytes: int) -> tuple:
    """The inverse of :func:`_pack_codes`: (qdata uint8 [N, K * code_bytes / 2], scale uint8 [N, K / 32])."""
    N, KB = q.shape
    qd = q.view(N, KB // (32 * code_bytes), 4, 8, code_bytes).transpose(2, 3).reshape(N, KB)
    return qd[:, :K * code_bytes // 2].contiguous(), _unpack_scales(st, N, K)


def pack_wgmma(qdata: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """MXFP4 ``qdata`` uint8 [N, K / 2] and E8M0 ``scale`` uint8 [N, K / 32] (K along the last axis, N % 8 == 0)
    -> (q uint8 [N, Kp / 2], st uint8 [Kp / 64, 2 N], one_mul) in this module's layout (K padded with zero
    codes and zero scale bytes to Kp = the next multiple of 64); one_mul: every scale byte is <= 128 (the
    one-multiply decode). ValueError on other shapes."""
    q, st = _pack_codes(qdata, scale, 1, "pack_wgmma")
    return q, st, bool(scale.numel() == 0 or int(scale.max()) <= 128)


def pack_wgmma8(qdata: torch.Tensor, scale: torch.Tensor, elem: str, scale_max: int
                ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """MXFP8 (``elem`` "e4m3" / "e5m2") ``qdata`` uint8 [N, K] and E8M0 ``scale`` uint8 [N, K / 32] (N % 8 == 0)
    -> (q uint8 [N, Kp], st uint8 [Kp / 64, 2 N], one_mul), K padded with zero codes and scale bytes to Kp, a
    multiple of 64. Each 64-byte step is permuted so that lane c of a quad finds its 16 codes contiguous:
    ``q[n, 64 t + 16 c + j] = qdata[n, 64 t + 8 (j // 2) + 2 c + j % 2]`` (the wgmma A-fragment order of k:
    lanes c, registers j); scales as :func:`pack_wgmma`'s. one_mul: ``scale_max`` (the largest scale byte
    other than 0xFF) keeps the block factor times 2^R a bf16 (:data:`FP8`). ValueError on other shapes or
    element names."""
    if elem not in FP8:
        raise ValueError(f"pack_wgmma8 takes elem in {tuple(FP8)}, got {elem!r}")
    return (*_pack_codes(qdata, scale, 2, "pack_wgmma8"), scale_max <= FP8[elem][3])


def _pack_scales(scale: torch.Tensor, steps: int) -> torch.Tensor:
    """E8M0 ``scale`` uint8 [N, K / 32] -> step-major st uint8 [steps, 2 N], ``st[t, 2 n + j] = scale[n, 2 t + j]``
    (zero bytes past K)."""
    N = scale.shape[0]
    s = torch.zeros(N, steps * 2, dtype=torch.uint8, device=scale.device)
    s[:, :scale.shape[1]] = scale
    return s.view(N, steps, 2).transpose(0, 1).reshape(steps, 2 * N).contiguous()


def _unpack_scales(st: torch.Tensor, N: int, K: int) -> torch.Tensor:
    return st.view(-1, N, 2).transpose(0, 1).reshape(N, -1)[:, :K // 32].contiguous()


def unpack_wgmma8(q: torch.Tensor, st: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_wgmma8`: (qdata uint8 [N, K], scale uint8 [N, K / 32])."""
    return _unpack_codes(q, st, K, 2)


def expert_row_order(N: int, act_pairs: Optional[str], device=None) -> torch.Tensor:
    """int64 [N]: the source row of each packed row of an expert's gate_up weight (N rows) for the fused
    activation: in each 16 packed rows 16 b + 8 h + r, h = 0 the gate and h = 1 the up row of output column
    8 b + r (one thread's accumulator registers). ``act_pairs``: ``"swiglu_gpt_oss"`` (rows interleaved gate,
    up, gate, ... as GPT-OSS's checkpoint), ``"swiglu"`` (``[gate; up]`` halves), or None (identity)."""
    p = torch.arange(N, device=device)
    if act_pairs is None:
        return p
    if N % 16:
        raise ValueError(f"the fused activation needs the gate_up rows N % 16 == 0, got {N}")
    b, h, r = p // 16, p // 8 % 2, p % 8
    c = 8 * b + r
    return 2 * c + h if act_pairs == "swiglu_gpt_oss" else c + h * (N // 2)


def pack_wgmma_experts(qdata: torch.Tensor, scale: torch.Tensor, act_pairs: Optional[str] = None,
                       elem: str = "e2m1", scale_max: int = 255) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """E MXFP4 experts, ``qdata`` uint8 [E, N, K / 2] and ``scale`` uint8 [E, N, K / 32] -> :func:`pack_wgmma`
    of the [E * N, K] weight with each expert's rows in :func:`expert_row_order` (for the grouped kernel); MXFP8
    ones (``elem`` "e4m3" / "e5m2", ``qdata`` [E, N, K], ``scale_max`` their largest scale byte other than
    0xFF) -> :func:`pack_wgmma8` of it."""
    E, N = qdata.shape[:2]
    if act_pairs is not None:
        order = expert_row_order(N, act_pairs, qdata.device)
        qdata, scale = qdata[:, order], scale[:, order]
    if elem != "e2m1":
        return pack_wgmma8(qdata.reshape(E * N, -1), scale.reshape(E * N, -1), elem, scale_max)
    return pack_wgmma(qdata.reshape(E * N, -1), scale.reshape(E * N, -1))


def unpack_wgmma(q: torch.Tensor, st: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_wgmma`: (qdata uint8 [N, K / 2], scale uint8 [N, K / 32])."""
    return _unpack_codes(q, st, K, 1)


def shape_ok(N: int, K: int) -> bool:
    """Whether the kernel takes a weight of this shape (TMA: the step-major scale rows of 2N bytes are 16-byte
    aligned)."""
    return N % 8 == 0 and K % 32 == 0 and N > 0 and K > 0


@functools.lru_cache(maxsize=None)
def _gluon():
    """The Gluon modules, or the ImportError's text."""
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                      warpgroup_mma_wait)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        return f"{type(e).__name__}: {e}"
    return gluon, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, TensorDescriptor


@functools.lru_cache(maxsize=None)
def _launch_order():
    """The Gluon helper both wgmma kernels (this one and ``_fp8_wgmma``) order their output tiles by: tile ->
    (pid_m, pid_n), ``GROUP`` tiles along M at a time so that they share the weight's tiles in L2."""
    gluon, gl = _gluon()[:2]

    @gluon.jit
    def launch_order(tile, grid_m, grid_n, GROUP: gl.constexpr):
        per_group = GROUP * grid_n
        first_m = (tile // per_group) * GROUP
        rows_m = gl.minimum(grid_m - first_m, GROUP)
        return first_m + (tile % per_group) % rows_m, (tile % per_group) // rows_m

    return launch_order


def available(device: torch.device) -> Optional[str]:
    """None when the kernel can run on ``device``, else why not (not CUDA, not sm_90 (wgmma is Hopper's), no
    Gluon in the installed Triton, ``MXKIT_W4A16_WGMMA=0``)."""
    if device.type != "cuda":
        return "not a CUDA device"
    if env("MXKIT_W4A16_WGMMA", "1") == "0":
        return "MXKIT_W4A16_WGMMA=0"
    return _available_on(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _available_on(index: int) -> Optional[str]:
    cc = torch.cuda.get_device_capability(index)
    if cc != (9, 0):
        return f"wgmma needs sm_90, this GPU is sm_{''.join(map(str, cc))}"
    g = _gluon()
    return g if isinstance(g, str) else None


def _fp4_pairs_asm(one_mul: bool) -> str:
    """PTX: $4 four packed bytes (8 E2M1 codes, element 2i in byte i's low nibble), $5 the block factor as bf16x2
    (both halves equal; times 2^126 when one_mul) -> $0 .. $3 the (even, odd) elements of bytes 0 .. 3 as bf16x2.
    Per byte: its magnitude bits e1 e0 m at bits 8-6 of each bf16 half (one multiply by 2^6 + 2^18), its sign
    bits at 15 and 31 (by 2^12 + 2^24), joined by lop3: a bf16 equal to the E2M1 value times 2^-126 (the
    subnormal 0.5 included); then times 2^126 and the factor (exact), or times the factor 2^(s - 1)."""
    lines = ["{", ".reg .b32 b, z, s, k;", "mov.b32 k, 0x7E807E80;"]
    for i in range(4):
        lines += [f"prmt.b32 b, $4, 0, 0x{0x4440 + i:04X};",
                  "mul.lo.u32 z, b, 0x00040040;", "mul.lo.u32 s, b, 0x01001000;",
                  "and.b32 z, z, 0x01C001C0;", "lop3.b32 z, z, s, 0x80008000, 0xF8;"]
        if not one_mul:
            lines += ["mul.rn.bf16x2 z, z, k;"]
        lines += [f"mul.rn.bf16x2 ${i}, z, $5;"]
    return " ".join(lines + ["}"])


def _mma_words_asm(one_mul: bool) -> str:
    """PTX: $4 one word of the decode-mma layout (8 E2M1 codes at :data:`_mma_decode.BITS`), $5 / $6 the block
    factors of rows g / g + 8 as bf16x2 (both halves equal; times 2^126 when one_mul) -> $0 .. $3 the bf16x2
    A-fragment registers (row g, row g + 8) x (columns 2t, 2t + 1 | 2t + 8, 2t + 9) of ``mma_decode.cu``'s
    decode8: magnitude bits at 8..6 and sign at 15 of each half by a mask (one shift for three of the four), a
    bf16 equal to the E2M1 value times 2^-126, then times 2^126 and the factor (exact), or times the factor
    2^(s - 1) at once."""
    P = "0x81C081C0"
    parts = [f"and.b32 z, $4, {P};", f"shl.b32 u, $4, 3; and.b32 z, u, {P};", f"shl.b32 u, $4, 6; and.b32 z, u, {P};",
             "shr.b32 u, $4, 4; and.b32 z, u, 0x00C000C0; shr.b32 u, $4, 5; and.b32 u, u, 0x01000100; "
             "or.b32 z, z, u; shl.b32 u, $4, 1; and.b32 u, u, 0x80008000; or.b32 z, z, u;"]
    lines = ["{", ".reg .b32 z, u, k;", "mov.b32 k, 0x7E807E80;"]
    for i, part in enumerate(parts):
        lines.append(part)
        if not one_mul:
            lines.append("mul.rn.bf16x2 z, z, k;")
        lines.append(f"mul.rn.bf16x2 ${i}, z, ${5 + i % 2};")
    return " ".join(lines + ["}"])


# FP8 weights (W8A16): per element format, (shift of the byte placed in a bf16's high byte, magnitude mask, the
# exponent R with value(bits) = element value x 2^-R, the largest scale byte whose factor 2^(s - 127 + R) is a bf16)
FP8 = {"e4m3": (4, 0x07F007F0, 120, 134), "e5m2": (3, 0x0FE00FE0, 112, 142)}


def _fp8_pairs_asm(elem: str, one_mul: bool) -> str:
    """PTX: $2 four E4M3 / E5M2 codes (byte i = element i), $3 / $4 the block factors of elements 0, 1 / 2, 3 as
    bf16x2 -> $0 / $1 elements (0, 1) / (2, 3) as bf16x2. Per pair: each byte into the high byte of a 16-bit half
    (prmt), shifted right so its exponent and mantissa bits land on a bf16's (masked), its sign at bit 15 (lop3):
    a bf16 equal to the element value times 2^-R (subnormals included; R = 120 for E4M3, 112 for E5M2), then
    times 2^R and the block factor (exact), or times the factor 2^(s - 127 + R) at once. NaN / Inf codes do not
    decode to NaN / Inf: weights holding them take another path (``PackedWeight.has_nan``)."""
    sh, mask, r, _ = FP8[elem]
    lines = ["{", ".reg .b32 v, a, z, k;", f"mov.b32 k, 0x{(r + 127) << 7:04X}{(r + 127) << 7:04X};"]
    for out, sel, f in ((0, "0x1404", 3), (1, "0x3424", 4)):
        lines += [f"prmt.b32 v, $2, 0, {sel};", f"shr.b32 a, v, {sh};", f"and.b32 a, a, 0x{mask:08X};",
                  "lop3.b32 z, v, 0x80008000, a, 0xEA;"]
        if not one_mul:
            lines += ["mul.rn.bf16x2 z, z, k;"]
        lines += [f"mul.rn.bf16x2 ${out}, z, ${f};"]
    return " ".join(lines + ["}"])


@functools.lru_cache(maxsize=None)
def _kernel():
    """Build the Gluon kernel (once; needs Triton's Gluon)."""
    gluon, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, _ = _gluon()
    import triton.language as tl

    launch_order = _launch_order()

    asm2, asm1 = gl.constexpr(_fp4_pairs_asm(False)), gl.constexpr(_fp4_pairs_asm(True))
    masm2, masm1 = gl.constexpr(_mma_words_asm(False)), gl.constexpr(_mma_words_asm(True))
    e4m3_2, e4m3_1 = gl.constexpr(_fp8_pairs_asm("e4m3", False)), gl.constexpr(_fp8_pairs_asm("e4m3", True))
    e5m2_2, e5m2_1 = gl.constexpr(_fp8_pairs_asm("e5m2", False)), gl.constexpr(_fp8_pairs_asm("e5m2", True))
    # TMA load: async_copy_global_to_shared in Triton 3.6, renamed async_load later (the old name then raises)
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    NAN_ALL = gl.constexpr(tl.PropagateNan.ALL)

    @gluon.jit
    def _e8m0_bf16(sb):
        # 2^(s - 127) as bf16 bits: exponent field s for s >= 1, subnormal 0x0040 for 0, NaN for 255
        bits = gl.where(sb >= 1, sb << 7, 0x0040)
        bits = gl.where(sb == 255, 0x7FC0, bits)
        return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)

    @gluon.jit
    def _decode(w_tile, s_tile, BNc: gl.constexpr, B2: gl.constexpr, S2: gl.constexpr, BL: gl.constexpr,
                L3: gl.constexpr, DOT: gl.constexpr, ONE_MUL: gl.constexpr):
        # bytes [BN, 4 (c), 8 (i)]: lane c's 8 bytes of its rows, contiguous
        byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc, 4, 8]), BL, assert_trivial=True)
        sb = s_tile.load(S2).to(gl.int32)                        # [1, 2 BN]: row r, block j at 2 r + j
        if ONE_MUL:
            f = _e8m0_bf16(sb + 126)                             # 2^(s - 1), s <= 128
        else:
            f = _e8m0_bf16(sb)
        f = gl.convert_layout(gl.reshape(f, [BNc, 2]), gl.SliceLayout(1, L3), assert_trivial=True)
        f = gl.broadcast(gl.expand_dims(f, 1), gl.full([BNc, 4, 2], 0, gl.bfloat16, L3))[0]  # [BN, c, j]
        f = gl.join(f, f)
        f = gl.join(f, f)                                        # [BN, c, j, 2, 2]: i = 4 j + (i % 4)
        f = gl.convert_layout(gl.reshape(f, [BNc, 4, 8]), BL, assert_trivial=True)
        if ONE_MUL:
            a, b = gl.inline_asm_elementwise(asm1, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=4)
        else:
            a, b = gl.inline_asm_elementwise(asm2, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=4)
        # a[i % 4 = q]: byte q // 2 of the four, element parity q % 2; b: bytes 2, 3
        w = gl.join(a, b)                                        # [BN, 4 (c), 8 (i = 4 j + 2 q1 + q0), 2 (s)]
        w = gl.reshape(w, [BNc, 2, 2, 2, 2, 2, 2])               # [BN, c1, c0, j, q1, q0, s]
        w = gl.permute(w, (0, 3, 6, 4, 1, 2, 5))                 # k = 32 j + 16 s + 8 q1 + 4 c1 + 2 c0 + q0
        return gl.convert_layout(gl.reshape(w, [BNc, 64]), DOT, assert_trivial=True)

    @gluon.jit
    def _decode_mma(w_tile, s_tile, BNc: gl.constexpr, B2: gl.constexpr, S2: gl.constexpr, BL: gl.constexpr,
                    DOT: gl.constexpr, ONE_MUL: gl.constexpr):
        # the decode-mma layout: per 16 rows (group) 512 bytes, lane l = 4 g + t's 16 bytes at 16 l: word j of
        # the four is k-step j's A fragment of rows g, g + 8 (K permuted inside the 64: x comes permuted alike)
        byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc // 2, 4, 16]), BL, assert_trivial=True)
        sb = gl.reshape(s_tile.load(S2), [BNc // 2, 2, 2]).to(gl.int32)   # [(group, g), h, b]: 4 g + 2 h + b
        if ONE_MUL:
            f = _e8m0_bf16(sb + 126)                                     # 2^(s - 1), s <= 128
        else:
            f = _e8m0_bf16(sb)
        f = gl.permute(f, (0, 2, 1))                                     # [.., b, h]
        f = gl.join(f, f)                                                # [.., b, h, d]
        f = gl.join(f, f)                                                # [.., b, h, d, s]
        f = gl.reshape(gl.permute(f, (0, 1, 4, 2, 3)), [BNc // 2, 16])    # j = 2 b + s, slot q = 2 h + d
        f = gl.convert_layout(f, gl.SliceLayout(1, BL), assert_trivial=True)
        f = gl.broadcast(gl.expand_dims(f, 1), gl.full([BNc // 2, 4, 16], 0, gl.bfloat16, BL))[0]
        if ONE_MUL:
            a, b = gl.inline_asm_elementwise(masm1, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=4)
        else:
            a, b = gl.inline_asm_elementwise(masm2, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                             is_pure=True, pack=4)
        # a: slots (row g, g + 8) x (column 2t, 2t + 1) of word j; b: columns + 8
        w = gl.reshape(gl.join(a, b), [BNc // 16, 8, 4, 4, 2, 2, 2])     # [group, g, t, j, h, e, kh]
        # row 16 group + 8 h + g; k 16 j + 8 kh + 2 t + e
        w = gl.permute(w, (0, 4, 1, 3, 6, 2, 5))
        return gl.convert_layout(gl.reshape(w, [BNc, 64]), DOT, assert_trivial=True)

    @gluon.jit
    def _decode8(w_tile, s_tile, BNc: gl.constexpr, B2: gl.constexpr, S2: gl.constexpr, BL: gl.constexpr,
                 L3: gl.constexpr, DOT: gl.constexpr, ONE_MUL: gl.constexpr, W8: gl.constexpr):
        # FP8 codes [BN, 4 (c), 16 (j)]: lane c's 16 bytes of its rows, element k = 8 (j // 2) + 2 c + j % 2
        byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc, 4, 16]), BL, assert_trivial=True)
        sb = s_tile.load(S2).to(gl.int32)                        # [1, 2 BN]: row r, block j at 2 r + j
        if ONE_MUL:
            if W8 == 1:
                f = _e8m0_bf16(sb + 120)                         # 2^(s - 7), s <= 134
            else:
                f = _e8m0_bf16(sb + 112)                         # 2^(s - 15), s <= 142
        else:
            f = _e8m0_bf16(sb)
        f = gl.convert_layout(gl.reshape(f, [BNc, 2]), gl.SliceLayout(1, L3), assert_trivial=True)
        f = gl.broadcast(gl.expand_dims(f, 1), gl.full([BNc, 4, 2], 0, gl.bfloat16, L3))[0]  # [BN, c, block]
        f = gl.join(f, f)
        f = gl.join(f, f)
        f = gl.join(f, f)                                        # bytes j of block j // 8
        f = gl.convert_layout(gl.reshape(f, [BNc, 4, 16]), BL, assert_trivial=True)
        if W8 == 1:
            if ONE_MUL:
                w = gl.inline_asm_elementwise(e4m3_1, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
            else:
                w = gl.inline_asm_elementwise(e4m3_2, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
        else:
            if ONE_MUL:
                w = gl.inline_asm_elementwise(e5m2_1, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
            else:
                w = gl.inline_asm_elementwise(e5m2_2, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
        w = gl.permute(gl.reshape(w, [BNc, 4, 8, 2]), (0, 2, 1, 3))   # [BN, i, c, e]: k = 8 i + 2 c + e
        return gl.convert_layout(gl.reshape(w, [BNc, 64]), DOT, assert_trivial=True)

    @gluon.jit
    def _decode_any(w_tile, s_tile, BNc, B2, S2, BL, L3, DOT, ONE_MUL, MMA, W8):  # constexprs past the tiles
        if MMA:
            w = _decode_mma(w_tile, s_tile, BNc, B2, S2, BL, DOT, ONE_MUL)
        elif W8 != 0:
            w = _decode8(w_tile, s_tile, BNc, B2, S2, BL, L3, DOT, ONE_MUL, W8)
        else:
            w = _decode(w_tile, s_tile, BNc, B2, S2, BL, L3, DOT, ONE_MUL)
        return w

    @gluon.jit
    def _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES, MMA, W8):
        # step t (K step T0 + t of the weight: a split-K program starts at T0) into slot sl, signalling ready[sl]
        mbarrier.expect(ready.index(sl), NBYTES)
        k = T0 + t
        tma_load(x_desc, [off_m, k * 64], ready.index(sl), x_smem.index(sl))
        if MMA:  # the decode-mma layout: [N / 16, K / 64 * 2, 256] bytes and [N / 16, K / 64 * 32] scale bytes
            tma_load(w_desc, [row0 // 16, 2 * k, 0], ready.index(sl), w_smem.index(sl))
            tma_load(s_desc, [row0 // 16, 32 * k], ready.index(sl), s_smem.index(sl))
        else:  # (FP8 codes: 64 bytes a row per step; E2M1: 32)
            tma_load(w_desc, [row0, k * (64 if W8 != 0 else 32)], ready.index(sl), w_smem.index(sl))
            tma_load(s_desc, [k, 2 * row0], ready.index(sl), s_smem.index(sl))

    @gluon.jit
    def _step(t, acc, w_use, w_next, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0,
              T0, STEPS, NBYTES, STAGES, BNc, B2, S2, BL, L3, DOT, ONE_MUL, WS, MMA, W8, C0):
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
                _load(tn, tn % STAGES, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES,
                      MMA, W8)
        t1 = C0 + gl.minimum(t + 1, STEPS - 1)
        s1 = t1 % STAGES
        mbarrier.wait(ready.index(s1), (t1 // STAGES) & 1)
        w_next = _decode_any(w_smem.index(s1), s_smem.index(s1), BNc, B2, S2, BL, L3, DOT, ONE_MUL, MMA, W8)
        return acc, w_next

    @gluon.jit
    def _mainloop(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0, T0, STEPS, NBYTES,
                  STAGES, BNc, BM, B2, S2, BL, L3, ACC, DOT, ONE_MUL, WS, MMA, W8, C0=0, PERSIST=False):
        # the decode + wgmma loop (the consumers, or every warp without WS), two steps per iteration with the
        # weight operands alternating between w0 and w1 (no register copies); the ring's steps C0 .. C0 + STEPS - 1
        acc = gl.zeros([BNc, BM], gl.float32, layout=ACC)
        mbarrier.wait(ready.index(C0 % STAGES), (C0 // STAGES) & 1)
        w0 = _decode_any(w_smem.index(C0 % STAGES), s_smem.index(C0 % STAGES), BNc, B2, S2, BL, L3, DOT, ONE_MUL,
                         MMA, W8)
        w1 = w0
        for t in range(0, STEPS - 1, 2):
            acc, w1 = _step(t, acc, w0, w1, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m,
                            row0, T0, STEPS, NBYTES, STAGES, BNc, B2, S2, BL, L3, DOT, ONE_MUL, WS, MMA, W8, C0)
            acc, w0 = _step(t + 1, acc, w1, w0, x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m,
                            row0, T0, STEPS, NBYTES, STAGES, BNc, B2, S2, BL, L3, DOT, ONE_MUL, WS, MMA, W8, C0)
        if STEPS % 2 == 1:  # the last step's weight is in w0
            acc = warpgroup_mma(w0, x_smem.index((C0 + STEPS - 1) % STAGES).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if PERSIST:  # the slots the loop did not give back (its last step's, and with STEPS odd the one before)
            if STEPS % 2 == 1:
                mbarrier.arrive(empty.index((C0 + STEPS - 2) % STAGES), pred=STEPS > 1)
            mbarrier.arrive(empty.index((C0 + STEPS - 1) % STAGES))
        return (acc,)  # a tuple: gl.warp_specialize flattens the default partition's results

    @gluon.jit
    def _produce(x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, off_m, row0, T0, STEPS, NBYTES,
                 STAGES, MMA, W8):
        # the TMA producer (one warp): step t into slot t % STAGES once the consumers freed it
        for t in range(STEPS):
            sl = t % STAGES
            mbarrier.wait(empty.index(sl), ((t // STAGES) & 1) ^ 1)
            _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES, MMA, W8)

    @gluon.jit
    def _pairs(t, BNc: gl.constexpr, BM: gl.constexpr):
        # [BNc, BM] -> its rows 16 b + r (gate) and 16 b + 8 + r (up), [BNc / 16, 8, BM] each: one thread's
        # registers (the accumulator layout's row 8 is a register bit)
        return gl.split(gl.permute(gl.reshape(t, [BNc // 16, 2, 8, BM]), (0, 2, 3, 1)))

    @gluon.jit
    def _adjacent(t, PAIR: gl.constexpr, BNc: gl.constexpr, BM: gl.constexpr):
        # [BNc, BM] -> its rows 2 c and 2 c + 1, [BNc / 2, BM] each (PAIR: row bit 0 a register bit)
        t = gl.permute(gl.reshape(gl.convert_layout(t, PAIR), [BNc // 2, 2, BM]), (0, 2, 1))
        return gl.split(t)

    @gluon.jit
    def _act(gate, up, ACT: gl.constexpr):
        # _grouped._act_pairs' activations, float32
        if ACT == 1:  # transformers' GptOssExperts: alpha 1.702, limit 7.0
            gate = gl.minimum(gate, 7.0, propagate_nan=NAN_ALL)  # NaN stays NaN, as torch's clamp
            up = gl.minimum(gl.maximum(up, -7.0, propagate_nan=NAN_ALL), 7.0, propagate_nan=NAN_ALL)
            out = (up + 1.0) * (gate / (1.0 + gl.exp(-1.702 * gate)))
        else:
            out = gate / (1.0 + gl.exp(-gate)) * up
        return out

    @gluon.jit
    def _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, pid_k, stride_ym, stride_yk, BNc: gl.constexpr,
                  BM: gl.constexpr, ACC: gl.constexpr, PAIR: gl.constexpr, HAS_BIAS: gl.constexpr, ACT: gl.constexpr,
                  MMA: gl.constexpr, PERM_OUT: gl.constexpr):
        # bias, activation, the one rounding and the store of a tile's float32 sums (acc [BN weight rows, BM tokens])
        n_o = off_n + gl.arange(0, BNc, layout=gl.SliceLayout(1, ACC))
        m_o = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, ACC))
        if HAS_BIAS:
            b = gl.load(b_ptr + (row0 - off_n) + n_o, mask=n_o < N, other=0.0).to(gl.float32)  # (bf16: exact)
            acc = acc + gl.expand_dims(b, 1)
        n2 = gl.expand_dims(n_o, 1) + gl.zeros([BNc, BM], gl.int32, ACC)
        m2 = gl.expand_dims(m_o, 0) + gl.zeros([BNc, BM], gl.int32, ACC)
        if ACT != 0 and MMA:
            # the decode-mma row order (gate 2 c, up 2 c + 1): a shuffle puts each pair in one thread
            gate, up = _adjacent(acc, PAIR, BNc, BM)
            out = _act(gate, up, ACT)
            n2, _ = _adjacent(n2, PAIR, BNc, BM)
            m2, _ = _adjacent(m2, PAIR, BNc, BM)
            col = n2 // 2
        elif ACT != 0:
            # rows 16 b + r (gate) and 16 b + 8 + r (up) of the tile are one thread's registers: output column
            # 8 b + r of the pair (pack_wgmma_experts' row order)
            gate, up = _pairs(acc, BNc, BM)
            out = _act(gate, up, ACT)
            n2, _ = _pairs(n2, BNc, BM)
            m2, _ = _pairs(m2, BNc, BM)
            col = (n2 // 16) * 8 + n2 % 8
        else:
            out = acc
            col = n2
        if PERM_OUT:  # columns in the decode-mma layout's K order (the next GEMM's x): 64 c + k -> 64 c + kl(k)
            k = col % 64
            col = col - k + ((k & 1) | (((k >> 3) & 3) << 1) | (((k >> 1) & 1) << 3) | (((k >> 2) & 1) << 4) | (k & 32))
        ptr = y_ptr + pid_k.to(gl.int64) * stride_yk + m2.to(gl.int64) * stride_ym + col
        mask = (n2 < N) & (m2 < M)
        gl.store(ptr, out.to(y_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _tile(tile, e_ptr, M, N, NB, BNc: gl.constexpr, BM: gl.constexpr, GROUP: gl.constexpr,
              GROUPED: gl.constexpr, STARTS: gl.constexpr):
        # output tile `tile` of the launch order (GROUP programs along M share weight tiles): its expert (grouped:
        # -1 for an unused block, whose tile is skipped; 0 dense), first token row, first output column and first
        # packed weight row
        pid_m, pid_n = launch_order(tile, NB if GROUPED else gl.cdiv(M, BM), gl.cdiv(N, BNc), GROUP)
        off_n = pid_n * BNc
        off_m = pid_m * BM
        e = pid_m * 0
        if GROUPED:  # block pid_m of the sorted rows is expert e's; its N rows follow expert e - 1's
            e = gl.load(e_ptr + pid_m)
            if STARTS:  # the block's first sorted row from the table's second half (blocks of mixed sizes)
                off_m = gl.load(e_ptr + NB + pid_m)
        return e, off_m, off_n, e * N + off_n

    @gluon.jit
    def _consume_tiles(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, y_ptr, b_ptr, e_ptr, M, N, NB,
                       STEPS, stride_ym, NBYTES, STAGES, GROUP, BNc, BM, B2, S2, BL, L3, ACC, DOT, PAIR, ONE_MUL, MMA,
                       W8, HAS_BIAS, ACT, PERM_OUT, GROUPED, STARTS):
        # the persistent program's consumers: tiles program_id, + num_programs, ...; each tile's K loop on the
        # ring's next STEPS steps, then its epilogue while the producer already loads the next tile's first steps
        n_tiles = (NB if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BNc)
        c0 = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, off_m, off_n, row0 = _tile(tile, e_ptr, M, N, NB, BNc, BM, GROUP, GROUPED, STARTS)
            if e >= 0:
                (acc,) = _mainloop(x_smem, w_smem, s_smem, ready, empty, x_desc, w_desc, s_desc, off_m, row0, 0, STEPS,
                                   NBYTES, STAGES, BNc, BM, B2, S2, BL, L3, ACC, DOT, ONE_MUL, True, MMA, W8, c0, True)
                _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, gl.program_id(1), stride_ym, 0, BNc, BM, ACC,
                          PAIR, HAS_BIAS, ACT, MMA, PERM_OUT)
                c0 += STEPS
        return ()

    @gluon.jit
    def _produce_tiles(x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, ready, empty, e_ptr, M, N, NB, STEPS, NBYTES,
                       STAGES, GROUP, BNc, BM, MMA, W8, GROUPED, STARTS):
        # the persistent program's TMA producer (one warp): the same tiles in the same order, ring step c into slot
        # c % STAGES once the consumers freed it
        n_tiles = (NB if GROUPED else gl.cdiv(M, BM)) * gl.cdiv(N, BNc)
        c0 = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            e, off_m, off_n, row0 = _tile(tile, e_ptr, M, N, NB, BNc, BM, GROUP, GROUPED, STARTS)
            if e >= 0:
                for t in range(STEPS):
                    c = c0 + t
                    sl = c % STAGES
                    mbarrier.wait(empty.index(sl), ((c // STAGES) & 1) ^ 1)
                    _load(t, sl, ready, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, 0, NBYTES, MMA,
                          W8)
                c0 += STEPS

    @gluon.jit
    def _ring(x_desc, w_desc, s_desc, STAGES: gl.constexpr, BNc: gl.constexpr, BM: gl.constexpr, MMA: gl.constexpr,
              W8: gl.constexpr):
        # the TMA ring's slots (x, weight bytes, scale bytes), its `ready` mbarriers (initialized) and the `empty`
        # ones (the warp-specialized schedules initialize them)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, 64], x_desc.layout)
        if MMA:
            w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BNc // 16, 2, 256], w_desc.layout)
            s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, BNc // 16, 32], s_desc.layout)
        else:
            w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BNc, 64 if W8 != 0 else 32], w_desc.layout)
            s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, 2 * BNc], s_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        return x_smem, w_smem, s_smem, bars, empty

    @gluon.jit
    def w4a16_wgmma_kernel(x_desc, w_desc, s_desc, y_ptr, b_ptr, e_ptr, M, N, ALL_STEPS, KSTEPS, stride_ym,
                           stride_yk, NB,
                           BNc: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                           B2: gl.constexpr, S2: gl.constexpr, BL: gl.constexpr, L3: gl.constexpr,
                           ACC: gl.constexpr, DOT: gl.constexpr, ONE_MUL: gl.constexpr, HAS_BIAS: gl.constexpr,
                           GROUPED: gl.constexpr, ACT: gl.constexpr, SCHEDULE: gl.constexpr, WEIGHT: gl.constexpr,
                           PAIR: gl.constexpr, PERM_OUT: gl.constexpr, STARTS: gl.constexpr, num_warps: gl.constexpr):
        # WEIGHT (:data:`WEIGHTS`): E2M1 codes in this module's layout (0) or the decode-mma one (1), FP8 codes
        # (2: E4M3, 3: E5M2; the decode's W8 = 1 / 2). SCHEDULE: every warp loads and multiplies (0), a one-warp
        # TMA producer (1: WS), that persistent (2: one program an SM over the tiles)
        WS: gl.constexpr = SCHEDULE >= 1
        PERSIST: gl.constexpr = SCHEDULE == 2
        MMA: gl.constexpr = WEIGHT == 1
        W8: gl.constexpr = WEIGHT - 1 if WEIGHT >= 2 else 0
        # split-K (program_id(1) of the grid): K steps [T0, T0 + STEPS) into partial sum pid_k of y
        pid_k = gl.program_id(1)
        T0 = pid_k * KSTEPS
        STEPS = gl.minimum(ALL_STEPS - T0, KSTEPS)
        NBYTES: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
        if PERSIST:  # one program an SM over tiles program_id, + num_programs, ... (warp-specialized, no split)
            x_smem, w_smem, s_smem, bars, empty = _ring(x_desc, w_desc, s_desc, STAGES, BNc, BM, MMA, W8)
            for s in gl.static_range(STAGES):
                mbarrier.init(empty.index(s), count=1)
            gl.warp_specialize([(_consume_tiles, (x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc, y_ptr,
                                                  b_ptr, e_ptr, M, N, NB, ALL_STEPS, stride_ym, NBYTES, STAGES, GROUP,
                                                  BNc, BM, B2, S2, BL, L3, ACC, DOT, PAIR, ONE_MUL, MMA, W8, HAS_BIAS,
                                                  ACT, PERM_OUT, GROUPED, STARTS)),
                                (_produce_tiles, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, bars, empty, e_ptr,
                                                  M, N, NB, ALL_STEPS, NBYTES, STAGES, GROUP, BNc, BM, MMA, W8, GROUPED,
                                                  STARTS))], [1], [24])
            for s in gl.static_range(STAGES):
                mbarrier.invalidate(empty.index(s))
                mbarrier.invalidate(bars.index(s))
            return
        e, off_m, off_n, row0 = _tile(gl.program_id(0), e_ptr, M, N, NB, BNc, BM, GROUP, GROUPED, STARTS)
        if e < 0:  # (grouped: an unused block)
            return
        x_smem, w_smem, s_smem, bars, empty = _ring(x_desc, w_desc, s_desc, STAGES, BNc, BM, MMA, W8)
        if WS:  # a one-warp TMA producer; the 8 warps decode and multiply, freeing slots through `empty`
            for s in gl.static_range(STAGES):
                mbarrier.init(empty.index(s), count=1)
            (acc,) = gl.warp_specialize([(_mainloop, (x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc,
                                                      off_m, row0, T0, STEPS, NBYTES, STAGES, BNc, BM, B2, S2, BL,
                                                      L3, ACC, DOT, ONE_MUL, WS, MMA, W8)),
                                         (_produce, (x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, bars, empty,
                                                     off_m, row0, T0, STEPS, NBYTES, STAGES, MMA, W8))], [1], [24])
            for s in gl.static_range(STAGES):
                mbarrier.invalidate(empty.index(s))
        else:  # every warp: the first STAGES - 1 steps' TMA, then each step issues the one STAGES - 1 ahead
            for s in gl.static_range(STAGES - 1):
                if s < STEPS:
                    _load(s, s, bars, x_desc, w_desc, s_desc, x_smem, w_smem, s_smem, off_m, row0, T0, NBYTES, MMA,
                          W8)
            (acc,) = _mainloop(x_smem, w_smem, s_smem, bars, empty, x_desc, w_desc, s_desc, off_m, row0, T0, STEPS,
                               NBYTES, STAGES, BNc, BM, B2, S2, BL, L3, ACC, DOT, ONE_MUL, WS, MMA, W8)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        _epilogue(acc, y_ptr, b_ptr, M, N, off_m, off_n, row0, pid_k, stride_ym, stride_yk, BNc, BM, ACC, PAIR,
                  HAS_BIAS, ACT, MMA, PERM_OUT)

    return w4a16_wgmma_kernel


def _warp_bases(rows_per_warp: int, dims: int, at: int, scale: int = 1) -> list:
    out, w = [], rows_per_warp
    while w < rows_per_warp * WARPS:
        b = [0] * dims
        b[at] = w * scale
        out.append(b)
        w *= 2
    return out


@functools.lru_cache(maxsize=None)
def _layouts(BM: int):
    """(B2, S2, BL, L3, ACC, DOT): the byte tile [BN, 32] and scale tile [1, 2 BN] as loaded from shared memory,
    the bytes [BN, 4 (c), 8 (i)] and factors [BN, 4 (c), 2 (j)] per lane (rows: lanes 0-7 and registers +8 in
    each warp's 16, as the wgmma A fragment), the accumulator and the A-operand layout."""
    gl = _gluon()[1]
    lin = gl.DistributedLinearLayout
    quad = [[1, 0], [2, 0], [4, 0]]
    b2 = lin([[0, 1], [0, 2], [0, 4], [8, 0]], [[0, 8], [0, 16]] + quad, _warp_bases(16, 2, 0), [], [BN, 32])
    s2 = lin([[0, 1], [0, 16]], [[0, 0], [0, 0], [0, 2], [0, 4], [0, 8]], _warp_bases(16, 2, 1, 2), [], [1, 2 * BN])
    q3 = [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    bl = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3, _warp_bases(16, 3, 0), [],
             [BN, 4, 8])
    l3 = lin([[0, 0, 1], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3, _warp_bases(16, 3, 0), [], [BN, 4, 2])
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16])
    dot = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    return b2, s2, bl, l3, acc, dot


@functools.lru_cache(maxsize=None)
def _layouts_fp8():
    """(B2, BL) of FP8 codes: the byte tile [BN, 64] as loaded from shared memory (lane c of a quad: bytes
    16 c .. 16 c + 15 of its rows, one 16-byte load each) and the bytes [BN, 4 (c), 16] per lane (rows as in
    :func:`_layouts`)."""
    gl = _gluon()[1]
    lin = gl.DistributedLinearLayout
    quad = [[1, 0], [2, 0], [4, 0]]
    b2 = lin([[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]], [[0, 16], [0, 32]] + quad, _warp_bases(16, 2, 0), [],
             [BN, 64])
    q3 = [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    bl = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3,
             _warp_bases(16, 3, 0), [], [BN, 4, 16])
    return b2, bl


@functools.lru_cache(maxsize=None)
def _layouts_mma(BM: int):
    """(B2, S2, BL, PAIR) of the decode-mma layout: the byte tile [BN / 16, 2, 256] and scale tile [BN / 16, 32]
    as loaded from shared memory (lane l = 4 g + t: bytes 16 l .. 16 l + 15 of its warp's group, the 4 scale bytes
    of g), the bytes [BN / 2 (group, g), 4 (t), 16] per lane, and the accumulator with row bit 0 in a register
    (gate / up pairs of adjacent rows in one thread)."""
    gl = _gluon()[1]
    lin = gl.DistributedLinearLayout
    G = BN // 16
    warps3 = [[1 << i, 0, 0] for i in range(WARPS.bit_length() - 1)]
    warps2 = [[1 << i, 0] for i in range(WARPS.bit_length() - 1)]
    b2 = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8]], [[0, 0, 16], [0, 0, 32], [0, 0, 64], [0, 0, 128], [0, 1, 0]],
             warps3, [], [G, 2, 256])
    s2 = lin([[0, 1], [0, 2]], [[0, 0], [0, 0], [0, 4], [0, 8], [0, 16]], warps2, [], [G, 32])
    bl = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8]], [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
             [[8 << i, 0, 0] for i in range(WARPS.bit_length() - 1)], [], [BN // 2, 4, 16])
    cols = [[0, 8 << i] for i in range((BM // 8).bit_length() - 1)]
    pair = lin([[0, 1], [1, 0]] + cols, [[0, 2], [0, 4], [8, 0], [2, 0], [4, 0]],
               [[16 << i, 0] for i in range(WARPS.bit_length() - 1)], [], [BN, BM])
    return b2, s2, bl, pair


@functools.lru_cache(maxsize=None)
def _u8_layout(rank: int):
    return _gluon()[1].NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=rank)


def mma_k_order(K: int, device=None) -> torch.Tensor:
    """int64 [K]: the source column of each column of x for ``layout="mma"`` (K % 64 == 0): in each 64, column
    16 j + 8 kh + 2 t + e (the wgmma A-fragment order of step j) takes column 32 (j // 2) + 8 t + 4 (j % 2) + 2 kh
    + e (the decode-mma layout's order of the same weight codes, ``mma_decode.cu``)."""
    k = torch.arange(K, device=device)
    c, kl = k // 64 * 64, k % 64
    e, t, kh, j = kl & 1, (kl >> 1) & 3, (kl >> 3) & 1, kl >> 4
    return c + 32 * (j // 2) + 8 * t + 4 * (j % 2) + 2 * kh + e


@functools.lru_cache(maxsize=None)
def _smem_layouts(BM: int):
    """The shared layouts of the TMA descriptors: x's tile [BM, 64] (bf16, swizzled for wgmma) and the byte tiles."""
    gl = _gluon()[1]
    return (gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2))


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
    forced = env("MXKIT_WGMMA_WS")
    return forced != "0" if forced in ("0", "1") else (bm >= 128 or not grouped)


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
        return str(bm) in forced.split(",")
    return default


def _persist_setting() -> Optional[str]:
    """MXKIT_WGMMA_PERSIST as set now (:func:`_persist`; part of a prepared launch's key)."""
    return env("MXKIT_WGMMA_PERSIST")


def block_m(M: int) -> int:
    """Tokens per program: 256 (wgmma's widest N) unless M fits 128."""
    return 128 if M <= 128 else 256


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def dense_schedule(M: int, N: int, K: int, device: torch.device) -> tuple[int, int]:
    """(tokens per program, split-K) of a dense call: 64 tokens up to M = 64, 128 up to 128, 256 above, but 128
    up to M = 256 where 256-token tiles would not give every SM one (M = 256 on 8192 x 8192: 86 against 64 us;
    on 28672 x 8192 256 stays ahead, 183 against 247, H100); then K split the most ways of 8 .. 2 that keeps the
    grid within one program an SM (the warp-specialized kernel holds one an SM: :func:`_ws`) and every split at
    >= 8 K steps. H200 (``benchmarks/probes/wgmma_small_ab.py``, session 48, µs): M = 64 on 8192 x 8192 split 2
    32.4 (split 4: 35.8), 5120 x 2880 split 3 15.6 (4: 20.4), 2880 x 4096 split 5 14.9 (8: 19.8), 4096 x 14336
    split 4 29.6 (8: 33.4)."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
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
    if (layout, elem) not in WEIGHTS:
        raise ValueError(f"layout={layout!r} with elem={elem!r}: one of {sorted(WEIGHTS)} (FP8 weights are read in "
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
    w_desc, s_desc = _weight_descs(q, st, prep.mma, prep.w8, prep.steps)
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
        self.mma = mma = layout == "mma"
        self.w8 = w8 = elem != "e2m1"
        self.steps = steps = q.shape[1] if mma else q.shape[1] // (64 if w8 else 32)
        grouped = expert_ids is not None
        self.n_out = N // 2 if activation else N
        self.ksteps = -(-steps // max(1, split))
        self.split = split = -(-steps // self.ksteps) if steps else 1
        if split > 1 and (grouped or activation or perm_out or y is not None):
            raise ValueError("split-K runs dense calls only (no expert_ids, activation, perm_out or y)")
        b2, s2, bl, l3, acc, dot = _layouts(bm)
        pair = acc
        if mma:
            b2, s2, bl, pair = _layouts_mma(bm)
        elif w8:
            b2, bl = _layouts_fp8()
        self.grid_m = (expert_ids.numel() // (2 if starts else 1)) if grouped else -(-M // bm)
        grid = (self.grid_m * -(-N // BN), split)
        ws = _ws(bm, grouped)
        persist = ws and split == 1 and _persist(grouped and not starts, bm)
        if persist:  # (one program an SM, each over tiles pid, pid + grid, ...)
            grid = (min(grid[0], _sm_count(x.device.index if x.device.index is not None
                                           else torch.cuda.current_device())), 1)
        self.grid = grid
        # the constexprs past the layouts (which are made once per bm) are the launch's key, with bm
        flags = (bool(one_mul), has_bias and split == 1, grouped, ACTS[activation], int(ws) + int(persist),
                 WEIGHTS[layout, elem], bool(perm_out), grouped and bool(starts))
        consts = (("BNc", BN), ("BM", bm), ("STAGES", _stages(bm, grouped)), ("GROUP", GROUP_M), ("B2", b2),
                  ("S2", s2), ("BL", bl), ("L3", l3), ("ACC", acc), ("DOT", dot))
        consts += tuple(zip(("ONE_MUL", "HAS_BIAS", "GROUPED", "ACT", "SCHEDULE", "WEIGHT"), flags[:6]))
        consts += (("PAIR", pair), ("PERM_OUT", flags[6]), ("STARTS", flags[7]))
        self.consts, self.consts_key = consts, (bm,) + flags
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
        _, _, _, _, _, _, TensorDescriptor = _gluon()
        args = (TensorDescriptor.from_tensor(x, [self.bm, 64], _smem_layouts(self.bm)[0]),) + rest
        _launcher()(self.grid, args, self.consts, WARPS, consts_key=self.consts_key)
        if fast is None and aligned and launch._enabled:
            self.tries += 1
            if self.tries >= 2:
                self.fast = _launcher().args_launch(self.grid, args, self.consts, WARPS, self.consts_key) or \
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
        _, _, _, _, _, _, TensorDescriptor = _gluon()
        args = (TensorDescriptor.from_tensor(x, [self.bm, 64], _smem_layouts(self.bm)[0]),) + rest
        priv = _launcher().private_args_launch(self.grid, args, self.consts, WARPS, self.consts_key)
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


def _weight_descs(q: torch.Tensor, st: torch.Tensor, mma: bool, w8: bool, steps: int) -> tuple:
    """The TMA descriptors of a packed weight's codes and scales, made once and kept on ``q`` (the same
    lifetime; ~10 µs of host time a call otherwise). Their bases are views, so ``q`` holds no cycle through them
    and is freed as soon as unreferenced."""
    _, _, _, _, _, _, TensorDescriptor = _gluon()
    key = (q.data_ptr(), tuple(q.shape), q.dtype, st.data_ptr(), tuple(st.shape), st.dtype, mma, w8, steps)
    got = q.__dict__.get("_mxkit_wgmma_descs")
    if got is not None and got[0] == key:
        return got[1]
    u8 = _smem_layouts(64)[1]
    if mma:
        R = q.shape[0]
        descs = (TensorDescriptor.from_tensor(q.view(torch.uint8).view(R, 2 * steps, 256), [BN // 16, 2, 256],
                                              _u8_layout(3)),
                 TensorDescriptor.from_tensor(st.view(torch.uint8).view(R, 32 * steps), [BN // 16, 32], u8))
    else:
        descs = (TensorDescriptor.from_tensor(q.view(q.shape), [BN, 64 if w8 else 32], u8),
                 TensorDescriptor.from_tensor(st.view(st.shape), [1, 2 * BN], u8))
    q.__dict__["_mxkit_wgmma_descs"] = (key, descs)
    return descs


@functools.lru_cache(maxsize=None)
def _launcher():
    """The kernel's direct launch (:class:`mxkit.kernels.launch._Launcher`: Gluon's own launcher took ~100 us of
    host time a call, hashing the layout constexprs)."""
    import types

    from ..launch import _Launcher

    return _Launcher(types.SimpleNamespace(w4a16_wgmma_kernel=_kernel()), "w4a16_wgmma_kernel")


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
