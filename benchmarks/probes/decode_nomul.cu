// Ceiling probe (session 49): how fast would the decode kernels run if the E2M1 decode had no bf16x2 multiply
// (an fp16 mma takes the masked codes as they are, the 2^-14 folded into the block scale; x would have to be fp16)?
// Built twice by decode_ab.py's caller: plain (the production arithmetic) and with -DNOMUL (fma_bf16x2(a, b, c)
// -> a: wrong values, the instruction stream of an fp16 decode). Same kernels as production otherwise.
#define MXKIT_DECODE_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_common.cuh"
#ifdef NOMUL
#define fma_bf16x2(a, b, c) (a)
#endif
#include "../../src/mxkit/kernels/matmul_details/mma_decode.cu"

MXKIT_MMA_DECODE(m8_bf16_w4_u2_l, 1, 4, 2, LEAN, false, false, __nv_bfloat16)
MXKIT_MMA_DECODE(m8_bf16_w4_u4_r, 1, 4, 4, 0, true, false, __nv_bfloat16)
MXKIT_MMA_GROUPED_SN(gu_w4_u1_l, 1, true, false, false, __nv_bfloat16, 4, 1, LEAN, false, 1)
MXKIT_MMA_GROUPED_SN(dn_w4_u1_l, 0, false, true, false, float, 4, 1, LEAN, false, 1)
MXKIT_MMA_GROUPED_SN(gu_w4_u1_l_n2, 1, true, false, false, __nv_bfloat16, 4, 1, LEAN, false, 2)
MXKIT_MMA_GROUPED_SN(dn_w4_u1_l_n2, 0, false, true, false, float, 4, 1, LEAN, false, 2)
MXKIT_MMA_GROUPED_SN(gu_w4_u2_l, 1, true, false, false, __nv_bfloat16, 4, 2, LEAN, false, 1)
MXKIT_MMA_GROUPED_SN(dn_w4_u2_l, 0, false, true, false, float, 4, 2, LEAN, false, 1)
