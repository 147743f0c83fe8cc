// Shared by mxkit's CUDA C++ small-M GEMMs (mma_decode.cu, mma_a8w8.cu): the output conversion and the
// fixed-order reduction of a block's warps, with the deterministic split-K across thread blocks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mxkit {

template <typename T> __device__ __forceinline__ T to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 to_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half to_out<__half>(float v) { return __float2half_rn(v); }

// The sums of a block's P x 128 accumulators (red[warp][p][i][lane], after __syncthreads), each over the warps
// in order 0 .. WARPS - 1, handed to store(e, v) for e = p * 128 + i * 32 + lane. With S > 1 thread blocks
// along K (this one the split-th), each writes its sums to part [S, P x 128] and the last of the S to arrive
// (counted in *cnt, which it resets to 0 for the next launch or graph replay) adds the S partials in order
// 0 .. S - 1 and stores them: deterministic whichever block arrives last. `last` is a __shared__ int.
template <int WARPS, int P, typename Store>
__device__ __forceinline__ void reduce_store(const float (&red)[WARPS][P][4][32], float* part, int* cnt, int S,
                                             int split, int& last, Store store) {
  if (S > 1) {
    for (int e = threadIdx.x; e < P * 128; e += blockDim.x) {
      const int p = e / 128, i = (e / 32) & 3, l = e & 31;
      float v = red[0][p][i][l];
#pragma unroll
      for (int w = 1; w < WARPS; ++w) v += red[w][p][i][l];
      part[split * (P * 128) + e] = v;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
  }
  for (int e = threadIdx.x; e < P * 128; e += blockDim.x) {
    const int p = e / 128, i = (e / 32) & 3, l = e & 31;
    float v;
    if (S > 1) {
      v = __ldcg(part + e);
      for (int z = 1; z < S; ++z) v += __ldcg(part + z * (P * 128) + e);
    } else {
      v = red[0][p][i][l];
#pragma unroll
      for (int w = 1; w < WARPS; ++w) v += red[w][p][i][l];
    }
    store(e, v);
  }
  if (S > 1 && threadIdx.x == 0) *cnt = 0;
}

}  // namespace mxkit
