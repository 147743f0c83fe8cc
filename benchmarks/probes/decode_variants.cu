// A/B variants of mma_decode.cu's kernels (benchmarks/probes/decode_ab.py builds and times them): the same
// source with other warps W x tiles a batch U x cp.async stages S (0: registers) x x-prefetch X.
// Names: m8_ / m16_ (dense) and gu_ / dn_ (grouped gate_up + SwiGLU / down) + w<W>_u<U>_s<S>_x<X>.
#define MXKIT_DECODE_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8(W, U, S, X) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_s##S##_x##X, 1, W, U, S, X, false, __nv_bfloat16)
#define DENSE16(W, U, S, X) MXKIT_MMA_DECODE(m16_bf16_w##W##_u##U##_s##S##_x##X, 2, W, U, S, X, false, __nv_bfloat16)
#define GROUPED(W, U, S, X)                                                                                   \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_s##S##_x##X, 1, true, false, false, __nv_bfloat16, W, U, S, X)          \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_s##S##_x##X, 0, false, true, false, float, W, U, S, X)

DENSE8(4, 4, 0, 0)
DENSE8(4, 4, 0, 1)
DENSE8(4, 3, 0, 1)
DENSE8(4, 8, 0, 1)
DENSE8(8, 2, 0, 1)
DENSE8(8, 4, 0, 1)
DENSE16(8, 2, 0, 0)
DENSE16(8, 1, 4, 0)
DENSE16(8, 1, 6, 0)
DENSE16(8, 2, 3, 0)
DENSE16(8, 1, 3, 0)
DENSE16(4, 2, 4, 0)
GROUPED(4, 2, 0, 0)
GROUPED(4, 2, 0, 1)
GROUPED(4, 1, 0, 1)
GROUPED(4, 3, 0, 1)
GROUPED(2, 4, 0, 1)
