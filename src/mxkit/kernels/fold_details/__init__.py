"""``@triton.jit`` bodies of the fold kernels (:mod:`mxkit.kernels.fold`): ``_fold`` holds them all."""
