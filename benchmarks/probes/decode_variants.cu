// A/B variants of mma_decode.cu's kernels (benchmarks/probes/decode_ab.py builds and times them): the same
// source with other warps W x tiles a batch U x cp.async stages S (0: registers) x x-prefetch X, or (_b<B>)
// the weight streamed by bulk copies (sm_90) through a ring of B chunks, one producer warp more.
// Names: m8_ / m16_ (dense) and gu_ / dn_ (grouped gate_up + SwiGLU / down) + w<W>_u<U>_s<S>_x<X> | w<W>_u<U>_b<B>.
#define MXKIT_DECODE_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8(W, U, S, X) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_s##S##_x##X, 1, W, U, S, X, false, __nv_bfloat16)
#define DENSE16(W, U, S, X) MXKIT_MMA_DECODE(m16_bf16_w##W##_u##U##_s##S##_x##X, 2, W, U, S, X, false, __nv_bfloat16)
#define GROUPED(W, U, S, X)                                                                                   \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_s##S##_x##X, 1, true, false, false, __nv_bfloat16, W, U, S, X)          \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_s##S##_x##X, 0, false, true, false, float, W, U, S, X)
#define DENSE8B(W, U, B) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_b##B, 1, W, U, -B, false, false, __nv_bfloat16)
#define DENSE16B(W, U, B) MXKIT_MMA_DECODE(m16_bf16_w##W##_u##U##_b##B, 2, W, U, -B, false, false, __nv_bfloat16)
#define GROUPEDB(W, U, B)                                                                                     \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_b##B, 1, true, false, false, __nv_bfloat16, W, U, -B, false)            \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_b##B, 0, false, true, false, float, W, U, -B, false)

DENSE8(4, 4, 0, 1)
DENSE8B(4, 4, 2)
DENSE8B(4, 4, 3)
DENSE8B(4, 2, 4)
DENSE8B(4, 2, 6)
DENSE8B(4, 1, 8)
DENSE8B(8, 2, 2)
DENSE8B(8, 1, 4)
DENSE8B(2, 4, 4)
DENSE8B(2, 2, 8)
DENSE16(8, 1, 4, 0)
DENSE16B(8, 1, 4)
DENSE16B(4, 2, 4)
DENSE16B(4, 1, 8)
GROUPED(4, 1, 0, 1)
GROUPEDB(4, 1, 4)
GROUPEDB(4, 1, 8)
GROUPEDB(4, 2, 4)
GROUPEDB(2, 2, 4)
GROUPEDB(2, 1, 8)
GROUPEDB(8, 1, 4)
