// Small-M GEMM y = x @ W.T from bf16 activations and an MXFP4 weight, on tensor cores (mma.sync m16n8k16),
// for decode (M up to a few dozen: blocks of 8 or 16 tokens). The PTX beside this file (mma_decode.ptx) is what mxkit loads; regenerate it with
// scripts/build_ptx.sh on a machine with nvcc after editing this file (a CPU test checks the two agree).
//
// The weight is read in the "mma" layout that mxkit.kernels.matmul_details._mma_decode.pack_mma writes once,
// at pack_weight time (OCP MX v1.0 E2M1 codes and E8M0 scales, rearranged, no value changed). A 16-row x
// 64-column tile is one 16-byte load per lane l = 4g + t: word j (k-step j, in 32-element block b = j / 2,
// step s = j % 2) holds the lane's 8 A-fragment codes, of columns 32b + 8t + 4s + {0, 1, 2, 3} (the K order
// inside a block is permuted, the same for x, so that a lane's x values of a block are 8 contiguous bf16, one
// 16-byte load). The word is laid out for the decode, code bits (m, e0, e1, sign) at:
//   pair 0 (row g,   columns +0 | +1): bits  6  7  8 15 | 22 23 24 31   -> w & 0x81C081C0
//   pair 1 (row g+8, columns +0 | +1): bits  3  4  5 12 | 19 20 21 28   -> (w << 3) & 0x81C081C0
//   pair 2 (row g,   columns +2 | +3): bits  0  1  2  9 | 16 17 18 25   -> (w << 6) & 0x81C081C0
//   pair 3 (row g+8, columns +2 | +3): bits 10 11 13 14 | 26 27 29 30   -> three shifts, three lop3
//   q [N/16, K/64, 32 lanes, 4 words];  s [N/16, K/64, 8, 4] bytes: for g, the scales of (row g, block 0),
//   (g, 1), (g+8, 0), (g+8, 1).
// Each pair becomes one bf16x2 register of the mma's A fragment: its magnitude bits e1 e0 m at bits 8..6 of
// each half and its sign at bit 15, a bf16 equal to the E2M1 value times 2^-126 (the subnormal 0.5 included),
// times 2^126 by one fma.rn.bf16x2 (exact). Each 32-element block's two k-steps accumulate in float32 from
// zero and are added to the accumulator times 2^(s - 127) (float32; the _special kernels, for weights with a
// scale byte 0 or 255, make them 2^-127 and NaN), so a
// block's sum is scaled exactly once. The W warps of a block split K (warp w takes the 64-column tiles w,
// w + W, ...; the next batch of tiles is loaded while one is computed) and their partial sums are added in
// warp order (deterministic).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mma_common.cuh"

namespace {


using mxkit::fma_bf16x2;
using mxkit::mma_bf16;

__device__ __forceinline__ void decode8(uint32_t w, uint32_t (&a)[4]) {
  const uint32_t P = 0x81C081C0u, K126 = 0x7E807E80u, NZ = 0x80008000u;
  a[0] = fma_bf16x2(w & P, K126, NZ);         // row g, fragment columns 2t, 2t+1
  a[1] = fma_bf16x2((w << 3) & P, K126, NZ);  // row g+8
  a[2] = fma_bf16x2((w << 6) & P, K126, NZ);  // row g, fragment columns 2t+8, 2t+9
  a[3] = fma_bf16x2(((w >> 4) & 0x00C000C0u) | ((w >> 5) & 0x01000100u) | ((w << 1) & 0x80008000u), K126,
                    NZ);                       // row g+8, fragment columns 2t+8, 2t+9
}

// 2^(s - 127) for scale byte k of word w, as float32. SPECIAL: the weight has a byte 0 (2^-127, subnormal) or
// 255 (NaN); else every byte is in 1..254 and the exponent field is the byte itself (two operations).
template <bool SPECIAL, int k> __device__ __forceinline__ float e8m0(uint32_t w) {
  if (SPECIAL) {
    const uint32_t s = (w >> (8 * k)) & 0xFFu;
    return __uint_as_float(s == 255u ? 0x7FC00000u : (s == 0u ? 0x00400000u : s << 23));
  }
  return __uint_as_float((k * 8 <= 23 ? w << (23 - 8 * k) : w >> (8 * k - 23)) & 0x7F800000u);
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// cp.async (sm_80): 16 bytes / 4 bytes global -> shared, bypassing registers; the group commit and wait
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool full) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

using mxkit::to_out;

// One batch of UNROLL tiles (u: tile t0 + u WARPS) from the lane's weight words qv / scale words sv and x
// rows xv, into acc: each 32-element block's two k-steps summed from zero, then scaled once in float32.
template <int NT, int UNROLL, int WARPS, bool SPECIAL>
__device__ __forceinline__ void batch(const uint4 (&qv)[UNROLL], const uint32_t (&sv)[UNROLL],
                                      const uint4 (&xv)[UNROLL][NT][2], int t0, int kt_hi, float (&acc)[NT][4]) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int kt = t0 + u * WARPS;
    if (kt < kt_hi) {
      const uint32_t w[4] = {qv[u].x, qv[u].y, qv[u].z, qv[u].w};
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        uint32_t a0[4], a1[4];
        decode8(w[2 * blk], a0);
        decode8(w[2 * blk + 1], a1);
        const float f_lo = blk ? e8m0<SPECIAL, 1>(sv[u]) : e8m0<SPECIAL, 0>(sv[u]);
        const float f_hi = blk ? e8m0<SPECIAL, 3>(sv[u]) : e8m0<SPECIAL, 2>(sv[u]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 xb = xv[u][nt][blk];
          float c[4] = {0.f, 0.f, 0.f, 0.f};
          mma_bf16(c, a0, xb.x, xb.y);
          mma_bf16(c, a1, xb.z, xb.w);
          acc[nt][0] = fmaf(c[0], f_lo, acc[nt][0]);
          acc[nt][1] = fmaf(c[1], f_lo, acc[nt][1]);
          acc[nt][2] = fmaf(c[2], f_hi, acc[nt][2]);
          acc[nt][3] = fmaf(c[3], f_hi, acc[nt][3]);
        }
      }
    }
  }
}

