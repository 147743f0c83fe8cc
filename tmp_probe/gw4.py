"""Prototype: W4A16 prefill GEMM on Hopper in Gluon. y[M, N] = x[M, K] @ W[N, K].T with W MXFP4 (E2M1 codes +
E8M0 scales). The weight is wgmma's register operand (A): y^T tile [BN, BM] = W tile [BN, BK] @ x tile^T [BK, BM].

Packed weight: per row, K padded to a multiple of 64; each 64-element chunk (32 bytes) permuted so lane c of a quad
holds its 8 bytes contiguously: packed[t*32 + c*8 + i] = orig[t*32 + c + 4*i] (c in 0..3, i in 0..7).
Scales: [N, Kp / 32] plain.
"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier, fence_async_shared, warpgroup_mma, \
    warpgroup_mma_wait


def _asm():
    # $4: 4 bytes (8 E2M1 codes); $5, $6: bf16x2 block factor (both halves equal) -> $0..$3 even / odd pairs
    lines = ["{", ".reg .b32 b, z, s, k, p0, p1, p2, p3;", "mov.b32 k, 0x7E807E80;"]
    for i in range(4):
        lines += [f"prmt.b32 b, $4, 0, 0x{0x4440 + i:04X};",
                  "mul.lo.u32 z, b, 0x00040040;", "mul.lo.u32 s, b, 0x01001000;",
                  "and.b32 z, z, 0x01C001C0;", "lop3.b32 z, z, s, 0x80008000, 0xF8;",
                  "mul.rn.bf16x2 z, z, k;", f"mul.rn.bf16x2 p{i}, z, $5;"]
    lines += ["prmt.b32 $0, p0, p1, 0x5410;", "prmt.b32 $1, p2, p3, 0x5410;",
              "prmt.b32 $2, p0, p1, 0x7632;", "prmt.b32 $3, p2, p3, 0x7632;", "}"]
    return " ".join(lines)


ASM = gl.constexpr(_asm())


def _asm_pairs(one_mul):
    # $4: 4 bytes (8 E2M1 codes); $5: bf16x2 factor (both halves equal). -> $0, $1, $2, $3 = (even, odd) of byte 0,
    # 1, 2, 3 as bf16x2. one_mul: the factor already holds 2^126 (scales <= 128), one multiply per byte.
    lines = ["{", ".reg .b32 b, z, s, k;", "mov.b32 k, 0x7E807E80;"]
    for i in range(4):
        lines += [f"prmt.b32 b, $4, 0, 0x{0x4440 + i:04X};",
                  "mul.lo.u32 z, b, 0x00040040;", "mul.lo.u32 s, b, 0x01001000;",
                  "and.b32 z, z, 0x01C001C0;", "lop3.b32 z, z, s, 0x80008000, 0xF8;"]
        if not one_mul:
            lines += ["mul.rn.bf16x2 z, z, k;"]
        lines += [f"mul.rn.bf16x2 ${i}, z, $5;"]
    lines += ["}"]
    return " ".join(lines)


ASM_PAIRS = gl.constexpr(_asm_pairs(False))
ASM_PAIRS1 = gl.constexpr(_asm_pairs(True))


def byte_layout(BN, num_warps):
    # [BN, 4 (c), 8 (i)] bytes of one 64-wide K chunk: i in registers (contiguous), row + 8 in registers,
    # c and row % 8 on lanes, 16-row groups on warps, rows past 16 * num_warps in registers
    reg = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]]
    r = 16 * num_warps
    while r < BN:
        reg.append([r, 0, 0])
        r *= 2
    lane = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([w, 0, 0])
        w *= 2
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BN, 4, 8])


def scale_layout(BN, num_warps):
    # [BN, 4 (c), 2 (i // 4)]: the factor of the block each (row, c, i // 4) belongs to
    reg = [[0, 0, 1], [8, 0, 0]]
    r = 16 * num_warps
    while r < BN:
        reg.append([r, 0, 0])
        r *= 2
    lane = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([w, 0, 0])
        w *= 2
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BN, 4, 2])


@gluon.jit
def _e8m0_bf16(sb):
    bits = gl.where(sb >= 1, sb << 7, 0x0040 >> gl.minimum(gl.maximum(-sb, 0), 7))
    bits = gl.where(sb == 255, 0x7FC0, bits)
    return bits.to(gl.int16).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _w_tile(q_ptr, s_ptr, rows3, c3, i3, rs3, cs3, js3, t, KB: gl.constexpr, KS: gl.constexpr,
            BL: gl.constexpr, SL: gl.constexpr):
    byt = gl.load(q_ptr + rows3 * KB + t * 32 + c3 * 8 + i3)
    sb = gl.load(s_ptr + rs3 * KS + t * 2 + js3 + cs3 * 0).to(gl.int32)
    return byt, sb


@gluon.jit
def _decode(byt, sb, BN: gl.constexpr, BL: gl.constexpr, DOT: gl.constexpr):
    f = _e8m0_bf16(sb)                                   # [BN, 4, 2]
    f = gl.join(f, f)                                    # [BN, 4, 2, 2]
    f = gl.join(f, f)                                    # [BN, 4, 2, 2, 2]
    f = gl.reshape(f, [BN, 4, 8])
    f = gl.convert_layout(f, BL, assert_trivial=True)
    even, odd = gl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                          is_pure=True, pack=4)
    w = gl.join(even, odd)                               # [BN, 4 (c), 8 (i), 2 (j)]
    w = gl.permute(w, (0, 2, 1, 3))                      # [BN, 8, 4, 2]: k = 8 i + 2 c + j
    w = gl.reshape(w, [BN, 64])
    return gl.convert_layout(w, DOT, assert_trivial=True)


@gluon.jit
def w4a16_kernel(x_desc, q_ptr, s_ptr, y_ptr, M, N, K_TILES, KB, KS,
                 BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, BL: gl.constexpr, SL: gl.constexpr,
                 acc_l: gl.constexpr, dot_l: gl.constexpr, num_warps: gl.constexpr, MODE: gl.constexpr = 0):
    BK: gl.constexpr = 64
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    off_n = pid_n * BN
    off_m = pid_m * BM


    rows = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, BL)))
    rows = gl.minimum(rows, N - 1)
    c = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, BL)))
    i = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, BL)))
    rows3 = gl.expand_dims(gl.expand_dims(rows, 1), 2).to(gl.int64)
    c3 = gl.expand_dims(gl.expand_dims(c, 0), 2)
    i3 = gl.expand_dims(gl.expand_dims(i, 0), 1)
    rs = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL)))
    rs = gl.minimum(rs, N - 1)
    cs = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL)))
    js = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL)))
    rs3 = gl.expand_dims(gl.expand_dims(rs, 1), 2).to(gl.int64)
    cs3 = gl.expand_dims(gl.expand_dims(cs, 0), 2)
    js3 = gl.expand_dims(gl.expand_dims(js, 0), 1)

    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    for s in gl.static_range(STAGES - 1):
        if s < K_TILES:
            mbarrier.expect(bars.index(s), x_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, s * BK], bars.index(s), x_smem.index(s))

    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    byt, sb = _w_tile(q_ptr, s_ptr, rows3, c3, i3, rs3, cs3, js3, 0, KB, KS, BL, SL)
    w_cur = _decode(byt, sb, BN, BL, dot_l)
    w_prev = w_cur
    byt, sb = _w_tile(q_ptr, s_ptr, rows3, c3, i3, rs3, cs3, js3, gl.minimum(1, K_TILES - 1), KB, KS, BL, SL)
    for t in range(K_TILES):
        st = t % STAGES
        mbarrier.wait(bars.index(st), (t // STAGES) & 1)
        acc = warpgroup_mma(w_cur, x_smem.index(st).permute((1, 0)), acc, is_async=True)
        acc, w_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_prev))
        tl_ = t + STAGES - 1
        if tl_ < K_TILES:
            sl = tl_ % STAGES
            mbarrier.expect(bars.index(sl), x_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, tl_ * BK], bars.index(sl), x_smem.index(sl))
        if MODE == 1:  # no decode, no loads: the wgmma + TMA skeleton
            w_prev = w_cur
        else:
            w_next = _decode(byt, sb, BN, BL, dot_l)
            if MODE == 0:
                byt, sb = _w_tile(q_ptr, s_ptr, rows3, c3, i3, rs3, cs3, js3, gl.minimum(t + 2, K_TILES - 1), KB,
                                  KS, BL, SL)
            else:  # MODE 2: decode the same bytes again (no weight loads)
                byt = byt ^ (t & 1).to(gl.uint8)
            w_prev = w_cur
            w_cur = w_next
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))

    n_o = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
    m_o = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
    ptr = y_ptr + gl.expand_dims(m_o, 0).to(gl.int64) * N + gl.expand_dims(n_o, 1)
    mask = (gl.expand_dims(n_o, 1) < N) & (gl.expand_dims(m_o, 0) < M)
    gl.store(ptr, acc.to(gl.bfloat16), mask=mask)


def layouts(BN, BM, num_warps):
    acc_l = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
    dot_l = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    return byte_layout(BN, num_warps), scale_layout(BN, num_warps), acc_l, dot_l


def pack_fp4(qdata: torch.Tensor, scale: torch.Tensor):
    """qdata [N, K/2] uint8 (element 2j low nibble of byte j), scale [N, K/32] -> packed [N, Kp/2], [N, Kp/32]."""
    N, KB = qdata.shape
    Kp2 = triton.cdiv(KB, 32) * 32
    q = torch.zeros(N, Kp2, dtype=torch.uint8, device=qdata.device)
    q[:, :KB] = qdata
    q = q.view(N, Kp2 // 32, 8, 4).transpose(2, 3).reshape(N, Kp2)  # [t, i, c] -> [t, c, i]
    s = torch.zeros(N, Kp2 // 16, dtype=torch.uint8, device=qdata.device)
    s[:, :scale.shape[1]] = scale
    return q.contiguous(), s.contiguous()


def w4a16(x, q, s, N, BN=128, BM=128, STAGES=4, num_warps=8, MODE=0):
    M, K = x.shape
    KB = q.shape[1]
    KS = s.shape[1]
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    layout = gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x, [BM, 64], layout)
    grid = (triton.cdiv(N, BN), triton.cdiv(M, BM))
    w4a16_kernel[grid](x_desc, q, s, y, M, N, KB // 32, KB, KS, BN, BM, STAGES, *layouts(BN, BM, num_warps),
                       num_warps=num_warps, MODE=MODE)
    return y


def byte2_layout(BN, num_warps):
    # [BN, 32] bytes of one 64-wide K chunk, as byte_layout but 2-D: column = 8 c + i
    reg = [[0, 1], [0, 2], [0, 4], [8, 0]]
    r = 16 * num_warps
    while r < BN:
        reg.append([r, 0])
        r *= 2
    lane = [[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([w, 0])
        w *= 2
    return gl.DistributedLinearLayout(reg, lane, warp, [], [BN, 32])


def scale2_layout(BN, num_warps):
    # [1, 2 BN] scale bytes of one K chunk (column 2 r + j: row r, block j); lanes c hold the same values
    reg = [[0, 1], [0, 16]]
    r = 16 * num_warps
    while r < BN:
        reg.append([0, 2 * r])
        r *= 2
    lane = [[0, 0], [0, 0], [0, 2], [0, 4], [0, 8]]
    warp = []
    w = 16
    while w < 16 * num_warps:
        warp.append([0, 2 * w])
        w *= 2
    return gl.DistributedLinearLayout(reg, lane, warp, [], [1, 2 * BN])


@gluon.jit
def _decode_smem(w_tile, s_tile, BN: gl.constexpr, B2: gl.constexpr, S2: gl.constexpr, BL: gl.constexpr,
                 SL: gl.constexpr, DOT: gl.constexpr, L3: gl.constexpr, PAIRS: gl.constexpr, ONE_MUL: gl.constexpr,
                 TRIV: gl.constexpr = True):
    byt = gl.convert_layout(gl.reshape(w_tile.load(B2), [BN, 4, 8]), BL, assert_trivial=True)
    sb = s_tile.load(S2).to(gl.int32)                    # [1, 2 BN]
    if ONE_MUL:
        f = _e8m0_bf16(sb + 126)
    else:
        f = _e8m0_bf16(sb)
    f = gl.reshape(f, [BN, 2])                           # row r, block j
    f = gl.convert_layout(f, gl.SliceLayout(1, L3), assert_trivial=True)
    f = gl.expand_dims(f, 1)                             # [BN, 1, 2]
    f = gl.broadcast(f, gl.full([BN, 4, 2], 0, gl.bfloat16, L3))[0]   # [BN, 4 (c), 2 (j)]
    f = gl.join(f, f)
    f = gl.join(f, f)                                    # [BN, 4, 2, 2, 2]: i = 4 j + 2 d + e
    f = gl.reshape(f, [BN, 4, 8])
    f = gl.convert_layout(f, BL, assert_trivial=TRIV)
    if PAIRS:
        # a[q], b[q] (q = i % 4): byte q // 2 (a) or 2 + q // 2 (b) of the pack, element parity q % 2
        if ONE_MUL:
            a, b = gl.inline_asm_elementwise(ASM_PAIRS1, "=r,=r,=r,=r,r,r,r", [byt, f],
                                             dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
        else:
            a, b = gl.inline_asm_elementwise(ASM_PAIRS, "=r,=r,=r,=r,r,r,r", [byt, f],
                                             dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
        w = gl.join(a, b)                                # [BN, 4 (c), 8 (i = 4 j + 2 q1 + q0), 2 (s)]
        w = gl.reshape(w, [BN, 2, 2, 2, 2, 2, 2])        # [BN, c1, c0, j, q1, q0, s]
        w = gl.permute(w, (0, 3, 6, 4, 1, 2, 5))         # k = 32 j + 16 s + 8 q1 + 4 c1 + 2 c0 + q0
        w = gl.reshape(w, [BN, 64])
    else:
        even, odd = gl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,r,r,r", [byt, f], dtype=(gl.bfloat16, gl.bfloat16),
                                              is_pure=True, pack=4)
        w = gl.join(even, odd)
        w = gl.permute(w, (0, 2, 1, 3))
        w = gl.reshape(w, [BN, 64])
    return gl.convert_layout(w, DOT, assert_trivial=True)


@gluon.jit
def w4a16_tma_kernel(x_desc, w_desc, s_desc, y_ptr, M, N, K_TILES,
                     BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, BL: gl.constexpr, SL: gl.constexpr,
                     B2: gl.constexpr, S2: gl.constexpr,
                     acc_l: gl.constexpr, dot_l: gl.constexpr, num_warps: gl.constexpr, MODE: gl.constexpr = 0,
                     PAIRS: gl.constexpr = True, ONE_MUL: gl.constexpr = False):
    BK: gl.constexpr = 64
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    off_n = pid_n * BN
    off_m = pid_m * BM
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, 32], w_desc.layout)
    s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, 2 * BN], s_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    NBYTES: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    for s in gl.static_range(STAGES - 1):
        if s < K_TILES:
            mbarrier.expect(bars.index(s), NBYTES)
            tma.async_copy_global_to_shared(x_desc, [off_m, s * BK], bars.index(s), x_smem.index(s))
            tma.async_copy_global_to_shared(w_desc, [off_n, s * 32], bars.index(s), w_smem.index(s))
            tma.async_copy_global_to_shared(s_desc, [s, 2 * off_n], bars.index(s), s_smem.index(s))

    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    mbarrier.wait(bars.index(0), 0)
    w_cur = _decode_smem(w_smem.index(0), s_smem.index(0), BN, B2, S2, BL, SL, dot_l, SL, PAIRS, ONE_MUL)
    w_prev = w_cur
    for t in range(K_TILES):
        st = t % STAGES
        if MODE == 1:
            mbarrier.wait(bars.index(st), (t // STAGES) & 1)
        acc = warpgroup_mma(w_cur, x_smem.index(st).permute((1, 0)), acc, is_async=True)
        acc, w_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_prev))
        tl_ = t + STAGES - 1
        if tl_ < K_TILES:
            sl = tl_ % STAGES
            mbarrier.expect(bars.index(sl), NBYTES)
            tma.async_copy_global_to_shared(x_desc, [off_m, tl_ * BK], bars.index(sl), x_smem.index(sl))
            tma.async_copy_global_to_shared(w_desc, [off_n, tl_ * 32], bars.index(sl), w_smem.index(sl))
            tma.async_copy_global_to_shared(s_desc, [tl_, 2 * off_n], bars.index(sl), s_smem.index(sl))
        if MODE == 1:
            w_prev = w_cur
        else:
            tn = gl.minimum(t + 1, K_TILES - 1)
            sn = tn % STAGES
            mbarrier.wait(bars.index(sn), (tn // STAGES) & 1)
            w_next = _decode_smem(w_smem.index(sn), s_smem.index(sn), BN, B2, S2, BL, SL, dot_l, SL, PAIRS, ONE_MUL)
            w_prev = w_cur
            w_cur = w_next
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))

    n_o = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
    m_o = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
    ptr = y_ptr + gl.expand_dims(m_o, 0).to(gl.int64) * N + gl.expand_dims(n_o, 1)
    mask = (gl.expand_dims(n_o, 1) < N) & (gl.expand_dims(m_o, 0) < M)
    gl.store(ptr, acc.to(gl.bfloat16), mask=mask)


def pack_tma(qdata: torch.Tensor, scale: torch.Tensor):
    """-> packed bytes [N, Kp/2] (as pack_fp4) and tile-major scales [Kp/64, 2N]: st[t, 2n + j] = scale[n, 2t + j]."""
    q, s = pack_fp4(qdata, scale)
    N = q.shape[0]
    st = s.view(N, -1, 2).transpose(0, 1).reshape(-1, 2 * N).contiguous()
    return q, st


def w4a16_tma(x, q, st, N, BN=128, BM=256, STAGES=4, num_warps=8, MODE=0, PAIRS=True, ONE_MUL=False):
    M, K = x.shape
    KT = q.shape[1] // 32
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    x_desc = TensorDescriptor.from_tensor(x, [BM, 64], gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16))
    u8 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    w_desc = TensorDescriptor.from_tensor(q, [BN, 32], u8)
    s_desc = TensorDescriptor.from_tensor(st, [1, 2 * BN], u8)
    BL, SL, acc_l, dot_l = layouts(BN, BM, num_warps)
    grid = (triton.cdiv(N, BN), triton.cdiv(M, BM))
    w4a16_tma_kernel[grid](x_desc, w_desc, s_desc, y, M, N, KT, BN, BM, STAGES, BL, SL,
                           byte2_layout(BN, num_warps), scale2_layout(BN, num_warps), acc_l, dot_l,
                           num_warps=num_warps, MODE=MODE, PAIRS=PAIRS, ONE_MUL=ONE_MUL)
    return y
