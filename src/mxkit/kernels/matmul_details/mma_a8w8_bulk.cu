// mma_a8w8.cu's MXFP8 x MXFP8 kernels (E4M3 codes in, or bf16 x quantized in the launch) at M <= 8 with the weight
// streamed by Hopper bulk copies: sm_90 (cp.async.bulk, mbarrier transaction counts), so a PTX of its own
// (mma_a8w8_bulk.ptx, sm_90; scripts/build_ptx.sh), loaded only on such GPUs. At M <= 8 these kernels are load-bound
// (benchmarks/a8w8_ab.md): with each consumer warp's own 16-byte loads one batch ahead they reach ~70% of copy
// bandwidth on an H200; here one producer warp a block keeps two chunks of 16 tiles (17 KB each) in flight while
// the block's 4 consumer warps compute (benchmarks/a8w8_ab.md: on an H200, 1 x 28672 x 8192 from MXFP8 codes
// 81.0 -> 67.6 us).
//
// The block is persistent: block y takes the strips (16 weight rows) y, y + gridDim.y, ... of the a8w8 layout
// (pack_a8w8: a strip's tiles of two 32-element blocks contiguous, 1024 code bytes and 32 scale bytes a tile), one
// ring of chunks across them. Each consumer warp takes the tiles of mma_a8w8.cu's mainloop (warp w: tiles w, w + 4,
// ...) with its arithmetic (tile_math), and the block sums its warps in order: each row's sum the bits of
// mma_a8w8.cu's kernel at one thread block along K (its split 1). A consumer frees a slot once its arithmetic has
// used the words it read: its reads have completed before the next bulk copy (an async-proxy write) refills it.
// (Freed as soon as the words were loaded, without a cross-proxy fence, the A/B probe saw rows differ in 2 launches
// of 30.)
#define MXKIT_A8W8_VARIANTS  // mma_a8w8.cu's device code, none of its kernels
#include "mma_a8w8.cu"

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }  // warps 0 .. 3

// mma_a8w8.cu's mainloop arithmetic for one tile (R = 1, NT = 1): weight words wl / wh (rows g / g + 8, blocks 0, 1),
// scale words sw, x of the lane's token (E4M3 codes and scales; W16: bf16, QUANT true, for the A/B probe's variants)
template <int W16, bool QUANT>
__device__ __forceinline__ void tile_math(const uint2 (&wl)[2], const uint2 (&wh)[2], const uint32_t (&sw)[2],
                                          const XTile<QUANT>& xc, float (&acc)[4]) {
  const int t = threadIdx.x & 3;
  uint32_t bx[2][2], sx[2];
  if (!W16) xc.operands(bx, sx);
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const float fg = e8m0((sw[0] >> (8 * b)) & 0xFFu);
    const float fg8 = e8m0((sw[1] >> (8 * b)) & 0xFFu);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    if (W16) {
      uint32_t a0[4], a1[4];
      decode_fp8<W16>(wl[b].x, a0[0], a0[2]);
      decode_fp8<W16>(wh[b].x, a0[1], a0[3]);
      decode_fp8<W16>(wl[b].y, a1[0], a1[2]);
      decode_fp8<W16>(wh[b].y, a1[1], a1[3]);
      mxkit::mma_bf16(c, a0, xc.v[b].x, xc.v[b].y);
      mxkit::mma_bf16(c, a1, xc.v[b].z, xc.v[b].w);
      acc[0] = fmaf(c[0], fg, acc[0]);
      acc[1] = fmaf(c[1], fg, acc[1]);
      acc[2] = fmaf(c[2], fg8, acc[2]);
      acc[3] = fmaf(c[3], fg8, acc[3]);
    } else {
      const float fa = e8m0(__shfl_sync(0xFFFFFFFFu, sx[b], 8 * t));
      const float fb = e8m0(__shfl_sync(0xFFFFFFFFu, sx[b], 8 * t + 4));
      mma_e4m3(c, wl[b], wh[b], bx[b][0], bx[b][1]);
      acc[0] = fmaf(c[0] * fg, fa, acc[0]);
      acc[1] = fmaf(c[1] * fg, fb, acc[1]);
      acc[2] = fmaf(c[2] * fg8, fa, acc[2]);
      acc[3] = fmaf(c[3] * fg8, fb, acc[3]);
    }
  }
}

constexpr int WARPS = 4, UNROLL = 4, CH = WARPS * UNROLL, STAGES = 2;  // H200: benchmarks/a8w8_ab.md
constexpr uint32_t TILE_Q = 1024, TILE_S = 32;  // code and scale bytes of a tile of a strip
constexpr int QB = 8;  // QUANT: x blocks a lane loads before quantizing them (benchmarks/a8w8_ab.md)