// The x values of batch t0 (lane (g, t): token g + 8 nt, columns 32 b + 8 t .. + 7 of each block b: one uint4)
template <int NT, int UNROLL, int WARPS>
__device__ __forceinline__ void load_x(const uint4* const (&xr)[NT], const bool (&xm)[NT], int t0, int kt_hi,
                                       uint4 (&xv)[UNROLL][NT][2]) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int kt = t0 + u * WARPS;
    if (kt < kt_hi) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int b = 0; b < 2; ++b)
          xv[u][nt][b] = xm[nt] ? __ldg(xr[nt] + kt * 8 + b * 4) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// The K loop with the weight staged through shared memory by cp.async, STAGES batches deep (STAGES - 1 in
// flight while one is computed), no registers held for them. Each lane copies and reads back only its own
// words (slot [stage][u][thread]), so the wait needs no barrier. Same tiles, same order, same arithmetic as
// mainloop: the same bits.
template <int NT, int UNROLL, int WARPS, int STAGES, bool XPF, bool SPECIAL>
__device__ __forceinline__ void mainloop_async(const uint4* qs, const uint32_t* ss, const uint4* const (&xr)[NT],
                                               const bool (&xm)[NT], int kt_lo, int kt_hi, int warp,
                                               float (&acc)[NT][4]) {
  __shared__ uint4 qsm[STAGES][UNROLL][WARPS * 32];
  __shared__ uint32_t ssm[STAGES][UNROLL][WARPS * 32];
  __shared__ uint4 xsm[XPF ? STAGES : 1][UNROLL][NT * 2][WARPS * 32];  // XPF: x staged with the weight
  const int tid = threadIdx.x;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
  auto issue = [&](int j) {
    const int slot = j % STAGES;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kt = kt_lo + warp + (j * UNROLL + u) * WARPS;
      if (kt < kt_hi) {
        cp_async16(&qsm[slot][u][tid], qs + (long long)kt * 32);
        cp_async4(&ssm[slot][u][tid], ss + (long long)kt * 8);
        if (XPF)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int b = 0; b < 2; ++b) cp_async16_zfill(&xsm[XPF ? slot : 0][u][nt * 2 + b][tid], xr[nt] + kt * 8 + b * 4, xm[nt]);
      }
    }
    cp_async_commit();  // empty groups too: the wait counts groups
  };
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) issue(j);
  int j = 0;
  for (int t0 = kt_lo + warp; t0 < kt_hi; t0 += WARPS * UNROLL, ++j) {
    uint4 xv[UNROLL][NT][2];
    if (!XPF) load_x<NT, UNROLL, WARPS>(xr, xm, t0, kt_hi, xv);
    cp_async_wait<STAGES - 2>();  // batch j is in
    const int slot = j % STAGES;
    if (XPF)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int b = 0; b < 2; ++b) xv[u][nt][b] = xsm[XPF ? slot : 0][u][nt * 2 + b][tid];
    uint4 qv[UNROLL];
    uint32_t sv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      qv[u] = qsm[slot][u][tid];
      sv[u] = ssm[slot][u][tid];
    }
    issue(j + STAGES - 1);  // into the slot read in the previous iteration
    batch<NT, UNROLL, WARPS, SPECIAL>(qv, sv, xv, t0, kt_hi, acc);
  }
  cp_async_wait<0>();
}

