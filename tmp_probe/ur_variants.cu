// the production decode-mma configs over the ping-pong K loop (tmp_probe/unroll/mma_decode.cu), session 28
#define MXKIT_DECODE_VARIANTS
#include "unroll/mma_decode.cu"
#define DENSE8(W, U, S, X) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_s##S##_x##X, 1, W, U, S, X, false, __nv_bfloat16)
#define GROUPED(W, U, S, X)                                                                                   \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_s##S##_x##X, 1, true, false, false, __nv_bfloat16, W, U, S, X)          \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_s##S##_x##X, 0, false, true, false, float, W, U, S, X)
DENSE8(4, 4, 0, 1)
DENSE8(4, 2, 0, 1)
DENSE8(4, 3, 0, 1)
DENSE8(8, 2, 0, 1)
GROUPED(4, 1, 0, 1)
GROUPED(4, 2, 0, 1)
GROUPED(8, 1, 0, 1)
