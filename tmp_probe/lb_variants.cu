// launch-bounds (min blocks per SM) A/B of the decode-mma kernels (session 28)
#define MXKIT_DECODE_VARIANTS
#include "../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8LB(W, U, S, X, MB)                                                                               \
  extern "C" __global__ void __launch_bounds__(32 * W, MB) m8_bf16_w##W##_u##U##_s##S##_x##X##_b##MB(          \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, __nv_bfloat16* __restrict__ y, float* __restrict__ ws, int* __restrict__ cnt, int M, \
      int N, int K, long long ldx, long long ldy) {                                                             \
    mxfp4_mma_decode<1, U, W, S, X, false, __nv_bfloat16>(x, q, s, bias, y, ws, cnt, M, N, K, ldx, ldy);     \
  }
#define GLB(NAME, ACT, GATHER, MUL_RW, OUT, W, U, S, X, MB)                                                     \
  extern "C" __global__ void __launch_bounds__(32 * W, MB) NAME(                                               \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, const float* __restrict__ rw, OUT* __restrict__ out,                     \
      const int* __restrict__ ids, const int* __restrict__ eids, int N, int K, int n_valid, int top_k,         \
      long long ldx, long long ldo) {                                                                          \
    mxfp4_mma_grouped<ACT, GATHER, MUL_RW, false, OUT, W, U, S, X>(x, q, s, bias, rw, out, ids, eids, N, K,   \
                                                                   n_valid, top_k, ldx, ldo);                 \
  }
#define GROUPEDLB(W, U, S, X, MB)                                                                              \
  GLB(gu_w##W##_u##U##_s##S##_x##X##_b##MB, 1, true, false, __nv_bfloat16, W, U, S, X, MB)                   \
  GLB(dn_w##W##_u##U##_s##S##_x##X##_b##MB, 0, false, true, float, W, U, S, X, MB)

DENSE8LB(4, 4, 0, 1, 1)
DENSE8LB(4, 4, 0, 1, 5)
DENSE8LB(4, 4, 0, 1, 6)
DENSE8LB(4, 4, 0, 1, 8)
DENSE8LB(4, 2, 0, 1, 8)
DENSE8LB(4, 3, 0, 1, 6)
GROUPEDLB(4, 1, 0, 1, 1)
GROUPEDLB(4, 1, 0, 1, 10)
GROUPEDLB(4, 1, 0, 1, 12)
GROUPEDLB(4, 1, 0, 1, 16)
GROUPEDLB(2, 2, 0, 1, 24)
GROUPEDLB(8, 1, 0, 1, 6)