// The K loop of one warp: tiles kt_lo + warp, + WARPS, ... < kt_hi of the strip at qs / ss (the lane's
// q and scale-word pointers), x rows of the lane's tokens at xr[nt] (xm[nt]: the row exists), accumulated
// into acc[nt][0..3] (rows g, g, g+8, g+8; tokens 8 nt + 2t, + 1, 2t, + 1).
template <int NT, int UNROLL, int WARPS, bool XPF, bool SPECIAL>
__device__ __forceinline__ void mainloop(const uint4* qs, const uint32_t* ss, const uint4* const (&xr)[NT],
                                         const bool (&xm)[NT], int kt_lo, int kt_hi, int warp,
                                         float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
  uint4 qv[UNROLL], qn[UNROLL];
  uint32_t sv[UNROLL], sn[UNROLL];
  uint4 xv[UNROLL][NT][2], xn[UNROLL][NT][2];  // XPF: x of the next batch loaded with its weight words
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int kt = kt_lo + warp + u * WARPS;
    if (kt < kt_hi) {
      qv[u] = ld_stream(qs + (long long)kt * 32);
      sv[u] = __ldg(ss + (long long)kt * 8);
    }
  }
  if (XPF) load_x<NT, UNROLL, WARPS>(xr, xm, kt_lo + warp, kt_hi, xv);
  for (int t0 = kt_lo + warp; t0 < kt_hi; t0 += WARPS * UNROLL) {
    if (!XPF) load_x<NT, UNROLL, WARPS>(xr, xm, t0, kt_hi, xv);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kn = t0 + u * WARPS + WARPS * UNROLL;  // the next batch, in flight while this one is computed
      if (kn < kt_hi) {
        qn[u] = ld_stream(qs + (long long)kn * 32);
        sn[u] = __ldg(ss + (long long)kn * 8);
      }
    }
    if (XPF) load_x<NT, UNROLL, WARPS>(xr, xm, t0 + WARPS * UNROLL, kt_hi, xn);
    batch<NT, UNROLL, WARPS, SPECIAL>(qv, sv, xv, t0, kt_hi, acc);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      qv[u] = qn[u];
      sv[u] = sn[u];
      if (XPF)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) xv[u][nt][0] = xn[u][nt][0], xv[u][nt][1] = xn[u][nt][1];
    }
  }
}

constexpr int LEAN = -1;  // the LOOP argument of the kernels below: mainloop_lean (0: mainloop, S > 0: mainloop_async)

// Where a warp's K loop starts (mainloop_lean, mainloop_ring): its sums zeroed, its first tile (kt_lo + warp) and its
// count n of tiles first, first + WARPS, ... < kt_hi.
template <int NT, int WARPS, int SN>
__device__ __forceinline__ void warp_tiles(int kt_lo, int kt_hi, int warp, float (&acc)[SN][NT][4], int& first,
                                           int& n) {
#pragma unroll
  for (int p = 0; p < SN; ++p)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][nt][i] = 0.f;
  first = kt_lo + warp;
  n = first < kt_hi ? (kt_hi - first + WARPS - 1) / WARPS : 0;
}

// The K loop of mainloop with fewer instructions per tile: the warp's full batches of UNROLL tiles load
// without bounds checks through pointers stepped once a batch, the x rows of absent tokens are read from row 0
// (xr is clamped there; their columns of the mma are never stored) instead of zeroed under a branch, and the
// last n % UNROLL tiles run one at a time. Same tiles, same order, same arithmetic: the same bits. SN strips
// share each x load (strip p's words at qs + p qst, ss + p sst, summed into acc[p]): the x bytes read from L2
// per weight byte divided by SN, each strip's sums the bits of SN = 1.
template <int NT, int UNROLL, int WARPS, bool SPECIAL, int SN = 1>
__device__ __forceinline__ void mainloop_lean(const uint4* qs, const uint32_t* ss, const uint4* const (&xr)[NT],
                                              int kt_lo, int kt_hi, int warp, float (&acc)[SN][NT][4],
                                              long long qst = 0, long long sst = 0) {
  int first, n;  // this warp's first tile and tile count
  warp_tiles<NT, WARPS, SN>(kt_lo, kt_hi, warp, acc, first, n);
  const int nb = n / UNROLL;
  constexpr int QS = WARPS * 32, SS = WARPS * 8, XS = WARPS * 8;  // a tile's step in each pointer
  const uint4* qp = qs + (long long)first * 32;
  const uint32_t* sp = ss + (long long)first * 8;
  const uint4* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xp[nt] = xr[nt] + (long long)first * 8;
  uint4 qv[SN][UNROLL], qn[SN][UNROLL];
  uint32_t sv[SN][UNROLL], sn[SN][UNROLL];
  uint4 xv[UNROLL][NT][2], xn[UNROLL][NT][2];
  auto load = [&](uint4 (&q_)[SN][UNROLL], uint32_t (&s_)[SN][UNROLL], uint4 (&x_)[UNROLL][NT][2]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int p = 0; p < SN; ++p) {
        q_[p][u] = ld_stream(qp + p * qst + u * QS);
        s_[p][u] = __ldg(sp + p * sst + u * SS);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int b = 0; b < 2; ++b) x_[u][nt][b] = __ldg(xp[nt] + u * XS + b * 4);
    }
    qp += UNROLL * QS;
    sp += UNROLL * SS;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += UNROLL * XS;
  };
  if (nb > 0) load(qv, sv, xv);
  for (int j = 0; j < nb; ++j) {
    if (j + 1 < nb) load(qn, sn, xn);  // the next batch, in flight while this one is computed
#pragma unroll
    for (int p = 0; p < SN; ++p) batch<NT, UNROLL, 1, SPECIAL>(qv[p], sv[p], xv, 0, 0x7FFFFFFF, acc[p]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int p = 0; p < SN; ++p) {
        qv[p][u] = qn[p][u];
        sv[p][u] = sn[p][u];
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) xv[u][nt][0] = xn[u][nt][0], xv[u][nt][1] = xn[u][nt][1];
    }
  }
  for (int r = nb * UNROLL; r < n; ++r) {
    uint4 x1[1][NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int b = 0; b < 2; ++b) x1[0][nt][b] = __ldg(xp[nt] + b * 4);
#pragma unroll
    for (int p = 0; p < SN; ++p) {
      uint4 q1[1] = {ld_stream(qp + p * qst)};
      uint32_t s1[1] = {__ldg(sp + p * sst)};
      batch<NT, 1, 1, SPECIAL>(q1, s1, x1, 0, 1, acc[p]);
    }
    qp += QS;
    sp += SS;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += XS;
  }
}

