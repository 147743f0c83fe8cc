"""The w16 wgmma kernel's own weight layout (``layout="wgmma"``, ``_w4a16_wgmma``): MXFP4 (E2M1) or MXFP8 (E4M3 /
E5M2) codes and E8M0 scales arranged so that each lane of a quad loads its wgmma A-fragment codes contiguously,
and the kernel's Gluon pieces that read it (TMA boxes, decode to bf16 in registers, the fused activation's rows).

E2M1 (:func:`pack_wgmma`, once per weight): the codes [N, Kp / 2] with K padded to Kp, a multiple of 64, and each
32-byte step permuted so that lane c of a quad finds its 8 bytes contiguous:
``q[n, 32 t + 8 c + i] = qdata[n, 32 t + c + 4 i]`` (c < 4, i < 8); the scales step-major,
``st[t, 2 n + j] = scale[n, 2 t + j]``. Element k = 64 t + 8 i + 2 c + e of row n is then the low (e = 0) or high
nibble of q[n, 32 t + 8 c + i], which is the wgmma A-fragment order of k (lanes c, registers i, e). The decode is
exact: the E2M1 value times 2^-126 by placing its bits in a bf16, then times 2^126 and the block factor
2^(s - 127), or times 2^(s - 1) at once when every scale byte is <= 128 (``one_mul``).

FP8 (:func:`pack_wgmma8`, W8A16): 64 code bytes a row per step, lane c's 16 contiguous
(``q[n, 64 t + 16 c + j] = qdata[n, 64 t + 8 (j // 2) + 2 c + j % 2]``), the same scale layout. A pair of codes
decodes in four integer operations (each byte into a bf16's high byte, shifted onto the bf16 exponent and
mantissa, the sign kept: the element value times 2^-120 for E4M3, 2^-112 for E5M2, subnormals included) and one
or two bf16 multiplies, exact like the E2M1 decode; NaN / Inf codes do not survive it, so weights holding them
stay off this kernel (``PackedWeight.has_nan``).

MoE experts (:func:`pack_wgmma_experts`): E experts packed as one [E * N, K] weight; for the fused activation each
expert's gate_up rows in :func:`expert_row_order` (a gate row and its up row in one thread's accumulator
registers). :func:`unpack_wgmma` / :func:`unpack_wgmma8` are the inverses (tests).
"""

from __future__ import annotations

import functools
import types
from typing import Optional

import torch

from ._wgmma_gluon import BN, acc_layouts, e8m0_bf16, gluon, tma_load, u8_layout, warp_bases

# FP8 weights (W8A16): per element format, (shift of the byte placed in a bf16's high byte, magnitude mask, the
# exponent R with value(bits) = element value x 2^-R, the largest scale byte whose factor 2^(s - 127 + R) is a bf16)
FP8 = {"e4m3": (4, 0x07F007F0, 120, 134), "e5m2": (3, 0x0FE00FE0, 112, 142)}
ELEMS = ("e2m1",) + tuple(FP8)  # the element formats this layout holds (as every layout module: ``_layout_mma``)


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
    -> (q uint8 [N, Kp / 2], st uint8 [Kp / 64, 2 N], one_mul) in this layout (K padded with zero codes and zero
    scale bytes to Kp = the next multiple of 64); one_mul: every scale byte is <= 128 (the one-multiply decode).
    ValueError on other shapes."""
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


def unpack_wgmma(q: torch.Tensor, st: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_wgmma`: (qdata uint8 [N, K / 2], scale uint8 [N, K / 32])."""
    return _unpack_codes(q, st, K, 1)


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


def code_bytes(elem: str) -> int:
    """Code bytes a row per 64-column step of K: 32 for E2M1, 64 for FP8."""
    return 32 if elem == "e2m1" else 64


def steps(q: torch.Tensor, elem: str) -> int:
    """The 64-column K steps of a packed weight's codes ``q`` [N, steps * code_bytes]."""
    return q.shape[1] // code_bytes(elem)


def descs(q: torch.Tensor, st: torch.Tensor, elem: str) -> tuple:
    """The TMA descriptors of the codes [BN, code_bytes] and the step's scales [1, 2 BN] a program loads a step."""
    TensorDescriptor = gluon()[6]
    return (TensorDescriptor.from_tensor(q.view(q.shape), [BN, code_bytes(elem)], u8_layout(2)),
            TensorDescriptor.from_tensor(st.view(st.shape), [1, 2 * BN], u8_layout(2)))


