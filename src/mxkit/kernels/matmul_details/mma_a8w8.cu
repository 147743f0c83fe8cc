// Small-M GEMM y = x @ W.T with MXFP8 (E4M3) activations and an MXFP8 (E4M3) weight on FP8 tensor cores
// (mma.sync m16n8k32 e4m3, sm_89 and newer: Ada, Hopper), aiter's a8w8 small-M GEMM on Hopper. The PTX beside
// this file (mma_a8w8.ptx, sm_89) is what mxkit loads; scripts/build_ptx.sh regenerates it.
//
// The operands: the weight's E4M3 codes W [N, K] and E8M0 scales SW [N, K / 32] (row-major, K along the row:
// OCP MX v1.0 blocks of 32 along K; or in the a8w8 layout, below); the activations either
// as MXFP8 codes X [M, K] with scales SX [M, K / 32], or as bf16 rows that the kernel quantizes itself (the
// _bf16in kernels: OCP FLOOR scale, round to nearest even, saturating: mxkit.reference.quantize_reference's
// bytes, checked byte for byte through mxfp8_quantize_probe). One mma covers one 32-element block: the lane
// (g, t) of a warp holds, for weight rows g and g + 8 and for token g, the 8 block columns 8t .. 8t + 7 (one
// 8-byte load each: the mma's K order is permuted within the block, the same for both operands, so that
// fragment columns 4t + i and 16 + 4t + i are block columns 8t + i and 8t + 4 + i). The block's sum, float32
// from zero, is multiplied by 2^(sw - 127) * 2^(sx - 127) (float32; byte 255 is NaN, byte 0 is 2^-127) and added
// to the accumulator: exact per-block products, float32 accumulation. A warp takes R 16-row strips at once
// (the activation quantization is shared by them); the 4 warps of a block split K in tiles of two blocks and
// their partial sums are added in warp order; split-K over thread blocks is as in mma_decode.cu.
// The weight is read either as stored (above: 8-byte loads of rows g and g + 8) or, faster, in the a8w8 layout
// that mxkit.kernels.matmul_details._mma_a8w8.pack_a8w8 writes once at pack_weight time (same bytes): for each
// 16-row strip, tile and block, lane 4g + t's 16 bytes are its fragment words a0 .. a3 (rows g, g + 8; block
// columns 8t .. 8t + 3, 8t + 4 .. 8t + 7), a warp's load 512 contiguous bytes; scale words as in mma_decode.cu.
//
// W8A16 (the mxfp8_w16* kernels: bf16 activations times an MXFP8 E4M3 or E5M2 weight in the a8w8 layout, exact
// like decode-mma): the lane's 8 codes of a row and block decode to bf16 in four integer operations a pair (each
// byte in the high byte of a 16-bit half, shifted onto a bf16's exponent and mantissa, its sign kept: the value
// times 2^-120 for E4M3, 2^-112 for E5M2, subnormals included) and one fma by 2^120 / 2^112 (exact), and the
// block is two bf16 mma.sync m16n8k16 against the token's x values of block columns 8t .. 8t + 3 and 8t + 4 ..
// 8t + 7 (one 16-byte load: the same K permutation on both sides). The block's float32 sum times 2^(sw - 127)
// is added to the accumulator, as above. NaN / Inf codes do not decode to NaN / Inf: the host keeps weights
// holding them off these kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mma_common.cuh"

namespace {

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint2 wg, uint2 wg8, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(wg.x), "r"(wg8.x), "r"(wg.y), "r"(wg8.y), "r"(b0), "r"(b1));
}

// E8M0 byte -> 2^(s - 127) in float32; 255 is NaN, 0 the subnormal 2^-127
__device__ __forceinline__ float e8m0(uint32_t s) {
  return __uint_as_float(s == 255u ? 0x7FC00000u : (s == 0u ? 0x00400000u : s << 23));
}