// The K loop as a ring: each lane holds the weight words and x values of its next D tiles (D = UNROLL) in
// registers and loads tile j + D as it computes tile j, so D tiles are always in flight without a batch boundary.
// SN strips share each x load as in mainloop_lean. Same tiles, same order, same arithmetic as mainloop_lean: the
// same bits.
template <int NT, int D, int WARPS, bool SPECIAL, int SN = 1>
__device__ __forceinline__ void mainloop_ring(const uint4* qs, const uint32_t* ss, const uint4* const (&xr)[NT],
                                              int kt_lo, int kt_hi, int warp, float (&acc)[SN][NT][4],
                                              long long qst = 0, long long sst = 0) {
  int first, n;  // this warp's first tile and tile count
  warp_tiles<NT, WARPS, SN>(kt_lo, kt_hi, warp, acc, first, n);
  constexpr int QS = WARPS * 32, SS = WARPS * 8, XS = WARPS * 8;
  const uint4* qp = qs + (long long)first * 32;
  const uint32_t* sp = ss + (long long)first * 8;
  const uint4* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xp[nt] = xr[nt] + (long long)first * 8;
  uint4 rq[D][SN];
  uint32_t rs[D][SN];
  uint4 rx[D][NT][2];
  auto fill = [&](int i) {
#pragma unroll
    for (int p = 0; p < SN; ++p) {
      rq[i][p] = ld_stream(qp + p * qst + i * QS);
      rs[i][p] = __ldg(sp + p * sst + i * SS);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int b = 0; b < 2; ++b) rx[i][nt][b] = __ldg(xp[nt] + i * XS + b * 4);
  };
  auto step = [&]() {
    qp += D * QS;
    sp += D * SS;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += D * XS;
  };
  auto tile = [&](const uint4 (&qv)[SN], const uint32_t (&sv)[SN], const uint4 (&xv)[NT][2]) {
    uint4 x1[1][NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) x1[0][nt][0] = xv[nt][0], x1[0][nt][1] = xv[nt][1];
#pragma unroll
    for (int p = 0; p < SN; ++p) {
      const uint4 q1[1] = {qv[p]};
      const uint32_t s1[1] = {sv[p]};
      batch<NT, 1, 1, SPECIAL>(q1, s1, x1, 0, 1, acc[p]);
    }
  };
  // tile i of the ring, copied out so that the slot can be refilled before it is computed
  auto take = [&](int i, uint4 (&qv)[SN], uint32_t (&sv)[SN], uint4 (&xv)[NT][2]) {
#pragma unroll
    for (int p = 0; p < SN; ++p) qv[p] = rq[i][p], sv[p] = rs[i][p];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xv[nt][0] = rx[i][nt][0], xv[nt][1] = rx[i][nt][1];
  };
#pragma unroll
  for (int i = 0; i < D; ++i)
    if (i < n) fill(i);
  step();
  int j = 0;
  for (; j + 2 * D <= n; j += D) {  // every refill in range: no checks
#pragma unroll
    for (int i = 0; i < D; ++i) {
      uint4 qv[SN], xv[NT][2];
      uint32_t sv[SN];
      take(i, qv, sv, xv);
      fill(i);
      tile(qv, sv, xv);
    }
    step();
  }
  // the last n - j tiles (fewer than 2 D): those in the ring, refilled while in range, then the refills
#pragma unroll
  for (int i = 0; i < D; ++i) {
    if (j + i < n) {
      uint4 qv[SN], xv[NT][2];
      uint32_t sv[SN];
      take(i, qv, sv, xv);
      if (j + D + i < n) fill(i);
      tile(qv, sv, xv);
    }
  }
#pragma unroll
  for (int i = 0; i < D; ++i)
    if (j + D + i < n) tile(rq[i], rs[i], rx[i]);
}

constexpr int RING = -2;  // the LOOP argument for mainloop_ring (UNROLL tiles in the ring)

