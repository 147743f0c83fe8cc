// A/B variant of mma_a8w8.cu's one-strip kernels (MXFP8 x MXFP8 from codes, and W8A16 E4M3) on the packed weight,
// the weight streamed by Hopper bulk copies (sm_90: cp.async.bulk into a ring of shared-memory chunks completing on
// mbarriers, one producer warp) instead of each consumer warp's own 16-byte loads. At M <= 8 these kernels are
// load-bound (benchmarks/a8w8_ab.md), unlike MXFP4's decode (instruction-bound: benchmarks/decode_mma_ab.md, where
// the same ring did not help). The consumer warps take the production assignment of tiles (warp w: tiles w, w + 4,
// ... of its K range) and the production per-tile arithmetic: the same bits at the same split.
// Names: bulk_<c|w|b>_u<U>_s<STAGES>[_p][r] (c: MXFP8 codes in; w: W8A16 E4M3; b: bf16 in, quantized in the
// kernel; U: tiles a consumer warp takes from a chunk of 4 U; p: persistent, each block loops over strips
// blockIdx.y, + gridDim.y, ... with one ring across them, split 1 only; r: a slot freed after the arithmetic, else
// once read, after a cross-proxy fence). Timed by benchmarks/probes/a8w8_bulk_ab.py; the shipped kernels
// (mma_a8w8_bulk.cu, whose helpers this file uses) are U 4, 2 stages, p, r.
//
//   nvcc -ptx -arch=sm_90 -O3 -o /tmp/a8w8_bulk.ptx benchmarks/probes/a8w8_bulk.cu
#include "../../src/mxkit/kernels/matmul_details/mma_a8w8_bulk.cu"  // (its helpers; its kernels are not timed here)

namespace {

template <int CH, int STAGES>
struct RingT {
  uint4 q[STAGES][CH][64];
  uint32_t s[STAGES][CH][8];
  uint64_t full[STAGES], empty[STAGES];
};

// The producer (lane 0 of warp WARPS): chunk c (a running count over the block's strips) of the strip's tiles
// [kt, kt + n) into slot c % STAGES once its consumers have freed it.
template <int CH, int STAGES>
__device__ __forceinline__ void produce(RingT<CH, STAGES>& ring, const uint4* qs, const uint32_t* ss, int kt, int n,
                                        int c) {
  const int slot = c % STAGES;
  if (c >= STAGES) mbar_wait(&ring.empty[slot], ((c / STAGES) - 1) & 1);
  mbar_expect_tx(&ring.full[slot], n * (TILE_Q + TILE_S));
  bulk_copy(&ring.q[slot][0][0], qs + (long long)kt * 64, n * TILE_Q, &ring.full[slot]);
  bulk_copy(&ring.s[slot][0][0], ss + (long long)kt * 8, n * TILE_S, &ring.full[slot]);
}

// A consumer warp's K loop over tiles [kt_lo, kt_hi) of one strip, chunks numbered from c0 (the ring's running count)
// REL 0: the slot is freed once its words are in registers, after a cross-proxy fence (the next bulk copy into it is
// an async-proxy write after these generic-proxy reads); 1: freed after the chunk's arithmetic has used them.
template <int UNROLL, int STAGES, int W16, bool QUANT, int REL>
__device__ __forceinline__ void consume(RingT<WARPS * UNROLL, STAGES>& ring, const uint4* xb, const uint8_t* xq,
                                        const uint16_t* xs, bool xm, int kt_lo, int kt_hi, int warp, int c0,
                                        float (&acc)[4]) {
  constexpr int CH = WARPS * UNROLL;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.f;
  const int chunks = (kt_hi - kt_lo + CH - 1) / CH;
  for (int c = 0; c < chunks; ++c) {
    const int slot = (c0 + c) % STAGES, t0 = kt_lo + c * CH + warp;
    XTile<QUANT> xc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (t0 + u * WARPS < kt_hi) xc[u].load(xb, xq, xs, xm, t0 + u * WARPS);  // in flight during the wait
    mbar_wait(&ring.full[slot], ((c0 + c) / STAGES) & 1);
    uint2 wl[UNROLL][2], wh[UNROLL][2];
    uint32_t sw[UNROLL][2];
    chunk_words<UNROLL, CH>(ring.q[slot], ring.s[slot], warp, t0, kt_hi, wl, wh, sw);
    if (REL == 0) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncwarp();
      if (lane == 0) mbar_arrive(&ring.empty[slot]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (t0 + u * WARPS < kt_hi) tile_math<W16, QUANT>(wl[u], wh[u], sw[u], xc[u], acc);
    if (REL == 1) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&ring.empty[slot]);
    }
  }
}