// four FP8 codes (byte i = element i) -> the bf16x2 pairs (0, 1) and (2, 3) of their exact values. ELEM 1:
// E4M3 (bits times 2^-120 after the shift by 4), 2: E5M2 (2^-112, shift 3).
template <int ELEM>
__device__ __forceinline__ void decode_fp8(uint32_t w, uint32_t& p01, uint32_t& p23) {
  constexpr int SH = ELEM == 1 ? 4 : 3;
  constexpr uint32_t MAG = ELEM == 1 ? 0x07F007F0u : 0x0FE00FE0u, K = ELEM == 1 ? 0x7B807B80u : 0x77807780u;
  const uint32_t NZ = 0x80008000u;
  uint32_t v = __byte_perm(w, 0u, 0x1404u);  // bytes 0, 1 -> the high bytes of the two halves
  p01 = mxkit::fma_bf16x2(((v >> SH) & MAG) | (v & 0x80008000u), K, NZ);
  v = __byte_perm(w, 0u, 0x3424u);
  p23 = mxkit::fma_bf16x2(((v >> SH) & MAG) | (v & 0x80008000u), K, NZ);
}

__device__ __forceinline__ uint2 ld_stream(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}


// four bf16 (p: elements 0 low, 1 high; q: 2, 3) times mul, to four E4M3 codes (element 0 in the low byte)
__device__ __forceinline__ uint32_t cvt4(uint32_t p, uint32_t q, float mul) {
  const float f0 = __uint_as_float(p << 16) * mul, f1 = __uint_as_float(p & 0xFFFF0000u) * mul;
  const float f2 = __uint_as_float(q << 16) * mul, f3 = __uint_as_float(q & 0xFFFF0000u) * mul;
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(f1), "f"(f0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(f3), "f"(f2));
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// The lane's 8 bf16 of a 32-element block (the quad of lanes 4g .. 4g + 3 holds the block) -> its 8 E4M3 codes
// (b0: the first four) and the block's E8M0 byte, returned. OCP MX v1.0 §6.3 FLOOR scale for E4M3 (emax 8):
// byte = max(E - 8, 0) for the largest magnitude's bf16 exponent field E (0 for an all-zero block; a bf16
// subnormal amax clamps to 0 too); 255 and codes 0 when the block holds an Inf or NaN (magnitude bits >= 0x7F80).
// The elements times 2^(127 - byte) (exact: results below the float32 normals round to zero in E4M3 either way)
// round to nearest even and saturate to +-448 (cvt.rn.satfinite), the sign of zero kept.
__device__ __forceinline__ uint32_t quantize8(uint4 v, uint32_t& b0, uint32_t& b1) {
  const uint32_t MAG = 0x7FFF7FFFu;
  uint32_t m = __vmaxu2(__vmaxu2(v.x & MAG, v.y & MAG), __vmaxu2(v.z & MAG, v.w & MAG));
  m = max(m & 0xFFFFu, m >> 16);
  m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  const uint32_t e = m >> 7;
  const bool nonfinite = m >= 0x7F80u;
  const uint32_t byte = nonfinite ? 255u : (e > 8u ? e - 8u : 0u);
  const float mul = __uint_as_float((254u - min(byte, 246u)) << 23);
  b0 = nonfinite ? 0u : cvt4(v.x, v.y, mul);
  b1 = nonfinite ? 0u : cvt4(v.z, v.w, mul);
  return byte;
}

// The weight bytes of tile kt, strip r: fragment words (a0, a2) in lo, (a1, a3) in hi, per block b; the scale
// bytes of rows g (low half of sw[.][0]) and g + 8 (sw[.][1]), blocks 0 and 1. PACKED: the a8w8 layout of
// pack_a8w8 (ws: the strip's lane base, one 16-byte load per block; ss: its scale words), else the weight as
// stored (wr / wr8: rows g, g + 8 at column 8t, an 8-byte load per row and block; swr / swr8: scale rows).
template <bool PACKED>
struct WeightRows {
  const uint8_t* wr;
  const uint8_t* wr8;
  const uint16_t* swr;
  const uint16_t* swr8;
  __device__ __forceinline__ void load(int kt, uint2 (&lo)[2], uint2 (&hi)[2], uint32_t (&sw)[2]) const {
    if (PACKED) {
      const uint4* q = reinterpret_cast<const uint4*>(wr) + (long long)kt * 64;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint4 v = ld_stream16(q + 32 * b);
        lo[b] = make_uint2(v.x, v.z);
        hi[b] = make_uint2(v.y, v.w);
      }
      const uint32_t s = __ldg(reinterpret_cast<const uint32_t*>(swr) + (long long)kt * 8);
      sw[0] = s & 0xFFFFu;
      sw[1] = s >> 16;
    } else {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        lo[b] = ld_stream(wr + (long long)kt * 64 + 32 * b);
        hi[b] = ld_stream(wr8 + (long long)kt * 64 + 32 * b);
      }
      sw[0] = __ldg(swr + kt);
      sw[1] = __ldg(swr8 + kt);
    }
  }
};