@functools.lru_cache(maxsize=None)
def tile_layouts(elem: str) -> tuple:
    """(B2, S2, BL, L3): the code tile [BN, code_bytes] and scale tile [1, 2 BN] as loaded from shared memory, the
    bytes [BN, 4 (c), code_bytes / 4] per lane (E2M1: 8 bytes, FP8: 16; rows: lanes 0-7 and registers +8 in each
    warp's 16, as the wgmma A fragment) and the factors [BN, 4 (c), 2 (j)] per lane."""
    gl = gluon()[1]
    lin = gl.DistributedLinearLayout
    quad = [[1, 0], [2, 0], [4, 0]]
    q3 = [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    s2 = lin([[0, 1], [0, 16]], [[0, 0], [0, 0], [0, 2], [0, 4], [0, 8]], warp_bases(16, 2, 1, 2), [], [1, 2 * BN])
    l3 = lin([[0, 0, 1], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3, warp_bases(16, 3, 0), [], [BN, 4, 2])
    if elem == "e2m1":
        b2 = lin([[0, 1], [0, 2], [0, 4], [8, 0]], [[0, 8], [0, 16]] + quad, warp_bases(16, 2, 0), [], [BN, 32])
        bl = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3, warp_bases(16, 3, 0), [],
                 [BN, 4, 8])
    else:  # lane c of a quad: bytes 16 c .. 16 c + 15 of its rows, one 16-byte load each
        b2 = lin([[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]], [[0, 16], [0, 32]] + quad, warp_bases(16, 2, 0), [],
                 [BN, 64])
        bl = lin([[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [8, 0, 0]], [[0, 1, 0], [0, 2, 0]] + q3,
                 warp_bases(16, 3, 0), [], [BN, 4, 16])
    return b2, s2, bl, l3


@functools.lru_cache(maxsize=None)
def gluon_parts(elem: str, BM: int) -> types.SimpleNamespace:
    """The kernel's Gluon pieces for this layout holding ``elem`` codes, at ``BM`` tokens a program:
    ``alloc(w_desc, s_desc, STAGES)`` the ring's code and scale slots; ``load(k, sl, ready, w_desc, s_desc, w_smem,
    s_smem, row0)`` K step k's TMA of packed rows row0 .. row0 + BN into slot sl, signalling ready[sl];
    ``decode(w_tile, s_tile, ONE_MUL)`` a slot's weight as wgmma's A operand [BN, 64] bf16; ``split_pairs(t)`` an
    accumulator-shaped [BN, BM] tile's gate and up rows (rows 16 b + r and 16 b + 8 + r: one thread's registers),
    ``pair_column(n)`` the output column of packed row n's pair (8 b + r)."""
    g, gl = gluon()[:2]
    load_tma = tma_load()
    e8m0 = e8m0_bf16()
    B2, S2, BL, L3 = (gl.constexpr(v) for v in tile_layouts(elem))
    DOT = gl.constexpr(acc_layouts(BM)[1])
    BNc, BMc, CODE_BYTES = gl.constexpr(BN), gl.constexpr(BM), gl.constexpr(code_bytes(elem))
    if elem == "e2m1":
        asm2, asm1 = gl.constexpr(_fp4_pairs_asm(False)), gl.constexpr(_fp4_pairs_asm(True))
        ONE_MUL_BIAS = gl.constexpr(126)  # 2^(s - 1), s <= 128
    else:
        asm2, asm1 = gl.constexpr(_fp8_pairs_asm(elem, False)), gl.constexpr(_fp8_pairs_asm(elem, True))
        ONE_MUL_BIAS = gl.constexpr(FP8[elem][2])  # 2^(s - 127 + R)

    @g.jit
    def alloc(w_desc, s_desc, STAGES: gl.constexpr):
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BNc, CODE_BYTES], w_desc.layout)
        s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, 2 * BNc], s_desc.layout)
        return w_smem, s_smem

    @g.jit
    def load(k, sl, ready, w_desc, s_desc, w_smem, s_smem, row0):
        load_tma(w_desc, [row0, k * CODE_BYTES], ready.index(sl), w_smem.index(sl))
        load_tma(s_desc, [k, 2 * row0], ready.index(sl), s_smem.index(sl))

    @g.jit
    def _factors(s_tile, ONE_MUL: gl.constexpr):
        # the block factors [BN, 4 (c), 2 (j)] of the step's two blocks a row, as bf16
        sb = s_tile.load(S2).to(gl.int32)                        # [1, 2 BN]: row r, block j at 2 r + j
        if ONE_MUL:
            f = e8m0(sb + ONE_MUL_BIAS)
        else:
            f = e8m0(sb)
        f = gl.convert_layout(gl.reshape(f, [BNc, 2]), gl.SliceLayout(1, L3), assert_trivial=True)
        return gl.broadcast(gl.expand_dims(f, 1), gl.full([BNc, 4, 2], 0, gl.bfloat16, L3))[0]  # [BN, c, j]

    if elem == "e2m1":
        @g.jit
        def decode(w_tile, s_tile, ONE_MUL: gl.constexpr):
            # bytes [BN, 4 (c), 8 (i)]: lane c's 8 bytes of its rows, contiguous
            byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc, 4, 8]), BL, assert_trivial=True)
            f = _factors(s_tile, ONE_MUL)
            f = gl.join(f, f)
            f = gl.join(f, f)                                        # [BN, c, j, 2, 2]: i = 4 j + (i % 4)
            f = gl.convert_layout(gl.reshape(f, [BNc, 4, 8]), BL, assert_trivial=True)
            if ONE_MUL:
                a, b = gl.inline_asm_elementwise(asm1, "=r,=r,=r,=r,r,r,r", [byt, f],
                                                 dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
            else:
                a, b = gl.inline_asm_elementwise(asm2, "=r,=r,=r,=r,r,r,r", [byt, f],
                                                 dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
            # a[i % 4 = q]: byte q // 2 of the four, element parity q % 2; b: bytes 2, 3
            w = gl.join(a, b)                                        # [BN, 4 (c), 8 (i = 4 j + 2 q1 + q0), 2 (s)]
            w = gl.reshape(w, [BNc, 2, 2, 2, 2, 2, 2])               # [BN, c1, c0, j, q1, q0, s]
            w = gl.permute(w, (0, 3, 6, 4, 1, 2, 5))                 # k = 32 j + 16 s + 8 q1 + 4 c1 + 2 c0 + q0
            return gl.convert_layout(gl.reshape(w, [BNc, 64]), DOT, assert_trivial=True)
    else:
        @g.jit
        def decode(w_tile, s_tile, ONE_MUL: gl.constexpr):
            # FP8 codes [BN, 4 (c), 16 (j)]: lane c's 16 bytes of its rows, element k = 8 (j // 2) + 2 c + j % 2
            byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc, 4, 16]), BL, assert_trivial=True)
            f = _factors(s_tile, ONE_MUL)
            f = gl.join(f, f)
            f = gl.join(f, f)
            f = gl.join(f, f)                                        # bytes j of block j // 8
            f = gl.convert_layout(gl.reshape(f, [BNc, 4, 16]), BL, assert_trivial=True)
            if ONE_MUL:
                w = gl.inline_asm_elementwise(asm1, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
            else:
                w = gl.inline_asm_elementwise(asm2, "=r,=r,r,r,r", [byt, f], dtype=gl.bfloat16, is_pure=True,
                                              pack=4)
            w = gl.permute(gl.reshape(w, [BNc, 4, 8, 2]), (0, 2, 1, 3))   # [BN, i, c, e]: k = 8 i + 2 c + e
            return gl.convert_layout(gl.reshape(w, [BNc, 64]), DOT, assert_trivial=True)

    @g.jit
    def split_pairs(t):
        # [BNc, BM] -> its rows 16 b + r (gate) and 16 b + 8 + r (up), [BNc / 16, 8, BM] each: one thread's
        # registers (the accumulator layout's row 8 is a register bit)
        return gl.split(gl.permute(gl.reshape(t, [BNc // 16, 2, 8, BMc]), (0, 2, 3, 1)))

    @g.jit
    def pair_column(n):
        # output column 8 b + r of the pair in packed rows 16 b + r, 16 b + 8 + r (pack_wgmma_experts' row order)
        return (n // 16) * 8 + n % 8

    return types.SimpleNamespace(alloc=alloc, load=load, decode=decode, split_pairs=split_pairs,
                                 pair_column=pair_column)