// NT n8 token tiles per block (8 * NT tokens), UNROLL tiles per warp and batch (RING: in the ring), WARPS warps
// splitting K, SN consecutive 16-row strips per block sharing each x load (the lean and ring loops only; N / 16 a
// multiple of SN).
// grid (ceil(M / (8 * NT)), N / (16 SN), S), block 32 * WARPS (measured on an H100: 4 warps x 4 tiles for M <= 8,
// 8 x 2 for M <= 16). With S > 1 (a grid too small for the GPU) block z takes the z-th of S ranges of K tiles,
// writes its float32 partial to ws [token block, strip block, S, SN x 8 NT x 16], and the last of the S blocks of
// a (token block, strip block) to arrive (counted in cnt, which it resets to 0) adds the S partials in order
// 0 .. S-1: deterministic whichever block arrives last. bias: float32 [N], or bf16 [N] where bias_bf16
// (mxkit::bias_at), added in float32 before the one rounding to OUT; nullptr: none. SN changes no bits.
template <int NT, int UNROLL, int WARPS, int LOOP, bool XPF, bool SPECIAL, typename OUT, int SN = 1>
__device__ __forceinline__ void mxfp4_mma_decode(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q,
                                                 const uint32_t* __restrict__ s, const float* __restrict__ bias,
                                                 OUT* __restrict__ y, float* __restrict__ ws, int* __restrict__ cnt,
                                                 int M, int N, int K, long long ldx, long long ldy, int bias_bf16) {
  static_assert(SN == 1 || LOOP == LEAN || LOOP == RING, "strips sharing x: the lean and ring loops only");
  __shared__ float red[WARPS][SN * NT][4][32];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // blockIdx.x: the group of 8 * NT tokens (fastest, so the groups of one strip run together and all but one
  // read its weight bytes from L2); blockIdx.y: the block of SN 16-row strips
  const long long strip = (long long)blockIdx.y * SN;
  x += (long long)blockIdx.x * 8 * NT * ldx;
  y += (long long)blockIdx.x * 8 * NT * ldy;
  M = min(M - (int)blockIdx.x * 8 * NT, 8 * NT);
  const int KT = K >> 6;
  const int S = gridDim.z, split = blockIdx.z;
  const int kt_lo = (int)((long long)KT * split / S), kt_hi = (int)((long long)KT * (split + 1) / S);
  const uint4* xr[NT];
  bool xm[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    xm[nt] = g + 8 * nt < M;
    xr[nt] = reinterpret_cast<const uint4*>(x + (xm[nt] ? (g + 8 * nt) * ldx : 0)) + t;
  }
  float acc[SN][NT][4];
  if constexpr (LOOP == LEAN)
    mainloop_lean<NT, UNROLL, WARPS, SPECIAL, SN>(q + strip * KT * 32 + lane, s + strip * KT * 8 + g, xr, kt_lo,
                                                  kt_hi, warp, acc, (long long)KT * 32, (long long)KT * 8);
  else if constexpr (LOOP == RING)
    mainloop_ring<NT, UNROLL, WARPS, SPECIAL, SN>(q + strip * KT * 32 + lane, s + strip * KT * 8 + g, xr, kt_lo,
                                                  kt_hi, warp, acc, (long long)KT * 32, (long long)KT * 8);
  else if constexpr (LOOP > 0)
    mainloop_async<NT, UNROLL, WARPS, LOOP, XPF, SPECIAL>(q + strip * KT * 32 + lane, s + strip * KT * 8 + g, xr, xm,
                                                     kt_lo, kt_hi, warp, acc[0]);
  else
    mainloop<NT, UNROLL, WARPS, XPF, SPECIAL>(q + strip * KT * 32 + lane, s + strip * KT * 8 + g, xr, xm, kt_lo, kt_hi,
                                         warp, acc[0]);
#pragma unroll
  for (int p = 0; p < SN; ++p)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][p * NT + nt][i][lane] = acc[p][nt][i];
  __syncthreads();
  // each (strip, nt, i, lane) summed over the warps in order; with S > 1 over the S blocks of the (token block,
  // strip block) too, in order (mma_common.cuh)
  const long long tile = (long long)blockIdx.x * gridDim.y + blockIdx.y;
  mxkit::reduce_store<WARPS, SN * NT>(red, ws + tile * S * (SN * NT * 128), cnt + tile, S, split, last,
                                      [&](int e, float v) {
    const int p = SN == 1 ? 0 : e / (NT * 128), nt = SN == 1 ? e / 128 : (e / 128) % NT;
    const int i = (e / 32) & 3, l = e & 31;
    const int row = (int)(strip + p) * 16 + (l >> 2) + 8 * (i >> 1);  // weight row n
    const int m = 8 * nt + 2 * (l & 3) + (i & 1);                     // token
    if (m < M) {
      if (bias != nullptr) v += mxkit::bias_at(bias, bias_bf16, row);
      y[m * ldy + row] = mxkit::to_out<OUT>(v);
    }
  });
}

// Grouped (MoE expert) decode GEMM over tokens sorted by expert (vLLM's moe_align_block_size with blocks of
// 8): block (mb, strip) computes the sorted rows ids[8 mb .. 8 mb + 7] (flat (token, slot) index i; the
// padding id is n_valid) by the 16 weight rows of `strip` of expert eids[mb] (-1: nothing to do). Experts are
// packed one after another (expert e's strips follow expert e - 1's). The x row of i is i / top_k (GATHER: the
// token) or i. Epilogue, in float32: + bias[e, row]; ACT 1: GPT-OSS's clamped SwiGLU, ACT 2: SiLU(gate) * up,
// on row pairs (gate 2c, up 2c + 1: interleaved rows), into column 8 strip + c; ACT 0: column row; MUL_RW:
// times rw[i]; stored once in OUT at out[i] (row stride ldo). SN > 1 (the sorted blocks' lean or ring loop): block
// (mb, y) takes the SN strips SN y .. SN y + SN - 1, sharing each x load (the bits of SN = 1).
//
// PAIRS (a few (token, slot) pairs, no sort): block mb is pair mb alone (row 0 of the block; the other 7 rows
// are padding), of the expert eids[mb] read from the router's ids as they are (int64 where ids64, else int32;
// an id outside 0 .. n_exp - 1 contributes 0, as the sort leaves such a pair out); ids is not read. The down
// GEMM (ACT 0, MUL_RW) then also combines: it writes its pair's row (times rw, 0 for an expert not held) to the
// float32 workspace ws [n_valid, N], and the last of a token's top_k blocks of a strip to arrive (counted in
// cnt [tokens, N / 16], which it resets to 0) sums the token's k rows in slot order from 0 in float32 into
// out[token] (OUT, row stride ldo): the arithmetic of the combine kernel (_moe_epilogue's DIRECT), whichever
// block arrives last.
template <int ACT, bool GATHER, bool MUL_RW, bool SPECIAL, typename OUT, int WARPS, int UNROLL, int LOOP,
          bool XPF, bool PAIRS = false, int SN = 1>