// The x bytes of tile kt for the lane's token (zeros past M): QUANT, two uint4 of bf16 (v[b], block b); else
// the E4M3 codes of block b in v[b].x / .y and the two scale bytes in s2.
template <bool QUANT>
struct XTile {
  uint4 v[2];
  uint32_t s2;
  __device__ __forceinline__ void load(const uint4* xb, const uint8_t* xq, const uint16_t* xs, bool xm, int kt) {
    if (QUANT) {
#pragma unroll
      for (int b = 0; b < 2; ++b) v[b] = xm ? __ldg(xb + kt * 8 + 4 * b) : make_uint4(0u, 0u, 0u, 0u);
    } else {
      s2 = xm ? __ldg(xs + kt) : 0u;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint2 c = xm ? __ldg(reinterpret_cast<const uint2*>(xq + (long long)kt * 64 + 32 * b))
                           : make_uint2(0u, 0u);
        v[b] = make_uint4(c.x, c.y, 0u, 0u);
      }
    }
  }
  // the mma's B words bx[b][0..1] and scale bytes sx[b] (QUANT: quantized here; its shuffles need the whole warp)
  __device__ __forceinline__ void operands(uint32_t (&bx)[2][2], uint32_t (&sx)[2]) const {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if (QUANT) {
        sx[b] = quantize8(v[b], bx[b][0], bx[b][1]);
      } else {
        bx[b][0] = v[b].x;
        bx[b][1] = v[b].y;
        sx[b] = (s2 >> (8 * b)) & 0xFFu;
      }
    }
  }
};

// One tile of the W8A16 kernels (W16 = ELEM): bf16 x (block columns 8t .. 8t + 7 of token g of each token tile n)
// times the decoded weight codes of R strips, each block's sum scaled into acc in float32.
template <int R, int W16, int NT>
__device__ __forceinline__ void w16_tile(const uint2 (&wl)[R][2], const uint2 (&wh)[R][2], const uint32_t (&sw)[R][2],
                                         const XTile<true> (&xc)[NT], float (&acc)[R][NT][4]) {
#pragma unroll
  for (int b = 0; b < 2; ++b) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t a0[4], a1[4];
      decode_fp8<W16>(wl[r][b].x, a0[0], a0[2]);  // row g, block columns 8t .. 8t + 3
      decode_fp8<W16>(wh[r][b].x, a0[1], a0[3]);  // row g + 8
      decode_fp8<W16>(wl[r][b].y, a1[0], a1[2]);  // row g, 8t + 4 .. 8t + 7
      decode_fp8<W16>(wh[r][b].y, a1[1], a1[3]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4 xv = xc[n].v[b];
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        mxkit::mma_bf16(c, a0, xv.x, xv.y);
        mxkit::mma_bf16(c, a1, xv.z, xv.w);
        const float fg = e8m0((sw[r][0] >> (8 * b)) & 0xFFu);  // (the same for every n)
        const float fg8 = e8m0((sw[r][1] >> (8 * b)) & 0xFFu);
        acc[r][n][0] = fmaf(c[0], fg, acc[r][n][0]);
        acc[r][n][1] = fmaf(c[1], fg, acc[r][n][1]);
        acc[r][n][2] = fmaf(c[2], fg8, acc[r][n][2]);
        acc[r][n][3] = fmaf(c[3], fg8, acc[r][n][3]);
      }
    }
  }
}

