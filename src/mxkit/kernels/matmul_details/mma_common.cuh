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

// --- the grouped (MoE expert) kernels' epilogue (mma_decode.cu's MXFP4 and mma_a8w8.cu's W8A16 kernels) -------------
// A block holds 8 sorted rows m (flat (token, slot) ids row_id(m); n_valid: padding) by SN strips of 16 weight
// rows. grouped_sums: v[m][16 p + r] = the sum over the warps, in order, of red[warp][p][i][lane] (the mma's
// accumulator layout: weight row r = lane / 4 + 8 (i / 2) of strip p, sorted row m = 2 (lane % 4) + i % 2), then
// add_bias(p, r, sum) (which returns the sum, or the sum plus the row's bias: the same float32 addition).
template <int WARPS, int SN, typename AddBias>
__device__ __forceinline__ void grouped_sums(const float (&red)[WARPS][SN][4][32], float (&v)[8][16 * SN + 1],
                                             AddBias add_bias) {
  for (int el = threadIdx.x; el < 128 * SN; el += blockDim.x) {
    const int p = SN == 1 ? 0 : el / 128, i = SN == 1 ? el / 32 : (el / 32) & 3, l = el & 31;
    float sum = red[0][p][i][l];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) sum += red[w][p][i][l];
    const int r = (l >> 2) + 8 * (i >> 1), m = 2 * (l & 3) + (i & 1);
    v[m][16 * p + r] = add_bias(p, r, sum);
  }
}

// ACT 1: GPT-OSS's clamped SwiGLU (transformers' GptOssExperts: alpha 1.702, limit 7.0); 2: SiLU(gate) * up
template <int ACT> __device__ __forceinline__ float act_pair(float gate, float up) {
  if (ACT == 1) {
    gate = gate > 7.f ? 7.f : gate;  // NaN stays NaN, as torch's clamp (fminf would drop it)
    up = up > 7.f ? 7.f : (up < -7.f ? -7.f : up);
    return (up + 1.f) * (gate / (1.f + expf(-1.702f * gate)));
  }
  return gate / (1.f + expf(-gate)) * up;
}

// The stores of v (grouped_sums) for the valid sorted rows i = row_id(m) < n_valid, each once in OUT at out[i]
// (row stride ldo), times rw[i] where MUL_RW. ACT 0: column col0 + c of v[m][c], c < 16 SN. ACT 1 / 2 on (gate,
// up) pairs into column col0 + c: interleaved rows (gate v[m][2c], up v[m][2c + 1], c < 8 SN), or HALVES (SN 2:
// strip 0 the gate rows, strip 1 the up rows; gate v[m][c], up v[m][16 + c], c < 16).
template <int ACT, bool MUL_RW, bool HALVES, int SN, typename OUT, typename RowId>
__device__ __forceinline__ void grouped_store(const float (&v)[8][16 * SN + 1], RowId row_id, int n_valid,
                                              const float* __restrict__ rw, OUT* __restrict__ out, long long ldo,
                                              long long col0) {
  static_assert(!HALVES || (SN == 2 && ACT != 0), "halves: a gate strip and an up strip, an activation");
  if (ACT == 0) {
    for (int el = threadIdx.x; el < 128 * SN; el += blockDim.x) {
      const int m = el / (16 * SN), r = el % (16 * SN);
      const int i = row_id(m);
      if (i < n_valid) {
        float val = v[m][r];
        if (MUL_RW) val *= rw[i];
        out[(long long)i * ldo + col0 + r] = to_out<OUT>(val);
      }
    }
  } else {
    constexpr int C = HALVES ? 16 : 8 * SN;  // output columns a block
    for (int el = threadIdx.x; el < 8 * C; el += blockDim.x) {
      const int m = el / C, c = el % C;
      const int i = row_id(m);
      if (i < n_valid) {
        float val = HALVES ? act_pair<ACT>(v[m][c], v[m][16 + c]) : act_pair<ACT>(v[m][2 * c], v[m][2 * c + 1]);
        if (MUL_RW) val *= rw[i];
        out[(long long)i * ldo + col0 + c] = to_out<OUT>(val);
      }
    }
  }
}

}  // namespace mxkit
