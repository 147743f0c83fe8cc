// L2-prefetch A/B of the decode-mma K loop (session 28): PFD batches ahead, PFMODE 1 plain, 2 evict_last
#define MXKIT_DECODE_VARIANTS
#include "../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8(W, U, S, X, P, PM) MXKIT_MMA_DECODE_PF(m8_bf16_w##W##_u##U##_s##S##_x##X##_p##P##_m##PM, 1, W, U, S, X, false, __nv_bfloat16, P, PM)
#define GROUPED(W, U, S, X, P, PM)                                                                                   \
  MXKIT_MMA_GROUPED_PF(gu_w##W##_u##U##_s##S##_x##X##_p##P##_m##PM, 1, true, false, false, __nv_bfloat16, W, U, S, X, P, PM)          \
  MXKIT_MMA_GROUPED_PF(dn_w##W##_u##U##_s##S##_x##X##_p##P##_m##PM, 0, false, true, false, float, W, U, S, X, P, PM)

DENSE8(4, 4, 0, 1, 0, 1)
DENSE8(4, 4, 0, 1, 1, 1)
DENSE8(4, 4, 0, 1, 2, 1)
DENSE8(4, 4, 0, 1, 4, 1)
DENSE8(4, 4, 0, 1, 8, 1)
DENSE8(4, 4, 0, 1, 2, 2)
DENSE8(4, 4, 0, 1, 4, 2)
DENSE8(4, 2, 0, 1, 4, 1)
DENSE8(4, 2, 0, 1, 8, 1)
DENSE8(8, 2, 0, 1, 4, 1)
GROUPED(4, 1, 0, 1, 0, 1)
GROUPED(4, 1, 0, 1, 2, 1)
GROUPED(4, 1, 0, 1, 4, 1)
GROUPED(4, 1, 0, 1, 8, 1)
GROUPED(4, 1, 0, 1, 16, 1)
GROUPED(4, 1, 0, 1, 8, 2)