// The K loop of one warp over tiles (two 32-element blocks) kt_lo + warp, + 4, ... < kt_hi, for R strips of 16
// weight rows (wrows[r]); x: bf16 row xb (QUANT) or codes xq and scales xs of the lane's token g (of token
// tile n: xb[n] / xq[n] / xs[n] / xm[n]; NT > 1 for W16 only). acc[r][n][i]: rows g, g, g+8, g+8 of strip r;
// tokens 8n + 2t, + 1, 2t, + 1. The weight bytes of the next batch of UNROLL tiles are in flight while one batch
// is computed, and with XPF its x bytes too.
template <int R, int UNROLL, bool QUANT, bool PACKED, bool XPF, int W16, int NT = 1>
__device__ __forceinline__ void mainloop(const WeightRows<PACKED> (&wrows)[R], const uint4* const (&xb)[NT],
                                         const uint8_t* const (&xq)[NT], const uint16_t* const (&xs)[NT],
                                         const bool (&xm)[NT], int kt_lo, int kt_hi, int warp,
                                         float (&acc)[R][NT][4]) {
  static_assert(NT == 1 || W16, "token tiles a block past 1: the W8A16 kernels only");
  static_assert(!W16 || QUANT, "the W8A16 kernels read bf16 x");
  constexpr int WARPS = 4;
  const int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][n][i] = 0.f;
  uint2 wl[UNROLL][R][2], wh[UNROLL][R][2], nl[UNROLL][R][2], nh[UNROLL][R][2];  // tile, strip, block
  uint32_t sw[UNROLL][R][2], sn[UNROLL][R][2];
  XTile<QUANT> xc[UNROLL][NT], xn[UNROLL][NT];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int kt = kt_lo + warp + u * WARPS;
    if (kt < kt_hi) {
#pragma unroll
      for (int r = 0; r < R; ++r) wrows[r].load(kt, wl[u][r], wh[u][r], sw[u][r]);
      if (XPF)
#pragma unroll
        for (int n = 0; n < NT; ++n) xc[u][n].load(xb[n], xq[n], xs[n], xm[n], kt);
    }
  }
  for (int t0 = kt_lo + warp; t0 < kt_hi; t0 += WARPS * UNROLL) {
    uint32_t bx[UNROLL][2][2], sx[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kt = t0 + u * WARPS;
      if (!XPF && kt < kt_hi)
#pragma unroll
        for (int n = 0; n < NT; ++n) xc[u][n].load(xb[n], xq[n], xs[n], xm[n], kt);
      const int kn = kt + WARPS * UNROLL;  // the next batch
      if (kn < kt_hi) {
#pragma unroll
        for (int r = 0; r < R; ++r) wrows[r].load(kn, nl[u][r], nh[u][r], sn[u][r]);
        if (XPF)
#pragma unroll
          for (int n = 0; n < NT; ++n) xn[u][n].load(xb[n], xq[n], xs[n], xm[n], kn);
      }
      if (!W16 && kt < kt_hi) xc[u][0].operands(bx[u], sx[u]);  // (uniform over the warp: quantize8's shuffles)
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kt = t0 + u * WARPS;
      if (kt < kt_hi) {
        if constexpr (W16 != 0) {
          w16_tile<R, W16, NT>(wl[u], wh[u], sw[u], xc[u], acc);
        } else {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            // the scales of tokens 2t and 2t + 1 (held by the quads 2t, 2t + 1)
            const float fa = e8m0(__shfl_sync(0xFFFFFFFFu, sx[u][b], 8 * t));
            const float fb = e8m0(__shfl_sync(0xFFFFFFFFu, sx[u][b], 8 * t + 4));
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float c[4] = {0.f, 0.f, 0.f, 0.f};
              mma_e4m3(c, wl[u][r][b], wh[u][r][b], bx[u][b][0], bx[u][b][1]);
              const float fg = e8m0((sw[u][r][0] >> (8 * b)) & 0xFFu);
              const float fg8 = e8m0((sw[u][r][1] >> (8 * b)) & 0xFFu);
              acc[r][0][0] = fmaf(c[0] * fg, fa, acc[r][0][0]);
              acc[r][0][1] = fmaf(c[1] * fg, fb, acc[r][0][1]);
              acc[r][0][2] = fmaf(c[2] * fg8, fa, acc[r][0][2]);
              acc[r][0][3] = fmaf(c[3] * fg8, fb, acc[r][0][3]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          wl[u][r][b] = nl[u][r][b];
          wh[u][r][b] = nh[u][r][b];
        }
        sw[u][r][0] = sn[u][r][0];
        sw[u][r][1] = sn[u][r][1];
      }
      if (XPF)
#pragma unroll
        for (int n = 0; n < NT; ++n) xc[u][n] = xn[u][n];
    }
  }
}

