// A/B variants of mma_decode.cu's kernels (benchmarks/probes/decode_ab.py builds and times them): the same
// source with other warps W x tiles a batch U, in the register loop (mainloop, _r: x loaded a batch ahead with
// the weight words, as the m8 kernel does), the lean loop (mainloop_lean, _l) or through 4 cp.async stages
// (mainloop_async, _s4). The bulk-copy variants are in git history (benchmarks/decode_mma_ab.md names the commit).
// Names: m8_ / m16_ (dense) and gu_ / dn_ (grouped gate_up + SwiGLU / down) + w<W>_u<U>_<loop>.
#define MXKIT_DECODE_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_decode.cu"

#define DENSE8(W, U, L) MXKIT_MMA_DECODE(m8_bf16_w##W##_u##U##_##L, 1, W, U, LOOP_##L, XPF_##L, false, __nv_bfloat16)
#define DENSE16(W, U, L) MXKIT_MMA_DECODE(m16_bf16_w##W##_u##U##_##L, 2, W, U, LOOP_##L, XPF_##L, false, __nv_bfloat16)
#define GROUPED(W, U, L)                                                                                      \
  MXKIT_MMA_GROUPED(gu_w##W##_u##U##_##L, 1, true, false, false, __nv_bfloat16, W, U, LOOP_##L, XPF_##L)        \
  MXKIT_MMA_GROUPED(dn_w##W##_u##U##_##L, 0, false, true, false, float, W, U, LOOP_##L, XPF_##L)
#define LOOP_r 0
#define LOOP_l LEAN
#define LOOP_s4 4
#define XPF_r true  // (x a batch ahead: the register loop's; the others load x as the production kernels do)
#define XPF_l false
#define XPF_s4 false

DENSE8(4, 4, r)
DENSE8(4, 4, l)
DENSE8(4, 2, l)
DENSE8(8, 2, l)
DENSE16(8, 2, r)
DENSE16(8, 1, s4)
DENSE16(8, 2, l)
DENSE16(8, 1, l)
GROUPED(4, 1, r)
GROUPED(4, 1, l)
GROUPED(4, 2, l)

// ---- R strips per block (session 31): the grouped kernel with one block per (token block, R consecutive
// strips of its expert) and one K loop over the R strips' tiles in a row (the next tile in flight across strip
// boundaries, D tiles ahead), so the block's prologue (eids, ids, x row) and epilogue are paid once per R
// strips. Each warp takes the same tiles of each strip as production (w, w + W, ...), and the warps' sums are
// added in order: the same bits. Names: gu_ / dn_ + w<W>_u1_r<R>d<D>.
namespace {
template <int WARPS, int R, int D, bool SPECIAL>
__device__ __forceinline__ void mainloop_strips(const uint4* qs, const uint32_t* ss, const uint4* xr, int KT,
                                                int warp, float (&red)[R][WARPS][4][32]) {
  const int lane = threadIdx.x & 31;
  const int n = warp < KT ? (KT - warp + WARPS - 1) / WARPS : 0;
  const int total = R * n;
  const uint4* qp = qs + (long long)warp * 32;
  const uint32_t* sp = ss + (long long)warp * 8;
  const uint4* xp = xr + warp * 8;
  const long long qjump = (long long)KT * 32 - (long long)(n - 1) * WARPS * 32;
  const long long sjump = (long long)KT * 8 - (long long)(n - 1) * WARPS * 8;
  const int xjump = -(n - 1) * WARPS * 8;
  int li = 0;
  uint4 qb[D + 1];
  uint32_t sb[D + 1];
  uint4 xb[D + 1][2];
  auto load = [&](uint4& q_, uint32_t& s_, uint4 (&x_)[2]) {
    q_ = ld_stream(qp);
    s_ = __ldg(sp);
    x_[0] = __ldg(xp);
    x_[1] = __ldg(xp + 4);
    if (++li == n) {
      li = 0;
      qp += qjump;
      sp += sjump;
      xp += xjump;
    } else {
      qp += WARPS * 32;
      sp += WARPS * 8;
      xp += WARPS * 8;
    }
  };
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < total) load(qb[d], sb[d], xb[d]);
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  int r = 0, ci = 0;
  for (int j = 0; j < total; j += D + 1) {
#pragma unroll
    for (int u = 0; u <= D; ++u) {
      if (j + u < total) {
        constexpr int dummy = 0;
        (void)dummy;
        const int ls = (u + D) % (D + 1);
        if (j + u + D < total) load(qb[ls], sb[ls], xb[ls]);
        const uint4 q1[1] = {qb[u]};
        const uint32_t s1[1] = {sb[u]};
        const uint4 x1[1][1][2] = {{{xb[u][0], xb[u][1]}}};
        batch<1, 1, 1, SPECIAL>(q1, s1, x1, 0, 1, acc);
        if (++ci == n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) red[r][warp][i][lane] = acc[0][i], acc[0][i] = 0.f;
          ci = 0;
          ++r;
        }
      }
    }
  }
  if (n == 0)  // a warp without tiles (K < 64 W) still writes its zeros
#pragma unroll
    for (int rr = 0; rr < R; ++rr)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[rr][warp][i][lane] = 0.f;
}

template <int ACT, bool GATHER, bool MUL_RW, bool SPECIAL, typename OUT, int WARPS, int R, int D>
__device__ __forceinline__ void grouped_strips(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q,
                                               const uint32_t* __restrict__ s, const float* __restrict__ bias,
                                               const float* __restrict__ rw, OUT* __restrict__ out,
                                               const int* __restrict__ ids, const int* __restrict__ eids, int N,
                                               int K, int n_valid, int top_k, long long ldx, long long ldo) {
  __shared__ float red[R][WARPS][4][32];
  __shared__ float v[R][8][17];
  const int mb = blockIdx.x, strip0 = blockIdx.y * R;
  const int e = eids[mb];
  if (e < 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int id = ids[mb * 8 + g];
  const long long xrow = id < n_valid ? (GATHER ? id / top_k : id) : 0;
  const uint4* xr = reinterpret_cast<const uint4*>(x + xrow * ldx) + t;
  const int KT = K >> 6;
  const long long es = (long long)e * (N / 16) + strip0;
  mainloop_strips<WARPS, R, D, SPECIAL>(q + es * KT * 32 + lane, s + es * KT * 8 + g, xr, KT, warp, red);
  __syncthreads();
  for (int el = threadIdx.x; el < R * 128; el += blockDim.x) {
    const int rr = el / 128, i = (el / 32) & 3, l = el & 31;
    float sum = red[rr][0][i][l];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) sum += red[rr][w][i][l];
    const int row = (l >> 2) + 8 * (i >> 1), m = 2 * (l & 3) + (i & 1);
    if (bias != nullptr) sum += bias[(long long)e * N + (strip0 + rr) * 16 + row];
    v[rr][m][row] = sum;
  }
  __syncthreads();
  if (ACT == 0) {
    for (int el = threadIdx.x; el < R * 128; el += blockDim.x) {
      const int rr = el / 128, m = (el / 16) & 7, row = el % 16;
      const int i = ids[mb * 8 + m];
      if (i < n_valid) {
        float val = v[rr][m][row];
        if (MUL_RW) val *= rw[i];
        out[(long long)i * ldo + (strip0 + rr) * 16 + row] = to_out<OUT>(val);
      }
    }
  } else {
    for (int el = threadIdx.x; el < R * 64; el += blockDim.x) {
      const int rr = el / 64, m = (el / 8) & 7, c = el % 8;
      const int i = ids[mb * 8 + m];
      if (i < n_valid) {
        float gate = v[rr][m][2 * c], up = v[rr][m][2 * c + 1], val;
        gate = gate > 7.f ? 7.f : gate;
        up = up > 7.f ? 7.f : (up < -7.f ? -7.f : up);
        val = (up + 1.f) * (gate / (1.f + expf(-1.702f * gate)));
        if (MUL_RW) val *= rw[i];
        out[(long long)i * ldo + (strip0 + rr) * 8 + c] = to_out<OUT>(val);
      }
    }
  }
}
}  // namespace

