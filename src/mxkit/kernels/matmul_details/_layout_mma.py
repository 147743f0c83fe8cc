"""The decode-mma kernel's MXFP4 weight layout as the w16 wgmma kernel reads it (``layout="mma"``,
``_w4a16_wgmma``), so that one copy of MoE experts serves decode and prefill: the Gluon pieces that load, decode
and pair its rows, and the K order x must come in.

The layout (:func:`mxkit.kernels.matmul_details._mma_decode.pack_mma`, spelled out in ``mma_decode.cu``): per 16
rows and 64 columns, lane l = 4 g + t's 16 bytes hold its ``mma.sync`` A-fragment codes of rows g, g + 8 for four
k-steps, bits placed for a mask-and-shift decode. It permutes K inside each 64 columns (:func:`mma_k_order`);
wgmma reads x from shared memory in its own order, so x comes with its columns in that order (the MoE gather
writes them so, and the first GEMM's epilogue writes h so for the second: ``PERM_OUT``). Its decode is cheaper than
the wgmma layout's (a mask, at most one shift, and the multiplies per register): the MoE prefill runs 4-14% faster
on it (H100). Gate / up rows of the fused activation are adjacent (gate 2 c, up 2 c + 1), as GPT-OSS's checkpoint
interleaves them.
"""

from __future__ import annotations

import functools
import types

import torch

from ._wgmma_gluon import BN, WARPS, acc_layouts, e8m0_bf16, gluon, tma_load, u8_layout

ELEMS = ("e2m1",)  # the element formats this layout holds (the w16 kernel's layout modules: ELEMS, steps, descs,
#                    gluon_parts, each taking the element format)


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


def mma_k_order(K: int, device=None) -> torch.Tensor:
    """int64 [K]: the source column of each column of x for ``layout="mma"`` (K % 64 == 0): in each 64, column
    16 j + 8 kh + 2 t + e (the wgmma A-fragment order of step j) takes column 32 (j // 2) + 8 t + 4 (j % 2) + 2 kh
    + e (the decode-mma layout's order of the same weight codes, ``mma_decode.cu``)."""
    k = torch.arange(K, device=device)
    c, kl = k // 64 * 64, k % 64
    e, t, kh, j = kl & 1, (kl >> 1) & 3, (kl >> 3) & 1, kl >> 4
    return c + 32 * (j // 2) + 8 * t + 4 * (j % 2) + 2 * kh + e


def steps(q: torch.Tensor, elem: str = "e2m1") -> int:
    """The 64-column K steps of a packed weight ``q`` int32 [N / 16, K / 64, 32, 4]."""
    return q.shape[1]


def descs(q: torch.Tensor, st: torch.Tensor, elem: str = "e2m1") -> tuple:
    """The TMA descriptors of the codes [BN / 16, 2, 256] bytes and the scales [BN / 16, 32] bytes a program loads a
    step (``q`` int32 [N / 16, K / 64, 32, 4] and ``st`` int32 [N / 16, K / 64, 8] viewed as bytes)."""
    TensorDescriptor = gluon()[6]
    R, S = q.shape[0], steps(q)
    return (TensorDescriptor.from_tensor(q.view(torch.uint8).view(R, 2 * S, 256), [BN // 16, 2, 256], u8_layout(3)),
            TensorDescriptor.from_tensor(st.view(torch.uint8).view(R, 32 * S), [BN // 16, 32], u8_layout(2)))


@functools.lru_cache(maxsize=None)
def tile_layouts(BM: int) -> tuple:
    """(B2, S2, BL, PAIR): the byte tile [BN / 16, 2, 256] and scale tile [BN / 16, 32] as loaded from shared
    memory (lane l = 4 g + t: bytes 16 l .. 16 l + 15 of its warp's group, the 4 scale bytes of g), the bytes
    [BN / 2 (group, g), 4 (t), 16] per lane, and the accumulator [BN, BM] with row bit 0 in a register (gate / up
    pairs of adjacent rows in one thread)."""
    gl = gluon()[1]
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
def gluon_parts(elem: str, BM: int) -> types.SimpleNamespace:
    """The kernel's Gluon pieces for this layout (``elem`` "e2m1") at ``BM`` tokens a program (as
    ``_layout_wgmma.gluon_parts``):
    ``alloc``, ``load``, ``decode``; ``split_pairs(t)`` an accumulator-shaped tile's rows 2 c (gate) and 2 c + 1
    (up), [BN / 2, BM] each; ``pair_column(n)`` the output column n // 2 of packed row n's pair."""
    g, gl = gluon()[:2]
    load_tma = tma_load()
    e8m0 = e8m0_bf16()
    B2, S2, BL, PAIR = (gl.constexpr(v) for v in tile_layouts(BM))
    DOT = gl.constexpr(acc_layouts(BM)[1])
    BNc, BMc = gl.constexpr(BN), gl.constexpr(BM)
    masm2, masm1 = gl.constexpr(_mma_words_asm(False)), gl.constexpr(_mma_words_asm(True))

    @g.jit
    def alloc(w_desc, s_desc, STAGES: gl.constexpr):
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BNc // 16, 2, 256], w_desc.layout)
        s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, BNc // 16, 32], s_desc.layout)
        return w_smem, s_smem

    @g.jit
    def load(k, sl, ready, w_desc, s_desc, w_smem, s_smem, row0):
        # [N / 16, K / 64 * 2, 256] code bytes and [N / 16, K / 64 * 32] scale bytes
        load_tma(w_desc, [row0 // 16, 2 * k, 0], ready.index(sl), w_smem.index(sl))
        load_tma(s_desc, [row0 // 16, 32 * k], ready.index(sl), s_smem.index(sl))

    @g.jit
    def decode(w_tile, s_tile, ONE_MUL: gl.constexpr):
        # per 16 rows (group) 512 bytes, lane l = 4 g + t's 16 bytes at 16 l: word j of the four is k-step j's A
        # fragment of rows g, g + 8 (K permuted inside the 64: x comes permuted alike)
        byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BNc // 2, 4, 16]), BL, assert_trivial=True)
        sb = gl.reshape(s_tile.load(S2), [BNc // 2, 2, 2]).to(gl.int32)   # [(group, g), h, b]: 4 g + 2 h + b
        if ONE_MUL:
            f = e8m0(sb + 126)                                           # 2^(s - 1), s <= 128
        else:
            f = e8m0(sb)
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

    @g.jit
    def split_pairs(t):
        # [BNc, BM] -> its rows 2 c and 2 c + 1, [BNc / 2, BM] each (PAIR: row bit 0 a register bit: a shuffle
        # puts each pair in one thread)
        t = gl.permute(gl.reshape(gl.convert_layout(t, PAIR), [BNc // 2, 2, BMc]), (0, 2, 1))
        return gl.split(t)

    @g.jit
    def pair_column(n):
        return n // 2

    return types.SimpleNamespace(alloc=alloc, load=load, decode=decode, split_pairs=split_pairs,
                                 pair_column=pair_column)