// grid (ceil(M / (8 NT)), N / (16 R), S), block 128 (4 warps). x: bf16 rows (QUANT) or E4M3 codes [M, ldx] with
// E8M0 scales [M, ldxs]; w [N, K] codes, sw [N, K / 32]; y [M, ldy]. With S > 1 block z takes the z-th of S
// ranges of K tiles, writes its float32 partial to ws [token block, strip group, S, R x NT x 128] and the last
// of the S blocks to arrive (counted in cnt, reset to 0 by it) adds the S partials in order: deterministic.
// bias: float32 [N], or bf16 [N] where bias_bf16 (mxkit::bias_at), added in float32 before the rounding to OUT.
// NT token tiles of 8 a block (W16 only): each weight tile decoded once for 8 NT tokens, each token's sums the
// bits of NT = 1.
template <int R, int UNROLL, bool QUANT, bool PACKED, bool XPF, int W16, typename OUT, int NT = 1>
__device__ __forceinline__ void mxfp8_a8w8(const void* __restrict__ x, const uint8_t* __restrict__ xs_base,
                                           const uint8_t* __restrict__ w, const uint8_t* __restrict__ sw,
                                           const float* __restrict__ bias, OUT* __restrict__ y,
                                           float* __restrict__ ws, int* __restrict__ cnt, int M, int N, int K,
                                           long long ldx, long long ldxs, long long ldy, int bias_bf16) {
  constexpr int WARPS = 4;
  __shared__ float red[WARPS][R * NT][4][32];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const long long row0 = (long long)blockIdx.y * 16 * R;
  const int m0 = blockIdx.x * 8 * NT;
  M = min(M - m0, 8 * NT);
  y += (long long)m0 * ldy;
  const int KT = K >> 6;
  const long long KB = K >> 5;
  const int S = gridDim.z, split = blockIdx.z;
  const int kt_lo = (int)((long long)KT * split / S), kt_hi = (int)((long long)KT * (split + 1) / S);
  WeightRows<PACKED> wrows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (PACKED) {
      const long long strip = row0 / 16 + r;
      wrows[r].wr = w + (strip * KT * 64 + lane) * 16;
      wrows[r].swr = reinterpret_cast<const uint16_t*>(sw + (strip * KT * 8 + g) * 4);
    } else {
      const long long n = row0 + 16 * r + g;
      wrows[r].wr = w + n * K + 8 * t;
      wrows[r].wr8 = w + (n + 8) * K + 8 * t;
      wrows[r].swr = reinterpret_cast<const uint16_t*>(sw + n * KB);
      wrows[r].swr8 = reinterpret_cast<const uint16_t*>(sw + (n + 8) * KB);
    }
  }
  bool xm[NT];
  const uint4* xb[NT];
  const uint8_t* xq[NT];
  const uint16_t* xs[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    xm[n] = g + 8 * n < M;
    const long long xrow = m0 + (xm[n] ? g + 8 * n : 0);
    xb[n] = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(x) + xrow * ldx) + t;
    xq[n] = static_cast<const uint8_t*>(x) + xrow * ldx + 8 * t;
    xs[n] = reinterpret_cast<const uint16_t*>(xs_base + xrow * ldxs);
  }
  float acc[R][NT][4];
  mainloop<R, UNROLL, QUANT, PACKED, XPF, W16, NT>(wrows, xb, xq, xs, xm, kt_lo, kt_hi, warp, acc);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][r * NT + n][i][lane] = acc[r][n][i];
  __syncthreads();
  const long long tile = (long long)blockIdx.x * gridDim.y + blockIdx.y;
  mxkit::reduce_store<WARPS, R * NT>(red, ws + tile * S * (R * NT * 128), cnt + tile, S, split, last,
                                     [&](int e, float v) {
    const int r = NT == 1 ? e / 128 : e / (NT * 128), n = NT == 1 ? 0 : (e / 128) % NT;
    const int i = (e / 32) & 3, l = e & 31;
    const long long row = row0 + 16 * r + (l >> 2) + 8 * (i >> 1);  // weight row n
    const int m = 8 * n + 2 * (l & 3) + (i & 1);                     // token, within the block of 8 NT
    if (m < M) {
      if (bias != nullptr) v += mxkit::bias_at(bias, bias_bf16, row);
      y[m * ldy + row] = mxkit::to_out<OUT>(v);
    }
  });
}