// the words of warp `warp`'s tiles u WARPS + warp (u < U; tile t0 + u WARPS < kt_hi) of a chunk in shared memory:
// wl / wh as WeightRows<true>::load gives them, sw the scale bytes of rows g and g + 8
template <int U, int CHUNK>
__device__ __forceinline__ void chunk_words(const uint4 (&q)[CHUNK][64], const uint32_t (&s)[CHUNK][8], int warp,
                                            int t0, int kt_hi, uint2 (&wl)[U][2], uint2 (&wh)[U][2],
                                            uint32_t (&sw)[U][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
  for (int u = 0; u < U; ++u)  // (all loads issued at once)
    if (t0 + u * WARPS < kt_hi) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint4 v = q[u * WARPS + warp][32 * b + lane];
        wl[u][b] = make_uint2(v.x, v.z);
        wh[u][b] = make_uint2(v.y, v.w);
      }
      const uint32_t sv = s[u * WARPS + warp][g];
      sw[u][0] = sv & 0xFFFFu;
      sw[u][1] = sv >> 16;
    }
}

// a ring's mbarriers (full: the producer's arrival and the bytes; empty: the WARPS consumers), made by thread 0
// and seen by the whole block
template <int ST>
__device__ __forceinline__ void init_ring(uint64_t (&full)[ST], uint64_t (&empty)[ST]) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < ST; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], WARPS);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

struct Ring {  // STAGES chunks of CH tiles
  uint4 q[STAGES][CH][64];
  uint32_t s[STAGES][CH][8];
  uint64_t full[STAGES], empty[STAGES];
};

