// Probe (session 57): which load structure streams an M = 1 GEMV's weight at a plain read's bandwidth.
// decode-mma reads a strip of 16 weight rows a block (4 warps, 512 B a warp a K tile, 2 tiles ahead) and runs at
// ~2.6 TB/s of work on 8192^2 against a one-shot read's ~4; session 56's E4M3 probe, loads alone, ~3.1-3.3.
// Loads only (an xor of the words, one word a block out, so nothing is dead), in decode-mma's strip layout
// q [N/16 strips][K/64 tiles][32 lanes][16 B]:
//   strip_w{W}_r{R}_d{D}_a{A}: a block owns R consecutive strips (R x 16 rows, one contiguous region); warp w takes
//     the region's 512-byte units w, w + W, ...; each thread keeps D 16-byte loads in flight (a register ring);
//     A: 0, or 15 for ~20 integer operations a loaded word (five rounds of shift, and, add, xor): a stand-in
//     for the bf16 decode's ALU work.
//   pers_w{W}_d{D}_a{A}: persistent, grid = what the host passes; block b takes strips b, b + grid, ...
//   flat_t{T}_l{L}: one-shot, a block reads T x L x 16 contiguous bytes and exits (the plain read).
//   nvcc -ptx -arch=sm_90a -O3 -o /tmp/ss.ptx benchmarks/probes/stream_shape.cu
//   python3 benchmarks/probes/stream_shape_ab.py /tmp/ss.ptx 8192x8192,28672x8192
// Results: benchmarks/decode_mma_ab.md, "What load structure streams at a plain read's rate, and the ring loop".
#include <stdint.h>

namespace {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int A>
__device__ __forceinline__ uint32_t work(uint4 v, uint32_t acc) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t x = w[j];
#pragma unroll
    for (int i = 0; i < A / 3; ++i) x = __funnelshift_l(x, x, 3 + i) ^ ((x & 0x9C9C9C9Cu) + (uint32_t)i);
    acc ^= x;
  }
  return acc;
}

// units [u0, u1) of 512 B, warp-strided; D loads in flight a thread
template <int W, int D, int A>
__device__ __forceinline__ uint32_t stream_units(const uint4* q, long u0, long u1, uint32_t acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4 ring[D];
  long u = u0 + warp;
#pragma unroll
  for (int i = 0; i < D; ++i) ring[i] = (u + (long)i * W < u1) ? ld_stream(q + (u + (long)i * W) * 32 + lane) : uint4{};
  for (; u < u1; u += (long)D * W) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      uint4 v = ring[i];
      long n = u + (long)(D + i) * W;
      if (n < u1) ring[i] = ld_stream(q + n * 32 + lane);
      if (u + (long)i * W < u1) acc = work<A>(v, acc);
    }
  }
  return acc;
}

__device__ __forceinline__ void finish(uint32_t acc, uint32_t* out) {
#pragma unroll
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x % 1024, acc);
}

template <int W, int R, int D, int A>
__device__ void strip(const uint4* q, int tiles_k, uint32_t* out) {
  long u0 = (long)blockIdx.x * R * tiles_k;
  finish(stream_units<W, D, A>(q, u0, u0 + (long)R * tiles_k, 0u), out);
}

template <int W, int D, int A>
__device__ void pers(const uint4* q, int tiles_k, int strips, uint32_t* out) {
  uint32_t acc = 0;
  for (int s = blockIdx.x; s < strips; s += gridDim.x)
    acc = stream_units<W, D, A>(q, (long)s * tiles_k, (long)(s + 1) * tiles_k, acc);
  finish(acc, out);
}

template <int T, int L>
__device__ void flat(const uint4* q, uint32_t* out) {
  const uint4* p = q + (long)blockIdx.x * T * L + threadIdx.x;
  uint4 v[L];
#pragma unroll
  for (int i = 0; i < L; ++i) v[i] = ld_stream(p + i * T);
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < L; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  finish(acc, out);
}

}  // namespace

#define STRIP(W, R, D, A)                                                                             \
  extern "C" __global__ void __launch_bounds__(W * 32) strip_w##W##_r##R##_d##D##_a##A(const uint4* q, int tiles_k, \
                                                                                    int strips, uint32_t* out) { \
    strip<W, R, D, A>(q, tiles_k, out);                                                               \
  }
#define PERS(W, D, A)                                                                                 \
  extern "C" __global__ void __launch_bounds__(W * 32) pers_w##W##_d##D##_a##A(const uint4* q, int tiles_k,     \
                                                                           int strips, uint32_t* out) {        \
    pers<W, D, A>(q, tiles_k, strips, out);                                                           \
  }
#define FLAT(T, L)                                                                                    \
  extern "C" __global__ void __launch_bounds__(T) flat_t##T##_l##L(const uint4* q, int tiles_k, int strips,      \
                                                                 uint32_t* out) {                              \
    flat<T, L>(q, out);                                                                               \
  }

FLAT(128, 2) FLAT(256, 1) FLAT(256, 2) FLAT(256, 4) FLAT(512, 1) FLAT(128, 8)
STRIP(4, 1, 2, 0) STRIP(4, 1, 4, 0) STRIP(4, 1, 8, 0) STRIP(4, 1, 16, 0)
STRIP(8, 1, 2, 0) STRIP(8, 1, 4, 0) STRIP(8, 1, 8, 0)
STRIP(16, 1, 2, 0) STRIP(16, 1, 4, 0)
STRIP(4, 2, 4, 0) STRIP(4, 4, 4, 0) STRIP(8, 4, 4, 0) STRIP(8, 2, 8, 0)
STRIP(4, 1, 2, 15) STRIP(4, 1, 4, 15) STRIP(4, 1, 8, 15) STRIP(8, 1, 4, 15) STRIP(8, 1, 8, 15) STRIP(16, 1, 4, 15)
PERS(4, 8, 0) PERS(8, 4, 0) PERS(8, 8, 0) PERS(16, 4, 0) PERS(32, 2, 0) PERS(32, 4, 0)
PERS(8, 8, 15) PERS(16, 4, 15) PERS(32, 4, 15)
