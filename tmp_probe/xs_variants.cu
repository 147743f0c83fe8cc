// x staged in shared memory (XS) for the dense decode-mma kernel, session 28
#define MXKIT_DECODE_VARIANTS
#include "xs/mma_decode.cu"
#define DENSE8XS(W, U, S, X, XS, MB)                                                                             \
  extern "C" __global__ void __launch_bounds__(32 * W, MB) m8_bf16_w##W##_u##U##_s##S##_x##X##_xs##XS##_b##MB(  \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, __nv_bfloat16* __restrict__ y, float* __restrict__ ws, int* __restrict__ cnt, int M, \
      int N, int K, long long ldx, long long ldy) {                                                             \
    mxfp4_mma_decode<1, U, W, S, X, false, __nv_bfloat16, XS>(x, q, s, bias, y, ws, cnt, M, N, K, ldx, ldy);  \
  }
DENSE8XS(4, 4, 0, 1, 0, 1)
DENSE8XS(4, 4, 0, 0, 1, 1)
DENSE8XS(4, 4, 0, 1, 1, 1)
DENSE8XS(4, 4, 0, 0, 1, 6)
DENSE8XS(4, 2, 0, 0, 1, 1)
DENSE8XS(4, 8, 0, 0, 1, 1)
DENSE8XS(8, 4, 0, 0, 1, 1)
