// Shared by mxkit's CUDA C++ small-M GEMMs (mma_decode.cu, mma_a8w8.cu): the bf16 tensor-core mma and fma, the
// output conversion and the fixed-order reduction of a block's warps, with the deterministic split-K across thread blocks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace mxkit {

// bf16x2 a * b + c, one rounding (the decodes' exact rescaling of a by a power of two b, c = -0 keeping -0)
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// c += A B on tensor cores: mma.sync m16n8k16, A (bf16x2 a0 .. a3: rows g, g + 8 x columns 2t, 2t + 1 | 2t + 8,
// 2t + 9) times B (b0, b1: rows 2t, 2t + 1 | 2t + 8, 2t + 9 of column g), float32 accumulation
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bias[row] as float32: bias float32 [N], or bf16 [N] where bias_bf16 (read as it is: the float32 value of the bf16,
// the sum the host's conversion to float32 gave before)
__device__ __forceinline__ float bias_at(const float* bias, int bias_bf16, long long row) {
  return bias_bf16 ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(bias)[row]) : bias[row];
}

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
