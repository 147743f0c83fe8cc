// A/B variants of mma_decode.cu's kernels (benchmarks/probes/decode_ab.py builds and times them): the same
// source with other warps W x tiles a batch U, in the register loop (mainloop, _r: x loaded a batch ahead with
// the weight words, as the m8 kernel does), the lean loop (mainloop_lean, _l) or through 4 cp.async stages
// (mainloop_async, _s4). The bulk-copy and strips-per-block variants are in git history (benchmarks/decode_mma_ab.md names the commits).
// Names: m8_ / m16_ (dense) and gu_ / dn_ (grouped gate_up + SwiGLU / down) + w<W>_u<U>_<loop>.
#define MXKIT_DECODE_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8(W, U, L) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_##L, 1, W, U, LOOP_##L, XPF_##L, false, __nv_bfloat16)
#define DENSE16(W, U, L) MXKIT_MMA_DECODE(m16_bf16_w##W##_u##U##_##L, 2, W, U, LOOP_##L, XPF_##L, false, __nv_bfloat16)
#define GROUPED(W, U, L)                                                                                      \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_##L, 1, true, false, false, __nv_bfloat16, W, U, LOOP_##L, XPF_##L)        \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_##L, 0, false, true, false, float, W, U, LOOP_##L, XPF_##L)
#define LOOP_r 0
#define LOOP_l LEAN
#define LOOP_s4 4
#define XPF_r true  // (x a batch ahead: the register loop's; the others load x as the production kernels do)
#define XPF_l false
#define XPF_s4 false

DENSE8(4, 4, r)
DENSE8(4, 4, l)
DENSE8(4, 2, l)
DENSE8(8, 2, l)
DENSE16(8, 2, r)
DENSE16(8, 1, s4)
DENSE16(8, 2, l)
DENSE16(8, 1, l)
GROUPED(4, 1, r)
GROUPED(4, 1, l)
GROUPED(4, 2, l)


// session 37 (H200): more warps resident (fewer tiles a batch, fewer registers)
DENSE8(4, 1, l)
DENSE8(4, 3, l)
DENSE8(2, 2, l)
DENSE8(2, 4, l)
DENSE8(8, 1, l)
DENSE8(4, 2, r)
DENSE16(4, 1, l)
DENSE16(4, 2, l)