// Grouped (MoE expert) W8A16 GEMM over tokens sorted by expert, the contract of mma_decode.cu's
// mxfp4_mma_grouped (vLLM's moe_align_block_size with blocks of 8; ACT, GATHER, MUL_RW, bias, rw, out as there)
// on MXFP8 experts read as stored: codes w [E N, K] and scales sw [E N, K / 32] (the experts' MXTensor bytes,
// expert e's rows e N ..; K % 64 == 0, no NaN / Inf code), bf16 x. Block (mb, y) computes the sorted rows
// ids[8 mb .. 8 mb + 7] by expert eids[mb] (-1: nothing to do): one 16-row strip y (ACT 0, and ACT 1 / 2 on
// interleaved (gate, up) rows), or with HALVES ([gate; up] halves, ACT 2) gate rows 16 y .. and up rows
// N / 2 + 16 y .. (two strips sharing each x load) into output columns 16 y ... The K loop and the per-block
// arithmetic are the dense W8A16 kernel's (mainloop, W16 = ELEM): each row's sum the bits of that kernel at one
// thread block along K.
template <int ACT, bool GATHER, bool MUL_RW, bool HALVES, int ELEM, typename OUT>
__device__ __forceinline__ void mxfp8_w16_grouped(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w,
                                                  const uint8_t* __restrict__ sw, const float* __restrict__ bias,
                                                  const float* __restrict__ rw, OUT* __restrict__ out,
                                                  const int* __restrict__ ids, const int* __restrict__ eids, int N,
                                                  int K, int n_valid, int top_k, long long ldx, long long ldo) {
  constexpr int WARPS = 4, R = HALVES ? 2 : 1;
  __shared__ float red[WARPS][R][4][32];
  __shared__ float v[8][16 * R + 1];
  const int mb = blockIdx.x, strip = blockIdx.y;
  const int e = eids[mb];
  if (e < 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int id = ids[mb * 8 + g];
  const bool xm[1] = {id < n_valid};
  const long long xrow = xm[0] ? (GATHER ? id / top_k : id) : 0;
  const uint4* const xb[1] = {reinterpret_cast<const uint4*>(x + xrow * ldx) + t};
  const uint8_t* const xq[1] = {nullptr};
  const uint16_t* const xs[1] = {nullptr};
  const long long KB = K >> 5;
  WeightRows<false> wrows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const long long n = (long long)e * N + (r ? N / 2 : 0) + 16LL * strip + g;  // (r 1: the up half)
    wrows[r].wr = w + n * K + 8 * t;
    wrows[r].wr8 = w + (n + 8) * K + 8 * t;
    wrows[r].swr = reinterpret_cast<const uint16_t*>(sw + n * KB);
    wrows[r].swr8 = reinterpret_cast<const uint16_t*>(sw + (n + 8) * KB);
  }
  float acc[R][1][4];
  mainloop<R, 1, true, false, true, ELEM, 1>(wrows, xb, xq, xs, xm, 0, K >> 6, warp, acc);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][r][i][lane] = acc[r][0][i];
  __syncthreads();
  mxkit::grouped_sums<WARPS, R>(red, v, [&](int p, int r, float sum) {
    return bias != nullptr ? sum + bias[(long long)e * N + (p ? N / 2 : 0) + 16LL * strip + r] : sum;
  });
  __syncthreads();
  mxkit::grouped_store<ACT, MUL_RW, HALVES, R, OUT>(v, [&](int m) { return ids[mb * 8 + m]; }, n_valid, rw, out,
                                                    ldo, (long long)strip * (ACT == 0 || HALVES ? 16 : 8));
}

}  // namespace