#define STRIPS(NAME, ACT, GATHER, MUL_RW, OUT, W, R, D)                                                        \
  extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                   \
      const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ q, const uint32_t* __restrict__ s,        \
      const float* __restrict__ bias, const float* __restrict__ rw, OUT* __restrict__ out,                     \
      const int* __restrict__ ids, const int* __restrict__ eids, int N, int K, int n_valid, int top_k,         \
      long long ldx, long long ldo) {                                                                          \
    grouped_strips<ACT, GATHER, MUL_RW, false, OUT, W, R, D>(x, q, s, bias, rw, out, ids, eids, N, K, n_valid, \
                                                             top_k, ldx, ldo);                                 \
  }
#define GROUPED_STRIPS(W, R, D)                                                                                \
  STRIPS(gu_w##W##_u1_r##R##d##D, 1, true, false, __nv_bfloat16, W, R, D)                                      \
  STRIPS(dn_w##W##_u1_r##R##d##D, 0, false, true, float, W, R, D)

GROUPED_STRIPS(4, 1, 1)
GROUPED_STRIPS(4, 1, 2)
GROUPED_STRIPS(4, 2, 1)
GROUPED_STRIPS(4, 2, 2)
GROUPED_STRIPS(4, 4, 1)
GROUPED_STRIPS(4, 4, 2)
GROUPED_STRIPS(2, 4, 2)
GROUPED_STRIPS(8, 2, 1)