// session 38 (H200): SN strips per block sharing each x load (M = 16 reads 4x the weight's bytes of x from L2
// at SN = 1); names + _n<SN>
#define DENSE8N(W, U, SN) MXKIT_MMA_DECODE_SN(m8_bf16_w##W##_u##U##_l_n##SN, 1, W, U, LEAN, false, false, __nv_bfloat16, SN)
#define DENSE16N(W, U, SN) MXKIT_MMA_DECODE_SN(m16_bf16_w##W##_u##U##_l_n##SN, 2, W, U, LEAN, false, false, __nv_bfloat16, SN)
DENSE16N(8, 1, 2)
DENSE16N(8, 1, 4)
DENSE16N(8, 2, 2)
DENSE16N(4, 1, 2)
DENSE16N(4, 1, 4)
DENSE16N(4, 2, 2)
DENSE16N(4, 2, 4)
DENSE16N(2, 1, 4)
DENSE16N(2, 2, 4)
DENSE8N(4, 2, 2)
DENSE8N(4, 1, 4)
DENSE8N(4, 2, 4)
// session 57 (H200): the weight through deeper cp.async rings at M = 1 (stream_shape.cu: loads alone reach a plain
// read's bandwidth on 8192^2 only with ~32 KB a block in flight, decode-mma's lean loop holds ~4 KB); _s<S>x: x
// staged with the weight
#define LOOP_s8 8
#define LOOP_s16 16
#define LOOP_s4x 4
#define LOOP_s8x 8
#define XPF_s8 false
#define XPF_s16 false
#define XPF_s4x true
#define XPF_s8x true
DENSE8(4, 1, s4)
DENSE8(4, 1, s8)
DENSE8(4, 1, s16)
DENSE8(4, 2, s4)
DENSE8(4, 2, s8)
DENSE8(8, 1, s4)
DENSE8(8, 1, s8)
DENSE8(4, 1, s4x)
DENSE8(4, 1, s8x)
DENSE8(2, 1, s16)
// session 57 (H200): the ring loop (mainloop_ring: D = U tiles a lane in flight, weight and x); names _g
#define LOOP_g RING
#define XPF_g false
DENSE8(4, 4, g)
DENSE8(4, 6, g)
DENSE8(4, 3, g)
DENSE8(4, 5, g)
DENSE8(8, 2, g)
DENSE8(8, 4, g)
DENSE8(8, 3, g)
DENSE8(2, 4, g)
DENSE8(4, 2, g)
// session 57, built but not yet run (no device time left): the ring loop at 16 tokens a block (m16 / m16n's place),
// SN strips sharing x (_n<SN>). ptxas (sm_90a) registers: w4_u2_g_n4 254 and w8_u2_g_n4 255 with 12-byte spills (as
// production's m16n, w4_u2_l_n4: 255, 4 bytes), w4_u2_g_n2 168, w8_u2_g 119, w8_u3_g 162, w4_u4_g 228; a ring of 3 at
// 4 strips spills 492 bytes, so none is built.
#define DENSE16G(W, U, SN) \
  MXKIT_MMA_DECODE_SN(m16_bf16_w##W##_u##U##_g_n##SN, 2, W, U, RING, false, false, __nv_bfloat16, SN)
DENSE16(4, 4, g)
DENSE16(8, 2, g)
DENSE16(8, 3, g)
DENSE16G(4, 2, 4)
DENSE16G(8, 2, 4)
DENSE16G(4, 2, 2)
// session 58 (H200): the ring loop in the grouped kernels (MoE decode, K = 2880: ~11 tiles a warp at 4 warps), the
// sorted blocks (gu_ / dn_, _n<SN> strips sharing x) and one block per pair (pgu_ / pdn_: production's pairs kernels,
// 4 warps x 2 tiles in the lean loop, at 1-8 pairs)
#define GROUPEDN(W, U, L, SN)                                                                                 \
  MXKIT_MMA_GROUPED_SN(gu_w##W##_u##U##_##L##_n##SN, 1, true, false, false, __nv_bfloat16, W, U, LOOP_##L,       \
                       XPF_##L, SN)                                                                            \
  MXKIT_MMA_GROUPED_SN(dn_w##W##_u##U##_##L##_n##SN, 0, false, true, false, float, W, U, LOOP_##L, XPF_##L, SN)
#define PAIRSV1(NAME, ACT, GATHER, MUL_RW, W, U, L)                                                          \
  extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                   \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, const float* __restrict__ rw, __nv_bfloat16* __restrict__ out,           \
      const int* __restrict__ topk_ids, int ids64, float* __restrict__ ws, int* __restrict__ cnt, int N, int K, \
      int n_valid, int top_k, int n_exp, long long ldx, long long ldo) {                                       \
    mxfp4_mma_grouped<ACT, GATHER, MUL_RW, false, __nv_bfloat16, W, U, LOOP_##L, false, true>(                 \
        x, q, s, bias, rw, out, nullptr, topk_ids, N, K, n_valid, top_k, ldx, ldo, ids64, n_exp, ws, cnt);       \
  }
#define PAIRSV(W, U, L)                                                                                       \
  PAIRSV1(pgu_w##W##_u##U##_##L, 1, true, false, W, U, L)                                                     \
  PAIRSV1(pdn_w##W##_u##U##_##L, 0, false, true, W, U, L)
GROUPED(4, 2, g)
GROUPED(4, 3, g)
GROUPED(4, 4, g)
GROUPED(8, 2, g)
GROUPEDN(4, 2, g, 2)
GROUPEDN(4, 3, g, 2)
GROUPEDN(4, 4, g, 2)
GROUPEDN(4, 1, l, 2)
PAIRSV(4, 2, l)
PAIRSV(4, 2, g)
PAIRSV(4, 3, g)
PAIRSV(4, 4, g)
PAIRSV(8, 2, g)
PAIRSV(8, 2, l)
PAIRSV(2, 4, g)
