"""``@triton.jit`` bodies of the scaled GEMMs (:mod:`mxkit.kernels.matmul` is their host module)."""