#define MXKIT_A8W8(NAME, R, UNROLL, QUANT, PACKED, XPF, OUT) MXKIT_MX8(NAME, R, UNROLL, QUANT, PACKED, XPF, 0, OUT)
#define MXKIT_MX8(NAME, R, UNROLL, QUANT, PACKED, XPF, W16, OUT) MXKIT_MX8_NT(NAME, R, UNROLL, QUANT, PACKED, XPF, W16, OUT, 1)
#define MXKIT_MX8_NT(NAME, R, UNROLL, QUANT, PACKED, XPF, W16, OUT, NT)                                         \
  extern "C" __global__ void __launch_bounds__(128) NAME(                                                      \
      const void* __restrict__ x, const uint8_t* __restrict__ xs, const uint8_t* __restrict__ w,               \
      const uint8_t* __restrict__ sw, const float* __restrict__ bias, OUT* __restrict__ y,                     \
      float* __restrict__ ws, int* __restrict__ cnt, int M, int N, int K, long long ldx, long long ldxs,       \
      long long ldy, int bias_bf16) {                                                                          \
    mxfp8_a8w8<R, UNROLL, QUANT, PACKED, XPF, W16, OUT, NT>(x, xs, w, sw, bias, y, ws, cnt, M, N, K, ldx,      \
                                                           ldxs, ldy, bias_bf16);                              \
  }