// grid (ceil(M / 8), strips (or with PERSIST any count: block y takes strips y, y + gridDim.y, ...), S), block 160
// (4 consumer warps, 1 producer). Arguments and outputs as mma_a8w8.cu's mxfp8_a8w8 at R = 1, NT = 1 (packed).
template <int UNROLL, int STAGES, int W16, bool QUANT, bool PERSIST, int REL, typename OUT>
__device__ __forceinline__ void bulk_kernel(const void* __restrict__ x, const uint8_t* __restrict__ xs_base,
                                            const uint8_t* __restrict__ w, const uint8_t* __restrict__ sw,
                                            const float* __restrict__ bias, OUT* __restrict__ y,
                                            float* __restrict__ ws, int* __restrict__ cnt, int M, int N, int K,
                                            long long ldx, long long ldxs, long long ldy, int bias_bf16) {
  constexpr int CH = WARPS * UNROLL;
  extern __shared__ __align__(128) uint8_t dsmem[];  // sizeof(RingT<CH, STAGES>): the launch's dynamic shared memory
  RingT<CH, STAGES>& ring = *reinterpret_cast<RingT<CH, STAGES>*>(dsmem);
  __shared__ float red[WARPS][1][4][32];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int m0 = blockIdx.x * 8;
  M = min(M - m0, 8);
  y += (long long)m0 * ldy;
  const int KT = K >> 6, strips = N >> 4;
  const int S = PERSIST ? 1 : gridDim.z, split = PERSIST ? 0 : blockIdx.z;
  const int kt_lo = (int)((long long)KT * split / S), kt_hi = (int)((long long)KT * (split + 1) / S);
  const int per_strip = (kt_hi - kt_lo + CH - 1) / CH;  // chunks a strip
  init_ring(ring.full, ring.empty);
  const uint4* q = reinterpret_cast<const uint4*>(w);
  const uint32_t* s = reinterpret_cast<const uint32_t*>(sw);
  if (warp == WARPS) {  // the producer
    if (lane == 0) {
      int c = 0;
      for (int strip = blockIdx.y; strip < strips; strip += PERSIST ? gridDim.y : strips)
        for (int kt = kt_lo; kt < kt_hi; kt += CH, ++c)
          produce<CH, STAGES>(ring, q + (long long)strip * KT * 64, s + (long long)strip * KT * 8, kt,
                              min(CH, kt_hi - kt), c);
    }
    if (PERSIST) return;
  } else {
    const bool xm = g < M;
    const long long xrow = m0 + (xm ? g : 0);
    const int t = lane & 3;
    const uint4* xb = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(x) + xrow * ldx) + t;
    const uint8_t* xq = static_cast<const uint8_t*>(x) + xrow * ldx + 8 * t;
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(xs_base + xrow * ldxs);
    int c0 = 0;
    for (int strip = blockIdx.y; strip < strips; strip += PERSIST ? gridDim.y : strips, c0 += per_strip) {
      float acc[4];
      consume<UNROLL, STAGES, W16, QUANT, REL>(ring, xb, xq, xs, xm, kt_lo, kt_hi, warp, c0, acc);
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][0][i][lane] = acc[i];
      if (!PERSIST) break;
      consumers_sync();
      {
        const int e = threadIdx.x, i = (e / 32) & 3, l = e & 31;
        float v = red[0][0][i][l];
#pragma unroll
        for (int ww = 1; ww < WARPS; ++ww) v += red[ww][0][i][l];
        const long long row = (long long)strip * 16 + (l >> 2) + 8 * (i >> 1);
        const int m = 2 * (l & 3) + (i & 1);
        if (m < M) {
          if (bias != nullptr) v += mxkit::bias_at(bias, bias_bf16, row);
          y[m * ldy + row] = mxkit::to_out<OUT>(v);
        }
      }
      consumers_sync();
    }
    if (PERSIST) return;
  }
  __syncthreads();
  const long long row0 = (long long)blockIdx.y * 16;
  const long long tile = (long long)blockIdx.x * gridDim.y + blockIdx.y;
  mxkit::reduce_store<WARPS, 1>(red, ws + tile * S * 128, cnt + tile, S, split, last, [&](int e, float v) {
    const int i = (e / 32) & 3, l = e & 31;
    const long long row = row0 + (l >> 2) + 8 * (i >> 1);
    const int m = 2 * (l & 3) + (i & 1);
    if (m < M) {
      if (bias != nullptr) v += mxkit::bias_at(bias, bias_bf16, row);
      y[m * ldy + row] = mxkit::to_out<OUT>(v);
    }
  });
}

}  // namespace

#define BULK(NAME, U, ST, W16, Q, P, REL)                                                                        \
  extern "C" __global__ void __launch_bounds__(160) NAME(                                                      \
      const void* __restrict__ x, const uint8_t* __restrict__ xs, const uint8_t* __restrict__ w,               \
      const uint8_t* __restrict__ sw, const float* __restrict__ bias, __nv_bfloat16* __restrict__ y,           \
      float* __restrict__ ws, int* __restrict__ cnt, int M, int N, int K, long long ldx, long long ldxs,       \
      long long ldy, int bias_bf16) {                                                                          \
    bulk_kernel<U, ST, W16, Q, P, REL, __nv_bfloat16>(x, xs, w, sw, bias, y, ws, cnt, M, N, K, ldx, ldxs, ldy,   \
                                                   bias_bf16);                                                 \
  }
// c: MXFP8 codes in; w: W8A16 E4M3; b: bf16 in, quantized in the kernel (as the _bf16in kernels); _p persistent;
// _r: the slot freed after the arithmetic (REL 1)
#define ALL(U, ST)                                   \
  BULK(bulk_c_u##U##_s##ST, U, ST, 0, false, false, 0)      \
  BULK(bulk_w_u##U##_s##ST, U, ST, 1, true, false, 0)       \
  BULK(bulk_b_u##U##_s##ST, U, ST, 0, true, false, 0)       \
  BULK(bulk_c_u##U##_s##ST##_p, U, ST, 0, false, true, 0)   \
  BULK(bulk_w_u##U##_s##ST##_p, U, ST, 1, true, true, 0)    \
  BULK(bulk_b_u##U##_s##ST##_p, U, ST, 0, true, true, 0)    \
  BULK(bulk_c_u##U##_s##ST##_r, U, ST, 0, false, false, 1)  \
  BULK(bulk_w_u##U##_s##ST##_r, U, ST, 1, true, false, 1)   \
  BULK(bulk_c_u##U##_s##ST##_pr, U, ST, 0, false, true, 1)  \
  BULK(bulk_w_u##U##_s##ST##_pr, U, ST, 1, true, true, 1)

ALL(2, 2)
ALL(2, 4)
ALL(4, 2)
ALL(4, 3)
ALL(4, 4)
ALL(8, 2)
