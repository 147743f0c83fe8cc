"""The parts of :mod:`mxkit.kernels.moe`, one file per concern (as :mod:`mxkit.kernels.matmul_details` for the
GEMMs): ``_sort`` (tokens sorted by expert; its ``@triton.jit`` bodies in ``_align``), ``_rows`` (gather, combine,
biases in packed order; the bodies of those and of the fold paths' bias + activation in ``_moe_epilogue``),
``_route`` (GPT-OSS's router and routing in one kernel), ``_envelope`` (which experts the kernels take),
``_decode`` (the tensor-core decode path), ``_prefill`` (the grouped wgmma path), ``_fold`` (the FP8 fold
paths)."""
