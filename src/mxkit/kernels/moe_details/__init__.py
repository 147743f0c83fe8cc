"""The parts of :mod:`mxkit.kernels.moe`, one file per concern (as :mod:`mxkit.kernels.matmul_details` for the
GEMMs): ``_sort`` (tokens sorted by expert), ``_rows`` (gather, combine, biases in packed order), ``_envelope``
(which experts the kernels take), ``_decode`` (the tensor-core decode path), ``_prefill`` (the grouped wgmma
path), ``_fold`` (the FP8 fold paths)."""