__device__ __forceinline__ void mxfp4_mma_grouped(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q,
                                                  const uint32_t* __restrict__ s, const float* __restrict__ bias,
                                                  const float* __restrict__ rw, OUT* __restrict__ out,
                                                  const int* __restrict__ ids, const int* __restrict__ eids, int N,
                                                  int K, int n_valid, int top_k, long long ldx, long long ldo,
                                                  int ids64 = 0, int n_exp = 0, float* __restrict__ ws = nullptr,
                                                  int* __restrict__ cnt = nullptr) {
  static_assert(SN == 1 || ((LOOP == LEAN || LOOP == RING) && !PAIRS),
                "strips sharing x: the lean and ring loops of the sorted blocks");
  __shared__ float red[WARPS][SN][4][32];
  __shared__ float v[8][16 * SN + 1];
  const int mb = blockIdx.x, strip = blockIdx.y * SN;
  int e;
  if constexpr (PAIRS) {
    const long long te = ids64 ? reinterpret_cast<const long long*>(eids)[mb] : (long long)eids[mb];
    e = te >= 0 && te < n_exp ? (int)te : -1;
  } else {
    e = eids[mb];
  }
  constexpr bool COMBINE = PAIRS && ACT == 0;
  if (e < 0 && !COMBINE) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // the sorted row r of the block: its flat (token, slot) index, n_valid for padding
  auto row_id = [&](int r) { return PAIRS ? (r == 0 ? mb : n_valid) : ids[mb * 8 + r]; };
  if (e >= 0) {
    const int id = row_id(g);
    const bool xm[1] = {id < n_valid};
    const long long xrow = xm[0] ? (GATHER ? id / top_k : id) : 0;
    const uint4* const xr[1] = {reinterpret_cast<const uint4*>(x + xrow * ldx) + t};
    const int KT = K >> 6;
    const long long es = (long long)e * (N / 16) + strip;
    float acc[SN][1][4];
    if constexpr (LOOP == LEAN)
      mainloop_lean<1, UNROLL, WARPS, SPECIAL, SN>(q + es * KT * 32 + lane, s + es * KT * 8 + g, xr, 0, KT, warp, acc,
                                                   (long long)KT * 32, (long long)KT * 8);
    else if constexpr (LOOP == RING)
      mainloop_ring<1, UNROLL, WARPS, SPECIAL, SN>(q + es * KT * 32 + lane, s + es * KT * 8 + g, xr, 0, KT, warp, acc,
                                                   (long long)KT * 32, (long long)KT * 8);
    else if constexpr (LOOP > 0)
      mainloop_async<1, UNROLL, WARPS, LOOP, XPF, SPECIAL>(q + es * KT * 32 + lane, s + es * KT * 8 + g, xr, xm, 0,
                                                      KT, warp, acc[0]);
    else
      mainloop<1, UNROLL, WARPS, XPF, SPECIAL>(q + es * KT * 32 + lane, s + es * KT * 8 + g, xr, xm, 0, KT, warp,
                                               acc[0]);
#pragma unroll
    for (int p = 0; p < SN; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][p][i][lane] = acc[p][0][i];
    __syncthreads();
    mxkit::grouped_sums<WARPS, SN>(red, v, [&](int p, int r, float sum) {
      return bias != nullptr ? sum + bias[(long long)e * N + (strip + p) * 16 + r] : sum;
    });
    __syncthreads();
  }
  if constexpr (COMBINE) {
    __shared__ int last;
    const int tok = mb / top_k;
    if (threadIdx.x < 16) ws[(long long)mb * N + strip * 16 + threadIdx.x] = e >= 0 ? v[0][threadIdx.x] * rw[mb] : 0.f;
    __threadfence();
    __syncthreads();
    int* c = cnt + (long long)tok * (N / 16) + strip;
    if (threadIdx.x == 0) last = atomicAdd(c, 1) == top_k - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < 16) {
      float sum = 0.f;
      for (int j = 0; j < top_k; ++j) sum += __ldcg(ws + (long long)(tok * top_k + j) * N + strip * 16 + threadIdx.x);
      out[(long long)tok * ldo + strip * 16 + threadIdx.x] = to_out<OUT>(sum);
    }
    if (threadIdx.x == 0) *c = 0;
    return;
  }
  mxkit::grouped_store<ACT, MUL_RW, false, SN, OUT>(v, row_id, n_valid, rw, out, ldo,
                                                    (long long)strip * (ACT == 0 ? 16 : 8));
}

}  // namespace

