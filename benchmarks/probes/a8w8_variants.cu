// A/B variants of mma_a8w8.cu's kernels on the packed weight (benchmarks/probes/a8w8_ab.py times them): R strips
// per warp x U tiles a batch x X (x loaded a batch ahead). Names: a8w8_<c|b>_r<R>_u<U>_x<X> (c: MXFP8 codes
// in, b: bf16 in, quantized in the kernel).
#define MXKIT_A8W8_VARIANTS
#include "../../src/mxkit/kernels/matmul_details/mma_a8w8.cu"

#define V(R, U, X)                                                                                            \
  MXKIT_A8W8(a8w8_c_r##R##_u##U##_x##X, R, U, false, true, X, __nv_bfloat16)                                  \
  MXKIT_A8W8(a8w8_b_r##R##_u##U##_x##X, R, U, true, true, X, __nv_bfloat16)

V(1, 2, 0)
V(1, 2, 1)
V(1, 4, 1)
V(2, 2, 0)
V(2, 2, 1)
V(2, 1, 1)
V(4, 1, 0)
V(4, 1, 1)

// session 38: W8A16 with NT token tiles of 8 a block (each weight tile decoded once for 8 NT tokens; the bits of
// NT = 1 at the same R and split), E4M3, bf16 out: w16_r<R>_nt<NT> (benchmarks/probes/w8a16_mma_ab.py times them)
#define W16NT(R, NT) MXKIT_MX8_NT(w16_r##R##_nt##NT, R, 1, true, true, true, 1, __nv_bfloat16, NT)
W16NT(1, 2)
W16NT(2, 2)
W16NT(1, 4)
// session 58: W8A16 on a ring loop (mainloop_ring16, D tiles a lane in flight: w16_r<R>_nt<NT>_g<D>) was built and
// timed in commit f308820 (h200-2026-12-04b/w8a16_ring.txt: 2-5% on some layers at M = 1, at other splits each) and
// not shipped; check that commit out to rerun it