// grid (ceil(M / 8), blocks), block 160: warps 0 .. 3 consume, warp 4's lane 0 produces. Arguments as mma_a8w8.cu's
// mxfp8_a8w8 (no split along K: ws and cnt unused); the weight in the a8w8 layout. QUANT: x bf16, its M <= 8 rows
// quantized once per block into dynamic shared memory (codes [M][K], then scale bytes [M][K / 32]: the launch's
// M (K + K / 32) bytes) by quantize8, the _bf16in kernels' bytes, while the producer's first chunks are in flight.
template <bool QUANT, typename OUT>
__device__ __forceinline__ void bulk_kernel(const void* __restrict__ x, const uint8_t* __restrict__ xs_base,
                                            const uint8_t* __restrict__ w, const uint8_t* __restrict__ sw,
                                            const float* __restrict__ bias, OUT* __restrict__ y, int M, int N, int K,
                                            long long ldx, long long ldxs, long long ldy, int bias_bf16) {
  __shared__ __align__(128) Ring ring;
  __shared__ float red[WARPS][4][32];
  extern __shared__ __align__(16) uint8_t xsm[];  // QUANT: x's codes and scale bytes
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m0 = blockIdx.x * 8;
  M = min(M - m0, 8);
  y += (long long)m0 * ldy;
  const int KT = K >> 6, strips = N >> 4, chunks = (KT + CH - 1) / CH;  // chunks a strip
  init_ring(ring.full, ring.empty);
  const uint4* q = reinterpret_cast<const uint4*>(w);
  const uint32_t* s = reinterpret_cast<const uint32_t*>(sw);
  if (warp == WARPS) {  // the producer: chunk c (counted over the block's strips) into slot c % STAGES once freed
    if (lane == 0) {
      int c = 0;
      for (int strip = blockIdx.y; strip < strips; strip += gridDim.y)
        for (int kt = 0; kt < KT; kt += CH, ++c) {
          const int slot = c % STAGES, n = min(CH, KT - kt);
          if (c >= STAGES) mbar_wait(&ring.empty[slot], ((c / STAGES) - 1) & 1);
          mbar_expect_tx(&ring.full[slot], n * (TILE_Q + TILE_S));
          bulk_copy(&ring.q[slot][0][0], q + ((long long)strip * KT + kt) * 64, n * TILE_Q, &ring.full[slot]);
          bulk_copy(&ring.s[slot][0][0], s + ((long long)strip * KT + kt) * 8, n * TILE_S, &ring.full[slot]);
        }
    }
    return;
  }
  const int g = lane >> 2, t = lane & 3;
  const bool xm = g < M;
  const long long xrow = m0 + (xm ? g : 0);
  const uint4* xb = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(x) + xrow * ldx) + t;
  const uint8_t* xq = static_cast<const uint8_t*>(x) + xrow * ldx + 8 * t;
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(xs_base + xrow * ldxs);
  if (QUANT) {  // a quad of lanes a 32-element block, QB blocks a lane loaded before any is quantized (their loads
    //             in flight together); every lane of a warp runs each quantize8 (its shuffles)
    const int KB = K >> 5, blocks = M * KB;
    uint8_t* sc = xsm + (long long)M * K;
    for (int b0 = 0; b0 < blocks; b0 += 8 * WARPS * QB) {
      uint4 v[QB];
#pragma unroll
      for (int j = 0; j < QB; ++j) {
        const int bi = b0 + 8 * (WARPS * j + warp) + g;
        v[j] = bi < blocks ? __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(x) +
                                                                  (m0 + bi / KB) * ldx + (bi % KB) * 32 + 8 * t))
                           : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int j = 0; j < QB; ++j) {
        const int bi = b0 + 8 * (WARPS * j + warp) + g;
        uint32_t c0, c1;
        const uint32_t byte = quantize8(v[j], c0, c1);
        if (bi < blocks) {
          const int row = bi / KB, kb = bi % KB;
          *reinterpret_cast<uint2*>(xsm + (long long)row * K + kb * 32 + 8 * t) = make_uint2(c0, c1);
          if (t == 0) sc[row * KB + kb] = (uint8_t)byte;
        }
      }
    }
    consumers_sync();
    xq = xsm + (long long)(xm ? g : 0) * K + 8 * t;
    xs = reinterpret_cast<const uint16_t*>(sc + (xm ? g : 0) * KB);
  }
  int c = 0;
  for (int strip = blockIdx.y; strip < strips; strip += gridDim.y) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int kc = 0; kc < chunks; ++kc, ++c) {
      const int slot = c % STAGES, t0 = kc * CH + warp;
      XTile<false> xc[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // (in flight during the wait)
        const int kt = t0 + u * WARPS;
        if (kt >= KT) continue;
        if (!QUANT) {
          xc[u].load(xb, xq, xs, xm, kt);
          continue;
        }
        xc[u].s2 = xm ? xs[kt] : 0u;  // XTile<false>::load, from shared memory
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const uint2 cw = xm ? *reinterpret_cast<const uint2*>(xq + kt * 64 + 32 * b) : make_uint2(0u, 0u);
          xc[u].v[b] = make_uint4(cw.x, cw.y, 0u, 0u);
        }
      }
      mbar_wait(&ring.full[slot], (c / STAGES) & 1);
      uint2 wl[UNROLL][2], wh[UNROLL][2];
      uint32_t swd[UNROLL][2];
      chunk_words<UNROLL, CH>(ring.q[slot], ring.s[slot], warp, t0, KT, wl, wh, swd);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (t0 + u * WARPS < KT) tile_math<0, false>(wl[u], wh[u], swd[u], xc[u], acc);
      __syncwarp();  // (the words used: the slot's reads are complete before the producer may refill it)
      if (lane == 0) mbar_arrive(&ring.empty[slot]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    consumers_sync();
    {  // element e = threadIdx.x of mma_common.cuh's reduce_store (one split): the warps' sums in order
      const int i = threadIdx.x >> 5;
      float v = red[0][i][lane];
#pragma unroll
      for (int ww = 1; ww < WARPS; ++ww) v += red[ww][i][lane];
      const long long row = (long long)strip * 16 + g + 8 * (i >> 1);
      const int m = 2 * t + (i & 1);
      if (m < M) {
        if (bias != nullptr) v += mxkit::bias_at(bias, bias_bf16, row);
        y[m * ldy + row] = mxkit::to_out<OUT>(v);
      }
    }
    consumers_sync();
  }
}

}  // namespace

// the parameter list of mma_a8w8.cu's kernels (ws, cnt unused), so that one binding serves both files
#define MXKIT_BULK(NAME, QUANT, OUT)                                                                            \
  extern "C" __global__ void __launch_bounds__(160) NAME(                                                      \
      const void* __restrict__ x, const uint8_t* __restrict__ xs, const uint8_t* __restrict__ w,               \
      const uint8_t* __restrict__ sw, const float* __restrict__ bias, OUT* __restrict__ y, float* __restrict__, \
      int* __restrict__, int M, int N, int K, long long ldx, long long ldxs, long long ldy, int bias_bf16) {    \
    bulk_kernel<QUANT, OUT>(x, xs, w, sw, bias, y, M, N, K, ldx, ldxs, ldy, bias_bf16);                         \
  }
MXKIT_BULK(mxfp8_a8w8p_bulk_bf16, false, __nv_bfloat16)  // E4M3 codes and scales in
MXKIT_BULK(mxfp8_a8w8p_bulk_f16, false, __half)
MXKIT_BULK(mxfp8_a8w8p_bulk_f32, false, float)
MXKIT_BULK(mxfp8_a8w8p_bulk_bf16_bf16in, true, __nv_bfloat16)  // bf16 x, quantized in the launch
MXKIT_BULK(mxfp8_a8w8p_bulk_f16_bf16in, true, __half)
MXKIT_BULK(mxfp8_a8w8p_bulk_f32_bf16in, true, float)