// W warps, U tiles a batch, L the K loop: LEAN (mainloop_lean), RING (mainloop_ring, U tiles in the ring), 0
// (mainloop; X: x loaded a batch ahead too) or S > 0 (mainloop_async, S cp.async stages)
#define MXKIT_MMA_DECODE_SN(NAME, NT, W, U, L, X, SPECIAL, OUT, SN)                                          \
  extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                   \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, OUT* __restrict__ y, float* __restrict__ ws, int* __restrict__ cnt, int M, \
      int N, int K, long long ldx, long long ldy, int bias_bf16) {                                              \
    mxfp4_mma_decode<NT, U, W, L, X, SPECIAL, OUT, SN>(x, q, s, bias, y, ws, cnt, M, N, K, ldx, ldy, bias_bf16); \
  }
#define MXKIT_MMA_DECODE(NAME, NT, W, U, L, X, SPECIAL, OUT) MXKIT_MMA_DECODE_SN(NAME, NT, W, U, L, X, SPECIAL, OUT, 1)

// each out dtype, plain and _special (scale bytes 0 / 255); SN strips a block
#define MXKIT_MMA_DECODE_ALL_SN(M, NT, W, U, L, X, SN)                                                       \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_bf16, NT, W, U, L, X, false, __nv_bfloat16, SN)              \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_bf16_special, NT, W, U, L, X, true, __nv_bfloat16, SN)       \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_f16, NT, W, U, L, X, false, __half, SN)                      \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_f16_special, NT, W, U, L, X, true, __half, SN)               \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_f32, NT, W, U, L, X, false, float, SN)                       \
  MXKIT_MMA_DECODE_SN(mxfp4_mma_decode_m##M##_f32_special, NT, W, U, L, X, true, float, SN)
#define MXKIT_MMA_DECODE_ALL(M, NT, W, U, L, X) MXKIT_MMA_DECODE_ALL_SN(M, NT, W, U, L, X, 1)

#define MXKIT_MMA_GROUPED_SN(NAME, ACT, GATHER, MUL_RW, SPECIAL, OUT, W, U, L, X, SN)                        \
  extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                   \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, const float* __restrict__ rw, OUT* __restrict__ out,                     \
      const int* __restrict__ ids, const int* __restrict__ eids, int N, int K, int n_valid, int top_k,         \
      long long ldx, long long ldo) {                                                                          \
    mxfp4_mma_grouped<ACT, GATHER, MUL_RW, SPECIAL, OUT, W, U, L, X, false, SN>(x, q, s, bias, rw, out, ids,   \
                                                                                eids, N, K, n_valid, top_k,   \
                                                                                ldx, ldo);                     \
  }
#define MXKIT_MMA_GROUPED(NAME, ACT, GATHER, MUL_RW, SPECIAL, OUT, W, U, L, X)                                 \
  MXKIT_MMA_GROUPED_SN(NAME, ACT, GATHER, MUL_RW, SPECIAL, OUT, W, U, L, X, 1)