// each out dtype; activations as MXFP8 codes + scales, or bf16 quantized in the kernel (_bf16in)
#define MXKIT_A8W8_ALL(P, R, UNROLL, PACKED, XPF)                                                              \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_bf16, R, UNROLL, false, PACKED, XPF, __nv_bfloat16)                        \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_f16, R, UNROLL, false, PACKED, XPF, __half)                                \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_f32, R, UNROLL, false, PACKED, XPF, float)                                 \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_bf16_bf16in, R, UNROLL, true, PACKED, XPF, __nv_bfloat16)                  \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_f16_bf16in, R, UNROLL, true, PACKED, XPF, __half)                          \
  MXKIT_A8W8(mxfp8_a8w8##P##_r##R##_f32_bf16in, R, UNROLL, true, PACKED, XPF, float)

#ifndef MXKIT_A8W8_VARIANTS  // the A/B probes (benchmarks/probes/a8w8_ab.py) and mma_a8w8_bulk.cu instantiate their own
// the weight as stored (mxfp8_a8w8_*) and in the a8w8 layout (mxfp8_a8w8p_*); R strips per warp, UNROLL tiles
// per batch, x a batch ahead or not, chosen on an H100 (benchmarks/a8w8_ab.md): MXFP8 x, M <= 8: r1, 2 tiles;
// M <= 16: r2, 1 tile, x ahead; more: r4, 1 tile, x ahead; bf16 x (_bf16in): r2, 1 tile, x ahead. R, UNROLL
// and the prefetch leave each row's sum order as it is: with the same split of K over thread blocks every
// kernel here gives the same bits (the host's split depends on the grid, hence on R).
MXKIT_A8W8_ALL(, 1, 2, false, false)
MXKIT_A8W8_ALL(, 2, 2, false, false)
MXKIT_A8W8_ALL(p, 1, 2, true, false)
MXKIT_A8W8_ALL(p, 2, 1, true, true)
MXKIT_A8W8_ALL(p, 4, 1, true, true)

// W8A16: bf16 x (loaded as the _bf16in kernels load it, not quantized) times the a8w8 layout's E4M3 / E5M2
// codes; R strips per warp as the _bf16in kernels (one tile a batch, x a batch ahead)
#define MXKIT_W16_ALL(R, E, ELEM)                                                                               \
  MXKIT_MX8(mxfp8_w16p_r##R##_bf16_##E, R, 1, true, true, true, ELEM, __nv_bfloat16)                           \
  MXKIT_MX8(mxfp8_w16p_r##R##_f16_##E, R, 1, true, true, true, ELEM, __half)                                   \
  MXKIT_MX8(mxfp8_w16p_r##R##_f32_##E, R, 1, true, true, true, ELEM, float)
MXKIT_W16_ALL(1, e4m3, 1)
MXKIT_W16_ALL(2, e4m3, 1)
MXKIT_W16_ALL(1, e5m2, 2)
MXKIT_W16_ALL(2, e5m2, 2)
// ... and 9-16 tokens a block at two strips a warp (_nt2: each weight tile decoded once for 16 tokens; the bits of
// NT = 1 at the same split; H200, session 39: 16 x 28672 x 8192 93.6 us against 105.5 for the Triton decode-w16)
#define MXKIT_W16_NT2(E, ELEM)                                                                                  \
  MXKIT_MX8_NT(mxfp8_w16p_r2_nt2_bf16_##E, 2, 1, true, true, true, ELEM, __nv_bfloat16, 2)                     \
  MXKIT_MX8_NT(mxfp8_w16p_r2_nt2_f16_##E, 2, 1, true, true, true, ELEM, __half, 2)                             \
  MXKIT_MX8_NT(mxfp8_w16p_r2_nt2_f32_##E, 2, 1, true, true, true, ELEM, float, 2)
MXKIT_W16_NT2(e4m3, 1)
MXKIT_W16_NT2(e5m2, 2)

// The grouped (MoE) W8A16 kernels: gate_up with GPT-OSS's SwiGLU (interleaved rows) or SwiGLU on [gate; up]
// halves (bf16 out), and the down GEMM times the routing weight (float32 out); per element format
#define MXKIT_W16_GROUPED(NAME, ACT, GATHER, MUL_RW, HALVES, ELEM, OUT)                                          \
  extern "C" __global__ void __launch_bounds__(128) NAME(                                                      \
      const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w, const uint8_t* __restrict__ sw,       \
      const float* __restrict__ bias, const float* __restrict__ rw, OUT* __restrict__ out,                     \
      const int* __restrict__ ids, const int* __restrict__ eids, int N, int K, int n_valid, int top_k,         \
      long long ldx, long long ldo) {                                                                          \
    mxfp8_w16_grouped<ACT, GATHER, MUL_RW, HALVES, ELEM, OUT>(x, w, sw, bias, rw, out, ids, eids, N, K, n_valid, \
                                                              top_k, ldx, ldo);                                \
  }
#define MXKIT_W16_GROUPED_ALL(E, ELEM)                                                                          \
  MXKIT_W16_GROUPED(mxfp8_w16_grouped_swiglu_gpt_oss_##E, 1, true, false, false, ELEM, __nv_bfloat16)          \
  MXKIT_W16_GROUPED(mxfp8_w16_grouped_swiglu_##E, 2, true, false, true, ELEM, __nv_bfloat16)                   \
  MXKIT_W16_GROUPED(mxfp8_w16_grouped_down_##E, 0, false, true, false, ELEM, float)
MXKIT_W16_GROUPED_ALL(e4m3, 1)
MXKIT_W16_GROUPED_ALL(e5m2, 2)

// The activation quantization of the _bf16in kernels alone, for the tests: x bf16 [rows, K] (row stride ldx)
// -> codes q [rows, K] and scales s [rows, K / 32]. grid (K / 32, ceil(rows / 8)), block 32.
extern "C" __global__ void __launch_bounds__(32) mxfp8_quantize_probe(const __nv_bfloat16* __restrict__ x,
                                                                      uint8_t* __restrict__ q,
                                                                      uint8_t* __restrict__ s, int rows, int K,
                                                                      long long ldx) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const long long row = (long long)blockIdx.y * 8 + g;
  const bool ok = row < rows;
  const long long col = (long long)blockIdx.x * 32 + 8 * t;
  const uint4 v = ok ? *reinterpret_cast<const uint4*>(x + row * ldx + col) : make_uint4(0u, 0u, 0u, 0u);
  uint32_t b0, b1;
  const uint32_t byte = quantize8(v, b0, b1);
  if (ok) {
    *reinterpret_cast<uint2*>(q + row * K + col) = make_uint2(b0, b1);
    if (t == 0) s[row * (K / 32) + blockIdx.x] = (uint8_t)byte;
  }
}
#endif  // MXKIT_A8W8_VARIANTS