// plain and _special
#define MXKIT_MMA_GROUPED_BOTH_SN(NAME, ACT, GATHER, MUL_RW, OUT, W, U, L, X, SN)                          \
  MXKIT_MMA_GROUPED_SN(NAME, ACT, GATHER, MUL_RW, false, OUT, W, U, L, X, SN)                              \
  MXKIT_MMA_GROUPED_SN(NAME##_special, ACT, GATHER, MUL_RW, true, OUT, W, U, L, X, SN)
#define MXKIT_MMA_GROUPED_BOTH(NAME, ACT, GATHER, MUL_RW, OUT, W, U, L, X)                                 \
  MXKIT_MMA_GROUPED_BOTH_SN(NAME, ACT, GATHER, MUL_RW, OUT, W, U, L, X, 1)

// one block per (token, slot) pair, no sort (PAIRS; the down GEMM combining into bf16 out): 4 warps, 2 tiles a lane
// in flight in the ring loop (H200, session 58, GPT-OSS-120B experts at 1 token, gate_up / down: 19.3 / 14.1 us in
// the lean loop's batches of 2, 18.7 / 13.2 in the ring; the same bits)
#define MXKIT_MMA_PAIRS(NAME, ACT, GATHER, MUL_RW, SPECIAL)                                                 \
  extern "C" __global__ void __launch_bounds__(128) NAME(                                                      \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, const float* __restrict__ rw, __nv_bfloat16* __restrict__ out,           \
      const int* __restrict__ topk_ids, int ids64, float* __restrict__ ws, int* __restrict__ cnt, int N, int K, \
      int n_valid, int top_k, int n_exp, long long ldx, long long ldo) {                                       \
    mxfp4_mma_grouped<ACT, GATHER, MUL_RW, SPECIAL, __nv_bfloat16, 4, 2, RING, false, true>(                   \
        x, q, s, bias, rw, out, nullptr, topk_ids, N, K, n_valid, top_k, ldx, ldo, ids64, n_exp, ws, cnt);       \
  }
#define MXKIT_MMA_PAIRS_BOTH(NAME, ACT, GATHER, MUL_RW)                                                     \
  MXKIT_MMA_PAIRS(NAME, ACT, GATHER, MUL_RW, false)                                                         \
  MXKIT_MMA_PAIRS(NAME##_special, ACT, GATHER, MUL_RW, true)

// the grouped kernels of one activation: 1 tile a batch, and 2 (_u2: faster up to 8 (token, slot) pairs); 1 tile a
// batch with 2 and 4 strips a block sharing x (_s2, _s4; the bits of 1)
#define MXKIT_MMA_GROUPED_SIZES(NAME, ACT, GATHER, MUL_RW, OUT)                                            \
  MXKIT_MMA_GROUPED_BOTH(NAME, ACT, GATHER, MUL_RW, OUT, 4, 1, LEAN, false)                                \
  MXKIT_MMA_GROUPED_BOTH(NAME##_u2, ACT, GATHER, MUL_RW, OUT, 4, 2, LEAN, false)                           \
  MXKIT_MMA_GROUPED_BOTH_SN(NAME##_s2, ACT, GATHER, MUL_RW, OUT, 4, 1, LEAN, false, 2)                     \
  MXKIT_MMA_GROUPED_BOTH_SN(NAME##_s4, ACT, GATHER, MUL_RW, OUT, 4, 1, LEAN, false, 4)

#ifndef MXKIT_DECODE_VARIANTS  // the A/B probe (benchmarks/probes/decode_ab.py) instantiates its own
// The configs measured best on an H100 (benchmarks/decode_mma_ab.md): M <= 8 4 warps x 4 tiles, the register
// loop with x a batch ahead (m8; on the H200 m8l, 4 warps x 2 tiles in the lean loop, 80 registers against 128 so
// 6 blocks per SM instead of 4: 1x28672x8192 53.4 -> 43.3 us; the same warps split K, so the same bits; the
// dispatch table's decode_mma.m8_loop picks); M <= 16 8 warps, either 1 tile through 4 cp.async stages (m16: layers with
// K <= 4096 and N > 4096, where it holds 60 registers and 4 blocks per SM) or 2 tiles in the lean loop (m16l:
// the others, 8-25% faster there); grouped 4 warps, the lean loop, 1 tile a batch (level with the register
// loop at 1-4 tokens, 2-3% faster at 16-64), 2 up to 8 pairs (1 token: 6-10% faster). Warps split K the same
// way in each pair compared: the same bits. m16n (H200, session 38, benchmarks/decode_mma_ab.md): 4 warps x 2
// tiles in the lean loop, 4 strips a block sharing each x load (at 1 strip M = 16 reads 4x the weight's bytes of
// x from L2): 16x28672x8192 75.0 -> 58.8 us, 64x8192x8192 85.5 -> 57.7, on layers of N >= 8192; the same bits as
// m8l on each block of 8 tokens at the same split of K. m8g (H200, session 57): the same 4 warps with 4 tiles a
// lane in flight in the ring loop (126 registers), which streams without a batch boundary: on K >= 8192
// 1x8192x28672 45.3 -> 40.0 us, 8x8192x8192 17.9 -> 16.0, 1x8192x8192 16.7 -> 16.1; the same bits as m8l
// (the dispatch table's decode_mma.ring_min_k picks it). m16g / m16ng (H200, session 58): the ring loop in m16l's
// place (8 warps, 2 tiles a lane in flight) and in m16n's (4 warps; 2 strips a block: a ring of 2 at 4 strips holds
// 255 registers and spills), at 9-16 rows where ring_min_k takes m8g (m16ng where its grid fits one wave):
// 16x4096x14336 21.9 -> 19.4 us, 16x8192x8192 23.6 -> 21.3 (benchmarks/probes/m16_ring_ab.py); the bits of m16l
// and m16n.
MXKIT_MMA_DECODE_ALL(8, 1, 4, 4, 0, true)
MXKIT_MMA_DECODE_ALL(8l, 1, 4, 2, LEAN, false)
MXKIT_MMA_DECODE_ALL(8g, 1, 4, 4, RING, false)
MXKIT_MMA_DECODE_ALL(8g2, 1, 4, 2, RING, false)  // m8g2: the ring of 2 (the pairs kernels' loop; H100, session 77:
// 1x28672x8192 53.2 -> 49.0 us, 1x28672x4096 31.7 -> 27.3 on weights of N >= 14336, decode_mma.ring2_min_n; the same
// bits)
MXKIT_MMA_DECODE_ALL(16, 2, 8, 1, 4, false)
MXKIT_MMA_DECODE_ALL(16l, 2, 8, 2, LEAN, false)
MXKIT_MMA_DECODE_ALL_SN(16n, 2, 4, 2, LEAN, false, 4)
MXKIT_MMA_DECODE_ALL(16g, 2, 8, 2, RING, false)
MXKIT_MMA_DECODE_ALL_SN(16ng, 2, 4, 2, RING, false, 2)
MXKIT_MMA_GROUPED_SIZES(mxfp4_mma_grouped_swiglu_gpt_oss, 1, true, false, __nv_bfloat16)
MXKIT_MMA_GROUPED_SIZES(mxfp4_mma_grouped_swiglu, 2, true, false, __nv_bfloat16)
MXKIT_MMA_GROUPED_SIZES(mxfp4_mma_grouped_down, 0, false, true, float)
MXKIT_MMA_PAIRS_BOTH(mxfp4_mma_pairs_swiglu_gpt_oss, 1, true, false)
MXKIT_MMA_PAIRS_BOTH(mxfp4_mma_pairs_swiglu, 2, true, false)
MXKIT_MMA_PAIRS_BOTH(mxfp4_mma_pairs_down, 0, false, true)
#endif  // MXKIT_DECODE_VARIANTS
